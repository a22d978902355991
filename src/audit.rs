//! The audit trail: an append-only JSON Lines file of every security decision, in which
//! nobody can quietly edit, delete, insert or reorder an entry.
//!
//! Each entry carries a sequence number, the SHA-256 of the previous entry (`prev`), its own
//! SHA-256 over a canonical encoding of its fields (`hash`), and an HMAC-SHA256 of that hash
//! under the controller's audit key (`mac`). A separate head file records the last sequence
//! number and hash, MACed the same way, so that cutting entries off the end is caught too.
//! Without the key, a consistent rewrite of the chain is impossible; `verify` names the first
//! entry where the chain breaks and why.
//!
//! Durability: [`AuditLog::append`] buffers; [`AuditLog::sync`] writes, `fdatasync`s and
//! updates the head. A security decision is synced before it takes effect.
//!
//! A trail that vanished: the chain and the head cannot tell an emptied or removed trail
//! from one never begun, so [`AuditLog::start`] and [`verify`] first ask the state
//! directory whether a trail was kept there (see [`survey`]) and refuse one that vanished,
//! unless a new trail is begun on purpose; every trail's first entry
//! (`audit_trail_started`) records how and why it was begun.
//!
//! A trail rolled back to an older copy is a valid chain too: the [`anchor`] keeps every
//! synced head outside the state directory, and a trail that lacks an anchored head is
//! refused.

pub mod anchor;
mod lost;
mod open_egress;
mod verify;
mod writer;

pub use verify::{
    TrailFollower, VerifySummary, describe, each_entry, read_entries, verify, verify_chain,
    verify_with_anchor,
};
use verify::{open_trail_file, read_line, verify_in};

pub use anchor::{Anchor, AnchorReport, AnchorTarget};
pub use open_egress::OpenEgress;
pub use writer::{AuditLog, EntryKind, Start, SyncedHead};

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use crate::paths::Dir;
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const LOG_FILE: &str = "audit.jsonl";
pub const HEAD_FILE: &str = "audit.head";
/// The state directory's key file (the default `--key`), created with the first trail.
pub const KEY_FILE: &str = "controller.key";
/// Written by a running controller, removed when it stops.
const PID_FILE: &str = "controller.pid";
/// Worker logs, one per worker that ever ran.
const WORKERS_DIR: &str = "workers";
const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Longest line `verify` and `tail` read; longer ones are reported as malformed.
const MAX_LINE: usize = 256 * 1024;

