/*
 * swim.c — SWIM membership with Lifeguard's refinements, as a pure state machine (swim.h).
 *
 * The design in prose. A node keeps one member table, itself in slot 0. Every other live
 * member (alive or suspect) sits in the probe order, an array walked round-robin: each probe
 * round pings the next member; when the walk reaches the end the array is reshuffled, and a new
 * member is inserted at a random place in the part not yet walked (SWIM §4.3), so every live
 * member is probed once per round and within n rounds of joining. A probe that gets no ack
 * within the probe timeout asks k other members to ping the target for it (ping-req); if
 * neither a direct nor a relayed ack arrives by the end of the round, the target becomes
 * suspect.
 *
 * Updates (alive and leave claims, suspect and dead accusations) are queued for gossip, at
 * most one per member (a newer update about X replaces the older), and piggybacked on every
 * datagram — claims before deaths before suspicions, then fewest transmissions first — until
 * each has been sent λ·⌈log10(n+1)⌉ times.
 * Besides the probes, a gossip round every gossip interval sends the queue to a few random
 * members, which is what spreads news in about log(n) rounds.
 *
 * Lifeguard's three refinements (Dadgar et al. 2018):
 *  - suspicion timeouts start at β times the floor and fall toward the floor, log-scaled, as
 *    independent accusers confirm the suspicion (LHA-Suspicion);
 *  - a local health multiplier h (0..S) stretches our own probe interval and timeout by
 *    (1 + h): it rises when our probes fail, when helpers we asked send no nack, when we have
 *    to refute a suspicion about ourselves, and when we notice we were not running (a tick far
 *    past its deadline); it falls with every successful probe (LHA-Probe);
 *  - a datagram to a member we hold suspect or dead carries that accusation first, so the
 *    member learns of it at once and can refute (the buddy system). We also send a refutation
 *    straight back to the accuser that made us refute.
 *
 * What we add. A tick that comes far past its deadline means we were not running (a stalled
 * process, a suspended VM): the probe in flight is abandoned rather than blamed on its target,
 * and suspicions that ran out meanwhile get one probe interval's grace, so that refutations
 * waiting in our socket are read before we pass a verdict. An ack from a member that does not
 * know us says so (WHO_ARE_YOU) and we introduce ourselves. Push-pull sometimes picks a member
 * held dead (Serf's reconnect), which heals a partition after which each side believes the
 * other dead. A merge gossips on what is new to us, except while we are joining, when
 * everything is new to us and nothing to the network.
 *
 * Invariants: a member is in the probe order iff it is not us and its state is alive or
 * suspect; it has a suspicion entry iff it is suspect (and the suspicion table was not full);
 * members[i].bcast and the queue entry's member point at each other; every claim handle held
 * (by a member or a queue entry) is one reference in the pool.
 */
#include "net/swim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "net/swim_claims.h"
#include "net/swim_wire.h"

#define NONE UINT32_MAX
#define NONE16 UINT16_MAX
#define SELF 0u
#define NEVER INT64_MAX
#define MAX_SEEDS 8
#define MAX_CONFIRM 16 /* bound of suspicion_confirm */
#define ANSWERED 16    /* accusers we answered lately, so as to answer each at most once a round */

/* ---- tables ------------------------------------------------------------------------------ */

typedef struct {
    uint64_t fp;       /* first 8 bytes of the id: the index's key, checked before the full id */
    int64_t change_ms; /* last state change */
    uint32_t claim;    /* pool handle; TS_SWIM_NO_CLAIM when the slot is free */
    uint32_t inc;      /* the state's incarnation; the free list's link when free */
    uint32_t order_pos;
    uint32_t bcast;
    uint16_t susp;
    uint8_t state; /* 0 when free */
} member_t;

typedef struct {
    uint32_t member;
    uint32_t claim;  /* ALIVE, LEAVE: our reference to the claim */
    uint32_t inc;    /* SUSPECT, DEAD */
    uint64_t serial; /* queue order: among equal transmit counts, newer goes first */
    uint64_t mark;   /* the datagram that last took it */
    uint8_t type;
    uint8_t transmits;
    uint8_t from[TS_SWIM_ID_LEN]; /* SUSPECT, DEAD: the accuser */
} bcast_t;

typedef struct {
    uint32_t member;
    int64_t start_ms, deadline_ms;
    int64_t check_at; /* the last-chance ping; INT64_MAX once sent */
    uint32_t n_accusers;
    uint64_t accusers[MAX_CONFIRM + 1]; /* id fingerprints, the first accuser first */
} susp_t;

typedef struct {
    bool used;
    uint32_t seq;     /* our ping to the target */
    uint32_t req_seq; /* the requester's ping-req */
    ts_swim_addr_t req_addr;
    int64_t deadline_ms;
} relay_t;

enum { OUT_SELF_CLAIM = 1 }; /* put our own claim first in the piggyback */

typedef struct {
    ts_swim_addr_t to;
    uint32_t dest; /* member slot of the receiver, NONE when unknown (buddy piggyback) */
    uint64_t dest_fp;
    uint32_t seq;
    uint8_t type, flags, ack_flags;
    uint8_t target[TS_SWIM_ID_LEN];
    ts_swim_addr_t target_addr;
} out_t;

typedef struct {
    bool active, acked, indirect;
    uint32_t target;
    uint64_t target_fp;
    uint32_t seq;
    int64_t timeout_at;
    int nacks_expected, nacks;
} probe_t;

struct ts_swim {
    ts_swim_config_t cfg;
    ts_swim_claims_t *pool;
    bool own_pool;
    uint64_t rng[4];
    uint64_t salt; /* keys the member index, so ids cannot be chosen to collide */

    member_t *members;
    uint32_t n_slots, free_head;
    uint32_t *index; /* slot + 1, or 0 */
    uint32_t index_mask;
    uint32_t *order;
    uint32_t n_order, cursor;
    uint32_t count[TS_SWIM_LEFT + 1]; /* members per state, ourselves included */

    bcast_t *bc;
    uint32_t n_bc;
    uint64_t bc_serial;
    uint64_t pkt_serial;
    susp_t *sp;
    uint32_t n_sp;
    relay_t *relays;
    out_t *out;
    uint32_t out_head, out_len;
    ts_swim_event_t *ev;
    uint32_t ev_head, ev_len;

    probe_t probe;
    int64_t next_probe_at, next_gossip_at, next_push_pull_at, next_reap_at, join_retry_at;
    ts_swim_addr_t seeds[MAX_SEEDS];
    uint32_t n_seeds;
    bool joining; /* joined from knowing nobody; no merge has taught us the network yet */
    bool leaving;
    int64_t leave_at;
    int health;
    int64_t last_input_ms; /* the latest time a tick or a datagram came in */
    uint32_t seq;
    struct {
        uint64_t fp;
        int64_t at_ms;
    } answered[ANSWERED];
    ts_swim_stats_t st;
};

/* ---- small helpers ----------------------------------------------------------------------- */

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** seeded through splitmix64 */
static uint64_t rng_next(ts_swim_t *s) {
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

static void rng_seed(ts_swim_t *s, uint64_t seed) {
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        s->rng[i] = z ^ (z >> 31);
    }
}

/* Uniform in [0, n), n ≥ 1 (multiply-shift; the bias is below 2^-32). */
static uint32_t rng_below(ts_swim_t *s, uint32_t n) {
    return (uint32_t)(((rng_next(s) >> 32) * (uint64_t)n) >> 32);
}

static uint64_t fp_of(const uint8_t id[TS_SWIM_ID_LEN]) {
    uint64_t v;
    memcpy(&v, id, 8);
    return v;
}

static uint32_t index_home(const ts_swim_t *s, uint64_t fp) {
    uint64_t x = fp ^ s->salt;
    x = (x ^ (x >> 31)) * 0x7fb5d329728ea185ULL;
    x = (x ^ (x >> 27)) * 0x81dadef4bc2dd44dULL;
    return (uint32_t)(x ^ (x >> 33)) & s->index_mask;
}

static const ts_swim_claim_t *claim_of(const ts_swim_t *s, uint32_t slot) {
    return ts_swim_claims_get(s->pool, s->members[slot].claim);
}

static const uint8_t *id_of(const ts_swim_t *s, uint32_t slot) { return claim_of(s, slot)->id; }

