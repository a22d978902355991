//! Inside the sandbox: pid 1's part of the security order (`contain_steps`) and the
//! payload's (`payload_steps`), each on one screen, between the clone and `execve`. Only
//! async-signal-safe work happens here in a process that may have had threads.

use std::convert::Infallible;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::unistd::Pid;

use super::super::SandboxSpec;
use super::super::caps;
use super::super::channel::{self, FromSandbox, ToSandbox};
use super::super::init;
use super::super::landlock;
use super::super::mounts;
use super::super::namespaces;
use super::super::net;
use super::super::process;
use super::super::rlimits;
use super::super::spawn::{self, Left};
use super::super::step::{Step, StepResult};
use super::super::tty;
use super::super::userns;
use super::super::wait;
use super::{ChildContext, SETUP_FAILED};

/// Leaves quietly: the supervisor is gone or gave up on this sandbox, so there is no one
/// to report to.
fn supervisor_gone() -> ! {
    // SAFETY: leave without running the supervisor's destructors in this copy of its memory.
    unsafe { libc::_exit(SETUP_FAILED) }
}

/// Waits for the supervisor's go-ahead `msg`; leaves if it never comes.
fn await_supervisor(msg: ToSandbox, chan: &OwnedFd) {
    if ToSandbox::expect(msg, chan).is_err() {
        supervisor_gone()
    }
}

/// The sandbox's pid 1. Never returns: it becomes the reaper or exits.
pub(super) fn contain(ctx: ChildContext<'_>, chan: OwnedFd) -> ! {
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| contain_steps(ctx, &chan)));
    let failed = match result {
        Ok(Err(step)) => step,
        Ok(Ok(never)) => match never {},
        Err(_) => Step::new("internal error", libc::EIO),
    };
    FromSandbox::from(failed).send(&chan);
    // SAFETY: leave without running the supervisor's destructors in this copy of its memory.
    unsafe { libc::_exit(SETUP_FAILED) }
}

/// pid 1's part of the security order, one step a line; the payload's follows in
/// [`payload_steps`].
fn contain_steps(mut ctx: ChildContext<'_>, chan: &OwnedFd) -> Result<Infallible, Step> {
    let spec = ctx.spec;
    // Only what pid 1 and the payload use stays open. A host descriptor left open is a way
    // out (see `process::close_fds_from`); and a launcher holds descriptors for every
    // sandbox it runs, which the payload would otherwise have to close all over again.
    process::close_fds_from(3, &kept_fds(&ctx, chan));
    // Out of the supervisor's process group: what a terminal sends its foreground group
    // (^C's SIGINT, SIGQUIT, SIGWINCH) reaches the sandbox through the supervisor alone,
    // which forwards it (or resizes the sandbox's own terminal). In the group, pid 1 got
    // each one from the kernel too and forwarded it again: a command counting its ^Cs
    // saw two, and one with a terminal of its own saw SIGWINCH before its new size.
    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0)).step("process group")?;
    // Off the host's network before anything else runs (see `namespaces::unshare_net`).
    if spec.namespaces.net {
        namespaces::unshare_net()?;
    }
    // pid 1 shows its own name, not the supervisor's command line and environment (the
    // payload can read /proc/1).
    if let Some(title) = ctx.title {
        title.set("hatchery-init", true);
    }
    if let Some(bits) = ctx.securebits {
        userns::restore_securebits(bits).step("securebits")?;
    }
    // If the supervisor dies from now on, so do we. (Before this point its death shows as
    // end-of-stream on the channel, below.)
    process::die_with_parent().step("parent death signal")?;
    await_supervisor(ToSandbox::IdentityReady, chan);
    userns::assume_identity(&spec.identity).step("identity")?;
    // Changing credentials cleared the parent-death signal: arm it again. A supervisor
    // that died in between sent no signal, and the next read from the channel did not
    // always end us: the go-ahead to join the cgroup may be sent before it dies, and was
    // then read, and the sandbox ran on without it (a killed `run` left its command
    // running). Its end of the channel tells.
    process::die_with_parent().step("parent death signal")?;
    if wait::hung_up_now(chan.as_fd()) {
        supervisor_gone()
    }
    if spec.namespaces.net {
        net::loopback_up().step("loopback")?;
    }
    if let Some(ports) = &spec.egress_ports {
        // Made here, where the payload will look for them, and held outside only.
        let listeners = net::egress_listeners(ports).step("egress listeners")?;
        channel::send_listeners(chan, &listeners).step("hand over the egress listeners")?;
    }
    let limits = userns::KernelObjectLimits::open()?;
    mounts::build_root(&spec.rootfs, &ctx.trees)?;
    // Into the cgroup (the supervisor made it meanwhile) before the payload exists.
    let Ok(join) = channel::recv_cgroup_ready(chan) else {
        supervisor_gone()
    };
    join_cgroup(join)?;
    if ctx.unshare_cgroup {
        namespaces::unshare_cgroup()?;
    }
    // Every namespace and mount of the sandbox's own exists now: no more for anyone in it.
    limits.apply()?;
    if ctx.warm {
        // A prepared sandbox: everything above was done ahead of its worker.
        match super::warm::take_claim(&mut ctx, chan.as_fd()) {
            Err(super::warm::Unclaimed::Dropped) => supervisor_gone(),
            Err(super::warm::Unclaimed::Bad(step)) => return Err(step),
            Ok(()) => {}
        }
    }
    if spec.namespaces.uts {
        nix::unistd::sethostname(&ctx.hostname).step("hostname")?;
    }
    // Block exactly what pid 1 collects with sigwaitinfo, then start from default
    // dispositions (a launcher ignores termination signals). In that order: a signal
    // passed on before the payload exists stays pending for the payload (unblocked with
    // its default action, the kernel would drop it: this is a pid namespace's init).
    init::block_signals();
    process::reset_dispositions();
    // Unreadable by the payload (ptrace, /proc/1/mem, /proc/1/fd) before the payload
    // exists: pid 1 keeps its capabilities in the sandbox until the payload has started.
    caps::not_dumpable().map_err(Step::from)?;
    // Nothing this process or the payload executes can gain a capability: emptied once
    // here, inherited by the payload (pid 1 keeps what it holds until the payload runs).
    caps::drop_bounding_set()
        .map_err(|e| Step::new(format!("capabilities ({})", e.step), e.errno))?;
    // pid 1 waits while the payload sets itself up in pid 1's memory, until its execve
    // (this process is single-threaded: a clone of a single-threaded supervisor).
    match spawn::spawn_sharing_memory(|| payload(&ctx, chan)).step("start the payload")? {
        (child, Left::AtExecve) => reap(child, chan),
        (child, Left::Early) => init::report_early_end(child, chan.as_fd()),
    }
}

