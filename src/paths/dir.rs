//! Files in directories a sandbox may write, handled through a directory descriptor.
//!
//! A supervisor running as root must never write through something a sandbox planted: a
//! symlink at the name it is about to create (the report landed in a root-only host file),
//! a directory or FIFO where it expects a file, or a name swapped between a check and the
//! use. So every file hatchery reads or writes in such a place is reached like this:
//!
//! - the directory is opened once, its path resolved without following any symlink
//!   (`openat2` with `RESOLVE_NO_SYMLINKS`), and held as a descriptor: a rename of one of
//!   its ancestors later changes nothing;
//! - a file in it is named by one path component, opened relative to that descriptor with
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, `O_NOFOLLOW` and `O_NONBLOCK` (a FIFO put in
//!   place of a file never blocks the opener), and its type is checked on the descriptor;
//! - a file is created with `O_CREAT | O_EXCL` (which never follows a symlink), or as an
//!   unnamed `O_TMPFILE` that nothing else can see until it is linked;
//! - a whole-file replacement is written to a new inode, linked under a fresh random name,
//!   renamed over the target with `renameat` in the same directory, and then checked: the
//!   name must lead to the inode that was written, or the write is an error.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat2, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};
use nix::unistd::UnlinkatFlags;

/// How often a create retries a random name that turned out to be taken.
const NAME_ATTEMPTS: usize = 16;

fn io(e: Errno) -> io::Error {
    io::Error::from(e)
}

fn no_symlinks() -> ResolveFlag {
    ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

fn beneath() -> ResolveFlag {
    no_symlinks() | ResolveFlag::RESOLVE_BENEATH
}

/// `openat2`, retried on EAGAIN (the kernel's answer when a rename raced the walk) and EINTR.
pub fn open_how(dir: BorrowedFd<'_>, path: &Path, how: OpenHow) -> io::Result<OwnedFd> {
    let mut attempts = 0;
    loop {
        match openat2(dir, path, how) {
            Err(Errno::EAGAIN | Errno::EINTR) if attempts < 64 => attempts += 1,
            Err(Errno::ENOSYS) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "this kernel has no openat2(2) (Linux 5.6 or later is needed)",
                ));
            }
            other => return other.map_err(io),
        }
    }
}

/// Opens `path` (absolute, or relative to the current directory) without following any
/// symlink on the way, the last component included: ELOOP names a symlink somewhere in it.
/// (No `O_NOFOLLOW`: with `O_PATH` it would return the symlink itself.)
pub fn open_nofollow(path: &Path, flags: OFlag) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(no_symlinks());
    open_how(cwd(), path, how)
}

fn cwd() -> BorrowedFd<'static> {
    nix::fcntl::AT_FDCWD
}

/// A name that is exactly one normal path component (no `/`, `.`, `..`, NUL, not empty).
fn single_component(name: &OsStr) -> io::Result<&Path> {
    let p = Path::new(name);
    let mut comps = p.components();
    match (comps.next(), comps.next()) {
        (Some(Component::Normal(n)), None) if n == name => Ok(p),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a single file name", p.display()),
        )),
    }
}

fn is_type(st: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == kind
}

fn random_suffix() -> io::Result<String> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(format!("random source: {e}")))?;
    Ok(hex::encode(b))
}

/// A file written but not yet in place (see [`Dir::stage`]).
#[derive(Debug)]
pub struct Staged {
    pub file: File,
    /// Its temporary name, when the filesystem could not make an unnamed file.
    temp: Option<OsString>,
}

