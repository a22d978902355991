use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;

fn entry(s: &str) -> AllowHost {
    s.parse()
        .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
}

fn list(entries: &[&str]) -> AllowList {
    AllowList::new(entries.iter().map(|e| entry(e)).collect()).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn each_kind_of_entry_parses_and_prints_back_the_same() {
    let cases = [
        (
            "api.example.com:443",
            HostPattern::Name("api.example.com".into()),
            443,
        ),
        (
            "*.pypi.org:443",
            HostPattern::Wildcard("pypi.org".into()),
            443,
        ),
        ("198.51.100.7:80", HostPattern::Addr(ip("198.51.100.7")), 80),
        ("10.0.0.0/8:443", HostPattern::Cidr(ip("10.0.0.0"), 8), 443),
        (
            "[2001:db8::1]:443",
            HostPattern::Addr(ip("2001:db8::1")),
            443,
        ),
        (
            "[2001:db8::/32]:443",
            HostPattern::Cidr(ip("2001:db8::"), 32),
            443,
        ),
        (
            "0.0.0.0/0:65535",
            HostPattern::Cidr(ip("0.0.0.0"), 0),
            65535,
        ),
        ("localhost:1", HostPattern::Name("localhost".into()), 1),
    ];
    for (text, host, port) in cases {
        let e = entry(text);
        assert_eq!(e, AllowHost { host, port }, "{text}");
        assert_eq!(e.to_string(), text);
    }
}

#[test]
fn names_are_lowercased_and_lose_one_trailing_dot() {
    assert_eq!(
        entry("API.Example.COM.:443").to_string(),
        "api.example.com:443"
    );
    assert_eq!(entry("*.PyPI.org.:443").to_string(), "*.pypi.org:443");
    assert!("api.example.com..:443".parse::<AllowHost>().is_err());
}

#[test]
fn ipv4_mapped_entries_are_kept_as_ipv4() {
    assert_eq!(entry("[::ffff:10.0.0.1]:443").to_string(), "10.0.0.1:443");
    assert_eq!(
        entry("[::ffff:10.0.0.0/104]:443").to_string(),
        "10.0.0.0/8:443"
    );
}

#[test]
fn a_bad_entry_says_what_is_wrong_and_shows_a_valid_one() {
    let cases = [
        ("api.example.com", "no port"),
        ("api.example.com:", "port is empty"),
        ("api.example.com:0", "port 0"),
        ("api.example.com:65536", "more than 65535"),
        ("api.example.com:https", "not a number"),
        ("api.example.com:+443", "not a number"),
        ("*.org:443", "too broad"),
        ("*:443", "'*'"),
        ("*.*.example.com:443", "after \"*.\""),
        ("a*.example.com:443", "'*'"),
        ("10.0.0.1/8:443", "10.0.0.0/8"),
        ("10.0.0.0/33:443", "more than 32"),
        ("10.0.0.0/x:443", "prefix length"),
        ("[2001:db8::1/32]:443", "2001:db8::/32"),
        ("[2001:db8::/129]:443", "more than 128"),
        ("2001:db8::1:443", "brackets"),
        ("[10.0.0.1]:443", "brackets are for IPv6"),
        ("[api.example.com]:443", "brackets are for IPv6"),
        ("[2001:db8::1:443", "']'"),
        ("[2001:db8::1]443", "\":PORT\""),
        ("-api.example.com:443", "starts or ends with '-'"),
        ("api_x.example.com:443", "'_'"),
        ("api..example.com:443", "empty label"),
        ("127.1:443", "IPv4 address"),
        ("0x7f000001:443", "IPv4 address"),
        ("example.123:443", "IPv4 address"),
        (":443", "empty"),
        ("exämple.com:443", "'ä'"),
    ];
    for (text, needle) in cases {
        let err = text
            .parse::<AllowHost>()
            .expect_err(&format!("{text:?} should not parse"))
            .to_string();
        assert!(err.contains(needle), "{text:?}: {err}");
        assert!(err.contains("api.example.com:443"), "{text:?}: {err}");
    }
    let long_label = format!("{}.example.com:443", "a".repeat(64));
    assert!(long_label.parse::<AllowHost>().is_err());
    let long_name = format!("{}.com:443", vec!["a".repeat(60); 5].join("."));
    assert!(long_name.parse::<AllowHost>().is_err());
}

#[test]
fn a_wildcard_stands_for_exactly_one_label() {
    let e = entry("*.pypi.org:443");
    assert!(e.matches_name("files.pypi.org", 443));
    assert!(e.matches_name("FILES.PyPI.org.", 443));
    assert!(!e.matches_name("pypi.org", 443));
    assert!(!e.matches_name("a.b.pypi.org", 443));
    assert!(!e.matches_name(".pypi.org", 443));
    assert!(!e.matches_name("files.pypi.org", 80));
    assert!(!e.matches_name("filespypi.org", 443));
    assert!(!e.matches_name("x_y.pypi.org", 443));
    assert!(!e.matches_addr(ip("198.51.100.7"), 443));
}

#[test]
fn names_and_addresses_never_match_each_other() {
    let name = entry("api.example.com:443");
    assert!(name.matches_name("api.example.com", 443));
    assert!(name.matches_name("Api.Example.Com.", 443));
    assert!(!name.matches_name("x.api.example.com", 443));
    assert!(!name.matches_addr(ip("198.51.100.7"), 443));
    let addr = entry("198.51.100.7:443");
    assert!(addr.matches_addr(ip("198.51.100.7"), 443));
    assert!(addr.matches_addr(ip("::ffff:198.51.100.7"), 443));
    assert!(!addr.matches_addr(ip("198.51.100.7"), 80));
    assert!(!addr.matches_name("198.51.100.7", 443));
}

#[test]
fn a_network_matches_what_is_inside_it_only() {
    let net = entry("10.0.0.0/8:443");
    assert!(net.matches_addr(ip("10.0.0.0"), 443));
    assert!(net.matches_addr(ip("10.255.255.255"), 443));
    assert!(net.matches_addr(ip("::ffff:10.1.2.3"), 443));
    assert!(!net.matches_addr(ip("11.0.0.0"), 443));
    assert!(!net.matches_addr(ip("9.255.255.255"), 443));
    let all = entry("0.0.0.0/0:443");
    assert!(all.matches_addr(ip("203.0.113.1"), 443));
    assert!(!all.matches_addr(ip("2001:db8::1"), 443));
    let v6 = entry("[2001:db8::/32]:443");
    assert!(v6.matches_addr(ip("2001:db8:ffff::1"), 443));
    assert!(!v6.matches_addr(ip("2001:db9::1"), 443));
    assert!(!v6.matches_addr(ip("10.0.0.1"), 443));
    let host = entry("[2001:db8::1/128]:443");
    assert!(host.matches_addr(ip("2001:db8::1"), 443));
    assert!(!host.matches_addr(ip("2001:db8::2"), 443));
}

#[test]
fn covering_follows_the_narrowing_rule() {
    let yes = [
        ("api.example.com:443", "api.example.com:443"),
        ("*.example.com:443", "api.example.com:443"),
        ("*.example.com:443", "*.example.com:443"),
        ("198.51.100.7:443", "198.51.100.7:443"),
        ("198.51.100.0/24:443", "198.51.100.7:443"),
        ("10.0.0.0/8:443", "10.1.0.0/16:443"),
        ("10.0.0.0/8:443", "10.0.0.0/8:443"),
        ("[2001:db8::/32]:443", "[2001:db8::1]:443"),
        ("198.51.100.7/32:443", "198.51.100.7:443"),
    ];
    let no = [
        ("api.example.com:443", "api.example.com:80"),
        ("api.example.com:443", "x.api.example.com:443"),
        ("*.example.com:443", "example.com:443"),
        ("*.example.com:443", "a.b.example.com:443"),
        ("*.example.com:443", "*.a.example.com:443"),
        ("api.example.com:443", "*.example.com:443"),
        ("10.1.0.0/16:443", "10.0.0.0/8:443"),
        ("10.0.0.0/8:443", "11.0.0.0/8:443"),
        ("198.51.100.7:443", "198.51.100.0/24:443"),
        ("198.51.100.7:443", "198.51.100.7/32:443"),
        ("0.0.0.0/0:443", "api.example.com:443"),
        ("0.0.0.0/0:443", "[2001:db8::1]:443"),
        ("*.example.com:443", "198.51.100.7:443"),
    ];
    for (p, c) in yes {
        assert!(entry(p).covers(&entry(c)), "{p} should cover {c}");
    }
    for (p, c) in no {
        assert!(!entry(p).covers(&entry(c)), "{p} should not cover {c}");
    }
}

#[test]
fn a_list_reports_the_first_child_entry_its_parent_does_not_cover() {
    let parent = list(&["*.example.com:443", "10.0.0.0/8:5432"]);
    let child = list(&["api.example.com:443", "10.1.2.3:5432"]);
    assert_eq!(parent.covers(&child), Ok(()));
    let wider = list(&["api.example.com:443", "example.com:443", "10.1.2.3:80"]);
    assert_eq!(parent.covers(&wider), Err(entry("example.com:443")));
    assert_eq!(parent.covers(&AllowList::default()), Ok(()));
    assert_eq!(
        AllowList::default().covers(&child),
        Err(entry("api.example.com:443"))
    );
}

#[test]
fn a_list_answers_by_name_by_address_and_by_port() {
    let l = list(&[
        "api.example.com:443",
        "*.pypi.org:443",
        "api.example.com:80",
        "10.0.0.0/8:5432",
        "127.0.0.1:8080",
    ]);
    assert!(l.allows_name("api.example.com", 443));
    assert!(l.allows_name("api.example.com", 80));
    assert!(!l.allows_name("api.example.com", 22));
    assert!(l.allows_name("files.pypi.org", 443));
    assert!(!l.allows_name("files.pypi.org", 80));
    assert!(l.knows_name("files.pypi.org"));
    assert!(l.knows_name("API.example.com."));
    assert!(!l.knows_name("pypi.org"));
    assert!(!l.knows_name("10.0.0.1"));
    assert!(l.allows_addr(ip("10.9.9.9"), 5432));
    assert!(!l.allows_addr(ip("10.9.9.9"), 443));
    assert!(l.allows_addr(ip("127.0.0.1"), 8080));
    assert_eq!(
        l.ports().into_iter().collect::<Vec<_>>(),
        vec![80, 443, 5432, 8080]
    );
    assert!(!l.is_empty());
    assert!(AllowList::default().is_empty());
    assert!(!AllowList::default().allows_name("api.example.com", 443));
}

#[test]
fn a_list_drops_repeats_and_refuses_more_than_its_limit() {
    let l = list(&[
        "a.example.com:443",
        "A.example.com:443",
        "a.example.com.:443",
    ]);
    assert_eq!(l.entries().len(), 1);
    let many: Vec<AllowHost> = (1..=64)
        .map(|p| entry(&format!("a.example.com:{p}")))
        .collect();
    let mut with_repeats = many.clone();
    with_repeats.extend(many.clone());
    assert_eq!(AllowList::new(with_repeats).unwrap().entries().len(), 64);
    let mut too_many = many;
    too_many.push(entry("a.example.com:65"));
    let err = AllowList::new(too_many).unwrap_err();
    assert_eq!(err, EgressError::TooManyEntries { count: 65, max: 64 });
    assert!(err.to_string().contains("64"), "{err}");
}

#[test]
fn entries_and_lists_serialize_as_their_canonical_text() {
    let l = list(&["API.example.com:443", "[2001:db8::/32]:443"]);
    let json = serde_json::to_string(&l).unwrap();
    assert_eq!(json, r#"["api.example.com:443","[2001:db8::/32]:443"]"#);
    let back: AllowList = serde_json::from_str(&json).unwrap();
    assert_eq!(back, l);
    let err = serde_json::from_str::<AllowList>(r#"["*.org:443"]"#).unwrap_err();
    assert!(err.to_string().contains("too broad"), "{err}");
    let too_many: Vec<String> = (1..=65).map(|p| format!("\"a.example.com:{p}\"")).collect();
    assert!(serde_json::from_str::<AllowList>(&format!("[{}]", too_many.join(","))).is_err());
}

// Strategies over a small world, so that covering and matching relations are common.

fn arb_label() -> impl Strategy<Value = String> {
    prop_oneof![Just("a"), Just("b"), Just("x-1")].prop_map(String::from)
}

fn arb_name() -> impl Strategy<Value = String> {
    (
        proptest::collection::vec(arb_label(), 0..3),
        prop_oneof![Just("ex.com"), Just("ex.org")],
    )
        .prop_map(|(labels, base)| {
            let mut parts = labels;
            parts.push(base.to_string());
            parts.join(".")
        })
}

fn arb_v4() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![
        (0u32..16).prop_map(|n| Ipv4Addr::from(0x0a00_0000 | n)),
        any::<u32>().prop_map(Ipv4Addr::from),
    ]
}

fn arb_v6() -> impl Strategy<Value = Ipv6Addr> {
    prop_oneof![
        (0u128..16).prop_map(|n| Ipv6Addr::from(0x2001_0db8_u128 << 96 | n)),
        any::<u128>().prop_map(Ipv6Addr::from),
    ]
}

fn arb_addr() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        3 => arb_v4().prop_map(IpAddr::V4),
        1 => arb_v6().prop_map(IpAddr::V6),
    ]
}

