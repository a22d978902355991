//! What `run`'s payload gets for stdin, stdout and stderr in place of the caller's, and
//! what relays them: the caller's descriptors as found, and the plan made from them.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::fcntl::{FcntlArg, fcntl};

use hatchery::sandbox::output::OutputPump;
use hatchery::sandbox::{StdioEnforcement, tty};

/// One of the caller's standard descriptors, as found.
struct CallerFd {
    /// A duplicate; `None` when the descriptor is closed.
    fd: Option<OwnedFd>,
    /// `S_IFMT` bits.
    kind: u32,
    rdev: u64,
    /// Opened for reading only, and not a socket (a socket is always both ways).
    read_only: bool,
    /// Opened for writing only, and not a socket.
    write_only: bool,
    /// A regular file of a kernel-internal file system: a namespace (`/proc/PID/ns/*`),
    /// a pidfd, an anonymous inode; a handle on something, not data.
    kernel_object: bool,
    terminal: bool,
    /// The open file description's status flags as found (`F_GETFL`).
    flags: Option<nix::fcntl::OFlag>,
}

impl CallerFd {
    fn inspect(fd: BorrowedFd<'_>) -> CallerFd {
        let closed = CallerFd {
            fd: None,
            kind: 0,
            rdev: 0,
            read_only: true,
            write_only: true,
            kernel_object: false,
            terminal: false,
            flags: None,
        };
        let Ok(st) = nix::sys::stat::fstat(fd) else {
            return closed;
        };
        let Ok(fd) = fd.try_clone_to_owned() else {
            return closed;
        };
        let kind = st.st_mode & libc::S_IFMT;
        let status = fcntl(&fd, FcntlArg::F_GETFL);
        let access = status.map(|f| f & libc::O_ACCMODE);
        let not_socket = kind != libc::S_IFSOCK;
        let read_only = not_socket && access.is_ok_and(|a| a == libc::O_RDONLY);
        let write_only = not_socket && access.is_ok_and(|a| a == libc::O_WRONLY);
        // nsfs, pidfs and anon_inodefs: their files say they are regular ones.
        const KERNEL_OBJECTS: [i64; 3] = [0x6e73_6673, 0x5049_4446, 0x0904_1934];
        // The magic's type differs by architecture (i64 here, i32 on others).
        #[allow(clippy::unnecessary_cast)]
        let kernel_object = kind == libc::S_IFREG
            && nix::sys::statfs::fstatfs(&fd)
                .is_ok_and(|f| KERNEL_OBJECTS.contains(&(f.filesystem_type().0 as i64)));
        CallerFd {
            terminal: tty::is_terminal(fd.as_fd()),
            flags: status.ok().map(nix::fcntl::OFlag::from_bits_retain),
            fd: Some(fd),
            kind,
            rdev: st.st_rdev,
            read_only,
            write_only,
            kernel_object,
        }
    }

    /// Whether the payload may hold it as it is: a file, a pipe or a device carries only
    /// data. A socket is the host's network (a TCP socket disconnected with `AF_UNSPEC`
    /// connects anywhere the host can reach; any socket's `SIOCGIFCONF` lists the host's
    /// interfaces), a directory is a place to walk from, and the rest (anonymous inodes,
    /// `O_PATH`) are handles on something else.
    fn holds_only_data(&self) -> bool {
        self.fd.is_none()
            || (matches!(self.kind, libc::S_IFREG | libc::S_IFIFO | libc::S_IFCHR)
                && !self.kernel_object)
    }

    /// Whether the payload may hold it as its stdout or stderr: only data, and only a way
    /// out (a FIFO or file opened read-write would let the command read what the caller
    /// or others wrote there). `/dev/null` has nothing to read.
    fn passes_as_output(&self) -> bool {
        self.holds_only_data() && (self.write_only || self.is_dev_null() || self.fd.is_none())
    }

    /// The payload's copy of it, passed as it is: the same open file description, whose
    /// status flags are noted in `held` to be given back after the run.
    fn pass(&self, held: &mut Vec<(OwnedFd, nix::fcntl::OFlag)>) -> std::io::Result<OwnedFd> {
        let fd = match &self.fd {
            Some(fd) => fd.try_clone()?,
            None => return dev_null(true),
        };
        if let Some(flags) = self.flags {
            held.push((fd.try_clone()?, flags));
        }
        Ok(fd)
    }

