//! Which replication requests need a person's approval (seed 002: human-in-the-loop for
//! creation; seed 003: an approval workflow with auto-approve rules).
//!
//! A request the contract allows is held for approval when any `require` rule matches it
//! and no `auto_approve` rule does. The contract file's `[approval]` table:
//!
//! ```toml
//! [approval]
//! timeout_seconds = 300      # undecided requests are denied after this (1..=86400)
//! max_pending = 32           # beyond this many waiting, new requests are denied (1..=10000)
//! max_pending_per_worker = 4 # beyond this many of one worker's, its new ones are denied
//! require = [
//!   { kind = "depth_at_least", depth = 2 },
//!   { kind = "network" },              # asks for network beyond the controller
//!                                      # (allow_external, or any allow_hosts entry)
//!   { kind = "memory_above", mb = 512 },
//!   { kind = "cpus_above", cores = 1.0 },
//!   { kind = "profile_change" },       # a profile other than the parent's
//!   { kind = "writable_paths" },       # any read-write exposure
//!   { kind = "always" },               # every creation
//! ]
//! [[approval.auto_approve]]            # all given fields must hold
//! name = "small strict jobs"
//! profile = "strict"
//! max_memory_mb = 128
//! max_cpus = 0.25
//! command_prefix = ["python3", "/work/task.py"]
//! ```
//!
//! Decisions are pure: nothing here waits, keeps time or does I/O.

use serde::{Deserialize, Serialize};

use crate::manifest::{Manifest, ProfileName, SpawnRequest};

pub const MAX_RULES: usize = 64;
pub const MAX_TIMEOUT_SECONDS: u64 = 86_400;
pub const MAX_PENDING: usize = 10_000;

fn default_timeout() -> u64 {
    300
}

/// One worker's share of the queue when the contract does not say.
const DEFAULT_PENDING_PER_WORKER: usize = 4;

fn default_max_pending() -> usize {
    32
}

/// A condition under which a request needs a person.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RequireRule {
    Always,
    DepthAtLeast { depth: u32 },
    Network,
    MemoryAbove { mb: u64 },
    CpusAbove { cores: f64 },
    ProfileChange,
    WritablePaths,
}

impl RequireRule {
    /// Why this rule holds for the request, if it does.
    fn matches(
        &self,
        parent: &Manifest,
        request: &SpawnRequest,
        child_depth: u32,
    ) -> Option<String> {
        let r = &request.resources;
        match self {
            RequireRule::Always => Some("every creation needs approval".into()),
            RequireRule::DepthAtLeast { depth } => {
                (child_depth >= *depth).then(|| format!("depth {child_depth} is at least {depth}"))
            }
            RequireRule::Network => {
                let net = &r.network_policy;
                if net.allow_external {
                    Some("asks for network access beyond the controller".into())
                } else if !net.allow_hosts.is_empty() {
                    Some(format!(
                        "asks to reach hosts beyond the controller: {}",
                        host_summary(net.allow_hosts.entries())
                    ))
                } else {
                    None
                }
            }
            RequireRule::MemoryAbove { mb } => (r.memory_limit_mb.get() > *mb).then(|| {
                format!(
                    "asks for {} MiB of memory, above {mb}",
                    r.memory_limit_mb.get()
                )
            }),
            RequireRule::CpusAbove { cores } => (r.cpu_limit.get() > *cores)
                .then(|| format!("asks for {} cores, above {cores}", r.cpu_limit.get())),
            RequireRule::ProfileChange => (request.profile != parent.profile).then(|| {
                format!(
                    "asks for profile {} where its parent has {}",
                    request.profile, parent.profile
                )
            }),
            RequireRule::WritablePaths => (!request.filesystem.read_write.is_empty())
                .then(|| "asks for read-write paths".into()),
        }
    }
}

/// The first few entries of an allowlist, and how many more (a reason stays one short line).
fn host_summary(entries: &[crate::egress::AllowHost]) -> String {
    const SHOWN: usize = 3;
    let mut text: Vec<String> = entries
        .iter()
        .take(SHOWN)
        .map(ToString::to_string)
        .collect();
    if entries.len() > SHOWN {
        text.push(format!("and {} more", entries.len() - SHOWN));
    }
    text.join(", ")
}

/// A known-safe shape of request that needs no person: every field given must hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AutoApproveRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    /// The command must start with exactly these arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_prefix: Option<Vec<String>>,
}

