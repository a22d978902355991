//! The supervisor's view of a running sandbox: signals, accounting, waiting (with its
//! output pump and forwarded signals), and the report of how it ended.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::WaitStatus;

use super::super::cgroup::Usage;
use super::super::channel::{self, FromSandbox, Heard};
use super::super::output::{OutputPump, Relay};
use super::super::seccomp::LoadableFilter;
use super::super::{Filters, SandboxError};
use super::super::{process, wait};
use super::{Failure, Outcome, SETUP_FAILED, Sandbox};

impl Sandbox {
    /// The host pid of the sandbox's pid 1.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// The egress listeners (DNS UDP, DNS TCP, proxy, then one per port), for the broker;
    /// empty without egress, or once taken.
    pub fn take_egress_listeners(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.egress)
    }

    pub fn cgroup_path(&self) -> Option<std::path::PathBuf> {
        self.cgroup.as_ref().map(|c| c.path().to_path_buf())
    }

    /// Closes the descriptors the cgroup holds for a quick start and end (see
    /// [`SandboxCgroup::release_descriptors`]): for a supervisor of many sandboxes.
    ///
    /// [`SandboxCgroup::release_descriptors`]: super::super::cgroup::SandboxCgroup::release_descriptors
    pub fn release_cgroup_descriptors(&mut self) {
        if let Some(cg) = self.cgroup.as_mut() {
            cg.release_descriptors();
        }
    }

    /// Sends the sandbox its seccomp filters with the start gate's write end, keeping the
    /// read end (see `channel::start_gate`). A gate that cannot be made is an error: the
    /// sandbox would wait for its filters for ever. A send that fails is not: the sandbox
    /// is gone already (a setup failure it reported), and `wait` tells.
    pub(super) fn hand_filters(&mut self, filters: &Filters) -> Result<(), SandboxError> {
        let (gate, token) = channel::start_gate().map_err(|e| {
            SandboxError::Internal(format!("cannot make the sandbox's start gate: {e}"))
        })?;
        let _ = channel::send_filters(
            &self.channel,
            &LoadableFilter::new(&filters.floor),
            &LoadableFilter::new(&filters.profile),
            token.as_fd(),
        );
        self.start_gate = Some(gate);
        Ok(())
    }

    /// For a supervisor that passes no signals on (the controller's launcher): the start
    /// gate is closed, one descriptor fewer per running sandbox for every clone to copy.
    pub fn forget_start_gate(&mut self) {
        self.start_gate = None;
    }

    /// Whether the command is past its `execve` (or its set-up ended): false while pid 1
    /// waits for the start, when a signal passed on to it would wait too.
    fn start_is_over(&self) -> bool {
        self.start_gate
            .as_ref()
            .is_none_or(|gate| channel::start_is_over(gate.as_fd()))
    }

    /// Live accounting, while the sandbox runs.
    pub fn usage(&self) -> Option<Usage> {
        self.cgroup.as_ref().map(|c| c.usage())
    }

    /// Passes a signal to pid 1, which forwards it to the payload.
    pub fn signal(&self, sig: Signal) -> io::Result<()> {
        process::pidfd_signal(self.pidfd.as_fd(), sig)
    }

    /// Kills everything in the sandbox: pid 1 (the kernel then kills its namespace) and,
    /// for good measure, the whole cgroup where the kernel can do that itself
    /// (`cgroup.kill`). Returns without waiting for any of it to end:
    /// the pidfd says when pid 1 has, and [`Sandbox::finish`] removes the cgroup once it
    /// is empty.
    pub fn kill(&self) {
        let _ = process::pidfd_signal(self.pidfd.as_fd(), Signal::SIGKILL);
        if let Some(cg) = &self.cgroup {
            cg.kill_now();
        }
    }

    /// Starts moving the sandbox's input and output through `pump` (when its stdio are
    /// the pump's pipes or terminal), on a thread of its own ([`Relay`]), draining it
    /// until `timeout` once the sandbox has ended. Call it once nothing more is forked,
    /// and as soon as the sandbox runs: the command's output waits in its pipes until then.
    pub fn relay(
        &self,
        pump: OutputPump,
        timeout: Option<Duration>,
    ) -> Result<Relay, SandboxError> {
        Relay::start(pump, timeout.map(|t| self.started + t)).map_err(|e| {
            SandboxError::Internal(format!(
                "cannot start the thread that relays the command's stdin, stdout and stderr: {e}"
            ))
        })
    }

    /// Waits for the sandbox to end, killing it at `timeout`, forwarding the signals that
    /// arrive on `signals` to it, while `relay` moves its input and output: this loop,
    /// which enforces the timeout, never makes a call on a caller's descriptor. A SIGWINCH
    /// resizes the sandbox's terminal, when it has one, instead of being forwarded.
    pub fn wait(
        self,
        timeout: Option<Duration>,
        signals: Option<&SignalFd>,
        relay: Option<Relay>,
    ) -> Outcome {
        use nix::poll::{PollFd, PollFlags};
        let deadline = timeout.map(|t| self.started + t);
        let mut timed_out = false;
        let mut told = Told::default();
        // pid 1's messages are read as they come, until the payload's status: then the
        // accounting is read while pid 1 exits (the sandbox's mount namespace goes with
        // it), instead of after.
        let mut listening = true;
        let mut usage_at_exit = None;
        loop {
            if deadline.is_some_and(|d| d <= Instant::now()) {
                timed_out = true;
                self.kill();
                break;
            }
            let (exited, signalled, message) = {
                let mut fds = vec![PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
                if let Some(s) = signals {
                    fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
                }
                let channel_at = fds.len();
                if listening {
                    fds.push(PollFd::new(self.channel.as_fd(), PollFlags::POLLIN));
                }
                match wait::poll_until(&mut fds, deadline, None) {
                    Ok(0) => continue,
                    Ok(_) => {}
                    Err(_) => break,
                }
                let ready = |f: Option<&PollFd>| f.is_some_and(wait::is_ready);
                (
                    ready(fds.first()),
                    signals.is_some() && ready(fds.get(1)),
                    listening && ready(fds.get(channel_at)),
                )
            };
            if message {
                listening = self.hear(&mut told);
                if told.payload_status.is_some() && usage_at_exit.is_none() {
                    usage_at_exit = self.usage();
                }
            }
            if signalled {
                if let Some(Ok(Some(info))) = signals.map(|s| s.read_signal()) {
                    if let Ok(sig) = Signal::try_from(info.ssi_signo as i32) {
                        // A stop asked for before the command has started: pid 1 waits
                        // in the start, its signals pending, however long the command's
                        // file system takes to answer the execve. The start is abandoned,
                        // as the command would have ended had it been running. Decided
                        // by the start gate, which the kernel closes at the execve: a
                        // command that has run one instruction gets the signal.
                        if super::super::init::STOPPING.contains(&sig) && !self.start_is_over() {
                            told.stopped_by.get_or_insert(sig as i32);
                            self.kill();
                            continue;
                        }
                        // A sandbox with a terminal of its own learns of a new window size
                        // from it: the kernel signals the terminal's foreground process
                        // group when the relay copies the size. Forwarding too would
                        // signal twice, and the wrong process when the payload is a shell.
                        let resized = sig == Signal::SIGWINCH
                            && relay.as_ref().is_some_and(Relay::window_changed);
                        if !resized {
                            let _ = self.signal(sig);
                        }
                    }
                }
            }
            if exited {
                break;
            }
        }
        let status = self.reap_status();
        // Everything in the sandbox is gone now: what its pipes hold is all there is.
        let summary = relay.map(|r| r.finish(signals));
        let mut outcome = self.finish_told(told, usage_at_exit, status, timed_out);
        outcome.output = summary;
        outcome
    }

    /// Reads what pid 1 has sent, never waiting for more: at most [`HEARD_AT_ONCE`]
    /// messages. Returns whether to go on listening (false once the payload's status
    /// came, or the channel closed or sent what no sandbox sends).
    fn hear(&self, told: &mut Told) -> bool {
        for _ in 0..HEARD_AT_ONCE {
            match FromSandbox::recv_now(&self.channel) {
                Heard::Nothing => break,
                Heard::Closed => return false,
                Heard::Message(msg) => told.take(msg),
            }
            if told.payload_status.is_some() {
                return false;
            }
        }
        true
    }

    /// Waits for pid 1 to end and collects its status (`None` if it cannot be had).
    pub fn reap_status(&self) -> Option<WaitStatus> {
        wait::reap_pidfd(self.pidfd.as_fd())
    }

    /// Collects the report of an ended sandbox and removes its cgroup.
    pub fn finish(self, pid1: Option<WaitStatus>, timed_out: bool) -> Outcome {
        self.finish_told(Told::default(), None, pid1, timed_out)
    }

    /// [`Sandbox::finish`], with what pid 1 already told while the supervisor waited and
    /// the accounting read as the payload ended, if it was.
    fn finish_told(
        mut self,
        mut told: Told,
        usage_at_exit: Option<Usage>,
        pid1: Option<WaitStatus>,
        timed_out: bool,
    ) -> Outcome {
        self.finished = true;
        let wall = self.started.elapsed();
        // What came while the supervisor waited for the egress listeners, then the rest.
        let early = self.early.take();
        let rest = std::iter::from_fn(|| FromSandbox::recv(&self.channel).ok().flatten());
        for msg in early.into_iter().chain(rest) {
            told.take(msg);
        }
        let Told {
            mut failure,
            landlock,
            payload_status,
            stopped_by,
        } = told;
        let mut cleanup_error = None;
        tracing::debug!(failure = ?failure, timed_out, "the sandbox ended; reading usage and removing its cgroup");
        let usage = match self.cgroup.take() {
            Some(mut cg) => {
                let usage = usage_at_exit.unwrap_or_else(|| cg.usage());
                if let Err(e) = cg.destroy() {
                    cleanup_error = Some(e.to_string());
                }
                usage
            }
            None => Usage::default(),
        };
        // The payload's own status when pid 1 reported it; else the signal that abandoned
        // its start; else pid 1's (it was killed).
        let (code, signal) = match (payload_status, stopped_by, pid1) {
            (Some(raw), _, _) => decode_raw_status(raw),
            (None, Some(sig), _) => (128 + sig, Some(sig)),
            (None, None, Some(WaitStatus::Signaled(_, sig, _))) => {
                // A fault only pid 1's own code can raise: hatchery's crash, never the
                // command's status (see `Failure::Crashed`).
                if failure.is_none() {
                    failure = Failure::of_pid1_signal(sig as i32);
                }
                (128 + sig as i32, Some(sig as i32))
            }
            (None, None, Some(WaitStatus::Exited(_, c))) => (c, None),
            (None, None, _) => (SETUP_FAILED, None),
        };
        let oom_killed = usage.oom_kills > 0 && signal == Some(libc::SIGKILL);
        let exit_code = if timed_out {
            124
        } else {
            failure.as_ref().map_or(code, Failure::exit_code)
        };
        Outcome {
            exit_code,
            signal: if failure.is_none() { signal } else { None },
            oom_killed,
            timed_out,
            wall,
            usage,
            landlock,
            failure,
            cleanup_error,
            output: None,
        }
    }
}

