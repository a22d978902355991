//! The async side of the controller: it accepts API clients (checking their credentials),
//! reads and writes worker sockets, relays the launcher's events and ticks the reaper.
//! It decides nothing; every message goes to the engine thread as an [`Input`].

use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::runtime::Handle;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{Sender as ReplySender, channel};
use tokio::sync::{Semaphore, oneshot};

use crate::manifest::WorkerId;
use crate::pace::TokenBucket;

use super::api_slots::{ApiSlots, Slot};
use super::input::Input;
use super::launcher::LauncherEvent;
use super::protocol::{self, ApiRequest, ApiResponse, WorkerFrame, WorkerMessage, WorkerReply};
use super::wire::{self, FrameError};

/// Replies queued for one worker. A worker that lets this many pile up is not reading them
/// (it sends and never reads), and is disconnected rather than let grow the controller.
pub const REPLY_QUEUE: usize = 64;

/// A frame that has started must be complete within this time.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an API connection may wait before its next request (the CLI sends its one
/// request at once): an idle one gives its slot back.
pub const API_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The pause after a failed `accept` (out of descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Messages per second a worker may send on average, and the burst it may save up.
const WORKER_RATE: f64 = 20.0;
const WORKER_BURST: f64 = 40.0;
/// Inputs from one worker the engine may have queued and not yet handled.
const IN_FLIGHT_PER_WORKER: usize = 4;

/// Who may use the API socket.
#[derive(Debug, Clone, Copy)]
pub struct AccessPolicy {
    /// The controller's own uid (always allowed, as is root).
    pub owner_uid: u32,
    /// Members of this group may connect too (the socket is then mode 0660).
    pub group: Option<u32>,
}

impl AccessPolicy {
    fn allows(&self, uid: u32, gid: u32, pid: i32) -> bool {
        if uid == 0 || uid == self.owner_uid {
            return true;
        }
        let Some(group) = self.group else {
            return false;
        };
        gid == group || supplementary_groups(pid).contains(&group)
    }
}

fn supplementary_groups(pid: i32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                g.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// Reads one frame body: `idle` (if any) to wait for a frame to begin, [`FRAME_TIMEOUT`]
/// for it to complete once it has. A connection idle for longer ends, as at end of stream.
async fn read_body(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    idle: Option<Duration>,
) -> Result<Option<Vec<u8>>, FrameError> {
    let mut first = [0u8; 1];
    let begun = tokio::io::AsyncReadExt::read(stream, &mut first);
    let n = match idle {
        Some(limit) => match tokio::time::timeout(limit, begun).await {
            Ok(n) => n?,
            Err(_) => return Ok(None),
        },
        None => begun.await?,
    };
    if n == 0 {
        return Ok(None);
    }
    let mut rest = PrefixedReader {
        first: Some(first[0]),
        inner: stream,
    };
    match tokio::time::timeout(FRAME_TIMEOUT, wire::read_body_async(&mut rest)).await {
        Ok(r) => r,
        Err(_) => Err(FrameError::Stalled(FRAME_TIMEOUT)),
    }
}

/// A reader that yields one already-read byte before the rest of the stream.
struct PrefixedReader<'a, R> {
    first: Option<u8>,
    inner: &'a mut R,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for PrefixedReader<'_, R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if let Some(b) = self.first.take() {
            buf.put_slice(&[b]);
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut *self.inner).poll_read(cx, buf)
    }
}

/// Takes over the controller's end of a new worker's socket: a reader task feeding the
/// engine and a writer task draining the returned sender.
pub fn attach_worker(
    rt: &Handle,
    id: WorkerId,
    stream: StdUnixStream,
    inputs: Sender<Input>,
) -> std::io::Result<ReplySender<WorkerFrame>> {
    stream.set_nonblocking(true)?;
    let _guard = rt.enter();
    let stream = UnixStream::from_std(stream)?;
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = channel::<WorkerFrame>(REPLY_QUEUE);
    // The reader answers a dropped message itself, so a client that waits for one reply
    // per request is told and does not hang; a weak handle, so that the engine dropping its
    // sender still closes the connection.
    let answer = tx.downgrade();
    rt.spawn(async move {
        while let Some(reply) = rx.recv().await {
            if wire::write_frame_async(&mut wr, &reply).await.is_err() {
                break;
            }
        }
        // The engine dropped the connection (the worker is stopping): close our end.
        let _ = wr.shutdown().await;
    });
    rt.spawn(async move {
        let mut bucket = TokenBucket::new(WORKER_BURST, WORKER_RATE);
        let mut dropped = 0u64;
        let mut last_report: Option<Instant> = None;
        // A connection's places in the engine's queue: with all of them taken, the next
        // frame is not read until the engine has handled one (the worker's socket fills
        // and it waits), so no worker can queue more than this however far behind the
        // engine is.
        let places = Arc::new(Semaphore::new(IN_FLIGHT_PER_WORKER));
        loop {
            let Ok(in_flight) = places.clone().acquire_owned().await else {
                break;
            };
            match read_body(&mut rd, None).await {
                Ok(Some(body)) => {
                    if !bucket.take(Instant::now()) {
                        // Report the first drop at once, then at most once a second.
                        dropped = dropped.saturating_add(1);
                        let told = answer.upgrade().map(|answer| {
                            answer.try_send(WorkerFrame {
                                call: protocol::call_of(&body),
                                reply: WorkerReply::error(format!(
                                    "rate limited: message dropped (at most {WORKER_RATE} a second, bursts of {WORKER_BURST})"
                                )),
                            })
                        });
                        // A full queue: the worker sends without reading what it is sent.
                        // It is stopped, as the engine stops one whose replies pile up,
                        // not left flooding with its answers lost.
                        if let Some(Err(TrySendError::Full(_))) = told {
                            let _ = inputs.send(Input::WorkerNotReading { id: id.clone() });
                            break;
                        }
                        if last_report.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                            let _ = inputs.send(Input::WorkerRateLimited {
                                id: id.clone(),
                                dropped,
                            });
                            dropped = 0;
                            last_report = Some(Instant::now());
                        }
                        // The next message waits a token's time: a worker that reads each
                        // answer and asks again at once would otherwise have its reader
                        // answer refusals as fast as it can ask (a quarter of a core).
                        tokio::time::sleep(bucket.token_time()).await;
                        continue;
                    }
                    let input = match wire::parse::<WorkerMessage>(&body) {
                        Ok(message) => Input::Worker {
                            id: id.clone(),
                            message,
                            in_flight: Some(in_flight),
                        },
                        Err(e) => Input::WorkerProtocolError {
                            id: id.clone(),
                            error: e.to_string(),
                            call: protocol::call_of(&body),
                            in_flight: Some(in_flight),
                        },
                    };
                    if inputs.send(input).is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                // The worker went away (its sandbox ended with our welcome unread): no offence.
                Err(FrameError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                    ) =>
                {
                    break;
                }
                Err(e) => {
                    // Framing is lost (oversized, truncated): this connection is over.
                    let _ = inputs.send(Input::WorkerProtocolError {
                        id: id.clone(),
                        error: e.to_string(),
                        call: None,
                        in_flight: Some(in_flight),
                    });
                    break;
                }
            }
        }
        let _ = inputs.send(Input::WorkerDisconnected { id });
    });
    Ok(tx)
}

