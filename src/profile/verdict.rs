//! Verdicts: what the kernel does with one syscall under a profile, and why.
//!
//! The action always comes from running the compiled filter (the bytes the sandbox
//! loads). The reason — which rule, or the default — comes from the profile's rules, and
//! the two are required to agree: a disagreement is reported as an error, never papered
//! over, because it would mean the profile no longer says what is enforced.

use serde::Serialize;

use super::abi::Abi;
use super::bpf::{self, KernelAction};
use super::explore::{self, ArgSpace, ExploreError};
use super::seccomp::{Decider, SeccompPolicy, SeccompProgram, format_args_list};

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("{0}")]
    Policy(String),
    #[error("unknown syscall {name:?} on {abi}{hint}")]
    UnknownSyscall {
        name: String,
        abi: Abi,
        hint: String,
    },
    #[error("the compiled filter cannot be analysed for {what}: {source}")]
    Analysis { what: String, source: ExploreError },
    #[error(
        "the compiled filter and the profile's rules disagree for {what} with {args}: the filter gives {filter}, the rules give {rules} ({decider}); the profile does not say what is enforced"
    )]
    Disagreement {
        what: String,
        args: String,
        filter: KernelAction,
        rules: KernelAction,
        decider: Decider,
    },
}

/// A profile's filter, compiled once, ready to be asked about syscalls.
pub struct Analysis<'a> {
    pub policy: &'a SeccompPolicy,
    pub program: SeccompProgram,
}

/// A syscall on an ABI: its number and, where libseccomp knows it, its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub abi: Abi,
    pub nr: i32,
    pub name: Option<String>,
}

impl Target {
    /// Resolves a name (or a number) on an ABI.
    pub fn parse(abi: Abi, name_or_nr: &str) -> Result<Target, CheckError> {
        if let Ok(n) = name_or_nr.parse::<u32>() {
            let nr = if abi == Abi::X32 && n < bpf::X32_SYSCALL_BIT {
                n | bpf::X32_SYSCALL_BIT
            } else {
                n
            } as i32;
            return Ok(Target {
                abi,
                nr,
                name: abi.syscall_name(nr),
            });
        }
        match abi.syscall_nr(name_or_nr) {
            Some(nr) => Ok(Target {
                abi,
                nr,
                name: Some(name_or_nr.to_string()),
            }),
            None => {
                let elsewhere: Vec<&str> = Abi::runnable()
                    .into_iter()
                    .filter(|a| *a != abi && a.syscall_nr(name_or_nr).is_some())
                    .map(Abi::name)
                    .collect();
                let hint = if elsewhere.is_empty() {
                    String::new()
                } else {
                    format!(" (it exists on {}: use --arch)", elsewhere.join(", "))
                };
                Err(CheckError::UnknownSyscall {
                    name: name_or_nr.to_string(),
                    abi,
                    hint,
                })
            }
        }
    }

    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => n.clone(),
            None => format!("#{}", self.nr),
        }
    }
}

/// One verdict the filter can give a syscall, with an argument vector that gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub action: KernelAction,
    pub decided_by: Decider,
    pub example: [u64; 6],
}

/// The verdict for one syscall with given arguments, and every other verdict it can get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub target: Target,
    pub args: [u64; 6],
    pub action: KernelAction,
    pub decided_by: Decider,
    /// The verdict depends on the arguments.
    pub conditional: bool,
    /// Every distinct verdict over all arguments (the one above included).
    pub outcomes: Vec<Outcome>,
}

