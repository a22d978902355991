#!/usr/bin/env bash
# What an egress allowlist costs, each figure against its peer measured in the same run,
# the two alternating:
#   (a) a 64 MiB download through the broker (CONNECT through the proxy, and a proxy-unaware
#       client through the DNS stub and the transparent listener) against a direct loopback
#       TCP download outside any sandbox;
#   (b) connection set-up: 200 connections (1 byte each) through the broker against 200
#       direct ones, the median per connection;
#   (c) start-up: `run --allow-host ... -- /bin/true` against `run -- /bin/true`.
#
#   scripts/bench-egress.sh [-n RUNS] [-s STARTS]
#       RUNS: samples of (a) and (b) (default 5); STARTS: samples of (c) (default 30)
#   HATCHERY=PATH scripts/bench-egress.sh    a binary of your own (default: a release build)
#
# Prints medians (and min-max) and the median of the paired ratios. Nothing leaves the
# host's loopback: the server listens on 127.0.0.1 and the sandbox reaches it through an
# allow entry naming that address (`bench.test` is resolved to it by --resolve, so the
# broker looks nothing up). Every command runs under `timeout`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs=5
starts=30
while [ $# -gt 0 ]; do
    case $1 in
        -n) runs=${2:?-n needs a number}; shift 2 ;;
        -s) starts=${2:?-s needs a number}; shift 2 ;;
        *) echo "usage: $0 [-n RUNS] [-s STARTS]" >&2; exit 2 ;;
    esac
done
case "$runs$starts" in *[!0-9]*) echo "$0: RUNS and STARTS are numbers" >&2; exit 2 ;; esac
[ "$runs" -ge 1 ] && [ "$starts" -ge 1 ] || { echo "$0: RUNS and STARTS are at least 1" >&2; exit 2; }

python=/usr/bin/python3
[ -x "$python" ] || { echo "$0: needs $python (apt-get install python3)" >&2; exit 1; }
if [ -z "${HATCHERY:-}" ]; then
    timeout 1800 cargo build --release --locked --quiet --bin hatchery
    HATCHERY=target/release/hatchery
fi

bulk=$((64 << 20))
conns=200

