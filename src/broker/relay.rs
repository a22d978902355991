//! One connection through the broker: what it must show before it goes anywhere (the
//! TLS server name on 443, the HTTP Host on 80), the connection out, and the relay both
//! ways within the sandbox's byte budget until either side ends or the broker stops.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::EgressEntry;
use super::held::{Cut, drained};
use super::state::{HEAD_TIMEOUT, State, Via, connect_timeout, denied, elapsed_ms};
use crate::egress::{Destination, EgressError, http, tls};

/// Size of one relayed chunk.
const CHUNK: usize = 16 * 1024;
/// The TLS port: a connection there must open with a ClientHello naming the host.
const TLS_PORT: u16 = 443;
/// The HTTP port: a connection there must name the host in its first request.
const HTTP_PORT: u16 = 80;
/// Most of a ClientHello read before deciding (one TLS record and its header).
const MAX_HELLO: usize = 16 * 1024 + 5;

/// Reads from `conn` after `buf` (bytes already read) until `parse` makes something of
/// them all (at most `max` bytes, within [`HEAD_TIMEOUT`]): the result and every byte.
pub(super) async fn read_until<T>(
    conn: &mut TcpStream,
    mut buf: Vec<u8>,
    max: usize,
    parse: impl Fn(&[u8]) -> Result<Option<T>, EgressError>,
) -> Result<(T, Vec<u8>), String> {
    let mut chunk = vec![0u8; 4096];
    let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    loop {
        if let Some(t) = parse(&buf).map_err(|e| e.to_string())? {
            return Ok((t, buf));
        }
        if buf.len() >= max {
            return Err("too long".into());
        }
        let n = match tokio::time::timeout_at(deadline, conn.read(&mut chunk)).await {
            Ok(Ok(0)) => return Err("closed".into()),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("timed out".into()),
        };
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

/// `work` for the connection to `name` and `port`, unless the broker stops first: then
/// `None`, and the connection is recorded as stopped. A host lookup or a connect can take
/// seconds (a resolver or a server that never answers); one still running when the
/// sandbox ends would hold the broker's stop for all of its grace, and with it whatever
/// waits for the stop (a controller's launcher, before the next start), and would be
/// dropped with the runtime unrecorded.
async fn unless_stopped<T>(
    state: &State,
    (via, name, port): (Via, String, u16),
    started: Instant,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    let mut stop = state.stop.clone();
    tokio::select! {
        biased;
        _ = stop.wait_for(|s| *s) => {
            state.record(denied(via, Some(name), Some(port), "stopped", started));
            None
        }
        done = work => Some(done),
    }
}

/// Answers a proxy client with a refusal (and closes).
pub(super) async fn refuse(conn: &mut TcpStream, code: u16, reason: &str) {
    let _ = conn.write_all(&http::status(code, reason)).await;
    let _ = conn.shutdown().await;
}

/// The proxy's decision on `host` and `port`: the destination and the addresses to try,
/// or `None` once the client has been answered 403 and the denial recorded.
async fn decided(
    state: &State,
    conn: &mut TcpStream,
    host: &str,
    port: u16,
    started: Instant,
) -> Option<(Destination, Vec<SocketAddr>)> {
    let (name, verdict) = match state.destination(host) {
        Ok(dest) => {
            let name = name_of(&dest);
            let to = (Via::Proxy, name.clone(), port);
            let verdict = unless_stopped(state, to, started, state.decide(&dest, port)).await?;
            (name, verdict.map(|a| (dest, a)))
        }
        Err(denial) => (host.to_string(), Err(denial)),
    };
    match verdict {
        Ok(found) => Some(found),
        Err(denial) => {
            refuse(conn, 403, denial.reason()).await;
            state.record(denied(
                Via::Proxy,
                Some(name),
                Some(port),
                denial.reason(),
                started,
            ));
            None
        }
    }
}

/// A CONNECT: decided on the authority, answered, then inspected and relayed.
pub(super) async fn connect_tunnel(
    state: &State,
    mut conn: TcpStream,
    host: &str,
    port: u16,
    early: Vec<u8>,
    started: Instant,
) {
    let Some((dest, addrs)) = decided(state, &mut conn, host, port, started).await else {
        return;
    };
    if conn
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    // Decided once: the addresses answered for are the ones connected to (and a name is
    // looked up, and charged, once).
    shown_then_out(state, conn, Via::Proxy, &dest, port, &addrs, early, started).await
}

/// An absolute-URI request: decided on the URI's host, sent on rewritten, relayed.
pub(super) async fn forward(
    state: &State,
    mut conn: TcpStream,
    host: &str,
    port: u16,
    head: Vec<u8>,
    rest: Vec<u8>,
    started: Instant,
) {
    let Some((dest, addrs)) = decided(state, &mut conn, host, port, started).await else {
        return;
    };
    let mut first = head;
    first.extend_from_slice(&rest);
    out(
        state,
        conn,
        Via::Proxy,
        &dest,
        port,
        &addrs,
        first,
        None,
        started,
    )
    .await
}

fn name_of(dest: &Destination) -> String {
    match dest {
        Destination::Name(n) => n.clone(),
        Destination::Addr(a) => a.to_string(),
    }
}

/// What a connection to a named host on the TLS or HTTP port must show first: its
/// ClientHello's server name, or its first request's Host, equal to the name. Other
/// ports and explicit addresses pass as they are.
async fn inspect(
    conn: &mut TcpStream,
    dest: &Destination,
    port: u16,
    early: Vec<u8>,
) -> Result<(Vec<u8>, Option<String>), &'static str> {
    let Destination::Name(name) = dest else {
        return Ok((early, None));
    };
    let mut early = early;
    let seen = match port {
        TLS_PORT => {
            let (hello, buf) = read_until(conn, early, MAX_HELLO, |b| {
                tls::client_hello(b).map(|h| match h {
                    tls::ClientHello::Incomplete => None,
                    other => Some(other),
                })
            })
            .await
            .map_err(|_| "sni_mismatch")?;
            early = buf;
            match hello {
                tls::ClientHello::Sni(sni) => sni,
                _ => return Err("sni_mismatch"),
            }
        }
        HTTP_PORT => {
            let (host, buf) = read_until(conn, early, http::MAX_HEAD, |b| {
                http::first_request_host(b, HTTP_PORT)
            })
            .await
            .map_err(|_| "host_mismatch")?;
            // One request, to the one host checked: no second one with another Host.
            early = http::close_after_first(&buf).map_err(|_| "host_mismatch")?;
            host
        }
        _ => return Ok((early, None)),
    };
    if seen.eq_ignore_ascii_case(name) {
        Ok((early, Some(seen)))
    } else if port == TLS_PORT {
        Err("sni_mismatch")
    } else {
        Err("host_mismatch")
    }
}

/// A connection to a destination not decided yet (a transparent listener's): decided,
/// then it must still show who it is for.
pub(super) async fn inspected(
    state: &State,
    conn: TcpStream,
    via: Via,
    dest: Destination,
    port: u16,
    early: Vec<u8>,
    started: Instant,
) {
    let to = (via, name_of(&dest), port);
    let Some(verdict) = unless_stopped(state, to, started, state.decide(&dest, port)).await else {
        return;
    };
    let addrs = match verdict {
        Ok(a) => a,
        Err(denial) => {
            state.record(denied(
                via,
                Some(name_of(&dest)),
                Some(port),
                denial.reason(),
                started,
            ));
            return;
        }
    };
    shown_then_out(state, conn, via, &dest, port, &addrs, early, started).await
}

/// A decided destination's connection: [`inspect`]ed, then [`out`] to `addrs`.
#[allow(clippy::too_many_arguments)]
async fn shown_then_out(
    state: &State,
    mut conn: TcpStream,
    via: Via,
    dest: &Destination,
    port: u16,
    addrs: &[SocketAddr],
    early: Vec<u8>,
    started: Instant,
) {
    let (first, sni) = match inspect(&mut conn, dest, port, early).await {
        Ok(x) => x,
        Err(reason) => {
            let _ = conn.shutdown().await;
            state.record(denied(
                via,
                Some(name_of(dest)),
                Some(port),
                reason,
                started,
            ));
            return;
        }
    };
    out(state, conn, via, dest, port, addrs, first, sni, started).await
}

/// Connects to the first of `addrs` that answers, sends `first`, relays, and records.
#[allow(clippy::too_many_arguments)]
async fn out(
    state: &State,
    conn: TcpStream,
    via: Via,
    dest: &Destination,
    port: u16,
    addrs: &[SocketAddr],
    first: Vec<u8>,
    sni: Option<String>,
    started: Instant,
) {
    let first_to_answer = async {
        for addr in addrs {
            let tried = tokio::time::timeout(connect_timeout(), TcpStream::connect(addr)).await;
            if let Ok(Ok(s)) = tried {
                return Some((s, *addr));
            }
        }
        None
    };
    let to = (via, name_of(dest), port);
    let Some(upstream) = unless_stopped(state, to, started, first_to_answer).await else {
        return;
    };
    let Some((upstream, addr)) = upstream else {
        state.record(denied(
            via,
            Some(name_of(dest)),
            Some(port),
            "connect_failed",
            started,
        ));
        return;
    };
    let (bytes_out, bytes_in, reason) = both_ways(state, conn, upstream, first).await;
    state.record(EgressEntry {
        event: "egress_allowed".into(),
        name: Some(name_of(dest)),
        port: Some(port),
        address: Some(addr.ip().to_string()),
        sni,
        via: via.word().into(),
        bytes_out,
        bytes_in,
        duration_ms: elapsed_ms(started),
        reason: reason.map(str::to_string),
        qtype: None,
    });
}

/// Relays until both directions end: bytes out, bytes in, and why it was cut, if it was.
async fn both_ways(
    state: &State,
    mut client: TcpStream,
    mut upstream: TcpStream,
    first: Vec<u8>,
) -> (u64, u64, Option<&'static str>) {
    // Either direction cut short (the budget, or the broker's held bytes) ends the
    // other too.
    let (cut, _) = watch::channel(None);
    // Counted by their descriptors until `_counted` drops, which is before the streams
    // (declared earlier, dropped later) close them: never a number another socket got.
    // However it ends, nothing it was given then stays behind in a socket no one owns.
    let sockets = [client.as_raw_fd(), upstream.as_raw_fd()];
    let _counted = state.held.count(sockets, &cut);
    // The sandbox's side was accepted with a small receive buffer (what it can leave
    // there before it is counted); relayed, it gets the full one.
    let _ = nix::sys::socket::setsockopt(
        &client,
        nix::sys::socket::sockopt::RcvBuf,
        &super::held::SANDBOX_SIDE_BUFFER,
    );
    let (cr, cw) = client.split();
    let (ur, mut uw) = upstream.split();
    let granted = state.take_budget(first.len());
    if granted < first.len() {
        return (0, 0, state.budget_spent().then_some("budget_exhausted"));
    }
    // An upstream that reads nothing leaves this write waiting; the stop ends it.
    let mut stop = state.stop.clone();
    let mut cut_seen = cut.subscribe();
    let head = tokio::select! {
        biased;
        why = ended(&mut stop, &mut cut_seen) => return (0, 0, Some(why)),
        w = uw.write_all(first.get(..granted).unwrap_or_default()) => w,
    };
    if head.is_err() {
        return (0, 0, None);
    }
    let sent = u64::try_from(granted).unwrap_or(0);
    let (up, down) = tokio::join!(one_way(state, cr, uw, &cut), one_way(state, ur, cw, &cut));
    let why = up.1.or(down.1);
    // Still counted while the last bytes and FINs reach their peers; what does not is
    // reset (by `_counted`) and said. A spent budget ends the relay, not what was relayed
    // before it: reset at once, a sandbox that had not read the bytes within its budget
    // yet lost them (its connect could even fail, the data, FIN and reset all in).
    let end = match why {
        None | Some("budget_exhausted") => drained(sockets, &mut stop, &mut cut_seen).await,
        Some(_) => None,
    };
    (sent.saturating_add(up.0), down.0, why.or(end))
}

/// Resolves once the broker stops, or the connection is cut: why.
async fn ended(
    stop: &mut watch::Receiver<bool>,
    cut: &mut watch::Receiver<Option<&'static str>>,
) -> &'static str {
    tokio::select! {
        _ = stop.wait_for(|s| *s) => "stopped",
        why = cut.wait_for(Option::is_some) => why.ok().and_then(|w| *w).unwrap_or("stopped"),
    }
}

