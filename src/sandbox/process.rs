//! Process plumbing shared by the launch pipeline: pidfd signalling, descriptor hygiene,
//! signal dispositions, and the exec with an in-sandbox PATH search.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::signal::{SigSet, SigmaskHow, Signal};

use super::step::{Step, StepResult};

/// Sends `sig` to the process behind `pidfd` (no pid-reuse race).
pub fn pidfd_signal(pidfd: BorrowedFd<'_>, sig: Signal) -> io::Result<()> {
    // SAFETY: pidfd_send_signal with a valid pidfd, a valid signal, no siginfo, no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Fails unless the calling process has exactly one thread: the sandbox is started with
/// fork-like clone semantics, which are only sound in a single-threaded process.
pub fn ensure_single_threaded() -> io::Result<()> {
    let n = std::fs::read_dir("/proc/self/task")?.count();
    if n == 1 {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "sandboxes must be started from a single-threaded process (this one has {n} threads)"
        )))
    }
}

/// Closes every descriptor at or above `from` except those in `keep` (sorted or not).
///
/// Why: a host descriptor that survives into the sandbox is a way out of its root — a
/// directory fd left open across execve became a container's working directory in
/// CVE-2024-21626 (runc, "Leaky Vessels").
pub fn close_fds_from(from: RawFd, keep: &[RawFd]) {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|k| *k >= from).collect();
    keep.sort_unstable();
    let mut lo = from;
    for k in keep.iter().copied().chain(std::iter::once(RawFd::MAX)) {
        if k > lo {
            let hi = if k == RawFd::MAX {
                u32::MAX
            } else {
                (k - 1) as u32
            };
            // SAFETY: close_range on descriptors this process owns; no memory is touched.
            unsafe {
                libc::syscall(libc::SYS_close_range, lo as u32, hi, 0u32);
            }
        }
        lo = k.saturating_add(1);
    }
}

/// Marks every descriptor at or above `from` close-on-exec except those in `keep`.
pub fn cloexec_fds_from(from: RawFd, keep: &[RawFd]) {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    for fd in fds {
        if fd >= from && !keep.contains(&fd) {
            // SAFETY: F_SETFD on a descriptor number; a stale number just fails with EBADF.
            unsafe {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
    }
}

/// Installs `src` as descriptor number `dst` (not close-on-exec).
pub fn install_fd(src: RawFd, dst: RawFd) -> io::Result<()> {
    if src == dst {
        // SAFETY: clearing FD_CLOEXEC on a descriptor we own.
        let rc = unsafe { libc::fcntl(dst, libc::F_SETFD, 0) };
        return if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        };
    }
    // SAFETY: dup2 onto a number the payload will own; the old target (if any) is replaced.
    if unsafe { libc::dup2(src, dst) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Installs the payload's descriptors: each `(source, target)` of `fds` at its target
/// number (not close-on-exec), a closed stdio source replaced by `/dev/null`, and every
/// other descriptor closed except the channel `chan` (close-on-exec, kept to report an
/// exec failure; moved out of the way first if a target takes its number). Returns the
/// channel, wherever it now is.
pub fn install_descriptors<'a>(
    fds: &[(RawFd, RawFd)],
    chan: &'a OwnedFd,
) -> Result<BorrowedFd<'a>, Step> {
    let chan_fd = chan.as_raw_fd();
    // Staged copies go above every target, so that none is overwritten before it is
    // installed. Not at a fixed number: one at or past the open-file limit is refused
    // (EINVAL), and under a limit of 100 or less a fixed 100 made every stdio source
    // pass for a closed one, and the command ran with /dev/null for its output.
    let above = fds
        .iter()
        .map(|(_, dst)| *dst)
        .fold(2, RawFd::max)
        .saturating_add(1);
    let mut staged = Vec::new();
    for (src, dst) in fds {
        // Move every source out of the way first so no target overwrites a later source.
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor number; a closed one fails with EBADF.
        let hi = unsafe { libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, above) };
        let closed = hi < 0 && last_errno_or_ebadf() == libc::EBADF;
        let hi = if hi >= 0 {
            hi
        } else if closed && src == dst && *dst <= 2 {
            // The caller's own stdio is closed: give the payload /dev/null there instead,
            // staged above the targets like every other source. Where open puts it, the
            // lowest free number, may be another pair's target, installed (overwritten)
            // before this copy of /dev/null is.
            let null = nix::fcntl::open(
                "/dev/null",
                nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .step("open /dev/null for stdio")?;
            // SAFETY: F_DUPFD_CLOEXEC on the descriptor just opened; `null` closes it.
            let raised = unsafe { libc::fcntl(null.as_raw_fd(), libc::F_DUPFD_CLOEXEC, above) };
            if raised < 0 {
                return Err(Step::new("open /dev/null for stdio", last_errno_or_ebadf()));
            }
            raised
        } else {
            return Err(Step::new("duplicate descriptors", last_errno_or_ebadf()));
        };
        staged.push((hi, *dst));
    }
    let moved_chan = if fds.iter().any(|(_, dst)| *dst == chan_fd) {
        // SAFETY: F_DUPFD_CLOEXEC on the channel descriptor, which is open.
        let fd = unsafe { libc::fcntl(chan_fd, libc::F_DUPFD_CLOEXEC, above) };
        if fd < 0 {
            return Err(Step::new("move channel", last_errno_or_ebadf()));
        }
        fd
    } else {
        chan_fd
    };
    for (hi, dst) in &staged {
        install_fd(*hi, *dst).map_err(|e| {
            Step::new(
                "install descriptors",
                e.raw_os_error().unwrap_or(libc::EBADF),
            )
        })?;
    }
    let mut targets: Vec<RawFd> = staged.iter().map(|(_, d)| *d).collect();
    targets.push(moved_chan);
    close_fds_from(0, &targets);
    // SAFETY: moved_chan is open (kept above) and from here on owned only by this borrow,
    // which lives no longer than the channel it was made from.
    Ok(unsafe { BorrowedFd::borrow_raw(moved_chan) })
}

fn last_errno_or_ebadf() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EBADF)
}

