//! The launcher: queued requests to it, its reports (started, failed, exited, usage) and
//! what follows a worker's exit.

use serde_json::json;

use crate::audit::event;
use crate::broker::EgressEntry;
use crate::manifest::WorkerId;
use crate::sandbox::handle::KillHandle;

use crate::controller::bounded::{MAX_TEXT, clip};
use crate::controller::launcher::{LauncherEvent, LauncherRequest};
use crate::controller::link::LinkError;
use crate::controller::protocol::ExitInfo;
use crate::controller::registry::WorkerState;

use super::Engine;

impl Engine {
    /// Queues a request for the launcher (never blocking). An error says why it cannot go:
    /// the launcher is gone or not taking requests, or the request is too large.
    pub(super) fn send_launcher(
        &mut self,
        req: &LauncherRequest,
        fd: Option<std::os::fd::OwnedFd>,
    ) -> Result<(), String> {
        if !self.launcher_alive {
            return Err("the launcher is not running".into());
        }
        match self.effects.push_launcher(req, fd) {
            Ok(()) => {
                self.flush_launcher();
                Ok(())
            }
            Err(LinkError::Gone(e)) => {
                tracing::error!(error = %e, "the launcher is gone");
                self.launcher_alive = false;
                Err("the launcher is not running".into())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// Writes what the launcher will take of the queued requests, unless a decision that
    /// asked for them is not durable yet (then [`Engine::commit`] writes them, or a failed
    /// sync cancels the launches and writes the rest).
    pub(super) fn flush_launcher(&mut self) {
        if !self.held.holding() {
            self.write_launcher_queue();
        }
    }

    /// Writes what the launcher will take of the queued requests, held or not.
    pub(super) fn write_launcher_queue(&mut self) {
        if self.launcher_alive {
            if let Err(LinkError::Gone(e)) = self.effects.flush_launcher() {
                tracing::error!(error = %e, "the launcher is gone");
                self.launcher_alive = false;
            }
        }
    }

    /// Kills the launcher (it did not stop when asked, or cannot be asked). Its sandboxes
    /// die with it (parent-death signals) and were killed through the controller's own
    /// handles already; its cgroups are swept once it is reaped.
    pub(super) fn stop_launcher(&mut self) {
        if self.launcher_alive {
            tracing::error!("the launcher did not stop; killing it");
        }
        self.effects.kill_launcher();
        self.launcher_alive = false;
    }

    pub(super) fn launcher_event(&mut self, ev: LauncherEvent) {
        match ev {
            LauncherEvent::Ready { swept } => {
                if !swept.is_empty() {
                    self.record(
                        event::CRASH_RECOVERED,
                        "controller",
                        None,
                        json!({ "removed_cgroups": swept }),
                        true,
                    );
                }
            }
            ev @ LauncherEvent::Started { .. } => self.started(ev),
            LauncherEvent::Egress {
                worker_id,
                entries,
                dropped,
                lost,
            } => self.egress(worker_id, entries, dropped, lost),
            LauncherEvent::StartFailed { worker_id, error } => {
                let Ok(id) = WorkerId::new(worker_id) else {
                    return;
                };
                let ended_by = format!("could not start: {}", clip(&error, MAX_TEXT));
                self.start_failed(&id, &error, ended_by, true);
            }
            ev @ LauncherEvent::Exited { .. } => self.exit_reported(ev),
            LauncherEvent::Refused { error } => {
                // The engine checks what it sends; a refusal here is a defect to see.
                tracing::error!(%error, "the launcher refused a request");
                self.record(
                    event::PROTOCOL_VIOLATION,
                    "controller",
                    None,
                    json!({ "launcher_refused": error }),
                    false,
                );
            }
            LauncherEvent::Usage { workers } => {
                self.last_usage = workers;
                self.answer_ps();
            }
        }
    }

    /// Records what a worker's egress broker saw: each connection and DNS answer is an
    /// entry caused by the worker (so its audit budget bounds them), and what the broker
    /// only counted is said as suppressed.
    fn egress(
        &mut self,
        worker_id: String,
        entries: Vec<EgressEntry>,
        dropped: u64,
        lost: Option<String>,
    ) {
        let Ok(id) = WorkerId::new(worker_id) else {
            return;
        };
        if self.registry.get(&id).is_none() {
            return;
        }
        if let Some(why) = lost {
            // Never passed off as "nothing went out".
            let why = crate::controller::bounded::clip(&why, 256);
            self.record(
                event::EGRESS_RECORD_LOST,
                "controller",
                Some(&id),
                serde_json::json!({ "error": why }),
                false,
            );
        }
        let actor = format!("worker:{id}");
        for e in entries {
            let ev = match e.event.as_str() {
                "egress_allowed" => event::EGRESS_ALLOWED,
                "egress_denied" => event::EGRESS_DENIED,
                "dns_answered" => event::DNS_ANSWERED,
                _ => event::DNS_REFUSED,
            };
            let details = serde_json::to_value(&e).unwrap_or_default();
            self.record(ev, &actor, Some(&id), details, false);
        }
        if dropped > 0 {
            self.record_suppressed(
                &id,
                std::iter::once(("egress".to_string(), dropped)).collect(),
            );
        }
    }

    /// A worker's sandbox runs: its pid, cgroup and the controller's own handle on it.
    fn started(&mut self, ev: LauncherEvent) {
        let LauncherEvent::Started {
            worker_id,
            pid,
            start_time,
            cgroup,
            enforcement,
            prepared_ahead,
        } = ev
        else {
            return;
        };
        let Ok(id) = WorkerId::new(worker_id) else {
            return;
        };
        let not_enforced = enforcement.get("not_enforced").cloned().unwrap_or_default();
        let handle = start_time.and_then(|t| {
            KillHandle::open(pid, t, cgroup.as_deref())
                .inspect_err(|e| tracing::warn!(worker = %id, error = %e, "no handle on the sandbox; only the launcher can kill it"))
                .ok()
        });
        if let Some(w) = self.registry.get_mut(&id) {
            w.pid = Some(pid);
            w.cgroup = cgroup.clone();
            w.handle = handle;
            if w.state == WorkerState::Stopping {
                // Ended while its launch was on the way (a kill, the kill switch).
                if let Some(h) = &w.handle {
                    h.kill();
                }
            }
        }
        self.record(
            event::WORKER_STARTED,
            "controller",
            Some(&id),
            json!({ "pid": pid, "cgroup": cgroup, "not_enforced": not_enforced, "prepared_ahead": prepared_ahead }),
            false,
        );
    }

    /// Whether the worker's manifest gives it an egress broker.
    pub(super) fn has_broker(&self, id: &WorkerId) -> bool {
        self.registry
            .get(id)
            .is_some_and(|w| w.manifest.resources.network_policy.reaches_hosts())
    }

    /// The launcher is gone, and with it every broker, before they reported what their
    /// open connections carried: said for each active worker that had one.
    pub(super) fn egress_lost_with_launcher(&mut self, ids: &[WorkerId]) {
        for id in ids {
            if self.has_broker(id) {
                self.record(
                    event::EGRESS_RECORD_LOST,
                    "controller",
                    Some(id),
                    json!({ "error": "the launcher exited before this worker's egress broker reported: connections still open then were not recorded" }),
                    false,
                );
            }
        }
    }

    /// The launcher's report of an exit, with its accounting.
    fn exit_reported(&mut self, ev: LauncherEvent) {
        let LauncherEvent::Exited {
            worker_id,
            exit_code,
            signal,
            oom_killed,
            timed_out,
            wall_ms,
            usage,
            error,
            output_bytes,
            output_truncated,
        } = ev
        else {
            return;
        };
        let Ok(id) = WorkerId::new(worker_id) else {
            return;
        };
        if !self.registry.get(&id).is_some_and(|w| w.state.is_active()) {
            // The controller confirmed and recorded this exit itself already.
            tracing::info!(worker = %id, "the launcher reported an exit recorded already");
            return;
        }
        let ended_by = self.registry.get(&id).and_then(|w| w.ended_by.clone());
        if let Some(w) = self.registry.get_mut(&id) {
            w.final_usage = Some(usage.clone());
        }
        self.record(
            event::WORKER_EXITED,
            "controller",
            Some(&id),
            json!({
                "exit_code": exit_code, "signal": signal, "oom_killed": oom_killed,
                "timed_out": timed_out, "wall_ms": wall_ms, "ended_by": ended_by,
                "cpu_usec": usage.cpu_usec, "memory_peak_bytes": usage.memory_peak_bytes,
                "error": error,
                "output_bytes": output_bytes, "output_truncated": output_truncated,
            }),
            false,
        );
        self.exited(
            &id,
            ExitInfo {
                exit_code,
                signal,
                oom_killed,
                timed_out,
                ended_by,
                error: error.map(|e| clip(&e, MAX_TEXT)),
                output_cut_at: output_truncated.then(|| output_bytes.unwrap_or(0)),
            },
        );
    }

    pub(super) fn exited(&mut self, id: &WorkerId, exit: ExitInfo) {
        self.registry.mark_exited(id, exit);
        self.drop_approvals_of(id, "the worker that asked has ended");
        self.store.release(id);
        self.noisy.retain(|(w, _), _| w != id);
        if let Some(counts) = self.audit_budgets.remove(id) {
            self.record_suppressed(id, counts);
        }
        self.settle_waiters();
    }
}

impl Engine {
    /// An exit the controller confirmed itself, the launcher not reporting it: recorded
    /// as such, then ended.
    pub(super) fn exit_confirmed(
        &mut self,
        id: &WorkerId,
        ended_by: Option<String>,
        signal: Option<i32>,
    ) {
        self.record(
            event::WORKER_EXITED,
            "controller",
            Some(id),
            json!({ "ended_by": ended_by, "signal": signal, "confirmed_by": "controller", "launcher_reported": false }),
            false,
        );
        self.exited(
            id,
            ExitInfo {
                exit_code: 137,
                signal,
                oom_killed: false,
                timed_out: false,
                ended_by,
                error: None,
                output_cut_at: None,
            },
        );
    }

    /// A worker that never started: recorded, and ended as `run` ends a sandbox that could
    /// not be set up (125).
    pub(super) fn start_failed(
        &mut self,
        id: &WorkerId,
        error: &str,
        ended_by: String,
        sync: bool,
    ) {
        self.record(
            event::WORKER_START_FAILED,
            "controller",
            Some(id),
            json!({ "error": error }),
            sync,
        );
        self.exited(
            id,
            ExitInfo {
                exit_code: 125,
                signal: None,
                oom_killed: false,
                timed_out: false,
                ended_by: Some(ended_by),
                error: Some(clip(error, MAX_TEXT)),
                output_cut_at: None,
            },
        );
    }
}
