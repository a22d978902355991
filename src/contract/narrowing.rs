//! Capability narrowing: a child may hold at most what its parent holds.
//!
//! A replication can only pass capabilities down, never create them (seed 004, 13.4:
//! "supervisory authority must not equal unlimited execution authority"). For a request
//! to be granted, each of these must be equal to or narrower than the parent's, checked in
//! this order; the first violation is reported with the field it concerns:
//!
//! - `expires_at`: the parent's manifest must still be valid (the child's manifest never
//!   outlives it: the contract caps the child's `expires_at` at the parent's);
//! - `resources.cpu_limit`, `memory_limit_mb`, `pids_limit`, `timeout_ms`: at most the
//!   parent's;
//! - `resources.max_output_bytes`: when the parent has an output cap, a cap of at most
//!   the parent's (no cap is more than any cap);
//! - `resources.network_policy.allow_controller`, `allow_external`: true only if true for
//!   the parent;
//! - `resources.network_policy.allow_hosts`: each entry covered by one of the parent's
//!   (`AllowList::covers`: the same port, and the same name, a wildcard matching it, the
//!   same address or a network containing it); no entry at all is always narrower, any
//!   entry under a parent without is wider;
//! - `resources.network_policy.max_egress_bytes`: when the child reaches any host and the
//!   parent has a byte budget, a budget of at most the parent's (no budget is more than
//!   any budget, as for the output cap; the controller gives a child that names none its
//!   parent's, see `admission::decide_child`);
//! - `filesystem.read_only`: each path equal to or beneath one of the parent's paths,
//!   read-only or read-write;
//! - `filesystem.read_write`: each path equal to or beneath one of the parent's read-write
//!   paths (write access never comes from a read-only grant);
//! - `filesystem.allow_exec`: when the parent has an executable allowlist, an allowlist
//!   whose every file is in the parent's (the same path: these are files, nothing lies
//!   beneath them; no allowlist at all would allow every program);
//! - `profile`: the parent's profile, or one the contract lists as a narrowing of it
//!   (`[profile_narrowing]`: a stricter profile the operator vouches for). Nothing else:
//!   comparing two seccomp policies for "stricter" is not something to guess at.
//!
//! Paths are in normal form (see `ExposedPath`), so "beneath" is a comparison of whole
//! components, and the sandbox refuses symlinks in exposed paths, so a path beneath
//! another on paper is beneath it on disk.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::egress::AllowList;
use crate::manifest::{
    EgressBytes, ExecPath, ExposedPath, Manifest, NetworkPolicy, OutputBytes, ProfileName,
    SpawnRequest,
};

/// For each profile, the other profiles a worker running under it may give its children.
pub type ProfileNarrowing = BTreeMap<ProfileName, BTreeSet<ProfileName>>;

/// A capability the child asked for beyond its parent's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NarrowingViolation {
    /// The manifest field, as named in the JSON (`resources.memory_limit_mb`).
    pub field: &'static str,
    pub requested: String,
    pub allowed: String,
}

impl fmt::Display for NarrowingViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: requested {}, the parent allows {}",
            self.field, self.requested, self.allowed
        )
    }
}

fn violation(
    field: &'static str,
    requested: impl fmt::Display,
    allowed: impl fmt::Display,
) -> NarrowingViolation {
    NarrowingViolation {
        field,
        requested: requested.to_string(),
        allowed: allowed.to_string(),
    }
}

fn at_most<T: PartialOrd + fmt::Display>(
    field: &'static str,
    requested: T,
    parent: T,
) -> Result<(), NarrowingViolation> {
    if requested <= parent {
        Ok(())
    } else {
        Err(violation(field, requested, format!("at most {parent}")))
    }
}

fn only_if(field: &'static str, requested: bool, parent: bool) -> Result<(), NarrowingViolation> {
    if requested && !parent {
        Err(violation(field, true, false))
    } else {
        Ok(())
    }
}

fn list(paths: &[&ExposedPath]) -> String {
    if paths.is_empty() {
        return "no path".to_string();
    }
    let names: Vec<&str> = paths.iter().map(|p| p.as_str()).collect();
    format!("paths beneath {}", names.join(", "))
}

fn within(
    field: &'static str,
    requested: &[ExposedPath],
    granted: &[&ExposedPath],
) -> Result<(), NarrowingViolation> {
    for p in requested {
        if !granted.iter().any(|g| p.is_within(g)) {
            return Err(violation(field, p, list(granted)));
        }
    }
    Ok(())
}

