#!/usr/bin/env bash
# Controller benchmarks: spawn rate through the launcher, the controller's CPU and RSS
# with N idle heartbeating workers, and kill-switch latency.
#   scripts/bench-controller.sh [-n WORKERS] [--window SECONDS] [--warm-pool N]   (as root)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ "$(id -u)" = 0 ] || { echo "bench-controller.sh: run as root" >&2; exit 1; }
cargo build --release --locked --quiet --bin hatchery --example probe
exec python3 scripts/bench-controller.py --hatchery target/release/hatchery --probe target/release/examples/probe "$@"
