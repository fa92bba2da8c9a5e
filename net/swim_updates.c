/*
 * swim_updates.c — what changes the gossip core's view of a member (swim_internal.h): claims and
 * accusations applied under the precedence rules of docs/architecture.md ("Messages and
 * claims"), suspicions and their Lifeguard timeouts, state changes, our own claim and its
 * refutation, and the merge of a peer's push-pull state.
 */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "net/swim_internal.h"
#include "net/swim_wire.h"

/* ---- suspicions -------------------------------------------------------------------------- */

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

void ts_swim__susp_clear(ts_swim_t *s, uint32_t slot) {
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
    p->check_at = now + s->cfg.probe_interval_ms;
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
        /* the suspect pings keep their cadence; the last comes a probe interval before */
        int64_t last =
            deadline - s->cfg.probe_interval_ms > now ? deadline - s->cfg.probe_interval_ms : now;
        if (last < p->check_at)
            p->check_at = last;
    }
    return true;
}

/* A suspicion that stands for someone's verdict (a death passed on an older incarnation than
 * ours, or one a push-pull peer holds): the verdict's timer already counted the independent
 * accusers, so ours runs the shortest timeout. The member still has that long to answer one of
 * our suspect pings. */
static void susp_as_verdict(ts_swim_t *s, uint32_t slot, int64_t now) {
    uint16_t i = s->members[slot].susp;
    if (i == NONE16)
        return;
    susp_t *p = &s->sp[i];
    int64_t deadline = now + ts_swim_suspicion_min_ms(&s->cfg, n_live(s));
    if (deadline < p->deadline_ms)
        p->deadline_ms = deadline;
}

/* ---- state changes ----------------------------------------------------------------------- */

void ts_swim__set_state(ts_swim_t *s, uint32_t slot, int state, uint32_t inc, int64_t now) {
    member_t *m = &s->members[slot];
    int old = m->state;
    if (old == state) {
        if (inc != m->inc)
            m->change_ms = now; /* a refutation: what a late accusation is measured against */
        m->inc = inc;
        return;
    }
    m->inc = inc;
    s->count[old]--;
    s->count[state]++;
    m->state = (uint8_t)state;
    m->change_ms = now;
    if (old == TS_SWIM_SUSPECT)
        ts_swim__susp_clear(s, slot);
    if (slot != SELF && is_live(old) != is_live(state)) {
        if (is_live(state))
            ts_swim__order_insert(s, slot);
        else
            ts_swim__order_remove(s, slot);
    }
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

/* Signs c (all but sig filled in) and makes it our claim; queues it for gossip if asked. */
int ts_swim__adopt_own_claim(ts_swim_t *s, int64_t now, ts_swim_claim_t *c, bool gossip) {
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
    if (gossip)
        ts_swim__bc_queue(s, now, SELF,
                          c->kind == TS_SWIM_CLAIM_LEAVE ? TS_SWIM_UP_LEAVE : TS_SWIM_UP_ALIVE, 0,
                          NULL);
    else if (s->members[SELF].bcast != NONE &&
             s->bc[s->members[SELF].bcast].type == TS_SWIM_UP_ALIVE)
        /* an older claim of ours still queued (an advert) goes out as the new one */
        ts_swim__bc_queue(s, now, SELF, TS_SWIM_UP_ALIVE, 0, NULL);
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
    uint32_t slot = ts_swim__member_find(s, from);
    if (slot == NONE || slot == SELF || !is_live(s->members[slot].state))
        return;
    s->answered[oldest].fp = fp;
    s->answered[oldest].at_ms = now;
    out_t *o = ts_swim__out_to_member(s, TS_SWIM_GOSSIP, slot);
    if (o)
        o->flags |= OUT_SELF_CLAIM;
}

/* Answers an accusation of ours at incarnation inc: a new claim at inc + 1. A suspicion is held
 * only by its accusers (answered directly, answer_accuser) and our witnesses, so the refutation
 * goes to those and nowhere else; a verdict, or a claim of a previous run of ours, has gone
 * network-wide, and so does the answer to it. */
static void refute(ts_swim_t *s, int64_t now, uint32_t inc, bool network_wide) {
    if (inc == UINT32_MAX)
        return; /* cannot go higher; 4 billion refutations do not happen */
    ts_swim_claim_t c = *claim_of(s, SELF);
    c.incarnation = inc + 1;
    if (ts_swim__adopt_own_claim(s, now, &c, network_wide) != TS_OK)
        return;
    if (!network_wide) {
        uint32_t w[MAX_WITNESSES];
        uint32_t n = ts_swim__witnesses(s, SELF, w, ts_swim__n_witnesses(s));
        for (uint32_t i = 0; i < n; i++) {
            out_t *o = ts_swim__out_to_member(s, TS_SWIM_GOSSIP, w[i]);
            if (o)
                o->flags |= OUT_SELF_CLAIM;
        }
    }
    s->st.refutations++;
    health_up(s);
    ts_swim__ev_push(s, TS_SWIM_EV_REFUTED, SELF, now);
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
    refute(s, now, c->incarnation, true);
}

static void apply_claim(ts_swim_t *s, int64_t now, const ts_swim_claim_t *c, bool rebroadcast) {
    if (c->kind != TS_SWIM_CLAIM_ALIVE && c->kind != TS_SWIM_CLAIM_LEAVE)
        return;
    uint32_t slot = ts_swim__member_find(s, c->id);
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
        slot = ts_swim__member_add(s, h, now);
        ts_swim__ev_push(s, TS_SWIM_EV_JOINED, slot, now);
        if (c->advert_version > 0)
            ts_swim__ev_push(s, TS_SWIM_EV_ADVERT_NEEDED, slot, now);
        if (rebroadcast)
            ts_swim__bc_queue(s, now, slot, TS_SWIM_UP_ALIVE, 0, NULL);
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
        ts_swim__set_state(s, slot, TS_SWIM_LEFT, c->incarnation, now);
        ts_swim__ev_push(s, TS_SWIM_EV_LEFT, slot, now);
        if (rebroadcast)
            ts_swim__bc_queue(s, now, slot, TS_SWIM_UP_LEAVE, 0, NULL);
        return;
    }
    if (c->incarnation > m->inc)
        ts_swim__set_state(s, slot, TS_SWIM_ALIVE, c->incarnation, now);
    /* a newer incarnation of a member we hold live, and nothing else, is a refutation: news
     * only to those who held the suspicion, which it reaches directly; it is not gossiped on.
     * A new member, a revival, a move or an advert is news to everyone. */
    if (is_live(old_state) && !advert_changed && !moved)
        rebroadcast = false;
    if (old_state != TS_SWIM_ALIVE && m->state == TS_SWIM_ALIVE)
        ts_swim__ev_push(s, TS_SWIM_EV_ALIVE_AGAIN, slot, now);
    else if (moved)
        ts_swim__ev_push(s, TS_SWIM_EV_ADDR_CHANGED, slot, now);
    if (advert_changed)
        ts_swim__ev_push(s, TS_SWIM_EV_ADVERT_NEEDED, slot, now);
    if (rebroadcast)
        ts_swim__bc_queue(s, now, slot, TS_SWIM_UP_ALIVE, 0, NULL);
}

