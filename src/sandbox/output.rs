//! The output cap and the relays: the payload's stdout and stderr pass through pipes (or
//! its terminal through a pseudo-terminal) that the supervisor reads, and at most `cap`
//! bytes of everything together reach the caller. The same pump carries input the other
//! way, from a caller's descriptor the sandbox must not hold (a terminal, a stdin open for
//! writing) to the payload; input is not counted.
//!
//! At the cap the supervisor closes its read ends of the output pipes. From then on a
//! write by anything in the sandbox fails with EPIPE and raises SIGPIPE, exactly as in
//! `command | head -c SIZE`: a program that does not handle SIGPIPE (`yes`, `cat`) dies of
//! it (exit 141); one that ignores it gets EPIPE on every write and runs on until it exits
//! or its `--timeout`. A sandbox's terminal ([`OutputPump::add_terminal`]) is closed at
//! the cap too, master and all: the kernel hangs it up, as when a terminal window is
//! closed, so its session leader (the payload) and foreground process group get SIGHUP,
//! and a program that ignores SIGHUP gets EIO from every later write (and end-of-file
//! from reads). Nothing in the sandbox can block on a full pipe or terminal, and nothing
//! beyond the cap is read or kept.
//!
//! "Truncated" means at least one byte was cut: output of exactly `cap` bytes followed by
//! end-of-file is not truncated, so the pipes stay open at the cap until the next byte
//! arrives (or end-of-file does).
//!
//! The pump never blocks its caller either. Its own ends (pipe ends, the pty master) are
//! non-blocking. The caller's descriptors are not its to reconfigure (their open file
//! description is shared with the caller's shell, and other processes may read or write
//! them too), so: a terminal or a pipe is opened once more as a non-blocking description
//! of the pump's own ([`super::tty::reopen_nonblocking`], `reopen_pipe_nonblocking`),
//! and only the way the caller's own description goes; a socket is read and written with
//! `MSG_DONTWAIT`, in pieces of `PIPE_BUF` bytes; a pty master, or a pipe that cannot be
//! opened again, has `O_NONBLOCK` set for each call alone; any other device is written only
//! after poll(2) reported room, and then at most `PIPE_BUF` bytes, and read only after
//! poll(2) reported data. A destination that stops reading therefore stalls the pump, and
//! through the full pipe or terminal the payload, but never the supervisor's loop:
//! timeouts and signals keep working. Regular files are written whole.
//!
//! Some calls wait all the same, inside the kernel and before any flag is looked at (a
//! pipe whose reader holds its lock, a frozen file system): so `run` drives its pump on a
//! thread of its own ([`Relay`]), and the loop that enforces its timeout never makes a
//! call on a caller's descriptor. Otherwise it is driven by a caller's poll loop: add
//! [`OutputPump::poll_fds`] to the descriptors polled, call [`OutputPump::progress`]
//! after every wake-up, and [`OutputPump::drain`] once the sandbox has ended. A
//! supervisor of many sandboxes does that once per sandbox in its own loop.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags};
use nix::sys::termios::Termios;

use super::tty;

mod budget;
mod caller;
mod relay;

pub use budget::OutputBudget;
pub use caller::same_destination;
use caller::{
    Mode, caller_end, read_nonblocking, ready_now, recv_nonblocking, send_nonblocking,
    write_nonblocking,
};
pub use relay::Relay;

/// Bytes read from a pipe at a time.
const CHUNK: usize = 64 << 10;
/// Reads per stream per [`OutputPump::progress`] call, so one busy stream cannot starve
/// the others, nor the caller's loop.
const READS_PER_CALL: usize = 16;
/// What a pipe that reports POLLOUT takes without blocking (POSIX `PIPE_BUF`).
const PIPE_BUF: usize = libc::PIPE_BUF;

/// What reached the destinations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutputSummary {
    /// Bytes written to the caller, all output streams together.
    pub bytes: u64,
    /// Whether output beyond the cap was cut.
    pub truncated: bool,
    /// The cap, if any.
    pub cap: Option<u64>,
    /// Whether the sandbox had a terminal of its own (hung up at the cap).
    pub pty: bool,
    /// Why writing output to its destination failed, first (an errno: a full file system,
    /// a file size limit): the stream was closed then, and the command's later writes to
    /// it fail with EPIPE.
    pub write_errno: Option<i32>,
    /// Bytes the command wrote that were accepted and then lost when that write failed.
    pub lost: u64,
    /// Bytes the command wrote that were accepted and not written when the relay stopped:
    /// its destination took no more before the run's timeout.
    pub unwritten: u64,
    /// The relay had not finished when the run ended: held by a call on a destination (see
    /// [`relay`]), still waiting for one at the deadline, or given up by a signal that
    /// stops a run. `bytes` and `unwritten` are then as of the relay's last round before
    /// it: `unwritten` a lower bound.
    pub stalled: bool,
}

