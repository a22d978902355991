//! Security profiles: the seccomp policy, Landlock rules, mounts, namespaces, rlimits and
//! default limits a sandbox starts with.
//!
//! Profiles are TOML files. The shipped ones live in `profiles/` and are embedded in the
//! binary, so `--profile default` never depends on what is installed next to it; any other
//! value of `--profile` is read as a path. Parsing rejects unknown keys (with the line) so
//! a misspelt rule can never silently turn into no rule.

pub mod abi;
pub mod bpf;
pub mod diff;
pub mod explore;
pub mod floor;
pub mod lint;
pub mod locate;
pub mod names;
pub mod oci;
pub mod program;
pub mod seccomp;
mod sections;
pub mod solver;
pub mod verdict;

pub use sections::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::units;

pub use program::SeccompProgram;
pub use seccomp::{
    Action, ArgCondition, CompareOp, Decider, PolicyError, SeccompPolicy, SyscallRule,
};

/// Profiles larger than this are refused before parsing: a profile is a policy a person
/// reads, and a multi-megabyte one is either a mistake or an attack on the parser.
pub const MAX_PROFILE_BYTES: usize = 1 << 20;

/// The shipped profiles as JSON of the same shape, made from the TOML at build time
/// (`build.rs`): decoding JSON costs a one-shot `run` a fraction of parsing the TOML.
/// With each, the SHA-256 of its TOML, also computed at build time.
const BUILTIN_JSON: &[(&str, &str, &str)] = &[
    (
        "default",
        include_str!(concat!(env!("OUT_DIR"), "/default.json")),
        include_str!(concat!(env!("OUT_DIR"), "/default.sha256")),
    ),
    (
        "strict",
        include_str!(concat!(env!("OUT_DIR"), "/strict.json")),
        include_str!(concat!(env!("OUT_DIR"), "/strict.sha256")),
    ),
    (
        "compat",
        include_str!(concat!(env!("OUT_DIR"), "/compat.json")),
        include_str!(concat!(env!("OUT_DIR"), "/compat.sha256")),
    ),
];

/// The profiles shipped inside the binary: (name, TOML source).
pub const BUILTIN: &[(&str, &str)] = &[
    ("default", include_str!("../../profiles/default.toml")),
    ("strict", include_str!("../../profiles/strict.toml")),
    ("compat", include_str!("../../profiles/compat.toml")),
];

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(
        "unknown profile {0:?}: not a shipped profile (see `hatchery profile list`) and not a path to a file"
    )]
    Unknown(String),
    /// The reason is part of the message and not a `source`: a caller printing the chain
    /// would otherwise say it twice.
    #[error("cannot read profile {path}: {error}{}", read_hint(.error))]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("profile {origin} is too large ({size} bytes; the limit is {MAX_PROFILE_BYTES})")]
    TooLarge { origin: String, size: u64 },
    /// The file is not a profile (malformed TOML, an unknown key, JSON): where the parser
    /// stopped, as `FILE:LINE:COLUMN`.
    #[error("profile {origin}{}: {message}", place(.line, .column))]
    Parse {
        origin: String,
        line: Option<usize>,
        column: Option<usize>,
        message: String,
    },
    /// A value the format allows but the profile cannot use, as `FILE:LINE`.
    #[error("profile {origin}{}: {message}", place(.line, &None))]
    Invalid {
        origin: String,
        line: Option<usize>,
        message: String,
    },
    #[error("profile {origin}{}: seccomp: {message}", place(.line, &None))]
    Seccomp {
        origin: String,
        line: Option<usize>,
        message: String,
    },
}

/// `:LINE` or `:LINE:COLUMN` after a file name, as compilers print it.
fn place(line: &Option<usize>, column: &Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(":{l}:{c}"),
        (Some(l), None) => format!(":{l}"),
        _ => String::new(),
    }
}

fn read_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            " (give a shipped profile name, see `hatchery profile list`, or the path of a profile file)"
        }
        _ => "",
    }
}

/// A parsed, validated profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub seccomp: SeccompPolicy,
    #[serde(default)]
    pub landlock: LandlockPolicy,
    #[serde(default)]
    pub namespaces: NamespacePolicy,
    #[serde(default)]
    pub mounts: MountPolicy,
    /// Resource limits set with setrlimit(2) before the command starts (name → value).
    #[serde(default)]
    pub rlimits: BTreeMap<String, RlimitValue>,
    /// Resource limits applied when the command line does not give them.
    #[serde(default)]
    pub limits: DefaultLimits,
    /// What `hatchery profile lint` is told about this profile.
    #[serde(default, skip_serializing_if = "LintPolicy::is_empty")]
    pub lint: LintPolicy,
    /// Where the profile came from ("builtin:default" or a path); not part of the file.
    #[serde(skip)]
    pub origin: String,
    /// SHA-256 of the profile's source bytes, hex; not part of the file.
    #[serde(skip)]
    pub sha256: String,
}

