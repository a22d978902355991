//! The flags that describe a worker's job — resources, filesystem exposure, profile,
//! environment, state snapshot, command — shared by `manifest issue`, `spawn` and
//! `agent replicate`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use hatchery::egress::{AllowHost, AllowList};
use hatchery::manifest::{
    CpuLimit, Depth, EgressBytes, ExecPath, ExposedPath, FieldError, FilesystemScope, MemoryMb,
    NetworkPolicy, OutputBytes, PidsLimit, ProfileName, ResourceSpec, SpawnRequest, StateSnapshot,
    TimeoutMs, WorkerId,
};
use hatchery::units;

#[derive(Args, Debug, Clone)]
pub struct JobArgs {
    /// Memory limit (64M, 1G), a whole number of MiB
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_memory_mb)]
    pub memory: MemoryMb,
    /// CPU quota in cores (0.5), in steps of 0.001
    #[arg(long, value_name = "N", default_value = "0.5", value_parser = parse_cpu)]
    pub cpus: CpuLimit,
    /// Maximum number of tasks (processes + threads)
    #[arg(long, value_name = "N", default_value = "64", value_parser = parse_pids)]
    pub pids: PidsLimit,
    /// Wall-clock limit of the worker's sandbox (500ms, 30s, 1m30s)
    #[arg(long, value_name = "DUR", default_value = "5m", value_parser = parse_timeout)]
    pub timeout: TimeoutMs,
    /// Expose a host path read-only (a relative path is taken from the current directory;
    /// repeatable)
    #[arg(long = "ro", value_name = "PATH", value_parser = parse_path)]
    pub ro: Vec<ExposedPath>,
    /// Expose a host path read-write (a relative path is taken from the current directory;
    /// repeatable)
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
    /// Ask for the host's whole network (the manifest field; a controller refuses it:
    /// workers reach named hosts only, with --allow-host)
    #[arg(long)]
    pub allow_external: bool,
    /// Let the worker reach HOST:PORT, and nothing else, through an egress broker outside
    /// its sandbox (repeatable; the manifest's network_policy.allow_hosts). HOST is a name
    /// (api.example.com), a one-label wildcard (*.pypi.org), an IP ([::1] for IPv6) or a
    /// CIDR (10.0.0.0/8); a child's hosts must be covered by its parent's
    #[arg(long = "allow-host", value_name = "HOST:PORT", value_parser = super::egress::parse_allow_host)]
    pub allow_host: Vec<AllowHost>,
    /// Bytes the worker may move through the broker, both ways together (64K, 10M; the
    /// manifest's network_policy.max_egress_bytes)
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = parse_egress_budget)]
    pub max_egress: Option<EgressBytes>,
    /// Withhold the socket to the controller: for a plain command that does not speak the
    /// worker protocol (nothing to register, no heartbeats; limits and timeout still hold)
    #[arg(long)]
    pub no_controller: bool,
    /// State snapshot handed to the worker (UTF-8 text)
    #[arg(long, value_name = "TEXT", conflicts_with = "state_file")]
    pub state: Option<String>,
    /// Read the state snapshot from a file
    #[arg(long, value_name = "FILE")]
    pub state_file: Option<PathBuf>,
    /// Environment variable for the command (repeatable); `KEY` alone passes this
    /// shell's value of KEY (not set here: not set there)
    #[arg(long = "env", value_name = "KEY[=VALUE]")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox (a relative path is taken from the current
    /// directory: exposed paths are at the same path inside)
    #[arg(long, value_name = "PATH", value_parser = parse_cwd)]
    pub cwd: Option<String>,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

impl JobArgs {
    /// The resources these flags ask for; the network policy is checked as a manifest's
    /// (too many hosts, a port the broker keeps, a budget without hosts).
    pub fn resources(&self) -> Result<ResourceSpec, FieldError> {
        let allow_hosts = AllowList::new(self.allow_host.clone())
            .map_err(|e| FieldError::new("--allow-host", e.to_string()))?;
        let network_policy = NetworkPolicy {
            allow_controller: !self.no_controller,
            allow_external: self.allow_external,
            allow_hosts,
            max_egress_bytes: self.max_egress,
        };
        network_policy.validate().map_err(|e| match e.field {
            "max_egress_bytes" => FieldError::new(
                "--max-egress",
                "applies to hosts allowed with --allow-host HOST:PORT, and none is",
            ),
            _ => FieldError::new("--allow-host", e.why),
        })?;
        Ok(ResourceSpec {
            cpu_limit: self.cpus,
            memory_limit_mb: self.memory,
            pids_limit: self.pids,
            timeout_ms: self.timeout,
            network_policy,
            max_output_bytes: self.max_output,
        })
    }

    pub fn filesystem(&self) -> FilesystemScope {
        FilesystemScope {
            read_only: self.ro.clone(),
            read_write: self.rw.clone(),
            allow_exec: (!self.allow_exec.is_empty()).then(|| self.allow_exec.clone()),
        }
    }

