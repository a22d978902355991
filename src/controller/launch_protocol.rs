//! What the controller and its launcher say to each other: [`LauncherRequest`]s one way (a
//! launch carries the worker's end of its socketpair as an attached descriptor),
//! [`LauncherEvent`]s the other. Its own module so that both ends — the engine's outbox
//! and the launcher's loop — depend on the protocol, not on each other.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::manifest::Manifest;

/// What the launcher needs to start one worker: already decided and verified by the
/// controller (from the worker's signed manifest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSpec {
    pub worker_id: String,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Working directory inside (default /).
    pub cwd: Option<String>,
    pub ro: Vec<PathBuf>,
    pub rw: Vec<PathBuf>,
    pub memory: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub profile: String,
    /// The file in the state directory's `workers/` where the worker's stdout and stderr
    /// go (created new, 0600, through the launcher's descriptor of that directory).
    pub log_name: String,
    /// Share the host network (a manifest with allow_external); otherwise none.
    pub share_network: bool,
    /// Inside uid/gid for the payload (distinct per worker where an id range is mapped).
    pub payload_ids: Option<(u32, u32)>,
    pub allow_degraded: bool,
    /// Host path of the hatchery binary to expose at [`super::launcher::AGENT_BIN_DIR`].
    pub agent_binary: Option<PathBuf>,
    /// The cgroup name (unique, owned by the launcher process).
    pub cgroup_name: String,
    /// The manifest's `filesystem.allow_exec` (empty: no list but the profile's).
    #[serde(default)]
    pub allow_exec: Vec<PathBuf>,
    /// The worker's log gets at most this: the manifest's `resources.max_output_bytes`, or
    /// the controller's default cap.
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    /// Egress through a broker (the manifest's `resources.network_policy.allow_hosts`);
    /// `None`: no network beyond `lo` and the controller socket.
    #[serde(default)]
    pub egress: Option<LaunchEgress>,
}

/// A worker's egress, as its manifest grants it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchEgress {
    /// The allowed hosts, canonical `HOST:PORT` entries (see [`crate::egress::AllowHost`]).
    pub allow_hosts: Vec<crate::egress::AllowHost>,
    /// Bytes the worker may move through the broker, both ways together.
    pub max_bytes: Option<u64>,
    /// Any public host besides (the manifest's `allow_external`).
    #[serde(default)]
    pub any_public: bool,
}

/// What the controller decides about a worker's start beyond its manifest.
pub struct WorkerPlacement<'a> {
    /// Inside uid/gid for the payload, where the controller hands out distinct ones.
    pub payload_ids: Option<(u32, u32)>,
    pub allow_degraded: bool,
    /// The hatchery binary, exposed to supervised workers for `hatchery agent`.
    pub agent_binary: Option<PathBuf>,
    /// The launcher's identity, part of every worker cgroup's name.
    pub cgroup_owner: &'a str,
    /// The output cap of a worker whose manifest sets none.
    pub default_output_cap: u64,
}

impl LaunchSpec {
    /// The one translation of a verified manifest into what the launcher starts: the
    /// manifest's grant (command, environment, exposures, limits, profile by name,
    /// allowlist, output cap) and nothing else, plus the controller's placement. The
    /// launcher turns this into a sandbox request (`launcher::try_launch`); no other path
    /// makes a sandbox from a manifest.
    pub fn for_worker(manifest: &Manifest, place: &WorkerPlacement<'_>) -> LaunchSpec {
        let id = manifest.worker_id.as_str();
        let supervised = manifest.resources.network_policy.allow_controller;
        let mut env: Vec<(String, String)> = manifest
            .env
            .iter()
            .filter_map(|a| crate::manifest::split_env(a))
            // The controller's own variables are the controller's: a manifest's copy would
            // come first and be the one a worker's getenv sees.
            .filter(|(k, _)| !matches!(*k, "HATCHERY_WORKER_ID" | "HATCHERY_FD"))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push(("HATCHERY_WORKER_ID".into(), id.to_string()));
        if supervised {
            env.push(("HATCHERY_FD".into(), "3".into()));
        }
        let paths = |list: &[crate::manifest::ExposedPath]| -> Vec<PathBuf> {
            list.iter().map(|p| PathBuf::from(p.as_str())).collect()
        };
        LaunchSpec {
            worker_id: id.to_string(),
            command: manifest.command.clone(),
            env,
            cwd: manifest.cwd.clone(),
            ro: paths(&manifest.filesystem.read_only),
            rw: paths(&manifest.filesystem.read_write),
            memory: Some(manifest.resources.memory_limit_mb.bytes()),
            cpus: Some(manifest.resources.cpu_limit.get()),
            pids: Some(manifest.resources.pids_limit.get()),
            timeout_ms: Some(manifest.resources.timeout_ms.get()),
            profile: manifest.profile.to_string(),
            log_name: format!("{id}.log"),
            // `allow_external` is any public host through the broker, never the host's
            // network namespace.
            share_network: false,
            payload_ids: place.payload_ids,
            allow_degraded: place.allow_degraded,
            agent_binary: if supervised {
                place.agent_binary.clone()
            } else {
                None
            },
            cgroup_name: format!("hatchery-{id}-{}", place.cgroup_owner),
            allow_exec: manifest
                .filesystem
                .allow_exec
                .iter()
                .flatten()
                .map(|p| PathBuf::from(p.as_str()))
                .collect(),
            max_output_bytes: Some(
                manifest
                    .resources
                    .max_output_bytes
                    .map_or(place.default_output_cap, |b| b.get()),
            ),
            egress: LaunchEgress::of(&manifest.resources.network_policy),
        }
    }
}

