//! Blocking clients of the controller's sockets: [`ApiClient`] for the command line, and
//! [`AgentClient`] for a worker talking through its inherited socket (`HATCHERY_FD`).

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::protocol::{ApiRequest, ApiResponse, WorkerMessage, WorkerReply};
use super::wire::{self, FrameError};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot reach the controller at {path}: {source} (is `hatchery controller` running? --socket names another)"
    )]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("no controller socket: {0}")]
    NoSocket(String),
    #[error("the controller closed the connection")]
    Closed,
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// A connection to the controller's API socket.
pub struct ApiClient {
    stream: UnixStream,
}

impl ApiClient {
    pub fn connect(path: &Path) -> Result<ApiClient, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.display().to_string(),
            source,
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

    /// Reads the next frame from the controller (the welcome, or a reply).
    pub fn receive(&mut self) -> Result<WorkerReply, ClientError> {
        wire::read_frame(&mut self.stream)?.ok_or(ClientError::Closed)
    }

    /// Sends one request and waits for its reply.
    pub fn call(&mut self, message: &WorkerMessage) -> Result<WorkerReply, ClientError> {
        wire::write_frame(&mut self.stream, message)?;
        self.receive()
    }
}
