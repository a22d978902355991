use super::*;
use crate::profile::Profile;
use proptest::prelude::*;

fn native() -> Abi {
    Abi::native()
}

#[test]
fn default_profile_verdicts_match_its_rules() -> Result<(), Box<dyn std::error::Error>> {
    if native() != Abi::X86_64 {
        return Ok(());
    }
    let p = Profile::resolve("default")?;
    let a = Analysis::new(&p.seccomp)?;
    let ptrace = a.check(&Target::parse(native(), "ptrace")?, [0; 6])?;
    assert_eq!(ptrace.action, KernelAction::Errno(1));
    assert!(!ptrace.conditional);
    assert!(matches!(ptrace.decided_by.decider, Decider::Rule(_)));
    let getpid = a.check(&Target::parse(native(), "getpid")?, [0; 6])?;
    assert_eq!(getpid.action, KernelAction::Allow);
    assert_eq!(
        getpid.decided_by,
        DecidedBy::profile(Decider::DefaultAction)
    );
    let clone3 = a.check(&Target::parse(native(), "clone3")?, [0; 6])?;
    assert_eq!(clone3.action, KernelAction::Errno(libc::ENOSYS as u16));
    Ok(())
}

#[test]
fn argument_filters_make_verdicts_conditional() -> Result<(), Box<dyn std::error::Error>> {
    let p = Profile::resolve("default")?;
    let a = Analysis::new(&p.seccomp)?;
    let clone = Target::parse(native(), "clone")?;
    let plain = a.check(&clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0])?;
    assert_eq!(plain.action, KernelAction::Allow);
    assert!(plain.conditional);
    let newuser = a.check(&clone, [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0])?;
    assert_eq!(newuser.action, KernelAction::Errno(1));
    let actions: Vec<_> = plain.outcomes.iter().map(|o| o.action).collect();
    assert!(actions.contains(&KernelAction::Allow));
    assert!(actions.contains(&KernelAction::Errno(1)));
    // TIOCSTI is refused whatever the upper half of the request word holds.
    let ioctl = Target::parse(native(), "ioctl")?;
    let sti = a.check(
        &ioctl,
        [0, 0xdead_0000_0000_0000 | libc::TIOCSTI, 0, 0, 0, 0],
    )?;
    assert_eq!(sti.action, KernelAction::Errno(1));
    Ok(())
}

#[test]
fn foreign_abis_are_killed_by_the_native_only_default() -> Result<(), Box<dyn std::error::Error>> {
    if native() != Abi::X86_64 {
        return Ok(());
    }
    let p = Profile::resolve("default")?;
    let a = Analysis::new(&p.seccomp)?;
    for abi in [Abi::X86, Abi::X32] {
        let v = a.check(&Target::parse(abi, "getpid")?, [0; 6])?;
        assert_eq!(v.action, KernelAction::KillProcess, "{abi}");
        assert_eq!(v.decided_by, DecidedBy::profile(Decider::BadArch));
    }
    Ok(())
}

fn at(a: &Analysis<'_>, name: &str, args: [u64; 6]) -> Result<Verdict, CheckError> {
    a.check(&Target::parse(native(), name)?, args)
}

