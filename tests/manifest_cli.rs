//! `hatchery manifest keygen|issue|verify` driven from outside, as operators and auditors
//! use them.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{code, hatchery, hatchery_cmd, run_with_timeout, stderr, stdout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Result<Scratch, std::io::Error> {
        Ok(Scratch {
            dir: tempfile::tempdir()?,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn key(&self) -> Result<PathBuf, Box<dyn std::error::Error>> {
        let key = self.path("manifest.key");
        let out = run(&["manifest", "keygen", "--key", s(&key)?]);
        assert_eq!(code(&out), 0, "keygen: {}", stderr(&out));
        Ok(key)
    }

    /// Issues a manifest with `flags` and writes it to `name`.
    fn issue(
        &self,
        key: &Path,
        flags: &[&str],
        name: &str,
    ) -> Result<PathBuf, Box<dyn std::error::Error>> {
        let mut args = vec!["manifest", "issue", "--key", s(key)?];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sh", "-c", "echo hello"]);
        let out = run(&args);
        assert_eq!(code(&out), 0, "issue: {}", stderr(&out));
        let path = self.path(name);
        std::fs::write(&path, &out.stdout)?;
        Ok(path)
    }
}

fn s(p: &Path) -> Result<&str, std::io::Error> {
    p.to_str()
        .ok_or_else(|| std::io::Error::other("test paths are UTF-8"))
}

fn run(args: &[&str]) -> Output {
    hatchery_cmd(args)
}

fn verify(manifest: &Path, key: &Path, extra: &[&str]) -> Result<Output, std::io::Error> {
    let mut args = vec!["manifest", "verify", s(manifest)?, "--key", s(key)?];
    args.extend_from_slice(extra);
    Ok(run(&args))
}

fn edit_json(
    path: &Path,
    edit: impl FnOnce(&mut serde_json::Value),
) -> Result<(), Box<dyn std::error::Error>> {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path)?)?;
    edit(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v)?)?;
    Ok(())
}

#[test]
fn keygen_writes_a_private_key_file_and_never_prints_the_secret() -> TestResult {
    let t = Scratch::new()?;
    let key = t.path("k");
    let out = run(&["manifest", "keygen", "--key", s(&key)?]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(std::fs::metadata(&key)?.permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&key)?;
    let secret = text
        .lines()
        .find_map(|l| l.strip_prefix("key "))
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or("no key line")?;
    assert_eq!(secret.len(), 64);
    assert!(!stdout(&out).contains(secret) && !stderr(&out).contains(secret));
    Ok(())
}

#[test]
fn keygen_refuses_to_overwrite_an_existing_key_file() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let before = std::fs::read(&key)?;
    let out = run(&["manifest", "keygen", "--key", s(&key)?]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("--rotate"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&key)?, before, "the key file is untouched");
    Ok(())
}

#[test]
fn an_issued_manifest_verifies() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let m = t.issue(
        &key,
        &["--memory", "128M", "--cpus", "0.25", "--ro", "/usr"],
        "m.json",
    )?;
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&m)?)?;
    assert_eq!(v["resources"]["memory_limit_mb"], 128);
    assert_eq!(v["resources"]["cpu_limit"], 0.25);
    assert_eq!(v["filesystem"]["read_only"][0], "/usr");
    assert_eq!(v["depth"], 0);
    let out = verify(&m, &key, &[])?;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).starts_with("valid:"), "{}", stdout(&out));
    Ok(())
}

#[test]
fn a_tampered_manifest_fails_verification_naming_the_check() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let m = t.issue(&key, &[], "m.json")?;
    edit_json(&m, |v| {
        v["resources"]["memory_limit_mb"] = serde_json::json!(65536)
    })?;
    let out = verify(&m, &key, &[])?;
    assert_eq!(code(&out), 1);
    assert!(
        stdout(&out).starts_with("invalid: signature"),
        "{}",
        stdout(&out)
    );
    Ok(())
}

#[test]
fn the_json_verdict_names_the_failed_check_and_audit_event() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let m = t.issue(&key, &["--expires-in", "1m"], "m.json")?;
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs()
        + 3600;
    let out = verify(&m, &key, &["--json", "--now", &later.to_string()])?;
    assert_eq!(code(&out), 1);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(v["valid"], false);
    assert_eq!(v["check"], "expires_at");
    assert_eq!(v["event"], "reject_manifest_expired");
    Ok(())
}

