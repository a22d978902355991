//! hatchery's own log lines while a sandbox runs are never written by the supervisor's
//! loop. A write to stderr can wait inside the kernel, uninterruptibly (a reader splicing
//! from the pipe holds its lock; a frozen file system), and a line written on the loop
//! that enforces `--timeout` (`-v`'s note of a stale cgroup swept, `-vv`'s debug lines)
//! held the timeout with it: the sandbox ran on for as long as the reader liked.
//!
//! From before the sandbox starts until its report is written ([`off_loop`]) lines are
//! held at first (hatchery's error lines with them, in order); once nothing more is
//! forked ([`stream_off_loop`]) a thread of their own writes them, and later ones as they
//! come. The thread is started only when there is a line to write: most runs log nothing,
//! and a start pays for no thread it does not need. When the guard is dropped (the sandbox
//! has ended) the thread finishes what it has and lines are written directly again.
//! Held and queued lines are bounded; past the bound they are counted, and the count said.

use std::os::fd::AsFd;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;

/// Most bytes of lines held before the thread may start.
const MOST_HELD: usize = 256 << 10;
/// Most lines queued for the thread (a thread held by its write takes no more).
const MOST_QUEUED: usize = 1024;

/// Lines off the loop; `None` when lines are written directly.
static LINES: Mutex<Option<Lines>> = Mutex::new(None);

#[derive(Default)]
struct Lines {
    /// Lines not yet handed to the thread.
    held: String,
    /// Lines neither held nor queued, past the bounds.
    left_out: u64,
    /// Whether nothing more is forked: a thread may write the lines.
    streaming: bool,
    /// The thread's queue and the thread, once started.
    writer: Option<(SyncSender<String>, JoinHandle<()>)>,
}

impl Lines {
    fn hold(&mut self, line: String) {
        if self.held.len().saturating_add(line.len()) <= MOST_HELD {
            self.held.push_str(&line);
        } else {
            self.left_out = self.left_out.saturating_add(1);
        }
    }

    /// Starts the thread where lines wait for it and it may be started.
    fn start_writer(&mut self) {
        if !self.streaming || self.writer.is_some() || self.held.is_empty() {
            return;
        }
        let (to, from) = sync_channel::<String>(MOST_QUEUED);
        let spawned = std::thread::Builder::new()
            .name("log".to_string())
            .spawn(move || {
                for line in from {
                    write_out(&line);
                }
            });
        // Without a thread the lines stay held, and are written when the sandbox has ended.
        if let Ok(thread) = spawned {
            if to.try_send(std::mem::take(&mut self.held)).is_ok() {
                self.writer = Some((to, thread));
            }
        }
    }
}

/// How long lines wait, at most, for a non-blocking stderr that takes nothing.
const NON_BLOCKING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Writes `text` to stderr through the descriptor itself: the standard stream's lock is
/// not held while a write waits, so the supervisor's own lines after the run (which take
/// it) wait only for the descriptor, as they would anyway. A stderr left non-blocking (by
/// the command, which may share its description; by the relay's brief `O_NONBLOCK` on a
/// pty master) is waited for, not given up at the first EAGAIN; but for 10 s at most
/// (then the rest is lost): a blocking stderr that takes nothing holds any program's
/// exit, a non-blocking one was never meant to.
fn write_out(text: &str) {
    use nix::errno::Errno;
    use nix::poll::{PollFd, PollFlags};
    let stderr = std::io::stderr();
    let mut left = text.as_bytes();
    let mut deadline = None;
    while !left.is_empty() {
        match nix::unistd::write(stderr.as_fd(), left) {
            Ok(0) => return,
            Ok(n) => left = left.get(n..).unwrap_or_default(),
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                let until = *deadline
                    .get_or_insert_with(|| std::time::Instant::now() + NON_BLOCKING_PATIENCE);
                if until <= std::time::Instant::now() {
                    return;
                }
                let mut fds = [PollFd::new(stderr.as_fd(), PollFlags::POLLOUT)];
                if hatchery::sandbox::wait::poll_until(&mut fds, Some(until), None).is_err() {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

/// `line` back when it is to be written directly; else it was held or queued (or left
/// out, and counted).
pub(super) fn take(line: String) -> Option<String> {
    let mut lines = LINES.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(lines) = lines.as_mut() else {
        return Some(line);
    };
    match &lines.writer {
        Some((to, _)) => match to.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => lines.left_out = lines.left_out.saturating_add(1),
            Err(TrySendError::Disconnected(line)) => lines.hold(line),
        },
        None => {
            lines.hold(line);
            lines.start_writer();
        }
    }
    None
}

/// Takes hatchery's log lines off the supervisor's loop until the returned guard is
/// dropped: held until [`stream_off_loop`], then written by a thread of their own.
pub fn off_loop() -> OffLoop {
    *LINES.lock().unwrap_or_else(PoisonError::into_inner) = Some(Lines::default());
    OffLoop(())
}

/// Nothing more is forked: lines held so far, and later ones, may be written by a thread.
pub fn stream_off_loop() {
    if let Some(lines) = LINES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
    {
        lines.streaming = true;
        lines.start_writer();
    }
}

/// While alive, hatchery's log lines are off the supervisor's loop (see [`off_loop`]).
pub struct OffLoop(());

impl Drop for OffLoop {
    fn drop(&mut self) {
        let lines = LINES.lock().unwrap_or_else(PoisonError::into_inner).take();
        let Some(lines) = lines else {
            return;
        };
        if let Some((to, thread)) = lines.writer {
            // The queue's end: the thread writes what it has, then ends.
            drop(to);
            let _ = thread.join();
        }
        write_out(&lines.held);
        if lines.left_out > 0 {
            tracing::warn!(
                lines = lines.left_out,
                "log lines from while the sandbox ran were left out (more than {MOST_QUEUED} waited to be written, or {MOST_HELD} bytes)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_lines_are_bounded_and_what_is_left_out_is_counted() {
        let mut lines = Lines::default();
        let line = "x".repeat(1000) + "\n";
        for _ in 0..(MOST_HELD / line.len() + 10) {
            lines.hold(line.clone());
        }
        assert!(lines.held.len() <= MOST_HELD);
        assert_eq!(lines.left_out, 10);
        // Nothing is started before nothing more is forked.
        lines.start_writer();
        assert!(lines.writer.is_none());
    }
}
