/*
 * swim_digest.c — push-pull's digests (swim.h, "Push-pull by digests"): a hash per bucket of
 * members, so that two nodes whose views agree compare them in one 2 KiB message, and the
 * members of the buckets in which they differ, which is all the exchange then carries.
 *
 * A member's hash covers what every node should agree on once gossip has settled: its id, its
 * state class (live, dead, left), its address and its advert. The bucket's hash is the XOR of
 * its members' hashes, so it does not depend on the order of the member table.
 */
#include <string.h>

#include "net/swim_internal.h"

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}

static uint64_t bytes_hash(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = 0;
        memcpy(&v, p + i, n - i < 8 ? n - i : 8);
        h = mix(h, v);
    }
    return h;
}

static uint64_t member_hash(const ts_swim_t *s, uint32_t slot) {
    const member_t *m = &s->members[slot];
    const ts_swim_claim_t *c = claim_of(s, slot);
    int cls = is_live(m->state) ? 1 : m->state;                            /* DEAD 3, LEFT 4 */
    uint64_t h = bytes_hash(0x7473776d64696731ULL, c->id, TS_SWIM_ID_LEN); /* "tswmdig1" */
    h = mix(h, (uint64_t)cls);
    h = bytes_hash(h, c->addr.ip, sizeof c->addr.ip);
    h = mix(h, c->addr.port);
    h = mix(h, c->advert_version);
    return bytes_hash(h, c->advert_hash, TS_SWIM_HASH_LEN);
}

void ts_swim_state_digest(const ts_swim_t *s, ts_swim_digest_t *d) {
    memset(d, 0, sizeof *d);
    for (uint32_t i = 0; i < s->n_slots; i++)
        if (s->members[i].claim != TS_SWIM_NO_CLAIM)
            d->bucket[ts_swim_digest_bucket(id_of(s, i))] ^= member_hash(s, i);
}

uint32_t ts_swim_digest_diff(const ts_swim_digest_t *a, const ts_swim_digest_t *b,
                             uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES]) {
    uint32_t n = 0;
    memset(mask, 0, TS_SWIM_DIGEST_MASK_BYTES);
    for (uint32_t i = 0; i < TS_SWIM_DIGEST_BUCKETS; i++)
        if (a->bucket[i] != b->bucket[i]) {
            mask[i / 8] |= (uint8_t)(1u << (i % 8));
            n++;
        }
    return n;
}

uint32_t ts_swim_state_export_buckets(const ts_swim_t *s,
                                      const uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES],
                                      ts_swim_member_info_t *out, uint32_t max) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_slots && n < max; i++) {
        if (s->members[i].claim == TS_SWIM_NO_CLAIM)
            continue;
        uint32_t b = ts_swim_digest_bucket(id_of(s, i));
        if (mask[b / 8] & (1u << (b % 8)))
            ts_swim__member_info(s, i, &out[n++]);
    }
    return n;
}
