//! Waiting, once: for a process to end (`waitid`/`waitpid`, retried on EINTR, so that a
//! signal arriving at the wrong moment never leaves a zombie or a status unread) and for
//! descriptors to become ready before a deadline (`poll`, its timeout derived from the
//! deadline, EINTR taken as "nothing yet").

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;

/// Waits for the process behind `pidfd` to end and collects its status (`None` if it
/// cannot be had: already collected, or not our child).
pub fn reap_pidfd(pidfd: BorrowedFd<'_>) -> Option<WaitStatus> {
    loop {
        match waitid(Id::PIDFd(pidfd), WaitPidFlag::WEXITED) {
            Err(Errno::EINTR) => continue,
            other => break other.ok(),
        }
    }
}

/// Waits for child `pid` to end and collects its status.
pub fn reap_child(pid: Pid) -> nix::Result<WaitStatus> {
    loop {
        match waitpid(pid, None) {
            Err(Errno::EINTR) => continue,
            other => break other,
        }
    }
}

/// The poll(2) timeout that wakes at `deadline` (at least 1 ms away, so a deadline just
/// missed is not a busy loop), at most `cap` away; none without either.
pub fn timeout_until(deadline: Option<Instant>, cap: Option<Duration>) -> PollTimeout {
    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    let wait = match (left, cap) {
        (Some(l), Some(c)) => l.min(c),
        (Some(l), None) => l,
        (None, Some(c)) => c,
        (None, None) => return PollTimeout::NONE,
    };
    PollTimeout::try_from(wait.as_millis().max(1)).unwrap_or(PollTimeout::MAX)
}

/// Polls `fds` until one is ready or `deadline` (see [`timeout_until`]): the number
/// ready, 0 when the time ran out or a signal came first.
pub fn poll_until(
    fds: &mut [PollFd<'_>],
    deadline: Option<Instant>,
    cap: Option<Duration>,
) -> nix::Result<usize> {
    match poll(fds, timeout_until(deadline, cap)) {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        Err(Errno::EINTR) => Ok(0),
        Err(e) => Err(e),
    }
}

/// Whether the process behind `pidfd` has exited, now (its pidfd is readable); an error
/// of poll(2) is the caller's to weigh.
pub fn has_exited(pidfd: BorrowedFd<'_>) -> nix::Result<bool> {
    ready_now(pidfd)
}

/// Whether `fd` has something to read (or its peer hung up), now, without waiting.
pub fn ready_now(fd: BorrowedFd<'_>) -> nix::Result<bool> {
    events_now(fd, PollFlags::POLLIN).map(|r| !r.is_empty())
}

/// Whether the other end of `fd` (a socket) is closed, now, without waiting: hang-up is
/// reported with data still unread, unlike end-of-stream, which a reader sees only after
/// everything sent before the close.
pub fn hung_up_now(fd: BorrowedFd<'_>) -> bool {
    events_now(fd, PollFlags::empty()).is_ok_and(|r| r.contains(PollFlags::POLLHUP))
}

/// What poll(2) reports for `fd` (asked for `events`; hang-up and errors always come),
/// now, without waiting.
fn events_now(fd: BorrowedFd<'_>, events: PollFlags) -> nix::Result<PollFlags> {
    let mut fds = [PollFd::new(fd, events)];
    poll(&mut fds, PollTimeout::ZERO)?;
    Ok(fds
        .first()
        .and_then(PollFd::revents)
        .unwrap_or(PollFlags::empty()))
}

/// Whether `test` held in a forked child of this process (false too if the child could
/// not be started): for tests of what changes a process for good (its credentials, its
/// descriptors), which the test process must keep.
///
/// The child closes every descriptor above stderr but `keep` first: a copy of another
/// test's descriptor (a terminal, a pipe's write end) held by a child would delay the
/// hang-up that test waits for.
#[cfg(test)]
pub(crate) fn holds_in_a_child(keep: &[std::os::fd::RawFd], test: impl FnOnce() -> bool) -> bool {
    // SAFETY: the child makes system calls (and glibc's malloc, which is fork-safe there)
    // and leaves with _exit, never returning into the test harness.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            super::process::close_fds_from(3, keep);
            let ok = test();
            // SAFETY: leave the child without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            matches!(reap_child(child), Ok(WaitStatus::Exited(_, 0)))
        }
        Err(_) => false,
    }
}

/// Whether poll(2) reported anything (readiness, hang-up or error) for `fd`.
pub fn is_ready(fd: &PollFd<'_>) -> bool {
    fd.revents().is_some_and(|r| !r.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn timeouts_follow_the_deadline_within_the_cap() {
        assert_eq!(timeout_until(None, None), PollTimeout::NONE);
        let past = Instant::now().checked_sub(Duration::from_secs(1));
        assert_eq!(
            timeout_until(past, None),
            PollTimeout::from(1u8),
            "a deadline passed still waits a millisecond, never forever"
        );
        let far = Instant::now().checked_add(Duration::from_secs(3600));
        assert_eq!(
            timeout_until(far, Some(Duration::from_secs(60))),
            PollTimeout::from(60_000u16)
        );
    }

    #[test]
    fn a_ready_descriptor_is_seen_and_a_quiet_one_times_out() -> std::io::Result<()> {
        let (r, w) = nix::unistd::pipe()?;
        let mut fds = [PollFd::new(r.as_fd(), PollFlags::POLLIN)];
        let soon = Instant::now().checked_add(Duration::from_millis(5));
        assert_eq!(poll_until(&mut fds, soon, None)?, 0);
        assert!(!fds.iter().any(is_ready));
        nix::unistd::write(&w, b"x")?;
        let mut fds = [PollFd::new(r.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll_until(&mut fds, None, None)?, 1);
        assert!(fds.iter().all(is_ready));
        Ok(())
    }

    #[test]
    fn a_child_is_reaped_once() -> std::io::Result<()> {
        let mut child = std::process::Command::new("true").spawn()?;
        let pid = Pid::from_raw(i32::try_from(child.id()).map_err(std::io::Error::other)?);
        assert!(matches!(reap_child(pid), Ok(WaitStatus::Exited(_, 0))));
        assert!(reap_child(pid).is_err(), "already collected");
        drop(child.stdin.take());
        Ok(())
    }
}
