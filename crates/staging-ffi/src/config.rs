//! `stg_config`: load settings, set through the library's option parser (`stg_config_set` and
//! the typed setters), and the last error of the handles made from it (`stg_load_new`,
//! `stg_plan_new`).

use std::ffi::{c_char, c_void};
use std::sync::Mutex;

use safetensors_staging::{LoadOptions, Selection};

use crate::boundary::{copy_message, free_boxed, guard, utf8};
use crate::destination::stg_destination_fn;
use crate::status::{status_of, stg_status};

/// Load settings. Create with `stg_config_new`, free with `stg_config_free`.
pub struct stg_config {
    /// The library's options: every setter, typed or `stg_config_set`, goes through its parser.
    pub(crate) options: LoadOptions,
    pub(crate) destination: stg_destination_fn,
    pub(crate) user_data: *mut c_void,
    /// A rank's share of a plan (`stg_config_set_plan_rank`).
    pub(crate) plan_selection: Option<Selection>,
    /// The last failure with this configuration, for `stg_config_last_error` and
    /// `stg_config_last_error_details`.
    last_failure: Mutex<Failure>,
}

/// A failure as kept: its message and its details (`Error::details()`), set together.
#[derive(Debug, Default)]
struct Failure {
    message: String,
    details: Vec<String>,
}

impl stg_config {
    /// Records the message of a failure, for `stg_config_last_error`, and its details (the
    /// library's, where it is the library's error), for `stg_config_last_error_details`.
    pub(crate) fn fail(&self, error: &(dyn std::error::Error + 'static)) {
        let details = error
            .downcast_ref::<safetensors_staging::Error>()
            .map(|e| e.details().to_vec())
            .unwrap_or_default();
        *self.last_failure() = Failure {
            message: error.to_string(),
            details,
        };
    }

    /// The last failure, locked (a poisoned lock still holds a whole failure: it is only ever
    /// replaced whole).
    fn last_failure(&self) -> std::sync::MutexGuard<'_, Failure> {
        self.last_failure.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `key` through the library's parser; a failure is kept for `stg_config_last_error`.
    fn set(&mut self, key: &str, value: &str) -> stg_status {
        match self.options.set(key, value) {
            Ok(()) => stg_status::STG_OK,
            Err(error) => {
                self.fail(&error);
                status_of(&error)
            }
        }
    }

    /// Sets a size or count that must be at least 1 (0 is `STG_INVALID_ARGUMENT`, as the typed
    /// setters have always said).
    fn set_positive(&mut self, key: &str, value: u64) -> stg_status {
        if value == 0 {
            return stg_status::STG_INVALID_ARGUMENT;
        }
        self.set(key, &value.to_string())
    }
}

/// Runs `f` on a configuration, or returns STG_NULL_ARGUMENT.
///
/// # Safety
/// `config` must be NULL or a live pointer from `stg_config_new`, not used elsewhere meanwhile.
pub(crate) unsafe fn with_config(
    config: *mut stg_config,
    f: impl FnOnce(&mut stg_config) -> stg_status,
) -> stg_status {
    guard(|| {
        // SAFETY: non-null pointers are live configurations by the caller's contract.
        match unsafe { config.as_mut() } {
            Some(config) => f(config),
            None => stg_status::STG_NULL_ARGUMENT,
        }
    })
}

/// Copies `text` of a configuration into `buf`, as `copy_message` does.
///
/// # Safety
/// `config` NULL or live; `buf` writable for `len` bytes; `written` valid for a write.
unsafe fn copy_config_text(
    config: *const stg_config,
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
    text: impl FnOnce(&stg_config) -> String,
) -> stg_status {
    guard(|| {
        // SAFETY: non-null pointers are live configurations by the caller's contract.
        let Some(config) = (unsafe { config.as_ref() }) else {
            return stg_status::STG_NULL_ARGUMENT;
        };
        let text = text(config);
        // SAFETY: forwarded caller contract for `buf` and `written`.
        unsafe { copy_message(&text, buf, len, written) }
    })
}

/// What `stg_load_new` and `stg_plan_new` share: checks the configuration, the path and the
/// out-pointer, builds the handle with `make`, and writes it to `*out`; on failure `*out` is
/// untouched and the message is kept in the configuration.
///
/// # Safety
/// `config` NULL or live; `path` NULL or NUL-terminated; `out` NULL or valid for a write.
pub(crate) unsafe fn construct<T, E: std::error::Error + 'static>(
    config: *const stg_config,
    path: *const c_char,
    out: *mut *mut T,
    status: fn(&E) -> stg_status,
    make: impl FnOnce(&stg_config, &str) -> Result<T, E>,
) -> stg_status {
    guard(|| {
        // SAFETY: non-null pointers are live configurations by the caller's contract.
        let Some(config) = (unsafe { config.as_ref() }) else {
            return stg_status::STG_NULL_ARGUMENT;
        };
        if out.is_null() {
            return stg_status::STG_NULL_ARGUMENT;
        }
        // SAFETY: forwarded caller contract.
        let path = match unsafe { utf8(path) } {
            Ok(path) => path,
            Err(status) => return status,
        };
        match make(config, path) {
            Ok(handle) => {
                // SAFETY: `out` is non-null and writable by the caller's contract.
                unsafe { *out = Box::into_raw(Box::new(handle)) };
                stg_status::STG_OK
            }
            Err(error) => {
                config.fail(&error);
                status(&error)
            }
        }
    })
}

