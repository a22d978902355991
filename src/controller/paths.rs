//! Where the controller keeps its socket, state and key by default: system directories
//! for root, the user's runtime and state directories (XDG) otherwise.

use std::path::{Path, PathBuf};

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

/// The default state directory: `/var/lib/hatchery` for root; otherwise
/// `$XDG_STATE_HOME/hatchery`, else `$HOME/.local/state/hatchery` (when `HOME` is an
/// existing directory), else `/tmp/hatchery-UID/state` (checked before use).
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
    fallback_base().join("state")
}

/// The last resort for a user with neither `XDG_STATE_HOME` nor a home directory:
/// `/tmp/hatchery-UID`. Anyone can create a name in `/tmp`, so before it is used it must
/// be a directory (not a symlink) of this user's that no one else may write: see
/// [`check_fallback_base`].
pub fn fallback_base() -> PathBuf {
    let uid = nix::unistd::geteuid().as_raw();
    PathBuf::from(format!("/tmp/hatchery-{uid}"))
}

/// What the caller is about to do with a path in the fallback base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseUse {
    /// Reach a controller (or its trail) there: the base must already be the caller's.
    Reach,
    /// Look before starting: an absent base is fine (it will be made).
    Look,
    /// Start there: make the base (mode 0700) when absent.
    Create,
}

/// Checks (and for [`BaseUse::Create`], makes, mode 0700) the fallback base when `path`
/// lies in it; a path elsewhere is not this check's business. The refusal is one line
/// saying what to do instead.
pub fn check_fallback_base(path: &Path, using: BaseUse) -> Result<(), String> {
    let create = using == BaseUse::Create;
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let base = fallback_base();
    if !path.starts_with(&base) {
        return Ok(());
    }
    let advice =
        "set XDG_STATE_HOME (or HOME to a directory of yours), or pass --state-dir and --socket";
    let meta = match std::fs::symlink_metadata(&base) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            match std::fs::DirBuilder::new().mode(0o700).create(&base) {
                Ok(()) => {}
                // Someone made it meanwhile: judged below like any other.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot create {}: {e}; {advice}", base.display())),
            }
            std::fs::symlink_metadata(&base)
                .map_err(|e| format!("cannot read {}: {e}; {advice}", base.display()))?
        }
        // Nothing there yet, and nothing to create (a client looking for a socket): no
        // controller of this user's runs. Said now, not left to the connect, because
        // another user could make the directory between this look and a connect by path.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && using == BaseUse::Look => {
            return Ok(());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "no controller of this user's: {} does not exist (start `hatchery controller` first, or {advice})",
                base.display()
            ));
        }
        Err(e) => return Err(format!("cannot read {}: {e}; {advice}", base.display())),
    };
    let me = nix::unistd::geteuid().as_raw();
    let problem = if meta.file_type().is_symlink() {
        Some("is a symbolic link".to_string())
    } else if !meta.is_dir() {
        Some("is not a directory".to_string())
    } else if meta.uid() != me {
        Some(format!(
            "belongs to uid {}, not to this user ({me})",
            meta.uid()
        ))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "can be written by others (mode {:o})",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match problem {
        Some(p) => Err(format!(
            "{} {p}: someone else may have made it, so the controller's state and socket are not kept there; {advice}",
            base.display()
        )),
        None => Ok(()),
    }
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

/// The controller's own files and directories: its state directory (key, audit trail,
/// worker logs), socket, key, contract and audit anchor file. A worker given a path that
/// holds one of them, or lies inside one, could read the key and sign as the controller,
/// connect to the socket as its owner, or rewrite the trail or the contract: where the
/// worker runs as the controller's own user (rootless, with a read-write path), nothing
/// else stands in the way. So no worker is given one, read-only or not. The controller's
/// own program is one too, for writing only (every worker runs it, read-only, as its
/// agent): a worker that replaced it would run as the operator at the next command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnFiles {
    /// Given to no worker.
    secret: Vec<PathBuf>,
    /// Given to no worker that may write there.
    programs: Vec<PathBuf>,
}

