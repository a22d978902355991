//! The launch pipeline: the supervisor's side (clone, id maps, cgroup, wait) and the
//! ordered list of steps the sandbox performs on itself before its payload runs.
//!
//! Read [`contain_steps`] and [`payload_steps`] top to bottom for the whole security order
//! (every step fails with one [`Step`] error):
//! network namespace → identity → loopback → root filesystem → cgroup → cgroup namespace
//! → hostname → not dumpable → start the payload (in pid 1's memory until its execve, see
//! [`super::spawn`]); in the payload: session → descriptors → the filters and the start
//! gate → controlling terminal (the sandbox's own pty, when it has one) → cwd → rlimits →
//! capabilities → no_new_privs → Landlock → seccomp (the floor, then the profile's filter,
//! last) → execve.
//!
//! Starting a sandbox is fork-like: it must happen in a single-threaded process (the
//! `run` command, or the controller's launcher forked before its async runtime starts).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use super::cgroup::{CgroupManager, CgroupVersion, SandboxCgroup, Usage};
use super::channel::{self, FromSandbox, ToSandbox};
use super::elsewhere::{self, Elsewhere};
use super::mounts;
use super::namespaces::{self, Cloned};
use super::output::OutputSummary;
use super::preflight::{CgroupPlan, LandlockPlan, Plan};
use super::process;
use super::userns;
use super::{Enforcement, SandboxError, SandboxSpec};

/// Exit status pid 1 uses when setup failed (mirrors `run`'s 125).
pub(super) const SETUP_FAILED: i32 = 125;

/// Everything the sandbox side needs, converted before the clone so that the child only
/// reads memory it was given.
pub(super) struct ChildContext<'a> {
    pub(super) spec: &'a SandboxSpec,
    pub(super) argv: Vec<CString>,
    pub(super) env: Vec<CString>,
    pub(super) path_var: String,
    pub(super) hostname: String,
    /// The inside uid/gid the payload runs as.
    pub(super) payload_ids: (u32, u32),
    /// A prepared sandbox of a warm pool: pid 1 waits, after building its root, for the
    /// claim that names its command, environment, hostname and descriptors (see [`warm`]).
    pub(super) warm: bool,
    pub(super) landlock: bool,
    pub(super) unshare_cgroup: bool,
    /// (source fd, target number) pairs for the payload, stdio included.
    pub(super) fds: Vec<(RawFd, RawFd)>,
    /// rlimits standing in for limits no cgroup enforces (degraded runs).
    pub(super) fallback_rlimits: Vec<crate::profile::Rlimit>,
    /// The supervisor's prepared copies of the bind sources (empty when unprivileged).
    pub(super) trees: Vec<RawFd>,
    /// Securebits to restore first thing (the creator guard changed the inherited ones).
    pub(super) securebits: Option<libc::c_int>,
    /// The supervisor's command line and environment areas, overwritten first thing.
    pub(super) title: Option<process::ProcTitle>,
}

fn to_cstrings(items: impl Iterator<Item = String>) -> Result<Vec<CString>, SandboxError> {
    items
        .map(|s| {
            CString::new(s).map_err(|_| {
                SandboxError::Invalid("an argument or variable contains a NUL byte".into())
            })
        })
        .collect()
}

/// A started sandbox, seen from its supervisor.
pub struct Sandbox {
    pid: Pid,
    pidfd: OwnedFd,
    channel: OwnedFd,
    cgroup: Option<Box<dyn SandboxCgroup>>,
    started: Instant,
    finished: bool,
    /// The host ids stay the sandbox's until it has ended.
    _lease: Option<super::idpool::IdLease>,
    pub enforcement: Enforcement,
    /// The egress listeners pid 1 handed over, until the broker takes them.
    egress: Vec<OwnedFd>,
    /// A message that came while the supervisor waited for the listeners.
    early: Option<FromSandbox>,
    /// The start gate's read end (see `channel::start_gate`): at end of file once the
    /// command is past its `execve`, or its set-up ended.
    start_gate: Option<OwnedFd>,
}

/// Why the payload never ran, or why its status is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    Setup {
        step: String,
        errno: i32,
        detail: String,
    },
    Exec {
        errno: i32,
    },
    /// pid 1, hatchery's own process in the sandbox, died of a fault (SIGSEGV, SIGBUS,
    /// SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP) before it could report the command's
    /// status: a crash of hatchery's, or a stack limit too small for it. Nothing in the
    /// sandbox can send it such a signal (a pid namespace's init takes none from inside),
    /// so it is never the command's status.
    Crashed {
        signal: i32,
    },
}

