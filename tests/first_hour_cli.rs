//! What a newcomer meets in the first hour, process-wide: a closed stdout, one exit-code
//! rule, where the rootless controller keeps its files, a controller that fails to start,
//! group names, logs, completions and the manual page, and the shipped examples.

mod common;

use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::controller::TestController;
use common::*;

const LIMIT: Duration = Duration::from_secs(60);

/// `hatchery ARGS` with stdout a pipe whose reader is already gone, stderr captured.
fn with_closed_stdout(args: &[&str], socket: Option<&Path>) -> Output {
    let (read, write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe().unwrap_or_else(|e| panic!("pipe: {e}"));
    drop(read);
    let mut cmd = Command::new(hatchery());
    cmd.arg(args[0]);
    if let Some(s) = socket {
        cmd.arg("--socket").arg(s);
    }
    cmd.args(&args[1..]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn: {e}"));
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output());
    let start = std::time::Instant::now();
    while !waiter.is_finished() {
        if start.elapsed() > LIMIT {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("{args:?} with a closed stdout did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    match waiter.join() {
        Ok(Ok(out)) => out,
        other => panic!("wait: {other:?}"),
    }
}

fn assert_quiet_zero(out: &Output, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: a closed stdout must end with 0 (status {:?}): {}",
        out.status,
        stderr(out)
    );
    assert!(
        stderr(out).is_empty(),
        "{what}: a closed stdout must end quietly: {}",
        stderr(out)
    );
}

// ---- a caller that closed stdin, stdout and stderr -------------------------------------

/// With descriptors 0, 1 and 2 closed by its caller, `run` still opens `/dev/null` on
/// them before anything else: otherwise the first file it opens (the report's directory)
/// takes descriptor 1 and becomes the command's stdout.
#[test]
fn a_run_whose_caller_closed_every_standard_descriptor_writes_nowhere_it_should_not() {
    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    let script =
        r#"exec "$HATCHERY" run --report "$REPORT" -- sh -c 'echo OUT; echo ERR >&2' <&- >&- 2>&-"#;
    let out = run_with_timeout(
        Command::new("sh")
            .args(["-c", script])
            .env("HATCHERY", hatchery())
            .env("REPORT", &report),
        LIMIT,
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("report: {e}"));
    let doc: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("report {text:?}: {e}"));
    assert_eq!(doc["exit_code"], 0, "{text}");
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(left, ["report.json"], "files next to the report");
}

/// Under a small open-file limit the command still writes where `run` was told to: the
/// payload's descriptors were staged at a fixed 100, refused past the limit (EINVAL), and
/// each stdio source then passed for a closed one, so the command ran with /dev/null for
/// its output and `run` exited 0 (the caller's stdout saw nothing).
#[test]
fn a_run_under_a_small_open_file_limit_keeps_the_commands_output() {
    let script = r#"ulimit -n 32 && exec "$HATCHERY" run -- sh -c 'echo OUT; echo ERR >&2'"#;
    let out = run_with_timeout(
        Command::new("sh")
            .args(["-c", script])
            .env("HATCHERY", hatchery()),
        LIMIT,
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "OUT");
    assert!(stderr(&out).contains("ERR"), "{}", stderr(&out));
}

// ---- 9: a closed stdout ends quietly -------------------------------------------------

#[test]
fn a_closed_stdout_ends_every_printing_command_quietly_with_0() {
    for args in [
        vec!["completions", "bash"],
        vec!["man"],
        vec!["doctor"],
        vec!["doctor", "--json"],
        vec!["profile", "list"],
        vec!["profile", "show", "default"],
        vec!["profile", "check", "default", "--all", "--json"],
        vec!["manifest", "contract"],
    ] {
        let out = with_closed_stdout(&args, None);
        assert_quiet_zero(&out, &args.join(" "));
    }
}

#[test]
fn ps_json_into_a_closed_pipe_ends_quietly_and_the_controller_lives_on() {
    if skip_unless_root("ps into a closed pipe") {
        return;
    }
    let c = TestController::start("", &[]);
    for args in [vec!["ps", "--json"], vec!["ps", "--all"]] {
        let out = with_closed_stdout(&args, Some(&c.socket));
        assert_quiet_zero(&out, &args.join(" "));
    }
    // The controller (and its launcher) did not die of the client's closed pipe.
    let out = c.cli(&["ps", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn a_controller_that_hangs_up_is_an_error_not_a_quiet_exit() {
    // Only a closed stdout ends quietly: a broken pipe to the controller is reported.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let socket = dir.path().join("c.sock");
    let listener =
        std::os::unix::net::UnixListener::bind(&socket).unwrap_or_else(|e| panic!("{e}"));
    let rude = std::thread::spawn(move || {
        for _ in 0..3 {
            match listener.accept() {
                Ok((conn, _)) => drop(conn),
                Err(_) => return,
            }
        }
    });
    for args in [
        ["ps", "--json"],
        ["kill-switch", "--release"],
        ["ps", "--all"],
    ] {
        let mut cmd = Command::new(hatchery());
        cmd.arg(args[0]).arg("--socket").arg(&socket).arg(args[1]);
        let out = run_with_timeout(&mut cmd, LIMIT);
        assert_eq!(code(&out), 1, "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).is_empty(), "{args:?}: said nothing");
    }
    let _ = rude.join();
}

// ---- 18: one exit-code rule ----------------------------------------------------------

fn assert_usage_error(out: &Output, what: &str, needle: &str) {
    assert_eq!(code(out), 2, "{what}: bad input exits 2: {}", stderr(out));
    let err = stderr(out);
    assert!(err.contains(needle), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: one line: {err}");
}

#[test]
fn bad_input_exits_2_in_run_spawn_and_profile_alike() {
    let out = hatchery_cmd(&["run", "--env", "=x", "--", "true"]);
    assert_usage_error(&out, "run --env =x", "--env");
    // Checked before the controller is asked: no controller is needed to refuse it.
    let out = hatchery_cmd(&[
        "spawn",
        "--socket",
        "/nonexistent/c.sock",
        "--env",
        "=x",
        "--",
        "true",
    ]);
    assert_usage_error(&out, "spawn --env =x", "env");
    let out = hatchery_cmd(&["run", "--profile", "no-such-profile", "--", "true"]);
    assert_usage_error(&out, "run --profile no-such-profile", "no-such-profile");
    let out = hatchery_cmd(&["profile", "show", "no-such-profile"]);
    assert_usage_error(&out, "profile show no-such-profile", "no-such-profile");
    let out = hatchery_cmd(&["run", "--ro", "/nonexistent/dir", "--", "true"]);
    assert_usage_error(&out, "run --ro /nonexistent/dir", "/nonexistent/dir");
}

#[test]
fn the_readme_and_the_top_level_help_state_the_exit_status_rule() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .unwrap_or_else(|e| panic!("README.md: {e}"));
    assert!(
        readme.contains("\n## Exit status\n"),
        "no Exit status section"
    );
    for row in ["| 2 |", "| 125 |", "| 3 |", "| 1 |"] {
        assert!(readme.contains(row), "the Exit status table lacks {row}");
    }
    let help = hatchery_cmd(&["--help"]);
    assert!(
        stdout(&help).contains("Exit status: 0 done; 1 failed; 2 bad usage"),
        "{}",
        stdout(&help)
    );
}

// ---- 7: the rootless controller's fallback directory ---------------------------------

/// A uid no one else on this host uses, for the fallback-directory tests.
fn spare_uid() -> u32 {
    64000 + std::process::id() % 500
}

/// `hatchery ARGS` as `uid` with no home directory and no XDG directories.
fn as_homeless(uid: u32, args: &[&str]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        &format!("--reuid={uid}"),
        &format!("--regid={uid}"),
        "--clear-groups",
        "--",
    ])
    .arg(hatchery())
    .args(args)
    .env_remove("XDG_RUNTIME_DIR")
    .env_remove("XDG_STATE_HOME")
    .env("HOME", "/nonexistent");
    run_with_timeout(&mut cmd, LIMIT)
}

/// Removes the fallback directory when the test ends (it is this test's alone).
struct RemoveDir(std::path::PathBuf);
impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_fallback_directory_someone_else_made_is_refused_with_one_line() {
    if skip_unless_root("fallback directory owned by someone else") {
        return;
    }
    let uid = spare_uid();
    let base = std::path::PathBuf::from(format!("/tmp/hatchery-{uid}"));
    let _ = std::fs::remove_dir_all(&base);
    // Made by root (someone else, for this uid), writable by all: a trap.
    std::fs::create_dir(&base).unwrap_or_else(|e| panic!("{e}"));
    let _guard = RemoveDir(base.clone());
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777))
        .unwrap_or_else(|e| panic!("{e}"));
    let out = as_homeless(uid, &["controller"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&base.display().to_string())
            && err.contains("belongs to uid 0")
            && err.contains("--state-dir"),
        "{err}"
    );
    assert!(
        !base.join("state").exists(),
        "nothing is created in a stranger's directory"
    );
    // A client does not trust a socket there either.
    let out = as_homeless(uid, &["ps"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("belongs to uid 0"),
        "{}",
        stderr(&out)
    );
    // Group- or other-writable, even when it is the user's own: refused too.
    std::os::unix::fs::chown(&base, Some(uid), Some(uid)).unwrap_or_else(|e| panic!("{e}"));
    let out = as_homeless(uid, &["controller"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("can be written by others"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_fallback_directory_is_made_private_to_its_user() {
    if skip_unless_root("fallback directory made private") {
        return;
    }
    let uid = spare_uid() + 500;
    let base = std::path::PathBuf::from(format!("/tmp/hatchery-{uid}"));
    let _ = std::fs::remove_dir_all(&base);
    let _guard = RemoveDir(base.clone());
    // Absent, it is not refused (a client only looks), and not made by a client.
    let out = as_homeless(uid, &["ps"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("belongs to"),
        "an absent base is refused: {}",
        stderr(&out)
    );
    assert!(!base.exists(), "a client made the base");
    // A controller makes it (0700, the user's), then fails at a socket it cannot make:
    // what it made inside is removed, the private base stays for the next start.
    let out = as_homeless(uid, &["controller", "--socket", "/proc/no-such/c.sock"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let meta = std::fs::symlink_metadata(&base).unwrap_or_else(|e| panic!("no base: {e}"));
    assert!(meta.is_dir());
    assert_eq!(meta.uid(), uid);
    assert_eq!(meta.mode() & 0o777, 0o700, "mode {:o}", meta.mode());
    assert!(
        !base.join("state").exists(),
        "a failed start left its state directory"
    );
}

// ---- 19: a controller that fails to start creates nothing ----------------------------

#[test]
fn a_controller_with_a_bad_contract_creates_no_state_directory() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let contract = dir.path().join("contract.toml");
    std::fs::write(&contract, "max_depth = \"deep\"\n").unwrap_or_else(|e| panic!("{e}"));
    let state = dir.path().join("state");
    let key = dir.path().join("elsewhere.key");
    let out = hatchery_cmd(&[
        "controller",
        "--contract",
        &contract.to_string_lossy(),
        "--state-dir",
        &state.to_string_lossy(),
        "--key",
        &key.to_string_lossy(),
        "--socket",
        &dir.path().join("c.sock").to_string_lossy(),
    ]);
    assert_eq!(
        code(&out),
        2,
        "a bad contract is bad input: {}",
        stderr(&out)
    );
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(!state.exists(), "the state directory was created");
    assert!(!key.exists(), "a key was created");
    assert!(!dir.path().join("c.sock").exists(), "a socket was left");
}

#[test]
fn a_controller_whose_socket_is_in_use_creates_no_key() {
    if skip_unless_root("socket in use") {
        return;
    }
    let running = TestController::start("", &[]);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let state = dir.path().join("state");
    let out = hatchery_cmd(&[
        "controller",
        "--socket",
        &running.socket.to_string_lossy(),
        "--state-dir",
        &state.to_string_lossy(),
    ]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already listening"),
        "{}",
        stderr(&out)
    );
    assert!(!state.exists(), "the state directory was created");
    assert!(!state.join("controller.key").exists(), "a key was created");
    // The running controller is untouched.
    let out = running.cli(&["ps", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

// ---- 14: --socket-group takes a group name -------------------------------------------

#[test]
fn socket_group_accepts_a_group_name() {
    if skip_unless_root("socket group by name") {
        return;
    }
    let Ok(Some(group)) = nix::unistd::Group::from_name("nogroup") else {
        eprintln!("SKIP socket_group_accepts_a_group_name: no group nogroup here");
        return;
    };
    let c = TestController::start("", &["--socket-group", "nogroup"]);
    let meta = std::fs::metadata(&c.socket).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(meta.gid(), group.gid.as_raw());
    assert_eq!(meta.mode() & 0o777, 0o660);
}

#[test]
fn an_unknown_socket_group_is_a_usage_error_naming_it() {
    let out = hatchery_cmd(&["controller", "--socket-group", "no-such-group-here"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no group named \"no-such-group-here\""),
        "{}",
        stderr(&out)
    );
}

// ---- 21: logs ------------------------------------------------------------------------

#[test]
fn verbose_run_logs_each_setup_step_without_colour_into_a_pipe() {
    if skip_unless_root("verbose run") {
        return;
    }
    let out = hatchery_cmd(&["-vv", "run", "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    for step in [
        "loading the profile",
        "detected what this host can enforce",
        "creating the sandbox's cgroup",
        "creating the sandbox (user, mount and pid namespaces)",
        "writing the sandbox's uid and gid maps",
        "compiling the seccomp filters",
        "the sandbox is running",
        "the sandbox ended",
    ] {
        assert!(err.contains(step), "no debug line for {step:?}: {err}");
    }
    assert!(!err.contains('\u{1b}'), "ANSI escapes in a pipe: {err:?}");
    // HATCHERY_LOG does the same.
    let mut cmd = Command::new(hatchery());
    cmd.args(["run", "--", "true"]).env("HATCHERY_LOG", "debug");
    let out = run_with_timeout(&mut cmd, LIMIT);
    assert!(
        stderr(&out).contains("creating the sandbox"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn verbose_controller_logs_its_start_up_steps() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let contract = dir.path().join("contract.toml");
    std::fs::write(&contract, "max_depth = \"deep\"\n").unwrap_or_else(|e| panic!("{e}"));
    let out = hatchery_cmd(&[
        "-vv",
        "controller",
        "--contract",
        &contract.to_string_lossy(),
        "--state-dir",
        &dir.path().join("state").to_string_lossy(),
        "--socket",
        &dir.path().join("c.sock").to_string_lossy(),
    ]);
    let err = stderr(&out);
    assert!(err.contains("controller starting"), "{err}");
    assert!(err.contains("checking the replication contract"), "{err}");
    assert!(!err.contains('\u{1b}'), "ANSI escapes in a pipe: {err:?}");
}

fn assert_all_json(out: &Output, what: &str) -> Vec<serde_json::Value> {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!err.trim().is_empty(), "{what}: no error line");
    err.lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {l}"))
        })
        .collect()
}

#[test]
fn log_format_json_covers_error_lines_and_usage_errors() {
    let out = hatchery_cmd(&[
        "--log-format",
        "json",
        "run",
        "--profile",
        "no-such-profile",
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 2);
    let lines = assert_all_json(&out, "run refusal");
    assert!(
        lines.iter().any(|l| l["level"] == "ERROR"
            && l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("no-such-profile"))),
        "{lines:?}"
    );
    let out = hatchery_cmd(&["--log-format=json", "profile", "show", "no-such-profile"]);
    assert_eq!(code(&out), 2);
    assert_all_json(&out, "profile refusal");
    // A command line clap refuses, too.
    let out = hatchery_cmd(&["--log-format", "json", "run", "--no-such-flag"]);
    assert_eq!(code(&out), 2);
    let lines = assert_all_json(&out, "usage error");
    assert!(
        lines.iter().any(|l| l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--no-such-flag"))),
        "{lines:?}"
    );
}

// ---- 22: completions, manual page, install script ------------------------------------

#[test]
fn completions_and_the_manual_page_are_printed() {
    for (shell, needle) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef hatchery"),
        ("fish", "complete -c hatchery"),
    ] {
        let out = hatchery_cmd(&["completions", shell]);
        assert_eq!(code(&out), 0, "{shell}: {}", stderr(&out));
        let text = stdout(&out);
        assert!(text.contains(needle), "{shell}: {text:.200}");
        assert!(text.contains("kill-switch"), "{shell}: subcommands missing");
    }
    let out = hatchery_cmd(&["man"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).starts_with(".ie") || stdout(&out).contains(".TH hatchery"));
    assert!(stdout(&out).contains("controller"));
    let out = hatchery_cmd(&["completions", "tcsh"]);
    assert_eq!(code(&out), 2);
}

#[test]
fn the_install_script_installs_the_binary_manual_page_and_completions() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let prefix = dir.path().join("prefix");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script)
        .env("PREFIX", &prefix)
        .env("HATCHERY_BIN", hatchery());
    let out = run_with_timeout(&mut cmd, LIMIT);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    for f in [
        "bin/hatchery",
        "share/man/man1/hatchery.1",
        "share/bash-completion/completions/hatchery",
        "share/zsh/site-functions/_hatchery",
        "share/fish/vendor_completions.d/hatchery.fish",
    ] {
        let meta = std::fs::metadata(prefix.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(meta.len() > 0, "{f} is empty");
    }
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(readme.contains("scripts/install.sh"));
}

// ---- 8: the --allow-exec transcript runs from shipped files --------------------------

#[test]
fn the_allow_exec_transcript_runs_from_the_shipped_examples() {
    if skip_unless_root("allow-exec transcript") {
        return;
    }
    let python = Path::new("/usr/bin/python3.11");
    if !python.exists() {
        eprintln!("SKIP the allow-exec transcript: it names /usr/bin/python3.11");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("hatchery-demo-")
        .tempdir()
        .unwrap_or_else(|e| panic!("{e}"));
    let agent = dir.path().join("agent");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/allow-exec");
    let out = run_with_timeout(
        Command::new("cp").arg("-r").arg(&examples).arg(&agent),
        LIMIT,
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let tool = agent.join("tool.pl").to_string_lossy().to_string();
    let escape = agent.join("escape.py").to_string_lossy().to_string();
    let report = dir.path().join("r.json").to_string_lossy().to_string();
    let out = hatchery_cmd(&[
        "run",
        "--allow-exec",
        "/usr/bin/python3.11",
        "--allow-exec",
        &tool,
        "--ro",
        &agent.to_string_lossy(),
        "--report",
        &report,
        "--",
        "python3",
        &escape,
    ]);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    for (attempt, answer) in [
        ("run /usr/bin/id", "Permission denied (errno 13)"),
        (
            "run a copy of python in /tmp",
            "Permission denied (errno 13)",
        ),
        (
            "run a #!/usr/bin/perl script",
            "Permission denied (errno 13)",
        ),
        ("ld.so /usr/bin/perl", "exit 127"),
        ("ld.so /tmp/py (the copy)", "exit 127"),
        (
            "memfd_create (sealed, for ld.so)",
            "Permission denied (errno 13)",
        ),
        ("python3 itself", "exit 0 allowed"),
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(attempt))
            .unwrap_or_else(|| panic!("no line for {attempt}: {text}"));
        assert!(line.contains(answer), "{attempt}: {line}");
        // The transcript's alignment: the answer starts in column 44.
        assert_eq!(line.find(answer).map(|i| i >= 43), Some(true), "{line}");
    }
    assert!(
        stderr(&out).contains("tool.pl starts with #!/usr/bin/perl"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_install_script_refuses_a_tree_others_can_write() {
    // A prefix whose nearest existing directory is world-writable (/tmp itself): a planted
    // symlink there would turn the install's writes into writes elsewhere.
    let prefix = std::env::temp_dir().join(format!("hatchery-install-{}", std::process::id()));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script)
        .env("PREFIX", &prefix)
        .env("HATCHERY_BIN", hatchery());
    let out = run_with_timeout(&mut cmd, LIMIT);
    assert_eq!(code(&out), 1, "{} {}", stdout(&out), stderr(&out));
    assert!(
        stderr(&out).contains("can be written by others"),
        "{}",
        stderr(&out)
    );
    assert!(!prefix.exists(), "nothing was installed");
}

#[test]
fn a_client_whose_fallback_directory_does_not_exist_trusts_no_socket() {
    if skip_unless_root("client without a fallback directory") {
        return;
    }
    // No directory yet: another user could make one (with a controller of theirs in it)
    // between a look and a connect by path, so the client refuses before connecting.
    let uid = spare_uid();
    let base = std::path::PathBuf::from(format!("/tmp/hatchery-{uid}"));
    let _ = std::fs::remove_dir_all(&base);
    for args in [vec!["ps"], vec!["kill-switch"], vec!["audit", "verify"]] {
        let out = as_homeless(uid, &args);
        assert_ne!(code(&out), 0, "{args:?}: {}", stdout(&out));
        assert!(
            stderr(&out).contains("no controller of this user's"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(!base.exists());
}

#[test]
fn a_closed_stdout_does_not_cut_a_kill_short_or_hide_its_status() {
    if skip_unless_root("kill into a closed pipe") {
        return;
    }
    let c = TestController::start("", &[]);
    let ids: Vec<String> = (0..3)
        .map(|_| {
            let out = c.cli(&["spawn", "--no-controller", "--", "sleep", "30"]);
            assert_eq!(code(&out), 0, "{}", stderr(&out));
            stdout(&out).trim().to_string()
        })
        .collect();
    let mut args = vec!["kill"];
    args.extend(ids.iter().map(String::as_str));
    args.push("w-000000000000");
    let out = with_closed_stdout(&args, Some(&c.socket));
    // The unknown id fails the command; every known one was still killed.
    assert_ne!(code(&out), 0, "{}", stderr(&out));
    let start = std::time::Instant::now();
    loop {
        let ps = c.cli(&["ps", "--json"]);
        let running: Vec<String> = serde_json::from_slice::<serde_json::Value>(&ps.stdout)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|w| w["worker_id"].as_str().map(str::to_string))
            .collect();
        if !ids.iter().any(|i| running.contains(i)) {
            break;
        }
        assert!(start.elapsed() < LIMIT, "still running: {running:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
