//! Host identities for sandboxes: every sandbox a privileged supervisor starts gets a uid
//! and gid of its own, leased from a dedicated range for as long as it runs (as podman's
//! `--userns=auto` and systemd's `DynamicUser=` do).
//!
//! Why not one shared "nobody": the kernel keeps per-user quotas and ownership by host
//! uid. Sandboxes sharing one uid share its pipe-buffer budget (one sandbox holding 1,088
//! empty pipes left every other with 8 KiB pipes), its process count and its files (a
//! set-uid file one sandbox leaves in a `--rw` directory belongs to all of them).
//!
//! The range is the `hatchery` entry of `/etc/subuid` and `/etc/subgid` when there is
//! one, else [`DEFAULT_RANGE`]. No two sandboxes running at the same time share an id; over
//! time ids are reused (a random slot is tried first), as systemd's dynamic users are. A lease is a write lock on one byte of a lock file
//! (`/run/hatchery/ids.lock`, an open-file-description lock): it is released when the
//! last descriptor of the lease closes, also when the supervisor is killed, so a crash
//! never leaks an id. The last id of the range is never leased: it is the "null" id that
//! read-only idmapped mounts map, so that nothing on disk maps to a sandbox through them.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{FcntlArg, fcntl};

use crate::paths::Dir;

use super::userns::{SubIdRange, parse_subid};

/// Ids used when `/etc/subuid` has no `hatchery` entry: 65,536 ids from 0x70000000, above
/// systemd's container range (0x80000–0x6FFFFFFF) and below the ids some tools read as
/// negative (2^31 and up).
pub const DEFAULT_RANGE: SubIdRange = SubIdRange {
    start: 0x7000_0000,
    count: 65536,
};

/// The user name whose subordinate ranges hatchery leases from.
pub const RANGE_OWNER: &str = "hatchery";

const LOCK_DIR: &str = "/run/hatchery";
const LOCK_FILE: &str = "ids.lock";

/// The uid and gid ranges leases come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRanges {
    pub uids: SubIdRange,
    pub gids: SubIdRange,
}

impl IdRanges {
    /// The `hatchery` entries of `/etc/subuid` and `/etc/subgid`, or the default range.
    pub fn configured() -> IdRanges {
        let read = |file: &str| {
            std::fs::read_to_string(file)
                .ok()
                .and_then(|text| parse_subid(&text, Some(RANGE_OWNER), u32::MAX))
                .filter(|r| r.count >= 2)
        };
        match (read("/etc/subuid"), read("/etc/subgid")) {
            (Some(uids), Some(gids)) => IdRanges { uids, gids },
            _ => IdRanges {
                uids: DEFAULT_RANGE,
                gids: DEFAULT_RANGE,
            },
        }
    }

    /// How many ids can be leased at once (the last one is the null id).
    pub fn slots(&self) -> u32 {
        self.uids.count.min(self.gids.count).saturating_sub(1)
    }

    /// The null uid and gid: never leased, never owned by anything a sandbox made.
    pub fn null_ids(&self) -> (u32, u32) {
        let last = self.slots();
        (
            self.uids.start.saturating_add(last),
            self.gids.start.saturating_add(last),
        )
    }
}

/// A leased uid/gid pair, held until every copy of it is dropped.
#[derive(Debug)]
pub struct IdLease {
    lock: OwnedFd,
    pub uid: u32,
    pub gid: u32,
}

impl IdLease {
    /// A second handle on the same lease (the lease ends when the last one is dropped).
    pub fn try_clone(&self) -> io::Result<IdLease> {
        Ok(IdLease {
            lock: self.lock.try_clone()?,
            uid: self.uid,
            gid: self.gid,
        })
    }
}

fn lock_byte(fd: &OwnedFd, slot: u32) -> nix::Result<()> {
    // SAFETY: `flock` is plain old data; all-zero is a valid value, then filled in below.
    let mut lk: libc::flock = unsafe { std::mem::zeroed() };
    lk.l_type = libc::F_WRLCK as libc::c_short;
    lk.l_whence = libc::SEEK_SET as libc::c_short;
    lk.l_start = libc::off_t::from(slot);
    lk.l_len = 1;
    fcntl(fd, FcntlArg::F_OFD_SETLK(&lk)).map(drop)
}

/// Leases a free uid/gid pair from `ranges`.
pub fn lease(ranges: &IdRanges) -> io::Result<IdLease> {
    let slots = ranges.slots();
    if slots == 0 {
        return Err(io::Error::other("the id range has no ids to lease"));
    }
    let dir = Dir::create(Path::new(LOCK_DIR), 0o755)?;
    // A descriptor of its own: the lock belongs to this open file description, which no
    // other lease shares (locks of one description never conflict with each other).
    let lock = dir.open_lock(LOCK_FILE, 0o600)?;
    // Start at a random slot: concurrent supervisors rarely probe the same slots, and one
    // long-lived supervisor (the controller's launcher) does not hand the same id to every
    // worker it starts one after another.
    let mut r = [0u8; 4];
    getrandom::fill(&mut r).map_err(|e| io::Error::other(format!("random source: {e}")))?;
    let start = u32::from_le_bytes(r) % slots;
    for i in 0..slots {
        let slot = (start + i) % slots;
        match lock_byte(&lock, slot) {
            Ok(()) => {
                return Ok(IdLease {
                    lock,
                    uid: ranges.uids.start + slot,
                    gid: ranges.gids.start + slot,
                });
            }
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => continue,
            Err(e) => return Err(io::Error::from(e)),
        }
    }
    Err(io::Error::other(format!(
        "all {slots} sandbox ids are in use (add a larger `{RANGE_OWNER}` range to /etc/subuid and /etc/subgid)"
    )))
}

impl AsFd for IdLease {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.lock.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_null_id_is_the_last_of_the_range_and_never_a_slot() {
        let r = IdRanges {
            uids: SubIdRange {
                start: 1000,
                count: 10,
            },
            gids: SubIdRange {
                start: 5000,
                count: 20,
            },
        };
        assert_eq!(r.slots(), 9);
        assert_eq!(r.null_ids(), (1009, 5009));
    }

    #[test]
    fn concurrent_leases_get_distinct_ids_and_a_dropped_one_is_free_again() -> io::Result<()> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP: leases need /run/hatchery (root)");
            return Ok(());
        }
        let ranges = IdRanges {
            uids: SubIdRange {
                start: 0x7100_0000,
                count: 3,
            },
            gids: SubIdRange {
                start: 0x7100_0000,
                count: 3,
            },
        };
        let a = lease(&ranges)?;
        let b = lease(&ranges)?;
        assert_ne!(a.uid, b.uid);
        assert!(lease(&ranges).is_err(), "only two slots");
        let keep = a.try_clone()?;
        drop(a);
        assert!(lease(&ranges).is_err(), "a clone keeps the lease");
        drop(keep);
        let c = lease(&ranges)?;
        assert_ne!(c.uid, b.uid);
        Ok(())
    }
}
