//! The facade's integration tests, one binary: each file here was a test binary of its own, and
//! each linked the whole workspace again.
//!
//! Three files stay binaries of their own, `tests/callers_cuda.rs`, `tests/context.rs` and
//! `tests/cufile.rs`: each loads the stub `libcuda` into its process (where `cudarc` then finds
//! it by its soname) and counts what it did in counters of the whole process (contexts pushed
//! and popped, streams created, pinned allocations). Here, `auto` must find no CUDA driver (the
//! `loader` module's test of it), and one module's loads must not move another's counters.
//!
//! Process-wide state is shared by every module here, so a test measures only its own thread:
//! the allocations of `parsing_properties`, the bytes read of `malformed`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

#[path = "../common/mod.rs"]
mod common;

mod coalesce;
mod conformance;
mod fault_sweep;
mod file_changes;
mod hipfile;
mod limits;
mod loader;
mod malformed;
mod modules;
mod order;
mod parsing_properties;
#[cfg(feature = "remote")]
mod remote;
#[cfg(feature = "remote")]
mod remote_trust;
