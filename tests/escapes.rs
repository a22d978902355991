//! Escapes and weaknesses found by attacking `hatchery run` from inside, each as an attack
//! that fails the test if it works. Every test first shows that its attack is real: that
//! it succeeds where hatchery's defence is absent (a writer that follows names, a resolver
//! that checks then uses, a plain user namespace, a shared host id), so that none can pass
//! because the attack itself was broken.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A directory only root can enter, holding `name` (mode 0600, root's) with `content`.
fn vault(name: &str, content: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("hatchery-vault-")
        .tempdir()
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    let file = canonical(dir.path()).join(name);
    std::fs::write(&file, content).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&file, PermissionsExt::from_mode(0o600)).ok();
    (dir, file)
}

/// A `hatchery run` in the background, killed (and reaped) when dropped.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// On drop, waits (up to 10 s, without panicking) until no process matches the pattern:
/// a sandbox whose supervisor was killed dies a moment later.
struct Gone<'a>(&'a str);

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        let start = Instant::now();
        while process_exists(self.0) && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn background(args: &[String]) -> Background {
    let child = Command::new(hatchery())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    Background(child)
}

/// Waits until `path` exists (a holder in a sandbox said it is ready).
fn wait_for(path: &Path, what: &str) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: never ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn probe_args(flags: &[String], args: &[&str]) -> Vec<String> {
    let mut all = vec!["run".to_string()];
    all.extend(flags.iter().cloned());
    all.extend(["--ro".into(), s(&probe_dir()), "--".into(), s(&probe())]);
    all.extend(args.iter().map(|a| a.to_string()));
    all
}

fn hatchery_owned(args: &[String]) -> Output {
    run_with_timeout(Command::new(hatchery()).args(args), Duration::from_secs(60))
}

fn last_pid() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1)
}

// --------------------------------------------------------------------------- 1. reports

#[test]
fn a_report_is_never_written_through_a_symlink_the_sandbox_planted() {
    if skip_unless_root("report symlinks") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let (_vault, target) = vault("shadow", "root only\n");
    // The attack is real: a writer that opens the planted name writes into the target.
    let planted = d.join(".r.json.tmp-1");
    std::os::unix::fs::symlink(&target, &planted).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&planted, "overwritten").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        std::fs::read_to_string(&target).unwrap_or_default(),
        "overwritten"
    );
    std::fs::write(&target, "root only\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_file(&planted).ok();

    // The payload plants the report's name and a temporary name for every pid the
    // supervisor could have, all leading to the root-only file.
    let lo = last_pid();
    let script = format!(
        "ln -s {t} {d}/r.json; i={lo}; while [ $i -le {hi} ]; do ln -s {t} {d}/.r.json.tmp-$i; i=$((i+1)); done",
        t = s(&target),
        d = s(&d),
        hi = lo + 300
    );
    let out = hatchery_cmd(&[
        "run",
        "--rw",
        &s(&d),
        "--report",
        &s(&d.join("r.json")),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&target).unwrap_or_default(),
        "root only\n",
        "root wrote into a host file through a planted symlink"
    );
    let meta = std::fs::symlink_metadata(d.join("r.json")).unwrap_or_else(|e| panic!("{e}"));
    assert!(meta.is_file(), "the report's name is not a plain file");
    let report: Value =
        serde_json::from_slice(&std::fs::read(d.join("r.json")).unwrap_or_default())
            .unwrap_or_else(|e| panic!("not a report: {e}"));
    assert_eq!(report["exit_code"], 0);
}

