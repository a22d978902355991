//! `hatchery controller` and the commands that act through it: `spawn`, `logs`, `kill`,
//! `kill-switch` (the views, `ps` and `inspect`, are in their own modules), with the
//! client plumbing they share.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;

use hatchery::audit::AnchorTarget;
use hatchery::controller::client::ApiClient;
use hatchery::controller::protocol::{ApiRequest, ApiResponse, ExitInfo, WorkerInfo};
use hatchery::controller::warm_pool::MAX_WARM_POOL;
use hatchery::controller::{self, ControllerOptions, ControllerPaths};
use hatchery::manifest::{Manifest, WorkerId};
use hatchery::units;

use super::job::{JobArgs, parse_worker_id};

/// How long a client waits for the controller (kill switches wait for every exit).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `spawn` waits for the launcher to say whether the sandbox started.
const START_WAIT: Duration = Duration::from_secs(60);
/// How often `spawn` and `logs -f` ask again.
const POLL: Duration = Duration::from_millis(100);

/// Writes to stdout. A reader that has gone away (`| head -1`) is quietly written to no
/// more, as in every Unix tool; the command goes on and ends with its own status (a `kill`
/// of several ids still kills them all, a failed `audit verify` still exits 1). Any other
/// failure to write is an error (1).
pub(super) fn out(text: &str) {
    if super::stdout_gone() {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            super::mark_stdout_gone();
            return;
        }
        eprintln!("hatchery: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// [`out`] with a newline.
pub(super) fn outln(text: &str) {
    out(&format!("{text}\n"));
}

/// One JSON document on stdout (through [`out`]).
pub(super) fn out_json(value: &impl serde::Serialize) {
    match hatchery::text::to_json_pretty(value) {
        Ok(text) => outln(&text),
        Err(e) => {
            eprintln!("hatchery: cannot encode the result as JSON: {e}");
            std::process::exit(1);
        }
    }
}

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
        controller::paths::check_fallback_base(&path, controller::paths::BaseUse::Reach)
            .map_err(anyhow::Error::msg)?;
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
  hatchery controller --new-audit-trail      # only where the trail vanished
  hatchery controller --cluster etcd://10.0.0.5:2379,10.0.0.6:2379 --node-id node-a";

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
    /// Let members of this group (a name or a number) use the API socket (to look, spawn and
    /// stop; approvals and releasing the kill switch stay the owner's and root's)
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
    /// every worker's output is cut. Worker logs never take the last sixteenth (at most
    /// 64 MiB) of the state directory's file system: that room is the audit trail's
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = units::parse_output_cap)]
    pub worker_output_total: u64,
    /// Resolve NAME to ADDR for every worker's egress broker, before the host's resolver
    /// (repeatable)
    #[arg(long = "resolve", value_name = "NAME=ADDR", value_parser = super::egress::parse_resolve)]
    pub resolve: Vec<(String, std::net::IpAddr)>,
    /// Keep up to N sandboxes prepared ahead of workers (namespaces, id maps, loopback,
    /// cgroup and root filesystem made): a worker of the last started worker's kind takes
    /// one and starts sooner. They run nothing and count against nothing; the kill switch
    /// removes them [default: 0, max: 1024]
    #[arg(long, value_name = "N", value_parser = parse_warm_pool)]
    pub warm_pool: Option<usize>,
    /// Be one node of a cluster: admission (quota, cooldowns, budgets), lineage and the
    /// kill switch are kept in etcd and hold across every node (needs --node-id)
    #[arg(long, value_name = "etcd://HOST:PORT[,...]", help_heading = "Cluster")]
    pub cluster: Option<String>,
    /// This node's name in the cluster (letters, digits, '.', '_', '-')
    #[arg(long, value_name = "NAME", help_heading = "Cluster")]
    pub node_id: Option<String>,
    /// Prefix of every key the cluster keeps in etcd [default: /hatchery/]
    #[arg(long, value_name = "PREFIX", help_heading = "Cluster")]
    pub cluster_prefix: Option<String>,
    /// CA certificate (PEM) etcd's server certificate is checked against; turns on TLS
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    pub cluster_cacert: Option<PathBuf>,
    /// Client certificate (PEM) for etcd, with --cluster-key
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    pub cluster_cert: Option<PathBuf>,
    /// Client key (PEM) for etcd
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    pub cluster_key: Option<PathBuf>,
    /// This node's lease: a node that cannot renew it kills its workers before it runs
    /// out, and its slots free up when it does [default: 10s]
    #[arg(long, value_name = "DUR", value_parser = units::parse_duration, help_heading = "Cluster")]
    pub cluster_lease_ttl: Option<Duration>,
}

