//! From a caller's request and a profile to a [`SandboxSpec`]: which host paths are bound
//! where, which Landlock rules follow from them, the environment, the working directory.
//! Pure decisions, no system changes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::paths::{HostPath, check_absolute_clean};
use crate::profile::Profile;
use crate::profile::floor::Floor;

use super::cgroup::Limits;
use super::exec;
use super::idpool::{self, IdRanges};
use super::landlock::LandlockRules;
use super::mounts::{self, Bind, RootfsPlan};
use super::userns::Identity;
use super::{DEFAULT_PATH, Filters, SandboxError, SandboxSpec, SeccompSource};

mod egress;

/// A host path exposed at the same path inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exposure {
    pub host: HostPath,
    pub writable: bool,
}

/// What a caller asks for; limits not given fall back to the profile's defaults.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    pub exposures: Vec<Exposure>,
    pub limits: Limits,
    /// Host uid/gid for a privileged supervisor's sandbox (default 65534).
    pub host_ids: Option<(u32, u32)>,
    pub hostname: String,
    pub allow_degraded: bool,
    pub cgroup_name: String,
    /// Host paths bound read-only (readable and executable) at a different path inside,
    /// such as the hatchery binary for the in-sandbox client.
    pub extra_binds: Vec<(HostPath, PathBuf)>,
    /// The inside uid/gid the payload runs as (from the mapped range; default 0).
    pub payload_ids: Option<(u32, u32)>,
    /// Egress through a broker: the ports to listen on for proxy-unaware clients (the DNS
    /// stub and the proxy always listen). `None`: no network beyond `lo`.
    pub egress_ports: Option<Vec<u16>>,
}

/// Longest accepted command line, all arguments together.
const MAX_ARGV_BYTES: usize = 1 << 20;

/// Checks a hostname the way sethostname(2) and resolvers will read it: 1 to 64 bytes of
/// letters, digits, `-` and `.`, starting with a letter or digit. (A longer one failed
/// inside the sandbox, after the clone; a space or newline would reach every program that
/// prints it.) Worker ids, which become hostnames, pass it; a hostname a person types is
/// held to [`check_rfc1123_hostname`].
pub fn check_hostname(name: &str) -> Result<(), SandboxError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(SandboxError::Invalid(format!(
            "{name:?}: a hostname is 1 to 64 letters, digits, '-' and '.', starting with a letter or digit"
        )))
    }
}

/// [`check_hostname`], and RFC 1123 besides: dot-separated labels of 1 to 63 letters,
/// digits and `-`, each starting and ending with a letter or digit.
pub fn check_rfc1123_hostname(name: &str) -> Result<(), SandboxError> {
    let label_ok = |label: &str| {
        let b = label.as_bytes();
        b.len() <= 63
            && b.first().is_some_and(u8::is_ascii_alphanumeric)
            && b.last().is_some_and(u8::is_ascii_alphanumeric)
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
    };
    if check_hostname(name).is_ok() && name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(SandboxError::Invalid(format!("{name:?}: {HOSTNAME_RULE}")))
    }
}

const HOSTNAME_RULE: &str = "a hostname (RFC 1123) is 1 to 64 characters: labels of letters, digits and '-' separated by '.', each starting and ending with a letter or digit";

