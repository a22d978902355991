#!/usr/bin/env python3
"""Start-up cost of one sandbox: `hatchery run -- /bin/true` against bubblewrap's
equivalent, run alternately in the same session so both see the same machine state.
Prints the median (and p10/p90) wall time of each and their ratio. No assertions:
numbers, not verdicts."""
import argparse, os, statistics, subprocess, sys, time

def bwrap_cmd():
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = "/" + name
        if os.path.islink(p):
            argv += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            argv += ["--ro-bind", p, p]
    return argv + ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/true"]

def timed(argv):
    t = time.perf_counter_ns()
    r = subprocess.run(argv, stdin=subprocess.DEVNULL)
    dt = (time.perf_counter_ns() - t) / 1e6
    if r.returncode != 0:
        sys.exit(f"bench: {argv[0]} exited {r.returncode}")
    return dt

def q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))]

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hatchery", required=True)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--pause-ms", type=float, default=0, help="idle time before each sample")
    ap.add_argument("--extra", default="", help="extra hatchery run flags, space separated")
    a = ap.parse_args()
    hatchery = [a.hatchery, "run"] + a.extra.split() + ["--", "/bin/true"]
    variants = {"hatchery": hatchery, "bwrap": bwrap_cmd(), "plain": ["/bin/true"]}
    samples = {k: [] for k in variants}
    for k, argv in variants.items():  # warm caches
        for _ in range(5):
            timed(argv)
    for _ in range(a.n):
        for k, argv in variants.items():
            if a.pause_ms:
                time.sleep(a.pause_ms / 1000)
            samples[k].append(timed(argv))
    print(f"{'variant':<10} {'median ms':>10} {'p10':>8} {'p90':>8}   (n={a.n}, pause {a.pause_ms} ms)")
    for k, xs in samples.items():
        print(f"{k:<10} {statistics.median(xs):>10.2f} {q(xs, .1):>8.2f} {q(xs, .9):>8.2f}")
    r = statistics.median(samples["hatchery"]) / statistics.median(samples["bwrap"])
    print(f"ratio hatchery/bwrap (median): {r:.2f}")

if __name__ == "__main__":
    main()
