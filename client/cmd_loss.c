/*
 * cmd_loss.c — `tessera loss --local DIR [--monolith FILE[,FILE…]]`: where do the experts lose?
 * Each model's flow-matching loss on held-out images at fixed (t, ε), per cluster.
 *
 * The measurement is model/heldout.h's: the test images assigned to the clusters of DIR's
 * partition, the first --per-cluster of each, fixed (t, ε) from --seed, y the true label (the
 * conditional branch the samplers guide with). Every expert is measured on every cluster (the K × K matrix: its diagonal is each
 * expert on its own data) and every monolith on every cluster. If the monolith is lower than
 * expert k on cluster k, the gap between the ensemble and the monolith is in the experts'
 * training, not in the routing. Output: a table, or one JSON object (--json) with the matrix and
 * the per-t losses.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/args.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "client/local.h"
#include "model/fmnist.h"
#include "model/heldout.h"

#define PROG "tessera loss"
#define MAX_MONOLITHS 8

/* ---- the verb: parse → validate → run → print ---------------------------------------------- */

typedef struct {
    const char *dir, *monolith, *grid, *fmnist_dir;
    int per, threads, json;
    ts_device_spec_t device; /* --device (zeroed: the CPU) */
    uint64_t seed;
} loss_opts_t;

/* Everything one run opens and allocates (loss_free releases it all). */
typedef struct {
    loss_opts_t o;
    float tgrid[TS_HELDOUT_MAX_T];
    int T, K, M, n_mono;
    char *mono_copy;
    const char *mono_paths[MAX_MONOLITHS];
    ts_engine_t eng;
    ts_local_t loc, mono[MAX_MONOLITHS];
    ts_dataset_t test;
    ts_heldout_t h;
    int32_t *cluster, *idx;
    double *loss; /* (models, K, T): mean squared error */
    double *mean; /* (models, K): its mean over t */
    int *count;   /* (K) images per cluster */
    char err[1024];
} loss_run_t;

