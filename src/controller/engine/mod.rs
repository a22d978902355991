//! The controller's engine. One thread owns the registry, the admission store, the signer,
//! the contract and the audit trail, and handles one [`Input`] at a time: every decision is
//! taken in a well-defined order and written to the audit trail (and synced, for security
//! decisions) before it takes effect. The async side only moves bytes.
//!
//! The decisions themselves (admission, registration, reaping) are pure functions in
//! `super::admission`; the files here carry them out: `admit` (starting workers),
//! `approvals`, `worker` (worker messages), `api`, `kill` (kill and the kill switch),
//! `launcher` (its reports and exits) and `tick` (periodic checks). Everything they do
//! outside the engine's memory goes through `effects` (the clock, the launcher, worker
//! connections, timers, the audit trail) and the admission store, so the unit tests
//! drive the whole engine with fakes of both.

mod admit;
mod api;
mod approvals;
mod cluster;
mod commit;
mod effects;
mod kill;
mod launcher;
mod tick;
mod worker;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::oneshot;

use crate::audit::event;
use crate::contract::ReplicationContract;
use crate::manifest::{Manifest, WorkerId};
use crate::signing::ManifestSigner;

use super::admission::AdmissionStore;
use super::audit_budget::AuditBudgets;
use super::bounded;
use super::input::Input;
use super::launcher::{LauncherRequest, LiveUsage};
use super::protocol::{ApiResponse, PendingApproval, WorkerFrame, WorkerReply};
use super::registry::Registry;
use super::server;

pub use effects::{Effects, HostEffects, Trail};
use kill::Waiter;

/// An input handled for longer than this is logged.
const SLOW_INPUT: Duration = Duration::from_millis(30);

/// Fixed settings of one controller run.
pub struct EngineConfig {
    pub state_dir: PathBuf,
    /// The state directory's `workers/`, held: worker logs are read through it (a
    /// worker's log is its output, so it is opened without following anything).
    pub workers: Option<crate::paths::Dir>,
    pub session: String,
    pub heartbeat_timeout: Duration,
    pub register_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub allow_degraded: bool,
    pub agent_binary: Option<PathBuf>,
    /// Launcher pid and start time: the owner part of every worker cgroup's name.
    pub cgroup_owner: String,
    /// Inside ids available for distinct worker ids (rootless with a subordinate range).
    pub distinct_ids: u32,
    /// A worker's output cap when its manifest sets none.
    pub worker_output_cap: u64,
    /// The controller's own files, which no worker is given.
    pub own_files: super::paths::OwnFiles,
}

/// At most one rate_limited / protocol_violation entry per worker per this many ms.
const NOISY_AUDIT_MS: u64 = 10_000;
/// Whether a noisy entry is due at `now` given (when the last was written, how many were
/// suppressed since): the first, then at most one per [`NOISY_AUDIT_MS`], with how many
/// were suppressed since the last one.
fn due((last, suppressed): &mut (u64, u64), now: u64) -> Option<u64> {
    if now.saturating_sub(*last) >= NOISY_AUDIT_MS {
        *last = now;
        Some(std::mem::take(suppressed))
    } else {
        *suppressed = suppressed.saturating_add(1);
        None
    }
}

/// Uids whose rejected connections are counted at once (see `rejections_due`).
const MAX_REJECTED_UIDS: usize = 1024;
/// What an audit entry adds to its details when written (seq, time, hashes, MAC).
const ENTRY_OVERHEAD: usize = 320;
/// How long a stopping controller waits for its launcher before killing it.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(5);

