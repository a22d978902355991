//! The contract file: TOML, every key optional (built-in defaults), unknown keys refused,
//! every value bounded, errors with the line and column.
//!
//! ```toml
//! max_depth = 3              # generations below the root (0..=64)
//! max_replicas = 8           # workers active at once (1..=1000000)
//! cooldown_seconds = 5       # between two children of one parent (0..=2592000)
//! expiration_seconds = 3600  # lifetime of a manifest (1..=2592000)
//!
//! [[stop_condition]]
//! kind = "memory_budget"     # memory_budget | cpu_budget | spawn_rate | lifetime_total
//! max_total_memory_mb = 2048
//!
//! [profile_narrowing]        # profiles a worker may hand down besides its own
//! default = ["strict"]
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::manifest::fields::{bounded_int, identifier};
use crate::manifest::{MAX_DEPTH, MAX_LIFETIME_SECONDS, ProfileName};

use super::approval::ApprovalPolicy;
use super::stop::{CpuBudget, LifetimeTotal, MemoryBudget, SpawnRate, StopCondition};
use super::{
    DEFAULT_COOLDOWN_SECONDS, DEFAULT_EXPIRATION_SECONDS, DEFAULT_MAX_DEPTH, DEFAULT_MAX_REPLICAS,
    ProfileNarrowing, ReplicationContract,
};

/// Largest contract file read.
pub const MAX_CONTRACT_BYTES: usize = 64 << 10;
/// Most stop conditions in one contract.
pub const MAX_STOP_CONDITIONS: usize = 32;
/// Most profiles named in `[profile_narrowing]`, keys and values together.
pub const MAX_PROFILE_RULES: usize = 256;
/// Most spawns a spawn rate may allow in its window: what a controller remembers of
/// its spawn times. A larger `max_spawns` could never be reached, a limit parsed but not
/// enforced, so it is refused.
pub const MAX_SPAWNS_IN_WINDOW: u64 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error("contract {origin}: line {line}, column {column}: {message}")]
    Parse {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("contract {origin}: {message}")]
    Invalid { origin: String, message: String },
    #[error("cannot read contract {origin}: {source}")]
    Read {
        origin: String,
        source: std::io::Error,
    },
}

bounded_int!(
    /// `max_depth`.
    MaxDepth(u32), "max_depth", 0, MAX_DEPTH
);
bounded_int!(
    /// `max_replicas`.
    MaxReplicas(u64), "max_replicas", 1, 1_000_000
);
bounded_int!(
    /// `cooldown_seconds`.
    CooldownSeconds(u64), "cooldown_seconds", 0, MAX_LIFETIME_SECONDS
);
bounded_int!(
    /// `expiration_seconds`.
    ExpirationSeconds(u64), "expiration_seconds", 1, MAX_LIFETIME_SECONDS
);
bounded_int!(
    /// `max_total_memory_mb` of a memory budget (up to 1 PiB).
    BudgetMb(u64), "max_total_memory_mb", 1, 1 << 30
);
bounded_int!(
    /// `max_spawns` of a spawn rate.
    MaxSpawns(u64), "max_spawns", 1, MAX_SPAWNS_IN_WINDOW
);
bounded_int!(
    /// `max_workers` of a lifetime total.
    MaxWorkers(u64), "max_workers", 1, 1_000_000_000
);
bounded_int!(
    /// `window_seconds` of a spawn rate.
    WindowSeconds(u64), "window_seconds", 1, MAX_LIFETIME_SECONDS
);
identifier!(
    /// Name of a stop condition in the audit trail.
    ConditionName,
    "stop condition name"
);

/// `max_total_cpus` of a CPU budget, in cores.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct CpuBudgetCores(f64);

impl CpuBudgetCores {
    pub const MAX: f64 = 1_048_576.0;

    pub fn get(self) -> f64 {
        self.0
    }
}

impl TryFrom<f64> for CpuBudgetCores {
    type Error = String;
    fn try_from(v: f64) -> Result<Self, String> {
        if (crate::units::MIN_CPUS..=Self::MAX).contains(&v) {
            Ok(CpuBudgetCores(v))
        } else {
            Err(format!(
                "max_total_cpus: {v} is not between {} and {}",
                crate::units::MIN_CPUS,
                Self::MAX
            ))
        }
    }
}

impl From<CpuBudgetCores> for f64 {
    fn from(v: CpuBudgetCores) -> f64 {
        v.0
    }
}

