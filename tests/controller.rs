//! The controller end to end, as root, with real sandboxes: replication under the contract,
//! identity, reaping, expiry, the kill switch, crash recovery, and bad input on both sockets.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use common::agents::*;
use common::controller::{TestController, worker_cgroups};
use common::*;
use serde_json::Value;

#[test]
fn replication_stops_at_max_depth_and_the_denial_is_audited() {
    if skip("depth") {
        return;
    }
    let c = TestController::start(
        &base_contract("").replace("max_depth = 3", "max_depth = 2"),
        &[],
    );
    // Every worker registers, asks for a child running the same script, then idles.
    let script = r#"hatchery agent register >/dev/null || exit 9
hatchery agent replicate --reason deeper -- sh -c "$S"
sleep 20"#;
    let root = spawned(&c, &["--env", &format!("S={script}")], "eval \"$S\"");
    let v = c.wait_for("three generations", LONG, |v| {
        TestController::count(v, "running") >= 3
    });
    let depths: Vec<u64> = v["workers"]
        .as_array()
        .map(|ws| ws.iter().filter_map(|w| w["depth"].as_u64()).collect())
        .unwrap_or_default();
    assert!(
        depths.contains(&0) && depths.contains(&1) && depths.contains(&2),
        "{depths:?}"
    );
    assert!(
        !depths.iter().any(|d| *d > 2),
        "a worker beyond max_depth exists: {depths:?}"
    );
    let denials = c.wait_audit("deny_depth", LONG);
    let deepest = v["workers"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["depth"] == 2))
        .map(|w| w["worker_id"].clone());
    assert_eq!(
        denials[0]["worker_id"],
        deepest.unwrap_or(Value::Null),
        "the depth-2 worker was refused"
    );
    assert_eq!(
        c.audit("replication_requested").len(),
        3,
        "root + two children"
    );
    let _ = root;
}

#[test]
fn the_quota_refuses_one_worker_too_many() {
    if skip("quota") {
        return;
    }
    let c = TestController::start(
        &base_contract("").replace("max_replicas = 64", "max_replicas = 3"),
        &[],
    );
    for _ in 0..3 {
        spawned(&c, &[], &idle(30));
    }
    let out = c.cli(&["spawn", "--", "true"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains("deny_quota"), "{}", stderr(&out));
    let entries = c.audit("deny_quota");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["actor"], "uid:0");
}

#[test]
fn a_parent_within_its_cooldown_is_refused() {
    if skip("cooldown") {
        return;
    }
    let c = TestController::start(
        &base_contract("").replace("cooldown_seconds = 0", "cooldown_seconds = 60"),
        &[],
    );
    let script = r#"hatchery agent register >/dev/null
hatchery agent replicate --reason one -- sleep 20 >/dev/null
hatchery agent replicate --reason two -- sleep 20; echo "second=$?"
sleep 20"#;
    let id = spawned(&c, &[], script);
    let denials = c.wait_audit("deny_cooldown", LONG);
    assert_eq!(denials[0]["worker_id"], id.as_str());
    assert_eq!(
        c.audit("replication_requested").len(),
        2,
        "root and its first child only"
    );
}

#[test]
fn a_worker_that_asked_to_shut_down_makes_no_more_workers() {
    if skip("replication after shutdown") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    // Before, its 5 s of grace let it start as many children as its quota allowed.
    let script = r#"hatchery agent register >/dev/null
hatchery agent shutdown >/dev/null
hatchery agent replicate --reason late -- sleep 20 2>&1; echo "late=$?"
sleep 20"#;
    let id = spawned(&c, &[], script);
    c.wait_audit("worker_shutdown_requested", LONG);
    let deadline = std::time::Instant::now() + LONG;
    let mut log = String::new();
    while std::time::Instant::now() < deadline && !log.contains("late=") {
        std::thread::sleep(Duration::from_millis(100));
        log = stdout(&c.cli(&["logs", id.as_str()]));
    }
    assert!(log.contains("late=1"), "{log}");
    assert!(log.contains("asked to shut down"), "{log}");
    assert_eq!(
        c.audit("replication_requested").len(),
        1,
        "the root only: {log}"
    );
}

