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

/// Connections one uid may hold open at once.
pub const PER_UID: usize = 64;
/// Connections all uids but root and the controller's own may hold open at once.
pub const OTHERS: usize = 512;

/// The open API connections, by uid.
#[derive(Clone)]
pub struct ApiSlots {
    open: Arc<Mutex<Counts>>,
    owner_uid: u32,
}

#[derive(Default)]
struct Counts {
    by_uid: HashMap<u32, usize>,
    others: usize,
}

/// One open connection's slot, given back when dropped.
pub struct Slot {
    slots: ApiSlots,
    uid: u32,
}

/// Why a connection was turned away.
#[derive(Debug, PartialEq, Eq)]
pub enum Full {
    Uid,
    Others,
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Full::Uid => write!(
                f,
                "this uid holds {PER_UID} connections to the controller already: close one first"
            ),
            Full::Others => write!(
                f,
                "other users hold {OTHERS} connections to the controller already: try again later"
            ),
        }
    }
}

impl ApiSlots {
    pub fn new(owner_uid: u32) -> ApiSlots {
        ApiSlots {
            open: Arc::new(Mutex::new(Counts::default())),
            owner_uid,
        }
    }

    fn privileged(&self, uid: u32) -> bool {
        uid == 0 || uid == self.owner_uid
    }

    /// A slot for a new connection of `uid`, if it may have one more.
    pub fn take(&self, uid: u32) -> Result<Slot, Full> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let mine = open.by_uid.get(&uid).copied().unwrap_or(0);
        if mine >= PER_UID {
            return Err(Full::Uid);
        }
        if !self.privileged(uid) {
            if open.others >= OTHERS {
                return Err(Full::Others);
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
    fn a_uid_holds_at_most_its_share_and_gets_it_back_as_connections_close() {
        let slots = ApiSlots::new(1000);
        let held: Vec<Slot> = (0..PER_UID).filter_map(|_| slots.take(2000).ok()).collect();
        assert_eq!(held.len(), PER_UID);
        assert_eq!(slots.take(2000).err(), Some(Full::Uid));
        // The operator and root are not crowded out.
        assert!(slots.take(1000).is_ok());
        assert!(slots.take(0).is_ok());
        drop(held);
        assert!(slots.take(2000).is_ok());
    }

    #[test]
    fn other_users_together_hold_at_most_their_share_and_never_the_operators() {
        let slots = ApiSlots::new(1000);
        let held: Vec<Slot> = (0..OTHERS as u32)
            .filter_map(|i| slots.take(5000 + i / PER_UID as u32).ok())
            .collect();
        assert_eq!(held.len(), OTHERS);
        assert_eq!(slots.take(9999).err(), Some(Full::Others));
        let mine: Vec<Slot> = (0..PER_UID).filter_map(|_| slots.take(1000).ok()).collect();
        assert_eq!(mine.len(), PER_UID, "the operator's share is apart");
        drop(held);
        assert!(slots.take(9999).is_ok());
    }
}
