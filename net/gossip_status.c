/*
 * gossip_status.c — the gossip driver's status view (gossip_internal.h): ts_gossip_status and
 * the status_request handler build the same answer from the core's members, the adverts held,
 * the owner's load callback, and the aggregates (experts per cluster, uncovered clusters,
 * capacity, request rate, live members).
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "net/frame.h"
#include "net/gossip_internal.h"

#define MAX_UNCOVERED 65536 /* uncovered clusters listed in one status answer */

/* ---- status --------------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *partition;
    uint32_t cluster, count; /* count: trained to the end (ts_advert_trained) */
    uint32_t training;       /* advertised while still training */
} cluster_count_t;

/* The pieces a status answer points into; freed together by status_scratch_free. */
typedef struct {
    Tessera__StatusResponse resp;
    Tessera__Aggregates agg;
    Tessera__Load load;
    Tessera__TrainingStatus training;
    Tessera__MemberState *members, **member_ptrs;
    char (*addrs)[ADDR_STR];
    Tessera__Advert **adverts;
    cluster_count_t *counts;
    Tessera__ClusterExperts *clusters, **cluster_ptrs;
    Tessera__ClusterRef *refs, **ref_ptrs;
    uint32_t n_counts;
    Tessera__Ban *bans, **ban_ptrs;
} status_scratch_t;

static void status_scratch_free(status_scratch_t *s) {
    free(s->members);
    free(s->member_ptrs);
    free(s->addrs);
    free(s->adverts);
    free(s->counts);
    free(s->clusters);
    free(s->cluster_ptrs);
    free(s->refs);
    free(s->ref_ptrs);
    free(s->bans);
    free(s->ban_ptrs);
}

static Tessera__MemberStatus member_status(int state) {
    switch (state) {
    case TS_SWIM_ALIVE: return TESSERA__MEMBER_STATUS__MEMBER_ALIVE;
    case TS_SWIM_SUSPECT: return TESSERA__MEMBER_STATUS__MEMBER_SUSPECT;
    case TS_SWIM_DEAD: return TESSERA__MEMBER_STATUS__MEMBER_DEAD;
    default: return TESSERA__MEMBER_STATUS__MEMBER_LEFT;
    }
}

static void status_members(ts_gossip_t *g, status_scratch_t *s, uint32_t n) {
    int64_t now = now_ms(g);
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        const ts_swim_member_info_t *m = &g->members[i];
        if (g->n_bans && ts_gossip__expelled(g, m->claim.id))
            continue; /* expelled: no longer listed */
        Tessera__MemberState *ms = &s->members[k];
        tessera__member_state__init(ms);
        ms->has_node_id = 1;
        ms->node_id.data = (uint8_t *)m->claim.id;
        ms->node_id.len = TS_SWIM_ID_LEN;
        ms->has_status = 1;
        ms->status = member_status(m->state);
        ms->has_incarnation = 1;
        ms->incarnation = m->incarnation;
        ms->has_last_change_age_ms = 1;
        ms->last_change_age_ms = now > m->change_ms ? (uint64_t)(now - m->change_ms) : 0;
        if (m->claim.kind == TS_SWIM_CLAIM_ALIVE) {
            ts_gossip__addr_str(&m->claim.addr, s->addrs[k]);
            ms->addr = s->addrs[k];
            ms->has_advert_version = 1;
            ms->advert_version = m->claim.advert_version;
        }
        s->member_ptrs[k++] = ms;
    }
    s->resp.n_members = k;
    s->resp.members = s->member_ptrs;
}

/* The index in s->counts[0..n) of cluster c of partition, n when it is not there. */
static uint32_t count_index(const status_scratch_t *s, uint32_t n, const uint8_t *partition,
                            uint32_t c) {
    uint32_t k = 0;
    while (k < n && !(s->counts[k].cluster == c &&
                      memcmp(s->counts[k].partition, partition, TS_FRAME_ID_BYTES) == 0))
        k++;
    return k;
}

/* Whether some live expert of s->counts[0..n) covers cluster c of partition. */
static int covered(const status_scratch_t *s, uint32_t n, const uint8_t *partition, uint32_t c) {
    uint32_t k = count_index(s, n, partition, c);
    return k < n && s->counts[k].count > 0;
}

/* Calls fn(s, partition, cluster) for each cluster of each partition named by an advert held
 * (a dead expert's too: its cluster is then uncovered) that no live expert covers, at most
 * MAX_UNCOVERED times in all; returns how many. */
static uint32_t each_uncovered(const ts_gossip_t *g, status_scratch_t *s, uint32_t n_counts,
                               void (*fn)(status_scratch_t *, uint32_t, const ProtobufCBinaryData *,
                                          uint32_t)) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < g->n_adverts; i++) {
        const Tessera__AdvertBody *b = g->adverts[i].body;
        int seen = 0; /* each partition once */
        for (uint32_t j = 0; j < i && !seen; j++)
            seen = memcmp(g->adverts[j].body->partition_id.data, b->partition_id.data,
                          TS_FRAME_ID_BYTES) == 0;
        for (uint32_t c = 0; !seen && c < b->num_clusters && n < MAX_UNCOVERED; c++)
            if (!covered(s, n_counts, b->partition_id.data, c)) {
                if (fn)
                    fn(s, n, &b->partition_id, c);
                n++;
            }
    }
    return n;
}

