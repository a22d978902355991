//! The cgroup v2 backend: one unified hierarchy, sandboxes created as children of this
//! process's own cgroup (or of the root, see placement below), entered at birth with
//! `clone3(CLONE_INTO_CGROUP)` and killed as a whole with `cgroup.kill`.
//!
//! Placement follows the no-internal-process rule: a non-root cgroup that holds processes
//! cannot enable controllers for its children. When the supervisor is alone in its cgroup
//! (a systemd service, a delegated scope) it moves itself into a leaf first and enables
//! the controllers on the cgroup it left; when it shares its cgroup with processes it does
//! not own (a login shell), root falls back to the root cgroup and others cannot have limits.

use std::fs::File;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cgroups_rs::CgroupPid;
use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;
use cgroups_rs::fs::{Controller, MaxValue};

use super::{
    CgroupError, CgroupManager, CgroupVersion, Controllers, Layout, Limits, SandboxCgroup, Usage,
    controller_err, host_has_swap, io_err, read_key, read_string, read_u64, write_file,
};

const WANTED: [&str; 3] = ["memory", "cpu", "pids"];

pub struct V2Manager {
    mount: PathBuf,
    own: PathBuf,
    root_user: bool,
    state: Mutex<Option<Placement>>,
}

/// Where sandboxes go, decided once, on first use.
#[derive(Debug, Clone)]
struct Placement {
    base: PathBuf,
    /// The leaf this process moved itself into, to be undone by `release`.
    moved_to: Option<PathBuf>,
    /// The controllers enabled in `base` on moving into the leaf, to be disabled again.
    enabled: Vec<&'static str>,
}

impl V2Manager {
    pub fn detect(layout: &Layout, root_user: bool) -> Result<Option<V2Manager>, CgroupError> {
        let Some(mount) = layout.v2_mount() else {
            return Ok(None);
        };
        let own_rel = layout.own_v2.clone().unwrap_or_else(|| PathBuf::from("/"));
        let Some(own) = layout.own_dir(mount, &own_rel) else {
            return Ok(None);
        };
        let controllers =
            read_string(&mount.mount_point.join("cgroup.controllers")).unwrap_or_default();
        if !WANTED
            .iter()
            .any(|w| controllers.split_whitespace().any(|c| c == *w))
        {
            return Ok(None);
        }
        Ok(Some(V2Manager {
            mount: mount.mount_point.clone(),
            own,
            root_user,
            state: Mutex::new(None),
        }))
    }

    fn placement(&self) -> Result<Placement, CgroupError> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| CgroupError::Unavailable("cgroup state poisoned".into()))?;
        if let Some(p) = state.as_ref() {
            return Ok(p.clone());
        }
        let p = self.decide_placement()?;
        *state = Some(p.clone());
        Ok(p)
    }

    /// Where sandboxes would go, decided from the layout alone (no change is made).
    fn plan(&self) -> Plan {
        if self.own == self.mount {
            return Plan::Root;
        }
        let me = std::process::id() as i32;
        let mut others = false;
        let listed = super::each_proc(&self.own, |p| {
            if p == me {
                return ControlFlow::Continue(());
            }
            others = true;
            ControlFlow::Break(())
        });
        let alone = listed.is_ok() && !others;
        let writable = |p: &Path| nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok();
        if alone
            && writable(&self.own)
            && writable(&self.own.join("cgroup.procs"))
            && writable(&self.own.join("cgroup.subtree_control"))
        {
            Plan::Leaf
        } else if self.root_user {
            Plan::SharedFallbackToRoot
        } else {
            Plan::Refuse
        }
    }

    fn decide_placement(&self) -> Result<Placement, CgroupError> {
        match self.plan() {
            Plan::Root | Plan::SharedFallbackToRoot => {
                enable_controllers(&self.mount)?;
                Ok(Placement {
                    base: self.mount.clone(),
                    moved_to: None,
                    enabled: Vec::new(),
                })
            }
            Plan::Leaf => {
                // Alone in our cgroup: move into a leaf, then the cgroup we left may have
                // controllers enabled for its children (our leaf and the sandboxes).
                let me = std::process::id().to_string();
                let leaf = self.own.join(super::unique_name("supervisor"));
                std::fs::create_dir(&leaf).map_err(io_err(&leaf))?;
                if let Err(e) = write_file(&leaf.join("cgroup.procs"), &me) {
                    let _ = std::fs::remove_dir(&leaf);
                    return Err(e);
                }
                let enabled = match enable_controllers(&self.own) {
                    Ok(enabled) => enabled,
                    Err(e) => {
                        let _ = write_file(&self.own.join("cgroup.procs"), &me);
                        let _ = std::fs::remove_dir(&leaf);
                        return Err(e);
                    }
                };
                Ok(Placement {
                    base: self.own.clone(),
                    moved_to: Some(leaf),
                    enabled,
                })
            }
            Plan::Refuse => Err(CgroupError::Unavailable(format!(
                "cgroup {} is not delegated to this user or holds other processes; run inside a delegated scope: systemd-run --user --scope -p Delegate=yes hatchery ...",
                self.own.display()
            ))),
        }
    }

    /// The cgroup whose children sandboxes are (or would be) created as.
    fn prospective_base(&self) -> PathBuf {
        if let Some(p) = self.state.lock().ok().and_then(|s| s.clone()) {
            return p.base;
        }
        match self.plan() {
            Plan::Root | Plan::SharedFallbackToRoot => self.mount.clone(),
            Plan::Leaf | Plan::Refuse => self.own.clone(),
        }
    }
}

