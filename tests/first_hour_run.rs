//! What a newcomer meets in the first hour with `hatchery run`: the README's example works
//! as written, paths may be relative, every refusal says what to do (exit 2 for input,
//! 125 for a sandbox that cannot be set up), reports are written whatever happens.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use common::*;

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `hatchery ARGS...` started in `dir`, with extra environment, 60 s at most.
fn hatchery_in(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(hatchery());
    cmd.current_dir(dir).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_with_timeout(&mut cmd, Duration::from_secs(60))
}

/// `hatchery ARGS...` as nobody:nogroup (rootless), started in `/`.
fn as_nobody(args: &[&str]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(hatchery())
        .args(args)
        .current_dir("/");
    run_with_timeout(&mut cmd, Duration::from_secs(60))
}

fn refused(out: &Output, want: i32, needle: &str) {
    let err = stderr(out);
    assert_eq!(code(out), want, "{err}");
    assert!(err.contains(needle), "does not say {needle:?}: {err}");
    assert!(stdout(out).is_empty(), "something ran: {}", stdout(out));
}

fn write(p: &Path, text: &str, mode: u32) {
    if let Err(e) = std::fs::write(p, text) {
        panic!("write {}: {e}", p.display());
    }
    std::fs::set_permissions(p, PermissionsExt::from_mode(mode)).ok();
}

fn mkdir(p: &Path, mode: u32) {
    if let Err(e) = std::fs::create_dir(p) {
        panic!("mkdir {}: {e}", p.display());
    }
    std::fs::set_permissions(p, PermissionsExt::from_mode(mode)).ok();
}

fn report_of(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_default())
        .unwrap_or_else(|e| panic!("no report at {}: {e}", p.display()))
}

// ------------------------------------------------------------ 1. relative paths

