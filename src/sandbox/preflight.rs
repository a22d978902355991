//! Preflight: what this host can enforce for one sandbox, decided before anything is set
//! up. The host is assessed once ([`Host::detect`]); each request is turned into a typed
//! [`Plan`] — which mechanism enforces each protection, or why none does — refusing
//! (unless degradation was allowed) anything the kernel cannot enforce. `run`, the
//! controller's launcher and `doctor` all read the host through here, so each gap has one
//! fix text ([`fix`]) wherever it is reported.

use std::collections::BTreeMap;

use super::cgroup::{self, CgroupManager, CgroupVersion, Limits};
use super::{Enforcement, ExecEnforcement, Filters, SandboxError, SandboxSpec};
use super::{exec, landlock, seccomp};
use crate::profile::{Rlimit, RlimitResource};

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

/// How to close each gap the host may have: one text per gap, shown by a refusal and by
/// `doctor` alike.
pub mod fix {
    pub const SECCOMP: &str = "use a kernel built with CONFIG_SECCOMP_FILTER";
    pub const LANDLOCK: &str = "boot a kernel with Landlock enabled (5.13+, lsm=...,landlock)";
    pub const LANDLOCK_TCP: &str = "boot Linux 6.7 or later";
    pub const SWAP: &str =
        "boot with swapaccount=1 (v1) or enable memory.swap.max (v2), or turn swap off";
    pub const CGROUP_CONTROLLERS: &str =
        "mount (or enable) the memory, cpu and pids cgroup controllers";

    /// For an unprivileged user without cgroups: a delegated subtree to run `command` in.
    pub fn delegated_scope(command: &str) -> String {
        format!(
            "get a delegated cgroup v2 subtree: systemd-run --user --scope -p Delegate=yes hatchery {command} ..."
        )
    }
}

/// Who asked for the sandbox: a refusal names the asker's own way to go on degraded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// `hatchery run`.
    Run,
    /// The controller, for a worker.
    Controller,
}

impl Asker {
    /// How this asker is told to go on without a protection.
    pub fn degrade_hint(self) -> &'static str {
        match self {
            Asker::Run => {
                "or pass --allow-degraded to run without it (the report lists what was not enforced)"
            }
            // Whether a worker may start degraded is the controller's matter, not the
            // spawner's: name the controller.
            Asker::Controller => {
                "or start the controller with --allow-degraded to start workers without it (worker_started lists what was not enforced)"
            }
        }
    }

    fn command(self) -> &'static str {
        match self {
            Asker::Run => "run",
            Asker::Controller => "controller",
        }
    }
}

/// How the seccomp filters are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeccompPlan {
    /// The floor's and the profile's filters are loaded.
    Filters,
    /// No filter (a degraded run on a kernel without seccomp).
    Off,
}

/// How the Landlock rules are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockPlan {
    /// Applied at this ABI; how fully is known once the sandbox has applied them.
    Rules { abi: u8 },
    /// Not applied (a degraded run).
    Off,
}

/// How the sandbox's cgroup is set up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CgroupPlan {
    /// A cgroup of this version, given these limits (the requested ones it can enforce).
    Limits {
        version: CgroupVersion,
        limits: Limits,
    },
    /// No cgroup: no accounting, and limits only as rlimits (a degraded run).
    Off,
}

/// What will be enforced for one sandbox, and by what.
#[derive(Debug, Clone)]
pub struct Plan {
    pub namespaces: Vec<&'static str>,
    pub seccomp: SeccompPlan,
    pub landlock: LandlockPlan,
    pub cgroup: CgroupPlan,
    /// Requested limit → the kernel mechanism enforcing it.
    pub limits: BTreeMap<&'static str, String>,
    /// rlimits standing in for cgroup limits the host cannot enforce (degraded runs only).
    pub fallback_rlimits: Vec<Rlimit>,
    /// The executable allowlist, when there is one.
    pub exec_allowlist: Option<ExecEnforcement>,
    /// What was asked for (or is normally enforced) and is not, with the reason.
    pub not_enforced: Vec<String>,
}

