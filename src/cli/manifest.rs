//! `hatchery manifest`: keys, signed manifests and contract files, for operators, auditors
//! and tests driving hatchery from outside.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};

use hatchery::contract::ContractConfig;
use hatchery::manifest::{
    CpuLimit, Depth, ExecPath, ExposedPath, FilesystemScope, Lineage, MAX_MANIFEST_JSON_BYTES,
    MemoryMb, NetworkPolicy, OutputBytes, PidsLimit, ProfileName, ResourceSpec, SpawnRequest,
    StateSnapshot, TimeoutMs, Validity, WorkerId,
};
use hatchery::signing::{Keyring, ManifestSigner};
use hatchery::units;

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
      --ro /srv/data --rw /srv/work --cwd /srv/work --expires-in 15m -- python3 agent.py
  hatchery manifest issue --key k.key --allow-exec /usr/bin/python3.11 --max-output 1M \\
      --ro /srv/agent -- python3 /srv/agent/agent.py";

#[derive(Args, Debug)]
#[command(after_help = ISSUE_EXAMPLES)]
pub struct IssueArgs {
    /// Key file (its active key signs)
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// Memory limit (64M, 1G), a whole number of MiB
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_memory_mb)]
    pub memory: MemoryMb,
    /// CPU quota in cores (0.5), in steps of 0.001
    #[arg(long, value_name = "N", default_value = "0.5", value_parser = parse_cpu)]
    pub cpus: CpuLimit,
    /// Maximum number of tasks (processes + threads)
    #[arg(long, value_name = "N", default_value = "64", value_parser = parse_pids)]
    pub pids: PidsLimit,
    /// Wall-clock limit of the worker's sandbox (500ms, 30s, 5m)
    #[arg(long, value_name = "DUR", default_value = "5m", value_parser = parse_timeout)]
    pub timeout: TimeoutMs,
    /// Expose a host path read-only (absolute; repeatable)
    #[arg(long = "ro", value_name = "PATH", value_parser = parse_path)]
    pub ro: Vec<ExposedPath>,
    /// Expose a host path read-write (absolute; repeatable)
    #[arg(long = "rw", value_name = "PATH", value_parser = parse_path)]
    pub rw: Vec<ExposedPath>,
    /// The only file the worker may execute (repeatable: an executable allowlist; real
    /// paths, e.g. /usr/bin/python3.11)
    #[arg(long = "allow-exec", value_name = "PATH", value_parser = parse_exec_path)]
    pub allow_exec: Vec<ExecPath>,
    /// Cap on the worker's output, stdout and stderr together (64K, 1M)
    #[arg(long, value_name = "SIZE", value_parser = parse_output)]
    pub max_output: Option<OutputBytes>,
    /// Security profile name
    #[arg(long, value_name = "NAME", default_value = "default", value_parser = parse_profile)]
    pub profile: ProfileName,
    /// Grant network access beyond the controller
    #[arg(long)]
    pub allow_external: bool,
    /// Withhold the socket to the controller
    #[arg(long)]
    pub no_controller: bool,
    /// Worker id (default: a random w-XXXXXXXXXXXXXXXX)
    #[arg(long, value_name = "ID", value_parser = parse_worker_id)]
    pub worker_id: Option<WorkerId>,
    /// Parent worker id, for a child manifest (needs --depth)
    #[arg(long, value_name = "ID", requires = "depth", value_parser = parse_worker_id)]
    pub parent: Option<WorkerId>,
    /// Depth of a child manifest, 1 or more (needs --parent)
    #[arg(long, value_name = "N", requires = "parent", value_parser = parse_depth)]
    pub depth: Option<Depth>,
    /// State snapshot handed to the worker (UTF-8 text)
    #[arg(long, value_name = "TEXT", conflicts_with = "state_file")]
    pub state: Option<String>,
    /// Read the state snapshot from a file
    #[arg(long, value_name = "FILE")]
    pub state_file: Option<PathBuf>,
    /// Environment variable for the command (repeatable)
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox
    #[arg(long, value_name = "PATH")]
    pub cwd: Option<String>,
    /// How long the manifest stays valid (max 30 days)
    #[arg(long, value_name = "DUR", default_value = "1h", value_parser = units::parse_duration)]
    pub expires_in: Duration,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
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

