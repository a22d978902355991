//! The launcher's protocol and loop. The controller sends [`LauncherRequest`]s (a launch
//! carries the worker's end of its socketpair as an attached descriptor); the launcher
//! answers with [`LauncherEvent`]s: started, failed to start, usage, exited.
//!
//! The loop is single-threaded and never blocks on a sandbox: it polls its request socket
//! and every sandbox's pidfd, and kills sandboxes whose deadline has passed.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};

use crate::broker::{Broker, BrokerConfig, EgressEntry};
use crate::egress::Resolution;
use crate::paths::Dir;
use crate::sandbox::launch::warm::{self, ClaimError, Prepared};
use crate::sandbox::output::{OutputBudget, OutputPump};
use crate::sandbox::{self, Host, Sandbox, wait};

pub use super::launch_protocol::{LaunchSpec, LauncherEvent, LauncherRequest, LiveUsage};
use super::link::{Inbox, Incoming};
use super::warm_pool::WarmPool;
use super::wire::{self, FrameError};

mod worker_spec;
use worker_spec::Compiled;

/// Where the hatchery binary appears inside workers (for `hatchery agent`).
pub const AGENT_BIN_DIR: &str = "/run/hatchery/bin";

/// How long a worker's broker gets to report once the worker has ended.
const BROKER_STOP: Duration = Duration::from_secs(1);
/// Egress entries per launcher event (a frame stays far below the frame limit).
const EGRESS_PER_EVENT: usize = 64;

/// A started worker: its sandbox, deadline, log pump and egress broker settings.
struct Launched {
    sandbox: Sandbox,
    deadline: Option<Instant>,
    output: Option<OutputPump>,
    egress: Option<BrokerConfig>,
    /// Its sandbox came from the warm pool.
    prepared_ahead: bool,
}

struct Running {
    sandbox: Sandbox,
    deadline: Option<Instant>,
    timed_out: bool,
    /// The worker's stdout and stderr on their way to its log, under a cap.
    output: Option<OutputPump>,
    /// The worker's egress broker, when its manifest allows hosts.
    broker: Option<Broker>,
}

struct Launcher {
    host: Host,
    /// The state directory's `workers/`, held open since before any worker ran.
    workers: Dir,
    /// The device of its file system (where the audit trail is too).
    state_dev: Option<u64>,
    profiles: HashMap<String, Compiled>,
    running: HashMap<String, Running>,
    events: UnixStream,
    /// What every worker's log may still take, together, in this launcher's run.
    output_budget: OutputBudget,
    /// The operator's name resolution for every worker's broker (`--resolve`).
    resolution: Resolution,
    /// In a cluster: when (CLOCK_BOOTTIME ms) every worker must be dead unless a later
    /// deadline comes, and whether it has passed (then nothing starts).
    fence: Option<u64>,
    fenced: bool,
    /// Sandboxes prepared ahead of their workers.
    pool: WarmPool,
}

impl Launcher {
    /// Fences when the deadline has passed (every worker killed, nothing starts), lifts
    /// the fence when a later deadline came; how long until the deadline, if one is due.
    fn fence_check(&mut self) -> Option<Duration> {
        let at = self.fence?;
        let now = crate::controller::cluster::clock::boottime_ms();
        if now >= at {
            if !self.fenced {
                self.fenced = true;
                self.kill_all();
            }
            return None;
        }
        self.fenced = false;
        Some(Duration::from_millis(at.saturating_sub(now)))
    }

    fn emit(&mut self, ev: &LauncherEvent) {
        let _ = wire::write_frame(&mut self.events, ev);
    }

