//! The audit anchor: every synced head of the trail, also written to a place outside the
//! state directory, so that a trail put back to an older copy (or cut, or rewritten) no
//! longer matches what was anchored.
//!
//! The trail and its head file live in the state directory; whoever can write there can
//! put back an older copy of both, and the older copy is a perfectly valid chain. The
//! anchor remembers the heads that were written: an append-only file (best made
//! append-only with `chattr +a`, on another filesystem) or syslog/journald (best forwarded
//! to another host). Each line is
//!
//! ```text
//! hatchery-audit-anchor v1 key=K trail=T session=S seq=N hash=H time=RFC3339 mac=M
//! ```
//!
//! `key` names the controller key (a MAC of a fixed label, not the key), `trail` is the
//! hash of the trail's first entry, `seq`/`hash` the synced head, and `mac` an HMAC under
//! the audit key of all the other fields: a line appended by someone without the key is
//! found. A line is found wherever the marker appears in it, so the output of `journalctl
//! -t hatchery-audit -o cat`, a syslog file and the anchor file itself all read alike.
//!
//! Writing never waits for the anchor: lines go to a writer thread through a queue. An
//! anchor that fails, stalls or falls behind makes [`AnchorWriter::submit`] (and so the
//! trail's sync) report an error, which the controller treats as it treats a trail that
//! cannot be written: it engages the kill switch.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, BufReader, Seek, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::stat::SFlag;

use super::{AuditEntry, AuditError, AuditKey, LOG_FILE, VerifySummary, read_line};
use crate::paths::Dir;

/// What starts an anchor line (and finds it inside a syslog line).
pub const MARKER: &str = "hatchery-audit-anchor";
const VERSION: &str = "v1";
/// The syslog identifier (`journalctl -t hatchery-audit`).
pub const SYSLOG_TAG: &str = "hatchery-audit";
/// The local syslog socket (journald's or a syslog daemon's).
pub const DEFAULT_SYSLOG: &str = "/dev/log";
/// `LOG_AUTHPRIV | LOG_NOTICE`: security records, kept where ordinary users cannot read.
const SYSLOG_PRIORITY: u8 = 10 * 8 + 5;
/// A write of the anchor taking longer than this counts as a failure.
const STALL: Duration = Duration::from_secs(10);
/// Heads waiting for the writer beyond this many: the oldest are dropped (each later
/// head covers them) and the anchor counts as failing.
const MAX_QUEUED: usize = 4096;
/// How often a failing anchor is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// How long a closing writer may take to write what is queued.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

mod writer;
pub use writer::{Anchor, AnchorWriter, open_for_reading};

/// Where the anchor goes: `PATH`, `syslog` (`/dev/log`) or `syslog:SOCKET`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnchorTarget {
    File(PathBuf),
    Syslog(PathBuf),
}

impl FromStr for AnchorTarget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "syslog" {
            return Ok(AnchorTarget::Syslog(PathBuf::from(DEFAULT_SYSLOG)));
        }
        if let Some(socket) = s.strip_prefix("syslog:") {
            if socket.is_empty() {
                return Err(
                    "syslog: needs a socket path after the colon (or plain `syslog` for /dev/log)"
                        .into(),
                );
            }
            return Ok(AnchorTarget::Syslog(PathBuf::from(socket)));
        }
        if s.is_empty() {
            return Err("an empty anchor path".into());
        }
        Ok(AnchorTarget::File(PathBuf::from(s)))
    }
}

impl std::fmt::Display for AnchorTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnchorTarget::File(p) => write!(f, "{}", p.display()),
            AnchorTarget::Syslog(p) => write!(f, "syslog:{}", p.display()),
        }
    }
}

/// The anchor's name for a controller key: a MAC of a fixed label, so lines of other
/// controllers (sharing a journal) are told apart without revealing anything.
pub fn key_id(key: &AuditKey) -> String {
    key.mac(b"hatchery audit anchor key id v1")
        .get(..16)
        .map(str::to_string)
        .unwrap_or_default()
}

