//! Requests that wait for a person: queued with their signed manifest, decided by the
//! controller's owner or root (the whole contract checked again), or expired.

use serde_json::json;
use sha2::Digest;

use crate::audit::event;
use crate::contract::Decision;
use crate::manifest::{Manifest, WorkerId};

use crate::controller::admission::{Admission, Candidate};
use crate::controller::bounded;
use crate::controller::protocol::{ApiResponse, MAX_TEXT_BYTES, PendingApproval, WorkerReply};
use crate::controller::registry::WorkerState;

use super::Engine;
use super::admit::api_answer;

impl Engine {
    /// Queues an allowed request for a person: the child's manifest is issued and signed
    /// now, and exactly that manifest starts if it is approved.
    pub(super) fn hold_for_approval(
        &mut self,
        parent: &WorkerId,
        manifest: Manifest,
        rules: Vec<String>,
        why: &str,
    ) -> Admission {
        let actor = format!("worker:{parent}");
        let child = manifest.worker_id.clone();
        let own = self
            .pending_approvals
            .values()
            .filter(|p| &p.requested_by == parent)
            .count();
        let full = if self.pending_approvals.len() >= self.contract.approval.max_pending {
            Some(format!(
                "the approval queue is full ({} requests wait for a decision)",
                self.contract.approval.max_pending
            ))
        } else if own >= self.contract.approval.pending_per_worker() {
            Some(format!(
                "this worker already has {own} requests waiting for a decision (at most {})",
                self.contract.approval.pending_per_worker()
            ))
        } else {
            None
        };
        if let Some(reason) = full {
            // Charged to the requesting worker's audit budget: asking again and again
            // must not grow the trail.
            self.record(
                event::APPROVAL_DENIED,
                &actor,
                Some(parent),
                json!({ "reason": reason, "why": why }),
                true,
            );
            return Admission::Denied {
                event: event::APPROVAL_DENIED.into(),
                reason,
            };
        }
        let digest = sha2::Sha256::digest(manifest.signature.as_bytes());
        let approval_id = format!("a-{}", hex::encode(digest.get(..6).unwrap_or_default()));
        let now_ms = self.effects.now_ms();
        let pending = PendingApproval {
            approval_id: approval_id.clone(),
            requested_at_ms: now_ms,
            deadline_ms: now_ms
                .saturating_add(self.contract.approval.timeout_seconds.saturating_mul(1000)),
            requested_by: parent.clone(),
            why: why.to_string(),
            rules: rules.clone(),
            manifest: Box::new(manifest),
        };
        self.record(
            event::APPROVAL_REQUESTED,
            &actor,
            Some(&child),
            json!({
                "approval_id": approval_id, "parent": parent.as_str(), "rules": rules, "why": why,
                "manifest_signature": pending.manifest.signature,
                "command": bounded::command_preview(&pending.manifest.command), "depth": pending.manifest.depth.get(),
            }),
            true,
        );
        self.pending_approvals.insert(approval_id.clone(), pending);
        if let Some(w) = self.registry.get_mut(parent) {
            w.awaiting_approval = true;
        }
        Admission::Pending {
            approval_id,
            child_id: child,
            rules,
        }
    }

    /// A person's decision (`reason` = None approves). Only the controller's owner or root
    /// decides; unknown or already decided ids change nothing.
    pub(super) fn decide(
        &mut self,
        approval_id: &str,
        uid: u32,
        deny_reason: Option<String>,
    ) -> ApiResponse {
        let actor = format!("uid:{uid}");
        let refuse = |e: &mut Self, why: String| {
            e.record(
                event::APPROVAL_REFUSED,
                &actor,
                None,
                json!({ "approval_id": approval_id, "why": why }),
                true,
            );
            ApiResponse::Error { message: why }
        };
        if !self.decides(uid) {
            return refuse(
                self,
                format!("uid {uid} may not decide approvals (only the controller's owner or root)"),
            );
        }
        // The reason goes to the worker in one frame, and into the trail: as bounded as a
        // worker's own reasons are.
        if deny_reason
            .as_ref()
            .is_some_and(|r| r.len() > MAX_TEXT_BYTES)
        {
            return refuse(
                self,
                format!("a reason longer than {MAX_TEXT_BYTES} bytes: shorten it"),
            );
        }
        // A request past its deadline is denied first, as the reaper's next tick would
        // have: whether a late decision counted depended on when that tick came (an
        // approval 127 ms late was granted, one 67 ms late refused).
        self.expire_approvals(self.effects.now_ms());
        let Some(p) = self.pending_approvals.remove(approval_id) else {
            return refuse(
                self,
                format!(
                    "no pending approval {approval_id} (unknown, already decided, or past its deadline)"
                ),
            );
        };
        let parent = p.requested_by.clone();
        let child = p.manifest.worker_id.clone();
        self.settle_waiting(&parent, self.effects.now_ms());
        if let Some(reason) = deny_reason {
            self.record(
                event::APPROVAL_DENIED,
                &actor,
                Some(&child),
                json!({ "approval_id": approval_id, "reason": reason }),
                true,
            );
            self.reply_worker(
                &parent,
                WorkerReply::Denied {
                    event: event::APPROVAL_DENIED.into(),
                    reason,
                    approval_id: Some(approval_id.to_string()),
                },
            );
            return ApiResponse::Decided {
                approval_id: approval_id.to_string(),
                approved: false,
                child_id: None,
            };
        }
        self.approve(p, &actor)
    }

