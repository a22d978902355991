//! The profile tools and `doctor` as a newcomer meets them: every error names the file and
//! the line, a reader that stops early is no error, wrong input gets the words that fix
//! it, and every result a script wants is there as JSON with an exit status to gate on.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::files::{json, s, write};
use common::{code, hatchery, hatchery_cmd, run_with_timeout, stderr, stdout};

/// Landlock paths a command can run from, so a profile is not a `landlock-empty` finding.
const RUNNABLE: &str = "[landlock]\nread = [\"/usr\", \"/etc\"]\nexecute = [\"/usr\"]\n";

#[test]
fn every_profile_error_names_the_file_and_the_line() {
    let dir = common::shared_tempdir();
    let head = "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n";
    let cases: &[(&str, String, usize, &str)] = &[
        (
            "default-errno.toml",
            "name = \"x\"\n[seccomp]\ndefault_action = \"errno\"\ndefault_errno = \"EPRM\"\n"
                .into(),
            4,
            "did you mean \"EPERM\"",
        ),
        (
            "rule-errno.toml",
            format!(
                "{head}[[seccomp.rule]]\naction = \"errno\"\nsyscalls = [\"ptrace\"]\nerrno = \"ENOPE\"\n"
            ),
            7,
            "ENOPE",
        ),
        (
            "syscall.toml",
            format!(
                "{head}[[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"ptrace\",\n  \"no_such_call\"]\n"
            ),
            7,
            "no_such_call",
        ),
        (
            "action.toml",
            format!("{head}[[seccomp.rule]]\nsyscalls = [\"ptrace\"]\naction = \"explode\"\n"),
            6,
            "explode",
        ),
        (
            "unknown-key.toml",
            format!("{head}[landlock]\nread = [\"/usr\"]\nreed = [\"/etc\"]\n"),
            6,
            "reed",
        ),
        (
            "arch.toml",
            format!("{head}architectures = [\"native\", \"mips\"]\n"),
            4,
            "mips",
        ),
        (
            "bad-arch-action.toml",
            format!("{head}bad_arch_action = \"errno\"\n"),
            4,
            "bad_arch_action",
        ),
        (
            "condition.toml",
            format!(
                "{head}[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"ioctl\"]\nargs = [{{ index = 1, op = \"eq\", value = \"NOPE\" }}]\n"
            ),
            7,
            "NOPE",
        ),
        (
            "empty-rule.toml",
            format!("{head}[[seccomp.rule]]\naction = \"allow\"\nsyscalls = []\n"),
            6,
            "no syscalls",
        ),
        (
            "rlimit.toml",
            format!("{head}[rlimits]\nnofile = 64\nbogus = 1\n"),
            6,
            "bogus",
        ),
        (
            "limit.toml",
            format!("{head}[limits]\npids = 10\nmemory = \"lots\"\n"),
            6,
            "limits.memory",
        ),
        (
            "name.toml",
            "\nname = \"\"\n[seccomp]\ndefault_action = \"allow\"\n".into(),
            2,
            "name",
        ),
        (
            "accept.toml",
            format!("{head}[lint]\naccept = [\"no-such-rule\"]\n"),
            5,
            "no-such-rule",
        ),
    ];
    for (name, text, line, needle) in cases {
        let p = write(dir.path(), name, text);
        let o = hatchery_cmd(&["profile", "lint", s(&p)]);
        assert_eq!(code(&o), 2, "{name}: {}", stdout(&o));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("{}:{line}:", p.display())),
            "{name}: line {line} not named: {err}"
        );
        assert!(err.contains(needle), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
}

/// `hatchery ARGS` with stdout a pipe whose reader has already gone, as behind
/// `| head -1` once head has its line: every write fails with EPIPE.
fn with_closed_stdout(args: &[&str]) -> Output {
    let (reader, writer) = match nix::unistd::pipe() {
        Ok(p) => p,
        Err(e) => panic!("pipe: {e}"),
    };
    drop(reader);
    let mut child = match Command::new(hatchery())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("cannot start hatchery: {e}"),
    };
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > Duration::from_secs(60) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("hatchery {args:?} did not finish within 60 s");
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("wait: {e}"),
        }
    }
    match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => panic!("wait: {e}"),
    }
}