#[test]
fn a_stop_condition_refuses_and_names_itself() {
    if skip("stop condition") {
        return;
    }
    let c = TestController::start(
        &base_contract("[[stop_condition]]\nkind = \"memory_budget\"\nmax_total_memory_mb = 300\n"),
        &[],
    );
    spawned(&c, &["--memory", "200M"], &idle(30));
    let out = c.cli(&["spawn", "--memory", "200M", "--", "true"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let entries = c.audit("deny_stop_condition");
    assert_eq!(entries.len(), 1, "{}", stderr(&out));
    assert!(
        entries[0]["details"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("memory")),
        "{}",
        entries[0]
    );
}

#[test]
fn a_child_may_not_ask_for_more_than_its_parent() {
    if skip("narrowing") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let script = r#"hatchery agent register >/dev/null
hatchery agent replicate --reason greedy --explicit --memory 512M --cpus 0.25 -- true
echo "rc=$?"
hatchery agent replicate --reason network --explicit --memory 64M --cpus 0.25 --allow-external -- true
echo "rc=$?"
sleep 20"#;
    let id = spawned(&c, &["--memory", "128M", "--cpus", "0.5"], script);
    let start = std::time::Instant::now();
    while c.audit("deny_narrowing").len() < 2 && start.elapsed() < LONG {
        std::thread::sleep(Duration::from_millis(100));
    }
    let entries = c.audit("deny_narrowing");
    assert_eq!(entries.len(), 2, "{}", c.log());
    assert_eq!(entries[0]["worker_id"], id.as_str());
    assert!(
        entries[0]["details"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("memory")),
        "{}",
        entries[0]
    );
    // Any public host is more than a parent without it has, however little else is asked.
    assert!(
        entries[1]["details"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("allow_external")),
        "{}",
        entries[1]
    );
    // The worker's output reaches its log through the launcher's pump: wait for it.
    let log_path = c.state_dir().join("workers").join(format!("{id}.log"));
    let start = std::time::Instant::now();
    let mut log = String::new();
    while start.elapsed() < LONG {
        log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.matches("rc=3").count() >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        log.contains("\"denied\"") && log.matches("rc=3").count() == 2,
        "{log}"
    );
}

#[test]
fn a_worker_cannot_speak_for_another() {
    if skip("impersonation") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let victim = spawned(&c, &[], &alive(20));
    let ex = examples_dir();
    let script = python_agent(
        &format!(
            "print(w.register())\nprint(w.call({{'type': 'heartbeat', 'worker_id': '{victim}'}}))\nprint(w.call({{'type': 'heartbeat', 'worker_id': w.worker_id}}))"
        ),
        "sleep 20",
    );
    let attacker = spawned(&c, &["--ro", &ex], &script);
    let entries = c.wait_audit("impersonation_attempt", LONG);
    assert_eq!(entries[0]["worker_id"], attacker.as_str());
    assert_eq!(entries[0]["details"]["claimed"], victim.as_str());
    // Python's output reaches the log when it exits (a pipe is block-buffered), through
    // the launcher's pump: wait for its three lines.
    let log_path = c
        .state_dir()
        .join("workers")
        .join(format!("{attacker}.log"));
    let start = std::time::Instant::now();
    let mut log = String::new();
    while start.elapsed() < LONG {
        log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.lines().count() >= 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() >= 3, "{log}");
    assert!(lines[1].contains("'error'"), "the claim was refused: {log}");
    assert!(lines[2].contains("'ok'"), "its own id is fine: {log}");
    assert_eq!(
        c.worker(&victim)["state"],
        "running",
        "the victim is untouched"
    );
}

#[test]
fn a_tampered_or_foreign_manifest_does_not_register() {
    if skip("forged manifest") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let ex = examples_dir();
    let script = python_agent(
        "m = dict(w.manifest)\nm['resources'] = dict(m['resources'], memory_limit_mb=4096)\nprint(w.call({'type': 'register', 'manifest': m}))",
        "sleep 20",
    );
    let id = spawned(&c, &["--ro", &ex], &script);
    let entries = c.wait_audit("reject_manifest_signature", LONG);
    assert_eq!(entries[0]["worker_id"], id.as_str());
    assert!(
        c.audit("worker_registered").is_empty(),
        "nothing registered"
    );
    // A refusal at registration ends the worker, as a contract denial does.
    c.wait_audit("worker_exited", LONG);
    assert_ne!(c.worker(&id)["state"], "running");
    assert!(c.audit("worker_registered").is_empty(), "it never got in");
}

#[test]
fn a_silent_worker_is_reaped() {
    if skip("reap") {
        return;
    }
    let c = TestController::start(
        &base_contract(""),
        &["--heartbeat-timeout", "3s", "--register-timeout", "5s"],
    );
    // Timeouts with room for a busy host: the silent worker registers well within the
    // registration timeout, and the chatty one outlives the unregistered one's reaping.
    let silent = spawned(&c, &[], &idle(60));
    let chatty = spawned(&c, &[], &alive(15));
    let never = spawned(&c, &[], "sleep 60");
    let start = std::time::Instant::now();
    let silent_reaped = loop {
        let entry = c
            .audit("reap_stale")
            .into_iter()
            .find(|e| e["worker_id"] == silent.as_str());
        match entry {
            Some(e) => break e,
            None if start.elapsed() > LONG => panic!("{silent} was never reaped\n{}", c.log()),
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert_eq!(silent_reaped["details"]["why"], "missed heartbeats");
    c.wait_for("the silent worker gone", LONG, |v| {
        v["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["worker_id"] == silent.as_str() && w["state"] == "exited")
        })
    });
    let v = c.wait_for("the unregistered worker reaped", LONG, |v| {
        v["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["worker_id"] == never.as_str() && w["state"] == "exited")
        })
    });
    let chatty_state = v["workers"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["worker_id"] == chatty.as_str()))
        .map(|w| w["state"].clone());
    assert_eq!(
        chatty_state,
        Some(Value::from("running")),
        "a worker that heartbeats is left alone"
    );
    assert!(
        c.audit("reap_stale")
            .iter()
            .any(|e| e["worker_id"] == never.as_str() && e["details"]["why"] == "never registered")
    );
}

#[test]
fn an_expired_manifest_shuts_its_worker_down() {
    if skip("expiry") {
        return;
    }
    let c = TestController::start(
        &base_contract("").replace("expiration_seconds = 3600", "expiration_seconds = 2"),
        &[],
    );
    let id = spawned(&c, &[], &alive(30));
    let entries = c.wait_audit("worker_expired", LONG);
    assert_eq!(entries[0]["worker_id"], id.as_str());
    c.wait_for("the expired worker gone", LONG, |v| {
        v["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["worker_id"] == id.as_str() && w["state"] == "exited")
        })
    });
}

