/*
 * swim_claims.h — internal to net/: the reference-counted pool of signed claims behind
 * ts_swim_claims_t (swim.h). Used only by the gossip core (swim*.c, through swim_internal.h).
 *
 * A handle names one distinct claim (every field equal, signature included). Interning a claim
 * returns its handle with one more reference, creating the entry if needed; the entry lives
 * until its last reference is dropped. Handles are dense indices below the pool's capacity.
 */
#ifndef TS_SWIM_CLAIMS_H
#define TS_SWIM_CLAIMS_H

#include <stdint.h>

#include "net/swim.h"

#define TS_SWIM_NO_CLAIM UINT32_MAX

/* The handle of c with one more reference, or TS_SWIM_NO_CLAIM when c is new and the pool is
 * full. */
uint32_t ts_swim_claims_intern(ts_swim_claims_t *pool, const ts_swim_claim_t *c);
/* One more reference to h. */
void ts_swim_claims_ref(ts_swim_claims_t *pool, uint32_t h);
/* One reference less; the entry is freed with its last. h may be TS_SWIM_NO_CLAIM (no-op). */
void ts_swim_claims_unref(ts_swim_claims_t *pool, uint32_t h);
/* The claim behind h, valid while h is referenced. */
const ts_swim_claim_t *ts_swim_claims_get(const ts_swim_claims_t *pool, uint32_t h);

#endif
