//! Inside the broker process: confinement, then one task per listener and one per
//! connection on a single-threaded runtime, until the supervisor closes the control
//! socket; then the summary goes back on it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Notify, Semaphore, watch};

use super::relay;
use super::{BrokerConfig, EgressEntry, Line, MAX_ENTRIES};
use crate::egress::{Denial, Destination, FakePool, dns, http, policy};

/// Connections one sandbox may hold open through the broker at once.
const MAX_CONNECTIONS: usize = 256;
/// How long a client has to send what the broker must read before deciding.
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection to an allowed host may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections get to record themselves once the broker is stopped.
const STOP_GRACE: Duration = Duration::from_millis(500);
/// How long the last entries get to reach the supervisor.
const FINISH_WITHIN: Duration = Duration::from_secs(3);

/// Entries on their way to the supervisor. However fast a sandbox opens connections,
/// what it causes the supervisor to read (and a controller to audit) stays bounded: at
/// most [`MAX_ENTRIES`] wait, and each kind passes within its own [`Bucket`]. DNS answers
/// and denials cost a sandbox nothing, so they have half of everything to themselves and
/// can never crowd out the connections that carried bytes.
struct Outbox {
    queue: std::collections::VecDeque<EgressEntry>,
    /// How many of the waiting entries are cheap ones.
    cheap: usize,
    dropped: u64,
    cheap_bucket: Bucket,
    connection_bucket: Bucket,
}

/// Entries per second of one kind past the first burst.
const ENTRY_RATE: f64 = 25.0;

/// A token bucket: a burst of half of [`MAX_ENTRIES`], then [`ENTRY_RATE`] a second.
struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn new() -> Bucket {
        Bucket {
            tokens: (MAX_ENTRIES / 2) as f64,
            refilled: Instant::now(),
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let earned = now.saturating_duration_since(self.refilled).as_secs_f64() * ENTRY_RATE;
        self.tokens = (self.tokens + earned).min((MAX_ENTRIES / 2) as f64);
        self.refilled = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

impl Outbox {
    fn new() -> Outbox {
        Outbox {
            queue: Default::default(),
            cheap: 0,
            dropped: 0,
            cheap_bucket: Bucket::new(),
            connection_bucket: Bucket::new(),
        }
    }

    fn admit(&mut self, now: Instant, cheap: bool) -> bool {
        if self.queue.len() >= MAX_ENTRIES || (cheap && self.cheap >= MAX_ENTRIES / 2) {
            return false;
        }
        if cheap {
            self.cheap_bucket.take(now)
        } else {
            self.connection_bucket.take(now)
        }
    }
}

/// What every task of the broker shares.
pub(super) struct State {
    pub(super) config: BrokerConfig,
    pool: Mutex<FakePool>,
    /// Bytes left to move, when there is a budget.
    pub(super) budget: Option<AtomicU64>,
    outbox: Mutex<Outbox>,
    /// Wakes the writer when the outbox has something.
    wake: Notify,
    /// Set once the broker stops: the writer sends the rest and the summary.
    finishing: AtomicBool,
    /// Bytes over every connection, kept as an entry or not.
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    lookups: AtomicU64,
    pub(super) stop: watch::Receiver<bool>,
}

impl State {
    /// Queues an entry for the supervisor: within [`MAX_ENTRIES`] waiting and the
    /// entry rate, else only counted.
    pub(super) fn record(&self, entry: EgressEntry) {
        self.bytes_out.fetch_add(entry.bytes_out, Ordering::SeqCst);
        self.bytes_in.fetch_add(entry.bytes_in, Ordering::SeqCst);
        let cheap = entry.event != "egress_allowed";
        let mut o = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        if o.admit(Instant::now(), cheap) {
            if cheap {
                o.cheap = o.cheap.saturating_add(1);
            }
            o.queue.push_back(entry);
            drop(o);
            self.wake.notify_one();
        } else {
            o.dropped = o.dropped.saturating_add(1);
        }
    }

    /// Takes `want` bytes from the budget: how many may pass (fewer once it is spent).
    pub(super) fn take_budget(&self, want: usize) -> usize {
        let Some(left) = &self.budget else {
            return want;
        };
        let want64 = u64::try_from(want).unwrap_or(u64::MAX);
        let mut granted = 0;
        let _ = left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
            granted = l.min(want64);
            Some(l.saturating_sub(granted))
        });
        usize::try_from(granted).unwrap_or(0)
    }

    pub(super) fn budget_spent(&self) -> bool {
        self.budget
            .as_ref()
            .is_some_and(|b| b.load(Ordering::SeqCst) == 0)
    }

    /// The name behind one of the stub's fake addresses.
    fn pool_name(&self, addr: IpAddr) -> Option<String> {
        self.pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .name_of(addr)
            .map(str::to_string)
    }

    /// Decides on `dest` and `port`: the addresses to try, or why not. Host lookups run
    /// off the runtime's thread, and only for a name already allowed.
    pub(super) async fn decide(
        &self,
        dest: &Destination,
        port: u16,
    ) -> Result<Vec<std::net::SocketAddr>, Denial> {
        let cfg = &self.config;
        // A spent budget ends egress, not only transfers: a connection opened (a knock
        // on a server's door) or a name looked up carries something out too.
        if self.budget_spent() {
            return Err(Denial::BudgetExhausted);
        }
        let mut looked_up: Option<Result<Vec<IpAddr>, String>> = None;
        if let Destination::Name(name) = dest {
            if cfg.allow.allows_name(name, port) && cfg.resolution.lookup(name).is_none() {
                // The name goes to the host's resolver and beyond: its bytes are charged.
                if self.take_budget(name.len()) < name.len() {
                    return Err(Denial::BudgetExhausted);
                }
                self.lookups.fetch_add(1, Ordering::SeqCst);
                looked_up = Some(
                    tokio::net::lookup_host((name.as_str(), port))
                        .await
                        .map(|addrs| addrs.map(|a| a.ip()).collect())
                        .map_err(|e| e.to_string()),
                );
            }
        }
        let mut resolve = |_: &str| {
            looked_up
                .take()
                .unwrap_or_else(|| Err("no lookup was made".into()))
        };
        let addrs = policy::check(&cfg.allow, &cfg.resolution, dest, port, &mut resolve)?;
        // The host's own addresses lead to its services as loopback does (a service on
        // 0.0.0.0 answers on every one of them), so they count as special too: reached
        // only when an entry names the address itself.
        let (own, kept): (Vec<_>, Vec<_>) = addrs
            .into_iter()
            .partition(|a| is_own_address(a.ip()) && !cfg.allow.names_special_addr(a.ip(), port));
        match (kept.is_empty(), own.first()) {
            (true, Some(first)) => Err(Denial::SpecialAddress("this host", first.ip())),
            _ => Ok(kept),
        }
    }

    /// Where a client's connection goes: the CONNECT or URI host as named, or the name
    /// behind a fake address.
    pub(super) fn destination(&self, host: &str) -> Result<Destination, Denial> {
        match host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            Ok(ip) if FakePool::in_pool(ip) => self
                .pool_name(ip)
                .map(Destination::Name)
                .ok_or(Denial::UnknownPoolAddress(ip)),
            Ok(ip) => Ok(Destination::Addr(ip)),
            Err(_) => Ok(Destination::Name(host.to_ascii_lowercase())),
        }
    }
}

