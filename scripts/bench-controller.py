#!/usr/bin/env python3
"""Controller benchmarks (numbers, not verdicts):

1. spawn rate: N workers requested through the API from CLIENTS connections at once, timed
   from the first request until every worker's command runs (it has registered with the
   controller), each in its own sandbox and cgroup with seccomp and Landlock; against
   bubblewrap (--unshare-all) starting N long-lived sandboxes from CLIENTS lanes, each
   lane starting the next once its sandbox's command runs (it writes a byte). Alternated
   over ROUNDS rounds; medians and the ratio, of the rate and of the CPU the whole machine
   spent per start (every process, the kernel's work included). The audit trail is on the state directory's
   filesystem (pass --state-dir to put it on another disk): every decision is durable
   before it is answered or carried out;
2. N idle workers heartbeating every second: the controller's CPU share and RSS over a
   window (and the launcher's, for completeness);
3. kill-switch latency: from the request until the controller confirms that every sandbox
   is gone (processes and cgroups), checked independently afterwards.

With --warm-pool N the controller keeps N sandboxes prepared: before each round one worker
of the benchmark's kind starts (the pool prepares that kind) and is killed, and the round
begins once the pool is full; filling it is not timed (it happens while the launcher is
idle), and bubblewrap's rounds start only after the pool is torn down or full again.

Run as root: scripts/bench-controller.sh [-n 1000] [--clients 8] [--rounds 3] [--window 30] [--warm-pool N]
"""
import argparse, json, os, shutil, signal, socket, statistics, struct, subprocess, sys, tempfile, threading, time

from bench import bwrap_sandbox

def frame(obj):
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body

class Api:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
    def call(self, obj):
        self.s.sendall(frame(obj))
        n = struct.unpack(">I", self._read(4))[0]
        return json.loads(self._read(n))
    def _read(self, n):
        b = b""
        while len(b) < n:
            c = self.s.recv(n - len(b))
            if not c:
                raise RuntimeError("controller closed the connection")
            b += c
        return b

def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])

def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0

def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []

def cgroup_dirs(prefix):
    """Cgroup directories whose names start with PREFIX, over every hierarchy."""
    found = []
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        found += [os.path.join(root, d) for d in dirs if d.startswith(prefix)]
        if root.count("/") > 7:
            dirs[:] = []
    return found

def worker_cgroups():
    return len(cgroup_dirs("hatchery-w-"))

def prepared_sandboxes():
    """Prepared sandboxes waiting in the pool: cgroups of the pool's naming that hold one
    process, pid 1 (a claimed worker's holds its payload too)."""
    one_each = {}
    for d in cgroup_dirs("hatchery-_warm"):
        one_each.setdefault(os.path.basename(d), d)
    n = 0
    for d in one_each.values():
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                n += len(f.read().split()) == 1
        except OSError:
            pass
    return n

def prime_pool(sock, request, size):
    """Starts one worker of the benchmark's kind (the warm pool prepares the last started
    worker's kind), kills it, and waits until SIZE sandboxes are prepared."""
    api = Api(sock)
    r = api.call({"op": "spawn", "parent": None, "request": request})
    if r.get("result") != "spawned":
        sys.exit(f"the priming spawn failed: {r}")
    t0 = time.monotonic()
    while api.call({"op": "status"}).get("running", 0) < 1:
        if time.monotonic() - t0 > 60:
            sys.exit("the priming worker did not start in 60 s")
        time.sleep(0.01)
    api.call({"op": "kill", "worker_id": r["worker_id"], "recursive": False})
    while time.monotonic() - t0 < 600:
        st = api.call({"op": "status"})
        if st.get("running", 1) == 0 and prepared_sandboxes() >= size:
            return time.monotonic() - t0
        time.sleep(0.05)
    sys.exit(f"the warm pool did not fill to {size} in 600 s")

def bwrap_argv():
    return bwrap_sandbox() + ["/bin/sh", "-c", "echo; exec sleep 3600"]

