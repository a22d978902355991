#!/bin/busybox sh
# PID 1 of the test VM (prepare.sh puts it at /init in the initramfs). Runs in two stages.
#
# Stage 1, in the initramfs: load the virtio/9p/overlay modules, mount the 9p shares boot.sh
# exports, and switch_root onto a writable root:
#   root  the host's /, read-only; a tmpfs overlay on top takes the guest's writes
#   mods  the guest kernel's modules (for modprobe on demand)
#   ctl   this run's control directory: env and cmd in, booted and rc out
#   repo  the repository, read-write, at the same absolute path as on the host
# Stage 2, in the new root (this file again, argv[1] = stage2): cgroup2 at /sys/fs/cgroup as
# systemd mounts it, every controller enabled for the root's children (or, with
# HATCHERY_VM_CGROUP=v1, the classic v1 layout of systemd's hybrid mode: memory,
# cpu,cpuacct co-mounted, pids, and a controller-less cgroup2 at unified/), then the command
# in the root cgroup; its exit status goes to ctl/rc, and the VM powers off.
#
# pivot_root (which sandboxes use) does not work from an initramfs: hence the real root.

BB=/bin/busybox
[ "$1" = stage2 ] && BB=/run/vm/busybox

say() { echo "vm-init: $*" > /dev/console; }
fail() {
    say "FATAL: $*"
    for d in /ctl /run/ctl; do [ -d $d/. ] && echo 125 > $d/rc 2> /dev/null; done
    $BB sync
    $BB poweroff -f
}

# The virtio device may still be probing right after modprobe: retry for up to 5 s.
mount_9p() { # tag dir options
    n=0
    until $BB mount -t 9p -o "trans=virtio,version=9p2000.L,msize=512000,$3" "$1" "$2" 2> /dev/null; do
        n=$((n + 1))
        [ $n -ge 50 ] && return 1
        $BB usleep 100000
    done
}

stage1() {
    export PATH=/bin   # the kernel starts init without one
    $BB mkdir -p /proc /sys /dev
    $BB mount -t proc proc /proc
    $BB mount -t sysfs sysfs /sys
    $BB mount -t devtmpfs devtmpfs /dev
    $BB --install -s /bin
    for m in $(cat /etc/modules); do
        modprobe "$m" || say "warning: modprobe $m failed"
    done
    mkdir -p /ctl /lower /upper /newroot
    mount_9p ctl /ctl cache=none || fail "no 9p share 'ctl' (virtio or 9p modules missing?)"
    . /ctl/env
    mount_9p root /lower ro,cache=loose || fail "no 9p share 'root'"
    mount -t tmpfs -o mode=0755 tmpfs /upper
    mkdir -p /upper/data /upper/work
    mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /newroot \
        || fail "cannot mount the overlay root"
    # Fresh /run and /tmp: the host's would otherwise show through.
    mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /newroot/run
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /newroot/tmp
    kver=$(uname -r)
    mkdir -p /newroot/run/vm /newroot/run/ctl "/newroot/lib/modules/$kver"
    mount_9p mods "/newroot/lib/modules/$kver" ro,cache=loose || say "warning: no modules share"
    mount --move /ctl /newroot/run/ctl
    mkdir -p "/newroot$VM_REPO"
    # cache=mmap: binaries on the share are executed (mmap'ed).
    mount_9p repo "/newroot$VM_REPO" cache=mmap || fail "no 9p share 'repo'"
    cp /bin/busybox /init /newroot/run/vm/
    ln -s busybox /newroot/run/vm/modprobe
    for d in dev proc sys; do mount --move "/$d" "/newroot/$d"; done
    # The new root need not have /bin/busybox (the #! interpreter): name ours explicitly.
    exec switch_root /newroot /run/vm/busybox sh /run/vm/init stage2
    fail "switch_root failed"
}

# The layout most cgroup v1 hosts have (systemd's hybrid mode): cpu and cpuacct share one
# hierarchy, reachable under both names.
cgroup_v1() {
    CG=/sys/fs/cgroup
    $BB mount -t tmpfs -o mode=0755,nosuid,nodev,noexec cgroup $CG || fail "cannot mount $CG"
    for h in memory cpu,cpuacct pids; do
        $BB mkdir $CG/$h
        $BB mount -t cgroup -o nosuid,nodev,noexec,$h cgroup $CG/$h || fail "cannot mount cgroup v1 $h"
    done
    $BB ln -s cpu,cpuacct $CG/cpu
    $BB ln -s cpu,cpuacct $CG/cpuacct
    $BB mkdir $CG/unified
    $BB mount -t cgroup2 -o nsdelegate,nosuid,nodev,noexec cgroup2 $CG/unified \
        || fail "cannot mount cgroup2 at $CG/unified"
    for h in memory cpu,cpuacct pids; do $BB mkdir $CG/$h/vm-keep; done
}

# Both layouts keep one empty cgroup (vm-keep) for the VM's life. The kernel flips static
# keys when the first cgroup of a controller appears (memcg's kmem accounting) and, for
# cpuset, again whenever the last one goes; each flip patches kernel text, which under
# QEMU's multi-threaded TCG can race another vCPU into an "Oops: int3". With vm-keep the
# keys flip once, here, while nothing else runs.
stage2() {
    export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    . /run/ctl/env
    if [ "${HATCHERY_VM_CGROUP:-v2}" = v1 ]; then
        cgroup_v1
    else
        $BB mount -t cgroup2 -o nsdelegate,nosuid,nodev,noexec cgroup2 /sys/fs/cgroup \
            || fail "cannot mount cgroup2"
        for c in $($BB cat /sys/fs/cgroup/cgroup.controllers); do
            echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control || say "warning: cannot enable $c"
        done
        $BB mkdir /sys/fs/cgroup/vm-keep
    fi
    $BB mkdir -p /dev/pts /dev/shm
    $BB mount -t devpts -o newinstance,ptmxmode=0666,gid=5,mode=620 devpts /dev/pts
    $BB mount -t tmpfs -o nosuid,nodev tmpfs /dev/shm
    $BB mount -t securityfs securityfs /sys/kernel/security 2> /dev/null
    $BB ln -sf /proc/self/fd /dev/fd
    $BB ln -sf /proc/self/fd/0 /dev/stdin
    $BB ln -sf /proc/self/fd/1 /dev/stdout
    $BB ln -sf /proc/self/fd/2 /dev/stderr
    echo /run/vm/modprobe > /proc/sys/kernel/modprobe
    $BB ip link set lo up
    $BB hostname vm
    export HOME=/root TERM=dumb
    cd "$VM_REPO" || fail "cannot enter $VM_REPO"
    : > /run/ctl/booted    # the command starts: from here on boot.sh will not retry
    # A sign of life every 5 s: boot.sh tells a guest that stalled (its kernel or the
    # emulator) from a command that ran too long by how old this file is.
    ( while :; do : > /run/ctl/alive; $BB sleep 5; done ) &
    alive=$!
    /bin/sh /run/ctl/cmd < /dev/null > /dev/console 2>&1
    rc=$?
    kill $alive 2> /dev/null
    echo "$rc" > /run/ctl/rc
    $BB sync
    $BB umount "$VM_REPO" 2> /dev/null
    $BB poweroff -f
}

if [ "$1" = stage2 ]; then stage2; else stage1; fi