#[test]
fn the_kill_switch_stops_fifty_workers_and_refuses_new_ones() {
    if skip("kill switch") {
        return;
    }
    let c = TestController::start(
        &base_contract("").replace("max_replicas = 64", "max_replicas = 100"),
        &[],
    );
    let marker = format!("ks-marker-{}", std::process::id());
    let mut ids = Vec::new();
    for _ in 0..50 {
        ids.push(spawned(
            &c,
            &["--memory", "64M", "--cpus", "0.1", "--pids", "16"],
            &format!("{}; : {marker}", idle(300)),
        ));
    }
    wait_running(&c, 50);
    let out = c.cli(&["kill-switch"]);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("50 workers killed"),
        "{}",
        stdout(&out)
    );
    // Every process and every cgroup is gone by the time the command returns.
    let ps = run_with_timeout(
        Command::new("pgrep").args(["-f", &marker]),
        Duration::from_secs(10),
    );
    assert_ne!(code(&ps), 0, "processes survived: {}", stdout(&ps));
    for id in &ids {
        assert!(
            worker_cgroups(id).is_empty(),
            "cgroup of {id} survived: {:?}",
            worker_cgroups(id)
        );
    }
    let v = c.ps();
    assert_eq!(v["kill_switch"], Value::Bool(true));
    assert_eq!(
        TestController::count(&v, "running") + TestController::count(&v, "starting"),
        0
    );
    let out = c.cli(&["spawn", "--", "true"]);
    assert_eq!(code(&out), 3, "new workers are refused: {}", stderr(&out));
    assert!(stderr(&out).contains("deny_kill_switch"));
    assert_eq!(c.audit("kill_switch_engaged").len(), 1);
    let out = c.cli(&["kill-switch", "--release"]);
    assert_eq!(code(&out), 0);
    spawned(&c, &[], "true");
}

