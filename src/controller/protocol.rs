//! The messages on the controller's two sockets, framed by [`super::wire`].
//!
//! Worker socket (fd 3 inside a worker, `HATCHERY_FD`): the controller speaks first with
//! `welcome` (the worker's id and its signed manifest), once, queued before any reply, so a
//! client that did not read it passes over it; the worker then sends one request at
//! a time — `register` (presenting that manifest), `heartbeat`, `replicate`, `report`,
//! `shutdown` — and gets exactly one reply to each. A `replicate` answered `pending` is
//! decided later by a frame that names its `approval_id` (see [`WorkerReply::decides`]).
//! A worker's identity is its connection:
//! a `worker_id` in a request is optional and, if present, must be the connection's own.
//!
//! API socket (the CLI): one request, one response, as often as the client likes.
//! Unknown fields are refused everywhere.

use serde::{Deserialize, Serialize};

use crate::manifest::{
    FilesystemScope, Manifest, ProfileName, ResourceSpec, SpawnRequest, WorkerId,
};

use super::launcher::LiveUsage;

/// Largest `reason` or `report` text accepted from a worker.
pub const MAX_TEXT_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMessage {
    Register(Box<RegisterMsg>),
    Heartbeat(Claim),
    Replicate(Box<ReplicateMsg>),
    Report(ReportMsg),
    Shutdown(Claim),
}

/// An optional claim of identity (ignored when it matches, refused when it does not).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// See [`WorkerMessage::call`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterMsg {
    pub manifest: Manifest,
    /// See [`WorkerMessage::call`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
}

/// A request for a child. Everything but `command` defaults to the parent's own grant;
/// whatever is given must be equal to it or narrower.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicateMsg {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    pub reason: String,
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_snapshot: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemScope>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// See [`WorkerMessage::call`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportMsg {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    pub result: String,
    /// See [`WorkerMessage::call`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
}

/// Longest `call` a request may name.
pub const MAX_CALL_BYTES: usize = 64;

impl WorkerMessage {
    /// The identity the message claims, if any.
    pub fn claimed_id(&self) -> Option<&str> {
        match self {
            WorkerMessage::Register(r) => Some(r.manifest.worker_id.as_str()),
            WorkerMessage::Heartbeat(c) | WorkerMessage::Shutdown(c) => c.worker_id.as_deref(),
            WorkerMessage::Replicate(r) => r.worker_id.as_deref(),
            WorkerMessage::Report(r) => r.worker_id.as_deref(),
        }
    }

    /// The name the request gives itself, echoed in its reply. Each process of a worker
    /// shares the one socket, and a call that ended before its reply came (a time limit,
    /// a signal) leaves that reply for the next call to read: a client that names its
    /// calls tells its own reply from one left over.
    pub fn call(&self) -> Option<&str> {
        match self {
            WorkerMessage::Register(r) => r.call.as_deref(),
            WorkerMessage::Heartbeat(c) | WorkerMessage::Shutdown(c) => c.call.as_deref(),
            WorkerMessage::Replicate(r) => r.call.as_deref(),
            WorkerMessage::Report(r) => r.call.as_deref(),
        }
    }

    /// Names the request (see [`WorkerMessage::call`]).
    pub fn set_call(&mut self, call: String) {
        let slot = match self {
            WorkerMessage::Register(r) => &mut r.call,
            WorkerMessage::Heartbeat(c) | WorkerMessage::Shutdown(c) => &mut c.call,
            WorkerMessage::Replicate(r) => &mut r.call,
            WorkerMessage::Report(r) => &mut r.call,
        };
        *slot = Some(call);
    }