/// Each of `paths` as given (when absolute) and as the filesystem resolves it now
/// (symlinks followed): exposed paths hold no symlink, so the resolved form is the one an
/// exposure names.
fn both_forms<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in paths {
        let resolved = std::fs::canonicalize(p).ok();
        for form in std::iter::once(p.to_path_buf()).chain(resolved) {
            if form.is_absolute() && !out.contains(&form) {
                out.push(form);
            }
        }
    }
    out
}

impl OwnFiles {
    /// `secret`: the state directory, socket, key, contract and anchor; `programs`: the
    /// controller's own executable.
    pub fn new<'a>(
        secret: impl IntoIterator<Item = &'a Path>,
        programs: impl IntoIterator<Item = &'a Path>,
    ) -> OwnFiles {
        OwnFiles {
            secret: both_forms(secret),
            programs: both_forms(programs),
        }
    }

    /// The first of `exposures` (each with whether it is writable) that holds one of the
    /// controller's files or lies inside one, with that file. Components are compared, not
    /// characters (`/srv/hatchery2` does not hold `/srv/hatchery`).
    pub fn held_by<'a>(
        &'a self,
        exposures: impl IntoIterator<Item = (&'a Path, bool)>,
    ) -> Option<(&'a Path, &'a Path)> {
        exposures.into_iter().find_map(|(e, writable)| {
            let programs = self.programs.iter().filter(|_| writable);
            self.secret
                .iter()
                .chain(programs)
                .find(|own| own.starts_with(e) || e.starts_with(own))
                .map(|own| (e, own.as_path()))
        })
    }
}

#[cfg(test)]
mod own_files_tests {
    use super::*;

    #[test]
    fn a_path_holding_or_inside_the_controllers_files_is_found_and_no_other() {
        let own = OwnFiles::new(
            [
                Path::new("/home/u/.local/state/hatchery"),
                Path::new("/run/user/1000/hatchery/controller.sock"),
            ],
            [Path::new("/home/u/.cargo/bin/hatchery")],
        );
        for held in [
            "/",
            "/home",
            "/home/u",
            "/home/u/.local/state/hatchery",
            "/home/u/.local/state/hatchery/controller.key",
            "/run/user/1000",
            "/run/user/1000/hatchery/controller.sock",
        ] {
            assert!(own.held_by([(Path::new(held), false)]).is_some(), "{held}");
        }
        for apart in [
            "/home/u/proj",
            "/home/u/.local/state/hatchery2",
            "/home/u/.local/state/hatcher",
            "/run/user/1000/other",
            "/tmp",
        ] {
            assert_eq!(own.held_by([(Path::new(apart), true)]), None, "{apart}");
        }
        // The program may be read (every worker runs it), never written.
        for dir in [
            "/home/u/.cargo",
            "/home/u/.cargo/bin",
            "/home/u/.cargo/bin/hatchery",
        ] {
            assert_eq!(own.held_by([(Path::new(dir), false)]), None, "{dir}");
            assert!(own.held_by([(Path::new(dir), true)]).is_some(), "{dir}");
        }
        let (e, o) = own
            .held_by([(Path::new("/tmp"), true), (Path::new("/home/u"), false)])
            .unwrap_or((Path::new(""), Path::new("")));
        assert_eq!(
            (e, o),
            (
                Path::new("/home/u"),
                Path::new("/home/u/.local/state/hatchery")
            )
        );
    }

    #[test]
    fn a_file_reached_through_a_symlink_is_known_by_its_real_path_too() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap_or_else(|e| panic!("{e}"));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap_or_else(|e| panic!("{e}"));
        let own = OwnFiles::new([link.join("state").as_path(), link.as_path()], []);
        let real = std::fs::canonicalize(&real).unwrap_or(real);
        assert!(own.held_by([(real.as_path(), false)]).is_some(), "{own:?}");
        assert!(own.held_by([(link.as_path(), false)]).is_some(), "{own:?}");
    }
}
