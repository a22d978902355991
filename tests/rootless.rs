//! Rootless: the binary run as `nobody` (setpriv, as CI runs these tests as root) gets the
//! same namespaces, read-only root, seccomp and Landlock; limits without a delegated cgroup
//! fail closed, or run degraded with a truthful report.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// `hatchery ARGS...` as nobody:nogroup with no supplementary groups.
fn as_nobody(args: &[&str]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(hatchery())
        .args(args);
    run_with_timeout(&mut cmd, Duration::from_secs(60))
}

/// `hatchery run FLAGS --ro PROBE_DIR -- probe ARGS` as nobody.
fn probe_as_nobody(flags: &[&str], args: &[&str]) -> Output {
    let dir = probe_dir().to_string_lossy().to_string();
    let probe = probe().to_string_lossy().to_string();
    let mut all = vec!["run"];
    all.extend_from_slice(flags);
    all.extend(["--ro", &dir, "--", &probe]);
    all.extend_from_slice(args);
    as_nobody(&all)
}

fn skip(test: &str) -> bool {
    if !is_root() {
        eprintln!("SKIP {test}: needs root to switch to nobody (run scripts/test.sh as root)");
        return true;
    }
    false
}

fn refused(out: &Output, what: &str) {
    assert_eq!(code(out), 0, "{what}: {} {}", stdout(out), stderr(out));
    assert!(
        stdout(out).starts_with("err "),
        "{what}: the attack worked rootless: {}",
        stdout(out)
    );
}

#[test]
fn rootless_sandboxes_have_every_namespace_and_no_host_network() {
    if skip("rootless network") {
        return;
    }
    let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = l
        .local_addr()
        .map(|a| a.port().to_string())
        .unwrap_or_default();
    refused(
        &probe_as_nobody(&[], &["tcp", "127.0.0.1", &port]),
        "tcp to the host",
    );
    let out = as_nobody(&[
        "run",
        "--",
        "sh",
        "-c",
        "hostname; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    ]);
    assert_eq!(stdout(&out), "hatchery\nlo", "{}", stderr(&out));
    let out = as_nobody(&[
        "run",
        "--",
        "sh",
        "-c",
        "readlink /proc/self/ns/user /proc/self/ns/cgroup",
    ]);
    let host_user = std::fs::read_link("/proc/self/ns/user")
        .map(|p| p.to_string_lossy().to_string())
        .unwrap_or_default();
    assert!(
        !stdout(&out).contains(&host_user),
        "same user namespace as the host"
    );
}

#[test]
fn rootless_filesystem_is_read_only_and_narrow() {
    if skip("rootless filesystem") {
        return;
    }
    for path in ["/usr/x", "/etc/x", "/x"] {
        refused(&probe_as_nobody(&[], &["write", path, "x"]), path);
    }
    refused(
        &probe_as_nobody(&[], &["read", "/etc/shadow"]),
        "/etc/shadow",
    );
    let hidden = shared_tempdir();
    let secret = canonical(hidden.path()).join("secret");
    std::fs::write(&secret, "s").ok();
    let _ = std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o644));
    refused(
        &probe_as_nobody(&[], &["read", &secret.to_string_lossy()]),
        "a host file not exposed",
    );
    let rw = shared_tempdir();
    let rw_s = canonical(rw.path()).to_string_lossy().to_string();
    let out = probe_as_nobody(&["--rw", &rw_s], &["write", &format!("{rw_s}/out"), "hi"]);
    assert_eq!(stdout(&out), "ok 0", "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(Path::new(&rw_s).join("out")).unwrap_or_default(),
        "hi"
    );
}

#[test]
fn rootless_payloads_have_no_privileges_and_a_filter() {
    if skip("rootless privileges") {
        return;
    }
    for field in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(
            stdout(&probe_as_nobody(&[], &["status", field])),
            "ok 0000000000000000",
            "{field}"
        );
    }
    assert_eq!(
        stdout(&probe_as_nobody(&[], &["status", "NoNewPrivs"])),
        "ok 1"
    );
    assert_eq!(
        stdout(&probe_as_nobody(&[], &["status", "Seccomp"])),
        "ok 2"
    );
    for attack in ["mount", "unshare-user", "chroot"] {
        refused(&probe_as_nobody(&[], &[attack]), attack);
    }
    for name in ["ptrace", "bpf", "keyctl", "mount", "setns"] {
        assert_eq!(
            stdout(&probe_as_nobody(&[], &["syscall", name])),
            "err 1",
            "{name}"
        );
    }
    let out = probe_as_nobody(&[], &["i386", "20"]);
    assert_eq!(
        code(&out),
        128 + libc::SIGSYS,
        "i386 entry point not killed"
    );
}

