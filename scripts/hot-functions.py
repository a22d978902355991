#!/usr/bin/env python3
"""The functions a start runs, in the order it first runs them: the list the release build
hands the linker (`src/hot-functions.txt`, see build.rs) so that they sit together at the
front of `.text`.

A start runs about 540 functions spread over 5 MB of code; the kernel maps a binary's
pages at the first touch, 16 at a time, so spread code costs a page fault per scattered
page in the supervisor, again in pid 1 (a clone maps its code afresh), and the unmapping
of all of it at each exit. Laid out together they fit in about 150 pages.

    scripts/hot-functions.py [BIN]          write src/hot-functions.txt from BIN's starts
    scripts/hot-functions.py --check [BIN]  say how much of the list BIN has, and where

BIN defaults to target/release/hatchery. Writing needs root and tracefs: it places a uprobe
on every function of BIN (its own group and tracing instance, both removed afterwards, and
at the start of the next run if this one was cut short), runs the starts below, and keeps
the functions hit, in first-hit order. The names are mangled with each crate's hash, which
depends on the toolchain, Cargo.lock, the features and whether `--target` is given, so
the list is made from the plain release build (`cargo build --release`, as the scripts
and the README build it); after a toolchain or dependency update, make it again (`--check`
fails when most of it is gone).
"""
import argparse, os, re, signal, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIST = os.path.join(ROOT, "src", "hot-functions.txt")
TRACEFS = "/sys/kernel/tracing"
GROUP = "hatchery_hot"
# The starts whose functions go first: the benchmark's own first (scripts/bench.py), then
# what other usual starts add.
STARTS = [
    ([], ["run", "--memory", "256M", "--cpus", "1", "--pids", "64", "--", "/bin/true"]),
    ([], ["run", "--", "/bin/true"]),
    ([], ["run", "--memory", "64M", "--ro", "/usr", "--env", "A=1", "--report", "-",
          "--", "/bin/sh", "-c", "exit 3"]),
    (["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"],
     ["run", "--", "/bin/true"]),
]
# At most the list's share of the binary's functions that a release build with default
# features on the toolchain it was made with must still have (`--check`).
MIN_PRESENT = 0.75
PAGE = 4096


def functions(binary):
    """(address, size, name) of every function symbol of `binary`, by address."""
    out = subprocess.run(["nm", "--defined-only", "-S", binary], check=True,
                         capture_output=True, text=True).stdout
    seen, funcs = set(), []
    for line in out.splitlines():
        f = line.split()
        if len(f) == 4 and f[2] in "tTwW" and int(f[1], 16) > 0:
            addr = int(f[0], 16)
            if addr not in seen:
                seen.add(addr)
                funcs.append((addr, int(f[1], 16), f[3]))
    return sorted(funcs)


def file_offset(binary):
    """Maps a virtual address of `binary` to its offset in the file (uprobes want that)."""
    out = subprocess.run(["readelf", "-lW", binary], check=True, capture_output=True,
                         text=True).stdout
    loads = []
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            loads.append((int(f[1], 16), int(f[2], 16), int(f[4], 16)))

    def offset(vaddr):
        for off, start, size in loads:
            if start <= vaddr < start + size:
                return vaddr - start + off
        return None
    return offset


