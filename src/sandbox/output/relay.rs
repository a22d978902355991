//! The pump on a thread of its own, so that the loop that enforces a sandbox's `--timeout`
//! and forwards its signals never makes a call on a caller's descriptor.
//!
//! Every call the pump makes is one that should not wait (see the module above), yet some
//! wait regardless, inside the kernel and uninterruptibly, before any flag is looked at:
//! a write to a pipe whose reader holds the pipe's lock (a reader splicing from it into a
//! socket that is full holds it for as long as the socket stays full), a write to a file
//! on a frozen file system, a device that another process empties or fills between
//! poll(2) and the call. Made on the supervisor's own loop, any of them held the timeout,
//! and with it a payload that was due to be killed, for as long as the caller's side
//! pleased. On a thread of its own such a call holds only the relay: the sandbox is still
//! killed at its timeout, its cgroup removed and its report written; the process then
//! exits around the thread, once the call returns (a thread waiting uninterruptibly
//! cannot be killed, and its process is not gone before it is).
//!
//! The thread is started after the sandbox (and its broker) have been forked, so no fork
//! happens while it runs; it inherits the supervisor's blocked signals, which the
//! supervisor reads from its signalfd.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;

use super::super::wait;
use super::{OutputPump, OutputSummary};

/// How long past the deadline the supervisor still waits for a relay that is draining: a
/// relay not held by a call finishes within one poll of the deadline.
const GRACE: Duration = Duration::from_millis(250);
/// Wake-ups the relay reads at most at once (there are at most one or two).
const WAKE_UPS_AT_ONCE: usize = 16;

/// A running relay thread and what it has moved so far.
///
/// What the supervisor tells the relay can neither be lost nor fill up while the relay is
/// held by a call: a window change is a flag, with one byte to wake the relay written only
/// when the flag was clear; the sandbox's end is the end of the wake-up pipe (its write
/// end closed), which no number of earlier wake-ups can hold back. (A byte per SIGWINCH
/// filled the pipe behind a held relay, and the byte that said the sandbox had ended was
/// then refused: the supervisor waited for a relay that never heard it.)
pub struct Relay {
    /// The wake-up pipe's write end (non-blocking: a relay held by a call never holds the
    /// supervisor); closed to tell the relay the sandbox has ended.
    wake: OwnedFd,
    /// Set when the caller's window changed size, cleared by the relay as it copies it.
    window: Arc<AtomicBool>,
    /// Hung up when the thread has finished (it holds the other end).
    finished: OwnedFd,
    /// What the thread has moved, as of its last round.
    seen: Arc<Mutex<OutputSummary>>,
    /// Whether the sandbox has a terminal of its own (see [`OutputPump::window_changed`]).
    terminal: bool,
    /// Until when the relay drains once the sandbox has ended (the run's timeout).
    deadline: Option<Instant>,
}

impl Relay {
    /// Starts moving `pump`'s bytes on a thread of its own, draining what is left once
    /// told the sandbox has ended, until `deadline` (the run's timeout).
    pub fn start(pump: OutputPump, deadline: Option<Instant>) -> io::Result<Relay> {
        let (woken, wake) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(io::Error::from)?;
        let (finished, done) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let seen = Arc::new(Mutex::new(pump.summary()));
        let window = Arc::new(AtomicBool::new(false));
        let terminal = pump.has_terminal();
        let heard = Thread {
            woken,
            window: Arc::clone(&window),
            seen: Arc::clone(&seen),
            deadline,
        };
        std::thread::Builder::new()
            .name("relay".to_string())
            .spawn(move || {
                heard.run(pump);
                // The supervisor learns the relay is over by the hang-up.
                drop(done);
            })?;
        Ok(Relay {
            wake,
            window,
            finished,
            seen,
            terminal,
            deadline,
        })
    }

    /// The caller's window changed size (SIGWINCH): the relay passes the new size on.
    /// Returns whether the sandbox has a terminal (and so needs no forwarded SIGWINCH).
    pub fn window_changed(&self) -> bool {
        if self.terminal && !self.window.swap(true, Ordering::AcqRel) {
            let _ = nix::unistd::write(&self.wake, &[0]);
        }
        self.terminal
    }

    /// The sandbox has ended: the relay moves what its pipes still hold, until its
    /// deadline. Waits for it until just after the deadline (for ever without one), or
    /// until one of the signals that stop a run comes on `signals` (the command has
    /// ended; what is left of its output is given up), and returns what passed. A relay
    /// still held by a call then is left to it, and the summary says the output was not
    /// all written.
    pub fn finish(self, signals: Option<&SignalFd>) -> OutputSummary {
        let Relay {
            wake,
            finished,
            seen,
            deadline,
            ..
        } = self;
        drop(wake);
        let until = deadline.map(|d| d + GRACE);
        let done = loop {
            let mut fds = vec![PollFd::new(finished.as_fd(), PollFlags::POLLIN)];
            if let Some(s) = signals {
                fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
            }
            let ready = wait::poll_until(&mut fds, until, None);
            let over = fds.first().is_some_and(wait::is_ready);
            let signalled = fds.get(1).is_some_and(wait::is_ready);
            match ready {
                Ok(0) if until.is_some_and(|u| u <= Instant::now()) => break false,
                Err(_) => break false,
                Ok(_) if over => break true,
                Ok(_) if signalled && stops_the_run(signals) => break false,
                Ok(_) => continue,
            }
        };
        let mut summary = *seen.lock().unwrap_or_else(PoisonError::into_inner);
        summary.stalled = !done;
        summary
    }
}

/// Reads one signal from `signals`: whether it is one that stops a run (^C, a service
/// manager's stop). Others (a late SIGWINCH) were for a sandbox that has ended.
fn stops_the_run(signals: Option<&SignalFd>) -> bool {
    let Some(Ok(Some(info))) = signals.map(SignalFd::read_signal) else {
        return false;
    };
    i32::try_from(info.ssi_signo)
        .ok()
        .and_then(|n| Signal::try_from(n).ok())
        .is_some_and(|sig| super::super::init::STOPPING.contains(&sig))
}

/// The relay thread's side.
struct Thread {
    /// The wake-up pipe's read end (non-blocking): at end-of-file once the sandbox ended.
    woken: OwnedFd,
    window: Arc<AtomicBool>,
    seen: Arc<Mutex<OutputSummary>>,
    deadline: Option<Instant>,
}

impl Thread {
    /// Moves bytes as they come, and window sizes as told, until told the sandbox has
    /// ended; then drains until the deadline.
    fn run(self, mut pump: OutputPump) {
        loop {
            // First before any poll: a stream whose every call fails at once (a caller's
            // pipe end opened the other way) is never reported ready, and ends here.
            pump.progress();
            self.publish(&pump);
            let heard = {
                let mut fds = pump.poll_fds();
                fds.push(PollFd::new(self.woken.as_fd(), PollFlags::POLLIN));
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    // Nothing to poll with (out of memory): try again shortly, not at once.
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
                fds.last().is_some_and(wait::is_ready)
            };
            if !heard {
                continue;
            }
            let mut buf = [0u8; WAKE_UPS_AT_ONCE];
            let ended = matches!(nix::unistd::read(&self.woken, &mut buf), Ok(0));
            if self.window.swap(false, Ordering::AcqRel) {
                pump.window_changed();
            }
            if ended {
                pump.drain_telling(self.deadline, |p| self.publish(p));
                return;
            }
        }
    }

    fn publish(&self, pump: &OutputPump) {
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = pump.summary();
    }
}