pub struct Engine {
    cfg: EngineConfig,
    contract: ReplicationContract,
    signer: ManifestSigner,
    audit: Box<dyn Trail>,
    registry: Registry,
    /// What admission decides on (active workers, cooldowns, spawn history, kill switch).
    store: Box<dyn AdmissionStore>,
    /// The clock, the launcher (requests queued, so that a launcher that stops reading
    /// never blocks this thread), worker connections and timers.
    effects: Box<dyn Effects>,
    launcher_alive: bool,
    pending_ps: Vec<oneshot::Sender<ApiResponse>>,
    /// The launcher's last usage figures (what `ps` shows when it does not answer in time).
    last_usage: Vec<(String, LiveUsage)>,
    waiters: Vec<Waiter>,
    shutdown_deadlines: Vec<(WorkerId, u64)>,
    /// Per worker and kind of noisy entry: when the last was written, how many since.
    noisy: std::collections::HashMap<(WorkerId, &'static str), (u64, u64)>,
    /// Per rejected uid: when its last `client_rejected` entry was written, how many since.
    rejected: std::collections::HashMap<u32, (u64, u64)>,
    /// How much of the trail each worker may still cause.
    audit_budgets: AuditBudgets,
    pending_approvals: std::collections::BTreeMap<String, PendingApproval>,
    /// The worker whose request is being handled, and the `call` that request named:
    /// echoed in the replies to it (see [`Engine::reply_worker`]).
    answering: Option<(WorkerId, Option<String>)>,
    /// The uid allowed to decide approvals (the controller's own; root always may).
    owner_uid: u32,
    next_slot: u32,
    shutting_down: bool,
    /// When a stopping controller stops waiting for its launcher.
    shutdown_deadline: Option<Instant>,
    /// This node's part of a cluster (`controller --cluster`), if it is one.
    cluster: Option<Box<dyn crate::controller::cluster::Cluster>>,
    /// The revision of the cluster's kill switch carried out here, while it is engaged.
    cluster_kill: Option<i64>,
    /// The last acknowledgement of the cluster's kill switch (revision, killed, ms): said
    /// again after a rejoin, whose new lease no longer holds the first.
    last_ack: Option<(i64, usize, u64)>,
    /// This node's own kill switch (an operator's, a trail that cannot be written, a
    /// shutdown): released only by this node, never by the cluster's release.
    local_kill: bool,
    /// When the audit head was last anchored in the cluster, and its sequence number.
    last_anchor: (u64, u64),
    /// Answers and launches waiting for the batch's decisions to be durable.
    held: commit::Held,
    /// Set when the engine is done; the server stops.
    pub finished: Option<oneshot::Sender<bool>>,
}

/// Decisions whose effect a failed sync undoes: the launch it would have made (the
/// queued launches are cancelled), the kill switch's release (it engages again). Their
/// entries are dropped with them and counted. Refusals stand whatever the trail, and
/// kills, exits, violations and the like happened: those entries are kept.
const UNDONE_WHEN_NOT_DURABLE: [&str; 3] = [
    event::REPLICATION_REQUESTED,
    event::APPROVAL_GRANTED,
    event::KILL_SWITCH_RELEASED,
];

impl Engine {
    /// This node's own kill switch: admission refuses until this node releases it.
    fn engage_local_kill_switch(&mut self) {
        self.local_kill = true;
        self.store.set_kill_switch(true);
    }

    /// The store's kill switch is engaged while this node's own or the cluster's is.
    fn settle_kill_switch(&mut self) {
        self.store
            .set_kill_switch(self.local_kill || self.cluster_kill.is_some());
    }

    /// Makes this engine one node of a cluster.
    pub fn with_cluster(mut self, cluster: Box<dyn crate::controller::cluster::Cluster>) -> Engine {
        self.cluster = Some(cluster);
        self
    }

    /// An engine deciding with `contract` on `store`, signing with `signer`, recording
    /// in `audit` and acting through `effects`; `finished` fires when it is done.
    pub fn new(
        cfg: EngineConfig,
        contract: ReplicationContract,
        signer: ManifestSigner,
        audit: Box<dyn Trail>,
        store: Box<dyn AdmissionStore>,
        effects: Box<dyn Effects>,
        finished: oneshot::Sender<bool>,
    ) -> Engine {
        Engine {
            cfg,
            contract,
            signer,
            audit,
            registry: Registry::default(),
            store,
            effects,
            launcher_alive: true,
            pending_ps: Vec::new(),
            last_usage: Vec::new(),
            waiters: Vec::new(),
            shutdown_deadlines: Vec::new(),
            noisy: Default::default(),
            rejected: Default::default(),
            audit_budgets: AuditBudgets::default(),
            pending_approvals: Default::default(),
            answering: None,
            owner_uid: nix::unistd::geteuid().as_raw(),
            next_slot: 0,
            shutting_down: false,
            shutdown_deadline: None,
            cluster: None,
            cluster_kill: None,
            local_kill: false,
            last_ack: None,
            last_anchor: (0, 0),
            held: commit::Held::default(),
            finished: Some(finished),
        }
    }

    /// The engine's clock in seconds (what the contract's cooldowns and budgets count).
    fn now_s(&self) -> u64 {
        self.effects.now_ms() / 1000
    }

