//! Validation of the host paths a user asks to expose in a sandbox.
//!
//! A path the user names is resolved once, to a descriptor, and that descriptor is what
//! gets mounted: the path must be absolute, must not contain `.`/`..` components or
//! symlinks anywhere (a symlink could point somewhere the user did not mean), and must
//! exist. [`dir`] holds the same discipline for files hatchery itself reads and writes
//! in places a sandbox may write.

pub mod dir;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::OFlag;

pub use dir::Dir;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("{0}: must be an absolute path")]
    Relative(PathBuf),
    #[error("{0}: must not contain `.` or `..` components")]
    DotComponent(PathBuf),
    #[error("{0}: must not be the root directory")]
    Root(PathBuf),
    #[error("{0}: does not exist")]
    Missing(PathBuf),
    #[error("{path}: {component} is a symlink; name the real path ({target})")]
    Symlink {
        path: PathBuf,
        component: PathBuf,
        target: PathBuf,
    },
    #[error("{0}: is neither a regular file nor a directory")]
    Special(PathBuf),
    #[error("{path}: {reason}")]
    Other { path: PathBuf, reason: String },
}

/// Checks that `path` is absolute and has no `.`/`..` components (no filesystem access).
pub fn check_absolute_clean(path: &Path) -> Result<(), PathError> {
    if !path.is_absolute() {
        return Err(PathError::Relative(path.to_path_buf()));
    }
    // `Path::components` silently drops interior `.`, so look at the raw bytes too.
    let raw = path.as_os_str().as_encoded_bytes();
    let has_dot = raw
        .split(|b| *b == b'/')
        .any(|seg| seg == b"." || seg == b"..");
    if has_dot
        || path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err(PathError::DotComponent(path.to_path_buf()));
    }
    Ok(())
}

/// Makes a path the user typed absolute: a relative one (`./workspace`, `workspace`, `.`)
/// is taken from the current directory, as the kernel names it (`getcwd`: no symlinks, no
/// `.` or `..`), once, here. A `..` anywhere is refused as in an absolute path (it would
/// name something other than what is written), and so is a `.` inside an absolute path;
/// a leading or interior `.` of a relative path only means "here". The result still has
/// to pass [`check_host_path`] (or the caller's own checks), which resolves it without
/// following any symlink.
pub fn absolutize(path: &Path) -> Result<PathBuf, PathError> {
    if path.is_absolute() {
        check_absolute_clean(path)?;
        return Ok(path.to_path_buf());
    }
    if path.as_os_str().is_empty() {
        return Err(PathError::Other {
            path: path.to_path_buf(),
            reason: "empty path".into(),
        });
    }
    let raw = path.as_os_str().as_encoded_bytes();
    if raw.split(|b| *b == b'/').any(|seg| seg == b"..") {
        return Err(PathError::DotComponent(path.to_path_buf()));
    }
    let here = nix::unistd::getcwd().map_err(|e| PathError::Other {
        path: path.to_path_buf(),
        reason: format!(
            "a relative path needs the current directory, which cannot be read ({e}); give an absolute path"
        ),
    })?;
    if !here.is_absolute() {
        return Err(PathError::Other {
            path: path.to_path_buf(),
            reason: "the current directory is outside this process's root; give an absolute path"
                .into(),
        });
    }
    let mut out = here;
    for c in path.components() {
        if let Component::Normal(name) = c {
            out.push(name);
        }
    }
    check_absolute_clean(&out)?;
    Ok(out)
}

/// A host path checked for exposure, resolved once to a descriptor: what the sandbox
/// mounts is the object behind [`HostPath::fd`], never the path looked up again (a path
/// is only a name, and a sandbox that can write one of its directories can swap a
/// component between a check and a later lookup).
#[derive(Debug, Clone)]
pub struct HostPath {
    /// The path, normalised (no trailing or duplicate slashes).
    pub path: PathBuf,
    pub is_dir: bool,
    pub dev: u64,
    pub ino: u64,
    /// The owner and group of the object (for mapping a sandbox's writes to them).
    pub uid: u32,
    pub gid: u32,
    /// `O_PATH` descriptor of the object, opened without following any symlink.
    fd: Arc<OwnedFd>,
}

impl PartialEq for HostPath {
    fn eq(&self, other: &Self) -> bool {
        (&self.path, self.is_dir, self.dev, self.ino)
            == (&other.path, other.is_dir, other.dev, other.ino)
    }
}

impl Eq for HostPath {}

impl HostPath {
    /// The descriptor the path was resolved to.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens the very object that was resolved (never the path again) for reading, without
    /// blocking: a regular file only (a FIFO swapped in would otherwise block the opener).
    pub fn open_read(&self) -> std::io::Result<std::fs::File> {
        use std::os::fd::AsRawFd;
        let proc_path = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        let fd = nix::fcntl::open(
            proc_path.as_str(),
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(std::io::Error::from)?;
        let st = nix::sys::stat::fstat(&fd).map_err(std::io::Error::from)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG
            || (st.st_dev, st.st_ino) != (self.dev, self.ino)
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: not the regular file that was checked",
                    self.path.display()
                ),
            ));
        }
        Ok(std::fs::File::from(fd))
    }
}

