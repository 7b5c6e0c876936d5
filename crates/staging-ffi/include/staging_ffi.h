/*
 * staging-ffi: load safetensors checkpoints onto a device from C and C++.
 *
 * Conventions (as rustls-ffi):
 * - Every fallible call returns a stg_status; STG_OK is 0. stg_status_str() names a status.
 * - Out-parameters are written only when the call returns STG_OK.
 * - Handles come in _new/_free pairs; _free(NULL) does nothing.
 * - A NULL handle or out-parameter is STG_NULL_ARGUMENT; a path that is not UTF-8 is
 *   STG_INVALID_UTF8. A panic inside the library is STG_PANIC, never an unwind into C.
 * - After a failure, the full message (file, tensor, offset) is available from the handle that
 *   failed: stg_config_last_error() for stg_load_new(), stg_load_last_error() for the rest.
 *
 * Thread safety:
 * - stg_config: not synchronized; configure from one thread, then it may be shared read-only
 *   by stg_load_new() calls on several threads.
 * - stg_load: use from one thread at a time (it may move between threads). Separate loads are
 *   independent and may run concurrently. The one exception: stg_load_free() from another
 *   thread while stg_load_next() runs gives the handle up at once, and that stg_load_next()
 *   frees the load as it returns, with STG_LOAD_FREED (stg_load_free).
 * - stg_tensor and stg_device_buffer: owned values; they may be used and freed on any thread,
 *   one thread at a time, also after their stg_load was freed.
 * - The destination callback is called on the thread that calls stg_load_next(). From it, the
 *   load's report, backend and last error may be read; stg_load_next() on the same load is
 *   STG_BUSY, and stg_load_free() stops the load instead of freeing it (stg_destination_fn).
 *
 * Device memory (backends cufile and hipfile; the host backend's "device" is host memory):
 * - Which GPU: the ordinal of the option `device` (stg_config_set_device(config, N), "cuda:N",
 *   "hip:N"), numbered as the CUDA driver or HIP runtime numbers devices (after
 *   CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES); "auto" with a GPU backend is GPU 0. Every
 *   device pointer of a load (stg_tensor_info.data, stg_device_buffer_ptr()) is on that GPU.
 * - Which context (CUDA): allocated with cuMemAlloc in that device's primary context
 *   (cuDevicePrimaryCtxRetain), the context the CUDA runtime uses for the device after
 *   cudaSetDevice(N), so the pointer works as is with the runtime API and in that context. The
 *   C ABI takes no context of the caller's. The library keeps the primary context retained
 *   while any tensor or taken buffer of the load lives. It makes its context current only
 *   around its own calls (cuCtxPushCurrent, then cuCtxPopCurrent) and never calls
 *   cuCtxSetCurrent: the calling thread's current context is as it was after every call.
 *   HIP: hipMalloc on device N, with hipSetDevice(N) around the library's calls and the caller's
 *   current device set back after them.
 * - Which stream, and when the bytes are ready: none of the caller's streams is used. cuFile
 *   and hipFile reads (GDS, compat) are synchronous; the POSIX path copies from pinned buffers
 *   with cuMemcpyHtoDAsync / hipMemcpyAsync on streams the library creates and waits for each
 *   copy before the read returns. So when stg_load_next() returns a tensor with STG_OK, all its
 *   bytes are on the device and nothing of the library's writes them any more: any stream may
 *   read them at once, with no event or synchronization. The same holds for a destination
 *   region (STG_PATH_DESTINATION): its bytes are complete when stg_load_next() returns that
 *   tensor. stg_tensor_copy_to_host() is a synchronous cuMemcpyDtoH / hipMemcpy.
 * - A destination region is written from outside any stream: it must be memory of GPU N that
 *   its primary context can use (cudaMalloc after cudaSetDevice(N)), and before the callback
 *   returns it, no work of the caller's may still read or write it (synchronize the stream
 *   that last used it, or that allocated it with cudaMallocAsync).
 * - Freeing: tensors with stg_tensor_free(), taken buffers with stg_device_buffer_free(), on any
 *   thread; never cudaFree/cuMemFree/hipFree a pointer the library gave. The free is not stream
 *   ordered: wait for the caller's own work that reads the memory first.
 * - Shared blocks: with the option `suballocate` (default true) and a load of more than one
 *   tensor, a tensor under 1 MiB on the device path is carved from a shared 32 MiB block (one
 *   cuMemAlloc / hipMalloc), at a 256-byte aligned offset, next to other tensors of the load;
 *   with more than one I/O thread, back-to-back tensors under `coalesce_below` (default 1 MiB)
 *   read together share one allocation the same way, `suballocate` or not. Such a pointer is
 *   not the start of an allocation (cuMemGetAddressRange gives the block): use only
 *   [data, data + bytes), never free it, and expect its block to stay allocated until the last
 *   tensor or taken buffer carved from it is freed (one small tensor kept keeps its whole
 *   block). `suballocate` "false" with `coalesce_below` 0 gives every tensor an allocation of
 *   its own, starting at its pointer.
 */

