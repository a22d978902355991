//! Allowlist entries from arbitrary text: never a panic; whatever parses prints back to
//! text that parses to the same entry, which covers itself.
#![no_main]

use hatchery::egress::AllowHost;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(entry) = text.parse::<AllowHost>() else {
        return;
    };
    let printed = entry.to_string();
    match printed.parse::<AllowHost>() {
        Ok(again) => assert_eq!(again, entry),
        Err(e) => panic!("a parsed entry does not print: {e}\n{printed}"),
    }
    assert!(entry.covers(&entry));
});
