//! The value types a manifest is made of. Each one can only hold a value inside its bounds:
//! constructing one (from code or from JSON through serde) checks them, so code that reads
//! a manifest never has to wonder whether `memory_limit_mb` could be `u64::MAX` or
//! `cpu_limit` negative.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::paths::check_absolute_clean;
use crate::units;

/// Deepest lineage any manifest may describe; a contract's `max_depth` is at most this.
pub const MAX_DEPTH: u32 = 64;
/// Latest timestamp accepted (9999-12-31T23:59:59Z): larger values are garbage, not dates.
pub const MAX_UNIX_SECONDS: u64 = 253_402_300_799;
/// Longest identifier (worker, key, profile name), in bytes.
pub const MAX_ID_BYTES: usize = 64;
/// Largest state snapshot, in bytes of UTF-8.
pub const MAX_STATE_SNAPSHOT_BYTES: usize = 64 << 10;
/// Longest exposed path, in bytes (PATH_MAX).
pub const MAX_PATH_BYTES: usize = 4096;
/// Smallest memory limit, in MiB ([`units::MIN_MEMORY_BYTES`]).
pub const MIN_MEMORY_MB: u64 = units::MIN_MEMORY_BYTES >> 20;
/// Largest memory limit, in MiB ([`units::MAX_MEMORY_BYTES`]).
pub const MAX_MEMORY_MB: u64 = units::MAX_MEMORY_BYTES >> 20;
/// Largest wall-clock timeout, in milliseconds ([`units::MAX_TIMEOUT`]).
pub const MAX_TIMEOUT_MS: u64 = units::MAX_TIMEOUT.as_millis() as u64;

/// Why a value was refused: the field it was meant for and the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct FieldError {
    pub field: &'static str,
    pub why: String,
}

impl FieldError {
    pub fn new(field: &'static str, why: impl Into<String>) -> FieldError {
        FieldError {
            field,
            why: why.into(),
        }
    }
}

