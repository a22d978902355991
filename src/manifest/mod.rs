//! The manifest: what the controller grants one worker, signed so that a worker can neither
//! forge nor alter it.
//!
//! A [`Manifest`] carries the worker's identity and lineage (`worker_id`, `parent_id`,
//! `depth`), its validity window and anti-replay nonce (`issued_at`, `expires_at`,
//! `nonce`), what it was given (`state_snapshot`), what the kernel enforces on it
//! ([`ResourceSpec`], [`FilesystemScope`], the security `profile`), what it runs
//! (`command`, `env`, `cwd`), and the `signature` over all of that (see [`canonical`] for
//! the exact bytes and `crate::signing` for the MAC).
//!
//! A [`SpawnRequest`] is what a worker may ask for when it replicates: the same job fields
//! and nothing else. Identity, lineage, depth and validity are not in it because the
//! controller sets them: a request that names `depth` is refused as an unknown field.
//!
//! Every number and string is a bounded type from [`fields`], so serde alone already
//! refuses absurd values; [`Manifest::from_json`] adds the size cap and the rules that
//! relate fields to each other ([`Manifest::validate`]).

pub mod canonical;
pub mod fields;

use serde::{Deserialize, Serialize};

pub use fields::{
    CpuLimit, Depth, EgressBytes, ExecPath, ExposedPath, FieldError, KeyId, MAX_DEPTH, MemoryMb,
    Nonce, OutputBytes, PidsLimit, ProfileName, StateSnapshot, TimeoutMs, UnixSeconds, WorkerId,
};

use crate::egress::AllowList;

/// Largest manifest (or spawn request) accepted as JSON. The field bounds keep every valid
/// manifest well below it, even pretty-printed with every character escaped.
pub const MAX_MANIFEST_JSON_BYTES: usize = 2 << 20;
/// Longest time a manifest may be valid for (30 days).
pub const MAX_LIFETIME_SECONDS: u64 = 30 * 24 * 3600;
/// Most paths a worker may be given, read-only and read-write together.
pub const MAX_EXPOSED_PATHS: usize = 64;
/// Most files an executable allowlist may list.
pub const MAX_ALLOW_EXEC: usize = 64;
/// Most arguments in a command, the program included.
pub const MAX_COMMAND_ARGS: usize = 1024;
/// Largest command line, all arguments together, in bytes.
pub const MAX_COMMAND_BYTES: usize = 64 << 10;
/// Most environment variables.
pub const MAX_ENV_VARS: usize = 256;
/// Largest environment, all `KEY=VALUE` strings together, in bytes.
pub const MAX_ENV_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("the document is {size} bytes; the limit is {MAX_MANIFEST_JSON_BYTES}")]
    TooLarge { size: usize },
    #[error("the document is not valid UTF-8 (at byte {offset})")]
    NotUtf8 { offset: usize },
    #[error("the document is not a valid manifest: {0}")]
    Decode(String),
    #[error("{0}")]
    Invalid(#[from] FieldError),
    #[error("cannot encode: {0}")]
    Encode(String),
}

/// Network access of a worker (seed defaults: the controller only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Its socket to the controller (registration, heartbeats, replication requests).
    pub allow_controller: bool,
    /// The host's whole network. Off unless granted (and a controller refuses it: workers
    /// reach named hosts only, through `allow_hosts`).
    pub allow_external: bool,
    /// The hosts the worker may reach through an egress broker outside its sandbox, as
    /// canonical `HOST:PORT` entries (see [`crate::egress::AllowHost`]); at most
    /// [`AllowList::MAX_ENTRIES`], a repeat dropped. Empty (absent in JSON): none.
    #[serde(default, skip_serializing_if = "AllowList::is_empty")]
    pub allow_hosts: AllowList,
    /// Bytes the worker may move through the broker, both ways together; absent for no
    /// budget. Only with `allow_hosts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_egress_bytes: Option<EgressBytes>,
}

impl Default for NetworkPolicy {
    fn default() -> Self {
        NetworkPolicy {
            allow_controller: true,
            allow_external: false,
            allow_hosts: AllowList::default(),
            max_egress_bytes: None,
        }
    }
}

impl NetworkPolicy {
    /// Whether the worker reaches any host (named ones, or any public one).
    pub fn reaches_hosts(&self) -> bool {
        self.allow_external || !self.allow_hosts.is_empty()
    }

    /// The hosts the worker's broker lets it reach.
    pub fn egress_list(&self) -> AllowList {
        if self.allow_external {
            self.allow_hosts.clone().with_any_public()
        } else {
            self.allow_hosts.clone()
        }
    }

