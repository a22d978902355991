#!/usr/bin/env bash
# The cgroup v2 suite: boots Debian's 6.1 and 6.12 kernels in QEMU and runs hatchery's
# v2-only integration tests (tests/cgroup_v2*.rs) inside each, as root in a pure cgroup v2
# hierarchy; then 6.1 once more with the common cgroup v1 layout for the limit tests. This
# host's cgroup v1 controllers cannot exercise the v2 backend; a VM can, on any Linux
# machine.
#
#   scripts/vm-test.sh
#
# What it does, all cached between runs except the build and the boots:
#   1. installs what it needs from Debian packages (qemu-system-x86 busybox-static cpio jq);
#   2. prepares each guest kernel and its initramfs (scripts/vm/prepare.sh) in
#      HATCHERY_VM_CACHE (default /var/cache/hatchery-vm);
#   3. builds the test binaries, hatchery and the probe on the host (compiling under TCG
#      would be 6-45x slower) and finds the binaries in cargo's JSON messages;
#   4. boots each kernel (scripts/vm/boot.sh) with the repository shared at the same path
#      and runs the binaries there (scripts/vm/guest-suite.sh) with
#      HATCHERY_EXPECT_CGROUP_V2=1, so that a missing v2 fails instead of skipping.
#
# Exit status: 0 when every test passed on every kernel; 77 when this machine cannot run
# the VM at all (QEMU cannot be installed, or not root; the reason is printed); else the
# failure's status (1: a kernel could not be prepared or a test failed; 125: a VM did not
# boot; 124: a VM ran past its time limit).
#
# Environment:
#   HATCHERY_VM_CACHE        cache directory (kernels, initramfs, private apt lists)
#   HATCHERY_VM_KERNELS      suites to boot (default "bookworm bookworm-backports")
#   HATCHERY_VM_TIMEOUT      wall-clock limit per boot, seconds (default 420)
#   HATCHERY_VM_TEST_TIMEOUT wall-clock limit per test binary in the guest (default 300)
#   HATCHERY_VM_TEST_THREADS test threads in the guest (default 2, the VM's CPUs)
#   HATCHERY_VM_EXTRA_TESTS  more cargo test targets to run in the guest (names or globs)
#   HATCHERY_VM_V1_KERNELS   suites to boot with a cgroup v1 layout (default "bookworm";
#                            empty for none)
#   HATCHERY_SKIP_APT=1      install nothing (the tools must be present)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$(pwd -P)
VM=$REPO/scripts/vm
START=$SECONDS

# The test targets that run in the guest: tests/cgroup_v2.rs (limits, cleanup, placement,
# delegation) and tests/cgroup_v2_controller.rs (the controller's kill switch on v2). More
# through HATCHERY_VM_EXTRA_TESTS; keep them few and v2-specific: every sandbox start costs
# about 30x the host's under TCG.
VM_TEST_TARGETS=('cgroup_v2*')
# shellcheck disable=SC2206
VM_TEST_TARGETS+=(${HATCHERY_VM_EXTRA_TESTS:-})
KERNELS=${HATCHERY_VM_KERNELS-bookworm bookworm-backports}
# And once on cgroup v1 in the layout most v1 hosts have (cpu and cpuacct co-mounted; this
# machine's own v1 hierarchies are all separate): the limit tests (tests/run_limits.rs).
# Only 6.1: from 6.11 on the v1 memory controller is a build option Debian may drop.
V1_TEST_TARGETS=(run_limits)
V1_KERNELS=${HATCHERY_VM_V1_KERNELS-bookworm}

say() { printf '\n== vm-test: %s\n' "$*" >&2; }
cannot() {
    printf '\n!! vm-test: CANNOT RUN THE CGROUP V2 SUITE ON THIS MACHINE: %s\n' "$*" >&2
    exit 77
}

