#!/usr/bin/env python3
"""A hatchery worker client in plain Python (standard library only).

Inside a worker started by `hatchery controller`, file descriptor 3 (the number is in
HATCHERY_FD) is a stream socket to the controller: the worker's only way out of its
sandbox. Every message is a frame: a 4-byte big-endian length, then that many bytes of
UTF-8 JSON (at most 262144). Unknown fields are refused by the controller.

    controller -> worker   {"type": "welcome", "worker_id": ..., "manifest": {...},
                            "heartbeat_interval_ms": ...}      (first frame, unasked,
                                                                sent once)
    worker -> controller   {"type": "register", "manifest": {...}}   (the welcome's manifest)
                           {"type": "heartbeat"}
                           {"type": "replicate", "reason": ..., "command": [...],
                            optional: "state_snapshot", "resources", "filesystem",
                            "profile", "env", "cwd"}     (omitted: the parent's own grant)
                           {"type": "report", "result": "..."}
                           {"type": "shutdown"}
                           (each may name itself: "call": "...", at most 64 bytes)
    controller -> worker   exactly one reply per request (with the request's "call"):
                           {"type": "registered", "worker_id": ..., "depth": N}
                           {"type": "ok"}
                           {"type": "allowed", "child_id": ..., "depth": N}
                           {"type": "pending", "approval_id": ..., "child_id": ...,
                            "reasons": [...]}          (a person decides: see below)
                           {"type": "denied", "event": "deny_depth", "reason": "..."}
                           {"type": "error", "message": "..."}
                           and later, for a request answered "pending", one decision:
                           "allowed", "denied" or "error" with its "approval_id"

A worker's identity is its connection: a "worker_id" field in a request is optional and,
if present, must be the worker's own (anything else is refused and audited).

The welcome is sent once, when the worker starts, and stays in the socket until a process
reads it. So `register` reads it (waiting at most WELCOME_TIMEOUT seconds: a worker that
registered already has none left), and every other call passes over a welcome still
unread before its reply. A worker may therefore make each call from a process of its own.

A call that ends before reading its answer (a time limit, a signal) leaves that answer in
the socket, where the next call would read it as its own. So every request here names its
call ("call": any string of at most 64 bytes), the controller puts the same "call" in the
answer, and a call reads on until the answer that names it; what it passes over on the way
is kept in `passed_over`. A decision comes later, whenever a person decides (or the
approval deadline passes): it names no call but the "approval_id" of the request it
settles, and `decision(approval_id)` waits for it.

Usage as a library:

    from hatchery_agent import Worker
    w = Worker()
    w.register()                 # reads the welcome, presents its manifest
    w.heartbeat()
    print(w.replicate("split the work", ["python3", "/work/job.py", "--part", "2"]))

or from a shell, one process per call (register once, first):

    python3 hatchery_agent.py register
    python3 hatchery_agent.py heartbeat
    python3 hatchery_agent.py report TEXT
    python3 hatchery_agent.py shutdown
"""

import contextlib
import fcntl
import json
import os
import select
import socket
import struct
import sys
import time

MAX_FRAME = 256 * 1024


class ProtocolError(Exception):
    pass


def is_decision(frame: dict) -> bool:
    """A decision on a request that waited for a person, not a reply to the latest call."""
    return frame.get("type") != "pending" and "approval_id" in frame