impl Failure {
    /// The exit status `run` reports for a payload that never ran (or whose status is
    /// unknown: hatchery's own failure).
    pub fn exit_code(&self) -> i32 {
        inside::never_ran_code(match self {
            Failure::Setup { .. } | Failure::Crashed { .. } => None,
            Failure::Exec { errno } => Some(*errno),
        })
    }

    /// The failure a signal that ended pid 1 stands for, if it is one of the faults only
    /// its own code can raise (see [`Failure::Crashed`]).
    pub fn of_pid1_signal(signal: i32) -> Option<Failure> {
        matches!(
            signal,
            libc::SIGSEGV
                | libc::SIGBUS
                | libc::SIGILL
                | libc::SIGFPE
                | libc::SIGABRT
                | libc::SIGSYS
                | libc::SIGTRAP
        )
        .then_some(Failure::Crashed { signal })
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Setup {
                step,
                errno,
                detail,
            } => {
                let e = io::Error::from_raw_os_error(*errno);
                if detail.is_empty() {
                    write!(f, "sandbox setup failed at {step}: {e}")
                } else {
                    write!(f, "sandbox setup failed at {step}: {e} ({detail})")
                }
            }
            Failure::Exec { errno } => write!(f, "{}", io::Error::from_raw_os_error(*errno)),
            Failure::Crashed { signal } => {
                let name = nix::sys::signal::Signal::try_from(*signal)
                    .map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_string());
                let why = if matches!(*signal, libc::SIGSEGV | libc::SIGBUS) {
                    "a crash, or a stack limit too small for it (ulimit -s)"
                } else {
                    "a crash"
                };
                // Whether the command had started cannot be told: the start gate closes
                // with pid 1 whichever it was.
                write!(
                    f,
                    "the sandbox's pid 1 (hatchery's own process) died of {name}: {why}; the command's status is unknown"
                )
            }
        }
    }
}

/// How a sandbox ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The exit status `run` reports (see the command-line contract).
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub oom_killed: bool,
    pub timed_out: bool,
    pub wall: Duration,
    pub usage: Usage,
    pub landlock: Option<(u8, String)>,
    pub failure: Option<Failure>,
    /// Set when the sandbox's cgroup could not be removed.
    pub cleanup_error: Option<String>,
    /// What passed through the output pump, when there was one.
    pub output: Option<OutputSummary>,
}

/// Starts `spec` in a new sandbox as `plan` (its [`super::preflight`]) says. `cgroups` is
/// the host's backend, if any.
pub fn start(
    spec: &SandboxSpec,
    plan: &Plan,
    cgroups: Option<&dyn CgroupManager>,
) -> Result<Sandbox, SandboxError> {
    let pid1 = clone_pid1(spec, plan, cgroups, false)?;
    hand_over(pid1, spec, plan, cgroups)
}

/// A cloned pid 1, before the handshake.
struct Pid1 {
    sandbox: Sandbox,
    /// How it gets into its cgroup.
    into_cgroup: IntoCgroup,
    /// What the prepared bind sources could not enforce.
    tree_notes: Vec<String>,
    /// The exposures' owners' groups its bind sources were mapped with.
    owner_groups: mounts::OwnerGroups,
    /// Barred from the supervisor's processor until its id maps are written.
    elsewhere: Option<Elsewhere>,
}

/// How a cloned pid 1 gets into its cgroup.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IntoCgroup {
    /// Born inside it (v2, `CLONE_INTO_CGROUP`), or there is none.
    Born,
    /// The supervisor moves it in from outside (v2 kernels without `CLONE_INTO_CGROUP`).
    Attached,
    /// It moves itself in (v1, see [`SandboxCgroup::self_join_files`]), with files the
    /// supervisor sends once it has made the cgroup, after the clone: meanwhile, on the
    /// other processor, the sandbox makes its network namespace and builds its root.
    JoinsItself,
}

