//! `hatchery manifest`: keys, signed manifests and contract files, for operators, auditors
//! and tests driving hatchery from outside.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};

use hatchery::contract::ContractConfig;
use hatchery::manifest::{Depth, Lineage, MAX_MANIFEST_JSON_BYTES, Validity, WorkerId};
use hatchery::signing::{Keyring, ManifestSigner};
use hatchery::units;

use super::job::{JobArgs, parse_depth, parse_worker_id};

/// Exit status of `verify` for a manifest that failed a check.
pub const EXIT_INVALID: i32 = 1;
/// Exit status for anything that kept a command from doing its work (unreadable key file,
/// bad option value).
pub const EXIT_ERROR: i32 = 2;

const MANIFEST_EXAMPLES: &str = "\
Examples:
  hatchery manifest keygen --key /etc/hatchery/manifest.key
  hatchery manifest issue --key /etc/hatchery/manifest.key --memory 256M --cpus 0.5 -- python3 agent.py > m.json
  hatchery manifest verify m.json --key /etc/hatchery/manifest.key
  hatchery manifest contract contract.toml";

#[derive(Args, Debug)]
#[command(after_help = MANIFEST_EXAMPLES)]
pub struct ManifestArgs {
    #[command(subcommand)]
    pub command: ManifestCommand,
}

#[derive(Subcommand, Debug)]
pub enum ManifestCommand {
    /// Create a signing key file (mode 0600), or add a new active key to one (--rotate)
    Keygen(KeygenArgs),
    /// Print a signed manifest (JSON) granting a command and its limits
    Issue(Box<IssueArgs>),
    /// Check a manifest: says valid, or which check failed (exit 1)
    Verify(VerifyArgs),
    /// Check a contract file and print it with every default filled in
    Contract(ContractArgs),
}

const KEYGEN_EXAMPLES: &str = "\
The file holds secrets: it is created with mode 0600 and hatchery refuses to load it if
group or others may read it, or if another user owns it.

Examples:
  hatchery manifest keygen --key /etc/hatchery/manifest.key
  hatchery manifest keygen --key /etc/hatchery/manifest.key --rotate";

#[derive(Args, Debug)]
#[command(after_help = KEYGEN_EXAMPLES)]
pub struct KeygenArgs {
    /// Key file to create
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// Add a new active key to an existing file; older keys keep verifying
    #[arg(long)]
    pub rotate: bool,
}

const ISSUE_EXAMPLES: &str = "\
Prints the manifest on stdout. Limits not given take the defaults shown.

Examples:
  hatchery manifest issue --key k.key -- sh -c 'echo hello'
  hatchery manifest issue --key k.key --memory 512M --cpus 1 --pids 128 --timeout 10m \\
      --ro /srv/data --rw /srv/work --cwd /srv/work --expires-in 15m -- python3 agent.py";

#[derive(Args, Debug)]
#[command(after_help = ISSUE_EXAMPLES)]
pub struct IssueArgs {
    /// Key file (its active key signs)
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// Worker id (default: a random w-XXXXXXXXXXXXXXXX)
    #[arg(long, value_name = "ID", value_parser = parse_worker_id)]
    pub worker_id: Option<WorkerId>,
    /// Parent worker id, for a child manifest (needs --depth)
    #[arg(long, value_name = "ID", requires = "depth", value_parser = parse_worker_id)]
    pub parent: Option<WorkerId>,
    /// Depth of a child manifest, 1 or more (needs --parent)
    #[arg(long, value_name = "N", requires = "parent", value_parser = parse_depth)]
    pub depth: Option<Depth>,
    /// How long the manifest stays valid (max 30 days)
    #[arg(long, value_name = "DUR", default_value = "1h", value_parser = units::parse_duration)]
    pub expires_in: Duration,
    #[command(flatten)]
    pub job: JobArgs,
}

const VERIFY_EXAMPLES: &str = "\
Checks, in order: format, signature present, key id known, signature (constant-time),
issued_at/expires_at against the clock, nonce. This command remembers nothing between
runs, so replays are caught by the controller, not here.

Exit status: 0 valid; 1 a check failed; 2 the manifest or key file could not be read.

Examples:
  hatchery manifest verify m.json --key /etc/hatchery/manifest.key
  hatchery manifest issue --key k.key -- true | hatchery manifest verify - --key k.key --json";

#[derive(Args, Debug)]
#[command(after_help = VERIFY_EXAMPLES)]
pub struct VerifyArgs {
    /// Manifest file ("-" for stdin)
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Key file (any of its keys may have signed)
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// Check against this time (seconds since the epoch) instead of the clock
    #[arg(long, value_name = "SECONDS")]
    pub now: Option<u64>,
    /// Print the verdict as JSON
    #[arg(long)]
    pub json: bool,
}

const CONTRACT_EXAMPLES: &str = "\
Without FILE, prints the built-in contract. Errors give the line and column.

Examples:
  hatchery manifest contract
  hatchery manifest contract /etc/hatchery/contract.toml";

