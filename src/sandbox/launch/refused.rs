//! How a start refused by the host is told: what was refused, why, and what to do about
//! it. A step that ran out of descriptors says so whatever the step was (a controller at
//! its open-file limit was told to check its sysctls, then its cgroup permissions).

use std::io;

use super::super::SandboxError;
use super::super::cgroup::CgroupError;
use super::super::mount_api::MountError;
use super::super::mounts::OwnerLookupError;
use super::super::owner_groups::LookupError;

/// The hint for a step refused for want of descriptors, whatever the step.
const OUT_OF_DESCRIPTORS: &str = "this process is out of file descriptors: raise its open-file limit (`ulimit -n`, systemd's LimitNOFILE=) or run fewer sandboxes at once";

/// The fix for a step that failed with `errno`: more descriptors when it ran out of them,
/// else the step's own.
fn fix(errno: Option<i32>, own: &str) -> String {
    match errno {
        Some(libc::EMFILE | libc::ENFILE) => OUT_OF_DESCRIPTORS,
        _ => own,
    }
    .to_string()
}

pub(super) fn cgroup(e: CgroupError) -> SandboxError {
    let errno = match &e {
        CgroupError::Io { source, .. } => source.raw_os_error(),
        _ => None,
    };
    SandboxError::Refused {
        what: "cgroup".into(),
        fix: fix(
            errno,
            "check that this user may create cgroups here (see `hatchery doctor`)",
        ),
        why: e.to_string(),
    }
}

/// The clone also makes a pidfd and a process: running out of either is not a matter of
/// namespaces.
pub(super) fn namespaces(e: io::Error) -> SandboxError {
    let own = match e.raw_os_error() {
        Some(libc::EAGAIN) => {
            "no process could be made: check this user's process limit (`ulimit -u`) and the host's `kernel.pid_max` and `kernel.threads-max`"
        }
        _ => {
            "user namespaces may be disabled: check `sysctl user.max_user_namespaces` (and, for non-root users, kernel.unprivileged_userns_clone or kernel.apparmor_restrict_unprivileged_userns); `hatchery doctor` shows what this host allows"
        }
    };
    SandboxError::Refused {
        what: "namespaces".into(),
        fix: fix(e.raw_os_error(), own),
        why: format!("cannot create the sandbox's user, mount and pid namespaces: {e}"),
    }
}

/// The exposed paths could not be prepared.
pub(super) fn trees(e: MountError) -> SandboxError {
    SandboxError::Refused {
        what: "the sandbox's filesystem".into(),
        why: format!("{}: {}", e.step, io::Error::from_raw_os_error(e.errno)),
        fix: fix(
            Some(e.errno),
            "check that the path is still there and is a local filesystem",
        ),
    }
}

/// The read-write directories' groups could not be looked up (or a signal stopped the
/// lookup: then the start ends).
pub(super) fn lookup(e: OwnerLookupError) -> SandboxError {
    if let LookupError::Stopped(signal) = e.source {
        return SandboxError::Stopped {
            signal,
            during: format!(
                "the host's user database was being asked about --rw {}",
                e.path
            ),
        };
    }
    SandboxError::Refused {
        what: "the group mapping of a read-write directory".into(),
        fix: format!(
            "check that the host's user database answers (`id {}` should return at once)",
            e.uid
        ),
        why: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fix_of(refused: SandboxError) -> String {
        match refused {
            SandboxError::Refused { fix, .. } => fix,
            other => other.to_string(),
        }
    }

    #[test]
    fn a_clone_out_of_descriptors_is_not_blamed_on_user_namespaces() {
        let hint = |errno| fix_of(namespaces(io::Error::from_raw_os_error(errno)));
        assert!(hint(libc::EMFILE).contains("open-file limit"));
        assert!(!hint(libc::EMFILE).contains("user namespaces"));
        assert!(hint(libc::EAGAIN).contains("process limit"));
        assert!(hint(libc::ENOSPC).contains("max_user_namespaces"));
        assert!(hint(libc::EPERM).contains("max_user_namespaces"));
    }

    /// A cgroup that could not be made or held for want of descriptors is not a matter of
    /// cgroup permissions (the cgroup's directories are held open during a `run`).
    #[test]
    fn a_cgroup_refused_for_want_of_descriptors_says_so() {
        let hint = |errno| {
            fix_of(cgroup(CgroupError::Io {
                path: "/sys/fs/cgroup/pids/hatchery-run-1".into(),
                source: io::Error::from_raw_os_error(errno),
            }))
        };
        assert!(hint(libc::EMFILE).contains("open-file limit"));
        assert!(hint(libc::ENFILE).contains("open-file limit"));
        assert!(hint(libc::EACCES).contains("may create cgroups"));
    }
}
