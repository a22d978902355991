//! Hears the cluster's `control/` keys: the kill switch (engaged: written; released:
//! removed) and kill requests for workers of this node. A broken watch is started again
//! from what the keys hold then, so nothing written while it was down is missed.

use std::sync::mpsc;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, KeyValue, WatchOptions};

use crate::controller::input::Input;

use super::super::records::KillRequest;
use super::{Keys, OP_TIMEOUT};

/// The largest value read from a control key (a kill request is far smaller).
const MAX_VALUE: usize = 4096;

/// What one `control/` key says.
fn input_for(keys: &Keys, kv: &KeyValue, deleted: bool) -> Option<Input> {
    let key = kv.key_str().ok()?;
    if key == keys.kill_switch() {
        return Some(Input::ClusterKillSwitch {
            engaged: !deleted,
            revision: kv.mod_revision(),
        });
    }
    if key.starts_with(&keys.kill_requests()) && !deleted {
        if kv.value().len() > MAX_VALUE {
            return None;
        }
        let request: KillRequest = serde_json::from_slice(kv.value()).ok()?;
        return Some(Input::ClusterKill { request });
    }
    None
}

/// Reads the `control/` keys now: the inputs they amount to, and the revision read at.
async fn current(
    client: &mut Client,
    keys: &Keys,
) -> Result<(Vec<Input>, i64), etcd_client::Error> {
    let resp = client
        .get(keys.control(), Some(GetOptions::new().with_prefix()))
        .await?;
    let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
    let mut inputs: Vec<Input> = resp
        .kvs()
        .iter()
        .filter_map(|kv| input_for(keys, kv, false))
        .collect();
    if !resp
        .kvs()
        .iter()
        .any(|kv| kv.key_str().is_ok_and(|k| k == keys.kill_switch()))
    {
        inputs.push(Input::ClusterKillSwitch {
            engaged: false,
            revision,
        });
    }
    Ok((inputs, revision))
}

/// Watches `control/` until the engine is gone.
pub async fn control(mut client: Client, keys: Keys, inputs: mpsc::Sender<Input>) {
    loop {
        let Ok(Ok((now, revision))) =
            tokio::time::timeout(OP_TIMEOUT, current(&mut client, &keys)).await
        else {
            tokio::time::sleep(Duration::from_millis(250)).await;
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
        let Ok(Ok(mut stream)) =
            tokio::time::timeout(OP_TIMEOUT, client.watch(keys.control(), Some(options))).await
        else {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        };
        while let Ok(Some(resp)) = stream.message().await {
            if resp.canceled() {
                break;
            }
            for event in resp.events() {
                let Some(kv) = event.kv() else { continue };
                let deleted = event.event_type() == EventType::Delete;
                if let Some(input) = input_for(&keys, kv, deleted) {
                    if inputs.send(input).is_err() {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
