//! Bad input to `hatchery run`: a clear one-line error, exit 2 (like clap's usage errors;
//! 125 is for a sandbox that cannot be set up), nothing started, nothing left behind.

mod common;

use std::path::Path;

use common::*;

fn assert_refused_with(args: &[&str], want_code: i32, needle: &str) {
    let out = hatchery_cmd(args);
    let err = stderr(&out);
    assert_eq!(code(&out), want_code, "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: error does not mention {needle:?}: {err}"
    );
    assert!(
        stdout(&out).is_empty(),
        "{args:?}: something ran: {}",
        stdout(&out)
    );
}

#[test]
fn malformed_sizes_durations_and_counts_are_usage_errors() {
    for (flag, value) in [
        ("--memory", "0"),
        ("--memory", "-1M"),
        ("--memory", "99999999T"),
        ("--memory", "lots"),
        ("--cpus", "0"),
        ("--cpus", "-1"),
        ("--cpus", "abc"),
        ("--pids", "0"),
        ("--pids", "1"),
        ("--pids", "-5"),
        ("--timeout", "abc"),
        ("--timeout", "0s"),
        ("--timeout", "-1s"),
    ] {
        assert_refused_with(&["run", flag, value, "--", "echo", "ran"], 2, value);
    }
}

#[test]
fn unknown_flags_and_missing_commands_are_usage_errors() {
    assert_refused_with(
        &["run", "--no-such-flag", "--", "echo", "ran"],
        2,
        "--no-such-flag",
    );
    assert_refused_with(&["run"], 2, "COMMAND");
    assert_refused_with(&["run", "--"], 2, "COMMAND");
}

#[test]
fn an_empty_command_is_refused() {
    assert_refused_with(&["run", "--", ""], 2, "no command");
}

#[test]
fn exposed_paths_must_be_clean_existing_and_not_symlinks() {
    let dir = shared_tempdir();
    let base = canonical(dir.path());
    let real = base.join("real");
    std::fs::create_dir(&real).ok();
    let link = base.join("link");
    std::os::unix::fs::symlink(&real, &link).ok();
    let b = base.to_string_lossy().to_string();
    for (flag, path, needle) in [
        ("--ro", "relative/dir".to_string(), "does not exist"),
        ("--rw", "./here/../here".to_string(), ".."),
        ("--ro", format!("{b}/real/../real"), ".."),
        ("--rw", format!("{b}/does-not-exist"), "does not exist"),
        ("--ro", link.to_string_lossy().to_string(), "symlink"),
        ("--rw", "/".to_string(), "root"),
        ("--ro", "/proc/1".to_string(), "/proc"),
    ] {
        assert_refused_with(&["run", flag, &path, "--", "echo", "ran"], 2, needle);
    }
}

#[test]
fn bad_profiles_env_and_cwd_are_refused() {
    assert_refused_with(
        &["run", "--profile", "no-such-profile", "--", "echo", "ran"],
        2,
        "no-such-profile",
    );
    assert_refused_with(
        &["run", "--env", "=VALUE", "--", "echo", "ran"],
        2,
        "KEY=VALUE",
    );
    assert_refused_with(
        &["run", "--cwd", "relative/../x", "--", "echo", "ran"],
        2,
        "..",
    );
    assert_refused_with(&["run", "--host-uid", "0", "--", "echo", "ran"], 2, "root");
}

#[test]
fn a_missing_working_directory_fails_setup_with_125() {
    if skip_unless_root("cwd") {
        return;
    }
    let out = hatchery_cmd(&["run", "--cwd", "/nowhere/at/all", "--", "echo", "ran"]);
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("working directory"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());
}

#[test]
fn refused_runs_leave_no_cgroup_behind() {
    if skip_unless_root("leftovers") {
        return;
    }
    let _ = hatchery_cmd(&["run", "--memory", "64M", "--cwd", "/nowhere", "--", "true"]);
    let _ = hatchery_cmd(&["run", "--memory", "64M", "--", "no-such-binary"]);
    let me = std::process::id();
    // Cgroups of runs started by this test process would be named hatchery-run-<their pid>;
    // those runs are over, so no hatchery-run-* directory may remain whose owner is dead.
    for base in [
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup",
    ] {
        let p = Path::new(base);
        if let Ok(entries) = walk(p, 3) {
            for e in entries {
                let name = e
                    .file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_default();
                if let Some(rest) = name.strip_prefix("hatchery-run-") {
                    let pid: u32 = rest
                        .split('-')
                        .next()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    assert!(
                        Path::new(&format!("/proc/{pid}")).exists() || pid == me,
                        "left behind: {}",
                        e.display()
                    );
                }
            }
        }
    }
}

fn walk(dir: &Path, depth: u32) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    if depth == 0 {
        return Ok(out);
    }
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.push(e.path());
            out.extend(walk(&e.path(), depth - 1).unwrap_or_default());
        }
    }
    Ok(out)
}

#[test]
fn a_bad_env_argument_never_repeats_its_value() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let report = dir.path().join("r.json");
    let out = hatchery_cmd(&[
        "run",
        "--report",
        report.to_str().unwrap_or_default(),
        "--env",
        "BAD KEY=s3cr3t-value",
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("BAD KEY"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("s3cr3t"), "{}", stderr(&out));
    let written = std::fs::read_to_string(&report).unwrap_or_default();
    assert!(written.contains("invalid variable name"), "{written}");
    assert!(!written.contains("s3cr3t"), "{written}");
}
