//! The controller: issues signed manifests, launches workers through a single-threaded
//! launcher, enforces the replication contract, and records every decision.

pub mod launcher;
pub mod wire;
