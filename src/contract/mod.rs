//! The replication contract: who may create whom.
//!
//! [`ReplicationContract::can_spawn`] decides a replication request from a registered
//! worker. It runs these checks in this order and returns the first refusal (seed 001's
//! data flow, extended with stop conditions and capability narrowing):
//!
//! 1. kill switch — engaged: nothing new starts (`deny_kill_switch`);
//! 2. quota — `max_replicas` workers already active (`deny_quota`);
//! 3. cooldown — the parent started a child less than `cooldown_seconds` ago
//!    (`deny_cooldown`);
//! 4. depth — the child's depth, always the parent's + 1, would exceed `max_depth`
//!    (`deny_depth`);
//! 5. stop conditions — the first that fires (`deny_stop_condition`);
//! 6. capability narrowing — the request is well-formed (`deny_invalid_request`) and asks
//!    for nothing beyond the parent's grant ([`narrowing`], `deny_narrowing`).
//!
//! An allowed request is `replication_requested` in the audit trail. The child's lineage
//! and validity are then set by the contract ([`ReplicationContract::child_lineage`],
//! [`ReplicationContract::child_validity`]), never taken from the request; a request has
//! no field that could carry them. [`ReplicationContract::issue_child`] does all of it.
//!
//! [`ReplicationContract::admit`] re-checks a worker when it registers (kill switch,
//! quota, depth, stop conditions): the seed evaluates stop conditions "during worker
//! registration", and the registry may have changed since the request was allowed.
//!
//! Decisions are pure: the registry is read through [`RegistryView`], which the
//! controller implements over its own state; nothing here does I/O or keeps time.

pub mod approval;
pub mod file;
pub mod narrowing;
pub mod stop;

use std::collections::BTreeMap;
use std::fmt;

use crate::manifest::{
    FieldError, Lineage, MAX_DEPTH, MAX_LIFETIME_SECONDS, Manifest, SpawnRequest, Validity,
    WorkerId,
};
use crate::signing::{ManifestSigner, SignError};

pub use file::{ClusterConfig, ContractConfig, ContractError, StopConditionConfig};
pub use narrowing::{NarrowingViolation, ProfileNarrowing};
pub use stop::{
    CpuBudget, LifetimeTotal, MemoryBudget, ReplicationContext, SpawnRate, StopCondition,
};

/// Built-in defaults (a contract file may override each).
pub const DEFAULT_MAX_DEPTH: u32 = 3;
pub const DEFAULT_MAX_REPLICAS: u64 = 8;
pub const DEFAULT_COOLDOWN_SECONDS: u64 = 5;
pub const DEFAULT_EXPIRATION_SECONDS: u64 = 3600;

/// What the contract needs to know about the live registry. The controller implements it
/// over its registry; [`RegistrySnapshot`] is a plain-data implementation.
///
/// "Active" means registered and not yet gone (exited, killed, reaped); a worker being
/// decided on is not counted yet.
pub trait RegistryView {
    fn kill_switch_engaged(&self) -> bool;
    /// Number of active workers.
    fn active_count(&self) -> u64;
    /// When `parent` last started a child (seconds since the epoch), if ever.
    fn last_spawn_by(&self, parent: &WorkerId) -> Option<u64>;
    /// Sum of the memory limits of active workers, in MiB.
    fn total_memory_limit_mb(&self) -> u64;
    /// Sum of the CPU quotas of active workers, in cores.
    fn total_cpu_limit(&self) -> f64;
    /// Number of workers started (roots included) at or after `since`.
    fn spawns_since(&self, since: u64) -> u64;
    /// Number of workers ever started under this controller.
    fn lifetime_total(&self) -> u64;
}

/// A registry reduced to the numbers the contract reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegistrySnapshot {
    pub kill_switch_engaged: bool,
    pub active_count: u64,
    pub total_memory_limit_mb: u64,
    pub total_cpu_limit: f64,
    /// Start time of every worker started so far (only the recent ones matter).
    pub spawn_times: Vec<u64>,
    pub last_spawn: BTreeMap<WorkerId, u64>,
    pub lifetime_total: u64,
}