/// Names the symlink that made a no-symlink resolution of `path` fail (for the message
/// only: the resolution itself never followed it).
fn symlink_error(path: &Path) -> PathError {
    let mut prefix = PathBuf::from("/");
    for comp in path.components().skip(1) {
        prefix.push(comp);
        match std::fs::symlink_metadata(&prefix) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&prefix).unwrap_or_default();
                return PathError::Symlink {
                    path: path.to_path_buf(),
                    component: prefix,
                    target,
                };
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    PathError::Other {
        path: path.to_path_buf(),
        reason: "a component is a symlink (or was swapped for one while it was checked)".into(),
    }
}

/// Validates a user-supplied host path for `--ro`/`--rw`: absolute, clean, not `/`, and
/// resolved in one `openat2` walk that follows no symlink (`RESOLVE_NO_SYMLINKS`) to an
/// existing directory or regular file, held open for the mount.
pub fn check_host_path(path: &Path) -> Result<HostPath, PathError> {
    check_absolute_clean(path)?;
    let normal: PathBuf = path.components().collect();
    if normal == Path::new("/") {
        return Err(PathError::Root(path.to_path_buf()));
    }
    let fd = dir::open_nofollow(&normal, OFlag::O_PATH).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => PathError::Missing(path.to_path_buf()),
        Some(libc::ELOOP) => symlink_error(&normal),
        _ => PathError::Other {
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
    })?;
    let st = nix::sys::stat::fstat(&fd).map_err(|e| PathError::Other {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFDIR && kind != libc::S_IFREG {
        return Err(PathError::Special(path.to_path_buf()));
    }
    Ok(HostPath {
        path: normal,
        is_dir: kind == libc::S_IFDIR,
        dev: st.st_dev,
        ino: st.st_ino,
        uid: st.st_uid,
        gid: st.st_gid,
        fd: Arc::new(fd),
    })
}

/// Opens an input file someone named (a profile, a contract, a manifest, a state file)
/// and reads at most `limit` bytes of it, plus one to tell that it is larger. Only a
/// regular file is read: a FIFO would block the reader until someone writes (for ever),
/// and a device (`/dev/zero`) never ends.
pub fn read_input(path: &Path, limit: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("is {what}, not a regular file"),
        ));
    }
    let mut bytes = Vec::new();
    file.take((limit as u64).saturating_add(1))
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Where an output file goes: standard output, or a name in a directory held open since
/// before anything untrusted ran (see [`dir`]).
#[derive(Debug)]
pub enum OutputTarget {
    /// `-`, or a symlink to this process's own stdout (`/dev/stdout`).
    Stdout,
    /// A symlink to this process's own stderr (`/dev/stderr`).
    Stderr,
    /// A character device (`/dev/null`, a terminal): written into, never replaced.
    Into { file: std::fs::File, path: PathBuf },
    File {
        dir: Dir,
        name: String,
        /// The directory as the caller named it, checked again after the write.
        parent: PathBuf,
    },
}

