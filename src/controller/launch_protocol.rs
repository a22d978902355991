//! What the controller and its launcher say to each other: [`LauncherRequest`]s one way (a
//! launch carries the worker's end of its socketpair as an attached descriptor),
//! [`LauncherEvent`]s the other. Its own module so that both ends — the engine's outbox
//! and the launcher's loop — depend on the protocol, not on each other.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What the launcher needs to start one worker: already decided and verified by the
/// controller (from the worker's signed manifest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSpec {
    pub worker_id: String,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Working directory inside (default /).
    pub cwd: Option<String>,
    pub ro: Vec<PathBuf>,
    pub rw: Vec<PathBuf>,
    pub memory: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub profile: String,
    /// The file in the state directory's `workers/` where the worker's stdout and stderr
    /// go (created new, 0600, through the launcher's descriptor of that directory).
    pub log_name: String,
    /// Share the host network (a manifest with allow_external); otherwise none.
    pub share_network: bool,
    /// Inside uid/gid for the payload (distinct per worker where an id range is mapped).
    pub payload_ids: Option<(u32, u32)>,
    pub allow_degraded: bool,
    /// Host path of the hatchery binary to expose at [`super::launcher::AGENT_BIN_DIR`].
    pub agent_binary: Option<PathBuf>,
    /// The cgroup name (unique, owned by the launcher process).
    pub cgroup_name: String,
    /// The manifest's `filesystem.allow_exec` (empty: no list but the profile's).
    #[serde(default)]
    pub allow_exec: Vec<PathBuf>,
    /// The worker's log gets at most this: the manifest's `resources.max_output_bytes`, or
    /// the controller's default cap.
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum LauncherRequest {
    /// Start a worker; its socket end is attached to the frame.
    Launch {
        spec: Box<LaunchSpec>,
    },
    Kill {
        worker_id: String,
    },
    KillAll,
    /// Report live usage of every running worker.
    Usage,
    /// Kill everything and exit.
    Shutdown,
}

/// Live accounting of one worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LiveUsage {
    pub cpu_usec: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub pids_peak: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum LauncherEvent {
    /// The launcher is up; it removed these cgroups left by a crashed predecessor.
    Ready {
        swept: Vec<PathBuf>,
    },
    Started {
        worker_id: String,
        pid: i32,
        /// The start time of `pid` (clock ticks since boot), read while the launcher holds
        /// it unreaped: the controller's own handle on the sandbox is checked against it.
        start_time: Option<u64>,
        cgroup: Option<PathBuf>,
        enforcement: serde_json::Value,
    },
    StartFailed {
        worker_id: String,
        error: String,
    },
    Exited {
        worker_id: String,
        exit_code: i32,
        signal: Option<i32>,
        oom_killed: bool,
        timed_out: bool,
        wall_ms: u64,
        usage: LiveUsage,
        error: Option<String>,
        /// Bytes of output that reached the log, when it was capped.
        #[serde(default)]
        output_bytes: Option<u64>,
        #[serde(default)]
        output_truncated: bool,
    },
    Usage {
        workers: Vec<(String, LiveUsage)>,
    },
    /// A request the launcher could not take (too large, malformed); it reads on.
    Refused {
        error: String,
    },
}
