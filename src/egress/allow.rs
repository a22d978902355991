//! The allowlist: which hosts and ports a sandbox may reach, and when one list is inside
//! another (a child never reaches what its parent could not).
//!
//! An entry is a host pattern and one port. Names are matched as names (before any
//! resolution), addresses as addresses; the two kinds never stand in for each other, so an
//! entry for a name says nothing about the addresses it resolves to, and the reverse.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::EgressError;

/// Longest host name, in characters, without the trailing dot (RFC 1035's 255 octets on the
/// wire).
pub const MAX_NAME_LEN: usize = 253;
/// Longest label of a host name.
pub const MAX_LABEL_LEN: usize = 63;

/// What an allowlist entry matches.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostPattern {
    /// One host name: lowercase ASCII, no trailing dot, RFC 1123 labels.
    Name(String),
    /// Every name made of exactly one more label in front of this suffix (`*.suffix`); never
    /// the suffix itself, never two labels deep.
    Wildcard(String),
    /// One address. An IPv4-mapped IPv6 address is kept as its IPv4 address.
    Addr(IpAddr),
    /// A network: the address has its host bits zero. An IPv6 network inside
    /// `::ffff:0:0/96` is kept as the IPv4 network it maps.
    Cidr(IpAddr, u8),
}

/// One allowlist entry: a host pattern and the one port it may be reached on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllowHost {
    pub host: HostPattern,
    pub port: u16,
}

const EXAMPLE: &str =
    "api.example.com:443, *.pypi.org:443, 198.51.100.7:80, 10.0.0.0/8:443 or [2001:db8::1]:443";

/// Checks a host name and returns its canonical form: lowercased, one trailing dot dropped.
///
/// Labels are RFC 1123 (letters, digits and `-`, 1 to 63 characters, not starting or ending
/// with `-`). The last label must not be all digits or a `0x` number: such names are read
/// as IPv4 addresses by some resolvers and URL parsers (`127.1`, `0x7f000001`), so they are
/// refused as names and must be written as addresses.
pub fn canonical_name(input: &str) -> Result<String, String> {
    let name = input.strip_suffix('.').unwrap_or(input);
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "the name is {} characters long, more than {MAX_NAME_LEN}",
            name.len()
        ));
    }
    let mut last = "";
    for label in name.split('.') {
        check_label(label)?;
        last = label;
    }
    if looks_numeric(last) {
        return Err(format!(
            "its last label {last:?} is a number, so it reads as an IPv4 address; write addresses in dotted-quad form"
        ));
    }
    Ok(name.to_ascii_lowercase())
}

fn check_label(label: &str) -> Result<(), String> {
    if label.is_empty() {
        return Err("it has an empty label (two dots in a row, or a leading dot)".into());
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(format!(
            "its label {label:?} is longer than {MAX_LABEL_LEN} characters"
        ));
    }
    if let Some(bad) = label
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
    {
        return Err(format!(
            "{bad:?} is not allowed in a host name (letters, digits, '-' and '.' only)"
        ));
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Err(format!("its label {label:?} starts or ends with '-'"));
    }
    Ok(())
}

fn looks_numeric(label: &str) -> bool {
    if label.chars().all(|c| c.is_ascii_digit()) {
        return true;
    }
    let hex = label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"));
    hex.is_some_and(|h| h.chars().all(|c| c.is_ascii_hexdigit()))
}

/// True when `label` is one RFC 1123 label (what `*` stands for).
pub(crate) fn is_label(label: &str) -> bool {
    check_label(label).is_ok()
}

/// The name as compared: one trailing dot dropped (case is ignored by the comparisons).
fn trim_dot(name: &str) -> &str {
    name.strip_suffix('.').unwrap_or(name)
}

/// An IPv4-mapped IPv6 address as its IPv4 address; anything else unchanged.
pub(crate) fn canonical_addr(addr: IpAddr) -> IpAddr {
    addr.to_canonical()
}

/// The network mask of `prefix` bits for a 32-bit address.
fn mask_v4(prefix: u8) -> u32 {
    u32::MAX
        .checked_shl(32u32.saturating_sub(u32::from(prefix)))
        .unwrap_or(0)
}

/// The network mask of `prefix` bits for a 128-bit address.
fn mask_v6(prefix: u8) -> u128 {
    u128::MAX
        .checked_shl(128u32.saturating_sub(u32::from(prefix)))
        .unwrap_or(0)
}

/// True when `addr` is inside `network/prefix` (same family only).
pub(crate) fn cidr_contains(network: IpAddr, prefix: u8, addr: IpAddr) -> bool {
    match (network, addr) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let m = mask_v4(prefix);
            u32::from(a) & m == u32::from(n) & m
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let m = mask_v6(prefix);
            u128::from(a) & m == u128::from(n) & m
        }
        _ => false,
    }
}

