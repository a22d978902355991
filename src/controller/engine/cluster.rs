//! What a controller that is one node of a cluster does with what the cluster tells it:
//! the lease's fence deadline (handed to the launcher), a fence (every worker dies), the
//! cluster's kill switch (carried out here, then acknowledged), kill requests for this
//! node's workers; and what it tells the cluster: its audit head.

use std::time::Duration;

use serde_json::json;
use tokio::sync::oneshot;

use crate::audit::event;
use crate::controller::cluster::{AnchorRecord, KillRequest};
use crate::controller::launcher::LauncherRequest;
use crate::controller::protocol::ApiResponse;
use crate::controller::registry::WorkerState;

use super::Engine;
use super::kill::WaitKind;

/// How long `kill-switch --cluster` waits for every live node's acknowledgement.
const ACK_LIMIT: Duration = Duration::from_secs(30);
/// How often this node's audit head is anchored in the cluster (when it moved).
const ANCHOR_EVERY_MS: u64 = 1000;

impl Engine {
    /// A renewed (or new) lease: the launcher kills every worker at `fence_at_ms` unless
    /// told a later time.
    pub(super) fn cluster_lease(&mut self, fence_at_ms: u64, rejoined: bool) {
        if rejoined {
            self.record(event::CLUSTER_REJOINED, "controller", None, json!({}), true);
            // The acknowledgement went with the old lease: said again under the new one.
            if let (Some((revision, killed, ms)), Some(engaged)) =
                (self.last_ack, self.cluster_kill)
            {
                if revision == engaged {
                    self.ack_cluster(revision, killed, ms);
                }
            }
        }
        let _ = self.send_launcher(
            &LauncherRequest::Fence {
                at_boottime_ms: fence_at_ms,
            },
            None,
        );
    }

    /// This node could not renew its lease in time: its workers die now, before another
    /// node can take their slots. (The launcher kills them at the deadline by itself.)
    pub(super) fn cluster_fenced(&mut self, reason: &str) {
        let ids: Vec<_> = self.registry.active().map(|(id, _)| id.clone()).collect();
        self.record(
            event::CLUSTER_FENCED,
            "controller",
            None,
            json!({ "reason": reason, "active_workers": ids.len() }),
            true,
        );
        for id in &ids {
            if let Some(w) = self.registry.get_mut(id) {
                w.state = WorkerState::Stopping;
                w.ended_by = Some(format!("fenced: {reason}"));
                w.conn = None;
            }
        }
        self.kill_all_directly();
        let _ = self.send_launcher(&LauncherRequest::KillAll, None);
    }

    /// The cluster's kill switch was written or removed.
    pub(super) fn cluster_kill_switch(&mut self, engaged: bool, revision: i64) {
        match (engaged, self.cluster_kill) {
            (true, Some(r)) if r == revision => {}
            (true, _) => {
                self.cluster_kill = Some(revision);
                let (reply, _) = oneshot::channel();
                self.engage_kill_switch_for("cluster", WaitKind::ClusterAck { revision }, reply);
            }
            (false, Some(_)) => {
                self.cluster_kill = None;
                // This node's own kill switch, if engaged, stays.
                self.settle_kill_switch();
                self.record(
                    event::KILL_SWITCH_RELEASED,
                    "cluster",
                    None,
                    json!({}),
                    true,
                );
            }
            (false, None) => {}
        }
    }

    /// Another node asks for one of this node's workers to go.
    pub(super) fn cluster_kill(&mut self, request: KillRequest) {
        let active = self
            .registry
            .get(&request.worker_id)
            .is_some_and(|w| w.state.is_active());
        if !active {
            return;
        }
        let (reply, _) = oneshot::channel();
        let actor = format!("cluster:{}", request.by);
        self.kill(&actor, &request.worker_id, request.recursive, reply);
        if let Some(c) = &mut self.cluster {
            c.kill_done(&request.worker_id);
        }
    }

    /// `kill-switch --cluster [--release]`.
    pub(super) fn cluster_kill_switch_request(
        &mut self,
        actor: &str,
        release: bool,
        reply: oneshot::Sender<ApiResponse>,
    ) {
        let Some(cluster) = &mut self.cluster else {
            self.answer(reply, not_a_node());
            return;
        };
        match cluster.set_kill_switch(!release, actor) {
            Err(e) => {
                self.answer(
                    reply,
                    ApiResponse::Error {
                        message: format!("cannot write the cluster's kill switch: {e}"),
                    },
                );
            }
            Ok(_) if release => {
                self.answer(reply, super::kill::released());
            }
            Ok(revision) => cluster.await_acks(revision, ACK_LIMIT, reply),
        }
    }

    /// `ps --cluster`.
    pub(super) fn cluster_ps(&mut self, reply: oneshot::Sender<ApiResponse>) {
        match &mut self.cluster {
            Some(c) => c.workers(reply),
            None => {
                self.answer(reply, not_a_node());
            }
        }
    }

    /// Anchors the audit head in the cluster when it moved (at most every second).
    pub(super) fn cluster_anchor(&mut self, now_ms: u64) {
        if self.cluster.is_none() || now_ms < self.last_anchor.0.saturating_add(ANCHOR_EVERY_MS) {
            return;
        }
        let Some(crate::audit::SyncedHead { seq, hash, trail }) = self.audit.synced_head() else {
            return;
        };
        if seq == self.last_anchor.1 {
            return;
        }
        self.last_anchor = (now_ms, seq);
        let session = self.cfg.session.clone();
        if let Some(c) = &mut self.cluster {
            let node = c.node_id().to_string();
            c.anchor(AnchorRecord {
                node,
                session,
                seq,
                hash,
                trail,
                at_ms: now_ms,
            });
        }
    }
}

fn not_a_node() -> ApiResponse {
    ApiResponse::Error {
        message: "this controller is not part of a cluster (start it with --cluster etcd://HOST:PORT --node-id NAME)".into(),
    }
}
