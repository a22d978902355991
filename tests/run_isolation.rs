//! Attacks on a real sandbox: network, filesystem, processes, privileges and syscalls.
//! Every test starts `hatchery run` (as root, the CI setting) and fails if the attack works.

mod common;

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
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
fn tmp_and_dev_shm_are_the_only_writable_places_of_the_sandboxs_one_tmpfs() {
    if skip_unless_root("one tmpfs") {
        return;
    }
    // Each file system a sandbox keeps is walked whenever any memory cgroup goes offline:
    // the root, /tmp, /dev and /dev/shm are one tmpfs, and only /tmp and /dev/shm of it are
    // writable, and nothing crosses between them.
    let script = r#"
        for p in / /dev /proc; do touch "$p/x" 2>/dev/null && echo "wrote $p"; done
        touch /tmp/a /dev/shm/b || echo "not writable"
        ln /tmp/a /dev/shm/c 2>/dev/null && echo "linked across"
        ln /tmp/a /tmp/c || echo "no link within /tmp"
        echo "devices $(stat -c %d / /tmp /dev/shm /dev | sort -u | wc -l)"
        echo "tmpfs $(awk '{for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i + 1) == "tmpfs") print $3; break }}' /proc/self/mountinfo | sort -u | wc -l)"
        echo "modes $(stat -c %a /tmp /dev/shm | tr '\n' ' ')"
    "#;
    let out = hatchery_cmd(&["run", "--", "sh", "-c", script]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "devices 1\ntmpfs 1\nmodes 1777 1777",
        "{}",
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
    // Two filters: the seccomp floor and the profile's.
    assert_eq!(
        stdout(&run_probe(&[], &["status", "Seccomp_filters"])),
        "ok 2"
    );
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

/// The processors a process may run on, as the text of its `/proc/PID/status` lists them.
fn cpus_allowed(status: &str) -> String {
    status_field(status, "Cpus_allowed_list").unwrap_or_default()
}

#[test]
fn the_payload_may_run_on_every_processor_its_supervisor_may() {
    // pid 1 starts barred from the supervisor's processor (src/sandbox/elsewhere.rs); the
    // mask it hands down must be whole again by the time the payload starts, with the
    // limits (the cgroup's join) and without, and under a mask narrowed by the caller.
    if skip_unless_root("processor mask") {
        return;
    }
    let ours = proc_status(std::process::id(), "Cpus_allowed_list").unwrap_or_default();
    assert!(!ours.is_empty());
    for limits in [
        &[][..],
        &["--memory", "64M", "--cpus", "1", "--pids", "16"][..],
    ] {
        let mut args = vec!["run"];
        args.extend_from_slice(limits);
        args.extend(["--", "cat", "/proc/self/status", "/proc/1/status"]);
        let out = hatchery_cmd(&args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let text = stdout(&out);
        let (payload, pid1) = text.split_once("\nName:").unwrap_or((&text, ""));
        assert_eq!(cpus_allowed(payload), ours, "the payload, {limits:?}");
        assert_eq!(cpus_allowed(pid1), ours, "pid 1, {limits:?}");
    }
    let first = ours.split([',', '-']).next().unwrap_or("0").to_string();
    let mut narrowed = Command::new("taskset");
    narrowed
        .args(["-c", &first])
        .arg(hatchery())
        .args(["run", "--", "cat", "/proc/self/status"]);
    let out = run_with_timeout(&mut narrowed, Duration::from_secs(60));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        cpus_allowed(&stdout(&out)),
        first,
        "under taskset -c {first}"
    );
}

// ---------------------------------------------------------------------------------------
// The seccomp floor: refused under every profile, whatever the profile says. Each attack
// is first shown to work without hatchery (on the host, or under a plain `unshare -r`),
// then to fail in a sandbox with each built-in profile and with Docker's default profile
// imported (which allows more than any of them).

/// Docker's default profile as `hatchery profile import` writes it, in `dir`.
fn docker_profile(dir: &Path) -> PathBuf {
    let path = dir.join("docker.toml");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/docker-default-seccomp.json");
    let out = hatchery_cmd(&[
        "profile",
        "import",
        &fixture.to_string_lossy(),
        "-o",
        &path.to_string_lossy(),
        "--kernel",
        "6.1",
    ]);
    assert_eq!(code(&out), 0, "import: {}", stderr(&out));
    path
}

/// The built-in profiles and the imported Docker one, as `--profile` values.
fn every_profile(dir: &Path) -> Vec<String> {
    let mut all: Vec<String> = hatchery::profile::BUILTIN
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    all.push(docker_profile(dir).to_string_lossy().into_owned());
    all
}

/// The probe, run directly on the host (no sandbox) with a time limit.
fn probe_outside(wrapper: &[&str], args: &[&str]) -> Output {
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(probe());
            c
        }
        None => Command::new(probe()),
    };
    cmd.args(args);
    run_with_timeout(&mut cmd, Duration::from_secs(30))
}

