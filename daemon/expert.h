/*
 * expert.h — the expert a node offers the network, and the advert that describes it.
 *
 * An expert is a DiT weights file in the store (named by its weights hash) trained on one
 * cluster of a partition, as `tessera train --partition DIR --cluster k` records in the file's
 * metadata (partition_id, cluster, objective). The partition artifact is needed too: it gives
 * K and the cluster's centroid (in its PCA embedding space), which the advert carries so that
 * clients can route by it. Both files are imported into the store at start, so the node can
 * serve them to clients (weight server: a partition's id is its file's BLAKE2b-256, i.e. its
 * weights hash in the store).
 *
 * The advert (docs/protocol.md "Adverts"): partition_id, num_clusters, cluster, weights_hash,
 * model config, objective, centroid (F32), capacity, load, and the latent space of a latent expert. The gossip layer numbers, signs and
 * spreads it.
 */
#ifndef TS_DAEMON_EXPERT_H
#define TS_DAEMON_EXPERT_H

#include <stddef.h>
#include <stdint.h>

#include "model/dit.h"
#include "model/partition.h"
#include "model/safetensors.h"
#include "proto/tessera.pb-c.h"
#include "store/store.h"
#include "store/weights.h"

typedef struct ts_expert_info {
    ts_hash_t weights_hash;
    ts_hash_t partition_hash; /* = the partition_id */
    ts_hash_t router_hash;    /* valid when has_router */
    int has_router;
    ts_dit_config_t config;
    uint32_t cluster, num_clusters;
    int objective; /* Tessera__Objective */
    ts_hash_t
        latent_space; /* valid when has_latent_space: the VAE of its latents (model/latents.h) */
    int has_latent_space;
    int dims; /* centroid length */
    float *centroid;
    float heldout_loss; /* the weights' heldout_loss metadata (model/heldout.h); NaN: none */
} ts_expert_info_t;

/* Imports (or finds) the weights and the partition in the store and checks that they belong
 * together: weights is a .safetensors path or a weights hash (a prefix of at least 8 hex digits)
 * already in the store; partition is a `tessera partition` artifact path. The weights must
 * carry partition_id (equal to the partition file's) and a cluster below its K. TS_EINVAL,
 * TS_ENOTFOUND, TS_ECORRUPT, TS_EIO with a sentence. Free with ts_expert_info_free. */
/* What a weights file says of itself, checked as a node must: the DiT config, partition_id and
 * cluster present (cluster a number), an objective tessera knows (model/objective.h; none:
 * velocity) and a well-formed latent space if it names one (model/latents.h).
 * pid receives partition_id. TS_EINVAL or TS_ECORRUPT with a sentence. */
int ts_expert_weights_meta(const ts_st_file_t *f, ts_dit_config_t *cfg, uint32_t *cluster,
                           char *pid, size_t pidlen, char *err, size_t errlen);
/* That weights with (pid, cluster) belong to the partition part (file `partition`): the same id,
 * the cluster below its K. TS_EINVAL with a sentence naming both. */
int ts_expert_belongs(const char *pid, uint32_t cluster, const char *weights,
                      const ts_partition_t *part, const char *partition, char *err, size_t errlen);

int ts_expert_prepare(ts_store_t *s, const char *weights, const char *partition,
                      ts_expert_info_t *out, char *err, size_t errlen);

/* Imports a router file for e's partition into the store (it must route over K clusters) and
 * names it in the advert. TS_EINVAL, TS_EIO, TS_ECORRUPT with a sentence. */
int ts_expert_add_router(ts_store_t *s, const char *router, ts_expert_info_t *e, char *err,
                         size_t errlen);
void ts_expert_info_free(ts_expert_info_t *e);

/* An advert body with its parts, pointing into itself and into the expert (which must outlive
 * it). version is left 0: the gossip layer numbers adverts. */
typedef struct ts_expert_advert {
    Tessera__AdvertBody body;
    Tessera__ModelConfig model;
    Tessera__Tensor centroid;
    int64_t centroid_shape[1];
    Tessera__Capacity capacity;
    Tessera__Load load;
} ts_expert_advert_t;

/* Fills a with e's advert and the given capacity and load (either may be NULL: zero). */
void ts_expert_advert(const ts_expert_info_t *e, const Tessera__Capacity *capacity,
                      const Tessera__Load *load, ts_expert_advert_t *a);

#endif
