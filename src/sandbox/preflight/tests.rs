use super::*;
use crate::profile::Profile;
use crate::sandbox::spec::{RunRequest, build};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn spec(limits: Limits, degraded: bool) -> Result<SandboxSpec> {
    let p = Profile::resolve("default")?;
    let req = RunRequest {
        command: vec!["true".into()],
        cgroup_name: "hatchery-test".into(),
        limits,
        allow_degraded: degraded,
        ..RunRequest::default()
    };
    Ok(build(req, &p, None)?)
}

fn host(landlock_abi: Option<u8>, seccomp: bool) -> Host {
    Host {
        cgroups: None,
        cgroup_problem: Some("no cgroups here".into()),
        landlock_abi,
        seccomp,
    }
}

fn refusal(r: std::result::Result<Plan, SandboxError>) -> (String, String, String) {
    match r {
        Err(SandboxError::Refused { what, why, fix }) => (what, why, fix),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(p) => panic!("not refused: {p:?}"),
    }
}

#[test]
fn a_full_host_plans_every_mechanism() -> Result {
    let s = spec(Limits::default(), false)?;
    let plan = preflight(&s, &host(Some(6), true), Asker::Run)?;
    assert_eq!(plan.seccomp, SeccompPlan::Filters);
    assert_eq!(plan.landlock, LandlockPlan::Rules { abi: 6 });
    assert_eq!(plan.cgroup, CgroupPlan::Off, "no host cgroups in this test");
    let e = plan.enforcement(&s);
    assert_eq!(e.seccomp, "filter");
    assert_eq!(e.landlock, "pending");
    assert_eq!(e.landlock_abi, Some(6));
    assert_eq!(e.cgroup, "none");
    assert_eq!(
        e.namespaces,
        ["user", "pid", "mount", "net", "ipc", "uts", "cgroup"]
    );
    Ok(())
}

#[test]
fn each_refusal_names_its_own_fix_and_the_askers_way_to_degrade() -> Result {
    let s = spec(Limits::default(), false)?;
    let (what, _, fix) = refusal(preflight(&s, &host(Some(6), false), Asker::Run));
    assert_eq!(what, "seccomp");
    assert!(fix.starts_with(fix::SECCOMP), "{fix}");
    assert!(fix.ends_with(Asker::Run.degrade_hint()), "{fix}");
    let (what, _, fix) = refusal(preflight(&s, &host(None, true), Asker::Controller));
    assert_eq!(what, "Landlock filesystem rules");
    assert!(fix.starts_with(fix::LANDLOCK), "{fix}");
    assert!(
        fix.ends_with(Asker::Controller.degrade_hint()),
        "a worker's refusal names the controller's flag: {fix}"
    );
    Ok(())
}

#[test]
fn a_limit_without_cgroups_is_refused_with_the_askers_own_command() -> Result {
    let limits = Limits {
        memory: Some(64 << 20),
        ..Limits::default()
    };
    let mut s = spec(limits, false)?;
    s.identity.rootless = true;
    for (asker, command) in [
        (Asker::Run, "hatchery run"),
        (Asker::Controller, "hatchery controller"),
    ] {
        let (what, why, fix) = refusal(preflight(&s, &host(Some(6), true), asker));
        assert_eq!(what, "--memory");
        assert_eq!(why, "no cgroups here");
        assert!(
            fix.contains(&format!("Delegate=yes {command} ...")),
            "{fix}"
        );
    }
    s.identity.rootless = false;
    let (_, _, fix) = refusal(preflight(&s, &host(Some(6), true), Asker::Run));
    assert!(fix.starts_with(fix::CGROUP_CONTROLLERS), "{fix}");
    Ok(())
}

#[test]
fn degraded_limits_become_rlimits_and_say_so() -> Result {
    let limits = Limits {
        memory: Some(64 << 20),
        cpus: Some(0.5),
        pids: Some(10),
    };
    let s = spec(limits, true)?;
    let plan = preflight(&s, &host(None, false), Asker::Run)?;
    assert_eq!(plan.cgroup, CgroupPlan::Off);
    assert_eq!(plan.seccomp, SeccompPlan::Off);
    assert_eq!(plan.landlock, LandlockPlan::Off);
    let rl: Vec<_> = plan
        .fallback_rlimits
        .iter()
        .map(|r| (r.resource, r.soft, r.hard))
        .collect();
    assert_eq!(
        rl,
        [
            (RlimitResource::As, 64 << 20, 64 << 20),
            // pid 1 counts against the sandbox uid's RLIMIT_NPROC too.
            (RlimitResource::Nproc, 11, 11)
        ]
    );
    assert!(plan.limits["memory"].starts_with("RLIMIT_AS"));
    assert!(plan.limits["pids"].starts_with("RLIMIT_NPROC"));
    assert!(!plan.limits.contains_key("cpus"));
    for start in ["seccomp:", "landlock:", "cpus limit:", "accounting"] {
        assert!(
            plan.not_enforced.iter().any(|n| n.starts_with(start)),
            "{start}: {:?}",
            plan.not_enforced
        );
    }
    let e = plan.enforcement(&s);
    assert_eq!((e.seccomp.as_str(), e.landlock.as_str()), ("none", "none"));
    Ok(())
}

#[test]
fn a_landlock_abi_below_the_profiles_minimum_is_not_enough() -> Result {
    let mut s = spec(Limits::default(), false)?;
    s.landlock_min_abi = 3;
    let (_, why, _) = refusal(preflight(&s, &host(Some(2), true), Asker::Run));
    assert!(why.contains("ABI 2"), "{why}");
    s.allow_degraded = true;
    let plan = preflight(&s, &host(Some(2), true), Asker::Run)?;
    assert_eq!(plan.landlock, LandlockPlan::Off);
    Ok(())
}

#[test]
fn namespaces_the_profile_shares_are_reported() -> Result {
    let mut s = spec(Limits::default(), false)?;
    s.namespaces.net = false;
    let plan = preflight(&s, &host(Some(6), true), Asker::Run)?;
    assert!(!plan.namespaces.contains(&"net"));
    assert!(
        plan.not_enforced
            .iter()
            .any(|n| n.starts_with("net namespace: shared")),
        "{:?}",
        plan.not_enforced
    );
    Ok(())
}

#[test]
fn only_compiled_filters_of_a_filtered_plan_are_recorded() -> Result {
    let s = spec(Limits::default(), false)?;
    let filters = s.seccomp.compile()?;
    let plan = preflight(&s, &host(Some(6), true), Asker::Run)?;
    let mut e = plan.enforcement(&s);
    plan.seccomp.record(&filters, &mut e);
    assert!(e.seccomp.starts_with("filter ("), "{}", e.seccomp);
    let mut e = plan.enforcement(&s);
    SeccompPlan::Off.record(&filters, &mut e);
    assert_eq!(
        e.seccomp, "filter",
        "an unfiltered plan leaves the word as planned"
    );
    Ok(())
}