    /// Appends an entry; `sync` (security decisions) makes it durable before anything the
    /// batch decided leaves the engine (see `commit`). Of those, the ones a failed sync
    /// undoes ([`UNDONE_WHEN_NOT_DURABLE`]) are dropped with it; every other entry records
    /// what happened, and the trail keeps it for the next sync.
    fn record(
        &mut self,
        ev: &str,
        actor: &str,
        worker: Option<&WorkerId>,
        details: serde_json::Value,
        sync: bool,
    ) {
        // Whatever a worker put in them, entries stay small (see `bounded`), and a worker
        // causes no more of them than its budget (see `audit_budget`).
        let details = bounded::bound_json(details);
        if let Some(cause) = actor
            .strip_prefix("worker:")
            .and_then(|w| WorkerId::new(w.to_string()).ok())
            .filter(|w| self.speaks_for_live_worker(w))
        {
            let bytes = serde_json::to_string(&details)
                .map_or(0, |d| d.len())
                .saturating_add(ev.len())
                .saturating_add(ENTRY_OVERHEAD);
            if !self
                .audit_budgets
                .charge(&cause, ev, bytes as u64, self.effects.now_ms())
            {
                return;
            }
        }
        // The kill switch a failed sync engaged, recorded before anything after it (kept
        // by the trail until it is written, like any record).
        if let Some(failure) = self.held.audit_failure.as_mut().filter(|f| !f.noted) {
            failure.noted = true;
            let details = failure.details();
            self.audit.append(
                event::KILL_SWITCH_ENGAGED,
                "controller",
                None,
                details,
                false,
            );
            self.held.must_sync = true;
        }
        let decision = sync && UNDONE_WHEN_NOT_DURABLE.contains(&ev);
        self.audit
            .append(ev, actor, worker.map(|w| w.as_str()), details, decision);
        if sync {
            self.held.must_sync = true;
        }
    }

    /// Says how many entries a worker caused beyond its audit budget, by event.
    fn record_suppressed(
        &mut self,
        id: &WorkerId,
        counts: std::collections::BTreeMap<String, u64>,
    ) {
        let total: u64 = counts.values().fold(0, |a, n| a.saturating_add(*n));
        self.record(
            event::AUDIT_SUPPRESSED,
            "controller",
            Some(id),
            json!({ "entries": total, "by_event": counts }),
            false,
        );
    }

    /// The manifest issued to `id` (for the fuzzing harness, which registers with it).
    pub(crate) fn issued_manifest(&self, id: &WorkerId) -> Option<Manifest> {
        self.registry.get(id).map(|w| w.manifest.clone())
    }

    /// Every worker the registry knows.
    pub(crate) fn worker_ids(&self) -> Vec<WorkerId> {
        self.registry.all().map(|(id, _)| id.clone()).collect()
    }

    /// Takes one input as a batch of its own (see [`Engine::take`] and [`Engine::commit`]).
    pub fn handle(&mut self, input: Input) {
        self.take(input);
        self.commit();
    }

    /// Decides one input of a batch; what it decided leaves the engine at
    /// [`Engine::commit`] (at once, when nothing in the batch needs a sync).
    pub fn take(&mut self, input: Input) {
        let began = Instant::now();
        let kind = input.kind();
        self.flush_launcher();
        self.dispatch(input);
        // Everything waits while one input is handled: a slow one is worth seeing.
        let took = began.elapsed();
        if took > SLOW_INPUT {
            tracing::warn!(
                input = kind,
                ms = took.as_millis() as u64,
                "the engine was slow"
            );
        }
    }