#[test]
fn a_report_the_sandbox_forged_never_stands_in_for_hatcherys() {
    if skip_unless_root("forged report") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    // Every temporary name the supervisor could pick is a directory, and a forged report
    // waits at the name.
    let lo = last_pid();
    let script = format!(
        "i={lo}; while [ $i -le {hi} ]; do mkdir {d}/.r.json.tmp-$i; i=$((i+1)); done; echo '{{\"exit_code\":0,\"forged\":true}}' > {d}/r.json",
        d = s(&d),
        hi = lo + 300
    );
    let out = hatchery_cmd(&[
        "run",
        "--rw",
        &s(&d),
        "--report",
        &s(&d.join("r.json")),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report: Value =
        serde_json::from_slice(&std::fs::read(d.join("r.json")).unwrap_or_default())
            .unwrap_or_else(|e| panic!("not JSON: {e}"));
    assert!(report.get("forged").is_none(), "the forged report stayed");
    assert!(report.get("enforcement").is_some(), "{report}");

    // A directory at the report's name: the report cannot be written, and run says so
    // and fails instead of leaving the caller with nothing (or with someone else's file).
    let out = hatchery_cmd(&[
        "run",
        "--rw",
        &s(&d),
        "--report",
        &s(&d.join("r2.json")),
        "--",
        "mkdir",
        &s(&d.join("r2.json")),
    ]);
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot write the report"), "{err}");
}

#[test]
fn a_report_directory_moved_away_by_the_sandbox_is_an_error_not_a_forgery() {
    if skip_unless_root("moved report directory") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    std::fs::create_dir(d.join("out")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(d.join("out"), PermissionsExt::from_mode(0o777)).ok();
    // The payload renames the report's directory away and puts a forged report where the
    // caller will look.
    let script = format!(
        "mv {d}/out {d}/hidden && mkdir {d}/out && echo '{{\"exit_code\":0,\"forged\":true}}' > {d}/out/r.json; exit 3",
        d = s(&d)
    );
    let out = hatchery_cmd(&[
        "run",
        "--rw",
        &s(&d),
        "--report",
        &s(&d.join("out/r.json")),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    // The attack's setup worked: the forgery is where the caller looks.
    assert!(
        std::fs::read_to_string(d.join("out/r.json")).is_ok_and(|t| t.contains("forged")),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        code(&out),
        125,
        "a forged report stood unnoticed: {}",
        stderr(&out)
    );
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("was moved or replaced") && err.contains("not hatchery's"),
        "{err}"
    );
    assert!(
        std::fs::read_to_string(d.join("hidden/r.json")).is_ok_and(|t| t.contains("enforcement")),
        "the real report is where the directory went"
    );
}

// ------------------------------------------------------------------ 2. swapped paths

#[test]
fn a_path_swapped_between_check_and_mount_never_exposes_an_unexposed_directory() {
    if skip_unless_root("swapped path") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let secret_dir = tempfile::Builder::new()
        .prefix("hatchery-secret-")
        .tempdir()
        .unwrap_or_else(|e| panic!("{e}"));
    let sd = canonical(secret_dir.path());
    std::fs::create_dir(sd.join("x")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(sd.join("x/secret.txt"), "top secret\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(sd.join("x/secret.txt"), PermissionsExt::from_mode(0o644)).ok();
    std::fs::create_dir_all(d.join("a/x")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(d.join("a"), PermissionsExt::from_mode(0o777)).ok();
    std::os::unix::fs::symlink(&sd, d.join("s")).unwrap_or_else(|e| panic!("{e}"));
    let secret_ino = std::fs::metadata(sd.join("x"))
        .map(|m| m.ino())
        .unwrap_or(0);

    // The attacker: a sandbox that can write `d` keeps exchanging the directory `a` and
    // the symlink `s` (which leads to the secret's parent). Dropped first (then `gone`,
    // then the directories): its sandbox outlives its supervisor for a moment, and a swap
    // then would keep the directory from being removed.
    let swapping = format!("swap {}", s(&d.join("a")));
    let _gone = Gone(&swapping);
    let attacker = background(&probe_args(
        &["--rw".into(), s(&d), "--timeout".into(), "40s".into()],
        &["swap", &s(&d.join("a")), &s(&d.join("s")), "30000"],
    ));
    // The race is live: a lookup that follows symlinks lands on the secret now and then.
    let start = Instant::now();
    let mut seen = false;
    while !seen && start.elapsed() < Duration::from_secs(20) {
        seen = std::fs::metadata(d.join("a/x")).is_ok_and(|m| m.ino() == secret_ino);
    }
    assert!(seen, "the attacker never made a/x lead to the secret");

    // The victim: sandboxes asking for `d/a/x` read-only, over and over.
    let mut refused = 0;
    let mut mounted = 0;
    for _ in 0..40 {
        let out = hatchery_cmd(&[
            "run",
            "--ro",
            &s(&d.join("a/x")),
            "--",
            "sh",
            "-c",
            &format!("cat {}/secret.txt 2>/dev/null; true", s(&d.join("a/x"))),
        ]);
        assert!(
            !stdout(&out).contains("top secret"),
            "an unexposed host directory was mounted"
        );
        match code(&out) {
            0 => mounted += 1,
            _ => refused += 1,
        }
    }
    drop(attacker);
    eprintln!("swapped path: {mounted} runs got the real directory, {refused} were refused");
}

// ------------------------------------------------------------------------ 4. loopback

#[test]
fn the_sandboxs_own_loopback_carries_tcp_unless_the_profile_denies_it() {
    if skip_unless_root("loopback") {
        return;
    }
    let out = run_probe(&[], &["listen-loopback"]);
    assert_eq!(stdout(&out), "ok 0", "{}", stderr(&out));

    let dir = shared_tempdir();
    let profile = canonical(dir.path()).join("no-tcp.toml");
    std::fs::write(
        &profile,
        "name = \"no-tcp\"\n[seccomp]\ndefault_action = \"allow\"\n[landlock]\nread = [\"/usr\", \"/etc\", \"/proc\", \"/dev\"]\nwrite = [\"/tmp\", \"/dev\"]\nexecute = [\"/usr\", \"/tmp\"]\ndeny_tcp = true\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = run_probe(&["--profile", &s(&profile)], &["listen-loopback"]);
    assert_eq!(
        stdout(&out),
        format!("err {}", libc::EACCES),
        "{}",
        stderr(&out)
    );
}

// ----------------------------------------------------------------- 5. shared identity

fn pipe_size_while_another_holds_pipes(host_uid: Option<&str>) -> String {
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let soft: u64 = std::fs::read_to_string("/proc/sys/fs/pipe-user-pages-soft")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(16384);
    let n = (soft / 16 + 64).to_string();
    let mut flags = vec!["--rw".to_string(), s(&d), "--timeout".into(), "30s".into()];
    if let Some(id) = host_uid {
        flags.extend(["--host-uid".into(), id.into()]);
    }
    let ready = d.join("ready");
    let _holder = background(&probe_args(&flags, &["pipes", &n, "20", &s(&ready)]));
    wait_for(&ready, "pipe holder");
    let mut flags = Vec::new();
    if let Some(id) = host_uid {
        flags.extend(["--host-uid".to_string(), id.to_string()]);
    }
    stdout(&hatchery_owned(&probe_args(&flags, &["pipe-size"])))
}

#[test]
fn one_sandbox_holding_pipes_leaves_the_next_its_full_pipe_buffers() {
    if skip_unless_root("pipe quota") {
        return;
    }
    // The attack is real when two sandboxes share a host uid.
    let shared = pipe_size_while_another_holds_pipes(Some("65534"));
    assert_ne!(
        shared, "size 65536 grow ok",
        "the attack did not starve a sandbox of the same uid"
    );
    let own = pipe_size_while_another_holds_pipes(None);
    assert_eq!(
        own, "size 65536 grow ok",
        "a sandbox was starved by another"
    );
}

#[test]
fn concurrent_sandboxes_have_distinct_host_ids_and_files_belong_to_the_directorys_owner() {
    if skip_unless_root("identities") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    // A user the host knows, in its own group (`nobody`, `nogroup`).
    std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap_or_else(|e| panic!("{e}"));
    let ready = d.join("ready");
    let _holder = background(&probe_args(
        &["--rw".into(), s(&d), "--timeout".into(), "30s".into()],
        &["pipes", "0", "20", &s(&ready)],
    ));
    wait_for(&ready, "holder");
    let held = std::fs::metadata(&ready).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (held.uid(), held.gid()),
        (65534, 65534),
        "a file a sandbox created does not belong to the directory's owner"
    );
    let out = hatchery_cmd(&["run", "--", "cat", "/proc/self/uid_map"]);
    let other: u32 = stdout(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|u| u.parse().ok())
        .unwrap_or(0);
    let holder_uid = Command::new("pgrep")
        .args(["-f", "probe pipes 0 20"])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|pid| std::fs::metadata(format!("/proc/{}", pid.trim())).ok())
                .map(|m| m.uid())
                .find(|u| *u != 0)
        })
        .unwrap_or(0);
    assert!(in_sandbox_id_range(other) && in_sandbox_id_range(holder_uid));
    assert_ne!(other, holder_uid, "two running sandboxes share a host uid");
}

/// `hatchery run --rw DIR --report R -- sh -c SCRIPT`: its output and its report.
fn run_rw_reported(dir: &Path, script: &str) -> (Output, Value) {
    let reports = shared_tempdir();
    let report = canonical(reports.path()).join("r.json");
    let out = hatchery_cmd(&[
        "run",
        "--rw",
        &s(dir),
        "--report",
        &s(&report),
        "--",
        "sh",
        "-c",
        script,
    ]);
    let v =
        serde_json::from_slice(&std::fs::read(&report).unwrap_or_default()).unwrap_or(Value::Null);
    (out, v)
}

/// Whether one line of the report's `enforcement.not_enforced` has every one of `words`.
fn not_enforced_says(report: &Value, words: &[&str]) -> bool {
    report["enforcement"]["not_enforced"]
        .as_array()
        .is_some_and(|lines| {
            lines
                .iter()
                .filter_map(Value::as_str)
                .any(|l| words.iter().all(|w| l.contains(w)))
        })
}

#[test]
fn a_root_owned_read_write_directory_gives_the_sandbox_only_what_others_may_do() {
    if skip_unless_root("root-owned --rw") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let chmod = |mode: u32| {
        std::fs::set_permissions(&d, PermissionsExt::from_mode(mode))
            .unwrap_or_else(|e| panic!("chmod {mode:o}: {e}"))
    };
    let roots = d.join("roots");
    std::fs::write(&roots, "root's\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&roots, PermissionsExt::from_mode(0o644)).ok();
    // Root's directory, which only root may write: the sandbox is never root on the host,
    // so it may neither add a file nor change root's.
    chmod(0o755);
    let attack = format!(
        "echo x > {0}/new; echo y >> {0}/roots; cat {0}/roots",
        s(&d)
    );
    let out = hatchery_cmd(&["run", "--rw", &s(&d), "--", "sh", "-c", &attack]);
    assert_eq!(stdout(&out), "root's", "{}", stderr(&out));
    assert!(
        !d.join("new").exists(),
        "the sandbox created a file in a directory only root may write"
    );
    assert!(
        stderr(&out).contains("the sandbox cannot write it"),
        "no warning: {}",
        stderr(&out)
    );
    // Where others may write, it does, as its own host uid (never root), no warning says
    // otherwise, and the report says whose its files are.
    chmod(0o1777);
    let (out, report) = run_rw_reported(&d, &format!("echo x > {}/new", s(&d)));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    assert!(
        not_enforced_says(&report, &["root owns it", "leased"]),
        "{report}"
    );
    let made = std::fs::metadata(d.join("new")).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        in_sandbox_id_range(made.uid()),
        "a file the sandbox made in root's directory belongs to uid {}",
        made.uid()
    );
}

#[test]
fn a_read_write_directory_in_roots_group_hands_the_sandbox_its_owner_never_roots_group() {
    if skip_unless_root("root group --rw") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let file = |name: &str, uid: u32, gid: u32, mode: u32| {
        let p = d.join(name);
        std::fs::write(&p, format!("{name}\n")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&p, PermissionsExt::from_mode(mode)).ok();
    };
    // A user's directory whose group is root's: its owner's file is the sandbox's to
    // change; a file root's group may write or read is not.
    file("owners", 4321, 4321, 0o644);
    file("root-group", 0, 0, 0o664);
    file("root-group-secret", 0, 0, 0o640);
    std::os::unix::fs::chown(&d, Some(4321), Some(0)).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&d, PermissionsExt::from_mode(0o775)).ok();
    let script = format!(
        "echo y >> {0}/owners; echo y >> {0}/root-group; echo x > {0}/new; cat {0}/owners {0}/root-group {0}/root-group-secret",
        s(&d)
    );
    let (out, report) = run_rw_reported(&d, &script);
    assert_eq!(stdout(&out), "owners\ny\nroot-group", "{}", stderr(&out));
    assert!(
        not_enforced_says(&report, &["its group is root's", "leased"]),
        "{report}"
    );
    let made = std::fs::metadata(d.join("new")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        made.uid(),
        4321,
        "a new file belongs to the directory's owner"
    );
    assert_ne!(made.gid(), 0, "a new file belongs to root's group");
}

#[test]
fn a_read_write_directory_in_a_group_its_owner_is_not_in_hands_the_sandbox_no_group() {
    if skip_unless_root("foreign group --rw") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    // `nobody`'s directory in a group `nobody` is not in (root may set any), holding a file
    // of root's that group may read: `nobody` cannot read it, and neither may the sandbox.
    let secret = d.join("group-secret");
    std::fs::write(&secret, "secret\n").unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::chown(&secret, Some(0), Some(4242)).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&secret, PermissionsExt::from_mode(0o640)).ok();
    std::os::unix::fs::chown(&d, Some(65534), Some(4242)).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&d, PermissionsExt::from_mode(0o775)).ok();
    let script = format!("echo x > {0}/new; cat {0}/group-secret", s(&d));
    let (out, report) = run_rw_reported(&d, &script);
    assert!(!stdout(&out).contains("secret"), "{}", stdout(&out));
    assert!(
        not_enforced_says(
            &report,
            &["gid 4242, not one its owner belongs to", "leased"]
        ),
        "{report}"
    );
    let made = std::fs::metadata(d.join("new")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        made.uid(),
        65534,
        "a new file belongs to the directory's owner"
    );
    assert!(
        in_sandbox_id_range(made.gid()),
        "a new file's group is {}, not the sandbox's own",
        made.gid()
    );
}

#[test]
fn a_user_database_that_never_answers_refuses_the_start_instead_of_holding_it() {
    if skip_unless_root("hung user database") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let fifo = user_db::silent_group_file(&d);
    let exposed = user_db::foreign_group_dir(&d);
    let unshare = user_db::with_binds(&[(&fifo, "/etc/group")]);
    let started = Instant::now();
    let out = run_with_timeout(
        Command::new(&unshare[0])
            .args(&unshare[1..])
            .arg(hatchery())
            .args(["run", "--rw", &s(&exposed), "--", "true"]),
        Duration::from_secs(40),
    );
    let took = started.elapsed();
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("user database") && err.contains("did not answer"),
        "{err}"
    );
    assert!(took < Duration::from_secs(15), "refused after {took:?}");
    // The lookup ran in a helper: it is gone with the run, killed, not left waiting (the
    // shell's command line has the path quoted, the helper's, run's own, does not).
    wait_process(
        &format!("run --rw {}", s(&exposed)),
        false,
        Duration::from_secs(5),
        "the lookup's helper was left behind",
    );
}

