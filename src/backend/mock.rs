//! The mock backend: the host backend behind the mock's ledger, which records every buffer
//! handed out and returned (for tests and leak checks); a URL's store read through its faulty
//! reader.

use std::sync::Arc;

use super::{Chosen, OnReader, Opened, RemoteStore, mismatch};
use crate::device::Device;
use crate::error::Result;

/// The mock backend, opened.
pub(crate) struct Mock {
    reader: Arc<backend_mock::MockReader>,
    allocator: Arc<backend_mock::MockAllocator>,
}

/// Opens the mock backend for `device` (a GPU is [`Error::DeviceMismatch`](crate::Error)), its
/// memory at most `capacity` bytes.
pub(super) fn open(device: Device, capacity: Option<u64>) -> Result<Chosen> {
    if device.gpu_index().is_some() {
        return Err(mismatch(
            "mock",
            device,
            "it loads into host memory: use device cpu (or auto)",
        ));
    }
    let (reader, allocator) = backend_mock::mock_backend();
    let allocator = match capacity {
        Some(cap) => allocator.with_capacity(cap),
        None => allocator,
    };
    Ok(Chosen::plain(Opened::Mock(Mock {
        reader: Arc::new(reader),
        allocator: Arc::new(allocator),
    })))
}

impl Mock {
    /// The ledger of every buffer handed out and returned.
    pub(super) fn ledger(&self) -> backend_mock::Ledger {
        self.allocator.ledger()
    }

    /// Runs `task` with the reader and allocator this backend reads a local file (`remote`
    /// `None`) or a URL's store with.
    pub(super) fn with_reader<'d, T: OnReader<'d>>(
        &self,
        remote: Option<&RemoteStore>,
        task: T,
    ) -> Result<T::Output> {
        match remote {
            None => task.run(
                Arc::clone(&self.reader),
                Arc::clone(&self.allocator),
                "mock",
            ),
            #[cfg(feature = "remote")]
            Some(remote) => {
                let reader = backend_mock::FaultyReader::new(remote.reader()).labelled("mock");
                task.run(reader, Arc::clone(&self.allocator), "mock")
            }
            #[cfg(not(feature = "remote"))]
            Some(never) => match *never {},
        }
    }
}
