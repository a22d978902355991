//! Resource limits and accounting through cgroups: one [`CgroupManager`] trait with a v1
//! and a v2 backend, chosen from what the host actually mounts.
//!
//! Every sandbox gets its own cgroup, created before the sandbox starts and removed after
//! its last process is gone. Limits are written with cgroups-rs's controllers on v2, and on
//! v1 into the directory held open (`control.rs`, which says why); accounting (peak memory,
//! CPU time, peak tasks, OOM kills) is read from the cgroup's own files so the report
//! states what the kernel counted, not what hatchery estimated.

mod control;
mod kill;
pub mod layout;
mod leftovers;
mod v1;
mod v2;

use std::fmt;
use std::io::{self, BufRead};
use std::ops::ControlFlow;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

pub(crate) use kill::kill_procs_until_empty;
pub use layout::Layout;

/// Prefix of every cgroup hatchery creates; the sweep only ever touches these.
pub const NAME_PREFIX: &str = "hatchery-";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CgroupVersion {
    #[serde(rename = "v1")]
    V1,
    #[serde(rename = "v2")]
    V2,
}

impl fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        })
    }
}

/// The limits a sandbox asks for; `None` means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Limits {
    pub memory: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.memory.is_none() && self.cpus.is_none() && self.pids.is_none()
    }
}

/// Which limit-enforcing controllers a backend can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Controllers {
    pub memory: bool,
    pub cpu: bool,
    pub pids: bool,
    /// Swap can be held at zero (v1 `memsw`, v2 `memory.swap.max`), or the host has no swap.
    pub swap_off: bool,
}

/// What the kernel counted for a sandbox's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Usage {
    pub cpu_usec: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub pids_peak: Option<u64>,
    /// Processes the OOM killer killed in this cgroup.
    pub oom_kills: u64,
    /// Forks refused because the pids limit was reached.
    pub pids_limit_hits: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{0}")]
    Controller(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}: still has processes after the kill deadline")]
    Busy(PathBuf),
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn controller_err(what: &str, path: &Path, e: impl fmt::Display) -> CgroupError {
    CgroupError::Controller(format!("{what} in {}: {e}", path.display()))
}

/// A host's cgroup backend: creates sandbox cgroups where this process may.
pub trait CgroupManager: Send + Sync {
    fn version(&self) -> CgroupVersion;
    /// The controllers that can enforce limits here.
    fn controllers(&self) -> Controllers;
    /// Where sandbox cgroups are created (for diagnostics).
    fn base(&self) -> PathBuf;
    /// Creates a cgroup named `name` with `limits` applied. Fails without leaving a trace.
    fn create(&self, name: &str, limits: &Limits) -> Result<Box<dyn SandboxCgroup>, CgroupError>;
    /// Removes cgroups left behind by hatchery processes that no longer exist. `wait`:
    /// whether a dead run's sandbox still dying may be waited for (up to
    /// [`SWEEP_BUDGET`], once per note); a run with less time than that before its own
    /// deadline must not be held past it, and leaves them to a later sweep.
    fn sweep_stale(&self, wait: bool) -> Vec<PathBuf>;
    /// Undoes what preparing the base did (v2: the supervisor's move into a leaf).
    fn release(&self) {}
}

