//! The writer side of the trail: [`AuditLog`], one per controller, which appends entries,
//! makes them durable with their head, and hands each head to the anchor.

use super::*;

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

/// A trail's last synced entry, and the trail's name (its first entry's hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncedHead {
    pub seq: u64,
    pub hash: String,
    pub trail: String,
}

/// What an entry records, which decides what a failed sync does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// Something that happened (a worker started or exited, a connection was made): kept
    /// after a failed sync, for the next one.
    Record,
    /// A decision whose effect waits for its entry to be durable: a failed sync undoes
    /// the effect (the request is answered as not done), so the entry is dropped with it,
    /// and counted ([`event::AUDIT_ENTRIES_LOST`]).
    Decision,
    /// The count of dropped decisions: made again at each failed sync.
    Lost,
}

/// An entry appended and not yet on disk.
struct Pending {
    entry: AuditEntry,
    kind: EntryKind,
}

/// Most bytes of records kept for a later sync while syncs fail; past it the oldest are
/// dropped too, and counted. Small: a controller whose disk stays full is not to grow,
/// re-chain this at each failed sync (a flood of refusals makes one each), or need more
/// room to recover than a little freed space gives.
const MOST_KEPT: usize = 256 << 10;

/// Allocates `len` bytes of `file` from `offset` without changing its size; a file system
/// that cannot (`EOPNOTSUPP`) is written without it.
fn take_room(file: &File, offset: u64, len: usize) -> io::Result<()> {
    use nix::fcntl::{FallocateFlags, fallocate};
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::other("the trail is too large"));
    };
    if len == 0 {
        return Ok(());
    }
    match fallocate(file, FallocateFlags::FALLOC_FL_KEEP_SIZE, offset, len) {
        Ok(()) | Err(nix::errno::Errno::EOPNOTSUPP) | Err(nix::errno::Errno::ENOSYS) => Ok(()),
        Err(e) => Err(io::Error::from(e)),
    }
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
    /// Entries appended and not yet on disk, in order.
    pending: Vec<Pending>,
    /// The last entry on disk (sequence number, hash) and the first entry's hash.
    durable: (u64, String, Option<String>),
    /// What failed syncs dropped, until an entry saying so is on disk.
    lost: Option<lost::Lost>,
    anchor: Option<anchor::AnchorWriter>,
    session: String,
    /// Workers whose egress broker was running when the trail, as found, ended.
    open_egress: OpenEgress,
    /// Bytes of a partial last line this start cut off the trail (see
    /// [`VerifySummary::torn_tail`]).
    torn_tail: u64,
    /// Bytes of that line still on disk: cut at the first sync, before anything is
    /// appended, so that a start refused after opening the trail (a cluster's anchored
    /// head missing from it) leaves the trail exactly as it found it.
    torn_on_disk: u64,
    /// The trail this start began, until anything more is written to it.
    begun: Option<Begun>,
}

