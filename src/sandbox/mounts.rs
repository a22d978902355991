//! The mount namespace: a new root built from nothing, then pivot_root into it.
//!
//! The root is an empty tmpfs. Into it go read-only clones of the host's system
//! directories (`/usr`, `/etc`, and `/bin /lib ...` as links or directories, as the host
//! has them), a private `/tmp`, a private `/proc` with its dangerous corners masked, a
//! minimal `/dev`, and the user's `--ro`/`--rw` paths. Sources are cloned with
//! `open_tree(OPEN_TREE_CLONE)` before anything is mounted over them, checked against the
//! device/inode the supervisor validated, flagged read-only/nosuid/nodev with
//! `mount_setattr`, and attached with `move_mount` onto targets opened without following
//! symlinks. Then the old root is detached: nothing else of the host remains reachable.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::paths::HostPath;

use nix::mount::{MntFlags, MsFlags, mount, umount2};

pub use super::mount_api::MountError;
use super::mount_api::{
    MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, STAGE, attach,
    clone_fd_tree, clone_tree, fail, fstat_id, mount_point, nix_fail, set_attrs, set_attrs_idmap,
    stage_path,
};

/// A host path bound into the sandbox at `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// The source, resolved once (without following symlinks) and held open: the mount is
    /// made from this object, never from its path looked up again.
    pub host: HostPath,
    pub target: PathBuf,
    pub writable: bool,
    /// Nothing on it may be executed or mapped executable (writable places under an
    /// executable allowlist).
    pub noexec: bool,
    /// Map ids through an idmapped mount (exposures; system directories are root's and
    /// need none).
    pub idmapped: bool,
}

impl Bind {
    pub fn is_dir(&self) -> bool {
        self.host.is_dir
    }

    /// A bind of `host` at the same path.
    pub fn same_path(host: HostPath, writable: bool) -> Bind {
        Bind {
            target: host.path.clone(),
            host,
            writable,
            noexec: false,
            idmapped: true,
        }
    }

    fn attrs(&self) -> u64 {
        let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        if !self.writable {
            attrs |= MOUNT_ATTR_RDONLY;
        }
        if self.noexec {
            attrs |= MOUNT_ATTR_NOEXEC;
        }
        attrs
    }
}

/// Everything the new root is made of, decided by the supervisor before the clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootfsPlan {
    /// System binds (read-only), mounted first.
    pub system: Vec<Bind>,
    /// Top-level symlinks such as `/bin -> usr/bin`.
    pub links: Vec<(PathBuf, PathBuf)>,
    /// User exposures, mounted last (parents before children).
    pub exposures: Vec<Bind>,
    pub tmp_size: u64,
    pub dev_shm: bool,
    /// The files that replace host-wide ones in the sandbox's `/proc`.
    pub proc_view: super::procfs::ProcView,
    /// Mount `/tmp` and `/dev/shm` noexec (under an executable allowlist).
    pub noexec_tmp: bool,
    /// What the sandbox's `/etc/resolv.conf` says instead of the host's (egress: the
    /// broker's DNS stub).
    pub resolv_conf: Option<String>,
}

/// Device nodes bound from the host into `/dev`.
pub const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// The sandbox's own devpts: at most 16 terminals. Without `max=` one sandbox took 3,071
/// ptys (every pty the kernel allows outside the host's own reserve) and the next got ENOSPC.
const DEVPTS_OPTIONS: &str = "newinstance,ptmxmode=0666,mode=620,max=16";

/// A source tree, flagged and verified, waiting to be attached.
struct Source<'a> {
    bind: &'a Bind,
    tree: OwnedFd,
}

/// The detached, flagged copies of every bind source, made by a privileged supervisor in
/// the host's mount namespace before the sandbox is cloned (the sandbox inherits them and
/// attaches them). An unprivileged supervisor cannot copy host mounts: its sandbox makes
/// its own copies (see [`build_root`]).
#[derive(Debug, Default)]
pub struct PreparedTrees {
    /// One per bind of the plan, system binds first, in plan order.
    trees: Vec<OwnedFd>,
    /// What could not be enforced (a filesystem without idmapped mounts).
    pub notes: Vec<String>,
    /// The exposures' owners' groups the trees were mapped with.
    pub groups: OwnerGroups,
}

