//! What the sandbox sees of the host: `--ro`/`--rw`/`--ro-cwd` resolved once (and `--rw` on
//! a host system directory refused), and the warnings said before anything starts about
//! what the sandbox will not be able to see or use.

use std::path::Path;

use hatchery::paths::{absolutize, check_host_path};
use hatchery::sandbox::{self, Exposure, SandboxError};

use super::RunArgs;

/// Resolves `--ro`/`--rw` paths (and the current directory for `--ro-cwd`): a relative
/// path is taken from the current directory, once; `..`, symlinks and missing paths are
/// refused, and so is `--rw` on a host system directory without `--allow-system-rw`.
pub(super) fn exposures(args: &RunArgs) -> Result<Vec<Exposure>, SandboxError> {
    let mut out: Vec<Exposure> = Vec::new();
    for (paths, writable) in [(&args.ro, false), (&args.rw, true)] {
        for p in paths {
            let flag = if writable { "--rw" } else { "--ro" };
            let host = absolutize(p)
                .and_then(|abs| check_host_path(&abs))
                .map_err(|e| SandboxError::Invalid(format!("{flag} {e}")))?;
            if writable && !args.allow_system_rw {
                if let Some(system) = system_directory(&host.path) {
                    return Err(SandboxError::Invalid(format!(
                        "--rw {}: {system} is the host's own system directory: a sandbox writing there changes the host's programs or configuration; expose a directory of your own, or pass --allow-system-rw if that is really meant",
                        host.path.display()
                    )));
                }
            }
            out.push(Exposure { host, writable });
        }
    }
    if args.ro_cwd {
        let here = absolutize(Path::new("."))
            .and_then(|abs| check_host_path(&abs))
            .map_err(|e| SandboxError::Invalid(format!("--ro-cwd: the current directory {e}")))?;
        // Already exposed (by --ro or --rw of the same path): nothing more to do.
        if !out.iter().any(|x| x.host.path == here.path) {
            out.push(Exposure {
                host: here,
                writable: false,
            });
        }
    }
    Ok(out)
}

/// The host system directory `path` is or lies in, when it is one: what `--rw` refuses
/// without `--allow-system-rw`. Directories whose contents are everyone's (`/home`, `/var`,
/// `/opt`, ...) count themselves, not what is below them.
fn system_directory(path: &Path) -> Option<&'static str> {
    const TREES: &[&str] = &[
        "/usr",
        "/etc",
        "/bin",
        "/sbin",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/boot",
        "/proc",
        "/sys",
        "/dev",
        "/run",
        "/var/lib",
        "/var/log",
        "/var/cache",
        "/var/spool",
    ];
    const ITSELF: &[&str] = &[
        "/", "/var", "/home", "/root", "/opt", "/srv", "/mnt", "/media", "/snap",
    ];
    TREES
        .iter()
        .find(|t| path.starts_with(t))
        .or_else(|| ITSELF.iter().find(|t| path == Path::new(t)))
        .copied()
}

