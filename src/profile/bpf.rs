//! A classic-BPF interpreter for seccomp filters, in the kernel's own terms.
//!
//! `profile check`, `lint` and `diff` must say exactly what the kernel will do, so they do
//! not reason about the profile's rules: they run the very program the sandbox loads on a
//! synthetic `struct seccomp_data`, with the kernel's rules for which instructions a
//! seccomp filter may use and how its return value is read.

use super::program::{BpfInstruction, SeccompProgram};

/// `AUDIT_ARCH_X86_64`: the `arch` field for native x86_64 and x32 syscalls.
pub const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
/// `AUDIT_ARCH_I386`: the `arch` field for syscalls entering through `int 0x80`.
pub const AUDIT_ARCH_I386: u32 = 0x4000_0003;
/// `AUDIT_ARCH_AARCH64`.
pub const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;
/// x32 syscalls are x86_64 syscalls with this bit set in the number.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Size of `struct seccomp_data`: nr, arch, instruction_pointer, args[6].
pub const SECCOMP_DATA_LEN: u32 = 64;

const RET_ACTION_FULL: u32 = 0xffff_0000;
const RET_DATA: u32 = 0x0000_ffff;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_KILL_THREAD: u32 = 0x0000_0000;
const RET_TRAP: u32 = 0x0003_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
const RET_TRACE: u32 = 0x7ff0_0000;
const RET_LOG: u32 = 0x7ffc_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
/// The kernel clamps errno data to this.
const MAX_ERRNO: u32 = 4095;

/// What the kernel sees when a syscall enters the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeccompData {
    pub nr: i32,
    pub arch: u32,
    pub instruction_pointer: u64,
    pub args: [u64; 6],
}

impl SeccompData {
    /// The 32-bit word at byte offset `k`, as `BPF_LD|BPF_W|BPF_ABS` reads it (native
    /// byte order: on little-endian machines the low half of an argument comes first).
    pub fn word(&self, k: u32) -> Option<u32> {
        let half = |v: u64, upper: bool| {
            let (lo, hi) = (v as u32, (v >> 32) as u32);
            match (upper, cfg!(target_endian = "little")) {
                (false, true) | (true, false) => lo,
                _ => hi,
            }
        };
        Some(match k {
            0 => self.nr as u32,
            4 => self.arch,
            8 | 12 => half(self.instruction_pointer, k == 12),
            16..=60 if k % 4 == 0 => {
                let i = ((k - 16) / 8) as usize;
                half(self.args[i], (k - 16) % 8 == 4)
            }
            _ => return None,
        })
    }
}

/// The action the kernel takes for a filter's return value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KernelAction {
    KillProcess,
    KillThread,
    Trap(u16),
    Errno(u16),
    UserNotif,
    Trace(u16),
    Log,
    Allow,
}

impl KernelAction {
    /// Reads a filter's return value the way the kernel does (unknown actions kill the
    /// process; errno data is clamped to MAX_ERRNO).
    pub fn from_ret(ret: u32) -> KernelAction {
        let data = (ret & RET_DATA) as u16;
        match ret & RET_ACTION_FULL {
            RET_KILL_PROCESS => KernelAction::KillProcess,
            RET_KILL_THREAD => KernelAction::KillThread,
            RET_TRAP => KernelAction::Trap(data),
            RET_ERRNO => KernelAction::Errno(u32::from(data).min(MAX_ERRNO) as u16),
            RET_USER_NOTIF => KernelAction::UserNotif,
            RET_TRACE => KernelAction::Trace(data),
            RET_LOG => KernelAction::Log,
            RET_ALLOW => KernelAction::Allow,
            _ => KernelAction::KillProcess,
        }
    }

    /// Whether the syscall runs (possibly logged).
    pub fn runs(self) -> bool {
        matches!(self, KernelAction::Allow | KernelAction::Log)
    }

