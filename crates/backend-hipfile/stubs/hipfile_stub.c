/* A stand-in for libhipfile.so.0 for tests (hipFile's API mirrors cuFile's, so this follows the
 * cuFile stub): hipFileRead is a pread into whatever address it is
 * given (base + buffer offset), so the backend's real reader code runs against host memory.
 * Faults are chosen per file by its path, so parallel tests do not interfere:
 *   path contains "REFUSE_REGISTER"  hipFileHandleRegister fails with 5019 (INVALID_FILE_OPEN_FLAG)
 *   path contains "READ_ERRNO"       hipFileRead returns -1 with errno EIO
 *   path contains "READ_CODE"        hipFileRead returns -5011 (CUDA_DRIVER_ERROR)
 *   path contains "SHORT_READ"       hipFileRead moves at most 777 bytes per call
 * and per process by environment variables:
 *   STUB_HIPFILE_SPIN_OPEN   hipFileDriverOpen never returns (as seen without a CUDA driver)
 *   STUB_HIPFILE_OPEN_ERROR  hipFileDriverOpen fails with this code
 * Built with -DOMIT_READ it lacks hipFileRead, for the missing-symbol test. hipFileRead refuses
 * requests over MAX_READ bytes (hipFile's 0x7ffff000 unless built with -DMAX_READ=n), so a
 * caller that does not cut its requests fails. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct { int err; int cu_err; } hipFileError_t;
typedef struct {
    unsigned type;
    union { int fd; void *handle; } handle;
    const void *fs_ops;
} hipFileDescr_t;
typedef struct { int fd; char path[4096]; } StubHandle;

static const hipFileError_t ok = {0, 0};
/* hipFile's driver is reference-counted: every open needs a matching close. */
static int driver_open = 0;

hipFileError_t hipFileDriverOpen(void) {
    if (getenv("STUB_HIPFILE_SPIN_OPEN")) { for (;;) { } }
    const char *e = getenv("STUB_HIPFILE_OPEN_ERROR");
    if (e) { hipFileError_t r = {atoi(e), 0}; return r; }
    __sync_fetch_and_add(&driver_open, 1);
    return ok;
}
hipFileError_t hipFileDriverClose(void) { __sync_fetch_and_sub(&driver_open, 1); return ok; }
hipFileError_t hipFileGetVersion(unsigned *major, unsigned *minor, unsigned *patch) { *major = 0; *minor = 2; *patch = 0; return ok; }
/* hipFileDriverProps_t as AMD's hipfile.h declares it (hipfile package, _chipfile.pxd). */
typedef struct {
    struct {
        unsigned major_version, minor_version;
        uint64_t poll_thresh_size, max_direct_io_size;
        unsigned driver_status_flags, driver_control_flags;
    } nvfs;
    unsigned feature_flags;
    uint64_t max_device_cache_size, per_buffer_cache_size, max_device_pinned_mem_size;
    unsigned max_batch_io_count, max_batch_io_timeout_msecs;
} hipFileDriverProps_t;
hipFileError_t hipFileDriverGetProperties(hipFileDriverProps_t *props) { memset(props, 0, sizeof *props); return ok; }
hipFileError_t hipFileHandleRegister(void **fh, hipFileDescr_t *descr) {
    if (!driver_open) { hipFileError_t r = {5001, 0}; return r; }
    char link[64];
    StubHandle *h = calloc(1, sizeof *h);
    snprintf(link, sizeof link, "/proc/self/fd/%d", descr->handle.fd);
    ssize_t n = readlink(link, h->path, sizeof h->path - 1);
    if (n < 0 || strstr(h->path, "REFUSE_REGISTER")) { free(h); hipFileError_t r = {5019, 0}; return r; }
    /* Read through a buffered descriptor of our own: the caller's may be O_DIRECT. */
    h->fd = open(h->path, O_RDONLY | O_CLOEXEC);
    if (h->fd < 0) { free(h); hipFileError_t r = {5030, 0}; return r; }
    *fh = h;
    return ok;
}
void hipFileHandleDeregister(void *fh) {
    StubHandle *h = fh;
    if (h) { close(h->fd); free(h); }
}
#ifndef MAX_READ
#define MAX_READ 0x7ffff000L
#endif
#ifndef OMIT_READ
ssize_t hipFileRead(void *fh, void *base, size_t size, off_t file_offset, off_t buf_offset) {
    StubHandle *h = fh;
    if ((long)size > MAX_READ) { errno = EINVAL; return -1; }
    if (strstr(h->path, "READ_ERRNO")) { errno = EIO; return -1; }
    if (strstr(h->path, "READ_CODE")) return -5011;
    if (strstr(h->path, "SHORT_READ") && size > 777) size = 777;
    return pread(h->fd, (char *)base + buf_offset, size, file_offset);
}
#endif
hipFileError_t hipFileBufRegister(const void *p, size_t n, int flags) { (void)p; (void)n; (void)flags; return ok; }
hipFileError_t hipFileBufDeregister(const void *p) { (void)p; return ok; }
