use super::*;

#[test]
fn the_build_time_json_of_every_shipped_profile_is_its_toml() -> Result<(), ProfileError> {
    for (name, source) in BUILTIN {
        let from_json = Profile::builtin(name)?;
        let from_toml = Profile::from_toml(source, &format!("builtin:{name}"))?;
        assert_eq!(from_json, from_toml, "{name}");
        assert_eq!(from_json.sha256, from_toml.sha256, "{name}");
    }
    for (json, toml_src) in [
        (
            include_str!(concat!(env!("OUT_DIR"), "/floor.json")),
            floor::SOURCE,
        ),
        (
            include_str!(concat!(env!("OUT_DIR"), "/floor-allowlist.json")),
            floor::ALLOWLIST_SOURCE,
        ),
    ] {
        let a: Profile = serde_json::from_str(json).map_err(|e| ProfileError::Parse {
            origin: "json".into(),
            line: None,
            column: None,
            message: e.to_string(),
        })?;
        let b: Profile = toml::from_str(toml_src).map_err(|e| ProfileError::Parse {
            origin: "toml".into(),
            line: None,
            column: None,
            message: e.to_string(),
        })?;
        assert_eq!(a, b);
    }
    Ok(())
}

#[test]
fn builtin_profiles_parse_and_compile() -> Result<(), ProfileError> {
    for (name, _) in BUILTIN {
        let p = Profile::resolve(name)?;
        assert_eq!(&p.name, name);
        assert_eq!(p.sha256.len(), 64);
        let prog = p.compile_seccomp()?;
        assert!(!prog.is_empty());
    }
    Ok(())
}

