//! How `stg_load_free` and a running `stg_load_next` (on another thread, or from the load's
//! own destination callback) agree on who frees a load: the [`Steps`] they share with the
//! load's destination callback, its states, and the loads stepping on this thread.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// What a load's `stg_load_next` and `stg_load_free` tell each other; shared with the load's
/// destination callback, which stops the load when it is being freed.
pub(crate) struct Steps {
    /// Whether a `stg_load_next` is running, and whether the load was freed meanwhile: one of
    /// the `STEP_*` values. Only atomic operations on it decide who frees the load, so that
    /// whoever did not free it touches nothing of it afterwards.
    pub(crate) state: AtomicU8,
    /// Set by a `stg_load_free` from the load's own destination callback (which does not free).
    pub(crate) freed_in_callback: AtomicBool,
}

impl Steps {
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU8::new(STEP_IDLE),
            freed_in_callback: AtomicBool::new(false),
        }
    }

    /// Why the load must stop before the tensor its callback was just asked for, if it must.
    pub(crate) fn stop_reason(&self) -> Option<&'static str> {
        if self.freed_in_callback.load(Ordering::Acquire) {
            Some(FREED_IN_CALLBACK)
        } else if self.state.load(Ordering::Acquire) == STEP_FREE_PENDING {
            Some(FREED_ELSEWHERE)
        } else {
            None
        }
    }
}

/// No `stg_load_next` is running: `stg_load_free` frees the load at once.
pub(crate) const STEP_IDLE: u8 = 0;
/// A `stg_load_next` is running.
pub(crate) const STEP_RUNNING: u8 = 1;
/// A `stg_load_next` is running and `stg_load_free` was called from another thread: the step
/// frees the load when it ends.
pub(crate) const STEP_FREE_PENDING: u8 = 2;
/// `stg_load_free` is freeing the load (nothing may start a step).
pub(crate) const STEP_FREEING: u8 = 3;

thread_local! {
    /// The loads (by address) whose `stg_load_next` is running on this thread: more than one
    /// when a destination callback steps another load. `stg_load_free` tells its own callback's
    /// call from another thread's by it, without reading the load.
    pub(crate) static STEPPING_HERE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Whether this thread is inside `stg_load_next` of the load at `address` (so a `stg_load_free`
/// of it comes from its own destination callback).
pub(crate) fn stepping_here(address: usize) -> bool {
    STEPPING_HERE
        .try_with(|loads| loads.borrow().contains(&address))
        .unwrap_or(false)
}

/// The message of a load stopped by a `stg_load_free` from its own callback.
pub(crate) const FREED_IN_CALLBACK: &str = "stg_load_free was called on this load from its own destination \
     callback: the load stopped before this tensor was read; free the load after stg_load_next \
     returns (to stop a load from its callback, return a non-zero value)";

/// Why a load being freed by `stg_load_free` on another thread stops (never read: the load is
/// gone when its `stg_load_next` returns).
pub(crate) const FREED_ELSEWHERE: &str =
    "stg_load_free was called on this load from another thread";
