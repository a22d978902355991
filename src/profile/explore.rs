//! Every verdict a compiled filter can reach for one syscall, over all its arguments.
//!
//! The syscall number and architecture are fixed; the twelve 32-bit argument words are
//! unknown. The filter is run with those words symbolic: each conditional jump on an
//! argument splits the run in two, and each side keeps the comparison it took. A side
//! whose comparisons cannot hold together (decided exactly by [`super::solver`]) is
//! dropped. Every end reached is then confirmed by running the real interpreter on a
//! concrete witness built from the comparisons, so a verdict reported here is one the
//! kernel would really give for those arguments.

use std::collections::BTreeSet;

use super::bpf::{self, BpfError, KernelAction, SeccompData};
use super::program::{BpfInstruction, SeccompProgram};
use super::solver::{self, Constraint, Rel, Solution};

/// Most ends one exploration may reach before giving up.
const MAX_LEAVES: usize = 1 << 14;

/// The argument words, as offsets into `struct seccomp_data` (16..64) divided by 4, less 4.
pub const ARG_WORDS: usize = 12;

/// Index of the low (`upper == false`) or high 32 bits of argument `arg` among the words.
pub fn arg_word(arg: usize, upper: bool) -> usize {
    let first_is_low = cfg!(target_endian = "little");
    arg * 2 + usize::from(upper == first_is_low)
}

/// A set of argument vectors: for each argument word, comparisons that must all hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArgSpace {
    words: [Vec<Constraint>; ARG_WORDS],
}

impl ArgSpace {
    /// Every argument vector.
    pub fn any() -> ArgSpace {
        ArgSpace::default()
    }

    /// Restricts one word; returns false (and leaves the space unchanged) if that would
    /// make the space empty or the question undecidable.
    pub fn restrict(&mut self, word: usize, c: Constraint) -> bool {
        let Some(list) = self.words.get_mut(word) else {
            return false;
        };
        list.push(c);
        if matches!(solver::solve(list, 32), Solution::Value(_)) {
            true
        } else {
            list.pop();
            false
        }
    }

    /// The smallest argument vector in the space.
    pub fn witness(&self) -> Option<[u64; 6]> {
        let mut args = [0u64; 6];
        for (w, list) in self.words.iter().enumerate() {
            let Solution::Value(v) = solver::solve(list, 32) else {
                return None;
            };
            let arg = w / 2;
            let upper = arg_word(arg, true) == w;
            args[arg] |= if upper { v << 32 } else { v };
        }
        Some(args)
    }
}

/// One way through the filter: the arguments that take it, the verdict at its end, and
/// the smallest argument vector that does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    pub space: ArgSpace,
    pub ret: u32,
    pub action: KernelAction,
    pub witness: [u64; 6],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExploreError {
    #[error("{0}")]
    Bpf(#[from] BpfError),
    #[error(
        "instruction {pc}: the filter computes on an argument in a way the analysis does not follow"
    )]
    Opaque { pc: usize },
    #[error("the filter has more than {MAX_LEAVES} paths for one syscall")]
    TooManyPaths,
    #[error(
        "a path of the filter could not be confirmed by running it (expected {expected:#x}, got {got:#x})"
    )]
    Unconfirmed { expected: u32, got: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    Const(u32),
    /// `word & mask` of an argument word.
    Sym {
        word: usize,
        mask: u32,
    },
}

#[derive(Clone)]
struct State {
    pc: usize,
    a: Value,
    x: Value,
    mem: [Value; 16],
    space: ArgSpace,
}

/// Every path through `program` for the syscall and architecture in `base` (whose
/// argument fields are ignored), restricted to the arguments in `within`.
///
/// Depth first: one state is followed until its path ends, and the other side of every
/// jump that splits the arguments waits on a stack until then.
pub fn explore(
    program: &SeccompProgram,
    base: &SeccompData,
    within: &ArgSpace,
) -> Result<Vec<Path>, ExploreError> {
    let mut explorer = Explorer {
        program,
        insns: program.instructions().collect(),
        base,
        paths: Vec::new(),
        pending: vec![State {
            pc: 0,
            a: Value::Const(0),
            x: Value::Const(0),
            mem: [Value::Const(0); 16],
            space: within.clone(),
        }],
    };
    while let Some(s) = explorer.pending.pop() {
        explorer.follow(s)?;
    }
    Ok(explorer.paths)
}

