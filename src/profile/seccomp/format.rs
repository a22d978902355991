//! The seccomp section of a profile as written: actions, errno values, argument
//! conditions, rules and the policy that holds them (what TOML and JSON read and write).

use serde::{Deserialize, Serialize};

use super::*;

/// What the filter does with a syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Action {
    Allow,
    Errno(i32),
    /// Kill the whole process (SECCOMP_RET_KILL_PROCESS).
    Kill,
    /// Allow, and log to the audit log.
    Log,
    /// Deliver SIGSYS to the thread.
    Trap,
}

impl Action {
    pub fn kind(&self) -> ActionKind {
        match self {
            Action::Allow => ActionKind::Allow,
            Action::Errno(_) => ActionKind::Errno,
            Action::Kill => ActionKind::Kill,
            Action::Log => ActionKind::Log,
            Action::Trap => ActionKind::Trap,
        }
    }

    /// The kernel action this compiles to.
    pub fn kernel(self) -> KernelAction {
        match self {
            Action::Allow => KernelAction::Allow,
            Action::Errno(e) => KernelAction::Errno(e.clamp(0, 4095) as u16),
            Action::Kill => KernelAction::KillProcess,
            Action::Log => KernelAction::Log,
            Action::Trap => KernelAction::Trap(0),
        }
    }

    pub(super) fn to_scmp(self) -> ScmpAction {
        match self {
            Action::Allow => ScmpAction::Allow,
            Action::Errno(e) => ScmpAction::Errno(e),
            Action::Kill => ScmpAction::KillProcess,
            Action::Log => ScmpAction::Log,
            Action::Trap => ScmpAction::Trap,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Errno(e) => match names::errno_name(*e) {
                Some(n) => write!(f, "errno {n} ({e})"),
                None => write!(f, "errno {e}"),
            },
            other => f.write_str(other.kind().as_str()),
        }
    }
}

/// The action names used in profile files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionKind {
    Allow,
    Errno,
    Kill,
    Log,
    Trap,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Allow => "allow",
            ActionKind::Errno => "errno",
            ActionKind::Kill => "kill",
            ActionKind::Log => "log",
            ActionKind::Trap => "trap",
        }
    }
}

/// An errno given by name (`"EPERM"`) or number (`1`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ErrnoValue {
    Number(i32),
    Name(String),
}

impl ErrnoValue {
    pub(super) fn resolve(&self) -> Result<i32, String> {
        match self {
            ErrnoValue::Number(n) if (1..=4094).contains(n) => Ok(*n),
            ErrnoValue::Number(n) => Err(format!("errno {n} is out of range (1..4094: libseccomp refuses 4095)")),
            ErrnoValue::Name(s) => names::errno_by_name(s).ok_or_else(|| {
                match names::errno_like(s) {
                    Some(like) => format!("unknown errno name {s:?} (did you mean {like:?}?)"),
                    None => format!(
                        "unknown errno name {s:?} (use a name such as \"EPERM\" or \"ENOSYS\", or a number)"
                    ),
                }
            }),
        }
    }
}

/// A number or a constant expression such as `"CLONE_NEWUSER|CLONE_NEWNS"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ValueSpec {
    Number(u64),
    Expr(String),
}

impl ValueSpec {
    pub fn resolve(&self) -> Result<u64, String> {
        match self {
            ValueSpec::Number(n) => Ok(*n),
            ValueSpec::Expr(s) => names::parse_value_expr(s),
        }
    }
}

/// Comparison of one syscall argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `(arg & mask) == value`
    MaskedEq,
    /// `(arg & mask) != 0`: any of the mask's bits set. Compiled as one rule per bit.
    AnyBits,
}

/// A condition on one argument; all conditions of a rule must hold for it to apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgCondition {
    /// Argument index, 0 to 5.
    pub index: u8,
    pub op: CompareOp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<ValueSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<ValueSpec>,
}

/// One rule: an action for some syscalls, optionally only when argument conditions hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallRule {
    pub action: ActionKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<ErrnoValue>,
    pub syscalls: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<ArgCondition>,
    /// Why the rule exists; shown by `profile check`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl SyscallRule {
    /// The resolved action.
    pub fn action(&self) -> Result<Action, String> {
        action_of(self.action, self.errno.as_ref())
    }
}

