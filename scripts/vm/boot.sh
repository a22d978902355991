#!/usr/bin/env bash
# Boots a guest prepared by prepare.sh, runs one command in it as root, in the root cgroup of
# a cgroup v2 hierarchy with every controller enabled (with -e HATCHERY_VM_CGROUP=v1: of the
# usual v1 hierarchies), and powers it off. -e settings are the environment of the guest's
# init and of the command:
#
#   scripts/vm/boot.sh [-t SECS] [-e KEY=VALUE]... GUEST_DIR REPO -- COMMAND [ARG...]
#
# The guest's root is this host's / (read-only, with a RAM overlay: nothing the guest writes
# reaches the host) and REPO is shared read-write at the same absolute path, so paths built
# into test binaries resolve. The command starts in REPO; its output and the guest's console
# go to stdout.
#
# Exit status: the command's; 124 when the VM ran past SECS (default 600) and was killed
# (the message says whether the guest was still alive or had stalled);
# 125 when the VM could not boot or gave no exit status. A boot that dies before the
# command starts is retried (HATCHERY_VM_TRIES, default 3): the command has not run then.
#
# Acceleration: KVM when a KVM module for a stock guest kernel (kvm_intel, kvm_amd) is loaded
# and /dev/kvm is usable, else QEMU's TCG. Environment: HATCHERY_VM_QEMU (binary),
# HATCHERY_VM_VERBOSE=1 (the whole kernel log), HATCHERY_VM_CPUS, HATCHERY_VM_MEM.
set -euo pipefail

TIMEOUT=600
ENVS=()
while getopts "t:e:" o; do
    case $o in
        t) TIMEOUT=$OPTARG ;;
        e) ENVS+=("$OPTARG") ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 4 ] && [ "$3" = -- ] || { echo "usage: boot.sh [-t SECS] [-e K=V] GUEST_DIR REPO -- COMMAND..." >&2; exit 2; }
GUEST=$1 REPO=$(cd "$2" && pwd -P)
shift 3
for f in vmlinux initramfs.cpio.gz kver; do
    [ -f "$GUEST/$f" ] || { echo "boot.sh: $GUEST/$f missing: run scripts/vm/prepare.sh" >&2; exit 125; }
done
KVER=$(cat "$GUEST/kver")
QEMU=${HATCHERY_VM_QEMU:-qemu-system-x86_64}
command -v "$QEMU" >/dev/null || { echo "boot.sh: $QEMU not found" >&2; exit 125; }

if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
    ACCEL=(-accel kvm -cpu host)
    TSC=
else
    # TCG. Its guest TSC runs at the host's TSC rate; telling the kernel so avoids the PIT
    # calibration, which fails now and then under TCG and then hangs the boot on a machine
    # without HPET (microvm).
    ACCEL=(-accel tcg,thread=multi -cpu max)
    TSC=$(awk -F: '/^cpu MHz/ { printf "tsc_early_khz=%d", $2 * 1000; exit }' /proc/cpuinfo)
fi
# QEMU 7 (bookworm): microvm, the fastest and, there, reliable. Newer QEMU fails early on
# microvm now and then (an early #DE): use pc there.
qmajor=$("$QEMU" --version | sed -n '1s/^QEMU emulator version \([0-9]*\).*/\1/p')
if [ "${qmajor:-99}" -le 7 ]; then
    MACHINE=(-M microvm,acpi=on) BUS=device
else
    MACHINE=(-M pc) BUS=pci
fi
# Errors and worse reach the console even when quiet: an RCU stall or a hung task is the
# only trace a stalled guest leaves. (microvm has no PCI: its one error about that is
# dropped from the output below.)
if [ "${HATCHERY_VM_VERBOSE:-0}" = 1 ]; then LOGLEVEL=loglevel=7; else LOGLEVEL="quiet loglevel=4"; fi
# panic=-1 with -no-reboot: a dead init ends QEMU at once. random.trust_cpu: no wait for
# entropy (-cpu max has RDRAND). tsc=reliable no_timer_check: no clocksource watchdog
# fighting TCG's uneven time.
APPEND="console=ttyS0 rdinit=/init panic=-1 $LOGLEVEL mitigations=off random.trust_cpu=on tsc=reliable no_timer_check $TSC"

