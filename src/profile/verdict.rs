//! Verdicts: what the kernel does with one syscall in a sandbox, and why.
//!
//! A sandbox has two filters: the seccomp floor ([`super::floor`]), loaded under every
//! profile, and the profile's own. The action always comes from running both compiled
//! filters (the bytes the sandbox loads) and combining their answers as the kernel does
//! ([`bpf::stacked`]). The reason — which rule of which filter, or a default — comes from
//! the rules, and each filter's answer is required to agree with its rules: a disagreement
//! is reported as an error, never papered over, because it would mean the rules no longer
//! say what is enforced.

use serde::Serialize;

use super::Profile;
use super::abi::Abi;
use super::bpf::{self, KernelAction, SeccompData};
use super::explore::{self, ArgSpace, ExploreError};
use super::floor::Floor;
use super::program::SeccompProgram;
use super::seccomp::{Decider, SeccompPolicy, format_args_list};

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
        "the compiled filter and the rules disagree for {what} with {args}: the filter gives {filter}, the rules give {rules} ({decider}); the rules do not say what is enforced"
    )]
    Disagreement {
        what: String,
        args: String,
        filter: KernelAction,
        rules: KernelAction,
        decider: Decider,
    },
}

/// Which of a sandbox's filters gave a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Filter {
    /// The profile's own filter (loaded last).
    Profile,
    /// The seccomp floor, loaded under every profile before its filter.
    Floor,
}

/// What decides a verdict: the filter, and the rule or default of its policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DecidedBy {
    pub filter: Filter,
    pub decider: Decider,
}

impl DecidedBy {
    pub fn profile(decider: Decider) -> DecidedBy {
        DecidedBy {
            filter: Filter::Profile,
            decider,
        }
    }

    pub fn by_floor(&self) -> bool {
        self.filter == Filter::Floor
    }
}

impl std::fmt::Display for DecidedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.filter {
            Filter::Profile => write!(f, "{}", self.decider),
            Filter::Floor => write!(f, "floor {}", self.decider),
        }
    }
}

/// A profile's filter (and the floor loaded with it), compiled once, ready to be asked
/// about syscalls.
pub struct Analysis<'a> {
    pub policy: &'a SeccompPolicy,
    pub program: SeccompProgram,
    /// The floor, when the analysis is of what a sandbox gets rather than of the profile's
    /// filter alone.
    pub floor: Option<Floor>,
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

/// One verdict the filters can give a syscall, with an argument vector that gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub action: KernelAction,
    pub decided_by: DecidedBy,
    pub example: [u64; 6],
}

