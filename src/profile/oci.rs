//! The OCI / Docker seccomp JSON format: import into a hatchery profile, export from one.
//!
//! Import resolves what Docker resolves when it starts a container — `includes` and
//! `excludes` on capabilities, architecture and kernel version — for a hatchery worker,
//! which has no capabilities at all, on this machine. What cannot be carried over is
//! dropped only when dropping it cannot let a syscall through that the JSON denies (a
//! name this libseccomp does not know in an allow rule simply stays denied), each time
//! with a note; where dropping would widen the filter, import fails.

use libseccomp::ScmpArch;
use serde::{Deserialize, Serialize};

use super::abi::Abi;
use super::seccomp::{Action, CompareOp, Comparison, SeccompPolicy, expand_conditions};
use super::{MAX_PROFILE_BYTES, Profile, ProfileError};

mod import;
pub use import::import;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum OciAction {
    SCMP_ACT_KILL,
    SCMP_ACT_KILL_PROCESS,
    SCMP_ACT_KILL_THREAD,
    SCMP_ACT_TRAP,
    SCMP_ACT_ERRNO,
    SCMP_ACT_TRACE,
    SCMP_ACT_ALLOW,
    SCMP_ACT_LOG,
    SCMP_ACT_NOTIFY,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum OciOp {
    SCMP_CMP_NE,
    SCMP_CMP_LT,
    SCMP_CMP_LE,
    SCMP_CMP_EQ,
    SCMP_CMP_GE,
    SCMP_CMP_GT,
    SCMP_CMP_MASKED_EQ,
}

/// A seccomp profile in the OCI runtime-spec / Docker format.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OciProfile {
    pub default_action: OciAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_errno_ret: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architectures: Option<Vec<String>>,
    /// Docker's per-machine architecture lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch_map: Option<Vec<OciArchMap>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_metadata: Option<String>,
    #[serde(default)]
    pub syscalls: Vec<OciSyscall>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OciArchMap {
    pub architecture: String,
    #[serde(default)]
    pub sub_architectures: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OciSyscall {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// The old single-name form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub action: OciAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno_ret: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<OciArg>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub includes: Option<OciFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excludes: Option<OciFilter>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OciArg {
    pub index: u32,
    #[serde(default)]
    pub value: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub value_two: u64,
    pub op: OciOp,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OciFilter {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caps: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arches: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_kernel: Option<String>,
}

/// A kernel version as `includes.minKernel` compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion(pub u32, pub u32, pub u32);

impl KernelVersion {
    /// Parses `6.1`, `4.8.0` or a `uname -r` string such as `6.18.44-fc-v669`.
    pub fn parse(s: &str) -> Result<KernelVersion, String> {
        let core = s
            .trim()
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()
            .unwrap_or("");
        let mut parts = core.split('.').filter(|p| !p.is_empty());
        let mut next = |required: bool| -> Result<u32, String> {
            match parts.next() {
                Some(p) => p.parse().map_err(|_| format!("bad kernel version {s:?}")),
                None if required => Err(format!("bad kernel version {s:?} (expected X.Y)")),
                None => Ok(0),
            }
        };
        Ok(KernelVersion(next(true)?, next(true)?, next(false)?))
    }

    /// The running kernel.
    pub fn running() -> Result<KernelVersion, String> {
        let uts = nix::sys::utsname::uname().map_err(|e| format!("uname: {e}"))?;
        KernelVersion::parse(&uts.release().to_string_lossy())
    }
}

impl std::fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// What an import is resolved for.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Name of the resulting profile.
    pub name: String,
    /// Where the JSON came from, for the description and errors.
    pub source: String,
    /// The kernel `includes.minKernel` is compared with.
    pub kernel: KernelVersion,
}

/// An imported profile and what the import had to leave out or change, and why.
#[derive(Debug, Clone)]
pub struct Imported {
    pub profile: Profile,
    pub notes: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("{origin}: {message}")]
    Json { origin: String, message: String },
    #[error("{origin}: {message}")]
    Unsupported { origin: String, message: String },
    #[error("{0}")]
    Profile(#[from] ProfileError),
}

/// Docker's name for this machine's architecture (Go's GOARCH).
fn native_goarch() -> &'static str {
    match Abi::native() {
        Abi::X86_64 => "amd64",
        Abi::X86 => "386",
        Abi::X32 => "x32",
        Abi::Aarch64 => "arm64",
        Abi::Arm => "arm",
    }
}

fn oci_arch_name(arch: ScmpArch) -> Option<&'static str> {
    Some(match arch {
        ScmpArch::X8664 => "SCMP_ARCH_X86_64",
        ScmpArch::X86 => "SCMP_ARCH_X86",
        ScmpArch::X32 => "SCMP_ARCH_X32",
        ScmpArch::Aarch64 => "SCMP_ARCH_AARCH64",
        ScmpArch::Arm => "SCMP_ARCH_ARM",
        ScmpArch::Riscv64 => "SCMP_ARCH_RISCV64",
        ScmpArch::Ppc64Le => "SCMP_ARCH_PPC64LE",
        ScmpArch::S390X => "SCMP_ARCH_S390X",
        _ => return None,
    })
}

