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
fn an_entry_whose_bytes_say_more_than_its_hash_covers_is_found() -> Result<(), AuditError> {
    // A key given twice: a first-key-wins reader (a log shipper, a person's eyes) sees the
    // forged value, the parser and the hash the last. No key is needed to write it.
    for forge in [
        |l: &str| l.replacen("\"details\":{", "\"details\":{\"active\":99,", 1),
        |l: &str| l.replacen("\"seq\":", " \"seq\":", 1),
        |l: &str| l.replacen("\"controller\"", "\"\\u0063ontroller\"", 1),
    ] {
        let dir = trail(5)?;
        let mut l = lines(dir.path());
        let edited = forge(&l[3]);
        assert_ne!(edited, l[3]);
        // Still a valid entry, with the same content: only the bytes differ.
        let parsed: AuditEntry =
            serde_json::from_str(&edited).map_err(|e| AuditError::Damaged {
                path: PathBuf::new(),
                line: 4,
                reason: e.to_string(),
            })?;
        assert_eq!(parsed.compute_hash(), parsed.hash, "{edited}");
        l[3] = edited;
        write_lines(dir.path(), &l);
        assert_eq!(damaged_at(dir.path()), Some(4), "{}", l[3]);
    }
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

/// Puts a directory where the head is, so that no head can be written there (as on a
/// full disk); the head it held is returned, for [`mend_head`].
fn break_head(dir: &Path) -> Result<Vec<u8>, AuditError> {
    let io = |e| io_err(Path::new("test"))(e);
    let head = dir.join(HEAD_FILE);
    let kept = std::fs::read(&head).map_err(io)?;
    std::fs::remove_file(&head).map_err(io)?;
    std::fs::create_dir(&head).map_err(io)?;
    std::fs::write(head.join("x"), b"x").map_err(io)?;
    Ok(kept)
}

/// Puts the head `kept` back.
fn mend_head(dir: &Path, kept: Vec<u8>) -> Result<(), AuditError> {
    let io = |e| io_err(Path::new("test"))(e);
    let head = dir.join(HEAD_FILE);
    std::fs::remove_dir_all(&head).map_err(io)?;
    std::fs::write(&head, kept).map_err(io)
}

/// A sync whose head cannot be written (a full disk; here, a directory in its place)
/// takes its entries back off the trail: `verify` takes entries past the head for ones a
/// crash left unsynced, so entries no head covers could be cut off unnoticed. Its
/// decisions are dropped (one kept for a later sync would record as done what was
/// answered as not done) and counted in an entry that goes first; its records wait.
#[test]
fn a_sync_that_fails_drops_its_entries_and_the_next_says_so() -> Result<(), AuditError> {
    let dir = trail(2)?;
    let before = lines(dir.path());
    assert_eq!(before.len(), 3);
    let mut log = AuditLog::open(dir.path(), key())?;
    let kept = break_head(dir.path())?;
    // Each try: a decision (dropped), and a record (kept, once).
    log.append(event::WORKER_EXITED, "controller", Some("w1"), json!({}));
    for _ in 0..2 {
        log.append_kind(
            event::KILL_SWITCH_RELEASED,
            "uid:0",
            None,
            json!({}),
            EntryKind::Decision,
        );
        let failed = log.sync();
        assert!(matches!(failed, Err(AuditError::Io { .. })), "{failed:?}");
        assert_eq!(lines(dir.path()), before, "the trail ran ahead of its head");
        // The count of what was dropped, then the record.
        assert_eq!(log.len(), 5);
        assert!(!log.complete());
    }
    mend_head(dir.path(), kept)?;
    assert_eq!(verify(dir.path(), &key())?.entries, 3);
    log.record(event::REAP_STALE, "controller", None, json!({}))?;
    let after = read_entries(dir.path())?;
    let events: Vec<&str> = after.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        events.get(3..),
        Some(
            &[
                event::AUDIT_ENTRIES_LOST,
                event::WORKER_EXITED,
                event::REAP_STALE
            ][..]
        )
    );
    let note = &after[3].details;
    assert_eq!(note["entries"], 2);
    assert_eq!(note["by_event"][event::KILL_SWITCH_RELEASED], 2);
    assert!(
        note["error"]
            .as_str()
            .is_some_and(|e| e.contains(HEAD_FILE)),
        "{note}"
    );
    assert_eq!(verify(dir.path(), &key())?.entries, 6);
    assert!(log.complete());
    // Said once.
    log.record(event::REAP_STALE, "controller", None, json!({}))?;
    assert_eq!(verify(dir.path(), &key())?.entries, 7);
    Ok(())
}