#ifndef STAGING_FFI_H
#define STAGING_FFI_H

/* Generated by cbindgen from crates/staging-ffi; do not edit. */

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/*
 The result of every fallible call. Numbers are stable.
 */
enum stg_status
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /*
   Success.
   */
  STG_OK = 0,
  /*
   `stg_load_next`: there are no more tensors (the load ended, or failed earlier).
   */
  STG_END = 1,
  /*
   A required pointer argument was NULL.
   */
  STG_NULL_ARGUMENT = 100,
  /*
   A string argument is not valid UTF-8.
   */
  STG_INVALID_UTF8 = 101,
  /*
   An argument or option is out of range, unknown or inconsistent (a backend name, a zero
   size, an unknown key of `stg_config_set`, a backend and device that do not go together),
   or a tensor cannot be used the way asked for.
   */
  STG_INVALID_ARGUMENT = 102,
  /*
   The tensor's device buffer was already taken, or the tensor is not on the device path.
   */
  STG_NOT_A_DEVICE_BUFFER = 103,
  /*
   `stg_tensor_copy_to_host`: the destination length differs from the tensor's.
   */
  STG_LENGTH_MISMATCH = 104,
  /*
   The load is inside `stg_load_next` (a call from its own destination callback):
   `stg_load_next` there, or the `stg_load_next` whose callback called `stg_load_free`.
   */
  STG_BUSY = 105,
  /*
   `stg_load_next`: `stg_load_free` was called on the load from another thread while this
   call ran. The call freed the load on its way out and wrote nothing: the handle is gone.
   */
  STG_LOAD_FREED = 106,
  /*
   A file could not be opened or read while parsing the checkpoint.
   */
  STG_IO = 200,
  /*
   A header or index is malformed or disagrees with the files, or a file is shorter than its
   header says.
   */
  STG_INVALID_CHECKPOINT = 201,
  /*
   A path is not a regular file, or a directory holds no checkpoint.
   */
  STG_NOT_A_CHECKPOINT = 202,
  /*
   A path does not exist.
   */
  STG_NOT_FOUND = 203,
  /*
   A path may not be opened by this process.
   */
  STG_PERMISSION_DENIED = 204,
  /*
   A read failed, or a file changed during the load.
   */
  STG_READ = 300,
  /*
   A device allocation failed with something other than out-of-memory, or no staging
   buffer could be allocated.
   */
  STG_ALLOCATION = 400,
  /*
   Host memory for a host-assembled tensor could not be allocated.
   */
  STG_HOST_ALLOCATION = 401,
  /*
   A device operation (memory query, copy) failed.
   */
  STG_DEVICE = 402,
  /*
   The destination callback returned an error.
   */
  STG_DESTINATION = 500,
  /*
   The destination callback returned a region shorter than the tensor.
   */
  STG_DESTINATION_TOO_SMALL = 501,
  /*
   The requested backend cannot run here (no CUDA driver, no device, no libcufile), or a
   GPU was asked for and none can be used.
   */
  STG_BACKEND_UNAVAILABLE = 600,
  /*
   No longer returned: an option that does not parse or an inconsistent configuration is
   `STG_INVALID_ARGUMENT`. Kept so the number is not reused.
   */
  STG_INVALID_CONFIG = 700,
  /*
   A selection names a tensor the checkpoint does not hold, or rows a tensor does not have.
   */
  STG_SELECTION = 800,
  /*
   The system refused a resource the load needs to run: its threads (a limit on processes
   or threads, memory for their stacks) or descriptors. The message names which.
   */
  STG_RESOURCE = 850,
  /*
   The library panicked; the handle that was in use should be freed.
   */
  STG_PANIC = 900,
  /*
   An invariant of the library did not hold (a bug, reported instead of a panic).
   */
  STG_INTERNAL = 901,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum stg_status stg_status;
#else
typedef uint32_t stg_status;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/*
 The path a tensor took.
 */
enum stg_path
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /*
   Read straight into the caller's destination region.
   */
  STG_PATH_DESTINATION = 0,
  /*
   Read straight into a device buffer of its own.
   */
  STG_PATH_DEVICE = 1,
  /*
   Assembled in host memory.
   */
  STG_PATH_HOST = 2,
  /*
   A private (copy-on-write) mapping of its file in host memory (`map`; device `cpu`):
   `data` is valid until the tensor is freed, and writes to it stay in this process.
   */
  STG_PATH_MAPPED = 3,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum stg_path stg_path;
#else
typedef uint32_t stg_path;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/*
 A tensor's element type, as safetensors names them (`STG_DTYPE_BF16` is "BF16"). Numbers
 are stable. A dtype the library reads but this header has no number for is
 `STG_DTYPE_UNKNOWN`; its name is still in `stg_tensor_info.dtype` and its size in
 `stg_tensor_info.dtype_bits`.
 */