    /// The action word used in reports: allow, errno, kill, log, trap (and trace, notify).
    pub fn kind(self) -> &'static str {
        match self {
            KernelAction::KillProcess | KernelAction::KillThread => "kill",
            KernelAction::Trap(_) => "trap",
            KernelAction::Errno(_) => "errno",
            KernelAction::UserNotif => "notify",
            KernelAction::Trace(_) => "trace",
            KernelAction::Log => "log",
            KernelAction::Allow => "allow",
        }
    }

    /// Where the action stands when several filters answer one syscall: the kernel takes
    /// the lowest of these (its `ACTION_ONLY` value read as a signed number), so kill
    /// beats trap beats errno beats notify, trace, log and allow.
    pub fn precedence(self) -> i32 {
        let action = match self {
            KernelAction::KillProcess => RET_KILL_PROCESS,
            KernelAction::KillThread => RET_KILL_THREAD,
            KernelAction::Trap(_) => RET_TRAP,
            KernelAction::Errno(_) => RET_ERRNO,
            KernelAction::UserNotif => RET_USER_NOTIF,
            KernelAction::Trace(_) => RET_TRACE,
            KernelAction::Log => RET_LOG,
            KernelAction::Allow => RET_ALLOW,
        };
        action as i32
    }

    pub fn errno(self) -> Option<i32> {
        match self {
            KernelAction::Errno(e) => Some(i32::from(e)),
            _ => None,
        }
    }
}

impl std::fmt::Display for KernelAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelAction::Errno(e) => match super::names::errno_name(i32::from(*e)) {
                Some(n) => write!(f, "errno {n} ({e})"),
                None => write!(f, "errno {e}"),
            },
            KernelAction::KillProcess => f.write_str("kill (process)"),
            KernelAction::KillThread => f.write_str("kill (thread)"),
            other => f.write_str(other.kind()),
        }
    }
}

/// Why a program cannot be run: the kernel would have refused to load it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BpfError {
    #[error("instruction {pc}: jump out of the program")]
    JumpOutOfRange { pc: usize },
    #[error("instruction {pc}: load from offset {k} outside struct seccomp_data")]
    BadLoad { pc: usize, k: u32 },
    #[error("instruction {pc}: scratch memory index {k} out of range")]
    BadMemory { pc: usize, k: u32 },
    #[error("instruction {pc}: division by zero")]
    DivisionByZero { pc: usize },
    #[error("instruction {pc}: opcode {code:#06x} is not allowed in a seccomp filter")]
    BadOpcode { pc: usize, code: u16 },
    #[error("the program ends without returning")]
    FellOffTheEnd,
}

// Instruction classes and fields of classic BPF (linux/bpf_common.h).
pub(crate) const BPF_LD: u16 = 0x00;
pub(crate) const BPF_LDX: u16 = 0x01;
pub(crate) const BPF_ST: u16 = 0x02;
pub(crate) const BPF_STX: u16 = 0x03;
pub(crate) const BPF_ALU: u16 = 0x04;
pub(crate) const BPF_JMP: u16 = 0x05;
pub(crate) const BPF_RET: u16 = 0x06;
pub(crate) const BPF_W: u16 = 0x00;
pub(crate) const BPF_IMM: u16 = 0x00;
pub(crate) const BPF_ABS: u16 = 0x20;
pub(crate) const BPF_MEM: u16 = 0x60;
pub(crate) const BPF_LEN: u16 = 0x80;
pub(crate) const BPF_K: u16 = 0x00;
pub(crate) const BPF_X: u16 = 0x08;
pub(crate) const BPF_A: u16 = 0x10;
pub(crate) const BPF_JA: u16 = 0x00;
pub(crate) const BPF_JEQ: u16 = 0x10;
pub(crate) const BPF_JGT: u16 = 0x20;
pub(crate) const BPF_JGE: u16 = 0x30;
pub(crate) const BPF_JSET: u16 = 0x40;
pub(crate) const BPF_TAX: u16 = 0x00;
pub(crate) const BPF_TXA: u16 = 0x80;

