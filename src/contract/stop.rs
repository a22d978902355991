//! Stop conditions: predicates over the live registry that refuse a new worker when they
//! fire. The seed's `StopCondition(name, description, predicate)`, as a trait for library
//! users, plus the built-in ones a contract file can configure.
//!
//! They are evaluated when a replication is requested (`can_spawn`) and again when a
//! worker registers (`admit`), with the candidate not yet counted in the registry: a
//! budget condition asks "would this worker push the total over the budget".

use std::fmt;

use crate::manifest::{ResourceSpec, WorkerId};

use super::RegistryView;

/// What a stop condition sees: the registry, and the worker that would be added.
pub struct ReplicationContext<'a> {
    pub registry: &'a dyn RegistryView,
    /// The candidate's parent (`None` for a root worker).
    pub parent_id: Option<&'a WorkerId>,
    /// The candidate's depth.
    pub depth: u32,
    /// The resources the candidate would hold.
    pub candidate: &'a ResourceSpec,
    /// Seconds since the Unix epoch.
    pub now: u64,
}

/// A named predicate that blocks new workers while it fires.
pub trait StopCondition: fmt::Debug + Send + Sync {
    /// Recorded in the audit trail when the condition fires (`deny_stop_condition`).
    fn name(&self) -> &str;
    /// One line for operators: what the condition protects.
    fn description(&self) -> String;
    /// True when the candidate must be refused.
    fn fires(&self, ctx: &ReplicationContext<'_>) -> bool;
    /// How far back the spawn history must reach for this condition (seconds): what a
    /// store shared between controllers keeps.
    fn history_seconds(&self) -> u64 {
        0
    }
}

/// Refuses a worker whose memory limit would push the total over active workers above
/// `max_total_memory_mb`.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryBudget {
    pub name: String,
    pub max_total_memory_mb: u64,
}

impl StopCondition for MemoryBudget {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> String {
        format!(
            "the memory limits of active workers may total at most {} MiB",
            self.max_total_memory_mb
        )
    }
    fn fires(&self, ctx: &ReplicationContext<'_>) -> bool {
        let total = ctx
            .registry
            .total_memory_limit_mb()
            .saturating_add(ctx.candidate.memory_limit_mb.get());
        total > self.max_total_memory_mb
    }
}

/// Refuses a worker whose CPU quota would push the total over active workers above
/// `max_total_cpus` cores.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuBudget {
    pub name: String,
    pub max_total_cpus: f64,
}

impl StopCondition for CpuBudget {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> String {
        format!(
            "the CPU quotas of active workers may total at most {} cores",
            self.max_total_cpus
        )
    }
    fn fires(&self, ctx: &ReplicationContext<'_>) -> bool {
        let total = ctx.registry.total_cpu_limit() + ctx.candidate.cpu_limit.get();
        // Fires unless the total is comparable and within budget: a NaN total from a
        // broken registry view fires too.
        use std::cmp::Ordering::{Equal, Less};
        !matches!(total.partial_cmp(&self.max_total_cpus), Some(Less | Equal))
    }
}

/// Refuses a worker when `max_spawns` workers were already started within the last
/// `window_seconds`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpawnRate {
    pub name: String,
    pub max_spawns: u64,
    pub window_seconds: u64,
}

impl StopCondition for SpawnRate {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> String {
        format!(
            "at most {} workers may be started in any {} s",
            self.max_spawns, self.window_seconds
        )
    }
    fn history_seconds(&self) -> u64 {
        self.window_seconds
    }
    fn fires(&self, ctx: &ReplicationContext<'_>) -> bool {
        let since = ctx.now.saturating_sub(self.window_seconds);
        ctx.registry.spawns_since(since) >= self.max_spawns
    }
}

/// Refuses a worker once `max_workers` workers were ever started under this controller.
#[derive(Debug, Clone, PartialEq)]
pub struct LifetimeTotal {
    pub name: String,
    pub max_workers: u64,
}

impl StopCondition for LifetimeTotal {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> String {
        format!("at most {} workers may ever be started", self.max_workers)
    }
    fn fires(&self, ctx: &ReplicationContext<'_>) -> bool {
        ctx.registry.lifetime_total() >= self.max_workers
    }
}
