/*
 * eval_report.c — `tessera eval`'s results as they are printed: the table on stdout, an entry as
 * JSON (with its routing along t as means over the samples), and the self-contained HTML report
 * (client/report.h): the main table, FD bars, the quality/cost frontier, the per-class FD, the
 * routing along t and a sample grid per entry.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "client/eval_internal.h"
#include "client/report.h"

void ts_eval_report_table(const entry_t *e, int n_entries, const entry_t *floor_row, int boot) {
    printf("%-40s %8s %17s %9s %6s %6s %6s %6s %7s %7s\n", "policy", "FD",
           boot ? "95% interval" : "", boot ? "vs first" : "", "prec", "recall", "IS", "agree",
           "evals", "seconds");
    const entry_t *rows[MAX_ENTRIES + 1];
    int n = 0;
    rows[n++] = floor_row;
    for (int i = 0; i < n_entries; i++)
        rows[n++] = &e[i];
    for (int i = 0; i < n; i++) {
        const entry_t *x = rows[i];
        char ci[48] = "", d[32] = "";
        if (boot && isfinite(x->fd_lo))
            snprintf(ci, sizeof ci, "[%.3f, %.3f]", x->fd_lo, x->fd_hi);
        if (boot && isfinite(x->d_fd))
            snprintf(d, sizeof d, "%+.3f%s", x->d_fd, x->d_lo > 0 || x->d_hi < 0 ? "*" : "");
        printf("%-40.40s %8.3f %17s %9s %6.3f %6.3f %6.2f %6.3f %7.1f %7.1f\n", x->name, x->fd, ci,
               d, x->precision, x->recall, x->is, x->agreement, x->evals, x->seconds);
    }
    if (boot)
        printf("(vs first: FD minus the first entry's; * where its paired 95%% interval excludes "
               "0)\n");
}

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *pair(double lo, double hi) {
    return isfinite(lo) ? json_pack("[f, f]", lo, hi) : json_null();
}

/* The entry's routing along t as JSON: per evaluation, t and the means over the samples. */
static json_t *route_json(const route_diag_t *r) {
    json_t *t = json_array(), *h = json_array(), *top = json_array(), *sp = json_array(),
           *sw = json_array();
    double total_switches = 0.0;
    int64_t samples = r->n_eval ? r->count[0] : 0;
    for (int j = 0; j < r->n_eval; j++) {
        double c = r->count[j] ? (double)r->count[j] : NAN;
        json_array_append_new(t, json_real(r->t[j]));
        json_array_append_new(h, num(r->entropy[j] / c));
        json_array_append_new(top, num(r->top_p[j] / c));
        json_array_append_new(sp,
                              num(r->spread_count[j] ? r->spread[j] / r->spread_count[j] : NAN));
        json_array_append_new(sw, num(j ? r->switches[j] / c : NAN));
        total_switches += r->switches[j];
    }
    return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "t", t, "entropy_bits", h, "top_p", top,
                     "spread", sp, "switch_rate", sw, "switches_per_sample",
                     num(samples ? total_switches / (double)samples : NAN));
}

json_t *ts_eval_report_entry_json(const entry_t *x, int K, int Kp, const char *first,
                                  const char *samples) {
    json_t *o = json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:f, s:f, s:f}",
                          "policy", x->name, "fd", num(x->fd), "fd_ci95", pair(x->fd_lo, x->fd_hi),
                          "fd_bootstrap_bias", num(x->fd_bias), "precision", num(x->precision),
                          "recall", num(x->recall), "inception_score", num(x->is), "is_ci95",
                          pair(x->is_lo, x->is_hi), "coverage_bits", num(x->coverage), "agreement",
                          num(x->agreement), "evals_per_sample", x->evals,
                          "router_evals_per_sample", x->router_evals, "seconds", x->seconds);
    if (!o)
        return NULL;
    if (first && isfinite(x->d_fd))
        json_object_set_new(o, "fd_minus_first",
                            json_pack("{s:s, s:f, s:o}", "first", first, "value", x->d_fd, "ci95",
                                      pair(x->d_lo, x->d_hi)));
    json_t *cf = json_array();
    for (int c = 0; c < K && c < MAX_CLASSES; c++)
        json_array_append_new(cf, num(x->class_fd[c]));
    json_object_set_new(o, "per_class_fd", cf);
    if (Kp > 0) {
        json_t *pc = json_array();
        for (int k = 0; k < Kp; k++)
            json_array_append_new(pc, json_pack("{s:i, s:f, s:o}", "cluster", k, "share",
                                                x->cluster_share[k], "fd", num(x->cluster_fd[k])));
        json_object_set_new(o, "per_cluster", pc);
    }
    if (samples)
        json_object_set_new(o, "samples", json_string(samples));
    if (!x->monolith && x->route.n_eval)
        json_object_set_new(o, "route", route_json(&x->route));
    return o;
}

