//! `run --max-output SIZE`: at most SIZE bytes of stdout and stderr together reach the
//! caller, the report says whether output was cut, and nothing can hold the run open: a
//! command that prints without end dies of SIGPIPE at the cap, or, if it ignores SIGPIPE,
//! is ended by its timeout. Every run here has a --timeout and a hard limit around it.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn read_report(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no report at {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("report is not JSON: {e}: {text}"))
}

/// `hatchery run --report R FLAGS -- COMMAND`; returns the output and the report.
fn run_with_report(flags: &[&str], command: &[&str]) -> (std::process::Output, Value) {
    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    let mut cmd = Command::new(hatchery());
    cmd.arg("run")
        .arg("--report")
        .arg(&report)
        .args(flags)
        .arg("--")
        .args(command);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60));
    let v = read_report(&report);
    (out, v)
}

/// The payload's own stderr: hatchery's lines (`hatchery: ...`) removed.
fn payload_stderr(out: &std::process::Output) -> Vec<u8> {
    the_commands_lines(&out.stderr)
}

/// `bytes` without hatchery's own lines (`hatchery: ...`).
fn the_commands_lines(bytes: &[u8]) -> Vec<u8> {
    let mut kept = Vec::new();
    for line in bytes.split_inclusive(|b| *b == b'\n') {
        if !line.starts_with(b"hatchery: ") {
            kept.extend_from_slice(line);
        }
    }
    kept
}

