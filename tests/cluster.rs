//! Many controllers, one contract: controllers sharing an etcd the test starts on
//! loopback (tests/common/etcd.rs). Admission is exact across nodes at every revision
//! and instant, a frozen node's workers die before its slots are reused, etcd being down
//! refuses everywhere, the leader's loss is survived, and the kill switch and kills reach
//! every node.
#![cfg(feature = "cluster")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::controller::{TestController, worker_cgroups};
use common::etcd::{Etcd, EtcdCluster, node, refused_controller, serial};
use common::{code, process_exists, skip_unless_root, stderr, stdout, wait_process};
use serde_json::Value;

const PREFIX: &str = "/hatchery/workers/";

/// Every PUT and DELETE under `workers/` since the first revision, in order: (deleted,
/// key, value).
fn worker_history(
    etcdctl: impl Fn(&[&str]) -> std::process::Output,
) -> Vec<(bool, String, String)> {
    // A watch from revision 1 replays the history, then waits: cut it off.
    let out = etcdctl(&["watch", "--prefix", PREFIX, "--rev=1"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    let mut events = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        match lines[i] {
            "PUT" | "DELETE" => {
                let deleted = lines[i] == "DELETE";
                let key = lines.get(i + 1).unwrap_or(&"").to_string();
                let value = lines.get(i + 2).unwrap_or(&"").to_string();
                events.push((deleted, key, value));
                i += if deleted { 2 } else { 3 };
            }
            _ => i += 1,
        }
    }
    events
}

fn watch_replay(endpoints: &str) -> impl Fn(&[&str]) -> std::process::Output + '_ {
    move |args: &[&str]| {
        // The watch never ends by itself: what it printed in 3 s is the history.
        let child = std::process::Command::new("timeout")
            .args(["-s", "KILL", "3", "etcdctl"])
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(endpoints)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn();
        match child.and_then(|c| c.wait_with_output()) {
            Ok(o) => o,
            Err(e) => panic!("etcdctl watch: {e}"),
        }
    }
}

/// The most worker keys alive at once over `events`.
fn most_at_once(events: &[(bool, String, String)]) -> usize {
    let mut live = BTreeSet::new();
    let mut most = 0;
    for (deleted, key, _) in events {
        if *deleted {
            live.remove(key);
        } else {
            live.insert(key.clone());
        }
        most = most.max(live.len());
    }
    most
}

