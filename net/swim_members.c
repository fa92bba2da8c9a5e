/*
 * swim_members.c — the gossip core's member table (swim_internal.h): the random generator, the
 * id index (open addressing keyed by a salted hash of the id's first 8 bytes), the probe order,
 * adding and reaping members, the inspection functions of swim.h, and ts_swim_validate, which
 * checks the invariants stated at the top of swim.c.
 */
#include <string.h>

#include "base/error.h"
#include "net/swim_internal.h"

/* ---- the random generator ---------------------------------------------------------------- */

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** seeded through splitmix64 */
uint64_t ts_swim__rng_next(ts_swim_t *s) {
    uint64_t *r = s->rng;
    uint64_t result = rotl(r[1] * 5, 7) * 9, t = r[1] << 17;
    r[2] ^= r[0];
    r[3] ^= r[1];
    r[1] ^= r[2];
    r[0] ^= r[3];
    r[2] ^= t;
    r[3] = rotl(r[3], 45);
    return result;
}

void ts_swim__rng_seed(ts_swim_t *s, uint64_t seed) {
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        s->rng[i] = z ^ (z >> 31);
    }
}

/* Uniform in [0, n), n ≥ 1 (multiply-shift; the bias is below 2^-32). */
uint32_t ts_swim__rng_below(ts_swim_t *s, uint32_t n) {
    return (uint32_t)(((ts_swim__rng_next(s) >> 32) * (uint64_t)n) >> 32);
}

/* ---- the member index and the probe order ------------------------------------------------ */

static uint32_t index_home(const ts_swim_t *s, uint64_t fp) {
    uint64_t x = fp ^ s->salt;
    x = (x ^ (x >> 31)) * 0x7fb5d329728ea185ULL;
    x = (x ^ (x >> 27)) * 0x81dadef4bc2dd44dULL;
    return (uint32_t)(x ^ (x >> 33)) & s->index_mask;
}

uint32_t ts_swim__member_find(const ts_swim_t *s, const uint8_t id[TS_SWIM_ID_LEN]) {
    uint64_t fp = fp_of(id);
    for (uint32_t i = index_home(s, fp); s->index[i]; i = (i + 1) & s->index_mask) {
        uint32_t slot = s->index[i] - 1;
        if (s->members[slot].fp == fp && memcmp(id_of(s, slot), id, TS_SWIM_ID_LEN) == 0)
            return slot;
    }
    return NONE;
}

static void index_insert(ts_swim_t *s, uint32_t slot) {
    uint32_t i = index_home(s, s->members[slot].fp);
    while (s->index[i])
        i = (i + 1) & s->index_mask;
    s->index[i] = slot + 1;
}

/* Backward-shift deletion, as in swim_claims.c: no tombstones. */
static void index_remove(ts_swim_t *s, uint32_t slot) {
    uint32_t i = index_home(s, s->members[slot].fp);
    while (s->index[i] != slot + 1)
        i = (i + 1) & s->index_mask;
    uint32_t hole = i;
    for (uint32_t j = (hole + 1) & s->index_mask; s->index[j]; j = (j + 1) & s->index_mask) {
        uint32_t home = index_home(s, s->members[s->index[j] - 1].fp);
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            s->index[hole] = s->index[j];
            hole = j;
        }
    }
    s->index[hole] = 0;
}

static void order_set(ts_swim_t *s, uint32_t pos, uint32_t slot) {
    s->order[pos] = slot;
    s->members[slot].order_pos = pos;
}

/* Appends slot, then swaps it to a random place among the members not yet probed this round. */
void ts_swim__order_insert(ts_swim_t *s, uint32_t slot) {
    uint32_t pos = s->n_order++;
    order_set(s, pos, slot);
    uint32_t j = s->cursor + ts_swim__rng_below(s, s->n_order - s->cursor);
    uint32_t other = s->order[j];
    order_set(s, j, slot);
    order_set(s, pos, other);
}

/* Removes slot keeping [0, cursor) the members already probed this round: a hole there is
 * filled from the round's last probed member, and the hole that leaves from the array's end. */
void ts_swim__order_remove(ts_swim_t *s, uint32_t slot) {
    uint32_t pos = s->members[slot].order_pos;
    if (pos < s->cursor) {
        uint32_t last_probed = --s->cursor;
        if (pos != last_probed)
            order_set(s, pos, s->order[last_probed]);
        pos = last_probed;
    }
    uint32_t last = --s->n_order;
    if (pos != last)
        order_set(s, pos, s->order[last]);
    s->members[slot].order_pos = NONE;
}

void ts_swim__order_shuffle(ts_swim_t *s) {
    for (uint32_t i = s->n_order; i > 1; i--) {
        uint32_t j = ts_swim__rng_below(s, i), a = s->order[i - 1], b = s->order[j];
        order_set(s, i - 1, b);
        order_set(s, j, a);
    }
    s->cursor = 0;
}

/* A random live member other than us and other than the n slots in avoid; NONE after a few
 * unlucky draws (the caller then simply sends fewer). */