/// The launcher closes what a one-shot `run` keeps open for a quick start and end: a
/// thousand workers must not hold a thousand cgroup directories open each (on cgroup v1,
/// one a hierarchy), which the launcher's open-file limit would bound.
#[test]
fn the_launcher_holds_no_running_workers_cgroup_directory_open() {
    if skip("launcher descriptors") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let ids: Vec<String> = (0..3)
        .map(|_| {
            spawned(
                &c,
                &["--memory", "64M", "--cpus", "0.5", "--pids", "16"],
                &idle(300),
            )
        })
        .collect();
    wait_running(&c, 3);
    for id in &ids {
        assert!(!worker_cgroups(id).is_empty(), "{id} has cgroups");
    }
    let (held, most) = c.launcher_cgroup_fds(ids.len());
    assert!(held.len() <= most, "the launcher holds {held:?}");
}

#[test]
fn a_killed_controller_takes_its_workers_and_the_restart_cleans_up() {
    if skip("crash") {
        return;
    }
    let mut c = TestController::start(&base_contract(""), &[]);
    let marker = format!("crash-marker-{}", std::process::id());
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(spawned(&c, &[], &format!("{}; : {marker}", idle(300))));
    }
    wait_running(&c, 3);
    c.crash();
    // Workers die with the controller (launcher → sandboxes, by parent-death signals).
    wait_process(
        &marker,
        false,
        Duration::from_secs(10),
        "workers outlived their controller",
    );
    assert!(c.socket.exists(), "a crash leaves the socket behind");
    c.restart();
    let recovered = c.wait_audit("crash_recovered", LONG);
    assert!(!recovered.is_empty());
    let start = std::time::Instant::now();
    while ids.iter().any(|id| !worker_cgroups(id).is_empty()) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "stale cgroups were not removed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(TestController::count(&c.ps(), "running"), 0);
    spawned(&c, &[], "true");
}

#[test]
fn an_old_manifest_is_worthless_after_a_restart() {
    if skip("replay after restart") {
        return;
    }
    let mut c = TestController::start(&base_contract(""), &[]);
    let dir = shared_tempdir();
    let d = canonical(dir.path()).to_string_lossy().to_string();
    let ex = examples_dir();
    let save = python_agent(
        &format!("open('{d}/old.json', 'w').write(json.dumps(w.manifest))\nprint(w.register())"),
        "sleep 30",
    );
    spawned(&c, &["--ro", &ex, "--rw", &d], &save);
    c.wait_audit("worker_registered", LONG);
    c.restart();
    let replay = python_agent(
        &format!(
            "old = json.load(open('{d}/old.json'))\nold['worker_id'] = w.worker_id\nprint(w.call({{'type': 'register', 'manifest': old}}))"
        ),
        "sleep 30",
    );
    let id = spawned(&c, &["--ro", &ex, "--ro", &d], &replay);
    let entries = c.wait_audit("reject_manifest_signature", LONG);
    assert_eq!(
        entries.last().map(|e| e["worker_id"].clone()),
        Some(Value::from(id.as_str()))
    );
    let registered_after: Vec<Value> = c
        .audit("worker_registered")
        .into_iter()
        .filter(|e| e["worker_id"] == id.as_str())
        .collect();
    assert!(registered_after.is_empty());
}

