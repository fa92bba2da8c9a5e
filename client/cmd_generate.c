/*
 * cmd_generate.c — `tessera generate --local DIR`: routed generation from an ensemble of experts
 * in this process (DESIGN §3, model/ensemble.h), written as a PNG grid.
 *
 * The folder DIR holds:
 *   partition.safetensors   the partition artifact (`tessera partition`): PCA basis, mean, the K
 *                           centroids. Required by --policy centroid and confidence; when present
 *                           its K must equal the number of experts.
 *   expert-<k>.safetensors  the experts, k = 0..K−1 (`tessera train --shard`), taken in k order;
 *                           when there is no expert-0.safetensors, every other *.safetensors with
 *                           a metadata "cluster" is an expert, ordered by that cluster.
 *   router.safetensors      optional: the router (`tessera train-router`), required by --policy
 *                           learned; the centroid policy uses it for its first step.
 *
 * Sample i starts from the noise stream seed + i with the labels of `tessera sample` (cycling
 * through the classes, or --class), so a one-expert folder reproduces `tessera sample` bit for
 * bit, and samples are generated in chunks of 64 without the chunking changing any result
 * (routing is per sample). The summary on stderr (and --json on stdout) gives the expert
 * evaluations per sample and how the sample-forwards spread over the experts; --routing-json
 * writes every evaluation's t and, per sample, the selected experts and their weights.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/args.h"
#include "client/commands.h"
#include "model/classifier.h"
#include "model/ensemble.h"
#include "model/png.h"
#include "model/safetensors.h"
#include "model/sampler.h"

#define PROG "tessera generate"
#define CHUNK 64 /* samples per ensemble call (each expert runs at most twice that with CFG) */

typedef struct {
    int tty;
    int done, total;
} progress_t;

