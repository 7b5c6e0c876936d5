//! How the extension locks its mutexes: a poisoned lock is taken as it is.

use std::sync::{Mutex, MutexGuard, PoisonError};

pub(crate) fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave these maps or the load half-updated in a way
    // that matters more than the panic itself, which PyO3 already turned into an exception.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
