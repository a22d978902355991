//! A harness that drives the controller's engine with hostile input, for fuzzing (the
//! `engine_messages` target in `fuzz/`) and for the property test below, which runs in
//! every `cargo test`.
//!
//! Why the engine and not only the decoders: a worker's bytes that decode fine can still
//! reach a slice, a truncation or an arithmetic step in the engine (a report cut inside a
//! UTF-8 character once aborted the controller). The harness runs a real engine — its own
//! state directory, audit trail and signing key, a launcher socket it reads and discards —
//! and feeds it a sequence of operations decoded from the input: worker frames parsed as
//! the server parses them, registrations with real and tampered manifests, launcher
//! events, API requests, ticks. Nothing it feeds may panic the engine.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc;

use tokio::sync::oneshot;

use crate::audit::{AuditKey, AuditLog};
use crate::contract::ReplicationContract;
use crate::manifest::{SpawnRequest, WorkerId};
use crate::signing::{Keyring, ManifestSigner};

use super::admission::InMemoryStore;
use super::engine::{Engine, EngineConfig, HostEffects};
use super::input::Input;
use super::launcher::LauncherEvent;
use super::link::{Inbox, Outbox};
use super::protocol::{self, ApiRequest, ApiResponse, RegisterMsg, WorkerMessage};
use super::wire;

/// The contract the harness runs under: small enough to reach every limit quickly.
const CONTRACT: &str = "max_depth = 3\nmax_replicas = 12\ncooldown_seconds = 0\nexpiration_seconds = 3600\n\n[approval]\nmax_pending = 6\nrequire = [{ kind = \"depth_at_least\", depth = 2 }]\n";

/// Largest chunk of the input one operation takes.
const MAX_CHUNK: usize = 4096;

/// An engine, its launcher's end, and the workers it has issued.
pub struct EngineHarness {
    engine: Engine,
    rt: tokio::runtime::Runtime,
    launcher: Inbox,
    /// What the engine posts to itself (timers); drained, never delivered.
    _inputs: mpsc::Receiver<Input>,
    workers: Vec<WorkerId>,
}

impl EngineHarness {
    /// An engine keeping its state in `state` (an empty directory the caller owns), with
    /// two root workers issued.
    pub fn new(state: &Path) -> Result<EngineHarness, String> {
        let keyring = Keyring::generate().map_err(|e| e.to_string())?;
        let audit =
            AuditLog::open(state, AuditKey::new(b"fuzz audit key")).map_err(|e| e.to_string())?;
        let contract =
            ReplicationContract::from_toml(CONTRACT, "fuzz").map_err(|e| e.to_string())?;
        let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::channel();
        let (done, _) = oneshot::channel();
        let cfg = EngineConfig {
            state_dir: state.to_path_buf(),
            workers: None,
            session: "fuzz".into(),
            heartbeat_timeout: std::time::Duration::from_secs(30),
            register_timeout: std::time::Duration::from_secs(30),
            heartbeat_interval: std::time::Duration::from_secs(5),
            allow_degraded: false,
            agent_binary: None,
            cgroup_owner: "fuzz".into(),
            distinct_ids: 1,
            worker_output_cap: 1 << 20,
            own_files: Default::default(),
        };
        let engine = Engine::new(
            cfg,
            contract,
            ManifestSigner::new(keyring),
            Box::new(audit),
            Box::new(InMemoryStore::default()),
            Box::new(HostEffects::new(
                Outbox::new(ours).map_err(|e| e.to_string())?,
                // No launcher process: nothing to kill (pid 0 would be this process group).
                nix::unistd::Pid::from_raw(i32::MAX),
                rt.handle().clone(),
                tx,
            )),
            done,
        );
        let mut h = EngineHarness {
            engine,
            rt,
            launcher: Inbox::new(theirs).map_err(|e| e.to_string())?,
            _inputs: rx,
            workers: Vec::new(),
        };
        for _ in 0..2 {
            h.spawn_root()?;
        }
        Ok(h)
    }

