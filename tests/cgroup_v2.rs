//! The cgroup v2 backend under a real cgroup v2 kernel: limits, accounting, `cgroup.kill`
//! cleanup, and where the supervisor puts sandboxes in each layout a host has (the root
//! cgroup; alone in a service's cgroup; sharing a cgroup; a subtree delegated to an
//! unprivileged user).
//!
//! These tests need root on a pure cgroup v2 host with the memory, cpu and pids
//! controllers. `scripts/vm-test.sh` runs them in a VM on Debian's 6.1 and 6.12 kernels.
//! Elsewhere they print `SKIP <test>: <reason>` and return, except when
//! `HATCHERY_EXPECT_CGROUP_V2=1` says that v2 must be there: then a missing v2 fails them.
//!
//! Every sandbox start costs about 30 times the host's under the VM's emulated CPU, so each
//! test starts as few sandboxes as its claim needs, and checks what it can along the way.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use hatchery::sandbox::cgroup::{self, CgroupVersion, Limits};
use serde_json::Value;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const NOBODY: u32 = 65534;
/// Generous: a sandbox start under TCG takes a second or more.
const RUN_LIMIT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// Skipping, and the cgroups the tests make.

/// Why this host cannot run the v2 tests, if it cannot.
fn v2_missing() -> Option<String> {
    if !is_root() {
        return Some("needs root".into());
    }
    let controllers = std::fs::read_to_string(Path::new(CGROUP_ROOT).join("cgroup.controllers"))
        .unwrap_or_default();
    let missing: Vec<&str> = ["memory", "cpu", "pids"]
        .into_iter()
        .filter(|c| !controllers.split_whitespace().any(|o| o == *c))
        .collect();
    if !missing.is_empty() {
        return Some(format!(
            "{CGROUP_ROOT} is not a cgroup v2 root offering memory, cpu and pids (missing: {})",
            missing.join(", ")
        ));
    }
    match cgroup::detect() {
        Ok(Some(m)) if m.version() == CgroupVersion::V2 => None,
        Ok(Some(m)) => Some(format!(
            "hatchery picks the cgroup {} backend here",
            m.version()
        )),
        Ok(None) => Some("hatchery finds no cgroup backend here".into()),
        Err(e) => Some(format!("cgroup detection failed: {e}")),
    }
}

/// True (after printing why) when the test cannot run here; panics instead when
/// `HATCHERY_EXPECT_CGROUP_V2=1` says it must.
fn skip_without_v2(test: &str) -> bool {
    let Some(why) = v2_missing() else {
        return false;
    };
    if std::env::var("HATCHERY_EXPECT_CGROUP_V2").as_deref() == Ok("1") {
        panic!("{test}: HATCHERY_EXPECT_CGROUP_V2=1 but {why}");
    }
    // Straight to the process's stderr, past the test harness's capture: a skip is seen.
    let _ = writeln!(std::io::stderr(), "SKIP {test}: {why}");
    true
}

/// A cgroup a test makes directly under the root, named like hatchery's own
/// (`hatchery-<kind>-<pid>-<start>`) so that a leftover is found by every leftover check.
/// Dropping it kills what is inside and removes it with everything below.
struct TestCgroup {
    dir: PathBuf,
}

impl TestCgroup {
    fn new(kind: &str) -> TestCgroup {
        let dir = Path::new(CGROUP_ROOT).join(cgroup::unique_name(kind));
        if let Err(e) = std::fs::create_dir(&dir) {
            panic!("cannot create {}: {e}", dir.display());
        }
        TestCgroup { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name)).unwrap_or_default()
    }

    fn procs(&self) -> Vec<i32> {
        pids_of(&self.dir)
    }

    /// The names of the cgroups directly below.
    fn children(&self) -> Vec<String> {
        child_cgroups(&self.dir)
    }

    /// Hands the cgroup to `uid` the way systemd delegates a subtree: the directory and the
    /// files a delegate writes.
    fn delegate_to(&self, uid: u32) {
        for p in [
            self.dir.clone(),
            self.file("cgroup.procs"),
            self.file("cgroup.threads"),
            self.file("cgroup.subtree_control"),
        ] {
            if let Err(e) = std::os::unix::fs::chown(&p, Some(uid), Some(uid)) {
                panic!("chown {}: {e}", p.display());
            }
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        remove_cgroup_tree(&self.dir);
    }
}

