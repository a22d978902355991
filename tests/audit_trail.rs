//! Attacks on the audit trail by someone who can write the controller's state directory:
//! wiping the trail, and rolling it back to an older copy.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::controller::TestController;
use common::*;
use serde_json::Value;

const LONG: Duration = Duration::from_secs(60);
const CONTRACT: &str =
    "max_depth = 3\nmax_replicas = 64\ncooldown_seconds = 0\nexpiration_seconds = 3600\n";

fn verify(state: &Path, extra: &[&str]) -> Output {
    run_with_timeout(
        Command::new(hatchery())
            .args(["audit", "verify", "--state-dir"])
            .arg(state)
            .args(extra),
        Duration::from_secs(30),
    )
}

/// Entries of the trail in `state`, as stored.
fn entries(state: &Path) -> Vec<Value> {
    std::fs::read_to_string(state.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Spawns `true` as a root worker and waits until its exit is in the trail.
fn spawn_true(c: &TestController) {
    let before = c.audit("worker_exited").len();
    let out = c.cli(&["spawn", "--", "true"]);
    assert_eq!(code(&out), 0, "{} {}", stderr(&out), c.log());
    let start = std::time::Instant::now();
    while c.audit("worker_exited").len() <= before {
        assert!(start.elapsed() < LONG, "no worker_exited: {}", c.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_wiped_trail_passes_for_a_new_one() {
    if skip_unless_root("wiped trail") {
        return;
    }
    let mut c = TestController::start(CONTRACT, &[]);
    spawn_true(&c);
    c.stop();
    let state = c.state_dir().to_path_buf();
    assert!(entries(&state).len() >= 4);
    let _ = std::fs::write(state.join("audit.jsonl"), "");
    let _ = std::fs::remove_file(state.join("audit.head"));

    let out = verify(&state, &[]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert!(
        stdout(&out).contains("intact: 0 entries"),
        "{}",
        stdout(&out)
    );
    c.restart();
    let started = c.wait_audit("controller_started", LONG);
    assert_eq!(started[0]["seq"], 1, "the new controller starts at seq 1");
}

#[test]
fn a_rolled_back_trail_verifies() {
    if skip_unless_root("rolled back trail") {
        return;
    }
    let mut c = TestController::start(CONTRACT, &[]);
    spawn_true(&c);
    c.stop();
    let state = c.state_dir().to_path_buf();
    let old_log = std::fs::read(state.join("audit.jsonl")).unwrap_or_default();
    let old_head = std::fs::read(state.join("audit.head")).unwrap_or_default();
    c.restart();
    spawn_true(&c);
    c.stop();
    let newer = entries(&state).len();
    let _ = std::fs::write(state.join("audit.jsonl"), &old_log);
    let _ = std::fs::write(state.join("audit.head"), &old_head);
    assert!(entries(&state).len() < newer);
    let out = verify(&state, &[]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
}
