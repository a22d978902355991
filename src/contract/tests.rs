use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::manifest::tests::{
    T0, TestResult, arb_manifest, arb_network_policy, arb_request, egress_bytes, exec_path, hosts,
    path, profile, resources, sample_manifest, sample_request, worker,
};
use crate::manifest::{Depth, ExposedPath, OutputBytes, ResourceSpec};
use crate::signing::{Keyring, ManifestSigner};

/// A registry that keeps real workers, for decisions over sequences.
#[derive(Debug, Default)]
struct Model {
    kill_switch: bool,
    active: BTreeMap<WorkerId, Manifest>,
    spawn_times: Vec<u64>,
    last_spawn: BTreeMap<WorkerId, u64>,
    lifetime: u64,
}

impl Model {
    fn register(&mut self, m: Manifest, now: u64) {
        if let Some(p) = &m.parent_id {
            self.last_spawn.insert(p.clone(), now);
        }
        self.spawn_times.push(now);
        self.lifetime += 1;
        self.active.insert(m.worker_id.clone(), m);
    }
}

impl RegistryView for Model {
    fn kill_switch_engaged(&self) -> bool {
        self.kill_switch
    }
    fn active_count(&self) -> u64 {
        self.active.len() as u64
    }
    fn last_spawn_by(&self, parent: &WorkerId) -> Option<u64> {
        self.last_spawn.get(parent).copied()
    }
    fn total_memory_limit_mb(&self) -> u64 {
        self.active
            .values()
            .map(|m| m.resources.memory_limit_mb.get())
            .sum()
    }
    fn total_cpu_limit(&self) -> f64 {
        self.active
            .values()
            .map(|m| m.resources.cpu_limit.get())
            .sum()
    }
    fn spawns_since(&self, since: u64) -> u64 {
        self.spawn_times.iter().filter(|t| **t >= since).count() as u64
    }
    fn lifetime_total(&self) -> u64 {
        self.lifetime
    }
}

fn deny_event(d: &Decision) -> &'static str {
    d.audit_event()
}

/// A parent with room to hand down: 4 cores, 4 GiB, /srv read-write, /data read-only.
fn parent() -> Manifest {
    let mut m = sample_manifest();
    m.resources = resources(4.0, 4096, 512, 3_600_000);
    m.filesystem.read_only = vec![path("/data")];
    m.filesystem.read_write = vec![path("/srv")];
    m
}

fn request() -> SpawnRequest {
    let mut r = sample_request();
    r.filesystem.read_only = vec![path("/data/set1")];
    r.filesystem.read_write = vec![path("/srv/work")];
    r
}

fn snapshot() -> RegistrySnapshot {
    RegistrySnapshot {
        active_count: 1,
        total_memory_limit_mb: 4096,
        total_cpu_limit: 4.0,
        spawn_times: vec![T0 - 100],
        lifetime_total: 1,
        ..RegistrySnapshot::default()
    }
}

fn denied(d: Decision) -> DenyReason {
    match d {
        Decision::Deny(r) => r,
        Decision::Allow => panic!("expected a denial"),
    }
}

fn narrowing_field(d: Decision) -> &'static str {
    match denied(d) {
        DenyReason::Narrowing(v) => v.field,
        other => panic!("expected a narrowing denial, got {other:?}"),
    }
}

#[test]
fn a_narrower_request_within_every_limit_is_allowed() {
    let c = ReplicationContract::default();
    let d = c.can_spawn(&parent(), &request(), &snapshot(), T0);
    assert_eq!(d, Decision::Allow);
    assert_eq!(d.audit_event(), "replication_requested");
}

#[test]
fn the_kill_switch_denies_before_anything_else() {
    let c = ReplicationContract::default();
    let mut reg = snapshot();
    reg.kill_switch_engaged = true;
    reg.active_count = 1000;
    let mut r = request();
    r.resources.network_policy.allow_external = true;
    let d = c.can_spawn(&parent(), &r, &reg, T0);
    assert_eq!(deny_event(&d), "deny_kill_switch");
    assert_eq!(denied(d), DenyReason::KillSwitch);
    assert_eq!(
        deny_event(&c.admit(&parent(), &reg, T0)),
        "deny_kill_switch"
    );
}

#[test]
fn a_full_quota_denies_before_cooldown() {
    let c = ReplicationContract {
        max_replicas: 3,
        ..ReplicationContract::default()
    };
    let mut reg = snapshot();
    reg.active_count = 3;
    reg.last_spawn.insert(parent().worker_id, T0);
    let d = c.can_spawn(&parent(), &request(), &reg, T0);
    assert_eq!(
        denied(d),
        DenyReason::Quota {
            active: 3,
            max_replicas: 3
        }
    );
    reg.active_count = 2;
    assert_ne!(
        deny_event(&c.can_spawn(&parent(), &request(), &reg, T0)),
        "deny_quota"
    );
}

#[test]
fn a_second_child_within_the_cooldown_is_denied_before_depth() {
    let c = ReplicationContract {
        cooldown_seconds: 10,
        max_depth: 0,
        ..ReplicationContract::default()
    };
    let mut reg = snapshot();
    reg.last_spawn.insert(parent().worker_id, T0 - 4);
    // Times are whole seconds: 10 of them apart may be 9.001 s in truth, so 11 are needed.
    match denied(c.can_spawn(&parent(), &request(), &reg, T0)) {
        DenyReason::Cooldown {
            remaining_seconds, ..
        } => assert_eq!(remaining_seconds, 7),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        deny_event(&c.can_spawn(&parent(), &request(), &reg, T0 + 6)),
        "deny_cooldown"
    );
    // Once the cooldown is surely over, the next check (depth) decides.
    assert_eq!(
        deny_event(&c.can_spawn(&parent(), &request(), &reg, T0 + 7)),
        "deny_depth"
    );
}

