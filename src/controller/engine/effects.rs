//! What the engine does to the world, behind two small seams: [`Effects`] (the clock, the
//! launcher's socket, attaching a worker's connection, waking the engine later) and
//! [`Trail`] (the audit trail). The engine's decisions read and change only its own state
//! and these seams, so every decision can be driven in a unit test with a fake clock, a
//! launcher that only records, and a trail whose sync can be made to fail.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use crate::audit::{self, AuditError, AuditLog};
use crate::manifest::WorkerId;

use crate::controller::input::Input;
use crate::controller::launcher::LauncherRequest;
use crate::controller::link::{LinkError, Outbox};
use crate::controller::protocol::WorkerFrame;
use crate::controller::server;

type ReplySender<T> = tokio::sync::mpsc::Sender<T>;

/// Everything but the audit trail that the engine does outside its own memory.
pub trait Effects: Send {
    /// Milliseconds since the epoch: the clock every contract decision reads.
    fn now_ms(&self) -> u64;

    /// The monotonic clock the engine's own waits (kill, shutdown) are measured by.
    fn instant(&self) -> Instant;

    /// Queues a request for the launcher; writes nothing ([`Effects::flush_launcher`]
    /// does) and never blocks.
    fn push_launcher(
        &mut self,
        req: &LauncherRequest,
        fd: Option<OwnedFd>,
    ) -> Result<(), LinkError>;

    /// Writes what the launcher will take of the queued requests.
    fn flush_launcher(&mut self) -> Result<(), LinkError>;

    /// Takes back every queued launch the launcher has not begun to read: their worker ids.
    fn cancel_launches(&mut self) -> Vec<String>;

    /// Kills the launcher process (it did not stop when asked).
    fn kill_launcher(&mut self);

    /// Connects a worker's end of its socket to the engine: the sender of its replies,
    /// or `None` when it cannot be connected.
    fn attach_worker(&self, id: WorkerId, sock: UnixStream) -> Option<ReplySender<WorkerFrame>>;

    /// Hands `input` to the engine after `delay`.
    fn wake_after(&self, delay: Duration, input: Input);
}

/// The audit trail as the engine writes it.
pub trait Trail: Send {
    /// Adds an entry (buffered until [`Trail::sync`]): a `decision`, whose effect waits
    /// for the entry to be durable (a failed sync drops it, and its effect is undone), or
    /// a record of what happened (kept for the next sync).
    fn append(
        &mut self,
        event: &str,
        actor: &str,
        worker: Option<&str>,
        details: serde_json::Value,
        decision: bool,
    );

    /// Makes every appended entry durable. [`AuditError::Anchor`] means they are, and
    /// only the anchor failed; any other error, that the decisions were dropped.
    fn sync(&mut self) -> Result<(), AuditError>;

    /// Whether every entry appended is on disk and none was dropped.
    fn complete(&self) -> bool {
        true
    }

    /// How many entries the trail holds.
    fn entries(&self) -> u64;

    /// The last entry on disk, when nothing is waiting for a sync (what a cluster
    /// anchors).
    fn synced_head(&self) -> Option<crate::audit::SyncedHead> {
        None
    }
}

impl Trail for AuditLog {
    fn append(
        &mut self,
        event: &str,
        actor: &str,
        worker: Option<&str>,
        details: serde_json::Value,
        decision: bool,
    ) {
        let kind = if decision {
            crate::audit::EntryKind::Decision
        } else {
            crate::audit::EntryKind::Record
        };
        AuditLog::append_kind(self, event, actor, worker, details, kind);
    }

    fn sync(&mut self) -> Result<(), AuditError> {
        AuditLog::sync(self)
    }

    fn complete(&self) -> bool {
        AuditLog::complete(self)
    }

    fn entries(&self) -> u64 {
        AuditLog::len(self)
    }

    fn synced_head(&self) -> Option<crate::audit::SyncedHead> {
        AuditLog::synced_head(self)
    }
}

/// The controller's real effects: the system clock, the launcher's socket, the async
/// runtime that serves worker connections, and the engine's own input queue.
pub struct HostEffects {
    launcher: Outbox,
    launcher_pid: nix::unistd::Pid,
    rt: Handle,
    inputs: Sender<Input>,
}

impl HostEffects {
    pub fn new(
        launcher: Outbox,
        launcher_pid: nix::unistd::Pid,
        rt: Handle,
        inputs: Sender<Input>,
    ) -> HostEffects {
        HostEffects {
            launcher,
            launcher_pid,
            rt,
            inputs,
        }
    }
}

impl Effects for HostEffects {
    fn now_ms(&self) -> u64 {
        audit::now_ms()
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }

    fn push_launcher(
        &mut self,
        req: &LauncherRequest,
        fd: Option<OwnedFd>,
    ) -> Result<(), LinkError> {
        self.launcher.queue(req, fd)
    }

    fn flush_launcher(&mut self) -> Result<(), LinkError> {
        self.launcher.flush()
    }

    fn cancel_launches(&mut self) -> Vec<String> {
        self.launcher.cancel_launches()
    }

    fn kill_launcher(&mut self) {
        let _ = nix::sys::signal::kill(self.launcher_pid, nix::sys::signal::Signal::SIGKILL);
    }

    fn attach_worker(&self, id: WorkerId, sock: UnixStream) -> Option<ReplySender<WorkerFrame>> {
        server::attach_worker(&self.rt, id, sock, self.inputs.clone()).ok()
    }

    fn wake_after(&self, delay: Duration, input: Input) {
        let inputs = self.inputs.clone();
        self.rt.spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = inputs.send(input);
        });
    }
}
