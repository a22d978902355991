//! Human approval of replication: a request the contract holds waits for a person, and
//! exactly the manifest shown starts when it is approved; denial, timeout, auto-approval,
//! and every bad decision are audited.

mod common;

use std::process::Command;
use std::time::Duration;

use common::agents::examples_dir;
use common::controller::TestController;
use common::*;
use serde_json::Value;

const LONG: Duration = Duration::from_secs(60);

fn contract(approval: &str) -> String {
    format!(
        "max_depth = 3\nmax_replicas = 16\ncooldown_seconds = 0\nexpiration_seconds = 3600\n\n[approval]\n{approval}\n"
    )
}

/// A worker that registers and asks for one child (which prints its own manifest's
/// signature), printing every reply it gets.
fn parent_script() -> String {
    r#"hatchery agent register >/dev/null
hatchery agent replicate --reason "a helper" -- sh -c 'python3 -c "import json,os,socket,struct; s=socket.socket(fileno=3); n=struct.unpack(\">I\", s.recv(4, socket.MSG_WAITALL))[0]; w=json.loads(s.recv(n, socket.MSG_WAITALL)); print(\"CHILD-SIGNATURE\", w[\"manifest\"][\"signature\"])"'
echo "rc=$?"
sleep 30"#
        .to_string()
}

fn log_of(c: &TestController, id: &str) -> String {
    std::fs::read_to_string(c.state_dir().join("workers").join(format!("{id}.log")))
        .unwrap_or_default()
}