    fn launch(&mut self, spec: LaunchSpec, socket: Option<OwnedFd>) {
        let id = spec.worker_id.clone();
        // By the clock, not the last pass's flag: a batch of launches can cross the
        // deadline.
        self.fence_check();
        if self.fenced {
            self.emit(&LauncherEvent::StartFailed {
                worker_id: id,
                error: "this node is fenced: its cluster lease was not renewed in time".into(),
            });
            return;
        }
        match self.try_launch(spec, socket) {
            Ok(Launched {
                mut sandbox,
                deadline,
                output,
                egress,
                prepared_ahead,
            }) => {
                // Workers are killed, never passed a signal: no one reads the gate.
                sandbox.forget_start_gate();
                // A thousand workers must not hold a thousand cgroup directories open each.
                sandbox.release_cgroup_descriptors();
                // Forked while the launcher is single-threaded, as every sandbox is.
                let broker = match egress.map(|cfg| {
                    Broker::start(cfg, sandbox.take_egress_listeners())
                        .map_err(|e| format!("cannot start the egress broker: {e}"))
                }) {
                    Some(Err(error)) => {
                        sandbox.kill();
                        let status = sandbox.reap_status();
                        drop(sandbox.finish(status, false));
                        self.emit(&LauncherEvent::StartFailed {
                            worker_id: id,
                            error,
                        });
                        return;
                    }
                    Some(Ok(b)) => Some(b),
                    None => None,
                };
                let ev = LauncherEvent::Started {
                    worker_id: id.clone(),
                    pid: sandbox.pid(),
                    start_time: u32::try_from(sandbox.pid())
                        .ok()
                        .and_then(crate::sandbox::cgroup::process_start_time),
                    cgroup: sandbox.cgroup_path(),
                    enforcement: serde_json::to_value(&sandbox.enforcement).unwrap_or_default(),
                    prepared_ahead,
                };
                self.running.insert(
                    id,
                    Running {
                        sandbox,
                        deadline,
                        timed_out: false,
                        output,
                        broker,
                    },
                );
                self.emit(&ev);
                // Its start may have crossed the deadline: then it is killed with the rest
                // now, not at the next pass.
                self.fence_check();
            }
            Err(error) => self.emit(&LauncherEvent::StartFailed {
                worker_id: id,
                error,
            }),
        }
    }

    fn try_launch(&mut self, ls: LaunchSpec, socket: Option<OwnedFd>) -> Result<Launched, String> {
        if self.running.contains_key(&ls.worker_id) {
            return Err(format!("worker {} is already running", ls.worker_id));
        }
        let egress = self.egress(&ls)?;
        // A prepared sandbox runs as the ids it was prepared with: the spec names them.
        let prepared = if egress.is_none() {
            self.pool.take()
        } else {
            None
        };
        let host_ids = prepared.as_ref().and_then(Prepared::host_ids);
        let (mut spec, plan, output) =
            match self.worker_sandbox(&ls, egress.as_ref(), host_ids, socket) {
                Ok(parts) => parts,
                Err(e) => {
                    // Nothing was sent to it: it waits for the next worker.
                    if let Some(p) = prepared {
                        self.pool.put_back(p);
                    }
                    return Err(e);
                }
            };
        let claimed = match prepared {
            Some(p) => match p.claim(&spec, &plan) {
                Ok(sb) => Some(sb),
                Err(ClaimError::Failed(e)) => return Err(e.to_string()),
                // Another shape, or gone: started afresh, under the lease on the ids the
                // spec names.
                Err(ClaimError::Unclaimed(lease)) => {
                    if lease.is_some() {
                        spec.id_lease = lease;
                    }
                    None
                }
            },
            None => None,
        };
        let prepared_ahead = claimed.is_some();
        let sb = match claimed {
            Some(sb) => sb,
            None => sandbox::start(&spec, &plan, self.host.cgroups.as_deref())
                .map_err(|e| e.to_string())?,
        };
        self.pool.started(&ls);
        // `spec` (and with it the pipes' write ends) is dropped on return: only the
        // sandbox holds them from here on.
        Ok(Launched {
            sandbox: sb,
            deadline: ls
                .timeout_ms
                .and_then(|ms| Instant::now().checked_add(Duration::from_millis(ms))),
            output,
            egress,
            prepared_ahead,
        })
    }