#[test]
fn a_one_second_cooldown_holds_two_children_a_second_apart_not_13_ms() {
    // The last child at x.987 s (its second: x), the next asked at x+1.000 s.
    let c = ReplicationContract {
        cooldown_seconds: 1,
        max_depth: 0,
        ..ReplicationContract::default()
    };
    let mut reg = snapshot();
    reg.last_spawn.insert(parent().worker_id, T0);
    assert_eq!(
        deny_event(&c.can_spawn(&parent(), &request(), &reg, T0 + 1)),
        "deny_cooldown"
    );
    assert_eq!(
        deny_event(&c.can_spawn(&parent(), &request(), &reg, T0 + 2)),
        "deny_depth"
    );
    // No cooldown: none.
    let c = ReplicationContract {
        cooldown_seconds: 0,
        max_depth: 0,
        ..ReplicationContract::default()
    };
    assert_eq!(
        deny_event(&c.can_spawn(&parent(), &request(), &reg, T0)),
        "deny_depth"
    );
}

#[test]
fn a_clock_stepped_back_still_counts_as_within_the_cooldown() {
    let c = ReplicationContract::default();
    let mut reg = snapshot();
    reg.last_spawn.insert(parent().worker_id, T0 + 100);
    assert_eq!(
        deny_event(&c.can_spawn(&parent(), &request(), &reg, T0)),
        "deny_cooldown"
    );
}

#[test]
fn a_child_beyond_max_depth_is_denied_before_stop_conditions() -> TestResult {
    let c = ReplicationContract {
        max_depth: 2,
        stop_conditions: vec![Box::new(LifetimeTotal {
            name: "lifetime_total".into(),
            max_workers: 1,
        })],
        ..ReplicationContract::default()
    };
    let mut p = parent();
    p.parent_id = Some(worker("w-grandparent"));
    p.depth = Depth::new(2)?;
    assert_eq!(
        denied(c.can_spawn(&p, &request(), &snapshot(), T0)),
        DenyReason::Depth {
            depth: 3,
            max_depth: 2
        }
    );
    p.depth = Depth::new(1)?;
    assert_eq!(
        deny_event(&c.can_spawn(&p, &request(), &snapshot(), T0)),
        "deny_stop_condition"
    );
    Ok(())
}

#[test]
fn depth_is_capped_even_for_a_contract_built_by_hand() -> TestResult {
    let c = ReplicationContract {
        max_depth: u32::MAX,
        ..ReplicationContract::default()
    };
    let mut p = parent();
    p.parent_id = Some(worker("w-up"));
    p.depth = Depth::new(MAX_DEPTH)?;
    assert_eq!(
        deny_event(&c.can_spawn(&p, &request(), &snapshot(), T0)),
        "deny_depth"
    );
    assert!(c.child_lineage(&p, worker("w-c")).is_err());
    Ok(())
}

fn with_condition(c: impl StopCondition + 'static) -> ReplicationContract {
    ReplicationContract {
        stop_conditions: vec![Box::new(c)],
        ..ReplicationContract::default()
    }
}

fn fired(d: Decision) -> String {
    match denied(d) {
        DenyReason::StopCondition { name, .. } => name,
        other => panic!("expected a stop condition, got {other:?}"),
    }
}

#[test]
fn a_memory_budget_counts_the_candidate() {
    // Active 4096 MiB + the request's 256 MiB.
    let c = with_condition(MemoryBudget {
        name: "memory_budget".into(),
        max_total_memory_mb: 4351,
    });
    assert_eq!(
        fired(c.can_spawn(&parent(), &request(), &snapshot(), T0)),
        "memory_budget"
    );
    let c = with_condition(MemoryBudget {
        name: "memory_budget".into(),
        max_total_memory_mb: 4352,
    });
    assert!(
        c.can_spawn(&parent(), &request(), &snapshot(), T0)
            .is_allowed()
    );
}

#[test]
fn a_cpu_budget_counts_the_candidate() {
    let c = with_condition(CpuBudget {
        name: "cpu".into(),
        max_total_cpus: 4.25,
    });
    assert_eq!(
        fired(c.can_spawn(&parent(), &request(), &snapshot(), T0)),
        "cpu"
    );
    let c = with_condition(CpuBudget {
        name: "cpu".into(),
        max_total_cpus: 4.5,
    });
    assert!(
        c.can_spawn(&parent(), &request(), &snapshot(), T0)
            .is_allowed()
    );
}

#[test]
fn a_spawn_rate_counts_only_its_window() {
    let c = with_condition(SpawnRate {
        name: "rate".into(),
        max_spawns: 2,
        window_seconds: 60,
    });
    let mut reg = snapshot();
    reg.spawn_times = vec![T0 - 500, T0 - 30, T0 - 10];
    assert_eq!(fired(c.can_spawn(&parent(), &request(), &reg, T0)), "rate");
    reg.spawn_times = vec![T0 - 500, T0 - 400, T0 - 10];
    assert!(c.can_spawn(&parent(), &request(), &reg, T0).is_allowed());
}

#[test]
fn a_lifetime_total_never_resets() {
    let c = with_condition(LifetimeTotal {
        name: "total".into(),
        max_workers: 5,
    });
    let mut reg = snapshot();
    reg.lifetime_total = 5;
    reg.active_count = 1;
    assert_eq!(fired(c.can_spawn(&parent(), &request(), &reg, T0)), "total");
    reg.lifetime_total = 4;
    assert!(c.can_spawn(&parent(), &request(), &reg, T0).is_allowed());
}

/// A library user's own condition: no workers with external network after hours.
#[derive(Debug)]
struct NoExternalAtDepth;

impl StopCondition for NoExternalAtDepth {
    fn name(&self) -> &str {
        "no_deep_external"
    }
    fn description(&self) -> String {
        "only the root may have external network".into()
    }
    fn fires(&self, ctx: &ReplicationContext<'_>) -> bool {
        ctx.depth > 0 && ctx.candidate.network_policy.allow_external
    }
}

