use super::*;

fn key() -> AuditKey {
    AuditKey::new(b"anchor test key of 32 bytes!!!!!")
}

#[test]
fn a_line_renders_and_parses_back_with_a_valid_mac() -> Result<(), String> {
    let line = AnchorLine::new(
        &key(),
        &"a".repeat(64),
        "0123456789abcdef",
        7,
        &"b".repeat(64),
    );
    let parsed = AnchorLine::parse(&line.render())?.ok_or("no line")?;
    assert_eq!(parsed, line);
    assert!(parsed.mac_valid(&key()));
    assert!(!parsed.mac_valid(&AuditKey::new(b"another key")));
    Ok(())
}

#[test]
fn a_line_is_found_inside_a_syslog_line_and_after_a_torn_write() -> Result<(), String> {
    let line = AnchorLine::new(&key(), &"a".repeat(64), "01", 3, &"c".repeat(64));
    let syslog = format!("Nov 22 17:03:04 host hatchery-audit[42]: {}", line.render());
    assert_eq!(AnchorLine::parse(&syslog)?, Some(line.clone()));
    let torn = format!("{MARKER} v1 key=0123 trail=ab{}", line.render());
    assert_eq!(AnchorLine::parse(&torn)?, Some(line));
    assert_eq!(AnchorLine::parse("-- Boot 1234 --")?, None);
    Ok(())
}

#[test]
fn an_altered_line_fails_its_mac_and_a_mangled_one_does_not_parse() -> Result<(), String> {
    let line = AnchorLine::new(&key(), &"a".repeat(64), "01", 3, &"c".repeat(64));
    let moved = line.render().replace("seq=3", "seq=2");
    let parsed = AnchorLine::parse(&moved)?.ok_or("no line")?;
    assert!(!parsed.mac_valid(&key()));
    assert!(AnchorLine::parse(&line.render().replace("seq=3", "seq=x")).is_err());
    assert!(AnchorLine::parse(&format!("{} extra", line.render())).is_err());
    assert!(AnchorLine::parse(&line.render().replace(" v1 ", " v9 ")).is_err());
    Ok(())
}

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A state directory and, beside it, a directory for the anchor.
fn dirs() -> Result<(tempfile::TempDir, tempfile::TempDir), io::Error> {
    Ok((tempfile::tempdir()?, tempfile::tempdir()?))
}

fn anchored(state: &Path, anchor: &Path) -> Result<super::super::AuditLog, AuditError> {
    start_anchored(state, anchor, false)
}

/// A trail begun with `--new-audit-trail` in `state`, anchored to `anchor`.
fn begun_anew(state: &Path, anchor: &Path) -> Result<super::super::AuditLog, AuditError> {
    start_anchored(state, anchor, true)
}

fn start_anchored(
    state: &Path,
    anchor: &Path,
    new_trail: bool,
) -> Result<super::super::AuditLog, AuditError> {
    let held = Dir::open(state).map_err(|e| anchor_err("state", None, e.to_string()))?;
    let a = Anchor::open(&AnchorTarget::File(anchor.to_path_buf()), &held)?;
    super::super::AuditLog::start(
        state,
        key(),
        super::super::Start {
            new_trail,
            anchor: Some(a),
            session: "5e55".into(),
            ..Default::default()
        },
    )
}

/// A state directory whose trail (its first entry and `n` records, anchored beside it)
/// was removed, its head left: the directory, the anchor's, and the anchor file.
fn vanished(
    n: usize,
) -> Result<(tempfile::TempDir, tempfile::TempDir, PathBuf), Box<dyn std::error::Error>> {
    let (state, elsewhere) = dirs()?;
    let anchor = elsewhere.path().join("anchor");
    record(state.path(), &anchor, n)?;
    std::fs::remove_file(state.path().join(LOG_FILE))?;
    Ok((state, elsewhere, anchor))
}

fn record(state: &Path, anchor: &Path, n: usize) -> Result<(), AuditError> {
    let mut log = anchored(state, anchor)?;
    for _ in 0..n {
        log.record("reap_stale", "controller", None, serde_json::json!({}))?;
    }
    // Dropping the log waits for the anchor's writer.
    drop(log);
    Ok(())
}