    /// Prepares one sandbox for the warm pool, when it wants one.
    fn prepare_one(&mut self) {
        let Some(ls) = self.pool.wanted() else {
            return;
        };
        let prepared = self.worker_spec(&ls, None, None).and_then(|spec| {
            let plan = sandbox::preflight(&spec, &self.host, sandbox::Asker::Controller)
                .map_err(|e| e.to_string())?;
            warm::prepare(&spec, &plan, self.host.cgroups.as_deref()).map_err(|e| e.to_string())
        });
        match prepared {
            Ok(p) => self.pool.add(p),
            Err(error) => {
                tracing::warn!(%error, "cannot prepare a sandbox for the warm pool; workers start the ordinary way");
                self.pool.failed();
            }
        }
    }

    /// Passes on what a worker's broker recorded, in frames of bounded size.
    fn emit_egress(&mut self, id: &str, entries: Vec<EgressEntry>, dropped: u64) {
        let mut chunks = entries.chunks(EGRESS_PER_EVENT).peekable();
        if chunks.peek().is_none() && dropped == 0 {
            return;
        }
        let mut dropped = Some(dropped);
        loop {
            let chunk = chunks.next().unwrap_or_default();
            self.emit(&LauncherEvent::Egress {
                worker_id: id.to_string(),
                entries: chunk.to_vec(),
                dropped: dropped.take().unwrap_or(0),
                lost: None,
            });
            if chunks.peek().is_none() {
                break;
            }
        }
    }

    fn reap(&mut self, id: &str) {
        let Some(mut r) = self.running.remove(id) else {
            return;
        };
        let status = r.sandbox.reap_status();
        // A log file never makes the drain wait.
        let output = r.output.as_mut().map(|p| {
            p.drain(None);
            p.summary()
        });
        let outcome = r.sandbox.finish(status, r.timed_out);
        // The sandbox is gone: its connections go with the broker.
        if let Some(b) = r.broker.take() {
            match b.stop(BROKER_STOP) {
                Ok(summary) => self.emit_egress(id, summary.entries, summary.dropped),
                Err(e) => self.emit(&LauncherEvent::Egress {
                    worker_id: id.to_string(),
                    entries: Vec::new(),
                    dropped: 0,
                    lost: Some(e),
                }),
            }
        }
        self.emit(&LauncherEvent::Exited {
            worker_id: id.to_string(),
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            oom_killed: outcome.oom_killed,
            timed_out: outcome.timed_out,
            wall_ms: outcome.wall.as_millis() as u64,
            usage: LiveUsage {
                cpu_usec: outcome.usage.cpu_usec,
                memory_peak_bytes: outcome.usage.memory_peak_bytes,
                pids_peak: outcome.usage.pids_peak,
            },
            error: outcome.failure.map(|f| f.to_string()),
            output_bytes: output.map(|o| o.bytes),
            output_truncated: output.is_some_and(|o| o.truncated),
        });
    }

    fn usage(&mut self) {
        let workers = self
            .running
            .iter()
            .map(|(id, r)| {
                let u = r.sandbox.usage().unwrap_or_default();
                (
                    id.clone(),
                    LiveUsage {
                        cpu_usec: u.cpu_usec,
                        memory_peak_bytes: u.memory_peak_bytes,
                        pids_peak: u.pids_peak,
                    },
                )
            })
            .collect();
        self.emit(&LauncherEvent::Usage { workers });
    }

    fn kill_all(&mut self) {
        for r in self.running.values() {
            r.sandbox.kill();
        }
        self.pool.clear();
    }
}

