//! The contract state that decides admission, behind one interface.
//!
//! [`AdmissionStore`] is what the replication contract reads ([`RegistryView`]) plus the
//! two writes that change it: [`reserve`](AdmissionStore::reserve), which checks a
//! candidate and counts it in one step, and [`release`](AdmissionStore::release), when a
//! worker is gone. Checking and counting in one step is what makes two requests racing
//! for the last slot end with exactly one winner, whichever store holds the state: the
//! in-memory one here checks under `&mut self`; a store shared between controllers does
//! the same as one transaction (read, decide, write if nothing changed, else again).

use std::collections::{BTreeMap, VecDeque};

use crate::contract::{Decision, RegistryView};
use crate::manifest::{Manifest, WorkerId};

/// Spawn times remembered for rate stop conditions: as many as a rate may allow (a window
/// holding more is counted as full).
const KEEP_SPAWN_TIMES: usize = crate::contract::file::MAX_SPAWNS_IN_WINDOW as usize;

/// What the store keeps of an admitted worker: what the contract's budgets count.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    pub worker_id: WorkerId,
    pub parent_id: Option<WorkerId>,
    /// Its place in the lineage (what `ps --tree --cluster` draws).
    pub depth: u32,
    pub memory_limit_mb: u64,
    pub cpu_limit: f64,
    /// When its manifest was issued (seconds since the epoch).
    pub issued_at: u64,
    /// When it was counted as a spawn (set by `reserve`): what a re-check of the worker
    /// itself subtracts, since an approved child is counted when it is approved, which can
    /// be long after its manifest was issued.
    pub reserved_at: u64,
}

impl Slot {
    pub fn of(manifest: &Manifest) -> Slot {
        Slot {
            worker_id: manifest.worker_id.clone(),
            parent_id: manifest.parent_id.clone(),
            depth: manifest.depth.get(),
            memory_limit_mb: manifest.resources.memory_limit_mb.get(),
            cpu_limit: manifest.resources.cpu_limit.get(),
            issued_at: manifest.issued_at.get(),
            reserved_at: manifest.issued_at.get(),
        }
    }
}

/// The state admission decides on: active workers and their limits, when each parent
/// last started a child (cooldowns), the spawn history (rate and lifetime stop
/// conditions) and the kill switch.
pub trait AdmissionStore: RegistryView + Send {
    /// Runs `check` over the store and, when it allows, counts `slot` as active, records
    /// the spawn (history, lifetime total, its parent's cooldown) — in one step: nothing
    /// changes the store between the check and the write. A refusal changes nothing.
    fn reserve(
        &mut self,
        slot: Slot,
        now: u64,
        check: &dyn Fn(&dyn RegistryView) -> Decision,
    ) -> Decision;

    /// A worker is gone (exited, killed, reaped): its slot is free again. Its spawn stays
    /// in the history; releasing an unknown or released worker changes nothing.
    fn release(&mut self, id: &WorkerId);

    /// A reservation whose worker never reached the launcher: forgotten as if never made
    /// (no slot, no spawn in the history), except for its parent's cooldown.
    fn cancel(&mut self, id: &WorkerId, reserved_at: u64);

    /// A decided start that did not happen still starts `parent`'s cooldown, so that
    /// failing starts cannot be repeated at will.
    fn note_failed_start(&mut self, parent: &WorkerId, now: u64);

    fn set_kill_switch(&mut self, engaged: bool);

    /// Brings what the store's reads show up to date before a check that decides nothing
    /// by itself (a store shared between controllers reads the others' changes; the
    /// reservation that follows decides on the state as it is then).
    fn refresh(&mut self) {}

    /// Whether `id` holds a slot.
    fn is_active(&self, id: &WorkerId) -> bool;

    /// The store as if `id` were not admitted yet (a worker re-checked as it registers is
    /// not counted against itself).
    fn excluding<'a>(&'a self, id: &'a WorkerId) -> Box<dyn RegistryView + 'a>;
}

/// The store of one controller, in its memory.
#[derive(Debug, Default)]
pub struct InMemoryStore {
    active: BTreeMap<WorkerId, Slot>,
    /// Per active parent: when it last started a child (seconds).
    last_spawn: BTreeMap<WorkerId, u64>,
    spawn_times: VecDeque<u64>,
    lifetime_total: u64,
    kill_switch: bool,
}

