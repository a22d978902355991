#![deny(
    clippy::string_slice,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
//! The controller: issues signed manifests, launches each worker in its own sandbox through
//! a single-threaded launcher, enforces the replication contract on what workers ask for,
//! reaps the silent and the expired, stops everything on demand, and records every
//! decision in the audit trail.
//!
//! Processes: the controller (this module; an async runtime for sockets plus one engine
//! thread for decisions) and the launcher, forked before the runtime starts, which starts
//! and supervises the sandboxes. The launcher dies with the controller and every sandbox
//! dies with the launcher, so no worker outlives its controller.

pub mod admission;
pub mod api_slots;
pub mod audit_budget;
pub mod bounded;
pub mod client;
pub mod cluster;
pub mod engine;
#[doc(hidden)]
pub mod fuzz;
pub mod input;
mod joining;
pub mod launch_protocol;
pub mod launcher;
pub mod link;
pub mod paths;
pub mod protocol;
pub mod registry;
pub mod server;
mod setup;
pub mod warm_pool;
pub mod wire;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::json;

use crate::audit::{self, AuditKey, AuditLog};
use crate::contract::ReplicationContract;
use crate::paths::Dir;
use crate::signing::{Keyring, ManifestSigner};
use joining::{Store, join_cluster, leave};
use setup::{Created, HeldState, bind_socket, check_socket_free, hold_state_dir};

pub use paths::ControllerPaths;

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Key(#[from] crate::signing::KeyError),
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
    #[error(transparent)]
    Contract(#[from] crate::contract::ContractError),
    /// The cluster options are wrong (bad input: nothing was started).
    #[error("{0}")]
    ClusterOptions(String),
    /// The cluster could not be joined.
    #[error("{0}")]
    Cluster(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ControllerError + '_ {
    move |source| ControllerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How a controller runs.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    pub paths: ControllerPaths,
    pub contract: Option<PathBuf>,
    pub heartbeat_timeout: Duration,
    pub register_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub allow_degraded: bool,
    /// Let members of this group use the API socket (mode 0660): to look, spawn and stop,
    /// never to decide (see `Engine::decides`).
    pub socket_group: Option<u32>,
    /// Where every synced head of the audit trail is also written (outside the state
    /// directory), and what the trail is checked against at start.
    pub audit_anchor: Option<audit::AnchorTarget>,
    /// Begin a new audit trail where an earlier one vanished (recorded in its first
    /// entry); refused where a trail exists.
    pub new_audit_trail: bool,
    /// Most output one worker's log keeps when its manifest sets no cap.
    pub worker_output_cap: u64,
    /// Most output every worker's log keeps together in one run of the controller.
    pub worker_output_total: u64,
    /// The operator's name resolution for workers' egress brokers (`--resolve`).
    pub egress_resolution: crate::egress::Resolution,
    /// Sandboxes the launcher keeps prepared ahead of workers (`--warm-pool`).
    pub warm_pool: usize,
    /// The cluster to join (`--cluster` and its options), over the contract file's.
    pub cluster: cluster::ClusterArgs,
}

fn random_hex(bytes: usize) -> Result<String, ControllerError> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| ControllerError::Setup(format!("random source: {e}")))?;
    Ok(hex::encode(b))
}