/// Parses OCI JSON, bounded in size, with errors naming line and column.
pub fn parse(text: &str, origin: &str) -> Result<OciProfile, OciError> {
    if text.len() > MAX_PROFILE_BYTES {
        return Err(OciError::Json {
            origin: origin.to_string(),
            message: format!(
                "too large ({} bytes; the limit is {MAX_PROFILE_BYTES})",
                text.len()
            ),
        });
    }
    serde_json::from_str(text).map_err(|e| OciError::Json {
        origin: origin.to_string(),
        message: format!(
            "line {}, column {}: {}",
            e.line(),
            e.column(),
            crate::text::clip(&e.to_string(), 300)
        ),
    })
}

/// The profile as a TOML file, the import notes as comments at the top.
pub fn to_toml(profile: &Profile, notes: &[String]) -> Result<String, ProfileError> {
    let body = profile.to_toml()?;
    let mut out = format!(
        "# hatchery profile {:?}, imported from OCI seccomp JSON.\n# Landlock, mounts, namespaces and rlimits are hatchery's defaults; edit them as needed.\n",
        profile.name
    );
    if !notes.is_empty() {
        out.push_str("#\n# Import notes:\n");
        for n in notes {
            // A comment ends at a line's end: a note's own line breaks (and every other
            // control character) are written escaped, never raw.
            let note = crate::text::clip(n, 300);
            out.push_str(&format!("#  - {}\n", crate::text::escape_controls(&note)));
        }
    }
    out.push('\n');
    out.push_str(&body);
    Ok(out)
}

/// An action as OCI JSON writes it, with its errno.
fn oci_action(a: Action) -> (OciAction, Option<u32>) {
    match a {
        Action::Allow => (OciAction::SCMP_ACT_ALLOW, None),
        Action::Errno(e) => (OciAction::SCMP_ACT_ERRNO, Some(e as u32)),
        Action::Kill => (OciAction::SCMP_ACT_KILL_PROCESS, None),
        Action::Log => (OciAction::SCMP_ACT_LOG, None),
        Action::Trap => (OciAction::SCMP_ACT_TRAP, None),
    }
}

/// One comparison as OCI JSON writes it (a masked one: the mask in `value`, the datum in
/// `valueTwo`).
fn oci_arg(c: Comparison) -> OciArg {
    let (op, value, value_two) = match c.op {
        CompareOp::Eq => (OciOp::SCMP_CMP_EQ, c.value, 0),
        CompareOp::Ne => (OciOp::SCMP_CMP_NE, c.value, 0),
        CompareOp::Lt => (OciOp::SCMP_CMP_LT, c.value, 0),
        CompareOp::Le => (OciOp::SCMP_CMP_LE, c.value, 0),
        CompareOp::Gt => (OciOp::SCMP_CMP_GT, c.value, 0),
        CompareOp::Ge => (OciOp::SCMP_CMP_GE, c.value, 0),
        CompareOp::MaskedEq | CompareOp::AnyBits => (OciOp::SCMP_CMP_MASKED_EQ, c.mask, c.value),
    };
    OciArg {
        index: c.index,
        value,
        value_two,
        op,
    }
}

