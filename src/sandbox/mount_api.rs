//! The kernel's new mount API (`open_tree`, `mount_setattr`, `move_mount`, `openat2`) as
//! small safe functions, and the error every mount step returns.
//!
//! Why a module of its own: the root (`mounts`) and the `/proc` view (`procfs`) are both
//! built from these; neither needs the other's plan to do so.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// A failed step: what was being done, and the errno.
#[derive(Debug)]
pub struct MountError {
    pub step: String,
    pub errno: i32,
}

pub(super) fn fail(step: impl Into<String>) -> impl FnOnce(io::Error) -> MountError {
    let step = step.into();
    move |e| MountError {
        step,
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    }
}

pub(super) fn nix_fail(step: impl Into<String>) -> impl FnOnce(nix::Error) -> MountError {
    let step = step.into();
    move |e| MountError {
        step,
        errno: e as i32,
    }
}

/// Where the new root is assembled (in the sandbox's private mount namespace only).
pub(super) const STAGE: &str = "/tmp";

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
pub(super) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(super) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(super) const MOUNT_ATTR_NODEV: u64 = 0x4;
pub(super) const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn owned(rc: libc::c_long) -> io::Result<OwnedFd> {
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// A detached copy of the mount tree at `path` (open_tree with OPEN_TREE_CLONE).
pub(super) fn clone_tree(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    let flags = OPEN_TREE_CLONE
        | libc::O_CLOEXEC as libc::c_uint
        | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint
        | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: open_tree reads the NUL-terminated path and returns a new fd or -1.
    owned(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) })
}

/// A detached recursive copy of the mount tree at the object `fd` refers to (an `O_PATH`
/// descriptor): no path is looked up.
pub(super) fn clone_fd_tree(fd: RawFd) -> io::Result<OwnedFd> {
    let empty = CString::default();
    let flags = OPEN_TREE_CLONE
        | libc::O_CLOEXEC as libc::c_uint
        | libc::AT_EMPTY_PATH as libc::c_uint
        | AT_RECURSIVE;
    // SAFETY: open_tree with a descriptor and an empty path (AT_EMPTY_PATH); returns a new
    // fd or -1.
    owned(unsafe { libc::syscall(libc::SYS_open_tree, fd, empty.as_ptr(), flags) })
}

/// Sets mount attributes (and private propagation) on a detached tree or a path.
pub(super) fn set_attrs(
    fd: RawFd,
    path: Option<&Path>,
    set: u64,
    recursive: bool,
) -> io::Result<()> {
    set_attrs_idmap(fd, path, set, recursive, None)
}

/// [`set_attrs`], also idmapping the tree through the user namespace `userns` when given.
pub(super) fn set_attrs_idmap(
    fd: RawFd,
    path: Option<&Path>,
    set: u64,
    recursive: bool,
    userns: Option<RawFd>,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: set
            | if userns.is_some() {
                MOUNT_ATTR_IDMAP
            } else {
                0
            },
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: userns.map_or(0, |fd| fd as u64),
    };
    let c = match path {
        Some(p) => cpath(p)?,
        None => CString::default(),
    };
    let flags = if path.is_none() {
        libc::AT_EMPTY_PATH as libc::c_uint
    } else {
        0
    } | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: mount_setattr reads the path and the attr struct we own, of the size we pass.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            c.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Attaches the detached tree `from` onto the object `to` (an O_PATH fd).
pub(super) fn attach(from: &OwnedFd, to: &OwnedFd) -> io::Result<()> {
    let empty = CString::default();
    // SAFETY: move_mount with two valid fds and empty paths (the *_EMPTY_PATH flags).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from.as_raw_fd(),
            empty.as_ptr(),
            to.as_raw_fd(),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// openat2 beneath `dir` without following any symlink.
///
/// Why: a mount target resolved by path can be swapped for a symlink between the check and
/// the mount, and the host is mounted over instead (CVE-2021-30465, runc; CVE-2019-19921,
/// `/proc` mounted through a planted symlink).
fn open_beneath(dir: &OwnedFd, name: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = cpath(name)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH,
    };
    // SAFETY: openat2 reads the path and the open_how struct we own, of the size we pass.
    owned(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    })
}

/// Opens (creating as needed) the mount point for `target` beneath `root`, walking
/// component by component without following symlinks. Returns an O_PATH fd, or for a file
/// made here the descriptor that made it (a mount target all the same).
///
/// An existing piece is only opened: making it anyway would take write access to its file
/// system, which waits while a host file system under an exposure is frozen.
pub(super) fn mount_point(
    root: &OwnedFd,
    target: &Path,
    is_dir: bool,
) -> Result<OwnedFd, MountError> {
    let step = || format!("mount point {}", target.display());
    let comps: Vec<&std::ffi::OsStr> = target
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    // `None`: still at `root` itself, which is walked from but not opened again.
    let mut cur: Option<OwnedFd> = None;
    for (i, comp) in comps.iter().enumerate() {
        let dir = cur.as_ref().unwrap_or(root);
        let name = Path::new(comp);
        let want_dir = i + 1 < comps.len() || is_dir;
        let flags = libc::O_PATH | if want_dir { libc::O_DIRECTORY } else { 0 };
        let next = match open_beneath(dir, name, flags) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                if want_dir {
                    make_directory(dir, name)
                } else {
                    make_file(dir, name)
                }
            }
            opened => opened,
        };
        cur = Some(next.map_err(fail(step()))?);
    }
    match cur {
        Some(fd) => Ok(fd),
        None => open_beneath(root, Path::new("."), libc::O_PATH | libc::O_DIRECTORY)
            .map_err(fail(step())),
    }
}

