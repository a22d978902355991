//! Output that several pumps share (a supervisor of many sandboxes: every worker's log
//! together), and the room a file system keeps for what matters more than output.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::CHUNK;

/// Bytes that several pumps share (a supervisor of many sandboxes: every worker's log
/// together), taken from as output is accepted; at zero every pump sharing it is at its cap.
/// Clones share one budget (and may be on other threads: a pump may run on a thread of its
/// own, [`super::Relay`]).
#[derive(Clone)]
pub struct OutputBudget(Arc<SharedBudget>);

struct SharedBudget {
    left: AtomicU64,
    /// The file system the output is written to, when it must keep room for others.
    disk: Option<DiskReserve>,
}

/// Room a file system keeps for what matters more than output: a controller's audit trail
/// shares the state directory's file system with every worker's log, and a worker that
/// filled it would leave no room for the next decision (the controller then stops every
/// worker, since a decision it cannot record must not take effect).
struct DiskReserve {
    fd: OwnedFd,
    /// Bytes kept free for others.
    reserve: u64,
    /// Files (inodes) kept free for others: the trail's head is a new file at each sync.
    files_reserve: u64,
    /// The file system's block: what a write may take from it however short.
    block: u64,
    /// Bytes that may be taken before the file system is asked again.
    room: AtomicU64,
}

/// Output accepted between two looks at the file system's free space, at most: others
/// (the audit trail, other programs) use it too.
const DISK_LOOK_EVERY: u64 = 1 << 20;
/// Most a file system keeps free for others: a sixteenth of it, up to this.
const MOST_RESERVED: u64 = 64 << 20;
/// Most files (inodes) it keeps free for others: a sixteenth of them, up to this.
const MOST_FILES_RESERVED: u64 = 4096;

impl DiskReserve {
    /// Free bytes output may take now: past the reserve, and past a quarter of it more,
    /// which the next workers' logs (files, a block or two each) may take; output that
    /// took everything down to the reserve would leave no room to start another worker.
    fn look(&self) -> u64 {
        let Ok(st) = nix::sys::statvfs::fstatvfs(&self.fd) else {
            return 0;
        };
        let free = st.blocks_available().saturating_mul(st.fragment_size());
        let kept = self.reserve.saturating_add(self.reserve / 4);
        free.saturating_sub(kept).min(DISK_LOOK_EVERY)
    }
}

impl OutputBudget {
    /// `bytes` to share.
    pub fn new(bytes: u64) -> OutputBudget {
        OutputBudget(Arc::new(SharedBudget {
            left: AtomicU64::new(bytes),
            disk: None,
        }))
    }

    /// `bytes` to share, and never so much that the file system of `dir` (where the
    /// output goes) has less than a sixteenth of its size free (at most 64 MiB), for
    /// whatever else it holds.
    pub fn keeping_room(bytes: u64, dir: BorrowedFd<'_>) -> io::Result<OutputBudget> {
        let st = nix::sys::statvfs::fstatvfs(dir).map_err(io::Error::from)?;
        let size = st.blocks().saturating_mul(st.fragment_size());
        let disk = DiskReserve {
            fd: dir.try_clone_to_owned()?,
            reserve: (size / 16).min(MOST_RESERVED),
            // At least one: the next head. A file system that counts no inodes (btrfs)
            // has no such limit.
            files_reserve: (st.files() / 16).clamp(1, MOST_FILES_RESERVED),
            block: st.block_size().max(st.fragment_size()).max(1),
            room: AtomicU64::new(0),
        };
        Ok(OutputBudget(Arc::new(SharedBudget {
            left: AtomicU64::new(bytes),
            disk: Some(disk),
        })))
    }

    /// Bytes that may be accepted now.
    pub fn room(&self) -> u64 {
        let left = self.0.left.load(Ordering::Relaxed);
        match &self.0.disk {
            None => left,
            Some(disk) => {
                // Asked again before a read could need more than is known to be left.
                if disk.room.load(Ordering::Relaxed) < CHUNK as u64 {
                    disk.room.store(disk.look(), Ordering::Relaxed);
                }
                left.min(disk.room.load(Ordering::Relaxed))
            }
        }
    }

    /// Takes `n` accepted bytes. From the file system's room they take whole blocks: each
    /// log's last block is taken whole however little is written to it, so many short
    /// writes to many logs take more than their bytes (the next look then sees the rest).
    pub fn take(&self, n: u64) {
        saturating_take(&self.0.left, n);
        if let Some(disk) = &self.0.disk {
            saturating_take(
                &disk.room,
                n.div_ceil(disk.block).saturating_mul(disk.block),
            );
        }
    }

    /// Whether one more file (a worker's log) may be made where the output goes, leaving
    /// the file system's reserve of files (inodes) and of bytes to others; if not, why.
    /// A file takes whole blocks however little is written to it: counted by bytes,
    /// many small logs took several times what they held (1-byte logs, 4 KiB each), so
    /// each new one is checked against the free space itself, and the next output asks
    /// the file system again.
    pub fn room_for_a_file(&self) -> Result<(), String> {
        let Some(disk) = &self.0.disk else {
            return Ok(());
        };
        disk.room.store(0, Ordering::Relaxed);
        let Ok(st) = nix::sys::statvfs::fstatvfs(&disk.fd) else {
            return Ok(());
        };
        let how = "remove old worker logs or give the state directory's file system more room";
        if st.files() != 0 && st.files_available() <= disk.files_reserve {
            return Err(format!(
                "its file system has {} free inodes, and the last {} are kept for the audit trail: {how}",
                st.files_available(),
                disk.files_reserve
            ));
        }
        let free = st.blocks_available().saturating_mul(st.fragment_size());
        let block = st.block_size().max(st.fragment_size());
        if free < disk.reserve.saturating_add(block.saturating_mul(2)) {
            return Err(format!(
                "its file system has {free} bytes free, and the last {} are kept for the audit trail: {how}",
                disk.reserve
            ));
        }
        Ok(())
    }

    /// Bytes of the shared budget left (the file system's room aside).
    pub fn left(&self) -> u64 {
        self.0.left.load(Ordering::Relaxed)
    }
}

/// `counter -= n`, stopping at zero, whoever else takes from it meanwhile.
fn saturating_take(counter: &AtomicU64, n: u64) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}
