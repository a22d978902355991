//! The egress ClientHello reader on arbitrary bytes: never a panic, and any server name it
//! returns is a canonical host name.
#![no_main]

use hatchery::egress::allow::canonical_name;
use hatchery::egress::tls::{self, ClientHello};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ClientHello::Sni(name)) = tls::client_hello(data) {
        assert_eq!(canonical_name(&name).as_deref(), Ok(name.as_str()));
    }
});
