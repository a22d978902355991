//! The engine's cluster effects through etcd: the cluster kill switch and its
//! acknowledgements, every node's workers, kill requests for other nodes' workers, and
//! this node's audit head. Whatever waits (acknowledgements, a remote kill) waits on the
//! cluster's runtime, never on the engine's thread.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::oneshot;

use crate::controller::protocol::ApiResponse;
use crate::manifest::WorkerId;

use super::super::Cluster;
use super::super::records::{
    AckRecord, AnchorRecord, KillRequest, KillSwitchRecord, NodeRecord, WorkerRecord,
};
use super::store::parse_workers;
use super::{Keys, Link, OP_TIMEOUT, json, with_lease};

/// How often a waiting answer looks at the cluster again.
const POLL: Duration = Duration::from_millis(20);
/// Most bytes of one node or acknowledgement record read.
const MAX_RECORD: usize = 4096;

/// One node's part of the cluster.
pub struct EtcdCluster {
    link: Arc<Link>,
}

impl EtcdCluster {
    pub fn new(link: Arc<Link>) -> EtcdCluster {
        EtcdCluster { link }
    }
}

fn records<T: serde::de::DeserializeOwned>(kvs: &[etcd_client::KeyValue]) -> Vec<T> {
    kvs.iter()
        .filter(|kv| kv.value().len() <= MAX_RECORD)
        .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
        .collect()
}

/// The `get`s of one transaction, in order (`None` for an op that was not a get).
async fn gets(
    client: &mut Client,
    ops: Vec<TxnOp>,
) -> Result<Vec<Vec<etcd_client::KeyValue>>, etcd_client::Error> {
    let resp = client
        .kv_client()
        .max_decoding_message_size(super::MAX_ANSWER)
        .txn(Txn::new().and_then(ops))
        .await?;
    Ok(resp
        .op_responses()
        .into_iter()
        .map(|r| match r {
            TxnOpResponse::Get(mut g) => g.take_kvs(),
            _ => Vec::new(),
        })
        .collect())
}

fn prefix(key: String) -> TxnOp {
    TxnOp::get(key, Some(GetOptions::new().with_prefix()))
}

/// Live nodes and their acknowledgements.
async fn acks(
    client: &mut Client,
    keys: &Keys,
) -> Result<(Vec<NodeRecord>, BTreeMap<String, AckRecord>), etcd_client::Error> {
    let mut got = gets(client, vec![prefix(keys.nodes()), prefix(keys.acks())]).await?;
    let acks_kvs = got.pop().unwrap_or_default();
    let node_kvs = got.pop().unwrap_or_default();
    let nodes = records::<NodeRecord>(&node_kvs);
    let acks = records::<AckRecord>(&acks_kvs)
        .into_iter()
        .map(|a| (a.node.clone(), a))
        .collect();
    Ok((nodes, acks))
}

/// `worker` and, `recursive`, everything descending from it among `all`.
fn lineage(
    all: &BTreeMap<WorkerId, WorkerRecord>,
    worker: &WorkerId,
    recursive: bool,
) -> BTreeSet<WorkerId> {
    let mut out = BTreeSet::from([worker.clone()]);
    if !recursive {
        return out;
    }
    loop {
        let more: Vec<WorkerId> = all
            .values()
            .filter(|w| w.parent_id.as_ref().is_some_and(|p| out.contains(p)))
            .map(|w| w.worker_id.clone())
            .filter(|id| !out.contains(id))
            .collect();
        if more.is_empty() {
            return out;
        }
        out.extend(more);
    }
}

impl Cluster for EtcdCluster {
    fn node_id(&self) -> &str {
        &self.link.node
    }

    fn set_kill_switch(&mut self, engaged: bool, by: &str) -> Result<i64, String> {
        let key = self.link.keys.kill_switch();
        let record = KillSwitchRecord {
            by: by.to_string(),
            node: self.link.node.clone(),
            at_ms: crate::audit::now_ms(),
        };
        if engaged {
            let resp = self
                .link
                .call(move |mut c| async move { c.put(key, json(&record), None).await })?;
            Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
        } else {
            let resp = self
                .link
                .call(move |mut c| async move { c.delete(key, None).await })?;
            Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
        }
    }

    fn await_acks(&mut self, revision: i64, limit: Duration, reply: oneshot::Sender<ApiResponse>) {
        let mut client = self.link.client.clone();
        let keys = self.link.keys.clone();
        let started = Instant::now();
        self.link.rt.spawn(async move {
            let mut last: Option<(Vec<NodeRecord>, BTreeMap<String, AckRecord>)> = None;
            loop {
                if let Ok(Ok(now)) =
                    tokio::time::timeout(OP_TIMEOUT, acks(&mut client, &keys)).await
                {
                    last = Some(now);
                }
                let (nodes, acked) = last.clone().unwrap_or_default();
                let missing: Vec<String> = nodes
                    .iter()
                    .filter(|n| acked.get(&n.node).is_none_or(|a| a.revision < revision))
                    .map(|n| n.node.clone())
                    .collect();
                if (last.is_some() && missing.is_empty()) || started.elapsed() >= limit {
                    let nodes: Vec<AckRecord> = acked
                        .into_values()
                        .filter(|a| a.revision >= revision)
                        .collect();
                    let _ = reply.send(ApiResponse::ClusterKillSwitch {
                        engaged: true,
                        killed: nodes.iter().fold(0usize, |n, a| n.saturating_add(a.killed)),
                        nodes,
                        missing,
                        elapsed_ms: started.elapsed().as_millis() as u64,
                    });
                    return;
                }
                tokio::time::sleep(POLL).await;
            }
        });
    }