fn pids_of(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn child_cgroups(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn remove_cgroup_tree(dir: &Path) {
    for child in child_cgroups(dir) {
        remove_cgroup_tree(&dir.join(child));
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The words of a space-separated cgroup file such as `cgroup.subtree_control`.
fn words(text: &str) -> Vec<&str> {
    text.split_whitespace().collect()
}

// ---------------------------------------------------------------------------------------
// Starting `hatchery run` in a chosen cgroup, as root or as nobody.

/// `hatchery run ARGS...`, started as the only process of cgroup `cg` (a shell moves itself
/// there, then becomes hatchery), optionally as uid `nobody`.
fn run_in_cgroup(cg: &Path, as_nobody: bool, args: &[&str]) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
        .arg(cg);
    if as_nobody {
        let id = NOBODY.to_string();
        cmd.args([
            "setpriv",
            "--reuid",
            &id,
            "--regid",
            &id,
            "--clear-groups",
            "--",
        ]);
    }
    cmd.arg(hatchery()).arg("run").args(args);
    cmd
}

/// `hatchery run FLAGS --report R --ro PROBE_DIR -- probe ARGS` in the root cgroup, where a
/// supervisor started by root at boot or in a container sits. Returns (exit status, report,
/// output).
fn probe_in_root_cgroup(flags: &[&str], probe_args: &[&str]) -> (i32, Value, Output) {
    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    let probe_dir = probe_dir();
    let probe = probe();
    let mut args: Vec<&str> = flags.to_vec();
    let r = report.to_string_lossy().to_string();
    let pd = probe_dir.to_string_lossy().to_string();
    let p = probe.to_string_lossy().to_string();
    args.extend(["--report", &r, "--ro", &pd, "--", &p]);
    args.extend(probe_args);
    let out = run_with_timeout(
        &mut run_in_cgroup(Path::new(CGROUP_ROOT), false, &args),
        RUN_LIMIT,
    );
    (code(&out), read_report(&report, &out), out)
}

fn read_report(path: &Path, out: &Output) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "no report at {} ({e}); exit {}, stderr: {}",
            path.display(),
            code(out),
            stderr(out)
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("report is not JSON: {e}: {text}"))
}

/// The sandbox's cgroup from the report; it must be a v2 cgroup directly below `base`,
/// and gone now that `run` has returned.
fn assert_cgroup_below_and_gone(report: &Value, base: &Path) {
    let e = &report["enforcement"];
    assert_eq!(e["cgroup"], "v2", "{e}");
    let Some(path) = e["cgroup_path"].as_str().map(PathBuf::from) else {
        panic!("no cgroup_path in the report: {e}");
    };
    assert_eq!(
        path.parent(),
        Some(base),
        "the sandbox's cgroup {} is not directly below {}",
        path.display(),
        base.display()
    );
    assert!(
        path.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(cgroup::NAME_PREFIX)),
        "{}",
        path.display()
    );
    assert!(!path.exists(), "cgroup {} was left behind", path.display());
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// Waits for a child, killing it (and failing) past `limit`.
fn finish(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                panic!(
                    "did not finish within {limit:?}: {:?}",
                    child.wait_with_output()
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("wait: {e}"),
        }
    }
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("collect output: {e}"))
}

