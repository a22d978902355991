"""Tries the known ways around an executable allowlist, from inside a sandbox.

Run by the one allowed interpreter, as the README's "Only the listed files run" shows:

    mkdir -p /tmp/demo && cp -r examples/allow-exec /tmp/demo/agent
    hatchery run --allow-exec /usr/bin/python3.11 --allow-exec /tmp/demo/agent/tool.pl \\
        --ro /tmp/demo/agent --report r.json -- python3 /tmp/demo/agent/escape.py

Each line names an attempt and what the kernel answered. Under the allowlist every way
out fails, except the loader run on a program in a readable directory (`git` below),
which the README lists among the limits.
"""

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def show(label, result):
    print(f"{label:<42} {result}", flush=True)


def refused(e):
    return f"{e.strerror} (errno {e.errno})"


def run(label, argv):
    """Runs argv and shows its exit status and first line of output."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except OSError as e:
        show(label, refused(e))
        return
    first = (p.stdout.strip() or p.stderr.strip()).splitlines()
    show(label, f"exit {p.returncode} {first[0] if first else ''}".rstrip())


def loader():
    """The ELF loader this interpreter was started with (it is allowed with it)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "/ld-linux" in path or "/ld-musl" in path or os.path.basename(path).startswith("ld-"):
                return path
    return "/lib64/ld-linux-x86-64.so.2"


def main():
    ld = loader()
    run("run /usr/bin/id", ["/usr/bin/id"])
    copy = "/tmp/py"
    try:
        shutil.copy(sys.executable, copy)
        os.chmod(copy, 0o755)
    except OSError as e:
        show("copy python to /tmp", refused(e))
    run("run a copy of python in /tmp", [copy, "-c", "print(1)"])
    run("run a #!/usr/bin/perl script", [os.path.join(HERE, "tool.pl")])
    run("ld.so /usr/bin/perl", [ld, "/usr/bin/perl", "-e", "print 1"])
    run("ld.so /tmp/py (the copy)", [ld, copy, "-c", "print(1)"])
    try:
        fd = os.memfd_create("payload", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.close(fd)
        show("memfd_create (sealed, for ld.so)", "created (not refused)")
    except OSError as e:
        show("memfd_create (sealed, for ld.so)", refused(e))
    run("ld.so /usr/lib/git-core/git --version", [ld, "/usr/lib/git-core/git", "--version"])
    run("python3 itself", [sys.executable, "-c", "print('allowed')"])


if __name__ == "__main__":
    main()