/// True when `addr` is one of this host's own addresses: the kernel routes it locally and
/// so picks the address itself as the source, which a UDP socket's connect (it sends
/// nothing) shows. No route means no local address; a probe that cannot be made at all
/// counts as the host's own (refused rather than guessed at).
fn is_own_address(addr: IpAddr) -> bool {
    let any: IpAddr = match addr {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let Ok(probe) = std::net::UdpSocket::bind((any, 0)) else {
        return true;
    };
    if probe.connect((addr, 9)).is_err() {
        return false;
    }
    probe.local_addr().map_or(true, |local| local.ip() == addr)
}

/// The broker process's body: returns its exit status.
pub(super) fn main(config: BrokerConfig, listeners: Vec<OwnedFd>, control: StdUnixStream) -> i32 {
    // Nothing of the caller's (its terminal above all) stays within reach.
    if let Ok(null) = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
    // Nor as its controlling terminal (where Landlock is missing, /dev/tty would open it)
    // or its session's signals.
    let _ = nix::unistd::setsid();
    let read: Vec<PathBuf> = ["/etc", "/usr", "/lib", "/lib64", "/run/systemd/resolve"]
        .into_iter()
        .map(PathBuf::from)
        .collect();
    if crate::sandbox::confine::helper(read).is_err() {
        return 125;
    }
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return 1;
    };
    rt.block_on(run(config, listeners, control));
    // Without waiting for host lookups still running on the blocking pool (the process
    // exits right after): a resolver that never answers would otherwise hold the broker
    // past the supervisor's patience.
    rt.shutdown_background();
    0
}

