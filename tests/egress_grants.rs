//! A worker's egress grant: `--allow-host` and `--max-egress` on `manifest issue`, `spawn`
//! and `agent replicate` become the signed manifest's `network_policy.allow_hosts` and
//! `max_egress_bytes`; a child's hosts must be covered by its parent's; manifests signed
//! before these fields existed still verify.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::agents::*;
use common::controller::TestController;
use common::*;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn utf8(p: &Path) -> &str {
    p.to_str()
        .unwrap_or_else(|| panic!("{p:?}: test paths are UTF-8"))
}

fn keygen(dir: &Path) -> String {
    let key = dir.join("manifest.key");
    let out = hatchery_cmd(&["manifest", "keygen", "--key", utf8(&key)]);
    assert_eq!(code(&out), 0, "keygen: {}", stderr(&out));
    utf8(&key).to_string()
}

fn issue(key: &str, flags: &[&str]) -> std::process::Output {
    let mut args = vec!["manifest", "issue", "--key", key];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "true"]);
    hatchery_cmd(&args)
}

#[test]
fn issue_signs_allowed_hosts_and_the_egress_budget_into_the_manifest() -> TestResult {
    let dir = tempfile::tempdir()?;
    let key = keygen(dir.path());
    let out = issue(
        &key,
        &[
            "--allow-host",
            "API.Example.com:443",
            "--allow-host",
            "[2001:db8::/32]:8443",
            "--allow-host",
            "api.example.com:443",
            "--max-egress",
            "10M",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let mut m: Value = serde_json::from_slice(&out.stdout)?;
    let net = &m["resources"]["network_policy"];
    // Canonical text, in the order given, a repeat dropped.
    assert_eq!(
        net["allow_hosts"],
        json!(["api.example.com:443", "[2001:db8::/32]:8443"])
    );
    assert_eq!(net["max_egress_bytes"], json!(10 << 20));
    let path = dir.path().join("m.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&m)?)?;
    let out = hatchery_cmd(&["manifest", "verify", utf8(&path), "--key", &key]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));

    // The grant is signed: one more host, or a larger budget, and it no longer verifies.
    for (field, value) in [
        (
            "allow_hosts",
            json!([
                "api.example.com:443",
                "[2001:db8::/32]:8443",
                "evil.example.net:443"
            ]),
        ),
        ("max_egress_bytes", json!(11 << 20)),
    ] {
        let saved = m["resources"]["network_policy"][field].clone();
        m["resources"]["network_policy"][field] = value;
        std::fs::write(&path, serde_json::to_vec_pretty(&m)?)?;
        let out = hatchery_cmd(&["manifest", "verify", utf8(&path), "--key", &key]);
        assert_eq!(code(&out), 1, "{field}: {}", stdout(&out));
        assert!(
            stdout(&out).starts_with("invalid: signature"),
            "{}",
            stdout(&out)
        );
        m["resources"]["network_policy"][field] = saved;
    }
    Ok(())
}

#[test]
fn issue_refuses_hosts_it_cannot_grant_and_says_why() -> TestResult {
    let dir = tempfile::tempdir()?;
    let key = keygen(dir.path());
    for (flags, why) in [
        (&["--allow-host", "api.example.com"][..], "no port"),
        (&["--allow-host", "*.com:443"], "too broad"),
        (&["--allow-host", "api.example.com:53"], "port 53"),
        (&["--allow-host", "10.0.0.0/8:3128"], "port 3128"),
        (
            &["--allow-host", "api.example.com:443", "--max-egress", "0"],
            "greater than zero",
        ),
        (&["--max-egress", "1M"], "--allow-host"),
    ] {
        let out = issue(&key, flags);
        assert_eq!(code(&out), 2, "{flags:?} accepted: {}", stdout(&out));
        assert!(out.stdout.is_empty(), "{flags:?}");
        assert!(stderr(&out).contains(why), "{flags:?}: {}", stderr(&out));
    }
    Ok(())
}

/// A key and a manifest it signed with hatchery built before `allow_hosts` and
/// `max_egress_bytes` existed (`manifest keygen` + `manifest issue`).
const OLD_KEY_ID: &str = "k-5f48048f215a27ce";
const OLD_KEY: &str = "c7241504e39046a10678b734ec719df99140b988e11c23029c108757613376ab";
const OLD_MANIFEST: &str = r#"{
  "key_id": "k-5f48048f215a27ce",
  "worker_id": "w-compat",
  "parent_id": null,
  "depth": 0,
  "issued_at": 1795372931,
  "expires_at": 1797964931,
  "nonce": "25178fec80172dfa10d107fde9031442",
  "state_snapshot": "",
  "resources": {
    "cpu_limit": 0.5,
    "memory_limit_mb": 256,
    "pids_limit": 64,
    "timeout_ms": 300000,
    "network_policy": {
      "allow_controller": true,
      "allow_external": false
    }
  },
  "filesystem": {
    "read_only": [
      "/srv/data"
    ],
    "read_write": []
  },
  "profile": "default",
  "command": [
    "sh",
    "-c",
    "echo hi"
  ],
  "env": [],
  "cwd": null,
  "signature": "5f2af3165e419773e0429bf902f47f8ffe5757b5e2c4d7e5d74ac52f80084904"
}"#;

#[test]
fn a_manifest_signed_before_allowed_hosts_existed_still_verifies() -> TestResult {
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("old.key");
    std::fs::write(
        &key,
        format!("active {OLD_KEY_ID}\nkey {OLD_KEY_ID} {OLD_KEY}\n"),
    )?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    let path = dir.path().join("old.json");
    std::fs::write(&path, OLD_MANIFEST)?;
    let verify = || {
        hatchery_cmd(&[
            "manifest",
            "verify",
            utf8(&path),
            "--key",
            utf8(&key),
            "--now",
            "1795372932",
        ])
    };
    let out = verify();
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("valid: worker w-compat"),
        "{}",
        stdout(&out)
    );
    // And it is the signature that passes: granting a host breaks it.
    let mut m: Value = serde_json::from_str(OLD_MANIFEST)?;
    m["resources"]["network_policy"]["allow_hosts"] = json!(["api.example.com:443"]);
    std::fs::write(&path, serde_json::to_vec_pretty(&m)?)?;
    let out = verify();
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("invalid: signature"),
        "{}",
        stdout(&out)
    );
    Ok(())
}