static void put_uncovered(status_scratch_t *s, uint32_t i, const ProtobufCBinaryData *partition,
                          uint32_t cluster) {
    Tessera__ClusterRef *r = &s->refs[i];
    tessera__cluster_ref__init(r);
    r->has_partition_id = r->has_cluster = 1;
    r->partition_id = *partition;
    r->cluster = cluster;
    s->ref_ptrs[i] = r;
    uint32_t k = count_index(s, s->n_counts, partition->data, cluster);
    if (k < s->n_counts && s->counts[k].training) {
        r->has_training_experts = 1;
        r->training_experts = s->counts[k].training;
    }
}

/* Experts per (partition, cluster) among ALIVE members, the clusters of every known partition
 * that none covers, capacity and request rate. */
static int status_aggregates(ts_gossip_t *g, status_scratch_t *s, uint32_t n) {
    uint32_t n_counts = 0, live = 0;
    float capacity = 0, rate = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (g->members[i].state != TS_SWIM_ALIVE ||
            (g->n_bans && ts_gossip__expelled(g, g->members[i].claim.id)))
            continue;
        live++;
        const advert_t *a = ts_gossip__advert_find(g, g->members[i].claim.id);
        if (!a || ts_gossip_banned(g, a->id))
            continue;
        capacity += a->body->capacity->items_per_s;
        if (i == 0 && s->resp.load && s->resp.load->has_requests_per_s)
            rate += s->resp.load->requests_per_s; /* ours, fresher than our signed advert's */
        else if (a->body->load->has_requests_per_s)
            rate += a->body->load->requests_per_s;
        uint32_t k = count_index(s, n_counts, a->body->partition_id.data, a->body->cluster);
        if (k == n_counts)
            s->counts[n_counts++] =
                (cluster_count_t){a->body->partition_id.data, a->body->cluster, 0, 0};
        if (ts_advert_trained(a->body))
            s->counts[k].count++;
        else
            s->counts[k].training++;
    }
    s->n_counts = n_counts;
    uint32_t n_clusters = 0; /* those with a trained expert; the rest are uncovered */
    for (uint32_t k = 0; k < n_counts; k++) {
        if (!s->counts[k].count)
            continue;
        Tessera__ClusterExperts *c = &s->clusters[n_clusters];
        tessera__cluster_experts__init(c);
        c->has_partition_id = c->has_cluster = c->has_live_experts = 1;
        c->partition_id.data = (uint8_t *)s->counts[k].partition;
        c->partition_id.len = TS_FRAME_ID_BYTES;
        c->cluster = s->counts[k].cluster;
        c->live_experts = s->counts[k].count;
        if (s->counts[k].training) {
            c->has_training_experts = 1;
            c->training_experts = s->counts[k].training;
        }
        s->cluster_ptrs[n_clusters++] = c;
    }
    uint32_t n_refs = each_uncovered(g, s, n_counts, NULL);
    s->refs = calloc(n_refs + 1, sizeof *s->refs);
    s->ref_ptrs = calloc(n_refs + 1, sizeof *s->ref_ptrs);
    if (!s->refs || !s->ref_ptrs)
        return TS_ENOMEM;
    each_uncovered(g, s, n_counts, put_uncovered);
    Tessera__Aggregates *agg = &s->agg;
    tessera__aggregates__init(agg);
    agg->n_clusters = n_clusters;
    agg->clusters = s->cluster_ptrs;
    agg->n_uncovered = n_refs;
    agg->uncovered = s->ref_ptrs;
    agg->has_total_capacity = agg->has_request_rate = agg->has_live_members = 1;
    agg->total_capacity = capacity;
    agg->request_rate = rate;
    agg->live_members = live;
    s->resp.aggregates = agg;
    return TS_OK;
}

