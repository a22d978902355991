"""A FUSE file system standing for a slow or hung network file system (tests/run_limits.rs).

  slow_fs.py MOUNTPOINT [--deaf]

Mounts, prints "mounted", and serves one executable file, `prog`, whose open(2) is never
answered: a process that executes it waits in the kernel until it is interrupted. A lookup
of `stall` is never answered either ("lookup stall"): a process entering it waits likewise. An
interrupt (what the kernel sends when that process gets a fatal signal) fails the open with
EINTR, as a well-behaved network file system does. Each open prints "open", each interrupt
"interrupt". With --deaf, interrupts are not answered either: a process waiting on the
file system then stays in the kernel, unkillable, until the server goes away. Speaks the kernel's FUSE protocol (7.31) on /dev/fuse directly; needs root.
"""
import ctypes
import os
import struct
import sys

FUSE_LOOKUP, FUSE_FORGET, FUSE_GETATTR, FUSE_OPEN, FUSE_RELEASE = 1, 2, 3, 14, 18
FUSE_FLUSH, FUSE_INIT, FUSE_OPENDIR, FUSE_READDIR, FUSE_RELEASEDIR = 25, 26, 27, 28, 29
FUSE_INTERRUPT, FUSE_DESTROY, FUSE_BATCH_FORGET = 36, 38, 42
ENOENT, EINTR, ENOSYS = 2, 4, 38


def attr(ino):
    """struct fuse_attr: the root directory (1) or `prog` (2)."""
    mode = 0o40755 if ino == 1 else 0o100755
    return struct.pack("<QQQQQQIIIIIIIIII", ino, 4096, 8, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def main():
    mountpoint = sys.argv[1]
    deaf = "--deaf" in sys.argv[2:]
    fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"hatchery-slow-fs", mountpoint.encode(), b"fuse", 0, opts) != 0:
        sys.exit("mount: " + os.strerror(ctypes.get_errno()))
    print("mounted", flush=True)

    def reply(unique, err=0, body=b""):
        try:
            os.write(fd, struct.pack("<IiQ", 16 + len(body), -err, unique) + body)
        except OSError:
            pass  # the request is gone (interrupted and answered already)

    while True:
        try:
            buf = os.read(fd, 1 << 20)
        except OSError:
            return  # unmounted
        _, op, unique, node = struct.unpack_from("<IIQQ", buf)
        if op == FUSE_INIT:
            _, _, readahead, _ = struct.unpack_from("<IIII", buf, 40)
            body = struct.pack("<IIIIHHIIHHII", 7, 31, readahead, 0, 16, 12, 65536, 1, 32, 0, 0, 0)
            reply(unique, 0, body + b"\0" * 24)
        elif op == FUSE_LOOKUP:
            name = buf[40:].split(b"\0")[0]
            if name == b"prog":
                reply(unique, 0, struct.pack("<QQQQII", 2, 0, 0, 0, 0, 0) + attr(2))
            elif name == b"stall":
                print("lookup stall", flush=True)  # never answered
            else:
                reply(unique, ENOENT)
        elif op == FUSE_GETATTR:
            reply(unique, 0, struct.pack("<QII", 0, 0, 0) + attr(node))
        elif op == FUSE_OPENDIR:
            reply(unique, 0, struct.pack("<QII", 1, 0, 0))
        elif op == FUSE_OPEN:
            print("open", flush=True)  # never answered
        elif op == FUSE_INTERRUPT:
            (target,) = struct.unpack_from("<Q", buf, 40)
            print("interrupt", flush=True)
            if not deaf:
                reply(target, EINTR)
        elif op in (FUSE_RELEASEDIR, FUSE_READDIR, FUSE_RELEASE, FUSE_FLUSH):
            reply(unique)
        elif op == FUSE_DESTROY:
            return
        elif op in (FUSE_FORGET, FUSE_BATCH_FORGET):
            pass  # no reply
        else:
            reply(unique, ENOSYS)


if __name__ == "__main__":
    main()