CTL=$(mktemp -d "${TMPDIR:-/tmp}/hatchery-vm-ctl.XXXXXX")

cleanup() {
    rm -rf "$CTL"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
# The guest's init reads env (so -e settings such as HATCHERY_VM_CGROUP reach it) and
# passes it on to the command.
{
    echo "VM_REPO=$(quote "$REPO")"
    for kv in ${ENVS[@]+"${ENVS[@]}"}; do echo "export $(quote "${kv%%=*}")=$(quote "${kv#*=}")"; done
} > "$CTL/env"
{
    printf exec
    for a in "$@"; do printf ' %s' "$(quote "$a")"; done
    echo
} > "$CTL/cmd"
chmod 777 "$CTL"

# 9p shares: security_model=none keeps the host's owners and modes; multidevs=remap avoids
# inode clashes where a share spans several filesystems. (A ',' in a path is ',,' for QEMU.)
FS=() n=0
share() { # path tag options
    FS+=(-fsdev "local,id=fs$n,path=${1//,/,,},security_model=none${3:+,$3}"
         -device "virtio-9p-$BUS,fsdev=fs$n,mount_tag=$2")
    n=$((n + 1))
}
share / root readonly=on,multidevs=remap
share "$GUEST/modules/$KVER" mods readonly=on
share "$CTL" ctl
share "$REPO" repo multidevs=remap

tries=${HATCHERY_VM_TRIES:-3}
deadline=$((SECONDS + TIMEOUT))
while :; do
    rm -f "$CTL/booted" "$CTL/rc"
    left=$((deadline - SECONDS))
    [ $left -gt 0 ] || break
    set +e
    timeout -k 5 "$left" "$QEMU" "${MACHINE[@]}" "${ACCEL[@]}" \
        -smp "${HATCHERY_VM_CPUS:-2}" -m "${HATCHERY_VM_MEM:-2G}" \
        -nodefaults -no-user-config -display none -no-reboot -monitor none \
        -chardev stdio,id=console,signal=off -serial chardev:console \
        -device "virtio-rng-$BUS" "${FS[@]}" \
        -kernel "$GUEST/vmlinux" -initrd "$GUEST/initramfs.cpio.gz" -append "$APPEND" \
        < /dev/null 2>&1 | sed -u 's/\r$//; /reboot: Power down/d; /PCI: Fatal: No config space access function found/d'
    qrc=${PIPESTATUS[0]}
    set -e
    if [ -f "$CTL/booted" ] || [ $qrc = 124 ] || [ $qrc = 137 ]; then break; fi
    tries=$((tries - 1))
    [ $tries -gt 0 ] || break
    echo "boot.sh: the VM ($KVER) died before the command started (qemu exit $qrc); booting again" >&2
done

if [ -f "$CTL/rc" ]; then
    exit "$(cat "$CTL/rc")"
elif [ "${qrc:-124}" = 124 ] || [ "${qrc:-}" = 137 ]; then
    # The guest's init touches ctl/alive every 5 s while the command runs (init.sh).
    if [ -f "$CTL/alive" ]; then
        quiet=$(( $(date +%s) - $(stat -c %Y "$CTL/alive") ))
    else
        quiet=$TIMEOUT
    fi
    if [ "$quiet" -ge 60 ]; then
        echo "boot.sh: the VM ($KVER) gave no sign of life for ${quiet}s before it was killed at ${TIMEOUT}s: the guest stalled" >&2
    else
        echo "boot.sh: the VM ($KVER) ran past ${TIMEOUT}s with its command still running, and was killed" >&2
    fi
    exit 124
elif [ -f "$CTL/booted" ]; then
    echo "boot.sh: the VM ($KVER) stopped while the command ran (qemu exit $qrc), no exit status" >&2
    exit 125
else
    echo "boot.sh: the VM ($KVER) did not boot (qemu exit $qrc); HATCHERY_VM_VERBOSE=1 shows the kernel log" >&2
    exit 125
fi
