//! The engine driven through its seams: a clock the test moves, a launcher that only
//! records what it is asked, and a trail whose sync can be made to fail. No root, no
//! sockets to a real launcher, no sandboxes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use super::*;
use crate::audit::AuditError;
use crate::controller::admission::InMemoryStore;
use crate::controller::launcher::{LauncherEvent, LiveUsage};
use crate::controller::link::LinkError;
use crate::controller::protocol::ApiRequest;
use crate::manifest::SpawnRequest;
use crate::signing::Keyring;

/// One thing the engine did to the world, in the order it did it.
#[derive(Debug, Clone, PartialEq)]
enum Did {
    Append(String),
    Sync,
    Launch(String),
    Kill(String),
    KillAll,
    Usage,
    Shutdown,
    Fence(u64),
    Wake(Duration, &'static str),
    Ack(i64),
}

#[derive(Default)]
struct World {
    did: Mutex<Vec<Did>>,
    clock_ms: AtomicU64,
    sync_fails: AtomicBool,
}

impl World {
    fn push(&self, d: Did) {
        self.did
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(d);
    }

    fn did(&self) -> Vec<Did> {
        self.did
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn advance(&self, by: Duration) {
        self.clock_ms.fetch_add(
            u64::try_from(by.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

/// The world, the clock's origin, and the launcher requests queued but not written.
struct FakeEffects(Arc<World>, Instant, Vec<Did>);

impl Effects for FakeEffects {
    fn now_ms(&self) -> u64 {
        self.0.clock_ms.load(Ordering::SeqCst)
    }

    fn instant(&self) -> Instant {
        self.1
            .checked_add(Duration::from_millis(self.now_ms()))
            .unwrap_or(self.1)
    }

    fn push_launcher(
        &mut self,
        req: &LauncherRequest,
        _fd: Option<std::os::fd::OwnedFd>,
    ) -> std::result::Result<(), LinkError> {
        // Queued, as the real outbox does: written (seen) only when flushed.
        self.2.push(match req {
            LauncherRequest::Launch { spec } => Did::Launch(spec.worker_id.clone()),
            LauncherRequest::Kill { worker_id } => Did::Kill(worker_id.clone()),
            LauncherRequest::KillAll => Did::KillAll,
            LauncherRequest::Usage => Did::Usage,
            LauncherRequest::Shutdown => Did::Shutdown,
            LauncherRequest::Fence { at_boottime_ms } => Did::Fence(*at_boottime_ms),
        });
        Ok(())
    }

    fn flush_launcher(&mut self) -> std::result::Result<(), LinkError> {
        for d in self.2.drain(..) {
            self.0.push(d);
        }
        Ok(())
    }

    fn cancel_launches(&mut self) -> Vec<String> {
        let mut cancelled = Vec::new();
        self.2.retain(|d| match d {
            Did::Launch(id) => {
                cancelled.push(id.clone());
                false
            }
            _ => true,
        });
        cancelled
    }

    fn kill_launcher(&mut self) {}

    fn attach_worker(
        &self,
        _id: WorkerId,
        _sock: std::os::unix::net::UnixStream,
    ) -> Option<tokio::sync::mpsc::Sender<WorkerFrame>> {
        None
    }

    fn wake_after(&self, delay: Duration, input: Input) {
        self.0.push(Did::Wake(delay, input.kind()));
    }
}

struct FakeTrail(Arc<World>, u64);

impl Trail for FakeTrail {
    fn append(&mut self, event: &str, _: &str, _: Option<&str>, _: serde_json::Value, _: bool) {
        self.1 = self.1.saturating_add(1);
        self.0.push(Did::Append(event.to_string()));
    }

    fn sync(&mut self) -> std::result::Result<(), AuditError> {
        if self.0.sync_fails.load(Ordering::SeqCst) {
            return Err(AuditError::Io {
                path: PathBuf::from("audit.jsonl"),
                source: std::io::Error::other("no space left"),
            });
        }
        self.0.push(Did::Sync);
        Ok(())
    }

    fn entries(&self) -> u64 {
        self.1
    }
}

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn engine(contract: &str) -> Result<(Engine, Arc<World>)> {
    let world = Arc::new(World::default());
    world.clock_ms.store(1_700_000_000_000, Ordering::SeqCst);
    let cfg = EngineConfig {
        state_dir: PathBuf::from("/nonexistent"),
        workers: None,
        session: "test".into(),
        heartbeat_timeout: Duration::from_secs(30),
        register_timeout: Duration::from_secs(10),
        heartbeat_interval: Duration::from_secs(5),
        allow_degraded: false,
        agent_binary: None,
        cgroup_owner: "test".into(),
        distinct_ids: 1,
        worker_output_cap: 1 << 20,
        own_files: Default::default(),
    };
    let (done, _) = oneshot::channel();
    let e = Engine::new(
        cfg,
        ReplicationContract::from_toml(contract, "test")?,
        ManifestSigner::new(Keyring::generate()?),
        Box::new(FakeTrail(world.clone(), 0)),
        Box::new(InMemoryStore::default()),
        Box::new(FakeEffects(world.clone(), Instant::now(), Vec::new())),
        done,
    );
    Ok((e, world))
}

const CONTRACT: &str =
    "max_depth = 3\nmax_replicas = 2\ncooldown_seconds = 0\nexpiration_seconds = 3600\n";

fn spawn_request() -> Result<SpawnRequest> {
    Ok(SpawnRequest::from_json(
        br#"{"resources":{"cpu_limit":0.5,"memory_limit_mb":128,"pids_limit":32,"timeout_ms":60000,"network_policy":{"allow_controller":true,"allow_external":false}},"filesystem":{"read_only":[],"read_write":[]},"profile":"default","command":["true"],"env":[],"cwd":null,"state_snapshot":""}"#,
    )?)
}

/// Sends one API request and returns the reply, if the engine gave one at once.
fn api(e: &mut Engine, request: ApiRequest) -> Option<ApiResponse> {
    let (reply, mut rx) = oneshot::channel();
    e.handle(Input::Api {
        peer_uid: 0,
        request: Box::new(request),
        reply,
    });
    rx.try_recv().ok()
}

fn spawn(e: &mut Engine) -> Result<Option<ApiResponse>> {
    Ok(api(
        e,
        ApiRequest::Spawn {
            parent: None,
            request: Box::new(spawn_request()?),
        },
    ))
}

fn spawned(r: Option<ApiResponse>) -> WorkerId {
    match r {
        Some(ApiResponse::Spawned { worker_id, .. }) => worker_id,
        other => panic!("not spawned: {other:?}"),
    }
}

fn exited(e: &mut Engine, id: &WorkerId) {
    e.handle(Input::Launcher(LauncherEvent::Exited {
        worker_id: id.to_string(),
        exit_code: 0,
        signal: None,
        oom_killed: false,
        timed_out: false,
        wall_ms: 1,
        usage: LiveUsage::default(),
        error: None,
        output_bytes: None,
        output_truncated: false,
    }));
}

#[test]
fn a_spawn_is_durable_in_the_trail_before_the_launcher_is_asked() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    let id = spawned(spawn(&mut e)?);
    let did = world.did();
    let requested = did
        .iter()
        .position(|d| *d == Did::Append(event::REPLICATION_REQUESTED.into()));
    let launched = did.iter().position(|d| *d == Did::Launch(id.to_string()));
    let (Some(requested), Some(launched)) = (requested, launched) else {
        panic!("no decision or no launch: {did:?}");
    };
    assert!(
        did.get(requested..launched)
            .is_some_and(|between| between.contains(&Did::Sync)),
        "the decision was not synced before the launch: {did:?}"
    );
    Ok(())
}

#[test]
fn the_quota_counts_workers_until_the_launcher_reports_their_exit() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    let first = spawned(spawn(&mut e)?);
    spawned(spawn(&mut e)?);
    match spawn(&mut e)? {
        Some(ApiResponse::Denied { event: ev, .. }) => assert_eq!(ev, event::DENY_QUOTA),
        other => panic!("a third worker with max_replicas = 2: {other:?}"),
    }
    assert_eq!(
        world
            .did()
            .iter()
            .filter(|d| matches!(d, Did::Launch(_)))
            .count(),
        2
    );
    exited(&mut e, &first);
    spawned(spawn(&mut e)?);
    Ok(())
}

#[test]
fn a_trail_that_cannot_be_synced_stops_everything_and_decides_nothing() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    world.sync_fails.store(true, Ordering::SeqCst);
    let reply = spawn(&mut e)?;
    assert!(
        !matches!(reply, Some(ApiResponse::Spawned { .. })),
        "a decision that is not durable took effect: {reply:?}"
    );
    let did = world.did();
    assert!(!did.iter().any(|d| matches!(d, Did::Launch(_))), "{did:?}");
    assert!(did.contains(&Did::KillAll), "{did:?}");
    assert!(e.store.kill_switch_engaged());
    world.sync_fails.store(false, Ordering::SeqCst);
    match spawn(&mut e)? {
        Some(ApiResponse::Denied { event: ev, .. }) => assert_eq!(ev, event::DENY_KILL_SWITCH),
        other => panic!("the kill switch did not hold: {other:?}"),
    }
    Ok(())
}

#[test]
fn a_worker_that_never_registers_is_reaped_when_the_clock_says_so() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    let id = spawned(spawn(&mut e)?);
    e.handle(Input::Tick);
    assert!(
        !world.did().contains(&Did::Kill(id.to_string())),
        "reaped too early"
    );
    world.advance(Duration::from_secs(11));
    e.handle(Input::Tick);
    let did = world.did();
    assert!(
        did.contains(&Did::Append(event::REAP_STALE.into())),
        "{did:?}"
    );
    assert!(did.contains(&Did::Kill(id.to_string())), "{did:?}");
    Ok(())
}

#[test]
fn the_kill_switch_answers_once_every_worker_has_exited() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    let a = spawned(spawn(&mut e)?);
    let b = spawned(spawn(&mut e)?);
    let mut rx = kill_switch(&mut e, false);
    assert!(world.did().contains(&Did::KillAll));
    assert!(rx.try_recv().is_err(), "answered before the exits");
    exited(&mut e, &a);
    assert!(
        rx.try_recv().is_err(),
        "answered with a worker still running"
    );
    exited(&mut e, &b);
    match rx.try_recv() {
        Ok(ApiResponse::KillSwitch {
            engaged: true,
            killed: 2,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    Ok(())
}

#[test]
fn ps_waits_for_the_launcher_only_until_its_timer() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    spawned(spawn(&mut e)?);
    let (reply, mut rx) = oneshot::channel();
    e.handle(Input::Api {
        peer_uid: 0,
        request: Box::new(ApiRequest::Ps(Default::default())),
        reply,
    });
    let did = world.did();
    assert!(did.contains(&Did::Usage), "{did:?}");
    assert!(
        did.iter().any(|d| matches!(d, Did::Wake(_, _))),
        "no timer: {did:?}"
    );
    assert!(rx.try_recv().is_err());
    e.handle(Input::PsDeadline);
    assert!(matches!(rx.try_recv(), Ok(ApiResponse::Workers { .. })));
    Ok(())
}

#[test]
fn a_ps_asked_while_another_waits_shares_its_question_to_the_launcher() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    spawned(spawn(&mut e)?);
    let mut answers = Vec::new();
    for _ in 0..50 {
        let (reply, rx) = oneshot::channel();
        e.handle(Input::Api {
            peer_uid: 0,
            request: Box::new(ApiRequest::Ps(Default::default())),
            reply,
        });
        answers.push(rx);
    }
    let asked = world.did().iter().filter(|d| **d == Did::Usage).count();
    assert_eq!(asked, 1, "one question for 50 requests");
    e.handle(Input::PsDeadline);
    for mut rx in answers {
        assert!(matches!(rx.try_recv(), Ok(ApiResponse::Workers { .. })));
    }
    Ok(())
}

/// Takes `kill-switch [--release]` into the current batch; the receiver gets its answer.
fn take_kill_switch(e: &mut Engine, release: bool) -> oneshot::Receiver<ApiResponse> {
    let (reply, rx) = oneshot::channel();
    e.take(Input::Api {
        peer_uid: 0,
        request: Box::new(ApiRequest::KillSwitch {
            release,
            cluster: false,
        }),
        reply,
    });
    rx
}

/// `kill-switch [--release]` as a batch of its own; the receiver gets its answer.
fn kill_switch(e: &mut Engine, release: bool) -> oneshot::Receiver<ApiResponse> {
    let rx = take_kill_switch(e, release);
    e.commit();
    rx
}

/// Takes a spawn request into the current batch; the receiver gets its answer.
fn take_spawn(e: &mut Engine) -> Result<oneshot::Receiver<ApiResponse>> {
    let (reply, rx) = oneshot::channel();
    e.take(Input::Api {
        peer_uid: 0,
        request: Box::new(ApiRequest::Spawn {
            parent: None,
            request: Box::new(spawn_request()?),
        }),
        reply,
    });
    Ok(rx)
}

#[test]
fn a_batch_of_spawns_is_made_durable_by_one_sync_before_any_answer_or_launch() -> Result {
    let (mut e, world) = engine(
        "max_depth = 3\nmax_replicas = 5\ncooldown_seconds = 0\nexpiration_seconds = 3600\n",
    )?;
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(take_spawn(&mut e)?);
    }
    let before = world.did();
    assert!(
        !before
            .iter()
            .any(|d| matches!(d, Did::Sync | Did::Launch(_))),
        "something left the batch before its sync: {before:?}"
    );
    for rx in &mut answers {
        assert!(rx.try_recv().is_err(), "an answer left before its sync");
    }
    e.commit();
    let did = world.did();
    let syncs: Vec<usize> = did
        .iter()
        .enumerate()
        .filter(|(_, d)| **d == Did::Sync)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(syncs.len(), 1, "one sync for the batch: {did:?}");
    let launches: Vec<usize> = did
        .iter()
        .enumerate()
        .filter(|(_, d)| matches!(d, Did::Launch(_)))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(launches.len(), 3, "{did:?}");
    assert!(
        launches.iter().all(|l| syncs.iter().all(|s| s < l)),
        "a launch was written before the sync: {did:?}"
    );
    for mut rx in answers {
        spawned(rx.try_recv().ok());
    }
    Ok(())
}

#[test]
fn a_batch_whose_sync_fails_answers_errors_and_launches_nothing() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    world.sync_fails.store(true, Ordering::SeqCst);
    let mut answers = vec![take_spawn(&mut e)?, take_spawn(&mut e)?];
    e.commit();
    for rx in &mut answers {
        match rx.try_recv() {
            Ok(ApiResponse::Error { message }) => {
                assert!(message.contains("audit trail"), "{message}")
            }
            other => panic!("a decision that is not durable was answered: {other:?}"),
        }
    }
    let did = world.did();
    assert!(!did.iter().any(|d| matches!(d, Did::Launch(_))), "{did:?}");
    assert!(did.contains(&Did::KillAll), "{did:?}");
    assert!(e.store.kill_switch_engaged());
    Ok(())
}