/// Every entry read for `audit tail` passes the chain's checks first: one appended with
/// a consistent link and hash but no valid MAC (anyone who can write the file, without
/// the key, can make that) is refused where the key is known, and one that does not link
/// is refused without it; nothing after the first refused entry is read.
#[test]
fn a_followed_trail_shows_no_entry_that_fails_the_chain() -> Result<(), AuditError> {
    let dir = trail(2)?;
    let mut entries = read_entries(dir.path())?;
    let last = entries.last().cloned();
    let Some(mut forged) = last else {
        panic!("no entries");
    };
    forged.seq += 1;
    forged.event = event::KILL_SWITCH_RELEASED.into();
    forged.prev = forged.hash.clone();
    forged.hash = forged.compute_hash();
    entries.push(forged);
    let mut l: Vec<String> = entries
        .iter()
        .filter_map(|e| serde_json::to_string(e).ok())
        .collect();
    write_lines(dir.path(), &l);
    let read = |key: Option<&AuditKey>| -> (Vec<u64>, Option<u64>) {
        let mut shown = Vec::new();
        let result = TrailFollower::open(dir.path(), key)
            .and_then(|mut t| t.read_new(|e| shown.push(e.seq)));
        let at = match result {
            Err(AuditError::Damaged { line, .. }) => Some(line),
            _ => None,
        };
        (shown, at)
    };
    let k = key();
    assert_eq!(read(Some(&k)), (vec![1, 2, 3], Some(4)));
    // Without the key, the same forgery passes the chain: that is what the key is for.
    assert_eq!(read(None), (vec![1, 2, 3, 4], None));
    // A line moved to the end no longer links, key or not.
    let moved = l.remove(1);
    l.push(moved);
    write_lines(dir.path(), &l);
    assert_eq!(read(None), (vec![1], Some(2)));
    Ok(())
}

/// A damaged line's reason quotes what the parser quotes of it, a few hundred
/// characters at most, however long the line.
#[test]
fn a_damaged_line_is_quoted_briefly() -> Result<(), AuditError> {
    let io = |e| io_err(Path::new("test"))(e);
    // A long value; and bytes that are not UTF-8, with a terminal escape among them.
    let long = format!("{{\"seq\":\"{}\"}}\n", "A".repeat(200_000)).into_bytes();
    let raw = b"{\"seq\":\"\x1b]0;owned\x07\xff\xfe\"}\n".to_vec();
    for bad in [long, raw] {
        let dir = trail(1)?;
        let mut bytes = std::fs::read(dir.path().join(LOG_FILE)).map_err(io)?;
        bytes.extend(&bad);
        std::fs::write(dir.path().join(LOG_FILE), bytes).map_err(io)?;
        match verify(dir.path(), &key()) {
            Err(e @ AuditError::Damaged { .. }) => {
                assert!(e.to_string().len() < 1000, "{} bytes", e.to_string().len())
            }
            other => panic!("{other:?}"),
        }
        let mut shown = 0;
        let read = TrailFollower::open(dir.path(), Some(&key()))
            .and_then(|mut t| t.read_new(|_| shown += 1));
        assert!(
            matches!(read, Err(AuditError::Damaged { line: 3, .. })),
            "{read:?}"
        );
        assert_eq!(shown, 2);
    }
    Ok(())
}

/// While syncs fail, the records kept for the next one are bounded: past the bound the
/// oldest are dropped too, and counted with the decisions.
#[test]
fn records_kept_while_syncs_fail_are_bounded() -> Result<(), AuditError> {
    let dir = trail(1)?;
    let mut log = AuditLog::open(dir.path(), key())?;
    let kept = break_head(dir.path())?;
    let pad = "x".repeat(1000);
    for i in 0..2000 {
        log.append(
            event::DENY_QUOTA,
            "uid:0",
            None,
            json!({ "i": i, "pad": pad }),
        );
    }
    assert!(log.sync().is_err());
    let waiting = log.len() - 2;
    assert!(
        (100..400).contains(&waiting),
        "{waiting} entries kept for the next sync"
    );
    mend_head(dir.path(), kept)?;
    log.sync()?;
    let after = read_entries(dir.path())?;
    let note = &after[2];
    assert_eq!(note.event, event::AUDIT_ENTRIES_LOST);
    let dropped = note.details["by_event"][event::DENY_QUOTA]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(dropped + waiting - 1, 2000, "{}", note.details);
    assert_eq!(verify(dir.path(), &key())?.entries, log.len());
    Ok(())
}

