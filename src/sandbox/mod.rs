//! The kernel enforcement layer: everything that makes a sandbox a sandbox.
//!
//! One file per mechanism — [`userns`], [`mounts`], [`net`], [`cgroup`], [`seccomp`],
//! [`landlock`], [`caps`], [`rlimits`], [`output`] and [`tty`] for what reaches the
//! caller — and [`launch`], the ordered pipeline that calls them. This module is the only
//! place in hatchery with `unsafe` code and raw syscalls.
//!
//! A sandbox is described by a [`SandboxSpec`] (built by [`spec`] from a profile and the
//! caller's options), checked against what the [`Host`] can enforce by [`preflight`] —
//! which refuses, unless degradation was allowed, anything the kernel cannot enforce —
//! and started with [`launch::start`].

pub mod caps;
pub mod cgroup;
pub mod channel;
pub mod exec;
pub mod filter_cache;
pub mod handle;
pub mod idpool;
pub mod init;
pub mod landlock;
pub mod launch;
pub mod mount_api;
pub mod mounts;
pub mod namespaces;
pub mod net;
pub mod output;
pub mod process;
pub mod procfs;
pub mod rlimits;
pub mod seccomp;
pub mod spec;
pub mod step;
pub mod tty;
pub mod userns;
pub mod zygote;

use std::collections::BTreeMap;
use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;

use serde::Serialize;

use crate::profile::{NamespacePolicy, Profile, Rlimit, SeccompProgram};
use cgroup::{CgroupManager, Limits};

pub use launch::{Failure, Outcome, Sandbox, start};
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
    /// The limits actually given to the cgroup.
    #[serde(skip)]
    pub cgroup_limits: Limits,
    /// rlimits standing in for cgroup limits the host cannot enforce (degraded runs only).
    #[serde(skip)]
    pub fallback_rlimits: Vec<Rlimit>,
}

impl Enforcement {
    /// Says what the compiled `filters` are (sizes, floor rules left out).
    pub fn record_filters(&mut self, filters: &Filters) {
        if self.seccomp == "none" {
            return;
        }
        self.seccomp = format!("filter ({} instructions)", filters.profile.len());
        self.seccomp_floor = format!("filter ({} instructions)", filters.floor.len());
        for note in &filters.floor_notes {
            let note = format!("seccomp floor: {note}");
            if !self.not_enforced.contains(&note) {
                self.not_enforced.push(note);
            }
        }
    }
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
}

/// What this host can enforce, detected once per process.
pub struct Host {
    pub cgroups: Option<Box<dyn CgroupManager>>,
    /// Why cgroups are unavailable, when they are.
    pub cgroup_problem: Option<String>,
    pub landlock_abi: Option<u8>,
    pub seccomp: bool,
}

impl Host {
    pub fn detect() -> Host {
        let (cgroups, cgroup_problem) = match cgroup::detect() {
            Ok(Some(m)) => (Some(m), None),
            Ok(None) => (
                None,
                Some("no usable cgroup hierarchy with memory, cpu or pids controllers".to_string()),
            ),
            Err(e) => (None, Some(e.to_string())),
        };
        Host {
            cgroups,
            cgroup_problem,
            landlock_abi: landlock::kernel_abi(),
            seccomp: seccomp::available(),
        }
    }
}

/// How `run` is told to go on without a protection (the controller names its own flag).
pub const DEGRADE_HINT: &str =
    "or pass --allow-degraded to run without it (the report lists what was not enforced)";

