//! Checking a trail: every entry's hash chain and MAC, the head it must end at, and the
//! anchor it must agree with; reading entries back for `audit tail`.

use super::*;

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
    /// Workers whose egress broker was running when the trail ended.
    pub open_egress: OpenEgress,
    /// Bytes of a partial last line after the head: an append cut short by a crash or a
    /// power loss before its sync, so never reported durable (0: none).
    pub torn_tail: u64,
}

impl VerifySummary {
    pub(super) fn empty() -> VerifySummary {
        VerifySummary {
            entries: 0,
            last_hash: GENESIS.to_string(),
            first_hash: None,
            new_trail: false,
            open_egress: OpenEgress::default(),
            torn_tail: 0,
        }
    }
}

/// Reads one line (bounded); `Ok(None)` at the end.
pub(super) fn read_line(r: &mut impl BufRead, buf: &mut Vec<u8>) -> io::Result<Option<()>> {
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

/// The checks every line of a trail passes, in order: its sequence number, its link to
/// the entry before it, its hash, its MAC (where the key is known), and its bytes being
/// exactly those the controller writes.
struct Chain<'k> {
    key: Option<&'k AuditKey>,
    expected_seq: u64,
    prev: String,
}

impl<'k> Chain<'k> {
    fn new(key: Option<&'k AuditKey>) -> Chain<'k> {
        Chain {
            key,
            expected_seq: 1,
            prev: GENESIS.to_string(),
        }
    }

    /// The entry `line` (with its newline) holds, if it is the next one of the chain;
    /// else why not.
    fn next(&mut self, line: &[u8]) -> Result<AuditEntry, String> {
        let Some(body) = line.strip_suffix(b"\n") else {
            return Err("truncated line (no newline) or longer than 256 KiB".into());
        };
        let entry: AuditEntry = serde_json::from_slice(body).map_err(|e| {
            // The parser quotes the line's values, however long.
            format!(
                "not a valid entry: {}",
                crate::text::clip(&e.to_string(), 300)
            )
        })?;
        if entry.seq != self.expected_seq {
            return Err(format!(
                "sequence number {} where {} was expected (an entry was deleted, inserted or moved)",
                entry.seq, self.expected_seq
            ));
        }
        if entry.prev != self.prev {
            return Err(
                "does not link to the entry before it (deleted, inserted or reordered entries)"
                    .into(),
            );
        }
        if entry.compute_hash() != entry.hash {
            return Err("its content does not match its hash (the entry was edited)".into());
        }
        if let Some(key) = self.key {
            if !key.check(entry.hash.as_bytes(), &entry.mac) {
                return Err(
                    "its MAC is not valid under this controller's key (the chain was rewritten)"
                        .into(),
                );
            }
        }
        // The hash covers the entry as parsed; the line must be that entry exactly as the
        // controller writes it, or one reader could be shown what another is not (a key
        // given twice, of which a parser keeps the last and a person reads the first).
        if serde_json::to_vec(&entry).ok().as_deref() != Some(body) {
            return Err("its bytes are not as the controller writes the entry it holds (a key given twice, added spaces or another spelling): what one reader shows may not be what the hash covers".into());
        }
        self.prev = entry.hash.clone();
        self.expected_seq = self.expected_seq.saturating_add(1);
        Ok(entry)
    }
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
pub(super) fn open_trail_file(dir: &Dir, name: &str) -> Result<File, AuditError> {
    let path = dir.path().join(name);
    dir.open_read(name)
        .map_err(io_err(&path))?
        .ok_or_else(|| io_err(&path)(io::Error::from(io::ErrorKind::NotFound)))
}

pub(super) fn verify_in(dir: &Dir, key: &AuditKey) -> Result<VerifySummary, AuditError> {
    let path = dir.path().join(LOG_FILE);
    let damaged = |line: u64, reason: String| AuditError::Damaged {
        path: path.clone(),
        line,
        reason,
    };
    // The head first: a controller appending meanwhile moves it only after the entries
    // it names are in the trail, so read in this order the trail holds them; and the
    // entry it names is seen as the trail goes by (no second reading).
    let head_path = dir.path().join(HEAD_FILE);
    let head_bytes = dir.read(HEAD_FILE, 64 << 10).map_err(io_err(&head_path))?;
    let head_seq = head_bytes
        .as_deref()
        .and_then(|b| serde_json::from_slice::<Head>(b).ok())
        .map(|h| h.seq);
    let mut hash_at_head = None;
    let file = open_trail_file(dir, LOG_FILE)?;
    let mut reader = BufReader::new(file);
    let mut buf = Vec::new();
    let mut chain = Chain::new(Some(key));
    let mut first_hash = None;
    let mut new_trail = false;
    let mut open_egress = OpenEgress::default();
    let mut torn_tail = 0;
    while read_line(&mut reader, &mut buf)
        .map_err(io_err(&path))?
        .is_some()
    {
        let n = chain.expected_seq;
        if is_torn_tail(&mut reader, &buf, n, head_seq).map_err(io_err(&path))? {
            torn_tail = buf.len() as u64;
            break;
        }
        let entry = chain.next(&buf).map_err(|reason| damaged(n, reason))?;
        if Some(n) == head_seq {
            hash_at_head = Some(entry.hash.clone());
        }
        if n == 1 {
            first_hash = Some(entry.hash.clone());
            new_trail = entry.event == event::AUDIT_TRAIL_STARTED
                && entry.details["new_audit_trail"] == serde_json::Value::Bool(true);
        }
        open_egress.see(&entry);
    }
    let prev = chain.prev;
    let expected_seq = chain.expected_seq;
    let entries = expected_seq - 1;
    match head_bytes {
        Some(bytes) => {
            let head: Head = serde_json::from_slice(&bytes).map_err(|e| {
                // serde's message quotes the file's text, at any length.
                let e = crate::text::clip(&e.to_string(), 300).into_owned();
                damaged(entries, format!("the head file is not valid: {e}"))
            })?;
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
            if head.seq > 0 && hash_at_head.as_deref() != Some(head.hash.as_str()) {
                return Err(damaged(
                    head.seq,
                    "does not match the head file (the end of the trail was rewritten)".into(),
                ));
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
        open_egress,
        torn_tail,
    })
}

/// Whether `line`, entry `n` of the trail, is the last bytes of the file without their
/// newline, after the entry the head names: what an append cut short leaves (a SIGKILL
/// between the pages of one write, a power loss before the sync). Its entries were never
/// reported durable, so the line is no damage to the trail; anywhere else, a line without
/// its newline is.
fn is_torn_tail(
    reader: &mut impl BufRead,
    line: &[u8],
    n: u64,
    head_seq: Option<u64>,
) -> io::Result<bool> {
    // A line is read whole up to MAX_LINE bytes and its newline: a part of one, at most
    // MAX_LINE bytes (`read_line` returns one byte more for a longer line).
    if line.len() > MAX_LINE || head_seq.is_none_or(|h| h >= n) {
        return Ok(false);
    }
    unterminated_at_end(reader, line)
}

/// Whether `line`, just read, lacks its newline because the file ends there (not because
/// it is longer than any line may be).
fn unterminated_at_end(reader: &mut impl BufRead, line: &[u8]) -> io::Result<bool> {
    Ok(!line.ends_with(b"\n") && reader.fill_buf()?.is_empty())
}

/// Reads every entry (for `audit tail`), skipping nothing: a malformed line is an error.
pub fn read_entries(dir: &Path) -> Result<Vec<AuditEntry>, AuditError> {
    let mut out = Vec::new();
    each_entry(dir, |e| {
        out.push(e);
        true
    })?;
    Ok(out)
}

/// Calls `each` with the trail's entries in order, one at a time, until it says stop: a
/// malformed line is an error, a partial last line (an append cut short) no entry.
pub fn each_entry(dir: &Path, mut each: impl FnMut(AuditEntry) -> bool) -> Result<(), AuditError> {
    let path = dir.join(LOG_FILE);
    let held = Dir::open(dir).map_err(io_err(dir))?;
    let mut reader = BufReader::new(open_trail_file(&held, LOG_FILE)?);
    let mut buf = Vec::new();
    let mut line = 0u64;
    while read_line(&mut reader, &mut buf)
        .map_err(io_err(&path))?
        .is_some()
    {
        if unterminated_at_end(&mut reader, &buf).map_err(io_err(&path))? {
            break;
        }
        line = line.saturating_add(1);
        let e: AuditEntry =
            serde_json::from_slice(buf.trim_ascii_end()).map_err(|e| AuditError::Damaged {
                path: path.clone(),
                line,
                reason: format!("not a valid entry: {e}"),
            })?;
        if !each(e) {
            break;
        }
    }
    Ok(())
}

/// The trail's entries as they are read, and then as they are appended: `audit tail`
/// keeps only the last few it shows, and `-f` reads only what was added since (it used to
/// read and parse the whole trail every 300 ms, holding all of it in memory). Every entry
/// passes the chain's checks first ([`Chain`]; the MAC too where the key is given), so
/// that nothing forged, edited, reordered or repeated is ever shown as an entry: the
/// first that fails them is an error, and nothing after it is read.
pub struct TrailFollower<'k> {
    reader: BufReader<File>,
    path: PathBuf,
    /// The start of a line whose end has not been written yet.
    pending: Vec<u8>,
    /// Where the whole lines read so far end: `pending` starts there.
    whole: u64,
    chain: Chain<'k>,
}

impl<'k> TrailFollower<'k> {
    /// Follows the trail in `dir`, checking MACs under `key` where it is given.
    pub fn open(dir: &Path, key: Option<&'k AuditKey>) -> Result<TrailFollower<'k>, AuditError> {
        let held = Dir::open(dir).map_err(io_err(dir))?;
        Ok(TrailFollower {
            reader: BufReader::new(open_trail_file(&held, LOG_FILE)?),
            path: dir.join(LOG_FILE),
            pending: Vec::new(),
            whole: 0,
            chain: Chain::new(key),
        })
    }

    /// Calls `each` with every whole entry written since the last call; a line still
    /// being written is read again at the next, from its start: a controller that starts
    /// after a crash cuts off the partial line an append left and writes its entries in
    /// its place.
    pub fn read_new(&mut self, mut each: impl FnMut(AuditEntry)) -> Result<(), AuditError> {
        use std::io::Seek;
        let len = self
            .reader
            .get_ref()
            .metadata()
            .map_err(io_err(&self.path))?
            .len();
        if len < self.whole {
            return Err(AuditError::Damaged {
                path: self.path.clone(),
                line: self.chain.expected_seq,
                reason:
                    "the trail is now shorter than the entries already read: its end was cut off"
                        .into(),
            });
        }
        if !self.pending.is_empty() {
            self.pending.clear();
            self.reader
                .seek(std::io::SeekFrom::Start(self.whole))
                .map_err(io_err(&self.path))?;
        }
        loop {
            let room = (MAX_LINE as u64 + 1).saturating_sub(self.pending.len() as u64);
            let n = (&mut self.reader)
                .take(room)
                .read_until(b'\n', &mut self.pending)
                .map_err(io_err(&self.path))?;
            let damaged = |line: u64, reason: String| AuditError::Damaged {
                path: self.path.clone(),
                line,
                reason,
            };
            if self.pending.ends_with(b"\n") {
                let line = self.chain.expected_seq;
                let e = self
                    .chain
                    .next(&self.pending)
                    .map_err(|reason| damaged(line, reason))?;
                self.whole = self.whole.saturating_add(self.pending.len() as u64);
                self.pending.clear();
                each(e);
            } else if self.pending.len() > MAX_LINE {
                return Err(damaged(
                    self.chain.expected_seq,
                    format!("a line longer than {MAX_LINE} bytes"),
                ));
            } else if n == 0 {
                return Ok(());
            }
        }
    }
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