    fn ack(&mut self, revision: i64, killed: usize, elapsed_ms: u64) {
        let key = self.link.keys.ack(&self.link.node);
        let record = AckRecord {
            node: self.link.node.clone(),
            revision,
            killed,
            elapsed_ms,
        };
        // On the node's lease: a node that leaves leaves no acknowledgement behind.
        let lease = self.link.lease().id;
        self.link
            .spawn_retrying(Duration::from_secs(30), move |mut c| {
                let key = key.clone();
                let value = json(&record);
                async move { c.put(key, value, with_lease(lease)).await.map(|_| ()) }
            });
    }

    fn workers(&mut self, reply: oneshot::Sender<ApiResponse>) {
        let mut client = self.link.client.clone();
        let keys = self.link.keys.clone();
        self.link.rt.spawn(async move {
            let ops = vec![
                prefix(keys.workers()),
                prefix(keys.nodes()),
                TxnOp::get(keys.kill_switch(), None),
            ];
            let resp = match tokio::time::timeout(OP_TIMEOUT, gets(&mut client, ops)).await {
                Ok(Ok(mut got)) => {
                    let kill_switch = !got.pop().unwrap_or_default().is_empty();
                    let nodes = records::<NodeRecord>(&got.pop().unwrap_or_default());
                    let workers = parse_workers(&got.pop().unwrap_or_default())
                        .into_values()
                        .collect();
                    ApiResponse::ClusterWorkers {
                        nodes,
                        workers,
                        kill_switch,
                    }
                }
                Ok(Err(e)) => ApiResponse::Error {
                    message: format!("cannot read the cluster: etcd: {e}"),
                },
                Err(_) => ApiResponse::Error {
                    message: "cannot read the cluster: etcd did not answer".into(),
                },
            };
            let _ = reply.send(resp);
        });
    }

    fn request_kill(
        &mut self,
        worker: &WorkerId,
        recursive: bool,
        by: &str,
        limit: Duration,
        reply: oneshot::Sender<ApiResponse>,
    ) {
        let mut client = self.link.client.clone();
        let keys = self.link.keys.clone();
        let request = KillRequest {
            worker_id: worker.clone(),
            recursive,
            by: by.to_string(),
        };
        let started = Instant::now();
        // On this node's lease: a request outlives neither its asker nor its answer.
        let lease = self.link.lease().id;
        self.link.rt.spawn(async move {
            let id = request.worker_id.clone();
            let read = |c: Client, keys: Keys| async move {
                let got = c
                    .kv_client()
                    .max_decoding_message_size(super::MAX_ANSWER)
                    .get(keys.workers(), Some(GetOptions::new().with_prefix()))
                    .await?;
                Ok::<_, etcd_client::Error>(parse_workers(got.kvs()))
            };
            let all =
                match tokio::time::timeout(OP_TIMEOUT, read(client.clone(), keys.clone())).await {
                    Ok(Ok(all)) => all,
                    _ => {
                        let _ = reply.send(ApiResponse::Error {
                            message: "cannot read the cluster: etcd did not answer".into(),
                        });
                        return;
                    }
                };
            if !all.contains_key(&id) {
                let _ = reply.send(ApiResponse::Error {
                    message: format!("no running worker {id} in the cluster"),
                });
                return;
            }
            let targets = lineage(&all, &id, request.recursive);
            let key = keys.kill_request(id.as_str());
            let put = client.put(key.clone(), json(&request), with_lease(lease));
            if !matches!(tokio::time::timeout(OP_TIMEOUT, put).await, Ok(Ok(_))) {
                let _ = reply.send(ApiResponse::Error {
                    message: "cannot write the kill request: etcd did not take it".into(),
                });
                return;
            }
            loop {
                if let Ok(Ok(now)) =
                    tokio::time::timeout(OP_TIMEOUT, read(client.clone(), keys.clone())).await
                {
                    if targets.iter().all(|t| !now.contains_key(t)) {
                        break;
                    }
                }
                if started.elapsed() >= limit {
                    let _ = tokio::time::timeout(OP_TIMEOUT, client.delete(key, None)).await;
                    let _ = reply.send(ApiResponse::Error {
                        message: format!(
                            "the node running {id} did not end it within {} s",
                            limit.as_secs()
                        ),
                    });
                    return;
                }
                tokio::time::sleep(POLL).await;
            }
            let _ = tokio::time::timeout(OP_TIMEOUT, client.delete(key, None)).await;
            let _ = reply.send(ApiResponse::Killed {
                workers: targets.into_iter().collect(),
                elapsed_ms: started.elapsed().as_millis() as u64,
            });
        });
    }

    fn kill_done(&mut self, worker: &WorkerId) {
        let key = self.link.keys.kill_request(worker.as_str());
        self.link
            .spawn_retrying(Duration::from_secs(10), move |mut c| {
                let key = key.clone();
                async move { c.delete(key, None).await.map(|_| ()) }
            });
    }

    fn anchor(&mut self, head: AnchorRecord) {
        let key = self.link.keys.anchor(&self.link.node, &head.trail);
        self.link
            .spawn_retrying(Duration::from_secs(5), move |mut c| {
                let key = key.clone();
                let value = json(&head);
                async move { c.put(key, value, None).await.map(|_| ()) }
            });
    }

    fn leave(&mut self) {
        let id = self.link.lease().id;
        let _ = self
            .link
            .call(move |mut c| async move { c.lease_revoke(id).await });
    }
}
