//! The cgroup v1 backend: one directory per controller hierarchy (memory, cpu, cpuacct,
//! pids), each created under this process's own cgroup in that hierarchy.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::control::ControlDir;
use super::{
    CgroupError, CgroupManager, CgroupVersion, Controllers, Layout, Limits, SandboxCgroup, Usage,
    controller_err, host_has_swap, io_err,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Memory,
    Cpu,
    CpuAcct,
    Pids,
}

pub struct V1Manager {
    /// (controller, this process's cgroup directory in its hierarchy)
    bases: Vec<(Kind, PathBuf)>,
    memsw: bool,
}

impl V1Manager {
    pub fn detect(layout: &Layout, root_user: bool) -> Option<V1Manager> {
        let mut bases = Vec::new();
        for (kind, name) in [
            (Kind::Memory, "memory"),
            (Kind::Cpu, "cpu"),
            (Kind::CpuAcct, "cpuacct"),
            (Kind::Pids, "pids"),
        ] {
            let Some(mount) = layout.v1_mount(name) else {
                continue;
            };
            let own = layout
                .own_v1
                .get(name)
                .cloned()
                .unwrap_or_else(|| PathBuf::from("/"));
            let Some(dir) = layout.own_dir(mount, &own) else {
                continue;
            };
            // v1 hierarchies are not delegated to users: only usable where we may write.
            if !root_user && nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).is_err() {
                continue;
            }
            bases.push((kind, dir));
        }
        if bases.is_empty() {
            return None;
        }
        let memsw = bases
            .iter()
            .find(|(k, _)| *k == Kind::Memory)
            .is_some_and(|(_, d)| d.join("memory.memsw.limit_in_bytes").exists());
        Some(V1Manager { bases, memsw })
    }

    fn base(&self, kind: Kind) -> Option<&Path> {
        self.bases
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, d)| d.as_path())
    }
}

impl CgroupManager for V1Manager {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V1
    }

    fn controllers(&self) -> Controllers {
        let memory = self.base(Kind::Memory).is_some();
        Controllers {
            memory,
            cpu: self.base(Kind::Cpu).is_some(),
            pids: self.base(Kind::Pids).is_some(),
            swap_off: memory && (self.memsw || !host_has_swap()),
        }
    }

    fn base(&self) -> PathBuf {
        self.base(Kind::Memory)
            .or_else(|| self.bases.first().map(|(_, d)| d.as_path()))
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    fn create(&self, name: &str, limits: &Limits) -> Result<Box<dyn SandboxCgroup>, CgroupError> {
        // Memory, cpuacct and pids are always joined, for accounting; cpu only for a quota.
        let wanted: Vec<(Kind, PathBuf)> = self
            .bases
            .iter()
            .filter(|(kind, _)| *kind != Kind::Cpu || limits.cpus.is_some())
            .map(|(kind, base)| (*kind, base.join(name)))
            .collect();
        let paths: Vec<&Path> = wanted.iter().map(|(_, d)| d.as_path()).collect();
        let mut cg = V1Cgroup {
            held: Vec::new(),
            joined: Vec::new(),
            primary: PathBuf::new(),
            noted: super::leftovers::note(name, &paths),
        };
        for (kind, dir) in wanted {
            // Co-mounted controllers (the usual `cpu,cpuacct`) share one directory.
            let at = match cg.held.iter().position(|d| d.path() == dir) {
                Some(at) => at,
                None => {
                    std::fs::create_dir(&dir).map_err(io_err(&dir))?;
                    match ControlDir::open(&dir) {
                        Ok(held) => cg.held.push(held),
                        Err(e) => {
                            // Not held, so not removed with `cg`: removed here.
                            let _ = std::fs::remove_dir(&dir);
                            return Err(io_err(&dir)(e));
                        }
                    }
                    cg.held.len() - 1
                }
            };
            cg.joined.push((kind, at));
        }
        cg.primary = cg
            .dir(Kind::Memory)
            .or_else(|| cg.held.first())
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default();
        // On error `cg` is dropped, which removes the directories just made.
        cg.apply(limits, self.memsw)?;
        Ok(Box::new(cg))
    }

    fn sweep_stale(&self, wait: bool) -> Vec<PathBuf> {
        let deadline = std::time::Instant::now() + super::SWEEP_BUDGET;
        let mut removed: Vec<PathBuf> = unique(self.bases.iter().map(|(_, b)| b.as_path()))
            .into_iter()
            .flat_map(|b| super::sweep_dir(b, deadline))
            .collect();
        let own: Vec<&Path> = self.bases.iter().map(|(_, b)| b.as_path()).collect();
        removed.extend(super::leftovers::sweep(&own, wait, deadline));
        removed
    }
}

