//! Command-line edge: one module per subcommand. Errors become one clear line on stderr
//! and an exit status; nothing below this layer prints.

/// `error_line!("...")`: one `hatchery: ...` line on stderr, or a JSON log object with
/// `--log-format json` (see [`logging::error_line`]).
macro_rules! error_line {
    ($($arg:tt)*) => {
        $crate::cli::logging::error_line(&format!($($arg)*))
    };
}

pub mod agent;
pub mod approvals;
pub mod audit;
pub mod controller;
pub mod doctor;
pub mod egress;
pub mod inspect;
pub mod job;
pub mod logging;
pub mod manifest;
pub mod profile;
pub mod ps;
pub mod run;
pub mod shown;

use clap::{Parser, Subcommand};

/// Exit statuses, one rule for every command (the README's "Exit status" table).
pub mod exit {
    /// Done; or stdout was closed by its reader (`hatchery ps | head -1`).
    pub const OK: i32 = 0;
    /// Anything else that went wrong (the controller cannot be reached, I/O, ...).
    pub const FAILURE: i32 = 1;
    /// The command line cannot be used as given, found before anything starts: clap's own
    /// code for unknown flags and malformed values, and hatchery's for what it checks
    /// itself (`--env`, paths to expose, profiles, contracts, manifests, keys).
    pub const USAGE: i32 = 2;
    /// Denied by the replication contract (or a person, for an approval).
    pub const DENIED: i32 = 3;
    /// The sandbox (or a worker's) cannot be set up, or the kernel cannot enforce what was
    /// asked (fail closed, unless `--allow-degraded`).
    pub const SETUP: i32 = 125;
}

/// Input on the command line that hatchery cannot accept, found before anything started:
/// exit status 2, the same as clap's own usage errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// Something that was asked for cannot be set up here: exit status 125.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SetupFailed(pub String);

/// The exit status for an error that ends a command: 2 for bad input, 125 for a setup
/// that cannot be made, 1 otherwise.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if cause.is::<BadInput>() {
            return exit::USAGE;
        }
        if cause.is::<SetupFailed>() {
            return exit::SETUP;
        }
        if let Some(sandbox) = cause.downcast_ref::<hatchery::sandbox::SandboxError>() {
            return sandbox_exit_code(sandbox);
        }
        if cause.is::<hatchery::profile::ProfileError>()
            || cause.is::<hatchery::contract::ContractError>()
        {
            return exit::USAGE;
        }
    }
    exit::FAILURE
}

/// `Invalid` is what the command line asked for (2); a start a signal stopped ends as the
/// signal would have (128+N); the rest is the host (125).
pub fn sandbox_exit_code(e: &hatchery::sandbox::SandboxError) -> i32 {
    if let Some(signal) = e.stopped_by() {
        return 128_i32.saturating_add(signal);
    }
    match e {
        hatchery::sandbox::SandboxError::Invalid(_) => exit::USAGE,
        _ => exit::SETUP,
    }
}

/// Set once a write to stdout found its reader gone: nothing more is written there.
static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether stdout's reader has gone (see [`controller::out`]).
pub fn stdout_gone() -> bool {
    STDOUT_GONE.load(std::sync::atomic::Ordering::Relaxed)
}

pub fn mark_stdout_gone() {
    STDOUT_GONE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the error is a write to a stdout whose reader has gone (`| head -1`): a
/// broken pipe, and stdout is the one broken. A broken pipe to the controller is an
/// error to report, never a reason to end quietly, whatever stdout is doing.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    let from_controller = e.chain().any(|c| {
        c.downcast_ref::<hatchery::controller::client::ClientError>()
            .is_some()
    });
    !from_controller
        && e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        })
        && stdout_reader_gone()
}

/// Whether stdout is a pipe or socket nobody reads any more (poll(2) reports an error or
/// a hang-up on it).
pub fn stdout_reader_gone() -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let stdout = std::io::stdout();
    let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::POLLOUT)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds
            .first()
            .and_then(PollFd::revents)
            .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP)),
        Err(_) => false,
    }
}

/// Ends a command on an error with the given status (a command with its own rule for
/// what its errors mean), quietly with 0 when stdout was closed.
pub fn fail_with(e: &anyhow::Error, code: i32) -> i32 {
    if is_broken_pipe(e) {
        return exit::OK;
    }
    logging::error_line(&format!("{e:#}"));
    code
}

