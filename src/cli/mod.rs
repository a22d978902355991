//! Command-line edge: one module per subcommand. Errors become one clear line on stderr
//! and an exit status; nothing below this layer prints.

pub mod agent;
pub mod approvals;
pub mod audit;
pub mod controller;
pub mod doctor;
pub mod job;
pub mod logging;
pub mod manifest;
pub mod profile;
pub mod run;

use clap::{Parser, Subcommand};

const ABOUT: &str = "Sandbox manager for self-replicating agent workers: signed manifests, a replication contract, kernel-enforced isolation";

const EXAMPLES: &str = "\
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
    Ps(controller::PsArgs),
    /// One worker's manifest, limits, usage, and how and why it ended
    Inspect(controller::InspectArgs),
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
        Command::Ps(args) => controller::ps_main(args),
        Command::Inspect(args) => controller::inspect_main(args),
        Command::Logs(args) => controller::logs_main(args),
        Command::Kill(args) => controller::kill_main(args),
        Command::KillSwitch(args) => controller::kill_switch_main(args),
        Command::Approvals(args) => approvals::approvals_main(args),
        Command::Approve(args) => approvals::approve_main(args),
        Command::Deny(args) => approvals::deny_main(args),
        Command::Audit(args) => audit::main(args),
        Command::Agent(args) => agent::main(*args),
    }
}
