#!/usr/bin/env bash
# Start-up cost of a sandbox against bubblewrap, measured alternately in one run.
#   scripts/bench.sh [-n SAMPLES] [--pause-ms MS] [--extra "FLAGS"]
# Prints the median (p10, p90) wall time of `hatchery run -- /bin/true`, of bubblewrap's
# equivalent and of plain /bin/true, and the hatchery/bubblewrap ratio.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v bwrap >/dev/null || { echo "bench.sh: bubblewrap is not installed (apt-get install bubblewrap)" >&2; exit 1; }
cargo build --release --locked --quiet
exec python3 scripts/bench.py --hatchery target/release/hatchery "$@"
