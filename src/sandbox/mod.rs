//! The kernel enforcement layer: everything that makes a sandbox a sandbox.
//!
//! One file per mechanism — [`userns`], [`mounts`], [`net`], [`cgroup`], [`seccomp`],
//! [`landlock`], [`caps`], [`rlimits`], [`output`] and [`tty`] for what reaches the
//! caller — and [`launch`], the ordered pipeline that calls them. This module is the only
//! place in hatchery with `unsafe` code and raw syscalls.
//!
//! A sandbox is described by a [`SandboxSpec`] (built by [`spec`] from a profile and the
//! caller's options), checked against what the [`Host`] can enforce by [`preflight`] —
//! which turns it into a [`Plan`], refusing, unless degradation was allowed, anything the
//! kernel cannot enforce — and started with [`launch::start`].

pub mod caps;
pub mod cgroup;
pub mod channel;
pub mod confine;
pub mod elsewhere;
pub mod entry;
pub mod exec;
pub mod filter_cache;
pub mod handle;
pub mod idpool;
pub mod init;
pub mod kernel_text;
pub mod landlock;
pub mod launch;
pub mod mount_api;
pub mod mounts;
pub mod namespaces;
pub mod net;
pub mod output;
pub mod owner_groups;
pub mod preflight;
pub mod process;
pub mod procfs;
pub mod rlimits;
pub mod seccomp;
pub mod spawn;
pub mod spec;
pub mod step;
pub mod tty;
pub mod userns;
pub mod wait;
pub mod zygote;

use std::collections::BTreeMap;
use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;

use serde::Serialize;

use crate::profile::{NamespacePolicy, Profile, Rlimit, SeccompProgram};
use cgroup::Limits;

pub use launch::{Failure, Outcome, Sandbox, start};
pub use preflight::{Asker, Host, Plan, preflight};
pub use spec::{Exposure, RunRequest};

/// The payload's PATH unless the caller sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Everything needed to start one sandbox.
pub struct SandboxSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox.
    pub cwd: PathBuf,
    pub rootfs: mounts::RootfsPlan,
    pub landlock: landlock::LandlockRules,
    pub landlock_min_abi: u8,
    pub rlimits: Vec<Rlimit>,
    /// The seccomp filters: the floor's and the profile's (see [`SeccompSource`]).
    pub seccomp: SeccompSource,
    pub profile_name: String,
    pub profile_sha256: String,
    pub limits: Limits,
    pub namespaces: NamespacePolicy,
    pub identity: userns::Identity,
    /// The lease on `identity`'s host ids, when they were leased (see [`idpool`]).
    pub id_lease: Option<idpool::IdLease>,
    /// The ids no file on disk has: what read-only idmapped mounts map.
    pub null_ids: (u32, u32),
    pub hostname: String,
    /// stdin, stdout, stderr for the payload; `None` inherits the supervisor's.
    pub stdio: Option<[OwnedFd; 3]>,
    /// stdin (`stdio[0]`) is a pseudo-terminal allocated for this sandbox alone (see
    /// [`tty`]): the payload makes it its controlling terminal. Never the caller's own
    /// terminal.
    pub controlling_terminal: bool,
    /// Extra descriptors installed in the payload at the given numbers (e.g. a worker's
    /// controller socket as fd 3).
    pub pass_fds: Vec<(OwnedFd, RawFd)>,
    pub cgroup_name: String,
    pub allow_degraded: bool,
    /// The executable allowlist, when there is one (its Landlock rules and mounts are
    /// already in `landlock` and `rootfs`).
    pub exec_allowlist: Option<exec::ExecAllowlist>,
    /// Egress through a broker: the transparent listeners' ports (see
    /// [`net::egress_listeners`]); `None`, no network beyond `lo`.
    pub egress_ports: Option<Vec<u16>>,
}