/// Runs a controller in the foreground until SIGINT or SIGTERM.
///
/// Its steps, in an order that matters: check everything that can be checked before
/// anything is created; hold the state directory; open the audit trail under this start's
/// key; fork the launcher while the process is single-threaded; in a cluster, join it and
/// check the trail against it; bind the socket; record the start; run the engine and
/// serve until it has finished; then stop in turn. A start refused before the socket is
/// bound leaves the trail, the pid file and a crashed controller's socket as it found them.
pub fn run(opts: ControllerOptions) -> Result<(), ControllerError> {
    let paths = &opts.paths;
    // Everything that can be checked is checked before anything is created: a controller
    // that does not start leaves no state directory, key or socket behind.
    let (contract, cluster) = check_before_creating(&opts)?;
    let mut created = Created::before(paths);
    let HeldState {
        dir: state,
        workers,
        lock: _lock,
        crashed_pid,
    } = hold_state_dir(paths, &mut created)?;
    // Bound again after the lock, so that it is dropped before it: what a failed start
    // made is removed while it still holds the state directory, never after another
    // start could have taken the lock and begun to use it.
    let mut created = created;
    let mut session = open_trail(&opts, &state, &mut created)?;
    // A rootless launcher builds each worker's identity from its user's name: asked here,
    // before the launcher is forked, it inherits the answer instead of asking the user
    // database (which it does with no deadline) at its first worker.
    if !nix::unistd::geteuid().is_root() {
        let _ = crate::sandbox::userns::Identity::for_caller(None);
    }
    let launched = start_launcher(
        paths,
        workers,
        opts.worker_output_total,
        egress_resolution(&opts, &contract),
        opts.warm_pool,
    );
    let Launcher {
        process: launcher,
        engine_workers,
        cgroup_owner,
    } = match launched {
        Ok(launched) => launched,
        Err(e) => return Err(refused(session, &state, e)),
    };
    let (tx, rx) = mpsc::channel::<input::Input>();
    // In a cluster: joined, and the trail holds this node's anchored head, before this
    // start writes anything to the trail or the pid file. A refused start leaves both as
    // it found them (the evidence of a rolled-back trail, and the pid of a controller
    // that did not stop cleanly).
    let mut joined = match join_cluster(cluster.as_ref(), &contract, &tx, &session.audit) {
        Ok(joined) => joined,
        Err(e) => return Err(refused(session, &state, e)),
    };
    // The socket too: a crashed controller's, left in its place, is evidence the next
    // start records (`stale_socket_removed`); the launcher, forked before, holds no
    // listener of the API.
    let pid_file = paths.state_dir.join("controller.pid");
    let started = bind_socket(&opts, &mut created).and_then(|(listener, stale_socket)| {
        state
            .write_atomically(
                "controller.pid",
                format!("{}\n", std::process::id()).as_bytes(),
                0o600,
            )
            .map_err(io_err(&pid_file))?;
        record_start(&opts, &mut session, crashed_pid, stale_socket)?;
        Ok(listener)
    });
    let listener = match started {
        Ok(listener) => listener,
        Err(e) => {
            leave(&mut joined);
            return Err(refused(session, &state, e));
        }
    };
    let cfg = engine_config(&opts, session.id, engine_workers, cgroup_owner);
    let engine = start_engine(
        cfg,
        contract,
        session.signer,
        session.audit,
        launcher.requests,
        launcher.pid,
        joined,
        (tx, rx),
    )?;

    // Up: from here on what this start made is the controller's to keep.
    created.keep();
    tracing::debug!(socket = %paths.socket.display(), "controller ready");

    let policy = server::AccessPolicy {
        owner_uid: nix::unistd::geteuid().as_raw(),
        group: opts.socket_group,
    };
    let served = serve(
        listener,
        launcher.events,
        policy,
        &engine.tx,
        engine.done,
        &paths.socket,
    );
    let result = engine.rt.block_on(served);
    stop(engine.rt, engine.tx, engine.thread, launcher.pid);
    let _ = std::fs::remove_file(&paths.socket);
    match result {
        Ok(true) => {
            let _ = state.remove("controller.pid");
        }
        // The trail lacks this session's last entries (or the count of what was
        // dropped): the pid file stays, so the next start records that this session did
        // not stop cleanly, as after a crash.
        Ok(false) => tracing::error!(
            "the audit trail's last entries could not be written; controller.pid is kept so that the next start records this session as not stopped cleanly"
        ),
        Err(_) => {}
    }
    result.map(drop)
}

/// Checks what can be checked before anything is created: the contract parses, the
/// socket is free, and no path falls back to a base someone else could own.
fn check_before_creating(
    opts: &ControllerOptions,
) -> Result<(ReplicationContract, Option<cluster::ClusterOptions>), ControllerError> {
    let paths = &opts.paths;
    tracing::debug!(contract = ?opts.contract, "checking the replication contract");
    let contract = match &opts.contract {
        Some(path) => ReplicationContract::from_file(path)?,
        None => ReplicationContract::default(),
    };
    let cluster = cluster::ClusterOptions::resolve(&opts.cluster, &contract.cluster)
        .map_err(ControllerError::ClusterOptions)?;
    if cluster.is_some() && !cfg!(feature = "cluster") {
        return Err(ControllerError::ClusterOptions(
            "this hatchery was built without cluster support: build it with `cargo build --release --features cluster` (needs protoc)".into(),
        ));
    }
    tracing::debug!(socket = %paths.socket.display(), "checking that the socket is free");
    check_socket_free(&paths.socket)?;
    for p in [&paths.state_dir, &paths.socket, &paths.key] {
        paths::check_fallback_base(p, paths::BaseUse::Look).map_err(ControllerError::Setup)?;
    }
    Ok((contract, cluster))
}

/// This run's session: its id, the manifest signer keyed for it, and the audit trail.
struct Session {
    id: String,
    signer: ManifestSigner,
    audit: AuditLog,
    key_created: bool,
}

