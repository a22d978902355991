//! Real etcd servers on loopback, owned by one test: [`Etcd`] (one member) and
//! [`EtcdCluster`] (several members forming one cluster), for the tests of
//! `controller --cluster`.
//!
//! Every member runs as `setpriv --pdeathsig KILL -- etcd ...`, a direct child of the test:
//! dropping its owner kills it (SIGKILL, then waits for it) and removes its data, and should
//! the test process die first, the kernel kills the member with it. The parent-death signal
//! follows the *thread* that started the member, so start and restart members from the
//! thread that owns them (a test's own thread), not from a short-lived helper thread.
//! Data a killed test process could not remove is removed by the next bed to start.
//!
//! The members write to disk as a real deployment does (etcd 3.4 has no way to skip fsync,
//! and admission latency through etcd is measured with it), with short heartbeat and
//! election timeouts so that a lost leader is replaced within about a second. Ports are
//! picked free on 127.0.0.1; a member that loses its port to another process between the
//! pick and its bind is started again on new ports.
//!
//! etcd missing fails the test loudly: the cluster tests run only where scripts/test.sh
//! installed it (`--features cluster`).

use std::fs::OpenOptions;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tempfile::TempDir;

use super::run_with_timeout;

/// How long a member may take to answer after it is started (a cluster: to elect a leader).
const READY: Duration = Duration::from_secs(30);
/// How long a member may take to exit after SIGTERM before it is killed.
const STOP: Duration = Duration::from_secs(10);
/// The limit around every `etcdctl` run.
const ETCDCTL_LIMIT: Duration = Duration::from_secs(30);
/// Starts tried before a port lost to another process fails the test.
const ATTEMPTS: usize = 3;
/// Data directories (and so command lines) of test members start with this:
/// scripts/check-leftovers.sh looks for such directories and processes naming them.
pub const DIR_PREFIX: &str = "hatchery-etcd-";

static CLUSTERS: AtomicUsize = AtomicUsize::new(0);

/// `name` found on PATH (or in /usr/bin), or the test fails saying how to install it.
fn installed(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not installed: apt-get install {package}"))
}

fn etcd_bin() -> PathBuf {
    installed("etcd", "etcd-server")
}

fn etcdctl_bin() -> PathBuf {
    installed("etcdctl", "etcd-client")
}

/// A command that does not inherit `ETCD_*`/`ETCDCTL_*` settings from the environment
/// (etcd and etcdctl read every flag from them too).
fn clean_command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("ETCD_") || k.starts_with("ETCDCTL_") {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// `etcdctl --endpoints ENDPOINTS ARGS...` (API v3, short timeouts so that a dead member
/// answers quickly), whatever its outcome.
pub fn etcdctl_at(endpoints: &str, args: &[&str]) -> Output {
    let mut cmd = clean_command(&etcdctl_bin());
    cmd.env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            endpoints,
            "--dial-timeout",
            "2s",
            "--command-timeout",
            "5s",
        ])
        .args(args);
    run_with_timeout(&mut cmd, ETCDCTL_LIMIT)
}

/// `etcdctl_at`, its stdout; the test fails with etcdctl's stderr unless it succeeds.
fn etcdctl_must(endpoints: &str, args: &[&str]) -> String {
    let out = etcdctl_at(endpoints, args);
    if !out.status.success() {
        panic!(
            "etcdctl --endpoints {endpoints} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Whether the member at `endpoint` commits a quorum read (`endpoint health`).
fn healthy(endpoint: &str) -> bool {
    etcdctl_at(endpoint, &["--command-timeout", "2s", "endpoint", "health"])
        .status
        .success()
}

/// `n` distinct ports free on 127.0.0.1 at the time of the call (all held until every one
/// is picked, so they differ from each other).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| match TcpListener::bind("127.0.0.1:0") {
            Ok(l) => l,
            Err(e) => panic!("pick a free port on 127.0.0.1: {e}"),
        })
        .collect();
    listeners
        .iter()
        .map(|l| match l.local_addr() {
            Ok(a) => a.port(),
            Err(e) => panic!("pick a free port on 127.0.0.1: {e}"),
        })
        .collect()
}

