//! The user namespace: who the sandbox is, inside and on the host.
//!
//! Inside, the payload is uid 0 with no capabilities. On the host it is never root: a
//! privileged supervisor maps inside-0 to an unprivileged host id (65534 unless told
//! otherwise), an unprivileged one maps its own id. Until the maps are written the new
//! process still carries the supervisor's host credentials, so the child does nothing but
//! wait until the supervisor says the maps are in place, then switches to the mapped ids.
//!
//! An unprivileged supervisor whose user has subordinate ids (`/etc/subuid`, `/etc/subgid`)
//! and the setuid helpers `newuidmap`/`newgidmap` also maps that range (inside ids 1..), so
//! sandboxes can hold ids other than the caller's: the controller gives each worker its own.

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid};
use serde::Serialize;

/// The host id a privileged supervisor gives sandboxes by default (the overflow "nobody").
pub const DEFAULT_HOST_ID: u32 = 65534;

/// One line of a uid_map/gid_map: `count` ids from `inside` map to `outside` on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IdMapping {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// The identity a sandbox runs with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Identity {
    pub uid_maps: Vec<IdMapping>,
    pub gid_maps: Vec<IdMapping>,
    /// Host uid/gid of the payload (inside uid/gid 0).
    pub host_uid: u32,
    pub host_gid: u32,
    /// The supervisor is unprivileged: setgroups(2) must be denied before writing gid_map.
    pub rootless: bool,
    /// Write the maps with these setuid helpers (newuidmap, newgidmap) instead of directly.
    #[serde(skip)]
    pub helpers: Option<(PathBuf, PathBuf)>,
    /// The inside uid/gid the payload runs as (0 unless the controller picks another id of
    /// the mapped range).
    pub payload_ids: (u32, u32),
}

/// A range of subordinate ids from `/etc/subuid` or `/etc/subgid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubIdRange {
    pub start: u32,
    pub count: u32,
}

/// Finds the first range for `user` (by name or numeric id) in subuid/subgid text.
pub fn parse_subid(text: &str, name: Option<&str>, id: u32) -> Option<SubIdRange> {
    text.lines().find_map(|line| {
        let mut f = line.trim().split(':');
        let (owner, start, count) = (f.next()?, f.next()?, f.next()?);
        let owner_matches = Some(owner) == name || owner.parse::<u32>().ok() == Some(id);
        if !owner_matches {
            return None;
        }
        let (start, count) = (start.parse::<u32>().ok()?, count.parse::<u32>().ok()?);
        (count > 0 && start.checked_add(count).is_some()).then_some(SubIdRange { start, count })
    })
}