/// The verdict for one syscall with given arguments, and every other verdict it can get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub target: Target,
    pub args: [u64; 6],
    pub action: KernelAction,
    pub decided_by: DecidedBy,
    /// What the profile's filter alone answers, when the floor decided instead.
    pub profile_alone: Option<(KernelAction, Decider)>,
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
    /// "rule N", "default_action" or "bad_arch_action" of the profile, or "floor rule N".
    pub decided_by: String,
    /// The filter that decided: "profile" or "floor".
    pub filter: Filter,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl<'a> Analysis<'a> {
    /// The profile's filter alone (to compare filters, or for filters that are not a
    /// sandbox's, such as the floor's own).
    pub fn new(policy: &'a SeccompPolicy) -> Result<Analysis<'a>, CheckError> {
        let program = policy.compile().map_err(CheckError::Policy)?;
        Ok(Analysis {
            policy,
            program,
            floor: None,
        })
    }

    /// The profile's filter with a floor loaded before it.
    pub fn with_floor(policy: &'a SeccompPolicy, floor: Floor) -> Result<Analysis<'a>, CheckError> {
        Ok(Analysis {
            floor: Some(floor),
            ..Analysis::new(policy)?
        })
    }

    /// What a sandbox with this profile gets: its filter and the floor it is loaded with.
    pub fn for_profile(profile: &'a Profile) -> Result<Analysis<'a>, CheckError> {
        let floor = profile
            .floor()
            .map_err(|e| CheckError::Policy(e.to_string()))?;
        Analysis::with_floor(&profile.seccomp, floor)
    }

    /// The compiled filters in the order the sandbox loads them.
    pub fn programs(&self) -> Vec<&SeccompProgram> {
        match &self.floor {
            Some(f) => vec![&f.program, &self.program],
            None => vec![&self.program],
        }
    }

    /// Runs one filter and its rules on one call and requires them to agree.
    fn agreed_one(
        policy: &SeccompPolicy,
        program: &SeccompProgram,
        filter: Filter,
        t: &Target,
        args: &[u64; 6],
    ) -> Result<(KernelAction, Decider), CheckError> {
        let which = match filter {
            Filter::Profile => "",
            Filter::Floor => " (the floor)",
        };
        let got =
            bpf::evaluate(program, &t.abi.data(t.nr, *args)).map_err(|e| CheckError::Analysis {
                what: format!("{}{which}", t.label()),
                source: e.into(),
            })?;
        let (action, decider) = policy
            .decide(t.abi, t.nr, args)
            .map_err(CheckError::Policy)?;
        if got != action.kernel() {
            return Err(CheckError::Disagreement {
                what: format!("{} on {}{which}", t.label(), t.abi),
                args: format_args_list(args),
                filter: got,
                rules: action.kernel(),
                decider,
            });
        }
        Ok((got, decider))
    }

    /// The verdict of the sandbox's filters for one call (each filter checked against its
    /// rules), what decides it, and the profile's own answer.
    fn agreed(
        &self,
        t: &Target,
        args: &[u64; 6],
    ) -> Result<(KernelAction, DecidedBy, (KernelAction, Decider)), CheckError> {
        let own = Analysis::agreed_one(self.policy, &self.program, Filter::Profile, t, args)?;
        let Some(floor) = &self.floor else {
            return Ok((own.0, DecidedBy::profile(own.1), own));
        };
        let under = Analysis::agreed_one(&floor.policy, &floor.program, Filter::Floor, t, args)?;
        Ok(match bpf::stacked(&[under.0, own.0]) {
            Some((0, action)) => (
                action,
                DecidedBy {
                    filter: Filter::Floor,
                    decider: under.1,
                },
                own,
            ),
            _ => (own.0, DecidedBy::profile(own.1), own),
        })
    }

    /// The verdict for `target` called with `args`, and what decides it.
    pub fn verdict_at(
        &self,
        target: &Target,
        args: [u64; 6],
    ) -> Result<(KernelAction, DecidedBy), CheckError> {
        let (action, by, _) = self.agreed(target, &args)?;
        Ok((action, by))
    }

    /// Every way through the sandbox's filters for one syscall within `within`, with the
    /// verdict the kernel gives there (the filters' answers combined).
    pub fn paths(
        &self,
        base: &SeccompData,
        within: &ArgSpace,
        what: &str,
    ) -> Result<Vec<(KernelAction, [u64; 6])>, CheckError> {
        let analysis = |source| CheckError::Analysis {
            what: what.to_string(),
            source,
        };
        explore::explore_joint(&self.programs(), base, within)
            .map_err(analysis)?
            .into_iter()
            .map(|p| match bpf::stacked(&p.actions) {
                Some((_, action)) => Ok((action, p.witness)),
                None => Err(analysis(ExploreError::Opaque { pc: 0 })),
            })
            .collect()
    }

    /// An argument vector in `within` for which the syscall runs, if there is one.
    pub fn runs_for_some(
        &self,
        base: &SeccompData,
        within: &ArgSpace,
        what: &str,
    ) -> Result<Option<[u64; 6]>, CheckError> {
        Ok(self
            .paths(base, within, what)?
            .into_iter()
            .find(|(a, _)| a.runs())
            .map(|(_, w)| w))
    }

    /// The verdict for `target` called with `args`.
    pub fn check(&self, target: &Target, args: [u64; 6]) -> Result<Verdict, CheckError> {
        let (action, decided_by, own) = self.agreed(target, &args)?;
        let paths = self.paths(
            &target.abi.data(target.nr, [0; 6]),
            &ArgSpace::any(),
            &target.label(),
        )?;
        let mut outcomes: Vec<Outcome> = Vec::new();
        for (path_action, example) in paths {
            if outcomes.iter().any(|o| o.action == path_action) {
                continue;
            }
            let (agreed, decider, _) = self.agreed(target, &example)?;
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
            profile_alone: decided_by.by_floor().then_some(own),
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
    pub fn reason(&self, d: DecidedBy) -> String {
        match (d.filter, &self.floor) {
            (Filter::Floor, Some(floor)) => match d.decider {
                Decider::Rule(i) => floor
                    .policy
                    .rules
                    .get(i)
                    .map(|r| r.reason.clone())
                    .unwrap_or_default(),
                Decider::DefaultAction => "no rule of the floor names this call".into(),
                Decider::BadArch => "the floor does not filter this ABI".into(),
            },
            _ => match d.decider {
                Decider::Rule(i) => self
                    .policy
                    .rules
                    .get(i)
                    .map(|r| r.reason.clone())
                    .unwrap_or_default(),
                Decider::DefaultAction => "no rule names this call".into(),
                Decider::BadArch => "the filter does not accept this ABI".into(),
            },
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
            filter: v.decided_by.filter,
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
        if let Some((action, decider)) = v.profile_alone {
            out.push_str(&format!(
                "  the floor is loaded under every profile, before it; the profile alone gives {action} ({decider})\n"
            ));
        }
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
}