impl Plan {
    /// The report's `enforcement` object as planned; the start fills in what only it
    /// learns (the cgroup's path, the filters' sizes, notes on exposed paths).
    pub fn enforcement(&self, spec: &SandboxSpec) -> Enforcement {
        Enforcement {
            namespaces: self.namespaces.clone(),
            cgroup: match self.cgroup {
                CgroupPlan::Limits { version, .. } => version.to_string(),
                CgroupPlan::Off => "none".into(),
            },
            cgroup_path: None,
            limits: self.limits.clone(),
            seccomp: self.seccomp.word().into(),
            seccomp_floor: self.seccomp.word().into(),
            seccomp_profile: spec.profile_name.clone(),
            profile_sha256: spec.profile_sha256.clone(),
            landlock_abi: match self.landlock {
                LandlockPlan::Rules { abi } => Some(abi),
                LandlockPlan::Off => None,
            },
            landlock: match self.landlock {
                LandlockPlan::Rules { .. } => "pending".into(),
                LandlockPlan::Off => "none".into(),
            },
            no_new_privs: true,
            capabilities: "none",
            uid_host: spec.identity.host_uid,
            gid_host: spec.identity.host_gid,
            rootless: spec.identity.rootless,
            exec_allowlist: self.exec_allowlist.clone(),
            stdio: None,
            not_enforced: self.not_enforced.clone(),
        }
    }
}

impl SeccompPlan {
    fn word(self) -> &'static str {
        match self {
            SeccompPlan::Filters => "filter",
            SeccompPlan::Off => "none",
        }
    }

    /// Says in `e` what the compiled `filters` are (sizes, floor rules left out).
    pub fn record(self, filters: &Filters, e: &mut Enforcement) {
        if self == SeccompPlan::Off {
            return;
        }
        e.seccomp = format!("filter ({} instructions)", filters.profile.len());
        e.seccomp_floor = format!("filter ({} instructions)", filters.floor.len());
        for note in &filters.floor_notes {
            let note = format!("seccomp floor: {note}");
            if !e.not_enforced.contains(&note) {
                e.not_enforced.push(note);
            }
        }
    }
}

/// Decides what will be enforced for `spec` on `host`, refusing (unless the spec allows
/// degradation) any requested protection the kernel cannot provide.
pub fn preflight(spec: &SandboxSpec, host: &Host, asker: Asker) -> Result<Plan, SandboxError> {
    let refuse = |what: &str, why: String, fix: &str| SandboxError::Refused {
        what: what.to_string(),
        why,
        fix: format!("{fix}, {}", asker.degrade_hint()),
    };
    let mut not_enforced = Vec::new();
    let mut namespaces = vec!["user", "pid", "mount"];
    for (ns, on) in [
        ("net", spec.namespaces.net),
        ("ipc", spec.namespaces.ipc),
        ("uts", spec.namespaces.uts),
        ("cgroup", spec.namespaces.cgroup),
    ] {
        if on {
            namespaces.push(ns);
        }
    }
    for (ns, on) in [
        ("net", spec.namespaces.net),
        ("ipc", spec.namespaces.ipc),
        ("uts", spec.namespaces.uts),
        ("cgroup", spec.namespaces.cgroup),
    ] {
        if !on {
            not_enforced.push(format!(
                "{ns} namespace: shared with the host by the profile"
            ));
        }
    }

    let seccomp = if host.seccomp {
        SeccompPlan::Filters
    } else if spec.allow_degraded {
        not_enforced.push("seccomp: the kernel has no seccomp filter support".into());
        SeccompPlan::Off
    } else {
        return Err(refuse(
            "seccomp",
            "the kernel has no seccomp filter support".into(),
            fix::SECCOMP,
        ));
    };

    let exec_allowlist = plan_exec_allowlist(spec, host, &mut not_enforced)
        .map_err(|(what, why)| refuse(what, why, fix::LANDLOCK))?;

    let landlock = match host.landlock_abi {
        Some(abi) if abi >= spec.landlock_min_abi => LandlockPlan::Rules { abi },
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
                return Err(refuse("Landlock filesystem rules", why, fix::LANDLOCK));
            }
            not_enforced.push(format!("landlock: {why}"));
            LandlockPlan::Off
        }
    };
    if spec.landlock.deny_tcp && host.landlock_abi.unwrap_or(0) < landlock::TCP_ABI {
        let why = format!(
            "the profile refuses all TCP (deny_tcp), which needs Landlock ABI {} (the kernel offers {})",
            landlock::TCP_ABI,
            host.landlock_abi
                .map_or("none".to_string(), |a| a.to_string())
        );
        if !spec.allow_degraded {
            return Err(refuse("the profile's TCP denial", why, fix::LANDLOCK_TCP));
        }
        not_enforced.push(format!(
            "deny_tcp: {why}; loopback TCP stays possible (the network namespace still has no route out)"
        ));
    }

    let mut plan = Plan {
        namespaces,
        seccomp,
        landlock,
        cgroup: CgroupPlan::Off,
        limits: BTreeMap::new(),
        fallback_rlimits: Vec::new(),
        exec_allowlist,
        not_enforced,
    };
    plan_cgroup(spec, host, asker, &mut plan)
        .map_err(|(what, why, fix)| refuse(&what, why, &fix))?;
    Ok(plan)
}

