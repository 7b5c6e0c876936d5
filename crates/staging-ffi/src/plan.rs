//! `stg_plan`: a partition plan of a checkpoint between the ranks of a group, and
//! `stg_config_set_plan_rank`, which makes a configuration read one rank's share.

use std::ffi::{CString, c_char};

use safetensors_staging::Plan;

use crate::boundary::{c_string, free_boxed, guard};
use crate::config::{construct, stg_config, with_config};
use crate::status::{status_of, stg_status};

/// A partition plan: which rank of a group reads which piece of every tensor. Create with
/// `stg_plan_new`, free with `stg_plan_free`.
pub struct stg_plan {
    plan: Plan,
    names: Vec<CString>,
}

/// One piece of a plan. `name` stays valid while the plan lives.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct stg_plan_piece {
    /// The tensor's name, NUL-terminated.
    pub name: *const c_char,
    /// The tensor's position in the checkpoint (file order).
    pub tensor_index: usize,
    /// Whether the piece is the whole tensor; otherwise it holds rows `row_start..row_end` of
    /// dimension 0.
    pub whole: bool,
    /// First row held (0 for a whole tensor).
    pub row_start: usize,
    /// One past the last row held (0 for a whole tensor).
    pub row_end: usize,
    /// Where the piece starts in the tensor's bytes.
    pub offset: u64,
    /// The piece's length in bytes.
    pub len: u64,
    /// The rank that reads it.
    pub owner: usize,
}

/// Plans how a group of `ranks` ranks reads the checkpoint at `path` (what `stg_load_new` takes:
/// a directory, an index, a file, or the same at an `s3://`, `gs://`, `az://` or `http(s)://`
/// URL, read with the configuration's remote options) once between them: every
/// tensor (or, for one straddling two ranks' shares, every row range of it) gets an owner rank,
/// each rank about `total / ranks` bytes. Every rank computes the same plan from the same
/// checkpoint; compare `stg_plan_fingerprint` across ranks to be sure. On failure `*out` is
/// untouched and the message is available from `stg_config_last_error`.
///
/// # Safety
/// `config` NULL or live; `path` NULL or NUL-terminated; `out` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_plan_new(
    config: *const stg_config,
    path: *const c_char,
    ranks: usize,
    out: *mut *mut stg_plan,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe {
        construct(config, path, out, status_of, |config, path| {
            let checkpoint = config.options.loader()?.read_headers(&[path])?;
            let plan = Plan::new(&checkpoint, ranks)?;
            let names = plan.pieces().iter().map(|p| c_string(&p.name)).collect();
            Ok(stg_plan { plan, names })
        })
    }
}

/// Frees a plan. NULL does nothing.
///
/// # Safety
/// `plan` must be NULL or a pointer from `stg_plan_new` not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_plan_free(plan: *mut stg_plan) {
    // SAFETY: forwarded caller contract: NULL, or a pointer from stg_plan_new freed once.
    unsafe { free_boxed(plan) };
}

/// The number of pieces (0 for NULL).
///
/// # Safety
/// `plan` must be NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_plan_len(plan: *const stg_plan) -> usize {
    // SAFETY: non-null pointers are live plans by the caller's contract.
    unsafe { plan.as_ref() }.map_or(0, |p| p.plan.pieces().len())
}

/// Describes piece `index` (in checkpoint order; the order every rank exchanges them in).
///
/// # Safety
/// `plan` NULL or live; `out` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_plan_get_piece(
    plan: *const stg_plan,
    index: usize,
    out: *mut stg_plan_piece,
) -> stg_status {
    guard(|| {
        // SAFETY: non-null pointers are live plans by the caller's contract.
        let Some(plan) = (unsafe { plan.as_ref() }) else {
            return stg_status::STG_NULL_ARGUMENT;
        };
        if out.is_null() {
            return stg_status::STG_NULL_ARGUMENT;
        }
        let (Some(piece), Some(name)) = (plan.plan.pieces().get(index), plan.names.get(index))
        else {
            return stg_status::STG_INVALID_ARGUMENT;
        };
        let rows = piece.rows.clone().unwrap_or(0..0);
        let described = stg_plan_piece {
            name: name.as_ptr(),
            tensor_index: piece.tensor,
            whole: piece.rows.is_none(),
            row_start: rows.start,
            row_end: rows.end,
            offset: piece.offset as u64,
            len: piece.len as u64,
            owner: piece.owner,
        };
        // SAFETY: `out` is non-null and writable by the caller's contract.
        unsafe { *out = described };
        stg_status::STG_OK
    })
}

/// The bytes rank `rank` reads under the plan (0 for NULL or a rank outside the group).
///
/// # Safety
/// `plan` must be NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_plan_rank_bytes(plan: *const stg_plan, rank: usize) -> u64 {
    // SAFETY: non-null pointers are live plans by the caller's contract.
    unsafe { plan.as_ref() }.map_or(0, |p| p.plan.bytes_of(rank))
}

/// A hash of the checkpoint's tensors and the assignment, the same in every build: equal on two
/// ranks exactly when they planned the same (0 for NULL).
///
/// # Safety
/// `plan` must be NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_plan_fingerprint(plan: *const stg_plan) -> u64 {
    // SAFETY: non-null pointers are live plans by the caller's contract.
    unsafe { plan.as_ref() }.map_or(0, |p| p.plan.fingerprint())
}

/// Makes loads opened with `config` read only what `rank` owns under `plan`: its tensors, and
/// the rows of those split between ranks. The plan may be freed afterwards.
///
/// # Safety
/// `config` NULL or live; `plan` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_set_plan_rank(
    config: *mut stg_config,
    plan: *const stg_plan,
    rank: usize,
) -> stg_status {
    // SAFETY: non-null pointers are live plans by the caller's contract.
    let Some(plan) = (unsafe { plan.as_ref() }) else {
        return stg_status::STG_NULL_ARGUMENT;
    };
    // SAFETY: forwarded caller contract.
    unsafe {
        with_config(config, |c| {
            if rank >= plan.plan.ranks() {
                return stg_status::STG_INVALID_ARGUMENT;
            }
            c.plan_selection = Some(plan.plan.selection(rank));
            stg_status::STG_OK
        })
    }
}
