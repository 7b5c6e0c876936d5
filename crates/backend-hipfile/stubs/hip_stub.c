/* A stand-in for libamdhip64.so for tests without AMD hardware: "device memory" is host memory
 * from malloc. Only the runtime calls the backend makes are exported. Environment:
 *   STUB_HIP_DEVICES     device count (default 1; stub_hip_set_devices() overrides it)
 *   STUB_HIP_TOTAL_MIB   device memory in MiB (default 1024)
 *   STUB_HIP_INIT_ERROR  hipError_t hipInit returns (default 0)
 * Asynchronous copies are deferred until their stream is synchronized (deferred_stream.h, in
 * backend-gds); stub_hip_async_copies() counts those performed.
 *
 * The current device is per thread, 0 until hipSetDevice, as in HIP. Every allocation remembers
 * the device current when it was made: a free or copy of it while another device is current is
 * counted by stub_hip_wrong_device(); stub_hip_sets() counts hipSetDevice calls. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deferred_stream.h"

typedef int hipError_t;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static size_t used = 0;
static __thread int current = 0;
static long devices_override = -1;
static size_t sets, wrong_device;

static long env_long(const char *name, long fallback) { const char *v = getenv(name); return v ? atol(v) : fallback; }
static size_t total_bytes(void) { return (size_t)env_long("STUB_HIP_TOTAL_MIB", 1024) << 20; }
static long device_count(void) {
    long n = __atomic_load_n(&devices_override, __ATOMIC_RELAXED);
    return n >= 0 ? n : env_long("STUB_HIP_DEVICES", 1);
}
void stub_hip_set_devices(long n) { __atomic_store_n(&devices_override, n, __ATOMIC_RELAXED); }
size_t stub_hip_sets(void) { return __atomic_load_n(&sets, __ATOMIC_RELAXED); }
size_t stub_hip_wrong_device(void) { return __atomic_load_n(&wrong_device, __ATOMIC_RELAXED); }

/* Every live allocation has a 64-byte header: its size, its device and links in a list. */
struct stub_alloc { size_t n; int device; struct stub_alloc *prev, *next; };
static struct stub_alloc live = {0, 0, &live, &live};
static void check_device_of(const void *ptr) {
    int device = -1;
    pthread_mutex_lock(&mu);
    for (struct stub_alloc *a = live.next; a != &live; a = a->next) {
        const char *start = (const char *)a + 64;
        if ((const char *)ptr >= start && (const char *)ptr <= start + a->n) { device = a->device; break; }
    }
    pthread_mutex_unlock(&mu);
    if (device >= 0 && device != current) __atomic_fetch_add(&wrong_device, 1, __ATOMIC_RELAXED);
}

hipError_t hipInit(unsigned flags) { (void)flags; return (hipError_t)env_long("STUB_HIP_INIT_ERROR", 0); }
hipError_t hipGetDeviceCount(int *count) { *count = (int)device_count(); return *count > 0 ? 0 : 100; }
hipError_t hipSetDevice(int device) {
    __atomic_fetch_add(&sets, 1, __ATOMIC_RELAXED);
    if (device < 0 || device >= device_count()) return 101; /* hipErrorInvalidDevice */
    current = device;
    return 0;
}
hipError_t hipGetDevice(int *device) { *device = current; return 0; }
hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total) {
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
    struct stub_alloc *a = (struct stub_alloc *)raw;
    a->n = n;
    a->device = current;
    a->prev = &live; a->next = live.next; live.next->prev = a; live.next = a;
    used += n;
    pthread_mutex_unlock(&mu);
    *ptr = raw + 64;
    return 0;
}
hipError_t hipFree(void *ptr) {
    if (!ptr) return 0;
    check_device_of(ptr);
    struct stub_alloc *a = (struct stub_alloc *)((char *)ptr - 64);
    pthread_mutex_lock(&mu);
    used -= a->n;
    a->prev->next = a->next; a->next->prev = a->prev;
    pthread_mutex_unlock(&mu);
    free(a);
    return 0;
}
/* The size of the live allocation starting at `ptr`, 0 when there is none (for the tests). */
size_t stub_hip_live_allocation(void *ptr) {
    size_t n = 0;
    pthread_mutex_lock(&mu);
    for (struct stub_alloc *a = live.next; a != &live; a = a->next)
        if ((char *)a + 64 == (char *)ptr) { n = a->n; break; }
    pthread_mutex_unlock(&mu);
    return n;
}
hipError_t hipMemcpy(void *dst, const void *src, size_t n, int kind) {
    check_device_of(kind == 2 ? src : dst); /* 2: device to host */
    memcpy(dst, src, n);
    return 0;
}
/* Asynchronous copies are deferred until their stream is synchronized (deferred_stream.h). */
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, int kind, struct stub_stream *s) {
    check_device_of(kind == 2 ? src : dst);
    return stub_stream_enqueue(s, dst, src, n);
}
hipError_t hipHostMalloc(void **ptr, size_t n, unsigned flags) { (void)flags; *ptr = malloc(n ? n : 1); return *ptr ? 0 : 2; }
hipError_t hipHostFree(void *ptr) { free(ptr); return 0; }
hipError_t hipStreamCreate(struct stub_stream **out) { return stub_stream_create(out); }
hipError_t hipStreamSynchronize(struct stub_stream *s) { return stub_stream_sync(s); }
hipError_t hipStreamDestroy(struct stub_stream *s) { return stub_stream_destroy(s); }
const char *hipGetErrorString(hipError_t e) { return e == 2 ? "hipErrorOutOfMemory" : "stub HIP error"; }
size_t stub_hip_async_copies(void) { return __atomic_load_n(&stub_async_copies, __ATOMIC_RELAXED); }