/// The profile's seccomp policy as OCI JSON, and what the format cannot say.
pub fn export(policy: &SeccompPolicy) -> Result<(OciProfile, Vec<String>), String> {
    let mut notes = Vec::new();
    let (default_action, default_errno_ret) = oci_action(policy.default_action()?);
    if policy.bad_arch_action()? != Action::Kill {
        notes.push(format!(
            "bad_arch_action {} cannot be written in OCI JSON; runtimes kill syscalls of other ABIs",
            policy.bad_arch_action()?
        ));
    }
    let mut architectures = Vec::new();
    for arch in policy.arches()? {
        match oci_arch_name(arch) {
            Some(n) => architectures.push(n.to_string()),
            None => notes.push(format!("architecture {arch:?} has no OCI name; left out")),
        }
    }
    let mut syscalls = Vec::new();
    for (i, rule) in policy.rules.iter().enumerate() {
        let (action, errno_ret) =
            oci_action(rule.action().map_err(|e| format!("rule {}: {e}", i + 1))?);
        // "Any of these bits" is one masked comparison per bit, each its own entry.
        let variants: Vec<Vec<OciArg>> = expand_conditions(&rule.args)?
            .into_iter()
            .map(|alternative| alternative.into_iter().map(oci_arg).collect())
            .collect();
        for args in variants {
            syscalls.push(OciSyscall {
                names: rule.syscalls.clone(),
                name: None,
                action,
                errno_ret,
                args,
                comment: (!rule.reason.is_empty()).then(|| rule.reason.clone()),
                includes: None,
                excludes: None,
            });
        }
    }
    Ok((
        OciProfile {
            default_action,
            default_errno_ret,
            architectures: Some(architectures),
            arch_map: None,
            flags: Vec::new(),
            listener_path: None,
            listener_metadata: None,
            syscalls,
        },
        notes,
    ))
}