#[test]
fn every_synced_head_is_anchored_and_a_rolled_back_trail_is_refused() -> TestResult {
    let (state, elsewhere) = dirs()?;
    let anchor = elsewhere.path().join("anchor");
    record(state.path(), &anchor, 2)?;
    let old_log = std::fs::read(state.path().join(LOG_FILE))?;
    let old_head = std::fs::read(state.path().join(super::super::HEAD_FILE))?;
    record(state.path(), &anchor, 3)?;
    let text = std::fs::read_to_string(&anchor)?;
    assert_eq!(text.lines().count(), 6, "{text}");
    std::fs::write(state.path().join(LOG_FILE), old_log)?;
    std::fs::write(state.path().join(super::super::HEAD_FILE), old_head)?;
    // The chain alone is fine with the older copy; the anchor is not.
    assert_eq!(super::super::verify(state.path(), &key())?.entries, 3);
    match anchored(state.path(), &anchor).err() {
        Some(AuditError::RolledBack { seq, .. }) => assert_eq!(seq, 4),
        other => panic!("{other:?}"),
    }
    match super::super::verify_with_anchor(state.path(), &key(), Some(&anchor)) {
        Err(AuditError::RolledBack { seq, .. }) => assert_eq!(seq, 4),
        other => panic!("{other:?}"),
    }
    Ok(())
}

#[test]
fn a_longer_trail_than_the_last_anchored_head_is_fine() -> TestResult {
    let (state, elsewhere) = dirs()?;
    let anchor = elsewhere.path().join("anchor");
    record(state.path(), &anchor, 2)?;
    let mut log = super::super::AuditLog::open(state.path(), key())?;
    log.record("reap_stale", "controller", None, serde_json::json!({}))?;
    drop(log);
    let (summary, report) = super::super::verify_with_anchor(state.path(), &key(), Some(&anchor))?;
    assert_eq!(summary.entries, 4);
    let report = report.ok_or("no report")?;
    assert_eq!(report.heads_checked, 3);
    assert_eq!(report.last_anchored_seq, Some(3));
    Ok(())
}