/// `--warm-pool`: a count up to [`MAX_WARM_POOL`].
fn parse_warm_pool(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n <= MAX_WARM_POOL => Ok(n),
        _ => Err(format!(
            "{s:?}: expected a number of sandboxes from 0 to {MAX_WARM_POOL}"
        )),
    }
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
        warm_pool: args.warm_pool.unwrap_or(0),
        egress_resolution: {
            let mut r = hatchery::egress::Resolution::default();
            for (name, addr) in &args.resolve {
                r.insert(name, *addr);
            }
            r
        },
        cluster: controller::cluster::ClusterArgs {
            url: args.cluster,
            node_id: args.node_id,
            prefix: args.cluster_prefix,
            cacert: args.cluster_cacert,
            cert: args.cluster_cert,
            key: args.cluster_key,
            lease_ttl: args.cluster_lease_ttl,
        },
    };
    tracing::info!(socket = %opts.paths.socket.display(), state_dir = %opts.paths.state_dir.display(), "controller starting");
    match controller::run(opts) {
        Ok(()) => 0,
        Err(e) => {
            super::logging::error_line(&format!("controller: {e}"));
            match e {
                // A contract that does not parse is bad input, like any file named on the
                // command line.
                controller::ControllerError::Contract(_)
                | controller::ControllerError::ClusterOptions(_) => super::exit::USAGE,
                _ => super::exit::FAILURE,
            }
        }
    }
}

const SPAWN_EXAMPLES: &str = "\
`spawn` returns once the worker's sandbox has started, printing its id; a sandbox that
cannot be set up (a missing --ro path, a limit this host cannot enforce) exits 125 with
the refusal. --wait then waits for the worker and exits with its status (124 timeout,
137 OOM or killed, 128+N signal N).

A worker speaks the worker protocol (`hatchery agent register`, then a heartbeat within
every --heartbeat-timeout; examples/hatchery_agent.py in Python): one that has not
registered within the controller's --register-timeout (30 s by default) is stopped, and
`ps --all` shows \"reaped: never registered\". A plain command that does not speak it is
started with --no-controller: no socket to the controller, nothing to register, its limits
and --timeout still hold.

A worker has no network but its socket to the controller. --allow-host HOST:PORT
(repeatable) grants it those hosts, through an egress broker outside its sandbox, and
--max-egress caps the bytes it moves; both are signed into its manifest, and its children
get at most the same.

Examples:
  hatchery spawn --no-controller --wait -- sh -c 'echo hello from a worker'
  hatchery spawn --wait -- sh -c 'hatchery agent register && hatchery agent report done'
  hatchery spawn --memory 128M --cpus 0.25 --pids 32 --no-controller -- python3 -c 'print(42)'
  hatchery spawn --json --no-controller -- sleep 60
  hatchery spawn --allow-host pypi.org:443 --allow-host files.pythonhosted.org:443 --max-egress 100M --no-controller -- pip download requests
  hatchery spawn --parent w-3f2a9c1b0d4e -- sh -c 'echo child'";

#[derive(Args, Debug)]
#[command(after_help = SPAWN_EXAMPLES)]
pub struct SpawnArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Issue a child manifest of this worker (subject to the contract) instead of a root one
    #[arg(long, value_name = "ID", value_parser = parse_worker_id)]
    pub parent: Option<WorkerId>,
    /// Wait for the worker to end and exit with its exit status
    #[arg(long)]
    pub wait: bool,
    /// Machine-readable output: one JSON object (worker_id, depth, pid; with --wait, exit)
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub job: JobArgs,
}