impl PreparedTrees {
    /// The descriptors, in plan order, for the sandbox's context.
    pub fn raw(&self) -> Vec<RawFd> {
        self.trees.iter().map(|t| t.as_raw_fd()).collect()
    }
}

/// How a privileged supervisor maps ids on the exposures it prepares.
#[derive(Debug, Clone, Copy)]
pub struct IdmapPlan {
    /// The sandbox's host uid and gid.
    pub sandbox: (u32, u32),
    /// The ids nothing on disk has (see [`super::idpool`]).
    pub null: (u32, u32),
}

/// Makes the detached copies of every bind of `plan` (see [`PreparedTrees`]). Exposures
/// are idmapped: read-only ones through the null mapping (no write channel at all: no FIFO
/// writes, no `connect` to host sockets), read-write ones so that the directory's owner is
/// the sandbox (what it creates belongs to that owner on the host), unless root owns it.
/// Where a filesystem cannot be idmapped the bind is made without, and a note says what
/// that leaves open.
pub fn prepare(
    plan: &RootfsPlan,
    idmap: IdmapPlan,
    groups: OwnerGroups,
) -> Result<PreparedTrees, MountError> {
    let mut out = PreparedTrees::default();
    let mut owner_maps: Vec<((u32, Option<u32>), OwnedFd)> = Vec::new();
    for bind in plan.system.iter().chain(plan.exposures.iter()) {
        let what = format!("clone {}", bind.host.path.display());
        let tree = clone_fd_tree(bind.host.fd().as_raw_fd()).map_err(fail(what))?;
        let flag = |userns: Option<RawFd>| {
            set_attrs_idmap(tree.as_raw_fd(), None, bind.attrs(), true, userns)
        };
        let mapped = owner_mapped(bind);
        let group = if mapped && bind.writable {
            groups.of(bind.host.uid, bind.host.gid)
        } else {
            None
        };
        let idmapped = if mapped {
            let userns = if bind.writable {
                let owner = (bind.host.uid, group);
                match owner_maps.iter().find(|(o, _)| *o == owner) {
                    Some((_, fd)) => Some(fd.as_raw_fd()),
                    None => match super::userns::owner_idmap(owner.0, group, idmap.sandbox) {
                        Ok(fd) => {
                            let raw = fd.as_raw_fd();
                            owner_maps.push((owner, fd));
                            Some(raw)
                        }
                        Err(_) => None,
                    },
                }
            } else {
                super::userns::null_idmap(idmap.null)
                    .ok()
                    .map(|fd| fd.as_raw_fd())
            };
            userns.is_some_and(|ns| flag(Some(ns)).is_ok())
        } else {
            false
        };
        if !idmapped {
            flag(None).map_err(fail(format!("flag {}", bind.host.path.display())))?;
            if mapped {
                out.notes.push(unmapped_note(bind, idmap.sandbox));
            } else if bind.idmapped {
                out.notes.push(root_owned_note(bind, idmap.sandbox));
            }
        } else if bind.writable && group.is_none() {
            out.notes.push(unmapped_group_note(bind, idmap.sandbox));
        }
        out.trees.push(tree);
    }
    out.groups = groups;
    Ok(out)
}

/// Whether `bind` is idmapped to its owner: a root-owned exposure is mounted plainly,
/// read-write too (root's files are never handed to a sandbox, which is never root on the
/// host, so there it has the rights of "other").
fn owner_mapped(bind: &Bind) -> bool {
    bind.idmapped && !(bind.writable && bind.host.uid == 0)
}

/// Why the groups of the read-write exposures' owners are not known, naming the directory
/// whose question went unanswered (else the first asked about).
#[derive(Debug, thiserror::Error)]
#[error("--rw {path} (owner uid {uid}{}): {source}", others_text(*.others))]
pub struct OwnerLookupError {
    pub path: String,
    pub uid: u32,
    pub others: usize,
    pub source: super::owner_groups::LookupError,
}

fn others_text(others: usize) -> String {
    if others > 0 {
        format!(", and {others} more")
    } else {
        String::new()
    }
}

