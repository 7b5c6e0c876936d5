/* A destination callback that calls back into its own load (issue 19, item 1), from C.
 *
 *   reentrant CHECKPOINT MODE
 *
 * MODE is what the callback does with the load whose stg_load_next() called it: "report",
 * "backend", "last_error", "next" or "free" (on the second tensor), or "free_from_thread" (on
 * the second tensor, a second thread frees the load while this step runs). Every tensor is declined
 * (the region stays NULL), so the load goes on by its own policy. One line per event on stdout:
 *   cb NAME STATUS [DETAIL]      the callback's own call and what it returned
 *   tensor NAME                  stg_load_next returned a tensor
 *   next STATUS MESSAGE          stg_load_next ended (STG_END, or an error with its message;
 *                                "-" for STG_LOAD_FREED, after which the handle is gone)
 *   report TENSORS               the report after the loop
 * The test (reentrant.rs) runs this with a timeout and under valgrind. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "staging_ffi.h"

struct ctx {
    const char *mode;
    struct stg_load *load;
};

static void *free_load(void *load) {
    stg_load_free(load);
    return NULL;
}

static uint32_t callback(void *user_data, const struct stg_tensor_info *tensor, void **region,
                         size_t *capacity) {
    struct ctx *ctx = user_data;
    (void)region;
    (void)capacity;
    if (strcmp(ctx->mode, "report") == 0) {
        struct stg_report report;
        memset(&report, 0xab, sizeof report);
        stg_status s = stg_load_report(ctx->load, &report);
        printf("cb %s %u %llu\n", tensor->name, (unsigned)s,
               (unsigned long long)(s == STG_OK ? report.tensors : 999));
    } else if (strcmp(ctx->mode, "backend") == 0) {
        const char *mode = NULL;
        const char *backend = stg_load_backend(ctx->load, &mode);
        printf("cb %s %u %s/%s\n", tensor->name, 0u, backend ? backend : "(null)",
               mode ? mode : "(null)");
    } else if (strcmp(ctx->mode, "last_error") == 0) {
        char buf[64];
        size_t written = 99;
        stg_status s = stg_load_last_error(ctx->load, buf, sizeof buf, &written);
        printf("cb %s %u %zu\n", tensor->name, (unsigned)s, written);
    } else if (strcmp(ctx->mode, "next") == 0) {
        struct stg_tensor *out = (struct stg_tensor *)(uintptr_t)0x1;
        stg_status s = stg_load_next(ctx->load, &out);
        printf("cb %s %u %s\n", tensor->name, (unsigned)s,
               out == (struct stg_tensor *)(uintptr_t)0x1 ? "untouched" : "written");
    } else if (strcmp(ctx->mode, "free") == 0) {
        if (strcmp(tensor->name, "b") == 0) {
            stg_load_free(ctx->load);
            printf("cb %s %u freed\n", tensor->name, 0u);
        }
    } else if (strcmp(ctx->mode, "free_from_thread") == 0) {
        if (strcmp(tensor->name, "b") == 0) {
            /* Another thread's stg_load_free, made and returned while this step runs. */
            pthread_t other;
            if (pthread_create(&other, NULL, free_load, ctx->load) != 0) return STG_INTERNAL;
            pthread_join(other, NULL);
            printf("cb %s %u freed elsewhere\n", tensor->name, 0u);
        }
    }
    fflush(stdout);
    return STG_OK;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: reentrant CHECKPOINT MODE\n");
        return 2;
    }
    struct ctx ctx = {argv[2], NULL};
    struct stg_config *config = NULL;
    if (stg_config_new(&config) != STG_OK) return 3;
    if (stg_config_set_backend(config, "host") != STG_OK) return 3;
    if (stg_config_set_threads(config, 1) != STG_OK) return 3;
    if (stg_config_set_coalesce_below(config, 0) != STG_OK) return 3;
    if (stg_config_set_destination(config, callback, &ctx) != STG_OK) return 3;
    if (stg_load_new(config, argv[1], &ctx.load) != STG_OK) return 4;
    stg_status s;
    struct stg_tensor *tensor = NULL;
    while ((s = stg_load_next(ctx.load, &tensor)) == STG_OK) {
        struct stg_tensor_info info;
        if (stg_tensor_describe(tensor, &info) != STG_OK) return 5;
        printf("tensor %s\n", info.name);
        stg_tensor_free(tensor);
    }
    if (s == STG_LOAD_FREED) {
        /* The handle is gone: nothing more may be asked of it. */
        printf("next %u -\n", (unsigned)s);
        stg_config_free(config);
        return 0;
    }
    char message[512];
    size_t written = 0;
    if (stg_load_last_error(ctx.load, message, sizeof message, &written) != STG_OK) return 6;
    printf("next %u %s\n", (unsigned)s, s == STG_END ? "-" : message);
    struct stg_report report;
    if (stg_load_report(ctx.load, &report) != STG_OK) return 7;
    printf("report %llu\n", (unsigned long long)report.tensors);
    stg_load_free(ctx.load);
    stg_config_free(config);
    return 0;
}
