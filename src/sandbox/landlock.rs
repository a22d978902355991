//! Landlock: the filesystem (and, where the kernel has them, TCP and scope) rules of the
//! payload, built from the profile plus the exposed paths, at the best ABI the kernel
//! offers. Rules are attached to inodes, so they are created inside the new root, after
//! the mounts are in place.

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath,
    PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

/// The highest ABI whose rights hatchery asks for: filesystem (with truncate and device
/// ioctls), TCP bind/connect, and abstract-socket and signal scoping.
const TARGET_ABI: ABI = ABI::V6;

/// Paths (inside the sandbox) and what may be done beneath them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LandlockRules {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    pub execute: Vec<PathBuf>,
    /// Files that may be read and executed (an executable allowlist and its loaders).
    pub exec_files: Vec<PathBuf>,
    /// Where ioctls on device files are allowed (terminals under /dev).
    pub ioctl_dev: Vec<PathBuf>,
    /// Directories that may be listed but whose files are not thereby readable (the new
    /// root, which holds nothing but hatchery's own mount points).
    pub list: Vec<PathBuf>,
    /// Refuse TCP bind and connect altogether (ABI 4), loopback included...
    pub deny_tcp: bool,
    /// ...except connecting to these ports (the egress broker's listeners).
    pub tcp_connect_ports: Vec<u16>,
}

/// The Landlock ABI that restricts TCP bind and connect.
pub const TCP_ABI: u8 = 4;

/// What was enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LandlockOutcome {
    pub abi: u8,
    pub status: &'static str,
}

/// The Landlock ABI version of the running kernel, `None` without Landlock.
pub fn kernel_abi() -> Option<u8> {
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns the ABI version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    (v > 0).then(|| v.min(u8::MAX as libc::c_long) as u8)
}

/// The rights that apply to a file (as opposed to a directory) at the highest ABI hatchery
/// asks for.
fn file_rights() -> BitFlags<AccessFs> {
    AccessFs::from_file(TARGET_ABI)
}

fn read_rights() -> BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::ReadDir
}

fn write_rights() -> BitFlags<AccessFs> {
    read_rights()
        | AccessFs::WriteFile
        | AccessFs::Truncate
        | AccessFs::MakeReg
        | AccessFs::MakeDir
        | AccessFs::MakeSym
        | AccessFs::MakeFifo
        | AccessFs::MakeSock
        | AccessFs::RemoveFile
        | AccessFs::RemoveDir
        | AccessFs::Refer
}

/// Restricts the calling process (and its future children). Missing paths are skipped:
/// a rule cannot grant access to something that does not exist.
pub fn restrict(rules: &LandlockRules) -> Result<LandlockOutcome, String> {
    let abi_now = kernel_abi().unwrap_or(0);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(TARGET_ABI))
        .map_err(|e| e.to_string())?;
    if rules.deny_tcp {
        // Handled with no rule granting a port: every bind and connect is refused.
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(|e| e.to_string())?;
    }
    let mut ruleset = ruleset
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(|e| e.to_string())?
        .create()
        .map_err(|e| e.to_string())?;
    let groups: [(&Vec<PathBuf>, BitFlags<AccessFs>); 6] = [
        (&rules.list, AccessFs::ReadDir.into()),
        (&rules.read, read_rights()),
        (&rules.write, write_rights()),
        (&rules.execute, AccessFs::Execute.into()),
        (&rules.exec_files, AccessFs::ReadFile | AccessFs::Execute),
        (&rules.ioctl_dev, AccessFs::IoctlDev.into()),
    ];
    for (paths, rights) in groups {
        for path in paths {
            let fd = match PathFd::new(path) {
                Ok(fd) => fd,
                Err(_) if !path.exists() => continue,
                Err(e) => return Err(format!("{}: {e}", path.display())),
            };
            // A rule on a file may only carry rights that apply to files: the kernel refuses
            // the others (EINVAL), and the crate's best-effort mode would drop them and
            // report the whole ruleset as only partially enforced.
            let is_dir = nix::sys::stat::fstat(&fd)
                .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let rights = if is_dir {
                rights
            } else {
                rights & file_rights()
            };
            if rights.is_empty() {
                continue;
            }
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, rights))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    if rules.deny_tcp {
        for &port in &rules.tcp_connect_ports {
            ruleset = ruleset
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(|e| format!("TCP port {port}: {e}"))?;
        }
    }
    let status = ruleset.restrict_self().map_err(|e| e.to_string())?;
    let status = match status.ruleset {
        RulesetStatus::FullyEnforced => "fully_enforced",
        RulesetStatus::PartiallyEnforced => "partially_enforced",
        RulesetStatus::NotEnforced => "not_enforced",
    };
    Ok(LandlockOutcome {
        abi: abi_now,
        status,
    })
}
