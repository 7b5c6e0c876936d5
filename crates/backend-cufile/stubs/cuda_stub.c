/* A stand-in for libcuda.so for tests on machines without a GPU: "device memory" is host memory
 * from malloc, so the backend's real code runs end to end. Only the driver calls the backend makes
 * are exported. Behaviour is set by environment variables read at each call:
 *   STUB_CUDA_DEVICES      device count (default 1; stub_cuda_set_devices() overrides it)
 *   STUB_CUDA_TOTAL_MIB    device memory in MiB (default 1024)
 *   STUB_CUDA_INIT_ERROR   CUresult cuInit returns (default 0)
 * Asynchronous copies are deferred until their stream is synchronized (deferred_stream.h, in
 * backend-gds); stub_cuda_async_copies() counts those performed.
 *
 * Contexts are modelled as the driver keeps them: each device has one primary context (a token),
 * each thread a stack of current contexts (cuCtxSetCurrent replaces its top, cuCtxPushCurrent
 * and cuCtxPopCurrent push and pop). Calls that need a context fail with
 * CUDA_ERROR_INVALID_CONTEXT (201) when the thread has none, and every allocation remembers the
 * context it was made in: a free or copy of it made while another context is current is counted
 * by stub_cuda_wrong_context(). stub_cuda_ctx_pushes(), _pops() and _sets() count those calls, so
 * a test can tell that the library saved and restored the caller's context rather than replaced
 * it; stub_cuda_ctx_depth() is the calling thread's stack depth, and stub_cuda_fail_pushes(n)
 * makes the calling thread's next n cuCtxPushCurrent calls fail (CUDA_ERROR_INVALID_CONTEXT), as
 * a driver that cannot make a context current would. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deferred_stream.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static size_t used = 0;

static long env_long(const char *name, long fallback) {
    const char *v = getenv(name);
    return v ? atol(v) : fallback;
}

#define MAX_DEVICES 8
#define MAX_STACK 64
static int context_tokens[MAX_DEVICES];
static __thread CUcontext ctx_stack[MAX_STACK];
static __thread int ctx_depth;
static __thread int pushes_to_fail;
static long devices_override = -1;
static size_t ctx_pushes, ctx_pops, ctx_sets, wrong_context;

static long device_count(void) {
    long n = __atomic_load_n(&devices_override, __ATOMIC_RELAXED);
    n = n >= 0 ? n : env_long("STUB_CUDA_DEVICES", 1);
    return n > MAX_DEVICES ? MAX_DEVICES : n;
}
void stub_cuda_set_devices(long n) { __atomic_store_n(&devices_override, n, __ATOMIC_RELAXED); }

static int is_context(CUcontext ctx) {
    for (int i = 0; i < MAX_DEVICES; i++)
        if (ctx == &context_tokens[i]) return 1;
    return 0;
}
static CUcontext current(void) { return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL; }
#define NEED_CONTEXT() do { if (!current()) return 201; /* INVALID_CONTEXT */ } while (0)

size_t stub_cuda_ctx_pushes(void) { return __atomic_load_n(&ctx_pushes, __ATOMIC_RELAXED); }
size_t stub_cuda_ctx_pops(void) { return __atomic_load_n(&ctx_pops, __ATOMIC_RELAXED); }
size_t stub_cuda_ctx_sets(void) { return __atomic_load_n(&ctx_sets, __ATOMIC_RELAXED); }
size_t stub_cuda_wrong_context(void) { return __atomic_load_n(&wrong_context, __ATOMIC_RELAXED); }
/* The calling thread's context stack depth. */
size_t stub_cuda_ctx_depth(void) { return (size_t)ctx_depth; }
/* The calling thread's next `n` cuCtxPushCurrent calls fail. */
void stub_cuda_fail_pushes(int n) { pushes_to_fail = n; }

static size_t total_bytes(void) { return (size_t)env_long("STUB_CUDA_TOTAL_MIB", 1024) << 20; }

