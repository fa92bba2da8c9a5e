/*
 * fetcher.h — one file from a peer into the store, for the daemon (an auto node fetching the
 * partition or an expert's weights): net/fetch.h's verified, resumable fetch, run on a thread of
 * its own with its own client endpoint (net/netclient.h), so the daemon's loop never waits for
 * the network; bandwidth-limited; the result comes back on the loop.
 */
#ifndef TS_DAEMON_FETCHER_H
#define TS_DAEMON_FETCHER_H

#include <stdint.h>
#include <uv.h>

#include "store/store.h"
#include "store/weights.h"

typedef struct ts_fetcher ts_fetcher_t;

/* Runs on the loop once the fetch has ended: rc TS_OK (the file is in the store, verified) or the
 * failure with a sentence. The fetcher may be freed from here. */
typedef void (*ts_fetcher_done_fn)(ts_fetcher_t *f, int rc, const char *err, void *arg);

typedef struct ts_fetcher_opts {
    const char *peer;        /* "host:port" of a node that has the file */
    ts_hash_t file;          /* what to fetch */
    const char *identity;    /* this node's identity file (the handshake) */
    const char *network_key; /* the network key file */
    uint64_t bytes_per_s;    /* 0 = unlimited */
    uint32_t timeout_ms;     /* per call; 0 = 30 s */
} ts_fetcher_opts_t;

/* Starts the fetch (strings are copied). TS_ENOMEM, or a thread that cannot start. */
int ts_fetcher_start(ts_fetcher_t **out, uv_loop_t *loop, ts_store_t *store,
                     const ts_fetcher_opts_t *o, ts_fetcher_done_fn done, void *arg);

/* Frees the fetcher: a fetch still running stops after the chunk in flight (at most one call's
 * timeout; what is stored stays, so the next fetch resumes), then the thread is joined and done
 * is not called. NULL-safe; the handle closes asynchronously. */
void ts_fetcher_free(ts_fetcher_t *f);

#endif
