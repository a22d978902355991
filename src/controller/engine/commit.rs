//! Group commit: a batch of inputs is decided, its security decisions are made durable
//! with one `fdatasync`, and only then does anything they decided leave the engine.
//!
//! A decision recorded with `sync` marks the batch; until [`Engine::commit`], the answers
//! to the API and to workers are held here and the launcher's requests stay queued. So no
//! entry is reported, and no worker starts, before its entry is on disk, however many
//! decisions share the sync. A sync that fails stops everything (as one decision's own
//! failed sync did): the held answers become errors (a refusal stays a refusal), the
//! queued launches are cancelled, and until a sync succeeds whatever follows is held too.

use tokio::sync::oneshot;

use crate::controller::launcher::LauncherRequest;
use crate::controller::protocol::{ApiResponse, WorkerFrame, WorkerReply};
use crate::manifest::WorkerId;

use super::Engine;

/// What the engine has decided and not yet let out.
#[derive(Default)]
pub(super) struct Held {
    /// A decision recorded since the last sync must be durable before anything leaves.
    pub(super) must_sync: bool,
    /// The kill switch the engine engaged when the trail could not be written, until an
    /// entry saying so is on disk.
    pub(super) audit_failure: Option<AuditFailure>,
    api: Vec<(oneshot::Sender<ApiResponse>, ApiResponse)>,
    workers: Vec<(WorkerId, WorkerFrame)>,
    /// This node's acknowledgements of the cluster's kill switch: (revision, killed, ms).
    acks: Vec<(i64, usize, u64)>,
}

/// When the trail first failed, and why.
pub(super) struct AuditFailure {
    since_ms: u64,
    /// What could not be written: the trail, or its anchor.
    what: &'static str,
    error: String,
    /// Whether the entry that records it is appended and waiting for a sync.
    pub(super) noted: bool,
}

impl AuditFailure {
    /// The details of the `kill_switch_engaged` entry that records it.
    pub(super) fn details(&self) -> serde_json::Value {
        serde_json::json!({
            "reason": format!("the audit {} could not be written", self.what),
            "since": crate::audit::format_time(self.since_ms),
            "error": self.error,
        })
    }
}

impl Held {
    pub(super) fn holding(&self) -> bool {
        self.must_sync
    }
}

/// What a held answer becomes when the decisions before it cannot be made durable.
fn not_durable(response: ApiResponse) -> ApiResponse {
    // A refusal changed nothing: it is answered as it is, whatever the trail.
    if matches!(response, ApiResponse::Denied { .. }) {
        return response;
    }
    ApiResponse::Error {
        message:
            "the audit trail cannot be written: the controller engaged its kill switch; see its log"
                .into(),
    }
}

impl Engine {
    /// Answers an API request: at once, or once what was decided before it is durable.
    pub(super) fn answer(&mut self, reply: oneshot::Sender<ApiResponse>, response: ApiResponse) {
        if self.held.holding() {
            self.held.api.push((reply, response));
        } else {
            let _ = reply.send(response);
        }
    }

    /// Queues a reply for a worker, held like an API answer (see
    /// [`Engine::deliver_worker`]). A reply to the request being handled names that
    /// request's `call`; a decision, which answers a request made before, never does.
    pub(super) fn reply_worker(&mut self, id: &WorkerId, reply: WorkerReply) {
        let call = match &self.answering {
            Some((to, call)) if to == id && reply.decides().is_none() => call.clone(),
            _ => None,
        };
        self.answer_worker(id, call, reply);
    }

    /// [`Engine::reply_worker`] with the `call` given.
    pub(super) fn answer_worker(
        &mut self,
        id: &WorkerId,
        call: Option<String>,
        reply: WorkerReply,
    ) {
        let frame = WorkerFrame { reply, call };
        if self.held.holding() {
            self.held.workers.push((id.clone(), frame));
        } else {
            self.deliver_worker(id, frame);
        }
    }

    /// Acknowledges the cluster's kill switch (in a cluster), held like an answer: the
    /// entry that says this node carried it out is durable first.
    pub(super) fn ack_cluster(&mut self, revision: i64, killed: usize, elapsed_ms: u64) {
        if self.held.holding() {
            self.held.acks.push((revision, killed, elapsed_ms));
        } else if let Some(c) = &mut self.cluster {
            c.ack(revision, killed, elapsed_ms);
        }
    }

    /// Makes every entry recorded so far durable. A trail that cannot be written stops
    /// everything: what was held is answered as not done (and dropped for workers and the
    /// cluster; the trail drops those decisions too), the kill switch engages, every
    /// sandbox is killed through the controller's own handles, every queued launch is
    /// cancelled, and the launcher is told to kill too. An anchor that cannot be written
    /// stops everything the same way, but what was held is on disk, so it goes out as
    /// decided first. Either way the next entry recorded says why the kill switch is on.
    pub(super) fn sync_trail(&mut self) -> bool {
        self.held.must_sync = false;
        let e = match self.audit.sync() {
            Ok(()) => {
                if self.held.audit_failure.as_ref().is_some_and(|f| f.noted) {
                    self.held.audit_failure = None;
                }
                return true;
            }
            Err(e) => e,
        };
        let written = matches!(e, crate::audit::AuditError::Anchor { .. });
        let what = if written { "anchor" } else { "trail" };
        tracing::error!(error = %e, "the audit {what} cannot be written; engaging the kill switch");
        if written {
            self.release_held();
        } else {
            for (reply, response) in std::mem::take(&mut self.held.api) {
                let _ = reply.send(not_durable(response));
            }
            self.held.workers.clear();
            self.held.acks.clear();
        }
        match &mut self.held.audit_failure {
            None => {
                self.held.audit_failure = Some(AuditFailure {
                    since_ms: self.effects.now_ms(),
                    what,
                    error: crate::text::clip(&e.to_string(), 300).into_owned(),
                    noted: false,
                })
            }
            // A release whose entry is on disk took effect (only the anchor failed), and
            // the switch engages again: that is recorded again too.
            Some(f) if written && !self.store.kill_switch_engaged() => f.noted = false,
            Some(_) => {}
        }
        self.engage_local_kill_switch();
        self.kill_all_directly();
        let _ = self.send_launcher(&LauncherRequest::KillAll, None);
        // No launch is left in the queue: the kills go out now.
        self.write_launcher_queue();
        false
    }

    /// Lets out what the batch held: the API's answers, workers' replies, the cluster's
    /// acknowledgements.
    fn release_held(&mut self) {
        for (reply, response) in std::mem::take(&mut self.held.api) {
            let _ = reply.send(response);
        }
        for (id, reply) in std::mem::take(&mut self.held.workers) {
            self.deliver_worker(&id, reply);
        }
        let acks = std::mem::take(&mut self.held.acks);
        if let Some(c) = &mut self.cluster {
            for (revision, killed, ms) in acks {
                c.ack(revision, killed, ms);
            }
        }
    }

    /// Ends a batch: makes its decisions durable, then lets out what it held and writes
    /// the launcher's queue. (When the sync fails, `sync_trail` has already answered.)
    pub fn commit(&mut self) {
        // Delivering to a worker can decide again (one that does not read its replies is
        // stopped, and that is recorded): a second round makes that durable too.
        for _ in 0..2 {
            if self.held.holding() && !self.sync_trail() {
                break;
            }
            self.release_held();
            if !self.held.must_sync {
                break;
            }
        }
        self.flush_launcher();
    }
}
