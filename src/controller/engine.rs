//! The controller's decision core. One thread owns the registry, the signer, the contract
//! and the audit trail, and handles one [`Input`] at a time: every decision is taken in a
//! well-defined order and written to the audit trail (and synced, for security decisions)
//! before it takes effect. The async side only moves bytes.

use std::collections::BTreeSet;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::Digest;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::audit::{self, AuditLog, event};
use crate::contract::approval::ApprovalVerdict;
use crate::contract::{Decision, DenyReason, RegistryView, ReplicationContract};
use crate::manifest::{Lineage, Manifest, SpawnRequest, StateSnapshot, WorkerId};
use crate::sandbox::handle::KillHandle;
use crate::signing::ManifestSigner;

use super::admission::{
    self, Admission, AdmissionStore, Candidate, ChildDecision, ChildRequest, InMemoryStore,
    Registration, Requester,
};
use super::audit_budget::AuditBudgets;
use super::bounded;
use super::input::Input;
use super::launch_protocol::WorkerPlacement;
use super::launcher::{LaunchSpec, LauncherEvent, LauncherRequest, LiveUsage};
use super::link::{LinkError, Outbox};
use super::protocol::{
    ApiRequest, ApiResponse, ExitInfo, MAX_TEXT_BYTES, PendingApproval, ReplicateMsg,
    WorkerMessage, WorkerReply,
};
use super::registry::{Registry, WorkerRecord, WorkerState};
use super::server;

/// An input handled for longer than this is logged.
const SLOW_INPUT: Duration = Duration::from_millis(30);

/// Fixed settings of one controller run.
pub struct EngineConfig {
    pub state_dir: PathBuf,
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
    /// The launcher, killed if it does not stop within `SHUTDOWN_LIMIT` of being asked.
    pub launcher_pid: nix::unistd::Pid,
    /// A worker's output cap when its manifest sets none.
    pub worker_output_cap: u64,
}

enum WaitKind {
    Kill,
    KillSwitch,
}

struct Waiter {
    ids: BTreeSet<WorkerId>,
    killed: Vec<WorkerId>,
    kind: WaitKind,
    reply: oneshot::Sender<ApiResponse>,
    started: Instant,
}

/// The longest `ps` waits for the launcher's usage figures.
const PS_WAIT: Duration = Duration::from_millis(40);
/// How long `kill` and `kill-switch` wait for the launcher to confirm every exit.
const WAIT_LIMIT: Duration = Duration::from_secs(30);
/// Grace after a worker's own `shutdown` before it is killed.
const SHUTDOWN_GRACE_MS: u64 = 5000;
/// At most one rate_limited / protocol_violation entry per worker per this many ms.
const NOISY_AUDIT_MS: u64 = 10_000;
/// How long a sandbox the controller's own handle shows gone may wait for the launcher's
/// report (with its accounting) before the controller records the exit itself.
const UNREPORTED_EXIT_GRACE_MS: u64 = 2000;
/// Past a worker's timeout, how long the launcher has to enforce it before the controller
/// does.
const TIMEOUT_GRACE_MS: u64 = 2000;
/// What an audit entry adds to its details when written (seq, time, hashes, MAC).
const ENTRY_OVERHEAD: usize = 320;
/// The controller's send buffer on a worker's socket (the kernel doubles it).
const WORKER_SNDBUF: usize = 16 << 10;
/// How long a stopping controller waits for its launcher before killing it.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(5);

pub struct Engine {
    cfg: EngineConfig,
    contract: ReplicationContract,
    signer: ManifestSigner,
    audit: AuditLog,
    registry: Registry,
    /// What admission decides on (active workers, cooldowns, spawn history, kill switch).
    store: InMemoryStore,
    /// Requests to the launcher, queued so that a launcher that stops reading never
    /// blocks this thread.
    launcher: Outbox,
    launcher_alive: bool,
    rt: Handle,
    inputs: Sender<Input>,
    pending_ps: Vec<oneshot::Sender<ApiResponse>>,
    /// The launcher's last usage figures (what `ps` shows when it does not answer in time).
    last_usage: Vec<(String, LiveUsage)>,
    waiters: Vec<Waiter>,
    shutdown_deadlines: Vec<(WorkerId, u64)>,
    /// Per worker and kind of noisy entry: when the last was written, how many since.
    noisy: std::collections::HashMap<(WorkerId, &'static str), (u64, u64)>,
    /// How much of the trail each worker may still cause.
    audit_budgets: AuditBudgets,
    pending_approvals: std::collections::BTreeMap<String, PendingApproval>,
    /// The uid allowed to decide approvals (the controller's own; root always may).
    owner_uid: u32,
    next_slot: u32,
    shutting_down: bool,
    /// When a stopping controller stops waiting for its launcher.
    shutdown_deadline: Option<Instant>,
    /// Set when the engine is done; the server stops.
    pub finished: Option<oneshot::Sender<()>>,
}

pub fn now_s() -> u64 {
    audit::now_ms() / 1000
}

/// Most log bytes one `logs` answer carries.
const LOG_CHUNK: usize = 64 * 1024;

/// Up to [`LOG_CHUNK`] bytes of a worker's log from `offset`, as text, and the offset after
/// them. A character cut by the end of what is written so far is left for the next read
/// (unless the worker has ended); bytes that are not UTF-8 are replaced.
fn read_log(
    state_dir: &std::path::Path,
    id: &WorkerId,
    offset: u64,
    ended: bool,
) -> Result<(String, u64), String> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    let path = state_dir.join("workers").join(format!("{id}.log"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path);
    let mut file = match file {
        Ok(f) => f,
        // A worker that could not start may have no log.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((String::new(), offset)),
        Err(e) => return Err(format!("cannot read the log {}: {e}", path.display())),
    };
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("cannot read the log {}: {e}", path.display()))?;
    let mut buf = Vec::with_capacity(LOG_CHUNK);
    file.take(LOG_CHUNK as u64)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read the log {}: {e}", path.display()))?;
    let used = match std::str::from_utf8(&buf) {
        Ok(_) => buf.len(),
        // Only the end is cut short: keep it for the next read.
        Err(e) if e.error_len().is_none() && !ended => e.valid_up_to(),
        Err(_) => buf.len(),
    };
    let text = String::from_utf8_lossy(buf.get(..used).unwrap_or_default()).into_owned();
    Ok((text, offset.saturating_add(used as u64)))
}

