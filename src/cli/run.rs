//! `hatchery run`: one command in a new sandbox, supervised until it ends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{SigSet, SigmaskHow};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use hatchery::paths::{OutputTarget, absolutize};
use hatchery::profile::Profile;
use hatchery::report::{LimitsRequested, Report};
use hatchery::sandbox::cgroup::{Limits, unique_name};
use hatchery::sandbox::{self, Host, RunRequest, SandboxError, spec};
use hatchery::units;

mod exposure;
pub(super) mod quick;
mod stdio;
mod usage;
use exposure::{command_hint, exposures, warn_unseen};
use stdio::plan_stdio;
pub use usage::on_usage_error;

const RUN_EXAMPLES: &str = "\
Exit status: the command's own; 128+N if killed by signal N; 137 OOM kill; 124 timeout;
2 bad command line or input (nothing started); 125 the sandbox could not be set up;
126 not executable; 127 not found.

Paths (--ro, --rw, --allow-exec, --cwd) may be relative: they are taken from the current
directory. The command starts in the current directory when it is exposed (--ro-cwd), else in /.

Examples:
  hatchery run -- sh -c 'id; hostname; ls /'
  hatchery run --memory 256M --timeout 1m30s --ro-cwd --rw ./workspace -- python3 agent.py
  hatchery run --profile strict --report out.json -- python3 -c 'print(1)'
  hatchery run --max-output 64K --timeout 10s -- sh -c 'yes'
  hatchery run --allow-exec /usr/bin/python3.11 --ro \"$PWD/agent.py\" -- python3 \"$PWD/agent.py\"";

#[derive(Args, Debug)]
#[command(after_help = RUN_EXAMPLES)]
pub struct RunArgs {
    /// Memory limit (64M, 1G); swap off; an OOM kill exits 137
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = units::parse_memory)]
    pub memory: Option<u64>,
    /// CPU quota in cores (0.5)
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = units::parse_cpus)]
    pub cpus: Option<f64>,
    /// Maximum number of tasks (processes + threads)
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = units::parse_pids)]
    pub pids: Option<u64>,
    /// Wall-clock limit (500ms, 5s, 1m30s); kills everything in the sandbox; exit 124
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = units::parse_duration)]
    pub timeout: Option<Duration>,
    /// Cap on the command's output, stdout and stderr together (64K, 1M). At the cap the
    /// output pipes close: further writes fail with EPIPE (SIGPIPE), the report says
    /// output_truncated
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = units::parse_output_cap)]
    pub max_output: Option<u64>,
    #[command(flatten)]
    pub egress: super::egress::EgressArgs,
    /// Expose a host path read-only at the same path (repeatable; a relative path is taken
    /// from the current directory)
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<PathBuf>,
    /// Expose a host path read-write at the same path (repeatable; a relative path is taken
    /// from the current directory). Host system directories (/usr, /etc, /boot, ...) are
    /// refused without --allow-system-rw
    #[arg(long = "rw", value_name = "PATH")]
    pub rw: Vec<PathBuf>,
    /// Expose the current directory read-only, and start the command there
    #[arg(long)]
    pub ro_cwd: bool,
    /// Allow --rw on a host system directory (/usr, /etc, /boot, /var/lib, ...): the
    /// sandbox could then change the host's own programs and configuration
    #[arg(long)]
    pub allow_system_rw: bool,
    /// Allow executing this file, and no other (repeatable): an executable allowlist
    /// enforced by Landlock. Real paths only (/usr/bin/python3.11, not the python3 link);
    /// the dynamic loader is added, a script's interpreter must be listed too
    #[arg(long = "allow-exec", value_name = "PATH")]
    pub allow_exec: Vec<PathBuf>,
    /// Working directory inside (default: the current directory if exposed, else /; a
    /// relative path is taken from the current directory)
    #[arg(long, value_name = "PATH")]
    pub cwd: Option<PathBuf>,
    /// Extra environment variable (the environment is otherwise minimal; repeatable);
    /// `KEY` alone passes this shell's value of KEY (not set here: not set there)
    #[arg(long = "env", value_name = "KEY[=VALUE]")]
    pub env: Vec<String>,
    /// Security profile: a shipped name or a TOML file
    #[arg(long, value_name = "NAME|FILE", default_value = "default")]
    pub profile: String,
    /// Write a JSON report here after the command ends (`-`: standard output); written
    /// for a refused run too, with the refusal in `error`
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Run even where a requested limit cannot be enforced here (the report says what was not)
    #[arg(long)]
    pub allow_degraded: bool,
    /// Host uid[:gid] the sandbox runs as (root only; default: one leased for this sandbox)
    #[arg(long, value_name = "UID[:GID]", value_parser = parse_host_ids)]
    pub host_uid: Option<(u32, u32)>,
    /// Hostname inside the sandbox (RFC 1123: 1 to 64 letters, digits, '-' and '.')
    #[arg(long, default_value = "hatchery", value_parser = parse_hostname)]
    pub hostname: String,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

