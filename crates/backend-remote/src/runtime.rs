//! The [`Remote`](crate::Remote)'s own tokio runtime, and how a call blocks on it: from a plain
//! thread, or from a blocking thread of the caller's runtime, never from an async task (which
//! it would stall); interruptible by [`Options::interrupt`](crate::Options::interrupt).

use std::future::Future;
use std::io;
use std::time::Duration;

use crate::options::Interrupt;

/// The `Remote`'s runtime, shut down without blocking when dropped: dropping a tokio runtime
/// from async code panics, and a `Load` may well be dropped there. A caller that makes a store
/// of its own ([`Remote::with_store`](crate::Remote::with_store)) starts one for it, and may run
/// its own requests on it first.
#[derive(Debug)]
pub struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl OwnedRuntime {
    /// Starts the runtime: two worker threads, named `staging-remote`, with I/O and timers.
    /// A thread the system refuses is an error (`EAGAIN`, ...), not the panic tokio raises for
    /// it ("OS can't spawn worker thread"; its default hook still prints that line).
    pub fn start() -> io::Result<Self> {
        let built = std::panic::catch_unwind(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("staging-remote")
                .enable_all()
                .build()
        });
        match built {
            Ok(runtime) => Ok(Self(Some(runtime?))),
            Err(panic) => Err(refused_thread(panic.as_ref())),
        }
    }

    fn get(&self) -> io::Result<&tokio::runtime::Runtime> {
        self.0
            .as_ref()
            .ok_or_else(|| io::Error::other("the I/O runtime was shut down"))
    }
}

/// The error behind tokio's panic when the system refused it a thread: the system's code where
/// its message gives it (`... (os error 11)`), else the message.
fn refused_thread(panic: &(dyn std::any::Any + Send)) -> io::Error {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("the I/O runtime could not start its threads");
    let code = message
        .rsplit_once("(os error ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .and_then(|(code, _)| code.parse::<i32>().ok());
    match code {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::other(message.to_owned()),
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

impl OwnedRuntime {
    /// Runs `future` to its end on this runtime, blocking this thread: a plain thread or a
    /// blocking thread of another runtime, never an async task. Ended early by `interrupt`.
    pub fn block_on<T>(
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

#[cfg(test)]
mod tests {
    use super::refused_thread;

    #[test]
    fn the_panic_of_a_refused_thread_gives_back_the_system_error() {
        let panic: Box<dyn std::any::Any + Send> = Box::new(String::from(
            "OS can't spawn worker thread: Resource temporarily unavailable (os error 11)",
        ));
        assert_eq!(refused_thread(panic.as_ref()).raw_os_error(), Some(11));
        let panic: Box<dyn std::any::Any + Send> = Box::new("something else");
        let error = refused_thread(panic.as_ref());
        assert_eq!(
            (error.raw_os_error(), error.to_string()),
            (None, "something else".into())
        );
    }
}