// ------------------------------------------------------------ 6. --ro write channels

#[test]
fn a_read_only_path_gives_no_write_channel_to_host_fifos_or_sockets() {
    if skip_unless_root("ro channels") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let fifo = d.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666))
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&fifo, PermissionsExt::from_mode(0o666)).ok();
    let sock = d.join("sock");
    let listener =
        std::os::unix::net::UnixListener::bind(&sock).unwrap_or_else(|e| panic!("bind: {e}"));
    std::fs::set_permissions(&sock, PermissionsExt::from_mode(0o777)).ok();
    listener.set_nonblocking(true).ok();
    // Keep the FIFO open for reading, so a write would go through.
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nonblock()
        .open(&fifo)
        .unwrap_or_else(|e| panic!("{e}"));

    // The attack is real: any unprivileged host identity (what a sandbox is) may write to
    // the FIFO and connect to the socket.
    for (cmd, path) in [("fifo-write", &fifo), ("unix-connect", &sock)] {
        let out = run_with_timeout(
            Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(probe())
                .args([cmd, &s(path)]),
            Duration::from_secs(20),
        );
        assert!(
            stdout(&out).starts_with("ok"),
            "{cmd} as nobody: {}",
            stdout(&out)
        );
    }
    while listener.accept().is_ok() {}

    // Through --ro (under the sandbox's writable /tmp, whose Landlock write right reaches
    // into mounts below it): refused.
    for (cmd, path) in [("fifo-write", &fifo), ("unix-connect", &sock)] {
        let out = run_probe(&["--ro", &s(&d)], &[cmd, &s(path)]);
        assert_eq!(
            stdout(&out),
            format!("err {}", libc::EACCES),
            "{cmd} through --ro: {}",
            stderr(&out)
        );
    }
    assert!(
        listener.accept().is_err(),
        "the host listener saw a connection through --ro"
    );
}

