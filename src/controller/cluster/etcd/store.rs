//! The admission store shared by every node of a cluster.
//!
//! A reservation is one etcd transaction, tried again on conflict: read `workers/`,
//! `history` and the kill switch at one revision R, decide with the contract's own code,
//! then write the worker's key (on the node's lease), its parent's cooldown and the
//! history only if the kill-switch key is absent, nothing under `workers/` was created or
//! changed since R, `history` is unchanged since R and the worker's key does not exist.
//! So `max_replicas`, cooldowns and budget stop conditions are exact across the cluster.
//! A worker deleted since R only frees a slot, so the check stays as strict as it was.
//!
//! Reads that decide nothing (a child's manifest before its start, a registering worker's
//! re-check) use the snapshot read by the last reservation; the reservation that follows
//! decides on the cluster as it is.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};

use crate::contract::{Decision, DenyReason, RegistryView};
use crate::manifest::WorkerId;

use super::super::super::admission::{AdmissionStore, Slot};
use super::super::records::{Excluding, History, Snapshot, WorkerRecord};
use super::{Link, json, with_lease};

/// Most attempts one reservation makes when other nodes keep changing `workers/` (within
/// the link's admission budget: the engine waits on it, and the engine also hands the
/// launcher its lease deadlines).
const MAX_ATTEMPTS: u32 = 64;
/// A commit gets at least this long, even at the end of the budget.
const MIN_COMMIT_WAIT: Duration = Duration::from_millis(100);
/// The largest value read from `workers/` or `history`; a larger one is not ours.
const MAX_RECORD: usize = 512 * 1024;
/// How long a release or cancel is retried in the background.
const RETRY_FOR: Duration = Duration::from_secs(60);

/// The admission store of one node of a cluster.
pub struct EtcdStore {
    link: Arc<Link>,
    /// The cluster as the last reservation read it.
    cache: Snapshot,
    /// The longest rate window of the contract's stop conditions (seconds of history).
    window: u64,
}

impl EtcdStore {
    pub fn new(link: Arc<Link>, window: u64) -> EtcdStore {
        EtcdStore {
            link,
            cache: Snapshot::default(),
            window,
        }
    }

    /// Reads the admission state at one revision, waiting at most `limit`.
    fn read(&self, limit: Duration) -> Result<(Snapshot, i64), String> {
        let keys = self.link.keys.clone();
        let resp = self.link.call_within(limit, move |c| async move {
            c.kv_client()
                .max_decoding_message_size(super::MAX_ANSWER)
                .txn(Txn::new().and_then([
                    TxnOp::get(keys.workers(), Some(GetOptions::new().with_prefix())),
                    TxnOp::get(keys.history(), None),
                    TxnOp::get(keys.kill_switch(), None),
                ]))
                .await
        })?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        let mut snap = Snapshot::default();
        for (i, op) in resp.op_responses().into_iter().enumerate() {
            let TxnOpResponse::Get(get) = op else {
                continue;
            };
            match i {
                0 => {
                    let workers_prefix = self.link.keys.workers();
                    for kv in get.kvs() {
                        let w = read_worker(kv, &workers_prefix)?;
                        snap.workers.insert(w.worker_id.clone(), w);
                    }
                }
                1 => {
                    if let Some(kv) = get.kvs().first() {
                        snap.history = serde_json::from_slice::<History>(kv.value())
                            .map_err(|e| format!("the cluster's history is unreadable: {e}"))?;
                    }
                }
                _ => snap.kill_switch = !get.kvs().is_empty(),
            }
        }
        snap.local_kill_switch = self.cache.local_kill_switch;
        Ok((snap, revision))
    }