async fn run(config: BrokerConfig, listeners: Vec<OwnedFd>, control: StdUnixStream) {
    let Ok(control) = control
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(control))
    else {
        return;
    };
    let (mut from_supervisor, to_supervisor) = control.into_split();
    let (stop_tx, stop_rx) = watch::channel(false);
    let budget = config.max_bytes.map(AtomicU64::new);
    let ports = config.ports.clone();
    let state = Arc::new(State {
        config,
        pool: Mutex::new(FakePool::default()),
        budget,
        outbox: Mutex::new(Outbox::new()),
        wake: Notify::new(),
        finishing: AtomicBool::new(false),
        bytes_out: AtomicU64::new(0),
        bytes_in: AtomicU64::new(0),
        lookups: AtomicU64::new(0),
        stop: stop_rx,
    });
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut listeners = listeners.into_iter();
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(udp) = listeners.next().and_then(|fd| udp_socket(fd).ok()) {
        tasks.spawn(dns_udp(state.clone(), udp));
    }
    let kinds = [Via::DnsTcp, Via::Proxy]
        .into_iter()
        .chain(ports.into_iter().map(Via::Transparent));
    for (fd, via) in listeners.zip(kinds) {
        if let Ok(l) = tcp_listener(fd) {
            tasks.spawn(accept_loop(state.clone(), slots.clone(), l, via));
        }
    }
    // Entries go out as they come, while the supervisor reads (a controller does; `run`
    // reads them all at the end). The writer is never cut mid-line.
    let writer = tokio::spawn(writer(state.clone(), to_supervisor));
    wait_for_stop(&mut from_supervisor).await;
    let _ = stop_tx.send(true);
    // Connections see the stop and record themselves; the listeners go with the runtime.
    let _ = tokio::time::timeout(STOP_GRACE, async {
        let _ = slots.acquire_many(MAX_CONNECTIONS as u32).await;
    })
    .await;
    tasks.abort_all();
    state.finishing.store(true, Ordering::SeqCst);
    state.wake.notify_one();
    let _ = tokio::time::timeout(FINISH_WITHIN, writer).await;
}

/// Writes entries as they are queued; once the broker is finishing, the rest and the
/// summary line.
async fn writer(state: Arc<State>, mut out: tokio::net::unix::OwnedWriteHalf) {
    loop {
        state.wake.notified().await;
        if write_entries(&state, &mut out).await.is_err() {
            return;
        }
        if state.finishing.load(Ordering::SeqCst) {
            let dropped = state
                .outbox
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .dropped;
            let summary = Line::Summary {
                dropped,
                lookups: state.lookups.load(Ordering::SeqCst),
                bytes_out: state.bytes_out.load(Ordering::SeqCst),
                bytes_in: state.bytes_in.load(Ordering::SeqCst),
            };
            let _ = write_line(&mut out, &summary).await;
            return;
        }
    }
}

/// Writes every queued entry to the supervisor, one JSON line each.
async fn write_entries(
    state: &State,
    out: &mut tokio::net::unix::OwnedWriteHalf,
) -> std::io::Result<()> {
    loop {
        let next = {
            let mut o = state.outbox.lock().unwrap_or_else(PoisonError::into_inner);
            let next = o.queue.pop_front();
            if next.as_ref().is_some_and(|e| e.event != "egress_allowed") {
                o.cheap = o.cheap.saturating_sub(1);
            }
            next
        };
        let Some(entry) = next else {
            return Ok(());
        };
        write_line(out, &Line::Entry(entry)).await?;
    }
}

async fn write_line(
    out: &mut tokio::net::unix::OwnedWriteHalf,
    line: &Line,
) -> std::io::Result<()> {
    let mut text = serde_json::to_vec(line).map_err(std::io::Error::other)?;
    text.push(b'\n');
    out.write_all(&text).await
}

/// Returns once the supervisor has closed its end of the control socket (or it fails).
async fn wait_for_stop(from: &mut tokio::net::unix::OwnedReadHalf) {
    let mut buf = [0u8; 64];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

fn udp_socket(fd: OwnedFd) -> std::io::Result<UdpSocket> {
    let s = std::net::UdpSocket::from(fd);
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s)
}

fn tcp_listener(fd: OwnedFd) -> std::io::Result<TcpListener> {
    let l = std::net::TcpListener::from(fd);
    l.set_nonblocking(true)?;
    TcpListener::from_std(l)
}

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy)]
pub(super) enum Via {
    DnsTcp,
    Proxy,
    Transparent(u16),
}

impl Via {
    pub(super) fn word(self) -> &'static str {
        match self {
            Via::DnsTcp => "dns",
            Via::Proxy => "proxy",
            Via::Transparent(_) => "transparent",
        }
    }
}