static bool is_live(int state) { return state == TS_SWIM_ALIVE || state == TS_SWIM_SUSPECT; }

static uint32_t n_live(const ts_swim_t *s) {
    return s->count[TS_SWIM_ALIVE] + s->count[TS_SWIM_SUSPECT];
}

static int64_t probe_interval(const ts_swim_t *s) {
    return (int64_t)s->cfg.probe_interval_ms * (1 + s->health);
}

static int64_t probe_timeout(const ts_swim_t *s) {
    return (int64_t)s->cfg.probe_timeout_ms * (1 + s->health);
}

static void health_up(ts_swim_t *s) {
    if (s->health < s->cfg.health_max)
        s->health++;
}

static void health_down(ts_swim_t *s) {
    if (s->health > 0)
        s->health--;
}

/* ---- timing formulas --------------------------------------------------------------------- */

int64_t ts_swim_suspicion_min_ms(const ts_swim_config_t *cfg, uint32_t n) {
    double scaled = cfg->suspicion_mult * log10(n > 1 ? (double)n : 1.0) * cfg->probe_interval_ms;
    int64_t t = (int64_t)scaled;
    return t > cfg->suspicion_min_ms ? t : cfg->suspicion_min_ms;
}

int64_t ts_swim_suspicion_max_ms(const ts_swim_config_t *cfg, uint32_t n) {
    return ts_swim_suspicion_min_ms(cfg, n) * cfg->suspicion_max_mult;
}

int ts_swim_retransmit_limit(const ts_swim_config_t *cfg, uint32_t n) {
    return cfg->retransmit_mult * (int)ceil(log10((double)n + 1.0));
}

/* Lifeguard's suspicion timeout after `accusers` independent accusers (the first included):
 * the maximum with one, falling with log(confirmations + 1) / log(K + 1) to the minimum at K
 * confirmations. K is capped at n − 2: only that many others can accuse independently. */
static int64_t suspicion_timeout(const ts_swim_t *s, uint32_t accusers) {
    uint32_t n = n_live(s);
    int64_t lo = ts_swim_suspicion_min_ms(&s->cfg, n), hi = lo * s->cfg.suspicion_max_mult;
    int k = s->cfg.suspicion_confirm;
    if (n < 2 || (int64_t)k > (int64_t)n - 2)
        k = n < 2 ? 0 : (int)n - 2;
    if (k < 1)
        return lo;
    double c = accusers > 0 ? (double)(accusers - 1) : 0.0;
    double frac = log(c + 1.0) / log((double)k + 1.0);
    int64_t t = hi - (int64_t)(frac * (double)(hi - lo));
    return t > lo ? t : lo;
}

/* The push-pull period for n live members: the base up to 32 members, then one base more per
 * doubling (memberlist's scaling), so a node's share of full-state traffic grows like log n
 * while the state grows like n. */
static int64_t push_pull_period(const ts_swim_t *s) {
    uint32_t n = n_live(s);
    int64_t base = s->cfg.push_pull_interval_ms;
    if (n <= 32)
        return base;
    return base * (int64_t)(ceil(log2((double)n) - 5.0) + 1.0);
}

/* ---- output queues ----------------------------------------------------------------------- */

static void ev_push_raw(ts_swim_t *s, const ts_swim_event_t *e) {
    if (s->ev_len == s->cfg.max_events) {
        s->st.events_dropped++;
        return;
    }
    s->ev[(s->ev_head + s->ev_len++) % s->cfg.max_events] = *e;
}

/* An event about the member in slot, from its current claim and state. */
static void ev_push(ts_swim_t *s, int type, uint32_t slot, int64_t now) {
    const member_t *m = &s->members[slot];
    const ts_swim_claim_t *c = claim_of(s, slot);
    ts_swim_event_t e = {.type = (uint8_t)type,
                         .state = m->state,
                         .addr = c->addr,
                         .incarnation = m->inc,
                         .advert_version = c->advert_version,
                         .at_ms = now};
    memcpy(e.id, c->id, TS_SWIM_ID_LEN);
    memcpy(e.advert_hash, c->advert_hash, TS_SWIM_HASH_LEN);
    ev_push_raw(s, &e);
}

static out_t *out_push(ts_swim_t *s, int type, const ts_swim_addr_t *to, uint32_t dest) {
    if (s->out_len == s->cfg.max_outbox) {
        s->st.packets_dropped++;
        return NULL;
    }
    out_t *o = &s->out[(s->out_head + s->out_len++) % s->cfg.max_outbox];
    memset(o, 0, sizeof *o);
    o->type = (uint8_t)type;
    o->to = *to;
    o->dest = dest;
    o->dest_fp = dest != NONE ? s->members[dest].fp : 0;
    return o;
}

/* A datagram to the member in slot, at its claimed address. */
static out_t *out_to_member(ts_swim_t *s, int type, uint32_t slot) {
    return out_push(s, type, &claim_of(s, slot)->addr, slot);
}

/* ---- the member index and the probe order ------------------------------------------------ */