#[test]
fn a_sync_failing_mid_batch_turns_the_batch_answers_into_errors() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    let mut rx = take_spawn(&mut e)?;
    // The tick's own sync fails; the commit after it has nothing left to sync.
    world.sync_fails.store(true, Ordering::SeqCst);
    e.take(Input::Tick);
    world.sync_fails.store(false, Ordering::SeqCst);
    e.commit();
    let got = rx.try_recv();
    assert!(
        !matches!(got, Ok(ApiResponse::Spawned { .. })),
        "a spawn whose batch failed to sync was answered as spawned: {got:?}"
    );
    assert!(e.store.kill_switch_engaged());
    Ok(())
}

/// A cluster that records its acknowledgements among the engine's other effects.
struct FakeCluster(Arc<World>);

impl crate::controller::cluster::Cluster for FakeCluster {
    fn node_id(&self) -> &str {
        "n1"
    }
    fn set_kill_switch(&mut self, _: bool, _: &str) -> std::result::Result<i64, String> {
        Ok(5)
    }
    fn await_acks(&mut self, _: i64, _: Duration, _: oneshot::Sender<ApiResponse>) {}
    fn ack(&mut self, revision: i64, _: usize, _: u64) {
        self.0.push(Did::Ack(revision));
    }
    fn workers(&mut self, _: oneshot::Sender<ApiResponse>) {}
    fn request_kill(
        &mut self,
        _: &WorkerId,
        _: bool,
        _: &str,
        _: Duration,
        _: oneshot::Sender<ApiResponse>,
    ) {
    }
    fn kill_done(&mut self, _: &WorkerId) {}
    fn anchor(&mut self, _: crate::controller::cluster::AnchorRecord) {}
    fn leave(&mut self) {}
}

