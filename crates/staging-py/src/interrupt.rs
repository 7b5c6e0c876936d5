//! Ctrl-C during a remote read. Bytes move with the GIL released, so Python only sees a SIGINT
//! when control comes back; a GET to a server that stopped answering would hold it until the
//! request timeout (minutes). Here SIGINT is also counted by a handler of ours, chained after
//! Python's own (which still runs first, so `KeyboardInterrupt` is raised as usual), and a
//! remote load's interrupt predicate fires once a SIGINT arrived after the load began: the read
//! stops within about 50 ms, and the door raises the pending `KeyboardInterrupt`.
//!
//! Only when SIGINT has a handler (Python's, normally): with `SIG_DFL` or `SIG_IGN` nothing is
//! installed, so what SIGINT does is unchanged. A later `signal.signal(SIGINT, ...)` replaces
//! the handler at the C level, and remote reads then wait for their timeout again.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors_staging::remote::Interrupt;

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

/// A predicate that fires once a SIGINT arrives after this call; `None` when SIGINT is not
/// watched (see the module's notes).
pub(crate) fn on_ctrl_c() -> Option<Interrupt> {
    let watching = *WATCHING.get_or_init(|| {
        sigint_is_handled()
            // SAFETY: the action is async-signal-safe (one atomic increment), and the handler
            // it joins chains to the one installed before (Python's), which runs first.
            && unsafe {
                signal_hook_registry::register(libc::SIGINT, || {
                    SIGINTS.fetch_add(1, Ordering::Relaxed);
                })
            }
            .is_ok()
    });
    if !watching {
        return None;
    }
    let seen = SIGINTS.load(Ordering::Relaxed);
    Some(Interrupt::new(move || {
        SIGINTS.load(Ordering::Relaxed) != seen
    }))
}