/// Creates the sandbox's cgroup and its pid 1, in its namespaces; `warm`: pid 1 waits for
/// a claim after building its root (see [`warm`]).
fn clone_pid1(
    spec: &SandboxSpec,
    plan: &Plan,
    cgroups: Option<&dyn CgroupManager>,
    warm: bool,
) -> Result<Pid1, SandboxError> {
    process::ensure_single_threaded().map_err(|e| SandboxError::Internal(e.to_string()))?;
    let started = Instant::now();
    let mut enforcement = plan.enforcement(spec);
    // Each step is logged at debug level (`-vv`, `HATCHERY_LOG=debug`) before it is taken,
    // so that a refusal can be read against the last step shown.
    // On v1 the sandbox moves itself in, so its cgroup is made after the clone (in
    // `settle_cgroup`); elsewhere it is born inside, or attached.
    let joins_itself = cgroups.is_some_and(|m| m.version() == CgroupVersion::V1);
    let cgroup = if joins_itself {
        None
    } else {
        create_cgroup(spec, plan.cgroup, cgroups)?
    };
    enforcement.cgroup_path = cgroup.as_ref().map(|c| c.path().to_path_buf());
    let into = cgroup
        .as_ref()
        .and_then(|c| c.clone_into_fd())
        .map(|fd| fd.as_raw_fd());
    let fds = payload_fds(spec);
    let path_var = path_var(spec);
    let planned_notes = enforcement.not_enforced.len();
    let mut prepared = prepare_trees(spec, &mut enforcement)?;
    let tree_notes = enforcement
        .not_enforced
        .get(planned_notes..)
        .unwrap_or_default()
        .to_vec();
    let owner_groups = std::mem::take(&mut prepared.groups);
    let lease = spec
        .id_lease
        .as_ref()
        .map(|l| l.try_clone())
        .transpose()
        .map_err(|e| SandboxError::Internal(format!("id lease: {e}")))?;

    let (supervisor_end, sandbox_end) =
        channel::pair().map_err(|e| SandboxError::Internal(format!("socketpair: {e}")))?;
    // The user namespace is created by the sandbox's own host uid (see CreatorGuard).
    let creator = if spec.identity.rootless {
        None
    } else {
        Some(
            userns::CreatorGuard::become_uid(spec.identity.host_uid).map_err(|e| {
                SandboxError::Internal(format!("cannot act as the sandbox's host uid: {e}"))
            })?,
        )
    };
    let ctx = ChildContext {
        spec,
        argv: to_cstrings(spec.argv.iter().cloned())?,
        env: to_cstrings(spec.env.iter().map(|(k, v)| format!("{k}={v}")))?,
        path_var,
        hostname: spec.hostname.clone(),
        payload_ids: spec.identity.payload_ids,
        warm,
        landlock: matches!(plan.landlock, LandlockPlan::Rules { .. }),
        unshare_cgroup: spec.namespaces.cgroup,
        fds,
        fallback_rlimits: plan.fallback_rlimits.clone(),
        trees: prepared.raw(),
        securebits: creator.as_ref().map(|c| c.original_securebits()),
        title: process::ProcTitle::current(),
    };

    tracing::debug!(
        net = spec.namespaces.net,
        ipc = spec.namespaces.ipc,
        uts = spec.namespaces.uts,
        into_cgroup = into.is_some(),
        host_uid = spec.identity.host_uid,
        warm,
        "creating the sandbox (user, mount and pid namespaces)"
    );
    let (attempt, born_inside) = namespaces::clone_sandbox(&spec.namespaces, into);
    if !matches!(attempt, Ok(Cloned::Child)) {
        drop(creator);
    }
    let (pid, pidfd) = match attempt {
        Ok(Cloned::Child) => {
            drop(supervisor_end);
            let ctx = ChildContext {
                unshare_cgroup: ctx.unshare_cgroup && !born_inside,
                ..ctx
            };
            inside::contain(ctx, sandbox_end)
        }
        Ok(Cloned::Parent { pid, pidfd }) => (pid, pidfd),
        Err(e) => return Err(refused::namespaces(e)),
    };
    // First, so that pid 1 builds its root while this process does its own half.
    let elsewhere = elsewhere::start_elsewhere(pid);
    drop(sandbox_end);
    // The sandbox has its own copies.
    drop(prepared);
    let sandbox = Sandbox {
        pid,
        pidfd,
        channel: supervisor_end,
        cgroup,
        started,
        finished: false,
        _lease: lease,
        enforcement,
        egress: Vec::new(),
        early: None,
        start_gate: None,
    };
    // From here on, dropping `sandbox` on an error path kills it and removes its cgroup.
    let into_cgroup = if joins_itself {
        IntoCgroup::JoinsItself
    } else if born_inside || sandbox.cgroup.is_none() {
        IntoCgroup::Born
    } else {
        IntoCgroup::Attached
    };
    Ok(Pid1 {
        sandbox,
        into_cgroup,
        tree_notes,
        owner_groups,
        elsewhere,
    })
}