    fn dispatch(&mut self, input: Input) {
        match input {
            Input::Api {
                peer_uid,
                request,
                reply,
            } => self.api(peer_uid, *request, reply),
            Input::Worker { id, message, .. } => self.worker(id, message),
            Input::WorkerProtocolError {
                id, error, call, ..
            } => {
                if !self.speaks_for_live_worker(&id) {
                    return;
                }
                // The parser's message may quote the input: keep a bounded part of it.
                let error = bounded::clip(&error, 256);
                if let Some(suppressed) = self.noisy_ok(&id, "protocol") {
                    self.record(
                        event::PROTOCOL_VIOLATION,
                        &format!("worker:{id}"),
                        Some(&id),
                        json!({ "error": error, "suppressed_since_last": suppressed }),
                        false,
                    );
                }
                self.answer_worker(&id, call, WorkerReply::error(error));
            }
            Input::WorkerNotReading { id } => {
                if self.speaks_for_live_worker(&id) {
                    self.not_reading(&id);
                }
            }
            Input::WorkerRateLimited { id, dropped } => {
                if !self.speaks_for_live_worker(&id) {
                    return;
                }
                if self.noisy_ok(&id, "rate").is_some() {
                    self.record(
                        event::RATE_LIMITED,
                        &format!("worker:{id}"),
                        Some(&id),
                        json!({ "dropped_messages": dropped }),
                        false,
                    );
                }
            }
            Input::WorkerDisconnected { id } => {
                if let Some(w) = self.registry.get_mut(&id) {
                    w.conn = None;
                }
            }
            Input::ClientRejected { uid, pid } => {
                // Anyone who can reach the socket can be rejected as often as they like:
                // one entry per uid per NOISY_AUDIT_MS, with how many were not written.
                if let Some(suppressed) = self.rejections_due(uid) {
                    self.record(
                        event::CLIENT_REJECTED,
                        &format!("uid:{uid}"),
                        None,
                        json!({ "pid": pid, "suppressed_since_last": suppressed }),
                        false,
                    );
                }
            }
            Input::Launcher(ev) => self.launcher_event(ev),
            Input::LauncherGone => {
                self.launcher_alive = false;
                // Every sandbox died with the launcher (parent-death signals), and each
                // end is recorded: before, the trail named none of them, and its
                // `controller_stopped` said no worker was active.
                let ids: Vec<WorkerId> = self.registry.active().map(|(id, _)| id.clone()).collect();
                self.egress_lost_with_launcher(&ids);
                for id in ids {
                    self.exit_confirmed(&id, Some("launcher exited".into()), Some(9));
                }
                if !self.shutting_down {
                    tracing::error!("the launcher exited unexpectedly; stopping the controller");
                }
                self.finish();
            }
            Input::Tick => self.tick(),
            Input::PsDeadline => self.answer_ps(),
            Input::ClusterLease {
                fence_at_ms,
                rejoined,
            } => self.cluster_lease(fence_at_ms, rejoined),
            Input::ClusterFenced { reason } => self.cluster_fenced(&reason),
            Input::ClusterKillSwitch { engaged, revision } => {
                self.cluster_kill_switch(engaged, revision)
            }
            Input::ClusterKill { request } => self.cluster_kill(request),
            Input::Shutdown => {
                if self.shutting_down {
                    return;
                }
                self.shutting_down = true;
                self.engage_local_kill_switch();
                self.kill_all_directly();
                if self
                    .send_launcher(&LauncherRequest::Shutdown, None)
                    .is_err()
                {
                    self.stop_launcher();
                    self.finish();
                } else {
                    self.shutdown_deadline = self.effects.instant().checked_add(SHUTDOWN_LIMIT);
                }
            }
        }
    }

    fn finish(&mut self) {
        for reply in std::mem::take(&mut self.pending_ps) {
            self.answer(
                reply,
                ApiResponse::Error {
                    message: "the controller is stopping".into(),
                },
            );
        }
        for w in std::mem::take(&mut self.waiters) {
            self.answer(
                w.reply,
                ApiResponse::Error {
                    message: "the controller is stopping".into(),
                },
            );
        }
        let active = self.registry.active().count();
        self.record(
            event::CONTROLLER_STOPPED,
            "controller",
            None,
            json!({ "session": self.cfg.session, "active_workers": active }),
            true,
        );
        // Durable before the server is told the engine is done.
        self.commit();
        // Leaving the cluster frees this node's slots at once (its workers are gone).
        if let Some(c) = &mut self.cluster {
            c.leave();
        }
        if let Some(done) = self.finished.take() {
            // Whether the trail holds everything: if not, the session did not end cleanly.
            let _ = done.send(self.audit.complete());
        }
    }

    /// Whether a `client_rejected` entry for `uid` is due (see [`due`]). The table is
    /// bounded: past [`MAX_REJECTED_UIDS`] uids it starts again.
    fn rejections_due(&mut self, uid: u32) -> Option<u64> {
        if self.rejected.len() >= MAX_REJECTED_UIDS && !self.rejected.contains_key(&uid) {
            self.rejected.clear();
        }
        due(self.rejected.entry(uid).or_default(), self.effects.now_ms())
    }

    /// Whether an entry of `kind` for worker `id` is due (see [`due`]).
    fn noisy_ok(&mut self, id: &WorkerId, kind: &'static str) -> Option<u64> {
        let now = self.effects.now_ms();
        due(self.noisy.entry((id.clone(), kind)).or_default(), now)
    }

    /// Hands a reply to a worker's connection. A worker whose queue is full does not read
    /// what it is sent: it is disconnected and stopped (its replies would otherwise pile
    /// up in the controller without bound).
    fn deliver_worker(&mut self, id: &WorkerId, reply: WorkerFrame) {
        let Some(conn) = self.registry.get(id).and_then(|w| w.conn.as_ref()) else {
            return;
        };
        if let Err(tokio::sync::mpsc::error::TrySendError::Full(_)) = conn.try_send(reply) {
            self.not_reading(id);
        }
    }

    /// Stops a worker that does not read its replies (its queue is full), recording why.
    fn not_reading(&mut self, id: &WorkerId) {
        self.record(
            event::PROTOCOL_VIOLATION,
            &format!("worker:{id}"),
            Some(id),
            json!({ "error": format!("it did not read its replies ({} waiting)", server::REPLY_QUEUE) }),
            true,
        );
        self.stop(id, "did not read its replies");
    }
}

#[cfg(test)]
mod tests;
