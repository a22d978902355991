#!/usr/bin/env bash
# The main job: builds hatchery and shows, with real sandboxes, what the kernel enforces.
# Runs unattended; as root for the full picture (cgroup limits), rootless otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" = 0 ] && [ "${HATCHERY_SKIP_APT:-0}" != 1 ]; then
    export DEBIAN_FRONTEND=noninteractive
    if ! dpkg -s libseccomp-dev pkg-config >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq --no-install-recommends libseccomp-dev pkg-config gcc libc6-dev >/dev/null
    fi
fi
cargo build --release --locked --quiet
H=$PWD/target/release/hatchery
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "$2"; }
show() {
    local d=$1; shift
    step "$d" "$(printf '%q ' "$@" | sed "s#$H#hatchery#g")"
    set +e; "$@"; local rc=$?; set -e
    echo "(exit $rc)"
}

show "What this host can enforce" "$H" doctor
show "A command in its own namespaces: not root on the host, its own hostname, nothing of the host but /usr and /etc" \
    "$H" run -- sh -c 'id; hostname; cat /proc/self/uid_map; ls /; ls /home /root 2>&1 | head -2'
show "No network: only loopback, nothing reachable" \
    "$H" run -- sh -c 'cat /proc/net/dev | tail -n +3 | cut -d: -f1; (exec 3<>/dev/tcp/127.0.0.1/22) 2>&1 || echo "connect refused"'
show "No privileges: no capabilities, no_new_privs, a seccomp filter; mount and unshare fail" \
    "$H" run -- sh -c 'grep -E "^(Cap(Eff|Bnd)|NoNewPrivs|Seccomp):" /proc/self/status; unshare -r true 2>&1; mount -t tmpfs x /tmp 2>&1'
if [ "$(id -u)" = 0 ]; then
    show "A memory bomb under --memory 64M is OOM-killed (exit 137)" \
        "$H" run --memory 64M -- python3 -c 'b = [bytearray(1 << 20) for _ in range(512)]'
    show "A fork bomb under --pids 32 cannot grow" \
        "$H" run --pids 32 --timeout 20s -- python3 -c '
import os, time
n = 0
try:
    while n < 300:
        if os.fork() == 0:
            time.sleep(2); os._exit(0)
        n += 1
except OSError as e:
    print("fork refused after", n, "children:", e)'
    tmp=$(mktemp -d); chmod 755 "$tmp"
    show "--cpus 0.5 for 2 s of spinning, with a report" \
        "$H" run --cpus 0.5 --report "$tmp/report.json" -- sh -c 'end=$(($(date +%s)+2)); while [ $(date +%s) -lt $end ]; do :; done'
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("wall_ms", r["wall_ms"], "cpu_usec", r["cpu_usec"], "-> %.2f cores" % (r["cpu_usec"]/1000/r["wall_ms"])); print("enforced:", json.dumps(r["enforcement"]["limits"], indent=1))' "$tmp/report.json"
    rm -rf "$tmp"
else
    show "Rootless without a delegated cgroup: a limit is refused (fail closed)" "$H" run --memory 64M -- true
fi
show "A timeout kills everything, daemons included (exit 124)" \
    "$H" run --timeout 1s -- sh -c 'setsid sleep 600 & sleep 600'
echo
echo "demo finished: nothing is left behind ($(scripts/check-leftovers.sh | tail -1))"
