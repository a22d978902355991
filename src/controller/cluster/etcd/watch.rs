//! Hears the cluster's `control/` keys: the kill switch (engaged: written; released:
//! removed) and kill requests for workers of this node. A broken watch is started again
//! from what the keys hold then, so nothing written while it was down is missed.
//!
//! The kill switch has a watch of its own, on its one key: whatever else is written under
//! `control/` (a flood of requests, values too large for one answer) cannot keep a node
//! from hearing it.

use std::sync::mpsc;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, KeyValue, WatchOptions};

use crate::controller::input::Input;

use super::super::records::KillRequest;
use super::{Keys, OP_TIMEOUT};

/// The largest kill request read (a real one is far smaller).
const MAX_VALUE: usize = 4096;
/// Most pending kill requests read at once when a watch starts again.
const MAX_PENDING: i64 = 4096;
/// Between two attempts to start a broken watch.
const AGAIN: Duration = Duration::from_millis(250);

fn kill_request(kv: &KeyValue) -> Option<Input> {
    if kv.value().len() > MAX_VALUE {
        return None;
    }
    let request: KillRequest = serde_json::from_slice(kv.value()).ok()?;
    Some(Input::ClusterKill { request })
}

/// The kill switch now: an input, and the revision read at.
async fn kill_switch_now(
    client: &mut Client,
    keys: &Keys,
) -> Result<(Input, i64), etcd_client::Error> {
    // Keys only: the value says who engaged it, which no node needs to hear it.
    let resp = client
        .get(keys.kill_switch(), Some(GetOptions::new().with_keys_only()))
        .await?;
    let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
    let input = match resp.kvs().first() {
        Some(kv) => Input::ClusterKillSwitch {
            engaged: true,
            revision: kv.mod_revision(),
        },
        None => Input::ClusterKillSwitch {
            engaged: false,
            revision,
        },
    };
    Ok((input, revision))
}

/// Pending kill requests now (one read, bounded in count and size), and the revision
/// read at.
async fn requests_now(
    client: &mut Client,
    keys: &Keys,
) -> Result<(Vec<Input>, i64), etcd_client::Error> {
    let listed = client
        .kv_client()
        .max_decoding_message_size(super::MAX_ANSWER)
        .get(
            keys.kill_requests(),
            Some(GetOptions::new().with_prefix().with_limit(MAX_PENDING)),
        )
        .await?;
    let revision = listed.header().map(|h| h.revision()).unwrap_or(0);
    Ok((
        listed.kvs().iter().filter_map(kill_request).collect(),
        revision,
    ))
}

/// Watches the kill-switch key until the engine is gone.
pub async fn kill_switch(mut client: Client, keys: Keys, inputs: mpsc::Sender<Input>) {
    loop {
        let Ok(Ok((now, revision))) =
            tokio::time::timeout(OP_TIMEOUT, kill_switch_now(&mut client, &keys)).await
        else {
            tokio::time::sleep(AGAIN).await;
            continue;
        };
        if inputs.send(now).is_err() {
            return;
        }
        let options = WatchOptions::new().with_start_revision(revision.saturating_add(1));
        let Ok(Ok(mut stream)) =
            tokio::time::timeout(OP_TIMEOUT, client.watch(keys.kill_switch(), Some(options))).await
        else {
            tokio::time::sleep(AGAIN).await;
            continue;
        };
        while let Ok(Some(resp)) = stream.message().await {
            if resp.canceled() {
                break;
            }
            for event in resp.events() {
                let Some(kv) = event.kv() else { continue };
                let input = Input::ClusterKillSwitch {
                    engaged: event.event_type() != EventType::Delete,
                    revision: kv.mod_revision(),
                };
                if inputs.send(input).is_err() {
                    return;
                }
            }
        }
        tokio::time::sleep(AGAIN).await;
    }
}

/// Watches kill requests until the engine is gone.
pub async fn kill_requests(mut client: Client, keys: Keys, inputs: mpsc::Sender<Input>) {
    loop {
        let Ok(Ok((now, revision))) =
            tokio::time::timeout(OP_TIMEOUT, requests_now(&mut client, &keys)).await
        else {
            tokio::time::sleep(AGAIN).await;
            continue;
        };
        for input in now {
            if inputs.send(input).is_err() {
                return;
            }
        }
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision.saturating_add(1));
        let Ok(Ok(mut stream)) = tokio::time::timeout(
            OP_TIMEOUT,
            client.watch(keys.kill_requests(), Some(options)),
        )
        .await
        else {
            tokio::time::sleep(AGAIN).await;
            continue;
        };
        while let Ok(Some(resp)) = stream.message().await {
            if resp.canceled() {
                break;
            }
            for event in resp.events() {
                if event.event_type() == EventType::Delete {
                    continue;
                }
                if let Some(input) = event.kv().and_then(kill_request) {
                    if inputs.send(input).is_err() {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(AGAIN).await;
    }
}