/// Most messages read from pid 1 in one go (it sends a handful in a sandbox's life).
const HEARD_AT_ONCE: usize = 8;

/// What pid 1 and the payload's set-up told the supervisor about how the sandbox ended.
/// Fixed in size however many messages come: each kind keeps its first (a failure) or
/// last (Landlock, the status) value.
#[derive(Default)]
struct Told {
    failure: Option<Failure>,
    landlock: Option<(u8, String)>,
    payload_status: Option<i32>,
    /// The signal that abandoned the start, when one did (the supervisor's own decision,
    /// kept with the rest of how the sandbox ended).
    stopped_by: Option<i32>,
}

impl Told {
    /// Takes one message in.
    fn take(&mut self, msg: FromSandbox) {
        match msg {
            FromSandbox::SetupFailed {
                step,
                errno,
                detail,
            } => {
                self.failure.get_or_insert(Failure::Setup {
                    step,
                    errno,
                    detail,
                });
            }
            FromSandbox::ExecFailed { errno } => {
                self.failure.get_or_insert(Failure::Exec { errno });
            }
            FromSandbox::Landlock { abi, status } => {
                tracing::debug!(abi, status = ?status, "the sandbox applied Landlock");
                self.landlock = Some((abi, status));
            }
            FromSandbox::Exited { status } => self.payload_status = Some(status),
        }
    }
}