impl Profile {
    /// A shipped profile by name, and nothing else: what a manifest's `profile` names
    /// (a manifest signs a name, never a file that could change, or that a worker could
    /// plant in the directory its supervisor happens to run in).
    pub fn builtin(name: &str) -> Result<Profile, ProfileError> {
        let Some((name, json, sha256)) = BUILTIN_JSON.iter().find(|(n, _, _)| *n == name) else {
            return Err(ProfileError::Unknown(name.to_string()));
        };
        let origin = format!("builtin:{name}");
        let mut profile: Profile = serde_json::from_str(json).map_err(|e| ProfileError::Parse {
            origin: origin.clone(),
            line: None,
            column: None,
            message: e.to_string(),
        })?;
        profile.origin = origin;
        profile.sha256 = sha256.to_string();
        // Not validated here: the JSON is the shipped TOML, which the build made it from and
        // the unit tests validate (`the_build_time_json_of_every_shipped_profile_is_its_toml`);
        // checking it again cost a third of what `run` did before the clone.
        Ok(profile)
    }

    /// Resolves `--profile NAME|FILE`: a shipped profile by name, otherwise a file path.
    pub fn resolve(name_or_path: &str) -> Result<Profile, ProfileError> {
        if BUILTIN.iter().any(|(n, _)| *n == name_or_path) {
            return Profile::builtin(name_or_path);
        }
        let looks_like_path = name_or_path.contains('/') || name_or_path.ends_with(".toml");
        let path = Path::new(name_or_path);
        if !looks_like_path && !path.exists() {
            return Err(ProfileError::Unknown(name_or_path.to_string()));
        }
        Profile::from_file(path)
    }

    /// Reads and validates a profile file, refusing files above [`MAX_PROFILE_BYTES`].
    pub fn from_file(path: &Path) -> Result<Profile, ProfileError> {
        let text = read_bounded(path)?;
        Profile::from_toml(&text, &path.display().to_string())
    }

    /// Parses and validates profile TOML; `origin` names it in errors.
    pub fn from_toml(source: &str, origin: &str) -> Result<Profile, ProfileError> {
        if source.len() > MAX_PROFILE_BYTES {
            return Err(ProfileError::TooLarge {
                origin: origin.to_string(),
                size: source.len() as u64,
            });
        }
        if let Some(message) = not_toml(source, origin) {
            return Err(ProfileError::Parse {
                origin: origin.to_string(),
                line: None,
                column: None,
                message,
            });
        }
        let mut profile: Profile = toml::from_str(source).map_err(|e| {
            let (line, column, message) = describe_toml_error(source, &e);
            ProfileError::Parse {
                origin: origin.to_string(),
                line,
                column,
                message,
            }
        })?;
        profile.origin = origin.to_string();
        profile.sha256 = sha256_hex(source.as_bytes());
        profile.validate(Some(source))?;
        Ok(profile)
    }

    fn invalid(&self, message: impl Into<String>) -> ProfileError {
        ProfileError::Invalid {
            origin: self.origin.clone(),
            line: None,
            message: message.into(),
        }
    }

