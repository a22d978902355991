//! Starting pid 1 on another processor than the supervisor's.
//!
//! The kernel queues a new task on its parent's processor wherever the scheduler does not
//! spread forks (virtual machines that pack their tasks onto few processors do not), so
//! pid 1 would wait there until the supervisor blocks: the supervisor's half of a start
//! (the id maps, the cgroup and its limits, the filters) and the sandbox's (its network
//! namespace, its root) would run one after the other although nothing orders them.
//! Barring the supervisor's processor to pid 1 for its first moments makes the kernel move
//! it to an idle one, and the two halves overlap.
//!
//! What the payload may run on must not change by it. A mask set with
//! `sched_setaffinity` is also kept as the task's request (since Linux 6.2), inherited and
//! intersected with every later cpuset change; pid 1 would otherwise inherit the
//! supervisor's request, usually none. So pid 1 is moved only when the supervisor may run
//! on every possible processor, and is then given a request for every processor: the
//! kernel narrows that to pid 1's cpuset exactly as it narrowed the supervisor's, now and
//! whenever the cpuset changes. A supervisor held to fewer processors (`taskset`, a
//! cpuset) leaves pid 1 alone.

use nix::errno::Errno;
use nix::sched::{CpuSet, sched_getaffinity, sched_getcpu, sched_setaffinity};
use nix::unistd::Pid;

/// Where the kernel lists the processors this machine may ever have.
const POSSIBLE: &str = "/sys/devices/system/cpu/possible";

/// A pid 1 barred from the supervisor's processor, until [`Elsewhere::give_back`].
#[derive(Debug)]
pub struct Elsewhere {
    pid: Pid,
}

/// Bars pid 1 (`pid`, just cloned, with the supervisor's mask) from the processor the
/// supervisor runs on. None, and nothing changed, where the supervisor may not run on
/// every possible processor, where that leaves no other, or where a call fails: pid 1
/// then starts where the kernel put it.
pub fn start_elsewhere(pid: Pid) -> Option<Elsewhere> {
    let mask = sched_getaffinity(Pid::from_raw(0)).ok()?;
    if !covers(&mask, possible()?)? {
        return None;
    }
    let mut away = mask;
    away.unset(sched_getcpu().ok()?).ok()?;
    if !(0..CpuSet::count()).any(|i| away.is_set(i).unwrap_or(false)) {
        return None;
    }
    sched_setaffinity(pid, &away).ok()?;
    Some(Elsewhere { pid })
}

/// The processors this machine may ever have, as the kernel lists them: fixed at boot,
/// so read once a process (a launcher starts many sandboxes).
fn possible() -> Option<&'static str> {
    static LIST: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    LIST.get_or_init(|| super::kernel_text::read(POSSIBLE).ok())
        .as_deref()
}

/// Whether `mask` holds every processor of `list` (the kernel's `0-3,8` form); None when
/// the list does not read as one.
fn covers(mask: &CpuSet, list: &str) -> Option<bool> {
    let mut all = true;
    for range in list.trim().split(',') {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let (first, last) = (first.parse::<usize>().ok()?, last.parse::<usize>().ok()?);
        if first > last {
            return None;
        }
        for cpu in first..=last {
            all &= mask.is_set(cpu).ok()?;
        }
    }
    Some(all)
}

/// Calls of [`Elsewhere::give_back`] a cpuset changing meanwhile may spoil.
const GIVE_BACK_TRIES: usize = 4;