#[test]
fn a_node_acknowledges_the_cluster_kill_switch_only_once_its_entry_is_durable() -> Result {
    let (e, world) = engine(CONTRACT)?;
    let mut e = e.with_cluster(Box::new(FakeCluster(world.clone())));
    e.take(Input::ClusterKillSwitch {
        engaged: true,
        revision: 5,
    });
    e.commit();
    let did = world.did();
    let ack = did.iter().position(|d| *d == Did::Ack(5));
    let sync = did.iter().position(|d| *d == Did::Sync);
    assert!(
        matches!((sync, ack), (Some(s), Some(a)) if s < a),
        "acknowledged before its entry was durable: {did:?}"
    );

    // And not at all when the entry cannot be written.
    let (e, world) = engine(CONTRACT)?;
    let mut e = e.with_cluster(Box::new(FakeCluster(world.clone())));
    world.sync_fails.store(true, Ordering::SeqCst);
    e.take(Input::ClusterKillSwitch {
        engaged: true,
        revision: 5,
    });
    e.commit();
    let did = world.did();
    assert!(!did.contains(&Did::Ack(5)), "{did:?}");
    Ok(())
}

#[test]
fn while_the_trail_cannot_be_written_nothing_is_acknowledged_in_a_later_batch() -> Result {
    let (e, world) = engine(CONTRACT)?;
    let mut e = e.with_cluster(Box::new(FakeCluster(world.clone())));
    let a = spawned(spawn(&mut e)?);
    world.sync_fails.store(true, Ordering::SeqCst);
    let (reply, mut local) = oneshot::channel();
    e.handle(Input::ClusterKillSwitch {
        engaged: true,
        revision: 5,
    });
    e.handle(Input::Api {
        peer_uid: 0,
        request: Box::new(ApiRequest::KillSwitch {
            release: false,
            cluster: false,
        }),
        reply,
    });
    // A later batch, the disk still failing: the worker's exit settles both waits.
    exited(&mut e, &a);
    e.handle(Input::Tick);
    let did = world.did();
    assert!(
        !did.contains(&Did::Ack(5)),
        "acknowledged without a durable entry: {did:?}"
    );
    let got = local.try_recv();
    assert!(
        !matches!(got, Ok(ApiResponse::KillSwitch { .. })),
        "the kill switch was reported done without a durable entry: {got:?}"
    );
    Ok(())
}

