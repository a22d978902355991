//! The request stream from the controller's engine to its launcher, both ends
//! non-blocking: neither process ever waits on the other.
//!
//! Why: the engine is the one thread every safety promise rests on (the kill switch, the
//! contract, the audit trail). A launcher that stops reading — blocked in a kernel call, a
//! bug, a stop signal — must not freeze it: the engine queues requests in an [`Outbox`]
//! (bounded; past the bound the launcher counts as unresponsive and new work is refused,
//! while the kill switch goes around it by cgroup). And a launcher must not take one bad
//! frame for its controller's end (which killed every sandbox): the [`Inbox`] refuses an
//! oversized or malformed request, skips it, and reads on.
//!
//! A frame is a 4-byte big-endian header, then JSON: the header's low 31 bits are the
//! JSON's length, its top bit says whether one descriptor (a worker's socket) was sent with
//! the frame's first bytes. Descriptors arrive in the order they were sent, at or before
//! the end of their frame, so the inbox keeps them in a queue and gives one to each frame
//! that says it has one — a frame it refuses included, whose descriptor is then closed.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::sandbox::zygote;

use super::launch_protocol::LauncherRequest;
use super::wire::{self, FrameError};

/// Bytes the engine queues for a launcher that is not reading, before it counts as
/// unresponsive.
pub const MAX_QUEUED: usize = 16 << 20;

/// The header bit of a frame sent with a descriptor.
const WITH_FD: u32 = 1 << 31;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("the request is {0} bytes; the launcher takes at most {max}", max = wire::MAX_FRAME)]
    TooLarge(usize),
    #[error("the launcher is not taking requests ({0} bytes wait for it)")]
    Stalled(usize),
    #[error("the launcher is gone: {0}")]
    Gone(io::Error),
    #[error("cannot encode the request: {0}")]
    Encode(String),
}

struct Out {
    bytes: Vec<u8>,
    sent: usize,
    fd: Option<OwnedFd>,
    /// The worker a launch request is for (launches not yet begun can be cancelled).
    launch_of: Option<String>,
}

/// The engine's end: requests queued and written as the launcher takes them.
pub struct Outbox {
    sock: UnixStream,
    queue: VecDeque<Out>,
    queued: usize,
}

impl Outbox {
    pub fn new(sock: UnixStream) -> io::Result<Outbox> {
        sock.set_nonblocking(true)?;
        Ok(Outbox {
            sock,
            queue: VecDeque::new(),
            queued: 0,
        })
    }

    /// Queues `req` (with `fd`, a worker's socket) and writes what the launcher takes now.
    /// A request larger than a frame is refused here, where it is made, never sent.
    pub fn push(&mut self, req: &LauncherRequest, fd: Option<OwnedFd>) -> Result<(), LinkError> {
        self.queue(req, fd)?;
        self.flush()
    }

    /// Queues a request without writing it (see [`Outbox::flush`]).
    pub fn queue(&mut self, req: &LauncherRequest, fd: Option<OwnedFd>) -> Result<(), LinkError> {
        let body = serde_json::to_vec(req).map_err(|e| LinkError::Encode(e.to_string()))?;
        if body.len() > wire::MAX_FRAME {
            return Err(LinkError::TooLarge(body.len()));
        }
        if self.queued > MAX_QUEUED {
            return Err(LinkError::Stalled(self.queued));
        }
        let len = u32::try_from(body.len()).map_err(|_| LinkError::TooLarge(body.len()))?;
        let header = if fd.is_some() { len | WITH_FD } else { len };
        let mut bytes = Vec::with_capacity(body.len().saturating_add(4));
        bytes.extend_from_slice(&header.to_be_bytes());
        bytes.extend_from_slice(&body);
        self.queued = self.queued.saturating_add(bytes.len());
        let launch_of = match req {
            LauncherRequest::Launch { spec } => Some(spec.worker_id.clone()),
            _ => None,
        };
        self.queue.push_back(Out {
            bytes,
            sent: 0,
            fd,
            launch_of,
        });
        Ok(())
    }

