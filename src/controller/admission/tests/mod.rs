//! Every admission rule, decided through the store the engine uses; racing requests and
//! registration in `ordering`.

mod ordering;

use super::*;
use crate::contract::approval::{AutoApproveRule, RequireRule};
use crate::contract::{CpuBudget, LifetimeTotal, MemoryBudget, SpawnRate, StopCondition};
use crate::manifest::Lineage;
use crate::manifest::tests::{
    T0, TestResult, egress_bytes, hosts, path, resources, sample_request, worker,
};
use crate::signing::Keyring;

struct World {
    contract: ReplicationContract,
    signer: ManifestSigner,
    store: InMemoryStore,
    root: Manifest,
}

/// A root with room to hand down (4 cores, 4 GiB), admitted at T0.
fn world(contract: ReplicationContract) -> Result<World, Box<dyn std::error::Error>> {
    world_with(contract, |_| {})
}

/// [`world`], with the root's job changed by `change` first.
fn world_with(
    contract: ReplicationContract,
    change: impl FnOnce(&mut SpawnRequest),
) -> Result<World, Box<dyn std::error::Error>> {
    let signer = ManifestSigner::new(Keyring::generate()?);
    let mut store = InMemoryStore::default();
    let mut job = sample_request();
    job.resources = resources(4.0, 4096, 512, 3_600_000);
    change(&mut job);
    let root = signer.issue(
        Lineage::root(worker("w-root")),
        job,
        contract.child_validity(T0, None)?,
    )?;
    let d = reserve(&mut store, &contract, &Candidate::Root(&root), T0);
    assert_eq!(d, Decision::Allow, "the root is admitted");
    Ok(World {
        contract,
        signer,
        store,
        root,
    })
}

/// A child's request: 0.5 cores, 256 MiB, within the root's paths.
fn request() -> SpawnRequest {
    sample_request()
}

impl World {
    fn decide(
        &self,
        parent: &Manifest,
        request: SpawnRequest,
        id: &str,
        now: u64,
    ) -> ChildDecision {
        decide_child(
            &self.contract,
            &self.signer,
            &self.store,
            ChildRequest {
                parent,
                request,
                child_id: worker(id),
                requester: Requester::Parent,
            },
            now,
        )
    }

    /// Decides and, when issued, takes the slot: what the engine does for a request that
    /// needs no person.
    fn spawn(&mut self, parent: &Manifest, id: &str, now: u64) -> Result<Manifest, DenyReason> {
        match self.decide(parent, request(), id, now) {
            ChildDecision::Issued { manifest, .. } => {
                let candidate = Candidate::Child {
                    parent,
                    manifest: &manifest,
                };
                reserve(&mut self.store, &self.contract, &candidate, now).into_result()?;
                Ok(*manifest)
            }
            ChildDecision::Denied(r) => Err(r),
            ChildDecision::Failed(e) => panic!("signing failed: {e}"),
        }
    }

    /// A child of the root that must be allowed.
    fn start(&mut self, id: &str, now: u64) -> Result<Manifest, String> {
        self.spawn_from_root(id, now).map_err(|r| r.to_string())
    }

    fn spawn_from_root(&mut self, id: &str, now: u64) -> Result<Manifest, DenyReason> {
        let root = self.root.clone();
        self.spawn(&root, id, now)
    }
}

fn contract() -> ReplicationContract {
    ReplicationContract {
        cooldown_seconds: 0,
        ..ReplicationContract::default()
    }
}

fn with_condition(c: impl StopCondition + 'static) -> ReplicationContract {
    ReplicationContract {
        stop_conditions: vec![Box::new(c)],
        ..contract()
    }
}

fn fired(r: Result<Manifest, DenyReason>) -> String {
    match r {
        Err(DenyReason::StopCondition { name, .. }) => name,
        other => panic!("expected a stop condition, got {other:?}"),
    }
}

