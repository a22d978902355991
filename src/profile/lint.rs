//! Known-dangerous things a profile can let through, found by asking the compiled filter.
//!
//! Each check names syscalls (and, where the danger is in an argument, the arguments that
//! make it dangerous) and asks whether the filters a sandbox gets — the profile's and the
//! seccomp floor loaded under it — let any such call run, on every ABI the profile
//! accepts. A finding carries the reason it matters and an example call. Two checks read
//! the profile's other sections: a shared host network, and Landlock rules that let
//! nothing run.
//!
//! Every finding has a severity (its rule's, fixed: see [`RULES`]) and may be accepted —
//! by the profile (`[lint] accept = ["ptrace"]`) or by the caller (`lint --accept ptrace`):
//! an accepted finding is still reported, and no longer fails the lint.

use serde::Serialize;

use super::Profile;
use super::abi::Abi;
use super::explore::{ArgSpace, arg_word};
use super::seccomp::{Decider, format_args_list};
use super::solver::{Constraint, Rel};
use super::verdict::{Analysis, CheckError, DecidedBy, Target};

/// Every namespace flag (CLONE_NEWTIME included: unshare takes it).
const NAMESPACE_FLAGS: u64 = 0x7e02_0080;
/// Personality flags that switch off exploit mitigations.
const WEAKENING_PERSONAS: u64 = 0x0004_0000 | 0x0010_0000 | 0x0020_0000 | 0x0040_0000;

/// How much a finding matters. Ordered: `info < warning < error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; no isolation boundary is crossed.
    Info,
    /// A risk some profiles take on purpose (Docker's default allows it), or a profile
    /// that cannot do its job.
    Warning,
    /// An isolation boundary the sandbox can cross: kernel attack surface reached from an
    /// unprivileged process, a filter that can be bypassed, the host's network.
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every lint rule by its stable id, with its severity.
pub const RULES: &[(&str, Severity)] = &[
    ("ptrace", Severity::Warning),
    ("bpf", Severity::Error),
    ("mount", Severity::Error),
    ("unshare", Severity::Error),
    ("clone-namespaces", Severity::Error),
    ("keyctl", Severity::Error),
    ("userfaultfd", Severity::Warning),
    ("io_uring", Severity::Error),
    ("perf_event_open", Severity::Warning),
    ("personality", Severity::Warning),
    ("ioctl-tiocsti", Severity::Error),
    ("ioctl-tioclinux", Severity::Error),
    ("foreign-abi", Severity::Error),
    ("host-network", Severity::Error),
    ("landlock-empty", Severity::Warning),
];

/// The severity of the rule `id`, or None for an id no rule has.
pub fn rule(id: &str) -> Option<Severity> {
    RULES.iter().find(|(r, _)| *r == id).map(|(_, s)| *s)
}

/// Every rule id, in the order of [`RULES`].
/// Refuses an id no rule has, naming the ones there are (for `[lint] accept` and
/// `--accept` alike).
pub fn check_accepted_ids(ids: &[String]) -> Result<(), String> {
    match ids.iter().find(|id| rule(id).is_none()) {
        Some(bad) => Err(format!(
            "unknown lint rule {bad:?} (known: {})",
            rule_ids().join(", ")
        )),
        None => Ok(()),
    }
}

pub fn rule_ids() -> Vec<&'static str> {
    RULES.iter().map(|(id, _)| *id).collect()
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// Stable identifier of the check (`ptrace`, `ioctl-tiocsti`, `foreign-abi`, ...).
    pub id: &'static str,
    pub severity: Severity,
    /// Accepted by the profile's `[lint] accept` or by the caller: reported, not failing.
    pub accepted: bool,
    pub message: String,
    pub reason: &'static str,
    /// An example of a call the filter lets run, with what lets it.
    pub example: String,
}

struct Check {
    id: &'static str,
    what: &'static str,
    syscalls: &'static [&'static str],
    reason: &'static str,
    /// The dangerous arguments (None: any call is dangerous).
    args: fn() -> Option<ArgSpace>,
}

