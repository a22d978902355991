//! The kernel agrees with `profile check`: for every shipped profile, a real sandbox runs
//! raw syscalls (the probe's `syscall NR ARGS...`) and the kernel's answer must be the one
//! `profile check --json` gives (the profile's filter and the seccomp floor together) —
//! the errno it names, a SIGSYS kill, or, for an allowed call, exactly what the same call
//! returns in a sandbox whose profile has no filter rules.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{code, hatchery_cmd, run_probe, stderr, stdout};

/// Exit status of a process killed by SIGSYS.
const KILLED_BY_SIGSYS: i32 = 128 + libc::SIGSYS;

/// Calls that are harmless with the arguments given even if a filter wrongly let them
/// through (no forks, no blocking, nothing outside the sandbox changes), covering allowed
/// and denied verdicts of every shipped profile.
const SAMPLE: &[(&str, &[&str])] = &[
    ("getpid", &[]),
    ("getuid", &[]),
    ("getcwd", &[]),
    ("uname", &[]),
    ("read", &["0", "0", "0"]),
    ("mkdir", &[]),
    ("kill", &["0", "0"]),
    ("socket", &[]),
    ("socket", &["40"]),
    ("personality", &["0xffffffff"]),
    ("personality", &["0x400000"]),
    ("ioctl", &["0", "0x5412"]),
    ("ioctl", &["0", "0x5401"]),
    ("ioctl", &["0", "0x100005412"]),
    ("clone", &["0x10000000"]),
    ("clone3", &[]),
    ("unshare", &["0x10000000"]),
    ("setns", &[]),
    ("mount", &[]),
    ("umount2", &[]),
    ("pivot_root", &[]),
    ("chroot", &[]),
    ("keyctl", &[]),
    ("add_key", &[]),
    ("bpf", &[]),
    ("perf_event_open", &[]),
    ("userfaultfd", &[]),
    ("io_uring_setup", &[]),
    ("ptrace", &["0xffff"]),
    ("process_vm_readv", &[]),
    ("kexec_load", &[]),
    ("init_module", &[]),
    ("iopl", &["0"]),
    ("open_by_handle_at", &["0xffffffff"]),
    ("reboot", &[]),
    ("swapon", &[]),
    ("syslog", &["0xffff"]),
    ("modify_ldt", &["0xffff"]),
    ("sethostname", &["0", "0xffffffff"]),
    ("fsopen", &[]),
    // The seccomp floor's rules: vsock (also with the upper half set), netlink protocols,
    // TIOCLINUX, a set-uid mode (04755 = 2541), openat2.
    ("socket", &["40", "1"]),
    ("socket", &["0xffffffff00000028", "1"]),
    ("socket", &["16", "3", "2"]),
    ("socket", &["16", "3", "0"]),
    ("ioctl", &["0", "0x541c"]),
    ("chmod", &["0", "2541"]),
    ("fchmodat", &["0xffffff9c", "0", "2541"]),
    ("openat2", &[]),
];

fn json(text: &str) -> serde_json::Value {
    match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => panic!("not JSON ({e}): {text}"),
    }
}

/// A profile with no rules, so a call's natural result can be seen in the same sandbox.
fn permissive(dir: &Path) -> String {
    let default = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/default.toml"),
    )
    .unwrap_or_default();
    let tail = default
        .find("[landlock]")
        .map(|i| &default[i..])
        .unwrap_or("");
    let text = format!("name = \"permissive\"\n[seccomp]\ndefault_action = \"allow\"\n\n{tail}");
    let path = dir.join("permissive.toml");
    if let Err(e) = std::fs::write(&path, text) {
        panic!("write {}: {e}", path.display());
    }
    path.display().to_string()
}

