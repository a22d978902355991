"""What tests/egress_attacks.rs runs inside `hatchery run`: the steps of
tests/support/egress_payload.py (imported from the same directory), and these, each
printing one line:

  fire HOST PORT        sends CONNECT HOST:PORT to the proxy and leaves without waiting
                        for the answer, the connection held open until the payload ends
                        ("fired")
  sleep SECONDS         waits ("slept")
  raw TEXT              sends TEXT (Python escapes such as \\r\\n decoded) to the proxy
                        and reads until the end ("status N BODY", or "closed")
  dns-flood N           sends N queries, each for a name no entry allows, to the stub
                        over UDP ("flooded N answered M")
  dns-pipeline SECONDS  for SECONDS, writes queries to the stub over one TCP connection,
                        thousands a write, while a thread reads the answers ("answered N
                        in T s")
  pipeline VIA HOST PORT FIRST SECOND
                        two GET requests sent back to back on one connection (VIA as in
                        egress_payload.py, or "proxy" for absolute URIs to the proxy),
                        Host FIRST then Host SECOND; reads until the end and prints the
                        hosts the answers name ("answered host=A,host=B", or "answered -")
  get-many N HOST PORT  N plain-HTTP GETs to HOST:PORT, one connection each, one after
                        the other ("answered A failed F")
  hold N HOST PORT      opens N connections to HOST:PORT and keeps them, silent, until
                        the payload ends ("held N refused R")
  connect-many N HOST PORT
                        N connections, one after the other, to HOST:PORT (resolved by
                        the sandbox's stub), each closed at once ("connected N failed F")
  stuff N MIB HOST PORT SECONDS
                        opens N connections to HOST:PORT (a server that never reads) and
                        writes up to MIB MiB into each, as fast as the kernel takes them,
                        for at most SECONDS; keeps them open until the payload ends
                        ("stuffed N with B bytes, C cut")
  close                 closes every connection kept so far ("closed N")
  late-read HOST PORT N SECONDS
                        asks a stream server at HOST:PORT for N bytes with a 8 KiB receive
                        buffer, closes its sending side at once, and reads only after
                        SECONDS ("read N", or "reset after N")
"""

import codecs
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import payload  # noqa: E402  (tests/support/egress_payload.py, written there by the bed)

HELD = []


def step_fire(host, port):
    sock = socket.create_connection(payload.PROXY, timeout=payload.TIMEOUT)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    HELD.append(sock)
    return "fired"


def step_sleep(seconds):
    time.sleep(float(seconds))
    return "slept"


def step_raw(text):
    data = codecs.decode(text, "unicode_escape").encode("latin-1")
    with socket.create_connection(payload.PROXY, timeout=payload.TIMEOUT) as sock:
        return payload.exchange(sock, data)


def step_dns_flood(n):
    n = int(n)
    answered = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        for i in range(n):
            s.sendto(payload.dns_query(i & 0xFFFF, "A", f"junk{i}.flood.test"), ("127.0.0.1", 53))
            try:
                s.recv(65536)
                answered += 1
            except OSError:
                pass
    return f"flooded {n} answered {answered}"


def step_dns_pipeline(seconds):
    import threading

    seconds = float(seconds)
    one = payload.dns_query(7, "A", "junk.flood.test")
    batch = (struct.pack(">H", len(one)) + one) * 2000
    answered = [0]
    sock = socket.create_connection(("127.0.0.1", 53), timeout=2)

    def read():
        pending = b""
        while True:
            try:
                data = sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            pending += data
            at = 0
            while len(pending) - at >= 2:
                n = struct.unpack_from(">H", pending, at)[0]
                if len(pending) - at < 2 + n:
                    break
                at += 2 + n
                answered[0] += 1
            pending = pending[at:]

    def write():
        try:
            while True:
                sock.sendall(batch)
        except OSError:
            return

    sock.settimeout(None)
    start = time.monotonic()
    for target in (read, write):
        threading.Thread(target=target, daemon=True).start()
    time.sleep(seconds)
    took = time.monotonic() - start
    count = answered[0]
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    return f"answered {count} in {took:.1f} s"