/// Arms SIGKILL as the calling process's parent-death signal. The one place it is set;
/// each process that needs it, and when:
/// - the launcher, right after its fork from the controller (it dies with the controller);
/// - a sandbox's pid 1, once it is in its cgroup and again after it assumes its identity
///   (changing credentials clears the signal), so that it dies with its supervisor;
/// - the payload, after its last credential change (a fork clears the signal too), so
///   that it dies with pid 1.
pub fn die_with_parent() -> nix::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
}

/// Unblocks every signal, dispositions untouched: for a payload started by a pid 1 that
/// already restored them ([`reset_dispositions`]) and blocked what it collects.
pub fn unblock_signals() {
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}

/// Restores every signal's default disposition, the mask untouched (the supervisor
/// ignores SIGPIPE; a launcher ignores termination signals; a payload must start with
/// neither).
pub fn reset_dispositions() {
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: resetting a disposition to SIG_DFL installs no handler code.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

/// Executes `argv` with `env`, searching `path_var` (the sandbox's PATH) when argv[0] has no
/// slash, the way execvp(3) does. Returns only on failure, with the most telling errno.
pub fn exec(argv: &[CString], env: &[CString], path_var: &str) -> i32 {
    let Some(prog) = argv.first() else {
        return libc::ENOENT;
    };
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());
    let try_exec = |path: &CStr| -> i32 {
        // Between the two marks only the kernel runs: a payload started in pid 1's memory
        // that dies in there leaves that memory as it was (see `spawn`).
        super::spawn::at_execve(true);
        // SAFETY: both arrays are NULL-terminated and point at CStrings that outlive the call.
        unsafe {
            libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), env_ptrs.as_ptr());
        }
        let errno = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOENT);
        super::spawn::at_execve(false);
        errno
    };
    if prog.as_bytes().contains(&b'/') {
        return try_exec(prog);
    }
    let mut best = libc::ENOENT;
    for dir in path_var.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        let mut candidate = dir.as_bytes().to_vec();
        candidate.push(b'/');
        candidate.extend_from_slice(prog.as_bytes());
        let Ok(candidate) = CString::new(candidate) else {
            continue;
        };
        match try_exec(&candidate) {
            libc::ENOENT | libc::ENOTDIR => {}
            // Found but not runnable: remember, keep looking like execvp does.
            libc::EACCES | libc::EPERM => best = libc::EACCES,
            other => return other,
        }
    }
    best
}

/// What [`socket_turn`] does with the worker's turn on its controller socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Takes it if no other process holds it; `WouldBlock` if one does.
    Try,
    /// Takes it, waiting for the process that holds it.
    Wait,
    /// Gives it back.
    Give,
}

/// Takes or gives back the worker's turn on its controller socket: a POSIX record lock
/// on the socket, which belongs to the process (every process of a worker shares the one
/// open socket, so a lock of the description, `flock` or an OFD lock, would be everyone's
/// at once). The kernel gives it back when the process ends, however it ends.
pub fn socket_turn(fd: std::os::fd::BorrowedFd<'_>, turn: Turn) -> io::Result<()> {
    let lock = libc::flock {
        l_type: if turn == Turn::Give {
            libc::F_UNLCK
        } else {
            libc::F_WRLCK
        } as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    loop {
        let set = match turn {
            Turn::Wait => nix::fcntl::FcntlArg::F_SETLKW(&lock),
            Turn::Try | Turn::Give => nix::fcntl::FcntlArg::F_SETLK(&lock),
        };
        match nix::fcntl::fcntl(fd, set) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Err(e) => return Err(e.into()),
            Ok(_) => return Ok(()),
        }
    }
}

