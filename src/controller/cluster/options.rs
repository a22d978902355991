//! How a controller joins a cluster: etcd's endpoints, this node's name, the key prefix,
//! the client certificate and the lease's length — from the command line or the contract
//! file's `[cluster]` table.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most endpoints one `--cluster` names.
const MAX_ENDPOINTS: usize = 16;
/// Longest node id and prefix.
const MAX_NODE_ID: usize = 63;
const MAX_PREFIX: usize = 128;
/// The lease's bounds: shorter than the lower one would fence on a hiccup, longer than
/// the upper one would keep a dead node's slots for too long.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(300);
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
pub const DEFAULT_PREFIX: &str = "/hatchery/";

/// A node's name in the cluster: letters, digits, `.`, `_`, `-` (it is part of keys).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeId(String);

impl NodeId {
    pub fn new(s: &str) -> Result<NodeId, String> {
        let ok = !s.is_empty()
            && s.len() <= MAX_NODE_ID
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            && !s.starts_with(['.', '-']);
        if ok {
            Ok(NodeId(s.to_string()))
        } else {
            Err(format!(
                "node id {s:?}: use 1 to {MAX_NODE_ID} letters, digits, '.', '_' or '-', not starting with '.' or '-'"
            ))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for NodeId {
    type Error = String;
    fn try_from(s: String) -> Result<NodeId, String> {
        NodeId::new(&s)
    }
}

impl From<NodeId> for String {
    fn from(n: NodeId) -> String {
        n.0
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The client certificate etcd asks for, and the CA its server certificate is checked
/// against (all PEM files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTls {
    pub cacert: PathBuf,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// Everything a controller needs to be one node of a cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterOptions {
    /// `HOST:PORT` of each etcd member.
    pub endpoints: Vec<String>,
    pub node_id: NodeId,
    /// Every key's prefix (starts and ends with `/`).
    pub prefix: String,
    pub tls: Option<ClusterTls>,
    pub lease_ttl: Duration,
}

/// What the command line says of the cluster (every field optional: the contract file's
/// `[cluster]` fills the gaps, the command line wins).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterArgs {
    pub url: Option<String>,
    pub node_id: Option<String>,
    pub prefix: Option<String>,
    pub cacert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub lease_ttl: Option<Duration>,
}

impl ClusterOptions {
    /// The cluster this controller joins, if any: the command line over the contract
    /// file's `[cluster]`; what is missing or wrong, in one line.
    pub fn resolve(
        args: &ClusterArgs,
        file: &crate::contract::ClusterConfig,
    ) -> Result<Option<ClusterOptions>, String> {
        let Some(url) = args.url.clone().or_else(|| file.etcd.clone()) else {
            if args != &ClusterArgs::default() {
                return Err("--node-id, --cluster-prefix, --cluster-lease-ttl and the --cluster-* certificate options need --cluster etcd://HOST:PORT".into());
            }
            return Ok(None);
        };
        let endpoints = parse_url(&url)?;
        let node = args
            .node_id
            .clone()
            .or_else(|| file.node_id.clone())
            .ok_or("--cluster needs --node-id NAME (this node's name in the cluster)")?;
        let node_id = NodeId::new(&node)?;
        let prefix = args
            .prefix
            .clone()
            .or_else(|| file.prefix.clone())
            .unwrap_or_else(|| DEFAULT_PREFIX.to_string());
        check_prefix(&prefix)?;
        let lease_ttl = args
            .lease_ttl
            .or(file.lease_ttl_seconds.map(Duration::from_secs))
            .unwrap_or(DEFAULT_LEASE_TTL);
        check_lease_ttl(lease_ttl)?;
        let cacert = args.cacert.clone().or_else(|| file.cacert.clone());
        let cert = args.cert.clone().or_else(|| file.cert.clone());
        let key = args.key.clone().or_else(|| file.key.clone());
        if cert.is_some() != key.is_some() {
            return Err("--cluster-cert and --cluster-key go together".into());
        }
        let tls = match cacert {
            Some(cacert) => Some(ClusterTls { cacert, cert, key }),
            None if cert.is_some() => {
                return Err("--cluster-cert needs --cluster-cacert (the CA etcd's certificate is checked against)".into());
            }
            None => None,
        };
        Ok(Some(ClusterOptions {
            endpoints,
            node_id,
            prefix,
            tls,
            lease_ttl,
        }))
    }
}

/// Parses `etcd://HOST:PORT[,HOST:PORT...]` into its endpoints.
pub fn parse_url(url: &str) -> Result<Vec<String>, String> {
    let rest = url
        .strip_prefix("etcd://")
        .ok_or_else(|| format!("cluster {url:?}: expected etcd://HOST:PORT[,HOST:PORT...]"))?;
    let endpoints: Vec<String> = rest.split(',').map(str::to_string).collect();
    if endpoints.len() > MAX_ENDPOINTS {
        return Err(format!(
            "cluster {url:?}: {} endpoints; at most {MAX_ENDPOINTS}",
            endpoints.len()
        ));
    }
    for e in &endpoints {
        let (host, port) = e
            .rsplit_once(':')
            .ok_or_else(|| format!("cluster endpoint {e:?}: expected HOST:PORT"))?;
        let host_ok = !host.is_empty()
            && host.len() <= 253
            && host.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'[' | b']' | b':')
            });
        if !host_ok {
            return Err(format!(
                "cluster endpoint {e:?}: {host:?} is not a host name or address"
            ));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(format!("cluster endpoint {e:?}: {port:?} is not a port")),
        }
    }
    Ok(endpoints)
}

