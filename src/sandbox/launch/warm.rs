//! Prepared sandboxes for a warm pool: a sandbox whose pid 1 has done everything that does
//! not depend on one worker — its namespaces, id maps, loopback, cgroup, root filesystem
//! and kernel-object limits — and waits for a claim that names the rest: the command, the
//! environment, the hostname, the payload's ids and its descriptors.
//!
//! What pid 1 did ahead of time it did from the memory it was cloned with: a prepared
//! sandbox can only become a worker whose own sandbox would have been cloned with the same
//! values. [`Shape`] is those values; a claim whose spec has another shape is refused
//! (the caller starts that worker the ordinary way), so a claimed worker runs exactly
//! what a fresh start would have run.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, RawFd};
use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::super::channel;
use super::super::idpool::IdLease;
use super::super::landlock::LandlockRules;
use super::super::mounts::RootfsPlan;
use super::super::preflight::{CgroupPlan, LandlockPlan, Plan, SeccompPlan};
use super::super::step::Step;
use super::super::userns::Identity;
use super::super::{SandboxError, SandboxSpec};
use super::{ChildContext, Sandbox};
use crate::profile::{NamespacePolicy, Rlimit};

/// Everything a sandbox's pid 1 reads, before its claim, from the memory it was cloned
/// with (and what the supervisor prepared from the same values): two specs of equal shape
/// make the same prepared sandbox.
#[derive(Debug, Clone, PartialEq)]
struct Shape {
    rootfs: RootfsPlan,
    /// The owners of the bound host objects (an idmapped exposure maps writes to them;
    /// the binds' own equality is by object, not owner).
    owners: Vec<(u32, u32)>,
    /// The host's mounts at, under and above the bind sources (see [`host_mounts`]).
    host_mounts: Vec<Vec<u8>>,
    landlock: LandlockRules,
    landlock_min_abi: u8,
    rlimits: Vec<Rlimit>,
    namespaces: NamespacePolicy,
    /// With the payload's ids left out: the claim names them.
    identity: Identity,
    null_ids: (u32, u32),
    cwd: PathBuf,
    controlling_terminal: bool,
    allow_degraded: bool,
    cgroup: CgroupPlan,
    landlock_plan: LandlockPlan,
    seccomp_plan: SeccompPlan,
    fallback_rlimits: Vec<Rlimit>,
}

impl Shape {
    /// The shape of `spec` under `plan`; `None` for a sandbox that cannot be prepared
    /// ahead (one with egress listeners, which pid 1 makes and hands over before the
    /// supervisor starts a broker for them), or when the host's mount table cannot be
    /// read.
    fn of(spec: &SandboxSpec, plan: &Plan) -> Option<Shape> {
        if spec.egress_ports.is_some() {
            return None;
        }
        let mut identity = spec.identity.clone();
        identity.payload_ids = (0, 0);
        let mut rootfs = spec.rootfs.clone();
        rootfs.proc_view = rootfs.proc_view.machine();
        let owners = (rootfs.system.iter())
            .chain(&rootfs.exposures)
            .map(|b| (b.host.uid, b.host.gid))
            .collect();
        let host_mounts = host_mounts(&rootfs)?;
        Some(Shape {
            rootfs,
            owners,
            host_mounts,
            landlock: spec.landlock.clone(),
            landlock_min_abi: spec.landlock_min_abi,
            rlimits: spec.rlimits.clone(),
            namespaces: spec.namespaces.clone(),
            identity,
            null_ids: spec.null_ids,
            cwd: spec.cwd.clone(),
            controlling_terminal: spec.controlling_terminal,
            allow_degraded: spec.allow_degraded,
            cgroup: plan.cgroup,
            landlock_plan: plan.landlock,
            seccomp_plan: plan.seccomp,
            fallback_rlimits: plan.fallback_rlimits.clone(),
        })
    }
}

impl Shape {
    /// The names of the values in which two shapes differ (for the debug log).
    fn differences(&self, other: &Shape) -> Vec<&'static str> {
        let mut out = Vec::new();
        macro_rules! cmp {
            ($($f:ident),*) => {$(if self.$f != other.$f { out.push(stringify!($f)); })*};
        }
        cmp!(
            rootfs,
            owners,
            host_mounts,
            landlock,
            landlock_min_abi,
            rlimits,
            namespaces,
            identity,
            null_ids,
            cwd,
            controlling_terminal,
            allow_degraded,
            cgroup,
            landlock_plan,
            seccomp_plan,
            fallback_rlimits
        );
        out
    }
}