    /// A pty's master side (see [`tty::is_pty_master`]), from the status `inspect` read.
    fn is_pty_master(&self) -> bool {
        self.fd.is_some() && tty::is_pty_master_device(self.kind, self.rdev)
    }

    fn is_dev_null(&self) -> bool {
        self.kind == libc::S_IFCHR && self.rdev == libc::makedev(1, 3)
    }

    /// What it is, for the report.
    fn what(&self) -> &'static str {
        match self.kind {
            _ if self.fd.is_none() => "closed",
            _ if self.terminal => "terminal",
            _ if self.is_dev_null() => "/dev/null",
            _ if self.kernel_object => "kernel object",
            libc::S_IFREG => "file",
            libc::S_IFIFO => "pipe",
            libc::S_IFSOCK => "socket",
            libc::S_IFCHR => "character device",
            libc::S_IFDIR => "directory",
            _ => "descriptor",
        }
    }

    /// How it is open, for a stdin that is not passed: "read-write file".
    fn access(&self) -> String {
        // The access mode `inspect` read: no second F_GETFL.
        let access = match &self.fd {
            Some(_) if self.kind != libc::S_IFSOCK && self.write_only => "write-only ",
            Some(_) if self.kind != libc::S_IFSOCK => "read-write ",
            _ => "",
        };
        format!("{access}{}", self.what())
    }
}

/// What the payload gets for stdin, stdout and stderr, and what relays them.
pub(super) struct StdioPlan {
    /// `None`: the caller's own descriptors, inherited (nothing to relay).
    pub(super) fds: Option<[OwnedFd; 3]>,
    pub(super) pump: Option<OutputPump>,
    /// The caller's terminal in raw mode while a pty relays it; dropping it restores it.
    pub(super) raw: Option<tty::RawMode>,
    pub(super) controlling_terminal: bool,
    pub(super) report: StdioEnforcement,
    /// The caller's descriptors the payload holds as they are, with their status flags as
    /// found.
    held: Vec<(OwnedFd, nix::fcntl::OFlag)>,
}

impl StdioPlan {
    /// Gives the descriptors the payload held as they are back the status flags they had
    /// before the run, once the sandbox is gone and before anything more is written to
    /// them. The payload shares their open file descriptions with the caller: `O_NONBLOCK`
    /// left on a pipe made the report fail with EAGAIN and the caller's next command get
    /// it too; `O_APPEND` cleared on a `>>` file made the caller's next writes land at an
    /// offset instead of the end.
    pub(super) fn give_back_flags(&self) {
        for (fd, found) in &self.held {
            if fcntl(fd, FcntlArg::F_GETFL).is_ok_and(|now| now != found.bits()) {
                let _ = fcntl(fd, FcntlArg::F_SETFL(*found));
            }
        }
    }
}

fn dev_null(write: bool) -> std::io::Result<OwnedFd> {
    Ok(OwnedFd::from(
        std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .open("/dev/null")?,
    ))
}

