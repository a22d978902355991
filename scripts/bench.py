#!/usr/bin/env python3
"""Start-up cost of one sandbox: `hatchery run -- /bin/true` against bubblewrap's
equivalent, run alternately in the same session so both see the same machine state.

Prints, for each variant and as a hatchery/bubblewrap ratio:
  - the median (p10, p90) wall time of one start, until the started command exits;
  - the median CPU time of one start: user + system time of the whole process tree. This
    process is a child subreaper, so a descendant the started command leaves to run on
    (bubblewrap's parent exits without reaping its sandbox's pid 1) is reaped here and
    counted too (getrusage RUSAGE_CHILDREN before and after);
  - the rate of back-to-back starts with LANES loops running at once (starts per second;
    each loop starts the next as soon as the command exits, as a shell loop would);
  - as root, what making and removing a memory cgroup costs on this host (see
    cgroup_cost: it depends on the host's past, and hatchery pays it at every start).
No assertions: numbers, not verdicts."""
import argparse, ctypes, os, resource, statistics, subprocess, sys, time

PR_SET_CHILD_SUBREAPER = 36

DEFAULT_LIMITS = "--memory 256M --cpus 1 --pids 64"


def bwrap_sandbox():
    """bubblewrap's --unshare-all sandbox with read-only /usr and /etc, without a command."""
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = "/" + name
        if os.path.islink(p):
            argv += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            argv += ["--ro-bind", p, p]
    return argv + ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]


def bwrap_cmd():
    return bwrap_sandbox() + ["/bin/true"]


DEVNULL = os.open(os.devnull, os.O_RDWR)


def become_subreaper():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"bench: prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")


def reap_all(block):
    """Reaps whatever children are left (orphans re-parented here)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def start(argv):
    """Runs argv once; returns (wall ms until it exits, its exit status)."""
    t = time.perf_counter_ns()
    # Both tools get /dev/null for stdin, stdout and stderr, wherever this script's own
    # output goes (hatchery relays a terminal; bubblewrap passes it).
    pid = os.posix_spawnp(argv[0], argv, os.environ,
                          file_actions=[(os.POSIX_SPAWN_DUP2, DEVNULL, fd) for fd in (0, 1, 2)])
    _, status = os.waitpid(pid, 0)
    return (time.perf_counter_ns() - t) / 1e6, os.waitstatus_to_exitcode(status)


def timed(argv):
    """Runs argv once: (wall ms, CPU ms of its whole tree, orphans included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    dt, code = start(argv)
    reap_all(block=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        sys.exit(f"bench: {argv[0]} exited {code}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return dt, cpu * 1e3


def lane_worker(starts, argv):
    """One loop of the rate (a process of its own, so that it reaps its own orphans)."""
    become_subreaper()
    for _ in range(starts):
        _, code = start(argv)
        reap_all(block=False)
        if code != 0:
            sys.exit(f"bench: {argv[0]} exited {code}")
    reap_all(block=True)


def lanes_rate(argv, lanes, starts):
    """Starts per second with `lanes` loops each running `starts` starts back to back."""
    cmd = [sys.executable, os.path.abspath(__file__), "--lane-worker", str(starts), "--"] + argv
    t = time.perf_counter()
    procs = [subprocess.Popen(cmd) for _ in range(lanes)]
    for p in procs:
        if p.wait() != 0:
            sys.exit("bench: a lane failed")
    return lanes * starts / (time.perf_counter() - t)


def cgroup_cost(n=100):
    """Median time to make and remove a memory cgroup (and a pids cgroup, for scale), or
    None where this cannot be measured (not root, no such hierarchy).

    hatchery makes one per start and bubblewrap none. The kernel sizes a memory cgroup's
    shrinker map to the highest shrinker id in use since boot (one per mounted file system
    at the busiest moment, every sandbox's included), and walks it when the cgroup is made
    and taken offline: a host that once held thousands of mounts at the same time pays
    for it at every start until it reboots. Printed so that figures from two hosts, or
    two hours of one host, can be told apart."""
    base = "/sys/fs/cgroup"
    if os.geteuid() != 0:
        return None
    v1 = os.path.isdir(f"{base}/memory") and os.path.isdir(f"{base}/pids")
    if not v1 and not os.path.exists(f"{base}/cgroup.controllers"):
        return None
    out = {}
    for ctrl in ("memory", "pids") if v1 else ("all",):
        d = f"{base}/{ctrl}/bench-cgroup-probe-{os.getpid()}" if v1 \
            else f"{base}/bench-cgroup-probe-{os.getpid()}"
        times = []
        try:
            for _ in range(n):
                t = time.perf_counter_ns()
                os.mkdir(d)
                os.rmdir(d)
                times.append((time.perf_counter_ns() - t) / 1e6)
        except OSError:
            # Leave nothing behind: a probe made but not removed goes now.
            try:
                os.rmdir(d)
            except OSError:
                pass
            return None
        out[ctrl] = statistics.median(times)
    return out


def q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))]


