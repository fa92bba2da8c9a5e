/*
 * expert.c — the node's expert and its advert (expert.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/expert.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/dit_io.h"
#include "model/latents.h"
#include "model/objective.h"
#include "model/partition.h"
#include "model/safetensors.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "adverts send the centroid's floats as they are in memory: little-endian");

/* The weights' hash: a file is imported, anything else is looked up as a hash prefix. */
static int find_weights(ts_store_t *s, const char *weights, ts_hash_t *h, char *err,
                        size_t errlen) {
    size_t n = strlen(weights);
    if (n > 12 && strcmp(weights + n - 12, ".safetensors") == 0)
        return ts_weights_import_file(s, weights, h, NULL, NULL, err, errlen);
    return ts_weights_resolve(s, weights, h, err, errlen);
}

static int parse_u32(const char *v, uint32_t *out) {
    char *end;
    unsigned long x = v ? strtoul(v, &end, 10) : 0;
    if (!v || !*v || *end || x > UINT32_MAX)
        return TS_EINVAL;
    *out = (uint32_t)x;
    return TS_OK;
}

int ts_expert_weights_meta(const ts_st_file_t *f, ts_dit_config_t *cfg, uint32_t *cluster,
                           char *pid, size_t pidlen, char *err, size_t errlen) {
    int rc = ts_dit_config_from_file(f, cfg, err, errlen);
    const char *p = ts_st_meta(f, "partition_id"), *c = ts_st_meta(f, "cluster"),
               *o = ts_st_meta(f, "objective");
    if (rc == TS_OK && (!p || !c)) {
        ts_set_err(err, errlen,
                   "the weights carry no partition_id and cluster: train them with "
                   "`tessera train --partition DIR --cluster K`");
        rc = TS_EINVAL;
    } else if (rc == TS_OK && parse_u32(c, cluster) != TS_OK) {
        ts_set_err(err, errlen, "the weights' cluster '%s' is not a number", c);
        rc = TS_ECORRUPT;
    } else if (rc == TS_OK && o && ts_objective_parse(o, &(ts_objective_t){0}) != TS_OK) {
        ts_set_err(err, errlen,
                   "the weights' objective '%s' is not one tessera knows (velocity, epsilon, "
                   "v_prediction, x0)",
                   o);
        rc = TS_EINVAL;
    } else if (rc == TS_OK && ts_latent_space_meta(f, (char[TS_LATENT_SPACE_HEX]){0}) < 0) {
        ts_set_err(err, errlen, "the weights' %s is not 64 hex digits", TS_LATENT_SPACE_KEY);
        rc = TS_ECORRUPT;
    }
    if (rc == TS_OK)
        snprintf(pid, pidlen, "%s", p);
    return rc;
}

int ts_expert_belongs(const char *pid, uint32_t cluster, const char *weights,
                      const ts_partition_t *part, const char *partition, char *err, size_t errlen) {
    if (strcmp(part->id, pid) != 0) {
        ts_set_err(err, errlen,
                   "the weights %s were trained on partition %.16s…, not on %s "
                   "(%.16s…)",
                   weights, pid, partition, part->id);
        return TS_EINVAL;
    }
    if (cluster >= (uint32_t)part->K) {
        ts_set_err(err, errlen, "the weights' cluster %u is not below the partition's K = %d",
                   cluster, part->K);
        return TS_EINVAL;
    }
    return TS_OK;
}

/* Reads the config and the partition metadata from the weights file in the store. */
static int read_weights_meta(ts_store_t *s, ts_expert_info_t *e, char *pid, size_t pidlen,
                             char *err, size_t errlen) {
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc = ts_weights_load(s, &e->weights_hash, &buf, &len, err, errlen);
    if (rc != TS_OK)
        return rc;
    ts_st_file_t f;
    if ((rc = ts_st_parse(buf, len, &f, err, errlen)) != TS_OK)
        return rc;
    rc = ts_expert_weights_meta(&f, &e->config, &e->cluster, pid, pidlen, err, errlen);
    ts_objective_t obj = TS_OBJ_VELOCITY; /* checked above: absent is velocity */
    const char *o = ts_st_meta(&f, "objective");
    if (o)
        (void)ts_objective_parse(o, &obj);
    e->objective = ts_objective_wire(obj);
    char space[TS_LATENT_SPACE_HEX];
    e->has_latent_space = rc == TS_OK && ts_latent_space_meta(&f, space) == 1 &&
                          ts_hash_parse(space, &e->latent_space) == TS_OK;
    /* advisory: a value that is not a finite non-negative number is left out, not an error */
    const char *h = ts_st_meta(&f, "heldout_loss");
    char *end = NULL;
    double v = h ? strtod(h, &end) : NAN;
    e->heldout_loss = h && *h && end && !*end && isfinite(v) && v >= 0.0 ? (float)v : NAN;
    ts_st_free(&f);
    return rc;
}