/// One direction: bytes moved and why it was cut, if it was.
async fn one_way(
    state: &State,
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    cut: &Cut,
) -> (u64, Option<&'static str>) {
    let mut stop = state.stop.clone();
    let mut cut_seen = cut.subscribe();
    let mut buf = vec![0u8; CHUNK];
    let mut moved: u64 = 0;
    loop {
        let n = tokio::select! {
            why = ended(&mut stop, &mut cut_seen) => {
                let _ = to.shutdown().await;
                return (moved, Some(why));
            }
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return (moved, None);
                }
                Ok(n) => n,
            },
        };
        // Cut meanwhile: not one more chunk into its queues.
        if let Some(why) = *cut_seen.borrow() {
            return (moved, Some(why));
        }
        let granted = state.take_budget(n);
        let chunk = buf.get(..granted).unwrap_or_default();
        let written = tokio::select! {
            why = ended(&mut stop, &mut cut_seen) => return (moved, Some(why)),
            w = to.write_all(chunk) => w,
        };
        if written.is_err() {
            return (moved, None);
        }
        moved = moved.saturating_add(u64::try_from(granted).unwrap_or(0));
        state.held.moved();
        if state.held.pressed() {
            tokio::task::yield_now().await;
        }
        if granted < n {
            let _ = to.shutdown().await;
            cut.send_replace(Some("budget_exhausted"));
            return (moved, Some("budget_exhausted"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::net::{TcpListener, TcpSocket};

    /// The first bytes of a connection go to an upstream that accepts and never reads,
    /// through a send buffer far smaller than them: the write waits until the stop, which
    /// ends it (it used to wait past the broker's grace, and the connection went
    /// unrecorded).
    #[tokio::test]
    async fn a_first_write_an_upstream_never_reads_ends_at_the_stop() -> std::io::Result<()> {
        let (state, stop) = State::allowing_nothing();
        let sink = TcpSocket::new_v4()?;
        sink.set_recv_buffer_size(1)?;
        sink.bind("127.0.0.1:0".parse().map_err(std::io::Error::other)?)?;
        let sink = sink.listen(1)?;
        let upstream_at = sink.local_addr()?;
        let out = TcpSocket::new_v4()?;
        out.set_send_buffer_size(1)?;
        let upstream = out.connect(upstream_at).await?;
        let (_held, _) = sink.accept().await?;
        let front = TcpListener::bind("127.0.0.1:0").await?;
        let _client = TcpStream::connect(front.local_addr()?).await?;
        let (client, _) = front.accept().await?;
        let first = vec![b'x'; 4 << 20];
        let stopper = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = stop.send(true);
        };
        let (relayed, ()) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(both_ways(&state, client, upstream, first), stopper)
        })
        .await
        .map_err(|_| std::io::Error::other("the first write outlived the stop"))?;
        assert_eq!(relayed, (0, 0, Some("stopped")));
        Ok(())
    }
}