/// Audit event names (the seed's, plus the worker lifecycle and controller events).
pub mod event {
    pub const REJECT_MANIFEST_SIGNATURE: &str = "reject_manifest_signature";
    pub const DENY_QUOTA: &str = "deny_quota";
    pub const DENY_COOLDOWN: &str = "deny_cooldown";
    pub const DENY_DEPTH: &str = "deny_depth";
    pub const DENY_STOP_CONDITION: &str = "deny_stop_condition";
    pub const DENY_NARROWING: &str = "deny_narrowing";
    pub const DENY_KILL_SWITCH: &str = "deny_kill_switch";
    pub const REPLICATION_REQUESTED: &str = "replication_requested";
    pub const KILL_SWITCH_ENGAGED: &str = "kill_switch_engaged";
    pub const KILL_SWITCH_RELEASED: &str = "kill_switch_released";
    pub const KILL_SWITCH_RELEASE_REFUSED: &str = "kill_switch_release_refused";
    /// This node of a cluster could not renew its lease in time and killed its workers.
    pub const CLUSTER_FENCED: &str = "cluster_fenced";
    /// A fenced node holds a new lease and admits again.
    pub const CLUSTER_REJOINED: &str = "cluster_rejoined";
    pub const REAP_STALE: &str = "reap_stale";
    pub const WORKER_REGISTERED: &str = "worker_registered";
    pub const WORKER_STARTED: &str = "worker_started";
    pub const WORKER_START_FAILED: &str = "worker_start_failed";
    pub const WORKER_REPORT: &str = "worker_report";
    pub const WORKER_SHUTDOWN_REQUESTED: &str = "worker_shutdown_requested";
    pub const WORKER_EXITED: &str = "worker_exited";
    pub const WORKER_KILLED: &str = "worker_killed";
    pub const WORKER_EXPIRED: &str = "worker_expired";
    pub const PROTOCOL_VIOLATION: &str = "protocol_violation";
    pub const RATE_LIMITED: &str = "rate_limited";
    pub const IMPERSONATION_ATTEMPT: &str = "impersonation_attempt";
    /// Entries a worker caused beyond its audit budget, counted by event.
    pub const AUDIT_SUPPRESSED: &str = "audit_suppressed";
    pub const EGRESS_ALLOWED: &str = "egress_allowed";
    pub const EGRESS_DENIED: &str = "egress_denied";
    pub const DNS_ANSWERED: &str = "dns_answered";
    pub const DNS_REFUSED: &str = "dns_refused";
    pub const EGRESS_RECORD_LOST: &str = "egress_record_lost";
    pub const CLIENT_REJECTED: &str = "client_rejected";
    pub const CONTROLLER_STARTED: &str = "controller_started";
    pub const CONTROLLER_STOPPED: &str = "controller_stopped";
    pub const CRASH_RECOVERED: &str = "crash_recovered";
    pub const APPROVAL_REQUESTED: &str = "approval_requested";
    pub const APPROVAL_GRANTED: &str = "approval_granted";
    pub const APPROVAL_DENIED: &str = "approval_denied";
    pub const APPROVAL_TIMEOUT: &str = "approval_timeout";
    pub const APPROVAL_REFUSED: &str = "approval_refused";
    /// Entries that failed syncs dropped (their decisions were answered as not done),
    /// counted by event: the first entry written after them (details `entries`,
    /// `by_event`, `from`, `until`, `error`).
    pub const AUDIT_ENTRIES_LOST: &str = "audit_entries_lost";
    /// A trail's first entry: how and why it was begun (details `reason`,
    /// `new_audit_trail`, `evidence`).
    pub const AUDIT_TRAIL_STARTED: &str = "audit_trail_started";
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit trail {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("audit trail {path} is damaged at entry {line}: {reason}")]
    Damaged {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    #[error(
        "audit trail {path} has vanished: {}; refusing to go on without it: put it back, or begin a new trail with `hatchery controller --new-audit-trail` (its first entry records this)",
        evidence.join("; ")
    )]
    Vanished {
        path: PathBuf,
        evidence: Vec<String>,
    },
    #[error(
        "audit trail {path} is {kind}, not a regular file: something was put in its place (a controller only ever writes regular files there)"
    )]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error(
        "--new-audit-trail refused: {path} holds an audit trail ({bytes} bytes), and a trail is never replaced: start without --new-audit-trail (a damaged trail is evidence: move it aside yourself first)"
    )]
    TrailExists { path: PathBuf, bytes: u64 },
    #[error("audit anchor {anchor}{}: {reason}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Anchor {
        anchor: String,
        line: Option<u64>,
        reason: String,
    },
    #[error(
        "audit trail {path} does not match the anchor {anchor} at entry {seq}: {reason}; the controller refuses such a trail (see `hatchery audit verify --anchor`)"
    )]
    RolledBack {
        path: PathBuf,
        anchor: String,
        seq: u64,
        reason: String,
    },
}

impl AuditError {
    /// Whether this is something wrong with the trail or the anchor's content (damage to
    /// report), rather than a failure to read or write them.
    pub fn is_damage(&self) -> bool {
        match self {
            AuditError::Damaged { .. }
            | AuditError::NotAFile { .. }
            | AuditError::Vanished { .. }
            | AuditError::RolledBack { .. } => true,
            AuditError::Anchor { line, .. } => line.is_some(),
            AuditError::Io { .. } | AuditError::TrailExists { .. } => false,
        }
    }
}

