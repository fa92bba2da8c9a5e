/* auto.c — an auto node chooses, fetches or trains, and hosts its cluster (auto.h). */
#define _POSIX_C_SOURCE 200809L

#include "daemon/auto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/file.h"
#include "base/str.h"
#include "daemon/assign.h"
#include "daemon/fetcher.h"
#include "daemon/log.h"
#include "model/partition.h"
#include "net/status_json.h"
#include "store/weights.h"

struct ts_auto {
    uv_timer_t timer;
    const ts_daemon_config_t *cfg;
    ts_gossip_t *gossip;
    ts_host_t *host;
    ts_store_t *store;
    uint8_t self[TS_ASSIGN_ID_BYTES];
    ts_fetcher_t *fetch; /* the one fetch in flight, or NULL */
    int fetch_kind;      /* FETCH_PARTITION or FETCH_WEIGHTS */
    int fetch_cluster;   /* FETCH_WEIGHTS: the cluster it is for */
    ts_hash_t fetching;  /* the file it fetches */
    ts_hash_t partition; /* the partition chosen (valid when has_partition) */
    int has_partition;
    char partition_path[TS_CONFIG_PATH_MAX + 64];
    double switched_at; /* when the served cluster last changed */
    int waiting_logged;
    int stopping;
};

enum { FETCH_PARTITION = 1, FETCH_WEIGHTS };

/* The live experts of one status answer: node, its address, the decoded advert. */
typedef struct {
    const Tessera__MemberState *m;
    const Tessera__AdvertBody *b;
} live_t;

static int is_live(const Tessera__MemberState *m) {
    return m->status == TESSERA__MEMBER_STATUS__MEMBER_ALIVE ||
           m->status == TESSERA__MEMBER_STATUS__MEMBER_SUSPECT;
}

static int same_hash(const ProtobufCBinaryData *d, const ts_hash_t *h) {
    return d->len == TS_HASH_BYTES && memcmp(d->data, h->b, TS_HASH_BYTES) == 0;
}

/* The live members with a decoded advert; n of them. */
static live_t *collect(const Tessera__StatusResponse *r, const ts_status_adverts_t *ad, size_t *n) {
    live_t *l = calloc(r->n_members ? r->n_members : 1, sizeof *l);
    *n = 0;
    for (size_t i = 0; l && i < r->n_members; i++) {
        const Tessera__AdvertBody *b = ts_status_advert_of(r, ad, &r->members[i]->node_id);
        if (b && is_live(r->members[i]) && b->partition_id.len == TS_HASH_BYTES &&
            b->weights_hash.len == TS_HASH_BYTES && b->num_clusters >= 1 &&
            b->cluster < b->num_clusters)
            l[(*n)++] = (live_t){r->members[i], b};
    }
    return l;
}

static int id_cmp(const void *x, const void *y) {
    return memcmp(*(const uint8_t *const *)x, *(const uint8_t *const *)y, TS_HASH_BYTES);
}

/* The partition: the configured one, else the one most live experts advertise (ties: the lower
 * id). 0 when none is advertised. */
static int choose_partition(ts_auto_t *a, const live_t *l, size_t n, ts_hash_t *out) {
    if (a->cfg->expert_partition[0]) { /* its id is the hash of the file (protocol.md) */
        ts_partition_t part;
        char err[512];
        if (ts_partition_load(a->cfg->expert_partition, &part, err, sizeof err) != TS_OK)
            return 0;
        int ok = ts_hash_parse(part.id, out) == TS_OK;
        ts_partition_free(&part);
        return ok;
    }
    /* sorted by partition id: each run of equal ids is one partition's count (n log n, where
     * counting every pair was n²: thousands of experts) */
    const uint8_t **ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return 0;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (l[i].b->partition_id.len == TS_HASH_BYTES)
            ids[m++] = l[i].b->partition_id.data;
    qsort(ids, m, sizeof *ids, id_cmp);
    const uint8_t *best_id = NULL;
    size_t best_count = 0;
    for (size_t i = 0, j; i < m; i = j) {
        for (j = i + 1; j < m && memcmp(ids[j], ids[i], TS_HASH_BYTES) == 0; j++)
            ;
        if (j - i > best_count) /* ties: the first run, the lower id */
            best_id = ids[i], best_count = j - i;
    }
    if (best_id)
        memcpy(out->b, best_id, TS_HASH_BYTES);
    free(ids);
    return best_id != NULL;
}

