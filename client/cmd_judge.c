/*
 * cmd_judge.c — `tessera judge`: scores saved sample sets (IDX files, as `tessera eval
 * --save-samples` writes them) in every judge given (judges.h) — FD and KID with 95 % bootstrap
 * intervals and paired differences to the first set, precision and recall (model/space_score.h)
 * — and says, for each set against the first, whether every judge agrees. `tessera train-judge`
 * (cmd_train_judge.c) makes the judges.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/str.h"
#include "client/args.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/judges.h"
#include "client/jsonout.h"
#include "client/report.h"
#include "client/local.h"
#include "model/fmnist.h"
#include "model/judge.h"
#include "model/safetensors.h"
#include "model/space_score.h"

#define MAX_LIST TS_CLI_MAX_JUDGES
#define CHUNK 128 /* images per judge call */

typedef struct {
    const char *prog, *samples, *judges, *ref, *fmnist_dir;
    int n, ref_n, boot, pr_k, threads, json;
} score_opts_t;

/* The labels file beside a samples file, and the entry's name: "X.idx[.gz]" has "X-labels.idx[.gz]";
 * "X-images-idx3-ubyte[.gz]" has "X-labels-idx1-ubyte[.gz]". 0 when the name is neither. */
static int sample_paths(const char *path, char *labels, size_t llen, char *name, size_t nlen) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *forms[][2] = {{".idx.gz", "-labels.idx.gz"},
                              {".idx", "-labels.idx"},
                              {"-images-idx3-ubyte.gz", "-labels-idx1-ubyte.gz"},
                              {"-images-idx3-ubyte", "-labels-idx1-ubyte"}};
    size_t len = strlen(path), blen = strlen(base);
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        size_t sl = strlen(forms[f][0]);
        if (blen <= sl || strcmp(path + len - sl, forms[f][0]) != 0)
            continue;
        snprintf(labels, llen, "%.*s%s", (int)(len - sl), path, forms[f][1]);
        snprintf(name, nlen, "%.*s", (int)(blen - sl), base);
        return 1;
    }
    return 0;
}