#[test]
fn custom_stop_conditions_plug_in() {
    let c = with_condition(NoExternalAtDepth);
    let mut p = parent();
    p.resources.network_policy.allow_external = true;
    let mut r = request();
    r.resources.network_policy.allow_external = true;
    assert_eq!(
        fired(c.can_spawn(&p, &r, &snapshot(), T0)),
        "no_deep_external"
    );
    r.resources.network_policy.allow_external = false;
    assert!(c.can_spawn(&p, &r, &snapshot(), T0).is_allowed());
}

#[test]
fn stop_conditions_are_checked_before_narrowing() {
    let c = with_condition(LifetimeTotal {
        name: "total".into(),
        max_workers: 1,
    });
    let mut r = request();
    r.resources = resources(64.0, 65536, 64, 1000);
    assert_eq!(fired(c.can_spawn(&parent(), &r, &snapshot(), T0)), "total");
}

#[test]
fn each_resource_above_the_parents_is_denied_by_name() {
    let c = ReplicationContract::default();
    let p = parent();
    type Change = fn(&mut ResourceSpec);
    let cases: [(&str, Change); 6] = [
        ("resources.cpu_limit", |r| {
            *r = resources(4.5, 256, 64, 1000)
        }),
        ("resources.memory_limit_mb", |r| {
            *r = resources(0.5, 4097, 64, 1000)
        }),
        ("resources.pids_limit", |r| {
            *r = resources(0.5, 256, 513, 1000)
        }),
        ("resources.timeout_ms", |r| {
            *r = resources(0.5, 256, 64, 3_600_001)
        }),
        ("resources.network_policy.allow_external", |r| {
            r.network_policy.allow_external = true
        }),
        ("resources.network_policy.allow_controller", |r| {
            r.network_policy.allow_controller = true
        }),
    ];
    for (field, change) in cases {
        let mut parent = p.clone();
        if field.ends_with("allow_controller") {
            parent.resources.network_policy.allow_controller = false;
        }
        let mut r = request();
        change(&mut r.resources);
        let d = c.can_spawn(&parent, &r, &snapshot(), T0);
        assert_eq!(d.audit_event(), "deny_narrowing");
        assert_eq!(narrowing_field(d), field);
    }
}

#[test]
fn a_childs_allowed_hosts_must_each_be_covered_by_the_parents() {
    let c = ReplicationContract::default();
    let mut p = parent();
    p.resources.network_policy.allow_hosts =
        hosts(&["*.example.com:443", "10.0.0.0/8:8080", "pypi.org:443"]);
    let check = |p: &Manifest, child: &[&str]| {
        let mut r = request();
        r.resources.network_policy.allow_hosts = hosts(child);
        c.can_spawn(p, &r, &snapshot(), T0)
    };
    assert!(check(&p, &[]).is_allowed(), "no host at all");
    assert!(
        check(
            &p,
            &["api.example.com:443", "10.1.2.0/24:8080", "pypi.org:443"]
        )
        .is_allowed(),
        "a name under the wildcard, a network inside the parent's, the same name"
    );
    assert!(
        check(&p, &["*.example.com:443"]).is_allowed(),
        "the same wildcard"
    );
    for (child, uncovered) in [
        (
            &["api.example.com:443", "example.com:443"][..],
            "example.com:443",
        ),
        (&["api.example.com:80"], "api.example.com:80"),
        (&["a.b.example.com:443"], "a.b.example.com:443"),
        (&["10.0.0.0/7:8080"], "10.0.0.0/7:8080"),
        (&["files.pypi.org:443"], "files.pypi.org:443"),
    ] {
        match denied(check(&p, child)) {
            DenyReason::Narrowing(v) => {
                assert_eq!(v.field, "resources.network_policy.allow_hosts");
                assert_eq!(v.requested, uncovered, "{child:?}");
                assert!(v.allowed.contains("*.example.com:443"), "{}", v.allowed);
            }
            other => panic!("{child:?}: expected a narrowing denial, got {other:?}"),
        }
    }
    // A parent that reaches no host gives none.
    let d = check(&parent(), &["api.example.com:443"]);
    assert_eq!(d.audit_event(), "deny_narrowing");
    match denied(d) {
        DenyReason::Narrowing(v) => {
            assert_eq!(v.field, "resources.network_policy.allow_hosts");
            assert_eq!(v.allowed, "no host");
        }
        other => panic!("expected a narrowing denial, got {other:?}"),
    }
}

#[test]
fn an_egress_budget_can_only_shrink_for_a_child_that_reaches_a_host() {
    let c = ReplicationContract::default();
    let mut p = parent();
    p.resources.network_policy.allow_hosts = hosts(&["api.example.com:443"]);
    let check = |p: &Manifest, child_hosts: &[&str], budget: Option<u64>| {
        let mut r = request();
        r.resources.network_policy.allow_hosts = hosts(child_hosts);
        r.resources.network_policy.max_egress_bytes = budget.map(egress_bytes);
        c.can_spawn(p, &r, &snapshot(), T0)
    };
    let host = &["api.example.com:443"][..];
    assert!(check(&p, host, None).is_allowed(), "no budget under none");
    assert!(
        check(&p, host, Some(1 << 20)).is_allowed(),
        "a budget under none"
    );
    p.resources.network_policy.max_egress_bytes = Some(egress_bytes(1 << 20));
    assert!(
        check(&p, host, Some(1 << 20)).is_allowed(),
        "the same budget"
    );
    assert!(check(&p, host, Some(1024)).is_allowed(), "a smaller budget");
    assert!(check(&p, &[], None).is_allowed(), "no host needs no budget");
    assert_eq!(
        narrowing_field(check(&p, host, Some((1 << 20) + 1))),
        "resources.network_policy.max_egress_bytes"
    );
    assert_eq!(
        narrowing_field(check(&p, host, None)),
        "resources.network_policy.max_egress_bytes",
        "no budget is more than any budget"
    );
}

