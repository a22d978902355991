//! Attacks on a real sandbox: network, filesystem, processes, privileges and syscalls.
//! Every test starts `hatchery run` (as root, the CI setting) and fails if the attack works.

mod common;

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::*;

/// The probe's answer must be a refusal (`err N`), and with this errno when given.
fn assert_refused(out: &std::process::Output, errno: Option<i32>, what: &str) {
    let s = stdout(out);
    assert_eq!(
        code(out),
        0,
        "{what}: probe did not run: {} / {}",
        s,
        stderr(out)
    );
    match errno {
        Some(e) => assert_eq!(s, format!("err {e}"), "{what}: expected errno {e}"),
        None => assert!(s.starts_with("err "), "{what}: the attack worked: {s}"),
    }
}

#[test]
fn tcp_to_a_host_loopback_listener_fails() {
    if skip_unless_root("tcp") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener
        .local_addr()
        .map(|a| a.port())
        .unwrap_or(0)
        .to_string();
    listener.set_nonblocking(true).ok();
    let out = run_probe(&[], &["tcp", "127.0.0.1", &port]);
    assert_refused(&out, None, "tcp connect");
    assert!(
        listener.accept().is_err(),
        "the host listener saw a connection"
    );
}

#[test]
fn udp_to_a_host_loopback_listener_gets_nothing_through() {
    if skip_unless_root("udp") {
        return;
    }
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    let port = sock.local_addr().map(|a| a.port()).unwrap_or(0).to_string();
    sock.set_read_timeout(Some(Duration::from_millis(300))).ok();
    let out = run_probe(&[], &["udp", "127.0.0.1", &port]);
    assert_refused(&out, None, "udp exchange");
    let mut buf = [0u8; 64];
    assert!(
        sock.recv(&mut buf).is_err(),
        "the host listener received a datagram"
    );
}

