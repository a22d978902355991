#!/usr/bin/env bash
# Start-up cost of a sandbox against bubblewrap, measured alternately in one run.
#   scripts/bench.sh [-n SAMPLES] [--pause-ms MS] [--extra "FLAGS"] [--no-limits]
#                    [--lanes N] [--lane-starts M] [--rounds R]
# Prints, for `hatchery run --memory 256M --cpus 1 --pids 64 -- /bin/true` (--no-limits:
# without the limits), bubblewrap's equivalent and plain /bin/true: the median (p10, p90)
# wall time and CPU time (user + system of the whole process tree) of one start, and the
# rate of starts with N loops at once; each with the hatchery/bubblewrap ratio; and, as
# root, what a memory cgroup costs to make and remove on this host (it grows with the
# most file systems the host has held at once since boot; bubblewrap makes none).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v bwrap >/dev/null || { echo "bench.sh: bubblewrap is not installed (apt-get install bubblewrap)" >&2; exit 1; }
# Warnings (build.rs says when the functions a start runs cannot be laid out together)
# still show.
hatchery=$(scripts/release-binary.sh)
# Whether they sit together (a stale list makes every start slower).
python3 scripts/hot-functions.py --check "$hatchery" || true
exec python3 scripts/bench.py --hatchery "$hatchery" "$@"
