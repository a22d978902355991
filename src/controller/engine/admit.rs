//! Starting workers: a root for a person, a child for a person or its parent. The
//! decisions are `admission`'s; this records them and carries them out (signing, the
//! launcher, attaching the worker's socket).

use std::os::unix::net::UnixStream;

use serde_json::json;

use crate::audit::event;
use crate::contract::approval::ApprovalVerdict;
use crate::contract::{Decision, DenyReason};
use crate::manifest::{Lineage, Manifest, SpawnRequest, WorkerId};

use crate::controller::admission::{
    self, Admission, Candidate, ChildDecision, ChildRequest, Requester,
};
use crate::controller::launch_protocol::WorkerPlacement;
use crate::controller::launcher::{LaunchSpec, LauncherRequest};
use crate::controller::protocol::{ApiResponse, WorkerFrame, WorkerReply};
use crate::controller::registry::{WorkerRecord, WorkerState};

use super::Engine;

/// The controller's send buffer on a worker's socket (the kernel doubles it).
const WORKER_SNDBUF: usize = 16 << 10;

fn new_worker_id() -> Result<WorkerId, String> {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).map_err(|e| format!("random source: {e}"))?;
    WorkerId::new(format!("w-{}", hex::encode(b))).map_err(|e| e.to_string())
}

/// The worker's end and the controller's end of a worker's control socket.
fn worker_socket() -> Result<(UnixStream, UnixStream), String> {
    let (ours, theirs) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    // What the kernel holds for a worker that does not read its replies is bounded too
    // (with the reply queue, see `reply_worker`).
    let _ = nix::sys::socket::setsockopt(&ours, nix::sys::socket::sockopt::SndBuf, &WORKER_SNDBUF);
    Ok((ours, theirs))
}

/// Why a decided start did not happen.
pub(super) enum LaunchError {
    /// The reservation was refused: the state changed since the request was checked.
    Denied(DenyReason),
    Failed(String),
}

impl From<String> for LaunchError {
    fn from(s: String) -> LaunchError {
        LaunchError::Failed(s)
    }
}

pub(super) fn deny_details(reason: &DenyReason) -> serde_json::Value {
    json!({ "reason": reason.to_string() })
}

/// The API's answer to a request to start a worker.
pub(super) fn api_answer(outcome: Admission) -> ApiResponse {
    match outcome {
        Admission::Started { worker_id, depth } => ApiResponse::Spawned { worker_id, depth },
        Admission::Denied { event, reason } => ApiResponse::Denied { event, reason },
        Admission::Failed(message) => ApiResponse::Error { message },
        // A person's own request needs no other person (see `Requester::Person`).
        Admission::Pending { approval_id, .. } => ApiResponse::Error {
            message: format!("waiting for a decision on approval {approval_id}"),
        },
    }
}

impl Engine {
    pub(super) fn deny(
        &mut self,
        actor: &str,
        worker: Option<&WorkerId>,
        reason: &DenyReason,
        extra: serde_json::Value,
    ) -> Admission {
        let mut details = deny_details(reason);
        if let (Some(obj), serde_json::Value::Object(more)) = (details.as_object_mut(), extra) {
            obj.extend(more);
        }
        self.record(reason.audit_event(), actor, worker, details, true);
        Admission::Denied {
            event: reason.audit_event().to_string(),
            reason: reason.to_string(),
        }
    }

    pub(super) fn spawn_root(&mut self, mut request: SpawnRequest, actor: &str) -> Admission {
        let now = self.now_s();
        // A root without a cap gets the controller's, in its signed manifest: its
        // children are then narrowed to it like to any other grant.
        if request.resources.max_output_bytes.is_none() {
            request.resources.max_output_bytes =
                crate::manifest::OutputBytes::new(self.cfg.worker_output_cap).ok();
        }
        if let Err(e) = request
            .validate()
            .and_then(|()| self.keeps_own_files(&request.filesystem))
        {
            return self.deny(actor, None, &DenyReason::InvalidRequest(e), json!({}));
        }
        let id = match new_worker_id() {
            Ok(id) => id,
            Err(message) => return Admission::Failed(message),
        };
        let validity = match self.contract.child_validity(now, None) {
            Ok(v) => v,
            Err(e) => return Admission::Failed(e.to_string()),
        };
        let manifest = match self
            .signer
            .issue(Lineage::root(id.clone()), request, validity)
        {
            Ok(m) => m,
            Err(e) => return Admission::Failed(e.to_string()),
        };
        self.store.refresh();
        if let Decision::Deny(reason) = self.contract.admit(&manifest, &*self.store, now) {
            return self.deny(actor, None, &reason, json!({ "parent": null }));
        }
        self.record(
            event::REPLICATION_REQUESTED,
            actor,
            Some(&id),
            with_egress(json!({ "parent": null, "depth": 0 }), &manifest),
            true,
        );
        self.launch(manifest, now)
    }