#[test]
fn endless_output_is_cut_at_exactly_the_cap_and_the_writer_dies_of_sigpipe() {
    if skip_unless_root("endless_output_is_cut_at_exactly_the_cap_and_the_writer_dies_of_sigpipe") {
        return;
    }
    let (out, report) = run_with_report(&["--max-output", "1000", "--timeout", "30s"], &["yes"]);
    assert_eq!(out.stdout.len(), 1000, "{report}");
    assert!(
        out.stdout.chunks(2).all(|c| c == b"y\n"),
        "the bytes are yes's own"
    );
    assert_eq!(report["output_truncated"], Value::Bool(true), "{report}");
    assert_eq!(report["output_bytes"], 1000, "{report}");
    assert_eq!(report["limits"]["max_output_bytes"], 1000, "{report}");
    // Ended by the cap (SIGPIPE on the next write), not by the timeout.
    assert_eq!(code(&out), 141, "{report}");
    assert_eq!(report["signal"], libc::SIGPIPE, "{report}");
    assert_eq!(report["timed_out"], Value::Bool(false), "{report}");
    assert!(
        stderr(&out).contains("output cut at 1000 bytes"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_writer_that_ignores_sigpipe_gets_epipe_and_is_never_blocked() {
    if skip_unless_root("a_writer_that_ignores_sigpipe_gets_epipe_and_is_never_blocked") {
        return;
    }
    // Python ignores SIGPIPE: after the cap every write fails with EPIPE at once, and the
    // writer goes on. It exits 42 after 1000 of them: proof that none of them blocked.
    let script = "import os\nfailed = 0\nwhile failed < 1000:\n    try:\n        os.write(1, b'x' * 4096)\n    except BrokenPipeError:\n        failed += 1\nos._exit(42)\n";
    let (out, report) = run_with_report(
        &["--max-output", "10K", "--timeout", "60s"],
        &["python3", "-c", script],
    );
    assert_eq!(code(&out), 42, "{report} {}", stderr(&out));
    assert_eq!(out.stdout.len(), 10 << 10, "{report}");
    assert_eq!(report["output_bytes"], 10 << 10, "{report}");
    assert_eq!(report["output_truncated"], Value::Bool(true), "{report}");
    assert_eq!(report["timed_out"], Value::Bool(false), "{report}");
}

#[test]
fn a_writer_that_never_stops_is_ended_by_its_timeout_with_the_cap_kept() {
    let test = "a_writer_that_never_stops_is_ended_by_its_timeout_with_the_cap_kept";
    if skip_unless_root(test) {
        return;
    }
    // `trap '' PIPE` keeps the shell alive past the cap; its echo fails with EPIPE for ever.
    let (out, report) = run_with_report(
        &["--max-output", "100", "--timeout", "3s"],
        &[
            "sh",
            "-c",
            "trap '' PIPE; while :; do echo line 2>/dev/null; done",
        ],
    );
    assert_eq!(code(&out), 124, "{report} {}", stderr(&out));
    assert_eq!(report["timed_out"], Value::Bool(true), "{report}");
    // However slow the start (an emulated VM), whatever passed is within the cap.
    let bytes = report["output_bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(bytes <= 100, "{report}");
    assert_eq!(out.stdout.len() as u64, bytes, "{report}");
}

#[test]
fn the_cap_counts_stdout_and_stderr_together() {
    if skip_unless_root("the_cap_counts_stdout_and_stderr_together") {
        return;
    }
    // One line of each first, read before the flood (had the flood filled stdout's pipe
    // before the relay's first read, stdout alone would have reached the cap).
    let (out, report) = run_with_report(
        &["--max-output", "5000", "--timeout", "30s"],
        &[
            "sh",
            "-c",
            "echo out; echo err >&2; sleep 0.3; while :; do echo out; echo err >&2; done",
        ],
    );
    let err = payload_stderr(&out);
    assert_eq!(out.stdout.len() + err.len(), 5000, "{report}");
    assert!(
        !out.stdout.is_empty() && !err.is_empty(),
        "both streams passed"
    );
    assert!(
        out.stdout
            .split(|b| *b == b'\n')
            .all(|l| l.is_empty() || b"out".starts_with(l))
    );
    assert!(
        err.split(|b| *b == b'\n')
            .all(|l| l.is_empty() || b"err".starts_with(l))
    );
    assert_eq!(report["output_bytes"], 5000, "{report}");
    assert_eq!(report["output_truncated"], Value::Bool(true), "{report}");
}

#[test]
fn output_within_the_cap_passes_whole_with_the_commands_exit_status() {
    if skip_unless_root("output_within_the_cap_passes_whole_with_the_commands_exit_status") {
        return;
    }
    let (out, report) = run_with_report(
        &["--max-output", "1M", "--timeout", "30s"],
        &["sh", "-c", "seq 1 1000; echo done >&2; exit 7"],
    );
    assert_eq!(code(&out), 7, "{report}");
    let want: String = (1..=1000).map(|i| format!("{i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    assert_eq!(payload_stderr(&out), b"done\n");
    assert_eq!(report["output_bytes"], want.len() + 5, "{report}");
    assert_eq!(report["output_truncated"], Value::Bool(false), "{report}");
    assert!(!stderr(&out).contains("output cut"), "{}", stderr(&out));
}

#[test]
fn output_of_exactly_the_cap_is_not_truncated() {
    if skip_unless_root("output_of_exactly_the_cap_is_not_truncated") {
        return;
    }
    let (out, report) = run_with_report(
        &["--max-output", "6", "--timeout", "30s"],
        &["printf", "abcdef"],
    );
    assert_eq!(
        (code(&out), out.stdout.as_slice()),
        (0, b"abcdef".as_slice())
    );
    assert_eq!(report["output_truncated"], Value::Bool(false), "{report}");
    assert_eq!(report["output_bytes"], 6, "{report}");
}

#[test]
fn without_a_cap_output_is_inherited_and_not_counted() {
    if skip_unless_root("without_a_cap_output_is_inherited_and_not_counted") {
        return;
    }
    let (out, report) = run_with_report(
        &["--timeout", "30s"],
        &["sh", "-c", "echo hi; test -p /dev/stdout && echo pipe"],
    );
    // The command's stdout is the caller's own pipe, not one of hatchery's.
    assert_eq!(stdout(&out), "hi\npipe", "{report}");
    assert_eq!(report["output_bytes"], Value::Null, "{report}");
    assert_eq!(report["output_truncated"], Value::Bool(false), "{report}");
    assert_eq!(
        report["limits"]["max_output_bytes"],
        Value::Null,
        "{report}"
    );
}

/// How `child` (a `hatchery run` with a short `--timeout`) ended, within `bound`; past it,
/// a panic saying `stuck` (after killing it, where it can still be killed).
fn exit_within(
    child: &mut std::process::Child,
    bound: Duration,
    stuck: &str,
) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return s,
            Ok(None) if start.elapsed() > bound => {
                let _ = child.kill();
                panic!("{stuck}");
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("wait: {e}"),
        }
    }
}

/// The payload holds the write end of the pipe hatchery reads its output from. splice(2)
/// from a socket with nothing to read holds that pipe's lock while it waits, and
/// hatchery's next read of the pipe waited for the lock uninterruptibly: past `--timeout`
/// (and SIGKILL) for as long as the payload liked. The seccomp floor refuses splice,
/// vmsplice and sendfile under every profile, so the timeout ends the run.
#[test]
fn a_sandbox_cannot_hold_its_output_pipe_to_outlast_the_timeout() {
    if skip_unless_root("a_sandbox_cannot_hold_its_output_pipe_to_outlast_the_timeout") {
        return;
    }
    // Bounded: the payload gives up after 60 s whatever happens.
    let payload = "import os, socket, sys, threading, time\n\
                   a, b = socket.socketpair()\n\
                   def hold():\n    \
                       try:\n        os.splice(a.fileno(), 1, 1)\n    \
                       except OSError as e:\n        print('splice refused', e.errno, file=sys.stderr, flush=True)\n\
                   threading.Thread(target=hold, daemon=True).start()\n\
                   time.sleep(0.5)\n\
                   print('awake', file=sys.stderr, flush=True)\n\
                   time.sleep(60)\n";
    for profile in ["default", "compat"] {
        let mut child = match Command::new(hatchery())
            .args([
                "run",
                "--profile",
                profile,
                "--max-output",
                "1M",
                "--timeout",
                "2s",
                "--",
                "python3",
                "-c",
                payload,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => panic!("cannot start hatchery: {e}"),
        };
        let status = exit_within(
            &mut child,
            Duration::from_secs(45),
            &format!("under {profile}, the payload held hatchery past its timeout"),
        );
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        assert_eq!(status.code(), Some(124), "{profile}: {err}");
        assert!(err.contains("splice refused 38"), "{profile}: {err}");
    }
}

/// A reader of hatchery's stdout that splices from it into a socket nobody reads holds
/// that pipe's lock for as long as the socket stays full, and every write to the pipe,
/// non-blocking or not, waits for the lock uninterruptibly. The relay makes those writes
/// on a thread of its own: the run's own loop still ends the sandbox at its timeout,
/// removes its cgroup and writes its report while the reader holds the write.
#[test]
fn a_reader_that_holds_the_output_pipe_cannot_keep_the_sandbox_past_its_timeout() {
    if skip_unless_root(
        "a_reader_that_holds_the_output_pipe_cannot_keep_the_sandbox_past_its_timeout",
    ) {
        return;
    }
    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    let (read_end, write_end) = pipe_pair();
    // Bounded: the reader stops holding the pipe after 40 s whatever happens.
    let splicer = "import os, signal, socket\n\
                   signal.alarm(40)\n\
                   a, b = socket.socketpair()\n\
                   while True:\n    os.splice(0, a.fileno(), 1 << 20)\n";
    let mut reader = match Command::new("python3")
        .args(["-c", splicer])
        .stdin(Stdio::from(read_end))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("cannot start the reader: {e}"),
    };
    let mut run = match Command::new(hatchery())
        .arg("run")
        .arg("--report")
        .arg(&report)
        .args(["--max-output", "100M", "--timeout", "2s", "--", "yes"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            let _ = reader.kill();
            let _ = reader.wait();
            panic!("cannot start hatchery: {e}");
        }
    };
    let start = Instant::now();
    let written = loop {
        let text = std::fs::read_to_string(&report).unwrap_or_default();
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            break Some(v);
        }
        if start.elapsed() > Duration::from_secs(20) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Whether the reader was still holding the pipe when the report came.
    let holding = matches!(reader.try_wait(), Ok(None));
    let _ = reader.kill();
    let _ = reader.wait();
    let status = exit_within(
        &mut run,
        Duration::from_secs(30),
        "hatchery did not exit once the reader let go",
    );
    let mut err = String::new();
    if let Some(mut e) = run.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let Some(v) = written else {
        panic!(
            "no report within 20 s of a 2 s timeout: the reader's hold kept the sandbox running: {err}"
        );
    };
    assert!(holding, "the reader stopped before the report came: {v}");
    assert_eq!(v["timed_out"], true, "{v}");
    assert_eq!(v["exit_code"], 124, "{v}");
    assert!(
        v["output_error"]
            .as_str()
            .is_some_and(|e| e.contains("still being written")),
        "{v}"
    );
    assert_eq!(status.code(), Some(124), "{err}");
    assert!(err.contains("still being written"), "{err}");
}

#[test]
fn a_caller_that_stops_reading_cannot_keep_the_timeout_from_ending_the_run() {
    if skip_unless_root("a_caller_that_stops_reading_cannot_keep_the_timeout_from_ending_the_run") {
        return;
    }
    // hatchery's stdout is a pipe this test never reads: once it is full, hatchery must go
    // on waiting for the timeout instead of blocking in write(2).
    let (read_end, write_end) = pipe_pair();
    let mut child = match Command::new(hatchery())
        .args([
            "run",
            "--max-output",
            "100M",
            "--timeout",
            "2s",
            "--",
            "yes",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("cannot start hatchery: {e}"),
    };
    let status = exit_within(
        &mut child,
        Duration::from_secs(60),
        "hatchery blocked on a destination that stopped reading",
    );
    drop(read_end);
    assert_eq!(status.code(), Some(124));
}

#[test]
fn bad_caps_are_usage_errors() {
    for value in ["0", "-1", "2T", "lots", "1.5"] {
        let out = hatchery_cmd(&["run", "--max-output", value, "--", "echo", "ran"]);
        assert_eq!(code(&out), 2, "--max-output {value}: {}", stderr(&out));
        assert!(stderr(&out).contains(value), "{}", stderr(&out));
        assert!(stdout(&out).is_empty(), "something ran");
    }
}

#[test]
fn output_hatchery_cannot_write_is_reported_lost_and_a_file_size_limit_kills_no_supervisor() {
    // The relay writes the caller's file under the caller's file size limit: past it, a
    // write raised SIGXFSZ and killed `run` itself (status 153), which left the sandbox's
    // cgroups and wrote no report; and output accepted from the command was lost unsaid.
    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    let file = dir.path().join("out");
    let out = std::fs::File::create(&file).unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new("prlimit");
    cmd.arg("--fsize=8192")
        .arg("--")
        .arg(hatchery())
        .arg("run")
        .arg("--report")
        .arg(&report)
        .args(["--max-output", "1M", "--timeout", "30s", "--"])
        .args(["sh", "-c", "head -c 30000 /dev/zero; echo \"head $?\" >&2"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("prlimit: {e}"));
    let err = child.stderr.take();
    let status = common::terminal::wait_child(&mut child, Duration::from_secs(60), "run");
    let mut said = String::new();
    if let Some(mut e) = err {
        let _ = std::io::Read::read_to_string(&mut e, &mut said);
    }
    assert_ne!(status.code(), None, "run was killed: {status:?} {said}");
    let r = read_report(&report);
    let why = r["output_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("File too large") && why.contains("lost"),
        "{r}"
    );
    assert!(said.contains("output_error"), "{said}");
    let size = std::fs::metadata(&file).map_or(0, |m| m.len());
    assert_eq!(size, 8192, "the file holds {size} bytes");
}

/// What the command wrote, in order, to a stdout and stderr that are one place.
fn written_in_order(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&the_commands_lines(bytes)).into_owned()
}

/// `hatchery run --max-output` with stdout and stderr both `place` (two descriptors of
/// one open file description, as `2>&1` makes them), a command writing to each in turn.
fn run_into_one_place(place: std::os::fd::OwnedFd, script: &str) -> std::process::ExitStatus {
    let mut cmd = Command::new(hatchery());
    cmd.args(["run", "--max-output", "1M", "--timeout", "30s", "--"])
        .args(["sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::from(
            place.try_clone().unwrap_or_else(|e| panic!("dup: {e}")),
        ))
        .stderr(Stdio::from(place));
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("hatchery run: {e}"));
    // The command's copies of `place` go with it: end-of-file comes when the run ends.
    drop(cmd);
    common::terminal::wait_child(&mut child, Duration::from_secs(60), "hatchery run")
}

/// `2>&1` with a cap (or a terminal on both): stdout and stderr are one place, and what
/// the command wrote there arrives in the order it wrote it. With a pipe each, read in
/// turn, all of one stream came before all of the other.
#[test]
fn a_stdout_and_stderr_that_are_one_place_keep_the_order_of_the_writes() {
    if skip_unless_root("a_stdout_and_stderr_that_are_one_place_keep_the_order_of_the_writes") {
        return;
    }
    let script = "i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo out$i; echo err$i >&2; done";
    let want: String = (1..=40).map(|i| format!("out{i}\nerr{i}\n")).collect();

    // One pipe (`2>&1 | ...`).
    let (r, w) = nix::unistd::pipe().unwrap_or_else(|e| panic!("pipe: {e}"));
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::fs::File::from(r), &mut got);
        got
    });
    let status = run_into_one_place(w, script);
    let got = reader.join().unwrap_or_default();
    assert_eq!(status.code(), Some(0));
    assert_eq!(written_in_order(&got), want, "through one pipe");

    // One file (`>log 2>&1`).
    let dir = shared_tempdir();
    let log = dir.path().join("log");
    let file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}"));
    let status = run_into_one_place(std::os::fd::OwnedFd::from(file), script);
    assert_eq!(status.code(), Some(0));
    let got = std::fs::read(&log).unwrap_or_default();
    assert_eq!(written_in_order(&got), want, "into one file");
}
