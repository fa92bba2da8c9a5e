/*
 * gossip_book.c — the gossip driver's address book (gossip_internal.h) in the store's peers
 * table (store/peers.h). Members heard alive (joined, alive again, moved) are marked; the
 * housekeeper writes the marked ones that are still alive in one transaction, and every
 * BOOK_REFRESH_MS (gossip.c) every live member, to refresh its last_seen. At start the book is
 * pruned and its most recently seen entries become seeds, so that a restarted node with no
 * bootstrap configured rejoins.
 */
#define _POSIX_C_SOURCE 200809L

#include <string.h>
#include <time.h>

#include "net/gossip_internal.h"
#include "store/peers.h"

/* ---- the address book ----------------------------------------------------------------------- */

void ts_gossip__book_mark(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]) {
    if (!g->cfg.store || memcmp(id, g->self.b, TS_SWIM_ID_LEN) == 0)
        return;
    for (uint32_t i = 0; i < g->n_dirty; i++)
        if (memcmp(g->dirty[i], id, TS_SWIM_ID_LEN) == 0)
            return;
    if (g->n_dirty < g->cfg.swim.max_members)
        memcpy(g->dirty[g->n_dirty++], id, TS_SWIM_ID_LEN);
    else
        g->book_full = 1;
}

typedef struct {
    ts_gossip_t *g;
    uint32_t n; /* entries of g->members to write */
} book_batch_t;

static int book_write_txn(void *ctx, ts_store_txn_t *txn) {
    book_batch_t *b = ctx;
    int64_t now = (int64_t)time(NULL);
    for (uint32_t i = 0; i < b->n; i++) {
        const ts_swim_member_info_t *m = &b->g->members[i];
        ts_peer_t p;
        memset(&p, 0, sizeof p);
        memcpy(p.id, m->claim.id, TS_PEER_ID_LEN);
        p.n_addrs = 1;
        ts_gossip__addr_str(&m->claim.addr, p.addrs[0]);
        p.last_seen = now;
        unsigned char buf[TS_PEER_ENCODED_MAX];
        size_t len;
        if (ts_peer_encode(&p, buf, &len) != TS_OK)
            continue;
        int rc = ts_txn_put(txn, TS_DB_PEERS, p.id, TS_PEER_ID_LEN, buf, len);
        if (rc)
            return rc;
    }
    return TS_OK;
}

/* Writes the members marked since the last write (or, for a refresh, every live member) that
 * are alive now, in one transaction. */
void ts_gossip__book_flush(ts_gossip_t *g) {
    if (!g->cfg.store || !g->swim || (g->n_dirty == 0 && !g->book_full))
        return;
    uint32_t n = ts_swim_state_export(g->swim, g->members, g->cfg.swim.max_members), kept = 0;
    for (uint32_t i = 1; i < n; i++) {
        const ts_swim_member_info_t *m = &g->members[i];
        if (m->state != TS_SWIM_ALIVE || m->claim.kind != TS_SWIM_CLAIM_ALIVE)
            continue;
        int wanted = g->book_full;
        for (uint32_t k = 0; k < g->n_dirty && !wanted; k++)
            wanted = memcmp(g->dirty[k], m->claim.id, TS_SWIM_ID_LEN) == 0;
        if (wanted)
            g->members[kept++] = *m;
    }
    g->n_dirty = 0;
    g->book_full = 0;
    book_batch_t b = {g, kept};
    if (kept > 0 && ts_store_write(g->cfg.store, book_write_txn, &b) == TS_OK)
        g->st.book_writes += kept;
}

typedef struct {
    ts_peer_t *entries;
    uint32_t n, cap;
} book_list_t;

static int book_collect(void *ctx, const ts_peer_t *p) {
    book_list_t *l = ctx;
    if (l->n < l->cap)
        l->entries[l->n++] = *p;
    else { /* keep the most recent: replace the oldest held */
        uint32_t oldest = 0;
        for (uint32_t i = 1; i < l->n; i++)
            if (l->entries[i].last_seen < l->entries[oldest].last_seen)
                oldest = i;
        if (p->last_seen > l->entries[oldest].last_seen)
            l->entries[oldest] = *p;
    }
    return TS_OK;
}

int ts_gossip__seed_add(ts_gossip_t *g, const ts_swim_addr_t *a) {
    if (g->n_seeds >= TS_GOSSIP_MAX_SEEDS ||
        memcmp(a, &g->self_addr, sizeof *a) == 0) /* ourselves */
        return 0;
    for (uint32_t i = 0; i < g->n_seeds; i++)
        if (memcmp(&g->seeds[i], a, sizeof *a) == 0)
            return 0;
    g->seeds[g->n_seeds++] = *a;
    return 1;
}

/* Prunes the book and adds its most recently seen entries to the seeds, leaving room for half
 * the bootstrap list (so that neither a stale book nor a long bootstrap list crowds out the
 * other). */
void ts_gossip__book_load(ts_gossip_t *g) {
    if (!g->cfg.store)
        return;
    ts_peers_prune(g->cfg.store, (int64_t)time(NULL) - (int64_t)g->cfg.book_max_age_s, NULL);
    size_t room = TS_GOSSIP_MAX_SEEDS - (g->cfg.n_bootstrap < TS_GOSSIP_MAX_SEEDS / 2
                                             ? g->cfg.n_bootstrap
                                             : TS_GOSSIP_MAX_SEEDS / 2);
    ts_peer_t entries[TS_GOSSIP_MAX_SEEDS + 1];
    book_list_t l = {entries, 0, (uint32_t)room + 1}; /* one more: we may be in it */
    if (ts_peers_list(g->cfg.store, book_collect, &l) != TS_OK)
        return; /* an entry that does not decode: the book is skipped, bootstrap still works */
    for (uint32_t k = 0; k < l.n; k++) { /* most recent first */
        uint32_t best = k;
        for (uint32_t i = k + 1; i < l.n; i++)
            if (entries[i].last_seen > entries[best].last_seen)
                best = i;
        ts_peer_t t = entries[k];
        entries[k] = entries[best];
        entries[best] = t;
        ts_swim_addr_t a;
        if (memcmp(entries[k].id, g->self.b, TS_PEER_ID_LEN) != 0 && entries[k].n_addrs > 0 &&
            g->n_seeds < room &&
            ts_gossip__addr_parse(entries[k].addrs[0], &a, 0, NULL, 0) == TS_OK)
            ts_gossip__seed_add(g, &a);
    }
}
