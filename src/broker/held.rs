//! What a sandbox's connections make the broker hold in the kernel.
//!
//! Every byte the broker has taken from one side of a connection and cannot yet pass to
//! the other waits in one of its sockets: an upstream that never reads fills the
//! upstream's send queue, a sandbox that never reads fills the upstream's receive queue.
//! The kernel grows those buffers as it tunes each connection (to the host's `tcp_wmem`
//! and `tcp_rmem` maxima, megabytes each), and none of it is charged to the sandbox: the
//! broker runs outside the sandbox's cgroup. The host's TCP memory (`tcp_mem`) is one pool
//! for every connection of the host, so a sandbox holding its broker's 256 connections
//! full could push the host's own TCP into memory pressure. [`Held`] keeps the sum over a
//! broker's connections under [`MAX_HELD`]: a sweep adds up the memory every relayed
//! socket holds (as `tcp_mem` counts it) and cuts the connections holding the most, until
//! the rest fit (`buffers_full`).
//! Backpressure alone cannot do it: what the kernel has accepted into a receive queue is
//! held until it is read or the socket closes.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use crate::sandbox::net::{held_memory, reset_on_close, unacknowledged};

/// Most memory a broker's connections may hold in the kernel at once: enough for a
/// handful of transfers in flight over long round trips, a small part of the host's TCP
/// memory.
pub(super) const MAX_HELD: u64 = 64 << 20;

/// How often the sum is taken. A connection fills at most what the kernel lets it grow
/// to in this time before it is seen.
pub(super) const SWEEP_EVERY: Duration = Duration::from_millis(20);

/// Less than this held by all connections together, and no more than at the last look,
/// lets the sweep slow down.
const QUIET: u64 = 1 << 20;

/// The longest pause between two looks while the connections are quiet.
const SWEEP_QUIET: Duration = Duration::from_millis(500);

/// How long an ended connection may take to deliver what it was last given (and its
/// FIN), still counted, before it is reset instead.
pub(super) const DRAIN_WITHIN: Duration = Duration::from_secs(10);

/// Each buffer of a relayed connection's sandbox side (the kernel doubles it for its own
/// bookkeeping). That side is the sandbox's own loopback, whose round trip is microseconds:
/// a fixed buffer costs no throughput there, and without it the kernel grows the receive
/// buffer of a sandbox that writes faster than the upstream reads to the host's
/// `tcp_rmem` maximum (32 MiB on some hosts) between two sweeps.
pub(super) const SANDBOX_SIDE_BUFFER: usize = 256 * 1024;

/// The receive buffer of a connection accepted and not relayed yet (its head being read,
/// its host looked up or connected to), which no sweep counts: what 256 such
/// connections can leave in the broker is 256 times twice this.
pub(super) const WAITING_SIDE_BUFFER: usize = 64 * 1024;

/// The reason a connection cut by the sweep is recorded with.
pub(super) const BUFFERS_FULL: &str = "buffers_full";

/// Why a relayed connection was cut short, when it was (shared by both directions).
pub(super) type Cut = watch::Sender<Option<&'static str>>;

/// The broker's relayed connections, each with its two sockets and the way to cut it.
/// The sockets are known by their descriptors, which their relay keeps open for as long as
/// it is counted (see [`Held::count`]): no descriptor of the broker's own is spent on it
/// (a broker at its 256 connections already holds 512).
pub(super) struct Held {
    max: u64,
    next: AtomicU64,
    connections: Mutex<HashMap<u64, Connection>>,
    /// Set while the sweep has slowed down or waits for a first connection: then a
    /// connection counted or bytes moved wake it ([`Held::poke`]). A broker whose
    /// connections hold next to nothing and move nothing (a controller's idle worker
    /// keeping a connection open) does not wake every 20 ms.
    quiet: AtomicBool,
    poked: Mutex<bool>,
    wake: Condvar,
    /// Set once the broker stops: the sweep ends.
    stopped: AtomicBool,
    /// Set while the last look found more than half the limit held: relays then yield
    /// after every chunk (see [`Held::pressed`]).
    pressed: AtomicBool,
    /// Looks taken so far (what the tests of the pace watch).
    #[cfg(test)]
    sweeps: AtomicU64,
}

struct Connection {
    sockets: [RawFd; 2],
    cut: Cut,
}

