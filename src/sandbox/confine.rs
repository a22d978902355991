//! Confinement of the supervisor's own helper processes that read hostile bytes (the
//! egress broker parses what a sandbox sends it): no privilege, no new privilege, no
//! program execution, no mounts or namespaces, and a filesystem reduced to reading what
//! name resolution needs. The helper keeps the host's network namespace: reaching the
//! allowed hosts is its job, and where the kernel has Landlock's network rules (ABI 4)
//! it connects over TCP only to the ports it was given, and binds none.

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
/// the paths it may still read; `tcp_ports`, where given, the only TCP ports it may
/// connect to (no TCP bind at all): a parsing bug an attacker turns into code in the
/// helper then reaches no other service of the host or the network, loopback's included.
pub fn helper(read: Vec<PathBuf>, tcp_ports: Option<Vec<u16>>) -> Result<(), String> {
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
            deny_tcp: tcp_ports.is_some(),
            tcp_connect_ports: tcp_ports.unwrap_or_default(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::net::{TcpListener, TcpStream};

    /// Set in the copy of this test binary that confines itself (see below).
    const CHILD: &str = "HATCHERY_TEST_HELPER_PORTS";

    /// A confined helper given a port connects to it, and to no other: run as a child
    /// process (this test binary again, this test alone), since confinement is for life.
    #[test]
    fn a_helper_given_ports_connects_over_tcp_to_those_alone() -> io::Result<()> {
        if landlock::kernel_abi().is_none_or(|abi| abi < landlock::TCP_ABI) {
            eprintln!(
                "skipped: Landlock's network rules need ABI {}",
                landlock::TCP_ABI
            );
            return Ok(());
        }
        if let Ok(ports) = std::env::var(CHILD) {
            let mut ports = ports.split(',').filter_map(|p| p.parse::<u16>().ok());
            let (Some(allowed), Some(other)) = (ports.next(), ports.next()) else {
                return Err(io::Error::other("two ports expected"));
            };
            helper(Vec::new(), Some(vec![allowed])).map_err(io::Error::other)?;
            let to = |port: u16| {
                TcpStream::connect(("127.0.0.1", port))
                    .map(|_| "connected".to_string())
                    .unwrap_or_else(|e| format!("errno {}", e.raw_os_error().unwrap_or(0)))
            };
            let bound = TcpListener::bind("127.0.0.1:0")
                .map(|_| "bound")
                .unwrap_or("refused");
            println!("RESULT {} / {} / bind {bound}", to(allowed), to(other));
            return Ok(());
        }
        let (a, b) = (
            TcpListener::bind("127.0.0.1:0")?,
            TcpListener::bind("127.0.0.1:0")?,
        );
        let ports = format!("{},{}", a.local_addr()?.port(), b.local_addr()?.port());
        let mut child = std::process::Command::new(std::env::current_exe()?);
        child
            .args([
                "--exact",
                "sandbox::confine::tests::a_helper_given_ports_connects_over_tcp_to_those_alone",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, ports);
        let out = child.output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        // The harness prints the test's name on the same line, before it.
        let result = text
            .lines()
            .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r));
        assert_eq!(
            result,
            Some(format!("connected / errno {} / bind refused", libc::EACCES).as_str()),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}
