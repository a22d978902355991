//! The controller's warm pool, as root, with real sandboxes: a worker of the last worker's
//! kind starts in a sandbox prepared before it was asked for, with nothing of that
//! sandbox's past and all of its own limits; another kind starts afresh; the kill switch,
//! a prepared sandbox killed from outside and the controller's stop leave nothing behind.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::agents::*;
use common::controller::{TestController, worker_cgroups};
use common::*;

/// Waits for worker `id` to end; its log.
fn output_of(c: &TestController, id: &str) -> String {
    c.wait_for(&format!("{id} to end"), Duration::from_secs(30), |v| {
        v["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["worker_id"] == id && w["state"] == "exited")
        })
    });
    stdout(&c.cli(&["logs", id]))
}

/// What a worker reports of itself: its hostname, ids, descriptors, environment and the
/// kernel's view of its confinement. Its descriptors are listed by a command that needs no
/// pipe or redirection of the shell's (a pipeline's pipes are the shell's own until it
/// has forked every stage, and a redirection may save a descriptor).
const SELF_REPORT: &str = "echo host=$(hostname) id=$HATCHERY_WORKER_ID uid=$(id -u); \
     printf fds=; ls -m /proc/$$/fd; \
     echo secret=${POOL_SECRET:-none}; \
     grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; \
     cat /proc/sys/kernel/random/boot_id; sleep 2";

/// The memory limit a cgroup directory of any version holds, in bytes.
fn memory_limit(cgroup: &str) -> Option<u64> {
    let dir = PathBuf::from(cgroup);
    ["memory.max", "memory.limit_in_bytes"]
        .iter()
        .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .and_then(|s| s.trim().parse().ok())
}

#[test]
fn a_worker_of_the_last_kind_starts_prepared_with_nothing_of_the_sandboxs_past() {
    if skip("warm pool") {
        return;
    }
    let c = TestController::start(&base_contract(""), &["--warm-pool", "2"]);
    // Nothing is prepared before a worker has shown what kind to prepare.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.prepared(), 0);
    let first = spawned(
        &c,
        &[
            "--memory",
            "96M",
            "--env",
            "POOL_SECRET=first-workers-secret",
        ],
        SELF_REPORT,
    );
    assert_eq!(c.started_details(&first)["prepared_ahead"], false);
    let first_out = output_of(&c, &first);
    assert!(
        first_out.contains("secret=first-workers-secret"),
        "{first_out}"
    );
    c.wait_prepared(2, Duration::from_secs(20));
    // A pool must not hold its sandboxes' cgroup directories open (see `control.rs`).
    let (held, most) = c.launcher_cgroup_fds(2);
    assert!(held.len() <= most, "the launcher holds {held:?}");

    let second = spawned(&c, &["--memory", "96M"], SELF_REPORT);
    let details = c.started_details(&second);
    assert_eq!(details["prepared_ahead"], true, "{details}");
    let cgroup = details["cgroup"].as_str().unwrap_or_default().to_string();
    assert!(cgroup.contains("_warm"), "{details}");
    assert_eq!(
        memory_limit(&cgroup),
        Some(96 << 20),
        "the worker's memory limit holds in its prepared cgroup"
    );
    let out = output_of(&c, &second);
    // Its own name, id and descriptors (stdio and its controller socket, nothing else),
    // no trace of the worker the pool was shaped after, and the same confinement.
    assert!(
        out.contains(&format!("host={second} id={second} uid=0")),
        "{out}"
    );
    assert!(out.contains("fds=0, 1, 2, 3\n"), "{out}");
    assert!(out.contains("secret=none"), "{out}");
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(out.contains("Seccomp:\t2"), "{out}");
    let boot_id = |o: &str| o.lines().last().unwrap_or_default().to_string();
    assert_ne!(
        boot_id(&out),
        boot_id(&first_out),
        "each sandbox has its own boot id"
    );
    // The pool fills again once the launcher is idle.
    c.wait_prepared(2, Duration::from_secs(20));
}