trait NonblockOpen {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonblockOpen for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::custom_flags(self, libc::O_NONBLOCK)
    }
}

#[test]
fn rootless_read_only_paths_say_what_they_leave_open() {
    if skip_unless_root("rootless ro") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    let fifo = d.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666))
        .unwrap_or_else(|e| panic!("{e}"));
    let report = d.join("r.json");
    let out = run_with_timeout(
        Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(hatchery())
            .args(["run", "--ro", &s(&d), "--report", &s(&report), "--", "true"]),
        Duration::from_secs(60),
    );
    if code(&out) == 125 {
        eprintln!(
            "SKIP rootless ro: rootless runs cannot start here: {}",
            stderr(&out)
        );
        return;
    }
    let v: Value = serde_json::from_slice(&std::fs::read(&report).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    let notes = v["enforcement"]["not_enforced"].to_string();
    assert!(
        notes.contains(&format!("--ro {}", s(&d))) && notes.contains("FIFOs and unix sockets"),
        "{notes}"
    );
}

// ------------------------------------------------------ 8. unaccounted kernel objects

/// How many inotify instances this process (root) can create now (all closed again).
fn roots_inotify_headroom(limit: usize) -> usize {
    let mut fds = Vec::new();
    while fds.len() < limit {
        // SAFETY: inotify_init1 returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        if fd < 0 {
            break;
        }
        fds.push(fd);
    }
    let n = fds.len();
    for fd in fds {
        // SAFETY: closing descriptors this function opened.
        unsafe { libc::close(fd) };
    }
    n
}