#[test]
fn a_kill_whose_sync_fails_engages_the_kill_switch() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    let a = spawned(spawn(&mut e)?);
    world.sync_fails.store(true, Ordering::SeqCst);
    let _ = api(
        &mut e,
        ApiRequest::Kill {
            worker_id: a,
            recursive: false,
        },
    );
    assert!(e.store.kill_switch_engaged());
    Ok(())
}

#[test]
fn decisions_after_a_failed_sync_take_effect_only_as_they_are_answered() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    world.sync_fails.store(true, Ordering::SeqCst);
    e.take(Input::Tick);
    // The disk is back within the same batch: an operator releases, a spawn comes.
    world.sync_fails.store(false, Ordering::SeqCst);
    let mut release = take_kill_switch(&mut e, true);
    let mut rx = take_spawn(&mut e)?;
    e.commit();
    let released = release.try_recv();
    let got = rx.try_recv();
    let launched = world.did().iter().any(|d| matches!(d, Did::Launch(_)));
    assert_eq!(
        launched,
        matches!(got, Ok(ApiResponse::Spawned { .. })),
        "launched: {launched}, answered: {got:?}"
    );
    assert_eq!(
        e.store.kill_switch_engaged(),
        !matches!(released, Ok(ApiResponse::KillSwitch { engaged: false, .. })),
        "kill switch engaged: {}, release answered: {released:?}",
        e.store.kill_switch_engaged()
    );
    Ok(())
}