#[test]
fn equal_resources_are_allowed() {
    let c = ReplicationContract::default();
    let p = parent();
    let mut r = request();
    r.resources = p.resources.clone();
    assert!(c.can_spawn(&p, &r, &snapshot(), T0).is_allowed());
}

#[test]
fn paths_must_lie_within_the_parents() {
    let c = ReplicationContract::default();
    let p = parent();
    let check = |ro: &[&str], rw: &[&str]| {
        let mut r = request();
        r.filesystem.read_only = ro.iter().map(|s| path(s)).collect();
        r.filesystem.read_write = rw.iter().map(|s| path(s)).collect();
        c.can_spawn(&p, &r, &snapshot(), T0)
    };
    assert!(check(&["/data"], &["/srv"]).is_allowed(), "equal paths");
    assert!(
        check(&["/srv/x"], &[]).is_allowed(),
        "read-only from read-write"
    );
    assert!(check(&[], &[]).is_allowed(), "nothing at all");
    assert_eq!(
        narrowing_field(check(&["/etc"], &[])),
        "filesystem.read_only"
    );
    assert_eq!(
        narrowing_field(check(&["/database"], &[])),
        "filesystem.read_only"
    );
    assert_eq!(
        narrowing_field(check(&[], &["/data/set1"])),
        "filesystem.read_write",
        "write access never comes from a read-only grant"
    );
    assert_eq!(
        narrowing_field(check(&[], &["/srv2"])),
        "filesystem.read_write"
    );
}

#[test]
fn an_output_cap_can_only_shrink() -> TestResult {
    let c = ReplicationContract::default();
    let mut p = parent();
    let cap = |n: u64| OutputBytes::new(n).map(Some);
    let check = |p: &Manifest, child: Option<OutputBytes>| {
        let mut r = request();
        r.resources.max_output_bytes = child;
        c.can_spawn(p, &r, &snapshot(), T0)
    };
    assert!(check(&p, None).is_allowed(), "an uncapped parent");
    assert!(check(&p, cap(1 << 20)?).is_allowed(), "a cap under none");
    p.resources.max_output_bytes = cap(1 << 20)?;
    assert!(check(&p, cap(1 << 20)?).is_allowed(), "the same cap");
    assert!(check(&p, cap(1024)?).is_allowed(), "a smaller cap");
    assert_eq!(
        narrowing_field(check(&p, cap((1 << 20) + 1)?)),
        "resources.max_output_bytes"
    );
    assert_eq!(
        narrowing_field(check(&p, None)),
        "resources.max_output_bytes",
        "no cap is more than any cap"
    );
    Ok(())
}