#[test]
fn a_sandbox_holding_inotify_instances_takes_none_of_roots() {
    if skip_unless_root("inotify") {
        return;
    }
    let before = roots_inotify_headroom(200);
    if before < 32 {
        eprintln!("SKIP inotify: root has only {before} inotify instances left here");
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    // The attack is real: in a plain user namespace root created, every instance the
    // payload holds is charged to root.
    let ready = d.join("ready-unshare");
    let holder = Command::new("unshare")
        .args(["--user", "--map-root-user", "--"])
        .arg(probe())
        .args(["inotify", "500", "10", &s(&ready)])
        .stdout(Stdio::null())
        .spawn()
        .map(Background)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for(&ready, "unshare holder");
    let during = roots_inotify_headroom(200);
    drop(holder);
    assert!(
        during < before,
        "the plain user namespace did not charge root ({before} → {during})"
    );
    // The instances go back to root as the kernel frees them, not at once.
    let start = std::time::Instant::now();
    while roots_inotify_headroom(200) < before && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }

    let ready = d.join("ready");
    let _holder = background(&probe_args(
        &["--rw".into(), s(&d), "--timeout".into(), "30s".into()],
        &["inotify", "500", "10", &s(&ready)],
    ));
    wait_for(&ready, "sandbox holder");
    let during = roots_inotify_headroom(200);
    assert!(
        during >= before,
        "a sandbox's inotify instances were charged to root ({before} → {during})"
    );
    let out = run_probe(&[], &["inotify", "500", "0"]);
    let held: u64 = stdout(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(held <= 64, "a sandbox held {held} inotify instances");
}

#[test]
fn a_sandbox_gets_at_most_sixteen_terminals() {
    if skip_unless_root("ptys") {
        return;
    }
    let out = run_probe(&[], &["ptys", "200"]);
    let got: u64 = stdout(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(got <= 16, "{}", stdout(&out));
    assert!(got >= 1, "no terminal at all: {}", stdout(&out));
}

#[test]
fn the_report_says_which_socket_buffers_the_memory_limit_does_not_cover() {
    if skip_unless_root("socket memory") {
        return;
    }
    let dir = shared_tempdir();
    let report = canonical(dir.path()).join("r.json");
    let out = hatchery_cmd(&[
        "run",
        "--memory",
        "64M",
        "--report",
        &s(&report),
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&std::fs::read(&report).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    let notes = v["enforcement"]["not_enforced"].to_string();
    let memory = v["enforcement"]["limits"]["memory"].as_str().unwrap_or("");
    match v["enforcement"]["cgroup"].as_str() {
        Some("v1") => {
            assert!(memory.contains("memory.kmem.tcp"), "{memory}");
            assert!(
                notes.contains("UDP, unix and netlink socket buffers"),
                "{notes}"
            );
        }
        _ => assert!(memory.contains("socket buffers"), "{memory}"),
    }
}

// ------------------------------------------------------------------ 10. refusals speak

#[test]
fn every_refusal_says_one_line_and_fills_the_reports_error() {
    if skip_unless_root("refusals") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    // Input refused before anything starts (2), a sandbox that cannot be set up (125).
    let cases: [(&[&str], &str, i32); 2] = [
        (&["--ro", "/nonexistent-hatchery"], "does not exist", 2),
        (
            &["--cwd", "/nonexistent-hatchery"],
            "working directory",
            125,
        ),
    ];
    for (i, (flags, why, want)) in cases.into_iter().enumerate() {
        let report = d.join(format!("r{i}.json"));
        let mut args = vec!["run".to_string()];
        args.extend(flags.iter().map(|f| f.to_string()));
        args.extend(["--report".into(), s(&report), "--".into(), "true".into()]);
        let out = hatchery_owned(&args);
        assert_eq!(code(&out), want, "{flags:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{flags:?}: {err}");
        assert!(err.contains(why), "{flags:?}: {err}");
        let v: Value = serde_json::from_slice(&std::fs::read(&report).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{flags:?}: no report: {e}"));
        assert!(
            v["error"].as_str().is_some_and(|e| e.contains(why)),
            "{flags:?}: {v}"
        );
        assert_eq!(v["exit_code"], want);
    }
    // Hostnames the kernel refuses are refused before anything starts, with the rule.
    let out = hatchery_cmd(&["run", "--hostname", &"x".repeat(70), "--", "true"]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("1 to 64"), "{}", stderr(&out));
}

#[test]
fn io_uring_and_aio_are_refused_by_the_floor_under_a_profile_that_allows_them() {
    if skip_unless_root("io_uring floor") {
        return;
    }
    // A profile with no rules at all: whatever it lets through, the floor must not.
    let dir = shared_tempdir();
    let profile = canonical(dir.path()).join("open.toml");
    std::fs::write(
        &profile,
        "name = \"open\"\n[seccomp]\ndefault_action = \"allow\"\n[landlock]\nread = [\"/usr\", \"/etc\", \"/proc\", \"/dev\"]\nwrite = [\"/tmp\", \"/dev\"]\nexecute = [\"/usr\", \"/tmp\"]\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // The attack is real: outside a sandbox io_uring and AIO contexts can be created.
    let out = run_with_timeout(
        Command::new(probe()).args(["syscall", "io_uring_setup", "1", "0"]),
        Duration::from_secs(10),
    );
    assert_eq!(
        stdout(&out),
        "err 14",
        "io_uring_setup(1, NULL) reaches the kernel (EFAULT)"
    );
    for (syscall, errno) in [("io_uring_setup", libc::EPERM), ("io_setup", libc::ENOSYS)] {
        let out = run_probe(
            &["--profile", &s(&profile)],
            &["syscall", syscall, "1", "0"],
        );
        assert_eq!(
            stdout(&out),
            format!("err {errno}"),
            "{syscall} under a profile that allows it: {}",
            stderr(&out)
        );
    }
}

// ------------------------------------------------------------ 11. the host's counters

#[test]
fn the_sandbox_sees_neither_host_load_nor_host_memory_nor_the_host_boot() {
    if skip_unless_root("proc view") {
        return;
    }
    let host_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    // The leak is real: a plain new pid namespace with its own /proc still shows them.
    let out = run_with_timeout(
        Command::new("unshare").args([
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--mount-proc",
            "cat",
            "/proc/sys/kernel/random/boot_id",
        ]),
        Duration::from_secs(20),
    );
    assert_eq!(stdout(&out), host_boot.trim(), "{}", stderr(&out));

    let out = hatchery_cmd(&[
        "run",
        "--memory",
        "64M",
        "--",
        "sh",
        "-c",
        "cat /proc/loadavg; grep -E '^(processes|ctxt)' /proc/stat; head -1 /proc/meminfo; cat /proc/sys/kernel/random/boot_id; wc -c < /proc/interrupts; ls /proc/pressure | wc -l; nproc; cat /proc/cgroups /proc/vmstat | wc -c; find /proc/irq /proc/fs -mindepth 1 | wc -l",
    ]);
    let lines: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert_eq!(
        lines.first().map(String::as_str),
        Some("0.00 0.00 0.00 1/1 1")
    );
    assert_eq!(lines.get(1).map(String::as_str), Some("ctxt 0"));
    assert_eq!(lines.get(2).map(String::as_str), Some("processes 0"));
    assert!(
        lines
            .get(3)
            .is_some_and(|l| l.starts_with("MemTotal:") && l.ends_with(" 65536 kB")),
        "{lines:?}"
    );
    assert_ne!(lines.get(4).map(String::as_str), Some(host_boot.trim()));
    assert_eq!(lines.get(5).map(String::as_str), Some("0"), "interrupts");
    assert_eq!(lines.get(6).map(String::as_str), Some("0"), "pressure");
    let host_cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    assert_eq!(
        lines.get(7).map(String::as_str),
        Some(host_cpus.to_string().as_str()),
        "processors are still counted"
    );
    assert_eq!(
        lines.get(8).map(String::as_str),
        Some("0"),
        "cgroups, cmdline"
    );
    assert_eq!(lines.get(9).map(String::as_str), Some("0"), "irq, fs");
    assert!(
        Path::new("/proc/interrupts")
            .metadata()
            .is_ok_and(|m| !m.file_type().is_fifo())
    );
}

// ------------------------------------------------------------ 12. pid 1

#[test]
fn pid_1_is_closed_to_the_payload_while_a_process_of_the_payloads_own_is_open() {
    if skip_unless_root("pid 1") {
        return;
    }
    // pid 1 keeps its capabilities in the sandbox until the payload has started. The
    // attack is real: a process the payload starts, same uid, is open to it (environment,
    // descriptors, memory map); pid 1 is not (the rootless test, where pid 1's change of
    // identity is no change, shows it open without its own non-dumpable step).
    let out = hatchery_cmd(&["run", "--memory", "64M", "--", "sh", "-c", PID1_PROBE]);
    assert_eq!(
        stdout(&out).lines().collect::<Vec<_>>(),
        PID1_CLOSED,
        "{}",
        stderr(&out)
    );
}

/// Connects the descriptor it was given as stdout elsewhere: `AF_UNSPEC` ends a TCP
/// connection, then the same socket, still the host's, connects to the port named.
const RECONNECT_STDOUT: &str = r#"
import ctypes, os, socket, struct, sys
try:
    s = socket.socket(fileno=os.dup(1))
    libc = ctypes.CDLL(None, use_errno=True)
    unspec = struct.pack("HH12x", 0, 0)
    libc.connect(s.fileno(), unspec, len(unspec))
    s.settimeout(5)
    s.connect(("127.0.0.1", int(sys.argv[1])))
    print("reached", s.recv(64), file=sys.stderr)
except OSError as e:
    print("refused", e, file=sys.stderr)
print("hello through stdout")
"#;

/// `cmd` with the stdin and stdout given, within 60 s: its status and stderr.
fn run_with_stdio(cmd: &mut Command, stdin: Stdio, out: Stdio) -> (i32, String) {
    let mut child = cmd
        .stdin(stdin)
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let err = child.stderr.take();
    let drained = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut e) = err {
            let _ = std::io::Read::read_to_string(&mut e, &mut text);
        }
        text
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > Duration::from_secs(60) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{cmd:?} did not finish within 60 s");
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("wait: {e}"),
        }
    };
    (
        status.code().unwrap_or(-1),
        drained.join().unwrap_or_default(),
    )
}

/// A TCP connection on loopback: the end given as stdout, and the end the caller reads.
fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let ours = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
    let (theirs, _) = l.accept().unwrap_or_else(|e| panic!("{e}"));
    (theirs, ours)
}

/// A socket the caller gives as stdout (inetd, `socat EXEC:`, a service manager's
/// `Accept=yes`) is the host's network: held by the command, it connects anywhere the host
/// can reach. It is relayed through a pipe; the command's output still reaches it.
#[test]
fn a_socket_given_as_stdout_is_relayed_never_the_commands_way_to_the_host() {
    if skip_unless_root("socket stdout") {
        return;
    }
    let secret = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    secret
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("{e}"));
    let port = secret
        .local_addr()
        .map(|a| a.port().to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    let answered = |what: &str| {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            if let Ok((mut c, _)) = secret.accept() {
                let _ = std::io::Write::write_all(&mut c, b"SECRET\n");
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("{what}: no connection");
        false
    };

    // The attack is real: run directly, the script reaches the port through its stdout.
    let (theirs, _ours) = tcp_pair();
    let mut direct = Command::new("python3")
        .args(["-c", RECONNECT_STDOUT, &port])
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("python3: {e}"));
    assert!(
        answered("direct"),
        "the attack did not work even unsandboxed"
    );
    let _ = direct.wait();

    let tmp = shared_tempdir();
    let report = tmp.path().join("report.json");
    let (theirs, ours) = tcp_pair();
    let mut cmd = Command::new(hatchery());
    cmd.arg("run").arg("--report").arg(&report).args([
        "--",
        "python3",
        "-c",
        RECONNECT_STDOUT,
        &port,
    ]);
    let given = Stdio::from(std::os::fd::OwnedFd::from(theirs));
    let (_, err) = run_with_stdio(&mut cmd, Stdio::null(), given);
    assert!(
        !answered("sandboxed"),
        "the sandbox reached the host's loopback: {err}"
    );
    assert!(err.contains("refused"), "{err}");
    let mut got = String::new();
    ours.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let _ = std::io::Read::read_to_string(&mut &ours, &mut got);
    assert_eq!(got, "hello through stdout\n", "the output still arrives");
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap_or_default())
        .unwrap_or_else(|e| panic!("report: {e}"));
    assert_eq!(
        r["enforcement"]["stdio"]["stdout"], "pipe relay (socket)",
        "{r}"
    );
    assert_eq!(r["exit_code"], 0, "{r}");
}

/// A directory given as stdin is a place to walk from (`openat(0, "..")`, its path in
/// `/proc/self/fd/0`): the command reads `/dev/null` instead.
#[test]
fn a_directory_given_as_stdin_is_not_passed() {
    if skip_unless_root("directory stdin") {
        return;
    }
    let (dir, _) = vault("inside", "x");
    let tmp = shared_tempdir();
    let report = tmp.path().join("report.json");
    let stdin = std::fs::File::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(hatchery());
    cmd.arg("run").arg("--report").arg(&report).args([
        "--",
        "sh",
        "-c",
        "ls -la /proc/self/fd/0 | grep vault >&2",
    ]);
    let (_, err) = run_with_stdio(&mut cmd, Stdio::from(stdin), Stdio::null());
    assert_eq!(err, "", "the command saw where its stdin is");
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap_or_default())
        .unwrap_or_else(|e| panic!("report: {e}"));
    assert_eq!(
        r["enforcement"]["stdio"]["stdin"], "not passed (directory): the command reads /dev/null",
        "{r}"
    );
}

