/*
 * cmd_partition.c — `tessera partition`: cluster the Fashion-MNIST train set into K shards.
 *
 * Embeds the 60000 training images with PCA, clusters them with k-means++ (or the hierarchical
 * variant), and writes into --out:
 *   partition.safetensors   the artifact (model/partition.h); its BLAKE2b-256 is the partition_id
 *   shard-<k>.txt           the image indices of cluster k, for `tessera train --shard`
 *   clusters.png            one row of 10 example images per cluster (evenly spaced members)
 * Progress goes to stderr; the result — per cluster its size, share and class mix, then the
 * partition_id — to stdout as a table, or as one JSON object with --json. The same data, seed and
 * options give the same bytes and the same partition_id for any --threads.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "client/args.h"
#include "client/commands.h"
#include "client/judges.h"
#include "model/fmnist.h"
#include "model/shard.h"
#include "model/partition.h"
#include "model/png.h"
#include "model/trainer.h"

#define PROG "tessera partition"
#define EXAMPLES 10 /* images per cluster in clusters.png */

typedef struct {
    double t0;
} progress_t;

static void on_progress(void *ctx, const char *line) {
    const progress_t *p = ctx;
    fprintf(stderr, "[%7.1f s] %s\n", ts_now_s() - p->t0, line);
}

/* Creates dir if needed (one level) and checks that it is a writable folder. */
static int prepare_out(const char *dir, char *err, size_t errlen) {
    struct stat st;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create the output folder '%s': %s", dir, strerror(errno));
        return TS_EIO;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "--out '%s' is not a folder", dir);
        return TS_EIO;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, errlen, "the output folder '%s' is not writable: %s", dir, strerror(errno));
        return TS_EIO;
    }
    return TS_OK;
}

/* --embed: "pca" or "pcaN". Returns N (0 for plain "pca"), or −1. */
static int parse_embed(const char *s) {
    if (strncmp(s, "pca", 3) != 0)
        return -1;
    if (!s[3])
        return 0;
    char *end;
    long v = strtol(s + 3, &end, 10);
    return *end || v < 1 || v > 100000 || s[3] == '+' || s[3] == '-' ? -1 : (int)v;
}

/* One shard file per cluster: the indices of its images, in increasing order
 * (ts_partition_members, which is also what `tessera train --partition` and tesserad train on). */
static int write_shards(const ts_partition_t *p, const char *dir, char *err, size_t errlen) {
    int rc = TS_OK;
    for (int k = 0; k < p->K && rc == TS_OK; k++) {
        int32_t *idx = NULL;
        int m = 0;
        char path[4096];
        snprintf(path, sizeof path, "%s/shard-%d.txt", dir, k);
        if ((rc = ts_partition_members(p, k, &idx, &m)) == TS_OK)
            rc = ts_shard_write(path, idx, m, err, errlen);
        free(idx);
    }
    return rc;
}

/* clusters.png: row k holds EXAMPLES members of cluster k, evenly spaced through its images in
 * index order (a short cluster leaves grey cells). */
static int write_examples(const ts_partition_t *p, const ts_dataset_t *ds, const char *dir,
                          char *err, size_t errlen) {
    size_t hw = (size_t)ds->height * ds->width;
    float *grid = calloc((size_t)p->K * EXAMPLES * hw, sizeof *grid); /* 0.0 is background grey */
    int32_t *members = malloc((size_t)p->n * sizeof *members);
    int rc = grid && members ? TS_OK : TS_ENOMEM;
    for (int k = 0; k < p->K && rc == TS_OK; k++) {
        int m = 0;
        for (int64_t i = 0; i < p->n; i++)
            if (p->assignment[i] == k)
                members[m++] = (int32_t)i;
        for (int j = 0; j < EXAMPLES && j < m; j++) {
            int64_t pick = members[m <= EXAMPLES ? j : (int64_t)j * m / EXAMPLES];
            memcpy(grid + ((size_t)k * EXAMPLES + j) * hw, ds->images + (size_t)pick * hw,
                   hw * sizeof *grid);
        }
    }
    if (rc == TS_OK) {
        char path[4096];
        snprintf(path, sizeof path, "%s/clusters.png", dir);
        rc = ts_png_write_grid(path, grid, p->K * EXAMPLES, 1, ds->height, ds->width, EXAMPLES, 2,
                               err, errlen);
    }
    free(grid);
    free(members);
    return rc;
}