/// The lines of this process's mount table (`/proc/self/mountinfo`, the namespace every
/// sandbox copies its binds from) whose mount point is a bind source, lies under one or
/// holds one. A bind copies the source's mount tree as it is when the sandbox is made:
/// a volume the host unmounted, mounted or made read-only since is another shape (the
/// bind's own object is the same). `None` when the table cannot be read.
fn host_mounts(rootfs: &RootfsPlan) -> Option<Vec<Vec<u8>>> {
    use std::os::unix::ffi::OsStrExt;
    let table = std::fs::read("/proc/self/mountinfo").ok()?;
    let sources: Vec<Vec<u8>> = (rootfs.system.iter())
        .chain(&rootfs.exposures)
        .map(|b| mountinfo_escaped(b.host.path.as_os_str().as_bytes()))
        .collect();
    Some(
        table
            .split(|&b| b == b'\n')
            .filter(|line| {
                line.split(|&b| b == b' ')
                    .nth(4)
                    .is_some_and(|at| sources.iter().any(|s| nested(at, s) || nested(s, at)))
            })
            .map(<[u8]>::to_vec)
            .collect(),
    )
}

/// A path as the mount table writes it (space, tab, newline and backslash in octal).
fn mountinfo_escaped(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    for &b in path {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => out.extend_from_slice(format!("\\{b:03o}").as_bytes()),
            _ => out.push(b),
        }
    }
    out
}

/// Whether `inner` is `outer` or a path under it.
fn nested(inner: &[u8], outer: &[u8]) -> bool {
    outer == b"/"
        || inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
}

/// A sandbox prepared ahead of its worker, waiting for its claim. Dropping it kills it and
/// removes its cgroup (as for any [`Sandbox`]); its ids go back to the pool with it.
pub struct Prepared {
    sandbox: Sandbox,
    shape: Shape,
    tree_notes: Vec<String>,
    /// The groups its read-write exposures were mapped with, asked again at the claim: a
    /// membership the host revoked since must not live on in a sandbox kept ready.
    owner_groups: crate::sandbox::mounts::OwnerGroups,
}

/// Prepares a sandbox of `spec`'s shape (its command, environment, hostname, payload ids
/// and descriptors are not used: the claim brings them).
pub fn prepare(
    spec: &SandboxSpec,
    plan: &Plan,
    cgroups: Option<&dyn super::CgroupManager>,
) -> Result<Prepared, SandboxError> {
    let shape = Shape::of(spec, plan).ok_or_else(|| {
        SandboxError::Invalid(
            "a sandbox with egress, or on a host whose mount table cannot be read, cannot be prepared ahead".into(),
        )
    })?;
    let mut pid1 = super::clone_pid1(spec, plan, cgroups, true)?;
    super::grant_identity(&pid1.sandbox, spec, pid1.elsewhere.take())?;
    super::settle_cgroup(&mut pid1.sandbox, pid1.into_cgroup, spec, plan, cgroups)?
        .map_err(|e| SandboxError::Internal(format!("sandbox went away during setup: {e}")))?;
    // A pool of prepared sandboxes must not hold their cgroups' directories open too.
    pid1.sandbox.release_cgroup_descriptors();
    Ok(Prepared {
        sandbox: pid1.sandbox,
        shape,
        tree_notes: pid1.tree_notes,
        owner_groups: pid1.owner_groups,
    })
}

/// Why a prepared sandbox did not become the worker.
pub enum ClaimError {
    /// It was not claimed (another shape, or it is gone): start the worker the ordinary
    /// way, under this lease on the ids its spec was built with.
    Unclaimed(Option<IdLease>),
    /// It was claimed and then failed, as a fresh start would have.
    Failed(SandboxError),
}

/// What a claim carries besides the descriptors (attached to the same packet).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    argv: Vec<String>,
    /// `KEY=VALUE` each.
    env: Vec<String>,
    path_var: String,
    hostname: String,
    payload_ids: (u32, u32),
    /// The number each attached descriptor gets in the payload, in order.
    targets: Vec<RawFd>,
}

impl Prepared {
    /// The host ids it runs as, when they were leased: a worker's spec is built with these
    /// to be claimable.
    pub fn host_ids(&self) -> Option<(u32, u32)> {
        self.sandbox._lease.as_ref().map(|l| (l.uid, l.gid))
    }

    /// The host pid of its pid 1.
    pub fn pid(&self) -> i32 {
        self.sandbox.pid()
    }

    /// Kills it (it is reaped, and its cgroup removed, when it is dropped).
    pub fn kill(&self) {
        self.sandbox.kill();
    }

