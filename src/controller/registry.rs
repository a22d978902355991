//! The controller's registry: every worker it launched, its lineage and state, its
//! connection, pid and handle. What the replication contract counts (active workers and
//! their limits, cooldowns, the spawn history, the kill switch) is kept apart, in the
//! admission store (`super::admission`).

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;

use tokio::sync::mpsc::Sender;

use crate::manifest::{Manifest, WorkerId};
use crate::sandbox::handle::KillHandle;

use super::protocol::{ExitInfo, WorkerFrame, WorkerInfo};

/// Exited workers kept for `ps` after they are gone.
const KEEP_EXITED: usize = 1000;

/// The most an exited worker's manifests may take together (as JSON) before the oldest
/// are forgotten, fewer than [`KEEP_EXITED`] then: a worker picks its children's manifests
/// (up to a frame each), and children that exit at once cost it nothing, so the history
/// is bounded by size as well as by count.
const KEEP_EXITED_BYTES: usize = 8 << 20;

/// Deepest lineage walked (the contract allows 64 generations): a bound on each walk,
/// whatever the records say.
const MAX_LINEAGE: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    /// Launched, not yet registered.
    Starting,
    Registered,
    /// The controller ended it; waiting for the launcher to confirm.
    Stopping,
    Exited,
}

impl WorkerState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Starting => "starting",
            WorkerState::Registered => "running",
            WorkerState::Stopping => "stopping",
            WorkerState::Exited => "exited",
        }
    }

    /// Holds a slot of the quota: everything until the launcher says it is gone.
    pub fn is_active(self) -> bool {
        !matches!(self, WorkerState::Exited)
    }
}

pub struct WorkerRecord {
    pub manifest: Manifest,
    pub state: WorkerState,
    pub pid: Option<i32>,
    pub cgroup: Option<PathBuf>,
    pub started_at_ms: u64,
    pub last_heartbeat_ms: Option<u64>,
    pub children: Vec<WorkerId>,
    /// The worker's socket, while connected.
    pub conn: Option<Sender<WorkerFrame>>,
    /// Why the controller ended it (killed, reaped, expired, kill switch).
    pub ended_by: Option<String>,
    /// The launcher's last figures for an ended worker (its usage over its whole life).
    pub final_usage: Option<super::launcher::LiveUsage>,
    pub exit: Option<ExitInfo>,
    /// The worker has no controller socket (its manifest withholds it): nothing to await.
    pub unsupervised: bool,
    /// How many of its descendants are active (set by the registry). An exited worker
    /// with active descendants is never forgotten: its record is the link through which
    /// `kill --recursive` and `ps --tree` reach them.
    pub active_below: u32,
    /// The worker waits for a person's decision on its replication (not reaped meanwhile).
    pub awaiting_approval: bool,
    /// The controller's own handle on the sandbox (kills it without the launcher).
    pub handle: Option<KillHandle>,
    /// When the handle first showed the sandbox gone while the launcher had not said so.
    pub gone_unreported_since_ms: Option<u64>,
}

#[derive(Default)]
pub struct Registry {
    workers: BTreeMap<WorkerId, WorkerRecord>,
    /// Exited workers that may be forgotten, oldest first, with their manifests' size.
    exited_order: VecDeque<(WorkerId, usize)>,
    /// What `exited_order`'s manifests take together.
    exited_bytes: usize,
}

impl Registry {
    pub fn get(&self, id: &WorkerId) -> Option<&WorkerRecord> {
        self.workers.get(id)
    }

    pub fn get_mut(&mut self, id: &WorkerId) -> Option<&mut WorkerRecord> {
        self.workers.get_mut(id)
    }

    /// Adds a worker just handed to the launcher (and admitted in the admission store).
    pub fn insert(&mut self, mut record: WorkerRecord) {
        if let Some(parent) = record.manifest.parent_id.clone() {
            if let Some(p) = self.workers.get_mut(&parent) {
                p.children.push(record.manifest.worker_id.clone());
            }
        }
        record.active_below = 0;
        let parent = record.manifest.parent_id.clone();
        self.workers
            .insert(record.manifest.worker_id.clone(), record);
        self.count_below(parent, true);
    }