/// The groups of the read-write exposures' owners that the sandbox takes with the owners'
/// rights (see [`super::owner_groups`]), asked once for every exposure of a plan, before
/// [`prepare`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OwnerGroups(Vec<((u32, u32), Option<u32>)>);

impl OwnerGroups {
    /// Asks the host's user database, under [`super::owner_groups::DEADLINE`], for each
    /// owner and group of `plan`'s read-write idmapped exposures (once each).
    pub fn look_up(plan: &RootfsPlan) -> Result<OwnerGroups, OwnerLookupError> {
        let mut keys: Vec<(u32, u32)> = Vec::new();
        let mut asked: Vec<&Bind> = Vec::new();
        for bind in plan.system.iter().chain(plan.exposures.iter()) {
            let key = (bind.host.uid, bind.host.gid);
            if owner_mapped(bind) && bind.writable {
                asked.push(bind);
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
        if asked.is_empty() {
            return Ok(OwnerGroups::default());
        }
        let answers = super::owner_groups::owners_groups(&keys, super::owner_groups::DEADLINE)
            .map_err(|source| {
                // The directory whose question went unanswered (else the first).
                let pending = match &source {
                    super::owner_groups::LookupError::NoAnswer { answered, .. } => {
                        keys.get(*answered).copied()
                    }
                    _ => None,
                };
                let bind = asked
                    .iter()
                    .find(|b| Some((b.host.uid, b.host.gid)) == pending)
                    .or(asked.first());
                OwnerLookupError {
                    path: bind
                        .map(|b| b.host.path.display().to_string())
                        .unwrap_or_default(),
                    uid: bind.map(|b| b.host.uid).unwrap_or_default(),
                    others: asked.len().saturating_sub(1),
                    source,
                }
            })?;
        Ok(OwnerGroups(keys.into_iter().zip(answers).collect()))
    }

    /// Whether nothing was looked up.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The group `uid`'s exposure in group `gid` gives the sandbox, if any (none for a
    /// pair not looked up).
    fn of(&self, uid: u32, gid: u32) -> Option<u32> {
        self.0
            .iter()
            .find(|(k, _)| *k == (uid, gid))
            .and_then(|(_, g)| *g)
    }
}

/// What an exposure without an idmapped mount leaves open.
pub fn unmapped_note(bind: &Bind, sandbox: (u32, u32)) -> String {
    if bind.writable {
        format!(
            "--rw {}: no idmapped mount here (the filesystem or kernel does not support one): the sandbox has the rights of others on it, and files it creates belong to its host uid {} instead of the directory's owner",
            bind.host.path.display(),
            sandbox.0
        )
    } else {
        format!(
            "--ro {}: no idmapped mount here (the filesystem or kernel does not support one, or the supervisor is not root): host FIFOs and unix sockets in it can still be written to and connected to",
            bind.host.path.display()
        )
    }
}

/// What a root-owned read-write exposure, mounted plainly, leaves to the sandbox's leased id.
pub fn root_owned_note(bind: &Bind, sandbox: (u32, u32)) -> String {
    format!(
        "--rw {}: root owns it, so it is not idmapped: the sandbox has the rights of others on it, and files it creates belong to its host uid {}, leased for this run, which a later sandbox may be leased (give the directory a non-root owner to keep them that owner's)",
        bind.host.path.display(),
        sandbox.0
    )
}

/// What a read-write exposure whose group is not mapped (root's, or one its owner does not
/// belong to: see `owner_groups::owners_group`) leaves to the sandbox's leased group.
pub fn unmapped_group_note(bind: &Bind, sandbox: (u32, u32)) -> String {
    let whose = if bind.host.gid == 0 {
        "root's".to_string()
    } else {
        format!("gid {}, not one its owner belongs to", bind.host.gid)
    };
    format!(
        "--rw {}: its group is {whose}, so it is not the sandbox's: the sandbox has no group's rights there, and files it creates keep its host gid {}, leased for this run, which a later sandbox may be leased (unless the directory is set-gid; give it its owner's own group)",
        bind.host.path.display(),
        sandbox.1
    )
}

/// The source of one bind inside the sandbox: the supervisor's prepared copy, or (an
/// unprivileged supervisor) a copy made here of the object at the bind's path, found in one
/// walk that follows no symlink and checked to be the very object the supervisor resolved
/// (device and inode, held open by the supervisor so neither can be reused meanwhile).
fn source<'a>(bind: &'a Bind, prepared: Option<RawFd>) -> Result<Source<'a>, MountError> {
    let what = format!("clone {}", bind.host.path.display());
    if let Some(fd) = prepared {
        // SAFETY: `fd` is this process's copy (made by the clone) of a tree the supervisor
        // prepared; nothing else in this process uses or closes it.
        let tree = unsafe { OwnedFd::from_raw_fd(fd) };
        return Ok(Source { bind, tree });
    }
    let found = crate::paths::dir::open_nofollow(&bind.host.path, nix::fcntl::OFlag::O_PATH)
        .map_err(fail(what.clone()))?;
    let got = fstat_id(&found).map_err(fail(what.clone()))?;
    if got != (bind.host.dev, bind.host.ino) {
        return Err(MountError {
            step: format!("{what}: changed since it was checked"),
            errno: libc::ESTALE,
        });
    }
    let tree = clone_fd_tree(found.as_raw_fd()).map_err(fail(what))?;
    set_attrs(tree.as_raw_fd(), None, bind.attrs(), true)
        .map_err(fail(format!("flag {}", bind.host.path.display())))?;
    Ok(Source { bind, tree })
}

