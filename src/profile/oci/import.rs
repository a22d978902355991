//! Import: an OCI profile resolved for a worker without capabilities on this machine, as
//! Docker resolves it when it starts a container. Each `syscalls` entry is kept, dropped
//! with a note, or refused: dropped only when that cannot let through a syscall the JSON
//! denies.

use super::super::abi::{Abi, parse_arch};
use super::super::seccomp::{
    self, Action, ActionKind, ArgCondition, CompareOp, ErrnoValue, SeccompPolicy, SyscallRule,
    ValueSpec,
};
use super::super::{Profile, sha256_hex};
use super::{
    ImportOptions, Imported, KernelVersion, OciAction, OciArg, OciError, OciOp, OciProfile,
    OciSyscall, native_goarch, to_toml,
};

/// Resolves an OCI profile for a worker without capabilities on this machine.
///
/// Its steps: the architectures this machine can run; the default action; each entry's
/// rules; the policy checked as a whole (a contradiction names both entries); then the
/// profile, hatchery's defaults around the imported filter.
pub fn import(oci: &OciProfile, opts: &ImportOptions) -> Result<Imported, OciError> {
    let mut import = Import {
        opts,
        notes: Vec::new(),
    };
    let architectures = import.architectures(oci)?;
    let abis: Vec<Abi> = architectures
        .iter()
        .filter_map(|a| Abi::parse(a).ok())
        .collect();
    import.note_ignored(oci);
    let default = import.default_action(oci)?;
    let mut rules: Vec<SyscallRule> = Vec::new();
    let mut rule_origin: Vec<usize> = Vec::new();
    for (i, sc) in oci.syscalls.iter().enumerate() {
        for rule in import.entry_rules(i, sc, &default, &abis)? {
            rules.push(rule);
            rule_origin.push(i);
        }
    }
    let seccomp = SeccompPolicy {
        default_action: default.kind,
        default_errno: default.errno,
        architectures,
        bad_arch_action: ActionKind::Kill,
        rules,
    };
    if let Err(e) = seccomp.validate() {
        let entry = |r: Option<usize>| {
            r.and_then(|r| rule_origin.get(r))
                .map(|i| format!("syscalls[{i}]"))
        };
        let message = match (entry(e.rule), entry(e.other)) {
            (Some(a), Some(b)) => format!("{a} and {b}: {}", e.message),
            (Some(a), None) => format!("{a}: {}", e.message),
            _ => e.message.clone(),
        };
        return Err(import.unsupported(message));
    }
    import.into_profile(seccomp)
}

/// One import under way: what it is for, and the notes on what it left out or changed.
struct Import<'a> {
    opts: &'a ImportOptions,
    notes: Vec<String>,
}

/// The profile's default action, in the forms the entries are compared with.
struct DefaultAction {
    kind: ActionKind,
    /// The errno an entry's `SCMP_ACT_ERRNO` without `errnoRet` returns.
    errno_num: i32,
    /// The default's own errno (when it is errno).
    errno: Option<ErrnoValue>,
    action: Action,
}