#[test]
fn the_floor_decides_where_it_is_stricter_than_the_profile()
-> Result<(), Box<dyn std::error::Error>> {
    // compat allows every ioctl; the floor refuses TIOCSTI, whatever the upper half.
    let p = Profile::resolve("compat")?;
    let a = Analysis::for_profile(&p)?;
    for request in [libc::TIOCSTI, 0xdead_0000_0000_0000 | libc::TIOCSTI] {
        let v = at(&a, "ioctl", [0, request, 0, 0, 0, 0])?;
        assert_eq!(v.action, KernelAction::Errno(1));
        assert!(v.decided_by.by_floor(), "{}", v.decided_by);
        assert!(v.decided_by.to_string().starts_with("floor rule "));
        assert!(a.reason(v.decided_by).contains("CVE-2017-5226"));
        assert_eq!(
            v.profile_alone.map(|(action, _)| action),
            Some(KernelAction::Allow)
        );
        assert_eq!(a.json(&v).decided_by, v.decided_by.to_string());
        assert!(a.describe(&v).contains("decided by floor rule"));
    }
    // Where the profile alone refuses as well, the profile's answer stands (the kernel
    // keeps the verdict of the filter loaded last on a tie): default has its own rule.
    let d = Profile::resolve("default")?;
    let a = Analysis::for_profile(&d)?;
    let v = at(&a, "ioctl", [0, libc::TIOCSTI, 0, 0, 0, 0])?;
    assert_eq!(v.action, KernelAction::Errno(1));
    assert_eq!(v.decided_by.filter, Filter::Profile);
    assert!(v.profile_alone.is_none());
    // And where the profile is stricter (a kill, another errno), the profile decides.
    let s = Profile::resolve("strict")?;
    let a = Analysis::for_profile(&s)?;
    let v = at(&a, "openat2", [0; 6])?;
    assert_eq!(
        v.action,
        KernelAction::Errno(1),
        "strict's EPERM, not the floor's ENOSYS"
    );
    assert_eq!(v.decided_by.filter, Filter::Profile);
    let v = at(&a, "socket", [libc::AF_VSOCK as u64, 1, 0, 0, 0, 0])?;
    assert_eq!(v.decided_by.filter, Filter::Profile);
    Ok(())
}

#[test]
fn the_floors_verdicts_are_part_of_every_shipped_profiles_check()
-> Result<(), Box<dyn std::error::Error>> {
    let vsock = libc::AF_VSOCK as u64;
    let netlink = libc::AF_NETLINK as u64;
    for (name, _) in crate::profile::BUILTIN {
        let p = Profile::resolve(name)?;
        let a = Analysis::for_profile(&p)?;
        for (call, args) in [
            ("socket", [vsock, 1, 0, 0, 0, 0]),
            ("socket", [0xffff_ffff_0000_0000 | vsock, 1, 0, 0, 0, 0]),
            ("socket", [netlink, 3, 2, 0, 0, 0]),
            ("socket", [netlink, 3, 9, 0, 0, 0]),
            ("chmod", [0, 0o4755, 0, 0, 0, 0]),
            ("fchmodat", [0, 0, 0o2755, 0, 0, 0]),
            ("openat", [0, 0, libc::O_CREAT as u64, 0o4755, 0, 0]),
            ("ioctl", [0, libc::TIOCLINUX, 0, 0, 0, 0]),
        ] {
            let v = at(&a, call, args)?;
            assert!(!v.action.runs(), "{name}: {call}{args:x?} runs");
        }
        // What the floor leaves alone stays the profile's.
        let v = at(&a, "chmod", [0, 0o755, 0, 0, 0, 0])?;
        assert_eq!(v.decided_by.filter, Filter::Profile, "{name}");
    }
    Ok(())
}

#[test]
fn under_an_allowlist_memory_files_are_refused_by_the_floor()
-> Result<(), Box<dyn std::error::Error>> {
    let mut p = Profile::resolve("compat")?;
    let plain = Analysis::for_profile(&p)?;
    assert_eq!(
        at(&plain, "memfd_create", [0, 8, 0, 0, 0, 0])?.action,
        KernelAction::Allow
    );
    p.narrow_exec(&[std::path::PathBuf::from("/usr/bin/python3.11")])?;
    let a = Analysis::for_profile(&p)?;
    let eacces = KernelAction::Errno(libc::EACCES as u16);
    for flags in [0u64, 8, 1] {
        let v = at(&a, "memfd_create", [0, flags, 0, 0, 0, 0])?;
        assert_eq!(v.action, eacces);
        assert!(v.decided_by.by_floor());
        assert!(a.reason(v.decided_by).contains("executable allowlist"));
    }
    assert_eq!(at(&a, "memfd_secret", [0; 6])?.action, eacces);
    let shm_exec = libc::SHM_EXEC as u64;
    assert_eq!(at(&a, "shmat", [0, 0, shm_exec, 0, 0, 0])?.action, eacces);
    assert_eq!(
        at(&a, "shmat", [0, 0, 0, 0, 0, 0])?.action,
        KernelAction::Allow
    );
    Ok(())
}