fn arb_pattern() -> impl Strategy<Value = HostPattern> {
    prop_oneof![
        arb_name().prop_map(HostPattern::Name),
        arb_name()
            .prop_filter("a wildcard needs two labels", |n| n.contains('.'))
            .prop_map(HostPattern::Wildcard),
        arb_addr().prop_map(|a| HostPattern::Addr(a.to_canonical())),
        (arb_v4(), 24u8..=32).prop_map(|(a, p)| {
            let a = IpAddr::V4(a);
            HostPattern::Cidr(network_of(a, p), p)
        }),
        (arb_v4(), 0u8..=32).prop_map(|(a, p)| {
            let a = IpAddr::V4(a);
            HostPattern::Cidr(network_of(a, p), p)
        }),
        (arb_v6(), 0u8..=128).prop_map(|(a, p)| {
            let a = IpAddr::V6(a);
            HostPattern::cidr(network_of(a, p), p)
        }),
    ]
}

fn arb_host() -> impl Strategy<Value = AllowHost> {
    (
        arb_pattern(),
        prop_oneof![3 => 1u16..=2, 1 => 1u16..=u16::MAX],
    )
        .prop_map(|(host, port)| AllowHost { host, port })
}

/// A probe of what an entry lets through: a name or an address, on a port.
#[derive(Debug, Clone)]
enum Probe {
    Name(String, u16),
    Addr(IpAddr, u16),
}

