#!/usr/bin/env python3
"""A hatchery worker client in plain Python (standard library only).

Inside a worker started by `hatchery controller`, file descriptor 3 (the number is in
HATCHERY_FD) is a stream socket to the controller: the worker's only way out of its
sandbox. Every message is a frame: a 4-byte big-endian length, then that many bytes of
UTF-8 JSON (at most 262144). Unknown fields are refused by the controller.

    controller -> worker   {"type": "welcome", "worker_id": ..., "manifest": {...},
                            "heartbeat_interval_ms": ...}      (first frame, unasked)
    worker -> controller   {"type": "register", "manifest": {...}}   (the welcome's manifest)
                           {"type": "heartbeat"}
                           {"type": "replicate", "reason": ..., "command": [...],
                            optional: "state_snapshot", "resources", "filesystem",
                            "profile", "env", "cwd"}     (omitted: the parent's own grant)
                           {"type": "report", "result": "..."}
                           {"type": "shutdown"}
    controller -> worker   exactly one reply per request:
                           {"type": "registered", "worker_id": ..., "depth": N}
                           {"type": "ok"}
                           {"type": "allowed", "child_id": ..., "depth": N}
                           {"type": "denied", "event": "deny_depth", "reason": "..."}
                           {"type": "error", "message": "..."}

A worker's identity is its connection: a "worker_id" field in a request is optional and,
if present, must be the worker's own (anything else is refused and audited).

Usage as a library:

    from hatchery_agent import Worker
    w = Worker()                 # reads the welcome
    w.register()
    w.heartbeat()
    print(w.replicate("split the work", ["python3", "/work/job.py", "--part", "2"]))

or from a shell:  python3 hatchery_agent.py register|heartbeat|report TEXT|shutdown
"""

import json
import os
import socket
import struct
import sys

MAX_FRAME = 256 * 1024


class ProtocolError(Exception):
    pass


class Worker:
    def __init__(self, fd=None):
        fd = int(os.environ.get("HATCHERY_FD", "3")) if fd is None else fd
        self.sock = socket.socket(fileno=fd)
        self.welcome = self.receive()
        if self.welcome.get("type") != "welcome":
            raise ProtocolError(f"expected a welcome, got {self.welcome}")
        self.worker_id = self.welcome["worker_id"]
        self.manifest = self.welcome["manifest"]

    def send_raw(self, payload: bytes):
        """Sends bytes as one frame, unchecked (for testing the controller's defences)."""
        self.sock.sendall(struct.pack(">I", len(payload)) + payload)

    def send(self, message: dict):
        body = json.dumps(message, separators=(",", ":")).encode()
        if len(body) > MAX_FRAME:
            raise ProtocolError("message too large")
        self.send_raw(body)

    def _read_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ProtocolError("the controller closed the connection")
            buf += chunk
        return buf

    def receive(self) -> dict:
        (length,) = struct.unpack(">I", self._read_exact(4))
        if length > MAX_FRAME:
            raise ProtocolError(f"frame of {length} bytes is too large")
        return json.loads(self._read_exact(length))

    def call(self, message: dict) -> dict:
        self.send(message)
        return self.receive()

    def register(self) -> dict:
        return self.call({"type": "register", "manifest": self.manifest})

    def heartbeat(self) -> dict:
        return self.call({"type": "heartbeat"})

    def replicate(self, reason: str, command: list, **grant) -> dict:
        return self.call({"type": "replicate", "reason": reason, "command": command, **grant})

    def report(self, result: str) -> dict:
        return self.call({"type": "report", "result": result})

    def shutdown(self) -> dict:
        return self.call({"type": "shutdown"})


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    w = Worker()
    verb = argv[1]
    if verb == "register":
        reply = w.register()
    elif verb == "heartbeat":
        w.register()
        reply = w.heartbeat()
    elif verb == "report":
        w.register()
        reply = w.report(" ".join(argv[2:]))
    elif verb == "shutdown":
        w.register()
        reply = w.shutdown()
    else:
        print(f"unknown command {verb}", file=sys.stderr)
        return 2
    print(json.dumps(reply))
    return 0 if reply.get("type") not in ("error", "denied") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