/* Class c's name: Fashion-MNIST's, or "class c" for a latent data set's labels. */
static const char *class_name(int fmnist, int c, char *buf, size_t len) {
    if (fmnist)
        return ts_fmnist_class_name(c);
    snprintf(buf, len, "class %d", c);
    return buf;
}

static void print_table(const ts_partition_t *p, const int64_t *mix, int C, int fmnist,
                        const char *dir, double secs) {
    char nb[32];
    printf("partition of %s: %lld images into K = %d clusters; %s (%.2f %% of the variance); "
           "seed %llu, %d restart%s%s",
           p->dataset, (long long)p->n, p->K, p->embed, 100.0 * p->explained,
           (unsigned long long)p->seed, p->restarts, p->restarts == 1 ? "" : "s",
           p->hierarchical ? ", hierarchical from " : "");
    if (p->hierarchical)
        printf("%d fine centroids", p->hierarchical);
    printf("; inertia %.6g; %.1f s\n\n", p->inertia, secs);
    printf("%7s %7s %7s", "cluster", "images", "share");
    for (int c = 0; c < C; c++) {
        const char *name = class_name(fmnist, c, nb, sizeof nb);
        printf("  %*s", (int)(strlen(name) > 6 ? strlen(name) : 6), name);
    }
    printf("\n");
    for (int k = 0; k < p->K; k++) {
        printf("%7d %7d %6.1f%%", k, p->sizes[k], 100.0 * p->sizes[k] / (double)p->n);
        for (int c = 0; c < C; c++) {
            size_t w = strlen(class_name(fmnist, c, nb, sizeof nb));
            printf("  %*.1f%%", (int)(w > 6 ? w : 6) - 1,
                   100.0 * (double)mix[(size_t)k * C + c] / p->sizes[k]);
        }
        printf("\n");
    }
    printf("\n(class columns: the share of each cluster's images in each class)\n");
    printf("partition_id %s\n", p->id);
    printf("wrote %s/partition.safetensors, %s/shard-{0..%d}.txt%s%s\n", dir, dir, p->K - 1,
           fmnist ? ", " : "", fmnist ? "clusters.png" : "");
}

static int print_json(const ts_partition_t *p, const int64_t *mix, int C, int fmnist,
                      const char *dir, double secs) {
    char nb[32];
    json_t *root = json_object(), *classes = json_array(), *clusters = json_array();
    if (!root || !classes || !clusters) {
        json_decref(root);
        json_decref(classes);
        json_decref(clusters);
        return TS_ENOMEM;
    }
    for (int c = 0; c < C; c++)
        json_array_append_new(classes, json_string(class_name(fmnist, c, nb, sizeof nb)));
    for (int k = 0; k < p->K; k++) {
        json_t *m = json_array();
        for (int c = 0; c < C; c++)
            json_array_append_new(m, json_real((double)mix[(size_t)k * C + c] / p->sizes[k]));
        char shard[4096];
        snprintf(shard, sizeof shard, "%s/shard-%d.txt", dir, k);
        json_array_append_new(clusters,
                              json_pack("{s:i, s:i, s:f, s:o, s:s}", "cluster", k, "size",
                                        p->sizes[k], "share", (double)p->sizes[k] / (double)p->n,
                                        "class_mix", m, "shard", shard));
    }
    char artifact[4096];
    snprintf(artifact, sizeof artifact, "%s/partition.safetensors", dir);
    json_object_set_new(root, "partition_id", json_string(p->id));
    json_object_set_new(root, "artifact", json_string(artifact));
    json_object_set_new(root, "dataset", json_string(p->dataset));
    json_object_set_new(root, "n", json_integer(p->n));
    json_object_set_new(root, "experts", json_integer(p->K));
    json_object_set_new(root, "embed", json_string(p->embed));
    json_object_set_new(root, "strategy", json_string(p->strategy));
    json_object_set_new(root, "explained_variance", json_real(p->explained));
    json_object_set_new(root, "seed", json_integer((json_int_t)p->seed));
    json_object_set_new(root, "restarts", json_integer(p->restarts));
    json_object_set_new(root, "hierarchical", json_integer(p->hierarchical));
    json_object_set_new(root, "inertia", json_real(p->inertia));
    json_object_set_new(root, "seconds", json_real(secs));
    json_object_set_new(root, "classes", classes);
    json_object_set_new(root, "clusters", clusters);
    json_dumpf(root, stdout, JSON_COMPACT);
    printf("\n");
    json_decref(root);
    return TS_OK;
}

