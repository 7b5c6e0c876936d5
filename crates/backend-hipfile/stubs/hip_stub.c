/* A stand-in for libamdhip64.so for tests without AMD hardware: "device memory" is host memory
 * from malloc. Only the runtime calls the backend makes are exported. Environment:
 *   STUB_HIP_DEVICES     device count (default 1)
 *   STUB_HIP_TOTAL_MIB   device memory in MiB (default 1024)
 *   STUB_HIP_INIT_ERROR  hipError_t hipInit returns (default 0)
 * Asynchronous copies are deferred until their stream is synchronized (deferred_stream.h, in
 * backend-gds); stub_hip_async_copies() counts those performed. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deferred_stream.h"

typedef int hipError_t;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static size_t used = 0;
static int current = -1;

static long env_long(const char *name, long fallback) { const char *v = getenv(name); return v ? atol(v) : fallback; }
static size_t total_bytes(void) { return (size_t)env_long("STUB_HIP_TOTAL_MIB", 1024) << 20; }

hipError_t hipInit(unsigned flags) { (void)flags; return (hipError_t)env_long("STUB_HIP_INIT_ERROR", 0); }
hipError_t hipGetDeviceCount(int *count) { *count = (int)env_long("STUB_HIP_DEVICES", 1); return *count > 0 ? 0 : 100; }
hipError_t hipSetDevice(int device) {
    if (device < 0 || device >= env_long("STUB_HIP_DEVICES", 1)) return 101; /* hipErrorInvalidDevice */
    current = device;
    return 0;
}
hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total) {
    if (current < 0) return 101;
    pthread_mutex_lock(&mu);
    *total = total_bytes();
    *free_bytes = *total > used ? *total - used : 0;
    pthread_mutex_unlock(&mu);
    return 0;
}
hipError_t hipMalloc(void **ptr, size_t n) {
    pthread_mutex_lock(&mu);
    if (used + n > total_bytes()) { pthread_mutex_unlock(&mu); return 2; /* hipErrorOutOfMemory */ }
    char *raw = malloc(n + 64);
    if (!raw) { pthread_mutex_unlock(&mu); return 2; }
    *(size_t *)raw = n;
    used += n;
    pthread_mutex_unlock(&mu);
    *ptr = raw + 64;
    return 0;
}
hipError_t hipFree(void *ptr) {
    if (!ptr) return 0;
    char *raw = (char *)ptr - 64;
    pthread_mutex_lock(&mu);
    used -= *(size_t *)raw;
    pthread_mutex_unlock(&mu);
    free(raw);
    return 0;
}
hipError_t hipMemcpy(void *dst, const void *src, size_t n, int kind) { (void)kind; memcpy(dst, src, n); return 0; }
/* Asynchronous copies are deferred until their stream is synchronized (deferred_stream.h). */
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, int kind, struct stub_stream *s) {
    (void)kind;
    return stub_stream_enqueue(s, dst, src, n);
}
hipError_t hipHostMalloc(void **ptr, size_t n, unsigned flags) { (void)flags; *ptr = malloc(n ? n : 1); return *ptr ? 0 : 2; }
hipError_t hipHostFree(void *ptr) { free(ptr); return 0; }
hipError_t hipStreamCreate(struct stub_stream **out) { return stub_stream_create(out); }
hipError_t hipStreamSynchronize(struct stub_stream *s) { return stub_stream_sync(s); }
hipError_t hipStreamDestroy(struct stub_stream *s) { return stub_stream_destroy(s); }
const char *hipGetErrorString(hipError_t e) { return e == 2 ? "hipErrorOutOfMemory" : "stub HIP error"; }
size_t stub_hip_async_copies(void) { return __atomic_load_n(&stub_async_copies, __ATOMIC_RELAXED); }