/// One entry, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditEntry {
    pub seq: u64,
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    pub event: String,
    /// Who caused it: `controller`, `worker:<id>`, `uid:<n>`.
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    #[serde(default)]
    pub details: serde_json::Value,
    pub prev: String,
    pub hash: String,
    pub mac: String,
}

/// The fields the hash covers, in a fixed order; `details` is a JSON value whose object keys
/// serialize sorted, so the same entry always encodes to the same bytes.
#[derive(Serialize)]
struct Hashed<'a> {
    seq: u64,
    time: &'a str,
    event: &'a str,
    actor: &'a str,
    worker_id: &'a Option<String>,
    details: &'a serde_json::Value,
    prev: &'a str,
}

impl AuditEntry {
    fn compute_hash(&self) -> String {
        let h = Hashed {
            seq: self.seq,
            time: &self.time,
            event: &self.event,
            actor: &self.actor,
            worker_id: &self.worker_id,
            details: &self.details,
            prev: &self.prev,
        };
        let bytes = serde_json::to_vec(&h).unwrap_or_default();
        hex::encode(Sha256::digest(&bytes))
    }
}

/// The trail's MAC key (a keyed HMAC-SHA256, derived from the controller's key). Never
/// printed.
#[derive(Clone)]
pub struct AuditKey(Option<Hmac<Sha256>>);

/// The derivation label of the audit key (see [`crate::signing::Keyring::derived_mac`]).
pub const KEY_PURPOSE: &str = "audit trail";

impl AuditKey {
    /// A key from raw bytes (tests, tools).
    pub fn new(bytes: &[u8]) -> AuditKey {
        AuditKey(<Hmac<Sha256> as KeyInit>::new_from_slice(bytes).ok())
    }

    /// The key as a keyed MAC, e.g. from `Keyring::derived_mac(audit::KEY_PURPOSE)`.
    pub fn from_mac(mac: Hmac<Sha256>) -> AuditKey {
        AuditKey(Some(mac))
    }

    fn mac(&self, data: &[u8]) -> String {
        match self.0.clone() {
            Some(mut m) => {
                m.update(data);
                hex::encode(m.finalize().into_bytes())
            }
            None => String::new(),
        }
    }

    fn check(&self, data: &[u8], mac_hex: &str) -> bool {
        let Ok(expected) = hex::decode(mac_hex) else {
            return false;
        };
        match self.0.clone() {
            Some(mut m) => {
                m.update(data);
                m.verify_slice(&expected).is_ok()
            }
            None => false,
        }
    }
}

impl std::fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditKey(<redacted>)")
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Head {
    seq: u64,
    hash: String,
    mac: String,
}

fn head_mac_input(seq: u64, hash: &str) -> Vec<u8> {
    format!("head:{seq}:{hash}").into_bytes()
}

/// Milliseconds since the epoch as RFC 3339 UTC (`2026-11-22T17:03:04.123Z`).
pub fn format_time(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let ms = unix_ms % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Where a state directory's trail stands before anyone opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrailState {
    /// `audit.jsonl` has content (whether it is intact is for [`verify`] to say).
    Present { bytes: u64 },
    /// No entries, and nothing says a trail was ever kept here: a new state directory.
    New,
    /// No entries, but the directory (or the anchor) shows that a trail was kept: it was
    /// removed or emptied.
    Vanished { evidence: Vec<String> },
}