/// Creates a configuration with the library's defaults (those of `stg_config_set`'s keys):
/// backend "auto", device "auto" (a GPU when one is usable, else host memory), the staging
/// policy's and the remote reader's defaults, every tensor, no destination.
///
/// # Safety
/// `out` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_new(out: *mut *mut stg_config) -> stg_status {
    guard(|| {
        if out.is_null() {
            return stg_status::STG_NULL_ARGUMENT;
        }
        let config = Box::new(stg_config {
            options: LoadOptions::new(),
            destination: None,
            user_data: std::ptr::null_mut(),
            plan_selection: None,
            last_failure: Mutex::new(Failure::default()),
        });
        // SAFETY: `out` is non-null and valid for a write by the caller's contract.
        unsafe { *out = Box::into_raw(config) };
        stg_status::STG_OK
    })
}

/// Frees a configuration. NULL does nothing.
///
/// # Safety
/// `config` must be NULL or a pointer from `stg_config_new` not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_free(config: *mut stg_config) {
    // SAFETY: forwarded caller contract: NULL, or a pointer from stg_config_new freed once.
    unsafe { free_boxed(config) };
}

/// Sets one option by its key, the value spelled as the `stage` command's flag `--KEY` takes it
/// (sizes like "512MiB", booleans "true"/"false"); a repeatable key (`select`, `rows`,
/// `store_option`, `allow_redirect`) adds one more. The keys, as the library's
/// options table defines them (docs/reference/options.md lists each with its default):
///
/// - `backend`: auto, host, cufile, hipfile (mock only in builds with it);
/// - `device`: auto (a GPU when one is usable, else host memory), cpu, cuda, cuda:N or N (a GPU,
///   or `STG_BACKEND_UNAVAILABLE`, each backend passed over and why in
///   `stg_config_last_error_details`), hip or hip:N (hipFile only);
/// - `memory_cap` (alias `device_memory`), `chunk_size` (also the staging size unless `staging_size` is set),
///   `staging_size`, `headroom_min` (sizes); `headroom_divisor`, `threads`, `staging_slots`
///   (counts); `coalesce_below` (size); `suballocate`, `host_assembly`, `direct_io` (booleans); `map` (auto,
///   true, false: host tensors as mappings of their files, `STG_PATH_MAPPED`);
/// - `cufile_mode` (auto, gds, compat, posix), `cufile_lib`, `hipfile_mode` (auto, hipfile,
///   posix), `hipfile_lib`, `hip_lib` (paths);
/// - `select` (a glob; a pattern without `*?[]{}` is a name that must exist), `rows`
///   (`GLOB=START:END` or `GLOB=RANK/PARTS`);
/// - for URLs: `concurrency`, `range_size`, `retries`, `bandwidth`, `store_option`
///   (`KEY=VALUE`, an object_store option; a secret one prints as `<redacted>` in
///   `stg_config_describe`), `allow_redirect` (a host a redirect may lead to besides the one
///   asked for: `cdn.example.com`, `*.example.com` or `*`);
/// - for models on the Hugging Face Hub (`hf://org/name[@revision][/path]`): `cache` (boolean:
///   write them into the Hugging Face cache as they stream, default true), `cache_dir` (path;
///   default `$HF_HUB_CACHE`, else `$HF_HOME/hub`).
///
/// An unknown key or a value that does not parse is `STG_INVALID_ARGUMENT`, the message (naming
/// both) in `stg_config_last_error`, and changes nothing.
///
/// # Safety
/// `config` must be NULL or live; `key` and `value` NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_set(
    config: *mut stg_config,
    key: *const c_char,
    value: *const c_char,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe {
        with_config(config, |c| {
            let (key, value) = match (utf8(key), utf8(value)) {
                (Ok(key), Ok(value)) => (key, value),
                (Err(status), _) | (_, Err(status)) => return status,
            };
            c.set(key, value)
        })
    }
}

/// Copies a description of the configuration's options (every key's value, defaults included,
/// as the library holds them; the `stage` command's `--print-options` prints the same) into
/// `buf` (truncated to `len - 1` bytes and NUL-terminated); `*written` gets the full length.
///
/// # Safety
/// `config` NULL or live; `buf` writable for `len` bytes; `written` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_describe(
    config: *const stg_config,
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe { copy_config_text(config, buf, len, written, |c| c.options.describe()) }
}

