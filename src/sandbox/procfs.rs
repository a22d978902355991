//! The sandbox's `/proc`: a procfs of its own pid namespace, with what it must not touch
//! made read-only, what would tell it about the host masked, and the host-wide counters
//! programs commonly read replaced by a view of the sandbox.
//!
//! A fresh procfs still shows the whole host in its global files: `/proc/loadavg` rises
//! and falls with host task counts (a side channel on what else runs), `/proc/stat` counts
//! every fork and context switch on the host, `/proc/meminfo` shows host memory,
//! `/proc/sys/kernel/random/boot_id` identifies the host boot. Masking all of them breaks
//! programs (glibc counts processors from `/proc/stat` when `/sys` is absent, as it is
//! here; `free` and many runtimes read `meminfo`), so these are replaced by static files
//! written for this sandbox: its processors with zero counters, its memory limit as the
//! machine's memory, a boot id of its own. Interrupt, disk, scheduler, slab, lock and
//! pressure statistics are masked outright. What stays host-wide is listed in the README.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::mount::{MsFlags, mount};

use super::mount_api::{
    MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, MountError, fail,
    mount_point, nix_fail, set_attrs, stage_path,
};

/// `/proc` entries made read-only.
const READONLY: [&str; 3] = ["sys", "sysrq-trigger", "bus"];
/// `/proc` files hidden behind `/dev/null`: host-wide activity a sandbox could watch
/// (interrupts, disk and memory activity, the host's file locks, other sandboxes' cgroups)
/// and the kernel interfaces Docker masks. (Files only host root may read need no mask:
/// the sandbox's root is not host root. Static host facts — partitions, swaps, the kernel
/// command line — are listed as not covered in the README: each mask costs every start a
/// mount.)
const MASKED_FILES: [&str; 13] = [
    "kcore",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "timer_stats",
    "interrupts",
    "softirqs",
    "diskstats",
    "vmstat",
    "zoneinfo",
    "locks",
    "cgroups",
];
/// `/proc` directories hidden behind an empty read-only tmpfs (`irq` holds per-interrupt
/// counters and settings, `fs` per-filesystem statistics of the host's disks).
const MASKED_DIRS: [&str; 6] = ["acpi", "asound", "scsi", "pressure", "irq", "fs"];

/// The files written for one sandbox (path under `/proc`, content), decided by the
/// supervisor before the clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcView {
    pub files: Vec<(&'static str, String)>,
}

impl ProcView {
    /// The view for a sandbox with `memory` bytes (None: the host's memory). Built from
    /// cheap sources (sysinfo(2), the processor count, the boot clock) rather than by
    /// reading the host's own files, which the kernel assembles per CPU on every read.
    pub fn new(memory: Option<u64>) -> ProcView {
        let cpus = online_cpus();
        let mut stat = String::from("cpu  0 0 0 0 0 0 0 0 0 0\n");
        for cpu in 0..cpus {
            let _ = writeln!(stat, "cpu{cpu} 0 0 0 0 0 0 0 0 0 0");
        }
        let _ = write!(
            stat,
            "intr 0\nctxt 0\nbtime {}\nprocesses 0\nprocs_running 1\nprocs_blocked 0\nsoftirq 0 0 0 0 0 0 0 0 0 0 0\n",
            boot_time()
        );
        let host_kb = host_memory_kb();
        let total_kb = memory.map_or(host_kb, |b| (b / 1024).min(host_kb.max(1)));
        let meminfo = format!(
            "MemTotal:       {total_kb:>8} kB\nMemFree:        {total_kb:>8} kB\nMemAvailable:   {total_kb:>8} kB\nBuffers:               0 kB\nCached:                0 kB\nSwapCached:            0 kB\nShmem:                 0 kB\nSReclaimable:          0 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n"
        );
        let mut id = [0u8; 16];
        let _ = getrandom::fill(&mut id);
        id[6] = (id[6] & 0x0f) | 0x40;
        id[8] = (id[8] & 0x3f) | 0x80;
        let h = hex::encode(id);
        let boot_id = format!(
            "{}-{}-{}-{}-{}\n",
            h.get(0..8).unwrap_or(""),
            h.get(8..12).unwrap_or(""),
            h.get(12..16).unwrap_or(""),
            h.get(16..20).unwrap_or(""),
            h.get(20..32).unwrap_or("")
        );
        ProcView {
            files: vec![
                ("loadavg", "0.00 0.00 0.00 1/1 1\n".to_string()),
                ("stat", stat),
                ("meminfo", meminfo),
                ("sys/kernel/random/boot_id", boot_id),
            ],
        }
    }
}

impl ProcView {
    /// The view without what each sandbox has of its own or reads off the clock (its
    /// boot id, and the boot time that `stat` computes from the clock to the second):
    /// two sandboxes with equal such views show the same machine.
    pub fn machine(&self) -> ProcView {
        ProcView {
            files: self
                .files
                .iter()
                .filter(|(path, _)| *path != "sys/kernel/random/boot_id")
                .map(|(path, text)| {
                    let text = text
                        .lines()
                        .filter(|l| !l.starts_with("btime "))
                        .collect::<Vec<_>>()
                        .join("\n");
                    (*path, text)
                })
                .collect(),
        }
    }
}

