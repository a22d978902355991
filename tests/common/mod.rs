//! Helpers shared by the integration tests: paths of the binary and the attack probe, and
//! a runner that puts a hard timeout around every command so that a broken limit fails a
//! test instead of hanging the suite.
#![allow(dead_code)]

pub mod agents;
pub mod controller;
pub mod egress_bed;
pub mod etcd;
pub mod fds;
pub mod files;
pub mod terminal;
pub mod user_db;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A pipe (read end, write end), close-on-exec (a child given an end as its stdio gets
/// its own copy).
pub fn pipe_pair() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => panic!("pipe: {e}"),
    }
}

/// The hatchery binary under test.
pub fn hatchery() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hatchery"))
}

/// The directory holding the probe (exposed read-only into sandboxes that run it).
pub fn probe_dir() -> PathBuf {
    let exe = hatchery();
    exe.parent().map(|d| d.join("examples")).unwrap_or_default()
}

/// The attack probe (built by `cargo test` as an example).
pub fn probe() -> PathBuf {
    probe_dir().join("probe")
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Runs a command with a hard wall-clock limit; the child is killed (and the test fails
/// loudly) if it exceeds it. Output is drained while the child runs, so a command that
/// prints more than a pipe holds cannot block on it.
pub fn run_with_timeout(cmd: &mut Command, limit: Duration) -> Output {
    use std::io::Read;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => panic!("cannot start {cmd:?}: {e}"),
    };
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                let (o, e) = (
                    out.join().unwrap_or_default(),
                    err.join().unwrap_or_default(),
                );
                panic!(
                    "{cmd:?} did not finish within {limit:?}: stdout {} stderr {}",
                    String::from_utf8_lossy(&o),
                    String::from_utf8_lossy(&e)
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("wait: {e}"),
        }
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// `hatchery ARGS...` with a 60 s limit.
pub fn hatchery_cmd(args: &[&str]) -> Output {
    run_with_timeout(
        Command::new(hatchery()).args(args).env_remove("COLUMNS"),
        Duration::from_secs(60),
    )
}

/// `hatchery run [FLAGS] --ro PROBE_DIR -- probe ARGS...` with a 60 s limit.
pub fn run_probe(flags: &[&str], probe_args: &[&str]) -> Output {
    let dir = probe_dir();
    let probe = probe();
    let mut cmd = Command::new(hatchery());
    cmd.arg("run")
        .args(flags)
        .arg("--ro")
        .arg(&dir)
        .arg("--")
        .arg(&probe)
        .args(probe_args);
    run_with_timeout(&mut cmd, Duration::from_secs(60))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

pub fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// Skips (returns true with a printed reason) unless running as root.
pub fn skip_unless_root(test: &str) -> bool {
    if !is_root() {
        eprintln!("SKIP {test}: needs root (run scripts/test.sh as root)");
        return true;
    }
    false
}

/// Whether a run's `not_enforced` note is the one an exposure on a filesystem without
/// idmapped mounts rightly carries: 9p, as the VM suite shares the host's files.
pub fn is_expected_idmap_note(note: &str) -> bool {
    note.contains("no idmapped mount here") && fs_type_of(&probe_dir()).as_deref() == Some("9p")
}

/// The filesystem type of the mount holding `path` (from /proc/self/mountinfo).
pub fn fs_type_of(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mount_point = pre.split_whitespace().nth(4)?;
            let fs = post.split_whitespace().next()?;
            path.starts_with(mount_point)
                .then(|| (mount_point.len(), fs.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, fs)| fs)
}

/// Whether `id` is one hatchery leases to sandboxes started by root (the default range,
/// or the `hatchery` entry of /etc/subuid).
pub fn in_sandbox_id_range(id: u32) -> bool {
    let configured = std::fs::read_to_string("/etc/subuid")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let mut f = l.split(':');
                (f.next()? == "hatchery").then_some(())?;
                let start: u32 = f.next()?.parse().ok()?;
                let count: u32 = f.next()?.parse().ok()?;
                Some((start, count))
            })
        })
        .unwrap_or((0x7000_0000, 65536));
    id >= configured.0 && id - configured.0 < configured.1
}

/// A temporary directory that sandboxes running as the default host uid (65534) may write.
/// Mounts a tmpfs of `size` (and its options, such as `nr_inodes=40`), mode 0700, at
/// `at`: `mount`'s output.
pub fn mount_tmpfs(at: &Path, size: &str) -> Output {
    run_with_timeout(
        Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at),
        Duration::from_secs(10),
    )
}

pub fn shared_tempdir() -> tempfile::TempDir {
    let dir = match tempfile::Builder::new().prefix("hatchery-test-").tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    let _ = std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    );
    dir
}

pub fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Whether a process whose command line matches `pattern` (pgrep -f) exists.
pub fn process_exists(pattern: &str) -> bool {
    code(&run_with_timeout(
        Command::new("pgrep").args(["-f", pattern]),
        Duration::from_secs(10),
    )) == 0
}

/// Waits until `process_exists(pattern) == present`, or panics with `what` after `limit`.
pub fn wait_process(pattern: &str, present: bool, limit: Duration, what: &str) {
    let start = Instant::now();
    while process_exists(pattern) != present {
        if start.elapsed() > limit {
            let ps = run_with_timeout(
                Command::new("pgrep").args(["-a", "-f", pattern]),
                Duration::from_secs(10),
            );
            panic!("{what} (after {limit:?}): {}", stdout(&ps));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A payload's look at pid 1 and at a process of its own (same uid, started by it): one
/// line for each thing it can read.
pub const PID1_PROBE: &str = "sleep 30 & s=$!; \
     cat /proc/$s/environ >/dev/null && echo own-environ; \
     ls /proc/$s/fd >/dev/null && echo own-fd; \
     head -c1 /proc/$s/maps >/dev/null && echo own-maps; \
     cat /proc/1/environ >/dev/null 2>&1 && echo pid1-environ; \
     ls /proc/1/fd >/dev/null 2>&1 && echo pid1-fd; \
     head -c1 /proc/1/maps >/dev/null 2>&1 && echo pid1-maps; \
     kill $s";
/// A payload that sends its pid 1 every fault signal (the ones that, ending pid 1, make
/// `run` report hatchery's own crash) and then exits 7: it must get its own status.
pub const FAULTS_TO_PID1: &str = "for s in SEGV ABRT BUS ILL FPE SYS TRAP; do \
     kill -s $s 1 2>/dev/null; done; sleep 0.2; exit 7";

/// What [`PID1_PROBE`] prints where pid 1 is closed to the payload.
pub const PID1_CLOSED: [&str; 3] = ["own-environ", "own-fd", "own-maps"];

/// The direct children of `pid`, from `/proc/*/stat` (the parent pid is the second field
/// after the last `)`: the command name before it may hold spaces and parentheses).
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|stat| {
                    let after = stat.get(stat.rfind(')')?.checked_add(1)?..)?.to_string();
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// The value of `key` (`VmRSS`, `SigCgt`, ...) in `/proc/PID/status`, trimmed.
pub fn proc_status(pid: u32, key: &str) -> Option<String> {
    status_field(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        key,
    )
}

/// The value of `key` in the text of a `/proc/PID/status` (one a sandbox printed, say),
/// trimmed.
pub fn status_field(status: &str, key: &str) -> Option<String> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.trim().to_string())
    })
}

/// Resident memory of a process, in KiB (0 when it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    proc_status(pid, "VmRSS")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