pub(super) fn report(resp: ApiResponse) -> i32 {
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

pub(super) fn fail(e: anyhow::Error) -> i32 {
    super::fail(&e)
}

/// One worker, as the controller knows it now.
pub(super) fn inspect(socket: &SocketArg, id: &WorkerId) -> anyhow::Result<(WorkerInfo, Manifest)> {
    match socket.call(&ApiRequest::Inspect {
        worker_id: id.clone(),
    })? {
        ApiResponse::Worker { info, manifest } => Ok((*info, *manifest)),
        ApiResponse::Error { message } => anyhow::bail!("{message}"),
        other => anyhow::bail!("unexpected answer: {other:?}"),
    }
}

/// The exit status a worker's end maps to, as `run` would exit.
pub(super) fn exit_status(e: &ExitInfo) -> i32 {
    if e.timed_out {
        124
    } else if e.oom_killed {
        137
    } else if let Some(sig) = e.signal {
        128i32.saturating_add(sig)
    } else {
        e.exit_code
    }
}

pub fn spawn_main(args: SpawnArgs) -> i32 {
    let request = match args.job.request() {
        Ok(r) => r,
        // What the command line asks for is checked here, before the controller is asked:
        // a mistake in it is bad input (2), as in `run`.
        Err(e) => return fail(super::BadInput(format!("{e:#}")).into()),
    };
    let (worker_id, depth) = match args.socket.call(&ApiRequest::Spawn {
        parent: args.parent,
        request: Box::new(request),
    }) {
        Ok(ApiResponse::Spawned { worker_id, depth }) => (worker_id, depth),
        Ok(other) => return report(other),
        Err(e) => return fail(e),
    };
    // The launcher starts the sandbox after the answer: wait for its word.
    let started = Instant::now();
    let info = loop {
        let info = match inspect(&args.socket, &worker_id) {
            Ok((info, _)) => info,
            Err(e) => return fail(e.context(format!("worker {worker_id} was issued"))),
        };
        if info.pid.is_some() || info.exit.is_some() {
            break info;
        }
        if started.elapsed() > START_WAIT {
            eprintln!(
                "hatchery: worker {worker_id} was issued, but its sandbox had not started after {} s (`hatchery ps` shows it)",
                START_WAIT.as_secs()
            );
            return 1;
        }
        std::thread::sleep(POLL);
    };
    if info.pid.is_none() {
        let why = info
            .exit
            .as_ref()
            .and_then(|e| e.ended_by.clone())
            .unwrap_or_else(|| "it ended before it started".into());
        let why = why.strip_prefix("could not start: ").unwrap_or(&why);
        if args.json {
            out_json(&serde_json::json!({
                "worker_id": worker_id, "depth": depth, "started": false, "error": why,
            }));
        }
        eprintln!(
            "hatchery: worker {worker_id} could not start: {}",
            super::shown::shown(why)
        );
        return 125;
    }
    if !args.wait {
        if args.json {
            out_json(&serde_json::json!({
                "worker_id": worker_id, "depth": depth, "started": true, "pid": info.pid,
            }));
        } else {
            outln(worker_id.as_str());
        }
        return 0;
    }
    if !args.json {
        outln(worker_id.as_str());
    }
    let exit = loop {
        match inspect(&args.socket, &worker_id) {
            Ok((WorkerInfo { exit: Some(e), .. }, _)) => break e,
            Ok(_) => std::thread::sleep(POLL),
            Err(e) => return fail(e.context(format!("waiting for worker {worker_id}"))),
        }
    };
    if args.json {
        out_json(&serde_json::json!({
            "worker_id": worker_id, "depth": depth, "started": true, "pid": info.pid,
            "exit": exit, "status": exit_status(&exit),
        }));
    } else if let Some(why) = &exit.ended_by {
        eprintln!(
            "hatchery: worker {worker_id} ended: {}",
            super::shown::shown(why)
        );
    }
    exit_status(&exit)
}

#[derive(Args, Debug)]
#[command(
    after_help = "The worker's stdout and stderr together, as its log keeps them (cut at its output cap).\n\nExamples:\n  hatchery logs w-3f2a9c1b0d4e\n  hatchery logs -f w-3f2a9c1b0d4e      # until the worker ends"
)]
pub struct LogsArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Keep printing what the worker writes until it ends
    #[arg(long, short)]
    pub follow: bool,
    /// The worker (running or ended)
    #[arg(value_parser = parse_worker_id)]
    pub worker_id: WorkerId,
}

pub fn logs_main(args: LogsArgs) -> i32 {
    let mut offset = 0u64;
    loop {
        match args.socket.call(&ApiRequest::Logs {
            worker_id: args.worker_id.clone(),
            offset,
        }) {
            Ok(ApiResponse::Log {
                data,
                next_offset,
                ended,
                cut_at,
            }) => {
                let got = next_offset != offset;
                out(&data);
                if super::stdout_gone() {
                    return 0;
                }
                offset = next_offset;
                if got {
                    continue;
                }
                if let Some(at) = cut_at.filter(|_| ended) {
                    // Said where it cannot be taken for the worker's own output.
                    eprintln!(
                        "hatchery logs: the worker's output was cut at {at} bytes; what it wrote after was dropped (`hatchery inspect {}` says why)",
                        args.worker_id
                    );
                }
                if ended || !args.follow {
                    return 0;
                }
                std::thread::sleep(POLL);
            }
            Ok(other) => return report(other),
            Err(e) => return fail(e),
        }
    }
}

