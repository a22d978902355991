//! Attacks on the controller from inside its own workers: agents that speak the fd-3
//! protocol by hand and send what `hatchery agent` never would. Each test fails if the
//! attack works: the controller crashes, freezes, grows, loses its trail, or a limit
//! does not hold.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::agents::*;
use common::controller::TestController;
use common::*;
use serde_json::Value;

/// `hatchery ARGS --socket S` with a short limit: a controller that does not answer in
/// time fails the test instead of hanging it.
fn cli_within(c: &TestController, args: &[&str], limit: Duration) -> std::process::Output {
    let mut cmd = Command::new(hatchery());
    cmd.arg(args[0]).arg("--socket").arg(&c.socket);
    if let Some(rest) = args.get(1..) {
        cmd.args(rest);
    }
    run_with_timeout(&mut cmd, limit)
}

fn alive_and_answering(c: &TestController) {
    let out = cli_within(c, &["ps", "--json"], Duration::from_secs(10));
    assert_eq!(
        code(&out),
        0,
        "the controller stopped answering: {}",
        c.log()
    );
}

fn log_of(c: &TestController, id: &str) -> String {
    std::fs::read_to_string(c.state_dir().join("workers").join(format!("{id}.log")))
        .unwrap_or_default()
}

/// Worker `id`'s log once it says `done` (or after [`LONG`], as far as it got).
fn log_when_done(c: &TestController, id: &str) -> String {
    let start = Instant::now();
    while !log_of(c, id).contains("done") && start.elapsed() < LONG {
        std::thread::sleep(Duration::from_millis(200));
    }
    log_of(c, id)
}

fn verify_trail(c: &TestController) -> std::process::Output {
    let mut cmd = Command::new(hatchery());
    cmd.args(["audit", "verify", "--state-dir"])
        .arg(c.state_dir());
    run_with_timeout(&mut cmd, Duration::from_secs(30))
}

#[test]
fn a_report_cut_inside_a_character_does_not_stop_the_controller() {
    if skip("utf-8 report") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let bystander = spawned(&c, &[], &alive(30));
    let ex = examples_dir();
    let script = python_agent(
        "print(w.register())\nprint(w.report('\\u20ac' * 400))",
        "sleep 20",
    );
    let attacker = spawned(&c, &["--ro", &ex], &script);
    let reports = c.wait_audit("worker_report", LONG);
    alive_and_answering(&c);
    assert_eq!(reports[0]["worker_id"], attacker.as_str());
    let kept = reports[0]["details"]["result"].as_str().unwrap_or("");
    assert!(kept.starts_with("€€€") && kept.len() < 1200, "{kept}");
    assert_eq!(c.worker(&bystander)["state"], "running", "{}", c.log());
}

#[test]
fn a_fifo_swapped_in_for_an_allowlisted_program_freezes_nothing() {
    if skip("fifo swap") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let dir = shared_tempdir();
    let d = dir.path().to_string_lossy().to_string();
    let marker = format!("fifo-marker-{}", std::process::id());
    let ex = examples_dir();
    // One process swaps a small executable and a FIFO as fast as it can; the worker asks
    // for children whose allowlist names the executable, all the while.
    let body = format!(
        r#"import ctypes, os, time
print(w.register(), flush=True)
d = '{d}'
with open(d + '/x', 'w') as f:
    f.write('#!/bin/sh\necho ok\n')
os.chmod(d + '/x', 0o755)
os.mkfifo(d + '/f')
os.chmod(d + '/f', 0o755)
libc = ctypes.CDLL(None, use_errno=True)
if os.fork() == 0:
    a, b = (d + '/x').encode(), (d + '/f').encode()
    swap = libc.renameat2
    while True:
        swap(-100, a, -100, b, 2)
end = time.time() + 4
while time.time() < end:
    w.send({{'type': 'replicate', 'reason': 'swap', 'command': ['/bin/sh', '-c', 'sleep 60; : {marker}'],
            'filesystem': {{'read_only': [d], 'read_write': [], 'allow_exec': [d + '/x']}}}})
    print(w.receive(), flush=True)
    time.sleep(0.06)
"#
    );
    let attacker = spawned(
        &c,
        &["--ro", &ex, "--rw", &d],
        &python_agent(&body, "sleep 60"),
    );
    c.wait_audit("replication_requested", LONG);
    std::thread::sleep(Duration::from_secs(5));
    // The controller answers, its kill switch returns, and the attacker is gone.
    alive_and_answering(&c);
    let out = cli_within(&c, &["kill-switch"], Duration::from_secs(20));
    assert_eq!(
        code(&out),
        0,
        "{} {}\n{}",
        stdout(&out),
        stderr(&out),
        c.log()
    );
    assert_ne!(c.worker(&attacker)["state"], "running");
    assert!(!process_exists(&marker), "a child survived the kill switch");
    let log = log_of(&c, &attacker);
    assert!(
        log.contains("'type': 'allowed'"),
        "no child was let start: {log}"
    );
}