enum stg_dtype
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /*
   A dtype without a number in this header (see `dtype` and `dtype_bits`).
   */
  STG_DTYPE_UNKNOWN = 0,
  /*
   Boolean, one byte per element.
   */
  STG_DTYPE_BOOL = 1,
  /*
   Unsigned 8-bit integer.
   */
  STG_DTYPE_U8 = 2,
  /*
   Signed 8-bit integer.
   */
  STG_DTYPE_I8 = 3,
  /*
   Unsigned 16-bit integer.
   */
  STG_DTYPE_U16 = 4,
  /*
   Signed 16-bit integer.
   */
  STG_DTYPE_I16 = 5,
  /*
   Unsigned 32-bit integer.
   */
  STG_DTYPE_U32 = 6,
  /*
   Signed 32-bit integer.
   */
  STG_DTYPE_I32 = 7,
  /*
   Unsigned 64-bit integer.
   */
  STG_DTYPE_U64 = 8,
  /*
   Signed 64-bit integer.
   */
  STG_DTYPE_I64 = 9,
  /*
   IEEE half precision.
   */
  STG_DTYPE_F16 = 10,
  /*
   bfloat16.
   */
  STG_DTYPE_BF16 = 11,
  /*
   IEEE single precision.
   */
  STG_DTYPE_F32 = 12,
  /*
   IEEE double precision.
   */
  STG_DTYPE_F64 = 13,
  /*
   Complex of two 32-bit floats (64 bits).
   */
  STG_DTYPE_C64 = 14,
  /*
   FP8 E4M3.
   */
  STG_DTYPE_F8_E4M3 = 15,
  /*
   FP8 E5M2.
   */
  STG_DTYPE_F8_E5M2 = 16,
  /*
   FP8 E8M0 (microscaling scale).
   */
  STG_DTYPE_F8_E8M0 = 17,
  /*
   FP8 E4M3, FNUZ variant.
   */
  STG_DTYPE_F8_E4M3FNUZ = 18,
  /*
   FP8 E5M2, FNUZ variant.
   */
  STG_DTYPE_F8_E5M2FNUZ = 19,
  /*
   MXFP4 (4 bits: two elements per byte).
   */
  STG_DTYPE_F4 = 20,
  /*
   MXFP6 E2M3 (6 bits: four elements per three bytes).
   */
  STG_DTYPE_F6_E2M3 = 21,
  /*
   MXFP6 E3M2 (6 bits: four elements per three bytes).
   */
  STG_DTYPE_F6_E3M2 = 22,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum stg_dtype stg_dtype;
#else
typedef uint32_t stg_dtype;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/*
 What a target of `stg_load_into` holds when it returns.
 */
enum stg_target_state
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /*
   Its old bytes: never written (nothing is written when the checkpoint does not fit).
   */
  STG_TARGET_UNCHANGED = 0,
  /*
   The checkpoint's bytes, whole.
   */
  STG_TARGET_WRITTEN = 1,
  /*
   Writing began and did not end (the load failed meanwhile): some bytes may be new, some
   old. Load it again.
   */
  STG_TARGET_PARTLY_WRITTEN = 2,
  /*
   The checkpoint has no tensor of its name (an error when `strict`).
   */
  STG_TARGET_MISSING = 3,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum stg_target_state stg_target_state;
#else
typedef uint32_t stg_target_state;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/*
 Load settings. Create with `stg_config_new`, free with `stg_config_free`.
 */
typedef struct stg_config stg_config;

/*
 A device buffer the caller took from a tensor; free with `stg_device_buffer_free`.
 */
typedef struct stg_device_buffer stg_device_buffer;

/*
 A load in progress: yields tensors in file order.

 Every entry point takes it by shared reference, so that a destination callback running
 inside `stg_load_next` may call the others on it: the load itself is locked only by
 `stg_load_next` (for the whole call), and what the other calls read (`shared`) is never
 locked across the callback.
 */
typedef struct stg_load stg_load;

/*
 A partition plan: which rank of a group reads which piece of every tensor. Create with
 `stg_plan_new`, free with `stg_plan_free`.
 */
typedef struct stg_plan stg_plan;

/*
 One staged tensor, owning its bytes (or naming the destination it filled).
 */
typedef struct stg_tensor stg_tensor;

/*
 A tensor as the library describes it. Strings and the shape stay valid while the tensor (or,
 inside a destination callback, the call) lives.
 */