/// A connection counted until it is dropped, which is before its sockets close. Then
/// each of them that still has something unacknowledged is made to close with a reset:
/// closed plainly, such a socket would live on in the kernel, owned by no process and
/// counted by no sweep, for as long as a peer that never reads keeps acknowledging probes
/// (minutes): a sandbox ending connection after connection to such a server left
/// hundreds of megabytes so. (What waits unread in a receive queue makes the kernel reset
/// at the close by itself.)
pub(super) struct Counted<'a> {
    held: &'a Held,
    id: u64,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        let removed = self.held.lock().remove(&self.id);
        for s in removed.map(|c| c.sockets).unwrap_or_default() {
            if unacknowledged(s).map_or(true, |n| n > 0) {
                let _ = reset_on_close(s);
            }
        }
    }
}

impl Held {
    pub(super) fn new(max: u64) -> Held {
        Held {
            max,
            next: AtomicU64::new(0),
            connections: Mutex::new(HashMap::new()),
            quiet: AtomicBool::new(true),
            poked: Mutex::new(false),
            wake: Condvar::new(),
            stopped: AtomicBool::new(false),
            pressed: AtomicBool::new(false),
            #[cfg(test)]
            sweeps: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Connection>> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts the connection whose two sockets are `sockets` until the result is dropped.
    /// The caller keeps both open until then: a descriptor closed while counted could be
    /// another socket's by the next sweep.
    pub(super) fn count(&self, sockets: [RawFd; 2], cut: &Cut) -> Counted<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let connection = Connection {
            sockets,
            cut: cut.clone(),
        };
        self.lock().insert(id, connection);
        self.poke();
        Counted { held: self, id }
    }

    /// Adds up what every connection holds and cuts the largest until the rest are
    /// within the limit: the total before, and how many were cut.
    pub(super) fn sweep(&self) -> (u64, usize) {
        #[cfg(test)]
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        let connections = self.lock();
        let mut sizes: Vec<(u64, u64)> = connections
            .iter()
            .map(|(id, c)| {
                let held = c
                    .sockets
                    .iter()
                    .map(|s| held_memory(*s).unwrap_or(0))
                    .fold(0u64, u64::saturating_add);
                (held, *id)
            })
            .collect();
        let total = sizes
            .iter()
            .map(|(h, _)| *h)
            .fold(0u64, u64::saturating_add);
        self.pressed.store(total > self.max / 2, Ordering::Relaxed);
        let mut left = total;
        let mut cut = 0;
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        for (size, id) in sizes {
            if left <= self.max {
                break;
            }
            // Its relay ends, and its [`Counted`] resets what it still holds.
            // Told even when already cut for its budget: it may be draining.
            if let Some(c) = connections.get(&id) {
                c.cut.send_modify(|why| {
                    why.get_or_insert(BUFFERS_FULL);
                });
                cut += 1;
            }
            left = left.saturating_sub(size);
        }
        (total, cut)
    }

    /// Whether relays should yield after every chunk. The broker's runtime has one
    /// thread, and a relay polled while its sockets take bytes moves up to tokio's
    /// budget (128 chunks, 2 MiB) before the next runs: 200 connections pushing bytes
    /// filled 200 MiB in one round, before the connections a look had cut could close.
    pub(super) fn pressed(&self) -> bool {
        self.pressed.load(Ordering::Relaxed)
    }

    /// Wakes the sweep now.
    fn poke(&self) {
        *self.poked.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.wake.notify_one();
    }

    /// Bytes moved through a connection: a sweep that had slowed down looks again now.
    /// (One load while it has not.)
    pub(super) fn moved(&self) {
        if self.quiet.load(Ordering::Relaxed) {
            self.poke();
        }
    }

    /// Ends [`Held::sweeping`].
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.poke();
    }