#[test]
fn the_kill_switch_refuses_roots_and_children_alike() -> TestResult {
    let mut w = world(contract())?;
    w.store.set_kill_switch(true);
    assert_eq!(
        w.spawn_from_root("w-a", T0 + 1).err(),
        Some(DenyReason::KillSwitch)
    );
    let other = Manifest {
        worker_id: worker("w-other"),
        ..w.root.clone()
    };
    assert_eq!(
        reserve(&mut w.store, &w.contract, &Candidate::Root(&other), T0),
        Decision::Deny(DenyReason::KillSwitch)
    );
    w.store.set_kill_switch(false);
    assert!(w.spawn_from_root("w-a", T0 + 1).is_ok());
    Ok(())
}

#[test]
fn the_quota_counts_active_workers_and_frees_a_slot_on_release() -> TestResult {
    let mut w = world(ReplicationContract {
        max_replicas: 2,
        ..contract()
    })?;
    let a = w.start("w-a", T0 + 1)?;
    assert_eq!(
        w.spawn_from_root("w-b", T0 + 2).err(),
        Some(DenyReason::Quota {
            active: 2,
            max_replicas: 2
        })
    );
    w.store.release(&a.worker_id);
    assert!(w.spawn_from_root("w-b", T0 + 3).is_ok());
    Ok(())
}

#[test]
fn a_memory_budget_counts_active_workers_and_the_candidate() -> TestResult {
    // The root holds 4096 MiB; each child asks 256.
    let mut w = world(with_condition(MemoryBudget {
        name: "memory".into(),
        max_total_memory_mb: 4096 + 256,
    }))?;
    let a = w.start("w-a", T0 + 1)?;
    assert_eq!(fired(w.spawn_from_root("w-b", T0 + 2)), "memory");
    w.store.release(&a.worker_id);
    assert!(w.spawn_from_root("w-b", T0 + 3).is_ok());
    Ok(())
}

#[test]
fn a_cpu_budget_counts_active_workers_and_the_candidate() -> TestResult {
    // The root holds 4 cores; each child asks 0.5.
    let mut w = world(with_condition(CpuBudget {
        name: "cpu".into(),
        max_total_cpus: 4.5,
    }))?;
    w.start("w-a", T0 + 1)?;
    assert_eq!(fired(w.spawn_from_root("w-b", T0 + 2)), "cpu");
    Ok(())
}

#[test]
fn a_child_beyond_max_depth_is_refused() -> TestResult {
    let mut w = world(ReplicationContract {
        max_depth: 1,
        ..contract()
    })?;
    let a = w.start("w-a", T0 + 1)?;
    assert_eq!(
        w.spawn(&a, "w-aa", T0 + 2).err(),
        Some(DenyReason::Depth {
            depth: 2,
            max_depth: 1
        })
    );
    Ok(())
}

#[test]
fn a_parent_waits_out_its_cooldown_even_after_a_failed_start() -> TestResult {
    let mut w = world(ReplicationContract {
        cooldown_seconds: 10,
        ..contract()
    })?;
    w.start("w-a", T0 + 1)?;
    assert_eq!(
        w.spawn_from_root("w-b", T0 + 5).err(),
        Some(DenyReason::Cooldown {
            parent: worker("w-root"),
            remaining_seconds: 7
        })
    );
    assert!(w.spawn_from_root("w-b", T0 + 12).is_ok());
    // A start that failed after it was decided counts too.
    w.store.note_failed_start(&worker("w-root"), T0 + 30);
    assert!(matches!(
        w.spawn_from_root("w-c", T0 + 35),
        Err(DenyReason::Cooldown { .. })
    ));
    Ok(())
}

