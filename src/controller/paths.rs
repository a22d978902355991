//! Where the controller keeps its socket, state and key by default: system directories
//! for root, the user's runtime and state directories (XDG) otherwise.

use std::path::PathBuf;

/// The controller's files, resolved from flags and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerPaths {
    /// The API socket (mode 0600 or 0660).
    pub socket: PathBuf,
    /// Audit trail, worker logs, lock and pid files.
    pub state_dir: PathBuf,
    /// The signing key file (mode 0600, owned by the caller).
    pub key: PathBuf,
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn env_dir(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// The default API socket: `/run/hatchery/controller.sock` for root,
/// `$XDG_RUNTIME_DIR/hatchery/controller.sock` otherwise (falling back to the state dir).
pub fn default_socket() -> PathBuf {
    if is_root() {
        return PathBuf::from("/run/hatchery/controller.sock");
    }
    match env_dir("XDG_RUNTIME_DIR") {
        Some(d) => d.join("hatchery/controller.sock"),
        None => default_state_dir().join("controller.sock"),
    }
}

/// The default state directory: `/var/lib/hatchery` for root, `$XDG_STATE_HOME/hatchery`
/// (or `~/.local/state/hatchery`) otherwise.
pub fn default_state_dir() -> PathBuf {
    if is_root() {
        return PathBuf::from("/var/lib/hatchery");
    }
    if let Some(d) = env_dir("XDG_STATE_HOME") {
        return d.join("hatchery");
    }
    if let Some(home) = env_dir("HOME").filter(|h| h.is_dir()) {
        return home.join(".local/state/hatchery");
    }
    let uid = nix::unistd::geteuid().as_raw();
    PathBuf::from(format!("/tmp/hatchery-{uid}/state"))
}

impl ControllerPaths {
    pub fn resolve(
        socket: Option<PathBuf>,
        state_dir: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> ControllerPaths {
        let state_dir = state_dir.unwrap_or_else(default_state_dir);
        let key = key.unwrap_or_else(|| state_dir.join("controller.key"));
        ControllerPaths {
            socket: socket.unwrap_or_else(default_socket),
            state_dir,
            key,
        }
    }
}
