//! `hatchery controller` and the commands that talk to it: `spawn`, `ps`, `kill`,
//! `kill-switch`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use hatchery::audit::AnchorTarget;
use hatchery::controller::client::ApiClient;
use hatchery::controller::protocol::{ApiRequest, ApiResponse, WorkerInfo};
use hatchery::controller::{self, ControllerOptions, ControllerPaths};
use hatchery::manifest::WorkerId;
use hatchery::units;

use super::job::{JobArgs, parse_worker_id};

/// How long a client waits for the controller (kill switches wait for every exit).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Args, Debug, Clone)]
pub struct SocketArg {
    /// The controller's API socket (default: /run/hatchery/controller.sock for root;
    /// otherwise $XDG_RUNTIME_DIR/hatchery/controller.sock, else in the state directory)
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

impl SocketArg {
    fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(controller::paths::default_socket)
    }

    pub fn call(&self, request: &ApiRequest) -> anyhow::Result<ApiResponse> {
        let path = self.path();
        // A socket in the /tmp fallback is only trusted in a directory of the caller's: a
        // stranger's directory could hold a stranger's controller.
        controller::paths::check_fallback_base(&path, false).map_err(anyhow::Error::msg)?;
        let mut client = ApiClient::connect(&path)?;
        Ok(client.call(request, CALL_TIMEOUT)?)
    }
}

const CONTROLLER_EXAMPLES: &str = "\
Runs in the foreground until SIGINT or SIGTERM (which stop every worker first).

The audit trail: a state directory whose trail vanished (removed or emptied) is refused;
--new-audit-trail begins a new one (recorded). --audit-anchor keeps every synced head
outside the state directory, so a trail rolled back to an older copy is refused.

Examples:
  hatchery controller
  hatchery controller --contract contract.toml --state-dir /var/lib/hatchery
  hatchery controller --socket /tmp/h.sock --state-dir /tmp/h-state --heartbeat-timeout 10s
  hatchery controller --audit-anchor /var/log/hatchery-audit.anchor
  hatchery controller --audit-anchor syslog
  hatchery controller --new-audit-trail      # only where the trail vanished";

#[derive(Args, Debug)]
#[command(after_help = CONTROLLER_EXAMPLES)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Audit trail, worker logs, lock and key (default /var/lib/hatchery for root;
    /// otherwise $XDG_STATE_HOME/hatchery, else ~/.local/state/hatchery, else
    /// /tmp/hatchery-UID/state, used only if /tmp/hatchery-UID is the caller's alone)
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Replication contract (TOML; built-in defaults without it)
    #[arg(long, value_name = "FILE")]
    pub contract: Option<PathBuf>,
    /// Manifest signing key file, created on first start (default STATE_DIR/controller.key)
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Reap workers silent for this long
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = units::parse_duration)]
    pub heartbeat_timeout: Duration,
    /// Reap workers that do not register within this long
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = units::parse_duration)]
    pub register_timeout: Duration,
    /// Heartbeat interval suggested to workers
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = units::parse_duration)]
    pub heartbeat_interval: Duration,
    /// Let members of this group (a name or a number) use the API socket
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    pub socket_group: Option<u32>,
    /// Start workers even where their limits cannot be enforced here (reported per worker)
    #[arg(long)]
    pub allow_degraded: bool,
    /// Also write every synced head of the audit trail here, outside the state directory:
    /// an append-only FILE, `syslog` (/dev/log, tag hatchery-audit) or `syslog:SOCKET`.
    /// The trail is checked against a FILE at start; a rolled-back trail is refused
    #[arg(long, value_name = "FILE|syslog")]
    pub audit_anchor: Option<AnchorTarget>,
    /// Begin a new audit trail where the earlier one vanished (removed or emptied); its
    /// first entry records why. Refused where a trail exists
    #[arg(long)]
    pub new_audit_trail: bool,
    /// Most output (stdout and stderr together) one worker's log keeps when its manifest
    /// sets no cap; past it the worker's output is cut
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = units::parse_output_cap)]
    pub worker_output_cap: u64,
    /// Most output every worker's log keeps together while the controller runs; past it
    /// every worker's output is cut
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = units::parse_output_cap)]
    pub worker_output_total: u64,
}

