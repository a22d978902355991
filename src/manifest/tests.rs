//! Manifest tests, and the sample values and generators other modules' tests share.

use proptest::prelude::*;

use super::canonical::{self, decode::decode};
use super::*;

pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(crate) const T0: u64 = 1_700_000_000;

pub(crate) fn resources(cpu: f64, mem: u64, pids: u64, timeout_ms: u64) -> ResourceSpec {
    match (
        CpuLimit::new(cpu),
        MemoryMb::new(mem),
        PidsLimit::new(pids),
        TimeoutMs::new(timeout_ms),
    ) {
        (Ok(cpu_limit), Ok(memory_limit_mb), Ok(pids_limit), Ok(timeout_ms)) => ResourceSpec {
            cpu_limit,
            memory_limit_mb,
            pids_limit,
            timeout_ms,
            network_policy: NetworkPolicy::default(),
            max_output_bytes: None,
        },
        other => panic!("test resources out of bounds: {other:?}"),
    }
}

pub(crate) fn path(s: &str) -> ExposedPath {
    match ExposedPath::new(s) {
        Ok(p) => p,
        Err(e) => panic!("test path {s:?}: {e}"),
    }
}

pub(crate) fn exec_path(s: &str) -> ExecPath {
    match ExecPath::new(s) {
        Ok(p) => p,
        Err(e) => panic!("test executable {s:?}: {e}"),
    }
}

pub(crate) fn profile(s: &str) -> ProfileName {
    match ProfileName::new(s) {
        Ok(p) => p,
        Err(e) => panic!("test profile {s:?}: {e}"),
    }
}

pub(crate) fn worker(s: &str) -> WorkerId {
    match WorkerId::new(s) {
        Ok(w) => w,
        Err(e) => panic!("test worker id {s:?}: {e}"),
    }
}

/// An allowlist of canonical `HOST:PORT` entries.
pub(crate) fn hosts(entries: &[&str]) -> crate::egress::AllowList {
    let parsed: Result<Vec<crate::egress::AllowHost>, _> =
        entries.iter().map(|e| e.parse()).collect();
    match parsed.map(crate::egress::AllowList::new) {
        Ok(Ok(list)) => list,
        other => panic!("test hosts {entries:?}: {other:?}"),
    }
}

pub(crate) fn egress_bytes(n: u64) -> EgressBytes {
    match EgressBytes::new(n) {
        Ok(b) => b,
        Err(e) => panic!("test egress budget {n}: {e}"),
    }
}

pub(crate) fn sample_request() -> SpawnRequest {
    SpawnRequest {
        resources: resources(0.5, 256, 64, 30_000),
        filesystem: FilesystemScope {
            read_only: vec![path("/srv/data")],
            read_write: vec![path("/srv/work")],
            allow_exec: None,
        },
        profile: profile("default"),
        command: vec!["python3".into(), "agent.py".into()],
        env: vec!["MODE=replica".into()],
        cwd: Some("/srv/work".into()),
        state_snapshot: StateSnapshot::default(),
    }
}

/// A valid unsigned root manifest, issued at [`T0`] for one hour.
pub(crate) fn sample_manifest() -> Manifest {
    let key = match KeyId::new("k-test") {
        Ok(k) => k,
        Err(e) => panic!("{e}"),
    };
    let validity = match Validity::starting_at(T0, 3600) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    };
    Manifest::unsigned(
        key,
        Lineage::root(worker("w-root")),
        validity,
        Nonce::from_bytes([7; 16]),
        sample_request(),
    )
}

/// An allowlist entry from a small world of names, wildcards, addresses and networks, so
/// that one entry covering another is common.
pub(crate) fn arb_allow_host() -> impl Strategy<Value = crate::egress::AllowHost> {
    let host = prop_oneof![
        Just("ex.com"),
        Just("api.ex.com"),
        Just("a.api.ex.com"),
        Just("*.ex.com"),
        Just("*.api.ex.com"),
        Just("198.51.100.7"),
        Just("10.1.2.3"),
        Just("10.1.0.0/16"),
        Just("10.0.0.0/8"),
        Just("[2001:db8::1]"),
        Just("[2001:db8::/32]"),
    ];
    let port = prop_oneof![Just(443u16), Just(80), Just(8080)];
    (host, port).prop_map(|(h, p)| match format!("{h}:{p}").parse() {
        Ok(e) => e,
        Err(e) => panic!("test entry {h}:{p}: {e}"),
    })
}

