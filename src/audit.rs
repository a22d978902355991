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

pub use anchor::{Anchor, AnchorReport, AnchorTarget};

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
const KEY_FILE: &str = "controller.key";
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

/// How a controller begins with its trail (see [`AuditLog::start`]).
#[derive(Debug, Default)]
pub struct Start {
    /// `--new-audit-trail`: begin a trail where an earlier one vanished.
    pub new_trail: bool,
    /// The key file was created by this start (so it is no evidence of an earlier trail).
    pub key_created: bool,
    /// Checked against the trail now, written with every synced head from now on.
    pub anchor: Option<Anchor>,
    /// The controller's session, carried by every anchor line.
    pub session: String,
}

/// The writer side: one per controller.
pub struct AuditLog {
    /// The state directory, held open: every file of the trail is reached through it.
    dir: Dir,
    /// `None` until the first sync of a new trail creates the file with its entries.
    file: Option<File>,
    key: AuditKey,
    seq: u64,
    last_hash: String,
    /// The first entry's hash: the trail's identity in the anchor.
    first_hash: Option<String>,
    pending: Vec<u8>,
    anchor: Option<anchor::AnchorWriter>,
    session: String,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> AuditError + '_ {
    move |source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl AuditLog {
    /// Opens (or begins) the trail in `dir` with no anchor: [`AuditLog::start`] with
    /// the defaults.
    pub fn open(dir: &Path, key: AuditKey) -> Result<AuditLog, AuditError> {
        AuditLog::start(dir, key, Start::default())
    }

    /// Opens the trail in `dir` to continue it, or begins one, deciding by what the
    /// directory holds ([`survey`]):
    ///
    /// - a trail: its chain is verified, then checked against the anchor's heads; a
    ///   damaged or rolled-back trail is refused, never silently continued, and so is
    ///   `new_trail` (an existing trail is never replaced);
    /// - no trail, no evidence of one: a trail is begun;
    /// - no trail, but evidence of one: refused, unless `new_trail`.
    ///
    /// A trail begun here gets its first entry, `audit_trail_started`, synced before
    /// this returns: why it was begun and what evidence of an earlier trail there was.
    ///
    /// No thread is started here (the controller forks after this); the anchor's writer
    /// starts at the next sync.
    pub fn start(dir: &Path, key: AuditKey, start: Start) -> Result<AuditLog, AuditError> {
        let path = dir.join(LOG_FILE);
        let held = Dir::open(dir).map_err(io_err(dir))?;
        let anchor_file = match &start.anchor {
            Some(a) => a.read()?.map(|f| (f, a.target().to_string())),
            None => None,
        };
        let state = survey(
            &held,
            start.key_created,
            anchor_file.as_ref().map(|(f, n)| (f, n.as_str())),
        )?;
        let (summary, begin) = match state {
            TrailState::Present { bytes } => {
                if start.new_trail {
                    return Err(AuditError::TrailExists { path, bytes });
                }
                let summary = verify_in(&held, &key)?;
                if let Some((file, name)) = &anchor_file {
                    anchor::check(&held, &key, &summary, file, name)?;
                }
                (summary, None)
            }
            TrailState::New => {
                let reason = if start.new_trail {
                    "a new trail was asked for (--new-audit-trail); no earlier trail was found"
                } else {
                    "the first start in this state directory"
                };
                (VerifySummary::empty(), Some((reason, Vec::new())))
            }
            TrailState::Vanished { evidence } => {
                if !start.new_trail {
                    return Err(AuditError::Vanished { path, evidence });
                }
                let reason = "the earlier trail vanished (removed or emptied); a new one was begun with --new-audit-trail";
                (VerifySummary::empty(), Some((reason, evidence)))
            }
        };
        let file = match held.stat_entry(LOG_FILE).map_err(io_err(&path))? {
            Some(_) => Some(held.open_append(LOG_FILE, 0o600).map_err(io_err(&path))?),
            None => None,
        };
        let mut log = AuditLog {
            dir: held,
            file,
            key,
            seq: summary.entries,
            last_hash: summary.last_hash,
            first_hash: summary.first_hash,
            pending: Vec::new(),
            anchor: start.anchor.map(Anchor::into_writer),
            session: start.session,
        };
        if let Some(writer) = &mut log.anchor {
            writer.hold(true);
        }
        if let Some((reason, evidence)) = begin {
            log.record(
                event::AUDIT_TRAIL_STARTED,
                "controller",
                None,
                serde_json::json!({
                    "reason": reason,
                    "new_audit_trail": start.new_trail,
                    "evidence": evidence,
                    "key_created": start.key_created,
                }),
            )?;
        }
        if let Some(writer) = &mut log.anchor {
            writer.hold(false);
        }
        Ok(log)
    }

    /// Adds an entry (buffered until [`sync`](Self::sync)).
    pub fn append(
        &mut self,
        event: &str,
        actor: &str,
        worker_id: Option<&str>,
        details: serde_json::Value,
    ) -> AuditEntry {
        let mut entry = AuditEntry {
            seq: self.seq + 1,
            time: format_time(now_ms()),
            event: event.to_string(),
            actor: actor.to_string(),
            worker_id: worker_id.map(str::to_string),
            details,
            prev: self.last_hash.clone(),
            hash: String::new(),
            mac: String::new(),
        };
        entry.hash = entry.compute_hash();
        entry.mac = self.key.mac(entry.hash.as_bytes());
        if let Ok(line) = serde_json::to_vec(&entry) {
            self.pending.extend_from_slice(&line);
            self.pending.push(b'\n');
        }
        self.seq = entry.seq;
        self.last_hash = entry.hash.clone();
        if self.first_hash.is_none() {
            self.first_hash = Some(entry.hash.clone());
        }
        entry
    }

    /// Writes what is buffered, makes it durable, moves the head, and then hands the new
    /// head to the anchor. An anchor that is failing makes this an error too (after the
    /// trail itself was written): the caller treats it as a trail that cannot be written.
    pub fn sync(&mut self) -> Result<(), AuditError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let path = self.dir.path().join(LOG_FILE);
        match &mut self.file {
            Some(file) => {
                // A write cut short (a full disk) would leave half a line, which no later
                // entry could follow: cut the file back to where the whole lines end, and
                // keep the entries for the next try.
                let whole = file.metadata().map_err(io_err(&path))?.len();
                if let Err(e) = file
                    .write_all(&self.pending)
                    .and_then(|()| file.sync_data())
                {
                    let _ = file.set_len(whole);
                    return Err(io_err(&path)(e));
                }
            }
            None => self.file = Some(self.create_trail().map_err(io_err(&path))?),
        }
        self.pending.clear();
        let head = Head {
            seq: self.seq,
            hash: self.last_hash.clone(),
            mac: self.key.mac(&head_mac_input(self.seq, &self.last_hash)),
        };
        let head_path = self.dir.path().join(HEAD_FILE);
        let json = serde_json::to_vec(&head).unwrap_or_default();
        self.dir
            .write_atomically(HEAD_FILE, &json, 0o600)
            .map_err(io_err(&head_path))?;
        if let (Some(writer), Some(trail)) = (&mut self.anchor, &self.first_hash) {
            let line =
                anchor::AnchorLine::new(&self.key, trail, &self.session, self.seq, &self.last_hash);
            writer.submit(line.render())?;
        }
        Ok(())
    }

