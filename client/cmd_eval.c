/*
 * cmd_eval.c — `tessera eval --local DIR`: how good are the samples of each routing policy (and
 * of a monolith), measured in the evaluation classifier's feature space (DESIGN §10).
 *
 * For every entry of --policies the same n samples are generated — sample i from the noise
 * stream seed + i with label i mod 10, so the entries differ only by their routing — quantised to
 * 8 bits exactly as a PNG of them would hold them, and run through the classifier
 * (`tessera train-classifier`). Reported per entry:
 *   fd          Fréchet distance between the samples' features and the reference set's (the
 *               test split by default): model/metrics.h.
 *   coverage    entropy (bits) of the histogram of predicted classes: log2 10 = 3.32 when every
 *               class is produced equally often.
 *   agreement   the fraction of samples the classifier puts in the class they were asked for.
 *   evals       expert evaluations per sample (a CFG pair counts two), and router evaluations.
 * An entry POLICY+prior routes class-aware: the policy's scores plus log p(y | k), the class mix
 * of each cluster (client/local.h), so a sample asked for class y goes to the experts that saw y.
 * Plus one baseline row, "train data": n train images in place of samples, the FD a perfect
 * generator would get at this n (FD is biased upward at small n, by the same amount for every
 * row).
 *
 * Output: a table on stdout (or one JSON object with --json), and with --report a self-contained
 * HTML page (client/report.h) with the table, a bar chart of FD and a sample grid per entry.
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
#include "client/local.h"
#include "client/report.h"
#include "model/classifier.h"
#include "model/fmnist.h"
#include "model/metrics.h"

#define PROG "tessera eval"
#define CHUNK 64      /* samples per ensemble call */
#define MAX_ENTRIES 32
#define MONOLITH "monolith"
#define DEFAULT_POLICIES                                                                        \
    "monolith learned:top1 learned:top2 uniform:full learned:full learned:threshold=0.9 "     \
    "learned:t>0.7:full,t>0.3:top2,top1 centroid:top1 confidence:top1"

/* One row of the table: a policy and selection over the folder, or the monolith. */
typedef struct {
    char name[160];
    int monolith, prior; /* prior: class-aware routing (POLICY+prior) */
    ts_policy_t policy;
    ts_selection_t select;
    /* results */
    double fd, coverage, agreement, evals, router_evals, seconds;
    float *grid; /* the first grid_n samples */
} entry_t;

/* Splits the whitespace-separated list into entries: "monolith" or POLICY[+prior][:SELECTION]
 * (the selection defaults to top1; it may itself hold colons, as a schedule does; +prior adds the
 * clusters' class mix to the scores, client/local.h). */
static int parse_entries(const char *list, entry_t *e, int *n, char *err, size_t errlen) {
    char *copy = strdup(list), *save = NULL;
    if (!copy)
        return TS_ENOMEM;
    int rc = TS_OK;
    *n = 0;
    for (char *tok = strtok_r(copy, " \t\n", &save); tok && rc == TS_OK;
         tok = strtok_r(NULL, " \t\n", &save)) {
        if (*n == MAX_ENTRIES) {
            ts_set_err(err, errlen, "--policies: more than %d entries", MAX_ENTRIES);
            rc = TS_EINVAL;
            break;
        }
        entry_t *x = &e[*n];
        memset(x, 0, sizeof *x);
        snprintf(x->name, sizeof x->name, "%s", tok);
        if (strcmp(tok, MONOLITH) == 0) {
            x->monolith = 1;
            (*n)++;
            continue;
        }
        char *colon = strchr(tok, ':');
        if (colon)
            *colon = '\0';
        char *plus = strstr(tok, "+prior");
        if (plus && plus[6] == '\0') {
            *plus = '\0';
            x->prior = 1;
        }
        if (ts_policy_parse(tok, &x->policy) != TS_OK) {
            ts_set_err(err, errlen,
                       "--policies: '%s' is not a policy (learned, centroid, confidence, uniform, "
                       "each optionally +prior, or monolith)",
                       tok);
            rc = TS_EINVAL;
        } else {
            char why[256] = "";
            const char *sel = colon ? colon + 1 : "top1";
            if (ts_selection_parse(sel, &x->select, why, sizeof why) != TS_OK) {
                ts_set_err(err, errlen, "--policies %s: %s", x->name, why);
                rc = TS_EINVAL;
            }
            (*n)++;
        }
    }
    free(copy);
    if (rc == TS_OK && *n == 0) {
        ts_set_err(err, errlen, "--policies: empty list");
        rc = TS_EINVAL;
    }
    return rc;
}

