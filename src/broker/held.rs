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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::sandbox::net::{held_memory, reset_on_close, unacknowledged};

/// Most memory a broker's connections may hold in the kernel at once: enough for a
/// handful of transfers in flight over long round trips, a small part of the host's TCP
/// memory.
pub(super) const MAX_HELD: u64 = 64 << 20;

/// How often the sum is taken. A connection fills at most what the kernel lets it grow
/// to in this time before it is seen.
pub(super) const SWEEP_EVERY: Duration = Duration::from_millis(20);

/// How long an ended connection may take to deliver what it was last given (and its
/// FIN), still counted, before it is reset instead.
pub(super) const DRAIN_WITHIN: Duration = Duration::from_secs(10);

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
    /// Wakes the sweep when a connection is counted: a broker without connections (a
    /// controller's idle worker) does not wake every 20 ms.
    counted: Notify,
}

struct Connection {
    sockets: [RawFd; 2],
    cut: Cut,
}

/// A connection counted until it is dropped.
pub(super) struct Counted<'a> {
    held: &'a Held,
    id: u64,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        let removed = self.held.lock().remove(&self.id);
        drop(removed);
    }
}

impl Held {
    pub(super) fn new(max: u64) -> Held {
        Held {
            max,
            next: AtomicU64::new(0),
            connections: Mutex::new(HashMap::new()),
            counted: Notify::new(),
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
        self.counted.notify_one();
        Counted { held: self, id }
    }

    /// Adds up what every connection holds and cuts the largest until the rest are
    /// within the limit: the total before, and how many were cut.
    pub(super) fn sweep(&self) -> (u64, usize) {
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
        let mut left = total;
        let mut cut = 0;
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        for (size, id) in sizes {
            if left <= self.max {
                break;
            }
            if let Some(c) = connections.get(&id) {
                // Closed with a reset: what waits in its queues is freed at once, not
                // held until a peer that never reads gives up on it.
                for s in c.sockets {
                    let _ = reset_on_close(s);
                }
                c.cut.send_if_modified(|why| {
                    let first = why.is_none();
                    if first {
                        *why = Some(BUFFERS_FULL);
                    }
                    first
                });
                cut += 1;
            }
            left = left.saturating_sub(size);
        }
        (total, cut)
    }

    /// Sweeps every [`SWEEP_EVERY`] while there are connections, until the broker stops.
    pub(super) async fn watch(&self, mut stop: watch::Receiver<bool>) {
        loop {
            let idle = self.lock().is_empty();
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = self.counted.notified(), if idle => {}
                _ = tokio::time::sleep(SWEEP_EVERY), if !idle => {}
            }
            self.sweep();
        }
    }
}

/// Resets, when dropped, each of a connection's sockets that still has something
/// unacknowledged. Closed plainly, such a socket would live on in the kernel, owned by
/// no process and counted by no sweep, for as long as a peer that never reads keeps
/// acknowledging probes (minutes): a sandbox ending connection after connection to such
/// a server left hundreds of megabytes so. Dropped before the sockets close.
pub(super) struct ResetUnsent(pub(super) [RawFd; 2]);

impl Drop for ResetUnsent {
    fn drop(&mut self) {
        for s in self.0 {
            if unacknowledged(s).map_or(true, |n| n > 0) {
                let _ = reset_on_close(s);
            }
        }
    }
}

/// Waits, within [`DRAIN_WITHIN`], until both sockets' peers have acknowledged all that
/// was written to them, unless the broker stops or the connection is cut first.
pub(super) async fn drained(
    sockets: [RawFd; 2],
    stop: &mut watch::Receiver<bool>,
    cut: &mut watch::Receiver<Option<&'static str>>,
) {
    let deadline = tokio::time::Instant::now() + DRAIN_WITHIN;
    let mut pause = Duration::from_millis(1);
    loop {
        let left = sockets
            .iter()
            .map(|s| unacknowledged(*s).unwrap_or(0))
            .fold(0u64, u64::saturating_add);
        if left == 0 || tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = cut.wait_for(Option::is_some) => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = pause.saturating_mul(2).min(SWEEP_EVERY);
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
        // Until the kernel takes no more: the rest waits, unacknowledged.
        while w.write(&chunk).is_ok() {}
        drop(ResetUnsent([w.as_raw_fd(), r.as_raw_fd()]));
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
        let mut cut = watch::channel(None).1;
        let sockets = [w.as_raw_fd(), r.as_raw_fd()];
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        let started = std::time::Instant::now();
        runtime.block_on(drained(sockets, &mut stop, &mut cut));
        assert!(started.elapsed() < DRAIN_WITHIN);
        drop(ResetUnsent(sockets));
        drop(w);
        assert_eq!(read_to_end(&mut r)?, 0);
        Ok(())
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
