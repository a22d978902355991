//! The egress DNS stub on arbitrary datagrams and TCP streams: never a panic, never a
//! reply over 512 bytes, and a pool address only for an allowed name.
#![no_main]

use hatchery::egress::{AllowList, FakePool, dns};
use libfuzzer_sys::fuzz_target;

fn allowlist() -> AllowList {
    let entries = ["api.example.com:443", "*.pypi.org:443", "198.51.100.7:80"]
        .iter()
        .filter_map(|e| e.parse().ok())
        .collect();
    match AllowList::new(entries) {
        Ok(list) => list,
        Err(e) => panic!("the fuzz allowlist does not build: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let allow = allowlist();
    let mut pool = FakePool::new();
    let (reply, outcome) = dns::answer(data, &allow, &mut pool);
    if let Some(reply) = reply {
        assert!(reply.len() <= dns::MAX_REPLY, "{} bytes", reply.len());
    }
    if outcome.answered.is_some() {
        let name = outcome.name.as_deref().unwrap_or_default();
        assert!(allow.knows_name(name), "answered {name:?}");
    }
    let mut rest = data;
    while let Some((message, used)) = dns::tcp_message(rest) {
        let _ = dns::answer(message, &allow, &mut pool);
        rest = rest.get(used..).unwrap_or_default();
    }
});
