//! The output cap: the payload's stdout and stderr pass through pipes the supervisor reads,
//! and at most `cap` bytes of the two streams together reach their destinations.
//!
//! At the cap the supervisor closes its read ends of both pipes. From then on a write by
//! anything in the sandbox fails with EPIPE and raises SIGPIPE, exactly as in
//! `command | head -c SIZE`: a program that does not handle SIGPIPE (`yes`, `cat`) dies of
//! it (exit 141); one that ignores it gets EPIPE on every write and runs on until it exits
//! or its `--timeout`. Nothing in the sandbox can block on a full pipe, and nothing beyond
//! the cap is read or kept.
//!
//! "Truncated" means at least one byte was cut: output of exactly `cap` bytes followed by
//! end-of-file is not truncated, so the pipes stay open at the cap until the next byte
//! arrives (or end-of-file does).
//!
//! The pump never blocks its caller either. Its pipe ends are non-blocking; destinations
//! (the caller's stdout or a log file) are not its to reconfigure, so it writes to a pipe,
//! socket or terminal only after poll(2) reported room, and then at most `PIPE_BUF` bytes
//! (what a pipe reporting POLLOUT accepts without blocking). A destination that stops
//! reading therefore stalls the pump, and through the full pipe the payload, but never the
//! supervisor's loop: timeouts and signals keep working. Regular files are written whole.
//!
//! It is driven by a caller's poll loop: add [`OutputPump::poll_fds`] to the descriptors
//! polled, call [`OutputPump::progress`] after every wake-up, and [`OutputPump::drain`]
//! once the sandbox has ended. `run` does this in `Sandbox::wait`; a supervisor of many
//! sandboxes does it once per sandbox in its own loop.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// Bytes read from a pipe at a time.
const CHUNK: usize = 64 << 10;
/// Reads per stream per [`OutputPump::progress`] call, so one busy stream cannot starve
/// the other, nor the caller's loop.
const READS_PER_CALL: usize = 16;
/// What a pipe that reports POLLOUT takes without blocking (POSIX `PIPE_BUF`).
const PIPE_BUF: usize = libc::PIPE_BUF;

/// What reached the destinations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutputSummary {
    /// Bytes written to the destinations, stdout and stderr together.
    pub bytes: u64,
    /// Whether output beyond the cap was cut.
    pub truncated: bool,
    /// The cap, if any.
    pub cap: Option<u64>,
}

/// One stream: a pipe from the payload to a destination.
struct Stream {
    /// Our read end; `None` once closed (end-of-file, the cap, or a failed destination).
    source: Option<OwnedFd>,
    sink: OwnedFd,
    /// The destination is a regular file (writes never wait for a reader).
    sink_is_file: bool,
    /// Accepted bytes not yet written, from `written` on.
    pending: Vec<u8>,
    written: usize,
}

impl Stream {
    fn has_pending(&self) -> bool {
        self.written < self.pending.len()
    }
}

/// Copies the payload's stdout and stderr to their destinations, up to a cap.
pub struct OutputPump {
    streams: [Stream; 2],
    cap: Option<u64>,
    /// Bytes accepted for writing (never above the cap).
    accepted: u64,
    /// Bytes written to destinations.
    written: u64,
    truncated: bool,
}

/// A pipe whose read end is ours (non-blocking, close-on-exec) and whose write end goes to
/// the payload (blocking, as a program expects its stdout to be).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    fcntl(&r, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
    Ok((r, w))
}

fn is_regular_file(fd: &OwnedFd) -> io::Result<bool> {
    let st = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
    Ok(st.st_mode & libc::S_IFMT == libc::S_IFREG)
}