#[test]
fn a_forged_anchor_line_is_reported_with_its_line() -> TestResult {
    let (state, elsewhere) = dirs()?;
    let anchor = elsewhere.path().join("anchor");
    record(state.path(), &anchor, 1)?;
    let text = std::fs::read_to_string(&anchor)?;
    let last = text.lines().last().ok_or("empty anchor")?;
    let forged = last.replace("seq=2", "seq=1");
    std::fs::write(&anchor, format!("{text}{forged}\n"))?;
    match super::super::verify_with_anchor(state.path(), &key(), Some(&anchor)) {
        Err(AuditError::Anchor { line, reason, .. }) => {
            assert_eq!(line, Some(3));
            assert!(reason.contains("MAC"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    Ok(())
}

#[test]
fn an_anchor_with_heads_is_evidence_of_a_trail() -> TestResult {
    let (state, elsewhere) = dirs()?;
    let anchor = elsewhere.path().join("anchor");
    record(state.path(), &anchor, 1)?;
    // Everything in the state directory gone, the key with it.
    for e in std::fs::read_dir(state.path())? {
        std::fs::remove_file(e?.path())?;
    }
    match anchored(state.path(), &anchor).err() {
        Some(AuditError::Vanished { evidence, .. }) => {
            assert!(
                evidence.iter().any(|e| e.contains("2 anchored heads")),
                "{evidence:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    Ok(())
}

#[test]
fn heads_of_an_earlier_trail_need_a_trail_begun_as_new() -> TestResult {
    let (state, _elsewhere, anchor) = vanished(1)?;
    std::fs::remove_file(state.path().join(super::super::HEAD_FILE))?;
    // A trail begun in its place without saying so (as a wiped key would let one be).
    drop(super::super::AuditLog::open(state.path(), key()));
    match super::super::verify_with_anchor(state.path(), &key(), Some(&anchor)) {
        Err(AuditError::RolledBack { seq: 1, reason, .. }) => {
            assert!(reason.contains("another trail"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // Begun with --new-audit-trail, the earlier heads are expected.
    std::fs::remove_file(state.path().join(LOG_FILE))?;
    drop(begun_anew(state.path(), &anchor)?);
    let (_, report) = super::super::verify_with_anchor(state.path(), &key(), Some(&anchor))?;
    let report = report.ok_or("no report")?;
    assert_eq!(report.earlier_trail_lines, 2);
    assert_eq!(report.heads_checked, 1);
    Ok(())
}

#[test]
fn an_anchor_inside_the_state_directory_or_not_a_file_is_refused() -> TestResult {
    let (state, elsewhere) = dirs()?;
    let held = Dir::open(state.path())?;
    std::fs::create_dir(state.path().join("sub"))?;
    for inside in [state.path().join("anchor"), state.path().join("sub/anchor")] {
        match Anchor::open(&AnchorTarget::File(inside), &held) {
            Err(AuditError::Anchor { reason, .. }) => {
                assert!(reason.contains("inside the state directory"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
    let link = elsewhere.path().join("link");
    std::os::unix::fs::symlink(elsewhere.path().join("target"), &link)?;
    let fifo = elsewhere.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    for (path, kind) in [
        (link, "a symlink"),
        (fifo, "a FIFO"),
        (elsewhere.path().to_path_buf(), "a directory"),
    ] {
        match Anchor::open(&AnchorTarget::File(path.clone()), &held) {
            Err(AuditError::Anchor { reason, .. }) => {
                assert!(reason.contains(kind), "{path:?}: {reason}")
            }
            other => panic!("{path:?}: {other:?}"),
        }
    }
    assert!(!elsewhere.path().join("target").exists());
    Ok(())
}

#[test]
fn targets_parse_from_the_command_line() {
    assert_eq!(
        "syslog".parse(),
        Ok(AnchorTarget::Syslog(PathBuf::from("/dev/log")))
    );
    assert_eq!(
        "syslog:/run/x.sock".parse(),
        Ok(AnchorTarget::Syslog(PathBuf::from("/run/x.sock")))
    );
    assert_eq!(
        "/var/log/a".parse(),
        Ok(AnchorTarget::File(PathBuf::from("/var/log/a")))
    );
    assert!("syslog:".parse::<AnchorTarget>().is_err());
}

/// A start refused after it began a trail where one vanished (`--new-audit-trail`, then a
/// cluster that cannot be reached) takes it away again: the state directory and the
/// anchor hold what they held, and the same start can be made again. A trail written to
/// after its first entry is never taken away.
#[test]
fn a_begun_trail_abandoned_leaves_the_state_directory_and_the_anchor_as_found() -> TestResult {
    let (state, _elsewhere, anchor) = vanished(2)?;
    let head = std::fs::read(state.path().join(super::super::HEAD_FILE))?;
    let anchored_before = std::fs::read(&anchor)?;
    assert!(begun_anew(state.path(), &anchor)?.abandon_begun()?);
    assert!(!state.path().join(LOG_FILE).exists());
    assert_eq!(
        std::fs::read(state.path().join(super::super::HEAD_FILE))?,
        head
    );
    assert_eq!(
        String::from_utf8_lossy(&std::fs::read(&anchor)?),
        String::from_utf8_lossy(&anchored_before)
    );
    // Made again, it begins the trail again, for the same evidence.
    let mut log = begun_anew(state.path(), &anchor)?;
    log.record("reap_stale", "controller", None, serde_json::json!({}))?;
    assert!(!log.abandon_begun()?, "a trail written to was taken away");
    let entries = super::super::read_entries(state.path())?;
    assert_eq!(entries.len(), 2);
    assert!(
        entries[0].details["evidence"]
            .to_string()
            .contains("audit.head records 3 synced entries"),
        "{}",
        entries[0].details
    );
    Ok(())
}

/// The first start in an empty state directory, refused: no trail file and no head left.
#[test]
fn a_first_trail_abandoned_leaves_no_file() -> TestResult {
    let (state, _) = dirs()?;
    let log = super::super::AuditLog::open(state.path(), key())?;
    assert!(log.abandon_begun()?);
    let left: Vec<_> = std::fs::read_dir(state.path())?.collect();
    assert!(left.is_empty(), "{left:?}");
    // A trail that was found, not begun, is never taken away.
    drop(super::super::AuditLog::open(state.path(), key())?);
    let found = super::super::AuditLog::open(state.path(), key())?;
    assert!(!found.abandon_begun()?);
    assert!(state.path().join(LOG_FILE).exists());
    Ok(())
}

/// A begun trail whose file is no longer the one the start made (copied over it) stays,
/// and so does its first head, which reaches the anchor: the anchor is never left without
/// the head of a trail that stays.
#[test]
fn a_begun_trail_replaced_meanwhile_stays_and_its_head_is_anchored() -> TestResult {
    let (state, _elsewhere, anchor) = vanished(1)?;
    let lines_before = std::fs::read_to_string(&anchor)?.lines().count();
    let log = begun_anew(state.path(), &anchor)?;
    let copy = state.path().join("copy");
    std::fs::copy(state.path().join(LOG_FILE), &copy)?;
    std::fs::rename(&copy, state.path().join(LOG_FILE))?;
    assert!(!log.abandon_begun()?);
    assert!(state.path().join(LOG_FILE).exists());
    let lines = std::fs::read_to_string(&anchor)?.lines().count();
    assert_eq!(
        lines,
        lines_before + 1,
        "the begun trail's head was not anchored"
    );
    Ok(())
}

/// An empty `audit.jsonl` is evidence that a trail was emptied: a trail begun in it (with
/// `--new-audit-trail`) was not made by that start, and is never taken away.
#[test]
fn a_trail_begun_in_a_file_that_was_there_is_never_taken_away() -> TestResult {
    let (state, _) = dirs()?;
    std::fs::write(state.path().join(LOG_FILE), b"")?;
    let log = super::super::AuditLog::start(
        state.path(),
        key(),
        super::super::Start {
            new_trail: true,
            ..Default::default()
        },
    )?;
    assert!(!log.abandon_begun()?);
    let entries = super::super::read_entries(state.path())?;
    assert_eq!(entries.len(), 1);
    Ok(())
}