/* Rounds images to the 8-bit grey levels a PNG of them holds (model/png.c's mapping), in place. */
static void quantise(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] < -1.0f ? -1.0f : x[i] > 1.0f ? 1.0f : x[i];
        v = isnan(v) ? -1.0f : v;
        x[i] = floorf((v + 1.0f) * 127.5f + 0.5f) / 127.5f - 1.0f;
    }
}

/* The classifier's features (n, D) and predicted classes (n) of host images (n, C, H, W). */
static int classify(ts_classifier_t *c, ts_engine_t *e, const float *images, int n, int C, int H,
                    int W, float *feat, int32_t *pred) {
    int D = ts_classifier_feature_dim(c), K = ts_classifier_num_outputs(c);
    int64_t chw = (int64_t)C * H * W;
    ts_tensor_t x = {0};
    float *logits = malloc((size_t)CHUNK * (size_t)K * sizeof *logits);
    int rc = logits ? ts_tensor_alloc(&x, TS_F32, e->device, 4, TS_SHAPE(CHUNK, C, H, W))
                    : TS_ENOMEM;
    for (int lo = 0; lo < n && rc == TS_OK; lo += CHUNK) {
        int m = n - lo < CHUNK ? n - lo : CHUNK;
        ts_tensor_t host, xs;
        rc = ts_tensor_slice(&xs, &x, 0, m);
        if (rc == TS_OK)
            rc = ts_tensor_wrap(&host, (float *)images + lo * chw, TS_F32, TS_CPU, 4, xs.shape);
        if (rc == TS_OK)
            rc = ts_tensor_copy(&xs, &host);
        if (rc == TS_OK)
            rc = ts_classifier_run(c, &xs, NULL, m, feat + (int64_t)lo * D, logits);
        if (rc == TS_OK)
            ts_argmax_rows(logits, m, K, pred + lo);
    }
    ts_tensor_free(&x);
    free(logits);
    return rc;
}

/* FD against the reference Gaussian, coverage and agreement of n classified samples. */
static int score(const float *feat, const int32_t *pred, const int32_t *asked, int n, int D,
                 int K, const double *mu_ref, const double *cov_ref, entry_t *x, char *err,
                 size_t errlen) {
    double *mu = malloc((size_t)D * sizeof *mu), *cov = malloc((size_t)D * D * sizeof *cov);
    int rc = mu && cov ? ts_gauss_fit(feat, n, D, mu, cov, err, errlen) : TS_ENOMEM;
    if (rc == TS_OK)
        rc = ts_frechet_distance(mu, cov, mu_ref, cov_ref, D, &x->fd, err, errlen);
    if (rc == TS_OK)
        rc = ts_class_coverage(pred, n, K, &x->coverage, NULL, err, errlen);
    int right = 0, conditional = 0;
    for (int i = 0; i < n; i++) {
        conditional += asked[i] < K;
        right += pred[i] == asked[i];
    }
    x->agreement = conditional ? (double)right / conditional : NAN;
    free(mu);
    free(cov);
    return rc;
}

typedef struct {
    int tty, done, total;
    const char *name;
} progress_t;

static int on_step(void *ctx, int step, int steps) {
    progress_t *p = ctx;
    p->done++;
    if (p->tty)
        fprintf(stderr, "\r%-40.40s step %d/%d (%d/%d)   ", p->name, step, steps, p->done,
                p->total);
    return 0;
}

static void print_table(const entry_t *e, int n_entries, const entry_t *floor_row) {
    printf("%-42s %10s %9s %9s %8s %8s %9s\n", "policy", "FD", "coverage", "agree", "evals",
           "router", "seconds");
    const entry_t *rows[MAX_ENTRIES + 1];
    int n = 0;
    rows[n++] = floor_row;
    for (int i = 0; i < n_entries; i++)
        rows[n++] = &e[i];
    for (int i = 0; i < n; i++)
        printf("%-42.42s %10.3f %9.3f %9.3f %8.1f %8.1f %9.1f\n", rows[i]->name, rows[i]->fd,
               rows[i]->coverage, rows[i]->agreement, rows[i]->evals, rows[i]->router_evals,
               rows[i]->seconds);
}

