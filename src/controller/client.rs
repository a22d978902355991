//! Blocking clients of the controller's sockets: [`ApiClient`] for the command line, and
//! [`AgentClient`] for a worker talking through its inherited socket (`HATCHERY_FD`).

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::protocol::{ApiRequest, ApiResponse, WorkerFrame, WorkerMessage, WorkerReply};
use super::wire::{self, FrameError};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The OS error is part of the message, not a source: printed once.
    #[error("cannot reach the controller at {path}: {}", connect_reason(error))]
    Connect { path: String, error: std::io::Error },
    #[error("no controller socket: {0}")]
    NoSocket(String),
    #[error("the controller closed the connection")]
    Closed,
    #[error(
        "no welcome from the controller within {0} s: it is sent once, to the worker's first `register`, so this worker has registered already (every later call needs no register)"
    )]
    NoWelcome(u64),
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Why a connection failed, and what to do about it.
fn connect_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => format!(
            "{e} (only the controller's own user, root and members of the group given to the controller's --socket-group may connect: run as one of them, or restart the controller with --socket-group)"
        ),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            format!("{e} (is `hatchery controller` running? --socket names another socket)")
        }
        _ => e.to_string(),
    }
}

/// A connection to the controller's API socket.
pub struct ApiClient {
    stream: UnixStream,
}

impl ApiClient {
    pub fn connect(path: &Path) -> Result<ApiClient, ClientError> {
        let stream = UnixStream::connect(path).map_err(|error| ClientError::Connect {
            path: path.display().to_string(),
            error,
        })?;
        Ok(ApiClient { stream })
    }

    /// One request, one response. `timeout` bounds the wait (kill switches wait for exits).
    pub fn call(
        &mut self,
        request: &ApiRequest,
        timeout: Duration,
    ) -> Result<ApiResponse, ClientError> {
        let _ = self.stream.set_read_timeout(Some(timeout));
        let sent = wire::write_frame(&mut self.stream, request);
        // A controller that turns a client away answers first and closes: read its reason
        // even when our write found the connection closed.
        match (
            wire::read_frame_limited(&mut self.stream, wire::MAX_RESPONSE),
            sent,
        ) {
            (Ok(Some(resp)), _) => Ok(resp),
            (_, Err(e)) => Err(e.into()),
            (Ok(None), Ok(())) => Err(ClientError::Closed),
            (Err(e), Ok(())) => Err(e.into()),
        }
    }
}

/// Most frames [`AgentClient`] keeps to show after passing them over; later ones are
/// counted. They are what calls that ended left behind, so this bounds what one call keeps
/// whatever the worker did before.
const MAX_PASSED_OVER: usize = 16;

/// A name for one call, unlike any other call's of this worker (any process of it).
fn new_call() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // Without the kernel's randomness: this process's id and the time, which no other
        // live process of the worker shares.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        return format!("{}-{nanos}", std::process::id());
    }
    hex::encode(b)
}

/// Decisions passed over that a later wait of the same client may still take: the
/// newest are kept. Each is a request of this worker's that waited for a person, of which
/// the contract lets a worker have few at a time.
const MAX_DECISIONS_KEPT: usize = 64;

/// A worker's connection to its controller.
pub struct AgentClient {
    stream: UnixStream,
    /// Frames read on the way to this call's reply that answer nothing this process asked:
    /// replies and decisions whose calls ended before reading them (a worker's own time
    /// limit, a signal). For showing.
    passed_over: Vec<WorkerFrame>,
    passed_over_uncounted: usize,
    /// The decisions among them, for a later [`AgentClient::decision`] of this client.
    decisions: std::collections::VecDeque<WorkerFrame>,
    /// How deep in [`AgentClient::exclusive`] this client is: the turn is taken at the
    /// first and given back at the last (a process's record lock is one, however often
    /// it is taken).
    turns: u32,
    /// Called before waiting for a turn another process holds (to say why a call waits).
    on_turn_wait: Option<fn()>,
}

impl AgentClient {
    /// The socket named by `HATCHERY_FD` (a worker's fd 3).
    pub fn from_env() -> Result<AgentClient, ClientError> {
        let fd: i32 = std::env::var("HATCHERY_FD")
            .map_err(|_| {
                ClientError::NoSocket(
                    "HATCHERY_FD is not set (not inside a hatchery worker?)".into(),
                )
            })?
            .parse()
            .map_err(|_| ClientError::NoSocket("HATCHERY_FD is not a number".into()))?;
        let owned = crate::sandbox::process::inherited_socket(fd)
            .map_err(|e| ClientError::NoSocket(format!("fd {fd}: {e}")))?;
        let stream = UnixStream::from(owned);
        // The socket's description is shared by every process of the worker: a client
        // killed while it waited with a timeout (an older one, or another program) may
        // have left it non-blocking or timed. Calls are made one at a time, so this call
        // puts it back as the protocol expects it.
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(None);
        Ok(AgentClient::from_stream(stream))
    }

