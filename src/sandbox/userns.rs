//! The user namespace: who the sandbox is, inside and on the host.
//!
//! Inside, the payload is uid 0 with no capabilities. On the host it is never root: a
//! privileged supervisor maps inside-0 to an unprivileged host id (65534 unless told
//! otherwise), an unprivileged one maps its own id. Until the maps are written the new
//! process still carries the supervisor's host credentials, so the child does nothing but
//! wait until the supervisor says the maps are in place, then switches to the mapped ids.

use std::io::{self, Write};

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
}

impl Identity {
    /// The identity for the calling user: root maps to `host` (default 65534:65534), an
    /// unprivileged caller maps to itself.
    pub fn for_caller(host: Option<(u32, u32)>) -> Identity {
        let euid = nix::unistd::geteuid().as_raw();
        let egid = nix::unistd::getegid().as_raw();
        let rootless = euid != 0;
        let (host_uid, host_gid) = if rootless {
            (euid, egid)
        } else {
            host.unwrap_or((DEFAULT_HOST_ID, DEFAULT_HOST_ID))
        };
        Identity {
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
        }
    }

    fn map_text(maps: &[IdMapping]) -> String {
        maps.iter()
            .map(|m| format!("{} {} {}\n", m.inside, m.outside, m.count))
            .collect()
    }

    /// Writes the maps of the sandbox process `pid` (supervisor side).
    pub fn write_maps(&self, pid: i32) -> io::Result<()> {
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

/// Inside the new namespace, after the maps are written: drop supplementary groups (when
/// allowed) and become the mapped uid/gid 0, which on the host is the unprivileged id.
pub fn assume_identity(identity: &Identity) -> nix::Result<()> {
    if !identity.rootless {
        // Without this the process would keep the supervisor's supplementary groups.
        nix::unistd::setgroups(&[])?;
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
        Ok(nix::unistd::ForkResult::Parent { child }) => match nix::sys::wait::waitpid(child, None)
        {
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
    fn the_payload_is_never_host_root() {
        let id = Identity::for_caller(None);
        assert_ne!(id.host_uid, 0);
        assert_ne!(id.host_gid, 0);
    }
}
