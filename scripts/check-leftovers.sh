#!/usr/bin/env bash
# Fails if hatchery left anything behind on this machine: cgroups, processes, mounts or
# temporary files.
set -uo pipefail
bad=0
cg=$(find /sys/fs/cgroup -maxdepth 6 -type d -name 'hatchery-*' 2>/dev/null)
if [ -n "$cg" ]; then echo "leftover cgroups:"; echo "$cg"; bad=1; fi
ps=$(pgrep -a -f 'hatchery (run|controller|spawn|agent)' 2>/dev/null | grep -v -e pgrep -e check-leftovers)
if [ -n "$ps" ]; then echo "leftover processes:"; echo "$ps"; bad=1; fi
mnt=$(grep -c hatchery /proc/self/mountinfo 2>/dev/null)
if [ "${mnt:-0}" != 0 ]; then echo "leftover mounts:"; grep hatchery /proc/self/mountinfo; bad=1; fi
tmp=$(find /run/hatchery /var/lib/hatchery -name '.*.tmp-*' 2>/dev/null)
if [ -n "$tmp" ]; then echo "leftover temporary files:"; echo "$tmp"; bad=1; fi
[ $bad = 0 ] && echo "nothing left behind"
exit $bad
