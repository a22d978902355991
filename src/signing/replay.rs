//! The memory of nonces already accepted, so that a manifest is accepted once.
//!
//! Each accepted nonce is kept until its manifest expires; after that the manifest is
//! refused as expired anyway, so the nonce can be forgotten. That only holds if time never
//! runs backwards for the memory, so it keeps the latest `now` it was given and uses it
//! whenever a caller passes an earlier one: a clock stepped back cannot revive a forgotten
//! nonce.
//!
//! The memory holds at most `capacity` nonces. When it is full of nonces that have not
//! expired yet, a new manifest is refused ([`ReplayError::Full`]) rather than one being
//! forgotten early: forgetting a live nonce is exactly the replay this exists to stop.
//! Only manifests whose signature checked out get here, so filling the memory takes the
//! controller's own signatures, not an attacker's garbage.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::manifest::Nonce;

/// Default capacity: at 24 bytes a nonce (twice), a few MiB at most.
pub const DEFAULT_NONCE_CAPACITY: usize = 1 << 16;
/// Entries allocated up front, so the first verifications do not pay for regrowth.
const PREALLOCATED: usize = 1 << 12;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayError {
    /// The nonce was accepted before.
    Seen,
    /// The memory is full of live nonces.
    Full { capacity: usize },
}

#[derive(Debug, Clone)]
pub struct NonceMemory {
    capacity: usize,
    /// nonce → the `expires_at` of the manifest that carried it.
    seen: HashMap<Nonce, u64>,
    /// The same entries, soonest expiry on top, to forget the expired ones cheaply.
    /// Entries only ever leave by expiring, so a heap is all the order needed.
    by_expiry: BinaryHeap<Reverse<(u64, Nonce)>>,
    /// The latest time this memory was told about.
    high_water: u64,
}

impl NonceMemory {
    pub fn new(capacity: usize) -> NonceMemory {
        NonceMemory {
            capacity,
            seen: HashMap::with_capacity(capacity.min(PREALLOCATED)),
            by_expiry: BinaryHeap::with_capacity(capacity.min(PREALLOCATED)),
            high_water: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Moves the memory's clock to `now` unless it is already later, forgets the nonces
    /// that have expired by then, and returns the memory's time (never earlier than any
    /// time given before).
    pub fn advance(&mut self, now: u64) -> u64 {
        self.high_water = self.high_water.max(now);
        while let Some(&Reverse((expires_at, nonce))) = self.by_expiry.peek() {
            if expires_at > self.high_water {
                break;
            }
            self.by_expiry.pop();
            self.seen.remove(&nonce);
        }
        self.high_water
    }

    /// Whether `nonce` is remembered.
    pub fn contains(&self, nonce: &Nonce) -> bool {
        self.seen.contains_key(nonce)
    }

    /// Records `nonce` (valid until `expires_at`), or says why it cannot be accepted.
    /// Call [`advance`](NonceMemory::advance) first so that expired nonces make room.
    pub fn insert(&mut self, nonce: Nonce, expires_at: u64) -> Result<(), ReplayError> {
        if self.seen.contains_key(&nonce) {
            return Err(ReplayError::Seen);
        }
        if self.seen.len() >= self.capacity {
            return Err(ReplayError::Full {
                capacity: self.capacity,
            });
        }
        self.seen.insert(nonce, expires_at);
        self.by_expiry.push(Reverse((expires_at, nonce)));
        Ok(())
    }
}

impl Default for NonceMemory {
    fn default() -> Self {
        NonceMemory::new(DEFAULT_NONCE_CAPACITY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: u8) -> Nonce {
        Nonce::from_bytes([i; 16])
    }

    #[test]
    fn a_nonce_is_accepted_once() {
        let mut m = NonceMemory::new(4);
        m.advance(10);
        assert_eq!(m.insert(n(1), 20), Ok(()));
        assert_eq!(m.insert(n(1), 20), Err(ReplayError::Seen));
    }

    #[test]
    fn expired_nonces_are_forgotten() {
        let mut m = NonceMemory::new(4);
        m.advance(10);
        assert_eq!(m.insert(n(1), 20), Ok(()));
        assert_eq!(m.insert(n(2), 30), Ok(()));
        m.advance(20);
        assert!(!m.contains(&n(1)), "expired at 20");
        assert!(m.contains(&n(2)));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn a_full_memory_refuses_instead_of_forgetting_live_nonces() {
        let mut m = NonceMemory::new(2);
        m.advance(0);
        assert_eq!(m.insert(n(1), 100), Ok(()));
        assert_eq!(m.insert(n(2), 100), Ok(()));
        assert_eq!(m.insert(n(3), 100), Err(ReplayError::Full { capacity: 2 }));
        assert!(m.contains(&n(1)) && m.contains(&n(2)));
        m.advance(100);
        assert_eq!(m.insert(n(3), 200), Ok(()), "room once the others expired");
    }

    #[test]
    fn the_clock_never_runs_backwards() {
        let mut m = NonceMemory::new(4);
        assert_eq!(m.advance(50), 50);
        assert_eq!(m.advance(10), 50);
        assert_eq!(m.advance(60), 60);
    }
}