/// The executable allowlist: its heart is Landlock's execute right (ABI 1). `Err` is
/// (what, why) of a refusal.
fn plan_exec_allowlist(
    spec: &SandboxSpec,
    host: &Host,
    not_enforced: &mut Vec<String>,
) -> Result<Option<ExecEnforcement>, (&'static str, String)> {
    let Some(allow) = &spec.exec_allowlist else {
        return Ok(None);
    };
    let mut by = Vec::new();
    if host.landlock_abi.is_some() {
        let own = spec
            .landlock
            .exec_files
            .len()
            .saturating_sub(allow.files.len().saturating_add(allow.loaders.len()));
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
        not_enforced.push(
            "executable allowlist: the kernel has no Landlock, so any readable file may be executed; only the noexec mounts and the seccomp floor's memory-file rules apply".into(),
        );
    } else {
        return Err((
            "the executable allowlist",
            "the kernel has no Landlock (its execute right is what enforces the allowlist)".into(),
        ));
    }
    by.push("/tmp, /dev/shm and --rw paths mounted noexec".into());
    if host.seccomp {
        by.push(
            "seccomp floor: memfd_create and memfd_secret fail with EACCES, and shmat with SHM_EXEC (no file the sandbox writes can be mapped executable)".into(),
        );
    }
    Ok(Some(ExecEnforcement {
        files: allow.files.clone(),
        loaders: allow.loaders.clone(),
        by,
        notes: allow.notes.clone(),
    }))
}

