//! The cgroup v1 backend: one directory per controller hierarchy (memory, cpu, cpuacct,
//! pids), each created under this process's own cgroup in that hierarchy.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cgroups_rs::fs::MaxValue;
use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;

use super::{
    CgroupError, CgroupManager, CgroupVersion, Controllers, Layout, Limits, SandboxCgroup, Usage,
    controller_err, host_has_swap, io_err, read_key, read_u64,
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

    fn base(&self, kind: Kind) -> Option<&PathBuf> {
        self.bases.iter().find(|(k, _)| *k == kind).map(|(_, d)| d)
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
            .or_else(|| self.bases.first().map(|(_, d)| d))
            .cloned()
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
            dirs: Vec::new(),
            primary: PathBuf::new(),
            noted: super::leftovers::note(name, &paths),
        };
        for (kind, dir) in wanted {
            // Co-mounted controllers (the usual `cpu,cpuacct`) share one directory.
            if !cg.dirs.iter().any(|(_, d)| *d == dir) {
                std::fs::create_dir(&dir).map_err(io_err(&dir))?;
            }
            cg.dirs.push((kind, dir));
        }
        cg.primary = cg
            .dirs
            .iter()
            .find(|(k, _)| *k == Kind::Memory)
            .or_else(|| cg.dirs.first())
            .map(|(_, d)| d.clone())
            .unwrap_or_default();
        // On error `cg` is dropped, which removes the directories just made.
        cg.apply(limits, self.memsw)?;
        Ok(Box::new(cg))
    }

    fn sweep_stale(&self, wait: bool) -> Vec<PathBuf> {
        let deadline = std::time::Instant::now() + super::SWEEP_BUDGET;
        let mut removed: Vec<PathBuf> = unique(self.bases.iter().map(|(_, b)| b))
            .into_iter()
            .flat_map(|b| super::sweep_dir(b, deadline))
            .collect();
        let own: Vec<&Path> = self.bases.iter().map(|(_, b)| b.as_path()).collect();
        removed.extend(super::leftovers::sweep(&own, wait, deadline));
        removed
    }
}

/// Each directory once, in order: co-mounted controllers (the usual `cpu,cpuacct`) share one.
fn unique<'a>(dirs: impl Iterator<Item = &'a PathBuf>) -> Vec<&'a PathBuf> {
    let mut out: Vec<&PathBuf> = Vec::new();
    for d in dirs {
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

pub struct V1Cgroup {
    dirs: Vec<(Kind, PathBuf)>,
    primary: PathBuf,
    /// The note that lets a later run remove these directories if this one is killed.
    noted: Option<super::leftovers::Noted>,
}

impl V1Cgroup {
    fn dir(&self, kind: Kind) -> Option<&PathBuf> {
        self.dirs.iter().find(|(k, _)| *k == kind).map(|(_, d)| d)
    }

    fn unique_dirs(&self) -> Vec<&PathBuf> {
        unique(self.dirs.iter().map(|(_, d)| d))
    }

    fn apply(&self, limits: &Limits, memsw: bool) -> Result<(), CgroupError> {
        if let Some(bytes) = limits.memory {
            let dir = self
                .dir(Kind::Memory)
                .ok_or_else(|| CgroupError::Unavailable("memory controller".into()))?;
            let mem = MemController::new(dir.clone(), dir.clone(), false);
            let bytes = i64::try_from(bytes).map_err(|e| controller_err("memory limit", dir, e))?;
            mem.set_limit(bytes)
                .map_err(|e| controller_err("memory.limit_in_bytes", dir, e))?;
            if memsw {
                // memory+swap == memory: no swap at all.
                mem.set_memswap_limit(bytes)
                    .map_err(|e| controller_err("memory.memsw.limit_in_bytes", dir, e))?;
            }
            // v1 charges socket buffers to a memory cgroup only for TCP, and only once a TCP
            // limit is set (UDP, unix and netlink buffers are never charged: the report says so).
            let tcp = dir.join("memory.kmem.tcp.limit_in_bytes");
            if tcp.exists() {
                super::write_file(&tcp, &bytes.to_string())?;
            }
        }
        if let Some(cpus) = limits.cpus {
            let dir = self
                .dir(Kind::Cpu)
                .ok_or_else(|| CgroupError::Unavailable("cpu controller".into()))?;
            let cpu = CpuController::new(dir.clone(), dir.clone(), false);
            cpu.set_cfs_quota_and_period(
                Some(super::cfs_quota_us(cpus)),
                Some(super::CFS_PERIOD_US),
            )
            .map_err(|e| controller_err("cpu.cfs_quota_us", dir, e))?;
        }
        if let Some(n) = limits.pids {
            let dir = self
                .dir(Kind::Pids)
                .ok_or_else(|| CgroupError::Unavailable("pids controller".into()))?;
            let pids = PidController::new(dir.clone(), dir.clone(), false);
            let n = i64::try_from(n).map_err(|e| controller_err("pids limit", dir, e))?;
            pids.set_pid_max(MaxValue::Value(n))
                .map_err(|e| controller_err("pids.max", dir, e))?;
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
        for dir in self.unique_dirs() {
            super::write_file(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    fn self_join_files(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        self.unique_dirs()
            .into_iter()
            .map(|dir| {
                let path = dir.join("tasks");
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map(OwnedFd::from)
                    .map_err(io_err(&path))
            })
            .collect()
    }

    fn usage(&self) -> Usage {
        let mut u = Usage::default();
        if let Some(d) = self.dir(Kind::CpuAcct) {
            u.cpu_usec = read_u64(&d.join("cpuacct.usage")).map(|ns| ns / 1000);
        }
        if let Some(d) = self.dir(Kind::Memory) {
            u.memory_peak_bytes = read_u64(&d.join("memory.max_usage_in_bytes"));
            u.oom_kills = read_key(&d.join("memory.oom_control"), "oom_kill").unwrap_or(0);
        }
        if let Some(d) = self.dir(Kind::Pids) {
            u.pids_peak = read_u64(&d.join("pids.peak"));
            u.pids_limit_hits = read_key(&d.join("pids.events"), "max").unwrap_or(0);
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

    fn destroy(&mut self) -> Result<(), CgroupError> {
        let deadline = Instant::now() + Duration::from_secs(2);
        // Usually the sandbox's processes went with its pid 1: the primary directory goes
        // at the first try, and nothing is left to list or kill.
        let has_primary = !self.primary.as_os_str().is_empty();
        let primary_gone = has_primary && super::removed_at_once(&self.primary);
        if has_primary && !primary_gone {
            super::kill_procs_until_empty(&self.primary, deadline)?;
        }
        let mut first_err = None;
        for dir in self.unique_dirs() {
            if primary_gone && *dir == self.primary {
                continue;
            }
            if let Err(e) = super::remove_when_empty(dir, deadline) {
                first_err.get_or_insert(e);
            }
        }
        self.dirs.clear();
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
        if !self.dirs.is_empty() {
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