fn find_helper(name: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// The name of `uid` in the host's user database, asked once per process for the first
/// uid asked about (the caller's own): a rootless controller's launcher builds an identity
/// for every worker it starts, and the database may be slow, or never answer, while the
/// name of the process's own uid does not change under it. The controller asks before it
/// forks the launcher, which inherits the answer.
fn user_name(uid: u32) -> Option<String> {
    static FIRST: std::sync::OnceLock<(u32, Option<String>)> = std::sync::OnceLock::new();
    let look_up = |uid: u32| {
        nix::unistd::User::from_uid(Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name)
    };
    match FIRST.get_or_init(|| (uid, look_up(uid))) {
        (first, name) if *first == uid => name.clone(),
        _ => look_up(uid),
    }
}

/// The caller's subordinate uid and gid ranges, when both files and both helpers exist.
pub fn subordinate_ranges(uid: u32) -> Option<(SubIdRange, SubIdRange, PathBuf, PathBuf)> {
    let name = user_name(uid);
    let subuid = std::fs::read_to_string("/etc/subuid").ok()?;
    let subgid = std::fs::read_to_string("/etc/subgid").ok()?;
    let gid = nix::unistd::getegid().as_raw();
    let u = parse_subid(&subuid, name.as_deref(), uid)?;
    let g = parse_subid(&subgid, name.as_deref(), gid)
        .or_else(|| parse_subid(&subgid, name.as_deref(), uid))?;
    Some((u, g, find_helper("newuidmap")?, find_helper("newgidmap")?))
}

impl Identity {
    /// The identity for the calling user: root maps to `host` (a leased id pair, see
    /// [`super::idpool`], or 65534:65534 when none is given), an unprivileged caller maps
    /// to itself.
    pub fn for_caller(host: Option<(u32, u32)>) -> Identity {
        let euid = nix::unistd::geteuid().as_raw();
        let egid = nix::unistd::getegid().as_raw();
        let rootless = euid != 0;
        let (host_uid, host_gid) = if rootless {
            (euid, egid)
        } else {
            host.unwrap_or((DEFAULT_HOST_ID, DEFAULT_HOST_ID))
        };
        let mut id = Identity {
            uid_maps: vec![IdMapping {
                inside: 0,
                outside: host_uid,
                count: 1,
            }],
            gid_maps: vec![IdMapping {
                inside: 0,
                outside: host_gid,
                count: 1,
            }],
            host_uid,
            host_gid,
            rootless,
            helpers: None,
            payload_ids: (0, 0),
        };
        if rootless {
            if let Some((u, g, newuidmap, newgidmap)) = subordinate_ranges(euid) {
                id.uid_maps.push(IdMapping {
                    inside: 1,
                    outside: u.start,
                    count: u.count,
                });
                id.gid_maps.push(IdMapping {
                    inside: 1,
                    outside: g.start,
                    count: g.count,
                });
                id.helpers = Some((newuidmap, newgidmap));
            }
        }
        id
    }

    /// How many inside ids are mapped (ids 0..n may be used by payloads).
    pub fn mapped_ids(&self) -> u32 {
        self.uid_maps
            .iter()
            .map(|m| m.inside.saturating_add(m.count))
            .max()
            .unwrap_or(1)
            .min(
                self.gid_maps
                    .iter()
                    .map(|m| m.inside.saturating_add(m.count))
                    .max()
                    .unwrap_or(1),
            )
    }

    fn map_text(maps: &[IdMapping]) -> String {
        maps.iter()
            .map(|m| format!("{} {} {}\n", m.inside, m.outside, m.count))
            .collect()
    }

    /// Writes the maps of the sandbox process `pid` (supervisor side).
    pub fn write_maps(&self, pid: i32) -> io::Result<()> {
        if let Some((newuidmap, newgidmap)) = &self.helpers {
            for (helper, maps) in [(newuidmap, &self.uid_maps), (newgidmap, &self.gid_maps)] {
                let mut cmd = std::process::Command::new(helper);
                cmd.arg(pid.to_string());
                for m in maps {
                    cmd.args([
                        m.inside.to_string(),
                        m.outside.to_string(),
                        m.count.to_string(),
                    ]);
                }
                let out = cmd.stdin(std::process::Stdio::null()).output()?;
                if !out.status.success() {
                    return Err(io::Error::other(format!(
                        "{} failed: {}",
                        helper.display(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
            }
            return Ok(());
        }
        let write = |file: &str, text: &str| -> io::Result<()> {
            let path = format!("/proc/{pid}/{file}");
            let mut f = std::fs::OpenOptions::new().write(true).open(&path)?;
            // One write(2): the kernel accepts a map only as a single write.
            f.write_all(text.as_bytes())
                .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
        };
        write("uid_map", &Identity::map_text(&self.uid_maps))?;
        if self.rootless {
            write("setgroups", "deny")?;
        }
        write("gid_map", &Identity::map_text(&self.gid_maps))?;
        Ok(())
    }
}

/// A user namespace made only to carry an id mapping for idmapped mounts
/// (`mount_setattr(MOUNT_ATTR_IDMAP)`): a short-lived child enters a new user namespace,
/// the maps are written, and the namespace is kept by the returned descriptor after the
/// child has gone. Needs a privileged, single-threaded caller.
pub fn idmap_userns(uid_maps: &[IdMapping], gid_maps: &[IdMapping]) -> io::Result<OwnedFd> {
    super::process::ensure_single_threaded()?;
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (done_r, done_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: the caller is single-threaded (checked above); the child makes only the
    // async-signal-safe calls unshare, write, read and _exit.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            // Only the parent may hold the write end, or the read below never ends.
            drop(done_w);
            drop(ready_r);
            let ok = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
            let _ = nix::unistd::write(&ready_w, &[u8::from(ok)]);
            let mut b = [0u8; 1];
            let _ = nix::unistd::read(&done_r, &mut b);
            // SAFETY: leave without running the parent's destructors in this copy.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(ready_w);
            drop(done_r);
            let result = (|| {
                let mut b = [0u8; 1];
                match nix::unistd::read(&ready_r, &mut b) {
                    Ok(1) if b[0] == 1 => {}
                    _ => return Err(io::Error::other("cannot create a user namespace")),
                }
                let pid = child.as_raw();
                let write = |file: &str, text: &str| -> io::Result<()> {
                    let path = format!("/proc/{pid}/{file}");
                    let mut f = std::fs::OpenOptions::new().write(true).open(&path)?;
                    f.write_all(text.as_bytes())
                };
                write("uid_map", &Identity::map_text(uid_maps))?;
                write("gid_map", &Identity::map_text(gid_maps))?;
                let ns = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
                Ok(OwnedFd::from(ns))
            })();
            drop(done_w);
            let _ = super::wait::reap_child(child);
            result
        }
    }
}

/// The mapping of an idmapped mount through which nothing on disk is owned by the
/// sandbox: only `null` (an id nothing on disk has) is mapped. Every write needs mapped
/// ids (the kernel refuses MAY_WRITE on an inode with an unmapped owner or group), so
/// such a mount gives no write channel at all: no FIFO opened for writing, no `connect`
/// to a unix socket. Reads go by the "other" permission bits.
pub fn null_idmap(null: (u32, u32)) -> io::Result<std::os::fd::BorrowedFd<'static>> {
    use std::os::fd::AsFd;
    static NULL: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd.as_fd());
    }
    let one = |id: u32| IdMapping {
        inside: id,
        outside: id,
        count: 1,
    };
    let fd = idmap_userns(&[one(null.0)], &[one(null.1)])?;
    Ok(NULL.get_or_init(|| fd).as_fd())
}

/// The mapping of an idmapped read-write mount: what `uid` owns on disk belongs to the
/// sandbox's host uid, and what the sandbox creates is stored as `uid` (so a workspace
/// never needs to be handed to the sandbox's uid); so with `group` (see
/// [`super::owner_groups::owners_group`]) and the sandbox's host gid. Other owners stay unmapped (never
/// writable); other groups map to themselves, so a file of the owner's in another group
/// stays writable for the owner. Without `group` every group maps to itself: the sandbox
/// then has no group's rights there, and what it creates keeps its own group.
pub fn owner_idmap(uid: u32, group: Option<u32>, sandbox: (u32, u32)) -> io::Result<OwnedFd> {
    let uids = [IdMapping {
        inside: uid,
        outside: sandbox.0,
        count: 1,
    }];
    let Some(group) = group else {
        let every_group = IdMapping {
            inside: 0,
            outside: 0,
            count: u32::MAX,
        };
        return idmap_userns(&uids, &[every_group]);
    };
    let mut gids = vec![IdMapping {
        inside: group,
        outside: sandbox.1,
        count: 1,
    }];
    // Identity for every other gid, except the two taken above (maps are one-to-one).
    let (a, b) = (group.min(sandbox.1), group.max(sandbox.1));
    for (lo, hi) in [
        (0, a),
        (a.saturating_add(1), b),
        (b.saturating_add(1), u32::MAX),
    ] {
        if hi > lo && lo != group {
            gids.push(IdMapping {
                inside: lo,
                outside: lo,
                count: hi - lo,
            });
        }
    }
    idmap_userns(&uids, &gids)
}

/// While it lives, the calling (privileged, single-threaded) supervisor's effective uid is
/// the sandbox's host uid, with its capabilities kept: a user namespace cloned now is owned
/// by that uid, so the kernel charges what the sandbox holds under per-user limits
/// (inotify and fanotify instances, user namespaces, ...) to the sandbox's own id, never
/// to root (a sandbox once held all 128 of root's inotify instances).
pub struct CreatorGuard {
    securebits: libc::c_int,
    dumpable: libc::c_int,
    pdeathsig: libc::c_int,
    ppid: nix::unistd::Pid,
}

/// `SECBIT_NO_SETUID_FIXUP`: changing uids does not clear capabilities.
const SECBIT_NO_SETUID_FIXUP: libc::c_int = 1 << 2;

impl CreatorGuard {
    pub fn become_uid(uid: u32) -> io::Result<CreatorGuard> {
        // SAFETY: prctl queries with no pointer arguments (PR_GET_PDEATHSIG writes an int we own).
        let (securebits, dumpable, pdeathsig) = unsafe {
            let mut sig: libc::c_int = 0;
            libc::prctl(libc::PR_GET_PDEATHSIG, &mut sig as *mut libc::c_int);
            (
                libc::prctl(libc::PR_GET_SECUREBITS),
                libc::prctl(libc::PR_GET_DUMPABLE),
                sig,
            )
        };
        if securebits < 0 {
            return Err(io::Error::last_os_error());
        }
        let guard = CreatorGuard {
            securebits,
            dumpable,
            pdeathsig,
            ppid: nix::unistd::getppid(),
        };
        // SAFETY: PR_SET_SECUREBITS takes an integer.
        if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, securebits | SECBIT_NO_SETUID_FIXUP) } != 0
        {
            return Err(io::Error::last_os_error());
        }
        if let Err(e) = nix::unistd::seteuid(Uid::from_raw(uid)) {
            drop(guard);
            return Err(e.into());
        }
        Ok(guard)
    }

    /// The securebits the sandbox must restore in itself (it inherits the changed ones).
    pub fn original_securebits(&self) -> libc::c_int {
        self.securebits
    }
}