static json_t *entry_json(const entry_t *x) {
    return json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:f}", "policy", x->name, "fd", x->fd,
                     "coverage_bits", x->coverage, "agreement",
                     isnan(x->agreement) ? -1.0 : x->agreement, "evals_per_sample", x->evals,
                     "router_evals_per_sample", x->router_evals, "seconds", x->seconds);
}

static int write_report(const char *path, const entry_t *e, int n_entries,
                        const entry_t *floor_row, const char *setup, int grid_n,
                        const ts_dit_config_t *c, char *err, size_t errlen) {
    ts_report_t *r = NULL;
    int rc = ts_report_open(&r, path, "tessera eval", err, errlen);
    if (rc != TS_OK)
        return rc;
    ts_report_heading(r, 1, "tessera eval: routing policies compared");
    ts_report_paragraph(r, setup);
    /* the table */
    enum { COLS = 7 };
    const char *head[COLS] = {"policy", "FD", "coverage (bits)", "agreement", "evals/sample",
                              "router evals/sample", "seconds"};
    int rows = n_entries + 2;
    char(*buf)[COLS][160] = calloc((size_t)rows, sizeof *buf);
    const char **cells = calloc((size_t)rows * COLS, sizeof *cells);
    const char **labels = calloc((size_t)n_entries + 1, sizeof *labels);
    double *fds = calloc((size_t)n_entries + 1, sizeof *fds);
    if (!buf || !cells || !labels || !fds) {
        free(buf), free(cells), free(labels), free(fds);
        ts_report_discard(r);
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    for (int j = 0; j < COLS; j++)
        cells[j] = head[j];
    for (int i = 0; i < n_entries + 1; i++) {
        const entry_t *x = i == 0 ? floor_row : &e[i - 1];
        char(*b)[160] = buf[i + 1];
        snprintf(b[0], 160, "%s", x->name);
        snprintf(b[1], 160, "%.3f", x->fd);
        snprintf(b[2], 160, "%.3f", x->coverage);
        snprintf(b[3], 160, "%.3f", x->agreement);
        snprintf(b[4], 160, "%.1f", x->evals);
        snprintf(b[5], 160, "%.1f", x->router_evals);
        snprintf(b[6], 160, "%.1f", x->seconds);
        for (int j = 0; j < COLS; j++)
            cells[(i + 1) * COLS + j] = b[j];
        labels[i] = x->name;
        fds[i] = x->fd;
    }
    ts_report_table(r, COLS, n_entries + 2, cells);
    ts_report_bar_chart_svg(r, "Fréchet distance (lower is better)", labels, fds, n_entries + 1,
                            NULL);
    ts_report_heading(r, 2, "Samples");
    for (int i = 0; i < n_entries; i++) {
        char cap[256];
        snprintf(cap, sizeof cap, "%s: FD %.3f, %.1f expert evaluations per sample", e[i].name,
                 e[i].fd, e[i].evals);
        ts_report_heading(r, 3, e[i].name);
        ts_report_png_grid(r, e[i].grid, grid_n, c->in_channels, c->input_size, c->input_size, 10,
                           cap);
    }
    free(buf), free(cells), free(labels), free(fds);
    return ts_report_close(r, err, errlen);
}

int ts_cmd_eval(int argc, char **argv) {
    const char *dir = NULL, *classifier = NULL, *monolith = NULL, *policies = DEFAULT_POLICIES;
    const char *sampler = "heun", *report = NULL, *fmnist_dir = TS_FMNIST_DEFAULT_DIR;
    int n = 1000, steps = 30, threads = 0, json = 0, grid_n = 100, ref_n = 0;
    float cfg = 1.0f, tau = 0.0f;
    uint64_t seed = 0;
    /* clang-format off */
    ts_arg_t args[] = {
        {"local", TS_ARG_STRING, &dir, "DIR", "the generation folder of `tessera generate --local` (experts, partition, router)", 0, 0, 1},
        {"classifier", TS_ARG_STRING, &classifier, "FILE", "the evaluation classifier (`tessera train-classifier`)", 0, 0, 1},
        {"monolith", TS_ARG_STRING, &monolith, "FILE", "one expert trained on all the data, the entry 'monolith'"},
        {"policies", TS_ARG_STRING, &policies, "LIST", "entries separated by spaces: monolith, or POLICY[:SELECTION] as in tessera generate (default: \"" DEFAULT_POLICIES "\")"},
        {"n", TS_ARG_INT, &n, "N", "samples per entry (default 1000)", 2, 1000000},
        {"steps", TS_ARG_INT, &steps, "S", "integration steps (default 30)", 1, 10000},
        {"sampler", TS_ARG_STRING, &sampler, "NAME", "euler or heun (default heun)"},
        {"cfg", TS_ARG_FLOAT, &cfg, "S", "classifier-free guidance scale inside each expert, 1 = off (default 1)", 0, 100},
        {"tau", TS_ARG_FLOAT, &tau, "T", "temperature of centroid/confidence (default: the partition's)", 0, 1e30},
        {"seed", TS_ARG_U64, &seed, "S", "sample i uses noise stream seed+i (default 0)"},
        {"ref-n", TS_ARG_INT, &ref_n, "N", "reference images from the test split (default all 10000)", 2, 1000000},
        {"data", TS_ARG_STRING, &fmnist_dir, "DIR", "Fashion-MNIST IDX directory (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"report", TS_ARG_STRING, &report, "FILE", "write a self-contained HTML report (table, FD chart, sample grids)"},
        {"grid", TS_ARG_INT, &grid_n, "N", "samples per grid in the report (default 100)", 1, 10000},
        {"json", TS_ARG_FLAG, &json, NULL, "print the results as one JSON object on stdout instead of the table"},
        {"threads", TS_ARG_INT, &threads, "N", "compute threads (default: all cores)", 0, 1024},
    };
    /* clang-format on */
    int pr = ts_args_parse(PROG,
                           "Compare routing policies (and a monolith) by the Fréchet distance of "
                           "their samples to the test set in the evaluation classifier's feature "
                           "space, class coverage and expert evaluations per sample.",
                           args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr)
        return pr == 1 ? 0 : 2;
    char err[1024] = "";
    entry_t *e = calloc(MAX_ENTRIES, sizeof *e);
    int n_entries = 0;
    ts_sampler_opts_t so = {.steps = steps};
    if (!e)
        return 1;
    if (parse_entries(policies, e, &n_entries, err, sizeof err) != TS_OK) {
        fprintf(stderr, PROG ": %s\n", err);
        free(e);
        return 2;
    }
    if (ts_sampler_parse(sampler, &so.kind) != TS_OK) {
        fprintf(stderr, PROG ": --sampler %s: must be euler or heun\n", sampler);
        free(e);
        return 2;
    }
    int wants_monolith = 0;
    for (int i = 0; i < n_entries; i++)
        wants_monolith |= e[i].monolith;
    if (wants_monolith && !monolith) {
        fprintf(stderr, PROG ": the entry 'monolith' needs --monolith FILE\n");
        free(e);
        return 2;
    }
    if (grid_n > n)
        grid_n = n;

    ts_engine_t eng = {0};
    ts_engine_opts_t eo = {TS_CPU, threads, 0};
    ts_local_t loc = {0}, mono = {0};
    ts_classifier_t *cls = NULL;
    ts_dataset_t test = {0}, train = {0};
    float *images = NULL, *feat = NULL;
    int32_t *pred = NULL, *labels = NULL;
    uint64_t *seeds = NULL;
    double *mu_ref = NULL, *cov_ref = NULL;
    float *log_prior = NULL;
    int chunk = n < CHUNK ? n : CHUNK, pairs = cfg != 1.0f ? 2 : 1, usage = 0;
    entry_t floor_row = {.agreement = NAN};
    snprintf(floor_row.name, sizeof floor_row.name, "train data (the floor at this n)");
    int rc = ts_engine_init(&eng, &eo);
    if (rc == TS_OK)
        rc = ts_local_open(&loc, dir, &eng, chunk, pairs, 1, PROG, err, sizeof err);
    if (rc == TS_OK && wants_monolith)
        rc = ts_local_open_file(&mono, monolith, &eng, chunk, pairs, err, sizeof err);
    for (int i = 0; i < n_entries && rc == TS_OK; i++)
        if (!e[i].monolith)
            rc = ts_local_check_policy(&loc, e[i].policy, PROG, err, sizeof err);
    if (rc == TS_OK)
        rc = ts_classifier_open(&cls, classifier, &eng, CHUNK, err, sizeof err);
    if (rc == TS_OK && ts_classifier_time_conditioned(cls)) {
        ts_set_err(err, sizeof err,
                   "--classifier %s is a router (time-conditioned); want the evaluation "
                   "classifier of `tessera train-classifier`",
                   classifier);
        rc = TS_EINVAL;
        usage = 1;
    }
    if (rc == TS_OK)
        rc = ts_fmnist_load(fmnist_dir, "test", &test, err, sizeof err);
    if (rc == TS_OK)
        rc = ts_fmnist_load(fmnist_dir, "train", &train, err, sizeof err);
    if (rc != TS_OK)
        goto done;
    const ts_dit_config_t *c = &loc.ex.models[0].cfg;
    if (wants_monolith) {
        const ts_dit_config_t *m = &mono.ex.models[0].cfg;
        if (m->input_size != c->input_size || m->in_channels != c->in_channels ||
            m->num_classes != c->num_classes) {
            ts_set_err(err, sizeof err, "--monolith %s makes other images than the experts of %s",
                       monolith, dir);
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
    int wants_prior = 0;
    for (int i = 0; i < n_entries; i++)
        wants_prior |= e[i].prior && !e[i].monolith;
    if (wants_prior && (rc = ts_local_class_prior(&loc, train.labels, train.n, c->num_classes,
                                                   &log_prior, err, sizeof err)) != TS_OK)
        goto done;
    if (!ref_n || ref_n > test.n)
        ref_n = test.n;
    if (n > train.n)
        n = train.n; /* the floor row takes n train images */
    int D = ts_classifier_feature_dim(cls), K = ts_classifier_num_outputs(cls);
    int C = c->in_channels, S = c->input_size;
    int64_t chw = (int64_t)C * S * S;
    int rows = ref_n > n ? ref_n : n;
    images = malloc((size_t)(n * chw) * sizeof *images);
    feat = malloc((size_t)rows * D * sizeof *feat);
    pred = malloc((size_t)rows * sizeof *pred);
    labels = malloc((size_t)n * sizeof *labels);
    seeds = malloc((size_t)n * sizeof *seeds);
    mu_ref = malloc((size_t)D * sizeof *mu_ref);
    cov_ref = malloc((size_t)D * D * sizeof *cov_ref);
    if (!images || !feat || !pred || !labels || !seeds || !mu_ref || !cov_ref) {
        rc = TS_ENOMEM;
        goto done;
    }
    for (int i = 0; i < n_entries; i++)
        if (!(e[i].grid = malloc((size_t)(grid_n * chw) * sizeof(float)))) {
            rc = TS_ENOMEM;
            goto done;
        }

    /* the reference: the test split's features */
    fprintf(stderr, PROG ": %d entries × %d samples, %d %s steps, cfg %g; reference: %d test "
                         "images\n",
            n_entries, n, steps, sampler, (double)cfg, ref_n);
    rc = classify(cls, &eng, test.images, ref_n, C, S, S, feat, pred);
    if (rc == TS_OK)
        rc = ts_gauss_fit(feat, ref_n, D, mu_ref, cov_ref, err, sizeof err);
    /* the floor: n train images through the same pipeline */
    for (int i = 0; i < n; i++)
        labels[i] = train.labels[i];
    if (rc == TS_OK) {
        memcpy(images, train.images, (size_t)(n * chw) * sizeof *images);
        quantise(images, n * chw);
        rc = classify(cls, &eng, images, n, C, S, S, feat, pred);
    }
    if (rc == TS_OK)
        rc = score(feat, pred, labels, n, D, K, mu_ref, cov_ref, &floor_row, err, sizeof err);
    if (rc != TS_OK)
        goto done;

    for (int i = 0; i < n; i++) {
        labels[i] = i % c->num_classes;
        seeds[i] = seed + (uint64_t)i;
    }
    float tau_used = args[8].seen ? tau : ts_local_default_tau(&loc);
    if (args[8].seen && !(tau > 0.0f)) {
        ts_set_err(err, sizeof err, "--tau %g: must be > 0", (double)tau);
        rc = TS_EINVAL;
        usage = 1;
        goto done;
    }
    progress_t prog = {isatty(STDERR_FILENO), 0, 0, NULL};
    for (int i = 0; i < n_entries && rc == TS_OK; i++) {
        entry_t *x = &e[i];
        ts_local_t *l = x->monolith ? &mono : &loc;
        prog.name = x->name;
        prog.done = 0;
        prog.total = steps * ((n + chunk - 1) / chunk);
        ts_local_gen_t g = {.policy = x->monolith ? TS_POLICY_UNIFORM : x->policy,
                            .select = x->select, .tau = tau_used, .cfg = cfg,
                            .log_prior = x->prior ? log_prior : NULL, .sampler = so,
                            .n = n, .labels = labels, .seeds = seeds, .on_step = on_step,
                            .step_ctx = &prog};
        if (x->monolith)
            ts_selection_parse("top1", &g.select, NULL, 0);
        ts_local_stats_t st = {0};
        rc = ts_local_generate(l, &eng, &g, images, &st, err, sizeof err);
        if (prog.tty)
            fprintf(stderr, "\r%60s\r", "");
        if (rc != TS_OK)
            break;
        quantise(images, n * chw);
        memcpy(x->grid, images, (size_t)(grid_n * chw) * sizeof(float));
        rc = classify(cls, &eng, images, n, C, S, S, feat, pred);
        if (rc == TS_OK)
            rc = score(feat, pred, labels, n, D, K, mu_ref, cov_ref, x, err, sizeof err);
        x->evals = (double)st.forwards / n;
        x->router_evals = (double)st.router_evals / n;
        x->seconds = st.seconds;
        if (rc == TS_OK)
            fprintf(stderr, "%-40s FD %.3f  coverage %.3f  agreement %.3f  %.1f evals/sample  "
                            "%.1f s\n",
                    x->name, x->fd, x->coverage, x->agreement, x->evals, x->seconds);
    }
    if (rc != TS_OK)
        goto done;

    char setup[1024];
    snprintf(setup, sizeof setup,
             "%d samples per entry (sample i: noise stream %llu + i, class i mod %d), %d %s steps, "
             "CFG %g, experts from %s (K = %d)%s%s; reference: %d images of the test split; "
             "features: %s (%d dims). FD is biased upward at small n; the first row is the FD of "
             "%d train images, what a perfect generator would score.",
             n, (unsigned long long)seed, c->num_classes, steps, sampler, (double)cfg, dir,
             loc.ex.K, wants_monolith ? ", monolith " : "", wants_monolith ? monolith : "", ref_n,
             classifier, D, n);
    if (report &&
        (rc = write_report(report, e, n_entries, &floor_row, setup, grid_n, c, err,
                           sizeof err)) != TS_OK)
        goto done;
    if (json) {
        json_t *list = json_array();
        json_array_append_new(list, entry_json(&floor_row));
        for (int i = 0; i < n_entries; i++)
            json_array_append_new(list, entry_json(&e[i]));
        json_t *root = json_pack("{s:i, s:i, s:s, s:f, s:I, s:i, s:s, s:i, s:s*, s:s*, s:o}",
                                 "n", n, "steps", steps, "sampler", sampler, "cfg", (double)cfg,
                                 "seed", (json_int_t)seed, "ref_n", ref_n, "local", dir,
                                 "experts", loc.ex.K, "monolith", monolith, "report", report,
                                 "entries", list);
        if (root) {
            json_dumpf(root, stdout, JSON_COMPACT);
            printf("\n");
        }
        json_decref(root);
    } else {
        print_table(e, n_entries, &floor_row);
    }
    if (report)
        fprintf(stderr, PROG ": report → %s\n", report);

done:
    if (rc != TS_OK)
        fprintf(stderr, PROG ": %s%s%s\n", err, *err ? ": " : "", ts_strerror(rc));
    for (int i = 0; i < n_entries; i++)
        free(e[i].grid);
    free(e);
    free(images);
    free(feat);
    free(pred);
    free(labels);
    free(seeds);
    free(mu_ref);
    free(cov_ref);
    free(log_prior);
    ts_dataset_free(&test);
    ts_dataset_free(&train);
    ts_classifier_free(cls);
    ts_local_free(&mono);
    ts_local_free(&loc);
    ts_engine_free(&eng);
    return rc == TS_OK ? 0 : usage ? 2 : 1;
}