/// A name for an imported profile from its file name.
pub fn name_from_path(path: &std::path::Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let clean: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if clean.is_empty() {
        "imported".into()
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::diff;

    const DOCKER: &str = include_str!("../../tests/fixtures/docker-default-seccomp.json");

    fn opts(kernel: KernelVersion) -> ImportOptions {
        ImportOptions {
            name: "imported".into(),
            source: "test.json".into(),
            kernel,
        }
    }

    fn import_text(json: &str) -> Result<Imported, OciError> {
        import(&parse(json, "test.json")?, &opts(KernelVersion(6, 1, 0)))
    }

    fn same_verdicts(a: &Profile, b: &Profile) -> Result<(), Box<dyn std::error::Error>> {
        let mut d = diff::ProfileDiff::default();
        diff::seccomp_diff(a, b, &mut d)?;
        assert!(d.syscalls.is_empty() && d.abis.is_empty(), "{d:?}");
        Ok(())
    }

    /// A name with a newline in it, unknown to libseccomp, was noted in a comment of the
    /// TOML written, where it ended the comment and set `[lint] accept` of its own.
    #[test]
    fn a_syscall_name_cannot_write_keys_into_the_imported_profile()
    -> Result<(), Box<dyn std::error::Error>> {
        let injected = "zz\nlint = { accept = [\"bpf\"] }\n#";
        let json = serde_json::json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [{"names": ["read", "bpf", injected], "action": "SCMP_ACT_ALLOW"}]
        });
        let refused = import_text(&json.to_string());
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().contains("no syscall's name")),
            "{:?}",
            refused.map(|i| i.notes)
        );
        // Whatever a note says, it stays one comment line.
        let clean = serde_json::json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]
        });
        let imported = import_text(&clean.to_string())?;
        let text = to_toml(&imported.profile, &[format!("note {injected}\u{2028}x")])?;
        assert!(
            text.lines()
                .take_while(|l| !l.is_empty())
                .all(|l| l.starts_with('#')),
            "{text}"
        );
        let again: toml::Value = toml::from_str(&text)?;
        assert!(again.get("lint").is_none(), "{text}");
        Ok(())
    }

    #[test]
    fn docker_default_imports_for_a_worker_without_capabilities()
    -> Result<(), Box<dyn std::error::Error>> {
        let imported = import_text(DOCKER)?;
        let p = &imported.profile;
        let names: Vec<&str> = p
            .seccomp
            .rules
            .iter()
            .flat_map(|r| r.syscalls.iter().map(String::as_str))
            .collect();
        // Rules that need a capability are gone; unconditional ones stay.
        assert!(!names.contains(&"bpf") && !names.contains(&"reboot"));
        assert!(names.contains(&"read") && names.contains(&"ptrace"));
        assert!(imported.notes.iter().any(|n| n.contains("CAP_SYS_ADMIN")));
        // archMap's x86_64 entry brings in its i386 and x32 sub-architectures.
        if Abi::native() == Abi::X86_64 {
            assert_eq!(p.seccomp.architectures, vec!["native", "x86", "x32"]);
        }
        Ok(())
    }

    #[test]
    fn docker_default_survives_export_and_reimport_with_every_verdict()
    -> Result<(), Box<dyn std::error::Error>> {
        let first = import_text(DOCKER)?.profile;
        let (json, notes) = export(&first.seccomp)?;
        assert!(notes.is_empty(), "{notes:?}");
        let text = serde_json::to_string(&json)?;
        let second = import_text(&text)?.profile;
        same_verdicts(&first, &second)?;
        // And the TOML written for it reads back to the same policy.
        let reread = Profile::from_toml(&to_toml(&first, &[])?, "reread")?;
        assert_eq!(reread.seccomp, first.seccomp);
        Ok(())
    }

    #[test]
    fn includes_and_excludes_resolve_for_no_capabilities_on_this_machine()
    -> Result<(), Box<dyn std::error::Error>> {
        let arch = native_goarch();
        let json = format!(
            r#"{{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
              {{"names": ["getpid"], "action": "SCMP_ACT_ALLOW"}},
              {{"names": ["getppid"], "action": "SCMP_ACT_ALLOW", "includes": {{"caps": ["CAP_SYS_ADMIN"]}}}},
              {{"names": ["gettid"], "action": "SCMP_ACT_ALLOW", "excludes": {{"caps": ["CAP_SYS_ADMIN"]}}}},
              {{"names": ["getuid"], "action": "SCMP_ACT_ALLOW", "includes": {{"arches": ["{arch}"]}}}},
              {{"names": ["getgid"], "action": "SCMP_ACT_ALLOW", "includes": {{"arches": ["s390x"]}}}},
              {{"names": ["geteuid"], "action": "SCMP_ACT_ALLOW", "excludes": {{"arches": ["{arch}"]}}}},
              {{"names": ["getegid"], "action": "SCMP_ACT_ALLOW", "includes": {{"minKernel": "4.8"}}}},
              {{"names": ["uname"], "action": "SCMP_ACT_ALLOW", "includes": {{"minKernel": "99.0"}}}}
            ]}}"#
        );
        let p = import_text(&json)?.profile;
        let names: Vec<&str> = p
            .seccomp
            .rules
            .iter()
            .flat_map(|r| r.syscalls.iter().map(String::as_str))
            .collect();
        assert_eq!(names, vec!["getpid", "gettid", "getuid", "getegid"]);
        Ok(())
    }

    #[test]
    fn argument_conditions_round_trip_through_oci_json() -> Result<(), Box<dyn std::error::Error>> {
        // Every comparison, a masked one, and an any_bits one that export fans out.
        let p = Profile::from_toml(
            "name = \"args\"\n[seccomp]\ndefault_action = \"allow\"\n\
             [[seccomp.rule]]\naction = \"errno\"\nerrno = \"EPERM\"\nsyscalls = [\"clone\"]\nargs = [{ index = 0, op = \"any_bits\", mask = \"CLONE_NEWUSER|CLONE_NEWNET\" }]\n\
             [[seccomp.rule]]\naction = \"errno\"\nerrno = \"EACCES\"\nsyscalls = [\"ioctl\"]\nargs = [{ index = 1, op = \"masked_eq\", mask = 0xffffffff, value = \"TIOCSTI\" }]\n\
             [[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"personality\"]\nargs = [{ index = 0, op = \"gt\", value = 0x10 }, { index = 1, op = \"le\", value = 3 }]\n\
             [[seccomp.rule]]\naction = \"errno\"\nerrno = 22\nsyscalls = [\"socket\"]\nargs = [{ index = 0, op = \"ne\", value = 1 }, { index = 2, op = \"lt\", value = 5 }]\n\
             [[seccomp.rule]]\naction = \"trap\"\nsyscalls = [\"kill\"]\nargs = [{ index = 1, op = \"ge\", value = 9 }, { index = 0, op = \"eq\", value = 1 }]\n",
            "args.toml",
        )?;
        let (json, _) = export(&p.seccomp)?;
        let text = serde_json::to_string_pretty(&json)?;
        assert!(text.contains("SCMP_CMP_MASKED_EQ") && text.contains("valueTwo"));
        let back = import_text(&text)?.profile;
        same_verdicts(&p, &back)
    }

    #[test]
    fn several_conditions_on_one_argument_are_alternatives_as_in_runc()
    -> Result<(), Box<dyn std::error::Error>> {
        let json = r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
            {"names": ["personality"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
             "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}, {"index": 0, "value": 9, "op": "SCMP_CMP_EQ"}]}]}"#;
        let imported = import_text(json)?;
        assert_eq!(imported.profile.seccomp.rules.len(), 2);
        assert!(imported.notes.iter().any(|n| n.contains("alternatives")));
        Ok(())
    }

    #[test]
    fn unknown_names_never_widen_the_filter() -> Result<(), Box<dyn std::error::Error>> {
        // Allow rule in a deny-by-default profile: the unknown name stays denied.
        let ok = r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
            {"names": ["getpid", "no_such_syscall"], "action": "SCMP_ACT_ALLOW"}]}"#;
        let imported = import_text(ok)?;
        assert!(imported.notes.iter().any(|n| n.contains("no_such_syscall")));
        // Deny rule in an allow-by-default profile: leaving it out would let it through.
        let bad = r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
            {"names": ["no_such_syscall"], "action": "SCMP_ACT_ERRNO"}]}"#;
        match import_text(bad) {
            Err(OciError::Unsupported { message, .. }) => {
                assert!(message.contains("no_such_syscall"), "{message}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn malformed_json_is_refused_with_line_and_column() {
        for (json, want) in [
            ("{\n  \"defaultAction\": \"SCMP_ACT_EXPLODE\"\n}", "line 2"),
            (
                "{\"defaultAction\": \"SCMP_ACT_ALLOW\", \"surprise\": 1}",
                "surprise",
            ),
            (
                "{\"defaultAction\": \"SCMP_ACT_ALLOW\",\n\"syscalls\": [",
                "line 2",
            ),
        ] {
            match parse(json, "bad.json") {
                Err(OciError::Json { message, .. }) => assert!(message.contains(want), "{message}"),
                other => panic!("expected a JSON error for {json}, got {other:?}"),
            }
        }
        let huge = format!(
            "{{\"defaultAction\": \"SCMP_ACT_ALLOW\", \"x\": \"{}\"}}",
            "a".repeat(MAX_PROFILE_BYTES)
        );
        assert!(matches!(
            parse(&huge, "huge.json"),
            Err(OciError::Json { .. })
        ));
    }

    #[test]
    fn contradicting_entries_are_refused_naming_both() {
        let json = r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
            {"names": ["ptrace"], "action": "SCMP_ACT_ERRNO"},
            {"names": ["ptrace"], "action": "SCMP_ACT_KILL_PROCESS"}]}"#;
        match import_text(json) {
            Err(OciError::Unsupported { message, .. }) => {
                assert!(
                    message.contains("syscalls[1]") && message.contains("syscalls[0]"),
                    "{message}"
                )
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn kernel_versions_parse_from_uname_strings() -> Result<(), String> {
        assert_eq!(
            KernelVersion::parse("6.18.44-fc-v669")?,
            KernelVersion(6, 18, 44)
        );
        assert_eq!(KernelVersion::parse("4.8")?, KernelVersion(4, 8, 0));
        assert!(KernelVersion::parse("x").is_err());
        assert!(KernelVersion::running().is_ok());
        Ok(())
    }
}
