/*
 * fetch.h — files from the network into the store: expert weights, the partition, the router,
 * all named by their BLAKE2b-256 (the weights hash) and served by any node's weight server
 * (docs/protocol.md "Weights").
 *
 * A fetch asks for the manifest, then for every chunk the store does not already hold, checking
 * each against its hash as it arrives and storing it at once; then it reassembles the file from
 * the store, checks it against the weights hash and stores its manifest. So a fetch that was
 * interrupted resumes where it stopped, and nothing unverified is ever used.
 */
#ifndef TS_NET_FETCH_H
#define TS_NET_FETCH_H

#include <stdint.h>

#include "net/netclient.h"
#include "store/weights.h"

/* Called after each chunk: done and total in bytes, and whether this chunk came over the
 * network (0: it was already in the store). A non-zero return stops the fetch there
 * (TS_ECANCELED; what is stored stays, so a later fetch resumes). */
typedef int (*ts_fetch_progress_fn)(void *ctx, uint64_t done, uint64_t total, int fetched);

typedef struct ts_fetch_stats {
    int present; /* the whole file was already in the store: nothing was asked for */
    uint64_t bytes_fetched, bytes_reused;
    int chunks_fetched, chunks_reused;
    double seconds;
} ts_fetch_stats_t;

/* Fetches the file h from peer into store (nothing to do when its manifest is there and every
 * chunk verifies). TS_ENOTFOUND when the peer does not have it, TS_ECORRUPT when what arrives
 * does not match its hashes (the bad chunk is not stored), TS_ECANCELED when progress asked to
 * stop, or the call's failure; err says which. stats may be NULL. */
int ts_fetch_file(ts_netclient_t *c, ts_rpc_peer_t *peer, ts_store_t *store, const ts_hash_t *h,
                  uint32_t timeout_ms, ts_fetch_progress_fn progress, void *ctx,
                  ts_fetch_stats_t *stats, char *err, size_t errlen);

#endif
