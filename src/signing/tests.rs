use proptest::prelude::*;

use super::*;
use crate::manifest::canonical::decode::decode;
use crate::manifest::tests::{
    T0, TestResult, arb_manifest, egress_bytes, exec_path, hosts, path, profile, sample_manifest,
    worker,
};
use crate::manifest::{
    CpuLimit, Depth, MemoryMb, OutputBytes, PidsLimit, StateSnapshot, TimeoutMs, UnixSeconds,
};

fn signer() -> Result<ManifestSigner, KeyError> {
    Ok(ManifestSigner::new(Keyring::generate()?))
}

/// A signed child manifest (depth 1), so that every field can be changed without the
/// change being caught by the format check before the signature check.
fn signed_child(s: &ManifestSigner) -> Result<Manifest, Box<dyn std::error::Error>> {
    let mut m = sample_manifest();
    m.parent_id = Some(worker("w-parent"));
    m.depth = Depth::new(1)?;
    s.sign(&mut m)?;
    Ok(m)
}

fn verify_fresh(s: &ManifestSigner, m: &Manifest) -> Result<VerifiedManifest, VerifyError> {
    // A signer sharing the keyring but with an empty nonce memory.
    ManifestSigner::new(s.keyring().clone()).verify(m, T0 + 1)
}

#[test]
fn a_signed_manifest_verifies() -> TestResult {
    let s = signer()?;
    let m = signed_child(&s)?;
    assert_eq!(m.signature.len(), 64);
    assert_eq!(&m.key_id, s.keyring().active_key_id());
    let v = verify_fresh(&s, &m)?;
    assert_eq!(v.manifest(), &m);
    Ok(())
}

macro_rules! tampering {
    ($($name:ident: |$m:ident| $change:expr;)*) => {$(
        #[test]
        fn $name() -> TestResult {
            let s = signer()?;
            let original = signed_child(&s)?;
            let mut $m = original.clone();
            $change;
            assert_ne!($m, original, "the change must change the manifest");
            assert_eq!($m.validate(), Ok(()), "the change must pass the format check");
            assert_eq!(verify_fresh(&s, &$m), Err(VerifyError::BadSignature));
            Ok(())
        }
    )*};
}

tampering! {
    tampered_worker_id_fails_verification: |m| m.worker_id = worker("w-impostor");
    tampered_parent_id_fails_verification: |m| m.parent_id = Some(worker("w-other-parent"));
    tampered_depth_fails_verification: |m| m.depth = Depth::new(2)?;
    tampered_issued_at_fails_verification: |m| m.issued_at = UnixSeconds::new(T0 - 1)?;
    tampered_expires_at_fails_verification: |m| m.expires_at = UnixSeconds::new(m.expires_at.get() + 86_400)?;
    tampered_nonce_fails_verification: |m| m.nonce = Nonce::from_bytes([8; 16]);
    tampered_state_snapshot_fails_verification: |m| m.state_snapshot = StateSnapshot::new("{\"admin\":true}")?;
    tampered_cpu_limit_fails_verification: |m| m.resources.cpu_limit = CpuLimit::new(8.0)?;
    tampered_memory_limit_mb_fails_verification: |m| m.resources.memory_limit_mb = MemoryMb::new(65_536)?;
    tampered_pids_limit_fails_verification: |m| m.resources.pids_limit = PidsLimit::new(100_000)?;
    tampered_timeout_ms_fails_verification: |m| m.resources.timeout_ms = TimeoutMs::new(86_400_000)?;
    tampered_allow_controller_fails_verification: |m| m.resources.network_policy.allow_controller = false;
    tampered_allow_external_fails_verification: |m| m.resources.network_policy.allow_external = true;
    tampered_read_only_paths_fail_verification: |m| m.filesystem.read_only.push(path("/root"));
    tampered_read_write_paths_fail_verification: |m| m.filesystem.read_write.push(path("/etc"));
    tampered_profile_fails_verification: |m| m.profile = profile("unconfined");
    tampered_command_fails_verification: |m| m.command = vec!["sh".into(), "-c".into(), "curl evil".into()];
    tampered_env_fails_verification: |m| m.env.push("LD_PRELOAD=/tmp/x.so".into());
    tampered_cwd_fails_verification: |m| m.cwd = Some("/srv".into());
    added_allow_exec_fails_verification: |m| m.filesystem.allow_exec = Some(vec![exec_path("/usr/bin/perl")]);
    added_max_output_bytes_fails_verification: |m| m.resources.max_output_bytes = Some(OutputBytes::new(1 << 30)?);
    added_allow_hosts_fail_verification: |m| m.resources.network_policy.allow_hosts = hosts(&["api.example.com:443"]);
    added_max_egress_bytes_fails_verification: |m| {
        m.resources.network_policy.allow_hosts = hosts(&["api.example.com:443"]);
        m.resources.network_policy.max_egress_bytes = Some(egress_bytes(1 << 20));
    };
}