fn any() -> Option<ArgSpace> {
    Some(ArgSpace::any())
}

fn arg0_namespace_flags() -> Option<ArgSpace> {
    let mut s = ArgSpace::any();
    s.restrict(
        arg_word(0, false),
        Constraint::new(NAMESPACE_FLAGS, Rel::AnySet, 0),
    )
    .then_some(s)
}

fn clone_namespace_flags() -> Option<ArgSpace> {
    // clone(2) reads its flags as 32 bits; the low byte is the exit signal.
    let mut s = ArgSpace::any();
    s.restrict(
        arg_word(0, false),
        Constraint::new(NAMESPACE_FLAGS & !0xff, Rel::AnySet, 0),
    )
    .then_some(s)
}

fn weakening_personality() -> Option<ArgSpace> {
    // personality(2) reads 32 bits; 0xffffffff only queries.
    let mut s = ArgSpace::any();
    let w = arg_word(0, false);
    (s.restrict(w, Constraint::new(WEAKENING_PERSONAS, Rel::AnySet, 0))
        && s.restrict(w, Constraint::new(0xffff_ffff, Rel::Ne, 0xffff_ffff)))
    .then_some(s)
}

fn ioctl_request(request: u64) -> Option<ArgSpace> {
    // ioctl(2) reads the request as 32 bits: the upper half of the word is free.
    let mut s = ArgSpace::any();
    s.restrict(
        arg_word(1, false),
        Constraint::new(0xffff_ffff, Rel::Eq, request),
    )
    .then_some(s)
}

fn tiocsti() -> Option<ArgSpace> {
    ioctl_request(libc::TIOCSTI)
}

fn tioclinux() -> Option<ArgSpace> {
    ioctl_request(libc::TIOCLINUX)
}

const CHECKS: &[Check] = &[
    Check {
        id: "ptrace",
        what: "ptrace is allowed",
        syscalls: &["ptrace"],
        reason: "ptrace reads and writes other processes' memory and registers; it is the classic way to take over a neighbour or slip past a filter on older kernels",
        args: any,
    },
    Check {
        id: "bpf",
        what: "bpf is allowed",
        syscalls: &["bpf"],
        reason: "eBPF is a large kernel attack surface (verifier bugs are a steady source of privilege escalations) and can read kernel state",
        args: any,
    },
    Check {
        id: "mount",
        what: "mounting is allowed",
        syscalls: &[
            "mount",
            "umount2",
            "pivot_root",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
        ],
        reason: "mounts rebuild the filesystem view the sandbox was given; in a user namespace they reach filesystem code never meant for untrusted callers",
        args: any,
    },
    Check {
        id: "unshare",
        what: "new namespaces can be created with unshare (or joined with setns)",
        syscalls: &["unshare"],
        reason: "a new user namespace hands the caller every capability inside it, opening kernel code paths (netfilter, mounts) that are a frequent privilege-escalation route",
        args: arg0_namespace_flags,
    },
    Check {
        id: "unshare",
        what: "new namespaces can be created with unshare (or joined with setns)",
        syscalls: &["setns"],
        reason: "a new user namespace hands the caller every capability inside it, opening kernel code paths (netfilter, mounts) that are a frequent privilege-escalation route",
        args: any,
    },
    Check {
        id: "clone-namespaces",
        what: "clone may create namespaces",
        syscalls: &["clone"],
        reason: "clone with CLONE_NEW* flags creates namespaces just like unshare",
        args: clone_namespace_flags,
    },
    Check {
        id: "clone-namespaces",
        what: "clone may create namespaces",
        syscalls: &["clone3"],
        reason: "clone3 passes its flags in memory a seccomp filter cannot read, so allowing it allows every namespace flag; refuse it with ENOSYS and libc falls back to clone",
        args: any,
    },
    Check {
        id: "keyctl",
        what: "the kernel keyring is reachable",
        syscalls: &["keyctl", "add_key", "request_key"],
        reason: "keyrings are not namespaced: keys can leak between sandboxes and the host, and the code has a history of exploitable bugs",
        args: any,
    },
    Check {
        id: "userfaultfd",
        what: "userfaultfd is allowed",
        syscalls: &["userfaultfd"],
        reason: "userfaultfd lets a process stall the kernel at a chosen page fault, which turns kernel race conditions into reliable exploits",
        args: any,
    },
    Check {
        id: "io_uring",
        what: "io_uring is allowed",
        syscalls: &["io_uring_setup", "io_uring_enter", "io_uring_register"],
        reason: "io_uring performs I/O without syscalls a filter could see, and has a long exploit history",
        args: any,
    },
    Check {
        id: "perf_event_open",
        what: "perf_event_open is allowed",
        syscalls: &["perf_event_open"],
        reason: "performance counters leak kernel addresses and side channels and are a large attack surface",
        args: any,
    },
    Check {
        id: "personality",
        what: "personality can switch off exploit mitigations",
        syscalls: &["personality"],
        reason: "ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, MMAP_PAGE_ZERO and ADDR_COMPAT_LAYOUT disable ASLR, non-executable memory or the null-page guard for the caller and what it executes",
        args: weakening_personality,
    },
    Check {
        id: "ioctl-tiocsti",
        what: "ioctl TIOCSTI is allowed (no argument filter for it)",
        syscalls: &["ioctl"],
        reason: "TIOCSTI pushes characters into a terminal's input, so a sandboxed process sharing a terminal can type commands into the shell that started it",
        args: tiocsti,
    },
    Check {
        id: "ioctl-tioclinux",
        what: "ioctl TIOCLINUX is allowed (no argument filter for it)",
        syscalls: &["ioctl"],
        reason: "TIOCLINUX reads and pastes virtual-console contents, injecting input like TIOCSTI",
        args: tioclinux,
    },
];