    /// Starts an approved child, if its parent still runs and the contract still allows it.
    fn approve(&mut self, p: PendingApproval, actor: &str) -> ApiResponse {
        let approval_id = p.approval_id.as_str();
        let parent = p.requested_by.clone();
        let child = p.manifest.worker_id.clone();
        let now = self.now_s();
        let parent_alive = self
            .registry
            .get(&parent)
            .is_some_and(|w| w.state == WorkerState::Registered);
        if !parent_alive {
            let reason = format!("the parent {parent} is no longer running");
            self.record(
                event::APPROVAL_DENIED,
                "controller",
                Some(&child),
                json!({ "approval_id": approval_id, "reason": reason }),
                true,
            );
            return ApiResponse::Error { message: reason };
        }
        // The world may have changed while the request waited, and other requests of the
        // same parent may have been approved meanwhile: the whole contract again, cooldown
        // and narrowing included, exactly as for a request that needs no person.
        let parent_manifest = self.registry.get(&parent).map(|w| w.manifest.clone());
        // A parent unknown here is never checked as a root (which would skip its
        // cooldown and narrowing): the request is refused.
        let recheck = match &parent_manifest {
            Some(parent) => Candidate::Child {
                parent,
                manifest: &p.manifest,
            }
            .check(&self.contract, &*self.store, now),
            None => Decision::Deny(crate::contract::DenyReason::InvalidRequest(
                crate::manifest::FieldError::new(
                    "parent",
                    format!("{parent} is no longer known here"),
                ),
            )),
        };
        if let Decision::Deny(r) = recheck {
            self.record(
                r.audit_event(),
                "controller",
                Some(&child),
                json!({ "approval_id": approval_id, "reason": r.to_string() }),
                true,
            );
            self.reply_worker(
                &parent,
                WorkerReply::Denied {
                    event: r.audit_event().into(),
                    reason: r.to_string(),
                    approval_id: Some(approval_id.to_string()),
                },
            );
            return ApiResponse::Denied {
                event: r.audit_event().into(),
                reason: r.to_string(),
            };
        }
        self.record(
            event::APPROVAL_GRANTED,
            actor,
            Some(&child),
            json!({ "approval_id": approval_id }),
            true,
        );
        let depth = p.manifest.depth.get();
        self.record(
            event::REPLICATION_REQUESTED,
            &format!("worker:{parent}"),
            Some(&child),
            super::admit::with_egress(
                json!({ "parent": parent.as_str(), "depth": depth, "why": p.why, "approval_id": approval_id }),
                &p.manifest,
            ),
            true,
        );
        match self.launch(*p.manifest, now) {
            Admission::Started { worker_id, depth } => {
                self.reply_worker(
                    &parent,
                    WorkerReply::Allowed {
                        child_id: worker_id.clone(),
                        depth,
                        approval_id: Some(approval_id.to_string()),
                    },
                );
                ApiResponse::Decided {
                    approval_id: approval_id.to_string(),
                    approved: true,
                    child_id: Some(worker_id),
                }
            }
            other => {
                self.reply_worker(
                    &parent,
                    WorkerReply::Error {
                        message: "approved, but the child could not be started".into(),
                        approval_id: Some(approval_id.to_string()),
                    },
                );
                api_answer(other)
            }
        }
    }

    /// Denies what an ended worker was waiting for: its children could never start, and
    /// its requests held places of the approval queue, which every worker shares, until
    /// they timed out.
    /// Denies every request `parent` has waiting, for `reason`. The worker is not told: it
    /// has ended or is going away, and a decision frame after its last call's reply would
    /// be read by its next call.
    pub(super) fn drop_approvals_of(&mut self, parent: &WorkerId, reason: &str) {
        let theirs: Vec<String> = self
            .pending_approvals
            .values()
            .filter(|p| &p.requested_by == parent)
            .map(|p| p.approval_id.clone())
            .collect();
        for id in theirs {
            if let Some(p) = self.pending_approvals.remove(&id) {
                self.record(
                    event::APPROVAL_DENIED,
                    "controller",
                    Some(&p.manifest.worker_id),
                    json!({ "approval_id": id, "reason": reason }),
                    false,
                );
            }
        }
        if let Some(w) = self.registry.get_mut(parent) {
            w.awaiting_approval = false;
        }
    }

    /// A decision on one of `parent`'s requests: its silence is timed from now, and it is
    /// spared the heartbeat reaper only while another of its requests still waits (a
    /// worker that asked twice waits in its second call, and cannot also heartbeat).
    fn settle_waiting(&mut self, parent: &WorkerId, now_ms: u64) {
        let still_waiting = self
            .pending_approvals
            .values()
            .any(|p| &p.requested_by == parent);
        if let Some(w) = self.registry.get_mut(parent) {
            w.awaiting_approval = still_waiting;
            w.last_heartbeat_ms = Some(now_ms);
        }
    }

    pub(super) fn expire_approvals(&mut self, now_ms: u64) {
        let due: Vec<String> = self
            .pending_approvals
            .values()
            .filter(|p| p.deadline_ms <= now_ms)
            .map(|p| p.approval_id.clone())
            .collect();
        for id in due {
            let Some(p) = self.pending_approvals.remove(&id) else {
                continue;
            };
            let reason = format!(
                "no decision within {} s (an undecided request is never approved)",
                self.contract.approval.timeout_seconds
            );
            self.record(
                event::APPROVAL_TIMEOUT,
                "controller",
                Some(&p.manifest.worker_id),
                json!({ "approval_id": id, "reason": reason }),
                true,
            );
            self.settle_waiting(&p.requested_by, now_ms);
            self.reply_worker(
                &p.requested_by,
                WorkerReply::Denied {
                    event: event::APPROVAL_TIMEOUT.into(),
                    reason,
                    approval_id: Some(id),
                },
            );
        }
    }
}