    /// Creates `audit.jsonl` with the pending entries already in it (a new file, made
    /// durable and only then given its name), so that the file is never seen empty: an
    /// empty trail file is evidence that a trail was emptied.
    fn create_trail(&self) -> io::Result<File> {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        let mut staged = self.dir.stage(LOG_FILE, 0o600)?;
        if let Err(e) = staged.file.write_all(&self.pending) {
            self.dir.discard(staged);
            return Err(e);
        }
        let keep = staged.file.try_clone()?;
        self.dir.publish(staged, LOG_FILE)?;
        let flags = fcntl(&keep, FcntlArg::F_GETFL).map_err(io::Error::from)?;
        let flags = OFlag::from_bits_truncate(flags) | OFlag::O_APPEND;
        fcntl(&keep, FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
        Ok(keep)
    }

    /// Appends and syncs: for decisions that must be on disk before they take effect.
    pub fn record(
        &mut self,
        event: &str,
        actor: &str,
        worker_id: Option<&str>,
        details: serde_json::Value,
    ) -> Result<AuditEntry, AuditError> {
        let e = self.append(event, actor, worker_id, details);
        self.sync()?;
        Ok(e)
    }

    pub fn len(&self) -> u64 {
        self.seq
    }

    pub fn is_empty(&self) -> bool {
        self.seq == 0
    }
}

/// What a successful verification saw.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifySummary {
    pub entries: u64,
    pub last_hash: String,
    /// The first entry's hash: names the trail in the anchor.
    pub first_hash: Option<String>,
    /// The trail was begun with `--new-audit-trail` (its first entry says so): anchored
    /// heads of an earlier trail of the same key are expected.
    pub new_trail: bool,
}

