#!/usr/bin/env bash
# Builds hatchery in release mode and installs the binary, its manual page and shell
# completions (bash, zsh, fish) under PREFIX.
#
#   scripts/install.sh                       into /usr/local (as root)
#   PREFIX=$HOME/.local scripts/install.sh   for one user (no root needed)
#   DESTDIR="$PWD/pkg" scripts/install.sh   staged, for packaging (a directory of yours)
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

# The install tree must be the caller's (or root's) alone: in a directory someone else
# may write, a planted symlink would turn these writes into writes elsewhere.
check_tree() {
    local d="$1"
    while [ ! -e "$d" ] && [ "$d" != / ]; do d=$(dirname "$d"); done
    local owner mode
    owner=$(stat -c %u "$d"); mode=$(stat -c %a "$d")
    if [ "$owner" != "$(id -u)" ] && [ "$owner" != 0 ]; then
        echo "install.sh: $d belongs to uid $owner, not to you: install somewhere of yours (PREFIX, DESTDIR)" >&2
        exit 1
    fi
    if [ -k "$d" ] || [ $((8#$mode & 8#022)) != 0 ]; then
        echo "install.sh: $d can be written by others (mode $mode): install somewhere only you can write (PREFIX, DESTDIR)" >&2
        exit 1
    fi
}
check_tree "$root"

install -d "$root/bin" "$root/share/man/man1" \
    "$root/share/bash-completion/completions" \
    "$root/share/zsh/site-functions" \
    "$root/share/fish/vendor_completions.d"
install -m 0755 "$bin" "$root/bin/hatchery"
# Generated in a private directory, then installed with install(1), which replaces the
# destination (never writes through what stands there): a failed generation leaves no
# half file installed.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gen() {
    local dest="$1"; shift
    "$bin" "$@" > "$work/out"
    install -m 0644 "$work/out" "$dest"
}
gen "$root/share/man/man1/hatchery.1" man
gen "$root/share/bash-completion/completions/hatchery" completions bash
gen "$root/share/zsh/site-functions/_hatchery" completions zsh
gen "$root/share/fish/vendor_completions.d/hatchery.fish" completions fish

echo "installed $root/bin/hatchery, its manual page (man hatchery) and bash, zsh and fish completions" >&2