#[test]
fn a_reader_that_stops_early_ends_profile_output_quietly() {
    // (arguments, the exit status the command decides whatever happens to its output)
    let cases: &[(&[&str], i32)] = &[
        (&["profile", "check", "strict", "--all", "--json"], 0),
        (&["profile", "check", "default", "--all"], 0),
        (&["profile", "list"], 0),
        (&["profile", "list", "--json"], 0),
        (&["profile", "show", "default"], 0),
        (&["profile", "show", "default", "--json"], 0),
        (&["profile", "show", "default", "--format", "bpf"], 0),
        (&["profile", "lint", "default", "--json"], 0),
        (&["profile", "lint", "compat"], 1),
        (&["profile", "diff", "default", "strict"], 1),
        (&["profile", "diff", "default", "strict", "--json"], 1),
        (&["profile", "export", "strict"], 0),
    ];
    for (args, want) in cases {
        let o = with_closed_stdout(args);
        assert_eq!(
            o.status.code(),
            Some(*want),
            "{args:?}: {:?} {}",
            o.status,
            stderr(&o)
        );
        let err = stderr(&o);
        // export's note that the floor is loaded too is its own, not a complaint.
        let err = err
            .lines()
            .filter(|l| !l.starts_with("hatchery: note:"))
            .collect::<Vec<_>>();
        assert!(err.is_empty(), "{args:?}: {err:?}");
    }
    // doctor decides its own status (1 when a check fails here); it never complains.
    let o = with_closed_stdout(&["doctor"]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{:?}", o.status);
    assert_eq!(stderr(&o), "", "doctor: nothing on stderr");
}

#[test]
fn a_missing_profile_file_is_named_once_with_what_to_give_instead() {
    let o = hatchery_cmd(&["profile", "lint", "./nonexist.json"]);
    assert_eq!(code(&o), 2);
    let err = stderr(&o);
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
    assert!(err.contains("./nonexist.json"), "{err}");
    assert!(err.contains("hatchery profile list"), "{err}");
}

#[test]
fn oci_json_given_as_a_profile_says_to_import_it() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/docker-default-seccomp.json");
    for args in [
        vec!["profile", "lint", s(&fixture)],
        vec!["profile", "show", s(&fixture)],
        vec!["run", "--profile", s(&fixture), "--", "true"],
    ] {
        let o = hatchery_cmd(&args);
        assert_ne!(code(&o), 0, "{args:?}");
        let err = stderr(&o);
        assert!(
            err.contains("OCI / Docker seccomp JSON")
                && err.contains(&format!("hatchery profile import {}", fixture.display())),
            "{args:?}: {err}"
        );
        assert!(!err.contains("expected key"), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
}

#[test]
fn check_without_a_syscall_says_to_give_one_or_all() {
    let o = hatchery_cmd(&["profile", "check", "default"]);
    assert_eq!(code(&o), 2);
    let err = stderr(&o);
    assert!(err.contains("--syscall") && err.contains("--all"), "{err}");
    // --all and --syscall together are still refused.
    let o = hatchery_cmd(&["profile", "check", "default", "--all", "--syscall", "read"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

#[test]
fn diff_of_two_versions_of_one_profile_heads_the_columns_with_the_files() {
    let dir = common::shared_tempdir();
    let head = "name = \"mine\"\n[seccomp]\ndefault_action = \"allow\"\n";
    let a = write(dir.path(), "a.toml", &format!("{head}{RUNNABLE}"));
    let b = write(
        dir.path(),
        "b.toml",
        &format!(
            "{head}[[seccomp.rule]]\naction = \"errno\"\nerrno = \"EPERM\"\nsyscalls = [\"ptrace\"]\n{RUNNABLE}"
        ),
    );
    let o = hatchery_cmd(&["profile", "diff", s(&a), s(&b)]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let out = stdout(&o);
    let header = out
        .lines()
        .find(|l| l.starts_with("syscall "))
        .unwrap_or_default();
    assert!(
        header.contains(s(&a)) && header.contains(s(&b)),
        "header: {header}\n{out}"
    );
    // Different names still head the columns.
    let o = hatchery_cmd(&["profile", "diff", "default", "strict"]);
    let out = stdout(&o);
    let header = out
        .lines()
        .find(|l| l.starts_with("syscall "))
        .unwrap_or_default();
    assert!(
        header.contains("default") && header.contains("strict"),
        "{header}"
    );
}

/// `hatchery doctor [--json]` as nobody (whose cgroup limits usually cannot work here).
fn doctor_as_nobody(json: bool) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(hatchery())
        .arg("doctor");
    if json {
        cmd.arg("--json");
    }
    run_with_timeout(&mut cmd, Duration::from_secs(60))
}

#[test]
fn doctor_exits_1_when_a_check_fails_and_0_when_none_does() {
    let mut runs = vec![(
        "this user",
        hatchery_cmd(&["doctor", "--json"]),
        hatchery_cmd(&["doctor"]),
    )];
    if common::is_root() {
        runs.push(("nobody", doctor_as_nobody(true), doctor_as_nobody(false)));
    }
    let mut saw_a_failure = false;
    for (who, json_run, text_run) in runs {
        let v = json(&stdout(&json_run));
        let checks = v["checks"].as_array().cloned().unwrap_or_default();
        assert!(!checks.is_empty(), "{who}: {v}");
        let failed = checks.iter().any(|c| c["status"] == "fail");
        for c in &checks {
            assert!(
                ["ok", "warn", "fail"].contains(&c["status"].as_str().unwrap_or("")),
                "{who}: {c}"
            );
            assert_eq!(c["ok"] == true, c["status"] != "fail", "{who}: {c}");
        }
        assert_eq!(v["status"] == "fail", failed, "{who}: {v}");
        let want = if failed { 1 } else { 0 };
        assert_eq!(code(&json_run), want, "{who} --json: {v}");
        assert_eq!(code(&text_run), want, "{who}: {}", stdout(&text_run));
        assert_eq!(
            stdout(&text_run).contains("FAIL"),
            failed,
            "{who}: {}",
            stdout(&text_run)
        );
        saw_a_failure |= failed;
    }
    if !saw_a_failure {
        eprintln!("note: no doctor check fails on this host; only the 0 side was exercised");
    }
}

fn ids_and_severities(v: &serde_json::Value) -> Vec<(String, String, bool)> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    (
                        f["id"].as_str().unwrap_or("").to_string(),
                        f["severity"].as_str().unwrap_or("").to_string(),
                        f["accepted"] == true,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn lint_reports_a_host_network_and_a_profile_that_runs_nothing() {
    let dir = common::shared_tempdir();
    let head = "name = \"x\"\n[seccomp]\ndefault_action = \"errno\"\ndefault_errno = \"EPERM\"\n";
    let host_net = write(
        dir.path(),
        "host-net.toml",
        &format!("{head}{RUNNABLE}[namespaces]\nnet = false\n"),
    );
    let o = hatchery_cmd(&["profile", "lint", s(&host_net), "--json"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert_eq!(
        ids_and_severities(&json(&stdout(&o))),
        [("host-network".to_string(), "error".to_string(), false)]
    );
    let no_landlock = write(dir.path(), "no-landlock.toml", head);
    let o = hatchery_cmd(&["profile", "lint", s(&no_landlock)]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("[landlock-empty]") && stdout(&o).contains("nothing can run"),
        "{}",
        stdout(&o)
    );
    // The same profile with paths to run from is clean.
    let fine = write(dir.path(), "fine.toml", &format!("{head}{RUNNABLE}"));
    let o = hatchery_cmd(&["profile", "lint", s(&fine)]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
}

#[test]
fn profile_list_json_names_every_shipped_profile_with_its_hash() {
    let o = hatchery_cmd(&["profile", "list", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&stdout(&o));
    let names: Vec<&str> = v
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["default", "strict", "compat"]);
    for p in v.as_array().cloned().unwrap_or_default() {
        assert_eq!(p["sha256"].as_str().map(str::len), Some(64), "{p}");
        assert!(
            p["origin"]
                .as_str()
                .is_some_and(|o| o.starts_with("builtin:"))
        );
    }
}

#[test]
fn profile_show_json_is_the_resolved_profile_and_format_json_its_alias() {
    let o = hatchery_cmd(&["profile", "show", "strict", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&stdout(&o));
    assert_eq!(v["name"], "strict");
    assert_eq!(v["origin"], "builtin:strict");
    assert!(
        v["seccomp"]["rule"]
            .as_array()
            .is_some_and(|r| !r.is_empty()),
        "{v}"
    );
    assert_eq!(v["namespaces"]["net"], true);
    assert!(
        v["floor"]["rules"]
            .as_array()
            .is_some_and(|r| !r.is_empty()),
        "{v}"
    );
    let alias = hatchery_cmd(&["profile", "show", "strict", "--format", "json"]);
    assert_eq!(stdout(&alias), stdout(&o));
    // The other formats are unchanged.
    let toml = hatchery_cmd(&["profile", "show", "strict", "--format", "toml"]);
    assert!(stdout(&toml).contains("[[seccomp.rule]]"));
}

#[test]
fn diff_json_gives_each_sides_verdict_and_whether_b_is_stricter() {
    let o = hatchery_cmd(&["profile", "diff", "default", "strict", "--json"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let v = json(&stdout(&o));
    assert_eq!(v["a"]["name"], "default");
    assert_eq!(v["b"]["name"], "strict");
    let socket = v["syscalls"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["syscall"] == "socket"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(socket["verdict"], "stricter", "{socket}");
    assert_eq!(socket["b"]["action"], "errno", "{socket}");
    assert_eq!(socket["b"]["allowed"], false, "{socket}");
    assert!(socket["b"]["errno"].is_number(), "{socket}");
    assert_eq!(socket["a"]["allowed"], true, "{socket}");
    for s in v["syscalls"].as_array().cloned().unwrap_or_default() {
        assert!(
            ["stricter", "looser", "different"].contains(&s["verdict"].as_str().unwrap_or("")),
            "{s}"
        );
    }
    // The other way round, strict to default is looser for socket.
    let o = hatchery_cmd(&["profile", "diff", "strict", "default", "--json"]);
    let v = json(&stdout(&o));
    let socket = v["syscalls"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["syscall"] == "socket"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(socket["verdict"], "looser", "{socket}");
    // A profile and itself: the same, exit 0.
    let o = hatchery_cmd(&["profile", "diff", "strict", "strict", "--json"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert_eq!(json(&stdout(&o))["verdict"], "same");
}

#[test]
fn lint_findings_carry_severities_and_accepted_ones_do_not_fail() {
    // compat reports ptrace, a warning.
    let o = hatchery_cmd(&["profile", "lint", "compat", "--json"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert_eq!(
        ids_and_severities(&json(&stdout(&o))),
        [("ptrace".to_string(), "warning".to_string(), false)]
    );
    // Accepted on the command line: still reported, exit 0.
    let o = hatchery_cmd(&["profile", "lint", "compat", "--accept", "ptrace", "--json"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert_eq!(
        ids_and_severities(&json(&stdout(&o))),
        [("ptrace".to_string(), "warning".to_string(), true)]
    );
    // Below the threshold: reported, exit 0; at it: exit 1.
    let o = hatchery_cmd(&["profile", "lint", "compat", "--fail-on", "error"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert!(stdout(&o).contains("warning [ptrace]"), "{}", stdout(&o));
    let o = hatchery_cmd(&["profile", "lint", "compat", "--fail-on", "warning"]);
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    // Accepted by the profile itself.
    let dir = common::shared_tempdir();
    let head = "name = \"x\"\n[seccomp]\ndefault_action = \"errno\"\ndefault_errno = \"EPERM\"\n[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"ptrace\", \"bpf\"]\n";
    let own = write(
        dir.path(),
        "own.toml",
        &format!("{head}{RUNNABLE}[lint]\naccept = [\"ptrace\"]\n"),
    );
    let o = hatchery_cmd(&["profile", "lint", s(&own), "--json"]);
    assert_eq!(code(&o), 1, "bpf is not accepted: {}", stdout(&o));
    assert_eq!(
        ids_and_severities(&json(&stdout(&o))),
        [
            ("ptrace".to_string(), "warning".to_string(), true),
            ("bpf".to_string(), "error".to_string(), false)
        ]
    );
    let o = hatchery_cmd(&["profile", "lint", s(&own), "--accept", "bpf"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    // An id no rule has is refused, with the known ones.
    let o = hatchery_cmd(&["profile", "lint", "compat", "--accept", "ptrac"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("ptrace"), "{}", stderr(&o));
}

#[test]
fn a_reviewer_can_ignore_what_a_profile_accepts_of_itself() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("sly.toml");
    let compat = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/compat.toml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&path, format!("{compat}\n[lint]\naccept = [\"ptrace\"]\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    let p = path.to_string_lossy().to_string();
    let own = hatchery_cmd(&["profile", "lint", &p]);
    assert_eq!(code(&own), 0, "{} {}", stdout(&own), stderr(&own));
    let reviewed = hatchery_cmd(&["profile", "lint", &p, "--ignore-profile-accept"]);
    assert_eq!(
        code(&reviewed),
        1,
        "{} {}",
        stdout(&reviewed),
        stderr(&reviewed)
    );
    assert!(
        stdout(&reviewed).contains("[ptrace]"),
        "{}",
        stdout(&reviewed)
    );
}
