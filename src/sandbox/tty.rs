//! Terminals: a sandbox never holds a descriptor of its caller's.
//!
//! Whoever holds a descriptor of a terminal can do more than read and write it. With
//! TIOCSTI it pushes bytes into the terminal's input queue, as if typed, and the caller's
//! shell reads and runs them after the sandbox ends: CVE-2017-5226, the escape from
//! bubblewrap sandboxes that shared their caller's terminal. TIOCSTI needs the terminal to
//! be the process's controlling terminal, and a sandbox starts in a session of its own,
//! without one; but a terminal that is no session's (handed to `run` by a program that
//! does not own it) can be taken with TIOCSCTTY by any session leader, and a seccomp
//! profile that allows ioctl freely (`compat`, as Docker's) then lets TIOCSTI through.
//! Writing to the terminal on descriptor 0 reaches the caller too, past any output cap.
//!
//! So `run` gives a sandbox a pseudo-terminal of its own instead ([`Pty`]), as
//! `docker run -t` does, and relays bytes between it and the caller's terminal (in
//! [`super::output`]): the sandbox can push input only into its own terminal, and every
//! byte it writes passes the supervisor, which counts it. The caller's terminal is put in
//! raw mode for the relay ([`RawMode`]), so that ^C, ^Z and line editing are the sandbox
//! terminal's to interpret, and is always put back.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::stat::Mode;
use nix::sys::termios::{SetArg, SpecialCharacterIndices, Termios};

/// A new pseudo-terminal pair: the master stays with the supervisor (non-blocking), the
/// replica becomes the payload's terminal.
pub struct Pty {
    pub master: OwnedFd,
    pub replica: OwnedFd,
}

/// Allocates a pseudo-terminal from the host's `/dev/ptmx`. Neither end may become the
/// supervisor's controlling terminal (`O_NOCTTY`) or leak into anything it executes
/// (`O_CLOEXEC`). The replica is opened through the master (TIOCGPTPEER), not by its
/// `/dev/pts` path, so that it is this pair's replica whatever that path resolves to.
pub fn open_pty() -> io::Result<Pty> {
    let master = nix::fcntl::open(
        "/dev/ptmx",
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)?;
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from a pointer to a local that outlives the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: TIOCGPTPEER takes its flags by value and returns a new descriptor or -1.
    let replica = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if replica < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just installed `replica` in this process for us alone.
    let replica = unsafe { OwnedFd::from_raw_fd(replica) };
    fcntl(&master, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
    Ok(Pty { master, replica })
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: BorrowedFd<'_>) -> bool {
    nix::unistd::isatty(fd).unwrap_or(false)
}

/// The window size of the terminal on `fd`.
fn window_size(fd: BorrowedFd<'_>) -> io::Result<libc::winsize> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into a local that outlives the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// The width in columns of the terminal on `fd` (0 where it does not say); `None` when
/// `fd` is no terminal.
pub fn window_width(fd: BorrowedFd<'_>) -> Option<usize> {
    window_size(fd).ok().map(|size| usize::from(size.ws_col))
}

/// Copies the window size of terminal `from` to terminal `to` (the caller's to the
/// sandbox's master). When the size changes the kernel sends SIGWINCH to the foreground
/// process group of `to`, exactly as a terminal emulator's resize does.
pub fn copy_window_size(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    let size = window_size(from)?;
    // SAFETY: TIOCSWINSZ reads one winsize from a local that outlives the call.
    if unsafe { libc::ioctl(to.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the terminal on `fd` the calling process's controlling terminal. The payload,
/// a session leader without one (it just called setsid), takes its own pty replica, so
/// that ^C and ^Z reach it as signals and job control works inside, as under
/// `docker run -it`. The terminal is new and no session's, so no privilege is needed
/// (argument 0: never steal). Called after fork: one ioctl, async-signal-safe.
pub fn take_controlling_terminal(fd: RawFd) -> Result<(), i32> {
    // SAFETY: TIOCSCTTY takes an integer argument; no memory is passed.
    if unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) } < 0 {
        return Err(io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO));
    }
    Ok(())
}

/// Opens the terminal behind `fd` once more, as a new open file description of its own
/// that is non-blocking. The caller's descriptors share their description with the
/// caller's shell and everything else it started: setting O_NONBLOCK on them would make
/// those programs' reads and writes fail with EAGAIN. A description of our own is as good
/// a way to the same terminal, and lets the relay read and write without ever waiting.
/// `O_NOCTTY`: it must not become the supervisor's controlling terminal. A pty's master
/// side is refused (`ErrorKind::Unsupported`): opened again, `/dev/ptmx` makes a new pty,
/// and what was written there reached no one.
pub fn reopen_nonblocking(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    if is_pty_master(fd) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a pty master cannot be opened again",
        ));
    }
    nix::fcntl::open(
        format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// Whether `fd` is the master side of a pty: the multiplexer's device (`/dev/ptmx`,
/// `/dev/pts/ptmx`: major 5, minor 2), one pty per open.
pub fn is_pty_master(fd: BorrowedFd<'_>) -> bool {
    nix::sys::stat::fstat(fd).is_ok_and(|st| is_pty_master_device(st.st_mode, st.st_rdev))
}

/// [`is_pty_master`] from a status already read (`st_mode`, `st_rdev`).
pub fn is_pty_master_device(mode: u32, rdev: u64) -> bool {
    mode & libc::S_IFMT == libc::S_IFCHR && rdev == libc::makedev(5, 2)
}

/// The caller's terminal modes before hatchery changed them, for the panic hook (a
/// release build aborts on panic, so no destructor would run).
static SAVED: Mutex<Option<(OwnedFd, Termios)>> = Mutex::new(None);

/// The caller's terminal in raw mode, for as long as this value lives: no echo, no line
/// editing, no signals from ^C or ^Z, no output processing — every byte passes to the
/// sandbox's terminal, whose own modes (copied from the caller's, see [`RawMode::saved`])
/// do all that. Dropping it restores the saved modes, on every path out of `run`
/// (normal exit, timeout, forwarded signals, errors); a panic restores them from a hook.
/// A SIGKILL or SIGSTOP cannot be caught: then `stty sane` (or `reset`) repairs the
/// terminal.
pub struct RawMode {
    fd: OwnedFd,
    saved: Termios,
}

impl RawMode {
    /// Puts the terminal on `fd` in raw mode. Reads return as soon as one byte is there.
    pub fn enter(fd: BorrowedFd<'_>) -> io::Result<RawMode> {
        let fd = fd.try_clone_to_owned()?;
        let saved = nix::sys::termios::tcgetattr(&fd).map_err(io::Error::from)?;
        let mut raw = saved.clone();
        nix::sys::termios::cfmakeraw(&mut raw);
        raw.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
        raw.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
        install_panic_hook();
        if let Ok(mut s) = SAVED.lock() {
            *s = Some((fd.try_clone()?, saved.clone()));
        }
        // TCSANOW: never wait for output to drain (a terminal nobody reads never drains).
        if let Err(e) = nix::sys::termios::tcsetattr(&fd, SetArg::TCSANOW, &raw) {
            if let Ok(mut s) = SAVED.lock() {
                *s = None;
            }
            return Err(e.into());
        }
        Ok(RawMode { fd, saved })
    }

    /// The terminal's modes as the caller had them: the sandbox's terminal starts with
    /// these, so that erase, interrupt and the other keys mean there what they meant here.
    pub fn saved(&self) -> &Termios {
        &self.saved
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(&self.fd, SetArg::TCSANOW, &self.saved);
        if let Ok(mut s) = SAVED.lock() {
            *s = None;
        }
    }
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Ok(s) = SAVED.try_lock() {
                if let Some((fd, saved)) = s.as_ref() {
                    let _ = nix::sys::termios::tcsetattr(fd, SetArg::TCSANOW, saved);
                }
            }
            previous(info);
        }));
    });
}

