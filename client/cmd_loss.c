/*
 * cmd_loss.c — `tessera loss --local DIR [--monolith FILE[,FILE…]]`: where do the experts lose?
 * Each model's flow-matching loss on held-out images at fixed (t, ε), per cluster.
 *
 * The test images are assigned to the clusters of DIR's partition (nearest centroid in its PCA
 * space, as the training images were), and the first --per-cluster of each cluster (in test-split
 * order) are kept. For each of them and each t of the grid, ε is the Philox normal stream --seed
 * at offset (test index · T + t index) · C·H·W, so every model sees exactly the same x_t =
 * (1 − t)·x0 + t·ε and target ε − x0, and the loss is the mean over pixels, images and t of
 * (v(x_t, t, y) − target)², with y the image's true label (the conditional branch the samplers
 * guide with). Every expert is measured on every cluster (the K × K matrix: its diagonal is each
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
#include "client/commands.h"
#include "client/jsonout.h"
#include "client/local.h"
#include "model/fmnist.h"
#include "model/train.h"

#define PROG "tessera loss"
#define CHUNK 64
#define MAX_MODELS 72 /* experts + monoliths */
#define MAX_T 32

typedef struct {
    ts_engine_t *eng;
    ts_tensor_t x0, eps, xt, target, t; /* (CHUNK, C, H, W) ×4, (CHUNK) */
    float *th;                          /* host: t of a chunk */
    int64_t chw;
    uint64_t key;
    int T;
} work_t;

/* Sum over the m images (test indices idx, labels y) at t-index j of Σ (v − target)² for model
 * m, added into *sum (double). */
static int chunk_loss(work_t *w, ts_dit_t *model, const ts_dataset_t *test, const int32_t *idx,
                      int m, int j, float t, double *sum) {
    ts_tensor_t x0, eps, xt, tg, tt, host, v;
    int32_t y[CHUNK];
    int rc = ts_tensor_slice(&x0, &w->x0, 0, m);
    if (rc == TS_OK)
        rc = ts_tensor_slice(&eps, &w->eps, 0, m);
    if (rc == TS_OK)
        rc = ts_tensor_slice(&xt, &w->xt, 0, m);
    if (rc == TS_OK)
        rc = ts_tensor_slice(&tg, &w->target, 0, m);
    if (rc == TS_OK)
        rc = ts_tensor_slice(&tt, &w->t, 0, m);
    for (int i = 0; i < m && rc == TS_OK; i++) {
        ts_tensor_t row;
        y[i] = test->labels[idx[i]];
        w->th[i] = t;
        memcpy((float *)x0.data + i * w->chw, test->images + (int64_t)idx[i] * w->chw,
               (size_t)w->chw * sizeof(float));
        rc = ts_tensor_slice(&row, &eps, i, 1);
        if (rc == TS_OK)
            rc =
                ts_rng_normal(w->eng, &row, w->key,
                              ((uint64_t)idx[i] * (uint64_t)w->T + (uint64_t)j) * (uint64_t)w->chw);
    }
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&host, w->th, TS_F32, TS_CPU, 1, tt.shape);
    if (rc == TS_OK)
        rc = ts_tensor_copy(&tt, &host);
    if (rc == TS_OK)
        rc = ts_flow_interp(w->eng, &xt, &tg, &x0, &eps, &tt);
    if (rc == TS_OK)
        rc = ts_dit_forward(model, &xt, &tt, y, m, &v);
    if (rc != TS_OK)
        return rc;
    const float *vv = v.data, *gg = tg.data;
    for (int64_t k = 0; k < (int64_t)m * w->chw; k++) {
        double d = (double)vv[k] - (double)gg[k];
        *sum += d * d;
    }
    return TS_OK;
}

static int parse_grid(const char *s, float *t, int *T) {
    char *copy = strdup(s), *save = NULL;
    if (!copy)
        return TS_ENOMEM;
    *T = 0;
    int rc = TS_OK;
    for (char *tok = strtok_r(copy, ",", &save); tok && rc == TS_OK;
         tok = strtok_r(NULL, ",", &save)) {
        char *end = NULL;
        double v = strtod(tok, &end);
        if (*end || !(v >= 0.0 && v <= 1.0) || *T == MAX_T)
            rc = TS_EINVAL;
        else
            t[(*T)++] = (float)v;
    }
    free(copy);
    return rc == TS_OK && *T > 0 ? TS_OK : TS_EINVAL;
}