impl Drop for CreatorGuard {
    fn drop(&mut self) {
        let _ = nix::unistd::seteuid(Uid::from_raw(0));
        // SAFETY: prctl with integer arguments only.
        unsafe {
            libc::prctl(libc::PR_SET_SECUREBITS, self.securebits);
            if self.dumpable >= 0 {
                libc::prctl(libc::PR_SET_DUMPABLE, self.dumpable);
            }
            // A change of effective uid cleared the parent-death signal: arm it again, and
            // if the parent died in between, follow it now.
            if self.pdeathsig > 0 {
                libc::prctl(libc::PR_SET_PDEATHSIG, self.pdeathsig);
                if nix::unistd::getppid() != self.ppid {
                    libc::raise(self.pdeathsig);
                }
            }
        }
    }
}

/// Restores `securebits` in the calling process (the sandbox, which inherited the
/// creator guard's).
pub fn restore_securebits(securebits: libc::c_int) -> nix::Result<()> {
    // SAFETY: PR_SET_SECUREBITS takes an integer.
    let rc = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, securebits) };
    nix::errno::Errno::result(rc).map(drop)
}

/// What a sandbox may hold of the kernel objects that no cgroup accounts, set on its own
/// user namespace (`/proc/sys/user/max_*` are per user namespace, and bound everything
/// created in it whatever the host allows): no user namespace of its own — without one no
/// process in the sandbox can hold the capability any other kind of namespace needs, so
/// none can be made (seccomp refuses them too) — and a modest share of inotify and
/// fanotify, which the kernel otherwise charges up to the creator of the namespace.
pub const KERNEL_OBJECT_LIMITS: [(&str, u64); 5] = [
    ("max_user_namespaces", 0),
    ("max_inotify_instances", 64),
    ("max_inotify_watches", 65536),
    ("max_fanotify_groups", 16),
    ("max_fanotify_marks", 8192),
];