fn parse_hostname(s: &str) -> Result<String, String> {
    spec::check_rfc1123_hostname(s)
        .map(|()| s.to_string())
        .map_err(|e| e.to_string())
}

fn parse_host_ids(s: &str) -> Result<(u32, u32), String> {
    let (u, g) = s.split_once(':').unwrap_or((s, s));
    let u: u32 = u
        .parse()
        .map_err(|_| format!("{s:?}: expected UID or UID:GID"))?;
    let g: u32 = g
        .parse()
        .map_err(|_| format!("{s:?}: expected UID or UID:GID"))?;
    if u == 0 || g == 0 {
        return Err("the sandbox must not be root on the host (uid/gid 0)".into());
    }
    Ok((u, g))
}

/// Blocks the signals `run` forwards and returns a signalfd that delivers them.
fn forwarded_signals() -> Option<SignalFd> {
    let mut set = SigSet::empty();
    for s in sandbox::init::FORWARDED {
        set.add(s);
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None).ok()?;
    SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC).ok()
}

pub fn main(args: RunArgs) -> i32 {
    let command = args.command.clone();
    let profile_name = args.profile.clone();
    let limits = || LimitsRequested {
        memory_bytes: args.memory,
        cpus: args.cpus,
        pids: args.pids,
        timeout_ms: args.timeout.map(|t| t.as_millis()),
        max_output_bytes: args.max_output,
    };
    // The report's directory is opened before anything runs: a path that cannot take the
    // report is refused now, and the sandbox cannot redirect where the report goes later.
    let report = match args
        .report
        .as_deref()
        .map(OutputTarget::prepare)
        .transpose()
    {
        Ok(t) => t,
        Err(e) => {
            error_line!(
                "--report {}: {e}; name a file in a directory that exists and that you may write (or - for standard output); nothing was run",
                args.report.as_deref().unwrap_or(Path::new("")).display()
            );
            return super::exit::USAGE;
        }
    };
    let requested = limits();
    // hatchery's own lines are off the loop that enforces the timeout from here until the
    // report is written (see `logging::off_loop`): a stderr that takes nothing holds
    // neither the sandbox nor its report, only hatchery's exit.
    let lines = super::logging::off_loop();
    let (code, report_body) = match run(args, report.is_some()) {
        Ok(Ran {
            outcome,
            enforcement,
            hint,
            egress,
        }) => {
            tell_outcome(&outcome, &enforcement, hint, &command);
            if let Some(Err(why)) = &egress {
                error_line!(
                    "warning: {why}; what went out through it is not recorded (the report's egress_error)"
                );
            }
            let code = outcome.exit_code;
            let report = Report::new(&outcome, enforcement, command, requested).with_egress(egress);
            (code, report)
        }
        Err(e) => {
            super::logging::error_line(&e.to_string());
            let code = super::sandbox_exit_code(&e);
            let mut report =
                Report::refused(e.to_string(), code, command, requested, &profile_name);
            // Ended by a signal before anything started: the report says which, as for a
            // start the signal stopped later.
            report.signal = e.stopped_by();
            (code, report)
        }
    };
    // A report file is written before hatchery's lines are; one to stdout, stderr or a
    // terminal, where a person reads both, after them, whole (a line must not split it).
    let lines = match report {
        Some(OutputTarget::File { .. }) => Some(lines),
        _ => {
            drop(lines);
            None
        }
    };
    let written = report.map(|target| report_body.write(&target).map_err(|e| (target, e)));
    drop(lines);
    if let Some(Err((target, e))) = written {
        // Never leave the caller believing a report exists (or that a file someone else
        // put there is hatchery's).
        error_line!(
            "cannot write the report {}: {e} (the command's exit status was {code})",
            target.describe()
        );
        return super::exit::SETUP;
    }
    code
}

