//! A sandbox's cgroup directory held by descriptor, its control files opened relative to
//! it.
//!
//! cgroupfs (kernfs) takes no lookup in RCU mode: every component of a path below a
//! hierarchy's mount takes the hierarchy's lock twice (revalidation and permission), the
//! lock that another sandbox's `mkdir` and `rmdir` take for writing once per control file
//! they add or remove. A limit written or a counter read by its full path
//! (`/sys/fs/cgroup/memory/<own>/<sandbox>/memory.limit_in_bytes`) walked every level again;
//! relative to the held directory it is one lookup. And a control file is only ever opened,
//! never created or truncated (`File::create` asks for both, which makes the kernel look
//! the name up under the directory's own lock and call `setattr` on it).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use super::{CgroupError, io_err};

#[derive(Debug)]
pub(crate) struct ControlDir {
    path: PathBuf,
    /// The directory, until [`ControlDir::release`]; then files are reached by path.
    fd: Option<OwnedFd>,
}

impl ControlDir {
    /// Opens the cgroup directory at `path` (a symlink on the way is refused). The
    /// directory is made, and removed, by its path: a cgroup is where its path says, or
    /// not made at all (a base directory renamed meanwhile makes the `mkdir` fail).
    pub(crate) fn open(path: &Path) -> io::Result<ControlDir> {
        let fd = crate::paths::dir::open_nofollow(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        Ok(ControlDir {
            path: path.to_path_buf(),
            fd: Some(fd),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the directory: later files are opened by their path (no symlink followed).
    /// For a supervisor of many sandboxes, whose open-file limit would otherwise bound how
    /// many it may run.
    pub(crate) fn release(&mut self) {
        self.fd = None;
    }

    /// Opens the control file `name`, which is one fixed file name of the kernel's.
    fn open_file(&self, name: &str, flags: OFlag) -> io::Result<OwnedFd> {
        match &self.fd {
            Some(fd) => openat(
                fd,
                name,
                flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
                Mode::empty(),
            )
            .map_err(io::Error::from),
            None => crate::paths::dir::open_nofollow(&self.path.join(name), flags),
        }
    }

    /// Opens `name` for writing, for a process that writes to it later.
    pub(crate) fn open_write(&self, name: &str) -> Result<OwnedFd, CgroupError> {
        self.open_file(name, OFlag::O_WRONLY)
            .map_err(io_err(&self.path.join(name)))
    }

    /// Writes `value` to `name` in one write, as the kernel takes a control file's value.
    pub(crate) fn write(&self, name: &str, value: &str) -> Result<(), CgroupError> {
        self.write_in(name, value)
            .map_err(io_err(&self.path.join(name)))
    }

    /// [`ControlDir::write`] where the kernel may not have the file (a controller's
    /// optional file): false when it has not.
    pub(crate) fn write_if_present(&self, name: &str, value: &str) -> Result<bool, CgroupError> {
        match self.write_in(name, value) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err(&self.path.join(name))(e)),
        }
    }

    fn write_in(&self, name: &str, value: &str) -> io::Result<()> {
        File::from(self.open_file(name, OFlag::O_WRONLY)?).write_all(value.as_bytes())
    }

    /// The text of `name`, bounded as every file the kernel generates is read.
    pub(crate) fn read(&self, name: &str) -> Option<String> {
        let fd = self.open_file(name, OFlag::O_RDONLY).ok()?;
        crate::sandbox::kernel_text::read_file(File::from(fd)).ok()
    }

    pub(crate) fn read_u64(&self, name: &str) -> Option<u64> {
        self.read(name)?.trim().parse().ok()
    }

    /// Reads `key value` from a flat-keyed file such as `memory.oom_control`.
    pub(crate) fn read_key(&self, name: &str, key: &str) -> Option<u64> {
        super::find_key(&self.read(name)?, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_files_are_opened_in_the_held_directory_never_made_or_followed() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let dir = tmp.path().join("sb");
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir: {e}"));
        std::fs::write(dir.join("pids.max"), "max\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            dir.join("memory.oom_control"),
            "oom_kill_disable 0\noom_kill 3\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut held = ControlDir::open(&dir).unwrap_or_else(|e| panic!("open: {e}"));
        // The directory moves away: what is held is the directory, not its path.
        let moved = tmp.path().join("moved");
        std::fs::rename(&dir, &moved).unwrap_or_else(|e| panic!("rename: {e}"));
        let w = held.write("pids.max", "64");
        assert!(w.is_ok(), "{w:?}");
        // Written over, not truncated: a kernel control file takes each write whole.
        assert_eq!(
            std::fs::read_to_string(moved.join("pids.max"))
                .ok()
                .as_deref(),
            Some("64x\n")
        );
        assert_eq!(held.read_key("memory.oom_control", "oom_kill"), Some(3));
        // A file the kernel does not have is neither made nor an error where optional.
        assert_eq!(
            held.write_if_present("memory.kmem.tcp.limit_in_bytes", "1")
                .ok(),
            Some(false)
        );
        assert!(!moved.join("memory.kmem.tcp.limit_in_bytes").exists());
        assert!(held.write("cpu.cfs_quota_us", "1").is_err());
        assert!(!moved.join("cpu.cfs_quota_us").exists());
        // A symlink in the directory is not followed.
        let target = tmp.path().join("elsewhere");
        std::fs::write(&target, "").unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(&target, moved.join("tasks")).unwrap_or_else(|e| panic!("{e}"));
        assert!(held.open_write("tasks").is_err());
        assert!(held.write("tasks", "0").is_err());
        assert_eq!(std::fs::read_to_string(&target).ok().as_deref(), Some(""));
        // Released, the directory is reached by its path, and a symlink still not followed.
        held.release();
        assert!(held.write("pids.max", "1").is_err(), "its path is gone");
        std::fs::rename(&moved, &dir).unwrap_or_else(|e| panic!("rename: {e}"));
        assert_eq!(held.read_u64("pids.max"), None);
        let w = held.write("pids.max", "7");
        assert!(w.is_ok(), "{w:?}");
        assert_eq!(held.read("pids.max").as_deref(), Some("74x\n"));
        assert!(held.write("tasks", "0").is_err());
        assert_eq!(std::fs::read_to_string(&target).ok().as_deref(), Some(""));
    }
}