    /// Waits for a poke, or `pause` (none: for a poke only), or the stop: whether to go on.
    fn rest(&self, pause: Option<Duration>) -> bool {
        let mut poked = self.poked.lock().unwrap_or_else(PoisonError::into_inner);
        while !*poked && !self.stopped.load(Ordering::Relaxed) {
            match pause {
                None => {
                    poked = self
                        .wake
                        .wait(poked)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                Some(pause) => {
                    let (guard, timeout) = self
                        .wake
                        .wait_timeout(poked, pause)
                        .unwrap_or_else(PoisonError::into_inner);
                    poked = guard;
                    if timeout.timed_out() {
                        break;
                    }
                }
            }
        }
        *poked = false;
        !self.stopped.load(Ordering::Relaxed)
    }

    /// The sweep, on a thread of its own until [`Held::stop`]: the broker's runtime has
    /// one thread, and with hundreds of connections moving bytes as fast as they can, a
    /// timer on it fired a tenth of a second late while they filled 250 MiB. Every
    /// [`SWEEP_EVERY`] while the connections hold or gain something; while they hold less
    /// than [`QUIET`] and gain nothing, the pause doubles up to [`SWEEP_QUIET`], and any
    /// bytes moved, or a new connection, end it at once: held memory grows only from
    /// bytes moved (into a queue the broker writes, or one it stopped reading after moving
    /// bytes through it), so a burst after a quiet spell is seen within its first chunk.
    pub(super) fn sweeping(&self) {
        let mut pause = SWEEP_EVERY;
        let mut last = 0u64;
        loop {
            let idle = self.lock().is_empty();
            self.quiet
                .store(idle || pause > SWEEP_EVERY, Ordering::Relaxed);
            if !self.rest((!idle).then_some(pause)) {
                return;
            }
            self.quiet.store(false, Ordering::Relaxed);
            let (total, _) = self.sweep();
            pause = if total >= QUIET || total > last {
                SWEEP_EVERY
            } else {
                pause.saturating_mul(2).min(SWEEP_QUIET)
            };
            last = total;
        }
    }
}

/// How long a connection that ended may still deliver what it was given once the broker
/// is stopped (within the stop's grace of 0.5 s).
const STOP_DRAIN: Duration = Duration::from_millis(250);

/// The pause between two looks at the sandbox's side alone: a sandbox that reads what it
/// was sent late (or never, until it ends) keeps its connection waiting, at one look a
/// second.
const CLIENT_LOOK: Duration = Duration::from_secs(1);

/// Waits until both peers of an ended connection have acknowledged all that was written
/// to them, still counted: `None` then, or why it was given up with bytes undelivered.
/// The upstream has [`DRAIN_WITHIN`] (`undelivered`); the sandbox's side has until the
/// sandbox reads them (its buffers are fixed and small, and the connection keeps its slot
/// meanwhile). At the stop either has [`STOP_DRAIN`] more (`stopped`); a cut ends it at
/// once.
pub(super) async fn drained(
    [client, upstream]: [RawFd; 2],
    stop: &mut watch::Receiver<bool>,
    cut: &mut watch::Receiver<Option<&'static str>>,
) -> Option<&'static str> {
    // A cut from here on is the sweep's (the relay's own, for a spent budget, is seen).
    cut.borrow_and_update();
    let deadline = tokio::time::Instant::now() + DRAIN_WITHIN;
    let mut stopping: Option<tokio::time::Instant> = None;
    let mut pause = Duration::from_millis(1);
    loop {
        let upstream_left = unacknowledged(upstream).unwrap_or(0);
        let client_left = unacknowledged(client).unwrap_or(0);
        if upstream_left == 0 && client_left == 0 {
            return None;
        }
        let now = tokio::time::Instant::now();
        if stopping.is_some_and(|until| now >= until) {
            return Some("stopped");
        }
        if upstream_left > 0 && now >= deadline {
            return Some("undelivered");
        }
        let look = if upstream_left > 0 {
            pause.min(SWEEP_EVERY)
        } else {
            pause.min(CLIENT_LOOK)
        };
        tokio::select! {
            _ = stop.wait_for(|s| *s), if stopping.is_none() => {
                stopping = Some(now + STOP_DRAIN);
            }
            changed = cut.changed() => {
                let why = changed.ok().and(*cut.borrow());
                return Some(why.unwrap_or("stopped"));
            }
            _ = tokio::time::sleep(look) => {}
        }
        pause = pause.saturating_mul(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    /// A connected pair on loopback: the writer's bytes wait in the reader's receive
    /// queue while nothing reads them.
    fn pair() -> std::io::Result<(TcpStream, TcpStream)> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let w = TcpStream::connect(l.local_addr()?)?;
        let (r, _) = l.accept()?;
        Ok((w, r))
    }

    fn fill(w: &mut TcpStream, bytes: usize) -> std::io::Result<()> {
        w.write_all(&vec![7u8; bytes])?;
        // Delivered to the other end's receive queue, not only sent.
        std::thread::sleep(Duration::from_millis(50));
        Ok(())
    }

    #[test]
    fn the_connections_holding_the_most_are_cut_until_the_rest_fit() -> std::io::Result<()> {
        let held = Held::new(100_000);
        let (mut w1, r1) = pair()?;
        let (mut w2, r2) = pair()?;
        let (mut w3, r3) = pair()?;
        let cuts: Vec<Cut> = (0..3).map(|_| watch::channel(None).0).collect();
        let _a = held.count([r1.as_raw_fd(), w1.as_raw_fd()], &cuts[0]);
        let _b = held.count([r2.as_raw_fd(), w2.as_raw_fd()], &cuts[1]);
        let _c = held.count([r3.as_raw_fd(), w3.as_raw_fd()], &cuts[2]);
        fill(&mut w1, 20_000)?;
        fill(&mut w2, 90_000)?;
        fill(&mut w3, 30_000)?;
        let (total, cut) = held.sweep();
        assert!(total >= 140_000, "{total}");
        assert_eq!(cut, 1);
        assert_eq!(*cuts[1].borrow(), Some(BUFFERS_FULL));
        assert_eq!(*cuts[0].borrow(), None);
        assert_eq!(*cuts[2].borrow(), None);
        // Within the limit, nothing is cut.
        let (_, again) = Held::new(u64::MAX).sweep();
        assert_eq!(again, 0);
        Ok(())
    }

    /// Reads until the end: `Ok` at a FIN, the error at a reset.
    fn read_to_end(r: &mut TcpStream) -> std::io::Result<usize> {
        use std::io::Read;
        r.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0;
        loop {
            match r.read(&mut buf)? {
                0 => return Ok(total),
                n => total += n,
            }
        }
    }

    #[test]
    fn a_socket_closed_with_bytes_its_peer_has_not_taken_is_reset() -> std::io::Result<()> {
        let (mut w, mut r) = pair()?;
        w.set_nonblocking(true)?;
        let chunk = vec![1u8; 1 << 16];
        let held = Held::new(MAX_HELD);
        let (cut, _) = watch::channel(None);
        let counted = held.count([w.as_raw_fd(), r.as_raw_fd()], &cut);
        // Until the kernel takes no more: the rest waits, unacknowledged.
        while w.write(&chunk).is_ok() {}
        drop(counted);
        drop(w);
        let end = read_to_end(&mut r);
        assert_eq!(
            end.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::ConnectionReset)
        );
        Ok(())
    }

