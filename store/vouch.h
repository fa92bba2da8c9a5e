/*
 * vouch.h — the replicas a client has vouched for, kept between runs (the `meta` database).
 *
 * A client spot-checks remote answers (client/remote.h): every answer of a replica until one of
 * them has agreed with another replica's — the replica is then vouched for — and afterwards a
 * drawn fraction. Without memory, each run pays those first checks again for every replica
 * (~20 requests a run on an 8-replica expert). This records each vouch — the node, the expert's
 * weights, the device class and precision its agreeing answer claimed, when — so that the next
 * run within a time to live starts from it, and forgets every vouch of a node caught lying.
 *
 * Key: "vouch/" + node id (32 bytes) + weights hash (32 bytes). Value, integers big-endian:
 *   offset  size  field
 *   0       1     version, 1
 *   1       1     precision (a Tessera__DType value, 1..255)
 *   2       8     when, unix seconds, two's complement
 *   10      1     n, the device class's length, 1..TS_VOUCH_CLASS_MAX
 *   11      n     the device class
 * and nothing after. A value that does not decode is treated as absent (and overwritten by the
 * next vouch), never a crash.
 */
#ifndef TS_VOUCH_H
#define TS_VOUCH_H

#include <stdint.h>

#include "store/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_VOUCH_ID_BYTES 32
#define TS_VOUCH_CLASS_MAX 127

typedef struct ts_vouch {
    uint8_t node[TS_VOUCH_ID_BYTES];
    uint8_t weights[TS_VOUCH_ID_BYTES];
    char device_class[TS_VOUCH_CLASS_MAX + 1]; /* NUL-terminated, 1..127 bytes */
    uint8_t precision;                         /* 1..255 */
    int64_t when;                              /* unix seconds */
} ts_vouch_t;

/* Records (or refreshes) a vouch. TS_EINVAL for an empty or too long class, precision 0. */
int ts_vouch_put(ts_store_t *s, const ts_vouch_t *v);
/* The vouch for (node, weights) made at most ttl_s seconds before now (and not after now + 60,
 * a clock that moved back): TS_OK with *v filled; TS_ENOTFOUND when there is none, it is older,
 * or it does not decode. */
int ts_vouch_get(ts_store_t *s, const uint8_t node[TS_VOUCH_ID_BYTES],
                 const uint8_t weights[TS_VOUCH_ID_BYTES], int64_t ttl_s, int64_t now,
                 ts_vouch_t *v);
/* Forgets every vouch of a node (all experts); *n (may be NULL) gets how many. */
int ts_vouch_forget(ts_store_t *s, const uint8_t node[TS_VOUCH_ID_BYTES], int *n);

/* The value's bytes for v (TS_VOUCH_VALUE_MAX at most): its length, or −1 for a v that cannot
 * be encoded. Decoding: TS_OK or TS_ECORRUPT. Exposed for the tests. */
#define TS_VOUCH_VALUE_MAX (11 + TS_VOUCH_CLASS_MAX)
int ts_vouch_encode(const ts_vouch_t *v, uint8_t *out);
int ts_vouch_decode(const uint8_t *val, size_t len, ts_vouch_t *v);

#ifdef __cplusplus
}
#endif

#endif
