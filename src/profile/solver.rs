//! Satisfiability of comparisons on one machine word.
//!
//! Seccomp filters (and profile rules) only ever compare a masked argument word with a
//! constant: `(w & mask) == k`, `>`, `>=`, their negations, and "any of these bits set".
//! Whether a set of such comparisons can hold together — two rules overlapping, a branch of
//! a compiled filter being reachable — is decided here exactly, by assigning the word's
//! bits from the most significant down and cutting every prefix that can no longer
//! satisfy some comparison. Masked values keep their bit positions, so once the high bits
//! are fixed the reachable masked values are exactly the interval between "all remaining
//! mask bits 0" and "all remaining mask bits 1": the cut is exact for each comparison.

/// How a masked word is compared with a constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rel {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    /// `(w & mask) != 0`
    AnySet,
    /// `(w & mask) == 0`
    NoneSet,
}

/// `(w & mask) REL k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Constraint {
    pub mask: u64,
    pub rel: Rel,
    pub k: u64,
}

impl Constraint {
    pub fn new(mask: u64, rel: Rel, k: u64) -> Constraint {
        Constraint { mask, rel, k }
    }

    pub fn holds(&self, w: u64) -> bool {
        let v = w & self.mask;
        match self.rel {
            Rel::Eq => v == self.k,
            Rel::Ne => v != self.k,
            Rel::Gt => v > self.k,
            Rel::Ge => v >= self.k,
            Rel::Lt => v < self.k,
            Rel::Le => v <= self.k,
            Rel::AnySet => v != 0,
            Rel::NoneSet => v == 0,
        }
    }

    /// The comparison that holds exactly when this one does not.
    pub fn negated(&self) -> Constraint {
        let rel = match self.rel {
            Rel::Eq => Rel::Ne,
            Rel::Ne => Rel::Eq,
            Rel::Gt => Rel::Le,
            Rel::Ge => Rel::Lt,
            Rel::Lt => Rel::Ge,
            Rel::Le => Rel::Gt,
            Rel::AnySet => Rel::NoneSet,
            Rel::NoneSet => Rel::AnySet,
        };
        Constraint { rel, ..*self }
    }

    /// Whether some word with the bits in `fixed` set to `value` (and the bits below them
    /// free) can still satisfy the comparison.
    fn viable(&self, fixed: u64, value: u64) -> bool {
        let m = self.mask;
        let known = m & fixed;
        let free = m & !fixed;
        let lo = value & known;
        let hi = lo | free;
        match self.rel {
            Rel::Eq => self.k & !m == 0 && self.k & known == lo,
            Rel::Ne => free != 0 || lo != self.k,
            Rel::Gt => hi > self.k,
            Rel::Ge => hi >= self.k,
            Rel::Lt => lo < self.k,
            Rel::Le => lo <= self.k,
            Rel::AnySet => hi != 0,
            Rel::NoneSet => lo == 0,
        }
    }
}

/// The answer for a set of comparisons on one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Solution {
    /// The smallest word satisfying every comparison.
    Value(u64),
    Infeasible,
    /// The search budget ran out (never seen with filters libseccomp generates).
    Undecided,
}

/// Node budget of one search; each node is one fixed bit.
const BUDGET: u32 = 1 << 20;

/// Finds the smallest `width`-bit word (32 or 64) satisfying all `constraints`.
pub fn solve(constraints: &[Constraint], width: u32) -> Solution {
    let width = width.clamp(1, 64);
    let limit = if width == 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    };
    // Comparisons against constants the word can never reach are decided up front.
    if constraints
        .iter()
        .any(|c| c.rel == Rel::Eq && (c.k & !limit != 0 || c.k & !c.mask != 0))
    {
        return Solution::Infeasible;
    }
    // Bits above the width are fixed to 0.
    let fixed = !limit;
    if !constraints.iter().all(|c| c.viable(fixed, 0)) {
        return Solution::Infeasible;
    }
    let mut budget = BUDGET;
    // Bits no comparison looks at are left 0: trying both values of them would only
    // repeat the same search.
    let relevant = constraints.iter().fold(0, |acc, c| acc | c.mask);
    match search(constraints, relevant, width, fixed, 0, &mut budget) {
        Some(v) => Solution::Value(v),
        None if budget == 0 => Solution::Undecided,
        None => Solution::Infeasible,
    }
}