/// Whether `fd` can take data now.
fn writable_now(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLOUT))
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
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let stream = |source, sink: OwnedFd| -> io::Result<Stream> {
            Ok(Stream {
                source: Some(source),
                sink_is_file: is_regular_file(&sink)?,
                sink,
                pending: Vec::new(),
                written: 0,
            })
        };
        let pump = OutputPump {
            streams: [stream(out_r, stdout_to)?, stream(err_r, stderr_to)?],
            cap,
            accepted: 0,
            written: 0,
            truncated: false,
        };
        Ok((pump, [out_w, err_w]))
    }

    /// The descriptors to poll and what to poll them for: a pipe while there is room to
    /// read into, a destination while it has bytes waiting for it.
    pub fn poll_fds(&self) -> Vec<PollFd<'_>> {
        let mut fds = Vec::new();
        for s in &self.streams {
            if s.has_pending() {
                if !s.sink_is_file {
                    fds.push(PollFd::new(s.sink.as_fd(), PollFlags::POLLOUT));
                }
            } else if let Some(src) = &s.source {
                fds.push(PollFd::new(src.as_fd(), PollFlags::POLLIN));
            }
        }
        fds
    }

    /// Moves what can move now without blocking: writes what destinations take, reads what
    /// the pipes hold (up to the cap), and closes pipes at end-of-file or at the cap.
    pub fn progress(&mut self) {
        for i in 0..self.streams.len() {
            for _ in 0..READS_PER_CALL {
                self.flush(i);
                if self.streams[i].has_pending() || !self.read_once(i) {
                    break;
                }
            }
            self.flush(i);
        }
    }

    /// Whether every pipe is closed and every accepted byte written.
    pub fn is_done(&self) -> bool {
        self.streams
            .iter()
            .all(|s| s.source.is_none() && !s.has_pending())
    }

    /// After the sandbox has ended: reads what the pipes still hold and writes it out,
    /// waiting for slow destinations until `deadline` (for ever without one). Nothing is
    /// left that could write to the pipes, so reading stops at the first empty read.
    pub fn drain(&mut self, deadline: Option<Instant>) {
        loop {
            self.progress();
            // Every writer is gone: a pipe that has nothing now never will.
            for i in 0..self.streams.len() {
                if !self.streams[i].has_pending() && self.streams[i].source.is_some() {
                    let more = self.read_once(i);
                    if !more && !self.streams[i].has_pending() {
                        self.streams[i].source = None;
                    }
                }
            }
            if self.is_done() {
                return;
            }
            let ms = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return;
                    }
                    left.as_millis().clamp(1, i32::MAX as u128) as i32
                }
                None => -1,
            };
            let mut fds = self.poll_fds();
            if fds.is_empty() {
                continue;
            }
            let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::NONE);
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => return,
            }
        }
    }

    pub fn summary(&self) -> OutputSummary {
        OutputSummary {
            bytes: self.written,
            truncated: self.truncated,
            cap: self.cap,
        }
    }

    /// One read from stream `i` into its pending buffer; false when nothing was read
    /// (empty for now, end-of-file, closed).
    fn read_once(&mut self, i: usize) -> bool {
        let Some(src) = &self.streams[i].source else {
            return false;
        };
        let mut buf = vec![0u8; CHUNK];
        let n = loop {
            match nix::unistd::read(src, &mut buf) {
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return false,
                Err(_) | Ok(0) => {
                    self.streams[i].source = None;
                    return false;
                }
                Ok(n) => break n,
            }
        };
        let keep = match self.cap {
            None => n,
            Some(cap) => {
                let room = cap.saturating_sub(self.accepted);
                if (n as u64) > room {
                    // A byte beyond the cap: cut here and stop reading either stream.
                    self.truncated = true;
                    for s in &mut self.streams {
                        s.source = None;
                    }
                }
                n.min(usize::try_from(room).unwrap_or(usize::MAX))
            }
        };
        self.accepted += keep as u64;
        let s = &mut self.streams[i];
        if !s.has_pending() {
            s.pending.clear();
            s.written = 0;
        }
        s.pending.extend_from_slice(&buf[..keep]);
        keep > 0
    }

    /// Writes stream `i`'s pending bytes for as long as its destination takes them.
    fn flush(&mut self, i: usize) {
        let s = &mut self.streams[i];
        while s.has_pending() {
            let left = &s.pending[s.written..];
            let piece = if s.sink_is_file {
                left
            } else if writable_now(s.sink.as_fd()) {
                &left[..left.len().min(PIPE_BUF)]
            } else {
                return;
            };
            match nix::unistd::write(&s.sink, piece) {
                Ok(n) => {
                    s.written += n;
                    self.written += n as u64;
                }
                Err(Errno::EINTR) | Err(Errno::EAGAIN) => {
                    if s.sink_is_file {
                        return;
                    }
                }
                Err(_) => {
                    // The destination is gone (its reader closed, the disk is full): the
                    // payload learns it the way it would have without the pump, by EPIPE
                    // on its next write.
                    s.pending.clear();
                    s.written = 0;
                    s.source = None;
                    return;
                }
            }
        }
    }

    /// How many of the two pipes are still read.
    pub fn open_pipes(&self) -> usize {
        self.streams.iter().filter(|s| s.source.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn file_sink() -> Result<(std::fs::File, OwnedFd), Box<dyn std::error::Error>> {
        let f = tempfile::tempfile()?;
        let sink = OwnedFd::from(f.try_clone()?);
        Ok((f, sink))
    }

    fn contents(mut f: &std::fs::File) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let mut out = Vec::new();
        f.rewind()?;
        f.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn output_under_the_cap_passes_whole_and_is_not_truncated() -> TestResult {
        let (out, out_sink) = file_sink()?;
        let (err, err_sink) = file_sink()?;
        let (mut pump, [w_out, w_err]) = OutputPump::new(Some(100), out_sink, err_sink)?;
        std::fs::File::from(w_out).write_all(b"hello\n")?;
        std::fs::File::from(w_err).write_all(b"oops\n")?;
        pump.drain(None);
        assert!(pump.is_done());
        assert_eq!(contents(&out)?, b"hello\n");
        assert_eq!(contents(&err)?, b"oops\n");
        assert_eq!(
            pump.summary(),
            OutputSummary {
                bytes: 11,
                truncated: false,
                cap: Some(100)
            }
        );
        Ok(())
    }

    #[test]
    fn exactly_the_cap_then_end_of_file_is_not_truncated() -> TestResult {
        let (out, out_sink) = file_sink()?;
        let (_err, err_sink) = file_sink()?;
        let (mut pump, [w_out, w_err]) = OutputPump::new(Some(4), out_sink, err_sink)?;
        drop(w_err);
        std::fs::File::from(w_out).write_all(b"abcd")?;
        pump.drain(None);
        assert_eq!(contents(&out)?, b"abcd");
        assert!(!pump.summary().truncated);
        Ok(())
    }

    #[test]
    fn the_cap_counts_both_streams_and_closes_both_pipes() -> TestResult {
        let (out, out_sink) = file_sink()?;
        let (err, err_sink) = file_sink()?;
        let (mut pump, [w_out, w_err]) = OutputPump::new(Some(10), out_sink, err_sink)?;
        let mut w_out = std::fs::File::from(w_out);
        let mut w_err = std::fs::File::from(w_err);
        w_err.write_all(b"123456")?;
        pump.progress();
        w_out.write_all(b"abcdefgh")?;
        pump.progress();
        assert_eq!(contents(&err)?, b"123456");
        assert_eq!(contents(&out)?, b"abcd");
        assert!(pump.summary().truncated);
        assert_eq!(pump.open_pipes(), 0, "both pipes are closed at the cap");
        // The writers now get EPIPE (the test process ignores SIGPIPE, as Rust programs do).
        match w_err.write_all(b"more") {
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPIPE)),
            Ok(()) => panic!("a write after the cap succeeded"),
        }
        assert_eq!(pump.summary().bytes, 10);
        Ok(())
    }

    #[test]
    fn without_a_cap_everything_passes() -> TestResult {
        let (out, out_sink) = file_sink()?;
        let (_err, err_sink) = file_sink()?;
        let (mut pump, [w_out, w_err]) = OutputPump::new(None, out_sink, err_sink)?;
        drop(w_err);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let data = data.clone();
            std::thread::spawn(move || std::fs::File::from(w_out).write_all(&data))
        };
        while !pump.is_done() {
            let mut fds = pump.poll_fds();
            let _ = poll(&mut fds, PollTimeout::from(100u16));
            drop(fds);
            pump.progress();
        }
        match writer.join() {
            Ok(r) => r?,
            Err(_) => panic!("the writer thread panicked"),
        }
        assert_eq!(contents(&out)?, data);
        assert_eq!(pump.summary().bytes, data.len() as u64);
        Ok(())
    }

    #[test]
    fn a_destination_that_stops_reading_never_blocks_the_pump() -> TestResult {
        // The destination is a pipe nobody reads: once it is full the pump must return
        // from progress() instead of waiting in write(2).
        let (dest_r, dest_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let (_err, err_sink) = file_sink()?;
        let (mut pump, [w_out, w_err]) = OutputPump::new(None, dest_w, err_sink)?;
        drop(w_err);
        fcntl(&w_out, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        let mut w_out = std::fs::File::from(w_out);
        let chunk = vec![b'x'; 64 << 10];
        // Fill the payload pipe and the destination pipe; every call must return.
        for _ in 0..8 {
            let _ = w_out.write(&chunk);
            pump.progress();
        }
        assert!(!pump.is_done());
        assert!(
            !pump.poll_fds().is_empty(),
            "the pump waits for the destination"
        );
        let written = pump.summary().bytes;
        assert!(written > 0, "some output reached the destination");
        // Reading the destination makes room, and the pump continues.
        let mut sink = std::fs::File::from(dest_r);
        let mut buf = vec![0u8; 64 << 10];
        let n = sink.read(&mut buf)?;
        assert!(n > 0);
        pump.progress();
        assert!(pump.summary().bytes > written);
        Ok(())
    }

    #[test]
    fn a_closed_destination_closes_its_pipe() -> TestResult {
        let (dest_r, dest_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        drop(dest_r);
        let (_err, err_sink) = file_sink()?;
        let (mut pump, [w_out, w_err]) = OutputPump::new(None, dest_w, err_sink)?;
        drop(w_err);
        let mut w_out = std::fs::File::from(w_out);
        w_out.write_all(b"nobody reads this")?;
        pump.progress();
        assert_eq!(pump.open_pipes(), 0);
        match w_out.write_all(b"again") {
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPIPE)),
            Ok(()) => panic!("a write to a pipe whose destination is gone succeeded"),
        }
        Ok(())
    }
}