/// Ends a command on an error: one line on stderr and its exit status (see [`exit_code`]);
/// a closed stdout ends quietly with 0, as in every Unix tool.
pub fn fail(e: &anyhow::Error) -> i32 {
    fail_with(e, exit_code(e))
}

const ABOUT: &str = "Sandbox manager for self-replicating agent workers: signed manifests, a replication contract, kernel-enforced isolation";

const EXAMPLES: &str = "\
Exit status: 0 done; 1 failed; 2 bad usage or input (found before anything starts);
3 denied by the replication contract; 125 the sandbox cannot be set up as asked; run:
otherwise the command's own (124 timeout, 137 OOM kill, 128+N signal N).

Examples:
  hatchery run --memory 256M --pids 64 --timeout 30s --ro-cwd --rw ./workspace -- python3 agent.py
  hatchery run --report report.json -- sh -c 'echo hello from the sandbox'
  hatchery doctor";

#[derive(Parser, Debug)]
#[command(name = "hatchery", version, about = ABOUT, after_help = EXAMPLES, propagate_version = true)]
pub struct Cli {
    /// Log format on stderr
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Human)]
    pub log_format: logging::LogFormat,
    /// More logging (-v info, -vv debug); HATCHERY_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// `hatchery run ...` parsed by a command tree that has `run` alone: building every
/// subcommand's arguments (and dropping them again) was a quarter of what a one-shot
/// `run` did itself before the clone. The global flags, texts and settings are `Cli`'s,
/// so that what `run` accepts, refuses and prints is the same either way (the unit test
/// `run_parses_the_same_without_the_other_subcommands` compares them).
#[derive(Parser, Debug)]
#[command(name = "hatchery", version, about = ABOUT, after_help = EXAMPLES, propagate_version = true)]
struct RunCli {
    /// Log format on stderr
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Human)]
    log_format: logging::LogFormat,
    /// More logging (-v info, -vv debug); HATCHERY_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: RunOnly,
}

#[derive(Subcommand, Debug)]
enum RunOnly {
    /// Run one command in a new sandbox
    Run(Box<run::RunArgs>),
}

impl Cli {
    /// Parses the command line (`raw[0]` is the program), taking the short ways for `run`:
    /// its usual lines without clap ([`run::quick`]), the rest with a tree of `run` alone.
    pub fn parse_args(raw: &[std::ffi::OsString]) -> Result<Cli, clap::Error> {
        if raw.get(1).is_some_and(|a| a == "run") {
            if let Some((log_format, verbose, args)) = run::quick::parse(raw) {
                return Ok(Cli {
                    log_format,
                    verbose,
                    command: Command::Run(Box::new(args)),
                });
            }
            return RunCli::try_parse_from(raw).map(|c| Cli {
                log_format: c.log_format,
                verbose: c.verbose,
                command: match c.command {
                    RunOnly::Run(args) => Command::Run(args),
                },
            });
        }
        Cli::try_parse_from(raw)
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one command in a new sandbox
    Run(Box<run::RunArgs>),
    /// Show what this host can enforce, and what `run` would degrade
    Doctor(doctor::DoctorArgs),
    /// Read, check, compare, lint, import and export security profiles
    Profile(profile::ProfileArgs),
    /// Signing keys, signed manifests and replication contracts
    Manifest(manifest::ManifestArgs),
    /// Run the controller (foreground): issues manifests, launches workers, enforces the contract
    Controller(Box<controller::ControllerArgs>),
    /// Issue a manifest through the controller and launch the worker
    Spawn(Box<controller::SpawnArgs>),
    /// List workers (--tree for the lineage) with live usage
    Ps(ps::PsArgs),
    /// One worker's manifest, limits, usage, and how and why it ended
    Inspect(inspect::InspectArgs),
    /// A worker's output (-f: follow it until the worker ends)
    Logs(controller::LogsArgs),
    /// Kill workers (--recursive: and their descendants)
    Kill(controller::KillArgs),
    /// Kill every worker and refuse new ones (--release to reopen)
    KillSwitch(controller::KillSwitchArgs),
    /// Replication requests waiting for a person's approval
    Approvals(approvals::ApprovalsArgs),
    /// Approve a waiting replication request (launches exactly the manifest shown)
    Approve(approvals::ApproveArgs),
    /// Deny a waiting replication request
    Deny(approvals::DenyArgs),
    /// Verify or read the audit trail
    Audit(audit::AuditArgs),
    /// Talk to the controller from inside a worker
    Agent(Box<agent::AgentArgs>),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    #[command(after_help = COMPLETIONS_EXAMPLES)]
    Completions {
        /// The shell
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff; `man -l -` reads it)
    #[command(
        after_help = "Examples:\n  hatchery man | man -l -\n  hatchery man > /usr/local/share/man/man1/hatchery.1"
    )]
    Man,
}