/// Defines an integer newtype that only holds values in `MIN..=MAX`, (de)serialized as a
/// plain JSON/TOML number; `FIELD` names it in errors.
macro_rules! bounded_int {
    ($(#[$doc:meta])* $name:ident($int:ty), $field:expr, $min:expr, $max:expr) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ::serde::Serialize, ::serde::Deserialize,
        )]
        #[serde(try_from = "u64", into = "u64")]
        pub struct $name($int);

        impl $name {
            pub const MIN: $int = $min;
            pub const MAX: $int = $max;

            pub fn new(value: $int) -> Result<$name, $crate::manifest::FieldError> {
                if value < Self::MIN {
                    return Err($crate::manifest::FieldError::new(
                        $field,
                        format!("{value} is below the minimum of {}", Self::MIN),
                    ));
                }
                if value > Self::MAX {
                    return Err($crate::manifest::FieldError::new(
                        $field,
                        format!("{value} is above the maximum of {}", Self::MAX),
                    ));
                }
                Ok($name(value))
            }

            pub fn get(self) -> $int {
                self.0
            }
        }

        impl TryFrom<u64> for $name {
            type Error = $crate::manifest::FieldError;
            fn try_from(value: u64) -> Result<$name, Self::Error> {
                let narrowed = <$int>::try_from(value).map_err(|_| {
                    $crate::manifest::FieldError::new(
                        $field,
                        format!("{value} is above the maximum of {}", Self::MAX),
                    )
                })?;
                $name::new(narrowed)
            }
        }

        impl From<$name> for u64 {
            fn from(v: $name) -> u64 {
                u64::from(v.0)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}
pub(crate) use bounded_int;

bounded_int!(
    /// Generations below the root worker (the root is depth 0).
    Depth(u32), "depth", 0, MAX_DEPTH
);
bounded_int!(
    /// Seconds since the Unix epoch.
    UnixSeconds(u64), "timestamp", 0, MAX_UNIX_SECONDS
);
bounded_int!(
    /// Memory limit of the worker's cgroup, in MiB (swap off).
    MemoryMb(u64), "memory_limit_mb", MIN_MEMORY_MB, MAX_MEMORY_MB
);
bounded_int!(
    /// Maximum number of tasks (processes + threads) in the worker's cgroup.
    PidsLimit(u64), "pids_limit", 1, units::MAX_PIDS
);
bounded_int!(
    /// Wall-clock limit of the worker's sandbox, in milliseconds.
    TimeoutMs(u64), "timeout_ms", 1, MAX_TIMEOUT_MS
);
bounded_int!(
    /// Cap on the worker's output, stdout and stderr together, in bytes (seed 004's
    /// `max_output_bytes`).
    OutputBytes(u64), "max_output_bytes", 1, units::MAX_OUTPUT_BYTES
);

bounded_int!(
    /// Bytes a worker may move through its egress broker, both ways together
    /// (`resources.network_policy.max_egress_bytes`).
    EgressBytes(u64), "max_egress_bytes", 1, u64::MAX
);

impl Depth {
    /// The depth of a root worker.
    pub const ROOT: Depth = Depth(0);

    /// The depth of a child of a worker at this depth, if it is representable at all.
    pub fn child(self) -> Option<Depth> {
        self.0.checked_add(1).and_then(|d| Depth::new(d).ok())
    }
}

impl TimeoutMs {
    pub fn as_duration(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0)
    }
}

impl MemoryMb {
    pub fn bytes(self) -> u64 {
        self.0 << 20
    }
}

/// CPU quota in cores (0.5 = half of one core), held as a whole number of millicores
/// between [`units::MIN_CPUS`] and [`units::MAX_CPUS`] cores. In JSON it is a number of
/// cores (`0.5`); in the signed bytes it is the integer millicores, so no floating-point
/// spelling or parsing subtlety can make one quota sign or verify as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct CpuLimit(u32);

impl CpuLimit {
    pub const MIN_MILLICORES: u32 = (units::MIN_CPUS * 1000.0) as u32;
    pub const MAX_MILLICORES: u32 = (units::MAX_CPUS * 1000.0) as u32;

    pub fn new(cores: f64) -> Result<CpuLimit, FieldError> {
        let scaled = cores * 1000.0;
        if !scaled.is_finite() || scaled < f64::from(Self::MIN_MILLICORES) - 1e-6 {
            return Err(FieldError::new(
                "cpu_limit",
                format!(
                    "{cores} is not a number of cores of at least {}",
                    units::MIN_CPUS
                ),
            ));
        }
        if scaled > f64::from(Self::MAX_MILLICORES) + 1e-6 {
            return Err(FieldError::new(
                "cpu_limit",
                format!("{cores} is above the maximum of {}", units::MAX_CPUS),
            ));
        }
        let millis = scaled.round();
        if (scaled - millis).abs() > 1e-6 {
            return Err(FieldError::new(
                "cpu_limit",
                format!("{cores} is not a whole number of millicores (0.001 core)"),
            ));
        }
        CpuLimit::from_millicores(millis as u32)
    }

    pub fn from_millicores(millis: u32) -> Result<CpuLimit, FieldError> {
        if !(Self::MIN_MILLICORES..=Self::MAX_MILLICORES).contains(&millis) {
            return Err(FieldError::new(
                "cpu_limit",
                format!(
                    "{millis} millicores is outside {}..={}",
                    Self::MIN_MILLICORES,
                    Self::MAX_MILLICORES
                ),
            ));
        }
        Ok(CpuLimit(millis))
    }

    /// Cores, as the cgroup quota takes them.
    pub fn get(self) -> f64 {
        f64::from(self.0) / 1000.0
    }

    pub fn millicores(self) -> u32 {
        self.0
    }
}

impl TryFrom<f64> for CpuLimit {
    type Error = FieldError;
    fn try_from(v: f64) -> Result<CpuLimit, FieldError> {
        CpuLimit::new(v)
    }
}

impl From<CpuLimit> for f64 {
    fn from(v: CpuLimit) -> f64 {
        v.get()
    }
}

impl fmt::Display for CpuLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

/// Checks an identifier: 1 to [`MAX_ID_BYTES`] of `A-Z a-z 0-9 . _ -`, starting with a
/// letter or digit. No slashes, spaces or control characters: identifiers end up in
/// cgroup names, file names and log lines.
pub(crate) fn check_id(field: &'static str, s: &str) -> Result<(), FieldError> {
    if s.is_empty() || s.len() > MAX_ID_BYTES {
        return Err(FieldError::new(
            field,
            format!("must be 1 to {MAX_ID_BYTES} characters"),
        ));
    }
    if !s.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(FieldError::new(
            field,
            "must start with a letter or a digit",
        ));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(FieldError::new(
            field,
            "may only contain letters, digits, '.', '_' and '-'",
        ));
    }
    Ok(())
}

