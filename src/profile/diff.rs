//! What changes between two profiles: every syscall whose verdict differs for some
//! arguments (found by exploring the compiled filters together — each profile's and the
//! seccomp floor loaded under it —, so a difference hidden in an argument condition is
//! found too), and the differences in Landlock, mounts, namespaces, rlimits and default
//! limits.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Profile;
use super::abi::Abi;
use super::bpf::{self, KernelAction, SeccompData};
use super::explore::{self, ArgSpace};
use super::program::SeccompProgram;
use super::seccomp::format_args_list;
use super::verdict::{Analysis, CheckError};

/// How B's seccomp verdicts compare with A's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// No call gets a different verdict.
    Same,
    /// Wherever the two differ, B's verdict is the more restrictive one (the kernel's
    /// order: kill > trap > errno > notify > trace > log > allow).
    Stricter,
    /// Wherever the two differ, B's verdict is the less restrictive one.
    Looser,
    /// Stricter for some calls and looser for others, or neither (another errno).
    Different,
}

impl Change {
    /// How `b` compares with `a` for one call.
    pub fn of(a: KernelAction, b: KernelAction) -> Change {
        // The kernel's precedence: the lower value wins, so a lower `b` is stricter.
        match a.precedence().cmp(&b.precedence()) {
            _ if a == b => Change::Same,
            std::cmp::Ordering::Greater => Change::Stricter,
            std::cmp::Ordering::Less => Change::Looser,
            std::cmp::Ordering::Equal => Change::Different,
        }
    }

    /// Both changes together: one direction only if both go that way.
    pub fn and(self, other: Change) -> Change {
        match (self, other) {
            (Change::Same, x) | (x, Change::Same) => x,
            (x, y) if x == y => x,
            _ => Change::Different,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Change::Same => "same",
            Change::Stricter => "stricter",
            Change::Looser => "looser",
            Change::Different => "different",
        }
    }
}

/// One side's verdict for a syscall with all-zero arguments.
#[derive(Debug, Clone, Serialize)]
pub struct SideVerdict {
    /// allow, errno, kill, log, trap (as `profile check --json` says).
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    /// Whether the call runs (allow or log).
    pub allowed: bool,
    /// Other arguments get another verdict.
    pub conditional: bool,
    #[serde(skip)]
    pub kernel: KernelAction,
}

impl std::fmt::Display for SideVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Padded as a whole, so the text table's columns line up.
        if self.conditional {
            f.pad(&format!("{} (conditional)", self.kernel))
        } else {
            f.pad(&self.kernel.to_string())
        }
    }
}

/// One syscall whose verdict differs.
#[derive(Debug, Clone, Serialize)]
pub struct SyscallDiff {
    pub arch: &'static str,
    pub syscall: String,
    pub nr: i32,
    /// The verdicts with all-zero arguments (`conditional` when arguments matter).
    pub a: SideVerdict,
    pub b: SideVerdict,
    /// How B compares with A over every argument where they differ.
    pub verdict: Change,
    /// Arguments where the two differ, and the two verdicts there.
    pub example: String,
}

