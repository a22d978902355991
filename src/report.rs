//! The JSON report `run --report FILE` writes after the sandbox ends: how it ended, what
//! the kernel counted, and what was (and was not) enforced.

use std::path::Path;

use serde::Serialize;

use crate::sandbox::{Enforcement, Outcome};

#[derive(Debug, Serialize)]
pub struct ProfileRef {
    pub name: String,
    pub sha256: String,
}

#[derive(Debug, Serialize)]
pub struct LimitsRequested {
    pub memory_bytes: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub timeout_ms: Option<u128>,
    /// The output cap (`--max-output`), stdout and stderr together.
    pub max_output_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub oom_killed: bool,
    pub timed_out: bool,
    pub wall_ms: u128,
    pub cpu_usec: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub pids_peak: Option<u64>,
    pub pids_limit_hits: u64,
    /// Bytes of output (stdout, stderr and the sandbox's terminal together) that reached
    /// the caller; `null` when no output passed through hatchery (no `--max-output` and no
    /// terminal: the command wrote to the caller's descriptors directly).
    pub output_bytes: Option<u64>,
    /// Whether output beyond the cap was cut.
    pub output_truncated: bool,
    pub command: Vec<String>,
    pub profile: ProfileRef,
    pub limits: LimitsRequested,
    pub enforcement: Enforcement,
    /// Why the command did not run (setup or exec failure), if it did not.
    pub error: Option<String>,
}

impl Report {
    pub fn new(
        outcome: &Outcome,
        mut enforcement: Enforcement,
        command: Vec<String>,
        limits: LimitsRequested,
    ) -> Report {
        if let Some((abi, status)) = &outcome.landlock {
            enforcement.landlock_abi = Some(*abi);
            enforcement.landlock = status.clone();
            if status != "fully_enforced" {
                enforcement.not_enforced.push(format!(
                    "landlock: {status} (kernel ABI {abi}; rules of newer ABIs are not enforced)"
                ));
            }
        }
        if let Some(err) = &outcome.cleanup_error {
            enforcement.not_enforced.push(format!("cleanup: {err}"));
        }
        Report {
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            oom_killed: outcome.oom_killed,
            timed_out: outcome.timed_out,
            wall_ms: outcome.wall.as_millis(),
            cpu_usec: outcome.usage.cpu_usec,
            memory_peak_bytes: outcome.usage.memory_peak_bytes,
            pids_peak: outcome.usage.pids_peak,
            pids_limit_hits: outcome.usage.pids_limit_hits,
            output_bytes: outcome.output.map(|o| o.bytes),
            output_truncated: outcome.output.is_some_and(|o| o.truncated),
            profile: ProfileRef {
                name: enforcement.seccomp_profile.clone(),
                sha256: enforcement.profile_sha256.clone(),
            },
            command,
            limits,
            enforcement,
            error: outcome.failure.as_ref().map(|f| f.to_string()),
        }
    }

    /// Writes the report atomically, so a reader never sees half of it.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::paths::write_atomically(path, &json)
    }
}
