#!/usr/bin/env bash
# Builds the release `hatchery` and prints where cargo put it: under CARGO_TARGET_DIR, the
# config's target-dir, or a build target's own directory alike. Build output and warnings
# go to stderr.
#   scripts/release-binary.sh [--quiet]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --locked --bin hatchery --message-format=json-render-diagnostics "$@" |
    python3 -c '
import json, sys
paths = [m["executable"] for m in map(json.loads, sys.stdin)
         if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "hatchery"
         and m.get("executable")]
if len(paths) != 1:
    sys.exit("release-binary.sh: cargo named no hatchery executable")
print(paths[0])'
