/* Deferred asynchronous copies for the stub GPU runtimes (libcuda, libamdhip64): a copy queued on
 * a stream moves its bytes only when the stream is synchronized or destroyed. A caller that
 * rewrites the source, or hands the destination out, before synchronizing gets wrong bytes,
 * which the tests see. The null stream (the legacy default stream, which callers such as cudarc
 * use) copies at once. Error codes: 2 out of memory, 400 invalid handle (the same in CUDA and
 * HIP). Streams are used by one thread at a time, as the backends use them. */
#ifndef STAGING_DEFERRED_STREAM_H
#define STAGING_DEFERRED_STREAM_H
#include <stdlib.h>
#include <string.h>

struct stub_op { void *dst; const void *src; size_t n; };
/* Asynchronous copies performed so far, by every stream (the stubs export it for tests). */
static size_t stub_async_copies = 0;
struct stub_stream { struct stub_op *ops; size_t len, cap; };

static int stub_stream_create(struct stub_stream **out) {
    struct stub_stream *s = calloc(1, sizeof *s);
    if (!s) return 2;
    *out = s;
    return 0;
}

static int stub_stream_enqueue(struct stub_stream *s, void *dst, const void *src, size_t n) {
    if (!s) { memcpy(dst, src, n); return 0; } /* the null stream: at once */
    if (s->len == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 4;
        struct stub_op *ops = realloc(s->ops, cap * sizeof *ops);
        if (!ops) return 2;
        s->ops = ops;
        s->cap = cap;
    }
    s->ops[s->len++] = (struct stub_op){dst, src, n};
    return 0;
}

/* Performs the queued copies in order. */
static int stub_stream_sync(struct stub_stream *s) {
    if (!s) return 0; /* the null stream has nothing queued */
    for (size_t i = 0; i < s->len; i++) memcpy(s->ops[i].dst, s->ops[i].src, s->ops[i].n);
    __atomic_fetch_add(&stub_async_copies, s->len, __ATOMIC_RELAXED);
    s->len = 0;
    return 0;
}

static int stub_stream_destroy(struct stub_stream *s) {
    if (!s) return 400;
    stub_stream_sync(s);
    free(s->ops);
    free(s);
    return 0;
}
#endif