def step_pipeline(via, host, port, first, second):
    if via == "proxy":
        sock = socket.create_connection(payload.PROXY, timeout=payload.TIMEOUT)
        target = f"http://{host}:{port}/"
    else:
        sock = payload.open_stream(via, host, port)
        target = "/"
    with sock:
        sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: {first}\r\n\r\n"
            f"GET / HTTP/1.1\r\nHost: {second}\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    hosts = [w.decode() for w in data.split() if w.startswith(b"host=")]
    return f"answered {','.join(hosts) or '-'}"


def step_get_many(n, host, port):
    ok = failed = 0
    for _ in range(int(n)):
        try:
            line = payload.step_http("direct", host, port, host)
        except OSError:
            line = "fail"
        if line.startswith("status 200"):
            ok += 1
        else:
            failed += 1
    return f"answered {ok} failed {failed}"


def step_hold(n, host, port):
    ok = refused = 0
    for _ in range(int(n)):
        try:
            HELD.append(socket.create_connection((host, int(port)), timeout=payload.TIMEOUT))
            ok += 1
        except OSError:
            refused += 1
    return f"held {ok} refused {refused}"


def step_connect_many(n, host, port):
    ok = failed = 0
    for _ in range(int(n)):
        try:
            with socket.create_connection((host, int(port)), timeout=payload.TIMEOUT):
                ok += 1
        except OSError:
            failed += 1
    return f"connected {ok} failed {failed}"


def step_stuff(n, mib, host, port, seconds):
    """Kernel memory outside the sandbox's cgroup, filled by the sandbox: every byte the
    broker has taken from the sandbox but cannot pass on waits in one of its sockets."""
    socks = []
    for _ in range(int(n)):
        try:
            s = socket.create_connection((host, int(port)), timeout=payload.TIMEOUT)
        except OSError:
            continue
        # Its own sockets small: what is measured is mostly what waits outside.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        s.setblocking(False)
        socks.append([s, 0])
    limit = int(mib) * 1024 * 1024
    chunk = b"x" * 65536
    total = cut = 0
    deadline = time.monotonic() + float(seconds)
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < 1.0:
        moved = False
        for entry in socks:
            s, sent = entry
            if s is None or sent >= limit:
                continue
            try:
                k = s.send(chunk[: min(len(chunk), limit - sent)])
            except BlockingIOError:
                continue
            except OSError:
                entry[0] = None
                cut += 1
                continue
            entry[1] += k
            total += k
            moved = True
        if moved:
            quiet_since = time.monotonic()
        else:
            time.sleep(0.005)
    HELD.extend(s for s, _ in socks if s is not None)
    return f"stuffed {len(socks)} with {total} bytes, {cut} cut"


def step_close():
    n = len(HELD)
    for s in HELD:
        s.close()
    HELD.clear()
    return f"closed {n}"


def step_late_read(host, port, n, seconds):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.settimeout(payload.TIMEOUT)
    sock.connect((host, int(port)))
    sock.sendall(f"{int(n)}\n".encode())
    sock.shutdown(socket.SHUT_WR)
    time.sleep(float(seconds))
    got = 0
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += len(chunk)
    except ConnectionResetError:
        return f"reset after {got}"
    return f"read {got}"


STEPS = dict(payload.STEPS)
STEPS.update(
    {
        "fire": step_fire,
        "sleep": step_sleep,
        "raw": step_raw,
        "dns-flood": step_dns_flood,
        "dns-pipeline": step_dns_pipeline,
        "connect-many": step_connect_many,
        "pipeline": step_pipeline,
        "hold": step_hold,
        "get-many": step_get_many,
        "stuff": step_stuff,
        "close": step_close,
        "late-read": step_late_read,
    }
)


def main():
    payload.STEPS.clear()
    payload.STEPS.update(STEPS)
    payload.main()


if __name__ == "__main__":
    main()
