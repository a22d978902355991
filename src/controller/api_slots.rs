//! How many API connections the controller holds open at once, per peer uid and in all.
//!
//! Each connection is a descriptor, and the controller needs descriptors for its workers,
//! their logs and its audit trail: a peer that opened connections without end (each
//! sending nothing) ran the controller out of descriptors, its next audit write failed, and
//! that engaged the kill switch. The controller's own user and root each have their slots
//! apart from everyone else's, so that members of `--socket-group` (who may look, not
//! act) cannot take the connections the operator needs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::pace::TokenBucket;

/// Connections one uid may hold open at once (at most).
pub const PER_UID: usize = 64;
/// Connections all uids but root and the controller's own may hold open at once (at most).
pub const OTHERS: usize = 512;

/// Requests a uid other than root and the controller's own may make at once, and then each
/// second: one connection a request (as the CLI makes them) or many on one, a peer that
/// asks without pause (`logs` of a large log, again and again) waits its turn instead of
/// taking the controller's processor.
pub const REQUEST_BURST: f64 = 100.0;
pub const REQUEST_RATE: f64 = 50.0;
/// Buckets kept for uids with no connection open, at most (full ones are forgotten first).
const MAX_BUCKETS: usize = 1024;

/// The open API connections, by uid.
#[derive(Clone)]
pub struct ApiSlots {
    open: Arc<Mutex<Counts>>,
    owner_uid: u32,
    per_uid: usize,
    others: usize,
}

#[derive(Default)]
struct Counts {
    by_uid: HashMap<u32, usize>,
    others: usize,
    /// Each uid's requests: what it may still ask, or owes.
    requests: HashMap<u32, TokenBucket>,
}

/// One open connection's slot, given back when dropped.
pub struct Slot {
    slots: ApiSlots,
    uid: u32,
}

impl Slot {
    /// How long this connection's next request waits, to keep its uid within
    /// [`REQUEST_RATE`] (no wait for root and the controller's own uid).
    pub fn pace(&self) -> Duration {
        if self.slots.privileged(self.uid) {
            return Duration::ZERO;
        }
        let mut open = self.slots.open.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if open.requests.len() >= MAX_BUCKETS && !open.requests.contains_key(&self.uid) {
            open.requests.retain(|_, bucket| !bucket.is_full(now));
        }
        // At most a burst's worth queued: a peer cannot book the controller for hours.
        open.requests
            .entry(self.uid)
            .or_insert_with(|| TokenBucket::new(REQUEST_BURST, REQUEST_RATE))
            .take_owing(now, REQUEST_BURST)
    }
}

/// Why a connection was turned away (with the limit it met).
#[derive(Debug, PartialEq, Eq)]
pub enum Full {
    Uid(usize),
    Others(usize),
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Full::Uid(n) => write!(
                f,
                "this uid holds {n} connections to the controller already: close one first"
            ),
            Full::Others(n) => write!(
                f,
                "other users hold {n} connections to the controller already: try again later"
            ),
        }
    }
}

impl ApiSlots {
    /// Slots within [`PER_UID`] and [`OTHERS`], and within what this process's descriptor
    /// limit leaves for workers, logs and the trail: all connections together take at
    /// most a quarter of it (under the usual 1,024: 32 per uid, 128 for the others).
    pub fn new(owner_uid: u32) -> ApiSlots {
        let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .unwrap_or((1024, 1024));
        let soft = usize::try_from(soft).unwrap_or(usize::MAX);
        ApiSlots::with_limits(
            owner_uid,
            PER_UID.min(soft / 32).max(1),
            OTHERS.min(soft / 8).max(1),
        )
    }

    fn with_limits(owner_uid: u32, per_uid: usize, others: usize) -> ApiSlots {
        ApiSlots {
            open: Arc::new(Mutex::new(Counts::default())),
            owner_uid,
            per_uid,
            others,
        }
    }

    fn privileged(&self, uid: u32) -> bool {
        uid == 0 || uid == self.owner_uid
    }

    /// A slot for a new connection of `uid`, if it may have one more.
    pub fn take(&self, uid: u32) -> Result<Slot, Full> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let mine = open.by_uid.get(&uid).copied().unwrap_or(0);
        if mine >= self.per_uid {
            return Err(Full::Uid(self.per_uid));
        }
        if !self.privileged(uid) {
            if open.others >= self.others {
                return Err(Full::Others(self.others));
            }
            open.others = open.others.saturating_add(1);
        }
        open.by_uid.insert(uid, mine.saturating_add(1));
        Ok(Slot {
            slots: self.clone(),
            uid,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|p| p.into_inner());
        if !self.slots.privileged(self.uid) {
            open.others = open.others.saturating_sub(1);
        }
        let left = open
            .by_uid
            .get(&self.uid)
            .copied()
            .unwrap_or(0)
            .saturating_sub(1);
        if left == 0 {
            open.by_uid.remove(&self.uid);
        } else {
            open.by_uid.insert(self.uid, left);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_asking_without_pause_waits_its_turn_and_the_operator_never_does() {
        let slots = ApiSlots::with_limits(1000, PER_UID, OTHERS);
        let mut theirs = Vec::new();
        for _ in 0..3 {
            theirs.extend(slots.take(2000).ok());
        }
        let waits: Vec<Duration> = (0..300)
            .filter_map(|i| theirs.get(i % 3).map(Slot::pace))
            .collect();
        let free = waits.iter().filter(|w| w.is_zero()).count();
        // A burst (and what refills while the loop runs), then waits.
        assert!((100..=102).contains(&free), "{free}");
        let longest = waits.iter().max().copied().unwrap_or_default();
        assert!(longest <= Duration::from_secs_f64(REQUEST_BURST / REQUEST_RATE + 0.1));
        assert!(longest >= Duration::from_secs_f64(1.5), "{longest:?}");
        let mine = slots.take(1000).ok();
        assert_eq!(mine.map(|s| s.pace()), Some(Duration::ZERO));
    }

    #[test]
    fn the_slots_fit_the_descriptor_limit() {
        let slots = ApiSlots::new(1000);
        let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .unwrap_or((1024, 1024));
        let total = slots.others + 2 * slots.per_uid;
        assert!(total as u64 <= soft / 4 + 2, "{total} of {soft}");
    }

    #[test]
    fn a_uid_holds_at_most_its_share_and_gets_it_back_as_connections_close() {
        let slots = ApiSlots::with_limits(1000, PER_UID, OTHERS);
        let held: Vec<Slot> = (0..PER_UID).filter_map(|_| slots.take(2000).ok()).collect();
        assert_eq!(held.len(), PER_UID);
        assert_eq!(slots.take(2000).err(), Some(Full::Uid(PER_UID)));
        // The operator and root are not crowded out.
        assert!(slots.take(1000).is_ok());
        assert!(slots.take(0).is_ok());
        drop(held);
        assert!(slots.take(2000).is_ok());
    }

    #[test]
    fn other_users_together_hold_at_most_their_share_and_never_the_operators() {
        let slots = ApiSlots::with_limits(1000, PER_UID, OTHERS);
        let held: Vec<Slot> = (0..OTHERS as u32)
            .filter_map(|i| slots.take(5000 + i / PER_UID as u32).ok())
            .collect();
        assert_eq!(held.len(), OTHERS);
        assert_eq!(slots.take(9999).err(), Some(Full::Others(OTHERS)));
        let mine: Vec<Slot> = (0..PER_UID).filter_map(|_| slots.take(1000).ok()).collect();
        assert_eq!(mine.len(), PER_UID, "the operator's share is apart");
        drop(held);
        assert!(slots.take(9999).is_ok());
    }
}
