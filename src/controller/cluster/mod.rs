//! Many controllers, one contract: the admission state, the kill switch and lineage kept
//! in etcd (`controller --cluster etcd://HOST:PORT[,...] --node-id NAME`).
//!
//! What lives where (under the cluster prefix, `/hatchery/` by default):
//!
//! | key | value | lease |
//! | --- | --- | --- |
//! | `workers/<id>` | [`WorkerRecord`]: the slot, its node, its parent's last spawn | the node's |
//! | `history` | [`History`]: spawns per second (rate stop conditions), lifetime total | none |
//! | `control/kill-switch` | [`KillSwitchRecord`] | none |
//! | `control/kill/<id>` | [`KillRequest`] for a worker on another node | none |
//! | `nodes/<node>` | [`NodeRecord`]: a live node | the node's |
//! | `acks/<node>` | [`AckRecord`]: the last kill switch the node carried out | none |
//! | `audit/<node>` | [`AnchorRecord`]: the node's audit head | none |
//!
//! Admission is one transaction (see [`records::Snapshot`] and the etcd store): read
//! `workers/`, `history` and the kill switch at one revision, decide with the contract,
//! write only if the kill switch is absent and nothing under `workers/` or `history` changed
//! since — else read again. A node whose lease it cannot renew kills its workers before
//! the lease can expire (the launcher holds a deadline of its own, so a frozen controller
//! fences too), and refuses new workers while etcd cannot be reached.
//!
//! The options, the key layout and the records are plain data, built without the
//! `cluster` feature; the etcd client is in `etcd` (feature `cluster`).

pub mod anchored;
pub mod clock;
pub mod options;
pub mod records;

#[cfg(feature = "cluster")]
pub mod etcd;

use tokio::sync::oneshot;

use crate::manifest::WorkerId;

use super::protocol::ApiResponse;

pub use anchored::check_anchored_head;
pub use clock::boottime_ms;
pub use options::{ClusterArgs, ClusterOptions, ClusterTls, NodeId};
pub use records::{
    AckRecord, AnchorRecord, ClusterWorker, History, KillRequest, KillSwitchRecord, NodeRecord,
    WorkerRecord,
};

/// What the engine asks of the cluster besides admission (which goes through its
/// `AdmissionStore`): the effects of a controller that is one node of many.
pub trait Cluster: Send {
    fn node_id(&self) -> &str;

    /// Writes (or, `engaged == false`, removes) the cluster's kill-switch key; every node,
    /// this one included, learns of it through its watch. Returns the key's revision.
    fn set_kill_switch(&mut self, engaged: bool, by: &str) -> Result<i64, String>;

    /// Answers `reply` once every live node has acknowledged the kill switch written at
    /// `revision` (or after `limit`), off the engine's thread.
    fn await_acks(
        &mut self,
        revision: i64,
        limit: std::time::Duration,
        reply: oneshot::Sender<ApiResponse>,
    );

    /// This node has carried out the kill switch written at `revision`.
    fn ack(&mut self, revision: i64, killed: usize, elapsed_ms: u64);

    /// Every node's workers, as the cluster holds them; answered off the engine's thread.
    fn workers(&mut self, reply: oneshot::Sender<ApiResponse>);

    /// Asks the node that runs `worker` (not this one) to kill it (and, `recursive`, its
    /// descendants); answers once they are gone from the cluster, or after `limit`.
    fn request_kill(
        &mut self,
        worker: &WorkerId,
        recursive: bool,
        by: &str,
        limit: std::time::Duration,
        reply: oneshot::Sender<ApiResponse>,
    );

    /// A kill request for a worker of this node has been carried out.
    fn kill_done(&mut self, worker: &WorkerId);

    /// Records this node's audit head (its last synced entry) in the cluster.
    fn anchor(&mut self, head: AnchorRecord);

    /// Leaves the cluster: revokes the lease (this node's worker keys go with it).
    fn leave(&mut self);
}