    /// Issues a child of `parent` (asked by a person through the API, or by the parent
    /// itself through `replicate`) and launches it.
    pub(super) fn spawn_child(
        &mut self,
        parent: &WorkerId,
        request: SpawnRequest,
        actor: &str,
        reason: Option<&str>,
        requester: Requester,
    ) -> Admission {
        let now = self.now_s();
        let parent_manifest = match self.registry.get(parent) {
            Some(w)
                if w.state == WorkerState::Registered
                    || (w.unsupervised && w.state.is_active()) =>
            {
                w.manifest.clone()
            }
            Some(_) => {
                return Admission::Failed(format!("worker {parent} is not running and registered"));
            }
            None => return Admission::Failed(format!("no worker {parent}")),
        };
        // A worker that asked to shut down gets no more children, from its own requests
        // or a member's: its grace is for finishing, and a child started then would
        // outlive the reason for it. The owner's or root's is a person's decision.
        if requester != Requester::Person && self.shutting_down(parent) {
            return Admission::Failed(format!(
                "worker {parent} asked to shut down: it gets no more children"
            ));
        }
        let id = match new_worker_id() {
            Ok(id) => id,
            Err(message) => return Admission::Failed(message),
        };
        let extra = json!({ "parent": parent.as_str(), "why": reason });
        let asked = ChildRequest {
            parent: &parent_manifest,
            request,
            child_id: id.clone(),
            requester,
        };
        self.store.refresh();
        let (manifest, approval) =
            match admission::decide_child(&self.contract, &self.signer, &*self.store, asked, now) {
                ChildDecision::Issued { manifest, approval } => (*manifest, approval),
                ChildDecision::Denied(r) => return self.deny(actor, Some(parent), &r, extra),
                ChildDecision::Failed(message) => return Admission::Failed(message),
            };
        let depth = manifest.depth.get();
        // Narrowed from its parent's, which held none of the controller's files: checked
        // again all the same, as the last word before anything is recorded as allowed.
        if let Err(e) = self.keeps_own_files(&manifest.filesystem) {
            return self.deny(actor, Some(parent), &DenyReason::InvalidRequest(e), extra);
        }
        // A manifest whose welcome would not fit a frame is refused here, before anything
        // is recorded as allowed: a request that can never start is an invalid request
        // (charged to its worker's audit budget), not a start that failed.
        if let Err(message) = self.welcome_fits(&manifest) {
            return self.deny(
                actor,
                Some(parent),
                &DenyReason::InvalidRequest(crate::manifest::FieldError::new("manifest", message)),
                extra,
            );
        }
        match approval {
            ApprovalVerdict::NotNeeded => {}
            ApprovalVerdict::AutoApproved { rule, reasons } => {
                self.record(
                    event::APPROVAL_GRANTED,
                    "controller",
                    Some(&id),
                    json!({ "auto_approve": rule, "rules": reasons, "parent": parent.as_str() }),
                    true,
                );
            }
            // A member of the socket's group may not approve, and its request is not the
            // parent's own (whose connection a decision would answer): refused, for the
            // owner to make if a person wants it.
            ApprovalVerdict::Needed { reasons } if requester == Requester::Member => {
                let why = "this child needs a person's approval, which only the controller's owner or root gives: ask them to spawn it";
                self.record(
                    event::APPROVAL_REFUSED,
                    actor,
                    Some(parent),
                    json!({ "why": why, "rules": reasons, "parent": parent.as_str() }),
                    true,
                );
                return Admission::Denied {
                    event: event::APPROVAL_REFUSED.into(),
                    reason: why.into(),
                };
            }
            ApprovalVerdict::Needed { reasons } => {
                return self.hold_for_approval(parent, manifest, reasons, reason.unwrap_or(""));
            }
        }
        self.record(
            event::REPLICATION_REQUESTED,
            actor,
            Some(&id),
            with_egress(
                json!({ "parent": parent.as_str(), "depth": depth, "why": reason }),
                &manifest,
            ),
            true,
        );
        self.launch(manifest, now)
    }