/// Runs every check on what a sandbox with the profile gets: its filter and the floor
/// loaded with it. What the floor refuses is no finding, whatever the profile says.
pub fn lint(profile: &Profile) -> Result<Vec<Finding>, CheckError> {
    findings(profile, &Analysis::for_profile(profile)?)
}

/// Runs every check against `analysis` (a profile's filter, with or without the floor).
pub fn findings(profile: &Profile, analysis: &Analysis<'_>) -> Result<Vec<Finding>, CheckError> {
    let accepted: Vec<Abi> = Abi::runnable()
        .into_iter()
        .filter(|a| profile.seccomp.accepts(*a))
        .collect();
    let mut findings: Vec<Finding> = Vec::new();
    for check in CHECKS {
        let Some(space) = (check.args)() else {
            continue;
        };
        let mut hits = Vec::new();
        for abi in &accepted {
            for name in check.syscalls {
                let Some(nr) = abi.syscall_nr(name) else {
                    continue;
                };
                let base = abi.data(nr, [0; 6]);
                if let Some(args) = analysis.runs_for_some(&base, &space, name)? {
                    let target = Target {
                        abi: *abi,
                        nr,
                        name: Some((*name).to_string()),
                    };
                    let (_, decided_by) = analysis.verdict_at(&target, args)?;
                    hits.push(format!(
                        "{name}({}) on {abi}: {}",
                        format_args_list(&args),
                        describe(decided_by)
                    ));
                }
            }
        }
        if hits.is_empty() {
            continue;
        }
        match findings.iter_mut().find(|f| f.id == check.id) {
            Some(f) => {
                f.example = format!("{}; {}", f.example, hits.join("; "));
            }
            None => findings.push(Finding::new(
                check.id,
                check.what.to_string(),
                check.reason,
                hits.join("; "),
            )),
        }
    }
    findings.extend(foreign_abis(profile, analysis)?);
    findings.extend(settings(profile));
    accept(&mut findings, &profile.lint.accept);
    Ok(findings)
}