impl AutoApproveRule {
    fn matches(&self, request: &SpawnRequest, child_depth: u32) -> bool {
        let r = &request.resources;
        self.profile.as_ref().is_none_or(|p| *p == request.profile)
            && self.max_memory_mb.is_none_or(|m| r.memory_limit_mb.get() <= m)
            && self.max_cpus.is_none_or(|c| r.cpu_limit.get() <= c)
            && self.max_depth.is_none_or(|d| child_depth <= d)
            && self
                .command_prefix
                .as_ref()
                .is_none_or(|p| request.command.len() >= p.len() && request.command[..p.len()] == p[..])
            // An auto-approved request never widens the network.
            && !r.network_policy.allow_external
            && r.network_policy.allow_hosts.is_empty()
    }

    fn label(&self, index: usize) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("auto_approve #{}", index + 1))
    }
}

/// The `[approval]` table of a contract file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalPolicy {
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
    #[serde(default = "default_max_pending")]
    pub max_pending: usize,
    /// One worker's share of the queue: a worker filling it would hold every other
    /// worker's requests back until the deadline.
    /// Unset: 4, or `max_pending` if that is smaller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_per_worker: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub require: Vec<RequireRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub auto_approve: Vec<AutoApproveRule>,
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        ApprovalPolicy {
            timeout_seconds: default_timeout(),
            max_pending: default_max_pending(),
            max_pending_per_worker: None,
            require: Vec::new(),
            auto_approve: Vec::new(),
        }
    }
}

/// What the policy says of one request.
#[derive(Debug, Clone, PartialEq)]
pub enum ApprovalVerdict {
    NotNeeded,
    AutoApproved { rule: String, reasons: Vec<String> },
    Needed { reasons: Vec<String> },
}

impl ApprovalPolicy {
    /// How many of one worker's requests may wait at once.
    pub fn pending_per_worker(&self) -> usize {
        self.max_pending_per_worker
            .unwrap_or_else(|| DEFAULT_PENDING_PER_WORKER.min(self.max_pending))
    }

    /// Checks bounds the types cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_TIMEOUT_SECONDS).contains(&self.timeout_seconds) {
            return Err(format!(
                "approval.timeout_seconds must be 1..={MAX_TIMEOUT_SECONDS}"
            ));
        }
        if !(1..=MAX_PENDING).contains(&self.max_pending) {
            return Err(format!("approval.max_pending must be 1..={MAX_PENDING}"));
        }
        if !(1..=self.max_pending).contains(&self.pending_per_worker()) {
            return Err("approval.max_pending_per_worker must be 1..=approval.max_pending".into());
        }
        if self.require.len() + self.auto_approve.len() > MAX_RULES {
            return Err(format!("approval has more than {MAX_RULES} rules"));
        }
        for r in &self.require {
            if let RequireRule::CpusAbove { cores } = r {
                if !cores.is_finite() || *cores < 0.0 {
                    return Err(
                        "approval: cpus_above needs a finite, non-negative number of cores".into(),
                    );
                }
            }
        }
        for a in &self.auto_approve {
            if a.max_cpus.is_some_and(|c| !c.is_finite() || c < 0.0) {
                return Err(
                    "approval.auto_approve: max_cpus must be finite and non-negative".into(),
                );
            }
            if a.command_prefix.as_ref().is_some_and(|p| p.is_empty()) {
                return Err("approval.auto_approve: an empty command_prefix would match every command; omit it".into());
            }
        }
        Ok(())
    }

    /// Decides whether a child of `parent` granted `request` at `child_depth` needs a person.
    pub fn evaluate(
        &self,
        parent: &Manifest,
        request: &SpawnRequest,
        child_depth: u32,
    ) -> ApprovalVerdict {
        let reasons: Vec<String> = self
            .require
            .iter()
            .filter_map(|r| r.matches(parent, request, child_depth))
            .collect();
        if reasons.is_empty() {
            return ApprovalVerdict::NotNeeded;
        }
        match self
            .auto_approve
            .iter()
            .enumerate()
            .find(|(_, a)| a.matches(request, child_depth))
        {
            Some((i, a)) => ApprovalVerdict::AutoApproved {
                rule: a.label(i),
                reasons,
            },
            None => ApprovalVerdict::Needed { reasons },
        }
    }
}