impl RegistryView for RegistrySnapshot {
    fn kill_switch_engaged(&self) -> bool {
        self.kill_switch_engaged
    }
    fn active_count(&self) -> u64 {
        self.active_count
    }
    fn last_spawn_by(&self, parent: &WorkerId) -> Option<u64> {
        self.last_spawn.get(parent).copied()
    }
    fn total_memory_limit_mb(&self) -> u64 {
        self.total_memory_limit_mb
    }
    fn total_cpu_limit(&self) -> f64 {
        self.total_cpu_limit
    }
    fn spawns_since(&self, since: u64) -> u64 {
        self.spawn_times.iter().filter(|t| **t >= since).count() as u64
    }
    fn lifetime_total(&self) -> u64 {
        self.lifetime_total
    }
}

/// Why a worker may not be created.
#[derive(Debug, Clone, PartialEq)]
pub enum DenyReason {
    KillSwitch,
    Quota {
        active: u64,
        max_replicas: u64,
    },
    Cooldown {
        parent: WorkerId,
        remaining_seconds: u64,
    },
    Depth {
        /// The depth the new worker would have (may exceed [`MAX_DEPTH`]).
        depth: u64,
        max_depth: u32,
    },
    StopCondition {
        name: String,
        description: String,
    },
    InvalidRequest(FieldError),
    Narrowing(NarrowingViolation),
    /// The cluster's shared state cannot be read or written now (etcd unreachable, this
    /// node's lease not renewed): nothing is admitted on a guess.
    ClusterUnavailable(String),
}

impl DenyReason {
    /// The audit trail's event name for this refusal.
    pub fn audit_event(&self) -> &'static str {
        match self {
            DenyReason::KillSwitch => "deny_kill_switch",
            DenyReason::Quota { .. } => "deny_quota",
            DenyReason::Cooldown { .. } => "deny_cooldown",
            DenyReason::Depth { .. } => "deny_depth",
            DenyReason::StopCondition { .. } => "deny_stop_condition",
            DenyReason::InvalidRequest(_) => "deny_invalid_request",
            DenyReason::Narrowing(_) => "deny_narrowing",
            DenyReason::ClusterUnavailable(_) => "deny_cluster_unavailable",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::KillSwitch => f.write_str("the kill switch is engaged"),
            DenyReason::Quota {
                active,
                max_replicas,
            } => write!(
                f,
                "quota: {active} workers are active; max_replicas is {max_replicas}"
            ),
            DenyReason::Cooldown {
                parent,
                remaining_seconds,
            } => write!(
                f,
                "cooldown: {parent} may start its next child in {remaining_seconds} s"
            ),
            DenyReason::Depth { depth, max_depth } => write!(
                f,
                "depth: the new worker would be at depth {depth}; max_depth is {max_depth}"
            ),
            DenyReason::StopCondition { name, description } => {
                write!(f, "stop condition {name} fired: {description}")
            }
            DenyReason::InvalidRequest(e) => write!(f, "invalid request: {e}"),
            DenyReason::Narrowing(v) => write!(f, "capability narrowing: {v}"),
            DenyReason::ClusterUnavailable(why) => write!(f, "the cluster is unavailable: {why}"),
        }
    }
}

/// The outcome of a contract check.
#[must_use]
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Allow,
    Deny(DenyReason),
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow)
    }

    /// The audit trail's event name: `replication_requested` for an allowed replication,
    /// the reason's event otherwise.
    pub fn audit_event(&self) -> &'static str {
        match self {
            Decision::Allow => "replication_requested",
            Decision::Deny(r) => r.audit_event(),
        }
    }

    /// `Ok(())` when allowed.
    pub fn into_result(self) -> Result<(), DenyReason> {
        match self {
            Decision::Allow => Ok(()),
            Decision::Deny(r) => Err(r),
        }
    }
}

/// Why [`ReplicationContract::issue_child`] made no manifest.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("replication denied: {0}")]
    Denied(DenyReason),
    #[error(transparent)]
    Sign(#[from] SignError),
}