/// Tells the caller, on stderr, why a run that started did not end as the command would
/// have: a failure to start it (with `hint`), the timeout, the OOM killer, the output
/// cap, and a cleanup that did not finish.
fn tell_outcome(
    outcome: &sandbox::Outcome,
    enforcement: &sandbox::Enforcement,
    hint: Option<String>,
    command: &[String],
) {
    let hint = hint.map(|h| format!("; {h}")).unwrap_or_default();
    if let Some(f) = &outcome.failure {
        match f {
            sandbox::Failure::Exec { errno } => {
                let allowlist = if *errno == libc::EACCES && enforcement.exec_allowlist.is_some() {
                    " (an executable allowlist is in force: only the files in the report's enforcement.exec_allowlist may run)"
                } else {
                    ""
                };
                error_line!(
                    "cannot execute {}: {f}{allowlist}{hint}",
                    command.first().map(String::as_str).unwrap_or("")
                );
            }
            sandbox::Failure::Setup { .. } | sandbox::Failure::Crashed { .. } => {
                error_line!("{f}{hint}")
            }
        }
    } else if outcome.timed_out {
        error_line!("timed out; the sandbox was killed");
    } else if outcome.oom_killed {
        error_line!("out of memory; the sandbox was killed by the OOM killer");
    }
    if let Some(o) = outcome.output.filter(|o| o.truncated) {
        let how = if o.pty {
            "the sandbox's terminal was hung up (SIGHUP, then EIO on every write; EPIPE on a pipe)"
        } else {
            "later writes failed with EPIPE"
        };
        error_line!(
            "output cut at {} bytes (--max-output); {how}",
            o.cap.unwrap_or(o.bytes)
        );
    }
    if let Some(why) = outcome.output.and_then(|o| o.write_error()) {
        error_line!("warning: {why} (the report's output_error)");
    }
    if let Some(err) = &outcome.cleanup_error {
        error_line!("warning: cleanup incomplete: {err}");
    }
}

/// Checks `--allow-exec` files on the host, so that a mistake is reported with the flag
/// that made it. A relative path is taken from the current directory.
fn allowed_executables(paths: &[PathBuf]) -> Result<Vec<PathBuf>, SandboxError> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in paths {
        let host = absolutize(p)
            .and_then(|abs| sandbox::exec::check_exec_path(&abs))
            .map_err(|e| SandboxError::Invalid(format!("--allow-exec {e}")))?;
        if out.contains(&host.path) {
            return Err(SandboxError::Invalid(format!(
                "--allow-exec {} is given twice",
                host.path.display()
            )));
        }
        out.push(host.path);
    }
    Ok(out)
}

/// `--env` arguments as docker reads them: `KEY=VALUE`, or a bare `KEY` for this
/// process's value, left out (with a note) where it has none. Shared by `run` and `spawn`.
pub fn env_args(args: &[String]) -> Result<Vec<(String, String)>, SandboxError> {
    let mut env = Vec::new();
    for arg in args {
        match spec::parse_env_arg(arg, |k| std::env::var_os(k))? {
            Some(kv) => env.push(kv),
            None => {
                error_line!("note: --env {arg}: not set here, so not set in the sandbox either")
            }
        }
    }
    Ok(env)
}

/// A run that started, how it ended, and what to tell the caller about a failure.
struct Ran {
    outcome: sandbox::Outcome,
    enforcement: sandbox::Enforcement,
    /// What the egress broker recorded (or why that is lost), when there was one.
    egress: Option<Result<hatchery::broker::Summary, String>>,
    /// What to do about a failure that looks like a path not exposed.
    hint: Option<String>,
}

/// The number of CPUs online here, when it can be told.
fn host_cpus() -> Option<u64> {
    nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN)
        .ok()
        .flatten()
        .and_then(|n| u64::try_from(n).ok())
        .filter(|n| *n > 0)
}