#[test]
fn a_worker_of_another_kind_starts_afresh_and_the_pool_turns_to_its_kind() {
    if skip("warm pool") {
        return;
    }
    let c = TestController::start(&base_contract(""), &["--warm-pool", "1"]);
    let a = spawned(&c, &["--memory", "64M"], "true");
    assert_eq!(c.started_details(&a)["prepared_ahead"], false);
    c.wait_prepared(1, Duration::from_secs(20));
    // Another memory limit is another cgroup: not the prepared one.
    let b = spawned(&c, &["--memory", "128M"], "sleep 2");
    let details = c.started_details(&b);
    assert_eq!(details["prepared_ahead"], false, "{details}");
    let cgroup = details["cgroup"].as_str().unwrap_or_default();
    assert!(!cgroup.contains("_warm"), "{details}");
    assert_eq!(memory_limit(cgroup), Some(128 << 20));
    c.wait_prepared(1, Duration::from_secs(20));
    let third = spawned(&c, &["--memory", "128M"], "sleep 2");
    let details = c.started_details(&third);
    assert_eq!(details["prepared_ahead"], true, "{details}");
    assert_eq!(
        memory_limit(details["cgroup"].as_str().unwrap_or_default()),
        Some(128 << 20)
    );
    // Another exposure is another root filesystem: afresh too.
    let dir = shared_tempdir();
    let d = spawned(
        &c,
        &["--memory", "128M", "--ro", &dir.path().to_string_lossy()],
        "true",
    );
    assert_eq!(c.started_details(&d)["prepared_ahead"], false);
}

#[test]
fn the_kill_switch_tears_the_pool_down_and_nothing_is_prepared_until_workers_start_again() {
    if skip("warm pool") {
        return;
    }
    let mut c = TestController::start(&base_contract(""), &["--warm-pool", "3"]);
    spawned(&c, &[], "true");
    c.wait_prepared(3, Duration::from_secs(30));
    let out = c.cli(&["kill-switch"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    c.wait_prepared(0, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        c.prepared(),
        0,
        "nothing is prepared while the switch is engaged"
    );
    let out = c.cli(&["kill-switch", "--release"]);
    assert_eq!(code(&out), 0);
    let id = spawned(&c, &[], "true");
    assert_eq!(c.started_details(&id)["prepared_ahead"], false);
    c.wait_prepared(3, Duration::from_secs(30));
    // The controller's stop takes the prepared sandboxes and their cgroups with it.
    let launcher = c.launcher_pid();
    let owner = format!("-{launcher}-");
    c.stop();
    let left: Vec<PathBuf> = worker_cgroups("_warm")
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(&owner))
        .collect();
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
    assert!(
        !std::path::Path::new(&format!("/proc/{launcher}")).exists(),
        "the launcher outlived the controller"
    );
}

#[test]
fn a_prepared_sandbox_killed_from_outside_is_passed_over() {
    if skip("warm pool") {
        return;
    }
    let c = TestController::start(&base_contract(""), &["--warm-pool", "1"]);
    spawned(&c, &[], "true");
    c.wait_prepared(1, Duration::from_secs(20));
    let procs = c.prepared_pids();
    assert!(!procs.is_empty(), "the prepared sandbox has a process");
    for p in procs {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // Reaped, and its cgroup removed, as soon as it ends: not left for the next launch.
    c.wait_prepared(0, Duration::from_secs(15));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        c.prepared(),
        0,
        "a kind whose sandbox died is not prepared again at once"
    );
    let id = spawned(&c, &[], "echo started-anyway");
    let details = c.started_details(&id);
    assert_eq!(details["prepared_ahead"], false, "{details}");
    assert!(output_of(&c, &id).contains("started-anyway"));
}

#[test]
fn a_warm_pool_larger_than_allowed_is_refused_before_anything_starts() {
    let out = hatchery_cmd(&["controller", "--warm-pool", "1025"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("from 0 to 1024"), "{}", stderr(&out));
}

/// Runs `mount ARGS` on the host (bounded), panicking with its error when it fails.
fn host_mount(args: &[&str]) {
    let out = run_with_timeout(
        std::process::Command::new("mount").args(args),
        Duration::from_secs(10),
    );
    assert_eq!(code(&out), 0, "mount {args:?}: {}", stderr(&out));
}

/// Host mounts made by a test, lazily unmounted (last first) however the test ends.
struct HostMounts(Vec<PathBuf>);

impl Drop for HostMounts {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = run_with_timeout(
                std::process::Command::new("umount").arg("-l").arg(p),
                Duration::from_secs(10),
            );
        }
    }
}