fn inspect_json(c: &TestController, id: &str) -> Value {
    let out = c.cli(&["inspect", "--json", id]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[test]
fn spawn_allow_host_reaches_the_workers_signed_manifest() {
    if skip("spawn --allow-host") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let id = spawned(
        &c,
        &[
            "--no-controller",
            "--allow-host",
            "api.example.com:443",
            "--allow-host",
            "*.pypi.org:443",
            "--max-egress",
            "1M",
        ],
        "sleep 30",
    );
    let v = inspect_json(&c, &id);
    let net = &v["manifest"]["resources"]["network_policy"];
    assert_eq!(
        net["allow_hosts"],
        json!(["api.example.com:443", "*.pypi.org:443"]),
        "{v}"
    );
    assert_eq!(net["max_egress_bytes"], json!(1 << 20), "{v}");
    assert_eq!(v["manifest"]["signature"].as_str().map(str::len), Some(64));
    let out = c.cli(&["inspect", &id]);
    assert!(
        stdout(&out).contains("allow-hosts: api.example.com:443 *.pypi.org:443 (egress budget 1M)"),
        "{}",
        stdout(&out)
    );
    let out = c.cli(&["kill", &id]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

fn log_of(c: &TestController, id: &str) -> String {
    std::fs::read_to_string(c.state_dir().join("workers").join(format!("{id}.log")))
        .unwrap_or_default()
}

/// Waits until the worker's log holds `n` lines starting with `rc=`.
fn wait_rcs(c: &TestController, id: &str, n: usize) -> String {
    let start = Instant::now();
    loop {
        let log = log_of(c, id);
        if log.lines().filter(|l| l.starts_with("rc=")).count() >= n {
            return log;
        }
        if start.elapsed() > LONG {
            panic!("{n} replies never came:\n{log}\n{}", c.log());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_child_asking_for_a_host_its_parent_lacks_is_denied_narrowing() {
    if skip("allow_hosts narrowing") {
        return;
    }
    let c = TestController::start(&base_contract(""), &[]);
    let script = r#"hatchery agent register >/dev/null || exit 9
hatchery agent replicate --reason wider --explicit --no-controller --allow-host api.example.com:443 --allow-host evil.example.net:443 -- sleep 20
echo "rc=$?"
hatchery agent replicate --reason narrower --explicit --no-controller --allow-host api.example.com:443 -- sleep 20
echo "rc=$?"
sleep 30"#;
    let parent = spawned(
        &c,
        &["--allow-host", "*.example.com:443", "--max-egress", "1M"],
        script,
    );
    let log = wait_rcs(&c, &parent, 2);
    let rcs: Vec<&str> = log.lines().filter(|l| l.starts_with("rc=")).collect();
    assert_eq!(rcs, ["rc=3", "rc=0"], "{log}");

    let denied = c.audit("deny_narrowing");
    assert_eq!(denied.len(), 1, "{}", c.log());
    assert_eq!(denied[0]["worker_id"], parent.as_str());
    let reason = denied[0]["details"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("resources.network_policy.allow_hosts")
            && reason.contains("evil.example.net:443")
            && reason.contains("*.example.com:443"),
        "{reason}"
    );

    // The narrower child got the host it asked for and, naming no budget, its parent's.
    let v = inspect_json(&c, &parent);
    let child = v["worker"]["children"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!child.is_empty(), "{v}");
    let net = inspect_json(&c, &child)["manifest"]["resources"]["network_policy"].clone();
    assert_eq!(net["allow_hosts"], json!(["api.example.com:443"]), "{net}");
    assert_eq!(net["max_egress_bytes"], json!(1 << 20), "{net}");
    for id in [&child, &parent] {
        let _ = c.cli(&["kill", id]);
    }
}

#[test]
fn a_child_inheriting_hosts_waits_for_a_person_under_the_network_rule() {
    if skip("allow_hosts approval") {
        return;
    }
    let c = TestController::start(
        &base_contract("[approval]\nrequire = [{ kind = \"network\" }]\n"),
        &[],
    );
    let script = r#"hatchery agent register >/dev/null || exit 9
hatchery agent replicate --reason "a helper" --env BASH_ENV=/tmp/hook.sh -- sleep 20
echo "rc=$?"
sleep 30"#;
    let parent = spawned(&c, &["--allow-host", "api.example.com:443"], script);
    let start = Instant::now();
    let listing = loop {
        let out = c.cli(&["approvals"]);
        if stdout(&out).contains("needs:") {
            break stdout(&out);
        }
        if start.elapsed() > LONG {
            panic!("no approval appeared: {}\n{}", stdout(&out), c.log());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        listing.contains("asks to reach hosts beyond the controller: api.example.com:443"),
        "{listing}"
    );
    assert!(
        listing.contains("hosts:      api.example.com:443 (no egress budget)"),
        "{listing}"
    );
    // Everything the child starts with is shown: a variable an interpreter runs as code
    // (BASH_ENV) would otherwise be approved unseen.
    assert!(
        listing.contains("env:        [\"BASH_ENV=/tmp/hook.sh\"]"),
        "{listing}"
    );
    let _ = c.cli(&["kill", &parent]);
}