/// One `[[stop_condition]]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum StopConditionConfig {
    MemoryBudget {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<ConditionName>,
        max_total_memory_mb: BudgetMb,
    },
    CpuBudget {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<ConditionName>,
        max_total_cpus: CpuBudgetCores,
    },
    SpawnRate {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<ConditionName>,
        max_spawns: MaxSpawns,
        window_seconds: WindowSeconds,
    },
    LifetimeTotal {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<ConditionName>,
        max_workers: MaxWorkers,
    },
}

impl StopConditionConfig {
    /// The name in the audit trail: the given one, or the kind.
    pub fn name(&self) -> String {
        let (given, kind) = match self {
            StopConditionConfig::MemoryBudget { name, .. } => (name, "memory_budget"),
            StopConditionConfig::CpuBudget { name, .. } => (name, "cpu_budget"),
            StopConditionConfig::SpawnRate { name, .. } => (name, "spawn_rate"),
            StopConditionConfig::LifetimeTotal { name, .. } => (name, "lifetime_total"),
        };
        given
            .as_ref()
            .map(|n| n.to_string())
            .unwrap_or_else(|| kind.to_string())
    }

    pub fn build(&self) -> Box<dyn StopCondition> {
        let name = self.name();
        match self {
            StopConditionConfig::MemoryBudget {
                max_total_memory_mb,
                ..
            } => Box::new(MemoryBudget {
                name,
                max_total_memory_mb: max_total_memory_mb.get(),
            }),
            StopConditionConfig::CpuBudget { max_total_cpus, .. } => Box::new(CpuBudget {
                name,
                max_total_cpus: max_total_cpus.get(),
            }),
            StopConditionConfig::SpawnRate {
                max_spawns,
                window_seconds,
                ..
            } => Box::new(SpawnRate {
                name,
                max_spawns: max_spawns.get(),
                window_seconds: window_seconds.get(),
            }),
            StopConditionConfig::LifetimeTotal { max_workers, .. } => Box::new(LifetimeTotal {
                name,
                max_workers: max_workers.get(),
            }),
        }
    }
}

fn default_max_depth() -> MaxDepth {
    MaxDepth::new(DEFAULT_MAX_DEPTH).unwrap_or(MaxDepth(0))
}
fn default_max_replicas() -> MaxReplicas {
    MaxReplicas::new(DEFAULT_MAX_REPLICAS).unwrap_or(MaxReplicas(1))
}
fn default_cooldown() -> CooldownSeconds {
    CooldownSeconds::new(DEFAULT_COOLDOWN_SECONDS).unwrap_or(CooldownSeconds(0))
}
fn default_expiration() -> ExpirationSeconds {
    ExpirationSeconds::new(DEFAULT_EXPIRATION_SECONDS).unwrap_or(ExpirationSeconds(1))
}

/// The contract file's contents. `Default` is the built-in contract.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContractConfig {
    #[serde(default = "default_max_depth")]
    pub max_depth: MaxDepth,
    #[serde(default = "default_max_replicas")]
    pub max_replicas: MaxReplicas,
    #[serde(default = "default_cooldown")]
    pub cooldown_seconds: CooldownSeconds,
    #[serde(default = "default_expiration")]
    pub expiration_seconds: ExpirationSeconds,
    #[serde(
        default,
        rename = "stop_condition",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub stop_conditions: Vec<StopConditionConfig>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profile_narrowing: BTreeMap<ProfileName, Vec<ProfileName>>,
    /// Which replication requests wait for a person (see [`super::approval`]).
    #[serde(default)]
    pub approval: ApprovalPolicy,
    /// The operator's egress settings for every worker's broker.
    #[serde(default, skip_serializing_if = "EgressConfig::is_empty")]
    pub egress: EgressConfig,
    /// The cluster this controller joins (`controller --cluster` wins over it).
    #[serde(default, skip_serializing_if = "ClusterConfig::is_empty")]
    pub cluster: ClusterConfig,
}

/// `[cluster]`: etcd's endpoints (`etcd = "etcd://HOST:PORT,..."`), this node's id, the
/// key prefix, the client certificate, the lease's length.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub etcd: Option<String>,
    pub node_id: Option<String>,
    pub prefix: Option<String>,
    pub cacert: Option<std::path::PathBuf>,
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
    pub lease_ttl_seconds: Option<u64>,
}

impl ClusterConfig {
    fn is_empty(&self) -> bool {
        self == &ClusterConfig::default()
    }
}

/// `[egress]`: how workers' brokers resolve names before asking the host's resolver
/// (`[egress.resolve]`, NAME = "ADDR": split horizon, and offline tests).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressConfig {
    #[serde(default)]
    pub resolve: BTreeMap<String, String>,
}