/// A namespace file given as stdin says it is a regular file (it is the host's network
/// namespace: a handle, not data), and a FIFO given read-write as stdout lets the command
/// read what others wrote there: neither reaches the command as it is.
#[test]
fn a_namespace_as_stdin_or_a_read_write_fifo_as_stdout_is_not_passed() {
    if skip_unless_root("kernel object stdio") {
        return;
    }
    let tmp = shared_tempdir();
    let report = tmp.path().join("report.json");
    let fifo = tmp.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
        .unwrap_or_else(|e| panic!("{e}"));
    let both_ways = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap_or_else(|e| panic!("{e}"));
    std::io::Write::write_all(&mut &both_ways, b"host-secret\n").unwrap_or_else(|e| panic!("{e}"));
    let ns = std::fs::File::open("/proc/self/ns/net").unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(hatchery());
    cmd.arg("run").arg("--report").arg(&report).args([
        "--",
        "sh",
        "-c",
        "ls -l /proc/self/fd/0 >&2; read x <&1; echo \"got:$x\" >&2",
    ]);
    let (_, err) = run_with_stdio(&mut cmd, Stdio::from(ns), Stdio::from(both_ways));
    assert!(
        !err.contains("net:["),
        "the namespace reached the command: {err}"
    );
    assert!(!err.contains("host-secret"), "read through stdout: {err}");
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap_or_default())
        .unwrap_or_else(|e| panic!("report: {e}"));
    let stdio = &r["enforcement"]["stdio"];
    assert_eq!(
        stdio["stdin"], "not passed (kernel object): the command reads /dev/null",
        "{r}"
    );
    assert_eq!(stdio["stdout"], "pipe relay (read-write pipe)", "{r}");
}