/// Asks the state directory whether a trail was kept in it. The rule: a trail is expected
/// wherever any of these is found, because a controller creates each only after (or
/// together with) its trail's first entry, and never leaves `audit.jsonl` empty:
///
/// - `audit.head` (it names the last synced entry);
/// - an empty `audit.jsonl` (the file is created with its first entry in it);
/// - the key file `controller.key`, unless this very start created it (a trail is begun
///   right after its key);
/// - `controller.pid` (a controller ran here and did not stop cleanly);
/// - worker logs in `workers/` (workers ran, so decisions were recorded);
/// - anchored heads in the anchor file the controller is started with.
///
/// The lock file and an empty `workers/` are not evidence: a start that fails before
/// its first entry leaves them behind.
pub fn survey(
    dir: &Dir,
    key_created: bool,
    anchor: Option<(&File, &str)>,
) -> Result<TrailState, AuditError> {
    let at = |name: &str| dir.path().join(name);
    let log_path = at(LOG_FILE);
    let mut evidence = Vec::new();
    // Anything but a regular file where the trail or its head belongs is damage, never a
    // file that cannot be read: a symlink, a directory, a FIFO.
    for name in [LOG_FILE, HEAD_FILE] {
        if let Some(st) = dir.stat_entry(name).map_err(io_err(&at(name)))? {
            if let Some(kind) = not_a_file(st.st_mode) {
                return Err(AuditError::NotAFile {
                    path: at(name),
                    kind,
                });
            }
        }
    }
    if let Some(st) = dir.stat_entry(LOG_FILE).map_err(io_err(&log_path))? {
        let bytes = u64::try_from(st.st_size).unwrap_or(0);
        if bytes > 0 {
            return Ok(TrailState::Present { bytes });
        }
        evidence.push(format!(
            "{LOG_FILE} is empty (a trail is created with its first entry in it)"
        ));
    }
    let head_path = at(HEAD_FILE);
    if let Some(bytes) = dir.read(HEAD_FILE, 64 << 10).map_err(io_err(&head_path))? {
        evidence.push(match serde_json::from_slice::<Head>(&bytes) {
            Ok(head) => format!("{HEAD_FILE} records {} synced entries", head.seq),
            Err(_) => format!("{HEAD_FILE} exists"),
        });
    }
    if !key_created
        && dir
            .stat_entry(KEY_FILE)
            .map_err(io_err(&at(KEY_FILE)))?
            .is_some()
    {
        evidence.push(format!(
            "the key file {KEY_FILE} exists (created together with the first trail)"
        ));
    }
    if dir
        .stat_entry(PID_FILE)
        .map_err(io_err(&at(PID_FILE)))?
        .is_some()
    {
        evidence.push(format!(
            "{PID_FILE} exists (a controller ran here and did not stop cleanly)"
        ));
    }
    let workers_path = at(WORKERS_DIR);
    if let Some(workers) = dir
        .open_subdir(WORKERS_DIR)
        .map_err(io_err(&workers_path))?
    {
        let logs = workers.names().map_err(io_err(&workers_path))?.len();
        if logs > 0 {
            evidence.push(format!(
                "{WORKERS_DIR}/ holds {logs} worker log{} (workers ran here)",
                if logs == 1 { "" } else { "s" }
            ));
        }
    }
    if let Some((file, name)) = anchor {
        if let Some(e) = anchor::tally(file, name)?.evidence(name) {
            evidence.push(e);
        }
    }
    Ok(if evidence.is_empty() {
        TrailState::New
    } else {
        TrailState::Vanished { evidence }
    })
}

/// What a file of mode `mode` is, when it is not a regular file.
fn not_a_file(mode: libc::mode_t) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFLNK => Some("a symbolic link"),
        libc::S_IFDIR => Some("a directory"),
        libc::S_IFIFO => Some("a FIFO"),
        libc::S_IFSOCK => Some("a socket"),
        _ => Some("a device"),
    }
}

/// [`survey`] of the state directory at `dir`, with an anchor file if one is named (for
/// `audit verify`, which needs no key for it).
pub fn trail_state(dir: &Path, anchor: Option<&Path>) -> Result<TrailState, AuditError> {
    let held = Dir::open(dir).map_err(io_err(dir))?;
    let anchor = open_anchor_file(anchor)?;
    survey(&held, false, anchor.as_ref().map(|(f, n)| (f, n.as_str())))
}

fn open_anchor_file(path: Option<&Path>) -> Result<Option<(File, String)>, AuditError> {
    path.map(|p| Ok((anchor::open_for_reading(p)?, p.display().to_string())))
        .transpose()
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> AuditError + '_ {
    move |source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests;
