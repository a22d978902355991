//! The JSON report `run --report FILE` writes after the sandbox ends: how it ended, what
//! the kernel counted, and what was (and was not) enforced.

use serde::Serialize;

use crate::broker::{EgressEntry, Summary};
use crate::paths::OutputTarget;
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
    /// Why hatchery could not write the command's output where it goes (a full file
    /// system, a file size limit) and how much of it was lost; `null` when nothing failed.
    pub output_error: Option<String>,
    pub command: Vec<String>,
    pub profile: ProfileRef,
    pub limits: LimitsRequested,
    pub enforcement: Enforcement,
    /// Why the command did not run (setup or exec failure), if it did not.
    pub error: Option<String>,
    /// Every DNS answer and connection through the egress broker (`--allow-host`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<EgressEntry>>,
    /// Entries past the broker's limit, counted only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_dropped: Option<u64>,
    /// Lookups the broker made with the host's resolver (`--resolve` names are not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_upstream_lookups: Option<u64>,
    /// Bytes sent through the broker over every connection, dropped entries included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_bytes_out: Option<u64>,
    /// Bytes received through the broker over every connection, dropped entries included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_bytes_in: Option<u64>,
    /// Why the broker's record is lost (it died, or did not report): the `egress` fields
    /// are then absent, not empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_error: Option<String>,
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
            output_error: outcome.output.and_then(|o| o.write_error()),
            profile: ProfileRef {
                name: enforcement.seccomp_profile.clone(),
                sha256: enforcement.profile_sha256.clone(),
            },
            command,
            limits,
            enforcement,
            error: outcome.failure.as_ref().map(|f| f.to_string()),
            egress: None,
            egress_dropped: None,
            egress_upstream_lookups: None,
            egress_bytes_out: None,
            egress_bytes_in: None,
            egress_error: None,
        }
    }

    /// Adds what the egress broker recorded, or why its record is lost.
    pub fn with_egress(mut self, summary: Option<Result<Summary, String>>) -> Report {
        match summary {
            Some(Ok(s)) => {
                self.egress = Some(s.entries);
                self.egress_dropped = Some(s.dropped);
                self.egress_upstream_lookups = Some(s.lookups);
                self.egress_bytes_out = Some(s.bytes_out);
                self.egress_bytes_in = Some(s.bytes_in);
            }
            Some(Err(why)) => self.egress_error = Some(why),
            None => {}
        }
        self
    }

    /// The report of a run that never started: the request was refused (exit status 2) or
    /// the sandbox could not be set up (125); `error` says why.
    pub fn refused(
        error: String,
        exit_code: i32,
        command: Vec<String>,
        limits: LimitsRequested,
        profile: &str,
    ) -> Report {
        Report {
            exit_code,
            signal: None,
            oom_killed: false,
            timed_out: false,
            wall_ms: 0,
            cpu_usec: None,
            memory_peak_bytes: None,
            pids_peak: None,
            pids_limit_hits: 0,
            output_bytes: None,
            output_truncated: false,
            output_error: None,
            command,
            profile: ProfileRef {
                name: profile.to_string(),
                sha256: String::new(),
            },
            limits,
            enforcement: Enforcement::default(),
            error: Some(error),
            egress: None,
            egress_dropped: None,
            egress_upstream_lookups: None,
            egress_bytes_out: None,
            egress_bytes_in: None,
            egress_error: None,
        }
    }

    /// Writes the report whole (a file is replaced atomically: a reader never sees half
    /// of it, and nothing a sandbox planted at the name is written through).
    pub fn write(&self, target: &OutputTarget) -> std::io::Result<()> {
        let mut json = crate::text::to_json_pretty(self)
            .map_err(std::io::Error::other)?
            .into_bytes();
        json.push(b'\n');
        target.write(&json)
    }
}