fn wait_pending(c: &TestController, n: usize) -> Vec<Value> {
    let start = std::time::Instant::now();
    loop {
        let out = c.cli(&["approvals", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if let Some(a) = v.as_array() {
            if a.len() >= n {
                return a.clone();
            }
        }
        if start.elapsed() > LONG {
            panic!(
                "{n} pending approvals never appeared: {}\n{}",
                stdout(&out),
                c.log()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_log(c: &TestController, id: &str, needle: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        let log = log_of(c, id);
        if log.contains(needle) {
            return log;
        }
        if start.elapsed() > LONG {
            panic!(
                "{needle:?} never appeared in {id}'s log:\n{log}\n{}",
                c.log()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_approved_request_starts_exactly_the_manifest_shown() {
    if skip_unless_root("approve") {
        return;
    }
    let c = TestController::start(&contract("require = [{ kind = \"always\" }]"), &[]);
    let parent = match c.spawn(&[], &parent_script()) {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    let pending = wait_pending(&c, 1);
    let shown = pending[0]["manifest"]["signature"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let approval_id = pending[0]["approval_id"].as_str().unwrap_or("").to_string();
    assert_eq!(pending[0]["requested_by"], parent.as_str());
    // The reply still goes worker → log through the launcher's pump: wait for it.
    wait_log(&c, &parent, "\"pending\"");
    assert!(
        c.audit("replication_requested")
            .iter()
            .all(|e| e["worker_id"] == parent.as_str()),
        "no child before the decision"
    );
    // A second client decides.
    let out = c.cli(&["approve", &approval_id]);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    let child = pending[0]["manifest"]["worker_id"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let log = wait_log(&c, &parent, "rc=");
    assert!(log.contains("\"allowed\"") && log.contains(&child), "{log}");
    let child_log = wait_log(&c, &child, "CHILD-SIGNATURE");
    assert!(
        child_log.contains(&shown),
        "the child runs the manifest that was shown:\n{child_log}\nshown {shown}"
    );
    let requested = c.audit("approval_requested");
    let granted = c.audit("approval_granted");
    assert_eq!(requested.len(), 1);
    assert_eq!(
        requested[0]["details"]["manifest_signature"],
        shown.as_str()
    );
    assert_eq!(granted.len(), 1);
    assert_eq!(granted[0]["actor"], "uid:0");
    assert_eq!(granted[0]["details"]["approval_id"], approval_id.as_str());
    assert!(
        c.audit("replication_requested")
            .iter()
            .any(|e| e["worker_id"] == child.as_str())
    );
    // Deciding again changes nothing and is audited.
    let out = c.cli(&["approve", &approval_id]);
    assert_ne!(code(&out), 0);
    assert!(stderr(&out).contains("already decided"), "{}", stderr(&out));
    assert_eq!(c.audit("approval_refused").len(), 1);
}

#[test]
fn a_denied_request_never_starts_and_the_worker_hears_why() {
    if skip_unless_root("deny") {
        return;
    }
    let c = TestController::start(&contract("require = [{ kind = \"always\" }]"), &[]);
    let parent = match c.spawn(&[], &parent_script()) {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    let pending = wait_pending(&c, 1);
    let id = pending[0]["approval_id"].as_str().unwrap_or("").to_string();
    let out = c.cli(&["deny", &id, "--reason", "not today"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let log = wait_log(&c, &parent, "rc=");
    assert!(
        log.contains("approval_denied") && log.contains("not today") && log.contains("rc=3"),
        "{log}"
    );
    let denied = c.audit("approval_denied");
    assert_eq!(denied.len(), 1);
    assert_eq!(denied[0]["actor"], "uid:0");
    assert_eq!(denied[0]["details"]["reason"], "not today");
    assert_eq!(
        c.audit("replication_requested").len(),
        1,
        "only the parent ever started"
    );
}

#[test]
fn an_undecided_request_is_denied_at_its_deadline() {
    if skip_unless_root("timeout") {
        return;
    }
    let c = TestController::start(
        &contract("timeout_seconds = 1\nrequire = [{ kind = \"always\" }]"),
        &[],
    );
    let parent = match c.spawn(&[], &parent_script()) {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    let log = wait_log(&c, &parent, "rc=");
    assert!(
        log.contains("approval_timeout") && log.contains("rc=3"),
        "{log}"
    );
    assert_eq!(c.audit("approval_timeout").len(), 1);
    assert!(
        c.audit("approval_granted").is_empty(),
        "never approved by default"
    );
}

#[test]
fn known_safe_requests_are_approved_automatically() {
    if skip_unless_root("auto approve") {
        return;
    }
    let c = TestController::start(
        &contract(
            "require = [{ kind = \"always\" }]\n[[approval.auto_approve]]\nname = \"small\"\nmax_memory_mb = 256\nprofile = \"default\"\n",
        ),
        &[],
    );
    let parent = match c.spawn(&[], &parent_script()) {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    let log = wait_log(&c, &parent, "rc=");
    assert!(
        log.contains("\"allowed\"") && !log.contains("\"pending\""),
        "{log}"
    );
    let granted = c.audit("approval_granted");
    assert_eq!(granted.len(), 1);
    assert_eq!(granted[0]["details"]["auto_approve"], "small");
    // The same contract holds a request above the rule's memory for a person.
    let big = r#"hatchery agent register >/dev/null
hatchery agent replicate --reason bigger --explicit --memory 256M --cpus 0.5 -- true
sleep 30"#;
    let _ = c.spawn(&["--memory", "512M"], big);
    let _ = c.spawn(&["--memory", "512M"], &big.replace("256M", "300M"));
    let pending = wait_pending(&c, 1);
    assert!(
        pending
            .iter()
            .any(|p| p["manifest"]["resources"]["memory_limit_mb"] == 300)
    );
}

#[test]
fn bad_decisions_change_nothing_and_are_audited() {
    if skip_unless_root("bad decisions") {
        return;
    }
    let c = TestController::start(
        &contract("max_pending = 2\nrequire = [{ kind = \"always\" }]"),
        &["--socket-group", "65534"],
    );
    let out = c.cli(&["approve", "a-000000000000"]);
    assert_ne!(code(&out), 0);
    assert!(stderr(&out).contains("unknown"), "{}", stderr(&out));
    // Three workers ask; the queue holds two; the third is denied at once.
    let mut ids = Vec::new();
    for _ in 0..3 {
        match c.spawn(&[], &parent_script()) {
            Ok(id) => ids.push(id),
            Err(o) => panic!("{}", stderr(&o)),
        }
    }
    let start = std::time::Instant::now();
    while c.audit("approval_denied").is_empty() && start.elapsed() < LONG {
        std::thread::sleep(Duration::from_millis(100));
    }
    let full = c.audit("approval_denied");
    assert_eq!(full.len(), 1, "{}", c.log());
    assert!(
        full[0]["details"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("queue is full"))
    );
    let pending = wait_pending(&c, 2);
    assert_eq!(pending.len(), 2);
    // A member of the socket's group may look but not decide.
    let _ = std::fs::set_permissions(
        c.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    );
    let id = pending[0]["approval_id"].as_str().unwrap_or("").to_string();
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(hatchery())
        .args(["approve", "--socket"])
        .arg(&c.socket)
        .arg(&id);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(30));
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    assert!(stderr(&out).contains("may not decide"), "{}", stderr(&out));
    let refused = c.audit("approval_refused");
    assert!(
        refused.iter().any(|e| e["actor"] == "uid:65534"),
        "{refused:?}"
    );
    assert_eq!(wait_pending(&c, 2).len(), 2, "nothing changed");
    assert!(c.audit("approval_granted").is_empty());
}

#[test]
fn approval_rechecks_the_cooldown_and_one_worker_cannot_fill_the_queue() {
    if skip_unless_root("approval cooldown") {
        return;
    }
    let c = TestController::start(
        "max_depth = 3\nmax_replicas = 16\ncooldown_seconds = 60\nexpiration_seconds = 3600\n\n[approval]\nmax_pending = 32\nrequire = [{ kind = \"always\" }]\n",
        &[],
    );
    let ex = common::agents::examples_dir();
    // Six requests at once: each waits for a person; none has been decided yet, so none
    // has started the parent's cooldown.
    let script = common::agents::python_agent(
        "print(w.register(), flush=True)\nfor i in range(6):\n    print('reply', w.replicate('r%d' % i, ['true']), flush=True)\nwhile True:\n    print('later', w.receive(), flush=True)",
        "sleep 30",
    );
    let parent = match c.spawn(&["--ro", &ex], &script) {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    let start = std::time::Instant::now();
    while log_of(&c, &parent).matches("reply ").count() < 6 && start.elapsed() < LONG {
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = log_of(&c, &parent);
    assert_eq!(log.matches("reply {'type': 'pending'").count(), 4, "{log}");
    assert_eq!(log.matches("reply {'type': 'denied'").count(), 2, "{log}");
    let pending = wait_pending(&c, 4);
    assert_eq!(
        pending.len(),
        4,
        "one worker holds at most 4 places: {pending:?}"
    );
    for p in &pending {
        let id = p["approval_id"].as_str().unwrap_or("");
        let out = c.cli(&["approve", id]);
        assert_ne!(code(&out), 2, "{}", stderr(&out));
    }
    // The first approval starts a child and the cooldown; the rest are refused by it.
    let granted = c.wait_audit("approval_granted", LONG);
    let start = std::time::Instant::now();
    while c.audit("deny_cooldown").len() < 3 && start.elapsed() < LONG {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(granted.len(), 1, "{}", log_of(&c, &parent));
    assert_eq!(c.audit("deny_cooldown").len(), 3, "{}", log_of(&c, &parent));
    assert_eq!(
        c.audit("replication_requested")
            .iter()
            .filter(|e| e["details"]["parent"] == parent.as_str())
            .count(),
        1,
        "one child only"
    );
}

#[test]
fn a_reason_padded_to_wrap_never_reads_as_another_field_of_the_request() {
    if skip_unless_root("folded approvals") {
        return;
    }
    let c = TestController::start(&contract("require = [{ kind = \"always\" }]"), &[]);
    // "  why:        " is 14 columns: 66 more fill an 80-column row, and a terminal would
    // start the next with the forged field, where a person reads what the child needs.
    let reason = format!("{}  needs:      nothing", "x".repeat(66));
    let script = format!(
        "hatchery agent register >/dev/null\nhatchery agent replicate --reason '{reason}' -- true\nsleep 30"
    );
    if let Err(o) = c.spawn(&[], &script) {
        panic!("{}", stderr(&o));
    }
    wait_pending(&c, 1);
    let text = stdout(&c.cli_at_width(&["approvals"], Some("80")));
    assert!(text.contains("needs:      nothing"), "{text}");
    let long: Vec<&str> = text.lines().filter(|l| l.chars().count() > 80).collect();
    assert!(long.is_empty(), "lines a terminal would wrap: {long:?}");
    assert_eq!(
        text.lines()
            .filter(|l| l.trim_start().starts_with("needs:"))
            .count(),
        1,
        "the worker's text reads as a field of its own:\n{text}"
    );
}

#[test]
fn audit_tail_prints_a_workers_reason_escaped_and_folded() {
    if skip_unless_root("escapes in audit tail") {
        return;
    }
    let c = TestController::start(&contract("require = [{ kind = \"always\" }]"), &[]);
    // A title-setting sequence, a bell and a right-to-left override, in a reason long
    // enough to wrap: the trail keeps it (the approval's request records the reason).
    let script = "hatchery agent register >/dev/null\n\
                  hatchery agent replicate --reason \"$(printf 'PWNED\\033]0;t\\007\\342\\200\\256%080d' 0)\" -- true\n\
                  sleep 30";
    if let Err(o) = c.spawn(&[], script) {
        panic!("{}", stderr(&o));
    }
    wait_pending(&c, 1);
    let tail = |columns: Option<&str>| {
        let mut cmd = std::process::Command::new(hatchery());
        cmd.args(["audit", "tail", "--state-dir"]).arg(&c.state);
        match columns {
            Some(w) => cmd.env("COLUMNS", w),
            None => cmd.env_remove("COLUMNS"),
        };
        let out = run_with_timeout(&mut cmd, Duration::from_secs(30));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        stdout(&out)
    };
    let text = tail(None);
    assert!(text.contains("PWNED"), "the trail lacks the reason: {text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}') && !text.contains('\u{202e}'),
        "audit tail printed a worker's escapes raw: {text:?}"
    );
    let text = tail(Some("50"));
    assert!(text.contains("PWNED"), "{text}");
    let long: Vec<&str> = text.lines().filter(|l| l.chars().count() > 50).collect();
    assert!(long.is_empty(), "lines a terminal would wrap: {long:?}");
}

#[test]
fn a_killed_workers_requests_leave_the_queue_with_it() {
    if skip_unless_root("approvals of an ended worker") {
        return;
    }
    let c = TestController::start(&contract("require = [{ kind = \"always\" }]"), &[]);
    let script = "hatchery agent register >/dev/null\nhatchery agent replicate --reason 'one' -- true\nsleep 30";
    let parent = match c.spawn(&[], script) {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    wait_pending(&c, 1);
    let out = c.cli(&["kill", &parent]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Its request could never start a child, and held a place of the queue every worker
    // shares until it timed out.
    let start = std::time::Instant::now();
    let left = loop {
        let out = c.cli(&["approvals", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let n = v.as_array().map_or(usize::MAX, Vec::len);
        if n == 0 || start.elapsed() > Duration::from_secs(20) {
            break n;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(left, 0, "the ended worker's request is still pending");
    assert!(
        c.audit("approval_denied")
            .iter()
            .any(|e| e["details"]["reason"] == "the worker that asked has ended"),
        "{}",
        c.log()
    );
}

/// `hatchery ARGS` run as nobody (a member of the socket's group, 65534) against `c`.
fn as_member(c: &TestController, args: &[&str]) -> std::process::Output {
    let _ = std::fs::set_permissions(
        c.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    );
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(hatchery())
        .arg(args[0])
        .arg("--socket")
        .arg(&c.socket)
        .args(&args[1..]);
    run_with_timeout(&mut cmd, Duration::from_secs(30))
}

#[test]
fn a_member_of_the_socket_group_neither_releases_the_kill_switch_nor_skips_approval() {
    if skip_unless_root("a member's decisions") {
        return;
    }
    let c = TestController::start(
        &contract("require = [{ kind = \"always\" }]"),
        &["--socket-group", "65534"],
    );
    // Before, a member who "may look" released the owner's kill switch, and made with
    // `spawn --parent` exactly the child a person was to decide on.
    let out = c.cli(&["kill-switch"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = as_member(&c, &["kill-switch", "--release"]);
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    assert!(stderr(&out).contains("may not release"), "{}", stderr(&out));
    let refused = c.audit("kill_switch_release_refused");
    assert!(
        refused.iter().any(|e| e["actor"] == "uid:65534"),
        "{refused:?}"
    );
    assert!(c.audit("kill_switch_released").is_empty());
    let out = c.cli(&["spawn", "--", "true"]);
    assert_ne!(code(&out), 0, "the kill switch is still engaged");
    let out = c.cli(&["kill-switch", "--release"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    let parent = match c.spawn(&[], &common::agents::idle(30)) {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    c.wait_audit("worker_registered", LONG);
    let out = as_member(&c, &["spawn", "--parent", &parent, "--", "true"]);
    assert_eq!(code(&out), 3, "{}", stdout(&out));
    assert!(
        stderr(&out).contains("needs a person's approval"),
        "{}",
        stderr(&out)
    );
    let refused = c.audit("approval_refused");
    assert!(
        refused.iter().any(|e| e["actor"] == "uid:65534"),
        "{refused:?}"
    );
    assert!(c.audit("approval_requested").is_empty(), "nothing queued");
    assert_eq!(
        c.audit("replication_requested").len(),
        1,
        "the parent only, nothing started without a decision"
    );
    // The owner's own `spawn --parent` is that person's decision.
    let out = c.cli(&["spawn", "--parent", &parent, "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn an_approval_past_the_deadline_is_refused_whenever_the_reaper_runs() {
    if skip_unless_root("late approval") {
        return;
    }
    let c = TestController::start(
        &contract("timeout_seconds = 3\nrequire = [{ kind = \"always\" }]"),
        &[],
    );
    if let Err(o) = c.spawn(&[], &parent_script()) {
        panic!("{}", stderr(&o));
    }
    let pending = wait_pending(&c, 1);
    let id = pending[0]["approval_id"].as_str().unwrap_or("").to_string();
    let deadline = pending[0]["deadline_ms"].as_u64().unwrap_or(0);
    // Just past the deadline, before the reaper's next tick (every 250 ms) is likely:
    // before, such an approval was granted unless that tick came first.
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    while now() < deadline + 5 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let out = c.cli(&["approve", &id]);
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    assert!(
        stderr(&out).contains("past its deadline"),
        "{}",
        stderr(&out)
    );
    assert!(c.audit("approval_granted").is_empty());
    assert_eq!(c.audit("approval_timeout").len(), 1);
}

#[test]
fn a_request_waiting_when_its_worker_asks_to_shut_down_is_denied_not_started() {
    if skip_unless_root("request before shutdown") {
        return;
    }
    let c = TestController::start(&contract("require = [{ kind = \"always\" }]"), &[]);
    // Before, the owner could approve it in the worker's 5 s of grace, and the child
    // started from a worker that had said it was stopping.
    let script = common::agents::python_agent(
        "print(w.register(), flush=True)\nprint('asked', w.replicate('r', ['true']), flush=True)\nimport time\ntime.sleep(1)\nprint('shutdown', w.shutdown(), flush=True)\nprint('then', w.report('done'), flush=True)",
        "sleep 30",
    );
    let ex = common::agents::examples_dir();
    let parent = match c.spawn(&["--ro", &ex], &script) {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    let pending = wait_pending(&c, 1);
    let id = pending[0]["approval_id"].as_str().unwrap_or("").to_string();
    c.wait_audit("worker_shutdown_requested", LONG);
    let out = c.cli(&["approve", &id]);
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    // Not told: its next call reads its own reply, not a decision it was not waiting for.
    let log = wait_log(&c, &parent, "then");
    assert!(log.contains("then {'type': 'ok'}"), "{log}");
    let denied = c.audit("approval_denied");
    assert!(
        denied.iter().any(|e| e["details"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("shutting down"))),
        "{denied:?}"
    );
    assert!(c.audit("approval_granted").is_empty());
    assert_eq!(c.audit("replication_requested").len(), 1, "the parent only");
}

#[test]
fn a_member_gives_no_child_to_a_worker_that_asked_to_shut_down() {
    if skip_unless_root("a member's child of a stopping worker") {
        return;
    }
    let c = TestController::start(&contract(""), &["--socket-group", "65534"]);
    let script = "hatchery agent register >/dev/null\nhatchery agent shutdown >/dev/null\nsleep 10";
    let parent = match c.spawn(&[], script) {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    c.wait_audit("worker_shutdown_requested", LONG);
    // Before, it started, after the worker's own requests had been refused.
    let out = as_member(&c, &["spawn", "--parent", &parent, "--", "true"]);
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    assert!(
        stderr(&out).contains("asked to shut down"),
        "{}",
        stderr(&out)
    );
    assert_eq!(c.audit("replication_requested").len(), 1, "the parent only");
}

/// The id of the pending request `why` asked for.
fn approval_for(pending: &[Value], why: &str) -> String {
    pending
        .iter()
        .find(|p| p["why"] == why)
        .and_then(|p| p["approval_id"].as_str())
        .unwrap_or_else(|| panic!("no pending request {why:?}: {pending:?}"))
        .to_string()
}

/// What the call after the line starting `marker` printed, and its status line: the two
/// lines after it, notes of decisions passed over left out.
fn next_call_after<'a>(log: &'a str, marker: &str) -> Vec<&'a str> {
    log.lines()
        .skip_while(|l| !l.starts_with(marker))
        .filter(|l| !l.contains("passed over"))
        .skip(1)
        .take(2)
        .collect()
}

#[test]
fn a_decision_whose_call_gave_up_is_never_read_as_another_calls_answer() {
    if skip_unless_root("decisions after their call ended") {
        return;
    }
    // A worker waiting in a call sends no heartbeats: it is reaped if it is thought to
    // wait for nothing.
    let c = TestController::start(
        &contract("require = [{ kind = \"always\" }]"),
        &["--heartbeat-timeout", "2s"],
    );
    // The first call stops waiting (as a worker's own time limit would end it); the
    // second waits for its own decision; a heartbeat follows. Then the same for the
    // Python client: a third call gives up, and once its decision is in the socket, a
    // heartbeat.
    let ex = examples_dir();
    // First of all, a request whose sender never reads the answer (`pending`), as a call
    // killed at once would leave it.
    let unread = "import json, socket, struct; s = socket.socket(fileno=3); \
                  b = json.dumps({'type': 'replicate', 'reason': 'zero', 'command': ['true']}).encode(); \
                  s.sendall(struct.pack('>I', len(b)) + b)";
    let script = format!(
        "hatchery agent register >/dev/null\n\
         python3 -c \"{unread}\"; echo sent-zero\n\
         hatchery agent heartbeat; echo \"zero-answer=$?\"\n\
         timeout 3 hatchery agent replicate --reason one -- true >/dev/null; echo \"gave-up=$?\"\n\
         hatchery agent replicate --reason two -- true; echo \"second=$?\"\n\
         hatchery agent heartbeat; echo \"heartbeat=$?\"\n\
         timeout 3 hatchery agent replicate --reason three -- true >/dev/null; echo \"gave-up-again=$?\"\n\
         python3 -c 'import select; select.select([3], [], [], 50)'\n\
         python3 {ex}/hatchery_agent.py heartbeat; echo \"py-heartbeat=$?\"\n\
         sleep 30"
    );
    let parent = match c.spawn(&["--ro", &ex], &script) {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    let log = wait_log(&c, &parent, "gave-up=");
    assert_eq!(
        next_call_after(&log, "sent-zero"),
        ["{\"type\":\"ok\"}", "zero-answer=0"],
        "the heartbeat took an answer left unread for its own:\n{log}"
    );
    let pending = wait_pending(&c, 3);
    let (one, two) = (approval_for(&pending, "one"), approval_for(&pending, "two"));
    // The decision nobody waits for any more comes first, while `two` is waiting.
    let out = c.cli(&["approve", &one]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Past the heartbeat timeout: `two` still waits, and so does its worker.
    std::thread::sleep(Duration::from_millis(3500));
    // A reason too long for the trail and the worker's frame is refused, and changes
    // nothing.
    let out = c.cli(&["deny", &two, "--reason", &"r".repeat(16 * 1024 + 1)]);
    assert_ne!(code(&out), 0);
    assert!(stderr(&out).contains("longer than"), "{}", stderr(&out));
    let out = c.cli(&["deny", &two, "--reason", "not the second"]);
    assert_eq!(
        code(&out),
        0,
        "`two` no longer waits (was its worker reaped?): {}\n{}",
        stderr(&out),
        log_of(&c, &parent)
    );
    let log = wait_log(&c, &parent, "heartbeat=");
    assert!(
        log.contains("not the second") && log.contains("second=3"),
        "the waiting call took another request's decision for its own:\n{log}"
    );
    assert_eq!(
        next_call_after(&log, "second="),
        ["{\"type\":\"ok\"}", "heartbeat=0"],
        "the heartbeat read something else for its answer:\n{log}"
    );
    assert!(
        log.contains(&format!("passed over the decision on approval {one}")),
        "the decision passed over is not shown:\n{log}"
    );
    wait_log(&c, &parent, "gave-up-again=");
    let three = approval_for(&wait_pending(&c, 1), "three");
    let out = c.cli(&["approve", &three]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let log = wait_log(&c, &parent, "py-heartbeat=");
    assert_eq!(
        next_call_after(&log, "gave-up-again="),
        ["{\"type\": \"ok\"}", "py-heartbeat=0"],
        "the Python client read something else for its answer:\n{log}"
    );
    assert!(
        log.contains(&format!("passed over the decision on approval {three}")),
        "{log}"
    );
}

#[test]
fn calls_from_two_processes_of_a_worker_take_turns() {
    if skip_unless_root("calls at once") {
        return;
    }
    let c = TestController::start(&contract("require = [{ kind = \"always\" }]"), &[]);
    // A request waiting for a person in the background, and a heartbeat meanwhile: both
    // read the one socket, and read at once they split each other's frames.
    let script = "hatchery agent register >/dev/null\n\
                  ( hatchery agent replicate --reason bg -- true >/dev/null; echo \"bg=$?\" ) &\n\
                  sleep 1\n\
                  hatchery agent heartbeat; echo \"fg=$?\"\n\
                  wait\n\
                  hatchery agent heartbeat; echo \"after=$?\"\n\
                  sleep 30";
    let parent = match c.spawn(&[], script) {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    let bg = approval_for(&wait_pending(&c, 1), "bg");
    std::thread::sleep(Duration::from_millis(1500));
    let out = c.cli(&["deny", &bg, "--reason", "not now"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let log = wait_log(&c, &parent, "after=");
    for line in ["bg=3", "fg=0", "after=0"] {
        assert!(log.lines().any(|l| l == line), "no {line}:\n{log}");
    }
    assert_eq!(
        log.matches("{\"type\":\"ok\"}").count(),
        2,
        "each heartbeat read its own answer:\n{log}"
    );
    assert!(
        log.contains("waiting for another call of this worker"),
        "the heartbeat waited without a word:\n{log}"
    );
}
