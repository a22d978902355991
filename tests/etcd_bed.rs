//! The etcd test bed (tests/common/etcd.rs) itself: a member stores and returns data,
//! survives a stop with its data, a cluster replaces a killed leader, and nothing outlives
//! the test. The cluster tests rely on it; these show it does what they assume.
#![cfg(feature = "cluster")]

mod common;

use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::etcd::{Etcd, EtcdCluster, member_process_exists};
use common::files::json;

/// The `count` of `etcdctl get ... -w json`.
fn count(get_json: &str) -> u64 {
    json(get_json)["count"].as_u64().unwrap_or(0)
}

fn refuses_connections(endpoint: &str) -> bool {
    match endpoint.parse() {
        Ok(addr) => TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_err(),
        Err(e) => panic!("not an address: {endpoint}: {e}"),
    }
}

#[test]
fn a_single_member_stores_what_etcdctl_puts_and_leaves_nothing_when_dropped() {
    let etcd = Etcd::start();
    let endpoint = etcd.endpoint();
    assert!(
        endpoint.starts_with("127.0.0.1:"),
        "not a loopback endpoint: {endpoint}"
    );
    assert_eq!(etcd.url(), format!("etcd://{endpoint}"));

    etcd.etcdctl(&["put", "/hatchery/workers/w1", r#"{"id":"w1"}"#]);
    etcd.etcdctl(&["put", "/hatchery/other", "x"]);
    let value = etcd.etcdctl(&["get", "/hatchery/workers/w1", "--print-value-only"]);
    assert_eq!(value.trim(), r#"{"id":"w1"}"#);
    let listed = etcd.etcdctl(&["get", "--prefix", "/hatchery/workers/", "-w", "json"]);
    assert_eq!(count(&listed), 1, "one key under the prefix: {listed}");

    let (dir, pid) = (etcd.dir().to_path_buf(), etcd.pid());
    let data = etcd.data_dir().to_path_buf();
    assert!(
        data.join("member").is_dir(),
        "no data in {}",
        data.display()
    );
    assert!(
        member_process_exists(&data),
        "no process names {}",
        data.display()
    );
    drop(etcd);
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(
        !member_process_exists(&data),
        "an etcd process outlived its owner"
    );
    if let Some(pid) = pid {
        assert!(
            !Path::new("/proc").join(pid.to_string()).exists(),
            "pid {pid} outlived its owner"
        );
    }
    assert!(refuses_connections(&endpoint), "{endpoint} still answers");
}

#[test]
fn a_stopped_member_is_unreachable_and_keeps_its_data_across_a_restart() {
    let mut etcd = Etcd::start();
    let endpoint = etcd.endpoint();
    etcd.etcdctl(&["put", "/hatchery/kill", "engaged"]);

    etcd.stop();
    assert!(!etcd.is_running());
    assert!(
        refuses_connections(&endpoint),
        "{endpoint} answers after stop"
    );
    let out = etcd.etcdctl_output(&["--command-timeout", "2s", "get", "/hatchery/kill"]);
    assert!(
        !out.status.success(),
        "a get succeeded against a stopped member: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        etcd.data_dir().join("member").is_dir(),
        "stop removed the data"
    );

    etcd.restart();
    assert_eq!(etcd.endpoint(), endpoint, "restart moved the member");
    let value = etcd.etcdctl(&["get", "/hatchery/kill", "--print-value-only"]);
    assert_eq!(
        value.trim(),
        "engaged",
        "the data did not survive the restart"
    );
    etcd.etcdctl(&["put", "/hatchery/after", "restart"]);
}

#[test]
fn killing_the_leader_of_three_members_elects_a_new_one_that_accepts_writes() {
    let mut cluster = EtcdCluster::start(3);
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.split(',').count(), 3, "{endpoints}");
    assert!(
        endpoints.split(',').all(|e| e.starts_with("127.0.0.1:")),
        "{endpoints}"
    );
    assert_eq!(cluster.url(), format!("etcd://{endpoints}"));
    cluster.etcdctl(&["put", "/hatchery/before", "1"]);

    let old = cluster.leader();
    let killed_at = Instant::now();
    cluster.kill(old);
    assert!(!cluster.is_running(old));
    let new = cluster.leader();
    let election = killed_at.elapsed();
    assert_ne!(new, old, "the killed member is still the leader");
    // The election timeout is 500 ms: a new leader within seconds, not etcd's defaults.
    assert!(
        election < Duration::from_secs(10),
        "electing a new leader took {election:?}"
    );

    cluster.etcdctl(&["put", "/hatchery/after", "2"]);
    for i in (0..cluster.size()).filter(|&i| i != old) {
        let out = cluster.etcdctl_at(i, &["get", "/hatchery/after", "--print-value-only"]);
        assert!(out.status.success(), "member {i} does not answer");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2");
    }

    // The old leader comes back as a member and catches up with the write it missed.
    cluster.restart(old);
    let out = cluster.etcdctl_at(old, &["get", "/hatchery/after", "--print-value-only"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "2",
        "the restarted member did not catch up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = cluster.leader();
}