/// One sandbox's cgroup.
pub trait SandboxCgroup: Send {
    /// The cgroup's directory (the memory hierarchy's on v1).
    fn path(&self) -> &Path;
    /// A directory fd for `clone3(CLONE_INTO_CGROUP)`, where the backend supports it.
    fn clone_into_fd(&self) -> Option<BorrowedFd<'_>>;
    /// Moves a process (all its threads) into the cgroup.
    fn attach(&self, pid: i32) -> Result<(), CgroupError>;
    /// Files the sandbox writes `0` to, to move itself in, in place of [`attach`]. On v1 a
    /// process moved by another one makes the kernel take its cgroup threadgroup lock,
    /// which waits for an RCU grace period when the lock has been idle (10-25 ms); a
    /// single thread that moves itself through `tasks` skips that lock. Opened here, by
    /// the supervisor, just before the clone; empty where the supervisor attaches (or the
    /// sandbox is born inside).
    ///
    /// [`attach`]: SandboxCgroup::attach
    fn self_join_files(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        Ok(Vec::new())
    }
    fn usage(&self) -> Usage;
    /// Kills every process in the cgroup and waits until it is empty.
    fn kill_all(&self) -> Result<(), CgroupError>;
    /// Kills every process in the cgroup through `cgroup.kill`, where the kernel has it, and
    /// returns without waiting for any to end: a supervisor that kills many sandboxes at
    /// once (the kill switch) lets the kernel tear them down side by side and reaps each as
    /// it ends; [`SandboxCgroup::destroy`] waits for what is left. For good measure only:
    /// the SIGKILL to a sandbox's pid 1 already takes its whole pid namespace along. So
    /// nothing is signalled by a number read from `cgroup.procs` here (without
    /// `cgroup.kill`: cgroup v1, or Linux before 5.14), which the host may have reused by
    /// the time it is signalled, while the kernel reaps the namespace.
    fn kill_now(&self);
    fn is_empty(&self) -> bool;
    /// Closes descriptors held only to make this sandbox's start and end cheaper (v1: its
    /// directories, see `control.rs`); the cgroup is then reached by its path. Called by a
    /// supervisor of many sandboxes, whose open-file limit bounds how many it may hold.
    fn release_descriptors(&mut self) {}
    /// Kills what is left, waits until the cgroup is empty, and removes it.
    fn destroy(&mut self) -> Result<(), CgroupError>;
}

/// Detects the host's backend: v2 when `/sys/fs/cgroup`-style unified mode offers
/// controllers, else v1 when memory/cpu/pids hierarchies are mounted, else none.
pub fn detect() -> Result<Option<Box<dyn CgroupManager>>, CgroupError> {
    let layout = Layout::current().map_err(io_err(Path::new("/proc/self/mountinfo")))?;
    let root_user = nix::unistd::geteuid().is_root();
    let has_v1 = ["memory", "cpu", "pids"]
        .iter()
        .any(|c| layout.v1_mount(c).is_some());
    if !has_v1 {
        if let Some(m) = v2::V2Manager::detect(&layout, root_user)? {
            return Ok(Some(Box::new(m)));
        }
    }
    if let Some(m) = v1::V1Manager::detect(&layout, root_user) {
        return Ok(Some(Box::new(m)));
    }
    Ok(None)
}

/// A cgroup name unique to this process: `hatchery-<kind>-<pid>-<starttime>-n<pidns>`.
/// The start time lets the sweep tell a dead owner from a recycled pid.
pub fn unique_name(kind: &str) -> String {
    format!("{NAME_PREFIX}{kind}-{}", owner_suffix())
}

/// The `<pid>-<starttime>-n<pidns>` that ends the names of this process's cgroups (see
/// [`unique_name`]).
pub fn owner_suffix() -> String {
    let pid = std::process::id();
    owner_tag(pid, process_start_time(pid).unwrap_or(0))
}

/// The end of the names of the cgroups owned by process `pid` of this pid namespace,
/// started at `start`. A pid and a start tick name a process only within its pid
/// namespace: two containers' runs can both be pid 1 and start in the same tick, and
/// the second one's `mkdir` met the first one's cgroup. Live pid namespaces never share
/// an inode number, so with it the name is the process's alone.
pub fn owner_tag(pid: u32, start: u64) -> String {
    match own_pid_namespace() {
        Some(ns) => format!("{pid}-{start}-{PID_NS_MARK}{ns}"),
        None => format!("{pid}-{start}"),
    }
}

/// What starts a name's last part when it is the owner's pid namespace (a start time is
/// digits only).
const PID_NS_MARK: char = 'n';

/// This process's pid namespace (the inode of `/proc/self/ns/pid`), read once: a process
/// never changes its own.
fn own_pid_namespace() -> Option<u64> {
    static NS: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        nix::sys::stat::stat("/proc/self/ns/pid")
            .ok()
            .map(|st| st.st_ino)
    })
}

