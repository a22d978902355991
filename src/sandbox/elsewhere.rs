//! Starting pid 1 on another processor than the supervisor's.
//!
//! The kernel queues a new task on its parent's processor wherever no scheduling domain
//! balances on fork (a two-processor virtual machine, for one), so pid 1 would wait there
//! until the supervisor blocks: the supervisor's half of a start (the id maps, the cgroup
//! and its limits, the filters) and the sandbox's (its network namespace, its root) would
//! run one after the other although nothing orders them. Barring the supervisor's
//! processor to pid 1 for its first moments makes the kernel move it to an idle one, and
//! the two halves overlap. Its mask is given back as soon as the supervisor has written its
//! id maps, long before it may start anything: the payload inherits the supervisor's mask
//! as before, and a busy host is balanced as usual from then on.

use nix::errno::Errno;
use nix::sched::{CpuSet, sched_getaffinity, sched_getcpu, sched_setaffinity};
use nix::unistd::Pid;

/// A pid 1 barred from the supervisor's processor, until [`Elsewhere::give_back`].
#[derive(Debug)]
pub struct Elsewhere {
    pid: Pid,
    mask: CpuSet,
}

/// Bars pid 1 (`pid`, just cloned, with the supervisor's mask) from the processor the
/// supervisor runs on. None, and nothing changed, where the mask allows no other processor
/// or a call fails: pid 1 then starts where the kernel put it.
pub fn start_elsewhere(pid: Pid) -> Option<Elsewhere> {
    let mask = sched_getaffinity(Pid::from_raw(0)).ok()?;
    let mut away = mask;
    away.unset(sched_getcpu().ok()?).ok()?;
    let others = (0..CpuSet::count()).any(|i| away.is_set(i).unwrap_or(false));
    if !others {
        return None;
    }
    sched_setaffinity(pid, &away).ok()?;
    Some(Elsewhere { pid, mask })
}

impl Elsewhere {
    /// Gives pid 1 the supervisor's mask again. A pid 1 already gone (ESRCH) is no error:
    /// its report, read by the caller, says why it ended.
    pub fn give_back(self) -> Result<(), Errno> {
        match sched_setaffinity(self.pid, &self.mask) {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(pid: Pid) -> Vec<usize> {
        let set = sched_getaffinity(pid).unwrap_or_else(|e| panic!("sched_getaffinity: {e}"));
        (0..CpuSet::count())
            .filter(|&i| set.is_set(i).unwrap_or(false))
            .collect()
    }

    #[test]
    fn a_child_is_barred_from_this_processor_and_gets_the_whole_mask_back() {
        let ours = allowed(Pid::from_raw(0));
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap_or_else(|e| panic!("sleep: {e}"));
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
        match start_elsewhere(pid) {
            Some(away) => {
                let barred = allowed(pid);
                assert_eq!(barred.len() + 1, ours.len(), "{barred:?} of {ours:?}");
                assert!(barred.iter().all(|c| ours.contains(c)));
                away.give_back()
                    .unwrap_or_else(|e| panic!("give back: {e}"));
                assert_eq!(allowed(pid), ours);
            }
            None => assert_eq!(ours.len(), 1, "more than one processor, yet not moved"),
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_child_gone_before_its_mask_is_given_back_is_no_error() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .unwrap_or_else(|e| panic!("true: {e}"));
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
        let away = start_elsewhere(pid);
        let _ = child.wait();
        if let Some(away) = away {
            assert_eq!(away.give_back(), Ok(()));
        }
    }
}