typedef struct stg_tensor_info {
  /*
   The tensor's name, NUL-terminated.
   */
  const char *name;
  /*
   The dtype as safetensors writes it ("BF16"), NUL-terminated; its number is `dtype_id`.
   */
  const char *dtype;
  /*
   `ndim` dimensions.
   */
  const uint64_t *shape;
  /*
   Number of dimensions.
   */
  size_t ndim;
  /*
   Length in bytes.
   */
  size_t bytes;
  /*
   The file that holds it, NUL-terminated.
   */
  const char *file;
  /*
   Its byte offset in the file.
   */
  uint64_t file_offset;
  /*
   The path it took (unset, 0, inside a destination callback).
   */
  stg_path path;
  /*
   Where its bytes are: a device pointer (device path), a host pointer (host path, which
   the caller may write: it is the tensor's own memory), or the destination region's start.
   NULL inside a destination callback, and for an empty tensor on the host path.
   A device pointer is on the load's GPU, in its primary context, its bytes complete when
   `stg_load_next` returned the tensor; a small one may be carved from a shared block: see
   "Device memory" at the top of this header.
   */
  void *data;
  /*
   The dtype's number (`STG_DTYPE_UNKNOWN` for one this header does not number).
   */
  stg_dtype dtype_id;
  /*
   Bits per element, for every dtype the library reads (numbered or not): 4 for F4, 6 for
   the F6 types, 16 for BF16. `bytes` is `elements * dtype_bits / 8`.
   */
  uint32_t dtype_bits;
} stg_tensor_info;

/*
 The destination callback: asked once per tensor, in file order, before anything is
 allocated for it. To take the tensor, set `*region` to memory of the load's device (host
 memory for the `host` backend, CUDA device memory for `cufile`, HIP for `hipfile`) of
 `*capacity` bytes and return `STG_OK` (0); the memory must stay valid and untouched by the
 caller until `stg_load_next` returns that tensor (or fails). On a GPU the library writes the
 region from outside any stream: it must be memory of the load's GPU usable in its primary
 context, no work of the caller's may still use it when the callback returns it, and its
 bytes are complete when `stg_load_next` returns the tensor ("Device memory" at the top of
 this header). Leave `*region` NULL to decline.
 Any other value, a `stg_status` or not, aborts the load with `STG_DESTINATION`.

 What the callback may do with the load whose `stg_load_next` called it:
 - `stg_load_report`, `stg_load_backend`, `stg_load_last_error`: allowed; the report is the
   one as of the last tensor `stg_load_next` returned.
 - `stg_load_next`: returns `STG_BUSY` at once and writes nothing.
 - `stg_load_free`: does not free. The load stops before the tensor being asked for is read,
   the `stg_load_next` in progress returns `STG_BUSY` (its message says why), and the handle
   stays valid: free it after `stg_load_next` returns. To stop a load from the callback,
   returning a non-zero value is the plain way. (From another thread, `stg_load_free` does
   free: see there.)
 */
typedef uint32_t (*stg_destination_fn)(void *user_data,
                                       const struct stg_tensor_info *tensor,
                                       void **region,
                                       size_t *capacity);

/*
 One piece of a plan. `name` stays valid while the plan lives.
 */
typedef struct stg_plan_piece {
  /*
   The tensor's name, NUL-terminated.
   */
  const char *name;
  /*
   The tensor's position in the checkpoint (file order).
   */
  size_t tensor_index;
  /*
   Whether the piece is the whole tensor; otherwise it holds rows `row_start..row_end` of
   dimension 0.
   */
  bool whole;
  /*
   First row held (0 for a whole tensor).
   */
  size_t row_start;
  /*
   One past the last row held (0 for a whole tensor).
   */
  size_t row_end;
  /*
   Where the piece starts in the tensor's bytes.
   */
  uint64_t offset;
  /*
   The piece's length in bytes.
   */
  uint64_t len;
  /*
   The rank that reads it.
   */
  size_t owner;
} stg_plan_piece;

/*
 Totals of a load, as `stg_load_report` gives them.
 */
typedef struct stg_report {
  /*
   Files in the checkpoint.
   */
  size_t files;
  /*
   Tensors staged so far.
   */
  size_t tensors;
  /*
   Bytes staged so far.
   */
  uint64_t bytes;
  /*
   Seconds from the first tensor asked for to the last one staged.
   */
  double seconds;
  /*
   `bytes / seconds`.
   */
  double bytes_per_second;
  /*
   Tensors and bytes per path.
   */
  size_t destination_tensors;
  /*
   Bytes read into destinations.
   */
  uint64_t destination_bytes;
  /*
   Tensors on the device path.
   */
  size_t device_tensors;
  /*
   Bytes on the device path.
   */
  uint64_t device_bytes;
  /*
   Tensors on the host path.
   */
  size_t host_tensors;
  /*
   Bytes on the host path.
   */
  uint64_t host_bytes;
  /*
   Host-path tensors because free memory was short.
   */
  size_t fallbacks_insufficient_memory;
  /*
   Host-path tensors because the allocation failed after the check passed.
   */
  size_t fallbacks_allocation_race;
  /*
   The most device bytes the library held at once.
   */
  uint64_t peak_device_bytes;
  /*
   The most host bytes the library held at once.
   */
  uint64_t peak_host_bytes;
  /*
   Read calls made to the backend (one per chunk or per run of coalesced small tensors,
   plus one per short read continued).
   */
  uint64_t read_requests;
  /*
   Bytes the backend read from storage (for a full load, equal to `bytes`).
   */
  uint64_t bytes_read;
  /*
   Device bytes the caller took with `stg_tensor_take_device_buffer` (the caller's from
   then on, counted against a device-memory cap until freed).
   */
  uint64_t taken_device_bytes;
} stg_report;