    pub(super) fn launch(&mut self, manifest: Manifest, now: u64) -> Admission {
        let id = manifest.worker_id.clone();
        let parent = manifest.parent_id.clone();
        match self.try_launch(manifest, now) {
            Ok(depth) => Admission::Started {
                worker_id: id,
                depth,
            },
            // The state changed between the request's check and its reservation (another
            // node, an approval that came late): a refusal like any other.
            Err(LaunchError::Denied(reason)) => {
                let actor = match &parent {
                    Some(p) => format!("worker:{p}"),
                    None => "controller".to_string(),
                };
                self.deny(&actor, Some(&id), &reason, json!({ "at": "start" }))
            }
            Err(LaunchError::Failed(message)) => {
                // The decision was taken: a start that failed still counts for the
                // parent's cooldown, so failing starts cannot be repeated at will.
                let actor = match &parent {
                    Some(p) => {
                        self.store.note_failed_start(p, now);
                        format!("worker:{p}")
                    }
                    None => "controller".to_string(),
                };
                self.record(
                    event::WORKER_START_FAILED,
                    &actor,
                    Some(&id),
                    json!({ "error": message }),
                    true,
                );
                Admission::Failed(message)
            }
        }
    }

    /// Refuses a filesystem scope that would give the worker one of the controller's own
    /// files (see [`super::super::paths::OwnFiles`]).
    fn keeps_own_files(
        &self,
        fs: &crate::manifest::FilesystemScope,
    ) -> Result<(), crate::manifest::FieldError> {
        let exposed = fs
            .exposures()
            .map(|(p, writable)| (p.as_path(), writable))
            .chain(fs.allow_exec.iter().flatten().map(|p| (p.as_path(), false)));
        match self.cfg.own_files.held_by(exposed) {
            None => Ok(()),
            Some((exposed, own)) => Err(crate::manifest::FieldError::new(
                "filesystem",
                format!(
                    "{} would give the worker the controller's own {} (its key, socket, audit trail, or its program to write): a worker must never reach them; expose a directory that neither holds nor lies inside it",
                    exposed.display(),
                    own.display()
                ),
            )),
        }
    }

    /// The welcome a worker with this manifest is sent, if it fits one frame.
    pub(super) fn welcome_fits(&self, manifest: &Manifest) -> Result<WorkerReply, String> {
        let welcome = WorkerReply::Welcome {
            worker_id: manifest.worker_id.clone(),
            manifest: Box::new(manifest.clone()),
            heartbeat_interval_ms: u64::try_from(self.cfg.heartbeat_interval.as_millis())
                .unwrap_or(u64::MAX),
        };
        let welcome_size = serde_json::to_vec(&welcome).map_or(usize::MAX, |v| v.len());
        if welcome_size > super::super::wire::MAX_FRAME {
            return Err(format!(
                "the manifest makes a {welcome_size}-byte welcome; a worker could not receive it (frames are at most {} bytes): shorten the state snapshot, environment or command",
                super::super::wire::MAX_FRAME
            ));
        }
        Ok(welcome)
    }

    /// The inside uid and gid the next worker's payload runs as: distinct per worker when
    /// rootless with a subordinate range (and the worker writes no host path).
    fn payload_ids(&mut self, manifest: &Manifest) -> Option<(u32, u32)> {
        let slot = self.next_slot;
        self.next_slot = self.next_slot.wrapping_add(1);
        (self.cfg.distinct_ids > 1 && manifest.filesystem.read_write.is_empty()).then(|| {
            let k = slot
                .checked_rem(self.cfg.distinct_ids.saturating_sub(1))
                .unwrap_or(0)
                .saturating_add(1);
            (k, k)
        })
    }