/// Most `[egress.resolve]` entries.
const MAX_RESOLVE_ENTRIES: usize = 1024;

impl EgressConfig {
    fn is_empty(&self) -> bool {
        self.resolve.is_empty()
    }

    /// The table as the brokers use it, or what is wrong with an entry.
    pub fn resolution(&self) -> Result<crate::egress::Resolution, String> {
        if self.resolve.len() > MAX_RESOLVE_ENTRIES {
            return Err(format!(
                "[egress.resolve] has {} entries; the maximum is {MAX_RESOLVE_ENTRIES}",
                self.resolve.len()
            ));
        }
        let mut table = crate::egress::Resolution::default();
        for (name, addr) in &self.resolve {
            let (name, addr) = crate::egress::Resolution::parse_entry(&format!("{name}={addr}"))
                .map_err(|e| format!("[egress.resolve] {e}"))?;
            table.insert(&name, addr);
        }
        Ok(table)
    }
}

impl Default for ContractConfig {
    fn default() -> Self {
        ContractConfig {
            max_depth: default_max_depth(),
            max_replicas: default_max_replicas(),
            cooldown_seconds: default_cooldown(),
            expiration_seconds: default_expiration(),
            stop_conditions: Vec::new(),
            profile_narrowing: BTreeMap::new(),
            approval: ApprovalPolicy::default(),
            egress: EgressConfig::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

/// The first string (a value or a key) of `v` that holds a control or format character
/// other than a newline, a tab and the zero-width (non-)joiner, and that character.
fn first_control_text(v: &serde_json::Value) -> Option<(String, char)> {
    let refused = |c: char| {
        crate::text::is_control_or_format(c) && !matches!(c, '\n' | '\t' | '\u{200c}' | '\u{200d}')
    };
    let found = |s: &str| s.chars().find(|c| refused(*c)).map(|c| (s.to_string(), c));
    match v {
        serde_json::Value::String(s) => found(s),
        serde_json::Value::Array(items) => items.iter().find_map(first_control_text),
        serde_json::Value::Object(map) => map
            .iter()
            .find_map(|(k, v)| found(k).or_else(|| first_control_text(v))),
        _ => None,
    }
}

impl ContractConfig {
    /// Parses a contract; `origin` (a path, or "builtin") names it in errors.
    pub fn from_toml(source: &str, origin: &str) -> Result<ContractConfig, ContractError> {
        let invalid = |message: String| ContractError::Invalid {
            origin: origin.to_string(),
            message,
        };
        if source.len() > MAX_CONTRACT_BYTES {
            return Err(invalid(format!(
                "{} bytes; the limit is {MAX_CONTRACT_BYTES}",
                source.len()
            )));
        }
        let config: ContractConfig =
            toml::from_str(source).map_err(|e| describe_toml_error(origin, source, &e))?;
        config.validate().map_err(invalid)?;
        Ok(config)
    }

    /// Reads and parses a contract file (at most [`MAX_CONTRACT_BYTES`], UTF-8).
    pub fn from_file(path: &Path) -> Result<ContractConfig, ContractError> {
        let origin = path.display().to_string();
        let read = |source| ContractError::Read {
            origin: origin.clone(),
            source,
        };
        let bytes = crate::paths::read_input(path, MAX_CONTRACT_BYTES).map_err(read)?;
        let text = String::from_utf8(bytes).map_err(|e| ContractError::Invalid {
            origin: origin.clone(),
            message: format!("not valid UTF-8 (at byte {})", e.utf8_error().valid_up_to()),
        })?;
        ContractConfig::from_toml(&text, &origin)
    }

    /// The rules that relate values to each other.
    fn validate(&self) -> Result<(), String> {
        // A contract's text is shown to people (`manifest contract` prints it as TOML,
        // which escapes C0 alone): none of it may drive a terminal, reorder what is drawn
        // or hide text (a contract from someone else had a CSI and a bidi override in an
        // auto-approve rule). A newline or tab in a script, and the joiners a Persian name
        // or an emoji needs, are text.
        if let Ok(tree) = serde_json::to_value(self) {
            if let Some((text, c)) = first_control_text(&tree) {
                return Err(format!(
                    "\"{}\" holds a control or format character (U+{:04X}); write the text without it",
                    crate::text::escape_controls(&crate::text::clip(&text, 100)),
                    u32::from(c)
                ));
            }
        }
        self.egress.resolution()?;
        if self.stop_conditions.len() > MAX_STOP_CONDITIONS {
            return Err(format!(
                "{} stop conditions; the maximum is {MAX_STOP_CONDITIONS}",
                self.stop_conditions.len()
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, c) in self.stop_conditions.iter().enumerate() {
            let name = c.name();
            if !names.insert(name.clone()) {
                return Err(format!(
                    "stop condition #{} is named {name:?} like an earlier one; names must be unique (set `name`)",
                    i + 1
                ));
            }
        }
        self.approval.validate()?;
        let rules: usize = self.profile_narrowing.values().map(|v| v.len() + 1).sum();
        if rules > MAX_PROFILE_RULES {
            return Err(format!(
                "profile_narrowing names {rules} profiles; the maximum is {MAX_PROFILE_RULES}"
            ));
        }
        Ok(())
    }

    /// The contract these settings describe.
    pub fn build(&self) -> ReplicationContract {
        let mut narrowing = ProfileNarrowing::new();
        for (from, to) in &self.profile_narrowing {
            narrowing
                .entry(from.clone())
                .or_default()
                .extend(to.iter().filter(|p| *p != from).cloned());
        }
        ReplicationContract {
            max_depth: self.max_depth.get(),
            max_replicas: self.max_replicas.get(),
            cooldown_seconds: self.cooldown_seconds.get(),
            expiration_seconds: self.expiration_seconds.get(),
            stop_conditions: self
                .stop_conditions
                .iter()
                .map(StopConditionConfig::build)
                .collect(),
            profile_narrowing: narrowing,
            approval: self.approval.clone(),
            egress_resolution: self.egress.resolution().unwrap_or_default(),
            cluster: self.cluster.clone(),
        }
    }

    /// The settings as a contract file (every default written out).
    pub fn to_toml(&self) -> Result<String, ContractError> {
        toml::to_string(self).map_err(|e| ContractError::Invalid {
            origin: "output".into(),
            message: e.to_string(),
        })
    }
}

impl ReplicationContract {
    /// Loads a contract file (see [`ContractConfig`]).
    pub fn from_file(path: &Path) -> Result<ReplicationContract, ContractError> {
        Ok(ContractConfig::from_file(path)?.build())
    }

    /// Parses contract TOML (see [`ContractConfig`]).
    pub fn from_toml(source: &str, origin: &str) -> Result<ReplicationContract, ContractError> {
        Ok(ContractConfig::from_toml(source, origin)?.build())
    }
}

/// Turns a toml error into one with the line and column it points at.
fn describe_toml_error(origin: &str, source: &str, err: &toml::de::Error) -> ContractError {
    // It may quote a value of the file, however long.
    let message = crate::text::clip(err.message().trim(), 300).into_owned();
    match err.span() {
        Some(span) => {
            let start = span.start.min(source.len());
            let before = source.get(..start).unwrap_or("");
            let line = before.matches('\n').count() + 1;
            let column = before
                .rfind('\n')
                .map(|i| before[i + 1..].chars().count() + 1)
                .unwrap_or(before.chars().count() + 1);
            ContractError::Parse {
                origin: origin.to_string(),
                line,
                column,
                message,
            }
        }
        None => ContractError::Invalid {
            origin: origin.to_string(),
            message,
        },
    }
}

#[cfg(test)]
mod egress_tests {
    use super::*;

    #[test]
    fn the_egress_resolve_table_is_checked_when_the_contract_is_read() {
        let good =
            "[egress.resolve]\n\"api.test\" = \"198.51.100.2\"\n\"v6.test\" = \"[2001:db8::1]\"\n";
        let c = ContractConfig::from_toml(good, "t").map(|c| c.build());
        let table = c.map(|c| c.egress_resolution).unwrap_or_default();
        assert_eq!(
            table.lookup("api.test"),
            Some(
                &["198.51.100.2"
                    .parse()
                    .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]))][..]
            )
        );
        assert!(table.lookup("v6.test").is_some());
        for bad in [
            "[egress.resolve]\n\"api.test\" = \"not-an-address\"\n",
            "[egress.resolve]\n\"bad name\" = \"198.51.100.2\"\n",
            "[egress]\nresolv = {}\n",
        ] {
            assert!(ContractConfig::from_toml(bad, "t").is_err(), "{bad}");
        }
        // A contract without the table is the contract it was.
        assert_eq!(
            ContractConfig::from_toml("max_depth = 2\n", "t")
                .map(|c| c.egress)
                .unwrap_or_else(|_| EgressConfig {
                    resolve: [("x".to_string(), "y".to_string())].into()
                }),
            EgressConfig::default()
        );
    }
}