#[test]
fn an_oversized_launch_request_is_one_refusal_and_every_other_worker_runs_on() {
    if skip("oversized launch") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let bystander = spawned(&c, &[], &alive(40));
    let ex = examples_dir();
    // Commands of control characters (six bytes each in JSON) from well under to just
    // over what a frame holds, with as many variables as a manifest may have (a launch
    // request spells each in more bytes than the manifest): somewhere in between, the
    // largest launch request a manifest allows.
    let body = r#"import time
print(w.register(), flush=True)
for k in range(42_900, 43_300, 10):
    env = ['V%d=' % i for i in range(256)]
    print(k, w.replicate('big', ['/bin/true', '\x01' * k], env=env), flush=True)
    time.sleep(0.06)
print('swept', flush=True)
"#;
    let attacker = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 30"));
    let start = Instant::now();
    while !log_of(&c, &attacker).contains("swept") && start.elapsed() < LONG {
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = log_of(&c, &attacker);
    assert!(log.contains("swept"), "{log}");
    assert!(
        log.contains("the launcher takes at most"),
        "no launch request was too large: {log}"
    );
    alive_and_answering(&c);
    assert_eq!(c.worker(&bystander)["state"], "running", "{}", c.log());
    assert_eq!(c.worker(&attacker)["state"], "running", "{}", c.log());
    // A child may be refused, or start; none is the launcher's end.
    spawned(&c, &[], "true");
}

#[test]
fn a_huge_claimed_id_or_unknown_type_leaves_the_trail_small_and_intact() {
    if skip("audit flood") {
        return;
    }
    let mut c = TestController::start(&base_contract(""), &[]);
    let ex = examples_dir();
    let body = r#"print(w.register(), flush=True)
import time
big = 'w-' + 'a' * 261_000
print(w.call({'type': 'heartbeat', 'worker_id': big}).get('type'), flush=True)
w.send_raw(b'{"type":"' + b'y' * 261_000 + b'"}')
print(w.receive().get('type'), flush=True)
for i in range(60):
    w.send({'type': 'heartbeat', 'worker_id': 'w-%06d' % i + 'b' * 200_000})
    print(w.receive().get('type'), flush=True)
    time.sleep(0.06)
print('done', flush=True)
"#;
    let attacker = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 30"));
    let log = log_when_done(&c, &attacker);
    assert!(log.contains("done"), "{log}");
    alive_and_answering(&c);
    let size = std::fs::metadata(c.state_dir().join("audit.jsonl")).map_or(0, |m| m.len());
    assert!(size < 128 << 10, "the trail grew to {size} bytes");
    let attempts = c.audit("impersonation_attempt");
    assert!(!attempts.is_empty() && attempts.len() < 10, "{attempts:?}");
    let out = verify_trail(&c);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    // And the next controller starts on it.
    c.restart();
    alive_and_answering(&c);
}

#[test]
fn a_worker_that_never_reads_its_replies_is_disconnected_and_stopped() {
    if skip("non-reading worker") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let ex = examples_dir();
    // Frames that are not JSON, each answered with an error, and never a read.
    let body = r#"import time
w.send_raw(b'{"type":"register","manifest":' + json.dumps(w.manifest).encode() + b'}')
junk = b'{' + b'z' * 200_000
end = time.time() + 25
while time.time() < end:
    w.send_raw(junk)
"#;
    let before = rss_kib(c.pid());
    let attacker = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 60"));
    let mut peak = before;
    let stopped = stopped_as_not_reading(&c, &attacker, || peak = peak.max(rss_kib(c.pid())));
    assert!(stopped, "the worker was never stopped:\n{}", c.log());
    c.wait_for("the attacker gone", LONG, |v| {
        v["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["worker_id"] == attacker.as_str() && w["state"] == "exited")
        })
    });
    assert!(
        peak.saturating_sub(before) < 24 << 10,
        "the controller grew from {before} KiB to {peak} KiB"
    );
    alive_and_answering(&c);
}