/// One exploration under way: the filter, the ends reached, and the states waiting to be
/// followed (the untaken sides of splits).
struct Explorer<'a> {
    program: &'a SeccompProgram,
    insns: Vec<BpfInstruction>,
    base: &'a SeccompData,
    paths: Vec<Path>,
    pending: Vec<State>,
}

/// Where a state goes after one instruction.
enum Flow {
    /// On to the next instruction.
    Next,
    /// A jump set the program counter.
    Jumped,
    /// A return ended the path.
    Ended,
}

impl Explorer<'_> {
    /// Runs one state until its path ends, queueing the other side of every split.
    fn follow(&mut self, mut s: State) -> Result<(), ExploreError> {
        loop {
            let Some(i) = self.insns.get(s.pc).copied() else {
                return Err(BpfError::FellOffTheEnd.into());
            };
            match self.step(&mut s, i)? {
                Flow::Next => s.pc += 1,
                Flow::Jumped => {}
                Flow::Ended => return Ok(()),
            }
        }
    }

    /// Runs one instruction on a state, as the kernel's interpreter would, with the
    /// argument words symbolic.
    fn step(&mut self, s: &mut State, i: BpfInstruction) -> Result<Flow, ExploreError> {
        let pc = s.pc;
        let code = i.code;
        let bad = BpfError::BadOpcode { pc, code };
        match code & 0x07 {
            bpf::BPF_LD | bpf::BPF_LDX => {
                let v = match code & !0x07 {
                    c if c == bpf::BPF_W | bpf::BPF_ABS && code & 0x07 == bpf::BPF_LD => {
                        load(self.base, i.k).ok_or(BpfError::BadLoad { pc, k: i.k })?
                    }
                    c if c == bpf::BPF_W | bpf::BPF_LEN => Value::Const(bpf::SECCOMP_DATA_LEN),
                    c if c == bpf::BPF_IMM => Value::Const(i.k),
                    c if c == bpf::BPF_MEM => s.mem[mem_slot(pc, i.k)?],
                    _ => return Err(bad.into()),
                };
                if code & 0x07 == bpf::BPF_LD {
                    s.a = v;
                } else {
                    s.x = v;
                }
            }
            bpf::BPF_ST | bpf::BPF_STX => {
                if code & !0x07 != 0 {
                    return Err(bad.into());
                }
                let slot = mem_slot(pc, i.k)?;
                s.mem[slot] = if code & 0x07 == bpf::BPF_ST { s.a } else { s.x };
            }
            bpf::BPF_ALU => s.a = alu(s, i, pc)?,
            bpf::BPF_JMP => {
                self.jump(s, i)?;
                return Ok(Flow::Jumped);
            }
            bpf::BPF_RET => {
                self.end(s, i)?;
                return Ok(Flow::Ended);
            }
            _ => match code & 0xf8 {
                bpf::BPF_TAX => s.x = s.a,
                bpf::BPF_TXA => s.a = s.x,
                _ => return Err(bad.into()),
            },
        }
        Ok(Flow::Next)
    }

    /// A jump. On constants it goes one way; on an argument word it splits the state in
    /// two, each side keeping the comparison it took, and drops a side no argument takes.
    fn jump(&mut self, s: &mut State, i: BpfInstruction) -> Result<(), ExploreError> {
        let pc = s.pc;
        let code = i.code;
        let bad = BpfError::BadOpcode { pc, code };
        let len = self.insns.len();
        let op = code & 0xf0;
        if op == bpf::BPF_JA {
            if code & bpf::BPF_X != 0 {
                return Err(bad.into());
            }
            s.pc = bpf::jump_target(pc, i.k, len)?;
            return Ok(());
        }
        let b = if code & bpf::BPF_X != 0 {
            s.x
        } else {
            Value::Const(i.k)
        };
        let t = bpf::jump_target(pc, u32::from(i.jt), len)?;
        let f = bpf::jump_target(pc, u32::from(i.jf), len)?;
        match (s.a, b) {
            (Value::Const(a), Value::Const(b)) => {
                let taken = bpf::jump_taken(op, a, b).ok_or(bad)?;
                s.pc = if taken { t } else { f };
            }
            (Value::Sym { word, mask }, Value::Const(k)) => {
                let taken = match op {
                    bpf::BPF_JEQ => Constraint::new(mask.into(), Rel::Eq, k.into()),
                    bpf::BPF_JGT => Constraint::new(mask.into(), Rel::Gt, k.into()),
                    bpf::BPF_JGE => Constraint::new(mask.into(), Rel::Ge, k.into()),
                    bpf::BPF_JSET => Constraint::new(u64::from(mask & k), Rel::AnySet, 0),
                    _ => return Err(bad.into()),
                };
                let mut other = s.clone();
                let can_take = s.space.restrict(word, taken);
                let can_skip = other.space.restrict(word, taken.negated());
                match (can_take, can_skip) {
                    (true, true) => {
                        other.pc = f;
                        self.pending.push(other);
                        s.pc = t;
                    }
                    (true, false) => s.pc = t,
                    (false, true) => {
                        *s = other;
                        s.pc = f;
                    }
                    // Only when the space itself is empty or undecidable.
                    (false, false) => return Err(ExploreError::Opaque { pc }),
                }
            }
            _ => return Err(ExploreError::Opaque { pc }),
        }
        Ok(())
    }

    /// A return: the end of a path, confirmed by running the real interpreter on the
    /// smallest argument vector that takes it.
    fn end(&mut self, s: &mut State, i: BpfInstruction) -> Result<(), ExploreError> {
        let pc = s.pc;
        let code = i.code;
        let ret = match (code & 0x18, s.a) {
            (bpf::BPF_K, _) => i.k,
            (bpf::BPF_A, Value::Const(a)) => a,
            (bpf::BPF_A, _) => return Err(ExploreError::Opaque { pc }),
            _ => return Err(BpfError::BadOpcode { pc, code }.into()),
        };
        let witness = s.space.witness().ok_or(ExploreError::Opaque { pc })?;
        let data = SeccompData {
            args: witness,
            ..*self.base
        };
        let got = bpf::run(self.program, &data)?;
        if got != ret {
            return Err(ExploreError::Unconfirmed { expected: ret, got });
        }
        self.paths.push(Path {
            space: std::mem::take(&mut s.space),
            ret,
            action: KernelAction::from_ret(ret),
            witness,
        });
        if self.paths.len() > MAX_LEAVES {
            return Err(ExploreError::TooManyPaths);
        }
        Ok(())
    }
}

