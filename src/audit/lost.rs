//! Decisions that could not be written. A sync that fails leaves its decisions undone
//! (the controller answers them as not done and engages its kill switch), so their
//! entries are not kept for a later sync, which would record as done what was refused;
//! nor do they vanish without a word. They are counted here, by event, in an entry that
//! goes first among those waiting for the next sync ([`super::event::AUDIT_ENTRIES_LOST`]).

use std::collections::BTreeMap;

use super::{format_time, now_ms};

/// Most distinct events counted by name; the rest are counted together.
const MOST_EVENTS: usize = 64;
/// Longest error text kept.
const MOST_ERROR: usize = 300;

/// What failed syncs dropped since the last one that succeeded.
#[derive(Debug, Clone, Default)]
pub(super) struct Lost {
    entries: u64,
    by_event: BTreeMap<String, u64>,
    first_ms: u64,
    last_ms: u64,
    /// The first failure's error.
    error: String,
}

impl Lost {
    /// Counts `events`, dropped by a sync that failed with `error`.
    pub(super) fn count(&mut self, events: &[String], error: &str) {
        let now = now_ms();
        if self.entries == 0 && self.error.is_empty() {
            self.first_ms = now;
            self.error = crate::text::clip(error, MOST_ERROR).into_owned();
        }
        self.last_ms = now;
        for ev in events {
            self.entries = self.entries.saturating_add(1);
            let key = if self.by_event.len() < MOST_EVENTS || self.by_event.contains_key(ev) {
                ev.as_str()
            } else {
                "other"
            };
            let n = self.by_event.entry(key.to_string()).or_default();
            *n = n.saturating_add(1);
        }
    }

    /// When the first of them was dropped: the time of the entry that counts them.
    pub(super) fn since(&self) -> String {
        format_time(self.first_ms)
    }

    /// The details of the entry that says what was dropped.
    pub(super) fn details(&self) -> serde_json::Value {
        serde_json::json!({
            "entries": self.entries,
            "by_event": self.by_event,
            "from": format_time(self.first_ms),
            "until": format_time(self.last_ms),
            "error": self.error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_entries_are_counted_by_event_within_bounds() {
        let mut lost = Lost::default();
        let mut events: Vec<String> = (0..100).map(|i| format!("e{i}")).collect();
        events.push("e0".into());
        lost.count(&events, &"x".repeat(1000));
        lost.count(&["e1".to_string()], "later");
        let d = lost.details();
        assert_eq!(d["entries"], 102);
        assert_eq!(d["by_event"]["e0"], 2);
        assert_eq!(d["by_event"]["e1"], 2);
        assert_eq!(d["by_event"]["other"], 100 - MOST_EVENTS as u64);
        assert!(
            d["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("xxx") && e.len() < 400)
        );
    }
}