    /// The profile as TOML that [`Profile::from_toml`] reads back to the same profile,
    /// laid out like the shipped files (one `[[seccomp.rule]]` block per rule, conditions
    /// inline).
    pub fn to_toml(&self) -> Result<String, ProfileError> {
        let err = |e: toml::ser::Error| ProfileError::Invalid {
            origin: self.origin.clone(),
            line: None,
            message: format!("cannot write as TOML: {e}"),
        };
        #[derive(Serialize)]
        struct Head<'a> {
            name: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            description: &'a str,
        }
        #[derive(Serialize)]
        struct Tail<'a> {
            landlock: &'a LandlockPolicy,
            namespaces: &'a NamespacePolicy,
            mounts: &'a MountPolicy,
            #[serde(skip_serializing_if = "BTreeMap::is_empty")]
            rlimits: &'a BTreeMap<String, RlimitValue>,
            limits: &'a DefaultLimits,
            #[serde(skip_serializing_if = "LintPolicy::is_empty")]
            lint: &'a LintPolicy,
        }
        let mut out = toml::to_string(&Head {
            name: &self.name,
            description: &self.description,
        })
        .map_err(err)?;
        let bare = SeccompPolicy {
            rules: Vec::new(),
            ..self.seccomp.clone()
        };
        out.push_str("\n[seccomp]\n");
        out.push_str(&toml::to_string(&bare).map_err(err)?);
        for rule in &self.seccomp.rules {
            out.push('\n');
            out.push_str(&seccomp::rule_toml(rule).map_err(err)?);
        }
        out.push('\n');
        out.push_str(
            &toml::to_string(&Tail {
                landlock: &self.landlock,
                namespaces: &self.namespaces,
                mounts: &self.mounts,
                rlimits: &self.rlimits,
                limits: &self.limits,
                lint: &self.lint,
            })
            .map_err(err)?,
        );
        Ok(out)
    }

    /// Checks a profile built in memory (an import, say) as a file would be checked.
    pub fn check(&self) -> Result<(), ProfileError> {
        self.validate(None)
    }

    /// Checks everything serde cannot: paths, units, rlimit names, seccomp rule sanity.
    /// With the source at hand, every error names the line (`FILE:LINE: key: what`).
    fn validate(&self, source: Option<&str>) -> Result<(), ProfileError> {
        let at = |path: &[&str], message: String| ProfileError::Invalid {
            origin: self.origin.clone(),
            line: source.and_then(|s| locate::key_line(s, path)),
            message: format!("{}: {message}", path.join(".")),
        };
        if self.name.is_empty() || self.name.len() > 64 {
            return Err(at(&["name"], "must be 1 to 64 characters".into()));
        }
        // Printed by show, check, diff and lint to someone reviewing the profile.
        let texts = std::iter::once((vec!["name"], &self.name))
            .chain(std::iter::once((vec!["description"], &self.description)));
        for (key, text) in texts {
            if let Some(c) = crate::text::first_control(text) {
                return Err(at(&key, control_text(c)));
            }
        }
        if let Some(c) = self
            .seccomp
            .rules
            .iter()
            .find_map(|r| crate::text::first_control(&r.reason))
        {
            return Err(at(&["seccomp", "rule", "reason"], control_text(c)));
        }
        let no_list = Vec::new();
        let lists: [(&[&str], &Vec<PathBuf>); 5] = [
            (&["landlock", "read"], &self.landlock.read),
            (&["landlock", "write"], &self.landlock.write),
            (&["landlock", "execute"], &self.landlock.execute),
            (
                &["landlock", "allow_exec"],
                self.landlock.allow_exec.as_ref().unwrap_or(&no_list),
            ),
            (&["mounts", "system"], &self.mounts.system),
        ];
        for (what, paths) in lists {
            for p in paths {
                crate::paths::check_absolute_clean(p).map_err(|e| at(what, e.to_string()))?;
                // Printed by show and lint, as the other texts are.
                if let Some(c) = crate::text::first_control(&p.to_string_lossy()) {
                    return Err(at(what, control_text(c)));
                }
            }
        }
        if let Some(allow) = &self.landlock.allow_exec {
            check_allowlist(allow).map_err(|m| at(&["landlock", "allow_exec"], m))?;
        }
        if self.landlock.min_abi == 0 || self.landlock.min_abi > 10 {
            return Err(at(
                &["landlock", "min_abi"],
                "must be between 1 and 10".into(),
            ));
        }
        units::parse_size(&self.mounts.tmp_size)
            .map_err(|e| at(&["mounts", "tmp_size"], e.to_string()))?;
        self.resolve_rlimits()
            .map_err(|(key, m)| at(&["rlimits", key.as_str()], m))?;
        self.resolve_limits()
            .map_err(|(key, m)| at(&["limits", key], m))?;
        lint::check_accepted_ids(&self.lint.accept).map_err(|m| at(&["lint", "accept"], m))?;
        self.seccomp.validate().map_err(|e| {
            let line = |rule: Option<usize>, name: Option<&str>, key: Option<&str>| {
                source.and_then(|s| match rule {
                    Some(rule) => locate::rule_line(s, rule, name, key),
                    None => key.and_then(|k| locate::key_line(s, &["seccomp", k])),
                })
            };
            let mut message = e.to_string();
            if let Some(other) = e.other {
                if let Some(l) = line(Some(other), None, None) {
                    message = format!("{message} (rule {} is at line {l})", other + 1);
                }
            }
            ProfileError::Seccomp {
                origin: self.origin.clone(),
                line: line(e.rule, e.syscall.as_deref(), e.key),
                message,
            }
        })?;
        Ok(())
    }

    /// The rlimits with names and values resolved.
    pub fn rlimits(&self) -> Result<Vec<Rlimit>, ProfileError> {
        self.resolve_rlimits()
            .map_err(|(key, m)| self.invalid(format!("rlimits.{key}: {m}")))
    }

    /// The rlimits resolved, or the key (resource name) that is wrong and why.
    fn resolve_rlimits(&self) -> Result<Vec<Rlimit>, (String, String)> {
        let mut out = Vec::new();
        for (name, value) in &self.rlimits {
            let resource = RlimitResource::ALL
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, r)| *r)
                .ok_or_else(|| {
                    (
                        name.clone(),
                        "unknown resource (known: as, core, cpu, data, fsize, memlock, nofile, nproc, stack)".to_string(),
                    )
                })?;
            let (soft, hard) = match value {
                RlimitValue::Both(v) => (*v, *v),
                RlimitValue::Named(s) if s == "unlimited" => (u64::MAX, u64::MAX),
                RlimitValue::Named(s) => {
                    return Err((
                        name.clone(),
                        format!("{s:?} is not a number or \"unlimited\""),
                    ));
                }
                RlimitValue::Pair { soft, hard } => (*soft, *hard),
            };
            if soft > hard {
                return Err((name.clone(), format!("soft {soft} above hard {hard}")));
            }
            out.push(Rlimit {
                resource,
                soft,
                hard,
            });
        }
        Ok(out)
    }

    /// The default limits with units resolved and bounds checked.
    pub fn default_limits(&self) -> Result<ResolvedLimits, ProfileError> {
        self.resolve_limits()
            .map_err(|(key, m)| self.invalid(format!("limits.{key}: {m}")))
    }

    /// The default limits resolved, or the key that is wrong and why.
    fn resolve_limits(&self) -> Result<ResolvedLimits, (&'static str, String)> {
        let l = &self.limits;
        Ok(ResolvedLimits {
            memory: l
                .memory
                .as_deref()
                .map(units::parse_memory)
                .transpose()
                .map_err(|e| ("memory", e.to_string()))?,
            cpus: l
                .cpus
                .map(|c| units::parse_cpus(&c.to_string()))
                .transpose()
                .map_err(|e| ("cpus", e.to_string()))?,
            pids: l
                .pids
                .map(|p| units::parse_pids(&p.to_string()))
                .transpose()
                .map_err(|e| ("pids", e.to_string()))?,
            timeout: l
                .timeout
                .as_deref()
                .map(units::parse_duration)
                .transpose()
                .map_err(|e| ("timeout", e.to_string()))?,
        })
    }

    /// Narrows the profile to run only `files` (an executable allowlist given with the
    /// command, such as `run --allow-exec`). A profile that already has an allowlist can
    /// only be narrowed to a subset of it, so a request never runs what its profile
    /// forbids. An empty `files` changes nothing.
    pub fn narrow_exec(&mut self, files: &[PathBuf]) -> Result<(), ProfileError> {
        if files.is_empty() {
            return Ok(());
        }
        for p in files {
            crate::paths::check_absolute_clean(p)
                .map_err(|e| self.invalid(format!("allow_exec: {e}")))?;
        }
        check_allowlist(files).map_err(|m| self.invalid(format!("allow_exec: {m}")))?;
        if let Some(allowed) = &self.landlock.allow_exec {
            if let Some(extra) = files.iter().find(|f| !allowed.contains(f)) {
                let names: Vec<String> = allowed.iter().map(|p| p.display().to_string()).collect();
                return Err(self.invalid(format!(
                    "{} is not in the profile's executable allowlist ({}); an allowlist given with the command can only narrow the profile's",
                    extra.display(),
                    names.join(", ")
                )));
            }
        }
        self.landlock.allow_exec = Some(files.to_vec());
        Ok(())
    }

    /// The seccomp floor a sandbox with this profile gets, compiled: the filter loaded
    /// before the profile's (see [`floor`]).
    pub fn floor(&self) -> Result<floor::Floor, ProfileError> {
        floor::Floor::for_profile(self)
    }

    /// Compiles the seccomp policy for this machine's architecture with libseccomp: the
    /// exact filter program the kernel will be given.
    pub fn compile_seccomp(&self) -> Result<SeccompProgram, ProfileError> {
        self.seccomp
            .compile()
            .map_err(|message| ProfileError::Seccomp {
                origin: self.origin.clone(),
                line: None,
                message,
            })
    }
}