/// Chooses the backend: "auto", "host", "cufile" or "hipfile" (`stg_config_set(config,
/// "backend", name)`).
///
/// # Safety
/// `config` must be NULL or live; `name` NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_set_backend(
    config: *mut stg_config,
    name: *const c_char,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe {
        with_config(config, |c| match utf8(name) {
            Ok(name) => c.set("backend", name),
            Err(status) => status,
        })
    }
}

/// Asks for GPU `index` (`stg_config_set(config, "device", "N")`): with backend "auto", a GPU
/// backend runs on it or the load fails with `STG_BACKEND_UNAVAILABLE`; it never falls back to
/// host memory. Without this call the device is "auto" (GPU 0 when a GPU backend runs). `index`
/// is an ordinal as the CUDA driver (or HIP runtime) numbers devices, after
/// `CUDA_VISIBLE_DEVICES`; every device pointer of the load is on it.
///
/// # Safety
/// `config` must be NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_set_device(config: *mut stg_config, index: u32) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe { with_config(config, |c| c.set("device", &index.to_string())) }
}

/// Sets the largest single read (bytes, at least 1); also the staging buffer's size unless
/// `staging_size` is set (`stg_config_set(config, "chunk_size", ...)`).
///
/// # Safety
/// `config` must be NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_set_chunk_size(
    config: *mut stg_config,
    bytes: usize,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe { with_config(config, |c| c.set_positive("chunk_size", bytes as u64)) }
}

/// Sets the size of each device staging buffer for host assembly (bytes, at least 1).
///
/// # Safety
/// `config` must be NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_set_staging_size(
    config: *mut stg_config,
    bytes: usize,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe { with_config(config, |c| c.set_positive("staging_size", bytes as u64)) }
}

/// Sets the headroom: `max(minimum, len / divisor)` (divisor at least 1): the keys
/// `headroom_min` and `headroom_divisor`.
///
/// # Safety
/// `config` must be NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_set_headroom(
    config: *mut stg_config,
    minimum: u64,
    divisor: u64,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe {
        with_config(config, |c| {
            if divisor == 0 {
                return stg_status::STG_INVALID_ARGUMENT;
            }
            match c.set("headroom_min", &minimum.to_string()) {
                stg_status::STG_OK => c.set("headroom_divisor", &divisor.to_string()),
                failed => failed,
            }
        })
    }
}

/// Caps device memory: the host backend's capacity, or a budget replacing a GPU's free-memory
/// figure (`memory_cap`). 0 removes the cap.
///
/// # Safety
/// `config` must be NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_set_device_memory_cap(
    config: *mut stg_config,
    bytes: u64,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe {
        with_config(config, |c| {
            if bytes == 0 {
                c.options.memory_cap = None;
                return stg_status::STG_OK;
            }
            c.set("memory_cap", &bytes.to_string())
        })
    }
}

/// Sets the number of I/O threads (at least 1; 1 reads on the calling thread).
///
/// # Safety
/// `config` must be NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_set_threads(
    config: *mut stg_config,
    threads: u32,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe { with_config(config, |c| c.set_positive("threads", u64::from(threads))) }
}

/// Sets the coalescing threshold: with more than one I/O thread, back-to-back tensors smaller
/// than `bytes` are allocated together and read with one request, then handed out as separate
/// tensors (default 1 MiB; 0 reads every tensor on its own).
///
/// # Safety
/// `config` must be NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_set_coalesce_below(
    config: *mut stg_config,
    bytes: usize,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe { with_config(config, |c| c.set("coalesce_below", &bytes.to_string())) }
}

/// Registers the destination callback and its user data (NULL callback: none).
///
/// # Safety
/// `config` must be NULL or live; the callback must follow `stg_destination_fn`'s contract for
/// every load made from this configuration.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_set_destination(
    config: *mut stg_config,
    callback: stg_destination_fn,
    user_data: *mut c_void,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe {
        with_config(config, |c| {
            c.destination = callback;
            c.user_data = user_data;
            stg_status::STG_OK
        })
    }
}

/// Copies the message of the last `stg_load_new` failure with this configuration into `buf`
/// (truncated to `len - 1` bytes and NUL-terminated); `*written` gets the full length.
///
/// # Safety
/// `config` NULL or live; `buf` writable for `len` bytes; `written` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_last_error(
    config: *const stg_config,
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe {
        copy_config_text(config, buf, len, written, |c| {
            c.last_failure().message.clone()
        })
    }
}

/// Copies the details of the last `stg_load_new` failure with this configuration into `buf`
/// (truncated to `len - 1` bytes and NUL-terminated; `*written` gets the full length): the
/// longer story behind `stg_config_last_error`'s one line, one detail per line (`\n`
/// between them), empty where the message says it all. For `STG_BACKEND_UNAVAILABLE` after a
/// GPU was asked for: each GPU backend passed over, and why (`cufile: no CUDA driver: ...`).
///
/// # Safety
/// `config` NULL or live; `buf` writable for `len` bytes; `written` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_config_last_error_details(
    config: *const stg_config,
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe {
        copy_config_text(config, buf, len, written, |c| {
            c.last_failure().details.join("\n")
        })
    }
}