    /// Writes a reservation if nothing it decided on changed since `revision`: whether
    /// it was written.
    fn commit(
        &self,
        revision: i64,
        own: &WorkerRecord,
        parent: Option<&WorkerRecord>,
        history: &History,
        lease: i64,
        limit: Duration,
    ) -> Result<bool, String> {
        let keys = self.link.keys.clone();
        let after = revision.saturating_add(1);
        let mut ops = vec![
            TxnOp::put(
                keys.worker(own.worker_id.as_str()),
                json(own),
                with_lease(lease),
            ),
            TxnOp::put(keys.history(), json(history), None),
        ];
        if let Some(p) = parent {
            ops.push(TxnOp::put(
                keys.worker(p.worker_id.as_str()),
                json(p),
                with_lease(lease),
            ));
        }
        let own_key = keys.worker(own.worker_id.as_str());
        let mut when = vec![
            Compare::version(keys.kill_switch(), CompareOp::Equal, 0),
            Compare::mod_revision(keys.workers(), CompareOp::Less, after).with_prefix(),
            Compare::mod_revision(keys.history(), CompareOp::Less, after),
            Compare::version(own_key, CompareOp::Equal, 0),
        ];
        // A parent released since the read is not written back to life.
        if let Some(p) = parent {
            when.push(Compare::version(
                keys.worker(p.worker_id.as_str()),
                CompareOp::Greater,
                0,
            ));
        }
        let txn = Txn::new().when(when).and_then(ops);
        let resp = self
            .link
            .call_within(limit, move |mut c| async move { c.txn(txn).await })?;
        Ok(resp.succeeded())
    }
}

impl RegistryView for EtcdStore {
    fn kill_switch_engaged(&self) -> bool {
        self.cache.kill_switch_engaged()
    }
    fn active_count(&self) -> u64 {
        self.cache.active_count()
    }
    fn last_spawn_by(&self, parent: &WorkerId) -> Option<u64> {
        self.cache.last_spawn_by(parent)
    }
    fn total_memory_limit_mb(&self) -> u64 {
        self.cache.total_memory_limit_mb()
    }
    fn total_cpu_limit(&self) -> f64 {
        self.cache.total_cpu_limit()
    }
    fn spawns_since(&self, since: u64) -> u64 {
        self.cache.spawns_since(since)
    }
    fn lifetime_total(&self) -> u64 {
        self.cache.lifetime_total()
    }
}

impl AdmissionStore for EtcdStore {
    fn reserve(
        &mut self,
        slot: Slot,
        now: u64,
        check: &dyn Fn(&dyn RegistryView) -> Decision,
    ) -> Decision {
        let unavailable = |why: String| Decision::Deny(DenyReason::ClusterUnavailable(why));
        if self.cache.local_kill_switch {
            return Decision::Deny(DenyReason::KillSwitch);
        }
        let started = std::time::Instant::now();
        let budget = self.link.admission_budget();
        for _ in 0..MAX_ATTEMPTS {
            let left = budget.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            let lease = match self.link.admitting() {
                Ok(l) => l,
                Err(why) => return unavailable(why),
            };
            let (snap, revision) = match self.read(left) {
                Ok(s) => s,
                Err(why) => return unavailable(why),
            };
            self.cache = snap;
            let decision = check(&self.cache);
            if !decision.is_allowed() {
                return decision;
            }
            let (own, parent, history) =
                self.cache
                    .reservation(&slot, &self.link.node, now, self.window);
            let left = budget
                .saturating_sub(started.elapsed())
                .max(MIN_COMMIT_WAIT);
            match self.commit(revision, &own, parent.as_ref(), &history, lease.id, left) {
                Ok(true) => {
                    if let Some(p) = parent {
                        self.cache.workers.insert(p.worker_id.clone(), p);
                    }
                    self.cache.workers.insert(own.worker_id.clone(), own);
                    self.cache.history = history;
                    return decision;
                }
                Ok(false) => continue,
                Err(why) => {
                    // The write may have landed: take it back, so no slot is held for a
                    // worker that will not start.
                    self.cancel(&slot.worker_id, now);
                    return unavailable(why);
                }
            }
        }
        unavailable(format!(
            "other nodes kept changing the cluster's workers (tried for {} s)",
            started.elapsed().as_secs()
        ))
    }

    fn release(&mut self, id: &WorkerId) {
        self.cache.workers.remove(id);
        let key = self.link.keys.worker(id.as_str());
        self.link.spawn_retrying(RETRY_FOR, move |mut c| {
            let key = key.clone();
            async move { c.delete(key, None).await.map(|_| ()) }
        });
    }