/* --by label: the classes grouped into K clusters. K = 10: one class each. K < 10: starting from
 * one group per class, the two groups whose pixel means are nearest (squared distance, the
 * lower pair of indices on a tie) are merged, means weighted by their images, until K are left;
 * groups are then numbered by their smallest class. */
static int label_clusters(const ts_dataset_t *ds, int K, int32_t *assign, char *err,
                          size_t errlen) {
    enum { C = TS_FMNIST_NUM_CLASSES };
    if (K > C) {
        snprintf(err, errlen, "--by label: at most %d clusters (one per class), not %d", C, K);
        return TS_EINVAL;
    }
    int64_t D = (int64_t)ds->channels * ds->height * ds->width;
    double *mean = calloc((size_t)C * D, sizeof *mean);
    double w[C] = {0};
    int group[C], alive[C];
    if (!mean)
        return TS_ENOMEM;
    for (int i = 0; i < ds->n; i++) {
        w[ds->labels[i]] += 1.0;
        for (int64_t j = 0; j < D; j++)
            mean[ds->labels[i] * D + j] += ds->images[(int64_t)i * D + j];
    }
    for (int c = 0; c < C; c++) {
        group[c] = c;
        alive[c] = w[c] > 0;
        for (int64_t j = 0; j < D && w[c] > 0; j++)
            mean[c * D + j] /= w[c];
    }
    int groups = 0;
    for (int c = 0; c < C; c++)
        groups += alive[c];
    while (groups > K) {
        int ba = -1, bb = -1;
        double best = INFINITY;
        for (int a = 0; a < C; a++)
            for (int b = a + 1; b < C; b++) {
                if (!alive[a] || !alive[b])
                    continue;
                double d = 0.0;
                for (int64_t j = 0; j < D; j++)
                    d += (mean[a * D + j] - mean[b * D + j]) * (mean[a * D + j] - mean[b * D + j]);
                if (d < best)
                    best = d, ba = a, bb = b;
            }
        for (int64_t j = 0; j < D; j++)
            mean[ba * D + j] =
                (w[ba] * mean[ba * D + j] + w[bb] * mean[bb * D + j]) / (w[ba] + w[bb]);
        w[ba] += w[bb];
        alive[bb] = 0;
        for (int c = 0; c < C; c++)
            if (group[c] == bb)
                group[c] = ba;
        groups--;
    }
    free(mean);
    if (groups < K) {
        snprintf(err, errlen, "--by label: the data has %d classes, fewer than K = %d", groups, K);
        return TS_EINVAL;
    }
    int number[C], next = 0;
    for (int c = 0; c < C; c++)
        number[c] = -1;
    for (int c = 0; c < C; c++)
        if (number[group[c]] < 0 && w[group[c]] > 0)
            number[group[c]] = next++;
    for (int i = 0; i < ds->n; i++)
        assign[i] = number[group[ds->labels[i]]];
    return TS_OK;
}

/* --by random: a Philox permutation of the images (seed), image perm[i] in cluster i mod K: K
 * clusters of equal size (±1) that know nothing of the images. */
static int random_clusters(int n, int K, uint64_t seed, int32_t *assign) {
    int32_t *perm = malloc((size_t)n * sizeof *perm);
    if (!perm)
        return TS_ENOMEM;
    ts_epoch_permutation(ts_stream_key(seed, 77), 0, n, perm);
    for (int i = 0; i < n; i++)
        assign[perm[i]] = i % K;
    free(perm);
    return TS_OK;
}

/* --features FILE: the features (n, D) of the clean images in a network's space — a classifier's
 * penultimate layer (`tessera train-classifier`), a judge's (`tessera train-judge`: a cnn's, or
 * an autoencoder's bottleneck, a space learned without labels). */