fn search(
    cs: &[Constraint],
    relevant: u64,
    bit: u32,
    fixed: u64,
    value: u64,
    budget: &mut u32,
) -> Option<u64> {
    if bit == 0 {
        return Some(value);
    }
    let b = 1u64 << (bit - 1);
    let choices: &[u64] = if relevant & b == 0 { &[0] } else { &[0, b] };
    for &choice in choices {
        if *budget == 0 {
            return None;
        }
        *budget -= 1;
        let (f, v) = (fixed | b, value | choice);
        if cs.iter().all(|c| c.viable(f, v)) {
            if let Some(found) = search(cs, relevant, bit - 1, f, v, budget) {
                return Some(found);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn equalities_and_ranges_find_the_smallest_witness() {
        let c = [
            Constraint::new(u64::MAX, Rel::Gt, 10),
            Constraint::new(u64::MAX, Rel::Ne, 11),
        ];
        assert_eq!(solve(&c, 64), Solution::Value(12));
        let c = [
            Constraint::new(0xff00, Rel::Eq, 0x1200),
            Constraint::new(0xff, Rel::Ge, 3),
        ];
        assert_eq!(solve(&c, 32), Solution::Value(0x1203));
    }

    #[test]
    fn contradictions_are_infeasible() {
        let c = [
            Constraint::new(u64::MAX, Rel::Lt, 5),
            Constraint::new(u64::MAX, Rel::Gt, 4),
        ];
        assert_eq!(solve(&c, 64), Solution::Infeasible);
        let c = [
            Constraint::new(0x10, Rel::AnySet, 0),
            Constraint::new(0x30, Rel::Eq, 0x20),
        ];
        assert_eq!(solve(&c, 32), Solution::Infeasible);
        // A 32-bit word never equals a 33-bit constant.
        let c = [Constraint::new(u64::MAX, Rel::Eq, 1 << 32)];
        assert_eq!(solve(&c, 32), Solution::Infeasible);
    }

    #[test]
    fn masked_ranges_with_gaps_are_decided_exactly() {
        // (w & 0b101) lies in {0, 1, 4, 5}: strictly between 1 and 4 is empty.
        let c = [
            Constraint::new(0b101, Rel::Gt, 1),
            Constraint::new(0b101, Rel::Lt, 4),
        ];
        assert_eq!(solve(&c, 32), Solution::Infeasible);
    }

    fn rel() -> impl Strategy<Value = Rel> {
        prop_oneof![
            Just(Rel::Eq),
            Just(Rel::Ne),
            Just(Rel::Gt),
            Just(Rel::Ge),
            Just(Rel::Lt),
            Just(Rel::Le),
            Just(Rel::AnySet),
            Just(Rel::NoneSet),
        ]
    }

    proptest! {
        /// On 10-bit words every value can be tried: the solver must agree with brute force
        /// on feasibility and return the smallest satisfying value.
        #[test]
        fn solver_matches_brute_force_on_small_words(
            cs in proptest::collection::vec((0u64..1024, rel(), 0u64..1024), 0..6)
        ) {
            let cs: Vec<Constraint> = cs.into_iter().map(|(m, r, k)| Constraint::new(m, r, k)).collect();
            let brute = (0u64..1024).find(|w| cs.iter().all(|c| c.holds(*w)));
            match solve(&cs, 10) {
                Solution::Value(v) => prop_assert_eq!(Some(v), brute),
                Solution::Infeasible => prop_assert_eq!(None, brute),
                Solution::Undecided => prop_assert!(false, "budget exhausted on a 10-bit word"),
            }
        }

        #[test]
        fn negation_is_the_complement(m in any::<u64>(), k in any::<u64>(), w in any::<u64>(), r in rel()) {
            let c = Constraint::new(m, r, k);
            prop_assert_eq!(c.holds(w), !c.negated().holds(w));
        }
    }
}
