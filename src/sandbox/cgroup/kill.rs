//! SIGKILLs what a cgroup lists without ever signalling a process the list did not name.
//!
//! `cgroup.procs` names processes by number, and a number is free again once its process
//! is reaped: inside a sandbox, by a parent the sandbox controls, as fast as it likes.
//! `kill(pid)` after reading the list could therefore reach whatever process the host
//! started under that number in between (a pid space of 32,768 wraps in a second or two
//! of forks). So each listed number is first pinned to the process holding it with
//! `pidfd_open`, the list is read again, and only a pinned process listed the second time
//! is signalled, through its pidfd. A process that is alive (or a zombie) when signalled
//! has held its number since it was pinned, so the second listing was its own; one that
//! was reaped in between is not signalled at all (the pidfd answers ESRCH), whoever holds
//! its number now.
//!
//! Pinning takes a descriptor a process, so a big cgroup is dealt with [`ROUND`] processes
//! a round, and with fewer descriptors free, fewer. With fewer than two free (one to pin
//! with, one to read the list again), nothing is signalled and the failure says the
//! supervisor is out of descriptors: never a signal by number.
//!
//! This is a backstop. A sandbox's processes all live in its pid namespace, which the
//! kernel kills whole with its pid 1 (no fork succeeds in it after that); what a cgroup
//! still lists then is a straggler. Pinning costs three system calls a process where
//! `kill` cost one, so with very few descriptors free a fork bomb outside any such
//! namespace could outpace it until the deadline (then: busy, never a wrong signal).

use std::io;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::CgroupError;
use crate::sandbox::handle::pidfd_open;
use crate::sandbox::process::pidfd_signal;

/// Most processes pinned at once: one descriptor each until the list has been read again.
/// Well under the usual soft limit of 1,024 descriptors; a bigger cgroup is dealt with
/// over several rounds.
const ROUND: usize = 256;

