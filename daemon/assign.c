/* assign.c — the cluster an auto node serves (assign.h). */
#include "daemon/assign.h"

#include <math.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

uint64_t ts_assign_rank(const uint8_t id[TS_ASSIGN_ID_BYTES], int cluster) {
    uint8_t in[TS_ASSIGN_ID_BYTES + 4], out[16];
    memcpy(in, id, TS_ASSIGN_ID_BYTES);
    uint32_t c = (uint32_t)cluster;
    for (int i = 0; i < 4; i++)
        in[TS_ASSIGN_ID_BYTES + i] = (uint8_t)(c >> (8 * i));
    crypto_generichash(out, sizeof out, in, sizeof in, NULL, 0);
    uint64_t r = 0;
    for (int i = 0; i < 8; i++)
        r = r << 8 | out[i];
    return r;
}

static double need_of(const int *replicas, const double *demand, int k) {
    return replicas[k] == 0 ? INFINITY : demand[k] / (double)(replicas[k] + 1);
}

/* The cluster of greatest need; ties by self's rank (so nodes starting together spread). */
static int neediest(int K, const int *replicas, const double *demand, const uint8_t *self) {
    int best = -1;
    double best_need = -1.0;
    uint64_t best_rank = 0;
    for (int k = 0; k < K; k++) {
        double n = need_of(replicas, demand, k);
        uint64_t r = ts_assign_rank(self, k);
        if (best < 0 || n > best_need || (n == best_need && r > best_rank))
            best = k, best_need = n, best_rank = r;
    }
    return best;
}

/* The moves of one round, the same for every node that sees the same view: targets in order of
 * need (uncovered first; equal needs by cluster index), each taking at most one mover, the
 * eligible node of the highest rank(id, target); a donor cluster keeps at least one replica.
 * Fills out when self is one of the movers (and may move: dwell_ok). */
static int plan(const ts_assign_view_t *v, const uint8_t *self, int current, int *replicas,
                const double *demand, ts_assign_result_t *out) {
    size_t n = v->n + 1; /* the view's experts, then self */
    unsigned char *moved = calloc(n, 1), *target_done = calloc((size_t)v->K, 1);
    if (!moved || !target_done) {
        free(moved);
        free(target_done);
        return TS_ENOMEM;
    }
    double gain = v->gain > 1.0 ? v->gain : 2.0;
    for (;;) {
        int b = -1;
        for (int k = 0; k < v->K; k++)
            if (!target_done[k] &&
                (b < 0 || need_of(replicas, demand, k) > need_of(replicas, demand, b)))
                b = k;
        if (b < 0)
            break;
        target_done[b] = 1;
        int uncovered = replicas[b] == 0;
        double nb = need_of(replicas, demand, b);
        size_t pick = n;
        uint64_t best = 0;
        for (size_t i = 0; i < n; i++) {
            int is_self = i == v->n;
            const uint8_t *id = is_self ? self : v->experts[i].node_id;
            int a = is_self ? current : v->experts[i].cluster;
            if (moved[i] || a == b || replicas[a] < 2 ||
                (!is_self && memcmp(id, self, TS_ASSIGN_ID_BYTES) == 0))
                continue; /* self's own advert stands for nothing: self is the last entry */
            if (!uncovered && !(nb > gain * demand[a] / (double)replicas[a]))
                continue;
            uint64_t r = ts_assign_rank(id, b);
            if (pick == n || r > best)
                pick = i, best = r;
        }
        if (pick == n)
            continue;
        moved[pick] = 1;
        int a = pick == v->n ? current : v->experts[pick].cluster;
        replicas[a]--;
        replicas[b]++;
        if (pick == v->n && v->dwell_ok)
            *out = (ts_assign_result_t){.cluster = b,
                                        .move = 1,
                                        .need = nb,
                                        .why = uncovered ? "uncovered" : "more demand per replica"};
    }
    free(moved);
    free(target_done);
    return TS_OK;
}

static int check_view(const ts_assign_view_t *v, int current) {
    if (!v || v->K < 1 || v->K > TS_ASSIGN_MAX_CLUSTERS || (v->n && !v->experts) || current < -1 ||
        current >= v->K)
        return TS_EINVAL;
    for (size_t i = 0; i < v->n; i++) {
        const ts_assign_expert_t *e = &v->experts[i];
        if (e->cluster < 0 || e->cluster >= v->K || !isfinite(e->requests_per_s) ||
            e->requests_per_s < 0.0)
            return TS_EINVAL;
    }
    return TS_OK;
}

int ts_assign_choose(const ts_assign_view_t *v, const uint8_t self[TS_ASSIGN_ID_BYTES], int current,
                     ts_assign_result_t *out) {
    if (!self || !out || check_view(v, current) != TS_OK)
        return TS_EINVAL;
    int *replicas = calloc((size_t)v->K, sizeof *replicas);
    double *demand = calloc((size_t)v->K, sizeof *demand);
    if (!replicas || !demand) {
        free(replicas);
        free(demand);
        return TS_ENOMEM;
    }
    for (size_t i = 0; i < v->n; i++) {
        const ts_assign_expert_t *e = &v->experts[i];
        demand[e->cluster] += e->requests_per_s;
        if (memcmp(e->node_id, self, TS_ASSIGN_ID_BYTES) != 0)
            replicas[e->cluster]++; /* this node counts once, below, where it serves now */
    }
    if (current < 0) {
        int k = neediest(v->K, replicas, demand, self);
        *out = (ts_assign_result_t){.cluster = k,
                                    .move = 1,
                                    .need = need_of(replicas, demand, k),
                                    .why = replicas[k] == 0 ? "uncovered"
                                                            : "the most demand per "
                                                              "replica"};
        free(replicas);
        free(demand);
        return TS_OK;
    }
    replicas[current]++;
    *out = (ts_assign_result_t){.cluster = current, .move = 0, .why = "stay"};
    out->need = demand[current] / (double)replicas[current]; /* as it is, for the log */
    int rc = plan(v, self, current, replicas, demand, out);
    free(replicas);
    free(demand);
    return rc;
}