def main():
    if len(sys.argv) > 3 and sys.argv[1] == "--lane-worker" and sys.argv[3] == "--":
        return lane_worker(int(sys.argv[2]), sys.argv[4:])
    become_subreaper()
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hatchery", required=True)
    ap.add_argument("-n", type=int, default=200, help="alternated single starts of each variant")
    ap.add_argument("--pause-ms", type=float, default=0, help="idle time before each sample")
    ap.add_argument("--extra", default="", help="extra hatchery run flags, space separated")
    ap.add_argument("--no-limits", action="store_true",
                    help=f"leave out the default limits ({DEFAULT_LIMITS})")
    ap.add_argument("--lanes", type=int, default=2, help="concurrent loops for the rate (0: skip)")
    ap.add_argument("--lane-starts", type=int, default=40, help="starts per loop in one round")
    ap.add_argument("--rounds", type=int, default=5, help="alternated rounds of the rate")
    a = ap.parse_args()
    limits = [] if a.no_limits else DEFAULT_LIMITS.split()
    hatchery = [a.hatchery, "run"] + limits + a.extra.split() + ["--", "/bin/true"]
    variants = {"hatchery": hatchery, "bwrap": bwrap_cmd(), "plain": ["/bin/true"]}
    wall = {k: [] for k in variants}
    cpu = {k: [] for k in variants}
    for k, argv in variants.items():  # warm caches
        for _ in range(5):
            timed(argv)
    for _ in range(a.n):
        for k, argv in variants.items():
            if a.pause_ms:
                time.sleep(a.pause_ms / 1000)
            w, c = timed(argv)
            wall[k].append(w)
            cpu[k].append(c)
    rate = {"hatchery": [], "bwrap": []}
    for _ in range(a.rounds if a.lanes > 0 else 0):
        for k in rate:
            rate[k].append(lanes_rate(variants[k], a.lanes, a.lane_starts))

    print(f"hatchery: {' '.join(hatchery[1:])}")
    print(f"{'variant':<10} {'wall ms':>8} {'p10':>7} {'p90':>7}   {'cpu ms':>7} {'p10':>6} {'p90':>6}"
          f"   (n={a.n}, pause {a.pause_ms} ms)")
    for k in variants:
        w, c = wall[k], cpu[k]
        print(f"{k:<10} {statistics.median(w):>8.2f} {q(w, .1):>7.2f} {q(w, .9):>7.2f}   "
              f"{statistics.median(c):>7.2f} {q(c, .1):>6.2f} {q(c, .9):>6.2f}")
    med = lambda d, k: statistics.median(d[k])
    print(f"ratio hatchery/bwrap (median): wall {med(wall, 'hatchery') / med(wall, 'bwrap'):.2f}"
          f", cpu {med(cpu, 'hatchery') / med(cpu, 'bwrap'):.2f}")
    # The same ratio taken pair by pair (each hatchery start against the bwrap start next
    # to it), which holds up better when the machine's speed drifts during the run.
    pairs = [h / b for h, b in zip(wall["hatchery"], wall["bwrap"]) if b > 0]
    print(f"ratio hatchery/bwrap (median of alternated pairs): wall {statistics.median(pairs):.2f}")
    cost = cgroup_cost()
    if cost and "memory" in cost:
        print(f"this host: a memory cgroup made and removed {cost['memory']:.2f} ms "
              f"(a pids cgroup {cost['pids']:.2f} ms; hatchery makes one of each per start)")
    elif cost:
        print(f"this host: a cgroup made and removed {cost['all']:.2f} ms "
              f"(with every controller of the root's subtree_control)")
    if rate["hatchery"]:
        h, b = med(rate, "hatchery"), med(rate, "bwrap")
        print(f"{a.lanes} lanes, {a.lane_starts} starts each, {a.rounds} alternated rounds: "
              f"hatchery {h:.0f}/s, bwrap {b:.0f}/s, ratio {h / b:.2f} (higher is faster)")


if __name__ == "__main__":
    main()