int ts_expert_prepare(ts_store_t *s, const char *weights, const char *partition,
                      ts_expert_info_t *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    out->heldout_loss = NAN;
    if (!s || !weights || !partition) {
        ts_set_err(err, errlen, "ts_expert_prepare: NULL argument");
        return TS_EINVAL;
    }
    char pid[TS_PARTITION_ID_HEX + 8] = "", sub[512] = "";
    int rc = find_weights(s, weights, &out->weights_hash, sub, sizeof sub);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "expert weights %s: %s", weights, sub);
        return rc;
    }
    if ((rc = read_weights_meta(s, out, pid, sizeof pid, sub, sizeof sub)) != TS_OK) {
        ts_set_err(err, errlen, "expert weights %s: %s", weights, sub);
        return rc;
    }
    ts_partition_t part;
    if ((rc = ts_partition_load(partition, &part, sub, sizeof sub)) != TS_OK) {
        ts_set_err(err, errlen, "partition %s: %s", partition, sub);
        return rc;
    }
    rc = ts_expert_belongs(pid, out->cluster, weights, &part, partition, err, errlen);
    if (rc == TS_OK) {
        out->num_clusters = (uint32_t)part.K;
        out->dims = part.k;
        out->centroid = malloc(sizeof(float) * (size_t)part.k);
        if (!out->centroid)
            rc = TS_ENOMEM;
        else
            memcpy(out->centroid, part.centroids + (size_t)out->cluster * (size_t)part.k,
                   sizeof(float) * (size_t)part.k);
    }
    ts_partition_free(&part);
    /* The partition goes into the store too, so that clients can fetch it from this node. */
    if (rc == TS_OK && (rc = ts_weights_import_file(s, partition, &out->partition_hash, NULL, NULL,
                                                    sub, sizeof sub)) != TS_OK)
        ts_set_err(err, errlen, "partition %s: cannot import it into the store: %s", partition,
                   sub);
    if (rc != TS_OK)
        ts_expert_info_free(out);
    return rc;
}

int ts_expert_add_router(ts_store_t *s, const char *router, ts_expert_info_t *e, char *err,
                         size_t errlen) {
    ts_st_file_t f;
    char sub[512] = "";
    int rc = ts_st_read(router, &f, sub, sizeof sub);
    if (rc == TS_OK) {
        const char *pid = ts_st_meta(&f, "partition_id");
        char want[TS_HASH_HEX];
        ts_hash_hex(&e->partition_hash, want);
        if (pid && strcmp(pid, want) != 0) {
            ts_set_err(sub, sizeof sub,
                       "it was trained on partition %.16s…, not the expert's "
                       "%.16s…",
                       pid, want);
            rc = TS_EINVAL;
        }
        ts_st_free(&f);
    }
    if (rc == TS_OK)
        rc = ts_weights_import_file(s, router, &e->router_hash, NULL, NULL, sub, sizeof sub);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "router %s: %s", router, sub);
        return rc;
    }
    e->has_router = 1;
    return TS_OK;
}

void ts_expert_info_free(ts_expert_info_t *e) {
    if (!e)
        return;
    free(e->centroid);
    memset(e, 0, sizeof *e);
}

void ts_expert_advert(const ts_expert_info_t *e, const Tessera__Capacity *capacity,
                      const Tessera__Load *load, ts_expert_advert_t *a) {
    memset(a, 0, sizeof *a);
    tessera__advert_body__init(&a->body);
    tessera__model_config__init(&a->model);
    tessera__tensor__init(&a->centroid);
    tessera__capacity__init(&a->capacity);
    tessera__load__init(&a->load);
    if (capacity)
        a->capacity = *capacity;
    if (load)
        a->load = *load;
    const ts_dit_config_t *c = &e->config;
    Tessera__ModelConfig *m = &a->model;
    m->has_input_size = m->has_patch_size = m->has_in_channels = m->has_hidden_size = 1;
    m->has_depth = m->has_num_heads = m->has_num_classes = m->has_mlp_ratio = m->has_freq_dim = 1;
    m->input_size = (uint32_t)c->input_size, m->patch_size = (uint32_t)c->patch_size;
    m->in_channels = (uint32_t)c->in_channels, m->hidden_size = (uint32_t)c->hidden_size;
    m->depth = (uint32_t)c->depth, m->num_heads = (uint32_t)c->num_heads;
    m->num_classes = (uint32_t)c->num_classes, m->mlp_ratio = (uint32_t)c->mlp_ratio;
    m->freq_dim = (uint32_t)c->freq_dim;
    if (c->learn_sigma) /* absent otherwise: an advert without learned σ reads as before */
        m->has_learn_sigma = m->learn_sigma = 1;
    /* The centroid as raw F32 in the protocol's byte order, little-endian: the host's (below). */
    a->centroid_shape[0] = e->dims;
    a->centroid.has_dtype = 1;
    a->centroid.dtype = TESSERA__DTYPE__DTYPE_F32;
    a->centroid.n_shape = 1;
    a->centroid.shape = a->centroid_shape;
    a->centroid.has_data = 1;
    a->centroid.data.data = (uint8_t *)e->centroid;
    a->centroid.data.len = sizeof(float) * (size_t)e->dims;
    Tessera__AdvertBody *b = &a->body;
    b->has_partition_id = b->has_weights_hash = 1;
    b->partition_id.data = (uint8_t *)e->partition_hash.b;
    b->partition_id.len = TS_HASH_BYTES;
    b->weights_hash.data = (uint8_t *)e->weights_hash.b;
    b->weights_hash.len = TS_HASH_BYTES;
    b->has_num_clusters = b->has_cluster = b->has_objective = 1;
    b->num_clusters = e->num_clusters;
    b->cluster = e->cluster;
    b->objective = (Tessera__Objective)e->objective;
    if (e->has_latent_space) {
        b->has_latent_space = 1;
        b->latent_space.data = (uint8_t *)e->latent_space.b;
        b->latent_space.len = TS_HASH_BYTES;
    }
    if (e->has_router) {
        b->has_router_hash = 1;
        b->router_hash.data = (uint8_t *)e->router_hash.b;
        b->router_hash.len = TS_HASH_BYTES;
    }
    if (isfinite(e->heldout_loss)) {
        b->has_heldout_loss = 1;
        b->heldout_loss = e->heldout_loss;
    }
    b->model = m;
    b->centroid = &a->centroid;
    b->capacity = &a->capacity;
    b->load = &a->load;
}