fn decode_raw_status(raw: i32) -> (i32, Option<i32>) {
    let sig = raw & 0x7f;
    if sig == 0 {
        ((raw >> 8) & 0xff, None)
    } else {
        (128 + sig, Some(sig))
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // A sandbox handle dropped without `finish` (an error path): leave nothing behind.
        let _ = process::pidfd_signal(self.pidfd.as_fd(), Signal::SIGKILL);
        let _ = self.reap_status();
        if let Some(mut cg) = self.cgroup.take() {
            let _ = cg.destroy();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_statuses_decode_like_a_shell() {
        assert_eq!(decode_raw_status(3 << 8), (3, None));
        assert_eq!(decode_raw_status(libc::SIGKILL), (137, Some(9)));
        assert_eq!(decode_raw_status(libc::SIGSEGV | 0x80), (139, Some(11)));
    }

    #[test]
    fn a_flood_of_messages_keeps_the_first_failure_and_the_last_word_in_fixed_space() {
        let mut told = Told::default();
        told.take(FromSandbox::ExecFailed {
            errno: libc::ENOENT,
        });
        for i in 0..10_000 {
            told.take(FromSandbox::SetupFailed {
                step: "forged".into(),
                errno: i,
                detail: String::new(),
            });
            told.take(FromSandbox::Landlock {
                abi: 1,
                status: format!("status {i}"),
            });
            told.take(FromSandbox::Exited { status: i });
        }
        // A failure is never replaced by a later one; the rest keep only their last value.
        assert_eq!(
            told.failure,
            Some(Failure::Exec {
                errno: libc::ENOENT
            })
        );
        assert_eq!(told.landlock, Some((1, "status 9999".to_string())));
        assert_eq!(told.payload_status, Some(9999));
        assert_eq!(told.stopped_by, None);
    }
}