static uint32_t member_find(const ts_swim_t *s, const uint8_t id[TS_SWIM_ID_LEN]) {
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
static void order_insert(ts_swim_t *s, uint32_t slot) {
    uint32_t pos = s->n_order++;
    order_set(s, pos, slot);
    uint32_t j = s->cursor + rng_below(s, s->n_order - s->cursor);
    uint32_t other = s->order[j];
    order_set(s, j, slot);
    order_set(s, pos, other);
}

/* Removes slot keeping [0, cursor) the members already probed this round: a hole there is
 * filled from the round's last probed member, and the hole that leaves from the array's end. */
static void order_remove(ts_swim_t *s, uint32_t slot) {
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

static void order_shuffle(ts_swim_t *s) {
    for (uint32_t i = s->n_order; i > 1; i--) {
        uint32_t j = rng_below(s, i), a = s->order[i - 1], b = s->order[j];
        order_set(s, i - 1, b);
        order_set(s, j, a);
    }
    s->cursor = 0;
}

/* A random live member other than us and other than the n slots in avoid; NONE after a few
 * unlucky draws (the caller then simply sends fewer). */
static uint32_t random_member(ts_swim_t *s, const uint32_t *avoid, int n, bool alive_only) {
    for (int tries = 0; tries < 4 * (n + 2) && s->n_order > 0; tries++) {
        uint32_t slot = s->order[rng_below(s, s->n_order)];
        bool bad = alive_only && s->members[slot].state != TS_SWIM_ALIVE;
        for (int i = 0; i < n && !bad; i++)
            bad = avoid[i] == slot;
        if (!bad)
            return slot;
    }
    return NONE;
}

/* ---- the broadcast queue ----------------------------------------------------------------- */

/* What goes first when the piggyback cannot carry everything: claims (refutations, adverts,
 * joins, leaves) before deaths before suspicions, then fewer transmissions, then newer. Under
 * gossip overload (many false suspicions at once: stalling nodes) a suspicion that waits only
 * delays a verdict — the suspect is probed again — while a refutation that waits can become a
 * false positive. (memberlist gives alive messages the same precedence on the receiving side.) */
static int bc_class(int type) {
    return type == TS_SWIM_UP_SUSPECT ? 2 : type == TS_SWIM_UP_DEAD ? 1 : 0;
}

static bool bc_before(const bcast_t *a, const bcast_t *b) {
    int ca = bc_class(a->type), cb = bc_class(b->type);
    if (ca != cb)
        return ca < cb;
    if (a->transmits != b->transmits)
        return a->transmits < b->transmits;
    return a->serial > b->serial;
}

static void bc_remove(ts_swim_t *s, uint32_t i) {
    bcast_t *b = &s->bc[i];
    ts_swim_claims_unref(s->pool, b->claim);
    s->members[b->member].bcast = NONE;
    if (i != --s->n_bc) {
        *b = s->bc[s->n_bc];
        s->members[b->member].bcast = i;
    }
}

/* Queues an update about the member in slot, replacing any older one about it. For ALIVE and
 * LEAVE the member's current claim is sent; for SUSPECT and DEAD the accusation (inc, from). */
static void bc_queue(ts_swim_t *s, int64_t now, uint32_t slot, int type, uint32_t inc,
                     const uint8_t *from) {
    member_t *m = &s->members[slot];
    uint32_t i = m->bcast;
    if (i == NONE) {
        if (s->n_bc == s->cfg.max_broadcasts) {
            /* full: the update that would go out last makes room, or the new one is dropped if
             * it would go out after everything queued */
            uint32_t worst = 0;
            for (uint32_t j = 1; j < s->n_bc; j++)
                if (bc_before(&s->bc[worst], &s->bc[j]))
                    worst = j;
            s->st.broadcasts_dropped++;
            if (bc_class(type) > bc_class(s->bc[worst].type))
                return;
            bc_remove(s, worst);
        }
        if (s->n_bc == 0 && s->next_gossip_at < now)
            s->next_gossip_at = now;
        i = s->n_bc++;
        s->bc[i].claim = TS_SWIM_NO_CLAIM;
        m->bcast = i;
    }
    bcast_t *b = &s->bc[i];
    ts_swim_claims_unref(s->pool, b->claim);
    b->claim = TS_SWIM_NO_CLAIM;
    b->member = slot;
    b->type = (uint8_t)type;
    b->transmits = 0;
    b->serial = ++s->bc_serial;
    b->mark = 0;
    b->inc = inc;
    memset(b->from, 0, sizeof b->from);
    if (type == TS_SWIM_UP_ALIVE || type == TS_SWIM_UP_LEAVE) {
        b->claim = m->claim;
        ts_swim_claims_ref(s->pool, b->claim);
    } else {
        memcpy(b->from, from, TS_SWIM_ID_LEN);
    }
}

/* A confirmation travels on its suspicion's remaining budget: the queued suspicion of the member
 * names the new accuser instead, keeping its transmit count. Re-queueing it afresh (memberlist's
 * way) multiplies one suspicion's gossip by up to K + 1 at every node, and under many false
 * suspicions at once (stalling nodes) that saturates the piggyback and delays refutations. */
static void bc_confirm(ts_swim_t *s, int64_t now, uint32_t slot, uint32_t inc,
                       const uint8_t *from) {
    uint32_t i = s->members[slot].bcast;
    if (i != NONE && s->bc[i].type == TS_SWIM_UP_SUSPECT && s->bc[i].inc == inc) {
        memcpy(s->bc[i].from, from, TS_SWIM_ID_LEN);
        return;
    }
    bc_queue(s, now, slot, TS_SWIM_UP_SUSPECT, inc, from);
}

static size_t bc_size(const bcast_t *b) {
    switch (b->type) {
    case TS_SWIM_UP_ALIVE: return TS_SWIM_WIRE_ALIVE;
    case TS_SWIM_UP_LEAVE: return TS_SWIM_WIRE_LEAVE;
    default: return TS_SWIM_WIRE_ACCUSE;
    }
}

static void bc_to_update(const ts_swim_t *s, const bcast_t *b, ts_swim_update_t *u) {
    memset(u, 0, sizeof *u);
    u->type = b->type;
    if (b->type == TS_SWIM_UP_ALIVE || b->type == TS_SWIM_UP_LEAVE) {
        u->u.claim = *ts_swim_claims_get(s->pool, b->claim);
    } else {
        memcpy(u->u.accuse.id, id_of(s, b->member), TS_SWIM_ID_LEN);
        u->u.accuse.incarnation = b->inc;
        memcpy(u->u.accuse.from, b->from, TS_SWIM_ID_LEN);
    }
}

/* ---- suspicions -------------------------------------------------------------------------- */

static void susp_clear(ts_swim_t *s, uint32_t slot) {
    uint16_t i = s->members[slot].susp;
    if (i == NONE16)
        return;
    s->members[slot].susp = NONE16;
    if (i != --s->n_sp) {
        s->sp[i] = s->sp[s->n_sp];
        s->members[s->sp[i].member].susp = i;
    }
}

static bool susp_start(ts_swim_t *s, uint32_t slot, uint64_t accuser, int64_t now) {
    if (s->n_sp == s->cfg.max_suspicions) {
        s->st.suspicions_dropped++;
        return false;
    }
    susp_t *p = &s->sp[s->n_sp];
    p->member = slot;
    p->start_ms = now;
    p->n_accusers = 1;
    p->accusers[0] = accuser;
    p->deadline_ms = now + suspicion_timeout(s, 1);
    p->check_at = p->deadline_ms - s->cfg.probe_interval_ms;
    s->members[slot].susp = (uint16_t)s->n_sp++;
    return true;
}

/* Counts accuser if new and still useful; returns whether it was. The deadline moves earlier
 * (never later) as confirmations arrive, but not into the past: a verdict that is due now is
 * due now, not late. */
static bool susp_confirm(ts_swim_t *s, uint32_t slot, uint64_t accuser, int64_t now) {
    uint16_t i = s->members[slot].susp;
    if (i == NONE16)
        return false;
    susp_t *p = &s->sp[i];
    if (p->n_accusers > (uint32_t)s->cfg.suspicion_confirm)
        return false;
    for (uint32_t j = 0; j < p->n_accusers; j++)
        if (p->accusers[j] == accuser)
            return false;
    p->accusers[p->n_accusers++] = accuser;
    int64_t deadline = p->start_ms + suspicion_timeout(s, p->n_accusers);
    if (deadline < now)
        deadline = now;
    if (deadline < p->deadline_ms) {
        p->deadline_ms = deadline;
        if (p->check_at != NEVER)
            p->check_at = deadline - s->cfg.probe_interval_ms > now
                              ? deadline - s->cfg.probe_interval_ms
                              : now;
    }
    return true;
}

/* ---- state changes ----------------------------------------------------------------------- */

static void set_state(ts_swim_t *s, uint32_t slot, int state, uint32_t inc, int64_t now) {
    member_t *m = &s->members[slot];
    int old = m->state;
    m->inc = inc;
    if (old == state)
        return;
    s->count[old]--;
    s->count[state]++;
    m->state = (uint8_t)state;
    m->change_ms = now;
    if (old == TS_SWIM_SUSPECT)
        susp_clear(s, slot);
    if (slot != SELF && is_live(old) != is_live(state)) {
        if (is_live(state))
            order_insert(s, slot);
        else
            order_remove(s, slot);
    }
}

static uint32_t member_add(ts_swim_t *s, uint32_t claim, int64_t now) {
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
        order_insert(s, slot);
    return slot;
}

static bool table_full(const ts_swim_t *s) {
    return s->free_head == NONE && s->n_slots == s->cfg.max_members;
}

static void member_reap(ts_swim_t *s, uint32_t slot, int64_t now) {
    member_t *m = &s->members[slot];
    ev_push(s, TS_SWIM_EV_REAPED, slot, now);
    if (m->bcast != NONE)
        bc_remove(s, m->bcast);
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

/* ---- our own claim ----------------------------------------------------------------------- */

static bool verify(ts_swim_t *s, const ts_swim_claim_t *c) {
    uint8_t buf[TS_SWIM_SIGNED_MAX];
    size_t len = ts_swim_claim_signed_bytes(c, buf);
    s->st.claims_verified++;
    if (len == 0 || s->cfg.verify(s->cfg.crypto_ctx, c->id, buf, len, c->sig) != 0) {
        s->st.claims_rejected++;
        return false;
    }
    return true;
}

/* Signs c (all but sig filled in) and makes it our claim; queues it for gossip. */
static int adopt_own_claim(ts_swim_t *s, int64_t now, ts_swim_claim_t *c) {
    uint8_t buf[TS_SWIM_SIGNED_MAX];
    size_t len = ts_swim_claim_signed_bytes(c, buf);
    if (len == 0 || s->cfg.sign(s->cfg.crypto_ctx, buf, len, c->sig) != 0) {
        s->st.sign_failures++;
        return TS_EINVAL;
    }
    uint32_t h = ts_swim_claims_intern(s->pool, c);
    if (h == TS_SWIM_NO_CLAIM) {
        s->st.claims_dropped++;
        return TS_ENOMEM;
    }
    ts_swim_claims_unref(s->pool, s->members[SELF].claim);
    s->members[SELF].claim = h;
    s->members[SELF].inc = c->incarnation;
    bc_queue(s, now, SELF, c->kind == TS_SWIM_CLAIM_LEAVE ? TS_SWIM_UP_LEAVE : TS_SWIM_UP_ALIVE, 0,
             NULL);
    return TS_OK;
}

/* Sends our current claim straight to the accuser: its suspicion timer runs first, and gossip
 * may take a while to reach it. As long as its accusation keeps reaching us (it has not heard
 * our refutation), we answer again, at most once per probe interval: a lost answer is retried. */
static void answer_accuser(ts_swim_t *s, int64_t now, const uint8_t from[TS_SWIM_ID_LEN]) {
    uint64_t fp = fp_of(from);
    int oldest = 0;
    for (int i = 0; i < ANSWERED; i++) {
        if (s->answered[i].fp == fp && now - s->answered[i].at_ms < s->cfg.probe_interval_ms)
            return;
        if (s->answered[i].at_ms < s->answered[oldest].at_ms)
            oldest = i;
    }
    uint32_t slot = member_find(s, from);
    if (slot == NONE || slot == SELF || !is_live(s->members[slot].state))
        return;
    s->answered[oldest].fp = fp;
    s->answered[oldest].at_ms = now;
    out_t *o = out_to_member(s, TS_SWIM_GOSSIP, slot);
    if (o)
        o->flags |= OUT_SELF_CLAIM;
}

/* Answers a suspicion or death of ours at incarnation inc: a new claim at inc + 1. */
static void refute(ts_swim_t *s, int64_t now, uint32_t inc) {
    if (inc == UINT32_MAX)
        return; /* cannot go higher; 4 billion refutations do not happen */
    ts_swim_claim_t c = *claim_of(s, SELF);
    c.incarnation = inc + 1;
    if (adopt_own_claim(s, now, &c) != TS_OK)
        return;
    s->st.refutations++;
    health_up(s);
    ev_push(s, TS_SWIM_EV_REFUTED, SELF, now);
}

/* ---- applying updates -------------------------------------------------------------------- */

/* A claim that names us but is not our current one: our own from a previous run (a restart
 * that began below the incarnation we had reached), or a forgery. The first is answered by
 * moving above it; the second fails verification. */
static void on_own_claim(ts_swim_t *s, int64_t now, const ts_swim_claim_t *c) {
    const ts_swim_claim_t *cur = claim_of(s, SELF);
    uint32_t inc = s->members[SELF].inc;
    if (s->leaving || c->incarnation < inc)
        return;
    if (c->incarnation == inc && c->kind == TS_SWIM_CLAIM_ALIVE &&
        c->advert_version < cur->advert_version)
        return; /* our own earlier advert at this incarnation, still travelling */
    if (c->incarnation == cur->incarnation && c->kind == cur->kind &&
        c->advert_version == cur->advert_version && memcmp(c->sig, cur->sig, TS_SWIM_SIG_LEN) == 0)
        return; /* our current claim */
    if (!verify(s, c))
        return;
    refute(s, now, c->incarnation);
}

static void apply_claim(ts_swim_t *s, int64_t now, const ts_swim_claim_t *c, bool rebroadcast) {
    if (c->kind != TS_SWIM_CLAIM_ALIVE && c->kind != TS_SWIM_CLAIM_LEAVE)
        return;
    uint32_t slot = member_find(s, c->id);
    if (slot == SELF) {
        on_own_claim(s, now, c);
        return;
    }
    if (slot == NONE) {
        if (c->kind != TS_SWIM_CLAIM_ALIVE)
            return; /* the departure of someone we never knew */
        if (table_full(s)) {
            s->st.members_dropped++;
            return;
        }
        if (!verify(s, c))
            return;
        uint32_t h = ts_swim_claims_intern(s->pool, c);
        if (h == TS_SWIM_NO_CLAIM) {
            s->st.claims_dropped++;
            return;
        }
        slot = member_add(s, h, now);
        ev_push(s, TS_SWIM_EV_JOINED, slot, now);
        if (c->advert_version > 0)
            ev_push(s, TS_SWIM_EV_ADVERT_NEEDED, slot, now);
        if (rebroadcast)
            bc_queue(s, now, slot, TS_SWIM_UP_ALIVE, 0, NULL);
        return;
    }

    member_t *m = &s->members[slot];
    const ts_swim_claim_t *cur = claim_of(s, slot);
    int old_state = m->state;
    if (c->kind == TS_SWIM_CLAIM_LEAVE) {
        /* a signed leave at or above the state's incarnation is final: left, not dead */
        if (old_state == TS_SWIM_LEFT || c->incarnation < m->inc) {
            s->st.stale_ignored++;
            return;
        }
    } else {
        bool clears = c->incarnation > m->inc;
        bool newer =
            cur->kind == TS_SWIM_CLAIM_LEAVE
                ? clears
                : c->incarnation > cur->incarnation || (c->incarnation == cur->incarnation &&
                                                        c->advert_version > cur->advert_version);
        if (!newer || (!is_live(old_state) && !clears)) {
            s->st.stale_ignored++;
            return;
        }
    }
    if (!verify(s, c))
        return;
    uint32_t h = ts_swim_claims_intern(s->pool, c);
    if (h == TS_SWIM_NO_CLAIM) {
        s->st.claims_dropped++;
        return;
    }
    bool advert_changed = c->kind == TS_SWIM_CLAIM_ALIVE && c->advert_version > 0 &&
                          (c->advert_version != cur->advert_version ||
                           memcmp(c->advert_hash, cur->advert_hash, TS_SWIM_HASH_LEN) != 0);
    bool moved = cur->kind == TS_SWIM_CLAIM_ALIVE && c->kind == TS_SWIM_CLAIM_ALIVE &&
                 memcmp(&c->addr, &cur->addr, sizeof c->addr) != 0;
    ts_swim_claims_unref(s->pool, m->claim);
    m->claim = h;
    cur = NULL;
    if (c->kind == TS_SWIM_CLAIM_LEAVE) {
        set_state(s, slot, TS_SWIM_LEFT, c->incarnation, now);
        ev_push(s, TS_SWIM_EV_LEFT, slot, now);
        if (rebroadcast)
            bc_queue(s, now, slot, TS_SWIM_UP_LEAVE, 0, NULL);
        return;
    }
    if (c->incarnation > m->inc)
        set_state(s, slot, TS_SWIM_ALIVE, c->incarnation, now);
    if (old_state != TS_SWIM_ALIVE && m->state == TS_SWIM_ALIVE)
        ev_push(s, TS_SWIM_EV_ALIVE_AGAIN, slot, now);
    else if (moved)
        ev_push(s, TS_SWIM_EV_ADDR_CHANGED, slot, now);
    if (advert_changed)
        ev_push(s, TS_SWIM_EV_ADVERT_NEEDED, slot, now);
    if (rebroadcast)
        bc_queue(s, now, slot, TS_SWIM_UP_ALIVE, 0, NULL);
}

static void on_accused(ts_swim_t *s, int64_t now, const ts_swim_accusation_t *a) {
    if (s->leaving)
        return;
    if (a->incarnation < s->members[SELF].inc) {
        answer_accuser(s, now, a->from); /* they have not heard our refutation yet */
        return;
    }
    refute(s, now, a->incarnation);
    answer_accuser(s, now, a->from);
}

static void apply_accusation(ts_swim_t *s, int64_t now, int type, const ts_swim_accusation_t *a,
                             bool rebroadcast) {
    uint32_t slot = member_find(s, a->id);
    if (slot == NONE)
        return; /* nothing to accuse */
    if (slot == SELF) {
        on_accused(s, now, a);
        return;
    }
    member_t *m = &s->members[slot];
    if (!is_live(m->state) || a->incarnation < m->inc) {
        s->st.stale_ignored++;
        return;
    }
    if (type == TS_SWIM_UP_DEAD) {
        set_state(s, slot, TS_SWIM_DEAD, a->incarnation, now);
        ev_push(s, TS_SWIM_EV_DEAD, slot, now);
        if (rebroadcast)
            bc_queue(s, now, slot, TS_SWIM_UP_DEAD, a->incarnation, a->from);
        return;
    }
    uint64_t accuser = fp_of(a->from);
    if (m->state == TS_SWIM_ALIVE) {
        if (!susp_start(s, slot, accuser, now))
            return;
        set_state(s, slot, TS_SWIM_SUSPECT, a->incarnation, now);
        s->st.suspicions++;
        ev_push(s, TS_SWIM_EV_SUSPECT, slot, now);
        if (rebroadcast)
            bc_queue(s, now, slot, TS_SWIM_UP_SUSPECT, a->incarnation, a->from);
        return;
    }
    if (a->incarnation > m->inc) {
        /* suspect again at a newer incarnation: it refuted the suspicion we hold (we missed
         * that) and is suspected anew. A new suspicion, with a timer from now. */
        susp_clear(s, slot);
        m->inc = a->incarnation;
        (void)susp_start(s, slot, accuser, now); /* cannot fail: susp_clear freed an entry */
        s->st.suspicions++;
        if (rebroadcast)
            bc_queue(s, now, slot, TS_SWIM_UP_SUSPECT, a->incarnation, a->from);
        return;
    }
    if (susp_confirm(s, slot, accuser, now)) {
        s->st.confirmations++;
        if (rebroadcast)
            bc_confirm(s, now, slot, m->inc, a->from);
    }
}

static void apply_update(ts_swim_t *s, int64_t now, const ts_swim_update_t *u) {
    switch (u->type) {
    case TS_SWIM_UP_ALIVE:
    case TS_SWIM_UP_LEAVE:
        if (u->u.claim.kind ==
            (u->type == TS_SWIM_UP_ALIVE ? TS_SWIM_CLAIM_ALIVE : TS_SWIM_CLAIM_LEAVE))
            apply_claim(s, now, &u->u.claim, true);
        break;
    case TS_SWIM_UP_SUSPECT:
    case TS_SWIM_UP_DEAD: apply_accusation(s, now, u->type, &u->u.accuse, true); break;
    default: break;
    }
}

/* Our own accusation: the probe of slot failed, or its suspicion ran out. */
static void accuse(ts_swim_t *s, int64_t now, int type, uint32_t slot) {
    ts_swim_accusation_t a = {.incarnation = s->members[slot].inc};
    memcpy(a.id, id_of(s, slot), TS_SWIM_ID_LEN);
    memcpy(a.from, id_of(s, SELF), TS_SWIM_ID_LEN);
    apply_accusation(s, now, type, &a, true);
}

/* ---- probing ----------------------------------------------------------------------------- */

static bool probe_target_valid(const ts_swim_t *s) {
    const member_t *m = &s->members[s->probe.target];
    return m->claim != TS_SWIM_NO_CLAIM && m->fp == s->probe.target_fp;
}

static void probe_start(ts_swim_t *s, int64_t now) {
    s->probe.active = false;
    s->next_probe_at = now + probe_interval(s);
    if (s->n_order == 0)
        return;
    if (s->cursor >= s->n_order)
        order_shuffle(s);
    uint32_t slot = s->order[s->cursor++];
    out_t *o = out_to_member(s, TS_SWIM_PING, slot);
    if (!o)
        return;
    o->seq = ++s->seq;
    memcpy(o->target, id_of(s, slot), TS_SWIM_ID_LEN);
    s->probe = (probe_t){.active = true,
                         .target = slot,
                         .target_fp = s->members[slot].fp,
                         .seq = o->seq,
                         .timeout_at = now + probe_timeout(s)};
    s->st.probes++;
}

/* The direct ping went unanswered: ask k alive members to try. */
static void probe_indirect(ts_swim_t *s) {
    s->probe.indirect = true;
    if (!probe_target_valid(s))
        return;
    uint32_t avoid[1 + 16] = {s->probe.target};
    int n_avoid = 1;
    const ts_swim_claim_t *t = claim_of(s, s->probe.target);
    for (int i = 0; i < s->cfg.indirect_probes; i++) {
        uint32_t helper = random_member(s, avoid, n_avoid, true);
        if (helper == NONE)
            break;
        avoid[n_avoid++] = helper;
        out_t *o = out_to_member(s, TS_SWIM_PING_REQ, helper);
        if (!o)
            break;
        o->seq = s->probe.seq;
        memcpy(o->target, t->id, TS_SWIM_ID_LEN);
        o->target_addr = t->addr;
        s->probe.nacks_expected++;
        s->st.ping_reqs_sent++;
    }
}

/* The round is over. No ack: blame the target (and ourselves a little: Lifeguard). */
static void probe_finish(ts_swim_t *s, int64_t now) {
    probe_t *p = &s->probe;
    p->active = false;
    if (p->acked)
        return;
    s->st.probes_failed++;
    health_up(s);
    if (p->nacks < p->nacks_expected)
        health_up(s); /* helpers did not even answer: the trouble may be ours */
    if (probe_target_valid(s) && is_live(s->members[p->target].state))
        accuse(s, now, TS_SWIM_UP_SUSPECT, p->target);
}

/* ---- relaying ping-reqs ------------------------------------------------------------------ */

static void relay_start(ts_swim_t *s, int64_t now, const ts_swim_addr_t *from,
                        const ts_swim_msg_t *msg) {
    relay_t *r = NULL;
    for (uint32_t i = 0; i < s->cfg.max_relays && !r; i++)
        if (!s->relays[i].used)
            r = &s->relays[i];
    if (!r) {
        s->st.relays_dropped++;
        return;
    }
    out_t *o = out_push(s, TS_SWIM_PING, &msg->target_addr, member_find(s, msg->target));
    if (!o)
        return;
    o->seq = ++s->seq;
    memcpy(o->target, msg->target, TS_SWIM_ID_LEN);
    /* the requester waits until the end of its round, (interval − timeout) after asking; our
     * nack must be back before that, so we wait a little less than its probe timeout */
    *r = (relay_t){.used = true,
                   .seq = o->seq,
                   .req_seq = msg->seq,
                   .req_addr = *from,
                   .deadline_ms = now + s->cfg.probe_timeout_ms * 4 / 5};
}

static void relay_answer(ts_swim_t *s, relay_t *r, int type) {
    out_t *o = out_push(s, type, &r->req_addr, NONE);
    if (o)
        o->seq = r->req_seq;
    if (type == TS_SWIM_ACK)
        s->st.acks_relayed++;
    else
        s->st.nacks_sent++;
    r->used = false;
}

/* ---- creation ---------------------------------------------------------------------------- */

void ts_swim_config_default(ts_swim_config_t *cfg) {
    *cfg = (ts_swim_config_t){
        .probe_interval_ms = 1000,
        .probe_timeout_ms = 500,
        .indirect_probes = 3,
        .gossip_interval_ms = 200,
        .gossip_fanout = 3,
        .retransmit_mult = 4,
        .suspicion_mult = 4,
        .suspicion_max_mult = 6,
        .suspicion_min_ms = 2000,
        .suspicion_confirm = 3,
        .health_max = 8,
        .stall_slack_ms = 250,
        .push_pull_interval_ms = 30000,
        .join_retry_ms = 5000,
        .dead_retention_ms = 600000,
        .leave_linger_ms = 5000,
        .max_packet = TS_SWIM_PLAIN_MAX,
        .max_members = 1024,
        .max_broadcasts = 256,
        .max_suspicions = 256,
        .max_events = 256,
        .max_outbox = 64,
        .max_relays = 32,
    };
}

static bool config_ok(const ts_swim_config_t *c) {
    size_t min_packet = ts_swim_wire_base_size(TS_SWIM_PING_REQ) + TS_SWIM_WIRE_ALIVE;
    return c->probe_interval_ms > 0 && c->probe_timeout_ms > 0 &&
           c->probe_timeout_ms < c->probe_interval_ms && c->indirect_probes >= 0 &&
           c->indirect_probes <= 16 && c->gossip_interval_ms > 0 && c->gossip_fanout >= 1 &&
           c->gossip_fanout <= 16 && c->retransmit_mult >= 1 && c->retransmit_mult <= 16 &&
           c->suspicion_mult >= 1 && c->suspicion_max_mult >= 1 && c->suspicion_min_ms >= 0 &&
           c->suspicion_confirm >= 0 && c->suspicion_confirm <= MAX_CONFIRM && c->health_max >= 0 &&
           c->health_max <= 64 && c->stall_slack_ms > 0 && c->push_pull_interval_ms >= 0 &&
           c->join_retry_ms > 0 && c->dead_retention_ms > 0 && c->leave_linger_ms >= 0 &&
           (size_t)c->max_packet >= min_packet && c->max_packet <= TS_SWIM_PLAIN_MAX &&
           c->max_members >= 1 && c->max_members <= (1u << 28) && c->max_broadcasts >= 1 &&
           c->max_suspicions >= 1 && c->max_suspicions < NONE16 && c->max_events >= 1 &&
           c->max_outbox >= 1 && c->max_relays >= 1 && c->sign && c->verify;
}

int ts_swim_create(const ts_swim_config_t *cfg, const uint8_t self_id[TS_SWIM_ID_LEN],
                   const ts_swim_addr_t *self_addr, uint64_t seed, int64_t now_ms,
                   ts_swim_t **out) {
    if (!out)
        return TS_EINVAL;
    *out = NULL;
    if (!cfg || !self_id || !self_addr || !config_ok(cfg))
        return TS_EINVAL;
    ts_swim_t *s = calloc(1, sizeof *s);
    if (!s)
        return TS_ENOMEM;
    s->cfg = *cfg;
    rng_seed(s, seed);
    s->salt = rng_next(s);
    uint32_t index_size = 2;
    while (index_size < cfg->max_members + cfg->max_members / 3 + 1)
        index_size *= 2;
    s->index_mask = index_size - 1;
    s->members = malloc(sizeof *s->members * cfg->max_members);
    s->index = calloc(index_size, sizeof *s->index);
    s->order = malloc(sizeof *s->order * cfg->max_members);
    s->bc = malloc(sizeof *s->bc * cfg->max_broadcasts);
    s->sp = malloc(sizeof *s->sp * cfg->max_suspicions);
    s->relays = calloc(cfg->max_relays, sizeof *s->relays);
    s->out = malloc(sizeof *s->out * cfg->max_outbox);
    s->ev = malloc(sizeof *s->ev * cfg->max_events);
    int rc = TS_ENOMEM;
    if (!s->members || !s->index || !s->order || !s->bc || !s->sp || !s->relays || !s->out ||
        !s->ev)
        goto fail;
    if (cfg->claims) {
        s->pool = cfg->claims;
    } else {
        /* every member and every queued update may hold a distinct claim, and one more for
         * the claim being replaced */
        rc = ts_swim_claims_create(cfg->max_members + cfg->max_broadcasts + 1, &s->pool);
        if (rc != TS_OK)
            goto fail;
        s->own_pool = true;
    }
    s->free_head = NONE;

    ts_swim_claim_t c = {
        .kind = TS_SWIM_CLAIM_ALIVE, .incarnation = cfg->initial_incarnation, .addr = *self_addr};
    memcpy(c.id, self_id, TS_SWIM_ID_LEN);
    uint8_t buf[TS_SWIM_SIGNED_MAX];
    size_t len = ts_swim_claim_signed_bytes(&c, buf);
    if (cfg->sign(cfg->crypto_ctx, buf, len, c.sig) != 0) {
        rc = TS_EINVAL;
        goto fail;
    }
    uint32_t h = ts_swim_claims_intern(s->pool, &c);
    if (h == TS_SWIM_NO_CLAIM) {
        rc = TS_ENOMEM;
        goto fail;
    }
    member_add(s, h, now_ms);
    bc_queue(s, now_ms, SELF, TS_SWIM_UP_ALIVE, 0, NULL);

    /* timers start at random phases, so that nodes started together do not probe, gossip and
     * exchange state in lockstep */
    s->next_probe_at = now_ms + rng_below(s, (uint32_t)cfg->probe_interval_ms);
    s->next_gossip_at = now_ms + rng_below(s, (uint32_t)cfg->gossip_interval_ms);
    s->next_push_pull_at = cfg->push_pull_interval_ms > 0
                               ? now_ms + rng_below(s, (uint32_t)cfg->push_pull_interval_ms)
                               : NEVER;
    s->next_reap_at =
        now_ms + (cfg->dead_retention_ms / 4 > 1000 ? cfg->dead_retention_ms / 4 : 1000);
    s->join_retry_at = NEVER;
    s->last_input_ms = now_ms;
    *out = s;
    return TS_OK;
fail:
    ts_swim_free(s);
    return rc;
}

void ts_swim_free(ts_swim_t *s) {
    if (!s)
        return;
    if (s->pool) {
        for (uint32_t i = 0; i < s->n_slots; i++)
            ts_swim_claims_unref(s->pool, s->members[i].claim);
        for (uint32_t i = 0; i < s->n_bc; i++)
            ts_swim_claims_unref(s->pool, s->bc[i].claim);
        if (s->own_pool)
            ts_swim_claims_free(s->pool);
    }
    free(s->members);
    free(s->index);
    free(s->order);
    free(s->bc);
    free(s->sp);
    free(s->relays);
    free(s->out);
    free(s->ev);
    free(s);
}

/* ---- timers ------------------------------------------------------------------------------ */

int64_t ts_swim_next_deadline(const ts_swim_t *s) {
    int64_t t = s->next_gossip_at;
    if (!s->leaving && s->next_probe_at < t)
        t = s->next_probe_at;
    if (s->probe.active && !s->probe.acked && !s->probe.indirect && s->probe.timeout_at < t)
        t = s->probe.timeout_at;
    for (uint32_t i = 0; i < s->n_sp; i++) {
        if (s->sp[i].deadline_ms < t)
            t = s->sp[i].deadline_ms;
        if (s->sp[i].check_at < t)
            t = s->sp[i].check_at;
    }
    for (uint32_t i = 0; i < s->cfg.max_relays; i++)
        if (s->relays[i].used && s->relays[i].deadline_ms < t)
            t = s->relays[i].deadline_ms;
    if (s->next_push_pull_at < t)
        t = s->next_push_pull_at;
    if (s->next_reap_at < t)
        t = s->next_reap_at;
    if (s->join_retry_at < t)
        t = s->join_retry_at;
    return t;
}

/* We were not running for a while (the tick is far past its deadline). A probe that timed out
 * meanwhile says nothing about its target, and a suspicion that ran out meanwhile may have a
 * refutation waiting in our socket: give both a fair chance instead of acting on stale time. */
static void on_stall(ts_swim_t *s, int64_t now) {
    s->st.stalls_detected++;
    health_up(s);
    if (s->probe.active && !s->probe.acked) {
        s->st.probes_abandoned++;
        s->probe.active = false;
    }
    if (!s->leaving)
        s->next_probe_at = now;
    int64_t grace = now + s->cfg.probe_interval_ms;
    for (uint32_t i = 0; i < s->n_sp; i++) {
        if (s->sp[i].deadline_ms < grace)
            s->sp[i].deadline_ms = grace;
        if (s->sp[i].check_at < now)
            s->sp[i].check_at = now;
    }
    if (s->next_gossip_at < now)
        s->next_gossip_at = now;
}

static void gossip_round(ts_swim_t *s, int64_t now) {
    s->next_gossip_at += s->cfg.gossip_interval_ms;
    if (s->next_gossip_at <= now)
        s->next_gossip_at = now + s->cfg.gossip_interval_ms;
    if (s->n_bc == 0 || (s->leaving && ts_swim_leave_done(s, now)))
        return;
    uint32_t picked[16];
    int n = 0;
    while (n < s->cfg.gossip_fanout) {
        uint32_t slot = random_member(s, picked, n, false);
        if (slot == NONE)
            break;
        picked[n++] = slot;
        out_to_member(s, TS_SWIM_GOSSIP, slot);
    }
}

/* The push-pull partner: usually a random alive member; with probability dead / (dead + live)
 * a random dead one instead (Serf's reconnect). If that one is in fact alive — the two sides of
 * a healed partition, each believing the other dead — the exchange shows each side what the
 * other believes, and the refutations that follow bring both halves back together. */
static uint32_t push_pull_target(ts_swim_t *s) {
    uint32_t dead = s->count[TS_SWIM_DEAD];
    if (dead > 0 && rng_below(s, dead + s->n_order) < dead) {
        uint32_t pick = rng_below(s, dead), seen = 0;
        for (uint32_t i = 1; i < s->n_slots; i++)
            if (s->members[i].state == TS_SWIM_DEAD && seen++ == pick)
                return i;
    }
    return random_member(s, NULL, 0, true);
}

static void push_pull_request(ts_swim_t *s, uint32_t slot, const ts_swim_addr_t *addr,
                              int64_t now) {
    if (slot != NONE) {
        ev_push(s, TS_SWIM_EV_PUSH_PULL, slot, now);
        return;
    }
    ts_swim_event_t e = {.type = TS_SWIM_EV_PUSH_PULL, .addr = *addr, .at_ms = now};
    ev_push_raw(s, &e);
}

static void reap(ts_swim_t *s, int64_t now) {
    s->next_reap_at =
        now + (s->cfg.dead_retention_ms / 4 > 1000 ? s->cfg.dead_retention_ms / 4 : 1000);
    if (s->count[TS_SWIM_DEAD] + s->count[TS_SWIM_LEFT] == 0)
        return;
    for (uint32_t i = 1; i < s->n_slots; i++) {
        const member_t *m = &s->members[i];
        if ((m->state == TS_SWIM_DEAD || m->state == TS_SWIM_LEFT) &&
            now - m->change_ms >= s->cfg.dead_retention_ms)
            member_reap(s, i, now);
    }
}

int ts_swim_tick(ts_swim_t *s, int64_t now) {
    if (!s)
        return TS_EINVAL;
    /* we were not running if nothing reached us (no tick, no datagram) since well before the
     * deadline we had given */
    int64_t due = ts_swim_next_deadline(s);
    if (due < s->last_input_ms)
        due = s->last_input_ms;
    if (due != NEVER && now - due > s->cfg.stall_slack_ms)
        on_stall(s, now);
    if (now > s->last_input_ms)
        s->last_input_ms = now;

    for (uint32_t i = 0; i < s->cfg.max_relays; i++)
        if (s->relays[i].used && s->relays[i].deadline_ms <= now)
            relay_answer(s, &s->relays[i], TS_SWIM_NACK);

    if (!s->leaving) {
        if (s->probe.active && !s->probe.acked && !s->probe.indirect && now >= s->probe.timeout_at)
            probe_indirect(s);
        if (now >= s->next_probe_at) {
            if (s->probe.active)
                probe_finish(s, now);
            probe_start(s, now);
        }
    }

    /* A last-chance ping to each suspect, a probe interval before our verdict, carrying our
     * suspicion (the buddy piggyback). A suspect that refuted long ago but whose refutation
     * missed us (gossip reaches a given node only with high probability) answers us directly;
     * a crashed one costs one datagram per node. */
    for (uint32_t i = 0; i < s->n_sp; i++) {
        susp_t *p = &s->sp[i];
        if (p->check_at > now)
            continue;
        p->check_at = NEVER;
        out_t *o = out_to_member(s, TS_SWIM_PING, p->member);
        if (o) {
            o->seq = ++s->seq;
            memcpy(o->target, id_of(s, p->member), TS_SWIM_ID_LEN);
            s->st.last_chance_pings++;
        }
    }

    for (uint32_t i = 0; i < s->n_sp;) {
        if (s->sp[i].deadline_ms > now) {
            i++;
            continue;
        }
        /* declaring the member dead removes entry i (the last one moves into it) */
        uint32_t slot = s->sp[i].member;
        s->st.deaths_declared++;
        accuse(s, now, TS_SWIM_UP_DEAD, slot);
        susp_clear(s, slot); /* already done by the state change; kept for the loop's sake */
        /* the verdict also goes to the member itself (the buddy piggyback carries it): one that
         * is in fact alive hears it and refutes */
        out_to_member(s, TS_SWIM_GOSSIP, slot);
    }

    if (now >= s->next_gossip_at)
        gossip_round(s, now);

    if (now >= s->next_push_pull_at) {
        uint32_t slot = s->leaving ? NONE : push_pull_target(s);
        if (slot != NONE)
            push_pull_request(s, slot, NULL, now);
        s->next_push_pull_at = now + push_pull_period(s);
    }

    if (now >= s->join_retry_at) {
        if (n_live(s) > 1 || s->leaving) {
            s->n_seeds = 0;
            s->join_retry_at = NEVER;
        } else {
            for (uint32_t i = 0; i < s->n_seeds; i++) {
                push_pull_request(s, NONE, &s->seeds[i], now);
                out_t *o = out_push(s, TS_SWIM_GOSSIP, &s->seeds[i], NONE);
                if (o)
                    o->flags |= OUT_SELF_CLAIM;
            }
            s->join_retry_at = now + s->cfg.join_retry_ms;
        }
    }

    if (now >= s->next_reap_at)
        reap(s, now);
    return TS_OK;
}

/* ---- packets in -------------------------------------------------------------------------- */

int ts_swim_on_packet(ts_swim_t *s, int64_t now, const ts_swim_addr_t *from,
                      const ts_swim_msg_t *msg) {
    if (!s || !from || !msg || msg->type < TS_SWIM_PING || msg->type > TS_SWIM_GOSSIP ||
        msg->n_updates > TS_SWIM_MAX_UPDATES)
        return TS_EINVAL;
    s->st.packets_in++;
    if (now > s->last_input_ms)
        s->last_input_ms = now;
    for (int i = 0; i < msg->n_updates; i++)
        apply_update(s, now, &msg->updates[i]);

    const uint8_t *self_id = id_of(s, SELF);
    switch (msg->type) {
    case TS_SWIM_PING:
        if (memcmp(msg->target, self_id, TS_SWIM_ID_LEN) != 0) {
            s->st.pings_misaddressed++; /* meant for whoever had this address before us */
            break;
        }
        {
            uint32_t sender = member_find(s, msg->from);
            out_t *o = out_push(s, TS_SWIM_ACK, from, sender);
            if (o) {
                o->seq = msg->seq;
                o->ack_flags = sender == NONE ? TS_SWIM_ACK_WHO_ARE_YOU : 0;
            }
        }
        break;
    case TS_SWIM_PING_REQ:
        if (memcmp(msg->target, self_id, TS_SWIM_ID_LEN) == 0) {
            out_t *o = out_push(s, TS_SWIM_ACK, from, member_find(s, msg->from));
            if (o)
                o->seq = msg->seq;
        } else {
            relay_start(s, now, from, msg);
        }
        break;
    case TS_SWIM_ACK:
        if (s->probe.active && msg->seq == s->probe.seq) {
            if (!s->probe.acked) {
                s->probe.acked = true;
                health_down(s);
                /* the target does not know us: our claim never reached it, so hand it over */
                if ((msg->flags & TS_SWIM_ACK_WHO_ARE_YOU) && probe_target_valid(s)) {
                    out_t *o = out_to_member(s, TS_SWIM_GOSSIP, s->probe.target);
                    if (o)
                        o->flags |= OUT_SELF_CLAIM;
                }
            }
            break;
        }
        for (uint32_t i = 0; i < s->cfg.max_relays; i++)
            if (s->relays[i].used && s->relays[i].seq == msg->seq) {
                relay_answer(s, &s->relays[i], TS_SWIM_ACK);
                break;
            }
        break;
    case TS_SWIM_NACK:
        if (s->probe.active && msg->seq == s->probe.seq) {
            s->probe.nacks++;
            s->st.nacks_received++;
        }
        break;
    default: break; /* gossip: the updates were all */
    }
    return TS_OK;
}

/* ---- packets out ------------------------------------------------------------------------- */

static bool add_update(ts_swim_msg_t *msg, size_t *room, const ts_swim_update_t *u) {
    size_t size = ts_swim_wire_update_size(u);
    if (msg->n_updates == TS_SWIM_MAX_UPDATES || size > *room)
        return false;
    msg->updates[msg->n_updates++] = *u;
    *room -= size;
    return true;
}

/* Fills the piggyback: our claim first if asked, the receiver's own accusation if we hold it
 * suspect or dead (buddy), then queued updates, fewest transmissions first and newest first
 * among equals, skipping what no longer fits. Each one taken counts a transmission; those that
 * reach the limit leave the queue. */
static void fill_piggyback(ts_swim_t *s, const out_t *o, ts_swim_msg_t *msg) {
    size_t room = (size_t)s->cfg.max_packet - ts_swim_wire_base_size(msg->type);
    ts_swim_update_t u;
    uint32_t skip_member = NONE; /* an update about it is already in */
    if (o->flags & OUT_SELF_CLAIM) {
        const ts_swim_claim_t *c = claim_of(s, SELF);
        u = (ts_swim_update_t){.type = c->kind == TS_SWIM_CLAIM_LEAVE ? TS_SWIM_UP_LEAVE
                                                                      : TS_SWIM_UP_ALIVE};
        u.u.claim = *c;
        if (add_update(msg, &room, &u))
            skip_member = SELF;
    }
    if (o->dest != NONE && o->dest != SELF && s->members[o->dest].fp == o->dest_fp &&
        s->members[o->dest].claim != TS_SWIM_NO_CLAIM) {
        const member_t *m = &s->members[o->dest];
        if (m->state == TS_SWIM_SUSPECT || m->state == TS_SWIM_DEAD) {
            u = (ts_swim_update_t){.type = m->state == TS_SWIM_SUSPECT ? TS_SWIM_UP_SUSPECT
                                                                       : TS_SWIM_UP_DEAD};
            memcpy(u.u.accuse.id, id_of(s, o->dest), TS_SWIM_ID_LEN);
            memcpy(u.u.accuse.from, id_of(s, SELF), TS_SWIM_ID_LEN);
            u.u.accuse.incarnation = m->inc;
            if (add_update(msg, &room, &u) && skip_member == NONE)
                skip_member = o->dest;
        }
    }
    uint64_t mark = ++s->pkt_serial;
    for (;;) {
        uint32_t best = NONE;
        for (uint32_t i = 0; i < s->n_bc; i++) {
            const bcast_t *b = &s->bc[i];
            if (b->mark == mark || b->member == skip_member || bc_size(b) > room)
                continue;
            if (best == NONE || bc_before(b, &s->bc[best]))
                best = i;
        }
        if (best == NONE)
            break;
        bc_to_update(s, &s->bc[best], &u);
        if (!add_update(msg, &room, &u))
            break;
        s->bc[best].mark = mark;
    }
    int limit = ts_swim_retransmit_limit(&s->cfg, n_live(s));
    for (uint32_t i = s->n_bc; i-- > 0;) {
        bcast_t *b = &s->bc[i];
        if (b->mark == mark && ++b->transmits >= limit)
            bc_remove(s, i);
    }
}

int ts_swim_next_packet(ts_swim_t *s, ts_swim_addr_t *to, ts_swim_msg_t *msg) {
    if (!s || !to || !msg || s->out_len == 0)
        return 0;
    out_t o = s->out[s->out_head];
    s->out_head = (s->out_head + 1) % s->cfg.max_outbox;
    s->out_len--;
    memset(msg, 0, sizeof *msg);
    msg->type = o.type;
    memcpy(msg->from, id_of(s, SELF), TS_SWIM_ID_LEN);
    msg->seq = o.seq;
    msg->flags = o.ack_flags;
    memcpy(msg->target, o.target, TS_SWIM_ID_LEN);
    msg->target_addr = o.target_addr;
    fill_piggyback(s, &o, msg);
    *to = o.to;
    s->st.packets_out++;
    return 1;
}

int ts_swim_next_event(ts_swim_t *s, ts_swim_event_t *ev) {
    if (!s || !ev || s->ev_len == 0)
        return 0;
    *ev = s->ev[s->ev_head];
    s->ev_head = (s->ev_head + 1) % s->cfg.max_events;
    s->ev_len--;
    return 1;
}

/* ---- joining, leaving, adverts ----------------------------------------------------------- */

int ts_swim_join(ts_swim_t *s, int64_t now, const ts_swim_addr_t *seeds, size_t n) {
    if (!s || !seeds || n == 0 || n > MAX_SEEDS)
        return TS_EINVAL;
    if (s->leaving)
        return TS_ENOTSUP;
    memcpy(s->seeds, seeds, n * sizeof *seeds);
    s->n_seeds = (uint32_t)n;
    s->joining = n_live(s) <= 1;
    /* our claim goes out again from the start: whoever we reach spreads it */
    bc_queue(s, now, SELF, TS_SWIM_UP_ALIVE, 0, NULL);
    for (size_t i = 0; i < n; i++) {
        push_pull_request(s, NONE, &seeds[i], now);
        out_t *o = out_push(s, TS_SWIM_GOSSIP, &seeds[i], NONE);
        if (o)
            o->flags |= OUT_SELF_CLAIM;
    }
    s->join_retry_at = now + s->cfg.join_retry_ms;
    return TS_OK;
}

int ts_swim_leave(ts_swim_t *s, int64_t now) {
    if (!s)
        return TS_EINVAL;
    if (s->leaving)
        return TS_OK;
    ts_swim_claim_t c = {.kind = TS_SWIM_CLAIM_LEAVE, .incarnation = s->members[SELF].inc};
    memcpy(c.id, id_of(s, SELF), TS_SWIM_ID_LEN);
    int rc = adopt_own_claim(s, now, &c);
    if (rc != TS_OK)
        return rc;
    set_state(s, SELF, TS_SWIM_LEFT, c.incarnation, now);
    s->leaving = true;
    s->leave_at = now;
    s->probe.active = false;
    s->next_probe_at = NEVER;
    s->join_retry_at = NEVER;
    uint32_t picked[32];
    int n = 0;
    while (n < 2 * s->cfg.gossip_fanout) {
        uint32_t slot = random_member(s, picked, n, false);
        if (slot == NONE)
            break;
        picked[n++] = slot;
        out_t *o = out_to_member(s, TS_SWIM_GOSSIP, slot);
        if (o)
            o->flags |= OUT_SELF_CLAIM;
    }
    return TS_OK;
}

bool ts_swim_leave_done(const ts_swim_t *s, int64_t now) {
    if (!s || !s->leaving)
        return false;
    return s->members[SELF].bcast == NONE || s->n_order == 0 ||
           now - s->leave_at >= s->cfg.leave_linger_ms;
}

int ts_swim_set_advert(ts_swim_t *s, int64_t now, uint64_t version,
                       const uint8_t hash[TS_SWIM_HASH_LEN]) {
    if (!s || !hash)
        return TS_EINVAL;
    if (s->leaving)
        return TS_ENOTSUP;
    ts_swim_claim_t c = *claim_of(s, SELF);
    if (version <= c.advert_version)
        return TS_EINVAL;
    c.advert_version = version;
    memcpy(c.advert_hash, hash, TS_SWIM_HASH_LEN);
    return adopt_own_claim(s, now, &c);
}

/* ---- anti-entropy and inspection --------------------------------------------------------- */

static void member_info(const ts_swim_t *s, uint32_t slot, ts_swim_member_info_t *info) {
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
            member_info(s, i, &out[n++]);
    return n;
}

int ts_swim_merge_state(ts_swim_t *s, int64_t now, const uint8_t peer_id[TS_SWIM_ID_LEN],
                        const ts_swim_member_info_t *entries, uint32_t n) {
    if (!s || !peer_id || (!entries && n > 0))
        return TS_EINVAL;
    /* What is new to us is gossiped on (the peer may be the only one who knew it: a seed
     * merging a joiner's state), except while we are joining: then everything is new to us and
     * nothing to the network. */
    bool rebroadcast = !s->joining;
    for (uint32_t i = 0; i < n; i++) {
        const ts_swim_member_info_t *e = &entries[i];
        int want = e->state == TS_SWIM_LEFT ? TS_SWIM_CLAIM_LEAVE : TS_SWIM_CLAIM_ALIVE;
        if (e->state < TS_SWIM_ALIVE || e->state > TS_SWIM_LEFT || e->claim.kind != want)
            continue;
        bool accused = e->state == TS_SWIM_SUSPECT || e->state == TS_SWIM_DEAD;
        /* a member the peer holds suspect or dead and we do not know (we may have forgotten it
         * already) is not learnt from it: its old alive claim would bring it back to life */
        if (accused && member_find(s, e->claim.id) == NONE)
            continue;
        apply_claim(s, now, &e->claim, rebroadcast);
        if (accused) {
            ts_swim_accusation_t a = {.incarnation = e->incarnation};
            memcpy(a.id, e->claim.id, TS_SWIM_ID_LEN);
            memcpy(a.from, peer_id, TS_SWIM_ID_LEN);
            apply_accusation(s, now, TS_SWIM_UP_SUSPECT, &a, rebroadcast);
        }
    }
    if (n_live(s) > 1)
        s->joining = false;
    return TS_OK;
}

int ts_swim_member_get(const ts_swim_t *s, const uint8_t id[TS_SWIM_ID_LEN],
                       ts_swim_member_info_t *info) {
    if (!s || !id || !info)
        return TS_EINVAL;
    uint32_t slot = member_find(s, id);
    if (slot == NONE)
        return TS_ENOTFOUND;
    member_info(s, slot, info);
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
        CHECK(m->fp == fp_of(c->id) && member_find(s, c->id) == i);
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
