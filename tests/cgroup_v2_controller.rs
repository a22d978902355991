//! The controller on a cgroup v2 host: its workers' limits are v2 limits, and the kill
//! switch removes every worker's process and cgroup. Runs in the VM (`scripts/vm-test.sh`);
//! elsewhere it prints `SKIP` and returns, unless `HATCHERY_EXPECT_CGROUP_V2=1`.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::controller::{TestController, worker_cgroups};
use common::*;

fn skip_without_v2(test: &str) -> bool {
    let controllers =
        std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    let v2 = is_root()
        && ["memory", "cpu", "pids"]
            .iter()
            .all(|c| controllers.split_whitespace().any(|o| o == *c));
    if v2 {
        return false;
    }
    if std::env::var("HATCHERY_EXPECT_CGROUP_V2").as_deref() == Ok("1") {
        panic!(
            "{test}: HATCHERY_EXPECT_CGROUP_V2=1 but this is not a cgroup v2 root with memory, cpu and pids"
        );
    }
    let _ = writeln!(
        std::io::stderr(),
        "SKIP {test}: needs root on a cgroup v2 host"
    );
    true
}

#[test]
fn the_controllers_kill_switch_removes_every_worker_and_its_v2_cgroup() {
    if skip_without_v2("controller kill switch on v2") {
        return;
    }
    let c = TestController::start(
        "max_depth = 2\nmax_replicas = 20\ncooldown_seconds = 0\nexpiration_seconds = 3600\n",
        &["--register-timeout", "300s", "--heartbeat-timeout", "300s"],
    );
    let marker = format!("v2-ks-{}", std::process::id());
    let mut ids = Vec::new();
    for _ in 0..6 {
        match c.spawn(
            &["--memory", "64M", "--cpus", "0.2", "--pids", "16"],
            &format!("hatchery agent register >/dev/null; sleep 600; : {marker}"),
        ) {
            Ok(id) => ids.push(id),
            Err(out) => panic!("spawn: {} {}", stdout(&out), stderr(&out)),
        }
    }
    c.wait_for("six registered workers", Duration::from_secs(240), |v| {
        TestController::count(v, "running") >= 6
    });
    for id in &ids {
        let cgs = worker_cgroups(id);
        assert_eq!(cgs.len(), 1, "one v2 cgroup per worker: {cgs:?}");
        let max = std::fs::read_to_string(cgs[0].join("memory.max")).unwrap_or_default();
        assert_eq!(
            max.trim(),
            (64u64 << 20).to_string(),
            "the worker's memory limit is a v2 limit"
        );
        assert_eq!(
            std::fs::read_to_string(cgs[0].join("pids.max"))
                .unwrap_or_default()
                .trim(),
            "16"
        );
    }
    let out = c.cli(&["kill-switch"]);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    let ps = run_with_timeout(
        Command::new("pgrep").args(["-f", &marker]),
        Duration::from_secs(30),
    );
    assert_ne!(code(&ps), 0, "worker processes survived: {}", stdout(&ps));
    for id in &ids {
        assert!(worker_cgroups(id).is_empty(), "the cgroup of {id} survived");
    }
    let out = c.cli(&["spawn", "--", "true"]);
    assert_eq!(code(&out), 3, "new workers are refused: {}", stderr(&out));
    assert!(Path::new(&c.socket).exists());
}

#[test]
fn a_prepared_sandbox_is_born_in_its_v2_cgroup_and_its_worker_keeps_the_limits_and_leaves_nothing()
{
    if skip_without_v2("warm pool on v2") {
        return;
    }
    let c = TestController::start(
        "max_depth = 2\nmax_replicas = 20\ncooldown_seconds = 0\nexpiration_seconds = 3600\n",
        &[
            "--register-timeout",
            "300s",
            "--heartbeat-timeout",
            "300s",
            "--warm-pool",
            "1",
        ],
    );
    let limits = ["--memory", "64M", "--cpus", "0.2", "--pids", "16"];
    if let Err(out) = c.spawn(&limits, "true") {
        panic!("spawn: {} {}", stdout(&out), stderr(&out));
    }
    c.wait_prepared(1, Duration::from_secs(240));
    let id = match c.spawn(&limits, "cat /proc/self/cgroup; sleep 600") {
        Ok(id) => id,
        Err(out) => panic!("spawn: {} {}", stdout(&out), stderr(&out)),
    };
    let details = c.started_details(&id);
    assert_eq!(details["prepared_ahead"], true, "{details}");
    let cgroup = Path::new(details["cgroup"].as_str().unwrap_or_default()).to_path_buf();
    let read = |f: &str| {
        std::fs::read_to_string(cgroup.join(f))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert_eq!(read("memory.max"), (64u64 << 20).to_string());
    assert_eq!(read("pids.max"), "16");
    assert!(
        !read("cgroup.procs").is_empty(),
        "the worker's processes are in its prepared cgroup"
    );
    let out = c.cli(&["kill-switch"]);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    c.wait_prepared(0, Duration::from_secs(60));
    assert!(!cgroup.exists(), "{} survived", cgroup.display());
}
