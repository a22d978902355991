#!/usr/bin/env bash
# Prepares one guest kernel for the VM suite, cached between runs:
#
#   scripts/vm/prepare.sh SUITE      SUITE = bookworm (Debian 12's 6.1 kernel)
#                                          | bookworm-backports (6.12)
#
# Prints the guest directory on stdout. In it:
#   vmlinux            the kernel, uncompressed: QEMU boots its PVH entry point directly and
#                      skips the XZ decompressor, which takes seconds under TCG
#   modules/KVER/      its modules with a modules.dep (shared read-only with the guest)
#   initramfs.cpio.gz  static busybox + scripts/vm/init.sh + the virtio/9p/overlay modules
#   kver               the kernel release
#
# The kernel is the one Debian's linux-image-amd64 of SUITE depends on. bookworm-backports
# is read through a private apt configuration under the cache: the system's apt sources are
# never changed. A prepared kernel is reused until HATCHERY_VM_REFRESH=1; the initramfs is
# rebuilt whenever init.sh or this script is newer than it.
#
# Environment: HATCHERY_VM_CACHE (default /var/cache/hatchery-vm), HATCHERY_VM_REFRESH.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${HATCHERY_VM_CACHE:-/var/cache/hatchery-vm}
SUITE=${1:?usage: prepare.sh bookworm|bookworm-backports}

# Loaded in the initramfs, with their dependencies from modules.dep, before the 9p root can
# be mounted: the virtio transports, 9p over virtio, overlayfs for the writable root, and
# virtio-rng so that getrandom() never waits for entropy. Built-in ones are skipped.
INITRD_MODULES="virtio_pci virtio_mmio 9pnet_virtio 9p overlay virtio-rng"

say() { echo "vm-prepare[$SUITE]: $*" >&2; }
die() { echo "vm-prepare[$SUITE]: error: $*" >&2; exit 1; }

# The kernel inside a bzImage: find the compressed payload by its magic and unpack from there
# until the result is an ELF (what the kernel's scripts/extract-vmlinux does).
extract_vmlinux() { # bzimage out
    local pair magic tool off
    for pair in $'\xfd7zXZ:xz' $'\x28\xb5\x2f\xfd:zstd' $'\x1f\x8b\x08:gzip'; do
        magic=${pair%%:*} tool=${pair##*:}
        command -v "$tool" >/dev/null || continue
        for off in $(LC_ALL=C grep -abo "$magic" "$1" 2>/dev/null | cut -d: -f1 | head -5); do
            tail -c +$((off + 1)) "$1" | "$tool" -dc > "$2" 2>/dev/null || true
            if [ "$(head -c 4 "$2" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
                return 0
            fi
        done
    done
    rm -f "$2"
    return 1
}

# Builds the initramfs of the kernel in $1 (modules under $1/modules/KVER).
build_initramfs() { # dir kver
    local dir=$1 kver=$2 root m p d deps found=""
    local mods=$dir/modules/$kver
    root=$(mktemp -d "$CACHE/initramfs.XXXXXX")
    mkdir -p "$root/bin" "$root/etc" "$root/lib/modules/$kver"
    cp /bin/busybox "$root/bin/busybox"
    cp "$HERE/init.sh" "$root/init"
    chmod 755 "$root/init"
    cp "$mods/modules.dep" "$root/lib/modules/$kver/"
    # modules.dep lines read "kernel/path/mod.ko[.xz]: dep.ko dep.ko ..."; take the
    # transitive closure of what INITRD_MODULES need.
    declare -A want=()
    add() {
        [ -n "${want[$1]:-}" ] && return
        want[$1]=1
        for d in $(awk -v m="$1:" '$1 == m { $1 = ""; print; exit }' "$mods/modules.dep"); do
            add "$d"
        done
    }
    for m in $INITRD_MODULES; do
        p=$(awk -F: -v re="/${m//_/[_-]}[.]ko([.](xz|zst|gz))?$" '$1 ~ re { print $1; exit }' \
            "$mods/modules.dep")
        [ -n "$p" ] || continue     # built into this kernel
        add "$p"
        found="$found $m"
    done
    for p in "${!want[@]}"; do
        mkdir -p "$root/lib/modules/$kver/$(dirname "$p")"
        cp "$mods/$p" "$root/lib/modules/$kver/$p"
    done
    echo "$found" > "$root/etc/modules"
    ( cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 ) > "$dir/initramfs.cpio.gz.tmp"
    mv "$dir/initramfs.cpio.gz.tmp" "$dir/initramfs.cpio.gz"
    rm -rf "$root"
    say "initramfs for $kver: modules$found"
}

case $SUITE in
    bookworm | bookworm-backports) ;;
    *) die "unknown suite $SUITE (bookworm or bookworm-backports)" ;;