static int network_features(const char *path, const ts_dataset_t *ds, int threads, float **out,
                            int *dims, char *err, size_t errlen) {
    enum { B = 256 };
    ts_engine_t eng = {0};
    ts_engine_opts_t eo = {TS_CPU, threads, 0};
    ts_cli_judge_t j = {0};
    float *feat = NULL;
    int rc = ts_engine_init(&eng, &eo);
    if (rc == TS_OK)
        rc = ts_cli_judge_open(&j, path, &eng, B, ds->channels, ds->height, ds->width, err, errlen);
    if (rc == TS_OK && !(feat = malloc((size_t)ds->n * j.D * sizeof *feat)))
        rc = TS_ENOMEM;
    if (rc == TS_OK)
        rc = ts_cli_judge_features(&j, &eng, ds->images, ds->n, ds->channels, ds->height, ds->width,
                                   feat);
    *dims = j.D;
    ts_cli_judge_close(&j);
    ts_engine_free(&eng);
    if (rc != TS_OK) {
        free(feat);
        return rc;
    }
    *out = feat;
    return TS_OK;
}

/* ---- the verb: parse → validate → run → print ---------------------------------------------- */

typedef struct {
    const char *data, *out, *embed, *by, *features, *latents;
    int experts, dims, hierarchical, restarts, max_iter, threads, json;
    int embed_set, dims_set; /* --embed, --dims given */
    uint64_t seed;
} part_opts_t;

/* Everything one run loads and makes (part_free releases it all). */
typedef struct {
    part_opts_t o;
    progress_t prog;
    ts_dataset_t ds;
    ts_partition_opts_t po;
    ts_partition_t part;
    int64_t *mix; /* (K, classes) images of each class in each cluster */
    int32_t *given;
    float *space;
    char dataset[64]; /* the partition's dataset: Fashion-MNIST's train split, or a latent file */
    char path[4096];
    char err[1024];
} part_run_t;

/* The options from the command line: TS_ARGS_RUN, or the exit code (ts_args_parse). */
static int parse_opts(int argc, char **argv, part_opts_t *o) {
    *o = (part_opts_t){.data = TS_FMNIST_DEFAULT_DIR,
                       .embed = "pca64",
                       .by = "kmeans",
                       .dims = TS_PARTITION_DEFAULT_DIMS,
                       .restarts = TS_PARTITION_DEFAULT_RESTARTS,
                       .max_iter = TS_PARTITION_DEFAULT_MAX_ITER};
    ts_arg_t args[] = {
        {"data", TS_ARG_STRING, &o->data, "DIR",
         "Fashion-MNIST IDX directory (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"latents", TS_ARG_STRING, &o->latents, "FILE",
         "cluster a latent data set of `tessera encode` instead of Fashion-MNIST (its experts "
         "train with `tessera train --latents FILE --partition DIR`)"},
        {"experts", TS_ARG_INT, &o->experts, "K", "number of clusters, one expert each", 1, 1e6, 1},
        {"embed", TS_ARG_STRING, &o->embed, "NAME",
         "embedding: pca, or pcaN for N dims (default pca64)"},
        {"dims", TS_ARG_INT, &o->dims, "N", "PCA dims (default 64; must agree with --embed pcaN)",
         1, 100000},
        {"hierarchical", TS_ARG_INT, &o->hierarchical, "FINE",
         "DDM's variant: FINE fine centroids merged into K (default 0 = off)", 0, 1e7},
        {"restarts", TS_ARG_INT, &o->restarts, "R",
         "k-means++ restarts, best inertia kept (default 8)", 1, 65535},
        {"max-iter", TS_ARG_INT, &o->max_iter, "N",
         "Lloyd iterations per restart at most (default 300)", 1, 1e7},
        {"seed", TS_ARG_U64, &o->seed, "S",
         "seed of the k-means++ draws and of --by random (default 0)"},
        {"by", TS_ARG_STRING, &o->by, "HOW",
         "kmeans (on the PCA embedding, or on --features), label (the classes, grouped by "
         "nearest means when K < 10) or random (equal shares; the control) (default kmeans)"},
        {"features", TS_ARG_STRING, &o->features, "FILE",
         "with --by kmeans: cluster a network's features of the images instead of the PCA "
         "embedding: a classifier (`tessera train-classifier`, never the evaluation "
         "classifier) or a judge (`tessera train-judge`; --kind ae learns without labels)"},
        {"threads", TS_ARG_INT, &o->threads, "N",
         "threads (default: all cores; the result does not depend on it)", 0, 1024},
        {"out", TS_ARG_STRING, &o->out, "DIR", "output folder (created if missing)", 0, 0, 1},
        {"json", TS_ARG_FLAG, &o->json, NULL, "print the result as one JSON object on stdout"},
    };
    int n = (int)(sizeof args / sizeof args[0]);
    int pr = ts_args_parse(PROG,
                           "Cluster the Fashion-MNIST train set (or a latent data set) into K "
                           "shards (PCA + k-means++).\n"
                           "example: tessera partition --experts 4 --out experts",
                           args, n, argc, argv);
    o->embed_set = ts_arg_seen(args, n, "embed");
    o->dims_set = ts_arg_seen(args, n, "dims");
    return pr;
}

