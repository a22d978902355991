//! Ending workers: one (`kill`), a subtree, or all of them (the kill switch), through the
//! controller's own handles first and the launcher as well; answers wait for every exit.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::oneshot;

use crate::audit::event;
use crate::manifest::WorkerId;

use crate::controller::launcher::LauncherRequest;
use crate::controller::protocol::ApiResponse;
use crate::controller::registry::WorkerState;

use super::Engine;

/// What a waiting request answers once its workers are gone.
pub(super) enum WaitKind {
    Kill,
    KillSwitch,
    /// The cluster's kill switch written at this revision: acknowledged in the cluster
    /// once this node's workers are gone.
    ClusterAck {
        revision: i64,
    },
}

/// A `kill` or `kill-switch` request waiting for the exits of the workers it ended.
pub(super) struct Waiter {
    pub(super) ids: BTreeSet<WorkerId>,
    pub(super) killed: Vec<WorkerId>,
    pub(super) kind: WaitKind,
    pub(super) reply: oneshot::Sender<ApiResponse>,
    pub(super) started: Instant,
}

/// The answer to a kill switch's release.
pub(super) fn released() -> ApiResponse {
    ApiResponse::KillSwitch {
        engaged: false,
        killed: 0,
        elapsed_ms: 0,
    }
}

/// How long `kill` and `kill-switch` wait for the launcher to confirm every exit.
const WAIT_LIMIT: Duration = Duration::from_secs(30);

impl Engine {
    /// Kills a worker's sandbox through the controller's own handle: never waits on the
    /// launcher (which is asked as well, for its accounting).
    pub(super) fn kill_directly(&self, id: &WorkerId) {
        if let Some(h) = self.registry.get(id).and_then(|w| w.handle.as_ref()) {
            h.kill();
        }
    }

    /// Kills every sandbox through the controller's own handles, and cancels every launch
    /// the launcher has not begun to read: nothing starts after this.
    pub(super) fn kill_all_directly(&mut self) {
        for (_, w) in self.registry.active() {
            if let Some(h) = &w.handle {
                h.kill();
            }
        }
        self.cancel_queued_launches();
    }

    /// Takes back every launch the launcher has not begun to read; each is a start that
    /// failed.
    pub(super) fn cancel_queued_launches(&mut self) {
        for worker_id in self.effects.cancel_launches() {
            let Ok(id) = WorkerId::new(worker_id) else {
                continue;
            };
            // Not synced here: this runs when a sync has just failed (see `sync_trail`).
            self.start_failed(
                &id,
                "its launch was cancelled before the launcher read it",
                "the kill switch cancelled its launch".into(),
                false,
            );
        }
    }

    /// Ends a worker: the controller kills its whole sandbox through its own handle, and
    /// asks the launcher to (which reports the exit with its accounting).
    pub(super) fn stop(&mut self, id: &WorkerId, why: &str) {
        if let Some(w) = self.registry.get_mut(id) {
            if !w.state.is_active() {
                return;
            }
            w.state = WorkerState::Stopping;
            w.ended_by.get_or_insert_with(|| why.to_string());
            w.conn = None;
        }
        self.kill_directly(id);
        let _ = self.send_launcher(
            &LauncherRequest::Kill {
                worker_id: id.to_string(),
            },
            None,
        );
    }

    /// Ends a worker (or its whole subtree) for a person and answers once it is gone.
    pub(super) fn kill(
        &mut self,
        actor: &str,
        worker_id: &WorkerId,
        recursive: bool,
        reply: oneshot::Sender<ApiResponse>,
    ) {
        let ids = if recursive {
            self.registry.subtree(worker_id)
        } else if self
            .registry
            .get(worker_id)
            .is_some_and(|w| w.state.is_active())
        {
            vec![worker_id.clone()]
        } else {
            Vec::new()
        };
        if ids.is_empty() {
            // A worker of another node: its node kills it.
            if let Some(cluster) = &mut self.cluster {
                cluster.request_kill(worker_id, recursive, actor, WAIT_LIMIT, reply);
                return;
            }
            self.answer(
                reply,
                ApiResponse::Error {
                    message: format!("no running worker {worker_id}"),
                },
            );
            return;
        }
        for id in &ids {
            self.record(
                event::WORKER_KILLED,
                actor,
                Some(id),
                json!({ "recursive": recursive }),
                false,
            );
            self.stop(id, &format!("killed by {actor}"));
        }
        self.sync_trail();
        self.wait_for(ids, WaitKind::Kill, reply);
    }

