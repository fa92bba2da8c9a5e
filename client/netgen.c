/*
 * netgen.c — generation with the network's experts (netgen.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "client/netgen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/error.h"
#include "base/str.h"
#include "model/latents.h"
#include "model/objective.h"
#include "net/fetch.h"
#include "net/frame.h"
#include "net/gossip.h"
#include "store/vouch.h"
#include "store/weights.h"

#define STATUS_TIMEOUT_MS 10000
#define FETCH_TIMEOUT_MS 30000

/* One verified advert of a live member. */
typedef struct offer {
    Tessera__AdvertBody *body; /* decoded; freed with ts_frame_free */
    const char *addr;          /* the member's, from the same status answer */
    char partition[65];
    ts_node_id_t node; /* whose advert: the node that must answer at addr */
    int ready;         /* past the readiness bar (mark_ready) */
    float reference;   /* the finished experts' held-out loss it is compared with; NaN: none */
} offer_t;

/* The live members' addresses by node id. */
static const char *alive_addr(const Tessera__StatusResponse *r, const ProtobufCBinaryData *id) {
    for (size_t i = 0; i < r->n_members; i++) {
        const Tessera__MemberState *m = r->members[i];
        if (m->node_id.len == id->len && memcmp(m->node_id.data, id->data, id->len) == 0)
            return m->status == TESSERA__MEMBER_STATUS__MEMBER_ALIVE && m->addr && *m->addr
                       ? m->addr
                       : NULL;
    }
    return NULL;
}