#[test]
fn a_spawn_rate_counts_starts_within_its_window() -> TestResult {
    // The root's own start at T0 counts.
    let mut w = world(with_condition(SpawnRate {
        name: "rate".into(),
        max_spawns: 2,
        window_seconds: 60,
    }))?;
    w.start("w-a", T0 + 1)?;
    assert_eq!(fired(w.spawn_from_root("w-b", T0 + 2)), "rate");
    // Releasing does not forget a start; the window does.
    w.store.release(&worker("w-a"));
    assert_eq!(fired(w.spawn_from_root("w-b", T0 + 60)), "rate");
    assert!(w.spawn_from_root("w-b", T0 + 62).is_ok());
    Ok(())
}

#[test]
fn a_lifetime_total_is_not_freed_by_release() -> TestResult {
    let mut w = world(with_condition(LifetimeTotal {
        name: "total".into(),
        max_workers: 2,
    }))?;
    let a = w.start("w-a", T0 + 1)?;
    w.store.release(&a.worker_id);
    assert_eq!(fired(w.spawn_from_root("w-b", T0 + 2)), "total");
    assert_eq!(w.store.lifetime_total(), 2);
    Ok(())
}

#[test]
fn a_request_beyond_the_parents_grant_is_refused_by_narrowing() -> TestResult {
    let w = world(contract())?;
    let mut r = request();
    r.resources = resources(0.5, 8192, 64, 30_000);
    match w.decide(&w.root, r, "w-a", T0 + 1) {
        ChildDecision::Denied(DenyReason::Narrowing(v)) => {
            assert_eq!(v.field, "resources.memory_limit_mb");
        }
        other => panic!("expected a narrowing refusal, got {other:?}"),
    }
    let mut r = request();
    r.filesystem.read_write = vec![path("/etc")];
    assert!(matches!(
        w.decide(&w.root, r, "w-a", T0 + 1),
        ChildDecision::Denied(DenyReason::Narrowing(_))
    ));
    Ok(())
}

#[test]
fn any_public_host_is_wider_than_a_parent_without_it() -> TestResult {
    let w = world(contract())?;
    let mut r = request();
    r.resources.network_policy.allow_external = true;
    match w.decide(&w.root, r, "w-a", T0 + 1) {
        ChildDecision::Denied(DenyReason::Narrowing(v)) => {
            assert!(v.to_string().contains("allow_external"), "{v}");
        }
        other => panic!("expected a narrowing refusal, got {other:?}"),
    }
    Ok(())
}

#[test]
fn named_public_hosts_are_narrower_than_any_public_host() -> TestResult {
    let w = world_with(contract(), |job| {
        job.resources.network_policy.allow_external = true;
    })?;
    let mut r = request();
    r.resources.network_policy.allow_hosts = hosts(&["api.example.com:443", "198.51.100.7:80"]);
    assert!(
        !matches!(
            w.decide(&w.root, r, "w-a", T0 + 1),
            ChildDecision::Denied(_)
        ),
        "a named public host under a parent reaching any public host"
    );
    let mut r = request();
    r.resources.network_policy.allow_hosts = hosts(&["10.0.0.0/8:443"]);
    assert!(
        matches!(
            w.decide(&w.root, r, "w-b", T0 + 2),
            ChildDecision::Denied(DenyReason::Narrowing(_))
        ),
        "a private range is not a public host"
    );
    Ok(())
}