#[test]
fn unknown_keys_are_errors_with_a_line_number() {
    let src = "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\nbogus = 1\n";
    match Profile::from_toml(src, "test") {
        Err(ProfileError::Parse { message, line, .. }) => {
            assert_eq!(line, Some(4), "{message}");
            assert!(message.contains("bogus"), "{message}");
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn relative_paths_and_bad_units_are_refused() {
    let base = "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n";
    for extra in [
        "[landlock]\nread = [\"usr\"]\n",
        "[landlock]\nwrite = [\"/tmp/../etc\"]\n",
        "[mounts]\ntmp_size = \"0\"\n",
        "[limits]\nmemory = \"-1M\"\n",
        "[rlimits]\nbogus = 1\n",
        "[rlimits]\nnofile = { soft = 10, hard = 5 }\n",
    ] {
        let src = format!("{base}{extra}");
        assert!(
            Profile::from_toml(&src, "test").is_err(),
            "accepted: {extra}"
        );
    }
}

/// The error's text as a user sees it: `profile test:LINE: seccomp: ...`.
fn seccomp_error(src: &str) -> String {
    match Profile::from_toml(src, "test") {
        Err(e @ ProfileError::Seccomp { .. }) => e.to_string(),
        other => panic!("expected a seccomp error, got {other:?}"),
    }
}

#[test]
fn rule_errors_name_the_line() {
    let head = "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n";
    let m = seccomp_error(&format!(
        "{head}[[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"ptrace\",\n  \"no_such_call\"]\n"
    ));
    assert!(m.contains("test:7:") && m.contains("no_such_call"), "{m}");
    let m = seccomp_error(&format!(
        "{head}[[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"ptrace\"]\n[[seccomp.rule]]\naction = \"errno\"\nerrno = \"EPERM\"\nsyscalls = [\"ptrace\"]\n"
    ));
    assert!(
        m.contains("test:10:") && m.contains("contradicts rule 1") && m.contains("line 5"),
        "{m}"
    );
    let m = seccomp_error(&format!(
        "{head}[[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"ioctl\"]\nargs = [{{ index = 1, op = \"eq\", value = 1 }}, {{ index = 1, op = \"eq\", value = 2 }}]\n"
    ));
    assert!(m.contains("two conditions on argument 1"), "{m}");
    // Overlapping argument conditions with different actions contradict.
    let m = seccomp_error(&format!(
        "{head}[[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"write\"]\nargs = [{{ index = 0, op = \"eq\", value = 1 }}]\n[[seccomp.rule]]\naction = \"errno\"\nerrno = 1\nsyscalls = [\"write\"]\nargs = [{{ index = 1, op = \"gt\", value = 5 }}]\n"
    ));
    assert!(m.contains("contradicts") && m.contains("arg0=0x1"), "{m}");
}

#[test]
fn unknown_actions_are_parse_errors_with_the_line() {
    let src = "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n[[seccomp.rule]]\naction = \"explode\"\nsyscalls = [\"ptrace\"]\n";
    match Profile::from_toml(src, "test") {
        Err(ProfileError::Parse { message, line, .. }) => {
            assert_eq!(line, Some(5), "{message}")
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn huge_files_are_refused_before_parsing() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("huge.toml");
    std::fs::write(&path, "#".repeat(MAX_PROFILE_BYTES + 1))?;
    assert!(matches!(
        Profile::from_file(&path),
        Err(ProfileError::TooLarge { .. })
    ));
    Ok(())
}

#[test]
fn written_toml_reads_back_to_the_same_profile() -> Result<(), ProfileError> {
    for (name, _) in BUILTIN {
        let p = Profile::resolve(name)?;
        let back = Profile::from_toml(&p.to_toml()?, "back")?;
        assert_eq!(back.seccomp, p.seccomp, "{name}");
        assert_eq!(back.landlock, p.landlock, "{name}");
        assert_eq!(back.mounts, p.mounts, "{name}");
        assert_eq!(back.rlimits, p.rlimits, "{name}");
    }
    Ok(())
}

#[test]
fn allowlists_in_profiles_are_checked_and_round_trip() -> Result<(), ProfileError> {
    let base = "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n[landlock]\n";
    for bad in [
        "allow_exec = []\n",
        "allow_exec = [\"usr/bin/python3.11\"]\n",
        "allow_exec = [\"/usr/bin/../bin/sh\"]\n",
        "allow_exec = [\"/usr/bin/dash\", \"/usr/bin/dash\"]\n",
    ] {
        match Profile::from_toml(&format!("{base}{bad}"), "test") {
            Err(ProfileError::Invalid { message, .. }) => {
                assert!(message.contains("allow_exec"), "{message}")
            }
            other => panic!("accepted {bad}: {other:?}"),
        }
    }
    let p = Profile::from_toml(
        &format!("{base}allow_exec = [\"/usr/bin/dash\", \"/usr/bin/python3.11\"]\n"),
        "test",
    )?;
    let back = Profile::from_toml(&p.to_toml()?, "back")?;
    assert_eq!(back.landlock.allow_exec, p.landlock.allow_exec);
    Ok(())
}

#[test]
fn a_command_allowlist_only_narrows_the_profiles() -> Result<(), ProfileError> {
    let mut open = Profile::resolve("default")?;
    open.narrow_exec(&[PathBuf::from("/usr/bin/git")])?;
    assert_eq!(
        open.landlock.allow_exec,
        Some(vec![PathBuf::from("/usr/bin/git")])
    );
    let src = "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n[landlock]\nallow_exec = [\"/usr/bin/dash\", \"/usr/bin/python3.11\"]\n";
    let mut listed = Profile::from_toml(src, "test")?;
    listed.narrow_exec(&[])?;
    assert_eq!(listed.landlock.allow_exec.as_ref().map(Vec::len), Some(2));
    listed.narrow_exec(&[PathBuf::from("/usr/bin/python3.11")])?;
    assert_eq!(
        listed.landlock.allow_exec,
        Some(vec![PathBuf::from("/usr/bin/python3.11")])
    );
    match listed.narrow_exec(&[PathBuf::from("/usr/bin/dash")]) {
        Err(ProfileError::Invalid { message, .. }) => {
            assert!(message.contains("not in the profile"), "{message}")
        }
        other => panic!("widened the allowlist: {other:?}"),
    }
    Ok(())
}

#[test]
fn unknown_names_are_not_files() {
    assert!(matches!(
        Profile::resolve("no-such-profile"),
        Err(ProfileError::Unknown(_))
    ));
}

/// A parser's error quotes the file: a line of a megabyte, or a value of one, is quoted
/// around the place it points at, a few hundred characters at most.
#[test]
fn a_parse_error_quotes_no_more_than_a_line_a_person_reads() {
    let long = "é".repeat(1 << 19);
    for src in [
        format!("x = \"{long}\" junk\n"),
        format!("[seccomp]\ndefault_action = \"{long}\"\n"),
        format!("name = [{}]\n", "[".repeat(100_000)),
    ] {
        match Profile::from_toml(&src, "test") {
            Err(e) => {
                let text = e.to_string();
                assert!(text.chars().count() < 600, "{} characters", text.len());
            }
            Ok(_) => panic!("accepted"),
        }
    }
}

/// The same for OCI seccomp JSON: serde's message quotes a whole value.
#[test]
fn an_oci_parse_error_quotes_no_more_than_a_line_a_person_reads() {
    let src = format!("{{\"defaultAction\":\"{}\"}}", "A".repeat(100_000));
    match super::oci::parse(&src, "test") {
        Err(e) => assert!(e.to_string().len() < 600, "{} bytes", e.to_string().len()),
        Ok(_) => panic!("accepted"),
    }
}
