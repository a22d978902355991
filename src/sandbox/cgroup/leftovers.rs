//! The cgroups of a `run` killed before it could remove them, found by any later run.
//!
//! A supervisor that is killed (SIGKILL, the OOM killer) takes its sandbox with it (pid 1
//! dies of its parent's death), but not the sandbox's cgroup directories: nothing is left
//! to remove them. A later run sweeps stale cgroups under its own cgroup, which finds
//! them only when it was started from the same place; each login session or service has
//! a cgroup of its own. So a privileged `run` notes the directories it is about to make
//! in `/run/hatchery/runs` (root's alone, reached without following symlinks), one small
//! file named after the cgroup, and removes the note once the directories are gone; any
//! later privileged run removes the directories of notes whose owner no longer exists,
//! once they are empty (see [`sweep`]).

use std::path::{Path, PathBuf};

use crate::paths::Dir;

const DIR: &str = "/run/hatchery";
const SUBDIR: &str = "runs";
/// The names this concerns: `run`'s (the controller sweeps its workers' itself).
const RUN_PREFIX: &str = "hatchery-run-";
/// A note names at most a few directories (one per hierarchy).
const MAX_NOTE_BYTES: u64 = 4096;
/// Notes looked at per sweep: enough for every run a host could have killed meanwhile.
const MAX_SWEPT: usize = 256;

/// A note that a cgroup's directories exist, taken away by [`Noted::done`]. Its file is
/// locked while the run lives (a lock goes with the process, however it ends): a run in
/// another pid namespace has a pid that means another process here, or none, so the
/// lock, not the pid, tells whether the note's run is gone.
pub(super) struct Noted {
    dir: &'static Dir,
    name: String,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// The notes' directory, opened once a process (the note and the sweep share it).
fn notes_dir() -> Option<&'static Dir> {
    static NOTES: std::sync::OnceLock<Option<Dir>> = std::sync::OnceLock::new();
    NOTES
        .get_or_init(|| {
            if !nix::unistd::geteuid().is_root() {
                return None;
            }
            let path = Path::new(DIR).join(SUBDIR);
            let dir = Dir::open(&path)
                .or_else(|_| {
                    Dir::create(Path::new(DIR), 0o755).and_then(|d| d.subdir(SUBDIR, 0o700))
                })
                .ok()?;
            // Refuse a directory that is not root's alone (someone made it before us).
            let st = dir.stat().ok()?;
            (st.st_uid == 0 && st.st_mode & 0o077 == 0).then_some(dir)
        })
        .as_ref()
}

/// Notes that `dirs` (the cgroup `name` in each hierarchy) are about to be made. `None`
/// for a name that is not `run`'s, for an unprivileged caller, or when the note cannot be
/// written (a run killed then leaves its cgroups to a run from the same cgroup, as before).
pub(super) fn note(name: &str, dirs: &[&Path]) -> Option<Noted> {
    if !name.starts_with(RUN_PREFIX) {
        return None;
    }
    let dir = notes_dir()?;
    let mut text = String::new();
    for d in dirs {
        text.push_str(d.to_str()?);
        text.push('\n');
    }
    // A sweep from another pid namespace may take the lock between the note's creation
    // and ours, and remove the note: a note no longer linked is made again, once.
    for _ in 0..2 {
        let file = dir.create_new(name, 0o600, false).ok()?;
        let forget = |_| {
            let _ = dir.remove(name);
        };
        let mut lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| forget(e))
            .ok()?;
        if nix::sys::stat::fstat(&*lock).is_ok_and(|st| st.st_nlink == 0) {
            continue;
        }
        if let Err(e) = std::io::Write::write_all(&mut *lock, text.as_bytes()) {
            forget(nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0)));
            return None;
        }
        return Some(Noted {
            dir,
            name: name.to_string(),
            _lock: lock,
        });
    }
    None
}

/// The lock of note `name`, taken, when the run that wrote it is gone: its lock could be
/// taken, and its pid (as this pid namespace sees it) is not that run's. Both: between a
/// note's creation and its lock, the pid says the run lives; a run in another pid
/// namespace holds the lock. Held while its cgroups are removed, so no run can take the
/// note for its own meanwhile.
fn gone_runs_lock(dir: &Dir, name: &str) -> Option<nix::fcntl::Flock<std::fs::File>> {
    let file = dir.open_read(name).ok()??;
    let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).ok()?;
    super::is_stale(name).then_some(lock)
}

impl Noted {
    /// The directories are gone: the note goes too.
    pub(super) fn done(self) {
        let _ = self.dir.remove(&self.name);
    }
}