/// A name's owner: its pid and start time, without the pid namespace where one ends it.
fn name_owner(rest: &str) -> Option<(u32, u64)> {
    let rest = match rest.rsplit_once('-') {
        Some((head, last))
            if last
                .strip_prefix(PID_NS_MARK)
                .is_some_and(|ns| !ns.is_empty() && ns.bytes().all(|b| b.is_ascii_digit())) =>
        {
            head
        }
        _ => rest,
    };
    let mut parts = rest.rsplitn(3, '-');
    let (start, pid) = (parts.next()?, parts.next()?);
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// The start time (clock ticks since boot, field 22 of `/proc/PID/stat`) of a process.
pub fn process_start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, start)| start)
}

/// A process's state letter (field 3 of `/proc/PID/stat`) and start time (field 22), from
/// one read.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    if pid == std::process::id() {
        // This process: alive, and its start time never changes (read once, not at every
        // name made or swept).
        return parse_stat(&super::kernel_text::own_stat_fields()?);
    }
    parse_stat(&super::kernel_text::stat_fields(format!("/proc/{pid}/stat")).ok()?)
}

/// [`proc_stat`]'s parse of the fields after the command name (see
/// [`super::kernel_text::stat_fields`]).
fn parse_stat(rest: &str) -> Option<(char, u64)> {
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Whether a hatchery cgroup name belongs to a process that no longer exists.
pub(crate) fn is_stale(name: &str) -> bool {
    let Some((pid, start)) = name.strip_prefix(NAME_PREFIX).and_then(name_owner) else {
        return false;
    };
    // A zombie owner (dead, not yet reaped — its parent died too) counts as gone.
    match proc_stat(pid) {
        Some((state, now)) => now != start || matches!(state, 'Z' | 'X'),
        None => true,
    }
}

pub(crate) fn read_string(path: &Path) -> Option<String> {
    super::kernel_text::read(path).ok()
}

pub(crate) fn read_u64(path: &Path) -> Option<u64> {
    read_string(path)?.trim().parse().ok()
}

/// Reads `key value` from a flat-keyed file such as `memory.events` or `cpu.stat`.
pub(crate) fn read_key(path: &Path, key: &str) -> Option<u64> {
    find_key(&read_string(path)?, key)
}

/// The value of `key` in the text of a flat-keyed file (`key value` lines).
pub(crate) fn find_key(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

pub(crate) fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io_err(path))
}

/// Calls `each` with the PIDs listed in `dir`'s `cgroup.procs`, in order, until it says
/// stop. Read in pieces, never held whole: how long the list is, a sandbox decides (a line
/// per process it forks), so neither a bound on its length nor its whole length in memory.
pub(crate) fn each_proc(
    dir: &Path,
    mut each: impl FnMut(i32) -> ControlFlow<()>,
) -> io::Result<()> {
    let list = std::fs::File::open(dir.join("cgroup.procs"))?;
    for line in io::BufReader::new(list).split(b'\n') {
        let line = line?;
        let Some(pid) = std::str::from_utf8(&line)
            .ok()
            .and_then(|l| l.trim().parse().ok())
        else {
            continue;
        };
        if each(pid).is_break() {
            break;
        }
    }
    Ok(())
}

