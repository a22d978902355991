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
pub mod audit_budget;
pub mod bounded;
pub mod client;
pub mod engine;
#[doc(hidden)]
pub mod fuzz;
pub mod input;
pub mod launch_protocol;
pub mod launcher;
pub mod link;
pub mod paths;
pub mod protocol;
pub mod registry;
pub mod server;
pub mod wire;

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::json;

use crate::audit::{self, AuditKey, AuditLog};
use crate::contract::ReplicationContract;
use crate::paths::Dir;
use crate::signing::{Keyring, ManifestSigner};

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
    /// Let members of this group use the API socket (mode 0660).
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
}

/// Creates `dir` (and parents), opens it (no symlink on the way) and makes it private to
/// the caller; a directory someone else owns is refused.
fn private_dir(dir: &Path) -> Result<Dir, ControllerError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let held = Dir::open(dir).map_err(io_err(dir))?;
    let owner = held.stat().map_err(io_err(dir))?.st_uid;
    let me = nix::unistd::geteuid().as_raw();
    if owner != me {
        return Err(ControllerError::Setup(format!(
            "{} belongs to uid {owner}, not to this user ({me}): refusing to keep state there; use another --state-dir",
            dir.display()
        )));
    }
    held.set_mode(0o700).map_err(io_err(dir))?;
    Ok(held)
}

/// Takes the state directory's lock (held until the returned guard is dropped or the
/// process exits): one controller per state directory.
fn lock_state(dir: &Dir) -> Result<nix::fcntl::Flock<File>, ControllerError> {
    let path = dir.path().join("controller.lock");
    let file = File::from(
        dir.open_lock("controller.lock", 0o600)
            .map_err(io_err(&path))?,
    );
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        ControllerError::Setup(format!(
            "another controller is using {} ({e}); stop it first or use another --state-dir",
            dir.path().display()
        ))
    })
}

/// Removes a socket left by a dead controller; refuses if one is still answering, and
/// never removes anything that is not a socket.
fn clear_stale_socket(path: &Path) -> Result<bool, ControllerError> {
    if !check_socket_free(path)? {
        return Ok(false);
    }
    std::fs::remove_file(path).map_err(io_err(path))?;
    Ok(true)
}

/// Refuses a socket path that is taken (a controller answers there, or it is not a
/// socket); true when a dead controller's socket is left there.
fn check_socket_free(path: &Path) -> Result<bool, ControllerError> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err(path)(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(ControllerError::Setup(format!(
            "{} exists and is not a socket: refusing to replace it; remove it or choose another --socket",
            path.display()
        )));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(ControllerError::Setup(format!(
            "a controller is already listening on {}",
            path.display()
        )));
    }
    Ok(true)
}

/// What a start that fails leaves behind: nothing. Holds the state directory and key
/// this start created, and removes them when dropped before [`Created::keep`].
struct Created {
    state_dir: Option<PathBuf>,
    key: Option<PathBuf>,
    socket: Option<PathBuf>,
}