/// One setting whose value differs.
#[derive(Debug, Clone, Serialize)]
pub struct SettingDiff {
    pub key: String,
    pub a: String,
    pub b: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProfileDiff {
    /// How B's seccomp verdicts compare with A's, over every syscall and ABI; an ABI one
    /// accepts and the other refuses makes it `different`.
    pub verdict: Change,
    pub syscalls: Vec<SyscallDiff>,
    /// Whole ABIs one profile accepts and the other refuses.
    pub abis: Vec<String>,
    pub settings: Vec<SettingDiff>,
}

impl Default for ProfileDiff {
    fn default() -> Self {
        ProfileDiff {
            verdict: Change::Same,
            syscalls: Vec::new(),
            abis: Vec::new(),
            settings: Vec::new(),
        }
    }
}

impl ProfileDiff {
    pub fn is_empty(&self) -> bool {
        self.syscalls.is_empty() && self.abis.is_empty() && self.settings.is_empty()
    }
}

fn summary(a: &Analysis<'_>, abi: Abi, nr: i32, name: &str) -> Result<SideVerdict, CheckError> {
    let v = a.check(
        &super::verdict::Target {
            abi,
            nr,
            name: Some(name.to_string()),
        },
        [0; 6],
    )?;
    Ok(SideVerdict {
        action: v.action.kind(),
        errno: v.action.errno(),
        allowed: v.action.runs(),
        conditional: v.conditional,
        kernel: v.action,
    })
}

/// Where two analyses give different verdicts for one syscall: for each pair of differing
/// verdicts, the first argument vector found that gets them.
pub fn differences(
    a: &Analysis<'_>,
    b: &Analysis<'_>,
    base: &SeccompData,
    what: &str,
) -> Result<Vec<(KernelAction, KernelAction, [u64; 6])>, CheckError> {
    let (pa, pb) = (a.programs(), b.programs());
    let programs: Vec<&SeccompProgram> = pa.iter().chain(pb.iter()).copied().collect();
    let joint = explore::explore_joint(&programs, base, &ArgSpace::any()).map_err(|source| {
        CheckError::Analysis {
            what: what.to_string(),
            source,
        }
    })?;
    let mut out: Vec<(KernelAction, KernelAction, [u64; 6])> = Vec::new();
    for path in joint {
        let (own_a, own_b) = path.actions.split_at(pa.len());
        let (Some((_, va)), Some((_, vb))) = (bpf::stacked(own_a), bpf::stacked(own_b)) else {
            continue;
        };
        if va != vb && !out.iter().any(|(x, y, _)| *x == va && *y == vb) {
            out.push((va, vb, path.witness));
        }
    }
    Ok(out)
}

/// Compares the seccomp verdicts of two profiles — each with the floor a sandbox loads
/// under it — on every ABI this machine runs.
pub fn seccomp_diff(a: &Profile, b: &Profile, out: &mut ProfileDiff) -> Result<(), CheckError> {
    let (fa, fb) = (Analysis::for_profile(a)?, Analysis::for_profile(b)?);
    for abi in Abi::runnable() {
        let (acc_a, acc_b) = (a.seccomp.accepts(abi), b.seccomp.accepts(abi));
        if acc_a != acc_b {
            let says = |p: &Profile, accepts: bool| -> Result<String, CheckError> {
                Ok(if accepts {
                    format!("{} filters it with its rules", p.name)
                } else {
                    format!(
                        "{} refuses it ({} by bad_arch_action)",
                        p.name,
                        p.seccomp
                            .bad_arch_action()
                            .map_err(CheckError::Policy)?
                            .kernel()
                    )
                })
            };
            out.abis.push(format!(
                "{abi} ABI ({}): {}; {}",
                abi.entry(),
                says(a, acc_a)?,
                says(b, acc_b)?
            ));
            out.verdict = out.verdict.and(Change::Different);
            continue;
        }
        for (nr, name) in abi.syscalls() {
            let base = abi.data(nr, [0; 6]);
            let diffs = differences(&fa, &fb, &base, &name)?;
            let Some((va, vb, args)) = diffs.first().copied() else {
                continue;
            };
            let verdict = diffs
                .iter()
                .fold(Change::Same, |c, (x, y, _)| c.and(Change::of(*x, *y)));
            out.verdict = out.verdict.and(verdict);
            out.syscalls.push(SyscallDiff {
                arch: abi.name(),
                nr,
                a: summary(&fa, abi, nr, &name)?,
                b: summary(&fb, abi, nr, &name)?,
                verdict,
                example: example(va, vb, &args),
                syscall: name,
            });
        }
    }
    Ok(())
}

/// A call one analysis lets run and the other refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Looser {
    pub abi: Abi,
    pub syscall: String,
    pub args: [u64; 6],
    /// The verdict of the looser side, and of the stricter one.
    pub looser: KernelAction,
    pub stricter: KernelAction,
}