#[test]
fn a_child_reaching_hosts_without_a_budget_gets_its_parents_budget() -> TestResult {
    let w = world_with(contract(), |job| {
        job.resources.network_policy.allow_hosts = hosts(&["*.example.com:443"]);
        job.resources.network_policy.max_egress_bytes = Some(egress_bytes(1 << 20));
    })?;
    let mut r = request();
    r.resources.network_policy.allow_hosts = hosts(&["api.example.com:443"]);
    match w.decide(&w.root, r.clone(), "w-a", T0 + 1) {
        ChildDecision::Issued { manifest, .. } => {
            let net = &manifest.resources.network_policy;
            assert_eq!(net.allow_hosts, hosts(&["api.example.com:443"]));
            assert_eq!(net.max_egress_bytes, Some(egress_bytes(1 << 20)));
        }
        other => panic!("expected a manifest, got {other:?}"),
    }
    // A child that reaches no host is given no budget.
    match w.decide(&w.root, request(), "w-b", T0 + 1) {
        ChildDecision::Issued { manifest, .. } => {
            assert_eq!(manifest.resources.network_policy.max_egress_bytes, None);
        }
        other => panic!("expected a manifest, got {other:?}"),
    }
    // Asking for more than the parent's budget is still refused.
    r.resources.network_policy.max_egress_bytes = Some(egress_bytes((1 << 20) + 1));
    match w.decide(&w.root, r, "w-c", T0 + 1) {
        ChildDecision::Denied(DenyReason::Narrowing(v)) => {
            assert_eq!(v.field, "resources.network_policy.max_egress_bytes");
        }
        other => panic!("expected a narrowing refusal, got {other:?}"),
    }
    Ok(())
}

#[test]
fn a_request_for_allowed_hosts_needs_approval_under_the_network_rule() -> TestResult {
    let mut c = contract();
    c.approval.require = vec![RequireRule::Network];
    // An auto-approve rule that matches any request never covers a network grant.
    c.approval.auto_approve = vec![AutoApproveRule::default()];
    let w = world_with(c, |job| {
        job.resources.network_policy.allow_hosts = hosts(&["*.example.com:443"]);
    })?;
    match w.decide(&w.root, request(), "w-a", T0 + 1) {
        ChildDecision::Issued { approval, .. } => {
            assert_eq!(approval, ApprovalVerdict::NotNeeded, "no host, no rule");
        }
        other => panic!("expected a manifest, got {other:?}"),
    }
    let mut r = request();
    r.resources.network_policy.allow_hosts = hosts(&["api.example.com:443"]);
    match w.decide(&w.root, r, "w-b", T0 + 1) {
        ChildDecision::Issued {
            approval: ApprovalVerdict::Needed { reasons },
            ..
        } => {
            assert_eq!(reasons.len(), 1);
            assert!(
                reasons.iter().all(|r| r.contains("api.example.com:443")),
                "{reasons:?}"
            );
        }
        other => panic!("expected a request held for approval, got {other:?}"),
    }
    Ok(())
}

#[test]
fn a_parents_request_matching_a_rule_waits_for_a_person_unless_auto_approved() -> TestResult {
    let mut c = contract();
    c.approval.require = vec![RequireRule::MemoryAbove { mb: 128 }];
    let w = world(c)?;
    let verdict = |w: &World, requester| match decide_child(
        &w.contract,
        &w.signer,
        &w.store,
        ChildRequest {
            parent: &w.root,
            request: request(),
            child_id: worker("w-a"),
            requester,
        },
        T0 + 1,
    ) {
        ChildDecision::Issued { approval, .. } => approval,
        other => panic!("expected a manifest, got {other:?}"),
    };
    assert!(matches!(
        verdict(&w, Requester::Parent),
        ApprovalVerdict::Needed { .. }
    ));
    // A person asking through the API is the approver.
    assert_eq!(verdict(&w, Requester::Person), ApprovalVerdict::NotNeeded);

    let mut c = contract();
    c.approval.require = vec![RequireRule::MemoryAbove { mb: 128 }];
    c.approval.auto_approve = vec![AutoApproveRule {
        name: Some("small".into()),
        max_memory_mb: Some(512),
        ..AutoApproveRule::default()
    }];
    let w = world(c)?;
    match verdict(&w, Requester::Parent) {
        ApprovalVerdict::AutoApproved { rule, reasons } => {
            assert_eq!(rule, "small");
            assert_eq!(reasons.len(), 1);
        }
        other => panic!("expected an automatic approval, got {other:?}"),
    }
    // No rule matches: no person is asked.
    let w = world(contract())?;
    assert_eq!(verdict(&w, Requester::Parent), ApprovalVerdict::NotNeeded);
    Ok(())
}
