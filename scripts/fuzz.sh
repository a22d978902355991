#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for a bounded time. Not part of scripts/test.sh.
#
#   scripts/fuzz.sh                       every target, 60 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh      longer
#   scripts/fuzz.sh contract_parse        one target
#
# Needs cargo-fuzz (installed from crates.io when missing) and libFuzzer's sanitizer
# support, which rustc only offers on nightly: on a stable toolchain RUSTC_BOOTSTRAP=1
# unlocks it. Seeds are in fuzz/seeds/TARGET (read-only); what libFuzzer finds goes to
# fuzz/corpus/TARGET and crashes to fuzz/artifacts/TARGET (both git-ignored). Exits
# non-zero on the first crash.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=${FUZZ_SECONDS:-60}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
# libFuzzer is C++ and brings libgcc_s.so.1 along: keep hatchery's unwinder the shared one
# too (build.rs), so that the fuzz targets have one unwinder, not two.
export HATCHERY_SHARED_LIBGCC=1
if ! rustc --version | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi

if [ $# -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

for target in "${targets[@]}"; do
    printf '\n== fuzzing %s for %s s\n' "$target" "$seconds" >&2
    mkdir -p "fuzz/corpus/$target" "fuzz/seeds/$target"
    cargo fuzz run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
        -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1
done
printf '\n== fuzzing: %d target(s), %s s each, no crash\n' "${#targets[@]}" "$seconds" >&2
