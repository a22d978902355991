#!/bin/sh
# Runs inside the VM (as root, in the root cgroup of the layout init.sh made: v2 or, with
# HATCHERY_VM_CGROUP=v1, v1): each test binary given, one after the other, with the test
# names printed, then checks that no hatchery cgroup was left behind.
# Exit status 0 only if every binary ran and passed and nothing was left.
#
#   guest-suite.sh BINARY...
set -u
CG=/sys/fs/cgroup
if [ "${HATCHERY_VM_CGROUP:-v2}" = v1 ]; then
    echo "guest: Linux $(uname -r); cgroup v1: $(ls $CG | tr '\n' ' ')"
    for h in memory cpu,cpuacct pids; do
        [ "$(stat -fc %T $CG/$h)" = cgroupfs ] || { echo "guest: FAIL: $CG/$h is not cgroup v1"; exit 1; }
    done
else
    echo "guest: Linux $(uname -r); cgroup2 controllers of the root: $(cat $CG/cgroup.subtree_control)"
    [ "$(stat -fc %T $CG)" = cgroup2fs ] || { echo "guest: FAIL: $CG is not cgroup2"; exit 1; }
fi
rc=0
for bin in "$@"; do
    name=$(basename "$bin")
    echo "guest: == $name"
    if [ ! -x "$bin" ]; then
        echo "guest: FAIL: $bin is missing or not executable"
        rc=1
        continue
    fi
    # Bounded: a hung test fails the suite instead of using up the VM's whole time.
    timeout -k 5 "${HATCHERY_VM_TEST_TIMEOUT:-300}" "$bin" --test-threads="${HATCHERY_VM_TEST_THREADS:-2}"
    r=$?
    [ $r = 124 ] && echo "guest: FAIL: $name ran past ${HATCHERY_VM_TEST_TIMEOUT:-300}s"
    [ $r = 0 ] || { echo "guest: FAIL: $name exited $r"; rc=1; }
done
left=$(find $CG -mindepth 1 -type d -name 'hatchery-*' 2>/dev/null)
if [ -n "$left" ]; then
    echo "guest: FAIL: cgroups left behind:"
    echo "$left"
    rc=1
else
    echo "guest: no hatchery cgroup left behind"
fi
exit $rc
