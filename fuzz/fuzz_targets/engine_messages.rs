//! The controller's engine fed hostile sequences of worker frames, registrations, launcher
//! events and API requests (see `hatchery::controller::fuzz`): never a panic.
#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};

use hatchery::controller::fuzz::EngineHarness;
use libfuzzer_sys::fuzz_target;

static RUN: AtomicU64 = AtomicU64::new(0);

fuzz_target!(|data: &[u8]| {
    let n = RUN.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hatchery-fuzz-engine-{}-{n}", std::process::id()));
    if std::fs::create_dir(&dir).is_err() {
        return;
    }
    match EngineHarness::new(&dir) {
        Ok(mut h) => {
            h.feed(data);
            drop(h);
        }
        Err(e) => panic!("the harness could not start: {e}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
});
