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
//! time ids are reused (a random slot is tried first), as systemd's dynamic users are.
//!
//! A lease is a write lock on two bytes of a lock file, at the uid's and the gid's own
//! numbers (`/run/hatchery/ids.lock`, open-file-description locks, one description per
//! process): supervisors that read different ranges still never share an id. It is
//! released when the last handle on the lease is dropped, and with the description when
//! the supervisor is killed, so a crash never leaks an id. The last id of the range is
//! never leased: it is the "null" id that read-only idmapped mounts map, so that nothing
//! on disk maps to a sandbox through them.

use std::io;
use std::os::fd::OwnedFd;
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
#[derive(Debug, Clone)]
pub struct IdLease {
    /// Held, not read: the byte is unlocked when the last handle goes.
    _slot: std::sync::Arc<Slot>,
    pub uid: u32,
    pub gid: u32,
}

impl IdLease {
    /// A second handle on the same lease (the lease ends when the last one is dropped).
    pub fn try_clone(&self) -> io::Result<IdLease> {
        Ok(self.clone())
    }
}

/// One locked byte of this process's lock description; unlocked when dropped.
#[derive(Debug)]
struct Slot {
    lock: std::sync::Arc<OwnedFd>,
    /// The bytes locked: the uid's and the gid's (see [`uid_byte`], [`gid_byte`]).
    bytes: [i64; 2],
    /// The process that took it.
    owner: Owner,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // A forked copy of a lease shares its parent's description: only the process that
        // took the lease gives it back.
        if current_owner() != Some(self.owner) {
            return;
        }
        let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        // An unlock that failed leaves the byte locked: it stays marked as held, so that
        // this process never hands the id out twice.
        for byte in self.bytes {
            if set_lock(&self.lock, byte, libc::F_UNLCK).is_ok() {
                if let Some(t) = table.as_mut().filter(|t| t.owner == self.owner) {
                    t.held.remove(&byte);
                }
            }
        }
    }
}

/// A process as the lock table knows it: its pid and its pid namespace (a child in a new
/// pid namespace can have its parent's pid number, 1 included).
type Owner = (u32, u64);

fn current_owner() -> Option<Owner> {
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata("/proc/self/ns/pid").ok()?.ino();
    Some((std::process::id(), ns))
}

/// The lock file as this process holds it: one open file description for every lease.
///
/// Why one: the kernel walks every lock of a file each time any descriptor of it is
/// closed, in any process. A supervisor holding one description per lease (the
/// controller's launcher, with hundreds of workers) leaves that many descriptors in every
/// process it clones, each closed once; every start then cost the square of the running
/// sandboxes in lock walks. A description's own locks never conflict with each other, so
/// the bytes this process holds are also kept in `held`.
struct LockTable {
    lock: std::sync::Arc<OwnedFd>,
    held: std::collections::HashSet<i64>,
    /// The process that opened the description.
    owner: Owner,
}

static TABLE: std::sync::Mutex<Option<LockTable>> = std::sync::Mutex::new(None);

/// The byte that stands for a uid: its own number, so that supervisors reading different
/// ranges (an `/etc/subuid` edited meanwhile) still never lease the same uid twice.
fn uid_byte(uid: u32) -> i64 {
    i64::from(uid)
}

/// The byte that stands for a gid: past every uid's.
fn gid_byte(gid: u32) -> i64 {
    (1i64 << 32) + i64::from(gid)
}

fn set_lock(fd: &OwnedFd, byte: i64, kind: libc::c_int) -> nix::Result<()> {
    // SAFETY: `flock` is plain old data; all-zero is a valid value, then filled in below.
    let mut lk: libc::flock = unsafe { std::mem::zeroed() };
    lk.l_type = kind as libc::c_short;
    lk.l_whence = libc::SEEK_SET as libc::c_short;
    lk.l_start = byte;
    lk.l_len = 1;
    fcntl(fd, FcntlArg::F_OFD_SETLK(&lk)).map(drop)
}

/// This process's lock description, opened on first use (and again in a child process,
/// whose copy of the table belongs to its parent's description).
fn table(table: &mut Option<LockTable>) -> io::Result<&mut LockTable> {
    let owner = current_owner().ok_or_else(|| {
        io::Error::other("cannot tell this process from its parent: /proc/self/ns/pid is unreadable (mount /proc)")
    })?;
    if table.as_ref().is_some_and(|t| t.owner != owner) {
        *table = None;
    }
    if table.is_none() {
        let dir = Dir::create(Path::new(LOCK_DIR), 0o755)?;
        let lock = dir.open_lock(LOCK_FILE, 0o600)?;
        *table = Some(LockTable {
            lock: std::sync::Arc::new(lock),
            held: std::collections::HashSet::new(),
            owner,
        });
    }
    table
        .as_mut()
        .ok_or_else(|| io::Error::other("the id lock table is missing"))
}

