/* fetcher.c — a file from a peer into the store on a thread of its own (fetcher.h). */
#define _POSIX_C_SOURCE 200809L

#include "daemon/fetcher.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/str.h"
#include "net/fetch.h"
#include "net/netclient.h"

struct ts_fetcher {
    uv_async_t async; /* the thread's "done", to the loop */
    pthread_t thread;
    int started;
    atomic_int cancel; /* set by ts_fetcher_free: the thread stops at the next chunk */
    uint64_t fetched;  /* bytes that came over the network (the pace counts only these) */
    uint64_t passed;   /* bytes of the file passed so far, fetched or reused */
    ts_store_t *store;
    char *peer, *identity, *network_key;
    ts_hash_t file;
    uint64_t bytes_per_s;
    uint32_t timeout_ms;
    double t0;
    ts_fetcher_done_fn done;
    void *arg;
    int rc;
    char err[512];
};

/* After each chunk: stop when cancelled; else sleep (in slices, so a cancel is seen within
 * 0.1 s) until the bytes fetched over the network so far fit the bandwidth. */
static int pace(void *ctx, uint64_t done, uint64_t total, int fetched) {
    (void)total;
    ts_fetcher_t *f = ctx;
    if (fetched) /* count what came over the network, not chunks reused from the store */
        f->fetched += done - f->passed;
    f->passed = done;
    while (!atomic_load(&f->cancel) && f->bytes_per_s) {
        double due = f->t0 + (double)f->fetched / (double)f->bytes_per_s, now = ts_now_s();
        if (due <= now)
            break;
        double s = due - now < 0.1 ? due - now : 0.1;
        struct timespec ts = {0, (long)(s * 1e9)};
        nanosleep(&ts, NULL);
    }
    return atomic_load(&f->cancel);
}

static void *run(void *arg) {
    ts_fetcher_t *f = arg;
    ts_netclient_t nc;
    uint32_t timeout = f->timeout_ms ? f->timeout_ms : 30000;
    f->t0 = ts_now_s();
    if (ts_netclient_open(&nc, "tesserad fetch", f->peer, f->identity, f->network_key, timeout) !=
        0) {
        f->rc = TS_EPEER;
        snprintf(f->err, sizeof f->err, "cannot reach %s", f->peer);
    } else {
        f->rc = ts_fetch_file(&nc, nc.peer, f->store, &f->file, timeout, pace, f, NULL, f->err,
                              sizeof f->err);
        ts_netclient_close(&nc);
    }
    uv_async_send(&f->async);
    return NULL;
}

static void on_done(uv_async_t *a) {
    ts_fetcher_t *f = a->data;
    if (f->done) {
        ts_fetcher_done_fn done = f->done;
        f->done = NULL; /* once */
        done(f, f->rc, f->err, f->arg);
    }
}

int ts_fetcher_start(ts_fetcher_t **out, uv_loop_t *loop, ts_store_t *store,
                     const ts_fetcher_opts_t *o, ts_fetcher_done_fn done, void *arg) {
    if (!out || !loop || !store || !o || !o->peer || !o->identity || !o->network_key)
        return TS_EINVAL;
    ts_fetcher_t *f = calloc(1, sizeof *f);
    if (!f)
        return TS_ENOMEM;
    f->store = store, f->file = o->file, f->bytes_per_s = o->bytes_per_s;
    f->timeout_ms = o->timeout_ms, f->done = done, f->arg = arg;
    f->peer = ts_dup_str(o->peer), f->identity = ts_dup_str(o->identity);
    f->network_key = ts_dup_str(o->network_key);
    if (!f->peer || !f->identity || !f->network_key) {
        free(f->peer), free(f->identity), free(f->network_key), free(f);
        return TS_ENOMEM;
    }
    uv_async_init(loop, &f->async, on_done);
    f->async.data = f;
    if (pthread_create(&f->thread, NULL, run, f) != 0) {
        f->done = NULL;
        ts_fetcher_free(f);
        return TS_ENOMEM;
    }
    f->started = 1;
    *out = f;
    return TS_OK;
}

static void on_closed(uv_handle_t *h) {
    ts_fetcher_t *f = h->data;
    free(f->peer), free(f->identity), free(f->network_key), free(f);
}

void ts_fetcher_free(ts_fetcher_t *f) {
    if (!f)
        return;
    atomic_store(&f->cancel, 1); /* the thread stops after the chunk in flight */
    if (f->started)
        pthread_join(f->thread, NULL);
    f->done = NULL;
    uv_close((uv_handle_t *)&f->async, on_closed);
}