uint32_t ts_swim__random_member(ts_swim_t *s, const uint32_t *avoid, int n, bool alive_only) {
    for (int tries = 0; tries < 4 * (n + 2) && s->n_order > 0; tries++) {
        uint32_t slot = s->order[ts_swim__rng_below(s, s->n_order)];
        bool bad = alive_only && s->members[slot].state != TS_SWIM_ALIVE;
        for (int i = 0; i < n && !bad; i++)
            bad = avoid[i] == slot;
        if (!bad)
            return slot;
    }
    return NONE;
}

/* ---- witnesses --------------------------------------------------------------------------- */

/* The rank of a would-be witness w of suspect x: a fixed mix of both ids' first 8 bytes, with
 * no per-node salt, so that every node ranks the same way. */
static uint64_t witness_rank(uint64_t x, uint64_t w) {
    uint64_t z = x ^ (w * 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint32_t ts_swim__n_witnesses(const ts_swim_t *s) {
    int n = s->cfg.suspicion_confirm + 1;
    return n > MAX_WITNESSES ? MAX_WITNESSES : (uint32_t)n;
}

/* O(live members): a selection of the max lowest ranks, kept sorted in out. */
uint32_t ts_swim__witnesses(const ts_swim_t *s, uint32_t slot, uint32_t *out, uint32_t max) {
    uint64_t rank[MAX_WITNESSES], x = s->members[slot].fp;
    uint32_t n = 0;
    if (max > MAX_WITNESSES)
        max = MAX_WITNESSES;
    for (uint32_t i = 0; i <= s->n_order; i++) {
        uint32_t w = i == s->n_order ? SELF : s->order[i];
        if (w == slot || (w == SELF && !is_live(s->members[SELF].state)))
            continue;
        uint64_t r = witness_rank(x, s->members[w].fp);
        if (n == max && r >= rank[n - 1])
            continue;
        uint32_t j = n < max ? n++ : n - 1;
        for (; j > 0 && rank[j - 1] > r; j--) {
            rank[j] = rank[j - 1];
            out[j] = out[j - 1];
        }
        rank[j] = r;
        out[j] = w;
    }
    return n;
}

/* ---- adding and reaping members ---------------------------------------------------------- */

uint32_t ts_swim__member_add(ts_swim_t *s, uint32_t claim, int64_t now) {
    uint32_t slot;
    if (s->free_head != NONE) {
        slot = s->free_head;
        s->free_head = s->members[slot].inc;
    } else {
        slot = s->n_slots++;
    }
    member_t *m = &s->members[slot];
    const ts_swim_claim_t *c = ts_swim_claims_get(s->pool, claim);
    *m = (member_t){.fp = fp_of(c->id),
                    .change_ms = now,
                    .claim = claim,
                    .inc = c->incarnation,
                    .order_pos = NONE,
                    .bcast = NONE,
                    .susp = NONE16,
                    .state = TS_SWIM_ALIVE};
    s->count[TS_SWIM_ALIVE]++;
    index_insert(s, slot);
    if (slot != SELF)
        ts_swim__order_insert(s, slot);
    return slot;
}

void ts_swim__member_reap(ts_swim_t *s, uint32_t slot, int64_t now) {
    member_t *m = &s->members[slot];
    ts_swim__ev_push(s, TS_SWIM_EV_REAPED, slot, now);
    if (m->bcast != NONE)
        ts_swim__bc_remove(s, m->bcast);
    if (s->probe.active && s->probe.target == slot)
        s->probe.active = false;
    index_remove(s, slot);
    s->count[m->state]--;
    ts_swim_claims_unref(s->pool, m->claim);
    *m = (member_t){.claim = TS_SWIM_NO_CLAIM,
                    .inc = s->free_head,
                    .order_pos = NONE,
                    .bcast = NONE,
                    .susp = NONE16};
    s->free_head = slot;
}

/* ---- inspection -------------------------------------------------------------------------- */

void ts_swim__member_info(const ts_swim_t *s, uint32_t slot, ts_swim_member_info_t *info) {
    const member_t *m = &s->members[slot];
    info->claim = *claim_of(s, slot);
    info->incarnation = m->inc;
    info->state = m->state;
    info->change_ms = m->change_ms;
}

uint32_t ts_swim_member_count(const ts_swim_t *s) {
    uint32_t n = 0;
    for (int st = TS_SWIM_ALIVE; st <= TS_SWIM_LEFT; st++)
        n += s->count[st];
    return n;
}

uint32_t ts_swim_count(const ts_swim_t *s, ts_swim_state_t state) {
    return state >= TS_SWIM_ALIVE && state <= TS_SWIM_LEFT ? s->count[state] : 0;
}

uint32_t ts_swim_state_export(const ts_swim_t *s, ts_swim_member_info_t *out, uint32_t max) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_slots && n < max; i++)
        if (s->members[i].claim != TS_SWIM_NO_CLAIM)
            ts_swim__member_info(s, i, &out[n++]);
    return n;
}