/// The sandbox user namespace's limit files, opened while the host's `/proc` is still
/// mounted writable and written once the sandbox has made every namespace and mount of
/// its own (building the root takes anonymous mount namespaces).
pub struct KernelObjectLimits {
    files: Vec<(&'static str, OwnedFd)>,
}

impl KernelObjectLimits {
    /// Opens the files (pid 1 of the sandbox, which holds every capability in its user
    /// namespace). A limit the kernel does not have is skipped.
    pub fn open() -> Result<KernelObjectLimits, (String, nix::errno::Errno)> {
        use nix::fcntl::{OFlag, open};
        use nix::sys::stat::Mode;
        let mut files = Vec::with_capacity(KERNEL_OBJECT_LIMITS.len());
        for (name, _) in KERNEL_OBJECT_LIMITS {
            let path = format!("/proc/sys/user/{name}");
            match open(
                path.as_str(),
                OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => files.push((name, fd)),
                Err(nix::errno::Errno::ENOENT) => continue,
                Err(e) => return Err((format!("limit {name}"), e)),
            }
        }
        Ok(KernelObjectLimits { files })
    }

    /// Writes [`KERNEL_OBJECT_LIMITS`].
    pub fn apply(self) -> Result<(), (String, nix::errno::Errno)> {
        for (name, fd) in self.files {
            let value = KERNEL_OBJECT_LIMITS
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, v)| *v);
            nix::unistd::write(&fd, value.to_string().as_bytes())
                .map_err(|e| (format!("limit {name}"), e))?;
        }
        Ok(())
    }
}

