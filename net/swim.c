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
 *
 * This file is the protocol's driving side: timers, probes, relays, datagrams in and out,
 * joining and leaving. What changes a member's state is in swim_updates.c, the member table in
 * swim_members.c (ts_swim_validate there checks the invariants above), the broadcast queue and
 * the piggyback in swim_bcast.c; swim_internal.h holds the state they share.
 */
#include "net/swim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "net/swim_internal.h"
#include "net/swim_wire.h"

/* ---- small helpers ----------------------------------------------------------------------- */

static int64_t probe_interval(const ts_swim_t *s) {
    return (int64_t)s->cfg.probe_interval_ms * (1 + s->health);
}

static int64_t probe_timeout(const ts_swim_t *s) {
    return (int64_t)s->cfg.probe_timeout_ms * (1 + s->health);
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

/* The push-pull period for n live members: the base up to 32 members, then one base more per
 * doubling (memberlist's scaling), so a node's share of full-state traffic grows like log n
 * while the state grows like n — unless push_pull_fixed: exchanges by digests cost about the
 * same at any n, and a shorter period repairs a missed verdict sooner. */
static int64_t push_pull_period(const ts_swim_t *s) {
    uint32_t n = n_live(s);
    int64_t base = s->cfg.push_pull_interval_ms;
    if (n <= 32 || s->cfg.push_pull_fixed)
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
void ts_swim__ev_push(ts_swim_t *s, int type, uint32_t slot, int64_t now) {
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
out_t *ts_swim__out_to_member(ts_swim_t *s, int type, uint32_t slot) {
    return out_push(s, type, &claim_of(s, slot)->addr, slot);
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
        ts_swim__order_shuffle(s);
    uint32_t slot = s->order[s->cursor++];
    out_t *o = ts_swim__out_to_member(s, TS_SWIM_PING, slot);
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
        uint32_t helper = ts_swim__random_member(s, avoid, n_avoid, true);
        if (helper == NONE)
            break;
        avoid[n_avoid++] = helper;
        out_t *o = ts_swim__out_to_member(s, TS_SWIM_PING_REQ, helper);
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
        ts_swim__accuse(s, now, TS_SWIM_UP_SUSPECT, p->target);
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
    out_t *o = out_push(s, TS_SWIM_PING, &msg->target_addr, ts_swim__member_find(s, msg->target));
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
    ts_swim__rng_seed(s, seed);
    s->salt = ts_swim__rng_next(s);
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
    ts_swim__member_add(s, h, now_ms);
    ts_swim__bc_queue(s, now_ms, SELF, TS_SWIM_UP_ALIVE, 0, NULL);

    /* timers start at random phases, so that nodes started together do not probe, gossip and
     * exchange state in lockstep */
    s->next_probe_at = now_ms + ts_swim__rng_below(s, (uint32_t)cfg->probe_interval_ms);
    s->next_gossip_at = now_ms + ts_swim__rng_below(s, (uint32_t)cfg->gossip_interval_ms);
    s->next_push_pull_at =
        cfg->push_pull_interval_ms > 0
            ? now_ms + ts_swim__rng_below(s, (uint32_t)cfg->push_pull_interval_ms)
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
        uint32_t slot = ts_swim__random_member(s, picked, n, false);
        if (slot == NONE)
            break;
        picked[n++] = slot;
        ts_swim__out_to_member(s, TS_SWIM_GOSSIP, slot);
    }
}

/* The push-pull partner: usually a random alive member; with probability dead / (dead + live)
 * a random dead one instead (Serf's reconnect). If that one is in fact alive — the two sides of
 * a healed partition, each believing the other dead — the exchange shows each side what the
 * other believes, and the refutations that follow bring both halves back together. */
static uint32_t push_pull_target(ts_swim_t *s) {
    uint32_t dead = s->count[TS_SWIM_DEAD];
    if (dead > 0 && ts_swim__rng_below(s, dead + s->n_order) < dead) {
        uint32_t pick = ts_swim__rng_below(s, dead), seen = 0;
        for (uint32_t i = 1; i < s->n_slots; i++)
            if (s->members[i].state == TS_SWIM_DEAD && seen++ == pick)
                return i;
    }
    return ts_swim__random_member(s, NULL, 0, true);
}

static void push_pull_request(ts_swim_t *s, uint32_t slot, const ts_swim_addr_t *addr,
                              int64_t now) {
    if (slot != NONE) {
        ts_swim__ev_push(s, TS_SWIM_EV_PUSH_PULL, slot, now);
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
            ts_swim__member_reap(s, i, now);
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

    /* A suspect ping to each suspect every probe interval until our verdict, carrying our
     * suspicion (the buddy piggyback). A suspect whose refutation missed us (it reaches only
     * the accusers and witnesses it hears of, and datagrams get lost) answers us directly; a
     * crashed one costs a datagram a second from each of its few suspecters. */
    for (uint32_t i = 0; i < s->n_sp; i++) {
        susp_t *p = &s->sp[i];
        if (p->check_at > now)
            continue;
        p->check_at = now + s->cfg.probe_interval_ms;
        out_t *o = ts_swim__out_to_member(s, TS_SWIM_PING, p->member);
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
        ts_swim__accuse(s, now, TS_SWIM_UP_DEAD, slot);
        /* already done by the state change; kept for the loop's sake */
        ts_swim__susp_clear(s, slot);
        /* the verdict also goes to the member itself (the buddy piggyback carries it): one that
         * is in fact alive hears it and refutes */
        ts_swim__out_to_member(s, TS_SWIM_GOSSIP, slot);
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
        ts_swim__apply_update(s, now, &msg->updates[i], msg->from);

    const uint8_t *self_id = id_of(s, SELF);
    switch (msg->type) {
    case TS_SWIM_PING:
        if (memcmp(msg->target, self_id, TS_SWIM_ID_LEN) != 0) {
            s->st.pings_misaddressed++; /* meant for whoever had this address before us */
            break;
        }
        {
            uint32_t sender = ts_swim__member_find(s, msg->from);
            out_t *o = out_push(s, TS_SWIM_ACK, from, sender);
            if (o) {
                o->seq = msg->seq;
                o->ack_flags = sender == NONE ? TS_SWIM_ACK_WHO_ARE_YOU : 0;
            }
        }
        break;
    case TS_SWIM_PING_REQ:
        if (memcmp(msg->target, self_id, TS_SWIM_ID_LEN) == 0) {
            out_t *o = out_push(s, TS_SWIM_ACK, from, ts_swim__member_find(s, msg->from));
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
                    out_t *o = ts_swim__out_to_member(s, TS_SWIM_GOSSIP, s->probe.target);
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
    ts_swim__fill_piggyback(s, &o, msg);
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
    ts_swim__bc_queue(s, now, SELF, TS_SWIM_UP_ALIVE, 0, NULL);
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
    int rc = ts_swim__adopt_own_claim(s, now, &c, true);
    if (rc != TS_OK)
        return rc;
    ts_swim__set_state(s, SELF, TS_SWIM_LEFT, c.incarnation, now);
    s->leaving = true;
    s->leave_at = now;
    s->probe.active = false;
    s->next_probe_at = NEVER;
    s->join_retry_at = NEVER;
    uint32_t picked[32];
    int n = 0;
    while (n < 2 * s->cfg.gossip_fanout) {
        uint32_t slot = ts_swim__random_member(s, picked, n, false);
        if (slot == NONE)
            break;
        picked[n++] = slot;
        out_t *o = ts_swim__out_to_member(s, TS_SWIM_GOSSIP, slot);
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

int ts_swim_set_addr(ts_swim_t *s, int64_t now, const ts_swim_addr_t *addr) {
    if (!s || !addr || addr->port == 0)
        return TS_EINVAL;
    if (s->leaving)
        return TS_ENOTSUP;
    ts_swim_claim_t c = *claim_of(s, SELF);
    if (memcmp(&c.addr, addr, sizeof *addr) == 0)
        return TS_OK;
    if (c.incarnation == UINT32_MAX)
        return TS_ERANGE;
    c.addr = *addr;
    c.incarnation++; /* a move at the same incarnation would read as stale */
    return ts_swim__adopt_own_claim(s, now, &c, true);
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
    return ts_swim__adopt_own_claim(s, now, &c, true);
}
