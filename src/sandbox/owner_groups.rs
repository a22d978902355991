//! Which read-write exposures' groups the sandbox takes with their owners' rights, asked
//! of the host's user database in a helper process under a deadline.
//!
//! The user database is whatever NSS module the host names (LDAP, sssd, files on a
//! network filesystem), and one that never answers would hold the start, and with it the
//! controller's launcher, which starts every worker. The helper is killed at the
//! deadline and the start refused; the module's threads and memory also stay out of the
//! process the sandbox is cloned from.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Uid;

/// How long the user database may take to say which groups the exposures' owners are
/// in, for all of them together.
pub const DEADLINE: Duration = Duration::from_secs(5);

/// How long a helper killed at the deadline is waited for. One blocked in the kernel (a
/// stalled network or FUSE filesystem under the database) cannot die until that answers,
/// and the caller (the controller's launcher among them) must not wait with it.
const REAP_GRACE: Duration = Duration::from_secs(1);

/// How many killed helpers may still be waiting to end before no new one is started:
/// each is reaped at a later lookup once it has ended.
const STUCK_MAX: usize = 8;

/// After the database has gone silent (see [`SILENT`]), how long this process does not
/// ask it again, refusing at once instead: the controller's launcher, one process that
/// starts every worker, would otherwise spend another [`DEADLINE`] on each start with a
/// read-write directory, and the workers without one would wait behind them.
const QUIET_AFTER_NO_ANSWER: Duration = Duration::from_secs(30);

/// How long one question may go unanswered before the database counts as silent, not
/// slow, at the deadline. A database that kept answering until the deadline is slow:
/// only the start that asked so much is refused (a worker may ask about many directories,
/// and must not silence the database for the others). One that stopped answering, from
/// the first question or after some, is silent.
const SILENT: Duration = Duration::from_millis(2500);

/// When the database last went silent.
static LAST_NO_ANSWER: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);

/// Killed helpers that had not ended within [`REAP_GRACE`].
static STUCK: std::sync::Mutex<Vec<nix::unistd::Pid>> = std::sync::Mutex::new(Vec::new());

/// The group of a read-write exposure whose rights the sandbox takes with its owner's:
/// `gid` when `uid` belongs to it (its primary group, or a member by the host's group
/// database), never root's. A directory's group can be any the host's root chose, one its
/// owner cannot read through (`shadow`, `disk`). An owner the host's user database does
/// not know belongs to no group here, nor does one whose name is not UTF-8 (the name is
/// read lossily, and another name's groups would be asked for).
///
/// This asks the user database in the calling process, with no deadline: see
/// [`owners_groups`].
pub fn owners_group(uid: u32, gid: u32) -> Option<u32> {
    if gid == 0 {
        return None;
    }
    let user = nix::unistd::User::from_uid(Uid::from_raw(uid))
        .ok()
        .flatten()?;
    if user.gid.as_raw() == gid {
        return Some(gid);
    }
    if user.name.contains(char::REPLACEMENT_CHARACTER) {
        return None;
    }
    let name = std::ffi::CString::new(user.name).ok()?;
    nix::unistd::getgrouplist(&name, user.gid)
        .ok()?
        .iter()
        .any(|g| g.as_raw() == gid)
        .then_some(gid)
}

/// Why the owners' groups are not known.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error(
        "the host's user database did not answer within {} s ({answered} of {asked} questions answered)",
        .deadline.as_secs()
    )]
    NoAnswer {
        deadline: Duration,
        answered: usize,
        asked: usize,
        /// How long the last question had waited at the deadline.
        waited: Duration,
    },
    #[error(
        "the host's user database did not answer {} s ago, and is not asked again for {} s after that",
        .0.as_secs(),
        QUIET_AFTER_NO_ANSWER.as_secs()
    )]
    NoAnswerLately(Duration),
    #[error(
        "{0} earlier lookups in the host's user database are still stuck in the kernel after being killed"
    )]
    Stuck(usize),
    #[error("the helper asking the host's user database failed: {0}")]
    Helper(#[from] io::Error),
    /// The caller was told to stop (`run`'s ^C) while it waited for the answers.
    #[error("{0} came while the host's user database was being asked")]
    Stopped(Signal),
}