pub(super) fn mount_tmpfs(
    target: &Path,
    mode: &str,
    size: u64,
    flags: MsFlags,
) -> Result<(), MountError> {
    let data = format!("mode={mode},size={size}");
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        flags,
        Some(data.as_str()),
    )
    .map_err(nix_fail(format!("tmpfs on {}", target.display())))
}

/// Builds the new root from `plan` and pivots into it. Runs inside the new user and mount
/// namespaces, after the identity switch, as the sandbox's pid 1. `prepared` holds the
/// supervisor's copies of the bind sources (see [`prepare`]), or is empty.
pub fn build_root(plan: &RootfsPlan, prepared: &[RawFd]) -> Result<(), MountError> {
    // Nothing done here may propagate back to the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(nix_fail("make / private"))?;

    // 1. Every source, before the staging tmpfs hides the host's /tmp.
    let mut prepared = prepared.iter().copied();
    let system: Vec<Source> = plan
        .system
        .iter()
        .map(|b| source(b, prepared.next()))
        .collect::<Result<_, _>>()?;
    let exposures: Vec<Source> = plan
        .exposures
        .iter()
        .map(|b| source(b, prepared.next()))
        .collect::<Result<_, _>>()?;
    let mut nodes = Vec::new();
    for name in DEV_NODES {
        let host = Path::new("/dev").join(name);
        if !host.exists() {
            continue;
        }
        let tree = clone_tree(&host, false).map_err(fail(format!("clone {}", host.display())))?;
        // Read-only: a device is read and written all the same, but its inode (the
        // host's, shared by every sandbox) is never touched, or its times would carry
        // data from one sandbox to another that share nothing else. (A terminal's times
        // the kernel stamps itself on reads and writes: `tty` is listed as not covered.)
        set_attrs(
            tree.as_raw_fd(),
            None,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC | MOUNT_ATTR_RDONLY,
            false,
        )
        .map_err(fail(format!("flag {}", host.display())))?;
        nodes.push((name, tree));
    }

    // 2. The empty root: the sandbox's one tmpfs, which also holds `/tmp` and `/dev/shm`
    //    (see `writable_dir`), so sized for them, with a mebibyte for its own few files
    //    (0, no cap, stays 0).
    let size = match plan.tmp_size {
        0 => 0,
        n => n.saturating_add(1 << 20),
    };
    mount_tmpfs(
        Path::new(STAGE),
        "0755",
        size,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )?;
    let root = nix::fcntl::open(
        STAGE,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(nix_fail("open the new root"))?;

    for src in &system {
        let at = mount_point(&root, &src.bind.target, src.bind.is_dir())?;
        attach(&src.tree, &at).map_err(fail(format!("mount {}", src.bind.target.display())))?;
    }
    for (link, text) in &plan.links {
        std::os::unix::fs::symlink(text, stage_path(link))
            .map_err(fail(format!("link {}", link.display())))?;
    }

    if let Some(text) = &plan.resolv_conf {
        place_resolv_conf(&root, text)?;
    }

    // 3. Private /tmp.
    writable_dir(&root, Path::new("/tmp"), tmp_attrs(plan))?;

    // 4. Minimal /dev.
    build_dev(&root, plan, nodes)?;

    // 5. Private /proc, mounted while the host's is still visible (the kernel refuses a
    //    new proc in a user namespace that has no fully visible one).
    super::procfs::build(&root, &plan.proc_view)?;

    // 6. The user's exposures, parents before children.
    for src in &exposures {
        let at = mount_point(&root, &src.bind.target, src.bind.is_dir())?;
        attach(&src.tree, &at).map_err(fail(format!("mount {}", src.bind.target.display())))?;
    }

    // 7. Pivot.
    drop(root);
    nix::unistd::chdir(STAGE).map_err(nix_fail("chdir to the new root"))?;
    nix::unistd::pivot_root(".", ".").map_err(nix_fail("pivot_root"))?;
    // The old root is now stacked under the new one: detach it, and the host is gone.
    umount2(".", MntFlags::MNT_DETACH).map_err(nix_fail("detach the old root"))?;
    nix::unistd::chdir("/").map_err(nix_fail("chdir /"))?;
    set_attrs(
        libc::AT_FDCWD,
        Some(Path::new("/")),
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        false,
    )
    .map_err(fail("read-only root"))?;
    Ok(())
}

/// The sandbox's own `/etc/resolv.conf` (egress: it names the broker's stub), in place of
/// the host's bound `/etc`'s: bound over the host's file, read-only; where the host's is a
/// symlink (systemd-resolved's stub file, say), written where the link points, in the new
/// root (created without following any link, so it cannot land outside it). Without a
/// host file at all, resolvers already ask 127.0.0.1.
fn place_resolv_conf(root: &OwnedFd, text: &str) -> Result<(), MountError> {
    use std::io::Write;
    let name = Path::new("/etc/resolv.conf");
    let staged = stage_path(name);
    let step = "the sandbox's /etc/resolv.conf";
    let write = |at: &Path| -> Result<(), MountError> {
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(at)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(fail(step))
    };
    let meta = match std::fs::symlink_metadata(&staged) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(fail(step)(e)),
    };
    let over = if meta.file_type().is_symlink() {
        let link = std::fs::read_link(&staged).map_err(fail(step))?;
        let target = lexical_join(Path::new("/etc"), &link);
        match std::fs::symlink_metadata(stage_path(&target)) {
            // A file in a bound system directory (systemd-resolved's static file under
            // /usr): bound over, like the host's own file.
            Ok(m) if m.file_type().is_file() => stage_path(&target),
            Ok(_) => {
                return Err(fail(step)(std::io::Error::other(format!(
                    "/etc/resolv.conf leads to {}, which is not a file",
                    target.display()
                ))));
            }
            // Nowhere yet (the stub file of a resolver that is not in the sandbox): made
            // in the new root.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                drop(mount_point(root, &target, false)?);
                return write(&stage_path(&target));
            }
            Err(e) => return Err(fail(step)(e)),
        }
    } else {
        staged
    };
    let temp = Path::new("/.resolv.conf");
    drop(mount_point(root, temp, false)?);
    write(&stage_path(temp))?;
    mount(
        Some(&stage_path(temp)),
        &over,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(nix_fail(step))?;
    set_attrs(
        libc::AT_FDCWD,
        Some(&over),
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
        false,
    )
    .map_err(fail(step))?;
    // The mount holds the file now; the root keeps no trace of it.
    std::fs::remove_file(stage_path(temp)).map_err(fail(step))
}

