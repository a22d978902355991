//! `hatchery run`: one command in a new sandbox, supervised until it ends.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use nix::fcntl::{FcntlArg, fcntl};
use nix::sys::signal::{SigSet, SigmaskHow};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use hatchery::paths::{OutputTarget, check_host_path};
use hatchery::profile::Profile;
use hatchery::report::{LimitsRequested, Report};
use hatchery::sandbox::cgroup::{Limits, unique_name};
use hatchery::sandbox::output::OutputPump;
use hatchery::sandbox::{
    self, Exposure, Host, RunRequest, SandboxError, StdioEnforcement, spec, tty,
};
use hatchery::units;

/// Exit status when the sandbox could not be set up.
pub const EXIT_SETUP: i32 = 125;

const RUN_EXAMPLES: &str = "\
Exit status: the command's own; 128+N if killed by signal N; 137 OOM kill; 124 timeout;
125 the sandbox could not be set up; 126 not executable; 127 not found; 2 bad usage or
input (found before anything starts).

Examples:
  hatchery run -- sh -c 'id; hostname; ls /'
  hatchery run --memory 256M --cpus 0.5 --pids 64 --timeout 30s --rw \"$PWD/workspace\" -- python3 agent.py
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
    /// Wall-clock limit (500ms, 5s, 1m); kills everything in the sandbox; exit 124
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = units::parse_duration)]
    pub timeout: Option<Duration>,
    /// Cap on the command's output, stdout and stderr together (64K, 1M). At the cap the
    /// output pipes close: further writes fail with EPIPE (SIGPIPE), the report says
    /// output_truncated
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = units::parse_output_cap)]
    pub max_output: Option<u64>,
    /// Expose a host path read-only at the same path (repeatable)
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<PathBuf>,
    /// Expose a host path read-write at the same path (repeatable)
    #[arg(long = "rw", value_name = "PATH")]
    pub rw: Vec<PathBuf>,
    /// Allow executing this file, and no other (repeatable): an executable allowlist
    /// enforced by Landlock. Real paths only (/usr/bin/python3.11, not the python3 link);
    /// the dynamic loader is added, a script's interpreter must be listed too
    #[arg(long = "allow-exec", value_name = "PATH")]
    pub allow_exec: Vec<PathBuf>,
    /// Working directory inside (default: the current directory if exposed, else /)
    #[arg(long, value_name = "PATH")]
    pub cwd: Option<PathBuf>,
    /// Extra environment variable (the environment is otherwise minimal; repeatable)
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Security profile: a shipped name or a TOML file
    #[arg(long, value_name = "NAME|FILE", default_value = "default")]
    pub profile: String,
    /// Write a JSON report here after the command ends
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Run even where a requested limit cannot be enforced here (the report says what was not)
    #[arg(long)]
    pub allow_degraded: bool,
    /// Host uid[:gid] the sandbox runs as when hatchery runs as root (default 65534:65534)
    #[arg(long, value_name = "UID[:GID]", value_parser = parse_host_ids)]
    pub host_uid: Option<(u32, u32)>,
    /// Hostname inside the sandbox (1 to 64 letters, digits, '-' or '.')
    #[arg(long, default_value = "hatchery", value_parser = parse_hostname)]
    pub hostname: String,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