#[test]
fn workers_whose_broker_the_trail_last_saw_running_are_found_at_the_next_start()
-> Result<(), AuditError> {
    let dir = tempfile::tempdir().map_err(|e| io_err(Path::new("tmp"))(e))?;
    let started = |log: &mut AuditLog, id: &str, egress: bool| {
        let mut details = json!({"pid": 1});
        if egress {
            details["egress"] = json!(true);
        }
        log.append(event::REPLICATION_REQUESTED, "uid:0", Some(id), details);
    };
    let mut log = AuditLog::open(dir.path(), key())?;
    log.append(event::CONTROLLER_STARTED, "controller", None, json!({}));
    started(&mut log, "ended", true);
    started(&mut log, "open", true);
    started(&mut log, "no-broker", false);
    started(&mut log, "failed", true);
    started(&mut log, "said", true);
    started(&mut log, "refused", true);
    log.append(event::WORKER_EXITED, "controller", Some("ended"), json!({}));
    log.append(
        event::DENY_QUOTA,
        "controller",
        Some("refused"),
        json!({"at": "start"}),
    );
    log.append(
        event::WORKER_START_FAILED,
        "controller",
        Some("failed"),
        json!({}),
    );
    log.append(
        event::EGRESS_RECORD_LOST,
        "controller",
        Some("said"),
        json!({}),
    );
    log.sync()?;
    drop(log);
    // A crash: no `controller_stopped`. Only the worker whose end the trail never names.
    let mut log = AuditLog::open(dir.path(), key())?;
    let open = log.take_open_egress();
    assert_eq!(open.workers.iter().collect::<Vec<_>>(), ["open"]);
    assert!(log.take_open_egress().is_empty(), "said once");
    // A start that records nothing for it (another crash first) finds it again.
    log.append(event::CONTROLLER_STARTED, "controller", None, json!({}));
    log.sync()?;
    drop(log);
    assert_eq!(AuditLog::open(dir.path(), key())?.take_open_egress(), open);
    // A clean stop recorded every end before it.
    let mut log = AuditLog::open(dir.path(), key())?;
    log.append(event::CONTROLLER_STOPPED, "controller", None, json!({}));
    log.sync()?;
    drop(log);
    assert!(
        AuditLog::open(dir.path(), key())?
            .take_open_egress()
            .is_empty()
    );
    Ok(())
}

#[test]
fn a_partial_last_line_after_the_head_is_an_append_a_crash_cut_short_and_is_removed()
-> Result<(), AuditError> {
    let dir = trail(3)?;
    let whole = std::fs::read(dir.path().join(LOG_FILE)).unwrap_or_default();
    // What a write cut between its pages leaves: the start of entry 5 (the first says
    // why the trail began), no newline.
    let torn = b"{\"seq\":5,\"time\":\"2026";
    let mut with_torn = whole.clone();
    with_torn.extend_from_slice(torn);
    std::fs::write(dir.path().join(LOG_FILE), &with_torn).map_err(io_err(dir.path()))?;
    let summary = verify(dir.path(), &key())?;
    assert_eq!((summary.entries, summary.torn_tail), (4, torn.len() as u64));
    // A start that writes nothing (refused once the trail was open: a cluster's
    // anchored head missing) leaves the trail exactly as it found it.
    drop(AuditLog::open(dir.path(), key())?);
    assert_eq!(
        std::fs::read(dir.path().join(LOG_FILE)).unwrap_or_default(),
        with_torn
    );
    // The next start says how much it cuts off, and cuts it off as it first writes,
    // appending after the whole lines.
    let mut log = AuditLog::open(dir.path(), key())?;
    assert_eq!(log.take_torn_tail(), torn.len() as u64);
    assert_eq!(log.take_torn_tail(), 0);
    log.record(event::CONTROLLER_STARTED, "controller", None, json!({}))?;
    let now = std::fs::read(dir.path().join(LOG_FILE)).unwrap_or_default();
    assert!(now.starts_with(&whole) && now.ends_with(b"\n"));
    let summary = verify(dir.path(), &key())?;
    assert_eq!((summary.entries, summary.torn_tail), (5, 0));
    Ok(())
}

#[test]
fn a_line_cut_short_at_or_before_the_head_is_damage() -> Result<(), AuditError> {
    let dir = trail(3)?;
    let whole = std::fs::read(dir.path().join(LOG_FILE)).unwrap_or_default();
    // The last synced entry itself loses its newline: the head names it, so it was
    // reported durable.
    let cut = whole.get(..whole.len() - 1).unwrap_or_default();
    std::fs::write(dir.path().join(LOG_FILE), cut).map_err(io_err(dir.path()))?;
    assert_eq!(damaged_at(dir.path()), Some(4));
    assert!(AuditLog::open(dir.path(), key()).is_err());
    // Half of it gone: the same.
    let half = whole.get(..whole.len() - 40).unwrap_or_default();
    std::fs::write(dir.path().join(LOG_FILE), half).map_err(io_err(dir.path()))?;
    assert_eq!(damaged_at(dir.path()), Some(4));
    Ok(())
}

