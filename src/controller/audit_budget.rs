//! How much of the audit trail each worker can cause.
//!
//! Why: every entry a worker's message causes (a report, a denied request, a protocol
//! violation) is written and synced, and a worker chooses how often to send. Under the
//! rate limit alone one worker could add some 130 KB/s to the trail — gigabytes a day, and
//! a full disk ends a trail's ability to record decisions at all. Each worker gets a
//! budget of audit bytes (a burst, then a steady rate); past it, its non-essential entries
//! are counted instead of written, and one `audit_suppressed` entry per worker and window
//! says how many of each were left out. Entries that carry a decision with effect on the
//! world (a replication allowed, an approval requested, a registration) are never held
//! back, and the first entry of each kind in every window is written in full, so a
//! worker cannot spend its budget on reports and then hide what it attempted.

use std::collections::{BTreeMap, HashMap};

use crate::audit::event;
use crate::manifest::WorkerId;

/// Audit bytes a worker may cause at once, and per second after that.
const BURST: u64 = 64 << 10;
const PER_SECOND: u64 = 1 << 10;
/// At most one summary of suppressed entries per worker per this many milliseconds.
const SUMMARY_EVERY_MS: u64 = 10_000;

/// Entries written whatever a worker's budget: decisions that change what runs.
const ESSENTIAL: &[&str] = &[
    event::REPLICATION_REQUESTED,
    event::APPROVAL_REQUESTED,
    event::WORKER_REGISTERED,
    event::REJECT_MANIFEST_SIGNATURE,
    event::AUDIT_SUPPRESSED,
    event::WORKER_SHUTDOWN_REQUESTED,
];

struct Budget {
    bytes: u64,
    last_ms: u64,
    last_summary_ms: u64,
    /// Events written in full in the current window whatever the budget: the first of
    /// each kind, so that spending the budget on reports cannot hide what a worker then
    /// attempted (a denied request, an impersonation).
    first_of_kind: BTreeMap<String, u64>,
    /// Entries left out since the last summary, by event.
    suppressed: BTreeMap<String, u64>,
}

/// Every worker's budget.
#[derive(Default)]
pub struct AuditBudgets {
    workers: HashMap<WorkerId, Budget>,
}

impl AuditBudgets {
    /// Whether an entry of `bytes` for `event`, caused by `worker`, may be written now;
    /// if not, it is counted for the next summary.
    pub fn charge(&mut self, worker: &WorkerId, event: &str, bytes: u64, now_ms: u64) -> bool {
        if ESSENTIAL.contains(&event) {
            return true;
        }
        let b = self.workers.entry(worker.clone()).or_insert(Budget {
            bytes: BURST,
            last_ms: now_ms,
            last_summary_ms: now_ms,
            first_of_kind: BTreeMap::new(),
            suppressed: BTreeMap::new(),
        });
        let refill = now_ms
            .saturating_sub(b.last_ms)
            .saturating_mul(PER_SECOND)
            .checked_div(1000)
            .unwrap_or(0);
        b.bytes = b.bytes.saturating_add(refill).min(BURST);
        b.last_ms = now_ms;
        let first = b
            .first_of_kind
            .get(event)
            .is_none_or(|t| now_ms.saturating_sub(*t) >= SUMMARY_EVERY_MS);
        if first || b.bytes >= bytes {
            b.bytes = b.bytes.saturating_sub(bytes);
            if first {
                b.first_of_kind.insert(event.to_string(), now_ms);
            }
            return true;
        }
        let n = b.suppressed.entry(event.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        false
    }

    /// Summaries due now: each worker with suppressed entries whose last summary is at
    /// least a window old.
    pub fn due(&mut self, now_ms: u64) -> Vec<(WorkerId, BTreeMap<String, u64>)> {
        let mut out = Vec::new();
        for (id, b) in &mut self.workers {
            if !b.suppressed.is_empty()
                && now_ms.saturating_sub(b.last_summary_ms) >= SUMMARY_EVERY_MS
            {
                b.last_summary_ms = now_ms;
                out.push((id.clone(), std::mem::take(&mut b.suppressed)));
            }
        }
        out
    }

    /// Forgets a worker that has exited, with what it still had suppressed.
    pub fn remove(&mut self, worker: &WorkerId) -> Option<BTreeMap<String, u64>> {
        self.workers
            .remove(worker)
            .map(|b| b.suppressed)
            .filter(|s| !s.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> WorkerId {
        WorkerId::new("w-0123456789ab".to_string()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_flood_is_counted_not_written_and_summarised_once_a_window() {
        let mut b = AuditBudgets::default();
        let w = id();
        let mut written = 0u64;
        for i in 0..1000u64 {
            if b.charge(&w, event::DENY_COOLDOWN, 6 << 10, 1_000 + i * 50) {
                written += 6 << 10;
            }
        }
        // 50 s at 1 KiB/s on top of the burst, and the first of the kind in each window.
        assert!(
            written <= BURST + 51 * PER_SECOND + 6 * (6 << 10),
            "{written}"
        );
        let due = b.due(1_000 + 1000 * 50);
        assert_eq!(due.len(), 1);
        assert!(
            due.first()
                .and_then(|d| d.1.get(event::DENY_COOLDOWN))
                .is_some_and(|n| *n > 900)
        );
        assert!(b.due(1_000 + 1000 * 50 + 1).is_empty(), "once a window");
        // Decisions with effect are never held back.
        assert!(b.charge(&w, event::REPLICATION_REQUESTED, 1 << 20, 60_000));
    }

    #[test]
    fn a_spent_budget_still_lets_the_first_denial_of_each_kind_through() {
        let mut b = AuditBudgets::default();
        let w = id();
        while b.charge(&w, "worker_report", 1 << 10, 1_000) {}
        assert!(!b.charge(&w, "worker_report", 1 << 10, 1_000));
        assert!(b.charge(&w, event::DENY_NARROWING, 600, 1_001), "the first");
        assert!(
            !b.charge(&w, event::DENY_NARROWING, 600, 1_002),
            "not the second"
        );
        assert!(
            b.charge(&w, event::DENY_NARROWING, 600, 1_001 + SUMMARY_EVERY_MS),
            "the first of the next window"
        );
    }
}