/// The sandbox's cgroup with its limits applied.
fn create_cgroup(
    spec: &SandboxSpec,
    plan: CgroupPlan,
    cgroups: Option<&dyn CgroupManager>,
) -> Result<Option<Box<dyn SandboxCgroup>>, SandboxError> {
    let (Some(m), CgroupPlan::Limits { version, limits }) = (cgroups, plan) else {
        return Ok(None);
    };
    tracing::debug!(name = %spec.cgroup_name, cgroup = %version, "creating the sandbox's cgroup");
    m.create(&spec.cgroup_name, &limits)
        .map(Some)
        .map_err(refused::cgroup)
}

/// The payload's (source, target) descriptor pairs: stdio first, then the passed fds.
fn payload_fds(spec: &SandboxSpec) -> Vec<(RawFd, RawFd)> {
    let mut fds = Vec::new();
    match &spec.stdio {
        Some(stdio) => {
            for (i, fd) in stdio.iter().enumerate() {
                fds.push((fd.as_raw_fd(), i as RawFd));
            }
        }
        None => fds.extend([(0, 0), (1, 1), (2, 2)]),
    }
    for (fd, target) in &spec.pass_fds {
        fds.push((fd.as_raw_fd(), *target));
    }
    fds
}

/// The PATH the payload's command is searched in.
fn path_var(spec: &SandboxSpec) -> String {
    spec.env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| super::DEFAULT_PATH.to_string())
}

/// The bind sources: copied here, by descriptor, when this supervisor may copy host
/// mounts; otherwise the sandbox copies them itself (checked against the descriptors).
fn prepare_trees(
    spec: &SandboxSpec,
    enforcement: &mut Enforcement,
) -> Result<mounts::PreparedTrees, SandboxError> {
    tracing::debug!(
        exposures = spec.rootfs.exposures.len(),
        rootless = spec.identity.rootless,
        "preparing the exposed paths (idmapped where the filesystem allows)"
    );
    if spec.identity.rootless {
        for b in spec.rootfs.exposures.iter().filter(|b| b.idmapped) {
            enforcement.not_enforced.push(mounts::unmapped_note(
                b,
                (spec.identity.host_uid, spec.identity.host_gid),
            ));
        }
        return Ok(mounts::PreparedTrees::default());
    }
    let groups = mounts::OwnerGroups::look_up(&spec.rootfs).map_err(refused::lookup)?;
    let prepared = mounts::prepare(
        &spec.rootfs,
        mounts::IdmapPlan {
            sandbox: (spec.identity.host_uid, spec.identity.host_gid),
            null: spec.null_ids,
        },
        groups,
    )
    .map_err(refused::trees)?;
    enforcement
        .not_enforced
        .extend(prepared.notes.iter().cloned());
    Ok(prepared)
}

/// The supervisor's side of the handshake with a cloned sandbox: its id maps, then (while
/// it builds its root) its cgroup with the go-ahead, and the filters.
fn hand_over(
    pid1: Pid1,
    spec: &SandboxSpec,
    plan: &Plan,
    cgroups: Option<&dyn CgroupManager>,
) -> Result<Sandbox, SandboxError> {
    let mut sandbox = pid1.sandbox;
    if let Err(e) = grant_identity(&sandbox, spec, pid1.elsewhere) {
        // pid 1 may have failed and left before its maps were written: its report, not
        // the closed channel, says why.
        return match sent_report(&sandbox) {
            Some(report) => {
                sandbox.early = Some(report);
                Ok(sandbox)
            }
            None => Err(e),
        };
    }
    // The sandbox may be gone already (a setup failure it reported): `wait` tells.
    let _ = settle_cgroup(&mut sandbox, pid1.into_cgroup, spec, plan, cgroups)?;
    // While the sandbox builds its root on the other processor: the filters (compiled
    // here when they were not already).
    tracing::debug!("compiling the seccomp filters (floor and profile)");
    let filters = spec.seccomp.compile()?;
    plan.seccomp.record(&filters, &mut sandbox.enforcement);
    tracing::debug!(
        "handing over the filters; the sandbox now sets its hostname, drops capabilities, applies Landlock and seccomp, and runs the command"
    );
    sandbox.hand_filters(&filters)?;
    if let Some(ports) = &spec.egress_ports {
        receive_listeners(&mut sandbox, ports.len())?;
    }
    Ok(sandbox)
}

