/* Deferred asynchronous copies for the stub GPU runtimes (libcuda, libamdhip64): a copy queued on
 * a stream moves its bytes only when the stream is synchronized or destroyed, or when an event
 * recorded after it is synchronized (which moves the copies queued before the record, not those
 * queued after). A caller that rewrites the source, or hands the destination out, before waiting
 * gets wrong bytes, which the tests see. The null stream (the legacy default stream, which
 * callers such as cudarc use) copies at once. Error codes: 2 out of memory, 400 invalid handle
 * (the same in CUDA and HIP). Streams may be shared by threads (a caller's stream, used by every
 * I/O thread): one lock guards them all. */
#ifndef STAGING_DEFERRED_STREAM_H
#define STAGING_DEFERRED_STREAM_H
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct stub_op { void *dst; const void *src; size_t n; };
/* Asynchronous copies performed so far, by every stream (the stubs export it for tests). */
static size_t stub_async_copies = 0;
/* `done`: copies performed so far; `enqueued`: copies ever queued (ops[i] is copy done + i). */
struct stub_stream { struct stub_op *ops; size_t len, cap, done, enqueued; };
/* An event: the stream it was recorded on and how many of its copies came before the record. */
struct stub_event { struct stub_stream *stream; size_t upto; };

static pthread_mutex_t stub_streams_mu = PTHREAD_MUTEX_INITIALIZER;
#define STUB_MAX_STREAMS 1024
static struct stub_stream *stub_live_streams[STUB_MAX_STREAMS];

static int stub_stream_is_live(struct stub_stream *s) {
    for (size_t i = 0; i < STUB_MAX_STREAMS; i++)
        if (stub_live_streams[i] == s) return 1;
    return 0;
}

static int stub_stream_create(struct stub_stream **out) {
    struct stub_stream *s = calloc(1, sizeof *s);
    if (!s) return 2;
    pthread_mutex_lock(&stub_streams_mu);
    size_t i = 0;
    while (i < STUB_MAX_STREAMS && stub_live_streams[i]) i++;
    if (i == STUB_MAX_STREAMS) { pthread_mutex_unlock(&stub_streams_mu); free(s); return 2; }
    stub_live_streams[i] = s;
    pthread_mutex_unlock(&stub_streams_mu);
    *out = s;
    return 0;
}

static int stub_stream_enqueue(struct stub_stream *s, void *dst, const void *src, size_t n) {
    if (!s) { memcpy(dst, src, n); return 0; } /* the null stream: at once */
    pthread_mutex_lock(&stub_streams_mu);
    if (s->len == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 4;
        struct stub_op *ops = realloc(s->ops, cap * sizeof *ops);
        if (!ops) { pthread_mutex_unlock(&stub_streams_mu); return 2; }
        s->ops = ops;
        s->cap = cap;
    }
    s->ops[s->len++] = (struct stub_op){dst, src, n};
    s->enqueued++;
    pthread_mutex_unlock(&stub_streams_mu);
    return 0;
}

/* Performs, in order, the queued copies numbered below `upto`. The lock is held. */
static void stub_stream_run_locked(struct stub_stream *s, size_t upto) {
    size_t k = upto > s->done ? upto - s->done : 0;
    if (k > s->len) k = s->len;
    for (size_t i = 0; i < k; i++) memcpy(s->ops[i].dst, s->ops[i].src, s->ops[i].n);
    memmove(s->ops, s->ops + k, (s->len - k) * sizeof *s->ops);
    s->len -= k;
    s->done += k;
    __atomic_fetch_add(&stub_async_copies, k, __ATOMIC_RELAXED);
}

/* Performs the queued copies in order. */
static int stub_stream_sync(struct stub_stream *s) {
    if (!s) return 0; /* the null stream has nothing queued */
    pthread_mutex_lock(&stub_streams_mu);
    stub_stream_run_locked(s, s->enqueued);
    pthread_mutex_unlock(&stub_streams_mu);
    return 0;
}

/* Copies ever queued on `s` (0 for the null stream). */
static size_t stub_stream_enqueued(struct stub_stream *s) {
    if (!s) return 0;
    pthread_mutex_lock(&stub_streams_mu);
    size_t n = s->enqueued;
    pthread_mutex_unlock(&stub_streams_mu);
    return n;
}

/* Performs the queued copies of every stream (a context- or device-wide synchronize). */
static void stub_streams_sync_all(void) {
    pthread_mutex_lock(&stub_streams_mu);
    for (size_t i = 0; i < STUB_MAX_STREAMS; i++)
        if (stub_live_streams[i]) stub_stream_run_locked(stub_live_streams[i], stub_live_streams[i]->enqueued);
    pthread_mutex_unlock(&stub_streams_mu);
}

static int stub_event_record(struct stub_event *ev, struct stub_stream *s) {
    if (!ev) return 400;
    pthread_mutex_lock(&stub_streams_mu);
    ev->stream = s;
    ev->upto = s ? s->enqueued : 0;
    pthread_mutex_unlock(&stub_streams_mu);
    return 0;
}

/* Performs the copies queued on the event's stream before it was recorded (none left when the
 * stream is gone: destroying a stream performs its copies). */
static int stub_event_sync(struct stub_event *ev) {
    if (!ev) return 400;
    pthread_mutex_lock(&stub_streams_mu);
    if (ev->stream && stub_stream_is_live(ev->stream)) stub_stream_run_locked(ev->stream, ev->upto);
    pthread_mutex_unlock(&stub_streams_mu);
    return 0;
}

static int stub_stream_destroy(struct stub_stream *s) {
    if (!s) return 400;
    stub_stream_sync(s);
    pthread_mutex_lock(&stub_streams_mu);
    for (size_t i = 0; i < STUB_MAX_STREAMS; i++)
        if (stub_live_streams[i] == s) stub_live_streams[i] = NULL;
    pthread_mutex_unlock(&stub_streams_mu);
    free(s->ops);
    free(s);
    return 0;
}
#endif