impl Import<'_> {
    fn unsupported(&self, message: String) -> OciError {
        OciError::Unsupported {
            origin: self.opts.source.clone(),
            message,
        }
    }

    /// The architectures as hatchery names them: `native`, then the listed ones whose
    /// syscalls can reach this machine's kernel (the OCI list, or Docker's map entry for
    /// this machine); the others are skipped with a note.
    fn architectures(&mut self, oci: &OciProfile) -> Result<Vec<String>, OciError> {
        let runnable = Abi::runnable();
        let listed: Vec<String> = match (&oci.architectures, &oci.arch_map) {
            (Some(_), Some(_)) => {
                return Err(
                    self.unsupported("both architectures and archMap are given; use one".into())
                );
            }
            (Some(list), None) => list.clone(),
            (None, Some(map)) => {
                let native = Abi::native();
                match map.iter().find(|m| {
                    parse_arch(&m.architecture).ok().and_then(Abi::from_scmp) == Some(native)
                }) {
                    Some(m) => std::iter::once(m.architecture.clone())
                        .chain(m.sub_architectures.clone().unwrap_or_default())
                        .collect(),
                    None => {
                        self.notes.push(format!(
                            "archMap has no entry for {native}; only the native ABI is accepted"
                        ));
                        Vec::new()
                    }
                }
            }
            (None, None) => Vec::new(),
        };
        let mut architectures = vec!["native".to_string()];
        for name in &listed {
            match parse_arch(name).ok().and_then(Abi::from_scmp) {
                Some(abi) if runnable.contains(&abi) => {
                    if abi != Abi::native() && !architectures.iter().any(|a| a == abi.name()) {
                        architectures.push(abi.name().to_string());
                    }
                }
                _ => self.notes.push(format!(
                    "architecture {name} skipped: its syscalls cannot reach this machine's kernel"
                )),
            }
        }
        Ok(architectures)
    }

    /// Notes what the JSON sets that a sandbox has no use for: filter flags, a listener.
    fn note_ignored(&mut self, oci: &OciProfile) {
        if !oci.flags.is_empty() {
            self.notes.push(format!(
                "flags {:?} ignored: hatchery loads its filter without flags",
                oci.flags
            ));
        }
        if oci.listener_path.is_some() {
            self.notes
                .push("listenerPath ignored: a sandbox has no notification listener".into());
        }
    }

    /// The default action and its errno: `defaultErrnoRet`, else ENOSYS for an action
    /// enforced as errno for want of a tracer or listener, else EPERM.
    fn default_action(&mut self, oci: &OciProfile) -> Result<DefaultAction, OciError> {
        let kind = action_of(oci.default_action, &mut self.notes, "defaultAction");
        let errno_num = match oci.default_errno_ret {
            Some(e) if (1..=4094).contains(&e) => e as i32,
            Some(e) => {
                return Err(self.unsupported(format!(
                    "defaultErrnoRet {e} is out of range (1..4094: libseccomp refuses 4095)"
                )));
            }
            None if matches!(
                oci.default_action,
                OciAction::SCMP_ACT_TRACE | OciAction::SCMP_ACT_NOTIFY
            ) =>
            {
                libc::ENOSYS
            }
            None => libc::EPERM,
        };
        let errno = (kind == ActionKind::Errno).then_some(ErrnoValue::Number(errno_num));
        let action = seccomp::action_of(kind, errno.as_ref())
            .map_err(|e| self.unsupported(format!("defaultAction: {e}")))?;
        Ok(DefaultAction {
            kind,
            errno_num,
            errno,
            action,
        })
    }

    /// The rules of `syscalls[i]`: none when it does not apply to this worker on this
    /// machine, when it changes nothing, or when it can never match.
    fn entry_rules(
        &mut self,
        i: usize,
        sc: &OciSyscall,
        default: &DefaultAction,
        abis: &[Abi],
    ) -> Result<Vec<SyscallRule>, OciError> {
        let mut names = sc.names.clone();
        if let Some(n) = &sc.name {
            names.push(n.clone());
        }
        let place = format!(
            "syscalls[{i}] ({})",
            names.first().map(String::as_str).unwrap_or("no names")
        );
        if names.is_empty() {
            return Err(self.unsupported(format!("{place}: no syscall names")));
        }
        // No syscall's name holds one; a newline in one broke out of the import note that
        // names it, in the TOML written, and set keys of its own there.
        if let Some(bad) = names
            .iter()
            .find(|n| crate::text::first_control(n).is_some())
        {
            return Err(self.unsupported(format!(
                "{place}: {:?} is no syscall's name (it holds a control or format character)",
                crate::text::clip(bad, 100)
            )));
        }
        if !self.applies(sc, &place)? {
            return Ok(Vec::new());
        }
        let kind = action_of(sc.action, &mut self.notes, &place);
        let errno = errno_of(sc.action, sc.errno_ret, default.errno_num)
            .map_err(|e| self.unsupported(format!("{place}: {e}")))?;
        let action = seccomp::action_of(kind, errno.as_ref())
            .map_err(|e| self.unsupported(format!("{place}: {e}")))?;
        if action == default.action {
            // libseccomp refuses such rules and runtimes skip them: they change nothing.
            return Ok(Vec::new());
        }
        let kept = self.known_names(&names, &place, kind, default, abis)?;
        if kept.is_empty() {
            return Ok(Vec::new());
        }
        let Some(groups) = self.condition_groups(&sc.args, &place)? else {
            return Ok(Vec::new());
        };
        Ok(groups
            .into_iter()
            .map(|args| SyscallRule {
                action: kind,
                errno: errno.clone(),
                syscalls: kept.clone(),
                args,
                reason: sc.comment.clone().unwrap_or_default(),
            })
            .collect())
    }

    /// Whether the entry's `includes` and `excludes` hold for a worker without
    /// capabilities, on this machine's architecture and the import's kernel.
    fn applies(&mut self, sc: &OciSyscall, place: &str) -> Result<bool, OciError> {
        let goarch = native_goarch();
        let inc = sc.includes.clone().unwrap_or_default();
        let exc = sc.excludes.clone().unwrap_or_default();
        if !inc.caps.is_empty() {
            self.notes.push(format!(
                "{place}: skipped, it applies only with {} (a worker has no capabilities)",
                inc.caps.join(", ")
            ));
            return Ok(false);
        }
        if !inc.arches.is_empty() && !inc.arches.iter().any(|a| a == goarch) {
            return Ok(false);
        }
        if exc.arches.iter().any(|a| a == goarch) {
            return Ok(false);
        }
        if let Some(min) = &inc.min_kernel {
            let min =
                KernelVersion::parse(min).map_err(|e| self.unsupported(format!("{place}: {e}")))?;
            if self.opts.kernel < min {
                self.notes.push(format!(
                    "{place}: skipped, it needs kernel {min} and the import is for {}",
                    self.opts.kernel
                ));
                return Ok(false);
            }
        }
        if exc.min_kernel.is_some() {
            return Err(self.unsupported(format!(
                "{place}: excludes.minKernel is not a Docker condition"
            )));
        }
        Ok(true)
    }

    /// The entry's names that a rule can carry: those this libseccomp knows and some
    /// accepted ABI has. Unknown names are left to the default action, and refused where
    /// that would let through what the entry denies.
    fn known_names(
        &mut self,
        names: &[String],
        place: &str,
        kind: ActionKind,
        default: &DefaultAction,
        abis: &[Abi],
    ) -> Result<Vec<String>, OciError> {
        let mut kept = Vec::new();
        let mut unknown = Vec::new();
        let mut absent = Vec::new();
        for n in names {
            if seccomp::resolve_syscall(n).is_err() {
                unknown.push(n.clone());
            } else if abis.iter().all(|a| a.syscall_nr(n).is_none()) {
                absent.push(n.clone());
            } else if !kept.contains(n) {
                kept.push(n.clone());
            }
        }
        if !unknown.is_empty() {
            if permits(default.kind) && !permits(kind) {
                return Err(self.unsupported(format!(
                    "{place}: this system's libseccomp does not know {}; the rule denies them and the default allows, so leaving them out would let them through",
                    unknown.join(", ")
                )));
            }
            self.notes.push(format!(
                "{place}: unknown to this system's libseccomp, left to the default action ({}): {}",
                default.action,
                unknown.join(", ")
            ));
        }
        if !absent.is_empty() {
            self.notes.push(format!(
                "{place}: not syscalls of the accepted ABIs ({}), left out: {}",
                abis.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "),
                absent.join(", ")
            ));
        }
        Ok(kept)
    }

    /// The entry's argument conditions, one group per rule; none when a condition can
    /// never match (the entry is then left out).
    fn condition_groups(
        &mut self,
        args: &[OciArg],
        place: &str,
    ) -> Result<Option<Vec<Vec<ArgCondition>>>, OciError> {
        let mut conditions = Vec::new();
        for arg in args {
            match condition_of(arg, place).map_err(|m| self.unsupported(m))? {
                Some(c) => conditions.push(c),
                None => {
                    self.notes.push(format!(
                        "{place}: a masked comparison with bits outside its mask can never match; the rule is left out"
                    ));
                    return Ok(None);
                }
            }
        }
        let mut per_index = [0usize; 6];
        for c in &conditions {
            per_index[usize::from(c.index)] += 1;
        }
        // runc adds each condition as a rule of its own when one argument has several:
        // they are alternatives, not all required.
        Ok(Some(if per_index.iter().any(|n| *n > 1) {
            self.notes.push(format!(
                "{place}: several conditions on one argument are alternatives (as runc applies them): one rule each"
            ));
            conditions.into_iter().map(|c| vec![c]).collect()
        } else {
            vec![conditions]
        }))
    }

    /// The imported profile: hatchery's default profile with the imported filter, its
    /// digest that of the TOML written for it (notes included).
    fn into_profile(self, seccomp: SeccompPolicy) -> Result<Imported, OciError> {
        let opts = self.opts;
        let base = Profile::resolve("default")?;
        let mut profile = Profile {
            name: opts.name.clone(),
            description: format!(
                "Imported from {} for a worker without capabilities on {} (kernel {})",
                opts.source,
                Abi::native(),
                opts.kernel
            ),
            seccomp,
            ..base
        };
        profile.origin = format!("import:{}", opts.source);
        let text = to_toml(&profile, &self.notes)?;
        profile.sha256 = sha256_hex(text.as_bytes());
        profile.check()?;
        Ok(Imported {
            profile,
            notes: self.notes,
        })
    }
}

