//! The executable allowlist: only the listed files (and the dynamic loader they name) may
//! be executed, enforced by the kernel, never by matching command strings.
//!
//! Four mechanisms, each closing one way to run something else:
//!
//! 1. Landlock's execute right is granted on the listed files alone (a rule per file, with
//!    read), instead of on `/usr`, `/tmp` and the exposed paths. execve(2) of any other
//!    file fails with EACCES, and so does a script whose `#!` interpreter is not listed
//!    (the kernel opens the interpreter for execution too).
//! 2. The ELF interpreter named by each listed program (`PT_INTERP`, e.g.
//!    `/lib64/ld-linux-x86-64.so.2`) gets the execute right as well: without it no
//!    dynamically linked program starts. Run as a program, the loader opens its argument
//!    with a plain read and maps it executable, which the execute right does not cover;
//!    3 and 4 close that.
//! 3. Directories of executables ([`EXEC_DIRS`]: `/usr/bin`, `/usr/sbin`, `/usr/libexec`,
//!    ...) are not readable: read rules on their ancestors are split into rules on the
//!    siblings, so `/usr/lib`, `/usr/share` and `/etc` stay readable and `/usr/bin/perl`
//!    cannot even be opened by `ld.so /usr/bin/perl`.
//! 4. Places the sandbox can write (`/tmp`, `/dev/shm`, `--rw` paths) are mounted
//!    `noexec`, so a copied binary can neither be executed nor mapped executable by the
//!    loader. What else the sandbox can write lives on the kernel's internal mounts, which
//!    are not noexec: memory files and SysV shared memory. So under an allowlist the
//!    seccomp floor ([`crate::profile::floor`], `profiles/floor-allowlist.toml`) makes
//!    memfd_create(2) and memfd_secret(2) fail with EACCES, and shmat(2) with `SHM_EXEC`.
//!    `MFD_NOEXEC_SEAL` is not enough: it stops execve(2) and chmod(2) of the memory file,
//!    not mmap(2) with `PROT_EXEC` — and `ld.so /proc/self/fd/N` on a sealed memory file
//!    holding a copied program maps it executable and runs it (a bypass found from inside
//!    a sandbox allowed only python3). No file the sandbox writes can be mapped
//!    executable; a SysV segment attached without `SHM_EXEC` can still be made executable
//!    with mprotect(2), like anonymous memory — no file the loader could be given.
//!
//! What stays possible is listed in docs/allowlists.md ("Executable allowlists and the output
//! cap"): chiefly, ELF executables kept outside the executable directories (such as
//! `/usr/lib/git-core/`) and in `--ro` paths can still be started through the loader, and
//! an allowed interpreter runs whatever program it is given.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::paths::{HostPath, PathError, check_host_path};

use super::mounts::Bind;

/// Directories that hold programs rather than libraries or data. Under an allowlist none
/// of them is readable, so the loader cannot be pointed at what they hold.
pub const EXEC_DIRS: [&str; 10] = [
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/usr/libexec",
    "/usr/games",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/usr/local/libexec",
    "/usr/local/games",
];

/// Most files one allowlist may name.
pub const MAX_ALLOWED: usize = 64;

/// The kernel reads at most this much of a script to find its interpreter.
const SHEBANG_BYTES: usize = 256;
/// Largest program header table read (the kernel refuses larger ones too).
const MAX_PHDR_BYTES: u64 = 64 << 10;
/// Longest `PT_INTERP` path accepted.
const MAX_INTERP_BYTES: u64 = 4096;

/// What a listed file is, as far as execution goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// An ELF executable, with the interpreter it names (none when statically linked).
    Elf { interpreter: Option<PathBuf> },
    /// A script starting with `#!interpreter`.
    Script { interpreter: PathBuf },
    /// Neither (the kernel will refuse to execute it, or a binfmt_misc handler decides).
    Other,
}

/// The resolved allowlist of one sandbox: what gets the execute right, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExecAllowlist {
    /// The listed files, real paths (the same inside the sandbox).
    pub files: Vec<PathBuf>,
    /// ELF interpreters the listed programs name, added because they must be.
    pub loaders: Vec<PathBuf>,
    /// Things the caller should know: a listed script whose interpreter is not listed.
    pub notes: Vec<String>,
    /// The listed files and loaders that lie in exposed paths (not in system mounts), as
    /// validated: each is bound onto itself, so the Landlock rule is on the inode that was
    /// checked and inspected, held by the mount (a filesystem that makes a new inode for
    /// every lookup, such as 9p without a cache, would otherwise never match the rule).
    #[serde(skip)]
    pub pinned: Vec<HostPath>,
}

