//! The cluster through etcd: one connection per controller, on a runtime thread of its
//! own, so that a slow etcd never stalls the sockets the controller serves; the engine's
//! thread waits on it only for admission (a bounded wait, then a refusal).
//!
//! `store` is the [`AdmissionStore`](super::super::admission::AdmissionStore) over etcd,
//! `lease` keeps this node's lease and fences the node when it cannot, `watch` hears the
//! kill switch and kill requests, `ops` carries out the engine's [`Cluster`](super::Cluster)
//! effects.

mod lease;
mod ops;
mod store;
mod watch;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, PutOptions, TlsOptions};

use crate::controller::input::Input;

use super::options::ClusterOptions;
use super::records::NodeRecord;

pub use ops::EtcdCluster;
pub use store::EtcdStore;

/// The longest one etcd request may take before it counts as failed.
const OP_TIMEOUT: Duration = Duration::from_millis(1500);

/// The largest answer read from etcd (all of `workers/` at once): above gRPC's default of
/// 4 MiB, which a few large foreign values under the prefix would reach.
const MAX_ANSWER: usize = 64 << 20;

/// No admission closer than this to the fence deadline.
const ADMIT_BEFORE_FENCE_MS: u64 = 200;

/// The key layout under the cluster prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_string(),
        }
    }
    pub fn workers(&self) -> String {
        format!("{}workers/", self.prefix)
    }
    pub fn worker(&self, id: &str) -> String {
        format!("{}workers/{id}", self.prefix)
    }
    pub fn history(&self) -> String {
        format!("{}history", self.prefix)
    }
    pub fn kill_switch(&self) -> String {
        format!("{}control/kill-switch", self.prefix)
    }
    pub fn kill_requests(&self) -> String {
        format!("{}control/kill/", self.prefix)
    }
    pub fn kill_request(&self, id: &str) -> String {
        format!("{}control/kill/{id}", self.prefix)
    }
    pub fn nodes(&self) -> String {
        format!("{}nodes/", self.prefix)
    }
    pub fn node(&self, node: &str) -> String {
        format!("{}nodes/{node}", self.prefix)
    }
    pub fn acks(&self) -> String {
        format!("{}acks/", self.prefix)
    }
    pub fn ack(&self, node: &str) -> String {
        format!("{}acks/{node}", self.prefix)
    }
    pub fn anchors(&self, node: &str) -> String {
        format!("{}audit/{node}/", self.prefix)
    }
    pub fn anchor(&self, node: &str, trail: &str) -> String {
        format!("{}audit/{node}/{trail}", self.prefix)
    }
}

/// This node's lease as the lease keeper last saw it.
#[derive(Debug, Clone, Copy)]
pub struct LeaseState {
    pub id: i64,
    /// When (CLOCK_BOOTTIME, ms) this node must have killed its workers unless the lease
    /// is renewed: before etcd can let the lease expire.
    pub fence_at_ms: u64,
    /// The lease was lost; nothing is admitted until a new one is held.
    pub fenced: bool,
}

/// One connection to etcd and the runtime its requests run on.
pub struct Link {
    rt: tokio::runtime::Runtime,
    client: Client,
    keys: Keys,
    node: String,
    lease: Arc<Mutex<LeaseState>>,
    /// The lease's length: what the engine's waits on etcd are bounded by.
    ttl: Duration,
    /// etcd failed to answer the engine: until a probe gets an answer, admission is
    /// refused at once instead of waiting on etcd again (the engine's thread must stay
    /// free for kills, the kill switch and the lease deadlines it hands the launcher).
    down: Arc<AtomicBool>,
}

/// The longest one admission waits on etcd (less with a short lease).
const MAX_ADMISSION_WAIT: Duration = Duration::from_secs(3);

/// Between two probes of an etcd that failed to answer.
const PROBE_EVERY: Duration = Duration::from_millis(300);

/// Why a controller could not join its cluster.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("cannot read the etcd TLS file {path}: {error}")]
    Tls { path: String, error: std::io::Error },
    #[error("cannot reach etcd at {endpoints}: {error}; check --cluster and that etcd runs")]
    Unreachable { endpoints: String, error: String },
    #[error("cannot join the cluster: {0}")]
    Refused(String),
    #[error("cluster runtime: {0}")]
    Runtime(String),
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, JoinError> {
    std::fs::read(path).map_err(|error| JoinError::Tls {
        path: path.display().to_string(),
        error,
    })
}

