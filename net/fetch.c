/*
 * fetch.c — files from the network into the store (fetch.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "net/fetch.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"
#include "net/frame.h"

/* A file's size and chunk count are bounded before anything is allocated for them. */
#define FETCH_MAX_BYTES ((uint64_t)4 << 30)

static int call(ts_netclient_t *c, ts_rpc_peer_t *peer, Tessera__Envelope *req,
                Tessera__Envelope__BodyCase want, uint32_t timeout_ms, Tessera__Envelope **out,
                char *err, size_t errlen) {
    char why[512] = "";
    int rc = ts_netclient_call(c, peer, req, timeout_ms, out, why, sizeof why);
    if (rc == TS_EPEER && strstr(why, "NOT_FOUND")) {
        ts_set_err(err, errlen, "%s", why);
        return TS_ENOTFOUND;
    }
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "%s", why);
        return rc;
    }
    if ((*out)->body_case != want) {
        ts_set_err(err, errlen, "the peer answered %s", ts_frame_body_name((*out)->body_case));
        ts_frame_free(*out);
        *out = NULL;
        return TS_ECORRUPT;
    }
    return TS_OK;
}

/* Checks the manifest against what was asked and the limits. */
static int check_manifest(const Tessera__WeightsManifest *m, const ts_hash_t *h, char *err,
                          size_t errlen) {
    if (!m->has_weights_hash || m->weights_hash.len != TS_HASH_BYTES ||
        memcmp(m->weights_hash.data, h->b, TS_HASH_BYTES) != 0 || !m->has_total_size ||
        !m->has_chunk_size || m->chunk_size == 0 || m->chunk_size > TS_WEIGHTS_CHUNK ||
        m->total_size == 0 || m->total_size > FETCH_MAX_BYTES) {
        ts_set_err(err, errlen, "the peer's manifest does not describe the file asked for");
        return TS_ECORRUPT;
    }
    uint64_t n = (m->total_size + m->chunk_size - 1) / m->chunk_size;
    if (m->n_chunk_hashes != n) {
        ts_set_err(err, errlen, "the manifest lists %zu chunks for %llu bytes in chunks of %u",
                   m->n_chunk_hashes, (unsigned long long)m->total_size, m->chunk_size);
        return TS_ECORRUPT;
    }
    for (size_t i = 0; i < m->n_chunk_hashes; i++)
        if (m->chunk_hashes[i].len != TS_HASH_BYTES) {
            ts_set_err(err, errlen, "chunk hash %zu of the manifest is not 32 bytes", i);
            return TS_ECORRUPT;
        }
    return TS_OK;
}

/* One chunk into the store: from the store when it is there and verifies, else from the peer. */
static int get_chunk(ts_netclient_t *c, ts_rpc_peer_t *peer, ts_store_t *store, const ts_hash_t *ch,
                     size_t want_len, uint32_t timeout_ms, int *fetched, char *err, size_t errlen) {
    unsigned char *have = NULL;
    size_t have_len = 0;
    *fetched = 0;
    if (ts_weights_get_chunk(store, ch, &have, &have_len) == TS_OK && have_len == want_len) {
        free(have);
        return TS_OK;
    }
    free(have);
    Tessera__ChunkRequest cr = TESSERA__CHUNK_REQUEST__INIT;
    cr.has_chunk_hash = 1;
    cr.chunk_hash.data = (uint8_t *)ch->b;
    cr.chunk_hash.len = TS_HASH_BYTES;
    Tessera__Envelope req = TESSERA__ENVELOPE__INIT, *resp = NULL;
    req.body_case = TESSERA__ENVELOPE__BODY_CHUNK_REQUEST;
    req.chunk_request = &cr;
    int rc = call(c, peer, &req, TESSERA__ENVELOPE__BODY_CHUNK, timeout_ms, &resp, err, errlen);
    if (rc != TS_OK)
        return rc;
    const Tessera__Chunk *k = resp->chunk;
    if (!k->has_data || k->data.len != want_len) {
        ts_set_err(err, errlen, "a chunk of %zu bytes arrived where %zu were expected",
                   k->has_data ? k->data.len : 0, want_len);
        rc = TS_ECORRUPT;
    } else if ((rc = ts_weights_put_chunk(store, ch, k->data.data, k->data.len)) == TS_ECORRUPT) {
        ts_set_err(err, errlen, "a chunk's bytes do not match its hash (not stored)");
    } else if (rc != TS_OK) {
        ts_set_err(err, errlen, "cannot store a chunk: %s", ts_strerror(rc));
    }
    *fetched = rc == TS_OK;
    ts_frame_free(resp);
    return rc;
}