    #[test]
    fn a_socket_whose_peer_has_everything_closes_plainly() -> std::io::Result<()> {
        let (mut w, mut r) = pair()?;
        w.write_all(b"all of it")?;
        let mut got = [0u8; 9];
        std::io::Read::read_exact(&mut r, &mut got)?;
        let mut stop = watch::channel(false).1;
        let (cutter, mut cut) = watch::channel(None);
        let sockets = [w.as_raw_fd(), r.as_raw_fd()];
        let held = Held::new(MAX_HELD);
        let counted = held.count(sockets, &cutter);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        let started = std::time::Instant::now();
        assert_eq!(
            runtime.block_on(drained(sockets, &mut stop, &mut cut)),
            None
        );
        assert!(started.elapsed() < DRAIN_WITHIN);
        drop(counted);
        drop(w);
        assert_eq!(read_to_end(&mut r)?, 0);
        Ok(())
    }

    #[test]
    fn quiet_connections_are_looked_at_less_often_until_bytes_move() -> std::io::Result<()> {
        let held = std::sync::Arc::new(Held::new(MAX_HELD));
        let (w, r) = pair()?;
        let (cut, _) = watch::channel(None);
        let counted = held.count([r.as_raw_fd(), w.as_raw_fd()], &cut);
        let sweeping = std::sync::Arc::clone(&held);
        let sweep = std::thread::spawn(move || sweeping.sweeping());
        std::thread::sleep(Duration::from_millis(1500));
        let quiet = held.sweeps.load(Ordering::Relaxed);
        // 20, 40, 80, 160, 320, then 500 ms: not 75 looks.
        assert!(quiet <= 12, "{quiet} looks in 1.5 s of quiet");
        held.moved();
        std::thread::sleep(Duration::from_millis(30));
        let after = held.sweeps.load(Ordering::Relaxed);
        assert!(after > quiet, "bytes moved and no look within 30 ms");
        drop(counted);
        held.stop();
        assert!(sweep.join().is_ok());
        Ok(())
    }

    #[test]
    fn the_sweep_waits_for_a_first_connection_and_ends_at_the_stop() {
        let held = std::sync::Arc::new(Held::new(MAX_HELD));
        let sweeping = std::sync::Arc::clone(&held);
        let sweep = std::thread::spawn(move || sweeping.sweeping());
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(held.sweeps.load(Ordering::Relaxed), 0);
        held.stop();
        assert!(sweep.join().is_ok());
    }

    #[test]
    fn a_connection_ended_is_no_longer_counted() -> std::io::Result<()> {
        let held = Held::new(1);
        let (mut w, r) = pair()?;
        let (cut, _) = watch::channel(None);
        let counted = held.count([r.as_raw_fd(), w.as_raw_fd()], &cut);
        fill(&mut w, 10_000)?;
        drop(counted);
        assert_eq!(held.sweep(), (0, 0));
        assert_eq!(*cut.borrow(), None);
        Ok(())
    }
}
