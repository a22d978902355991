//! This node's lease: taken at join, renewed every fifth of its length, and when it
//! cannot be renewed, the node fences itself before etcd can let it expire.
//!
//! The fence deadline is the time a renewal was *sent* plus the TTL etcd granted, less a
//! margin for killing: etcd counts the TTL from when it *received* the renewal, so the
//! node's workers are dead before any other node can see their slots free. The engine
//! hands every new deadline to the launcher, which kills all workers at it by itself —
//! so a controller that is frozen (SIGSTOP, a stalled disk) fences too.

use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use etcd_client::Client;

use crate::controller::input::Input;

use super::super::boottime_ms;
use super::{Keys, LeaseState, OP_TIMEOUT, node_record, with_lease};

/// The margin between the fence and the lease's expiry, as a part of the TTL (and at
/// least [`MIN_MARGIN`]).
const MARGIN_DIVISOR: u32 = 4;
const MIN_MARGIN: Duration = Duration::from_millis(500);

pub fn state(lease: &Arc<Mutex<LeaseState>>) -> LeaseState {
    match lease.lock() {
        Ok(g) => *g,
        Err(p) => *p.into_inner(),
    }
}

fn set(lease: &Arc<Mutex<LeaseState>>, s: LeaseState) {
    match lease.lock() {
        Ok(mut g) => *g = s,
        Err(p) => *p.into_inner() = s,
    }
}

fn margin(ttl: Duration) -> u64 {
    ttl.checked_div(MARGIN_DIVISOR)
        .unwrap_or_default()
        .max(MIN_MARGIN)
        .as_millis() as u64
}

/// The fence deadline for a renewal sent at `sent_ms` that etcd granted `granted_s` for.
fn fence_at(sent_ms: u64, granted_s: i64, ttl: Duration) -> u64 {
    let granted_ms = u64::try_from(granted_s).unwrap_or(0).saturating_mul(1000);
    sent_ms
        .saturating_add(granted_ms)
        .saturating_sub(margin(ttl))
}

/// Takes a new lease and says this node is live under it.
pub async fn grant(
    client: &mut Client,
    keys: &Keys,
    node: &str,
    ttl: Duration,
) -> Result<LeaseState, etcd_client::Error> {
    let sent = boottime_ms();
    let granted = client
        .lease_grant(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX), None)
        .await?;
    let id = granted.id();
    let record = super::json(&node_record(node));
    // One live controller per node id: its acknowledgements and its place in `ps` are
    // its own.
    let claim = etcd_client::Txn::new()
        .when([etcd_client::Compare::version(
            keys.node(node),
            etcd_client::CompareOp::Equal,
            0,
        )])
        .and_then([etcd_client::TxnOp::put(
            keys.node(node),
            record,
            with_lease(id),
        )]);
    if !client.txn(claim).await?.succeeded() {
        let _ = client.lease_revoke(id).await;
        return Err(etcd_client::Error::InvalidArgs(format!(
            "node id {node} is live in the cluster already (another controller holds it, or this node's previous run, whose lease runs out within its TTL)"
        )));
    }
    Ok(LeaseState {
        id,
        fence_at_ms: fence_at(sent, granted.ttl(), ttl),
        fenced: false,
    })
}

/// One renewal: the TTL etcd granted (0: the lease is gone).
async fn renew(client: &mut Client, id: i64) -> Result<i64, etcd_client::Error> {
    let (mut keeper, mut stream) = client.lease_keep_alive(id).await?;
    keeper.keep_alive().await?;
    match stream.message().await? {
        Some(r) => Ok(r.ttl()),
        None => Err(etcd_client::Error::LeaseKeepAliveError(
            "the keep-alive stream ended".into(),
        )),
    }
}

/// Renews the lease until the runtime stops. A lease that cannot be renewed before its
/// fence deadline fences the node (`ClusterFenced`); the node joins again with a new
/// lease once etcd answers, after revoking the old one (its worker keys go with it: the
/// workers were killed at the fence).
pub async fn keep(
    mut client: Client,
    keys: Keys,
    node: String,
    ttl: Duration,
    lease: Arc<Mutex<LeaseState>>,
    inputs: mpsc::Sender<Input>,
) {
    let every = ttl
        .checked_div(5)
        .unwrap_or_default()
        .max(Duration::from_millis(200));
    loop {
        tokio::time::sleep(every).await;
        let current = state(&lease);
        if current.fenced {
            // Not before the old lease could have expired anyway: its workers were
            // killed at the fence, which came a margin earlier.
            if boottime_ms() < current.fence_at_ms.saturating_add(margin(ttl)) {
                continue;
            }
            // Join again: the old lease's keys must go first (their workers are dead).
            let _ = tokio::time::timeout(OP_TIMEOUT, client.lease_revoke(current.id)).await;
            match tokio::time::timeout(OP_TIMEOUT, grant(&mut client, &keys, &node, ttl)).await {
                Ok(Ok(new)) => {
                    set(&lease, new);
                    tracing::warn!(node = %node, "joined the cluster again with a new lease");
                    if inputs
                        .send(Input::ClusterLease {
                            fence_at_ms: new.fence_at_ms,
                            rejoined: true,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
                _ => continue,
            }
            continue;
        }
        let sent = boottime_ms();
        let outcome = tokio::time::timeout(every, renew(&mut client, current.id)).await;
        match outcome {
            Ok(Ok(granted)) if granted > 0 => {
                let s = LeaseState {
                    fence_at_ms: fence_at(sent, granted, ttl),
                    ..current
                };
                set(&lease, s);
                if inputs
                    .send(Input::ClusterLease {
                        fence_at_ms: s.fence_at_ms,
                        rejoined: false,
                    })
                    .is_err()
                {
                    return;
                }
            }
            Ok(Ok(_)) => fence(&lease, &inputs, "the node's etcd lease expired"),
            Ok(Err(e)) if boottime_ms() >= current.fence_at_ms => fence(
                &lease,
                &inputs,
                &format!("the node's etcd lease could not be renewed in time: {e}"),
            ),
            Err(_) if boottime_ms() >= current.fence_at_ms => fence(
                &lease,
                &inputs,
                "the node's etcd lease could not be renewed in time: etcd did not answer",
            ),
            Ok(Err(e)) => tracing::warn!(error = %e, "renewing the etcd lease failed; retrying"),
            Err(_) => tracing::warn!("renewing the etcd lease timed out; retrying"),
        }
    }
}

fn fence(lease: &Arc<Mutex<LeaseState>>, inputs: &mpsc::Sender<Input>, reason: &str) {
    let s = state(lease);
    set(lease, LeaseState { fenced: true, ..s });
    tracing::error!(reason, "fencing this node: killing its workers");
    let _ = inputs.send(Input::ClusterFenced {
        reason: reason.to_string(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_falls_before_etcd_can_expire_the_lease() {
        let ttl = Duration::from_secs(10);
        // Sent at 1000 ms, granted 10 s: etcd expires it no earlier than 11000 ms.
        let f = fence_at(1000, 10, ttl);
        assert_eq!(f, 11_000 - 2_500);
        // A short lease keeps the minimum margin.
        assert_eq!(fence_at(0, 2, Duration::from_secs(2)), 2_000 - 500);
        // A lease etcd says is gone fences at once.
        assert_eq!(fence_at(5_000, 0, ttl), 2_500);
        assert_eq!(fence_at(0, -1, ttl), 0);
    }
}
