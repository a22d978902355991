#!/usr/bin/env bash
# Controller benchmarks: spawn rate through the launcher, the controller's CPU and RSS
# with N idle heartbeating workers, and kill-switch latency.
#   scripts/bench-controller.sh [-n WORKERS] [--window SECONDS] [--warm-pool N]   (as root)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ "$(id -u)" = 0 ] || { echo "bench-controller.sh: run as root" >&2; exit 1; }
# The binary is built on its own, as users build it: built together with an example, its
# dependencies take the dev-dependencies' features too, every crate gets another hash, and
# the functions a start runs are no longer laid out together (build.rs).
hatchery=$(scripts/release-binary.sh)
cargo build --release --locked --quiet --example probe
exec python3 scripts/bench-controller.py --hatchery "$hatchery" --probe target/release/examples/probe "$@"
