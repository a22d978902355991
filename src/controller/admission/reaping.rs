//! Who must go: the periodic decisions over live workers, from what the registry knows of
//! each and the time. The engine records and carries them out.

use crate::manifest::Manifest;

/// Where a live worker is in its life, as far as reaping cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Launched, not yet registered.
    Starting,
    Registered,
    /// Already being ended.
    Stopping,
}

/// What the registry knows of a live worker that reaping reads.
#[derive(Debug, Clone, Copy)]
pub struct Vitals<'a> {
    pub manifest: &'a Manifest,
    pub phase: Phase,
    /// It has no controller socket to speak on (its manifest withholds it).
    pub unsupervised: bool,
    /// It waits for a person's decision on its replication.
    pub awaiting_approval: bool,
    pub started_at_ms: u64,
    pub last_heartbeat_ms: Option<u64>,
}

/// How long a worker may stay silent.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    pub heartbeat_timeout_ms: u64,
    pub register_timeout_ms: u64,
}

/// Why a worker is ended by the periodic check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reap {
    /// Its manifest's lifetime is over.
    Expired,
    /// Registered, and silent for longer than the heartbeat timeout.
    MissedHeartbeats,
    /// Launched, and not registered within the registration timeout.
    NeverRegistered,
}

impl Reap {
    /// What the audit trail says of a stale worker.
    pub fn why(self) -> &'static str {
        match self {
            Reap::Expired => "manifest expired",
            Reap::MissedHeartbeats => "missed heartbeats",
            Reap::NeverRegistered => "never registered",
        }
    }
}

/// Whether a live worker must be ended at `now_ms`, and why. Expiry applies to every
/// worker; silence only to workers that can speak and are not waiting for a person.
pub fn reap_due(w: &Vitals<'_>, patience: Patience, now_ms: u64) -> Option<Reap> {
    if w.phase == Phase::Stopping {
        return None;
    }
    if w.manifest.is_expired(now_ms / 1000) {
        return Some(Reap::Expired);
    }
    if w.unsupervised || w.awaiting_approval {
        return None;
    }
    match w.phase {
        Phase::Registered
            if w.last_heartbeat_ms
                .is_some_and(|t| now_ms.saturating_sub(t) > patience.heartbeat_timeout_ms) =>
        {
            Some(Reap::MissedHeartbeats)
        }
        Phase::Starting
            if now_ms.saturating_sub(w.started_at_ms) > patience.register_timeout_ms =>
        {
            Some(Reap::NeverRegistered)
        }
        _ => None,
    }
}

/// Whether a worker started at `started_at_ms` has outlived its manifest's timeout by more
/// than `grace_ms` (the launcher enforces the timeout; past the grace, the controller does).
pub fn past_timeout(manifest: &Manifest, started_at_ms: u64, grace_ms: u64, now_ms: u64) -> bool {
    let limit = manifest.resources.timeout_ms.get().saturating_add(grace_ms);
    now_ms.saturating_sub(started_at_ms) > limit
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::tests::{T0, sample_manifest};

    const PATIENCE: Patience = Patience {
        heartbeat_timeout_ms: 10_000,
        register_timeout_ms: 5_000,
    };

    fn vitals(m: &Manifest, phase: Phase) -> Vitals<'_> {
        Vitals {
            manifest: m,
            phase,
            unsupervised: false,
            awaiting_approval: false,
            started_at_ms: T0 * 1000,
            last_heartbeat_ms: Some(T0 * 1000),
        }
    }

    #[test]
    fn a_registered_worker_is_reaped_only_after_the_heartbeat_timeout() {
        let m = sample_manifest();
        let w = vitals(&m, Phase::Registered);
        assert_eq!(reap_due(&w, PATIENCE, T0 * 1000 + 10_000), None);
        assert_eq!(
            reap_due(&w, PATIENCE, T0 * 1000 + 10_001),
            Some(Reap::MissedHeartbeats)
        );
    }

    #[test]
    fn a_worker_that_never_registers_is_reaped_after_the_registration_timeout() {
        let m = sample_manifest();
        let w = vitals(&m, Phase::Starting);
        assert_eq!(reap_due(&w, PATIENCE, T0 * 1000 + 5_000), None);
        assert_eq!(
            reap_due(&w, PATIENCE, T0 * 1000 + 5_001),
            Some(Reap::NeverRegistered)
        );
    }

    #[test]
    fn silence_is_forgiven_while_waiting_for_a_person_or_without_a_socket_but_expiry_is_not() {
        let m = sample_manifest();
        let late = T0 * 1000 + 60_000;
        let waiting = Vitals {
            awaiting_approval: true,
            ..vitals(&m, Phase::Registered)
        };
        let mute = Vitals {
            unsupervised: true,
            ..vitals(&m, Phase::Starting)
        };
        assert_eq!(reap_due(&waiting, PATIENCE, late), None);
        assert_eq!(reap_due(&mute, PATIENCE, late), None);
        let expired = m.expires_at.get() * 1000;
        assert_eq!(reap_due(&waiting, PATIENCE, expired), Some(Reap::Expired));
        assert_eq!(reap_due(&mute, PATIENCE, expired), Some(Reap::Expired));
    }

    #[test]
    fn a_worker_being_stopped_is_not_reaped_again() {
        let m = sample_manifest();
        let w = vitals(&m, Phase::Stopping);
        assert_eq!(reap_due(&w, PATIENCE, m.expires_at.get() * 1000), None);
    }

    #[test]
    fn the_controller_enforces_a_timeout_only_past_the_grace() {
        let m = sample_manifest(); // a 30 s timeout
        let start = T0 * 1000;
        assert!(!past_timeout(&m, start, 2_000, start + 32_000));
        assert!(past_timeout(&m, start, 2_000, start + 32_001));
    }
}
