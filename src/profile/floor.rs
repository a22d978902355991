//! The seccomp floor: rules loaded under every profile, as a filter of their own.
//!
//! A profile is a policy someone wrote — a built-in one, an import of Docker's, a user's
//! file — and each can forget something. The floor is what hatchery refuses whatever the
//! profile says: sockets that leave the network namespace (`AF_VSOCK`), netlink families a
//! sandbox has no use for, terminal input injection, set-uid and set-gid files, and, under
//! an executable allowlist, files the sandbox writes that could be mapped executable
//! (memory files, executable SysV shared memory). It is written in the profile format (`profiles/floor.toml` and, for allowlists,
//! `profiles/floor-allowlist.toml`, embedded in the binary) and compiled by the same code.
//!
//! The sandbox loads the floor's filter before the profile's (a profile may refuse
//! seccomp(2) itself), and the kernel runs both on every syscall, applying the most
//! restrictive verdict: kill > trap > errno > log > allow, and on a tie the answer of the
//! filter loaded last, the profile's ([`super::bpf::stacked`]). So no profile can allow
//! what the floor refuses, and no sandbox has more than two filters.
//!
//! The floor is compiled for every ABI the profile lets through: the profile's
//! `architectures`, and all ABIs of this machine when the profile's `bad_arch_action`
//! lets calls run. Which ABIs run at all stays the profile's decision (the floor's own
//! bad-arch action is allow).

use super::abi::Abi;
use super::program::SeccompProgram;
use super::seccomp::{SeccompPolicy, resolve_syscall};
use super::{Profile, ProfileError};

/// The floor's rules, as shipped.
pub const SOURCE: &str = include_str!("../../profiles/floor.toml");

/// The rules the floor gains under an executable allowlist.
pub const ALLOWLIST_SOURCE: &str = include_str!("../../profiles/floor-allowlist.toml");

/// The same two files as JSON, made at build time (see `build.rs`), which is what is
/// decoded at run time.
const SOURCE_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/floor.json"));
const ALLOWLIST_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/floor-allowlist.json"));

/// The floor as it applies under one profile, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floor {
    /// The rules, with the ABIs they are compiled for.
    pub policy: SeccompPolicy,
    /// The filter the sandbox loads before the profile's.
    pub program: SeccompProgram,
    /// Whether the allowlist rules are in (from rule [`Floor::allowlist_from`] on).
    pub exec_allowlist: bool,
    /// Index of the first allowlist rule (the number of the floor's own rules).
    pub allowlist_from: usize,
    /// Names this system's libseccomp does not know, left out (and so not filtered).
    pub notes: Vec<String>,
}

fn floor_error(origin: &str, message: String) -> ProfileError {
    ProfileError::Seccomp {
        origin: origin.to_string(),
        line: None,
        message,
    }
}

/// Reads a floor file: its seccomp section, with syscall names this libseccomp does not
/// know left out (noted), since a name it cannot resolve cannot be compiled at all. What
/// remains is validated like any profile.
fn parse(json: &str, origin: &str, notes: &mut Vec<String>) -> Result<SeccompPolicy, ProfileError> {
    let profile: Profile = serde_json::from_str(json).map_err(|e| ProfileError::Parse {
        origin: origin.to_string(),
        line: None,
        column: None,
        message: e.to_string(),
    })?;
    let mut policy = profile.seccomp;
    for rule in &mut policy.rules {
        let (known, unknown): (Vec<String>, Vec<String>) = rule
            .syscalls
            .drain(..)
            .partition(|n| resolve_syscall(n).is_ok());
        if !unknown.is_empty() {
            notes.push(format!(
                "{origin}: unknown to this system's libseccomp, not filtered by the floor: {}",
                unknown.join(", ")
            ));
        }
        rule.syscalls = known;
    }
    policy.rules.retain(|r| !r.syscalls.is_empty());
    Ok(policy)
}

/// The ABIs the floor is compiled for under `profile`: every ABI whose calls the profile's
/// filter lets reach its rules or lets run without them.
pub fn architectures_for(profile: &SeccompPolicy) -> Result<Vec<String>, String> {
    let mut out = profile.architectures.clone();
    if profile.bad_arch_action()?.kernel().runs() {
        for abi in Abi::runnable() {
            if !out.iter().any(|a| a == abi.name()) {
                out.push(abi.name().to_string());
            }
        }
    }
    Ok(out)
}

impl Floor {
    /// The floor under a profile's seccomp policy, with the allowlist rules or without.
    pub fn new(profile: &SeccompPolicy, exec_allowlist: bool) -> Result<Floor, ProfileError> {
        let origin = "builtin:floor";
        let mut notes = Vec::new();
        let mut policy = parse(SOURCE_JSON, origin, &mut notes)?;
        let allowlist_from = policy.rules.len();
        if exec_allowlist {
            let extra = parse(ALLOWLIST_JSON, "builtin:floor-allowlist", &mut notes)?;
            policy.rules.extend(extra.rules);
        }
        policy.architectures = architectures_for(profile).map_err(|m| floor_error(origin, m))?;
        policy
            .validate()
            .map_err(|e| floor_error(origin, e.to_string()))?;
        let program = policy.compile().map_err(|m| floor_error(origin, m))?;
        Ok(Floor {
            policy,
            program,
            exec_allowlist,
            allowlist_from,
            notes,
        })
    }

