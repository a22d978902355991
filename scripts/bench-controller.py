#!/usr/bin/env python3
"""Controller benchmarks (numbers, not verdicts):

1. spawn rate: N workers requested through the API as fast as the controller answers,
   timed until the launcher has started every one (each in its own sandbox and cgroup);
2. N idle workers heartbeating every second: the controller's CPU share and RSS over a
   window (and the launcher's, for completeness);
3. kill-switch latency: from the request until the controller confirms that every sandbox
   is gone (processes and cgroups), checked independently afterwards.

Run as root: scripts/bench-controller.sh [-n 1000] [--window 30]
"""
import argparse, json, os, shutil, signal, socket, struct, subprocess, sys, tempfile, time

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

def worker_cgroups():
    n = 0
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        for d in dirs:
            if d.startswith("hatchery-w-"):
                n += 1
        if root.count("/") > 7:
            dirs[:] = []
    return n

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hatchery", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--window", type=int, default=30)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hatchery-bench-")
    sock = os.path.join(tmp, "c.sock")
    with open(os.path.join(tmp, "contract.toml"), "w") as f:
        f.write(f"max_depth = 3\nmax_replicas = {a.n + 10}\ncooldown_seconds = 0\nexpiration_seconds = 3600\n")
    log = open(os.path.join(tmp, "controller.log"), "w")
    ctl = subprocess.Popen([a.hatchery, "controller", "--socket", sock, "--state-dir", os.path.join(tmp, "state"),
                            "--contract", os.path.join(tmp, "contract.toml"), "--heartbeat-timeout", "20s",
                            "--register-timeout", "120s"], stdout=log, stderr=log)
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
        t0 = time.monotonic()
        for i in range(a.n):
            r = api.call({"op": "spawn", "parent": None, "request": request})
            if r.get("result") != "spawned":
                sys.exit(f"spawn {i} failed: {r}")
        t_requested = time.monotonic() - t0
        while True:
            ws = api.call({"op": "ps"})["workers"]
            started = sum(1 for w in ws if w["pid"] is not None)
            if started >= a.n:
                break
            if time.monotonic() - t0 > 600:
                sys.exit(f"only {started} of {a.n} started after 600 s")
            time.sleep(0.05)
        t_started = time.monotonic() - t0
        while True:
            ws = api.call({"op": "ps"})["workers"]
            running = sum(1 for w in ws if w["state"] == "running")
            if running >= a.n:
                break
            if time.monotonic() - t0 > 900:
                sys.exit(f"only {running} of {a.n} registered")
            time.sleep(0.2)
        t_running = time.monotonic() - t0
        print(f"workers: {a.n}")
        print(f"spawn: all requested in {t_requested:.2f} s, all started in {t_started:.2f} s "
              f"-> {a.n / t_started:.0f} workers/s; all registered in {t_running:.2f} s")

        launcher = children(ctl.pid)
        hz = os.sysconf("SC_CLK_TCK")
        time.sleep(2)
        c0, l0, w0 = cpu_ticks(ctl.pid), sum(cpu_ticks(p) for p in launcher), time.monotonic()
        time.sleep(a.window)
        c1, l1, w1 = cpu_ticks(ctl.pid), sum(cpu_ticks(p) for p in launcher), time.monotonic()
        ws = api.call({"op": "ps"})["workers"]
        alive = sum(1 for w in ws if w["state"] == "running")
        print(f"idle, {alive} workers heartbeating every 1 s, {a.window} s window:")
        print(f"  controller: {100 * (c1 - c0) / hz / (w1 - w0):.1f}% of a core, RSS {rss_kib(ctl.pid) / 1024:.1f} MiB")
        print(f"  launcher:   {100 * (l1 - l0) / hz / (w1 - w0):.1f}% of a core, RSS "
              f"{sum(rss_kib(p) for p in launcher) / 1024:.1f} MiB")

        t = time.monotonic()
        r = api.call({"op": "kill_switch", "release": False})
        dt = time.monotonic() - t
        left_cg = worker_cgroups()
        left_ps = subprocess.run(["pgrep", "-f", "agent-idle"], capture_output=True, text=True).stdout.split()
        print(f"kill switch: {r.get('killed')} workers, confirmed after {dt * 1000:.0f} ms "
              f"(controller's own measure {r.get('elapsed_ms')} ms); afterwards {len(left_ps)} processes, "
              f"{left_cg} worker cgroups left")
    finally:
        ctl.send_signal(signal.SIGTERM)
        try:
            ctl.wait(timeout=60)
        except subprocess.TimeoutExpired:
            ctl.kill()
        shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    main()