/// `unshare` with a new user and network namespace: isolation without hatchery.
const UNSHARE: &[&str] = &["unshare", "--user", "--map-root-user", "--net"];

#[test]
fn a_vsock_socket_is_refused_under_every_profile() {
    if skip_unless_root("a_vsock_socket_is_refused_under_every_profile") {
        return;
    }
    // AF_VSOCK = 40; the same family with the upper half of the register set, which the
    // kernel ignores (it reads an int) and a 64-bit comparison would not.
    let families = ["40", "0xffffffff00000028"];
    for family in families {
        let out = probe_outside(UNSHARE, &["syscall", "socket", family, "1", "0"]);
        match stdout(&out).as_str() {
            s if s.starts_with("ok ") => {}
            "err 97" => eprintln!("note: this host's kernel has no vsock (EAFNOSUPPORT)"),
            other => panic!(
                "vsock outside hatchery, family {family}: {other} {}",
                stderr(&out)
            ),
        }
    }
    let dir = shared_tempdir();
    for profile in every_profile(dir.path()) {
        for family in families {
            let out = run_probe(
                &["--profile", &profile],
                &["syscall", "socket", family, "1", "0"],
            );
            assert_refused(
                &out,
                Some(libc::EPERM),
                &format!("{profile}: vsock {family}"),
            );
        }
    }
}

#[test]
fn i386_socketcall_is_refused_where_a_profile_accepts_i386() {
    if skip_unless_root("i386_socketcall_is_refused_where_a_profile_accepts_i386") {
        return;
    }
    if hatchery::profile::abi::Abi::native() != hatchery::profile::abi::Abi::X86_64 {
        eprintln!("SKIP i386_socketcall_is_refused_where_a_profile_accepts_i386: needs x86_64");
        return;
    }
    // socketcall (i386 102) carries the socket family in memory, where no filter can read
    // it. Without a filter the call reaches the kernel (call 0: EINVAL).
    let out = probe_outside(&[], &["i386", "102"]);
    assert_eq!(
        stdout(&out),
        format!("err {}", libc::EINVAL),
        "{}",
        stderr(&out)
    );
    // Docker's profile accepts i386 and allows socketcall; the floor refuses it there.
    let dir = shared_tempdir();
    let docker = docker_profile(dir.path()).to_string_lossy().into_owned();
    let out = run_probe(&["--profile", &docker], &["i386", "102"]);
    assert_refused(
        &out,
        Some(libc::EPERM),
        "i386 socketcall under Docker's profile",
    );
    let out = run_probe(&["--profile", &docker], &["i386", "20"]);
    assert_eq!(stdout(&out), "ok 2", "i386 getpid runs: {}", stderr(&out));
}