    fn spawn_root(&mut self) -> Result<(), String> {
        let request = SpawnRequest::from_json(
            br#"{"resources":{"cpu_limit":0.5,"memory_limit_mb":128,"pids_limit":32,"timeout_ms":60000,"network_policy":{"allow_controller":true,"allow_external":false}},"filesystem":{"read_only":[],"read_write":[]},"profile":"default","command":["true"],"env":[],"cwd":null,"state_snapshot":""}"#,
        )
        .map_err(|e| e.to_string())?;
        let (reply, mut rx) = oneshot::channel();
        self.input(Input::Api {
            peer_uid: 0,
            request: Box::new(ApiRequest::Spawn {
                parent: None,
                request: Box::new(request),
            }),
            reply,
        });
        match rx.try_recv() {
            Ok(ApiResponse::Spawned { worker_id, .. }) => {
                self.workers.push(worker_id);
                Ok(())
            }
            other => Err(format!("the harness could not spawn: {other:?}")),
        }
    }

    /// Feeds one input as the controller would, then lets the runtime and the
    /// launcher's end move (replies written, requests read and discarded).
    fn input(&mut self, input: Input) {
        if self.engine.finished.is_none() {
            return;
        }
        self.engine.handle(input);
        self.rt.block_on(tokio::task::yield_now());
        // Launch requests carry the workers' sockets: dropping them here is a worker
        // that went away at once.
        drop(self.launcher.read());
    }

    /// Runs the operations `data` encodes. Never panics unless the engine does.
    pub fn feed(&mut self, data: &[u8]) {
        let mut rest = data;
        while let Some((&op, tail)) = rest.split_first() {
            let (&who, tail) = tail.split_first().unwrap_or((&0, &[]));
            let len = tail
                .get(..2)
                .and_then(|b| <[u8; 2]>::try_from(b).ok())
                .map_or(0, |b| usize::from(u16::from_be_bytes(b)))
                .min(MAX_CHUNK);
            let tail = tail.get(2..).unwrap_or_default();
            let (chunk, next) = tail.split_at(len.min(tail.len()));
            rest = next;
            self.op(op, usize::from(who), chunk);
        }
    }

    fn worker(&self, who: usize) -> Option<WorkerId> {
        let n = self.workers.len();
        who.checked_rem(n)
            .and_then(|i| self.workers.get(i))
            .cloned()
    }