prop_compose! {
    /// A valid network policy; allowed hosts and a budget in about half the cases.
    pub(crate) fn arb_network_policy()(
        allow_controller in any::<bool>(),
        allow_external in any::<bool>(),
        entries in proptest::collection::vec(arb_allow_host(), 0..5),
        budget in proptest::option::of(EgressBytes::MIN..=EgressBytes::MAX),
    ) -> NetworkPolicy {
        let allow_hosts = match crate::egress::AllowList::new(entries) {
            Ok(list) => list,
            Err(e) => panic!("{e}"),
        };
        let max_egress_bytes = if allow_hosts.is_empty() {
            None
        } else {
            budget.and_then(|n| EgressBytes::new(n).ok())
        };
        NetworkPolicy { allow_controller, allow_external, allow_hosts, max_egress_bytes }
    }
}

prop_compose! {
    pub(crate) fn arb_resources()(
        cpu in CpuLimit::MIN_MILLICORES..=CpuLimit::MAX_MILLICORES,
        mem in MemoryMb::MIN..=MemoryMb::MAX,
        pids in PidsLimit::MIN..=PidsLimit::MAX,
        timeout in TimeoutMs::MIN..=TimeoutMs::MAX,
        network_policy in arb_network_policy(),
        max_output in proptest::option::of(OutputBytes::MIN..=OutputBytes::MAX),
    ) -> ResourceSpec {
        let mut r = resources(f64::from(cpu) / 1000.0, mem, pids, timeout);
        r.network_policy = network_policy;
        r.max_output_bytes = max_output.and_then(|n| OutputBytes::new(n).ok());
        r
    }
}

pub(crate) fn arb_path() -> impl Strategy<Value = ExposedPath> {
    "(/[a-c]{1,2}){1,3}".prop_map(|s| path(&s))
}

pub(crate) fn arb_exec_path() -> impl Strategy<Value = ExecPath> {
    "(/[a-c]{1,2}){1,3}".prop_map(|s| exec_path(&s))
}

prop_compose! {
    pub(crate) fn arb_filesystem()(
        ro in proptest::collection::btree_set(arb_path(), 0..4),
        rw in proptest::collection::btree_set(arb_path(), 0..4),
        allow in proptest::option::of(proptest::collection::btree_set(arb_exec_path(), 1..4)),
    ) -> FilesystemScope {
        let read_write: Vec<ExposedPath> = rw.into_iter().filter(|p| !ro.contains(p)).collect();
        FilesystemScope {
            read_only: ro.into_iter().collect(),
            read_write,
            allow_exec: allow.map(|a| a.into_iter().collect()),
        }
    }
}

prop_compose! {
    pub(crate) fn arb_request()(
        resources in arb_resources(),
        filesystem in arb_filesystem(),
        profile_name in "[a-z][a-z0-9-]{0,8}",
        command in proptest::collection::vec("[ -~]{0,12}", 0..4),
        env in proptest::collection::btree_map("[A-Z_]{1,6}", "[ -~]{0,8}", 0..3),
        cwd in proptest::option::of("(/[a-z]{1,4}){0,2}"),
        snapshot in "\\PC{0,40}",
    ) -> SpawnRequest {
        let mut argv = vec!["prog".to_string()];
        argv.extend(command);
        SpawnRequest {
            resources,
            filesystem,
            profile: profile(&profile_name),
            command: argv,
            env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
            cwd: cwd.map(|c| if c.is_empty() { "/".to_string() } else { c }),
            state_snapshot: StateSnapshot::new(snapshot.replace('\0', "")).unwrap_or_default(),
        }
    }
}