/*
 One tensor's memory for `stg_load_into`, and what it must hold.
 */
typedef struct stg_target {
  /*
   The tensor's name in the checkpoint, NUL-terminated UTF-8.
   */
  const char *name;
  /*
   Its memory: of the load's device (host memory for the `host` backend, CUDA device
   memory for `cufile`, HIP for `hipfile`), writable, `len` bytes.
   */
  void *data;
  /*
   Bytes: the checkpoint's tensor must have exactly this many.
   */
  size_t len;
  /*
   The dtype to check it against (a `stg_dtype`), or `STG_DTYPE_UNKNOWN` (0) for none.
   */
  uint32_t dtype;
  /*
   The shape to check it against (`ndim` values), or NULL for none.
   */
  const uint64_t *shape;
  /*
   The number of values in `shape`.
   */
  size_t ndim;
  /*
   Written by `stg_load_into`: a `stg_target_state`.
   */
  uint32_t state;
} stg_target;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/*
 A static, NUL-terminated description of `status`; a number that is no `stg_status` gets
 "unknown status".
 */
const char *stg_status_str(uint32_t status);

/*
 The library's version, static and NUL-terminated.
 */
const char *stg_version(void);

/*
 Creates a configuration with the library's defaults (those of `stg_config_set`'s keys):
 backend "auto", device "auto" (a GPU when one is usable, else host memory), the staging
 policy's and the remote reader's defaults, every tensor, no destination.

 # Safety
 `out` must be NULL or valid for a write.
 */
stg_status stg_config_new(struct stg_config **out);

/*
 Frees a configuration. NULL does nothing.

 # Safety
 `config` must be NULL or a pointer from `stg_config_new` not yet freed.
 */
void stg_config_free(struct stg_config *config);

/*
 Sets one option by its key, the value spelled as the `stage` command's flag `--KEY` takes it
 (sizes like "512MiB", booleans "true"/"false"); a repeatable key (`select`, `rows`,
 `store_option`, `allow_redirect`) adds one more. The keys, as the library's
 options table defines them (docs/reference/options.md lists each with its default):

 - `backend`: auto, host, cufile, hipfile (mock only in builds with it);
 - `device`: auto (a GPU when one is usable, else host memory), cpu, cuda, cuda:N or N (a GPU,
   or `STG_BACKEND_UNAVAILABLE`, each backend passed over and why in
   `stg_config_last_error_details`), hip or hip:N (hipFile only);
 - `memory_cap` (alias `device_memory`), `chunk_size` (also the staging size unless `staging_size` is set),
   `staging_size`, `headroom_min` (sizes); `headroom_divisor`, `threads`, `staging_slots`
   (counts); `coalesce_below` (size); `suballocate`, `host_assembly`, `direct_io` (booleans); `map` (auto,
   true, false: host tensors as mappings of their files, `STG_PATH_MAPPED`);
 - `cufile_mode` (auto, gds, compat, posix), `cufile_lib`, `hipfile_mode` (auto, hipfile,
   posix), `hipfile_lib`, `hip_lib` (paths);
 - `select` (a glob; a pattern without `*?[]{}` is a name that must exist), `rows`
   (`GLOB=START:END` or `GLOB=RANK/PARTS`);
 - for URLs: `concurrency`, `range_size`, `retries`, `bandwidth`, `store_option`
   (`KEY=VALUE`, an object_store option; a secret one prints as `<redacted>` in
   `stg_config_describe`), `allow_redirect` (a host a redirect may lead to besides the one
   asked for: `cdn.example.com`, `*.example.com` or `*`);
 - for models on the Hugging Face Hub (`hf://org/name[@revision][/path]`): `cache` (boolean:
   write them into the Hugging Face cache as they stream, default true), `cache_dir` (path;
   default `$HF_HUB_CACHE`, else `$HF_HOME/hub`).

 An unknown key or a value that does not parse is `STG_INVALID_ARGUMENT`, the message (naming
 both) in `stg_config_last_error`, and changes nothing.

 # Safety
 `config` must be NULL or live; `key` and `value` NULL or NUL-terminated.
 */
stg_status stg_config_set(struct stg_config *config,
                          const char *key,
                          const char *value);

/*
 Copies a description of the configuration's options (every key's value, defaults included,
 as the library holds them; the `stage` command's `--print-options` prints the same) into
 `buf` (truncated to `len - 1` bytes and NUL-terminated); `*written` gets the full length.

 # Safety
 `config` NULL or live; `buf` writable for `len` bytes; `written` valid for a write.
 */
stg_status stg_config_describe(const struct stg_config *config,
                               char *buf,
                               size_t len,
                               size_t *written);

