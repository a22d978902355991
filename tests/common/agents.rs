//! Workers for controller tests: contracts, scripts that speak the protocol (through
//! `hatchery agent` or by hand, in Python), and waiting for them.

use std::time::Duration;

use serde_json::Value;

use super::controller::TestController;
use super::{skip_unless_root, stderr, stdout};

pub const LONG: Duration = Duration::from_secs(60);

pub fn base_contract(extra: &str) -> String {
    format!(
        "max_depth = 3\nmax_replicas = 64\ncooldown_seconds = 0\nexpiration_seconds = 3600\n{extra}"
    )
}

/// `--ro` of the examples directory, so workers can run the Python client.
pub fn examples_dir() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .to_string_lossy()
        .to_string()
}

/// A worker script that runs `body` in Python with `w`, a connected
/// `examples/hatchery_agent.Worker`, then the shell line `then`. The worker needs
/// `--ro` of [`examples_dir`].
pub fn python_agent(body: &str, then: &str) -> String {
    let ex = examples_dir();
    format!(
        "python3 - <<'EOF'\nimport json, struct, sys\nsys.path.insert(0, '{ex}')\nfrom hatchery_agent import Worker\nw = Worker()\n{body}\nEOF\n{then}"
    )
}

/// A worker script that registers and then just lives for `secs`.
pub fn idle(secs: u32) -> String {
    format!("hatchery agent register >/dev/null || exit 9; sleep {secs}")
}

/// A worker script that heartbeats every 200 ms for `secs`.
pub fn alive(secs: u32) -> String {
    format!(
        "hatchery agent register >/dev/null || exit 9; i=0; while [ $i -lt {} ]; do hatchery agent heartbeat >/dev/null; sleep 0.2; i=$((i+1)); done",
        secs * 5
    )
}

pub fn skip(test: &str) -> bool {
    skip_unless_root(test)
}

pub fn spawned(c: &TestController, flags: &[&str], script: &str) -> String {
    match c.spawn(flags, script) {
        Ok(id) => id,
        Err(out) => panic!(
            "spawn failed: {} {}\n{}",
            stdout(&out),
            stderr(&out),
            c.log()
        ),
    }
}

pub fn wait_running(c: &TestController, n: usize) -> Value {
    c.wait_for(&format!("{n} running workers"), LONG, |v| {
        TestController::count(v, "running") >= n
    })
}