/// What is refused before any profile is read or anything is set up: values that are
/// valid on their own but cannot hold on this host or for this caller.
fn check_request(args: &RunArgs) -> Result<(), SandboxError> {
    if let (Some(cpus), Some(n)) = (args.cpus, host_cpus()) {
        if cpus > n as f64 {
            return Err(SandboxError::Invalid(format!(
                "--cpus {cpus}: exceeds this host's {n} CPUs; ask for at most {n}"
            )));
        }
    }
    if args.host_uid.is_some() && !nix::unistd::geteuid().is_root() {
        return Err(SandboxError::Invalid(
            "--host-uid: only root can choose the sandbox's host identity; without root the sandbox runs as you (drop --host-uid)".into(),
        ));
    }
    Ok(())
}

/// Runs the command as `args` ask: the request is checked, the profile read and narrowed,
/// the spec built (with warnings about what the sandbox will not see), the host's
/// enforcement checked against it, and only then the sandbox started and supervised.
fn run(args: RunArgs, with_report: bool) -> Result<Ran, SandboxError> {
    check_request(&args)?;
    let profile = load_profile(&args)?;
    let env = env_args(&args.env)?;
    let cwd = args
        .cwd
        .as_deref()
        .map(absolutize)
        .transpose()
        .map_err(|e| SandboxError::Invalid(format!("--cwd {e}")))?;
    let exposures = exposures(&args)?;
    let egress = args.egress.plan()?;
    let request = RunRequest {
        command: args.command,
        env,
        cwd: cwd.clone(),
        exposures,
        limits: Limits {
            memory: args.memory,
            cpus: args.cpus,
            pids: args.pids,
        },
        host_ids: args.host_uid,
        hostname: args.hostname,
        allow_degraded: args.allow_degraded,
        cgroup_name: unique_name("run"),
        extra_binds: Vec::new(),
        payload_ids: None,
        egress_ports: egress.as_ref().map(|e| e.ports()),
    };
    let timeout = args.timeout.or(profile
        .default_limits()
        .map_err(|e| SandboxError::Invalid(e.to_string()))?
        .timeout);
    tracing::debug!("building the sandbox's specification");
    let caller_cwd = std::env::current_dir().ok().filter(|p| p.is_absolute());
    let mut spec = spec::build(request, &profile, caller_cwd.as_deref())?;
    warn_unseen(&spec, caller_cwd.as_deref(), cwd.is_none());
    let host = detect_host();
    tracing::debug!("checking that every requested limit and protection can be enforced");
    let plan = sandbox::preflight(&spec, &host, sandbox::Asker::Run)?;
    if let Some(allow) = &plan.exec_allowlist {
        for note in &allow.notes {
            error_line!("note: {note}");
        }
    }
    if args.allow_degraded && !with_report && !plan.not_enforced.is_empty() {
        error_line!(
            "warning: --allow-degraded: not enforced here: {} (--report FILE records what was)",
            plan.not_enforced.join("; ")
        );
    }
    let (outcome, enforcement, egress) =
        supervise(&mut spec, &plan, &host, timeout, args.max_output, egress)?;
    let hint = failure_hint(&outcome, &spec, cwd);
    Ok(Ran {
        outcome,
        enforcement,
        hint,
        egress,
    })
}

/// The profile `--profile` names, narrowed to the `--allow-exec` files.
fn load_profile(args: &RunArgs) -> Result<Profile, SandboxError> {
    tracing::debug!(profile = %args.profile, "loading the profile");
    let mut profile =
        Profile::resolve(&args.profile).map_err(|e| SandboxError::Invalid(e.to_string()))?;
    profile
        .narrow_exec(&allowed_executables(&args.allow_exec)?)
        .map_err(|e| SandboxError::Invalid(format!("--allow-exec: {e}")))?;
    args.egress.choose_network(&mut profile)?;
    Ok(profile)
}

/// What this host can enforce.
fn detect_host() -> Host {
    let host = Host::detect();
    tracing::debug!(
        cgroups = host.cgroups.is_some(),
        cgroup_problem = host.cgroup_problem.as_deref().unwrap_or(""),
        landlock_abi = host.landlock_abi,
        seccomp = host.seccomp,
        "detected what this host can enforce"
    );
    host
}