async fn accept_loop(state: Arc<State>, slots: Arc<Semaphore>, listener: TcpListener, via: Via) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        // Over the limit, a connection is closed at once (never queued without bound).
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(conn);
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            match via {
                Via::DnsTcp => dns_tcp(&state, conn).await,
                Via::Proxy => proxy(&state, conn).await,
                Via::Transparent(port) => transparent(&state, conn, port).await,
            }
            drop(slot);
        });
    }
}

/// A denied connection's or query's entry.
pub(super) fn denied(
    via: Via,
    name: Option<String>,
    port: Option<u16>,
    reason: &str,
    started: Instant,
) -> EgressEntry {
    EgressEntry {
        event: "egress_denied".into(),
        name,
        port,
        address: None,
        sni: None,
        via: via.word().into(),
        bytes_out: 0,
        bytes_in: 0,
        duration_ms: elapsed_ms(started),
        reason: Some(reason.into()),
        qtype: None,
    }
}

pub(super) fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn dns_entry(outcome: &dns::DnsOutcome) -> EgressEntry {
    EgressEntry {
        event: if outcome.answered.is_some() {
            "dns_answered"
        } else {
            "dns_refused"
        }
        .into(),
        name: outcome.name.clone(),
        port: None,
        address: outcome.answered.map(|a| a.to_string()),
        sni: None,
        via: "dns".into(),
        bytes_out: 0,
        bytes_in: 0,
        duration_ms: 0,
        reason: None,
        qtype: Some(outcome.qtype.clone()),
    }
}

fn answer(state: &State, query: &[u8]) -> Option<Vec<u8>> {
    let (reply, outcome) = {
        let mut pool = state.pool.lock().unwrap_or_else(PoisonError::into_inner);
        dns::answer(query, &state.config.allow, &mut pool)
    };
    state.record(dns_entry(&outcome));
    reply
}

async fn dns_udp(state: Arc<State>, sock: UdpSocket) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let Some(query) = buf.get(..n) else {
            continue;
        };
        if let Some(reply) = answer(&state, query) {
            let _ = sock.send_to(&reply, from).await;
        }
    }
}

async fn dns_tcp(state: &State, mut conn: TcpStream) {
    use tokio::io::AsyncWriteExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        while let Some((query, used)) = dns::tcp_message(&buf) {
            let reply = answer(state, query).and_then(|r| dns::tcp_frame(&r));
            buf.drain(..used.min(buf.len()));
            match reply {
                Some(r) if conn.write_all(&r).await.is_ok() => {}
                _ => return,
            }
        }
        let read = tokio::time::timeout(HEAD_TIMEOUT, conn.read(&mut chunk)).await;
        match read {
            Ok(Ok(n)) if n > 0 && buf.len() < 4 * 65536 => {
                buf.extend_from_slice(chunk.get(..n).unwrap_or_default())
            }
            _ => return,
        }
    }
}

/// The proxy: reads the request head, decides, answers, and relays.
async fn proxy(state: &State, mut conn: TcpStream) {
    let started = Instant::now();
    let head = match relay::read_until(&mut conn, http::MAX_HEAD, http::proxy_request).await {
        Ok((req, buf)) => (req, buf),
        Err(_) => {
            relay::refuse(&mut conn, 400, "bad_request").await;
            state.record(denied(Via::Proxy, None, None, "bad_request", started));
            return;
        }
    };
    match head {
        (
            http::ProxyRequest::Connect {
                host,
                port,
                consumed,
            },
            buf,
        ) => {
            // Bytes the client sent after the head (it should have waited) go on first.
            let early = buf.get(consumed..).unwrap_or_default().to_vec();
            relay::connect_tunnel(state, conn, &host, port, early, started).await
        }
        (
            http::ProxyRequest::Forward {
                host,
                port,
                head,
                consumed,
            },
            buf,
        ) => {
            let rest = buf.get(consumed..).unwrap_or_default().to_vec();
            relay::forward(state, conn, &host, port, head, rest, started).await
        }
    }
}

/// A proxy-unaware client that reached a fake address: the name behind it decides.
async fn transparent(state: &State, conn: TcpStream, port: u16) {
    let started = Instant::now();
    let local = match conn.local_addr() {
        Ok(a) => a.ip(),
        Err(_) => return,
    };
    let name = match state.destination(&local.to_string()) {
        Ok(Destination::Name(n)) => n,
        _ => {
            state.record(denied(
                Via::Transparent(port),
                None,
                Some(port),
                Denial::UnknownPoolAddress(local).reason(),
                started,
            ));
            return;
        }
    };
    relay::inspected(
        state,
        conn,
        Via::Transparent(port),
        Destination::Name(name),
        port,
        Vec::new(),
        started,
    )
    .await
}

pub(super) fn connect_timeout() -> Duration {
    CONNECT_TIMEOUT
}
