//! Attacks on the audit trail by someone who can write the controller's state directory:
//! wiping the trail, rolling it back to an older copy, forging the anchor; and the anchor
//! itself (its place, syslog, failing closed when it cannot be written).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::controller::TestController;
use common::*;
use hatchery::audit::{self, AuditKey};
use hatchery::signing::Keyring;
use serde_json::Value;

const LONG: Duration = Duration::from_secs(60);
/// A controller that must refuse to start has this long to say so.
const REFUSAL: Duration = Duration::from_secs(20);
const CONTRACT: &str =
    "max_depth = 3\nmax_replicas = 64\ncooldown_seconds = 0\nexpiration_seconds = 3600\n";

fn verify(state: &Path, extra: &[&str]) -> Output {
    run_with_timeout(
        Command::new(hatchery())
            .args(["audit", "verify", "--state-dir"])
            .arg(state)
            .args(extra),
        Duration::from_secs(30),
    )
}

fn verify_json(state: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let out = verify(state, &args);
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// Entries of the trail in `state`, as stored.
fn entries(state: &Path) -> Vec<Value> {
    std::fs::read_to_string(state.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The line a refused controller printed about why.
fn refusal(out: &Output) -> String {
    let err = stderr(out);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("hatchery: controller:"))
        .collect();
    assert_eq!(lines.len(), 1, "one line says why: {err}");
    lines[0].to_string()
}

fn audit_key(state: &Path) -> AuditKey {
    let ring = match Keyring::load(&state.join("controller.key")) {
        Ok(r) => r,
        Err(e) => panic!("key: {e}"),
    };
    match ring.derived_mac(audit::KEY_PURPOSE) {
        Ok(m) => AuditKey::from_mac(m),
        Err(e) => panic!("key: {e}"),
    }
}

/// Spawns `true` as a root worker and waits until its exit is in the trail.
fn spawn_true(c: &TestController) {
    let before = c.audit("worker_exited").len();
    let out = c.cli(&["spawn", "--", "true"]);
    assert_eq!(code(&out), 0, "{} {}", stderr(&out), c.log());
    let start = Instant::now();
    while c.audit("worker_exited").len() <= before {
        assert!(start.elapsed() < LONG, "no worker_exited: {}", c.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A directory outside every state directory, for anchors.
fn elsewhere() -> tempfile::TempDir {
    match tempfile::Builder::new()
        .prefix("hatchery-anchor-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    }
}

fn s(p: &Path) -> String {
    p.to_string_lossy().to_string()
}

#[test]
fn a_wiped_trail_is_damage_refused_at_start_and_begun_anew_only_on_request() {
    if skip_unless_root("wiped trail") {
        return;
    }
    let mut c = TestController::start(CONTRACT, &[]);
    spawn_true(&c);
    c.stop();
    let state = c.state_dir().to_path_buf();
    assert!(entries(&state).len() >= 4);
    let _ = std::fs::write(state.join("audit.jsonl"), "");
    let _ = std::fs::remove_file(state.join("audit.head"));

    // The attack as it worked: the chain and head alone find nothing wrong with nothing.
    match audit::verify_chain(&state, &audit_key(&state)) {
        Ok(summary) => assert_eq!(summary.entries, 0),
        Err(e) => panic!("{e}"),
    }
    let out = verify(&state, &[]);
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    let said = stdout(&out);
    assert!(said.contains("has vanished"), "{said}");
    assert!(said.contains("audit.jsonl is empty"), "{said}");
    assert!(said.contains("workers/ holds 1 worker log"), "{said}");
    assert!(!said.contains("intact"), "{said}");
    let v = verify_json(&state, &[]);
    assert_eq!(v["intact"], false, "{v}");
    assert_eq!(v["problem"]["kind"], "vanished", "{v}");

    let out = c.refused_start(&[], REFUSAL);
    assert_eq!(code(&out), 1);
    let why = refusal(&out);
    assert!(
        why.contains("has vanished") && why.contains("--new-audit-trail"),
        "{why}"
    );
    assert!(entries(&state).is_empty(), "nothing was written");

    c.restart_with(&["--new-audit-trail"]);
    c.stop();
    let trail = entries(&state);
    assert_eq!(trail[0]["seq"], 1);
    assert_eq!(trail[0]["event"], "audit_trail_started");
    assert_eq!(trail[0]["details"]["new_audit_trail"], true);
    let evidence = trail[0]["details"]["evidence"].to_string();
    assert!(evidence.contains("audit.jsonl is empty"), "{evidence}");
    assert!(evidence.contains("controller.key"), "{evidence}");
    assert_eq!(trail[1]["event"], "controller_started");
    assert_eq!(code(&verify(&state, &[])), 0);

    // A trail exists now: never replaced.
    let before = std::fs::read(state.join("audit.jsonl")).unwrap_or_default();
    let out = c.refused_start(&["--new-audit-trail"], REFUSAL);
    assert_eq!(code(&out), 1);
    assert!(refusal(&out).contains("never replaced"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(state.join("audit.jsonl")).unwrap_or_default(),
        before
    );
}

#[test]
fn a_rolled_back_trail_verifies_alone_but_the_anchor_catches_it() {
    if skip_unless_root("rolled back trail") {
        return;
    }
    let out_of_state = elsewhere();
    let anchor = out_of_state.path().join("audit.anchor");
    let flags = ["--audit-anchor".to_string(), s(&anchor)];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut c = TestController::start(CONTRACT, &flags);
    spawn_true(&c);
    c.stop();
    let state = c.state_dir().to_path_buf();
    let old_log = std::fs::read(state.join("audit.jsonl")).unwrap_or_default();
    let old_head = std::fs::read(state.join("audit.head")).unwrap_or_default();
    let kept = entries(&state).len();
    c.restart_with(&flags);
    spawn_true(&c);
    c.stop();
    let mode = std::fs::metadata(&anchor).map(|m| m.permissions().mode() & 0o777);
    assert_eq!(mode.ok(), Some(0o600));
    let out = verify(&state, &["--anchor", &s(&anchor)]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert!(
        stdout(&out).contains("matches the anchor"),
        "{}",
        stdout(&out)
    );

    let _ = std::fs::write(state.join("audit.jsonl"), &old_log);
    let _ = std::fs::write(state.join("audit.head"), &old_head);
    // Without the anchor, the older copy is a perfectly good trail.
    let out = verify(&state, &[]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    // With it, the first head written after the copy is missing.
    let first_missing = kept + 1;
    let out = verify(&state, &["--anchor", &s(&anchor)]);
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    assert!(
        stdout(&out).contains(&format!("at entry {first_missing}:"))
            && stdout(&out).contains("rolled back"),
        "{}",
        stdout(&out)
    );
    let v = verify_json(&state, &["--anchor", &s(&anchor)]);
    assert_eq!(v["problem"]["kind"], "rolled_back", "{v}");
    assert_eq!(v["problem"]["at"], first_missing, "{v}");
    assert_eq!(v["anchor"]["ok"], false, "{v}");

    let out = c.refused_start(&flags, REFUSAL);
    assert_eq!(code(&out), 1);
    let why = refusal(&out);
    assert!(
        why.contains("does not match the anchor")
            && why.contains(&format!("entry {first_missing}")),
        "{why}"
    );
    // Started without its anchor, it would go on: the anchor is what catches it.
    c.restart_with(&[]);
    c.stop();
}

#[test]
fn a_forged_anchor_line_is_reported_and_the_controller_refuses_it() {
    if skip_unless_root("forged anchor") {
        return;
    }
    let out_of_state = elsewhere();
    let anchor = out_of_state.path().join("audit.anchor");
    let flags = ["--audit-anchor".to_string(), s(&anchor)];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut c = TestController::start(CONTRACT, &flags);
    spawn_true(&c);
    c.stop();
    let state = c.state_dir().to_path_buf();
    let text = std::fs::read_to_string(&anchor).unwrap_or_default();
    let lines = text.lines().count();
    assert!(lines >= 2, "{text}");
    let last = text.lines().last().unwrap_or_default();
    // A head the trail never had, in the anchor's own format, without the key.
    let forged = last.replace("seq=", "seq=9");
    let _ = std::fs::write(&anchor, format!("{text}{forged}\n"));
    let out = verify(&state, &["--anchor", &s(&anchor)]);
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    assert!(
        stdout(&out).contains(&format!("line {}", lines + 1)) && stdout(&out).contains("forged"),
        "{}",
        stdout(&out)
    );
    let v = verify_json(&state, &["--anchor", &s(&anchor)]);
    assert_eq!(v["problem"]["kind"], "anchor", "{v}");
    let out = c.refused_start(&flags, REFUSAL);
    assert_eq!(code(&out), 1);
    assert!(refusal(&out).contains("forged"), "{}", stderr(&out));
}

#[test]
fn an_anchor_inside_the_state_directory_or_through_a_symlink_is_refused() {
    if skip_unless_root("anchor place") {
        return;
    }
    let mut c = TestController::start(CONTRACT, &[]);
    c.stop();
    let inside = c.state_dir().join("workers/audit.anchor");
    let out = c.refused_start(&["--audit-anchor", &s(&inside)], REFUSAL);
    assert_eq!(code(&out), 1);
    assert!(
        refusal(&out).contains("inside the state directory"),
        "{}",
        stderr(&out)
    );
    assert!(!inside.exists());

    let out_of_state = elsewhere();
    let target = out_of_state.path().join("elsewhere");
    let link = out_of_state.path().join("audit.anchor");
    let _ = std::os::unix::fs::symlink(&target, &link);
    let out = c.refused_start(&["--audit-anchor", &s(&link)], REFUSAL);
    assert_eq!(code(&out), 1);
    assert!(refusal(&out).contains("a symlink"), "{}", stderr(&out));
    assert!(!target.exists(), "nothing was written through the symlink");
}

/// A syslog socket of our own, standing in for /dev/log.
struct FakeSyslog {
    _dir: tempfile::TempDir,
    path: PathBuf,
    socket: UnixDatagram,
}

impl FakeSyslog {
    fn new() -> FakeSyslog {
        let dir = elsewhere();
        let path = dir.path().join("log");
        let socket = match UnixDatagram::bind(&path) {
            Ok(s) => s,
            Err(e) => panic!("bind: {e}"),
        };
        let _ = socket.set_read_timeout(Some(Duration::from_millis(200)));
        FakeSyslog {
            _dir: dir,
            path,
            socket,
        }
    }

    /// Every message received so far.
    fn messages(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = self.socket.recv(&mut buf) {
            out.push(String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).to_string());
        }
        out
    }
}

#[test]
fn the_syslog_anchor_sends_each_head_and_its_journal_output_verifies() {
    if skip_unless_root("syslog anchor") {
        return;
    }
    let syslog = FakeSyslog::new();
    let target = format!("syslog:{}", s(&syslog.path));
    let mut c = TestController::start(CONTRACT, &["--audit-anchor", &target]);
    spawn_true(&c);
    c.stop();
    let state = c.state_dir().to_path_buf();
    let messages = syslog.messages();
    assert!(messages.len() >= 3, "{messages:?}");
    for m in &messages {
        assert!(m.starts_with("<85>hatchery-audit["), "{m}");
    }
    // What `journalctl -t hatchery-audit -o cat` prints: each message without its header.
    let journal: String = messages
        .iter()
        .filter_map(|m| m.split_once("]: ").map(|(_, text)| format!("{text}\n")))
        .collect();
    let dir = elsewhere();
    let saved = dir.path().join("journal.txt");
    let _ = std::fs::write(&saved, &journal);
    let out = verify(&state, &["--anchor", &s(&saved)]);
    assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    let v = verify_json(&state, &["--anchor", &s(&saved)]);
    assert_eq!(v["anchor"]["heads_checked"], messages.len(), "{v}");
    // The raw syslog lines (a syslog file) read alike.
    let raw = dir.path().join("syslog.txt");
    let _ = std::fs::write(&raw, messages.join("\n") + "\n");
    assert_eq!(code(&verify(&state, &["--anchor", &s(&raw)])), 0);

    let out = c.refused_start(
        &[
            "--audit-anchor",
            &format!("syslog:{}", s(&dir.path().join("none"))),
        ],
        REFUSAL,
    );
    assert_eq!(code(&out), 1);
    assert!(
        refusal(&out).contains("cannot reach the syslog socket"),
        "{}",
        stderr(&out)
    );
}

/// A small tmpfs, unmounted when dropped.
struct FullDisk {
    dir: tempfile::TempDir,
}

impl FullDisk {
    /// A 16 KiB tmpfs, filled.
    fn new() -> Option<FullDisk> {
        let disk = FullDisk::mount("16k")?;
        // Fill it: the anchor's first write will find no room.
        let _ = run_with_timeout(
            Command::new("dd")
                .args(["if=/dev/zero", "bs=4k"])
                .arg(format!("of={}", s(&disk.dir.path().join("fill")))),
            Duration::from_secs(10),
        );
        Some(disk)
    }

    /// An empty tmpfs of `size` (and its options, such as `nr_inodes=40`).
    fn mount(size: &str) -> Option<FullDisk> {
        let dir = elsewhere();
        let out = mount_tmpfs(dir.path(), size);
        if code(&out) != 0 {
            eprintln!("SKIP full disk: cannot mount a tmpfs: {}", stderr(&out));
            return None;
        }
        Some(FullDisk { dir })
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        let _ = run_with_timeout(
            Command::new("umount").arg(self.dir.path()),
            Duration::from_secs(10),
        );
    }
}

#[test]
fn an_anchor_that_cannot_be_written_engages_the_kill_switch() {
    if skip_unless_root("full anchor") {
        return;
    }
    let Some(disk) = FullDisk::new() else {
        return;
    };
    let anchor = disk.dir.path().join("audit.anchor");
    let mut c = TestController::start(CONTRACT, &["--audit-anchor", &s(&anchor)]);
    let start = Instant::now();
    while !c.log().contains("the audit anchor cannot be written") {
        assert!(start.elapsed() < LONG, "no error logged: {}", c.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The next decision finds the anchor failing and stops admissions.
    let _ = c.cli(&["spawn", "--", "true"]);
    c.wait_for("the kill switch", LONG, |v| v["kill_switch"] == true);
    let out = c.cli(&["spawn", "--", "true"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("deny_kill_switch"),
        "{}",
        stderr(&out)
    );
    // Released, it engages again at once: nothing is admitted while the anchor fails.
    let out = c.cli(&["kill-switch", "--release"]);
    c.wait_for("the kill switch again", LONG, |v| v["kill_switch"] == true);
    c.stop();
    // The trail is on disk while the anchor fails: what it records was answered as
    // done (the release), and each engagement the failure caused is recorded with why.
    let events: Vec<(String, String)> = entries(&c.state)
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or_default().to_string(),
                e["details"]["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    let released = events
        .iter()
        .filter(|(e, _)| e == "kill_switch_released")
        .count();
    assert_eq!(
        released,
        usize::from(code(&out) == 0),
        "{events:?} {}",
        stderr(&out)
    );
    let engaged_after = |at: usize| {
        events.iter().skip(at).any(|(e, r)| {
            e == "kill_switch_engaged" && r == "the audit anchor could not be written"
        })
    };
    assert!(engaged_after(0), "{events:?}");
    if let Some(at) = events.iter().position(|(e, _)| e == "kill_switch_released") {
        assert!(
            engaged_after(at),
            "released and never engaged again: {events:?}"
        );
    }
    drop(disk);
}

/// A worker that writes more than its state directory's file system holds (within its
/// own and every worker's output cap) used to fill it: the next decision could not be
/// recorded, and the controller stopped every worker. Worker logs now leave a sixteenth
/// of the file system free for the trail beside them.
#[test]
fn a_worker_cannot_fill_the_trails_file_system_with_its_output() {
    if skip_unless_root("worker output on a small disk") {
        return;
    }
    let Some((disk, state, c)) = controller_on_small_disk("4m") else {
        return;
    };
    let out = c.cli(&[
        "spawn",
        "--wait",
        "--",
        "sh",
        "-c",
        "head -c 8000000 /dev/zero; echo done",
    ]);
    assert_ne!(code(&out), 125, "{} {}", stderr(&out), c.log());
    let out = c.cli(&["spawn", "--wait", "--", "true"]);
    assert_eq!(
        code(&out),
        0,
        "the next worker was refused: {}\n{}",
        stderr(&out),
        c.log()
    );
    let logs: u64 = std::fs::read_dir(state.join("workers"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    assert!(
        logs > 1 << 20,
        "the worker wrote too little to prove anything: {logs}"
    );
    assert!(
        logs <= (4 << 20) - (4 << 20) / 16,
        "worker logs took {logs} bytes of 4 MiB"
    );
    assert!(!c.log().contains("kill switch"), "{}", c.log());
    // A path the worker writes itself is the kernel's to fill: the operator is told.
    let ws = disk.dir.path().join("ws");
    assert!(std::fs::create_dir(&ws).is_ok());
    let out = c.cli(&["spawn", "--wait", "--rw", &s(&ws), "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        c.log()
            .contains("the worker may write to the state directory's file system"),
        "{}",
        c.log()
    );
    stop_intact(c, &state, disk);
}

/// Each worker's log is a file: workers enough to use every inode of the state
/// directory's file system, or every block (a log of one byte takes a block), left none
/// for the trail's next head. A launch now leaves the last sixteenth of both to the
/// trail: it is refused, and nothing else stops.
#[test]
fn workers_cannot_use_up_the_trails_inodes_or_blocks() {
    if skip_unless_root("worker logs, inodes and blocks") {
        return;
    }
    for (options, most) in [("16m,nr_inodes=40", 45), ("512k", 200)] {
        let Some((disk, state, c)) = controller_on_small_disk(options) else {
            return;
        };
        let mut refused = false;
        for _ in 0..most {
            let out = c.cli(&["spawn", "--wait", "--", "sh", "-c", "echo x"]);
            if code(&out) != 0 {
                assert!(
                    stderr(&out).contains("no log for the worker"),
                    "{options}: {} {}",
                    stderr(&out),
                    c.log()
                );
                refused = true;
                break;
            }
        }
        assert!(
            refused,
            "{options}: {most} logs fitted: the test proves nothing"
        );
        let out = c.cli(&["ps"]);
        assert_eq!(code(&out), 0, "{} {}", stderr(&out), c.log());
        stop_intact(c, &state, disk);
    }
}

/// A controller whose state directory is on a tmpfs of `options` (its size first).
fn controller_on_small_disk(options: &str) -> Option<(FullDisk, PathBuf, TestController)> {
    let disk = FullDisk::mount(options)?;
    let state = disk.dir.path().join("state");
    let c = TestController::start_in(CONTRACT, Some(&state), &[]);
    Some((disk, state, c))
}

/// Stops `c`, which never engaged its kill switch, and checks its trail.
fn stop_intact(mut c: TestController, state: &Path, disk: FullDisk) {
    assert!(!c.log().contains("kill switch"), "{}", c.log());
    c.stop();
    assert_eq!(code(&verify(state, &[])), 0);
    drop(disk);
}

#[test]
fn concurrent_spawns_sharing_syncs_are_each_answered_and_each_in_the_trail() {
    if skip_unless_root("group commit") {
        return;
    }
    // Clients at once: their decisions share syncs. Each is looked for in the trail as
    // soon as it is answered (the order itself, answer after sync, is checked where the
    // sync can be watched: the engine's own tests).
    let mut c = TestController::start(CONTRACT, &[]);
    let shared = &c;
    let late: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6)
            .map(|_| {
                scope.spawn(|| {
                    let mut late = Vec::new();
                    for _ in 0..4 {
                        let id = match shared.spawn(&[], "true") {
                            Ok(id) => id,
                            Err(out) => panic!("spawn: {} {}", stderr(&out), shared.log()),
                        };
                        let written = shared
                            .audit("replication_requested")
                            .iter()
                            .any(|e| e["worker_id"] == id.as_str());
                        if !written {
                            late.push(id);
                        }
                    }
                    late
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    assert!(
        late.is_empty(),
        "answered before their decision was in the trail: {late:?}"
    );
    assert_eq!(c.audit("replication_requested").len(), 24);
    c.stop();
}

/// Whoever can edit the trail chooses what `verify` quotes of it: a field name that sets
/// the window title and clears the screen to draw "intact" is shown escaped.
#[test]
fn a_tampered_line_is_quoted_escaped_never_driving_the_terminal() {
    if skip_unless_root("escaped damage") {
        return;
    }
    let mut c = TestController::start(CONTRACT, &[]);
    spawn_true(&c);
    c.stop();
    let state = c.state_dir().to_path_buf();
    let trail = std::fs::read_to_string(state.join("audit.jsonl")).unwrap_or_default();
    let mut lines: Vec<String> = trail.lines().map(str::to_string).collect();
    assert!(lines.len() >= 3, "{trail}");
    lines[2] =
        "{\"seq\":3,\"\\u001b]0;PWNED\\u0007\\u001b[2J\\u001b[1;1Haudit trail intact\":1}".into();
    std::fs::write(state.join("audit.jsonl"), format!("{}\n", lines.join("\n")))
        .unwrap_or_else(|e| panic!("{e}"));
    let out = verify(&state, &[]);
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        !said.contains('\u{1b}') && !said.contains('\u{7}'),
        "{said:?}"
    );
    assert!(said.contains("\\u{1b}]0;PWNED"), "quoted escaped: {said}");
}

/// `audit tail -n 1` held the whole trail in memory (450 MB for a 181 MB trail), and `-f`
/// read and parsed all of it again every 300 ms: it keeps the entries it shows, and
/// follows by reading what was appended.
#[test]
fn audit_tail_of_a_large_trail_holds_only_what_it_shows_and_follows_appends() {
    if skip_unless_root("large tail") {
        return;
    }
    let mut c = TestController::start(CONTRACT, &[]);
    c.stop();
    let state = c.state_dir().to_path_buf();
    // 150,000 entries more, each checked as `tail` reads it.
    let mut log = audit::AuditLog::open(&state, audit_key(&state))
        .unwrap_or_else(|e| panic!("open the trail: {e}"));
    let detail = "x".repeat(200);
    for i in 0..150_000u64 {
        log.append(
            "worker_report",
            "controller",
            None,
            serde_json::json!({ "i": i, "pad": detail }),
        );
    }
    log.sync().unwrap_or_else(|e| panic!("sync: {e}"));
    let trail = std::fs::read_to_string(state.join("audit.jsonl")).unwrap_or_default();
    let first = trail.lines().last().unwrap_or_default().to_string();
    assert!(first.contains("\"i\":149999"), "{first}");
    let size_mb = trail.len() >> 20;
    drop(trail);

    let mut child = Command::new(hatchery())
        .args(["audit", "tail", "-n", "1", "-f", "--json", "--state-dir"])
        .arg(&state)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    // Whatever happens, it ends within a minute (a `tail` that printed nothing would
    // leave the reads below waiting).
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if stopped.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    });
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap_or_else(|| panic!("stdout")));
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut out, &mut line);
    let hwm_kib = proc_status(child.id(), "VmHWM")
        .and_then(|v| {
            v.split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        })
        .unwrap_or(u64::MAX);
    // One more entry, appended: followed.
    let appended = log
        .record("worker_report", "controller", None, serde_json::json!({}))
        .unwrap_or_else(|e| panic!("record: {e}"));
    let appended = serde_json::to_string(&appended).unwrap_or_default();
    let mut next = String::new();
    let _ = std::io::BufRead::read_line(&mut out, &mut next);
    let _ = child.kill();
    let _ = child.wait();
    let _ = stop.send(());
    let _ = watchdog.join();
    assert_eq!(line.trim_end(), first, "the last entry");
    assert_eq!(next.trim_end(), appended, "the appended entry");
    assert!(
        hwm_kib < 40 << 10,
        "a {size_mb} MB trail took {hwm_kib} KiB to show its last entry"
    );
}

/// `audit tail` shows no entry the chain refuses (here one appended without the key, by
/// someone who can write the state directory), and ends with status 1 there; `audit
/// verify` calls a trail replaced by a symlink, a directory or a FIFO damage (1), never a
/// file it could not read (2).
#[test]
fn tail_shows_no_forged_entry_and_a_replaced_trail_is_damage() {
    if skip_unless_root("forged and replaced trails") {
        return;
    }
    let mut c = TestController::start(CONTRACT, &[]);
    let state = c.state.clone();
    c.stop();
    let trail = state.join("audit.jsonl");
    let mut last = entries(&state).pop().unwrap_or(Value::Null);
    let seq = last["seq"].as_u64().unwrap_or(0);
    last["seq"] = Value::from(seq + 1);
    last["event"] = Value::from("kill_switch_released");
    let mut text = std::fs::read_to_string(&trail).unwrap_or_default();
    text.push_str(&format!("{last}\n"));
    assert!(std::fs::write(&trail, &text).is_ok());
    let tail = |extra: &[&str]| {
        run_with_timeout(
            Command::new(hatchery())
                .args(["audit", "tail", "--state-dir"])
                .arg(&state)
                .args(extra),
            Duration::from_secs(30),
        )
    };
    for extra in [&[][..], &["--json"][..]] {
        let out = tail(extra);
        assert_eq!(code(&out), 1, "{}", stderr(&out));
        assert!(
            !stdout(&out).contains("kill_switch_released"),
            "{}",
            stdout(&out)
        );
        assert!(
            stdout(&out).contains("controller_stopped"),
            "{}",
            stdout(&out)
        );
        assert!(
            stderr(&out).contains(&format!("damaged at entry {}", seq + 1)),
            "{}",
            stderr(&out)
        );
    }
    let real = state.join("real.jsonl");
    assert!(std::fs::rename(&trail, &real).is_ok());
    let replacements: [(&str, &dyn Fn() -> bool); 3] = [
        ("a symbolic link", &|| {
            std::os::unix::fs::symlink(&real, &trail).is_ok()
        }),
        ("a directory", &|| std::fs::create_dir(&trail).is_ok()),
        ("a FIFO", &|| {
            code(&run_with_timeout(
                Command::new("mkfifo").arg(&trail),
                Duration::from_secs(10),
            )) == 0
        }),
    ];
    for (kind, make) in replacements {
        let _ = std::fs::remove_file(&trail);
        let _ = std::fs::remove_dir(&trail);
        assert!(make(), "{kind}");
        let out = verify(&state, &[]);
        assert_eq!(code(&out), 1, "{kind}: {} {}", stdout(&out), stderr(&out));
        assert!(stdout(&out).contains(kind), "{}", stdout(&out));
    }
}

#[test]
fn an_append_a_crash_cut_short_is_said_and_removed_not_a_controller_that_cannot_start() {
    if skip_unless_root("torn trail") {
        return;
    }
    let mut c = TestController::start(CONTRACT, &[]);
    spawn_true(&c);
    c.crash();
    let state = c.state_dir().to_path_buf();
    let whole = std::fs::read(state.join("audit.jsonl")).unwrap_or_default();
    let n = entries(&state).len();
    // What a SIGKILL between the pages of one write, or a power loss before its sync,
    // leaves after the last synced entry: the start of the next, no newline.
    let torn = format!("{{\"seq\":{},\"time\":\"2026", n + 1);
    let mut with_torn = whole.clone();
    with_torn.extend_from_slice(torn.as_bytes());
    std::fs::write(state.join("audit.jsonl"), &with_torn).unwrap_or_else(|e| panic!("{e}"));
    let out = verify(&state, &[]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert!(
        stdout(&out).contains(&format!("{} bytes of a partial entry", torn.len())),
        "{}",
        stdout(&out)
    );
    assert_eq!(verify_json(&state, &[])["torn_tail_bytes"], torn.len());
    // The controller starts, and its crash recovery says what it removed.
    c.restart();
    c.stop();
    let trail = entries(&state);
    let recovered: Vec<&Value> = trail
        .iter()
        .filter(|e| e["event"] == "crash_recovered")
        .collect();
    assert!(
        recovered
            .iter()
            .any(|e| e["details"]["torn_entry_bytes_removed"] == torn.len()),
        "{recovered:?}"
    );
    let out = verify(&state, &[]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert!(!stdout(&out).contains("partial"), "{}", stdout(&out));
    // A cut into the synced entries is damage all the same.
    let synced = std::fs::read(state.join("audit.jsonl")).unwrap_or_default();
    let cut = synced.get(..synced.len() - 1).unwrap_or_default();
    std::fs::write(state.join("audit.jsonl"), cut).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(code(&verify(&state, &[])), 1);
}