impl Elsewhere {
    /// Gives pid 1 a request for every processor, which the kernel narrows to its cpuset
    /// (see the module's comment). pid 1 is the caller's child, not reaped before this:
    /// the call reaches it even when it has ended. The kernel answers EINVAL when pid 1's
    /// cpuset shrank during the call (it then puts the earlier request back): the call is
    /// made again, a few times at most.
    pub fn give_back(self) -> Result<(), Errno> {
        let mut every = CpuSet::new();
        for cpu in 0..CpuSet::count() {
            every.set(cpu)?;
        }
        let mut tries = GIVE_BACK_TRIES;
        loop {
            tries = tries.saturating_sub(1);
            match sched_setaffinity(self.pid, &every) {
                Err(Errno::EINVAL) if tries > 0 => continue,
                done => return done,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::wait::holds_in_a_child;

    fn allowed(pid: Pid) -> Vec<usize> {
        let set = sched_getaffinity(pid).unwrap_or_else(|e| panic!("sched_getaffinity: {e}"));
        (0..CpuSet::count())
            .filter(|&i| set.is_set(i).unwrap_or(false))
            .collect()
    }

    fn sleeper() -> (std::process::Child, Pid) {
        let child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap_or_else(|e| panic!("sleep: {e}"));
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
        (child, pid)
    }

    #[test]
    fn a_child_is_barred_from_this_processor_and_gets_the_whole_mask_back() {
        let ours = allowed(Pid::from_raw(0));
        let possible = std::fs::read_to_string(POSSIBLE).unwrap_or_default();
        let mut mask = CpuSet::new();
        for &c in &ours {
            let _ = mask.set(c);
        }
        let (mut child, pid) = sleeper();
        match start_elsewhere(pid) {
            Some(away) => {
                let barred = allowed(pid);
                assert_eq!(barred.len() + 1, ours.len(), "{barred:?} of {ours:?}");
                assert!(barred.iter().all(|c| ours.contains(c)));
                away.give_back()
                    .unwrap_or_else(|e| panic!("give back: {e}"));
                assert_eq!(allowed(pid), ours);
            }
            None => assert!(
                ours.len() == 1 || covers(&mask, &possible) != Some(true),
                "free to run on {ours:?} of {possible}, yet not moved"
            ),
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_supervisor_held_to_fewer_processors_leaves_its_child_alone() {
        let ours = allowed(Pid::from_raw(0));
        // All but one where that still leaves two (the case of a mask that allows other
        // processors yet not every possible one), else one.
        let keep: Vec<usize> = if ours.len() >= 3 {
            ours.iter().skip(1).copied().collect()
        } else {
            ours.iter().take(1).copied().collect()
        };
        assert!(!keep.is_empty(), "no processor allowed");
        // In a child, so that narrowing the mask does not narrow the test harness's.
        assert!(holds_in_a_child(&[], || {
            let mut held = CpuSet::new();
            if keep.iter().any(|&c| held.set(c).is_err())
                || sched_setaffinity(Pid::from_raw(0), &held).is_err()
            {
                return false;
            }
            // A grandchild by fork(2) alone: this is a fork of a threaded test harness.
            // SAFETY: the grandchild only waits for signals until it is killed.
            let pid = match unsafe { nix::unistd::fork() } {
                Ok(nix::unistd::ForkResult::Child) => loop {
                    nix::unistd::pause();
                },
                Ok(nix::unistd::ForkResult::Parent { child }) => child,
                Err(_) => return false,
            };
            let untouched = start_elsewhere(pid).is_none() && allowed(pid) == keep;
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(pid, None);
            untouched
        }));
    }

    #[test]
    fn a_processor_list_is_covered_only_whole() {
        let mut mask = CpuSet::new();
        for c in [0, 1, 2, 3, 8] {
            let _ = mask.set(c);
        }
        assert_eq!(covers(&mask, "0-3,8\n"), Some(true));
        assert_eq!(covers(&mask, "0-3"), Some(true));
        assert_eq!(covers(&mask, "0-4"), Some(false));
        assert_eq!(covers(&mask, "0,9"), Some(false));
        assert_eq!(covers(&mask, "3-1"), None);
        assert_eq!(covers(&mask, "x"), None);
        assert_eq!(covers(&mask, ""), None);
        assert_eq!(covers(&mask, "0-99999"), None);
    }

    #[test]
    fn a_child_that_has_ended_unreaped_still_gets_the_mask_back() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .unwrap_or_else(|e| panic!("true: {e}"));
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
        let away = start_elsewhere(pid);
        std::thread::sleep(std::time::Duration::from_millis(50));
        if let Some(away) = away {
            assert_eq!(away.give_back(), Ok(()));
        }
        let _ = child.wait();
    }
}