/// One anchored head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnchorLine {
    pub key: String,
    pub trail: String,
    pub session: String,
    pub seq: u64,
    pub hash: String,
    pub time: String,
    pub mac: String,
}

fn is_hex(s: &str, min: usize, max: usize) -> bool {
    (min..=max).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl AnchorLine {
    /// The anchor line for a synced head, MACed under `key`.
    pub fn new(key: &AuditKey, trail: &str, session: &str, seq: u64, hash: &str) -> AnchorLine {
        let mut line = AnchorLine {
            key: key_id(key),
            trail: trail.to_string(),
            session: session.to_string(),
            seq,
            hash: hash.to_string(),
            time: super::format_time(super::now_ms()),
            mac: String::new(),
        };
        line.mac = key.mac(&line.mac_input());
        line
    }

    fn mac_input(&self) -> Vec<u8> {
        format!(
            "anchor:{VERSION}:{}:{}:{}:{}:{}:{}",
            self.key, self.trail, self.session, self.seq, self.hash, self.time
        )
        .into_bytes()
    }

    /// Whether the MAC is this key's.
    pub fn mac_valid(&self, key: &AuditKey) -> bool {
        key.check(&self.mac_input(), &self.mac)
    }

    pub fn render(&self) -> String {
        format!(
            "{MARKER} {VERSION} key={} trail={} session={} seq={} hash={} time={} mac={}",
            self.key, self.trail, self.session, self.seq, self.hash, self.time, self.mac
        )
    }

    /// Finds an anchor line in `text` (the last marker in it: a torn write followed by a
    /// whole line reads as the whole line). `Ok(None)`: no marker, not an anchor line.
    pub fn parse(text: &str) -> Result<Option<AnchorLine>, String> {
        let Some(at) = text.rfind(&format!("{MARKER} ")) else {
            return Ok(None);
        };
        let mut tokens = text.get(at..).unwrap_or_default().split_ascii_whitespace();
        tokens.next();
        match tokens.next() {
            Some(VERSION) => {}
            Some(v) => return Err(format!("unknown anchor version {v:?}")),
            None => return Err("no version".into()),
        }
        let mut field = |name: &str| -> Result<String, String> {
            let token = tokens.next().ok_or_else(|| format!("no {name}="))?;
            match token.split_once('=') {
                Some((k, v)) if k == name => Ok(v.to_string()),
                _ => Err(format!("{token:?} where {name}= was expected")),
            }
        };
        let key = field("key")?;
        let trail = field("trail")?;
        let session = field("session")?;
        let seq = field("seq")?;
        let hash = field("hash")?;
        let time = field("time")?;
        let mac = field("mac")?;
        if let Some(extra) = tokens.next() {
            return Err(format!("unexpected {extra:?} after mac="));
        }
        let seq: u64 = seq
            .parse()
            .map_err(|_| format!("seq={seq:?} is not a number"))?;
        let checks = [
            ("key", is_hex(&key, 16, 16)),
            ("trail", is_hex(&trail, 64, 64)),
            ("session", is_hex(&session, 1, 64)),
            ("seq", seq > 0),
            ("hash", is_hex(&hash, 64, 64)),
            (
                "time",
                (1..=40).contains(&time.len())
                    && time
                        .bytes()
                        .all(|b| b.is_ascii_digit() || b"-:.TZ".contains(&b)),
            ),
            ("mac", is_hex(&mac, 64, 64)),
        ];
        if let Some((name, _)) = checks.iter().find(|(_, ok)| !ok) {
            return Err(format!("{name}= is not well formed"));
        }
        Ok(Some(AnchorLine {
            key,
            trail,
            session,
            seq,
            hash,
            time,
            mac,
        }))
    }
}

fn anchor_err(anchor: &str, line: Option<u64>, reason: impl Into<String>) -> AuditError {
    AuditError::Anchor {
        anchor: anchor.to_string(),
        line,
        reason: reason.into(),
    }
}

/// Calls `each` with every anchor line of a file (and its line number); a line that
/// carries the marker but is not well formed is an error. A last line without a newline
/// is a write torn by a crash or a full disk: skipped.
fn for_each_line(
    file: &File,
    name: &str,
    mut each: impl FnMut(u64, AnchorLine) -> Result<(), AuditError>,
) -> Result<(), AuditError> {
    let mut reader = BufReader::new(rewound(file, name)?);
    let mut buf = Vec::new();
    let mut n = 0u64;
    while read_line(&mut reader, &mut buf)
        .map_err(|e| anchor_err(name, None, format!("cannot be read: {e}")))?
        .is_some()
    {
        n = n.saturating_add(1);
        if buf.last() != Some(&b'\n') {
            continue;
        }
        let text = String::from_utf8_lossy(&buf);
        match AnchorLine::parse(&text) {
            Ok(Some(line)) => each(n, line)?,
            Ok(None) => {}
            Err(reason) => {
                return Err(anchor_err(
                    name,
                    Some(n),
                    format!("not a valid anchor line: {reason}"),
                ));
            }
        }
    }
    Ok(())
}

/// What an anchor holds, read without the key: evidence that a trail was kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub heads: u64,
    /// The last line's trail and seq.
    pub last: Option<(String, u64)>,
}

