"""What tests/egress.rs runs inside `hatchery run`: each step tries one way out of the
sandbox and prints one line saying what happened.

  egress_payload.py STEP ARGS... [+ STEP ARGS...]...

Steps (VIA: "direct" connects to HOST:PORT itself, resolving HOST through the sandbox's
resolver; "connect" asks the proxy at 127.0.0.1:3128 with CONNECT; "proxy" sends an
absolute-URI request to the proxy):
  urllib URL [CAFILE]             urllib.request.urlopen with the environment's proxies
                                  (NO_PROXY dropped first, so that a loopback URL goes to
                                  the proxy too)
  tls VIA HOST PORT SNI CAFILE|none   TLS with server name SNI, then GET /
  http VIA HOST PORT HOSTHEADER   plain HTTP GET / with that Host header
  connect HOST PORT               CONNECT and nothing more: prints the proxy's status
  tcp ADDR PORT                   a TCP connect
  udp ADDR PORT                   one UDP datagram
  dns udp|tcp QTYPE NAME          one query to 127.0.0.1:53
  read-all HOST PORT              connects and reads until the end, prints the byte count
  read-forever HOST PORT MARKER   connects, says so and reads until killed

Lines: "status N BODY" (an HTTP answer), "proxy-status N" (CONNECT refused), "closed" (the
connection ended with no answer), "ok ...", "rcode N answers A,B", "read N",
"fail errno=E TYPE: MESSAGE".
"""

import os
import socket
import ssl
import struct
import sys
import urllib.error
import urllib.request

PROXY = ("127.0.0.1", 3128)
TIMEOUT = 5
QTYPES = {"A": 1, "NS": 2, "MX": 15, "TXT": 16, "AAAA": 28, "ANY": 255}


class ProxyRefused(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status


def describe(e):
    return f"fail errno={getattr(e, 'errno', None)} {type(e).__name__}: {e}"


def read_head(sock):
    """Reads an HTTP head byte by byte, so that nothing after it is taken."""
    head = b""
    while not head.endswith(b"\r\n\r\n") and len(head) < 65536:
        b = sock.recv(1)
        if not b:
            break
        head += b
    return head


def status_of(head):
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def tunnel(host, port):
    sock = socket.create_connection(PROXY, timeout=TIMEOUT)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    status = status_of(read_head(sock))
    if status != 200:
        sock.close()
        raise ProxyRefused(status)
    return sock


def open_stream(via, host, port):
    if via == "direct":
        return socket.create_connection((host, int(port)), timeout=TIMEOUT)
    if via == "connect":
        return tunnel(host, port)
    raise SystemExit(f"unknown VIA {via}")


def exchange(sock, request):
    """Sends a request, reads until the end: "status N BODY" or "closed"."""
    sock.sendall(request)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    if not data:
        return "closed"
    head, _, body = data.partition(b"\r\n\r\n")
    return f"status {status_of(head)} {body.decode('latin-1').strip()}"


def get(host_header):
    return f"GET / HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n".encode()


def step_urllib(url, cafile=None):
    for name in ("NO_PROXY", "no_proxy"):
        os.environ.pop(name, None)
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(url, context=context, timeout=TIMEOUT) as r:
            return f"status {r.status} {r.read().decode('latin-1').strip()}"
    except urllib.error.HTTPError as e:
        return f"status {e.code} (error)"


def step_tls(via, host, port, sni, cafile):
    if cafile == "none":
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cafile=cafile)
    sock = open_stream(via, host, port)
    with context.wrap_socket(sock, server_hostname=sni) as tls:
        return exchange(tls, get(sni))


def step_http(via, host, port, host_header):
    if via == "proxy":
        sock = socket.create_connection(PROXY, timeout=TIMEOUT)
        # As clients write it: a port other than 80 goes in the Host header too.
        if str(port) != "80" and ":" not in host_header.rsplit("]", 1)[-1]:
            host_header = f"{host_header}:{port}"
        request = (
            f"GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host_header}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
    else:
        sock = open_stream(via, host, port)
        request = get(host_header)
    with sock:
        return exchange(sock, request)


def step_connect(host, port):
    with tunnel(host, port):
        return "ok tunnel"


def step_tcp(addr, port):
    with socket.create_connection((addr, int(port)), timeout=TIMEOUT):
        return "ok connected"


def step_udp(addr, port):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"hatchery egress test", (addr, int(port)))
        return "ok sent"


def dns_query(qid, qtype, name):
    question = b"".join(bytes([len(l)]) + l.encode() for l in name.split(".") if l)
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + question + b"\0" + struct.pack(
        ">HH", QTYPES[qtype], 1
    )


def skip_name(msg, i):
    while True:
        n = msg[i]
        if n == 0:
            return i + 1
        if n & 0xC0 == 0xC0:
            return i + 2
        i += n + 1


def dns_answers(qid, msg):
    rid, flags, qd, an = struct.unpack(">HHHH", msg[:8])
    if rid != qid:
        return f"fail errno=None WrongId: {rid}"
    i = 12
    for _ in range(qd):
        i = skip_name(msg, i) + 4
    answers = []
    for _ in range(an):
        i = skip_name(msg, i)
        rtype, _cls, _ttl, length = struct.unpack(">HHIH", msg[i : i + 10])
        data = msg[i + 10 : i + 10 + length]
        answers.append(socket.inet_ntoa(data) if rtype == 1 and length == 4 else f"type{rtype}")
        i += 10 + length
    return f"rcode {flags & 0xF} answers {','.join(answers) or '-'}"


def step_dns(transport, qtype, name):
    qid = 0x4242
    query = dns_query(qid, qtype, name)
    if transport == "udp":
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(5)
            s.sendto(query, ("127.0.0.1", 53))
            return dns_answers(qid, s.recv(65536))
    with socket.create_connection(("127.0.0.1", 53), timeout=5) as s:
        s.sendall(struct.pack(">H", len(query)) + query)
        want = b""
        while len(want) < 2:
            chunk = s.recv(2 - len(want))
            if not chunk:
                return "closed"
            want += chunk
        (length,) = struct.unpack(">H", want)
        msg = b""
        while len(msg) < length:
            chunk = s.recv(length - len(msg))
            if not chunk:
                return "closed"
            msg += chunk
        return dns_answers(qid, msg)


def step_read_all(host, port):
    total, end = 0, "eof"
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s:
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                total += len(chunk)
        except OSError as e:
            end = type(e).__name__
    return f"read {total} {end}"


def step_read_forever(host, port, _marker):
    s = socket.create_connection((host, int(port)), timeout=TIMEOUT)
    print("ok connected", flush=True)
    s.settimeout(None)
    while s.recv(65536):
        pass
    return "eof"


STEPS = {
    "urllib": step_urllib,
    "tls": step_tls,
    "http": step_http,
    "connect": step_connect,
    "tcp": step_tcp,
    "udp": step_udp,
    "dns": step_dns,
    "read-all": step_read_all,
    "read-forever": step_read_forever,
}


def main():
    steps, current = [], []
    for arg in sys.argv[1:] + ["+"]:
        if arg == "+":
            steps.append(current)
            current = []
        else:
            current.append(arg)
    for name, *args in steps:
        try:
            line = STEPS[name](*args)
        except ProxyRefused as e:
            line = f"proxy-status {e.status}"
        except (OSError, ValueError, IndexError, struct.error, urllib.error.URLError) as e:
            line = describe(e)
        print(line, flush=True)


if __name__ == "__main__":
    main()