    /// Hands a worker to the launcher; its depth when it went.
    pub(super) fn try_launch(&mut self, manifest: Manifest, now: u64) -> Result<u32, LaunchError> {
        // The decision to start was recorded just before this; if that record could not be
        // made durable, the kill switch is on and the decision does not take effect.
        if self.store.kill_switch_engaged() {
            return Err(LaunchError::Failed("the kill switch is engaged (the audit trail could not be written, or an operator engaged it)".into()));
        }
        let id = manifest.worker_id.clone();
        let depth = manifest.depth.get();
        let supervised = manifest.resources.network_policy.allow_controller;
        let (ours, theirs) = if supervised {
            let (a, b) = worker_socket()?;
            (Some(a), Some(b))
        } else {
            (None, None)
        };
        let payload_ids = self.payload_ids(&manifest);
        let spec = LaunchSpec::for_worker(
            &manifest,
            &WorkerPlacement {
                payload_ids,
                allow_degraded: self.cfg.allow_degraded,
                agent_binary: self.cfg.agent_binary.clone(),
                cgroup_owner: &self.cfg.cgroup_owner,
                default_output_cap: self.cfg.worker_output_cap,
            },
        );
        // Every frame this worker will be sent must fit one: checked again here, where it
        // is made (a root worker's manifest comes this way without `spawn_child`).
        let welcome = self.welcome_fits(&manifest)?;
        // The slot is taken (checked and counted in one step) before the worker goes out;
        // one that does not reach the launcher gives it back.
        let parent = manifest
            .parent_id
            .as_ref()
            .and_then(|p| self.registry.get(p))
            .map(|w| w.manifest.clone());
        let candidate = match (&parent, &manifest.parent_id) {
            (Some(parent), _) => Candidate::Child {
                parent,
                manifest: &manifest,
            },
            (None, None) => Candidate::Root(&manifest),
            // A child whose parent is unknown here is never checked as a root (which would
            // skip its cooldown and narrowing): it does not start.
            (None, Some(p)) => return Err(format!("its parent {p} is no longer known here").into()),
        };
        admission::reserve(&mut *self.store, &self.contract, &candidate, now)
            .into_result()
            .map_err(|r| match r {
                DenyReason::KillSwitch => LaunchError::Failed("the kill switch is engaged (the audit trail could not be written, or an operator engaged it)".to_string()),
                r => LaunchError::Denied(r),
            })?;
        let fd = theirs.map(std::os::fd::OwnedFd::from);
        if let Err(e) = self.send_launcher(
            &LauncherRequest::Launch {
                spec: Box::new(spec),
            },
            fd,
        ) {
            self.store.cancel(&id, now);
            return Err(LaunchError::Failed(format!(
                "cannot hand the worker to the launcher: {e}"
            )));
        }
        let conn = ours.and_then(|s| self.effects.attach_worker(id.clone(), s));
        if let Some(tx) = &conn {
            let _ = tx.try_send(WorkerFrame::unnamed(welcome));
        }
        self.registry.insert(WorkerRecord {
            manifest,
            state: if supervised {
                WorkerState::Starting
            } else {
                WorkerState::Registered
            },
            pid: None,
            cgroup: None,
            started_at_ms: self.effects.now_ms(),
            last_heartbeat_ms: None,
            children: Vec::new(),
            conn,
            ended_by: None,
            final_usage: None,
            exit: None,
            unsupervised: !supervised,
            active_below: 0,
            awaiting_approval: false,
            handle: None,
            gone_unreported_since_ms: None,
        });
        Ok(depth)
    }
}

/// A launch's `replication_requested` details, saying whether the worker gets an egress
/// broker. The entry is durable before the worker starts: what the next start reads back
/// if this controller dies before the broker reports (`audit::OpenEgress`).
pub(super) fn with_egress(
    mut details: serde_json::Value,
    manifest: &Manifest,
) -> serde_json::Value {
    if let Some(fields) = details
        .as_object_mut()
        .filter(|_| manifest.resources.network_policy.reaches_hosts())
    {
        fields.insert("egress".into(), json!(true));
    }
    details
}