impl Finding {
    fn new(id: &'static str, message: String, reason: &'static str, example: String) -> Finding {
        Finding {
            id,
            severity: rule(id).unwrap_or(Severity::Error),
            accepted: false,
            message,
            reason,
            example,
        }
    }
}

/// Marks the findings whose rule is in `ids` as accepted.
pub fn accept(findings: &mut [Finding], ids: &[String]) {
    for f in findings.iter_mut() {
        if ids.iter().any(|id| id == f.id) {
            f.accepted = true;
        }
    }
}

/// What the profile's other sections let a sandbox do, or keep it from doing.
fn settings(profile: &Profile) -> Vec<Finding> {
    let mut out = Vec::new();
    if !profile.namespaces.net {
        out.push(Finding::new(
            "host-network",
            "the sandbox shares the host's network (namespaces.net = false)".into(),
            "in the host's network namespace the sandbox reaches every interface of the host, the local network, cloud metadata services and whatever listens on the host's loopback; no seccomp or Landlock rule of a profile narrows that (deny_tcp refuses TCP only)",
            "namespaces.net = false: connect() to any address the host can reach".into(),
        ));
    }
    let l = &profile.landlock;
    if l.execute.is_empty() && l.allow_exec.is_none() {
        let none_at_all = l.read.is_empty() && l.write.is_empty();
        out.push(Finding::new(
            "landlock-empty",
            if none_at_all {
                "the profile grants no paths under [landlock]: nothing can run".into()
            } else {
                "the profile grants no execute paths under [landlock]: nothing can run".into()
            },
            "Landlock refuses every path a profile does not grant: with no execute paths no program (not even the dynamic loader) can be executed, so every command fails unless the command line exposes it with --ro or --rw; list the system directories, e.g. read = [\"/usr\", \"/etc\"] and execute = [\"/usr\"]",
            "execve(\"/usr/bin/true\"): EACCES from Landlock".into(),
        ));
    }
    out
}

fn describe(d: DecidedBy) -> String {
    match d.decider {
        Decider::Rule(_) => format!("allowed by {d}"),
        Decider::DefaultAction => "allowed by the default action".into(),
        Decider::BadArch => "allowed by bad_arch_action".into(),
    }
}