/// Each directory once, in order: co-mounted controllers (the usual `cpu,cpuacct`) share one.
fn unique<'a>(dirs: impl Iterator<Item = &'a Path>) -> Vec<&'a Path> {
    let mut out: Vec<&Path> = Vec::new();
    for d in dirs {
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

pub struct V1Cgroup {
    /// Each directory made, once (co-mounted controllers share one), held open: its
    /// control files are opened relative to it (see [`ControlDir`]).
    held: Vec<ControlDir>,
    /// The controllers joined, each with the index in `held` of its directory.
    joined: Vec<(Kind, usize)>,
    primary: PathBuf,
    /// The note that lets a later run remove these directories if this one is killed.
    noted: Option<super::leftovers::Noted>,
}

impl V1Cgroup {
    fn dir(&self, kind: Kind) -> Option<&ControlDir> {
        let (_, at) = self.joined.iter().find(|(k, _)| *k == kind)?;
        self.held.get(*at)
    }

    fn apply(&self, limits: &Limits, memsw: bool) -> Result<(), CgroupError> {
        if let Some(bytes) = limits.memory {
            let dir = self
                .dir(Kind::Memory)
                .ok_or_else(|| CgroupError::Unavailable("memory controller".into()))?;
            let bytes = i64::try_from(bytes)
                .map_err(|e| controller_err("memory limit", dir.path(), e))?
                .to_string();
            dir.write("memory.limit_in_bytes", &bytes)?;
            if memsw {
                // memory+swap == memory: no swap at all.
                dir.write("memory.memsw.limit_in_bytes", &bytes)?;
            }
            // v1 charges socket buffers to a memory cgroup only for TCP, and only once a TCP
            // limit is set (UDP, unix and netlink buffers are never charged: the report says so).
            dir.write_if_present("memory.kmem.tcp.limit_in_bytes", &bytes)?;
        }
        if let Some(cpus) = limits.cpus {
            let dir = self
                .dir(Kind::Cpu)
                .ok_or_else(|| CgroupError::Unavailable("cpu controller".into()))?;
            // The quota, then the period (the order cgroups-rs writes them in).
            dir.write("cpu.cfs_quota_us", &super::cfs_quota_us(cpus).to_string())?;
            dir.write("cpu.cfs_period_us", &super::CFS_PERIOD_US.to_string())?;
        }
        if let Some(n) = limits.pids {
            let dir = self
                .dir(Kind::Pids)
                .ok_or_else(|| CgroupError::Unavailable("pids controller".into()))?;
            dir.write("pids.max", &n.to_string())?;
        }
        Ok(())
    }
}

impl SandboxCgroup for V1Cgroup {
    fn path(&self) -> &Path {
        &self.primary
    }

    fn clone_into_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn attach(&self, pid: i32) -> Result<(), CgroupError> {
        for dir in &self.held {
            dir.write("cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    fn self_join_files(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        self.held
            .iter()
            .map(|dir| dir.open_write("tasks"))
            .collect()
    }

    fn usage(&self) -> Usage {
        let mut u = Usage::default();
        if let Some(d) = self.dir(Kind::CpuAcct) {
            u.cpu_usec = d.read_u64("cpuacct.usage").map(|ns| ns / 1000);
        }
        if let Some(d) = self.dir(Kind::Memory) {
            u.memory_peak_bytes = d.read_u64("memory.max_usage_in_bytes");
            u.oom_kills = d.read_key("memory.oom_control", "oom_kill").unwrap_or(0);
        }
        if let Some(d) = self.dir(Kind::Pids) {
            u.pids_peak = d.read_u64("pids.peak");
            u.pids_limit_hits = d.read_key("pids.events", "max").unwrap_or(0);
        }
        u
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        super::kill_procs_until_empty(&self.primary, Instant::now() + Duration::from_secs(2))
    }

    fn kill_now(&self) {
        // No cgroup.kill on v1: pid 1's SIGKILL takes the sandbox along (see the trait).
    }

    fn is_empty(&self) -> bool {
        super::holds_nothing(&self.primary)
    }

    fn release_descriptors(&mut self) {
        self.held.iter_mut().for_each(ControlDir::release);
    }

    fn destroy(&mut self) -> Result<(), CgroupError> {
        let deadline = Instant::now() + Duration::from_secs(2);
        // Usually the sandbox's processes went with its pid 1: the primary directory goes
        // at the first try, and nothing is left to list or kill.
        let primary = self.held.iter().position(|d| d.path() == self.primary);
        let primary_gone = primary.is_some() && super::removed_at_once(&self.primary);
        if primary.is_some() && !primary_gone {
            super::kill_procs_until_empty(&self.primary, deadline)?;
        }
        let mut first_err = None;
        for (at, dir) in self.held.iter().enumerate() {
            if primary_gone && Some(at) == primary {
                continue;
            }
            if let Err(e) = super::remove_when_empty(dir.path(), deadline) {
                first_err.get_or_insert(e);
            }
        }
        self.held.clear();
        self.joined.clear();
        match first_err {
            Some(e) => Err(e),
            None => {
                if let Some(noted) = self.noted.take() {
                    noted.done();
                }
                Ok(())
            }
        }
    }
}

impl Drop for V1Cgroup {
    fn drop(&mut self) {
        if !self.held.is_empty() {
            let _ = self.destroy();
        } else if let Some(noted) = self.noted.take() {
            noted.done();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host with `cpu,cpuacct` co-mounted (most v1 hosts): one directory serves both.
    #[test]
    fn comounted_controllers_share_one_directory_made_and_removed_once() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let tmp = tmp.path();
        let (mem, cc, pids) = (
            tmp.join("memory"),
            tmp.join("cpu,cpuacct"),
            tmp.join("pids"),
        );
        for d in [&mem, &cc, &pids] {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        }
        let m = V1Manager {
            bases: vec![
                (Kind::Memory, mem.clone()),
                (Kind::Cpu, cc.clone()),
                (Kind::CpuAcct, cc.clone()),
                (Kind::Pids, pids.clone()),
            ],
            memsw: false,
        };
        let created = m.create("sb", &Limits::default());
        let mut cg = created.unwrap_or_else(|e| panic!("create: {e}"));
        for d in [&mem, &cc, &pids] {
            assert!(d.join("sb").is_dir(), "{}", d.display());
        }
        // No limit asked: cpu is not joined for a quota, but cpuacct (the same directory) is.
        assert_eq!(cg.path(), mem.join("sb"));
        // The sandbox joins each directory once.
        for d in [&mem, &cc, &pids] {
            let _ = std::fs::write(d.join("sb/tasks"), "");
        }
        let files = cg.self_join_files().map(|f| f.len());
        assert_eq!(files.ok(), Some(3));
        for d in [&mem, &cc, &pids] {
            let _ = std::fs::remove_file(d.join("sb/tasks"));
        }
        let r = cg.destroy();
        assert!(r.is_ok(), "{r:?}");
        for d in [&mem, &cc, &pids] {
            assert!(!d.join("sb").exists(), "{}", d.display());
        }
    }
}