/// Defines a string newtype checked by [`check_id`]; `FIELD` names it in errors.
macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $field:expr) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, ::serde::Serialize, ::serde::Deserialize,
        )]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn new(s: impl Into<String>) -> Result<$name, $crate::manifest::FieldError> {
                let s = s.into();
                $crate::manifest::fields::check_id($field, &s)?;
                Ok($name(s))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = $crate::manifest::FieldError;
            fn try_from(s: String) -> Result<$name, Self::Error> {
                $name::new(s)
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::manifest::FieldError;
            fn from_str(s: &str) -> Result<$name, Self::Err> {
                $name::new(s)
            }
        }
    };
}
pub(crate) use identifier;

identifier!(
    /// Identity of a worker, assigned by the controller.
    WorkerId,
    "worker id"
);
identifier!(
    /// Identity of a signing key in a keyring (see `signing`).
    KeyId,
    "key_id"
);
identifier!(
    /// Name of a security profile the controller resolves. Never a file path: a file could
    /// change after the manifest was signed.
    ProfileName,
    "profile"
);

/// 128 random bits that make every manifest unique, so a replayed one is recognised.
/// JSON form: 32 lowercase hex digits (one spelling per value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Nonce([u8; 16]);

impl Nonce {
    pub const LEN: usize = 16;

    pub fn from_bytes(bytes: [u8; 16]) -> Nonce {
        Nonce(bytes)
    }

    /// A fresh nonce from the operating system's random source.
    pub fn random() -> Result<Nonce, getrandom::Error> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b)?;
        Ok(Nonce(b))
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

/// Decodes exactly `N` bytes from lowercase hex (the only accepted spelling).
pub(crate) fn decode_lower_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

impl TryFrom<String> for Nonce {
    type Error = FieldError;
    fn try_from(s: String) -> Result<Nonce, FieldError> {
        decode_lower_hex::<16>(&s)
            .map(Nonce)
            .ok_or_else(|| FieldError::new("nonce", "must be 32 lowercase hex digits"))
    }
}

