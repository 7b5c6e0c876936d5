//! The [`Remote`](crate::Remote)'s own tokio runtime, and how a call blocks on it: from a plain
//! thread, or from a blocking thread of the caller's runtime, never from an async task (which
//! it would stall); interruptible by [`Options::interrupt`](crate::Options::interrupt).

use std::future::Future;
use std::io;
use std::time::Duration;

use crate::options::Interrupt;
use crate::store::Inner;

/// The `Remote`'s runtime, shut down without blocking when dropped: dropping a tokio runtime
/// from async code panics, and a `Load` may well be dropped there.
#[derive(Debug)]
pub(crate) struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl OwnedRuntime {
    /// Starts the runtime: two worker threads, named `staging-remote`, with I/O and timers.
    pub(crate) fn start() -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("staging-remote")
            .enable_all()
            .build()?;
        Ok(Self(Some(runtime)))
    }

    fn get(&self) -> io::Result<&tokio::runtime::Runtime> {
        self.0
            .as_ref()
            .ok_or_else(|| io::Error::other("the I/O runtime was shut down"))
    }
}

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

pub(crate) const IN_ASYNC_TASK: &str = "called from an async task, which it would block: load from a \
     blocking thread (tokio::task::spawn_blocking)";

/// Whether this thread is running an async task (a runtime worker thread, or a runtime's
/// `block_on`): there, a task is polled under tokio's cooperative budget, which runs out; on a
/// blocking thread (`spawn_blocking`) or any other thread it never does.
pub(crate) fn in_async_task() -> bool {
    if tokio::runtime::Handle::try_current().is_err() {
        return false;
    }
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    for _ in 0..=1024 {
        let mut unit = std::pin::pin!(tokio::task::coop::consume_budget());
        if unit.as_mut().poll(&mut cx).is_pending() {
            return true;
        }
    }
    false
}

impl Inner {
    /// Runs `future` to its end on this store's runtime, blocking this thread: a plain thread
    /// or a blocking thread of another runtime, never an async task. Interruptible.
    pub(crate) fn block_on<T>(&self, future: impl Future<Output = io::Result<T>>) -> io::Result<T> {
        self.runtime.block_on(self.interrupt.as_ref(), future)
    }
}

impl OwnedRuntime {
    /// Runs `future` to its end on this runtime, blocking this thread: a plain thread or a
    /// blocking thread of another runtime, never an async task. Ended early by `interrupt`.
    pub(crate) fn block_on<T>(
        &self,
        interrupt: Option<&Interrupt>,
        future: impl Future<Output = io::Result<T>>,
    ) -> io::Result<T> {
        let runtime = self.get()?;
        let future = interruptible(interrupt, future);
        if tokio::runtime::Handle::try_current().is_err() {
            return runtime.block_on(future);
        }
        if in_async_task() {
            return Err(io::Error::other(IN_ASYNC_TASK));
        }
        // A blocking thread of the caller's runtime, whose context is set here (so tokio's
        // `block_on` would refuse): the future is polled here, with this store's runtime
        // entered, and that runtime's own threads drive its I/O and timers.
        let _entered = runtime.enter();
        futures::executor::block_on(future)
    }
}

/// `future`, ended early with an "interrupted" error once the interrupt predicate fires.
async fn interruptible<T>(
    interrupt: Option<&Interrupt>,
    future: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    let Some(interrupt) = interrupt else {
        return future.await;
    };
    let watch = async {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if interrupt.fired() {
                // Not `ErrorKind::Interrupted`: readers retry that one, as for EINTR.
                return io::Error::other("interrupted");
            }
        }
    };
    let future = std::pin::pin!(future);
    let watch = std::pin::pin!(watch);
    match futures::future::select(future, watch).await {
        futures::future::Either::Left((done, _)) => done,
        futures::future::Either::Right((interrupted, _)) => Err(interrupted),
    }
}
