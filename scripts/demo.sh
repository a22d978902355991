#!/usr/bin/env bash
# The main job, on built-in defaults: a controller whose workers replicate until the
# replication contract says no, the lineage, the denials in the audit trail, the kill
# switch (every process and cgroup gone), and the audit trail verified. Preceded by a few
# one-shot sandboxes that show what the kernel enforces. Runs unattended, as root.
#
#   scripts/demo.sh              everything
#   scripts/demo.sh --run-only   just the one-shot sandboxes
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" != 0 ]; then
    echo "demo.sh: run as root (the controller's default paths are /run/hatchery and /var/lib/hatchery)" >&2
    exit 1
fi
if [ "${HATCHERY_SKIP_APT:-0}" != 1 ] && ! dpkg -s libseccomp-dev pkg-config gcc libc6-dev >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends libseccomp-dev pkg-config gcc libc6-dev python3 >/dev/null
fi
cargo build --release --locked --quiet
H=$PWD/target/release/hatchery
bold() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
say() { printf '$ %s\n' "$*"; }
show() { local d=$1; shift; bold "$d"; say "$(printf '%q ' "$@" | sed "s#$H#hatchery#g")"; set +e; "$@"; local rc=$?; set -e; echo "(exit $rc)"; }

# ---------------------------------------------------------------------- one-shot sandboxes
show "A command in its own namespaces: not root on the host, nothing of the host but /usr and /etc, no network" \
    "$H" run -- sh -c 'id; hostname; cat /proc/self/uid_map; ls /; tail -n +3 /proc/net/dev | cut -d: -f1'
show "No privileges: no capabilities, no_new_privs, a seccomp filter; unshare and mount fail" \
    "$H" run -- sh -c 'grep -E "^(CapEff|CapBnd|NoNewPrivs|Seccomp):" /proc/self/status; unshare -r true 2>&1; mount -t tmpfs x /tmp 2>&1 | head -1'
show "A memory bomb under --memory 64M is OOM-killed (exit 137)" \
    "$H" run --memory 64M -- python3 -c 'b = [bytearray(1 << 20) for _ in range(512)]'
show "A timeout kills everything, daemons included (exit 124)" \
    "$H" run --timeout 1s -- sh -c 'setsid sleep 600 & sleep 600'
[ "${1:-}" = --run-only ] && exit 0

# ---------------------------------------------------------------------- the controller
SOCK=/run/hatchery/controller.sock
LOG=$(mktemp /tmp/hatchery-demo-controller.XXXXXX)
bold "The controller, on built-in defaults (contract: max_depth 3, max_replicas 8, cooldown 5 s)"
say "hatchery controller &"
"$H" controller >"$LOG" 2>&1 &
CTL=$!
stop_controller() {
    if kill -0 "$CTL" 2>/dev/null; then
        kill -TERM "$CTL" 2>/dev/null || true
        wait "$CTL" 2>/dev/null || true
    fi
    rm -f "$LOG"
}
trap stop_controller EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
"$H" ps >/dev/null

# Every worker: register, ask for a child running this same script, ask for a second one
# at once (the cooldown says no), then stay alive with heartbeats.
WORKER='hatchery agent register >/dev/null || exit 1
hatchery agent replicate --reason "one more generation" -- sh -c "$S"
hatchery agent replicate --reason "and a sibling, right away" -- sh -c "$S"
while hatchery agent heartbeat >/dev/null; do sleep 1; done'
show "A root worker that replicates until the contract denies it" \
    "$H" spawn --memory 128M --cpus 0.25 --pids 32 --env "S=$WORKER" -- sh -c 'eval "$S"'
sleep 4
show "More root workers, until the quota (max_replicas 8) refuses one" \
    sh -c "for i in 1 2 3 4 5; do $H spawn --memory 64M --cpus 0.1 -- sh -c 'hatchery agent register >/dev/null; while hatchery agent heartbeat >/dev/null; do sleep 1; done' || break; done"
sleep 1
show "The lineage, with live usage from each worker's cgroup" "$H" ps --tree
# The trail persists across runs (in /var/lib/hatchery): show this run's, from its
# controller_started entry on.
bold "Every denial of this run, from the audit trail"
say "hatchery audit tail -n 500 | (since the last controller_started) | grep -E 'deny_|kill_switch'"
"$H" audit tail -n 500 | awk '/controller_started/ { run = "" } { run = run $0 "\n" } END { printf "%s", run }' |
    grep -E 'deny_|kill_switch' || true
show "The kill switch: every worker, whole sandboxes and cgroups" "$H" kill-switch
show "Nothing is left: no worker process, no worker cgroup" \
    sh -c "pgrep -a -f '[h]atchery agent|[s]h -c eval' || echo 'no worker processes'; find /sys/fs/cgroup -name 'hatchery-w-*' | head -3; echo \"worker cgroups: \$(find /sys/fs/cgroup -name 'hatchery-w-*' | wc -l)\""
show "New workers are refused while the switch is engaged" "$H" spawn -- true
show "Released, they may start again" "$H" kill-switch --release
stop_controller
trap - EXIT
show "The audit trail is intact (hash chain, MACs and head)" "$H" audit verify
show "Its last entries" "$H" audit tail -n 8
echo
echo "demo finished: $(scripts/check-leftovers.sh | tail -1)"