/// What the note of cgroup `name` says of its run, where there is one: `Some(true)` while
/// the run lives (its lock is held), `Some(false)` once it is gone. A run in another pid
/// namespace has a pid that means another process here, or none, and its cgroup is empty
/// until its pid 1 joins it: the pid alone took it for a dead run's.
pub(super) fn note_says_alive(name: &str) -> Option<bool> {
    if !name.starts_with(RUN_PREFIX) {
        return None;
    }
    let dir = notes_dir()?;
    let file = dir.open_read(name).ok()??;
    Some(nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err())
}

/// Removes the cgroups of notes whose owner no longer exists, and their notes, by
/// `deadline` (the rest is left to the next sweep); returns the directories removed.
/// `own` are the caller's own cgroups: a directory that holds them is never touched.
///
/// Nothing is killed: a dead run's sandbox dies by itself (its pid 1 of its parent's
/// death, everything else with its pid namespace), but not at once. Its pid 1, tearing
/// down its namespaces, is still listed for a while after the run has ended, and a sweep
/// right then found the directories populated and skipped them. So the first sweep of a
/// note waits, within `deadline`, for its cgroups to empty; a note it gave up on is
/// marked (its modification time set to the epoch), and later sweeps remove its cgroups
/// once they are empty without waiting again: a process that will not die (stuck in the
/// kernel) costs one sweep's budget, not every later run's. Without `wait` (a run whose
/// deadline is near), only what is empty already is removed, and nothing is marked.
pub(super) fn sweep(own: &[&Path], wait: bool, deadline: std::time::Instant) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Some(dir) = notes_dir() else {
        return removed;
    };
    let names = dir.names().unwrap_or_default();
    let stale = names
        .iter()
        .filter_map(|n| n.to_str())
        .filter(|n| n.starts_with(RUN_PREFIX))
        .filter_map(|n| gone_runs_lock(dir, n).map(|lock| (n, lock)));
    for (name, lock) in stale.take(MAX_SWEPT) {
        let Ok(Some(bytes)) = dir.read(name, MAX_NOTE_BYTES) else {
            let _ = dir.remove(name);
            continue;
        };
        let waits = wait && nix::sys::stat::fstat(&*lock).is_ok_and(|st| st.st_mtime != 0);
        let text = String::from_utf8_lossy(&bytes);
        let mut all_gone = true;
        for path in text
            .lines()
            .map(Path::new)
            .filter(|p| names_cgroup(p, name))
        {
            if !path.exists() {
                continue;
            }
            // What holds the caller is no dead run's (root may have put it there), and
            // what is not a cgroup directory reached without a symbolic link is not one
            // this names.
            if own.iter().any(|o| o.starts_with(path)) || !is_cgroup_dir(path) {
                all_gone = false;
                continue;
            }
            let empty = !super::is_populated(path) || (waits && super::empties_by(path, deadline));
            match empty.then(|| super::remove_empty_tree(path, deadline)) {
                Some(Ok(())) => removed.push(path.to_path_buf()),
                _ => all_gone = false,
            }
        }
        if all_gone {
            let _ = dir.remove(name);
        } else if waits {
            let epoch = nix::sys::time::TimeSpec::new(0, 0);
            let _ = nix::sys::stat::futimens(&*lock, &epoch, &epoch);
        }
    }
    removed
}

/// Whether `path` is a directory of a cgroup file system, reached without following a
/// symbolic link (a note is root's, but is read as if it were not: `/sys/fs/cgroup` of a
/// v1 host is a tmpfs where root may have left a link to anywhere).
fn is_cgroup_dir(path: &Path) -> bool {
    use nix::sys::statfs::{CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, statfs};
    let unlinked = path.canonicalize().is_ok_and(|real| real == path);
    unlinked
        && statfs(path).is_ok_and(|fs| {
            let kind = fs.filesystem_type();
            kind == CGROUP_SUPER_MAGIC || kind == CGROUP2_SUPER_MAGIC
        })
}

/// Whether `path` is the cgroup `name` in a hierarchy under `/sys/fs/cgroup` (a note is
/// root's alone, but is read as if it were not: nothing else is ever removed).
fn names_cgroup(path: &Path, name: &str) -> bool {
    path.is_absolute()
        && path.starts_with("/sys/fs/cgroup")
        && path.file_name().and_then(|n| n.to_str()) == Some(name)
        && path.components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_only_ever_names_that_cgroup_under_the_cgroup_mount() {
        let name = "hatchery-run-1-2";
        assert!(names_cgroup(
            Path::new("/sys/fs/cgroup/memory/user/hatchery-run-1-2"),
            name
        ));
        for bad in [
            "/etc/hatchery-run-1-2",
            "/sys/fs/cgroup/memory/../../../etc/hatchery-run-1-2",
            "/sys/fs/cgroup/memory/hatchery-run-1-3",
            "sys/fs/cgroup/hatchery-run-1-2",
            "/sys/fs/cgroup",
        ] {
            assert!(!names_cgroup(Path::new(bad), name), "{bad}");
        }
    }
}