/* Builds the status answer into s (pointing into g's tables: use it before anything changes). */
static int status_build(ts_gossip_t *g, const Tessera__StatusRequest *req, status_scratch_t *s) {
    memset(s, 0, sizeof *s);
    uint32_t n = g->swim ? ts_swim_state_export(g->swim, g->members, g->cfg.swim.max_members) : 0;
    s->members = calloc(n + 1, sizeof *s->members);
    s->member_ptrs = calloc(n + 1, sizeof *s->member_ptrs);
    s->addrs = calloc(n + 1, sizeof *s->addrs);
    s->adverts = calloc(g->n_adverts + 1, sizeof *s->adverts);
    s->counts = calloc(n + 1, sizeof *s->counts);
    s->clusters = calloc(n + 1, sizeof *s->clusters);
    s->cluster_ptrs = calloc(n + 1, sizeof *s->cluster_ptrs);
    if (!s->members || !s->member_ptrs || !s->addrs || !s->adverts || !s->counts || !s->clusters ||
        !s->cluster_ptrs) {
        status_scratch_free(s);
        return TS_ENOMEM;
    }
    tessera__status_response__init(&s->resp);
    s->resp.has_node_id = 1;
    s->resp.node_id.data = g->self.b;
    s->resp.node_id.len = TS_NODE_ID_BYTES;
    if (g->on_load) {
        tessera__load__init(&s->load);
        g->on_load(g->on_load_arg, &s->load);
        s->resp.load = &s->load;
    }
    if (!req || req->include_members)
        status_members(g, s, n);
    if (!req || req->include_adverts) {
        size_t k = 0; /* a banned node's advert is not passed on */
        for (uint32_t i = 0; i < g->n_adverts; i++)
            if (!ts_gossip_banned(g, g->adverts[i].id))
                s->adverts[k++] = g->adverts[i].msg;
        s->resp.n_adverts = k;
        s->resp.adverts = s->adverts;
    }
    if (g->n_bans) {
        s->bans = calloc(g->n_bans, sizeof *s->bans);
        s->ban_ptrs = calloc(g->n_bans, sizeof *s->ban_ptrs);
        if (!s->bans || !s->ban_ptrs) {
            status_scratch_free(s);
            return TS_ENOMEM;
        }
        for (uint32_t i = 0; i < g->n_bans; i++) {
            const ts_gossip_ban_info_t *b = &g->bans[i];
            Tessera__Ban *o = &s->bans[i];
            tessera__ban__init(o);
            o->has_node_id = o->has_expert_id = o->has_since_ms = o->has_expelled = 1;
            o->node_id.data = (uint8_t *)b->id;
            o->node_id.len = sizeof b->id;
            o->expert_id.data = (uint8_t *)b->expert;
            o->expert_id.len = sizeof b->expert;
            o->reason = (char *)b->reason;
            o->since_ms = b->since_ms;
            o->expelled = b->expelled != 0;
            s->ban_ptrs[i] = o;
        }
        s->resp.n_bans = g->n_bans;
        s->resp.bans = s->ban_ptrs;
    }
    if (g->health[0])
        s->resp.health = g->health;
    if (g->metrics_url[0])
        s->resp.metrics = g->metrics_url;
    if (g->training.active) {
        const ts_gossip_training_t *t = &g->training;
        Tessera__TrainingStatus *tr = &s->training;
        tessera__training_status__init(tr);
        tr->has_step = tr->has_steps = tr->has_steps_per_s = 1;
        tr->step = t->step;
        tr->steps = t->steps;
        tr->steps_per_s = t->steps_per_s;
        if (isfinite(t->loss)) {
            tr->has_loss = 1;
            tr->loss = t->loss;
        }
        tr->has_partition_id = tr->has_cluster = tr->has_served = 1;
        tr->partition_id.data = (uint8_t *)t->partition;
        tr->partition_id.len = sizeof t->partition;
        tr->cluster = t->cluster;
        tr->served = t->served != 0;
        if (isfinite(t->heldout_loss)) {
            tr->has_heldout_loss = tr->has_heldout_step = 1;
            tr->heldout_loss = t->heldout_loss;
            tr->heldout_step = t->heldout_step;
        }
        s->resp.training = tr;
    }
    int rc = status_aggregates(g, s, n);
    if (rc)
        status_scratch_free(s);
    return rc;
}

int ts_gossip_status(ts_gossip_t *g, const Tessera__StatusRequest *req,
                     Tessera__StatusResponse **out) {
    if (!g || !out)
        return TS_EINVAL;
    *out = NULL;
    status_scratch_t s;
    int rc = status_build(g, req, &s);
    if (rc)
        return rc;
    /* packed and unpacked again, the answer owns all its memory and frees in one call */
    size_t n = protobuf_c_message_get_packed_size(&s.resp.base);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf) {
        protobuf_c_message_pack(&s.resp.base, buf);
        *out = tessera__status_response__unpack(NULL, n, buf);
    }
    free(buf);
    status_scratch_free(&s);
    return *out ? TS_OK : TS_ENOMEM;
}

void ts_gossip_status_free(Tessera__StatusResponse *resp) {
    if (resp)
        tessera__status_response__free_unpacked(resp, NULL);
}

void ts_gossip__serve_status(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    ts_gossip_t *g = arg;
    status_scratch_t s;
    if (status_build(g, env->status_request, &s) != TS_OK) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    Tessera__Envelope out = TESSERA__ENVELOPE__INIT;
    out.body_case = TESSERA__ENVELOPE__BODY_STATUS_RESPONSE;
    out.status_response = &s.resp;
    ts_rpc_reply(req, &out);
    status_scratch_free(&s);
}
