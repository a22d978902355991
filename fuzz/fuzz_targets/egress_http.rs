//! The egress HTTP proxy's request reader on arbitrary bytes: never a panic; a forwarded
//! head is one complete head that consumed no more than was received, and a first request
//! accepted on a checked connection is made its last.
#![no_main]

use hatchery::egress::http::{self, ProxyRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(ProxyRequest::Forward { head, consumed, .. })) = http::proxy_request(data) {
        assert!(consumed <= data.len() && consumed <= http::MAX_HEAD);
        assert!(head.ends_with(b"\r\nConnection: close\r\n\r\n"));
    }
    if let Ok(Some(_)) = http::first_request_host(data, 80) {
        let closing = http::close_after_first(data).unwrap_or_default();
        let end = b"\r\nConnection: close\r\n\r\n";
        assert!(closing.windows(end.len()).any(|w| w == end));
    }
});