work=$(mktemp -d /tmp/hatchery-bench-egress.XXXXXX)
server_pid=
cleanup() {
    [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
    [ -z "$server_pid" ] || wait "$server_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"

# The client, run both inside the sandbox and directly. One line: seconds.
#   client.py bulk HOW HOST PORT BYTES    one download of BYTES
#   client.py conns HOW HOST PORT COUNT   COUNT downloads of 1 byte, the median of each
# HOW: direct (HOST resolved once, then plain connects) or connect (CONNECT through the
# sandbox's proxy at 127.0.0.1:3128).
cat > "$work/client.py" <<'EOF'
import socket, statistics, sys, time

mode, how, host, port, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
addr = socket.gethostbyname(host) if how == "direct" else None
buf = bytearray(1 << 20)


def connection():
    if how == "direct":
        s = socket.create_connection((addr, port), timeout=30)
    else:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            b = s.recv(1)
            if not b:
                sys.exit("the proxy closed the connection")
            head += b
        if head.split(b" ", 2)[1:2] != [b"200"]:
            sys.exit(f"the proxy refused: {head.splitlines()[0]!r}")
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def fetch(nbytes):
    with connection() as s:
        s.sendall(f"{nbytes}\n".encode())
        got = 0
        while True:
            k = s.recv_into(buf)
            if not k:
                break
            got += k
    if got != nbytes:
        sys.exit(f"got {got} bytes of {nbytes}")


if mode == "bulk":
    start = time.perf_counter()
    fetch(n)
    print(f"{time.perf_counter() - start:.6f}")
else:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fetch(1)
        times.append(time.perf_counter() - start)
    print(f"{statistics.median(times):.6f}")
EOF
chmod 644 "$work/client.py"

# The server: a line "N" in, N bytes out.
timeout 3600 "$python" tests/support/egress_bed_server.py stream "$work/server.log" &
server_pid=$!
port=
for _ in $(seq 100); do
    port=$(sed -n 's/^ready //p' "$work/server.log" 2>/dev/null || true)
    [ -n "$port" ] && break
    sleep 0.05
done
[ -n "$port" ] || { echo "$0: the server did not start" >&2; exit 1; }

sandbox=(timeout 300 "$HATCHERY" run --ro "$work"
    --allow-host "127.0.0.1:$port" --allow-host "bench.test:$port" --resolve bench.test=127.0.0.1
    -- "$python" "$work/client.py")
direct=(timeout 300 "$python" "$work/client.py")

# median FILE: the median of the numbers in FILE, one a line.
median() { sort -g "$1" | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# figure FILE FACTOR DECIMALS: "median (min-max)" of FILE's numbers times FACTOR.
figure() {
    sort -g "$1" | awk -v f="$2" -v d="$3" '{ v[NR] = $1 * f }
        END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              printf "%10.*f (%.*f-%.*f)", d, m, d, v[1], d, v[NR] }'
}
# ratio A B: the median of the paired ratios A[i] / B[i].
ratio() { paste "$1" "$2" | awk '{ print $1 / $2 }' > "$work/ratio"; printf 'x%.2f' "$(median "$work/ratio")"; }
# rate FILE MIB: MiB/s at FILE's median time.
rate() { awk -v m="$(median "$1")" -v b="$2" 'BEGIN { printf "%6.0f MiB/s", b / m }'; }

# sample OUT CMD...: appends CMD's single-number output to OUT, or stops the benchmark.
sample() {
    local out=$1 value
    shift
    if ! value=$("$@" 2>"$work/err") || [ -z "$value" ]; then
        echo "$0: failed: $*" >&2
        cat "$work/err" >&2
        exit 1
    fi
    echo "$value" >> "$out"
}

echo "egress benchmark: $runs runs of (a) and (b), $starts starts for (c); $(nproc) cores, $(uname -r)"

: > "$work/a.direct"; : > "$work/a.proxy"; : > "$work/a.transparent"
: > "$work/b.direct"; : > "$work/b.proxy"; : > "$work/b.transparent"
for _ in $(seq "$runs"); do
    sample "$work/a.direct" "${direct[@]}" bulk direct 127.0.0.1 "$port" "$bulk"
    sample "$work/a.proxy" "${sandbox[@]}" bulk connect 127.0.0.1 "$port" "$bulk"
    sample "$work/a.transparent" "${sandbox[@]}" bulk direct bench.test "$port" "$bulk"
    sample "$work/b.direct" "${direct[@]}" conns direct 127.0.0.1 "$port" "$conns"
    sample "$work/b.proxy" "${sandbox[@]}" conns connect 127.0.0.1 "$port" "$conns"
    sample "$work/b.transparent" "${sandbox[@]}" conns direct bench.test "$port" "$conns"
done

mib=$((bulk >> 20))
echo
echo "(a) $mib MiB download: ms, median (min-max); rate at the median; paired ratio to direct"
printf '    %-34s %s  %s\n' "direct loopback" "$(figure "$work/a.direct" 1000 1)" "$(rate "$work/a.direct" "$mib")"
for via in proxy transparent; do
    printf '    %-34s %s  %s  %s\n' "through the broker ($via)" "$(figure "$work/a.$via" 1000 1)" \
        "$(rate "$work/a.$via" "$mib")" "$(ratio "$work/a.$via" "$work/a.direct")"
done

echo
echo "(b) connection set-up, $conns connections of 1 byte: us per connection, median (min-max) of each run's median"
printf '    %-34s %s\n' "direct loopback" "$(figure "$work/b.direct" 1000000 0)"
for via in proxy transparent; do
    printf '    %-34s %s  %s\n' "through the broker ($via)" "$(figure "$work/b.$via" 1000000 0)" \
        "$(ratio "$work/b.$via" "$work/b.direct")"
done

# (c) start-up, alternating; bash's EPOCHREALTIME is the wall clock in microseconds.
: > "$work/c.plain"; : > "$work/c.egress"
elapsed() {
    local t0 t1
    t0=$EPOCHREALTIME
    "$@" > /dev/null 2> "$work/err" || { echo "$0: failed: $*" >&2; cat "$work/err" >&2; exit 1; }
    t1=$EPOCHREALTIME
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f\n", b - a }'
}
for _ in $(seq "$starts"); do
    elapsed timeout 60 "$HATCHERY" run -- /bin/true >> "$work/c.plain"
    elapsed timeout 60 "$HATCHERY" run --allow-host "127.0.0.1:$port" -- /bin/true >> "$work/c.egress"
done
echo
echo "(c) start-up of /bin/true: ms, median (min-max); paired ratio and difference of the medians"
printf '    %-34s %s\n' "run" "$(figure "$work/c.plain" 1000 2)"
printf '    %-34s %s  %s  %s ms\n' "run --allow-host" "$(figure "$work/c.egress" 1000 2)" \
    "$(ratio "$work/c.egress" "$work/c.plain")" \
    "$(awk -v a="$(median "$work/c.egress")" -v b="$(median "$work/c.plain")" 'BEGIN { printf "%+.2f", (a - b) * 1000 }')"
