//! A controller started for one test: its own socket, state directory and contract; killed
//! (and checked for leftovers) when the test ends.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{hatchery, run_with_timeout};

pub struct TestController {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub state: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
    /// What the controller is started under (`ip netns exec NS`), if anything.
    wrapper: Vec<String>,
}

impl TestController {
    /// Starts a controller with `contract` (TOML) and extra flags.
    pub fn start(contract: &str, extra: &[&str]) -> TestController {
        TestController::start_in(contract, None, extra)
    }

    /// Starts a controller whose state directory is `state` (default: in its own
    /// temporary directory).
    pub fn start_in(contract: &str, state: Option<&Path>, extra: &[&str]) -> TestController {
        TestController::start_under(&[], contract, state, extra)
    }

    /// Starts a controller under `wrapper` (a command that execs the rest, such as
    /// `ip netns exec NS`).
    pub fn start_under(
        wrapper: &[&str],
        contract: &str,
        state: Option<&Path>,
        extra: &[&str],
    ) -> TestController {
        let dir = match tempfile::Builder::new().prefix("hatchery-ctl-").tempdir() {
            Ok(d) => d,
            Err(e) => panic!("tempdir: {e}"),
        };
        let socket = dir.path().join("c.sock");
        let state = state.map_or_else(|| dir.path().join("state"), Path::to_path_buf);
        let contract_path = dir.path().join("contract.toml");
        if let Err(e) = std::fs::write(&contract_path, contract) {
            panic!("write contract: {e}");
        }
        let mut c = TestController {
            dir,
            socket,
            state,
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            wrapper: wrapper.iter().map(|s| s.to_string()).collect(),
        };
        c.launch();
        c
    }