impl VerifySummary {
    fn empty() -> VerifySummary {
        VerifySummary {
            entries: 0,
            last_hash: GENESIS.to_string(),
            first_hash: None,
            new_trail: false,
        }
    }
}

/// Reads one line (bounded); `Ok(None)` at the end.
fn read_line(r: &mut impl BufRead, buf: &mut Vec<u8>) -> io::Result<Option<()>> {
    buf.clear();
    let n = r
        .by_ref()
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(()))
}

/// Checks the trail in `dir`: first that it has not vanished ([`survey`]), then every
/// entry's sequence, chain link, hash and MAC, and the head. Returns the first problem
/// found.
pub fn verify(dir: &Path, key: &AuditKey) -> Result<VerifySummary, AuditError> {
    verify_with_anchor(dir, key, None).map(|(summary, _)| summary)
}

/// [`verify`], and then the trail against the heads an anchor file holds
/// ([`anchor::check`]); an anchor with heads is evidence of a trail too.
pub fn verify_with_anchor(
    dir: &Path,
    key: &AuditKey,
    anchor_path: Option<&Path>,
) -> Result<(VerifySummary, Option<AnchorReport>), AuditError> {
    let held = Dir::open(dir).map_err(io_err(dir))?;
    let anchor = open_anchor_file(anchor_path)?;
    let anchor = anchor.as_ref().map(|(f, n)| (f, n.as_str()));
    match survey(&held, false, anchor)? {
        TrailState::Vanished { evidence } => {
            return Err(AuditError::Vanished {
                path: dir.join(LOG_FILE),
                evidence,
            });
        }
        TrailState::New | TrailState::Present { .. } => {}
    }
    let summary = verify_in(&held, key)?;
    let report = match anchor {
        Some((file, name)) => Some(anchor::check(&held, key, &summary, file, name)?),
        None => None,
    };
    Ok((summary, report))
}

/// Checks the chain and the head of the trail in `dir` only, without asking whether a
/// trail should be there: an emptied trail with its head removed passes as "0 entries".
/// [`verify`] is the check to use; this is the part of it the chain can answer.
pub fn verify_chain(dir: &Path, key: &AuditKey) -> Result<VerifySummary, AuditError> {
    let held = Dir::open(dir).map_err(io_err(dir))?;
    verify_in(&held, key)
}

/// Opens a file of the trail (never through a symlink, never blocking on a FIFO).
fn open_trail_file(dir: &Dir, name: &str) -> Result<File, AuditError> {
    let path = dir.path().join(name);
    dir.open_read(name)
        .map_err(io_err(&path))?
        .ok_or_else(|| io_err(&path)(io::Error::from(io::ErrorKind::NotFound)))
}

