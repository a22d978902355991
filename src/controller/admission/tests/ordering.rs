//! Requests racing for the last slot, and the re-check at registration.

use std::sync::{Arc, Mutex};

use super::*;

#[test]
fn two_requests_decided_on_the_same_state_race_for_the_last_slot_and_one_wins() -> TestResult {
    let mut w = world(ReplicationContract {
        max_replicas: 2,
        ..contract()
    })?;
    let root = w.root.clone();
    // Both are allowed on what the store showed when they were decided...
    let issued = |d: ChildDecision| match d {
        ChildDecision::Issued { manifest, .. } => manifest,
        other => panic!("expected a manifest, got {other:?}"),
    };
    let a = issued(w.decide(&root, request(), "w-a", T0 + 1));
    let b = issued(w.decide(&root, request(), "w-b", T0 + 1));
    // ...and only the first to reserve takes the slot.
    let first = reserve(
        &mut w.store,
        &w.contract,
        &Candidate::Child {
            parent: &root,
            manifest: &a,
        },
        T0 + 1,
    );
    let second = reserve(
        &mut w.store,
        &w.contract,
        &Candidate::Child {
            parent: &root,
            manifest: &b,
        },
        T0 + 1,
    );
    assert_eq!(first, Decision::Allow);
    assert_eq!(
        second,
        Decision::Deny(DenyReason::Quota {
            active: 2,
            max_replicas: 2
        })
    );
    assert!(!w.store.is_active(&b.worker_id));
    assert_eq!(
        w.store.lifetime_total(),
        2,
        "a refused reservation counts nothing"
    );
    Ok(())
}

#[test]
fn threads_reserving_the_last_slot_at_once_leave_exactly_one_winner() -> TestResult {
    let w = world(ReplicationContract {
        max_replicas: 2,
        ..contract()
    })?;
    let mut children = Vec::new();
    for i in 0..8 {
        match w.decide(&w.root, request(), &format!("w-{i}"), T0 + 1) {
            ChildDecision::Issued { manifest, .. } => children.push(*manifest),
            other => panic!("expected a manifest, got {other:?}"),
        }
    }
    let contract = Arc::new(w.contract);
    let root = Arc::new(w.root);
    let store = Arc::new(Mutex::new(w.store));
    let threads: Vec<_> = children
        .into_iter()
        .map(|child| {
            let (contract, root, store) = (contract.clone(), root.clone(), store.clone());
            std::thread::spawn(move || {
                let candidate = Candidate::Child {
                    parent: &root,
                    manifest: &child,
                };
                let mut store = store.lock().unwrap_or_else(|e| e.into_inner());
                reserve(&mut *store, &contract, &candidate, T0 + 1).is_allowed()
            })
        })
        .collect();
    let mut winners = 0;
    for t in threads {
        winners += usize::from(t.join().map_err(|_| "a thread panicked")?);
    }
    assert_eq!(winners, 1);
    let store = store.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(store.active_count(), 2);
    Ok(())
}

#[test]
fn a_registering_worker_is_not_counted_against_itself() -> TestResult {
    let mut w = world(ReplicationContract {
        max_replicas: 2,
        ..contract()
    })?;
    let a = w.start("w-a", T0 + 1)?;
    let view = w.store.excluding(&a.worker_id);
    assert_eq!(view.active_count(), 1);
    assert_eq!(view.lifetime_total(), 1);
    assert_eq!(view.spawns_since(T0), 1);
    let r = decide_registration(&w.contract, &mut w.signer, &*view, Some(&a), &a, T0 + 2);
    assert!(matches!(r, Registration::Accepted), "{r:?}");
    Ok(())
}

#[test]
fn registration_refuses_another_manifest_a_replay_and_an_engaged_kill_switch() -> TestResult {
    let mut w = world(contract())?;
    let a = w.start("w-a", T0 + 1)?;
    let b = w.start("w-b", T0 + 2)?;
    let view = w.store.excluding(&a.worker_id);
    let r = decide_registration(&w.contract, &mut w.signer, &*view, Some(&a), &b, T0 + 3);
    assert!(matches!(r, Registration::NotIssued { .. }), "{r:?}");
    let r = decide_registration(&w.contract, &mut w.signer, &*view, Some(&a), &a, T0 + 3);
    assert!(matches!(r, Registration::Accepted), "{r:?}");
    let r = decide_registration(&w.contract, &mut w.signer, &*view, Some(&a), &a, T0 + 3);
    assert!(matches!(r, Registration::Unverified(_)), "a replay: {r:?}");
    drop(view);
    w.store.set_kill_switch(true);
    let view = w.store.excluding(&b.worker_id);
    let r = decide_registration(&w.contract, &mut w.signer, &*view, Some(&b), &b, T0 + 3);
    assert!(
        matches!(r, Registration::Denied(DenyReason::KillSwitch)),
        "{r:?}"
    );
    Ok(())
}

#[test]
fn a_worker_approved_long_after_it_was_issued_is_not_counted_against_itself() {
    // An approved child is counted when it is approved (its reservation), which can be
    // long after its manifest was issued: its own re-check subtracts that reservation.
    let mut store = InMemoryStore::default();
    let id = worker("w-late");
    let slot = Slot {
        worker_id: id.clone(),
        parent_id: None,
        depth: 0,
        memory_limit_mb: 64,
        cpu_limit: 0.5,
        issued_at: T0,
        reserved_at: T0,
    };
    let allow = |_: &dyn RegistryView| Decision::Allow;
    assert!(store.reserve(slot, T0 + 300, &allow).is_allowed());
    assert_eq!(store.spawns_since(T0 + 240), 1);
    let view = store.excluding(&id);
    assert_eq!(
        view.spawns_since(T0 + 240),
        0,
        "its own start is not another's"
    );
}