/* The report's routing along t: the routing distribution's entropy, the selected experts' spread
 * and the switch rate, one line per routed entry (the entries share their evaluation times). */
static void route_figures(ts_report_t *r, const entry_t *e, int n_entries) {
    const entry_t *first = NULL;
    int ns = 0;
    for (int i = 0; i < n_entries; i++)
        if (!e[i].monolith && e[i].route.n_eval) {
            first = first ? first : &e[i];
            ns++;
        }
    if (!first)
        return;
    int np = first->route.n_eval;
    const char **labels = calloc((size_t)ns, sizeof *labels);
    double *y = calloc((size_t)3 * ns * np, sizeof *y);
    if (!labels || !y) {
        free(labels), free(y);
        return;
    }
    double *h = y, *sp = y + (size_t)ns * np, *sw = y + (size_t)2 * ns * np;
    int s = 0;
    for (int i = 0; i < n_entries; i++) {
        const route_diag_t *q = &e[i].route;
        if (e[i].monolith || !q->n_eval)
            continue;
        labels[s] = e[i].name;
        for (int j = 0; j < np; j++) {
            double c = j < q->n_eval && q->count[j] ? (double)q->count[j] : NAN;
            h[(size_t)s * np + j] = j < q->n_eval ? q->entropy[j] / c : NAN;
            sp[(size_t)s * np + j] = j < q->n_eval && q->spread_count[j]
                                         ? q->spread[j] / (double)q->spread_count[j]
                                         : NAN;
            sw[(size_t)s * np + j] = j > 0 && j < q->n_eval ? q->switches[j] / c : NAN;
        }
        s++;
    }
    ts_report_heading(r, 2, "Routing along t (sampling runs from t = 1 to 0)");
    ts_report_paragraph(r, "The entropy of each sample's routing distribution before the "
                           "selection (its scores' softmax, class prior included), the selected "
                           "experts' disagreement Σ_k w_k ‖v_k − v‖² per pixel, and the share of "
                           "samples whose top expert differs from the previous evaluation's, "
                           "averaged over the samples at each evaluation.");
    ts_report_lines_svg(r, "Routing entropy", "t", "bits", labels, first->route.t, h, ns, np);
    ts_report_lines_svg(r, "Selected experts' disagreement", "t", "Σ w‖v_k − v‖² / pixel", labels,
                        first->route.t, sp, ns, np);
    ts_report_lines_svg(r, "Top expert switches", "t", "share of samples", labels, first->route.t,
                        sw, ns, np);
    free(labels), free(y);
}

/* The report's per-class FD table. */
static void class_table(ts_report_t *r, const entry_t *e, int n_entries, int K) {
    if (K > MAX_CLASSES)
        return;
    int cols = K + 1;
    char(*cbuf)[MAX_CLASSES + 1][32] = calloc((size_t)n_entries + 1, sizeof *cbuf);
    const char **cells = calloc((size_t)(n_entries + 1) * cols, sizeof *cells);
    if (cbuf && cells) {
        cells[0] = "policy";
        for (int c = 0; c < K; c++) {
            snprintf(cbuf[0][c + 1], 32, "class %d", c);
            cells[c + 1] = cbuf[0][c + 1];
        }
        for (int i = 0; i < n_entries; i++) {
            cells[(i + 1) * cols] = e[i].name;
            for (int c = 0; c < K; c++) {
                snprintf(cbuf[i + 1][c + 1], 32, "%.2f", e[i].class_fd[c]);
                cells[(i + 1) * cols + c + 1] = cbuf[i + 1][c + 1];
            }
        }
        ts_report_heading(r, 2,
                          "FD per class (samples asked for class c against the test images of c)");
        ts_report_table(r, cols, n_entries + 1, cells);
    }
    free(cbuf), free(cells);
}