impl OutputSummary {
    /// Why writing the output failed and what that lost, when it did: for the caller, who
    /// would otherwise take a short file for the whole output.
    pub fn write_error(&self) -> Option<String> {
        if let Some(e) = self.write_errno {
            return Some(format!(
                "writing the command's output failed: {}; {} bytes it had written were lost, and its later writes failed with EPIPE",
                Errno::from_raw(e).desc(),
                self.lost
            ));
        }
        if self.stalled {
            return Some(format!(
                "the command's output was still being written when the run ended (its destination took no more, or a signal ended the wait): at least {} bytes it had written were not written",
                self.unwritten
            ));
        }
        (self.unwritten > 0).then(|| {
            format!(
                "the command's output destination took no more before the timeout: {} bytes it had written were not written",
                self.unwritten
            )
        })
    }
}

/// Which way a stream's bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// From the payload to the caller: counted, and cut at the cap.
    Output,
    /// From the caller to the payload: not counted.
    Input,
}

/// One stream: bytes from a source to a sink.
struct Stream {
    direction: Direction,
    /// `None` once closed (end-of-file, the cap, or a failed destination).
    source: Option<OwnedFd>,
    source_mode: Mode,
    /// `None` once closed (an input stream at its source's end, a stream at the cap whose
    /// sink is the sandbox's terminal).
    sink: Option<OwnedFd>,
    sink_mode: Mode,
    /// The sink is the sandbox's pty master: closed at the cap with the output.
    sink_is_pty: bool,
    /// The source is the sandbox's pty master (what its terminal shows).
    source_is_pty: bool,
    /// Accepted bytes not yet written, from `written` on.
    pending: Vec<u8>,
    written: usize,
}

impl Stream {
    fn has_pending(&self) -> bool {
        self.written < self.pending.len()
    }

    fn close(&mut self) {
        self.source = None;
        self.sink = None;
        self.pending.clear();
        self.written = 0;
    }
}

/// Copies the payload's output to the caller, up to a cap, and the caller's input to the
/// payload.
pub struct OutputPump {
    streams: Vec<Stream>,
    cap: Option<u64>,
    /// A budget shared with other pumps, on top of `cap`.
    budget: Option<OutputBudget>,
    /// Bytes accepted for writing (never above the cap).
    accepted: u64,
    /// Bytes written to the caller.
    written: u64,
    truncated: bool,
    /// See [`OutputSummary::write_errno`] and [`OutputSummary::lost`].
    write_errno: Option<i32>,
    lost: u64,
    /// The caller's terminal, when the sandbox has a pty relayed to it (window sizes).
    terminal: Option<OwnedFd>,
}

/// A pipe whose read end is ours (non-blocking, close-on-exec) and whose write end goes to
/// the payload (blocking, as a program expects its stdout to be).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    fcntl(&r, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
    Ok((r, w))
}

impl OutputPump {
    /// A pump with no bytes passed yet. `stdout_to` and `stderr_to` are the destinations
    /// (they may be the same file); `cap` is `None` for no limit. Returns the pump and the
    /// write ends of the two pipes, to become the payload's descriptors 1 and 2. The
    /// caller must close its copies of them once the sandbox has started (or end-of-file
    /// never comes while the sandbox runs).
    pub fn new(
        cap: Option<u64>,
        stdout_to: OwnedFd,
        stderr_to: OwnedFd,
    ) -> io::Result<(OutputPump, [OwnedFd; 2])> {
        let mut pump = OutputPump::with_cap(cap);
        let out = pump.add_output(stdout_to)?;
        let err = pump.add_output(stderr_to)?;
        Ok((pump, [out, err]))
    }

    /// A pump without streams; add them with [`OutputPump::add_output`],
    /// [`OutputPump::add_input`] and [`OutputPump::add_terminal`].
    pub fn with_cap(cap: Option<u64>) -> OutputPump {
        OutputPump {
            streams: Vec::new(),
            cap,
            budget: None,
            accepted: 0,
            written: 0,
            truncated: false,
            write_errno: None,
            lost: 0,
            terminal: None,
        }
    }

