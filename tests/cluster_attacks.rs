//! Attacks on the cluster's guarantees: each test states what must hold and tries to
//! break it (a local kill switch, acknowledgements, exact counting, a responsive engine,
//! nothing left behind).
#![cfg(feature = "cluster")]

mod common;

use std::time::{Duration, Instant};

use common::etcd::{Etcd, node, serial};
use common::{code, process_exists, skip_unless_root, stderr, stdout, wait_process};

/// Sends SIGCONT to `pid` when dropped (a stopped process is never left behind).
struct Thaw(i32);

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::Signal::SIGCONT,
        );
    }
}

fn process_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn freeze(pid: u32) -> Thaw {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGSTOP,
    );
    Thaw(pid as i32)
}

#[test]
fn releasing_the_cluster_kill_switch_leaves_a_nodes_own_kill_switch_engaged() {
    if skip_unless_root("releasing_the_cluster_kill_switch_leaves_a_nodes_own_kill_switch_engaged")
    {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let contract = "max_replicas = 10\ncooldown_seconds = 0\n";
    let a = node(&etcd.url(), "local-ks-a", contract, &[]);
    let b = node(&etcd.url(), "local-ks-b", contract, &[]);
    // The operator of node a stops it (its own kill switch, not the cluster's).
    let out = a.cli(&["kill-switch"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Someone engages and releases the cluster's kill switch.
    let out = b.cli(&["kill-switch", "--cluster"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let out = b.cli(&["kill-switch", "--cluster", "--release"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let start = Instant::now();
    while b.spawn(&["--no-controller"], "true").is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "never released");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Give node a time to hear the release too.
    std::thread::sleep(Duration::from_secs(1));
    let out = a.cli(&["spawn", "--no-controller", "--", "true"]);
    assert_eq!(
        code(&out),
        3,
        "node a's own kill switch was lifted by the cluster's release: {}{}",
        stdout(&out),
        stderr(&out)
    );
}

#[test]
fn a_second_controller_with_a_live_node_id_is_refused_so_it_cannot_acknowledge_for_it() {
    if skip_unless_root(
        "a_second_controller_with_a_live_node_id_is_refused_so_it_cannot_acknowledge_for_it",
    ) {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let contract = "max_replicas = 10\ncooldown_seconds = 0\n";
    let ttl = ["--cluster-lease-ttl", "60s"];
    let a1 = node(&etcd.url(), "dup", contract, &ttl);
    // A second controller with the same node id would answer the kill switch for the
    // first (frozen, say) one: it is refused at start.
    let url = etcd.url();
    let out = common::etcd::refused_controller(
        &["--cluster", &url, "--node-id", "dup", ttl[0], ttl[1]],
        Duration::from_secs(20),
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("node id dup is live in the cluster already"),
        "{}",
        stderr(&out)
    );
    let nodes = etcd.etcdctl(&["get", "--prefix", "/hatchery/nodes/", "--keys-only"]);
    assert_eq!(nodes.split_whitespace().count(), 1, "{nodes}");
    drop(a1);
}

#[test]
fn a_worker_record_this_version_cannot_read_still_counts_against_max_replicas() {
    if skip_unless_root(
        "a_worker_record_this_version_cannot_read_still_counts_against_max_replicas",
    ) {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let contract = "max_replicas = 1\ncooldown_seconds = 0\n";
    let a = node(&etcd.url(), "skew-a", contract, &[]);
    // A worker admitted by a newer node, whose record has one field more.
    let record = r#"{"worker_id":"w-newer","parent_id":null,"node":"skew-new","depth":0,"memory_limit_mb":64,"cpu_limit":0.5,"issued_at":1,"reserved_at":1,"last_spawn":null,"gpus":0}"#;
    etcd.etcdctl(&["put", "/hatchery/workers/w-newer", record]);
    let out = a.cli(&["spawn", "--no-controller", "--", "sleep", "6501"]);
    let listed = etcd.etcdctl(&["get", "--prefix", "/hatchery/workers/", "--keys-only"]);
    assert_eq!(
        code(&out),
        3,
        "admitted past max_replicas = 1 beside a record it could not read: {listed}"
    );
}

#[test]
fn local_commands_are_answered_promptly_while_etcd_hangs() {
    if skip_unless_root("local_commands_are_answered_promptly_while_etcd_hangs") {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let contract = "max_replicas = 10\ncooldown_seconds = 0\n";
    let a = node(
        &etcd.url(),
        "hang-a",
        contract,
        &["--cluster-lease-ttl", "60s"],
    );
    // Joined and admitting.
    if let Err(o) = a.spawn(&["--no-controller"], "true") {
        panic!("{}", stderr(&o));
    }
    let pid = etcd.pid().unwrap_or(0);
    assert_ne!(pid, 0, "etcd is not running");
    let thaw = freeze(pid);
    // A handful of spawn requests (a worker asking for children would do the same).
    let elapsed = std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| {
                let _ = a.cli(&["spawn", "--no-controller", "--", "true"]);
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        let start = Instant::now();
        let out = a.cli(&["kill-switch"]);
        let elapsed = start.elapsed();
        assert_eq!(
            code(&out),
            0,
            "{}\ncontroller alive: {}\n{}",
            stderr(&out),
            process_alive(a.pid()),
            a.log()
        );
        elapsed
    });
    drop(thaw);
    assert!(
        elapsed < Duration::from_secs(5),
        "the local kill switch took {elapsed:?} behind spawns waiting on a hung etcd"
    );
}

#[test]
fn a_node_that_leaves_leaves_no_keys_behind() {
    if skip_unless_root("a_node_that_leaves_leaves_no_keys_behind") {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let contract = "max_replicas = 10\ncooldown_seconds = 0\n";
    let mut a = node(&etcd.url(), "leaver", contract, &[]);
    let out = a.cli(&["kill-switch", "--cluster"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = a.cli(&["kill-switch", "--cluster", "--release"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    a.stop();
    let listed = etcd.etcdctl(&["get", "--prefix", "/hatchery/acks/", "--keys-only"]);
    assert!(
        listed.trim().is_empty(),
        "a node gone for good still has keys: {listed}"
    );
}

/// `etcdctl put KEY` with the value read from stdin (values too large for an argument).
fn put_large(etcd: &Etcd, key: &str, bytes: usize) {
    use std::io::Write;
    let mut child = match std::process::Command::new("timeout")
        .args(["-s", "KILL", "20", "etcdctl"])
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(etcd.endpoint())
        .args(["put", key])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("etcdctl: {e}"),
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(&vec![b'x'; bytes]);
    }
    match child.wait_with_output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("etcdctl put {key}: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("etcdctl put {key}: {e}"),
    }
}

#[test]
fn large_foreign_values_under_control_do_not_deafen_a_node_to_the_kill_switch() {
    if skip_unless_root(
        "large_foreign_values_under_control_do_not_deafen_a_node_to_the_kill_switch",
    ) {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    // Four values just under etcd's request limit: more than 4 MiB under control/.
    for i in 0..4 {
        put_large(
            &etcd,
            &format!("/hatchery/control/kill/junk-{i}"),
            1_200_000,
        );
    }
    let contract = "max_replicas = 10\ncooldown_seconds = 0\n";
    let a = node(&etcd.url(), "deaf-a", contract, &[]);
    if let Err(o) = a.spawn(&["--no-controller"], "exec sleep 6601") {
        panic!("{}", stderr(&o));
    }
    // `spawn` answers once the sandbox is started, maybe before its command is.
    wait_process(
        "sleep 6601",
        true,
        Duration::from_secs(10),
        "the worker never ran",
    );
    etcd.etcdctl(&[
        "put",
        "/hatchery/control/kill-switch",
        r#"{"by":"operator","node":"etcdctl","at_ms":0}"#,
    ]);
    let start = Instant::now();
    while process_exists("sleep 6601") && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !process_exists("sleep 6601"),
        "a worker outlived the cluster kill switch by 10 s: the node never heard it"
    );
}

#[test]
fn large_foreign_values_under_workers_refuse_admission_by_name_until_removed() {
    if skip_unless_root("large_foreign_values_under_workers_refuse_admission_by_name_until_removed")
    {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    // Together more than one gRPC answer holds by default: read anyway, and a record
    // that is not a worker's refuses admission by name (never left out of the count),
    // until it is gone.
    for i in 0..4 {
        put_large(&etcd, &format!("/hatchery/workers/junk-{i}"), 1_200_000);
    }
    let contract = "max_replicas = 10\ncooldown_seconds = 0\n";
    let a = node(&etcd.url(), "bloat-a", contract, &[]);
    let out = a.cli(&["spawn", "--no-controller", "--", "true"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/hatchery/workers/junk-0 is unreadable"),
        "{}",
        stderr(&out)
    );
    etcd.etcdctl(&["del", "--prefix", "/hatchery/workers/junk-"]);
    let out = a.cli(&["spawn", "--no-controller", "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}