impl ExecAllowlist {
    /// Every file that gets read + execute rights.
    pub fn executable(&self) -> impl Iterator<Item = &PathBuf> {
        self.files.iter().chain(self.loaders.iter())
    }
}

/// Checks a host path for an allowlist: like an exposed path (absolute, clean, no symlink,
/// existing), and a regular file with an execute bit that neither group nor others may
/// write. A symlink is refused with the real path it leads to, so the message says what
/// to allow instead (`/usr/bin/python3` → `/usr/bin/python3.11`).
pub fn check_exec_path(path: &Path) -> Result<HostPath, PathError> {
    let host = check_host_path(path).map_err(|e| match e {
        PathError::Symlink {
            path, component, ..
        } => PathError::Symlink {
            target: std::fs::canonicalize(&path).unwrap_or_else(|_| component.clone()),
            path,
            component,
        },
        other => other,
    })?;
    let other = |reason: String| PathError::Other {
        path: path.to_path_buf(),
        reason,
    };
    if host.is_dir {
        return Err(other(
            "is a directory; list files (a directory would allow everything in it)".into(),
        ));
    }
    let meta = std::fs::metadata(&host.path).map_err(|e| other(e.to_string()))?;
    let mode = meta.mode();
    if mode & 0o111 == 0 {
        return Err(other(format!(
            "is not executable (mode {:o})",
            mode & 0o7777
        )));
    }
    if mode & 0o022 != 0 {
        return Err(other(format!(
            "may be written by group or others (mode {:o}): such a file is no fixed program",
            mode & 0o7777
        )));
    }
    Ok(host)
}

/// Reads what kind of program the checked file `host` is: the `PT_INTERP` of an ELF file,
/// or the `#!` line of a script. Malformed ELF headers are errors (the kernel would refuse
/// them too). The file read is the object that was checked, reached through its
/// descriptor: a name swapped for a FIFO or another file meanwhile changes nothing.
pub fn inspect(host: &HostPath) -> Result<Program, String> {
    let path = &host.path;
    let file = host
        .open_read()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut head = [0u8; SHEBANG_BYTES];
    let n = read_some(&file, 0, &mut head).map_err(|e| format!("{}: {e}", path.display()))?;
    let head = &head[..n];
    if head.starts_with(b"\x7fELF") {
        let interpreter =
            elf_interpreter(&file).map_err(|e| format!("{}: ELF: {e}", path.display()))?;
        return Ok(Program::Elf { interpreter });
    }
    Ok(match shebang(head) {
        Some(interpreter) => Program::Script { interpreter },
        None => Program::Other,
    })
}

/// Positioned reads: a file, or bytes in memory (tests).
trait ReadAt {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

fn read_some<R: ReadAt + ?Sized>(f: &R, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset.saturating_add(done as u64)) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The interpreter of a `#!` line: the first word after `#!`, as the kernel takes it.
pub fn shebang(head: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let rest = head.strip_prefix(b"#!")?;
    let line = rest.split(|b| *b == b'\n').next().unwrap_or(rest);
    let line = match line.iter().position(|b| *b != b' ' && *b != b'\t') {
        Some(i) => &line[i..],
        None => return None,
    };
    let word = line
        .split(|b| *b == b' ' || *b == b'\t' || *b == 0)
        .next()
        .unwrap_or(line);
    (!word.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(word)))
}