    /// The floor a sandbox with this profile gets (with the allowlist rules when the
    /// profile has an executable allowlist).
    pub fn for_profile(profile: &Profile) -> Result<Floor, ProfileError> {
        Floor::new(&profile.seccomp, profile.landlock.allow_exec.is_some())
    }

    /// Whether this is the floor a sandbox with `profile` must get: the same ABIs, and the
    /// allowlist rules exactly when the profile has an allowlist. A compiled floor handed
    /// around (the launcher caches them) is checked with this before it is used.
    pub fn fits(&self, profile: &Profile) -> bool {
        self.exec_allowlist == profile.landlock.allow_exec.is_some()
            && architectures_for(&profile.seccomp).ok().as_ref() == Some(&self.policy.architectures)
    }

    /// Whether rule `index` (0-based) is one of the allowlist rules.
    pub fn is_allowlist_rule(&self, index: usize) -> bool {
        self.exec_allowlist && index >= self.allowlist_from
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::bpf::{self, KernelAction};
    use crate::profile::verdict::Analysis;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn policy(architectures: &[&str], bad_arch: &str) -> Result<SeccompPolicy, String> {
        toml::from_str(&format!(
            "default_action = \"allow\"\narchitectures = {architectures:?}\nbad_arch_action = \"{bad_arch}\"\n"
        ))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_floor_compiles_for_every_abi_set_the_profiles_use() -> TestResult {
        let mut sets: Vec<SeccompPolicy> = crate::profile::BUILTIN
            .iter()
            .map(|(n, _)| Profile::resolve(n).map(|p| p.seccomp))
            .collect::<Result<_, _>>()?;
        sets.push(policy(&["native", "x86", "x32"], "kill")?);
        sets.push(policy(&["native"], "allow")?);
        sets.push(policy(&["x86_64", "x86"], "trap")?);
        for profile in &sets {
            for exec in [false, true] {
                let floor = Floor::new(profile, exec)?;
                assert!(!floor.program.is_empty());
                assert!(floor.notes.is_empty(), "{:?}", floor.notes);
                // Every rule is checked against the compiled filter, on every ABI.
                let a = Analysis::new(&floor.policy)?;
                for abi in Abi::runnable() {
                    assert!(!a.check_all(abi)?.is_empty(), "{abi}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn the_floor_filters_every_abi_the_profile_lets_through() -> Result<(), String> {
        let native = policy(&["native"], "kill")?;
        assert_eq!(architectures_for(&native)?, ["native"]);
        let open = policy(&["native"], "allow")?;
        let all = architectures_for(&open)?;
        for abi in Abi::runnable() {
            assert!(all.iter().any(|a| a == abi.name()), "{abi}: {all:?}");
        }
        Ok(())
    }

    #[test]
    fn i386_socketcall_is_refused_and_direct_socket_calls_are_filtered() -> TestResult {
        if Abi::native() != Abi::X86_64 {
            return Ok(());
        }
        let floor = Floor::new(&policy(&["native", "x86"], "kill")?, false)?;
        let run = |nr: i32, args: [u64; 6]| bpf::evaluate(&floor.program, &Abi::X86.data(nr, args));
        // socketcall(SYS_SOCKET, args in memory): refused whatever it carries.
        let socketcall = Abi::X86.syscall_nr("socketcall").ok_or("no socketcall")?;
        for call in [1u64, 2, 3, 17] {
            assert_eq!(
                run(socketcall, [call, 0, 0, 0, 0, 0])?,
                KernelAction::Errno(1)
            );
        }
        // i386's direct socket(2) (359 since Linux 4.3) gets the family rules.
        let vsock = libc::AF_VSOCK as u64;
        assert_eq!(run(359, [vsock, 1, 0, 0, 0, 0])?, KernelAction::Errno(1));
        assert_eq!(
            run(359, [libc::AF_INET as u64, 1, 0, 0, 0, 0])?,
            KernelAction::Allow
        );
        Ok(())
    }

    #[test]
    fn the_allowlist_rules_number_on_after_the_floors_own() -> TestResult {
        let p = Profile::resolve("default")?;
        let plain = Floor::new(&p.seccomp, false)?;
        let exec = Floor::new(&p.seccomp, true)?;
        assert_eq!(plain.policy.rules.len(), plain.allowlist_from);
        assert!(exec.policy.rules.len() > exec.allowlist_from);
        assert_eq!(
            plain.policy.rules[..],
            exec.policy.rules[..exec.allowlist_from]
        );
        assert!(exec.is_allowlist_rule(exec.allowlist_from));
        assert!(!plain.is_allowlist_rule(plain.allowlist_from));
        assert!(plain.fits(&p) && !exec.fits(&p));
        Ok(())
    }

    #[test]
    fn names_this_libseccomp_does_not_know_are_left_out_with_a_note() -> TestResult {
        let src = "name = \"x\"\n[seccomp]\ndefault_action = \"allow\"\n[[seccomp.rule]]\naction = \"errno\"\nerrno = 1\nsyscalls = [\"no_such_call\", \"ptrace\"]\n[[seccomp.rule]]\naction = \"errno\"\nerrno = 1\nsyscalls = [\"no_such_call_either\"]\n";
        let value: toml::Value = toml::from_str(src)?;
        let json = serde_json::to_string(&value)?;
        let mut notes = Vec::new();
        let p = parse(&json, "test", &mut notes)?;
        assert_eq!(p.rules.len(), 1);
        assert_eq!(p.rules[0].syscalls, ["ptrace"]);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].contains("no_such_call"), "{notes:?}");
        Ok(())
    }
}