/// The supervisor's descriptors pid 1 and the payload use: the channel, the prepared trees
/// and the payload's descriptors.
fn kept_fds(ctx: &ChildContext<'_>, chan: &OwnedFd) -> Vec<RawFd> {
    let mut keep = vec![chan.as_raw_fd()];
    keep.extend_from_slice(&ctx.trees);
    keep.extend(ctx.fds.iter().map(|(source, _)| *source));
    keep
}

/// Moves pid 1 into its cgroup by writing `0` to the files the supervisor opened and sent
/// (where the sandbox was not born inside it).
fn join_cgroup(files: Vec<OwnedFd>) -> Result<(), Step> {
    for fd in files {
        nix::unistd::write(&fd, b"0").step("join the cgroup")?;
    }
    Ok(())
}

/// pid 1 once the payload has started: keeps no privilege it does not need to reap and
/// forward signals.
fn reap(payload: Pid, chan: &OwnedFd) -> ! {
    process::close_fds_from(0, &[chan.as_raw_fd()]);
    let _ = caps::drop_all(None, caps::Bounding::Emptied);
    let _ = caps::no_new_privs();
    init::reap_until_exit(payload, chan.as_fd())
}

/// Why the payload never ran: a set-up step failed, or execve did (with this errno).
enum Stop {
    Setup(Step),
    Exec(i32),
}

impl From<Step> for Stop {
    fn from(step: Step) -> Stop {
        Stop::Setup(step)
    }
}

/// The exit status of a payload that never ran (the command-line contract): 125 when the
/// sandbox could not be set up, 127 when the command was not found, 126 when it was found
/// but could not be run. `exec_errno` is execve's errno, `None` for a set-up failure.
pub(super) fn never_ran_code(exec_errno: Option<i32>) -> i32 {
    match exec_errno {
        None => SETUP_FAILED,
        Some(libc::ENOENT | libc::ENOTDIR) => 127,
        Some(_) => 126,
    }
}