fn arb_probe() -> impl Strategy<Value = Probe> {
    prop_oneof![
        (arb_name(), 1u16..=2).prop_map(|(n, p)| Probe::Name(n, p)),
        (arb_addr(), 1u16..=2).prop_map(|(a, p)| Probe::Addr(a, p)),
    ]
}

fn lets_through(e: &AllowHost, probe: &Probe) -> bool {
    match probe {
        Probe::Name(n, p) => e.matches_name(n, *p),
        Probe::Addr(a, p) => e.matches_addr(*a, *p),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_entry_parses_back_from_its_text(e in arb_host()) {
        let text = e.to_string();
        let back: AllowHost = text.parse().map_err(|err| TestCaseError::fail(format!("{text}: {err}")))?;
        prop_assert_eq!(back, e);
    }

    #[test]
    fn covering_is_reflexive(e in arb_host()) {
        prop_assert!(e.covers(&e));
    }

    #[test]
    fn covering_is_transitive(a in arb_host(), b in arb_host(), c in arb_host()) {
        if a.covers(&b) && b.covers(&c) {
            prop_assert!(a.covers(&c), "{} covers {} covers {}", a, b, c);
        }
    }

    #[test]
    fn a_covered_entry_lets_through_nothing_its_parent_does_not(
        parent in arb_host(),
        child in arb_host(),
        probes in proptest::collection::vec(arb_probe(), 1..32),
    ) {
        if parent.covers(&child) {
            for probe in &probes {
                if lets_through(&child, probe) {
                    prop_assert!(lets_through(&parent, probe),
                        "{} covers {} but not {:?}", parent, child, probe);
                }
            }
        }
    }

    #[test]
    fn a_covered_child_entry_is_matched_by_its_own_names_and_addresses(child in arb_host()) {
        // Each name or address entry matches itself, so covering is never vacuous.
        match &child.host {
            HostPattern::Name(n) => prop_assert!(child.matches_name(n, child.port)),
            HostPattern::Addr(a) | HostPattern::Cidr(a, _) => {
                prop_assert!(child.matches_addr(*a, child.port))
            }
            HostPattern::Wildcard(s) => {
                let one_more = format!("z.{s}");
                prop_assert!(child.matches_name(&one_more, child.port))
            }
        }
    }

    #[test]
    fn a_covered_list_lets_through_nothing_its_parent_does_not(
        parent in proptest::collection::vec(arb_host(), 0..6),
        child in proptest::collection::vec(arb_host(), 0..6),
        probes in proptest::collection::vec(arb_probe(), 1..32),
    ) {
        let parent = AllowList::new(parent).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let child = AllowList::new(child).map_err(|e| TestCaseError::fail(e.to_string()))?;
        if parent.covers(&child).is_ok() {
            for probe in &probes {
                let (c, p) = match probe {
                    Probe::Name(n, port) => (child.allows_name(n, *port), parent.allows_name(n, *port)),
                    Probe::Addr(a, port) => (child.allows_addr(*a, *port), parent.allows_addr(*a, *port)),
                };
                prop_assert!(!c || p, "{:?}", probe);
            }
        }
    }

    #[test]
    fn arbitrary_text_never_panics_the_entry_parser(text in "\\PC{0,80}") {
        if let Ok(e) = text.parse::<AllowHost>() {
            let again: AllowHost = e.to_string().parse().map_err(|err: EgressError| TestCaseError::fail(err.to_string()))?;
            prop_assert_eq!(again, e);
        }
    }

    #[test]
    fn entry_like_text_never_panics_the_entry_parser(text in "[\\[\\]*./:0-9a-fA-F-]{0,48}") {
        if let Ok(e) = text.parse::<AllowHost>() {
            let again: AllowHost = e.to_string().parse().map_err(|err: EgressError| TestCaseError::fail(err.to_string()))?;
            prop_assert_eq!(again, e);
        }
    }
}

/// The host's own addresses are reached only through an entry naming the address: the
/// address itself or a network of that one address, never a wider network.
#[test]
fn an_address_is_named_by_itself_or_a_network_of_it_alone() {
    let l = list(&[
        "10.1.2.3/32:80",
        "10.9.0.0/16:80",
        "[2001:db8::1/128]:443",
        "192.0.2.7:443",
    ]);
    assert!(l.names_addr(ip("10.1.2.3"), 80));
    assert!(l.names_addr(ip("::ffff:10.1.2.3"), 80));
    assert!(!l.names_addr(ip("10.1.2.3"), 443));
    assert!(!l.names_addr(ip("10.9.0.5"), 80));
    assert!(l.names_addr(ip("2001:db8::1"), 443));
    assert!(l.names_addr(ip("192.0.2.7"), 443));
    assert!(!l.names_addr(ip("192.0.2.8"), 443));
}
