//! A way to kill a sandbox from a process other than the one that started it.
//!
//! Why: the controller's kill switch must not depend on its launcher being responsive (a
//! launcher blocked in a kernel call would otherwise leave every worker running). The
//! controller opens its own pidfd for each sandbox's pid 1 as soon as the launcher reports
//! it: SIGKILL to a pid namespace's init makes the kernel kill every process in that
//! namespace, and the pidfd turns readable only once init has exited — which the kernel
//! lets happen only after every other process of the namespace is gone. So one pidfd both
//! kills a whole sandbox and confirms it is gone, with or without a cgroup, on v1, v2 and
//! rootless alike. On cgroup v2 `cgroup.kill` is written as well.
//!
//! The pid comes from another process, so it could have been recycled by the time it is
//! opened: the handle is only made when the process behind the new pidfd still has the
//! start time the launcher reported (read while the launcher held the sandbox unreaped).

use std::io::{self, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{OFlag, openat};
use nix::sys::signal::Signal;
use nix::sys::stat::Mode;

use super::cgroup::process_start_time;
use super::process::pidfd_signal;

/// A pidfd on a sandbox's pid 1, and its v2 cgroup directory where it has one.
#[derive(Debug)]
pub struct KillHandle {
    pidfd: OwnedFd,
    cgroup: Option<OwnedFd>,
}

impl KillHandle {
    /// Opens a handle on `pid`, which must still be the process that started at
    /// `start_time` (clock ticks since boot, as `/proc/PID/stat` gives it). `cgroup` is the
    /// sandbox's cgroup directory, when it has one.
    pub fn open(pid: i32, start_time: u64, cgroup: Option<&Path>) -> io::Result<KillHandle> {
        let pidfd = pidfd_open(pid)?;
        // Opened first, checked second: if the start time still matches, the process did
        // not end between the two, so the pidfd is on it.
        let now = u32::try_from(pid).ok().and_then(process_start_time);
        if now != Some(start_time) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("process {pid} is no longer the sandbox that was started"),
            ));
        }
        let cgroup = cgroup.and_then(|dir| {
            nix::fcntl::open(
                dir,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .ok()
        });
        Ok(KillHandle { pidfd, cgroup })
    }

    /// Kills the whole sandbox: its pid 1 (and with it its pid namespace) and, on cgroup
    /// v2, everything in its cgroup. Never blocks.
    pub fn kill(&self) {
        let _ = pidfd_signal(self.pidfd.as_fd(), Signal::SIGKILL);
        if let Some(dir) = &self.cgroup {
            // Not on v1 (no such file) or before Linux 5.14: pid 1's death is enough.
            if let Ok(fd) = openat(
                dir,
                "cgroup.kill",
                OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                let _ = std::fs::File::from(fd).write_all(b"1");
            }
        }
    }

    /// Whether every process of the sandbox is gone (pid 1 has exited; the kernel lets it
    /// only after the rest of its namespace).
    pub fn exited(&self) -> bool {
        super::wait::has_exited(self.pidfd.as_fd()).unwrap_or(false)
    }
}

/// `pidfd_open(2)`: a descriptor on the process `pid` is now.
pub(super) fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: pidfd_open takes a pid and flags (none: a pidfd is always close-on-exec)
    // and returns a new descriptor or -1; no memory is passed.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(rc).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recycled_or_wrong_start_time_is_refused() {
        let me = std::process::id();
        let start = process_start_time(me).unwrap_or(0);
        let pid = i32::try_from(me).unwrap_or(0);
        assert!(KillHandle::open(pid, start.wrapping_add(1), None).is_err());
        assert!(KillHandle::open(-1, 0, None).is_err());
        let h = KillHandle::open(pid, start, None);
        assert!(h.as_ref().is_ok_and(|h| !h.exited()), "{h:?}");
    }

    #[test]
    fn a_killed_process_is_seen_to_have_exited() -> io::Result<()> {
        let mut child = std::process::Command::new("sleep").arg("30").spawn()?;
        let pid = i32::try_from(child.id()).unwrap_or(0);
        let start = process_start_time(child.id()).unwrap_or(0);
        let h = KillHandle::open(pid, start, None)?;
        assert!(!h.exited());
        h.kill();
        let _ = child.wait()?;
        // Reaped by its parent: the pidfd still says it exited.
        assert!(h.exited());
        Ok(())
    }
}