/// Inside the new namespace, after the maps are written: drop supplementary groups (when
/// allowed) and become the mapped uid/gid 0, which on the host is the unprivileged id.
pub fn assume_identity(identity: &Identity) -> nix::Result<()> {
    // Without this the process would keep the supervisor's supplementary groups. A rootless
    // supervisor that wrote gid_map itself had to deny setgroups: the groups stay (mapped to
    // the overflow gid, so they grant nothing they did not grant the caller).
    match nix::unistd::setgroups(&[]) {
        Err(nix::errno::Errno::EPERM) if identity.rootless => {}
        other => other?,
    }
    nix::unistd::setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0))?;
    nix::unistd::setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0))?;
    Ok(())
}

/// Checks, in a throw-away child, that this user can create a user namespace.
pub fn probe() -> Result<(), String> {
    // SAFETY: the child only calls unshare(2) and _exit(2).
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let ok = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
            // SAFETY: leave the child without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => match super::wait::reap_child(child) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
            Ok(_) => Err("unshare(CLONE_NEWUSER) is refused for this user".into()),
            Err(e) => Err(e.to_string()),
        },
        Err(e) => Err(format!("fork: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_text_is_one_line_per_mapping() {
        let maps = [
            IdMapping {
                inside: 0,
                outside: 1000,
                count: 1,
            },
            IdMapping {
                inside: 1,
                outside: 100000,
                count: 65536,
            },
        ];
        assert_eq!(Identity::map_text(&maps), "0 1000 1\n1 100000 65536\n");
    }

    #[test]
    fn subid_ranges_match_by_name_or_id() {
        let text = "alice:100000:65536\n1001:200000:1000\nbogus\nbob:x:1\ncarol:5:0\n";
        assert_eq!(
            parse_subid(text, Some("alice"), 1000),
            Some(SubIdRange {
                start: 100000,
                count: 65536
            })
        );
        assert_eq!(
            parse_subid(text, Some("dave"), 1001),
            Some(SubIdRange {
                start: 200000,
                count: 1000
            })
        );
        assert_eq!(parse_subid(text, Some("bob"), 7), None);
        assert_eq!(
            parse_subid(text, Some("carol"), 8),
            None,
            "an empty range is no range"
        );
        assert_eq!(
            parse_subid("x:4294967295:2\n", Some("x"), 9),
            None,
            "overflowing range"
        );
    }

    #[test]
    fn the_payload_is_never_host_root() {
        let id = Identity::for_caller(None);
        assert_ne!(id.host_uid, 0);
        assert_ne!(id.host_gid, 0);
    }
}