#[test]
fn an_executable_allowlist_can_only_shrink() {
    let c = ReplicationContract::default();
    let mut p = parent();
    let list = |files: &[&str]| Some(files.iter().map(|f| exec_path(f)).collect::<Vec<_>>());
    let check = |p: &Manifest, child| {
        let mut r = request();
        r.filesystem.allow_exec = child;
        c.can_spawn(p, &r, &snapshot(), T0)
    };
    assert!(check(&p, None).is_allowed(), "a parent without a list");
    assert!(check(&p, list(&["/usr/bin/git"])).is_allowed());
    p.filesystem.allow_exec = list(&["/usr/bin/python3.11", "/usr/bin/git"]);
    assert!(check(&p, list(&["/usr/bin/git", "/usr/bin/python3.11"])).is_allowed());
    assert!(check(&p, list(&["/usr/bin/git"])).is_allowed(), "a subset");
    let d = check(&p, list(&["/usr/bin/git", "/usr/bin/perl"]));
    match denied(d) {
        DenyReason::Narrowing(v) => {
            assert_eq!(v.field, "filesystem.allow_exec");
            assert_eq!(v.requested, "/usr/bin/perl");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        narrowing_field(check(&p, list(&["/usr/bin/git/x"]))),
        "filesystem.allow_exec",
        "files, not directories: nothing lies beneath an allowed file"
    );
    assert_eq!(
        narrowing_field(check(&p, None)),
        "filesystem.allow_exec",
        "no list would allow every program"
    );
}

#[test]
fn a_profile_must_be_the_parents_or_a_listed_narrowing() -> TestResult {
    let mut c = ReplicationContract::default();
    let mut r = request();
    r.profile = profile("strict");
    let d = c.can_spawn(&parent(), &r, &snapshot(), T0);
    assert_eq!(narrowing_field(d), "profile");
    c.profile_narrowing
        .entry(profile("default"))
        .or_default()
        .insert(profile("strict"));
    assert!(c.can_spawn(&parent(), &r, &snapshot(), T0).is_allowed());
    // Not the other way round.
    let mut strict_parent = parent();
    strict_parent.profile = profile("strict");
    r.profile = profile("default");
    assert_eq!(
        narrowing_field(c.can_spawn(&strict_parent, &r, &snapshot(), T0)),
        "profile"
    );
    Ok(())
}

#[test]
fn an_expired_parent_cannot_replicate() {
    let c = ReplicationContract::default();
    let p = parent();
    let at = p.expires_at.get();
    assert_eq!(
        narrowing_field(c.can_spawn(&p, &request(), &snapshot(), at)),
        "expires_at"
    );
}

#[test]
fn a_malformed_request_is_denied() {
    let c = ReplicationContract::default();
    let mut r = request();
    r.filesystem.read_write.push(path("/data/set1"));
    let d = c.can_spawn(&parent(), &r, &snapshot(), T0);
    assert_eq!(d.audit_event(), "deny_invalid_request");
}

#[test]
fn admission_checks_quota_depth_and_stop_conditions() -> TestResult {
    let c = ReplicationContract {
        max_depth: 1,
        max_replicas: 2,
        stop_conditions: vec![Box::new(MemoryBudget {
            name: "memory_budget".into(),
            max_total_memory_mb: 8192,
        })],
        ..ReplicationContract::default()
    };
    let root = parent();
    let empty = RegistrySnapshot::default();
    assert_eq!(c.admit(&root, &empty, T0), Decision::Allow);
    let mut full = snapshot();
    full.active_count = 2;
    assert_eq!(c.admit(&root, &full, T0).audit_event(), "deny_quota");
    let mut deep = root.clone();
    deep.parent_id = Some(worker("w-p"));
    deep.depth = Depth::new(2)?;
    assert_eq!(c.admit(&deep, &empty, T0).audit_event(), "deny_depth");
    let mut heavy = snapshot();
    heavy.total_memory_limit_mb = 8000;
    assert_eq!(
        c.admit(&root, &heavy, T0).audit_event(),
        "deny_stop_condition"
    );
    Ok(())
}

#[test]
fn the_child_depth_comes_from_the_parent_never_the_request() -> TestResult {
    let c = ReplicationContract::default();
    let signer = ManifestSigner::new(Keyring::generate()?);
    let mut p = parent();
    p.parent_id = Some(worker("w-up"));
    p.depth = Depth::new(1)?;
    let child = c.issue_child(&signer, &p, request(), worker("w-child"), &snapshot(), T0)?;
    assert_eq!(child.depth.get(), 2);
    assert_eq!(child.parent_id.as_ref(), Some(&p.worker_id));
    assert_eq!(child.issued_at.get(), T0);
    assert!(
        child.expires_at <= p.expires_at,
        "never outlives its parent"
    );
    let mut verifier = ManifestSigner::new(signer.keyring().clone());
    verifier.verify(&child, T0)?;
    Ok(())
}

#[test]
fn issuing_a_child_refuses_what_can_spawn_refuses() -> TestResult {
    let c = ReplicationContract::default();
    let signer = ManifestSigner::new(Keyring::generate()?);
    let mut reg = snapshot();
    reg.kill_switch_engaged = true;
    match c.issue_child(&signer, &parent(), request(), worker("w-c"), &reg, T0) {
        Err(IssueError::Denied(DenyReason::KillSwitch)) => Ok(()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn child_validity_is_the_contract_lifetime_capped_by_the_parent() -> TestResult {
    let c = ReplicationContract {
        expiration_seconds: 600,
        ..ReplicationContract::default()
    };
    let v = c.child_validity(T0, None)?;
    assert_eq!(v.expires_at.get(), T0 + 600);
    let p = parent(); // expires at T0 + 3600
    let v = c.child_validity(T0 + 3300, Some(&p))?;
    assert_eq!(v.expires_at, p.expires_at);
    assert!(c.child_validity(T0 + 3600, Some(&p)).is_err());
    Ok(())
}

#[test]
fn an_empty_contract_file_is_the_built_in_contract() -> TestResult {
    let config = ContractConfig::from_toml("", "test")?;
    assert_eq!(config, ContractConfig::default());
    let built = config.build();
    let default = ReplicationContract::default();
    assert_eq!(
        (
            built.max_depth,
            built.max_replicas,
            built.cooldown_seconds,
            built.expiration_seconds
        ),
        (
            default.max_depth,
            default.max_replicas,
            default.cooldown_seconds,
            default.expiration_seconds
        )
    );
    Ok(())
}

pub(crate) const EXAMPLE: &str = r#"
max_depth = 2
max_replicas = 16
cooldown_seconds = 10
expiration_seconds = 900

[[stop_condition]]
kind = "memory_budget"
max_total_memory_mb = 2048

[[stop_condition]]
kind = "cpu_budget"
max_total_cpus = 4

[[stop_condition]]
kind = "spawn_rate"
max_spawns = 20
window_seconds = 3600

[[stop_condition]]
kind = "spawn_rate"
name = "burst"
max_spawns = 5
window_seconds = 60

[[stop_condition]]
kind = "lifetime_total"
max_workers = 50

[profile_narrowing]
default = ["strict"]
"#;

#[test]
fn the_documented_example_parses_and_round_trips() -> TestResult {
    let config = ContractConfig::from_toml(EXAMPLE, "example")?;
    let c = config.build();
    assert_eq!(c.max_depth, 2);
    assert_eq!(c.max_replicas, 16);
    let names: Vec<&str> = c.stop_conditions.iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        [
            "memory_budget",
            "cpu_budget",
            "spawn_rate",
            "burst",
            "lifetime_total"
        ]
    );
    assert!(c.profile_narrowing[&profile("default")].contains(&profile("strict")));
    let again = ContractConfig::from_toml(&config.to_toml()?, "round trip")?;
    assert_eq!(again, config);
    Ok(())
}

fn parse_error_line(source: &str) -> Option<usize> {
    match ContractConfig::from_toml(source, "test") {
        Err(ContractError::Parse { line, .. }) => Some(line),
        Err(ContractError::Invalid { .. }) => Some(0),
        _ => None,
    }
}

#[test]
fn bad_contract_files_are_refused_with_the_line() {
    let cases = [
        ("max_depth = 2\nmax_replica = 3\n", 2),
        ("max_depth = 65\n", 1),
        ("\nmax_replicas = 0\n", 2),
        ("max_replicas = -1\n", 1),
        ("cooldown_seconds = \"5s\"\n", 1),
        ("expiration_seconds = 0\n", 1),
        ("expiration_seconds = 99999999999\n", 1),
        (
            "[[stop_condition]]\nkind = \"memory_budget\"\nmax_total_memory_mb = 1\nbogus = 2\n",
            1,
        ),
        ("[[stop_condition]]\nkind = \"teleport\"\n", 1),
        (
            "[[stop_condition]]\nkind = \"cpu_budget\"\nmax_total_cpus = -1.0\n",
            1,
        ),
        (
            "[[stop_condition]]\nkind = \"spawn_rate\"\nmax_spawns = 5\n",
            1,
        ),
        ("[profile_narrowing]\ndefault = [\"../etc/passwd\"]\n", 2),
    ];
    for (source, line) in cases {
        match parse_error_line(source) {
            Some(l) if l == line || (l > 0 && line == 1 && l <= 4) => {}
            other => panic!("{source:?}: expected an error on line {line}, got {other:?}"),
        }
    }
}

#[test]
fn unknown_keys_name_the_key_and_its_line() {
    match ContractConfig::from_toml("max_depth = 1\n\nstop_conditions = []\n", "f.toml") {
        Err(e @ ContractError::Parse { line: 3, .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("stop_conditions") && msg.contains("f.toml"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn stop_condition_names_must_be_unique() {
    let src = "[[stop_condition]]\nkind = \"lifetime_total\"\nmax_workers = 1\n\
               [[stop_condition]]\nkind = \"lifetime_total\"\nmax_workers = 2\n";
    assert!(matches!(
        ContractConfig::from_toml(src, "t"),
        Err(ContractError::Invalid { .. })
    ));
}

#[test]
fn oversized_contract_files_are_refused() {
    let src = format!("# {}\n", "x".repeat(file::MAX_CONTRACT_BYTES));
    assert!(ContractConfig::from_toml(&src, "t").is_err());
}

// ---- properties ----

#[derive(Debug, Clone)]
enum Op {
    Spawn {
        parent: prop::sample::Index,
        request: Box<SpawnRequest>,
    },
    Release(prop::sample::Index),
    Wait(u64),
    KillSwitch(bool),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<prop::sample::Index>(), arb_small_request())
            .prop_map(|(parent, request)| Op::Spawn { parent, request: Box::new(request) }),
        2 => any::<prop::sample::Index>().prop_map(Op::Release),
        2 => (0u64..20).prop_map(Op::Wait),
        1 => any::<bool>().prop_map(Op::KillSwitch),
    ]
}

/// Requests small enough that most pass narrowing, so the quota and depth checks are the
/// ones doing the work.
fn arb_small_request() -> impl Strategy<Value = SpawnRequest> {
    (10u32..=1000, 4u64..=128, 1u64..=32).prop_map(|(cpu, mem, pids)| {
        let mut r = sample_request();
        r.resources = resources(f64::from(cpu) / 1000.0, mem, pids, 10_000);
        r.filesystem = Default::default();
        r
    })
}

fn big_root() -> Manifest {
    let mut m = sample_manifest();
    m.resources = resources(1024.0, 1 << 20, 1 << 20, 86_400_000);
    m.filesystem = Default::default();
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn the_contract_never_allows_too_deep_or_too_many(
        max_depth in 0u32..5,
        max_replicas in 1u64..12,
        cooldown in 0u64..4,
        ops in proptest::collection::vec(arb_op(), 1..80),
    ) {
        let contract = ReplicationContract {
            max_depth,
            max_replicas,
            cooldown_seconds: cooldown,
            ..ReplicationContract::default()
        };
        let mut reg = Model::default();
        let mut now = T0;
        let root = big_root();
        if contract.admit(&root, &reg, now).is_allowed() {
            reg.register(root, now);
        }
        let mut next_id = 0u32;
        for op in ops {
            match op {
                Op::Spawn { parent, request } => {
                    let ids: Vec<WorkerId> = reg.active.keys().cloned().collect();
                    if ids.is_empty() { continue; }
                    let parent = reg.active[&ids[parent.index(ids.len())]].clone();
                    let decision = contract.can_spawn(&parent, &request, &reg, now);
                    if decision.is_allowed() {
                        next_id += 1;
                        let id = worker(&format!("w-{next_id}"));
                        let lineage = contract.child_lineage(&parent, id)
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        prop_assert_eq!(lineage.depth.get(), parent.depth.get() + 1);
                        let validity = contract.child_validity(now, Some(&parent))
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        let child = Manifest::unsigned(
                            parent.key_id.clone(), lineage, validity, parent.nonce, *request);
                        if contract.admit(&child, &reg, now).is_allowed() {
                            reg.register(child, now);
                        }
                    }
                }
                Op::Release(i) => {
                    let ids: Vec<WorkerId> = reg.active.keys().cloned().collect();
                    if !ids.is_empty() {
                        reg.active.remove(&ids[i.index(ids.len())]);
                    }
                }
                Op::Wait(s) => now += s,
                Op::KillSwitch(on) => reg.kill_switch = on,
            }
            prop_assert!(reg.active.len() as u64 <= max_replicas,
                "{} active with max_replicas {}", reg.active.len(), max_replicas);
            for m in reg.active.values() {
                prop_assert!(m.depth.get() <= max_depth,
                    "{} at depth {} with max_depth {}", m.worker_id, m.depth, max_depth);
            }
        }
    }

    #[test]
    fn narrowing_holds_for_any_parent_and_child(
        parent in arb_manifest(),
        child in arb_request(),
        clamp in any::<bool>(),
        clamp_egress in any::<bool>(),
    ) {
        let mut child = child;
        if clamp {
            // Pull the child inside the parent on every dimension, so both outcomes occur.
            let (c, p) = (&mut child.resources, &parent.resources);
            if c.cpu_limit > p.cpu_limit { c.cpu_limit = p.cpu_limit; }
            c.memory_limit_mb = c.memory_limit_mb.min(p.memory_limit_mb);
            c.pids_limit = c.pids_limit.min(p.pids_limit);
            c.timeout_ms = c.timeout_ms.min(p.timeout_ms);
            c.network_policy.allow_controller &= p.network_policy.allow_controller;
            c.network_policy.allow_external &= p.network_policy.allow_external;
            if let Some(cap) = p.max_output_bytes {
                c.max_output_bytes = Some(c.max_output_bytes.unwrap_or(cap).min(cap));
            }
            if let Some(allowed) = &parent.filesystem.allow_exec {
                let mut kept: Vec<_> = child
                    .filesystem
                    .allow_exec
                    .iter()
                    .flatten()
                    .filter(|f| allowed.contains(f))
                    .cloned()
                    .collect();
                if kept.is_empty() {
                    kept = allowed[..1].to_vec();
                }
                child.filesystem.allow_exec = Some(kept);
            }
            child.profile = parent.profile.clone();
        }
        if clamp && clamp_egress {
            // Without this, the child's hosts and budget are the only thing that may be
            // wider than the parent's.
            let (cn, pn) = (&mut child.resources.network_policy, &parent.resources.network_policy);
            let kept: Vec<_> = cn
                .allow_hosts
                .entries()
                .iter()
                .filter(|e| pn.allow_hosts.entries().iter().any(|g| g.covers(e)))
                .cloned()
                .collect();
            cn.allow_hosts = crate::egress::AllowList::new(kept).unwrap_or_default();
            if cn.allow_hosts.is_empty() {
                cn.max_egress_bytes = None;
            } else if let Some(budget) = pn.max_egress_bytes {
                cn.max_egress_bytes = Some(cn.max_egress_bytes.unwrap_or(budget).min(budget));
            }
        }
        let mut contract = ReplicationContract {
            max_depth: MAX_DEPTH,
            max_replicas: u64::MAX,
            ..ReplicationContract::default()
        };
        contract.profile_narrowing.entry(profile("default")).or_default().insert(profile("strict"));
        let now = parent.issued_at.get();
        let decision = contract.can_spawn(&parent, &child, &RegistrySnapshot::default(), now);
        let expected = oracle_is_narrower(&parent, &child, &contract.profile_narrowing);
        let depth_ok = parent.depth.get() < MAX_DEPTH;
        match decision {
            Decision::Allow => prop_assert!(expected && depth_ok, "allowed a wider child"),
            Decision::Deny(DenyReason::Narrowing(_)) => prop_assert!(!expected),
            Decision::Deny(DenyReason::Depth { .. }) => prop_assert!(!depth_ok),
            Decision::Deny(other) => prop_assert!(false, "unexpected denial {:?}", other),
        }
    }
}

proptest! {
    #[test]
    fn network_narrowing_holds_for_any_parent_and_child_policy(
        parent_net in arb_network_policy(),
        child_net in arb_network_policy(),
        covered_only in any::<bool>(),
    ) {
        // Everything else equal or narrower: the network policy alone decides.
        let mut p = parent();
        p.resources.network_policy = parent_net;
        let mut child = request();
        child.resources.network_policy = child_net;
        if covered_only {
            let (cn, pn) = (&mut child.resources.network_policy, &p.resources.network_policy);
            let kept: Vec<_> = cn
                .allow_hosts
                .entries()
                .iter()
                .filter(|e| pn.allow_hosts.entries().iter().any(|g| g.covers(e)))
                .cloned()
                .collect();
            cn.allow_hosts = crate::egress::AllowList::new(kept).unwrap_or_default();
            if cn.allow_hosts.is_empty() {
                cn.max_egress_bytes = None;
            }
        }
        let c = ReplicationContract::default();
        let decision = c.can_spawn(&p, &child, &snapshot(), T0);
        let expected = oracle_is_narrower(&p, &child, &c.profile_narrowing);
        match decision {
            Decision::Allow => prop_assert!(expected, "allowed a wider child"),
            Decision::Deny(DenyReason::Narrowing(v)) => {
                prop_assert!(!expected, "denied a narrower child: {}", v);
                prop_assert!(v.field.starts_with("resources.network_policy."), "{}", v);
            }
            Decision::Deny(other) => prop_assert!(false, "unexpected denial {:?}", other),
        }
    }
}

/// An independent statement of "the child holds no more than the parent", on strings.
fn oracle_is_narrower(
    parent: &Manifest,
    child: &SpawnRequest,
    profiles: &ProfileNarrowing,
) -> bool {
    let under = |c: &ExposedPath, p: &ExposedPath| {
        c.as_str() == p.as_str() || c.as_str().starts_with(&format!("{}/", p.as_str()))
    };
    let (c, p) = (&child.resources, &parent.resources);
    let resources = c.cpu_limit.get() <= p.cpu_limit.get()
        && c.memory_limit_mb.get() <= p.memory_limit_mb.get()
        && c.pids_limit.get() <= p.pids_limit.get()
        && c.timeout_ms.get() <= p.timeout_ms.get()
        && (!c.network_policy.allow_controller || p.network_policy.allow_controller)
        && (!c.network_policy.allow_external || p.network_policy.allow_external);
    let ro = child.filesystem.read_only.iter().all(|x| {
        parent
            .filesystem
            .read_only
            .iter()
            .chain(&parent.filesystem.read_write)
            .any(|g| under(x, g))
    });
    let rw = child
        .filesystem
        .read_write
        .iter()
        .all(|x| parent.filesystem.read_write.iter().any(|g| under(x, g)));
    let profile = child.profile == parent.profile
        || profiles
            .get(&parent.profile)
            .is_some_and(|s| s.contains(&child.profile));
    let cap = match (c.max_output_bytes, p.max_output_bytes) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(a), Some(b)) => a.get() <= b.get(),
    };
    let exec = match (&child.filesystem.allow_exec, &parent.filesystem.allow_exec) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(c), Some(p)) => c.iter().all(|f| p.iter().any(|g| g.as_str() == f.as_str())),
    };
    let (cn, pn) = (&c.network_policy, &p.network_policy);
    // Spelled out on the entries' fields rather than through `covers`.
    let entry_under = |e: &crate::egress::AllowHost, g: &crate::egress::AllowHost| {
        use crate::egress::HostPattern::{Addr, Cidr, Name, Wildcard};
        e.port == g.port
            && match (&e.host, &g.host) {
                (Name(n), Name(m)) | (Wildcard(n), Wildcard(m)) => n == m,
                (Name(n), Wildcard(m)) => n
                    .split_once('.')
                    .is_some_and(|(_, rest)| rest == m.as_str()),
                (Addr(a), Addr(b)) => a == b,
                (Addr(a), Cidr(net, len)) => in_network(*a, *net, *len),
                (Cidr(a, alen), Cidr(net, len)) => alen >= len && in_network(*a, *net, *len),
                _ => false,
            }
    };
    // Any public host (`allow_external`) covers every name and every address outside
    // the special ranges, at both ends of a CIDR.
    let public = |e: &crate::egress::AllowHost| {
        use crate::egress::HostPattern::{Addr, Cidr, Name, Wildcard};
        let special = |a: std::net::IpAddr| crate::egress::special_range(a).is_some();
        match &e.host {
            Name(_) | Wildcard(_) => true,
            Addr(a) => !special(*a),
            Cidr(net, len) => {
                let last = match net {
                    std::net::IpAddr::V4(v) => std::net::IpAddr::V4(
                        (u32::from(*v) | u32::MAX.checked_shr(u32::from(*len)).unwrap_or(0)).into(),
                    ),
                    std::net::IpAddr::V6(v) => std::net::IpAddr::V6(
                        (u128::from(*v) | u128::MAX.checked_shr(u32::from(*len)).unwrap_or(0))
                            .into(),
                    ),
                };
                !special(*net) && !special(last)
            }
        }
    };
    let hosts = cn.allow_hosts.entries().iter().all(|e| {
        (pn.allow_external && public(e))
            || pn.allow_hosts.entries().iter().any(|g| entry_under(e, g))
    });
    let budget = (!cn.allow_external && cn.allow_hosts.is_empty())
        || match (cn.max_egress_bytes, pn.max_egress_bytes) {
            (_, None) => true,
            (None, Some(_)) => false,
            (Some(a), Some(b)) => a.get() <= b.get(),
        };
    resources && ro && rw && profile && cap && exec && hosts && budget
}

/// Whether `addr` lies in `net/len`, by comparing the leading bits as text.
fn in_network(addr: std::net::IpAddr, net: std::net::IpAddr, len: u8) -> bool {
    let bits = |a: std::net::IpAddr| -> String {
        match a {
            std::net::IpAddr::V4(v) => v.octets().iter().map(|o| format!("{o:08b}")).collect(),
            std::net::IpAddr::V6(v) => v.octets().iter().map(|o| format!("{o:08b}")).collect(),
        }
    };
    let (a, n) = (bits(addr), bits(net));
    a.len() == n.len() && a.get(..usize::from(len)) == n.get(..usize::from(len))
}

#[test]
fn a_spawn_rate_no_controller_could_reach_is_refused_not_parsed() {
    let toml = |n: u64| {
        format!(
            "[[stop_condition]]\nkind = \"spawn_rate\"\nmax_spawns = {n}\nwindow_seconds = 60\n"
        )
    };
    assert!(ReplicationContract::from_toml(&toml(file::MAX_SPAWNS_IN_WINDOW), "t").is_ok());
    let refused = ReplicationContract::from_toml(&toml(file::MAX_SPAWNS_IN_WINDOW + 1), "t");
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("max_spawns")),
        "{:?}",
        refused.map(|_| ())
    );
}