/// The payload process: locks itself down and becomes the user's command.
fn payload(ctx: &ChildContext<'_>, chan: &OwnedFd) -> ! {
    // Where a failure is reported: the channel's number, until the descriptors are
    // installed and it may have been moved out of the way of one passed to the command.
    let report_on = std::cell::Cell::new(chan.as_raw_fd());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        payload_steps(ctx, chan, &report_on)
    }));
    let stop = match result {
        Ok(Err(stop)) => stop,
        Ok(Ok(never)) => match never {},
        Err(_) => Stop::Setup(Step::new("internal error", libc::EIO)),
    };
    let (msg, code) = match stop {
        Stop::Setup(step) => (FromSandbox::from(step), never_ran_code(None)),
        Stop::Exec(errno) => (
            FromSandbox::ExecFailed { errno },
            never_ran_code(Some(errno)),
        ),
    };
    // SAFETY: `report_on` holds the channel's descriptor, open in this process (the
    // original, or where `install_descriptors` moved it); it is only borrowed for the send.
    let report = unsafe { BorrowedFd::borrow_raw(report_on.get()) };
    msg.send(report);
    // SAFETY: leave without running destructors of the memory image we share.
    unsafe { libc::_exit(code) }
}

/// The payload's part of the security order, one step a line, ending in execve.
fn payload_steps(
    ctx: &ChildContext<'_>,
    chan: &OwnedFd,
    report_on: &std::cell::Cell<RawFd>,
) -> Result<Infallible, Stop> {
    let spec = ctx.spec;
    // pid 1 restored every disposition before starting this process: what it blocked for
    // itself is unblocked.
    process::unblock_signals();
    // A new session: no controlling terminal. The caller's terminal is never among the
    // descriptors below (`run` relays it through a pty of the sandbox's own), so TIOCSTI
    // and TIOCSCTTY can reach only the sandbox's own terminal (CVE-2017-5226).
    nix::unistd::setsid().step("setsid")?;
    // Stdio and passed fds at their numbers; nothing else survives exec except the
    // channel (close-on-exec, kept to report an exec failure).
    let moved_chan = process::install_descriptors(&ctx.fds, chan)?;
    report_on.set(moved_chan.as_raw_fd());
    // The filters loaded last (the supervisor compiled them meanwhile), with the start
    // gate: held here alone, open until the execve below is past its point of no return
    // (see `channel::start_gate`). Received after the descriptors are installed, so no
    // target number can close it early, and before the rlimits, so a small `nofile`
    // cannot refuse it.
    let (floor, filter, _gate) = match channel::recv_filters(moved_chan) {
        Ok(received) => received,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => supervisor_gone(),
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            return Err(Step::new("receive the filters", errno).into());
        }
    };
    if spec.controlling_terminal {
        // The sandbox's own pty on fd 0: ^C and ^Z typed at the caller's keyboard become
        // signals here, and job control works inside, as under `docker run -it`.
        tty::take_controlling_terminal(0).step("controlling terminal")?;
    }
    nix::unistd::chdir(&spec.cwd)
        .step("working directory")
        .map_err(|s| s.with_detail(spec.cwd.display().to_string()))?;
    rlimits::apply(&spec.rlimits)
        .and_then(|()| rlimits::apply(&ctx.fallback_rlimits))
        .map_err(|(name, e)| Step::new(format!("rlimit {name}"), e as i32))?;
    caps::drop_all(Some(ctx.payload_ids), caps::Bounding::Emptied)
        .map_err(|e| Step::new(format!("capabilities ({})", e.step), e.errno))?;
    caps::no_new_privs().map_err(Step::from)?;
    // After the last credential change (which would clear it): die with pid 1.
    process::die_with_parent().step("parent death signal")?;
    if ctx.landlock {
        restrict_filesystem(spec, moved_chan)?;
    }
    // The floor first: the profile's filter may not allow seccomp(2) itself.
    floor.load().step("seccomp (floor)")?;
    // Last: from here on every syscall, execve included, goes through the filter.
    filter.load().step("seccomp")?;
    Err(Stop::Exec(process::exec(
        &ctx.argv,
        &ctx.env,
        &ctx.path_var,
    )))
}

/// Applies Landlock and tells the supervisor what the kernel enforced; a kernel that
/// enforces nothing fails the run unless degraded runs are allowed.
fn restrict_filesystem(spec: &SandboxSpec, chan: BorrowedFd<'_>) -> Result<(), Step> {
    let outcome = landlock::restrict(&spec.landlock)
        .map_err(|detail| Step::new("landlock", libc::EPERM).with_detail(detail))?;
    if outcome.status == "not_enforced" && !spec.allow_degraded {
        return Err(Step::new(
            "landlock (not enforced by this kernel)",
            libc::ENOSYS,
        ));
    }
    FromSandbox::Landlock {
        abi: outcome.abi,
        status: outcome.status.to_string(),
    }
    .send(chan);
    Ok(())
}
