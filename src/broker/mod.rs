//! The egress broker: the process that holds the other end of every byte a sandbox with
//! egress sends out. A sandbox's network namespace has only `lo`, where its pid 1 made the
//! listeners (a DNS stub, an HTTP proxy, one listener per allowed port) and handed them
//! out; the broker, forked by the supervisor and confined (see
//! [`crate::sandbox::confine`]), answers and decides on them with [`crate::egress`]: by
//! name, then by address, each connection recorded as an [`EgressEntry`].
//!
//! It dies with its supervisor; stopping it (the sandbox ended, the kill switch) closes
//! every connection it holds and returns what it recorded.

mod held;
mod relay;
mod serve;
mod state;

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::egress::{AllowList, Resolution};
use crate::sandbox::{wait, zygote};

/// Most entries a broker keeps; past it, entries are counted, not kept.
pub const MAX_ENTRIES: usize = 1000;

/// What a broker enforces for one sandbox.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub allow: AllowList,
    pub resolution: Resolution,
    /// Bytes the sandbox may move through the broker, both ways together.
    pub max_bytes: Option<u64>,
    /// The transparent listeners' ports, in the order the sandbox made them.
    pub ports: Vec<u16>,
}

/// One DNS answer or one connection, allowed or denied: a `run` report's `egress` entry
/// (and, for workers, an audit entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressEntry {
    /// `egress_allowed`, `egress_denied`, `dns_answered` or `dns_refused`.
    pub event: String,
    pub name: Option<String>,
    pub port: Option<u16>,
    /// The address connected to (allowed connections).
    pub address: Option<String>,
    pub sni: Option<String>,
    /// `proxy`, `transparent` or `dns`.
    pub via: String,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub duration_ms: u64,
    /// Why it was denied or cut short; `null` otherwise.
    pub reason: Option<String>,
    /// The query type (DNS entries).
    pub qtype: Option<String>,
}

/// What a broker recorded over its life.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    pub entries: Vec<EgressEntry>,
    /// Entries past [`MAX_ENTRIES`], counted only.
    pub dropped: u64,
    /// Host-resolver lookups made (names in the operator's table are not lookups).
    pub lookups: u64,
    /// Bytes sent and received over every connection, kept as an entry or not.
    #[serde(default)]
    pub bytes_out: u64,
    #[serde(default)]
    pub bytes_in: u64,
}

/// One line from the broker to its supervisor.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    Entry(EgressEntry),
    /// The last line.
    Summary {
        dropped: u64,
        lookups: u64,
        bytes_out: u64,
        bytes_in: u64,
    },
}

/// Longest line read from a broker (an entry is far shorter).
const MAX_LINE: usize = 64 << 10;

/// The supervisor's handle on a running broker.
pub struct Broker {
    pid: Option<Pid>,
    control: UnixStream,
    /// A line not yet complete.
    partial: Vec<u8>,
    summary: Summary,
    /// Whether the broker's last line (its summary) has come.
    finished: bool,
    /// Whether its end of the socket is closed (it exited, or died).
    closed: bool,
}

impl Broker {
    /// Forks a broker serving `listeners` (DNS UDP, DNS TCP, proxy, then one per port of
    /// `config.ports`). Call while this process is single-threaded.
    pub fn start(config: BrokerConfig, listeners: Vec<OwnedFd>) -> io::Result<Broker> {
        let (ours, theirs) = UnixStream::pair()?;
        let mut keep: Vec<RawFd> = listeners.iter().map(AsRawFd::as_raw_fd).collect();
        keep.push(theirs.as_raw_fd());
        let pid = zygote::fork_helper("hatchery-broker", &keep, move || {
            serve::main(config, listeners, theirs)
        })?;
        Ok(Broker {
            pid: Some(pid),
            control: ours,
            partial: Vec::new(),
            summary: Summary::default(),
            finished: false,
            closed: false,
        })
    }