fn verify_in(dir: &Dir, key: &AuditKey) -> Result<VerifySummary, AuditError> {
    let path = dir.path().join(LOG_FILE);
    let damaged = |line: u64, reason: String| AuditError::Damaged {
        path: path.clone(),
        line,
        reason,
    };
    let file = open_trail_file(dir, LOG_FILE)?;
    let mut reader = BufReader::new(file);
    let mut buf = Vec::new();
    let mut expected_seq = 1u64;
    let mut prev = GENESIS.to_string();
    let mut first_hash = None;
    let mut new_trail = false;
    while read_line(&mut reader, &mut buf)
        .map_err(io_err(&path))?
        .is_some()
    {
        let n = expected_seq;
        if buf.last() != Some(&b'\n') {
            return Err(damaged(
                n,
                "truncated line (no newline) or longer than 256 KiB".into(),
            ));
        }
        let entry: AuditEntry = serde_json::from_slice(&buf[..buf.len() - 1])
            .map_err(|e| damaged(n, format!("not a valid entry: {e}")))?;
        if entry.seq != expected_seq {
            return Err(damaged(
                n,
                format!(
                    "sequence number {} where {expected_seq} was expected (an entry was deleted, inserted or moved)",
                    entry.seq
                ),
            ));
        }
        if entry.prev != prev {
            return Err(damaged(
                n,
                "does not link to the entry before it (deleted, inserted or reordered entries)"
                    .into(),
            ));
        }
        if entry.compute_hash() != entry.hash {
            return Err(damaged(
                n,
                "its content does not match its hash (the entry was edited)".into(),
            ));
        }
        if !key.check(entry.hash.as_bytes(), &entry.mac) {
            return Err(damaged(
                n,
                "its MAC is not valid under this controller's key (the chain was rewritten)".into(),
            ));
        }
        if expected_seq == 1 {
            first_hash = Some(entry.hash.clone());
            new_trail = entry.event == event::AUDIT_TRAIL_STARTED
                && entry.details["new_audit_trail"] == serde_json::Value::Bool(true);
        }
        prev = entry.hash;
        expected_seq += 1;
    }
    let entries = expected_seq - 1;
    let head_path = dir.path().join(HEAD_FILE);
    match dir.read(HEAD_FILE, 64 << 10).map_err(io_err(&head_path))? {
        Some(bytes) => {
            let head: Head = serde_json::from_slice(&bytes)
                .map_err(|e| damaged(entries, format!("the head file is not valid: {e}")))?;
            if !key.check(&head_mac_input(head.seq, &head.hash), &head.mac) {
                return Err(damaged(entries, "the head file's MAC is not valid".into()));
            }
            if head.seq > entries {
                return Err(damaged(
                    entries + 1,
                    format!(
                        "the trail ends at entry {entries} but {} were written (entries cut off the end)",
                        head.seq
                    ),
                ));
            }
            // Entries after the head are ones appended but not yet synced when the writer
            // stopped: fine, they still chain and carry valid MACs.
            if head.seq > 0 && head.seq <= entries {
                // Re-read to check the head's hash matches that entry.
                let at = entry_hash_at(open_trail_file(dir, LOG_FILE)?, head.seq)
                    .map_err(io_err(&path))?;
                if at.as_deref() != Some(head.hash.as_str()) {
                    return Err(damaged(
                        head.seq,
                        "does not match the head file (the end of the trail was rewritten)".into(),
                    ));
                }
            }
        }
        None if entries == 0 => {}
        None => {
            return Err(damaged(entries, "the head file is missing".into()));
        }
    }
    Ok(VerifySummary {
        entries,
        last_hash: prev,
        first_hash,
        new_trail,
    })
}

fn entry_hash_at(file: File, seq: u64) -> io::Result<Option<String>> {
    let mut reader = BufReader::new(file);
    let mut buf = Vec::new();
    let mut n = 0;
    while read_line(&mut reader, &mut buf)?.is_some() {
        n += 1;
        if n == seq {
            return Ok(serde_json::from_slice::<AuditEntry>(buf.trim_ascii_end())
                .ok()
                .map(|e| e.hash));
        }
    }
    Ok(None)
}

/// Reads every entry (for `audit tail`), skipping nothing: a malformed line is an error.
pub fn read_entries(dir: &Path) -> Result<Vec<AuditEntry>, AuditError> {
    let path = dir.join(LOG_FILE);
    let held = Dir::open(dir).map_err(io_err(dir))?;
    let mut reader = BufReader::new(open_trail_file(&held, LOG_FILE)?);
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while read_line(&mut reader, &mut buf)
        .map_err(io_err(&path))?
        .is_some()
    {
        let e: AuditEntry =
            serde_json::from_slice(buf.trim_ascii_end()).map_err(|e| AuditError::Damaged {
                path: path.clone(),
                line: out.len() as u64 + 1,
                reason: format!("not a valid entry: {e}"),
            })?;
        out.push(e);
    }
    Ok(out)
}

