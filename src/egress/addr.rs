//! Addresses a name is never allowed to lead to: everything that is not a public unicast
//! address on the internet. A public name resolving to one of these is the DNS-rebinding
//! path to the host's loopback services, the local network or a cloud metadata endpoint,
//! so the broker drops such addresses unless an allowlist entry names them itself.
//!
//! The documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24,
//! 2001:db8::/32) are deliberately not special: they route nowhere, and tests use them as
//! "the internet".

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::allow::cidr_contains;

/// Why `addr` is not a public address, or `None` when it is one.
///
/// IPv4-mapped (`::ffff:a.b.c.d`), NAT64 (`64:ff9b::/96`) and 6to4 (`2002::/16`) addresses
/// are judged by the IPv4 address they carry, so `::ffff:10.0.0.1` is private.
pub fn special_range(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

/// IPv4 ranges, most specific first (0.0.0.0 before 0.0.0.0/8, the broadcast address
/// before 240.0.0.0/4).
const V4_RANGES: &[([u8; 4], u8, &str)] = &[
    ([0, 0, 0, 0], 32, "unspecified"),
    ([0, 0, 0, 0], 8, "this network"),
    ([10, 0, 0, 0], 8, "private (RFC 1918)"),
    ([172, 16, 0, 0], 12, "private (RFC 1918)"),
    ([192, 168, 0, 0], 16, "private (RFC 1918)"),
    ([100, 64, 0, 0], 10, "CGNAT (100.64.0.0/10)"),
    ([127, 0, 0, 0], 8, "loopback"),
    ([169, 254, 0, 0], 16, "link-local"),
    // IETF protocol assignments (DS-Lite, NAT64 discovery) and benchmarking networks:
    // never on the public internet.
    ([192, 0, 0, 0], 24, "reserved"),
    ([198, 18, 0, 0], 15, "reserved"),
    ([224, 0, 0, 0], 4, "multicast"),
    ([255, 255, 255, 255], 32, "broadcast"),
    ([240, 0, 0, 0], 4, "reserved"),
];

fn special_v4(addr: Ipv4Addr) -> Option<&'static str> {
    V4_RANGES
        .iter()
        .find(|(net, prefix, _)| {
            cidr_contains(IpAddr::V4(Ipv4Addr::from(*net)), *prefix, IpAddr::V4(addr))
        })
        .map(|(_, _, why)| *why)
}

/// IPv6 ranges that carry no IPv4 address, most specific first.
const V6_RANGES: &[(u128, u8, &str)] = &[
    (0, 128, "unspecified"),
    (1, 128, "loopback"),
    // Deprecated IPv4-compatible addresses (::a.b.c.d): nothing routes them.
    (0, 96, "reserved"),
    // Discard-only (RFC 6666).
    (0x0100_0000_0000_0000_0000_0000_0000_0000, 64, "reserved"),
    // Local-use NAT64 (RFC 8215): the embedded IPv4 cannot be read reliably.
    (0x0064_ff9b_0001_0000_0000_0000_0000_0000, 48, "reserved"),
    (0xfe80_0000_0000_0000_0000_0000_0000_0000, 10, "link-local"),
    // Deprecated site-local.
    (0xfec0_0000_0000_0000_0000_0000_0000_0000, 10, "reserved"),
    (
        0xfc00_0000_0000_0000_0000_0000_0000_0000,
        7,
        "unique local (fc00::/7)",
    ),
    (0xff00_0000_0000_0000_0000_0000_0000_0000, 8, "multicast"),
];

const NAT64: u128 = 0x0064_ff9b_0000_0000_0000_0000_0000_0000;
const SIX_TO_FOUR: u128 = 0x2002_0000_0000_0000_0000_0000_0000_0000;

fn special_v6(addr: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = addr.to_ipv4_mapped() {
        return special_v4(v4);
    }
    let bits = u128::from(addr);
    let within = |net: u128, prefix: u8| {
        cidr_contains(IpAddr::V6(Ipv6Addr::from(net)), prefix, IpAddr::V6(addr))
    };
    if within(NAT64, 96) {
        // The low 32 bits are the IPv4 address.
        return special_v4(Ipv4Addr::from(low_u32(bits)));
    }
    if within(SIX_TO_FOUR, 16) {
        // 2002:AABB:CCDD::/48 carries AA.BB.CC.DD in bits 16..48.
        return special_v4(Ipv4Addr::from(low_u32(bits.checked_shr(80).unwrap_or(0))));
    }
    V6_RANGES
        .iter()
        .find(|(net, prefix, _)| within(*net, *prefix))
        .map(|(_, _, why)| *why)
}

