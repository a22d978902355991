//! The egress brokers a trail last saw running: what a controller that crashed could not
//! record for them is said by the next one.
//!
//! A broker reports a connection when it closes. A controller killed (SIGKILL, the OOM
//! killer, power loss) takes its launcher and every broker with it, and the connections
//! still open then were never recorded. The next start reads the whole trail anyway (its
//! chain is verified), so it notes each worker launched with a broker (its
//! `replication_requested` says `"egress": true`, and is on disk before the worker starts)
//! whose end the trail never names, and records `egress_record_lost` for it: never silence.
//! A worker whose end was still waiting for its sync is named too: the broker's entries
//! waited with it.

use std::collections::BTreeSet;

use super::{AuditEntry, event};

/// Workers a trail could name (the controller's own entries, under its MAC): far more
/// than one controller runs at once. Past it, only how many.
const MAX_TRACKED: usize = 1 << 16;

/// Workers whose egress broker was running when the trail ended, as far as it says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpenEgress {
    pub workers: BTreeSet<String>,
    /// Started with a broker past [`MAX_TRACKED`]: not named, only counted (an upper bound:
    /// their ends are not matched).
    pub more: u64,
}

impl OpenEgress {
    /// Follows one verified entry.
    pub(super) fn see(&mut self, e: &AuditEntry) {
        match e.event.as_str() {
            // Durable before the worker starts, where a `worker_started` may not be yet.
            event::REPLICATION_REQUESTED => {
                if e.details.get("egress") != Some(&serde_json::Value::Bool(true)) {
                    return;
                }
                let Some(id) = &e.worker_id else { return };
                if self.workers.len() < MAX_TRACKED {
                    self.workers.insert(id.clone());
                } else {
                    self.more = self.more.saturating_add(1);
                }
            }
            // Its end is recorded, or what was lost is said already.
            event::WORKER_EXITED | event::WORKER_START_FAILED | event::EGRESS_RECORD_LOST => {
                match &e.worker_id {
                    Some(id) => {
                        self.workers.remove(id);
                    }
                    // Said for the workers past the bound, unnamed.
                    None => self.more = 0,
                }
            }
            // Refused at its start, so it never ran. (Other refusals name the worker that
            // asked, which runs on.)
            ev if ev.starts_with("deny_")
                && e.details.get("at").and_then(|a| a.as_str()) == Some("start") =>
            {
                if let Some(id) = &e.worker_id {
                    self.workers.remove(id);
                }
            }
            // A clean stop records every worker's end before it.
            event::CONTROLLER_STOPPED => *self = OpenEgress::default(),
            _ => {}
        }
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty() && self.more == 0
    }
}