    /// The rules the field types cannot check alone: no allowed host on a port the
    /// sandbox keeps for the broker itself (its DNS stub and proxy listen there), and a
    /// byte budget only for hosts that are allowed.
    pub fn validate(&self) -> Result<(), FieldError> {
        let [dns, proxy] = crate::egress::BROKER_PORTS;
        if let Some(e) = self
            .allow_hosts
            .entries()
            .iter()
            .find(|e| crate::egress::BROKER_PORTS.contains(&e.port))
        {
            return Err(FieldError::new(
                "allow_hosts",
                format!(
                    "{e}: port {} is the egress broker's own inside the sandbox ({dns}: its DNS stub, {proxy}: its proxy), so it cannot be allowed",
                    e.port
                ),
            ));
        }
        if self.max_egress_bytes.is_some() && !self.reaches_hosts() {
            return Err(FieldError::new(
                "max_egress_bytes",
                "a byte budget applies to the hosts in allow_hosts, and none is listed (leave it out, or allow a host)",
            ));
        }
        Ok(())
    }
}

/// What the kernel enforces on a worker's sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceSpec {
    pub cpu_limit: CpuLimit,
    pub memory_limit_mb: MemoryMb,
    pub pids_limit: PidsLimit,
    pub timeout_ms: TimeoutMs,
    pub network_policy: NetworkPolicy,
    /// Cap on stdout and stderr together; absent for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<OutputBytes>,
}

/// Host paths exposed to the worker at the same path inside its sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesystemScope {
    pub read_only: Vec<ExposedPath>,
    pub read_write: Vec<ExposedPath>,
    /// An executable allowlist: when present, the only files the worker may execute (the
    /// dynamic loader they name is added by the sandbox). Absent: whatever the profile
    /// allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_exec: Option<Vec<ExecPath>>,
}

impl FilesystemScope {
    /// Every exposed path with whether it is writable.
    pub fn exposures(&self) -> impl Iterator<Item = (&ExposedPath, bool)> {
        self.read_only
            .iter()
            .map(|p| (p, false))
            .chain(self.read_write.iter().map(|p| (p, true)))
    }
}

/// Where a worker sits in the lineage. Set by the controller, never taken from a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    pub worker_id: WorkerId,
    pub parent_id: Option<WorkerId>,
    pub depth: Depth,
}

impl Lineage {
    /// A root worker: no parent, depth 0.
    pub fn root(worker_id: WorkerId) -> Lineage {
        Lineage {
            worker_id,
            parent_id: None,
            depth: Depth::ROOT,
        }
    }
}

/// When a manifest is valid: from `issued_at` (inclusive) to `expires_at` (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub issued_at: UnixSeconds,
    pub expires_at: UnixSeconds,
}

impl Validity {
    /// `issued_at = now`, `expires_at = now + lifetime`, checked against the bounds.
    pub fn starting_at(now: u64, lifetime_seconds: u64) -> Result<Validity, FieldError> {
        let issued_at = UnixSeconds::new(now)?;
        let end = now
            .checked_add(lifetime_seconds)
            .ok_or_else(|| FieldError::new("expires_at", "overflows"))?;
        let v = Validity {
            issued_at,
            expires_at: UnixSeconds::new(end)?,
        };
        v.check()?;
        Ok(v)
    }

    fn check(&self) -> Result<(), FieldError> {
        let (from, to) = (self.issued_at.get(), self.expires_at.get());
        if to <= from {
            return Err(FieldError::new(
                "expires_at",
                format!("{to} is not after issued_at {from}"),
            ));
        }
        if to - from > MAX_LIFETIME_SECONDS {
            return Err(FieldError::new(
                "expires_at",
                format!(
                    "the manifest would be valid for {} s; the maximum is {MAX_LIFETIME_SECONDS} s",
                    to - from
                ),
            ));
        }
        Ok(())
    }
}

/// What a worker asks for when it replicates, and the job part of every manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnRequest {
    pub resources: ResourceSpec,
    pub filesystem: FilesystemScope,
    pub profile: ProfileName,
    pub command: Vec<String>,
    pub env: Vec<String>,
    pub cwd: Option<String>,
    pub state_snapshot: StateSnapshot,
}

impl SpawnRequest {
    /// Decodes a request from JSON (size cap, UTF-8, unknown fields refused, every rule of
    /// [`SpawnRequest::validate`]).
    pub fn from_json(bytes: &[u8]) -> Result<SpawnRequest, ManifestError> {
        let text = json_text(bytes)?;
        let req: SpawnRequest =
            serde_json::from_str(text).map_err(|e| ManifestError::Decode(e.to_string()))?;
        req.validate()?;
        Ok(req)
    }

