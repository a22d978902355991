//! A sandbox with egress: its network namespace still has only `lo`, where pid 1 makes the
//! broker's listeners (see [`super::super::net::egress_listeners`]); the payload is
//! pointed at them — `/etc/resolv.conf` names the DNS stub, the usual proxy variables
//! name the proxy — and, under a profile that refuses TCP, may connect to their ports
//! and no other.

use super::super::net::{DNS_PORT, PROXY_PORT};
use super::super::{SandboxError, SandboxSpec};

/// The sandbox's `/etc/resolv.conf`: the stub, and nothing to search.
const RESOLV_CONF: &str =
    "# names resolve through hatchery's egress broker\nnameserver 127.0.0.1\n";

/// The proxy settings proxy-aware clients read (curl, pip, Python, Go, Node with the
/// last one); the rest reach the transparent listeners through the stub's addresses.
fn proxy_env() -> Vec<(String, String)> {
    let proxy = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut env = Vec::new();
    for key in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((key.to_string(), proxy.clone()));
        env.push((key.to_ascii_lowercase(), proxy.clone()));
    }
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    env.push(("NO_PROXY".into(), no_proxy.clone()));
    env.push(("no_proxy".into(), no_proxy));
    env.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
    env
}

/// Turns `spec` into a sandbox with egress through the listeners on `ports` (and the
/// stub's and the proxy's); `None` leaves it without.
pub(super) fn apply(
    mut spec: SandboxSpec,
    ports: Option<Vec<u16>>,
) -> Result<SandboxSpec, SandboxError> {
    let Some(ports) = ports else {
        return Ok(spec);
    };
    if !spec.namespaces.net {
        return Err(SandboxError::Invalid(format!(
            "profile {}: egress needs the sandbox's own network namespace, and this profile shares the host's ([namespaces] net = false)",
            spec.profile_name
        )));
    }
    if let Some(p) = ports.iter().find(|p| [DNS_PORT, PROXY_PORT].contains(p)) {
        return Err(SandboxError::Invalid(format!(
            "port {p} cannot be allowed: inside the sandbox it is the egress broker's own ({DNS_PORT}: the DNS stub, {PROXY_PORT}: the proxy)"
        )));
    }
    // A variable the caller set keeps the caller's value.
    for (k, v) in proxy_env() {
        if !spec.env.iter().any(|(ek, _)| *ek == k) {
            spec.env.push((k, v));
        }
    }
    spec.rootfs.resolv_conf = Some(RESOLV_CONF.to_string());
    spec.landlock.tcp_connect_ports = [DNS_PORT, PROXY_PORT]
        .into_iter()
        .chain(ports.iter().copied())
        .collect();
    spec.egress_ports = Some(ports);
    Ok(spec)
}
