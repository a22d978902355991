//! Command-line edge: one module per subcommand. Errors become one clear line on stderr
//! and an exit status; nothing below this layer prints.

pub mod doctor;
pub mod logging;
pub mod manifest;
pub mod profile;
pub mod run;

use clap::{Parser, Subcommand};

const ABOUT: &str = "Sandbox manager for self-replicating agent workers: signed manifests, a replication contract, kernel-enforced isolation";

const EXAMPLES: &str = "\
Examples:
  hatchery run --memory 256M --cpus 0.5 --pids 64 --timeout 30s --rw ./workspace -- python3 agent.py
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
}

/// Runs a subcommand and returns the process exit status.
pub fn dispatch(command: Command) -> i32 {
    match command {
        Command::Run(args) => run::main(*args),
        Command::Doctor(args) => doctor::main(args),
        Command::Profile(args) => profile::main(args),
        Command::Manifest(args) => manifest::main(args),
    }
}