/// Most files an executable allowlist may list.
pub const MAX_ALLOW_EXEC: usize = 64;

/// The rules of an allowlist that need no filesystem: not empty, bounded, no duplicates.
fn check_allowlist(files: &[PathBuf]) -> Result<(), String> {
    if files.is_empty() {
        return Err(
            "an empty allowlist would let nothing run (remove the key for no allowlist)".into(),
        );
    }
    if files.len() > MAX_ALLOW_EXEC {
        return Err(format!(
            "{} files; at most {MAX_ALLOW_EXEC} may be listed",
            files.len()
        ));
    }
    for (i, f) in files.iter().enumerate() {
        if files[..i].contains(f) {
            return Err(format!("{} is listed twice", f.display()));
        }
    }
    Ok(())
}

/// SHA-256 of a profile's bytes, hex: the identity reports and audit records use.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Reads a file of at most [`MAX_PROFILE_BYTES`] as UTF-8, without trusting its reported
/// size (a FIFO or a file in /proc reports none).
pub fn read_bounded(path: &Path) -> Result<String, ProfileError> {
    let read_err = |error| ProfileError::Read {
        path: path.to_path_buf(),
        error,
    };
    let bytes = crate::paths::read_input(path, MAX_PROFILE_BYTES).map_err(read_err)?;
    if bytes.len() > MAX_PROFILE_BYTES {
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        return Err(ProfileError::TooLarge {
            origin: path.display().to_string(),
            size: size.max(bytes.len() as u64),
        });
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = e
            .as_bytes()
            .get(..e.utf8_error().valid_up_to())
            .unwrap_or(&[]);
        ProfileError::Parse {
            origin: path.display().to_string(),
            line: Some(
                valid
                    .iter()
                    .filter(|b| **b == b'\n')
                    .count()
                    .saturating_add(1),
            ),
            column: None,
            message: format!("not valid UTF-8 (at byte {})", e.utf8_error().valid_up_to()),
        }
    })
}

