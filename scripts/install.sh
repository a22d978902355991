#!/usr/bin/env bash
# Builds hatchery in release mode and installs the binary, its manual page and shell
# completions (bash, zsh, fish) under PREFIX.
#
#   scripts/install.sh                       into /usr/local (as root)
#   PREFIX=$HOME/.local scripts/install.sh   for one user (no root needed)
#   DESTDIR=/tmp/pkg scripts/install.sh      staged, for packaging
#   HATCHERY_BIN=target/release/hatchery scripts/install.sh   an already built binary
#
# The build needs libseccomp-dev and pkg-config (scripts/test.sh installs them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PREFIX="${PREFIX:-/usr/local}"
DESTDIR="${DESTDIR:-}"
root="$DESTDIR$PREFIX"

bin="${HATCHERY_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --release --locked --bin hatchery
    bin="target/release/hatchery"
fi
[ -x "$bin" ] || { echo "install.sh: $bin is not an executable; build first" >&2; exit 1; }

install -d "$root/bin" "$root/share/man/man1" \
    "$root/share/bash-completion/completions" \
    "$root/share/zsh/site-functions" \
    "$root/share/fish/vendor_completions.d"
install -m 0755 "$bin" "$root/bin/hatchery"
# Written to a temporary name first: a failed generation leaves no half file installed.
gen() {
    local dest="$1"; shift
    "$bin" "$@" > "$dest.tmp"
    chmod 0644 "$dest.tmp"
    mv "$dest.tmp" "$dest"
}
gen "$root/share/man/man1/hatchery.1" man
gen "$root/share/bash-completion/completions/hatchery" completions bash
gen "$root/share/zsh/site-functions/_hatchery" completions zsh
gen "$root/share/fish/vendor_completions.d/hatchery.fish" completions fish

echo "installed $root/bin/hatchery, its manual page (man hatchery) and bash, zsh and fish completions" >&2
