//! The controller's client commands as a newcomer meets them, against a real controller
//! with real workers: `spawn` says whether the sandbox started and can wait for the worker,
//! plain commands and the worker protocol, `ps`/`inspect`/`logs`, `kill` of several ids,
//! `--json` results, a closed stdout, and errors that name the fix.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::agents::*;
use common::controller::TestController;
use common::*;
use serde_json::Value;

fn json(out: &Output) -> Value {
    match serde_json::from_slice(&out.stdout) {
        Ok(v) => v,
        Err(e) => panic!(
            "not JSON ({e}): {:?} (stderr {:?})",
            stdout(out),
            stderr(out)
        ),
    }
}

/// `hatchery ARGS` as nobody:nogroup with no supplementary groups.
fn as_nobody(args: &[&str]) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(hatchery())
        .args(args);
    cmd
}

/// The lines of a `--help` that are examples of `prefix` (indented command lines).
fn help_examples(args: &[&str], prefix: &str) -> Vec<String> {
    let out = hatchery_cmd(args);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_agent_help_example_uses_real_flags_and_works_inside_a_worker() {
    if skip("agent help") {
        return;
    }
    let examples = help_examples(&["agent", "--help"], "hatchery agent ");
    assert!(examples.len() >= 5, "{examples:?}");
    assert!(
        examples.iter().all(|e| !e.contains("--inherit")),
        "{examples:?}"
    );
    assert!(
        examples.iter().any(|e| e.contains("--explicit")),
        "{examples:?}"
    );
    // Each example as a process of its own, in the order shown; register comes first.
    let script: String = examples
        .iter()
        .map(|e| {
            format!(
                "{e} >/dev/null 2>&1; echo \"rc=$?: {}\"\n",
                e.replace('"', "'")
            )
        })
        .collect();
    let c = TestController::start(&base_contract(""), &[]);
    let out = c.cli(&["spawn", "--wait", "--", "sh", "-c", &script]);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    let id = stdout(&out);
    let log = stdout(&c.cli(&["logs", &id]));
    let results: Vec<&str> = log.lines().filter(|l| l.starts_with("rc=")).collect();
    assert_eq!(results.len(), examples.len(), "{log}");
    for r in &results {
        assert!(r.starts_with("rc=0: "), "an example failed: {r}\n{log}");
    }
}

#[test]
fn the_python_client_makes_one_call_per_process_in_a_real_worker() {
    if skip("python one call per process") {
        return;
    }
    let ex = examples_dir();
    let c = TestController::start(&base_contract(""), &[]);
    let script = format!(
        "cd {ex}
python3 hatchery_agent.py register; echo rc=$?
python3 hatchery_agent.py heartbeat; echo rc=$?
python3 hatchery_agent.py report 'half done'; echo rc=$?
python3 hatchery_agent.py heartbeat; echo rc=$?
python3 hatchery_agent.py register; echo again=$?"
    );
    let started = Instant::now();
    let out = c.cli(&["spawn", "--wait", "--ro", &ex, "--", "sh", "-c", &script]);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "a call waited for a welcome sent once"
    );
    let id = stdout(&out);
    let log = stdout(&c.cli(&["logs", &id]));
    let replies: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let types: Vec<&str> = replies.iter().filter_map(|r| r["type"].as_str()).collect();
    assert_eq!(types, ["registered", "ok", "ok", "ok"], "{log}");
    assert_eq!(log.matches("rc=0").count(), 4, "{log}");
    // A second register has no welcome left: one line that says so, not a hang or a trace.
    assert!(log.contains("again=1"), "{log}");
    assert!(log.contains("registered already"), "{log}");
    assert!(!log.contains("Traceback"), "{log}");
    let report = c.audit("worker_report");
    assert_eq!(report.len(), 1, "the report reached the controller");
    assert!(
        c.audit("reap_stale").is_empty(),
        "the worker was not reaped"
    );
}

