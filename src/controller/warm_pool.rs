//! The launcher's warm pool: sandboxes prepared while the launcher is idle, each with its
//! namespaces, id maps, loopback, cgroup and root filesystem made, waiting for the next
//! worker (see [`crate::sandbox::launch::warm`]). A launch takes one and sends it only what
//! is the worker's own, instead of starting a sandbox from nothing.
//!
//! The pool prepares the shape of the last worker that started: workers started from one
//! kind of manifest find their sandbox ready. A worker of another shape starts the
//! ordinary way, and the pool turns to its shape. The operator sizes it
//! (`--warm-pool N`). Prepared sandboxes are nobody's: they run no command, hold no
//! worker's descriptors, count against no contract or budget, and the kill switch (and a
//! fence, and the controller's stop) tears them down with the workers.

use std::collections::VecDeque;

use super::launch_protocol::LaunchSpec;
use crate::sandbox::launch::warm::Prepared;

/// Largest pool an operator may ask for.
pub const MAX_WARM_POOL: usize = 1024;

pub struct WarmPool {
    size: usize,
    ready: VecDeque<Prepared>,
    /// The launch whose shape is prepared: the last worker's (`None`: prepare nothing).
    template: Option<LaunchSpec>,
    /// Numbers the prepared sandboxes' cgroups.
    made: u64,
    /// The launcher's part of their names (read once: the launcher does not change).
    owner: String,
    /// How many sandboxes may still be prepared: the pool's size to begin with, and one
    /// more for each worker that starts (at most the size). A worker tree that alternates
    /// kinds of manifest empties the pool at each start; this keeps the launcher's work to
    /// one preparation per start rather than a pool's worth.
    credit: usize,
    /// Killed, and not yet ended: each is reaped once its pidfd says it has ended.
    retired: Vec<Prepared>,
    /// The kill switch (or a fence) cleared the pool: the prepared sandboxes are torn down
    /// once the workers are gone, and none is claimed meanwhile.
    stale: bool,
}

impl WarmPool {
    pub fn new(size: usize) -> WarmPool {
        WarmPool {
            size: size.min(MAX_WARM_POOL),
            ready: VecDeque::new(),
            template: None,
            made: 0,
            owner: crate::sandbox::cgroup::owner_suffix(),
            credit: size.min(MAX_WARM_POOL),
            retired: Vec::new(),
            stale: false,
        }
    }

    /// A prepared sandbox for the next launch, if one is ready (ended ones are dropped).
    pub fn take(&mut self) -> Option<Prepared> {
        // A pool cleared by the kill switch is never claimed from.
        self.tear_down(true);
        while let Some(p) = self.ready.pop_front() {
            if !p.has_ended() {
                return Some(p);
            }
            self.ended_unclaimed();
        }
        None
    }

    /// A prepared sandbox ended before it was claimed (its set-up failed, or something
    /// killed it): nothing more is prepared until a worker starts again, so that a kind
    /// whose set-up fails is not prepared over and over.
    fn ended_unclaimed(&mut self) {
        tracing::warn!(
            "a prepared sandbox ended before a worker claimed it; the warm pool waits for the next worker"
        );
        self.template = None;
    }

    /// A worker started from `ls`: prepare its shape from now on. Sandboxes prepared for
    /// another kind of launch are dropped (they would not fit).
    pub fn started(&mut self, ls: &LaunchSpec) {
        if self.size == 0 {
            return;
        }
        self.credit = self.credit.saturating_add(1).min(self.size);
        // A worker with egress is never prepared ahead: its listeners are handed over
        // before its broker starts.
        if ls.egress.is_some() {
            return;
        }
        if self.template.as_ref().is_some_and(|t| !same_kind(t, ls)) {
            self.retire_all();
        }
        // Its kind, not its command and environment (which may hold secrets): those come
        // with each claim, and a prepared sandbox is cloned from this.
        self.template = Some(LaunchSpec {
            command: vec!["true".into()],
            env: Vec::new(),
            ..ls.clone()
        });
    }

