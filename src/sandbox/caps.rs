//! Privileges: every capability dropped from every set (bounding and ambient included),
//! securebits locked so that uid 0 inside never regains any, no_new_privs set so that
//! setuid binaries and file capabilities grant nothing.

use caps::CapSet;

/// Why a step of [`drop_all`] failed.
#[derive(Debug)]
pub struct PrivError {
    pub step: &'static str,
    pub errno: i32,
}

impl std::fmt::Display for PrivError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = std::io::Error::from_raw_os_error(self.errno);
        write!(f, "{}: {e}", self.step)
    }
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

fn errno_of(e: &caps::errors::CapsError) -> i32 {
    // The caps crate reports the OS error inside its message; EPERM is the only realistic one.
    let _ = e;
    libc::EPERM
}

/// Drops every capability, switching to the inside ids `switch_to` on the way (with the
/// securebits locked first, the switch itself cannot keep or regain anything). Needs
/// CAP_SETPCAP, CAP_SETUID and CAP_SETGID (held by the namespace's root until here).
pub fn drop_all(switch_to: Option<(u32, u32)>) -> Result<(), PrivError> {
    // Locked securebits: uid 0 gets no capabilities on execve, setuid(2) does not restore
    // them, and ambient capabilities can never be raised.
    let bits = libc::SECBIT_NOROOT
        | libc::SECBIT_NOROOT_LOCKED
        | libc::SECBIT_NO_SETUID_FIXUP
        | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(PrivError {
            step: "securebits",
            errno: std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EPERM),
        });
    }
    for cap in 0..=last_cap() {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EPERM);
            // EINVAL: a capability this kernel does not know; nothing to drop.
            if errno != libc::EINVAL {
                return Err(PrivError {
                    step: "bounding set",
                    errno,
                });
            }
        }
    }
    if let Some((uid, gid)) = switch_to.filter(|ids| *ids != (0, 0)) {
        let errno = |e: nix::Error| PrivError {
            step: "switch ids",
            errno: e as i32,
        };
        let (u, g) = (
            nix::unistd::Uid::from_raw(uid),
            nix::unistd::Gid::from_raw(gid),
        );
        nix::unistd::setresgid(g, g, g).map_err(errno)?;
        nix::unistd::setresuid(u, u, u).map_err(errno)?;
    }
    for (set, step) in [
        (CapSet::Ambient, "ambient set"),
        (CapSet::Inheritable, "inheritable set"),
        (CapSet::Effective, "effective set"),
        (CapSet::Permitted, "permitted set"),
    ] {
        caps::clear(None, set).map_err(|e| PrivError {
            step,
            errno: errno_of(&e),
        })?;
    }
    Ok(())
}

/// Sets no_new_privs: execve can never grant privileges again (also a prerequisite for
/// unprivileged seccomp and Landlock).
pub fn no_new_privs() -> Result<(), PrivError> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| PrivError {
        step: "no_new_privs",
        errno: e as i32,
    })
}

/// Makes the calling process non-dumpable: no ptrace attach, no /proc/PID/mem for peers.
///
/// Why: a sandboxed process that can ptrace or read `/proc/PID/fd` of a set-up process
/// still holding host descriptors reaches the host through them (CVE-2016-9962, runc).
pub fn not_dumpable() -> Result<(), PrivError> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| PrivError {
        step: "dumpable",
        errno: e as i32,
    })
}