def text_start(binary):
    out = subprocess.run(["readelf", "-SW", binary], check=True, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        f = line.replace("[ ", "[").split()
        if len(f) > 3 and f[1] == ".text":
            return int(f[3], 16)
    sys.exit(f"hot-functions: {binary} has no .text section")


def read_list(path):
    with open(path) as fh:
        return [l.split("#")[0].strip() for l in fh if l.split("#")[0].strip()]


def check(binary):
    """How much of the list `binary` has, and how many pages those functions span from
    the start of `.text`: about their total size when the linker took the list."""
    listed = read_list(LIST)
    by_name = {name: (addr, size) for addr, size, name in functions(binary)}
    present = [by_name[n] for n in listed if n in by_name]
    if not present:
        sys.exit(f"hot-functions: {binary} has none of the {len(listed)} functions of "
                 f"{LIST} (a stripped binary has no names to find): make the list again "
                 "(scripts/hot-functions.py, as root)")
    start = text_start(binary)
    end = max(a + s for a, s in present)
    size = sum(s for _, s in present)
    span = -(-(end - (start & ~(PAGE - 1))) // PAGE)
    need = -(-size * 21 // 20 // PAGE) + 2  # and the functions' alignment
    print(f"hot functions: {len(present)} of the {len(listed)} listed are in {binary}; "
          f"{size // 1024} KiB of code in the first {span} pages of .text")
    if span > need:
        sys.exit(f"hot-functions: they are not laid out together (they would fit in {need} "
                 "pages): the linker did not take the list. build.rs warns why (no rust-lld "
                 "in the toolchain, a linker chosen in RUSTFLAGS or the cargo config, a comma "
                 "in the path), unless HATCHERY_NO_FUNCTION_ORDER was set at build time")
    if len(present) < MIN_PRESENT * len(listed):
        sys.exit(f"hot-functions: fewer than {MIN_PRESENT:.0%} of the list is left: a "
                 "toolchain, Cargo.lock or feature change, or a build with --target, renames "
                 "the crates' functions. Make it again (scripts/hot-functions.py, as root, "
                 "on `cargo build --release`), or check the build the list is made for")


INSTANCE = os.path.join(TRACEFS, "instances", "hatchery-hot")
# The signals that stop the list maker (after its clean-up).
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def write(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def our_probes():
    """The probes of GROUP in uprobe_events: this script's, from this run or one cut short."""
    with open(os.path.join(TRACEFS, "uprobe_events")) as fh:
        # Each line: "p:GROUP/NAME PATH:OFFSET".
        names = [l.split(maxsplit=1)[0].partition(":")[2] for l in fh if l.strip()]
    return [n for n in names if n.startswith(GROUP + "/")]


def clean_up():
    """Takes away this script's instance and probes, whatever state a run left them in
    (another user's probes and instances are not touched). Signals that would end the
    script are held off meanwhile: an instance left tracing would trap every start of the
    binary until the probes go. Disabling the probes is the slow part: each waits for a
    grace period, a few minutes for all of them. Returns the signals that came meanwhile:
    the caller stops once it is done."""
    stopped = []
    held = {sig: signal.signal(sig, lambda sig, _: stopped.append(sig))
            for sig in STOPPING}
    try:
        enable = os.path.join(INSTANCE, "events", GROUP, "enable")
        if os.path.exists(enable):
            print("hot-functions: disabling the probes (a few minutes)", file=sys.stderr)
            with open(enable, "w") as fh:
                fh.write("0")
        if os.path.isdir(INSTANCE):
            os.rmdir(INSTANCE)
        for probe in our_probes():
            write(os.path.join(TRACEFS, "uprobe_events"), f"-:{probe}\n")
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
    return stopped


def record(binary):
    """Every function of `binary` the STARTS run, in first-hit order."""
    if os.geteuid() != 0:
        sys.exit("hot-functions: making the list needs root (uprobes)")
    if not os.path.isdir(os.path.join(TRACEFS, "instances")):
        sys.exit(f"hot-functions: no tracefs at {TRACEFS} (mount -t tracefs nodev {TRACEFS})")
    binary = os.path.realpath(binary)
    if any(c.isspace() for c in binary):
        sys.exit(f"hot-functions: {binary!r}: uprobe_events takes no whitespace in a path; "
                 "build in a directory whose path has none")
    offset = file_offset(binary)
    names = {}
    probes = []
    for i, (addr, _, name) in enumerate(functions(binary)):
        off = offset(addr)
        if off is not None:
            names[f"f{i}"] = name
            probes.append(f"p:{GROUP}/f{i} {binary}:{off:#x}\n")
    # A TERM or a HUP ends the script the way ^C does, through the clean-up below.
    for sig in STOPPING:
        signal.signal(sig, signal.default_int_handler)
    if clean_up():  # what a run cut short may have left
        raise KeyboardInterrupt
    order, seen = [], set()
    try:
        os.mkdir(INSTANCE)
        for p in probes:
            write(os.path.join(TRACEFS, "uprobe_events"), p)
        with open(os.path.join(INSTANCE, "buffer_size_kb"), "w") as fh:
            fh.write("65536")
        with open(os.path.join(INSTANCE, "events", GROUP, "enable"), "w") as fh:
            fh.write("1")
        hit = re.compile(r" (f\d+): \(")
        for prefix, args in STARTS:
            with open(os.path.join(INSTANCE, "trace"), "w") as fh:
                fh.write("")
            r = subprocess.run(prefix + [binary] + args, stdout=subprocess.DEVNULL,
                               timeout=60)
            if r.returncode not in (0, 3):
                sys.exit(f"hot-functions: {' '.join(args)} exited {r.returncode}")
            with open(os.path.join(INSTANCE, "trace")) as fh:
                for line in fh:
                    m = hit.search(line)
                    if m and m.group(1) not in seen:
                        seen.add(m.group(1))
                        order.append(names[m.group(1)])
    finally:
        # An error on the way keeps its own message: the clean-up only notes the signals.
        stopped = clean_up()
    if stopped:
        raise KeyboardInterrupt
    return order


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("binary", nargs="?", default=os.path.join(ROOT, "target/release/hatchery"))
    a = ap.parse_args()
    if a.check:
        return check(a.binary)
    try:
        order = record(a.binary)
    except KeyboardInterrupt:
        sys.exit("hot-functions: stopped; the probes are gone and nothing was written")
    with open(LIST, "w") as fh:
        fh.write("# The functions a start runs, in first-run order: the release build lays them\n"
                 "# out together (build.rs). Made by scripts/hot-functions.py; make it again\n"
                 "# after a toolchain or Cargo.lock change.\n")
        fh.writelines(name + "\n" for name in order)
    print(f"hot-functions: {len(order)} functions written to {LIST}")


if __name__ == "__main__":
    main()