/// Whether the cgroup `dir` holds no process: listed empty, or gone. One whose list cannot
/// be read is not taken for empty.
pub(crate) fn holds_nothing(dir: &Path) -> bool {
    let mut listed = false;
    let read = each_proc(dir, |_| {
        listed = true;
        ControlFlow::Break(())
    });
    match read {
        Ok(()) => !listed,
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

/// Removes `dir` if nothing holds it: true once it is gone. How a sandbox's cgroup usually
/// ends (its processes went with its pid 1), without listing its processes first; anything
/// else (busy, not ours to remove) is left to the kill-and-retry path.
pub(crate) fn removed_at_once(dir: &Path) -> bool {
    match std::fs::remove_dir(dir) {
        Ok(()) => true,
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

/// Removes an empty cgroup directory, retrying while the kernel still reports it busy.
///
/// Right after its last process exits a cgroup stays busy for a fraction of a millisecond
/// (the exiting tasks are unlinked asynchronously); poll with a short, growing back-off
/// instead of sleeping a fixed, long time.
pub(crate) fn remove_when_empty(dir: &Path, deadline: Instant) -> Result<(), CgroupError> {
    let mut pause = Duration::from_micros(20);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
            Err(e) => return Err(io_err(dir)(e)),
        }
    }
}

/// How long one sweep of stale cgroups may take in all. A sweep runs in a `run` while its
/// sandbox does; what a dead run left usually goes in well under a millisecond, and a
/// pid 1 still dying in a few, more on a busy host or for a sandbox with much memory to
/// give back. A process that never leaves costs one sweep this once: the note is marked,
/// and later sweeps do not wait on it.
pub const SWEEP_BUDGET: Duration = Duration::from_secs(2);

/// Waits until no process is in `dir`, or `deadline`: whether it emptied.
pub(crate) fn empties_by(dir: &Path, deadline: Instant) -> bool {
    loop {
        if !is_populated(dir) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Removes `dir` and the cgroups below it, children first, by `deadline`, killing
/// nothing: a cgroup that holds a process is left, and so is everything above it.
pub(crate) fn remove_empty_tree(dir: &Path, deadline: Instant) -> Result<(), CgroupError> {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_empty_tree(&e.path(), deadline)?;
            }
        }
    }
    if is_populated(dir) {
        return Err(CgroupError::Busy(dir.to_path_buf()));
    }
    remove_when_empty(dir, deadline)
}

/// Whether a process is in `dir` (or it cannot be told: then it is left alone).
pub(crate) fn is_populated(dir: &Path) -> bool {
    read_string(&dir.join("cgroup.procs")).is_none_or(|procs| !procs.trim().is_empty())
}

/// Sweeps stale hatchery cgroups directly under `base`, by `deadline`.
pub(crate) fn sweep_dir(base: &Path, deadline: Instant) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(base) else {
        return removed;
    };
    // This process's own cgroups (a run's, a launcher's workers') live as long as it does:
    // not looked at (a run's note was looked up, and locked, once for each hierarchy).
    let me = std::process::id();
    let own = process_start_time(me).map(|start| format!("-{}", owner_tag(me, start)));
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if own.as_deref().is_some_and(|tag| name.ends_with(tag)) {
            continue;
        }
        // A cgroup with processes is not one a dead supervisor left (its sandbox died with
        // it): it may be a live run's in another pid namespace, whose pid means another
        // process here.
        // A run's note, where it has one, says whether it lives; else its pid does.
        let gone = leftovers::note_says_alive(name).map_or_else(|| is_stale(name), |alive| !alive);
        // Nothing is killed: what holds a process below it too is no dead run's to take.
        if gone && !is_populated(&e.path()) && remove_empty_tree(&e.path(), deadline).is_ok() {
            removed.push(e.path());
        }
    }
    removed
}