/// Decides what will be enforced for `spec` on `host`, refusing (unless the spec allows
/// degradation) any requested protection the kernel cannot provide.
pub fn preflight(spec: &SandboxSpec, host: &Host) -> Result<Enforcement, SandboxError> {
    let mut e = Enforcement {
        namespaces: {
            let mut ns = vec!["user", "pid", "mount"];
            if spec.namespaces.net {
                ns.push("net");
            }
            if spec.namespaces.ipc {
                ns.push("ipc");
            }
            if spec.namespaces.uts {
                ns.push("uts");
            }
            if spec.namespaces.cgroup {
                ns.push("cgroup");
            }
            ns
        },
        seccomp_profile: spec.profile_name.clone(),
        profile_sha256: spec.profile_sha256.clone(),
        no_new_privs: true,
        capabilities: "none",
        uid_host: spec.identity.host_uid,
        gid_host: spec.identity.host_gid,
        rootless: spec.identity.rootless,
        ..Enforcement::default()
    };
    let refuse = |what: &str, why: String, fix: &str| SandboxError::Refused {
        what: what.to_string(),
        why,
        fix: format!("{fix}, {DEGRADE_HINT}"),
    };
    for (ns, on) in [
        ("net", spec.namespaces.net),
        ("ipc", spec.namespaces.ipc),
        ("uts", spec.namespaces.uts),
        ("cgroup", spec.namespaces.cgroup),
    ] {
        if !on {
            e.not_enforced.push(format!(
                "{ns} namespace: shared with the host by the profile"
            ));
        }
    }

    // seccomp (the instruction counts are filled in once the filters are compiled)
    if host.seccomp {
        e.seccomp = "filter".into();
        e.seccomp_floor = "filter".into();
        if let SeccompSource::Compiled(f) = &spec.seccomp {
            e.record_filters(f);
        }
    } else if spec.allow_degraded {
        e.seccomp = "none".into();
        e.seccomp_floor = "none".into();
        e.not_enforced
            .push("seccomp: the kernel has no seccomp filter support".into());
    } else {
        return Err(refuse(
            "seccomp",
            "the kernel has no seccomp filter support".into(),
            "use a kernel built with CONFIG_SECCOMP_FILTER",
        ));
    }

    // The executable allowlist: its heart is Landlock's execute right (ABI 1).
    if let Some(allow) = &spec.exec_allowlist {
        let mut by = Vec::new();
        if host.landlock_abi.is_some() {
            let own = spec
                .landlock
                .exec_files
                .len()
                .saturating_sub(allow.files.len() + allow.loaders.len());
            let plural = |n: usize| if n == 1 { "" } else { "s" };
            by.push(format!(
                "landlock execute right on the {} listed file{} and {} ELF loader{} only{}",
                allow.files.len(),
                plural(allow.files.len()),
                allow.loaders.len(),
                plural(allow.loaders.len()),
                if own > 0 {
                    format!(" (and {own} file(s) hatchery binds in itself)")
                } else {
                    String::new()
                }
            ));
            by.push(format!("no read access to {}", exec::EXEC_DIRS.join(" ")));
        } else if spec.allow_degraded {
            e.not_enforced.push(
                "executable allowlist: the kernel has no Landlock, so any readable file may be executed; only the noexec mounts and the seccomp floor's memory-file rules apply".into(),
            );
        } else {
            return Err(refuse(
                "the executable allowlist",
                "the kernel has no Landlock (its execute right is what enforces the allowlist)"
                    .into(),
                "boot a kernel with Landlock enabled (5.13+, lsm=...,landlock)",
            ));
        }
        by.push("/tmp, /dev/shm and --rw paths mounted noexec".into());
        if host.seccomp {
            by.push(
                "seccomp floor: memfd_create and memfd_secret fail with EACCES, and shmat with SHM_EXEC (no file the sandbox writes can be mapped executable)".into(),
            );
        }
        e.exec_allowlist = Some(ExecEnforcement {
            files: allow.files.clone(),
            loaders: allow.loaders.clone(),
            by,
            notes: allow.notes.clone(),
        });
    }

    // Landlock
    match host.landlock_abi {
        Some(abi) if abi >= spec.landlock_min_abi => {
            e.landlock_abi = Some(abi);
            e.landlock = "pending".into();
        }
        found => {
            let why = match found {
                Some(abi) => format!(
                    "the kernel offers Landlock ABI {abi}, the profile needs at least {}",
                    spec.landlock_min_abi
                ),
                None => "the kernel has no Landlock (not built in, or not in the `lsm=` boot list)"
                    .into(),
            };
            if !spec.allow_degraded {
                return Err(refuse(
                    "Landlock filesystem rules",
                    why,
                    "boot a kernel with Landlock enabled (5.13+, lsm=...,landlock)",
                ));
            }
            e.landlock = "none".into();
            e.not_enforced.push(format!("landlock: {why}"));
        }
    }
    if spec.landlock.deny_tcp && host.landlock_abi.unwrap_or(0) < landlock::TCP_ABI {
        let why = format!(
            "the profile refuses all TCP (deny_tcp), which needs Landlock ABI {} (the kernel offers {})",
            landlock::TCP_ABI,
            host.landlock_abi
                .map_or("none".to_string(), |a| a.to_string())
        );
        if !spec.allow_degraded {
            return Err(refuse(
                "the profile's TCP denial",
                why,
                "boot Linux 6.7 or later",
            ));
        }
        e.not_enforced.push(format!(
            "deny_tcp: {why}; loopback TCP stays possible (the network namespace still has no route out)"
        ));
    }

    // cgroup limits
    let mut cg_limits = spec.limits;
    let mut lacking: Vec<(&'static str, String)> = Vec::new();
    match &host.cgroups {
        Some(m) => {
            let have = m.controllers();
            let v = m.version();
            e.cgroup = v.to_string();
            let checks: [(&'static str, bool, bool, String); 3] = [
                ("memory", spec.limits.memory.is_some(), have.memory, match v {
                    cgroup::CgroupVersion::V1 => "cgroup v1 memory.limit_in_bytes (+ memory.memsw.limit_in_bytes: no swap; memory.kmem.tcp.limit_in_bytes: TCP buffers)".into(),
                    cgroup::CgroupVersion::V2 => "cgroup v2 memory.max (+ memory.swap.max 0, memory.oom.group; socket buffers are charged too)".into(),
                }),
                ("cpus", spec.limits.cpus.is_some(), have.cpu, match v {
                    cgroup::CgroupVersion::V1 => "cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us".into(),
                    cgroup::CgroupVersion::V2 => "cgroup v2 cpu.max".into(),
                }),
                ("pids", spec.limits.pids.is_some(), have.pids, format!("cgroup {v} pids.max")),
            ];
            for (name, asked, available, how) in checks {
                if !asked {
                    continue;
                }
                if available {
                    e.limits.insert(name, how);
                } else {
                    lacking.push((
                        name,
                        format!("no {name} controller in this host's cgroup {v} hierarchy"),
                    ));
                }
            }
            if spec.limits.memory.is_some() && have.memory && v == cgroup::CgroupVersion::V1 {
                e.not_enforced.push(
                    "memory limit: cgroup v1 does not charge UDP, unix and netlink socket buffers to it (cgroup v2 does); they are bounded only by the host's per-socket maximum (net.core.rmem_max) times the open-file limit".into(),
                );
            }
            if spec.limits.memory.is_some() && have.memory && !have.swap_off {
                let why = "the host has swap but no swap accounting, so the sandbox could swap beyond its memory limit".to_string();
                if !spec.allow_degraded {
                    return Err(refuse(
                        "--memory",
                        why,
                        "boot with swapaccount=1 (v1) or enable memory.swap.max (v2), or turn swap off",
                    ));
                }
                e.not_enforced
                    .push(format!("memory limit: swap not limited ({why})"));
            }
        }
        None => {
            e.cgroup = "none".into();
            let why = host
                .cgroup_problem
                .clone()
                .unwrap_or_else(|| "no cgroups".into());
            for (name, asked) in [
                ("memory", spec.limits.memory.is_some()),
                ("cpus", spec.limits.cpus.is_some()),
                ("pids", spec.limits.pids.is_some()),
            ] {
                if asked {
                    lacking.push((name, why.clone()));
                }
            }
            e.not_enforced.push(format!(
                "accounting (cpu_usec, memory_peak_bytes, pids_peak): {why}"
            ));
        }
    }
    if let Some((name, why)) = lacking.first() {
        if !spec.allow_degraded {
            let fix = if spec.identity.rootless {
                "get a delegated cgroup v2 subtree: systemd-run --user --scope -p Delegate=yes hatchery run ..."
            } else {
                "mount (or enable) the memory, cpu and pids cgroup controllers"
            };
            return Err(refuse(&format!("--{name}"), why.clone(), fix));
        }
    }
    for (name, why) in lacking {
        degrade_limit(name, &why, spec, &mut e);
        match name {
            "memory" => cg_limits.memory = None,
            "cpus" => cg_limits.cpus = None,
            _ => cg_limits.pids = None,
        }
    }
    e.cgroup_limits = cg_limits;
    Ok(e)
}

/// A limit no cgroup can enforce here, run degraded: what setrlimit(2) can stand in for
/// it, recorded as exactly that, and the rest reported as not enforced.
fn degrade_limit(name: &'static str, why: &str, spec: &SandboxSpec, e: &mut Enforcement) {
    use crate::profile::RlimitResource;
    match (name, spec.limits.memory, spec.limits.pids) {
        ("memory", Some(bytes), _) => {
            e.fallback_rlimits.push(Rlimit {
                resource: RlimitResource::As,
                soft: bytes,
                hard: bytes,
            });
            e.limits.insert("memory", "RLIMIT_AS per process (degraded: caps address space, not resident memory; /tmp and the sum over processes are not limited)".into());
            e.not_enforced.push(format!(
                "memory limit as a cgroup limit: {why}; only RLIMIT_AS per process applies"
            ));
        }
        ("pids", _, Some(n)) => {
            // Counted per uid in the sandbox's user namespace; pid 1 is one of them.
            let n = n.saturating_add(1);
            e.fallback_rlimits.push(Rlimit {
                resource: RlimitResource::Nproc,
                soft: n,
                hard: n,
            });
            e.limits.insert("pids", "RLIMIT_NPROC of the sandbox's uid in its user namespace (degraded: counts tasks of that uid only)".into());
            e.not_enforced.push(format!(
                "pids limit as a cgroup limit: {why}; RLIMIT_NPROC applies instead"
            ));
        }
        _ => e.not_enforced.push(format!(
            "{name} limit: {why} (no rlimit can stand in for it)"
        )),
    }
}
