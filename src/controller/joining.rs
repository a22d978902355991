//! Joining the cluster at start, where there is one: the admission store (this
//! controller's memory, or etcd), and the check that the trail holds the head the cluster
//! anchored for this node, both before the start writes anything.

use std::sync::mpsc;

use super::{ControllerError, admission, cluster, input};
use crate::audit::AuditLog;
use crate::contract::ReplicationContract;

/// Joins the cluster, where there is one (a node id live elsewhere is refused first), and
/// checks that the trail holds this node's anchored head, before anything is anchored or
/// written; a refused start leaves the cluster at once, as a stopping node leaves, so its
/// id is free for the next start.
pub(super) fn join_cluster(
    cluster: Option<&cluster::ClusterOptions>,
    contract: &ReplicationContract,
    tx: &mpsc::Sender<input::Input>,
    audit: &AuditLog,
) -> Result<Store, ControllerError> {
    let mut joined = admission_store(cluster, contract, tx)?;
    if let Err(e) = holds_anchored_head(cluster, audit) {
        leave(&mut joined);
        return Err(e);
    }
    Ok(joined)
}

/// Leaves the cluster joined for a start that then failed.
pub(super) fn leave(joined: &mut Store) {
    if let Some(n) = joined.1.as_mut() {
        n.leave();
    }
}

/// What admission decides on: this controller's memory, or, in a cluster, etcd (joined
/// here: a cluster that cannot be reached stops the start).
pub(super) type Store = (
    Box<dyn admission::AdmissionStore>,
    Option<Box<dyn cluster::Cluster>>,
);

#[cfg(feature = "cluster")]
fn admission_store(
    opts: Option<&cluster::ClusterOptions>,
    contract: &ReplicationContract,
    tx: &mpsc::Sender<input::Input>,
) -> Result<Store, ControllerError> {
    let Some(opts) = opts else {
        return Ok((Box::new(admission::InMemoryStore::default()), None));
    };
    let link = cluster::etcd::Link::join(opts, tx.clone())
        .map_err(|e| ControllerError::Cluster(e.to_string()))?;
    let link = std::sync::Arc::new(link);
    // At least an hour of history, for stop conditions a library user added.
    let window = contract.history_seconds().max(3600);
    tracing::info!(node = %opts.node_id, endpoints = %opts.endpoints.join(","), "joined the cluster");
    Ok((
        Box::new(cluster::etcd::EtcdStore::new(link.clone(), window)),
        Some(Box::new(cluster::etcd::EtcdCluster::new(link))),
    ))
}

#[cfg(not(feature = "cluster"))]
fn admission_store(
    _opts: Option<&cluster::ClusterOptions>,
    _contract: &ReplicationContract,
    _tx: &mpsc::Sender<input::Input>,
) -> Result<Store, ControllerError> {
    Ok((Box::new(admission::InMemoryStore::default()), None))
}

/// In a cluster, the trail must hold the head the cluster anchored for this node before
/// the engine anchors anything: a trail rolled back to an older copy of itself is a valid
/// chain, and a start on it would anchor its head over the one that shows it.
#[cfg(feature = "cluster")]
fn holds_anchored_head(
    opts: Option<&cluster::ClusterOptions>,
    trail: &AuditLog,
) -> Result<(), ControllerError> {
    let Some(opts) = opts else {
        return Ok(());
    };
    let heads = cluster::etcd::read_anchors(opts).map_err(|e| {
        ControllerError::Cluster(format!(
            "cannot reach etcd to read this node's anchored audit head: {e}"
        ))
    })?;
    let anchor = format!("the cluster (node {})", opts.node_id);
    cluster::check_anchored_head(trail.dir(), trail.len(), &heads, &anchor, true).map_err(|e| {
        ControllerError::Cluster(format!(
            "{e}; a node whose state directory was replaced on purpose starts once with --new-audit-trail"
        ))
    })?;
    Ok(())
}

#[cfg(not(feature = "cluster"))]
fn holds_anchored_head(
    _opts: Option<&cluster::ClusterOptions>,
    _trail: &AuditLog,
) -> Result<(), ControllerError> {
    Ok(())
}
