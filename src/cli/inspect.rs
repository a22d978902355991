//! `hatchery inspect`: one worker, running or ended: its signed manifest, limits, usage
//! and how it ended.

use std::time::Duration;

use clap::Args;

use hatchery::controller::protocol::WorkerInfo;
use hatchery::manifest::{Manifest, WorkerId};
use hatchery::units;

use super::controller::{SocketArg, exit_status, fail, inspect, out_json, outln};
use super::job::parse_worker_id;
use super::ps::{human_bytes, state};
use super::shown::shown;

#[derive(Args, Debug)]
#[command(
    after_help = "Shows the signed manifest, the limits, the usage and, once it ended, how and why.\n\nExamples:\n  hatchery inspect w-3f2a9c1b0d4e\n  hatchery inspect --json w-3f2a9c1b0d4e"
)]
pub struct InspectArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Machine-readable output: {"worker": …, "manifest": …}
    #[arg(long)]
    pub json: bool,
    /// The worker (running or ended)
    #[arg(value_parser = parse_worker_id)]
    pub worker_id: WorkerId,
}

pub fn inspect_main(args: InspectArgs) -> i32 {
    let (info, manifest) = match inspect(&args.socket, &args.worker_id) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    if args.json {
        out_json(&serde_json::json!({ "worker": info, "manifest": manifest }));
        return 0;
    }
    let mut lines = worker_lines(&info);
    lines.extend(manifest_lines(&manifest));
    lines.extend(run_lines(&info));
    lines.push(format!(
        "expires:     {}",
        hatchery::audit::format_time(manifest.expires_at.get().saturating_mul(1000))
    ));
    lines.push(format!("log:         hatchery logs {}", info.worker_id));
    outln(&super::shown::fold_fields(
        &lines.join("\n"),
        super::shown::screen_width(),
    ));
    0
}

/// `inspect`'s lines on the worker itself: its id, lineage, state, pid and start.
fn worker_lines(info: &WorkerInfo) -> Vec<String> {
    vec![
        format!("worker:      {}", info.worker_id),
        format!(
            "lineage:     depth {}, parent {}, children {}",
            info.depth,
            info.parent_id.as_ref().map(|p| p.as_str()).unwrap_or("-"),
            if info.children.is_empty() {
                "-".to_string()
            } else {
                info.children
                    .iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        ),
        format!("state:       {}", state(info)),
        format!(
            "pid:         {}",
            info.pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into())
        ),
        format!(
            "started:     {}",
            hatchery::audit::format_time(info.started_at_ms)
        ),
    ]
}

/// `inspect`'s lines on what the signed manifest grants: the command, profile, limits,
/// network and filesystem.
fn manifest_lines(manifest: &Manifest) -> Vec<String> {
    let r = &manifest.resources;
    let fs = &manifest.filesystem;
    let paths = |v: &[hatchery::manifest::ExposedPath]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            shown(&v.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(" "))
        }
    };
    let mut lines = vec![
        format!(
            "command:     {}",
            super::shown::shown_json(&manifest.command)
        ),
        format!("profile:     {}", manifest.profile),
        format!(
            "limits:      memory {} MiB, {} cores, {} tasks, timeout {}, output {}",
            r.memory_limit_mb.get(),
            r.cpu_limit.get(),
            r.pids_limit.get(),
            units::format_duration(Duration::from_millis(r.timeout_ms.get())),
            r.max_output_bytes
                .map(|b| units::format_size(b.get()))
                .unwrap_or_else(|| "the controller's cap".into())
        ),
        format!(
            "network:     controller socket {}, external {}",
            if r.network_policy.allow_controller {
                "yes"
            } else {
                "no (--no-controller)"
            },
            if r.network_policy.allow_external {
                "yes"
            } else {
                "no"
            }
        ),
    ];
    if let Some(hosts) = allow_hosts_line(&r.network_policy) {
        lines.push(format!("allow-hosts: {hosts}"));
    }
    lines.push(format!("read-only:   {}", paths(&fs.read_only)));
    lines.push(format!("read-write:  {}", paths(&fs.read_write)));
    if let Some(exec) = &fs.allow_exec {
        lines.push(format!(
            "allow-exec:  {}",
            shown(
                &exec
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        ));
    }
    lines
}

/// The hosts a network policy allows and its byte budget, in one line (`None` for none):
/// what `inspect` and `approvals` show of a worker's egress.
pub(super) fn allow_hosts_line(net: &hatchery::manifest::NetworkPolicy) -> Option<String> {
    if net.allow_hosts.is_empty() {
        return None;
    }
    let hosts: Vec<String> = net
        .allow_hosts
        .entries()
        .iter()
        .map(ToString::to_string)
        .collect();
    let budget = net
        .max_egress_bytes
        .map(|b| format!("egress budget {}", units::format_size(b.get())))
        .unwrap_or_else(|| "no egress budget".into());
    Some(format!("{} ({budget})", hosts.join(" ")))
}

/// `inspect`'s lines on how the worker runs or ran: its usage, last heartbeat, and how
/// and why it ended.
fn run_lines(info: &WorkerInfo) -> Vec<String> {
    let usage = info.usage.as_ref();
    let mut lines = vec![format!(
        "usage:       memory peak {}, cpu {}, tasks peak {}",
        human_bytes(usage.and_then(|u| u.memory_peak_bytes)),
        usage
            .and_then(|u| u.cpu_usec)
            .map(|c| format!("{:.2}s", c as f64 / 1e6))
            .unwrap_or_else(|| "-".into()),
        usage
            .and_then(|u| u.pids_peak)
            .map(|p| p.to_string())
            .unwrap_or_else(|| "-".into())
    )];
    if let Some(hb) = info.last_heartbeat_ms_ago {
        lines.push(format!("heartbeat:   {} ms ago", hb));
    }
    if let Some(e) = &info.exit {
        lines.push(format!(
            "exit:        status {} (exit code {}, signal {}, oom {}, timed out {})",
            exit_status(e),
            e.exit_code,
            e.signal
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            if e.oom_killed { "yes" } else { "no" },
            if e.timed_out { "yes" } else { "no" }
        ));
        lines.push(format!(
            "ended by:    {}",
            shown(e.ended_by.as_deref().unwrap_or("its own exit"))
        ));
        if let Some(error) = &e.error {
            lines.push(format!("error:       {}", shown(error)));
        }
        if let Some(at) = e.output_cut_at {
            let why = match info.resources.max_output_bytes {
                Some(cap) if at >= cap.get() => "its max_output_bytes".to_string(),
                _ => "short of its max_output_bytes: the output budget every worker shares (the controller's --worker-output-total) or the room kept for the audit trail ran out".to_string(),
            };
            lines.push(format!(
                "output:      cut at {at} bytes, what it wrote after dropped ({why})"
            ));
        }
    }
    lines
}