/// How sandboxes are placed, given where this process sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// In the root cgroup: sandboxes are its children (the root is exempt from the
    /// no-internal-process rule).
    Root,
    /// Alone in a cgroup we may write (a service, a delegated scope): move into a leaf first.
    Leaf,
    /// Root, sharing its cgroup with processes it does not own: use the root cgroup.
    SharedFallbackToRoot,
    /// Unprivileged without a delegated cgroup: no limits can be had.
    Refuse,
}

/// Enables the wanted controllers that `dir` offers in its `cgroup.subtree_control`;
/// returns the ones this call enabled.
fn enable_controllers(dir: &Path) -> Result<Vec<&'static str>, CgroupError> {
    let offered = read_string(&dir.join("cgroup.controllers")).unwrap_or_default();
    let enabled = read_string(&dir.join("cgroup.subtree_control")).unwrap_or_default();
    let missing: Vec<&'static str> = WANTED
        .into_iter()
        .filter(|w| offered.split_whitespace().any(|c| c == *w))
        .filter(|w| !enabled.split_whitespace().any(|c| c == *w))
        .collect();
    if !missing.is_empty() {
        let change: Vec<String> = missing.iter().map(|c| format!("+{c}")).collect();
        write_file(&dir.join("cgroup.subtree_control"), &change.join(" "))?;
    }
    Ok(missing)
}

impl CgroupManager for V2Manager {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V2
    }

    fn controllers(&self) -> Controllers {
        // What the cgroup sandboxes are created in offers its children: for a delegated
        // subtree that is what the delegation gave, not what the root has.
        let dir = self.prospective_base();
        let offered = read_string(&dir.join("cgroup.controllers")).unwrap_or_default();
        let has = |c: &str| offered.split_whitespace().any(|o| o == c);
        let swap_file = dir.join("memory.swap.max").exists()
            || std::fs::read_dir(&dir)
                .map(|mut d| d.any(|e| e.is_ok_and(|e| e.path().join("memory.swap.max").exists())))
                .unwrap_or(false);
        Controllers {
            memory: has("memory"),
            cpu: has("cpu"),
            pids: has("pids"),
            swap_off: has("memory") && (swap_file || !host_has_swap()),
        }
    }

    fn base(&self) -> PathBuf {
        self.prospective_base()
    }

    fn create(&self, name: &str, limits: &Limits) -> Result<Box<dyn SandboxCgroup>, CgroupError> {
        let base = self.placement()?.base;
        let dir = base.join(name);
        let noted = super::leftovers::note(name, &[dir.as_path()]);
        if let Err(e) = std::fs::create_dir(&dir) {
            if let Some(noted) = noted {
                noted.done();
            }
            return Err(io_err(&dir)(e));
        }
        let mut cg = V2Cgroup {
            dir: dir.clone(),
            fd: None,
            removed: false,
            noted,
        };
        cg.apply(limits)?;
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&dir)
            .map_err(io_err(&dir))?;
        cg.fd = Some(fd);
        Ok(Box::new(cg))
    }

    fn sweep_stale(&self, wait: bool) -> Vec<PathBuf> {
        let deadline = std::time::Instant::now() + super::SWEEP_BUDGET;
        let mut removed = super::sweep_dir(&self.own, deadline);
        if self.root_user && self.own != self.mount {
            removed.extend(super::sweep_dir(&self.mount, deadline));
        }
        removed.extend(super::leftovers::sweep(
            &[self.own.as_path()],
            wait,
            deadline,
        ));
        removed
    }

    fn release(&self) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let Some(Placement {
            base,
            moved_to: Some(leaf),
            enabled,
        }) = state.take()
        else {
            return;
        };
        // Only give the controllers back if no other hatchery cgroup still uses them: turning
        // a controller off removes its limits from every child.
        let busy = std::fs::read_dir(&base)
            .map(|d| {
                d.flatten()
                    .any(|e| e.path() != leaf && e.file_type().is_ok_and(|t| t.is_dir()))
            })
            .unwrap_or(true);
        if busy {
            return;
        }
        if !enabled.is_empty() {
            let change: Vec<String> = enabled.iter().map(|c| format!("-{c}")).collect();
            let _ = write_file(&base.join("cgroup.subtree_control"), &change.join(" "));
        }
        if write_file(&base.join("cgroup.procs"), &std::process::id().to_string()).is_ok() {
            let _ = super::remove_when_empty(&leaf, Instant::now() + Duration::from_millis(500));
        }
    }
}