def in_lanes(n, lanes, work):
    """Runs work(count) in LANES threads sharing N between them; seconds until all end."""
    shares = [n // lanes + (1 if i < n % lanes else 0) for i in range(lanes)]
    threads = [threading.Thread(target=work, args=(c,)) for c in shares if c]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0

def busy_ms():
    """CPU time the whole machine spent busy so far (every process and the kernel), in ms."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) * 1000 / os.sysconf("SC_CLK_TCK")

def spawn_hatchery(sock, n, clients, request):
    """N spawns from CLIENTS connections; seconds until all were answered and until every
    worker's command runs, and the median answer latency (ms)."""
    status = Api(sock)
    lat, errors = [], []
    def client(count):
        api = Api(sock)
        for _ in range(count):
            t = time.monotonic()
            r = api.call({"op": "spawn", "parent": None, "request": request})
            lat.append((time.monotonic() - t) * 1000)
            if r.get("result") != "spawned":
                errors.append(r)
                return
    t0 = time.monotonic()
    answered = in_lanes(n, clients, client)
    if errors:
        sys.exit(f"a spawn failed: {errors[0]}")
    while True:
        st = status.call({"op": "status"})
        if "running" not in st:
            sys.exit(f"the controller's status has no running count: {st}")
        if st["running"] >= n:
            break
        if time.monotonic() - t0 > 600:
            sys.exit(f"only {st.get('running')} of {n} running after 600 s")
        time.sleep(0.005)
    return answered, time.monotonic() - t0, statistics.median(lat)

def spawn_bwrap(n, lanes):
    """N bubblewrap sandboxes from LANES lanes, each starting the next once its sandbox's
    command runs; seconds until all run, and their pids (to stop them)."""
    argv, pids, lock = bwrap_argv(), [], threading.Lock()
    def lane(count):
        for _ in range(count):
            r, w = os.pipe()
            pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
            os.close(w)
            with lock:
                pids.append(pid)
            got = os.read(r, 1)
            os.close(r)
            if not got:
                sys.exit("a bubblewrap sandbox ended before its command ran")
    return in_lanes(n, lanes, lane), pids

def stop_bwrap(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hatchery", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=int, default=30)
    ap.add_argument("--state-dir", help="where the controller keeps its audit trail (default: a temporary directory)")
    ap.add_argument("--warm-pool", type=int, default=0,
                    help="run the controller with --warm-pool N, filled before each round (default 0: none)")
    a = ap.parse_args()
    if shutil.which("bwrap") is None:
        sys.exit("bench-controller: bubblewrap (bwrap) is needed for the peer: apt-get install bubblewrap")
    tmp = tempfile.mkdtemp(prefix="hatchery-bench-")
    sock = os.path.join(tmp, "c.sock")
    # A directory of its own: a trail begun for this run only.
    state = tempfile.mkdtemp(prefix="hatchery-bench-state-", dir=a.state_dir) if a.state_dir else os.path.join(tmp, "state")
    with open(os.path.join(tmp, "contract.toml"), "w") as f:
        f.write(f"max_depth = 3\nmax_replicas = {a.n + 10}\ncooldown_seconds = 0\nexpiration_seconds = 3600\n")
    log = open(os.path.join(tmp, "controller.log"), "w")
    ctl = subprocess.Popen([a.hatchery, "controller", "--socket", sock, "--state-dir", state,
                            "--contract", os.path.join(tmp, "contract.toml"), "--heartbeat-timeout", "20s",
                            "--register-timeout", "120s", "--warm-pool", str(a.warm_pool)],
                           stdout=log, stderr=log)
    bwrap_pids = []
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        api = Api(sock)
        probe_dir = os.path.dirname(os.path.realpath(a.probe))
        request = {"resources": {"cpu_limit": 0.05, "memory_limit_mb": 32, "pids_limit": 8, "timeout_ms": 3600000,
                                 "network_policy": {"allow_controller": True, "allow_external": False}},
                   "filesystem": {"read_only": [probe_dir], "read_write": []}, "profile": "default",
                   "command": [os.path.realpath(a.probe), "agent-idle", "3600"], "env": [], "cwd": None,
                   "state_snapshot": ""}
        print(f"workers: {a.n}, clients: {a.clients}, rounds: {a.rounds}, warm pool: {a.warm_pool}")
        h_rates, b_rates, answers, lats, kills, h_cpu, b_cpu = [], [], [], [], [], [], []

        def bwrap_round(number):
            nonlocal bwrap_pids
            c0 = busy_ms()
            took, bwrap_pids = spawn_bwrap(a.n, a.clients)
            b_cpu.append((busy_ms() - c0) / a.n)
            b_rates.append(a.n / took)
            print(f"  round {number}: bwrap all running in {took:.2f} s -> {a.n / took:.0f} sandboxes/s, "
                  f"{b_cpu[-1]:.1f} ms CPU each", flush=True)
            stop_bwrap(bwrap_pids)
            bwrap_pids = []
        for rnd in range(a.rounds):
            if a.warm_pool:
                # Prepared while the launcher is idle, before the requests: not timed.
                filled = prime_pool(sock, request, a.warm_pool)
                print(f"  round {rnd + 1}: warm pool of {a.warm_pool} filled in {filled:.2f} s (not timed)", flush=True)
            c0 = busy_ms()
            answered, running, lat = spawn_hatchery(sock, a.n, a.clients, request)
            h_cpu.append((busy_ms() - c0) / a.n)
            h_rates.append(a.n / running)
            answers.append(answered)
            lats.append(lat)
            print(f"  round {rnd + 1}: hatchery all answered in {answered:.2f} s (median answer {lat:.1f} ms), "
                  f"all running in {running:.2f} s -> {a.n / running:.0f} workers/s, {h_cpu[-1]:.1f} ms CPU each", flush=True)
            last = rnd == a.rounds - 1
            if last:
                break
            t = time.monotonic()
            r = api.call({"op": "kill_switch", "release": False})
            kills.append((time.monotonic() - t) * 1000)
            api.call({"op": "kill_switch", "release": True})
            # The launcher tears the prepared sandboxes down after the kill switch: the
            # peer's round starts once it has.
            while cgroup_dirs("hatchery-_warm"):
                time.sleep(0.01)
            bwrap_round(rnd + 1)
        if a.warm_pool:
            # The pool refills once the launcher is idle: the peer's last round, and the
            # idle measure, start once it has.
            t = time.monotonic()
            while prepared_sandboxes() < a.warm_pool:
                if time.monotonic() - t > 600:
                    sys.exit("the warm pool did not fill again in 600 s")
                time.sleep(0.05)
            print(f"  the warm pool filled again in {time.monotonic() - t:.1f} s after the last round (not timed)")
        if a.rounds > 1:
            bwrap_round(a.rounds)
        h, b = statistics.median(h_rates), statistics.median(b_rates) if b_rates else 0
        print(f"spawn (median of {a.rounds}): hatchery {h:.0f} workers/s from request to command running, "
              f"bwrap {b:.0f} sandboxes/s" + (f", ratio {h / b:.2f} (higher is faster)" if b else ""))
        hc, bc = statistics.median(h_cpu), statistics.median(b_cpu) if b_cpu else 0
        print(f"machine CPU per start (every process and the kernel, median): hatchery {hc:.1f} ms, "
              f"bwrap {bc:.1f} ms" + (f", ratio {hc / bc:.2f}" if bc else ""))

        launcher = children(ctl.pid)
        hz = os.sysconf("SC_CLK_TCK")
        time.sleep(2)
        c0, l0, w0 = cpu_ticks(ctl.pid), sum(cpu_ticks(p) for p in launcher), time.monotonic()
        time.sleep(a.window)
        c1, l1, w1 = cpu_ticks(ctl.pid), sum(cpu_ticks(p) for p in launcher), time.monotonic()
        # A fresh connection: the controller ends one idle for a minute (its
        # API_IDLE_TIMEOUT), and the rounds and the pool's refill may have taken longer.
        api = Api(sock)
        ws = api.call({"op": "ps"})["workers"]
        alive = sum(1 for w in ws if w["state"] == "running")
        print(f"idle, {alive} workers heartbeating every 1 s, {a.window} s window:")
        print(f"  controller: {100 * (c1 - c0) / hz / (w1 - w0):.1f}% of a core, RSS {rss_kib(ctl.pid) / 1024:.1f} MiB")
        print(f"  launcher:   {100 * (l1 - l0) / hz / (w1 - w0):.1f}% of a core, RSS "
              f"{sum(rss_kib(p) for p in launcher) / 1024:.1f} MiB")

        t = time.monotonic()
        r = api.call({"op": "kill_switch", "release": False})
        dt = time.monotonic() - t
        kills.append(dt * 1000)
        left_cg = worker_cgroups()
        left_ps = subprocess.run(["pgrep", "-f", "agent-idle"], capture_output=True, text=True).stdout.split()
        # The launcher tears the prepared sandboxes down once the workers are gone (claimed
        # workers' cgroups have the pool's naming too).
        while cgroup_dirs("hatchery-_warm") and time.monotonic() - t < 30:
            time.sleep(0.01)
        pool_gone, left_pool = time.monotonic() - t, len(cgroup_dirs("hatchery-_warm"))
        print(f"kill switch: {r.get('killed')} workers, confirmed after {dt * 1000:.0f} ms "
              f"(controller's own measure {r.get('elapsed_ms')} ms; median over rounds "
              f"{statistics.median(kills):.0f} ms); afterwards {len(left_ps)} processes, "
              f"{left_cg} worker cgroups left" + (f"; the pool's cgroups (prepared and claimed) gone after "
                                              f"{pool_gone * 1000:.0f} ms ({left_pool} left)" if a.warm_pool else ""))
    finally:
        stop_bwrap(bwrap_pids)
        ctl.send_signal(signal.SIGTERM)
        try:
            ctl.wait(timeout=60)
        except subprocess.TimeoutExpired:
            ctl.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        if a.state_dir:
            shutil.rmtree(state, ignore_errors=True)

if __name__ == "__main__":
    main()
