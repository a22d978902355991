#![deny(
    clippy::string_slice,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unwrap_used,
    clippy::expect_used
)]
//! Egress allowlists: what a sandbox may reach beyond itself, decided outside it.
//!
//! A sandbox with egress keeps a network namespace with only `lo`. Inside it sit a DNS stub,
//! an HTTP proxy and one transparent listener per allowed port; everything they accept is
//! handed to a broker on the host side, which decides and relays. This module is the pure
//! part of that broker: the allowlist and its narrowing rule ([`allow`]), the address ranges
//! that are never reached by name ([`addr`]), the fake addresses the stub hands out
//! ([`pool`]), the parsers for what a sandbox sends ([`dns`], [`http`], [`tls`]) and the
//! decision itself ([`policy`]). It does no I/O, so every rule is testable on its own and
//! every parser can be fed hostile bytes.
//!
//! The rules it enforces, and why:
//! - Deny by default: an empty allowlist reaches nothing, and anything unparseable is
//!   refused, never guessed at.
//! - DNS never leaks: the stub answers allowed names with addresses from a private pool and
//!   never asks a real resolver, so a lookup cannot carry data out of the sandbox (no
//!   tunnelling through query names) and a name's real address is fetched only when a
//!   connection to it is allowed.
//! - Policy by name, then by address: a connection to a name must first be allowed by
//!   name; its resolved addresses must then be public, unless an entry names the address
//!   itself, so a public name that resolves to loopback, a private network or a cloud
//!   metadata address (DNS rebinding) reaches nothing.
//!
//! Every parser here bounds its input and never panics on it: the module denies indexing,
//! slicing, unchecked arithmetic, `unwrap` and `expect`.

pub mod addr;
pub mod allow;
pub mod dns;
pub mod http;
pub mod policy;
pub mod pool;
pub mod tls;

pub use addr::special_range;
pub use allow::{AllowHost, AllowList, HostPattern};
pub use dns::DnsOutcome;
pub use http::ProxyRequest;
pub use policy::{Denial, Destination, Resolution, check};
pub use pool::FakePool;
pub use tls::ClientHello;

/// The ports a sandbox with egress keeps for the broker inside its network namespace: the
/// DNS stub's (53) and the HTTP proxy's (3128), as `sandbox::net` binds them. No allowlist
/// entry can be reached on them (the transparent listener would collide), so a grant
/// naming one is refused.
pub const BROKER_PORTS: [u16; 2] = [53, 3128];

/// Why an allowlist entry, a `--resolve` entry or something a sandbox sent was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// An allowlist entry that does not parse or is too broad.
    #[error("allowed host {input:?}: {why}; write it like {example}")]
    AllowHost {
        input: String,
        why: String,
        example: &'static str,
    },
    /// More allowlist entries than [`AllowList::MAX_ENTRIES`].
    #[error(
        "{count} allowed hosts, more than the {max} one sandbox may have; merge them into wildcards or CIDR ranges"
    )]
    TooManyEntries { count: usize, max: usize },
    /// A `NAME=ADDR` resolution entry that does not parse.
    #[error("resolve entry {input:?}: {why}; write it like api.example.com=198.51.100.7")]
    Resolve { input: String, why: String },
    /// An HTTP request head the proxy cannot read (answer 400).
    #[error("malformed HTTP request: {0}")]
    HttpMalformed(String),
    /// An HTTP request the proxy reads but will not carry (answer 403 or 405).
    #[error("HTTP request refused: {0}")]
    HttpRefused(String),
    /// An HTTP request head larger than [`http::MAX_HEAD`] (answer 431).
    #[error("HTTP request head larger than {limit} bytes")]
    HeadTooLarge { limit: usize },
    /// Bytes on a TLS port that are not a ClientHello this module reads.
    #[error("not a TLS ClientHello: {0}")]
    Tls(String),
}
