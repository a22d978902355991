//! The records a cluster keeps in etcd, and the admission state read from them
//! ([`Snapshot`]): what the contract decides on, exactly as the in-memory store would,
//! and the writes a reservation makes. Pure: the etcd store reads and commits them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::contract::RegistryView;
use crate::manifest::WorkerId;

use super::super::admission::Slot;

/// Spawns are counted per second for rate stop conditions; past this many seconds with
/// spawns in them, the oldest second's count moves into the next (it is then counted as
/// more recent than it was: a rate check errs towards refusing).
const MAX_HISTORY_SECONDS: usize = 4096;

/// An admitted worker, under `workers/<id>`, attached to its node's lease. Fields a
/// later version adds are tolerated (it still counts during a rolling upgrade).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub worker_id: WorkerId,
    pub parent_id: Option<WorkerId>,
    pub node: String,
    pub depth: u32,
    pub memory_limit_mb: u64,
    pub cpu_limit: f64,
    pub issued_at: u64,
    pub reserved_at: u64,
    /// When it last started a child (its cooldown), if it has.
    #[serde(default)]
    pub last_spawn: Option<u64>,
}

impl WorkerRecord {
    pub fn of(slot: &Slot, node: &str, now: u64) -> WorkerRecord {
        WorkerRecord {
            worker_id: slot.worker_id.clone(),
            parent_id: slot.parent_id.clone(),
            node: node.to_string(),
            depth: slot.depth,
            memory_limit_mb: slot.memory_limit_mb,
            cpu_limit: slot.cpu_limit,
            issued_at: slot.issued_at,
            reserved_at: now,
            last_spawn: None,
        }
    }
}

/// The cluster's spawn history, under `history`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct History {
    pub lifetime_total: u64,
    /// Spawns per second (seconds since the epoch), within the longest rate window.
    pub per_second: BTreeMap<u64, u64>,
}

impl History {
    fn spawns_since(&self, since: u64) -> u64 {
        self.per_second
            .range(since..)
            .fold(0u64, |n, (_, c)| n.saturating_add(*c))
    }

    /// Counts a spawn at `now`, forgetting seconds older than `window` before it.
    pub fn add(&mut self, now: u64, window: u64) {
        self.lifetime_total = self.lifetime_total.saturating_add(1);
        let n = self.per_second.entry(now).or_insert(0);
        *n = n.saturating_add(1);
        let oldest = now.saturating_sub(window);
        self.per_second = self.per_second.split_off(&oldest);
        while self.per_second.len() > MAX_HISTORY_SECONDS {
            let Some((_, count)) = self.per_second.pop_first() else {
                break;
            };
            if let Some(mut next) = self.per_second.first_entry() {
                let c = next.get_mut();
                *c = c.saturating_add(count);
            }
        }
    }

    /// Takes back a spawn counted at `at` (a reservation whose worker never started).
    pub fn remove(&mut self, at: u64) {
        self.lifetime_total = self.lifetime_total.saturating_sub(1);
        if let Some(n) = self.per_second.get_mut(&at) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_second.remove(&at);
            }
        }
    }
}

/// The cluster's kill switch, under `control/kill-switch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KillSwitchRecord {
    pub by: String,
    pub node: String,
    pub at_ms: u64,
}

/// A live node, under `nodes/<node>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRecord {
    pub node: String,
    pub pid: u32,
    pub started_at_ms: u64,
}

/// What a node did when the kill switch at `revision` reached it, under `acks/<node>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AckRecord {
    pub node: String,
    pub revision: i64,
    pub killed: usize,
    /// From the node's learning of the key to its last worker gone.
    pub elapsed_ms: u64,
}

/// A request to the node running `worker_id` to kill it, under `control/kill/<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KillRequest {
    pub worker_id: WorkerId,
    pub recursive: bool,
    pub by: String,
}

/// A node's audit head, under `audit/<node>/<trail>`: that trail must hold entry `seq`
/// with this hash (`audit verify --cluster`). One key per trail, so a trail replaced by
/// a new one leaves the old one's head behind as evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnchorRecord {
    pub node: String,
    pub session: String,
    pub seq: u64,
    pub hash: String,
    /// The trail's first entry's hash: its name.
    pub trail: String,
    pub at_ms: u64,
}

/// One worker as `ps --cluster` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterWorker {
    pub record: WorkerRecord,
}

/// The admission state at one revision of the cluster.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub workers: BTreeMap<WorkerId, WorkerRecord>,
    pub history: History,
    pub kill_switch: bool,
    /// Set on a node that refuses whatever the snapshot says (its kill switch, a fence).
    pub local_kill_switch: bool,
}

impl Snapshot {
    fn totals(&self, skip: Option<&WorkerId>) -> (u64, u64, f64) {
        let mut n = 0u64;
        let mut mem = 0u64;
        let mut cpu = 0f64;
        for (id, w) in &self.workers {
            if Some(id) == skip {
                continue;
            }
            n = n.saturating_add(1);
            mem = mem.saturating_add(w.memory_limit_mb);
            cpu += w.cpu_limit;
        }
        (n, mem, cpu)
    }