/// Reads `file` from its start (it may have been read before).
fn rewound<'a>(file: &'a File, name: &str) -> Result<&'a File, AuditError> {
    let mut f = file;
    f.rewind()
        .map_err(|e| anchor_err(name, None, format!("cannot be read: {e}")))?;
    Ok(f)
}

/// Counts the anchor lines of a file (any key, not checked further).
pub fn tally(file: &File, name: &str) -> Result<Tally, AuditError> {
    let mut t = Tally::default();
    let mut reader = BufReader::new(rewound(file, name)?);
    let mut buf = Vec::new();
    while read_line(&mut reader, &mut buf)
        .map_err(|e| anchor_err(name, None, format!("cannot be read: {e}")))?
        .is_some()
    {
        let text = String::from_utf8_lossy(&buf);
        match AnchorLine::parse(&text) {
            Ok(Some(line)) => {
                t.heads = t.heads.saturating_add(1);
                t.last = Some((line.trail, line.seq));
            }
            Ok(None) => {}
            Err(_) => t.heads = t.heads.saturating_add(1),
        }
    }
    Ok(t)
}

impl Tally {
    /// The evidence sentence, or `None` for an anchor with no heads.
    pub fn evidence(&self, name: &str) -> Option<String> {
        if self.heads == 0 {
            return None;
        }
        let last = match &self.last {
            Some((trail, seq)) => format!(
                "; the last: entry {seq} of trail {}",
                trail.get(..12).unwrap_or(trail)
            ),
            None => String::new(),
        };
        Some(format!(
            "the anchor {name} holds {} anchored head{}{last}",
            self.heads,
            if self.heads == 1 { "" } else { "s" }
        ))
    }
}

/// What checking a trail against an anchor found (it matched).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct AnchorReport {
    pub anchor: String,
    /// Heads of this trail found in the anchor and matched.
    pub heads_checked: u64,
    pub last_anchored_seq: Option<u64>,
    /// Lines of other controllers' keys (a shared journal): not checkable, skipped.
    pub other_key_lines: u64,
    /// Lines of an earlier trail of this key, which this trail records replacing.
    pub earlier_trail_lines: u64,
}