# --- 1. host tools ----------------------------------------------------------------------
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
# Static: the same busybox runs the initramfs of every guest kernel.
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v jq >/dev/null || need+=(jq)
if [ ${#need[@]} -gt 0 ]; then
    [ "${HATCHERY_SKIP_APT:-0}" != 1 ] || cannot "missing ${need[*]} and HATCHERY_SKIP_APT=1"
    [ "$(id -u)" = 0 ] || cannot "missing ${need[*]}; install them as root (apt-get install ${need[*]})"
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt=(apt-get -y -q -o DPkg::Lock::Timeout=300 install --no-install-recommends "${need[@]}")
    # Note: on a machine with qemu-utils from bookworm-backports, apt replaces it: bookworm's
    # QEMU 7.2 (whose microvm machine boots most reliably) conflicts with it. hatchery does
    # not need qemu-img.
    if ! "${apt[@]}" >&2; then
        apt-get -q -o DPkg::Lock::Timeout=300 update >&2 || true
        "${apt[@]}" >&2 || cannot "apt-get install ${need[*]} failed"
    fi
fi
[ "$(id -u)" = 0 ] || cannot "the guest tests run privileged sandboxes: run as root"

# --- 2. guest kernels -------------------------------------------------------------------
declare -A GUEST=()
for suite in $KERNELS $V1_KERNELS; do
    [ -z "${GUEST[$suite]:-}" ] || continue
    say "guest kernel from $suite"
    # QEMU is there, so from here on anything that goes wrong is a failure, not a skip.
    GUEST[$suite]=$("$VM/prepare.sh" "$suite") || {
        echo "vm-test: FAIL: cannot prepare the $suite guest kernel (see above)" >&2
        exit 1
    }
done

# --- 3. build on the host ---------------------------------------------------------------
say "building the test binaries on the host"
cargo build --locked --bin hatchery --example probe
test_binaries() { # TARGET...: the test executables of these cargo test targets
    local targets=() t
    for t in "$@"; do targets+=(--test "$t"); done
    cargo test --locked --no-run --message-format=json "${targets[@]}" \
        | jq -r 'select(.reason == "compiler-artifact" and .executable != null
                        and (.target.kind | index("test"))) | .executable'
}
mapfile -t BINARIES < <(test_binaries "${VM_TEST_TARGETS[@]}")
[ ${#BINARIES[@]} -gt 0 ] || { echo "vm-test: no test binary matched ${VM_TEST_TARGETS[*]}" >&2; exit 1; }
mapfile -t V1_BINARIES < <(test_binaries "${V1_TEST_TARGETS[@]}")
[ ${#V1_BINARIES[@]} -gt 0 ] || { echo "vm-test: no test binary matched ${V1_TEST_TARGETS[*]}" >&2; exit 1; }
for b in "${BINARIES[@]}"; do echo "vm-test: will run $b" >&2; done
for b in "${V1_BINARIES[@]}"; do echo "vm-test: will run $b (cgroup v1)" >&2; done
BUILT=$SECONDS

# --- 4. boot and test -------------------------------------------------------------------
status=0
summary=()
boot_suite() { # SUITE LAYOUT BINARY...
    local suite=$1 layout=$2 dir kver t0 rc=0 verdict=PASS
    shift 2
    dir=${GUEST[$suite]}
    kver=$(cat "$dir/kver")
    say "booting $kver ($suite), cgroup $layout"
    t0=$SECONDS
    local envs=(-e HATCHERY_VM_CGROUP="$layout")
    if [ "$layout" = v2 ]; then
        envs+=(-e HATCHERY_EXPECT_CGROUP_V2=1)
    else
        envs+=(-e HATCHERY_EXPECT_CGROUP="$layout")
    fi
    local log try
    log=$(mktemp /tmp/hatchery-vm-log.XXXXXX)
    for try in 1 2; do
        rc=0
        "$VM/boot.sh" -t "${HATCHERY_VM_TIMEOUT:-420}" "${envs[@]}" \
            -e HATCHERY_VM_TEST_TIMEOUT="${HATCHERY_VM_TEST_TIMEOUT:-300}" \
            -e HATCHERY_VM_TEST_THREADS="${HATCHERY_VM_TEST_THREADS:-2}" \
            "$dir" "$REPO" -- sh "$VM/guest-suite.sh" "$@" 2>&1 | tee "$log" || rc=$?
        # An emulator fault, not a test's: the guest kernel oopsed on a breakpoint left by
        # its own text patching (QEMU TCG's cross-vCPU code modification), so the suite
        # never finished. Boot once more, loudly; a second crash fails.
        if [ $rc = 125 ] && [ $try = 1 ] && grep -q 'Oops: int3' "$log"; then
            say "the $kver guest kernel crashed in its own text patching (an emulator fault): booting it again"
            verdict="PASS (2nd boot)"
            continue
        fi
        # The guest itself stopped (no sign of life from its init for a minute or more,
        # boot.sh): not a test that hung, which keeps the guest alive and fails. Once more,
        # loudly; a second stall fails.
        if [ $rc = 124 ] && [ $try = 1 ] && grep -q 'the guest stalled' "$log"; then
            say "the $kver guest stalled (no sign of life from its init): booting it again"
            verdict="PASS (2nd boot)"
            continue
        fi
        break
    done
    rm -f "$log"
    [ $rc = 0 ] || verdict="FAIL (exit $rc)"
    summary+=("$(printf '%-28s %-10s %-12s %4ds' "$kver" "cgroup $layout" "$verdict" $((SECONDS - t0)))")
    [ $rc = 0 ] || [ $status != 0 ] || status=$rc
}
for suite in $KERNELS; do
    boot_suite "$suite" v2 "${BINARIES[@]}"
done
for suite in $V1_KERNELS; do
    boot_suite "$suite" v1 "${V1_BINARIES[@]}"
done

say "summary"
printf '%s\n' "${summary[@]}" >&2
echo "vm-test: build $((BUILT - START))s, total $((SECONDS - START))s" >&2
exit $status
