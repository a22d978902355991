//! Everything the engine is told, from the sockets, the launcher and the clock.
//!
//! Why a module of its own: the server makes these and the engine takes them; neither
//! depends on the other for the type.

use tokio::sync::oneshot;

use crate::manifest::WorkerId;

use super::launcher::LauncherEvent;
use super::protocol::{ApiRequest, ApiResponse, WorkerMessage};

/// One of a connection's few places in the engine's queue (`None` where no connection
/// sent the input).
pub type InFlight = Option<tokio::sync::OwnedSemaphorePermit>;

/// Everything the engine is told.
pub enum Input {
    Api {
        peer_uid: u32,
        request: Box<ApiRequest>,
        reply: oneshot::Sender<ApiResponse>,
    },
    Worker {
        id: WorkerId,
        message: WorkerMessage,
        /// Held until the engine has handled the input: each connection has a few, so
        /// what one worker can have queued here is bounded (see `server`).
        in_flight: InFlight,
    },
    /// A frame the worker sent could not be read or parsed.
    WorkerProtocolError {
        id: WorkerId,
        error: String,
        /// The `call` the frame named, if that much of it could be read.
        call: Option<String>,
        in_flight: InFlight,
    },
    WorkerRateLimited {
        id: WorkerId,
        dropped: u64,
    },
    /// The worker's reply queue was full when its reader had to answer a dropped message:
    /// it does not read what it is sent.
    WorkerNotReading {
        id: WorkerId,
    },
    WorkerDisconnected {
        id: WorkerId,
    },
    ClientRejected {
        uid: u32,
        pid: i32,
    },
    Launcher(LauncherEvent),
    LauncherGone,
    Tick,
    /// A `ps` waited `PS_WAIT` for the launcher's usage figures.
    PsDeadline,
    Shutdown,
    /// This node's etcd lease was renewed (or, `rejoined`, taken anew after a fence):
    /// the launcher must have killed every worker by `fence_at_ms` (CLOCK_BOOTTIME) unless
    /// told a later time.
    ClusterLease {
        fence_at_ms: u64,
        rejoined: bool,
    },
    /// This node could not renew its lease in time: its workers must die now.
    ClusterFenced {
        reason: String,
    },
    /// The cluster's kill switch was written (`engaged`) or removed, at `revision`.
    ClusterKillSwitch {
        engaged: bool,
        revision: i64,
    },
    /// Another node asks for a worker of this node to be killed.
    ClusterKill {
        request: super::cluster::KillRequest,
    },
}

impl Input {
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Input::Api { .. } => "api",
            Input::Worker { .. } => "worker",
            Input::WorkerProtocolError { .. } => "worker_protocol_error",
            Input::WorkerRateLimited { .. } => "worker_rate_limited",
            Input::WorkerNotReading { .. } => "worker_not_reading",
            Input::WorkerDisconnected { .. } => "worker_disconnected",
            Input::ClientRejected { .. } => "client_rejected",
            Input::Launcher(_) => "launcher",
            Input::LauncherGone => "launcher_gone",
            Input::Tick => "tick",
            Input::PsDeadline => "ps_deadline",
            Input::Shutdown => "shutdown",
            Input::ClusterLease { .. } => "cluster_lease",
            Input::ClusterFenced { .. } => "cluster_fenced",
            Input::ClusterKillSwitch { .. } => "cluster_kill_switch",
            Input::ClusterKill { .. } => "cluster_kill",
        }
    }
}
