/*
 * swim_internal.h — internal to the gossip core (net/swim.h): the state behind ts_swim_t and
 * the helpers its files share. Included only by swim.c, swim_members.c, swim_bcast.c and
 * swim_updates.c; nothing outside the core may see it.
 *
 * The core is one state machine in four files, split along its seams:
 *   swim.c          the protocol's driving side: create and free, timers (probing, relaying
 *                   ping-reqs, gossip rounds, push-pull, reaping), datagrams in and out, the
 *                   output queues, joining, leaving and adverts;
 *   swim_updates.c  what changes a member's state: claims and accusations applied, suspicions
 *                   and their timeouts, our own claim and its refutation, push-pull merges;
 *   swim_members.c  the member table: the random generator, the id index, the probe order,
 *                   adding and reaping members, inspection and the self-check;
 *   swim_bcast.c    the broadcast queue and the piggyback every datagram carries;
 *   swim_digest.c   push-pull's digests: a hash per bucket of members, and the members of the
 *                   buckets in which two views differ.
 *
 * Naming. A helper shared between these files has external linkage, so it is named
 * ts_swim__<name> (two underscores: the module's prefix, then a name no public symbol of
 * swim.h can take); a helper used by one file stays static with its short name. The small
 * queries below (fp_of, claim_of, ...) are static inline, so they keep their short names.
 * The macros (NONE, SELF, ...) are unprefixed: this header is never included outside the core.
 */
#ifndef TS_SWIM_INTERNAL_H
#define TS_SWIM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "net/swim.h"
#include "net/swim_claims.h"

#define NONE UINT32_MAX
#define NONE16 UINT16_MAX
#define SELF 0u
#define NEVER INT64_MAX
#define MAX_SEEDS 8
#define MAX_CONFIRM 16  /* bound of suspicion_confirm */
#define ANSWERED 16     /* accusers we answered lately, so as to answer each at most once a round */
#define MAX_WITNESSES 8 /* bound of a suspect's witness set (suspicion_confirm + 1, capped) */

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

enum {
    OUT_SELF_CLAIM = 1, /* put our own claim first in the piggyback */
    OUT_ACCUSE = 2,     /* put our suspicion of the member named in target first (to a witness) */
};

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

/* ---- small queries ----------------------------------------------------------------------- */

static inline uint64_t fp_of(const uint8_t id[TS_SWIM_ID_LEN]) {
    uint64_t v;
    memcpy(&v, id, 8);
    return v;
}

static inline const ts_swim_claim_t *claim_of(const ts_swim_t *s, uint32_t slot) {
    return ts_swim_claims_get(s->pool, s->members[slot].claim);
}

static inline const uint8_t *id_of(const ts_swim_t *s, uint32_t slot) {
    return claim_of(s, slot)->id;
}

static inline bool is_live(int state) { return state == TS_SWIM_ALIVE || state == TS_SWIM_SUSPECT; }

static inline uint32_t n_live(const ts_swim_t *s) {
    return s->count[TS_SWIM_ALIVE] + s->count[TS_SWIM_SUSPECT];
}

static inline bool table_full(const ts_swim_t *s) {
    return s->free_head == NONE && s->n_slots == s->cfg.max_members;
}

static inline void health_up(ts_swim_t *s) {
    if (s->health < s->cfg.health_max)
        s->health++;
}

static inline void health_down(ts_swim_t *s) {
    if (s->health > 0)
        s->health--;
}

/* ---- swim_members.c: the random generator, the member table, the probe order ------------- */