    pub fn from_stream(stream: UnixStream) -> AgentClient {
        AgentClient {
            stream,
            passed_over: Vec::new(),
            passed_over_uncounted: 0,
            decisions: std::collections::VecDeque::new(),
            turns: 0,
            on_turn_wait: None,
        }
    }

    /// Has `note` called whenever a call must wait for another process's turn.
    pub fn when_waiting_for_turn(&mut self, note: fn()) {
        self.on_turn_wait = Some(note);
    }

    /// Runs `f` holding the worker's turn on its socket (see
    /// [`crate::sandbox::process::socket_turn`]). Every process of a worker reads the one
    /// socket: two reading at once split each other's frames (one takes a length, the
    /// other the body), and the stream is lost for every later call. Calls from several
    /// processes therefore wait their turn, and a `replicate` that waits for a person
    /// keeps the turn until the decision comes. A socket that takes no lock is used
    /// without one.
    pub fn exclusive<T, E>(
        &mut self,
        f: impl FnOnce(&mut AgentClient) -> Result<T, E>,
    ) -> Result<T, E> {
        use crate::sandbox::process::{Turn, socket_turn};
        use std::os::fd::AsFd;
        if self.turns == 0 {
            let free = socket_turn(self.stream.as_fd(), Turn::Try);
            if free
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock)
            {
                if let Some(note) = self.on_turn_wait {
                    note();
                }
                let _ = socket_turn(self.stream.as_fd(), Turn::Wait);
            }
        }
        self.turns = self.turns.saturating_add(1);
        let done = f(self);
        self.turns = self.turns.saturating_sub(1);
        if self.turns == 0 {
            let _ = socket_turn(self.stream.as_fd(), Turn::Give);
        }
        done
    }

    /// The frames passed over so far (at most [`MAX_PASSED_OVER`]), and how many more
    /// there were.
    pub fn take_passed_over(&mut self) -> (Vec<WorkerFrame>, usize) {
        (
            std::mem::take(&mut self.passed_over),
            std::mem::take(&mut self.passed_over_uncounted),
        )
    }

    fn pass_over(&mut self, frame: WorkerFrame) {
        if frame.reply.decides().is_some() {
            if self.decisions.len() >= MAX_DECISIONS_KEPT {
                self.decisions.pop_front();
            }
            self.decisions.push_back(frame.clone());
        }
        if self.passed_over.len() < MAX_PASSED_OVER {
            self.passed_over.push(frame);
        } else {
            self.passed_over_uncounted = self.passed_over_uncounted.saturating_add(1);
        }
    }

    fn next_frame(&mut self) -> Result<WorkerFrame, ClientError> {
        wire::read_frame(&mut self.stream)?.ok_or(ClientError::Closed)
    }

    /// Reads the controller's welcome (this worker's id and manifest). The controller sends
    /// it once, unasked, when the worker starts; it is in the socket before the worker's
    /// first instruction runs. A process that finds none within `timeout` is not the
    /// worker's first to read it, and is told so instead of waiting for ever. It waits in
    /// poll(2), not with a timeout on the socket: the socket is every process's of the
    /// worker, and this one may be killed while it waits.
    pub fn welcome(&mut self, timeout: Duration) -> Result<WorkerReply, ClientError> {
        self.exclusive(|c| c.welcome_in_turn(timeout))
    }

    fn welcome_in_turn(&mut self, timeout: Duration) -> Result<WorkerReply, ClientError> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
        let ready = loop {
            match poll(&mut fds, ms) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(FrameError::Io(e.into()).into()),
                Ok(n) => break n > 0,
            }
        };
        if !ready {
            return Err(ClientError::NoWelcome(timeout.as_secs()));
        }
        Ok(self.next_frame()?.reply)
    }

    /// Sends one request, named for this call alone, and reads until its reply. Passed
    /// over on the way: a welcome no process of this worker has read yet (the controller
    /// queues it before any reply, so a worker may make each call from a process of its
    /// own, registered or not), and whatever calls that ended before reading their answers
    /// left behind, replies and decisions alike. None of those answers this call.
    pub fn call(&mut self, message: WorkerMessage) -> Result<WorkerReply, ClientError> {
        self.exclusive(|c| c.call_in_turn(message))
    }

    fn call_in_turn(&mut self, mut message: WorkerMessage) -> Result<WorkerReply, ClientError> {
        let call = new_call();
        message.set_call(call.clone());
        wire::write_frame(&mut self.stream, &message)?;
        self.read_until(|f| f.call.as_deref() == Some(call.as_str()))
    }

    /// Reads until the frame `mine` picks, passing over every other but a welcome.
    fn read_until(
        &mut self,
        mine: impl Fn(&WorkerFrame) -> bool,
    ) -> Result<WorkerReply, ClientError> {
        loop {
            let frame = self.next_frame()?;
            if mine(&frame) {
                return Ok(frame.reply);
            }
            if !matches!(frame.reply, WorkerReply::Welcome { .. }) {
                self.pass_over(frame);
            }
        }
    }

    /// Waits for the decision on `approval_id` (a `replicate` answered `pending`), which
    /// may already have been passed over by this client. Every other frame is passed over.
    pub fn decision(&mut self, approval_id: &str) -> Result<WorkerReply, ClientError> {
        self.exclusive(|c| c.decision_in_turn(approval_id))
    }

    fn decision_in_turn(&mut self, approval_id: &str) -> Result<WorkerReply, ClientError> {
        if let Some(i) = self
            .decisions
            .iter()
            .position(|f| f.reply.decides() == Some(approval_id))
        {
            if let Some(found) = self.decisions.remove(i) {
                return Ok(found.reply);
            }
        }
        self.read_until(|f| f.reply.decides() == Some(approval_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::protocol::Claim;

    fn decided(approval: &str) -> WorkerFrame {
        WorkerFrame::unnamed(WorkerReply::Denied {
            event: "approval_denied".into(),
            reason: format!("no to {approval}"),
            approval_id: Some(approval.into()),
        })
    }

    /// A client, and the controller's end with `frames` already sent.
    fn client_with(frames: &[WorkerFrame]) -> Result<(AgentClient, UnixStream), ClientError> {
        let (ours, mut theirs) = UnixStream::pair().map_err(FrameError::Io)?;
        for f in frames {
            wire::write_frame(&mut theirs, f)?;
        }
        Ok((AgentClient::from_stream(ours), theirs))
    }

    /// The controller's side of one call: reads the request and answers it, naming its
    /// call, after `before`.
    fn answer_after(
        mut controller: UnixStream,
        before: Vec<WorkerFrame>,
        reply: WorkerReply,
    ) -> std::thread::JoinHandle<Result<(), ClientError>> {
        std::thread::spawn(move || {
            let request: WorkerMessage =
                wire::read_frame(&mut controller)?.ok_or(ClientError::Closed)?;
            for f in before {
                wire::write_frame(&mut controller, &f)?;
            }
            let call = request.call().map(str::to_string);
            wire::write_frame(&mut controller, &WorkerFrame { reply, call })?;
            Ok(())
        })
    }

    #[test]
    fn a_call_takes_only_the_reply_that_names_it() -> Result<(), ClientError> {
        // What calls that ended left: a decision, a `pending` and an `ok` of their own
        // (named and unnamed), all before this call's reply.
        let stale = WorkerFrame {
            reply: WorkerReply::Ok,
            call: Some("an-earlier-call".into()),
        };
        let pending = WorkerFrame::unnamed(WorkerReply::Pending {
            approval_id: "a-9".into(),
            child_id: crate::manifest::tests::worker("w-child"),
            reasons: vec![],
        });
        let (mut c, controller) = client_with(&[decided("a-1"), pending.clone(), stale.clone()])?;
        let answered = answer_after(
            controller,
            vec![decided("a-2")],
            WorkerReply::error("this one"),
        );
        let reply = c.call(WorkerMessage::Heartbeat(Claim::default()))?;
        assert_eq!(reply, WorkerReply::error("this one"));
        answered.join().map_err(|_| ClientError::Closed)??;
        let (passed, more) = c.take_passed_over();
        assert_eq!(passed, vec![decided("a-1"), pending, stale, decided("a-2")]);
        assert_eq!(more, 0);
        Ok(())
    }

    #[test]
    fn a_wait_takes_only_its_own_decision_even_one_passed_over_before() -> Result<(), ClientError> {
        let (mut c, _controller) = client_with(&[
            WorkerFrame::unnamed(WorkerReply::Ok),
            decided("a-1"),
            decided("a-2"),
        ])?;
        assert_eq!(c.decision("a-2")?, decided("a-2").reply);
        // `a-1` was read on the way: a wait for it finds it without reading on.
        assert_eq!(c.decision("a-1")?, decided("a-1").reply);
        assert_eq!(
            c.take_passed_over().0,
            vec![WorkerFrame::unnamed(WorkerReply::Ok), decided("a-1")]
        );
        Ok(())
    }

    /// However much else a long-lived client passed over (more than it keeps to show), a
    /// decision it read on the way is still there for its wait.
    #[test]
    fn a_decision_passed_over_outlives_what_is_kept_for_showing() -> Result<(), ClientError> {
        let mut frames = vec![decided("a-5")];
        frames.extend((0..MAX_PASSED_OVER + 4).map(|_| WorkerFrame::unnamed(WorkerReply::Ok)));
        frames.push(decided("a-6"));
        let (mut c, controller) = client_with(&frames)?;
        let answered = answer_after(controller, vec![], WorkerReply::Ok);
        c.call(WorkerMessage::Heartbeat(Claim::default()))?;
        answered.join().map_err(|_| ClientError::Closed)??;
        assert_eq!(c.take_passed_over().1, 6);
        assert_eq!(c.decision("a-6")?, decided("a-6").reply);
        assert_eq!(c.decision("a-5")?, decided("a-5").reply);
        Ok(())
    }

    /// Two processes of a worker calling at once take turns: the second waits until the
    /// first has its answer, instead of reading half of it.
    #[test]
    fn while_a_call_has_the_turn_another_process_waits_for_it() -> Result<(), ClientError> {
        let (ours, _theirs) = UnixStream::pair().map_err(FrameError::Io)?;
        let shared = ours.try_clone().map_err(FrameError::Io)?;
        let mut c = AgentClient::from_stream(ours);
        let during =
            c.exclusive(|_| Ok::<_, ClientError>(other_process_finds_the_turn(&shared)))?;
        let after = other_process_finds_the_turn(&shared);
        match (during, after) {
            (Some(during), Some(after)) => {
                assert!(
                    !during,
                    "another process took the turn while a call held it"
                );
                assert!(after, "the turn was not given back");
            }
            _ => eprintln!("no python3 here: turn-taking not checked"),
        }
        Ok(())
    }

    /// Whether another process (Python, the socket as its stdin) could take the turn on
    /// `shared` now, without waiting. `None` without Python.
    fn other_process_finds_the_turn(shared: &UnixStream) -> Option<bool> {
        use std::process::{Command, Stdio};
        let stdin = shared.try_clone().ok()?;
        let out = Command::new("python3")
            .args([
                "-c",
                "import fcntl\ntry:\n    fcntl.lockf(0, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\nexcept OSError:\n    print('held')",
            ])
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(stdin)))
            .output()
            .ok()?;
        match String::from_utf8_lossy(&out.stdout).trim() {
            "free" => Some(true),
            "held" => Some(false),
            _ => None,
        }
    }

    #[test]
    fn frames_passed_over_are_kept_to_a_bound_and_the_rest_counted() -> Result<(), ClientError> {
        let frames: Vec<WorkerFrame> = (0..MAX_PASSED_OVER + 5)
            .map(|i| decided(&format!("a-{i}")))
            .collect();
        let (mut c, controller) = client_with(&frames)?;
        let answered = answer_after(controller, vec![], WorkerReply::Ok);
        assert_eq!(
            c.call(WorkerMessage::Heartbeat(Claim::default()))?,
            WorkerReply::Ok
        );
        answered.join().map_err(|_| ClientError::Closed)??;
        let (passed, more) = c.take_passed_over();
        assert_eq!((passed.len(), more), (MAX_PASSED_OVER, 5));
        Ok(())
    }

    /// The socket is every process's of the worker, and a process may be killed while it
    /// waits for the welcome: the wait must not be a setting of the socket's.
    #[test]
    fn a_welcome_wait_never_changes_the_shared_socket() -> Result<(), ClientError> {
        let (c, _controller) = client_with(&[])?;
        let shared = c.stream.try_clone().map_err(FrameError::Io)?;
        let mut c = c;
        let waiting = std::thread::spawn(move || c.welcome(Duration::from_millis(500)));
        std::thread::sleep(Duration::from_millis(100));
        // As another process sees it, mid-wait.
        assert_eq!(shared.read_timeout().map_err(FrameError::Io)?, None);
        let waited = waiting.join().map_err(|_| ClientError::Closed)?;
        assert!(
            matches!(waited, Err(ClientError::NoWelcome(_))),
            "{waited:?}"
        );
        Ok(())
    }
}