/// Takes ownership of an inherited socket descriptor (the worker's `HATCHERY_FD`), after
/// checking that it is open and is a socket, and marks it close-on-exec.
pub fn inherited_socket(fd: RawFd) -> io::Result<std::os::fd::OwnedFd> {
    if fd < 3 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "stdin, stdout and stderr are not the controller socket",
        ));
    }
    // SAFETY: fstat into a zeroed struct we own; an unused number fails with EBADF.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is not a socket"),
        ));
    }
    // SAFETY: F_SETFD on a descriptor just checked to be open.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    // SAFETY: the descriptor is open, is a socket, and this process takes sole ownership
    // (the caller must not use the number again).
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Puts the calling process in a session of its own and ignores the termination signals
/// a terminal or a process-group kill would send, so that it stops only when its parent
/// tells it to (or dies).
pub fn detach_from_terminal_signals() {
    let _ = nix::unistd::setsid();
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        // SAFETY: installing SIG_IGN runs no handler code.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn) };
    }
}

/// Where this process's argument and environment strings are, as the kernel shows them
/// in `/proc/PID/cmdline` and `/proc/PID/environ`.
///
/// Why: a sandbox's pid 1 and the launcher are copies of the supervisor, so they show its
/// command line (socket and state paths) and environment to anything that reads their
/// `/proc` entries — the sandbox's own payload included. A copy overwrites both with
/// its own name.
#[derive(Debug, Clone, Copy)]
pub struct ProcTitle {
    args: (usize, usize),
    env: (usize, usize),
}

impl ProcTitle {
    /// This process's areas (read from `/proc/self/stat` once, in the original, so that a
    /// copy made by fork or clone needs no file access to rename itself).
    pub fn current() -> Option<ProcTitle> {
        static TITLE: std::sync::OnceLock<Option<ProcTitle>> = std::sync::OnceLock::new();
        *TITLE.get_or_init(|| {
            let rest = super::kernel_text::own_stat_fields()?;
            // Fields 48..=51 (arg_start, arg_end, env_start, env_end); `rest` starts at 3.
            let mut f = rest
                .split_whitespace()
                .skip(45)
                .map(|v| v.parse::<usize>().ok());
            let args = (f.next()??, f.next()??);
            let env = (f.next()??, f.next()??);
            (args.0 < args.1 && env.0 <= env.1).then_some(ProcTitle { args, env })
        })
    }

    /// Shows `name` as this process's command line and name (`comm`), and, if
    /// `clear_env`, an empty environment. Only for a fresh copy of the supervisor that
    /// never reads its arguments (or, with `clear_env`, its environment) again: both are
    /// overwritten in place.
    pub fn set(&self, name: &str, clear_env: bool) {
        let (start, end) = self.args;
        let len = end.saturating_sub(start);
        let keep = name.len().min(len.saturating_sub(1));
        // SAFETY: [start, end) is this process's argument area (the kernel's arg_start and
        // arg_end for it: the strings at the top of its stack, mapped writable), `keep <
        // len` keeps every write inside it, and nothing in this copy reads argv after
        // this. The name is copied from a live &str that cannot overlap the stack area.
        unsafe {
            let dst = start as *mut u8;
            std::ptr::write_bytes(dst, 0, len);
            std::ptr::copy_nonoverlapping(name.as_ptr(), dst, keep);
        }
        if clear_env {
            let (start, end) = self.env;
            // SAFETY: [start, end) is this process's environment area (as above); the
            // caller guarantees nothing reads the environment afterwards.
            unsafe { std::ptr::write_bytes(start as *mut u8, 0, end.saturating_sub(start)) };
        }
        if let Ok(comm) = CString::new(name) {
            let _ = nix::sys::prctl::set_name(&comm);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What fd `fd` of this process is, as `/proc/self/fd` names it.
    fn names(fd: RawFd) -> String {
        std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    #[test]
    fn a_closed_stdio_source_gets_dev_null_even_when_its_number_is_another_target() {
        let (read, write) = match nix::unistd::pipe() {
            Ok(p) => p,
            Err(e) => panic!("pipe: {e}"),
        };
        let kept = [read.as_raw_fd(), write.as_raw_fd()];
        let installed = super::super::wait::holds_in_a_child(&kept, || {
            // Stdin and stdout closed; the payload's stdin comes from the pipe and its
            // stdout, closed here, must be /dev/null. Open puts that /dev/null at 0, the
            // lowest free number: the target of the pipe, installed first.
            // SAFETY: closing this child's own descriptors.
            unsafe {
                libc::close(0);
                libc::close(1);
            }
            let pairs = [(read.as_raw_fd(), 0), (1, 1)];
            install_descriptors(&pairs, &write).is_ok()
                && names(0).starts_with("pipe:")
                && names(1) == "/dev/null"
        });
        assert!(installed, "the payload's stdout was not /dev/null");
    }
}