/// Leases a free uid/gid pair from `ranges`.
pub fn lease(ranges: &IdRanges) -> io::Result<IdLease> {
    let slots = ranges.slots();
    if slots == 0 {
        return Err(io::Error::other("the id range has no ids to lease"));
    }
    let mut guard = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let t = table(&mut guard)?;
    // Start at a random slot: concurrent supervisors rarely probe the same slots, and one
    // long-lived supervisor (the controller's launcher) does not hand the same id to every
    // worker it starts one after another.
    let mut r = [0u8; 4];
    getrandom::fill(&mut r).map_err(|e| io::Error::other(format!("random source: {e}")))?;
    let start = u32::from_le_bytes(r) % slots;
    for i in 0..slots {
        let slot = (start + i) % slots;
        let (uid, gid) = (ranges.uids.start + slot, ranges.gids.start + slot);
        let bytes = [uid_byte(uid), gid_byte(gid)];
        if bytes.iter().any(|b| t.held.contains(b)) {
            continue;
        }
        match set_lock(&t.lock, bytes[0], libc::F_WRLCK) {
            Ok(()) => {}
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => continue,
            Err(e) => return Err(io::Error::from(e)),
        }
        match set_lock(&t.lock, bytes[1], libc::F_WRLCK) {
            Ok(()) => {}
            Err(e) => {
                let _ = set_lock(&t.lock, bytes[0], libc::F_UNLCK);
                if matches!(e, nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) {
                    continue;
                }
                return Err(io::Error::from(e));
            }
        }
        t.held.extend(bytes);
        return Ok(IdLease {
            _slot: std::sync::Arc::new(Slot {
                lock: t.lock.clone(),
                bytes,
                owner: t.owner,
            }),
            uid,
            gid,
        });
    }
    Err(io::Error::other(format!(
        "all {slots} sandbox ids are in use (add a larger `{RANGE_OWNER}` range to /etc/subuid and /etc/subgid)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lock file is one for every range: these tests take turns.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// This test's turn with the lock file, or `None` (said) where leasing needs root.
    fn leasing_turn() -> Option<std::sync::MutexGuard<'static, ()>> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP: leases need /run/hatchery (root)");
            return None;
        }
        Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The same `count` ids from `start` for uids and gids.
    fn ranges(start: u32, count: u32) -> IdRanges {
        let r = SubIdRange { start, count };
        IdRanges { uids: r, gids: r }
    }

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
        let Some(_turn) = leasing_turn() else {
            return Ok(());
        };
        let ranges = ranges(0x7100_0000, 3);
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

    #[test]
    fn a_byte_locked_by_another_description_is_never_leased() -> io::Result<()> {
        let Some(_turn) = leasing_turn() else {
            return Ok(());
        };
        let ranges = ranges(0x7200_0000, 3);
        // Another supervisor: its own description of the lock file, holding slot 0's uid.
        let other = Dir::create(Path::new(LOCK_DIR), 0o755)?.open_lock(LOCK_FILE, 0o600)?;
        set_lock(&other, uid_byte(0x7200_0000), libc::F_WRLCK).map_err(io::Error::from)?;
        let a = lease(&ranges)?;
        assert_eq!(a.uid, 0x7200_0001, "slot 0 is the other supervisor's");
        assert!(lease(&ranges).is_err(), "slot 1 is ours, slot 0 theirs");
        drop(other);
        let b = lease(&ranges)?;
        assert_eq!(b.uid, 0x7200_0000);
        Ok(())
    }

    #[test]
    fn supervisors_reading_different_ranges_never_lease_the_same_uid() -> io::Result<()> {
        let Some(_turn) = leasing_turn() else {
            return Ok(());
        };
        // One range read before /etc/subuid was edited, one after: they overlap.
        let (before, after) = (ranges(0x7400_0000, 3), ranges(0x7400_0001, 3));
        let mut leases = Vec::new();
        for r in [before, before, after, after] {
            if let Ok(l) = lease(&r) {
                leases.push(l);
            }
        }
        let mut uids: Vec<u32> = leases.iter().map(|l| l.uid).collect();
        uids.sort_unstable();
        uids.dedup();
        assert_eq!(uids.len(), leases.len(), "a uid leased twice: {uids:?}");
        assert_eq!(
            leases.len(),
            3,
            "0x74000000..=0x74000002 are the ids there are"
        );
        Ok(())
    }

    /// Whether a description of its own (another supervisor) could lock `uid` now.
    fn another_can_take(uid: u32) -> io::Result<bool> {
        let other = Dir::create(Path::new(LOCK_DIR), 0o755)?.open_lock(LOCK_FILE, 0o600)?;
        Ok(set_lock(&other, uid_byte(uid), libc::F_WRLCK).is_ok())
    }

    #[test]
    fn a_copy_of_a_lease_in_another_process_neither_frees_it_nor_leases_it_again() -> io::Result<()>
    {
        let Some(_turn) = leasing_turn() else {
            return Ok(());
        };
        let ranges = ranges(0x7300_0000, 3);
        let ours = lease(&ranges)?;
        let Some((pid, ns)) = current_owner() else {
            return Err(io::Error::other("no owner"));
        };
        // As a forked child (in a new pid namespace, pid 1 maybe) sees it: the same
        // description and memory, another process.
        for stranger in [(pid, ns.wrapping_add(1)), (pid.wrapping_add(1), ns)] {
            let copy = Slot {
                lock: ours._slot.lock.clone(),
                bytes: ours._slot.bytes,
                owner: stranger,
            };
            drop(copy);
            assert!(
                !another_can_take(ours.uid)?,
                "a copy's drop freed the lease"
            );
        }
        {
            let mut guard = TABLE.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(t) = guard.as_mut() {
                t.owner = (pid, ns.wrapping_add(1));
            }
        }
        // The stranger's own table is a description of its own: the byte is not its.
        let theirs = lease(&ranges)?;
        assert_ne!(theirs.uid, ours.uid);
        drop(theirs);
        let uid = ours.uid;
        drop(ours);
        assert!(
            another_can_take(uid)?,
            "the lease ends with its last handle"
        );
        Ok(())
    }
}
