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
    super::kernel_text::read("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

fn errno_of(e: &caps::errors::CapsError) -> i32 {
    // The caps crate reports the OS error inside its message; EPERM is the only realistic one.
    let _ = e;
    libc::EPERM
}

/// The bounding set a caller of [`drop_all`] starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bounding {
    /// Drop it here.
    Drop,
    /// Emptied already by [`drop_bounding_set`], in this process or in the parent it was
    /// forked from (the set is inherited): checked, and dropped after all if it is not.
    Emptied,
}

/// Empties the bounding set: no execve of this process or of its children can gain a
/// capability from then on. The capabilities held now stay (a sandbox's pid 1 needs its
/// own until its payload has started). Needs CAP_SETPCAP.
///
/// Why apart from [`drop_all`]: pid 1 empties it once, before starting the payload, and
/// the payload inherits it empty; otherwise each of them makes one `prctl` per
/// capability the kernel knows (41), the payload's on the way to its `execve`.
pub fn drop_bounding_set() -> Result<(), PrivError> {
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
    Ok(())
}

/// Whether the bounding set still holds CAP_SYS_ADMIN: one `prctl` that tells an emptied
/// set (which [`drop_bounding_set`] leaves without it, or fails) from an untouched one.
/// An error counts as held: the set is dropped after all.
fn bounding_holds_sys_admin() -> bool {
    let cap = libc::c_ulong::from(caps::Capability::CAP_SYS_ADMIN.index());
    // SAFETY: prctl with integer arguments only.
    let held = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) };
    held != 0
}

/// Drops every capability, switching to the inside ids `switch_to` on the way (with the
/// securebits locked first, the switch itself cannot keep or regain anything). Needs
/// CAP_SETPCAP, CAP_SETUID and CAP_SETGID (held by the namespace's root until here).
pub fn drop_all(switch_to: Option<(u32, u32)>, bounding: Bounding) -> Result<(), PrivError> {
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
    if bounding == Bounding::Drop || bounding_holds_sys_admin() {
        drop_bounding_set()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every capability gone from the bounding set, as `/proc/self/status` shows it.
    fn bounding_is_empty() -> bool {
        super::super::kernel_text::read("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    l.strip_prefix("CapBnd:")
                        .map(|v| v.trim() == "0000000000000000")
                })
            })
            .unwrap_or(false)
    }

    #[test]
    fn a_bounding_set_said_to_be_emptied_but_full_is_dropped_all_the_same() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        // Told it was emptied, though nothing emptied it: the check sees CAP_SYS_ADMIN.
        let said_emptied = super::super::wait::holds_in_a_child(&[], || {
            bounding_holds_sys_admin()
                && drop_all(None, Bounding::Emptied).is_ok()
                && bounding_is_empty()
        });
        assert!(said_emptied, "the bounding set was left as it was");
        // Emptied first, as pid 1 does: nothing left for drop_all to drop.
        let emptied = super::super::wait::holds_in_a_child(&[], || {
            drop_bounding_set().is_ok()
                && !bounding_holds_sys_admin()
                && bounding_is_empty()
                && drop_all(None, Bounding::Emptied).is_ok()
        });
        assert!(emptied);
    }
}