/*
 Chooses the backend: "auto", "host", "cufile" or "hipfile" (`stg_config_set(config,
 "backend", name)`).

 # Safety
 `config` must be NULL or live; `name` NULL or NUL-terminated.
 */
stg_status stg_config_set_backend(struct stg_config *config, const char *name);

/*
 Asks for GPU `index` (`stg_config_set(config, "device", "N")`): with backend "auto", a GPU
 backend runs on it or the load fails with `STG_BACKEND_UNAVAILABLE`; it never falls back to
 host memory. Without this call the device is "auto" (GPU 0 when a GPU backend runs). `index`
 is an ordinal as the CUDA driver (or HIP runtime) numbers devices, after
 `CUDA_VISIBLE_DEVICES`; every device pointer of the load is on it.

 # Safety
 `config` must be NULL or live.
 */
stg_status stg_config_set_device(struct stg_config *config, uint32_t index);

/*
 Sets the largest single read (bytes, at least 1); also the staging buffer's size unless
 `staging_size` is set (`stg_config_set(config, "chunk_size", ...)`).

 # Safety
 `config` must be NULL or live.
 */
stg_status stg_config_set_chunk_size(struct stg_config *config, size_t bytes);

/*
 Sets the size of each device staging buffer for host assembly (bytes, at least 1).

 # Safety
 `config` must be NULL or live.
 */
stg_status stg_config_set_staging_size(struct stg_config *config, size_t bytes);

/*
 Sets the headroom: `max(minimum, len / divisor)` (divisor at least 1): the keys
 `headroom_min` and `headroom_divisor`.

 # Safety
 `config` must be NULL or live.
 */
stg_status stg_config_set_headroom(struct stg_config *config, uint64_t minimum, uint64_t divisor);

/*
 Caps device memory: the host backend's capacity, or a budget replacing a GPU's free-memory
 figure (`memory_cap`). 0 removes the cap.

 # Safety
 `config` must be NULL or live.
 */
stg_status stg_config_set_device_memory_cap(struct stg_config *config, uint64_t bytes);

/*
 Sets the number of I/O threads (at least 1; 1 reads on the calling thread).

 # Safety
 `config` must be NULL or live.
 */
stg_status stg_config_set_threads(struct stg_config *config, uint32_t threads);

/*
 Sets the coalescing threshold: with more than one I/O thread, back-to-back tensors smaller
 than `bytes` are allocated together and read with one request, then handed out as separate
 tensors (default 1 MiB; 0 reads every tensor on its own).

 # Safety
 `config` must be NULL or live.
 */
stg_status stg_config_set_coalesce_below(struct stg_config *config, size_t bytes);

/*
 Registers the destination callback and its user data (NULL callback: none).

 # Safety
 `config` must be NULL or live; the callback must follow `stg_destination_fn`'s contract for
 every load made from this configuration.
 */
stg_status stg_config_set_destination(struct stg_config *config,
                                      stg_destination_fn callback,
                                      void *user_data);

/*
 Copies the message of the last `stg_load_new` failure with this configuration into `buf`
 (truncated to `len - 1` bytes and NUL-terminated); `*written` gets the full length.

 # Safety
 `config` NULL or live; `buf` writable for `len` bytes; `written` valid for a write.
 */
stg_status stg_config_last_error(const struct stg_config *config,
                                 char *buf,
                                 size_t len,
                                 size_t *written);

/*
 Copies the details of the last `stg_load_new` failure with this configuration into `buf`
 (truncated to `len - 1` bytes and NUL-terminated; `*written` gets the full length): the
 longer story behind `stg_config_last_error`'s one line, one detail per line (`\n`
 between them), empty where the message says it all. For `STG_BACKEND_UNAVAILABLE` after a
 GPU was asked for: each GPU backend passed over, and why (`cufile: no CUDA driver: ...`).

 # Safety
 `config` NULL or live; `buf` writable for `len` bytes; `written` valid for a write.
 */
stg_status stg_config_last_error_details(const struct stg_config *config,
                                         char *buf,
                                         size_t len,
                                         size_t *written);

/*
 Plans how a group of `ranks` ranks reads the checkpoint at `path` (what `stg_load_new` takes:
 a directory, an index, a file, or the same at an `s3://`, `gs://`, `az://` or `http(s)://`
 URL, read with the configuration's remote options) once between them: every
 tensor (or, for one straddling two ranks' shares, every row range of it) gets an owner rank,
 each rank about `total / ranks` bytes. Every rank computes the same plan from the same
 checkpoint; compare `stg_plan_fingerprint` across ranks to be sure. On failure `*out` is
 untouched and the message is available from `stg_config_last_error`.

 # Safety
 `config` NULL or live; `path` NULL or NUL-terminated; `out` NULL or valid for a write.
 */
stg_status stg_plan_new(const struct stg_config *config,
                        const char *path,
                        size_t ranks,
                        struct stg_plan **out);

/*
 Frees a plan. NULL does nothing.

 # Safety
 `plan` must be NULL or a pointer from `stg_plan_new` not yet freed.
 */