#[test]
fn a_mount_the_host_removed_from_an_exposed_directory_is_gone_for_a_prepared_worker_too() {
    if skip("warm pool") {
        return;
    }
    let dir = shared_tempdir();
    let data = canonical(dir.path()).join("data");
    let tenant = data.join("tenant");
    std::fs::create_dir_all(&tenant).unwrap_or_else(|e| panic!("{e}"));
    let mut mounts = HostMounts(Vec::new());
    host_mount(&[
        "-t",
        "tmpfs",
        "-o",
        "size=1m",
        "tenant",
        &tenant.to_string_lossy(),
    ]);
    mounts.0.push(tenant.clone());
    std::fs::write(tenant.join("secret"), "another-tenants-data\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let c = TestController::start(&base_contract(""), &["--warm-pool", "1"]);
    let ro = data.to_string_lossy().to_string();
    spawned(&c, &["--ro", &ro], "true");
    c.wait_prepared(1, Duration::from_secs(20));
    // The host takes the volume away: a worker started now must not see it.
    let out = run_with_timeout(
        std::process::Command::new("umount").arg(&tenant),
        Duration::from_secs(10),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    mounts.0.clear();
    assert!(!tenant.join("secret").exists());
    let script = format!(
        "cat {}/secret 2>/dev/null || echo no-such-file",
        tenant.display()
    );
    let id = spawned(&c, &["--ro", &ro], &script);
    let details = c.started_details(&id);
    let out = output_of(&c, &id);
    assert!(
        !out.contains("another-tenants-data"),
        "prepared_ahead={}: the worker read a volume the host had unmounted: {out}",
        details["prepared_ahead"]
    );
}

#[test]
fn an_exposed_directory_the_host_made_read_only_is_read_only_for_a_prepared_worker_too() {
    if skip("warm pool") {
        return;
    }
    let dir = shared_tempdir();
    let data = canonical(dir.path()).join("data");
    std::fs::create_dir_all(&data).unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o777));
    let mut mounts = HostMounts(Vec::new());
    let c = TestController::start(&base_contract(""), &["--warm-pool", "1"]);
    let rw = data.to_string_lossy().to_string();
    spawned(&c, &["--rw", &rw], "true");
    c.wait_prepared(1, Duration::from_secs(20));
    // The operator freezes the data set (a read-only bind of it onto itself).
    host_mount(&["--bind", &rw, &rw]);
    mounts.0.push(data.clone());
    host_mount(&["-o", "remount,bind,ro", &rw]);
    let script = format!(
        "if echo x > {}/written 2>/dev/null; then echo wrote; else echo refused; fi",
        data.display()
    );
    let id = spawned(&c, &["--rw", &rw], &script);
    let details = c.started_details(&id);
    let out = output_of(&c, &id);
    assert!(
        out.contains("refused"),
        "prepared_ahead={}: the worker wrote to a directory the host had made read-only: {out}",
        details["prepared_ahead"]
    );
    // A sandbox prepared after the change is read-only, as a fresh one is.
    c.wait_prepared(1, Duration::from_secs(20));
    let id = spawned(&c, &["--rw", &rw], &script);
    assert!(output_of(&c, &id).contains("refused"));
    drop(c);
    drop(mounts);
}

#[test]
fn a_worker_whose_command_and_environment_exceed_a_claim_starts_afresh() {
    if skip("warm pool") {
        return;
    }
    let c = TestController::start(&base_contract(""), &["--warm-pool", "1"]);
    spawned(&c, &[], "true");
    c.wait_prepared(1, Duration::from_secs(20));
    // Each within its own limit, more than a claim together.
    let big = format!("BIG={}", "x".repeat(60 << 10));
    let script = format!("echo big=${{#BIG}} # {}", "y".repeat(8 << 10));
    let id = spawned(&c, &["--env", &big], &script);
    assert_eq!(c.started_details(&id)["prepared_ahead"], false);
    let out = output_of(&c, &id);
    assert!(out.contains(&format!("big={}", 60 << 10)), "{out}");
}

