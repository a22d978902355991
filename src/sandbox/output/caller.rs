//! How the pump touches a caller's descriptor (see the module above): which way it is
//! read or written without the supervisor ever waiting ([`Mode`], [`caller_end`]), the
//! calls that never wait on a description others share, and whether two descriptors reach
//! one place ([`same_destination`]).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::MsgFlags;

use super::super::tty;

/// How a descriptor is read or written without blocking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// A regular file: never waits (for a reader or a writer). So too a caller's pipe end
    /// opened the other way (a write-only stdin, a read-only stdout): every call to it
    /// fails at once (EBADF), which ends the stream and, for output, says why.
    File,
    /// A non-blocking description of the pump's own: read or written until EAGAIN.
    NonBlocking,
    /// The caller's device (other than a terminal), or a pipe that could not be opened
    /// again: touched only after poll(2) reported it ready, and then written at most
    /// `PIPE_BUF` bytes at a time, read once. Another process sharing it may still take
    /// the bytes or the room between that poll and the call, which then waits.
    AfterPoll,
    /// The caller's socket: read and written with `MSG_DONTWAIT`, which asks the one call
    /// not to wait and leaves the description others share as it is.
    Socket,
    /// The caller's pty master, which cannot be opened again (that makes a new pty) and
    /// whose POLLOUT promises room for one byte only: written with `O_NONBLOCK` set on the
    /// shared description for the length of the call, then put back. A write that would
    /// have blocked (the pty's reader stopped reading) held the supervisor, and with it the
    /// timeout. Others writing to the description meanwhile see EAGAIN only where they
    /// would have waited.
    BriefNonBlocking,
}

/// `call` on `fd` with `O_NONBLOCK` set on its open file description for the call alone
/// (where it was not set already), the flags put back after it. What the call did is said
/// even if the flags cannot be put back: an error here made the pump write the same bytes
/// again.
pub(super) fn nonblocking_once(
    fd: BorrowedFd<'_>,
    call: impl FnOnce() -> nix::Result<usize>,
) -> nix::Result<usize> {
    let found = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    if found.contains(OFlag::O_NONBLOCK) {
        return call();
    }
    fcntl(fd, FcntlArg::F_SETFL(found | OFlag::O_NONBLOCK))?;
    let done = call();
    let _ = fcntl(fd, FcntlArg::F_SETFL(found));
    done
}

/// One `recv` from the caller's socket `fd` that never waits.
pub(super) fn recv_nonblocking(fd: BorrowedFd<'_>, buf: &mut [u8]) -> nix::Result<usize> {
    use std::os::fd::AsRawFd;
    nix::sys::socket::recv(fd.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT)
}

/// One `send` to the caller's socket `fd` that never waits, nor raises SIGPIPE: a peer
/// that has gone is an error for this stream alone.
pub(super) fn send_nonblocking(fd: BorrowedFd<'_>, bytes: &[u8]) -> nix::Result<usize> {
    use std::os::fd::AsRawFd;
    nix::sys::socket::send(
        fd.as_raw_fd(),
        bytes,
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
    )
}

/// `write` to `fd` without waiting (see [`nonblocking_once`]).
pub(super) fn write_nonblocking(fd: BorrowedFd<'_>, bytes: &[u8]) -> nix::Result<usize> {
    nonblocking_once(fd, || nix::unistd::write(fd, bytes))
}

/// One read from `fd` that never waits, its open file description shared with others: a
/// pty master another process reads too may have been emptied by it between the poll
/// that found bytes and this read, which would then wait for the next (and `--timeout`
/// with it).
pub(super) fn read_nonblocking(fd: BorrowedFd<'_>, buf: &mut [u8]) -> nix::Result<usize> {
    nonblocking_once(fd, || nix::unistd::read(fd, buf))
}

/// Whether `fd` reports `flag` now.
pub(super) fn ready_now(fd: BorrowedFd<'_>, flag: PollFlags) -> bool {
    let mut fds = [PollFd::new(fd, flag)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0]
            .revents()
            .is_some_and(|r| r.intersects(flag | PollFlags::POLLHUP | PollFlags::POLLERR))
}

/// Whether what is written to `a` and to `b` reaches one place, in the order it was
/// written: the same pipe, socket, terminal or device, or, for a regular file, the same
/// open file description (`>log 2>&1`; two descriptions of one file each have an offset
/// of their own, and the caller asked for that; two opens of `/dev/ptmx` are two ptys). The usual case of a relayed stdout and
/// stderr: given one pipe for both, the payload's writes keep their order, which two
/// pipes read in turn lose.
pub fn same_destination(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    let (Ok(sa), Ok(sb)) = (nix::sys::stat::fstat(a), nix::sys::stat::fstat(b)) else {
        return false;
    };
    if (sa.st_dev, sa.st_ino) != (sb.st_dev, sb.st_ino) {
        return false;
    }
    // Every pty master is the one `/dev/ptmx` inode: each open is a pty of its own.
    let one_inode_many_places = sa.st_mode & libc::S_IFMT == libc::S_IFREG || tty::is_pty_master(a);
    !one_inode_many_places || same_open_file(a, b)
}