/// A group by name (`/etc/group`, NSS) or by number.
fn parse_group(s: &str) -> Result<u32, String> {
    if let Ok(gid) = s.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(s) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(format!(
            "no group named {s:?} on this host (`getent group` lists them; a number is taken as a gid)"
        )),
        Err(e) => Err(format!("cannot look up the group {s:?}: {e}")),
    }
}

pub fn controller_main(args: ControllerArgs) -> i32 {
    let paths = ControllerPaths::resolve(args.socket.socket, args.state_dir, args.key);
    let opts = ControllerOptions {
        paths,
        contract: args.contract,
        heartbeat_timeout: args.heartbeat_timeout,
        register_timeout: args.register_timeout,
        heartbeat_interval: args.heartbeat_interval,
        allow_degraded: args.allow_degraded,
        socket_group: args.socket_group,
        audit_anchor: args.audit_anchor,
        new_audit_trail: args.new_audit_trail,
        worker_output_cap: args.worker_output_cap,
        worker_output_total: args.worker_output_total,
    };
    tracing::info!(socket = %opts.paths.socket.display(), state_dir = %opts.paths.state_dir.display(), "controller starting");
    match controller::run(opts) {
        Ok(()) => 0,
        Err(e) => {
            super::logging::error_line(&format!("controller: {e}"));
            match e {
                // A contract that does not parse is bad input, like any file named on the
                // command line.
                controller::ControllerError::Contract(_) => super::exit::USAGE,
                _ => super::exit::FAILURE,
            }
        }
    }
}

const SPAWN_EXAMPLES: &str = "\
Examples:
  hatchery spawn -- sh -c 'hatchery agent register && sleep 60'
  hatchery spawn --memory 128M --cpus 0.25 --pids 32 -- python3 /opt/agent/worker.py
  hatchery spawn --parent w-3f2a9c1b0d4e -- sh -c 'echo child'";

#[derive(Args, Debug)]
#[command(after_help = SPAWN_EXAMPLES)]
pub struct SpawnArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Issue a child manifest of this worker (subject to the contract) instead of a root one
    #[arg(long, value_name = "ID", value_parser = parse_worker_id)]
    pub parent: Option<WorkerId>,
    #[command(flatten)]
    pub job: JobArgs,
}

fn report(resp: ApiResponse) -> i32 {
    match resp {
        ApiResponse::Denied { event, reason } => {
            super::logging::error_line(&format!("denied ({event}): {reason}"));
            super::exit::DENIED
        }
        ApiResponse::Error { message } => {
            super::logging::error_line(&message);
            super::exit::FAILURE
        }
        other => {
            super::logging::error_line(&format!("unexpected answer: {other:?}"));
            super::exit::FAILURE
        }
    }
}

fn fail(e: anyhow::Error) -> i32 {
    super::fail(&e)
}

pub fn spawn_main(args: SpawnArgs) -> i32 {
    // What the command line asks for is checked here, before the controller is asked:
    // a mistake in it is bad input (2), as in `run`.
    let request = match args.job.request() {
        Ok(r) => r,
        Err(e) => return fail(super::BadInput(format!("{e:#}")).into()),
    };
    match args.socket.call(&ApiRequest::Spawn {
        parent: args.parent,
        request: Box::new(request),
    }) {
        Ok(ApiResponse::Spawned { worker_id, .. }) => {
            println!("{worker_id}");
            0
        }
        Ok(other) => report(other),
        Err(e) => fail(e),
    }
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  hatchery ps\n  hatchery ps --tree\n  hatchery ps --json")]
pub struct PsArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Show the lineage as a tree
    #[arg(long)]
    pub tree: bool,
    /// Machine-readable output (the full worker records)
    #[arg(long)]
    pub json: bool,
    /// Include workers that have ended
    #[arg(long, short)]
    pub all: bool,
}

fn human_bytes(b: Option<u64>) -> String {
    match b {
        Some(b) if b >= 1 << 20 => format!("{}M", b >> 20),
        Some(b) => format!("{}K", b >> 10),
        None => "-".into(),
    }
}