/// The `PT_INTERP` path of an ELF file, 32- or 64-bit, either byte order.
fn elf_interpreter<R: ReadAt + ?Sized>(f: &R) -> Result<Option<PathBuf>, String> {
    use std::os::unix::ffi::OsStrExt;
    let mut ident = [0u8; 64];
    if read_some(f, 0, &mut ident).map_err(|e| e.to_string())? < 52 {
        return Err("truncated header".into());
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        c => return Err(format!("unknown class {c}")),
    };
    let big = match ident[5] {
        1 => false,
        2 => true,
        d => return Err(format!("unknown byte order {d}")),
    };
    let u16_at = |b: &[u8], at: usize| -> u64 {
        let v = [b[at], b[at + 1]];
        u64::from(if big {
            u16::from_be_bytes(v)
        } else {
            u16::from_le_bytes(v)
        })
    };
    let u32_at = |b: &[u8], at: usize| -> u64 {
        let v = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        u64::from(if big {
            u32::from_be_bytes(v)
        } else {
            u32::from_le_bytes(v)
        })
    };
    let u64_at = |b: &[u8], at: usize| -> u64 {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[at..at + 8]);
        if big {
            u64::from_be_bytes(v)
        } else {
            u64::from_le_bytes(v)
        }
    };
    let (phoff, phentsize, phnum) = if wide {
        (
            u64_at(&ident, 0x20),
            u16_at(&ident, 0x36),
            u16_at(&ident, 0x38),
        )
    } else {
        (
            u32_at(&ident, 0x1c),
            u16_at(&ident, 0x2a),
            u16_at(&ident, 0x2c),
        )
    };
    let min_entry = if wide { 56 } else { 32 };
    if phnum == 0 {
        return Ok(None);
    }
    if phentsize < min_entry {
        return Err(format!("program header entries of {phentsize} bytes"));
    }
    let table = phentsize * phnum; // both at most 0xffff: no overflow
    if table > MAX_PHDR_BYTES {
        return Err(format!("a program header table of {table} bytes"));
    }
    let mut phdrs = vec![0u8; table as usize];
    if read_some(f, phoff, &mut phdrs).map_err(|e| e.to_string())? != phdrs.len() {
        return Err("truncated program headers".into());
    }
    for entry in phdrs.chunks_exact(phentsize as usize) {
        const PT_INTERP: u64 = 3;
        if u32_at(entry, 0) != PT_INTERP {
            continue;
        }
        let (offset, size) = if wide {
            (u64_at(entry, 8), u64_at(entry, 32))
        } else {
            (u32_at(entry, 4), u32_at(entry, 16))
        };
        if !(2..=MAX_INTERP_BYTES).contains(&size) {
            return Err(format!("an interpreter path of {size} bytes"));
        }
        let mut buf = vec![0u8; size as usize];
        if read_some(f, offset, &mut buf).map_err(|e| e.to_string())? != buf.len() {
            return Err("truncated interpreter path".into());
        }
        // The kernel requires the terminating NUL and stops at it.
        if buf.last() != Some(&0) {
            return Err("the interpreter path is not NUL-terminated".into());
        }
        let path = buf.split(|b| *b == 0).next().unwrap_or(&[]);
        return Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(path))));
    }
    Ok(None)
}

/// Where a path lands inside the sandbox: the deepest mount (system bind or exposure at
/// the same path) that contains it.
fn containing<'a>(path: &Path, mounts: &'a [&'a Bind]) -> Option<&'a Bind> {
    mounts
        .iter()
        .filter(|b| b.host.path == b.target && path.starts_with(&b.target))
        .max_by_key(|b| b.target.components().count())
        .copied()
}

/// Resolves the allowlist of a sandbox: checks every listed file on the host and against
/// the sandbox's mounts (`system` binds and same-path `exposures`), and finds the loaders.
/// Refuses a file that is not inside the sandbox, one the sandbox could write (beneath an
/// `--rw` path, or hard-linked from the filesystem of one and not owned by root), and a
/// loader in either situation.
pub fn resolve(
    listed: &[PathBuf],
    system: &[Bind],
    exposures: &[Bind],
) -> Result<ExecAllowlist, String> {
    if listed.is_empty() {
        return Err("an empty allowlist would let nothing run".into());
    }
    if listed.len() > MAX_ALLOWED {
        return Err(format!(
            "{} files; at most {MAX_ALLOWED} may be listed",
            listed.len()
        ));
    }
    let view = SandboxView::new(system, exposures);
    let mut out = ExecAllowlist::default();
    let mut listed_hosts = Vec::with_capacity(listed.len());
    for path in listed {
        let host = check_exec_path(path).map_err(|e| e.to_string())?;
        if out.files.contains(&host.path) {
            return Err(format!("{} is listed twice", host.path.display()));
        }
        view.check_inside(&host)?;
        out.files.push(host.path.clone());
        if view.exposed(&host) {
            out.pinned.push(host.clone());
        }
        listed_hosts.push(host);
    }
    // Files hatchery binds in at another path (its in-sandbox client) keep the execute
    // right whatever the list says (see `spec`), so their loader is needed too.
    let own: Vec<HostPath> = exposures
        .iter()
        .filter(|b| b.host.path != b.target && !b.is_dir())
        .map(|b| b.host.clone())
        .collect();
    for host in listed_hosts.into_iter().chain(own) {
        let file = host.path.clone();
        match inspect(&host)? {
            Program::Elf {
                interpreter: Some(interp),
            } => add_loader(&file, &interp, &view, &mut out)?,
            Program::Script { interpreter } if out.files.contains(&file) => {
                note_unlisted_interpreter(&file, &interpreter, &mut out)
            }
            Program::Elf { interpreter: None } | Program::Script { .. } | Program::Other => {}
        }
    }
    Ok(out)
}

/// The sandbox's mounts as the allowlist sees them: where a host file lands inside, and
/// whether the sandbox could rewrite it there.
struct SandboxView<'a> {
    /// System binds and exposures together.
    mounts: Vec<&'a Bind>,
    exposures: &'a [Bind],
    /// The filesystems of `--rw` paths.
    writable_devs: Vec<u64>,
}