/// Whether something accepts connections on 127.0.0.1:`port`.
fn accepts(port: u16) -> bool {
    TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )
    .is_ok()
}

/// One etcd process: its name, ports and data directory stay the same across restarts.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    /// `--initial-cluster` (every member's name=peer URL).
    initial_cluster: String,
    /// `--initial-cluster-token`, unique per cluster so that members of two tests' clusters
    /// never join each other even should a port be reused.
    token: String,
    child: Option<Child>,
}

impl Member {
    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// Starts the process (without waiting for it to answer).
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = match OpenOptions::new().create(true).append(true).open(&self.log) {
            Ok(f) => f,
            Err(e) => panic!("open {}: {e}", self.log.display()),
        };
        let stdout = log.try_clone().map(Stdio::from).unwrap_or(Stdio::null());
        let client = format!("http://{}", self.endpoint());
        let peer = self.peer_url();
        let mut cmd = clean_command(Path::new("setpriv"));
        cmd.args(["--pdeathsig", "KILL", "--"])
            .arg(etcd_bin())
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            // A leader is missed after 500 ms (the default is 1 s), and heartbeats go at a
            // tenth of that, as etcd's tuning guide advises.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            // 128 MiB: far more than a test writes; running out raises etcd's NOSPACE
            // alarm, which fails writes loudly instead of growing the disk.
            .args(["--quota-backend-bytes", "134217728"])
            // 3.4 logs through capnslog unless told otherwise, and --log-level is a zap
            // setting; zap to stderr (the log file) keeps it to errors.
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(["--log-level", "error"])
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::from(log));
        match cmd.spawn() {
            Ok(c) => self.child = Some(c),
            Err(e) => panic!("start {cmd:?} (setpriv is in util-linux): {e}"),
        }
    }

    /// Whether the process was started and has not exited.
    fn running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends `signal`, waits up to `limit` for the process to exit, then kills it.
    fn end(&mut self, signal: Signal, limit: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
        let start = Instant::now();
        while matches!(child.try_wait(), Ok(None)) {
            if start.elapsed() > limit {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.wait();
    }

    /// What the process logged so far (errors only), for failure messages.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the last start failed because a port was taken in the meantime.
    fn lost_a_port(&self) -> bool {
        self.log().contains("address already in use")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.end(Signal::SIGKILL, STOP);
    }
}

/// Why a member did not come up: it exited (possibly having lost a port), or it did not
/// answer in time.
enum NotReady {
    LostPort,
    Failed(String),
}

/// Waits until every member answers a quorum read, or one of them exits, or [`READY`]
/// passes.
fn wait_healthy(members: &mut [Member]) -> Result<(), NotReady> {
    let start = Instant::now();
    let mut pending: Vec<usize> = (0..members.len()).collect();
    while !pending.is_empty() {
        for m in members.iter_mut() {
            if !m.running() {
                if m.lost_a_port() {
                    return Err(NotReady::LostPort);
                }
                return Err(NotReady::Failed(format!(
                    "etcd member {} exited at start: {}",
                    m.name,
                    m.log().trim()
                )));
            }
        }
        pending.retain(|&i| members.get(i).is_some_and(|m| !healthy(&m.endpoint())));
        if pending.is_empty() {
            break;
        }
        if start.elapsed() > READY {
            let logs: Vec<String> = members
                .iter()
                .map(|m| format!("{}: {}", m.name, m.log().trim()))
                .collect();
            return Err(NotReady::Failed(format!(
                "etcd did not answer within {READY:?} (no leader elected?): {}",
                logs.join("; ")
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Names the test process owning a bed's directory, for [`remove_stale_dirs`].
const OWNER: &str = "owner.pid";

/// A new directory for a bed's data and logs, after removing those of test processes
/// that are gone.
fn tempdir() -> TempDir {
    remove_stale_dirs();
    let dir = match tempfile::Builder::new().prefix(DIR_PREFIX).tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    if let Err(e) = std::fs::write(dir.path().join(OWNER), std::process::id().to_string()) {
        panic!("write {}: {e}", dir.path().join(OWNER).display());
    }
    dir
}

/// Removes the directories of beds whose test process was killed (its members died with
/// it, but nothing ran their owner's drop). A directory without an owner yet is being set
/// up and is left alone.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for dir in entries.flatten().map(|e| e.path()) {
        let ours = dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(DIR_PREFIX));
        let owner = std::fs::read_to_string(dir.join(OWNER)).unwrap_or_default();
        if ours && !owner.trim().is_empty() && !Path::new("/proc").join(owner.trim()).exists() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// `n` members in `root`, on fresh ports, forming one cluster (not started).
fn members(root: &Path, n: usize) -> Vec<Member> {
    let ports = free_ports(n.saturating_mul(2));
    let token = format!(
        "hatchery-test-{}-{}",
        std::process::id(),
        CLUSTERS.fetch_add(1, Ordering::Relaxed)
    );
    let mut members: Vec<Member> = ports
        .chunks(2)
        .enumerate()
        .map(|(i, p)| Member {
            name: format!("m{i}"),
            client_port: p.first().copied().unwrap_or_default(),
            peer_port: p.get(1).copied().unwrap_or_default(),
            data_dir: root.join(format!("m{i}.etcd")),
            log: root.join(format!("m{i}.log")),
            initial_cluster: String::new(),
            token: token.clone(),
            child: None,
        })
        .collect();
    let initial: Vec<String> = members
        .iter()
        .map(|m| format!("{}={}", m.name, m.peer_url()))
        .collect();
    for m in &mut members {
        m.initial_cluster = initial.join(",");
    }
    members
}

/// Starts `n` members in `root` and waits until they answer, trying new ports when one was
/// taken between the pick and the bind.
fn start_members(root: &Path, n: usize) -> Vec<Member> {
    // Fail on a missing etcd before anything is spawned.
    etcd_bin();
    etcdctl_bin();
    for attempt in 1..=ATTEMPTS {
        let mut ms = members(root, n);
        for m in &mut ms {
            m.spawn();
        }
        match wait_healthy(&mut ms) {
            Ok(()) => return ms,
            Err(NotReady::LostPort) if attempt < ATTEMPTS => {
                drop(ms);
                // The next attempt starts over from empty data directories and logs.
                for i in 0..n {
                    let _ = std::fs::remove_dir_all(root.join(format!("m{i}.etcd")));
                    let _ = std::fs::remove_file(root.join(format!("m{i}.log")));
                }
            }
            Err(NotReady::LostPort) => {
                panic!("etcd lost its ports to other processes {ATTEMPTS} times in a row")
            }
            Err(NotReady::Failed(why)) => panic!("{why}"),
        }
    }
    unreachable!("the last attempt returns or panics")
}

/// One etcd member on loopback with its own data directory. Dropping it kills the process
/// and removes the data.
pub struct Etcd {
    // Declared before `root`: the process is killed before its data directory goes.
    member: Member,
    root: TempDir,
}

impl Etcd {
    /// Starts a member on free loopback ports and waits (bounded) until it commits reads.
    /// Panics if etcd is not installed.
    pub fn start() -> Etcd {
        let root = tempdir();
        let mut members = start_members(root.path(), 1);
        match members.pop() {
            Some(member) => Etcd { member, root },
            None => panic!("no etcd member started"),
        }
    }

    /// `127.0.0.1:PORT`, the client endpoint (what etcdctl's `--endpoints` takes).
    pub fn endpoint(&self) -> String {
        self.member.endpoint()
    }

    /// `etcd://127.0.0.1:PORT`, what `controller --cluster` takes.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoint())
    }

    /// The member's data directory (kept across `stop` and `restart`).
    pub fn data_dir(&self) -> &Path {
        &self.member.data_dir
    }

    /// The directory holding the data directory and the log (removed on drop).
    pub fn dir(&self) -> &Path {
        self.root.path()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.member.child.as_ref().map(Child::id)
    }

    /// Whether the process runs.
    pub fn is_running(&mut self) -> bool {
        self.member.running()
    }

    /// Stops the member (SIGTERM, SIGKILL after 10 s) and waits for it to exit; its data
    /// stays for [`Etcd::restart`].
    pub fn stop(&mut self) {
        self.member.end(Signal::SIGTERM, STOP);
    }

    /// Kills the member (SIGKILL: a crash) and waits for it to exit; its data stays.
    pub fn kill(&mut self) {
        self.member.end(Signal::SIGKILL, STOP);
    }

    /// Starts the member again on the same ports with the same data (stopping it first if
    /// it runs) and waits until it commits reads.
    pub fn restart(&mut self) {
        self.stop();
        self.member.spawn();
        if wait_healthy(std::slice::from_mut(&mut self.member)).is_err() {
            panic!(
                "etcd did not come back on {}: {}",
                self.endpoint(),
                self.member.log().trim()
            );
        }
    }

    /// `etcdctl --endpoints ENDPOINT ARGS...`, its stdout; the test fails unless it
    /// succeeds. E.g. `etcdctl(&["get", "--prefix", "/hatchery/workers/", "-w", "json"])`.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        etcdctl_must(&self.endpoint(), args)
    }

    /// `etcdctl --endpoints ENDPOINT ARGS...`, whatever its outcome.
    pub fn etcdctl_output(&self, args: &[&str]) -> Output {
        etcdctl_at(&self.endpoint(), args)
    }

    /// What the member logged (errors only).
    pub fn log(&self) -> String {
        self.member.log()
    }
}

/// Several etcd members on loopback forming one cluster (a static initial cluster).
/// Dropping it kills every member and removes their data.
pub struct EtcdCluster {
    // Declared before `root`: the processes are killed before their data directories go.
    members: Vec<Member>,
    root: TempDir,
}

impl EtcdCluster {
    /// Starts `n` members and waits (bounded) until a leader is elected and every member
    /// commits reads. Panics if etcd is not installed.
    pub fn start(n: usize) -> EtcdCluster {
        assert!(n > 0, "a cluster needs at least one member");
        let root = tempdir();
        let members = start_members(root.path(), n);
        EtcdCluster { members, root }
    }

    fn member(&self, i: usize) -> &Member {
        match self.members.get(i) {
            Some(m) => m,
            None => panic!("no member {i} in a cluster of {}", self.members.len()),
        }
    }

    fn member_mut(&mut self, i: usize) -> &mut Member {
        let n = self.members.len();
        match self.members.get_mut(i) {
            Some(m) => m,
            None => panic!("no member {i} in a cluster of {n}"),
        }
    }

    /// The number of members (running or not).
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Member `i`'s client endpoint, `127.0.0.1:PORT`.
    pub fn endpoint(&self, i: usize) -> String {
        self.member(i).endpoint()
    }

    /// Every member's client endpoint: `127.0.0.1:A,127.0.0.1:B,...`.
    pub fn endpoints(&self) -> String {
        let all: Vec<String> = self.members.iter().map(Member::endpoint).collect();
        all.join(",")
    }

    /// `etcd://127.0.0.1:A,127.0.0.1:B,...`, what `controller --cluster` takes.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints())
    }

    /// The endpoints of the members that run.
    fn running_endpoints(&mut self) -> Vec<(usize, String)> {
        self.members
            .iter_mut()
            .enumerate()
            .filter_map(|(i, m)| m.running().then(|| (i, m.endpoint())))
            .collect()
    }

    /// The index of the current leader: waits (bounded) until a running member is leader
    /// and every running member that answers agrees on it. Right after the leader is
    /// killed, this waits out the election.
    pub fn leader(&mut self) -> usize {
        let start = Instant::now();
        loop {
            let running = self.running_endpoints();
            let list: Vec<&str> = running.iter().map(|(_, e)| e.as_str()).collect();
            // A member that does not answer is left out of the JSON (etcdctl then exits 1).
            let out = etcdctl_at(
                &list.join(","),
                &[
                    "--command-timeout",
                    "2s",
                    "endpoint",
                    "status",
                    "-w",
                    "json",
                ],
            );
            let last = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let statuses: Vec<Value> = serde_json::from_str(&last).unwrap_or_default();
            let seen: Vec<(String, u64, u64)> = statuses
                .iter()
                .filter_map(|s| {
                    Some((
                        s["Endpoint"].as_str()?.to_string(),
                        s["Status"]["header"]["member_id"].as_u64()?,
                        s["Status"]["leader"].as_u64()?,
                    ))
                })
                .collect();
            let leader =
                seen.iter()
                    .find(|(_, id, leader)| id == leader)
                    .and_then(|(endpoint, id, _)| {
                        let agreed = seen.iter().all(|(_, _, l)| l == id);
                        let index = running.iter().find(|(_, e)| e == endpoint)?.0;
                        agreed.then_some(index)
                    });
            if let Some(i) = leader {
                return i;
            }
            if start.elapsed() > READY {
                panic!("no leader among the running members after {READY:?}: {last}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills member `i` (SIGKILL: a crash) and waits for it to exit; its data stays.
    pub fn kill(&mut self, i: usize) {
        self.member_mut(i).end(Signal::SIGKILL, STOP);
    }

    /// Stops member `i` (SIGTERM, SIGKILL after 10 s) and waits for it to exit.
    pub fn stop(&mut self, i: usize) {
        self.member_mut(i).end(Signal::SIGTERM, STOP);
    }

    /// Whether member `i` runs.
    pub fn is_running(&mut self, i: usize) -> bool {
        self.member_mut(i).running()
    }

    /// Starts member `i` again on the same ports with the same data (stopping it first if
    /// it runs). Waits (bounded) until it commits reads when a majority of the members then
    /// runs, else only until it accepts connections (it cannot answer without a quorum).
    pub fn restart(&mut self, i: usize) {
        self.stop(i);
        self.member_mut(i).spawn();
        let majority = self.running_endpoints().len() > self.members.len() / 2;
        let member = self.member_mut(i);
        if majority {
            if wait_healthy(std::slice::from_mut(member)).is_err() {
                panic!(
                    "etcd member {i} did not come back on {}: {}",
                    member.endpoint(),
                    member.log().trim()
                );
            }
            return;
        }
        let start = Instant::now();
        while !accepts(member.client_port) {
            if !member.running() || start.elapsed() > READY {
                panic!(
                    "etcd member {i} did not come back on {}: {}",
                    member.endpoint(),
                    member.log().trim()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `etcdctl --endpoints STARTED... ARGS...` (every member not killed or stopped), its
    /// stdout; the test fails unless it succeeds.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let started: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(Member::endpoint)
            .collect();
        etcdctl_must(&started.join(","), args)
    }

    /// `etcdctl --endpoints ENDPOINT_i ARGS...` against member `i` alone, whatever its
    /// outcome.
    pub fn etcdctl_at(&self, i: usize, args: &[&str]) -> Output {
        etcdctl_at(&self.endpoint(i), args)
    }

    /// The directory holding the members' data directories and logs (removed on drop).
    pub fn dir(&self) -> &Path {
        self.root.path()
    }

    /// What member `i` logged (errors only).
    pub fn log(&self, i: usize) -> String {
        self.member(i).log()
    }
}

/// Whether a process whose command line names `dir` (a member's data directory) exists.
pub fn member_process_exists(dir: &Path) -> bool {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries.flatten().any(|e| {
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let needle = dir.to_string_lossy();
                !needle.is_empty()
                    && String::from_utf8_lossy(&cmdline)
                        .split('\0')
                        .any(|arg| arg.starts_with(needle.as_ref()))
            })
        })
        .unwrap_or(false)
}

/// The cluster tests count the host's worker cgroups and processes: one at a time within
/// a test binary.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts a controller (socket and state in a directory of its own) that is expected to
/// refuse to start; what it printed and its status. `limit` bounds the wait.
pub fn refused_controller(args: &[&str], limit: Duration) -> Output {
    let dir = super::shared_tempdir();
    run_with_timeout(
        Command::new(super::hatchery())
            .arg("controller")
            .arg("--socket")
            .arg(dir.path().join("c.sock"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(args),
        limit,
    )
}

/// A controller that is node `name` of the cluster at `url`.
pub fn node(
    url: &str,
    name: &str,
    contract: &str,
    extra: &[&str],
) -> super::controller::TestController {
    let mut args = vec!["--cluster", url, "--node-id", name];
    args.extend_from_slice(extra);
    super::controller::TestController::start(contract, &args)
}