/// Whether the host has any swap configured (then swap must be limited explicitly).
pub(crate) fn host_has_swap() -> bool {
    read_string(Path::new("/proc/meminfo"))
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("SwapTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .is_some_and(|kb| kb > 0)
}

/// CFS quota in microseconds per 100 ms period for `cpus` cores.
pub(crate) fn cfs_quota_us(cpus: f64) -> i64 {
    ((cpus * CFS_PERIOD_US as f64).round() as i64).max(1000)
}

pub(crate) const CFS_PERIOD_US: u64 = 100_000;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn the_state_and_start_time_come_from_their_fields_and_nothing_is_made_up() {
        let tail = " S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4242 0 0\n";
        assert_eq!(parse_stat(tail), Some(('S', 4242)));
        // Cut short: nothing is made up.
        assert_eq!(parse_stat(" S 1 1"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn a_process_list_longer_than_any_text_bound_is_read_whole_in_pieces() -> io::Result<()> {
        // A sandbox decides how long its cgroup.procs is: a line per process it forks.
        let dir = tempfile::tempdir()?;
        let line = "4194304\n";
        let lines = usize::try_from(super::super::kernel_text::LIMIT)
            .unwrap_or(usize::MAX)
            .div_ceil(line.len())
            .saturating_add(1);
        std::fs::write(dir.path().join("cgroup.procs"), line.repeat(lines))?;
        let mut seen = 0usize;
        each_proc(dir.path(), |pid| {
            seen += usize::from(pid == 4_194_304);
            ControlFlow::Continue(())
        })?;
        assert_eq!(seen, lines);
        assert!(!holds_nothing(dir.path()));
        // Gone: empty. Unreadable (a directory where the list should be): not empty.
        assert!(holds_nothing(&dir.path().join("gone")));
        std::fs::remove_file(dir.path().join("cgroup.procs"))?;
        std::fs::create_dir(dir.path().join("cgroup.procs"))?;
        assert!(!holds_nothing(dir.path()));
        std::fs::remove_dir(dir.path().join("cgroup.procs"))?;
        std::fs::write(dir.path().join("cgroup.procs"), "")?;
        assert!(holds_nothing(dir.path()));
        Ok(())
    }

    #[test]
    fn a_process_whose_name_is_not_text_still_has_a_start_time() -> std::io::Result<()> {
        // The command name is the file's name: this one is not UTF-8.
        let dir = tempfile::tempdir()?;
        let name = std::ffi::OsStr::from_bytes(b"\xffsleep");
        let link = dir.path().join(name);
        std::os::unix::fs::symlink("/bin/sleep", &link)?;
        let mut child = std::process::Command::new(&link).arg("30").spawn()?;
        let start = process_start_time(child.id());
        let own = is_stale(&format!(
            "hatchery-run-{}-{}",
            child.id(),
            start.unwrap_or(0)
        ));
        let _ = child.kill();
        let _ = child.wait();
        assert!(start.is_some_and(|s| s > 0), "no start time");
        assert!(!own, "a live owner's cgroup taken for stale");
        Ok(())
    }

    #[test]
    fn names_of_live_processes_are_not_stale() {
        let own = unique_name("run");
        assert!(own.starts_with("hatchery-run-"));
        assert!(!is_stale(&own));
        assert!(is_stale("hatchery-run-999999999-1"));
        assert!(!is_stale("not-ours-1-2"));
        assert!(!is_stale("hatchery-garbage"));
    }

    #[test]
    fn a_name_says_its_owner_with_or_without_its_pid_namespace() {
        let own = unique_name("run");
        let ns = nix::sys::stat::stat("/proc/self/ns/pid").map(|st| st.st_ino);
        assert!(
            ns.is_ok_and(|ns| own.ends_with(&format!("-n{ns}"))),
            "{own}"
        );
        let start = process_start_time(std::process::id()).unwrap_or(0);
        assert_eq!(
            own.strip_prefix(NAME_PREFIX).and_then(name_owner),
            Some((std::process::id(), start))
        );
        // Names made before the namespace was part of them, and workers' (whose id may
        // hold dashes).
        assert_eq!(name_owner("run-12-345"), Some((12, 345)));
        assert_eq!(name_owner("w-root-42-7-n4026531836"), Some((42, 7)));
        assert_eq!(name_owner("w-root-42-7"), Some((42, 7)));
        for bad in [
            "run-12-n5",
            "run-12-345-n",
            "run-12-345-nx",
            "run-x-345-n5",
            "n5",
        ] {
            assert_eq!(name_owner(bad), None, "{bad}");
        }
        assert!(is_stale("hatchery-run-999999999-1-n4026531836"));
    }

    #[test]
    fn a_name_whose_owner_is_a_zombie_or_another_process_is_stale() -> std::io::Result<()> {
        let mut child = std::process::Command::new("true").spawn()?;
        let pid = child.id();
        let start = process_start_time(pid).unwrap_or(0);
        let name = format!("hatchery-run-{pid}-{start}");
        // Not reaped: once it has exited it is a zombie, and its cgroups are stale.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while proc_stat(pid).is_some_and(|(state, _)| state != 'Z')
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let zombie = is_stale(&name);
        let _ = child.wait();
        assert!(zombie, "{name}: a zombie owner counts as gone");
        let me = std::process::id();
        let own = process_start_time(me).unwrap_or(0);
        assert!(is_stale(&format!(
            "hatchery-run-{me}-{}",
            own.wrapping_add(1)
        )));
        Ok(())
    }

    #[test]
    fn quota_has_a_floor() {
        assert_eq!(cfs_quota_us(0.5), 50_000);
        assert_eq!(cfs_quota_us(0.001), 1000);
    }
}