/// `link` read from a symlink in `dir`, as an absolute path with `.` and `..` applied by
/// name (never above `/`).
fn lexical_join(dir: &Path, link: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = if link.is_absolute() {
        PathBuf::from("/")
    } else {
        dir.to_path_buf()
    };
    for c in link.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// Mount attributes of the writable directories (`/tmp`, `/dev/shm`).
fn tmp_attrs(plan: &RootfsPlan) -> u64 {
    let attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if plan.noexec_tmp {
        attrs | MOUNT_ATTR_NOEXEC
    } else {
        attrs
    }
}

/// A writable directory of the root's tmpfs at `target` (`/tmp`, `/dev/shm`): made with
/// mode 1777 and bound onto itself with `attrs`, so that it stays writable when the root
/// is made read-only. The sandbox's files never cross it: a link or rename to the rest of
/// the root crosses a mount (EXDEV), and the rest is read-only.
///
/// Why not a tmpfs of its own, as the two were: each file system a sandbox keeps is one
/// more the kernel walks each time any memory cgroup on the host goes offline (its
/// memory-accounted lists are reparented), so the cost of every sandbox's end grows with
/// the file systems of all the sandboxes alive. `/tmp` and `/dev/shm` share the root's cap
/// (`tmp_size`), as their pages always shared the memory limit.
fn writable_dir(root: &OwnedFd, target: &Path, attrs: u64) -> Result<(), MountError> {
    let at = mount_point(root, target, true)?;
    // By path: only pid 1 runs in this mount namespace yet, and the path is its own.
    std::fs::set_permissions(
        stage_path(target),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .map_err(fail(format!("mode of {}", target.display())))?;
    let tree = clone_fd_tree(at.as_raw_fd()).map_err(fail(format!("bind {}", target.display())))?;
    set_attrs(tree.as_raw_fd(), None, attrs, false)
        .map_err(fail(format!("flag {}", target.display())))?;
    attach(&tree, &at).map_err(fail(format!("mount {}", target.display())))
}

fn build_dev(
    root: &OwnedFd,
    plan: &RootfsPlan,
    nodes: Vec<(&str, OwnedFd)>,
) -> Result<(), MountError> {
    // A directory of the root's tmpfs, read-only with it: mount points and links.
    let dev = Path::new("/dev");
    let dev_dir = mount_point(root, dev, true)?;
    for (name, tree) in nodes {
        // Beneath the directory just opened, not walked to from the root again.
        let at = mount_point(&dev_dir, Path::new(name), false)?;
        attach(&tree, &at).map_err(fail(format!("mount /dev/{name}")))?;
    }
    let pts = dev.join("pts");
    mount_point(root, &pts, true)?;
    mount(
        Some("devpts"),
        &stage_path(&pts),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(DEVPTS_OPTIONS),
    )
    .map_err(nix_fail("devpts on /dev/pts"))?;
    if plan.dev_shm {
        writable_dir(root, &dev.join("shm"), tmp_attrs(plan))?;
    }
    for (link, text) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(text, stage_path(&dev.join(link)))
            .map_err(fail(format!("link /dev/{link}")))?;
    }
    Ok(())
}

/// The top-level entries of the host root that follow `/usr` on merged-/usr systems:
/// returns (links to recreate, directories to bind read-only).
pub fn host_top_level() -> (Vec<(PathBuf, PathBuf)>, Vec<PathBuf>) {
    let mut links = Vec::new();
    let mut dirs = Vec::new();
    for name in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let p = Path::new("/").join(name);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(t) = std::fs::read_link(&p) {
                    links.push((p, t));
                }
            }
            Ok(m) if m.is_dir() => dirs.push(p),
            _ => {}
        }
    }
    (links, dirs)
}

/// Whether `target` lies in a part of the sandbox hatchery itself provides.
pub fn is_reserved(target: &Path) -> bool {
    [Path::new("/proc"), Path::new("/dev")]
        .iter()
        .any(|r| target == *r || target.starts_with(r))
        || target == Path::new("/tmp")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolv_conf_link_is_followed_by_name_and_never_above_the_root() {
        let etc = Path::new("/etc");
        for (link, want) in [
            (
                "../run/systemd/resolve/stub-resolv.conf",
                "/run/systemd/resolve/stub-resolv.conf",
            ),
            ("/run/resolvconf/resolv.conf", "/run/resolvconf/resolv.conf"),
            ("resolv.conf.real", "/etc/resolv.conf.real"),
            ("../../../../x/./y", "/x/y"),
        ] {
            assert_eq!(
                lexical_join(etc, Path::new(link)),
                PathBuf::from(want),
                "{link}"
            );
        }
    }
}