fn parse_memory_mb(s: &str) -> Result<MemoryMb, String> {
    let bytes = units::parse_memory(s).map_err(|e| e.to_string())?;
    if bytes % (1 << 20) != 0 {
        return Err(format!("{s:?}: must be a whole number of MiB (like 256M)"));
    }
    MemoryMb::new(bytes >> 20).map_err(|e| e.to_string())
}

fn parse_cpu(s: &str) -> Result<CpuLimit, String> {
    let cores = units::parse_cpus(s).map_err(|e| e.to_string())?;
    CpuLimit::new(cores).map_err(|e| e.to_string())
}

fn parse_pids(s: &str) -> Result<PidsLimit, String> {
    let n = units::parse_pids(s).map_err(|e| e.to_string())?;
    PidsLimit::new(n).map_err(|e| e.to_string())
}

fn parse_timeout(s: &str) -> Result<TimeoutMs, String> {
    let d = units::parse_duration(s).map_err(|e| e.to_string())?;
    let ms = u64::try_from(d.as_millis()).map_err(|e| e.to_string())?;
    if Duration::from_millis(ms) != d {
        return Err(format!("{s:?}: must be a whole number of milliseconds"));
    }
    TimeoutMs::new(ms).map_err(|e| e.to_string())
}

fn parse_path(s: &str) -> Result<ExposedPath, String> {
    ExposedPath::new(s).map_err(|e| e.why)
}

fn parse_exec_path(s: &str) -> Result<ExecPath, String> {
    ExecPath::new(s).map_err(|e| e.why)
}

fn parse_output(s: &str) -> Result<OutputBytes, String> {
    let n = units::parse_output_cap(s).map_err(|e| e.to_string())?;
    OutputBytes::new(n).map_err(|e| e.to_string())
}

fn parse_profile(s: &str) -> Result<ProfileName, String> {
    ProfileName::new(s).map_err(|e| format!("{} (a profile name, not a file)", e.why))
}

fn parse_worker_id(s: &str) -> Result<WorkerId, String> {
    WorkerId::new(s).map_err(|e| e.why)
}

fn parse_depth(s: &str) -> Result<Depth, String> {
    let n: u32 = s.parse().map_err(|_| format!("{s:?}: not a depth"))?;
    let d = Depth::new(n).map_err(|e| e.to_string())?;
    if d == Depth::ROOT {
        return Err("a child has a depth of 1 or more (omit --parent/--depth for a root)".into());
    }
    Ok(d)
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
        Err(e) => {
            eprintln!("hatchery: {e:#}");
            EXIT_ERROR
        }
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

fn read_state(args: &IssueArgs) -> anyhow::Result<StateSnapshot> {
    let text = match (&args.state, &args.state_file) {
        (Some(s), _) => s.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the state file {}: {e}", path.display()))?,
        (None, None) => String::new(),
    };
    Ok(StateSnapshot::new(text)?)
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
    let job = SpawnRequest {
        resources: ResourceSpec {
            cpu_limit: args.cpus,
            memory_limit_mb: args.memory,
            pids_limit: args.pids,
            timeout_ms: args.timeout,
            network_policy: NetworkPolicy {
                allow_controller: !args.no_controller,
                allow_external: args.allow_external,
            },
            max_output_bytes: args.max_output,
        },
        filesystem: FilesystemScope {
            read_only: args.ro.clone(),
            read_write: args.rw.clone(),
            allow_exec: (!args.allow_exec.is_empty()).then(|| args.allow_exec.clone()),
        },
        profile: args.profile.clone(),
        command: args.command.clone(),
        env: args.env.clone(),
        cwd: args.cwd.clone(),
        state_snapshot: read_state(&args)?,
    };
    job.validate()?;
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
        std::fs::File::open(path)?
            .take(limit)
            .read_to_end(&mut bytes)?;
    }
    Ok(bytes)
}

fn verify(args: VerifyArgs) -> i32 {
    let keyring = match Keyring::load(&args.key) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("hatchery: {e}");
            return EXIT_ERROR;
        }
    };
    let bytes = match read_manifest(&args.file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("hatchery: cannot read {}: {e}", args.file.display());
            return EXIT_ERROR;
        }
    };
    let now = args.now.unwrap_or_else(unix_now);
    let mut signer = ManifestSigner::new(keyring);
    let verdict = signer.verify_json(&bytes, now);
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
                "error": e.to_string(),
            }),
        };
        println!("{value}");
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
            Err(e) => println!("invalid: {e}"),
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
