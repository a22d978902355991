//! Confinement of the supervisor's own helper processes that read hostile bytes (the
//! egress broker parses what a sandbox sends it): no privilege, no new privilege, no
//! program execution, no mounts or namespaces, and a filesystem reduced to reading what
//! name resolution needs. The helper keeps the host's network namespace: reaching the
//! allowed hosts is its job, and where the kernel has Landlock's network rules (ABI 4)
//! it connects over TCP only to the ports it was given, and binds none.

use std::path::PathBuf;

use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};

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
    let held_to_ports = tcp_ports.is_some();
    if landlock::kernel_abi().is_some() {
        let rules = landlock::LandlockRules {
            read,
            deny_tcp: held_to_ports,
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
    if held_to_ports {
        plain_tcp_and_udp_only(&mut filter)?;
    }
    filter.load().map_err(|e| format!("seccomp: {e}"))
}

/// Refuses every IPv4 and IPv6 socket but plain TCP and UDP. Landlock's port rules hold
/// for TCP alone: an MPTCP socket (protocol 262, which falls back to TCP against any
/// server) or an SCTP one (132, or protocol 0 with `SOCK_SEQPACKET`) connects to any port
/// and binds. So only `SOCK_STREAM` and `SOCK_DGRAM` with protocol 0, TCP or UDP remain.
/// The family and the type are ints to the kernel: compared on their low 32 bits, since a
/// caller may set the upper half of the register; a protocol with upper bits set is above
/// UDP's number and refused.
fn plain_tcp_and_udp_only(filter: &mut ScmpFilterContext) -> Result<(), String> {
    let socket = ScmpSyscall::from_name("socket").map_err(|e| format!("seccomp: {e}"))?;
    let low: u64 = 0xffff_ffff;
    // Types other than SOCK_STREAM (1) and SOCK_DGRAM (2), flags masked off: 0, 3, 4-7,
    // 8-15.
    let other_types = [(0xf, 0), (0xf, 3), (0xc, 4), (0x8, 8)]
        .map(|(mask, value)| ScmpArgCompare::new(1, ScmpCompareOp::MaskedEqual(mask), value));
    // Protocols other than 0, TCP (6) and UDP (17): 1, 2-3, 4-5, 7, 8-15, 16, and above 17.
    let other_protocols = [
        (low, 1),
        (low & !1, 2),
        (low & !1, 4),
        (low, 7),
        (low & !7, 8),
        (low, 16),
    ]
    .map(|(mask, value)| ScmpArgCompare::new(2, ScmpCompareOp::MaskedEqual(mask), value));
    let above_udp = ScmpArgCompare::new(2, ScmpCompareOp::Greater, libc::IPPROTO_UDP as u64);
    let refused: Vec<ScmpArgCompare> = other_types
        .into_iter()
        .chain(other_protocols)
        .chain([above_udp])
        .collect();
    for family in [libc::AF_INET, libc::AF_INET6] {
        let family = ScmpArgCompare::new(0, ScmpCompareOp::MaskedEqual(low), family as u64);
        for other in &refused {
            filter
                .add_rule_conditional(ScmpAction::Errno(libc::EPERM), socket, &[family, *other])
                .map_err(|e| format!("seccomp rule socket: {e}"))?;
        }
    }
    Ok(())
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
            // Sockets Landlock's port rules do not cover: MPTCP (falls back to TCP against
            // any server), SCTP by number and by SOCK_SEQPACKET, a protocol with upper
            // bits set, a raw socket.
            let others: Vec<String> = [
                (libc::SOCK_STREAM, 262i64),
                (libc::SOCK_STREAM, 132),
                (libc::SOCK_SEQPACKET, 0),
                (libc::SOCK_STREAM | libc::SOCK_CLOEXEC, (1i64 << 32) | 262),
                (libc::SOCK_RAW, 0),
            ]
            .iter()
            .map(|&(kind, protocol)| {
                // SAFETY: socket(2) with plain integer arguments; a descriptor it returns
                // is closed at once.
                let fd = unsafe {
                    libc::syscall(
                        libc::SYS_socket,
                        libc::AF_INET as i64,
                        kind as i64,
                        protocol,
                    )
                };
                if fd >= 0 {
                    // SAFETY: the descriptor was just made here and is not used again.
                    unsafe { libc::close(fd as i32) };
                    "made".to_string()
                } else {
                    let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
                    format!("errno {errno}")
                }
            })
            .collect();
            let plain = TcpStream::connect(("127.0.0.1", allowed)).is_ok();
            println!(
                "RESULT {} / {} / bind {bound} / others {} / tcp again {plain}",
                to(allowed),
                to(other),
                others.join(",")
            );
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
        let eperm = format!("errno {}", libc::EPERM);
        let expected = format!(
            "connected / errno {} / bind refused / others {} / tcp again true",
            libc::EACCES,
            [eperm.as_str(); 5].join(",")
        );
        assert_eq!(
            result,
            Some(expected.as_str()),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}