/// The last address of `network/prefix`.
fn cidr_last(network: IpAddr, prefix: u8) -> IpAddr {
    match network {
        IpAddr::V4(n) => IpAddr::V4((u32::from(n) | !mask_v4(prefix)).into()),
        IpAddr::V6(n) => IpAddr::V6((u128::from(n) | !mask_v6(prefix)).into()),
    }
}

/// The special ranges (see [`super::special_range`]) of a network's first and last
/// addresses: both `None` for a network wholly public, both the same for one wholly inside
/// one range.
fn cidr_ends(network: IpAddr, prefix: u8) -> (Option<&'static str>, Option<&'static str>) {
    (
        super::special_range(network),
        super::special_range(cidr_last(network, prefix)),
    )
}

fn max_prefix(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// The network address of `addr/prefix` (host bits cleared).
fn network_of(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask_v4(prefix))),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask_v6(prefix))),
    }
}

impl HostPattern {
    /// Parses a host pattern as written before the port: a name, `*.suffix`, an address or
    /// `network/prefix` (IPv6 without brackets). `Err` is the reason, without the input.
    fn parse(text: &str) -> Result<Self, String> {
        if let Some(suffix) = text.strip_prefix("*.") {
            let suffix = canonical_name(suffix).map_err(|e| format!("after \"*.\": {e}"))?;
            if !suffix.contains('.') {
                return Err(format!(
                    "\"*.{suffix}\" is too broad: a wildcard needs a suffix of at least two labels"
                ));
            }
            return Ok(Self::Wildcard(suffix));
        }
        if text.contains('*') {
            return Err("'*' may only stand alone as the first label (\"*.example.com\")".into());
        }
        if let Some((net, prefix)) = text.split_once('/') {
            let net: IpAddr = net
                .parse()
                .map_err(|_| format!("{net:?} before '/' is not an IP address"))?;
            if prefix.is_empty() || !prefix.chars().all(|c| c.is_ascii_digit()) {
                return Err(format!("{prefix:?} after '/' is not a prefix length"));
            }
            let prefix: u8 = prefix
                .parse()
                .map_err(|_| format!("prefix length {prefix} is too large"))?;
            let max = max_prefix(net);
            if prefix > max {
                return Err(format!(
                    "prefix length {prefix} is more than {max} for this address family"
                ));
            }
            let network = network_of(net, prefix);
            if network != net {
                return Err(format!(
                    "{net}/{prefix} has host bits set: the network is {network}/{prefix}"
                ));
            }
            return Ok(Self::cidr(net, prefix));
        }
        if let Ok(addr) = text.parse::<IpAddr>() {
            return Ok(Self::Addr(canonical_addr(addr)));
        }
        canonical_name(text).map(Self::Name)
    }

    /// A CIDR entry, an IPv6 network inside `::ffff:0:0/96` kept as the IPv4 network.
    fn cidr(net: IpAddr, prefix: u8) -> Self {
        if let IpAddr::V6(v6) = net
            && let Some(v4) = v6.to_ipv4_mapped()
            && let Some(p4) = prefix.checked_sub(96)
        {
            return Self::Cidr(IpAddr::V4(v4), p4);
        }
        Self::Cidr(net, prefix)
    }

    fn is_v6(&self) -> bool {
        matches!(
            self,
            Self::Addr(IpAddr::V6(_)) | Self::Cidr(IpAddr::V6(_), _)
        )
    }

    /// True for a name pattern matching `name` (case ignored, one trailing dot dropped).
    pub fn matches_name(&self, name: &str) -> bool {
        let name = trim_dot(name);
        match self {
            Self::Name(n) => n.eq_ignore_ascii_case(name),
            Self::Wildcard(suffix) => name
                .split_once('.')
                .is_some_and(|(first, rest)| is_label(first) && rest.eq_ignore_ascii_case(suffix)),
            Self::Addr(_) | Self::Cidr(..) => false,
        }
    }

    /// True for an address pattern matching `addr` (IPv4-mapped compared as IPv4).
    pub fn matches_addr(&self, addr: IpAddr) -> bool {
        let addr = canonical_addr(addr);
        match self {
            Self::Addr(a) => *a == addr,
            Self::Cidr(net, prefix) => cidr_contains(*net, *prefix, addr),
            Self::Name(_) | Self::Wildcard(_) => false,
        }
    }