/// The machine-readable form of a verdict (`profile check --json`).
#[derive(Debug, Clone, Serialize)]
pub struct VerdictJson {
    pub action: &'static str,
    pub errno: Option<i32>,
    pub conditional: bool,
    pub nr: i32,
    pub arch: &'static str,
    /// "rule N", "default_action" or "bad_arch_action".
    pub decided_by: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl<'a> Analysis<'a> {
    pub fn new(policy: &'a SeccompPolicy) -> Result<Analysis<'a>, CheckError> {
        let program = policy.compile().map_err(CheckError::Policy)?;
        Ok(Analysis { policy, program })
    }

    /// The model's verdict, as a kernel action.
    fn model(&self, t: &Target, args: &[u64; 6]) -> Result<(KernelAction, Decider), CheckError> {
        let (action, decider) = self
            .policy
            .decide(t.abi, t.nr, args)
            .map_err(CheckError::Policy)?;
        Ok((action.kernel(), decider))
    }

    /// Runs the filter and the model on one call and requires them to agree.
    fn agreed(&self, t: &Target, args: &[u64; 6]) -> Result<(KernelAction, Decider), CheckError> {
        let filter = bpf::evaluate(&self.program, &t.abi.data(t.nr, *args)).map_err(|e| {
            CheckError::Analysis {
                what: t.label(),
                source: e.into(),
            }
        })?;
        let (rules, decider) = self.model(t, args)?;
        if filter != rules {
            return Err(CheckError::Disagreement {
                what: format!("{} on {}", t.label(), t.abi),
                args: format_args_list(args),
                filter,
                rules,
                decider,
            });
        }
        Ok((filter, decider))
    }

    /// The verdict for `target` called with `args`.
    pub fn check(&self, target: &Target, args: [u64; 6]) -> Result<Verdict, CheckError> {
        let (action, decided_by) = self.agreed(target, &args)?;
        let paths = explore::explore(
            &self.program,
            &target.abi.data(target.nr, [0; 6]),
            &ArgSpace::any(),
        )
        .map_err(|source| CheckError::Analysis {
            what: target.label(),
            source,
        })?;
        let mut outcomes = Vec::new();
        for (path_action, example) in explore::distinct_actions(&paths) {
            let (agreed, decider) = self.agreed(target, &example)?;
            debug_assert_eq!(agreed, path_action);
            outcomes.push(Outcome {
                action: agreed,
                decided_by: decider,
                example,
            });
        }
        Ok(Verdict {
            target: target.clone(),
            args,
            action,
            decided_by,
            conditional: outcomes.len() > 1,
            outcomes,
        })
    }

    /// The verdict for every syscall of an ABI, called with all-zero arguments.
    pub fn check_all(&self, abi: Abi) -> Result<Vec<Verdict>, CheckError> {
        abi.syscalls()
            .into_iter()
            .map(|(nr, name)| {
                self.check(
                    &Target {
                        abi,
                        nr,
                        name: Some(name),
                    },
                    [0; 6],
                )
            })
            .collect()
    }

    /// The reason text of what decided a verdict.
    pub fn reason(&self, d: Decider) -> String {
        match d {
            Decider::Rule(i) => self
                .policy
                .rules
                .get(i)
                .map(|r| r.reason.clone())
                .unwrap_or_default(),
            Decider::DefaultAction => "no rule names this call".into(),
            Decider::BadArch => "the filter does not accept this ABI".into(),
        }
    }

    pub fn json(&self, v: &Verdict) -> VerdictJson {
        VerdictJson {
            action: v.action.kind(),
            errno: v.action.errno(),
            conditional: v.conditional,
            nr: v.target.nr,
            arch: v.target.abi.name(),
            decided_by: v.decided_by.to_string(),
            reason: self.reason(v.decided_by),
        }
    }

    /// A human description of a verdict, several lines when it is conditional.
    pub fn describe(&self, v: &Verdict) -> String {
        let mut out = format!(
            "{} ({} nr {}): {}\n  decided by {}",
            v.target.label(),
            v.target.abi,
            v.target.nr,
            v.action,
            v.decided_by
        );
        let reason = self.reason(v.decided_by);
        if !reason.is_empty() {
            out.push_str(&format!(": {reason}"));
        }
        out.push('\n');
        if v.conditional {
            out.push_str(&format!(
                "  conditional: the verdict depends on the arguments (this one is for {})\n",
                format_args_list(&v.args)
            ));
            for o in &v.outcomes {
                out.push_str(&format!(
                    "    {:<24} e.g. {:<28} {}\n",
                    o.action.to_string(),
                    format_args_list(&o.example),
                    o.decided_by
                ));
            }
        }
        out
    }

    /// One line of `check --all`.
    pub fn line(&self, v: &Verdict) -> String {
        let mut verdict = v.action.to_string();
        if v.conditional {
            let others: Vec<String> = v
                .outcomes
                .iter()
                .filter(|o| o.action != v.action)
                .map(|o| format!("{} for {}", o.action, format_args_list(&o.example)))
                .collect();
            verdict = format!("{verdict} (conditional: {})", others.join("; "));
        }
        format!(
            "{:<24} {:>10}  {:<40} {}",
            v.target.label(),
            v.target.nr,
            verdict,
            v.decided_by
        )
    }
}

#[cfg(test)]
mod tests {
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
        assert!(matches!(ptrace.decided_by, Decider::Rule(_)));
        let getpid = a.check(&Target::parse(native(), "getpid")?, [0; 6])?;
        assert_eq!(getpid.action, KernelAction::Allow);
        assert_eq!(getpid.decided_by, Decider::DefaultAction);
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
    fn foreign_abis_are_killed_by_the_native_only_default() -> Result<(), Box<dyn std::error::Error>>
    {
        if native() != Abi::X86_64 {
            return Ok(());
        }
        let p = Profile::resolve("default")?;
        let a = Analysis::new(&p.seccomp)?;
        for abi in [Abi::X86, Abi::X32] {
            let v = a.check(&Target::parse(abi, "getpid")?, [0; 6])?;
            assert_eq!(v.action, KernelAction::KillProcess, "{abi}");
            assert_eq!(v.decided_by, Decider::BadArch);
        }
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
            let a = Analysis::new(&p.seccomp)?;
            for abi in Abi::runnable() {
                let all = a.check_all(abi)?;
                assert!(!all.is_empty(), "{name} {abi}");
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
        ];
        proptest::array::uniform6(word)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// For random arguments, the compiled filter and the rules agree on every shipped
        /// profile, for syscalls with argument rules and without.
        #[test]
        fn filter_and_rules_agree_for_random_arguments(args in any_args(), pick in 0usize..12) {
            let names = ["clone", "ioctl", "personality", "socket", "getpid", "ptrace",
                         "unshare", "mount", "write", "openat", "execve", "prctl"];
            let docker = crate::profile::oci::parse(
                include_str!("../../tests/fixtures/docker-default-seccomp.json"), "docker")
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
                let a = match Analysis::new(&p.seccomp) { Ok(a) => a, Err(e) => panic!("{e}") };
                for abi in Abi::runnable() {
                    let Ok(t) = Target::parse(abi, names[pick]) else { continue };
                    if let Err(e) = a.check(&t, args) {
                        prop_assert!(false, "{profile} {abi}: {e}");
                    }
                }
            }
        }
    }
}