#[test]
fn abstract_unix_socket_of_the_host_is_unreachable() {
    if skip_unless_root("abstract") {
        return;
    }
    use std::os::linux::net::SocketAddrExt;
    let name = format!("hatchery-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let _l =
        std::os::unix::net::UnixListener::bind_addr(&addr).unwrap_or_else(|e| panic!("bind: {e}"));
    let out = run_probe(&[], &["abstract", &name]);
    assert_refused(&out, None, "abstract socket connect");
}

#[test]
fn only_loopback_exists_and_it_is_up() {
    if skip_unless_root("interfaces") {
        return;
    }
    let out = hatchery_cmd(&[
        "run",
        "--",
        "sh",
        "-c",
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "lo", "interfaces other than lo are visible");
    let out = hatchery_cmd(&["run", "--", "cat", "/sys/class/net/lo/operstate"]);
    assert_ne!(code(&out), 0, "/sys of the host is visible");
}

#[test]
fn writes_outside_rw_paths_and_tmp_fail() {
    if skip_unless_root("writes") {
        return;
    }
    let hidden = shared_tempdir();
    let hidden_file = canonical(hidden.path()).join("planted");
    for (path, errno) in [
        ("/x", Some(libc::EROFS)),
        ("/usr/x", Some(libc::EROFS)),
        ("/etc/passwd", Some(libc::EROFS)),
        ("/proc/sys/kernel/hostname", None),
        (hidden_file.to_str().unwrap_or("/nonexistent"), None),
    ] {
        let out = run_probe(&[], &["write", path, "pwned"]);
        assert_refused(&out, errno, &format!("write {path}"));
    }
    assert!(
        !hidden_file.exists(),
        "a file appeared in a host directory that was not exposed"
    );
    let out = run_probe(&[], &["write", "/tmp/fine", "ok"]);
    assert_eq!(
        stdout(&out),
        "ok 0",
        "private /tmp is writable: {}",
        stderr(&out)
    );
}

#[test]
fn secrets_outside_exposed_paths_cannot_be_read() {
    if skip_unless_root("reads") {
        return;
    }
    let root = shared_tempdir();
    let base = canonical(root.path());
    let public = base.join("public");
    let secret = base.join("secret.txt");
    std::fs::create_dir(&public).ok();
    std::fs::write(&secret, "TOP SECRET").ok();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).ok();
    let p = public.to_string_lossy().to_string();
    let out = run_probe(&["--ro", &p], &["read", &secret.to_string_lossy()]);
    assert_refused(
        &out,
        Some(libc::ENOENT),
        "read a planted secret next to an exposed dir",
    );
    let out = run_probe(&[], &["read", "/etc/shadow"]);
    assert_refused(&out, None, "read /etc/shadow");
    for path in [
        "/proc/1/root/etc/shadow",
        "/proc/self/root/etc/shadow",
        "/proc/1/cwd/etc/shadow",
    ] {
        let out = run_probe(&[], &["read", path]);
        assert_refused(&out, None, path);
    }
    let out = run_probe(&[], &["read", "/root/.bashrc"]);
    assert_refused(&out, Some(libc::ENOENT), "/root is not there");
}

#[test]
fn ro_paths_are_read_only_and_rw_paths_reach_the_host() {
    if skip_unless_root("ro/rw") {
        return;
    }
    let ro = shared_tempdir();
    let rw = shared_tempdir();
    let ro_p = canonical(ro.path());
    let rw_p = canonical(rw.path());
    std::fs::write(ro_p.join("data"), "visible").ok();
    let (ro_s, rw_s) = (
        ro_p.to_string_lossy().to_string(),
        rw_p.to_string_lossy().to_string(),
    );
    let out = run_probe(&["--ro", &ro_s], &["read", &format!("{ro_s}/data")]);
    assert_eq!(
        stdout(&out),
        "ok 7",
        "--ro content is readable: {}",
        stderr(&out)
    );
    let out = run_probe(&["--ro", &ro_s], &["write", &format!("{ro_s}/new"), "x"]);
    assert_refused(&out, Some(libc::EROFS), "write into --ro");
    let out = run_probe(&["--ro", &ro_s], &["write", &format!("{ro_s}/data"), "x"]);
    assert_refused(&out, Some(libc::EROFS), "overwrite in --ro");
    let out = run_probe(
        &["--rw", &rw_s],
        &["write", &format!("{rw_s}/out.txt"), "from inside"],
    );
    assert_eq!(stdout(&out), "ok 0", "--rw is writable: {}", stderr(&out));
    let mut s = String::new();
    std::fs::File::open(rw_p.join("out.txt"))
        .and_then(|mut f| f.read_to_string(&mut s))
        .ok();
    assert_eq!(s, "from inside", "the write is visible on the host");
}

#[test]
fn host_processes_are_invisible_and_unkillable() {
    if skip_unless_root("pids") {
        return;
    }
    let me = std::process::id().to_string();
    let out = hatchery_cmd(&["run", "--", "sh", "-c", "ls /proc | grep -E '^[0-9]+$'"]);
    let pids: Vec<u32> = stdout(&out)
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    // Its own: pid 1, sh, ls, grep; numbered from 1 in a fresh pid namespace.
    assert!(
        !pids.is_empty() && pids.len() <= 4,
        "the sandbox sees processes {pids:?}"
    );
    assert!(
        pids.iter().all(|p| *p < 10),
        "pids from outside the namespace: {pids:?}"
    );
    let out = run_probe(&[], &["read", &format!("/proc/{me}/cmdline")]);
    assert_refused(&out, Some(libc::ENOENT), "the test process is invisible");
    let out = run_probe(&[], &["kill", &me]);
    assert_refused(&out, Some(libc::ESRCH), "kill a host pid");
    let out = run_probe(&[], &["kill", "1"]);
    assert_refused(&out, None, "kill the sandbox's pid 1");
}

#[test]
fn no_capabilities_no_new_privs_and_a_seccomp_filter() {
    if skip_unless_root("privileges") {
        return;
    }
    for field in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let out = run_probe(&[], &["status", field]);
        assert_eq!(stdout(&out), "ok 0000000000000000", "{field}");
    }
    assert_eq!(stdout(&run_probe(&[], &["status", "NoNewPrivs"])), "ok 1");
    assert_eq!(stdout(&run_probe(&[], &["status", "Seccomp"])), "ok 2");
}

#[test]
fn a_setuid_root_binary_gains_nothing() {
    if skip_unless_root("setuid") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let copy = d.join("suid-probe");
    std::fs::copy(probe(), &copy).unwrap_or_else(|e| panic!("copy: {e}"));
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o4755)).ok();
    let c = copy.to_string_lossy().to_string();
    let d_s = d.to_string_lossy().to_string();
    for (field, want) in [
        ("CapEff", "ok 0000000000000000"),
        ("CapPrm", "ok 0000000000000000"),
    ] {
        let out = hatchery_cmd(&["run", "--ro", &d_s, "--", &c, "status", field]);
        assert_eq!(
            stdout(&out),
            want,
            "{field} after exec of a setuid-root file: {}",
            stderr(&out)
        );
    }
    // The host identity stays the unprivileged one: inside uid 0 is 65534 outside.
    let out = hatchery_cmd(&["run", "--ro", &d_s, "--", &c, "status", "Uid"]);
    assert_eq!(stdout(&out), "ok 0\t0\t0\t0", "{}", stderr(&out));
}

