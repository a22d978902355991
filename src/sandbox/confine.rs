//! Confinement of the supervisor's own helper processes that read hostile bytes (the
//! egress broker parses what a sandbox sends it): no privilege, no new privilege, no
//! program execution, no mounts or namespaces, and a filesystem reduced to reading what
//! name resolution needs. The helper keeps the host's network namespace: reaching the
//! allowed hosts is its job.

use std::path::PathBuf;

use libseccomp::{ScmpAction, ScmpFilterContext, ScmpSyscall};

use super::{caps, landlock, process};

/// The uid and gid a helper started by root runs as (nobody).
const NOBODY: u32 = 65534;

/// What a helper can never do, whatever a parsing bug lets an attacker run in it.
const DENIED_SYSCALLS: [&str; 24] = [
    "execve",
    "execveat",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "reboot",
    "userfaultfd",
    "io_uring_setup",
    "memfd_create",
];

/// Confines the calling process (a freshly forked, single-threaded helper). `read` are
/// the paths it may still read.
pub fn helper(read: Vec<PathBuf>) -> Result<(), String> {
    if nix::unistd::geteuid().is_root() {
        let parent = nix::unistd::getppid();
        nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
        caps::drop_all(Some((NOBODY, NOBODY)), caps::Bounding::Drop).map_err(|e| e.to_string())?;
        // Changing credentials cleared the parent-death signal: arm it again, or the
        // helper outlives a supervisor killed with SIGKILL. A parent gone meanwhile is
        // seen by the pid check.
        process::die_with_parent().map_err(|e| format!("parent death signal: {e}"))?;
        if nix::unistd::getppid() != parent {
            return Err("the supervisor is gone".into());
        }
    }
    caps::no_new_privs().map_err(|e| e.to_string())?;
    caps::not_dumpable().map_err(|e| e.to_string())?;
    if landlock::kernel_abi().is_some() {
        let rules = landlock::LandlockRules {
            read,
            ..Default::default()
        };
        landlock::restrict(&rules)?;
    }
    let mut filter =
        ScmpFilterContext::new(ScmpAction::Allow).map_err(|e| format!("seccomp: {e}"))?;
    for name in DENIED_SYSCALLS {
        // A name this libseccomp does not know is a call this kernel has no number for.
        if let Ok(call) = ScmpSyscall::from_name(name) {
            filter
                .add_rule(ScmpAction::Errno(libc::EPERM), call)
                .map_err(|e| format!("seccomp rule {name}: {e}"))?;
        }
    }
    filter.load().map_err(|e| format!("seccomp: {e}"))
}