impl<'a> SandboxView<'a> {
    fn new(system: &'a [Bind], exposures: &'a [Bind]) -> SandboxView<'a> {
        SandboxView {
            mounts: system.iter().chain(exposures.iter()).collect(),
            exposures,
            writable_devs: exposures
                .iter()
                .filter(|b| b.writable)
                .map(|b| b.host.dev)
                .collect(),
        }
    }

    /// Whether the file lands in an exposed path (rather than a system mount).
    fn exposed(&self, host: &HostPath) -> bool {
        containing(&host.path, &self.mounts).is_some_and(|b| self.exposures.iter().any(|x| x == b))
    }

    /// Refuses a file that is not inside the sandbox, or that the sandbox could rewrite:
    /// beneath an `--rw` path, or hard-linked from the filesystem of one and not root's.
    fn check_inside(&self, host: &HostPath) -> Result<(), String> {
        let p = &host.path;
        match containing(p, &self.mounts) {
            None => Err(format!(
                "{}: not inside the sandbox; expose its directory with --ro (or allow a program under /usr)",
                p.display()
            )),
            Some(b) if b.writable => Err(format!(
                "{}: the sandbox may rewrite it (it is beneath --rw {}); expose it read-only",
                p.display(),
                b.target.display()
            )),
            Some(_) => {
                // The checked object itself, through its descriptor.
                let st = nix::sys::stat::fstat(host.fd())
                    .map_err(|e| format!("{}: {e}", p.display()))?;
                if st.st_nlink > 1 && st.st_uid != 0 && self.writable_devs.contains(&st.st_dev) {
                    return Err(format!(
                        "{}: has {} hard links on the filesystem of an --rw path, through which the sandbox could rewrite it",
                        p.display(),
                        st.st_nlink
                    ));
                }
                Ok(())
            }
        }
    }
}

/// Adds the ELF interpreter `interp` that `file` names to the loaders, checked like a
/// listed file (a loader the sandbox could rewrite would run in place of every program).
fn add_loader(
    file: &Path,
    interp: &Path,
    view: &SandboxView,
    out: &mut ExecAllowlist,
) -> Result<(), String> {
    let real = std::fs::canonicalize(interp).map_err(|e| {
        format!(
            "{}: its ELF interpreter {}: {e}",
            file.display(),
            interp.display()
        )
    })?;
    let host = check_exec_path(&real)
        .map_err(|e| format!("{}: its ELF interpreter {e}", file.display()))?;
    view.check_inside(&host)
        .map_err(|e| format!("{}: its ELF interpreter {e}", file.display()))?;
    if !out.loaders.contains(&host.path) && !out.files.contains(&host.path) {
        out.loaders.push(host.path.clone());
        if view.exposed(&host) {
            out.pinned.push(host);
        }
    }
    Ok(())
}

/// Notes a listed script whose `#!` interpreter is not listed: running it fails with
/// EACCES. A relative interpreter is found from the working directory at run time; it
/// cannot be matched here, and is only reported.
fn note_unlisted_interpreter(file: &Path, interpreter: &Path, out: &mut ExecAllowlist) {
    let real = if interpreter.is_absolute() {
        std::fs::canonicalize(interpreter).unwrap_or(interpreter.to_path_buf())
    } else {
        interpreter.to_path_buf()
    };
    if !out.files.contains(&real) {
        out.notes.push(format!(
            "{} starts with #!{}, which is not allowed: running it fails with EACCES (allow {} too)",
            file.display(),
            interpreter.display(),
            real.display()
        ));
    }
}

/// Rewrites read (or write) rules so that none covers a directory of executables: a rule on
/// one of them or beneath it is dropped; a rule on an ancestor is replaced by rules on its
/// entries (recursively, skipping symlinks, which lead to what other rules cover). Reads
/// the host's directories, which the sandbox sees at the same paths.
pub fn without_exec_dirs(paths: &[PathBuf]) -> Vec<PathBuf> {
    let hidden: Vec<&Path> = EXEC_DIRS.iter().map(Path::new).collect();
    let mut out = Vec::new();
    for p in paths {
        split_around(p, &hidden, &mut out);
    }
    out.sort();
    out.dedup();
    out
}

fn split_around(path: &Path, hidden: &[&Path], out: &mut Vec<PathBuf>) {
    if hidden.iter().any(|h| path.starts_with(h)) {
        return;
    }
    if !hidden.iter().any(|h| h.starts_with(path)) {
        out.push(path.to_path_buf());
        return;
    }
    // An ancestor of a hidden directory: grant its entries instead. One that cannot be
    // listed grants nothing.
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    for entry in entries.flatten() {
        match entry.file_type() {
            Ok(t) if t.is_symlink() => {}
            Ok(_) => split_around(&path.join(entry.file_name()), hidden, out),
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests;