#[test]
fn netlink_usersock_is_refused_while_netlink_route_works() {
    if skip_unless_root("netlink_usersock_is_refused_while_netlink_route_works") {
        return;
    }
    // socket(AF_NETLINK = 16, SOCK_RAW = 3, protocol): NETLINK_USERSOCK (2) and
    // NETLINK_AUDIT (9) are refused, NETLINK_ROUTE (0) and NETLINK_SOCK_DIAG (4) are not.
    let out = probe_outside(UNSHARE, &["syscall", "socket", "16", "3", "2"]);
    assert!(
        stdout(&out).starts_with("ok "),
        "NETLINK_USERSOCK outside hatchery: {} {}",
        stdout(&out),
        stderr(&out)
    );
    let dir = shared_tempdir();
    for profile in every_profile(dir.path()) {
        for protocol in ["1", "2", "3", "9", "0x100000000"] {
            let out = run_probe(
                &["--profile", &profile],
                &["syscall", "socket", "16", "3", protocol],
            );
            assert_refused(
                &out,
                Some(libc::EPERM),
                &format!("{profile}: netlink {protocol}"),
            );
        }
        for protocol in ["0", "4"] {
            let out = run_probe(
                &["--profile", &profile],
                &["syscall", "socket", "16", "3", protocol],
            );
            let got = stdout(&out);
            if profile == "strict" {
                // strict creates no sockets at all.
                assert_eq!(got, format!("err {}", libc::EPERM), "{profile}: {protocol}");
            } else {
                assert!(
                    got.starts_with("ok "),
                    "{profile}: netlink {protocol}: {got}"
                );
            }
        }
    }
    // And the tools that use NETLINK_ROUTE work.
    if Path::new("/usr/sbin/ip").exists() || Path::new("/usr/bin/ip").exists() {
        let out = hatchery_cmd(&["run", "--", "ip", "-o", "link", "show"]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(stdout(&out).contains("lo"), "{}", stdout(&out));
    } else {
        eprintln!("note: no ip(8) here; NETLINK_ROUTE was checked with the probe only");
    }
}

#[test]
fn tiocsti_is_refused_by_the_floor_where_the_profile_allows_every_ioctl() {
    if skip_unless_root("tiocsti_is_refused_by_the_floor_where_the_profile_allows_every_ioctl") {
        return;
    }
    // The injection works without hatchery: on a terminal of its own, plainly and in a
    // user namespace.
    for wrapper in [&[][..], UNSHARE] {
        let out = probe_outside(wrapper, &["tiocsti-pty"]);
        assert_eq!(stdout(&out), "ok 0", "{wrapper:?}: {}", stderr(&out));
    }
    // On a descriptor that is no terminal the kernel answers ENOTTY: EPERM can only come
    // from a filter. compat (Docker's choice) and the imported Docker profile allow every
    // ioctl; the floor refuses TIOCSTI (0x5412) and TIOCLINUX (0x541c), whatever the upper
    // half of the request word holds.
    let out = probe_outside(&[], &["syscall", "ioctl", "0", "0x5412"]);
    assert_eq!(
        stdout(&out),
        format!("err {}", libc::ENOTTY),
        "{}",
        stderr(&out)
    );
    let dir = shared_tempdir();
    for profile in every_profile(dir.path()) {
        for request in ["0x5412", "0xffffffff00005412", "0x541c"] {
            let out = run_probe(
                &["--profile", &profile],
                &["syscall", "ioctl", "0", request],
            );
            assert_refused(
                &out,
                Some(libc::EPERM),
                &format!("{profile}: ioctl {request}"),
            );
        }
        let out = run_probe(&["--profile", &profile], &["tiocsti-pty"]);
        assert_refused(
            &out,
            None,
            &format!("{profile}: TIOCSTI on its own terminal"),
        );
    }
}

#[test]
fn set_uid_and_set_gid_files_cannot_be_made_in_an_rw_path() {
    if skip_unless_root("set_uid_and_set_gid_files_cannot_be_made_in_an_rw_path") {
        return;
    }
    let setid = |p: &Path| {
        std::fs::symlink_metadata(p)
            .map(|m| m.permissions().mode() & 0o6000)
            .unwrap_or(0)
    };
    // Without hatchery: chmod u+s and g+s, and a file created set-uid, all work.
    let host = shared_tempdir();
    let h = canonical(host.path());
    let f = h.join("f");
    std::fs::write(&f, "x").ok();
    for mode in ["4755", "2755"] {
        let out = probe_outside(&[], &["suid", "chmod", &f.to_string_lossy(), mode]);
        assert_eq!(
            stdout(&out),
            "ok 0",
            "chmod {mode} outside: {}",
            stderr(&out)
        );
        assert_ne!(setid(&f), 0, "chmod {mode} outside left no set-id bit");
    }
    let made = h.join("made");
    let out = probe_outside(&[], &["suid", "open", &made.to_string_lossy(), "4755"]);
    assert!(stdout(&out).starts_with("ok "), "{}", stderr(&out));
    assert_eq!(setid(&made), 0o4000, "open(O_CREAT, 04755) outside");

    let profiles_dir = shared_tempdir();
    for profile in every_profile(profiles_dir.path()) {
        let rw = shared_tempdir();
        let d = canonical(rw.path());
        // A user's directory (a root-owned one is mounted plainly, and each run's files
        // would belong to that run's own host uid).
        std::os::unix::fs::chown(&d, Some(4321), Some(4321)).unwrap_or_else(|e| panic!("{e}"));
        let ds = d.to_string_lossy().into_owned();
        let run = |args: &[&str]| run_probe(&["--profile", &profile, "--rw", &ds], args);
        let file = format!("{ds}/plain");
        let out = run(&["suid", "creat", &file, "644"]);
        assert!(
            stdout(&out).starts_with("ok "),
            "{profile}: creat: {}",
            stderr(&out)
        );
        for op in ["chmod", "fchmod", "fchmodat", "fchmodat2"] {
            for mode in ["4755", "2755", "6755"] {
                let out = run(&["suid", op, &file, mode]);
                assert_refused(&out, Some(libc::EPERM), &format!("{profile}: {op} {mode}"));
            }
        }
        // An ordinary chmod still works where the profile allows chmod at all.
        let out = run(&["suid", "chmod", &file, "755"]);
        assert_eq!(
            stdout(&out),
            "ok 0",
            "{profile}: chmod 755: {}",
            stderr(&out)
        );
        for op in [
            "open", "openat", "creat", "mknod", "mknodat", "mkdir", "mkdirat",
        ] {
            for mode in ["4755", "2755"] {
                let target = format!("{ds}/{op}-{mode}");
                let out = run(&["suid", op, &target, mode]);
                assert_refused(&out, Some(libc::EPERM), &format!("{profile}: {op} {mode}"));
            }
        }
        let out = run(&["suid", "tmpfile", &ds, "4755"]);
        assert_refused(&out, Some(libc::EPERM), &format!("{profile}: O_TMPFILE"));
        // openat2 carries its mode in memory: ENOSYS, so callers use openat (strict refuses
        // it itself, with its EPERM).
        let out = run(&["suid", "openat2", &format!("{ds}/openat2"), "4755"]);
        let want = if profile == "strict" {
            libc::EPERM
        } else {
            libc::ENOSYS
        };
        assert_refused(&out, Some(want), &format!("{profile}: openat2"));
        // Nothing set-uid or set-gid reached the host.
        let entries: Vec<PathBuf> = std::fs::read_dir(&d)
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        for e in &entries {
            assert_eq!(setid(e), 0, "{profile}: {} has a set-id bit", e.display());
        }
    }
}

#[test]
fn a_payload_holds_only_its_stdio_whatever_its_caller_left_open() {
    if skip_unless_root("a_payload_holds_only_its_stdio_whatever_its_caller_left_open") {
        return;
    }
    use common::fds::*;
    assert_extra_fds_reach_a_plain_command();
    // With an allowlist pid 1 also makes the egress listeners, which stay outside.
    for flags in [&[][..], &["--allow-host", "127.0.0.1:9"][..]] {
        let out = run_probe(flags, &["fds"]);
        assert_eq!(code(&out), 0, "{flags:?}: {}", stderr(&out));
        let fds = probe_fds(&stdout(&out));
        assert_eq!(
            probe_fd_numbers(&stdout(&out)),
            [0, 1, 2],
            "{flags:?}: {fds:?}"
        );

        let out = run_with_timeout(
            run_probe_fds(&mut holding_extra_fds(hatchery()), flags),
            Duration::from_secs(60),
        );
        assert_eq!(code(&out), 0, "{flags:?}: {}", stderr(&out));
        assert_eq!(
            probe_fd_numbers(&stdout(&out)),
            [0, 1, 2],
            "{flags:?}: the caller's descriptors reached the payload: {}",
            stdout(&out)
        );
    }
}

/// Runs `script` with `sh` in a user and mount namespace of its own that maps every id to
/// itself: root there may lower its namespace's `user.*` limits, which bind every sandbox
/// made inside, without touching the host's.
fn in_own_user_namespace(script: &str, limit: Duration) -> Output {
    const HELPER: &str = r#"
import os, sys, ctypes
libc = ctypes.CDLL(None, use_errno=True)
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(ready_r); os.close(go_w)
    if libc.unshare(0x10000000 | 0x00020000) != 0:
        os._exit(99)
    os.write(ready_w, b"x"); os.close(ready_w)
    os.read(go_r, 1)
    os.execvp("sh", ["sh", "-c", sys.argv[1]])
os.close(ready_w); os.close(go_r)
os.read(ready_r, 1)
for f in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{f}", "w") as m:
        m.write("0 0 4294967295\n")
os.write(go_w, b"x")
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"#;
    run_with_timeout(
        Command::new("python3")
            .args(["-c", HELPER, script])
            .env("HATCHERY", hatchery())
            .current_dir("/"),
        limit,
    )
}

#[test]
fn a_network_namespace_the_kernel_refuses_fails_every_run_with_125_and_says_why() {
    if skip_unless_root("network namespace refused") {
        return;
    }
    // pid 1 makes its network namespace itself, first thing, and may fail before the
    // supervisor has granted its identity: each run must still report that failure.
    let runs = 100;
    let out = in_own_user_namespace(
        &format!(
            "echo 0 > /proc/sys/user/max_net_namespaces || exit 99
             for i in $(seq {runs}); do \"$HATCHERY\" run -- /bin/echo PAYLOAD-RAN; echo \"rc=$?\"; done"
        ),
        Duration::from_secs(120),
    );
    assert_eq!(code(&out), 0, "{} / {}", stdout(&out), stderr(&out));
    let (o, e) = (stdout(&out), stderr(&out));
    assert!(!o.contains("PAYLOAD-RAN"), "a payload ran: {o}");
    assert_eq!(o.matches("rc=125").count(), runs, "{o}\n{e}");
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), runs, "{e}");
    for line in lines {
        assert!(
            line.contains("network namespace") && line.contains("user.max_net_namespaces"),
            "the refusal does not say why: {line}"
        );
    }
}