int ts_cmd_judge(int argc, char **argv) {
    score_opts_t o = {.prog = "tessera judge",
                      .ref = "test",
                      .fmnist_dir = TS_FMNIST_DEFAULT_DIR,
                      .boot = 200,
                      .pr_k = 3};
    /* clang-format off */
    ts_arg_t args[] = {
        {"samples", TS_ARG_STRING, &o.samples, "FILE,...", "the sample sets, IDX images (X.idx.gz with X-labels.idx.gz beside it, or P-images-idx3-ubyte[.gz] as `tessera eval --save-samples` writes); the first is what the others are compared with", 0, 0, 1},
        {"judges", TS_ARG_STRING, &o.judges, "FILE,...", "the feature spaces: judges of `tessera train-judge` and/or the evaluation classifier of `tessera train-classifier`", 0, 0, 1},
        {"ref", TS_ARG_STRING, &o.ref, "SPLIT", "the reference images: the Fashion-MNIST split test (default) or train"},
        {"ref-n", TS_ARG_INT, &o.ref_n, "N", "the first N reference images only (default all)", 0, 1e7},
        {"n", TS_ARG_INT, &o.n, "N", "the first N samples of each set only (default all)", 0, 1e7},
        {"bootstrap", TS_ARG_INT, &o.boot, "B", "bootstrap resamples for the intervals (default 200; 0: none)", 0, 100000},
        {"pr-k", TS_ARG_INT, &o.pr_k, "K", "the k of precision/recall's k-nearest-neighbour radii (default 3)", 1, 100},
        {"fmnist", TS_ARG_STRING, &o.fmnist_dir, "DIR", "the Fashion-MNIST IDX files (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"threads", TS_ARG_INT, &o.threads, "N", "CPU threads (default: every core)", 0, 1024},
        {"json", TS_ARG_FLAG, &o.json, NULL, "print one JSON object on stdout instead of the tables"},
    };
    /* clang-format on */
    int pr =
        ts_args_parse(o.prog,
                      "Score saved sample sets in several feature spaces: FD and KID with 95 % "
                      "intervals, paired differences to the first set, precision and recall, "
                      "and whether every judge agrees.\nexample: tessera judge --samples "
                      "monolith.idx.gz,best-ensemble.idx.gz --judges classifier.safetensors,"
                      "judge-cnn.safetensors,judge-ae.safetensors",
                      args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    if (strcmp(o.ref, "test") != 0 && strcmp(o.ref, "train") != 0) {
        fprintf(stderr, "%s: --ref %s: must be test or train\n", o.prog, o.ref);
        return 2;
    }
    char *slist = ts_dup_str(o.samples), *jlist = ts_dup_str(o.judges);
    const char *spath[MAX_LIST], *jpath[MAX_LIST];
    int E = slist ? ts_cli_split_list(slist, spath, MAX_LIST) : 0,
        J = jlist ? ts_cli_split_list(jlist, jpath, MAX_LIST) : 0;
    if (E < 1 || J < 1) {
        fprintf(stderr, "%s: --samples and --judges take 1 to %d comma-separated files\n", o.prog,
                MAX_LIST);
        free(slist), free(jlist);
        return 2;
    }
    char labels[MAX_LIST][4096], names_buf[MAX_LIST][256], *names[MAX_LIST];
    for (int e = 0; e < E; e++) {
        names[e] = names_buf[e];
        if (!sample_paths(spath[e], labels[e], sizeof labels[e], names_buf[e], 256)) {
            fprintf(stderr,
                    "%s: %s: name a samples file X.idx.gz (labels in X-labels.idx.gz) or "
                    "P-images-idx3-ubyte[.gz] (labels in P-labels-idx1-ubyte[.gz])\n",
                    o.prog, spath[e]);
            free(slist), free(jlist);
            return 2;
        }
    }
    char err[1024] = "";
    ts_dataset_t ref = {0}, sets[MAX_LIST] = {{0}};
    ts_cli_judge_t jd[MAX_LIST] = {{0}};
    ts_engine_t eng = {0};
    ts_device_spec_t cpu = {.device = TS_CPU};
    float *rfeat = NULL, *feat[MAX_LIST] = {0};
    ts_space_score_t *sc = calloc((size_t)(E * J), sizeof *sc);
    int64_t n[MAX_LIST];
    int rc = sc ? TS_OK : TS_ENOMEM, have_eng = 0;
    if (rc == TS_OK)
        rc = ts_fmnist_load(o.fmnist_dir, o.ref, &ref, err, sizeof err);
    int64_t r = o.ref_n && o.ref_n < ref.n ? o.ref_n : ref.n;
    for (int e = 0; e < E && rc == TS_OK; e++) {
        rc = ts_fmnist_load_files(spath[e], labels[e], &sets[e], err, sizeof err);
        if (rc == TS_OK && (sets[e].height != ref.height || sets[e].width != ref.width)) {
            rc = ts_fail(err, sizeof err, TS_EINVAL, "%s: images of %d×%d, the reference's %d×%d",
                         spath[e], sets[e].height, sets[e].width, ref.height, ref.width);
        }
        n[e] = o.n && o.n < sets[e].n ? o.n : sets[e].n;
    }
    if (rc == TS_OK &&
        (rc = ts_cli_engine(&eng, &cpu, o.threads, o.prog, err, sizeof err)) == TS_OK)
        have_eng = 1;
    int C = ref.channels, H = ref.height, W = ref.width;
    double t0 = ts_now_s();
    for (int k = 0; k < J && rc == TS_OK; k++) {
        rc = ts_cli_judge_open(&jd[k], jpath[k], &eng, CHUNK, C, H, W, err, sizeof err);
        int D = jd[k].D, opened = rc == TS_OK;
        if (rc == TS_OK && !(rfeat = malloc((size_t)(r * D) * sizeof *rfeat)))
            rc = TS_ENOMEM;
        if (rc == TS_OK)
            rc = ts_cli_judge_features(&jd[k], &eng, ref.images, (int)r, C, H, W, rfeat);
        for (int e = 0; e < E && rc == TS_OK; e++) {
            if (!(feat[e] = malloc((size_t)(n[e] * D) * sizeof *feat[e])))
                rc = TS_ENOMEM;
            else
                rc = ts_cli_judge_features(&jd[k], &eng, sets[e].images, (int)n[e], C, H, W,
                                           feat[e]);
        }
        if (rc != TS_OK && opened)
            ts_set_err(err, sizeof err, "%s: the features: %s", jpath[k], ts_strerror(rc));
        if (rc == TS_OK)
            rc = ts_space_score((const float *const *)feat, n, E, rfeat, r, D, o.boot, o.pr_k,
                                sc + (size_t)k * E, err, sizeof err);
        if (rc == TS_OK && !o.json)
            fprintf(stderr, "%s: judge %d of %d (%s) done, %.1f s\n", o.prog, k + 1, J, jd[k].name,
                    ts_now_s() - t0);
        for (int e = 0; e < E; e++)
            free(feat[e]), feat[e] = NULL;
        free(rfeat), rfeat = NULL;
    }
    if (rc == TS_OK) {
        if (o.json)
            ts_json_print(ts_cli_judges_json(o.ref, o.boot, o.pr_k, names, E, jd, J, sc, n, r));
        else
            ts_cli_judges_print(o.ref, o.boot, names, E, jd, J, sc, n, r);
    } else {
        ts_args_fail(o.prog, err, rc);
    }
    for (int k = 0; k < J; k++)
        ts_cli_judge_close(&jd[k]);
    for (int e = 0; e < E; e++)
        ts_dataset_free(&sets[e]);
    ts_dataset_free(&ref);
    if (have_eng)
        ts_engine_free(&eng);
    free(sc), free(slist), free(jlist);
    return rc == TS_OK ? 0 : 1;
}
