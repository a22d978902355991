//! The clock a node's fence deadline is kept on.

/// Milliseconds on CLOCK_BOOTTIME: the clock a node's fence deadline is kept on, shared
/// by the controller and its launcher, and running on through a suspend (etcd's clock
/// does not stop when this machine sleeps).
pub fn boottime_ms() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(t) => u64::try_from(t.tv_sec())
            .unwrap_or(0)
            .saturating_mul(1000)
            .saturating_add(u64::try_from(t.tv_nsec() / 1_000_000).unwrap_or(0)),
        Err(_) => 0,
    }
}