/* What the options say, checked without the data: 0, or 2 with the message printed. --embed
 * pcaN sets the dims when given; the default (pca64) yields to --dims. */
static int validate(part_opts_t *o) {
    int from_embed = parse_embed(o->embed);
    if (from_embed < 0) {
        fprintf(stderr, PROG ": --embed %s: must be pca or pcaN (e.g. pca64)\n", o->embed);
        return 2;
    }
    if (!o->embed_set)
        from_embed = 0;
    if (from_embed > 0 && o->dims_set && o->dims != from_embed) {
        fprintf(stderr, PROG ": --embed %s and --dims %d disagree\n", o->embed, o->dims);
        return 2;
    }
    if (from_embed > 0)
        o->dims = from_embed;
    int kmeans = strcmp(o->by, "kmeans") == 0;
    if (!kmeans && strcmp(o->by, "label") != 0 && strcmp(o->by, "random") != 0)
        fprintf(stderr, PROG ": --by %s: must be kmeans, label or random\n", o->by);
    else if (o->features && !kmeans)
        fprintf(stderr, PROG ": --features goes with --by kmeans\n");
    else if (o->hierarchical > 0 && !kmeans)
        fprintf(stderr, PROG ": --hierarchical goes with --by kmeans\n");
    else if (o->hierarchical > 0 && o->hierarchical < o->experts)
        fprintf(stderr, PROG ": --hierarchical %d: needs at least K = %d fine centroids\n",
                o->hierarchical, o->experts);
    else
        return 0;
    return 2;
}

/* The train set, checked against the sizes asked for, and the output folder: 0, or the exit
 * code (1, 2) with the message printed. */
static int open_data(part_run_t *r) {
    const part_opts_t *o = &r->o;
    int rc = o->latents
                 ? ts_partition_latents(o->latents, &r->ds, r->dataset, NULL, r->err, sizeof r->err)
                 : ts_fmnist_load(o->data, "train", &r->ds, r->err, sizeof r->err);
    if (rc != TS_OK)
        return ts_args_fail(PROG, r->err, rc);
    if (!o->latents)
        snprintf(r->dataset, sizeof r->dataset, "%s", TS_PARTITION_FMNIST);
    if (strcmp(o->by, "label") == 0 && r->ds.num_classes > TS_FMNIST_NUM_CLASSES) {
        fprintf(stderr, PROG ": --by label: %s has %d classes; it groups at most %d\n", o->latents,
                r->ds.num_classes, TS_FMNIST_NUM_CLASSES);
        return 2;
    }
    int n = r->ds.n, D = r->ds.channels * r->ds.height * r->ds.width;
    const char *bad = o->experts > n ? "--experts" : o->hierarchical > n ? "--hierarchical" : NULL;
    if (bad) {
        fprintf(stderr, PROG ": %s %d: must be at most the %d images of the train set\n", bad,
                o->experts > n ? o->experts : o->hierarchical, n);
        return 2;
    }
    if (o->dims > D) {
        fprintf(stderr, PROG ": --dims %d: must be at most the %d values of an image\n", o->dims,
                D);
        return 2;
    }
    if (prepare_out(o->out, r->err, sizeof r->err) != TS_OK) {
        fprintf(stderr, PROG ": %s\n", r->err);
        return 1;
    }
    fprintf(stderr, "[%7.1f s] loaded %d training %s of %dx%dx%d from %s\n",
            ts_now_s() - r->prog.t0, n, o->latents ? "latents" : "images", r->ds.channels,
            r->ds.height, r->ds.width, o->latents ? o->latents : o->data);
    return 0;
}

