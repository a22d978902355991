#!/usr/bin/env bash
# The test command: installs the system packages the build and the tests need, builds
# everything from scratch, and runs every test (unit, property, integration as root,
# rootless as `nobody`), then checks that nothing was left behind.
#
#   scripts/test.sh              everything
#   HATCHERY_SKIP_APT=1 ...      do not touch system packages (they must be present)
#   HATCHERY_VM=0|1              the cgroup v2 suite in a VM (scripts/vm-test.sh): 0 skips it,
#                                1 requires it; by default it runs wherever QEMU can be had
#                                and is reported loudly where it cannot
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '\n== %s\n' "$*" >&2; }

if [ "${HATCHERY_SKIP_APT:-0}" != 1 ] && [ "$(id -u)" = 0 ]; then
    say "installing system packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
        libseccomp-dev pkg-config gcc binutils libc6-dev python3 util-linux procps iproute2 bubblewrap uidmap jq openssl curl \
        etcd-server etcd-client protobuf-compiler libprotobuf-dev >/dev/null
fi
if [ "$(id -u)" = 0 ]; then
    # The rootless tests run the binary as `nobody` (no subordinate ids: the plain mapping)
    # and as the system user `daemon`, given a subordinate range here (the newuidmap path).
    for f in /etc/subuid /etc/subgid; do
        grep -q '^daemon:' "$f" 2>/dev/null || echo 'daemon:400000:65536' >> "$f"
    done
fi

say "format and lints"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
# The cluster feature (etcd) is built and tested too: its own lints, and every test below.
cargo clippy --all-targets --locked --features cluster -- -D warnings

say "build"
cargo build --all-targets --locked --features cluster

# The release binary, as users build it: it must link, and the functions a start runs must
# sit together at the front of its code (build.rs, scripts/hot-functions.py), unless the
# build was asked not to lay them out (HATCHERY_NO_FUNCTION_ORDER).
say "release build"
release_binary=$(scripts/release-binary.sh)
if [ -z "${HATCHERY_NO_FUNCTION_ORDER+set}" ]; then
    python3 scripts/hot-functions.py --check "$release_binary"
fi

say "tests"
cargo test --locked --features cluster -- --test-threads="$(nproc)"

say "leftovers"
scripts/check-leftovers.sh

# This host may have cgroup v1 controllers; the v2 backend is verified under Debian's 6.1
# and 6.12 kernels in QEMU, and v1 in its usual cpu,cpuacct layout under 6.1
# (scripts/vm-test.sh; a few minutes on 2 cores).
case ${HATCHERY_VM:-auto} in
    0)
        say "cgroup v2 suite: NOT RUN (HATCHERY_VM=0)"
        ;;
    *)
        say "cgroup v2 suite in a VM"
        vm=0
        scripts/vm-test.sh || vm=$?
        if [ $vm = 77 ]; then
            say "cgroup v2 suite: NOT RUN: this machine cannot run the VM (reason above)"
            [ "${HATCHERY_VM:-auto}" != 1 ] || exit 1
        elif [ $vm != 0 ]; then
            say "cgroup v2 suite: FAILED (exit $vm)"
            exit $vm
        fi
        ;;
esac