/// Opens the audit anchor, loads (or makes) the signing key, and opens the audit trail
/// under a new session; the key is left to `created` only with the trail made with it.
fn open_trail(
    opts: &ControllerOptions,
    state: &Dir,
    created: &mut Created,
) -> Result<Session, ControllerError> {
    let paths = &opts.paths;
    // Opened before the key is made: an anchor that cannot be used is refused before
    // anything in the state directory changes.
    let anchor = match &opts.audit_anchor {
        Some(target) => Some(audit::Anchor::open(target, state)?),
        None => None,
    };
    tracing::debug!(key = %paths.key.display(), "loading the signing key (made on first start)");
    let (master, key_created) = Keyring::load_or_generate(&paths.key)?;
    if !key_created {
        // Not made by this start (another made it first): never this start's to remove.
        created.key = None;
    }
    let id = random_hex(8)?;
    let signer = ManifestSigner::new(master.session(&id)?);
    let audit_key = AuditKey::from_mac(master.derived_mac(audit::KEY_PURPOSE)?);
    let audit = AuditLog::start(
        &paths.state_dir,
        audit_key,
        audit::Start {
            new_trail: opts.new_audit_trail,
            key_created,
            anchor,
            session: id.clone(),
        },
    )?;
    // The trail now names this key: a key is removed after a failed start only with the
    // state directory (and trail) made with it, never from under a trail that stays.
    if created.state_dir.is_none() {
        created.key = None;
    }
    Ok(Session {
        id,
        signer,
        audit,
        key_created,
    })
}

/// A start refused after its trail was opened: a trail it began takes nothing of the
/// state directory with it ([`AuditLog::abandon_begun`]), so that the same command can be
/// given again once what refused it is mended (before, the trail left behind refused a
/// second `--new-audit-trail`). Not where this start made a key and the state directory
/// holds a `controller.key` (the key itself, whatever path named it, or one beside it):
/// that key is not removed, since another controller may have read it the moment it
/// existed, and without the trail it would be evidence of one; the trail that names it
/// stays with it. Returns `e`.
fn refused(session: Session, state: &Dir, e: ControllerError) -> ControllerError {
    let key_here = session.key_created
        && state
            .stat_entry(audit::KEY_FILE)
            .map_or(true, |entry| entry.is_some());
    if !key_here {
        if let Err(why) = session.audit.abandon_begun() {
            tracing::error!(
                "the audit trail this refused start began could not be taken away again: {why}"
            );
        }
    }
    e
}

/// The launcher as the controller knows it.
struct Launcher {
    process: crate::sandbox::zygote::LauncherProcess,
    /// The engine's own handle on `workers/` (worker logs are read through it).
    engine_workers: Dir,
    /// The launcher's pid and start time: the owner part of every worker cgroup's name.
    cgroup_owner: String,
}

/// Workers' name resolution: the contract file's `[egress.resolve]`, then `--resolve`
/// (which wins for a name in both).
fn egress_resolution(
    opts: &ControllerOptions,
    contract: &ReplicationContract,
) -> crate::egress::Resolution {
    let mut table = contract.egress_resolution.clone();
    table.merge(&opts.egress_resolution);
    table
}

/// Forks the launcher, which starts and supervises the sandboxes. It must be forked while
/// this process has one thread: before the runtime and the engine thread.
fn start_launcher(
    paths: &ControllerPaths,
    workers: Dir,
    output_total: u64,
    resolution: crate::egress::Resolution,
    warm_pool: usize,
) -> Result<Launcher, ControllerError> {
    let engine_workers = workers
        .try_clone()
        .map_err(io_err(&paths.state_dir.join("workers")))?;
    let keep = [std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(
        &workers,
    ))];
    tracing::debug!("starting the launcher (it starts and supervises the sandboxes)");
    let process = crate::sandbox::zygote::fork_launcher(&keep, move |req, ev| {
        launcher::serve(req, ev, workers, output_total, resolution, warm_pool)
    })
    .map_err(|e| ControllerError::Setup(format!("cannot start the launcher: {e}")))?;
    let launcher_start =
        crate::sandbox::cgroup::process_start_time(process.pid.as_raw() as u32).unwrap_or(0);
    Ok(Launcher {
        cgroup_owner: crate::sandbox::cgroup::owner_tag(
            process.pid.as_raw() as u32,
            launcher_start,
        ),
        process,
        engine_workers,
    })
}

