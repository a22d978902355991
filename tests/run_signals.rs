//! How `run` passes on signals that come while the command starts. Most tests hold `run`
//! (SIGSTOP) at a chosen moment of the start, as a loaded machine or a shell's `^Z` then
//! `kill %1` would, and let the sandbox go on meanwhile; the sandbox runs under
//! `--cpus 0.01` so that its start is slow enough for the moment to be chosen reliably.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The signals `pid` catches (SigCgt of /proc/PID/status).
fn caught(pid: u32) -> u64 {
    proc_status(pid, "SigCgt")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(0)
}

/// The sandbox's payload (a child of pid 1, itself a child of `run`) once it catches `sig`.
fn payload_catching(run: u32, sig: Signal, limit: Duration) -> Option<u32> {
    let start = Instant::now();
    while start.elapsed() < limit {
        for pid1 in children_of(run) {
            for p in children_of(pid1) {
                if caught(p) & (1u64 << (sig as i32 - 1)) != 0 {
                    return Some(p);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// `run --cpus 0.01 --timeout 60s [FLAGS] -- sh -c SCRIPT`, stdin empty.
fn quota_run(flags: &[&str], script: &str) -> Command {
    let mut cmd = Command::new(hatchery());
    cmd.args(["run", "--cpus", "0.01", "--timeout", "60s"])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null());
    cmd
}

/// Starts `run -vv --cpus 0.01 -- sh -c SCRIPT` and stops it (SIGSTOP) as soon as it says
/// it waits for the sandbox: the filters are handed over, nothing pid 1 sends is read yet.
fn start_and_hold(script: &str) -> Child {
    let mut child = quota_run(&["-vv"], script)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn run: {e}"));
    let pid = Pid::from_raw(child.id() as i32);
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take();
    std::thread::spawn(move || {
        let Some(err) = err else { return };
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("waiting for it to end") {
                let _ = kill(pid, Signal::SIGSTOP);
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("run never started its sandbox");
    }
    child
}

/// Sends `sig` to a held-up `run`, lets it go on, and waits for it to end.
fn signal_and_release(run: &mut Child, sig: Signal) -> std::process::ExitStatus {
    let pid = Pid::from_raw(run.id() as i32);
    let _ = kill(pid, sig);
    let _ = kill(pid, Signal::SIGCONT);
    common::terminal::wait_child(run, Duration::from_secs(60), "run")
}

#[test]
fn a_term_to_a_held_up_run_whose_command_started_and_traps_it_reaches_the_command() {
    if skip_unless_root("cpu quota") {
        return;
    }
    // The command has started and catches TERM before `run` gets to read pid 1's messages:
    // the TERM is the command's to handle, exit 7.
    let mut run = start_and_hold("trap 'exit 7' TERM; while :; do sleep 0.1; done");
    let trapped = payload_catching(run.id(), Signal::SIGTERM, Duration::from_secs(30));
    let status = signal_and_release(&mut run, Signal::SIGTERM);
    assert!(trapped.is_some(), "the command never trapped TERM");
    assert_eq!(
        status.code(),
        Some(7),
        "the command had started and trapped TERM, yet the TERM did not reach it"
    );
}

#[test]
fn a_usr1_to_run_before_its_command_starts_is_passed_on_not_lost() {
    if skip_unless_root("cpu quota") {
        return;
    }
    // SIGUSR1 comes before the command starts: passed on once it has, it ends the command
    // (138, the default action) like a USR1 sent a moment later. pid 1 gets it while it
    // still has the supervisor's mask; were it unblocked with its default action, the
    // kernel would discard it (this is a pid namespace's init).
    let mut run = start_and_hold("sleep 3");
    let status = signal_and_release(&mut run, Signal::SIGUSR1);
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGUSR1),
        "the SIGUSR1 sent to run before its command started was lost"
    );
}

#[test]
fn a_term_sent_once_the_command_traps_it_reaches_the_command_under_a_cpu_quota() {
    if skip_unless_root("cpu quota") {
        return;
    }
    // No hold-up of run this time: the command has started and catches TERM, then run gets
    // a TERM. Under a CPU quota (or a loaded host) the payload may run well before pid 1
    // runs again after starting it: nothing may depend on pid 1 having run since.
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        let mut run = quota_run(&[], "trap 'exit 7' TERM; while :; do sleep 0.1; done")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn run: {e}"));
        let trapped = payload_catching(run.id(), Signal::SIGTERM, Duration::from_secs(30));
        let _ = kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM);
        let status = common::terminal::wait_child(&mut run, Duration::from_secs(60), "run");
        assert!(trapped.is_some(), "the command never trapped TERM");
        outcomes.push(status.code());
    }
    assert!(
        outcomes.iter().all(|c| *c == Some(7)),
        "a command that had started and trapped TERM was killed instead (128+15): {outcomes:?}"
    );
}

#[test]
fn a_signal_while_the_user_database_is_silent_ends_the_run_at_once() {
    if skip_unless_root("signal during a hung user database") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let fifo = common::user_db::silent_group_file(&d);
    let exposed = common::user_db::foreign_group_dir(&d);
    // `unshare` and its shell exec each other and then hatchery: one process throughout.
    let unshare = common::user_db::with_binds(&[(&fifo, "/etc/group")]);
    let report = d.join("report.json");
    let mut run = Command::new(&unshare[0])
        .args(&unshare[1..])
        .arg(hatchery())
        .args(["run", "--report", &report.to_string_lossy()])
        .args(["--rw", &exposed.to_string_lossy(), "--", "true"])
        .env_remove("COLUMNS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    // The run is asking the user database once its helper exists (the shell before it
    // has a child too: `mount`).
    let helper = || {
        children_of(run.id())
            .into_iter()
            .any(|c| proc_status(c, "Name").as_deref() == Some("hatchery-lookup"))
    };
    let asking = Instant::now();
    while !helper() && asking.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(helper(), "the run never asked the user database");
    // ^C: the caller wants out now, not when the database's deadline is up.
    let _ = kill(Pid::from_raw(run.id() as i32), Signal::SIGINT);
    let signalled = Instant::now();
    let status = common::terminal::wait_child(&mut run, Duration::from_secs(30), "run");
    let took = signalled.elapsed();
    let mut err = String::new();
    if let Some(mut e) = run.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{err}");
    assert!(
        took < Duration::from_secs(2),
        "SIGINT ended the run only after {took:?}: {err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("SIGINT"), "{err}");
    // The report says so too, as for a start the signal stopped later.
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_default())
            .unwrap_or(serde_json::Value::Null);
    assert_eq!(r["exit_code"], 128 + libc::SIGINT, "{r}");
    assert_eq!(r["signal"], libc::SIGINT, "{r}");
    wait_process(
        &format!("run --rw {}", exposed.display()),
        false,
        Duration::from_secs(5),
        "the lookup's helper was left behind",
    );
}

/// The state letter of `pid` (field 3 of /proc/PID/stat).
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.get(stat.rfind(')')?.checked_add(2)?..)?.chars().next()
}

#[test]
fn a_term_or_an_int_to_run_ends_a_command_that_stopped_itself() {
    // A stopped command takes a TERM only once it is continued: passed on alone, it stayed
    // pending, and `run` (and `timeout`, `systemctl stop`) waited forever.
    for (sig, script, want) in [
        (
            Signal::SIGTERM,
            "trap 'exit 7' TERM; kill -STOP $$; sleep 60",
            7,
        ),
        (
            Signal::SIGINT,
            "kill -STOP $$; sleep 60",
            128 + libc::SIGINT,
        ),
    ] {
        let mut run = Command::new(hatchery())
            .args(["run", "--timeout", "60s", "--", "sh", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn run: {e}"));
        let start = Instant::now();
        let stopped = loop {
            let payload = children_of(run.id())
                .into_iter()
                .flat_map(children_of)
                .find(|p| state_of(*p) == Some('T'));
            if payload.is_some() || start.elapsed() > Duration::from_secs(30) {
                break payload;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let _ = kill(Pid::from_raw(run.id() as i32), sig);
        let status = common::terminal::wait_child(&mut run, Duration::from_secs(20), "run");
        assert!(stopped.is_some(), "the command never stopped itself");
        assert_eq!(status.code(), Some(want), "{sig}");
    }
}

/// The field after the command name in `/proc/PID/stat`, counted from 0 (state, ppid,
/// pgrp, ...).
fn stat_field(pid: u32, n: usize) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.get(stat.rfind(')')?.checked_add(1)?..)?.to_string();
    after.split_whitespace().nth(n)?.parse().ok()
}

/// What a terminal sends its foreground process group (^C) reaches the sandbox through
/// `run` alone: pid 1 is in a process group of its own, so it neither gets the signal
/// from the kernel a second time nor forwards it twice.
#[test]
fn a_signal_to_runs_process_group_reaches_the_sandbox_through_run_alone() {
    if skip_unless_root("process groups") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let mut run = Command::new(hatchery())
        .args(["run", "--timeout", "30s", "--", "sleep", "20"])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn run: {e}"));
    let start = Instant::now();
    let pid1 = loop {
        let found = children_of(run.id())
            .into_iter()
            .find(|p| !children_of(*p).is_empty());
        if let Some(p) = found {
            break p;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = run.kill();
            let _ = run.wait();
            panic!("the sandbox never started");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let group = stat_field(pid1, 2);
    // ^C, as the terminal sends it: to the whole foreground group.
    let _ = nix::sys::signal::killpg(Pid::from_raw(run.id() as i32), Signal::SIGINT);
    let status = common::terminal::wait_child(&mut run, Duration::from_secs(30), "run");
    assert_ne!(
        group,
        Some(run.id() as i32),
        "pid 1 is in run's process group"
    );
    assert!(group.is_some(), "pid 1's process group could not be read");
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGINT),
        "the ^C never reached the command"
    );
}