    pub fn state_snapshot(&self) -> anyhow::Result<StateSnapshot> {
        let text = match (&self.state, &self.state_file) {
            (Some(s), _) => s.clone(),
            (None, Some(path)) => {
                let limit = hatchery::manifest::fields::MAX_STATE_SNAPSHOT_BYTES;
                let bytes = hatchery::paths::read_input(path, limit).map_err(|e| {
                    anyhow::anyhow!("cannot read the state file {}: {e}", path.display())
                })?;
                // One byte past the limit is enough for the snapshot's own check to say
                // it is too large.
                String::from_utf8(bytes).map_err(|_| {
                    anyhow::anyhow!("the state file {} is not UTF-8", path.display())
                })?
            }
            (None, None) => String::new(),
        };
        Ok(StateSnapshot::new(text)?)
    }

    /// `--env` as `KEY=VALUE` strings: a bare `KEY` takes this process's value, and is
    /// left out (with a note) where it has none.
    pub fn environment(&self) -> anyhow::Result<Vec<String>> {
        Ok(super::run::env_args(&self.env)?
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect())
    }

    /// The request these flags describe, validated.
    pub fn request(&self) -> anyhow::Result<SpawnRequest> {
        let job = SpawnRequest {
            resources: self.resources()?,
            filesystem: self.filesystem(),
            profile: self.profile.clone(),
            command: self.command.clone(),
            env: self.environment()?,
            cwd: self.cwd.clone(),
            state_snapshot: self.state_snapshot()?,
        };
        job.validate()?;
        Ok(job)
    }
}

pub fn parse_memory_mb(s: &str) -> Result<MemoryMb, String> {
    let bytes = units::parse_memory(s).map_err(|e| e.to_string())?;
    if bytes % (1 << 20) != 0 {
        return Err(format!("{s:?}: must be a whole number of MiB (like 256M)"));
    }
    MemoryMb::new(bytes >> 20).map_err(|e| e.to_string())
}

pub fn parse_cpu(s: &str) -> Result<CpuLimit, String> {
    let cores = units::parse_cpus(s).map_err(|e| e.to_string())?;
    CpuLimit::new(cores).map_err(|e| e.to_string())
}

pub fn parse_pids(s: &str) -> Result<PidsLimit, String> {
    let n = units::parse_pids(s).map_err(|e| e.to_string())?;
    PidsLimit::new(n).map_err(|e| e.to_string())
}

pub fn parse_timeout(s: &str) -> Result<TimeoutMs, String> {
    let d = units::parse_duration(s).map_err(|e| e.to_string())?;
    let ms = u64::try_from(d.as_millis()).map_err(|e| e.to_string())?;
    if Duration::from_millis(ms) != d {
        return Err(format!("{s:?}: must be a whole number of milliseconds"));
    }
    TimeoutMs::new(ms).map_err(|e| e.to_string())
}

/// A path as the user typed it, made absolute against the current directory (see
/// [`hatchery::paths::absolutize`]): the controller that resolves it runs elsewhere.
fn absolute(s: &str) -> Result<String, String> {
    let p = hatchery::paths::absolutize(std::path::Path::new(s)).map_err(|e| e.to_string())?;
    p.into_os_string()
        .into_string()
        .map_err(|p| format!("{}: not UTF-8", p.to_string_lossy()))
}

pub fn parse_path(s: &str) -> Result<ExposedPath, String> {
    ExposedPath::new(absolute(s)?).map_err(|e| e.why)
}

pub fn parse_exec_path(s: &str) -> Result<ExecPath, String> {
    ExecPath::new(absolute(s)?).map_err(|e| e.why)
}

pub fn parse_cwd(s: &str) -> Result<String, String> {
    absolute(s)
}

pub fn parse_output(s: &str) -> Result<OutputBytes, String> {
    let n = units::parse_output_cap(s).map_err(|e| e.to_string())?;
    OutputBytes::new(n).map_err(|e| e.to_string())
}

pub fn parse_egress_budget(s: &str) -> Result<EgressBytes, String> {
    let n = super::egress::parse_budget(s)?;
    EgressBytes::new(n).map_err(|e| e.to_string())
}

pub fn parse_profile(s: &str) -> Result<ProfileName, String> {
    ProfileName::new(s).map_err(|e| format!("{} (a profile name, not a file)", e.why))
}

pub fn parse_worker_id(s: &str) -> Result<WorkerId, String> {
    WorkerId::new(s).map_err(|e| e.why)
}

pub fn parse_depth(s: &str) -> Result<Depth, String> {
    let n: u32 = s.parse().map_err(|_| format!("{s:?}: not a depth"))?;
    let d = Depth::new(n).map_err(|e| e.to_string())?;
    if d == Depth::ROOT {
        return Err("a child has a depth of 1 or more (omit --parent/--depth for a root)".into());
    }
    Ok(d)
}
