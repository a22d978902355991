#!/usr/bin/env bash
# Fails if hatchery left anything behind on this machine: cgroups, processes, mounts,
# the egress tests' network namespaces, the cluster tests' etcd members or temporary files.
set -uo pipefail
bad=0
cg=$(find /sys/fs/cgroup -maxdepth 6 -type d -name 'hatchery-*' 2>/dev/null)
if [ -n "$cg" ]; then echo "leftover cgroups:"; echo "$cg"; bad=1; fi
ps=$(pgrep -a -f 'hatchery (run|controller|spawn|agent)' 2>/dev/null | grep -v -e pgrep -e check-leftovers)
if [ -n "$ps" ]; then echo "leftover processes:"; echo "$ps"; bad=1; fi
mnt=$(grep -c hatchery /proc/self/mountinfo 2>/dev/null)
if [ "${mnt:-0}" != 0 ]; then echo "leftover mounts:"; grep hatchery /proc/self/mountinfo; bad=1; fi
etcd=$(pgrep -a -f 'hatchery-etcd-' 2>/dev/null | grep -v -e pgrep -e check-leftovers)
if [ -n "$etcd" ]; then echo "leftover test etcd members (tests/common/etcd.rs):"; echo "$etcd"; bad=1; fi
etcd_dirs=$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'hatchery-etcd-*' 2>/dev/null)
if [ -n "$etcd_dirs" ]; then echo "leftover test etcd data (tests/common/etcd.rs):"; echo "$etcd_dirs"; bad=1; fi
ns=$(ip netns list 2>/dev/null | grep -E '^hb[ci]-')
if [ -n "$ns" ]; then echo "leftover test network namespaces (tests/common/egress_bed.rs):"; echo "$ns"; bad=1; fi
notes=$(find /run/hatchery/runs -type f 2>/dev/null)
if [ -n "$notes" ]; then echo "leftover notes of runs' cgroups (src/sandbox/cgroup/leftovers.rs):"; echo "$notes"; bad=1; fi
tmp=$(find /run/hatchery /var/lib/hatchery -name '.*.tmp-*' 2>/dev/null)
if [ -n "$tmp" ]; then echo "leftover temporary files:"; echo "$tmp"; bad=1; fi
[ $bad = 0 ] && echo "nothing left behind"
exit $bad