prop_compose! {
    /// Any valid unsigned manifest.
    pub(crate) fn arb_manifest()(
        job in arb_request(),
        worker_id in "[a-z0-9][a-z0-9._-]{0,20}",
        parent in proptest::option::of("[a-z0-9][a-z0-9._-]{0,20}"),
        depth in 1u32..=MAX_DEPTH,
        issued_at in 0u64..4_000_000_000,
        lifetime in 1u64..=MAX_LIFETIME_SECONDS,
        nonce in any::<[u8; 16]>(),
        key in "[a-z0-9][a-z0-9-]{0,10}",
    ) -> Manifest {
        let (parent_id, depth) = match parent {
            Some(p) if p != worker_id => (Some(worker(&p)), depth),
            _ => (None, 0),
        };
        let validity = match Validity::starting_at(issued_at, lifetime) {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        };
        let key_id = match KeyId::new(key) {
            Ok(k) => k,
            Err(e) => panic!("{e}"),
        };
        let depth = match Depth::new(depth) {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        };
        Manifest::unsigned(
            key_id,
            Lineage { worker_id: worker(&worker_id), parent_id, depth },
            validity,
            Nonce::from_bytes(nonce),
            job,
        )
    }
}

fn json_value(m: &Manifest) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::to_value(m)
}

fn decode_value(v: &serde_json::Value) -> Result<Manifest, ManifestError> {
    Manifest::from_json(v.to_string().as_bytes())
}

#[test]
fn json_round_trips() -> TestResult {
    let m = sample_manifest();
    assert_eq!(Manifest::from_json(m.to_json()?.as_bytes())?, m);
    Ok(())
}

