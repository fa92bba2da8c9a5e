/*
 * status_json.h — a node's status view (StatusResponse, docs/protocol.md "Status") as JSON: what
 * `tessera status --json` prints and what tesserad's status page reads from /status.json. One
 * builder, so the two cannot drift apart. The object:
 *
 *   {"node_id": "<hex>", "live_members": n,
 *    "members": [{"node_id", "node_id_short", "state", "incarnation", "addr",
 *                 "last_change_age_ms", "advert_version"}],
 *    "adverts": [{"node_id", "valid", "version", "partition_id", "num_clusters", "cluster",
 *                 "weights_hash", "objective", "model": {...}, "centroid_dims",
 *                 "capacity": {"items_per_s", "max_batch", "queue_limit", "device"?, "max_rows"?,
 *                              "model_bytes"?, "row_bytes"?},
 *                 "load": {...}, "training": {...} | null, "router"}],
 *    "load": {...} | null,
 *    "aggregates": {"clusters": [{"partition_id", "cluster", "live_experts"}],
 *                   "uncovered": [{"partition_id", "cluster"}], "total_capacity",
 *                   "request_rate", "live_members"},
 *    "health": "ok" | "alone: …" | "handshakes refused: …" | null (a node that does not say),
 *    "metrics": "http://HOST:PORT/metrics" | null,
 *    "bans": [{"node_id", "expert", "reason", "since_ms", "expelled"}]}  (daemon/trust.h)
 */
#ifndef TS_NET_STATUS_JSON_H
#define TS_NET_STATUS_JSON_H

#include <jansson.h>

#include "net/frame.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The adverts of a response, decoded once. bodies[i] is NULL when adverts[i] does not decode (a
 * node must not send those; it is shown as such rather than trusted). */
typedef struct ts_status_advert_key ts_status_advert_key_t;
typedef struct ts_status_adverts {
    size_t n;
    Tessera__AdvertBody **bodies;
    ts_status_advert_key_t *by_id; /* the adverts by node id, for ts_status_advert_of */
} ts_status_adverts_t;

/* Decodes r's adverts into a (free with ts_status_adverts_free). TS_ENOMEM. */
int ts_status_adverts_decode(const Tessera__StatusResponse *r, ts_status_adverts_t *a);
void ts_status_adverts_free(ts_status_adverts_t *a);
/* The decoded advert of node id, or NULL (none, or one that did not decode). O(log n): status
 * answers of thousands of members look up every member's advert. */
const Tessera__AdvertBody *ts_status_advert_of(const Tessera__StatusResponse *r,
                                               const ts_status_adverts_t *a,
                                               const ProtobufCBinaryData *id);
/* The hex of b's first digits / 2 bytes (all of them when b is shorter); out holds digits + 1. */
void ts_status_hex(const ProtobufCBinaryData *b, size_t digits, char *out);
/* "alive", "suspect", "dead", "left", "?". */
const char *ts_status_state_name(int s);
/* The object above (a new reference; NULL when out of memory). */
json_t *ts_status_json(const Tessera__StatusResponse *r, const ts_status_adverts_t *ad);

#ifdef __cplusplus
}
#endif

#endif