    /// Also counts accepted output against `budget`, shared with other pumps.
    pub fn share_budget(&mut self, budget: OutputBudget) {
        self.budget = Some(budget);
    }

    /// Whether the pump has no streams at all.
    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// A new output stream to `dest`; returns the write end of its pipe, for the payload
    /// (close the caller's copy once the sandbox has started).
    pub fn add_output(&mut self, dest: OwnedFd) -> io::Result<OwnedFd> {
        let (r, w) = pipe()?;
        let (sink, sink_mode) = caller_end(dest, OFlag::O_WRONLY)?;
        self.streams.push(Stream {
            direction: Direction::Output,
            source: Some(r),
            source_mode: Mode::NonBlocking,
            sink: Some(sink),
            sink_mode,
            sink_is_pty: false,
            source_is_pty: false,
            pending: Vec::new(),
            written: 0,
        });
        Ok(w)
    }

    /// A new input stream from `src` (a caller's descriptor the payload must not hold);
    /// returns the read end of its pipe, for the payload. At `src`'s end-of-file the pipe
    /// is closed and the payload reads end-of-file too.
    pub fn add_input(&mut self, src: OwnedFd) -> io::Result<OwnedFd> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        fcntl(&w, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
        let (source, source_mode) = caller_end(src, OFlag::O_RDONLY)?;
        self.streams.push(Stream {
            direction: Direction::Input,
            source: Some(source),
            source_mode,
            sink: Some(w),
            sink_mode: Mode::NonBlocking,
            sink_is_pty: false,
            source_is_pty: false,
            pending: Vec::new(),
            written: 0,
        });
        Ok(r)
    }

    /// Gives the sandbox a terminal of its own, relayed to the caller's `terminal` (which
    /// the caller has put in raw mode): a new pty whose modes are `modes` (the caller's
    /// own, before raw mode) and whose window size is the caller's. What the sandbox writes
    /// to it reaches `terminal`, counted; what is typed at `terminal` reaches it when
    /// `input` is true. Returns the replica, for the payload's stdin (and stdout and
    /// stderr where those are the same terminal); close the caller's copy once the
    /// sandbox has started, or the master never sees end-of-file.
    pub fn add_terminal(
        &mut self,
        terminal: BorrowedFd<'_>,
        modes: &Termios,
        input: bool,
    ) -> io::Result<OwnedFd> {
        let pty = tty::open_pty()?;
        tty::set_modes(&pty.replica, modes)?;
        // A terminal without a size (some emulators, a serial line) leaves the default.
        let _ = tty::copy_window_size(terminal, pty.master.as_fd());
        let (caller, mode) = caller_end(terminal.try_clone_to_owned()?, OFlag::O_RDWR)?;
        self.streams.push(Stream {
            direction: Direction::Output,
            source: Some(pty.master.try_clone()?),
            source_mode: Mode::NonBlocking,
            sink: Some(caller.try_clone()?),
            sink_mode: mode,
            sink_is_pty: false,
            source_is_pty: true,
            pending: Vec::new(),
            written: 0,
        });
        self.streams.push(Stream {
            direction: Direction::Input,
            source: if input {
                Some(caller.try_clone()?)
            } else {
                None
            },
            source_mode: mode,
            sink: Some(pty.master),
            sink_mode: Mode::NonBlocking,
            sink_is_pty: true,
            source_is_pty: false,
            pending: Vec::new(),
            written: 0,
        });
        self.terminal = Some(caller);
        Ok(pty.replica)
    }

    /// The caller's window changed size (SIGWINCH): passes the new size on to the
    /// sandbox's terminal, whose foreground process group the kernel then signals.
    /// Returns whether the sandbox has a terminal (and so needs no forwarded SIGWINCH).
    pub fn window_changed(&self) -> bool {
        let Some(terminal) = &self.terminal else {
            return false;
        };
        // Whichever of the master's descriptors is still open: the input stream's is
        // closed at once when the caller's terminal is not read (a background job).
        let master = self.streams.iter().find_map(|s| {
            let sink = s.sink.as_ref().filter(|_| s.sink_is_pty);
            sink.or(s.source.as_ref().filter(|_| s.source_is_pty))
        });
        if let Some(master) = master {
            let _ = tty::copy_window_size(terminal.as_fd(), master.as_fd());
        }
        true
    }