void stg_plan_free(struct stg_plan *plan);

/*
 The number of pieces (0 for NULL).

 # Safety
 `plan` must be NULL or live.
 */
size_t stg_plan_len(const struct stg_plan *plan);

/*
 Describes piece `index` (in checkpoint order; the order every rank exchanges them in).

 # Safety
 `plan` NULL or live; `out` NULL or valid for a write.
 */
stg_status stg_plan_get_piece(const struct stg_plan *plan,
                              size_t index,
                              struct stg_plan_piece *out);

/*
 The bytes rank `rank` reads under the plan (0 for NULL or a rank outside the group).

 # Safety
 `plan` must be NULL or live.
 */
uint64_t stg_plan_rank_bytes(const struct stg_plan *plan, size_t rank);

/*
 A hash of the checkpoint's tensors and the assignment, the same in every build: equal on two
 ranks exactly when they planned the same (0 for NULL).

 # Safety
 `plan` must be NULL or live.
 */
uint64_t stg_plan_fingerprint(const struct stg_plan *plan);

/*
 Makes loads opened with `config` read only what `rank` owns under `plan`: its tensors, and
 the rows of those split between ranks. The plan may be freed afterwards.

 # Safety
 `config` NULL or live; `plan` NULL or live.
 */
stg_status stg_config_set_plan_rank(struct stg_config *config,
                                    const struct stg_plan *plan,
                                    size_t rank);

/*
 Opens the checkpoint at `path` (a directory, an index file, or a .safetensors file) with
 `config`'s backend and settings. On failure `*out` is untouched and the message is available
 from `stg_config_last_error`.

 # Safety
 `config` NULL or live; `path` NULL or NUL-terminated; `out` NULL or valid for a write.
 */
stg_status stg_load_new(const struct stg_config *config, const char *path, struct stg_load **out);

/*
 Frees a load and everything it still holds (tensors already returned stay valid). NULL does
 nothing. It never blocks and never fails, so a destructor may call it.

 While a `stg_load_next` on the load is running:
 - called from that call's own destination callback, it does not free: the load stops and
   the `stg_load_next` returns `STG_BUSY`; the handle stays valid, to be freed after it
   returns (see `stg_destination_fn`);
 - called from another thread, it frees all the same, when that call ends: the handle is
   given up at once (this thread must not use it again); the load stops as soon as its
   destination callback, if it has one, returns (before that tensor is read); and the running
   `stg_load_next` frees it as it returns, with `STG_LOAD_FREED` and nothing written (a tensor
   it had staged is freed with the load). The thread that called `stg_load_next` must not use
   the handle after that status. Nothing leaks, whichever of the two calls finishes first; a
   free that comes after `stg_load_next` returned is an ordinary free, of which that thread
   must learn by the caller's own means. The destination callback is not called again once
   `stg_load_free` has begun, but one call already in progress on the other thread may still
   be running when it returns: keep the callback's `user_data` valid until that thread's
   `stg_load_next` has returned.

 # Safety
 `load` must be NULL or a pointer from `stg_load_new` not yet freed.
 */
void stg_load_free(struct stg_load *load);

/*
 Stages the next tensor in file order. `STG_OK` writes `*out` (free it with
 `stg_tensor_free`); `STG_END` means the load is over; any other status is the load's error
 (its message from `stg_load_last_error`), after which the load only returns `STG_END`.

 Called from the load's own destination callback it returns `STG_BUSY` and writes nothing.
 When another thread called `stg_load_free` on the load meanwhile, it frees the load as it
 returns: `STG_LOAD_FREED`, nothing written, and the handle is gone (see `stg_load_free`).

 # Safety
 `load` NULL or live and not used by another thread meanwhile (but for `stg_load_free`, as
 documented there); `out` NULL or writable.
 */
stg_status stg_load_next(struct stg_load *load, struct stg_tensor **out);

/*
 Writes the load's report so far into `*out`.

 # Safety
 `load` NULL or live; `out` NULL or writable.
 */
stg_status stg_load_report(struct stg_load *load, struct stg_report *out);

/*
 The backend's name ("host", "cufile", "hipfile") and mode ("posix", "compat", ...), NUL-terminated,
 valid until the next call with this load or its free; NULL for a NULL load.

 # Safety
 `load` NULL or live.
 */
const char *stg_load_backend(struct stg_load *load, const char **mode);

/*
 Copies the message of the load's last failure (file, tensor, offset) into `buf`; see
 `stg_config_last_error` for the buffer rules.

 # Safety
 `load` NULL or live; `buf` writable for `len` bytes; `written` valid for a write.
 */
stg_status stg_load_last_error(const struct stg_load *load, char *buf, size_t len, size_t *written);

