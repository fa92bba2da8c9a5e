/*
 * weights_srv.h — serving the store's files to other nodes (docs/protocol.md "Weights",
 * store/weights.h): weights_manifest_request and chunk_request, with a bandwidth limit.
 *
 * What it serves. Every file in the store's `manifests`: expert weights, and partition and router
 * artifacts once imported (they are safetensors files too, so they travel the same way). A
 * manifest request is answered from the stored manifest (total size, 1 MiB chunk size, the chunk
 * hashes, the first tensor's dtype). A chunk request names a chunk by its hash alone and is
 * answered with any stored chunk of that hash, whatever file it belongs to, after checking its
 * bytes against the hash (a damaged chunk is never sent: ERROR_INTERNAL, and the store's verify
 * will list it).
 *
 * Bandwidth. Chunk bytes go out through a token bucket one chunk deep: a chunk is sent when the
 * bucket is not in debt, and its bytes are then taken from it (the balance may go negative),
 * which refills at `bandwidth` bytes per second. So n bytes of chunks take at least
 * (n − the first chunk) / bandwidth seconds, and nothing accumulates while idle. Requests wait
 * in arrival order; one that finds max_pending already waiting is answered busy, with the time
 * the queue needs as retry hint. A waiting request whose deadline passes is answered
 * ERROR_DEADLINE_EXCEEDED; a cancelled one leaves the queue. Manifests are small and are not
 * counted. bandwidth 0 means no limit.
 *
 * Threads: the loop's only (store reads are short LMDB read transactions).
 */
#ifndef TS_DAEMON_WEIGHTS_SRV_H
#define TS_DAEMON_WEIGHTS_SRV_H

#include <stdint.h>
#include <uv.h>

#include "net/rpc.h"
#include "store/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_weights_srv ts_weights_srv_t;

typedef struct ts_weights_srv_opts {
    uint64_t bandwidth; /* bytes per second of chunk data; 0 = unlimited (default) */
    int max_pending;    /* chunk requests waiting for bandwidth before busy, default 64 */
} ts_weights_srv_opts_t;

void ts_weights_srv_opts_default(ts_weights_srv_opts_t *o);

typedef struct ts_weights_srv_stats {
    uint64_t manifests, chunks, bytes;         /* answered with data */
    uint64_t not_found;                        /* manifests or chunks not in the store */
    uint64_t damaged;                          /* chunks whose bytes did not match their hash */
    uint64_t busy, expired, cancelled, failed; /* failed: store errors, shutdown */
    uint64_t throttled_ms; /* time spent waiting for the bucket, summed per wait */
} ts_weights_srv_stats_t;

/* Serves store's files on rpc (both must outlive the server; loop is rpc's). o may be NULL.
 * TS_EINVAL for bad options, TS_ENOMEM. */
int ts_weights_srv_new(ts_weights_srv_t **out, uv_loop_t *loop, ts_rpc_t *rpc, ts_store_t *store,
                       const ts_weights_srv_opts_t *o);
/* Answers the waiting chunk requests ERROR_UNAVAILABLE, and later ones too. Idempotent. */
void ts_weights_srv_shutdown(ts_weights_srv_t *w);
/* Shuts down, then frees once the timer has closed (TS_EBUSY until then: run the loop and call
 * again); unregisters both handlers. NULL-safe. */
int ts_weights_srv_free(ts_weights_srv_t *w);

void ts_weights_srv_stats(const ts_weights_srv_t *w, ts_weights_srv_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif
