//! The seccomp part of a profile: a default action, rules that name syscalls (optionally
//! with argument conditions), the architectures the filter accepts, and the compilation of
//! all that into the classic-BPF program the kernel loads.
//!
//! Compilation goes through libseccomp, and the bytes it exports are the bytes the sandbox
//! hands to seccomp(2): what `profile show --format bpf` prints is what is enforced.

use std::collections::BTreeMap;
use std::io::{Read, Seek};

use libseccomp::{
    ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall,
};

use super::abi::{Abi, parse_arch};
use super::bpf::KernelAction;
use super::names;
use super::program::SeccompProgram;
use super::solver::{self, Constraint, Rel, Solution};

mod format;
pub use format::*;

/// Most rules a profile may hold; the strictest real-world allow-lists have a few hundred.
pub const MAX_RULES: usize = 4096;

/// What decides a call, in the profile's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Decider {
    /// The rule at this index (0-based; shown 1-based).
    Rule(usize),
    DefaultAction,
    /// The ABI is not among the profile's architectures.
    BadArch,
}

impl std::fmt::Display for Decider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Decider::Rule(i) => write!(f, "rule {}", i + 1),
            Decider::DefaultAction => f.write_str("default_action"),
            Decider::BadArch => f.write_str("bad_arch_action"),
        }
    }
}

/// A policy error and the place it is about, so the file's line can be named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    /// The rule (0-based) the error is about.
    pub rule: Option<usize>,
    /// A second rule involved (a contradiction).
    pub other: Option<usize>,
    /// The syscall name within the rule.
    pub syscall: Option<String>,
    /// The key the error is about: in the rule, or in `[seccomp]` when there is no rule.
    pub key: Option<&'static str>,
    pub message: String,
}

impl PolicyError {
    fn whole(message: String) -> PolicyError {
        PolicyError {
            rule: None,
            other: None,
            syscall: None,
            key: None,
            message,
        }
    }

    /// About one key of `[seccomp]`.
    fn key(key: &'static str, message: String) -> PolicyError {
        PolicyError {
            key: Some(key),
            ..PolicyError::whole(message)
        }
    }

    fn at(rule: usize, syscall: Option<&String>, message: String) -> PolicyError {
        PolicyError {
            rule: Some(rule),
            other: None,
            syscall: syscall.cloned(),
            key: None,
            message,
        }
    }

    /// About one key of a rule.
    fn at_key(rule: usize, key: &'static str, message: String) -> PolicyError {
        PolicyError {
            key: Some(key),
            ..PolicyError::at(rule, None, message)
        }
    }
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rule {
            Some(i) => write!(f, "rule {}: {}", i + 1, self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for PolicyError {}

/// A condition as solver constraints on a `width`-bit argument.
fn constraint_of(c: &ArgCondition, width: u32) -> Result<Constraint, String> {
    let limit = if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    };
    let value = c
        .value
        .as_ref()
        .map(ValueSpec::resolve)
        .transpose()?
        .unwrap_or(0)
        & limit;
    let mask = c
        .mask
        .as_ref()
        .map(ValueSpec::resolve)
        .transpose()?
        .unwrap_or(0)
        & limit;
    Ok(match c.op {
        CompareOp::Eq => Constraint::new(limit, Rel::Eq, value),
        CompareOp::Ne => Constraint::new(limit, Rel::Ne, value),
        CompareOp::Lt => Constraint::new(limit, Rel::Lt, value),
        CompareOp::Le => Constraint::new(limit, Rel::Le, value),
        CompareOp::Gt => Constraint::new(limit, Rel::Gt, value),
        CompareOp::Ge => Constraint::new(limit, Rel::Ge, value),
        CompareOp::MaskedEq => Constraint::new(mask, Rel::Eq, value),
        CompareOp::AnyBits => Constraint::new(mask, Rel::AnySet, 0),
    })
}

/// Whether a condition holds for an argument, compared at `width` bits as libseccomp does.
pub fn condition_holds(c: &ArgCondition, arg: u64, width: u32) -> Result<bool, String> {
    let limit = if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    };
    Ok(constraint_of(c, width)?.holds(arg & limit))
}

/// An argument vector satisfying both condition lists, if there is one.
fn overlap(a: &[ArgCondition], b: &[ArgCondition], width: u32) -> Result<Option<[u64; 6]>, String> {
    let mut args = [0u64; 6];
    for (index, slot) in args.iter_mut().enumerate() {
        let cs = a
            .iter()
            .chain(b)
            .filter(|c| usize::from(c.index) == index)
            .map(|c| constraint_of(c, width))
            .collect::<Result<Vec<_>, _>>()?;
        match solver::solve(&cs, width) {
            Solution::Value(v) => *slot = v,
            Solution::Infeasible => return Ok(None),
            Solution::Undecided => {
                return Err("conditions too complex to check against each other".into());
            }
        }
    }
    Ok(Some(args))
}

/// `[0x0, 0x10000000, ...]` with trailing zero arguments left out.
pub fn format_args_list(args: &[u64; 6]) -> String {
    let used = args.iter().rposition(|a| *a != 0).map_or(1, |i| i + 1);
    let parts: Vec<String> = args[..used]
        .iter()
        .enumerate()
        .map(|(i, a)| format!("arg{i}={a:#x}"))
        .collect();
    parts.join(" ")
}

/// One libseccomp rule after expansion (`any_bits` split into one rule per bit).
struct ExpandedRule {
    action: Action,
    syscall: String,
    conditions: Vec<ScmpArgCompare>,
}

impl SeccompPolicy {
    /// The key that sets the default: `default_errno` when given, else `default_action`.
    fn default_key(&self) -> &'static str {
        match self.default_errno {
            Some(_) => "default_errno",
            None => "default_action",
        }
    }