#[test]
fn three_controllers_under_spawn_storms_never_hold_more_than_max_replicas_together() {
    if skip_unless_root(
        "three_controllers_under_spawn_storms_never_hold_more_than_max_replicas_together",
    ) {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let contract = "max_replicas = 8\nmax_depth = 3\ncooldown_seconds = 2\n";
    let nodes: Vec<TestController> = ["a", "b", "c"]
        .iter()
        .map(|n| node(&etcd.url(), &format!("storm-{n}"), contract, &[]))
        .collect();
    // One long-lived lineage per node (a root and its child), whose children and
    // grandchildren come in the storm too: three generations from three nodes at once.
    let lineages: Vec<(String, String)> = nodes
        .iter()
        .map(|n| {
            let root = match n.spawn(&["--no-controller"], "sleep 60") {
                Ok(id) => id,
                Err(o) => panic!("root: {}", stderr(&o)),
            };
            let mid = match n.spawn(&["--no-controller", "--parent", &root], "sleep 60") {
                Ok(id) => id,
                Err(o) => panic!("child: {}", stderr(&o)),
            };
            (root, mid)
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let most_cgroups = Arc::new(AtomicUsize::new(0));
    let checker = {
        let stop = stop.clone();
        let most = most_cgroups.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // One worker has a directory in each v1 hierarchy: count names.
                let n = worker_cgroups("w-")
                    .iter()
                    .filter_map(|p| p.file_name().map(|n| n.to_os_string()))
                    .collect::<BTreeSet<_>>()
                    .len();
                most.fetch_max(n, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let admitted = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for (n, (root, mid)) in nodes.iter().zip(&lineages) {
            let admitted = &admitted;
            // Roots, children and grandchildren, from this node, all at once.
            s.spawn(move || {
                let start = Instant::now();
                let mut i = 0u32;
                while start.elapsed() < Duration::from_secs(5) {
                    i += 1;
                    let flags: Vec<&str> = match i % 3 {
                        0 => vec!["--no-controller"],
                        1 => vec!["--no-controller", "--parent", root],
                        _ => vec!["--no-controller", "--parent", mid],
                    };
                    if n.spawn(&flags, "sleep 0.5").is_ok() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    stop.store(true, Ordering::Relaxed);
    let _ = checker.join();
    let events = worker_history(watch_replay(&etcd.endpoint()));
    assert!(!events.is_empty(), "no history read from etcd");
    assert!(
        most_at_once(&events) <= 8,
        "more than max_replicas worker keys at one revision: {}",
        most_at_once(&events)
    );
    assert!(
        most_cgroups.load(Ordering::Relaxed) <= 8,
        "more than max_replicas worker cgroups on the host at one instant: {}",
        most_cgroups.load(Ordering::Relaxed)
    );
    assert!(
        admitted.load(Ordering::Relaxed) >= 6,
        "the storm admitted too few to mean anything"
    );
    assert!(
        events
            .iter()
            .any(|(deleted, _, v)| !deleted && v.contains("\"depth\":2")),
        "no grandchild was admitted: the storm did not reach three generations"
    );
    // Cooldowns: no parent's children reserved closer than cooldown_seconds apart.
    let mut by_parent: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for (deleted, _, value) in &events {
        if *deleted {
            continue;
        }
        let v: Value = serde_json::from_str(value).unwrap_or(Value::Null);
        if let (Some(p), Some(t)) = (v["parent_id"].as_str(), v["reserved_at"].as_u64()) {
            by_parent.entry(p.to_string()).or_default().insert(t);
        }
    }
    for (parent, times) in &by_parent {
        let t: Vec<u64> = times.iter().copied().collect();
        for w in t.windows(2) {
            assert!(
                w[1] - w[0] >= 2,
                "{parent} started children {} s apart; the cooldown is 2 s",
                w[1] - w[0]
            );
        }
    }
}

#[test]
fn a_frozen_controllers_workers_are_dead_before_another_node_takes_their_slots() {
    if skip_unless_root(
        "a_frozen_controllers_workers_are_dead_before_another_node_takes_their_slots",
    ) {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let contract = "max_replicas = 2\ncooldown_seconds = 0\n";
    let a = node(
        &etcd.url(),
        "frozen",
        contract,
        &["--cluster-lease-ttl", "2s"],
    );
    let b = node(
        &etcd.url(),
        "other",
        contract,
        &["--cluster-lease-ttl", "2s"],
    );
    for _ in 0..2 {
        if let Err(o) = a.spawn(&["--no-controller"], "exec sleep 6101") {
            panic!("spawn on the first node: {}", stderr(&o));
        }
    }
    // `spawn` answers once the sandbox is started, maybe before its command is.
    wait_process(
        "sleep 6101",
        true,
        Duration::from_secs(10),
        "the workers never ran",
    );
    let refused = b.cli(&["spawn", "--no-controller", "--", "sleep", "6102"]);
    assert_eq!(
        code(&refused),
        3,
        "the quota holds across nodes: {}",
        stderr(&refused)
    );
    let pid = nix::unistd::Pid::from_raw(a.pid() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP);
    let start = Instant::now();
    let admitted = loop {
        let out = b.cli(&["spawn", "--no-controller", "--", "sleep", "6102"]);
        if out.status.success() {
            break out;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the other node never took the frozen node's slots: {}",
            stderr(&out)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // The moment the slot was taken, the frozen node's workers were gone.
    let alive = process_exists("sleep 6101");
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    assert!(
        !alive,
        "a frozen node's worker still ran when another node took its slot ({})",
        stdout(&admitted)
    );
    // Thawed, the node notices, records the fence and joins again.
    a.wait_audit("cluster_fenced", Duration::from_secs(15));
    a.wait_audit("cluster_rejoined", Duration::from_secs(15));
}

#[test]
fn with_etcd_down_every_node_refuses_new_workers_and_admits_again_once_it_is_back() {
    if skip_unless_root(
        "with_etcd_down_every_node_refuses_new_workers_and_admits_again_once_it_is_back",
    ) {
        return;
    }
    let _serial = serial();
    let mut etcd = Etcd::start();
    let contract = "max_replicas = 10\ncooldown_seconds = 0\n";
    let a = node(
        &etcd.url(),
        "down-a",
        contract,
        &["--cluster-lease-ttl", "30s"],
    );
    let b = node(
        &etcd.url(),
        "down-b",
        contract,
        &["--cluster-lease-ttl", "30s"],
    );
    if let Err(o) = a.spawn(&["--no-controller"], "true") {
        panic!("{}", stderr(&o));
    }
    etcd.stop();
    for n in [&a, &b] {
        let out = n.cli(&["spawn", "--no-controller", "--", "true"]);
        assert_eq!(code(&out), 3, "{}", stderr(&out));
        assert!(
            stderr(&out).contains("deny_cluster_unavailable"),
            "{}",
            stderr(&out)
        );
    }
    assert!(!a.audit("deny_cluster_unavailable").is_empty());
    etcd.restart();
    for n in [&a, &b] {
        let start = Instant::now();
        loop {
            let out = n.cli(&["spawn", "--no-controller", "--", "true"]);
            if out.status.success() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no admission after etcd came back: {}",
                stderr(&out)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn admission_goes_on_when_the_etcd_leader_is_killed() {
    if skip_unless_root("admission_goes_on_when_the_etcd_leader_is_killed") {
        return;
    }
    let _serial = serial();
    let mut cluster = EtcdCluster::start(3);
    let contract = "max_replicas = 10\ncooldown_seconds = 0\n";
    let a = node(
        &cluster.url(),
        "leaderless",
        contract,
        &["--cluster-lease-ttl", "10s"],
    );
    if let Err(o) = a.spawn(&["--no-controller"], "true") {
        panic!("{}", stderr(&o));
    }
    let leader = cluster.leader();
    cluster.kill(leader);
    let start = Instant::now();
    loop {
        let out = a.cli(&["spawn", "--no-controller", "--", "true"]);
        if out.status.success() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no admission after the leader was killed: {}",
            stderr(&out)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // And the contract still counts through the new leader.
    let listed = cluster.etcdctl(&["get", "--prefix", PREFIX, "--keys-only"]);
    assert!(listed.contains("w-") || listed.trim().is_empty());
}

#[test]
fn the_cluster_kill_switch_stops_every_worker_on_every_node_and_is_acknowledged() {
    if skip_unless_root(
        "the_cluster_kill_switch_stops_every_worker_on_every_node_and_is_acknowledged",
    ) {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let contract = "max_replicas = 40\ncooldown_seconds = 0\n";
    let nodes: Vec<TestController> = ["a", "b", "c"]
        .iter()
        .map(|n| node(&etcd.url(), &format!("ks-{n}"), contract, &[]))
        .collect();
    for n in &nodes {
        for _ in 0..5 {
            if let Err(o) = n.spawn(&["--no-controller"], "exec sleep 6201") {
                panic!("{}", stderr(&o));
            }
        }
    }
    let out = nodes[1].cli(&["kill-switch", "--cluster", "--json"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(v["killed"], 15, "{v}");
    assert_eq!(v["nodes"].as_array().map(Vec::len), Some(3), "{v}");
    assert!(v["missing"].as_array().is_some_and(Vec::is_empty), "{v}");
    assert!(
        !process_exists("sleep 6201"),
        "a worker outlived the cluster kill switch"
    );
    assert!(
        worker_cgroups("w-").is_empty(),
        "a worker cgroup outlived it"
    );
    for n in &nodes {
        let refused = n.cli(&["spawn", "--no-controller", "--", "true"]);
        assert_eq!(code(&refused), 3, "{}", stderr(&refused));
        assert!(stderr(&refused).contains("kill"), "{}", stderr(&refused));
        n.wait_audit("kill_switch_engaged", Duration::from_secs(5));
    }
    let out = nodes[2].cli(&["kill-switch", "--cluster", "--release"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let start = Instant::now();
    while nodes[0].spawn(&["--no-controller"], "true").is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "never released");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn ps_cluster_shows_every_nodes_lineage_and_kill_reaches_a_worker_on_another_node() {
    if skip_unless_root(
        "ps_cluster_shows_every_nodes_lineage_and_kill_reaches_a_worker_on_another_node",
    ) {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let contract = "max_replicas = 10\ncooldown_seconds = 0\n";
    let a = node(&etcd.url(), "lin-a", contract, &[]);
    let b = node(&etcd.url(), "lin-b", contract, &[]);
    let root = match a.spawn(&["--no-controller"], "exec sleep 6301") {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    let child = match a.spawn(&["--no-controller", "--parent", &root], "exec sleep 6302") {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    let out = b.cli(&["ps", "--cluster", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let workers = v["workers"].as_array().cloned().unwrap_or_default();
    let of = |id: &str| workers.iter().find(|w| w["worker_id"] == id).cloned();
    assert_eq!(
        of(&root).map(|w| w["node"].clone()),
        Some("lin-a".into()),
        "{v}"
    );
    assert_eq!(
        of(&child).map(|w| w["parent_id"].clone()),
        Some(root.clone().into()),
        "{v}"
    );
    let tree = b.cli(&["ps", "--cluster", "--tree"]);
    assert!(
        stdout(&tree).contains(&format!("└─ {child}")),
        "{}",
        stdout(&tree)
    );
    // Killed from the other node, with its descendants.
    let out = b.cli(&["kill", "--recursive", &root]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(
        !process_exists("sleep 630[12]"),
        "a worker outlived a kill from another node"
    );
    let listed = etcd.etcdctl(&["get", "--prefix", PREFIX, "--keys-only"]);
    assert!(
        !listed.contains(&root) && !listed.contains(&child),
        "{listed}"
    );
}

/// The head the cluster holds for `node`, as etcd has it.
fn anchored_seq(etcd: &Etcd, node: &str) -> u64 {
    let got = etcd.etcdctl(&[
        "get",
        "--prefix",
        &format!("/hatchery/audit/{node}/"),
        "--print-value-only",
    ]);
    got.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["seq"].as_u64())
        .max()
        .unwrap_or(0)
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let out = common::run_with_timeout(
        std::process::Command::new("cp").arg("-a").arg(from).arg(to),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "cp: {}", stderr(&out));
}

#[test]
fn audit_verify_cluster_catches_a_trail_rolled_back_to_an_older_consistent_copy() {
    if skip_unless_root(
        "audit_verify_cluster_catches_a_trail_rolled_back_to_an_older_consistent_copy",
    ) {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let mut a = node(&etcd.url(), "anchored", "max_replicas = 10\n", &[]);
    let wait_anchor = |above: u64| {
        let start = Instant::now();
        loop {
            let seq = anchored_seq(&etcd, "anchored");
            if seq > above {
                return seq;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "no anchor above {above}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let first = wait_anchor(0);
    a.stop();
    let old = a.dir.path().join("state-old");
    copy_dir(a.state_dir(), &old);
    a.restart();
    for _ in 0..3 {
        if let Err(o) = a.spawn(&["--no-controller"], "true") {
            panic!("{}", stderr(&o));
        }
    }
    wait_anchor(first + 3);
    a.stop();
    let verify = |dir: &std::path::Path, cluster: bool| {
        let mut args = vec!["audit", "verify", "--state-dir"];
        let d = dir.to_string_lossy().to_string();
        args.push(&d);
        let url = etcd.url();
        if cluster {
            args.extend(["--cluster", &url, "--node-id", "anchored"]);
        }
        common::hatchery_cmd(&args)
    };
    let state = a.state_dir().to_path_buf();
    let now = verify(&state, true);
    assert_eq!(
        code(&now),
        0,
        "the real trail holds the anchored head: {}{}",
        stdout(&now),
        stderr(&now)
    );
    let real = std::fs::read_to_string(state.join("audit.jsonl")).unwrap_or_default();
    // Roll the whole state directory back to the older copy: consistent in itself.
    let _ = std::fs::remove_dir_all(&state);
    copy_dir(&old, &state);
    let plain = verify(&state, false);
    assert_eq!(
        code(&plain),
        0,
        "locally the older copy is intact: {}",
        stderr(&plain)
    );
    let checked = verify(&state, true);
    verify_fails(&checked, "it was cut");
    // The anchored entry itself, appended without its newline, is a partial line the chain
    // never verified: no stand-in for the anchored head.
    let anchored = anchored_seq(&etcd, "anchored");
    let line = real
        .lines()
        .find(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .is_ok_and(|v| v["seq"].as_u64() == Some(anchored))
        })
        .unwrap_or_else(|| panic!("no entry {anchored} in the real trail"));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(state.join("audit.jsonl"))
        .unwrap_or_else(|e| panic!("{e}"));
    std::io::Write::write_all(&mut f, line.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    verify_fails(&verify(&state, true), "it was cut");
    // A controller of the node refuses to start on it: it would have anchored the older
    // trail's head over the one that shows the cut. It refuses before it writes anything:
    // the trail (partial line and all) and the state directory stay as it found them.
    let found = std::fs::read(state.join("audit.jsonl")).unwrap_or_default();
    let files_found = files(&state);
    let url = etcd.url();
    let out = a.refused_start(
        &["--cluster", &url, "--node-id", "anchored"],
        Duration::from_secs(30),
    );
    assert_ne!(
        code(&out),
        0,
        "a controller started on the rolled-back trail"
    );
    assert!(stderr(&out).contains("it was cut"), "{}", stderr(&out));
    assert!(
        std::fs::read(state.join("audit.jsonl")).unwrap_or_default() == found,
        "the refused start wrote to the trail it refused"
    );
    assert_eq!(files(&state), files_found, "the refused start left files");
    assert_eq!(
        anchored_seq(&etcd, "anchored"),
        anchored,
        "the refused start moved the anchored head"
    );
}

#[test]
fn a_workers_manifest_from_one_node_verifies_with_the_key_file_every_node_holds() {
    if skip_unless_root(
        "a_workers_manifest_from_one_node_verifies_with_the_key_file_every_node_holds",
    ) {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let keys = common::shared_tempdir();
    let key = keys.path().join("cluster.key");
    let key_arg = key.to_string_lossy().to_string();
    let contract = "max_replicas = 10\ncooldown_seconds = 0\n";
    let a = node(&etcd.url(), "keyed-a", contract, &["--key", &key_arg]);
    let b = node(&etcd.url(), "keyed-b", contract, &["--key", &key_arg]);
    let id = match a.spawn(&["--no-controller"], "exec sleep 6501") {
        Ok(id) => id,
        Err(o) => panic!("{}", stderr(&o)),
    };
    let out = a.cli(&["inspect", "--json", &id]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let manifest = keys.path().join("manifest.json");
    if let Err(e) = std::fs::write(&manifest, v["manifest"].to_string()) {
        panic!("{e}");
    }
    let m = manifest.to_string_lossy().to_string();
    // Signed with node a's session key; verified with nothing but the shared key file.
    let out = common::hatchery_cmd(&["manifest", "verify", "--key", &key_arg, &m]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains(&format!("valid: worker {id}")),
        "{}",
        stdout(&out)
    );
    // Another key file does not.
    let other = keys.path().join("other.key");
    let o = other.to_string_lossy().to_string();
    let made = common::hatchery_cmd(&["manifest", "keygen", "--key", &o]);
    assert_eq!(code(&made), 0, "{}", stderr(&made));
    let out = common::hatchery_cmd(&["manifest", "verify", "--key", &o, &m]);
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    drop(b);
}

#[test]
fn audit_verify_cluster_catches_a_trail_replaced_by_a_new_one_under_the_same_node_id() {
    if skip_unless_root(
        "audit_verify_cluster_catches_a_trail_replaced_by_a_new_one_under_the_same_node_id",
    ) {
        return;
    }
    let _serial = serial();
    let etcd = Etcd::start();
    let mut a = node(&etcd.url(), "replaced", "max_replicas = 10\n", &[]);
    let start = Instant::now();
    while anchored_seq(&etcd, "replaced") == 0 {
        assert!(start.elapsed() < Duration::from_secs(15), "no anchor");
        std::thread::sleep(Duration::from_millis(100));
    }
    a.stop();
    // Root on the node wipes the state directory (trail and key) and starts afresh
    // under the same node id: a trail of its own, consistent, anchored too.
    let state = a.state_dir().to_path_buf();
    let _ = std::fs::remove_dir_all(&state);
    // The cluster holds the old trail's head: the node does not start on a new trail
    // unless asked to, and says so.
    let url = etcd.url();
    let cluster = ["--cluster", url.as_str(), "--node-id", "replaced"];
    let out = a.refused_start(&cluster, Duration::from_secs(30));
    assert_ne!(code(&out), 0, "a node started a new trail unasked");
    assert!(
        stderr(&out).contains("this trail replaced it")
            && stderr(&out).contains("--new-audit-trail"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&state);
    let mut asked = cluster.to_vec();
    asked.push("--new-audit-trail");
    a.restart_with(&asked);
    let anchors = || {
        etcd.etcdctl(&[
            "get",
            "--prefix",
            "/hatchery/audit/replaced/",
            "--keys-only",
        ])
        .split_whitespace()
        .count()
    };
    let again = Instant::now();
    while anchors() < 2 {
        assert!(
            again.elapsed() < Duration::from_secs(15),
            "the new trail was not anchored"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    a.stop();
    let s = state.to_string_lossy().to_string();
    let plain = common::hatchery_cmd(&["audit", "verify", "--state-dir", &s]);
    assert_eq!(
        code(&plain),
        0,
        "locally the new trail is intact: {}",
        stderr(&plain)
    );
    let url = etcd.url();
    let checked = common::hatchery_cmd(&[
        "audit",
        "verify",
        "--state-dir",
        &s,
        "--cluster",
        &url,
        "--node-id",
        "replaced",
    ]);
    verify_fails(&checked, "another trail");
}

/// The names in `dir`, sorted.
fn files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `audit verify` found the trail wrong (exit 1), saying `why`.
fn verify_fails(out: &std::process::Output, why: &str) {
    let said = format!("{}{}", stdout(out), stderr(out));
    assert_eq!(code(out), 1, "{said}");
    assert!(said.contains(why), "{said}");
}

/// An etcd member that speaks only TLS and asks clients for a certificate signed by the
/// test's own CA (killed with the test).
struct TlsEtcd {
    child: Option<std::process::Child>,
    port: u16,
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(a) => a.port(),
        Err(e) => panic!("a free port: {e}"),
    }
}

/// A throw-away CA, a server certificate for 127.0.0.1 and a client certificate, in `dir`.
fn make_certs(dir: &std::path::Path) {
    let script = r#"set -e
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 -subj /CN=hatchery-test-ca 2>/dev/null
for who in server client; do
  openssl req -newkey rsa:2048 -nodes -keyout $who.key -out $who.csr -subj /CN=$who 2>/dev/null
done
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
printf 'extendedKeyUsage=clientAuth\n' > client.ext
for who in server client; do
  openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $who.pem -days 1 -extfile $who.ext 2>/dev/null
done
"#;
    let out = common::run_with_timeout(
        std::process::Command::new("sh")
            .args(["-c", script])
            .current_dir(dir),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "openssl: {}", stderr(&out));
}

fn start_tls_etcd(dir: &std::path::Path) -> TlsEtcd {
    let (port, peer) = (free_port(), free_port());
    let client = format!("https://127.0.0.1:{port}");
    let peer = format!("http://127.0.0.1:{peer}");
    let log = std::fs::File::create(dir.join("etcd.log")).ok();
    let child = std::process::Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--", "etcd", "--name", "tls"])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("tls={peer}")])
        .args(["--client-cert-auth", "--trusted-ca-file"])
        .arg(dir.join("ca.pem"))
        .arg("--cert-file")
        .arg(dir.join("server.pem"))
        .arg("--key-file")
        .arg(dir.join("server.key"))
        .args([
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
            "--log-level",
            "error",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log.map_or(std::process::Stdio::null(), std::process::Stdio::from))
        .spawn();
    let etcd = TlsEtcd {
        child: Some(child.unwrap_or_else(|e| panic!("start etcd: {e}"))),
        port,
    };
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "etcd with TLS did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    etcd
}

#[test]
fn a_controller_joins_an_etcd_that_requires_client_certificates_and_is_refused_without_one() {
    if skip_unless_root(
        "a_controller_joins_an_etcd_that_requires_client_certificates_and_is_refused_without_one",
    ) {
        return;
    }
    let _serial = serial();
    let certs = common::shared_tempdir();
    make_certs(certs.path());
    let etcd = start_tls_etcd(certs.path());
    let url = format!("etcd://127.0.0.1:{}", etcd.port);
    let file = |n: &str| certs.path().join(n).to_string_lossy().to_string();
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let contract = "max_replicas = 10\ncooldown_seconds = 0\n";
    let a = node(
        &url,
        "tls-a",
        contract,
        &[
            "--cluster-cacert",
            &ca,
            "--cluster-cert",
            &cert,
            "--cluster-key",
            &key,
        ],
    );
    if let Err(o) = a.spawn(&["--no-controller"], "true") {
        panic!("a spawn through etcd over TLS: {}", stderr(&o));
    }
    // The CA alone (no client certificate): etcd refuses, so the controller does not start.
    let out = refused_controller(
        &[
            "--cluster",
            &url,
            "--node-id",
            "tls-b",
            "--cluster-cacert",
            &ca,
        ],
        Duration::from_secs(30),
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot reach etcd"),
        "{}",
        stderr(&out)
    );
    drop(a);
}

/// A start refused on joining the cluster (here: no etcd answers) comes before the
/// socket: a crashed controller's socket, the evidence the next start records as
/// `stale_socket_removed`, and its pid file stay as they were. The refused start used to
/// remove the socket, and the next start recorded none.
#[test]
fn a_start_refused_by_the_cluster_leaves_a_crashed_controllers_socket_and_pid_file() {
    if skip_unless_root(
        "a_start_refused_by_the_cluster_leaves_a_crashed_controllers_socket_and_pid_file",
    ) {
        return;
    }
    let mut c = TestController::start("max_replicas = 10\n", &[]);
    c.crash();
    let pid_file = c.state.join("controller.pid");
    let pid = std::fs::read(&pid_file).unwrap_or_default();
    assert!(c.socket.exists() && !pid.is_empty(), "a crash leaves both");
    let out = c.refused_start(
        &["--cluster", "etcd://127.0.0.1:1", "--node-id", "lone"],
        Duration::from_secs(60),
    );
    assert_ne!(code(&out), 0, "started without its cluster");
    assert!(
        c.socket.exists(),
        "the refused start removed the crashed controller's socket"
    );
    assert_eq!(std::fs::read(&pid_file).unwrap_or_default(), pid);
    c.restart();
    let recovered = c.wait_audit("crash_recovered", Duration::from_secs(20));
    assert_eq!(
        recovered
            .last()
            .map(|e| e["details"]["stale_socket_removed"].clone()),
        Some(Value::Bool(true)),
        "{recovered:?}"
    );
}

/// A node whose trail vanished, started again with `--new-audit-trail` while its cluster
/// cannot be reached: refused, and the trail that start began goes with it. It stayed
/// behind, so the same command was then refused ("holds an audit trail"), and the trail
/// began with a start that never ran.
#[test]
fn a_trail_begun_by_a_start_the_cluster_refused_is_taken_away_again() {
    if skip_unless_root("a_trail_begun_by_a_start_the_cluster_refused_is_taken_away_again") {
        return;
    }
    let mut c = TestController::start("max_replicas = 10\n", &[]);
    c.stop();
    let state = c.state_dir().to_path_buf();
    if let Err(e) = std::fs::remove_file(state.join("audit.jsonl")) {
        panic!("{e}");
    }
    let found = files(&state);
    let head = std::fs::read(state.join("audit.head")).unwrap_or_default();
    assert!(!head.is_empty(), "no head: {found:?}");
    let asked = [
        "--new-audit-trail",
        "--cluster",
        "etcd://127.0.0.1:1",
        "--node-id",
        "lone",
    ];
    let out = c.refused_start(&asked, Duration::from_secs(60));
    assert_ne!(code(&out), 0, "started without its cluster");
    assert!(
        stderr(&out).contains("cannot reach etcd"),
        "{}",
        stderr(&out)
    );
    assert_eq!(files(&state), found, "the refused start left files");
    assert_eq!(
        std::fs::read(state.join("audit.head")).unwrap_or_default(),
        head,
        "the refused start changed the head"
    );
    // The same start once the cluster is not asked for: the trail is begun, for the
    // evidence there was before.
    c.restart_with(&["--new-audit-trail"]);
    let begun = c.wait_audit("audit_trail_started", Duration::from_secs(20));
    let evidence = begun
        .first()
        .map(|e| e["details"]["evidence"].to_string())
        .unwrap_or_default();
    assert!(evidence.contains("audit.head records"), "{begun:?}");
    c.stop();

    // The first start in an empty state directory makes the key there: the key is never
    // removed (another controller may have read it the moment it existed), and the
    // trail that names it stays with it, whole: a plain start goes on with both.
    let fresh = common::shared_tempdir();
    let state = fresh.path().join("state");
    if let Err(e) = std::fs::create_dir(&state) {
        panic!("{e}");
    }
    let s = state.to_string_lossy().to_string();
    let socket = fresh.path().join("c.sock").to_string_lossy().to_string();
    let start = |extra: &[&str], limit: Duration| {
        let mut args = vec!["controller", "--socket", &socket, "--state-dir", &s];
        args.extend_from_slice(extra);
        common::run_with_timeout(
            std::process::Command::new(common::hatchery()).args(&args),
            limit,
        )
    };
    // However `--key` spells its path.
    let key = format!("{s}/../state/controller.key");
    let mut refused_first = asked[1..].to_vec();
    refused_first.extend_from_slice(&["--key", &key]);
    let out = start(&refused_first, Duration::from_secs(60));
    assert_ne!(code(&out), 0, "started without its cluster");
    let kept = files(&state);
    assert!(
        kept.contains(&"controller.key".to_string()) && kept.contains(&"audit.jsonl".to_string()),
        "{kept:?}"
    );
    let verified = common::hatchery_cmd(&["audit", "verify", "--state-dir", &s, "--key", &key]);
    assert_eq!(
        code(&verified),
        0,
        "{}{}",
        stdout(&verified),
        stderr(&verified)
    );
}