pub struct V2Cgroup {
    dir: PathBuf,
    fd: Option<File>,
    removed: bool,
    /// The note that lets a later run remove this directory if this one is killed.
    noted: Option<super::leftovers::Noted>,
}

impl V2Cgroup {
    fn apply(&self, limits: &Limits) -> Result<(), CgroupError> {
        let dir = &self.dir;
        if let Some(bytes) = limits.memory {
            let mem = MemController::new(dir.clone(), dir.clone(), true);
            let bytes = i64::try_from(bytes).map_err(|e| controller_err("memory limit", dir, e))?;
            mem.set_limit(bytes)
                .map_err(|e| controller_err("memory.max", dir, e))?;
            if dir.join("memory.swap.max").exists() {
                mem.set_memswap_limit(0)
                    .map_err(|e| controller_err("memory.swap.max", dir, e))?;
            }
            // An OOM kill takes the whole sandbox: no half-dead process tree.
            if dir.join("memory.oom.group").exists() {
                write_file(&dir.join("memory.oom.group"), "1")?;
            }
        }
        if let Some(cpus) = limits.cpus {
            let cpu = CpuController::new(dir.clone(), dir.clone(), true);
            cpu.set_cfs_quota_and_period(
                Some(super::cfs_quota_us(cpus)),
                Some(super::CFS_PERIOD_US),
            )
            .map_err(|e| controller_err("cpu.max", dir, e))?;
        }
        if let Some(n) = limits.pids {
            let pids = PidController::new(dir.clone(), dir.clone(), true);
            let n = i64::try_from(n).map_err(|e| controller_err("pids limit", dir, e))?;
            pids.set_pid_max(MaxValue::Value(n))
                .map_err(|e| controller_err("pids.max", dir, e))?;
        }
        Ok(())
    }
}

impl SandboxCgroup for V2Cgroup {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn clone_into_fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    fn attach(&self, pid: i32) -> Result<(), CgroupError> {
        MemController::new(self.dir.clone(), self.dir.clone(), true)
            .add_task_by_tgid(&CgroupPid::from(pid as u64))
            .map_err(|e| controller_err("cgroup.procs", &self.dir, e))
    }

    fn usage(&self) -> Usage {
        let d = &self.dir;
        Usage {
            cpu_usec: read_key(&d.join("cpu.stat"), "usage_usec"),
            memory_peak_bytes: read_u64(&d.join("memory.peak")),
            pids_peak: read_u64(&d.join("pids.peak")),
            oom_kills: read_key(&d.join("memory.events"), "oom_kill").unwrap_or(0),
            pids_limit_hits: read_key(&d.join("pids.events"), "max").unwrap_or(0),
        }
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        let kill = self.dir.join("cgroup.kill");
        if kill.exists() {
            write_file(&kill, "1")?;
        }
        super::kill_procs_until_empty(&self.dir, Instant::now() + Duration::from_secs(2))
    }