impl Created {
    /// Notes what does not exist yet (and so would be this start's to remove).
    fn before(paths: &ControllerPaths) -> Created {
        let absent = |p: &Path| matches!(std::fs::symlink_metadata(p), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
        let state_dir = absent(&paths.state_dir).then(|| paths.state_dir.clone());
        let key = absent(&paths.key).then(|| paths.key.clone());
        Created {
            state_dir,
            key,
            socket: None,
        }
    }

    fn keep(mut self) {
        self.state_dir = None;
        self.key = None;
        self.socket = None;
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if let Some(socket) = self.socket.take() {
            let _ = std::fs::remove_file(socket);
        }
        if let Some(key) = self.key.take() {
            let _ = std::fs::remove_file(key);
        }
        // Made by this start with mode 0700: nothing in it is anyone else's.
        if let Some(dir) = self.state_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn random_hex(bytes: usize) -> Result<String, ControllerError> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| ControllerError::Setup(format!("random source: {e}")))?;
    Ok(hex::encode(b))
}

/// Runs a controller in the foreground until SIGINT or SIGTERM.
pub fn run(opts: ControllerOptions) -> Result<(), ControllerError> {
    let paths = &opts.paths;
    // Everything that can be checked is checked before anything is created: a controller
    // that does not start leaves no state directory, key or socket behind.
    tracing::debug!(contract = ?opts.contract, "checking the replication contract");
    let contract = match &opts.contract {
        Some(path) => ReplicationContract::from_file(path)?,
        None => ReplicationContract::default(),
    };
    tracing::debug!(socket = %paths.socket.display(), "checking that the socket is free");
    check_socket_free(&paths.socket)?;
    for p in [&paths.state_dir, &paths.socket, &paths.key] {
        paths::check_fallback_base(p, paths::BaseUse::Look).map_err(ControllerError::Setup)?;
    }
    let mut created = Created::before(paths);
    for p in [&paths.state_dir, &paths.socket] {
        paths::check_fallback_base(p, paths::BaseUse::Create).map_err(ControllerError::Setup)?;
    }
    tracing::debug!(state_dir = %paths.state_dir.display(), "opening the state directory");
    let state = private_dir(&paths.state_dir).inspect_err(|_| {
        // Not proven this user's: nothing there is removed.
        created.state_dir = None;
    })?;
    let workers = state
        .subdir("workers", 0o700)
        .map_err(io_err(&paths.state_dir))?;
    workers
        .set_mode(0o700)
        .map_err(io_err(&paths.state_dir.join("workers")))?;
    // Another start that made the directory at the same moment may hold it: only the
    // holder of the lock may call what is there its own (and remove it on failure).
    let _lock = lock_state(&state).inspect_err(|_| {
        created.state_dir = None;
        created.key = None;
    })?;
    let pid_file = paths.state_dir.join("controller.pid");
    let crashed_pid = state
        .read("controller.pid", 64)
        .map_err(io_err(&pid_file))?
        .map(|b| String::from_utf8_lossy(&b).trim().to_string());

    // Opened before the key is made: an anchor that cannot be used is refused before
    // anything in the state directory changes.
    let anchor = match &opts.audit_anchor {
        Some(target) => Some(audit::Anchor::open(target, &state)?),
        None => None,
    };
    tracing::debug!(key = %paths.key.display(), "loading the signing key (made on first start)");
    let (master, key_created) = Keyring::load_or_generate(&paths.key)?;
    if !key_created {
        // Not made by this start (another made it first): never this start's to remove.
        created.key = None;
    }
    let session = random_hex(8)?;
    let signer = ManifestSigner::new(master.session(&session)?);
    let audit_key = AuditKey::from_mac(master.derived_mac(audit::KEY_PURPOSE)?);
    let mut audit = AuditLog::start(
        &paths.state_dir,
        audit_key,
        audit::Start {
            new_trail: opts.new_audit_trail,
            key_created,
            anchor,
            session: session.clone(),
        },
    )?;
    // The trail now names this key: a key is removed after a failed start only with the
    // state directory (and trail) made with it, never from under a trail that stays.
    if created.state_dir.is_none() {
        created.key = None;
    }

    if let Some(parent) = paths.socket.parent() {
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let stale_socket = clear_stale_socket(&paths.socket)?;
    tracing::debug!(socket = %paths.socket.display(), "binding the API socket");
    let listener =
        std::os::unix::net::UnixListener::bind(&paths.socket).map_err(io_err(&paths.socket))?;
    created.socket = Some(paths.socket.clone());
    let mode = if opts.socket_group.is_some() {
        0o660
    } else {
        0o600
    };
    std::fs::set_permissions(&paths.socket, std::fs::Permissions::from_mode(mode))
        .map_err(io_err(&paths.socket))?;
    if let Some(gid) = opts.socket_group {
        nix::unistd::chown(&paths.socket, None, Some(nix::unistd::Gid::from_raw(gid)))
            .map_err(|e| io_err(&paths.socket)(e.into()))?;
    }

    let engine_workers = workers
        .try_clone()
        .map_err(io_err(&paths.state_dir.join("workers")))?;
    // The launcher must be forked while this process has one thread: before the runtime.
    let keep = [std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(
        &workers,
    ))];
    let output_total = opts.worker_output_total;
    tracing::debug!("starting the launcher (it starts and supervises the sandboxes)");
    let launcher = crate::sandbox::zygote::fork_launcher(&keep, move |req, ev| {
        launcher::serve(req, ev, workers, output_total)
    })
    .map_err(|e| ControllerError::Setup(format!("cannot start the launcher: {e}")))?;
    let launcher_start =
        crate::sandbox::cgroup::process_start_time(launcher.pid.as_raw() as u32).unwrap_or(0);
    let cleanup = |state: &Dir, socket: &Path| {
        let _ = std::fs::remove_file(socket);
        let _ = state.remove("controller.pid");
    };
    state
        .write_atomically(
            "controller.pid",
            format!("{}\n", std::process::id()).as_bytes(),
            0o600,
        )
        .map_err(io_err(&pid_file))?;

    audit.record(
        audit::event::CONTROLLER_STARTED,
        "controller",
        None,
        json!({
            "pid": std::process::id(), "session": session, "key_created": key_created,
            "contract": opts.contract, "socket": paths.socket,
            "audit_anchor": opts.audit_anchor.as_ref().map(|a| a.to_string()),
        }),
    )?;
    if crashed_pid.is_some() || stale_socket {
        audit.record(
            audit::event::CRASH_RECOVERED,
            "controller",
            None,
            json!({ "previous_pid": crashed_pid, "stale_socket_removed": stale_socket }),
        )?;
    }

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
    let cfg = engine::EngineConfig {
        state_dir: paths.state_dir.clone(),
        workers: Some(engine_workers),
        session,
        heartbeat_timeout: opts.heartbeat_timeout,
        register_timeout: opts.register_timeout,
        heartbeat_interval: opts.heartbeat_interval,
        allow_degraded: opts.allow_degraded,
        agent_binary,
        cgroup_owner: format!("{}-{}", launcher.pid, launcher_start),
        distinct_ids,
        worker_output_cap: opts.worker_output_cap,
    };

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ControllerError::Setup(format!("async runtime: {e}")))?;
    let (tx, rx) = mpsc::channel::<input::Input>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let mut engine = engine::Engine::new(
        cfg,
        contract,
        signer,
        Box::new(audit),
        Box::new(admission::InMemoryStore::default()),
        Box::new(engine::HostEffects::new(
            link::Outbox::new(launcher.requests)
                .map_err(|e| ControllerError::Setup(format!("the launcher's socket: {e}")))?,
            launcher.pid,
            rt.handle().clone(),
            tx.clone(),
        )),
        done_tx,
    );
    let engine_thread = std::thread::Builder::new()
        .name("hatchery-engine".into())
        .spawn(move || {
            while let Ok(input) = rx.recv() {
                engine.handle(input);
                if engine.finished.is_none() {
                    break;
                }
            }
        })
        .map_err(|e| ControllerError::Setup(format!("engine thread: {e}")))?;