int ts_swim_member_get(const ts_swim_t *s, const uint8_t id[TS_SWIM_ID_LEN],
                       ts_swim_member_info_t *info) {
    if (!s || !id || !info)
        return TS_EINVAL;
    uint32_t slot = ts_swim__member_find(s, id);
    if (slot == NONE)
        return TS_ENOTFOUND;
    ts_swim__member_info(s, slot, info);
    return TS_OK;
}

uint32_t ts_swim_incarnation(const ts_swim_t *s) { return s->members[SELF].inc; }
int ts_swim_health(const ts_swim_t *s) { return s->health; }
uint32_t ts_swim_pending_broadcasts(const ts_swim_t *s) { return s->n_bc; }
void ts_swim_get_stats(const ts_swim_t *s, ts_swim_stats_t *st) { *st = s->st; }

/* ---- self-check -------------------------------------------------------------------------- */

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return TS_ECORRUPT;                                                                    \
    } while (0)

int ts_swim_validate(const ts_swim_t *s) {
    if (!s)
        return TS_EINVAL;
    uint32_t count[TS_SWIM_LEFT + 1] = {0}, in_order = 0, indexed = 0, free_slots = 0;
    for (uint32_t f = s->free_head; f != NONE; f = s->members[f].inc) {
        CHECK(f < s->n_slots && s->members[f].claim == TS_SWIM_NO_CLAIM &&
              ++free_slots <= s->n_slots);
    }
    for (uint32_t i = 0; i < s->n_slots; i++) {
        const member_t *m = &s->members[i];
        if (m->claim == TS_SWIM_NO_CLAIM) {
            CHECK(m->state == 0);
            continue;
        }
        CHECK(m->state >= TS_SWIM_ALIVE && m->state <= TS_SWIM_LEFT);
        count[m->state]++;
        const ts_swim_claim_t *c = claim_of(s, i);
        CHECK(m->fp == fp_of(c->id) && ts_swim__member_find(s, c->id) == i);
        CHECK(m->inc >= c->incarnation);
        CHECK((c->kind == TS_SWIM_CLAIM_LEAVE) == (m->state == TS_SWIM_LEFT));
        bool should = i != SELF && is_live(m->state);
        CHECK(should == (m->order_pos != NONE));
        if (should) {
            CHECK(m->order_pos < s->n_order && s->order[m->order_pos] == i);
            in_order++;
        }
        CHECK((m->susp != NONE16) <= (m->state == TS_SWIM_SUSPECT));
        if (m->susp != NONE16)
            CHECK(m->susp < s->n_sp && s->sp[m->susp].member == i);
        if (m->bcast != NONE)
            CHECK(m->bcast < s->n_bc && s->bc[m->bcast].member == i);
    }
    CHECK(free_slots + count[1] + count[2] + count[3] + count[4] == s->n_slots);
    for (int st = TS_SWIM_ALIVE; st <= TS_SWIM_LEFT; st++)
        CHECK(count[st] == s->count[st]);
    CHECK(in_order == s->n_order && s->cursor <= s->n_order);
    for (uint32_t i = 0; i <= s->index_mask; i++)
        if (s->index[i]) {
            CHECK(s->index[i] - 1 < s->n_slots);
            indexed++;
        }
    CHECK(indexed + free_slots == s->n_slots);
    for (uint32_t i = 0; i < s->n_sp; i++)
        CHECK(s->members[s->sp[i].member].susp == i);
    for (uint32_t i = 0; i < s->n_bc; i++) {
        const bcast_t *b = &s->bc[i];
        CHECK(s->members[b->member].bcast == i);
        CHECK((b->claim != TS_SWIM_NO_CLAIM) ==
              (b->type == TS_SWIM_UP_ALIVE || b->type == TS_SWIM_UP_LEAVE));
    }
    CHECK(s->health >= 0 && s->health <= s->cfg.health_max);
    return TS_OK;
}

#undef CHECK

const char *ts_swim_state_name(int state) {
    switch (state) {
    case TS_SWIM_ALIVE: return "alive";
    case TS_SWIM_SUSPECT: return "suspect";
    case TS_SWIM_DEAD: return "dead";
    case TS_SWIM_LEFT: return "left";
    default: return "unknown";
    }
}

const char *ts_swim_event_name(int type) {
    switch (type) {
    case TS_SWIM_EV_JOINED: return "joined";
    case TS_SWIM_EV_SUSPECT: return "suspect";
    case TS_SWIM_EV_DEAD: return "dead";
    case TS_SWIM_EV_ALIVE_AGAIN: return "alive-again";
    case TS_SWIM_EV_LEFT: return "left";
    case TS_SWIM_EV_REAPED: return "reaped";
    case TS_SWIM_EV_ADDR_CHANGED: return "addr-changed";
    case TS_SWIM_EV_ADVERT_NEEDED: return "advert-needed";
    case TS_SWIM_EV_PUSH_PULL: return "push-pull";
    case TS_SWIM_EV_REFUTED: return "refuted";
    default: return "unknown";
    }
}