/// Waits (at most [`LONG`]) for worker `id` to be recorded as stopped for not reading its
/// replies, doing `meanwhile` at each look; whether it was.
fn stopped_as_not_reading(c: &TestController, id: &str, mut meanwhile: impl FnMut()) -> bool {
    let start = Instant::now();
    loop {
        meanwhile();
        let stopped = c.audit("protocol_violation").iter().any(|e| {
            e["worker_id"] == id
                && e["details"]["error"]
                    .as_str()
                    .is_some_and(|m| m.contains("did not read its replies"))
        });
        if stopped || start.elapsed() > LONG {
            return stopped;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn allow_external_is_a_broker_never_the_hosts_network() {
    if skip("allow_external") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    // The worker counts its network interfaces: the sandbox's `lo`, and nothing of the
    // host's, with its proxy variables pointing at the broker.
    let script = "python3 -c 'import os, socket; print(len(socket.if_nameindex()), os.environ.get(\"HTTPS_PROXY\"))'";
    let out = c.cli(&[
        "spawn",
        "--wait",
        "--no-controller",
        "--allow-external",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    let started = c.wait_audit("worker_exited", Duration::from_secs(20));
    let id = started[0]["worker_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let log = std::fs::read_to_string(c.state_dir().join("workers").join(format!("{id}.log")))
        .unwrap_or_default();
    assert_eq!(log.trim(), "1 http://127.0.0.1:3128", "{}", c.log());
}

#[test]
fn a_socket_path_naming_a_regular_file_is_refused_and_the_file_kept() {
    if skip("socket file") {
        return;
    }
    let dir = shared_tempdir();
    let victim = dir.path().join("precious");
    if let Err(e) = std::fs::write(&victim, "keep me") {
        panic!("{e}");
    }
    let mut cmd = Command::new(hatchery());
    cmd.arg("controller")
        .arg("--socket")
        .arg(&victim)
        .arg("--state-dir")
        .arg(dir.path().join("state"));
    let out = run_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_ne!(code(&out), 0, "it started on a regular file");
    assert!(stderr(&out).contains("not a socket"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap_or_default(),
        "keep me"
    );
}

#[test]
fn pid_1_shows_its_own_name_not_the_controllers_command_line() {
    if skip("pid 1 cmdline") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let id = spawned(
        &c,
        &[],
        "tr '\\0' ' ' </proc/1/cmdline; echo; cat /proc/1/comm",
    );
    c.wait_audit("worker_exited", LONG);
    let log = log_of(&c, &id);
    assert!(log.contains("hatchery-init"), "{log}");
    let state = c.state_dir().to_string_lossy().to_string();
    assert!(
        !log.contains("--socket") && !log.contains(&state),
        "the controller's command line shows: {log}"
    );
}

#[test]
fn a_worker_without_an_output_cap_gets_the_controllers_default() {
    if skip("default output cap") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let id = spawned(&c, &[], "head -c 20M /dev/zero; echo rc=$? >&2");
    let exits = c.wait_audit("worker_exited", LONG);
    let size = std::fs::metadata(c.state_dir().join("workers").join(format!("{id}.log")))
        .map_or(u64::MAX, |m| m.len());
    assert!(size <= 16 << 20, "the log holds {size} bytes");
    assert_eq!(exits[0]["details"]["output_truncated"], Value::Bool(true));
}

#[test]
fn every_workers_output_together_stays_within_the_controllers_total() {
    if skip("total output") {
        return;
    }
    let c = TestController::start(
        &base_contract(""),
        &[
            "--worker-output-cap",
            "1M",
            "--worker-output-total",
            "1536K",
        ],
    );
    let ids: Vec<String> = (0..3)
        .map(|_| spawned(&c, &[], "head -c 900K /dev/zero"))
        .collect();
    c.wait_for("three exits", LONG, |v| {
        TestController::count(v, "exited") >= 3
    });
    let total: u64 = ids
        .iter()
        .map(|id| {
            std::fs::metadata(c.state_dir().join("workers").join(format!("{id}.log")))
                .map_or(0, |m| m.len())
        })
        .sum();
    assert!(total <= 1536 << 10, "the logs hold {total} bytes together");
    assert!(total >= 1 << 20, "only {total} bytes were kept");
    // Those the shared budget cut, short of their own cap, say so (they said nothing).
    let cut: Vec<&String> = ids
        .iter()
        .filter(|id| {
            let v: Value = serde_json::from_str(&stdout(&c.cli(&["inspect", "--json", id])))
                .unwrap_or_default();
            v["worker"]["exit"]["output_cut_at"]
                .as_u64()
                .is_some_and(|at| at < 1 << 20)
        })
        .collect();
    assert!(!cut.is_empty(), "no worker says its output was cut");
    for id in cut {
        let out = c.cli(&["logs", id]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            stderr(&out).contains("the worker's output was cut at"),
            "{}",
            stderr(&out)
        );
    }
}

/// The launcher process of a running controller (its one child).
fn launcher_of(c: &TestController) -> nix::unistd::Pid {
    let out = run_with_timeout(
        Command::new("pgrep").args(["-P", &c.pid().to_string()]),
        Duration::from_secs(10),
    );
    let pid = stdout(&out)
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<i32>().ok())
        .unwrap_or(0);
    assert!(pid > 0, "no launcher under {}", c.pid());
    nix::unistd::Pid::from_raw(pid)
}

#[test]
fn the_kill_switch_timeouts_and_shutdown_hold_while_the_launcher_is_stopped() {
    if skip("stopped launcher") {
        return;
    }
    let mut c = TestController::start(&base_contract(""), &[]);
    let marker = format!("frozen-marker-{}", std::process::id());
    for _ in 0..3 {
        spawned(&c, &[], &format!("{}; : {marker}", idle(300)));
    }
    // Long enough to be seen running with the others on a busy host first.
    let timed = spawned(
        &c,
        &["--timeout", "8s"],
        &format!("{}; : {marker}", idle(300)),
    );
    wait_running(&c, 4);
    let launcher = launcher_of(&c);
    let _ = nix::sys::signal::kill(launcher, nix::sys::signal::Signal::SIGSTOP);
    // A worker past its timeout is ended by the controller itself.
    c.wait_for("the timed-out worker gone", LONG, |v| {
        v["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["worker_id"] == timed.as_str() && w["state"] == "exited")
        })
    });
    alive_and_answering(&c);
    let out = cli_within(&c, &["kill-switch"], Duration::from_secs(20));
    assert_eq!(
        code(&out),
        0,
        "{} {}\n{}",
        stdout(&out),
        stderr(&out),
        c.log()
    );
    assert!(
        !process_exists(&marker),
        "a worker survived the kill switch"
    );
    // SIGTERM still stops the controller (it kills the launcher it waited for in vain).
    c.stop();
    assert!(
        nix::sys::signal::kill(launcher, None).is_err(),
        "the launcher survived"
    );
    let leftovers = common::controller::worker_cgroups(&launcher.to_string());
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_request_that_escapes_to_a_huge_audit_entry_is_summarised_and_the_trail_stays_readable() {
    if skip("escaped audit entry") {
        return;
    }
    let mut c = TestController::start(
        &base_contract("[approval]\nrequire = [{ kind = \"always\" }]\n"),
        &[],
    );
    let ex = examples_dir();
    // 43 KiB raw, some 258 KiB once every control character is escaped in JSON.
    let body = r#"print(w.register(), flush=True)
print(w.replicate('\x01' * 640, ['/bin/true'] + ['\x01' * 1024] * 42).get('type'), flush=True)
"#;
    spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 30"));
    let entries = c.wait_audit("approval_requested", LONG);
    let line = serde_json::to_string(&entries[0]).unwrap_or_default();
    assert!(line.len() < 32 << 10, "an entry of {} bytes", line.len());
    c.stop();
    let out = verify_trail(&c);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    c.restart();
    alive_and_answering(&c);
}

#[test]
fn a_worker_flooding_the_trail_is_held_to_its_budget_and_counted() {
    if skip("audit budget") {
        return;
    }
    let contract = base_contract("").replace("cooldown_seconds = 0", "cooldown_seconds = 3600");
    let c = TestController::start(&contract, &[]);
    let ex = examples_dir();
    // Reports and denied requests as fast as the rate limit lets them through.
    let body = r#"import time
print(w.register(), flush=True)
w.replicate('first', ['true'])
end = time.time() + 8
while time.time() < end:
    w.call({'type': 'report', 'result': '\x01' * 1024})
    w.replicate('again', ['true'])
    time.sleep(0.05)
print('flooded', flush=True)
"#;
    let attacker = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 30"));
    let start = Instant::now();
    while !log_of(&c, &attacker).contains("flooded") && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = c.cli(&["kill", &attacker]);
    // The last summary is written when the worker ends; together they count every entry
    // the worker caused beyond its budget.
    let mine = |e: &&Value| e["worker_id"] == Value::String(attacker.clone());
    let start = Instant::now();
    while !c.audit("worker_exited").iter().any(|e| mine(&e)) && start.elapsed() < LONG {
        std::thread::sleep(Duration::from_millis(100));
    }
    let suppressed: u64 = c
        .audit("audit_suppressed")
        .iter()
        .filter(mine)
        .map(|e| e["details"]["entries"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        suppressed > 50,
        "only {suppressed} entries were held back; log: {}\ntrail: {}",
        log_of(&c, &attacker),
        std::fs::read_to_string(c.state_dir().join("audit.jsonl")).unwrap_or_default()
    );
    let size = std::fs::metadata(c.state_dir().join("audit.jsonl")).map_or(0, |m| m.len());
    assert!(size < 256 << 10, "the trail grew to {size} bytes in 8 s");
}

#[test]
fn a_full_disk_leaves_no_half_written_entry_and_engages_the_kill_switch() {
    if skip("full disk") {
        return;
    }
    // Fill the filesystem, then ask for decisions that must be recorded.
    let (disk, mut c) = FullDisk::new("2m");
    let (state, filler) = (disk.state(), disk.filler());
    // The spawn's decision cannot be made durable: it fails, and everything stops.
    let out = c.cli(&["spawn", "--", "true"]);
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    c.wait_for("the kill switch", LONG, |v| {
        v["kill_switch"] == Value::Bool(true)
    });
    // Asked again while the disk is full: refused, and the refusal changes nothing.
    let out = c.cli(&["kill-switch", "--release"]);
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    // A spawn refused meanwhile stays refused, and its refusal is kept for the trail.
    let out = c.cli(&["spawn", "--", "true"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    // Room again: the next decision writes what the failure left to say first.
    let _ = std::fs::remove_file(&filler);
    let out = c.cli(&["spawn", "--", "true"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let entries = trail_of(&state);
    let events: Vec<&str> = entries.iter().filter_map(|e| e["event"].as_str()).collect();
    let refused = events.iter().filter(|e| **e == "deny_kill_switch").count();
    assert_eq!(refused, 2, "{events:?}");
    // What the failed syncs dropped is counted, the kill switch they engaged is recorded,
    // and nothing they were refused is recorded as done.
    let lost = entries
        .iter()
        .position(|e| e["event"] == "audit_entries_lost")
        .unwrap_or_else(|| panic!("no count of the dropped entries: {events:?}"));
    assert!(
        entries[lost]["details"]["by_event"]["kill_switch_released"].as_u64() == Some(1),
        "{}",
        entries[lost]
    );
    assert!(
        entries
            .iter()
            .skip(lost)
            .any(|e| e["event"] == "kill_switch_engaged"
                && e["details"]["reason"] == "the audit trail could not be written"),
        "{events:?}"
    );
    assert!(!events.contains(&"kill_switch_released"), "{events:?}");
    assert!(!events.contains(&"replication_requested"), "{events:?}");
    // Full again, and stopped before there is room: the session's end is not in the
    // trail, so the next start records that it did not stop cleanly.
    let _ = run_with_timeout(
        Command::new("dd")
            .args(["if=/dev/zero", "bs=64k"])
            .arg(format!("of={}", filler.display())),
        Duration::from_secs(20),
    );
    let _ = c.cli(&["kill-switch", "--release"]);
    c.stop();
    assert!(state.join("controller.pid").exists(), "{}", c.log());
    let _ = std::fs::remove_file(&filler);
    c.restart();
    c.stop();
    let mut cmd = Command::new(hatchery());
    cmd.args(["audit", "verify", "--state-dir"]).arg(&state);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(30));
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    let events: Vec<String> = trail_of(&state)
        .iter()
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    assert!(events.iter().any(|e| e == "crash_recovered"), "{events:?}");
    assert!(
        !events.iter().any(|e| e == "kill_switch_released"),
        "{events:?}"
    );
}

/// Refusals made while the disk is full are kept for the next sync; when the room
/// freed is less than they take, the sync is refused before a line of them is written
/// (the room is taken first), so no reader sees entries that are then withdrawn, and
/// once there is room the trail verifies.
#[test]
fn a_backlog_larger_than_the_room_freed_is_never_half_written() {
    if skip("backlog and partial room") {
        return;
    }
    let (disk, mut c) = FullDisk::new("4m");
    let (state, filler) = (disk.state(), disk.filler());
    let trail = state.join("audit.jsonl");
    let size = || std::fs::metadata(&trail).map_or(0, |m| m.len());
    let at_failure = size();
    // Refusals enough for a backlog of more than the 8 KiB freed below.
    for _ in 0..60 {
        let _ = c.cli(&["spawn", "--", "true"]);
    }
    let free = run_with_timeout(
        Command::new("truncate").args(["-s", "-8K"]).arg(&filler),
        Duration::from_secs(10),
    );
    assert_eq!(code(&free), 0, "{}", stderr(&free));
    // A reader watching the file throughout: a line written and cut back shows as a
    // larger size for a moment.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let largest = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut largest = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                largest = largest.max(size());
            }
            largest
        });
        for _ in 0..20 {
            let out = c.cli(&["spawn", "--", "true"]);
            assert_eq!(code(&out), 3, "{}", stderr(&out));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        watcher.join().unwrap_or(u64::MAX)
    });
    assert_eq!(
        largest, at_failure,
        "lines were written that the room could not hold"
    );
    let _ = std::fs::remove_file(&filler);
    let out = c.cli(&["spawn", "--", "true"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(
        size() > at_failure + 8192,
        "the backlog was not written once there was room"
    );
    c.stop();
    let mut cmd = Command::new(hatchery());
    cmd.args(["audit", "verify", "--state-dir"]).arg(&state);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(30));
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
}

/// A tmpfs of its own for a controller's state directory, filled to the last block once
/// the controller has started; unmounted when dropped.
struct FullDisk(tempfile::TempDir);

impl FullDisk {
    fn new(size: &str) -> (FullDisk, TestController) {
        let mnt = shared_tempdir();
        let mounted = mount_tmpfs(mnt.path(), size);
        assert_eq!(code(&mounted), 0, "{}", stderr(&mounted));
        let disk = FullDisk(mnt);
        let c = TestController::start_in(&base_contract(""), Some(&disk.state()), &[]);
        let _ = run_with_timeout(
            Command::new("dd")
                .args(["if=/dev/zero", "bs=4k"])
                .arg(format!("of={}", disk.filler().display())),
            Duration::from_secs(20),
        );
        (disk, c)
    }

    fn state(&self) -> std::path::PathBuf {
        self.0.path().join("state")
    }

    fn filler(&self) -> std::path::PathBuf {
        self.0.path().join("filler")
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// The entries of the trail in `state`, as stored.
fn trail_of(state: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(state.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn ps_shows_a_preview_of_each_command_however_long_the_commands_are() {
    if skip("ps preview") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let ex = examples_dir();
    let body = r#"import time
print(w.register(), flush=True)
for i in range(30):
    w.replicate('long', ['/bin/true'] + ['\x01' * 1024] * 40)
    time.sleep(0.06)
print('asked', flush=True)
"#;
    let parent = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 30"));
    let start = Instant::now();
    while !log_of(&c, &parent).contains("asked") && start.elapsed() < LONG {
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = cli_within(&c, &["ps", "--json", "--all"], Duration::from_secs(10));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        out.stdout.len() < 1 << 20,
        "ps printed {} bytes",
        out.stdout.len()
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let workers = v["workers"].as_array().cloned().unwrap_or_default();
    assert!(workers.len() > 20, "{v}");
    for w in workers {
        assert!(w["command"].as_array().is_some_and(|a| a.len() <= 9), "{w}");
    }
}

#[test]
fn a_child_cannot_lift_the_output_cap_its_root_was_given_by_default() {
    if skip("output cap narrowing") {
        return;
    }
    let c = TestController::start(&base_contract(""), &["--worker-output-cap", "1M"]);
    let ex = examples_dir();
    let body = r#"print(w.register(), flush=True)
r = dict(w.manifest['resources'], max_output_bytes=1 << 40)
print(w.replicate('loud', ['true'], resources=r), flush=True)
"#;
    let parent = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 30"));
    let denied = c.wait_audit("deny_narrowing", LONG);
    assert_eq!(denied[0]["worker_id"], parent.as_str());
    assert!(
        denied[0]["details"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("output")),
        "{}",
        denied[0]
    );
}

/// Entries of `event` in the trail that concern `id` (as the entry's worker or its parent).
fn entries_about(c: &TestController, event: &str, id: &str) -> usize {
    c.audit(event)
        .iter()
        .filter(|e| e["worker_id"] == id || e["details"]["parent"] == id)
        .count()
}

#[test]
fn a_request_whose_welcome_cannot_fit_is_refused_before_anything_is_recorded_as_allowed() {
    if skip("oversized welcome") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let ex = examples_dir();
    // Within the snapshot's own limit raw, past a frame once escaped into the welcome.
    let body = r#"import time
print(w.register(), flush=True)
for i in range(30):
    r = w.replicate('big', ['true'], state_snapshot='\x01' * 43670)
    time.sleep(0.05)
print('last', r.get('type'), r.get('event'), flush=True)
"#;
    let parent = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 30"));
    let start = Instant::now();
    while !log_of(&c, &parent).contains("last") && start.elapsed() < LONG {
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = log_of(&c, &parent);
    assert!(log.contains("last denied deny_invalid_request"), "{log}");
    // No child was recorded as allowed, no start as failed; the denials are budgeted.
    let children = c
        .audit("replication_requested")
        .iter()
        .filter(|e| e["details"]["parent"] == parent.as_str())
        .count();
    assert_eq!(children, 0);
    assert_eq!(c.audit("worker_start_failed").len(), 0);
    // The denials are the worker's to pay for (its audit budget), not the controller's.
    let denied = c.audit("deny_invalid_request");
    assert!(!denied.is_empty());
    assert!(
        denied
            .iter()
            .all(|e| e["actor"] == format!("worker:{parent}").as_str()),
        "{denied:?}"
    );
    alive_and_answering(&c);
}

#[test]
fn a_full_approval_queue_refuses_without_growing_the_trail() {
    if skip("approval queue flood") {
        return;
    }
    let c = TestController::start(
        &base_contract("[approval]\nrequire = [{ kind = \"always\" }]\n"),
        &[],
    );
    let ex = examples_dir();
    // Paced under the rate limit: every request reaches the engine.
    let body = r#"import time
print(w.register(), flush=True)
for i in range(100):
    r = w.replicate('x' * 16000, ['true'])
    time.sleep(0.05)
print('last', r.get('type'), r.get('event'), flush=True)
"#;
    let parent = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 30"));
    let start = Instant::now();
    while !log_of(&c, &parent).contains("last") && start.elapsed() < LONG {
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = log_of(&c, &parent);
    assert!(log.contains("last denied approval_denied"), "{log}");
    let denied = entries_about(&c, "approval_denied", &parent);
    assert!(denied < 80, "{denied} of 96 refusals written in full");
}

/// A worker that sends past its rate and never reads what it is sent: the answers to
/// its dropped messages fill its reply queue. It is stopped as one whose replies pile up
/// is, not left flooding while those answers are lost.
#[test]
fn a_worker_flooding_past_its_rate_without_reading_is_stopped() {
    if skip("flood without reading") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let ex = examples_dir();
    let body = r#"print(w.register(), flush=True)
frame = json.dumps({"type": "heartbeat"}).encode()
try:
    for _ in range(3000):
        w.send_raw(frame)
except OSError as e:
    print('cut off', e, flush=True)
print('sent', flush=True)
"#;
    let flooder = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 60"));
    assert!(
        stopped_as_not_reading(&c, &flooder, || {}),
        "{}",
        log_of(&c, &flooder)
    );
    c.wait_for("the flooder to be stopped", LONG, |v| {
        v["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["worker_id"] == flooder.as_str() && w["state"] != "running")
        })
    });
    alive_and_answering(&c);
}

/// A worker that asks again as soon as each answer comes, far past its rate, reading
/// every answer: it is never stopped (it reads), but the refusals it draws are paced, not
/// answered as fast as it can ask.
#[test]
fn a_worker_asking_past_its_rate_and_reading_each_answer_is_paced() {
    if skip("flood reading its answers") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let ex = examples_dir();
    let body = r#"import time
print(w.register(), flush=True)
answers = 0
end = time.monotonic() + 3
while time.monotonic() < end:
    w.heartbeat()
    answers += 1
print('answers', answers, flush=True)
"#;
    let asker = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 60"));
    let start = Instant::now();
    let answers = loop {
        let log = log_of(&c, &asker);
        if let Some(n) = log
            .lines()
            .find_map(|l| l.strip_prefix("answers "))
            .and_then(|n| n.trim().parse::<u64>().ok())
        {
            break n;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{log}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // 40 at once, then 20 a second answered and at most as many refused, over 3 s.
    assert!(
        answers < 600,
        "{answers} answers in 3 s: the refusals are not paced"
    );
    assert!(answers >= 40, "{answers} answers: the test proves nothing");
    assert_eq!(c.worker(&asker)["state"], "running", "{}", c.log());
    alive_and_answering(&c);
}

#[test]
fn a_flood_of_empty_frames_queues_nothing_and_ps_stays_prompt() {
    if skip("empty frame flood") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let rss = || {
        std::fs::read_to_string(format!("/proc/{}/status", c.pid()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let ex = examples_dir();
    let body = r#"import threading
print(w.register(), flush=True)
def drain():
    try:
        while w.sock.recv(65536):
            pass
    except OSError:
        pass
threading.Thread(target=drain, daemon=True).start()
try:
    w.sock.sendall(b'\0\0\0\0' * 1000000)
except OSError as e:
    print('stopped', e, flush=True)
print('sent', flush=True)
"#;
    let before = rss();
    let flooder = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 30"));
    // Every ps during the flood is answered (within `cli_within`'s bound).
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        let out = cli_within(&c, &["ps", "--json"], Duration::from_secs(10));
        assert_eq!(code(&out), 0, "{} {}", stderr(&out), log_of(&c, &flooder));
        std::thread::sleep(Duration::from_millis(100));
    }
    let grown_kb = rss().saturating_sub(before);
    assert!(grown_kb < 16 << 10, "the controller grew by {grown_kb} kB");
    alive_and_answering(&c);
}

#[test]
fn a_user_database_that_never_answers_costs_the_launcher_one_deadline_not_one_per_start() {
    if skip("hung user database") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    // In the controller's own mount namespace, /etc/group is a FIFO nobody writes.
    let fifo = user_db::silent_group_file(&d);
    let exposed = user_db::foreign_group_dir(&d);
    let c = user_db::controller_with_binds(&[(&fifo, "/etc/group")], &base_contract(""), &[]);
    let exposed = exposed.display().to_string();
    let spawn_rw = || c.cli(&["spawn", "--no-controller", "--rw", &exposed, "--", "true"]);
    // The first question (a directory in its owner's own group) is answered from the user
    // database, the second never: silent after an answer is silent all the same.
    let own = d.join("own");
    std::fs::create_dir(&own).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::chown(&own, Some(65534), Some(65534)).unwrap_or_else(|e| panic!("{e}"));
    let own = own.display().to_string();
    let first = c.cli(&[
        "spawn",
        "--no-controller",
        "--rw",
        &own,
        "--rw",
        &exposed,
        "--",
        "true",
    ]);
    assert_eq!(code(&first), 125, "{}", stderr(&first));
    assert!(
        stderr(&first).contains("did not answer within 5 s (1 of 2"),
        "{}",
        stderr(&first)
    );
    assert!(
        stderr(&first).contains(&format!("--rw {exposed} (owner uid 65534")),
        "the refusal names the directory whose question went unanswered: {}",
        stderr(&first)
    );
    // The next start with a read-write directory is refused without asking again, so the
    // launcher is not held another 5 s for it...
    let second = spawn_rw();
    assert_eq!(code(&second), 125, "{}", stderr(&second));
    assert!(
        stderr(&second).contains("not asked again"),
        "{}",
        stderr(&second)
    );
    // ...and a worker without one starts as ever.
    let plain = c.cli(&["spawn", "--no-controller", "--wait", "--", "true"]);
    assert_eq!(code(&plain), 0, "{}", stderr(&plain));
}

#[test]
fn a_start_asking_a_slow_user_database_too_much_is_refused_alone() {
    if skip("slow user database") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    // Each lookup of the group database takes 0.15 s or more: working, but slow.
    let Some(slow) = user_db::slow_group_file(&d, Duration::from_millis(150)) else {
        eprintln!("SKIP slow user database: this host's group database does not read /etc/group");
        return;
    };
    let c = user_db::controller_with_binds(&[(&slow, "/etc/group")], &base_contract(""), &[]);
    // Sixty-four directories (the most a worker may have), each in another group:
    // sixty-four questions, more than 5 s of them.
    let mut args = vec!["spawn".to_string(), "--no-controller".to_string()];
    for i in 0..64u32 {
        let many = d.join(format!("d{i}"));
        std::fs::create_dir(&many).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::chown(&many, Some(65534), Some(5000 + i))
            .unwrap_or_else(|e| panic!("{e}"));
        args.extend(["--rw".to_string(), many.display().to_string()]);
    }
    args.extend(["--".to_string(), "true".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let greedy = c.cli(&args);
    assert_eq!(code(&greedy), 125, "{}", stderr(&greedy));
    assert!(
        stderr(&greedy).contains("did not answer within 5 s"),
        "{}",
        stderr(&greedy)
    );
    // The database answered some of them: it is slow, not silent, and the next worker's
    // one question is asked and answered.
    let exposed = user_db::foreign_group_dir(&d).display().to_string();
    let next = c.cli(&[
        "spawn",
        "--no-controller",
        "--wait",
        "--rw",
        &exposed,
        "--",
        "true",
    ]);
    assert_eq!(code(&next), 0, "{}", stderr(&next));
}

#[test]
fn no_worker_is_given_a_path_that_holds_the_controllers_own_files() {
    if skip("controller's own files") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let home = canonical(c.dir.path());
    let state = canonical(&c.state);
    let apart = shared_tempdir();
    let apart = canonical(apart.path());
    for (flag, path) in [
        ("--ro", home.clone()),
        ("--ro", state.clone()),
        ("--ro", state.join("workers")),
        ("--rw", home.clone()),
    ] {
        let p = path.to_string_lossy().to_string();
        let out = c.cli(&["spawn", "--no-controller", flag, &p, "--", "true"]);
        assert_eq!(code(&out), 3, "{flag} {p}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("controller's own"),
            "{}",
            stderr(&out)
        );
    }
    assert!(
        c.audit("deny_invalid_request").len() >= 4,
        "each refusal is in the trail"
    );
    // A path beside them is given as usual.
    let p = apart.to_string_lossy().to_string();
    let out = c.cli(&["spawn", "--no-controller", "--ro", &p, "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // The controller's own program may be read (every worker runs it as its agent), never
    // written: a worker that replaced it would run as the operator at the next command.
    let program = canonical(&hatchery());
    let bin = program
        .parent()
        .unwrap_or(&program)
        .to_string_lossy()
        .to_string();
    let out = c.cli(&["spawn", "--no-controller", "--rw", &bin, "--", "true"]);
    assert_eq!(code(&out), 3, "--rw {bin}: {}", stderr(&out));
    assert!(
        stderr(&out).contains("controller's own"),
        "{}",
        stderr(&out)
    );
    let out = c.cli(&["spawn", "--no-controller", "--ro", &bin, "--", "true"]);
    assert_eq!(code(&out), 0, "--ro {bin}: {}", stderr(&out));
}

/// A controller that does not start leaves nothing it made: not a state directory made
/// through a symlink it then refused, nor the parents it made for one.
#[test]
fn a_controller_that_does_not_start_leaves_no_directory_it_made() {
    let tmp = shared_tempdir();
    let real = tmp.path().join("real");
    let link = tmp.path().join("link");
    let made = |p: &std::path::Path| std::fs::create_dir(p).unwrap_or_else(|e| panic!("{e}"));
    made(&real);
    std::os::unix::fs::symlink(&real, &link).unwrap_or_else(|e| panic!("{e}"));
    let start = |state: std::path::PathBuf, key: std::path::PathBuf| {
        let mut cmd = Command::new(hatchery());
        cmd.arg("controller")
            .arg("--state-dir")
            .arg(state)
            .arg("--key")
            .arg(key)
            .arg("--socket")
            .arg(tmp.path().join("c.sock"));
        run_with_timeout(&mut cmd, Duration::from_secs(30))
    };
    let listing = |p: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(p)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };

    // A symlink on the way: refused before anything is made through it.
    let out = start(link.join("a/state"), real.join("k"));
    assert_ne!(
        code(&out),
        0,
        "a state directory through a symlink was taken"
    );
    assert!(stderr(&out).contains("symlink"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("real"),
        "names the real path: {}",
        stderr(&out)
    );
    assert_eq!(
        listing(&real),
        Vec::<String>::new(),
        "made through the symlink"
    );

    // A failure after the state directory was made (its key cannot be written): the
    // state directory goes, and so do the parents this start made for it.
    let out = start(
        tmp.path().join("new1/new2/state"),
        tmp.path().join("absent/k"),
    );
    assert_ne!(code(&out), 0, "a key that cannot be written was accepted");
    assert!(
        !tmp.path().join("new1").exists(),
        "left behind: {:?}",
        listing(&tmp.path().join("new1"))
    );
    let mut left = listing(tmp.path());
    left.sort();
    assert_eq!(left, ["link", "real"], "{}", stderr(&out));
}

/// A controller whose socket the members of `nogroup` (`nobody`) may use.
fn nogroup_controller() -> TestController {
    let c = TestController::start(&base_contract(""), &["--socket-group", "nogroup"]);
    let _ = std::fs::set_permissions(
        c.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    );
    c
}

/// Connections that send nothing, opened without end by a member of the socket's group
/// (who may look, not act), ran the controller out of descriptors: `ps` timed out and the
/// next audit write failed, which engaged the kill switch. A uid holds 64 at most, the
/// others are turned away at once with the reason, and the operator is not crowded out.
#[test]
fn a_socket_group_member_holding_connections_open_takes_only_its_share() {
    if skip("connection flood") {
        return;
    }
    let c = nogroup_controller();
    // As nobody: 300 connections, each sending nothing; count those turned away with a
    // reason, then hold the rest open while the operator uses the controller.
    let flood = r#"
import socket, sys, time, select
held, refused = [], 0
for _ in range(300):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    held.append(s)
time.sleep(1)
for s in held:
    if select.select([s], [], [], 0)[0] and b"connections" in s.recv(4096):
        refused += 1
print(refused, flush=True)
sys.stdin.read()
"#;
    let mut child = Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--",
            "/usr/bin/python3",
            "-c",
            flood,
        ])
        .arg(&c.socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("setpriv: {e}"));
    let mut line = String::new();
    if let Some(out) = child.stdout.as_mut() {
        let mut reader = std::io::BufReader::new(out);
        let _ = std::io::BufRead::read_line(&mut reader, &mut line);
    }
    let refused: usize = line.trim().parse().unwrap_or(0);
    let ps = cli_within(&c, &["ps", "--json"], Duration::from_secs(10));
    let fds = std::fs::read_dir(format!("/proc/{}/fd", c.pid()))
        .map(|d| d.count())
        .unwrap_or(0);
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
    // 64 a uid, or fewer under a small descriptor limit (a 32nd of it).
    let soft: usize = std::fs::read_to_string(format!("/proc/{}/limits", c.pid()))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3).and_then(|n| n.parse().ok()))
        .unwrap_or(1024);
    let share = (soft / 32).clamp(1, 64);
    assert_eq!(refused, 300 - share, "turned away with a reason: {line:?}");
    assert_eq!(code(&ps), 0, "the operator was crowded out: {}", c.log());
    assert!(fds < 200, "the controller holds {fds} descriptors");
    alive_and_answering(&c);
    let spawned_after = c.spawn(&[], &alive(5));
    assert!(spawned_after.is_ok(), "no kill switch: {}", c.log());
}

/// A member of the socket's group asking without pause (three of them flooding `logs`
/// took 69 % of a core) is answered at its rate: a burst of 100, then 50 a second, while
/// the operator is answered at once.
#[test]
fn a_socket_group_member_asking_without_pause_is_answered_at_its_rate() {
    if skip("request flood") {
        return;
    }
    let c = nogroup_controller();
    // 400 `ps` requests written at once on one connection; the answers read for 2 s.
    let flood = r#"
import json, socket, struct, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
body = json.dumps({"op": "ps"}).encode()
s.sendall((struct.pack(">I", len(body)) + body) * 400)
s.settimeout(0.2)
answers, buf, end = 0, b"", time.time() + 2
while time.time() < end:
    try:
        chunk = s.recv(1 << 16)
    except socket.timeout:
        continue
    if not chunk:
        break
    buf += chunk
    while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
        buf = buf[4 + struct.unpack(">I", buf[:4])[0]:]
        answers += 1
print(answers, flush=True)
"#;
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--",
        "/usr/bin/python3",
        "-c",
        flood,
    ])
    .arg(&c.socket);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(30));
    let answers: usize = stdout(&out).trim().parse().unwrap_or(usize::MAX);
    // 100 at once, 50 a second after (2 s), and some slack for a slow start.
    assert!(
        (1..=230).contains(&answers),
        "{answers} answers in 2 s: {}",
        stderr(&out)
    );
    alive_and_answering(&c);
}

#[test]
fn a_launcher_killed_from_outside_leaves_each_workers_end_in_the_trail() {
    if skip_unless_root("launcher killed") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let ids: Vec<String> = (0..2)
        .map(|_| match c.spawn(&["--no-controller"], "sleep 100") {
            Ok(id) => id,
            Err(o) => panic!("{}", stderr(&o)),
        })
        .collect();
    c.wait_for("two running", LONG, |v| {
        TestController::count(v, "running") == 2
    });
    let launcher = c.launcher_pid();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(launcher as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    // The controller stops (it cannot start or stop anything without its launcher);
    // before, its trail named neither worker's end and said none was active.
    let stopped = c.wait_audit("controller_stopped", LONG);
    let exited = c.audit("worker_exited");
    for id in &ids {
        let end = exited.iter().find(|e| e["worker_id"] == id.as_str());
        let Some(end) = end else {
            panic!("no worker_exited for {id}: {exited:?}");
        };
        assert_eq!(end["details"]["ended_by"], "launcher exited", "{end}");
    }
    assert_eq!(stopped[0]["details"]["active_workers"], 0);
}

/// Waits (at most `limit`) for `child`, killing it past that: its exit status, if any.
fn wait_child(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn a_launch_the_launcher_reads_with_the_kill_switch_is_cancelled_not_started() {
    if skip_unless_root("launch behind a kill switch") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let launcher = nix::unistd::Pid::from_raw(c.launcher_pid() as i32);
    let cli = |args: &[&str]| {
        let mut cmd = Command::new(hatchery());
        cmd.arg(args[0])
            .arg("--socket")
            .arg(&c.socket)
            .args(&args[1..])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        match cmd.spawn() {
            Ok(child) => child,
            Err(e) => panic!("{e}"),
        }
    };
    // The launcher held up: a spawn decided now waits in its socket, and the kill switch
    // engaged after it is read in the same batch once the launcher runs again. Before,
    // the worker was started (and killed at once) after the switch was engaged.
    let _ = nix::sys::signal::kill(launcher, nix::sys::signal::Signal::SIGSTOP);
    let mut spawn = cli(&["spawn", "--no-controller", "--", "true"]);
    c.wait_audit("replication_requested", LONG);
    std::thread::sleep(Duration::from_millis(200));
    let mut switch = cli(&["kill-switch"]);
    c.wait_audit("kill_switch_engaged", LONG);
    std::thread::sleep(Duration::from_millis(200));
    let _ = nix::sys::signal::kill(launcher, nix::sys::signal::Signal::SIGCONT);
    let spawned = wait_child(&mut spawn, LONG);
    let switched = wait_child(&mut switch, LONG);
    assert_eq!(switched, Some(0), "the kill switch answered");
    assert_ne!(spawned, Some(0), "the spawn was not started");
    let engaged = c.audit("kill_switch_engaged");
    let after = engaged[0]["seq"].as_u64().unwrap_or(0);
    let started: Vec<Value> = c
        .audit("worker_started")
        .into_iter()
        .filter(|e| e["seq"].as_u64().unwrap_or(0) > after)
        .collect();
    assert!(started.is_empty(), "started after the switch: {started:?}");
    let failed = c.audit("worker_start_failed");
    assert!(
        failed.iter().any(|e| e["details"]["error"]
            .as_str()
            .is_some_and(|m| m.contains("cancelled"))),
        "{failed:?}"
    );
}

/// A worker chooses the name its request's reply echoes: echoed within 64 bytes (counted
/// in bytes, not characters), refused past them and never echoed, not echoed from a
/// frame that is no request, and never a way around the identity check.
#[test]
fn a_call_name_is_echoed_only_within_its_bound_and_never_skips_the_claim_check() {
    if skip("call names") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let ex = examples_dir();
    let body = r#"import json
print(w.register(), flush=True)
for name in ['n' * 64, 'n' * 65, '\u00e9' * 33, 7]:
    w.send({'type': 'heartbeat', 'call': name})
    print('reply', json.dumps(w.receive(), sort_keys=True), flush=True)
w.send({'type': 'heartbeat', 'worker_id': 'w-000000000000', 'call': 'x' * 65})
print('claim', json.dumps(w.receive(), sort_keys=True), flush=True)
print('done', flush=True)
"#;
    let attacker = spawned(&c, &["--ro", &ex], &python_agent(body, "sleep 30"));
    let log = log_when_done(&c, &attacker);
    let replies: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("reply "))
        .collect();
    let too_long = r#"{"message": "call longer than 64 bytes", "type": "error"}"#;
    assert_eq!(replies.len(), 4, "{log}");
    assert_eq!(
        replies[0],
        format!(r#"{{"call": "{}", "type": "ok"}}"#, "n".repeat(64))
    );
    assert_eq!(replies[1], too_long);
    assert_eq!(replies[2], too_long);
    assert!(
        replies[3].contains("\"error\"") && !replies[3].contains("\"call\""),
        "{log}"
    );
    let claim = log
        .lines()
        .find_map(|l| l.strip_prefix("claim "))
        .unwrap_or_default();
    assert!(claim.contains("not w-000000000000"), "{log}");
    assert_eq!(
        c.audit("impersonation_attempt").len(),
        1,
        "the claim behind a long name was not checked"
    );
}
