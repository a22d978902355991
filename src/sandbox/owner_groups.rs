//! Which read-write exposures' groups the sandbox takes with their owners' rights, asked
//! of the host's user database in a helper process under a deadline.
//!
//! The user database is whatever NSS module the host names (LDAP, sssd, files on a
//! network filesystem), and one that never answers would hold the start, and with it the
//! controller's launcher, which starts every worker. The helper is killed at the
//! deadline and the start refused; the module's threads and memory also stay out of the
//! process the sandbox is cloned from.

use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};
use nix::unistd::Uid;

/// How long the user database may take to say which groups the exposures' owners are
/// in, for all of them together.
pub const DEADLINE: Duration = Duration::from_secs(5);

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
    #[error("the host's user database did not answer within {} s", .0.as_secs())]
    NoAnswer(Duration),
    #[error("the helper asking the host's user database failed: {0}")]
    Helper(#[from] io::Error),
}

/// [`owners_group`] for each `(uid, gid)` of `keys`, in order, asked in a child process
/// that is killed if the answers are not all in by `deadline` from now. The caller must be
/// single-threaded (checked): the child is forked from it.
pub fn owners_groups(
    keys: &[(u32, u32)],
    deadline: Duration,
) -> Result<Vec<Option<u32>>, LookupError> {
    // Root's group is never the sandbox's: no question to ask.
    if keys.iter().all(|&(_, gid)| gid == 0) {
        return Ok(vec![None; keys.len()]);
    }
    super::process::ensure_single_threaded()?;
    let until = Instant::now() + deadline;
    let (answers_r, answers_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let supervisor = nix::unistd::getpid();
    // SAFETY: the caller is single-threaded (checked above), so the child is a whole copy
    // of it and may allocate and call into NSS; it leaves by _exit, never returning.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Child => {
            drop(answers_r);
            // SAFETY: PR_SET_PDEATHSIG takes a signal number; no pointers.
            let dies_with_parent =
                unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } == 0;
            if !dies_with_parent || nix::unistd::getppid() != supervisor {
                // SAFETY: leave without running the parent's destructors in this copy.
                unsafe { libc::_exit(1) }
            }
            let answers: Vec<u8> = keys
                .iter()
                .map(|&(uid, gid)| u8::from(owners_group(uid, gid).is_some()))
                .collect();
            let mut left: &[u8] = &answers;
            while !left.is_empty() {
                match nix::unistd::write(&answers_w, left) {
                    Ok(n) if n > 0 => left = left.get(n..).unwrap_or_default(),
                    Err(nix::errno::Errno::EINTR) => {}
                    _ => break,
                }
            }
            // SAFETY: as above.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(answers_w);
            let answers = read_answers(&answers_r, keys.len(), until, deadline);
            if answers.is_err() {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            }
            let _ = super::wait::reap_child(child);
            let answers = answers?;
            Ok(keys
                .iter()
                .zip(answers)
                .map(|(&(_, gid), yes)| (yes == 1).then_some(gid))
                .collect())
        }
    }
}

/// `n` answer bytes from the helper, or why not by `until`.
fn read_answers(
    from: &std::os::fd::OwnedFd,
    n: usize,
    until: Instant,
    deadline: Duration,
) -> Result<Vec<u8>, LookupError> {
    let mut got = vec![0u8; n];
    let mut filled = 0usize;
    while filled < n {
        if Instant::now() >= until {
            return Err(LookupError::NoAnswer(deadline));
        }
        let mut fds = [PollFd::new(from.as_fd(), PollFlags::POLLIN)];
        if super::wait::poll_until(&mut fds, Some(until), None).map_err(io::Error::from)? == 0 {
            continue;
        }
        let rest = got.get_mut(filled..).unwrap_or_default();
        match nix::unistd::read(from, rest) {
            Ok(0) => {
                return Err(LookupError::Helper(io::Error::other(
                    "it ended before it answered",
                )));
            }
            Ok(k) => filled = filled.saturating_add(k),
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
    fn roots_group_needs_no_helper_and_is_never_the_sandboxs() {
        assert_eq!(
            owners_groups(&[(1000, 0), (0, 0)], DEADLINE).ok(),
            Some(vec![None, None])
        );
    }
}