int ts_fetch_file(ts_netclient_t *c, ts_rpc_peer_t *peer, ts_store_t *store, const ts_hash_t *h,
                  uint32_t timeout_ms, ts_fetch_progress_fn progress, void *ctx,
                  ts_fetch_stats_t *stats, char *err, size_t errlen) {
    ts_fetch_stats_t st = {0};
    double t0 = ts_now_s();
    if (ts_weights_bad_chunks(store, h, NULL, NULL) == 0) { /* already here, every chunk good */
        st.present = 1;
        if (stats)
            *stats = st;
        return TS_OK;
    }
    Tessera__WeightsManifestRequest mr = TESSERA__WEIGHTS_MANIFEST_REQUEST__INIT;
    mr.has_weights_hash = 1;
    mr.weights_hash.data = (uint8_t *)h->b;
    mr.weights_hash.len = TS_HASH_BYTES;
    Tessera__Envelope req = TESSERA__ENVELOPE__INIT, *resp = NULL;
    req.body_case = TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST;
    req.weights_manifest_request = &mr;
    int rc = call(c, peer, &req, TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST, timeout_ms, &resp, err,
                  errlen);
    if (rc != TS_OK)
        return rc;
    const Tessera__WeightsManifest *m = resp->weights_manifest;
    unsigned char *file = NULL;
    if ((rc = check_manifest(m, h, err, errlen)) == TS_OK) {
        file = malloc((size_t)m->total_size);
        if (!file)
            rc = TS_ENOMEM;
    }
    uint64_t done = 0;
    for (size_t i = 0; rc == TS_OK && i < m->n_chunk_hashes; i++) {
        ts_hash_t ch;
        memcpy(ch.b, m->chunk_hashes[i].data, TS_HASH_BYTES);
        size_t len =
            (size_t)(m->total_size - done < m->chunk_size ? m->total_size - done : m->chunk_size);
        int fetched = 0;
        rc = get_chunk(c, peer, store, &ch, len, timeout_ms, &fetched, err, errlen);
        unsigned char *buf = NULL;
        size_t got = 0;
        if (rc == TS_OK && (rc = ts_weights_get_chunk(store, &ch, &buf, &got)) == TS_OK) {
            if (got == len)
                memcpy(file + done, buf, len);
            else
                rc = TS_ECORRUPT;
        }
        free(buf);
        if (rc != TS_OK)
            break;
        done += len;
        if (fetched) {
            st.chunks_fetched++;
            st.bytes_fetched += len;
        } else {
            st.chunks_reused++;
            st.bytes_reused += len;
        }
        if (progress && progress(ctx, done, m->total_size, fetched)) {
            ts_set_err(err, errlen, "stopped after %llu of %llu bytes (resumable)",
                       (unsigned long long)done, (unsigned long long)m->total_size);
            rc = TS_ECANCELED;
            break;
        }
    }
    ts_hash_t got;
    if (rc == TS_OK) {
        ts_hash_compute(&got, file, (size_t)m->total_size);
        if (memcmp(got.b, h->b, TS_HASH_BYTES) != 0) {
            ts_set_err(err, errlen, "the reassembled file does not match its weights hash");
            rc = TS_ECORRUPT;
        }
    }
    if (rc == TS_OK)
        rc = ts_weights_import_buf(store, file, (size_t)m->total_size, &got, NULL, NULL, err,
                                   errlen);
    free(file);
    ts_frame_free(resp);
    st.seconds = ts_now_s() - t0;
    if (stats)
        *stats = st;
    return rc;
}