static int on_step(void *ctx, int step, int steps) {
    progress_t *p = ctx;
    p->done++;
    if (p->tty)
        fprintf(stderr, "\rgenerating: step %d/%d (total %d/%d)   ", step, steps, p->done,
                p->total);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

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
        if (!file_exists(path))
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

/* The routing record of all chunks: w[(e · N + i) · K + k] for evaluation e, sample i. */
typedef struct {
    int n_eval, N, K;
    float *t;
    ts_policy_t *policy;
    float *w;
} record_t;

static void record_chunk(record_t *r, const ts_ensemble_t *ens, int start) {
    for (int e = 0; e < ens->n_steps && e < r->n_eval; e++) {
        r->t[e] = ens->steps[e].t;
        r->policy[e] = ens->steps[e].policy;
        memcpy(r->w + ((size_t)e * r->N + start) * r->K, ens->steps[e].w,
               (size_t)ens->n * r->K * sizeof(float));
    }
}

static int write_routing_json(const char *path, const record_t *r, json_t *header, char *err,
                              size_t errlen) {
    json_t *root = json_deep_copy(header), *evals = json_array();
    if (!root || !evals) {
        json_decref(root);
        json_decref(evals);
        return TS_ENOMEM;
    }
    for (int e = 0; e < r->n_eval; e++) {
        json_t *samples = json_array();
        for (int i = 0; i < r->N; i++) {
            const float *w = r->w + ((size_t)e * r->N + i) * r->K;
            json_t *ks = json_array(), *ws = json_array();
            for (int k = 0; k < r->K; k++)
                if (w[k] != 0.0f) {
                    json_array_append_new(ks, json_integer(k));
                    json_array_append_new(ws, json_real(w[k]));
                }
            json_array_append_new(samples, json_pack("{s:o, s:o}", "experts", ks, "weights", ws));
        }
        json_array_append_new(evals, json_pack("{s:i, s:f, s:s, s:o}", "eval", e, "t",
                                               (double)r->t[e], "policy",
                                               ts_policy_name(r->policy[e]), "samples", samples));
    }
    json_object_set_new(root, "routing", evals);
    int rc = json_dump_file(root, path, JSON_COMPACT) == 0 ? TS_OK : TS_EIO;
    if (rc)
        ts_set_err(err, errlen, "--routing-json %s: cannot write the file", path);
    json_decref(root);
    return rc;
}

int ts_cmd_generate(int argc, char **argv) {
    const char *dir = NULL, *policy_s = "learned", *select_s = "top1", *sampler = "heun";
    const char *cls = NULL, *out = NULL, *routing_json = NULL;
    int n = 64, steps = 30, threads = 0, cols = 0, json = 0;
    float cfg = 1.0f, tau = 0.0f;
    uint64_t seed = 0;
    ts_arg_t args[] = {
        {"local", TS_ARG_STRING, &dir, "DIR", "the folder: partition.safetensors, expert-<k>.safetensors (k = 0..K-1, or any .safetensors with metadata cluster), optional router.safetensors", 0, 0, 1},
        {"policy", TS_ARG_STRING, &policy_s, "NAME", "learned (router), centroid (distance of x0-hat to the centroids), confidence (every expert every step), uniform (default learned)"},
        {"select", TS_ARG_STRING, &select_s, "SEL", "top1, topK, full, threshold=p, or a schedule like \"t>0.7:full,t>0.3:top2,top1\" (default top1)"},
        {"tau", TS_ARG_FLOAT, &tau, "T", "temperature of centroid/confidence: w ~ exp(-d2/T) (default: the partition's mean squared distance of an image to its centroid)", 0, 1e30},
        {"n", TS_ARG_INT, &n, "N", "number of samples (default 64)", 1, 100000},
        {"steps", TS_ARG_INT, &steps, "S", "integration steps (default 30)", 1, 10000},
        {"sampler", TS_ARG_STRING, &sampler, "NAME", "euler or heun (default heun)"},
        {"cfg", TS_ARG_FLOAT, &cfg, "S", "classifier-free guidance scale inside each expert, 1 = off (default 1)", 0, 100},
        {"class", TS_ARG_STRING, &cls, "C", "class label, or 'null' (default: cycle through classes)"},
        {"seed", TS_ARG_U64, &seed, "S", "sample i uses noise stream seed+i (default 0)"},
        {"out", TS_ARG_STRING, &out, "FILE", "PNG grid to write", 0, 0, 1},
        {"cols", TS_ARG_INT, &cols, "N", "grid columns (default: square)", 0, 10000},
        {"routing-json", TS_ARG_STRING, &routing_json, "FILE", "write every evaluation's routing (t; per sample the experts and weights) as JSON"},
        {"json", TS_ARG_FLAG, &json, NULL, "print a JSON summary on stdout"},
        {"threads", TS_ARG_INT, &threads, "N", "compute threads (default: all cores)", 0, 1024},
    };
    int pr = ts_args_parse(PROG,
                           "Generate images with a routed ensemble of local experts (per step, per "
                           "sample) and write a grid.",
                           args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr)
        return pr == 1 ? 0 : 2;
    char err[1024] = "";
    ts_policy_t policy;
    ts_selection_t sel;
    ts_sampler_opts_t so = {.steps = steps};
    if (ts_policy_parse(policy_s, &policy) != TS_OK) {
        fprintf(stderr, PROG ": --policy %s: must be learned, centroid, confidence or uniform\n",
                policy_s);
        return 2;
    }
    if (ts_selection_parse(select_s, &sel, err, sizeof err) != TS_OK) {
        fprintf(stderr, PROG ": --select: %s\n", err);
        return 2;
    }
    if (ts_sampler_parse(sampler, &so.kind) != TS_OK) {
        fprintf(stderr, PROG ": --sampler %s: must be euler or heun\n", sampler);
        return 2;
    }
    if (args[3].seen && !(tau > 0.0f)) {
        fprintf(stderr, PROG ": --tau %g: must be > 0\n", (double)tau);
        return 2;
    }

    ts_engine_t eng = {0};
    ts_engine_opts_t eo = {TS_CPU, threads, 0};
    ts_experts_t ex = {0};
    ts_partition_t part = {0};
    ts_classifier_t *router = NULL;
    ts_classifier_router_t rr = {0};
    char **paths = NULL;
    int n_paths = 0, has_part = 0, has_router = 0;
    int chunk = n < CHUNK ? n : CHUNK, pairs = cfg != 1.0f ? 2 : 1;
    float *images = NULL;
    int32_t *labels = NULL;
    uint64_t *seeds = NULL;
    record_t rec = {0};
    int64_t *use = NULL;
    int rc = ts_engine_init(&eng, &eo), usage = 0;
    char path[4096];

    /* the folder: experts, partition, router */
    if (rc == TS_OK)
        rc = find_experts(dir, &paths, &n_paths, err, sizeof err);
    if (rc == TS_OK)
        rc = ts_experts_open(&ex, (const char *const *)paths, n_paths, &eng, pairs * chunk, err,
                             sizeof err);
    snprintf(path, sizeof path, "%s/partition.safetensors", dir);
    if (rc == TS_OK && file_exists(path)) {
        rc = ts_partition_load(path, &part, err, sizeof err);
        has_part = rc == TS_OK;
    }
    int distance = policy == TS_POLICY_CENTROID || policy == TS_POLICY_CONFIDENCE;
    if (rc == TS_OK && distance && !has_part) {
        ts_set_err(err, sizeof err,
                   "--policy %s needs %s (the partition's embedding and centroids): run "
                   "`tessera partition --experts %d --out %s`, or use --policy learned or uniform",
                   policy_s, path, ex.K, dir);
        rc = TS_ENOTFOUND;
    }
    snprintf(path, sizeof path, "%s/router.safetensors", dir);
    int wants_router = policy == TS_POLICY_LEARNED || policy == TS_POLICY_CENTROID;
    if (rc == TS_OK && wants_router && file_exists(path)) {
        rc = ts_classifier_open(&router, path, &eng, chunk, err, sizeof err);
        if (rc == TS_OK && ts_classifier_num_outputs(router) != ex.K) {
            ts_set_err(err, sizeof err,
                       "%s routes over %d clusters but %s holds %d experts: train the router on "
                       "this folder's partition",
                       path, ts_classifier_num_outputs(router), dir, ex.K);
            rc = TS_EINVAL;
        }
        if (rc == TS_OK)
            rc = ts_classifier_router_init(&rr, router, &eng, chunk);
        has_router = rc == TS_OK;
    }
    if (rc == TS_OK && policy == TS_POLICY_LEARNED && !has_router) {
        ts_set_err(err, sizeof err,
                   "--policy learned needs a router and %s has none: train one with `tessera "
                   "train-router --partition %s --out %s`, or use --policy centroid or uniform",
                   dir, dir, path);
        rc = TS_ENOTFOUND;
    }
    if (rc != TS_OK)
        goto done;

    /* warnings: what is missing or does not match */
    if (policy == TS_POLICY_CENTROID && !has_router)
        fprintf(stderr, PROG ": note: no router in %s: the centroid policy's first step (pure "
                        "noise, no estimate yet) routes uniformly\n", dir);
    if (policy == TS_POLICY_CONFIDENCE)
        fprintf(stderr, PROG ": note: the confidence policy runs all %d experts at every step\n",
                ex.K);
    for (int k = 0; k < ex.K && has_part; k++)
        if (ex.partition_id[k] && strcmp(ex.partition_id[k], part.id) != 0)
            fprintf(stderr, PROG ": warning: %s was trained on partition %.12s…, not this "
                            "folder's %.12s…\n", ex.paths[k], ex.partition_id[k], part.id);
    if (has_router && has_part) {
        const char *pid = ts_classifier_meta(router, "partition_id");
        if (pid && strcmp(pid, part.id) != 0)
            fprintf(stderr, PROG ": warning: the router was trained on partition %.12s…, not "
                            "this folder's %.12s…\n", pid, part.id);
    }
    if (!args[3].seen)
        tau = has_part && part.n > 0 && part.inertia > 0.0 ? (float)(part.inertia / part.n)
                                                           : 1.0f;

    const ts_dit_config_t *c = &ex.models[0].cfg;
    int label = -1;
    if (cls && strcmp(cls, "null") == 0) {
        label = c->num_classes;
    } else if (cls) {
        char *end;
        long v = strtol(cls, &end, 10);
        if (*end || v < 0 || v >= c->num_classes) {
            ts_set_err(err, sizeof err, "--class %s: must be 0..%d or 'null'", cls,
                       c->num_classes - 1);
            rc = TS_EINVAL;
            usage = 1;
            goto done;
        }
        label = (int)v;
    }
    int64_t chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    images = malloc((size_t)(n * chw) * sizeof *images);
    labels = malloc((size_t)n * sizeof *labels);
    seeds = malloc((size_t)n * sizeof *seeds);
    use = calloc((size_t)ex.K, sizeof *use);
    if (!images || !labels || !seeds || !use) {
        rc = TS_ENOMEM;
        goto done;
    }
    for (int i = 0; i < n; i++) {
        labels[i] = label >= 0 ? label : i % c->num_classes;
        seeds[i] = seed + (uint64_t)i;
    }
    if (routing_json) {
        rec.n_eval = steps * (so.kind == TS_SAMPLER_HEUN ? 2 : 1);
        rec.N = n;
        rec.K = ex.K;
        rec.t = calloc((size_t)rec.n_eval, sizeof *rec.t);
        rec.policy = calloc((size_t)rec.n_eval, sizeof *rec.policy);
        rec.w = calloc((size_t)rec.n_eval * n * ex.K, sizeof *rec.w);
        if (!rec.t || !rec.policy || !rec.w) {
            rc = TS_ENOMEM;
            goto done;
        }
    }

    /* generation, chunk by chunk */
    progress_t prog = {isatty(STDERR_FILENO), 0, steps * ((n + chunk - 1) / chunk)};
    double t0 = now_s();
    int64_t forwards = 0, router_calls = 0;
    for (int start = 0; start < n && rc == TS_OK; start += chunk) {
        int m = n - start < chunk ? n - start : chunk;
        ts_ensemble_opts_t o = {.policy = policy, .select = sel, .tau = tau, .cfg_scale = cfg,
                                .labels = labels + start, .n = m,
                                .router = has_router ? ts_classifier_router_fn : NULL,
                                .router_ctx = has_router ? &rr : NULL,
                                .partition = has_part ? &part : NULL,
                                .record = routing_json != NULL};
        ts_ensemble_t ens;
        ts_tensor_t x = {0}, scratch[3] = {{0}};
        rc = ts_ensemble_init(&ens, &eng, ex.models, ex.K, &o, err, sizeof err);
        if (rc != TS_OK)
            break;
        rc = ts_tensor_alloc(&x, TS_F32, eng.device, 4,
                             TS_SHAPE(m, c->in_channels, c->input_size, c->input_size));
        for (int i = 0; i < 3 && rc == TS_OK; i++)
            rc = ts_tensor_alloc(&scratch[i], TS_F32, eng.device, 4, x.shape);
        if (rc == TS_OK)
            rc = ts_sampler_noise(&eng, &x, seeds + start);
        if (rc == TS_OK)
            rc = ts_sampler_run(&eng, &so, &x, scratch, ts_ensemble_velocity, &ens, on_step,
                                &prog);
        if (rc == TS_OK) {
            ts_tensor_t host;
            rc = ts_tensor_wrap(&host, images + start * chw, TS_F32, TS_CPU, 4, x.shape);
            if (rc == TS_OK)
                rc = ts_tensor_copy(&host, &x);
        }
        if (rc == TS_OK) {
            forwards += ens.forwards;
            router_calls += ens.router_calls * m;
            for (int k = 0; k < ex.K; k++)
                use[k] += ens.expert_forwards[k];
            if (routing_json)
                record_chunk(&rec, &ens, start);
        } else if (!*err) {
            ts_set_err(err, sizeof err, "generation failed");
        }
        for (int i = 0; i < 3; i++)
            ts_tensor_free(&scratch[i]);
        ts_tensor_free(&x);
        ts_ensemble_free(&ens);
    }
    double secs = now_s() - t0;
    if (prog.tty)
        fprintf(stderr, "\n");
    if (rc == TS_OK)
        rc = ts_png_write_grid(out, images, n, c->in_channels, c->input_size, c->input_size, cols,
                               2, err, sizeof err);
    if (rc != TS_OK)
        goto done;

    char sel_text[256];
    ts_selection_format(&sel, sel_text, sizeof sel_text);
    double evals = (double)forwards / n;
    json_t *summary = json_pack("{s:i, s:i, s:i, s:s, s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:s}",
                                "n", n, "experts", ex.K, "steps", steps, "sampler", sampler,
                                "policy", ts_policy_name(policy), "selection", sel_text, "tau",
                                (double)tau, "cfg", (double)cfg, "evals_per_sample", evals,
                                "router_evals_per_sample", (double)router_calls / n, "seconds",
                                secs, "out", out);
    json_t *share = json_array();
    fprintf(stderr,
            "%d samples, %d %s steps, policy %s, selection %s, cfg %g: %.1f expert evaluations "
            "per sample, %.2f s (%.1f samples/s) → %s\nexpert use:",
            n, steps, sampler, ts_policy_name(policy), sel_text, (double)cfg, evals, secs,
            n / secs, out);
    for (int k = 0; k < ex.K; k++) {
        double f = forwards > 0 ? (double)use[k] / (double)forwards : 0.0;
        fprintf(stderr, " %d:%.0f%%", k, 100.0 * f);
        json_array_append_new(share, json_real(f));
    }
    fprintf(stderr, "\n");
    if (summary)
        json_object_set_new(summary, "expert_share", share);
    else
        json_decref(share);
    if (routing_json && summary) {
        rc = write_routing_json(routing_json, &rec, summary, err, sizeof err);
        if (rc == TS_OK)
            fprintf(stderr, "routing → %s\n", routing_json);
    }
    if (json && summary) {
        json_dumpf(summary, stdout, JSON_COMPACT);
        printf("\n");
    }
    json_decref(summary);

done:
    if (rc != TS_OK)
        fprintf(stderr, PROG ": %s%s%s\n", err, *err ? ": " : "", ts_strerror(rc));
    free(images);
    free(labels);
    free(seeds);
    free(use);
    free(rec.t);
    free(rec.policy);
    free(rec.w);
    ts_classifier_router_free(&rr);
    ts_classifier_free(router);
    if (has_part)
        ts_partition_free(&part);
    ts_experts_free(&ex);
    free_list(paths, n_paths);
    ts_engine_free(&eng);
    return rc == TS_OK ? 0 : usage ? 2 : 1;
}