/// The cgroup limits: each requested one by the host's controller, or (degraded) by an
/// rlimit standing in for it. `Err` is (what, why, fix) of a refusal.
fn plan_cgroup(
    spec: &SandboxSpec,
    host: &Host,
    asker: Asker,
    plan: &mut Plan,
) -> Result<(), (String, String, String)> {
    let mut cg_limits = spec.limits;
    let mut lacking: Vec<(&'static str, String)> = Vec::new();
    let version = match &host.cgroups {
        Some(m) => {
            let have = m.controllers();
            let v = m.version();
            let checks: [(&'static str, bool, bool, String); 3] = [
                ("memory", spec.limits.memory.is_some(), have.memory, match v {
                    CgroupVersion::V1 => "cgroup v1 memory.limit_in_bytes (+ memory.memsw.limit_in_bytes: no swap; memory.kmem.tcp.limit_in_bytes: TCP buffers)".into(),
                    CgroupVersion::V2 => "cgroup v2 memory.max (+ memory.swap.max 0, memory.oom.group; socket buffers are charged too)".into(),
                }),
                ("cpus", spec.limits.cpus.is_some(), have.cpu, match v {
                    CgroupVersion::V1 => "cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us".into(),
                    CgroupVersion::V2 => "cgroup v2 cpu.max".into(),
                }),
                ("pids", spec.limits.pids.is_some(), have.pids, format!("cgroup {v} pids.max")),
            ];
            for (name, asked, available, how) in checks {
                if !asked {
                    continue;
                }
                if available {
                    plan.limits.insert(name, how);
                } else {
                    lacking.push((
                        name,
                        format!("no {name} controller in this host's cgroup {v} hierarchy"),
                    ));
                }
            }
            if spec.limits.memory.is_some() && have.memory && v == CgroupVersion::V1 {
                plan.not_enforced.push(
                    "memory limit: cgroup v1 does not charge UDP, unix and netlink socket buffers to it (cgroup v2 does); they are bounded only by the host's per-socket maximum (net.core.rmem_max) times the open-file limit".into(),
                );
            }
            if spec.limits.memory.is_some() && have.memory && !have.swap_off {
                let why = "the host has swap but no swap accounting, so the sandbox could swap beyond its memory limit".to_string();
                if !spec.allow_degraded {
                    return Err(("--memory".into(), why, fix::SWAP.into()));
                }
                plan.not_enforced
                    .push(format!("memory limit: swap not limited ({why})"));
            }
            Some(v)
        }
        None => {
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
            plan.not_enforced.push(format!(
                "accounting (cpu_usec, memory_peak_bytes, pids_peak): {why}"
            ));
            None
        }
    };
    if let Some((name, why)) = lacking.first() {
        if !spec.allow_degraded {
            let fix = if spec.identity.rootless {
                fix::delegated_scope(asker.command())
            } else {
                fix::CGROUP_CONTROLLERS.to_string()
            };
            return Err((format!("--{name}"), why.clone(), fix));
        }
    }
    for (name, why) in lacking {
        degrade_limit(name, &why, spec, plan);
        match name {
            "memory" => cg_limits.memory = None,
            "cpus" => cg_limits.cpus = None,
            _ => cg_limits.pids = None,
        }
    }
    plan.cgroup = match version {
        Some(version) => CgroupPlan::Limits {
            version,
            limits: cg_limits,
        },
        None => CgroupPlan::Off,
    };
    Ok(())
}

/// A limit no cgroup can enforce here, run degraded: what setrlimit(2) can stand in for
/// it, recorded as exactly that, and the rest reported as not enforced.
fn degrade_limit(name: &'static str, why: &str, spec: &SandboxSpec, plan: &mut Plan) {
    let (resource, value, how, instead) = match (name, spec.limits.memory, spec.limits.pids) {
        ("memory", Some(bytes), _) => (
            RlimitResource::As,
            bytes,
            "RLIMIT_AS per process (degraded: caps address space, not resident memory; /tmp and the sum over processes are not limited)",
            "only RLIMIT_AS per process applies",
        ),
        // Counted per uid in the sandbox's user namespace; pid 1 is one of them.
        ("pids", _, Some(n)) => (
            RlimitResource::Nproc,
            n.saturating_add(1),
            "RLIMIT_NPROC of the sandbox's uid in its user namespace (degraded: counts tasks of that uid only)",
            "RLIMIT_NPROC applies instead",
        ),
        _ => {
            plan.not_enforced.push(format!(
                "{name} limit: {why} (no rlimit can stand in for it)"
            ));
            return;
        }
    };
    plan.fallback_rlimits.push(Rlimit {
        resource,
        soft: value,
        hard: value,
    });
    plan.limits.insert(name, how.into());
    plan.not_enforced
        .push(format!("{name} limit as a cgroup limit: {why}; {instead}"));
}

#[cfg(test)]
mod tests;
