#!/usr/bin/env bash
# Cluster benchmarks with an etcd started here on loopback: admissions per second through
# etcd (three controllers) against one controller deciding in memory, and the cluster
# kill switch over N workers on three nodes.
#   scripts/bench-cluster.sh [-n WORKERS] [--rounds R] [--spawns S]      (as root)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ "$(id -u)" = 0 ] || { echo "bench-cluster.sh: run as root" >&2; exit 1; }
command -v etcd >/dev/null || { echo "bench-cluster.sh: etcd is not installed (apt-get install etcd-server)" >&2; exit 1; }
cargo build --release --locked --quiet --features cluster --bin hatchery
exec python3 scripts/bench-cluster.py --hatchery target/release/hatchery "$@"
