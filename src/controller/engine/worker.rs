//! Messages from workers: identity by connection, registration, heartbeats,
//! replication requests, reports and shutdown requests.

use serde_json::json;

use crate::audit::event;
use crate::manifest::{Manifest, SpawnRequest, StateSnapshot, WorkerId};

use crate::controller::admission::{self, Admission, Registration, Requester};
use crate::controller::bounded;
use crate::controller::protocol::{
    MAX_CALL_BYTES, MAX_TEXT_BYTES, ReplicateMsg, WorkerMessage, WorkerReply,
};
use crate::controller::registry::WorkerState;

use super::Engine;
use super::admit::deny_details;

/// Grace after a worker's own `shutdown` before it is killed.
const SHUTDOWN_GRACE_MS: u64 = 5000;

impl Engine {
    /// Whether a connection's input still concerns a worker: what is still buffered from
    /// one that has exited (or was forgotten) is dropped unrecorded, so nothing keyed by
    /// its id is made again after `exited` cleared it.
    pub(super) fn speaks_for_live_worker(&self, id: &WorkerId) -> bool {
        self.registry
            .get(id)
            .is_some_and(|w| w.state != WorkerState::Exited)
    }

    /// Whether `id` asked to shut down and is in its grace.
    pub(super) fn shutting_down(&self, id: &WorkerId) -> bool {
        self.shutdown_deadlines.iter().any(|(w, _)| w == id)
    }

    /// A worker's request: every reply to it names the `call` it named (one too long is
    /// not echoed, and the request is refused once its claim has been checked).
    pub(super) fn worker(&mut self, id: WorkerId, message: WorkerMessage) {
        let call = message
            .call()
            .filter(|c| c.len() <= MAX_CALL_BYTES)
            .map(str::to_string);
        let named_too_long = call.is_none() && message.call().is_some();
        self.answering = Some((id.clone(), call));
        self.handle_worker(id, message, named_too_long);
        self.answering = None;
    }

    fn handle_worker(&mut self, id: WorkerId, message: WorkerMessage, named_too_long: bool) {
        if !self.speaks_for_live_worker(&id) {
            return;
        }
        let actor = format!("worker:{id}");
        if self.rejects_claim(&id, &message) {
            return;
        }
        if named_too_long {
            self.reply_worker(
                &id,
                WorkerReply::error(format!("call longer than {MAX_CALL_BYTES} bytes")),
            );
            return;
        }
        let state = self.registry.get(&id).map(|w| w.state);
        match (message, state) {
            (_, None) | (_, Some(WorkerState::Exited | WorkerState::Stopping)) => {
                self.reply_worker(&id, WorkerReply::error("this worker is stopping"));
            }
            (WorkerMessage::Register(r), Some(WorkerState::Starting)) => {
                self.register(&id, r.manifest)
            }
            (WorkerMessage::Register(_), Some(_)) => {
                self.reply_worker(&id, WorkerReply::error("already registered"));
            }
            (_, Some(WorkerState::Starting)) => {
                self.reply_worker(&id, WorkerReply::error("register first"));
            }
            (WorkerMessage::Heartbeat(_), _) => {
                if let Some(w) = self.registry.get_mut(&id) {
                    w.last_heartbeat_ms = Some(self.effects.now_ms());
                }
                self.reply_worker(&id, WorkerReply::Ok);
            }
            (WorkerMessage::Replicate(r), _) => self.replicate(&id, *r),
            (WorkerMessage::Report(r), _) => {
                let result = r.result;
                if result.len() > MAX_TEXT_BYTES {
                    self.reply_worker(
                        &id,
                        WorkerReply::error(format!("report longer than {MAX_TEXT_BYTES} bytes")),
                    );
                    return;
                }
                self.record(
                    event::WORKER_REPORT,
                    &actor,
                    Some(&id),
                    json!({ "result": bounded::clip(&result, bounded::MAX_TEXT) }),
                    false,
                );
                self.reply_worker(&id, WorkerReply::Ok);
            }
            (WorkerMessage::Shutdown(_), _) => {
                // Once: asking again changes nothing and is not recorded again.
                if self.shutting_down(&id) {
                    self.reply_worker(&id, WorkerReply::Ok);
                    return;
                }
                self.record(
                    event::WORKER_SHUTDOWN_REQUESTED,
                    &actor,
                    Some(&id),
                    json!({}),
                    false,
                );
                self.reply_worker(&id, WorkerReply::Ok);
                // What it asked for before is not started in its grace either (nor what
                // it asks for now: `spawn_child`).
                self.drop_approvals_of(&id, "the worker that asked is shutting down");
                self.shutdown_deadlines.push((
                    id.clone(),
                    self.effects.now_ms().saturating_add(SHUTDOWN_GRACE_MS),
                ));
            }
        }
    }

