//! `hatchery profile ...` as a user drives it: every subcommand, its output formats and
//! exit statuses, and bad input refused with the place named and nothing run.

mod common;

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use common::files::{json, s, write};
use common::{code, hatchery_cmd, stderr, stdout};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn list_names_every_shipped_profile_with_its_hash() {
    let o = hatchery_cmd(&["profile", "list"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    for name in ["default", "strict", "compat"] {
        assert!(
            out.lines().any(|l| l.starts_with(name)),
            "{name} missing: {out}"
        );
    }
    assert_eq!(out.lines().count(), 3);
}

#[test]
fn show_prints_every_format() {
    for (format, needle) in [
        ("table", "rule 1"),
        ("toml", "[[seccomp.rule]]"),
        ("oci-json", "SCMP_ACT_ERRNO"),
        ("pfc", "pseudo filter code"),
        ("bpf", "ret KILL_PROCESS"),
    ] {
        let o = hatchery_cmd(&["profile", "show", "default", "--format", format]);
        assert_eq!(code(&o), 0, "{format}: {}", stderr(&o));
        assert!(stdout(&o).contains(needle), "{format}: {}", stdout(&o));
    }
}

#[test]
fn show_lists_the_floor_as_such_and_every_format_says_it_is_loaded_too() {
    for name in ["default", "strict", "compat"] {
        let o = hatchery_cmd(&["profile", "show", name]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let out = stdout(&o);
        assert!(
            out.contains("floor       the seccomp floor, applied under every profile"),
            "{out}"
        );
        assert!(out.contains("floor rule 1 "), "{out}");
        assert!(out.contains("CVE-2017-5226"), "{out}");
        assert!(out.contains("(under an executable allowlist)"), "{out}");
    }
    for format in ["bpf", "pfc"] {
        let o = hatchery_cmd(&["profile", "show", "compat", "--format", format]);
        assert!(
            stdout(&o).contains("the seccomp floor is loaded in addition"),
            "{format}: {}",
            stdout(&o)
        );
    }
    let o = hatchery_cmd(&["profile", "show", "compat", "--format", "oci-json"]);
    assert!(
        stderr(&o).contains("the seccomp floor is loaded in addition"),
        "{}",
        stderr(&o)
    );
    json(&stdout(&o));
}

#[test]
fn check_names_the_floor_rule_when_the_floor_decides() {
    // compat allows every ioctl (rule 1); the floor refuses TIOCSTI.
    let o = hatchery_cmd(&[
        "profile",
        "check",
        "compat",
        "--syscall",
        "ioctl",
        "--arg",
        "0",
        "--arg",
        "TIOCSTI",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("errno EPERM (1)"), "{out}");
    assert!(out.contains("decided by floor rule "), "{out}");
    assert!(out.contains("CVE-2017-5226"), "{out}");
    assert!(
        out.contains("the profile alone gives allow (rule 1)"),
        "{out}"
    );

    let o = hatchery_cmd(&[
        "profile",
        "check",
        "compat",
        "--syscall",
        "ioctl",
        "--arg",
        "0",
        "--arg",
        "TIOCSTI",
        "--json",
    ]);
    let v = json(&stdout(&o));
    assert_eq!(v["ioctl"]["action"], "errno");
    assert_eq!(v["ioctl"]["filter"], "floor");
    assert!(
        v["ioctl"]["decided_by"]
            .as_str()
            .is_some_and(|d| d.starts_with("floor rule ")),
        "{v}"
    );
    // Where the profile decides, it says so.
    let o = hatchery_cmd(&[
        "profile",
        "check",
        "default",
        "--syscall",
        "ptrace",
        "--json",
    ]);
    let v = json(&stdout(&o));
    assert_eq!(v["ptrace"]["filter"], "profile");
    // The allowlist rules apply with --exec-allowlist (or a profile's own allow_exec).
    let o = hatchery_cmd(&[
        "profile",
        "check",
        "compat",
        "--syscall",
        "memfd_create",
        "--arg",
        "0",
        "--arg",
        "8",
        "--exec-allowlist",
        "--json",
    ]);
    let v = json(&stdout(&o));
    assert_eq!(v["memfd_create"]["errno"], libc::EACCES, "{v}");
    assert_eq!(v["memfd_create"]["filter"], "floor", "{v}");
    let o = hatchery_cmd(&[
        "profile",
        "check",
        "compat",
        "--syscall",
        "memfd_create",
        "--json",
    ]);
    assert_eq!(json(&stdout(&o))["memfd_create"]["action"], "allow");
}

#[test]
fn shown_toml_is_a_profile_that_loads_with_the_same_verdicts() {
    let dir = common::shared_tempdir();
    let o = hatchery_cmd(&["profile", "show", "strict", "--format", "toml"]);
    let path = write(dir.path(), "strict-copy.toml", &stdout(&o));
    let d = hatchery_cmd(&["profile", "diff", "strict", s(&path)]);
    assert_eq!(code(&d), 0, "{} {}", stdout(&d), stderr(&d));
}

#[test]
fn check_reports_the_deciding_rule_and_json_verdicts() {
    let o = hatchery_cmd(&["profile", "check", "default", "--syscall", "ptrace"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("errno EPERM"), "{}", stdout(&o));
    assert!(stdout(&o).contains("rule"), "{}", stdout(&o));

    let o = hatchery_cmd(&[
        "profile",
        "check",
        "default",
        "--syscall",
        "clone",
        "--arg",
        "CLONE_NEWUSER",
        "--json",
    ]);
    let v = json(&stdout(&o));
    assert_eq!(v["clone"]["action"], "errno");
    assert_eq!(v["clone"]["errno"], 1);
    assert_eq!(v["clone"]["conditional"], true);

    let o = hatchery_cmd(&[
        "profile",
        "check",
        "default",
        "--syscall",
        "getpid",
        "--json",
    ]);
    let v = json(&stdout(&o));
    assert_eq!(v["getpid"]["action"], "allow");
    assert_eq!(v["getpid"]["conditional"], false);
}

#[test]
fn check_says_the_native_filter_kills_other_abis() {
    for arch in ["x86", "x32"] {
        let o = hatchery_cmd(&[
            "profile",
            "check",
            "default",
            "--syscall",
            "getpid",
            "--arch",
            arch,
            "--json",
        ]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let v = json(&stdout(&o));
        assert_eq!(v["getpid"]["action"], "kill", "{arch}");
        assert_eq!(v["getpid"]["decided_by"], "bad_arch_action", "{arch}");
    }
}

#[test]
fn check_all_lists_every_syscall_of_the_architecture() {
    let o = hatchery_cmd(&["profile", "check", "strict", "--all", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&stdout(&o));
    let map = v.as_object().map(|m| m.len()).unwrap_or(0);
    assert!(map > 300, "{map} syscalls");
    assert_eq!(v["read"]["action"], "allow");
    assert_eq!(v["socket"]["action"], "errno");
    assert_eq!(v["clone3"]["errno"], libc::ENOSYS);
    assert_eq!(v["ioctl"]["conditional"], true);
}

#[test]
fn lint_is_clean_on_default_and_strict_and_fails_on_dangerous_profiles() {
    for name in ["default", "strict"] {
        let o = hatchery_cmd(&["profile", "lint", name]);
        assert_eq!(code(&o), 0, "{name}: {}", stdout(&o));
    }
    let dir = common::shared_tempdir();
    let p = write(
        dir.path(),
        "loose.toml",
        "name = \"loose\"\n[seccomp]\ndefault_action = \"allow\"\nbad_arch_action = \"allow\"\n",
    );
    let o = hatchery_cmd(&["profile", "lint", s(&p), "--json"]);
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    let ids: Vec<String> = json(&stdout(&o))
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f["id"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    for id in [
        "ptrace",
        "bpf",
        "mount",
        "unshare",
        "clone-namespaces",
        "keyctl",
        "userfaultfd",
        "perf_event_open",
        "personality",
        "foreign-abi",
    ] {
        assert!(ids.iter().any(|i| i == id), "{id} not in {ids:?}");
    }
    // The floor under every profile refuses TIOCSTI, TIOCLINUX and io_uring: no finding.
    for id in ["ioctl-tiocsti", "ioctl-tioclinux", "io_uring"] {
        assert!(!ids.iter().any(|i| i == id), "{id} in {ids:?}");
    }
    // compat keeps one of Docker's choices that lint reports: ptrace.
    let o = hatchery_cmd(&["profile", "lint", "compat", "--json"]);
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    let ids: Vec<String> = json(&stdout(&o))
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f["id"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(ids, ["ptrace"]);
}

#[test]
fn diff_shows_verdict_and_landlock_differences() {
    let o = hatchery_cmd(&["profile", "diff", "default", "strict"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stdout(&o).contains("socket"), "{}", stdout(&o));

    let dir = common::shared_tempdir();
    let base = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/default.toml"),
    )
    .unwrap_or_default();
    let changed = base.replace("write = [\"/tmp\", \"/dev\"]", "write = [\"/tmp\"]");
    assert_ne!(base, changed);
    let p = write(dir.path(), "changed.toml", &changed);
    let o = hatchery_cmd(&["profile", "diff", "default", s(&p), "--json"]);
    assert_eq!(code(&o), 1);
    let v = json(&stdout(&o));
    assert_eq!(v["syscalls"].as_array().map(Vec::len), Some(0));
    assert!(
        v["settings"]
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s["key"] == "landlock.write")),
        "{v}"
    );
}

#[test]
fn docker_import_export_import_gives_the_same_verdict_for_every_syscall() {
    let dir = common::shared_tempdir();
    let first = dir.path().join("docker.toml");
    let o = hatchery_cmd(&[
        "profile",
        "import",
        s(&fixture("docker-default-seccomp.json")),
        "-o",
        s(&first),
        "--kernel",
        "6.1",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("CAP_SYS_ADMIN"),
        "notes expected: {}",
        stderr(&o)
    );

    let exported = dir.path().join("docker-again.json");
    let o = hatchery_cmd(&["profile", "export", s(&first), "-o", s(&exported)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let second = dir.path().join("docker-again.toml");
    let o = hatchery_cmd(&[
        "profile",
        "import",
        s(&exported),
        "-o",
        s(&second),
        "--kernel",
        "6.1",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    for arch in ["x86_64", "x86", "x32"] {
        let a = hatchery_cmd(&[
            "profile",
            "check",
            s(&first),
            "--all",
            "--json",
            "--arch",
            arch,
        ]);
        let b = hatchery_cmd(&[
            "profile",
            "check",
            s(&second),
            "--all",
            "--json",
            "--arch",
            arch,
        ]);
        assert_eq!(code(&a), 0, "{}", stderr(&a));
        let (va, vb) = (json(&stdout(&a)), json(&stdout(&b)));
        let keys = |v: &serde_json::Value| {
            v.as_object()
                .map(|m| m.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert_eq!(keys(&va), keys(&vb), "{arch}");
        for k in keys(&va) {
            for field in ["action", "errno", "conditional"] {
                assert_eq!(va[&k][field], vb[&k][field], "{arch} {k} {field}");
            }
        }
    }
    let d = hatchery_cmd(&["profile", "diff", s(&first), s(&second)]);
    assert_eq!(code(&d), 0, "{}", stdout(&d));
}

#[test]
fn bad_profiles_are_refused_naming_the_place() {
    let dir = common::shared_tempdir();
    let cases: &[(&str, &str, &str)] = &[
        (
            "malformed.toml",
            "name = \"x\"\n[seccomp\n",
            "malformed.toml:2:",
        ),
        (
            "unknown-key.toml",
            "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\nbogus = 1\n",
            "unknown-key.toml:4:",
        ),
        (
            "unknown-syscall.toml",
            "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n[[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"no_such_call\"]\n",
            "unknown-syscall.toml:6:",
        ),
        (
            "unknown-action.toml",
            "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n[[seccomp.rule]]\naction = \"explode\"\nsyscalls = [\"ptrace\"]\n",
            "unknown-action.toml:5:",
        ),
        (
            "contradiction.toml",
            "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n[[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"ptrace\"]\n[[seccomp.rule]]\naction = \"errno\"\nerrno = 1\nsyscalls = [\"ptrace\"]\n",
            "contradicts",
        ),
    ];
    for (name, text, want) in cases {
        let p = write(dir.path(), name, text);
        for args in [
            vec!["profile", "show", s(&p)],
            vec!["profile", "check", s(&p), "--syscall", "read"],
            vec!["profile", "lint", s(&p)],
        ] {
            let o = hatchery_cmd(&args);
            assert_eq!(code(&o), 2, "{name} {args:?}: {}", stdout(&o));
            let err = stderr(&o);
            assert!(err.contains(want), "{name}: {err}");
            assert_eq!(err.lines().count(), 1, "one line: {err}");
        }
    }
    let huge = write(dir.path(), "huge.toml", &"#".repeat((1 << 20) + 1));
    let o = hatchery_cmd(&["profile", "show", s(&huge)]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("too large"), "{}", stderr(&o));

    let bad_json = write(
        dir.path(),
        "bad.json",
        "{\n  \"defaultAction\": \"SCMP_ACT_ALLOW\",\n  \"syscalls\": [{\"names\": [\"ptrace\"], \"action\": \"SCMP_ACT_NOPE\"}]\n}\n",
    );
    let o = hatchery_cmd(&["profile", "import", s(&bad_json)]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("line 3"), "{}", stderr(&o));

    let o = hatchery_cmd(&["profile", "check", "default", "--syscall", "no_such_call"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("no_such_call"), "{}", stderr(&o));
}

#[test]
fn a_bad_profile_runs_nothing() {
    if common::skip_unless_root("a_bad_profile_runs_nothing") {
        return;
    }
    let dir = common::shared_tempdir();
    let bad = write(
        dir.path(),
        "bad.toml",
        "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n[[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"no_such_call\"]\n",
    );
    let marker = dir.path().join("ran");
    let o = hatchery_cmd(&[
        "run",
        "--profile",
        s(&bad),
        "--rw",
        s(dir.path()),
        "--",
        "sh",
        "-c",
        &format!("touch {}", marker.display()),
    ]);
    // A profile that cannot be read is bad input, refused before anything starts.
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("no_such_call"), "{}", stderr(&o));
    assert!(!marker.exists(), "the command ran");
}

/// `-o` writes a file, or into a device, and replaces nothing else: a symlink is neither
/// followed nor replaced (as root, `-o /dev/stdout` replaced the system's `/dev/stdout`
/// with a file, and `-o /dev/null` `/dev/null`), a FIFO is refused.
#[test]
fn export_writes_into_a_device_and_replaces_no_symlink_fifo_or_device() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let at = |n: &str| dir.path().join(n);
    std::fs::write(at("target.txt"), "mine").unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink("target.txt", at("link.json")).unwrap_or_else(|e| panic!("{e}"));
    let export = |to: &Path| hatchery_cmd(&["profile", "export", "strict", "-o", s(to)]);

    let o = export(&at("link.json"));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("is a symlink"), "{}", stderr(&o));
    let link = std::fs::symlink_metadata(at("link.json")).unwrap_or_else(|e| panic!("{e}"));
    assert!(link.file_type().is_symlink(), "the symlink was replaced");
    assert_eq!(
        std::fs::read_to_string(at("target.txt")).unwrap_or_default(),
        "mine"
    );

    nix::unistd::mkfifo(&at("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o600))
        .unwrap_or_else(|e| panic!("{e}"));
    let o = export(&at("fifo"));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("is a FIFO"), "{}", stderr(&o));
    let fifo = std::fs::symlink_metadata(at("fifo")).unwrap_or_else(|e| panic!("{e}"));
    assert!(fifo.file_type().is_fifo(), "the FIFO was replaced");

    // A device is written into: a null device made here stays one.
    let null = at("null");
    let made = nix::sys::stat::mknod(
        &null,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        libc::makedev(1, 3),
    );
    if made.is_ok() {
        let o = export(&null);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let st = std::fs::symlink_metadata(&null).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            st.file_type().is_char_device(),
            "the device was replaced by a file"
        );
    } else {
        eprintln!("(no device node here: {made:?}; the device case is not checked)");
    }

    // A symlink to this process's own stdout is stdout (what /dev/stdout is).
    std::os::unix::fs::symlink("/proc/self/fd/1", at("stdout")).unwrap_or_else(|e| panic!("{e}"));
    let o = export(&at("stdout"));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("defaultAction"), "{}", stdout(&o));
    assert!(std::fs::symlink_metadata(at("stdout")).is_ok_and(|m| m.file_type().is_symlink()));
}

/// A profile is reviewed on a terminal (`lint --ignore-profile-accept` exists for
/// profiles someone else wrote): its name, description and reasons may not carry
/// characters that drive the terminal or reorder text, and a path or value quoted in an
/// error is shown escaped.
#[test]
fn a_profiles_text_never_drives_the_reviewers_terminal() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cases = [
        ("name", "name = \"mine: no findings\\u001b[8m\"\n", ""),
        (
            "description",
            "name = \"x\"\ndescription = \"fine\\u202egnp.exe\"\n",
            "",
        ),
        (
            "description",
            "name = \"x\"\ndescription = \"Safe\\U000E0069\\U000E0067\"\n",
            "",
        ),
        (
            "landlock.read",
            "name = \"x\"\n",
            "[landlock]\nread = [\"/usr\", \"/tmp/\\u001b]0;PWNED\\u0007\"]\n",
        ),
    ];
    for (key, head, tail) in cases {
        let text = format!("{head}[seccomp]\ndefault_action = \"allow\"\n{tail}");
        let p = write(dir.path(), "evil.toml", &text);
        let o = hatchery_cmd(&["profile", "lint", s(&p), "--ignore-profile-accept"]);
        assert_eq!(code(&o), 2, "{key}: {}{}", stdout(&o), stderr(&o));
        let said = stderr(&o);
        assert!(said.contains(&format!("{key}: holds")), "{said}");
        let all = format!("{}{}", stdout(&o), stderr(&o));
        assert!(
            !all.contains('\u{1b}') && !all.contains('\u{202e}'),
            "{all:?}"
        );
    }
    let p = write(
        dir.path(),
        "reason.toml",
        "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n[[seccomp.rule]]\naction = \"errno\"\nerrno = \"EPERM\"\nsyscalls = [\"ptrace\"]\nreason = \"ok\\r\\nrule 99: all clear\"\n",
    );
    let o = hatchery_cmd(&["profile", "check", s(&p), "--syscall", "ptrace"]);
    assert_eq!(code(&o), 2, "{}{}", stdout(&o), stderr(&o));
    assert!(!stdout(&o).contains("rule 99"), "{}", stdout(&o));
    assert!(stderr(&o).contains("reason: holds \\r"), "{}", stderr(&o));

    // A path that is not there, quoted in the one error line, escaped.
    let o = hatchery_cmd(&["profile", "show", "/nonexistent/\u{1b}]0;T\u{7}x.toml"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(!stderr(&o).contains('\u{1b}'), "{:?}", stderr(&o));
    assert!(stderr(&o).contains("\\u{1b}]0;T"), "{}", stderr(&o));
}
