//! The decision for one connection: by name first, then by address.
//!
//! A name must be allowed before anything is resolved, so a refused name is never looked
//! up (a lookup alone can carry data out). Its addresses come from the `--resolve` table,
//! else from the host's resolver, and those that are not public are dropped unless an
//! entry names them: an allowed public name never leads to loopback, the local network or
//! a metadata endpoint, whatever its DNS says. A bare address must itself be allowed.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use super::EgressError;
use super::addr::special_range;
use super::allow::{AllowList, canonical_name};
use super::pool::FakePool;

/// Where a sandbox asked to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A host name (from a pool address, a CONNECT target, SNI or a Host header).
    Name(String),
    /// An address the sandbox gave itself, never a pool address.
    Addr(IpAddr),
}

impl Destination {
    /// A host as the parsers here return it (a lowercase name, or an address in its plain
    /// text form, IPv6 without brackets): an address when it reads as one, else a name.
    pub fn from_host(host: &str) -> Self {
        match host.parse::<IpAddr>() {
            Ok(addr) => Self::Addr(addr.to_canonical()),
            Err(_) => Self::Name(host.to_string()),
        }
    }
}

/// Fixed name-to-address entries (`--resolve NAME=ADDR`), used before the host's
/// resolver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolution {
    table: BTreeMap<String, Vec<IpAddr>>,
}

impl Resolution {
    /// Most addresses one name may have in the table.
    pub const MAX_ADDRS: usize = 16;

    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `NAME=ADDR`: a host name (as in an allowlist entry) and an IPv4 or IPv6
    /// address (brackets optional).
    pub fn parse_entry(s: &str) -> Result<(String, IpAddr), EgressError> {
        let err = |why: String| EgressError::Resolve {
            input: s.to_string(),
            why,
        };
        let (name, addr) = s
            .split_once('=')
            .ok_or_else(|| err("no '=' between the name and the address".into()))?;
        let name = canonical_name(name).map_err(&err)?;
        let bare = addr
            .strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .unwrap_or(addr);
        let addr: IpAddr = bare
            .parse()
            .map_err(|_| err(format!("{addr:?} is not an IP address")))?;
        Ok((name, addr.to_canonical()))
    }

    /// Adds `addr` to `name`'s addresses (kept in order, repeats dropped, at most
    /// [`Self::MAX_ADDRS`]; more are ignored).
    pub fn insert(&mut self, name: &str, addr: IpAddr) {
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        let addrs = self.table.entry(name).or_default();
        let addr = addr.to_canonical();
        if !addrs.contains(&addr) && addrs.len() < Self::MAX_ADDRS {
            addrs.push(addr);
        }
    }

    /// Takes `other`'s entries: for a name in both, `other`'s addresses replace these.
    pub fn merge(&mut self, other: &Resolution) {
        for (name, addrs) in &other.table {
            self.table.insert(name.clone(), addrs.clone());
        }
    }

    /// The addresses fixed for `name` (case ignored, one trailing dot dropped).
    pub fn lookup(&self, name: &str) -> Option<&[IpAddr]> {
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        self.table.get(&name).map(Vec::as_slice)
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// No entry allows the name, or the address, on that port.
    NotAllowed,
    /// Every address the name resolved to is not public, and no entry names it; the
    /// first such address and why it is not public.
    SpecialAddress(&'static str, IpAddr),
    /// The host's resolver failed (the connection fails closed).
    ResolveFailed(String),
    /// The name resolved to no address.
    NoAddress,
    /// A pool address no name was handed out for, or one that reached the policy as an
    /// address.
    UnknownPoolAddress(IpAddr),
    /// The byte budget is spent: nothing more goes out, not even a lookup.
    BudgetExhausted,
}

impl Denial {
    /// A short code for the audit trail and the denial header.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotAllowed => "not_allowed",
            Self::SpecialAddress(..) => "private_address",
            Self::ResolveFailed(_) => "resolve_failed",
            Self::NoAddress => "no_address",
            Self::UnknownPoolAddress(_) => "unknown_pool_address",
            Self::BudgetExhausted => "budget_exhausted",
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAllowed => f.write_str("no --allow-host entry allows this host and port"),
            Self::SpecialAddress(why, addr) => write!(
                f,
                "the name resolves only to addresses that are not public, such as {addr} ({why}); an --allow-host entry for {} itself allows it",
                bracketed(*addr)
            ),
            Self::ResolveFailed(why) => write!(f, "the name could not be resolved ({why})"),
            Self::NoAddress => f.write_str("the name resolves to no address"),
            Self::UnknownPoolAddress(addr) => write!(
                f,
                "{addr} is a sandbox DNS address that was never handed out; connect by name"
            ),
            Self::BudgetExhausted => {
                f.write_str("the --max-egress budget is spent; give a larger one")
            }
        }
    }
}

