/*
 * local.c — a generation folder in this process (client/local.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "client/local.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/clock.h"
#include "base/file.h"
#include "client/cli.h"
#include "model/fmnist.h"
#include "model/vae.h"
#include "model/safetensors.h"

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void free_list(char **list, int n) {
    for (int i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The expert files of dir (see the header): *paths (malloc'd list of malloc'd strings), *n. */
static int find_experts(const char *dir, char ***paths, int *n, char *err, size_t errlen) {
    char path[4096];
    char **list = calloc(TS_ROUTE_MAX_EXPERTS, sizeof *list);
    int count = 0;
    if (!list)
        return TS_ENOMEM;
    for (int k = 0; k < TS_ROUTE_MAX_EXPERTS; k++) {
        snprintf(path, sizeof path, "%s/expert-%d.safetensors", dir, k);
        if (!ts_file_exists(path))
            break;
        if (!(list[count++] = strdup(path))) {
            free_list(list, count);
            return TS_ENOMEM;
        }
    }
    if (count == 0) {
        DIR *d = opendir(dir);
        if (!d) {
            ts_set_err(err, errlen, "--local %s: cannot open the folder", dir);
            free(list);
            return TS_EIO;
        }
        struct dirent *de;
        while ((de = readdir(d)) != NULL && count < TS_ROUTE_MAX_EXPERTS) {
            if (!ends_with(de->d_name, ".safetensors") ||
                strcmp(de->d_name, "partition.safetensors") == 0 ||
                strcmp(de->d_name, "router.safetensors") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            ts_st_file_t f;
            if (ts_st_read(path, &f, NULL, 0) != TS_OK)
                continue; /* not ours to judge: only files naming a cluster are experts */
            int is_expert = ts_st_meta(&f, "cluster") != NULL;
            ts_st_free(&f);
            if (is_expert && !(list[count++] = strdup(path))) {
                closedir(d);
                free_list(list, count);
                return TS_ENOMEM;
            }
        }
        closedir(d);
        qsort(list, (size_t)count, sizeof *list, cmp_str);
    }
    if (count == 0) {
        ts_set_err(err, errlen,
                   "--local %s: no experts found (want expert-0.safetensors, expert-1... or "
                   ".safetensors files with a metadata cluster; see tessera generate --help)",
                   dir);
        free(list);
        return TS_ENOTFOUND;
    }
    *paths = list;
    *n = count;
    return TS_OK;
}

/* The folder's partition (when the file exists) and router (when it exists and load_router is
 * set), for l->ex.K experts. */
static int open_artifacts(ts_local_t *l, const char *dir, ts_engine_t *e, int load_router,
                          char *err, size_t errlen) {
    char path[4096];
    int rc = TS_OK, chunk = l->chunk;
    snprintf(path, sizeof path, "%s/partition.safetensors", dir);
    if (ts_file_exists(path)) {
        rc = ts_partition_load(path, &l->part, err, errlen);
        l->has_part = rc == TS_OK;
    }
    snprintf(path, sizeof path, "%s/router.safetensors", dir);
    if (rc == TS_OK && load_router && ts_file_exists(path)) {
        rc = ts_classifier_open(&l->router, path, e, chunk, err, errlen);
        if (rc == TS_OK && ts_classifier_num_outputs(l->router) != l->ex.K) {
            ts_set_err(err, errlen,
                       "%s routes over %d clusters but %s holds %d experts: train the router on "
                       "this folder's partition",
                       path, ts_classifier_num_outputs(l->router), dir, l->ex.K);
            rc = TS_EINVAL;
        }
        int L = rc == TS_OK ? ts_classifier_num_labels(l->router) : 0;
        if (L && L != l->cfg.num_classes) {
            ts_set_err(err, errlen,
                       "%s reads %d class labels but the experts of %s have %d classes", path, L,
                       dir, l->cfg.num_classes);
            rc = TS_EINVAL;
        }
        if (rc == TS_OK)
            rc = ts_classifier_router_init(&l->rr, l->router, e, chunk);
        l->has_router = rc == TS_OK;
    }
    return rc;
}

int ts_local_open(ts_local_t *l, const char *dir, ts_engine_t *e, int chunk, int pairs,
                  int load_router, const char *prog, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    l->chunk = chunk;
    snprintf(l->dir, sizeof l->dir, "%s", dir);
    char **paths = NULL;
    int n_paths = 0;
    int rc = find_experts(dir, &paths, &n_paths, err, errlen);
    if (rc == TS_OK)
        rc = ts_experts_open(&l->ex, (const char *const *)paths, n_paths, e, pairs * chunk, err,
                             errlen);
    free_list(paths, n_paths);
    if (rc == TS_OK) {
        l->cfg = l->ex.models[0].cfg;
        rc = open_artifacts(l, dir, e, load_router, err, errlen);
    }
    if (rc != TS_OK)
        return rc;
    /* warnings: what does not match */
    for (int k = 0; k < l->ex.K && l->has_part; k++)
        if (l->ex.partition_id[k] && strcmp(l->ex.partition_id[k], l->part.id) != 0)
            fprintf(stderr,
                    "%s: warning: %s was trained on partition %.12s…, not this folder's "
                    "%.12s…\n",
                    prog, l->ex.paths[k], l->ex.partition_id[k], l->part.id);
    if (l->has_router && l->has_part) {
        const char *pid = ts_classifier_meta(l->router, "partition_id");
        if (pid && strcmp(pid, l->part.id) != 0)
            fprintf(stderr,
                    "%s: warning: the router was trained on partition %.12s…, not this "
                    "folder's %.12s…\n",
                    prog, pid, l->part.id);
    }
    return TS_OK;
}

int ts_local_open_file(ts_local_t *l, const char *path, ts_engine_t *e, int chunk, int pairs,
                       char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    l->chunk = chunk;
    snprintf(l->dir, sizeof l->dir, "%s", path);
    int rc = ts_experts_open(&l->ex, &path, 1, e, pairs * chunk, err, errlen);
    if (rc == TS_OK)
        l->cfg = l->ex.models[0].cfg;
    return rc;
}

int ts_local_open_remote(ts_local_t *l, const char *dir, int K, const ts_dit_config_t *cfg,
                         const ts_objective_t *objectives, const uint8_t *learn_sigma,
                         ts_engine_t *e, int chunk, int load_router, ts_expert_eval_fn eval,
                         void *eval_ctx, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    l->chunk = chunk;
    snprintf(l->dir, sizeof l->dir, "%s", dir);
    l->ex.K = K;
    l->cfg = *cfg;
    l->eval = eval;
    l->eval_ctx = eval_ctx;
    l->ex.objective = calloc((size_t)K, sizeof *l->ex.objective);
    l->learn_sigma = calloc((size_t)K, sizeof *l->learn_sigma);
    if (!l->ex.objective || !l->learn_sigma) {
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    for (int k = 0; objectives && k < K; k++)
        l->ex.objective[k] = objectives[k];
    for (int k = 0; learn_sigma && k < K; k++)
        l->learn_sigma[k] = learn_sigma[k] != 0;
    int rc = open_artifacts(l, dir, e, load_router, err, errlen);
    if (rc == TS_OK && l->has_part && l->part.K != K) {
        ts_set_err(err, errlen, "the partition has %d clusters but the network serves %d",
                   l->part.K, K);
        rc = TS_EINVAL;
    }
    return rc;
}

void ts_local_free(ts_local_t *l) {
    if (!l)
        return;
    if (l->eval)
        l->ex.K = 0; /* remote experts: no models to free */
    free(l->learn_sigma);
    ts_classifier_router_free(&l->rr);
    ts_classifier_free(l->router);
    if (l->has_part)
        ts_partition_free(&l->part);
    ts_experts_free(&l->ex);
    memset(l, 0, sizeof *l);
}

int ts_local_check_sampler(const ts_local_t *l, ts_sampler_kind_t kind, const char *sampler,
                           char *err, size_t errlen) {
    for (int k = 0; kind < TS_SAMPLER_DDIM && k < l->ex.K; k++)
        if (l->ex.objective[k] != TS_OBJ_VELOCITY) /* x̂0 = (x_t − t·ε̂)/(1 − t) at t = 1 */
            return ts_fail(err, errlen, TS_EINVAL,
                           "expert %d%s%s is a DDPM expert (objective %s), which cannot be asked "
                           "at pure noise where --sampler %s starts: use --sampler ddim or ddpm "
                           "(DDPM-schedule grids)",
                           k, l->dir[0] ? " of " : "", l->dir,
                           ts_objective_name(l->ex.objective[k]), sampler);
    return TS_OK;
}

int ts_local_check_policy(const ts_local_t *l, ts_policy_t policy, const char *prog, char *err,
                          size_t errlen) {
    const char *name = ts_policy_name(policy);
    int distance = policy == TS_POLICY_CENTROID || policy == TS_POLICY_CONFIDENCE;
    if (distance && !l->has_part && l->ex.K > 1) {
        ts_set_err(err, errlen,
                   "--policy %s needs %s/partition.safetensors (the partition's embedding and "
                   "centroids): run `tessera partition --experts %d --out %s`, or use --policy "
                   "learned or uniform",
                   name, l->dir, l->ex.K, l->dir);
        return TS_ENOTFOUND;
    }
    if (policy == TS_POLICY_LEARNED && !l->has_router && l->ex.K > 1) {
        ts_set_err(err, errlen,
                   "--policy learned needs a router and %s has none: train one with `tessera "
                   "train-router --partition %s --out %s/router.safetensors`, or use --policy "
                   "centroid or uniform",
                   l->dir, l->dir, l->dir);
        return TS_ENOTFOUND;
    }
    if (policy == TS_POLICY_CENTROID && !l->has_router && l->ex.K > 1)
        fprintf(stderr,
                "%s: note: no router in %s: the centroid policy's first step (pure noise, "
                "no estimate yet) routes uniformly\n",
                prog, l->dir);
    if (policy == TS_POLICY_CONFIDENCE && l->ex.K > 1)
        fprintf(stderr, "%s: note: the confidence policy runs all %d experts at every step\n", prog,
                l->ex.K);
    return TS_OK;
}

float ts_local_default_tau(const ts_local_t *l) {
    return l->has_part && l->part.n > 0 && l->part.inertia > 0.0
               ? (float)(l->part.inertia / (double)l->part.n)
               : 1.0f;
}

int ts_local_check_images(const ts_local_t *l, const char *dir, const ts_local_t *mono,
                          const char *const *paths, int n, const ts_dataset_t *ds, char *err,
                          size_t errlen) {
    const ts_dit_config_t *c = &l->cfg;
    for (int m = 0; m < n; m++) {
        const ts_dit_config_t *mc = &mono[m].cfg;
        if (mc->input_size != c->input_size || mc->in_channels != c->in_channels ||
            mc->num_classes != c->num_classes) {
            ts_set_err(err, errlen, "--monolith %s makes other images than the experts of %s",
                       paths[m], dir);
            return TS_EINVAL;
        }
    }
    if (ds->channels != c->in_channels || ds->height != c->input_size ||
        ds->width != c->input_size) {
        ts_set_err(err, errlen, "the experts of %s do not make %dx%dx%d images", dir, ds->channels,
                   ds->height, ds->width);
        return TS_EINVAL;
    }
    return TS_OK;
}

int ts_local_parse_class(const char *cls, int num_classes, int *label, char *err, size_t errlen) {
    *label = -1;
    if (!cls)
        return TS_OK;
    if (strcmp(cls, "null") == 0) {
        *label = num_classes;
        return TS_OK;
    }
    char *end;
    long v = strtol(cls, &end, 10);
    if (*cls && !*end && v >= 0 && v < num_classes) {
        *label = (int)v;
        return TS_OK;
    }
    int named = num_classes == TS_FMNIST_NUM_CLASSES ? ts_fmnist_class_parse(cls) : -1;
    if (named >= 0) {
        *label = named;
        return TS_OK;
    }
    if (num_classes == TS_FMNIST_NUM_CLASSES)
        ts_set_err(err, errlen, "--class %s: must be 0..9, a class name (%s) or 'null'", cls,
                   TS_FMNIST_CLASS_LIST);
    else
        ts_set_err(err, errlen, "--class %s: must be 0..%d or 'null'", cls, num_classes - 1);
    return TS_EINVAL;
}

int ts_local_class_prior(const ts_local_t *l, const int32_t *labels, int64_t n, int num_classes,
                         float **out, char *err, size_t errlen) {
    *out = NULL;
    if (!l->has_part) {
        ts_set_err(err, errlen,
                   "class-aware routing needs %s/partition.safetensors (the "
                   "clusters' class mix)",
                   l->dir);
        return TS_ENOTFOUND;
    }
    int K = l->part.K, C = num_classes;
    if (n != l->part.n) {
        ts_set_err(err, errlen, "the partition assigns %lld images, the labels are for %lld",
                   (long long)l->part.n, (long long)n);
        return TS_EINVAL;
    }
    double *count = calloc((size_t)(C * K), sizeof *count);
    float *lp = calloc((size_t)((C + 1) * K), sizeof *lp);
    if (!count || !lp) {
        free(count);
        free(lp);
        return TS_ENOMEM;
    }
    for (int64_t i = 0; i < n; i++) {
        if (labels[i] < 0 || labels[i] >= C) {
            free(count);
            free(lp);
            ts_set_err(err, errlen, "label %d of image %lld is not a class 0..%d", (int)labels[i],
                       (long long)i, C - 1);
            return TS_ERANGE;
        }
        count[(size_t)labels[i] * K + l->part.assignment[i]] += 1.0;
    }
    for (int k = 0; k < K; k++)
        for (int y = 0; y < C; y++) /* add-one smoothing: p(y | k) = (n_yk + 1) / (n_k + C) */
            lp[(size_t)y * K + k] =
                (float)log((count[(size_t)y * K + k] + 1.0) / ((double)l->part.sizes[k] + C));
    free(count);
    *out = lp; /* row C (the null label) stays 0 */
    return TS_OK;
}

int ts_local_generate(ts_local_t *l, ts_engine_t *e, const ts_local_gen_t *g, float *images,
                      ts_local_stats_t *stats, char *err, size_t errlen) {
    const ts_dit_config_t *c = &l->cfg;
    int64_t chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    int distance = g->policy == TS_POLICY_CENTROID || g->policy == TS_POLICY_CONFIDENCE;
    double t0 = ts_now_s();
    int64_t forwards = 0, router_evals = 0, sample_evals = 0, absent_routed = 0;
    double policy_s = 0.0, combine_s = 0.0;
    int learned_variance = 0;
    int rc = TS_OK;
    for (int start = 0; start < g->n && rc == TS_OK; start += l->chunk) {
        int m = g->n - start < l->chunk ? g->n - start : l->chunk;
        if (g->chunk_start)
            *g->chunk_start = start;
        ts_ensemble_opts_t o = {.policy = g->policy,
                                .select = g->select,
                                .tau = g->tau,
                                .cfg_scale = g->cfg,
                                .labels = g->labels + start,
                                .n = m,
                                .router = l->has_router ? ts_classifier_router_fn : NULL,
                                .router_ctx = l->has_router ? (void *)&l->rr : NULL,
                                .partition = l->has_part ? &l->part : NULL,
                                .log_prior = l->ex.K > 1 ? g->log_prior : NULL,
                                .record = g->record,
                                .eval = l->eval,
                                .hold = g->hold,
                                .hold_t = g->hold_t,
                                .seeds = g->seeds + start,
                                .eval_ctx = l->eval_ctx,
                                .config = &l->cfg,
                                .absent = l->absent,
                                .exact_guidance = g->exact_guidance,
                                .objectives = l->ex.objective,
                                .variance = g->sampler.kind == TS_SAMPLER_DDPM,
                                .learn_sigma = l->eval ? l->learn_sigma : NULL};
        if (l->has_router)
            l->rr.temperature = g->router_temp > 0.0f ? g->router_temp : 1.0f;
        /* one expert needs no scores: route it uniformly whatever the policy asks */
        if (l->ex.K == 1 || (distance && !l->has_part))
            o.policy = TS_POLICY_UNIFORM;
        ts_ensemble_t ens;
        ts_tensor_t x = {0}, scratch[3] = {{0}};
        rc = ts_ensemble_init(&ens, e, l->ex.models, l->ex.K, &o, err, errlen);
        if (rc != TS_OK)
            break;
        rc = ts_tensor_alloc(&x, TS_F32, e->device, 4,
                             TS_SHAPE(m, c->in_channels, c->input_size, c->input_size));
        for (int i = 0; i < 3 && rc == TS_OK; i++)
            rc = ts_tensor_alloc(&scratch[i], TS_F32, e->device, 4, x.shape);
        if (rc == TS_OK)
            rc = ts_sampler_noise(e, &x, g->seeds + start);
        ts_sampler_opts_t so = g->sampler;
        so.seeds = g->seeds + start; /* DDPM's draws: each sample's own stream */
        if (so.kind == TS_SAMPLER_DDPM && ts_ensemble_has_variance(&ens)) {
            so.variance = ts_ensemble_variance; /* DiT's learned σ, as its own sampling */
            so.variance_ctx = &ens;
            learned_variance = 1;
        }
        if (rc == TS_OK)
            rc = ts_sampler_run(e, &so, &x, scratch, ts_ensemble_velocity, &ens, g->on_step,
                                g->step_ctx);
        if (rc == TS_OK) {
            ts_tensor_t host;
            rc = ts_tensor_wrap(&host, images + start * chw, TS_F32, TS_CPU, 4, x.shape);
            if (rc == TS_OK)
                rc = ts_tensor_copy(&host, &x);
        }
        if (rc == TS_OK) {
            forwards += ens.forwards;
            router_evals += ens.router_calls * m;
            sample_evals += ens.evaluations * m;
            for (int k = 0; stats && stats->absent_mass && ens.absent_mass && k < l->ex.K; k++)
                stats->absent_mass[k] += ens.absent_mass[k];
            absent_routed += ens.absent_routed;
            policy_s += ens.policy_s;
            combine_s += ens.combine_s;
            for (int k = 0; stats && stats->use && k < l->ex.K; k++)
                stats->use[k] += ens.expert_forwards[k];
            if (g->on_chunk)
                g->on_chunk(g->chunk_ctx, &ens, start);
        } else if (err && !*err) {
            ts_set_err(err, errlen, "generation failed");
        }
        for (int i = 0; i < 3; i++)
            ts_tensor_free(&scratch[i]);
        ts_tensor_free(&x);
        ts_ensemble_free(&ens);
    }
    if (stats) {
        stats->forwards = forwards;
        stats->router_evals = router_evals;
        stats->sample_evals = sample_evals;
        stats->absent_routed = absent_routed;
        stats->seconds = ts_now_s() - t0;
        stats->policy_s = policy_s;
        stats->combine_s = combine_s;
        stats->learned_variance = learned_variance;
    }
    return rc;
}

int ts_local_set_attention(ts_local_t *l, const char *choice, const char *prog, char *err,
                           size_t errlen) {
    if (!l->ex.models)
        return TS_OK;
    return ts_cli_attention(l->ex.models, l->ex.K, choice, prog, err, errlen);
}

int ts_local_set_precision(ts_local_t *l, ts_precision_t p, const char *prog, char *err,
                           size_t errlen) {
    if (!l->ex.models)
        return TS_OK;
    return ts_cli_precision(l->ex.models, l->ex.K, p, prog, err, errlen);
}