/// `profile check --json` for one call; returns (action, errno, nr).
fn verdict(profile: &str, arch: &str, name: &str, args: &[&str]) -> (String, Option<i64>, i64) {
    let mut cmd = vec![
        "profile",
        "check",
        profile,
        "--syscall",
        name,
        "--json",
        "--arch",
        arch,
    ];
    for a in args {
        cmd.push("--arg");
        cmd.push(a);
    }
    let o = hatchery_cmd(&cmd);
    assert_eq!(code(&o), 0, "check {profile} {name}: {}", stderr(&o));
    let v = json(&stdout(&o));
    let entry = v
        .as_object()
        .and_then(|m| m.values().next().cloned())
        .unwrap_or_default();
    (
        entry["action"].as_str().unwrap_or("?").to_string(),
        entry["errno"].as_i64(),
        entry["nr"].as_i64().unwrap_or(-1),
    )
}

#[test]
fn every_shipped_profile_is_enforced_as_check_says() {
    if common::skip_unless_root("every_shipped_profile_is_enforced_as_check_says") {
        return;
    }
    let dir = common::shared_tempdir();
    let reference = permissive(dir.path());
    let mut natural: BTreeMap<String, (i32, String)> = BTreeMap::new();
    let mut checked = BTreeMap::<String, (usize, usize)>::new();
    for (profile, _) in hatchery::profile::BUILTIN {
        for (name, args) in SAMPLE {
            if hatchery::profile::abi::Abi::native()
                .syscall_nr(name)
                .is_none()
            {
                continue; // not a syscall of this machine's ABI (iopl, modify_ldt off x86)
            }
            let (action, errno, nr) = verdict(profile, "native", name, args);
            let nr = nr.to_string();
            let mut probe_args = vec!["syscall", nr.as_str()];
            probe_args.extend_from_slice(args);
            let o = run_probe(&["--profile", profile], &probe_args);
            let (got_code, got) = (code(&o), stdout(&o));
            let what = format!("{profile}: {name}{args:?} (check says {action} {errno:?})");
            let counts = checked.entry(profile.to_string()).or_default();
            match action.as_str() {
                "errno" => {
                    assert_eq!(
                        got,
                        format!("err {}", errno.unwrap_or(-1)),
                        "{what}: {}",
                        stderr(&o)
                    );
                    counts.1 += 1;
                }
                "kill" | "trap" => {
                    assert_eq!(got_code, KILLED_BY_SIGSYS, "{what}: {got} {}", stderr(&o));
                    assert!(got.is_empty(), "{what}: {got}");
                    counts.1 += 1;
                }
                "allow" | "log" => {
                    let key = format!("{name}{args:?}");
                    let (want_code, want) = natural
                        .entry(key)
                        .or_insert_with(|| {
                            let r = run_probe(&["--profile", &reference], &probe_args);
                            (code(&r), stdout(&r))
                        })
                        .clone();
                    assert_eq!(
                        (got_code, &got),
                        (want_code, &want),
                        "{what}: {}",
                        stderr(&o)
                    );
                    counts.0 += 1;
                }
                other => panic!("{what}: unexpected action {other}"),
            }
        }
    }
    // The sample must exercise both sides of every profile.
    for (profile, (allowed, denied)) in &checked {
        assert!(
            *allowed >= 4 && *denied >= 10,
            "{profile}: {allowed} allowed, {denied} denied"
        );
    }
}

#[test]
fn other_abis_are_killed_as_check_says() {
    if common::skip_unless_root("other_abis_are_killed_as_check_says") {
        return;
    }
    if hatchery::profile::abi::Abi::native() != hatchery::profile::abi::Abi::X86_64 {
        eprintln!("SKIP other_abis_are_killed_as_check_says: needs x86_64");
        return;
    }
    for (profile, _) in hatchery::profile::BUILTIN {
        for (arch, probe_cmd) in [("x86", "i386"), ("x32", "x32")] {
            let (action, _, nr) = verdict(profile, arch, "getpid", &[]);
            assert_eq!(action, "kill", "{profile} {arch}");
            // The probe adds the x32 bit itself.
            let nr = if arch == "x32" { nr & 0x3fff_ffff } else { nr };
            let o = run_probe(&["--profile", profile], &[probe_cmd, &nr.to_string()]);
            assert_eq!(
                code(&o),
                KILLED_BY_SIGSYS,
                "{profile} {arch}: {}",
                stdout(&o)
            );
        }
    }
}