impl std::fmt::Display for Looser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}({}) on {}: {} where the other gives {}",
            self.syscall,
            format_args_list(&self.args),
            self.abi,
            self.looser,
            self.stricter
        )
    }
}

/// Every syscall (of every ABI this machine runs, and libseccomp names) for which `a` lets
/// some call run that `b` refuses, with the first such arguments found. The arguments are
/// explored exactly, not sampled: every value either filter tells apart is covered.
pub fn looser(a: &Analysis<'_>, b: &Analysis<'_>) -> Result<Vec<Looser>, CheckError> {
    let mut out = Vec::new();
    for abi in Abi::runnable() {
        for (nr, name) in abi.syscalls() {
            let base = abi.data(nr, [0; 6]);
            for (va, vb, args) in differences(a, b, &base, &name)? {
                if va.runs() && !vb.runs() {
                    out.push(Looser {
                        abi,
                        syscall: name.clone(),
                        args,
                        looser: va,
                        stricter: vb,
                    });
                    break;
                }
            }
        }
    }
    Ok(out)
}

fn example(a: KernelAction, b: KernelAction, args: &[u64; 6]) -> String {
    format!("{}: {a} vs {b}", format_args_list(args))
}

/// Flattens a JSON value into `key → text` pairs.
fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        serde_json::Value::Null => {}
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// Compares everything but seccomp.
pub fn settings_diff(a: &Profile, b: &Profile, out: &mut ProfileDiff) -> Result<(), CheckError> {
    let json = |p: &Profile| -> Result<BTreeMap<String, String>, CheckError> {
        let v = serde_json::json!({
            "landlock": p.landlock,
            "namespaces": p.namespaces,
            "mounts": p.mounts,
            "rlimits": p.rlimits,
            "limits": p.limits,
        });
        let mut flat = BTreeMap::new();
        flatten("", &v, &mut flat);
        Ok(flat)
    };
    let (ja, jb) = (json(a)?, json(b)?);
    let keys: std::collections::BTreeSet<&String> = ja.keys().chain(jb.keys()).collect();
    let none = "(not set)".to_string();
    for key in keys {
        let (va, vb) = (ja.get(key).unwrap_or(&none), jb.get(key).unwrap_or(&none));
        if va != vb {
            out.settings.push(SettingDiff {
                key: key.clone(),
                a: va.clone(),
                b: vb.clone(),
            });
        }
    }
    Ok(())
}