#[test]
fn a_partial_line_is_no_entry_to_read_nor_past_the_longest_line() -> Result<(), AuditError> {
    let dir = trail(2)?;
    let whole = std::fs::read(dir.path().join(LOG_FILE)).unwrap_or_default();
    let last = whole
        .split(|b| *b == b'\n')
        .rfind(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    // The last entry again, without its newline: read_entries does not take it for one.
    let mut with_torn = whole.clone();
    with_torn.extend_from_slice(&last);
    std::fs::write(dir.path().join(LOG_FILE), &with_torn).map_err(io_err(dir.path()))?;
    assert_eq!(read_entries(dir.path())?.len(), 3);
    // At most a line's length: one byte more is no part of an entry.
    for (extra, torn) in [(MAX_LINE, true), (MAX_LINE + 1, false)] {
        let mut long = whole.clone();
        long.extend(std::iter::repeat_n(b'A', extra));
        std::fs::write(dir.path().join(LOG_FILE), &long).map_err(io_err(dir.path()))?;
        assert_eq!(verify(dir.path(), &key()).is_ok(), torn, "{extra}");
    }
    Ok(())
}

#[test]
fn a_refusal_ends_no_broker_but_that_of_a_worker_refused_at_its_start() {
    let entry = |event: &str, id: Option<&str>, details: serde_json::Value| AuditEntry {
        seq: 1,
        time: String::new(),
        event: event.into(),
        actor: "controller".into(),
        worker_id: id.map(String::from),
        details,
        prev: String::new(),
        hash: String::new(),
        mac: String::new(),
    };
    let mut open = OpenEgress::default();
    for id in ["parent", "child"] {
        open.see(&entry(
            event::REPLICATION_REQUESTED,
            Some(id),
            json!({"egress": true}),
        ));
    }
    // The parent's own request refused: the parent runs on.
    open.see(&entry(event::DENY_NARROWING, Some("parent"), json!({})));
    open.see(&entry(
        event::DENY_QUOTA,
        Some("child"),
        json!({"at": "start"}),
    ));
    assert_eq!(open.workers.iter().collect::<Vec<_>>(), ["parent"]);
    // Past the bound, counted; said once, unnamed, the count goes.
    open.more = 5;
    open.see(&entry(event::EGRESS_RECORD_LOST, None, json!({})));
    assert_eq!(open.more, 0);
}

#[test]
fn a_follower_reads_on_after_a_start_cuts_off_a_partial_line() -> Result<(), AuditError> {
    let dir = trail(2)?;
    let mut torn = std::fs::read(dir.path().join(LOG_FILE)).unwrap_or_default();
    torn.extend_from_slice(&[b'Q'; 5000]);
    std::fs::write(dir.path().join(LOG_FILE), &torn).map_err(io_err(dir.path()))?;
    let k = key();
    let mut follower = TrailFollower::open(dir.path(), Some(&k))?;
    let mut seen = Vec::new();
    follower.read_new(|e| seen.push(e.event))?;
    assert_eq!(seen.len(), 3);
    // A start cuts the partial line off and writes its entries where it was.
    let mut log = AuditLog::open(dir.path(), key())?;
    for _ in 0..3 {
        log.append(event::CONTROLLER_STARTED, "controller", None, json!({}));
    }
    log.sync()?;
    follower.read_new(|e| seen.push(e.event))?;
    assert_eq!(seen.len(), 6, "{seen:?}");
    Ok(())
}

/// A head file from someone else is hostile text: the parser's message quotes it, and a
/// long value made `audit verify` print one line of 51 KB.
#[test]
fn a_head_that_is_not_valid_is_said_in_a_bounded_line() -> Result<(), AuditError> {
    let dir = trail(1)?;
    let long = "x".repeat(50_000);
    std::fs::write(
        dir.path().join(HEAD_FILE),
        format!("{{\"seq\":\"{long}\",\"hash\":\"\",\"mac\":\"\"}}"),
    )
    .map_err(io_err(dir.path()))?;
    match verify(dir.path(), &key()) {
        Err(e) => assert!(e.to_string().len() < 1000, "{} bytes", e.to_string().len()),
        Ok(s) => panic!("a head that is not valid verified: {s:?}"),
    }
    Ok(())
}