fn bracketed(addr: IpAddr) -> String {
    match addr {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("[{a}]"),
    }
}

/// The addresses to connect to for `dest` on `port`, or why not.
///
/// A name must be allowed before anything is resolved; it is resolved by `table`, else by
/// `host_resolve` (an error fails closed); addresses that are not public are dropped unless
/// an entry allows that address on that port. An address must be allowed by an entry
/// itself. IPv4-mapped addresses come back as IPv4.
pub fn check(
    allow: &AllowList,
    table: &Resolution,
    dest: &Destination,
    port: u16,
    host_resolve: &mut dyn FnMut(&str) -> Result<Vec<IpAddr>, String>,
) -> Result<Vec<SocketAddr>, Denial> {
    match dest {
        Destination::Addr(addr) => {
            let addr = addr.to_canonical();
            if FakePool::in_pool(addr) {
                return Err(Denial::UnknownPoolAddress(addr));
            }
            if !allow.allows_addr(addr, port) {
                return Err(Denial::NotAllowed);
            }
            if let Some(why) = special_range(addr) {
                if !allow.names_special_addr(addr, port) {
                    return Err(Denial::SpecialAddress(why, addr));
                }
            }
            Ok(vec![SocketAddr::new(addr, port)])
        }
        Destination::Name(name) => {
            if !allow.allows_name(name, port) {
                return Err(Denial::NotAllowed);
            }
            let resolved = match table.lookup(name) {
                Some(fixed) => fixed.to_vec(),
                None => host_resolve(name).map_err(Denial::ResolveFailed)?,
            };
            let mut kept: Vec<SocketAddr> = Vec::new();
            let mut first_dropped = None;
            for addr in resolved {
                let addr = addr.to_canonical();
                // Pool addresses are loopback, so a resolver cannot hand one out either.
                match special_range(addr) {
                    Some(why) if !allow.names_special_addr(addr, port) => {
                        first_dropped.get_or_insert((why, addr));
                    }
                    _ => {
                        let sa = SocketAddr::new(addr, port);
                        if !kept.contains(&sa) {
                            kept.push(sa);
                        }
                    }
                }
            }
            if !kept.is_empty() {
                return Ok(kept);
            }
            Err(match first_dropped {
                Some((why, addr)) => Denial::SpecialAddress(why, addr),
                None => Denial::NoAddress,
            })
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;

    fn allow(entries: &[&str]) -> AllowList {
        AllowList::new(entries.iter().map(|e| e.parse().unwrap()).collect()).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn table(entries: &[&str]) -> Resolution {
        let mut t = Resolution::new();
        for e in entries {
            let (name, addr) = Resolution::parse_entry(e).unwrap();
            t.insert(&name, addr);
        }
        t
    }

    /// A resolver that records the names it was asked for and answers from `answers`.
    fn run(
        list: &AllowList,
        t: &Resolution,
        dest: Destination,
        port: u16,
        answers: Result<Vec<IpAddr>, String>,
    ) -> (Result<Vec<SocketAddr>, Denial>, Vec<String>) {
        let mut asked = Vec::new();
        let mut resolve = |name: &str| {
            asked.push(name.to_string());
            answers.clone()
        };
        let result = check(list, t, &dest, port, &mut resolve);
        (result, asked)
    }

    fn name(n: &str) -> Destination {
        Destination::Name(n.into())
    }

    #[test]
    fn an_allowed_name_resolves_by_the_host_resolver_to_its_public_addresses() {
        let list = allow(&["api.example.com:443"]);
        let (r, asked) = run(
            &list,
            &Resolution::new(),
            name("api.example.com"),
            443,
            Ok(vec![
                ip("198.51.100.7"),
                ip("2001:db8::7"),
                ip("198.51.100.7"),
            ]),
        );
        assert_eq!(
            r.unwrap(),
            vec![
                "198.51.100.7:443".parse::<SocketAddr>().unwrap(),
                "[2001:db8::7]:443".parse().unwrap()
            ]
        );
        assert_eq!(asked, vec!["api.example.com"]);
    }

    #[test]
    fn a_name_not_allowed_is_refused_before_anything_is_resolved() {
        let list = allow(&["api.example.com:443"]);
        for (dest, port) in [
            (name("evil.example.com"), 443),
            (name("api.example.com"), 80),
        ] {
            let (r, asked) = run(
                &list,
                &Resolution::new(),
                dest,
                port,
                Ok(vec![ip("198.51.100.7")]),
            );
            assert_eq!(r, Err(Denial::NotAllowed));
            assert!(asked.is_empty(), "{asked:?}");
        }
    }

    #[test]
    fn an_allowed_name_resolving_to_a_private_or_link_local_address_is_refused() {
        let list = allow(&["api.example.com:443"]);
        for (addr, why) in [
            ("10.255.0.1", "private (RFC 1918)"),
            ("169.254.7.7", "link-local"),
            ("127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private (RFC 1918)"),
            ("127.1.0.9", "loopback"),
        ] {
            let t = table(&[&format!("api.example.com={addr}")]);
            let (r, asked) = run(&list, &t, name("api.example.com"), 443, Ok(vec![]));
            let expected = ip(addr).to_canonical();
            assert_eq!(r, Err(Denial::SpecialAddress(why, expected)), "{addr}");
            assert!(asked.is_empty(), "the table is used before the resolver");
        }
    }

    #[test]
    fn a_private_address_named_by_its_own_entry_is_reached_by_name() {
        let list = allow(&["api.example.com:443", "10.255.0.1:443"]);
        let t = table(&["api.example.com=10.255.0.1"]);
        let (r, _) = run(&list, &t, name("api.example.com"), 443, Ok(vec![]));
        assert_eq!(
            r.unwrap(),
            vec!["10.255.0.1:443".parse::<SocketAddr>().unwrap()]
        );
        // The address entry is for 443 only.
        let list = allow(&[
            "api.example.com:443",
            "api.example.com:80",
            "10.255.0.1:443",
        ]);
        let (r, _) = run(&list, &t, name("api.example.com"), 80, Ok(vec![]));
        assert!(matches!(r, Err(Denial::SpecialAddress(..))));
    }

    #[test]
    fn special_addresses_are_dropped_and_public_ones_kept() {
        let list = allow(&["api.example.com:443"]);
        let (r, _) = run(
            &list,
            &Resolution::new(),
            name("api.example.com"),
            443,
            Ok(vec![ip("10.0.0.1"), ip("203.0.113.9")]),
        );
        assert_eq!(
            r.unwrap(),
            vec!["203.0.113.9:443".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn a_resolver_error_or_no_address_fails_closed() {
        let list = allow(&["api.example.com:443"]);
        let (r, _) = run(
            &list,
            &Resolution::new(),
            name("api.example.com"),
            443,
            Err("no such host".into()),
        );
        assert_eq!(r, Err(Denial::ResolveFailed("no such host".into())));
        let (r, _) = run(
            &list,
            &Resolution::new(),
            name("api.example.com"),
            443,
            Ok(vec![]),
        );
        assert_eq!(r, Err(Denial::NoAddress));
    }

    #[test]
    fn an_address_needs_its_own_entry_on_that_port() {
        let list = allow(&["198.51.100.7:443", "10.0.0.0/8:5432", "127.0.0.1:8080"]);
        let t = Resolution::new();
        let ok =
            |a: &str, p: u16| run(&list, &t, Destination::Addr(ip(a)), p, Err("unused".into())).0;
        assert_eq!(
            ok("198.51.100.7", 443).unwrap(),
            vec!["198.51.100.7:443".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(ok("198.51.100.7", 80), Err(Denial::NotAllowed));
        assert_eq!(ok("198.51.100.8", 443), Err(Denial::NotAllowed));
        assert!(ok("10.1.2.3", 5432).is_ok());
        assert_eq!(
            ok("::ffff:10.1.2.3", 5432).unwrap(),
            vec!["10.1.2.3:5432".parse::<SocketAddr>().unwrap()]
        );
        assert!(ok("127.0.0.1", 8080).is_ok());
        assert_eq!(ok("127.0.0.2", 8080), Err(Denial::NotAllowed));
        assert_eq!(ok("169.254.169.254", 80), Err(Denial::NotAllowed));
    }

    #[test]
    fn a_pool_address_never_passes_as_an_address() {
        let list = allow(&["127.0.0.0/8:443"]);
        let (r, _) = run(
            &list,
            &Resolution::new(),
            Destination::Addr(ip("127.1.0.1")),
            443,
            Ok(vec![]),
        );
        assert_eq!(r, Err(Denial::UnknownPoolAddress(ip("127.1.0.1"))));
    }

    #[test]
    fn a_host_from_a_parser_is_an_address_when_it_reads_as_one() {
        assert_eq!(
            Destination::from_host("2001:db8::1"),
            Destination::Addr(ip("2001:db8::1"))
        );
        assert_eq!(
            Destination::from_host("::ffff:10.0.0.1"),
            Destination::Addr(ip("10.0.0.1"))
        );
        assert_eq!(
            Destination::from_host("198.51.100.7"),
            Destination::Addr(ip("198.51.100.7"))
        );
        assert_eq!(
            Destination::from_host("api.example.com"),
            name("api.example.com")
        );
    }

    #[test]
    fn denials_have_codes_and_sentences() {
        let cases = [
            (Denial::NotAllowed, "not_allowed"),
            (
                Denial::SpecialAddress("loopback", ip("::1")),
                "private_address",
            ),
            (Denial::ResolveFailed("timeout".into()), "resolve_failed"),
            (Denial::NoAddress, "no_address"),
            (
                Denial::UnknownPoolAddress(ip("127.1.0.9")),
                "unknown_pool_address",
            ),
        ];
        for (d, code) in cases {
            assert_eq!(d.reason(), code);
            assert!(!d.to_string().is_empty());
        }
        assert!(
            Denial::SpecialAddress("loopback", ip("::1"))
                .to_string()
                .contains("[::1]")
        );
    }

    #[test]
    fn resolve_entries_parse_and_look_up_by_canonical_name() {
        let t = table(&[
            "API.example.com.=198.51.100.7",
            "api.example.com=[2001:db8::7]",
            "api.example.com=198.51.100.7",
        ]);
        assert_eq!(
            t.lookup("Api.Example.com."),
            Some(&[ip("198.51.100.7"), ip("2001:db8::7")][..])
        );
        assert_eq!(t.lookup("other.example.com"), None);
        for bad in [
            "api.example.com",
            "api.example.com=",
            "=198.51.100.7",
            "*.example.com=198.51.100.7",
            "api.example.com=api2.example.com",
            "127.1=198.51.100.7",
            "api.example.com=198.51.100.7:443",
        ] {
            let err = Resolution::parse_entry(bad).unwrap_err();
            assert!(
                err.to_string().contains("api.example.com=198.51.100.7"),
                "{err}"
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod broad_cidr_tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::new(entries.iter().map(|e| e.parse().unwrap()).collect()).unwrap()
    }

    #[test]
    fn a_cidr_spanning_ranges_opens_no_special_address() {
        let mut table = Resolution::new();
        table.insert("inside.test", IpAddr::from([127, 0, 0, 1]));
        let mut never = |_: &str| Err::<Vec<IpAddr>, String>("no lookups here".into());
        let broad = list(&["0.0.0.0/0:443", "inside.test:443"]);
        let loopback = Destination::Addr(IpAddr::from([127, 0, 0, 1]));
        assert!(matches!(
            check(&broad, &table, &loopback, 443, &mut never),
            Err(Denial::SpecialAddress("loopback", _))
        ));
        let name = Destination::Name("inside.test".into());
        assert!(check(&broad, &table, &name, 443, &mut never).is_err());
        let public = Destination::Addr(IpAddr::from([198, 51, 100, 7]));
        assert!(check(&broad, &table, &public, 443, &mut never).is_ok());
        let narrow = list(&["127.0.0.0/8:443", "inside.test:443"]);
        assert!(check(&narrow, &table, &loopback, 443, &mut never).is_ok());
        assert!(check(&narrow, &table, &name, 443, &mut never).is_ok());
    }
}