/*
 Reads the checkpoint at `path` into `targets` (`count` of them), in place: a model's
 weights reloaded into the memory that holds them, with `config`'s backend and settings
 (its destination callback, if any, is not used: the targets are the destination; its
 `rows` narrow the checkpoint's tensors, for a rank's part).

 First every header is read and every target checked: the checkpoint's tensor must have
 exactly `len` bytes, and the target's `dtype` and `shape` where given. A mismatch, or with
 `strict` a target the checkpoint lacks or a tensor of the checkpoint no target takes,
 returns `STG_SELECTION` and writes nothing (the message, from `stg_config_last_error`,
 lists every problem); so do targets whose memory overlaps another's (a fused `qkv` and a
 view of its rows). Then each tensor is read straight into its target.

 Every target's `state` is written (`STG_TARGET_UNCHANGED` first, whatever happens):
 `STG_TARGET_WRITTEN` for each one loaded, `STG_TARGET_MISSING` for one the checkpoint lacks,
 unchanged for one the configuration's selection leaves out. When the load fails after writing
 began, the status is the failure's and the states say exactly which targets hold the
 checkpoint's bytes, which may hold some (`STG_TARGET_PARTLY_WRITTEN`) and which are
 unchanged. `*unexpected` (if not NULL) gets the number of the checkpoint's tensors no
 target takes; `*report` (if not NULL) the load's report on success.

 # Safety
 `config` NULL or live; `path` NULL or NUL-terminated; `targets` NULL or `count` valid,
 writable `stg_target`s whose `name`s are NUL-terminated, whose `shape`s (when not NULL)
 hold `ndim` values, and whose `data` are `len` writable bytes of the load's device memory,
 untouched by anything else until this returns; `unexpected` and `report` NULL or writable.
 */
stg_status stg_load_into(const struct stg_config *config,
                         const char *path,
                         struct stg_target *targets,
                         size_t count,
                         bool strict,
                         size_t *unexpected,
                         struct stg_report *report);

/*
 Bits per element of `dtype` (4 for `STG_DTYPE_F4`, 16 for `STG_DTYPE_BF16`); 0 for
 `STG_DTYPE_UNKNOWN` and for a number that is no `stg_dtype`. A tensor of `n` elements is
 `n * bits / 8` bytes (safetensors stores sub-byte dtypes packed, with no padding).
 */
uint32_t stg_dtype_bits(uint32_t dtype);

/*
 Describes the tensor; the strings and shape stay valid until the tensor is freed.

 # Safety
 `tensor` NULL or live; `out` NULL or writable.
 */
stg_status stg_tensor_describe(const struct stg_tensor *tensor, struct stg_tensor_info *out);

/*
 Copies the tensor's bytes into `dst` (`len` must equal its length), from the device for
 device-path tensors. A destination-path tensor's bytes are the caller's: `STG_INVALID_ARGUMENT`.

 # Safety
 `tensor` NULL or live; `dst` writable for `len` bytes (or NULL when `len` is 0).
 */
stg_status stg_tensor_copy_to_host(const struct stg_tensor *tensor, void *dst, size_t len);

/*
 Takes ownership of a device-path tensor's buffer: `*out` must later be freed with
 `stg_device_buffer_free` (freeing the tensor no longer frees it). From then on the bytes are
 the caller's: the load's report counts them in `taken_device_bytes`, not in the library's
 peak, and a device-memory cap keeps counting them as used until the buffer is freed. A second
 take, or a tensor on another path, is `STG_NOT_A_DEVICE_BUFFER`.

 The buffer is the same memory as the tensor's `data` (on the load's GPU, in its primary
 context, its bytes complete): taking moves no byte. A tensor carved from a shared block
 stays carved: its buffer keeps the block allocated until it is freed, and its pointer is not
 the start of an allocation ("Device memory" at the top of this header).

 # Safety
 `tensor` NULL or live; `out` NULL or writable.
 */
stg_status stg_tensor_take_device_buffer(struct stg_tensor *tensor, struct stg_device_buffer **out);

/*
 Frees a tensor and the bytes it owns (not a buffer taken from it, not a destination). NULL
 does nothing.

 # Safety
 `tensor` must be NULL or a pointer from `stg_load_next` not yet freed.
 */
void stg_tensor_free(struct stg_tensor *tensor);

/*
 The device pointer of a taken buffer (NULL for NULL or an empty buffer): GPU memory of the
 load's device, valid in its primary context, until `stg_device_buffer_free`.

 # Safety
 `buffer` NULL or live.
 */
void *stg_device_buffer_ptr(const struct stg_device_buffer *buffer);

/*
 The length in bytes of a taken buffer (0 for NULL).

 # Safety
 `buffer` NULL or live.
 */
size_t stg_device_buffer_len(const struct stg_device_buffer *buffer);

/*
 Frees a taken device buffer (its own allocation, or its piece of a shared block, which is
 freed with its last piece). Not stream ordered: the caller's work reading the memory must
 have finished. NULL does nothing.

 # Safety
 `buffer` must be NULL or a pointer from `stg_tensor_take_device_buffer` not yet freed.
 */
void stg_device_buffer_free(struct stg_device_buffer *buffer);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* STAGING_FFI_H */