/// An `O_PATH` descriptor as stdin can be neither read nor polled: hatchery (as std's own
/// start-up would) aborted before anything ran. It is taken as a closed stdin.
#[test]
fn an_o_path_stdin_is_taken_as_closed_not_a_crash() {
    let path_only = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open("/etc/hostname")
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let mut cmd = Command::new(hatchery());
    cmd.args(["run", "--", "/bin/true"]);
    let (status, err) = run_with_stdio(&mut cmd, Stdio::from(path_only), Stdio::null());
    assert_eq!(status, 0, "{err}");
}

// ----------------------------------------------------------------- 7. shared device nodes

/// The modification and change times of a host file, to the nanosecond.
fn times(path: &str) -> (i64, i64, i64, i64) {
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec())
}

#[test]
fn the_hosts_device_nodes_carry_no_timestamps_from_one_sandbox_to_another() {
    if skip_unless_root("device nodes") {
        return;
    }
    // The attack is real: "touch to now" needs only write permission, which every 0666
    // node gives (here a world-writable file of root's, touched by nobody).
    let dir = shared_tempdir();
    let open = canonical(dir.path()).join("world-writable");
    std::fs::write(&open, "").unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&open, PermissionsExt::from_mode(0o666)).ok();
    std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o755)).ok();
    let open = s(&open);
    let before = times(&open);
    std::thread::sleep(Duration::from_millis(20));
    let touched = run_with_timeout(
        Command::new("runuser").args(["-u", "nobody", "--", "touch", "-c", &open]),
        Duration::from_secs(10),
    );
    assert!(touched.status.success(), "{}", stderr(&touched));
    assert_ne!(times(&open), before, "touch as nobody left the times alone");
    // In a sandbox, the host's nodes are still written and read, but never touched: their
    // times would be a channel between sandboxes that share nothing else.
    let before: Vec<_> = ["/dev/null", "/dev/zero", "/dev/full"].map(times).into();
    std::thread::sleep(Duration::from_millis(20));
    let out = hatchery_cmd(&[
        "run",
        "--",
        "sh",
        "-c",
        "echo x > /dev/null && head -c 1 /dev/zero > /dev/null && echo wrote; \
         touch -c /dev/null /dev/zero /dev/full 2>/dev/null || echo refused",
    ]);
    assert_eq!(stdout(&out), "wrote\nrefused", "{}", stderr(&out));
    let after: Vec<_> = ["/dev/null", "/dev/zero", "/dev/full"].map(times).into();
    assert_eq!(
        after, before,
        "a sandbox changed the host's device nodes' times"
    );
}