    /// True when everything `child` matches, `self` matches too (see [`AllowHost::covers`]).
    pub fn covers(&self, child: &Self) -> bool {
        match (self, child) {
            (Self::Name(p), Self::Name(c)) => p == c,
            (Self::Wildcard(_), Self::Name(c)) => self.matches_name(c),
            (Self::Wildcard(p), Self::Wildcard(c)) => p == c,
            (Self::Addr(p), Self::Addr(c)) => p == c,
            (Self::Cidr(..), Self::Addr(c)) => self.matches_addr(*c),
            (Self::Cidr(pn, pp), Self::Cidr(cn, cp)) => pp <= cp && cidr_contains(*pn, *pp, *cn),
            _ => false,
        }
    }
}

impl fmt::Display for HostPattern {
    /// The host as written in an entry; IPv6 without brackets (the entry adds them).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(n) => f.write_str(n),
            Self::Wildcard(s) => write!(f, "*.{s}"),
            Self::Addr(a) => write!(f, "{a}"),
            Self::Cidr(a, p) => write!(f, "{a}/{p}"),
        }
    }
}

impl AllowHost {
    /// True when this is a name or wildcard entry for `port` matching `name`.
    pub fn matches_name(&self, name: &str, port: u16) -> bool {
        self.port == port && self.host.matches_name(name)
    }

    /// True when this is an address or CIDR entry for `port` matching `addr`.
    pub fn matches_addr(&self, addr: IpAddr, port: u16) -> bool {
        self.port == port && self.host.matches_addr(addr)
    }

    /// True when `child` allows nothing this entry does not: same port; a name by the same
    /// name or a wildcard matching it; a wildcard only by the same wildcard; an address by
    /// the same address or a network containing it; a network by a network containing it.
    /// Names and addresses never cover each other.
    pub fn covers(&self, child: &AllowHost) -> bool {
        self.port == child.port && self.host.covers(&child.host)
    }
}

impl FromStr for AllowHost {
    type Err = EgressError;

    /// Parses `HOST:PORT`, where HOST is a name, `*.suffix`, an IPv4 address or network,
    /// or an IPv6 address or network in brackets.
    fn from_str(input: &str) -> Result<Self, EgressError> {
        let err = |why: String| EgressError::AllowHost {
            input: input.to_string(),
            why,
            example: EXAMPLE,
        };
        let (host, port) = if let Some(rest) = input.strip_prefix('[') {
            let (inside, after) = rest
                .split_once(']')
                .ok_or_else(|| err("'[' without a closing ']'".into()))?;
            let port = after
                .strip_prefix(':')
                .ok_or_else(|| err("no \":PORT\" after the bracketed address".into()))?;
            if !inside.contains(':') {
                return Err(err(
                    "brackets are for IPv6 addresses only; write names and IPv4 without them"
                        .into(),
                ));
            }
            let host = HostPattern::parse(inside).map_err(&err)?;
            if matches!(host, HostPattern::Name(_) | HostPattern::Wildcard(_)) {
                return Err(err(format!("{inside:?} is not an IPv6 address")));
            }
            (host, port)
        } else {
            let (host, port) = input
                .rsplit_once(':')
                .ok_or_else(|| err("no port: every entry needs \":PORT\"".into()))?;
            if host.contains(':') {
                return Err(err(
                    "an IPv6 address needs brackets: [2001:db8::1]:443".into()
                ));
            }
            (HostPattern::parse(host).map_err(&err)?, port)
        };
        Ok(Self {
            host,
            port: parse_port(port).map_err(err)?,
        })
    }
}

/// A port number 1 to 65535, digits only.
pub(crate) fn parse_port(text: &str) -> Result<u16, String> {
    if text.is_empty() {
        return Err("the port is empty".into());
    }
    if !text.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("port {text:?} is not a number"));
    }
    match text.parse::<u16>() {
        Ok(0) => Err("port 0 cannot be connected to; give a port from 1 to 65535".into()),
        Ok(p) => Ok(p),
        Err(_) => Err(format!("port {text} is more than 65535")),
    }
}

impl fmt::Display for AllowHost {
    /// The canonical text, which parses back to the same entry.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.is_v6() {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl Serialize for AllowHost {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AllowHost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A sandbox's allowlist: at most [`AllowList::MAX_ENTRIES`] distinct entries, in the
/// order given, and whether any public host is allowed besides (a manifest's
/// `allow_external`; never serialized: the manifest signs it as its own field). Empty
/// allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<AllowHost>", into = "Vec<AllowHost>")]
pub struct AllowList(Vec<AllowHost>, bool);

/// Whether every address an entry can reach is public (what "any public host" covers).
fn public_entry(e: &AllowHost) -> bool {
    match e.host {
        HostPattern::Name(_) | HostPattern::Wildcard(_) => true,
        HostPattern::Addr(a) => super::special_range(a).is_none(),
        HostPattern::Cidr(net, prefix) => cidr_ends(net, prefix) == (None, None),
    }
}

impl AllowList {
    /// Most entries one list may hold: every connection is checked against each.
    pub const MAX_ENTRIES: usize = 64;