    /// Its pid 1's pidfd: readable once pid 1 has ended.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.sandbox.pidfd()
    }

    /// Whether its pid 1 has ended (killed from outside, or failed in set-up).
    pub fn has_ended(&self) -> bool {
        // Not knowing counts as ended: such a sandbox is never claimed.
        super::super::wait::has_exited(self.sandbox.pidfd()).unwrap_or(true)
    }

    /// Turns it into the sandbox of `spec` (built with [`Prepared::host_ids`], its stdio
    /// set) under `plan`.
    pub fn claim(mut self, spec: &SandboxSpec, plan: &Plan) -> Result<Sandbox, ClaimError> {
        let unclaimed = |p: Prepared| ClaimError::Unclaimed(p.sandbox._lease.clone());
        match Shape::of(spec, plan) {
            Some(shape) if shape == self.shape => {}
            Some(shape) => {
                tracing::debug!(differs = ?self.shape.differences(&shape), "the prepared sandbox is of another shape");
                return Err(unclaimed(self));
            }
            None => return Err(unclaimed(self)),
        }
        if self.has_ended() {
            tracing::debug!("the prepared sandbox has ended");
            return Err(unclaimed(self));
        }
        if !self.owner_groups.is_empty() {
            // A database that does not answer refuses the start here: asked again for a
            // start afresh, it would hold the launcher twice as long.
            match crate::sandbox::mounts::OwnerGroups::look_up(&spec.rootfs) {
                Ok(now) if now == self.owner_groups => {}
                Ok(_) => {
                    tracing::debug!("the read-write exposures' groups are not what they were");
                    return Err(unclaimed(self));
                }
                Err(e) => return Err(ClaimError::Failed(super::refused::lookup(e))),
            }
        }
        let Some(stdio) = &spec.stdio else {
            return Err(unclaimed(self));
        };
        let mut fds: Vec<BorrowedFd<'_>> = stdio.iter().map(|f| f.as_fd()).collect();
        let mut targets: Vec<RawFd> = vec![0, 1, 2];
        for (fd, target) in &spec.pass_fds {
            fds.push(fd.as_fd());
            targets.push(*target);
        }
        let body = ClaimBody {
            argv: spec.argv.clone(),
            env: spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            path_var: super::path_var(spec),
            hostname: spec.hostname.clone(),
            payload_ids: spec.identity.payload_ids,
            targets,
        };
        let Ok(bytes) = serde_json::to_vec(&body) else {
            return Err(unclaimed(self));
        };
        let mut enforcement = plan.enforcement(spec);
        enforcement.cgroup_path = self.sandbox.cgroup_path();
        enforcement.not_enforced.append(&mut self.tree_notes);
        // Compiled before the claim: a profile that does not compile leaves it unclaimed.
        let filters = match spec.seccomp.compile() {
            Ok(f) => f,
            Err(e) => return Err(ClaimError::Failed(e)),
        };
        if channel::send_claim(&self.sandbox.channel, &bytes, &fds).is_err() {
            return Err(unclaimed(self));
        }
        let mut sandbox = self.sandbox;
        plan.seccomp.record(&filters, &mut enforcement);
        sandbox.enforcement = enforcement;
        sandbox.started = Instant::now();
        sandbox.hand_filters(&filters).map_err(ClaimError::Failed)?;
        Ok(sandbox)
    }
}

/// Why pid 1 of a prepared sandbox goes no further.
pub(super) enum Unclaimed {
    /// The supervisor dropped it.
    Dropped,
    /// The claim could not be read.
    Bad(Step),
}

/// pid 1 of a prepared sandbox: waits for its claim and takes from it the command, the
/// environment, the hostname, the payload's ids and descriptors.
pub(super) fn take_claim(
    ctx: &mut ChildContext<'_>,
    chan: BorrowedFd<'_>,
) -> Result<(), Unclaimed> {
    let bad = |e: std::io::Error| {
        Unclaimed::Bad(Step::new("claim", e.raw_os_error().unwrap_or(libc::EINVAL)))
    };
    let (bytes, fds) = match channel::recv_claim(chan) {
        Ok(claim) => claim,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(Unclaimed::Dropped),
        Err(e) => return Err(bad(e)),
    };
    let body: ClaimBody = serde_json::from_slice(&bytes)
        .map_err(|_| Unclaimed::Bad(Step::new("claim", libc::EINVAL)))?;
    if body.targets.len() != fds.len() {
        return Err(Unclaimed::Bad(Step::new(
            "claim (descriptors)",
            libc::EINVAL,
        )));
    }
    let cstrings = |items: Vec<String>| -> Result<Vec<CString>, Unclaimed> {
        items
            .into_iter()
            .map(CString::new)
            .collect::<Result<_, _>>()
            .map_err(|_| Unclaimed::Bad(Step::new("claim (NUL byte)", libc::EINVAL)))
    };
    ctx.argv = cstrings(body.argv)?;
    ctx.env = cstrings(body.env)?;
    ctx.path_var = body.path_var;
    ctx.hostname = body.hostname;
    ctx.payload_ids = body.payload_ids;
    // Held open until the payload installs them (pid 1 closes its copies once it forked).
    ctx.fds = fds
        .into_iter()
        .map(IntoRawFd::into_raw_fd)
        .zip(body.targets)
        .collect();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_point_is_related_to_a_bind_source_it_holds_or_lies_under_only() {
        assert!(nested(b"/srv/data/vol", b"/srv/data"));
        assert!(nested(b"/srv/data", b"/srv/data"));
        assert!(nested(b"/srv/data", b"/"));
        assert!(!nested(b"/srv/database", b"/srv/data"));
        assert!(!nested(b"/srv", b"/srv/data"));
    }

    #[test]
    fn a_bind_source_is_escaped_as_the_mount_table_writes_it() {
        assert_eq!(mountinfo_escaped(b"/a b\\c"), b"/a\\040b\\134c".to_vec());
    }
}