#[test]
fn unknown_fields_and_non_json_are_format_errors() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let m = t.issue(&key, &[], "m.json")?;
    edit_json(&m, |v| v["admin"] = serde_json::json!(true))?;
    let garbage = t.path("garbage");
    std::fs::write(&garbage, b"\xff\x00 not a manifest")?;
    for file in [&m, &garbage] {
        let out = verify(file, &key, &["--json"])?;
        assert_eq!(code(&out), 1);
        let v: serde_json::Value = serde_json::from_str(&stdout(&out))?;
        assert_eq!(v["check"], "format", "{v}");
    }
    Ok(())
}

#[test]
fn a_missing_signature_is_reported_as_such() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let m = t.issue(&key, &[], "m.json")?;
    edit_json(&m, |v| {
        if let Some(o) = v.as_object_mut() {
            o.remove("signature");
        }
    })?;
    let out = verify(&m, &key, &[])?;
    assert_eq!(code(&out), 1);
    assert!(stdout(&out).contains("missing"), "{}", stdout(&out));
    Ok(())
}

#[test]
fn a_key_file_others_can_read_is_refused() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let m = t.issue(&key, &[], "m.json")?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644))?;
    let out = verify(&m, &key, &[])?;
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("chmod 600"), "{}", stderr(&out));
    let out = run(&["manifest", "issue", "--key", s(&key)?, "--", "true"]);
    assert_eq!(code(&out), 2);
    assert!(out.stdout.is_empty(), "nothing is issued");
    Ok(())
}

#[test]
fn a_missing_key_file_error_says_how_to_make_one() -> TestResult {
    let t = Scratch::new()?;
    let missing = t.path("none.key");
    let out = run(&["manifest", "issue", "--key", s(&missing)?, "--", "true"]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("manifest keygen"), "{}", stderr(&out));
    assert!(!missing.exists(), "issue never creates a key");
    Ok(())
}

#[test]
fn a_manifest_signed_before_a_rotation_still_verifies() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let old = t.issue(&key, &[], "old.json")?;
    let out = run(&["manifest", "keygen", "--key", s(&key)?, "--rotate"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("2 keys"), "{}", stdout(&out));
    let new = t.issue(&key, &[], "new.json")?;
    let key_id = |p: &Path| -> Result<String, Box<dyn std::error::Error>> {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p)?)?;
        Ok(v["key_id"].as_str().unwrap_or_default().to_string())
    };
    assert_ne!(key_id(&old)?, key_id(&new)?);
    for m in [&old, &new] {
        assert_eq!(code(&verify(m, &key, &[])?), 0);
    }
    Ok(())
}

#[test]
fn a_manifest_from_another_keyring_is_refused() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let other = t.path("other.key");
    assert_eq!(code(&run(&["manifest", "keygen", "--key", s(&other)?])), 0);
    let m = t.issue(&other, &[], "m.json")?;
    let out = verify(&m, &key, &["--json"])?;
    assert_eq!(code(&out), 1);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(v["check"], "key_id");
    Ok(())
}

#[test]
fn issue_refuses_absurd_limits_and_prints_nothing() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    for flags in [
        &["--memory", "99999T"][..],
        &["--memory", "1500K"],
        &["--cpus", "-1"],
        &["--cpus", "0.0001"],
        &["--pids", "0"],
        &["--timeout", "400d"],
        &["--ro", "relative/../path"],
        &["--rw", "/srv/../etc"],
        &["--profile", "/tmp/p.toml"],
        &["--depth", "2"],
        &["--parent", "w-p", "--depth", "0"],
        &["--expires-in", "60d"],
        &["--env", "NO EQUALS"],
        &["--pids", "1"],
    ] {
        let mut args = vec!["manifest", "issue", "--key", s(&key)?];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "true"]);
        let out = run(&args);
        assert_eq!(code(&out), 2, "{flags:?} accepted: {}", stdout(&out));
        assert!(out.stdout.is_empty(), "{flags:?}");
        assert!(!stderr(&out).is_empty(), "{flags:?}: no reason given");
    }
    Ok(())
}