/// A contract's text is shown to people (`manifest contract` prints it back as TOML,
/// which escapes C0 alone): a bidi override or an 8-bit CSI in an auto-approve rule
/// reached the terminal raw.
#[test]
fn a_contracts_text_holds_no_control_or_format_character_but_what_scripts_need() {
    for (source, c) in [
        (
            "[[approval.auto_approve]]\nname = \"small\\u202e jobs\"\n",
            "U+202E",
        ),
        (
            "[[approval.auto_approve]]\ncommand_prefix = [\"python3\", \"\\u009b2J\"]\n",
            "U+009B",
        ),
        (
            "[egress.resolve]\n\"a\\u2066.test\" = \"127.0.0.1\"\n",
            "U+2066",
        ),
        // Text hidden in tag characters, and a zero-width space making two names look
        // the same.
        (
            "[[approval.auto_approve]]\nname = \"small jobs\\U000E0061\\U000E006C\"\n",
            "U+E0061",
        ),
        (
            "[[approval.auto_approve]]\nname = \"night\\u200bly\"\n",
            "U+200B",
        ),
    ] {
        match ContractConfig::from_toml(source, "test") {
            Err(ContractError::Invalid { message, .. }) => {
                assert!(message.contains(c), "{message}");
                assert!(crate::text::first_control(&message).is_none(), "{message}");
            }
            other => panic!("{source}: {other:?}"),
        }
    }
    // Accented letters and other scripts are text, a Persian name's zero-width
    // non-joiner and an emoji's joiner included, and so is a script's newline.
    for source in [
        "[[approval.auto_approve]]\nname = \"tâches courtes, 小\"\n",
        "[[approval.auto_approve]]\nname = \"کارهای\\u200cکوچک 👩\\u200d💻\"\n",
        "[[approval.auto_approve]]\ncommand_prefix = [\"sh\", \"-c\", \"set -e\\nrun-job\"]\n",
    ] {
        let parsed = ContractConfig::from_toml(source, "t");
        assert!(parsed.is_ok(), "{source}: {parsed:?}");
    }
}