/// A file that is JSON rather than TOML, said as such: OCI / Docker seccomp JSON is
/// converted by `profile import`, and a TOML parser's "expected key" helps nobody.
/// (A TOML document cannot start with `{`.)
fn not_toml(source: &str, origin: &str) -> Option<String> {
    if !source.trim_start().starts_with('{') {
        return None;
    }
    let json: Option<serde_json::Value> = serde_json::from_str(source).ok();
    let is_oci = json
        .as_ref()
        .and_then(|v| v.as_object())
        .is_some_and(|o| o.contains_key("defaultAction") || o.contains_key("syscalls"));
    let stem = Path::new(origin)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "imported".into());
    Some(if is_oci {
        format!(
            "this is OCI / Docker seccomp JSON, not a hatchery profile (TOML): convert it with `hatchery profile import {origin} -o {stem}.toml` and use {stem}.toml"
        )
    } else {
        "this is JSON, not a hatchery profile (TOML; the format is in profiles/README.md); OCI / Docker seccomp JSON is converted with `hatchery profile import FILE.json -o FILE.toml`".to_string()
    })
}

/// Most characters of a parser's message quoted in an error.
const MOST_QUOTED: usize = 300;
/// Characters of the line an error points at, around the place.
const EXCERPT_WIDTH: usize = 80;

/// A toml error as (line, column, "message (at `the line`)").
fn describe_toml_error(
    source: &str,
    err: &toml::de::Error,
) -> (Option<usize>, Option<usize>, String) {
    // Both may quote the file: a value of a megabyte, a line of one.
    let message = crate::text::clip(err.message().trim(), MOST_QUOTED).into_owned();
    match err.span() {
        Some(span) => {
            let upto = source.get(..span.start.min(source.len())).unwrap_or("");
            let line = locate::line_of(source, span.start);
            let col = upto
                .rsplit('\n')
                .next()
                .map_or(1, |l| l.chars().count().saturating_add(1));
            let text = source.lines().nth(line.saturating_sub(1)).unwrap_or("");
            let text = crate::text::excerpt(text, col, EXCERPT_WIDTH);
            (
                Some(line),
                Some(col),
                format!("{message} (at `{}`)", text.trim()),
            )
        }
        None => (None, None, message),
    }
}

#[cfg(test)]
mod tests;

/// Why a name or reason holding `c` is refused.
fn control_text(c: char) -> String {
    format!(
        "holds {} (a control or format character, which would drive or reorder a reviewer's terminal)",
        c.escape_default()
    )
}