/// SIGKILLs the processes of a cgroup until it is empty or the deadline passes.
pub(crate) fn kill_procs_until_empty(dir: &Path, deadline: Instant) -> Result<(), CgroupError> {
    let mut pass = Pass::default();
    loop {
        let last_error = match kill_round(dir, &mut pass) {
            Ok(Listed::Nothing) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Ok(Listed::Some) => None,
            // Unreadable (not known to be empty), or short of descriptors to pin with:
            // read again until the deadline.
            Err(e) => Some(e),
        };
        if Instant::now() >= deadline {
            return Err(match last_error {
                Some(source) if is_short_of_room(&source) => CgroupError::Io {
                    path: dir.to_path_buf(),
                    source,
                },
                _ => CgroupError::Busy(dir.to_path_buf()),
            });
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// One pass over the list: the numbers it held when the pass began, dealt with a round at
/// a time, in order. Processes that appear during the pass wait for the next one, so a
/// sandbox forking new processes cannot keep an older one (the forker) from its turn,
/// and processes still listed after their SIGKILL (stuck in the kernel) take their turn
/// once a pass like the rest. As long as the list the pass began with: 4 bytes a number,
/// no more numbers than the host's pid space (16 MiB at Linux's largest, 4,194,304).
#[derive(Default)]
struct Pass {
    numbers: Vec<i32>,
    next: usize,
}

/// Whether the list named any process when it was read.
enum Listed {
    Nothing,
    Some,
}

/// Out of descriptors (or of the memory to make one).
fn is_short_of_room(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
    )
}

/// One round: pins up to [`ROUND`] of the pass's numbers and SIGKILLs those the list
/// names again.
fn kill_round(dir: &Path, pass: &mut Pass) -> io::Result<Listed> {
    if pass.next >= pass.numbers.len() {
        // A new pass. The numbers are copied out and the list closed before pinning: its
        // descriptor is one more to pin with when few are left.
        let mut numbers = Vec::new();
        super::each_proc(dir, |pid| {
            numbers.push(pid);
            ControlFlow::Continue(())
        })?;
        if numbers.is_empty() {
            return Ok(Listed::Nothing);
        }
        // A list may name a process twice: one pidfd is enough.
        numbers.sort_unstable();
        numbers.dedup();
        *pass = Pass { numbers, next: 0 };
    }
    let turn = pass.numbers.get(pass.next..).unwrap_or_default();
    // (number, pidfd, its place in this turn)
    let mut pinned: Vec<(i32, OwnedFd, usize)> = Vec::with_capacity(turn.len().min(ROUND));
    let mut dealt_with = 0usize;
    for (at, &pid) in turn.iter().take(ROUND).enumerate() {
        match pidfd_open(pid) {
            Ok(fd) => pinned.push((pid, fd, at)),
            Err(e) if is_short_of_room(&e) => {
                if pinned.is_empty() {
                    return Err(e);
                }
                break;
            }
            // Gone already (ESRCH), or a number that names no process here (0 on v2 for
            // a process outside this pid namespace).
            Err(_) => {}
        }
        dealt_with = dealt_with.saturating_add(1);
    }
    // Reading the list again takes a descriptor: while there is none, give one back (its
    // process waits for a later round). With fewer than two descriptors free nothing can
    // be pinned and checked: say so.
    let listed = loop {
        match kill_still_listed(dir, &pinned) {
            Ok(listed) => break listed,
            Err(e) if is_short_of_room(&e) && pinned.len() > 1 => {
                // The next round starts again from the one given back.
                if let Some((_, _, at)) = pinned.pop() {
                    dealt_with = at;
                }
            }
            Err(e) => return Err(e),
        }
    };
    pass.next = pass.next.saturating_add(dealt_with);
    Ok(listed)
}

/// SIGKILLs, through its pidfd, each pinned process whose number `dir`'s list names when
/// read now; the others are left alone (see the module's doc for why that is enough).
/// `pinned` is in ascending order of number, as a pass's numbers are.
fn kill_still_listed(dir: &Path, pinned: &[(i32, OwnedFd, usize)]) -> io::Result<Listed> {
    let mut confirmed = vec![false; pinned.len()];
    let mut unconfirmed = pinned.len();
    let mut any = false;
    super::each_proc(dir, |pid| {
        any = true;
        if let Ok(i) = pinned.binary_search_by_key(&pid, |(p, _, _)| *p) {
            if let Some(seen) = confirmed.get_mut(i) {
                if !*seen {
                    *seen = true;
                    unconfirmed = unconfirmed.saturating_sub(1);
                }
            }
        }
        if unconfirmed == 0 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    for ((_, pidfd, _), listed) in pinned.iter().zip(&confirmed) {
        if *listed {
            // ESRCH: it was reaped since it was pinned; its number is not looked at again.
            let _ = pidfd_signal(pidfd.as_fd(), Signal::SIGKILL);
        }
    }
    Ok(if any { Listed::Some } else { Listed::Nothing })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};

    fn sleeper() -> io::Result<Child> {
        Command::new("sleep").arg("30").spawn()
    }

    fn pid_of(child: &Child) -> i32 {
        i32::try_from(child.id()).unwrap_or(i32::MAX)
    }

    /// Whether `child` ended by SIGKILL within a few seconds (reaping it if so).
    fn killed(child: &mut Child) -> bool {
        use std::os::unix::process::ExitStatusExt;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status.signal() == Some(libc::SIGKILL),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => return false,
            }
        }
    }

    fn end(mut child: Child) {
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Whether `test` held in a forked child with only descriptors 0, 1 and 2 open and
    /// `free` more numbers under its limit (the hard limit kept); `test` may lower it.
    fn holds_with_free_descriptors(free: u64, test: impl FnOnce() -> bool) -> bool {
        crate::sandbox::wait::holds_in_a_child(&[], move || set_free_descriptors(free) && test())
    }

    fn set_free_descriptors(free: u64) -> bool {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        getrlimit(Resource::RLIMIT_NOFILE)
            .and_then(|(_, hard)| setrlimit(Resource::RLIMIT_NOFILE, 3 + free, hard))
            .is_ok()
    }

    /// Whether `pid` is still running (not a zombie, not gone).
    fn running(pid: u32) -> bool {
        super::super::proc_stat(pid).is_some_and(|(state, _)| state != 'Z')
    }

    /// One round of `pass` over `dir`, whose list first says what the kernel would list
    /// now: `now`.
    fn round_with_list<'a>(
        dir: &Path,
        pass: &mut Pass,
        now: impl Iterator<Item = &'a u32>,
    ) -> bool {
        let list: String = now.map(|p| format!("{p}\n")).collect();
        let ok =
            std::fs::write(dir.join("cgroup.procs"), list).is_ok() && kill_round(dir, pass).is_ok();
        std::thread::sleep(Duration::from_millis(2));
        ok
    }

    /// Whether every one of `pids` has stopped running within a few seconds.
    fn all_end(pids: &[u32]) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while pids.iter().any(|p| running(*p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        !pids.iter().any(|p| running(*p))
    }

    #[test]
    fn a_pinned_process_the_list_no_longer_names_is_not_killed() -> io::Result<()> {
        // Read first, `outside`'s number was in the list; read again, it is not (its
        // process left, or the number now belongs to a process of the host's).
        let dir = tempfile::tempdir()?;
        let mut outside = sleeper()?;
        let mut inside = sleeper()?;
        let (o, i) = (pid_of(&outside), pid_of(&inside));
        std::fs::write(dir.path().join("cgroup.procs"), format!("{i}\n{i}\n"))?;
        let mut pinned = vec![
            (o, pidfd_open(o)?, 0),
            (i, pidfd_open(i)?, 1),
            (i, pidfd_open(i)?, 1),
        ];
        // In ascending order of number, as a pass pins them.
        pinned.sort_by_key(|(pid, _, _)| *pid);
        let result = kill_still_listed(dir.path(), &pinned).map(|_| ());
        let inside_killed = killed(&mut inside);
        let outside_alive = outside.try_wait()?.is_none();
        end(outside);
        end(inside);
        result?;
        assert!(inside_killed, "the process listed again was not killed");
        assert!(outside_alive, "a process no longer listed was killed");
        Ok(())
    }

    #[test]
    fn a_cgroup_listed_empty_or_gone_is_done_and_one_listed_forever_is_busy() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let soon = Instant::now() + Duration::from_millis(50);
        std::fs::write(dir.path().join("cgroup.procs"), "")?;
        assert!(kill_procs_until_empty(dir.path(), soon).is_ok());
        assert!(kill_procs_until_empty(&dir.path().join("gone"), soon).is_ok());
        // A number no process holds stays listed here (a file, not a cgroup): busy.
        std::fs::write(dir.path().join("cgroup.procs"), "0\n-1\n4194305\nx\n")?;
        assert!(matches!(
            kill_procs_until_empty(dir.path(), soon),
            Err(CgroupError::Busy(_))
        ));
        // A process it lists is killed through its pidfd.
        let mut listed = sleeper()?;
        std::fs::write(
            dir.path().join("cgroup.procs"),
            format!("{}\n", pid_of(&listed)),
        )?;
        let _ = kill_procs_until_empty(dir.path(), Instant::now() + Duration::from_millis(200));
        let was_killed = killed(&mut listed);
        end(listed);
        assert!(was_killed, "a listed process survived");
        Ok(())
    }

    /// Zombies of this process: pinnable, deaf to SIGKILL, and listed for as long as the
    /// test's list says, like processes stuck in the kernel after their SIGKILL.
    fn stuck(n: usize) -> io::Result<Vec<Child>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let mut child = sleeper()?;
            child.kill()?;
            out.push(child);
        }
        Ok(out)
    }

    #[test]
    fn processes_still_listed_after_their_kill_do_not_hide_the_ones_behind_them() -> io::Result<()>
    {
        // A full window of them at the front of the list, and a live process after it.
        let dir = tempfile::tempdir()?;
        let front = stuck(ROUND)?;
        let mut behind = sleeper()?;
        let mut list: String = front.iter().map(|c| format!("{}\n", pid_of(c))).collect();
        list.push_str(&format!("{}\n", pid_of(&behind)));
        std::fs::write(dir.path().join("cgroup.procs"), list)?;
        let result =
            kill_procs_until_empty(dir.path(), Instant::now() + Duration::from_millis(300));
        let behind_killed = killed(&mut behind);
        end(behind);
        front.into_iter().for_each(end);
        assert!(matches!(result, Err(CgroupError::Busy(_))), "{result:?}");
        assert!(
            behind_killed,
            "the process behind a window of stuck ones was never killed"
        );
        Ok(())
    }

    #[test]
    fn with_two_descriptors_free_every_listed_process_is_killed_and_with_one_it_says_so() {
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("temporary directory: {e}"),
        };
        let mut listed: Vec<Child> = (0..3).filter_map(|_| sleeper().ok()).collect();
        assert_eq!(listed.len(), 3);
        let list: String = listed.iter().map(|c| format!("{}\n", pid_of(c))).collect();
        if let Err(e) = std::fs::write(dir.path().join("cgroup.procs"), list) {
            panic!("list: {e}");
        }
        let path = dir.path().to_path_buf();
        let as_said = holds_with_free_descriptors(2, move || {
            let soon = || Instant::now() + Duration::from_millis(200);
            // The list never changes here: busy at the deadline, every process signalled.
            let two_free = kill_procs_until_empty(&path, soon());
            if !set_free_descriptors(1) {
                return false;
            }
            let one_free = kill_procs_until_empty(&path, soon());
            let says_so = matches!(&one_free, Err(CgroupError::Io { source, .. })
                if source.raw_os_error() == Some(libc::EMFILE));
            says_so && matches!(two_free, Err(CgroupError::Busy(_)))
        });
        let all_killed = listed.iter_mut().all(killed);
        listed.into_iter().for_each(end);
        assert!(
            as_said,
            "out of descriptors: not said, or not busy with two free"
        );
        assert!(
            all_killed,
            "with two descriptors free, a listed process survived"
        );
    }

    #[test]
    fn processes_that_leave_the_list_shift_no_one_past_a_round() {
        // Two descriptors free: one process pinned a round. Ten stuck ones first, then
        // ten live ones; each killed one leaves the list before the next round, so the
        // ones behind it move up a place. One pass of twenty rounds must reach them all.
        let front = match stuck(10) {
            Ok(f) => f,
            Err(e) => panic!("stuck processes: {e}"),
        };
        let mut live: Vec<Child> = (0..10).filter_map(|_| sleeper().ok()).collect();
        assert_eq!(live.len(), 10);
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("temporary directory: {e}"),
        };
        let path = dir.path().to_path_buf();
        let stuck_pids: Vec<u32> = front.iter().map(Child::id).collect();
        let live_pids: Vec<u32> = live.iter().map(Child::id).collect();
        let all_reached = holds_with_free_descriptors(2, move || {
            let mut pass = Pass::default();
            // What the kernel would list now: the stuck ones, and the live ones left.
            (0..20).all(|_| {
                let left = live_pids.iter().filter(|p| running(**p));
                round_with_list(&path, &mut pass, stuck_pids.iter().chain(left))
            }) && all_end(&live_pids)
        });
        let all_killed = live.iter_mut().all(killed);
        live.into_iter().for_each(end);
        front.into_iter().for_each(end);
        assert!(all_reached, "a live process was passed over in the pass");
        assert!(all_killed, "a live process survived");
    }

    #[test]
    fn processes_started_during_a_pass_do_not_keep_an_older_one_from_its_turn() {
        // Two descriptors free: one process pinned a round. Before every round two new
        // processes appear, numbered below an older one (the forker, after the pid counter
        // wrapped): the older one must still get its turn within its pass.
        let mut all: Vec<Child> = (0..21).filter_map(|_| sleeper().ok()).collect();
        assert_eq!(all.len(), 21);
        all.sort_by_key(Child::id);
        let pids: Vec<u32> = all.iter().map(Child::id).collect();
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("temporary directory: {e}"),
        };
        let path = dir.path().to_path_buf();
        let older_killed = holds_with_free_descriptors(2, move || {
            let Some((older, newer)) = pids.split_last() else {
                return false;
            };
            let mut pass = Pass::default();
            (0..6usize).all(|round| {
                let appeared = newer.get(..1 + 2 * round).unwrap_or(newer);
                let now = appeared.iter().chain(std::iter::once(older));
                round_with_list(&path, &mut pass, now.filter(|p| running(**p)))
            }) && all_end(&[*older])
        });
        all.into_iter().for_each(end);
        assert!(
            older_killed,
            "the older process was kept from its turn by newer ones"
        );
    }

    #[test]
    fn a_process_given_back_for_want_of_a_descriptor_is_next_in_turn() {
        // Two descriptors free: both pinned, a number that names no one after them, and
        // none left to read the list again, so the second pin is given back. The next
        // round must start from it, not from the number after it.
        let mut two: Vec<Child> = (0..2).filter_map(|_| sleeper().ok()).collect();
        assert_eq!(two.len(), 2);
        let pids: Vec<u32> = two.iter().map(Child::id).collect();
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("temporary directory: {e}"),
        };
        let path = dir.path().to_path_buf();
        let list: String = pids.iter().map(|p| format!("{p}\n")).collect();
        if let Err(e) = std::fs::write(path.join("cgroup.procs"), format!("{list}4194305\n")) {
            panic!("list: {e}");
        }
        let both_in_two_rounds = holds_with_free_descriptors(2, move || {
            let mut pass = Pass::default();
            (0..2).all(|_| kill_round(&path, &mut pass).is_ok())
        });
        let both_killed = two.iter_mut().all(killed);
        two.into_iter().for_each(end);
        assert!(both_in_two_rounds, "a round failed");
        assert!(both_killed, "the process given back was passed over");
    }

    /// The race itself, made to happen: the number read from the list is freed and given
    /// to another process before the signal. Needs root, to choose the next pid
    /// (`/proc/sys/kernel/ns_last_pid`).
    #[test]
    fn a_number_reused_after_it_was_pinned_reaches_no_one() -> io::Result<()> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to choose the next pid");
            return Ok(());
        }
        let dir = tempfile::tempdir()?;
        // Another process takes number n. Other forks on the host may take it first (and
        // keep it), so try a few times, and with a new number if need be.
        let mut reused = None;
        for _ in 0..10 {
            let gone = sleeper()?;
            let n = pid_of(&gone);
            let pinned = vec![(n, pidfd_open(n)?, 0)];
            end(gone);
            for _ in 0..20 {
                std::fs::write(
                    "/proc/sys/kernel/ns_last_pid",
                    n.saturating_sub(1).to_string(),
                )?;
                let child = sleeper()?;
                if pid_of(&child) == n {
                    reused = Some((n, pinned, child));
                    break;
                }
                end(child);
            }
            if reused.is_some() {
                break;
            }
        }
        let Some((n, pinned, mut host)) = reused else {
            return Err(io::Error::other(
                "could not give a freed pid to a new process",
            ));
        };
        // The list names n again (now the host's process): the pinned pidfd is the old
        // process's, which is gone, so nothing is signalled.
        std::fs::write(dir.path().join("cgroup.procs"), format!("{n}\n"))?;
        let result = kill_still_listed(dir.path(), &pinned).map(|_| ());
        std::thread::sleep(Duration::from_millis(50));
        let host_alive = host.try_wait()?.is_none();
        end(host);
        result?;
        assert!(host_alive, "the process that took the number was killed");
        Ok(())
    }
}