    fn cancel(&mut self, id: &WorkerId, reserved_at: u64) {
        self.cache.workers.remove(id);
        let keys = self.link.keys.clone();
        let id = id.as_str().to_string();
        // Read, take the spawn back, write if unchanged — only if the key was ours to
        // delete (a reservation that never landed took nothing).
        self.link.spawn_retrying(RETRY_FOR, move |mut c| {
            let keys = keys.clone();
            let id = id.clone();
            async move {
                let got = c.get(keys.history(), None).await?;
                let (mut history, rev) = match got.kvs().first() {
                    // Unreadable here: left as it is, never replaced by an empty one.
                    Some(kv) => (
                        serde_json::from_slice::<History>(kv.value()).map_err(|e| {
                            etcd_client::Error::InvalidArgs(format!("history unreadable: {e}"))
                        })?,
                        kv.mod_revision(),
                    ),
                    None => (History::default(), 0),
                };
                history.remove(reserved_at);
                let txn = Txn::new()
                    .when([
                        Compare::version(keys.worker(&id), CompareOp::Greater, 0),
                        Compare::mod_revision(keys.history(), CompareOp::Equal, rev),
                    ])
                    .and_then([
                        TxnOp::delete(keys.worker(&id), None),
                        TxnOp::put(keys.history(), json(&history), None),
                    ])
                    .or_else([TxnOp::get(keys.worker(&id), None)]);
                let resp = c.txn(txn).await?;
                let absent = resp
                    .op_responses()
                    .iter()
                    .any(|r| matches!(r, TxnOpResponse::Get(g) if g.kvs().is_empty()));
                if resp.succeeded() || absent {
                    Ok(())
                } else {
                    Err(etcd_client::Error::InvalidArgs(
                        "history changed; again".into(),
                    ))
                }
            }
        });
    }

    fn note_failed_start(&mut self, parent: &WorkerId, now: u64) {
        let Some(record) = self.cache.workers.get_mut(parent) else {
            return;
        };
        record.last_spawn = Some(now);
        let record = record.clone();
        let key = self.link.keys.worker(parent.as_str());
        let lease = self.link.lease().id;
        self.link.spawn_retrying(RETRY_FOR, move |mut c| {
            let key = key.clone();
            let value = json(&record);
            async move {
                // Only while the parent is still admitted.
                let txn = Txn::new()
                    .when([Compare::version(key.clone(), CompareOp::Greater, 0)])
                    .and_then([TxnOp::put(key, value, with_lease(lease))]);
                c.txn(txn).await.map(|_| ())
            }
        });
    }

    fn set_kill_switch(&mut self, engaged: bool) {
        self.cache.local_kill_switch = engaged;
    }

    fn refresh(&mut self) {
        // Unreachable: the last state read stays; the reservation refuses on its own.
        if self.link.admitting().is_err() {
            return;
        }
        if let Ok((snap, _)) = self.read(self.link.admission_budget()) {
            self.cache = snap;
        }
    }

    fn is_active(&self, id: &WorkerId) -> bool {
        self.cache.workers.contains_key(id)
    }

    fn excluding<'a>(&'a self, id: &'a WorkerId) -> Box<dyn RegistryView + 'a> {
        Box::new(Excluding {
            snapshot: &self.cache,
            id,
        })
    }
}

/// A worker record as admission counts it: one this node cannot read (too large, another
/// format, a key that names another worker) refuses admission rather than being left
/// out of the count.
fn read_worker(kv: &etcd_client::KeyValue, prefix: &str) -> Result<WorkerRecord, String> {
    let key = kv.key_str().unwrap_or("?");
    let unreadable = |why: String| {
        format!(
            "the worker record {key} is unreadable here ({why}); admission waits until it is removed or this node is upgraded"
        )
    };
    if kv.value().len() > MAX_RECORD {
        return Err(unreadable(format!("{} bytes", kv.value().len())));
    }
    let w: WorkerRecord =
        serde_json::from_slice(kv.value()).map_err(|e| unreadable(e.to_string()))?;
    if key.strip_prefix(prefix) != Some(w.worker_id.as_str()) {
        return Err(unreadable(format!("it names {}", w.worker_id)));
    }
    if !w.cpu_limit.is_finite() || w.cpu_limit < 0.0 {
        return Err(unreadable(format!("cpu_limit {}", w.cpu_limit)));
    }
    Ok(w)
}

/// Every worker record in the cluster, by id (for `ps --cluster` and kill requests).
pub(super) fn parse_workers(kvs: &[etcd_client::KeyValue]) -> BTreeMap<WorkerId, WorkerRecord> {
    kvs.iter()
        .filter(|kv| kv.value().len() <= MAX_RECORD)
        .filter_map(|kv| serde_json::from_slice::<WorkerRecord>(kv.value()).ok())
        .map(|w| (w.worker_id.clone(), w))
        .collect()
}
