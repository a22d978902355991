//! Starting the payload the way posix_spawn(3) starts a program: a child that shares pid
//! 1's memory (`CLONE_VM | CLONE_VFORK`) until its `execve`, on a stack of its own, while
//! pid 1 waits.
//!
//! Why not fork: a fork copies pid 1's page tables, both processes then take copy-on-write
//! faults, and `execve` tears the copy down again — about a twentieth of a whole `run`.
//!
//! What sharing costs, and how each cost is met:
//! - pid 1 waits inside the clone, its signals pending, until the child's `execve` is past
//!   its point of no return, however long a file system takes to answer it. So pid 1 is
//!   not the one to judge whether the command has started: the supervisor holds the read
//!   end of a pipe whose only write end the child holds, close-on-exec (see
//!   `channel::start_gate`); the kernel closes it at the `execve`, before any instruction
//!   of the command runs.
//! - A child that dies before its `execve` (a ^C typed into the sandbox's terminal, a
//!   SIGKILL, a filter that kills) may leave pid 1's heap half-changed. The child says
//!   when it is at rest in `execve` ([`at_execve`]); when it ended anywhere else, pid 1
//!   only reports its status and exits, touching no heap ([`Left::Early`]).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::unistd::Pid;

/// Set by the child, in the memory it shares with pid 1, while it is inside `execve`.
static AT_EXECVE: AtomicBool = AtomicBool::new(false);

/// Size of the stack the payload's set-up runs on: far more than the Landlock, capability
/// and filter steps use.
const STACK: usize = 1 << 20;

/// The inaccessible page below that stack: an overflow faults instead of writing into
/// whatever pid 1 has mapped there.
const GUARD: usize = 4096;

/// How the child left pid 1's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// From inside `execve` (it ran the command, or is being killed there): everything it
    /// changed in the shared memory was finished.
    AtExecve,
    /// Anywhere else: it exited or was killed during its set-up, possibly halfway through
    /// changing the heap.
    Early,
}

/// Marks the calling child as inside `execve` (`true`, just before the call) or back in
/// its set-up (`false`, once a failed call returns). Outside a child started by
/// [`spawn_sharing_memory`] it changes nothing anyone reads.
pub fn at_execve(inside: bool) {
    AT_EXECVE.store(inside, Ordering::SeqCst);
}

/// Starts `run` in a child that shares this process's memory until it calls `execve` or
/// exits, while this process waits. Returns the child and how it left.
///
/// Sound only because: this process is single-threaded (no lock can be held by a thread
/// that is not there), it does not run until the child has left the shared memory (so the
/// two never run at once), the child never returns into this process's frames (`run` ends
/// in `execve` or `_exit`, and the child exits should it return), and the child has its
/// own descriptor table, signal dispositions and credentials (no `CLONE_FILES`,
/// `CLONE_SIGHAND` or `CLONE_THREAD`). What the child allocates stays allocated here: a
/// payload's set-up is a few kilobytes. A caller that must not be readable by the payload
/// makes itself non-dumpable first: dumpability belongs to the memory, so the child is
/// non-dumpable too until its `execve`.
pub fn spawn_sharing_memory<F: FnOnce()>(run: F) -> io::Result<(Pid, Left)> {
    extern "C" fn start<F: FnOnce()>(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `Option<F>` below, alive in the parent's frame, which waits
        // until this child has called execve or exited.
        let slot = unsafe { &mut *arg.cast::<Option<F>>() };
        if let Some(run) = slot.take() {
            run();
        }
        // `run` ends in execve or _exit; should it return, the child leaves all the same.
        // SAFETY: leave without running anything of the parent's.
        unsafe { libc::_exit(125) }
    }
    // SAFETY: a fresh private anonymous mapping, unmapped below; nothing else refers to it.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            GUARD + STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the lowest page of the mapping just made.
    if unsafe { libc::mprotect(stack, GUARD, libc::PROT_NONE) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: the mapping above, used by nothing yet.
        unsafe { libc::munmap(stack, GUARD + STACK) };
        return Err(e);
    }
    AT_EXECVE.store(false, Ordering::SeqCst);
    let mut slot = Some(run);
    // SAFETY: the stack grows down from the end of the mapping above, to its guard page;
    // `start` never returns into this frame (see above); with CLONE_VFORK this call
    // returns only once the child has called execve or exited, so `slot` and everything
    // `run` borrows outlive its use, and the child never runs at the same time as this
    // process.
    let pid = unsafe {
        libc::clone(
            start::<F>,
            stack.cast::<u8>().add(GUARD + STACK).cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut slot as *mut Option<F>).cast(),
        )
    };
    let spawned = if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        let left = if AT_EXECVE.load(Ordering::SeqCst) {
            Left::AtExecve
        } else {
            Left::Early
        };
        Ok((Pid::from_raw(pid), left))
    };
    // SAFETY: the child has left this memory (execve or exit); the mapping is ours.
    unsafe {
        libc::munmap(stack, GUARD + STACK);
    }
    spawned
}