/// Validates an environment assignment `KEY=VALUE`.
pub fn parse_env(assignment: &str) -> Result<(String, String), SandboxError> {
    let (k, v) = assignment.split_once('=').ok_or_else(|| {
        SandboxError::Invalid(format!("--env {assignment:?}: expected KEY=VALUE or KEY"))
    })?;
    check_env_key(k)?;
    if v.contains('\0') {
        // The value is not repeated: it may be a secret, and errors reach reports and logs.
        return Err(SandboxError::Invalid(format!(
            "--env {k}=…: a value cannot contain a NUL byte"
        )));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Checks a variable name. The error names the name only, never the value that came with
/// it: a value may be a secret, and errors reach reports and logs.
fn check_env_key(k: &str) -> Result<(), SandboxError> {
    if k.is_empty()
        || k.bytes()
            .any(|b| b == 0 || b == b'=' || b.is_ascii_whitespace())
    {
        return Err(SandboxError::Invalid(format!(
            "--env {k:?}: invalid variable name (expected KEY=VALUE or KEY, without spaces)"
        )));
    }
    Ok(())
}

/// An `--env` argument as docker reads it: `KEY=VALUE`, or a bare `KEY` for the value
/// `lookup` finds (the caller's own environment); `Ok(None)` when it finds none.
pub fn parse_env_arg(
    arg: &str,
    lookup: impl FnOnce(&str) -> Option<std::ffi::OsString>,
) -> Result<Option<(String, String)>, SandboxError> {
    if arg.contains('=') {
        return parse_env(arg).map(Some);
    }
    check_env_key(arg)?;
    match lookup(arg) {
        None => Ok(None),
        Some(v) => {
            let v = v.into_string().map_err(|_| {
                SandboxError::Invalid(format!(
                    "--env {arg}: its value here is not UTF-8; pass it as {arg}=VALUE"
                ))
            })?;
            Ok(Some((arg.to_string(), v)))
        }
    }
}

/// Builds the spec. `caller_cwd` is where the caller stands on the host (the default working
/// directory inside when it is exposed).
pub fn build(
    mut req: RunRequest,
    profile: &Profile,
    caller_cwd: Option<&Path>,
) -> Result<SandboxSpec, SandboxError> {
    let egress = req.egress_ports.take();
    // A profile is validated when it is read; its filters are compiled later.
    build_with(
        req,
        profile,
        SeccompSource::Deferred(Box::new(profile.clone())),
        caller_cwd,
    )
    .and_then(|spec| egress::apply(spec, egress))
}

/// [`build`] with the profile's filter and its seccomp floor already compiled (the
/// launcher compiles them once per profile, not once per worker). The floor must be the
/// one for this profile (see [`Floor::fits`]).
pub fn build_compiled(
    mut req: RunRequest,
    profile: &Profile,
    seccomp: crate::profile::SeccompProgram,
    floor: &Floor,
    caller_cwd: Option<&Path>,
) -> Result<SandboxSpec, SandboxError> {
    if !floor.fits(profile) {
        return Err(SandboxError::Internal(format!(
            "the seccomp floor given for profile {} was compiled for other ABIs or another allowlist setting",
            profile.name
        )));
    }
    let filters = Filters {
        floor: floor.program.clone(),
        profile: seccomp,
        floor_notes: floor.notes.clone(),
    };
    let egress = req.egress_ports.take();
    build_with(req, profile, SeccompSource::Compiled(filters), caller_cwd)
        .and_then(|spec| egress::apply(spec, egress))
}

/// Builds the spec in the order its parts depend on one another: the request is checked
/// first; the binds (the caller's exposures, then the host's system directories) decide
/// the Landlock rules, which an executable allowlist then narrows; the working directory,
/// environment and limits follow; a host identity is leased last, after every check but
/// the payload ids' (which need the mapped range that identity gives).
fn build_with(
    req: RunRequest,
    profile: &Profile,
    seccomp: SeccompSource,
    caller_cwd: Option<&Path>,
) -> Result<SandboxSpec, SandboxError> {
    check_request(&req)?;
    let mut exposures = exposure_binds(&req)?;
    let (system, links, top_dirs) = system_binds(profile);
    let mut landlock = landlock_rules(profile, &top_dirs, &exposures);
    let exec_allowlist = match &profile.landlock.allow_exec {
        None => None,
        Some(listed) => {
            let allow = exec::resolve(listed, &system, &exposures)
                .map_err(|e| SandboxError::Invalid(format!("executable allowlist: {e}")))?;
            restrict_exec(&allow, &mut landlock, &mut exposures);
            Some(allow)
        }
    };
    let cwd = working_dir(&req, caller_cwd, &exposures)?;
    let env = environment(&req.env);
    let limits = limits(&req, profile)?;
    let rlimits = profile
        .rlimits()
        .map_err(|e| SandboxError::Invalid(e.to_string()))?;
    let ids = identity(&req)?;
    Ok(SandboxSpec {
        argv: req.command,
        env,
        cwd,
        rootfs: RootfsPlan {
            system,
            links,
            exposures,
            tmp_size: profile.mounts.tmp_size_bytes(),
            dev_shm: profile.mounts.dev_shm,
            noexec_tmp: exec_allowlist.is_some(),
            proc_view: super::procfs::ProcView::new(limits.memory),
            resolv_conf: None,
        },
        landlock,
        landlock_min_abi: profile.landlock.min_abi,
        rlimits,
        seccomp,
        profile_name: profile.name.clone(),
        profile_sha256: profile.sha256.clone(),
        limits,
        namespaces: profile.namespaces.clone(),
        identity: ids.identity,
        id_lease: ids.lease,
        null_ids: ids.null_ids,
        hostname: if req.hostname.is_empty() {
            "hatchery".into()
        } else {
            req.hostname
        },
        stdio: None,
        controlling_terminal: false,
        pass_fds: Vec::new(),
        cgroup_name: req.cgroup_name,
        allow_degraded: req.allow_degraded,
        exec_allowlist,
        egress_ports: None,
    })
}

/// Refuses a request that cannot run whatever the profile: no command, a command line
/// over [`MAX_ARGV_BYTES`], a hostname sethostname(2) would refuse, or root as the
/// sandbox's host identity.
fn check_request(req: &RunRequest) -> Result<(), SandboxError> {
    let invalid = SandboxError::Invalid;
    if req.command.is_empty() || req.command[0].is_empty() {
        return Err(invalid(
            "no command given (usage: hatchery run [OPTIONS] -- COMMAND [ARGS...])".into(),
        ));
    }
    if req.command.iter().map(|a| a.len() + 1).sum::<usize>() > MAX_ARGV_BYTES {
        return Err(invalid("the command line is longer than 1 MiB".into()));
    }
    if !req.hostname.is_empty() {
        check_hostname(&req.hostname)?;
    }
    if let Some((0, _)) | Some((_, 0)) = req.host_ids {
        return Err(invalid(
            "the sandbox's host uid/gid must not be 0 (root)".into(),
        ));
    }
    Ok(())
}

/// The caller's exposures and the supervisor's extra binds, parents before children:
/// unique targets, none inside what hatchery provides itself.
fn exposure_binds(req: &RunRequest) -> Result<Vec<Bind>, SandboxError> {
    let invalid = SandboxError::Invalid;
    let mut seen = BTreeSet::new();
    let mut exposures = Vec::new();
    for x in &req.exposures {
        let p = &x.host.path;
        if mounts::is_reserved(p) {
            return Err(invalid(format!(
                "{}: /proc, /dev and /tmp itself are provided by the sandbox and cannot be exposed (a path below /tmp can)",
                p.display()
            )));
        }
        if !seen.insert(p.clone()) {
            return Err(invalid(format!("{} is exposed twice", p.display())));
        }
        exposures.push(Bind::same_path(x.host.clone(), x.writable));
    }
    for (host, target) in &req.extra_binds {
        check_absolute_clean(target).map_err(|e| invalid(e.to_string()))?;
        if mounts::is_reserved(target) || !seen.insert(target.clone()) {
            return Err(invalid(format!(
                "{} cannot be used as a mount point",
                target.display()
            )));
        }
        // Read-only, always: the supervisor's own binary bound into a sandbox that could
        // write it would be replaced for every later sandbox (CVE-2019-5736, runc through
        // /proc/self/exe).
        exposures.push(Bind {
            host: host.clone(),
            target: target.clone(),
            writable: false,
            noexec: false,
            // hatchery's own files (root's), not a user's exposure.
            idmapped: false,
        });
    }
    // Parents are mounted before children.
    exposures.sort_by_key(|b| b.target.components().count());
    Ok(exposures)
}

/// The system directories bound read-only: the profile's, and the host root's top-level
/// directories that follow `/usr`; with the links to recreate (those not bound as
/// directories) and the top-level directories themselves.
fn system_binds(profile: &Profile) -> (Vec<Bind>, Vec<(PathBuf, PathBuf)>, Vec<PathBuf>) {
    let (links, top_dirs) = mounts::host_top_level();
    let mut system = Vec::new();
    for dir in profile.mounts.system.iter().chain(top_dirs.iter()) {
        if system.iter().any(|b: &Bind| b.target == *dir) {
            continue;
        }
        // A system directory the host lacks (or has as something else) is left out.
        let Ok(host) = crate::paths::check_host_path(dir) else {
            continue;
        };
        if host.is_dir {
            system.push(Bind {
                idmapped: false,
                ..Bind::same_path(host, false)
            });
        }
    }
    let links = links
        .into_iter()
        .filter(|(link, _)| !system.iter().any(|b| b.target == *link))
        .collect();
    (system, links, top_dirs)
}

/// The profile's Landlock rules, plus read and execute on the top-level system
/// directories and on every exposure, and write on the writable ones.
fn landlock_rules(profile: &Profile, top_dirs: &[PathBuf], exposures: &[Bind]) -> LandlockRules {
    let mut landlock = LandlockRules {
        read: profile.landlock.read.clone(),
        write: profile.landlock.write.clone(),
        execute: profile.landlock.execute.clone(),
        exec_files: Vec::new(),
        ioctl_dev: vec![PathBuf::from("/dev")],
        list: vec![PathBuf::from("/")],
        deny_tcp: profile.landlock.deny_tcp,
        tcp_connect_ports: Vec::new(),
    };
    for d in top_dirs {
        landlock.read.push(d.clone());
        landlock.execute.push(d.clone());
    }
    for x in exposures {
        landlock.read.push(x.target.clone());
        landlock.execute.push(x.target.clone());
        if x.writable {
            landlock.write.push(x.target.clone());
        }
    }
    landlock
}

/// The working directory inside: `--cwd` when given; else where the caller stands, when
/// an exposed directory holds it; else `/`.
fn working_dir(
    req: &RunRequest,
    caller_cwd: Option<&Path>,
    exposures: &[Bind],
) -> Result<PathBuf, SandboxError> {
    Ok(match &req.cwd {
        Some(c) => {
            check_absolute_clean(c).map_err(|e| SandboxError::Invalid(format!("--cwd {e}")))?;
            c.clone()
        }
        None => caller_cwd
            .filter(|c| {
                exposures
                    .iter()
                    .any(|x| x.is_dir() && c.starts_with(&x.target))
            })
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/")),
    })
}

/// The payload's environment: a fixed `PATH` and `HOME`, the caller's `TERM`, then the
/// request's variables (each replacing one of the same name).
fn environment(requested: &[(String, String)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), "/tmp".into()),
    ];
    if let Ok(term) = std::env::var("TERM") {
        env.push(("TERM".into(), term));
    }
    for (k, v) in requested {
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

/// The request's cgroup limits, each falling back to the profile's default.
fn limits(req: &RunRequest, profile: &Profile) -> Result<Limits, SandboxError> {
    let defaults = profile
        .default_limits()
        .map_err(|e| SandboxError::Invalid(e.to_string()))?;
    Ok(Limits {
        memory: req.limits.memory.or(defaults.memory),
        cpus: req.limits.cpus.or(defaults.cpus),
        pids: req.limits.pids.or(defaults.pids),
    })
}

/// Who the sandbox is on the host and inside.
struct Ids {
    identity: Identity,
    /// The host identity leased for this sandbox alone (a privileged supervisor's).
    lease: Option<idpool::IdLease>,
    /// The ids nothing is mapped to (see [`IdRanges::null_ids`]).
    null_ids: (u32, u32),
}

/// The sandbox's identity. A privileged supervisor gives each sandbox a host identity of
/// its own (see idpool) unless the request names one; the payload's inside ids must be
/// within the mapped range.
fn identity(req: &RunRequest) -> Result<Ids, SandboxError> {
    let ranges = IdRanges::configured();
    let lease = match req.host_ids {
        None if nix::unistd::geteuid().is_root() => {
            Some(idpool::lease(&ranges).map_err(|e| SandboxError::Refused {
                what: "a host identity for the sandbox".into(),
                why: e.to_string(),
                fix: "free ids by ending other sandboxes, or name one with --host-uid".into(),
            })?)
        }
        _ => None,
    };
    let host_ids = req.host_ids.or(lease.as_ref().map(|l| (l.uid, l.gid)));
    let mut identity = Identity::for_caller(host_ids);
    if let Some(ids) = req.payload_ids {
        if ids.0 >= identity.mapped_ids() || ids.1 >= identity.mapped_ids() {
            return Err(SandboxError::Invalid(format!(
                "payload ids {ids:?} are outside the mapped range"
            )));
        }
        identity.payload_ids = ids;
    }
    Ok(Ids {
        identity,
        lease,
        null_ids: ranges.null_ids(),
    })
}

/// Narrows the Landlock rules and mounts to an executable allowlist (see [`exec`]): the
/// execute right only on the allowed files, their loaders and the supervisor's own binds
/// (files bound at another path, such as the in-sandbox client); no read access to
/// directories of executables; and everything the sandbox may write mounted noexec.
fn restrict_exec(allow: &exec::ExecAllowlist, landlock: &mut LandlockRules, binds: &mut Vec<Bind>) {
    landlock.read = exec::without_exec_dirs(&landlock.read);
    landlock.write = exec::without_exec_dirs(&landlock.write);
    landlock.execute.clear();
    landlock.exec_files = allow.executable().cloned().collect();
    for b in binds.iter_mut() {
        if b.host.path != b.target && !b.is_dir() {
            landlock.exec_files.push(b.target.clone());
        }
        if b.writable {
            b.noexec = true;
        }
    }
    // Listed files in exposed paths are bound onto themselves: the validated inode.
    for host in &allow.pinned {
        if binds.iter().any(|b| b.target == host.path) {
            continue;
        }
        binds.push(Bind::same_path(host.clone(), false));
    }
    binds.sort_by_key(|b| b.target.components().count());
}

#[cfg(test)]
mod tests;