/// One entry as a line a person reads.
pub fn describe(e: &AuditEntry) -> String {
    let worker = e
        .worker_id
        .as_deref()
        .map(|w| format!(" worker={w}"))
        .unwrap_or_default();
    let details = match &e.details {
        serde_json::Value::Null => String::new(),
        serde_json::Value::Object(m) if m.is_empty() => String::new(),
        v => format!(" {v}"),
    };
    format!(
        "{:>6} {} {:<26} {}{worker}{details}",
        e.seq, e.time, e.event, e.actor
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> AuditKey {
        AuditKey::new(b"test key of thirty-two bytes!!!!")
    }

    fn trail(n: u64) -> Result<tempfile::TempDir, AuditError> {
        let dir = tempfile::tempdir().map_err(|e| io_err(Path::new("tmp"))(e))?;
        let mut log = AuditLog::open(dir.path(), key())?;
        for i in 0..n {
            log.append(
                event::DENY_QUOTA,
                "controller",
                Some(&format!("w{i}")),
                json!({"active": i}),
            );
        }
        log.sync()?;
        Ok(dir)
    }

    fn lines(dir: &Path) -> Vec<String> {
        std::fs::read_to_string(dir.join(LOG_FILE))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    fn write_lines(dir: &Path, lines: &[String]) {
        let _ = std::fs::write(dir.join(LOG_FILE), lines.join("\n") + "\n");
    }

    fn damaged_at(dir: &Path) -> Option<u64> {
        match verify(dir, &key()) {
            Err(AuditError::Damaged { line, .. }) => Some(line),
            _ => None,
        }
    }

    #[test]
    fn an_intact_trail_verifies_and_continues_after_reopen() -> Result<(), AuditError> {
        let dir = trail(5)?;
        // The five and the first entry, which begins the trail.
        assert_eq!(verify(dir.path(), &key())?.entries, 6);
        let mut log = AuditLog::open(dir.path(), key())?;
        log.record(event::REAP_STALE, "controller", None, json!({}))?;
        assert_eq!(verify(dir.path(), &key())?.entries, 7);
        Ok(())
    }

    #[test]
    fn a_trail_begins_with_an_entry_saying_why() -> Result<(), AuditError> {
        let dir = trail(0)?;
        let entries = read_entries(dir.path())?;
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].event, event::AUDIT_TRAIL_STARTED);
        assert_eq!(entries[0].details["new_audit_trail"], json!(false));
        assert_eq!(
            entries[0].details["reason"],
            json!("the first start in this state directory")
        );
        Ok(())
    }

    fn wipe(dir: &Path) {
        let _ = std::fs::write(dir.join(LOG_FILE), "");
        let _ = std::fs::remove_file(dir.join(HEAD_FILE));
    }

    #[test]
    fn an_emptied_trail_without_its_head_is_vanished_not_intact() -> Result<(), AuditError> {
        let dir = trail(3)?;
        let _ = std::fs::write(dir.path().join(KEY_FILE), "");
        wipe(dir.path());
        // What the chain alone says: nothing wrong with zero entries.
        assert_eq!(verify_chain(dir.path(), &key())?.entries, 0);
        match verify(dir.path(), &key()) {
            Err(AuditError::Vanished { evidence, .. }) => {
                assert!(
                    evidence.iter().any(|e| e.contains("audit.jsonl is empty")),
                    "{evidence:?}"
                );
                assert!(
                    evidence.iter().any(|e| e.contains("controller.key")),
                    "{evidence:?}"
                );
            }
            other => panic!("{other:?}"),
        }
        Ok(())
    }

    #[test]
    fn a_removed_trail_is_refused_and_begun_anew_only_when_asked() -> Result<(), AuditError> {
        let dir = trail(3)?;
        let _ = std::fs::remove_file(dir.path().join(LOG_FILE));
        // The head alone is evidence.
        assert!(matches!(
            AuditLog::open(dir.path(), key()),
            Err(AuditError::Vanished { .. })
        ));
        let start = Start {
            new_trail: true,
            ..Start::default()
        };
        drop(AuditLog::start(dir.path(), key(), start)?);
        let entries = read_entries(dir.path())?;
        assert_eq!(entries[0].seq, 1);
        assert_eq!(entries[0].event, event::AUDIT_TRAIL_STARTED);
        assert_eq!(entries[0].details["new_audit_trail"], json!(true));
        assert!(
            entries[0].details["evidence"]
                .to_string()
                .contains("audit.head records 4 synced entries"),
            "{}",
            entries[0].details
        );
        assert_eq!(verify(dir.path(), &key())?.entries, 1);
        Ok(())
    }

    #[test]
    fn a_new_trail_is_never_begun_over_an_existing_one() -> Result<(), AuditError> {
        let dir = trail(2)?;
        let before = lines(dir.path());
        let start = Start {
            new_trail: true,
            ..Start::default()
        };
        assert!(matches!(
            AuditLog::start(dir.path(), key(), start),
            Err(AuditError::TrailExists { .. })
        ));
        assert_eq!(lines(dir.path()), before);
        Ok(())
    }

    #[test]
    fn a_new_state_directory_is_not_taken_for_a_vanished_trail() -> Result<(), AuditError> {
        let dir = tempfile::tempdir().map_err(|e| io_err(Path::new("tmp"))(e))?;
        // What a start that failed before its first entry leaves behind.
        let _ = std::fs::write(dir.path().join("controller.lock"), "");
        let _ = std::fs::create_dir(dir.path().join(WORKERS_DIR));
        let _ = std::fs::write(dir.path().join(KEY_FILE), "");
        let start = Start {
            key_created: true,
            ..Start::default()
        };
        drop(AuditLog::start(dir.path(), key(), start)?);
        assert_eq!(verify(dir.path(), &key())?.entries, 1);
        Ok(())
    }

    #[test]
    fn worker_logs_and_a_pid_file_are_evidence_of_a_trail() -> Result<(), AuditError> {
        let dir = tempfile::tempdir().map_err(|e| io_err(Path::new("tmp"))(e))?;
        let _ = std::fs::create_dir(dir.path().join(WORKERS_DIR));
        let _ = std::fs::write(dir.path().join(WORKERS_DIR).join("w-1.log"), "x");
        let _ = std::fs::write(dir.path().join(PID_FILE), "1\n");
        match trail_state(dir.path(), None)? {
            TrailState::Vanished { evidence } => assert_eq!(evidence.len(), 2, "{evidence:?}"),
            other => panic!("{other:?}"),
        }
        Ok(())
    }

    #[test]
    fn an_edited_entry_is_found() -> Result<(), AuditError> {
        let dir = trail(5)?;
        let mut l = lines(dir.path());
        l[2] = l[2].replace("deny_quota", "replication_requested");
        write_lines(dir.path(), &l);
        assert_eq!(damaged_at(dir.path()), Some(3));
        Ok(())
    }

    #[test]
    fn a_deleted_entry_is_found() -> Result<(), AuditError> {
        let dir = trail(5)?;
        let mut l = lines(dir.path());
        l.remove(1);
        write_lines(dir.path(), &l);
        assert_eq!(damaged_at(dir.path()), Some(2));
        Ok(())
    }

    #[test]
    fn reordered_entries_are_found() -> Result<(), AuditError> {
        let dir = trail(5)?;
        let mut l = lines(dir.path());
        l.swap(1, 3);
        write_lines(dir.path(), &l);
        assert_eq!(damaged_at(dir.path()), Some(2));
        Ok(())
    }

    #[test]
    fn an_inserted_entry_is_found() -> Result<(), AuditError> {
        let dir = trail(3)?;
        let mut l = lines(dir.path());
        let copy = l[1].clone();
        l.insert(2, copy);
        write_lines(dir.path(), &l);
        assert_eq!(damaged_at(dir.path()), Some(3));
        Ok(())
    }

    #[test]
    fn entries_cut_off_the_end_are_found() -> Result<(), AuditError> {
        let dir = trail(5)?;
        let mut l = lines(dir.path());
        l.truncate(3);
        write_lines(dir.path(), &l);
        assert_eq!(damaged_at(dir.path()), Some(4));
        Ok(())
    }

    #[test]
    fn a_rewritten_chain_without_the_key_is_found() -> Result<(), AuditError> {
        let dir = trail(3)?;
        // Recompute hashes consistently after an edit, as an attacker without the key could.
        let mut entries = read_entries(dir.path())?;
        entries[0].event = "worker_started".into();
        let mut prev = GENESIS.to_string();
        for e in &mut entries {
            e.prev = prev.clone();
            e.hash = e.compute_hash();
            prev = e.hash.clone();
        }
        let l: Vec<String> = entries
            .iter()
            .filter_map(|e| serde_json::to_string(e).ok())
            .collect();
        write_lines(dir.path(), &l);
        assert_eq!(damaged_at(dir.path()), Some(1));
        Ok(())
    }

    #[test]
    fn a_damaged_trail_is_refused_on_open() -> Result<(), AuditError> {
        let dir = trail(3)?;
        let mut l = lines(dir.path());
        l.remove(0);
        write_lines(dir.path(), &l);
        assert!(AuditLog::open(dir.path(), key()).is_err());
        Ok(())
    }

    #[test]
    fn times_format_as_rfc3339() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(1_795_367_384_123), "2026-11-22T17:09:44.123Z");
        assert_eq!(format_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn keys_are_never_printed() {
        assert_eq!(format!("{:?}", key()), "AuditKey(<redacted>)");
    }
}