    // Up: from here on what this start made is the controller's to keep.
    created.keep();
    tracing::debug!(socket = %paths.socket.display(), "controller ready");

    let policy = server::AccessPolicy {
        owner_uid: nix::unistd::geteuid().as_raw(),
        group: opts.socket_group,
    };
    let result = rt.block_on(async {
        listener
            .set_nonblocking(true)
            .map_err(io_err(&paths.socket))?;
        let listener =
            tokio::net::UnixListener::from_std(listener).map_err(io_err(&paths.socket))?;
        launcher
            .events
            .set_nonblocking(true)
            .map_err(|e| ControllerError::Setup(e.to_string()))?;
        let events = tokio::net::UnixStream::from_std(launcher.events)
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
        let _ = done_rx.await;
        Ok::<(), ControllerError>(())
    });
    drop(tx);
    rt.shutdown_timeout(Duration::from_millis(200));
    let _ = engine_thread.join();
    let status = crate::sandbox::wait::reap_child(launcher.pid);
    if !matches!(status, Ok(nix::sys::wait::WaitStatus::Exited(_, 0))) {
        // Killed (it did not stop when asked) or crashed: its sandboxes are gone with it,
        // their cgroups are not; remove them as its successor would.
        if let Ok(Some(cgroups)) = crate::sandbox::cgroup::detect() {
            let swept = cgroups.sweep_stale();
            tracing::info!(count = swept.len(), "removed the launcher's cgroups");
        }
    }
    cleanup(&state, &paths.socket);
    result
}