/// A trail begun by this start, and what it replaced in the state directory: so that a
/// start refused before it wrote anything more takes it away again
/// ([`AuditLog::abandon_begun`]).
struct Begun {
    /// The trail file this start made (dev, inode); `None` where it was there before (an
    /// empty one: evidence, never this start's to take away).
    trail: Option<(u64, u64)>,
    /// The `audit.head` this start published (dev, inode).
    head: (u64, u64),
    /// `audit.head` as found (evidence of an earlier trail), `None` where there was none.
    head_before: Option<Vec<u8>>,
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
        let found_file = file.is_some();
        let mut log = AuditLog {
            dir: held,
            file,
            key,
            seq: summary.entries,
            durable: (
                summary.entries,
                summary.last_hash.clone(),
                summary.first_hash.clone(),
            ),
            last_hash: summary.last_hash,
            first_hash: summary.first_hash,
            pending: Vec::new(),
            lost: None,
            anchor: start.anchor.map(Anchor::into_writer),
            session: start.session,
            open_egress: summary.open_egress,
            torn_tail: summary.torn_tail,
            torn_on_disk: summary.torn_tail,
            begun: None,
        };
        if let Some(writer) = &mut log.anchor {
            writer.hold(true);
        }
        if let Some((reason, evidence)) = begin {
            let head_path = log.dir.path().join(HEAD_FILE);
            let head_before = log
                .dir
                .read(HEAD_FILE, 64 << 10)
                .map_err(io_err(&head_path))?;
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
            let id = |st: nix::sys::stat::FileStat| (st.st_dev, st.st_ino);
            let trail = match (&log.file, found_file) {
                (Some(file), false) => Some(
                    nix::sys::stat::fstat(file)
                        .map(id)
                        .map_err(|e| io_err(&path)(e.into()))?,
                ),
                _ => None,
            };
            let head = log
                .dir
                .stat_entry(HEAD_FILE)
                .map_err(io_err(&head_path))?
                .map(id)
                .ok_or_else(|| io_err(&head_path)(io::ErrorKind::NotFound.into()))?;
            log.begun = Some(Begun {
                trail,
                head,
                head_before,
            });
        }
        if let Some(writer) = &mut log.anchor {
            writer.hold(false);
        }
        Ok(log)
    }

    /// Takes away the trail this start began, for a start refused before it wrote
    /// anything after the trail's first entry: `audit.head` is put back as found (or goes,
    /// where there was none) and the trail file goes, so that the state directory holds
    /// the same evidence as before and the same command can start again. The first
    /// entry's head, queued for the anchor and not yet written, is taken back from it.
    ///
    /// `Ok(false)`, and everything stays, when there is nothing of this start's own to take
    /// away: no trail was begun, or it was begun in a trail file that was there (an empty
    /// one, from before that was evidence), more was written to it, its files are no longer
    /// the ones this start made, or the anchor's writer has started (the head may be
    /// anchored already). An error before the trail file is gone leaves it, and the
    /// anchor's head, in place; one after it (removing a head where there was none before)
    /// leaves that head, which says a trail of one entry was kept.
    pub fn abandon_begun(mut self) -> Result<bool, AuditError> {
        let Some(begun) = self.begun.take() else {
            return Ok(false);
        };
        if self.seq != 1 || self.durable.0 != 1 || !self.pending.is_empty() || self.lost.is_some() {
            return Ok(false);
        }
        let path = self.dir.path().join(LOG_FILE);
        let head_path = self.dir.path().join(HEAD_FILE);
        let is = |name: &str, id: (u64, u64)| -> Result<bool, AuditError> {
            let st = self
                .dir
                .stat_entry(name)
                .map_err(io_err(&self.dir.path().join(name)))?;
            Ok(st.is_some_and(|st| (st.st_dev, st.st_ino) == id))
        };
        let Some(trail) = begun.trail else {
            return Ok(false);
        };
        if !is(LOG_FILE, trail)? || !is(HEAD_FILE, begun.head)? {
            return Ok(false);
        }
        // The earlier head written (a full disk refuses it here, before anything changed).
        let staged = match &begun.head_before {
            Some(bytes) => {
                let mut staged = self
                    .dir
                    .stage(HEAD_FILE, 0o600)
                    .map_err(io_err(&head_path))?;
                if let Err(e) = staged.file.write_all(bytes) {
                    self.dir.discard(staged);
                    return Err(io_err(&head_path)(e));
                }
                Some(staged)
            }
            None => None,
        };
        let withdrawn = match &mut self.anchor {
            Some(anchor) => match anchor.withdraw() {
                Some(lines) => Some(lines),
                None => {
                    if let Some(staged) = staged {
                        self.dir.discard(staged);
                    }
                    return Ok(false);
                }
            },
            None => None,
        };
        let trail_gone = match staged {
            // The earlier head back first, then the trail away: stopped between the two,
            // the trail is found damaged (its head names another), and the earlier head,
            // evidence of the trail before, is never lost.
            Some(staged) => self
                .dir
                .publish(staged, HEAD_FILE)
                .map_err(io_err(&head_path))
                .and_then(|()| self.dir.remove(LOG_FILE).map_err(io_err(&path))),
            // No earlier trail: the trail first, so that a head is never left without it.
            None => self.dir.remove(LOG_FILE).map_err(io_err(&path)),
        };
        if let Err(e) = trail_gone {
            // The trail stays: its head goes to the anchor after all.
            if let (Some(anchor), Some(lines)) = (&mut self.anchor, withdrawn) {
                anchor.put_back(lines);
            }
            return Err(e);
        }
        self.file = None;
        if begun.head_before.is_none() {
            // Stopped before this, the head left behind says a trail was kept (one
            // entry): evidence, never a contradiction.
            self.dir.remove(HEAD_FILE).map_err(io_err(&head_path))?;
        }
        self.dir.sync();
        Ok(true)
    }

    /// The workers whose egress broker was running when the trail, as this log found it,
    /// ended (see [`OpenEgress`]); empty after the first call.
    pub fn take_open_egress(&mut self) -> OpenEgress {
        std::mem::take(&mut self.open_egress)
    }

    /// How many bytes of a partial last line (an append a crash cut short) this start cut
    /// off the trail it found; 0 after the first call.
    pub fn take_torn_tail(&mut self) -> u64 {
        std::mem::take(&mut self.torn_tail)
    }

    /// Adds a record (buffered until [`sync`](Self::sync); kept if a sync fails).
    pub fn append(
        &mut self,
        event: &str,
        actor: &str,
        worker_id: Option<&str>,
        details: serde_json::Value,
    ) -> AuditEntry {
        self.append_kind(event, actor, worker_id, details, EntryKind::Record)
    }

    /// Adds an entry of `kind` (buffered until [`sync`](Self::sync)).
    pub fn append_kind(
        &mut self,
        event: &str,
        actor: &str,
        worker_id: Option<&str>,
        details: serde_json::Value,
        kind: EntryKind,
    ) -> AuditEntry {
        self.push(event, actor, worker_id, details, None, kind)
    }

    /// Chains an entry after the last one (at `time`, or now) and queues it.
    fn push(
        &mut self,
        event: &str,
        actor: &str,
        worker_id: Option<&str>,
        details: serde_json::Value,
        time: Option<String>,
        kind: EntryKind,
    ) -> AuditEntry {
        let mut entry = AuditEntry {
            seq: self.seq + 1,
            time: time.unwrap_or_else(|| format_time(now_ms())),
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
        self.seq = entry.seq;
        self.last_hash = entry.hash.clone();
        if self.first_hash.is_none() {
            self.first_hash = Some(entry.hash.clone());
        }
        self.pending.push(Pending {
            entry: entry.clone(),
            kind,
        });
        entry
    }

    /// Writes what is buffered, makes it durable, moves the head, and then hands the new
    /// head to the anchor. An anchor that is failing makes this an error too, after the
    /// trail itself was written: [`AuditError::Anchor`] from here means the entries are
    /// durable.
    ///
    /// A sync that fails drops its decisions and keeps its records (see [`EntryKind`]):
    /// the trail never runs ahead of its head by more than one sync, and never records
    /// later as done what was answered as not done. The new head is staged before the
    /// trail is touched, so a file system with no room for it refuses the sync before
    /// any reader could see its entries.
    pub fn sync(&mut self) -> Result<(), AuditError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        match self.write_pending() {
            Ok(()) => {
                self.pending.clear();
                self.lost = None;
                self.durable = (self.seq, self.last_hash.clone(), self.first_hash.clone());
            }
            Err(e) => {
                self.after_failure(&e.to_string());
                return Err(e);
            }
        }
        if let (Some(writer), Some(trail)) = (&mut self.anchor, &self.first_hash) {
            let line =
                anchor::AnchorLine::new(&self.key, trail, &self.session, self.seq, &self.last_hash);
            writer.submit(line.render())?;
        }
        Ok(())
    }

    /// Whether everything appended is on disk, and nothing was dropped since.
    pub fn complete(&self) -> bool {
        self.pending.is_empty() && self.lost.is_none()
    }

    /// The pending entries as the lines of the trail.
    fn pending_lines(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for p in &self.pending {
            if let Ok(line) = serde_json::to_vec(&p.entry) {
                out.extend_from_slice(&line);
                out.push(b'\n');
            }
        }
        out
    }

    /// The pending entries on disk, then the head that covers them.
    fn write_pending(&mut self) -> Result<(), AuditError> {
        let lines = self.pending_lines();
        let path = self.dir.path().join(LOG_FILE);
        let head_path = self.dir.path().join(HEAD_FILE);
        let head = Head {
            seq: self.seq,
            hash: self.last_hash.clone(),
            mac: self.key.mac(&head_mac_input(self.seq, &self.last_hash)),
        };
        let json = serde_json::to_vec(&head).unwrap_or_default();
        let mut staged = self
            .dir
            .stage(HEAD_FILE, 0o600)
            .map_err(io_err(&head_path))?;
        // Written now (a file system with no room refuses it here); made durable, and
        // named, only once the trail is.
        if let Err(e) = staged.file.write_all(&json) {
            self.dir.discard(staged);
            return Err(io_err(&head_path)(e));
        }
        // Where the trail's whole lines ended before this sync (`None`: it is new).
        let before = match &mut self.file {
            Some(file) => {
                // A write cut short (a full disk) would leave half a line, which no later
                // entry could follow: cut the file back to where the whole lines end.
                let whole = match file.metadata() {
                    Ok(m) => m.len(),
                    Err(e) => {
                        self.dir.discard(staged);
                        return Err(io_err(&path)(e));
                    }
                };
                // The partial line a crash left goes before anything is appended after
                // it; the start records that it did (`take_torn_tail`).
                let whole = whole.saturating_sub(self.torn_on_disk);
                if self.torn_on_disk > 0 {
                    let cut = file.set_len(whole);
                    if cut.is_ok() {
                        // Cut, whether or not the sync below holds: a later sync must not
                        // cut again, into an entry.
                        self.torn_on_disk = 0;
                    }
                    if let Err(e) = cut.and_then(|()| file.sync_data()) {
                        self.dir.discard(staged);
                        return Err(io_err(&path)(e));
                    }
                }
                // The room for the lines is taken first, past the end (the file's size
                // unchanged): a file system without it refuses here, before any reader
                // could see a line of them.
                if let Err(e) = take_room(file, whole, lines.len()) {
                    self.dir.discard(staged);
                    return Err(io_err(&path)(e));
                }
                if let Err(e) = file.write_all(&lines).and_then(|()| file.sync_data()) {
                    let _ = file.set_len(whole);
                    self.dir.discard(staged);
                    return Err(io_err(&path)(e));
                }
                Some(whole)
            }
            None => match self.create_trail(&lines) {
                Ok(file) => {
                    self.file = Some(file);
                    None
                }
                Err(e) => {
                    self.dir.discard(staged);
                    return Err(io_err(&path)(e));
                }
            },
        };
        if let Err(e) = self.dir.publish(staged, HEAD_FILE) {
            self.unwrite(before);
            return Err(io_err(&head_path)(e));
        }
        Ok(())
    }

    /// After a failed sync: goes back to the last entry on disk, drops the decisions
    /// (counted as lost) and chains again, after an entry that counts what was dropped,
    /// the records, which wait for the next sync.
    fn after_failure(&mut self, error: &str) {
        let pending = std::mem::take(&mut self.pending);
        let mut dropped = Vec::new();
        let mut kept = Vec::new();
        for p in pending {
            match p.kind {
                EntryKind::Decision => dropped.push(p.entry.event),
                EntryKind::Record => kept.push(p.entry),
                EntryKind::Lost => {}
            }
        }
        // Bounded: the oldest records go first.
        let sizes: Vec<usize> = kept
            .iter()
            .map(|e| serde_json::to_vec(e).map_or(0, |l| l.len()))
            .collect();
        let mut size: usize = sizes.iter().sum();
        let over = sizes
            .iter()
            .take_while(|s| {
                let over = size > MOST_KEPT;
                size = size.saturating_sub(**s);
                over
            })
            .count();
        dropped.extend(kept.drain(..over).map(|e| e.event));
        if !dropped.is_empty() {
            self.lost
                .get_or_insert_with(Default::default)
                .count(&dropped, error);
        }
        let (seq, hash, first_hash) = self.durable.clone();
        self.seq = seq;
        self.last_hash = hash;
        self.first_hash = first_hash;
        if let Some(lost) = &self.lost {
            let (details, since) = (lost.details(), lost.since());
            self.push(
                event::AUDIT_ENTRIES_LOST,
                "controller",
                None,
                details,
                Some(since),
                EntryKind::Lost,
            );
        }
        for e in kept {
            self.push(
                &e.event,
                &e.actor,
                e.worker_id.as_deref(),
                e.details,
                Some(e.time),
                EntryKind::Record,
            );
        }
    }

    /// Takes this sync's entries back off the trail: to `len` bytes, or, for a trail this
    /// sync created, the file itself (an empty trail file would be evidence of one
    /// emptied).
    fn unwrite(&mut self, len: Option<u64>) {
        match (len, &self.file) {
            (Some(len), Some(file)) => {
                let _ = file.set_len(len).and_then(|()| file.sync_data());
            }
            (None, Some(_)) => {
                self.file = None;
                let _ = self.dir.remove(LOG_FILE);
                self.dir.sync();
            }
            (_, None) => {}
        }
    }

    /// Creates `audit.jsonl` with the pending entries already in it (a new file, made
    /// durable and only then given its name), so that the file is never seen empty: an
    /// empty trail file is evidence that a trail was emptied.
    fn create_trail(&self, lines: &[u8]) -> io::Result<File> {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        let mut staged = self.dir.stage(LOG_FILE, 0o600)?;
        if let Err(e) = staged.file.write_all(lines) {
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

    /// Appends a record and syncs it: for what must be on disk before anything follows
    /// (a trail's first entry, a start after a crash).
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

    /// The last entry on disk (its sequence number and hash) and the trail's first hash
    /// (its name), when nothing appended is waiting for a sync.
    pub fn synced_head(&self) -> Option<SyncedHead> {
        let trail = self.first_hash.clone()?;
        (self.pending.is_empty() && self.seq > 0).then(|| SyncedHead {
            seq: self.seq,
            hash: self.last_hash.clone(),
            trail,
        })
    }

    pub fn len(&self) -> u64 {
        self.seq
    }

    /// The state directory the trail is in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn is_empty(&self) -> bool {
        self.seq == 0
    }
}