#[test]
fn unknown_names_are_errors_with_a_hint() {
    if native() != Abi::X86_64 {
        return;
    }
    match Target::parse(Abi::X86_64, "socketcall") {
        Err(CheckError::UnknownSyscall { hint, .. }) => assert!(hint.contains("x86"), "{hint}"),
        other => panic!("expected an unknown-syscall error, got {other:?}"),
    }
    assert!(Target::parse(Abi::X86_64, "no_such_call").is_err());
}

#[test]
fn every_syscall_of_every_shipped_profile_agrees_with_its_rules()
-> Result<(), Box<dyn std::error::Error>> {
    for (name, _) in crate::profile::BUILTIN {
        let p = Profile::resolve(name)?;
        for a in [Analysis::new(&p.seccomp)?, Analysis::for_profile(&p)?] {
            for abi in Abi::runnable() {
                let all = a.check_all(abi)?;
                assert!(!all.is_empty(), "{name} {abi}");
            }
        }
    }
    Ok(())
}

fn any_args() -> impl Strategy<Value = [u64; 6]> {
    let word = prop_oneof![
        Just(0u64),
        any::<u64>(),
        any::<u32>().prop_map(u64::from),
        (0u32..64).prop_map(|b| 1u64 << b),
        Just(libc::TIOCSTI),
        Just(libc::TIOCLINUX),
        Just(0xffff_ffffu64),
        Just(libc::CLONE_NEWUSER as u64),
        Just(libc::AF_VSOCK as u64),
        Just(libc::AF_NETLINK as u64),
        Just(u64::from(libc::S_ISUID | 0o755)),
        Just(libc::O_CREAT as u64),
        Just(libc::SHM_EXEC as u64),
    ];
    proptest::array::uniform6(word)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// For random arguments, the compiled filters (the floor's and the profile's) and
    /// their rules agree on every shipped profile, for syscalls with argument rules and
    /// without.
    #[test]
    fn filter_and_rules_agree_for_random_arguments(args in any_args(), pick in 0usize..18) {
        let names = ["clone", "ioctl", "personality", "socket", "getpid", "ptrace",
                     "unshare", "mount", "write", "openat", "execve", "prctl",
                     "chmod", "open", "mknodat", "socketcall", "ipc", "shmat"];
        let docker = crate::profile::oci::parse(
            include_str!("../../../tests/fixtures/docker-default-seccomp.json"), "docker")
            .map_err(|e| e.to_string())
            .and_then(|j| crate::profile::oci::import(&j, &crate::profile::oci::ImportOptions {
                name: "docker".into(), source: "docker".into(),
                kernel: crate::profile::oci::KernelVersion(6, 1, 0),
            }).map_err(|e| e.to_string()));
        let docker = match docker { Ok(d) => d.profile, Err(e) => panic!("{e}") };
        let shipped = crate::profile::BUILTIN.iter().map(|(n, _)| Profile::resolve(n));
        for p in shipped.chain(std::iter::once(Ok(docker))) {
            let p = match p { Ok(p) => p, Err(e) => panic!("{e}") };
            let profile = p.name.clone();
            let a = match Analysis::for_profile(&p) { Ok(a) => a, Err(e) => panic!("{e}") };
            for abi in Abi::runnable() {
                let Ok(t) = Target::parse(abi, names[pick]) else { continue };
                if let Err(e) = a.check(&t, args) {
                    prop_assert!(false, "{profile} {abi}: {e}");
                }
            }
        }
    }
}