impl InMemoryStore {
    fn totals(&self, skip: Option<&WorkerId>) -> (u64, u64, f64) {
        let mut n = 0u64;
        let mut mem = 0u64;
        let mut cpu = 0f64;
        for (id, s) in &self.active {
            if Some(id) == skip {
                continue;
            }
            n = n.saturating_add(1);
            mem = mem.saturating_add(s.memory_limit_mb);
            cpu += s.cpu_limit;
        }
        (n, mem, cpu)
    }
}

impl RegistryView for InMemoryStore {
    fn kill_switch_engaged(&self) -> bool {
        self.kill_switch
    }
    fn active_count(&self) -> u64 {
        self.active.len() as u64
    }
    fn last_spawn_by(&self, parent: &WorkerId) -> Option<u64> {
        self.last_spawn.get(parent).copied()
    }
    fn total_memory_limit_mb(&self) -> u64 {
        self.totals(None).1
    }
    fn total_cpu_limit(&self) -> f64 {
        self.totals(None).2
    }
    fn spawns_since(&self, since: u64) -> u64 {
        self.spawn_times
            .iter()
            .rev()
            .take_while(|t| **t >= since)
            .count() as u64
    }
    fn lifetime_total(&self) -> u64 {
        self.lifetime_total
    }
}

impl AdmissionStore for InMemoryStore {
    fn reserve(
        &mut self,
        slot: Slot,
        now: u64,
        check: &dyn Fn(&dyn RegistryView) -> Decision,
    ) -> Decision {
        let decision = check(self);
        if !decision.is_allowed() {
            return decision;
        }
        if let Some(parent) = &slot.parent_id {
            if self.active.contains_key(parent) {
                self.last_spawn.insert(parent.clone(), now);
            }
        }
        self.spawn_times.push_back(now);
        while self.spawn_times.len() > KEEP_SPAWN_TIMES {
            self.spawn_times.pop_front();
        }
        self.lifetime_total = self.lifetime_total.saturating_add(1);
        let mut slot = slot;
        slot.reserved_at = now;
        self.active.insert(slot.worker_id.clone(), slot);
        decision
    }

    fn release(&mut self, id: &WorkerId) {
        self.active.remove(id);
        // A worker that is gone starts no more children.
        self.last_spawn.remove(id);
    }

    fn cancel(&mut self, id: &WorkerId, reserved_at: u64) {
        if self.active.remove(id).is_none() {
            return;
        }
        if let Some(i) = self.spawn_times.iter().rposition(|t| *t == reserved_at) {
            self.spawn_times.remove(i);
        }
        self.lifetime_total = self.lifetime_total.saturating_sub(1);
    }

    fn note_failed_start(&mut self, parent: &WorkerId, now: u64) {
        if self.active.contains_key(parent) {
            self.last_spawn.insert(parent.clone(), now);
        }
    }

    fn set_kill_switch(&mut self, engaged: bool) {
        self.kill_switch = engaged;
    }

    fn is_active(&self, id: &WorkerId) -> bool {
        self.active.contains_key(id)
    }

    fn excluding<'a>(&'a self, id: &'a WorkerId) -> Box<dyn RegistryView + 'a> {
        Box::new(Excluding { store: self, id })
    }
}

/// [`InMemoryStore`] without one worker.
struct Excluding<'a> {
    store: &'a InMemoryStore,
    id: &'a WorkerId,
}

impl RegistryView for Excluding<'_> {
    fn kill_switch_engaged(&self) -> bool {
        self.store.kill_switch
    }
    fn active_count(&self) -> u64 {
        self.store.totals(Some(self.id)).0
    }
    fn last_spawn_by(&self, parent: &WorkerId) -> Option<u64> {
        self.store.last_spawn_by(parent)
    }
    fn total_memory_limit_mb(&self) -> u64 {
        self.store.totals(Some(self.id)).1
    }
    fn total_cpu_limit(&self) -> f64 {
        self.store.totals(Some(self.id)).2
    }
    fn spawns_since(&self, since: u64) -> u64 {
        let own = self
            .store
            .active
            .get(self.id)
            .is_some_and(|s| s.reserved_at >= since);
        self.store
            .spawns_since(since)
            .saturating_sub(u64::from(own))
    }
    fn lifetime_total(&self) -> u64 {
        let own = self.store.active.contains_key(self.id);
        self.store.lifetime_total.saturating_sub(u64::from(own))
    }
}
