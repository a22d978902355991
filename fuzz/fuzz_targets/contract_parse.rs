//! Contract file parsing on arbitrary text: never a panic; whatever parses prints back to
//! a file that parses to the same contract.
#![no_main]

use hatchery::contract::ContractConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = ContractConfig::from_toml(text, "fuzz") else {
        return;
    };
    let printed = match config.to_toml() {
        Ok(p) => p,
        Err(e) => panic!("a parsed contract does not print: {e}"),
    };
    match ContractConfig::from_toml(&printed, "printed") {
        Ok(again) => assert_eq!(again, config),
        Err(e) => panic!("a printed contract does not parse: {e}\n{printed}"),
    }
    let _ = config.build();
});