const COMPLETIONS_EXAMPLES: &str = "\
scripts/install.sh installs these; by hand:

Examples:
  hatchery completions bash > /usr/local/share/bash-completion/completions/hatchery
  hatchery completions zsh > /usr/local/share/zsh/site-functions/_hatchery
  hatchery completions fish > /usr/local/share/fish/vendor_completions.d/hatchery.fish";

fn completions(shell: clap_complete::Shell) -> i32 {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let mut text = Vec::new();
    clap_complete::generate(shell, &mut cmd, "hatchery", &mut text);
    print_all(&text)
}

fn man() -> i32 {
    use clap::CommandFactory;
    let mut text = Vec::new();
    match clap_mangen::Man::new(Cli::command()).render(&mut text) {
        Ok(()) => print_all(&text),
        Err(e) => fail(&e.into()),
    }
}

fn print_all(bytes: &[u8]) -> i32 {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => exit::OK,
        Err(e) => fail(&e.into()),
    }
}

/// Runs a subcommand and returns the process exit status.
pub fn dispatch(command: Command) -> i32 {
    match command {
        Command::Run(args) => run::main(*args),
        Command::Doctor(args) => doctor::main(args),
        Command::Profile(args) => profile::main(args),
        Command::Manifest(args) => manifest::main(args),
        Command::Controller(args) => controller::controller_main(*args),
        Command::Spawn(args) => controller::spawn_main(*args),
        Command::Ps(args) => ps::ps_main(args),
        Command::Inspect(args) => inspect::inspect_main(args),
        Command::Logs(args) => controller::logs_main(args),
        Command::Kill(args) => controller::kill_main(args),
        Command::KillSwitch(args) => controller::kill_switch_main(args),
        Command::Approvals(args) => approvals::approvals_main(args),
        Command::Approve(args) => approvals::approve_main(args),
        Command::Deny(args) => approvals::deny_main(args),
        Command::Audit(args) => audit::main(args),
        Command::Agent(args) => agent::main(*args),
        Command::Completions { shell } => completions(shell),
        Command::Man => man(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a parse gives, as text: the arguments, or the error's kind and message.
    fn outcome(r: Result<Cli, clap::Error>) -> String {
        match r {
            Ok(cli) => format!("{cli:?}"),
            Err(e) => format!("{:?}: {}", e.kind(), e.render()),
        }
    }

    #[test]
    fn run_parses_the_same_without_the_other_subcommands() {
        // The lines `run::quick` takes, and lines clap refuses or answers with help.
        let refused: &[&[&str]] = &[
            &["run"],
            &["run", "--bogus", "--", "true"],
            &["run", "--memmory", "1G", "--", "true"],
            &["run", "--memory", "lots", "--", "true"],
            &["run", "--cpus", "-1", "--", "true"],
            &["run", "--hostname", "a_b", "--", "true"],
            &["run", "--host-uid", "0", "--", "true"],
            &["run", "--log-format", "xml", "--", "true"],
            &["run", "--help"],
            &["run", "-h"],
            &["run", "--version"],
            &["run", "-V"],
        ];
        for line in run::quick::tests::USUAL_LINES.iter().chain(refused) {
            let raw: Vec<std::ffi::OsString> = std::iter::once("hatchery")
                .chain(line.iter().copied())
                .map(Into::into)
                .collect();
            assert_eq!(
                outcome(Cli::parse_args(&raw)),
                outcome(Cli::try_parse_from(&raw)),
                "{line:?}"
            );
        }
    }
}