/// How many processors the sandbox may run on (its affinity mask: what glibc's
/// `get_nprocs` and `nproc` would count from `/proc/stat`). Not
/// `std::thread::available_parallelism`, which reads cgroup files and the mount table.
fn online_cpus() -> usize {
    nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| {
            (0..nix::sched::CpuSet::count())
                .filter(|&i| set.is_set(i).unwrap_or(false))
                .count()
        })
        .unwrap_or(1)
        .max(1)
}

/// The host's memory in kB (sysinfo(2)), 0 when unknown.
fn host_memory_kb() -> u64 {
    nix::sys::sysinfo::sysinfo()
        .map(|i| i.ram_total() / 1024)
        .unwrap_or(0)
}

/// When the host booted, in seconds since the epoch (what `btime` in `/proc/stat` says),
/// from the real-time clock less the boot-time clock.
fn boot_time() -> u64 {
    use nix::time::{ClockId, clock_gettime};
    let now = clock_gettime(ClockId::CLOCK_REALTIME).map_or(0, |t| t.tv_sec());
    let up = clock_gettime(ClockId::CLOCK_BOOTTIME).map_or(0, |t| t.tv_sec());
    u64::try_from(now.saturating_sub(up)).unwrap_or(0)
}

/// Binds `src` over `/proc/<name>` of the new procfs, and flags the bind read-only (and
/// recursively so when `recursive`) when asked. `Ok(false)` when this kernel has no such
/// entry. Paths are fine here: the procfs and the new root are the sandbox's own, seen by
/// nothing but this process yet; and the classic bind costs the kernel far less than a
/// detached clone (which makes a whole anonymous mount namespace) for each of the ~30.
fn bind_over(
    src: &Path,
    staged: &Path,
    name: &str,
    readonly: bool,
    recursive: bool,
) -> Result<bool, MountError> {
    let at = staged.join(name);
    let mut flags = MsFlags::MS_BIND;
    if recursive {
        flags |= MsFlags::MS_REC;
    }
    match mount(Some(src), &at, None::<&str>, flags, None::<&str>) {
        Ok(()) => {}
        Err(nix::errno::Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(nix_fail(format!("bind over /proc/{name}"))(e)),
    }
    if readonly {
        let attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
        set_attrs(libc::AT_FDCWD, Some(&at), attrs, recursive)
            .map_err(fail(format!("flag /proc/{name}")))?;
    }
    Ok(true)
}

/// Mounts the sandbox's `/proc` under the new root being built at `root` (while the host's
/// is still visible: the kernel refuses a new proc in a user namespace that has no fully
/// visible one). The view's files are written in the new root, bound over the host's, and
/// removed from the root again.
pub fn build(root: &OwnedFd, view: &ProcView) -> Result<(), MountError> {
    let proc_dir = Path::new("/proc");
    mount_point(root, proc_dir, true)?;
    let staged = stage_path(proc_dir);
    mount(
        Some("proc"),
        &staged,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(nix_fail("proc on /proc"))?;
    // The view first: `sys` becomes read-only below, and a file bound over one of its
    // entries keeps its own (read-only) mount.
    for (i, (name, content)) in view.files.iter().enumerate() {
        let temp = stage_path(Path::new(&format!("/.proc-view-{i}")));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .and_then(|mut f| f.write_all(content.as_bytes()));
        written.map_err(fail(format!("write the view of /proc/{name}")))?;
        bind_over(&temp, &staged, name, true, false)?;
        // The mount holds the file now; the root keeps no trace of it.
        std::fs::remove_file(&temp).map_err(fail(format!("remove the view of /proc/{name}")))?;
    }
    for name in READONLY {
        bind_over(&staged.join(name), &staged, name, true, true)?;
    }
    let null = stage_path(Path::new("/dev/null"));
    for name in MASKED_FILES {
        bind_over(&null, &staged, name, false, false)?;
    }
    // One empty directory of the new root, bound read-only over each masked one (a bind
    // costs the kernel less than a tmpfs of its own for each), then removed from the root.
    let empty = stage_path(Path::new("/.proc-empty"));
    std::fs::create_dir(&empty).map_err(fail("an empty directory for /proc masks"))?;
    for name in MASKED_DIRS {
        bind_over(&empty, &staged, name, true, false)?;
    }
    std::fs::remove_dir(&empty).map_err(fail("remove the empty directory of /proc masks"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_keeps_the_processors_and_the_limit_and_no_host_counter() {
        let v = ProcView::new(Some(64 << 20));
        let file = |n: &str| {
            v.files
                .iter()
                .find(|(name, _)| *name == n)
                .map(|(_, c)| c.clone())
                .unwrap_or_default()
        };
        let host_cpus = std::fs::read_to_string("/proc/stat")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .count();
        let stat = file("stat");
        assert_eq!(
            stat.lines()
                .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
                .count(),
            host_cpus
        );
        assert!(stat.contains("processes 0\n"), "{stat}");
        assert!(file("meminfo").starts_with("MemTotal:          65536 kB\n"));
        assert_eq!(file("loadavg"), "0.00 0.00 0.00 1/1 1\n");
        let id = file("sys/kernel/random/boot_id");
        assert_eq!(id.trim().len(), 36, "{id}");
        assert_ne!(
            id,
            ProcView::new(None).files[3].1,
            "one boot id per sandbox"
        );
    }

    #[test]
    fn the_boot_time_is_the_hosts() {
        let host = std::fs::read_to_string("/proc/stat")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
            .unwrap_or(0);
        assert!(boot_time().abs_diff(host) <= 1, "{} vs {host}", boot_time());
    }
}
