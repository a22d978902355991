//! Where the host mounts its cgroup hierarchies and where this process sits in them,
//! parsed from `/proc/self/mountinfo` and `/proc/self/cgroup`.
//!
//! Pure text parsing, so that every host layout (pure v2, hybrid, v1 with co-mounted
//! controllers, containers with a namespaced root) can be unit-tested from fixtures.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One cgroup filesystem mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub mount_point: PathBuf,
    /// The path inside the hierarchy that is mounted there (`/` unless in a namespace).
    pub root: PathBuf,
    /// `None` for cgroup2, else the v1 controllers of this hierarchy (`memory`, `cpu`, ...).
    pub v1_controllers: Option<Vec<String>>,
}

/// The host's cgroup layout as seen by this process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    pub mounts: Vec<CgroupMount>,
    /// v1: controller name → this process's cgroup path in that hierarchy.
    pub own_v1: BTreeMap<String, PathBuf>,
    /// v2: this process's cgroup path (the `0::` line).
    pub own_v2: Option<PathBuf>,
}

impl Layout {
    /// Reads the layout of the calling process.
    pub fn current() -> std::io::Result<Layout> {
        let mountinfo = crate::sandbox::kernel_text::read_host_table("/proc/self/mountinfo")?;
        let cgroup = crate::sandbox::kernel_text::read("/proc/self/cgroup")?;
        Ok(Layout::parse(&mountinfo, &cgroup))
    }

    pub fn parse(mountinfo: &str, proc_cgroup: &str) -> Layout {
        let mut layout = Layout::default();
        for line in mountinfo.lines() {
            if let Some(m) = parse_mountinfo_line(line) {
                layout.mounts.push(m);
            }
        }
        for line in proc_cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if id == "0" && ctrls.is_empty() {
                layout.own_v2 = Some(PathBuf::from(path));
            } else {
                for c in ctrls.split(',').filter(|c| !c.is_empty()) {
                    layout.own_v1.insert(c.to_string(), PathBuf::from(path));
                }
            }
        }
        layout
    }

    /// The v1 mount carrying `controller`, if any.
    pub fn v1_mount(&self, controller: &str) -> Option<&CgroupMount> {
        self.mounts.iter().find(|m| {
            m.v1_controllers
                .as_ref()
                .is_some_and(|cs| cs.iter().any(|c| c == controller))
        })
    }

    /// The cgroup2 mount, preferring `/sys/fs/cgroup` itself over e.g. `.../unified`.
    pub fn v2_mount(&self) -> Option<&CgroupMount> {
        let v2 = || self.mounts.iter().filter(|m| m.v1_controllers.is_none());
        v2().find(|m| m.mount_point == Path::new("/sys/fs/cgroup"))
            .or_else(|| v2().next())
    }

    /// This process's cgroup directory in the hierarchy of `mount`.
    ///
    /// The cgroup path from `/proc/self/cgroup` is relative to the hierarchy's root; the
    /// mount may expose only a subtree (`root`), e.g. inside a container.
    pub fn own_dir(&self, mount: &CgroupMount, own: &Path) -> Option<PathBuf> {
        let rel = own.strip_prefix(&mount.root).ok()?;
        Some(mount.mount_point.join(rel))
    }
}

/// Unescapes the octal escapes mountinfo uses for spaces and friends (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_mountinfo_line(line: &str) -> Option<CgroupMount> {
    let (pre, post) = line.split_once(" - ")?;
    let pre: Vec<&str> = pre.split(' ').collect();
    let post: Vec<&str> = post.split(' ').collect();
    if pre.len() < 5 || post.len() < 3 {
        return None;
    }
    let root = PathBuf::from(unescape(pre[3]));
    let mount_point = PathBuf::from(unescape(pre[4]));
    match post[0] {
        "cgroup2" => Some(CgroupMount {
            mount_point,
            root,
            v1_controllers: None,
        }),
        "cgroup" => {
            let ctrls = post[2]
                .split(',')
                .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains('='))
                .map(str::to_string)
                .collect();
            Some(CgroupMount {
                mount_point,
                root,
                v1_controllers: Some(ctrls),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
25 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
35 30 0:31 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
36 30 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
";

    #[test]
    fn hybrid_layout_finds_v1_controllers_and_own_paths() {
        let l = Layout::parse(HYBRID_MOUNTINFO, HYBRID_CGROUP);
        let mem = l.v1_mount("memory");
        assert_eq!(
            mem.map(|m| m.mount_point.clone()),
            Some(PathBuf::from("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            l.own_v1.get("memory"),
            Some(&PathBuf::from("/process_api/abc"))
        );
        assert!(l.v1_mount("name=systemd").is_none());
        assert_eq!(
            l.v2_mount().map(|m| m.mount_point.clone()),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let own = l.own_v1.get("memory").cloned().unwrap_or_default();
        assert_eq!(
            mem.and_then(|m| l.own_dir(m, &own)),
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
    }

    #[test]
    fn pure_v2_and_namespaced_roots() {
        let mi =
            "40 1 0:35 /system.slice/x.service /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let l = Layout::parse(mi, "0::/system.slice/x.service/sub\n");
        let m = l.v2_mount().cloned();
        assert!(m.is_some());
        let own = l.own_v2.clone().unwrap_or_default();
        assert_eq!(
            m.and_then(|m| l.own_dir(&m, &own)),
            Some(PathBuf::from("/sys/fs/cgroup/sub"))
        );
    }

    #[test]
    fn comounted_controllers_and_escapes() {
        let mi = "31 30 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                  32 30 0:28 / /mnt/with\\040space rw - cgroup cgroup rw,pids\n";
        let l = Layout::parse(mi, "");
        assert_eq!(
            l.v1_mount("cpuacct").map(|m| m.mount_point.clone()),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(
            l.v1_mount("pids").map(|m| m.mount_point.clone()),
            Some(PathBuf::from("/mnt/with space"))
        );
    }

    #[test]
    fn garbage_lines_are_ignored() {
        let l = Layout::parse("garbage\n - \n1 2 3\n", "x\n::\n");
        assert!(l.mounts.is_empty());
    }
}