impl From<Nonce> for String {
    fn from(n: Nonce) -> String {
        hex::encode(n.0)
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// State handed from a parent to its child: opaque UTF-8 text (JSON, base64, a path — the
/// worker's business) of at most [`MAX_STATE_SNAPSHOT_BYTES`]. NUL is refused so the value
/// can be passed on as an environment variable or argument.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct StateSnapshot(String);

impl StateSnapshot {
    pub fn new(s: impl Into<String>) -> Result<StateSnapshot, FieldError> {
        let s = s.into();
        if s.len() > MAX_STATE_SNAPSHOT_BYTES {
            return Err(FieldError::new(
                "state_snapshot",
                format!(
                    "{} bytes is above the maximum of {MAX_STATE_SNAPSHOT_BYTES}",
                    s.len()
                ),
            ));
        }
        if s.contains('\0') {
            return Err(FieldError::new("state_snapshot", "must not contain NUL"));
        }
        Ok(StateSnapshot(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for StateSnapshot {
    type Error = FieldError;
    fn try_from(s: String) -> Result<StateSnapshot, FieldError> {
        StateSnapshot::new(s)
    }
}

impl From<StateSnapshot> for String {
    fn from(v: StateSnapshot) -> String {
        v.0
    }
}

/// A host path exposed to a worker at the same path: absolute, in normal form (no `.` or
/// `..`, no repeated or trailing `/`), not `/` itself, UTF-8 without control characters,
/// at most [`MAX_PATH_BYTES`]. Normal form makes "is this path under that one" a plain
/// component comparison, which capability narrowing relies on. Whether the path exists
/// and contains no symlink is checked when the sandbox is built
/// ([`crate::paths::check_host_path`]), not here: a manifest is pure data.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ExposedPath(String);

/// Checks that `s` is an absolute path in normal form (see [`ExposedPath`]); `/` is
/// accepted here and refused by callers that need to.
pub(crate) fn check_normal_path(field: &'static str, s: &str) -> Result<(), FieldError> {
    if s.len() > MAX_PATH_BYTES {
        return Err(FieldError::new(
            field,
            format!("longer than {MAX_PATH_BYTES} bytes"),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(FieldError::new(
            field,
            format!("{s:?}: must not contain control characters"),
        ));
    }
    check_absolute_clean(Path::new(s)).map_err(|e| FieldError::new(field, e.to_string()))?;
    if s.len() > 1 && (s.ends_with('/') || s.contains("//")) {
        return Err(FieldError::new(
            field,
            format!("{s:?}: must be in normal form (no trailing or repeated '/')"),
        ));
    }
    Ok(())
}

impl ExposedPath {
    pub fn new(s: impl Into<String>) -> Result<ExposedPath, FieldError> {
        let s = s.into();
        check_normal_path("filesystem path", &s)?;
        if s == "/" {
            return Err(FieldError::new(
                "filesystem path",
                "the root directory cannot be exposed",
            ));
        }
        Ok(ExposedPath(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }

    /// True if `self` is `other` or lies beneath it (whole components: `/data2` is not
    /// under `/data`).
    pub fn is_within(&self, other: &ExposedPath) -> bool {
        self.as_path().starts_with(other.as_path())
    }
}

impl TryFrom<String> for ExposedPath {
    type Error = FieldError;
    fn try_from(s: String) -> Result<ExposedPath, FieldError> {
        ExposedPath::new(s)
    }
}

impl TryFrom<&Path> for ExposedPath {
    type Error = FieldError;
    fn try_from(p: &Path) -> Result<ExposedPath, FieldError> {
        match p.to_str() {
            Some(s) => ExposedPath::new(s),
            None => Err(FieldError::new(
                "filesystem path",
                format!("{}: not valid UTF-8", p.display()),
            )),
        }
    }
}

impl From<ExposedPath> for String {
    fn from(v: ExposedPath) -> String {
        v.0
    }
}

impl From<ExposedPath> for PathBuf {
    fn from(v: ExposedPath) -> PathBuf {
        PathBuf::from(v.0)
    }
}

impl fmt::Display for ExposedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A file a worker may execute (an entry of `filesystem.allow_exec`): an absolute path in
/// normal form, like [`ExposedPath`], naming a file, so "the same program" is string
/// equality. That it is a real path to an executable file (no symlink) is checked when the
/// sandbox is built (`sandbox::exec::check_exec_path`), not here.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ExecPath(String);

impl ExecPath {
    pub fn new(s: impl Into<String>) -> Result<ExecPath, FieldError> {
        let s = s.into();
        check_normal_path("allow_exec", &s)?;
        if s == "/" {
            return Err(FieldError::new(
                "allow_exec",
                "the root directory is not a program",
            ));
        }
        Ok(ExecPath(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }
}

impl TryFrom<String> for ExecPath {
    type Error = FieldError;
    fn try_from(s: String) -> Result<ExecPath, FieldError> {
        ExecPath::new(s)
    }
}

impl From<ExecPath> for String {
    fn from(v: ExecPath) -> String {
        v.0
    }
}

impl fmt::Display for ExecPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests;
