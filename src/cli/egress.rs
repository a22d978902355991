//! `run`'s egress flags: which hosts the sandbox may reach through the broker, how names
//! resolve for it, and how many bytes it may move. Their parsers also read the
//! `--allow-host` and `--max-egress` of a worker's job (`job::JobArgs`).

use std::time::Duration;

use clap::Args;

use hatchery::broker::{Broker, BrokerConfig, Summary};
use hatchery::egress::{AllowHost, AllowList, Resolution};
use hatchery::profile::Profile;
use hatchery::sandbox::{Sandbox, SandboxError};
use hatchery::units;

/// How long a stopping broker gets to report before it is killed.
const STOP_WITHIN: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Args, Default)]
pub struct EgressArgs {
    /// Let the command reach HOST:PORT, and nothing else, through a broker outside the
    /// sandbox (repeatable). HOST is a name (api.example.com), a one-label wildcard
    /// (*.pypi.org, not pypi.org itself), an IP ([::1] for IPv6) or a CIDR
    /// (10.0.0.0/8); private, loopback and link-local addresses, and the host's own, are
    /// reached only when named this way
    #[arg(long = "allow-host", value_name = "HOST:PORT", value_parser = parse_allow_host)]
    pub allow_host: Vec<AllowHost>,
    /// Resolve NAME to ADDR for the broker, before the host's resolver (repeatable)
    #[arg(long = "resolve", value_name = "NAME=ADDR", value_parser = parse_resolve)]
    pub resolve: Vec<(String, std::net::IpAddr)>,
    /// Bytes the command may move through the broker, both ways together (64K, 10M);
    /// a connection is cut when they are spent
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = parse_budget)]
    pub max_egress: Option<u64>,
    /// Run in the host's network namespace: every interface of the host, its loopback
    /// services and the cloud metadata service become reachable. Needed for a profile
    /// with `[namespaces] net = false`; never given to workers
    #[arg(long)]
    pub dangerously_share_host_network: bool,
}

/// A byte budget: a size of at least one byte.
pub fn parse_budget(s: &str) -> Result<u64, String> {
    match units::parse_size(s) {
        Ok(0) => {
            Err("an egress budget of 0 bytes allows nothing: leave out --allow-host instead".into())
        }
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

pub fn parse_allow_host(s: &str) -> Result<AllowHost, String> {
    s.parse::<AllowHost>().map_err(|e| e.to_string())
}

pub fn parse_resolve(s: &str) -> Result<(String, std::net::IpAddr), String> {
    Resolution::parse_entry(s).map_err(|e| e.to_string())
}

/// What a run with egress needs: the broker's settings.
pub struct EgressPlan {
    config: BrokerConfig,
}

impl EgressArgs {
    /// Applies the network choice to `profile`: the host's network namespace only when
    /// asked for in so many words (a profile that shares it is refused without the flag,
    /// so a downloaded profile cannot open the host's network quietly).
    pub fn choose_network(&self, profile: &mut Profile) -> Result<(), SandboxError> {
        if self.dangerously_share_host_network {
            if !self.allow_host.is_empty() {
                return Err(SandboxError::Invalid(
                    "--dangerously-share-host-network and --allow-host exclude each other: the host's network has no broker in between".into(),
                ));
            }
            profile.namespaces.net = false;
        } else if !profile.namespaces.net {
            return Err(SandboxError::Invalid(format!(
                "profile {} shares the host's network namespace ([namespaces] net = false): the command would reach every interface of the host, its loopback services and the cloud metadata service; pass --dangerously-share-host-network to run it so, or use --allow-host HOST:PORT with a profile that keeps its own network",
                profile.name
            )));
        }
        Ok(())
    }

    /// The broker's settings, when any host is allowed (`--resolve` and `--max-egress`
    /// alone change nothing, and are refused as such).
    pub fn plan(&self) -> Result<Option<EgressPlan>, SandboxError> {
        if self.allow_host.is_empty() {
            if !self.resolve.is_empty() || self.max_egress.is_some() {
                return Err(SandboxError::Invalid(
                    "--resolve and --max-egress apply to hosts allowed with --allow-host HOST:PORT; none is".into(),
                ));
            }
            return Ok(None);
        }
        let allow = AllowList::new(self.allow_host.clone())
            .map_err(|e| SandboxError::Invalid(format!("--allow-host: {e}")))?;
        let mut resolution = Resolution::default();
        for (name, addr) in &self.resolve {
            resolution.insert(name, *addr);
        }
        let ports = allow.ports().into_iter().collect();
        Ok(Some(EgressPlan {
            config: BrokerConfig {
                allow,
                resolution,
                max_bytes: self.max_egress,
                ports,
            },
        }))
    }
}

impl EgressPlan {
    /// The ports the sandbox listens on for proxy-unaware clients.
    pub fn ports(&self) -> Vec<u16> {
        self.config.ports.clone()
    }

    /// Starts the broker on the listeners `sandbox` handed over.
    pub fn start(self, sandbox: &mut Sandbox) -> Result<RunningBroker, SandboxError> {
        let listeners = sandbox.take_egress_listeners();
        if listeners.is_empty() {
            // The sandbox failed before it made them; its failure is reported as such.
            return Ok(RunningBroker(None));
        }
        Broker::start(self.config, listeners)
            .map(|b| RunningBroker(Some(b)))
            .map_err(|e| SandboxError::Internal(format!("cannot start the egress broker: {e}")))
    }
}

/// A run's broker, while the sandbox runs.
pub struct RunningBroker(Option<Broker>);

impl RunningBroker {
    /// Ends the broker (every connection closed) and returns what it recorded, or why
    /// that is lost.
    pub fn stop(self) -> Option<Result<Summary, String>> {
        self.0.map(|b| b.stop(STOP_WITHIN))
    }
}
