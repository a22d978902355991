//! `hatchery audit verify|tail`: check the trail's integrity, read it.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use hatchery::audit::{self, AuditKey};
use hatchery::controller::paths;
use hatchery::signing::Keyring;

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  hatchery audit verify\n  hatchery audit tail -n 20\n  hatchery audit tail -f --state-dir /tmp/h-state"
)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub command: AuditCommand,
}

#[derive(Args, Debug, Clone)]
pub struct StateArgs {
    /// The controller's state directory (default /var/lib/hatchery for root,
    /// $XDG_STATE_HOME/hatchery otherwise)
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The controller's key file (default STATE_DIR/controller.key)
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Check every entry's sequence, link, hash and MAC; name the first bad one
    Verify(StateArgs),
    /// Print entries readably
    Tail(TailArgs),
}

#[derive(Args, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// How many of the last entries
    #[arg(short = 'n', long, default_value_t = 20)]
    pub lines: usize,
    /// Keep printing new entries
    #[arg(short, long)]
    pub follow: bool,
    /// One JSON object per line, as stored
    #[arg(long)]
    pub json: bool,
}

fn dir(s: &StateArgs) -> PathBuf {
    s.state_dir.clone().unwrap_or_else(paths::default_state_dir)
}

fn key(s: &StateArgs) -> anyhow::Result<AuditKey> {
    let path = s
        .key
        .clone()
        .unwrap_or_else(|| dir(s).join("controller.key"));
    let ring = Keyring::load(&path)?;
    Ok(AuditKey::from_mac(ring.derived_mac(audit::KEY_PURPOSE)?))
}

fn verify(s: &StateArgs) -> i32 {
    let k = match key(s) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("hatchery: {e:#}");
            return 2;
        }
    };
    match audit::verify(&dir(s), &k) {
        Ok(summary) => {
            println!(
                "audit trail intact: {} entries, last hash {}",
                summary.entries, summary.last_hash
            );
            0
        }
        Err(e @ audit::AuditError::Damaged { .. }) => {
            println!("{e}");
            1
        }
        Err(e) => {
            eprintln!("hatchery: {e}");
            2
        }
    }
}

fn tail(a: &TailArgs) -> i32 {
    let d = dir(&a.state);
    let mut shown = 0usize;
    loop {
        let entries = match audit::read_entries(&d) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("hatchery: {e}");
                return 2;
            }
        };
        let from = if shown == 0 {
            entries.len().saturating_sub(a.lines)
        } else {
            shown
        };
        for e in entries.iter().skip(from) {
            if a.json {
                println!("{}", serde_json::to_string(e).unwrap_or_default());
            } else {
                println!("{}", audit::describe(e));
            }
        }
        shown = entries.len().max(shown);
        if !a.follow {
            return 0;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

pub fn main(args: AuditArgs) -> i32 {
    match &args.command {
        AuditCommand::Verify(s) => verify(s),
        AuditCommand::Tail(t) => tail(t),
    }
}