/// The replication policy. Fields are public for code that builds a contract; a contract
/// file goes through [`ContractConfig`], which bounds every value. Any value is safe to
/// decide with: no check overflows, and depth can never exceed [`MAX_DEPTH`].
#[derive(Debug)]
pub struct ReplicationContract {
    /// Deepest generation allowed (the root is 0).
    pub max_depth: u32,
    /// Most workers active at once, roots included.
    pub max_replicas: u64,
    /// Least time between two children of one parent.
    pub cooldown_seconds: u64,
    /// Lifetime of a manifest: after it the worker is expired (seed: "auto-shutdown").
    pub expiration_seconds: u64,
    pub stop_conditions: Vec<Box<dyn StopCondition>>,
    pub profile_narrowing: ProfileNarrowing,
    /// Which allowed requests still wait for a person.
    pub approval: approval::ApprovalPolicy,
    /// The operator's name resolution for workers' egress brokers (`[egress.resolve]`).
    pub egress_resolution: crate::egress::Resolution,
    /// `[cluster]`: the cluster the controller joins, as the file says.
    pub cluster: ClusterConfig,
}

impl ReplicationContract {
    /// How far back the spawn history must reach for every stop condition (seconds).
    pub fn history_seconds(&self) -> u64 {
        self.stop_conditions
            .iter()
            .map(|c| c.history_seconds())
            .max()
            .unwrap_or(0)
    }
}