#[test]
fn garbage_oversized_and_truncated_worker_frames_are_refused_and_audited() {
    if skip("worker frames") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let bystander = spawned(&c, &[], &alive(30));
    let ex = examples_dir();
    for (name, attack) in [
        ("garbage", "w.send_raw(b'{not json'); print(w.receive())"),
        (
            "unknown-field",
            "print(w.call({'type': 'heartbeat', 'depth': 0}))",
        ),
        (
            "oversized",
            "import struct; w.sock.sendall(struct.pack('>I', 10**7)); print(w.receive())",
        ),
        (
            "truncated",
            "import struct; w.sock.sendall(struct.pack('>I', 100) + b'{}'); w.sock.shutdown(1); print(w.receive())",
        ),
    ] {
        let script = python_agent(
            &format!("w.register()\n{attack}"),
            &format!("echo '{name} done'; sleep 5"),
        );
        spawned(&c, &["--ro", &ex], &script);
    }
    let start = std::time::Instant::now();
    while c.audit("protocol_violation").len() < 4 && start.elapsed() < LONG {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(c.audit("protocol_violation").len(), 4, "{}", c.log());
    assert_eq!(
        c.worker(&bystander)["state"],
        "running",
        "other workers are served on"
    );
    assert!(c.cli(&["ps"]).status.success());
}

#[test]
fn a_flooding_worker_is_rate_limited_without_stalling_others() {
    if skip("flood") {
        return;
    }
    let c = TestController::start(&base_contract(""), &["--heartbeat-timeout", "3s"]);
    let bystander = spawned(&c, &[], &alive(15));
    let ex = examples_dir();
    let script = python_agent(
        "w.register()\nfor _ in range(3000):\n    w.send({'type': 'heartbeat'})",
        "sleep 10",
    );
    let flooder = spawned(&c, &["--ro", &ex], &script);
    let entries = c.wait_audit("rate_limited", LONG);
    assert_eq!(entries[0]["worker_id"], flooder.as_str());
    assert!(
        entries[0]["details"]["dropped_messages"]
            .as_u64()
            .unwrap_or(0)
            > 0
    );
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        c.worker(&bystander)["state"],
        "running",
        "the bystander kept heartbeating through the flood"
    );
}

