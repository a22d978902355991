//! The sandbox's pid 1: starts the payload, forwards signals to it, reaps every orphan,
//! and reports the payload's status. When it exits, the kernel kills whatever is left in
//! the pid namespace: daemons and double-forked children die with the sandbox.

use std::os::fd::BorrowedFd;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::channel::FromSandbox;

/// Signals pid 1 passes on to the payload.
pub const FORWARDED: [Signal; 7] = [
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

/// The forwarded signals that, arriving before the command has started, abandon its
/// start: the caller wants the run over (^C, a service manager's stop), not a command
/// started to receive them.
pub const STOPPING: [Signal; 4] = [
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
];

/// The set pid 1 waits on: the forwarded signals and SIGCHLD.
pub fn wait_set() -> SigSet {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(s);
    }
    set.add(Signal::SIGCHLD);
    set
}

/// Blocks exactly the signals pid 1 will collect with sigwaitinfo (and unblocks the rest),
/// before the payload starts: none arrives unhandled in between, and one already pending
/// stays so.
pub fn block_signals() {
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&wait_set()), None);
}

fn raw_status(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some((code & 0xff) << 8),
        WaitStatus::Signaled(_, sig, core) => Some(sig as i32 | if core { 0x80 } else { 0 }),
        _ => None,
    }
}

/// Runs pid 1's loop until the payload ends, then reports its status and exits.
pub fn reap_until_exit(payload: Pid, channel: BorrowedFd<'_>) -> ! {
    let set = wait_set();
    loop {
        let sig = match set.wait() {
            Ok(s) => s,
            Err(_) => continue,
        };
        if sig != Signal::SIGCHLD {
            let _ = nix::sys::signal::kill(payload, sig);
            if matches!(
                sig,
                Signal::SIGHUP | Signal::SIGINT | Signal::SIGQUIT | Signal::SIGTERM
            ) {
                // A command that stopped itself takes these only once continued: without
                // this, `run` (and `timeout`, a service manager) waited on it forever.
                // Service managers continue what they stop the same way.
                let _ = nix::sys::signal::kill(payload, Signal::SIGCONT);
            }
            continue;
        }
        // Reap everything that has exited: the payload and any orphan re-parented to us.
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(status) => {
                    if status.pid() == Some(payload) {
                        report_and_exit(channel, raw_status(status));
                    }
                }
            }
        }
    }
}

/// pid 1 when the payload's set-up ended before its `execve` (see [`super::spawn::Left`]):
/// waits for it, reports its status and exits, touching no heap (the set-up shared pid
/// 1's memory and may have died halfway through changing it). Nothing else runs in the
/// sandbox yet: no orphan to reap, no command to pass a signal on to.
pub fn report_early_end(payload: Pid, channel: BorrowedFd<'_>) -> ! {
    let status = loop {
        match waitpid(payload, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            Ok(status) => break raw_status(status),
            Err(_) => break None,
        }
    };
    report_and_exit(channel, status)
}

/// pid 1's last word: the payload's raw status, if it has one, sent from the stack; then
/// pid 1 leaves, and the kernel kills whatever is left in the namespace.
fn report_and_exit(channel: BorrowedFd<'_>, status: Option<i32>) -> ! {
    if let Some(raw) = status {
        FromSandbox::send_exited(channel, raw);
    }
    // SAFETY: _exit ends the process without running destructors that belong to the
    // supervisor whose memory image we share.
    unsafe { libc::_exit(0) }
}