impl Default for ReplicationContract {
    fn default() -> Self {
        ReplicationContract {
            max_depth: DEFAULT_MAX_DEPTH,
            max_replicas: DEFAULT_MAX_REPLICAS,
            cooldown_seconds: DEFAULT_COOLDOWN_SECONDS,
            expiration_seconds: DEFAULT_EXPIRATION_SECONDS,
            stop_conditions: Vec::new(),
            profile_narrowing: ProfileNarrowing::new(),
            approval: approval::ApprovalPolicy::default(),
            egress_resolution: crate::egress::Resolution::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

/// How many whole seconds must separate two spawns' times for `cooldown` seconds to have
/// passed between them. Times are whole seconds (the clock's, cut): a spawn at x.987 s and
/// one at x+1.000 s are one "second" apart, 13 ms in truth. One second more than the
/// cooldown is at least the cooldown, whatever the fractions were (at most a second
/// longer).
fn cooldown_in_whole_seconds(cooldown: u64) -> u64 {
    if cooldown == 0 {
        0
    } else {
        cooldown.saturating_add(1)
    }
}

impl ReplicationContract {
    fn check_kill_switch(registry: &dyn RegistryView) -> Result<(), DenyReason> {
        if registry.kill_switch_engaged() {
            return Err(DenyReason::KillSwitch);
        }
        Ok(())
    }

    fn check_quota(&self, registry: &dyn RegistryView) -> Result<(), DenyReason> {
        let active = registry.active_count();
        if active >= self.max_replicas {
            return Err(DenyReason::Quota {
                active,
                max_replicas: self.max_replicas,
            });
        }
        Ok(())
    }

    fn check_depth(&self, depth: u64) -> Result<(), DenyReason> {
        if depth > u64::from(self.max_depth.min(MAX_DEPTH)) {
            return Err(DenyReason::Depth {
                depth,
                max_depth: self.max_depth,
            });
        }
        Ok(())
    }

    fn check_stop_conditions(&self, ctx: &ReplicationContext<'_>) -> Result<(), DenyReason> {
        match self.stop_conditions.iter().find(|c| c.fires(ctx)) {
            Some(c) => Err(DenyReason::StopCondition {
                name: c.name().to_string(),
                description: c.description(),
            }),
            None => Ok(()),
        }
    }

    fn spawn_checks(
        &self,
        parent: &Manifest,
        request: &SpawnRequest,
        registry: &dyn RegistryView,
        now: u64,
    ) -> Result<(), DenyReason> {
        Self::check_kill_switch(registry)?;
        self.check_quota(registry)?;
        if let Some(last) = registry.last_spawn_by(&parent.worker_id) {
            // A last spawn "in the future" (a clock stepped back) counts as now.
            let elapsed = now.saturating_sub(last);
            let needed = cooldown_in_whole_seconds(self.cooldown_seconds);
            if elapsed < needed {
                return Err(DenyReason::Cooldown {
                    parent: parent.worker_id.clone(),
                    remaining_seconds: needed.saturating_sub(elapsed),
                });
            }
        }
        let depth = u64::from(parent.depth.get()) + 1;
        self.check_depth(depth)?;
        self.check_stop_conditions(&ReplicationContext {
            registry,
            parent_id: Some(&parent.worker_id),
            depth: depth as u32,
            candidate: &request.resources,
            now,
        })?;
        request.validate().map_err(DenyReason::InvalidRequest)?;
        narrowing::check(parent, request, &self.profile_narrowing, now)
            .map_err(DenyReason::Narrowing)
    }

    /// Decides whether the registered worker `parent` (its verified manifest) may start a
    /// child granted `request`, at `now` (seconds since the epoch). See the module
    /// documentation for the checks and their order.
    pub fn can_spawn(
        &self,
        parent: &Manifest,
        request: &SpawnRequest,
        registry: &dyn RegistryView,
        now: u64,
    ) -> Decision {
        match self.spawn_checks(parent, request, registry, now) {
            Ok(()) => Decision::Allow,
            Err(r) => Decision::Deny(r),
        }
    }

    /// Decides whether a worker holding the verified `manifest` may register now (kill
    /// switch, quota, depth, stop conditions). Used for root workers and again for every
    /// child when it registers.
    pub fn admit(&self, manifest: &Manifest, registry: &dyn RegistryView, now: u64) -> Decision {
        let checks = || -> Result<(), DenyReason> {
            Self::check_kill_switch(registry)?;
            self.check_quota(registry)?;
            self.check_depth(u64::from(manifest.depth.get()))?;
            self.check_stop_conditions(&ReplicationContext {
                registry,
                parent_id: manifest.parent_id.as_ref(),
                depth: manifest.depth.get(),
                candidate: &manifest.resources,
                now,
            })
        };
        match checks() {
            Ok(()) => Decision::Allow,
            Err(r) => Decision::Deny(r),
        }
    }

    /// The lineage of a child of `parent`: its parent id, and depth = parent's + 1.
    pub fn child_lineage(
        &self,
        parent: &Manifest,
        child_id: WorkerId,
    ) -> Result<Lineage, DenyReason> {
        let depth = u64::from(parent.depth.get()) + 1;
        self.check_depth(depth)?;
        let depth = parent.depth.child().ok_or(DenyReason::Depth {
            depth,
            max_depth: self.max_depth,
        })?;
        Ok(Lineage {
            worker_id: child_id,
            parent_id: Some(parent.worker_id.clone()),
            depth,
        })
    }

    /// The validity of a manifest issued at `now`: `expiration_seconds` long, and never
    /// beyond the parent's own expiry.
    pub fn child_validity(
        &self,
        now: u64,
        parent: Option<&Manifest>,
    ) -> Result<Validity, FieldError> {
        let lifetime = self.expiration_seconds.clamp(1, MAX_LIFETIME_SECONDS);
        let mut v = Validity::starting_at(now, lifetime)?;
        if let Some(p) = parent {
            if p.expires_at < v.expires_at {
                v.expires_at = p.expires_at;
            }
            if v.expires_at <= v.issued_at {
                return Err(FieldError::new(
                    "expires_at",
                    format!("the parent's manifest expired at {}", p.expires_at),
                ));
            }
        }
        Ok(v)
    }

    /// The only path from a replication request to a child manifest: decides with
    /// [`can_spawn`](ReplicationContract::can_spawn), then issues and signs a manifest with
    /// the lineage and validity the contract sets.
    pub fn issue_child(
        &self,
        signer: &ManifestSigner,
        parent: &Manifest,
        request: SpawnRequest,
        child_id: WorkerId,
        registry: &dyn RegistryView,
        now: u64,
    ) -> Result<Manifest, IssueError> {
        self.can_spawn(parent, &request, registry, now)
            .into_result()
            .map_err(IssueError::Denied)?;
        let lineage = self
            .child_lineage(parent, child_id)
            .map_err(IssueError::Denied)?;
        let validity = self
            .child_validity(now, Some(parent))
            .map_err(|e| IssueError::Sign(SignError::Invalid(e)))?;
        Ok(signer.issue(lineage, request, validity)?)
    }
}

#[cfg(test)]
mod tests;
