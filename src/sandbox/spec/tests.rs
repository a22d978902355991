use super::*;
use crate::paths::check_host_path;

fn request(cmd: &[&str]) -> RunRequest {
    RunRequest {
        command: cmd.iter().map(|s| s.to_string()).collect(),
        cgroup_name: "hatchery-test".into(),
        ..RunRequest::default()
    }
}

#[test]
fn empty_commands_and_root_ids_are_refused() -> Result<(), Box<dyn std::error::Error>> {
    let p = Profile::resolve("default")?;
    assert!(build(request(&[]), &p, None).is_err());
    assert!(build(request(&[""]), &p, None).is_err());
    let mut r = request(&["true"]);
    r.host_ids = Some((0, 0));
    assert!(build(r, &p, None).is_err());
    Ok(())
}

#[test]
fn exposures_become_binds_and_landlock_rules() -> Result<(), Box<dyn std::error::Error>> {
    let p = Profile::resolve("default")?;
    let dir = tempfile::tempdir()?;
    let canon = std::fs::canonicalize(dir.path())?;
    let mut r = request(&["true"]);
    r.exposures.push(Exposure {
        host: check_host_path(&canon)?,
        writable: true,
    });
    let spec = build(r, &p, Some(&canon))?;
    assert_eq!(spec.rootfs.exposures.len(), 1);
    assert!(spec.landlock.write.contains(&canon));
    assert_eq!(spec.cwd, canon, "the caller's cwd is kept when exposed");
    Ok(())
}

#[test]
fn reserved_and_duplicate_targets_are_refused() -> Result<(), Box<dyn std::error::Error>> {
    let p = Profile::resolve("default")?;
    let mut r = request(&["true"]);
    r.exposures.push(Exposure {
        host: check_host_path(Path::new("/proc/self"))
            .or_else(|_| check_host_path(Path::new("/proc/1")))?,
        writable: false,
    });
    assert!(build(r, &p, None).is_err());
    let dir = tempfile::tempdir()?;
    let canon = std::fs::canonicalize(dir.path())?;
    let mut r = request(&["true"]);
    for _ in 0..2 {
        r.exposures.push(Exposure {
            host: check_host_path(&canon)?,
            writable: false,
        });
    }
    assert!(build(r, &p, None).is_err());
    Ok(())
}

fn python() -> Option<PathBuf> {
    std::fs::canonicalize("/usr/bin/python3").ok()
}

#[test]
fn an_allowlist_narrows_execute_read_and_mounts() -> Result<(), Box<dyn std::error::Error>> {
    let Some(py) = python() else {
        eprintln!("SKIP: no /usr/bin/python3");
        return Ok(());
    };
    let mut p = Profile::resolve("default")?;
    p.narrow_exec(std::slice::from_ref(&py))?;
    let dir = tempfile::tempdir()?;
    let canon = std::fs::canonicalize(dir.path())?;
    let mut r = request(&["python3"]);
    r.exposures.push(Exposure {
        host: check_host_path(&canon)?,
        writable: true,
    });
    let spec = build(r, &p, None)?;
    let allow = spec.exec_allowlist.as_ref().ok_or("no allowlist")?;
    assert_eq!(allow.files, vec![py.clone()]);
    assert_eq!(allow.loaders.len(), 1, "{allow:?}");
    assert!(
        spec.landlock.execute.is_empty(),
        "{:?}",
        spec.landlock.execute
    );
    assert!(spec.landlock.exec_files.contains(&py));
    for d in exec::EXEC_DIRS {
        for r in spec.landlock.read.iter().chain(&spec.landlock.write) {
            assert!(
                !r.starts_with(d) && !Path::new(d).starts_with(r),
                "{} reaches {d}",
                r.display()
            );
        }
    }
    assert!(spec.rootfs.noexec_tmp);
    assert!(spec.rootfs.exposures.iter().all(|b| b.noexec == b.writable));
    assert_eq!(
        spec.rootfs.exposures.len(),
        1,
        "python is in /usr: nothing to pin"
    );
    let floor = Floor::new(&p.seccomp, true)?;
    assert_eq!(
        spec.seccomp.compile()?.floor,
        floor.program,
        "the floor with its allowlist rules"
    );
    Ok(())
}