#[test]
fn a_flood_of_rejected_connections_writes_one_entry_per_uid_per_interval() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    for pid in 0..1000 {
        e.handle(Input::ClientRejected { uid: 65534, pid });
    }
    let rejected = |w: &World| {
        w.did()
            .iter()
            .filter(|d| **d == Did::Append(event::CLIENT_REJECTED.into()))
            .count()
    };
    assert_eq!(rejected(&world), 1);
    world.advance(Duration::from_millis(NOISY_AUDIT_MS));
    e.handle(Input::ClientRejected { uid: 65534, pid: 1 });
    e.handle(Input::ClientRejected { uid: 1000, pid: 2 });
    assert_eq!(rejected(&world), 3, "a new interval, and another uid");
    Ok(())
}

#[test]
fn a_kill_switch_is_answered_only_once_the_exits_it_waited_for_are_durable() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    let a = spawned(spawn(&mut e)?);
    let mut rx = kill_switch(&mut e, false);
    world.sync_fails.store(true, Ordering::SeqCst);
    exited(&mut e, &a);
    let got = rx.try_recv();
    assert!(
        !matches!(got, Ok(ApiResponse::KillSwitch { .. })),
        "reported the kill from an exit that is not on disk: {got:?}"
    );
    Ok(())
}

/// A worker without a controller socket (a person may give it children at once), with a
/// command of `arg_bytes` bytes.
fn spawn_unsupervised(
    e: &mut Engine,
    parent: Option<&WorkerId>,
    arg_bytes: usize,
) -> Result<WorkerId> {
    let mut request = spawn_request()?;
    request.resources.network_policy.allow_controller = false;
    request.command = vec!["true".into(), "x".repeat(arg_bytes)];
    Ok(spawned(api(
        e,
        ApiRequest::Spawn {
            parent: parent.cloned(),
            request: Box::new(request),
        },
    )))
}

