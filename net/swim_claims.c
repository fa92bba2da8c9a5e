/*
 * swim_claims.c — the pool of signed claims (swim_claims.h).
 *
 * Entries live in one array allocated at creation; free entries form a list threaded through
 * their refs field. Lookup by content goes through an open-addressing index (linear probing,
 * at most half full) of entry numbers + 1, 0 meaning empty; deletion shifts later entries of
 * the same probe run back (no tombstones), so a lookup's cost depends only on the live load.
 * The key is a hash of the claim's fields; equality compares them all.
 */
#include "net/swim_claims.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

typedef struct {
    ts_swim_claim_t claim;
    uint32_t refs; /* 0: free, and then next_free is valid */
    uint32_t next_free;
    uint64_t hash;
} entry_t;

struct ts_swim_claims {
    entry_t *entries;
    uint32_t capacity, count, free_head;
    uint32_t *index; /* entry + 1, or 0 */
    uint32_t mask;   /* index size − 1 */
};

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Every field goes in; the signature alone would do for honest claims, but the pool must not
 * depend on that. */
static uint64_t claim_hash(const ts_swim_claim_t *c) {
    uint64_t h = mix64(c->kind ^ (uint64_t)c->incarnation << 8);
    for (int i = 0; i < TS_SWIM_ID_LEN; i += 8)
        h = mix64(h ^ load64(c->id + i));
    for (int i = 0; i < TS_SWIM_SIG_LEN; i += 8)
        h = mix64(h ^ load64(c->sig + i));
    for (int i = 0; i < TS_SWIM_HASH_LEN; i += 8)
        h = mix64(h ^ load64(c->advert_hash + i));
    h = mix64(h ^ c->advert_version);
    h = mix64(h ^ load64(c->addr.ip) ^ (uint64_t)c->addr.port << 48);
    return mix64(h ^ load64(c->addr.ip + 8));
}

static int claim_equal(const ts_swim_claim_t *a, const ts_swim_claim_t *b) {
    return a->kind == b->kind && a->incarnation == b->incarnation &&
           a->advert_version == b->advert_version && a->addr.port == b->addr.port &&
           memcmp(a->id, b->id, sizeof a->id) == 0 && memcmp(a->sig, b->sig, sizeof a->sig) == 0 &&
           memcmp(a->advert_hash, b->advert_hash, sizeof a->advert_hash) == 0 &&
           memcmp(a->addr.ip, b->addr.ip, sizeof a->addr.ip) == 0;
}

int ts_swim_claims_create(uint32_t capacity, ts_swim_claims_t **out) {
    if (!out || capacity == 0 || capacity > (1u << 30))
        return TS_EINVAL;
    *out = NULL;
    uint32_t size = 2;
    while (size < 2 * (uint64_t)capacity)
        size *= 2;
    ts_swim_claims_t *p = calloc(1, sizeof *p);
    if (!p)
        return TS_ENOMEM;
    p->entries = malloc(sizeof *p->entries * capacity);
    p->index = calloc(size, sizeof *p->index);
    if (!p->entries || !p->index) {
        ts_swim_claims_free(p);
        return TS_ENOMEM;
    }
    p->capacity = capacity;
    p->mask = size - 1;
    for (uint32_t i = 0; i < capacity; i++) {
        p->entries[i].refs = 0;
        p->entries[i].next_free = i + 1 < capacity ? i + 1 : TS_SWIM_NO_CLAIM;
    }
    p->free_head = 0;
    *out = p;
    return TS_OK;
}

void ts_swim_claims_free(ts_swim_claims_t *p) {
    if (!p)
        return;
    free(p->entries);
    free(p->index);
    free(p);
}

uint32_t ts_swim_claims_count(const ts_swim_claims_t *p) { return p ? p->count : 0; }

uint32_t ts_swim_claims_intern(ts_swim_claims_t *p, const ts_swim_claim_t *c) {
    uint64_t h = claim_hash(c);
    uint32_t i = (uint32_t)h & p->mask;
    for (; p->index[i]; i = (i + 1) & p->mask) {
        entry_t *e = &p->entries[p->index[i] - 1];
        if (e->hash == h && claim_equal(&e->claim, c)) {
            e->refs++;
            return p->index[i] - 1;
        }
    }
    if (p->free_head == TS_SWIM_NO_CLAIM)
        return TS_SWIM_NO_CLAIM;
    uint32_t n = p->free_head;
    entry_t *e = &p->entries[n];
    p->free_head = e->next_free;
    e->claim = *c;
    e->refs = 1;
    e->hash = h;
    p->index[i] = n + 1;
    p->count++;
    return n;
}

void ts_swim_claims_ref(ts_swim_claims_t *p, uint32_t h) { p->entries[h].refs++; }

/* Removes entry n from the index, moving back the entries after it in its probe run that
 * would otherwise become unreachable. */
static void index_remove(ts_swim_claims_t *p, uint32_t n) {
    uint32_t i = (uint32_t)p->entries[n].hash & p->mask;
    while (p->index[i] != n + 1)
        i = (i + 1) & p->mask;
    uint32_t hole = i;
    for (uint32_t j = (hole + 1) & p->mask; p->index[j]; j = (j + 1) & p->mask) {
        uint32_t home = (uint32_t)p->entries[p->index[j] - 1].hash & p->mask;
        /* j's entry may move into the hole unless its home lies cyclically in (hole, j] */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            p->index[hole] = p->index[j];
            hole = j;
        }
    }
    p->index[hole] = 0;
}

void ts_swim_claims_unref(ts_swim_claims_t *p, uint32_t h) {
    if (h == TS_SWIM_NO_CLAIM)
        return;
    entry_t *e = &p->entries[h];
    if (--e->refs > 0)
        return;
    index_remove(p, h);
    e->next_free = p->free_head;
    p->free_head = h;
    p->count--;
}

const ts_swim_claim_t *ts_swim_claims_get(const ts_swim_claims_t *p, uint32_t h) {
    return &p->entries[h].claim;
}