fn parse_hostname(s: &str) -> Result<String, String> {
    spec::check_hostname(s)
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

/// Resolves `--ro`/`--rw` paths: relative paths are refused (say what you mean), as are
/// `..`, symlinks and missing paths.
fn exposures(ro: &[PathBuf], rw: &[PathBuf]) -> Result<Vec<Exposure>, SandboxError> {
    let mut out = Vec::new();
    for (paths, writable) in [(ro, false), (rw, true)] {
        for p in paths {
            let flag = if writable { "--rw" } else { "--ro" };
            let host =
                check_host_path(p).map_err(|e| SandboxError::Invalid(format!("{flag} {e}")))?;
            out.push(Exposure { host, writable });
        }
    }
    Ok(out)
}

/// One of the caller's standard descriptors, as found.
struct CallerFd {
    /// A duplicate; `None` when the descriptor is closed.
    fd: Option<OwnedFd>,
    /// `S_IFMT` bits.
    kind: u32,
    rdev: u64,
    /// Opened for reading only, and not a socket (a socket is always both ways).
    read_only: bool,
    terminal: bool,
}

impl CallerFd {
    fn inspect(fd: BorrowedFd<'_>) -> CallerFd {
        let closed = CallerFd {
            fd: None,
            kind: 0,
            rdev: 0,
            read_only: true,
            terminal: false,
        };
        let Ok(st) = nix::sys::stat::fstat(fd) else {
            return closed;
        };
        let Ok(fd) = fd.try_clone_to_owned() else {
            return closed;
        };
        let kind = st.st_mode & libc::S_IFMT;
        let read_only = kind != libc::S_IFSOCK
            && fcntl(&fd, FcntlArg::F_GETFL).is_ok_and(|f| f & libc::O_ACCMODE == libc::O_RDONLY);
        CallerFd {
            terminal: tty::is_terminal(fd.as_fd()),
            fd: Some(fd),
            kind,
            rdev: st.st_rdev,
            read_only,
        }
    }

    fn is_dev_null(&self) -> bool {
        self.kind == libc::S_IFCHR && self.rdev == libc::makedev(1, 3)
    }

    /// What it is, for the report.
    fn what(&self) -> &'static str {
        match self.kind {
            _ if self.fd.is_none() => "closed",
            _ if self.terminal => "terminal",
            _ if self.is_dev_null() => "/dev/null",
            libc::S_IFREG => "file",
            libc::S_IFIFO => "pipe",
            libc::S_IFSOCK => "socket",
            libc::S_IFCHR => "character device",
            libc::S_IFDIR => "directory",
            _ => "descriptor",
        }
    }

    /// How it is open, for a stdin that is not passed: "read-write file".
    fn access(&self) -> String {
        let access = match &self.fd {
            Some(fd) if self.kind != libc::S_IFSOCK => {
                match fcntl(fd, FcntlArg::F_GETFL).map(|f| f & libc::O_ACCMODE) {
                    Ok(libc::O_WRONLY) => "write-only ",
                    _ => "read-write ",
                }
            }
            _ => "",
        };
        format!("{access}{}", self.what())
    }
}

/// What the payload gets for stdin, stdout and stderr, and what relays them.
struct StdioPlan {
    /// `None`: the caller's own descriptors, inherited (nothing to relay).
    fds: Option<[OwnedFd; 3]>,
    pump: Option<OutputPump>,
    /// The caller's terminal in raw mode while a pty relays it; dropping it restores it.
    raw: Option<tty::RawMode>,
    controlling_terminal: bool,
    report: StdioEnforcement,
}

fn dev_null(write: bool) -> std::io::Result<OwnedFd> {
    Ok(OwnedFd::from(
        std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .open("/dev/null")?,
    ))
}