    pub fn kind(&self) -> &'static str {
        match self {
            WorkerMessage::Register(_) => "register",
            WorkerMessage::Heartbeat(_) => "heartbeat",
            WorkerMessage::Replicate(_) => "replicate",
            WorkerMessage::Report(_) => "report",
            WorkerMessage::Shutdown(_) => "shutdown",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkerReply {
    /// First frame on a new worker's socket.
    Welcome {
        worker_id: WorkerId,
        manifest: Box<Manifest>,
        heartbeat_interval_ms: u64,
    },
    Registered {
        worker_id: WorkerId,
        depth: u32,
    },
    Ok,
    /// The child was issued a manifest and is starting.
    Allowed {
        child_id: WorkerId,
        depth: u32,
        /// Set on a decision frame: the request that waited for it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval_id: Option<String>,
    },
    /// The request waits for a person; the decision follows as `allowed`, `denied` or
    /// `error`, naming this `approval_id`.
    Pending {
        approval_id: String,
        child_id: WorkerId,
        reasons: Vec<String>,
    },
    /// The contract (or the kill switch, or a person) said no.
    Denied {
        event: String,
        reason: String,
        /// Set on a decision frame: the request that waited for it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval_id: Option<String>,
    },
    Error {
        message: String,
        /// Set on a decision frame: the request that waited for it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval_id: Option<String>,
    },
}

/// A frame to a worker: a reply (or the welcome, or a decision), with the `call` of the
/// request it answers where that request named one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerFrame {
    #[serde(flatten)]
    pub reply: WorkerReply,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
}

impl WorkerFrame {
    /// A frame that answers no named request.
    pub fn unnamed(reply: WorkerReply) -> WorkerFrame {
        WorkerFrame { reply, call: None }
    }
}

/// The `call` a worker's frame names, read from its bytes alone: for the answer to a
/// frame that was not read as a request (rate-limited, or not a request at all), so that
/// its sender still knows the answer for its own. `None` unless it is a JSON object whose
/// `call` is a string of at most [`MAX_CALL_BYTES`].
pub fn call_of(body: &[u8]) -> Option<String> {
    // Any other field is skipped unread; a `call` that is not a string fails the parse.
    #[derive(Deserialize)]
    struct Named {
        call: Option<String>,
    }
    // An object, not the array form serde would also read a struct from.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    serde_json::from_slice::<Named>(body)
        .ok()?
        .call
        .filter(|c| c.len() <= MAX_CALL_BYTES)
}

impl WorkerReply {
    /// A reply that answers the request just made: an error with no approval behind it.
    pub fn error(message: impl Into<String>) -> WorkerReply {
        WorkerReply::Error {
            message: message.into(),
            approval_id: None,
        }
    }