/// Everything that differs between two profiles.
pub fn diff(a: &Profile, b: &Profile) -> Result<ProfileDiff, CheckError> {
    let mut out = ProfileDiff::default();
    seccomp_diff(a, b, &mut out)?;
    settings_diff(a, b, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_does_not_differ_from_itself() -> Result<(), Box<dyn std::error::Error>> {
        let p = Profile::resolve("default")?;
        assert!(diff(&p, &p)?.is_empty());
        Ok(())
    }

    #[test]
    fn differences_hidden_in_argument_conditions_are_found()
    -> Result<(), Box<dyn std::error::Error>> {
        let base = "name = \"t\"\n[seccomp]\ndefault_action = \"allow\"\n[[seccomp.rule]]\naction = \"errno\"\nerrno = 1\nsyscalls = [\"personality\"]\n";
        let a = Profile::from_toml(
            &format!("{base}args = [{{ index = 0, op = \"lt\", value = 10 }}]\n"),
            "a",
        )?;
        let b = Profile::from_toml(
            &format!("{base}args = [{{ index = 0, op = \"lt\", value = 11 }}]\n"),
            "b",
        )?;
        let d = diff(&a, &b)?;
        assert_eq!(d.syscalls.len(), 1, "{d:?}");
        assert_eq!(d.syscalls[0].syscall, "personality");
        assert!(
            d.syscalls[0].example.contains("arg0=0xa"),
            "{:?}",
            d.syscalls[0]
        );
        // Same verdicts with all-zero arguments, still a difference: B refuses arg0=10,
        // which A lets run.
        assert_eq!(d.syscalls[0].a.to_string(), d.syscalls[0].b.to_string());
        assert_eq!(d.syscalls[0].verdict, Change::Stricter);
        assert_eq!(d.verdict, Change::Stricter);
        Ok(())
    }

    /// `default` says it is at least as strict as Docker's default profile for a container
    /// without capabilities. Docker's profile is imported for the oldest kernel its
    /// `minKernel` conditions know (they only ever add allow rules, so this is Docker at its
    /// strictest), and for every syscall libseccomp names, on every ABI, every argument
    /// value either filter tells apart is explored: wherever Docker refuses a call, default
    /// with the floor refuses it too.
    #[test]
    fn default_with_the_floor_is_never_more_permissive_than_docker()
    -> Result<(), Box<dyn std::error::Error>> {
        use crate::profile::oci;
        let json = oci::parse(
            include_str!("../../tests/fixtures/docker-default-seccomp.json"),
            "docker-default-seccomp.json",
        )?;
        let docker = oci::import(
            &json,
            &oci::ImportOptions {
                name: "docker".into(),
                source: "docker-default-seccomp.json".into(),
                kernel: oci::KernelVersion(4, 0, 0),
            },
        )?
        .profile;
        let default = Profile::resolve("default")?;
        let found = looser(
            &Analysis::for_profile(&default)?,
            &Analysis::new(&docker.seccomp)?,
        )?;
        let lines: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert!(
            found.is_empty(),
            "default lets through what Docker refuses:\n{}",
            lines.join("\n")
        );
        // The comparison itself finds what it should: Docker allows ptrace from 4.8 on,
        // which default refuses, and default without its rules is far looser than Docker.
        let allow_all = Profile::from_toml(
            "name = \"open\"\n[seccomp]\ndefault_action = \"allow\"\n",
            "open",
        )?;
        let open = looser(
            &Analysis::for_profile(&allow_all)?,
            &Analysis::new(&docker.seccomp)?,
        )?;
        assert!(open.iter().any(|l| l.syscall == "ptrace"), "{open:?}");
        assert!(open.iter().any(|l| l.syscall == "socket"), "{open:?}");
        Ok(())
    }

    #[test]
    fn the_floor_is_part_of_both_sides_of_a_diff() -> Result<(), Box<dyn std::error::Error>> {
        // A profile that allows everything and one that names the floor's rules itself
        // enforce the same: the floor is under both.
        let open = Profile::from_toml(
            "name = \"open\"\n[seccomp]\ndefault_action = \"allow\"\n",
            "open",
        )?;
        let floor = crate::profile::floor::Floor::for_profile(&open)?;
        let mut explicit = open.clone();
        explicit.name = "explicit".into();
        explicit.seccomp.rules = floor.policy.rules.clone();
        explicit.check()?;
        let d = diff(&open, &explicit)?;
        assert!(d.syscalls.is_empty(), "{d:?}");
        Ok(())
    }

    #[test]
    fn default_and_strict_differ_in_syscalls_but_not_in_landlock()
    -> Result<(), Box<dyn std::error::Error>> {
        let d = diff(&Profile::resolve("default")?, &Profile::resolve("strict")?)?;
        assert!(d.syscalls.iter().any(|s| s.syscall == "socket"));
        let socket = d.syscalls.iter().find(|s| s.syscall == "socket");
        assert_eq!(socket.map(|s| s.verdict), Some(Change::Stricter));
        assert!(!d.syscalls.iter().any(|s| s.syscall == "read"));
        assert!(
            !d.settings.iter().any(|s| s.key.starts_with("landlock")),
            "{:?}",
            d.settings
        );
        Ok(())
    }
}