#[test]
fn rootless_host_processes_are_invisible() {
    if skip("rootless pids") {
        return;
    }
    let me = std::process::id().to_string();
    assert_eq!(
        stdout(&probe_as_nobody(
            &[],
            &["read", &format!("/proc/{me}/status")]
        )),
        "err 2"
    );
    assert_eq!(stdout(&probe_as_nobody(&[], &["kill", &me])), "err 3");
}

#[test]
fn rootless_payloads_may_run_on_every_processor_their_supervisor_may() {
    // A rootless supervisor bars its pid 1 from its own processor at first too, and must
    // be allowed to give the whole mask back (src/sandbox/elsewhere.rs).
    if skip("rootless processor mask") {
        return;
    }
    let ours = proc_status(std::process::id(), "Cpus_allowed_list").unwrap_or_default();
    let out = as_nobody(&["run", "--", "cat", "/proc/self/status"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!ours.is_empty());
    assert_eq!(
        status_field(&stdout(&out), "Cpus_allowed_list").unwrap_or_default(),
        ours
    );
}

fn no_delegated_cgroup() -> bool {
    // On this kind of host (cgroup v1, or v2 without delegation to nobody) rootless limits
    // cannot come from cgroups; in a delegated VM they can (tests/cgroup_v2*).
    let out = as_nobody(&["doctor", "--json"]);
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap_or(Value::Null);
    v["checks"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["name"] == "cgroups" && c["ok"] == Value::Bool(false))
    })
}

#[test]
fn rootless_limits_without_delegation_fail_closed() {
    if skip("rootless fail closed") || !no_delegated_cgroup() {
        return;
    }
    for flag in [["--memory", "64M"], ["--pids", "16"], ["--cpus", "0.5"]] {
        let out = as_nobody(&["run", flag[0], flag[1], "--", "echo", "ran"]);
        assert_eq!(code(&out), 125, "{flag:?}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "the command ran");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.contains("Delegate=yes") && err.contains("--allow-degraded"),
            "{err}"
        );
    }
}

#[test]
fn rootless_degraded_runs_report_exactly_what_was_enforced() {
    if skip("rootless degraded") || !no_delegated_cgroup() {
        return;
    }
    let dir = shared_tempdir();
    let report = canonical(dir.path()).join("r.json");
    let r = report.to_string_lossy().to_string();
    let out = probe_as_nobody(
        &[
            "--allow-degraded",
            "--memory",
            "64M",
            "--pids",
            "16",
            "--cpus",
            "0.5",
            "--report",
            &r,
        ],
        &["forkbomb", "100", "200"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let forked: u32 = stdout(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(999);
    assert!(
        forked < 16,
        "RLIMIT_NPROC stood in for --pids: {forked} forked"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_default())
        .unwrap_or(Value::Null);
    let e = &v["enforcement"];
    assert_eq!(e["cgroup"], "none");
    assert_eq!(e["rootless"], Value::Bool(true));
    assert!(
        e["limits"]["memory"]
            .as_str()
            .is_some_and(|s| s.contains("RLIMIT_AS")),
        "{e}"
    );
    assert!(
        e["limits"]["pids"]
            .as_str()
            .is_some_and(|s| s.contains("RLIMIT_NPROC")),
        "{e}"
    );
    assert!(
        e["limits"].get("cpus").is_none(),
        "cpus must not claim to be enforced: {e}"
    );
    let not: Vec<String> = e["not_enforced"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    for needle in ["memory", "pids", "cpus", "accounting"] {
        assert!(
            not.iter().any(|n| n.starts_with(needle)),
            "not_enforced lacks {needle}: {not:?}"
        );
    }
    assert_eq!(v["cpu_usec"], Value::Null, "no accounting without a cgroup");
    // And the RLIMIT_AS stand-in does stop a memory hog.
    let out = probe_as_nobody(&["--allow-degraded", "--memory", "64M"], &["memhog", "256"]);
    assert_ne!(
        code(&out),
        0,
        "256 MiB allocated under --memory 64M degraded"
    );
}

/// The system user scripts/test.sh gives a subordinate range (`daemon:400000:65536` in
/// /etc/subuid and /etc/subgid; newuidmap needs a user with a name); nobody keeps the plain
/// mapping.
const SUBID_USER: &str = "daemon";

#[test]
fn rootless_with_subordinate_ids_maps_a_range() {
    if skip("subuid") {
        return;
    }
    let has_entry = |f: &str| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with(&format!("{SUBID_USER}:")))
    };
    if !has_entry("/etc/subuid")
        || !has_entry("/etc/subgid")
        || !Path::new("/usr/bin/newuidmap").exists()
    {
        eprintln!(
            "SKIP rootless_with_subordinate_ids_maps_a_range: no newuidmap, or no /etc/subuid entry for {SUBID_USER} (scripts/test.sh sets both up)"
        );
        return;
    }
    let mut cmd = Command::new("setpriv");
    cmd.args([
        &format!("--reuid={SUBID_USER}"),
        &format!("--regid={SUBID_USER}"),
        "--clear-groups",
        "--",
    ])
    .arg(hatchery())
    .args([
        "run",
        "--",
        "sh",
        "-c",
        "cat /proc/self/uid_map; cat /proc/self/setgroups; id -G",
    ]);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60));
    let text = stdout(&out);
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 4, "{text} {}", stderr(&out));
    let uid = nix::unistd::User::from_name(SUBID_USER)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw().to_string())
        .unwrap_or_default();
    assert_eq!(lines[0], ["0", uid.as_str(), "1"]);
    assert_eq!(
        lines[1],
        ["1", "400000", "65536"],
        "the subordinate range starts at inside id 1"
    );
    assert_eq!(
        lines[2],
        ["allow"],
        "with newgidmap, supplementary groups can be dropped"
    );
    assert_eq!(lines[3], ["0"], "no supplementary groups");
    // nobody has no range: the plain single-id mapping, setgroups denied.
    let out = as_nobody(&[
        "run",
        "--",
        "sh",
        "-c",
        "cat /proc/self/uid_map /proc/self/setgroups",
    ]);
    let lines: Vec<Vec<String>> = stdout(&out)
        .lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    assert_eq!(
        lines,
        [vec!["0", "65534", "1"], vec!["deny"]]
            .map(|v| v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    );
}