CUresult cuInit(unsigned flags) { (void)flags; return (CUresult)env_long("STUB_CUDA_INIT_ERROR", 0); }
CUresult cuDeviceGetCount(int *count) { *count = (int)device_count(); return 0; }
CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= device_count()) return 101; /* INVALID_DEVICE */
    *dev = ordinal;
    return 0;
}
static size_t primary_retains;
/* Primary-context retains so far. */
size_t stub_cuda_primary_retains(void) { return __atomic_load_n(&primary_retains, __ATOMIC_RELAXED); }
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (dev < 0 || dev >= device_count()) return 101;
    __atomic_fetch_add(&primary_retains, 1, __ATOMIC_RELAXED);
    *ctx = &context_tokens[dev];
    return 0;
}
static size_t primary_releases;
/* Primary-context releases so far. */
size_t stub_cuda_primary_releases(void) { return __atomic_load_n(&primary_releases, __ATOMIC_RELAXED); }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { (void)dev; __atomic_fetch_add(&primary_releases, 1, __ATOMIC_RELAXED); return 0; }
CUresult cuCtxSetCurrent(CUcontext ctx) {
    __atomic_fetch_add(&ctx_sets, 1, __ATOMIC_RELAXED);
    if (ctx == NULL) {
        if (ctx_depth > 0) ctx_depth--;
        return 0;
    }
    if (!is_context(ctx)) return 201; /* INVALID_CONTEXT */
    if (ctx_depth == 0) ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = ctx;
    return 0;
}
CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    if (!is_context(ctx)) return 201;
    if (pushes_to_fail > 0) { pushes_to_fail--; return 201; }
    if (ctx_depth == MAX_STACK) return 999;
    __atomic_fetch_add(&ctx_pushes, 1, __ATOMIC_RELAXED);
    ctx_stack[ctx_depth++] = ctx;
    return 0;
}
CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
    if (ctx_depth == 0) return 201;
    __atomic_fetch_add(&ctx_pops, 1, __ATOMIC_RELAXED);
    CUcontext top = ctx_stack[--ctx_depth];
    if (ctx) *ctx = top;
    return 0;
}
CUresult cuCtxGetCurrent(CUcontext *ctx) { *ctx = current(); return 0; }
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    NEED_CONTEXT();
    pthread_mutex_lock(&mu);
    *total = total_bytes();
    *free_bytes = *total > used ? *total - used : 0;
    pthread_mutex_unlock(&mu);
    return 0;
}
/* Every live allocation has a 64-byte header: its size, its context and links in a list of live
 * ones. */
struct stub_alloc { size_t n; CUcontext ctx; struct stub_alloc *prev, *next; };
static struct stub_alloc live = {0, NULL, &live, &live};
/* Counts a use of device memory at `ptr` while a context other than its own is current. */
static void check_context_of(CUdeviceptr ptr) {
    CUcontext ctx = NULL;
    int found = 0;
    pthread_mutex_lock(&mu);
    for (struct stub_alloc *a = live.next; a != &live; a = a->next) {
        char *start = (char *)a + 64;
        if ((char *)(uintptr_t)ptr >= start && (char *)(uintptr_t)ptr <= start + a->n) { ctx = a->ctx; found = 1; break; }
    }
    pthread_mutex_unlock(&mu);
    if (found && ctx != current()) __atomic_fetch_add(&wrong_context, 1, __ATOMIC_RELAXED);
}
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t n) {
    NEED_CONTEXT();
    pthread_mutex_lock(&mu);
    if (used + n > total_bytes()) { pthread_mutex_unlock(&mu); return 2; /* OUT_OF_MEMORY */ }
    char *raw = malloc(n + 64);
    if (!raw) { pthread_mutex_unlock(&mu); return 2; }
    struct stub_alloc *a = (struct stub_alloc *)raw;
    a->n = n;
    a->ctx = current();
    a->prev = &live; a->next = live.next; live.next->prev = a; live.next = a;
    used += n;
    pthread_mutex_unlock(&mu);
    *ptr = (CUdeviceptr)(uintptr_t)(raw + 64);
    return 0;
}
CUresult cuMemFree_v2(CUdeviceptr ptr) {
    NEED_CONTEXT();
    if (!ptr) return 0;
    check_context_of(ptr);
    struct stub_alloc *a = (struct stub_alloc *)((char *)(uintptr_t)ptr - 64);
    pthread_mutex_lock(&mu);
    used -= a->n;
    a->prev->next = a->next; a->next->prev = a->prev;
    pthread_mutex_unlock(&mu);
    free(a);
    return 0;
}
/* The size of the live allocation starting at `ptr`, or 0 when there is none (for tests that
 * check what was freed, whatever other tests allocate meanwhile). */