    /// The launch to prepare a sandbox for next, named for the pool, when one is wanted.
    pub fn wanted(&mut self) -> Option<LaunchSpec> {
        self.prune();
        if self.ready.len() >= self.size || self.credit == 0 {
            return None;
        }
        let mut ls = self.template.clone()?;
        self.credit = self.credit.saturating_sub(1);
        self.made = self.made.wrapping_add(1);
        // `_` is in no worker id: no worker's cgroup can have this name.
        ls.worker_id = format!("warm{}", self.made);
        ls.cgroup_name = format!(
            "{}_warm{}-{}",
            crate::sandbox::cgroup::NAME_PREFIX,
            self.made,
            self.owner
        );
        Some(ls)
    }

    /// A prepared sandbox taken for a launch that failed before anything was sent to it:
    /// first in line again.
    pub fn put_back(&mut self, p: Prepared) {
        if self.stale || p.has_ended() {
            return;
        }
        self.ready.push_front(p);
    }

    /// Whether a sandbox should be prepared now.
    pub fn wants_more(&self) -> bool {
        !self.stale && self.template.is_some() && self.ready.len() < self.size && self.credit > 0
    }

    /// The prepared (and retired) sandboxes' pidfds, readable once one has ended, for the
    /// launcher's poll.
    pub fn pidfds(&self) -> impl Iterator<Item = std::os::fd::BorrowedFd<'_>> {
        self.ready.iter().chain(&self.retired).map(Prepared::pidfd)
    }

    /// Drops the prepared sandboxes that have ended (reaping them and removing their
    /// cgroups).
    pub fn prune(&mut self) {
        let before = self.ready.len();
        self.ready.retain(|p| !p.has_ended());
        if self.ready.len() < before {
            self.ended_unclaimed();
        }
    }

    pub fn add(&mut self, p: Prepared) {
        self.ready.push_back(p);
    }

    /// Preparing failed: stop until a worker starts again (no retry loop on a host that
    /// refuses).
    pub fn failed(&mut self) {
        self.template = None;
    }

    /// Tears every prepared sandbox down and prepares nothing until a worker starts again
    /// (the kill switch, a fence, the controller's stop).
    pub fn clear(&mut self) {
        self.stale = true;
        self.template = None;
        self.credit = self.size;
    }

    /// Kills what [`WarmPool::clear`] left, once the workers are gone (`workers_gone`):
    /// prepared sandboxes run nothing, and the kernel's work of tearing a pool down would
    /// otherwise slow the kill switch's own.
    pub fn tear_down(&mut self, workers_gone: bool) {
        if self.stale && workers_gone {
            self.stale = false;
            self.retire_all();
        }
    }

    /// Kills every prepared sandbox; each is reaped (and its cgroup removed) once it has
    /// ended, by [`WarmPool::reap_retired`], so the launcher never waits on one.
    fn retire_all(&mut self) {
        for p in &self.ready {
            p.kill();
        }
        self.retired.extend(self.ready.drain(..));
    }

    /// Reaps the retired sandboxes that have ended and removes their cgroups.
    pub fn reap_retired(&mut self) {
        self.retired.retain(|p| !p.has_ended());
    }

    /// Tears everything down, waiting for each sandbox to end (the launcher's exit: before
    /// the cgroup backend gives back what it enabled, which it does only once no cgroup of
    /// ours is left).
    pub fn shut_down(&mut self) {
        self.stale = false;
        self.retire_all();
        self.retired.clear();
        self.template = None;
    }
}

/// Whether two launches make sandboxes of one shape as far as the manifest decides it
/// (the claim checks the whole shape again).
fn same_kind(a: &LaunchSpec, b: &LaunchSpec) -> bool {
    (
        &a.cwd,
        &a.ro,
        &a.rw,
        a.memory,
        a.pids,
        &a.profile,
        a.allow_degraded,
        &a.agent_binary,
        &a.allow_exec,
    ) == (
        &b.cwd,
        &b.ro,
        &b.rw,
        b.memory,
        b.pids,
        &b.profile,
        b.allow_degraded,
        &b.agent_binary,
        &b.allow_exec,
    ) && a.cpus.map(f64::to_bits) == b.cpus.map(f64::to_bits)
}