/// Gives the terminal `fd` the modes `modes` (the sandbox's terminal the caller's).
pub fn set_modes(fd: impl AsFd, modes: &Termios) -> io::Result<()> {
    nix::sys::termios::tcsetattr(fd.as_fd(), SetArg::TCSANOW, modes).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn a_new_pty_is_a_terminal_pair_no_session_owns() -> TestResult {
        let pty = open_pty()?;
        assert!(is_terminal(pty.replica.as_fd()));
        assert!(is_terminal(pty.master.as_fd()));
        let flags = fcntl(&pty.master, FcntlArg::F_GETFL)?;
        assert!(OFlag::from_bits_truncate(flags).contains(OFlag::O_NONBLOCK));
        // Bytes written to the replica come out of the master.
        nix::unistd::write(&pty.replica, b"x")?;
        let mut buf = [0u8; 8];
        let mut got = 0;
        for _ in 0..100 {
            match nix::unistd::read(&pty.master, &mut buf) {
                Ok(n) => {
                    got = n;
                    break;
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        assert_eq!(buf.get(..got), Some(b"x".as_slice()));
        Ok(())
    }

    #[test]
    fn window_sizes_copy_from_one_terminal_to_another() -> TestResult {
        let a = open_pty()?;
        let b = open_pty()?;
        let size = libc::winsize {
            ws_row: 37,
            ws_col: 101,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize from a local that outlives the call.
        assert_eq!(
            unsafe { libc::ioctl(a.replica.as_raw_fd(), libc::TIOCSWINSZ, &size) },
            0
        );
        copy_window_size(a.replica.as_fd(), b.master.as_fd())?;
        let mut got = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one winsize into a local that outlives the call.
        assert_eq!(
            unsafe { libc::ioctl(b.replica.as_raw_fd(), libc::TIOCGWINSZ, &mut got) },
            0
        );
        assert_eq!((got.ws_row, got.ws_col), (37, 101));
        Ok(())
    }

    #[test]
    fn raw_mode_is_undone_when_dropped() -> TestResult {
        let pty = open_pty()?;
        let before = nix::sys::termios::tcgetattr(&pty.replica)?;
        {
            let raw = RawMode::enter(pty.replica.as_fd())?;
            assert_eq!(raw.saved(), &before);
            let now = nix::sys::termios::tcgetattr(&pty.replica)?;
            assert!(
                !now.local_flags
                    .contains(nix::sys::termios::LocalFlags::ECHO)
            );
            assert!(
                !now.local_flags
                    .contains(nix::sys::termios::LocalFlags::ISIG)
            );
        }
        assert_eq!(nix::sys::termios::tcgetattr(&pty.replica)?, before);
        Ok(())
    }

    #[test]
    fn a_reopened_terminal_is_non_blocking_and_leaves_the_original_blocking() -> TestResult {
        let pty = open_pty()?;
        let again = reopen_nonblocking(pty.replica.as_fd())?;
        let mut buf = [0u8; 8];
        assert_eq!(
            nix::unistd::read(&again, &mut buf),
            Err(nix::errno::Errno::EAGAIN)
        );
        let flags = OFlag::from_bits_truncate(fcntl(&pty.replica, FcntlArg::F_GETFL)?);
        assert!(!flags.contains(OFlag::O_NONBLOCK));
        Ok(())
    }
}