    /// Stops everything: nothing new starts, every worker is killed, every pending
    /// approval is denied; answers once every worker is gone.
    pub(super) fn engage_kill_switch(&mut self, actor: &str, reply: oneshot::Sender<ApiResponse>) {
        self.engage_kill_switch_for(actor, WaitKind::KillSwitch, reply);
    }

    /// The kill switch, answered as `kind` says once every worker is gone.
    pub(super) fn engage_kill_switch_for(
        &mut self,
        actor: &str,
        kind: WaitKind,
        reply: oneshot::Sender<ApiResponse>,
    ) {
        let ids: Vec<WorkerId> = self.registry.active().map(|(id, _)| id.clone()).collect();
        if matches!(kind, WaitKind::ClusterAck { .. }) {
            self.settle_kill_switch();
        } else {
            self.engage_local_kill_switch();
        }
        // Durable before it takes effect.
        self.record(
            event::KILL_SWITCH_ENGAGED,
            actor,
            None,
            json!({ "active_workers": ids.len() }),
            true,
        );
        for id in &ids {
            if let Some(w) = self.registry.get_mut(id) {
                w.state = WorkerState::Stopping;
                w.ended_by = Some("kill switch".into());
                w.conn = None;
            }
        }
        // By the controller's own handles first: the launcher may not be reading.
        self.kill_all_directly();
        let _ = self.send_launcher(&LauncherRequest::KillAll, None);
        for p in std::mem::take(&mut self.pending_approvals).into_values() {
            self.record(
                event::APPROVAL_DENIED,
                "controller",
                Some(&p.manifest.worker_id),
                json!({ "approval_id": p.approval_id, "reason": "the kill switch is engaged" }),
                false,
            );
        }
        self.wait_for(ids, kind, reply);
    }

    pub(super) fn release_kill_switch(&mut self, actor: &str, reply: oneshot::Sender<ApiResponse>) {
        self.local_kill = false;
        self.settle_kill_switch();
        let cluster = self.cluster_kill.is_some();
        self.record(
            event::KILL_SWITCH_RELEASED,
            actor,
            None,
            json!({ "cluster_kill_switch_engaged": cluster }),
            true,
        );
        if cluster {
            self.answer(reply, ApiResponse::Error {
                message: "this node's own kill switch is released, but the cluster's is engaged: nothing new starts until `hatchery kill-switch --cluster --release`".into(),
            });
            return;
        }
        self.answer(reply, released());
    }

    pub(super) fn wait_for(
        &mut self,
        ids: Vec<WorkerId>,
        kind: WaitKind,
        reply: oneshot::Sender<ApiResponse>,
    ) {
        let waiter = Waiter {
            ids: ids
                .iter()
                .filter(|id| self.registry.get(id).is_some_and(|w| w.state.is_active()))
                .cloned()
                .collect(),
            killed: ids,
            kind,
            reply,
            started: self.effects.instant(),
        };
        self.waiters.push(waiter);
        self.settle_waiters();
    }

    pub(super) fn settle_waiters(&mut self) {
        // Gone: the launcher said so (its cgroup removed too), or the controller's own
        // handle has shown it gone for longer than the launcher takes to say so (see
        // `confirm_unreported_exits`).
        let registry = &self.registry;
        for w in &mut self.waiters {
            w.ids
                .retain(|id| registry.get(id).is_some_and(|r| r.state.is_active()));
        }
        let (done, waiting): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|w| w.ids.is_empty() || w.started.elapsed() > WAIT_LIMIT);
        self.waiters = waiting;
        if !done.is_empty() {
            // What they report (the exits that ended the wait) is on disk before they do.
            self.held.must_sync = true;
        }
        for w in done {
            {
                let elapsed_ms = w.started.elapsed().as_millis() as u64;
                let resp = if !w.ids.is_empty() {
                    ApiResponse::Error {
                        message: format!(
                            "{} workers did not exit within {} s",
                            w.ids.len(),
                            WAIT_LIMIT.as_secs()
                        ),
                    }
                } else {
                    match w.kind {
                        WaitKind::Kill => ApiResponse::Killed {
                            workers: w.killed,
                            elapsed_ms,
                        },
                        WaitKind::KillSwitch => ApiResponse::KillSwitch {
                            engaged: true,
                            killed: w.killed.len(),
                            elapsed_ms,
                        },
                        WaitKind::ClusterAck { revision } => {
                            self.ack_cluster(revision, w.killed.len(), elapsed_ms);
                            self.last_ack = Some((revision, w.killed.len(), elapsed_ms));
                            ApiResponse::KillSwitch {
                                engaged: true,
                                killed: w.killed.len(),
                                elapsed_ms,
                            }
                        }
                    }
                };
                self.answer(w.reply, resp);
            }
        }
    }
}