    /// Identity is the connection: a message claiming another worker's id is refused (and
    /// recorded), and a registration with another's manifest ends the worker.
    fn rejects_claim(&mut self, id: &WorkerId, message: &WorkerMessage) -> bool {
        let actor = format!("worker:{id}");
        if let Some(claimed) = message.claimed_id() {
            if claimed != id.as_str() {
                let claimed = bounded::clip(claimed, 80);
                // Recorded (and synced) once, then summarised: a worker repeating the
                // attempt cannot grow the trail or its disk traffic at will.
                if let Some(suppressed) = self.noisy_ok(id, "impersonation") {
                    self.record(
                        event::IMPERSONATION_ATTEMPT,
                        &actor,
                        Some(id),
                        json!({ "claimed": claimed, "message": message.kind(), "suppressed_since_last": suppressed }),
                        true,
                    );
                }
                self.reply_worker(
                    id,
                    WorkerReply::error(format!("this connection is worker {id}, not {claimed}")),
                );
                if matches!(message, WorkerMessage::Register(_)) {
                    self.stop(id, "rejected at registration: another worker's manifest");
                }
                return true;
            }
        }
        false
    }

    pub(super) fn register(&mut self, id: &WorkerId, presented: Manifest) {
        let actor = format!("worker:{id}");
        let now = self.now_s();
        self.store.refresh();
        let issued = self.registry.get(id).map(|w| &w.manifest);
        let verdict = admission::decide_registration(
            &self.contract,
            &mut self.signer,
            &*self.store.excluding(id),
            issued,
            &presented,
            now,
        );
        match verdict {
            Registration::Accepted => {}
            Registration::NotIssued { verification } => {
                // A validly signed manifest of another worker, or a forged one.
                self.record(
                    event::REJECT_MANIFEST_SIGNATURE,
                    &actor,
                    Some(id),
                    json!({ "why": "not the manifest this worker was issued", "verification": verification }),
                    true,
                );
                self.reply_worker(
                    id,
                    WorkerReply::error("this is not the manifest this worker was issued"),
                );
                // Any refusal at registration ends the worker: a forger gets one try.
                self.stop(id, "rejected at registration: not its manifest");
                return;
            }
            Registration::Unverified(e) => {
                self.record(
                    e.audit_event(),
                    &actor,
                    Some(id),
                    json!({ "check": e.check(), "error": e.to_string() }),
                    true,
                );
                self.reply_worker(id, WorkerReply::error(e.to_string()));
                self.stop(id, &format!("rejected at registration: {}", e.check()));
                return;
            }
            Registration::Denied(reason) => {
                self.record(
                    reason.audit_event(),
                    &actor,
                    Some(id),
                    deny_details(&reason),
                    true,
                );
                self.reply_worker(
                    id,
                    WorkerReply::Denied {
                        event: reason.audit_event().to_string(),
                        reason: reason.to_string(),
                        approval_id: None,
                    },
                );
                self.stop(id, "rejected at registration");
                return;
            }
        }
        let depth = presented.depth.get();
        if let Some(w) = self.registry.get_mut(id) {
            w.state = WorkerState::Registered;
            w.last_heartbeat_ms = Some(self.effects.now_ms());
        }
        self.record(
            event::WORKER_REGISTERED,
            &actor,
            Some(id),
            json!({ "depth": depth }),
            true,
        );
        self.reply_worker(
            id,
            WorkerReply::Registered {
                worker_id: id.clone(),
                depth,
            },
        );
    }

    pub(super) fn replicate(&mut self, id: &WorkerId, r: ReplicateMsg) {
        let actor = format!("worker:{id}");
        let Some(parent) = self.registry.get(id).map(|w| w.manifest.clone()) else {
            return;
        };
        if r.reason.len() > MAX_TEXT_BYTES {
            self.reply_worker(
                id,
                WorkerReply::error(format!("reason longer than {MAX_TEXT_BYTES} bytes")),
            );
            return;
        }
        let snapshot = match r.state_snapshot {
            Some(s) => match StateSnapshot::new(s) {
                Ok(s) => s,
                Err(e) => {
                    self.reply_worker(id, WorkerReply::error(e.to_string()));
                    return;
                }
            },
            None => parent.state_snapshot.clone(),
        };
        let request = SpawnRequest {
            resources: r.resources.unwrap_or(parent.resources),
            filesystem: r.filesystem.unwrap_or_else(|| parent.filesystem.clone()),
            profile: r.profile.unwrap_or_else(|| parent.profile.clone()),
            command: r.command,
            env: r.env.unwrap_or_else(|| parent.env.clone()),
            cwd: r.cwd.or_else(|| parent.cwd.clone()),
            state_snapshot: snapshot,
        };
        let reply = match self.spawn_child(id, request, &actor, Some(&r.reason), Requester::Parent)
        {
            Admission::Started { worker_id, depth } => WorkerReply::Allowed {
                child_id: worker_id,
                depth,
                approval_id: None,
            },
            Admission::Pending {
                approval_id,
                child_id,
                rules,
            } => WorkerReply::Pending {
                approval_id,
                child_id,
                reasons: rules,
            },
            Admission::Denied { event, reason } => WorkerReply::Denied {
                event,
                reason,
                approval_id: None,
            },
            Admission::Failed(message) => WorkerReply::error(message),
        };
        self.reply_worker(id, reply);
    }
}