// ----------------------------------------------------------------- 8. the caller's stdio

const PYTHON3: &str = "/usr/bin/python3";

/// Through stdout, clears `O_APPEND` and moves the offset to the start of the file.
const UNAPPEND_STDOUT: &str = "import os, fcntl\nfcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) & ~os.O_APPEND)\nos.lseek(1, 0, os.SEEK_SET)";

#[test]
fn the_callers_next_write_to_an_append_only_stdout_appends_whatever_the_payload_did() {
    if skip_unless_root("append-only stdout") {
        return;
    }
    let dir = shared_tempdir();
    let log = canonical(dir.path()).join("app.log");
    let history = "line1 important\nline2\n";
    // `{ COMMAND; echo after; } >> app.log`: the caller writes through the same open file
    // description once the command is done.
    let then_after = |argv: &[&str]| -> String {
        std::fs::write(&log, history).unwrap_or_else(|e| panic!("{e}"));
        let out = std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("{e}"));
        let ours = out.try_clone().unwrap_or_else(|e| panic!("{e}"));
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..]);
        let (status, err) = run_with_stdio(&mut cmd, Stdio::null(), Stdio::from(out));
        assert_eq!(status, 0, "{err}");
        std::io::Write::write_all(&mut &ours, b"after\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::read_to_string(&log).unwrap_or_default()
    };
    // The attack is real: given the description as it is, a command leaves it so that the
    // caller's next line overwrites the log's history.
    let overwritten = then_after(&[PYTHON3, "-c", UNAPPEND_STDOUT]);
    assert!(overwritten.starts_with("after\n"), "{overwritten:?}");
    // After a sandbox, the description appends again.
    let h = s(&hatchery());
    assert_eq!(
        then_after(&[&h, "run", "--", PYTHON3, "-c", UNAPPEND_STDOUT]),
        format!("{history}after\n")
    );
}

#[test]
fn a_payload_that_makes_its_stdout_non_blocking_neither_loses_the_report_nor_leaves_the_flag() {
    if skip_unless_root("non-blocking stdout") {
        return;
    }
    // Fills the pipe without blocking, then exits 0; nobody reads for a second.
    let fill = "import os, fcntl\nfcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_NONBLOCK)\ntry:\n    while True: os.write(1, b'x' * 4096)\nexcept BlockingIOError: pass";
    // Close-on-exec: no command another test starts meanwhile holds it open.
    let (read, write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap_or_else(|e| panic!("{e}"));
    let ours = write.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        let mut all = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::fs::File::from(read), &mut all);
        all
    });
    let (status, err) = {
        // Dropped with it: a command holds the descriptors it was given.
        let mut cmd = Command::new(hatchery());
        cmd.args(["run", "--report", "-", "--", PYTHON3, "-c", fill]);
        run_with_stdio(&mut cmd, Stdio::null(), Stdio::from(write))
    };
    let flags = nix::fcntl::fcntl(&ours, nix::fcntl::FcntlArg::F_GETFL).unwrap_or(0);
    drop(ours);
    let all = reader.join().unwrap_or_default();
    assert_eq!(status, 0, "{err}");
    let text = String::from_utf8_lossy(&all);
    let report = text.trim_start_matches('x');
    let r: Value =
        serde_json::from_str(report).unwrap_or_else(|e| panic!("report {report:?}: {e}"));
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(
        flags & libc::O_NONBLOCK,
        0,
        "the caller's pipe was left non-blocking"
    );
}