impl OutputTarget {
    /// `-` means standard output; anything else is a file whose directory must exist now
    /// (no symlink on the way) and take new files, so that a path that cannot be written
    /// is refused before any work is done.
    pub fn prepare(path: &Path) -> std::io::Result<OutputTarget> {
        if path == Path::new("-") {
            return Ok(OutputTarget::Stdout);
        }
        // This process's own descriptor, as `>(jq .)` names it (`/dev/fd/63`): written
        // into, opened again through its magic link (a pipe's is the same pipe).
        if let Some(stream) = own_stream(path) {
            return Ok(stream);
        }
        if let Some(n) = own_descriptor_number(path) {
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOCTTY)
                .open(format!("/proc/self/fd/{n}"))
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            return Ok(OutputTarget::Into {
                file,
                path: path.to_path_buf(),
            });
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|_| !path.as_os_str().as_encoded_bytes().ends_with(b"/"))
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "{}: not a file name (UTF-8, not ending in /)",
                        path.display()
                    ),
                )
            })?
            .to_string();
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = Dir::open(parent)?;
        let refused =
            |kind, what: String| std::io::Error::new(kind, format!("{}: {what}", path.display()));
        match dir.stat_entry(&name)?.map(|st| st.st_mode & libc::S_IFMT) {
            None | Some(libc::S_IFREG) => {}
            Some(libc::S_IFCHR) => {
                let file = dir.open_device(&name)?;
                let path = path.to_path_buf();
                return Ok(OutputTarget::Into { file, path });
            }
            Some(libc::S_IFLNK) => {
                let to = dir.read_link(&name)?;
                return match own_stream(&to) {
                    Some(stream) => Ok(stream),
                    None => Err(refused(
                        std::io::ErrorKind::InvalidInput,
                        format!(
                            "is a symlink (to {}): refusing to write through it or replace it; name the file itself",
                            to.display()
                        ),
                    )),
                };
            }
            Some(libc::S_IFDIR) => {
                return Err(refused(
                    std::io::ErrorKind::IsADirectory,
                    "is a directory".into(),
                ));
            }
            Some(kind) => {
                let what = match kind {
                    libc::S_IFIFO => "a FIFO",
                    libc::S_IFSOCK => "a socket",
                    libc::S_IFBLK => "a block device",
                    _ => "not a file",
                };
                return Err(refused(
                    std::io::ErrorKind::InvalidInput,
                    format!("is {what}: refusing to replace it; name a file or a character device"),
                ));
            }
        }
        dir.check_writable()?;
        Ok(OutputTarget::File {
            dir,
            name,
            parent: parent.to_path_buf(),
        })
    }

    /// Writes `bytes` whole (a file is replaced atomically, mode 0644).
    pub fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            OutputTarget::Stdout => write_whole(std::io::stdout().lock(), bytes),
            OutputTarget::Stderr => write_whole(std::io::stderr().lock(), bytes),
            OutputTarget::Into { file, .. } => write_whole(file, bytes),
            OutputTarget::File { dir, name, parent } => {
                dir.write_atomically(name, bytes, 0o644)?;
                // The file went into the directory held since before the command ran; if
                // that directory is no longer what the caller's path names (a sandbox
                // that could write its parent renamed it and put another there), whatever
                // the caller finds at the path is not hatchery's: say so.
                let held = dir.stat()?;
                let now = Dir::open(parent).and_then(|d| d.stat());
                if now.map(|st| (st.st_dev, st.st_ino)).ok() != Some((held.st_dev, held.st_ino)) {
                    let moved_to = std::fs::read_link(format!(
                        "/proc/self/fd/{}",
                        std::os::fd::AsRawFd::as_raw_fd(&dir.as_fd())
                    ))
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|_| "an unknown place".into());
                    return Err(std::io::Error::other(format!(
                        "{} was moved or replaced while the command ran: the report was written to {}/{name}; whatever is now at {} is not hatchery's",
                        parent.display(),
                        moved_to,
                        parent.join(name).display()
                    )));
                }
                Ok(())
            }
        }
    }

    /// What to call it in messages.
    pub fn describe(&self) -> String {
        match self {
            OutputTarget::Stdout => "standard output".into(),
            OutputTarget::Stderr => "standard error".into(),
            OutputTarget::Into { path, .. } => path.display().to_string(),
            OutputTarget::File { dir, name, .. } => dir.path().join(name).display().to_string(),
        }
    }
}

/// Writes `bytes` whole into `out` and flushes it.
fn write_whole(mut out: impl std::io::Write, bytes: &[u8]) -> std::io::Result<()> {
    out.write_all(bytes).and_then(|()| out.flush())
}

/// This process's stdout or stderr, when `to` (a path, or a symlink's text) is
/// `/proc/self/fd/1` or `2`, or `/dev/fd/1` or `2` (what `/dev/stdout` and `/dev/stderr`
/// say).
fn own_stream(to: &Path) -> Option<OutputTarget> {
    match own_descriptor_number(to)? {
        1 => Some(OutputTarget::Stdout),
        2 => Some(OutputTarget::Stderr),
        _ => None,
    }
}

/// N, when `path` is exactly `/proc/self/fd/N` or `/dev/fd/N` (decimal, no leading zero).
fn own_descriptor_number(path: &Path) -> Option<u32> {
    let n = path
        .to_str()?
        .strip_prefix("/proc/self/fd/")
        .or_else(|| path.to_str()?.strip_prefix("/dev/fd/"))?;
    let plain =
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'));
    plain.then(|| n.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_and_dotted_paths_are_refused() {
        assert!(matches!(
            check_absolute_clean(Path::new("usr")),
            Err(PathError::Relative(_))
        ));
        for p in ["/tmp/../etc", "/tmp/./x", "/..", "/a/b/.."] {
            assert!(
                matches!(
                    check_absolute_clean(Path::new(p)),
                    Err(PathError::DotComponent(_))
                ),
                "{p}"
            );
        }
        assert!(check_absolute_clean(Path::new("/usr/lib")).is_ok());
    }

    #[test]
    fn host_paths_must_exist_and_not_be_symlinks() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let real = dir.path().join("real");
        std::fs::create_dir(&real)?;
        std::os::unix::fs::symlink(&real, dir.path().join("link"))?;
        let canon = std::fs::canonicalize(&real)?;
        assert!(check_host_path(&canon).is_ok());
        let link = std::fs::canonicalize(dir.path())?.join("link");
        assert!(matches!(
            check_host_path(&link),
            Err(PathError::Symlink { .. })
        ));
        assert!(matches!(
            check_host_path(&canon.join("missing")),
            Err(PathError::Missing(_))
        ));
        assert!(matches!(
            check_host_path(Path::new("/")),
            Err(PathError::Root(_))
        ));
        Ok(())
    }
}