/// [`owners_group`] for each `(uid, gid)` of `keys`, in order, asked in a child process
/// that is killed if the answers are not all in by `deadline` from now, or as soon as one
/// of the signals that stop a start ([`super::init::STOPPING`]) is pending, when the
/// caller blocks it to read it later (`run` does). The caller must be single-threaded
/// (checked): the child is forked from it.
pub fn owners_groups(
    keys: &[(u32, u32)],
    deadline: Duration,
) -> Result<Vec<Option<u32>>, LookupError> {
    // Root's group is never the sandbox's: no question to ask.
    if keys.iter().all(|&(_, gid)| gid == 0) {
        return Ok(vec![None; keys.len()]);
    }
    let stuck = reap_stuck();
    if stuck >= STUCK_MAX {
        return Err(LookupError::Stuck(stuck));
    }
    if let Some(ago) = silent_lately() {
        return Err(LookupError::NoAnswerLately(ago));
    }
    super::process::ensure_single_threaded()?;
    let stop = stop_signals()?;
    let until = Instant::now() + deadline;
    let (answers_r, answers_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let supervisor = nix::unistd::getpid();
    // SAFETY: the caller is single-threaded (checked above), so the child is a whole copy
    // of it and may allocate and call into NSS; it leaves by _exit, never returning.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Child => {
            drop(answers_r);
            // Nothing of the caller's stays open in a helper that may outlive the caller's
            // wait for it: not its id lease or its sandboxes' channels, and not its standard
            // output and error, whose reader would wait for the helper too.
            super::process::close_fds_from(3, &[answers_w.as_raw_fd()]);
            let quiet = nix::fcntl::open(
                "/dev/null",
                nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            );
            let quiet = quiet.is_ok_and(|null| {
                nix::unistd::dup2_stdin(&null).is_ok()
                    && nix::unistd::dup2_stdout(&null).is_ok()
                    && nix::unistd::dup2_stderr(&null).is_ok()
            });
            if !quiet {
                // SAFETY: leave without running the parent's destructors in this copy.
                unsafe { libc::_exit(1) }
            }
            // Named for what it does, not as its parent (a helper stuck in the kernel may
            // be seen long after its parent is gone).
            // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes from a
            // static string.
            unsafe { libc::prctl(libc::PR_SET_NAME, c"hatchery-lookup".as_ptr()) };
            // SAFETY: PR_SET_PDEATHSIG takes a signal number; no pointers.
            let dies_with_parent =
                unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } == 0;
            if !dies_with_parent || nix::unistd::getppid() != supervisor {
                // SAFETY: leave without running the parent's destructors in this copy.
                unsafe { libc::_exit(1) }
            }
            // Each answer as it comes: the caller tells a slow database from a silent one.
            for &(uid, gid) in keys {
                let answer = [u8::from(owners_group(uid, gid).is_some())];
                loop {
                    match nix::unistd::write(&answers_w, &answer) {
                        Err(nix::errno::Errno::EINTR) => {}
                        Ok(1) => break,
                        // SAFETY: as above.
                        _ => unsafe { libc::_exit(1) },
                    }
                }
            }
            // SAFETY: as above.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(answers_w);
            let answers = read_answers(&answers_r, stop.as_ref(), keys.len(), until, deadline);
            remember(&answers);
            if answers.is_err() {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                reap_within(child, REAP_GRACE);
            } else {
                let _ = super::wait::reap_child(child);
            }
            let answers = answers?;
            Ok(keys
                .iter()
                .zip(answers)
                .map(|(&(_, gid), yes)| (yes == 1).then_some(gid))
                .collect())
        }
    }
}

/// Notes whether the database went silent (a question waiting [`SILENT`] or more at the
/// deadline: see [`QUIET_AFTER_NO_ANSWER`]); any other outcome ends a quiet time.
fn remember(outcome: &Result<Vec<u8>, LookupError>) {
    if let Ok(mut last) = LAST_NO_ANSWER.lock() {
        *last = match outcome {
            Err(LookupError::NoAnswer { waited, .. }) if *waited >= SILENT => Some(Instant::now()),
            _ => None,
        };
    }
}

/// Whether the database is in its quiet time: when it went silent, if it did lately.
fn silent_lately() -> Option<Duration> {
    let last = LAST_NO_ANSWER.lock().ok().and_then(|last| *last)?;
    Some(last.elapsed()).filter(|ago| *ago < QUIET_AFTER_NO_ANSWER)
}

/// Reaps the killed helper `child` if it ends within `grace`; otherwise leaves it to
/// [`reap_stuck`] (a process that ends its caller first is its init's to reap).
fn reap_within(child: nix::unistd::Pid, grace: Duration) {
    let ended = super::handle::pidfd_open(child.as_raw()).is_ok_and(|pidfd| {
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if super::wait::poll_until(&mut fds, Some(until), None).unwrap_or(0) > 0 {
                return true;
            }
        }
        false
    });
    if ended {
        let _ = super::wait::reap_child(child);
    } else if let Ok(mut stuck) = STUCK.lock() {
        stuck.push(child);
    }
}