fn line(w: &WorkerInfo, indent: &str) -> String {
    let usage = w.usage.as_ref();
    let state = match (&w.exit, w.state.as_str()) {
        (Some(e), _) => match e.signal {
            Some(s) => format!("exited(sig {s}{})", if e.oom_killed { ", oom" } else { "" }),
            None => format!("exited({})", e.exit_code),
        },
        (None, s) => s.to_string(),
    };
    format!(
        "{indent}{:<16} depth={} {:<12} pid={:<7} mem={}/{}M cpu={}s cores={} pids<={} {}",
        w.worker_id.as_str(),
        w.depth,
        state,
        w.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
        human_bytes(usage.and_then(|u| u.memory_peak_bytes)),
        w.resources.memory_limit_mb.get(),
        usage
            .and_then(|u| u.cpu_usec)
            .map(|c| format!("{:.2}", c as f64 / 1e6))
            .unwrap_or_else(|| "-".into()),
        w.resources.cpu_limit.get(),
        w.resources.pids_limit.get(),
        short_command(&w.command),
    )
}

/// The command on one line, at most 60 characters.
fn short_command(argv: &[String]) -> String {
    let joined = argv.join(" ");
    let first = joined.lines().next().unwrap_or("");
    let mut out: String = first.chars().take(60).collect();
    if out.len() < joined.len() {
        out.push('…');
    }
    out
}

fn print_tree(workers: &[WorkerInfo], id: &WorkerId, depth: usize, out: &mut Vec<String>) {
    let Some(w) = workers.iter().find(|w| &w.worker_id == id) else {
        return;
    };
    let indent = if depth == 0 {
        String::new()
    } else {
        format!("{}└─ ", "   ".repeat(depth - 1))
    };
    out.push(line(w, &indent));
    for child in &w.children {
        print_tree(workers, child, depth + 1, out);
    }
}

pub fn ps_main(args: PsArgs) -> i32 {
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
    let workers: Vec<WorkerInfo> = workers
        .into_iter()
        .filter(|w| args.all || args.json || w.exit.is_none())
        .collect();
    if args.json {
        let v = serde_json::json!({ "kill_switch": kill_switch, "workers": workers });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return 0;
    }
    if kill_switch {
        println!("KILL SWITCH ENGAGED: nothing new may start");
    }
    let mut out = Vec::new();
    if args.tree {
        for root in workers.iter().filter(|w| {
            w.parent_id
                .as_ref()
                .is_none_or(|p| !workers.iter().any(|x| &x.worker_id == p))
        }) {
            print_tree(&workers, &root.worker_id, 0, &mut out);
        }
    } else {
        out.extend(workers.iter().map(|w| line(w, "")));
    }
    if out.is_empty() {
        println!("no workers");
    }
    for l in out {
        println!("{l}");
    }
    0
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  hatchery kill w-3f2a9c1b0d4e\n  hatchery kill --recursive w-3f2a9c1b0d4e"
)]
pub struct KillArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Also kill every descendant
    #[arg(long, short)]
    pub recursive: bool,
    /// The worker
    #[arg(value_parser = parse_worker_id)]
    pub worker_id: WorkerId,
}

pub fn kill_main(args: KillArgs) -> i32 {
    match args.socket.call(&ApiRequest::Kill {
        worker_id: args.worker_id,
        recursive: args.recursive,
    }) {
        Ok(ApiResponse::Killed {
            workers,
            elapsed_ms,
        }) => {
            println!(
                "killed {} worker{} in {elapsed_ms} ms: {}",
                workers.len(),
                if workers.len() == 1 { "" } else { "s" },
                workers
                    .iter()
                    .map(|w| w.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            0
        }
        Ok(other) => report(other),
        Err(e) => fail(e),
    }
}

#[derive(Args, Debug)]
#[command(
    after_help = "Kills every worker (whole sandboxes and their cgroups) and refuses any new one until released.\n\nExamples:\n  hatchery kill-switch\n  hatchery kill-switch --release"
)]
pub struct KillSwitchArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Reopen: allow new workers again
    #[arg(long)]
    pub release: bool,
}

pub fn kill_switch_main(args: KillSwitchArgs) -> i32 {
    match args.socket.call(&ApiRequest::KillSwitch {
        release: args.release,
    }) {
        Ok(ApiResponse::KillSwitch {
            engaged: true,
            killed,
            elapsed_ms,
        }) => {
            println!(
                "kill switch engaged: {killed} workers killed in {elapsed_ms} ms; nothing new may start"
            );
            0
        }
        Ok(ApiResponse::KillSwitch { engaged: false, .. }) => {
            println!("kill switch released");
            0
        }
        Ok(other) => report(other),
        Err(e) => fail(e),
    }
}
