//! Inside the broker process: confinement, then one task per listener and one per
//! connection on a single-threaded runtime, until the supervisor closes the control
//! socket; then the summary goes back on it.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Semaphore, watch};

use super::relay;
use super::state::{HEAD_TIMEOUT, State, Via, denied};
use super::{BrokerConfig, EgressEntry, Line};
use crate::egress::{Denial, Destination, dns, http};

/// How long connections get to record themselves once the broker is stopped.
const STOP_GRACE: Duration = Duration::from_millis(500);
/// How long the last entries get to reach the supervisor.
const FINISH_WITHIN: Duration = Duration::from_secs(3);

/// Connections one sandbox may hold open through the broker at once.
const MAX_CONNECTIONS: usize = 256;
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
    let read: Vec<PathBuf> = [
        "/etc",
        "/usr",
        "/lib",
        "/lib64",
        "/run/systemd/resolve",
        "/run/resolvconf",
        "/run/NetworkManager",
    ]
    .into_iter()
    .map(PathBuf::from)
    .collect();
    if crate::sandbox::confine::helper(read, tcp_ports(&config)).is_err() {
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

/// The TCP ports the broker may connect to: the allowlist's, and 53 for the host's
/// resolver (which asks over TCP when an answer does not fit UDP); every port where any
/// public host is allowed (`None`).
fn tcp_ports(config: &BrokerConfig) -> Option<Vec<u16>> {
    if config.allow.any_public() {
        return None;
    }
    let mut ports: Vec<u16> = config.allow.entries().iter().map(|e| e.port).collect();
    ports.push(DNS_PORT);
    ports.sort_unstable();
    ports.dedup();
    Some(ports)
}

/// The port a resolver answers on.
const DNS_PORT: u16 = 53;

async fn run(config: BrokerConfig, listeners: Vec<OwnedFd>, control: StdUnixStream) {
    let Ok(control) = control
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(control))
    else {
        return;
    };
    let (mut from_supervisor, to_supervisor) = control.into_split();
    let (stop_tx, stop_rx) = watch::channel(false);
    let ports = config.ports.clone();
    let state = Arc::new(State::new(config, stop_rx));
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
    state.finish();
    let _ = tokio::time::timeout(FINISH_WITHIN, writer).await;
}

/// Writes entries as they are queued; once the broker is finishing, the rest and the
/// summary line.
async fn writer(state: Arc<State>, mut out: tokio::net::unix::OwnedWriteHalf) {
    loop {
        state.entries_queued().await;
        if write_entries(&state, &mut out).await.is_err() {
            return;
        }
        if state.finishing() {
            let _ = write_line(&mut out, &state.summary()).await;
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
        let Some(entry) = state.next_entry() else {
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
    let (reply, outcome) = state.answer_dns(query);
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
        // Over the rate a query is dropped, as a busy server drops one (the client asks
        // again, later), and the socket is left unread a while: the kernel drops what does
        // not fit its buffer meanwhile, at no cost to the broker.
        if let Err(wait) = state.take_dns_query() {
            tokio::time::sleep(wait.max(RATE_PAUSE)).await;
            continue;
        }
        if let Some(reply) = answer(&state, query) {
            let _ = sock.send_to(&reply, from).await;
        }
    }
}

/// The least a DNS listener or connection past the stub's rate waits before it is read
/// again: each of up to [`MAX_CONNECTIONS`] waking every millisecond to find no token cost
/// the broker a fifth of a core.
const RATE_PAUSE: Duration = Duration::from_millis(50);

/// The send buffer of a DNS connection: a few hundred answers. One whose client does not
/// read them holds no more of the host's socket memory than this (and is closed at
/// [`HEAD_TIMEOUT`]).
const DNS_TCP_SNDBUF: usize = 16 << 10;

async fn dns_tcp(state: &State, mut conn: TcpStream) {
    use tokio::io::AsyncWriteExt;
    let _ = nix::sys::socket::setsockopt(&conn, nix::sys::socket::sockopt::SndBuf, &DNS_TCP_SNDBUF);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        // Every whole query read so far, then what they took is dropped at once (one
        // write may hold thousands: dropping each from the front in turn cost its square).
        let mut at = 0usize;
        while let Some((query, used)) = buf.get(at..).and_then(dns::tcp_message) {
            // Over the rate the connection waits, unread: the client's writes wait too.
            while let Err(wait) = state.take_dns_query() {
                tokio::time::sleep(wait.max(RATE_PAUSE)).await;
            }
            let reply = answer(state, query).and_then(|r| dns::tcp_frame(&r));
            at = at.saturating_add(used);
            match reply {
                Some(r) => {
                    let wrote = tokio::time::timeout(HEAD_TIMEOUT, conn.write_all(&r)).await;
                    if !matches!(wrote, Ok(Ok(()))) {
                        return;
                    }
                }
                None => return,
            }
        }
        buf.drain(..at.min(buf.len()));
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
    let head =
        match relay::read_until(&mut conn, Vec::new(), http::MAX_HEAD, http::proxy_request).await {
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