#[test]
fn spawn_of_a_sandbox_that_cannot_start_exits_125_with_the_refusal() {
    if skip("spawn refused") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let out = c.cli(&["spawn", "--ro", "/nonexistent-i14", "--", "true"]);
    assert_eq!(code(&out), 125, "{} {}", stdout(&out), stderr(&out));
    assert_eq!(stdout(&out), "", "no worker id for a worker that never ran");
    let err = stderr(&out);
    assert!(err.contains("could not start"), "{err}");
    assert!(err.contains("/nonexistent-i14"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let out = c.cli(&["spawn", "--json", "--ro", "/nonexistent-i14", "--", "true"]);
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["started"], false, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or("")
            .contains("/nonexistent-i14"),
        "{v}"
    );
    // One that starts is still an id on stdout and 0.
    let out = c.cli(&["spawn", "--no-controller", "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).starts_with("w-"), "{}", stdout(&out));
}

#[test]
fn a_rootless_controller_refusing_a_worker_names_its_own_allow_degraded_flag() {
    if skip("rootless refusal") {
        return;
    }
    let dir = shared_tempdir();
    let socket = dir.path().join("c.sock");
    let state = dir.path().join("state");
    let log = dir.path().join("controller.log");
    let log_file = match std::fs::File::create(&log) {
        Ok(f) => f,
        Err(e) => panic!("{e}"),
    };
    let _ = std::fs::set_permissions(&log, std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut ctl = match as_nobody(&["controller", "--socket"])
        .arg(&socket)
        .arg("--state-dir")
        .arg(&state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("start the controller: {e}"),
    };
    let start = Instant::now();
    while !socket.exists() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = run_with_timeout(
        as_nobody(&["spawn", "--socket"])
            .arg(&socket)
            .args(["--", "true"]),
        Duration::from_secs(60),
    );
    // Where the host enforces every limit rootless the worker starts: nothing to check.
    let refused_anyway = code(&out) == 0 && {
        std::thread::sleep(Duration::from_millis(500));
        let ps = run_with_timeout(
            Command::new(hatchery())
                .args(["ps", "--json", "--socket"])
                .arg(&socket),
            Duration::from_secs(30),
        );
        stdout(&ps).contains("could not start")
    };
    let _ = ctl.kill();
    let _ = ctl.wait();
    assert!(
        !refused_anyway,
        "spawn exited 0 for a worker that could not start"
    );
    if code(&out) == 0 {
        eprintln!("SKIP rootless refusal: this host enforces every limit rootless");
        return;
    }
    let err = stderr(&out);
    assert_eq!(code(&out), 125, "{err}");
    assert!(
        err.contains("start the controller with --allow-degraded") && !err.contains("hatchery run"),
        "{err}"
    );
    assert!(!err.contains("pass --allow-degraded"), "{err}");
}

#[test]
fn a_plain_command_is_reaped_and_ps_says_why_and_how_to_run_one() {
    if skip("plain command") {
        return;
    }
    let help = stdout(&hatchery_cmd(&["spawn", "--help"]));
    assert!(help.contains("never registered"), "{help}");
    assert!(help.contains("--no-controller"), "{help}");
    let c = TestController::start(&base_contract(""), &["--register-timeout", "1s"]);
    let plain = stdout(&c.cli(&["spawn", "--", "sleep", "30"]));
    c.wait_for("the plain command to be reaped", LONG, |_| {
        !c.worker(&plain)["exit"].is_null()
    });
    let ps = stdout(&c.cli(&["ps"]));
    assert!(ps.contains("ps --all"), "ended workers are counted: {ps}");
    let ps = stdout(&c.cli(&["ps", "--all"]));
    let line = ps.lines().find(|l| l.contains(&plain)).unwrap_or("");
    assert!(line.contains("never registered"), "{ps}");
    assert!(line.contains("--no-controller"), "{ps}");
    let v = json(&c.cli(&["inspect", "--json", &plain]));
    assert!(
        v["worker"]["exit"]["ended_by"]
            .as_str()
            .unwrap_or("")
            .contains("--no-controller"),
        "{v}"
    );
    // With --no-controller it lives past the register timeout and exits on its own.
    let out = c.cli(&[
        "spawn",
        "--no-controller",
        "--wait",
        "--",
        "sh",
        "-c",
        "sleep 3; echo fine",
    ]);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    let id = stdout(&out);
    assert_eq!(stdout(&c.cli(&["logs", &id])), "fine");
}

#[test]
fn a_client_the_socket_refuses_is_told_who_may_connect_once() {
    if skip("eacces") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let out = run_with_timeout(
        as_nobody(&["ps", "--socket"]).arg(&c.socket),
        Duration::from_secs(30),
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.matches("Permission denied").count(), 1, "{err}");
    assert!(err.contains("--socket-group"), "{err}");
    assert!(!err.contains("is `hatchery controller` running"), "{err}");
    let out = hatchery_cmd(&["ps", "--socket", "/nonexistent-i14/c.sock"]);
    assert_eq!(code(&out), 1);
    let err = stderr(&out);
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
    assert!(err.contains("is `hatchery controller` running"), "{err}");
}

#[test]
fn audit_verify_without_the_key_names_the_missing_file_and_key_flag() {
    if skip("verify key") {
        return;
    }
    let mut c = TestController::start(&base_contract(""), &[]);
    c.stop();
    let copy = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for f in ["audit.jsonl", "audit.head"] {
        let _ = std::fs::copy(c.state.join(f), copy.path().join(f));
    }
    let dir = copy.path().to_string_lossy().to_string();
    let out = hatchery_cmd(&["audit", "verify", "--state-dir", &dir]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("{dir}/controller.key")), "{err}");
    assert!(err.contains("--key"), "{err}");
    assert!(
        !err.contains("keygen"),
        "verifying needs the old key: {err}"
    );
    let v = json(&hatchery_cmd(&[
        "audit",
        "verify",
        "--state-dir",
        &dir,
        "--json",
    ]));
    assert_eq!(v["intact"], false);
    assert!(
        v["problem"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("--key"),
        "{v}"
    );
    // With the controller's key named, it checks.
    let key = c.state.join("controller.key").to_string_lossy().to_string();
    let out = hatchery_cmd(&[
        "audit",
        "verify",
        "--state-dir",
        &dir,
        "--key",
        &key,
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert_eq!(json(&out)["intact"], true);
    let out = hatchery_cmd(&[
        "audit",
        "verify",
        "--state-dir",
        &dir,
        "--key",
        "/nonexistent-i14",
    ]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("/nonexistent-i14"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("keygen"), "{}", stderr(&out));
}

#[test]
fn spawn_kill_and_kill_switch_print_json_results() {
    if skip("json") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let v = json(&c.cli(&["spawn", "--json", "--no-controller", "--", "sleep", "30"]));
    assert_eq!(v["started"], true, "{v}");
    assert!(v["pid"].as_i64().is_some(), "{v}");
    assert_eq!(v["depth"], 0);
    let id = v["worker_id"].as_str().unwrap_or("").to_string();
    let out = c.cli(&["kill", "--json", &id]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["killed"], serde_json::json!([id]), "{v}");
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    let v = json(&c.cli(&[
        "spawn",
        "--json",
        "--wait",
        "--no-controller",
        "--",
        "sh",
        "-c",
        "exit 3",
    ]));
    assert_eq!(v["status"], 3, "{v}");
    assert_eq!(v["exit"]["exit_code"], 3, "{v}");
    spawned(&c, &["--no-controller"], "sleep 30");
    let v = json(&c.cli(&["kill-switch", "--json"]));
    assert_eq!(v["engaged"], true, "{v}");
    assert_eq!(v["killed"], 1, "{v}");
    let v = json(&c.cli(&["kill-switch", "--release", "--json"]));
    assert_eq!(v["engaged"], false, "{v}");
}

#[test]
fn approve_and_deny_print_json_decisions() {
    if skip("approve json") {
        return;
    }
    let contract = "max_depth = 3\nmax_replicas = 16\ncooldown_seconds = 0\nexpiration_seconds = 3600\n\n[approval]\nrequire = [{ kind = \"always\" }]\n";
    let c = TestController::start(contract, &[]);
    let script = "hatchery agent register >/dev/null
hatchery agent replicate --reason one -- true
hatchery agent replicate --reason two -- true
sleep 30";
    spawned(&c, &[], script);
    let start = Instant::now();
    let pending = loop {
        let v = json(&c.cli(&["approvals", "--json"]));
        if v.as_array().is_some_and(|a| !a.is_empty()) {
            break v;
        }
        assert!(start.elapsed() < LONG, "no request waited for approval");
        std::thread::sleep(Duration::from_millis(100));
    };
    let first = pending[0]["approval_id"].as_str().unwrap_or("").to_string();
    let out = c.cli(&["approve", "--json", &first]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["approval_id"], first.as_str());
    assert_eq!(v["approved"], true);
    assert!(
        v["child_id"].as_str().is_some_and(|c| c.starts_with("w-")),
        "{v}"
    );
    let start = Instant::now();
    let second = loop {
        let v = json(&c.cli(&["approvals", "--json"]));
        if let Some(id) = v
            .as_array()
            .and_then(|a| a.first())
            .and_then(|p| p["approval_id"].as_str())
        {
            break id.to_string();
        }
        assert!(start.elapsed() < LONG, "the second request never waited");
        std::thread::sleep(Duration::from_millis(100));
    };
    let v = json(&c.cli(&["deny", "--json", &second, "--reason", "no"]));
    assert_eq!(v["approval_id"], second.as_str());
    assert_eq!(v["approved"], false);
    assert!(v["child_id"].is_null(), "{v}");
}

#[test]
fn spawn_wait_exits_with_the_workers_status() {
    if skip("spawn wait") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let out = c.cli(&[
        "spawn",
        "--no-controller",
        "--wait",
        "--",
        "sh",
        "-c",
        "exit 7",
    ]);
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert!(stdout(&out).starts_with("w-"), "the id comes first");
    let out = c.cli(&[
        "spawn",
        "--no-controller",
        "--wait",
        "--timeout",
        "500ms",
        "--",
        "sleep",
        "30",
    ]);
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    // A worker speaking the protocol, waited for as well.
    let out = c.cli(&[
        "spawn",
        "--wait",
        "--",
        "sh",
        "-c",
        "hatchery agent register >/dev/null && hatchery agent report done >/dev/null",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn logs_prints_a_workers_output_and_follows_it_until_it_ends() {
    if skip("logs") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let out = c.cli(&[
        "spawn",
        "--no-controller",
        "--",
        "sh",
        "-c",
        "for i in 1 2 3 4 5; do echo line $i; echo err $i >&2; sleep 0.4; done",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let id = stdout(&out);
    let started = Instant::now();
    let out = c.cli(&["logs", "-f", &id]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "-f returned before the worker ended"
    );
    let text = stdout(&out);
    for i in 1..=5 {
        assert!(text.contains(&format!("line {i}")), "{text}");
        assert!(text.contains(&format!("err {i}")), "{text}");
    }
    assert!(
        !c.worker(&id)["exit"].is_null(),
        "-f ends when the worker ended"
    );
    // Without -f: what is there, at once, for an ended worker too.
    assert_eq!(stdout(&c.cli(&["logs", &id])), text);
    let out = c.cli(&["logs", "w-000000000000"]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("no worker"), "{}", stderr(&out));
}

#[test]
fn inspect_shows_manifest_limits_usage_and_why_it_ended() {
    if skip("inspect") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let id = spawned(
        &c,
        &["--no-controller", "--memory", "96M", "--pids", "20"],
        "sleep 30",
    );
    let out = c.cli(&["kill", &id]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = c.cli(&["inspect", &id]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    for needle in [
        "memory 96 MiB",
        "20 tasks",
        "killed by uid:0",
        "usage:",
        "exit:",
        "sleep",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    let v = json(&c.cli(&["inspect", "--json", &id]));
    assert_eq!(v["manifest"]["worker_id"], id.as_str());
    assert_eq!(v["manifest"]["resources"]["memory_limit_mb"], 96);
    assert!(v["manifest"]["signature"].as_str().is_some(), "{v}");
    assert!(
        v["worker"]["exit"]["ended_by"]
            .as_str()
            .unwrap_or("")
            .contains("killed"),
        "{v}"
    );
    assert!(!v["worker"]["usage"].is_null(), "usage over its life: {v}");
}

/// The `exit` of worker `id` in `ps --json`, once it has ended.
fn wait_exit(c: &TestController, id: &str) -> Value {
    c.wait_for(&format!("{id}'s exit"), LONG, |v| {
        v["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["worker_id"] == id && !w["exit"].is_null())
        })
    });
    c.worker(id)["exit"].clone()
}

/// A worker whose command never ran ends with `run`'s status for it, and `inspect` says
/// why, as `run` would, not only the audit trail.
#[test]
fn inspect_says_why_a_workers_command_never_ran() {
    if skip("inspect a start that failed") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let out = c.cli(&["spawn", "--no-controller", "--", "/no/such/command"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let id = stdout(&out);
    let exit = wait_exit(&c, &id);
    assert_eq!(exit["exit_code"], 127, "{exit}");
    let error = exit["error"].as_str().unwrap_or("");
    assert!(error.contains("No such file or directory"), "{exit}");
    let text = stdout(&c.cli(&["inspect", &id]));
    assert!(
        text.lines()
            .any(|l| l.starts_with("error:") && l.contains("No such file or directory")),
        "{text}"
    );
    // A worker that ended by itself has no error line.
    let fine = spawned(&c, &["--no-controller"], "exit 3");
    wait_exit(&c, &fine);
    let text = stdout(&c.cli(&["inspect", &fine]));
    assert!(!text.contains("error:"), "{text}");
}

/// Whether a string somewhere in `v` holds `text`.
fn holds_text(v: &serde_json::Value, text: &str) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains(text),
        serde_json::Value::Array(a) => a.iter().any(|v| holds_text(v, text)),
        serde_json::Value::Object(m) => m.values().any(|v| holds_text(v, text)),
        _ => false,
    }
}

/// What a worker chose (here its command line) reaches the operator's terminal with its
/// escape sequences and invisible formatting characters written out, never raw.
#[test]
fn ps_and_inspect_never_print_a_workers_escape_sequences_raw() {
    if skip("escapes in ps") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    // A C1 CSI (U+009B) too: serde_json writes it raw, and a terminal that takes 8-bit
    // controls reads it as ESC [.
    let trick = "\u{1b}]0;PWNED\u{7}\u{1b}[2J\u{9b}2J\u{202e}txt.exe";
    let out = c.cli(&[
        "spawn",
        "--no-controller",
        "--",
        "sh",
        "-c",
        "sleep 30",
        trick,
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let id = stdout(&out);
    for args in [
        vec!["ps"],
        vec!["ps", "--all"],
        vec!["inspect", id.as_str()],
        vec!["ps", "--all", "--json"],
        vec!["inspect", id.as_str(), "--json"],
    ] {
        let text = stdout(&c.cli(&args));
        assert!(text.contains("sleep 30"), "{args:?}: {text}");
        assert!(
            !text.contains('\u{1b}')
                && !text.contains('\u{7}')
                && !text.contains('\u{9b}')
                && !text.contains('\u{202e}'),
            "{args:?} printed a worker's escapes raw: {text:?}"
        );
    }
    // The JSON still says exactly what the worker chose.
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&c.cli(&["inspect", id.as_str(), "--json"])))
            .unwrap_or_default();
    assert!(
        holds_text(&json, trick),
        "the escaped JSON reads back as other text: {json}"
    );
    // On a 50-column screen, nothing a worker chose wraps into another row or field.
    for args in [vec!["ps", "--all"], vec!["inspect", id.as_str()]] {
        let text = stdout(&c.cli_at_width(&args, Some("50")));
        let long: Vec<&str> = text.lines().filter(|l| l.chars().count() > 50).collect();
        assert!(
            long.is_empty(),
            "{args:?}: lines a terminal would wrap: {long:?}"
        );
    }
}

#[test]
fn ps_columns_line_up_and_kill_takes_several_ids() {
    if skip("ps columns") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let a = spawned(&c, &["--no-controller"], "sleep 30");
    let b = spawned(&c, &["--no-controller", "--memory", "1G"], "sleep 30");
    let ps = stdout(&c.cli(&["ps"]));
    let lines: Vec<&str> = ps.lines().collect();
    assert!(
        lines.first().is_some_and(|h| h.starts_with("WORKER")),
        "{ps}"
    );
    for col in ["STATE", "PID", "MEM", "COMMAND"] {
        let at = lines.first().and_then(|h| h.find(col)).unwrap_or(0);
        for l in lines.iter().skip(1) {
            let before = l.chars().nth(at.saturating_sub(1)).unwrap_or('x');
            assert_eq!(before, ' ', "{col} is not aligned:\n{ps}");
        }
    }
    let out = c.cli(&["kill", &a, &b, "w-000000000000"]);
    assert_eq!(code(&out), 1, "one id was no running worker");
    assert!(
        stdout(&out).contains(&a) && stdout(&out).contains(&b),
        "{}",
        stdout(&out)
    );
    assert!(stderr(&out).contains("w-000000000000"), "{}", stderr(&out));
    let v = c.ps();
    for id in [&a, &b] {
        let w = v["workers"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["worker_id"] == id.as_str()))
            .cloned()
            .unwrap_or(Value::Null);
        assert!(!w["exit"].is_null(), "{id} still runs: {w}");
    }
}

/// Runs `args` with stdout a pipe whose reader is gone before anything is written.
fn with_closed_stdout(c: &TestController, args: &[&str]) -> Output {
    let mut cmd = Command::new(hatchery());
    cmd.arg(args[0])
        .arg("--socket")
        .arg(&c.socket)
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(ch) => ch,
        Err(e) => panic!("{e}"),
    };
    drop(child.stdout.take());
    let start = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn a_closed_stdout_ends_ps_and_logs_quietly() {
    if skip("epipe") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let id = spawned(&c, &["--no-controller", "--wait"], "seq 1 20000");
    for args in [
        vec!["ps", "--json"],
        vec!["ps", "--all"],
        vec!["logs", &id],
        vec!["inspect", &id],
    ] {
        let out = with_closed_stdout(&c, &args);
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
    }
}