    /// The rules no single field can check alone.
    pub fn validate(&self) -> Result<(), FieldError> {
        self.resources.network_policy.validate()?;
        validate_job(
            &self.filesystem,
            &self.command,
            &self.env,
            self.cwd.as_deref(),
        )
    }
}

/// The signed grant for one worker. See the module documentation and the README
/// ("Manifests and the replication contract") for every field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Which key of the controller's keyring signed this manifest.
    pub key_id: KeyId,
    pub worker_id: WorkerId,
    /// `None` exactly for a root worker (depth 0).
    pub parent_id: Option<WorkerId>,
    pub depth: Depth,
    pub issued_at: UnixSeconds,
    pub expires_at: UnixSeconds,
    pub nonce: Nonce,
    pub state_snapshot: StateSnapshot,
    pub resources: ResourceSpec,
    pub filesystem: FilesystemScope,
    pub profile: ProfileName,
    pub command: Vec<String>,
    pub env: Vec<String>,
    /// Working directory inside the sandbox (`/` when absent).
    pub cwd: Option<String>,
    /// HMAC-SHA256 over [`canonical::encode`] of every other field, 64 lowercase hex
    /// digits; empty when unsigned.
    #[serde(default)]
    pub signature: String,
}

impl Manifest {
    /// An unsigned manifest (empty signature) from its parts; `crate::signing` signs it.
    pub fn unsigned(
        key_id: KeyId,
        lineage: Lineage,
        validity: Validity,
        nonce: Nonce,
        job: SpawnRequest,
    ) -> Manifest {
        Manifest {
            key_id,
            worker_id: lineage.worker_id,
            parent_id: lineage.parent_id,
            depth: lineage.depth,
            issued_at: validity.issued_at,
            expires_at: validity.expires_at,
            nonce,
            state_snapshot: job.state_snapshot,
            resources: job.resources,
            filesystem: job.filesystem,
            profile: job.profile,
            command: job.command,
            env: job.env,
            cwd: job.cwd,
            signature: String::new(),
        }
    }