impl LaunchEgress {
    /// The egress a network policy grants: `None` unless it allows some host.
    pub fn of(policy: &crate::manifest::NetworkPolicy) -> Option<LaunchEgress> {
        policy.reaches_hosts().then(|| LaunchEgress {
            allow_hosts: policy.allow_hosts.entries().to_vec(),
            max_bytes: policy.max_egress_bytes.map(|b| b.get()),
            any_public: policy.allow_external,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum LauncherRequest {
    /// Start a worker; its socket end is attached to the frame.
    Launch {
        spec: Box<LaunchSpec>,
    },
    Kill {
        worker_id: String,
    },
    KillAll,
    /// Report live usage of every running worker.
    Usage,
    /// Kill everything and exit.
    Shutdown,
    /// This node of a cluster holds its lease until `at_boottime_ms` (CLOCK_BOOTTIME): if
    /// no later deadline comes by then, kill every worker and start none — by the
    /// launcher itself, so a controller that is frozen fences its workers all the same.
    Fence {
        at_boottime_ms: u64,
    },
}

/// Live accounting of one worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LiveUsage {
    pub cpu_usec: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub pids_peak: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum LauncherEvent {
    /// The launcher is up; it removed these cgroups left by a crashed predecessor.
    Ready {
        swept: Vec<PathBuf>,
    },
    Started {
        worker_id: String,
        pid: i32,
        /// The start time of `pid` (clock ticks since boot), read while the launcher holds
        /// it unreaped: the controller's own handle on the sandbox is checked against it.
        start_time: Option<u64>,
        cgroup: Option<PathBuf>,
        enforcement: serde_json::Value,
        /// The sandbox came from the warm pool (prepared before the request).
        #[serde(default)]
        prepared_ahead: bool,
    },
    StartFailed {
        worker_id: String,
        error: String,
    },
    Exited {
        worker_id: String,
        exit_code: i32,
        signal: Option<i32>,
        oom_killed: bool,
        timed_out: bool,
        wall_ms: u64,
        usage: LiveUsage,
        error: Option<String>,
        /// Bytes of output that reached the log, when it was capped.
        #[serde(default)]
        output_bytes: Option<u64>,
        #[serde(default)]
        output_truncated: bool,
    },
    Usage {
        workers: Vec<(String, LiveUsage)>,
    },
    /// What a worker's egress broker recorded (connections, DNS answers), and how many
    /// entries it only counted.
    Egress {
        worker_id: String,
        entries: Vec<crate::broker::EgressEntry>,
        dropped: u64,
        /// Why the broker's record is lost (it died, or did not report in time).
        #[serde(default)]
        lost: Option<String>,
    },
    /// A request the launcher could not take (too large, malformed); it reads on.
    Refused {
        error: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place() -> WorkerPlacement<'static> {
        WorkerPlacement {
            payload_ids: Some((3, 3)),
            allow_degraded: false,
            agent_binary: Some(PathBuf::from("/usr/bin/hatchery")),
            cgroup_owner: "42-7",
            default_output_cap: 1 << 20,
        }
    }

    #[test]
    fn a_manifest_becomes_the_launch_it_grants_and_nothing_more() {
        let m = crate::manifest::tests::sample_manifest();
        let spec = LaunchSpec::for_worker(&m, &place());
        assert_eq!(spec.worker_id, "w-root");
        assert_eq!(spec.command, m.command);
        assert_eq!(spec.ro, vec![PathBuf::from("/srv/data")]);
        assert_eq!(spec.rw, vec![PathBuf::from("/srv/work")]);
        assert_eq!(spec.cwd.as_deref(), Some("/srv/work"));
        assert_eq!(spec.memory, Some(256 << 20));
        assert_eq!(spec.cpus, Some(0.5));
        assert_eq!(spec.pids, Some(64));
        assert_eq!(spec.timeout_ms, Some(30_000));
        assert_eq!(spec.profile, "default");
        assert!(!spec.share_network);
        assert_eq!(spec.cgroup_name, "hatchery-w-root-42-7");
        assert_eq!(spec.log_name, "w-root.log");
        // No cap in the manifest: the controller's default.
        assert_eq!(spec.max_output_bytes, Some(1 << 20));
        // The manifest's environment, then the worker's own identity.
        assert_eq!(
            spec.env.first(),
            Some(&("MODE".to_string(), "replica".to_string()))
        );
        assert!(
            spec.env
                .iter()
                .any(|(k, v)| k == "HATCHERY_WORKER_ID" && v == "w-root")
        );
    }

    #[test]
    fn a_manifest_cannot_set_the_controllers_own_variables() {
        let mut m = crate::manifest::tests::sample_manifest();
        m.env = vec![
            "HATCHERY_WORKER_ID=w-someoneelse".into(),
            "HATCHERY_FD=7".into(),
        ];
        let spec = LaunchSpec::for_worker(&m, &place());
        let ids: Vec<&str> = spec
            .env
            .iter()
            .filter(|(k, _)| k == "HATCHERY_WORKER_ID")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(ids, vec!["w-root"]);
        let fds: Vec<&str> = spec
            .env
            .iter()
            .filter(|(k, _)| k == "HATCHERY_FD")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(fds, vec!["3"]);
    }

    #[test]
    fn the_ports_a_manifest_may_not_allow_are_the_ones_the_sandbox_keeps_for_the_broker() {
        use crate::sandbox::net::{DNS_PORT, PROXY_PORT};
        assert_eq!(crate::egress::BROKER_PORTS, [DNS_PORT, PROXY_PORT]);
    }

    #[test]
    fn a_manifest_without_allowed_hosts_launches_without_egress() {
        let spec = LaunchSpec::for_worker(&crate::manifest::tests::sample_manifest(), &place());
        assert_eq!(spec.egress, None);
    }

    #[test]
    fn the_manifests_allowed_hosts_and_budget_become_the_workers_egress()
    -> Result<(), Box<dyn std::error::Error>> {
        let mut m = crate::manifest::tests::sample_manifest();
        let hosts: Vec<crate::egress::AllowHost> =
            vec!["api.example.com:443".parse()?, "10.0.0.0/8:8080".parse()?];
        m.resources.network_policy.allow_hosts = crate::egress::AllowList::new(hosts.clone())?;
        m.resources.network_policy.max_egress_bytes =
            Some(crate::manifest::EgressBytes::new(1 << 20)?);
        let spec = LaunchSpec::for_worker(&m, &place());
        assert_eq!(
            spec.egress,
            Some(LaunchEgress {
                allow_hosts: hosts.clone(),
                max_bytes: Some(1 << 20),
                any_public: false,
            })
        );
        // Never the host's network: egress goes through the broker, any public host
        // included.
        assert!(!spec.share_network);
        m.resources.network_policy.allow_external = true;
        let spec = LaunchSpec::for_worker(&m, &place());
        assert!(!spec.share_network);
        assert_eq!(
            spec.egress.map(|e| (e.allow_hosts, e.any_public)),
            Some((hosts, true))
        );
        Ok(())
    }

    #[test]
    fn an_unsupervised_worker_gets_neither_the_socket_nor_the_agent_binary() {
        let mut m = crate::manifest::tests::sample_manifest();
        m.resources.network_policy.allow_controller = false;
        let spec = LaunchSpec::for_worker(&m, &place());
        assert!(spec.agent_binary.is_none());
        assert!(!spec.env.iter().any(|(k, _)| k == "HATCHERY_FD"));
    }
}