static void on_fetched(ts_fetcher_t *f, int rc, const char *err, void *arg);

static int start_fetch(ts_auto_t *a, const char *peer, const ts_hash_t *h, int kind, int cluster) {
    ts_fetcher_opts_t o = {.peer = peer,
                           .file = *h,
                           .identity = a->cfg->identity,
                           .network_key = a->cfg->network_key,
                           .bytes_per_s = (uint64_t)a->cfg->auto_bandwidth_mib_s << 20};
    int rc = ts_fetcher_start(&a->fetch, a->timer.loop, a->store, &o, on_fetched, a);
    if (rc == TS_OK)
        a->fetch_kind = kind, a->fetch_cluster = cluster, a->fetching = *h;
    else
        ts_log_warn("auto", "cannot start a fetch from %s: %s", peer, ts_strerror(rc));
    return rc;
}

/* The partition file as a file (the trainer and the host read it from a path): exported from
 * the store once. TS_ENOTFOUND when the store does not hold it yet. */
static int partition_file(ts_auto_t *a) {
    char hex[TS_HASH_HEX];
    ts_hash_hex(&a->partition, hex);
    if (a->cfg->expert_partition[0]) {
        snprintf(a->partition_path, sizeof a->partition_path, "%s", a->cfg->expert_partition);
        return TS_OK;
    }
    char dir[TS_CONFIG_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/auto", a->cfg->data_dir);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        char why[128];
        ts_errno_text(errno, why, sizeof why);
        ts_log_error("auto", "cannot create %s: %s", dir, why);
        return TS_EIO;
    }
    snprintf(a->partition_path, sizeof a->partition_path, "%s/partition-%.16s.safetensors", dir,
             hex);
    if (ts_file_exists(a->partition_path))
        return TS_OK;
    if (ts_weights_bad_chunks(a->store, &a->partition, NULL, NULL) != 0)
        return TS_ENOTFOUND;
    char err[512];
    int rc = ts_weights_export(a->store, &a->partition, a->partition_path, err, sizeof err);
    if (rc != TS_OK)
        ts_log_error("auto", "cannot write the partition file %s: %s", a->partition_path, err);
    return rc;
}

/* The weights most live replicas of cluster k serve, and one of their addresses. */
static int weights_of(const ts_auto_t *a, const live_t *l, size_t n, int k, ts_hash_t *w,
                      const char **peer) {
    int best = -1, best_count = 0;
    for (size_t i = 0; i < n; i++) {
        if (!same_hash(&l[i].b->partition_id, &a->partition) || (int)l[i].b->cluster != k ||
            memcmp(l[i].m->node_id.data, a->self, TS_ASSIGN_ID_BYTES) == 0 || !l[i].m->addr)
            continue;
        int count = 0;
        for (size_t j = 0; j < n; j++)
            count +=
                (int)l[j].b->cluster == k && same_hash(&l[j].b->partition_id, &a->partition) &&
                memcmp(l[j].b->weights_hash.data, l[i].b->weights_hash.data, TS_HASH_BYTES) == 0;
        if (count > best_count)
            best = (int)i, best_count = count;
    }
    if (best < 0)
        return 0;
    memcpy(w->b, l[best].b->weights_hash.data, TS_HASH_BYTES);
    *peer = l[best].m->addr;
    return 1;
}

/* The preset the live experts of the partition use, into preset ("mini", "tiny", "XL/2", ...), so
 * that an expert trained here has the network's shape; 1 when one matches. 0 with what they use
 * ("h96 d3 p4") in preset when it is no preset, or "" when no expert of it is live. */