#[test]
fn a_listed_file_in_an_exposed_path_is_bound_onto_itself() -> Result<(), Box<dyn std::error::Error>>
{
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir()?;
    let canon = std::fs::canonicalize(dir.path())?;
    let tool = canon.join("tool");
    std::fs::write(&tool, "#!/bin/sh\n")?;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755))?;
    let mut p = Profile::resolve("default")?;
    p.narrow_exec(std::slice::from_ref(&tool))?;
    let mut r = request(&["/bin/sh"]);
    r.exposures.push(Exposure {
        host: check_host_path(&canon)?,
        writable: false,
    });
    let spec = build(r, &p, None)?;
    let meta = std::fs::metadata(&tool)?;
    let targets: Vec<&Path> = spec
        .rootfs
        .exposures
        .iter()
        .map(|b| b.target.as_path())
        .collect();
    assert_eq!(targets, [canon.as_path(), tool.as_path()], "parents first");
    let pin = &spec.rootfs.exposures[1];
    assert_eq!((pin.host.dev, pin.host.ino), (meta.dev(), meta.ino()));
    assert!(!pin.writable && !pin.is_dir() && !pin.noexec);
    Ok(())
}

#[test]
fn files_hatchery_binds_elsewhere_stay_executable_under_an_allowlist()
-> Result<(), Box<dyn std::error::Error>> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    let tool = std::fs::canonicalize(dir.path())?.join("client");
    std::fs::write(&tool, "#!/bin/sh\n")?;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755))?;
    let listed = std::fs::canonicalize(dir.path())?.join("listed");
    std::fs::write(&listed, "#!/bin/sh\n")?;
    std::fs::set_permissions(&listed, std::fs::Permissions::from_mode(0o755))?;
    let mut p = Profile::resolve("default")?;
    p.narrow_exec(std::slice::from_ref(&listed))?;
    let inside = PathBuf::from("/run/hatchery/bin/client");
    let mut r = request(&["python3"]);
    r.exposures.push(Exposure {
        host: check_host_path(&std::fs::canonicalize(dir.path())?)?,
        writable: false,
    });
    r.extra_binds
        .push((check_host_path(&tool)?, inside.clone()));
    r.extra_binds.push((
        check_host_path(&std::fs::canonicalize(dir.path())?)?,
        PathBuf::from("/run/hatchery/dir"),
    ));
    // Its loader too, though the only listed program (a script) names none.
    let me = std::fs::canonicalize(std::env::current_exe()?)?;
    let client = PathBuf::from("/run/hatchery/bin/elf-client");
    r.extra_binds.push((check_host_path(&me)?, client.clone()));
    let spec = build(r, &p, None)?;
    assert!(spec.landlock.exec_files.contains(&inside));
    assert!(spec.landlock.exec_files.contains(&client));
    let allow = spec.exec_allowlist.as_ref().ok_or("no allowlist")?;
    assert_eq!(allow.loaders.len(), 1, "{allow:?}");
    assert!(
        !spec
            .landlock
            .exec_files
            .contains(&PathBuf::from("/run/hatchery/dir")),
        "a directory bound elsewhere gets no execute right"
    );
    Ok(())
}

#[test]
fn without_an_allowlist_nothing_is_narrowed() -> Result<(), Box<dyn std::error::Error>> {
    let p = Profile::resolve("default")?;
    let spec = build(request(&["true"]), &p, None)?;
    assert!(spec.exec_allowlist.is_none());
    assert_eq!(
        spec.seccomp.compile()?.floor,
        Floor::new(&p.seccomp, false)?.program
    );
    assert!(!spec.rootfs.noexec_tmp);
    assert!(spec.landlock.read.contains(&PathBuf::from("/usr")));
    assert!(spec.landlock.exec_files.is_empty());
    Ok(())
}