size_t stub_cuda_live_allocation(CUdeviceptr ptr) {
    size_t n = 0;
    pthread_mutex_lock(&mu);
    for (struct stub_alloc *a = live.next; a != &live; a = a->next)
        if ((CUdeviceptr)(uintptr_t)((char *)a + 64) == ptr) { n = a->n; break; }
    pthread_mutex_unlock(&mu);
    return n;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    NEED_CONTEXT();
    check_context_of(src);
    memcpy(dst, (void *)(uintptr_t)src, n);
    return 0;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    NEED_CONTEXT();
    check_context_of(dst);
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}
static size_t host_allocs;
/* Pinned host allocations so far. */
size_t stub_cuda_host_allocs(void) { return __atomic_load_n(&host_allocs, __ATOMIC_RELAXED); }
CUresult cuMemHostAlloc(void **ptr, size_t n, unsigned flags) {
    (void)flags;
    NEED_CONTEXT();
    __atomic_fetch_add(&host_allocs, 1, __ATOMIC_RELAXED);
    *ptr = malloc(n ? n : 1);
    return *ptr ? 0 : 2;
}
CUresult cuMemFreeHost(void *ptr) { NEED_CONTEXT(); free(ptr); return 0; }
CUresult cuGetErrorString(CUresult e, const char **s) { (void)e; *s = "stub CUDA error"; return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) { (void)e; *s = "CUDA_ERROR_STUB"; return 0; }
typedef struct stub_stream *CUstream;

static size_t stream_creates;
/* Streams created so far (by anyone: the library, or cudarc for a caller). */
size_t stub_cuda_stream_creates(void) { return __atomic_load_n(&stream_creates, __ATOMIC_RELAXED); }
CUresult cuStreamCreate(CUstream *out, unsigned flags) {
    (void)flags;
    NEED_CONTEXT();
    __atomic_fetch_add(&stream_creates, 1, __ATOMIC_RELAXED);
    return stub_stream_create(out);
}
/* Copies ever queued on stream `s`. */
size_t stub_cuda_stream_copies(CUstream s) { return stub_stream_enqueued(s); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    NEED_CONTEXT();
    check_context_of(dst);
    return stub_stream_enqueue(s, (void *)(uintptr_t)dst, src, n);
}
static size_t null_stream_syncs;
/* How many times the legacy default (null) stream was synchronized. */
size_t stub_cuda_null_stream_syncs(void) { return __atomic_load_n(&null_stream_syncs, __ATOMIC_RELAXED); }
CUresult cuStreamSynchronize(CUstream s) {
    NEED_CONTEXT();
    if (!s) __atomic_fetch_add(&null_stream_syncs, 1, __ATOMIC_RELAXED);
    return stub_stream_sync(s);
}
/* Every stream of every context (the stub does not tell contexts' streams apart). */
CUresult cuCtxSynchronize(void) { NEED_CONTEXT(); stub_streams_sync_all(); return 0; }
CUresult cuStreamDestroy_v2(CUstream s) { NEED_CONTEXT(); return stub_stream_destroy(s); }
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    NEED_CONTEXT();
    check_context_of(src);
    return stub_stream_enqueue(s, dst, (const void *)(uintptr_t)src, n);
}
/* What cudarc's CudaContext, CudaStream and CudaSlice call besides: attributes (all 0: no memory
 * pools, so slices are freed with cuMemFree), the current context, and events (tokens). */
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) { (void)attribute; (void)dev; *value = 0; return 0; }
typedef struct stub_event *CUevent;
CUresult cuEventCreate(CUevent *ev, unsigned flags) { (void)flags; *ev = (CUevent)calloc(1, sizeof(struct stub_event)); return *ev ? 0 : 2; }
CUresult cuEventDestroy_v2(CUevent ev) { free(ev); return 0; }
/* An event completes once the copies queued on its stream before the record have run. */
CUresult cuEventRecord(CUevent ev, CUstream s) { return stub_event_record((struct stub_event *)ev, s); }
CUresult cuEventSynchronize(CUevent ev) { return stub_event_sync((struct stub_event *)ev); }
CUresult cuStreamWaitEvent(CUstream s, CUevent ev, unsigned flags) { (void)s; (void)ev; (void)flags; return 0; }

size_t stub_cuda_async_copies(void) { return __atomic_load_n(&stub_async_copies, __ATOMIC_RELAXED); }