static int network_model(const ts_auto_t *a, const live_t *l, size_t n, char *preset,
                         size_t len) {
    static const char *const names[] = {"mini",  "tiny",  "small", "S/2",  "S/4",  "S/8",
                                        "B/2",   "B/4",   "B/8",   "L/2",  "L/4",  "L/8",
                                        "XL/2",  "XL/4",  "XL/8"};
    preset[0] = 0;
    for (size_t i = 0; i < n; i++) {
        const Tessera__ModelConfig *m = l[i].b->model;
        if (!same_hash(&l[i].b->partition_id, &a->partition) || !m)
            continue;
        for (size_t j = 0; j < sizeof names / sizeof names[0]; j++) {
            ts_dit_config_t c;
            if (ts_dit_config_preset(names[j], &c) == TS_OK &&
                (int)m->hidden_size == c.hidden_size && (int)m->depth == c.depth &&
                (int)m->num_heads == c.num_heads && (int)m->patch_size == c.patch_size &&
                (int)m->input_size == c.input_size && (int)m->in_channels == c.in_channels &&
                (int)m->num_classes == c.num_classes && (int)m->mlp_ratio == c.mlp_ratio &&
                (int)m->freq_dim == c.freq_dim) {
                snprintf(preset, len, "%s", names[j]);
                return 1;
            }
        }
        snprintf(preset, len, "h%u d%u p%u", m->hidden_size, m->depth, m->patch_size);
        return 0;
    }
    return 0;
}

/* Serves cluster k: the weights from a replica, or trained here when no live node has them. */
static void take(ts_auto_t *a, const live_t *l, size_t n, int k, const char *why) {
    char phex[TS_HASH_HEX], whex[TS_HASH_HEX], err[1024];
    ts_hash_hex(&a->partition, phex);
    ts_hash_t w;
    const char *peer = NULL;
    if (weights_of(a, l, n, k, &w, &peer)) {
        ts_hash_hex(&w, whex);
        if (ts_weights_bad_chunks(a->store, &w, NULL, NULL) == 0) {
            ts_log_info("auto",
                        "cluster %d of partition %.16s: %s; serving weights %.16s (in the "
                        "store)",
                        k, phex, why, whex);
            ts_host_serve_expert(a->host, a->partition_path, k, &w);
            a->switched_at = ts_now_s();
            return;
        }
        ts_log_info("auto", "cluster %d of partition %.16s: %s; fetching weights %.16s from %s", k,
                    phex, why, whex, peer);
        start_fetch(a, peer, &w, FETCH_WEIGHTS, k);
        return;
    }
    char model[64];
    int same = network_model(a, l, n, model, sizeof model);
    ts_host_set_train_model(a->host, same ? model : NULL);
    const char *mine = a->cfg->train_model[0] ? a->cfg->train_model : "tiny";
    ts_log_info("auto",
                "cluster %d of partition %.16s: %s; no live node serves it: training it as "
                "'%s' (%s), %lld steps; the time it takes follows its first step",
                k, phex, why, same ? model : mine,
                same ? "the model the network's experts of this partition use"
                : model[0] ? "[train] model: the network's experts are no preset"
                           : "[train] model: no expert of this partition is live to copy",
                (long long)a->cfg->train_steps);
    if (same && strcmp(model, mine) != 0)
        ts_log_info("auto", "(not [train] model '%s': an ensemble's experts share one shape)", mine);
    if (ts_host_train_expert(a->host, a->partition_path, k, err, sizeof err) != TS_OK)
        ts_log_error("auto", "cannot train cluster %d: %s", k, err);
    else
        a->switched_at = ts_now_s();
}

/* The view of daemon/assign.h: the live experts of the chosen partition. */
static void choose(ts_auto_t *a, const live_t *l, size_t n) {
    ts_assign_expert_t *e = calloc(n ? n : 1, sizeof *e);
    if (!e)
        return;
    size_t m = 0;
    int K = 0;
    for (size_t i = 0; i < n; i++) {
        if (!same_hash(&l[i].b->partition_id, &a->partition))
            continue;
        K = (int)l[i].b->num_clusters;
        e[m].cluster = (int)l[i].b->cluster;
        memcpy(e[m].node_id, l[i].m->node_id.data, TS_ASSIGN_ID_BYTES);
        e[m].requests_per_s = l[i].b->load && l[i].b->load->requests_per_s > 0.0f
                                  ? (double)l[i].b->load->requests_per_s
                                  : 0.0;
        m++;
    }
    /* a cluster of another partition (the majority moved on) is no cluster of this one */
    int current =
        strcmp(ts_host_partition(a->host), a->partition_path) == 0 ? ts_host_cluster(a->host) : -1;
    ts_assign_view_t v = {.K = K,
                          .experts = e,
                          .n = m,
                          .gain = 2.0,
                          .dwell_ok = ts_now_s() - a->switched_at >= a->cfg->auto_dwell_s};
    ts_assign_result_t r;
    int rc = K >= 1 ? ts_assign_choose(&v, a->self, current < K ? current : -1, &r) : TS_EINVAL;
    if (rc != TS_OK)
        ts_log_warn("auto", "the adverts of this partition do not agree (K, clusters, rates): no "
                            "choice this round");
    else if (r.move)
        take(a, l, n, r.cluster, r.why);
    free(e);
}