/// ALU operations, by their opcode bits.
pub(crate) fn alu(op: u16, a: u32, b: u32, pc: usize) -> Result<u32, BpfError> {
    Ok(match op {
        0x00 => a.wrapping_add(b),
        0x10 => a.wrapping_sub(b),
        0x20 => a.wrapping_mul(b),
        0x30 => a.checked_div(b).ok_or(BpfError::DivisionByZero { pc })?,
        0x40 => a | b,
        0x50 => a & b,
        0x60 => a.checked_shl(b).unwrap_or(0),
        0x70 => a.checked_shr(b).unwrap_or(0),
        0x80 => a.wrapping_neg(),
        0x90 => a.checked_rem(b).ok_or(BpfError::DivisionByZero { pc })?,
        0xa0 => a ^ b,
        _ => {
            return Err(BpfError::BadOpcode {
                pc,
                code: BPF_ALU | op,
            });
        }
    })
}

/// The target of a jump, checked to stay inside the program (jumps only go forward).
pub(crate) fn jump_target(pc: usize, offset: u32, len: usize) -> Result<usize, BpfError> {
    let target = pc
        .checked_add(1)
        .and_then(|p| p.checked_add(offset as usize))
        .ok_or(BpfError::JumpOutOfRange { pc })?;
    if target >= len {
        return Err(BpfError::JumpOutOfRange { pc });
    }
    Ok(target)
}

/// Whether a conditional jump with operand `b` is taken for accumulator `a`.
pub(crate) fn jump_taken(op: u16, a: u32, b: u32) -> Option<bool> {
    Some(match op {
        BPF_JEQ => a == b,
        BPF_JGT => a > b,
        BPF_JGE => a >= b,
        BPF_JSET => a & b != 0,
        _ => return None,
    })
}

/// Runs the filter on `data` and returns its raw return value.
pub fn run(program: &SeccompProgram, data: &SeccompData) -> Result<u32, BpfError> {
    let insns: Vec<BpfInstruction> = program.instructions().collect();
    let (mut a, mut x) = (0u32, 0u32);
    let mut mem = [0u32; 16];
    let mut pc = 0usize;
    while let Some(i) = insns.get(pc) {
        let code = i.code;
        let bad = BpfError::BadOpcode { pc, code };
        match code & 0x07 {
            BPF_LD => {
                a = match code & !0x07 {
                    c if c == BPF_W | BPF_ABS => {
                        data.word(i.k).ok_or(BpfError::BadLoad { pc, k: i.k })?
                    }
                    c if c == BPF_W | BPF_LEN => SECCOMP_DATA_LEN,
                    c if c == BPF_IMM => i.k,
                    c if c == BPF_MEM => *mem
                        .get(i.k as usize)
                        .ok_or(BpfError::BadMemory { pc, k: i.k })?,
                    _ => return Err(bad),
                }
            }
            BPF_LDX => {
                x = match code & !0x07 {
                    c if c == BPF_W | BPF_LEN => SECCOMP_DATA_LEN,
                    c if c == BPF_IMM => i.k,
                    c if c == BPF_MEM => *mem
                        .get(i.k as usize)
                        .ok_or(BpfError::BadMemory { pc, k: i.k })?,
                    _ => return Err(bad),
                }
            }
            BPF_ST | BPF_STX => {
                if code & !0x07 != 0 {
                    return Err(bad);
                }
                let slot = mem
                    .get_mut(i.k as usize)
                    .ok_or(BpfError::BadMemory { pc, k: i.k })?;
                *slot = if code & 0x07 == BPF_ST { a } else { x };
            }
            BPF_ALU => {
                let b = if code & BPF_X != 0 { x } else { i.k };
                a = alu(code & 0xf0, a, b, pc)?;
            }
            BPF_JMP => {
                let op = code & 0xf0;
                if op == BPF_JA {
                    if code & BPF_X != 0 {
                        return Err(bad);
                    }
                    pc = jump_target(pc, i.k, insns.len())?;
                    continue;
                }
                let b = if code & BPF_X != 0 { x } else { i.k };
                let taken = jump_taken(op, a, b).ok_or(bad)?;
                let off = if taken { i.jt } else { i.jf };
                pc = jump_target(pc, u32::from(off), insns.len())?;
                continue;
            }
            BPF_RET => {
                return match code & 0x18 {
                    BPF_K => Ok(i.k),
                    BPF_A => Ok(a),
                    _ => Err(bad),
                };
            }
            _ => {
                // BPF_MISC
                match code & 0xf8 {
                    BPF_TAX => x = a,
                    BPF_TXA => a = x,
                    _ => return Err(bad),
                }
            }
        }
        pc += 1;
    }
    Err(BpfError::FellOffTheEnd)
}