    /// The approval a decision frame settles. Decisions come when a person (or the
    /// approval deadline) decides, not in answer to the request just made: a client tells
    /// them apart by this, so a decision whose waiting call has ended is never read as the
    /// answer to the next one.
    pub fn decides(&self) -> Option<&str> {
        match self {
            WorkerReply::Allowed { approval_id, .. }
            | WorkerReply::Denied { approval_id, .. }
            | WorkerReply::Error { approval_id, .. } => approval_id.as_deref(),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ApiRequest {
    /// Issue a root manifest (or, with `parent`, a child manifest as that parent) and launch.
    Spawn {
        parent: Option<WorkerId>,
        request: Box<SpawnRequest>,
    },
    Ps(NoFields),
    Kill {
        worker_id: WorkerId,
        recursive: bool,
    },
    KillSwitch {
        release: bool,
        /// Every node of the cluster (`kill-switch --cluster`): answered once every live
        /// node has acknowledged.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cluster: bool,
    },
    /// Every node's workers (`ps --cluster`).
    ClusterPs(NoFields),
    Status(NoFields),
    /// One worker, running or ended: its signed manifest, limits, usage and how it ended.
    Inspect {
        worker_id: WorkerId,
    },
    /// A piece of a worker's log (its stdout and stderr), from `offset`.
    Logs {
        worker_id: WorkerId,
        offset: u64,
    },
    /// Replication requests waiting for a person.
    Approvals(NoFields),
    Approve {
        approval_id: String,
    },
    Deny {
        approval_id: String,
        reason: String,
    },
}

/// A replication request waiting for a person, with the exact manifest that would start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingApproval {
    pub approval_id: String,
    pub requested_at_ms: u64,
    pub deadline_ms: u64,
    /// The worker that asked, and why (its own words).
    pub requested_by: WorkerId,
    pub why: String,
    /// Which approval rules it matched.
    pub rules: Vec<String>,
    pub manifest: Box<Manifest>,
}

/// The body of a request that takes no arguments (any field is refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoFields {}

/// How a worker ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExitInfo {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub oom_killed: bool,
    pub timed_out: bool,
    /// Why the controller ended it, when it did (killed, reaped, expired, kill switch).
    pub ended_by: Option<String>,
    /// Why its command never ran or its status is unknown, when so: the line `run` prints
    /// for the same failure (a set-up step, `execve`, pid 1's crash), at most a sandbox's
    /// message long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where its log was cut, when it was: at its `max_output_bytes`, or short of it when
    /// the output budget every worker shares (`--worker-output-total`), or the room kept
    /// for the audit trail, ran out first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_cut_at: Option<u64>,
}

/// One worker as `ps` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerInfo {
    pub worker_id: WorkerId,
    pub parent_id: Option<WorkerId>,
    pub depth: u32,
    pub state: String,
    pub pid: Option<i32>,
    pub command: Vec<String>,
    pub profile: ProfileName,
    pub resources: ResourceSpec,
    pub started_at_ms: u64,
    pub last_heartbeat_ms_ago: Option<u64>,
    pub children: Vec<WorkerId>,
    pub usage: Option<LiveUsage>,
    pub exit: Option<ExitInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case", deny_unknown_fields)]
pub enum ApiResponse {
    Spawned {
        worker_id: WorkerId,
        depth: u32,
    },
    Denied {
        event: String,
        reason: String,
    },
    Workers {
        workers: Vec<WorkerInfo>,
        kill_switch: bool,
    },
    Killed {
        workers: Vec<WorkerId>,
        elapsed_ms: u64,
    },
    KillSwitch {
        engaged: bool,
        killed: usize,
        elapsed_ms: u64,
    },
    Approvals {
        pending: Vec<PendingApproval>,
    },
    Decided {
        approval_id: String,
        approved: bool,
        child_id: Option<WorkerId>,
    },
    Worker {
        info: Box<WorkerInfo>,
        manifest: Box<Manifest>,
    },
    /// Log bytes from the asked offset (UTF-8; bytes that are not are replaced), the offset
    /// to ask next, and whether the worker has ended (then nothing more will come once
    /// `data` is empty).
    Log {
        data: String,
        next_offset: u64,
        ended: bool,
        /// Where an ended worker's log was cut, when it was ([`ExitInfo::output_cut_at`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cut_at: Option<u64>,
    },
    /// The cluster kill switch: what each node that acknowledged did, the live nodes that
    /// did not within the limit, and how long the last acknowledgement took.
    ClusterKillSwitch {
        engaged: bool,
        killed: usize,
        nodes: Vec<crate::controller::cluster::records::AckRecord>,
        missing: Vec<String>,
        elapsed_ms: u64,
    },
    /// Every node's workers, as the cluster holds them.
    ClusterWorkers {
        nodes: Vec<crate::controller::cluster::records::NodeRecord>,
        workers: Vec<crate::controller::cluster::records::WorkerRecord>,
        kill_switch: bool,
    },
    Status {
        pid: u32,
        session: String,
        kill_switch: bool,
        active: u64,
        /// Active workers that registered: their command runs.
        running: u64,
        lifetime_total: u64,
        audit_entries: u64,
    },
    Error {
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_messages_refuse_unknown_fields_and_types() {
        let ok: Result<WorkerMessage, _> = serde_json::from_str(r#"{"type":"heartbeat"}"#);
        assert!(ok.is_ok());
        for bad in [
            r#"{"type":"heartbeat","extra":1}"#,
            r#"{"type":"explode"}"#,
            r#"{"type":"replicate","reason":"x"}"#,
            r#"{"type":"report","result":"x","depth":3}"#,
            r#"{"reason":"x","command":["true"]}"#,
            "[]",
        ] {
            let r: Result<WorkerMessage, _> = serde_json::from_str(bad);
            assert!(r.is_err(), "accepted {bad}");
        }
    }

    #[test]
    fn an_answer_names_its_call_beside_its_type_and_nothing_else_slips_in() {
        let frame = WorkerFrame {
            reply: WorkerReply::Ok,
            call: Some("c1".into()),
        };
        let text = serde_json::to_string(&frame).unwrap_or_default();
        assert_eq!(text, r#"{"type":"ok","call":"c1"}"#);
        assert_eq!(serde_json::from_str::<WorkerFrame>(&text).ok(), Some(frame));
        // Without a call the frame is the reply as it always was.
        let unnamed = WorkerFrame::unnamed(WorkerReply::error("e"));
        assert_eq!(
            serde_json::to_string(&unnamed).unwrap_or_default(),
            r#"{"type":"error","message":"e"}"#
        );
        for bad in [
            r#"{"type":"error","message":"e","extra":1}"#,
            r#"{"call":"c"}"#,
        ] {
            assert!(serde_json::from_str::<WorkerFrame>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_call_is_read_from_any_frame_that_names_one_and_no_other() {
        let long = "x".repeat(MAX_CALL_BYTES + 1);
        assert_eq!(
            call_of(br#"{"type":"nonsense","call":"c7","more":[1,2]}"#),
            Some("c7".to_string())
        );
        for body in [
            &br#"{"type":"heartbeat"}"#[..],
            br#"{"call":7}"#,
            br#"["call"]"#,
            b"{not json",
            format!(r#"{{"call":"{long}"}}"#).as_bytes(),
        ] {
            assert_eq!(call_of(body), None, "{}", String::from_utf8_lossy(body));
        }
        let named: Result<WorkerMessage, _> =
            serde_json::from_str(r#"{"type":"heartbeat","call":"c2"}"#);
        assert_eq!(
            named.ok().as_ref().and_then(WorkerMessage::call),
            Some("c2")
        );
    }

    #[test]
    fn replicate_needs_only_a_reason_and_a_command() {
        let r: Result<WorkerMessage, _> = serde_json::from_str(
            r#"{"type":"replicate","reason":"more hands","command":["sh","-c","true"]}"#,
        );
        match r {
            Ok(WorkerMessage::Replicate(m)) => {
                assert_eq!(m.command, ["sh", "-c", "true"]);
                assert!(m.resources.is_none());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn argumentless_api_requests_refuse_fields() {
        let ok: Result<ApiRequest, _> = serde_json::from_str(r#"{"op":"ps"}"#);
        assert_eq!(ok.ok(), Some(ApiRequest::Ps(NoFields {})));
        let bad: Result<ApiRequest, _> = serde_json::from_str(r#"{"op":"ps","extra":1}"#);
        assert!(bad.is_err());
        let bad: Result<ApiRequest, _> =
            serde_json::from_str(r#"{"op":"kill_switch","release":true,"x":1}"#);
        assert!(bad.is_err());
    }

    #[test]
    fn api_requests_round_trip() {
        let req = ApiRequest::KillSwitch {
            release: false,
            cluster: false,
        };
        let json = serde_json::to_string(&req).unwrap_or_default();
        assert_eq!(json, r#"{"op":"kill_switch","release":false}"#);
        let back: Result<ApiRequest, _> = serde_json::from_str(&json);
        assert_eq!(back.ok(), Some(req));
    }
}
