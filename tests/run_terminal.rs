//! `run` and the caller's terminal: a sandbox never holds a descriptor of it, nor any
//! descriptor other than its stdout and stderr streams through which it could write to
//! the caller. A terminal on stdin is relayed through a new pseudo-terminal of the
//! sandbox's own, a terminal on stdout or stderr alone through pipes, a stdin open for
//! writing through a pipe; `--max-output` counts every byte that reaches the caller.
//!
//! Each attack is first shown to work without hatchery's relay (the probe run directly
//! on the same terminal or file), so that no test here can pass by measuring nothing.
//! Every command has a hard time limit; nothing here uses the network.

mod common;

use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::fds::{HOLD_EXTRA_FDS, assert_extra_fds_reach_a_plain_command, probe_fds};
use common::terminal::{Session, Terminal, wait_child};
use common::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(60);
const PROFILES: [&str; 3] = ["default", "strict", "compat"];

fn read_report(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no report at {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("report is not JSON: {e}: {text}"))
}

/// `hatchery run --report REPORT FLAGS --ro PROBE_DIR -- probe ARGS` as arguments.
fn probe_run_args(report: &Path, flags: &[&str], probe_args: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec!["run".into(), "--report".into(), s(report)];
    a.extend(flags.iter().map(|f| f.to_string()));
    a.extend(["--ro".into(), s(&probe_dir()), "--".into(), s(&probe())]);
    a.extend(probe_args.iter().map(|f| f.to_string()));
    a
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn legacy_tiocsti() -> bool {
    std::fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti").is_ok_and(|v| v.trim() == "1")
}

#[test]
fn a_sandbox_can_neither_type_into_its_callers_terminal_nor_hold_it_under_any_profile() {
    let test = "a_sandbox_can_neither_type_into_its_callers_terminal_nor_hold_it_under_any_profile";
    if skip_unless_root(test) {
        return;
    }
    let mut term = Terminal::open(24, 80);
    term.start_reading();
    let attack = ["tiocsctty", "0", "+", "tiocsti", "0", "id\n"];

    // Without hatchery's relay the same probe types `id` into the terminal's input queue,
    // where the caller's shell would read and run it: as root directly (CAP_SYS_ADMIN),
    // and, where the kernel still has legacy TIOCSTI, from a user namespace without any
    // privilege once it took the terminal that was no session's (the reported attack).
    let mut direct = term.spawn(
        Session::NoControllingTerminal,
        &probe(),
        &attack,
        None,
        None,
    );
    wait_child(&mut direct, LIMIT, "the probe run directly");
    assert_eq!(term.pending_input(), 3, "{}", term.screen_text());
    term.discard_input();
    if legacy_tiocsti() {
        let probe = s(&probe());
        let mut args = vec!["-r", "--", probe.as_str()];
        args.extend(attack);
        let mut userns = term.spawn(
            Session::NoControllingTerminal,
            Path::new("unshare"),
            &args,
            None,
            None,
        );
        wait_child(&mut userns, LIMIT, "the probe in a user namespace");
        assert_eq!(term.pending_input(), 3, "{}", term.screen_text());
        term.discard_input();
    }

    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    for profile in PROFILES {
        for session in [Session::ControllingTerminal, Session::NoControllingTerminal] {
            let mut probe_args = vec!["fds", "+"];
            probe_args.extend(attack);
            probe_args.extend(["+", "write-fd", "0", "3"]);
            let args = probe_run_args(
                &report,
                &["--profile", profile, "--timeout", "30s"],
                &probe_args,
            );
            let before = term.screen().len();
            let mut child = term.spawn(session, &hatchery(), &refs(&args), None, None);
            let status = wait_child(&mut child, LIMIT, "hatchery run");
            // The relay's last bytes may still be on their way to the reader thread.
            let start = std::time::Instant::now();
            let mut screen = String::new();
            while start.elapsed() < Duration::from_secs(5) {
                screen = String::from_utf8_lossy(term.screen().get(before..).unwrap_or_default())
                    .into_owned();
                if screen.contains("ok 0=") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let what = format!("{profile}, {session:?}: {screen:?}");
            assert_eq!(status.code(), Some(0), "{what}");
            assert_eq!(term.pending_input(), 0, "input was injected: {what}");
            // No descriptor of the sandbox's is the caller's terminal; its stdin is a
            // terminal of its own.
            let fds = probe_fds(&screen);
            let caller = format!("chr:{}", term.rdev());
            assert!(fds.iter().all(|(_, k)| *k != caller), "{fds:?} {what}");
            let stdin = fds.iter().find(|(fd, _)| *fd == 0).map(|(_, k)| k.as_str());
            assert!(
                stdin.is_some_and(|k| k.starts_with("chr:")),
                "{fds:?} {what}"
            );
            let r = read_report(&report);
            assert_eq!(r["enforcement"]["stdio"]["stdin"], "pty relay", "{r}");
            assert_eq!(r["enforcement"]["stdio"]["stdout"], "pty relay", "{r}");
            assert_eq!(r["enforcement"]["stdio"]["stderr"], "pty relay", "{r}");
        }
    }
}

#[test]
fn the_output_cap_counts_what_a_sandbox_writes_to_the_terminal_on_its_stdin() {
    let test = "the_output_cap_counts_what_a_sandbox_writes_to_the_terminal_on_its_stdin";
    if skip_unless_root(test) {
        return;
    }
    let mut term = Terminal::open(24, 80);
    term.start_reading();
    // Directly, 100,000 bytes written to descriptor 0 all reach the screen.
    let mut direct = term.spawn(
        Session::ControllingTerminal,
        &probe(),
        &["write-fd", "0", "100000"],
        None,
        None,
    );
    wait_child(&mut direct, LIMIT, "the probe run directly");
    assert_eq!(
        term.wait_for_count(b'Z', 100_000, Duration::from_secs(20)),
        100_000
    );

    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    let stderr_file = dir.path().join("stderr");
    let args = probe_run_args(
        &report,
        &["--max-output", "100", "--timeout", "30s"],
        &["write-fd", "0", "100000"],
    );
    let before = term.screen().len();
    let mut child = term.spawn(
        Session::ControllingTerminal,
        &hatchery(),
        &refs(&args),
        None,
        Some(Stdio::from(must_create(&stderr_file))),
    );
    let status = wait_child(&mut child, LIMIT, "hatchery run --max-output 100");
    // Give any late byte time to show.
    std::thread::sleep(Duration::from_millis(300));
    let screen = term.screen();
    let shown = screen.get(before..).unwrap_or_default();
    let zs = shown.iter().filter(|b| **b == b'Z').count();
    let r = read_report(&report);
    assert!(zs <= 100, "{zs} bytes reached the terminal: {r}");
    assert!(
        shown.len() <= 100,
        "{} bytes reached the terminal",
        shown.len()
    );
    assert_eq!(r["output_truncated"], Value::Bool(true), "{r}");
    assert_eq!(r["output_bytes"], 100, "{r}");
    // At the cap the sandbox's terminal is hung up: the writer, its session leader, gets
    // SIGHUP.
    assert_eq!(status.code(), Some(128 + libc::SIGHUP), "{r}");
    assert_eq!(r["signal"], libc::SIGHUP, "{r}");
    let err = std::fs::read_to_string(&stderr_file).unwrap_or_default();
    assert!(err.contains("output cut at 100 bytes"), "{err}");
}

fn must_create(path: &Path) -> std::fs::File {
    match std::fs::File::create(path) {
        Ok(f) => f,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

fn read_write_file(path: &Path) -> std::fs::File {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

/// Runs `hatchery ARGS` with the given stdin, stdout and stderr to files or pipes.
fn run_with_stdin(args: &[String], stdin: Stdio) -> std::process::Output {
    let mut child = match Command::new(hatchery())
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("cannot start hatchery: {e}"),
    };
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut o = Vec::new();
        if let Some(p) = out.as_mut() {
            let _ = p.read_to_end(&mut o);
        }
        o
    });
    let err_reader = std::thread::spawn(move || {
        let mut e = Vec::new();
        if let Some(p) = err.as_mut() {
            let _ = p.read_to_end(&mut e);
        }
        e
    });
    let status = wait_child(&mut child, LIMIT, "hatchery run");
    std::process::Output {
        status,
        stdout: reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

#[test]
fn a_stdin_open_for_writing_is_relayed_and_cannot_carry_output_past_the_cap() {
    let test = "a_stdin_open_for_writing_is_relayed_and_cannot_carry_output_past_the_cap";
    if skip_unless_root(test) {
        return;
    }
    let dir = shared_tempdir();
    // Directly, a probe writes 100,000 bytes into a read-write stdin file.
    let direct_file = dir.path().join("direct");
    let out = run_with_timeout_stdin(
        Command::new(probe()).args(["write-fd", "0", "100000"]),
        Stdio::from(read_write_file(&direct_file)),
    );
    assert_eq!(stdout(&out), "ok 100000");
    assert_eq!(file_len(&direct_file), 100_000);

    // Through hatchery: nothing reaches the file, and the sandbox's stdin is a pipe.
    let file = dir.path().join("stdin");
    let report = dir.path().join("report.json");
    let args = probe_run_args(
        &report,
        &["--max-output", "100", "--timeout", "30s"],
        &["write-fd", "0", "100000"],
    );
    let out = run_with_stdin(&args, Stdio::from(read_write_file(&file)));
    assert!(file_len(&file) <= 100, "{}", file_len(&file));
    assert_eq!(file_len(&file), 0);
    assert_eq!(
        stdout(&out),
        format!("err {}", libc::EBADF),
        "{}",
        stderr(&out)
    );
    let r = read_report(&report);
    assert_eq!(
        r["enforcement"]["stdio"]["stdin"], "pipe relay (read-write file)",
        "{r}"
    );

    // A socket is as good a way back to the caller: relayed too.
    let (ours, theirs) = match std::os::unix::net::UnixStream::pair() {
        Ok(p) => p,
        Err(e) => panic!("socketpair: {e}"),
    };
    let out = run_with_stdin(&args, Stdio::from(std::os::fd::OwnedFd::from(theirs)));
    assert_eq!(
        stdout(&out),
        format!("err {}", libc::EBADF),
        "{}",
        stderr(&out)
    );
    if let Err(e) = ours.set_nonblocking(true) {
        panic!("{e}");
    }
    let mut buf = vec![0u8; 200_000];
    let got = (&ours).read(&mut buf).unwrap_or(0);
    assert_eq!(got, 0, "bytes came back through the socket");
    let r = read_report(&report);
    assert_eq!(
        r["enforcement"]["stdio"]["stdin"], "pipe relay (socket)",
        "{r}"
    );
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(u64::MAX)
}

fn run_with_timeout_stdin(cmd: &mut Command, stdin: Stdio) -> std::process::Output {
    let mut child = match cmd
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("spawn: {e}"),
    };
    wait_child(&mut child, LIMIT, "probe");
    let mut o = Vec::new();
    let mut e = Vec::new();
    if let Some(mut p) = child.stdout.take() {
        let _ = p.read_to_end(&mut o);
    }
    if let Some(mut p) = child.stderr.take() {
        let _ = p.read_to_end(&mut e);
    }
    std::process::Output {
        status: match child.wait() {
            Ok(s) => s,
            Err(e) => panic!("wait: {e}"),
        },
        stdout: o,
        stderr: e,
    }
}

/// A caller's pipe end is used only the way the caller opened it: the other end is
/// someone else's. A write-only stdin is never read (what was written for the pipe's own
/// reader stays for it), a read-only stdout is never written (the command's output does
/// not go into what the caller reads).
#[test]
fn a_callers_pipe_end_is_used_only_the_way_it_was_opened() {
    if skip_unless_root("a_callers_pipe_end_is_used_only_the_way_it_was_opened") {
        return;
    }
    let (r, w) = pipe_pair();
    if let Err(e) = nix::unistd::write(&w, b"SECRET for the pipe's reader\n") {
        panic!("{e}");
    }
    let args: Vec<String> = ["run", "--timeout", "10s", "--", "cat"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let out = run_with_stdin(&args, Stdio::from(w));
    // End-of-file at once: a stdin that cannot be read has nothing to give.
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stdout(&out).contains("SECRET"), "{}", stdout(&out));
    let mut left = String::new();
    if let Err(e) = std::fs::File::from(r).read_to_string(&mut left) {
        panic!("{e}");
    }
    assert_eq!(left, "SECRET for the pipe's reader\n");

    let (r, w) = pipe_pair();
    let out = match Command::new(hatchery())
        .args([
            "run",
            "--max-output",
            "1M",
            "--timeout",
            "10s",
            "--",
            "echo",
            "INJECTED",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::from(r.try_clone().unwrap_or_else(|e| panic!("{e}"))))
        .stderr(Stdio::piped())
        .output()
    {
        Ok(o) => o,
        Err(e) => panic!("cannot start hatchery: {e}"),
    };
    drop(w);
    let mut read = String::new();
    if let Err(e) = std::fs::File::from(r).read_to_string(&mut read) {
        panic!("{e}");
    }
    assert_eq!(read, "", "{}", stderr(&out));
    // Said at once, not found out at the timeout.
    assert_ne!(code(&out), 124, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("writing the command's output failed"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn what_a_stdin_open_for_writing_holds_still_reaches_the_command() {
    let test = "what_a_stdin_open_for_writing_holds_still_reaches_the_command";
    if skip_unless_root(test) {
        return;
    }
    let dir = shared_tempdir();
    let file = dir.path().join("stdin");
    if let Err(e) = std::fs::write(&file, "hello through the relay\n") {
        panic!("{e}");
    }
    let mut f = read_write_file(&file);
    let _ = f.rewind();
    let report = dir.path().join("report.json");
    let args: Vec<String> = [
        "run",
        "--report",
        &s(&report),
        "--timeout",
        "30s",
        "--",
        "sh",
        "-c",
        "test -p /dev/stdin && echo pipe; cat",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let out = run_with_stdin(&args, Stdio::from(f));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "pipe\nhello through the relay");
    let r = read_report(&report);
    assert_eq!(
        r["enforcement"]["stdio"],
        serde_json::json!({
            "stdin": "pipe relay (read-write file)",
            "stdout": "passed (pipe)",
            "stderr": "passed (pipe)"
        }),
        "{r}"
    );

    // A socket is read with MSG_DONTWAIT, its description left blocking for the caller.
    let (ours, theirs) = match std::os::unix::net::UnixStream::pair() {
        Ok(p) => p,
        Err(e) => panic!("socketpair: {e}"),
    };
    if let Err(e) = (&ours)
        .write_all(b"hello through a socket\n")
        .and_then(|()| ours.shutdown(std::net::Shutdown::Write))
    {
        panic!("{e}");
    }
    let out = run_with_stdin(&args, Stdio::from(std::os::fd::OwnedFd::from(theirs)));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "pipe\nhello through a socket");
    assert_eq!(
        read_report(&report)["enforcement"]["stdio"]["stdin"],
        "pipe relay (socket)"
    );

    // Read-only stdin is passed as it is, at no cost.
    let ro = match std::fs::File::open(&file) {
        Ok(f) => f,
        Err(e) => panic!("{e}"),
    };
    let out = run_with_stdin(&args, Stdio::from(ro));
    assert_eq!(stdout(&out), "hello through the relay");
    let r = read_report(&report);
    assert_eq!(
        r["enforcement"]["stdio"]["stdin"], "passed (read-only file)",
        "{r}"
    );
}

#[test]
fn an_interactive_shell_works_through_the_relay_and_the_terminal_is_left_as_found() {
    let test = "an_interactive_shell_works_through_the_relay_and_the_terminal_is_left_as_found";
    if skip_unless_root(test) {
        return;
    }
    let mut term = Terminal::open(24, 80);
    term.start_reading();
    let modes = term.modes();
    let mut child = term.spawn(
        Session::ControllingTerminal,
        &hatchery(),
        &["run", "--timeout", "30s", "--", "sh"],
        None,
        None,
    );
    // Job control on (the terminal is the shell's controlling terminal), then the prompt.
    assert!(
        term.wait_for("# ", Duration::from_secs(30)),
        "{:?}",
        term.screen_text()
    );
    term.type_bytes(b"echo hi; exit 3\n");
    let status = wait_child(&mut child, LIMIT, "hatchery run -- sh");
    let screen = term.screen_text();
    assert_eq!(status.code(), Some(3), "{screen:?}");
    assert!(
        screen.lines().any(|l| l.trim_end_matches('\r') == "hi"),
        "{screen:?}"
    );
    assert!(!screen.contains("job control turned off"), "{screen:?}");
    assert_eq!(term.modes(), modes, "the terminal's modes changed");
}

#[test]
fn ctrl_c_at_the_callers_keyboard_reaches_the_command_as_sigint() {
    if skip_unless_root("ctrl_c_at_the_callers_keyboard_reaches_the_command_as_sigint") {
        return;
    }
    let mut term = Terminal::open(24, 80);
    term.start_reading();
    let modes = term.modes();
    let mut child = term.spawn(
        Session::ControllingTerminal,
        &hatchery(),
        &[
            "run",
            "--timeout",
            "30s",
            "--",
            "sh",
            "-c",
            "trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 1; done",
        ],
        None,
        None,
    );
    assert!(
        term.wait_for("ready", Duration::from_secs(30)),
        "{}",
        term.screen_text()
    );
    term.type_bytes(&[0x03]);
    let status = wait_child(&mut child, LIMIT, "hatchery run");
    assert_eq!(status.code(), Some(7), "{:?}", term.screen_text());
    // The reader may not have drawn the last output yet when the child is reaped.
    assert!(
        term.wait_for("got-int", Duration::from_secs(10)),
        "{}",
        term.screen_text()
    );
    assert_eq!(term.modes(), modes, "the terminal's modes changed");
}

#[test]
fn the_terminal_is_restored_after_a_timeout_and_after_a_forwarded_sigterm() {
    let test = "the_terminal_is_restored_after_a_timeout_and_after_a_forwarded_sigterm";
    if skip_unless_root(test) {
        return;
    }
    let mut term = Terminal::open(24, 80);
    term.start_reading();
    let modes = term.modes();
    let mut child = term.spawn(
        Session::ControllingTerminal,
        &hatchery(),
        &["run", "--timeout", "1s", "--", "sleep", "30"],
        None,
        None,
    );
    let status = wait_child(&mut child, LIMIT, "hatchery run --timeout 1s");
    assert_eq!(status.code(), Some(124), "{:?}", term.screen_text());
    assert_eq!(term.modes(), modes, "not restored after the timeout");

    let mut child = term.spawn(
        Session::ControllingTerminal,
        &hatchery(),
        &[
            "run",
            "--timeout",
            "30s",
            "--",
            "sh",
            "-c",
            "echo ready; sleep 30",
        ],
        None,
        None,
    );
    assert!(term.wait_for("ready", Duration::from_secs(30)));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    if let Err(e) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM) {
        panic!("kill: {e}");
    }
    let status = wait_child(&mut child, LIMIT, "hatchery run after SIGTERM");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    assert_eq!(term.modes(), modes, "not restored after SIGTERM");
}

#[test]
fn the_sandbox_terminal_has_the_callers_window_size_and_follows_it() {
    if skip_unless_root("the_sandbox_terminal_has_the_callers_window_size_and_follows_it") {
        return;
    }
    let mut term = Terminal::open(37, 101);
    term.start_reading();
    let mut child = term.spawn(
        Session::ControllingTerminal,
        &hatchery(),
        &[
            "run",
            "--timeout",
            "30s",
            "--",
            "sh",
            "-c",
            "trap 'echo size $(stty size); exit 0' WINCH; echo start $(stty size); while :; do sleep 0.1; done",
        ],
        None,
        None,
    );
    assert!(
        term.wait_for("start 37 101", Duration::from_secs(30)),
        "{:?}",
        term.screen_text()
    );
    // The person resizes the window: `stty` on the caller's terminal sets the size, and
    // the kernel signals the terminal's foreground process group (hatchery) with SIGWINCH.
    let out = run_with_timeout_stdin(
        Command::new("stty").args(["rows", "50", "cols", "120"]),
        term.stdio(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let status = wait_child(&mut child, LIMIT, "hatchery run");
    assert_eq!(status.code(), Some(0), "{:?}", term.screen_text());
    assert!(
        term.wait_for("size 50 120", Duration::from_secs(5)),
        "{:?}",
        term.screen_text()
    );
}

#[test]
fn a_caller_that_stops_reading_its_terminal_cannot_keep_the_timeout_from_ending_the_run() {
    let test =
        "a_caller_that_stops_reading_its_terminal_cannot_keep_the_timeout_from_ending_the_run";
    if skip_unless_root(test) {
        return;
    }
    // Nobody reads the screen: once the terminal's buffer is full, hatchery must go on
    // waiting for the timeout instead of blocking in write(2). (hatchery's own closing
    // line goes to a file: it is an ordinary write, like any program's.)
    let term = Terminal::open(24, 80);
    let modes = term.modes();
    let dir = shared_tempdir();
    let stderr_file = dir.path().join("stderr");
    let mut child = term.spawn(
        Session::ControllingTerminal,
        &hatchery(),
        &["run", "--timeout", "2s", "--", "yes"],
        None,
        Some(Stdio::from(must_create(&stderr_file))),
    );
    let status = wait_child(
        &mut child,
        LIMIT,
        "hatchery blocked on a terminal nobody reads",
    );
    assert_eq!(status.code(), Some(124));
    assert_eq!(term.modes(), modes, "the terminal's modes changed");

    // The same with stdout a pipe nobody reads, the output cap pumping into it, and the
    // terminal on stdin relayed at the same time.
    let (read_end, write_end) = pipe_pair();
    let mut child = term.spawn(
        Session::ControllingTerminal,
        &hatchery(),
        &[
            "run",
            "--max-output",
            "100M",
            "--timeout",
            "2s",
            "--",
            "yes",
        ],
        Some(Stdio::from(write_end)),
        Some(Stdio::from(must_create(&stderr_file))),
    );
    let status = wait_child(&mut child, LIMIT, "hatchery blocked on a pipe nobody reads");
    drop(read_end);
    assert_eq!(status.code(), Some(124));
    assert_eq!(term.modes(), modes, "the terminal's modes changed");
}

#[test]
fn a_terminal_on_stdout_alone_is_relayed_through_a_pipe() {
    if skip_unless_root("a_terminal_on_stdout_alone_is_relayed_through_a_pipe") {
        return;
    }
    let mut term = Terminal::open(24, 80);
    term.start_reading();
    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    let args = probe_run_args(
        &report,
        &["--timeout", "30s"],
        &["fds", "+", "tiocsti", "1", "id\n"],
    );
    let mut child = match Command::new(hatchery())
        .args(&args)
        .stdin(Stdio::null())
        .stdout(term.stdio())
        .stderr(term.stdio())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("spawn: {e}"),
    };
    let status = wait_child(&mut child, LIMIT, "hatchery run");
    assert_eq!(status.code(), Some(0), "{:?}", term.screen_text());
    assert!(term.wait_for("err ", Duration::from_secs(5)));
    let screen = term.screen_text();
    let fds = probe_fds(&screen);
    assert!(fds.iter().any(|(fd, k)| *fd == 1 && k == "fifo"), "{fds:?}");
    assert_eq!(term.pending_input(), 0, "{screen:?}");
    let r = read_report(&report);
    assert_eq!(
        r["enforcement"]["stdio"],
        serde_json::json!({
            "stdin": "passed (/dev/null)",
            "stdout": "pipe relay (terminal)",
            "stderr": "pipe relay (terminal)"
        }),
        "{r}"
    );
}

#[test]
fn without_a_terminal_or_a_cap_the_callers_descriptors_are_passed() {
    if skip_unless_root("without_a_terminal_or_a_cap_the_callers_descriptors_are_passed") {
        return;
    }
    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    let out = run_with_stdin(
        &[
            "run".into(),
            "--report".into(),
            s(&report),
            "--".into(),
            "true".into(),
        ],
        Stdio::null(),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = read_report(&report);
    assert_eq!(
        r["enforcement"]["stdio"],
        serde_json::json!({
            "stdin": "passed (/dev/null)",
            "stdout": "passed (pipe)",
            "stderr": "passed (pipe)"
        }),
        "{r}"
    );
}

#[test]
fn a_background_job_neither_changes_the_terminal_nor_reads_it() {
    if skip_unless_root("a_background_job_neither_changes_the_terminal_nor_reads_it") {
        return;
    }
    // An interactive shell's `hatchery run ... &`: in a process group of its own that is
    // not the terminal's foreground. Changing the modes or reading would get it stopped
    // (SIGTTOU, SIGTTIN), and a stopped supervisor ends no timeout.
    let mut term = Terminal::open(24, 80);
    term.start_reading();
    let modes = term.modes();
    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    let script = format!(
        "set -m; {} run --report {} --timeout 30s -- sh -c 'echo in-background; test -t 0 && echo has-a-terminal' & wait $!",
        s(&hatchery()),
        s(&report)
    );
    let mut child = term.spawn(
        Session::ControllingTerminal,
        Path::new("sh"),
        &["-c", &script],
        None,
        None,
    );
    let status = wait_child(&mut child, LIMIT, "hatchery run in the background");
    assert_eq!(status.code(), Some(0), "{:?}", term.screen_text());
    assert!(
        term.wait_for("has-a-terminal", Duration::from_secs(5)),
        "{:?}",
        term.screen_text()
    );
    assert_eq!(term.modes(), modes, "the terminal's modes changed");
    let r = read_report(&report);
    assert_eq!(
        r["enforcement"]["stdio"]["stdin"], "pty relay (background job: output only)",
        "{r}"
    );
}

#[test]
fn on_a_terminal_a_payload_holds_only_its_own_pty_whatever_its_caller_left_open() {
    let test = "on_a_terminal_a_payload_holds_only_its_own_pty_whatever_its_caller_left_open";
    if skip_unless_root(test) {
        return;
    }
    assert_extra_fds_reach_a_plain_command();
    let mut term = Terminal::open(24, 80);
    term.start_reading();
    let (hatchery, dir, probe) = (s(&hatchery()), s(&probe_dir()), s(&probe()));
    let args = [
        "-c",
        HOLD_EXTRA_FDS,
        &hatchery,
        "run",
        "--timeout",
        "30s",
        "--ro",
        &dir,
        "--",
        &probe,
        "fds",
    ];
    let mut child = term.spawn(
        Session::ControllingTerminal,
        Path::new("sh"),
        &args,
        None,
        None,
    );
    let status = wait_child(&mut child, LIMIT, "hatchery run");
    assert!(
        term.wait_for("ok 0=", Duration::from_secs(5)),
        "{:?}",
        term.screen_text()
    );
    let screen = term.screen_text();
    assert_eq!(status.code(), Some(0), "{screen:?}");
    let fds = probe_fds(&screen);
    let nums: Vec<i32> = fds.iter().map(|(fd, _)| *fd).collect();
    assert_eq!(
        nums,
        [0, 1, 2],
        "the caller's descriptors reached the payload: {fds:?}"
    );
    // All three are the sandbox's own terminal, not the caller's.
    let caller = format!("chr:{}", term.rdev());
    assert!(
        fds.iter()
            .all(|(_, k)| k.starts_with("chr:") && *k != caller),
        "{fds:?}"
    );
}

/// A terminal on stdout and stderr, stdin elsewhere (`hatchery run ... < input`): both
/// are relayed through one pipe, so the command's lines reach the screen in the order it
/// wrote them. Two pipes, read in turn, showed every stdout line before every stderr one.
#[test]
fn a_terminal_on_stdout_and_stderr_shows_their_lines_in_the_order_written() {
    if skip_unless_root("a_terminal_on_stdout_and_stderr_shows_their_lines_in_the_order_written") {
        return;
    }
    let mut term = Terminal::open(24, 80);
    term.start_reading();
    let mut child = Command::new(hatchery())
        .args(["run", "--timeout", "30s", "--", "sh", "-c"])
        .arg("i=0; while [ $i -lt 30 ]; do i=$((i+1)); echo o$i; echo e$i >&2; done; echo end")
        .stdin(Stdio::null())
        .stdout(term.stdio())
        .stderr(term.stdio())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    let status = wait_child(&mut child, LIMIT, "hatchery run");
    assert_eq!(status.code(), Some(0), "{:?}", term.screen_text());
    assert!(term.wait_for("end", Duration::from_secs(5)));
    let want: String = (1..=30).map(|i| format!("o{i}\ne{i}\n")).collect();
    let shown: String = term
        .screen_text()
        .replace('\r', "")
        .lines()
        .filter(|l| !l.starts_with("hatchery: "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(shown, format!("{want}end\n"));
}

/// stdout a pty's master whose replica nobody reads yet (a terminal program that reads
/// once the command has ended): the master cannot be opened again, and a write to it of
/// more than it had room for blocked the supervisor, and with it `--timeout`, for as long
/// as nobody read. Twice, since the room the pty has left when the write comes varies.
#[test]
fn a_pty_master_nobody_reads_cannot_hold_the_timeout() {
    if skip_unless_root("a_pty_master_nobody_reads_cannot_hold_the_timeout") {
        return;
    }
    for _ in 0..2 {
        let pty = nix::pty::openpty(None, None).unwrap_or_else(|e| panic!("openpty: {e}"));
        let mut raw = nix::sys::termios::tcgetattr(&pty.slave).unwrap_or_else(|e| panic!("{e}"));
        nix::sys::termios::cfmakeraw(&mut raw);
        nix::sys::termios::tcsetattr(&pty.slave, nix::sys::termios::SetArg::TCSANOW, &raw)
            .unwrap_or_else(|e| panic!("{e}"));
        let master = pty.master.try_clone().unwrap_or_else(|e| panic!("{e}"));
        let mut child = Command::new(hatchery())
            .args([
                "run",
                "--memory",
                "128M",
                "--pids",
                "32",
                "--timeout",
                "3s",
                "--",
            ])
            .args([
                "sh",
                "-c",
                "head -c 200000 /dev/zero & while :; do sleep 1; done",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::from(master))
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn: {e}"));
        // A 3 s timeout, given ten times over: a run held until someone reads is killed.
        let status = wait_child(&mut child, Duration::from_secs(30), "a 3 s --timeout");
        // Read only now, as the caller does.
        drop(pty);
        assert_eq!(status.code(), Some(124));
    }
}

/// A pty's master side as stdin (a terminal emulator's or `script`'s end, handed on): it is
/// no one's controlling terminal, so reading it stops no job, and its modes belong to the
/// program on the replica's side. Its foreground group is the replica's, 0 here, which
/// made it look like a background job's terminal: what was written at the replica never
/// reached the command, which waited until the timeout.
#[test]
fn a_pty_master_on_stdin_is_read_and_its_modes_left_as_found() {
    if skip_unless_root("a_pty_master_on_stdin_is_read_and_its_modes_left_as_found") {
        return;
    }
    let pty = nix::pty::openpty(None, None).unwrap_or_else(|e| panic!("openpty: {e}"));
    let mut raw = nix::sys::termios::tcgetattr(&pty.slave).unwrap_or_else(|e| panic!("{e}"));
    nix::sys::termios::cfmakeraw(&mut raw);
    nix::sys::termios::tcsetattr(&pty.slave, nix::sys::termios::SetArg::TCSANOW, &raw)
        .unwrap_or_else(|e| panic!("{e}"));
    let modes = nix::sys::termios::tcgetattr(&pty.slave).unwrap_or_else(|e| panic!("{e}"));
    let master = pty.master.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let dir = shared_tempdir();
    let report = dir.path().join("report.json");
    let mut child = Command::new(hatchery())
        .args(["run", "--timeout", "20s", "--report"])
        .arg(&report)
        .args(["--", "head", "-c", "6"])
        .stdin(Stdio::from(master))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    // What the program on the replica's side writes is what the master reads.
    let mut replica = std::fs::File::from(pty.slave);
    std::io::Write::write_all(&mut replica, b"hello\n").unwrap_or_else(|e| panic!("{e}"));
    let status = wait_child(&mut child, LIMIT, "run with a pty master on stdin");
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert_eq!(status.code(), Some(0), "stdout {out:?}, stderr {err}");
    assert_eq!(out, "hello\n", "{err}");
    let now = nix::sys::termios::tcgetattr(&replica).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(now, modes, "the replica's modes changed");
    let r = read_report(&report);
    assert_eq!(
        r["enforcement"]["stdio"]["stdin"], "pipe relay (pty master)",
        "{r}"
    );
    drop(pty.master);
}

/// The same master as stdin and stdout, its replica in the modes a pty starts with (echo
/// on): what the command writes reaches the replica once. Given a pty of the sandbox's
/// own, that pty's echo went out into the replica, whose echo came back in as input, and
/// round again: the replica received the lines over and over, and the supervisor relayed
/// them until the timeout.
#[test]
fn a_pty_master_on_stdin_and_stdout_echoes_nothing_back_into_itself() {
    if skip_unless_root("a_pty_master_on_stdin_and_stdout_echoes_nothing_back_into_itself") {
        return;
    }
    let pty = nix::pty::openpty(None, None).unwrap_or_else(|e| panic!("openpty: {e}"));
    let input = pty.master.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let output = pty.master.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(hatchery())
        .args(["run", "--timeout", "10s", "--max-output", "1M", "--"])
        .args(["sh", "-c", "printf 'a\\nb\\n'; sleep 1"])
        .stdin(Stdio::from(input))
        .stdout(Stdio::from(output))
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    // The replica's side, read without waiting until the run has ended and a moment more.
    let replica = pty.slave;
    nix::fcntl::fcntl(
        &replica,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut got = Vec::new();
    let mut ended = None;
    let start = std::time::Instant::now();
    loop {
        let mut buf = [0u8; 4096];
        match nix::unistd::read(&replica, &mut buf) {
            Ok(n) if n > 0 => got.extend_from_slice(buf.get(..n).unwrap_or_default()),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
        if ended.is_none() {
            if let Ok(Some(status)) = child.try_wait() {
                ended = Some((status, std::time::Instant::now()));
            }
        }
        match ended {
            Some((_, at)) if at.elapsed() > Duration::from_millis(300) => break,
            _ if start.elapsed() > LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the run did not end");
            }
            _ => {}
        }
    }
    let status = ended.map(|(s, _)| s.code());
    assert_eq!(
        String::from_utf8_lossy(&got),
        "a\nb\n",
        "what reached the replica (exit {status:?})"
    );
    assert_eq!(status, Some(Some(0)));
    drop(pty.master);
}