/// What the kernel does when several filters are loaded, given each one's verdict in the
/// order they were loaded: it runs them from the last loaded to the first and keeps a
/// verdict only when a later one is strictly more restrictive, so on a tie the filter
/// loaded last decides (its errno, say). Returns that filter's index and its verdict;
/// `None` for no filters.
pub fn stacked(in_load_order: &[KernelAction]) -> Option<(usize, KernelAction)> {
    let mut best: Option<(usize, KernelAction)> = None;
    for (i, action) in in_load_order.iter().enumerate().rev() {
        match best {
            Some((_, b)) if action.precedence() >= b.precedence() => {}
            _ => best = Some((i, *action)),
        }
    }
    best
}

/// Runs the filter and reads the result as the kernel does.
pub fn evaluate(program: &SeccompProgram, data: &SeccompData) -> Result<KernelAction, BpfError> {
    run(program, data).map(KernelAction::from_ret)
}

/// Names of the `seccomp_data` fields a load can read, for listings.
fn field_name(k: u32) -> String {
    let little = cfg!(target_endian = "little");
    match k {
        0 => "nr".into(),
        4 => "arch".into(),
        8 | 12 => format!("ip.{}", if (k == 12) == little { "hi" } else { "lo" }),
        16..=60 if k % 4 == 0 => {
            let upper = (k - 16) % 8 == 4;
            format!(
                "arg{}.{}",
                (k - 16) / 8,
                if upper == little { "hi" } else { "lo" }
            )
        }
        _ => format!("{k}"),
    }
}

fn describe_ret(k: u32) -> String {
    match KernelAction::from_ret(k) {
        KernelAction::Errno(e) => format!("ERRNO({e})"),
        KernelAction::Trap(d) => format!("TRAP({d})"),
        KernelAction::Trace(d) => format!("TRACE({d})"),
        KernelAction::KillProcess => "KILL_PROCESS".into(),
        KernelAction::KillThread => "KILL_THREAD".into(),
        KernelAction::UserNotif => "USER_NOTIF".into(),
        KernelAction::Log => "LOG".into(),
        KernelAction::Allow => "ALLOW".into(),
    }
}

/// A listing of the program: each instruction's exact fields, then its meaning.
pub fn disassemble(program: &SeccompProgram) -> String {
    let mut out = String::new();
    out.push_str(" line  code  jt   jf      k\n");
    for (pc, i) in program.instructions().enumerate() {
        let (code, jt, jf, k) = (i.code, i.jt, i.jf, i.k);
        let target = |off: u32| pc + 1 + off as usize;
        let src = |c: u16| {
            if c & BPF_X != 0 {
                "x".to_string()
            } else {
                format!("{k:#x}")
            }
        };
        let text = match code & 0x07 {
            BPF_LD => match code & !0x07 {
                c if c == BPF_W | BPF_ABS => format!("ld  [{}]", field_name(k)),
                c if c == BPF_W | BPF_LEN => "ld  #len".to_string(),
                c if c == BPF_IMM => format!("ld  #{k:#x}"),
                c if c == BPF_MEM => format!("ld  M[{k}]"),
                _ => "(invalid)".to_string(),
            },
            BPF_LDX => match code & !0x07 {
                c if c == BPF_W | BPF_LEN => "ldx #len".to_string(),
                c if c == BPF_IMM => format!("ldx #{k:#x}"),
                c if c == BPF_MEM => format!("ldx M[{k}]"),
                _ => "(invalid)".to_string(),
            },
            BPF_ST => format!("st  M[{k}]"),
            BPF_STX => format!("stx M[{k}]"),
            BPF_ALU => {
                let name = match code & 0xf0 {
                    0x00 => "add",
                    0x10 => "sub",
                    0x20 => "mul",
                    0x30 => "div",
                    0x40 => "or",
                    0x50 => "and",
                    0x60 => "lsh",
                    0x70 => "rsh",
                    0x80 => "neg",
                    0x90 => "mod",
                    0xa0 => "xor",
                    _ => "(invalid)",
                };
                if code & 0xf0 == 0x80 {
                    name.to_string()
                } else {
                    format!("{name} {}", src(code))
                }
            }
            BPF_JMP => {
                let name = match code & 0xf0 {
                    BPF_JA => {
                        return_line(&mut out, pc, i, &format!("ja  {}", target(k)));
                        continue;
                    }
                    BPF_JEQ => "jeq",
                    BPF_JGT => "jgt",
                    BPF_JGE => "jge",
                    BPF_JSET => "jset",
                    _ => "(invalid)",
                };
                format!(
                    "{name} {} ? {} : {}",
                    src(code),
                    target(u32::from(jt)),
                    target(u32::from(jf))
                )
            }
            BPF_RET => match code & 0x18 {
                BPF_K => format!("ret {}", describe_ret(k)),
                BPF_A => "ret a".to_string(),
                _ => "(invalid)".to_string(),
            },
            _ => match code & 0xf8 {
                BPF_TAX => "tax".to_string(),
                BPF_TXA => "txa".to_string(),
                _ => "(invalid)".to_string(),
            },
        };
        return_line(&mut out, pc, i, &text);
    }
    out
}

