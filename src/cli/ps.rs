//! `hatchery ps`: the controller's workers as a table or a tree (or JSON).

use clap::Args;

use hatchery::controller::protocol::{ApiRequest, ApiResponse, WorkerInfo};

use hatchery::manifest::WorkerId;

use super::controller::{SocketArg, fail, out, out_json, outln, report};
use super::shown::shown;

#[derive(Args, Debug)]
#[command(
    after_help = "Without --all, ended workers are left out (their number is said); --all shows why each ended.\n\nExamples:\n  hatchery ps\n  hatchery ps --all\n  hatchery ps --tree\n  hatchery ps --json"
)]
pub struct PsArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Show the lineage as a tree
    #[arg(long)]
    pub tree: bool,
    /// Machine-readable output (the full worker records, ended ones too)
    #[arg(long)]
    pub json: bool,
    /// Include workers that have ended, and why
    #[arg(long, short)]
    pub all: bool,
    /// Every node's workers, from the cluster this controller is part of
    #[arg(long)]
    pub cluster: bool,
}

pub(super) fn human_bytes(b: Option<u64>) -> String {
    match b {
        Some(b) if b >= 1 << 20 => format!("{}M", b >> 20),
        Some(b) => format!("{}K", b >> 10),
        None => "-".into(),
    }
}

pub(super) fn state(w: &WorkerInfo) -> String {
    match &w.exit {
        Some(e) if e.timed_out => "timed out".into(),
        Some(e) => match e.signal {
            Some(s) => format!("exited(sig {s}{})", if e.oom_killed { ", oom" } else { "" }),
            None if e.oom_killed => format!("exited({}, oom)", e.exit_code),
            None => format!("exited({})", e.exit_code),
        },
        None => w.state.clone(),
    }
}

const HEADER: [&str; 9] = [
    "WORKER", "DEPTH", "STATE", "PID", "MEM", "CPU", "CORES", "PIDS", "COMMAND",
];

fn row(w: &WorkerInfo, indent: &str, why: bool) -> Vec<String> {
    let usage = w.usage.as_ref();
    let mut r = vec![
        format!("{indent}{}", w.worker_id.as_str()),
        w.depth.to_string(),
        state(w),
        w.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
        format!(
            "{}/{}M",
            human_bytes(usage.and_then(|u| u.memory_peak_bytes)),
            w.resources.memory_limit_mb.get()
        ),
        usage
            .and_then(|u| u.cpu_usec)
            .map(|c| format!("{:.2}s", c as f64 / 1e6))
            .unwrap_or_else(|| "-".into()),
        w.resources.cpu_limit.get().to_string(),
        w.resources.pids_limit.get().to_string(),
        short_command(&w.command, if why { 40 } else { 60 }),
    ];
    if why {
        r.push(
            w.exit
                .as_ref()
                .and_then(|e| e.ended_by.as_deref().map(shown))
                .unwrap_or_else(|| {
                    if w.exit.is_some() {
                        "its own exit".into()
                    } else {
                        String::new()
                    }
                }),
        );
    }
    r
}

/// Rows as columns padded to their widest cell (the last column is not padded). Where the
/// screen's width is known, a row wider than it has its last cell folded under a
/// continuation mark (see [`super::shown::field`]), so that a long row cannot wrap into
/// what reads as another.
fn table(rows: &[Vec<String>]) -> Vec<String> {
    let screen = super::shown::table_width();
    let mut widths: Vec<usize> = Vec::new();
    for r in rows {
        for (i, cell) in r.iter().enumerate() {
            let n = cell.chars().count();
            match widths.get_mut(i) {
                Some(w) => *w = (*w).max(n),
                None => widths.push(n),
            }
        }
    }
    rows.iter()
        .map(|r| {
            let last = r.len().saturating_sub(1);
            let mut line = String::new();
            for (i, cell) in r.iter().enumerate() {
                if i < last {
                    let pad = widths.get(i).copied().unwrap_or(0);
                    line.push_str(&format!("{cell:<pad$}  "));
                }
            }
            let cell = r.get(last).map(|c| c.trim_end()).unwrap_or_default();
            match screen {
                Some(width) => super::shown::field(&line, cell, width),
                None => format!("{line}{cell}"),
            }
            .trim_end()
            .to_string()
        })
        .collect()
}

/// The command on one line (its line breaks shown as escapes), at most `max` characters.
fn short_command(argv: &[String], max: usize) -> String {
    let joined = shown(&argv.join(" "));
    let mut out: String = joined.chars().take(max).collect();
    if out.len() < joined.len() {
        out.push('…');
    }
    out
}

