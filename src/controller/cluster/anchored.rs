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
    let rolled_back = |seq: u64, reason: String| AuditError::RolledBack {
        path: dir.join(audit::LOG_FILE),
        anchor: anchor.to_string(),
        seq,
        reason,
    };
    // Read as a stream, the first `verified` entries only (those the chain verified: a
    // partial line after them is no entry, whatever it says, and never holds a head): the
    // first names the trail and says whether it was begun anew; the head's entry is the
    // only other one kept.
    let (mut first, mut target, mut at_head, mut last, mut read) = (None, None, None, 0, 0u64);
    audit::each_entry(dir, |e| {
        read = read.saturating_add(1);
        if first.is_none() {
            let begun_anew = e.event == audit::event::AUDIT_TRAIL_STARTED
                && e.details.get("new_audit_trail") == Some(&serde_json::Value::Bool(true));
            target = heads.iter().find(|h| h.trail == e.hash);
            first = Some((e.hash.clone(), begun_anew));
        }
        last = e.seq;
        if target.is_some_and(|h| h.seq == e.seq) {
            at_head = Some(e.hash);
            return false;
        }
        read < verified
    })?;
    // The trail's name is its first entry's hash; the cluster holds one head per trail.
    let (trail, begun_anew) = first.unwrap_or_default();
    if let Some(other) = heads
        .iter()
        .find(|h| h.trail != trail && !(accept_replaced && begun_anew))
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
    let Some(head) = target else {
        return Ok(false);
    };
    match at_head {
        Some(hash) if hash == head.hash => Ok(true),
        Some(hash) => Err(rolled_back(
            head.seq,
            format!(
                "the cluster anchored hash {} for this entry; the trail has {hash}: it was rewritten",
                head.hash
            ),
        )),
        None => Err(rolled_back(
            head.seq,
            format!(
                "the cluster anchored entry {} at {}; the trail ends at entry {last}: it was cut",
                head.seq,
                audit::format_time(head.at_ms),
            ),
        )),
    }
}