void ts_swim__rng_seed(ts_swim_t *s, uint64_t seed);
uint64_t ts_swim__rng_next(ts_swim_t *s);
/* Uniform in [0, n), n ≥ 1. */
uint32_t ts_swim__rng_below(ts_swim_t *s, uint32_t n);
/* The slot of the member with this id, NONE when it is not in the table. */
uint32_t ts_swim__member_find(const ts_swim_t *s, const uint8_t id[TS_SWIM_ID_LEN]);
/* A member becomes live (enters the probe order) or stops being live (leaves it). */
void ts_swim__order_insert(ts_swim_t *s, uint32_t slot);
void ts_swim__order_remove(ts_swim_t *s, uint32_t slot);
/* A new round: the probe order reshuffled, the cursor back at its start. */
void ts_swim__order_shuffle(ts_swim_t *s);
/* A random live member other than us and the n slots in avoid; NONE after a few tries. */
uint32_t ts_swim__random_member(ts_swim_t *s, const uint32_t *avoid, int n, bool alive_only);
/* The witnesses of the member in slot: the live members (ourselves included, the member not)
 * ranked first by a hash of both ids, at most max (≤ MAX_WITNESSES) of them, into out; returns
 * how many. Every node with the same view computes the same set, so a suspicion sent to it
 * meets its confirmations there, and the suspect can send its refutation there too. */
uint32_t ts_swim__witnesses(const ts_swim_t *s, uint32_t slot, uint32_t *out, uint32_t max);
/* How many witnesses a suspect has under the config (K + 1, at most MAX_WITNESSES). */
uint32_t ts_swim__n_witnesses(const ts_swim_t *s);
/* The member in slot as swim.h's inspection shows it. */
void ts_swim__member_info(const ts_swim_t *s, uint32_t slot, ts_swim_member_info_t *info);
/* Adds an alive member holding claim (a reference the table takes over); returns its slot. */
uint32_t ts_swim__member_add(ts_swim_t *s, uint32_t claim, int64_t now);
/* Forgets the member in slot (a REAPED event, its queued update dropped, its slot freed). */
void ts_swim__member_reap(ts_swim_t *s, uint32_t slot, int64_t now);

/* ---- swim_bcast.c: the broadcast queue and the piggyback --------------------------------- */

/* Queues an update about the member in slot, replacing any older one about it. */
void ts_swim__bc_queue(ts_swim_t *s, int64_t now, uint32_t slot, int type, uint32_t inc,
                       const uint8_t *from);
/* Drops queue entry i. */
void ts_swim__bc_remove(ts_swim_t *s, uint32_t i);
/* Fills msg's updates for the datagram o, counting each queued update it takes. */
void ts_swim__fill_piggyback(ts_swim_t *s, const out_t *o, ts_swim_msg_t *msg);

/* ---- swim_updates.c: state changes, suspicions, claims and accusations ------------------- */

void ts_swim__set_state(ts_swim_t *s, uint32_t slot, int state, uint32_t inc, int64_t now);
/* Drops the suspicion held about the member in slot, if any. */
void ts_swim__susp_clear(ts_swim_t *s, uint32_t slot);
/* Signs c (all but sig filled in) and makes it our claim; queues it for gossip when gossip is
 * true (a refutation of a suspicion is not gossiped: it goes to the accusers and witnesses). */
int ts_swim__adopt_own_claim(ts_swim_t *s, int64_t now, ts_swim_claim_t *c, bool gossip);
/* Applies one update received on a datagram sent by sender (gossips on claims and verdicts that
 * are new; suspicions stay with whoever holds them). */
void ts_swim__apply_update(ts_swim_t *s, int64_t now, const ts_swim_update_t *u,
                           const uint8_t sender[TS_SWIM_ID_LEN]);
/* Our own accusation (TS_SWIM_UP_SUSPECT or TS_SWIM_UP_DEAD) of the member in slot. */
void ts_swim__accuse(ts_swim_t *s, int64_t now, int type, uint32_t slot);

/* ---- swim.c: the output queues ----------------------------------------------------------- */

/* Queues an event about the member in slot, from its current claim and state. */
void ts_swim__ev_push(ts_swim_t *s, int type, uint32_t slot, int64_t now);
/* Queues a datagram to the member in slot, at its claimed address; NULL when the outbox is
 * full. */
out_t *ts_swim__out_to_member(ts_swim_t *s, int type, uint32_t slot);

#endif
