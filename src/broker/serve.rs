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

use super::state::{HEAD_TIMEOUT, State, Via, denied};
use super::{BrokerConfig, EgressEntry, Line};
use super::{held, relay};
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
    // Its own thread: see `Held::sweeping`. Without it nothing bounds what connections
    // hold, so none is relayed: the broker ends, and the supervisor reports its record
    // lost.
    let sweeping = state.clone();
    let Ok(sweep) = std::thread::Builder::new()
        .name("sweep".into())
        .spawn(move || sweeping.held.sweeping())
    else {
        return;
    };
    let mut listening = tokio::task::JoinSet::new();
    for (fd, via) in listeners.zip(kinds) {
        if let Ok(l) = tcp_listener(fd) {
            listening.spawn(accept_loop(state.clone(), slots.clone(), l, via));
        }
    }
    // Entries go out as they come, while the supervisor reads (a controller does; `run`
    // reads them all at the end). The writer is never cut mid-line.
    let writer = tokio::spawn(writer(state.clone(), to_supervisor));
    wait_for_stop(&mut from_supervisor).await;
    let _ = stop_tx.send(true);
    // Each listener stops accepting, gives its connections the grace to record
    // themselves, and cuts (and records) the rest; only then is the record finished.
    let _ = tokio::time::timeout(STOP_GRACE.saturating_mul(2), async {
        while listening.join_next().await.is_some() {}
    })
    .await;
    listening.abort_all();
    tasks.abort_all();
    state.held.stop();
    let _ = sweep.join();
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
    use nix::sys::socket::{setsockopt, sockopt};
    // Set on the listener, the sizes pass to every connection it accepts.
    setsockopt(&fd, sockopt::RcvBuf, &held::WAITING_SIDE_BUFFER)?;
    setsockopt(&fd, sockopt::SndBuf, &held::SANDBOX_SIDE_BUFFER)?;
    let l = std::net::TcpListener::from(fd);
    l.set_nonblocking(true)?;
    TcpListener::from_std(l)
}

async fn accept_loop(state: Arc<State>, slots: Arc<Semaphore>, listener: TcpListener, via: Via) {
    // The connections are this loop's own, never detached: at the stop, one that has not
    // ended within the grace is cut here, and its [`Unfinished`] records it, so that no
    // connection leaves the broker unrecorded wherever it was waiting.
    let mut connections = tokio::task::JoinSet::new();
    let mut stop = state.stop.clone();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let Ok((conn, _)) = accepted else {
            continue;
        };
        // Over the limit, a connection is closed at once (never queued without bound), and
        // recorded like any refusal (within the entries' own bounds).
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(conn);
            let port = match via {
                Via::DnsTcp => continue,
                Via::Proxy => None,
                Via::Transparent(port) => Some(port),
            };
            state.record(denied(
                via,
                None,
                port,
                "too_many_connections",
                Instant::now(),
            ));
            continue;
        };
        let state = state.clone();
        connections.spawn(async move {
            let unfinished = Unfinished::new(&state, via);
            match via {
                Via::DnsTcp => dns_tcp(&state, conn).await,
                Via::Proxy => proxy(&state, conn).await,
                Via::Transparent(port) => transparent(&state, conn, port).await,
            }
            unfinished.finished();
            drop(slot);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(STOP_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

/// A connection's task that has not ended. Every way a connection ends records it, but a
/// task cut at the stop (still waiting on something the stop does not reach) ends nowhere:
/// dropped unfinished, it records the connection as `stopped` itself. Queries over TCP
/// are recorded each as it is answered, so a DNS connection records nothing here.
struct Unfinished<'a> {
    state: &'a State,
    via: Via,
    started: Instant,
    done: bool,
}

impl<'a> Unfinished<'a> {
    fn new(state: &'a State, via: Via) -> Self {
        Unfinished {
            state,
            via,
            started: Instant::now(),
            done: false,
        }
    }

    fn finished(mut self) {
        self.done = true;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        let port = match self.via {
            _ if self.done => return,
            Via::DnsTcp => return,
            Via::Proxy => None,
            Via::Transparent(port) => Some(port),
        };
        self.state
            .record(denied(self.via, None, port, "stopped", self.started));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> (Arc<State>, watch::Sender<bool>) {
        let (state, stop) = State::allowing_nothing();
        (Arc::new(state), stop)
    }

    /// A connection whose task is still waiting when the broker stops (here, on a head
    /// its client never finishes) is cut at the end of the grace and recorded as
    /// stopped: a task left detached was dropped with the runtime, unrecorded.
    #[tokio::test]
    async fn a_connection_still_waiting_at_the_stop_is_cut_and_recorded() -> std::io::Result<()> {
        let (state, stop) = state();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let at = listener.local_addr()?;
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let serving = tokio::spawn(accept_loop(state.clone(), slots, listener, Via::Proxy));
        let mut client = TcpStream::connect(at).await?;
        client
            .write_all(b"CONNECT api.test:443 HTTP/1.1\r\n")
            .await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let cut_at = Instant::now();
        let _ = stop.send(true);
        let ended = tokio::time::timeout(Duration::from_secs(5), serving).await;
        assert!(matches!(ended, Ok(Ok(()))), "the listener did not end");
        assert!(
            cut_at.elapsed() < HEAD_TIMEOUT,
            "the stop waited for the head"
        );
        let entry = state.next_entry().map(|e| (e.event, e.via, e.reason));
        assert_eq!(
            entry,
            Some((
                "egress_denied".to_string(),
                "proxy".to_string(),
                Some("stopped".to_string())
            ))
        );
        assert!(state.next_entry().is_none());
        drop(client);
        Ok(())
    }

    /// A connection past the limit is closed at once, and recorded.
    #[tokio::test]
    async fn a_connection_past_the_limit_is_recorded() -> std::io::Result<()> {
        let (state, stop) = state();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let at = listener.local_addr()?;
        let full = Arc::new(Semaphore::new(0));
        let serving = tokio::spawn(accept_loop(
            state.clone(),
            full,
            listener,
            Via::Transparent(80),
        ));
        let mut client = TcpStream::connect(at).await?;
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        let entry = state.next_entry().map(|e| (e.event, e.port, e.reason));
        assert_eq!(
            entry,
            Some((
                "egress_denied".to_string(),
                Some(80),
                Some("too_many_connections".to_string())
            ))
        );
        let _ = stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), serving).await;
        Ok(())
    }
}
