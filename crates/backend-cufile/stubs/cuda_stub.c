/* A stand-in for libcuda.so for tests on machines without a GPU: "device memory" is host memory
 * from malloc, so the backend's real code runs end to end. Only the driver calls the backend makes
 * are exported. Behaviour is set by environment variables read at each call:
 *   STUB_CUDA_DEVICES      device count (default 1)
 *   STUB_CUDA_TOTAL_MIB    device memory in MiB (default 1024)
 *   STUB_CUDA_INIT_ERROR   CUresult cuInit returns (default 0)
 * Asynchronous copies are deferred until their stream is synchronized (deferred_stream.h, in
 * backend-gds); stub_cuda_async_copies() counts those performed. */
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
static int context_token;

static long env_long(const char *name, long fallback) {
    const char *v = getenv(name);
    return v ? atol(v) : fallback;
}

static size_t total_bytes(void) { return (size_t)env_long("STUB_CUDA_TOTAL_MIB", 1024) << 20; }

CUresult cuInit(unsigned flags) { (void)flags; return (CUresult)env_long("STUB_CUDA_INIT_ERROR", 0); }
CUresult cuDeviceGetCount(int *count) { *count = (int)env_long("STUB_CUDA_DEVICES", 1); return 0; }
CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= env_long("STUB_CUDA_DEVICES", 1)) return 101; /* INVALID_DEVICE */
    *dev = ordinal;
    return 0;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) { (void)dev; *ctx = &context_token; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { (void)dev; return 0; }
CUresult cuCtxSetCurrent(CUcontext ctx) { return ctx == &context_token ? 0 : 201; /* INVALID_CONTEXT */ }
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    pthread_mutex_lock(&mu);
    *total = total_bytes();
    *free_bytes = *total > used ? *total - used : 0;
    pthread_mutex_unlock(&mu);
    return 0;
}
/* Every live allocation has a 64-byte header: its size and links in a list of live ones. */
struct stub_alloc { size_t n; struct stub_alloc *prev, *next; };
static struct stub_alloc live = {0, &live, &live};
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t n) {
    pthread_mutex_lock(&mu);
    if (used + n > total_bytes()) { pthread_mutex_unlock(&mu); return 2; /* OUT_OF_MEMORY */ }
    char *raw = malloc(n + 64);
    if (!raw) { pthread_mutex_unlock(&mu); return 2; }
    struct stub_alloc *a = (struct stub_alloc *)raw;
    a->n = n;
    a->prev = &live; a->next = live.next; live.next->prev = a; live.next = a;
    used += n;
    pthread_mutex_unlock(&mu);
    *ptr = (CUdeviceptr)(uintptr_t)(raw + 64);
    return 0;
}
CUresult cuMemFree_v2(CUdeviceptr ptr) {
    if (!ptr) return 0;
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
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return 0; }
CUresult cuMemHostAlloc(void **ptr, size_t n, unsigned flags) { (void)flags; *ptr = malloc(n ? n : 1); return *ptr ? 0 : 2; }
CUresult cuMemFreeHost(void *ptr) { free(ptr); return 0; }
CUresult cuGetErrorString(CUresult e, const char **s) { (void)e; *s = "stub CUDA error"; return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) { (void)e; *s = "CUDA_ERROR_STUB"; return 0; }
typedef struct stub_stream *CUstream;

CUresult cuStreamCreate(CUstream *out, unsigned flags) { (void)flags; return stub_stream_create(out); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return stub_stream_enqueue(s, (void *)(uintptr_t)dst, src, n);
}
CUresult cuStreamSynchronize(CUstream s) { return stub_stream_sync(s); }
CUresult cuStreamDestroy_v2(CUstream s) { return stub_stream_destroy(s); }
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    return stub_stream_enqueue(s, dst, (const void *)(uintptr_t)src, n);
}
/* What cudarc's CudaContext, CudaStream and CudaSlice call besides: attributes (all 0: no memory
 * pools, so slices are freed with cuMemFree), the current context, and events (tokens). */
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) { (void)attribute; (void)dev; *value = 0; return 0; }
CUresult cuCtxGetCurrent(CUcontext *ctx) { *ctx = &context_token; return 0; }
typedef struct stub_event *CUevent;
CUresult cuEventCreate(CUevent *ev, unsigned flags) { (void)flags; *ev = malloc(1); return *ev ? 0 : 2; }
CUresult cuEventDestroy_v2(CUevent ev) { free(ev); return 0; }
CUresult cuEventRecord(CUevent ev, CUstream s) { (void)ev; return stub_stream_sync(s); }
CUresult cuEventSynchronize(CUevent ev) { (void)ev; return 0; }
CUresult cuStreamWaitEvent(CUstream s, CUevent ev, unsigned flags) { (void)s; (void)ev; (void)flags; return 0; }

size_t stub_cuda_async_copies(void) { return __atomic_load_n(&stub_async_copies, __ATOMIC_RELAXED); }