esac
for tool in busybox cpio dpkg-deb apt-get; do
    command -v "$tool" >/dev/null || die "$tool is missing (scripts/vm-test.sh installs it)"
done
mkdir -p "$CACHE/$SUITE"
exec 9>"$CACHE/.lock-$SUITE"
flock -w 600 9 || die "another run has held $CACHE/.lock-$SUITE for 10 minutes"

APT=(apt-get -q -o DPkg::Lock::Timeout=300)
APT_CACHE=(apt-cache)
if [ "$SUITE" = bookworm-backports ]; then
    # A private apt configuration that knows only bookworm-backports, on the mirror the
    # system already uses for bookworm.
    mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null \
        | awk '$2 == "bookworm" { print $1; exit }')
    [ -n "$mirror" ] || die "no bookworm mirror in apt's sources (run apt-get update first)"
    A=$CACHE/apt-$SUITE
    mkdir -p "$A/lists/partial" "$A/archives/partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $SUITE main" \
        > "$A/sources.list"
    opts=(-o "Dir::Etc::SourceList=$A/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$A/lists" -o "Dir::Cache::Archives=$A/archives"
          -o "Dir::Cache::pkgcache=$A/pkgcache.bin" -o "Dir::Cache::srcpkgcache=$A/srcpkgcache.bin")
    APT+=("${opts[@]}")
    APT_CACHE+=("${opts[@]}")
fi

KVER=
if [ "${HATCHERY_VM_REFRESH:-0}" != 1 ] && [ -f "$CACHE/$SUITE/kver" ]; then
    KVER=$(cat "$CACHE/$SUITE/kver")
    [ -f "$CACHE/$SUITE/$KVER/vmlinux" ] || KVER=
fi
if [ -z "$KVER" ]; then
    if [ "$SUITE" = bookworm-backports ] || [ "${HATCHERY_VM_REFRESH:-0}" = 1 ] \
        || ! "${APT_CACHE[@]}" show linux-image-amd64 >/dev/null 2>&1; then
        say "apt-get update"
        "${APT[@]}" update >&2 || die "apt-get update failed"
    fi
    # The meta-package depends on the versioned image package (linux-image-6.1.0-NN-amd64).
    pkg=$("${APT_CACHE[@]}" depends linux-image-amd64 2>/dev/null \
        | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
    [ -n "$pkg" ] || die "cannot resolve linux-image-amd64 in $SUITE"
    work=$(mktemp -d "$CACHE/tmp.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    say "downloading $pkg"
    # apt downloads as its unprivileged _apt user where that user may write.
    chown _apt "$work" 2>/dev/null || true
    ( cd "$work" && "${APT[@]}" download "$pkg" >&2 ) || die "cannot download $pkg"
    dpkg-deb -x "$work"/*.deb "$work/x"
    KVER=$(ls "$work/x/lib/modules")
    [ -n "$KVER" ] && [ -f "$work/x/boot/vmlinuz-$KVER" ] || die "$pkg has no kernel or modules"
    # The .deb ships no modules.dep (its postinst runs depmod) and the host may have no
    # kmod: busybox's depmod writes one that the guest's busybox modprobe reads.
    busybox depmod -b "$work/x" "$KVER"
    mkdir -p "$work/out/modules"
    mv "$work/x/lib/modules/$KVER" "$work/out/modules/$KVER"
    extract_vmlinux "$work/x/boot/vmlinuz-$KVER" "$work/out/vmlinux" \
        || die "cannot extract vmlinux from vmlinuz-$KVER"
    echo "$KVER" > "$work/out/kver"
    rm -rf "${CACHE:?}/$SUITE/$KVER"
    mv "$work/out" "$CACHE/$SUITE/$KVER"
    echo "$KVER" > "$CACHE/$SUITE/kver"
    rm -rf "$work"
    trap - EXIT
    # Kernels this one replaces (a refresh after a Debian update) only take space.
    for old in "$CACHE/$SUITE"/*/; do
        [ "$(basename "$old")" = "$KVER" ] || rm -rf "$old"
    done
fi

DIR=$CACHE/$SUITE/$KVER
if [ ! -f "$DIR/initramfs.cpio.gz" ] || [ "$HERE/init.sh" -nt "$DIR/initramfs.cpio.gz" ] \
    || [ "${BASH_SOURCE[0]}" -nt "$DIR/initramfs.cpio.gz" ]; then
    build_initramfs "$DIR" "$KVER"
fi
echo "$DIR"