/// A signed child that reaches two hosts with a byte budget.
fn signed_egress_child(s: &ManifestSigner) -> Result<Manifest, Box<dyn std::error::Error>> {
    let mut m = sample_manifest();
    m.parent_id = Some(worker("w-parent"));
    m.depth = Depth::new(1)?;
    m.resources.network_policy.allow_hosts = hosts(&["api.example.com:443", "10.0.0.0/8:8080"]);
    m.resources.network_policy.max_egress_bytes = Some(egress_bytes(1 << 20));
    s.sign(&mut m)?;
    Ok(m)
}

#[test]
fn widening_reordering_or_stripping_allowed_hosts_or_the_budget_fails_verification() -> TestResult {
    let s = signer()?;
    let original = signed_egress_child(&s)?;
    assert!(verify_fresh(&s, &original).is_ok());
    let changes: [fn(&mut Manifest); 5] = [
        |m| {
            m.resources.network_policy.allow_hosts =
                hosts(&["*.example.com:443", "10.0.0.0/8:8080"])
        },
        |m| {
            m.resources.network_policy.allow_hosts =
                hosts(&["10.0.0.0/8:8080", "api.example.com:443"])
        },
        |m| m.resources.network_policy.allow_hosts = hosts(&["api.example.com:443"]),
        |m| m.resources.network_policy.max_egress_bytes = None,
        |m| m.resources.network_policy.max_egress_bytes = Some(egress_bytes(1 << 30)),
    ];
    for (i, change) in changes.iter().enumerate() {
        let mut m = original.clone();
        change(&mut m);
        assert_ne!(m, original, "change {i}");
        assert_eq!(m.validate(), Ok(()), "change {i}");
        assert_eq!(
            verify_fresh(&s, &m),
            Err(VerifyError::BadSignature),
            "change {i}"
        );
    }
    Ok(())
}

/// A signed child whose manifest has an executable allowlist and an output cap.
fn signed_restricted_child(s: &ManifestSigner) -> Result<Manifest, Box<dyn std::error::Error>> {
    let mut m = sample_manifest();
    m.parent_id = Some(worker("w-parent"));
    m.depth = Depth::new(1)?;
    m.filesystem.allow_exec = Some(vec![exec_path("/usr/bin/python3.11")]);
    m.resources.max_output_bytes = Some(OutputBytes::new(1 << 20)?);
    s.sign(&mut m)?;
    Ok(m)
}

#[test]
fn a_manifest_with_an_allowlist_and_a_cap_verifies() -> TestResult {
    let s = signer()?;
    let m = signed_restricted_child(&s)?;
    let v = verify_fresh(&s, &m)?;
    assert_eq!(
        v.allowed_executables(),
        vec![std::path::PathBuf::from("/usr/bin/python3.11")]
    );
    Ok(())
}

#[test]
fn stripping_or_widening_an_allowlist_or_a_cap_fails_verification() -> TestResult {
    let s = signer()?;
    let original = signed_restricted_child(&s)?;
    let changes: [fn(&mut Manifest); 4] = [
        |m| m.filesystem.allow_exec = None,
        |m| {
            if let Some(list) = &mut m.filesystem.allow_exec {
                list.push(exec_path("/usr/bin/perl"));
            }
        },
        |m| m.resources.max_output_bytes = None,
        |m| m.resources.max_output_bytes = OutputBytes::new(1 << 30).ok(),
    ];
    for (i, change) in changes.iter().enumerate() {
        let mut m = original.clone();
        change(&mut m);
        assert_ne!(m, original, "change {i}");
        assert_eq!(m.validate(), Ok(()), "change {i}");
        assert_eq!(
            verify_fresh(&s, &m),
            Err(VerifyError::BadSignature),
            "change {i}"
        );
    }
    Ok(())
}