/* The report's main table, FD bars and the quality/cost frontier (the floor row first). */
static int main_table(ts_report_t *r, const entry_t *e, int n_entries, const entry_t *floor_row) {
    enum { COLS = 10 };
    const char *head[COLS] = {"policy", "FD", "95 % interval", "FD − first (95 %)", "precision",
                              "recall", "IS", "agreement",     "evals/sample",      "seconds"};
    int rows = n_entries + 2, n = n_entries + 1;
    char(*buf)[COLS][160] = calloc((size_t)rows, sizeof *buf);
    const char **cells = calloc((size_t)rows * COLS, sizeof *cells);
    const char **labels = calloc((size_t)n, sizeof *labels);
    double *v = calloc((size_t)n * 4, sizeof *v), *fds = v, *xs = v + n, *lo = xs + n, *hi = lo + n;
    int rc = buf && cells && labels && v ? TS_OK : TS_ENOMEM;
    for (int j = 0; rc == TS_OK && j < COLS; j++)
        cells[j] = head[j];
    for (int i = 0; rc == TS_OK && i < n; i++) {
        const entry_t *x = i == 0 ? floor_row : &e[i - 1];
        char(*b)[160] = buf[i + 1];
        snprintf(b[0], 160, "%s", x->name);
        snprintf(b[1], 160, "%.3f", x->fd);
        snprintf(b[2], 160, isfinite(x->fd_lo) ? "[%.3f, %.3f]" : "", x->fd_lo, x->fd_hi);
        snprintf(b[3], 160, isfinite(x->d_fd) ? "%+.3f [%+.3f, %+.3f]" : "", x->d_fd, x->d_lo,
                 x->d_hi);
        snprintf(b[4], 160, "%.3f", x->precision);
        snprintf(b[5], 160, "%.3f", x->recall);
        snprintf(b[6], 160, "%.2f", x->is);
        snprintf(b[7], 160, "%.3f", x->agreement);
        snprintf(b[8], 160, "%.1f", x->evals);
        snprintf(b[9], 160, "%.1f", x->seconds);
        for (int j = 0; j < COLS; j++)
            cells[(i + 1) * COLS + j] = b[j];
        labels[i] = x->name;
        fds[i] = x->fd;
        xs[i] = x->evals;
        lo[i] = isfinite(x->fd_lo) ? x->fd_lo : x->fd;
        hi[i] = isfinite(x->fd_hi) ? x->fd_hi : x->fd;
    }
    if (rc == TS_OK) {
        ts_report_table(r, COLS, rows, cells);
        ts_report_bar_chart_svg(r, "Fréchet distance (lower is better)", labels, fds, n, NULL);
        /* the frontier: the entries only (the floor has no cost) */
        ts_report_scatter_svg(r,
                              "Quality against cost: FD (95 % interval) vs expert evaluations "
                              "per sample",
                              "expert evaluations per sample (log scale)", "FD", labels + 1, xs + 1,
                              fds + 1, lo + 1, hi + 1, n_entries);
    }
    free(buf), free(cells), free(labels), free(v);
    return rc;
}

int ts_eval_report_write(const char *path, const entry_t *e, int n_entries,
                         const entry_t *floor_row, const char *setup, int grid_n, int K,
                         const ts_dit_config_t *c, const ts_cli_judge_t *jd, int J,
                         const ts_space_score_t *jsc, char *err, size_t errlen) {
    ts_report_t *r = NULL;
    int rc = ts_report_open(&r, path, "tessera eval", err, errlen);
    if (rc != TS_OK)
        return rc;
    ts_report_heading(r, 1, "tessera eval: routing policies compared");
    ts_report_paragraph(r, setup);
    if (main_table(r, e, n_entries, floor_row) != TS_OK) {
        ts_report_discard(r);
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    class_table(r, e, n_entries, K);
    if (J) {
        char *names[MAX_ENTRIES];
        for (int i = 0; i < n_entries; i++)
            names[i] = (char *)e[i].name;
        if (ts_cli_judges_report(r, names, n_entries, jd, J, jsc) != TS_OK) {
            ts_report_discard(r);
            return ts_fail(err, errlen, TS_ENOMEM, "out of memory for the judges' tables");
        }
    }
    route_figures(r, e, n_entries);
    ts_report_heading(r, 2, "Samples");
    for (int i = 0; i < n_entries; i++) {
        char cap[256];
        snprintf(cap, sizeof cap, "%s: FD %.3f, %.1f expert evaluations per sample", e[i].name,
                 e[i].fd, e[i].evals);
        ts_report_heading(r, 3, e[i].name);
        ts_report_png_grid(r, e[i].grid, grid_n, c->in_channels, c->input_size, c->input_size, 10,
                           cap);
    }
    return ts_report_close(r, err, errlen);
}