    /// Decodes a manifest: at most [`MAX_MANIFEST_JSON_BYTES`], UTF-8, JSON, no unknown or
    /// duplicate fields, every field within bounds, and [`Manifest::validate`]. The
    /// signature is not checked here (that is `ManifestSigner::verify`).
    pub fn from_json(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let text = json_text(bytes)?;
        let m: Manifest =
            serde_json::from_str(text).map_err(|e| ManifestError::Decode(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    /// Pretty-printed JSON, the form `hatchery manifest issue` prints.
    pub fn to_json(&self) -> Result<String, ManifestError> {
        serde_json::to_string_pretty(self).map_err(|e| ManifestError::Encode(e.to_string()))
    }

    pub fn lineage(&self) -> Lineage {
        Lineage {
            worker_id: self.worker_id.clone(),
            parent_id: self.parent_id.clone(),
            depth: self.depth,
        }
    }

    pub fn validity(&self) -> Validity {
        Validity {
            issued_at: self.issued_at,
            expires_at: self.expires_at,
        }
    }

    /// The rules no single field can check alone: lineage consistency, the validity
    /// window, and the job's lists.
    pub fn validate(&self) -> Result<(), FieldError> {
        match (&self.parent_id, self.depth.get()) {
            (None, 0) => {}
            (None, d) => {
                return Err(FieldError::new(
                    "parent_id",
                    format!("missing for a worker at depth {d}"),
                ));
            }
            (Some(_), 0) => {
                return Err(FieldError::new(
                    "parent_id",
                    "a worker at depth 0 is a root and has no parent",
                ));
            }
            (Some(p), _) if *p == self.worker_id => {
                return Err(FieldError::new(
                    "parent_id",
                    "a worker cannot be its own parent",
                ));
            }
            (Some(_), _) => {}
        }
        self.validity().check()?;
        self.resources.network_policy.validate()?;
        validate_job(
            &self.filesystem,
            &self.command,
            &self.env,
            self.cwd.as_deref(),
        )
    }

    /// Whether the manifest has stopped being valid at `now`.
    pub fn is_expired(&self, now: u64) -> bool {
        now >= self.expires_at.get()
    }
}

/// Checks the size cap and UTF-8 before JSON parsing sees the bytes.
fn json_text(bytes: &[u8]) -> Result<&str, ManifestError> {
    if bytes.len() > MAX_MANIFEST_JSON_BYTES {
        return Err(ManifestError::TooLarge { size: bytes.len() });
    }
    std::str::from_utf8(bytes).map_err(|e| ManifestError::NotUtf8 {
        offset: e.valid_up_to(),
    })
}

/// The rules shared by a manifest and a spawn request.
fn validate_job(
    fs: &FilesystemScope,
    command: &[String],
    env: &[String],
    cwd: Option<&str>,
) -> Result<(), FieldError> {
    let paths = fs.read_only.len() + fs.read_write.len();
    if paths > MAX_EXPOSED_PATHS {
        return Err(FieldError::new(
            "filesystem",
            format!("{paths} paths; the maximum is {MAX_EXPOSED_PATHS}"),
        ));
    }
    let all: Vec<&ExposedPath> = fs.exposures().map(|(p, _)| p).collect();
    if let Some(p) = first_duplicate(&all) {
        return Err(FieldError::new(
            "filesystem",
            format!("{p} is exposed twice"),
        ));
    }
    if let Some(allow) = &fs.allow_exec {
        if allow.is_empty() {
            return Err(FieldError::new(
                "allow_exec",
                "an empty allowlist would let nothing run (leave it out for none)",
            ));
        }
        if allow.len() > MAX_ALLOW_EXEC {
            return Err(FieldError::new(
                "allow_exec",
                format!("{} files; the maximum is {MAX_ALLOW_EXEC}", allow.len()),
            ));
        }
        let files: Vec<&ExecPath> = allow.iter().collect();
        if let Some(p) = first_duplicate(&files) {
            return Err(FieldError::new(
                "allow_exec",
                format!("{p} is listed twice"),
            ));
        }
    }

    match command.first() {
        None => return Err(FieldError::new("command", "empty")),
        Some(program) if program.is_empty() => {
            return Err(FieldError::new("command", "the program name is empty"));
        }
        Some(_) => {}
    }
    if command.len() > MAX_COMMAND_ARGS {
        return Err(FieldError::new(
            "command",
            format!(
                "{} arguments; the maximum is {MAX_COMMAND_ARGS}",
                command.len()
            ),
        ));
    }
    let bytes: usize = command.iter().map(String::len).sum();
    if bytes > MAX_COMMAND_BYTES {
        return Err(FieldError::new(
            "command",
            format!("{bytes} bytes; the maximum is {MAX_COMMAND_BYTES}"),
        ));
    }
    if command.iter().any(|a| a.contains('\0')) {
        return Err(FieldError::new("command", "an argument contains NUL"));
    }

    if env.len() > MAX_ENV_VARS {
        return Err(FieldError::new(
            "env",
            format!("{} variables; the maximum is {MAX_ENV_VARS}", env.len()),
        ));
    }
    let bytes: usize = env.iter().map(String::len).sum();
    if bytes > MAX_ENV_BYTES {
        return Err(FieldError::new(
            "env",
            format!("{bytes} bytes; the maximum is {MAX_ENV_BYTES}"),
        ));
    }
    let mut keys = std::collections::BTreeSet::new();
    for (i, assignment) in env.iter().enumerate() {
        let (key, _) = split_env(assignment).ok_or_else(|| {
            FieldError::new(
                "env",
                format!("entry {i} is not KEY=VALUE (a non-empty name without spaces, '=' or NUL)"),
            )
        })?;
        if !keys.insert(key) {
            return Err(FieldError::new("env", format!("{key} is set twice")));
        }
    }

    if let Some(cwd) = cwd {
        fields::check_normal_path("cwd", cwd)?;
    }
    Ok(())
}

/// The first item that occurs twice. Lists are short (bounded above), so small ones are
/// compared pairwise without allocating; long ones are sorted.
fn first_duplicate<T: Ord + Copy>(items: &[T]) -> Option<T> {
    if items.len() <= 16 {
        return items
            .iter()
            .enumerate()
            .find(|(i, a)| items[..*i].contains(a))
            .map(|(_, a)| *a);
    }
    let mut sorted = items.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// Splits `KEY=VALUE` at the first `=`; `None` unless the name is non-empty without
/// whitespace or NUL and the value has no NUL.
pub fn split_env(assignment: &str) -> Option<(&str, &str)> {
    let (k, v) = assignment.split_once('=')?;
    if k.is_empty() || k.bytes().any(|b| b == 0 || b.is_ascii_whitespace()) || v.contains('\0') {
        return None;
    }
    Some((k, v))
}

#[cfg(test)]
pub(crate) mod tests;
