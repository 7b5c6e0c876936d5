//! # backend-mock
//!
//! CPU-backed test doubles for the staging traits, fixture writers, and the conformance suite
//! every backend runs.
//!
//! - [`FaultyReader`] wraps any [`Reader`](staging_core::Reader) with scripted faults (a read
//!   error at call k, end-of-file at call k, short reads of varying length) and logs every call.
//! - [`ScriptedAllocator`] wraps any [`DeviceAllocator`](staging_core::DeviceAllocator) with a
//!   scripted free-memory figure, a capacity, out-of-memory at allocation k (the race), any other
//!   allocation error, copy failures, and a [`Ledger`] of every buffer handed out and returned.
//! - [`MockReader`] and [`MockAllocator`] are those wrappers over the host backend: the `mock`
//!   backend of the `stage` command.
//! - [`fixtures`] writes safetensors files and sharded checkpoints.
//! - [`conformance`] is the suite any reader and allocator pair must pass.
//! - [`http::RangeServer`] serves objects over HTTP with scripted faults; [`hub::FakeHub`] is a
//!   fake Hugging Face Hub (API, `resolve`, a signed-URL CDN) with scripted faults and a rate cap.
//!
//! Faults compose as wrappers (like object_store's `ThrottledStore`) rather than flags on one
//! backend, so a real backend runs under exactly the same faults as the mock.

pub use staging_core;

mod allocator;
pub mod conformance;
/// The checkpoint writers (now `staging_core::write`), under the name the tests know.
pub use staging_core::write as fixtures;
pub mod http;
pub mod hub;
pub mod malformed;
mod reader;

pub use allocator::{Ledger, LedgerEntry, ScriptedAllocator, ScriptedBuffer};
pub use reader::{FaultyFile, FaultyReader, ReadCall, ReadLog};

use staging_core::host::{HostAllocator, HostReader};

/// The mock reader: the host reader with scripted faults.
pub type MockReader = FaultyReader<HostReader>;
/// The mock allocator: system memory with a scripted figure, faults and a ledger.
pub type MockAllocator = ScriptedAllocator<HostAllocator>;

/// A fault-free mock backend, labelled "mock" in reports.
pub fn mock_backend() -> (MockReader, MockAllocator) {
    (
        FaultyReader::new(HostReader).labelled("mock"),
        ScriptedAllocator::new(HostAllocator::new()),
    )
}
