//! Ctrl-C during a remote read. Bytes move with the GIL released, so Python only sees a SIGINT
//! when control comes back; a GET to a server that stopped answering would hold it until the
//! request timeout (minutes). Here SIGINT is also counted by a handler of ours, chained after
//! Python's own (which still runs first, so `KeyboardInterrupt` is raised as usual), and a
//! remote handle's interrupt predicate fires once a SIGINT arrived during one of its calls: the
//! read stops within about 50 ms, and the door raises the pending `KeyboardInterrupt`.
//!
//! A Ctrl-C interrupts the calls running when it arrives, and no later one. A handle lives
//! across many calls (a `safe_open` handle, a `stage` iterator), and a SIGINT may arrive while
//! none of them runs (Jupyter interrupting another cell, whose `KeyboardInterrupt` is caught
//! there): so the SIGINTs are counted from the start of each call that can wait on the network
//! ([`Calls::enter`]: `stage`, `open`, each `next()` of a load, each read of a handle), not from
//! when the handle was made. Calls of one handle that overlap (reads on several threads, a read
//! ahead) share the handle's reads: a SIGINT that arrived during one of them interrupts them
//! while that call runs, and no longer once every call that began before it has ended (a
//! chain of overlapping calls does not carry an old Ctrl-C forward).
//!
//! Closing a handle interrupts its reads too ([`Calls::close`]): a read waiting on a server that
//! stopped answering, on another thread, ends then rather than at the request timeout.
//!
//! SIGINT is counted only when it has a handler (Python's, normally): with `SIG_DFL` or
//! `SIG_IGN` nothing is installed, so what SIGINT does is unchanged. A later
//! `signal.signal(SIGINT, ...)` replaces the handler at the C level, and remote reads then wait
//! for their timeout again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use safetensors_staging::remote::Interrupt;

use crate::lock::locked;

static SIGINTS: AtomicU64 = AtomicU64::new(0);
static WATCHING: OnceLock<bool> = OnceLock::new();

/// Whether SIGINT has a handler function now (not `SIG_DFL`, not `SIG_IGN`).
fn sigint_is_handled() -> bool {
    // SAFETY: a zeroed sigaction is a valid out-parameter; a null new action only reads the
    // current one.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGINT, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction != libc::SIG_DFL
            && current.sa_sigaction != libc::SIG_IGN
    }
}

/// Whether SIGINTs are counted; the first call installs the counting handler (see the module's
/// notes).
fn watching_sigint() -> bool {
    *WATCHING.get_or_init(|| {
        sigint_is_handled()
            // SAFETY: the action is async-signal-safe (one atomic increment), and the handler
            // it joins chains to the one installed before (Python's), which runs first.
            && unsafe {
                signal_hook_registry::register(libc::SIGINT, || {
                    SIGINTS.fetch_add(1, Ordering::Relaxed);
                })
            }
            .is_ok()
    })
}

/// The calls of one handle, as Ctrl-C and `close()` see them: a SIGINT interrupts the handle's
/// reads only while one of its calls runs, and only if it arrived after that call began; once
/// the handle is closed, every read of it is interrupted.
#[derive(Default)]
pub(crate) struct Calls {
    running: Mutex<Running>,
    closed: AtomicBool,
}

#[derive(Default)]
struct Running {
    /// For each call of the handle running now, the SIGINTs counted when it began.
    began_at: Vec<u64>,
}

impl Calls {
    /// A predicate that interrupts the handle's reads of URLs, when `paths` name one (the
    /// SIGINT handler is installed only then); else `None`.
    pub(crate) fn interrupt_for(self: &Arc<Self>, paths: &[PathBuf]) -> Option<Interrupt> {
        if !paths.iter().any(|p| safetensors_staging::is_url(p)) {
            return None;
        }
        let watching = watching_sigint();
        let calls = Arc::clone(self);
        Some(Interrupt::new(move || {
            calls.is_closed() || (watching && calls.ctrl_c_during_a_call())
        }))
    }

    /// Marks the handle closed: its reads are interrupted from now on.
    pub(crate) fn close(&self) {
        // SeqCst: a load reads it against its `stepping` flag (see `load`).
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Whether the handle was closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Marks a call of the handle as running until the guard is dropped: SIGINTs from now on
    /// interrupt its reads.
    pub(crate) fn enter(&self) -> Entered<'_> {
        let began_at = SIGINTS.load(Ordering::Relaxed);
        locked(&self.running).began_at.push(began_at);
        Entered {
            calls: self,
            began_at,
        }
    }

    /// A predicate for a call that moves bytes with the GIL released and can stop between
    /// steps (a reload, target by target): true once a SIGINT arrived during one of the
    /// handle's calls (the SIGINT handler installed now, as for a URL); always false where
    /// SIGINT has no handler.
    pub(crate) fn ctrl_c(self: &Arc<Self>) -> impl Fn() -> bool + Sync + use<> {
        let watching = watching_sigint();
        let calls = Arc::clone(self);
        move || watching && calls.ctrl_c_during_a_call()
    }

    /// Whether a SIGINT arrived during a call of the handle that is still running.
    fn ctrl_c_during_a_call(&self) -> bool {
        let now = SIGINTS.load(Ordering::Relaxed);
        locked(&self.running).began_at.iter().any(|&at| at != now)
    }
}

/// A call of a handle, running until dropped ([`Calls::enter`]).
pub(crate) struct Entered<'a> {
    calls: &'a Calls,
    began_at: u64,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut running = locked(&self.calls.running);
        if let Some(at) = running.began_at.iter().position(|&b| b == self.began_at) {
            running.began_at.swap_remove(at);
        }
    }
}