    fn launch(&mut self) {
        let contract = self.dir.path().join("contract.toml");
        let log = match std::fs::File::create(self.dir.path().join("controller.log")) {
            Ok(f) => f,
            Err(e) => panic!("log: {e}"),
        };
        let err = match log.try_clone() {
            Ok(f) => f,
            Err(e) => panic!("log: {e}"),
        };
        let mut cmd = match self.wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(hatchery());
                c
            }
            None => Command::new(hatchery()),
        };
        let child = cmd
            .arg("controller")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--contract")
            .arg(&contract)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => panic!("start the controller: {e}"),
        };
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            // Up once it answers through its engine: the socket accepts a little earlier,
            // before the controller handles SIGTERM (a stop then would cut its start short).
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
                && self.cli(&["ps", "--json"]).status.success()
            {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("the controller exited with {status}: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the controller did not come up: {}", self.log());
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("controller.log")).unwrap_or_default()
    }

    /// `hatchery ARGS --socket S` (the socket flag goes after the subcommand).
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_at_width(args, None)
    }

    /// [`TestController::cli`] for a screen `columns` wide (`COLUMNS`); with `None`, the
    /// output is read as the program writes it into a pipe, whatever the width of the
    /// terminal the tests were started from.
    pub fn cli_at_width(&self, args: &[&str], columns: Option<&str>) -> Output {
        let mut cmd = Command::new(hatchery());
        cmd.arg(args[0])
            .arg("--socket")
            .arg(&self.socket)
            .args(&args[1..]);
        match columns {
            Some(c) => cmd.env("COLUMNS", c),
            None => cmd.env_remove("COLUMNS"),
        };
        run_with_timeout(&mut cmd, Duration::from_secs(90))
    }

    /// Spawns a root worker running `script` with `sh -c`; returns its id.
    pub fn spawn(&self, flags: &[&str], script: &str) -> Result<String, Output> {
        let mut args = vec!["spawn"];
        args.extend_from_slice(flags);
        args.extend(["--", "sh", "-c", script]);
        let out = self.cli(&args);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(out)
        }
    }

    pub fn ps(&self) -> Value {
        let out = self.cli(&["ps", "--json"]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    pub fn worker(&self, id: &str) -> Value {
        self.ps()["workers"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["worker_id"] == id).cloned())
            .unwrap_or(Value::Null)
    }

    /// Waits until `pred` holds for the `ps --json` document (or panics after `limit`).
    pub fn wait_for(&self, what: &str, limit: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let v = self.ps();
            if pred(&v) {
                return v;
            }
            if start.elapsed() > limit {
                panic!(
                    "timed out waiting for {what}: {v}\ncontroller log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Workers in a state.
    pub fn count(v: &Value, state: &str) -> usize {
        v["workers"]
            .as_array()
            .map(|ws| ws.iter().filter(|w| w["state"] == state).count())
            .unwrap_or(0)
    }

    /// Audit entries with this event name.
    pub fn audit(&self, event: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(self.state.join("audit.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == event)
            .collect()
    }

    /// Waits for an audit entry with this event name.
    pub fn wait_audit(&self, event: &str, limit: Duration) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let found = self.audit(event);
            if !found.is_empty() {
                return found;
            }
            if start.elapsed() > limit {
                panic!(
                    "no {event} in the audit trail after {limit:?}:\n{}",
                    std::fs::read_to_string(self.state.join("audit.jsonl")).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs the controller (as a crash would).
    pub fn crash(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the controller again on the same socket and state.
    pub fn restart(&mut self) {
        self.crash();
        self.launch();
    }

    /// Starts the controller again on the same socket and state with other extra flags.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.crash();
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.launch();
    }

    /// Runs a controller on this socket and state (none may be running) with `extra`
    /// flags, expecting it to refuse to start: its output once it has exited. One that
    /// comes up instead is killed when `limit` runs out, failing the test.
    pub fn refused_start(&self, extra: &[&str], limit: Duration) -> Output {
        let mut cmd = Command::new(hatchery());
        cmd.arg("controller")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--contract")
            .arg(self.dir.path().join("contract.toml"))
            .args(extra);
        run_with_timeout(&mut cmd, limit)
    }

    /// Stops the controller with SIGTERM and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(20) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
            panic!("the controller did not stop on SIGTERM: {}", self.log());
        }
    }

    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// The controller's launcher (its child named `hatchery-launcher`).
    pub fn launcher_pid(&self) -> u32 {
        let pid = self.pid();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .find(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.starts_with(b"hatchery-launcher"))
            })
            .unwrap_or_else(|| panic!("no launcher under the controller {pid}"))
    }

    /// The hatchery cgroup directories the launcher holds open, and how many it may: on
    /// cgroup v2 one for each of `sandboxes` (`clone3` into it), on v1 none.
    pub fn launcher_cgroup_fds(&self, sandboxes: usize) -> (Vec<String>, usize) {
        let launcher = self.launcher_pid();
        let held = std::fs::read_dir(format!("/proc/{launcher}/fd"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| std::fs::read_link(e.path()).ok())
                    .map(|t| t.to_string_lossy().into_owned())
                    .filter(|t| t.starts_with("/sys/fs/cgroup/") && t.contains("/hatchery-"))
                    .collect()
            })
            .unwrap_or_default();
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        (held, if v2 { sandboxes } else { 0 })
    }

    /// The cgroup directories (every hierarchy's) of this controller's prepared sandboxes
    /// (its warm pool).
    pub fn prepared_cgroups(&self) -> Vec<PathBuf> {
        let owner = format!("-{}-", self.launcher_pid());
        worker_cgroups("_warm")
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(&owner))
            .collect()
    }

    /// The processes in this controller's prepared sandboxes (and in workers that claimed
    /// one).
    pub fn prepared_pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .prepared_cgroups()
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| {
                s.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// How many sandboxes are prepared (one name per sandbox, whatever the hierarchies).
    pub fn prepared(&self) -> usize {
        let mut names: Vec<String> = self
            .prepared_cgroups()
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().to_string()))
            .collect();
        names.sort();
        names.dedup();
        names.len()
    }

    pub fn wait_prepared(&self, n: usize, limit: Duration) {
        let start = Instant::now();
        while self.prepared() != n {
            if start.elapsed() > limit {
                panic!(
                    "{} prepared sandboxes, not {n}, after {limit:?}\n{}",
                    self.prepared(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The details of worker `id`'s `worker_started` audit entry (waits for it).
    pub fn started_details(&self, id: &str) -> Value {
        let start = Instant::now();
        loop {
            if let Some(e) = self
                .audit("worker_started")
                .into_iter()
                .find(|e| e["worker_id"] == id)
            {
                return e["details"].clone();
            }
            if start.elapsed() > Duration::from_secs(20) {
                panic!("{id} did not start: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TestController {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
    }
}

/// The cgroup directories of hatchery workers whose names contain `needle`.
pub fn worker_cgroups(needle: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with("hatchery-") && name.contains(needle) {
                out.push(e.path());
            } else if dir.components().count() < 8 {
                stack.push(e.path());
            }
        }
    }
    out
}
