//! The backend conformance suite, run against every backend available without a GPU.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

mod host {
    use backend_mock::conformance::Harness;
    use staging_core::host::{HostAllocator, HostReader};

    struct HostBackend;

    impl Harness for HostBackend {
        type Reader = HostReader;
        type Allocator = HostAllocator;
        fn backend(&self) -> (HostReader, HostAllocator) {
            (HostReader, HostAllocator::new())
        }
    }

    backend_mock::conformance_suite!(HostBackend);
}

mod mock {
    use backend_mock::conformance::Harness;
    use backend_mock::{MockAllocator, MockReader, mock_backend};

    struct MockBackend;

    impl Harness for MockBackend {
        type Reader = MockReader;
        type Allocator = MockAllocator;
        fn backend(&self) -> (MockReader, MockAllocator) {
            mock_backend()
        }
    }

    backend_mock::conformance_suite!(MockBackend);
}

mod host_direct {
    use backend_mock::conformance::Harness;
    use staging_core::host::{DirectHostReader, HostAllocator};

    /// The host backend reading with O_DIRECT through aligned bounce buffers (small ones, so
    /// tensors span several bounce reads).
    struct DirectBackend;

    impl Harness for DirectBackend {
        type Reader = DirectHostReader;
        type Allocator = HostAllocator;
        fn backend(&self) -> (DirectHostReader, HostAllocator) {
            (DirectHostReader::new(8192), HostAllocator::new())
        }
    }

    backend_mock::conformance_suite!(DirectBackend);
}

mod host_suballocated {
    use backend_mock::conformance::Harness;
    use staging_core::SubAllocator;
    use staging_core::host::{HostAllocator, HostReader};

    /// The host backend with small tensors carved from shared blocks (small blocks, so the
    /// suite's tensors span several).
    struct SubBackend;

    impl Harness for SubBackend {
        type Reader = HostReader;
        type Allocator = SubAllocator<HostAllocator>;
        fn backend(&self) -> (HostReader, SubAllocator<HostAllocator>) {
            (
                HostReader,
                SubAllocator::new(HostAllocator::new(), 64 * 1024, 20 * 1024),
            )
        }
    }

    backend_mock::conformance_suite!(SubBackend);
}