/// A directory held open by descriptor: every file operation is relative to it.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// Opens a directory, its path (absolute, or relative to the current directory)
    /// resolved without following any symlink.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = open_nofollow(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY).map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(
                    e.kind(),
                    format!(
                        "{}: a component is a symlink; name the real path{}",
                        path.display(),
                        std::fs::canonicalize(path)
                            .map(|r| format!(" ({})", r.display()))
                            .unwrap_or_default()
                    ),
                )
            } else {
                e
            }
        })?;
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Creates `path` if it is missing (one level: its parent must exist), with `mode`,
    /// then opens it as [`Dir::open`] does.
    pub fn create(path: &Path, mode: u32) -> io::Result<Dir> {
        match nix::unistd::mkdir(path, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => {
                return Err(io::Error::new(
                    io(e).kind(),
                    format!("{}: {e}", path.display()),
                ));
            }
        }
        Dir::open(path)
    }

    /// Creates `path` with `mode`, and any missing parent with 0755 (less the umask), each
    /// by descriptor from the deepest ancestor that exists, and opens it as [`Dir::open`]
    /// does. A symlink anywhere on the path is refused before anything is made (with
    /// `create_dir_all` the directory was made through it, then refused: left behind).
    /// Returns the directories this call made, outermost first, for a caller that must
    /// take them away again when it fails later.
    pub fn create_all(path: &Path, mode: u32) -> io::Result<(Dir, Vec<PathBuf>)> {
        let mut missing: Vec<&OsStr> = Vec::new();
        let mut existing = path;
        while let Err(e) = std::fs::symlink_metadata(existing) {
            let (Some(parent), Some(name), true) = (
                existing.parent(),
                existing.file_name(),
                e.kind() == io::ErrorKind::NotFound,
            ) else {
                return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display())));
            };
            missing.push(name);
            existing = parent;
        }
        let base = if existing.as_os_str().is_empty() {
            Path::new(".")
        } else {
            existing
        };
        let mut dir = Dir::open(base).map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                let real = std::fs::canonicalize(base)
                    .map(|r| {
                        format!(
                            " ({})",
                            missing.iter().rev().fold(r, |p, n| p.join(n)).display()
                        )
                    })
                    .unwrap_or_default();
                io::Error::new(
                    e.kind(),
                    format!(
                        "{}: a component is a symlink; name the real path{real}",
                        path.display()
                    ),
                )
            } else {
                e
            }
        })?;
        let mut made = Vec::new();
        while let Some(name) = missing.pop() {
            let name = name.to_str().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: a directory name that is not UTF-8", path.display()),
                )
            })?;
            let this_mode = if missing.is_empty() { mode } else { 0o755 };
            let (next, created) = dir.made_subdir(name, this_mode)?;
            if created {
                made.push(next.path.clone());
            }
            dir = next;
        }
        dir.path = path.to_path_buf();
        Ok((dir, made))
    }

    /// Opens the subdirectory `name`, creating it with `mode` when missing.
    pub fn subdir(&self, name: &str, mode: u32) -> io::Result<Dir> {
        self.made_subdir(name, mode).map(|(dir, _)| dir)
    }

    /// [`Dir::subdir`], and whether this call made it.
    fn made_subdir(&self, name: &str, mode: u32) -> io::Result<(Dir, bool)> {
        let rel = single_component(OsStr::new(name))?;
        let made =
            match nix::sys::stat::mkdirat(self.fd.as_fd(), rel, Mode::from_bits_truncate(mode)) {
                Ok(()) => true,
                Err(Errno::EEXIST) => false,
                Err(e) => return Err(io(e)),
            };
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .resolve(beneath());
        let dir = Dir {
            fd: open_how(self.fd.as_fd(), rel, how)?,
            path: self.path.join(name),
        };
        Ok((dir, made))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's own status (owner, mode).
    pub fn stat(&self) -> io::Result<FileStat> {
        fstat(&self.fd).map_err(io)
    }

    /// Sets the directory's own permission bits.
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        nix::sys::stat::fchmod(&self.fd, Mode::from_bits_truncate(mode)).map_err(io)
    }

    /// A second descriptor for the same directory.
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
        })
    }

    fn open_in(&self, name: &str, flags: OFlag, mode: u32) -> io::Result<OwnedFd> {
        let rel = single_component(OsStr::new(name))?;
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK)
            .mode(Mode::from_bits_truncate(mode))
            .resolve(beneath());
        open_how(self.fd.as_fd(), rel, how)
    }

    /// Opens the existing character device `name` for writing, into it (never through a
    /// symlink; anything else at `name` is an error).
    pub fn open_device(&self, name: &str) -> io::Result<File> {
        let fd = self.open_in(name, OFlag::O_WRONLY | OFlag::O_NOCTTY, 0)?;
        let st = fstat(&fd).map_err(io)?;
        if !is_type(&st, SFlag::S_IFCHR) {
            return Err(io::Error::other(format!(
                "{}: not a device",
                self.path.join(name).display()
            )));
        }
        // Opened without blocking (a FIFO put there must not hang the opener); a device is
        // then written as any descriptor is.
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL).map_err(io)?;
        let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(io)?;
        Ok(File::from(fd))
    }

    /// What the symlink `name` says (its text, not followed).
    pub fn read_link(&self, name: &str) -> io::Result<PathBuf> {
        let rel = single_component(OsStr::new(name))?;
        nix::fcntl::readlinkat(self.fd.as_fd(), rel)
            .map(PathBuf::from)
            .map_err(io)
    }

    /// Opens an existing regular file for reading (a symlink, FIFO, device or directory
    /// at `name` is an error, and nothing blocks). `Ok(None)` when there is no such name.
    pub fn open_read(&self, name: &str) -> io::Result<Option<File>> {
        Ok(self.open_read_sized(name)?.map(|(file, _)| file))
    }

    /// [`Dir::open_read`], with the file's size when it was opened.
    fn open_read_sized(&self, name: &str) -> io::Result<Option<(File, u64)>> {
        let fd = match self.open_in(name, OFlag::O_RDONLY, 0) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.named(name, e)),
        };
        let st = fstat(&fd).map_err(io)?;
        if !is_type(&st, SFlag::S_IFREG) {
            return Err(self.named(
                name,
                io::Error::new(io::ErrorKind::InvalidData, "not a regular file"),
            ));
        }
        clear_nonblock(&fd)?;
        Ok(Some((
            File::from(fd),
            u64::try_from(st.st_size).unwrap_or(0),
        )))
    }

    /// Reads a whole regular file of at most `limit` bytes (see [`Dir::open_read`]).
    pub fn read(&self, name: &str, limit: u64) -> io::Result<Option<Vec<u8>>> {
        let Some((file, size)) = self.open_read_sized(name)? else {
            return Ok(None);
        };
        // Room for what the file held when opened and one byte more, so that it is read in
        // one call and the end seen in the next (a read through `take` cannot tell its
        // size, and starts with 32 bytes). The limit still holds if it grew meanwhile.
        let room = usize::try_from(size.min(limit).saturating_add(1)).unwrap_or(0);
        let mut out = Vec::with_capacity(room);
        file.take(limit.saturating_add(1)).read_to_end(&mut out)?;
        if out.len() as u64 > limit {
            return Err(self.named(
                name,
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("larger than {limit} bytes"),
                ),
            ));
        }
        Ok(Some(out))
    }

    /// Creates a new file (never an existing name, never through a symlink), for writing.
    pub fn create_new(&self, name: &str, mode: u32, append: bool) -> io::Result<File> {
        let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
        if append {
            flags |= OFlag::O_APPEND;
        }
        let fd = self
            .open_in(name, flags, mode)
            .map_err(|e| self.named(name, e))?;
        clear_nonblock(&fd)?;
        Ok(File::from(fd))
    }

    /// Opens a regular file for appending, creating it when missing; a symlink, FIFO or
    /// directory at `name` is an error.
    pub fn open_append(&self, name: &str, mode: u32) -> io::Result<File> {
        let fd = self
            .open_in(
                name,
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_APPEND,
                mode,
            )
            .map_err(|e| self.named(name, e))?;
        let st = fstat(&fd).map_err(io)?;
        if !is_type(&st, SFlag::S_IFREG) {
            return Err(self.named(
                name,
                io::Error::new(io::ErrorKind::InvalidData, "not a regular file"),
            ));
        }
        clear_nonblock(&fd)?;
        Ok(File::from(fd))
    }

    /// Opens (creating when missing) a regular file for reading and writing, to hold
    /// locks on; a symlink, FIFO or directory at `name` is an error.
    pub fn open_lock(&self, name: &str, mode: u32) -> io::Result<OwnedFd> {
        let fd = self
            .open_in(name, OFlag::O_RDWR | OFlag::O_CREAT, mode)
            .map_err(|e| self.named(name, e))?;
        let st = fstat(&fd).map_err(io)?;
        if !is_type(&st, SFlag::S_IFREG) {
            return Err(self.named(
                name,
                io::Error::new(io::ErrorKind::InvalidData, "not a regular file"),
            ));
        }
        Ok(fd)
    }

    /// An unnamed file in this directory (`O_TMPFILE`), invisible until [`Dir::publish`]
    /// links it; `Ok(None)` where the filesystem cannot make one.
    pub fn tmpfile(&self, mode: u32) -> io::Result<Option<File>> {
        let how = OpenHow::new()
            .flags(OFlag::O_TMPFILE | OFlag::O_WRONLY | OFlag::O_CLOEXEC)
            .mode(Mode::from_bits_truncate(mode))
            .resolve(beneath());
        match open_how(self.fd.as_fd(), Path::new("."), how) {
            Ok(fd) => Ok(Some(File::from(fd))),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => Ok(None),
            Err(e) => Err(self.named(".", e)),
        }
    }

    /// Checks, without leaving anything behind, that a file can be created here: an
    /// unnamed file where the filesystem has them, else a named one removed at once.
    pub fn check_writable(&self) -> io::Result<()> {
        if self.tmpfile(0o600)?.is_some() {
            return Ok(());
        }
        let staged = self.stage("check", 0o600)?;
        if let Some(temp) = &staged.temp {
            let st = fstat(&staged.file).map_err(io)?;
            self.remove_if_is(temp, (st.st_dev, st.st_ino));
        }
        Ok(())
    }

    /// A new, empty file to become `name` by [`Dir::publish`]: unnamed (`O_TMPFILE`) where
    /// the filesystem has them, else created under a fresh random name beside `name`.
    pub fn stage(&self, name: &str, mode: u32) -> io::Result<Staged> {
        single_component(OsStr::new(name))?;
        if let Some(file) = self.tmpfile(mode)? {
            return Ok(Staged { file, temp: None });
        }
        for _ in 0..NAME_ATTEMPTS {
            let temp = format!(".{name}.tmp-{}", random_suffix()?);
            match self.create_new(&temp, mode, false) {
                Ok(file) => {
                    return Ok(Staged {
                        file,
                        temp: Some(OsString::from(temp)),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(self.named(
            name,
            io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary name"),
        ))
    }

    /// Writes `bytes` as the whole new content of `name` (see [`Dir::publish`]).
    pub fn write_atomically(&self, name: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
        let mut staged = self.stage(name, mode)?;
        if let Err(e) = staged.file.write_all(bytes) {
            self.discard(staged);
            return Err(self.named(name, e));
        }
        self.publish(staged, name)
    }

    /// Drops a staged file without publishing it.
    pub fn discard(&self, staged: Staged) {
        if let (Some(temp), Ok(st)) = (&staged.temp, fstat(&staged.file)) {
            self.remove_if_is(temp, (st.st_dev, st.st_ino));
        }
    }

    /// Makes a staged file the file at `name`, replacing whatever file was there, and
    /// checks that `name` then leads to exactly that file. The file and the directory are
    /// synced first, so the new content is durable when this returns.
    pub fn publish(&self, staged: Staged, name: &str) -> io::Result<()> {
        let rel = single_component(OsStr::new(name))?;
        let Staged { file, temp } = staged;
        file.sync_all().map_err(|e| self.named(name, e))?;
        let st = fstat(&file).map_err(io)?;
        let id = (st.st_dev, st.st_ino);
        let temp = match temp {
            Some(t) => t,
            None => self.link_fresh(&file, name)?,
        };
        // The temporary name is ours only as long as it leads to our inode.
        let at_temp = fstatat(
            self.fd.as_fd(),
            temp.as_os_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(io)?;
        if (at_temp.st_dev, at_temp.st_ino) != id {
            return Err(self.named(
                name,
                io::Error::other("its temporary file was replaced while it was being written"),
            ));
        }
        if let Err(e) = renameat(self.fd.as_fd(), temp.as_os_str(), self.fd.as_fd(), rel) {
            self.remove_if_is(&temp, id);
            return Err(self.named(name, io(e)));
        }
        let now = fstatat(self.fd.as_fd(), rel, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io)?;
        if (now.st_dev, now.st_ino) != id {
            return Err(self.named(
                name,
                io::Error::other("replaced by another file while it was being written"),
            ));
        }
        self.sync();
        Ok(())
    }

    /// Links an unnamed file under a fresh random name beside `name`, returning that name.
    fn link_fresh(&self, file: &File, name: &str) -> io::Result<OsString> {
        let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
        for _ in 0..NAME_ATTEMPTS {
            let temp = OsString::from(format!(".{name}.tmp-{}", random_suffix()?));
            match nix::unistd::linkat(
                cwd(),
                proc_path.as_str(),
                self.fd.as_fd(),
                temp.as_os_str(),
                AtFlags::AT_SYMLINK_FOLLOW,
            ) {
                Ok(()) => return Ok(temp),
                Err(Errno::EEXIST) => continue,
                Err(e) => return Err(self.named(name, io(e))),
            }
        }
        Err(self.named(
            name,
            io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary name"),
        ))
    }

    fn named(&self, name: &str, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("{}: {e}", self.path.join(name).display()))
    }

    /// Removes `name` only if it is still the file `id` (dev, ino).
    fn remove_if_is(&self, name: &OsStr, id: (u64, u64)) {
        if let Ok(st) = fstatat(self.fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            if (st.st_dev, st.st_ino) == id {
                let _ = nix::unistd::unlinkat(self.fd.as_fd(), name, UnlinkatFlags::NoRemoveDir);
            }
        }
    }

    /// Removes `name` if it is not a directory.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let rel = single_component(OsStr::new(name))?;
        nix::unistd::unlinkat(self.fd.as_fd(), rel, UnlinkatFlags::NoRemoveDir).map_err(io)
    }

    /// The status of `name` itself (a symlink is not followed); `Ok(None)` when missing.
    pub fn stat_entry(&self, name: &str) -> io::Result<Option<FileStat>> {
        let rel = single_component(OsStr::new(name))?;
        match fstatat(self.fd.as_fd(), rel, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(io(e)),
        }
    }

    /// Opens the existing subdirectory `name` (never through a symlink); `Ok(None)` when
    /// there is no such name.
    pub fn open_subdir(&self, name: &str) -> io::Result<Option<Dir>> {
        let rel = single_component(OsStr::new(name))?;
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .resolve(beneath());
        match open_how(self.fd.as_fd(), rel, how) {
            Ok(fd) => Ok(Some(Dir {
                fd,
                path: self.path.join(name),
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.named(name, e)),
        }
    }

    /// The names in this directory (without `.` and `..`), read through its descriptor.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        use std::os::unix::ffi::OsStrExt;
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(beneath());
        let fd = open_how(self.fd.as_fd(), Path::new("."), how)?;
        let mut listing = nix::dir::Dir::from_fd(fd).map_err(io)?;
        let mut out = Vec::new();
        for entry in listing.iter() {
            let name = entry.map_err(io)?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                out.push(OsStr::from_bytes(&name).to_os_string());
            }
        }
        Ok(out)
    }

    /// Whether this directory is `other` or lies anywhere beneath it, judged by device
    /// and inode while walking up through `..` (so no spelling of a path, bind mount or
    /// symlink elsewhere can hide it).
    pub fn is_within(&self, other: &Dir) -> io::Result<bool> {
        let target = other.stat()?;
        let target = (target.st_dev, target.st_ino);
        // O_PATH: walking up needs only search permission, not the right to list.
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(no_symlinks());
        let mut current = self.fd.try_clone()?;
        // Deeper than any real tree; a loop cannot outlast it.
        for _ in 0..4096 {
            let st = fstat(&current).map_err(io)?;
            if (st.st_dev, st.st_ino) == target {
                return Ok(true);
            }
            let parent = open_how(current.as_fd(), Path::new(".."), how)?;
            let up = fstat(&parent).map_err(io)?;
            if (up.st_dev, up.st_ino) == (st.st_dev, st.st_ino) {
                return Ok(false);
            }
            current = parent;
        }
        Ok(false)
    }

    /// Makes creates and renames in this directory durable (best effort).
    pub fn sync(&self) {
        let _ = nix::unistd::fsync(&self.fd);
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn clear_nonblock(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, fcntl};
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(io)?;
    let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
    fcntl(fd, FcntlArg::F_SETFL(flags)).map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod read_tests {
    use super::Dir;
    use std::io;

    #[test]
    fn a_file_is_read_whole_up_to_its_limit_and_refused_past_it() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = Dir::open(tmp.path())?;
        for (name, len) in [("empty", 0usize), ("at", 100), ("past", 101), ("small", 7)] {
            std::fs::write(tmp.path().join(name), vec![b'x'; len])?;
        }
        assert_eq!(dir.read("empty", 100)?, Some(Vec::new()));
        assert_eq!(dir.read("small", 100)?, Some(vec![b'x'; 7]));
        assert_eq!(dir.read("at", 100)?, Some(vec![b'x'; 100]));
        assert!(dir.read("past", 100).is_err());
        assert_eq!(dir.read("missing", 100)?, None);
        nix::unistd::mkfifo(&tmp.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU)
            .map_err(io::Error::from)?;
        assert!(dir.read("fifo", 100).is_err());
        Ok(())
    }
}