/// Waits until `path` exists; fails the test (after killing `child`) past `limit`.
fn wait_for_file(path: &Path, child: &mut Child, limit: Duration) {
    let start = Instant::now();
    while !path.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            let out = child.stderr.take().map(std::io::read_to_string);
            panic!(
                "exited ({status}) before {} appeared: {out:?}",
                path.display()
            );
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{} did not appear within {limit:?}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A payload that says it started, then waits for a go-ahead file before it eats 256 MiB:
/// the test looks at the cgroups while the sandbox runs, then lets the OOM killer end it.
fn started_then_memhog(dir: &Path) -> String {
    format!(
        "touch {d}/started; while [ ! -e {d}/go ]; do sleep 0.05; done; exec {p} memhog 256",
        d = dir.display(),
        p = probe().display()
    )
}

fn assert_oom_killed(code: i32, report: &Value, limit: u64) {
    assert_eq!(code, 137, "{report}");
    assert_eq!(report["oom_killed"], true, "{report}");
    assert_eq!(report["signal"], libc::SIGKILL, "{report}");
    let peak = report["memory_peak_bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(peak <= limit, "memory peak {peak} above the {limit} limit");
}

// ---------------------------------------------------------------------------------------
// Limits and accounting, with the supervisor in the root cgroup.

#[test]
fn memory_limit_oom_kills_the_sandbox_with_137() {
    if skip_without_v2("memory_limit_oom_kills_the_sandbox_with_137") {
        return;
    }
    let (code, report, _) = probe_in_root_cgroup(&["--memory", "64M"], &["memhog", "256"]);
    assert_oom_killed(code, &report, 64 << 20);
    let how = report["enforcement"]["limits"]["memory"]
        .as_str()
        .unwrap_or("");
    assert!(how.contains("memory.max"), "{how}");
    assert_cgroup_below_and_gone(&report, Path::new(CGROUP_ROOT));
}

#[test]
fn pids_limit_stops_a_fork_bomb() {
    if skip_without_v2("pids_limit_stops_a_fork_bomb") {
        return;
    }
    let (code, report, out) = probe_in_root_cgroup(&["--pids", "16"], &["forkbomb", "300", "300"]);
    let line = stdout(&out);
    assert_eq!(code, 0, "{line} {report}");
    let forked: u32 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u32::MAX);
    assert!(forked < 16, "{forked} processes forked under --pids 16");
    assert!(
        line.ends_with(&format!("err {}", libc::EAGAIN)),
        "fork fails with EAGAIN: {line}"
    );
    assert!(
        report["pids_limit_hits"].as_u64().unwrap_or(0) > 0,
        "pids.events max counted the refusals: {report}"
    );
    assert_cgroup_below_and_gone(&report, Path::new(CGROUP_ROOT));
}

#[test]
fn cpu_quota_holds_a_spinner_to_its_share() {
    if skip_without_v2("cpu_quota_holds_a_spinner_to_its_share") {
        return;
    }
    let (code, report, _) = probe_in_root_cgroup(&["--cpus", "0.5"], &["spin", "3"]);
    assert_eq!(code, 0, "{report}");
    let how = report["enforcement"]["limits"]["cpus"]
        .as_str()
        .unwrap_or("");
    assert!(how.contains("cpu.max"), "{how}");
    let cpu = report["cpu_usec"].as_f64().unwrap_or(0.0);
    let wall = report["wall_ms"].as_f64().unwrap_or(f64::MAX) * 1000.0;
    let share = cpu / wall;
    // CFS hands out 50 ms per 100 ms period. Over 3 s of spinning the share is close to 0.5;
    // the sandbox's own setup (in the same cgroup, counted in the wall time) pulls it lower
    // under an emulated CPU, never higher.
    assert!(
        (0.15..=0.62).contains(&share),
        "used {share:.2} of a core under --cpus 0.5: {report}"
    );
    assert_cgroup_below_and_gone(&report, Path::new(CGROUP_ROOT));
}

#[test]
fn report_names_v2_and_fills_the_accounting_keys() {
    if skip_without_v2("report_names_v2_and_fills_the_accounting_keys") {
        return;
    }
    let (code, report, _) = probe_in_root_cgroup(
        &["--memory", "128M", "--pids", "64", "--cpus", "1"],
        &["memhog", "16"],
    );
    assert_eq!(code, 0, "{report}");
    let e = &report["enforcement"];
    for limit in ["memory", "cpus", "pids"] {
        let how = e["limits"][limit].as_str().unwrap_or("");
        assert!(how.starts_with("cgroup v2"), "{limit}: {e}");
    }
    let cpu = report["cpu_usec"].as_u64().unwrap_or(0);
    assert!(cpu > 0, "cpu_usec from cpu.stat: {report}");
    let peak = report["memory_peak_bytes"].as_u64().unwrap_or(0);
    assert!(
        peak >= 16 << 20,
        "memory.peak counts the 16 MiB touched: {report}"
    );
    assert_eq!(report["oom_killed"], false);
    assert_eq!(report["pids_limit_hits"], 0);
    // The report has pids_peak where the kernel keeps pids.peak (Debian's 6.1 and 6.12 do;
    // upstream added it later), else the key is there and null.
    let path = e["cgroup_path"].as_str().unwrap_or("");
    let has_pids_peak = TestCgroup::new("test-files").file("pids.peak").exists();
    let pids_peak = report.get("pids_peak");
    assert!(pids_peak.is_some(), "pids_peak key: {report}");
    if has_pids_peak {
        assert!(
            pids_peak.and_then(Value::as_u64).is_some_and(|p| p >= 1),
            "pids_peak from pids.peak: {report}"
        );
    } else {
        assert_eq!(pids_peak, Some(&Value::Null), "{report}");
    }
    assert_eq!(
        e["not_enforced"].as_array().map(|a| a
            .iter()
            .filter(|x| !x.as_str().unwrap_or("").starts_with("landlock"))
            .filter(|x| !is_expected_idmap_note(x.as_str().unwrap_or("")))
            .count()),
        Some(0),
        "only Landlock may be partial here: {e}"
    );
    assert!(!path.is_empty(), "{e}");
    assert_cgroup_below_and_gone(&report, Path::new(CGROUP_ROOT));
}

#[test]
fn landlock_is_fully_enforced_from_abi_6_and_visibly_partial_below() {
    if skip_without_v2("landlock_is_fully_enforced_from_abi_6_and_visibly_partial_below") {
        return;
    }
    let Some(abi) = hatchery::sandbox::landlock::kernel_abi() else {
        panic!("this kernel has no Landlock; the VM kernels (6.1, 6.12) have it built in");
    };
    let (code, report, _) = probe_in_root_cgroup(&[], &["syscall", "getpid"]);
    assert_eq!(code, 0, "{report}");
    let e = &report["enforcement"];
    assert_eq!(e["landlock_abi"], abi, "{e}");
    let notes: Vec<&str> = e["not_enforced"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let landlock_notes: Vec<&&str> = notes.iter().filter(|n| n.starts_with("landlock")).collect();
    if abi >= 6 {
        // hatchery asks for the rights of ABI 6 (TCP, truncate, device ioctls, scoping).
        assert_eq!(e["landlock"], "fully_enforced", "ABI {abi}: {e}");
        assert!(landlock_notes.is_empty(), "ABI {abi}: {e}");
    } else {
        assert_eq!(e["landlock"], "partially_enforced", "ABI {abi}: {e}");
        assert_eq!(landlock_notes.len(), 1, "ABI {abi}: {e}");
        assert!(
            landlock_notes[0].contains(&format!("ABI {abi}")),
            "the report names the kernel's ABI: {e}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Cleanup: cgroup.kill takes every process of a sandbox, nothing is left.

#[test]
fn cgroup_kill_empties_a_cgroup_of_many_processes() {
    if skip_without_v2("cgroup_kill_empties_a_cgroup_of_many_processes") {
        return;
    }
    let manager = match cgroup::detect() {
        Ok(Some(m)) => m,
        other => panic!("no cgroup backend: {:?}", other.err()),
    };
    let name = cgroup::unique_name("test-kill");
    let limits = Limits {
        pids: Some(64),
        ..Limits::default()
    };
    let mut cg = manager
        .create(&name, &limits)
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    assert!(
        cg.path().join("cgroup.kill").exists(),
        "cgroup.kill (Linux 5.14+) in {}",
        cg.path().display()
    );
    // A shell that, once inside the cgroup, starts 12 sleepers and one that forks on.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("read go; for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 300 & done; (while :; do sleep 300 & sleep 1; done) & wait")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    cg.attach(child.id() as i32)
        .unwrap_or_else(|e| panic!("attach: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"go\n");
    }
    let start = Instant::now();
    while pids_of(cg.path()).len() < 14 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the processes did not start: {:?}",
            pids_of(cg.path())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let inside = pids_of(cg.path());
    cg.kill_all().unwrap_or_else(|e| panic!("kill_all: {e}"));
    assert!(
        cg.is_empty(),
        "populated after kill_all: {:?}",
        pids_of(cg.path())
    );
    let status = child.wait().unwrap_or_else(|e| panic!("wait: {e}"));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL),
        "{status}"
    );
    for pid in inside {
        // Reaped by init (they were reparented) or by us: none may still run.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let alive = state
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|s| s != "Z" && s != "X");
        assert!(!alive, "process {pid} survived cgroup.kill: {state}");
    }
    let path = cg.path().to_path_buf();
    cg.destroy().unwrap_or_else(|e| panic!("destroy: {e}"));
    assert!(!path.exists(), "{} was not removed", path.display());
    manager.release();
}

#[test]
fn timeout_kills_a_sandbox_of_many_processes_and_leaves_nothing() {
    if skip_without_v2("timeout_kills_a_sandbox_of_many_processes_and_leaves_nothing") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    // 16 sleepers, a double-forked daemon (it leaves pid 1's process tree), then the shell
    // sleeps too. Their odd durations tell them from anything else on the machine.
    let script = format!(
        "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do sleep 3017 & done; \
         {probe} daemon {d}/daemon.pid 3019 >/dev/null; touch {d}/ready; exec sleep 3018",
        probe = probe().display(),
        d = d.display()
    );
    let report = d.join("report.json");
    let (r, ds, pd) = (
        report.to_string_lossy().to_string(),
        d.to_string_lossy().to_string(),
        probe_dir().to_string_lossy().to_string(),
    );
    let args = [
        "--timeout",
        "15s",
        "--report",
        &r,
        "--rw",
        &ds,
        "--ro",
        &pd,
        "--",
        "sh",
        "-c",
        &script,
    ];
    let out = run_with_timeout(
        &mut run_in_cgroup(Path::new(CGROUP_ROOT), false, &args),
        RUN_LIMIT,
    );
    let v = read_report(&report, &out);
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert_eq!(v["timed_out"], true, "{v}");
    assert!(
        d.join("ready").exists(),
        "every process was started before the timeout"
    );
    assert!(d.join("daemon.pid").exists(), "the daemon started");
    assert_cgroup_below_and_gone(&v, Path::new(CGROUP_ROOT));
    // Nothing that ran in the sandbox runs on: no sleeper, no daemon.
    let ps = run_with_timeout(
        Command::new("ps").args(["-eo", "pid,stat,args"]),
        Duration::from_secs(30),
    );
    let table = String::from_utf8_lossy(&ps.stdout).into_owned();
    let left: Vec<&str> = table
        .lines()
        .filter(|l| {
            ["sleep 3017", "sleep 3018", "3019"]
                .iter()
                .any(|m| l.contains(m))
        })
        .filter(|l| {
            !l.split_whitespace()
                .nth(1)
                .is_some_and(|s| s.starts_with('Z'))
        })
        .collect();
    assert!(left.is_empty(), "left running: {left:?}");
}

#[test]
fn a_sandbox_that_cannot_start_its_command_leaves_no_cgroup() {
    if skip_without_v2("a_sandbox_that_cannot_start_its_command_leaves_no_cgroup") {
        return;
    }
    let dir = shared_tempdir();
    let report = dir.path().join("r.json");
    let r = report.to_string_lossy().to_string();
    let args = ["--memory", "32M", "--report", &r, "--", "/no/such/command"];
    let out = run_with_timeout(
        &mut run_in_cgroup(Path::new(CGROUP_ROOT), false, &args),
        RUN_LIMIT,
    );
    assert_eq!(code(&out), 127, "{}", stderr(&out));
    assert_cgroup_below_and_gone(&read_report(&report, &out), Path::new(CGROUP_ROOT));
}

// ---------------------------------------------------------------------------------------
// Where the supervisor puts sandboxes.

/// A systemd service's layout: the supervisor is the only process of a non-root cgroup. The
/// no-internal-process rule forbids enabling controllers there while it holds a process, so
/// the supervisor moves itself into a leaf, enables memory/cpu/pids for the cgroup's
/// children, creates the sandbox beside its leaf, and undoes all of it when done.
#[test]
fn a_supervisor_alone_in_a_service_cgroup_moves_into_a_leaf_and_restores_it() {
    if skip_without_v2("a_supervisor_alone_in_a_service_cgroup_moves_into_a_leaf_and_restores_it") {
        return;
    }
    let service = TestCgroup::new("test-service");
    assert_eq!(service.read("cgroup.subtree_control").trim(), "");
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let report = d.join("report.json");
    let (r, ds, pd, script) = (
        report.to_string_lossy().to_string(),
        d.to_string_lossy().to_string(),
        probe_dir().to_string_lossy().to_string(),
        started_then_memhog(&d),
    );
    let args = [
        "--memory", "64M", "--pids", "32", "--cpus", "1", "--report", &r, "--rw", &ds, "--ro", &pd,
        "--", "sh", "-c", &script,
    ];
    let mut child = spawn(&mut run_in_cgroup(&service.dir, false, &args));
    let supervisor = child.id() as i32;
    wait_for_file(&d.join("started"), &mut child, RUN_LIMIT);

    // While the sandbox runs: the service cgroup holds no process, only cgroups.
    assert_eq!(
        service.procs(),
        Vec::<i32>::new(),
        "the supervisor left the service cgroup"
    );
    let children = service.children();
    let leaves: Vec<&String> = children
        .iter()
        .filter(|c| c.starts_with("hatchery-supervisor-"))
        .collect();
    let sandboxes: Vec<&String> = children
        .iter()
        .filter(|c| c.starts_with("hatchery-run-"))
        .collect();
    assert_eq!((leaves.len(), sandboxes.len()), (1, 1), "{children:?}");
    assert_eq!(
        pids_of(&service.dir.join(leaves[0])),
        vec![supervisor],
        "the supervisor sits in its leaf"
    );
    let enabled = service.read("cgroup.subtree_control");
    for c in ["memory", "cpu", "pids"] {
        assert!(
            words(&enabled).contains(&c),
            "{c} enabled for the children: {enabled}"
        );
    }
    let sandbox = service.dir.join(sandboxes[0]);
    let read = |f: &str| std::fs::read_to_string(sandbox.join(f)).unwrap_or_default();
    assert_eq!(read("memory.max").trim(), (64u64 << 20).to_string());
    assert_eq!(read("pids.max").trim(), "32");
    assert_eq!(read("cpu.max").trim(), "100000 100000");
    assert!(
        !pids_of(&sandbox).is_empty(),
        "the sandbox's processes are in its cgroup"
    );

    // Now the payload eats memory: the limit holds in this layout too.
    if let Err(e) = std::fs::write(d.join("go"), "") {
        panic!("go: {e}");
    }
    let out = finish(child, RUN_LIMIT);
    let v = read_report(&report, &out);
    assert_oom_killed(code(&out), &v, 64 << 20);
    assert_cgroup_below_and_gone(&v, &service.dir);

    // Afterwards the service cgroup is as it was: no cgroups below, no controllers enabled.
    assert_eq!(service.children(), Vec::<String>::new());
    assert_eq!(service.read("cgroup.subtree_control").trim(), "");
}

/// A root supervisor whose cgroup also holds a process it does not own (a login shell's
/// session) may not reorganise that cgroup: it puts the sandbox below the root cgroup.
#[test]
fn a_root_supervisor_sharing_its_cgroup_uses_the_root_cgroup() {
    if skip_without_v2("a_root_supervisor_sharing_its_cgroup_uses_the_root_cgroup") {
        return;
    }
    let session = TestCgroup::new("test-session");
    let mut neighbour = spawn(Command::new("sleep").arg("300"));
    let neighbour_pid = neighbour.id();
    if let Err(e) = std::fs::write(session.file("cgroup.procs"), neighbour_pid.to_string()) {
        let _ = neighbour.kill();
        panic!("move the neighbour: {e}");
    }
    let dir = shared_tempdir();
    let report = dir.path().join("r.json");
    let (r, pd, p) = (
        report.to_string_lossy().to_string(),
        probe_dir().to_string_lossy().to_string(),
        probe().to_string_lossy().to_string(),
    );
    let args = [
        "--memory", "64M", "--report", &r, "--ro", &pd, "--", &p, "memhog", "8",
    ];
    let out = run_with_timeout(&mut run_in_cgroup(&session.dir, false, &args), RUN_LIMIT);
    let _ = neighbour.kill();
    let _ = neighbour.wait();
    assert_eq!(
        (code(&out), stdout(&out).as_str()),
        (0, "ok 8"),
        "{}",
        stderr(&out)
    );
    let v = read_report(&report, &out);
    assert_cgroup_below_and_gone(&v, Path::new(CGROUP_ROOT));
    assert_eq!(session.children(), Vec::<String>::new(), "no leaf was made");
    assert_eq!(session.read("cgroup.subtree_control").trim(), "");
}

/// Rootless with a delegated subtree (what `systemd-run --user --scope -p Delegate=yes`
/// gives a user): an unprivileged supervisor gets real, kernel-enforced limits.
#[test]
fn rootless_in_a_delegated_subtree_gets_real_limits() {
    if skip_without_v2("rootless_in_a_delegated_subtree_gets_real_limits") {
        return;
    }
    let delegated = TestCgroup::new("test-delegated");
    delegated.delegate_to(NOBODY);
    let dir = shared_tempdir();
    let report = dir.path().join("r.json");
    let (r, pd, p) = (
        report.to_string_lossy().to_string(),
        probe_dir().to_string_lossy().to_string(),
        probe().to_string_lossy().to_string(),
    );
    let args = [
        "--memory", "64M", "--pids", "32", "--report", &r, "--ro", &pd, "--", &p, "memhog", "256",
    ];
    let out = run_with_timeout(&mut run_in_cgroup(&delegated.dir, true, &args), RUN_LIMIT);
    let v = read_report(&report, &out);
    assert_oom_killed(code(&out), &v, 64 << 20);
    let e = &v["enforcement"];
    assert_eq!(e["rootless"], true, "{e}");
    assert_eq!(e["uid_host"], NOBODY, "{e}");
    assert!(
        e["limits"]["memory"].is_string() && e["limits"]["pids"].is_string(),
        "{e}"
    );
    assert_cgroup_below_and_gone(&v, &delegated.dir);
    assert_eq!(delegated.children(), Vec::<String>::new());
    assert_eq!(delegated.read("cgroup.subtree_control").trim(), "");
}

/// Without a delegated cgroup an unprivileged user cannot have limits: `run` refuses (125)
/// instead of running unlimited.
#[test]
fn rootless_without_delegation_refuses_limits() {
    if skip_without_v2("rootless_without_delegation_refuses_limits") {
        return;
    }
    // A cgroup owned by root, holding the unprivileged supervisor and nothing else.
    let foreign = TestCgroup::new("test-foreign");
    let args = ["--memory", "64M", "--", "true"];
    let out = run_with_timeout(&mut run_in_cgroup(&foreign.dir, true, &args), RUN_LIMIT);
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("cgroup"), "{}", stderr(&out));
    assert_eq!(foreign.children(), Vec::<String>::new());
}

/// A supervisor killed outright cannot clean up; its sandbox dies with it (parent-death
/// signal), and the next `run` removes the cgroup it left.
#[test]
fn a_killed_supervisors_cgroup_is_removed_by_the_next_run() {
    if skip_without_v2("a_killed_supervisors_cgroup_is_removed_by_the_next_run") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let ds = d.to_string_lossy().to_string();
    let script = format!("touch {ds}/started; exec sleep 3021");
    let args = ["--memory", "32M", "--rw", &ds, "--", "sh", "-c", &script];
    let mut child = spawn(&mut run_in_cgroup(Path::new(CGROUP_ROOT), false, &args));
    let supervisor = child.id();
    wait_for_file(&d.join("started"), &mut child, RUN_LIMIT);
    let prefix = format!("{}run-{supervisor}-", cgroup::NAME_PREFIX);
    let left: Vec<PathBuf> = child_cgroups(Path::new(CGROUP_ROOT))
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .map(|n| Path::new(CGROUP_ROOT).join(n))
        .collect();
    assert_eq!(left.len(), 1, "the running sandbox's cgroup: {left:?}");
    let _ = child.kill();
    let _ = child.wait();
    // The sandbox dies with its supervisor; its cgroup stays, empty, until a `run` sweeps.
    let start = Instant::now();
    while !pids_of(&left[0]).is_empty() {
        assert!(
            start.elapsed() < RUN_LIMIT,
            "the sandbox outlived its supervisor: {:?}",
            pids_of(&left[0])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // (A `run` of a test running in parallel may sweep it first: either way it must go.)
    let out = run_with_timeout(
        &mut run_in_cgroup(Path::new(CGROUP_ROOT), false, &["--", "true"]),
        RUN_LIMIT,
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!left[0].exists(), "{} was not swept", left[0].display());
}

/// A delegation that does not include the cpu controller (its parent enables only memory
/// and pids): `--cpus` is refused up front, and degrades visibly with `--allow-degraded`.
#[test]
fn a_delegated_subtree_without_cpu_refuses_cpus_or_reports_it_missing() {
    if skip_without_v2("a_delegated_subtree_without_cpu_refuses_cpus_or_reports_it_missing") {
        return;
    }
    let parent = TestCgroup::new("test-user-slice");
    if let Err(e) = std::fs::write(parent.file("cgroup.subtree_control"), "+memory +pids") {
        panic!("enable memory and pids below {}: {e}", parent.dir.display());
    }
    let delegated = TestCgroup {
        dir: parent.dir.join("user-65534"),
    };
    if let Err(e) = std::fs::create_dir(&delegated.dir) {
        panic!("{}: {e}", delegated.dir.display());
    }
    delegated.delegate_to(NOBODY);

    let out = run_with_timeout(
        &mut run_in_cgroup(&delegated.dir, true, &["--cpus", "0.5", "--", "true"]),
        RUN_LIMIT,
    );
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("--cpus"), "{}", stderr(&out));

    let dir = shared_tempdir();
    let report = dir.path().join("r.json");
    let r = report.to_string_lossy().to_string();
    let args = [
        "--cpus",
        "0.5",
        "--memory",
        "64M",
        "--allow-degraded",
        "--report",
        &r,
        "--",
        "true",
    ];
    let out = run_with_timeout(&mut run_in_cgroup(&delegated.dir, true, &args), RUN_LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v = read_report(&report, &out);
    let e = &v["enforcement"];
    assert!(e["limits"]["memory"].is_string(), "{e}");
    assert!(e["limits"].get("cpus").is_none(), "{e}");
    let notes = e["not_enforced"].to_string();
    assert!(notes.contains("cpus limit"), "{e}");
    assert_cgroup_below_and_gone(&v, &delegated.dir);
}