int ts_cmd_loss(int argc, char **argv) {
    const char *dir = NULL, *monolith = NULL,
               *grid = "0.05,0.15,0.25,0.35,0.45,0.55,0.65,0.75,0.85,0.95";
    const char *fmnist_dir = TS_FMNIST_DEFAULT_DIR;
    int per = 128, threads = 0, json = 0, tty = isatty(STDERR_FILENO);
    uint64_t seed = 0;
    /* clang-format off */
    ts_arg_t args[] = {
        {"local", TS_ARG_STRING, &dir, "DIR", "a generation folder with a partition (experts, partition) (required)", 0, 0, 1},
        {"monolith", TS_ARG_STRING, &monolith, "FILE[,FILE…]", "models trained on all the data, measured on every cluster too"},
        {"per-cluster", TS_ARG_INT, &per, "N", "test images per cluster, the first in test order (default 128)", 1, 10000},
        {"t", TS_ARG_STRING, &grid, "LIST", "the times, comma-separated in [0, 1] (default 0.05,0.15,…,0.95)"},
        {"seed", TS_ARG_U64, &seed, "S", "the noise stream (default 0)"},
        {"data", TS_ARG_STRING, &fmnist_dir, "DIR", "Fashion-MNIST IDX directory (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"json", TS_ARG_FLAG, &json, NULL, "print one JSON object on stdout instead of the table"},
        {"threads", TS_ARG_INT, &threads, "N", "compute threads (default: all cores)", 0, 1024},
    };
    /* clang-format on */
    int pr = ts_args_parse(PROG,
                           "Each expert's and monolith's flow-matching loss on held-out test "
                           "images of every cluster at fixed (t, noise): does expert k beat the "
                           "monolith on its own cluster?",
                           args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr)
        return pr == 1 ? 0 : 2;
    float tgrid[MAX_T];
    int T = 0;
    if (parse_grid(grid, tgrid, &T) != TS_OK) {
        fprintf(stderr, PROG ": --t %s: want 1 to %d comma-separated times in [0, 1]\n", grid,
                MAX_T);
        return 2;
    }
    char *mono_copy = monolith ? strdup(monolith) : NULL, *save = NULL;
    const char *mono_paths[MAX_MODELS];
    int n_mono = 0;
    for (char *tok = mono_copy ? strtok_r(mono_copy, ",", &save) : NULL; tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (n_mono == 8) {
            fprintf(stderr, PROG ": --monolith: at most 8 files\n");
            free(mono_copy);
            return 2;
        }
        mono_paths[n_mono++] = tok;
    }

    char err[1024] = "";
    ts_engine_t eng = {0};
    ts_engine_opts_t eo = {TS_CPU, threads, 0};
    ts_local_t loc = {0}, mono[8];
    memset(mono, 0, sizeof mono);
    ts_dataset_t test = {0};
    work_t w = {0};
    int32_t *cluster = NULL, *idx = NULL;
    float *emb = NULL;
    double *loss = NULL; /* (models, K, T): mean squared error */
    int *count = NULL;   /* (K) images per cluster */
    int rc = ts_engine_init(&eng, &eo);
    if (rc == TS_OK)
        rc = ts_local_open(&loc, dir, &eng, CHUNK, 1, 0, PROG, err, sizeof err);
    if (rc == TS_OK && !loc.has_part) {
        ts_set_err(err, sizeof err, "%s has no partition.safetensors: the clusters are needed",
                   dir);
        rc = TS_ENOTFOUND;
    }
    for (int m = 0; m < n_mono && rc == TS_OK; m++)
        rc = ts_local_open_file(&mono[m], mono_paths[m], &eng, CHUNK, 1, err, sizeof err);
    if (rc == TS_OK)
        rc = ts_fmnist_load(fmnist_dir, "test", &test, err, sizeof err);
    if (rc != TS_OK)
        goto done;
    const ts_dit_config_t *c = &loc.cfg;
    int K = loc.ex.K, M = K + n_mono;
    for (int m = 0; m < n_mono; m++) {
        const ts_dit_config_t *mc = &mono[m].cfg;
        if (mc->input_size != c->input_size || mc->in_channels != c->in_channels ||
            mc->num_classes != c->num_classes) {
            ts_set_err(err, sizeof err, "--monolith %s makes other images than the experts of %s",
                       mono_paths[m], dir);
            rc = TS_EINVAL;
            goto done;
        }
    }
    if (test.channels != c->in_channels || test.height != c->input_size ||
        test.width != c->input_size) {
        ts_set_err(err, sizeof err, "the experts of %s do not make %dx%dx%d images", dir,
                   test.channels, test.height, test.width);
        rc = TS_EINVAL;
        goto done;
    }
    w.eng = &eng;
    w.chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    w.key = ts_stream_key(seed, 0);
    w.T = T;
    const int64_t *shape = TS_SHAPE(CHUNK, c->in_channels, c->input_size, c->input_size);
    cluster = malloc((size_t)test.n * sizeof *cluster);
    idx = malloc((size_t)K * per * sizeof *idx);
    emb = malloc((size_t)test.n * loc.part.k * sizeof *emb);
    loss = calloc((size_t)M * K * T, sizeof *loss);
    count = calloc((size_t)K, sizeof *count);
    w.th = malloc(CHUNK * sizeof *w.th);
    if (!cluster || !idx || !emb || !loss || !count || !w.th) {
        rc = TS_ENOMEM;
        goto done;
    }
    ts_tensor_t *bufs[] = {&w.x0, &w.eps, &w.xt, &w.target};
    for (int b = 0; b < 4 && rc == TS_OK; b++)
        rc = ts_tensor_alloc(bufs[b], TS_F32, eng.device, 4, shape);
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&w.t, TS_F32, eng.device, 1, TS_SHAPE(CHUNK));
    if (rc == TS_OK)
        rc = ts_partition_embed(&loc.part, test.images, test.n, emb);
    if (rc == TS_OK)
        rc = ts_partition_nearest(&loc.part, emb, test.n, cluster, NULL);
    if (rc != TS_OK)
        goto done;
    for (int i = 0; i < test.n; i++)
        if (count[cluster[i]] < per)
            idx[cluster[i] * per + count[cluster[i]]++] = i;
    fprintf(stderr,
            PROG ": %d experts and %d monolith%s × %d clusters × %d times, up to %d test "
                 "images per cluster\n",
            K, n_mono, n_mono == 1 ? "" : "s", K, T, per);
    for (int mi = 0; mi < M && rc == TS_OK; mi++) {
        ts_dit_t *model = mi < K ? &loc.ex.models[mi] : &mono[mi - K].ex.models[0];
        for (int k = 0; k < K && rc == TS_OK; k++)
            for (int j = 0; j < T && rc == TS_OK; j++) {
                double sum = 0.0;
                for (int lo = 0; lo < count[k] && rc == TS_OK; lo += CHUNK) {
                    int m = count[k] - lo < CHUNK ? count[k] - lo : CHUNK;
                    rc = chunk_loss(&w, model, &test, idx + k * per + lo, m, j, tgrid[j], &sum);
                }
                loss[((int64_t)mi * K + k) * T + j] =
                    count[k] ? sum / ((double)count[k] * (double)w.chw) : NAN;
            }
        if (tty)
            fprintf(stderr, "\r%s: model %d/%d ", PROG, mi + 1, M);
    }
    if (tty)
        fprintf(stderr, "\n");
    if (rc != TS_OK)
        goto done;

    /* the mean over t of every (model, cluster) */
    double *mean = calloc((size_t)M * K, sizeof *mean);
    if (!mean) {
        rc = TS_ENOMEM;
        goto done;
    }
    for (int i = 0; i < M * K; i++) {
        for (int j = 0; j < T; j++)
            mean[i] += loss[(int64_t)i * T + j] / T;
    }
    if (json) {
        json_t *ts = json_array(), *cl = json_array(), *names = json_array();
        for (int j = 0; j < T; j++)
            json_array_append_new(ts, json_real(tgrid[j]));
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
                json_array_append_new(mean_k, json_real(mean[mi * K + k]));
                json_t *row = json_array();
                for (int j = 0; j < T; j++)
                    json_array_append_new(row, json_real(loss[((int64_t)mi * K + k) * T + j]));
                json_array_append_new(by_t, row);
            }
            json_array_append_new(cl, json_pack("{s:i, s:i, s:o, s:o}", "cluster", k, "images",
                                                count[k], "loss", mean_k, "loss_by_t", by_t));
        }
        ts_json_print(json_pack("{s:s, s:i, s:I, s:o, s:o, s:o}", "local", dir, "per_cluster", per,
                                "seed", (json_int_t)seed, "t", ts, "models", names, "clusters",
                                cl));
    } else {
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
            printf("%-8d %7d %11.4f %8.4f(%d)", k, count[k], own, other, who);
            for (int m = 0; m < n_mono; m++)
                printf(" %11.4f", mean[(K + m) * K + k]);
            if (n_mono)
                printf(" %12.3f", own / mean[K * K + k]);
            printf("\n");
        }
    }
    free(mean);

done:
    if (rc != TS_OK)
        fprintf(stderr, PROG ": %s%s%s\n", err, *err ? ": " : "", ts_strerror(rc));
    ts_tensor_t *frees[] = {&w.x0, &w.eps, &w.xt, &w.target, &w.t};
    for (int b = 0; b < 5; b++)
        ts_tensor_free(frees[b]);
    free(w.th);
    free(cluster), free(idx), free(emb), free(loss), free(count);
    free(mono_copy);
    ts_dataset_free(&test);
    for (int m = 0; m < 8; m++)
        ts_local_free(&mono[m]);
    ts_local_free(&loc);
    ts_engine_free(&eng);
    return rc == TS_OK ? 0 : 1;
}