/// The launcher's main loop; returns its exit status. Every worker's log together takes
/// at most `output_total` bytes in the launcher's run, and never the last sixteenth (at
/// most 64 MiB) of the file system they are written to.
pub fn serve(
    requests: UnixStream,
    events: UnixStream,
    workers: Dir,
    output_total: u64,
    resolution: Resolution,
    warm_pool: usize,
) -> i32 {
    let mut requests = match Inbox::new(requests) {
        Ok(i) => i,
        Err(_) => return 1,
    };
    // Our own session: a terminal's ^C reaches the controller, which stops workers in
    // order; the launcher follows the controller (end of its request stream), not signals.
    crate::sandbox::process::detach_from_terminal_signals();
    // Worker logs leave room on their file system for the audit trail beside them.
    let output_budget = OutputBudget::keeping_room(output_total, workers.as_fd())
        .unwrap_or_else(|_| OutputBudget::new(output_total));
    let mut l = Launcher {
        host: Host::detect(),
        state_dev: workers.stat().ok().map(|st| st.st_dev),
        workers,
        profiles: HashMap::new(),
        running: HashMap::new(),
        events,
        output_budget,
        resolution,
        fence: None,
        fenced: false,
        pool: WarmPool::new(warm_pool_within_fd_limit(warm_pool)),
    };
    let swept = l
        .host
        .cgroups
        .as_ref()
        .map(|m| m.sweep_stale(true))
        .unwrap_or_default();
    l.emit(&LauncherEvent::Ready { swept });
    let mut shutting_down = false;
    loop {
        if shutting_down && l.running.is_empty() {
            break;
        }
        let now = Instant::now();
        // Kill what is past its deadline.
        for r in l.running.values_mut() {
            if !r.timed_out && r.deadline.is_some_and(|d| d <= now) {
                r.timed_out = true;
                r.sandbox.kill();
            }
        }
        let fence_in = l.fence_check();
        // The warm pool is filled only while nothing else is waiting: a poll that finds
        // nothing ready prepares one sandbox.
        let refill = !shutting_down && !l.fenced && l.pool.wants_more();
        let next = l
            .running
            .values()
            .filter(|r| !r.timed_out)
            .filter_map(|r| r.deadline)
            .chain(fence_in.and_then(|d| now.checked_add(d)))
            .chain(refill.then_some(now))
            .min();
        let ids: Vec<String> = l.running.keys().cloned().collect();
        let (request_ready, exited, pool_ended) = {
            let mut fds = Vec::with_capacity(ids.len().saturating_add(1));
            if !shutting_down {
                fds.push(PollFd::new(requests.socket().as_fd(), PollFlags::POLLIN));
            }
            for id in &ids {
                if let Some(r) = l.running.get(id) {
                    fds.push(PollFd::new(r.sandbox.pidfd(), PollFlags::POLLIN));
                }
            }
            // Output pipes and brokers after the pidfds, so the indices above stay as
            // they are.
            for r in l.running.values() {
                if let Some(p) = &r.output {
                    fds.extend(p.poll_fds());
                }
                if let Some(fd) = r.broker.as_ref().and_then(Broker::fd) {
                    fds.push(PollFd::new(fd, PollFlags::POLLIN));
                }
            }
            // Prepared sandboxes last: one that ends is reaped at once.
            let pool_from = fds.len();
            fds.extend(l.pool.pidfds().map(|fd| PollFd::new(fd, PollFlags::POLLIN)));
            match wait::poll_until(&mut fds, next, Some(Duration::from_secs(60))) {
                Ok(0) => {
                    if refill {
                        l.prepare_one();
                    }
                    continue;
                }
                Ok(_) => {}
                Err(_) => break,
            }
            let ready = wait::is_ready;
            let offset = usize::from(!shutting_down);
            let request_ready = !shutting_down && fds.first().is_some_and(ready);
            let exited: Vec<String> = ids
                .iter()
                .enumerate()
                .filter(|(i, _)| fds.get(i.saturating_add(offset)).is_some_and(ready))
                .map(|(_, id)| id.clone())
                .collect();
            let pool_ended = fds.get(pool_from..).is_some_and(|f| f.iter().any(ready));
            (request_ready, exited, pool_ended)
        };
        if pool_ended {
            l.pool.prune();
        }
        // Cheap when nothing is ready: every read and write is non-blocking.
        let mut egress = Vec::new();
        for (id, r) in l.running.iter_mut() {
            if let Some(p) = &mut r.output {
                p.progress();
            }
            if let Some(b) = &mut r.broker {
                let entries = b.take_entries();
                if !entries.is_empty() {
                    egress.push((id.clone(), entries));
                }
            }
        }
        for (id, entries) in egress {
            l.emit_egress(&id, entries, 0);
        }
        for id in exited {
            l.reap(&id);
        }
        l.pool.reap_retired();
        if request_ready {
            let batch = requests.read();
            // A kill switch (or a stop) read in the same batch as launches decided before
            // it cancels them: started, they would only be killed again (a launcher held
            // up, then let go, started a worker after the switch was engaged).
            let stops_at = batch.iter().rposition(|i| {
                matches!(
                    i,
                    Incoming::Request(LauncherRequest::KillAll | LauncherRequest::Shutdown, _)
                        | Incoming::Closed
                )
            });
            for (at, incoming) in batch.into_iter().enumerate() {
                match incoming {
                    Incoming::Request(LauncherRequest::Launch { spec }, _)
                        if stops_at.is_some_and(|s| at < s) =>
                    {
                        l.emit(&LauncherEvent::StartFailed {
                            worker_id: spec.worker_id.clone(),
                            error: "cancelled: the kill switch was engaged before it started"
                                .into(),
                        });
                    }
                    Incoming::Request(LauncherRequest::Launch { spec }, sock) => {
                        l.launch(*spec, sock)
                    }
                    Incoming::Request(LauncherRequest::Kill { worker_id }, _) => {
                        if let Some(r) = l.running.get(&worker_id) {
                            r.sandbox.kill();
                        }
                    }
                    Incoming::Request(LauncherRequest::KillAll, _) => l.kill_all(),
                    Incoming::Request(LauncherRequest::Fence { at_boottime_ms }, _) => {
                        l.fence = Some(at_boottime_ms);
                        l.fence_check();
                    }
                    Incoming::Request(LauncherRequest::Usage, _) => l.usage(),
                    // One bad request is refused; it is never taken for the end.
                    Incoming::Refused(error) => l.emit(&LauncherEvent::Refused { error }),
                    Incoming::Request(LauncherRequest::Shutdown, _) | Incoming::Closed => {
                        // The controller asked us to stop, or is gone: nothing may
                        // outlive it.
                        l.kill_all();
                        // A stop does not wait for the workers to die first, as the kill
                        // switch's answer does.
                        l.pool.tear_down(true);
                        shutting_down = true;
                    }
                }
            }
        }
        l.pool.tear_down(l.running.is_empty());
    }
    l.pool.shut_down();
    if let Some(m) = &l.host.cgroups {
        m.release();
    }
    0
}

/// Descriptors the launcher keeps for each prepared sandbox (pidfd, channel, the cgroup's
/// directory on v2), with room to spare.
const FDS_PER_PREPARED: u64 = 4;
/// Descriptors kept free of the warm pool, for the launcher and the workers it starts.
const FDS_FOR_WORKERS: u64 = 512;

/// The warm pool the launcher's descriptor limit leaves room for: a pool that took every
/// descriptor would make worker launches fail.
fn warm_pool_within_fd_limit(asked: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit};
    let soft = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
    let room = usize::try_from(soft.saturating_sub(FDS_FOR_WORKERS) / FDS_PER_PREPARED)
        .unwrap_or(usize::MAX);
    if asked > room {
        tracing::warn!(
            asked,
            room,
            open_files = soft,
            "the warm pool is cut to what the launcher's open-file limit leaves room for; raise it (LimitNOFILE=, ulimit -n) for a larger pool"
        );
    }
    asked.min(room)
}

/// Reads one event (blocking), for tests and simple clients.
pub fn read_event(sock: &mut impl Read) -> Result<Option<LauncherEvent>, FrameError> {
    wire::read_frame(sock)
}