/// A controller the test started, stopped (SIGTERM, then SIGKILL after 10 s) when the test
/// ends, failed or not: it would otherwise outlive a failed test with its workers.
struct StoppedOnDrop(std::process::Child);

impl StoppedOnDrop {
    fn stop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for StoppedOnDrop {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn a_rootless_controller_uses_the_users_directories_and_runs_workers_degraded() {
    if skip("rootless controller") || !no_delegated_cgroup() {
        return;
    }
    let base = shared_tempdir();
    let b = canonical(base.path());
    let (runtime, state) = (b.join("runtime"), b.join("state"));
    for d in [&runtime, &state] {
        let _ = std::fs::create_dir(d);
        let _ = std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o777));
    }
    let as_user = |args: &[&str]| -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(hatchery())
            .args(args)
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("XDG_STATE_HOME", &state);
        cmd
    };
    let mut ctl = match as_user(&["controller", "--allow-degraded", "--warm-pool", "1"])
        .stdin(std::process::Stdio::null())
        .spawn()
    {
        Ok(c) => StoppedOnDrop(c),
        Err(e) => panic!("start the controller: {e}"),
    };
    let socket = runtime.join("hatchery/controller.sock");
    let start = std::time::Instant::now();
    while !socket.exists() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        socket.exists(),
        "the controller's socket is in $XDG_RUNTIME_DIR/hatchery"
    );
    assert!(
        state.join("hatchery/audit.jsonl").exists(),
        "its state is in $XDG_STATE_HOME/hatchery"
    );
    let spawn_agent = || {
        let out = run_with_timeout(
            &mut as_user(&[
                "spawn",
                "--",
                "sh",
                "-c",
                "hatchery agent register; sleep 30",
            ]),
            Duration::from_secs(60),
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        stdout(&out).trim().to_string()
    };
    let id = spawn_agent();
    let start = std::time::Instant::now();
    let mut running = false;
    while start.elapsed() < Duration::from_secs(30) {
        let out = run_with_timeout(&mut as_user(&["ps", "--json"]), Duration::from_secs(30));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if v["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["worker_id"] == id.as_str() && w["state"] == "running")
        }) {
            running = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(running, "the rootless worker registered");
    let audit = std::fs::read_to_string(state.join("hatchery/audit.jsonl")).unwrap_or_default();
    assert!(
        audit
            .lines()
            .any(|l| l.contains("worker_started") && l.contains("RLIMIT")
                || l.contains("worker_started") && l.contains("not_enforced")),
        "the audit trail records what was not enforced for the worker"
    );
    // The warm pool works rootless too: the next worker of that kind takes the sandbox
    // prepared meanwhile.
    std::thread::sleep(Duration::from_secs(1));
    let second = spawn_agent();
    let start = std::time::Instant::now();
    let started = loop {
        let audit = std::fs::read_to_string(state.join("hatchery/audit.jsonl")).unwrap_or_default();
        let entry = audit
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["event"] == "worker_started" && e["worker_id"] == second.as_str());
        match entry {
            Some(e) => break e,
            None if start.elapsed() > Duration::from_secs(30) => panic!("{second} did not start"),
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert_eq!(started["details"]["prepared_ahead"], true, "{started}");
    // A worker with a read-write path runs as this user: given a path that holds the
    // state directory too, it could read the key and act as the controller. Refused.
    let proj = b.join("proj");
    let _ = std::fs::create_dir(&proj);
    let _ = std::os::unix::fs::chown(&proj, Some(65534), Some(65534));
    let key = state.join("hatchery/controller.key");
    let out = run_with_timeout(
        &mut as_user(&[
            "spawn",
            "--ro",
            &b.to_string_lossy(),
            "--rw",
            &proj.to_string_lossy(),
            "--",
            "cat",
            &key.to_string_lossy(),
        ]),
        Duration::from_secs(60),
    );
    assert_eq!(code(&out), 3, "{}{}", stdout(&out), stderr(&out));
    assert!(
        stderr(&out).contains("controller's own"),
        "{}",
        stderr(&out)
    );
    let out = run_with_timeout(&mut as_user(&["kill-switch"]), Duration::from_secs(60));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    ctl.stop();
    let out = run_with_timeout(&mut as_user(&["audit", "verify"]), Duration::from_secs(30));
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert!(!socket.exists(), "the socket is removed on exit");
}

#[test]
fn rootless_sandboxes_get_the_floor_their_own_loopback_the_proc_view_and_object_limits() {
    if skip("rootless floor") {
        return;
    }
    // The floor: vsock (40) and NETLINK_USERSOCK (16, 2) refused, as for root.
    for (args, what) in [
        (["syscall", "socket", "40", "1", "0"], "vsock"),
        (["syscall", "socket", "16", "3", "2"], "netlink usersock"),
    ] {
        let out = probe_as_nobody(&[], &args);
        assert_eq!(
            stdout(&out),
            format!("err {}", libc::EPERM),
            "{what}: {}",
            stderr(&out)
        );
    }
    // The sandbox's own loopback carries TCP.
    let out = probe_as_nobody(&[], &["listen-loopback"]);
    assert_eq!(stdout(&out), "ok 0", "{}", stderr(&out));
    // The /proc view and the namespace's own inotify limit hold rootless too.
    let out = as_nobody(&[
        "run",
        "--",
        "sh",
        "-c",
        "cat /proc/loadavg; wc -c < /proc/interrupts; cat /proc/sys/user/max_inotify_instances /proc/sys/user/max_user_namespaces",
    ]);
    let lines: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert_eq!(
        lines,
        ["0.00 0.00 0.00 1/1 1", "0", "64", "0"],
        "{}",
        stderr(&out)
    );
}

#[test]
fn rootless_payloads_hold_only_their_stdio_whatever_their_caller_left_open() {
    if skip("rootless descriptors") {
        return;
    }
    use common::fds::*;
    assert_extra_fds_reach_a_plain_command();
    let out = probe_as_nobody(&[], &["fds"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        probe_fd_numbers(&stdout(&out)),
        [0, 1, 2],
        "{}",
        stdout(&out)
    );

    let mut cmd = holding_extra_fds("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(hatchery());
    let out = run_with_timeout(run_probe_fds(&mut cmd, &[]), Duration::from_secs(60));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        probe_fd_numbers(&stdout(&out)),
        [0, 1, 2],
        "the caller's descriptors reached the payload: {}",
        stdout(&out)
    );
}

#[test]
fn rootless_pid_1_is_closed_to_the_payload() {
    if skip("rootless pid 1") {
        return;
    }
    // Rootless, pid 1's change to uid 0 inside changes nothing the kernel counts, so only
    // its own non-dumpable step (taken before the payload exists) closes it.
    let out = as_nobody(&["run", "--", "sh", "-c", PID1_PROBE]);
    assert_eq!(
        stdout(&out).lines().collect::<Vec<_>>(),
        PID1_CLOSED,
        "{}",
        stderr(&out)
    );
}

/// Rootless, the payload may share its pid 1's uid on the host: every fault signal it
/// sends pid 1 still leaves pid 1 alive and the command's own status reported.
#[test]
fn a_rootless_payload_that_sends_its_pid_1_every_fault_signal_keeps_its_own_status() {
    if skip("rootless faults sent to pid 1") {
        return;
    }
    let out = as_nobody(&["run", "--", "sh", "-c", FAULTS_TO_PID1]);
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert!(!stderr(&out).contains("pid 1"), "{}", stderr(&out));
}