    /// Writes queued requests until the launcher stops taking them.
    pub fn flush(&mut self) -> Result<(), LinkError> {
        while let Some(front) = self.queue.front_mut() {
            let rest = front.bytes.get(front.sent..).unwrap_or_default();
            if rest.is_empty() {
                self.queue.pop_front();
                continue;
            }
            // The descriptor goes with the frame's first bytes, and only with them.
            let fds: Vec<_> = match (&front.fd, front.sent) {
                (Some(fd), 0) => vec![fd.as_fd()],
                _ => Vec::new(),
            };
            match zygote::send_some(&self.sock, rest, &fds) {
                Ok(n) => {
                    front.sent = front.sent.saturating_add(n);
                    self.queued = self.queued.saturating_sub(n);
                    if n > 0 {
                        front.fd = None;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(LinkError::Gone(e)),
            }
        }
        Ok(())
    }

    /// Bytes still waiting for the launcher.
    pub fn backlog(&self) -> usize {
        self.queued
    }

    /// Drops every launch request the launcher has not begun to receive (the kill switch:
    /// a launcher that was not reading must not start them once it reads again), and says
    /// which workers they were for.
    pub fn cancel_launches(&mut self) -> Vec<String> {
        let mut cancelled = Vec::new();
        let mut queued = self.queued;
        self.queue
            .retain_mut(|out| match (&out.launch_of, out.sent) {
                (Some(id), 0) => {
                    cancelled.push(id.clone());
                    queued = queued.saturating_sub(out.bytes.len());
                    false
                }
                _ => true,
            });
        self.queued = queued;
        cancelled
    }
}

/// What the launcher's end reads.
#[derive(Debug)]
pub enum Incoming {
    /// A request, with the descriptor that came with it.
    Request(LauncherRequest, Option<OwnedFd>),
    /// A frame that could not be taken (refused; the stream reads on after it).
    Refused(String),
    /// The controller closed its end.
    Closed,
}

/// The launcher's end: frames assembled from whatever has arrived, never waiting.
pub struct Inbox {
    sock: UnixStream,
    buf: Vec<u8>,
    /// Descriptors received and not yet given to a frame, in the order they came.
    fds: VecDeque<OwnedFd>,
    /// Bytes of an oversized frame still to be thrown away, and its size.
    skipping: Option<(usize, usize)>,
    closed: bool,
}

impl Inbox {
    pub fn new(sock: UnixStream) -> io::Result<Inbox> {
        sock.set_nonblocking(true)?;
        Ok(Inbox {
            sock,
            buf: Vec::new(),
            fds: VecDeque::new(),
            skipping: None,
            closed: false,
        })
    }

    pub fn socket(&self) -> &UnixStream {
        &self.sock
    }

    /// Reads what is there and returns every frame it completes.
    pub fn read(&mut self) -> Vec<Incoming> {
        let mut out = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        while !self.closed {
            match zygote::recv_some(&self.sock, &mut chunk) {
                Ok((0, _)) => self.closed = true,
                Ok((n, fds)) => {
                    self.fds.extend(fds);
                    self.buf
                        .extend_from_slice(chunk.get(..n).unwrap_or_default());
                    self.frames(&mut out);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => self.closed = true,
            }
        }
        if self.closed {
            out.push(Incoming::Closed);
        }
        out
    }

    /// Takes `n` bytes off the front of the buffer.
    fn consume(&mut self, n: usize) {
        let n = n.min(self.buf.len());
        self.buf.drain(..n);
    }

    fn frames(&mut self, out: &mut Vec<Incoming>) {
        loop {
            if let Some((left, size)) = self.skipping {
                let n = left.min(self.buf.len());
                self.consume(n);
                let left = left.saturating_sub(n);
                if left > 0 {
                    self.skipping = Some((left, size));
                    return;
                }
                self.skipping = None;
                out.push(Incoming::Refused(FrameError::TooLarge(size).to_string()));
                continue;
            }
            let Some(header) = self.buf.first_chunk::<4>() else {
                return;
            };
            let header = u32::from_be_bytes(*header);
            let with_fd = header & WITH_FD != 0;
            let len = usize::try_from(header & !WITH_FD).unwrap_or(usize::MAX);
            if len > wire::MAX_FRAME {
                self.consume(4);
                // Its descriptor (sent with its first bytes, so here by now) is closed.
                if with_fd {
                    self.fds.pop_front();
                }
                self.skipping = Some((len, len));
                continue;
            }
            let Some(total) = len.checked_add(4).filter(|t| *t <= self.buf.len()) else {
                return;
            };
            let parsed = wire::parse::<LauncherRequest>(self.buf.get(4..total).unwrap_or_default());
            let fd = if with_fd { self.fds.pop_front() } else { None };
            self.consume(total);
            out.push(match parsed {
                Ok(req) => Incoming::Request(req, fd),
                Err(e) => Incoming::Refused(e.to_string()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> io::Result<(Outbox, Inbox)> {
        let (a, b) = UnixStream::pair()?;
        Ok((Outbox::new(a)?, Inbox::new(b)?))
    }

    fn read_until(inbox: &mut Inbox, n: usize) -> Vec<Incoming> {
        let mut got = Vec::new();
        for _ in 0..200 {
            got.extend(inbox.read());
            if got.len() >= n {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        got
    }

    #[test]
    fn requests_arrive_in_order_with_their_descriptors() -> Result<(), Box<dyn std::error::Error>> {
        let (mut out, mut inbox) = pair()?;
        let (sock, _other) = UnixStream::pair()?;
        out.push(&LauncherRequest::Usage, None)?;
        out.push(&LauncherRequest::KillAll, Some(OwnedFd::from(sock)))?;
        out.push(&LauncherRequest::Usage, None)?;
        let got = read_until(&mut inbox, 3);
        assert!(matches!(
            got.first(),
            Some(Incoming::Request(LauncherRequest::Usage, None))
        ));
        assert!(matches!(
            got.get(1),
            Some(Incoming::Request(LauncherRequest::KillAll, Some(_)))
        ));
        assert!(matches!(
            got.get(2),
            Some(Incoming::Request(LauncherRequest::Usage, None))
        ));
        Ok(())
    }

    #[test]
    fn an_oversized_or_garbled_frame_is_one_refusal_and_the_stream_reads_on()
    -> Result<(), Box<dyn std::error::Error>> {
        let (a, b) = UnixStream::pair()?;
        let mut inbox = Inbox::new(b)?;
        let mut raw = a.try_clone()?;
        let big = wire::MAX_FRAME + 1;
        let mut frame = (big as u32 | WITH_FD).to_be_bytes().to_vec();
        frame.extend(std::iter::repeat_n(b'x', big));
        frame.extend_from_slice(&4u32.to_be_bytes());
        frame.extend_from_slice(b"nope");
        let ok = serde_json::to_vec(&LauncherRequest::Usage)?;
        frame.extend_from_slice(&(ok.len() as u32).to_be_bytes());
        frame.extend_from_slice(&ok);
        let writer = std::thread::spawn(move || std::io::Write::write_all(&mut raw, &frame));
        let got = read_until(&mut inbox, 3);
        writer.join().map_err(|_| "writer")??;
        assert!(
            matches!(got.first(), Some(Incoming::Refused(e)) if e.contains("larger")),
            "{got:?}"
        );
        assert!(matches!(got.get(1), Some(Incoming::Refused(_))), "{got:?}");
        assert!(
            matches!(
                got.get(2),
                Some(Incoming::Request(LauncherRequest::Usage, None))
            ),
            "{got:?}"
        );
        drop(a);
        assert!(matches!(
            read_until(&mut inbox, 1).last(),
            Some(Incoming::Closed)
        ));
        Ok(())
    }

    #[test]
    fn a_request_larger_than_a_frame_is_refused_where_it_is_made() -> io::Result<()> {
        let (mut out, _inbox) = pair()?;
        let req = LauncherRequest::Kill {
            worker_id: "x".repeat(wire::MAX_FRAME + 10),
        };
        assert!(matches!(out.push(&req, None), Err(LinkError::TooLarge(_))));
        assert_eq!(out.backlog(), 0);
        Ok(())
    }

    #[test]
    fn a_launcher_that_stops_reading_never_blocks_the_engine() -> io::Result<()> {
        let (mut out, _inbox) = pair()?;
        let req = LauncherRequest::Kill {
            worker_id: "w".repeat(200_000),
        };
        let mut stalled = false;
        for _ in 0..1000 {
            match out.push(&req, None) {
                Ok(()) => {}
                Err(LinkError::Stalled(_)) => {
                    stalled = true;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(stalled, "the outbox grew without bound");
        Ok(())
    }

    fn launch(id: &str) -> LauncherRequest {
        LauncherRequest::Launch {
            spec: Box::new(super::super::launch_protocol::LaunchSpec {
                worker_id: id.into(),
                command: vec!["true".into()],
                env: Vec::new(),
                cwd: None,
                ro: Vec::new(),
                rw: Vec::new(),
                memory: None,
                cpus: None,
                pids: None,
                timeout_ms: None,
                profile: "default".into(),
                log_name: format!("{id}.log"),
                share_network: false,
                payload_ids: None,
                allow_degraded: false,
                agent_binary: None,
                cgroup_name: id.into(),
                allow_exec: Vec::new(),
                max_output_bytes: None,
                egress: None,
            }),
        }
    }

    #[test]
    fn launches_the_launcher_has_not_begun_to_read_can_be_cancelled() -> io::Result<()> {
        let (mut out, mut inbox) = pair()?;
        let filler = LauncherRequest::Kill {
            worker_id: "w".repeat(100_000),
        };
        while out.backlog() == 0 {
            let _ = out.push(&filler, None);
        }
        let (sock, _other) = UnixStream::pair()?;
        let _ = out.push(&launch("a-1"), Some(OwnedFd::from(sock)));
        let _ = out.push(&LauncherRequest::Usage, None);
        let _ = out.push(&launch("a-2"), None);
        let before = out.backlog();
        assert_eq!(
            out.cancel_launches(),
            vec!["a-1".to_string(), "a-2".to_string()]
        );
        assert!(out.backlog() < before);
        // What stays arrives whole and in order; no launch among it.
        let mut got = Vec::new();
        for _ in 0..400 {
            let _ = out.flush();
            got.extend(inbox.read());
            if out.backlog() == 0
                && got
                    .iter()
                    .any(|g| matches!(g, Incoming::Request(LauncherRequest::Usage, _)))
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(
            got.iter()
                .any(|g| matches!(g, Incoming::Request(LauncherRequest::Usage, None)))
        );
        assert!(!got.iter().any(|g| matches!(
            g,
            Incoming::Request(LauncherRequest::Launch { .. }, _) | Incoming::Refused(_)
        )));
        Ok(())
    }
}