    /// The descriptors to poll and what to poll them for: a source while there is room to
    /// read into, a sink while it has bytes waiting for it.
    pub fn poll_fds(&self) -> Vec<PollFd<'_>> {
        let mut fds = Vec::new();
        for s in &self.streams {
            if s.has_pending() {
                if let Some(sink) = s.sink.as_ref().filter(|_| s.sink_mode != Mode::File) {
                    fds.push(PollFd::new(sink.as_fd(), PollFlags::POLLOUT));
                }
            } else if let Some(src) = &s.source {
                fds.push(PollFd::new(src.as_fd(), PollFlags::POLLIN));
            }
        }
        fds
    }

    /// Moves what can move now without blocking: writes what sinks take, reads what the
    /// sources hold (output up to the cap), and closes streams at end-of-file or the cap.
    pub fn progress(&mut self) {
        for i in 0..self.streams.len() {
            for _ in 0..READS_PER_CALL {
                self.flush(i);
                if self.streams.get(i).is_none_or(Stream::has_pending) || !self.read_once(i) {
                    break;
                }
            }
            self.flush(i);
            if let Some(s) = self.streams.get_mut(i) {
                if s.source.is_none() && !s.has_pending() {
                    // An input's end reaches the payload as end-of-file.
                    s.close();
                }
            }
        }
    }

    /// Whether every output stream is closed and every accepted byte written.
    pub fn is_done(&self) -> bool {
        self.streams
            .iter()
            .filter(|s| s.direction == Direction::Output)
            .all(|s| s.source.is_none() && !s.has_pending())
    }

    /// After the sandbox has ended: reads what the output pipes (and terminal) still hold
    /// and writes it out, waiting for slow destinations until `deadline` (for ever without
    /// one). Nothing is left that could write to them, so reading stops at the first
    /// empty read. Input is no longer read.
    pub fn drain(&mut self, deadline: Option<Instant>) {
        self.drain_telling(deadline, |_| {});
    }

    /// [`OutputPump::drain`], calling `after_each_round` with the pump after every round
    /// (a relay thread publishes what has passed so far, for a supervisor that may stop
    /// waiting for it).
    pub fn drain_telling(
        &mut self,
        deadline: Option<Instant>,
        mut after_each_round: impl FnMut(&OutputPump),
    ) {
        for s in &mut self.streams {
            if s.direction == Direction::Input {
                s.close();
            }
        }
        loop {
            self.progress();
            // Every writer is gone: a source that has nothing now never will.
            for i in 0..self.streams.len() {
                let open = self
                    .streams
                    .get(i)
                    .is_some_and(|s| !s.has_pending() && s.source.is_some());
                if open {
                    let more = self.read_once(i);
                    if let Some(s) = self.streams.get_mut(i) {
                        if !more && !s.has_pending() {
                            s.close();
                        }
                    }
                }
            }
            after_each_round(self);
            if self.is_done() {
                return;
            }
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return;
            }
            let mut fds = self.poll_fds();
            if fds.is_empty() {
                continue;
            }
            if super::wait::poll_until(&mut fds, deadline, None).is_err() {
                return;
            }
        }
    }

    pub fn summary(&self) -> OutputSummary {
        OutputSummary {
            bytes: self.written,
            truncated: self.truncated,
            cap: self.cap,
            pty: self.terminal.is_some(),
            write_errno: self.write_errno,
            lost: self.lost,
            unwritten: self
                .streams
                .iter()
                .filter(|s| s.direction == Direction::Output)
                .map(|s| s.pending.len().saturating_sub(s.written) as u64)
                .fold(0, u64::saturating_add),
            stalled: false,
        }
    }

    /// Whether the sandbox has a terminal of its own, relayed to the caller's.
    pub fn has_terminal(&self) -> bool {
        self.terminal.is_some()
    }

    /// At the cap: no more output is read, and the sandbox's terminal is closed (hung up).
    fn cut(&mut self) {
        self.truncated = true;
        for s in &mut self.streams {
            if s.direction == Direction::Output {
                s.source = None;
            }
            if s.sink_is_pty {
                s.close();
            }
        }
    }

    /// One read from stream `i` into its pending buffer; false when nothing was read
    /// (empty for now, end-of-file, closed).
    fn read_once(&mut self, i: usize) -> bool {
        let Some(s) = self.streams.get(i) else {
            return false;
        };
        let Some(src) = &s.source else {
            return false;
        };
        // Read only after POLLIN where the description is the caller's (a pty master's
        // flags are not touched at all while it has nothing).
        if matches!(s.source_mode, Mode::AfterPoll | Mode::BriefNonBlocking)
            && !ready_now(src.as_fd(), PollFlags::POLLIN)
        {
            return false;
        }
        let direction = s.direction;
        let mode = s.source_mode;
        let mut buf = vec![0u8; CHUNK];
        let n = loop {
            let got = match mode {
                Mode::BriefNonBlocking => read_nonblocking(src.as_fd(), &mut buf),
                Mode::Socket => recv_nonblocking(src.as_fd(), &mut buf),
                Mode::File | Mode::NonBlocking | Mode::AfterPoll => {
                    nix::unistd::read(src, &mut buf)
                }
            };
            match got {
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return false,
                // End-of-file; EIO from a pty master once every replica is closed.
                Err(_) | Ok(0) => {
                    if let Some(s) = self.streams.get_mut(i) {
                        s.source = None;
                    }
                    return false;
                }
                Ok(n) => break n.min(buf.len()),
            }
        };
        let room = match (self.cap, &self.budget) {
            (None, None) => None,
            (cap, budget) => Some(
                cap.map_or(u64::MAX, |c| c.saturating_sub(self.accepted))
                    .min(budget.as_ref().map_or(u64::MAX, OutputBudget::room)),
            ),
        };
        let keep = match (direction, room) {
            (Direction::Input, _) | (Direction::Output, None) => n,
            (Direction::Output, Some(room)) => {
                if (n as u64) > room {
                    // A byte beyond the cap: cut here and stop reading any output.
                    self.cut();
                }
                n.min(usize::try_from(room).unwrap_or(usize::MAX))
            }
        };
        if direction == Direction::Output {
            self.accepted = self.accepted.saturating_add(keep as u64);
            if let Some(b) = &self.budget {
                b.take(keep as u64);
            }
        }
        let Some(s) = self.streams.get_mut(i) else {
            return false;
        };
        if s.sink.is_none() {
            return false;
        }
        if !s.has_pending() {
            s.pending.clear();
            s.written = 0;
        }
        s.pending
            .extend_from_slice(buf.get(..keep).unwrap_or_default());
        keep > 0
    }

    /// Writes stream `i`'s pending bytes for as long as its sink takes them.
    fn flush(&mut self, i: usize) {
        let Some(s) = self.streams.get_mut(i) else {
            return;
        };
        let mut passed = 0u64;
        let mut failed = None;
        while s.has_pending() {
            let Some(sink) = &s.sink else {
                s.pending.clear();
                s.written = 0;
                break;
            };
            let left = s.pending.get(s.written..).unwrap_or_default();
            let piece = match s.sink_mode {
                Mode::File | Mode::NonBlocking | Mode::BriefNonBlocking => left,
                // A datagram or seqpacket socket takes each send as one record, which must
                // fit its buffer and its reader's: pieces of what a pipe takes at once.
                Mode::Socket => left.get(..left.len().min(PIPE_BUF)).unwrap_or_default(),
                Mode::AfterPoll if ready_now(sink.as_fd(), PollFlags::POLLOUT) => {
                    left.get(..left.len().min(PIPE_BUF)).unwrap_or_default()
                }
                Mode::AfterPoll => break,
            };
            let written = match s.sink_mode {
                Mode::BriefNonBlocking => write_nonblocking(sink.as_fd(), piece),
                Mode::Socket => send_nonblocking(sink.as_fd(), piece),
                Mode::File | Mode::NonBlocking | Mode::AfterPoll => nix::unistd::write(sink, piece),
            };
            match written {
                Ok(n) => {
                    s.written = s.written.saturating_add(n);
                    passed = passed.saturating_add(n as u64);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => {
                    if s.sink_mode != Mode::AfterPoll {
                        break;
                    }
                }
                Err(e) => {
                    // The destination is gone (its reader closed, the disk is full, the
                    // payload's end of an input pipe closed): the payload learns it by
                    // EPIPE on its next write (or, for input, end-of-file never comes: it
                    // is not reading). What it wrote before, accepted here, is lost: said
                    // in the summary, since the payload cannot know.
                    let unwritten = s.pending.len().saturating_sub(s.written);
                    failed = Some((e, unwritten as u64));
                    s.close();
                    break;
                }
            }
        }
        if s.direction == Direction::Output {
            self.written = self.written.saturating_add(passed);
            if let Some((e, unwritten)) = failed {
                self.write_errno.get_or_insert(e as i32);
                self.lost = self.lost.saturating_add(unwritten);
            }
        }
    }

    /// How many output streams are still read.
    pub fn open_pipes(&self) -> usize {
        self.streams
            .iter()
            .filter(|s| s.direction == Direction::Output && s.source.is_some())
            .count()
    }
}

#[cfg(test)]
mod tests;
