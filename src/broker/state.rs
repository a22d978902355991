//! What every task of the broker shares: the settings, the pool of fake addresses, the
//! byte budget, the entries on their way to the supervisor, the stop signal; and how a
//! destination is decided.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use super::held::{Held, MAX_HELD};
use super::{BrokerConfig, EgressEntry, Line, MAX_ENTRIES};
use crate::egress::{Denial, Destination, FakePool, dns, policy};
use crate::pace::TokenBucket;

/// How long a client has to send what the broker must read before deciding.
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection to an allowed host may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Entries on their way to the supervisor. However fast a sandbox opens connections,
/// what it causes the supervisor to read (and a controller to audit) stays bounded: at
/// most [`MAX_ENTRIES`] wait, and each kind passes within its own [`TokenBucket`]. DNS answers
/// and denials cost a sandbox nothing, so they have half of everything to themselves and
/// can never crowd out the connections that carried bytes.
struct Outbox {
    queue: std::collections::VecDeque<EgressEntry>,
    /// How many of the waiting entries are cheap ones.
    cheap: usize,
    dropped: u64,
    cheap_bucket: TokenBucket,
    connection_bucket: TokenBucket,
}

/// Entries per second of one kind past the first burst.
const ENTRY_RATE: f64 = 25.0;

/// DNS queries the stub answers at once, and then each second. The broker runs outside
/// the sandbox's cgroup, so what it does for the sandbox is bounded here: a sandbox that
/// pipelines queries over TCP (thousands in one write) made it spend a whole core under
/// `--cpus 0.2`. Far more lookups than a program makes; past it the stub reads nothing for
/// a while (see `serve::RATE_PAUSE`).
const DNS_BURST: f64 = 5000.0;
const DNS_RATE: f64 = 5000.0;

/// What opening one upstream connection takes from a `--max-egress` budget: about what its
/// handshake's packets carry.
pub(super) const CONNECTION_COST: usize = 64;

/// How long a host lookup's answer (or failure) serves later connections to the name.
/// Every connection looked its name up again, before anything was read from it: a sandbox
/// allowed one name that opened and closed connections in a loop sent the host's
/// resolver 27,000 queries in 8 s, on the broker's CPU, outside the sandbox's cgroup.
/// Short enough that an address change is seen within a few seconds.
const LOOKUP_TTL: Duration = Duration::from_secs(5);
/// Names whose answers are kept; a sandbox allowed a wildcard can name any number.
const MAX_CACHED: usize = 1024;
/// Host lookups at once, then each second, past the cache (distinct names under a
/// wildcard): a connection whose lookup has to wait waits, within its own deadline.
const LOOKUP_BURST: f64 = 50.0;
const LOOKUP_RATE: f64 = 20.0;

/// The host lookups made for the sandbox: answers kept a while, and the pace of new ones.
struct Lookups {
    answers: std::collections::HashMap<String, (Instant, Result<Vec<IpAddr>, String>)>,
    bucket: TokenBucket,
}

impl Lookups {
    fn new() -> Lookups {
        Lookups {
            answers: Default::default(),
            bucket: TokenBucket::new(LOOKUP_BURST, LOOKUP_RATE),
        }
    }

    /// The answer kept for `name`, while it is fresh.
    fn kept(&self, name: &str, now: Instant) -> Option<Result<Vec<IpAddr>, String>> {
        self.answers
            .get(name)
            .filter(|(at, _)| now.saturating_duration_since(*at) < LOOKUP_TTL)
            .map(|(_, answer)| answer.clone())
    }

    fn keep(&mut self, name: &str, answer: &Result<Vec<IpAddr>, String>, now: Instant) {
        if self.answers.len() >= MAX_CACHED {
            self.answers
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < LOOKUP_TTL);
        }
        if self.answers.len() >= MAX_CACHED {
            self.answers.clear();
        }
        self.answers.insert(name.to_string(), (now, answer.clone()));
    }
}

