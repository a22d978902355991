//! A terminal of the tests' own: a new pseudo-terminal pair whose replica plays the
//! caller's terminal (what an interactive shell has on descriptors 0, 1 and 2) and whose
//! master plays the person at the keyboard: what is written to it is typed, what is read
//! from it is what the screen shows.
//!
//! Commands are started on it through `setsid(1)`, in a session of their own, with the
//! replica as their controlling terminal (`setsid --ctty`, as a login shell has it) or as
//! no session's terminal at all (a terminal handed to a program that is not its owner).

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::pty::Winsize;
use nix::sys::termios::Termios;

/// Whether a command's session has the test terminal as its controlling terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Session {
    /// `setsid --ctty`: the terminal is the session's, as for an interactive shell.
    ControllingTerminal,
    /// `setsid`: a new session without a controlling terminal; the test terminal is no
    /// session's, so a process handed it may take it with TIOCSCTTY.
    NoControllingTerminal,
}

pub struct Terminal {
    pub master: OwnedFd,
    pub replica: OwnedFd,
    screen: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

fn must<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

impl Terminal {
    /// A new terminal of `rows` x `cols`, with the kernel's default modes (cooked, echo).
    pub fn open(rows: u16, cols: u16) -> Terminal {
        let size = Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = must(nix::pty::openpty(&size, None), "openpty");
        // Neither end may leak into the commands started (openpty sets no close-on-exec).
        for fd in [&pty.master, &pty.slave] {
            must(
                fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)),
                "close-on-exec",
            );
        }
        must(
            fcntl(&pty.master, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)),
            "non-blocking master",
        );
        Terminal {
            master: pty.master,
            replica: pty.slave,
            screen: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(AtomicBool::new(false)),
            reader: None,
        }
    }

    /// Starts reading the screen (the master) in the background, as a terminal emulator
    /// does. A test that wants a caller who stops reading never calls this.
    pub fn start_reading(&mut self) {
        let master = must(self.master.try_clone(), "dup master");
        let screen = Arc::clone(&self.screen);
        let stop = Arc::clone(&self.stop);
        self.reader = Some(std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            while !stop.load(Ordering::Relaxed) {
                let mut fds = [PollFd::new(master.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, PollTimeout::from(20u8));
                match nix::unistd::read(&master, &mut buf) {
                    Ok(n) if n > 0 => {
                        if let (Ok(mut s), Some(got)) = (screen.lock(), buf.get(..n)) {
                            s.extend_from_slice(got);
                        }
                    }
                    // Empty for now, or no replica open (EIO) until a command opens one.
                    _ => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }));
    }

    /// Everything the screen has shown so far.
    pub fn screen(&self) -> Vec<u8> {
        self.screen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn screen_text(&self) -> String {
        String::from_utf8_lossy(&self.screen()).into_owned()
    }

    /// Waits until the screen shows `needle`, up to `limit`.
    pub fn wait_for(&self, needle: &str, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.screen_text().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Waits until the screen holds at least `n` bytes equal to `byte`, up to `limit`;
    /// returns how many it holds.
    pub fn wait_for_count(&self, byte: u8, n: usize, limit: Duration) -> usize {
        let start = Instant::now();
        loop {
            let count = self.screen().iter().filter(|b| **b == byte).count();
            if count >= n || start.elapsed() > limit {
                return count;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Types `bytes` at the keyboard.
    pub fn type_bytes(&self, bytes: &[u8]) {
        let mut done = 0;
        let start = Instant::now();
        while done < bytes.len() {
            let rest = bytes.get(done..).unwrap_or_default();
            match nix::unistd::write(&self.master, rest) {
                Ok(n) => done += n,
                Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {
                    if start.elapsed() > Duration::from_secs(10) {
                        panic!("the terminal takes no input");
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("typing: {e}"),
            }
        }
    }

    /// The terminal's modes, as a shell would find them.
    pub fn modes(&self) -> Termios {
        must(nix::sys::termios::tcgetattr(&self.replica), "tcgetattr")
    }

    /// The device number of the terminal (what `fstat` reports for any descriptor of it).
    pub fn rdev(&self) -> u64 {
        must(nix::sys::stat::fstat(&self.replica), "fstat").st_rdev
    }

    /// A descriptor of the terminal for a child's stdin, stdout or stderr.
    pub fn stdio(&self) -> Stdio {
        Stdio::from(must(self.replica.try_clone(), "dup replica"))
    }

    /// Bytes waiting in the terminal's input queue: what the caller's shell would read as
    /// typed input once the command has ended. Measured by the probe (FIONREAD), run
    /// directly on the terminal.
    pub fn pending_input(&self) -> i64 {
        let mut cmd = Command::new(super::probe());
        cmd.args(["fionread", "0"])
            .stdin(self.stdio())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let out = must(cmd.output(), "probe fionread");
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        match text.strip_prefix("ok ").and_then(|n| n.parse().ok()) {
            Some(n) => n,
            None => panic!("probe fionread: {text}"),
        }
    }

    /// Empties the terminal's input queue.
    pub fn discard_input(&self) {
        must(
            nix::sys::termios::tcflush(&self.replica, nix::sys::termios::FlushArg::TCIFLUSH),
            "tcflush",
        );
    }

    /// Starts `program ARGS` in a new session on this terminal: stdin is the terminal, and
    /// stdout and stderr are too unless given.
    pub fn spawn(
        &self,
        session: Session,
        program: &Path,
        args: &[&str],
        stdout: Option<Stdio>,
        stderr: Option<Stdio>,
    ) -> Child {
        let mut cmd = Command::new("setsid");
        cmd.arg("--wait");
        if session == Session::ControllingTerminal {
            cmd.arg("--ctty");
        }
        cmd.arg(program)
            .args(args)
            .stdin(self.stdio())
            .stdout(stdout.unwrap_or_else(|| self.stdio()))
            .stderr(stderr.unwrap_or_else(|| self.stdio()));
        must(cmd.spawn(), "spawn on the terminal")
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Waits for `child` up to `limit`; past it the child is killed and the test fails.
pub fn wait_child(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status,
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what} did not finish within {limit:?}");
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("wait: {e}"),
        }
    }
}