async fn api_client(mut stream: UnixStream, uid: u32, inputs: Sender<Input>, slot: Slot) {
    loop {
        let body = match read_body(&mut stream, Some(API_IDLE_TIMEOUT)).await {
            Ok(Some(b)) => b,
            Ok(None) => return,
            Err(e) => {
                let _ = wire::write_frame_async(
                    &mut stream,
                    &ApiResponse::Error {
                        message: e.to_string(),
                    },
                )
                .await;
                return;
            }
        };
        let wait = slot.pace();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let response = match wire::parse::<ApiRequest>(&body) {
            Ok(request) => {
                let (tx, rx) = oneshot::channel();
                if inputs
                    .send(Input::Api {
                        peer_uid: uid,
                        request: Box::new(request),
                        reply: tx,
                    })
                    .is_err()
                {
                    return;
                }
                match rx.await {
                    Ok(r) => r,
                    Err(_) => ApiResponse::Error {
                        message: "the controller is stopping".into(),
                    },
                }
            }
            Err(e) => ApiResponse::Error {
                message: e.to_string(),
            },
        };
        if wire::write_frame_async_limited(&mut stream, &response, wire::MAX_RESPONSE)
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Accepts API clients until the runtime stops.
pub async fn accept_clients(listener: UnixListener, policy: AccessPolicy, inputs: Sender<Input>) {
    let slots = ApiSlots::new(policy.owner_uid);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors (or another failure that would repeat at once): the
                // connection stays queued; trying again at once would only spin.
                tracing::warn!(error = %e, "cannot accept an API connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let cred = match stream.peer_cred() {
            Ok(c) => c,
            Err(_) => continue,
        };
        let (uid, gid, pid) = (cred.uid(), cred.gid(), cred.pid().unwrap_or(0));
        if !policy.allows(uid, gid, pid) {
            let _ = inputs.send(Input::ClientRejected { uid, pid });
            let mut stream = stream;
            let _ = wire::write_frame_async(
                &mut stream,
                &ApiResponse::Error {
                    message: format!("uid {uid} may not use this controller"),
                },
            )
            .await;
            continue;
        }
        match slots.take(uid) {
            Ok(slot) => {
                tokio::spawn(api_client(stream, uid, inputs.clone(), slot));
            }
            Err(full) => {
                let mut stream = stream;
                let refusal = ApiResponse::Error {
                    message: full.to_string(),
                };
                let _ = tokio::time::timeout(
                    FRAME_TIMEOUT,
                    wire::write_frame_async(&mut stream, &refusal),
                )
                .await;
            }
        }
    }
}

/// Relays the launcher's events to the engine; its end of stream means it is gone.
pub async fn relay_launcher(mut events: UnixStream, inputs: Sender<Input>) {
    loop {
        match wire::read_body_async(&mut events).await {
            Ok(Some(body)) => match wire::parse::<LauncherEvent>(&body) {
                Ok(ev) => {
                    if inputs.send(Input::Launcher(ev)).is_err() {
                        return;
                    }
                }
                Err(e) => tracing::error!(error = %e, "malformed launcher event"),
            },
            Ok(None) | Err(_) => {
                let _ = inputs.send(Input::LauncherGone);
                return;
            }
        }
    }
}

/// Ticks the engine's periodic checks (reaping, expiry, audit sync).
pub async fn ticker(inputs: Sender<Input>, every: Duration) {
    let mut interval = tokio::time::interval(every);
    loop {
        interval.tick().await;
        if inputs.send(Input::Tick).is_err() {
            return;
        }
    }
}