fn new_worker_id() -> Result<WorkerId, String> {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).map_err(|e| format!("random source: {e}"))?;
    WorkerId::new(format!("w-{}", hex::encode(b))).map_err(|e| e.to_string())
}

fn deny_details(reason: &DenyReason) -> serde_json::Value {
    json!({ "reason": reason.to_string() })
}

/// The API's answer to a request to start a worker.
fn api_answer(outcome: Admission) -> ApiResponse {
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
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: EngineConfig,
        contract: ReplicationContract,
        signer: ManifestSigner,
        audit: AuditLog,
        launcher: Outbox,
        rt: Handle,
        inputs: Sender<Input>,
        finished: oneshot::Sender<()>,
    ) -> Engine {
        Engine {
            cfg,
            contract,
            signer,
            audit,
            registry: Registry::default(),
            store: InMemoryStore::default(),
            launcher,
            launcher_alive: true,
            rt,
            inputs,
            pending_ps: Vec::new(),
            last_usage: Vec::new(),
            waiters: Vec::new(),
            shutdown_deadlines: Vec::new(),
            noisy: Default::default(),
            audit_budgets: AuditBudgets::default(),
            pending_approvals: Default::default(),
            owner_uid: nix::unistd::geteuid().as_raw(),
            next_slot: 0,
            shutting_down: false,
            shutdown_deadline: None,
            finished: Some(finished),
        }
    }

    /// Appends an entry; `sync` makes it durable before returning (security decisions).
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
                .charge(&cause, ev, bytes as u64, audit::now_ms())
            {
                return;
            }
        }
        self.audit
            .append(ev, actor, worker.map(|w| w.as_str()), details);
        if sync {
            if let Err(e) = self.audit.sync() {
                // Without a durable trail no decision may take effect: stop everything.
                tracing::error!(error = %e, "the audit trail cannot be written; engaging the kill switch");
                self.store.set_kill_switch(true);
                self.kill_all_directly();
                let _ = self.send_launcher(&LauncherRequest::KillAll, None);
            }
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

    /// Kills a worker's sandbox through the controller's own handle: never waits on the
    /// launcher (which is asked as well, for its accounting).
    fn kill_directly(&self, id: &WorkerId) {
        if let Some(h) = self.registry.get(id).and_then(|w| w.handle.as_ref()) {
            h.kill();
        }
    }

    /// Kills every sandbox through the controller's own handles, and cancels every launch
    /// the launcher has not begun to read: nothing starts after this.
    fn kill_all_directly(&mut self) {
        for (_, w) in self.registry.active() {
            if let Some(h) = &w.handle {
                h.kill();
            }
        }
        for worker_id in self.launcher.cancel_launches() {
            let Ok(id) = WorkerId::new(worker_id) else {
                continue;
            };
            self.record(
                event::WORKER_START_FAILED,
                "controller",
                Some(&id),
                json!({ "error": "its launch was cancelled before the launcher read it" }),
                false,
            );
            self.exited(
                &id,
                ExitInfo {
                    exit_code: 125,
                    signal: None,
                    oom_killed: false,
                    timed_out: false,
                    ended_by: Some("the kill switch cancelled its launch".into()),
                },
            );
        }
    }

    /// Queues a request for the launcher (never blocking). An error says why it cannot go:
    /// the launcher is gone or not taking requests, or the request is too large.
    fn send_launcher(
        &mut self,
        req: &LauncherRequest,
        fd: Option<std::os::fd::OwnedFd>,
    ) -> Result<(), String> {
        if !self.launcher_alive {
            return Err("the launcher is not running".into());
        }
        match self.launcher.push(req, fd) {
            Ok(()) => Ok(()),
            Err(LinkError::Gone(e)) => {
                tracing::error!(error = %e, "the launcher is gone");
                self.launcher_alive = false;
                Err("the launcher is not running".into())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// Writes what the launcher will take of the queued requests.
    fn flush_launcher(&mut self) {
        if self.launcher_alive {
            if let Err(LinkError::Gone(e)) = self.launcher.flush() {
                tracing::error!(error = %e, "the launcher is gone");
                self.launcher_alive = false;
            }
        }
    }

    /// Takes one input; queued launcher requests go out before and after it.
    pub fn handle(&mut self, input: Input) {
        let began = Instant::now();
        let kind = input.kind();
        self.flush_launcher();
        self.dispatch(input);
        self.flush_launcher();
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
            Input::WorkerProtocolError { id, error, .. } => {
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
                self.reply_worker(&id, WorkerReply::Error { message: error });
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
                self.record(
                    event::CLIENT_REJECTED,
                    &format!("uid:{uid}"),
                    None,
                    json!({ "pid": pid }),
                    false,
                );
            }
            Input::Launcher(ev) => self.launcher_event(ev),
            Input::LauncherGone => {
                self.launcher_alive = false;
                // Every sandbox died with the launcher (parent-death signals).
                let ids: Vec<WorkerId> = self.registry.active().map(|(id, _)| id.clone()).collect();
                for id in ids {
                    self.exited(
                        &id,
                        ExitInfo {
                            exit_code: 137,
                            signal: Some(9),
                            oom_killed: false,
                            timed_out: false,
                            ended_by: Some("launcher exited".into()),
                        },
                    );
                }
                if !self.shutting_down {
                    tracing::error!("the launcher exited unexpectedly; stopping the controller");
                }
                self.finish();
            }
            Input::Tick => self.tick(),
            Input::PsDeadline => self.answer_ps(),
            Input::Shutdown => {
                if self.shutting_down {
                    return;
                }
                self.shutting_down = true;
                self.store.set_kill_switch(true);
                self.kill_all_directly();
                if self
                    .send_launcher(&LauncherRequest::Shutdown, None)
                    .is_err()
                {
                    self.stop_launcher();
                    self.finish();
                } else {
                    self.shutdown_deadline = Instant::now().checked_add(SHUTDOWN_LIMIT);
                }
            }
        }
    }

    /// Kills the launcher (it did not stop when asked, or cannot be asked). Its sandboxes
    /// die with it (parent-death signals) and were killed through the controller's own
    /// handles already; its cgroups are swept once it is reaped.
    fn stop_launcher(&mut self) {
        if self.launcher_alive {
            tracing::error!("the launcher did not stop; killing it");
        }
        let _ = nix::sys::signal::kill(self.cfg.launcher_pid, nix::sys::signal::Signal::SIGKILL);
        self.launcher_alive = false;
    }

    fn finish(&mut self) {
        for reply in self.pending_ps.drain(..) {
            let _ = reply.send(ApiResponse::Error {
                message: "the controller is stopping".into(),
            });
        }
        for w in self.waiters.drain(..) {
            let _ = w.reply.send(ApiResponse::Error {
                message: "the controller is stopping".into(),
            });
        }
        let active = self.registry.active().count();
        self.record(
            event::CONTROLLER_STOPPED,
            "controller",
            None,
            json!({ "session": self.cfg.session, "active_workers": active }),
            true,
        );
        if let Some(done) = self.finished.take() {
            let _ = done.send(());
        }
    }

    /// Whether an entry of `kind` for worker `id` is due (the first, then at most one per
    /// [`NOISY_AUDIT_MS`]), with how many were suppressed since the last one.
    fn noisy_ok(&mut self, id: &WorkerId, kind: &'static str) -> Option<u64> {
        let now = audit::now_ms();
        let (last, suppressed) = self.noisy.entry((id.clone(), kind)).or_insert((0, 0));
        if now.saturating_sub(*last) >= NOISY_AUDIT_MS {
            *last = now;
            Some(std::mem::take(suppressed))
        } else {
            *suppressed = suppressed.saturating_add(1);
            None
        }
    }

    /// Queues a reply for a worker. A worker whose queue is full does not read what it is
    /// sent: it is disconnected and stopped (its replies would otherwise pile up in the
    /// controller without bound).
    fn reply_worker(&mut self, id: &WorkerId, reply: WorkerReply) {
        let Some(conn) = self.registry.get(id).and_then(|w| w.conn.as_ref()) else {
            return;
        };
        if let Err(tokio::sync::mpsc::error::TrySendError::Full(_)) = conn.try_send(reply) {
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

    // ------------------------------------------------------------------ API requests

    fn api(&mut self, uid: u32, request: ApiRequest, reply: oneshot::Sender<ApiResponse>) {
        let actor = format!("uid:{uid}");
        match request {
            ApiRequest::Spawn { parent, request } => {
                let outcome = match parent {
                    None => self.spawn_root(*request, &actor),
                    Some(p) => self.spawn_child(&p, *request, &actor, None),
                };
                let _ = reply.send(api_answer(outcome));
            }
            ApiRequest::Ps(_) => {
                // Fresh usage if the launcher answers soon, else the last it gave: `ps`
                // never waits on the launcher for longer than PS_WAIT.
                if self.launcher_alive && self.send_launcher(&LauncherRequest::Usage, None).is_ok()
                {
                    if self.pending_ps.is_empty() {
                        let inputs = self.inputs.clone();
                        self.rt.spawn(async move {
                            tokio::time::sleep(PS_WAIT).await;
                            let _ = inputs.send(Input::PsDeadline);
                        });
                    }
                    self.pending_ps.push(reply);
                } else {
                    let _ = reply.send(self.ps(&self.last_usage));
                }
            }
            ApiRequest::Kill {
                worker_id,
                recursive,
            } => {
                let ids = if recursive {
                    self.registry.subtree(&worker_id)
                } else if self
                    .registry
                    .get(&worker_id)
                    .is_some_and(|w| w.state.is_active())
                {
                    vec![worker_id.clone()]
                } else {
                    Vec::new()
                };
                if ids.is_empty() {
                    let _ = reply.send(ApiResponse::Error {
                        message: format!("no running worker {worker_id}"),
                    });
                    return;
                }
                for id in &ids {
                    self.record(
                        event::WORKER_KILLED,
                        &actor,
                        Some(id),
                        json!({ "recursive": recursive }),
                        false,
                    );
                    self.stop(id, &format!("killed by {actor}"));
                }
                let _ = self.audit.sync();
                self.wait_for(ids, WaitKind::Kill, reply);
            }
            ApiRequest::KillSwitch { release: false } => {
                let ids: Vec<WorkerId> = self.registry.active().map(|(id, _)| id.clone()).collect();
                self.store.set_kill_switch(true);
                // Durable before it takes effect.
                self.record(
                    event::KILL_SWITCH_ENGAGED,
                    &actor,
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
                self.wait_for(ids, WaitKind::KillSwitch, reply);
            }
            ApiRequest::KillSwitch { release: true } => {
                self.store.set_kill_switch(false);
                self.record(event::KILL_SWITCH_RELEASED, &actor, None, json!({}), true);
                let _ = reply.send(ApiResponse::KillSwitch {
                    engaged: false,
                    killed: 0,
                    elapsed_ms: 0,
                });
            }
            ApiRequest::Approvals(_) => {
                let pending = self.pending_approvals.values().cloned().collect();
                let _ = reply.send(ApiResponse::Approvals { pending });
            }
            ApiRequest::Approve { approval_id } => {
                let _ = reply.send(self.decide(&approval_id, uid, None));
            }
            ApiRequest::Deny {
                approval_id,
                reason,
            } => {
                let _ = reply.send(self.decide(&approval_id, uid, Some(reason)));
            }
            ApiRequest::Inspect { worker_id } => {
                let now = audit::now_ms();
                let resp = match self.registry.get(&worker_id) {
                    Some(w) => {
                        let mut info = self.registry.info(&worker_id, w, now);
                        if let Some((_, u)) = self
                            .last_usage
                            .iter()
                            .find(|(u, _)| u == worker_id.as_str())
                        {
                            info.usage = Some(u.clone());
                        }
                        ApiResponse::Worker {
                            info: Box::new(info),
                            manifest: Box::new(w.manifest.clone()),
                        }
                    }
                    None => ApiResponse::Error {
                        message: format!("no worker {worker_id} (`hatchery ps --all` lists them)"),
                    },
                };
                let _ = reply.send(resp);
            }
            ApiRequest::Logs { worker_id, offset } => {
                let resp = match self.registry.get(&worker_id) {
                    // Whether it ended is asked before the log is read: a log read after
                    // the end holds everything the worker wrote.
                    Some(w) => {
                        let ended = !w.state.is_active();
                        match read_log(&self.cfg.state_dir, &worker_id, offset, ended) {
                            Ok((data, next_offset)) => ApiResponse::Log {
                                data,
                                next_offset,
                                ended,
                            },
                            Err(message) => ApiResponse::Error { message },
                        }
                    }
                    None => ApiResponse::Error {
                        message: format!("no worker {worker_id} (`hatchery ps --all` lists them)"),
                    },
                };
                let _ = reply.send(resp);
            }
            ApiRequest::Status(_) => {
                let _ = reply.send(ApiResponse::Status {
                    pid: std::process::id(),
                    session: self.cfg.session.clone(),
                    kill_switch: self.store.kill_switch_engaged(),
                    active: self.registry.active().count() as u64,
                    lifetime_total: self.store.lifetime_total(),
                    audit_entries: self.audit.len(),
                });
            }
        }
    }

    fn wait_for(
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
            started: Instant::now(),
        };
        self.waiters.push(waiter);
        self.settle_waiters();
    }

    fn settle_waiters(&mut self) {
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
                    }
                };
                let _ = w.reply.send(resp);
            }
        }
    }

    /// Ends a worker: the controller kills its whole sandbox through its own handle, and
    /// asks the launcher to (which reports the exit with its accounting).
    fn stop(&mut self, id: &WorkerId, why: &str) {
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

    /// Answers every waiting `ps` with the usage figures at hand.
    fn answer_ps(&mut self) {
        if self.pending_ps.is_empty() {
            return;
        }
        let resp = self.ps(&self.last_usage);
        for reply in self.pending_ps.drain(..) {
            let _ = reply.send(resp.clone());
        }
    }

    fn ps(&self, usage: &[(String, LiveUsage)]) -> ApiResponse {
        let now = audit::now_ms();
        let workers = self
            .registry
            .all()
            .map(|(id, w)| {
                let mut info = self.registry.info(id, w, now);
                if let Some((_, u)) = usage.iter().find(|(u, _)| u == id.as_str()) {
                    info.usage = Some(u.clone());
                }
                info
            })
            .collect();
        ApiResponse::Workers {
            workers,
            kill_switch: self.store.kill_switch_engaged(),
        }
    }

    // ------------------------------------------------------------- issuing manifests

    fn deny(
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

    fn spawn_root(&mut self, mut request: SpawnRequest, actor: &str) -> Admission {
        let now = now_s();
        // A root without a cap gets the controller's, in its signed manifest: its
        // children are then narrowed to it like to any other grant.
        if request.resources.max_output_bytes.is_none() {
            request.resources.max_output_bytes =
                crate::manifest::OutputBytes::new(self.cfg.worker_output_cap).ok();
        }
        if let Err(e) = request.validate() {
            return self.deny(actor, None, &DenyReason::InvalidRequest(e), json!({}));
        }
        if let Some(reason) = admission::unsupported(&request) {
            return self.deny(actor, None, &reason, json!({ "parent": null }));
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
        if let Decision::Deny(reason) = self.contract.admit(&manifest, &self.store, now) {
            return self.deny(actor, None, &reason, json!({ "parent": null }));
        }
        self.record(
            event::REPLICATION_REQUESTED,
            actor,
            Some(&id),
            json!({ "parent": null, "depth": 0 }),
            true,
        );
        self.launch(manifest, now)
    }

    /// Issues a child of `parent` (asked by a person through the API, or by the parent
    /// itself through `replicate`) and launches it.
    fn spawn_child(
        &mut self,
        parent: &WorkerId,
        request: SpawnRequest,
        actor: &str,
        reason: Option<&str>,
    ) -> Admission {
        let now = now_s();
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
        let id = match new_worker_id() {
            Ok(id) => id,
            Err(message) => return Admission::Failed(message),
        };
        let extra = json!({ "parent": parent.as_str(), "why": reason });
        // A person asked through the API is the approver; a worker's own request goes
        // through the approval rules.
        let requester = match reason {
            Some(_) => Requester::Parent,
            None => Requester::Person,
        };
        let asked = ChildRequest {
            parent: &parent_manifest,
            request,
            child_id: id.clone(),
            requester,
        };
        let (manifest, approval) =
            match admission::decide_child(&self.contract, &self.signer, &self.store, asked, now) {
                ChildDecision::Issued { manifest, approval } => (*manifest, approval),
                ChildDecision::Denied(r) => return self.deny(actor, Some(parent), &r, extra),
                ChildDecision::Failed(message) => return Admission::Failed(message),
            };
        let depth = manifest.depth.get();
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
            ApprovalVerdict::Needed { reasons } => {
                return self.hold_for_approval(parent, manifest, reasons, reason.unwrap_or(""));
            }
        }
        self.record(
            event::REPLICATION_REQUESTED,
            actor,
            Some(&id),
            json!({ "parent": parent.as_str(), "depth": depth, "why": reason }),
            true,
        );
        self.launch(manifest, now)
    }

    /// Queues an allowed request for a person: the child's manifest is issued and signed
    /// now, and exactly that manifest starts if it is approved.
    fn hold_for_approval(
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
        let now_ms = audit::now_ms();
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
    fn decide(&mut self, approval_id: &str, uid: u32, deny_reason: Option<String>) -> ApiResponse {
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
        if uid != 0 && uid != self.owner_uid {
            return refuse(
                self,
                format!("uid {uid} may not decide approvals (only the controller's owner or root)"),
            );
        }
        let Some(p) = self.pending_approvals.remove(approval_id) else {
            return refuse(
                self,
                format!("no pending approval {approval_id} (unknown, or already decided)"),
            );
        };
        let parent = p.requested_by.clone();
        let child = p.manifest.worker_id.clone();
        if let Some(w) = self.registry.get_mut(&parent) {
            w.awaiting_approval = false;
            w.last_heartbeat_ms = Some(audit::now_ms());
        }
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
                },
            );
            return ApiResponse::Decided {
                approval_id: approval_id.to_string(),
                approved: false,
                child_id: None,
            };
        }
        let now = now_s();
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
        let candidate = match &parent_manifest {
            Some(parent) => Candidate::Child {
                parent,
                manifest: &p.manifest,
            },
            None => Candidate::Root(&p.manifest),
        };
        let recheck = candidate.check(&self.contract, &self.store, now);
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
                },
            );
            return ApiResponse::Denied {
                event: r.audit_event().into(),
                reason: r.to_string(),
            };
        }
        self.record(
            event::APPROVAL_GRANTED,
            &actor,
            Some(&child),
            json!({ "approval_id": approval_id }),
            true,
        );
        let depth = p.manifest.depth.get();
        self.record(
            event::REPLICATION_REQUESTED,
            &format!("worker:{parent}"),
            Some(&child),
            json!({ "parent": parent.as_str(), "depth": depth, "why": p.why, "approval_id": approval_id }),
            true,
        );
        match self.launch(*p.manifest, now) {
            Admission::Started { worker_id, depth } => {
                self.reply_worker(
                    &parent,
                    WorkerReply::Allowed {
                        child_id: worker_id.clone(),
                        depth,
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
                    },
                );
                api_answer(other)
            }
        }
    }

    fn expire_approvals(&mut self, now_ms: u64) {
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
            if let Some(w) = self.registry.get_mut(&p.requested_by) {
                w.awaiting_approval = false;
                w.last_heartbeat_ms = Some(now_ms);
            }
            self.reply_worker(
                &p.requested_by,
                WorkerReply::Denied {
                    event: event::APPROVAL_TIMEOUT.into(),
                    reason,
                },
            );
        }
    }

    fn launch(&mut self, manifest: Manifest, now: u64) -> Admission {
        let id = manifest.worker_id.clone();
        let parent = manifest.parent_id.clone();
        match self.try_launch(manifest, now) {
            Ok(depth) => Admission::Started {
                worker_id: id,
                depth,
            },
            Err(message) => {
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

    /// The welcome a worker with this manifest is sent, if it fits one frame.
    fn welcome_fits(&self, manifest: &Manifest) -> Result<WorkerReply, String> {
        let welcome = WorkerReply::Welcome {
            worker_id: manifest.worker_id.clone(),
            manifest: Box::new(manifest.clone()),
            heartbeat_interval_ms: u64::try_from(self.cfg.heartbeat_interval.as_millis())
                .unwrap_or(u64::MAX),
        };
        let welcome_size = serde_json::to_vec(&welcome).map_or(usize::MAX, |v| v.len());
        if welcome_size > super::wire::MAX_FRAME {
            return Err(format!(
                "the manifest makes a {welcome_size}-byte welcome; a worker could not receive it (frames are at most {} bytes): shorten the state snapshot, environment or command",
                super::wire::MAX_FRAME
            ));
        }
        Ok(welcome)
    }

    /// Hands a worker to the launcher; its depth when it went.
    fn try_launch(&mut self, manifest: Manifest, now: u64) -> Result<u32, String> {
        // The decision to start was recorded just before this; if that record could not be
        // made durable, the kill switch is on and the decision does not take effect.
        if self.store.kill_switch_engaged() {
            return Err("the kill switch is engaged (the audit trail could not be written, or an operator engaged it)".into());
        }
        let id = manifest.worker_id.clone();
        let depth = manifest.depth.get();
        let supervised = manifest.resources.network_policy.allow_controller;
        let (ours, theirs) = if supervised {
            match UnixStream::pair() {
                Ok((a, b)) => {
                    // What the kernel holds for a worker that does not read its replies
                    // is bounded too (with the reply queue, see `reply_worker`).
                    let _ = nix::sys::socket::setsockopt(
                        &a,
                        nix::sys::socket::sockopt::SndBuf,
                        &WORKER_SNDBUF,
                    );
                    (Some(a), Some(b))
                }
                Err(e) => return Err(format!("socketpair: {e}")),
            }
        } else {
            (None, None)
        };
        let slot = self.next_slot;
        self.next_slot = self.next_slot.wrapping_add(1);
        let payload_ids = (self.cfg.distinct_ids > 1 && manifest.filesystem.read_write.is_empty())
            .then(|| {
                let k = slot
                    .checked_rem(self.cfg.distinct_ids.saturating_sub(1))
                    .unwrap_or(0)
                    .saturating_add(1);
                (k, k)
            });
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
        let candidate = match &parent {
            Some(parent) => Candidate::Child {
                parent,
                manifest: &manifest,
            },
            None => Candidate::Root(&manifest),
        };
        admission::reserve(&mut self.store, &self.contract, &candidate, now)
            .into_result()
            .map_err(|r| match r {
                DenyReason::KillSwitch => "the kill switch is engaged (the audit trail could not be written, or an operator engaged it)".to_string(),
                r => format!("refused as it was about to start: {r}"),
            })?;
        let fd = theirs.map(std::os::fd::OwnedFd::from);
        if let Err(e) = self.send_launcher(
            &LauncherRequest::Launch {
                spec: Box::new(spec),
            },
            fd,
        ) {
            self.store.cancel(&id, now);
            return Err(format!("cannot hand the worker to the launcher: {e}"));
        }
        let conn = ours
            .and_then(|s| server::attach_worker(&self.rt, id.clone(), s, self.inputs.clone()).ok());
        if let Some(tx) = &conn {
            let _ = tx.try_send(welcome);
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
            started_at_ms: audit::now_ms(),
            last_heartbeat_ms: None,
            children: Vec::new(),
            conn,
            ended_by: None,
            final_usage: None,
            exit: None,
            unsupervised: !supervised,
            awaiting_approval: false,
            handle: None,
            gone_unreported_since_ms: None,
        });
        Ok(depth)
    }

    // ------------------------------------------------------------- worker messages

    /// Whether a connection's input still concerns a worker: what is still buffered from
    /// one that has exited (or was forgotten) is dropped unrecorded, so nothing keyed by
    /// its id is made again after `exited` cleared it.
    fn speaks_for_live_worker(&self, id: &WorkerId) -> bool {
        self.registry
            .get(id)
            .is_some_and(|w| w.state != WorkerState::Exited)
    }

    fn worker(&mut self, id: WorkerId, message: WorkerMessage) {
        if !self.speaks_for_live_worker(&id) {
            return;
        }
        let actor = format!("worker:{id}");
        // Identity is the connection: a claimed id must be the connection's own.
        if let Some(claimed) = message.claimed_id() {
            if claimed != id.as_str() {
                let claimed = bounded::clip(claimed, 80);
                // Recorded (and synced) once, then summarised: a worker repeating the
                // attempt cannot grow the trail or its disk traffic at will.
                if let Some(suppressed) = self.noisy_ok(&id, "impersonation") {
                    self.record(
                        event::IMPERSONATION_ATTEMPT,
                        &actor,
                        Some(&id),
                        json!({ "claimed": claimed, "message": message.kind(), "suppressed_since_last": suppressed }),
                        true,
                    );
                }
                self.reply_worker(
                    &id,
                    WorkerReply::Error {
                        message: format!("this connection is worker {id}, not {claimed}"),
                    },
                );
                if matches!(message, WorkerMessage::Register(_)) {
                    self.stop(&id, "rejected at registration: another worker's manifest");
                }
                return;
            }
        }
        let state = self.registry.get(&id).map(|w| w.state);
        match (message, state) {
            (_, None) | (_, Some(WorkerState::Exited | WorkerState::Stopping)) => {
                self.reply_worker(
                    &id,
                    WorkerReply::Error {
                        message: "this worker is stopping".into(),
                    },
                );
            }
            (WorkerMessage::Register(r), Some(WorkerState::Starting)) => {
                self.register(&id, r.manifest)
            }
            (WorkerMessage::Register(_), Some(_)) => {
                self.reply_worker(
                    &id,
                    WorkerReply::Error {
                        message: "already registered".into(),
                    },
                );
            }
            (_, Some(WorkerState::Starting)) => {
                self.reply_worker(
                    &id,
                    WorkerReply::Error {
                        message: "register first".into(),
                    },
                );
            }
            (WorkerMessage::Heartbeat(_), _) => {
                if let Some(w) = self.registry.get_mut(&id) {
                    w.last_heartbeat_ms = Some(audit::now_ms());
                }
                self.reply_worker(&id, WorkerReply::Ok);
            }
            (WorkerMessage::Replicate(r), _) => self.replicate(&id, *r),
            (WorkerMessage::Report(r), _) => {
                let result = r.result;
                if result.len() > MAX_TEXT_BYTES {
                    self.reply_worker(
                        &id,
                        WorkerReply::Error {
                            message: format!("report longer than {MAX_TEXT_BYTES} bytes"),
                        },
                    );
                    return;
                }
                self.record(
                    "worker_report",
                    &actor,
                    Some(&id),
                    json!({ "result": bounded::clip(&result, bounded::MAX_TEXT) }),
                    false,
                );
                self.reply_worker(&id, WorkerReply::Ok);
            }
            (WorkerMessage::Shutdown(_), _) => {
                // Once: asking again changes nothing and is not recorded again.
                if self.shutdown_deadlines.iter().any(|(w, _)| w == &id) {
                    self.reply_worker(&id, WorkerReply::Ok);
                    return;
                }
                self.record(
                    "worker_shutdown_requested",
                    &actor,
                    Some(&id),
                    json!({}),
                    false,
                );
                self.reply_worker(&id, WorkerReply::Ok);
                self.shutdown_deadlines.push((
                    id.clone(),
                    audit::now_ms().saturating_add(SHUTDOWN_GRACE_MS),
                ));
            }
        }
    }

    fn register(&mut self, id: &WorkerId, presented: Manifest) {
        let actor = format!("worker:{id}");
        let now = now_s();
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
                    WorkerReply::Error {
                        message: "this is not the manifest this worker was issued".into(),
                    },
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
                self.reply_worker(
                    id,
                    WorkerReply::Error {
                        message: e.to_string(),
                    },
                );
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
                    },
                );
                self.stop(id, "rejected at registration");
                return;
            }
        }
        let depth = presented.depth.get();
        if let Some(w) = self.registry.get_mut(id) {
            w.state = WorkerState::Registered;
            w.last_heartbeat_ms = Some(audit::now_ms());
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

    fn replicate(&mut self, id: &WorkerId, r: ReplicateMsg) {
        let actor = format!("worker:{id}");
        let Some(parent) = self.registry.get(id).map(|w| w.manifest.clone()) else {
            return;
        };
        if r.reason.len() > MAX_TEXT_BYTES {
            self.reply_worker(
                id,
                WorkerReply::Error {
                    message: format!("reason longer than {MAX_TEXT_BYTES} bytes"),
                },
            );
            return;
        }
        let snapshot = match r.state_snapshot {
            Some(s) => match StateSnapshot::new(s) {
                Ok(s) => s,
                Err(e) => {
                    self.reply_worker(
                        id,
                        WorkerReply::Error {
                            message: e.to_string(),
                        },
                    );
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
        let reply = match self.spawn_child(id, request, &actor, Some(&r.reason)) {
            Admission::Started { worker_id, depth } => WorkerReply::Allowed {
                child_id: worker_id,
                depth,
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
            Admission::Denied { event, reason } => WorkerReply::Denied { event, reason },
            Admission::Failed(message) => WorkerReply::Error { message },
        };
        self.reply_worker(id, reply);
    }

    // ------------------------------------------------------------- launcher events

    fn launcher_event(&mut self, ev: LauncherEvent) {
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
            LauncherEvent::Started {
                worker_id,
                pid,
                start_time,
                cgroup,
                enforcement,
            } => {
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
                    json!({ "pid": pid, "cgroup": cgroup, "not_enforced": not_enforced }),
                    false,
                );
            }
            LauncherEvent::StartFailed { worker_id, error } => {
                let Ok(id) = WorkerId::new(worker_id) else {
                    return;
                };
                self.record(
                    event::WORKER_START_FAILED,
                    "controller",
                    Some(&id),
                    json!({ "error": error }),
                    true,
                );
                self.exited(
                    &id,
                    ExitInfo {
                        exit_code: 125,
                        signal: None,
                        oom_killed: false,
                        timed_out: false,
                        ended_by: Some(format!("could not start: {error}")),
                    },
                );
            }
            LauncherEvent::Exited {
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
            } => {
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
                    },
                );
            }
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

    fn exited(&mut self, id: &WorkerId, exit: ExitInfo) {
        self.registry.mark_exited(id, exit);
        self.store.release(id);
        self.noisy.retain(|(w, _), _| w != id);
        if let Some(counts) = self.audit_budgets.remove(id) {
            self.record_suppressed(id, counts);
        }
        self.settle_waiters();
    }

    // ------------------------------------------------------------- periodic checks

    fn tick(&mut self) {
        let now_ms = audit::now_ms();
        let now = now_ms / 1000;
        let hb = self.cfg.heartbeat_timeout.as_millis() as u64;
        let reg = self.cfg.register_timeout.as_millis() as u64;
        let mut stale = Vec::new();
        let mut expired = Vec::new();
        for (id, w) in self.registry.active() {
            if w.state == WorkerState::Stopping {
                continue;
            }
            if w.manifest.is_expired(now) {
                expired.push(id.clone());
            } else if w.unsupervised || w.awaiting_approval {
                continue;
            } else if w.state == WorkerState::Registered
                && w.last_heartbeat_ms
                    .is_some_and(|t| now_ms.saturating_sub(t) > hb)
            {
                stale.push((id.clone(), "missed heartbeats"));
            } else if w.state == WorkerState::Starting
                && now_ms.saturating_sub(w.started_at_ms) > reg
            {
                stale.push((id.clone(), "never registered"));
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
                json!({ "why": why, "silent_ms": silent_ms }),
                true,
            );
            let ended_by = if why == "never registered" {
                format!(
                    "reaped: never registered within {} (a command that does not speak the worker protocol: spawn it with --no-controller)",
                    crate::units::format_duration(self.cfg.register_timeout)
                )
            } else {
                format!("reaped: {why}")
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
        if self.shutdown_deadline.is_some_and(|d| Instant::now() >= d) {
            self.shutdown_deadline = None;
            self.stop_launcher();
            self.finish();
            return;
        }
        self.expire_approvals(now_ms);
        self.settle_waiters();
        if let Err(e) = self.audit.sync() {
            // As for a decision's own sync: without a durable trail, nothing goes on.
            tracing::error!(error = %e, "the audit trail cannot be written; engaging the kill switch");
            self.store.set_kill_switch(true);
            self.kill_all_directly();
            let _ = self.send_launcher(&LauncherRequest::KillAll, None);
        }
    }

    /// A worker past its timeout that the launcher has not ended is ended here.
    fn enforce_timeouts(&mut self, now_ms: u64) {
        let late: Vec<WorkerId> = self
            .registry
            .active()
            .filter(|(_, w)| w.state != WorkerState::Stopping && w.handle.is_some())
            .filter(|(_, w)| {
                let limit = w
                    .manifest
                    .resources
                    .timeout_ms
                    .get()
                    .saturating_add(TIMEOUT_GRACE_MS);
                now_ms.saturating_sub(w.started_at_ms) > limit
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
    fn confirm_unreported_exits(&mut self, now_ms: u64) {
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
            self.record(
                event::WORKER_EXITED,
                "controller",
                Some(&id),
                json!({ "ended_by": ended_by, "confirmed_by": "controller", "launcher_reported": false }),
                false,
            );
            self.exited(
                &id,
                ExitInfo {
                    exit_code: 137,
                    signal: None,
                    oom_killed: false,
                    timed_out: false,
                    ended_by,
                },
            );
        }
    }
}
