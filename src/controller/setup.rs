//! What a controller makes on disk to start: its private state directory (locked: one
//! controller each) and its API socket; and, for a start that fails, the removal of what
//! that start made, and only that.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{ControllerError, ControllerOptions, ControllerPaths, io_err, paths};
use crate::paths::Dir;

/// Creates `dir` (and parents), opens it (no symlink on the way) and makes it private to
/// the caller; a directory someone else owns is refused.
fn private_dir(dir: &Path, created: &mut Created) -> Result<Dir, ControllerError> {
    let (held, made) = Dir::create_all(dir, 0o700).map_err(io_err(dir))?;
    created.note_made(made, dir);
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
pub(super) fn check_socket_free(path: &Path) -> Result<bool, ControllerError> {
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
pub(super) struct Created {
    pub(super) state_dir: Option<PathBuf>,
    pub(super) key: Option<PathBuf>,
    socket: Option<PathBuf>,
    /// Directories this start made above the state directory and the socket, outermost
    /// first: removed after them, innermost first, and only while empty (another start
    /// may have put something there meanwhile).
    parents: Vec<PathBuf>,
}

impl Created {
    /// Notes what does not exist yet (and so would be this start's to remove).
    pub(super) fn before(paths: &ControllerPaths) -> Created {
        let absent = |p: &Path| matches!(std::fs::symlink_metadata(p), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
        let state_dir = absent(&paths.state_dir).then(|| paths.state_dir.clone());
        let key = absent(&paths.key).then(|| paths.key.clone());
        Created {
            state_dir,
            key,
            socket: None,
            parents: Vec::new(),
        }
    }

    /// Notes the directories a [`Dir::create_all`] of `target` made, but `target` itself,
    /// whose removal is decided on its own.
    fn note_made(&mut self, made: Vec<PathBuf>, target: &Path) {
        self.parents
            .extend(made.into_iter().filter(|p| p.as_path() != target));
    }

    pub(super) fn keep(mut self) {
        self.state_dir = None;
        self.key = None;
        self.socket = None;
        self.parents.clear();
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
        for parent in self.parents.drain(..).rev() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// The state directory as this controller holds it while it runs.
pub(super) struct HeldState {
    pub(super) dir: Dir,
    /// `workers/`, private: the launcher writes worker logs through it.
    pub(super) workers: Dir,
    /// One controller per state directory, for as long as this is held.
    pub(super) lock: nix::fcntl::Flock<File>,
    /// The pid a controller that did not stop cleanly left behind.
    pub(super) crashed_pid: Option<String>,
}

/// Makes (or opens) the private state directory and its `workers/`, then takes its lock;
/// what `created` may remove on failure is narrowed to what is proven this start's.
pub(super) fn hold_state_dir(
    paths: &ControllerPaths,
    created: &mut Created,
) -> Result<HeldState, ControllerError> {
    for p in [&paths.state_dir, &paths.socket] {
        paths::check_fallback_base(p, paths::BaseUse::Create).map_err(ControllerError::Setup)?;
    }
    tracing::debug!(state_dir = %paths.state_dir.display(), "opening the state directory");
    let state = private_dir(&paths.state_dir, created).inspect_err(|_| {
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
    let lock = lock_state(&state).inspect_err(|_| {
        created.state_dir = None;
        created.key = None;
    })?;
    let pid_file = paths.state_dir.join("controller.pid");
    let crashed_pid = state
        .read("controller.pid", 64)
        .map_err(io_err(&pid_file))?
        .map(|b| String::from_utf8_lossy(&b).trim().to_string());
    Ok(HeldState {
        dir: state,
        workers,
        lock,
        crashed_pid,
    })
}

/// Binds the API socket (after removing a dead controller's) with the mode and group
/// the options ask for; true alongside when a stale socket was removed.
pub(super) fn bind_socket(
    opts: &ControllerOptions,
    created: &mut Created,
) -> Result<(std::os::unix::net::UnixListener, bool), ControllerError> {
    let socket = &opts.paths.socket;
    if let Some(parent) = socket.parent() {
        // Through symlinks, as `bind` itself resolves the path (`/var/run` is one).
        let missing: Vec<PathBuf> = parent
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && std::fs::symlink_metadata(p).is_err())
            .map(Path::to_path_buf)
            .collect();
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        created.note_made(missing.into_iter().rev().collect(), Path::new(""));
    }
    let stale_socket = clear_stale_socket(socket)?;
    tracing::debug!(socket = %socket.display(), "binding the API socket");
    let listener = std::os::unix::net::UnixListener::bind(socket).map_err(io_err(socket))?;
    created.socket = Some(socket.clone());
    let mode = if opts.socket_group.is_some() {
        0o660
    } else {
        0o600
    };
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(mode))
        .map_err(io_err(socket))?;
    if let Some(gid) = opts.socket_group {
        nix::unistd::chown(socket, None, Some(nix::unistd::Gid::from_raw(gid)))
            .map_err(|e| io_err(socket)(e.into()))?;
    }
    Ok((listener, stale_socket))
}
