#!/usr/bin/env python3
"""Cluster benchmarks (numbers, not verdicts), with an etcd this script starts on loopback:

1. admissions per second: three controllers sharing one etcd, a client per node starting
   short workers back to back (each an etcd transaction, then a sandbox), against one
   controller deciding in memory, with the same three clients, in the same run;
2. the cluster kill switch: N workers spread over the three nodes, then
   `kill-switch --cluster` through one node, timed until every live node has acknowledged
   (each after its own workers are gone), checked independently afterwards; repeated.

Run as root: scripts/bench-cluster.sh [-n 300] [--rounds 3] [--spawns 150]
"""
import argparse, importlib.util, json, os, shutil, socket, statistics, subprocess, sys, tempfile, threading, time

here = os.path.dirname(os.path.realpath(__file__))
spec = importlib.util.spec_from_file_location("bench_controller", os.path.join(here, "bench-controller.py"))
bc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bc)
Api, worker_cgroups = bc.Api, bc.worker_cgroups


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_etcd(tmp):
    client, peer = free_port(), free_port()
    log = open(os.path.join(tmp, "etcd.log"), "w")
    p = subprocess.Popen(["etcd", "--name", "bench", "--data-dir", os.path.join(tmp, "etcd"),
                          "--listen-client-urls", f"http://127.0.0.1:{client}",
                          "--advertise-client-urls", f"http://127.0.0.1:{client}",
                          "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                          "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                          "--initial-cluster", f"bench=http://127.0.0.1:{peer}",
                          "--logger", "zap", "--log-outputs", "stderr", "--log-level", "error"],
                         stdout=log, stderr=log)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", client), timeout=0.2).close()
            return p, f"127.0.0.1:{client}"
        except OSError:
            time.sleep(0.1)
    sys.exit("etcd did not start (see etcd.log)")


def start_controller(hatchery, tmp, name, extra):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    sock = os.path.join(d, "c.sock")
    log = open(os.path.join(d, "controller.log"), "w")
    p = subprocess.Popen([hatchery, "controller", "--socket", sock, "--state-dir", os.path.join(d, "state"),
                          "--contract", os.path.join(tmp, "contract.toml")] + extra, stdout=log, stderr=log)
    for _ in range(200):
        if os.path.exists(sock):
            return p, sock
        time.sleep(0.05)
    sys.exit(f"controller {name} did not start: {open(os.path.join(d, 'controller.log')).read()}")


def request(cmd):
    return {"resources": {"cpu_limit": 0.05, "memory_limit_mb": 32, "pids_limit": 8, "timeout_ms": 3600000,
                          "network_policy": {"allow_controller": False, "allow_external": False}},
            "filesystem": {"read_only": [], "read_write": []}, "profile": "default",
            "command": cmd, "env": [], "cwd": None, "state_snapshot": ""}


def spawn_rate(socks, n_each):
    """Starts n_each short workers through each socket at once; admissions per second."""
    errors = []

    def client(sock):
        api = Api(sock)
        for _ in range(n_each):
            r = api.call({"op": "spawn", "parent": None, "request": request(["/bin/true"])})
            if r.get("result") != "spawned":
                errors.append(r)
                return

    threads = [threading.Thread(target=client, args=(s,)) for s in socks]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    if errors:
        sys.exit(f"a spawn failed: {errors[0]}")
    return n_each * len(socks) / elapsed


def kill_switch_round(socks, n):
    per = n // len(socks)
    for s in socks:
        api = Api(s)
        for i in range(per):
            r = api.call({"op": "spawn", "parent": None, "request": request(["/bin/sleep", "3600"])})
            if r.get("result") != "spawned":
                sys.exit(f"spawn {i} failed: {r}")
    t0 = time.monotonic()
    r = Api(socks[0]).call({"op": "kill_switch", "release": False, "cluster": True})
    wall_ms = (time.monotonic() - t0) * 1000
    if r.get("result") != "cluster_kill_switch" or r.get("missing"):
        sys.exit(f"kill switch: {r}")
    left = worker_cgroups()
    pids = subprocess.run(["pgrep", "-f", "^/bin/sleep 3600"], capture_output=True, text=True).stdout.split()
    if left or pids:
        sys.exit(f"after the kill switch: {left} cgroups and {len(pids)} processes remain")
    Api(socks[0]).call({"op": "kill_switch", "release": True, "cluster": True})
    time.sleep(0.5)
    return wall_ms, r["elapsed_ms"], r["killed"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hatchery", required=True)
    ap.add_argument("-n", type=int, default=300, help="workers for the kill switch, over three nodes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spawns", type=int, default=150, help="short workers per rate run, over three clients")
    a = ap.parse_args()
    if shutil.which("etcd") is None:
        sys.exit("bench-cluster: etcd is not installed (apt-get install etcd-server)")
    tmp = tempfile.mkdtemp(prefix="hatchery-bench-")
    with open(os.path.join(tmp, "contract.toml"), "w") as f:
        f.write(f"max_depth = 3\nmax_replicas = {a.n + 10}\ncooldown_seconds = 0\nexpiration_seconds = 3600\n")
    procs = []
    try:
        etcd, endpoint = start_etcd(tmp)
        procs.append(etcd)
        nodes = []
        for name in ["node-a", "node-b", "node-c"]:
            p, s = start_controller(a.hatchery, tmp, name, ["--cluster", f"etcd://{endpoint}", "--node-id", name])
            procs.append(p)
            nodes.append(s)
        p, single = start_controller(a.hatchery, tmp, "single", [])
        procs.append(p)
        each = max(1, a.spawns // 3)
        rates = {"etcd": [], "memory": []}
        for _ in range(a.rounds):
            rates["etcd"].append(spawn_rate(nodes, each))
            rates["memory"].append(spawn_rate([single] * 3, each))
        m_etcd, m_mem = statistics.median(rates["etcd"]), statistics.median(rates["memory"])
        print(f"admissions: {m_etcd:.0f}/s through etcd (three nodes) vs {m_mem:.0f}/s in memory (one node), "
              f"ratio {m_etcd / m_mem:.2f}  [medians of {a.rounds}, {each * 3} short workers each]")
        walls, acks = [], []
        for _ in range(a.rounds):
            wall, ack, killed = kill_switch_round(nodes, a.n)
            walls.append(wall)
            acks.append(ack)
        print(f"cluster kill switch, {killed} workers over 3 nodes: median {statistics.median(walls):.0f} ms to the "
              f"last acknowledgement (min {min(walls):.0f}, max {max(walls):.0f}; as the command reports it: "
              f"{statistics.median(acks):.0f} ms)  [{a.rounds} rounds]")
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