/// The scratch memory slot `k` names, or the error the kernel's checker would give.
fn mem_slot(pc: usize, k: u32) -> Result<usize, ExploreError> {
    if (k as usize) < 16 {
        Ok(k as usize)
    } else {
        Err(BpfError::BadMemory { pc, k }.into())
    }
}

/// An ALU instruction on the accumulator: computed on constants; on an argument word only
/// an AND with a constant is followed (it narrows the word's mask).
fn alu(s: &State, i: BpfInstruction, pc: usize) -> Result<Value, ExploreError> {
    let code = i.code;
    let b = if code & bpf::BPF_X != 0 {
        s.x
    } else {
        Value::Const(i.k)
    };
    Ok(match (s.a, b, code & 0xf0) {
        (Value::Const(a), Value::Const(b), op) => Value::Const(bpf::alu(op, a, b, pc)?),
        (Value::Sym { word, mask }, Value::Const(k), 0x50)
        | (Value::Const(k), Value::Sym { word, mask }, 0x50) => Value::Sym {
            word,
            mask: mask & k,
        },
        _ => return Err(ExploreError::Opaque { pc }),
    })
}

fn load(base: &SeccompData, k: u32) -> Option<Value> {
    match k {
        16..=60 if k % 4 == 0 => Some(Value::Sym {
            word: ((k - 16) / 4) as usize,
            mask: u32::MAX,
        }),
        _ => base.word(k).map(Value::Const),
    }
}

/// The distinct verdicts of a set of paths, each with the smallest witness reaching it.
pub fn distinct_actions(paths: &[Path]) -> Vec<(KernelAction, [u64; 6])> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for p in paths {
        if seen.insert(p.action) {
            out.push((p.action, p.witness));
        }
    }
    out
}

/// One way through several filters at once: the arguments that take it, each filter's
/// verdict there (in the order the filters were given), and the smallest argument vector
/// that does — confirmed by running every filter on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JointPath {
    pub space: ArgSpace,
    pub actions: Vec<KernelAction>,
    /// The filters' raw return values.
    pub rets: Vec<u32>,
    pub witness: [u64; 6],
}