    fn op(&mut self, op: u8, who: usize, chunk: &[u8]) {
        let Some(id) = self.worker(who) else {
            return;
        };
        match op % 8 {
            // A frame from a worker, parsed as the server parses it.
            0 => {
                let input = match wire::parse::<WorkerMessage>(chunk) {
                    Ok(message) => Input::Worker {
                        id: id.clone(),
                        message,
                        in_flight: None,
                    },
                    Err(e) => Input::WorkerProtocolError {
                        id: id.clone(),
                        error: e.to_string(),
                        call: protocol::call_of(chunk),
                        in_flight: None,
                    },
                };
                self.input(input);
            }
            // Registration with the worker's own manifest, or another worker's.
            1 | 2 => {
                let owner = if op % 8 == 1 {
                    id.clone()
                } else {
                    self.worker(who.wrapping_add(1))
                        .unwrap_or_else(|| id.clone())
                };
                if let Some(manifest) = self.engine.issued_manifest(&owner) {
                    self.input(Input::Worker {
                        id,
                        message: WorkerMessage::Register(Box::new(RegisterMsg {
                            manifest,
                            call: None,
                        })),
                        in_flight: None,
                    });
                }
            }
            // A launcher event. Its pid is never trusted for a handle here: the harness
            // must not signal processes of the machine it runs on.
            3 => {
                if let Ok(mut ev) = wire::parse::<LauncherEvent>(chunk) {
                    if let LauncherEvent::Started { start_time, .. } = &mut ev {
                        *start_time = None;
                    }
                    self.input(Input::Launcher(ev));
                }
            }
            4 => self.input(Input::Tick),
            // An API request from root.
            5 => {
                if let Ok(request) = wire::parse::<ApiRequest>(chunk) {
                    let (reply, _rx) = oneshot::channel();
                    self.input(Input::Api {
                        peer_uid: 0,
                        request: Box::new(request),
                        reply,
                    });
                }
            }
            // A worker's text as a report, whatever its bytes (cut anywhere).
            6 => {
                let text = String::from_utf8_lossy(chunk).into_owned();
                let message = serde_json::json!({ "type": "report", "result": text });
                if let Ok(message) = serde_json::from_value::<WorkerMessage>(message) {
                    self.input(Input::Worker {
                        id,
                        message,
                        in_flight: None,
                    });
                }
            }
            _ => {
                if chunk.first().is_some_and(|b| b % 2 == 0) {
                    self.input(Input::WorkerDisconnected { id });
                } else if self.workers.len() < 8 {
                    let _ = self.spawn_root();
                }
            }
        }
        // Children the engine issued become workers the next operations can speak for.
        for id in self.engine.worker_ids() {
            if !self.workers.contains(&id) && self.workers.len() < 16 {
                self.workers.push(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Frames a worker could send: the templates the fuzzer starts from, each then cut,
    /// padded or garbled by the strategy.
    const TEMPLATES: &[&str] = &[
        r#"{"type":"heartbeat"}"#,
        r#"{"type":"heartbeat","worker_id":"w-000000000000"}"#,
        r#"{"type":"report","result":"€€€€"}"#,
        r#"{"type":"replicate","reason":"r","command":["true"]}"#,
        r#"{"type":"replicate","reason":"r","command":["true"],"resources":{"cpu_limit":0.1,"memory_limit_mb":32,"pids_limit":8,"timeout_ms":1000,"network_policy":{"allow_controller":true,"allow_external":true}}}"#,
        r#"{"type":"shutdown"}"#,
        r#"{"event":"exited","worker_id":"w-000000000000","exit_code":0,"signal":null,"oom_killed":false,"timed_out":false,"wall_ms":1,"usage":{},"error":null}"#,
        r#"{"op":"kill_switch","release":false}"#,
        r#"{"op":"kill_switch","release":true}"#,
        r#"{"op":"ps"}"#,
        r#"{"op":"approvals"}"#,
        "€",
        "aé😀",
    ];

    fn frame(op: u8, who: u8, body: &[u8]) -> Vec<u8> {
        let len = u16::try_from(body.len()).unwrap_or(u16::MAX);
        let mut v = vec![op, who];
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    fn op_strategy() -> impl Strategy<Value = Vec<u8>> {
        (
            0u8..8,
            any::<u8>(),
            0..TEMPLATES.len(),
            prop::collection::vec(any::<u8>(), 0..64),
            any::<bool>(),
            prop_oneof![2 => Just(1usize), 1 => 2usize..2000],
        )
            .prop_map(|(op, who, t, noise, garble, repeat)| {
                // Sometimes long: limits and cuts are where the engine shortens things.
                let mut body = TEMPLATES
                    .get(t)
                    .map_or(b"".to_vec(), |s| s.as_bytes().to_vec())
                    .repeat(repeat);
                if garble {
                    let at = usize::from(who).checked_rem(body.len()).unwrap_or(0);
                    body.truncate(at);
                    body.extend_from_slice(&noise);
                }
                frame(op, who, &body)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn no_sequence_of_worker_launcher_or_api_input_panics_the_engine(
            ops in prop::collection::vec(op_strategy(), 1..40),
            registered in any::<bool>(),
        ) {
            let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut h = EngineHarness::new(dir.path()).map_err(TestCaseError::fail)?;
            if registered {
                // Most of what a worker may say is only heard once it has registered.
                h.feed(&[frame(1, 0, b""), frame(1, 1, b"")].concat());
            }
            h.feed(&ops.concat());
            drop(h);
            // And its trail still verifies.
            let audit = AuditLog::open(dir.path(), AuditKey::new(b"fuzz audit key"));
            prop_assert!(audit.is_ok(), "{:?}", audit.err());
        }
    }

    #[test]
    fn the_harness_reaches_registration_replication_and_the_kill_switch() -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut h = EngineHarness::new(dir.path())?;
        let mut ops = frame(1, 0, b"");
        ops.extend(frame(
            0,
            0,
            TEMPLATES.get(3).map_or(&b""[..], |t| t.as_bytes()),
        ));
        ops.extend(frame(6, 0, "€".repeat(400).as_bytes()));
        ops.extend(frame(
            5,
            0,
            TEMPLATES.get(7).map_or(&b""[..], |t| t.as_bytes()),
        ));
        h.feed(&ops);
        let trail = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap_or_default();
        for event in [
            "worker_registered",
            "replication_requested",
            "worker_report",
            "kill_switch_engaged",
        ] {
            assert!(trail.contains(event), "no {event} in {trail}");
        }
        Ok(())
    }
}