/// A value as profiles write it: small numbers as numbers, large ones as hex strings
/// (TOML integers stop at 2^63).
fn value_spec(v: u64) -> ValueSpec {
    if v < 0x1_0000 {
        ValueSpec::Number(v)
    } else {
        ValueSpec::Expr(format!("{v:#x}"))
    }
}

fn errno_of(
    action: OciAction,
    errno_ret: Option<u32>,
    default_errno: i32,
) -> Result<Option<ErrnoValue>, String> {
    match (action, errno_ret) {
        (OciAction::SCMP_ACT_ERRNO, Some(e)) if (1..=4094).contains(&e) => {
            Ok(Some(ErrnoValue::Number(e as i32)))
        }
        (OciAction::SCMP_ACT_ERRNO, Some(e)) => Err(format!(
            "errnoRet {e} is out of range (1..4094: libseccomp refuses 4095)"
        )),
        (OciAction::SCMP_ACT_ERRNO, None) => Ok(Some(ErrnoValue::Number(default_errno))),
        _ => Ok(None),
    }
}

/// Maps an OCI action; kill-thread becomes kill-process (stricter) and actions that need a
/// tracer or a notification listener, which a hatchery sandbox never has, become what the
/// kernel answers without one: ENOSYS.
fn action_of(a: OciAction, notes: &mut Vec<String>, place: &str) -> ActionKind {
    match a {
        OciAction::SCMP_ACT_ALLOW => ActionKind::Allow,
        OciAction::SCMP_ACT_ERRNO => ActionKind::Errno,
        OciAction::SCMP_ACT_KILL_PROCESS => ActionKind::Kill,
        OciAction::SCMP_ACT_KILL | OciAction::SCMP_ACT_KILL_THREAD => {
            notes.push(format!(
                "{place}: kill-thread is enforced as kill-process (stricter: no half-dead process)"
            ));
            ActionKind::Kill
        }
        OciAction::SCMP_ACT_TRAP => ActionKind::Trap,
        OciAction::SCMP_ACT_LOG => ActionKind::Log,
        OciAction::SCMP_ACT_TRACE | OciAction::SCMP_ACT_NOTIFY => {
            notes.push(format!(
                "{place}: {a:?} needs a tracer or listener, which a sandbox never has; enforced as errno ENOSYS, what the kernel answers without one"
            ));
            ActionKind::Errno
        }
    }
}

