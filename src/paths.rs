//! Validation of the host paths a user asks to expose in a sandbox.
//!
//! A path the user names is the path that gets mounted: it must be absolute, must not
//! contain `.`/`..` components or symlinks anywhere (a symlink could be swapped between
//! the check and the mount, or point somewhere the user did not mean), and must exist.
//! The sandbox re-checks the device and inode it opens against what was validated here.

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

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

/// A host path checked for exposure, with the identity the sandbox must find when it opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPath {
    /// The path, normalised (no trailing or duplicate slashes).
    pub path: PathBuf,
    pub is_dir: bool,
    pub dev: u64,
    pub ino: u64,
}

/// Validates a user-supplied host path for `--ro`/`--rw`.
pub fn check_host_path(path: &Path) -> Result<HostPath, PathError> {
    check_absolute_clean(path)?;
    let normal: PathBuf = path.components().collect();
    if normal == Path::new("/") {
        return Err(PathError::Root(path.to_path_buf()));
    }
    // Walk every prefix: none may be a symlink.
    let mut prefix = PathBuf::from("/");
    for comp in normal.components().skip(1) {
        prefix.push(comp);
        let meta = std::fs::symlink_metadata(&prefix).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => PathError::Missing(path.to_path_buf()),
            _ => PathError::Other {
                path: path.to_path_buf(),
                reason: e.to_string(),
            },
        })?;
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&prefix).unwrap_or_default();
            return Err(PathError::Symlink {
                path: path.to_path_buf(),
                component: prefix,
                target,
            });
        }
    }
    let meta = std::fs::symlink_metadata(&normal).map_err(|e| PathError::Other {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if !(meta.is_dir() || meta.is_file()) {
        return Err(PathError::Special(path.to_path_buf()));
    }
    Ok(HostPath {
        path: normal,
        is_dir: meta.is_dir(),
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// Writes a file whole or not at all (a temporary file beside it, then a rename), so that
/// a reader never sees half of it.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: not a file name", path.display()),
        )
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
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
