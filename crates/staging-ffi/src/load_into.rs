//! `stg_load_into`: a checkpoint read into memory that already holds its tensors (a model's
//! weights reloaded in place), checked whole before the first byte is written.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void};

use safetensors_staging::{Dtype, Error, LoadedInto, RawTarget};

use crate::boundary::{guard, utf8};
use crate::config::stg_config;
use crate::load::{loader_of, report_of, stg_report};
use crate::status::{status_of, stg_status};
use crate::tensor::stg_dtype;

/// What a target of `stg_load_into` holds when it returns.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum stg_target_state {
    /// Its old bytes: never written (nothing is written when the checkpoint does not fit).
    STG_TARGET_UNCHANGED = 0,
    /// The checkpoint's bytes, whole.
    STG_TARGET_WRITTEN = 1,
    /// Writing began and did not end (the load failed meanwhile): some bytes may be new, some
    /// old. Load it again.
    STG_TARGET_PARTLY_WRITTEN = 2,
    /// The checkpoint has no tensor of its name (an error when `strict`).
    STG_TARGET_MISSING = 3,
}

/// One tensor's memory for `stg_load_into`, and what it must hold.
#[repr(C)]
#[derive(Debug)]
pub struct stg_target {
    /// The tensor's name in the checkpoint, NUL-terminated UTF-8.
    pub name: *const c_char,
    /// Its memory: of the load's device (host memory for the `host` backend, CUDA device
    /// memory for `cufile`, HIP for `hipfile`), writable, `len` bytes.
    pub data: *mut c_void,
    /// Bytes: the checkpoint's tensor must have exactly this many.
    pub len: usize,
    /// The dtype to check it against (a `stg_dtype`), or `STG_DTYPE_UNKNOWN` (0) for none.
    pub dtype: u32,
    /// The shape to check it against (`ndim` values), or NULL for none.
    pub shape: *const u64,
    /// The number of values in `shape`.
    pub ndim: usize,
    /// Written by `stg_load_into`: a `stg_target_state`.
    pub state: u32,
}

/// The dtype whose `stg_dtype` number is `code`.
fn dtype_of(code: u32) -> Option<Dtype> {
    use Dtype::*;
    [
        BOOL,
        U8,
        I8,
        U16,
        I16,
        U32,
        I32,
        U64,
        I64,
        F16,
        BF16,
        F32,
        F64,
        C64,
        F8_E4M3,
        F8_E5M2,
        F8_E8M0,
        F8_E4M3FNUZ,
        F8_E5M2FNUZ,
        F4,
        F6_E2M3,
        F6_E3M2,
    ]
    .into_iter()
    .find(|&d| stg_dtype::of(d) as u32 == code)
}

/// Reads the checkpoint at `path` into `targets` (`count` of them), in place: a model's
/// weights reloaded into the memory that holds them, with `config`'s backend and settings
/// (its destination callback, if any, is not used: the targets are the destination; its
/// `rows` narrow the checkpoint's tensors, for a rank's part).
///
/// First every header is read and every target checked: the checkpoint's tensor must have
/// exactly `len` bytes, and the target's `dtype` and `shape` where given. A mismatch, or with
/// `strict` a target the checkpoint lacks or a tensor of the checkpoint no target takes,
/// returns `STG_SELECTION` and writes nothing (the message, from `stg_config_last_error`,
/// lists every problem); so do targets whose memory overlaps another's (a fused `qkv` and a
/// view of its rows). Then each tensor is read straight into its target.
///
/// Every target's `state` is written (`STG_TARGET_UNCHANGED` first, whatever happens):
/// `STG_TARGET_WRITTEN` for each one loaded, `STG_TARGET_MISSING` for one the checkpoint lacks,
/// unchanged for one the configuration's selection leaves out. When the load fails after writing
/// began, the status is the failure's and the states say exactly which targets hold the
/// checkpoint's bytes, which may hold some (`STG_TARGET_PARTLY_WRITTEN`) and which are
/// unchanged. `*unexpected` (if not NULL) gets the number of the checkpoint's tensors no
/// target takes; `*report` (if not NULL) the load's report on success.
///
/// # Safety
/// `config` NULL or live; `path` NULL or NUL-terminated; `targets` NULL or `count` valid,
/// writable `stg_target`s whose `name`s are NUL-terminated, whose `shape`s (when not NULL)
/// hold `ndim` values, and whose `data` are `len` writable bytes of the load's device memory,
/// untouched by anything else until this returns; `unexpected` and `report` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_load_into(
    config: *const stg_config,
    path: *const c_char,
    targets: *mut stg_target,
    count: usize,
    strict: bool,
    unexpected: *mut usize,
    report: *mut stg_report,
) -> stg_status {
    guard(|| {
        // SAFETY: non-null pointers are live configurations by the caller's contract.
        let Some(config) = (unsafe { config.as_ref() }) else {
            return stg_status::STG_NULL_ARGUMENT;
        };
        if targets.is_null() && count > 0 {
            return stg_status::STG_NULL_ARGUMENT;
        }
        // SAFETY: forwarded caller contract.
        let path = match unsafe { utf8(path) } {
            Ok(path) => path,
            Err(status) => return status,
        };
        let targets: &mut [stg_target] = if count == 0 {
            &mut []
        } else {
            // SAFETY: `targets` is non-null and holds `count` writable targets by the
            // caller's contract.
            unsafe { std::slice::from_raw_parts_mut(targets, count) }
        };
        for target in targets.iter_mut() {
            target.state = stg_target_state::STG_TARGET_UNCHANGED as u32;
        }
        let mut raw = BTreeMap::new();
        for target in targets.iter() {
            // SAFETY: forwarded caller contract, for each target.
            let (name, entry) = match unsafe { raw_target(target) } {
                Ok(read) => read,
                Err(status) => return status,
            };
            if raw.insert(name, entry).is_some() {
                return stg_status::STG_INVALID_ARGUMENT; // the same name twice
            }
        }
        let outcome = loader_of(config).and_then(|loader| {
            // SAFETY: the targets are `len` writable bytes of the load's device memory,
            // untouched until this returns, by the caller's contract (overlaps are refused).
            unsafe { loader.load_into_raw(path, raw, strict) }
        });
        for target in targets.iter_mut() {
            // SAFETY: checked above to be NUL-terminated UTF-8.
            let Ok(name) = (unsafe { utf8(target.name) }) else {
                continue;
            };
            if let Some(state) = state_after(&outcome, name) {
                target.state = state as u32;
            }
        }
        match outcome {
            Ok(done) => {
                if !unexpected.is_null() {
                    // SAFETY: non-null and writable by the caller's contract.
                    unsafe { *unexpected = done.unexpected.len() };
                }
                if !report.is_null() {
                    // SAFETY: non-null and writable by the caller's contract.
                    unsafe { *report = report_of(&done.report) };
                }
                stg_status::STG_OK
            }
            Err(error) => {
                config.fail(&error);
                status_of(&error)
            }
        }
    })
}