fn condition_of(arg: &OciArg, place: &str) -> Result<Option<ArgCondition>, String> {
    if arg.index > 5 {
        return Err(format!(
            "{place}: argument index {} out of range (0..5)",
            arg.index
        ));
    }
    let index = arg.index as u8;
    let simple = |op| ArgCondition {
        index,
        op,
        value: Some(value_spec(arg.value)),
        mask: None,
    };
    Ok(Some(match arg.op {
        OciOp::SCMP_CMP_EQ => simple(CompareOp::Eq),
        OciOp::SCMP_CMP_NE => simple(CompareOp::Ne),
        OciOp::SCMP_CMP_LT => simple(CompareOp::Lt),
        OciOp::SCMP_CMP_LE => simple(CompareOp::Le),
        OciOp::SCMP_CMP_GT => simple(CompareOp::Gt),
        OciOp::SCMP_CMP_GE => simple(CompareOp::Ge),
        OciOp::SCMP_CMP_MASKED_EQ => {
            // OCI: value is the mask, valueTwo the datum.
            if arg.value_two & !arg.value != 0 {
                return Ok(None);
            }
            ArgCondition {
                index,
                op: CompareOp::MaskedEq,
                value: Some(value_spec(arg.value_two)),
                mask: Some(value_spec(arg.value)),
            }
        }
    }))
}

/// Whether an action lets the syscall run.
fn permits(kind: ActionKind) -> bool {
    matches!(kind, ActionKind::Allow | ActionKind::Log)
}