    /// Counts one active worker more (or fewer) below each ancestor from `parent` up.
    /// Every ancestor of an active worker is here (see [`WorkerRecord::active_below`]).
    /// Returns the exited ancestors that no active worker is below any more.
    fn count_below(&mut self, parent: Option<WorkerId>, more: bool) -> Vec<WorkerId> {
        let mut freed = Vec::new();
        let mut cur = parent;
        for _ in 0..MAX_LINEAGE {
            let Some(id) = cur else { break };
            let Some(w) = self.workers.get_mut(&id) else {
                break;
            };
            w.active_below = if more {
                w.active_below.saturating_add(1)
            } else {
                w.active_below.saturating_sub(1)
            };
            if w.active_below == 0 && w.state == WorkerState::Exited {
                freed.push(id);
            }
            cur = w.manifest.parent_id.clone();
        }
        freed
    }

    /// Marks a worker gone and forgets the oldest exited ones beyond the history's count
    /// or size. An exited worker with active descendants is kept until they have exited.
    pub fn mark_exited(&mut self, id: &WorkerId, exit: ExitInfo) {
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        // Once: the launcher's report and the controller's own confirmation may both come.
        if w.state == WorkerState::Exited {
            return;
        }
        w.state = WorkerState::Exited;
        w.conn = None;
        w.exit = Some(exit);
        w.handle = None;
        let parent = w.manifest.parent_id.clone();
        let own = (w.active_below == 0).then(|| id.clone());
        let freed = self.count_below(parent, false);
        for id in own.into_iter().chain(freed) {
            self.may_forget(id);
        }
        self.forget_beyond_history();
    }

    /// Puts an exited worker with no active descendants in line to be forgotten.
    fn may_forget(&mut self, id: WorkerId) {
        let size = self.workers.get(&id).map_or(0, |w| {
            serde_json::to_vec(&w.manifest).map_or(0, |v| v.len())
        });
        self.exited_bytes = self.exited_bytes.saturating_add(size);
        self.exited_order.push_back((id, size));
    }

    /// Forgets the oldest exited workers beyond [`KEEP_EXITED`] or [`KEEP_EXITED_BYTES`],
    /// except those that active workers have since been started below (they are put in
    /// line again when those have exited).
    fn forget_beyond_history(&mut self) {
        while self.exited_order.len() > KEEP_EXITED || self.exited_bytes > KEEP_EXITED_BYTES {
            let Some((old, size)) = self.exited_order.pop_front() else {
                break;
            };
            self.exited_bytes = self.exited_bytes.saturating_sub(size);
            if self.workers.get(&old).is_some_and(|w| w.active_below > 0) {
                continue;
            }
            // Forgotten from its parent's list too, so a long-lived parent's list holds at
            // most the history, not every child it ever had.
            if let Some(gone) = self.workers.remove(&old) {
                if let Some(p) = gone
                    .manifest
                    .parent_id
                    .as_ref()
                    .and_then(|p| self.workers.get_mut(p))
                {
                    p.children.retain(|c| c != &old);
                }
            }
        }
    }

    pub fn active(&self) -> impl Iterator<Item = (&WorkerId, &WorkerRecord)> {
        self.workers.iter().filter(|(_, w)| w.state.is_active())
    }

    pub fn active_mut(&mut self) -> impl Iterator<Item = (&WorkerId, &mut WorkerRecord)> {
        self.workers.iter_mut().filter(|(_, w)| w.state.is_active())
    }

    pub fn all(&self) -> impl Iterator<Item = (&WorkerId, &WorkerRecord)> {
        self.workers.iter()
    }

    /// `id` and all its descendants that are still active, parents first.
    pub fn subtree(&self, id: &WorkerId) -> Vec<WorkerId> {
        let mut out = Vec::new();
        let mut stack = vec![id.clone()];
        while let Some(cur) = stack.pop() {
            if let Some(w) = self.workers.get(&cur) {
                if w.state.is_active() {
                    out.push(cur.clone());
                }
                stack.extend(w.children.iter().rev().cloned());
            }
        }
        out
    }

    pub fn info(&self, id: &WorkerId, w: &WorkerRecord, now_ms: u64) -> WorkerInfo {
        WorkerInfo {
            worker_id: id.clone(),
            parent_id: w.manifest.parent_id.clone(),
            depth: w.manifest.depth.get(),
            state: w.state.as_str().to_string(),
            pid: w.pid,
            // A preview: a worker picks its children's commands (up to 64 KiB each).
            command: super::bounded::command_preview(&w.manifest.command),
            profile: w.manifest.profile.clone(),
            resources: w.manifest.resources.clone(),
            started_at_ms: w.started_at_ms,
            last_heartbeat_ms_ago: w.last_heartbeat_ms.map(|t| now_ms.saturating_sub(t)),
            children: w.children.clone(),
            usage: w.final_usage.clone(),
            exit: w.exit.clone(),
        }
    }
}
