//! The sandbox's namespaces: which ones a spec asks for, the clone3 call that creates them
//! together with the sandbox's pid 1 (born inside its cgroup where the kernel allows),
//! and the network and cgroup namespaces pid 1 makes for itself.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use nix::unistd::Pid;

use super::step::{Step, StepResult};
use crate::profile::NamespacePolicy as Namespaces;

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Which side of the clone this is.
pub enum Cloned {
    Child,
    Parent { pid: Pid, pidfd: OwnedFd },
}

/// clone3 with fork semantics (no new stack): returns twice, like fork(2).
fn clone3(flags: u64, cgroup_fd: Option<RawFd>) -> io::Result<Cloned> {
    let mut pidfd: libc::c_int = -1;
    let mut args = CloneArgs {
        flags: flags | libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    if let Some(fd) = cgroup_fd {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = fd as u64;
    }
    // SAFETY: clone3 without CLONE_VM and without a stack behaves like fork: the child gets
    // a copy of this (single-threaded, checked by the caller) address space and continues
    // on a copy of this stack. `args` and `pidfd` outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match rc {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Cloned::Child),
        pid => Ok(Cloned::Parent {
            pid: Pid::from_raw(pid as i32),
            // SAFETY: with CLONE_PIDFD the kernel stored a new descriptor in `pidfd`.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}

/// The namespaces the clone makes: those every sandbox gets (user, mount, pid) and the
/// ipc and uts namespaces `ns` asks for. Not the network namespace: see [`unshare_net`].
fn flags(ns: &Namespaces) -> u64 {
    let mut flags = (libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID) as u64;
    if ns.ipc {
        flags |= libc::CLONE_NEWIPC as u64;
    }
    if ns.uts {
        flags |= libc::CLONE_NEWUTS as u64;
    }
    flags
}

/// Creates the sandbox's pid 1 in new namespaces, inside the cgroup `into` when given
/// (with its cgroup namespace too, when `ns` asks for one). Returns, like fork, on both
/// sides, with whether the sandbox was born inside the cgroup: where it was not, it is
/// attached (or moves itself in) afterwards, and makes its cgroup namespace itself.
pub fn clone_sandbox(ns: &Namespaces, into: Option<RawFd>) -> (io::Result<Cloned>, bool) {
    let flags = flags(ns);
    let mut born_inside = into.is_some();
    let mut attempt = clone3(
        flags
            | if born_inside && ns.cgroup {
                libc::CLONE_NEWCGROUP as u64
            } else {
                0
            },
        into,
    );
    if born_inside
        && matches!(&attempt, Err(e) if e.raw_os_error() != Some(libc::EPERM) && e.raw_os_error() != Some(libc::ENOSPC))
    {
        // Kernels or setups without CLONE_INTO_CGROUP: attach after the clone instead.
        born_inside = false;
        attempt = clone3(flags, None);
    }
    (attempt, born_inside)
}

/// Gives pid 1 its own network namespace, first thing after the clone, before it runs
/// anything else. A new network namespace is most of what a clone with every namespace
/// costs (about 0.5 of 0.6 ms here): made by pid 1, it is built while the supervisor, on
/// the other processor, writes the id maps and makes the cgroup, instead of before
/// either can start (for a launcher, before it can start the next worker). The namespace
/// is owned by the sandbox's user namespace, as one made by the clone would be.
///
/// Not on a second thread of pid 1 while pid 1 builds its root: tried, and detaching the
/// host's mount tree then waited for the namespace to be built (an RCU grace period, 0.2
/// to 1 ms instead of 0.06), and the thread itself cost 0.2 ms and the payload its pid 2.
pub fn unshare_net() -> Result<(), Step> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .step("network namespace")
        .map_err(|s| match s.errno {
            // The kernel's count of network namespaces (per user, in this user namespace
            // or one above it) is reached.
            libc::ENOSPC => s.with_detail("check `sysctl user.max_net_namespaces`".into()),
            _ => s,
        })
}

/// Makes the calling process's cgroup the root of its cgroup view, once it is in it: the
/// host's hierarchy (and a v1 `release_agent` in it, CVE-2022-0492) is out of sight.
pub fn unshare_cgroup() -> Result<(), Step> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP).step("cgroup namespace")
}