    /// The records a reservation of `slot` at `now` writes: the worker's own, and its
    /// parent's with the new cooldown start (when the parent is admitted), plus the
    /// history with the spawn counted.
    pub fn reservation(
        &self,
        slot: &Slot,
        node: &str,
        now: u64,
        window: u64,
    ) -> (WorkerRecord, Option<WorkerRecord>, History) {
        let own = WorkerRecord::of(slot, node, now);
        let parent = slot
            .parent_id
            .as_ref()
            .and_then(|p| self.workers.get(p))
            .map(|p| WorkerRecord {
                last_spawn: Some(now),
                ..p.clone()
            });
        let mut history = self.history.clone();
        history.add(now, window);
        (own, parent, history)
    }
}

impl RegistryView for Snapshot {
    fn kill_switch_engaged(&self) -> bool {
        self.kill_switch || self.local_kill_switch
    }
    fn active_count(&self) -> u64 {
        self.workers.len() as u64
    }
    fn last_spawn_by(&self, parent: &WorkerId) -> Option<u64> {
        self.workers.get(parent).and_then(|w| w.last_spawn)
    }
    fn total_memory_limit_mb(&self) -> u64 {
        self.totals(None).1
    }
    fn total_cpu_limit(&self) -> f64 {
        self.totals(None).2
    }
    fn spawns_since(&self, since: u64) -> u64 {
        self.history.spawns_since(since)
    }
    fn lifetime_total(&self) -> u64 {
        self.history.lifetime_total
    }
}

/// A snapshot without one worker (a worker re-checked as it registers).
pub struct Excluding<'a> {
    pub snapshot: &'a Snapshot,
    pub id: &'a WorkerId,
}

impl RegistryView for Excluding<'_> {
    fn kill_switch_engaged(&self) -> bool {
        self.snapshot.kill_switch_engaged()
    }
    fn active_count(&self) -> u64 {
        self.snapshot.totals(Some(self.id)).0
    }
    fn last_spawn_by(&self, parent: &WorkerId) -> Option<u64> {
        self.snapshot.last_spawn_by(parent)
    }
    fn total_memory_limit_mb(&self) -> u64 {
        self.snapshot.totals(Some(self.id)).1
    }
    fn total_cpu_limit(&self) -> f64 {
        self.snapshot.totals(Some(self.id)).2
    }
    fn spawns_since(&self, since: u64) -> u64 {
        let own = self
            .snapshot
            .workers
            .get(self.id)
            .is_some_and(|w| w.reserved_at >= since);
        self.snapshot
            .spawns_since(since)
            .saturating_sub(u64::from(own))
    }
    fn lifetime_total(&self) -> u64 {
        let own = self.snapshot.workers.contains_key(self.id);
        self.snapshot
            .lifetime_total()
            .saturating_sub(u64::from(own))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> WorkerId {
        match WorkerId::new(s) {
            Ok(w) => w,
            Err(e) => panic!("{e}"),
        }
    }

    fn slot(w: &str, parent: Option<&str>) -> Slot {
        Slot {
            worker_id: id(w),
            parent_id: parent.map(id),
            depth: u32::from(parent.is_some()),
            memory_limit_mb: 64,
            cpu_limit: 0.5,
            issued_at: 100,
            reserved_at: 100,
        }
    }

    #[test]
    fn a_reservation_counts_the_spawn_and_starts_the_parents_cooldown() {
        let mut s = Snapshot::default();
        let (root, parent, history) = s.reservation(&slot("w-root", None), "a", 100, 60);
        assert!(parent.is_none());
        s.workers.insert(root.worker_id.clone(), root);
        s.history = history;
        let (child, parent, history) =
            s.reservation(&slot("w-child", Some("w-root")), "a", 105, 60);
        assert_eq!(child.reserved_at, 105);
        assert_eq!(parent.and_then(|p| p.last_spawn), Some(105));
        assert_eq!(history.lifetime_total, 2);
        assert_eq!(history.spawns_since(101), 1);
        assert_eq!(history.spawns_since(100), 2);
    }

    #[test]
    fn history_forgets_outside_the_window_and_errs_towards_recent() {
        let mut h = History::default();
        h.add(10, 60);
        h.add(100, 60);
        assert_eq!(h.per_second.len(), 1, "second 10 is outside the window");
        assert_eq!(h.lifetime_total, 2);
        let mut h = History::default();
        for t in 0..(MAX_HISTORY_SECONDS as u64 + 10) {
            h.add(t, u64::MAX);
        }
        assert_eq!(h.per_second.len(), MAX_HISTORY_SECONDS);
        // Nothing is lost, only moved later.
        assert_eq!(h.spawns_since(0), MAX_HISTORY_SECONDS as u64 + 10);
        h.remove(MAX_HISTORY_SECONDS as u64 + 9);
        assert_eq!(h.lifetime_total, MAX_HISTORY_SECONDS as u64 + 9);
    }

    #[test]
    fn a_worker_re_checked_is_not_counted_against_itself() {
        let mut s = Snapshot::default();
        let (w, _, h) = s.reservation(&slot("w-one", None), "a", 100, 60);
        s.workers.insert(w.worker_id.clone(), w);
        s.history = h;
        let me = id("w-one");
        let view = Excluding {
            snapshot: &s,
            id: &me,
        };
        assert_eq!(view.active_count(), 0);
        assert_eq!(view.spawns_since(0), 0);
        assert_eq!(view.lifetime_total(), 0);
        assert_eq!(s.active_count(), 1);
    }
}
