//! The facade's integration tests, one binary: each file here was a test binary of its own, and
//! each linked the whole workspace again.
//!
//! The tests that load the stub `libcuda` into their process (`callers_cuda`, `context`,
//! `cufile`) are a second binary, `tests/stubs`: once loaded, `cudarc` finds the stub by its
//! soname, and here `auto` must find no CUDA driver (the `loader` module's test of it); nor may
//! this binary's loads move the counters of the whole process that those tests read.
//!
//! Process-wide state is shared by every module here, so a test measures only its own thread:
//! the allocations of `parsing_properties`, the bytes read of `malformed`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

#[path = "../common/mod.rs"]
mod common;

mod coalesce;
mod conformance;
mod descriptors;
mod doors;
mod fault_sweep;
mod file_changes;
mod hipfile;
#[cfg(feature = "remote")]
mod hub;
#[cfg(feature = "remote")]
mod hub_deploy;
mod limits;
mod load_into;
mod loader;
mod malformed;
mod mapped;
mod modules;
mod narrowed;
mod order;
mod parsing_properties;
#[cfg(feature = "remote")]
mod remote;
#[cfg(feature = "remote")]
mod remote_trust;
#[cfg(feature = "remote")]
mod remote_words;
