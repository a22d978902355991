//! `hatchery run`: one command in a new sandbox, supervised until it ends.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{SigSet, SigmaskHow};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use hatchery::paths::{OutputTarget, check_host_path};
use hatchery::profile::Profile;
use hatchery::report::{LimitsRequested, Report};
use hatchery::sandbox::cgroup::{Limits, unique_name};
use hatchery::sandbox::output::OutputPump;
use hatchery::sandbox::{self, Exposure, Host, RunRequest, SandboxError, SandboxSpec, spec};
use hatchery::units;

/// Exit status when the sandbox could not be set up.
pub const EXIT_SETUP: i32 = 125;

const RUN_EXAMPLES: &str = "\
Exit status: the command's own; 128+N if killed by signal N; 137 OOM kill; 124 timeout;
125 the sandbox could not be set up; 126 not executable; 127 not found.

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

/// Gives the payload pipes as stdout and stderr, read by the returned pump, which passes at
/// most `cap` bytes on to this process's own stdout and stderr. stdin stays the caller's.
fn capture_output(spec: &mut SandboxSpec, cap: u64) -> std::io::Result<OutputPump> {
    // A closed descriptor of the caller's becomes /dev/null, as it would without the cap.
    fn dup_or_null(fd: BorrowedFd<'_>, write: bool) -> std::io::Result<OwnedFd> {
        match fd.try_clone_to_owned() {
            Ok(fd) => Ok(fd),
            Err(_) => Ok(OwnedFd::from(
                std::fs::OpenOptions::new()
                    .read(!write)
                    .write(write)
                    .open("/dev/null")?,
            )),
        }
    }
    let stdin = dup_or_null(std::io::stdin().as_fd(), false)?;
    let stdout = dup_or_null(std::io::stdout().as_fd(), true)?;
    let stderr = dup_or_null(std::io::stderr().as_fd(), true)?;
    let (pump, [out, err]) = OutputPump::new(Some(cap), stdout, stderr)?;
    spec.stdio = Some([stdin, out, err]);
    Ok(pump)
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
            eprintln!(
                "hatchery: --report {}: {e}; nothing was run",
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
                        eprintln!(
                            "hatchery: cannot execute {}: {f}{hint}",
                            command.first().map(String::as_str).unwrap_or("")
                        );
                    }
                    sandbox::Failure::Setup { .. } => eprintln!("hatchery: {f}"),
                }
            } else if outcome.timed_out {
                eprintln!("hatchery: timed out; the sandbox was killed");
            } else if outcome.oom_killed {
                eprintln!("hatchery: out of memory; the sandbox was killed by the OOM killer");
            }
            if let Some(o) = outcome.output.filter(|o| o.truncated) {
                eprintln!(
                    "hatchery: output cut at {} bytes (--max-output); later writes failed with EPIPE",
                    o.cap.unwrap_or(o.bytes)
                );
            }
            if let Some(err) = &outcome.cleanup_error {
                eprintln!("hatchery: warning: cleanup incomplete: {err}");
            }
            let code = outcome.exit_code;
            (code, Report::new(&outcome, enforcement, command, requested))
        }
        Err(e) => {
            eprintln!("hatchery: {e}");
            (
                EXIT_SETUP,
                Report::refused(e.to_string(), command, requested, &profile_name),
            )
        }
    };
    if let Some(target) = report {
        if let Err(e) = report_body.write(&target) {
            // Never leave the caller believing a report exists (or that a file someone
            // else put there is hatchery's).
            eprintln!(
                "hatchery: cannot write the report {}: {e} (the command's exit status was {code})",
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
    if let Some(m) = &host.cgroups {
        for stale in m.sweep_stale() {
            tracing::info!(path = %stale.display(), "removed a cgroup left by a hatchery process that no longer exists");
        }
    }
    let enforcement = sandbox::preflight(&spec, &host)?;
    if let Some(allow) = &enforcement.exec_allowlist {
        for note in &allow.notes {
            eprintln!("hatchery: note: {note}");
        }
    }
    let mut pump =
        match args.max_output {
            Some(cap) => Some(capture_output(&mut spec, cap).map_err(|e| {
                SandboxError::Internal(format!("cannot set up the output pipes: {e}"))
            })?),
            None => None,
        };
    let signals = forwarded_signals();
    let result = sandbox::start(&spec, enforcement, host.cgroups.as_deref()).map(|sb| {
        // Only the sandbox may hold the pipes' write ends, or they never reach end-of-file.
        spec.stdio = None;
        let enforcement = sb.enforcement.clone();
        (
            sb.wait(timeout, signals.as_ref(), pump.as_mut()),
            enforcement,
        )
    });
    if let Some(m) = &host.cgroups {
        m.release();
    }
    result
}
