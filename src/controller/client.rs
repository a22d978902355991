//! Blocking clients of the controller's sockets: [`ApiClient`] for the command line, and
//! [`AgentClient`] for a worker talking through its inherited socket (`HATCHERY_FD`).

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::protocol::{ApiRequest, ApiResponse, WorkerMessage, WorkerReply};
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
    #[error(
        "a reply to another call of this worker ({0}) came while this call waited for the decision on approval {1}: a worker makes one call at a time (the decision will be passed over by a later call)"
    )]
    OutOfTurn(&'static str, String),
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

/// Most decisions [`AgentClient`] keeps to show after passing them over; later ones are
/// counted. The controller sends one per request a person decided, so this bounds what a
/// call keeps whatever the worker asked before.
const MAX_PASSED_OVER: usize = 16;

/// A worker's connection to its controller.
pub struct AgentClient {
    stream: UnixStream,
    /// Decisions read on the way to this call's reply: the calls that waited for them have
    /// ended (a worker's own time limit, a signal). They settle nothing here.
    passed_over: Vec<WorkerReply>,
    passed_over_uncounted: usize,
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
        Ok(AgentClient::from_stream(UnixStream::from(owned)))
    }

    pub fn from_stream(stream: UnixStream) -> AgentClient {
        AgentClient {
            stream,
            passed_over: Vec::new(),
            passed_over_uncounted: 0,
        }
    }

    /// The decisions passed over so far (at most [`MAX_PASSED_OVER`]), and how many more
    /// there were.
    pub fn take_passed_over(&mut self) -> (Vec<WorkerReply>, usize) {
        (
            std::mem::take(&mut self.passed_over),
            std::mem::take(&mut self.passed_over_uncounted),
        )
    }

    fn pass_over(&mut self, decision: WorkerReply) {
        if self.passed_over.len() < MAX_PASSED_OVER {
            self.passed_over.push(decision);
        } else {
            self.passed_over_uncounted = self.passed_over_uncounted.saturating_add(1);
        }
    }

    fn next_frame(&mut self) -> Result<WorkerReply, ClientError> {
        wire::read_frame(&mut self.stream)?.ok_or(ClientError::Closed)
    }

    /// Reads the controller's welcome (this worker's id and manifest). The controller sends
    /// it once, unasked, when the worker starts; it is in the socket before the worker's
    /// first instruction runs. A process that finds none within `timeout` is not the
    /// worker's first to read it, and is told so instead of waiting for ever.
    pub fn welcome(&mut self, timeout: Duration) -> Result<WorkerReply, ClientError> {
        let _ = self.stream.set_read_timeout(Some(timeout));
        let frame = wire::read_frame(&mut self.stream);
        // The timeout belongs to the socket, shared with the worker's other processes.
        let _ = self.stream.set_read_timeout(None);
        match frame {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err(ClientError::Closed),
            Err(FrameError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(ClientError::NoWelcome(timeout.as_secs()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Reads the reply to the request just sent. A welcome no process of this worker has
    /// read yet comes first on the socket (the controller queues it before any reply): it
    /// is passed over, so a worker may make each call from a process of its own,
    /// registered or not. So is a decision on an earlier request whose waiting call has
    /// ended: it answers no request being made now.
    pub fn receive(&mut self) -> Result<WorkerReply, ClientError> {
        loop {
            match self.next_frame()? {
                WorkerReply::Welcome { .. } => continue,
                reply if reply.decides().is_some() => self.pass_over(reply),
                reply => return Ok(reply),
            }
        }
    }

    /// Waits for the decision on `approval_id` (a `replicate` answered `pending`). Decisions
    /// on other requests are passed over; a reply to another call means the worker broke
    /// the one-call-at-a-time rule, and is an error rather than taken for the decision.
    pub fn decision(&mut self, approval_id: &str) -> Result<WorkerReply, ClientError> {
        loop {
            let reply = self.next_frame()?;
            match reply.decides() {
                Some(id) if id == approval_id => return Ok(reply),
                Some(_) => self.pass_over(reply),
                None if matches!(reply, WorkerReply::Welcome { .. }) => continue,
                None => {
                    return Err(ClientError::OutOfTurn(
                        reply.kind(),
                        approval_id.to_string(),
                    ));
                }
            }
        }
    }

    /// Sends one request and waits for its reply.
    pub fn call(&mut self, message: &WorkerMessage) -> Result<WorkerReply, ClientError> {
        wire::write_frame(&mut self.stream, message)?;
        self.receive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::protocol::Claim;

    fn decided(approval: &str) -> WorkerReply {
        WorkerReply::Denied {
            event: "approval_denied".into(),
            reason: format!("no to {approval}"),
            approval_id: Some(approval.into()),
        }
    }

    /// A client, and the controller's end with `frames` already sent.
    fn client_with(frames: &[WorkerReply]) -> Result<(AgentClient, UnixStream), ClientError> {
        let (ours, mut theirs) = UnixStream::pair().map_err(FrameError::Io)?;
        for f in frames {
            wire::write_frame(&mut theirs, f)?;
        }
        Ok((AgentClient::from_stream(ours), theirs))
    }

    #[test]
    fn a_call_passes_over_decisions_its_own_request_did_not_ask_for() -> Result<(), ClientError> {
        let (mut c, _controller) = client_with(&[decided("a-1"), decided("a-2"), WorkerReply::Ok])?;
        let reply = c.call(&WorkerMessage::Heartbeat(Claim::default()))?;
        assert_eq!(reply, WorkerReply::Ok);
        let (passed, more) = c.take_passed_over();
        assert_eq!(passed, vec![decided("a-1"), decided("a-2")]);
        assert_eq!(more, 0);
        Ok(())
    }

    #[test]
    fn a_wait_takes_only_its_own_decision_and_never_another_calls_reply() -> Result<(), ClientError>
    {
        let (mut c, _controller) = client_with(&[decided("a-1"), decided("a-2")])?;
        assert_eq!(c.decision("a-2")?, decided("a-2"));
        assert_eq!(c.take_passed_over().0, vec![decided("a-1")]);

        let (mut c, _controller) = client_with(&[WorkerReply::Ok, decided("a-3")])?;
        match c.decision("a-3") {
            Err(ClientError::OutOfTurn("ok", id)) => assert_eq!(id, "a-3"),
            other => panic!("an `ok` was taken for the decision: {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn decisions_passed_over_are_kept_to_a_bound_and_the_rest_counted() -> Result<(), ClientError> {
        let mut frames: Vec<WorkerReply> = (0..MAX_PASSED_OVER + 5)
            .map(|i| decided(&format!("a-{i}")))
            .collect();
        frames.push(WorkerReply::Ok);
        let (mut c, _controller) = client_with(&frames)?;
        assert_eq!(c.receive()?, WorkerReply::Ok);
        let (passed, more) = c.take_passed_over();
        assert_eq!((passed.len(), more), (MAX_PASSED_OVER, 5));
        Ok(())
    }
}
