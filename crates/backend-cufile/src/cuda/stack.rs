//! This thread's context stack, below the device: taking a guard's own context off it from
//! under others pushed since ([`take_off_stack`]), and putting back a caller's context that
//! code of `cudarc`'s replaced ([`CallerContext`]). Plain driver calls on context handles; what
//! they found wrong is for the caller to record.

use std::marker::PhantomData;

use cudarc::driver::{DriverError, result, sys};

use crate::errors::cuda_code;

/// How many contexts pushed over its own a guard looks under for its own before it leaves the
/// stack alone.
const MAX_CONTEXTS_OVER_A_GUARD: usize = 16;

/// Takes `own` (pushed by a guard over `below`, the context then current) off this thread's
/// context stack, leaving every other entry where it is: the contexts pushed over it since are
/// popped, `own` is popped, and they are pushed back in their order. Only `own` is searched
/// for, never below `below` (the stack beneath the guard is the caller's), nor under more than
/// [`MAX_CONTEXTS_OVER_A_GUARD`] contexts. `Ok` says how many contexts it was under; `Err`
/// says what went wrong and what the stack is left as.
///
/// A context on the stack does not say who pushed it: `own` pushed by other code over the
/// guard's own is taken for the guard's, which leaves the same stack.
pub(super) fn take_off_stack(
    own: sys::CUcontext,
    below: Option<sys::CUcontext>,
) -> Result<usize, String> {
    let mut over = Vec::new();
    let left_alone = "the stack was left as it was";
    let found = loop {
        let current = match result::ctx::get_current() {
            Ok(current) => current,
            Err(e) => break Err(format!("cuCtxGetCurrent: {}; {left_alone}", cuda_code(e))),
        };
        if current == Some(own) {
            break match pop_current() {
                Ok(popped) if popped == own => Ok(over.len()),
                Ok(popped) => {
                    over.push(popped);
                    Err(format!(
                        "cuCtxPopCurrent returned another context than the current one; \
                         {left_alone}"
                    ))
                }
                Err(e) => Err(format!("cuCtxPopCurrent: {}; {left_alone}", cuda_code(e))),
            };
        }
        if current.is_none() || current == below {
            break Err(format!(
                "its context was not found on this thread's stack above the context current \
                 when it was bound (other code popped it, or replaced it with \
                 cuCtxSetCurrent); {left_alone}"
            ));
        }
        if over.len() == MAX_CONTEXTS_OVER_A_GUARD {
            break Err(format!(
                "its context was not found under {MAX_CONTEXTS_OVER_A_GUARD} contexts pushed \
                 over it; {left_alone}"
            ));
        }
        match pop_current() {
            Ok(popped) => over.push(popped),
            Err(e) => break Err(format!("cuCtxPopCurrent: {}; {left_alone}", cuda_code(e))),
        }
    };
    // The contexts pushed over `own` go back, the lowest first.
    for (pushed_back, &context) in over.iter().rev().enumerate() {
        // SAFETY: a context that was on this thread's stack a moment ago, so alive (its owner
        // keeps it alive while it is pushed).
        if let Err(e) = unsafe { sys::cuCtxPushCurrent_v2(context) }.result() {
            return Err(format!(
                "cuCtxPushCurrent of a context popped from over the guard's failed ({}): \
                 {} of the {} contexts pushed over it are lost from this thread's stack",
                cuda_code(e),
                over.len() - pushed_back,
                over.len()
            ));
        }
    }
    found
}

/// Pops this thread's current context; the context popped.
fn pop_current() -> Result<sys::CUcontext, DriverError> {
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops this thread's top context into a valid local; the callers pop only what they
    // push back, or the context their guard pushed.
    unsafe { sys::cuCtxPopCurrent_v2(&mut popped) }.result()?;
    Ok(popped)
}

/// The context current on this thread when it was made, made current again when it drops if
/// something (code of `cudarc`'s, which binds its context with `cuCtxSetCurrent`) replaced it.
#[derive(Debug)]
pub(crate) struct CallerContext {
    saved: Option<sys::CUcontext>,
    _thread: PhantomData<*const ()>,
}

impl CallerContext {
    pub(crate) fn save() -> Self {
        Self {
            saved: result::ctx::get_current().ok().flatten(),
            _thread: PhantomData,
        }
    }
}

impl Drop for CallerContext {
    fn drop(&mut self) {
        let now = result::ctx::get_current().ok().flatten();
        if now != self.saved {
            // SAFETY: the saved context was current on this thread when this guard was made
            // (or none was: null unbinds), and the caller keeps it alive meanwhile.
            let _ = unsafe { result::ctx::set_current(self.saved.unwrap_or(std::ptr::null_mut())) };
        }
    }
}