/// Makes the directory `name` in `dir` (mode 0755) and opens it, never through a symlink:
/// what stands there by then (made meanwhile) is opened the same way.
fn make_directory(dir: &OwnedFd, name: &Path) -> io::Result<OwnedFd> {
    let c = cpath(name)?;
    // SAFETY: mkdirat relative to a directory fd we own; c is NUL-terminated.
    let made = if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    };
    open_beneath(dir, name, libc::O_PATH | libc::O_DIRECTORY).map_err(|e| match made {
        // Still missing: why it could not be made.
        Err(why) if e.raw_os_error() == Some(libc::ENOENT) => why,
        _ => e,
    })
}

/// Makes the empty file `name` in `dir` (mode 0644) and returns the descriptor that made
/// it; what stands there by then (made meanwhile) is opened O_PATH, never through a
/// symlink.
fn make_file(dir: &OwnedFd, name: &Path) -> io::Result<OwnedFd> {
    let c = cpath(name)?;
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    // SAFETY: openat relative to a directory fd we own; c is NUL-terminated. O_EXCL with
    // O_NOFOLLOW never opens anything that was there, a symlink included.
    match owned(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, 0o644) }.into()) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => open_beneath(dir, name, libc::O_PATH),
        made => made,
    }
}

pub(super) fn stage_path(target: &Path) -> PathBuf {
    Path::new(STAGE).join(target.strip_prefix("/").unwrap_or(target))
}

pub(super) fn fstat_id(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
    Ok((st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, symlink};

    fn step_err(e: MountError) -> io::Error {
        io::Error::other(format!("{}: errno {}", e.step, e.errno))
    }

    fn open_dir(path: &Path) -> io::Result<OwnedFd> {
        std::fs::File::open(path).map(OwnedFd::from)
    }

    #[test]
    fn missing_pieces_are_made_and_existing_ones_opened_as_they_are() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let root = open_dir(tmp.path())?;
        let made = mount_point(&root, Path::new("/a/b/c"), true).map_err(step_err)?;
        assert!(tmp.path().join("a/b/c").is_dir());
        assert_eq!(
            fstat_id(&made)?.1,
            std::fs::metadata(tmp.path().join("a/b/c"))?.ino()
        );
        let file = mount_point(&root, Path::new("/a/b/f"), false).map_err(step_err)?;
        assert_eq!(
            fstat_id(&file)?.1,
            std::fs::metadata(tmp.path().join("a/b/f"))?.ino()
        );
        // A file already there is opened, not made again: its content stays.
        std::fs::write(tmp.path().join("a/b/f"), "kept")?;
        drop(mount_point(&root, Path::new("a/b/f"), false).map_err(step_err)?);
        assert_eq!(std::fs::read_to_string(tmp.path().join("a/b/f"))?, "kept");
        // `..` and `.` name nothing: the walk stays beneath the root.
        drop(mount_point(&root, Path::new("/../a/./b"), true).map_err(step_err)?);
        assert!(!tmp.path().parent().unwrap_or(tmp.path()).join("a").exists());
        // The root itself.
        drop(mount_point(&root, Path::new("/"), true).map_err(step_err)?);
        Ok(())
    }

    #[test]
    fn a_symlink_anywhere_on_the_way_is_refused_and_nothing_is_made_through_it() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let outside = tempfile::tempdir()?;
        let root = open_dir(tmp.path())?;
        symlink(outside.path(), tmp.path().join("dir"))?;
        symlink(outside.path().join("gone"), tmp.path().join("dangling"))?;
        symlink(outside.path().join("file"), tmp.path().join("file"))?;
        for (target, is_dir) in [
            ("/dir/x", true),
            ("/dir/x", false),
            ("/dir", true),
            ("/dangling", true),
            ("/dangling", false),
            ("/dangling/x", false),
            ("/file", false),
        ] {
            let got = mount_point(&root, Path::new(target), is_dir);
            assert!(got.is_err(), "{target} (dir: {is_dir}) was opened");
        }
        assert_eq!(
            std::fs::read_dir(outside.path())?.count(),
            0,
            "made through a link"
        );
        // A piece that cannot be made says why (a file where a directory is wanted).
        std::fs::write(tmp.path().join("plain"), "")?;
        let err = mount_point(&root, Path::new("/plain/x"), true).err();
        assert!(
            err.is_some_and(|e| e.step == "mount point /plain/x" && e.errno == libc::ENOTDIR),
            "not the reason"
        );
        Ok(())
    }
}