#[test]
fn a_child_manifest_carries_its_lineage() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let m = t.issue(
        &key,
        &[
            "--worker-id",
            "w-child",
            "--parent",
            "w-root",
            "--depth",
            "1",
        ],
        "m.json",
    )?;
    let out = verify(&m, &key, &["--json"])?;
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(v["worker_id"], "w-child");
    assert_eq!(v["parent_id"], "w-root");
    assert_eq!(v["depth"], 1);
    Ok(())
}

#[test]
fn verify_reads_a_manifest_from_stdin() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let m = t.issue(&key, &[], "m.json")?;
    let script = format!(
        "exec \"$0\" manifest verify - --key '{}' < '{}'",
        s(&key)?,
        s(&m)?
    );
    let out = run_with_timeout(
        Command::new("sh").arg("-c").arg(script).arg(hatchery()),
        Duration::from_secs(60),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).starts_with("valid:"));
    Ok(())
}

#[test]
fn every_manifest_subcommand_has_help_with_an_example() {
    for sub in [
        &["manifest", "--help"][..],
        &["manifest", "keygen", "--help"],
        &["manifest", "issue", "--help"],
        &["manifest", "verify", "--help"],
        &["manifest", "contract", "--help"],
    ] {
        let out = run(sub);
        assert_eq!(code(&out), 0, "{sub:?}");
        assert!(stdout(&out).contains("Examples:"), "{sub:?}");
        assert!(stdout(&out).contains("hatchery manifest"), "{sub:?}");
    }
}

/// An input file that is a FIFO blocked the command until someone wrote to it (for ever),
/// and `/dev/zero` as a state file was read until memory ran out: every input is a regular
/// file, read up to its limit, or refused at once with what it is.
#[test]
fn inputs_that_are_fifos_or_devices_are_refused_at_once() -> TestResult {
    let dir = Scratch::new()?;
    let key = dir.key()?;
    let fifo = dir.path("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    let within = |args: &[&str]| {
        run_with_timeout(Command::new(hatchery()).args(args), Duration::from_secs(20))
    };
    let (key, fifo) = (s(&key)?, s(&fifo)?);
    let issue_with = |state| {
        vec![
            "manifest",
            "issue",
            "--key",
            key,
            "--state-file",
            state,
            "--",
            "true",
        ]
    };
    let cases: [Vec<&str>; 5] = [
        vec!["manifest", "verify", fifo, "--key", key],
        vec!["manifest", "contract", fifo],
        vec!["profile", "show", fifo],
        issue_with(fifo),
        issue_with("/dev/zero"),
    ];
    for args in cases {
        let out = within(&args);
        assert_ne!(code(&out), 0, "{args:?}: {}", stdout(&out));
        let said = stderr(&out);
        assert!(
            said.contains("is a FIFO, not a regular file")
                || said.contains("is a device, not a regular file"),
            "{args:?}: {said}"
        );
    }
    Ok(())
}

/// A manifest from someone else is hostile text: its verdict quotes it, on one line of a
/// bounded length, with nothing that drives a terminal, in `--json` as in text (an 8-bit
/// CSI and a bidi override came out raw in `--json`, and a 2 MB key came out whole).
#[test]
fn a_verdict_quoting_a_hostile_manifest_is_escaped_and_bounded() -> TestResult {
    let t = Scratch::new()?;
    let key = t.key()?;
    let m = t.path("hostile.json");
    let long = "k".repeat(500_000);
    std::fs::write(
        &m,
        format!("{{\"\\u009b2J\\u202eFAKE valid: true\\u202c\\u200b{long}\": 1}}"),
    )?;
    for flags in [&["--json"][..], &[][..]] {
        let out = verify(&m, &key, flags)?;
        assert_eq!(code(&out), 1, "{}", stderr(&out));
        let text = stdout(&out);
        assert!(text.len() < 4096, "{flags:?}: {} bytes", text.len());
        assert_eq!(text.lines().count(), 1, "{flags:?}: {text}");
        for raw in ['\u{9b}', '\u{202e}', '\u{200b}'] {
            assert!(!text.contains(raw), "{flags:?}: raw {raw:?} in {text}");
        }
        if flags == ["--json"] {
            let v: serde_json::Value = serde_json::from_str(&text)?;
            assert_eq!(v["valid"], false, "{v}");
        }
    }
    Ok(())
}