/// Records the start in the audit trail, and the recovery from a controller that did not
/// stop cleanly (its pid file or socket left behind).
fn record_start(
    opts: &ControllerOptions,
    session: &mut Session,
    crashed_pid: Option<String>,
    stale_socket: bool,
) -> Result<(), ControllerError> {
    session.audit.record(
        audit::event::CONTROLLER_STARTED,
        "controller",
        None,
        json!({
            "pid": std::process::id(), "session": session.id, "key_created": session.key_created,
            "contract": opts.contract, "socket": opts.paths.socket,
            "audit_anchor": opts.audit_anchor.as_ref().map(|a| a.to_string()),
        }),
    )?;
    let torn = session.audit.take_torn_tail();
    if crashed_pid.is_some() || stale_socket || torn > 0 {
        let mut details =
            json!({ "previous_pid": crashed_pid, "stale_socket_removed": stale_socket });
        if let Some(fields) = details.as_object_mut().filter(|_| torn > 0) {
            // The partial line of an append a crash cut short, never reported durable.
            fields.insert("torn_entry_bytes_removed".into(), json!(torn));
        }
        session
            .audit
            .record(audit::event::CRASH_RECOVERED, "controller", None, details)?;
    }
    record_open_egress_lost(session)
}

/// Says, for each worker whose egress broker the trail last saw running, that what its
/// open connections carried was not recorded: a controller that ended without stopping
/// them (it crashed or was killed) took the brokers along before they reported.
fn record_open_egress_lost(session: &mut Session) -> Result<(), ControllerError> {
    let open = session.audit.take_open_egress();
    if open.is_empty() {
        return Ok(());
    }
    let why = "the controller ended without stopping this worker's egress broker (it crashed or was killed): connections still open then were not recorded";
    for id in &open.workers {
        session.audit.append(
            audit::event::EGRESS_RECORD_LOST,
            "controller",
            Some(id),
            json!({ "error": why }),
        );
    }
    if open.more > 0 {
        session.audit.append(
            audit::event::EGRESS_RECORD_LOST,
            "controller",
            None,
            json!({ "error": why, "workers_not_named": open.more }),
        );
    }
    session.audit.sync()?;
    Ok(())
}

/// The engine's fixed settings: the options, this session, the launcher's identity, the
/// agent binary workers may run, and how many distinct ids workers can be given.
fn engine_config(
    opts: &ControllerOptions,
    session: String,
    engine_workers: Dir,
    cgroup_owner: String,
) -> engine::EngineConfig {
    let agent_binary = std::env::current_exe()
        .ok()
        .and_then(|p| std::fs::canonicalize(p).ok())
        .filter(|p| crate::paths::check_host_path(p).is_ok());
    let distinct_ids = if nix::unistd::geteuid().is_root() {
        1
    } else {
        crate::sandbox::userns::Identity::for_caller(None)
            .mapped_ids()
            .min(65536)
    };
    let own_files = paths::OwnFiles::new(
        [
            opts.paths.state_dir.as_path(),
            opts.paths.socket.as_path(),
            opts.paths.key.as_path(),
        ]
        .into_iter()
        .chain(opts.contract.as_deref())
        .chain(opts.audit_anchor.as_ref().and_then(|a| match a {
            audit::AnchorTarget::File(p) => Some(p.as_path()),
            audit::AnchorTarget::Syslog(_) => None,
        })),
        // The program as run, whether or not workers are given it as their agent.
        std::env::current_exe().ok().as_deref(),
    );
    engine::EngineConfig {
        state_dir: opts.paths.state_dir.clone(),
        workers: Some(engine_workers),
        session,
        heartbeat_timeout: opts.heartbeat_timeout,
        register_timeout: opts.register_timeout,
        heartbeat_interval: opts.heartbeat_interval,
        allow_degraded: opts.allow_degraded,
        agent_binary,
        cgroup_owner,
        distinct_ids,
        worker_output_cap: opts.worker_output_cap,
        own_files,
    }
}

/// The engine on its own thread, and the runtime the sockets are served on.
struct RunningEngine {
    rt: tokio::runtime::Runtime,
    /// The engine's inputs: clients, the launcher's events, the ticker, the signals.
    tx: mpsc::Sender<input::Input>,
    /// Fires when the engine has finished (everything stopped).
    done: tokio::sync::oneshot::Receiver<bool>,
    thread: std::thread::JoinHandle<()>,
}

/// Most inputs decided before their decisions are made durable together: bounds how long
/// the first of them waits for its answer.
const MAX_BATCH: usize = 64;