fn tree_rows(
    workers: &[WorkerInfo],
    id: &WorkerId,
    depth: usize,
    why: bool,
    out: &mut Vec<Vec<String>>,
) {
    let Some(w) = workers.iter().find(|w| &w.worker_id == id) else {
        return;
    };
    let indent = if depth == 0 {
        String::new()
    } else {
        format!("{}└─ ", "   ".repeat(depth.saturating_sub(1)))
    };
    out.push(row(w, &indent, why));
    for child in &w.children {
        tree_rows(workers, child, depth.saturating_add(1), why, out);
    }
}

/// `ps --cluster`: every node's workers as the cluster holds them, a tree with
/// `--tree`.
fn cluster_ps(args: &PsArgs) -> i32 {
    use hatchery::controller::cluster::WorkerRecord;
    let resp = match args.socket.call(&ApiRequest::ClusterPs(Default::default())) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let ApiResponse::ClusterWorkers {
        nodes,
        workers,
        kill_switch,
    } = resp
    else {
        return report(resp);
    };
    if args.json {
        out_json(
            &serde_json::json!({ "kill_switch": kill_switch, "nodes": nodes, "workers": workers }),
        );
        return 0;
    }
    if kill_switch {
        outln("CLUSTER KILL SWITCH ENGAGED: nothing new may start on any node");
    }
    let row = |w: &WorkerRecord, indent: &str| -> Vec<String> {
        vec![
            format!("{indent}{}", w.worker_id.as_str()),
            shown(&w.node),
            w.depth.to_string(),
            format!("{}M", w.memory_limit_mb),
            w.cpu_limit.to_string(),
        ]
    };
    let mut rows = vec![
        ["WORKER", "NODE", "DEPTH", "MEM", "CORES"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    if args.tree {
        // Children after their parent, indented; each record once, whatever the records say.
        let mut seen = std::collections::BTreeSet::new();
        let mut stack: Vec<(&WorkerRecord, usize)> = workers
            .iter()
            .filter(|w| {
                w.parent_id
                    .as_ref()
                    .is_none_or(|p| !workers.iter().any(|x| &x.worker_id == p))
            })
            .rev()
            .map(|w| (w, 0))
            .collect();
        while let Some((w, depth)) = stack.pop() {
            if !seen.insert(w.worker_id.clone()) {
                continue;
            }
            let indent = if depth == 0 {
                String::new()
            } else {
                format!("{}└─ ", "   ".repeat(depth.saturating_sub(1)))
            };
            rows.push(row(w, &indent));
            for c in workers
                .iter()
                .filter(|c| c.parent_id.as_ref() == Some(&w.worker_id))
                .rev()
            {
                stack.push((c, depth.saturating_add(1)));
            }
        }
    } else {
        rows.extend(workers.iter().map(|w| row(w, "")));
    }
    if workers.is_empty() {
        outln("no workers");
    } else {
        let mut text = table(&rows).join("\n");
        text.push('\n');
        out(&text);
    }
    let names: Vec<String> = nodes.iter().map(|n| shown(&n.node)).collect();
    outln(&format!(
        "({} live nodes: {})",
        nodes.len(),
        names.join(", ")
    ));
    0
}

pub fn ps_main(args: PsArgs) -> i32 {
    if args.cluster {
        return cluster_ps(&args);
    }
    let resp = match args.socket.call(&ApiRequest::Ps(Default::default())) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let ApiResponse::Workers {
        workers,
        kill_switch,
    } = resp
    else {
        return report(resp);
    };
    if args.json {
        out_json(&serde_json::json!({ "kill_switch": kill_switch, "workers": workers }));
        return 0;
    }
    let total = workers.len();
    let workers: Vec<WorkerInfo> = workers
        .into_iter()
        .filter(|w| args.all || w.exit.is_none())
        .collect();
    let hidden = total.saturating_sub(workers.len());
    if kill_switch {
        outln("KILL SWITCH ENGAGED: nothing new may start");
    }
    let why = args.all;
    let mut rows = Vec::new();
    if args.tree {
        for root in workers.iter().filter(|w| {
            w.parent_id
                .as_ref()
                .is_none_or(|p| !workers.iter().any(|x| &x.worker_id == p))
        }) {
            tree_rows(&workers, &root.worker_id, 0, why, &mut rows);
        }
    } else {
        rows.extend(workers.iter().map(|w| row(w, "", why)));
    }
    if rows.is_empty() {
        outln("no workers");
    } else {
        let mut header: Vec<String> = HEADER.iter().map(|h| h.to_string()).collect();
        if why {
            header.push("ENDED BY".into());
        }
        rows.insert(0, header);
        let mut text = table(&rows).join("\n");
        text.push('\n');
        out(&text);
    }
    if hidden > 0 {
        outln(&format!(
            "({hidden} ended worker{} not shown: `hatchery ps --all` shows them and why they ended)",
            if hidden == 1 { "" } else { "s" }
        ));
    }
    0
}