#[test]
fn strict_runs_python_and_shell_scripts() {
    if common::skip_unless_root("strict_runs_python_and_shell_scripts") {
        return;
    }
    let py = "import json, os, subprocess, tempfile, threading, hashlib\n\
              d = tempfile.mkdtemp()\n\
              p = os.path.join(d, 'a.json')\n\
              open(p, 'w').write(json.dumps({'n': [1, 2, 3]}))\n\
              t = threading.Thread(target=lambda: None); t.start(); t.join()\n\
              out = subprocess.run(['sh', '-c', 'echo from-sh'], capture_output=True, text=True).stdout.strip()\n\
              print(sum(json.load(open(p))['n']), out, hashlib.sha256(b'x').hexdigest()[:8])\n";
    let o = hatchery_cmd(&["run", "--profile", "strict", "--", "python3", "-c", py]);
    assert_eq!(code(&o), 0, "{} {}", stdout(&o), stderr(&o));
    assert_eq!(stdout(&o), "6 from-sh 2d711642");

    let sh = "set -e; cd /tmp; printf 'b\\na\\nb\\n' > f; sort f | uniq | tr a-z A-Z | paste -sd, -; \
              cp f g; mv g h; ls | wc -l; grep -c b h; sed -n 2p h; head -c 1 h; echo; \
              mkdir -p d/e; find d | sort | tail -n 1; rm -r d; stat -c %s f; date +%Y >/dev/null; \
              sha256sum f | cut -c1-8; id -u";
    let o = hatchery_cmd(&["run", "--profile", "strict", "--", "sh", "-c", sh]);
    assert_eq!(code(&o), 0, "{} {}", stdout(&o), stderr(&o));
    assert_eq!(stdout(&o), "A,B\n2\n2\na\nb\nd/e\n6\n7cafa1b2\n0");
}

#[test]
fn strict_refuses_sockets_and_namespaces_inside_the_sandbox() {
    if common::skip_unless_root("strict_refuses_sockets_and_namespaces_inside_the_sandbox") {
        return;
    }
    let o = run_probe(&["--profile", "strict"], &["tcp", "127.0.0.1", "1"]);
    assert_eq!(stdout(&o), format!("err {}", libc::EPERM));
    let o = run_probe(&["--profile", "strict"], &["unshare-user"]);
    assert_eq!(stdout(&o), format!("err {}", libc::EPERM));
}

#[test]
fn the_report_names_the_profile_file_and_its_hash() {
    if common::skip_unless_root("the_report_names_the_profile_file_and_its_hash") {
        return;
    }
    let dir = common::shared_tempdir();
    let path = dir.path().join("mine.toml");
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/strict.toml"))
            .unwrap_or_default()
            .replace("name = \"strict\"", "name = \"mine\"");
    if let Err(e) = std::fs::write(&path, &text) {
        panic!("write: {e}");
    }
    let report = dir.path().join("report.json");
    let o = hatchery_cmd(&[
        "run",
        "--profile",
        path.to_str().unwrap_or_default(),
        "--report",
        report.to_str().unwrap_or_default(),
        "--",
        "true",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&std::fs::read_to_string(&report).unwrap_or_default());
    assert_eq!(v["profile"]["name"], "mine");
    assert_eq!(
        v["profile"]["sha256"].as_str(),
        Some(hatchery::profile::sha256_hex(text.as_bytes()).as_str())
    );

    let o = hatchery_cmd(&[
        "run",
        "--profile",
        "compat",
        "--report",
        report.to_str().unwrap_or_default(),
        "--",
        "true",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&std::fs::read_to_string(&report).unwrap_or_default());
    assert_eq!(v["profile"]["name"], "compat");
    let listed = stdout(&hatchery_cmd(&["profile", "list"]));
    let prefix = v["profile"]["sha256"]
        .as_str()
        .map(|h| h[..12].to_string())
        .unwrap_or_default();
    assert!(listed.contains(&prefix), "{listed} / {prefix}");
}