#[test]
fn an_allowlist_without_landlock_fails_closed_unless_degraded()
-> Result<(), Box<dyn std::error::Error>> {
    let Some(py) = python() else {
        eprintln!("SKIP: no /usr/bin/python3");
        return Ok(());
    };
    let mut p = Profile::resolve("default")?;
    p.narrow_exec(&[py])?;
    let host = super::super::Host {
        cgroups: None,
        cgroup_problem: Some("none here".into()),
        landlock_abi: None,
        seccomp: true,
    };
    let spec = build(request(&["python3"]), &p, None)?;
    match super::super::preflight(&spec, &host, super::super::Asker::Run) {
        Err(SandboxError::Refused { what, .. }) => {
            assert!(what.contains("allowlist"), "{what}")
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("an allowlist ran without Landlock"),
    }
    let mut r = request(&["python3"]);
    r.allow_degraded = true;
    let spec = build(r, &p, None)?;
    let e = super::super::preflight(&spec, &host, super::super::Asker::Run)?;
    assert!(
        e.not_enforced
            .iter()
            .any(|n| n.starts_with("executable allowlist")),
        "{:?}",
        e.not_enforced
    );
    Ok(())
}

#[test]
fn hostnames_the_kernel_or_a_terminal_would_choke_on_are_refused() {
    let longest = format!("{}.{}", "x".repeat(62), "y");
    for good in [
        "hatchery",
        "w-0a1b",
        "a.b-c",
        "1x",
        &"x".repeat(63),
        &longest,
    ] {
        assert!(check_rfc1123_hostname(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        "a b",
        "a\nb",
        "-x",
        ".x",
        "x-",
        "a..b",
        "a.",
        &"x".repeat(64),
        &format!("{longest}y"),
        "é",
    ] {
        assert!(check_rfc1123_hostname(bad).is_err(), "{bad:?}");
    }
    // Worker ids become hostnames under the looser rule: 64 characters, '-' anywhere after
    // the first.
    for good in [&"x".repeat(64)[..], "x-", "a..b"] {
        assert!(check_hostname(good).is_ok(), "{good}");
    }
    for bad in ["", "-x", "a b", "é", &"x".repeat(65)[..]] {
        assert!(check_hostname(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn floor_rules_libseccomp_cannot_compile_are_reported_as_not_enforced()
-> Result<(), Box<dyn std::error::Error>> {
    let p = Profile::resolve("default")?;
    let spec = build(request(&["true"]), &p, None)?;
    let host = super::super::Host {
        cgroups: None,
        cgroup_problem: Some("none here".into()),
        landlock_abi: Some(6),
        seccomp: true,
    };
    let mut filters = spec.seccomp.compile()?;
    let plan = super::super::preflight(&spec, &host, super::super::Asker::Run)?;
    let mut e = plan.enforcement(&spec);
    plan.seccomp.record(&filters, &mut e);
    assert!(
        !e.not_enforced
            .iter()
            .any(|n| n.starts_with("seccomp floor")),
        "{:?}",
        e.not_enforced
    );
    assert!(
        e.seccomp_floor.starts_with("filter ("),
        "{}",
        e.seccomp_floor
    );
    filters.floor_notes = vec!["fchmodat2 unknown".into()];
    let plan = super::super::preflight(&spec, &host, super::super::Asker::Run)?;
    let mut e = plan.enforcement(&spec);
    plan.seccomp.record(&filters, &mut e);
    assert!(
        e.not_enforced
            .contains(&"seccomp floor: fchmodat2 unknown".to_string()),
        "{:?}",
        e.not_enforced
    );
    Ok(())
}

#[test]
fn env_assignments_are_validated() {
    assert!(parse_env("A=1").is_ok());
    assert!(parse_env("A=").is_ok());
    for bad in ["A", "=1", "A B=1"] {
        assert!(parse_env(bad).is_err(), "{bad}");
    }
    let caller = |k: &str| (k == "SET").then(|| std::ffi::OsString::from("v"));
    assert_eq!(
        parse_env_arg("SET", caller).ok().flatten(),
        Some(("SET".into(), "v".into()))
    );
    assert_eq!(parse_env_arg("UNSET", caller).ok(), Some(None));
    assert!(parse_env_arg("A B", caller).is_err());
    assert!(parse_env_arg("=x", caller).is_err());
}