/* The options from the command line: TS_ARGS_RUN, or the exit code (ts_args_parse). */
static int parse_opts(int argc, char **argv, loss_opts_t *o) {
    *o = (loss_opts_t){.grid = TS_HELDOUT_GRID, .fmnist_dir = TS_FMNIST_DEFAULT_DIR, .per = 128};
    /* clang-format off */
    o->device = (ts_device_spec_t){.automatic = 1}; /* as tesserad: a GPU when there is one */
    ts_arg_t args[] = {
        {"local", TS_ARG_STRING, &o->dir, "DIR", "a generation folder with a partition (experts, partition) (required)", 0, 0, 1},
        {"monolith", TS_ARG_STRING, &o->monolith, "FILE[,FILE…]", "models trained on all the data, measured on every cluster too"},
        {"per-cluster", TS_ARG_INT, &o->per, "N", "test images per cluster, the first in test order (default 128)", 1, 10000},
        {"t", TS_ARG_STRING, &o->grid, "LIST", "the times, comma-separated in [0, 1] (default 0.05,0.15,…,0.95)"},
        {"seed", TS_ARG_U64, &o->seed, "S", "the noise stream (default 0)"},
        {"data", TS_ARG_STRING, &o->fmnist_dir, "DIR", "Fashion-MNIST IDX directory (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"json", TS_ARG_FLAG, &o->json, NULL, "print one JSON object on stdout instead of the table"},
        {"threads", TS_ARG_INT, &o->threads, "N", "compute threads (default: all cores)", 0, 1024},
        {"device", TS_ARG_DEVICE, &o->device, "NAME", "where to compute: " TS_DEVICE_SPEC_HELP " (default auto)"},
    };
    /* clang-format on */
    return ts_args_parse(PROG,
                         "Each expert's and monolith's flow-matching loss on held-out test "
                         "images of every cluster at fixed (t, noise): does expert k beat the "
                         "monolith on its own cluster?\nexample: tessera loss --local experts/demo "
                         "--per-cluster 64",
                         args, (int)(sizeof args / sizeof args[0]), argc, argv);
}

/* The grid of times and the monoliths' paths: 0, or 2 with the message printed. */
static int validate(loss_run_t *r) {
    const loss_opts_t *o = &r->o;
    if (ts_heldout_parse_grid(o->grid, r->tgrid, &r->T) != TS_OK) {
        fprintf(stderr, PROG ": --t %s: want 1 to %d comma-separated times in [0, 1]\n", o->grid,
                TS_HELDOUT_MAX_T);
        return 2;
    }
    r->mono_copy = o->monolith ? strdup(o->monolith) : NULL;
    char *save = NULL;
    for (char *tok = r->mono_copy ? strtok_r(r->mono_copy, ",", &save) : NULL; tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (r->n_mono == MAX_MONOLITHS) {
            fprintf(stderr, PROG ": --monolith: at most 8 files\n");
            return 2;
        }
        r->mono_paths[r->n_mono++] = tok;
    }
    return 0;
}

/* The engine, the experts with their partition, the monoliths and the test split, which must all
 * make the same images. */
static int open_models(loss_run_t *r) {
    const loss_opts_t *o = &r->o;
    int rc = ts_cli_engine(&r->eng, &o->device, o->threads, PROG, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = ts_local_open(&r->loc, o->dir, &r->eng, TS_HELDOUT_CHUNK, 1, 0, PROG, r->err,
                           sizeof r->err);
    if (rc == TS_OK && !r->loc.has_part) {
        ts_set_err(r->err, sizeof r->err,
                   "%s has no partition.safetensors: the clusters are needed", o->dir);
        rc = TS_ENOTFOUND;
    }
    for (int m = 0; m < r->n_mono && rc == TS_OK; m++)
        rc = ts_local_open_file(&r->mono[m], r->mono_paths[m], &r->eng, TS_HELDOUT_CHUNK, 1, r->err,
                                sizeof r->err);
    if (rc == TS_OK)
        rc = ts_fmnist_load(o->fmnist_dir, "test", &r->test, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = ts_local_check_images(&r->loc, o->dir, r->mono, r->mono_paths, r->n_mono, &r->test,
                                   r->err, sizeof r->err);
    r->K = r->loc.ex.K, r->M = r->K + r->n_mono;
    return rc;
}

/* The buffers, and the first --per-cluster test images of each cluster (nearest centroid). */
static int pick_images(loss_run_t *r) {
    const ts_dataset_t *test = &r->test;
    int K = r->K, per = r->o.per;
    r->cluster = malloc((size_t)test->n * sizeof *r->cluster);
    r->idx = malloc((size_t)K * per * sizeof *r->idx);
    r->loss = calloc((size_t)r->M * K * r->T, sizeof *r->loss);
    r->count = calloc((size_t)K, sizeof *r->count);
    if (!r->cluster || !r->idx || !r->loss || !r->count)
        return TS_ENOMEM;
    int rc =
        ts_heldout_init(&r->h, &r->eng, test, r->tgrid, r->T, r->o.seed, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = ts_heldout_assign(&r->loc.part, test, r->cluster);
    for (int k = 0; k < K && rc == TS_OK; k++)
        ts_heldout_pick(r->cluster, test->n, k, per, r->idx + k * per, &r->count[k]);
    return rc;
}

/* Every model's loss on every cluster at every t. */
static int measure(loss_run_t *r) {
    int K = r->K, M = r->M, T = r->T, per = r->o.per, tty = isatty(STDERR_FILENO);
    fprintf(stderr,
            PROG ": %d experts and %d monolith%s × %d clusters × %d times, up to %d test "
                 "images per cluster\n",
            K, r->n_mono, r->n_mono == 1 ? "" : "s", K, T, per);
    int rc = TS_OK;
    for (int mi = 0; mi < M && rc == TS_OK; mi++) {
        ts_dit_t *model = mi < K ? &r->loc.ex.models[mi] : &r->mono[mi - K].ex.models[0];
        for (int k = 0; k < K && rc == TS_OK; k++) {
            double *by_t = r->loss + ((int64_t)mi * K + k) * T, mean;
            for (int j = 0; j < T; j++)
                by_t[j] = NAN; /* a cluster without test images */
            if (r->count[k] > 0)
                rc = ts_heldout_loss(&r->h, model, r->idx + k * per, r->count[k], by_t, &mean);
        }
        if (tty)
            fprintf(stderr, "\r%s: model %d/%d ", PROG, mi + 1, M);
    }
    if (tty)
        fprintf(stderr, "\n");
    return rc;
}

static void print_json(const loss_run_t *r) {
    int K = r->K, M = r->M, T = r->T;
    json_t *ts = json_array(), *cl = json_array(), *names = json_array();
    for (int j = 0; j < T; j++)
        json_array_append_new(ts, json_real(r->tgrid[j]));
    for (int mi = 0; mi < M; mi++) {
        char name[64];
        if (mi < K)
            snprintf(name, sizeof name, "expert-%d", mi);
        else
            snprintf(name, sizeof name, mi == K ? "monolith" : "monolith%d", mi - K + 1);
        json_array_append_new(names, json_string(name));
    }
    for (int k = 0; k < K; k++) {
        json_t *mean_k = json_array(), *by_t = json_array();
        for (int mi = 0; mi < M; mi++) {
            json_array_append_new(mean_k, json_real(r->mean[mi * K + k]));
            json_t *row = json_array();
            for (int j = 0; j < T; j++)
                json_array_append_new(row, json_real(r->loss[((int64_t)mi * K + k) * T + j]));
            json_array_append_new(by_t, row);
        }
        json_array_append_new(cl, json_pack("{s:i, s:i, s:o, s:o}", "cluster", k, "images",
                                            r->count[k], "loss", mean_k, "loss_by_t", by_t));
    }
    ts_json_print(json_pack("{s:s, s:i, s:I, s:o, s:o, s:o}", "local", r->o.dir, "per_cluster",
                            r->o.per, "seed", (json_int_t)r->o.seed, "t", ts, "models", names,
                            "clusters", cl));
}

/* Per cluster: its own expert, the best other expert and the monoliths, over the mean over t. */
static void print_table(const loss_run_t *r) {
    int K = r->K, n_mono = r->n_mono;
    const double *mean = r->mean;
    printf("%-8s %7s %11s %11s", "cluster", "images", "own expert", "best other");
    for (int m = 0; m < n_mono; m++)
        printf(" %11s", m == 0 ? "monolith" : "monolith+");
    printf(" %12s\n", n_mono ? "own/monolith" : "");
    for (int k = 0; k < K; k++) {
        double own = mean[k * K + k], other = INFINITY;
        int who = -1;
        for (int j = 0; j < K; j++)
            if (j != k && mean[j * K + k] < other)
                other = mean[j * K + k], who = j;
        printf("%-8d %7d %11.4f %8.4f(%d)", k, r->count[k], own, other, who);
        for (int m = 0; m < n_mono; m++)
            printf(" %11.4f", mean[(K + m) * K + k]);
        if (n_mono)
            printf(" %12.3f", own / mean[K * K + k]);
        printf("\n");
    }
}

/* The mean over t of every (model, cluster), then the JSON object or the table. */
static int print_results(loss_run_t *r) {
    int n = r->M * r->K, T = r->T;
    if (!(r->mean = calloc((size_t)n, sizeof *r->mean)))
        return TS_ENOMEM;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < T; j++)
            r->mean[i] += r->loss[(int64_t)i * T + j] / T;
    if (r->o.json)
        print_json(r);
    else
        print_table(r);
    return TS_OK;
}

static void loss_free(loss_run_t *r) {
    ts_heldout_free(&r->h);
    free(r->cluster), free(r->idx), free(r->loss), free(r->mean), free(r->count);
    free(r->mono_copy);
    ts_dataset_free(&r->test);
    for (int m = 0; m < MAX_MONOLITHS; m++)
        ts_local_free(&r->mono[m]);
    ts_local_free(&r->loc);
    ts_engine_free(&r->eng);
}

int ts_cmd_loss(int argc, char **argv) {
    loss_run_t *r = calloc(1, sizeof *r);
    if (!r)
        return 1;
    int code = parse_opts(argc, argv, &r->o);
    int go = code == TS_ARGS_RUN;
    if (go)
        code = validate(r);
    if (go && code == 0) {
        int rc = open_models(r);
        if (rc == TS_OK)
            rc = pick_images(r);
        if (rc == TS_OK)
            rc = measure(r);
        if (rc == TS_OK)
            rc = print_results(r);
        code = rc == TS_OK ? 0 : ts_args_fail(PROG, r->err, rc);
    }
    loss_free(r);
    free(r);
    return code;
}