/// Reaps the killed helpers that have ended since; how many are still stuck.
fn reap_stuck() -> usize {
    let Ok(mut stuck) = STUCK.lock() else {
        return STUCK_MAX;
    };
    stuck.retain(|pid| {
        matches!(
            nix::sys::wait::waitpid(*pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG)),
            Ok(nix::sys::wait::WaitStatus::StillAlive)
        )
    });
    stuck.len()
}

/// A descriptor that becomes readable when one of the signals that stop a start is
/// pending, for those of them the caller blocks (whose default action would otherwise
/// end it at once, or whose handler would interrupt the wait); `None` when it blocks none.
fn stop_signals() -> io::Result<Option<SignalFd>> {
    let mut blocked = SigSet::empty();
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, None, Some(&mut blocked))?;
    let mut stopping = SigSet::empty();
    for sig in super::init::STOPPING {
        if blocked.contains(sig) {
            stopping.add(sig);
        }
    }
    if stopping == SigSet::empty() {
        return Ok(None);
    }
    let flags = SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK;
    Ok(Some(SignalFd::with_flags(&stopping, flags)?))
}

/// The signal pending on `stop`, taken from the queue: the caller learns it from the
/// error, and ends as it would have ended it.
fn taken_signal(stop: &SignalFd) -> Option<Signal> {
    let info = stop.read_signal().ok().flatten()?;
    Signal::try_from(i32::try_from(info.ssi_signo).ok()?).ok()
}

/// `n` answer bytes from the helper, or why not by `until` (or a signal on `stop`).
fn read_answers(
    from: &std::os::fd::OwnedFd,
    stop: Option<&SignalFd>,
    n: usize,
    until: Instant,
    deadline: Duration,
) -> Result<Vec<u8>, LookupError> {
    let mut got = vec![0u8; n];
    let mut filled = 0usize;
    let mut last_answer = Instant::now();
    let mut fds: Vec<PollFd<'_>> = std::iter::once(from.as_fd())
        .chain(stop.map(AsFd::as_fd))
        .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
        .collect();
    while filled < n {
        let now = Instant::now();
        if now >= until {
            return Err(LookupError::NoAnswer {
                deadline,
                answered: filled,
                asked: n,
                waited: now.saturating_duration_since(last_answer),
            });
        }
        if super::wait::poll_until(&mut fds, Some(until), None).map_err(io::Error::from)? == 0 {
            continue;
        }
        if fds.get(1).is_some_and(super::wait::is_ready) {
            if let Some(sig) = stop.and_then(taken_signal) {
                return Err(LookupError::Stopped(sig));
            }
        }
        if !fds.first().is_some_and(super::wait::is_ready) {
            continue;
        }
        let rest = got.get_mut(filled..).unwrap_or_default();
        match nix::unistd::read(from, rest) {
            Ok(0) => {
                return Err(LookupError::Helper(io::Error::other(
                    "it ended before it answered",
                )));
            }
            Ok(k) => {
                filled = filled.saturating_add(k);
                last_answer = Instant::now();
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(LookupError::Helper(e.into())),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_silent_database_is_left_alone_for_a_while() {
        let no_answer = |answered, waited| {
            Err(LookupError::NoAnswer {
                deadline: DEADLINE,
                answered,
                asked: 40,
                waited,
            })
        };
        // Slow: answers kept coming until the deadline. Only that start is refused.
        remember(&no_answer(30, Duration::from_millis(100)));
        assert_eq!(silent_lately(), None);
        // Silent after some answers, or from the first question.
        remember(&no_answer(1, DEADLINE));
        assert!(silent_lately().is_some());
        remember(&no_answer(0, DEADLINE));
        assert!(silent_lately().is_some());
        // It answers again.
        remember(&Ok(vec![1]));
        assert_eq!(silent_lately(), None);
    }

    #[test]
    fn answers_that_stop_coming_are_counted() {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        nix::unistd::write(&w, &[1, 0]).unwrap();
        let until = Instant::now() + Duration::from_millis(200);
        match read_answers(&r, None, 5, until, Duration::from_millis(200)) {
            Err(LookupError::NoAnswer {
                answered,
                asked,
                waited,
                ..
            }) => {
                assert_eq!((answered, asked), (2, 5));
                assert!(waited >= Duration::from_millis(150), "{waited:?}");
            }
            other => panic!("{other:?}"),
        }
        drop(w);
    }

    #[test]
    fn roots_group_needs_no_helper_and_is_never_the_sandboxs() {
        assert_eq!(
            owners_groups(&[(1000, 0), (0, 0)], DEADLINE).ok(),
            Some(vec![None, None])
        );
    }
}