#[derive(Args, Debug)]
#[command(after_help = CONTRACT_EXAMPLES)]
pub struct ContractArgs {
    /// Contract file (TOML)
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub fn main(args: ManifestArgs) -> i32 {
    let result = match args.command {
        ManifestCommand::Keygen(a) => keygen(a),
        ManifestCommand::Issue(a) => issue(*a),
        ManifestCommand::Verify(a) => return verify(a),
        ManifestCommand::Contract(a) => contract(a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => super::fail_with(&e, EXIT_ERROR),
    }
}

fn keygen(args: KeygenArgs) -> anyhow::Result<()> {
    let ring = if args.rotate {
        let mut ring = Keyring::load(&args.key)?;
        ring.rotate()?;
        ring.replace(&args.key)?;
        ring
    } else {
        let ring = Keyring::generate()?;
        ring.write_new(&args.key)?;
        ring
    };
    println!(
        "{}: active key {} ({} key{} in the file)",
        args.key.display(),
        ring.active_key_id(),
        ring.key_ids().count(),
        if ring.key_ids().count() == 1 { "" } else { "s" }
    );
    Ok(())
}

fn issue(args: IssueArgs) -> anyhow::Result<()> {
    let signer = ManifestSigner::new(Keyring::load(&args.key)?);
    let worker_id = match &args.worker_id {
        Some(id) => id.clone(),
        None => {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b)
                .map_err(|e| anyhow::anyhow!("the system random source failed: {e}"))?;
            WorkerId::new(format!("w-{}", hex::encode(b)))?
        }
    };
    let lineage = match (&args.parent, args.depth) {
        (Some(parent), Some(depth)) => Lineage {
            worker_id,
            parent_id: Some(parent.clone()),
            depth,
        },
        _ => Lineage::root(worker_id),
    };
    let job = args.job.request()?;
    let lifetime = args.expires_in.as_secs().max(1);
    let validity = Validity::starting_at(unix_now(), lifetime)?;
    let manifest = signer.issue(lineage, job, validity)?;
    println!("{}", manifest.to_json()?);
    Ok(())
}

/// Reads at most one byte more than a manifest may have, so an oversized input is
/// reported as such without reading all of it.
fn read_manifest(path: &Path) -> std::io::Result<Vec<u8>> {
    let limit = MAX_MANIFEST_JSON_BYTES as u64 + 1;
    let mut bytes = Vec::new();
    if path == Path::new("-") {
        std::io::stdin()
            .lock()
            .take(limit)
            .read_to_end(&mut bytes)?;
    } else {
        bytes = hatchery::paths::read_input(path, MAX_MANIFEST_JSON_BYTES)?;
    }
    Ok(bytes)
}

/// The session keyring for the manifest's key id, where it names a session of a key in
/// `keyring` (and the key id is not one of `keyring`'s own).
fn session_keyring(keyring: &Keyring, bytes: &[u8]) -> Option<Keyring> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let id = hatchery::manifest::KeyId::new(v.get("key_id")?.as_str()?).ok()?;
    if keyring.key_ids().any(|k| k == &id) {
        return None;
    }
    keyring.for_session_key_id(&id)
}

fn verify(args: VerifyArgs) -> i32 {
    let keyring = match Keyring::load(&args.key) {
        Ok(k) => k,
        Err(e) => {
            error_line!("{e}");
            return EXIT_ERROR;
        }
    };
    let bytes = match read_manifest(&args.file) {
        Ok(b) => b,
        Err(e) => {
            error_line!("cannot read {}: {e}", args.file.display());
            return EXIT_ERROR;
        }
    };
    let now = args.now.unwrap_or_else(unix_now);
    // A manifest signed in a controller session names the session's key: derived again
    // from the key file (any node of a cluster holding the same file verifies it).
    let keyring = session_keyring(&keyring, &bytes).unwrap_or(keyring);
    let mut signer = ManifestSigner::new(keyring);
    let verdict = signer.verify_json(&bytes, now);
    // The message may quote the manifest's own text, at any length: one line of it.
    let error = |e: &dyn std::fmt::Display| hatchery::text::clip(&e.to_string(), 1000).into_owned();
    if args.json {
        let value = match &verdict {
            Ok(m) => serde_json::json!({
                "valid": true,
                "worker_id": m.worker_id,
                "parent_id": m.parent_id,
                "depth": m.depth,
                "key_id": m.key_id,
                "expires_at": m.expires_at,
            }),
            Err(e) => serde_json::json!({
                "valid": false,
                "check": e.check(),
                "event": e.audit_event(),
                "error": error(e),
            }),
        };
        // Escaped as every `--json` is: the error quotes the manifest's text.
        match hatchery::text::to_json(&value) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                error_line!("cannot write the verdict as JSON: {e}");
                return EXIT_ERROR;
            }
        }
    } else {
        match &verdict {
            Ok(m) => println!(
                "valid: worker {} (depth {}, parent {}), signed with key {}, expires at {} (in {} s)",
                m.worker_id,
                m.depth,
                m.parent_id
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_else(|| "none".into()),
                m.key_id,
                m.expires_at,
                m.expires_at.get().saturating_sub(now)
            ),
            // The message starts with the name of the check that failed.
            Err(e) => println!("invalid: {}", hatchery::text::escape_controls(&error(e))),
        }
    }
    match verdict {
        Ok(_) => 0,
        Err(_) => EXIT_INVALID,
    }
}

fn contract(args: ContractArgs) -> anyhow::Result<()> {
    let config = match &args.file {
        Some(path) => ContractConfig::from_file(path)?,
        None => ContractConfig::default(),
    };
    print!("{}", config.to_toml()?);
    Ok(())
}
