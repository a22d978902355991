//! hatchery: a sandbox manager for self-replicating agent workers on Linux.
//!
//! The library is split by trust boundary: [`profile`] and [`units`] describe what a
//! sandbox may do, [`sandbox`] makes the kernel enforce it (the only place with `unsafe`
//! and raw syscalls), [`report`] tells what happened; the command-line edge lives in the
//! binary.

pub mod audit;
pub mod contract;
pub mod controller;
pub mod manifest;
pub mod paths;
pub mod profile;
pub mod report;
pub mod sandbox;
pub mod signing;
pub mod units;