#[derive(Args, Debug)]
#[command(
    after_help = "Waits until each worker's whole sandbox is gone. Exit status 1 if any id is not a running worker (the others are still killed).\n\nExamples:\n  hatchery kill w-3f2a9c1b0d4e\n  hatchery kill w-3f2a9c1b0d4e w-9c1b0d4e3f2a\n  hatchery kill --recursive w-3f2a9c1b0d4e\n  hatchery kill --json w-3f2a9c1b0d4e"
)]
pub struct KillArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Also kill every descendant
    #[arg(long, short)]
    pub recursive: bool,
    /// Machine-readable output: {"killed": [...], "elapsed_ms": N, "errors": [...]}
    #[arg(long)]
    pub json: bool,
    /// The workers
    #[arg(value_parser = parse_worker_id, required = true, num_args = 1.., value_name = "ID")]
    pub worker_ids: Vec<WorkerId>,
}

pub fn kill_main(args: KillArgs) -> i32 {
    let mut killed: Vec<WorkerId> = Vec::new();
    let mut errors = Vec::new();
    let mut total_ms = 0u64;
    let mut code = 0;
    for id in &args.worker_ids {
        if killed.contains(id) {
            continue; // a descendant of one killed already
        }
        match args.socket.call(&ApiRequest::Kill {
            worker_id: id.clone(),
            recursive: args.recursive,
        }) {
            Ok(ApiResponse::Killed {
                workers,
                elapsed_ms,
            }) => {
                total_ms = total_ms.saturating_add(elapsed_ms);
                if !args.json {
                    outln(&format!(
                        "killed {} worker{} in {elapsed_ms} ms: {}",
                        workers.len(),
                        if workers.len() == 1 { "" } else { "s" },
                        workers
                            .iter()
                            .map(|w| w.as_str())
                            .collect::<Vec<_>>()
                            .join(" ")
                    ));
                }
                killed.extend(workers);
            }
            Ok(ApiResponse::Error { message }) => {
                eprintln!("hatchery: {message}");
                errors.push(serde_json::json!({ "worker_id": id, "error": message }));
                code = 1;
            }
            Ok(other) => {
                code = report(other);
                errors.push(serde_json::json!({ "worker_id": id, "error": "unexpected answer" }));
            }
            Err(e) => {
                // The controller is out of reach: the other ids would fare no better.
                return fail(e);
            }
        }
    }
    if args.json {
        out_json(&serde_json::json!({
            "killed": killed, "elapsed_ms": total_ms, "errors": errors,
        }));
    }
    code
}

#[derive(Args, Debug)]
#[command(
    after_help = "Kills every worker (whole sandboxes and their cgroups) and refuses any new one until released.\nWith --cluster, on every node of the controller's cluster: waits for each live node's\nacknowledgement and prints how long the last took (exit 1 if a node did not answer).\n\nExamples:\n  hatchery kill-switch\n  hatchery kill-switch --release\n  hatchery kill-switch --json"
)]
pub struct KillSwitchArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Reopen: allow new workers again
    #[arg(long)]
    pub release: bool,
    /// On every node of the cluster this controller is part of
    #[arg(long)]
    pub cluster: bool,
    /// Machine-readable output: {"engaged": bool, "killed": N, "elapsed_ms": N}
    #[arg(long)]
    pub json: bool,
}

pub fn kill_switch_main(args: KillSwitchArgs) -> i32 {
    match args.socket.call(&ApiRequest::KillSwitch {
        release: args.release,
        cluster: args.cluster,
    }) {
        Ok(ApiResponse::ClusterKillSwitch {
            engaged,
            killed,
            nodes,
            missing,
            elapsed_ms,
        }) => {
            if args.json {
                out_json(&serde_json::json!({
                    "engaged": engaged, "killed": killed, "elapsed_ms": elapsed_ms,
                    "nodes": nodes, "missing": missing,
                }));
            } else {
                outln(&format!(
                    "cluster kill switch engaged: {} nodes acknowledged, {killed} workers killed; the last acknowledgement came after {elapsed_ms} ms; nothing new may start",
                    nodes.len()
                ));
                for n in &nodes {
                    outln(&format!(
                        "  {}: {} workers killed in {} ms",
                        super::shown::shown(&n.node),
                        n.killed,
                        n.elapsed_ms
                    ));
                }
                for m in &missing {
                    outln(&format!("  {}: no acknowledgement", super::shown::shown(m)));
                }
            }
            if missing.is_empty() {
                0
            } else {
                super::exit::FAILURE
            }
        }
        Ok(ApiResponse::KillSwitch {
            engaged,
            killed,
            elapsed_ms,
        }) => {
            if args.json {
                out_json(&serde_json::json!({
                    "engaged": engaged, "killed": killed, "elapsed_ms": elapsed_ms,
                }));
            } else if engaged {
                outln(&format!(
                    "kill switch engaged: {killed} workers killed in {elapsed_ms} ms; nothing new may start"
                ));
            } else {
                outln("kill switch released");
            }
            0
        }
        Ok(other) => report(other),
        Err(e) => fail(e),
    }
}