/// Removes cgroups left by hatchery processes that no longer exist: done while the
/// sandbox runs, not before it starts (nothing about starting depends on it). A dead
/// run's sandbox still dying is waited for only by a run whose own deadline, if any, is
/// well past the sweep's budget: the sweep comes before the supervisor watches the
/// deadline, and must not make it late.
fn sweep_stale_cgroups(host: &Host, timeout: Option<Duration>) {
    let wait = timeout.is_none_or(|t| t > sandbox::cgroup::SWEEP_BUDGET + SWEEP_MARGIN);
    if let Some(m) = &host.cgroups {
        for stale in m.sweep_stale(wait) {
            tracing::info!(path = %stale.display(), "removed a cgroup left by a hatchery process that no longer exists");
        }
    }
}

/// How far before a run's deadline the sweep of stale cgroups must be done waiting.
const SWEEP_MARGIN: Duration = Duration::from_secs(1);

/// How a supervised sandbox ended, what was enforced, and what its broker recorded.
type Supervised = (
    sandbox::Outcome,
    sandbox::Enforcement,
    Option<Result<hatchery::broker::Summary, String>>,
);

/// Starts the sandbox with stdin, stdout and stderr relayed as planned, and waits for it
/// to end (forwarding signals, within `timeout`). The caller's terminal is in raw mode
/// only meanwhile: it gets its modes back before this returns.
fn supervise(
    spec: &mut sandbox::SandboxSpec,
    plan: &sandbox::Plan,
    host: &Host,
    timeout: Option<Duration>,
    max_output: Option<u64>,
    egress: Option<super::egress::EgressPlan>,
) -> Result<Supervised, SandboxError> {
    // From here until `run` returns, a terminal on stdin is in raw mode (`stdio.raw`).
    tracing::debug!("planning stdin, stdout and stderr");
    let mut stdio = plan_stdio(max_output).map_err(|e| {
        SandboxError::Internal(format!(
            "cannot set up the relay of stdin, stdout and stderr: {e}"
        ))
    })?;
    spec.stdio = stdio.fds.take();
    spec.controlling_terminal = stdio.controlling_terminal;
    let signals = forwarded_signals();
    let started = sandbox::start(spec, plan, host.cgroups.as_deref()).and_then(|mut sb| {
        // The broker, forked while this process is still single-threaded, holds the
        // sandbox's listeners from here on.
        let broker = egress.map(|e| e.start(&mut sb)).transpose()?;
        // The relay's thread, once nothing more is forked (a sandbox dropped on an error
        // here is killed and its cgroup removed).
        let relay = stdio
            .pump
            .take()
            .map(|pump| sb.relay(pump, timeout))
            .transpose()?;
        super::logging::stream_off_loop();
        Ok((sb, broker, relay))
    });
    let result = started.map(|(sb, broker, relay)| {
        tracing::debug!(
            pid = sb.pid(),
            "the sandbox is running; waiting for it to end"
        );
        // Only the sandbox may hold the pipes' write ends and the pty's replica, or they
        // never reach end-of-file.
        spec.stdio = None;
        let mut enforcement = sb.enforcement.clone();
        enforcement.stdio = Some(stdio.report.clone());
        sweep_stale_cgroups(host, timeout);
        let outcome = sb.wait(timeout, signals.as_ref(), relay);
        // The sandbox is gone: its connections go with the broker.
        let egress = broker.and_then(super::egress::RunningBroker::stop);
        (outcome, enforcement, egress)
    });
    if let Some(m) = &host.cgroups {
        m.release();
    }
    // The caller's terminal is given back its modes, and its descriptors their flags,
    // before anything more is printed (a report to a stdout left non-blocking by the
    // command would fail with EAGAIN).
    drop(stdio.raw.take());
    stdio.give_back_flags();
    result
}

/// What to do about a failure that looks like a path not exposed: a command, or the
/// `--cwd`, that exists on the host but not in the sandbox.
fn failure_hint(
    outcome: &sandbox::Outcome,
    spec: &sandbox::SandboxSpec,
    cwd: Option<PathBuf>,
) -> Option<String> {
    match &outcome.failure {
        Some(sandbox::Failure::Exec { errno }) if *errno == libc::ENOENT => {
            command_hint(spec, std::env::var_os("PATH").as_deref())
        }
        Some(sandbox::Failure::Setup { errno, step, .. })
            if *errno == libc::ENOENT && step == "working directory" =>
        {
            cwd.filter(|c| c.exists()).map(|c| {
                format!(
                    "--cwd {} exists on the host but is not exposed in the sandbox: add --ro {} (or --rw)",
                    c.display(),
                    c.display()
                )
            })
        }
        _ => None,
    }
}