#[test]
fn unknown_fields_are_refused_at_every_level() -> TestResult {
    for pointer in ["", "/resources", "/resources/network_policy", "/filesystem"] {
        let mut v = json_value(&sample_manifest())?;
        match v.pointer_mut(pointer) {
            Some(serde_json::Value::Object(map)) => {
                map.insert("surprise".into(), serde_json::Value::Bool(true));
            }
            _ => panic!("no object at {pointer:?}"),
        }
        match decode_value(&v) {
            Err(ManifestError::Decode(msg)) => assert!(msg.contains("surprise"), "{msg}"),
            other => panic!("unknown field at {pointer:?} accepted: {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn duplicate_fields_are_refused() -> TestResult {
    let text = sample_manifest().to_json()?;
    let doubled = text.replacen("\"depth\": 0,", "\"depth\": 0, \"depth\": 1,", 1);
    assert_ne!(doubled, text);
    assert!(matches!(
        Manifest::from_json(doubled.as_bytes()),
        Err(ManifestError::Decode(_))
    ));
    Ok(())
}

#[test]
fn absurd_values_are_refused() -> TestResult {
    let cases: &[(&str, serde_json::Value)] = &[
        ("/resources/memory_limit_mb", serde_json::json!(u64::MAX)),
        ("/resources/memory_limit_mb", serde_json::json!(0)),
        ("/resources/memory_limit_mb", serde_json::json!(-1)),
        ("/resources/cpu_limit", serde_json::json!(-0.5)),
        ("/resources/cpu_limit", serde_json::json!(0)),
        ("/resources/cpu_limit", serde_json::json!(1e300)),
        ("/resources/pids_limit", serde_json::json!(0)),
        ("/resources/timeout_ms", serde_json::json!(u64::MAX)),
        ("/depth", serde_json::json!(MAX_DEPTH + 1)),
        ("/depth", serde_json::json!(1.5)),
        ("/issued_at", serde_json::json!(-1)),
        ("/expires_at", serde_json::json!(u64::MAX)),
        ("/worker_id", serde_json::json!("../etc")),
        ("/nonce", serde_json::json!("xyz")),
        ("/profile", serde_json::json!("/tmp/evil.toml")),
        ("/filesystem/read_only", serde_json::json!(["relative"])),
        ("/filesystem/read_write", serde_json::json!(["/"])),
        ("/filesystem/allow_exec", serde_json::json!([])),
        ("/filesystem/allow_exec", serde_json::json!(["python3"])),
        (
            "/filesystem/allow_exec",
            serde_json::json!(["/usr/bin/a", "/usr/bin/a"]),
        ),
        ("/filesystem/allow_exec", serde_json::json!("/usr/bin/a")),
        ("/resources/max_output_bytes", serde_json::json!(0)),
        ("/resources/max_output_bytes", serde_json::json!(u64::MAX)),
        ("/resources/max_output_bytes", serde_json::json!(-1)),
        (
            "/resources/network_policy/allow_hosts",
            serde_json::json!(["api.example.com"]),
        ),
        (
            "/resources/network_policy/allow_hosts",
            serde_json::json!(["*.com:443"]),
        ),
        (
            "/resources/network_policy/allow_hosts",
            serde_json::json!(["api.example.com:53"]),
        ),
        (
            "/resources/network_policy/allow_hosts",
            serde_json::json!(["10.0.0.0/8:3128"]),
        ),
        (
            "/resources/network_policy/allow_hosts",
            serde_json::json!(
                (1..=65)
                    .map(|p| format!("h.example.com:{p}"))
                    .collect::<Vec<_>>()
            ),
        ),
        (
            "/resources/network_policy/allow_hosts",
            serde_json::json!("api.example.com:443"),
        ),
        (
            "/resources/network_policy/max_egress_bytes",
            serde_json::json!(0),
        ),
        (
            "/resources/network_policy/max_egress_bytes",
            serde_json::json!(-1),
        ),
        (
            "/resources/network_policy/max_egress_bytes",
            serde_json::json!(1.5),
        ),
        ("/command", serde_json::json!([])),
        ("/command", serde_json::json!([""])),
        ("/command", serde_json::json!(["a\u{0}b"])),
        ("/env", serde_json::json!(["NOEQUALS"])),
        ("/env", serde_json::json!(["A=1", "A=2"])),
        ("/cwd", serde_json::json!("work")),
        (
            "/state_snapshot",
            serde_json::json!("x".repeat(MAX_STATE_SNAPSHOT + 1)),
        ),
    ];
    let mut with_extensions = sample_manifest();
    with_extensions.filesystem.allow_exec = Some(vec![exec_path("/usr/bin/python3.11")]);
    with_extensions.resources.max_output_bytes = Some(OutputBytes::new(1 << 20)?);
    with_extensions.resources.network_policy.allow_hosts = hosts(&["api.example.com:443"]);
    with_extensions.resources.network_policy.max_egress_bytes = Some(egress_bytes(1 << 20));
    with_extensions.validate()?;
    for (pointer, value) in cases {
        let mut v = json_value(&with_extensions)?;
        match v.pointer_mut(pointer) {
            Some(slot) => *slot = value.clone(),
            None => panic!("no field at {pointer}"),
        }
        assert!(
            decode_value(&v).is_err(),
            "{pointer} = {value} was accepted"
        );
    }
    Ok(())
}

const MAX_STATE_SNAPSHOT: usize = fields::MAX_STATE_SNAPSHOT_BYTES;

#[test]
fn non_json_and_invalid_utf8_are_refused() {
    assert!(matches!(
        Manifest::from_json(b"\xff\xfe{}"),
        Err(ManifestError::NotUtf8 { offset: 0 })
    ));
    for bad in [
        &b""[..],
        b"not json",
        b"[]",
        b"{}",
        b"null",
        b"{\"key_id\": 1}",
    ] {
        assert!(
            matches!(Manifest::from_json(bad), Err(ManifestError::Decode(_))),
            "{bad:?}"
        );
    }
    let huge = vec![b' '; MAX_MANIFEST_JSON_BYTES + 1];
    assert!(matches!(
        Manifest::from_json(&huge),
        Err(ManifestError::TooLarge { .. })
    ));
}

#[test]
fn lineage_must_be_consistent() {
    let mut m = sample_manifest();
    m.depth = Depth::ROOT.child().unwrap_or(Depth::ROOT);
    assert_eq!(m.validate().map_err(|e| e.field), Err("parent_id"));
    let mut m = sample_manifest();
    m.parent_id = Some(worker("w-other"));
    assert_eq!(m.validate().map_err(|e| e.field), Err("parent_id"));
    m.depth = Depth::ROOT.child().unwrap_or(Depth::ROOT);
    assert_eq!(m.validate(), Ok(()));
    m.parent_id = Some(m.worker_id.clone());
    assert_eq!(m.validate().map_err(|e| e.field), Err("parent_id"));
}

#[test]
fn validity_windows_are_positive_and_bounded() -> TestResult {
    assert!(Validity::starting_at(T0, 0).is_err());
    assert!(Validity::starting_at(T0, MAX_LIFETIME_SECONDS + 1).is_err());
    assert!(Validity::starting_at(u64::MAX - 1, 10).is_err());
    let mut m = sample_manifest();
    m.expires_at = m.issued_at;
    assert_eq!(m.validate().map_err(|e| e.field), Err("expires_at"));
    let v = Validity::starting_at(T0, 60)?;
    assert_eq!(v.expires_at.get() - v.issued_at.get(), 60);
    Ok(())
}

#[test]
fn the_same_path_cannot_be_exposed_twice() {
    let mut r = sample_request();
    r.filesystem.read_write.push(path("/srv/data"));
    assert_eq!(r.validate().map_err(|e| e.field), Err("filesystem"));
}

#[test]
fn duplicates_are_found_in_long_lists_too() {
    for n in [2usize, 16, 17, 40] {
        let mut r = sample_request();
        r.filesystem.read_only = (0..n).map(|i| path(&format!("/d/{i}"))).collect();
        r.filesystem.read_write = vec![];
        r.env = (0..n).map(|i| format!("K{i}=v")).collect();
        assert_eq!(r.validate(), Ok(()), "{n} distinct entries");
        let mut paths = r.clone();
        paths.filesystem.read_write = vec![path(&format!("/d/{}", n - 1))];
        assert_eq!(
            paths.validate().map_err(|e| e.field),
            Err("filesystem"),
            "{n}"
        );
        let mut env = r.clone();
        env.env.push(format!("K{}=other", n / 2));
        assert_eq!(env.validate().map_err(|e| e.field), Err("env"), "{n}");
    }
}

#[test]
fn spawn_requests_cannot_carry_lineage() -> TestResult {
    let mut v = serde_json::to_value(sample_request())?;
    if let serde_json::Value::Object(map) = &mut v {
        map.insert("depth".into(), serde_json::json!(0));
    }
    match SpawnRequest::from_json(v.to_string().as_bytes()) {
        Err(ManifestError::Decode(msg)) => assert!(msg.contains("depth"), "{msg}"),
        other => panic!("a request naming its depth was accepted: {other:?}"),
    }
    Ok(())
}

#[test]
fn the_largest_valid_manifest_fits_the_json_limit() -> TestResult {
    // Every string at its limit and made of the character JSON escapes the longest.
    let mut m = sample_manifest();
    let ctl = "\u{1}";
    m.state_snapshot = StateSnapshot::new(ctl.repeat(MAX_STATE_SNAPSHOT))?;
    m.command = vec![ctl.repeat(MAX_COMMAND_BYTES / MAX_COMMAND_ARGS); MAX_COMMAND_ARGS];
    m.env = (0..MAX_ENV_VARS)
        .map(|i| {
            let k = format!("K{i:04}=");
            format!("{k}{}", ctl.repeat(MAX_ENV_BYTES / MAX_ENV_VARS - k.len()))
        })
        .collect();
    let long = |i: usize| {
        let mut s = format!("/{i:02}");
        while s.len() + 2 <= fields::MAX_PATH_BYTES {
            s.push_str("/\"");
        }
        path(&s)
    };
    m.filesystem.read_only = (0..MAX_EXPOSED_PATHS / 2).map(long).collect();
    m.filesystem.read_write = (MAX_EXPOSED_PATHS / 2..MAX_EXPOSED_PATHS)
        .map(long)
        .collect();
    m.filesystem.allow_exec = Some(
        (0..MAX_ALLOW_EXEC)
            .map(|i| exec_path(long(i).as_str()))
            .collect(),
    );
    m.resources.max_output_bytes = Some(OutputBytes::new(OutputBytes::MAX)?);
    // The longest entries there are: a 253-character wildcard name on a 5-digit port.
    let longest_name = format!("{0}.{0}.{0}.{1}", "a".repeat(63), "b".repeat(61));
    assert_eq!(longest_name.len(), crate::egress::allow::MAX_NAME_LEN);
    let entries: Vec<String> = (0..crate::egress::AllowList::MAX_ENTRIES)
        .map(|i| format!("*.{longest_name}:{}", 60_000 + i))
        .collect();
    let entries: Vec<&str> = entries.iter().map(String::as_str).collect();
    m.resources.network_policy.allow_hosts = hosts(&entries);
    m.resources.network_policy.max_egress_bytes = Some(egress_bytes(u64::MAX));
    m.validate()?;
    let json = m.to_json()?;
    assert!(
        json.len() <= MAX_MANIFEST_JSON_BYTES,
        "{} bytes",
        json.len()
    );
    assert_eq!(Manifest::from_json(json.as_bytes())?, m);
    Ok(())
}

#[test]
fn json_layout_never_changes_the_canonical_bytes() -> TestResult {
    let m = sample_manifest();
    let compact = serde_json::to_string(&m)?;
    // Same manifest, fields in reverse order, with whitespace and escaped characters.
    let v = json_value(&m)?;
    let mut reordered = String::from("{\n");
    if let serde_json::Value::Object(map) = &v {
        let entries: Vec<String> = map
            .iter()
            .rev()
            .map(|(k, val)| format!("  \"{k}\" :\t{val}"))
            .collect();
        reordered.push_str(&entries.join(",\n"));
    }
    reordered.push_str("\n}\n");
    let reordered = reordered.replace("python3", "\\u0070ython3");
    let a = Manifest::from_json(compact.as_bytes())?;
    let b = Manifest::from_json(reordered.as_bytes())?;
    assert_eq!(canonical::encode(&a), canonical::encode(&b));
    assert_eq!(canonical::encode(&a), canonical::encode(&m));
    Ok(())
}

#[test]
fn the_extension_fields_are_optional_in_json() -> TestResult {
    // A document written before they existed decodes, to a manifest without them.
    let mut v = json_value(&sample_manifest())?;
    assert!(v.pointer("/filesystem/allow_exec").is_none());
    assert!(v.pointer("/resources/max_output_bytes").is_none());
    if let Some(serde_json::Value::Object(fs)) = v.pointer_mut("/filesystem") {
        fs.insert("allow_exec".into(), serde_json::Value::Null);
    }
    assert!(v.pointer("/resources/network_policy/allow_hosts").is_none());
    assert!(
        v.pointer("/resources/network_policy/max_egress_bytes")
            .is_none()
    );
    let m = decode_value(&v)?;
    assert_eq!(m.filesystem.allow_exec, None);
    assert_eq!(m.resources.max_output_bytes, None);
    assert!(m.resources.network_policy.allow_hosts.is_empty());
    assert_eq!(m.resources.network_policy.max_egress_bytes, None);
    // An empty list says the same as none, and is written as none.
    if let Some(serde_json::Value::Object(net)) = v.pointer_mut("/resources/network_policy") {
        net.insert("allow_hosts".into(), serde_json::json!([]));
    }
    let m = decode_value(&v)?;
    assert!(m.resources.network_policy.allow_hosts.is_empty());
    assert!(!m.to_json()?.contains("allow_hosts"));
    Ok(())
}

#[test]
fn allowed_hosts_travel_as_their_canonical_text_in_the_manifests_order() -> TestResult {
    let mut v = json_value(&sample_manifest())?;
    if let Some(serde_json::Value::Object(net)) = v.pointer_mut("/resources/network_policy") {
        net.insert(
            "allow_hosts".into(),
            serde_json::json!([
                "API.Example.com.:443",
                "[::ffff:10.0.0.0/104]:80",
                "*.pypi.org:443"
            ]),
        );
        net.insert("max_egress_bytes".into(), serde_json::json!(1_048_576));
    }
    let m = decode_value(&v)?;
    let out = serde_json::to_value(&m)?;
    assert_eq!(
        out.pointer("/resources/network_policy/allow_hosts"),
        Some(&serde_json::json!([
            "api.example.com:443",
            "10.0.0.0/8:80",
            "*.pypi.org:443"
        ]))
    );
    assert_eq!(
        out.pointer("/resources/network_policy/max_egress_bytes"),
        Some(&serde_json::json!(1_048_576))
    );
    assert_eq!(Manifest::from_json(m.to_json()?.as_bytes())?, m);
    Ok(())
}

#[test]
fn a_port_the_broker_keeps_inside_the_sandbox_cannot_be_allowed() {
    for port in [53, 3128] {
        let mut r = sample_request();
        r.resources.network_policy.allow_hosts = hosts(&[&format!("api.example.com:{port}")]);
        let e = r.validate().err();
        assert_eq!(e.as_ref().map(|e| e.field), Some("allow_hosts"), "{port}");
        assert!(
            e.is_some_and(|e| e.why.contains(&format!("port {port}"))),
            "{port}"
        );
    }
}

#[test]
fn an_egress_budget_needs_an_allowed_host() {
    let mut r = sample_request();
    r.resources.network_policy.max_egress_bytes = Some(egress_bytes(4096));
    assert_eq!(r.validate().map_err(|e| e.field), Err("max_egress_bytes"));
    r.resources.network_policy.allow_hosts = hosts(&["api.example.com:443"]);
    assert_eq!(r.validate(), Ok(()));
}

#[test]
fn absent_extension_fields_add_no_bytes_and_present_ones_only_append() -> TestResult {
    let plain = sample_manifest();
    let base = canonical::encode(&plain);
    let mut m = plain.clone();
    m.resources.max_output_bytes = Some(OutputBytes::new(4096)?);
    let capped = canonical::encode(&m);
    assert!(capped.starts_with(&base));
    assert_eq!(
        &capped[base.len()..],
        &[
            &[canonical::TAG_MAX_OUTPUT_BYTES][..],
            &4096u64.to_be_bytes()[..]
        ]
        .concat()[..]
    );
    m.filesystem.allow_exec = Some(vec![exec_path("/usr/bin/python3.11")]);
    let both = canonical::encode(&m);
    assert!(both.starts_with(&base));
    assert_eq!(
        both[base.len()],
        canonical::TAG_ALLOW_EXEC,
        "tags in increasing order"
    );
    Ok(())
}

#[test]
fn the_network_extensions_append_after_the_older_ones_in_tag_order() -> TestResult {
    let mut m = sample_manifest();
    m.resources.max_output_bytes = Some(OutputBytes::new(4096)?);
    let base = canonical::encode(&m);
    m.resources.network_policy.allow_hosts = hosts(&["b.example.com:443", "a.example.com:80"]);
    m.resources.network_policy.max_egress_bytes = Some(egress_bytes(1 << 20));
    let bytes = canonical::encode(&m);
    assert!(bytes.starts_with(&base));
    let mut expected = vec![canonical::TAG_ALLOW_HOSTS];
    expected.extend_from_slice(&2u64.to_be_bytes());
    for entry in ["b.example.com:443", "a.example.com:80"] {
        expected.extend_from_slice(&(entry.len() as u64).to_be_bytes());
        expected.extend_from_slice(entry.as_bytes());
    }
    expected.push(canonical::TAG_MAX_EGRESS_BYTES);
    expected.extend_from_slice(&(1u64 << 20).to_be_bytes());
    assert_eq!(&bytes[base.len()..], &expected[..]);
    assert_eq!(decode(&bytes), Ok(m));
    Ok(())
}

/// SHA-256 of the canonical bytes of fixed manifests without the network extensions, as
/// every version since their tags existed has encoded them: what a signature made before
/// `allow_hosts` and `max_egress_bytes` covers. Computed from the format in
/// `canonical.rs`'s header, independently of this encoder.
const SAMPLE_ENCODING_SHA256: &str =
    "f0de426a3191134903f045b68ba3179e9d40a4f6fec4c6915606ea1967f7a1da";
const SAMPLE_WITH_OLDER_EXTENSIONS_SHA256: &str =
    "304acaa67bc58da6c2208ea0058bd73d172425e6d64063cad7a4c6ea79c99b24";

#[test]
fn a_manifest_without_the_network_extensions_encodes_as_before_they_existed() -> TestResult {
    use sha2::{Digest, Sha256};
    let hash = |m: &Manifest| hex::encode(Sha256::digest(canonical::encode(m)));
    let mut m = sample_manifest();
    assert_eq!(hash(&m), SAMPLE_ENCODING_SHA256);
    m.filesystem.allow_exec = Some(vec![exec_path("/usr/bin/python3.11")]);
    m.resources.max_output_bytes = Some(OutputBytes::new(1 << 20)?);
    assert_eq!(hash(&m), SAMPLE_WITH_OLDER_EXTENSIONS_SHA256);
    Ok(())
}

#[test]
fn allowed_hosts_that_are_not_canonical_or_repeat_do_not_decode() -> TestResult {
    let mut m = sample_manifest();
    m.resources.network_policy.allow_hosts = hosts(&["a.example.com:443"]);
    let good = canonical::encode(&m);
    assert_eq!(decode(&good), Ok(m.clone()));
    let base = canonical::encode(&sample_manifest());
    let with = |entries: &[&str]| {
        let mut b = base.clone();
        b.push(canonical::TAG_ALLOW_HOSTS);
        b.extend_from_slice(&(entries.len() as u64).to_be_bytes());
        for e in entries {
            b.extend_from_slice(&(e.len() as u64).to_be_bytes());
            b.extend_from_slice(e.as_bytes());
        }
        b
    };
    assert_eq!(with(&["a.example.com:443"]), good);
    assert!(decode(&with(&["A.example.com:443"])).is_err());
    assert!(decode(&with(&["a.example.com:443", "a.example.com:443"])).is_err());
    assert!(decode(&with(&[])).is_err());
    Ok(())
}

#[test]
fn extension_tags_out_of_order_or_unknown_do_not_decode() -> TestResult {
    let mut m = sample_manifest();
    m.filesystem.allow_exec = Some(vec![exec_path("/usr/bin/python3.11")]);
    m.resources.max_output_bytes = Some(OutputBytes::new(7)?);
    let bytes = canonical::encode(&m);
    let base = canonical::encode(&sample_manifest()).len();
    // Swap the two extension fields: same values, tags descending.
    let (allow, cap) = bytes[base..].split_at(bytes.len() - base - 9);
    let swapped = [&bytes[..base], cap, allow].concat();
    assert!(decode(&swapped).is_err());
    let unknown = [&bytes[..base], &[0x7f][..]].concat();
    assert!(decode(&unknown).is_err());
    assert_eq!(decode(&bytes), Ok(m));
    Ok(())
}

#[test]
fn the_encoding_starts_with_the_format_name() {
    assert!(canonical::encode(&sample_manifest()).starts_with(canonical::MAGIC));
}

proptest! {
    #[test]
    fn canonical_bytes_decode_back_to_the_same_manifest(m in arb_manifest()) {
        prop_assert_eq!(m.validate(), Ok(()));
        let decoded = decode(&canonical::encode(&m));
        prop_assert_eq!(decoded, Ok(m));
    }

    #[test]
    fn different_manifests_never_share_an_encoding(a in arb_manifest(), b in arb_manifest()) {
        let (ea, eb) = (canonical::encode(&a), canonical::encode(&b));
        let mut a_unsigned = a.clone();
        let mut b_unsigned = b.clone();
        a_unsigned.signature.clear();
        b_unsigned.signature.clear();
        prop_assert_eq!(ea == eb, a_unsigned == b_unsigned);
    }

    #[test]
    fn valid_manifests_survive_json(m in arb_manifest()) {
        let json = m.to_json().map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(Manifest::from_json(json.as_bytes()), Ok(m));
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Manifest::from_json(&bytes);
        let _ = SpawnRequest::from_json(&bytes);
    }
}
