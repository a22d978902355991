//! `hatchery approvals`, `approve`, `deny`: a person's decision on replication requests the
//! contract holds for approval.

use std::collections::BTreeSet;
use std::time::Duration;

use clap::Args;

use hatchery::audit;
use hatchery::controller::protocol::{ApiRequest, ApiResponse, NoFields, PendingApproval};

use super::controller::{SocketArg, out_json, outln};
use super::shown::{self, fold_fields, shown};

const APPROVALS_EXAMPLES: &str = "\
Each request shows the exact signed manifest that starts if it is approved; approving
launches that manifest and nothing else. Undecided requests are denied at their deadline.

Examples:
  hatchery approvals
  hatchery approvals --watch
  hatchery approve a-1f2e3d4c5b6a
  hatchery deny a-1f2e3d4c5b6a --reason 'no network for children'";

#[derive(Args, Debug)]
#[command(after_help = APPROVALS_EXAMPLES)]
pub struct ApprovalsArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Keep watching: print new requests as they arrive
    #[arg(long)]
    pub watch: bool,
    /// Machine-readable output (the full manifests)
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  hatchery approve a-1f2e3d4c5b6a\n  hatchery approve --json a-1f2e3d4c5b6a"
)]
pub struct ApproveArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Machine-readable output: {"approval_id": …, "approved": true, "child_id": …}
    #[arg(long)]
    pub json: bool,
    /// The request's id (from `hatchery approvals`)
    pub approval_id: String,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  hatchery deny a-1f2e3d4c5b6a --reason 'too much memory'\n  hatchery deny --json a-1f2e3d4c5b6a --reason 'too much memory'"
)]
pub struct DenyArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Machine-readable output: {"approval_id": …, "approved": false, "child_id": null}
    #[arg(long)]
    pub json: bool,
    /// The request's id (from `hatchery approvals`)
    pub approval_id: String,
    /// Why (recorded in the audit trail and sent to the worker)
    #[arg(long)]
    pub reason: String,
}

fn describe(p: &PendingApproval) -> String {
    let m = &p.manifest;
    let r = &m.resources;
    let now = audit::now_ms();
    let mut out = format!(
        "{}  requested by {} ({} s ago, denied in {} s unless decided)\n",
        p.approval_id,
        p.requested_by,
        now.saturating_sub(p.requested_at_ms) / 1000,
        p.deadline_ms.saturating_sub(now) / 1000
    );
    out.push_str(&format!("  why:        {}\n", shown(&p.why)));
    out.push_str(&format!("  needs:      {}\n", shown(&p.rules.join("; "))));
    out.push_str(&format!(
        "  child:      {} at depth {} under {}\n",
        m.worker_id,
        m.depth.get(),
        m.parent_id.as_ref().map(|p| p.as_str()).unwrap_or("-")
    ));
    out.push_str(&format!(
        "  command:    {}\n",
        shown::shown_json(&m.command)
    ));
    // What the command starts with: an interpreter reads some variables as code to run
    // (BASH_ENV, LD_PRELOAD), so the person deciding sees them all.
    out.push_str(&format!("  env:        {}\n", shown::shown_json(&m.env)));
    out.push_str(&format!(
        "  cwd:        {}\n",
        shown(m.cwd.as_deref().unwrap_or("/"))
    ));
    out.push_str(&format!(
        "  resources:  {} MiB, {} cores, {} tasks, timeout {} ms, network: controller {}, external {}\n",
        r.memory_limit_mb.get(),
        r.cpu_limit.get(),
        r.pids_limit.get(),
        r.timeout_ms.get(),
        r.network_policy.allow_controller,
        r.network_policy.allow_external
    ));
    if let Some(hosts) = super::inspect::allow_hosts_line(&r.network_policy) {
        out.push_str(&format!("  hosts:      {hosts}\n"));
    }
    out.push_str(&format!("  profile:    {}\n", m.profile));
    let list = |v: &[hatchery::manifest::ExposedPath]| {
        shown(
            &v.iter()
                .map(|p| p.as_str().to_string())
                .collect::<Vec<_>>()
                .join(" "),
        )
    };
    out.push_str(&format!(
        "  read-only:  {}\n",
        list(&m.filesystem.read_only)
    ));
    out.push_str(&format!(
        "  read-write: {}\n",
        list(&m.filesystem.read_write)
    ));
    if let Some(exec) = &m.filesystem.allow_exec {
        let exec: Vec<&str> = exec.iter().map(|p| p.as_str()).collect();
        out.push_str(&format!("  allow-exec: {}\n", shown(&exec.join(" "))));
    }
    out.push_str(&format!(
        "  expires at: {}\n",
        audit::format_time(m.expires_at.get().saturating_mul(1000))
    ));
    out.push_str(&format!("  signature:  {}\n", m.signature));
    out
}

fn fetch(socket: &SocketArg) -> anyhow::Result<Vec<PendingApproval>> {
    match socket.call(&ApiRequest::Approvals(NoFields {}))? {
        ApiResponse::Approvals { pending } => Ok(pending),
        ApiResponse::Error { message } => anyhow::bail!("{message}"),
        other => anyhow::bail!("unexpected answer: {other:?}"),
    }
}

pub fn approvals_main(args: ApprovalsArgs) -> i32 {
    let mut seen = BTreeSet::new();
    loop {
        let pending = match fetch(&args.socket) {
            Ok(p) => p,
            Err(e) => {
                error_line!("{e:#}");
                return 1;
            }
        };
        if args.json && !args.watch {
            out_json(&pending);
            return 0;
        }
        let ids: BTreeSet<String> = pending.iter().map(|p| p.approval_id.clone()).collect();
        for p in &pending {
            if seen.insert(p.approval_id.clone()) {
                if args.json {
                    outln(&hatchery::text::to_json(p).unwrap_or_default());
                } else {
                    outln(&fold_fields(&describe(p), shown::screen_width()));
                }
            }
        }
        if args.watch {
            for gone in seen.difference(&ids).cloned().collect::<Vec<_>>() {
                outln(&format!("{gone}: decided"));
                seen.remove(&gone);
            }
        } else {
            if pending.is_empty() {
                outln("no requests waiting for approval");
            }
            return 0;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn decided(resp: anyhow::Result<ApiResponse>, json: bool) -> i32 {
    match resp {
        Ok(ApiResponse::Decided {
            approval_id,
            approved,
            child_id,
        }) => {
            if json {
                out_json(&serde_json::json!({
                    "approval_id": approval_id, "approved": approved, "child_id": child_id,
                }));
            } else if approved {
                outln(&format!(
                    "{approval_id}: approved; worker {} is starting",
                    child_id.map(|c| c.to_string()).unwrap_or_default()
                ));
            } else {
                outln(&format!("{approval_id}: denied"));
            }
            0
        }
        Ok(ApiResponse::Denied { event, reason }) => {
            error_line!("approved, but the contract refuses it now ({event}): {reason}");
            3
        }
        Ok(ApiResponse::Error { message }) => {
            error_line!("{message}");
            1
        }
        Ok(other) => {
            error_line!("unexpected answer: {other:?}");
            1
        }
        Err(e) => {
            error_line!("{e:#}");
            1
        }
    }
}

pub fn approve_main(args: ApproveArgs) -> i32 {
    decided(
        args.socket.call(&ApiRequest::Approve {
            approval_id: args.approval_id,
        }),
        args.json,
    )
}

pub fn deny_main(args: DenyArgs) -> i32 {
    decided(
        args.socket.call(&ApiRequest::Deny {
            approval_id: args.approval_id,
            reason: args.reason,
        }),
        args.json,
    )
}