static void on_accused(ts_swim_t *s, int64_t now, int type, const ts_swim_accusation_t *a) {
    if (s->leaving)
        return;
    if (a->incarnation < s->members[SELF].inc) {
        answer_accuser(s, now, a->from); /* they have not heard our refutation yet */
        return;
    }
    refute(s, now, a->incarnation, type == TS_SWIM_UP_DEAD);
    answer_accuser(s, now, a->from);
}

/* direct: the accusation came from its accuser (not relayed, not merged). Suspicions are never
 * relayed, so an accusation older than the incarnation we hold is either one that crossed the
 * refutation on its way (it arrives within a probe interval of it) or new evidence from an
 * accuser whose view of the member is old (refutations reach only accusers and witnesses). The
 * first is ignored; the second counts, as a suspicion at the incarnation we hold. So does a
 * verdict passed on an older incarnation: the member, if alive, refutes it when our suspect
 * ping reaches it, and if it is dead we reach the verdict ourselves. */
static void apply_accusation(ts_swim_t *s, int64_t now, int type, const ts_swim_accusation_t *a,
                             bool rebroadcast, bool direct) {
    uint32_t slot = ts_swim__member_find(s, a->id);
    if (slot == NONE)
        return; /* nothing to accuse */
    if (slot == SELF) {
        on_accused(s, now, type, a);
        return;
    }
    member_t *m = &s->members[slot];
    if (!is_live(m->state)) {
        s->st.stale_ignored++;
        return;
    }
    ts_swim_accusation_t held;
    bool verdict = false;
    if (a->incarnation < m->inc) {
        bool fresh =
            (type == TS_SWIM_UP_DEAD || direct) && now - m->change_ms >= s->cfg.probe_interval_ms;
        if (!fresh) {
            s->st.stale_ignored++;
            return;
        }
        held = *a;
        held.incarnation = m->inc;
        a = &held;
        verdict = type == TS_SWIM_UP_DEAD;
        type = TS_SWIM_UP_SUSPECT;
    }
    if (type == TS_SWIM_UP_DEAD) {
        ts_swim__set_state(s, slot, TS_SWIM_DEAD, a->incarnation, now);
        ts_swim__ev_push(s, TS_SWIM_EV_DEAD, slot, now);
        if (rebroadcast)
            ts_swim__bc_queue(s, now, slot, TS_SWIM_UP_DEAD, a->incarnation, a->from);
        return;
    }
    uint64_t accuser = fp_of(a->from);
    if (m->state == TS_SWIM_ALIVE) {
        if (!susp_start(s, slot, accuser, now))
            return;
        ts_swim__set_state(s, slot, TS_SWIM_SUSPECT, a->incarnation, now);
        s->st.suspicions++;
        ts_swim__ev_push(s, TS_SWIM_EV_SUSPECT, slot, now);
        if (verdict)
            susp_as_verdict(s, slot, now);
        return;
    }
    if (a->incarnation > m->inc) {
        /* suspect again at a newer incarnation: it refuted the suspicion we hold (we missed
         * that) and is suspected anew. A new suspicion, with a timer from now. */
        ts_swim__susp_clear(s, slot);
        m->inc = a->incarnation;
        /* cannot fail: ts_swim__susp_clear freed an entry */
        (void)susp_start(s, slot, accuser, now);
        s->st.suspicions++;
    } else if (susp_confirm(s, slot, accuser, now)) {
        s->st.confirmations++;
    }
    if (verdict)
        susp_as_verdict(s, slot, now);
}