fn return_line(out: &mut String, pc: usize, i: BpfInstruction, text: &str) {
    out.push_str(&format!(
        "{pc:5}  {:#06x} {:3} {:3} {:#010x}  {text}\n",
        i.code, i.jt, i.jf, i.k
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(insns: &[(u16, u8, u8, u32)]) -> Result<SeccompProgram, String> {
        let mut bytes = Vec::new();
        for (code, jt, jf, k) in insns {
            bytes.extend_from_slice(&code.to_ne_bytes());
            bytes.push(*jt);
            bytes.push(*jf);
            bytes.extend_from_slice(&k.to_ne_bytes());
        }
        SeccompProgram::from_bytes(bytes)
    }

    const LD_ABS: u16 = BPF_LD | BPF_W | BPF_ABS;
    const JEQ_K: u16 = BPF_JMP | BPF_JEQ | BPF_K;
    const RET_K: u16 = BPF_RET | BPF_K;

    #[test]
    fn a_hand_written_filter_decides_by_arch_and_number() -> Result<(), String> {
        // if arch != x86_64 kill; if nr == 39 (getpid) errno 1; else allow
        let p = program(&[
            (LD_ABS, 0, 0, 4),
            (JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
            (RET_K, 0, 0, RET_KILL_PROCESS),
            (LD_ABS, 0, 0, 0),
            (JEQ_K, 0, 1, 39),
            (RET_K, 0, 0, RET_ERRNO | 1),
            (RET_K, 0, 0, RET_ALLOW),
        ])?;
        let mut d = SeccompData {
            nr: 39,
            arch: AUDIT_ARCH_X86_64,
            ..SeccompData::default()
        };
        assert_eq!(evaluate(&p, &d), Ok(KernelAction::Errno(1)));
        d.nr = 40;
        assert_eq!(evaluate(&p, &d), Ok(KernelAction::Allow));
        d.arch = AUDIT_ARCH_I386;
        assert_eq!(evaluate(&p, &d), Ok(KernelAction::KillProcess));
        Ok(())
    }

    #[test]
    fn argument_words_follow_native_byte_order() {
        let d = SeccompData {
            args: [0x1111_2222_3333_4444, 0, 0, 0, 0, 0x5555_6666_7777_8888],
            ..SeccompData::default()
        };
        if cfg!(target_endian = "little") {
            assert_eq!(d.word(16), Some(0x3333_4444));
            assert_eq!(d.word(20), Some(0x1111_2222));
            assert_eq!(d.word(56), Some(0x7777_8888));
            assert_eq!(d.word(60), Some(0x5555_6666));
        }
        assert_eq!(d.word(64), None);
        assert_eq!(d.word(17), None);
    }

    #[test]
    fn alu_jset_scratch_memory_and_ret_a_work() -> Result<(), String> {
        // A = arg0.lo & 0xf0; M[3] = A; X = 7; A = X; A += M[3] via ldx/txa; ret A
        let p = program(&[
            (LD_ABS, 0, 0, 16),
            (BPF_ALU | 0x50 | BPF_K, 0, 0, 0xf0),
            (BPF_ST, 0, 0, 3),
            (BPF_JMP | BPF_JSET | BPF_K, 0, 2, 0x10),
            (BPF_LD | BPF_MEM, 0, 0, 3),
            (BPF_RET | BPF_A, 0, 0, 0),
            (RET_K, 0, 0, RET_ALLOW),
        ])?;
        let d = SeccompData {
            args: [0x1234, 0, 0, 0, 0, 0],
            ..SeccompData::default()
        };
        // 0x1234 & 0xf0 = 0x30, bit 0x10 set -> ret 0x30 (KILL_THREAD action, data 0x30)
        assert_eq!(run(&p, &d), Ok(0x30));
        let d = SeccompData {
            args: [0x1204, 0, 0, 0, 0, 0],
            ..SeccompData::default()
        };
        assert_eq!(run(&p, &d), Ok(RET_ALLOW));
        Ok(())
    }

    #[test]
    fn programs_the_kernel_would_refuse_are_errors() -> Result<(), String> {
        let d = SeccompData::default();
        let p = program(&[(LD_ABS, 0, 0, 64), (RET_K, 0, 0, RET_ALLOW)])?;
        assert!(matches!(run(&p, &d), Err(BpfError::BadLoad { .. })));
        let p = program(&[(BPF_JMP | BPF_JA, 0, 0, 5), (RET_K, 0, 0, RET_ALLOW)])?;
        assert!(matches!(run(&p, &d), Err(BpfError::JumpOutOfRange { .. })));
        let p = program(&[(BPF_LD | BPF_IMM, 0, 0, 1)])?;
        assert_eq!(run(&p, &d), Err(BpfError::FellOffTheEnd));
        let p = program(&[(BPF_ALU | 0x30 | BPF_X, 0, 0, 0), (RET_K, 0, 0, 0)])?;
        assert!(matches!(run(&p, &d), Err(BpfError::DivisionByZero { .. })));
        Ok(())
    }

    #[test]
    fn stacked_filters_give_the_most_restrictive_verdict_and_the_last_loaded_wins_ties() {
        use KernelAction::*;
        assert_eq!(stacked(&[]), None);
        assert_eq!(stacked(&[Errno(1), Allow]), Some((0, Errno(1))));
        assert_eq!(stacked(&[Allow, Errno(1)]), Some((1, Errno(1))));
        // A tie: the filter loaded last (the profile's, after the floor) keeps its errno.
        assert_eq!(stacked(&[Errno(38), Errno(1)]), Some((1, Errno(1))));
        assert_eq!(stacked(&[Allow, Allow]), Some((1, Allow)));
        assert_eq!(stacked(&[Errno(1), KillProcess]), Some((1, KillProcess)));
        assert_eq!(stacked(&[KillProcess, Trap(0)]), Some((0, KillProcess)));
        assert_eq!(stacked(&[Trap(0), Errno(1)]), Some((0, Trap(0))));
        assert_eq!(stacked(&[Log, Allow]), Some((0, Log)));
        assert_eq!(stacked(&[KillThread, Trap(0)]), Some((0, KillThread)));
    }

    #[test]
    fn return_values_are_read_as_the_kernel_reads_them() {
        assert_eq!(
            KernelAction::from_ret(RET_ERRNO | 38),
            KernelAction::Errno(38)
        );
        assert_eq!(
            KernelAction::from_ret(RET_ERRNO | 0xffff),
            KernelAction::Errno(4095)
        );
        assert_eq!(
            KernelAction::from_ret(0x1234_0000),
            KernelAction::KillProcess
        );
        assert_eq!(KernelAction::from_ret(RET_LOG), KernelAction::Log);
        assert!(KernelAction::Log.runs());
        assert!(!KernelAction::Trap(0).runs());
    }
}