/// A key and a manifest it signed with hatchery built before `allow_exec` and
/// `max_output_bytes` existed (`manifest keygen` + `manifest issue`).
const BEFORE_EXTENSIONS_KEY: &str =
    "c7241504e39046a10678b734ec719df99140b988e11c23029c108757613376ab";
const BEFORE_EXTENSIONS_MANIFEST: &str = r#"{
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
fn manifests_signed_before_the_extension_fields_still_verify() -> TestResult {
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(BEFORE_EXTENSIONS_KEY, &mut bytes)?;
    let ring = Keyring::single(
        KeyId::new("k-5f48048f215a27ce")?,
        SecretKey::from_bytes(bytes)?,
    )?;
    let s = ManifestSigner::new(ring);
    let m = Manifest::from_json(BEFORE_EXTENSIONS_MANIFEST.as_bytes())?;
    assert_eq!(m.filesystem.allow_exec, None);
    assert_eq!(s.check_signature(&m), Ok(()));
    // And it is the signature, not a lax check: one byte more and it fails.
    let mut changed = m.clone();
    changed.resources.max_output_bytes = Some(OutputBytes::new(1)?);
    assert_eq!(s.check_signature(&changed), Err(VerifyError::BadSignature));
    Ok(())
}

#[test]
fn tampered_key_id_naming_another_key_fails_verification() -> TestResult {
    let mut s = signer()?;
    let m = signed_child(&s)?;
    s.rotate()?;
    let mut forged = m.clone();
    forged.key_id = s.keyring().active_key_id().clone();
    assert_ne!(forged.key_id, m.key_id);
    assert_eq!(verify_fresh(&s, &forged), Err(VerifyError::BadSignature));
    Ok(())
}

#[test]
fn an_unknown_key_id_is_refused_as_such() -> TestResult {
    let s = signer()?;
    let mut m = signed_child(&s)?;
    m.key_id = KeyId::new("k-nobody")?;
    let err = verify_fresh(&s, &m).err();
    assert_eq!(err, Some(VerifyError::UnknownKey(KeyId::new("k-nobody")?)));
    assert_eq!(err.map(|e| e.check()), Some("key_id"));
    Ok(())
}

#[test]
fn a_manifest_signed_with_another_key_is_refused() -> TestResult {
    let ours = signer()?;
    let theirs = signer()?;
    let mut m = signed_child(&theirs)?;
    m.key_id = ours.keyring().active_key_id().clone();
    assert_eq!(verify_fresh(&ours, &m), Err(VerifyError::BadSignature));
    Ok(())
}

#[test]
fn a_missing_signature_is_refused_as_such() -> TestResult {
    let s = signer()?;
    let mut m = signed_child(&s)?;
    m.signature.clear();
    assert_eq!(verify_fresh(&s, &m), Err(VerifyError::MissingSignature));
    // Absent from the JSON altogether: the same.
    let mut v = serde_json::to_value(&m)?;
    if let serde_json::Value::Object(map) = &mut v {
        map.remove("signature");
    }
    let mut fresh = ManifestSigner::new(s.keyring().clone());
    assert_eq!(
        fresh.verify_json(v.to_string().as_bytes(), T0),
        Err(VerifyError::MissingSignature)
    );
    Ok(())
}

#[test]
fn a_truncated_or_malformed_signature_is_refused_as_such() -> TestResult {
    let s = signer()?;
    let m = signed_child(&s)?;
    let mut truncated = m.clone();
    truncated.signature.truncate(63);
    match verify_fresh(&s, &truncated) {
        Err(VerifyError::MalformedSignature(why)) => assert!(why.contains("truncated"), "{why}"),
        other => panic!("truncated signature: {other:?}"),
    }
    for bad in [
        m.signature.to_uppercase(),
        format!("{}00", m.signature),
        "zz".repeat(32),
    ] {
        let mut x = m.clone();
        x.signature = bad;
        assert!(
            matches!(
                verify_fresh(&s, &x),
                Err(VerifyError::MalformedSignature(_))
            ),
            "{}",
            x.signature
        );
    }
    Ok(())
}

