//! Spawn request decoding and the contract's decision on arbitrary requests: never a
//! panic, and an allowed request is never wider than its parent.
#![no_main]

use hatchery::contract::{Decision, RegistrySnapshot, ReplicationContract};
use hatchery::manifest::{Manifest, SpawnRequest};
use libfuzzer_sys::fuzz_target;

const PARENT: &str = r#"{
  "key_id": "k-fuzz", "worker_id": "w-parent", "parent_id": null, "depth": 0,
  "issued_at": 1700000000, "expires_at": 1700003600,
  "nonce": "000102030405060708090a0b0c0d0e0f", "state_snapshot": "",
  "resources": { "cpu_limit": 1.0, "memory_limit_mb": 512, "pids_limit": 128,
    "timeout_ms": 600000,
    "network_policy": { "allow_controller": true, "allow_external": false,
      "allow_hosts": ["*.example.com:443", "10.0.0.0/8:8080"], "max_egress_bytes": 1048576 } },
  "filesystem": { "read_only": ["/srv/data"], "read_write": ["/srv/work"] },
  "profile": "default", "command": ["agent"], "env": [], "cwd": null
}"#;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = SpawnRequest::from_json(data) else {
        return;
    };
    let parent = match Manifest::from_json(PARENT.as_bytes()) {
        Ok(p) => p,
        Err(e) => panic!("fixture: {e}"),
    };
    let contract = ReplicationContract::default();
    let registry = RegistrySnapshot::default();
    if contract.can_spawn(&parent, &request, &registry, 1_700_000_100) == Decision::Allow {
        let (c, p) = (&request.resources, &parent.resources);
        assert!(c.cpu_limit <= p.cpu_limit && c.memory_limit_mb <= p.memory_limit_mb);
        assert!(c.pids_limit <= p.pids_limit && c.timeout_ms <= p.timeout_ms);
        assert!(!c.network_policy.allow_external);
        let (cn, pn) = (&c.network_policy, &p.network_policy);
        assert!(pn.allow_hosts.covers(&cn.allow_hosts).is_ok());
        assert!(
            cn.allow_hosts.is_empty()
                || cn.max_egress_bytes.is_some_and(|b| Some(b) <= pn.max_egress_bytes)
        );
        assert!(request.filesystem.read_write.iter().all(|x| {
            x.as_str() == "/srv/work" || x.as_str().starts_with("/srv/work/")
        }));
        assert_eq!(request.profile, parent.profile);
    }
});
