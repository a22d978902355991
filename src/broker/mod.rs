//! The egress broker: the process that holds the other end of every byte a sandbox with
//! egress sends out. A sandbox's network namespace has only `lo`, where its pid 1 made the
//! listeners (a DNS stub, an HTTP proxy, one listener per allowed port) and handed them
//! out; the broker, forked by the supervisor and confined (see
//! [`crate::sandbox::confine`]), answers and decides on them with [`crate::egress`]: by
//! name, then by address, each connection recorded as an [`EgressEntry`].
//!
//! It dies with its supervisor; stopping it (the sandbox ended, the kill switch) closes
//! every connection it holds and returns what it recorded.

mod relay;
mod serve;

use std::io::{self, Read};
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
/// Most of those that are DNS answers or denials: a sandbox causes them at no cost, so
/// they never take the room of the connections that carried bytes.
const MAX_CHEAP_ENTRIES: usize = MAX_ENTRIES / 2;
/// Largest summary read back from a broker.
const MAX_SUMMARY: u64 = 4 << 20;

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
    /// Entries kept that are DNS answers or denials.
    #[serde(skip)]
    cheap: usize,
}

impl Summary {
    /// Counts `entry`'s bytes and keeps it while there is room (see
    /// [`MAX_CHEAP_ENTRIES`]); otherwise counts it as dropped.
    pub(crate) fn record(&mut self, entry: EgressEntry) {
        self.bytes_out = self.bytes_out.saturating_add(entry.bytes_out);
        self.bytes_in = self.bytes_in.saturating_add(entry.bytes_in);
        let cheap = entry.event != "egress_allowed";
        if self.entries.len() >= MAX_ENTRIES || (cheap && self.cheap >= MAX_CHEAP_ENTRIES) {
            self.dropped = self.dropped.saturating_add(1);
            return;
        }
        if cheap {
            self.cheap = self.cheap.saturating_add(1);
        }
        self.entries.push(entry);
    }
}

/// The supervisor's handle on a running broker.
pub struct Broker {
    pid: Option<Pid>,
    control: UnixStream,
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
        })
    }

    /// Stops the broker: every connection is closed; what it recorded comes back, or why
    /// it cannot (the broker died, or did not answer within `within` and was killed): a
    /// lost record is never passed off as an empty one.
    pub fn stop(mut self, within: Duration) -> Result<Summary, String> {
        let _ = self.control.shutdown(std::net::Shutdown::Write);
        let _ = self.control.set_read_timeout(Some(within));
        let mut text = Vec::new();
        let read = (&self.control).take(MAX_SUMMARY).read_to_end(&mut text);
        self.end();
        match (read, serde_json::from_slice(&text)) {
            (_, Ok(summary)) => Ok(summary),
            (Err(e), _) => Err(format!(
                "the egress broker did not report within {within:?} ({e})"
            )),
            (Ok(_), Err(_)) if text.is_empty() => {
                Err("the egress broker ended before it reported".into())
            }
            (Ok(_), Err(e)) => Err(format!("the egress broker's record is unreadable ({e})")),
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
