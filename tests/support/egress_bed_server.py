"""Servers of the egress test bed (the "fake internet" of tests/egress.rs) and of
scripts/bench-egress.sh.

Every connection and datagram that arrives is logged, one line each, to LOG: a test checks
what reached the bed, not only what the sandbox saw.

  egress_bed_server.py bed LOG CERT KEY
      in the bed's network namespace, on every address it has (0.0.0.0):
      80    HTTP: `GET /` answers "hello from bed host=HOST sni=- local=ADDR", request
            after request on one connection until one has `Connection: close`
      443   the same over TLS (CERT, KEY), with sni=the ClientHello's server name
      9000  sends 1 MiB on connect, then closes
      9001  sends one byte every 100 ms until the peer goes away ("closed 9001" in LOG)
      9002  closes its sending side at once and reads nothing, into a small receive buffer
      53    UDP: logs every datagram, answers nothing
  egress_bed_server.py http LOG
      HTTP as on port 80 above, on 127.0.0.1 at a free port
  egress_bed_server.py host-http LOG
      the same on every address (0.0.0.0) at a free port: a service of the host itself
  egress_bed_server.py stream LOG
      on 127.0.0.1 at a free port: reads one line "N", sends N bytes, closes (benchmarks)

Log lines: "ready PORT" once every socket listens (PORT: the free port, or 0), then
"accept PORT local=ADDR peer=ADDR", "served PORT local=ADDR host=HOST sni=SNI",
"tls-failed PORT local=ADDR ERROR", "sent PORT bytes=N", "closed PORT local=ADDR",
"udp PORT peer=ADDR bytes=N".
"""

import socket
import ssl
import sys
import threading
import time

LOCK = threading.Lock()
LOG = None


def log(line):
    with LOCK:
        LOG.write(line + "\n")
        LOG.flush()


def listen(addr, port, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((addr, port))
    s.listen(128)
    return s


def serve_forever(sock, handler, quiet=False):
    port = sock.getsockname()[1]

    def loop():
        while True:
            conn, peer = sock.accept()
            local = conn.getsockname()[0]
            if not quiet:
                log(f"accept {port} local={local} peer={peer[0]}")
            threading.Thread(
                target=guarded, args=(handler, conn, port, local), daemon=True
            ).start()

    threading.Thread(target=loop, daemon=True).start()


def guarded(handler, conn, port, local):
    try:
        handler(conn, port, local)
    except OSError:
        pass
    finally:
        try:
            conn.close()
        except OSError:
            pass


def read_head(conn, buf=b""):
    """The next request head and what came after it (b"" heads at the end)."""
    while b"\r\n\r\n" not in buf and len(buf) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            return b"", b""
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def wants_close(head):
    lines = head.split(b"\r\n")
    if lines[0].endswith(b"HTTP/1.0"):
        return True
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"connection" and b"close" in value.lower():
            return True
    return False


def host_of(head):
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"host":
            return value.strip().decode("latin-1")
    return "-"


def http(conn, port, local, sni="-"):
    """Answers request after request on one connection (HTTP/1.1 keeps it open), until
    one asks to close it."""
    conn.settimeout(10)
    rest = b""
    while True:
        head, rest = read_head(conn, rest)
        if not head:
            return
        host = host_of(head)
        close = wants_close(head)
        body = f"hello from bed host={host} sni={sni} local={local}\n".encode()
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
            + (b"Connection: close\r\n" if close else b"")
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        log(f"served {port} local={local} host={host} sni={sni}")
        if close:
            return


def https(context):
    def handler(conn, port, local):
        conn.settimeout(10)
        try:
            tls = context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError) as e:
            log(f"tls-failed {port} local={local} {type(e).__name__}")
            return
        names = getattr(tls, "hb_sni", None) or "-"
        http(tls, port, local, sni=names)

    return handler


def remember_sni(tls, name, _context):
    tls.hb_sni = name


def one_mib(conn, port, local):
    chunk = b"x" * 16384
    sent = 0
    try:
        while sent < 1 << 20:
            conn.sendall(chunk)
            sent += len(chunk)
    finally:
        log(f"sent {port} bytes={sent}")


def slow(conn, port, local):
    try:
        while True:
            conn.sendall(b".")
            time.sleep(0.1)
    finally:
        log(f"closed {port} local={local}")


def deaf(conn, port, local):
    conn.shutdown(socket.SHUT_WR)
    while True:
        time.sleep(3600)


def stream(conn, port, local):
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    line = b""
    while not line.endswith(b"\n") and len(line) < 32:
        chunk = conn.recv(32)
        if not chunk:
            return
        line += chunk
    left = int(line)
    block = memoryview(b"x" * (1 << 20))
    while left > 0:
        n = conn.send(block[: min(left, len(block))])
        left -= n


def udp(sock):
    port = sock.getsockname()[1]

    def loop():
        while True:
            data, peer = sock.recvfrom(65536)
            log(f"udp {port} peer={peer[0]} bytes={len(data)}")

    threading.Thread(target=loop, daemon=True).start()


def main():
    global LOG
    mode, LOG = sys.argv[1], open(sys.argv[2], "a")
    if mode == "bed":
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[3], sys.argv[4])
        context.sni_callback = remember_sni
        serve_forever(listen("0.0.0.0", 80), http)
        serve_forever(listen("0.0.0.0", 443), https(context))
        serve_forever(listen("0.0.0.0", 9000), one_mib)
        serve_forever(listen("0.0.0.0", 9001), slow)
        serve_forever(listen("0.0.0.0", 9002, rcvbuf=4096), deaf)
        dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        dns.bind(("0.0.0.0", 53))
        udp(dns)
        port = 0
    else:
        sock = listen("0.0.0.0" if mode == "host-http" else "127.0.0.1", 0)
        serve_forever(sock, stream if mode == "stream" else http, quiet=mode == "stream")
        port = sock.getsockname()[1]
    log(f"ready {port}")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