/// The low 32 bits of `bits`.
fn low_u32(bits: u128) -> u32 {
    u32::try_from(bits & u128::from(u32::MAX)).unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn why(text: &str) -> Option<&'static str> {
        special_range(text.parse().unwrap())
    }

    #[test]
    fn each_ipv4_range_is_named_with_its_edges() {
        let cases = [
            ("0.0.0.0", Some("unspecified")),
            ("0.0.0.1", Some("this network")),
            ("0.255.255.255", Some("this network")),
            ("1.0.0.0", None),
            ("9.255.255.255", None),
            ("10.0.0.0", Some("private (RFC 1918)")),
            ("10.255.255.255", Some("private (RFC 1918)")),
            ("11.0.0.0", None),
            ("172.15.255.255", None),
            ("172.16.0.0", Some("private (RFC 1918)")),
            ("172.31.255.255", Some("private (RFC 1918)")),
            ("172.32.0.0", None),
            ("192.167.255.255", None),
            ("192.168.0.0", Some("private (RFC 1918)")),
            ("192.168.255.255", Some("private (RFC 1918)")),
            ("192.169.0.0", None),
            ("100.63.255.255", None),
            ("100.64.0.0", Some("CGNAT (100.64.0.0/10)")),
            ("100.127.255.255", Some("CGNAT (100.64.0.0/10)")),
            ("100.128.0.0", None),
            ("126.255.255.255", None),
            ("127.0.0.1", Some("loopback")),
            ("127.255.255.255", Some("loopback")),
            ("128.0.0.0", None),
            ("169.253.255.255", None),
            ("169.254.0.0", Some("link-local")),
            ("169.254.169.254", Some("link-local")),
            ("169.255.0.0", None),
            ("192.0.0.170", Some("reserved")),
            ("198.17.255.255", None),
            ("198.18.0.0", Some("reserved")),
            ("198.19.255.255", Some("reserved")),
            ("198.20.0.0", None),
            ("223.255.255.255", None),
            ("224.0.0.0", Some("multicast")),
            ("239.255.255.255", Some("multicast")),
            ("240.0.0.0", Some("reserved")),
            ("255.255.255.254", Some("reserved")),
            ("255.255.255.255", Some("broadcast")),
            ("8.8.8.8", None),
        ];
        for (addr, expected) in cases {
            assert_eq!(why(addr), expected, "{addr}");
        }
    }

    #[test]
    fn documentation_ranges_count_as_public() {
        for addr in [
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.255",
            "2001:db8::1",
            "2001:db8:ffff::1",
        ] {
            assert_eq!(why(addr), None, "{addr}");
        }
    }

    #[test]
    fn each_ipv6_range_is_named_with_its_edges() {
        let cases = [
            ("::", Some("unspecified")),
            ("::1", Some("loopback")),
            ("::2", Some("reserved")),
            ("::a00:1", Some("reserved")),
            ("100::1", Some("reserved")),
            ("fe80::1", Some("link-local")),
            ("febf:ffff::1", Some("link-local")),
            ("fec0::1", Some("reserved")),
            ("fc00::1", Some("unique local (fc00::/7)")),
            ("fdff:ffff::1", Some("unique local (fc00::/7)")),
            ("fbff:ffff::1", None),
            ("ff02::1", Some("multicast")),
            ("2606:4700::1111", None),
            ("64:ff9b:1::1", Some("reserved")),
        ];
        for (addr, expected) in cases {
            assert_eq!(why(addr), expected, "{addr}");
        }
    }

    #[test]
    fn an_address_carrying_ipv4_is_judged_by_that_ipv4_address() {
        let cases = [
            ("::ffff:10.0.0.1", Some("private (RFC 1918)")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("::ffff:169.254.169.254", Some("link-local")),
            ("::ffff:198.51.100.7", None),
            ("64:ff9b::10.0.0.1", Some("private (RFC 1918)")),
            ("64:ff9b::127.0.0.1", Some("loopback")),
            ("64:ff9b::8.8.8.8", None),
            ("2002:a00:1::1", Some("private (RFC 1918)")),
            ("2002:7f00:1::", Some("loopback")),
            ("2002:808:808::1", None),
        ];
        for (addr, expected) in cases {
            assert_eq!(why(addr), expected, "{addr}");
        }
    }
}