/// Every way through `programs` together for one syscall, restricted to `within`: each
/// path of the first filter, split by the paths of the next within it, and so on. This is
/// how stacked filters (the floor and a profile) and two profiles are compared without
/// missing an argument where one of them changes its mind.
pub fn explore_joint(
    programs: &[&SeccompProgram],
    base: &SeccompData,
    within: &ArgSpace,
) -> Result<Vec<JointPath>, ExploreError> {
    let paths = joint(programs, base, within)?;
    for p in &paths {
        let data = SeccompData {
            args: p.witness,
            ..*base
        };
        for (program, &expected) in programs.iter().zip(&p.rets) {
            let got = bpf::run(program, &data)?;
            if got != expected {
                return Err(ExploreError::Unconfirmed { expected, got });
            }
        }
    }
    Ok(paths)
}

fn joint(
    programs: &[&SeccompProgram],
    base: &SeccompData,
    within: &ArgSpace,
) -> Result<Vec<JointPath>, ExploreError> {
    let Some((first, rest)) = programs.split_first() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for p in explore(first, base, within)? {
        if rest.is_empty() {
            out.push(JointPath {
                space: p.space,
                actions: vec![p.action],
                rets: vec![p.ret],
                witness: p.witness,
            });
        } else {
            for mut j in joint(rest, base, &p.space)? {
                j.actions.insert(0, p.action);
                j.rets.insert(0, p.ret);
                out.push(j);
            }
        }
        if out.len() > MAX_LEAVES {
            return Err(ExploreError::TooManyPaths);
        }
    }
    Ok(out)
}

/// Whether any argument vector in `within` makes the filter run the syscall.
pub fn runs_for_some(
    program: &SeccompProgram,
    base: &SeccompData,
    within: &ArgSpace,
) -> Result<Option<[u64; 6]>, ExploreError> {
    Ok(explore(program, base, within)?
        .into_iter()
        .find(|p| p.action.runs())
        .map(|p| p.witness))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;
    use crate::profile::abi::Abi;

    fn paths_for(rules: &str, syscall: &str) -> Result<Vec<Path>, Box<dyn std::error::Error>> {
        let p = Profile::from_toml(
            &format!("name = \"t\"\n[seccomp]\ndefault_action = \"allow\"\n{rules}"),
            "test",
        )?;
        let prog = p.compile_seccomp()?;
        let abi = Abi::native();
        let nr = abi.syscall_nr(syscall).ok_or("no such syscall")?;
        Ok(explore(&prog, &abi.data(nr, [0; 6]), &ArgSpace::any())?)
    }

    #[test]
    fn rules_covering_every_argument_leave_one_verdict() -> Result<(), Box<dyn std::error::Error>> {
        // arg0 < 5 and arg0 >= 5 together cover everything: not conditional, although
        // the compiled filter branches on the argument.
        let paths = paths_for(
            "[[seccomp.rule]]\naction = \"errno\"\nerrno = 1\nsyscalls = [\"personality\"]\nargs = [{ index = 0, op = \"lt\", value = 5 }]\n\
             [[seccomp.rule]]\naction = \"errno\"\nerrno = 1\nsyscalls = [\"personality\"]\nargs = [{ index = 0, op = \"ge\", value = 5 }]\n",
            "personality",
        )?;
        assert!(paths.len() > 1, "the filter branches");
        assert_eq!(distinct_actions(&paths).len(), 1, "{paths:?}");
        Ok(())
    }

    #[test]
    fn every_reachable_verdict_comes_with_a_witness_the_filter_confirms()
    -> Result<(), Box<dyn std::error::Error>> {
        let paths = paths_for(
            "[[seccomp.rule]]\naction = \"kill\"\nsyscalls = [\"ioctl\"]\nargs = [{ index = 1, op = \"eq\", value = \"TIOCSTI\" }]\n\
             [[seccomp.rule]]\naction = \"errno\"\nerrno = 13\nsyscalls = [\"ioctl\"]\nargs = [{ index = 1, op = \"gt\", value = 0x100000000 }, { index = 2, op = \"eq\", value = 7 }]\n",
            "ioctl",
        )?;
        let actions: Vec<KernelAction> = distinct_actions(&paths)
            .into_iter()
            .map(|(a, _)| a)
            .collect();
        assert!(actions.contains(&KernelAction::KillProcess));
        assert!(actions.contains(&KernelAction::Errno(13)));
        assert!(actions.contains(&KernelAction::Allow));
        for (action, w) in distinct_actions(&paths) {
            if action == KernelAction::Errno(13) {
                assert!(w[1] > 0x1_0000_0000 && w[2] == 7, "{w:x?}");
            }
        }
        Ok(())
    }
}