const WIDE: &str =
    "max_depth = 3\nmax_replicas = 50\ncooldown_seconds = 0\nexpiration_seconds = 3600\n";

#[test]
fn a_live_grandchild_stays_in_its_ancestors_subtree_however_many_workers_exit_meanwhile() -> Result
{
    let (mut e, _world) = engine(WIDE)?;
    let top = spawn_unsupervised(&mut e, None, 1)?;
    let mid = spawn_unsupervised(&mut e, Some(&top), 1)?;
    let leaf = spawn_unsupervised(&mut e, Some(&mid), 1)?;
    exited(&mut e, &mid);
    // More exits than the history keeps: the exited middle is the only link from the top
    // to the live leaf, and must not be forgotten while the leaf runs.
    for _ in 0..1010 {
        let other = spawn_unsupervised(&mut e, None, 1)?;
        exited(&mut e, &other);
    }
    assert!(e.registry.get(&mid).is_some(), "the link was forgotten");
    assert_eq!(e.registry.subtree(&top), vec![top.clone(), leaf.clone()]);
    // Once nothing below it runs, it is forgotten like any other exited worker.
    exited(&mut e, &leaf);
    exited(&mut e, &top);
    for _ in 0..1010 {
        let other = spawn_unsupervised(&mut e, None, 1)?;
        exited(&mut e, &other);
    }
    for gone in [&top, &mid, &leaf] {
        assert!(e.registry.get(gone).is_none(), "{gone} is kept for ever");
    }
    Ok(())
}