    /// The list of `entries` with repeats dropped (first kept); more than
    /// [`Self::MAX_ENTRIES`] distinct entries is an error.
    pub fn new(entries: Vec<AllowHost>) -> Result<Self, EgressError> {
        let mut kept: Vec<AllowHost> = Vec::with_capacity(entries.len().min(Self::MAX_ENTRIES));
        for entry in entries {
            if !kept.contains(&entry) {
                if kept.len() >= Self::MAX_ENTRIES {
                    return Err(EgressError::TooManyEntries {
                        count: kept.len().saturating_add(1),
                        max: Self::MAX_ENTRIES,
                    });
                }
                kept.push(entry);
            }
        }
        Ok(Self(kept, false))
    }

    pub fn entries(&self) -> &[AllowHost] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty() && !self.1
    }

    /// This list, and any public host besides: every name on every port, every public
    /// address (special ones still only when an entry names them). Proxy-unaware clients
    /// get listeners on 80 and 443.
    pub fn with_any_public(mut self) -> Self {
        self.1 = true;
        self
    }

    pub fn any_public(&self) -> bool {
        self.1
    }

    /// True when a name or wildcard entry allows `name` on `port`.
    pub fn allows_name(&self, name: &str, port: u16) -> bool {
        self.1 || self.0.iter().any(|e| e.matches_name(name, port))
    }

    /// True when a name or wildcard entry allows `name` on some port: the names the DNS
    /// stub answers.
    pub fn knows_name(&self, name: &str) -> bool {
        self.1 || self.0.iter().any(|e| e.host.matches_name(name))
    }

    /// True when an address or CIDR entry allows `addr` on `port`.
    pub fn allows_addr(&self, addr: IpAddr, port: u16) -> bool {
        (self.1 && super::special_range(addr).is_none())
            || self.0.iter().any(|e| e.matches_addr(addr, port))
    }

    /// True when an entry names the special (non-public) address `addr` on `port` on
    /// purpose: the address itself, or a CIDR lying wholly in one special range
    /// (`10.0.0.0/8`, `127.0.0.0/8`). A broad CIDR that merely contains it
    /// (`0.0.0.0/0`) does not: it would open loopback and the metadata service to every
    /// name that resolves there.
    pub fn names_special_addr(&self, addr: IpAddr, port: u16) -> bool {
        self.0.iter().any(|e| {
            e.port == port
                && match e.host {
                    HostPattern::Addr(a) => a.to_canonical() == addr.to_canonical(),
                    HostPattern::Cidr(net, prefix) => {
                        let (first, last) = cidr_ends(net, prefix);
                        e.matches_addr(addr, port) && first.is_some() && first == last
                    }
                    _ => false,
                }
        })
    }

    /// True when an entry names `addr` itself on `port` (the address, or a network of
    /// that one address, `/32` or `/128`; not a wider network containing it).
    pub fn names_addr(&self, addr: IpAddr, port: u16) -> bool {
        let addr = addr.to_canonical();
        self.0.iter().any(|e| {
            e.port == port
                && match e.host {
                    HostPattern::Addr(a) => a.to_canonical() == addr,
                    HostPattern::Cidr(net, prefix) => {
                        let whole = if net.is_ipv4() { 32 } else { 128 };
                        prefix == whole && net.to_canonical() == addr
                    }
                    _ => false,
                }
        })
    }

    /// Every port some entry allows: one transparent listener each.
    pub fn ports(&self) -> BTreeSet<u16> {
        let any = if self.1 { &[80u16, 443][..] } else { &[] };
        self.0
            .iter()
            .map(|e| e.port)
            .chain(any.iter().copied())
            .collect()
    }

    /// `Ok` when every entry of `child` is covered by an entry of `self`; otherwise the
    /// first child entry that is not.
    pub fn covers(&self, child: &AllowList) -> Result<(), AllowHost> {
        let covered =
            |c: &AllowHost| (self.1 && public_entry(c)) || self.0.iter().any(|p| p.covers(c));
        match child.0.iter().find(|c| !covered(c)) {
            Some(uncovered) => Err(uncovered.clone()),
            None => Ok(()),
        }
    }
}

impl TryFrom<Vec<AllowHost>> for AllowList {
    type Error = EgressError;

    fn try_from(entries: Vec<AllowHost>) -> Result<Self, EgressError> {
        Self::new(entries)
    }
}

impl From<AllowList> for Vec<AllowHost> {
    fn from(list: AllowList) -> Self {
        list.0
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests;