/// i386 and x32: either the filter refuses them, or it filters them with rules written
/// as an allow-list. Letting them through unfiltered, or behind a deny-list written with
/// native syscall names, is the classic bypass.
fn foreign_abis(profile: &Profile, analysis: &Analysis<'_>) -> Result<Vec<Finding>, CheckError> {
    let mut out = Vec::new();
    let default_permits = profile
        .seccomp
        .default_action()
        .map_err(CheckError::Policy)?
        .kernel()
        .runs();
    for abi in Abi::runnable().into_iter().filter(|a| *a != Abi::native()) {
        let Some(nr) = abi.syscall_nr("getpid") else {
            continue;
        };
        let target = Target {
            abi,
            nr,
            name: Some("getpid".into()),
        };
        let (action, _) = analysis.verdict_at(&target, [0; 6])?;
        if !profile.seccomp.accepts(abi) && action.runs() {
            out.push(Finding::new(
                "foreign-abi",
                format!("syscalls through the {abi} ABI ({}) are not filtered", abi.entry()),
                "the filter's rules are written for the native ABI; a process that switches ABI gets past every one of them",
                format!("getpid on {abi}: {action} by bad_arch_action"),
            ));
        } else if profile.seccomp.accepts(abi) && default_permits {
            out.push(Finding::new(
                "foreign-abi",
                format!(
                    "the {abi} ABI ({}) is accepted by a deny-list",
                    abi.entry()
                ),
                "a deny-list names native syscalls; other ABIs have syscalls of their own (socketcall and ipc multiplexers on i386) that carry the denied calls past it",
                format!("getpid on {abi}: {action} by the default action"),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile with these seccomp settings and rules, and Landlock paths a command can
    /// run from.
    fn profile(seccomp: &str) -> Result<Profile, super::super::ProfileError> {
        Profile::from_toml(
            &format!(
                "name = \"t\"\n[seccomp]\n{seccomp}\n[landlock]\nread = [\"/usr\"]\nexecute = [\"/usr\"]\n"
            ),
            "test",
        )
    }

    #[test]
    fn every_check_has_a_rule_with_a_severity() {
        for check in CHECKS {
            assert!(rule(check.id).is_some(), "{}", check.id);
        }
        let ids = rule_ids();
        for (i, id) in ids.iter().enumerate() {
            assert!(!ids[..i].contains(id), "{id} twice");
        }
    }

    #[test]
    fn a_host_network_and_a_profile_that_runs_nothing_are_findings()
    -> Result<(), Box<dyn std::error::Error>> {
        let base = "name = \"t\"\n[seccomp]\ndefault_action = \"errno\"\ndefault_errno = 1\n";
        let bare = Profile::from_toml(base, "test")?;
        let found = lint(&bare)?;
        assert_eq!(
            found.iter().map(|f| f.id).collect::<Vec<_>>(),
            ["landlock-empty"]
        );
        let host = Profile::from_toml(
            &format!(
                "{base}[landlock]\nread = [\"/usr\"]\nexecute = [\"/usr\"]\n[namespaces]\nnet = false\n"
            ),
            "test",
        )?;
        let found = lint(&host)?;
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].id, found[0].severity),
            ("host-network", Severity::Error)
        );
        Ok(())
    }

    #[test]
    fn findings_the_profile_accepts_are_reported_as_accepted()
    -> Result<(), Box<dyn std::error::Error>> {
        let src = "name = \"t\"\n[seccomp]\ndefault_action = \"errno\"\ndefault_errno = 1\n[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"ptrace\", \"bpf\"]\n[landlock]\nexecute = [\"/usr\"]\n[lint]\naccept = [\"ptrace\"]\n";
        let found = lint(&Profile::from_toml(src, "test")?)?;
        let state: Vec<(&str, bool)> = found.iter().map(|f| (f.id, f.accepted)).collect();
        assert_eq!(state, [("ptrace", true), ("bpf", false)]);
        Ok(())
    }

    fn ids(p: &Profile) -> Result<Vec<&'static str>, CheckError> {
        Ok(lint(p)?.into_iter().map(|f| f.id).collect())
    }

    /// The checks on the profile's own filter, without the floor under it.
    fn alone(p: &Profile) -> Result<Vec<Finding>, CheckError> {
        findings(p, &Analysis::new(&p.seccomp)?)
    }

    #[test]
    fn shipped_default_and_strict_have_no_findings() -> Result<(), Box<dyn std::error::Error>> {
        for name in ["default", "strict"] {
            let p = Profile::resolve(name)?;
            let found = lint(&p)?;
            assert!(found.is_empty(), "{name}: {found:?}");
        }
        Ok(())
    }

    #[test]
    fn each_dangerous_allow_is_found_with_a_reason() -> Result<(), Box<dyn std::error::Error>> {
        let deny_all = "default_action = \"errno\"\ndefault_errno = \"EPERM\"\n";
        let cases: &[(&str, &str)] = &[
            (
                "ptrace",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"ptrace\"]\n",
            ),
            (
                "bpf",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"bpf\"]\n",
            ),
            (
                "mount",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"mount\"]\n",
            ),
            (
                "unshare",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"unshare\"]\n",
            ),
            (
                "clone-namespaces",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"clone\"]\n",
            ),
            (
                "clone-namespaces",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"clone3\"]\n",
            ),
            (
                "keyctl",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"keyctl\"]\n",
            ),
            (
                "userfaultfd",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"userfaultfd\"]\n",
            ),
            (
                "io_uring",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"io_uring_setup\"]\n",
            ),
            (
                "perf_event_open",
                "[[seccomp.rule]]\naction = \"log\"\nsyscalls = [\"perf_event_open\"]\n",
            ),
            (
                "personality",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"personality\"]\nargs = [{ index = 0, op = \"ne\", value = 0 }]\n",
            ),
            // An equality filter on the full 64-bit word misses TIOCSTI with upper bits set.
            (
                "ioctl-tiocsti",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"ioctl\"]\nargs = [{ index = 1, op = \"ne\", value = \"TIOCSTI\" }]\n",
            ),
            (
                "ioctl-tioclinux",
                "[[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"ioctl\"]\n",
            ),
        ];
        for (id, rule) in cases {
            let p = profile(&format!("{deny_all}{rule}"))?;
            let found = alone(&p)?;
            let hit = found.iter().find(|f| f.id == *id);
            match hit {
                Some(f) => assert!(!f.reason.is_empty() && !f.example.is_empty(), "{f:?}"),
                None => panic!("{id} not found for {rule}: {found:?}"),
            }
        }
        Ok(())
    }

    #[test]
    fn what_the_floor_refuses_is_no_finding() -> Result<(), Box<dyn std::error::Error>> {
        // compat allows every ioctl, as Docker does: TIOCSTI and TIOCLINUX get through its
        // own filter, and the floor refuses both.
        let p = Profile::resolve("compat")?;
        let own: Vec<&str> = alone(&p)?.into_iter().map(|f| f.id).collect();
        assert!(
            own.contains(&"ioctl-tiocsti") && own.contains(&"ioctl-tioclinux"),
            "{own:?}"
        );
        assert_eq!(ids(&p)?, vec!["ptrace"]);
        Ok(())
    }

    #[test]
    fn safe_argument_filters_are_not_findings() -> Result<(), Box<dyn std::error::Error>> {
        let p = profile(
            "default_action = \"errno\"\ndefault_errno = \"EPERM\"\n\
             [[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"personality\"]\nargs = [{ index = 0, op = \"eq\", value = \"PER_QUERY\" }]\n\
             [[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"ioctl\"]\nargs = [{ index = 1, op = \"masked_eq\", mask = 0xffffffff, value = \"TCGETS\" }]\n\
             [[seccomp.rule]]\naction = \"allow\"\nsyscalls = [\"clone\"]\nargs = [{ index = 0, op = \"masked_eq\", mask = \"CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWNET|CLONE_NEWUTS|CLONE_NEWIPC|CLONE_NEWCGROUP\", value = 0 }]\n",
        )?;
        assert_eq!(ids(&p)?, Vec::<&str>::new());
        Ok(())
    }

    #[test]
    fn unfiltered_foreign_abis_are_found() -> Result<(), Box<dyn std::error::Error>> {
        if Abi::native() != Abi::X86_64 {
            return Ok(());
        }
        let p = profile(
            "default_action = \"errno\"\ndefault_errno = 1\nbad_arch_action = \"allow\"\n",
        )?;
        assert_eq!(ids(&p)?, vec!["foreign-abi", "foreign-abi"]);
        let p = profile(
            "default_action = \"allow\"\narchitectures = [\"native\", \"x86\"]\n[[seccomp.rule]]\naction = \"errno\"\nerrno = 1\nsyscalls = [\"ptrace\", \"bpf\", \"mount\", \"unshare\", \"setns\", \"clone3\", \"keyctl\", \"add_key\", \"request_key\", \"userfaultfd\", \"io_uring_setup\", \"io_uring_enter\", \"io_uring_register\", \"perf_event_open\", \"personality\", \"umount2\", \"pivot_root\", \"move_mount\", \"open_tree\", \"fsopen\", \"fsconfig\", \"fsmount\", \"fspick\", \"mount_setattr\", \"ioctl\", \"clone\"]\n",
        )?;
        assert_eq!(ids(&p)?, vec!["foreign-abi"]);
        Ok(())
    }
}