static void tick(ts_auto_t *a) {
    if (a->fetch || a->stopping)
        return;
    Tessera__StatusResponse *r = NULL;
    ts_status_adverts_t ad = {0};
    if (ts_gossip_status(a->gossip, NULL, &r) != TS_OK)
        return;
    size_t n = 0;
    live_t *l = ts_status_adverts_decode(r, &ad) == TS_OK ? collect(r, &ad, &n) : NULL;
    ts_hash_t p;
    if (l && choose_partition(a, l, n, &p)) {
        a->waiting_logged = 0;
        a->partition = p, a->has_partition = 1;
        int prc = partition_file(a);
        if (prc == TS_OK)
            choose(a, l, n);
        else if (prc == TS_ENOTFOUND)      /* (any other failure was logged: no fetch for it) */
            for (size_t i = 0; i < n; i++) /* fetch it from a node that advertises it */
                if (same_hash(&l[i].b->partition_id, &p) && l[i].m->addr &&
                    memcmp(l[i].m->node_id.data, a->self, TS_ASSIGN_ID_BYTES) != 0) {
                    char hex[TS_HASH_HEX];
                    ts_hash_hex(&p, hex);
                    ts_log_info("auto", "fetching partition %.16s from %s", hex, l[i].m->addr);
                    start_fetch(a, l[i].m->addr, &p, FETCH_PARTITION, -1);
                    break;
                }
    } else if (l && !a->waiting_logged) {
        a->waiting_logged = 1;
        ts_log_info("auto", "no expert advertised in the network yet: waiting for one (an auto "
                            "node needs a partition some node serves)");
    }
    free(l);
    ts_status_adverts_free(&ad);
    ts_gossip_status_free(r);
}

static void on_fetched(ts_fetcher_t *f, int rc, const char *err, void *arg) {
    ts_auto_t *a = arg;
    int kind = a->fetch_kind, k = a->fetch_cluster;
    ts_hash_t h = a->fetching;
    char hex[TS_HASH_HEX];
    ts_hash_hex(&h, hex);
    (void)f;
    if (rc != TS_OK)
        ts_log_warn("auto", "the fetch of %.16s failed: %s (tried again at the next choice)", hex,
                    err);
    ts_fetcher_free(a->fetch);
    a->fetch = NULL;
    if (rc != TS_OK || a->stopping)
        return;
    if (kind == FETCH_PARTITION) {
        ts_log_info("auto", "partition %.16s fetched", hex);
        tick(a); /* choose now rather than an interval later */
        return;
    }
    /* the weights of cluster k, verified against their hash chunk by chunk and whole */
    ts_log_info("auto", "weights %.16s of cluster %d fetched; serving them", hex, k);
    ts_host_serve_expert(a->host, a->partition_path, k, &h);
    a->switched_at = ts_now_s();
}

static void on_timer(uv_timer_t *t) { tick(t->data); }

int ts_auto_start(ts_auto_t **out, uv_loop_t *loop, const ts_daemon_config_t *cfg,
                  ts_gossip_t *gossip, ts_host_t *host, ts_store_t *store,
                  const uint8_t self_id[32]) {
    ts_auto_t *a = calloc(1, sizeof *a);
    if (!a)
        return TS_ENOMEM;
    a->cfg = cfg, a->gossip = gossip, a->host = host, a->store = store;
    memcpy(a->self, self_id, TS_ASSIGN_ID_BYTES);
    a->switched_at = -1e18;
    uv_timer_init(loop, &a->timer);
    a->timer.data = a;
    uint64_t ms = (uint64_t)cfg->auto_interval_s * 1000;
    uv_timer_start(&a->timer, on_timer, ms, ms);
    *out = a;
    return TS_OK;
}

static void on_closed(uv_handle_t *h) { free(h->data); }

void ts_auto_stop(ts_auto_t *a) {
    if (!a || a->stopping)
        return;
    a->stopping = 1;
    uv_timer_stop(&a->timer);
    if (a->fetch) {
        ts_fetcher_free(a->fetch);
        a->fetch = NULL;
    }
    uv_close((uv_handle_t *)&a->timer, on_closed);
}