fn output_cap(
    requested: Option<OutputBytes>,
    parent: Option<OutputBytes>,
) -> Result<(), NarrowingViolation> {
    const FIELD: &str = "resources.max_output_bytes";
    match (requested, parent) {
        (_, None) => Ok(()),
        (None, Some(p)) => Err(violation(FIELD, "no cap", format!("at most {p}"))),
        (Some(c), Some(p)) => at_most(FIELD, c, p),
    }
}

fn hosts(list: &AllowList) -> String {
    if list.is_empty() {
        return "no host".to_string();
    }
    let entries: Vec<String> = list.entries().iter().map(ToString::to_string).collect();
    format!("only {}", entries.join(", "))
}

fn allowed_hosts(requested: &AllowList, parent: &AllowList) -> Result<(), NarrowingViolation> {
    parent.covers(requested).map_err(|uncovered| {
        violation(
            "resources.network_policy.allow_hosts",
            uncovered,
            hosts(parent),
        )
    })
}

fn egress_budget(
    requested: &NetworkPolicy,
    parent: Option<EgressBytes>,
) -> Result<(), NarrowingViolation> {
    const FIELD: &str = "resources.network_policy.max_egress_bytes";
    if !requested.reaches_hosts() {
        // Nothing to spend a budget on.
        return Ok(());
    }
    match (requested.max_egress_bytes, parent) {
        (_, None) => Ok(()),
        (None, Some(p)) => Err(violation(FIELD, "no budget", format!("at most {p}"))),
        (Some(c), Some(p)) => at_most(FIELD, c, p),
    }
}

fn files(list: &[ExecPath]) -> String {
    let names: Vec<&str> = list.iter().map(|p| p.as_str()).collect();
    format!("only {}", names.join(", "))
}

fn exec_allowlist(
    requested: Option<&[ExecPath]>,
    parent: Option<&[ExecPath]>,
) -> Result<(), NarrowingViolation> {
    const FIELD: &str = "filesystem.allow_exec";
    match (requested, parent) {
        (_, None) => Ok(()),
        (None, Some(p)) => Err(violation(FIELD, "any program (no allowlist)", files(p))),
        (Some(c), Some(p)) => match c.iter().find(|f| !p.contains(f)) {
            Some(extra) => Err(violation(FIELD, extra, files(p))),
            None => Ok(()),
        },
    }
}

/// Checks that `request` asks for nothing beyond `parent` at time `now` (the order and
/// rules of the module documentation).
pub fn check(
    parent: &Manifest,
    request: &SpawnRequest,
    profiles: &ProfileNarrowing,
    now: u64,
) -> Result<(), NarrowingViolation> {
    if parent.is_expired(now) {
        return Err(violation(
            "expires_at",
            format!("a manifest valid at {now}"),
            format!("nothing after {}", parent.expires_at),
        ));
    }
    let (c, p) = (&request.resources, &parent.resources);
    at_most("resources.cpu_limit", c.cpu_limit, p.cpu_limit)?;
    at_most(
        "resources.memory_limit_mb",
        c.memory_limit_mb,
        p.memory_limit_mb,
    )?;
    at_most("resources.pids_limit", c.pids_limit, p.pids_limit)?;
    at_most("resources.timeout_ms", c.timeout_ms, p.timeout_ms)?;
    output_cap(c.max_output_bytes, p.max_output_bytes)?;
    only_if(
        "resources.network_policy.allow_controller",
        c.network_policy.allow_controller,
        p.network_policy.allow_controller,
    )?;
    only_if(
        "resources.network_policy.allow_external",
        c.network_policy.allow_external,
        p.network_policy.allow_external,
    )?;
    allowed_hosts(
        &c.network_policy.allow_hosts,
        &p.network_policy.egress_list(),
    )?;
    egress_budget(&c.network_policy, p.network_policy.max_egress_bytes)?;

    let readable: Vec<&ExposedPath> = parent.filesystem.exposures().map(|(p, _)| p).collect();
    let writable: Vec<&ExposedPath> = parent.filesystem.read_write.iter().collect();
    within(
        "filesystem.read_only",
        &request.filesystem.read_only,
        &readable,
    )?;
    within(
        "filesystem.read_write",
        &request.filesystem.read_write,
        &writable,
    )?;
    exec_allowlist(
        request.filesystem.allow_exec.as_deref(),
        parent.filesystem.allow_exec.as_deref(),
    )?;

    if request.profile != parent.profile
        && !profiles
            .get(&parent.profile)
            .is_some_and(|allowed| allowed.contains(&request.profile))
    {
        let mut allowed = vec![parent.profile.to_string()];
        if let Some(more) = profiles.get(&parent.profile) {
            allowed.extend(more.iter().map(ToString::to_string));
        }
        return Err(violation(
            "profile",
            &request.profile,
            format!("only {}", allowed.join(" or ")),
        ));
    }
    Ok(())
}