    pub fn default_action(&self) -> Result<Action, String> {
        action_of(self.default_action, self.default_errno.as_ref()).map_err(|e| {
            let key = self.default_key();
            format!("{key}: {e}")
        })
    }

    pub fn bad_arch_action(&self) -> Result<Action, String> {
        if self.bad_arch_action == ActionKind::Errno {
            return Err(
                "bad_arch_action: cannot be \"errno\" (it takes no errno): use kill, trap, log or allow".into(),
            );
        }
        action_of(self.bad_arch_action, None).map_err(|e| format!("bad_arch_action: {e}"))
    }

    /// The libseccomp architectures of the filter, native first.
    pub fn arches(&self) -> Result<Vec<ScmpArch>, String> {
        let native = ScmpArch::native();
        let mut out = vec![native];
        for name in &self.architectures {
            let arch = if name == "native" {
                native
            } else {
                parse_arch(name)?
            };
            if !out.contains(&arch) {
                out.push(arch);
            }
        }
        Ok(out)
    }

    /// Checks the policy without compiling it: actions, names, conditions, and that no two
    /// rules with different actions can match the same call (libseccomp would silently pick
    /// one of them, and the profile would no longer say what is enforced).
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.default_action().map_err(|m| {
            let key = self.default_key();
            PolicyError::key(key, m)
        })?;
        self.bad_arch_action()
            .map_err(|m| PolicyError::key("bad_arch_action", m))?;
        self.arches()
            .map_err(|m| PolicyError::key("architectures", m))?;
        if self.rules.len() > MAX_RULES {
            return Err(PolicyError::key(
                "rule",
                format!(
                    "{} rules; at most {MAX_RULES} are allowed",
                    self.rules.len()
                ),
            ));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            let at = |message: String| PolicyError::at_key(i, "args", message);
            // A bad or misplaced errno is on the errno line; a missing one, on the action's.
            let action_key = if rule.errno.is_some() {
                "errno"
            } else {
                "action"
            };
            rule.action()
                .map_err(|m| PolicyError::at_key(i, action_key, m))?;
            if rule.syscalls.is_empty() {
                return Err(PolicyError::at_key(
                    i,
                    "syscalls",
                    "no syscalls listed".into(),
                ));
            }
            let mut seen = [false; 6];
            for cond in &rule.args {
                check_condition(cond).map_err(at)?;
                let slot = &mut seen[usize::from(cond.index.min(5))];
                if std::mem::replace(slot, true) {
                    return Err(at(format!(
                        "two conditions on argument {}: libseccomp takes one condition per argument in a rule (write one rule per alternative)",
                        cond.index
                    )));
                }
            }
            for name in &rule.syscalls {
                resolve_syscall(name).map_err(|e| PolicyError::at(i, Some(name), e))?;
            }
        }
        self.check_overlaps()
    }

    /// Refuses two rules that name the same syscall with different actions when some
    /// argument vector satisfies both.
    fn check_overlaps(&self) -> Result<(), PolicyError> {
        let mut by_name: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, rule) in self.rules.iter().enumerate() {
            for name in &rule.syscalls {
                let list = by_name.entry(name.as_str()).or_default();
                if !list.contains(&i) {
                    list.push(i);
                }
            }
        }
        let mut widths = vec![64];
        if self
            .arches()
            .map_err(PolicyError::whole)?
            .into_iter()
            .filter_map(Abi::from_scmp)
            .any(|a| a.arg_bits() == 32)
        {
            widths.push(32);
        }
        for (name, rules) in &by_name {
            for (x, &i) in rules.iter().enumerate() {
                for &j in &rules[..x] {
                    let (ri, rj) = (&self.rules[i], &self.rules[j]);
                    let (ai, aj) = (
                        ri.action().map_err(|e| PolicyError::at(i, None, e))?,
                        rj.action().map_err(|e| PolicyError::at(j, None, e))?,
                    );
                    if ai == aj {
                        continue;
                    }
                    for &width in &widths {
                        if let Some(args) = overlap(&ri.args, &rj.args, width)
                            .map_err(|e| PolicyError::at(i, None, e))?
                        {
                            let when = if ri.args.is_empty() && rj.args.is_empty() {
                                String::new()
                            } else {
                                format!(" (for example with arguments {})", format_args_list(&args))
                            };
                            return Err(PolicyError {
                                rule: Some(i),
                                other: Some(j),
                                syscall: Some((*name).to_string()),
                                key: None,
                                message: format!(
                                    "contradicts rule {}: {name} would be both {ai} and {aj}{when}",
                                    j + 1
                                ),
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether this policy's filter accepts syscalls of `abi` (others get the bad-arch action).
    pub fn accepts(&self, abi: Abi) -> bool {
        self.arches()
            .map(|list| {
                list.into_iter()
                    .filter_map(Abi::from_scmp)
                    .any(|a| a == abi)
            })
            .unwrap_or(false)
    }

    /// What the profile's rules say about one call: the action and what decides it. This is
    /// the model; the audit commands check it against the compiled filter.
    pub fn decide(&self, abi: Abi, nr: i32, args: &[u64; 6]) -> Result<(Action, Decider), String> {
        if !self.accepts(abi) {
            return Ok((self.bad_arch_action()?, Decider::BadArch));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if !rule.syscalls.iter().any(|n| abi.syscall_nr(n) == Some(nr)) {
                continue;
            }
            let mut all = true;
            for c in &rule.args {
                let value = args.get(usize::from(c.index)).copied().unwrap_or(0);
                if !condition_holds(c, value, abi.arg_bits())? {
                    all = false;
                    break;
                }
            }
            if all {
                return Ok((rule.action()?, Decider::Rule(i)));
            }
        }
        Ok((self.default_action()?, Decider::DefaultAction))
    }

    fn expanded_rules(&self) -> Result<Vec<ExpandedRule>, String> {
        let default = self.default_action()?;
        let mut out = Vec::new();
        for (i, rule) in self.rules.iter().enumerate() {
            let action = rule.action().map_err(|e| format!("rule {}: {e}", i + 1))?;
            if action == default {
                // Same as the default: libseccomp refuses such rules, and they change nothing.
                continue;
            }
            for variant in
                expand_conditions(&rule.args).map_err(|e| format!("rule {}: {e}", i + 1))?
            {
                for name in &rule.syscalls {
                    out.push(ExpandedRule {
                        action,
                        syscall: name.clone(),
                        conditions: variant.iter().map(|c| c.to_scmp()).collect(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Builds the libseccomp filter context for this policy.
    pub fn filter_context(&self) -> Result<ScmpFilterContext, String> {
        self.validate().map_err(|e| e.to_string())?;
        let err = |what: &str, e: libseccomp::error::SeccompError| format!("{what}: {e}");
        let mut ctx = ScmpFilterContext::new(self.default_action()?.to_scmp())
            .map_err(|e| err("create filter", e))?;
        ctx.set_act_badarch(self.bad_arch_action()?.to_scmp())
            .map_err(|e| err("bad arch action", e))?;
        // The sandbox sets no_new_privs itself, before Landlock; libseccomp must not.
        ctx.set_ctl_nnp(false).map_err(|e| err("nnp", e))?;
        let rules = self.expanded_rules()?;
        // Syscalls in a binary tree rather than one list: a syscall the filter checks runs a
        // few comparisons instead of one per listed syscall, and loading the filter costs
        // the kernel less (it runs the filter once per syscall number and architecture to
        // find those with a fixed verdict, with interrupts off; with the list that was
        // most of the 0.27 ms two filters took to load). Not for a handful of rules, where
        // a list is as short, and where libseccomp before 2.5.4 could drop the default
        // action from a tree (its bug #370; runc draws the same line).
        if rules.len() >= TREE_FROM_RULES {
            ctx.set_ctl_optimize(2).map_err(|e| err("optimize", e))?;
        }
        for arch in self.arches()?.into_iter().skip(1) {
            ctx.add_arch(arch).map_err(|e| err("add arch", e))?;
        }
        for rule in rules {
            let sc = resolve_syscall(&rule.syscall)?;
            let res = if rule.conditions.is_empty() {
                ctx.add_rule(rule.action.to_scmp(), sc)
            } else {
                ctx.add_rule_conditional(rule.action.to_scmp(), sc, &rule.conditions)
            };
            res.map_err(|e| format!("syscall {}: {e}", rule.syscall))?;
        }
        Ok(ctx)
    }

    /// Compiles the policy into the BPF program for this machine.
    pub fn compile(&self) -> Result<SeccompProgram, String> {
        let ctx = self.filter_context()?;
        let mut memfd = memfd("hatchery-bpf")?;
        ctx.export_bpf(&memfd).map_err(|e| format!("export: {e}"))?;
        let mut bytes = Vec::new();
        memfd
            .rewind()
            .and_then(|_| memfd.read_to_end(&mut bytes))
            .map_err(|e| format!("read back the compiled filter: {e}"))?;
        SeccompProgram::from_bytes(bytes)
    }

    /// libseccomp's pseudo-filter-code (PFC) listing of the compiled filter.
    pub fn pfc(&self) -> Result<String, String> {
        let ctx = self.filter_context()?;
        let mut memfd = memfd("hatchery-pfc")?;
        ctx.export_pfc(&memfd).map_err(|e| format!("export: {e}"))?;
        let mut text = String::new();
        memfd
            .rewind()
            .and_then(|_| memfd.read_to_string(&mut text))
            .map_err(|e| format!("read back the PFC listing: {e}"))?;
        Ok(text)
    }
}

/// Fewest rules for which a filter is compiled as a binary tree (see `filter_context`).
const TREE_FROM_RULES: usize = 8;

fn memfd(name: &str) -> Result<std::fs::File, String> {
    nix::sys::memfd::memfd_create(name, nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map(std::fs::File::from)
        .map_err(|e| format!("memfd_create: {e}"))
}

/// Resolves a syscall name with libseccomp; names unknown on every architecture are errors.
pub fn resolve_syscall(name: &str) -> Result<ScmpSyscall, String> {
    if name.is_empty()
        || name.len() > 64
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(format!("invalid syscall name {name:?}"));
    }
    ScmpSyscall::from_name(name).map_err(|_| format!("unknown syscall {name:?}"))
}

fn check_condition(c: &ArgCondition) -> Result<(), String> {
    if c.index > 5 {
        return Err(format!("argument index {} out of range (0..5)", c.index));
    }
    match c.op {
        CompareOp::MaskedEq => {
            let mask = c.mask.as_ref().ok_or("masked_eq needs a mask")?.resolve()?;
            let value = c
                .value
                .as_ref()
                .ok_or("masked_eq needs a value")?
                .resolve()?;
            if value & !mask != 0 {
                return Err(format!(
                    "masked_eq value {value:#x} has bits outside mask {mask:#x}; it can never match"
                ));
            }
        }
        CompareOp::AnyBits => {
            if c.value.is_some() {
                return Err("any_bits takes a mask, not a value".into());
            }
            let mask = c.mask.as_ref().ok_or("any_bits needs a mask")?.resolve()?;
            if mask == 0 {
                return Err("any_bits mask is zero; it can never match".into());
            }
        }
        _ => {
            if c.mask.is_some() {
                return Err(format!("{:?} takes a value, not a mask", c.op));
            }
            c.value
                .as_ref()
                .ok_or("condition needs a value")?
                .resolve()?;
        }
    }
    Ok(())
}

/// One comparison of a rule with its numbers resolved: `(arg[index] & mask) op value`,
/// where `mask` is all ones except for [`CompareOp::MaskedEq`]. Never `AnyBits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Comparison {
    pub index: u32,
    pub op: CompareOp,
    pub value: u64,
    pub mask: u64,
}

impl Comparison {
    fn to_scmp(self) -> ScmpArgCompare {
        let op = match self.op {
            CompareOp::Eq => ScmpCompareOp::Equal,
            CompareOp::Ne => ScmpCompareOp::NotEqual,
            CompareOp::Lt => ScmpCompareOp::Less,
            CompareOp::Le => ScmpCompareOp::LessOrEqual,
            CompareOp::Gt => ScmpCompareOp::Greater,
            CompareOp::Ge => ScmpCompareOp::GreaterEqual,
            CompareOp::MaskedEq | CompareOp::AnyBits => ScmpCompareOp::MaskedEqual(self.mask),
        };
        ScmpArgCompare::new(self.index, op, self.value)
    }
}

/// Most alternatives one rule may expand into (`any_bits` conditions multiply).
pub const MAX_ALTERNATIVES: usize = 4096;

/// The alternatives a rule's conditions stand for, each a list of comparisons that must
/// all hold: every `any_bits` condition fans out into one alternative per bit of its mask
/// (a masked comparison on that bit) — several of them into every combination of their
/// bits —, everything else is kept as it is. Shared by the libseccomp compilation and the
/// OCI export, so both say the same thing.
pub fn expand_conditions(conds: &[ArgCondition]) -> Result<Vec<Vec<Comparison>>, String> {
    let resolve = |v: &Option<ValueSpec>| {
        v.as_ref()
            .map(ValueSpec::resolve)
            .transpose()
            .map(|v| v.unwrap_or(0))
    };
    let mut base = Vec::new();
    let mut fans: Vec<(u32, u64)> = Vec::new();
    for c in conds {
        let index = u32::from(c.index);
        let (value, mask) = (resolve(&c.value)?, resolve(&c.mask)?);
        match c.op {
            CompareOp::AnyBits => fans.push((index, mask)),
            CompareOp::MaskedEq => base.push(Comparison {
                index,
                op: c.op,
                value,
                mask,
            }),
            op => base.push(Comparison {
                index,
                op,
                value,
                mask: u64::MAX,
            }),
        }
    }
    let mut out = vec![base];
    for (index, mask) in fans {
        let bits: Vec<u64> = (0..64)
            .map(|b| 1u64 << b)
            .filter(|bit| mask & bit != 0)
            .collect();
        if out.len().saturating_mul(bits.len()) > MAX_ALTERNATIVES {
            return Err(format!(
                "the any_bits conditions expand into more than {MAX_ALTERNATIVES} alternatives"
            ));
        }
        out = out
            .into_iter()
            .flat_map(|alternative| {
                bits.iter().map(move |&bit| {
                    let mut v = alternative.clone();
                    v.push(Comparison {
                        index,
                        op: CompareOp::MaskedEq,
                        value: bit,
                        mask: bit,
                    });
                    v
                })
            })
            .collect();
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