#[test]
fn an_expired_manifest_is_refused() -> TestResult {
    let s = signer()?;
    let m = signed_child(&s)?;
    let mut fresh = ManifestSigner::new(s.keyring().clone());
    let at = m.expires_at.get();
    let err = fresh.verify(&m, at).err();
    assert_eq!(
        err,
        Some(VerifyError::Expired {
            expires_at: at,
            now: at
        })
    );
    assert_eq!(
        err.map(|e| e.audit_event()),
        Some("reject_manifest_expired")
    );
    let mut fresh = ManifestSigner::new(s.keyring().clone());
    assert!(
        fresh.verify(&m, at - 1).is_ok(),
        "valid until the last second"
    );
    Ok(())
}

#[test]
fn a_manifest_from_the_future_is_refused_beyond_the_clock_skew() -> TestResult {
    let s = signer()?;
    let m = signed_child(&s)?;
    let mut strict = ManifestSigner::new(s.keyring().clone()).with_clock_skew(0);
    assert_eq!(
        strict.verify(&m, T0 - 1),
        Err(VerifyError::NotYetValid {
            issued_at: T0,
            now: T0 - 1
        })
    );
    let mut lenient = ManifestSigner::new(s.keyring().clone()).with_clock_skew(5);
    assert!(lenient.verify(&m, T0 - 5).is_ok());
    Ok(())
}

#[test]
fn a_replayed_manifest_is_refused() -> TestResult {
    let s = signer()?;
    let m = signed_child(&s)?;
    let mut v = ManifestSigner::new(s.keyring().clone());
    v.verify(&m, T0)?;
    let err = v.verify(&m, T0 + 1).err();
    assert_eq!(err, Some(VerifyError::Replayed(m.nonce)));
    assert_eq!(err.map(|e| e.audit_event()), Some("reject_manifest_replay"));
    Ok(())
}

#[test]
fn a_clock_stepped_back_cannot_revive_a_forgotten_nonce() -> TestResult {
    let s = signer()?;
    let m = signed_child(&s)?;
    let mut v = ManifestSigner::new(s.keyring().clone());
    v.verify(&m, T0)?;
    // Later, after the manifest expired, its nonce is forgotten...
    let late = m.expires_at.get() + 10;
    assert!(matches!(
        v.verify(&m, late),
        Err(VerifyError::Expired { .. })
    ));
    assert!(!v.nonce_memory().contains(&m.nonce));
    // ...and a caller whose clock went back still cannot use it again.
    assert!(matches!(
        v.verify(&m, T0 + 1),
        Err(VerifyError::Expired { .. })
    ));
    Ok(())
}

#[test]
fn a_full_nonce_memory_fails_closed() -> TestResult {
    let s = signer()?;
    let mut v = ManifestSigner::new(s.keyring().clone()).with_nonce_capacity(2);
    let mut issued = Vec::new();
    for i in 0..3u8 {
        let mut m = signed_child(&s)?;
        m.nonce = Nonce::from_bytes([i; 16]);
        s.sign(&mut m)?;
        issued.push(m);
    }
    v.verify(&issued[0], T0)?;
    v.verify(&issued[1], T0)?;
    assert_eq!(
        v.verify(&issued[2], T0),
        Err(VerifyError::ReplayMemoryFull { capacity: 2 })
    );
    Ok(())
}

#[test]
fn a_refused_manifest_leaves_no_trace() -> TestResult {
    let s = signer()?;
    let m = signed_child(&s)?;
    let mut v = ManifestSigner::new(s.keyring().clone());
    let mut forged = m.clone();
    forged.depth = Depth::new(2)?;
    assert_eq!(v.verify(&forged, T0), Err(VerifyError::BadSignature));
    assert!(
        v.nonce_memory().is_empty(),
        "a forgery must not use up a nonce"
    );
    assert!(v.verify(&m, T0).is_ok());
    Ok(())
}

#[test]
fn rotation_keeps_old_signatures_valid_and_signs_with_the_new_key() -> TestResult {
    let mut s = signer()?;
    let old = signed_child(&s)?;
    let new_id = s.rotate()?;
    let mut new = sample_manifest();
    new.nonce = Nonce::from_bytes([9; 16]);
    s.sign(&mut new)?;
    assert_eq!(new.key_id, new_id);
    assert_ne!(old.key_id, new_id);
    assert!(s.verify(&old, T0).is_ok());
    assert!(s.verify(&new, T0).is_ok());
    Ok(())
}