/// Whether `a` and `b` are one open file description (kcmp(2) `KCMP_FILE`); false where
/// the kernel cannot say (built without kcmp).
fn same_open_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    const KCMP_FILE: libc::c_int = 0;
    let me = nix::unistd::getpid().as_raw();
    // SAFETY: kcmp reads only its integer arguments; both descriptors are borrowed, so
    // open for the call's length.
    let order = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            me,
            me,
            KCMP_FILE,
            a.as_raw_fd(),
            b.as_raw_fd(),
        )
    };
    order == 0
}

/// A caller's descriptor to read or write without blocking: a regular file as it is, a
/// pty master with `O_NONBLOCK` set for each call, a terminal or a pipe through a
/// non-blocking description of our own, a socket with `MSG_DONTWAIT`, any other device
/// after poll(2). `access` is how the pump uses it (`O_RDONLY`, `O_WRONLY`; `O_RDWR` for
/// a terminal).
pub(super) fn caller_end(fd: OwnedFd, access: OFlag) -> io::Result<(OwnedFd, Mode)> {
    let st = nix::sys::stat::fstat(&fd).map_err(io::Error::from)?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => return Ok((fd, Mode::File)),
        libc::S_IFSOCK => return Ok((fd, Mode::Socket)),
        libc::S_IFIFO => {
            return Ok(match opened_for(fd.as_fd(), access) {
                // Only the way the caller's own description goes: the other end of its
                // pipe is someone else's (a write-only stdin's reader, a read-only
                // stdout's writer). Used the wrong way, the caller's end fails at once
                // (EBADF).
                Some(false) => (fd, Mode::File),
                // Its way unknown (F_GETFL failed): after poll(2), as any other device.
                None => (fd, Mode::AfterPoll),
                Some(true) => match reopen_pipe_nonblocking(fd.as_fd(), access, &st) {
                    Ok(own) => (own, Mode::NonBlocking),
                    // Where it cannot be opened again, as a pty master: never a call
                    // that waits, at the cost of the flag set for its length.
                    Err(_) => (fd, Mode::BriefNonBlocking),
                },
            });
        }
        _ => {}
    }
    // A master cannot be opened again (that makes a new pty): its flags are set briefly.
    if tty::is_pty_master_device(st.st_mode, st.st_rdev) {
        return Ok((fd, Mode::BriefNonBlocking));
    }
    if tty::is_terminal(fd.as_fd()) {
        if let Ok(own) = tty::reopen_nonblocking(fd.as_fd()) {
            return Ok((own, Mode::NonBlocking));
        }
    }
    Ok((fd, Mode::AfterPoll))
}

/// Whether the caller's `fd` was opened for `access` (`O_RDONLY`, `O_WRONLY`, `O_RDWR`);
/// `None` where that cannot be read.
fn opened_for(fd: BorrowedFd<'_>, access: OFlag) -> Option<bool> {
    let flags = fcntl(fd, FcntlArg::F_GETFL).ok()?;
    let mode = OFlag::from_bits_retain(flags) & OFlag::O_ACCMODE;
    Some(mode == OFlag::O_RDWR || mode == access)
}

/// The caller's pipe (or FIFO) `fd`, whose status is `st`, opened once more through
/// `/proc/self/fd` as a non-blocking description of the pump's own, for `access`: the
/// same pipe, so the same bytes and room, but its flags are ours. Another process sharing
/// the caller's description (a second reader of a stdin pipe, a second writer filling a
/// stdout pipe) may take what poll(2) reported between the poll and the call; on a
/// blocking description that call then waited, and `--timeout` with it. Fails where the
/// pipe cannot be opened again (no `/proc`; a FIFO whose mode refuses us; no reader left,
/// for writing), or what opened is not that pipe.
fn reopen_pipe_nonblocking(
    fd: BorrowedFd<'_>,
    access: OFlag,
    st: &nix::sys::stat::FileStat,
) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let own = nix::fcntl::open(
        format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
        access | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io::Error::from)?;
    let same =
        nix::sys::stat::fstat(&own).is_ok_and(|o| (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino));
    if !same {
        return Err(io::Error::other(
            "what /proc/self/fd opened is not the caller's pipe",
        ));
    }
    Ok(own)
}
