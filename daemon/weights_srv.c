/*
 * weights_srv.c — manifests and chunks for other nodes (daemon/weights_srv.h).
 *
 * Chunk requests wait in a FIFO; pump() sends from its head while the token bucket is not in
 * debt and, when it is, arms the one timer for the moment the debt is paid. The chunk is read
 * from the store only when its turn comes, so waiting requests hold no chunk memory.
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/weights_srv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/list.h"

#define HASH TS_HASH_BYTES

typedef struct pending {
    ts_list_t node;
    ts_weights_srv_t *w;
    ts_rpc_request_t *req;
    ts_hash_t hash;
} pending_t;

struct ts_weights_srv {
    uv_loop_t *loop;
    ts_rpc_t *rpc;
    ts_store_t *store;
    ts_weights_srv_opts_t o;
    uv_timer_t timer;
    ts_list_t queue;
    int n_pending;
    double balance;        /* bytes the bucket holds: ≤ 0, negative while in debt */
    uint64_t refilled_ns;  /* when balance was last brought up to date */
    uint64_t wait_from_ns; /* when the current wait for the bucket began, 0: none */
    int stopping, closed;
    ts_weights_srv_stats_t st;
};

void ts_weights_srv_opts_default(ts_weights_srv_opts_t *o) {
    *o = (ts_weights_srv_opts_t){.bandwidth = 0, .max_pending = 64};
}

/* ---- manifests -------------------------------------------------------------------------------- */

static Tessera__DType wire_dtype(const char *d) {
    if (d && strcmp(d, "F16") == 0)
        return TESSERA__DTYPE__DTYPE_F16;
    if (d && strcmp(d, "BF16") == 0)
        return TESSERA__DTYPE__DTYPE_BF16;
    return TESSERA__DTYPE__DTYPE_F32; /* F32, and what the wire has no name for */
}

static int send_manifest(void *ctx, const ts_weights_info_t *info) {
    ts_rpc_request_t *req = ctx;
    ProtobufCBinaryData *hashes = malloc((info->n_chunks ? info->n_chunks : 1) * sizeof *hashes);
    if (!hashes)
        return TS_ENOMEM;
    for (uint64_t i = 0; i < info->n_chunks; i++)
        hashes[i] = (ProtobufCBinaryData){HASH, (uint8_t *)info->chunks[i].b};
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__WeightsManifest m = TESSERA__WEIGHTS_MANIFEST__INIT;
    m.has_weights_hash = m.has_total_size = m.has_chunk_size = m.has_dtype = 1;
    m.weights_hash = (ProtobufCBinaryData){HASH, (uint8_t *)info->hash.b};
    m.total_size = info->size;
    m.chunk_size = (uint32_t)info->chunk_size;
    m.n_chunk_hashes = info->n_chunks;
    m.chunk_hashes = hashes;
    m.dtype = wire_dtype(info->dtype);
    env.body_case = TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST;
    env.weights_manifest = &m;
    ts_rpc_reply(req, &env);
    free(hashes);
    return TS_OK;
}

static void on_manifest(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    ts_weights_srv_t *w = arg;
    ts_hash_t h;
    memcpy(h.b, env->weights_manifest_request->weights_hash.data, HASH);
    int rc = w->stopping ? TS_ECLOSED : ts_weights_info(w->store, &h, send_manifest, req);
    if (rc == TS_OK) {
        w->st.manifests++;
        return;
    }
    char hex[TS_HASH_HEX];
    ts_hash_hex(&h, hex);
    if (rc == TS_ENOTFOUND) {
        w->st.not_found++;
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_NOT_FOUND, "no weights %s here", hex);
    } else {
        w->st.failed++;
        ts_rpc_reply_error(req,
                           w->stopping ? TESSERA__ERROR_CODE__ERROR_UNAVAILABLE
                                       : TESSERA__ERROR_CODE__ERROR_INTERNAL,
                           "the manifest of %s cannot be read: %s", hex, ts_strerror(rc));
    }
}

