//! hatchery: a sandbox manager for self-replicating agent workers on Linux.
//!
//! The library is split by trust boundary: [`profile`] and [`units`] describe what a
//! sandbox may do; [`sandbox`] makes the kernel enforce it, and is the only module that
//! makes raw syscalls or steps outside safe Rust; [`manifest`], [`signing`] and [`contract`]
//! decide who may exist; [`controller`] runs workers under those decisions and [`audit`]
//! records them; [`report`] tells what a single run did. The command-line edge lives in the
//! binary.

pub mod audit;
pub mod broker;
pub mod contract;
pub mod controller;
pub mod egress;
pub mod keyfile;
pub mod manifest;
pub mod pace;
pub mod paths;
pub mod profile;
pub mod report;
pub mod sandbox;
pub mod signing;
pub mod text;
pub mod units;
