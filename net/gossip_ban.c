/*
 * gossip_ban.c — bans (gossip.h): the nodes whose adverts this node no longer passes on.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net/gossip_internal.h"

const ts_gossip_ban_info_t *ts_gossip_banned(const ts_gossip_t *g,
                                             const uint8_t id[TS_NODE_ID_BYTES]) {
    for (uint32_t i = 0; i < g->n_bans; i++)
        if (memcmp(g->bans[i].id, id, TS_NODE_ID_BYTES) == 0)
            return &g->bans[i];
    return NULL;
}

int ts_gossip__expelled(const ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]) {
    const ts_gossip_ban_info_t *b = ts_gossip_banned(g, id);
    return b && b->expelled;
}

const ts_gossip_ban_info_t *ts_gossip_bans(const ts_gossip_t *g, uint32_t *n) {
    *n = g->n_bans;
    return g->bans;
}

int ts_gossip_ban(ts_gossip_t *g, const ts_gossip_ban_info_t *b) {
    if (ts_gossip_banned(g, b->id))
        return 0;
    if (g->n_bans >= g->cfg.swim.max_members) /* as many as the members it could have */
        return TS_ERANGE;
    if (g->n_bans == g->cap_bans) {
        uint32_t cap = g->cap_bans ? 2 * g->cap_bans : 8;
        ts_gossip_ban_info_t *nb = realloc(g->bans, cap * sizeof *nb);
        if (!nb)
            return TS_ENOMEM;
        g->bans = nb;
        g->cap_bans = cap;
    }
    ts_gossip_ban_info_t *d = &g->bans[g->n_bans++];
    *d = *b;
    d->reason[sizeof d->reason - 1] = '\0';
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    d->since_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    return 1;
}