pub(crate) fn action_of(kind: ActionKind, errno: Option<&ErrnoValue>) -> Result<Action, String> {
    match (kind, errno) {
        (ActionKind::Errno, Some(e)) => Ok(Action::Errno(e.resolve()?)),
        (ActionKind::Errno, None) => {
            Err("action \"errno\" needs an errno (e.g. errno = \"EPERM\")".into())
        }
        (_, Some(_)) => Err(format!(
            "errno is only valid with action \"errno\", not {:?}",
            kind.as_str()
        )),
        (ActionKind::Allow, None) => Ok(Action::Allow),
        (ActionKind::Kill, None) => Ok(Action::Kill),
        (ActionKind::Log, None) => Ok(Action::Log),
        (ActionKind::Trap, None) => Ok(Action::Trap),
    }
}

/// The seccomp section of a profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeccompPolicy {
    /// Action for syscalls no rule matches.
    pub default_action: ActionKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_errno: Option<ErrnoValue>,
    /// ABIs the filter accepts (`native`, `x86_64`, `x86`, `x32`, `aarch64`, ...). Syscalls
    /// entering through any other ABI (the classic i386/x32 bypass) get `bad_arch_action`.
    #[serde(default = "native_only")]
    pub architectures: Vec<String>,
    #[serde(default = "kill")]
    pub bad_arch_action: ActionKind,
    #[serde(default, rename = "rule", skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<SyscallRule>,
}

fn native_only() -> Vec<String> {
    vec!["native".to_string()]
}

fn kill() -> ActionKind {
    ActionKind::Kill
}

/// One rule as a `[[seccomp.rule]]` block, conditions written inline.
pub fn rule_toml(rule: &SyscallRule) -> Result<String, toml::ser::Error> {
    #[derive(Serialize)]
    struct Fields<'a> {
        #[serde(skip_serializing_if = "str::is_empty")]
        reason: &'a str,
        action: ActionKind,
        #[serde(skip_serializing_if = "Option::is_none")]
        errno: &'a Option<ErrnoValue>,
    }
    let mut out = String::from("[[seccomp.rule]]\n");
    out.push_str(&toml::to_string(&Fields {
        reason: &rule.reason,
        action: rule.action,
        errno: &rule.errno,
    })?);
    // Syscall names, wrapped.
    let mut line = String::from("syscalls = [");
    let mut lines = Vec::new();
    for (i, name) in rule.syscalls.iter().enumerate() {
        let item = format!(
            "{}{}",
            toml::Value::String(name.clone()),
            if i + 1 < rule.syscalls.len() {
                ","
            } else {
                "]"
            }
        );
        if line.len() + item.len() + 1 > 92 && !line.ends_with('[') {
            lines.push(line);
            line = " ".repeat(12);
        } else if !line.ends_with('[') {
            line.push(' ');
        }
        line.push_str(&item);
    }
    if rule.syscalls.is_empty() {
        line.push(']');
    }
    lines.push(line);
    out.push_str(&lines.join("\n"));
    out.push('\n');
    if !rule.args.is_empty() {
        let conds: Vec<String> = rule
            .args
            .iter()
            .map(|c| {
                let mut t = toml::Table::new();
                t.insert("index".into(), toml::Value::Integer(i64::from(c.index)));
                let op = match toml::Value::try_from(c.op) {
                    Ok(v) => v,
                    Err(e) => return Err(e),
                };
                t.insert("op".into(), op);
                if let Some(m) = &c.mask {
                    t.insert("mask".into(), toml::Value::try_from(m)?);
                }
                if let Some(v) = &c.value {
                    t.insert("value".into(), toml::Value::try_from(v)?);
                }
                let fields: Vec<String> = ["index", "op", "mask", "value"]
                    .iter()
                    .filter_map(|k| t.get(*k).map(|v| format!("{k} = {v}")))
                    .collect();
                Ok(format!("{{ {} }}", fields.join(", ")))
            })
            .collect::<Result<_, _>>()?;
        out.push_str(&format!("args = [{}]\n", conds.join(", ")));
    }
    Ok(out)
}