/// Decides what the payload gets instead of the caller's stdin, stdout and stderr. The
/// sandbox never holds a descriptor of the caller's terminal (CVE-2017-5226: TIOCSTI
/// types into it; writes to it pass no cap), nor any descriptor through which it could
/// write to the caller but its own stdout and stderr:
///
/// - stdin a terminal: a new pty of the sandbox's own, relayed both ways, with the
///   caller's terminal in raw mode (in a background job: output only, modes untouched); it
///   is the payload's stdout and stderr too where those are the same terminal, and its
///   controlling terminal;
/// - stdin open for writing (read-write or write-only file, socket, read-write pipe or
///   device): a pipe the supervisor feeds. A read-write `/dev/null` (what service
///   managers give) is opened again read-only instead: it has no state to differ in.
///   Other files are not reopened: a new open file description would have an offset of
///   its own, and a socket cannot be reopened;
/// - stdout or stderr a terminal (another one, or stdin is not one): a pipe to it;
/// - with `--max-output`, stdout and stderr not relayed otherwise: pipes, counted;
/// - stdout or stderr a socket, a directory or any other handle that is more than a way
///   for data (see [`CallerFd::holds_only_data`]): a pipe to it; stdin such a handle,
///   opened read-only: `/dev/null` (a socket is open both ways, so relayed as above).
///
/// Everything else — a read-only stdin (file, pipe, `/dev/null`), stdout and stderr
/// (file, pipe, device) without a cap — is passed as it is, at no cost, and its status
/// flags are given back after the run ([`StdioPlan::give_back_flags`]).
pub(super) fn plan_stdio(cap: Option<u64>) -> std::io::Result<StdioPlan> {
    let [stdin, stdout, stderr] = [
        CallerFd::inspect(std::io::stdin().as_fd()),
        CallerFd::inspect(std::io::stdout().as_fd()),
        CallerFd::inspect(std::io::stderr().as_fd()),
    ];
    let stdin_passed = !stdin.terminal && stdin.read_only && stdin.holds_only_data();
    let outs_passed = cap.is_none()
        && [&stdout, &stderr]
            .iter()
            .all(|c| !c.terminal && c.passes_as_output());
    let passed = |c: &CallerFd| match c.fd {
        Some(_) => format!("passed ({})", c.what()),
        None => "closed (the command gets /dev/null)".to_string(),
    };
    let passed_stdin = |c: &CallerFd| match c.what() {
        w @ ("file" | "character device") => format!("passed (read-only {w})"),
        _ => passed(c),
    };
    if stdin_passed && outs_passed {
        let report = StdioEnforcement {
            stdin: passed_stdin(&stdin),
            stdout: passed(&stdout),
            stderr: passed(&stderr),
        };
        // Inherited as they are: the copies `inspect` made serve the flags alone.
        let held = [stdin, stdout, stderr]
            .into_iter()
            .filter_map(|c| c.fd.zip(c.flags))
            .collect();
        return Ok(StdioPlan {
            fds: None,
            held,
            pump: None,
            raw: None,
            controlling_terminal: false,
            report,
        });
    }
    let mut pump = OutputPump::with_cap(cap);
    let mut held = Vec::new();
    let mut raw = None;
    let mut replica = None;
    let (stdin_fd, stdin_report) = match stdin.fd.as_ref() {
        None => (dev_null(false)?, passed(&stdin)),
        // A pty's master side (a terminal emulator's or `script`'s end, handed on) is no
        // one's controlling terminal: it reads what the program on its replica wrote, and
        // what is written to it is typed into that program. Given a pty of the sandbox's
        // own, that pty's echo went out through the master into the replica's, whose echo
        // came back in as input, round and round. So it is relayed as a stdin open for
        // writing is, through a pipe, and never passed: its holder could signal and resize
        // the replica's program, and change its modes.
        Some(fd) if stdin.terminal && stdin.is_pty_master() => (
            pump.add_input(fd.try_clone()?)?,
            "pipe relay (pty master)".to_string(),
        ),
        Some(fd) if stdin.terminal => {
            let pty = terminal_stdin(fd, &mut pump)?;
            replica = Some(pty.replica);
            raw = pty.raw;
            (pty.stdin, pty.report)
        }
        Some(_) if stdin.read_only && !stdin.holds_only_data() => (
            dev_null(false)?,
            format!("not passed ({}): the command reads /dev/null", stdin.what()),
        ),
        Some(_) if stdin.read_only => (stdin.pass(&mut held)?, passed_stdin(&stdin)),
        Some(_) if stdin.is_dev_null() => (
            dev_null(false)?,
            "passed (/dev/null, opened again read-only)".to_string(),
        ),
        Some(fd) => (
            pump.add_input(fd.try_clone()?)?,
            format!("pipe relay ({})", stdin.access()),
        ),
    };
    let relay_report = |c: &CallerFd| -> Option<String> {
        match c.fd {
            None => None,
            Some(_) if c.terminal => Some("pipe relay (terminal)".to_string()),
            Some(_) if cap.is_some() => Some("pipe relay (--max-output)".to_string()),
            Some(_) if !c.holds_only_data() => Some(format!("pipe relay ({})", c.what())),
            Some(_) if !c.passes_as_output() => {
                Some(format!("pipe relay (read-write {})", c.what()))
            }
            Some(_) => None,
        }
    };
    let mut out = |c: &CallerFd| -> std::io::Result<(OwnedFd, String)> {
        match (c.fd.as_ref(), replica.as_ref(), relay_report(c)) {
            (None, _, _) => Ok((dev_null(true)?, passed(c))),
            (Some(_), Some(r), _) if c.terminal && c.kind == stdin.kind && c.rdev == stdin.rdev => {
                Ok((r.try_clone()?, "pty relay".to_string()))
            }
            (Some(fd), _, Some(report)) => Ok((pump.add_output(fd.try_clone()?)?, report)),
            (Some(_), _, None) => Ok((c.pass(&mut held)?, passed(c))),
        }
    };
    let (stdout_fd, stdout_report) = out(&stdout)?;
    // A stderr relayed to where stdout is relayed gets stdout's pipe: with a pipe each,
    // `2>&1` (or one terminal) received all of one stream, then all of the other, read in
    // turn, whatever order the command wrote them in.
    let (stderr_fd, stderr_report) = match (&stdout.fd, &stderr.fd) {
        (Some(o), Some(e))
            if relay_report(&stderr).as_deref() == Some(stdout_report.as_str())
                && hatchery::sandbox::output::same_destination(o.as_fd(), e.as_fd()) =>
        {
            (stdout_fd.try_clone()?, stdout_report.clone())
        }
        _ => out(&stderr)?,
    };
    Ok(StdioPlan {
        fds: Some([stdin_fd, stdout_fd, stderr_fd]),
        controlling_terminal: replica.is_some(),
        pump: if pump.is_empty() { None } else { Some(pump) },
        raw,
        report: StdioEnforcement {
            stdin: stdin_report,
            stdout: stdout_report,
            stderr: stderr_report,
        },
        held,
    })
}

