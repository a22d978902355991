//! Whether a trail holds the head the cluster anchored for its node (`audit/<node>`): what
//! `audit verify --cluster` checks, and what a controller joining a cluster checks before
//! it writes to its trail. A trail rolled back to an older copy of itself is a valid
//! chain; only a head kept outside the state directory shows it was cut or rewritten, and
//! a controller that started on it anyway would anchor the older trail's head over it.

use std::path::Path;

use super::records::AnchorRecord;
use crate::audit::{self, AuditError};

/// Checks the first `verified` entries of the trail in `dir` (those the chain verified)
/// against `heads`, the cluster's anchored heads for this node, named `anchor` in errors.
/// `Ok(true)` when the trail holds its head, `Ok(false)` when the cluster holds none for
/// this trail (a first start). Heads of another trail of the node are a rollback, unless
/// `accept_replaced` and this trail says it was begun with `--new-audit-trail` (its first
/// entry, under the MAC), which replaces an earlier one.
pub fn check_anchored_head(
    dir: &Path,
    verified: u64,
    heads: &[AnchorRecord],
    anchor: &str,
    accept_replaced: bool,
) -> Result<bool, AuditError> {
    // Only the entries the chain verified: a partial line after them (an append a crash
    // cut short) is no entry, whatever it says, and can never hold an anchored head.
    let mut entries = audit::read_entries(dir)?;
    entries.truncate(usize::try_from(verified).unwrap_or(usize::MAX));
    let rolled_back = |seq: u64, reason: String| AuditError::RolledBack {
        path: dir.join(audit::LOG_FILE),
        anchor: anchor.to_string(),
        seq,
        reason,
    };
    // The trail's name is its first entry's hash; the cluster holds one head per trail.
    let trail = entries.first().map(|e| e.hash.clone()).unwrap_or_default();
    let begun_anew = entries.first().is_some_and(|e| {
        e.event == audit::event::AUDIT_TRAIL_STARTED
            && e.details.get("new_audit_trail") == Some(&serde_json::Value::Bool(true))
    });
    let replaced_expected = accept_replaced && begun_anew;
    if let Some(other) = heads
        .iter()
        .find(|h| h.trail != trail && !replaced_expected)
    {
        return Err(rolled_back(
            other.seq,
            format!(
                "the cluster holds the head (entry {}, {}) of another trail of node {} (first hash {}): this trail replaced it",
                other.seq,
                audit::format_time(other.at_ms),
                other.node,
                other.trail
            ),
        ));
    }
    let Some(head) = heads.iter().find(|h| h.trail == trail) else {
        return Ok(false);
    };
    match entries.iter().find(|e| e.seq == head.seq) {
        Some(e) if e.hash == head.hash => Ok(true),
        Some(e) => Err(rolled_back(
            head.seq,
            format!(
                "the cluster anchored hash {} for this entry; the trail has {}: it was rewritten",
                head.hash, e.hash
            ),
        )),
        None => Err(rolled_back(
            head.seq,
            format!(
                "the cluster anchored entry {} at {}; the trail ends at entry {}: it was cut",
                head.seq,
                audit::format_time(head.at_ms),
                entries.last().map_or(0, |e| e.seq)
            ),
        )),
    }
}
