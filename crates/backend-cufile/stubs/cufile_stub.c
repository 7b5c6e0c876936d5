/* A stand-in for libcufile.so.0 for tests: cuFileRead is a pread into whatever address it is
 * given (base + buffer offset), so the backend's real reader code runs against host memory.
 * Faults are chosen per file by its path, so parallel tests do not interfere:
 *   path contains "REFUSE_REGISTER"  cuFileHandleRegister fails with 5019 (INVALID_FILE_OPEN_FLAG)
 *   path contains "READ_ERRNO"       cuFileRead returns -1 with errno EIO
 *   path contains "READ_CODE"        cuFileRead returns -5011 (CUDA_DRIVER_ERROR)
 *   path contains "SHORT_READ"       cuFileRead moves at most 777 bytes per call
 * and per process by environment variables:
 *   STUB_CUFILE_SPIN_OPEN   cuFileDriverOpen never returns (as seen without a CUDA driver)
 *   STUB_CUFILE_OPEN_ERROR  cuFileDriverOpen fails with this code
 *   STUB_CUFILE_NVFS        cuFileDriverGetProperties reports nvidia-fs 2.17 (GDS available)
 * Built with -DOMIT_READ it lacks cuFileRead, for the missing-symbol test. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct { int err; int cu_err; } CUfileError_t;
typedef struct {
    unsigned type;
    union { int fd; void *handle; } handle;
    const void *fs_ops;
} CUfileDescr_t;
typedef struct { int fd; char path[4096]; } StubHandle;

static const CUfileError_t ok = {0, 0};
/* cuFile's driver is reference-counted: every open needs a matching close. */
static int driver_open = 0;

CUfileError_t cuFileDriverOpen(void) {
    if (getenv("STUB_CUFILE_SPIN_OPEN")) { for (;;) { } }
    const char *e = getenv("STUB_CUFILE_OPEN_ERROR");
    if (e) { CUfileError_t r = {atoi(e), 0}; return r; }
    __sync_fetch_and_add(&driver_open, 1);
    return ok;
}
CUfileError_t cuFileDriverClose_v2(void) { __sync_fetch_and_sub(&driver_open, 1); return ok; }
CUfileError_t cuFileDriverClose(void) { return cuFileDriverClose_v2(); }
CUfileError_t cuFileGetVersion(int *version) { *version = 1200; return ok; }
CUfileError_t cuFileDriverGetProperties(void *props) {
    memset(props, 0, 56);
    if (getenv("STUB_CUFILE_NVFS")) { ((unsigned *)props)[0] = 2; ((unsigned *)props)[1] = 17; }
    return ok;
}
CUfileError_t cuFileSetParameterBool(int param, bool value) { (void)param; (void)value; return ok; }
CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *descr) {
    if (!driver_open) { CUfileError_t r = {5001, 0}; return r; }
    char link[64];
    StubHandle *h = calloc(1, sizeof *h);
    snprintf(link, sizeof link, "/proc/self/fd/%d", descr->handle.fd);
    ssize_t n = readlink(link, h->path, sizeof h->path - 1);
    if (n < 0 || strstr(h->path, "REFUSE_REGISTER")) { free(h); CUfileError_t r = {5019, 0}; return r; }
    /* Read through a buffered descriptor of our own: the caller's may be O_DIRECT. */
    h->fd = open(h->path, O_RDONLY | O_CLOEXEC);
    if (h->fd < 0) { free(h); CUfileError_t r = {5030, 0}; return r; }
    *fh = h;
    return ok;
}
void cuFileHandleDeregister(void *fh) {
    StubHandle *h = fh;
    if (h) { close(h->fd); free(h); }
}
#ifndef OMIT_READ
ssize_t cuFileRead(void *fh, void *base, size_t size, off_t file_offset, off_t buf_offset) {
    StubHandle *h = fh;
    if (strstr(h->path, "READ_ERRNO")) { errno = EIO; return -1; }
    if (strstr(h->path, "READ_CODE")) return -5011;
    if (strstr(h->path, "SHORT_READ") && size > 777) size = 777;
    return pread(h->fd, (char *)base + buf_offset, size, file_offset);
}
#endif
CUfileError_t cuFileBufRegister(const void *p, size_t n, int flags) { (void)p; (void)n; (void)flags; return ok; }
CUfileError_t cuFileBufDeregister(const void *p) { (void)p; return ok; }