/// Builds the async runtime and starts the engine on its own thread, where it decides
/// one input at a time until it has finished; it reaches the launcher, the clock and its
/// timers through [`engine::HostEffects`].
#[allow(clippy::too_many_arguments)]
fn start_engine(
    cfg: engine::EngineConfig,
    contract: ReplicationContract,
    signer: ManifestSigner,
    audit: AuditLog,
    launcher_requests: std::os::unix::net::UnixStream,
    launcher_pid: nix::unistd::Pid,
    mut joined: Store,
    (tx, rx): (mpsc::Sender<input::Input>, mpsc::Receiver<input::Input>),
) -> Result<RunningEngine, ControllerError> {
    let setup = |what: &str, e: std::io::Error, joined: &mut Store| {
        leave(joined);
        ControllerError::Setup(format!("{what}: {e}"))
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return Err(setup("async runtime", e, &mut joined)),
    };
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let outbox = match link::Outbox::new(launcher_requests) {
        Ok(o) => o,
        Err(e) => return Err(setup("the launcher's socket", e, &mut joined)),
    };
    let (store, node) = joined;
    let mut engine = engine::Engine::new(
        cfg,
        contract,
        signer,
        Box::new(audit),
        store,
        Box::new(engine::HostEffects::new(
            outbox,
            launcher_pid,
            rt.handle().clone(),
            tx.clone(),
        )),
        done_tx,
    );
    if let Some(node) = node {
        engine = engine.with_cluster(node);
    }
    let thread = std::thread::Builder::new()
        .name("hatchery-engine".into())
        .spawn(move || {
            // Whatever queued up while the last batch was decided is the next batch: one
            // sync makes all of its decisions durable (group commit, see `engine::commit`).
            while let Ok(input) = rx.recv() {
                engine.take(input);
                for _ in 1..MAX_BATCH {
                    if engine.finished.is_none() {
                        break;
                    }
                    let Ok(input) = rx.try_recv() else {
                        break;
                    };
                    engine.take(input);
                }
                engine.commit();
                if engine.finished.is_none() {
                    break;
                }
            }
        })
        .map_err(|e| ControllerError::Setup(format!("engine thread: {e}")))?;
    Ok(RunningEngine {
        rt,
        tx,
        done: done_rx,
        thread,
    })
}

/// Serves until the engine has finished: clients on the API socket, the launcher's
/// events, a ticker, and SIGTERM or SIGINT, which ask the engine to shut down.
async fn serve(
    listener: std::os::unix::net::UnixListener,
    events: std::os::unix::net::UnixStream,
    policy: server::AccessPolicy,
    tx: &mpsc::Sender<input::Input>,
    done: tokio::sync::oneshot::Receiver<bool>,
    socket: &Path,
) -> Result<bool, ControllerError> {
    listener.set_nonblocking(true).map_err(io_err(socket))?;
    let listener = tokio::net::UnixListener::from_std(listener).map_err(io_err(socket))?;
    events
        .set_nonblocking(true)
        .map_err(|e| ControllerError::Setup(e.to_string()))?;
    let events = tokio::net::UnixStream::from_std(events)
        .map_err(|e| ControllerError::Setup(e.to_string()))?;
    tokio::spawn(server::accept_clients(listener, policy, tx.clone()));
    tokio::spawn(server::relay_launcher(events, tx.clone()));
    tokio::spawn(server::ticker(tx.clone(), Duration::from_millis(250)));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| ControllerError::Setup(e.to_string()))?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| ControllerError::Setup(e.to_string()))?;
    let shutdown_tx = tx.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let _ = shutdown_tx.send(input::Input::Shutdown);
    });
    // A lost engine says nothing of the trail: as if it had not ended cleanly.
    Ok(done.await.unwrap_or(false))
}

/// Stops in turn: the runtime's tasks, the engine thread once its inputs are closed, then
/// the launcher, whose cgroups are removed here if it did not exit cleanly.
fn stop(
    rt: tokio::runtime::Runtime,
    tx: mpsc::Sender<input::Input>,
    thread: std::thread::JoinHandle<()>,
    launcher_pid: nix::unistd::Pid,
) {
    drop(tx);
    rt.shutdown_timeout(Duration::from_millis(200));
    let _ = thread.join();
    let status = crate::sandbox::wait::reap_child(launcher_pid);
    if !matches!(status, Ok(nix::sys::wait::WaitStatus::Exited(_, 0))) {
        // Killed (it did not stop when asked) or crashed: its sandboxes are gone with it,
        // their cgroups are not; remove them as its successor would.
        if let Ok(Some(cgroups)) = crate::sandbox::cgroup::detect() {
            let swept = cgroups.sweep_stale(true);
            tracing::info!(count = swept.len(), "removed the launcher's cgroups");
        }
    }
}