#[test]
fn bad_api_frames_get_an_error_and_the_controller_stays_up() {
    if skip("api frames") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let exchange = |bytes: &[u8]| -> String {
        let mut s = match UnixStream::connect(&c.socket) {
            Ok(s) => s,
            Err(e) => panic!("connect: {e}"),
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(15)));
        let _ = s.write_all(bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).to_string()
    };
    let frame = |body: &[u8]| -> Vec<u8> {
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    };
    assert!(exchange(&frame(b"garbage")).contains("error"));
    assert!(exchange(&frame(br#"{"op":"ps","extra":1}"#)).contains("unknown field"));
    assert!(exchange(&frame(br#"{"op":"detonate"}"#)).contains("error"));
    assert!(exchange(&(10u32 << 24).to_be_bytes()).contains("larger than"));
    let _ = exchange(&[0, 0, 1, 0, b'{']);
    assert!(
        c.cli(&["ps"]).status.success(),
        "the controller still answers"
    );
}

#[test]
fn clients_of_another_uid_are_turned_away() {
    if skip("peer credentials") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    // The socket is 0600: a second user cannot even connect...
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(hatchery())
        .arg("ps")
        .arg("--socket")
        .arg(&c.socket);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(30));
    assert_ne!(code(&out), 0);
    // ...and if the mode is loosened, the peer-credential check still refuses it.
    let _ = std::fs::set_permissions(
        &c.socket,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    );
    let _ = std::fs::set_permissions(
        c.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    );
    let out = run_with_timeout(&mut cmd, Duration::from_secs(30));
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    assert!(
        stderr(&out).contains("may not use this controller"),
        "{}",
        stderr(&out)
    );
    let entries = c.wait_audit("client_rejected", LONG);
    assert_eq!(entries[0]["actor"], "uid:65534");
}

#[test]
fn audit_tampering_is_detected_for_edits_deletions_and_reordering() {
    if skip("audit tampering") {
        return;
    }
    let mut c = TestController::start(
        &base_contract("").replace("max_replicas = 64", "max_replicas = 1"),
        &[],
    );
    spawned(&c, &[], &idle(10));
    let _ = c.cli(&["spawn", "--", "true"]);
    c.stop();
    let state = c.state_dir().to_path_buf();
    let ok = run_with_timeout(
        Command::new(hatchery())
            .args(["audit", "verify", "--state-dir"])
            .arg(&state),
        Duration::from_secs(30),
    );
    assert_eq!(code(&ok), 0, "{}", stdout(&ok));
    let lines: Vec<String> = std::fs::read_to_string(state.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect();
    assert!(lines.len() >= 4, "{lines:?}");
    let tampered = |f: &dyn Fn(&mut Vec<String>)| -> (i32, String) {
        let copy = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for name in ["audit.head", "controller.key"] {
            let _ = std::fs::copy(state.join(name), copy.path().join(name));
        }
        let mut l = lines.clone();
        f(&mut l);
        let _ = std::fs::write(copy.path().join("audit.jsonl"), l.join("\n") + "\n");
        let out = run_with_timeout(
            Command::new(hatchery())
                .args(["audit", "verify", "--state-dir"])
                .arg(copy.path()),
            Duration::from_secs(30),
        );
        (code(&out), stdout(&out))
    };
    // Entry 1 begins the trail, 2 is controller_started; then the first spawn's request,
    // at 3 unless the launcher removed cgroups a crashed controller left (another test's,
    // in the same cgroup: `crash_recovered` comes first then).
    let request = lines
        .iter()
        .position(|l| l.contains("uid:0"))
        .unwrap_or_else(|| panic!("no request by uid:0 in {lines:?}"));
    let entry = format!("entry {}", request + 1);
    let (code_edit, msg) = tampered(&|l| l[request] = l[request].replace("uid:0", "uid:1000"));
    assert_eq!(code_edit, 1, "{msg}");
    assert!(msg.contains(&entry) && msg.contains("edited"), "{msg}");
    let (code_del, msg) = tampered(&|l| {
        l.remove(request);
    });
    assert_eq!(code_del, 1, "{msg}");
    assert!(msg.contains(&entry), "{msg}");
    let (code_swap, msg) = tampered(&|l| l.swap(1, 2));
    assert_eq!(code_swap, 1, "{msg}");
    assert!(msg.contains("entry 2"), "{msg}");
}

#[test]
fn a_workers_payload_holds_only_its_stdio_and_its_controller_socket() {
    if skip("worker descriptors") {
        return;
    }
    use common::fds::*;
    // The controller is started holding descriptors it was never meant to pass on, and
    // another worker is running: the launcher holds descriptors of every worker it runs.
    let c =
        TestController::start_under(&["sh", "-c", HOLD_EXTRA_FDS], &base_contract(""), None, &[]);
    for fd in EXTRA_FDS {
        assert!(
            std::path::Path::new(&format!("/proc/{}/fd/{fd}", c.pid())).exists(),
            "the controller does not hold fd {fd}: nothing to leak"
        );
    }
    let other = spawned(&c, &[], &idle(60));
    wait_running(&c, 1);
    let dir = probe_dir().to_string_lossy().to_string();
    let script = format!("exec '{}' fds", probe().display());
    let id = spawned(&c, &["--ro", &dir], &script);
    // Its log is complete once its exit is audited.
    let start = std::time::Instant::now();
    while !c
        .audit("worker_exited")
        .iter()
        .any(|e| e["worker_id"] == id.as_str())
    {
        assert!(
            start.elapsed() < LONG,
            "the worker did not exit: {}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(c.worker(&other)["state"], "running", "{}", c.log());
    let log = std::fs::read_to_string(c.state_dir().join("workers").join(format!("{id}.log")))
        .unwrap_or_default();
    let fds = probe_fds(&log);
    let nums: Vec<i32> = fds.iter().map(|(fd, _)| *fd).collect();
    assert_eq!(
        nums,
        [0, 1, 2, 3],
        "a worker holds other descriptors than stdio and its socket: {fds:?}"
    );
    assert!(
        fds.iter().any(|(fd, kind)| *fd == 3 && kind == "sock"),
        "fd 3 is not the controller socket: {fds:?}"
    );
}