impl Outbox {
    fn new() -> Outbox {
        Outbox {
            queue: Default::default(),
            cheap: 0,
            dropped: 0,
            cheap_bucket: TokenBucket::new((MAX_ENTRIES / 2) as f64, ENTRY_RATE),
            connection_bucket: TokenBucket::new((MAX_ENTRIES / 2) as f64, ENTRY_RATE),
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
    /// The DNS queries the stub may still answer now ([`DNS_RATE`]).
    dns_queries: Mutex<TokenBucket>,
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
    /// Host lookups' answers and pace.
    host_lookups: Mutex<Lookups>,
    /// What the relayed connections hold in the kernel, kept within its limit.
    pub(super) held: Held,
    pub(super) stop: watch::Receiver<bool>,
}

impl State {
    pub(super) fn new(config: BrokerConfig, stop: watch::Receiver<bool>) -> State {
        let budget = config.max_bytes.map(AtomicU64::new);
        State {
            config,
            pool: Mutex::new(FakePool::default()),
            dns_queries: Mutex::new(TokenBucket::new(DNS_BURST, DNS_RATE)),
            budget,
            outbox: Mutex::new(Outbox::new()),
            wake: Notify::new(),
            finishing: AtomicBool::new(false),
            bytes_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
            host_lookups: Mutex::new(Lookups::new()),
            held: Held::new(MAX_HELD),
            stop,
        }
    }

    /// A broker's state that allows nothing, and the sender of its stop (tests).
    #[cfg(test)]
    pub(super) fn allowing_nothing() -> (State, watch::Sender<bool>) {
        let (stop, stop_rx) = watch::channel(false);
        let config = BrokerConfig {
            allow: Default::default(),
            resolution: Default::default(),
            max_bytes: None,
            ports: Vec::new(),
        };
        (State::new(config, stop_rx), stop)
    }

    /// Waits until entries are queued (or the broker is finishing).
    pub(super) async fn entries_queued(&self) {
        self.wake.notified().await
    }

    /// The broker is stopping: the writer sends what is left, then the summary.
    pub(super) fn finish(&self) {
        self.finishing.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    pub(super) fn finishing(&self) -> bool {
        self.finishing.load(Ordering::SeqCst)
    }

    /// The next entry for the supervisor.
    pub(super) fn next_entry(&self) -> Option<EgressEntry> {
        let mut o = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        let next = o.queue.pop_front();
        if next.as_ref().is_some_and(|e| e.event != "egress_allowed") {
            o.cheap = o.cheap.saturating_sub(1);
        }
        next
    }

    /// The broker's last line: what it only counted, its lookups and byte totals.
    pub(super) fn summary(&self) -> Line {
        Line::Summary {
            dropped: self
                .outbox
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .dropped,
            lookups: self.lookups.load(Ordering::SeqCst),
            bytes_out: self.bytes_out.load(Ordering::SeqCst),
            bytes_in: self.bytes_in.load(Ordering::SeqCst),
        }
    }

    /// The stub's answer to `query` (and what it decided).
    /// Whether the stub may answer one more query now; else how long until it may.
    pub(super) fn take_dns_query(&self) -> Result<(), Duration> {
        self.dns_queries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take_or_wait(Instant::now())
    }

    pub(super) fn answer_dns(&self, query: &[u8]) -> (Option<Vec<u8>>, dns::DnsOutcome) {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        dns::answer(query, &self.config.allow, &mut pool)
    }

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
                looked_up = Some(self.look_up(name, port).await?);
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
        // only when an entry names the address itself. A network entry (`10.0.0.0/8`,
        // for the hosts of a private network) opened every service of this host on its
        // own address in that network. Loopback is this host by definition: a loopback
        // network named on purpose (`127.0.0.0/8`) still reaches it.
        let named = |ip: IpAddr| {
            cfg.allow.names_addr(ip, port)
                || (ip.to_canonical().is_loopback() && cfg.allow.names_special_addr(ip, port))
        };
        // The unspecified address (`0.0.0.0`, `::`) is no host's: a connect to it reaches
        // this one's loopback, so no entry opens it, `0.0.0.0:PORT` written for "any"
        // included.
        let (own, kept): (Vec<_>, Vec<_>) = addrs.into_iter().partition(|a| {
            a.ip().to_canonical().is_unspecified() || (is_own_address(a.ip()) && !named(a.ip()))
        });
        if let (true, Some(first)) = (kept.is_empty(), own.first()) {
            return Err(Denial::SpecialAddress("this host", first.ip()));
        }
        // Opening a connection carries something out (that it was opened, when, and to
        // which port) whether or not a byte follows: it is charged, or a budget with one
        // byte left would let any number through.
        if self.take_budget(CONNECTION_COST) < CONNECTION_COST {
            return Err(Denial::BudgetExhausted);
        }
        Ok(kept)
    }

    /// The host's resolver's answer for `name` (allowed, and not in the resolution
    /// table): kept from a lookup less than [`LOOKUP_TTL`] ago, or looked up now, at most
    /// [`LOOKUP_RATE`] a second past a burst.
    async fn look_up(&self, name: &str, port: u16) -> Result<Result<Vec<IpAddr>, String>, Denial> {
        let lookups = || {
            self.host_lookups
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        loop {
            let now = Instant::now();
            let wait = {
                let mut l = lookups();
                if let Some(answer) = l.kept(name, now) {
                    return Ok(answer);
                }
                match l.bucket.take_or_wait(now) {
                    Ok(()) => break,
                    Err(wait) => wait,
                }
            };
            tokio::time::sleep(wait).await;
        }
        // The name goes to the host's resolver and beyond: its bytes are charged.
        if self.take_budget(name.len()) < name.len() {
            return Err(Denial::BudgetExhausted);
        }
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let answer = tokio::net::lookup_host((name, port))
            .await
            .map(|addrs| addrs.map(|a| a.ip()).collect())
            .map_err(|e| e.to_string());
        lookups().keep(name, &answer, Instant::now());
        Ok(answer)
    }

    /// Where a client's connection goes: the CONNECT or URI host as named, or the name
    /// behind a fake address.
    pub(super) fn destination(&self, host: &str) -> Result<Destination, Denial> {
        match Destination::from_host(host) {
            Destination::Addr(ip) if FakePool::in_pool(ip) => self
                .pool_name(ip)
                .map(Destination::Name)
                .ok_or(Denial::UnknownPoolAddress(ip)),
            dest => Ok(dest),
        }
    }
}

/// True when `addr` is one of this host's own addresses. Two probes, neither sending
/// anything: the kernel routes an interface's address locally and so picks the address
/// itself as the source of a UDP socket's connect; and it lets a socket bind only to an
/// address it delivers locally, which also covers a range a `local` route makes the
/// host's (AnyIP, `ip route add local NET dev lo`, whose preferred source may be another
/// address). Where the host lets any address be bound (`ip_nonlocal_bind`), binding says
/// nothing and only the first probe counts. No route means no local address; a probe that
/// cannot be made at all counts as the host's own (refused rather than guessed at).
fn is_own_address(addr: IpAddr) -> bool {
    let any: IpAddr = match addr {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let Ok(probe) = std::net::UdpSocket::bind((any, 0)) else {
        return true;
    };
    let sourced = match probe.connect((addr, 9)) {
        Ok(()) => probe.local_addr().map_or(true, |local| local.ip() == addr),
        Err(_) => false,
    };
    sourced || (binds_only_local(addr) && std::net::UdpSocket::bind((addr, 0)).is_ok())
}

/// Whether binding to an address of `addr`'s family proves it local: false where a
/// never-local address binds too (`net.ipv4.ip_nonlocal_bind`, `net.ipv6.ip_nonlocal_bind`).
/// Asked once per family (240.0.0.1 is reserved; 100::1 is the discard-only prefix).
fn binds_only_local(addr: IpAddr) -> bool {
    static V4: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    static V6: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let (cell, never_local): (_, IpAddr) = match addr {
        IpAddr::V4(_) => (&V4, Ipv4Addr::new(240, 0, 0, 1).into()),
        IpAddr::V6(_) => (&V6, Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 1).into()),
    };
    *cell.get_or_init(|| std::net::UdpSocket::bind((never_local, 0)).is_err())
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

pub(super) fn connect_timeout() -> Duration {
    CONNECT_TIMEOUT
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections to one allowed name, opened and closed in a loop, sent the host's
    /// resolver a lookup each. (`localhost` is the host's own file's: no query leaves.)
    #[test]
    fn a_host_lookup_is_kept_a_while() -> Result<(), Box<dyn std::error::Error>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (_stop, stop_rx) = watch::channel(false);
        let state = State::new(
            BrokerConfig {
                allow: crate::egress::AllowList::new(vec!["localhost:9".parse()?])?,
                resolution: Default::default(),
                max_bytes: None,
                ports: Vec::new(),
            },
            stop_rx,
        );
        let local = Destination::Name("localhost".into());
        rt.block_on(async {
            for _ in 0..200 {
                let _ = state.decide(&local, 9).await;
            }
        });
        assert_eq!(state.lookups.load(Ordering::SeqCst), 1);
        Ok(())
    }

    /// Distinct names (a wildcard allows any number) are looked up at most
    /// [`LOOKUP_RATE`] a second past a burst; answers and failures are kept for
    /// [`LOOKUP_TTL`], and the table stays within [`MAX_CACHED`] names.
    #[test]
    fn new_lookups_are_paced_and_the_kept_answers_bounded() {
        let mut l = Lookups::new();
        let now = Instant::now();
        for _ in 0..LOOKUP_BURST as usize {
            assert!(l.bucket.take_or_wait(now).is_ok());
        }
        let wait = l.bucket.take_or_wait(now).err().unwrap_or_default();
        assert!(
            wait >= Duration::from_secs_f64(0.9 / LOOKUP_RATE),
            "{wait:?}"
        );
        let failed: Result<Vec<IpAddr>, String> = Err("no such name".into());
        l.keep("gone.example", &failed, now);
        assert_eq!(l.kept("gone.example", now + LOOKUP_TTL / 2), Some(failed));
        assert_eq!(l.kept("gone.example", now + LOOKUP_TTL), None);
        for i in 0..3 * MAX_CACHED {
            l.keep(&format!("n{i}.example"), &Ok(Vec::new()), now);
            assert!(l.answers.len() <= MAX_CACHED);
        }
    }
}
