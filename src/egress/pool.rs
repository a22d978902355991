//! Fake addresses for allowed names. The DNS stub answers every allowed name with an
//! address of 127.1.0.0/16 instead of its real one, so no lookup ever leaves the sandbox;
//! when a connection to that address arrives, the broker reads the name back from the pool
//! and decides by name.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

/// The pool's network, 127.1.0.0/16: inside loopback, so the sandbox's `lo` delivers it
/// to the transparent listeners without a route.
const NETWORK: u32 = 0x7f01_0000;
/// The first and last addresses handed out (the /16's network and broadcast addresses are
/// skipped).
const FIRST: u16 = 1;
const LAST: u16 = 0xfffe;

/// The most the names of one pool may take together. A sandbox picks the names it asks
/// for (up to 253 bytes each, under a wildcard or `allow_external`), and each is kept for
/// the broker's life: 65,534 long names took 40 MB of the broker's memory, which no
/// cgroup of the sandbox's counts. Past this, new names are refused as a full pool's are.
const MAX_NAME_BYTES: usize = 2 << 20;

/// Name to address and back, one sandbox's worth. Names keep their address for the
/// pool's life, so a client's cached answer stays valid.
#[derive(Debug, Default, Clone)]
pub struct FakePool {
    by_name: HashMap<String, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, String>,
    /// What the names take together.
    name_bytes: usize,
}

impl FakePool {
    /// Most names a pool holds.
    pub const CAPACITY: usize = LAST as usize; // FIRST is 1

    pub fn new() -> Self {
        Self::default()
    }

    /// The address of `name` (lowercased, one trailing dot dropped): the one it already
    /// has, or the next free one; `None` when the pool is full (of addresses, or of
    /// [`MAX_NAME_BYTES`]).
    pub fn assign(&mut self, name: &str) -> Option<Ipv4Addr> {
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        if let Some(addr) = self.by_name.get(&name) {
            return Some(*addr);
        }
        // Addresses are handed out in order and never taken back, so the next one is
        // FIRST + len; the count is bounded by CAPACITY.
        let offset = u16::try_from(self.by_name.len()).ok()?.checked_add(FIRST)?;
        let name_bytes = self.name_bytes.checked_add(name.len())?;
        if offset > LAST || name_bytes > MAX_NAME_BYTES {
            return None;
        }
        self.name_bytes = name_bytes;
        let addr = Ipv4Addr::from(NETWORK | u32::from(offset));
        self.by_name.insert(name.clone(), addr);
        self.by_addr.insert(addr, name);
        Some(addr)
    }

    /// The name `addr` was handed out for (IPv4-mapped IPv6 accepted).
    pub fn name_of(&self, addr: IpAddr) -> Option<&str> {
        match addr.to_canonical() {
            IpAddr::V4(v4) => self.by_addr.get(&v4).map(String::as_str),
            IpAddr::V6(_) => None,
        }
    }

    /// True when `addr` is in 127.1.0.0/16, handed out or not: such an address is never
    /// connected to as itself.
    pub fn in_pool(addr: IpAddr) -> bool {
        match addr.to_canonical() {
            IpAddr::V4(v4) => u32::from(v4) & 0xffff_0000 == NETWORK,
            IpAddr::V6(_) => false,
        }
    }

    /// How many names hold an address.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_same_name_keeps_its_address_whatever_its_case() {
        let mut pool = FakePool::new();
        let a = pool.assign("api.example.com").unwrap();
        let b = pool.assign("files.example.com").unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.assign("API.Example.com.").unwrap(), a);
        assert_eq!(pool.len(), 2);
        assert_eq!(a, Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(pool.name_of(IpAddr::V4(a)), Some("api.example.com"));
        assert_eq!(pool.name_of(IpAddr::V4(b)), Some("files.example.com"));
        let mapped = IpAddr::V6(a.to_ipv6_mapped());
        assert_eq!(pool.name_of(mapped), Some("api.example.com"));
        assert_eq!(pool.name_of("127.1.0.3".parse().unwrap()), None);
    }

    #[test]
    fn a_full_pool_hands_out_nothing_more_but_keeps_what_it_gave() {
        let mut pool = FakePool::new();
        let mut last = None;
        for i in 0..FakePool::CAPACITY {
            last = pool.assign(&format!("h{i}.example.com"));
            assert!(last.is_some(), "{i}");
        }
        assert_eq!(last, Some(Ipv4Addr::new(127, 1, 255, 254)));
        assert_eq!(pool.len(), 65534);
        assert_eq!(pool.assign("one-more.example.com"), None);
        assert_eq!(
            pool.assign("h0.example.com"),
            Some(Ipv4Addr::new(127, 1, 0, 1))
        );
    }

    #[test]
    fn long_names_fill_the_pool_by_their_size_not_only_their_count() {
        let mut pool = FakePool::new();
        let long = |i: usize| format!("{i:0>240}.example.com");
        let mut given = 0usize;
        while pool.assign(&long(given)).is_some() {
            given += 1;
        }
        assert!(given < 10_000, "{given} names of 252 bytes kept");
        assert!(given * 252 <= MAX_NAME_BYTES, "{given}");
        // What it gave is kept; a short name may still fit, a name it knows always does.
        assert!(pool.assign(&long(0)).is_some());
        assert!(pool.name_bytes <= MAX_NAME_BYTES);
    }

    #[test]
    fn the_pool_is_the_whole_127_1_slash_16_and_nothing_else() {
        for (addr, inside) in [
            ("127.1.0.0", true),
            ("127.1.0.1", true),
            ("127.1.255.255", true),
            ("::ffff:127.1.2.3", true),
            ("127.0.255.255", false),
            ("127.2.0.0", false),
            ("10.1.0.1", false),
            ("::1", false),
        ] {
            assert_eq!(FakePool::in_pool(addr.parse().unwrap()), inside, "{addr}");
        }
    }
}
