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

/// A worker's connection to its controller.
pub struct AgentClient {
    stream: UnixStream,
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
        Ok(AgentClient {
            stream: UnixStream::from(owned),
        })
    }

    pub fn from_stream(stream: UnixStream) -> AgentClient {
        AgentClient { stream }
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

    /// Reads the next reply. A welcome no process of this worker has read yet comes first
    /// on the socket (the controller queues it before any reply): it is passed over, so a
    /// worker may make each call from a process of its own, registered or not.
    pub fn receive(&mut self) -> Result<WorkerReply, ClientError> {
        loop {
            match wire::read_frame(&mut self.stream)?.ok_or(ClientError::Closed)? {
                WorkerReply::Welcome { .. } => continue,
                reply => return Ok(reply),
            }
        }
    }

    /// Sends one request and waits for its reply.
    pub fn call(&mut self, message: &WorkerMessage) -> Result<WorkerReply, ClientError> {
        wire::write_frame(&mut self.stream, message)?;
        self.receive()
    }
}