#[test]
fn exited_workers_large_manifests_are_kept_within_a_size_not_only_a_count() -> Result {
    let (mut e, _world) = engine(WIDE)?;
    let top = spawn_unsupervised(&mut e, None, 1)?;
    let mid = spawn_unsupervised(&mut e, Some(&top), 60_000)?;
    let leaf = spawn_unsupervised(&mut e, Some(&mid), 1)?;
    exited(&mut e, &mid);
    // 200 exited workers of 60 KB each: 12 MB, were they all kept; 8 MiB are.
    let mut ids = Vec::new();
    for _ in 0..200 {
        let other = spawn_unsupervised(&mut e, None, 60_000)?;
        exited(&mut e, &other);
        ids.push(other);
    }
    let kept = ids.iter().filter(|id| e.registry.get(id).is_some()).count();
    assert!(kept <= 140, "{kept} of 200 large exited workers kept");
    assert!(kept > 0, "the newest are kept");
    assert!(e.registry.get(ids.last().unwrap_or(&top)).is_some());
    // The link to a live worker is kept whatever its size.
    assert_eq!(e.registry.subtree(&top), vec![top.clone(), leaf.clone()]);
    Ok(())
}

/// The kill switch a failed sync engaged is recorded by the first entry after it (kept
/// by the trail until it can be written): the trail never shows the switch released, or
/// workers refused by it, without its engagement first; and it is recorded once.
#[test]
fn the_kill_switch_a_failed_sync_engaged_is_the_next_entry() -> Result {
    let (mut e, world) = engine(CONTRACT)?;
    let _rx = take_spawn(&mut e)?;
    world.sync_fails.store(true, Ordering::SeqCst);
    e.take(Input::Tick);
    e.commit();
    assert!(e.store.kill_switch_engaged());
    let failed_at = world.did().len();
    world.sync_fails.store(false, Ordering::SeqCst);
    for _ in 0..2 {
        let _rx = take_spawn(&mut e)?;
        e.commit();
    }
    let appended = |from: usize| -> Vec<String> {
        world
            .did()
            .get(from..)
            .unwrap_or_default()
            .iter()
            .filter_map(|d| match d {
                Did::Append(ev) => Some(ev.clone()),
                _ => None,
            })
            .collect()
    };
    let all = appended(0);
    let engaged: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, ev)| *ev == event::KILL_SWITCH_ENGAGED)
        .map(|(i, _)| i)
        .collect();
    let denied = all.iter().position(|ev| ev == event::DENY_KILL_SWITCH);
    assert_eq!(engaged.len(), 1, "{all:?}");
    assert!(
        matches!((engaged.first(), denied), (Some(e), Some(d)) if *e < d),
        "refused by a kill switch not yet recorded: {all:?}"
    );
    assert!(!appended(failed_at).is_empty());
    Ok(())
}
