//! A manifest's executable allowlist and output cap, enforced on workers the controller
//! starts: the launcher narrows the profile and pumps the worker's output into its log.

mod common;

use std::time::Duration;

use common::controller::TestController;
use common::*;

const LONG: Duration = Duration::from_secs(60);

fn contract() -> String {
    "max_depth = 3\nmax_replicas = 64\ncooldown_seconds = 0\nexpiration_seconds = 3600\n".into()
}

fn log_of(c: &TestController, id: &str) -> Vec<u8> {
    std::fs::read(c.state_dir().join("workers").join(format!("{id}.log"))).unwrap_or_default()
}

#[test]
fn a_workers_capped_log_holds_exactly_the_cap_and_the_exit_is_audited() {
    if skip_unless_root("a_workers_capped_log_holds_exactly_the_cap_and_the_exit_is_audited") {
        return;
    }
    let c = TestController::start(&contract(), &[]);
    let id = match c.spawn(&["--max-output", "100"], "yes") {
        Ok(id) => id,
        Err(out) => panic!("{} {}", stdout(&out), stderr(&out)),
    };
    let exits = c.wait_audit("worker_exited", LONG);
    assert_eq!(log_of(&c, &id).len(), 100);
    assert_eq!(exits[0]["details"]["output_bytes"], 100, "{exits:?}");
    assert_eq!(exits[0]["details"]["output_truncated"], true, "{exits:?}");
}

#[test]
fn a_worker_runs_only_its_allowlist_and_the_client_still_works() {
    if skip_unless_root("a_worker_runs_only_its_allowlist_and_the_client_still_works") {
        return;
    }
    let c = TestController::start(&contract(), &[]);
    let id = match c.spawn(
        &["--allow-exec", "/usr/bin/dash"],
        "hatchery agent register >/dev/null; echo registered=$?; /usr/bin/id; echo id=$?",
    ) {
        Ok(id) => id,
        Err(out) => panic!("{} {}", stdout(&out), stderr(&out)),
    };
    c.wait_audit("worker_exited", LONG);
    let log = String::from_utf8_lossy(&log_of(&c, &id)).into_owned();
    assert!(log.contains("registered=0"), "{log}");
    assert!(
        log.contains("Permission denied") && log.contains("id=126"),
        "{log}"
    );
}
