/*
 * netgen.h — `tessera generate --peer`: generation with the network's experts.
 *
 * Opening: connect to the peer (as a client: it serves nothing), ask for its view (status with
 * members and adverts), verify every advert's signature, pick the partition the most live
 * clusters serve (or the one named), fetch that partition and the router the adverts name from
 * the network into the store (verified, resumable; fetch.h), export both to a cache folder and
 * open it as a generation folder whose experts are remote (client/local.h): the routing and the
 * sampler then run here exactly as with --local, and every evaluation's expert jobs go to the
 * replicas of each cluster (client/remote.h). Experts whose weights are in the store are opened
 * as the fallback (and with --prefer-local, used first): the advertised weights, or for a cluster
 * no live node serves, the weights in the store whose metadata names the partition and the
 * cluster (so `tessera pull` keeps a cluster alive after its hosts leave). The partition and the
 * router are fetched from the store, the entry node, or any live node whose advert names them.
 * A cluster nothing can serve is uncovered: the ensemble routes around it from the first step
 * (a warning), unless require_coverage asks for today's refusal. Not one expert: an error.
 */
#ifndef TS_CLIENT_NETGEN_H
#define TS_CLIENT_NETGEN_H

#include <stdint.h>

#include "client/local.h"
#include "net/netclient.h"
#include "client/remote.h"
#include "store/store.h"

typedef struct ts_netgen_opts {
    const char *peer, *network_key, *identity; /* identity may be NULL */
    const char *data_dir;  /* the store (cache of weights and artifacts); NULL: the default */
    const char *partition; /* a partition_id prefix, or NULL: the best-covered one */
    ts_remote_opts_t remote;
    int trace;
    int load_router; /* TS_NETGEN_ROUTER_NONE, _OPTIONAL (without one: a warning) or _REQUIRED */
    int quiet;
    int require_coverage; /* refuse when a cluster has no live expert and no cached weights */
    /* the readiness bar: an expert advertised while its run is still training is used only
     * past this fraction of its steps (TS_NETGEN_MIN_TRAINED: only finished experts) */
    double min_trained;
    /* and (> 0) one whose weights' held-out loss is at most this times the finished experts' of
     * its partition and config (their median); 0: off, the default */
    double ready_loss;
    const char *cls; /* --class, checked against the experts' classes before any fetch */
    /* the replicas vouched for by an earlier run at most this long ago start vouched for
     * (store/vouch.h), and this run's vouches are kept; 0: neither */
    int64_t vouch_ttl_s;
} ts_netgen_opts_t;

#define TS_NETGEN_VOUCH_TTL_S 3600 /* docs/benchmarks.md, "Spot-checks against liars" */

#define TS_NETGEN_MIN_TRAINED 1.0

/* The experts of a cluster held back by the readiness bar: how many, and the furthest one. */
typedef struct ts_netgen_held {
    int n;
    uint64_t step, steps;
    float heldout, reference; /* its held-out loss and the finished experts'; NaN: not known */
    char addr[64];
} ts_netgen_held_t;

enum { TS_NETGEN_ROUTER_NONE = 0, TS_NETGEN_ROUTER_OPTIONAL = 1, TS_NETGEN_ROUTER_REQUIRED = 2 };

typedef struct ts_netgen {
    ts_netclient_t nc;
    int nc_open;
    ts_store_t *store;
    ts_remote_t remote;
    int remote_init;
    ts_remote_expert_t *experts; /* (K) */
    ts_dit_t *cached;            /* (K) the fallback models; valid where has_cached[k] */
    int *has_cached;
    int K, n_replicas, n_cached, n_absent;
    int n_remembered;    /* replicas that started vouched for (an earlier run's vouch) */
    int64_t vouch_ttl_s; /* the options': 0 keeps no vouch */
    uint8_t *absent;     /* (K) the uncovered clusters: no live replica, no weights in the store */
    ts_netgen_held_t *held; /* (K) the live experts not used because they are still training */
    int n_held;
    int said, usage; /* a failed open already printed why; usage: a bad --peer (exit 2) */
    ts_dit_config_t cfg;
    ts_objective_t *objective; /* (K) what each cluster's expert predicts (velocity when unknown) */
    uint8_t *learn_sigma;      /* (K) whose expert has DiT's learned variance (its advert says) */
    char latent_space[65];     /* the experts' latent space (model/latents.h); "": pixels */
    char partition_id[65];
    char cache_dir[1024];
} ts_netgen_t;

/* Opens the network as l (remote experts) for engine e, chunk samples per evaluation, pairs
 * (2 with CFG). On failure err says why; ts_netgen_close frees what was opened either way. */
int ts_netgen_open(ts_netgen_t *g, const ts_netgen_opts_t *o, ts_engine_t *e, int chunk, int pairs,
                   ts_local_t *l, const char *prog, char *err, size_t errlen);
void ts_netgen_close(ts_netgen_t *g);

/* "1 expert still training, not used (the furthest, at ADDR: step 41 of 10000, 0.4%; ...)" */
void ts_netgen_held_text(const ts_netgen_t *g, int k, char *out, size_t len);

#endif
