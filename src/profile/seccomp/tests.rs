use super::*;

fn policy(src: &str) -> Result<SeccompPolicy, String> {
    toml::from_str(src).map_err(|e| e.to_string())
}

#[test]
fn contradicting_unconditional_rules_are_refused() -> Result<(), String> {
    let p = policy(
        "default_action = \"allow\"\n[[rule]]\naction = \"kill\"\nsyscalls = [\"ptrace\"]\n[[rule]]\naction = \"errno\"\nerrno = 1\nsyscalls = [\"ptrace\"]\n",
    )?;
    let e = p
        .validate()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("contradicts"), "{e}");
    Ok(())
}

#[test]
fn unknown_syscalls_and_actions_are_refused() -> Result<(), String> {
    let p = policy(
        "default_action = \"allow\"\n[[rule]]\naction = \"kill\"\nsyscalls = [\"no_such_call\"]\n",
    )?;
    assert!(
        p.validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
            .contains("unknown syscall")
    );
    assert!(policy("default_action = \"explode\"\n").is_err());
    let p = policy("default_action = \"errno\"\n")?;
    assert!(p.validate().is_err(), "errno default without an errno");
    Ok(())
}

#[test]
fn any_bits_fans_out_into_one_rule_per_bit() -> Result<(), String> {
    let conds = vec![ArgCondition {
        index: 0,
        op: CompareOp::AnyBits,
        value: None,
        mask: Some(ValueSpec::Expr("CLONE_NEWUSER|CLONE_NEWNS".into())),
    }];
    assert_eq!(expand_conditions(&conds)?.len(), 2);
    Ok(())
}

#[test]
fn several_any_bits_conditions_expand_into_every_combination() -> Result<(), String> {
    let any = |index, mask: &str| ArgCondition {
        index,
        op: CompareOp::AnyBits,
        value: None,
        mask: Some(ValueSpec::Expr(mask.into())),
    };
    let conds = vec![any(1, "O_CREAT|__O_TMPFILE"), any(2, "S_ISUID|S_ISGID")];
    let alternatives = expand_conditions(&conds)?;
    assert_eq!(alternatives.len(), 4);
    for a in &alternatives {
        assert_eq!(a.iter().map(|c| c.index).collect::<Vec<_>>(), [1, 2]);
    }
    // Compiled, the filter matches exactly when both conditions hold.
    let p = policy(
        "default_action = \"allow\"\n[[rule]]\naction = \"errno\"\nerrno = 1\nsyscalls = [\"open\"]\nargs = [{ index = 1, op = \"any_bits\", mask = \"O_CREAT|__O_TMPFILE\" }, { index = 2, op = \"any_bits\", mask = \"S_ISUID|S_ISGID\" }]\n",
    )?;
    let prog = p.compile()?;
    let abi = Abi::native();
    let nr = abi.syscall_nr("open").ok_or("no open here")?;
    let creat = libc::O_CREAT as u64;
    for (flags, mode, refused) in [
        (creat, 0o4755, true),
        (creat, 0o2755, true),
        (creat, 0o755, false),
        (0, 0o4755, false),
        ((libc::O_TMPFILE | libc::O_RDWR) as u64, 0o6700, true),
    ] {
        let data = abi.data(nr, [0, flags, mode, 0, 0, 0]);
        let got = super::super::bpf::evaluate(&prog, &data).map_err(|e| e.to_string())?;
        assert_eq!(got != KernelAction::Allow, refused, "{flags:#o} {mode:#o}");
        let (model, _) = p.decide(abi, nr, &[0, flags, mode, 0, 0, 0])?;
        assert_eq!(model.kernel(), got, "{flags:#o} {mode:#o}");
    }
    Ok(())
}

#[test]
fn compiled_programs_are_whole_instructions() -> Result<(), String> {
    let p = policy(
        "default_action = \"allow\"\n[[rule]]\naction = \"errno\"\nerrno = \"EPERM\"\nsyscalls = [\"mount\"]\n",
    )?;
    let prog = p.compile()?;
    assert!(prog.len() > 3);
    assert_eq!(prog.instructions().count(), prog.len());
    Ok(())
}

/// The list-form program libseccomp makes by default, for comparison with the binary tree.
fn compile_as_list(p: &SeccompPolicy) -> Result<SeccompProgram, String> {
    let mut ctx = p.filter_context()?;
    ctx.set_ctl_optimize(1).map_err(|e| e.to_string())?;
    let mut memfd = memfd("hatchery-bpf-list")?;
    ctx.export_bpf(&memfd).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    memfd
        .rewind()
        .and_then(|_| memfd.read_to_end(&mut bytes))
        .map_err(|e| e.to_string())?;
    SeccompProgram::from_bytes(bytes)
}

#[test]
fn the_binary_tree_filter_decides_every_call_as_the_list_filter_does()
-> Result<(), Box<dyn std::error::Error>> {
    use crate::profile::Profile;
    use crate::profile::abi::Abi;
    use crate::profile::bpf::SeccompData;
    use crate::profile::explore::{ArgSpace, explore_joint};
    use crate::profile::floor::Floor;
    let mut policies: Vec<(String, SeccompPolicy)> = Vec::new();
    for (name, _) in crate::profile::BUILTIN {
        let p = Profile::resolve(name)?;
        policies.push(((*name).to_string(), p.seccomp.clone()));
        for allow in [false, true] {
            policies.push((
                format!("floor under {name} (allowlist {allow})"),
                Floor::new(&p.seccomp, allow)?.policy,
            ));
        }
    }
    let docker = crate::profile::oci::parse(
        include_str!("../../../tests/fixtures/docker-default-seccomp.json"),
        "docker",
    )?;
    let docker = crate::profile::oci::import(
        &docker,
        &crate::profile::oci::ImportOptions {
            name: "docker".into(),
            source: "docker".into(),
            kernel: crate::profile::oci::KernelVersion(6, 1, 0),
        },
    )?;
    policies.push(("docker".into(), docker.profile.seccomp.clone()));
    let arches = [
        Abi::X86_64.audit_arch(),
        Abi::X86.audit_arch(),
        Abi::Aarch64.audit_arch(),
        Abi::Arm.audit_arch(),
        0,
        0xc000_00f3, // riscv64
    ];
    let mut checked = 0usize;
    for (name, p) in &policies {
        let tree = p.compile()?;
        let list = compile_as_list(p)?;
        assert_ne!(tree, list, "{name}: optimize 2 made no tree");
        let mut nrs: Vec<i32> = (-2..1100).collect();
        nrs.extend((0..1100).map(|n| n | 0x4000_0000));
        nrs.extend([i32::MAX, i32::MIN, 0x3fff_ffff, 0x4000_0000 - 1]);
        for &arch in &arches {
            for &nr in &nrs {
                let base = SeccompData {
                    nr,
                    arch,
                    ..SeccompData::default()
                };
                for j in explore_joint(&[&tree, &list], &base, &ArgSpace::any())? {
                    checked += 1;
                    assert_eq!(
                        j.rets.first(),
                        j.rets.get(1),
                        "{name}: arch {arch:#x} nr {nr} args {:x?}: tree {:?} list {:?}",
                        j.witness,
                        j.actions.first(),
                        j.actions.get(1)
                    );
                }
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
    Ok(())
}
