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

/// One of the two things a node watches.
#[derive(Clone, Copy)]
enum Watched {
    KillSwitch,
    KillRequests,
}

impl Watched {
    fn key(self, keys: &Keys) -> String {
        match self {
            Watched::KillSwitch => keys.kill_switch(),
            Watched::KillRequests => keys.kill_requests(),
        }
    }

    /// What the keys hold now, as inputs, and the revision read at.
    async fn now(
        self,
        client: &mut Client,
        keys: &Keys,
    ) -> Result<(Vec<Input>, i64), etcd_client::Error> {
        match self {
            Watched::KillSwitch => kill_switch_now(client, keys)
                .await
                .map(|(input, revision)| (vec![input], revision)),
            Watched::KillRequests => requests_now(client, keys).await,
        }
    }

    fn watch_options(self, after: i64) -> WatchOptions {
        let options = WatchOptions::new().with_start_revision(after.saturating_add(1));
        match self {
            Watched::KillSwitch => options,
            Watched::KillRequests => options.with_prefix(),
        }
    }

    /// What one event means for the engine.
    fn input(self, event: &etcd_client::Event) -> Option<Input> {
        let kv = event.kv()?;
        match self {
            Watched::KillSwitch => Some(Input::ClusterKillSwitch {
                engaged: event.event_type() != EventType::Delete,
                revision: kv.mod_revision(),
            }),
            // A request removed was carried out (or its asker left): nothing to do.
            Watched::KillRequests if event.event_type() == EventType::Delete => None,
            Watched::KillRequests => kill_request(kv),
        }
    }
}

/// Reads what `watched` holds now, then watches it from the next revision, again from a
/// fresh read whenever the watch breaks, until the engine is gone.
async fn follow(mut client: Client, keys: Keys, inputs: mpsc::Sender<Input>, watched: Watched) {
    loop {
        let Ok(Ok((now, revision))) =
            tokio::time::timeout(OP_TIMEOUT, watched.now(&mut client, &keys)).await
        else {
            tokio::time::sleep(AGAIN).await;
            continue;
        };
        for input in now {
            if inputs.send(input).is_err() {
                return;
            }
        }
        let options = watched.watch_options(revision);
        let Ok(Ok(mut stream)) =
            tokio::time::timeout(OP_TIMEOUT, client.watch(watched.key(&keys), Some(options))).await
        else {
            tokio::time::sleep(AGAIN).await;
            continue;
        };
        while let Ok(Some(resp)) = stream.message().await {
            if resp.canceled() {
                break;
            }
            for input in resp.events().iter().filter_map(|e| watched.input(e)) {
                if inputs.send(input).is_err() {
                    return;
                }
            }
        }
        tokio::time::sleep(AGAIN).await;
    }
}

/// Watches the kill-switch key until the engine is gone.
pub async fn kill_switch(client: Client, keys: Keys, inputs: mpsc::Sender<Input>) {
    follow(client, keys, inputs, Watched::KillSwitch).await;
}

/// Watches kill requests until the engine is gone.
pub async fn kill_requests(client: Client, keys: Keys, inputs: mpsc::Sender<Input>) {
    follow(client, keys, inputs, Watched::KillRequests).await;
}