void ts_swim__apply_update(ts_swim_t *s, int64_t now, const ts_swim_update_t *u,
                           const uint8_t sender[TS_SWIM_ID_LEN]) {
    switch (u->type) {
    case TS_SWIM_UP_ALIVE:
    case TS_SWIM_UP_LEAVE:
        if (u->u.claim.kind ==
            (u->type == TS_SWIM_UP_ALIVE ? TS_SWIM_CLAIM_ALIVE : TS_SWIM_CLAIM_LEAVE))
            apply_claim(s, now, &u->u.claim, true);
        break;
    case TS_SWIM_UP_SUSPECT:
    case TS_SWIM_UP_DEAD:
        apply_accusation(s, now, u->type, &u->u.accuse, true,
                         memcmp(u->u.accuse.from, sender, TS_SWIM_ID_LEN) == 0);
        break;
    default: break;
    }
}

/* Our own accusation: the probe of slot failed, or its suspicion ran out. A verdict is gossiped
 * network-wide. A suspicion goes to the suspect (the buddy piggyback: it can refute at once) and
 * to its witnesses, where it meets the other accusers' and is timed with their confirmations;
 * nobody passes it on. */
void ts_swim__accuse(ts_swim_t *s, int64_t now, int type, uint32_t slot) {
    ts_swim_accusation_t a = {.incarnation = s->members[slot].inc};
    memcpy(a.id, id_of(s, slot), TS_SWIM_ID_LEN);
    memcpy(a.from, id_of(s, SELF), TS_SWIM_ID_LEN);
    apply_accusation(s, now, type, &a, true, true);
    if (type != TS_SWIM_UP_SUSPECT || s->members[slot].state != TS_SWIM_SUSPECT)
        return;
    ts_swim__out_to_member(s, TS_SWIM_GOSSIP, slot);
    uint32_t w[MAX_WITNESSES];
    uint32_t n = ts_swim__witnesses(s, slot, w, ts_swim__n_witnesses(s));
    for (uint32_t i = 0; i < n; i++) {
        if (w[i] == SELF)
            continue;
        out_t *o = ts_swim__out_to_member(s, TS_SWIM_GOSSIP, w[i]);
        if (o) {
            o->flags |= OUT_ACCUSE;
            memcpy(o->target, a.id, TS_SWIM_ID_LEN);
        }
    }
}

/* ---- anti-entropy ------------------------------------------------------------------------ */

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
        if (accused && ts_swim__member_find(s, e->claim.id) == NONE)
            continue;
        apply_claim(s, now, &e->claim, rebroadcast);
        /* a suspicion is the peer's own business (its witnesses time it); a death it holds
         * becomes our suspicion, which the member can still refute */
        if (e->state == TS_SWIM_DEAD) {
            ts_swim_accusation_t a = {.incarnation = e->incarnation};
            memcpy(a.id, e->claim.id, TS_SWIM_ID_LEN);
            memcpy(a.from, peer_id, TS_SWIM_ID_LEN);
            apply_accusation(s, now, TS_SWIM_UP_SUSPECT, &a, rebroadcast, false);
            uint32_t slot = ts_swim__member_find(s, a.id);
            if (slot != NONE && slot != SELF)
                susp_as_verdict(s, slot, now);
        }
    }
    if (n_live(s) > 1)
        s->joining = false;
    return TS_OK;
}