/* ---- chunks ---------------------------------------------------------------------------------- */

static void send_chunk(ts_weights_srv_t *w, pending_t *p, size_t *sent) {
    unsigned char *buf = NULL;
    size_t len = 0;
    *sent = 0;
    int rc = ts_weights_get_chunk(w->store, &p->hash, &buf, &len);
    char hex[TS_HASH_HEX];
    ts_hash_hex(&p->hash, hex);
    if (rc == TS_OK) {
        Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
        Tessera__Chunk c = TESSERA__CHUNK__INIT;
        c.has_chunk_hash = c.has_data = 1;
        c.chunk_hash = (ProtobufCBinaryData){HASH, p->hash.b};
        c.data = (ProtobufCBinaryData){len, buf};
        env.body_case = TESSERA__ENVELOPE__BODY_CHUNK;
        env.chunk = &c;
        ts_rpc_reply(p->req, &env);
        w->st.chunks++;
        w->st.bytes += len;
        *sent = len;
    } else if (rc == TS_ENOTFOUND) {
        w->st.not_found++;
        ts_rpc_reply_error(p->req, TESSERA__ERROR_CODE__ERROR_NOT_FOUND, "no chunk %s here", hex);
    } else {
        if (rc == TS_ECORRUPT)
            w->st.damaged++;
        else
            w->st.failed++;
        ts_rpc_reply_error(p->req, TESSERA__ERROR_CODE__ERROR_INTERNAL,
                           "chunk %s cannot be served: %s", hex,
                           rc == TS_ECORRUPT ? "damaged in this node's store" : ts_strerror(rc));
    }
    free(buf);
}

/* Brings the balance up to now: it grows at bandwidth bytes per second, up to 0. */
static void refill(ts_weights_srv_t *w) {
    uint64_t now = uv_hrtime();
    w->balance += (double)(now - w->refilled_ns) / 1e9 * (double)w->o.bandwidth;
    if (w->balance > 0)
        w->balance = 0;
    w->refilled_ns = now;
}

static void timer_cb(uv_timer_t *t);

/* Sends from the head of the queue while the bucket allows, then waits for it if need be. */
static void pump(ts_weights_srv_t *w) {
    int limited = w->o.bandwidth > 0;
    while (!ts_list_empty(&w->queue)) {
        if (limited) {
            refill(w);
            if (w->balance < 0)
                break;
        }
        pending_t *p = TS_CONTAINER_OF(w->queue.next, pending_t, node);
        ts_list_remove(&p->node);
        w->n_pending--;
        if (w->wait_from_ns) {
            w->st.throttled_ms += (uv_hrtime() - w->wait_from_ns) / 1000000u;
            w->wait_from_ns = 0;
        }
        if (ts_rpc_request_expired(p->req)) {
            w->st.expired++;
            ts_rpc_reply_error(p->req, TESSERA__ERROR_CODE__ERROR_DEADLINE_EXCEEDED,
                               "the deadline passed while waiting for bandwidth");
        } else {
            size_t sent;
            send_chunk(w, p, &sent);
            w->balance -= limited ? (double)sent : 0.0;
        }
        free(p);
    }
    if (limited && !ts_list_empty(&w->queue) && !uv_is_active((uv_handle_t *)&w->timer)) {
        if (!w->wait_from_ns)
            w->wait_from_ns = uv_hrtime();
        double ms = ceil(-w->balance / (double)w->o.bandwidth * 1000.0);
        uv_timer_start(&w->timer, timer_cb, ms < 1 ? 1 : (uint64_t)ms, 0);
    }
}

static void timer_cb(uv_timer_t *t) { pump(TS_CONTAINER_OF(t, ts_weights_srv_t, timer)); }