/// Writes the sandbox's uid and gid maps and tells it so: it may take its identity. Then
/// lets it run on every processor its cpuset allows again (see [`elsewhere`]).
fn grant_identity(
    sandbox: &Sandbox,
    spec: &SandboxSpec,
    elsewhere: Option<Elsewhere>,
) -> Result<(), SandboxError> {
    let pid = sandbox.pid;
    tracing::debug!(pid = pid.as_raw(), "writing the sandbox's uid and gid maps");
    spec.identity
        .write_maps(pid.as_raw())
        .map_err(|e| SandboxError::Refused {
            what: "user namespace".into(),
            why: format!("cannot write the uid/gid maps: {e}"),
            fix: "an unprivileged user may map only its own uid; see `hatchery doctor`".into(),
        })?;
    ToSandbox::IdentityReady
        .send(&sandbox.channel)
        .map_err(|e| SandboxError::Internal(format!("sandbox went away during setup: {e}")))?;
    elsewhere.map_or(Ok(()), Elsewhere::give_back).map_err(|e| {
        SandboxError::Internal(format!(
            "cannot let the sandbox run on every processor again: {e}"
        ))
    })
}

/// A report pid 1 has already sent (a failed step), taken without waiting for one.
fn sent_report(sandbox: &Sandbox) -> Option<FromSandbox> {
    match FromSandbox::recv_now(&sandbox.channel) {
        channel::Heard::Message(report) => Some(report),
        channel::Heard::Nothing | channel::Heard::Closed => None,
    }
}

/// Gets pid 1 into its cgroup as `into` says and gives it the go-ahead: where it moves
/// itself in, the cgroup is made now and the files it writes to travel with the go-ahead;
/// where it is attached, it is moved in from outside first. The outer error is a cgroup
/// that could not be made or entered (the caller drops the sandbox, which kills it); the
/// inner one a sandbox that is gone already (its own report tells why).
fn settle_cgroup(
    sandbox: &mut Sandbox,
    into: IntoCgroup,
    spec: &SandboxSpec,
    plan: &Plan,
    cgroups: Option<&dyn CgroupManager>,
) -> Result<io::Result<()>, SandboxError> {
    let cgroup = match into {
        IntoCgroup::JoinsItself => {
            let made = create_cgroup(spec, plan.cgroup, cgroups)?;
            sandbox.enforcement.cgroup_path = made.as_ref().map(|c| c.path().to_path_buf());
            sandbox.cgroup = made;
            sandbox.cgroup.as_deref()
        }
        IntoCgroup::Attached => {
            if let Some(cg) = &sandbox.cgroup {
                cg.attach(sandbox.pid.as_raw()).map_err(refused::cgroup)?;
            }
            None
        }
        IntoCgroup::Born => None,
    };
    let join = match cgroup {
        Some(cg) => cg.self_join_files().map_err(refused::cgroup)?,
        None => Vec::new(),
    };
    let borrowed: Vec<_> = join.iter().map(|f| f.as_fd()).collect();
    Ok(channel::send_cgroup_ready(&sandbox.channel, &borrowed))
}

/// Takes the egress listeners pid 1 sends once it has its identity, or keeps what came
/// instead (its setup failed: [`Sandbox::finish`] reports it).
fn receive_listeners(sandbox: &mut Sandbox, ports: usize) -> Result<(), SandboxError> {
    tracing::debug!("receiving the egress listeners");
    match channel::recv_listeners(&sandbox.channel) {
        Ok(channel::Handover::Listeners(fds)) if fds.len() == ports.saturating_add(3) => {
            sandbox.egress = fds;
            Ok(())
        }
        Ok(channel::Handover::Listeners(fds)) => Err(SandboxError::Internal(format!(
            "the sandbox handed over {} egress listeners, not {}",
            fds.len(),
            ports.saturating_add(3)
        ))),
        Ok(channel::Handover::Message(m)) => {
            sandbox.early = Some(m);
            Ok(())
        }
        Ok(channel::Handover::Closed) => Ok(()),
        Err(e) => Err(SandboxError::Internal(format!(
            "egress listeners from the sandbox: {e}"
        ))),
    }
}

mod inside;
mod refused;
pub mod warm;

mod running;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_that_never_ran_exits_125_for_setup_127_for_not_found_126_otherwise() {
        let setup = Failure::Setup {
            step: "working directory".into(),
            errno: libc::ENOENT,
            detail: String::new(),
        };
        assert_eq!(setup.exit_code(), 125);
        assert_eq!(
            Failure::Exec {
                errno: libc::ENOENT
            }
            .exit_code(),
            127
        );
        assert_eq!(
            Failure::Exec {
                errno: libc::ENOTDIR
            }
            .exit_code(),
            127
        );
        assert_eq!(
            Failure::Exec {
                errno: libc::EACCES
            }
            .exit_code(),
            126
        );
    }
}
