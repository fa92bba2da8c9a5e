/*
 * swim_bcast.c — the gossip core's broadcast queue (swim_internal.h): the updates waiting to be
 * gossiped, at most one per member, and the piggyback that carries them on every datagram,
 * each until it has been sent λ·⌈log10(n+1)⌉ times.
 */
#include <string.h>

#include "net/swim_internal.h"
#include "net/swim_wire.h"

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

void ts_swim__bc_remove(ts_swim_t *s, uint32_t i) {
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
void ts_swim__bc_queue(ts_swim_t *s, int64_t now, uint32_t slot, int type, uint32_t inc,
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
            ts_swim__bc_remove(s, worst);
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

/* ---- the piggyback ----------------------------------------------------------------------- */

static bool add_update(ts_swim_msg_t *msg, size_t *room, const ts_swim_update_t *u) {
    size_t size = ts_swim_wire_update_size(u);
    if (msg->n_updates == TS_SWIM_MAX_UPDATES || size > *room)
        return false;
    msg->updates[msg->n_updates++] = *u;
    *room -= size;
    return true;
}

/* Fills the piggyback: our claim first if asked, our suspicion of a member if asked (to its
 * witness), the receiver's own accusation if we hold it suspect or dead (buddy), then queued
 * updates, fewest transmissions first and newest first
 * among equals, skipping what no longer fits. Each one taken counts a transmission; those that
 * reach the limit leave the queue. */
void ts_swim__fill_piggyback(ts_swim_t *s, const out_t *o, ts_swim_msg_t *msg) {
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
    if (o->flags & OUT_ACCUSE) {
        /* to a witness: our suspicion of the member named in target, if we still hold it */
        uint32_t x = ts_swim__member_find(s, o->target);
        if (x != NONE && x != SELF && s->members[x].state == TS_SWIM_SUSPECT) {
            u = (ts_swim_update_t){.type = TS_SWIM_UP_SUSPECT};
            memcpy(u.u.accuse.id, o->target, TS_SWIM_ID_LEN);
            memcpy(u.u.accuse.from, id_of(s, SELF), TS_SWIM_ID_LEN);
            u.u.accuse.incarnation = s->members[x].inc;
            (void)add_update(msg, &room, &u);
        }
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
            ts_swim__bc_remove(s, i);
    }
}
