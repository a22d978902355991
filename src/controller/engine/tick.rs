//! The periodic check: reaping the silent and the expired (decided by
//! `admission::reaping`), shutdown and timeout deadlines, exits the launcher did not report.

use serde_json::json;

use crate::audit::event;
use crate::manifest::WorkerId;
use crate::sandbox::handle::KillHandle;

use crate::controller::admission::reaping::{self, Patience, Phase, Reap, Vitals};
use crate::controller::registry::{WorkerRecord, WorkerState};

use super::Engine;

/// How long a sandbox the controller's own handle shows gone may wait for the launcher's
/// report (with its accounting) before the controller records the exit itself.
const UNREPORTED_EXIT_GRACE_MS: u64 = 2000;

/// Past a worker's timeout, how long the launcher has to enforce it before the controller
/// does.
const TIMEOUT_GRACE_MS: u64 = 2000;

/// What reaping reads of a live worker's record.
fn vitals(w: &WorkerRecord) -> Vitals<'_> {
    Vitals {
        manifest: &w.manifest,
        phase: match w.state {
            WorkerState::Starting => Phase::Starting,
            WorkerState::Registered => Phase::Registered,
            // Exited workers are not live; neither is reaped.
            WorkerState::Stopping | WorkerState::Exited => Phase::Stopping,
        },
        unsupervised: w.unsupervised,
        awaiting_approval: w.awaiting_approval,
        started_at_ms: w.started_at_ms,
        last_heartbeat_ms: w.last_heartbeat_ms,
    }
}

impl Engine {
    pub(super) fn tick(&mut self) {
        let now_ms = self.effects.now_ms();
        let patience = Patience {
            heartbeat_timeout_ms: self.cfg.heartbeat_timeout.as_millis() as u64,
            register_timeout_ms: self.cfg.register_timeout.as_millis() as u64,
        };
        let mut stale = Vec::new();
        let mut expired = Vec::new();
        for (id, w) in self.registry.active() {
            match reaping::reap_due(&vitals(w), patience, now_ms) {
                Some(Reap::Expired) => expired.push(id.clone()),
                Some(why) => stale.push((id.clone(), why)),
                None => {}
            }
        }
        for (id, why) in stale {
            let silent_ms = self
                .registry
                .get(&id)
                .and_then(|w| w.last_heartbeat_ms)
                .map(|t| now_ms.saturating_sub(t));
            self.record(
                event::REAP_STALE,
                "controller",
                Some(&id),
                json!({ "why": why.why(), "silent_ms": silent_ms }),
                true,
            );
            let ended_by = if why == Reap::NeverRegistered {
                format!(
                    "reaped: never registered within {} (a command that does not speak the worker protocol: spawn it with --no-controller)",
                    crate::units::format_duration(self.cfg.register_timeout)
                )
            } else {
                format!("reaped: {}", why.why())
            };
            self.stop(&id, &ended_by);
        }
        for id in expired {
            let at = self.registry.get(&id).map(|w| w.manifest.expires_at.get());
            self.record(
                event::WORKER_EXPIRED,
                "controller",
                Some(&id),
                json!({ "expires_at": at }),
                true,
            );
            self.stop(&id, "manifest expired");
        }
        let due: Vec<WorkerId> = self
            .shutdown_deadlines
            .iter()
            .filter(|(_, t)| *t <= now_ms)
            .map(|(id, _)| id.clone())
            .collect();
        self.shutdown_deadlines.retain(|(_, t)| *t > now_ms);
        for id in due {
            self.stop(&id, "did not exit after its shutdown request");
        }
        self.enforce_timeouts(now_ms);
        self.confirm_unreported_exits(now_ms);
        for (id, counts) in self.audit_budgets.due(now_ms) {
            self.record_suppressed(&id, counts);
        }
        if self
            .shutdown_deadline
            .is_some_and(|d| self.effects.instant() >= d)
        {
            self.shutdown_deadline = None;
            self.stop_launcher();
            self.finish();
            return;
        }
        self.expire_approvals(now_ms);
        self.settle_waiters();
        // As for a decision's own sync: without a durable trail, nothing goes on.
        if self.sync_trail() {
            self.cluster_anchor(now_ms);
        }
    }

    /// A worker past its timeout that the launcher has not ended is ended here.
    pub(super) fn enforce_timeouts(&mut self, now_ms: u64) {
        let late: Vec<WorkerId> = self
            .registry
            .active()
            .filter(|(_, w)| w.state != WorkerState::Stopping && w.handle.is_some())
            .filter(|(_, w)| {
                reaping::past_timeout(&w.manifest, w.started_at_ms, TIMEOUT_GRACE_MS, now_ms)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in late {
            self.record(
                event::WORKER_KILLED,
                "controller",
                Some(&id),
                json!({ "why": "past its timeout; the launcher had not ended it" }),
                true,
            );
            self.stop(&id, "timeout (enforced by the controller)");
        }
    }

    /// Records exits the controller's own handles show and the launcher has not reported
    /// within [`UNREPORTED_EXIT_GRACE_MS`] (a launcher that is not responding): quotas,
    /// waiters and `ps` follow what the kernel says, not the launcher.
    pub(super) fn confirm_unreported_exits(&mut self, now_ms: u64) {
        let mut confirmed = Vec::new();
        for (id, w) in self.registry.active_mut() {
            if !w.handle.as_ref().is_some_and(KillHandle::exited) {
                continue;
            }
            let since = *w.gone_unreported_since_ms.get_or_insert(now_ms);
            if now_ms.saturating_sub(since) >= UNREPORTED_EXIT_GRACE_MS {
                confirmed.push((id.clone(), w.ended_by.clone()));
            }
        }
        for (id, ended_by) in confirmed {
            self.exit_confirmed(&id, ended_by, None);
        }
    }
}