    fn kill_now(&self) {
        // Without it (before Linux 5.14), pid 1's SIGKILL alone (see the trait).
        let _ = write_file(&self.dir.join("cgroup.kill"), "1");
    }

    fn is_empty(&self) -> bool {
        read_key(&self.dir.join("cgroup.events"), "populated") == Some(0)
    }

    fn destroy(&mut self) -> Result<(), CgroupError> {
        if self.removed {
            return Ok(());
        }
        self.fd = None;
        if super::removed_at_once(&self.dir) {
            self.removed = true;
            if let Some(noted) = self.noted.take() {
                noted.done();
            }
            return Ok(());
        }
        if !self.is_empty() {
            self.kill_all()?;
        }
        super::remove_when_empty(&self.dir, Instant::now() + Duration::from_secs(2))?;
        self.removed = true;
        if let Some(noted) = self.noted.take() {
            noted.done();
        }
        Ok(())
    }
}

impl Drop for V2Cgroup {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake hierarchy in a temp dir: `root` is the mount, `root/svc` this process's cgroup
    /// holding `procs`.
    fn fixture(procs: &[u32], root_user: bool) -> std::io::Result<(tempfile::TempDir, V2Manager)> {
        let tmp = tempfile::tempdir()?;
        let own = tmp.path().join("svc");
        std::fs::create_dir(&own)?;
        let list: String = procs.iter().map(|p| format!("{p}\n")).collect();
        std::fs::write(own.join("cgroup.procs"), list)?;
        std::fs::write(own.join("cgroup.subtree_control"), "")?;
        let m = V2Manager {
            mount: tmp.path().to_path_buf(),
            own,
            root_user,
            state: Mutex::new(None),
        };
        Ok((tmp, m))
    }

    #[test]
    fn a_supervisor_in_the_root_cgroup_places_sandboxes_there() -> std::io::Result<()> {
        let (_tmp, mut m) = fixture(&[], true)?;
        m.own = m.mount.clone();
        assert_eq!(m.plan(), Plan::Root);
        assert_eq!(m.prospective_base(), m.mount);
        Ok(())
    }

    #[test]
    fn a_supervisor_alone_in_a_writable_cgroup_moves_into_a_leaf() -> std::io::Result<()> {
        let (_tmp, m) = fixture(&[std::process::id()], false)?;
        assert_eq!(m.plan(), Plan::Leaf);
        assert_eq!(m.prospective_base(), m.own);
        Ok(())
    }

    #[test]
    fn root_sharing_its_cgroup_falls_back_to_the_root_cgroup() -> std::io::Result<()> {
        let (_tmp, m) = fixture(&[std::process::id(), 1], true)?;
        assert_eq!(m.plan(), Plan::SharedFallbackToRoot);
        assert_eq!(m.prospective_base(), m.mount);
        Ok(())
    }

    #[test]
    fn an_unprivileged_user_sharing_its_cgroup_is_refused() -> std::io::Result<()> {
        let (_tmp, m) = fixture(&[std::process::id(), 1], false)?;
        assert_eq!(m.plan(), Plan::Refuse);
        match m.decide_placement() {
            Err(CgroupError::Unavailable(msg)) => assert!(msg.contains("Delegate=yes"), "{msg}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn only_missing_offered_controllers_are_enabled_and_reported() -> std::io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path();
        std::fs::write(dir.join("cgroup.controllers"), "cpuset io memory pids\n")?;
        std::fs::write(dir.join("cgroup.subtree_control"), "memory\n")?;
        match enable_controllers(dir) {
            Ok(enabled) => assert_eq!(enabled, vec!["pids"]),
            Err(e) => panic!("{e}"),
        }
        let written = std::fs::read_to_string(dir.join("cgroup.subtree_control"))?;
        assert_eq!(written, "+pids");
        std::fs::write(dir.join("cgroup.subtree_control"), "memory pids\n")?;
        match enable_controllers(dir) {
            Ok(enabled) => assert!(enabled.is_empty(), "{enabled:?}"),
            Err(e) => panic!("{e}"),
        }
        Ok(())
    }
}