/* The space or the assignment --by asks for, when it is not k-means on the PCA embedding. */
static int prepare_space(part_run_t *r) {
    const part_opts_t *o = &r->o;
    ts_partition_opts_t *po = &r->po;
    int rc = TS_OK;
    if (strcmp(o->by, "label") == 0 || strcmp(o->by, "random") == 0) {
        r->given = malloc((size_t)r->ds.n * sizeof *r->given);
        rc = !r->given ? TS_ENOMEM
             : strcmp(o->by, "label") == 0
                 ? label_clusters(&r->ds, o->experts, r->given, r->err, sizeof r->err)
                 : random_clusters(r->ds.n, o->experts, o->seed, r->given);
        po->assign = r->given;
        po->strategy = o->by;
    } else if (o->features) {
        rc = network_features(o->features, &r->ds, o->threads, &r->space, &po->space_dims, r->err,
                              sizeof r->err);
        po->space = r->space;
        po->strategy = "features";
        if (rc == TS_OK)
            fprintf(stderr, "[%7.1f s] features of %s: %d dims\n", ts_now_s() - r->prog.t0,
                    o->features, po->space_dims);
    }
    return rc;
}

/* The partition, its files in --out, and the class mix of its clusters. */
static int run(part_run_t *r) {
    const part_opts_t *o = &r->o;
    int D = r->ds.channels * r->ds.height * r->ds.width;
    r->po = (ts_partition_opts_t){.experts = o->experts,
                                  .dims = o->dims,
                                  .hierarchical = o->hierarchical,
                                  .restarts = o->restarts,
                                  .max_iter = o->max_iter,
                                  .seed = o->seed,
                                  .threads = o->threads,
                                  .dataset = r->dataset,
                                  .progress = on_progress,
                                  .ctx = &r->prog};
    snprintf(r->path, sizeof r->path, "%s/partition.safetensors", o->out);
    int rc = prepare_space(r);
    if (rc == TS_OK)
        rc = ts_partition_fit(r->ds.images, r->ds.n, D, &r->po, &r->part, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = ts_partition_save(&r->part, r->path, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = write_shards(&r->part, o->out, r->err, sizeof r->err);
    if (rc == TS_OK && !o->latents) /* latents are no picture without their VAE */
        rc = write_examples(&r->part, &r->ds, o->out, r->err, sizeof r->err);
    int C = r->ds.num_classes;
    if (rc == TS_OK && !(r->mix = calloc((size_t)r->part.K * (size_t)C, sizeof *r->mix)))
        rc = TS_ENOMEM;
    for (int64_t i = 0; rc == TS_OK && i < r->part.n; i++)
        r->mix[(size_t)r->part.assignment[i] * (size_t)C + r->ds.labels[i]]++;
    return rc;
}

/* The last progress line, then the table or the JSON object. */
static int print_results(const part_run_t *r) {
    double secs = ts_now_s() - r->prog.t0;
    int fmnist = !r->o.latents, C = r->ds.num_classes;
    fprintf(stderr, "[%7.1f s] wrote %s (partition_id %.16s...), %d shards%s\n", secs, r->path,
            r->part.id, r->part.K, fmnist ? ", clusters.png" : "");
    if (r->o.json)
        return print_json(&r->part, r->mix, C, fmnist, r->o.out, secs);
    print_table(&r->part, r->mix, C, fmnist, r->o.out, secs);
    return TS_OK;
}

static void part_free(part_run_t *r) {
    free(r->mix);
    free(r->given);
    free(r->space);
    ts_partition_free(&r->part);
    ts_dataset_free(&r->ds);
}

int ts_cmd_partition(int argc, char **argv) {
    part_run_t *r = calloc(1, sizeof *r);
    if (!r)
        return 1;
    int code = parse_opts(argc, argv, &r->o);
    int go = code == TS_ARGS_RUN;
    if (go)
        code = validate(&r->o);
    if (go && code == 0) {
        r->prog.t0 = ts_now_s();
        code = open_data(r);
    }
    if (go && code == 0) {
        int rc = run(r);
        if (rc != TS_OK)
            code = ts_args_fail(PROG, r->err, rc);
        else
            code = print_results(r) == TS_OK ? 0 : 1;
    }
    part_free(r);
    free(r);
    return code;
}