/// A sandbox's two seccomp filters, compiled: the floor's, loaded first under every
/// profile (with the allowlist rules when there is an allowlist; see
/// [`crate::profile::floor`]), and the profile's, loaded last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filters {
    pub floor: SeccompProgram,
    pub profile: SeccompProgram,
    /// Floor rules this system's libseccomp could not compile (names it does not know).
    pub floor_notes: Vec<String>,
}

/// Where a sandbox's filters come from.
#[derive(Debug, Clone)]
pub enum SeccompSource {
    /// Compiled already (the controller's launcher compiles each profile once).
    Compiled(Filters),
    /// Compiled from this (narrowed) profile by the supervisor once the sandbox is cloned,
    /// while the sandbox builds its root on the other processor: compiling with libseccomp
    /// is most of what a one-shot `run` does before the clone, and the payload needs the
    /// filters only after that.
    Deferred(Box<Profile>),
}

impl SeccompSource {
    pub fn compile(&self) -> Result<Filters, SandboxError> {
        match self {
            SeccompSource::Compiled(f) => Ok(f.clone()),
            SeccompSource::Deferred(profile) => filter_cache::filters(profile),
        }
    }
}

/// What is enforced for a sandbox, and by what: the `enforcement` object of the report.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Enforcement {
    pub namespaces: Vec<&'static str>,
    /// "v2", "v1" or "none".
    pub cgroup: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_path: Option<PathBuf>,
    /// Requested limit → the kernel mechanism enforcing it.
    pub limits: BTreeMap<&'static str, String>,
    pub seccomp: String,
    /// The seccomp floor loaded under every profile: "filter (N instructions)" or "none".
    pub seccomp_floor: String,
    pub seccomp_profile: String,
    pub profile_sha256: String,
    pub landlock_abi: Option<u8>,
    pub landlock: String,
    pub no_new_privs: bool,
    pub capabilities: &'static str,
    pub uid_host: u32,
    pub gid_host: u32,
    pub rootless: bool,
    /// The executable allowlist, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec_allowlist: Option<ExecEnforcement>,
    /// What the command got as stdin, stdout and stderr (`run`; absent where the caller
    /// chose them itself, as the controller does for workers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdio: Option<StdioEnforcement>,
    /// What was asked for (or is normally enforced) and is not, with the reason.
    pub not_enforced: Vec<String>,
}

/// How an executable allowlist is enforced: the `enforcement.exec_allowlist` object of the
/// report.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ExecEnforcement {
    /// The listed files.
    pub files: Vec<PathBuf>,
    /// ELF interpreters added because the listed programs name them.
    pub loaders: Vec<PathBuf>,
    /// The mechanisms in force ("landlock execute right on 3 files", ...).
    pub by: Vec<String>,
    /// A listed script whose interpreter is not listed, and the like.
    pub notes: Vec<String>,
}

/// The `enforcement.stdio` object of the report: for each of the command's stdin, stdout
/// and stderr, whether it is the caller's own descriptor (`passed (...)`, with what it
/// is) or a relay through the supervisor (`pty relay`, `pipe relay (...)`, with why). The
/// sandbox never holds the caller's terminal, nor a stdin it could write through.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct StdioEnforcement {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
}

/// Errors of the sandbox layer.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The kernel cannot enforce something that was asked for (fail closed).
    #[error("cannot enforce {what}: {why}; {fix}")]
    Refused {
        what: String,
        why: String,
        fix: String,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// A signal that ends a start (`run`'s ^C) came before the command started: nothing
    /// was started. The run ends as the signal would have ended it (128+N).
    #[error("stopped by {signal} before the command started ({during}); nothing was started")]
    Stopped {
        signal: nix::sys::signal::Signal,
        during: String,
    },
}

impl SandboxError {
    /// The signal that stopped the start, for an error that is one: the run ends as that
    /// signal would have ended it (128+N), and its report names it.
    pub fn stopped_by(&self) -> Option<i32> {
        match self {
            SandboxError::Stopped { signal, .. } => Some(*signal as i32),
            _ => None,
        }
    }
}