/// Checks a key prefix: starts and ends with `/`, printable ASCII without spaces.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    let ok = prefix.len() >= 2
        && prefix.len() <= MAX_PREFIX
        && prefix.starts_with('/')
        && prefix.ends_with('/')
        && prefix.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "cluster prefix {prefix:?}: it must start and end with '/' and hold at most {MAX_PREFIX} visible ASCII characters"
        ))
    }
}

/// Checks a lease's length against its bounds.
pub fn check_lease_ttl(ttl: Duration) -> Result<(), String> {
    if (MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&ttl) {
        Ok(())
    } else {
        Err(format!(
            "cluster lease {} s: it must be between {} and {} s",
            ttl.as_secs(),
            MIN_LEASE_TTL.as_secs(),
            MAX_LEASE_TTL.as_secs()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_one_or_more_endpoints() {
        assert_eq!(
            parse_url("etcd://127.0.0.1:2379").ok(),
            Some(vec!["127.0.0.1:2379".to_string()])
        );
        assert_eq!(
            parse_url("etcd://a.example:1,b.example:2")
                .map(|v| v.len())
                .ok(),
            Some(2)
        );
        for bad in [
            "http://127.0.0.1:2379",
            "etcd://",
            "etcd://host",
            "etcd://host:0",
            "etcd://host:99999",
            "etcd://ho st:1",
            "etcd://a:1,",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_command_line_wins_over_the_contract_files_cluster_table() {
        let file = crate::contract::ClusterConfig {
            etcd: Some("etcd://10.0.0.5:2379".into()),
            node_id: Some("from-file".into()),
            prefix: Some("/fleet/".into()),
            lease_ttl_seconds: Some(20),
            ..Default::default()
        };
        let args = ClusterArgs {
            node_id: Some("from-flag".into()),
            ..Default::default()
        };
        let o = ClusterOptions::resolve(&args, &file).ok().flatten();
        let o = o.as_ref();
        assert_eq!(o.map(|o| o.node_id.as_str()), Some("from-flag"));
        assert_eq!(o.map(|o| o.prefix.as_str()), Some("/fleet/"));
        assert_eq!(o.map(|o| o.lease_ttl), Some(Duration::from_secs(20)));
        assert_eq!(
            o.map(|o| o.endpoints.clone()),
            Some(vec!["10.0.0.5:2379".to_string()])
        );
        // The same table, as a contract file says it; an unknown key in it is refused.
        let parsed = crate::contract::ContractConfig::from_toml(
            "[cluster]\netcd = \"etcd://10.0.0.5:2379\"\nnode_id = \"from-file\"\nprefix = \"/fleet/\"\nlease_ttl_seconds = 20\n",
            "test",
        );
        assert_eq!(parsed.map(|c| c.cluster).ok(), Some(file.clone()));
        assert!(
            crate::contract::ContractConfig::from_toml("[cluster]\nnode = \"x\"\n", "test")
                .is_err()
        );
        // No cluster named anywhere: none, unless a cluster option is given alone.
        let none = ClusterOptions::resolve(&ClusterArgs::default(), &Default::default());
        assert_eq!(none, Ok(None));
        assert!(ClusterOptions::resolve(&args, &Default::default()).is_err());
        // A certificate without its key, or without the CA, is refused.
        let half = ClusterArgs {
            url: Some("etcd://127.0.0.1:2379".into()),
            node_id: Some("n".into()),
            cert: Some("c.pem".into()),
            ..Default::default()
        };
        assert!(ClusterOptions::resolve(&half, &Default::default()).is_err());
    }

    #[test]
    fn node_ids_and_prefixes_are_key_safe() {
        assert!(NodeId::new("node-1.rack_a").is_ok());
        for bad in ["", "a/b", "-x", ".x", "a b", &"n".repeat(64)] {
            assert!(NodeId::new(bad).is_err(), "{bad}");
        }
        assert!(check_prefix("/hatchery/").is_ok());
        for bad in ["hatchery/", "/hatchery", "/", "/a b/"] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
        assert!(check_lease_ttl(Duration::from_secs(1)).is_err());
        assert!(check_lease_ttl(Duration::from_secs(10)).is_ok());
    }
}
