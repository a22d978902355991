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
mod tests;