/// What the sandbox can do through one exposure, judged from the exposed object's owner
/// and mode the way the mounts present it: a read-only exposure is idmapped to ids that
/// own nothing (the sandbox is "other" to every file); a read-write one maps the object's
/// owner to the sandbox, except when root owns it (then the sandbox is "other"). Rootless,
/// the sandbox is the caller. A warning, not a refusal: access control lists and what
/// lies deeper are not looked at.
fn access_warning(x: &sandbox::mounts::Bind, rootless: bool) -> Option<String> {
    let flag = if x.writable { "--rw" } else { "--ro" };
    let path = &x.host.path;
    let (verb, fix) = if x.writable {
        ("write", "make it writable by its owner (chmod u+w)")
    } else {
        ("read", "make it readable by others (chmod o+rX)")
    };
    if rootless {
        let mut want = if x.writable {
            nix::unistd::AccessFlags::W_OK
        } else {
            nix::unistd::AccessFlags::R_OK
        };
        if x.host.is_dir {
            want |= nix::unistd::AccessFlags::X_OK;
        }
        return nix::unistd::access(path.as_path(), want).err().map(|e| {
            format!(
                "{flag} {}: the sandbox runs as you, and you cannot {verb} it ({})",
                path.display(),
                e.desc()
            )
        });
    }
    let st = nix::sys::stat::fstat(x.host.fd()).ok()?;
    let mode = st.st_mode & 0o7777;
    let (bits, who) = if x.writable && st.st_uid != 0 {
        // Owner bits: write (and search, for a directory).
        (if x.host.is_dir { 0o300 } else { 0o200 }, "its owner")
    } else if x.writable {
        // A root-owned exposure is not mapped: the sandbox is never root on the host.
        (if x.host.is_dir { 0o003 } else { 0o002 }, "others")
    } else {
        // Through --ro the sandbox owns nothing.
        (if x.host.is_dir { 0o005 } else { 0o004 }, "others")
    };
    if mode & bits == bits {
        return None;
    }
    let fix = if x.writable && st.st_uid == 0 {
        "give it a non-root owner (chown USER), whose rights the sandbox then has"
    } else {
        fix
    };
    Some(format!(
        "{flag} {}: the sandbox cannot {verb} it (owner uid {}, mode {mode:o}; the sandbox has the rights of {who}); {fix}",
        path.display(),
        st.st_uid
    ))
}

/// Whether a host path is visible inside the sandbox of `spec` (under one of its binds,
/// or `/` itself).
fn visible_inside(spec: &sandbox::SandboxSpec, path: &Path) -> bool {
    path == Path::new("/")
        || spec
            .rootfs
            .system
            .iter()
            .chain(spec.rootfs.exposures.iter())
            .any(|b| path.starts_with(&b.target))
}

/// For a command that was not found in the sandbox: where it is on the host, when it is
/// somewhere the sandbox does not see.
pub(super) fn command_hint(
    spec: &sandbox::SandboxSpec,
    caller_path: Option<&std::ffi::OsStr>,
) -> Option<String> {
    let cmd = spec.argv.first()?;
    let on_host = if cmd.contains('/') {
        let p = spec.cwd.join(cmd);
        p.exists().then_some(p)
    } else {
        std::env::split_paths(caller_path?)
            .filter(|d| d.is_absolute())
            .map(|d| d.join(cmd))
            .find(|p| p.is_file())
    }?;
    if visible_inside(spec, &on_host) {
        return None;
    }
    let dir = if cmd.contains('/') {
        on_host.clone()
    } else {
        on_host.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    Some(format!(
        "{} exists on the host but is not exposed in the sandbox: add --ro {}",
        on_host.display(),
        dir.display()
    ))
}

/// Warns, before anything starts, about what the sandbox will not see: an exposure the
/// sandbox's identity cannot use, and a name in the command that is in the current
/// directory when the command starts elsewhere (`no_cwd`: no `--cwd` was given).
pub(super) fn warn_unseen(spec: &sandbox::SandboxSpec, caller_cwd: Option<&Path>, no_cwd: bool) {
    for x in spec.rootfs.exposures.iter() {
        if let Some(w) = access_warning(x, spec.identity.rootless) {
            error_line!("warning: {w}");
        }
    }
    // Where the command starts is not where the caller stands, and the command names
    // something there: say so before it fails on it.
    if let Some(here) =
        caller_cwd.filter(|h| no_cwd && spec.cwd.as_path() != *h && !visible_inside(spec, h))
    {
        let named_here = spec
            .argv
            .iter()
            .filter(|a| !a.starts_with('/') && !a.starts_with('-') && !a.is_empty())
            .find(|a| here.join(a).symlink_metadata().is_ok());
        if let Some(name) = named_here {
            error_line!(
                "note: {name} is in the current directory {}, which is not exposed in the sandbox (the command starts in /); add --ro-cwd to expose it read-only and start there",
                here.display()
            );
        }
    }
}