/// One target as the library takes it: its name, and its memory with what it must hold.
/// `STG_NULL_ARGUMENT` for a NULL name, or NULL data of some length; `STG_INVALID_UTF8` for a
/// name that is not UTF-8; `STG_INVALID_ARGUMENT` for a dimension or a dtype number out of
/// range, or memory that wraps around the address space.
///
/// # Safety
/// `target.name` NULL or NUL-terminated; `target.shape` NULL or `target.ndim` readable values.
unsafe fn raw_target(target: &stg_target) -> Result<(String, RawTarget), stg_status> {
    // SAFETY: each name is NULL or NUL-terminated by the caller's contract.
    let name = unsafe { utf8(target.name) }?.to_owned();
    let shape = if target.shape.is_null() {
        None
    } else {
        // SAFETY: a non-null shape holds `ndim` values by the caller's contract.
        let values = unsafe { std::slice::from_raw_parts(target.shape, target.ndim) };
        let mut shape = Vec::with_capacity(values.len());
        for &v in values {
            let Ok(v) = usize::try_from(v) else {
                return Err(stg_status::STG_INVALID_ARGUMENT);
            };
            shape.push(v);
        }
        Some(shape)
    };
    let dtype = match target.dtype {
        0 => None,
        code => match dtype_of(code) {
            Some(dtype) => Some(dtype),
            None => return Err(stg_status::STG_INVALID_ARGUMENT),
        },
    };
    if target.data.is_null() && target.len > 0 {
        return Err(stg_status::STG_NULL_ARGUMENT);
    }
    let addr = target.data as usize;
    if addr.checked_add(target.len).is_none() {
        return Err(stg_status::STG_INVALID_ARGUMENT);
    }
    let entry = RawTarget {
        addr,
        len: target.len,
        dtype,
        shape,
    };
    Ok((name, entry))
}

/// The state the load's `outcome` leaves the target `name` in, where it is not
/// `STG_TARGET_UNCHANGED`: written, missing, or (after a partial load) partly written.
fn state_after(outcome: &Result<LoadedInto, Error>, name: &str) -> Option<stg_target_state> {
    match outcome {
        Ok(done) if done.missing.iter().any(|m| m == name) => {
            Some(stg_target_state::STG_TARGET_MISSING)
        }
        Ok(done) if done.written.iter().any(|w| w == name) => {
            Some(stg_target_state::STG_TARGET_WRITTEN)
        }
        Ok(_) => None,
        Err(Error::PartialLoad {
            written,
            partly_written,
            ..
        }) => {
            if written.iter().any(|w| w == name) {
                Some(stg_target_state::STG_TARGET_WRITTEN)
            } else if partly_written.iter().any(|p| p == name) {
                Some(stg_target_state::STG_TARGET_PARTLY_WRITTEN)
            } else {
                None
            }
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code asserts by panicking

    use super::*;

    #[test]
    fn every_numbered_dtype_has_its_dtype_back() {
        for code in 1..=22 {
            let dtype = dtype_of(code).unwrap_or_else(|| panic!("{code}"));
            assert_eq!(stg_dtype::of(dtype) as u32, code);
        }
        assert_eq!(dtype_of(0), None);
        assert_eq!(dtype_of(999), None);
    }
}