/// Checks the verified trail in `dir` against an anchor: every line must carry a valid
/// MAC if it names this controller's key, and every head anchored for this trail must be
/// in it with the same hash (a trail longer than the last anchored head is fine). The
/// first anchored seq that is missing or different is named.
pub fn check(
    dir: &Dir,
    key: &AuditKey,
    summary: &VerifySummary,
    anchor: &File,
    name: &str,
) -> Result<AnchorReport, AuditError> {
    let mine = key_id(key);
    let trail_path = dir.path().join(LOG_FILE);
    let mut report = AnchorReport {
        anchor: name.to_string(),
        ..AnchorReport::default()
    };
    // This trail's anchored heads: seq → (hash, line); two different hashes anchored
    // for one seq keep the first (the other shows up as a mismatch or is the later one).
    let mut anchored: BTreeMap<u64, Vec<(String, u64)>> = BTreeMap::new();
    let mut earlier: Option<(String, u64, u64)> = None;
    for_each_line(anchor, name, |n, line| {
        if line.key != mine {
            report.other_key_lines = report.other_key_lines.saturating_add(1);
            return Ok(());
        }
        if !line.mac_valid(key) {
            return Err(anchor_err(
                name,
                Some(n),
                "its MAC is not valid under this controller's key (a forged line)",
            ));
        }
        if summary.first_hash.as_deref() == Some(line.trail.as_str()) {
            let heads = anchored.entry(line.seq).or_default();
            if !heads.iter().any(|(h, _)| *h == line.hash) {
                heads.push((line.hash, n));
            }
        } else {
            report.earlier_trail_lines = report.earlier_trail_lines.saturating_add(1);
            if earlier.is_none() {
                earlier = Some((line.trail, line.seq, n));
            }
        }
        Ok(())
    })?;
    if let Some((trail, seq, n)) = earlier {
        if !summary.new_trail {
            return Err(AuditError::RolledBack {
                path: trail_path,
                anchor: name.to_string(),
                seq: 1,
                reason: format!(
                    "the anchor holds entry {seq} of another trail of this controller's key (trail {}, line {n}), and this trail does not record replacing it (it was swapped for another)",
                    trail.get(..12).unwrap_or(&trail)
                ),
            });
        }
    }
    let mut hashes = TrailHashes::open(dir)?;
    for (seq, heads) in &anchored {
        for (hash, n) in heads {
            match hashes.at(*seq)? {
                None => {
                    return Err(AuditError::RolledBack {
                        path: trail_path,
                        anchor: name.to_string(),
                        seq: *seq,
                        reason: format!(
                            "anchored (line {n}) but missing: the trail ends at entry {} (rolled back or cut)",
                            summary.entries
                        ),
                    });
                }
                Some(h) if h != *hash => {
                    return Err(AuditError::RolledBack {
                        path: trail_path,
                        anchor: name.to_string(),
                        seq: *seq,
                        reason: format!(
                            "differs from the head anchored at line {n} (rolled back to another copy, or rewritten)"
                        ),
                    });
                }
                Some(_) => {
                    report.heads_checked = report.heads_checked.saturating_add(1);
                    report.last_anchored_seq = Some(*seq);
                }
            }
        }
    }
    Ok(report)
}

/// Reads a verified trail's hashes in order.
struct TrailHashes {
    reader: BufReader<File>,
    buf: Vec<u8>,
    seq: u64,
    hash: Option<String>,
    path: PathBuf,
}

impl TrailHashes {
    fn open(dir: &Dir) -> Result<TrailHashes, AuditError> {
        let path = dir.path().join(LOG_FILE);
        let file = super::open_trail_file(dir, LOG_FILE)?;
        Ok(TrailHashes {
            reader: BufReader::new(file),
            buf: Vec::new(),
            seq: 0,
            hash: None,
            path,
        })
    }

    /// The hash of entry `seq` (at or after the last one asked for), `None` past the end.
    fn at(&mut self, seq: u64) -> Result<Option<String>, AuditError> {
        while self.seq < seq {
            let more =
                read_line(&mut self.reader, &mut self.buf).map_err(|source| AuditError::Io {
                    path: self.path.clone(),
                    source,
                })?;
            if more.is_none() {
                return Ok(None);
            }
            self.seq = self.seq.saturating_add(1);
            self.hash = serde_json::from_slice::<AuditEntry>(self.buf.trim_ascii_end())
                .ok()
                .map(|e| e.hash);
        }
        Ok(self.hash.clone())
    }
}

#[cfg(test)]
mod tests;