static void on_chunk_cancel(ts_rpc_request_t *req, void *arg) {
    pending_t *p = arg;
    ts_list_remove(&p->node);
    p->w->n_pending--;
    p->w->st.cancelled++;
    ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_CANCELLED, "cancelled");
    free(p);
}

/* The retry hint of a busy answer: the time the queue needs at full bandwidth. */
static uint32_t retry_ms(const ts_weights_srv_t *w) {
    if (!w->o.bandwidth)
        return 100;
    double ms = ((double)w->n_pending * (double)TS_WEIGHTS_CHUNK - w->balance) /
                (double)w->o.bandwidth * 1000.0;
    return ms > 60000 ? 60000 : (uint32_t)ceil(ms);
}

static void on_chunk(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    ts_weights_srv_t *w = arg;
    if (w->stopping) {
        w->st.failed++;
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE,
                           "this node is shutting down");
        return;
    }
    if (w->n_pending >= w->o.max_pending) {
        w->st.busy++;
        ts_rpc_reply_busy(req, retry_ms(w));
        return;
    }
    pending_t *p = calloc(1, sizeof *p);
    if (!p) {
        w->st.failed++;
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    p->w = w;
    p->req = req;
    memcpy(p->hash.b, env->chunk_request->chunk_hash.data, HASH);
    ts_list_push(&w->queue, &p->node);
    w->n_pending++;
    ts_rpc_request_on_cancel(req, on_chunk_cancel, p);
    pump(w);
}

/* ---- life cycle ------------------------------------------------------------------------------ */

int ts_weights_srv_new(ts_weights_srv_t **out, uv_loop_t *loop, ts_rpc_t *rpc, ts_store_t *store,
                       const ts_weights_srv_opts_t *o) {
    if (!out || !loop || !rpc || !store)
        return TS_EINVAL;
    *out = NULL;
    ts_weights_srv_opts_t def;
    ts_weights_srv_opts_default(&def);
    if (!o)
        o = &def;
    if (o->max_pending < 1)
        return TS_EINVAL;
    ts_weights_srv_t *w = calloc(1, sizeof *w);
    if (!w)
        return TS_ENOMEM;
    w->loop = loop;
    w->rpc = rpc;
    w->store = store;
    w->o = *o;
    w->refilled_ns = uv_hrtime();
    ts_list_init(&w->queue);
    uv_timer_init(loop, &w->timer);
    ts_rpc_handle(rpc, TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST, on_manifest, w);
    ts_rpc_handle(rpc, TESSERA__ENVELOPE__BODY_CHUNK_REQUEST, on_chunk, w);
    *out = w;
    return TS_OK;
}

static void timer_closed(uv_handle_t *h) {
    TS_CONTAINER_OF(h, ts_weights_srv_t, timer)->closed = 1;
}

void ts_weights_srv_shutdown(ts_weights_srv_t *w) {
    if (!w || w->stopping)
        return;
    w->stopping = 1;
    while (!ts_list_empty(&w->queue)) {
        pending_t *p = TS_CONTAINER_OF(w->queue.next, pending_t, node);
        ts_list_remove(&p->node);
        w->n_pending--;
        w->st.failed++;
        ts_rpc_reply_error(p->req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE,
                           "this node is shutting down");
        free(p);
    }
    uv_close((uv_handle_t *)&w->timer, timer_closed);
}

int ts_weights_srv_free(ts_weights_srv_t *w) {
    if (!w)
        return TS_OK;
    ts_weights_srv_shutdown(w);
    if (!w->closed)
        return TS_EBUSY;
    ts_rpc_handle(w->rpc, TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST, NULL, NULL);
    ts_rpc_handle(w->rpc, TESSERA__ENVELOPE__BODY_CHUNK_REQUEST, NULL, NULL);
    free(w);
    return TS_OK;
}

void ts_weights_srv_stats(const ts_weights_srv_t *w, ts_weights_srv_stats_t *out) { *out = w->st; }
