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
  connect-many N HOST PORT
                        N connections, one after the other, to HOST:PORT (resolved by
                        the sandbox's stub), each closed at once ("connected N failed F")
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


def step_connect_many(n, host, port):
    ok = failed = 0
    for _ in range(int(n)):
        try:
            with socket.create_connection((host, int(port)), timeout=payload.TIMEOUT):
                ok += 1
        except OSError:
            failed += 1
    return f"connected {ok} failed {failed}"


STEPS = dict(payload.STEPS)
STEPS.update(
    {
        "fire": step_fire,
        "sleep": step_sleep,
        "raw": step_raw,
        "dns-flood": step_dns_flood,
        "connect-many": step_connect_many,
    }
)


def main():
    payload.STEPS.clear()
    payload.STEPS.update(STEPS)
    payload.main()


if __name__ == "__main__":
    main()