#[test]
fn namespace_and_mount_escapes_fail() {
    if skip_unless_root("escapes") {
        return;
    }
    for (attack, errno) in [
        ("mount", libc::EPERM),
        ("unshare-user", libc::EPERM),
        ("unshare-ns", libc::EPERM),
        ("clone-newuser", libc::EPERM),
        ("chroot", libc::EPERM),
    ] {
        let out = run_probe(&[], &[attack]);
        assert_refused(&out, Some(errno), attack);
    }
    let out = run_probe(&[], &["setns"]);
    assert_refused(&out, None, "setns into pid 1's mount namespace");
}

#[test]
fn dangerous_syscalls_are_denied_with_eperm() {
    if skip_unless_root("syscalls") {
        return;
    }
    let denied = [
        "mount",
        "umount2",
        "pivot_root",
        "open_tree",
        "move_mount",
        "fsopen",
        "unshare",
        "setns",
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "ptrace",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "iopl",
        "ioperm",
        "userfaultfd",
        "io_uring_setup",
        "open_by_handle_at",
        "name_to_handle_at",
        "process_vm_readv",
        "process_vm_writev",
        "reboot",
        "swapon",
        "swapoff",
        "settimeofday",
        "clock_settime",
        "acct",
        "syslog",
        "modify_ldt",
    ];
    for name in denied {
        let out = run_probe(&[], &["syscall", name]);
        assert_refused(&out, Some(libc::EPERM), name);
    }
    // clone with a namespace flag; clone3 answers ENOSYS so libc falls back to clone.
    let flags = format!("{}", libc::CLONE_NEWNET | libc::SIGCHLD);
    assert_refused(
        &run_probe(&[], &["syscall", "clone", &flags]),
        Some(libc::EPERM),
        "clone(CLONE_NEWNET)",
    );
    assert_refused(
        &run_probe(&[], &["syscall", "clone3"]),
        Some(libc::ENOSYS),
        "clone3",
    );
    // personality changes are refused; querying is allowed.
    assert_refused(
        &run_probe(&[], &["syscall", "personality", "0x400000"]),
        Some(libc::EPERM),
        "personality",
    );
    assert!(stdout(&run_probe(&[], &["syscall", "personality", "0xffffffff"])).starts_with("ok"));
    assert_refused(&run_probe(&[], &["tiocsti"]), None, "TIOCSTI");
    // and ordinary syscalls still work
    assert!(stdout(&run_probe(&[], &["syscall", "getpid"])).starts_with("ok"));
}

#[test]
fn the_32_bit_and_x32_entry_points_are_killed() {
    if skip_unless_root("compat abis") {
        return;
    }
    // i386: 20 = getpid, 21 = mount, 26 = ptrace; x32: 39 = getpid, 165 = mount.
    for nr in ["20", "21", "26"] {
        let out = run_probe(&[], &["i386", nr]);
        assert_eq!(
            code(&out),
            128 + libc::SIGSYS,
            "i386 syscall {nr} was not killed: {}",
            stdout(&out)
        );
    }
    for nr in ["39", "165"] {
        let out = run_probe(&[], &["x32", nr]);
        assert_eq!(
            code(&out),
            128 + libc::SIGSYS,
            "x32 syscall {nr} was not killed: {}",
            stdout(&out)
        );
    }
}

#[test]
fn the_sandbox_has_its_own_hostname_and_is_not_host_root() {
    if skip_unless_root("identity") {
        return;
    }
    let out = hatchery_cmd(&[
        "run",
        "--",
        "sh",
        "-c",
        "hostname; id -u; cat /proc/self/uid_map",
    ]);
    let s = stdout(&out);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.first().copied(), Some("hatchery"));
    assert_eq!(lines.get(1).copied(), Some("0"));
    let map: Vec<&str> = lines
        .get(2)
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    assert_eq!(map.len(), 3, "{s}");
    assert_eq!((map[0], map[2]), ("0", "1"), "{s}");
    let host: u32 = map[1].parse().unwrap_or(0);
    assert!(
        in_sandbox_id_range(host),
        "inside root maps to a leased unprivileged host id, got {host}"
    );
}