#[test]
fn a_controller_killed_outright_takes_its_prepared_sandboxes_and_its_successor_their_cgroups() {
    if skip("warm pool") {
        return;
    }
    let mut c = TestController::start(&base_contract(""), &["--warm-pool", "2"]);
    spawned(&c, &[], "true");
    c.wait_prepared(2, Duration::from_secs(20));
    let owner = format!("-{}-", c.launcher_pid());
    let left = || -> Vec<PathBuf> {
        worker_cgroups("_warm")
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(&owner))
            .collect()
    };
    let pids = c.prepared_pids();
    assert!(!pids.is_empty());
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(c.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let start = Instant::now();
    while pids
        .iter()
        .any(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "prepared sandboxes outlived their controller: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    c.stop();
    // Their cgroups stay, as workers' do, until the next controller sweeps them.
    let successor = TestController::start(&base_contract(""), &[]);
    let start = Instant::now();
    while !left().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "cgroups left behind: {:?}",
            left()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(successor);
}

#[test]
fn a_worker_of_another_profile_in_a_prepared_sandbox_runs_under_its_own_filter() {
    if skip("warm pool") {
        return;
    }
    let c = TestController::start(&base_contract(""), &["--warm-pool", "1"]);
    // `compat` allows ptrace, `default` does not.
    let traceme = "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); r = l.ptrace(0, 0, 0, 0); print(\"traceme\", r, ctypes.get_errno())'";
    let a = spawned(&c, &["--profile", "compat"], traceme);
    assert!(output_of(&c, &a).contains("traceme 0 0"));
    c.wait_prepared(1, Duration::from_secs(20));
    let b = spawned(&c, &["--profile", "default"], traceme);
    // The profiles differ in their filters only: the prepared sandbox fits.
    let details = c.started_details(&b);
    assert_eq!(details["prepared_ahead"], true, "{details}");
    let out = output_of(&c, &b);
    assert!(out.contains("traceme -1 1"), "{out}");
}

#[test]
fn a_request_that_fails_before_its_sandbox_starts_leaves_the_prepared_sandbox_for_the_next() {
    if skip("warm pool") {
        return;
    }
    let c = TestController::start(&base_contract(""), &["--warm-pool", "1"]);
    spawned(&c, &[], "true");
    c.wait_prepared(1, Duration::from_secs(20));
    let before = c.prepared_pids();
    let missing = format!("/nonexistent-{}", std::process::id());
    let out = c.cli(&["spawn", "--ro", &missing, "--", "true"]);
    assert_eq!(code(&out), 125, "{} {}", stdout(&out), stderr(&out));
    assert_eq!(c.prepared_pids(), before, "the same prepared sandbox waits");
    let id = spawned(&c, &[], "true");
    assert_eq!(c.started_details(&id)["prepared_ahead"], true);
}

#[test]
fn a_tree_alternating_kinds_costs_one_preparation_per_start_not_a_pool_each() {
    if skip("warm pool") {
        return;
    }
    let c = TestController::start(&base_contract(""), &["--warm-pool", "4"]);
    // Prepared sandboxes are numbered as they are made: the highest number seen is how
    // many were made.
    let made = || {
        c.prepared_cgroups()
            .iter()
            .filter_map(|p| {
                let name = p.file_name()?.to_string_lossy().to_string();
                name.strip_prefix("hatchery-_warm")?
                    .split('-')
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
            .max()
            .unwrap_or(0)
    };
    spawned(&c, &["--memory", "64M"], "true");
    c.wait_prepared(4, Duration::from_secs(30));
    assert_eq!(made(), 4);
    for round in 0..6 {
        let memory = if round % 2 == 0 { "128M" } else { "64M" };
        spawned(&c, &["--memory", memory], "true");
        // Give the launcher time to prepare all it would.
        std::thread::sleep(Duration::from_millis(700));
    }
    // Each start allows one preparation: 4 for the first fill and one per start since.
    // Without that bound each change of kind would prepare a whole pool (4 + 6 * 4).
    assert!(made() <= 4 + 6, "{} sandboxes prepared", made());
    assert!(made() > 4, "the pool still follows the kind of the workers");
}

#[test]
fn a_group_membership_the_host_revoked_is_gone_for_a_prepared_worker_too() {
    if skip("warm pool") {
        return;
    }
    let dir = shared_tempdir();
    let d = canonical(dir.path());
    // This test's own user database, in the controller's mount namespace: user 4321 is a
    // member of group 4242.
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    let (passwd, group) = (d.join("passwd"), d.join("group"));
    let users = read("/etc/passwd");
    let groups = read("/etc/group");
    let write = |p: &PathBuf, s: String| std::fs::write(p, s).unwrap_or_else(|e| panic!("{e}"));
    write(
        &passwd,
        format!("{users}hatchery-owner:x:4321:4321::/nonexistent:/usr/sbin/nologin\n"),
    );
    write(
        &group,
        format!("{groups}hatchery-team:x:4242:hatchery-owner\n"),
    );
    let data = d.join("data");
    std::fs::create_dir(&data).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::chown(&data, Some(4321), Some(4242)).unwrap_or_else(|e| panic!("{e}"));
    let c = user_db::controller_with_binds(
        &[(&passwd, "/etc/passwd"), (&group, "/etc/group")],
        &base_contract(""),
        &["--warm-pool", "1"],
    );
    let rw = data.display().to_string();
    let made_by = |name: &str| -> (String, u32) {
        let id = spawned(&c, &["--rw", &rw], &format!("touch {rw}/{name}"));
        let file = data.join(name);
        let until = Instant::now() + Duration::from_secs(20);
        while !file.exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let gid = std::os::unix::fs::MetadataExt::gid(
            &std::fs::metadata(&file).unwrap_or_else(|e| panic!("{name}: {e}")),
        );
        (id, gid)
    };
    let (_, gid) = made_by("while-a-member");
    assert_eq!(
        gid, 4242,
        "the owner's group is the sandbox's while the owner is in it"
    );
    c.wait_prepared(1, Duration::from_secs(20));
    // The host takes the owner out of the group (rewritten in place: the bind holds it).
    write(&group, format!("{groups}hatchery-team:x:4242:\n"));
    let (id, gid) = made_by("after-leaving");
    assert_ne!(
        gid,
        4242,
        "prepared_ahead={}: a worker kept a group its directory's owner had left",
        c.started_details(&id)["prepared_ahead"]
    );
}