#[test]
fn a_retired_key_no_longer_verifies() -> TestResult {
    let s = signer()?;
    let m = signed_child(&s)?;
    let successor = Keyring::generate()?;
    assert_eq!(
        verify_fresh(&ManifestSigner::new(successor), &m),
        Err(VerifyError::UnknownKey(m.key_id.clone()))
    );
    Ok(())
}

#[test]
fn non_json_invalid_utf8_and_unknown_fields_are_refused_as_format_errors() -> TestResult {
    let s = signer()?;
    let m = signed_child(&s)?;
    let mut v = ManifestSigner::new(s.keyring().clone());
    let mut with_extra = serde_json::to_value(&m)?;
    if let serde_json::Value::Object(map) = &mut with_extra {
        map.insert("admin".into(), serde_json::Value::Bool(true));
    }
    let cases: Vec<Vec<u8>> = vec![
        b"\xc3\x28".to_vec(),
        b"<manifest/>".to_vec(),
        b"".to_vec(),
        with_extra.to_string().into_bytes(),
    ];
    for bytes in cases {
        let err = v.verify_json(&bytes, T0).err();
        assert_eq!(err.as_ref().map(|e| e.check()), Some("format"), "{err:?}");
        assert_eq!(
            err.map(|e| e.audit_event()),
            Some("reject_manifest_signature")
        );
    }
    assert!(v.nonce_memory().is_empty());
    Ok(())
}

#[test]
fn signing_refuses_an_invalid_manifest() -> TestResult {
    let s = signer()?;
    let mut m = sample_manifest();
    m.command.clear();
    assert!(matches!(s.sign(&mut m), Err(SignError::Invalid(_))));
    assert!(m.signature.is_empty());
    Ok(())
}

#[test]
fn issued_manifests_get_distinct_nonces() -> TestResult {
    let s = signer()?;
    let base = sample_manifest();
    let a = s.issue(
        base.lineage(),
        crate::manifest::tests::sample_request(),
        base.validity(),
    )?;
    let b = s.issue(
        base.lineage(),
        crate::manifest::tests::sample_request(),
        base.validity(),
    )?;
    assert_ne!(a.nonce, b.nonce);
    let mut v = ManifestSigner::new(s.keyring().clone());
    v.verify(&a, T0)?;
    v.verify(&b, T0)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any single-byte change to the signed bytes: either they no longer describe a
    /// manifest at all, or the manifest they describe does not verify with the original
    /// signature.
    #[test]
    fn any_single_byte_change_to_the_encoding_fails_verification(
        m in arb_manifest(),
        index in any::<prop::sample::Index>(),
        delta in 1u8..=255,
    ) {
        let s = signer().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut signed = m;
        s.sign(&mut signed).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut bytes = canonical::encode(&signed);
        let i = index.index(bytes.len());
        bytes[i] = bytes[i].wrapping_add(delta);
        if let Ok(mut altered) = decode(&bytes) {
            altered.signature = signed.signature.clone();
            let mut v = ManifestSigner::new(s.keyring().clone());
            let now = signed.issued_at.get();
            prop_assert!(v.verify(&altered, now).is_err(), "byte {} accepted", i);
        }
    }

    /// Any single-byte change to the signed JSON: refused, or it did not change what was
    /// signed (whitespace, say).
    #[test]
    fn any_single_byte_change_to_the_json_is_refused_or_harmless(
        m in arb_manifest(),
        index in any::<prop::sample::Index>(),
        delta in 1u8..=255,
    ) {
        let s = signer().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut signed = m;
        s.sign(&mut signed).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut json = signed.to_json().map_err(|e| TestCaseError::fail(e.to_string()))?.into_bytes();
        let i = index.index(json.len());
        json[i] = json[i].wrapping_add(delta);
        let mut v = ManifestSigner::new(s.keyring().clone());
        if let Ok(accepted) = v.verify_json(&json, signed.issued_at.get()) {
            prop_assert_eq!(canonical::encode(&accepted), canonical::encode(&signed));
            prop_assert_eq!(&accepted.signature, &signed.signature);
        }
    }

    #[test]
    fn every_generated_manifest_verifies_once(m in arb_manifest()) {
        let s = signer().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut signed = m;
        s.sign(&mut signed).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut v = ManifestSigner::new(s.keyring().clone());
        let now = signed.issued_at.get();
        prop_assert!(v.verify(&signed, now).is_ok());
        prop_assert_eq!(v.verify(&signed, now), Err(VerifyError::Replayed(signed.nonce)));
    }
}