#[test]
fn relative_ro_rw_and_cwd_paths_are_resolved_against_the_current_directory() {
    if skip_unless_root("relative paths") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    write(&d.join("data.txt"), "from the host\n", 0o644);
    mkdir(&d.join("ws"), 0o777);
    let out = hatchery_in(
        &d,
        &[],
        &[
            "run",
            "--ro",
            "data.txt",
            "--rw",
            "./ws",
            "--cwd",
            "ws",
            "--",
            "sh",
            "-c",
            "pwd; cat ../data.txt; echo written > out",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("{}\nfrom the host", s(&d.join("ws"))),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(d.join("ws/out")).unwrap_or_default(),
        "written\n"
    );
}

#[test]
fn a_relative_allow_exec_path_is_resolved_against_the_current_directory() {
    if skip_unless_root("relative --allow-exec") {
        return;
    }
    let out = hatchery_in(
        Path::new("/usr/bin"),
        &[],
        &["run", "--allow-exec", "./true", "--", "/usr/bin/true"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = hatchery_in(
        Path::new("/usr/bin"),
        &[],
        &["run", "--allow-exec", "true", "--", "/usr/bin/id"],
    );
    assert_ne!(code(&out), 0, "id ran outside the allowlist");
}

#[test]
fn relative_paths_keep_the_dotdot_and_symlink_refusals() {
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    mkdir(&d.join("real"), 0o755);
    if let Err(e) = std::os::unix::fs::symlink("real", d.join("link")) {
        panic!("symlink: {e}");
    }
    for (args, needle) in [
        (vec!["run", "--ro", "../real", "--", "echo", "ran"], ".."),
        (
            vec!["run", "--rw", "real/../real", "--", "echo", "ran"],
            "..",
        ),
        (vec!["run", "--ro", "link", "--", "echo", "ran"], "symlink"),
        (
            vec!["run", "--rw", "./link/", "--", "echo", "ran"],
            "symlink",
        ),
        (vec!["run", "--cwd", "../x", "--", "echo", "ran"], ".."),
        (
            vec!["run", "--allow-exec", "../x", "--", "echo", "ran"],
            "..",
        ),
    ] {
        let out = hatchery_in(&d, &[], &args);
        refused(&out, 2, needle);
    }
    // spawn resolves them the same way, before asking any controller.
    let out = hatchery_in(&d, &[], &["spawn", "--ro", "../real", "--", "echo", "ran"]);
    refused(&out, 2, "..");
}

// ------------------------------------------------------------ 2. the current directory

/// The README's setup lines and its main example, as written there.
fn readme_example() -> (String, String) {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .unwrap_or_default();
    let lines: Vec<&str> = readme.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("mkdir -p workspace"))
        .unwrap_or_else(|| panic!("the README has no setup line `mkdir -p workspace ...`"));
    let example = lines
        .get(at + 1)
        .filter(|l| l.starts_with("hatchery run") && l.contains("agent.py"))
        .unwrap_or_else(|| panic!("the README's setup line is not followed by its example"));
    (lines[at].to_string(), example.to_string())
}

#[test]
fn the_readme_example_runs_verbatim_after_its_setup_lines() {
    if skip_unless_root("README example") {
        return;
    }
    let (setup, example) = readme_example();
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let bin = hatchery().parent().map(s).unwrap_or_default();
    let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
    let out = hatchery_in_shell(&d, &path, &format!("{setup}\n{example}"));
    assert_eq!(code(&out), 0, "{example}: {}", stderr(&out));
    assert!(
        stdout(&out).contains("agent.py"),
        "{example}: {} / {}",
        stdout(&out),
        stderr(&out)
    );
}

fn hatchery_in_shell(dir: &Path, path: &str, script: &str) -> Output {
    let mut cmd = Command::new("sh");
    cmd.args(["-ec", script]).current_dir(dir).env("PATH", path);
    run_with_timeout(&mut cmd, Duration::from_secs(60))
}

#[test]
fn a_command_naming_a_file_in_an_unexposed_current_directory_gets_a_note_naming_ro_cwd() {
    if skip_unless_root("cwd note") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    write(&d.join("agent.py"), "print('hi')\n", 0o644);
    let out = hatchery_in(&d, &[], &["run", "--", "python3", "agent.py"]);
    assert_ne!(code(&out), 0);
    let err = stderr(&out);
    assert!(
        err.lines()
            .any(|l| l.contains("not exposed") && l.contains("--ro-cwd") && l.contains(&s(&d))),
        "{err}"
    );
}

#[test]
fn ro_cwd_exposes_the_current_directory_read_only_and_starts_there() {
    if skip_unless_root("--ro-cwd") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    write(&d.join("agent.py"), "print('hi from agent.py')\n", 0o644);
    let out = hatchery_in(
        &d,
        &[],
        &[
            "run",
            "--ro-cwd",
            "--",
            "sh",
            "-c",
            "pwd; python3 agent.py; touch x 2>/dev/null && echo wrote",
        ],
    );
    assert_eq!(
        stdout(&out),
        format!("{}\nhi from agent.py", s(&d)),
        "{}",
        stderr(&out)
    );
    assert!(!d.join("x").exists(), "the current directory was writable");
}

// ------------------------------------------------------------ 4. counts

#[test]
fn a_pids_limit_below_what_hatchery_needs_is_refused_before_anything_starts() {
    for sub in ["run", "spawn"] {
        let out = hatchery_cmd(&[sub, "--pids", "1", "--", "echo", "ran"]);
        refused(&out, 2, "at least 2");
    }
    if skip_unless_root("--pids 2") {
        return;
    }
    let out = hatchery_cmd(&["run", "--pids", "2", "--", "echo", "ran"]);
    assert_eq!(
        (code(&out), stdout(&out)),
        (0, "ran".into()),
        "{}",
        stderr(&out)
    );
}

// ------------------------------------------------------------ 10. reports

#[test]
fn a_refusal_before_start_still_writes_the_report_with_the_refusal_in_error() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = canonical(dir.path());
    // Refused by hatchery's own checks, and by the command-line parser.
    for (i, (flags, needle)) in [
        (vec!["--env", "A B"], "A B"),
        (vec!["--pids", "1"], "at least 2"),
        (vec!["--hostname", "a b"], "RFC 1123"),
    ]
    .into_iter()
    .enumerate()
    {
        let report = d.join(format!("r{i}.json"));
        let mut args = vec!["run", "--report"];
        let r = s(&report);
        args.push(&r);
        args.extend(flags.iter());
        args.extend(["--", "echo", "ran"]);
        let out = hatchery_cmd(&args);
        refused(&out, 2, needle);
        let v = report_of(&report);
        assert_eq!(v["exit_code"], 2, "{v}");
        assert!(
            v["error"].as_str().is_some_and(|e| e.contains(needle)),
            "{flags:?}: {v}"
        );
        assert_eq!(v["command"], serde_json::json!(["echo", "ran"]), "{v}");
    }
}

#[test]
fn an_unwritable_report_path_is_refused_before_the_command_starts() {
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let marker = d.join("ran");
    let out = hatchery_cmd(&[
        "run",
        "--rw",
        &s(&d),
        "--report",
        "/nonexistent/dir/r.json",
        "--",
        "touch",
        &s(&marker),
    ]);
    refused(&out, 2, "/nonexistent/dir/r.json");
    assert!(!marker.exists(), "the command ran");
}

#[test]
fn report_dash_means_standard_output() {
    if skip_unless_root("--report -") {
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = hatchery_in(dir.path(), &[], &["run", "--report", "-", "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("stdout is not the report: {e}: {}", stdout(&out)));
    assert_eq!(v["exit_code"], 0, "{v}");
    assert!(!dir.path().join("-").exists(), "a file named - was written");
}

// ------------------------------------------------------------ 11. degraded runs

#[test]
fn allow_degraded_without_a_report_says_on_one_line_what_was_not_enforced() {
    if skip_unless_root("degraded line (switches to nobody)") {
        return;
    }
    let with_report = as_nobody(&[
        "run",
        "--memory",
        "64M",
        "--allow-degraded",
        "--report",
        "-",
        "--",
        "true",
    ]);
    let v: Value = serde_json::from_str(&stdout(&with_report)).unwrap_or(Value::Null);
    let missing = v["enforcement"]["not_enforced"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if missing.is_empty() {
        eprintln!("SKIP degraded line: nobody has a delegated cgroup here, nothing is degraded");
        return;
    }
    assert!(
        !stderr(&with_report).contains("not enforced here"),
        "with a report, the report says it: {}",
        stderr(&with_report)
    );
    let out = as_nobody(&["run", "--memory", "64M", "--allow-degraded", "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("--allow-degraded"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("not enforced") && lines[0].contains("memory"),
        "{err}"
    );
}

// ------------------------------------------------------------ 15. silently accepted

#[test]
fn hostnames_outside_rfc_1123_are_refused() {
    for bad in ["", "a b", "a\nb", "x-", "a..b", "-x"] {
        let flag = format!("--hostname={bad}");
        let out = hatchery_cmd(&["run", &flag, "--", "echo", "ran"]);
        refused(&out, 2, "RFC 1123");
    }
}

#[test]
fn a_cpu_quota_beyond_the_hosts_cpus_is_refused() {
    let out = hatchery_cmd(&["run", "--cpus", "1000", "--", "echo", "ran"]);
    refused(&out, 2, "exceeds this host's");
}

#[test]
fn host_uid_without_root_is_refused() {
    if skip_unless_root("--host-uid as nobody") {
        return;
    }
    let out = as_nobody(&["run", "--host-uid", "1000", "--", "echo", "ran"]);
    refused(&out, 2, "only root");
}

#[test]
fn rw_on_a_host_system_directory_is_refused_without_allow_system_rw() {
    for p in ["/usr/lib", "/etc", "/boot", "/var/lib", "/home"] {
        if !Path::new(p).is_dir() {
            continue;
        }
        let out = hatchery_cmd(&["run", "--rw", p, "--", "echo", "ran"]);
        refused(&out, 2, "--allow-system-rw");
    }
    if skip_unless_root("--allow-system-rw") || !Path::new("/var/log").is_dir() {
        return;
    }
    let out = hatchery_cmd(&[
        "run",
        "--rw",
        "/var/log",
        "--allow-system-rw",
        "--",
        "echo",
        "ran",
    ]);
    assert_eq!(
        (code(&out), stdout(&out)),
        (0, "ran".into()),
        "{}",
        stderr(&out)
    );
}

#[test]
fn exposures_the_sandbox_cannot_use_are_warned_about_before_start() {
    if skip_unless_root("access warnings") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    // Root's, 0700: the sandbox (never root on the host) can neither read nor write it.
    let private = d.join("private");
    mkdir(&private, 0o700);
    let open = d.join("open");
    mkdir(&open, 0o777);
    let out = hatchery_cmd(&[
        "run",
        "--rw",
        &s(&private),
        "--ro",
        &s(&open),
        "--",
        "echo",
        "ran",
    ]);
    assert_eq!(stdout(&out), "ran", "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.lines().any(|l| l.contains("warning")
            && l.contains(&s(&private))
            && l.contains("cannot write")),
        "{err}"
    );
    assert!(!err.contains(&format!("--ro {}", s(&open))), "{err}");
    let out = hatchery_cmd(&["run", "--ro", &s(&private), "--", "echo", "ran"]);
    assert!(
        stderr(&out)
            .lines()
            .any(|l| l.contains("warning") && l.contains("cannot read")),
        "{}",
        stderr(&out)
    );
}

// ------------------------------------------------------------ 24. docker-isms

#[test]
fn env_key_alone_passes_the_callers_value() {
    if skip_unless_root("--env KEY") {
        return;
    }
    let out = hatchery_in(
        Path::new("/"),
        &[("HATCHERY_TEST_PASSED", "from the caller")],
        &[
            "run",
            "--env",
            "HATCHERY_TEST_PASSED",
            "--",
            "sh",
            "-c",
            "echo \"$HATCHERY_TEST_PASSED\"",
        ],
    );
    assert_eq!(
        (code(&out), stdout(&out)),
        (0, "from the caller".into()),
        "{}",
        stderr(&out)
    );
    let out = hatchery_in(
        Path::new("/"),
        &[],
        &[
            "run",
            "--env",
            "HATCHERY_TEST_NOT_SET_ANYWHERE",
            "--",
            "sh",
            "-c",
            "echo \"${HATCHERY_TEST_NOT_SET_ANYWHERE-unset}\"",
        ],
    );
    assert_eq!((code(&out), stdout(&out)), (0, "unset".into()));
    assert!(stderr(&out).contains("not set here"), "{}", stderr(&out));
}

#[test]
fn durations_run_together_like_1m30s_are_accepted() {
    for good in ["1m30s", "2h", "1h2m3s"] {
        let out = hatchery_cmd(&["run", "--timeout", good, "--report", "-", "--", "true"]);
        if !is_root() {
            // Parsed (no usage error), whatever the sandbox then does.
            assert_ne!(code(&out), 2, "{good}: {}", stderr(&out));
            continue;
        }
        assert_eq!(code(&out), 0, "{good}: {}", stderr(&out));
    }
    let out = hatchery_cmd(&["run", "--timeout", "1m30s", "--report", "-", "--", "true"]);
    if is_root() {
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap_or(Value::Null);
        assert_eq!(v["limits"]["timeout_ms"], 90_000, "{v}");
    }
    let out = hatchery_cmd(&["run", "--timeout", "1s1m", "--", "echo", "ran"]);
    refused(&out, 2, "largest unit down");
}

// ------------------------------------------------------------ 14. hints

#[test]
fn a_command_without_the_double_dash_is_told_where_the_command_goes() {
    let out = hatchery_cmd(&["run", "echo", "hi"]);
    refused(&out, 2, "hatchery run [OPTIONS] -- echo hi");
}

#[test]
fn a_command_on_the_host_but_not_exposed_gets_a_hint_naming_ro() {
    if skip_unless_root("exec hint") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let tool = d.join("tool");
    write(&tool, "#!/bin/sh\necho tool ran\n", 0o755);
    let out = hatchery_cmd(&["run", "--", &s(&tool)]);
    assert_eq!(code(&out), 127, "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("not exposed") && err.contains(&format!("--ro {}", s(&tool))),
        "{err}"
    );
}

#[test]
fn a_cwd_on_the_host_but_not_exposed_gets_a_hint_naming_ro() {
    if skip_unless_root("cwd hint") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let out = hatchery_cmd(&["run", "--cwd", &s(&d), "--", "echo", "ran"]);
    refused(&out, 125, &format!("--ro {}", s(&d)));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
}

// ------------------------------------------------------------ 18. one rule for exit codes

#[test]
fn bad_input_is_exit_2_and_the_same_in_run_and_spawn() {
    // Found before anything starts: 2, whichever command it is given to.
    for sub in ["run", "spawn"] {
        refused(
            &hatchery_cmd(&[sub, "--env", "A B", "--", "echo", "ran"]),
            2,
            "A B",
        );
        refused(
            &hatchery_cmd(&[sub, "--ro", "a/../b", "--", "echo", "ran"]),
            2,
            "..",
        );
    }
    refused(
        &hatchery_cmd(&["run", "--profile", "no-such-profile", "--", "echo", "ran"]),
        2,
        "no-such-profile",
    );
    refused(
        &hatchery_cmd(&["run", "--ro", "/nonexistent-hatchery", "--", "echo", "ran"]),
        2,
        "does not exist",
    );
}

#[test]
fn a_signed_manifest_carries_relative_paths_made_absolute_and_passed_through_env() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = canonical(dir.path());
    mkdir(&d.join("ws"), 0o755);
    let key = s(&d.join("k"));
    let out = hatchery_in(&d, &[], &["manifest", "keygen", "--key", &key]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = hatchery_in(
        &d,
        &[("HATCHERY_TEST_PASSED", "from the caller")],
        &[
            "manifest",
            "issue",
            "--key",
            &key,
            "--rw",
            "ws",
            "--ro",
            ".",
            "--cwd",
            "./ws",
            "--timeout",
            "1m30s",
            "--env",
            "HATCHERY_TEST_PASSED",
            "--",
            "true",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        v["filesystem"]["read_write"],
        serde_json::json!([s(&d.join("ws"))]),
        "{v}"
    );
    assert_eq!(
        v["filesystem"]["read_only"],
        serde_json::json!([s(&d)]),
        "{v}"
    );
    assert_eq!(v["cwd"], s(&d.join("ws")), "{v}");
    assert_eq!(v["resources"]["timeout_ms"], 90_000, "{v}");
    assert_eq!(
        v["env"],
        serde_json::json!(["HATCHERY_TEST_PASSED=from the caller"]),
        "{v}"
    );
}

/// A sandbox's pid 1 that dies of a fault (here: its stack limit, swept through the sizes
/// at which the supervisor still runs but pid 1 overflows) is hatchery's failure, exit
/// 125 with a message naming pid 1; its SIGSEGV is never reported as the command's
/// status (it was: `exit_code` 139, `signal` 11, no error, for a command that never ran).
#[test]
fn a_pid_1_that_dies_of_a_fault_is_hatcherys_failure_never_the_commands_status() {
    if skip_unless_root("pid 1 fault") {
        return;
    }
    let dir = shared_tempdir();
    let report = dir.path().join("r.json");
    let (mut crashes, mut ran) = (0, 0);
    for kib in (48..=160).step_by(2) {
        let _ = std::fs::remove_file(&report);
        let out = run_with_timeout(
            Command::new("sh")
                .args([
                    "-c",
                    &format!("ulimit -s {kib} && exec \"$HATCHERY\" run --report \"$R\" -- true"),
                ])
                .env("HATCHERY", hatchery())
                .env("R", &report),
            Duration::from_secs(30),
        );
        // Below some size the supervisor itself overflows first: no report, nothing to
        // misreport.
        let Ok(text) = std::fs::read_to_string(&report) else {
            continue;
        };
        let doc: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{kib} KiB: {e}: {text}"));
        let faults = [4, 5, 6, 7, 8, 11, 31]; // ILL TRAP ABRT BUS FPE SEGV SYS
        if doc["signal"].as_i64().is_some_and(|s| faults.contains(&s)) {
            panic!(
                "{kib} KiB: `true` reported as killed by a fault (pid 1's, taken for the command's): {text}"
            );
        }
        match doc["exit_code"].as_i64() {
            Some(0) => ran += 1,
            Some(125) if doc["error"].as_str().is_some_and(|e| e.contains("pid 1")) => {
                crashes += 1;
                assert!(
                    stderr(&out).contains("pid 1"),
                    "{kib} KiB: {}",
                    stderr(&out)
                );
                assert_eq!(code(&out), 125, "{kib} KiB");
            }
            // Another refusal a small stack limit can cause is not what this checks.
            _ => {}
        }
    }
    assert!(ran > 0, "no size let the sandbox start");
    eprintln!("pid 1 overflowed at {crashes} sizes; the command ran at {ran}");
}

/// What a payload can do to turn its own status into "hatchery crashed": send its pid 1
/// every fault signal. pid 1 never dies of them, and the command's 7 is reported as is.
#[test]
fn a_payload_that_sends_its_pid_1_every_fault_signal_keeps_its_own_status() {
    if skip_unless_root("faults sent to pid 1") {
        return;
    }
    let out = hatchery_cmd(&["run", "--report", "-", "--", "sh", "-c", FAULTS_TO_PID1]);
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    let doc: Value =
        serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)));
    assert_eq!(doc["exit_code"], 7, "{doc}");
    assert!(doc["signal"].is_null() && doc["error"].is_null(), "{doc}");
}

/// A stderr whose reader has gone (`hatchery run ... 2>&1 | head -1` once `head` exits):
/// hatchery's line about how the run ended is lost, but the run still ends as it should,
/// with its status and its report (writing the line panicked, exit 101, no report).
#[test]
fn a_stderr_whose_reader_is_gone_still_gets_the_run_its_status_and_report() {
    if skip_unless_root("a_stderr_whose_reader_is_gone_still_gets_the_run_its_status_and_report") {
        return;
    }
    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    let (read_end, write_end) = pipe_pair();
    drop(read_end);
    let mut cmd = Command::new(hatchery());
    cmd.arg("run")
        .arg("--report")
        .arg(&report)
        .args(["--timeout", "1s", "--", "sleep", "10"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(write_end));
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => panic!("spawn: {e}"),
    };
    let status = common::terminal::wait_child(&mut child, Duration::from_secs(30), "hatchery");
    assert_eq!(status.code(), Some(124), "{status:?}");
    let v: Value = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| panic!("no report"));
    assert_eq!(v["timed_out"], true, "{v}");
}
