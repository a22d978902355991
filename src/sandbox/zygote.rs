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
    process::ensure_single_threaded()?;
    let (req_parent, req_child) = UnixStream::pair()?;
    let (ev_parent, ev_child) = UnixStream::pair()?;
    let parent = nix::unistd::getpid();
    // SAFETY: the process is single-threaded (checked above), so the child may run
    // arbitrary code; it never returns into the caller's frames (it exits below).
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        ForkResult::Child => {
            drop(req_parent);
            drop(ev_parent);
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            if nix::unistd::getppid() != parent {
                // SAFETY: the controller died before the death signal was armed.
                unsafe { libc::_exit(1) };
            }
            let mut kept = vec![req_child.as_raw_fd(), ev_child.as_raw_fd()];
            kept.extend_from_slice(keep);
            process::close_fds_from(3, &kept);
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                serve(req_child, ev_child)
            }))
            .unwrap_or(70);
            // SAFETY: leave without running the controller's destructors in this copy.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => Ok(LauncherProcess {
            pid: child,
            requests: req_parent,
            events: ev_parent,
        }),
    }
}

/// Sends `bytes` with `fds` attached (SCM_RIGHTS), all of it.
pub fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = 0;
    while sent < bytes.len() {
        let iov = [IoSlice::new(&bytes[sent..])];
        let cmsgs: Vec<ControlMessage> = if sent == 0 && !raw.is_empty() {
            vec![ControlMessage::ScmRights(&raw)]
        } else {
            Vec::new()
        };
        match sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) => sent += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes, collecting any descriptors that arrive with them.
/// `Ok(None)` if the peer closed before the first byte.
pub fn recv_exact_with_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<Option<Vec<OwnedFd>>> {
    let mut fds = Vec::new();
    let mut got = 0;
    while got < buf.len() {
        let mut space = nix::cmsg_space!([RawFd; 4]);
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let msg = match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let n = msg.bytes;
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(received) = c {
                    for fd in received {
                        // SAFETY: SCM_RIGHTS installed these descriptors in this process
                        // for us; nothing else owns them.
                        fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                    }
                }
            }
        }
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "truncated message",
            ));
        }
        got += n;
    }
    Ok(Some(fds))
}