/// The payload's side of a pty relaying the caller's terminal.
struct PtyStdin {
    /// The payload's stdin.
    stdin: OwnedFd,
    /// The pty's replica: also the payload's stdout and stderr where those are the same
    /// terminal, and its controlling terminal.
    replica: OwnedFd,
    /// The caller's terminal in raw mode (in the foreground only).
    raw: Option<tty::RawMode>,
    report: String,
}

/// A terminal on stdin: a pty of the sandbox's own, relayed both ways with the caller's
/// terminal in raw mode; in a background job, output only and the modes untouched.
fn terminal_stdin(fd: &OwnedFd, pump: &mut OutputPump) -> std::io::Result<PtyStdin> {
    // A background job (`hatchery run ... &`) must neither change the terminal's
    // modes nor read it: the kernel would stop it (SIGTTOU, SIGTTIN), and a
    // stopped supervisor enforces no timeout. It gives the sandbox its terminal
    // all the same, without input.
    let foreground =
        nix::unistd::tcgetpgrp(fd).map_or(true, |group| group == nix::unistd::getpgrp());
    let no_terminal = |e: std::io::Error| {
        std::io::Error::other(format!(
            "stdin is a terminal, and the sandbox gets a terminal of its own instead, which failed: {e}; redirect stdin (< /dev/null) to run without one"
        ))
    };
    let mut raw = None;
    let r = if foreground {
        let mode = tty::RawMode::enter(fd.as_fd()).map_err(no_terminal)?;
        let r = pump.add_terminal(fd.as_fd(), mode.saved(), true);
        raw = Some(mode);
        r
    } else {
        let modes = nix::sys::termios::tcgetattr(fd).map_err(std::io::Error::from);
        modes.and_then(|m| pump.add_terminal(fd.as_fd(), &m, false))
    }
    .map_err(no_terminal)?;
    let own = r.try_clone()?;
    let how = if foreground {
        "pty relay"
    } else {
        "pty relay (background job: output only)"
    };
    Ok(PtyStdin {
        stdin: own,
        replica: r,
        raw,
        report: how.to_string(),
    })
}
