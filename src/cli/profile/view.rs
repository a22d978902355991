//! `hatchery profile show`: a profile as a table of its rules (with the seccomp floor
//! beneath it), as its own TOML's JSON, or as OCI seccomp JSON.

use super::*;

fn value_text(v: &Option<ValueSpec>) -> String {
    match v {
        Some(ValueSpec::Number(n)) if *n > 9 => format!("{n:#x}"),
        Some(ValueSpec::Number(n)) => n.to_string(),
        Some(ValueSpec::Expr(e)) => e.clone(),
        None => "?".into(),
    }
}

fn condition_text(c: &ArgCondition) -> String {
    let group = |t: String| if t.contains('|') { format!("({t})") } else { t };
    let (v, m) = (value_text(&c.value), group(value_text(&c.mask)));
    let a = format!("arg{}", c.index);
    match c.op {
        CompareOp::Eq => format!("{a} == {v}"),
        CompareOp::Ne => format!("{a} != {v}"),
        CompareOp::Lt => format!("{a} < {v}"),
        CompareOp::Le => format!("{a} <= {v}"),
        CompareOp::Gt => format!("{a} > {v}"),
        CompareOp::Ge => format!("{a} >= {v}"),
        CompareOp::MaskedEq => format!("{a} & {m} == {v}"),
        CompareOp::AnyBits => format!("{a} has any of {m}"),
    }
}

fn table(p: &Profile) -> anyhow::Result<String> {
    let s = &p.seccomp;
    let mut t = String::new();
    t.push_str(&format!("profile     {} ({})\n", p.name, p.origin));
    t.push_str(&format!("sha256      {}\n", p.sha256));
    if !p.description.is_empty() {
        t.push_str(&format!("about       {}\n", p.description));
    }
    let arches: Vec<String> = s
        .arches()
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .filter_map(Abi::from_scmp)
        .map(|a| a.name().to_string())
        .collect();
    t.push_str(&format!(
        "seccomp     default {}; accepts {}; other ABIs: {}\n",
        s.default_action().map_err(anyhow::Error::msg)?,
        arches.join(", "),
        s.bad_arch_action().map_err(anyhow::Error::msg)?
    ));
    rule_lines(&mut t, s, "rule", |_| false)?;
    floor_section(&mut t, p)?;
    let paths = |v: &[PathBuf]| {
        if v.is_empty() {
            "(none)".to_string()
        } else {
            v.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        }
    };
    let l = &p.landlock;
    t.push_str(&format!(
        "landlock    read {}; write {}; execute {}; min ABI {}\n",
        paths(&l.read),
        paths(&l.write),
        paths(&l.execute),
        l.min_abi
    ));
    if let Some(allow) = &l.allow_exec {
        t.push_str(&format!(
            "allow_exec  {} (an executable allowlist: nothing else runs)\n",
            paths(allow)
        ));
    }
    let n = &p.namespaces;
    let mut ns = vec!["user", "pid", "mount"];
    for (on, name) in [
        (n.net, "net"),
        (n.ipc, "ipc"),
        (n.uts, "uts"),
        (n.cgroup, "cgroup"),
    ] {
        if on {
            ns.push(name);
        }
    }
    t.push_str(&format!("namespaces  {}\n", ns.join(" ")));
    let m = &p.mounts;
    t.push_str(&format!(
        "mounts      system {}; /tmp {}; /dev/shm {}\n",
        paths(&m.system),
        m.tmp_size,
        if m.dev_shm { "yes" } else { "no" }
    ));
    let rl: Vec<String> = p
        .rlimits()?
        .iter()
        .map(|r| {
            let v = |x: u64| {
                if x == u64::MAX {
                    "unlimited".to_string()
                } else {
                    x.to_string()
                }
            };
            if r.soft == r.hard {
                format!("{}={}", r.resource.name(), v(r.soft))
            } else {
                format!("{}={}/{}", r.resource.name(), v(r.soft), v(r.hard))
            }
        })
        .collect();
    t.push_str(&format!(
        "rlimits     {}\n",
        if rl.is_empty() {
            "(none)".into()
        } else {
            rl.join(" ")
        }
    ));
    let d = &p.limits;
    let mut lim = Vec::new();
    if let Some(v) = &d.memory {
        lim.push(format!("memory {v}"));
    }
    if let Some(v) = d.cpus {
        lim.push(format!("cpus {v}"));
    }
    if let Some(v) = d.pids {
        lim.push(format!("pids {v}"));
    }
    if let Some(v) = &d.timeout {
        lim.push(format!("timeout {v}"));
    }
    t.push_str(&format!(
        "limits      {}\n",
        if lim.is_empty() {
            "(none: the command line decides)".into()
        } else {
            lim.join(", ")
        }
    ));
    Ok(t)
}