/* The adverts of live members whose signature verifies, decoded. */
static int collect_offers(const Tessera__StatusResponse *r, offer_t **out, int *n, char *err,
                          size_t errlen) {
    *out = calloc(r->n_adverts ? r->n_adverts : 1, sizeof **out);
    *n = 0;
    if (!*out) {
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    for (size_t i = 0; i < r->n_adverts; i++) {
        const Tessera__Advert *a = r->adverts[i];
        const char *addr = alive_addr(r, &a->node_id);
        Tessera__AdvertBody *b = NULL;
        if (!addr || ts_gossip_advert_check(a) != TS_OK ||
            ts_frame_decode_advert_body(&a->body, TS_FRAME_CHECK_FINITE, &b, NULL, 0) != TS_OK)
            continue;
        offer_t *o = &(*out)[(*n)++];
        o->body = b;
        o->addr = addr;
        memcpy(o->node.b, a->node_id.data, sizeof o->node.b); /* 32 bytes: the check verified */
        ts_hash_t pid;
        memcpy(pid.b, b->partition_id.data, TS_HASH_BYTES);
        ts_hash_hex(&pid, o->partition);
    }
    return TS_OK;
}

static int same_config(const Tessera__ModelConfig *a, const Tessera__ModelConfig *b) {
    return a && b && a->input_size == b->input_size && a->patch_size == b->patch_size &&
           a->in_channels == b->in_channels && a->hidden_size == b->hidden_size &&
           a->depth == b->depth && a->num_heads == b->num_heads &&
           a->num_classes == b->num_classes && a->mlp_ratio == b->mlp_ratio &&
           a->freq_dim == b->freq_dim;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The readiness bar (architecture.md "Readiness"): an offer is ready when its expert is trained
 * to the end, or has done min_trained of its steps, or — ready_loss > 0 — its weights' held-out
 * loss is at most ready_loss times the reference: the median held-out loss of the finished
 * experts of the same partition and model config (a value each advert declares from its weights'
 * metadata). Without a reference the loss bar admits nothing. */
static int mark_ready(offer_t *of, int n, double min_trained, double ready_loss) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return TS_ENOMEM;
    for (int i = 0; i < n; i++) {
        const Tessera__AdvertBody *b = of[i].body;
        int m = 0;
        for (int j = 0; j < n; j++) {
            const Tessera__AdvertBody *c = of[j].body;
            if (strcmp(of[j].partition, of[i].partition) == 0 && ts_advert_trained(c) &&
                c->has_heldout_loss && same_config(c->model, b->model))
                v[m++] = c->heldout_loss;
        }
        qsort(v, (size_t)m, sizeof *v, cmp_float);
        of[i].reference = m == 0 ? NAN : m % 2 ? v[m / 2] : 0.5f * (v[m / 2 - 1] + v[m / 2]);
        of[i].ready = ts_advert_trained(b) ||
                      (double)b->training->step >= min_trained * (double)b->training->steps ||
                      (ready_loss > 0.0 && b->has_heldout_loss && isfinite(of[i].reference) &&
                       (double)b->heldout_loss <= ready_loss * (double)of[i].reference);
    }
    free(v);
    return TS_OK;
}

/* The partition to use: the one named (a prefix), else the one whose adverts cover the most
 * clusters (the lowest id on a tie). */
static int choose_partition(const offer_t *of, int n, const char *want, char out[65], char *err,
                            size_t errlen) {
    int best = -1, best_cover = 0;
    for (int i = 0; i < n; i++) {
        if (want && strncmp(of[i].partition, want, strlen(want)) != 0)
            continue;
        uint32_t K = of[i].body->num_clusters;
        int cover = 0;
        for (uint32_t k = 0; k < K; k++)
            for (int j = 0; j < n; j++)
                if (strcmp(of[j].partition, of[i].partition) == 0 && of[j].body->cluster == k &&
                    of[j].ready) { /* held-back experts cover nothing */
                    cover++;
                    break;
                }
        if (cover > best_cover ||
            (cover == best_cover && best >= 0 && strcmp(of[i].partition, of[best].partition) < 0)) {
            best = i;
            best_cover = cover;
        }
    }
    if (best < 0) {
        ts_set_err(err, errlen,
                   want ? "no live expert of partition %s in the network"
                        : "no live expert in the network (see `tessera status`)",
                   want ? want : "");
        return TS_ENOTFOUND;
    }
    memcpy(out, of[best].partition, 65);
    return TS_OK;
}

/* The latent space of an offer as hex ("" for pixels). */
static void space_of(const offer_t *o, char hex[65]) {
    hex[0] = '\0';
    if (o->body->has_latent_space)
        ts_hex(o->body->latent_space.data, TS_HASH_BYTES, hex);
}

/* The experts of the chosen partition must share one latent space (one VAE made their data, or
 * none): a mix cannot be combined, and no VAE decodes it. */
static int same_latent_space(ts_netgen_t *g, const offer_t *of, int n, const offer_t *first,
                             char *err, size_t errlen) {
    space_of(first, g->latent_space);
    for (int i = 0; i < n; i++) {
        char hex[65], a[32], b[32];
        if (strcmp(of[i].partition, g->partition_id) != 0)
            continue;
        space_of(&of[i], hex);
        if (strcmp(hex, g->latent_space) != 0) {
            ts_set_err(err, errlen,
                       "the experts of partition %.16s… do not share a latent space: %s's is %s, "
                       "%s's %s; they cannot be mixed",
                       g->partition_id, first->addr,
                       ts_latent_space_name(g->latent_space, a, sizeof a), of[i].addr,
                       ts_latent_space_name(hex, b, sizeof b));
            return TS_ECORRUPT;
        }
    }
    return TS_OK;
}

static void config_of(const Tessera__ModelConfig *m, ts_dit_config_t *c) {
    *c = (ts_dit_config_t){.input_size = (int)m->input_size,
                           .patch_size = (int)m->patch_size,
                           .in_channels = (int)m->in_channels,
                           .hidden_size = (int)m->hidden_size,
                           .depth = (int)m->depth,
                           .num_heads = (int)m->num_heads,
                           .num_classes = (int)m->num_classes,
                           .mlp_ratio = (int)m->mlp_ratio,
                           .freq_dim = (int)m->freq_dim};
}

/* Fetches file hash (named what for messages) into the store and exports it as path: from the
 * store when it is there, else from the entry node, else from each live node the adverts say
 * holds it (holders, n_holders addresses). */
static int fetch_artifact(ts_netgen_t *g, const uint8_t *hash, const char *what,
                          const char *const *holders, int n_holders, const char *path, int quiet,
                          char *err, size_t errlen) {
    ts_hash_t h;
    memcpy(h.b, hash, TS_HASH_BYTES);
    char sub[512] = "", first[512] = "";
    ts_fetch_stats_t st = {0};
    const char *from = g->nc.addr;
    int rc = ts_fetch_file(&g->nc, g->nc.peer, g->store, &h, FETCH_TIMEOUT_MS, NULL, NULL, &st,
                           first, sizeof first);
    for (int i = 0; rc != TS_OK && i < n_holders; i++) {
        ts_rpc_peer_t *p = NULL;
        if (strcmp(holders[i], g->nc.addr) == 0 ||
            ts_rpc_peer_get(g->nc.rpc, holders[i], &p, NULL, 0) != TS_OK)
            continue;
        from = holders[i];
        rc = ts_fetch_file(&g->nc, p, g->store, &h, FETCH_TIMEOUT_MS, NULL, NULL, &st, sub,
                           sizeof sub);
    }
    if (rc == TS_OK)
        rc = ts_weights_export(g->store, &h, path, sub, sizeof sub);
    if (rc != TS_OK) {
        char hex[65];
        ts_hash_hex(&h, hex);
        ts_set_err(err, errlen,
                   "cannot get the %s (%.16s…) from the network: %s (the entry node); %d other "
                   "holder%s tried%s%s",
                   what, hex, first, n_holders, n_holders == 1 ? "" : "s", *sub ? ": " : "", sub);
        return rc;
    }
    if (!quiet && st.chunks_fetched)
        fprintf(stderr, "fetched the %s from %s: %.1f KiB in %.2f s\n", what, from,
                st.bytes_fetched / 1024.0, st.seconds);
    return TS_OK;
}

/* The weights in the store trained for (partition, cluster): files whose metadata names both
 * (what `tessera train --partition` writes and `tessera pull` keeps), collected by the listing,
 * then chosen by stored_best. */
#define STORED_MAX 16 /* copies of one cluster's weights considered */

typedef struct stored_query {
    const char *partition;
    int cluster;
    int n;
    int64_t used[STORED_MAX];
    ts_hash_t hash[STORED_MAX];
    ts_objective_t objective[STORED_MAX];
    uint8_t learn_sigma[STORED_MAX];
} stored_query_t;

static int stored_match(void *ctx, const ts_weights_info_t *info) {
    stored_query_t *q = ctx;
    const char *p = ts_weights_info_meta(info, "partition_id");
    const char *c = ts_weights_info_meta(info, "cluster");
    const char *obj = ts_weights_info_meta(info, "objective");
    char desc[64], *end = NULL;
    ts_objective_t o = TS_OBJ_VELOCITY;
    if (!p || !c || strcmp(p, q->partition) != 0 || (obj && ts_objective_parse(obj, &o) != TS_OK))
        return TS_OK;
    long k = strtol(c, &end, 10);
    ts_weights_describe(info, desc, sizeof desc);
    if (end == c || *end || k != q->cluster || strcmp(desc, "-") == 0)
        return TS_OK;
    if (q->n < STORED_MAX) {
        q->used[q->n] = info->last_used;
        q->objective[q->n] = o;
        const char *ls = ts_weights_info_meta(info, "learn_sigma");
        q->learn_sigma[q->n] = ls && strcmp(ls, "true") == 0;
        q->hash[q->n++] = info->hash;
    }
    return TS_OK;
}

/* The most recently used of the matches whose every chunk is in the store (a pull that was
 * cut off leaves an incomplete copy). 1 and *out when there is one. */
static int stored_best(ts_store_t *store, const stored_query_t *q, ts_hash_t *out,
                       ts_objective_t *objective, uint8_t *learn_sigma) {
    int best = -1;
    for (int i = 0; i < q->n; i++)
        if ((best < 0 || q->used[i] > q->used[best]) &&
            ts_weights_bad_chunks(store, &q->hash[i], NULL, NULL) == 0)
            best = i;
    if (best >= 0)
        *out = q->hash[best], *objective = q->objective[best], *learn_sigma = q->learn_sigma[best];
    return best >= 0;
}

/* Fills experts[k] from the offers of the chosen partition that are ready: the weights most
 * replicas serve, and those replicas. The others are held back (g->held). */
static int build_experts(ts_netgen_t *g, const offer_t *of, int n, char *err, size_t errlen) {
    g->experts = calloc((size_t)g->K, sizeof *g->experts);
    g->held = calloc((size_t)g->K, sizeof *g->held);
    g->objective = calloc((size_t)g->K, sizeof *g->objective); /* velocity */
    g->learn_sigma = calloc((size_t)g->K, sizeof *g->learn_sigma);
    if (!g->experts || !g->held || !g->objective || !g->learn_sigma) {
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        const Tessera__AdvertBody *b = of[i].body;
        if (strcmp(of[i].partition, g->partition_id) != 0 || (int)b->cluster >= g->K || of[i].ready)
            continue;
        ts_netgen_held_t *h = &g->held[b->cluster];
        if (!h->n || b->training->step > h->step) {
            h->step = b->training->step;
            h->steps = b->training->steps;
            h->heldout = b->has_heldout_loss ? b->heldout_loss : NAN;
            h->reference = of[i].reference;
            snprintf(h->addr, sizeof h->addr, "%s", of[i].addr);
        }
        h->n++;
        g->n_held++;
    }
    for (int k = 0; k < g->K; k++) {
        ts_remote_expert_t *ex = &g->experts[k];
        int best = -1, best_count = 0;
        for (int i = 0; i < n; i++) {
            if (strcmp(of[i].partition, g->partition_id) != 0 || (int)of[i].body->cluster != k ||
                !of[i].ready)
                continue;
            int count = 0;
            for (int j = 0; j < n; j++)
                count +=
                    strcmp(of[j].partition, g->partition_id) == 0 &&
                    (int)of[j].body->cluster == k && of[j].ready &&
                    memcmp(of[j].body->weights_hash.data, of[i].body->weights_hash.data, 32) == 0;
            if (count > best_count) {
                best = i;
                best_count = count;
            }
        }
        if (best < 0) { /* no live replica: weights for this cluster in the store, if any */
            stored_query_t q = {.partition = g->partition_id, .cluster = k};
            ts_hash_t h;
            (void)ts_weights_list(g->store, stored_match, &q);
            if (stored_best(g->store, &q, &h, &g->objective[k], &g->learn_sigma[k]))
                memcpy(ex->weights_hash, h.b, 32);
            continue;
        }
        memcpy(ex->weights_hash, of[best].body->weights_hash.data, 32);
        /* the weights say what they predict; the frame check admitted only objectives there are */
        (void)ts_objective_from_wire((int)of[best].body->objective, &g->objective[k]);
        /* the variance is asked for only when every ready replica of these weights advertises it
         * (an older tesserad serving learned-σ weights does not, and would answer without it) */
        g->learn_sigma[k] = 1;
        for (int j = 0; j < n; j++)
            if (strcmp(of[j].partition, g->partition_id) == 0 && (int)of[j].body->cluster == k &&
                of[j].ready && memcmp(of[j].body->weights_hash.data, ex->weights_hash, 32) == 0 &&
                !(of[j].body->model->has_learn_sigma && of[j].body->model->learn_sigma))
                g->learn_sigma[k] = 0;
        for (int j = 0; j < n && ex->n_rep < TS_REMOTE_MAX_REPLICAS; j++) {
            const Tessera__AdvertBody *b = of[j].body;
            if (strcmp(of[j].partition, g->partition_id) != 0 || (int)b->cluster != k ||
                !of[j].ready || memcmp(b->weights_hash.data, ex->weights_hash, 32) != 0)
                continue;
            ts_replica_t *p = &ex->rep[ex->n_rep++];
            snprintf(p->addr, sizeof p->addr, "%s", of[j].addr);
            p->node = of[j].node;
            p->has_node = 1;
            p->queue_depth = b->load ? b->load->queue_depth : 0;
            p->item_latency_us = b->load ? b->load->item_latency_us : 0;
            p->max_samples = b->capacity ? b->capacity->max_batch : 0;
            p->max_rows = b->capacity && b->capacity->has_max_rows ? b->capacity->max_rows : 0;
        }
        g->n_replicas += ex->n_rep;
    }
    return TS_OK;
}

/* Replicas an earlier run vouched for, within ttl_s: they start vouched for, on answers of the
 * device class and precision they were vouched for on (client/remote.h). */
static void recall_vouches(ts_netgen_t *g, int64_t ttl_s) {
    g->vouch_ttl_s = ttl_s;
    g->n_remembered = 0;
    int64_t now = (int64_t)time(NULL);
    for (int k = 0; ttl_s > 0 && k < g->K; k++)
        for (int i = 0; i < g->experts[k].n_rep; i++) {
            ts_replica_t *p = &g->experts[k].rep[i];
            ts_vouch_t v;
            if (!p->has_node || ts_vouch_get(g->store, p->node.b, g->experts[k].weights_hash, ttl_s,
                                             now, &v) != TS_OK)
                continue;
            p->vouched = p->remembered = 1;
            snprintf(p->vouch_class, sizeof p->vouch_class, "%s", v.device_class);
            p->vouch_precision = v.precision;
            g->n_remembered++;
        }
}

/* What this run learnt, into the store: each replica whose answer agreed with another's is
 * vouched for from now; every vouch of a node caught lying is forgotten. A failure to write
 * costs the next run its first checks only: it is not an error. */
static void keep_vouches(ts_netgen_t *g) {
    int64_t now = (int64_t)time(NULL);
    for (int k = 0; g->store && k < g->K; k++)
        for (int i = 0; i < g->experts[k].n_rep; i++) {
            const ts_replica_t *p = &g->experts[k].rep[i];
            if (!p->has_node)
                continue;
            if (p->lies) {
                (void)ts_vouch_forget(g->store, p->node.b, NULL);
            } else if (g->vouch_ttl_s > 0 && p->agreed && p->precision && p->device_class[0]) {
                ts_vouch_t v = {.precision = p->precision, .when = now};
                memcpy(v.node, p->node.b, sizeof v.node);
                memcpy(v.weights, g->experts[k].weights_hash, sizeof v.weights);
                snprintf(v.device_class, sizeof v.device_class, "%s", p->device_class);
                (void)ts_vouch_put(g->store, &v);
            }
        }
}

/* The experts whose weights are in the store, opened as the fallback. */
static void open_cached(ts_netgen_t *g, ts_engine_t *e, int max_batch) {
    g->cached = calloc((size_t)g->K, sizeof *g->cached);
    g->has_cached = calloc((size_t)g->K, sizeof *g->has_cached);
    if (!g->cached || !g->has_cached)
        return;
    for (int k = 0; k < g->K; k++) {
        ts_remote_expert_t *ex = &g->experts[k];
        ts_hash_t h;
        memcpy(h.b, ex->weights_hash, 32);
        static const uint8_t zero[32];
        if (memcmp(h.b, zero, 32) == 0 || ts_weights_bad_chunks(g->store, &h, NULL, NULL) != 0)
            continue;
        char err[256];
        if (ts_weights_open_dit(g->store, &h, e, max_batch, 0, &g->cached[k], err, sizeof err) ==
            TS_OK) {
            g->has_cached[k] = 1;
            ex->local = &g->cached[k];
            g->n_cached++;
        }
    }
}

/* The partition (required) and the router (when o->load_router asks for it) into the cache
 * folder, from whichever live node holds them. */
static int fetch_artifacts(ts_netgen_t *g, const ts_netgen_opts_t *o, const offer_t *of, int n,
                           const offer_t *first, char *err, size_t errlen) {
    snprintf(g->cache_dir, sizeof g->cache_dir, "%s/generate-%.16s", ts_store_dir(g->store),
             g->partition_id);
    mkdir(g->cache_dir, 0700);
    const char **holders = calloc((size_t)(n ? n : 1), sizeof *holders);
    if (!holders) {
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    int nh = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(of[i].partition, g->partition_id) == 0)
            holders[nh++] = of[i].addr;
    char path[1200];
    snprintf(path, sizeof path, "%s/partition.safetensors", g->cache_dir);
    int rc = fetch_artifact(g, first->body->partition_id.data, "partition", holders, nh, path,
                            o->quiet, err, errlen);
    snprintf(path, sizeof path, "%s/router.safetensors", g->cache_dir);
    remove(path);
    const offer_t *with_router = NULL;
    for (int i = 0; i < n && !with_router; i++)
        if (strcmp(of[i].partition, g->partition_id) == 0 && of[i].body->has_router_hash &&
            of[i].body->router_hash.len == TS_HASH_BYTES)
            with_router = &of[i];
    if (rc == TS_OK && o->load_router && with_router) {
        nh = 0;
        for (int i = 0; i < n; i++)
            if (of[i].body->has_router_hash && of[i].body->router_hash.len == TS_HASH_BYTES &&
                memcmp(of[i].body->router_hash.data, with_router->body->router_hash.data,
                       TS_HASH_BYTES) == 0)
                holders[nh++] = of[i].addr;
        char sub[1024] = "";
        rc = fetch_artifact(g, with_router->body->router_hash.data, "router", holders, nh, path,
                            o->quiet, sub, sizeof sub);
        if (rc != TS_OK && o->load_router == TS_NETGEN_ROUTER_OPTIONAL) {
            fprintf(stderr, "warning: %s; going on without a router\n", sub);
            remove(path);
            rc = TS_OK;
        } else if (rc != TS_OK) {
            ts_set_err(err, errlen, "%s", sub);
        }
    }
    free(holders);
    return rc;
}

/* Clusters with no live replica and no weights in the store: routed around (a warning), or
 * refused with --require-coverage. */
static int mark_uncovered(ts_netgen_t *g, const ts_netgen_opts_t *o, const char *prog, char *err,
                          size_t errlen) {
    g->absent = calloc((size_t)g->K, 1);
    if (!g->absent) {
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    char list[512] = "";
    size_t used = 0;
    for (int k = 0; k < g->K; k++)
        if (g->experts[k].n_rep == 0 && !g->experts[k].local) {
            g->absent[k] = 1;
            g->experts[k].absent = 1;
            g->n_absent++;
            if (used < sizeof list)
                used +=
                    (size_t)snprintf(list + used, sizeof list - used, "%s%d", used ? ", " : "", k);
        }
    for (int k = 0; k < g->K; k++) /* a cluster whose only experts are held back, said apart */
        if (g->held[k].n && !o->quiet) {
            char why[320];
            ts_netgen_held_text(g, k, why, sizeof why);
            fprintf(stderr, "%s: cluster %d: %s%s\n", prog, k, why,
                    g->absent[k] ? "" : "; its other replicas or cached weights serve it");
        }
    if (g->n_absent == g->K) {
        ts_set_err(err, errlen,
                   "no expert of partition %.16s… can answer: none is live and none "
                   "is in the store",
                   g->partition_id);
        return TS_ENOTFOUND;
    }
    if (g->n_absent && o->require_coverage) {
        ts_set_err(err, errlen,
                   "cluster%s %s of partition %.16s… ha%s no live expert in the "
                   "network and no cached weights (--require-coverage; `tessera "
                   "pull` them while a replica is up)",
                   g->n_absent > 1 ? "s" : "", list, g->partition_id, g->n_absent > 1 ? "ve" : "s");
        return TS_ENOTFOUND;
    }
    if (g->n_absent && !o->quiet)
        fprintf(stderr,
                "%s: WARNING: cluster%s %s of partition %.16s… ha%s no usable live expert and no "
                "cached weights: routed around from the first step (--require-coverage "
                "refuses instead)\n",
                prog, g->n_absent > 1 ? "s" : "", list, g->partition_id,
                g->n_absent > 1 ? "ve" : "s");
    return TS_OK;
}

int ts_netgen_open(ts_netgen_t *g, const ts_netgen_opts_t *o, ts_engine_t *e, int chunk, int pairs,
                   ts_local_t *l, const char *prog, char *err, size_t errlen) {
    memset(g, 0, sizeof *g);
    char dir[1024];
    ts_store_opts_t so = {.dir = o->data_dir};
    if (!o->data_dir && ts_store_default_dir(dir, sizeof dir) == TS_OK)
        so.dir = dir;
    int rc = ts_store_open(&g->store, &so, err, errlen);
    if (rc != TS_OK)
        return rc;
    int orc =
        ts_netclient_open(&g->nc, prog, o->peer, o->identity, o->network_key, STATUS_TIMEOUT_MS);
    if (orc != 0) { /* it said why: a bad address (a usage error) or a key that does not load */
        g->said = 1;
        g->usage = orc == 2;
        ts_set_err(err, errlen, "%s", "");
        return orc == 2 ? TS_EINVAL : TS_EIO;
    }
    g->nc_open = 1;
    /* a peer that refuses the connection fails the first call at once, as `ping` does: there is
     * nobody else to ask yet */
    ts_rpc_set_fail_fast(g->nc.rpc, 1);
    Tessera__StatusRequest sr = TESSERA__STATUS_REQUEST__INIT;
    Tessera__Envelope req = TESSERA__ENVELOPE__INIT, *resp = NULL;
    req.body_case = TESSERA__ENVELOPE__BODY_STATUS_REQUEST;
    req.status_request = &sr;
    char sub[512] = "";
    rc = ts_netclient_call(&g->nc, g->nc.peer, &req, STATUS_TIMEOUT_MS, &resp, sub, sizeof sub);
    if (rc != TS_OK) { /* the reason names the address already, or it is added */
        if (strstr(sub, o->peer))
            ts_set_err(err, errlen, "%s", sub);
        else
            ts_set_err(err, errlen, "%s does not answer: %s", o->peer, sub);
        return rc;
    }
    /* from here on, too, a node that refuses a connection fails its calls at once: the client
     * has other replicas, other holders, cached weights, or the route around it */
    offer_t *of = NULL;
    int n = 0;
    rc = collect_offers(resp->status_response, &of, &n, err, errlen);
    if (rc == TS_OK && (rc = mark_ready(of, n, o->min_trained, o->ready_loss)) != TS_OK)
        ts_set_err(err, errlen, "out of memory");
    if (rc == TS_OK)
        rc = choose_partition(of, n, o->partition, g->partition_id, err, errlen);
    const offer_t *first = NULL;
    for (int i = 0; rc == TS_OK && i < n && !first; i++)
        if (strcmp(of[i].partition, g->partition_id) == 0)
            first = &of[i];
    if (rc == TS_OK) {
        g->K = (int)first->body->num_clusters;
        config_of(first->body->model, &g->cfg);
        rc = same_latent_space(g, of, n, first, err, errlen);
    }
    if (rc == TS_OK) {
        for (int i = 0; i < n; i++)
            if (strcmp(of[i].partition, g->partition_id) == 0 &&
                (of[i].body->num_clusters != (uint32_t)g->K ||
                 of[i].body->model->input_size != (uint32_t)g->cfg.input_size ||
                 of[i].body->model->in_channels != (uint32_t)g->cfg.in_channels ||
                 of[i].body->model->num_classes != (uint32_t)g->cfg.num_classes)) {
                ts_set_err(err, errlen,
                           "the experts of partition %.16s… disagree on K or on "
                           "the image config",
                           g->partition_id);
                rc = TS_ECORRUPT;
                break;
            }
    }
    if (rc == TS_OK && o->cls) { /* a class the experts do not have: before fetching anything */
        int label;
        if (ts_local_parse_class(o->cls, g->cfg.num_classes, &label, err, errlen) != TS_OK) {
            g->usage = 1;
            rc = TS_EINVAL;
        }
    }
    if (rc == TS_OK)
        rc = build_experts(g, of, n, err, errlen);
    /* the artifacts, from the network into the store and a cache folder */
    if (rc == TS_OK)
        rc = fetch_artifacts(g, o, of, n, first, err, errlen);
    for (int i = 0; i < n; i++)
        ts_frame_free(of[i].body);
    free(of);
    ts_frame_free(resp);
    if (rc != TS_OK)
        return rc;
    open_cached(g, e, pairs * chunk);
    rc = mark_uncovered(g, o, prog, err, errlen);
    if (rc != TS_OK)
        return rc;
    recall_vouches(g, o->vouch_ttl_s);
    rc = ts_remote_init(&g->remote, &g->nc.loop, g->nc.rpc, g->experts, g->K, g->cfg.in_channels,
                        g->cfg.input_size, &o->remote, o->trace, err, errlen);
    g->remote_init = rc == TS_OK;
    if (rc == TS_OK)
        rc = ts_local_open_remote(l, g->cache_dir, g->K, &g->cfg, g->objective, g->learn_sigma, e,
                                  chunk, o->load_router, ts_remote_eval, &g->remote, err, errlen);
    if (rc == TS_OK) {
        l->absent = g->n_absent ? g->absent : NULL;
        memcpy(l->ex.latent_space, g->latent_space, sizeof l->ex.latent_space);
    }
    if (rc == TS_OK && !o->quiet)
        fprintf(stderr,
                "network via %s: partition %.16s…, %d experts, %d replicas (%d vouched for "
                "by an earlier run), %d cached locally, %d uncovered, %d still training (not "
                "used)\n",
                o->peer, g->partition_id, g->K, g->n_replicas, g->n_remembered, g->n_cached,
                g->n_absent, g->n_held);
    return rc;
}

void ts_netgen_held_text(const ts_netgen_t *g, int k, char *out, size_t len) {
    const ts_netgen_held_t *h = &g->held[k];
    char loss[160] = "";
    if (isfinite(h->heldout) && isfinite(h->reference))
        snprintf(loss, sizeof loss,
                 ", held-out loss %.4f against %.4f for the finished experts (%.2f×)",
                 (double)h->heldout, (double)h->reference,
                 h->reference > 0.0f ? (double)(h->heldout / h->reference) : 0.0);
    else if (isfinite(h->heldout))
        snprintf(loss, sizeof loss, ", held-out loss %.4f (no finished expert to compare with)",
                 (double)h->heldout);
    snprintf(out, len,
             "%d expert%s still training, not used (the furthest, at %s: step %llu of %llu, "
             "%.1f%%%s; --min-trained 0 would use it)",
             h->n, h->n == 1 ? "" : "s", h->addr, (unsigned long long)h->step,
             (unsigned long long)h->steps,
             h->steps ? 100.0 * (double)h->step / (double)h->steps : 0.0, loss);
}

void ts_netgen_close(ts_netgen_t *g) {
    if (g->remote_init) {
        keep_vouches(g);
        ts_remote_free(&g->remote);
    }
    if (g->nc_open)
        ts_netclient_close(&g->nc);
    for (int k = 0; g->has_cached && k < g->K; k++)
        if (g->has_cached[k])
            ts_dit_free(&g->cached[k]);
    free(g->cached);
    free(g->has_cached);
    free(g->absent);
    free(g->held);
    free(g->objective);
    free(g->learn_sigma);
    free(g->experts);
    ts_store_close(g->store);
    memset(g, 0, sizeof *g);
}
