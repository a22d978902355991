//! The launcher ("zygote") process and descriptor passing.
//!
//! Workers are started by a single-threaded process forked from the controller before its
//! async runtime exists: starting a sandbox is fork-like, which is only sound in a process
//! with one thread. The launcher dies with the controller (parent-death signal), and every
//! sandbox dies with the launcher, so no worker can outlive the controller.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use nix::unistd::{ForkResult, Pid};

use super::process;

/// The controller's handle on its launcher.
pub struct LauncherProcess {
    pub pid: Pid,
    /// Requests to the launcher (blocking; may carry descriptors).
    pub requests: UnixStream,
    /// Events from the launcher (hand it to the async runtime).
    pub events: UnixStream,
}

/// Forks the launcher, which runs `serve(requests, events)` and exits with its status.
/// Every other descriptor is closed in the launcher except those in `keep` (what `serve`
/// brings along). Must be called while the process is still single-threaded.
pub fn fork_launcher(
    keep: &[RawFd],
    serve: impl FnOnce(UnixStream, UnixStream) -> i32,
) -> io::Result<LauncherProcess> {
    let (req_parent, req_child) = UnixStream::pair()?;
    let (ev_parent, ev_child) = UnixStream::pair()?;
    let mut kept = vec![req_child.as_raw_fd(), ev_child.as_raw_fd()];
    kept.extend_from_slice(keep);
    // The child's copies of the parent's ends are closed with every other descriptor it
    // does not keep; the parent's copies of the child's ends go with the closure.
    let pid = fork_helper("hatchery-launcher", &kept, move || {
        serve(req_child, ev_child)
    })?;
    Ok(LauncherProcess {
        pid,
        requests: req_parent,
        events: ev_parent,
    })
}

/// Forks a helper process of this one (the launcher, an egress broker) that runs `run`
/// and exits with its status. It dies with this process (parent-death signal), shows as
/// `name` in `ps` (its environment stays: it may read it), and keeps no descriptor above
/// stderr but those in `keep`. Must be called while the process is single-threaded.
pub fn fork_helper(name: &str, keep: &[RawFd], run: impl FnOnce() -> i32) -> io::Result<Pid> {
    process::ensure_single_threaded()?;
    let parent = nix::unistd::getpid();
    // SAFETY: the process is single-threaded (checked above), so the child may run
    // arbitrary code; it never returns into the caller's frames (it exits below).
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        ForkResult::Child => {
            let _ = process::die_with_parent();
            if nix::unistd::getppid() != parent {
                // SAFETY: the parent died before the death signal was armed.
                unsafe { libc::_exit(1) };
            }
            if let Some(title) = process::ProcTitle::current() {
                title.set(name, false);
            }
            process::close_fds_from(3, keep);
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or(70);
            // SAFETY: leave without running the parent's destructors in this copy.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => Ok(child),
    }
}

/// One non-blocking send of (a prefix of) `bytes`, with `fds` attached (SCM_RIGHTS) to
/// what is sent: how many bytes went. `WouldBlock` when nothing could be sent now.
pub fn send_some(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [IoSlice::new(bytes)];
    let cmsgs: Vec<ControlMessage> = if raw.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&raw)]
    };
    loop {
        match sendmsg::<()>(
            sock.as_raw_fd(),
            &iov,
            &cmsgs,
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            None,
        ) {
            Ok(n) => return Ok(n),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// One non-blocking receive into `buf`: the bytes read (0 at end of stream) and the
/// descriptors that came with them. `WouldBlock` when nothing is there now.
pub fn recv_some(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; 8]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = loop {
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(m) => break m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut fds = Vec::new();
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(received) = c {
                for fd in received {
                    // SAFETY: SCM_RIGHTS installed these descriptors in this process for
                    // us; nothing else owns them.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
    }
    Ok((msg.bytes, fds))
}