/// Decides what the payload gets instead of the caller's stdin, stdout and stderr. The
/// sandbox never holds a descriptor of the caller's terminal (CVE-2017-5226: TIOCSTI
/// types into it; writes to it pass no cap), nor any descriptor through which it could
/// write to the caller but its own stdout and stderr:
///
/// - stdin a terminal: a new pty of the sandbox's own, relayed both ways, with the
///   caller's terminal in raw mode (in a background job: output only, modes untouched); it
///   is the payload's stdout and stderr too where those are the same terminal, and its
///   controlling terminal;
/// - stdin open for writing (read-write or write-only file, socket, read-write pipe or
///   device): a pipe the supervisor feeds. A read-write `/dev/null` (what service
///   managers give) is opened again read-only instead: it has no state to differ in.
///   Other files are not reopened: a new open file description would have an offset of
///   its own, and a socket cannot be reopened;
/// - stdout or stderr a terminal (another one, or stdin is not one): a pipe to it;
/// - with `--max-output`, stdout and stderr not relayed otherwise: pipes, counted.
///
/// Everything else — a read-only stdin (file, pipe, `/dev/null`), stdout and stderr
/// without a cap — is passed as it is, at no cost.
fn plan_stdio(cap: Option<u64>) -> std::io::Result<StdioPlan> {
    let [stdin, stdout, stderr] = [
        CallerFd::inspect(std::io::stdin().as_fd()),
        CallerFd::inspect(std::io::stdout().as_fd()),
        CallerFd::inspect(std::io::stderr().as_fd()),
    ];
    let stdin_passed = !stdin.terminal && stdin.read_only;
    let outs_passed = cap.is_none() && !stdout.terminal && !stderr.terminal;
    let passed = |c: &CallerFd| match c.fd {
        Some(_) => format!("passed ({})", c.what()),
        None => "closed (the command gets /dev/null)".to_string(),
    };
    let passed_stdin = |c: &CallerFd| match c.what() {
        w @ ("file" | "character device") => format!("passed (read-only {w})"),
        _ => passed(c),
    };
    if stdin_passed && outs_passed {
        return Ok(StdioPlan {
            fds: None,
            pump: None,
            raw: None,
            controlling_terminal: false,
            report: StdioEnforcement {
                stdin: passed_stdin(&stdin),
                stdout: passed(&stdout),
                stderr: passed(&stderr),
            },
        });
    }
    let mut pump = OutputPump::with_cap(cap);
    let mut raw = None;
    let mut replica = None;
    let (stdin_fd, stdin_report) = match stdin.fd.as_ref() {
        None => (dev_null(false)?, passed(&stdin)),
        Some(fd) if stdin.terminal => {
            // A background job (`hatchery run ... &`) must neither change the terminal's
            // modes nor read it: the kernel would stop it (SIGTTOU, SIGTTIN), and a
            // stopped supervisor enforces no timeout. It gives the sandbox its terminal
            // all the same, without input.
            let foreground =
                nix::unistd::tcgetpgrp(fd).map_or(true, |group| group == nix::unistd::getpgrp());
            let no_terminal = |e: std::io::Error| {
                std::io::Error::other(format!(
                    "stdin is a terminal, and the sandbox gets a terminal of its own instead, which failed: {e}; redirect stdin (< /dev/null) to run without one"
                ))
            };
            let r = if foreground {
                let mode = tty::RawMode::enter(fd.as_fd()).map_err(no_terminal)?;
                let r = pump.add_terminal(fd.as_fd(), mode.saved(), true);
                raw = Some(mode);
                r
            } else {
                let modes = nix::sys::termios::tcgetattr(fd).map_err(std::io::Error::from);
                modes.and_then(|m| pump.add_terminal(fd.as_fd(), &m, false))
            }
            .map_err(no_terminal)?;
            let own = r.try_clone()?;
            replica = Some(r);
            let how = if foreground {
                "pty relay"
            } else {
                "pty relay (background job: output only)"
            };
            (own, how.to_string())
        }
        Some(fd) if stdin.read_only => (fd.try_clone()?, passed_stdin(&stdin)),
        Some(_) if stdin.is_dev_null() => (
            dev_null(false)?,
            "passed (/dev/null, opened again read-only)".to_string(),
        ),
        Some(fd) => (
            pump.add_input(fd.try_clone()?)?,
            format!("pipe relay ({})", stdin.access()),
        ),
    };
    let mut out = |c: &CallerFd| -> std::io::Result<(OwnedFd, String)> {
        match (c.fd.as_ref(), replica.as_ref()) {
            (None, _) => Ok((dev_null(true)?, passed(c))),
            (Some(_), Some(r)) if c.terminal && c.kind == stdin.kind && c.rdev == stdin.rdev => {
                Ok((r.try_clone()?, "pty relay".to_string()))
            }
            (Some(fd), _) if c.terminal => Ok((
                pump.add_output(fd.try_clone()?)?,
                "pipe relay (terminal)".to_string(),
            )),
            (Some(fd), _) if cap.is_some() => Ok((
                pump.add_output(fd.try_clone()?)?,
                "pipe relay (--max-output)".to_string(),
            )),
            (Some(fd), _) => Ok((fd.try_clone()?, passed(c))),
        }
    };
    let (stdout_fd, stdout_report) = out(&stdout)?;
    let (stderr_fd, stderr_report) = out(&stderr)?;
    Ok(StdioPlan {
        fds: Some([stdin_fd, stdout_fd, stderr_fd]),
        controlling_terminal: replica.is_some(),
        pump: if pump.is_empty() { None } else { Some(pump) },
        raw,
        report: StdioEnforcement {
            stdin: stdin_report,
            stdout: stdout_report,
            stderr: stderr_report,
        },
    })
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
                "--report {}: {e}; nothing was run",
                args.report.as_deref().unwrap_or(Path::new("")).display()
            );
            return EXIT_SETUP;
        }
    };
    let requested = limits();
    let (code, report_body) = match run(args) {
        Ok((outcome, enforcement)) => {
            if let Some(f) = &outcome.failure {
                match f {
                    sandbox::Failure::Exec { errno } => {
                        let hint = if *errno == libc::EACCES && enforcement.exec_allowlist.is_some()
                        {
                            " (an executable allowlist is in force: only the files in the report's enforcement.exec_allowlist may run)"
                        } else {
                            ""
                        };
                        error_line!(
                            "cannot execute {}: {f}{hint}",
                            command.first().map(String::as_str).unwrap_or("")
                        );
                    }
                    sandbox::Failure::Setup { .. } => error_line!("{f}"),
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
            if let Some(err) = &outcome.cleanup_error {
                error_line!("warning: cleanup incomplete: {err}");
            }
            let code = outcome.exit_code;
            (code, Report::new(&outcome, enforcement, command, requested))
        }
        Err(e) => {
            super::logging::error_line(&e.to_string());
            let code = super::sandbox_exit_code(&e);
            let mut report = Report::refused(e.to_string(), command, requested, &profile_name);
            report.exit_code = code;
            (code, report)
        }
    };
    if let Some(target) = report {
        if let Err(e) = report_body.write(&target) {
            // Never leave the caller believing a report exists (or that a file someone
            // else put there is hatchery's).
            error_line!(
                "cannot write the report {}: {e} (the command's exit status was {code})",
                target.describe()
            );
            return EXIT_SETUP;
        }
    }
    code
}

/// Checks `--allow-exec` files on the host, so that a mistake is reported with the flag
/// that made it.
fn allowed_executables(paths: &[PathBuf]) -> Result<Vec<PathBuf>, SandboxError> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in paths {
        let host = sandbox::exec::check_exec_path(p)
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

fn run(args: RunArgs) -> Result<(sandbox::Outcome, sandbox::Enforcement), SandboxError> {
    tracing::debug!(profile = %args.profile, "loading the profile");
    let mut profile =
        Profile::resolve(&args.profile).map_err(|e| SandboxError::Invalid(e.to_string()))?;
    profile
        .narrow_exec(&allowed_executables(&args.allow_exec)?)
        .map_err(|e| SandboxError::Invalid(format!("--allow-exec: {e}")))?;
    let env = args
        .env
        .iter()
        .map(|a| spec::parse_env(a))
        .collect::<Result<Vec<_>, _>>()?;
    let request = RunRequest {
        command: args.command,
        env,
        cwd: args.cwd,
        exposures: exposures(&args.ro, &args.rw)?,
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
    };
    let timeout = args.timeout.or(profile
        .default_limits()
        .map_err(|e| SandboxError::Invalid(e.to_string()))?
        .timeout);
    tracing::debug!("building the sandbox's specification");
    let caller_cwd = std::env::current_dir().ok();
    let mut spec = spec::build(
        request,
        &profile,
        caller_cwd
            .as_deref()
            .filter(|p| p.is_absolute())
            .map(Path::new),
    )?;
    let host = Host::detect();
    tracing::debug!(
        cgroups = host.cgroups.is_some(),
        cgroup_problem = host.cgroup_problem.as_deref().unwrap_or(""),
        landlock_abi = host.landlock_abi,
        seccomp = host.seccomp,
        "detected what this host can enforce"
    );
    if let Some(m) = &host.cgroups {
        for stale in m.sweep_stale() {
            tracing::info!(path = %stale.display(), "removed a cgroup left by a hatchery process that no longer exists");
        }
    }
    tracing::debug!("checking that every requested limit and protection can be enforced");
    let mut enforcement = sandbox::preflight(&spec, &host)?;
    if let Some(allow) = &enforcement.exec_allowlist {
        for note in &allow.notes {
            error_line!("note: {note}");
        }
    }
    // From here until `run` returns, a terminal on stdin is in raw mode (`plan.raw`).
    tracing::debug!("planning stdin, stdout and stderr");
    let mut plan = plan_stdio(args.max_output).map_err(|e| {
        SandboxError::Internal(format!(
            "cannot set up the relay of stdin, stdout and stderr: {e}"
        ))
    })?;
    spec.stdio = plan.fds.take();
    spec.controlling_terminal = plan.controlling_terminal;
    enforcement.stdio = Some(plan.report.clone());
    let signals = forwarded_signals();
    let result = sandbox::start(&spec, enforcement, host.cgroups.as_deref()).map(|sb| {
        tracing::debug!(
            pid = sb.pid(),
            "the sandbox is running; waiting for it to end"
        );
        // Only the sandbox may hold the pipes' write ends and the pty's replica, or they
        // never reach end-of-file.
        spec.stdio = None;
        let enforcement = sb.enforcement.clone();
        (
            sb.wait(timeout, signals.as_ref(), plan.pump.as_mut()),
            enforcement,
        )
    });
    if let Some(m) = &host.cgroups {
        m.release();
    }
    // The caller's terminal is given back its modes before anything more is printed.
    drop(plan.raw.take());
    result
}