    /// The descriptor to poll: readable when entries wait.
    /// `None` once the broker's end is closed: a closed socket is always "ready", and
    /// polling it would spin.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        (!self.closed).then(|| self.control.as_fd())
    }

    /// The entries that have arrived, without waiting.
    pub fn take_entries(&mut self) -> Vec<EgressEntry> {
        let _ = self.control.set_nonblocking(true);
        self.read_lines(None);
        std::mem::take(&mut self.summary.entries)
    }

    /// Stops the broker: every connection is closed; what it recorded and has not been
    /// taken comes back, or why it cannot (the broker died, or did not finish within
    /// `within` and was killed): a lost record is never passed off as an empty one.
    pub fn stop(mut self, within: Duration) -> Result<Summary, String> {
        let _ = self.control.shutdown(std::net::Shutdown::Write);
        let _ = self.control.set_nonblocking(false);
        self.read_lines(Some(within));
        self.end();
        if self.finished {
            Ok(std::mem::take(&mut self.summary))
        } else {
            Err(format!(
                "the egress broker ended, or did not finish within {within:?}, before it reported"
            ))
        }
    }

    /// Reads lines until there are no more for now (`None`) or until the end or `within`.
    fn read_lines(&mut self, within: Option<Duration>) {
        let deadline = within.and_then(|w| std::time::Instant::now().checked_add(w));
        let mut buf = vec![0u8; 16 << 10];
        loop {
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() || self.control.set_read_timeout(Some(left)).is_err() {
                    return;
                }
            }
            let n = match self.control.read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(0) | Err(_) => {
                    self.closed = true;
                    return;
                }
                Ok(n) => n,
            };
            self.partial
                .extend_from_slice(buf.get(..n).unwrap_or_default());
            while let Some(at) = self.partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.partial.drain(..=at).collect();
                match serde_json::from_slice::<Line>(&line) {
                    // A broker is confined but parses hostile bytes: what it sends is
                    // bounded here too.
                    Ok(Line::Entry(_)) if self.summary.entries.len() >= 2 * MAX_ENTRIES => {
                        self.summary.dropped = self.summary.dropped.saturating_add(1);
                    }
                    Ok(Line::Entry(e)) => self.summary.entries.push(e),
                    Ok(Line::Summary {
                        dropped,
                        lookups,
                        bytes_out,
                        bytes_in,
                    }) => {
                        self.summary.dropped = self.summary.dropped.saturating_add(dropped);
                        self.summary.lookups = lookups;
                        self.summary.bytes_out = bytes_out;
                        self.summary.bytes_in = bytes_in;
                        self.finished = true;
                    }
                    Err(_) => {}
                }
            }
            if self.partial.len() > MAX_LINE {
                self.partial.clear();
            }
        }
    }

    fn end(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = wait::reap_child(pid);
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn entry(i: usize) -> EgressEntry {
        EgressEntry {
            event: "egress_allowed".into(),
            name: Some(format!("h{i}.example.com")),
            port: Some(443),
            address: None,
            sni: None,
            via: "proxy".into(),
            bytes_out: 1,
            bytes_in: 2,
            duration_ms: 0,
            reason: None,
            qtype: None,
        }
    }

    /// A broker parses hostile bytes: what a subverted one sends its supervisor is
    /// bounded and never taken on trust.
    #[test]
    fn what_a_subverted_broker_sends_is_bounded() -> io::Result<()> {
        let (ours, theirs) = UnixStream::pair()?;
        let broker = Broker {
            pid: None,
            control: ours,
            partial: Vec::new(),
            summary: Summary::default(),
            finished: false,
            closed: false,
        };
        let flood = 2 * MAX_ENTRIES + 5;
        let writer = std::thread::spawn(move || -> io::Result<()> {
            let mut theirs = theirs;
            // A line far past the longest read, then garbage, then too many entries.
            theirs.write_all(&vec![b'x'; 3 * MAX_LINE])?;
            theirs.write_all(b"\n{\"entry\": 17}\nnot json\n")?;
            for i in 0..flood {
                let mut line = serde_json::to_vec(&Line::Entry(entry(i)))?;
                line.push(b'\n');
                theirs.write_all(&line)?;
            }
            let summary = Line::Summary {
                dropped: 3,
                lookups: 4,
                bytes_out: 5,
                bytes_in: 6,
            };
            let mut line = serde_json::to_vec(&summary)?;
            line.push(b'\n');
            theirs.write_all(&line)
        });
        let summary = broker
            .stop(Duration::from_secs(10))
            .map_err(io::Error::other)?;
        writer
            .join()
            .map_err(|_| io::Error::other("writer panicked"))??;
        assert_eq!(summary.entries.len(), 2 * MAX_ENTRIES);
        assert_eq!(summary.dropped, 5 + 3);
        assert_eq!(
            (summary.lookups, summary.bytes_out, summary.bytes_in),
            (4, 5, 6)
        );
        Ok(())
    }

    #[test]
    fn a_broker_that_ends_without_its_summary_is_a_lost_record() -> io::Result<()> {
        let (ours, theirs) = UnixStream::pair()?;
        let broker = Broker {
            pid: None,
            control: ours,
            partial: Vec::new(),
            summary: Summary::default(),
            finished: false,
            closed: false,
        };
        let mut theirs = theirs;
        let mut line = serde_json::to_vec(&Line::Entry(entry(0)))?;
        line.push(b'\n');
        theirs.write_all(&line)?;
        drop(theirs);
        assert!(broker.stop(Duration::from_secs(5)).is_err());
        Ok(())
    }
}