class Worker:
    WELCOME_TIMEOUT = 5.0
    MAX_PASSED_OVER = 16
    MAX_DECISIONS_KEPT = 64

    def __init__(self, fd=None):
        fd = int(os.environ.get("HATCHERY_FD", "3")) if fd is None else fd
        self.sock = socket.socket(fileno=fd)
        # The socket is shared by every process of the worker: one killed while it waited
        # with a timeout may have left it non-blocking. Calls are made one at a time, so
        # this one puts it back as the protocol expects it.
        self.sock.setblocking(True)
        self.welcome = None
        # What calls that ended before reading their answers left behind, read on the way
        # to this client's own (the first MAX_PASSED_OVER; the rest are counted).
        self.passed_over = []
        self.passed_over_uncounted = 0
        # The decisions among them (the newest MAX_DECISIONS_KEPT), for `decision()`.
        self._decisions = []
        self._turns = 0

    @contextlib.contextmanager
    def turn(self):
        """Holds the worker's turn on its socket: every process of a worker reads the one
        socket, and two reading at once split each other's frames. A POSIX record lock
        (`lockf`) belongs to the process, so other processes wait; the kernel gives it
        back when this one ends. `hatchery agent` takes the same turn."""
        if self._turns == 0:
            fcntl.lockf(self.sock.fileno(), fcntl.LOCK_EX)
        self._turns += 1
        try:
            yield
        finally:
            self._turns -= 1
            if self._turns == 0:
                fcntl.lockf(self.sock.fileno(), fcntl.LOCK_UN)

    def read_welcome(self) -> dict:
        """The controller's welcome, read once (it is sent once, first)."""
        with self.turn():
            return self._read_welcome()

    def _read_welcome(self) -> dict:
        if self.welcome is None:
            # Waits in select, not with a timeout on the socket: the socket is every
            # process's of the worker, and this one may be killed while it waits.
            ready, _, _ = select.select([self.sock], [], [], self.WELCOME_TIMEOUT)
            if not ready:
                raise ProtocolError(
                    "no welcome from the controller: it is sent once, to the worker's "
                    "first register, so this worker has registered already"
                )
            frame = self._receive_frame()
            if frame.get("type") != "welcome":
                raise ProtocolError(f"expected a welcome, got {frame}")
            self.welcome = frame
        return self.welcome

    @property
    def worker_id(self) -> str:
        return self.read_welcome()["worker_id"]

    @property
    def manifest(self) -> dict:
        return self.read_welcome()["manifest"]

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

    def _receive_frame(self) -> dict:
        (length,) = struct.unpack(">I", self._read_exact(4))
        if length > MAX_FRAME:
            raise ProtocolError(f"frame of {length} bytes is too large")
        return json.loads(self._read_exact(length))

    def _pass_over(self, frame: dict):
        if is_decision(frame):
            if len(self._decisions) >= self.MAX_DECISIONS_KEPT:
                self._decisions.pop(0)
            self._decisions.append(frame)
        if len(self.passed_over) < self.MAX_PASSED_OVER:
            self.passed_over.append(frame)
        else:
            self.passed_over_uncounted += 1

    def receive(self) -> dict:
        """The next frame, whatever it answers, passing over a welcome no process of this
        worker has read (low level: `call` reads its own answer)."""
        while True:
            frame = self._receive_frame()
            if frame.get("type") != "welcome":
                return frame
            self.welcome = frame

    def call(self, message: dict) -> dict:
        """Sends a request named for this call alone, and returns its answer (without the
        name). What calls that ended before reading their answers left is passed over."""
        name = os.urandom(8).hex()
        with self.turn():
            self.send({**message, "call": name})
            while True:
                frame = self.receive()
                if frame.get("call") == name:
                    del frame["call"]
                    return frame
                self._pass_over(frame)

    def decision(self, approval_id: str, timeout=None) -> dict:
        """Waits for the decision on a request answered "pending" to this Worker (it may
        have been passed over already, by this Worker). A decision another process read
        never comes again: `timeout` (seconds) bounds the wait, and the turn held meanwhile
        (ProtocolError when it passes)."""
        for i, frame in enumerate(self._decisions):
            if frame.get("approval_id") == approval_id:
                return self._decisions.pop(i)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.turn():
            while True:
                if deadline is not None:
                    left = max(0.0, deadline - time.monotonic())
                    ready, _, _ = select.select([self.sock], [], [], left)
                    if not ready:
                        raise ProtocolError(f"no decision on {approval_id} within {timeout} s")
                frame = self.receive()
                if is_decision(frame) and frame.get("approval_id") == approval_id:
                    return frame
                self._pass_over(frame)

    def register(self) -> dict:
        with self.turn():
            return self.call({"type": "register", "manifest": self.read_welcome()["manifest"]})

    def heartbeat(self) -> dict:
        return self.call({"type": "heartbeat"})

    def replicate(self, reason: str, command: list, wait: bool = False, **grant) -> dict:
        """Asks for a child. A request a person must decide is answered "pending": with
        `wait`, its decision is awaited and returned instead; without, `decision()` waits
        for it later."""
        with self.turn():
            reply = self.call({"type": "replicate", "reason": reason, "command": command, **grant})
            if wait and reply.get("type") == "pending":
                return self.decision(reply["approval_id"])
            return reply

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
    calls = {
        "register": w.register,
        "heartbeat": w.heartbeat,
        "report": lambda: w.report(" ".join(argv[2:])),
        "shutdown": w.shutdown,
    }
    if verb not in calls:
        print(f"unknown command {verb}", file=sys.stderr)
        return 2
    try:
        reply = calls[verb]()
    except (ProtocolError, OSError) as e:
        reply = None
        print(f"hatchery_agent: {verb}: {e}", file=sys.stderr)
    for d in w.passed_over:
        what = (
            f"the decision on approval {d.get('approval_id')} (the call that waited for it "
            "has ended)"
            if is_decision(d)
            else "an answer to a call that ended before reading it"
        )
        print(f"hatchery_agent: passed over {what}: {json.dumps(d)}", file=sys.stderr)
    if w.passed_over_uncounted:
        print(f"hatchery_agent: passed over {w.passed_over_uncounted} more", file=sys.stderr)
    if reply is None:
        return 1
    print(json.dumps(reply))
    return 0 if reply.get("type") not in ("error", "denied") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