/// The connection options for `opts` (TLS when a CA is given).
fn connect_options(opts: &ClusterOptions) -> Result<(Vec<String>, ConnectOptions), JoinError> {
    let mut co = ConnectOptions::new()
        .with_connect_timeout(OP_TIMEOUT)
        .with_timeout(OP_TIMEOUT)
        .with_keep_alive(Duration::from_secs(1), OP_TIMEOUT)
        .with_require_leader(true);
    let scheme = match &opts.tls {
        Some(tls) => {
            let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.cacert)?));
            if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
                t = t.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            co = co.with_tls(t);
            "https"
        }
        None => "http",
    };
    let endpoints = opts
        .endpoints
        .iter()
        .map(|e| format!("{scheme}://{e}"))
        .collect();
    Ok((endpoints, co))
}

/// Connects to etcd (for a command that reads the cluster once, like `audit verify`).
pub fn connect_once(opts: &ClusterOptions) -> Result<(tokio::runtime::Runtime, Client), JoinError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| JoinError::Runtime(e.to_string()))?;
    let (endpoints, co) = connect_options(opts)?;
    let unreachable = |error: String| JoinError::Unreachable {
        endpoints: opts.endpoints.join(","),
        error,
    };
    let client = rt
        .block_on(async {
            tokio::time::timeout(OP_TIMEOUT, Client::connect(endpoints, Some(co))).await
        })
        .map_err(|_| unreachable("no answer".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
    Ok((rt, client))
}

/// The audit heads the cluster holds for a node, one per trail it has had (what `audit
/// verify --cluster` checks a trail against).
pub fn read_anchors(opts: &ClusterOptions) -> Result<Vec<super::records::AnchorRecord>, String> {
    let (rt, client) = connect_once(opts).map_err(|e| e.to_string())?;
    let prefix = Keys::new(&opts.prefix).anchors(opts.node_id.as_str());
    let got = rt
        .block_on(async {
            tokio::time::timeout(
                OP_TIMEOUT,
                client
                    .kv_client()
                    .max_decoding_message_size(MAX_ANSWER)
                    .get(prefix, Some(etcd_client::GetOptions::new().with_prefix())),
            )
            .await
        })
        .map_err(|_| "etcd did not answer".to_string())?
        .map_err(|e| format!("etcd: {e}"))?;
    got.kvs()
        .iter()
        .map(|kv| {
            serde_json::from_slice(kv.value()).map_err(|e| {
                format!(
                    "the anchored head {} is unreadable: {e}",
                    kv.key_str().unwrap_or("?")
                )
            })
        })
        .collect()
}

impl Link {
    /// Joins the cluster: connects, takes a lease, says this node is live, and starts the
    /// lease keeper and the watches, which tell the engine through `inputs`.
    pub fn join(opts: &ClusterOptions, inputs: mpsc::Sender<Input>) -> Result<Link, JoinError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("hatchery-cluster")
            .enable_all()
            .build()
            .map_err(|e| JoinError::Runtime(e.to_string()))?;
        let (endpoints, co) = connect_options(opts)?;
        let unreachable = |error: String| JoinError::Unreachable {
            endpoints: opts.endpoints.join(","),
            error,
        };
        let keys = Keys::new(&opts.prefix);
        let node = opts.node_id.as_str().to_string();
        let ttl = opts.lease_ttl;
        let (client, lease) = rt
            .block_on(async {
                tokio::time::timeout(OP_TIMEOUT.saturating_mul(2), async {
                    let mut client = Client::connect(endpoints, Some(co)).await?;
                    let lease = lease::grant(&mut client, &keys, &node, ttl).await?;
                    Ok::<_, etcd_client::Error>((client, lease))
                })
                .await
            })
            .map_err(|_| unreachable("no answer".into()))?
            .map_err(|e: etcd_client::Error| match e {
                etcd_client::Error::InvalidArgs(why) => JoinError::Refused(why),
                e => unreachable(e.to_string()),
            })?;
        let lease = Arc::new(Mutex::new(lease));
        let _ = inputs.send(Input::ClusterLease {
            fence_at_ms: lease::state(&lease).fence_at_ms,
            rejoined: false,
        });
        rt.spawn(lease::keep(
            client.clone(),
            keys.clone(),
            node.clone(),
            ttl,
            lease.clone(),
            inputs.clone(),
        ));
        rt.spawn(watch::kill_switch(
            client.clone(),
            keys.clone(),
            inputs.clone(),
        ));
        rt.spawn(watch::kill_requests(client.clone(), keys.clone(), inputs));
        Ok(Link {
            rt,
            client,
            keys,
            node,
            lease,
            ttl,
            down: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Runs `op` on the cluster's runtime and waits for it, at most [`OP_TIMEOUT`].
    fn call<T, F>(&self, op: impl FnOnce(Client) -> F) -> Result<T, String>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
    {
        self.call_within(OP_TIMEOUT, op)
    }

    /// How long one admission may wait on etcd in all: a short lease's deadlines reach
    /// the launcher through the engine, which must not be held for long.
    fn admission_budget(&self) -> Duration {
        self.ttl
            .checked_div(4)
            .unwrap_or_default()
            .min(MAX_ADMISSION_WAIT)
    }

    /// [`Link::call`], waiting at most `limit` (and never more than [`OP_TIMEOUT`]).
    fn call_within<T, F>(&self, limit: Duration, op: impl FnOnce(Client) -> F) -> Result<T, String>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
    {
        let limit = limit.min(OP_TIMEOUT);
        let (tx, rx) = mpsc::sync_channel(1);
        let fut = op(self.client.clone());
        self.rt.spawn(async move {
            let r = tokio::time::timeout(limit, fut).await;
            let _ = tx.send(r);
        });
        let result = match rx.recv_timeout(limit.saturating_add(Duration::from_millis(50))) {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(e))) => Err(format!("etcd: {e}")),
            Ok(Err(_)) | Err(_) => Err(format!(
                "etcd did not answer within {} ms",
                limit.as_millis()
            )),
        };
        if result.is_err() {
            self.mark_down();
        }
        result
    }

    /// etcd failed: refuse at once from now on, and probe until it answers again.
    fn mark_down(&self) {
        if self.down.swap(true, Ordering::SeqCst) {
            return;
        }
        let down = self.down.clone();
        let mut client = self.client.clone();
        let key = self.keys.kill_switch();
        self.rt.spawn(async move {
            loop {
                tokio::time::sleep(PROBE_EVERY).await;
                let probe = client.get(
                    key.clone(),
                    Some(etcd_client::GetOptions::new().with_keys_only()),
                );
                if let Ok(Ok(_)) = tokio::time::timeout(OP_TIMEOUT, probe).await {
                    down.store(false, Ordering::SeqCst);
                    return;
                }
            }
        });
    }

    /// Runs `op` on the cluster's runtime without waiting; a failed attempt is tried
    /// again (every 200 ms, for as long as `retry_for`).
    fn spawn_retrying<F>(&self, retry_for: Duration, op: impl Fn(Client) -> F + Send + 'static)
    where
        F: Future<Output = Result<(), etcd_client::Error>> + Send + 'static,
    {
        let client = self.client.clone();
        self.rt.spawn(async move {
            let until = tokio::time::Instant::now().checked_add(retry_for);
            loop {
                match tokio::time::timeout(OP_TIMEOUT, op(client.clone())).await {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => tracing::debug!(error = %e, "etcd write failed; retrying"),
                    Err(_) => tracing::debug!("etcd write timed out; retrying"),
                }
                if until.is_none_or(|u| tokio::time::Instant::now() >= u) {
                    tracing::warn!("an etcd write kept failing; given up");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    fn lease(&self) -> LeaseState {
        lease::state(&self.lease)
    }

    /// Whether this node may admit now, or why not.
    fn admitting(&self) -> Result<LeaseState, String> {
        if self.down.load(Ordering::SeqCst) {
            return Err("etcd did not answer a moment ago (refused until it does)".into());
        }
        let l = self.lease();
        if l.fenced {
            return Err("this node lost its etcd lease and has not joined again".into());
        }
        // Refuse just before the fence too: the reservation itself takes a round trip.
        if super::boottime_ms().saturating_add(ADMIT_BEFORE_FENCE_MS) >= l.fence_at_ms {
            return Err("this node's etcd lease is not being renewed (etcd unreachable?)".into());
        }
        Ok(l)
    }
}

/// The value of a node's record.
fn node_record(node: &str) -> NodeRecord {
    NodeRecord {
        node: node.to_string(),
        pid: std::process::id(),
        started_at_ms: crate::audit::now_ms(),
    }
}

/// `put` options attaching a key to `lease`.
fn with_lease(lease: i64) -> Option<PutOptions> {
    Some(PutOptions::new().with_lease(lease))
}

/// A record as stored. Serialising plain fields cannot fail; an empty value would be
/// refused when read back.
fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}
