//! Group commit: a batch of inputs is decided, its security decisions are made durable
//! with one `fdatasync`, and only then does anything they decided leave the engine.
//!
//! A decision recorded with `sync` marks the batch; until [`Engine::commit`], the answers
//! to the API and to workers are held here and the launcher's requests stay queued. So no
//! entry is reported, and no worker starts, before its entry is on disk, however many
//! decisions share the sync. A sync that fails stops everything (as one decision's own
//! failed sync did): the held answers become errors (a refusal stays a refusal) and the
//! queued launches are cancelled.

use tokio::sync::oneshot;

use crate::controller::launcher::LauncherRequest;
use crate::controller::protocol::{ApiResponse, WorkerReply};
use crate::manifest::WorkerId;

use super::Engine;

/// What the engine has decided and not yet let out.
#[derive(Default)]
pub(super) struct Held {
    /// A decision recorded since the last sync must be durable before anything leaves.
    pub(super) must_sync: bool,
    /// A sync failed during this batch (a tick's, or a kill's): nothing it held is
    /// answered as done, whatever a later sync does.
    failed: bool,
    api: Vec<(oneshot::Sender<ApiResponse>, ApiResponse)>,
    workers: Vec<(WorkerId, WorkerReply)>,
    /// This node's acknowledgements of the cluster's kill switch: (revision, killed, ms).
    acks: Vec<(i64, usize, u64)>,
}

impl Engine {
    /// Answers an API request: at once, or at the end of the batch when a decision in it
    /// is not durable yet.
    pub(super) fn answer(&mut self, reply: oneshot::Sender<ApiResponse>, response: ApiResponse) {
        if self.held.must_sync {
            self.held.api.push((reply, response));
        } else {
            let _ = reply.send(response);
        }
    }

    /// Queues a reply for a worker, held like an API answer while the batch is not
    /// durable (see [`Engine::deliver_worker`]).
    pub(super) fn reply_worker(&mut self, id: &WorkerId, reply: WorkerReply) {
        if self.held.must_sync {
            self.held.workers.push((id.clone(), reply));
        } else {
            self.deliver_worker(id, reply);
        }
    }

    /// Acknowledges the cluster's kill switch (in a cluster), held like an answer: the
    /// entry that says this node carried it out is durable first.
    pub(super) fn ack_cluster(&mut self, revision: i64, killed: usize, elapsed_ms: u64) {
        if self.held.must_sync {
            self.held.acks.push((revision, killed, elapsed_ms));
        } else if let Some(c) = &mut self.cluster {
            c.ack(revision, killed, elapsed_ms);
        }
    }

    /// Makes every entry recorded so far durable. A trail that cannot be written stops
    /// everything: the kill switch, every sandbox killed through the controller's own
    /// handles, every queued launch cancelled, and the launcher told to kill too.
    pub(super) fn sync_trail(&mut self) -> bool {
        self.held.must_sync = false;
        match self.audit.sync() {
            Ok(()) => true,
            Err(e) => {
                self.held.failed = true;
                tracing::error!(error = %e, "the audit trail cannot be written; engaging the kill switch");
                self.engage_local_kill_switch();
                self.kill_all_directly();
                let _ = self.send_launcher(&LauncherRequest::KillAll, None);
                false
            }
        }
    }

    /// Ends a batch: makes its decisions durable, then lets out what it held (or, when the
    /// trail cannot be written, says so instead) and writes the launcher's queue.
    pub fn commit(&mut self) {
        // Delivering to a worker can decide again (one that does not read its replies is
        // stopped, and that is recorded): a second round makes that durable too.
        for _ in 0..2 {
            let synced = !self.held.must_sync || self.sync_trail();
            let durable = synced && !std::mem::take(&mut self.held.failed);
            let api = std::mem::take(&mut self.held.api);
            let workers = std::mem::take(&mut self.held.workers);
            let acks = std::mem::take(&mut self.held.acks);
            for (reply, response) in api {
                // A refusal changed nothing: it is answered as it is, whatever the trail.
                let response = if durable || matches!(response, ApiResponse::Denied { .. }) {
                    response
                } else {
                    ApiResponse::Error {
                        message: "the audit trail cannot be written: the controller engaged its kill switch; see its log".into(),
                    }
                };
                let _ = reply.send(response);
            }
            if durable {
                for (id, reply) in workers {
                    self.deliver_worker(&id, reply);
                }
                if let Some(c) = &mut self.cluster {
                    for (revision, killed, ms) in acks {
                        c.ack(revision, killed, ms);
                    }
                }
            }
            if !self.held.must_sync {
                break;
            }
        }
        if self.held.must_sync {
            self.sync_trail();
        }
        self.flush_launcher();
    }
}