/// One line per rule (and its reason), numbered as `profile check` names them.
fn rule_lines(
    t: &mut String,
    s: &SeccompPolicy,
    label: &str,
    allowlist_only: impl Fn(usize) -> bool,
) -> anyhow::Result<()> {
    for (i, r) in s.rules.iter().enumerate() {
        let action = r.action().map_err(anyhow::Error::msg)?;
        let conds: Vec<String> = r.args.iter().map(condition_text).collect();
        t.push_str(&format!(
            "  {label} {:<3} {:<18} {}",
            i + 1,
            action.to_string(),
            r.syscalls.join(" ")
        ));
        if !conds.is_empty() {
            t.push_str(&format!("  when {}", conds.join(" and ")));
        }
        if allowlist_only(i) {
            t.push_str("  (under an executable allowlist)");
        }
        t.push('\n');
        if !r.reason.is_empty() {
            t.push_str(&format!(
                "{}why: {}\n",
                " ".repeat(label.len() + 7),
                r.reason
            ));
        }
    }
    Ok(())
}

/// The floor's rules as they apply under this profile; the allowlist rules are shown too,
/// marked, since `run --allow-exec` can add them to any profile.
fn floor_section(t: &mut String, p: &Profile) -> anyhow::Result<()> {
    let floor = Floor::new(&p.seccomp, true)?;
    let arches: Vec<String> = floor
        .policy
        .arches()
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .filter_map(Abi::from_scmp)
        .map(|a| a.name().to_string())
        .collect();
    t.push_str(
        "floor       the seccomp floor, applied under every profile: a filter of its own, loaded before\n            the profile's; the kernel applies the most restrictive verdict of the two\n",
    );
    t.push_str(&format!(
        "            default allow; filters {}; {} instructions under this profile{}\n",
        arches.join(", "),
        Floor::for_profile(p)?.program.len(),
        if p.landlock.allow_exec.is_some() {
            " (its allowlist rules included)"
        } else {
            ""
        },
    ));
    rule_lines(t, &floor.policy, "floor rule", |i| {
        floor.is_allowlist_rule(i)
    })?;
    for n in &floor.notes {
        t.push_str(&format!("            note: {n}\n"));
    }
    Ok(())
}

/// What a format that shows the profile's own filter says about the floor.
fn floor_note(p: &Profile) -> anyhow::Result<String> {
    Ok(format!(
        "the seccomp floor is loaded in addition, before this filter ({} instructions; its rules: hatchery profile show {})",
        Floor::for_profile(p)?.program.len(),
        p.origin.strip_prefix("builtin:").unwrap_or(&p.origin)
    ))
}

pub(super) fn oci_json(p: &Profile) -> anyhow::Result<String> {
    let (json, notes) = oci::export(&p.seccomp).map_err(anyhow::Error::msg)?;
    for n in notes {
        error_line!("note: {n}");
    }
    error_line!("note: this is the profile's own filter; {}", floor_note(p)?);
    Ok(hatchery::text::to_json_pretty(&json)? + "\n")
}

/// The resolved profile as JSON: the file's keys with every default filled in, where it
/// came from, its hash, and the seccomp floor loaded under it.
fn profile_json(p: &Profile) -> anyhow::Result<String> {
    let mut v = serde_json::to_value(p)?;
    let floor = Floor::new(&p.seccomp, true)?;
    if let Some(map) = v.as_object_mut() {
        map.insert("origin".into(), p.origin.clone().into());
        map.insert("sha256".into(), p.sha256.clone().into());
        map.insert(
            "floor".into(),
            serde_json::json!({
                "instructions": Floor::for_profile(p)?.program.len(),
                "rules": floor.policy.rules,
                "allowlist_rules_from": floor.allowlist_from + 1,
                "notes": floor.notes,
            }),
        );
    }
    Ok(hatchery::text::to_json_pretty(&v)? + "\n")
}

pub(super) fn show(a: ShowArgs) -> anyhow::Result<i32> {
    let p = load(&a.profile)?;
    let format = if a.json { ShowFormat::Json } else { a.format };
    let text = match format {
        ShowFormat::Table => table(&p)?,
        ShowFormat::Json => profile_json(&p)?,
        ShowFormat::Toml => p.to_toml()?,
        ShowFormat::OciJson => oci_json(&p)?,
        ShowFormat::Pfc => format!(
            "# the profile's own filter; {}\n{}",
            floor_note(&p)?,
            p.seccomp.pfc().map_err(anyhow::Error::msg)?
        ),
        ShowFormat::Bpf => {
            let prog = p.compile_seccomp()?;
            format!(
                "# {} instructions, {} bytes, as loaded by seccomp(2)\n# {}\n{}",
                prog.len(),
                prog.as_bytes().len(),
                floor_note(&p)?,
                bpf::disassemble(&prog)
            )
        }
    };
    out(&text)
}
