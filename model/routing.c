/*
 * routing.c — scores to weights over the experts (model/routing.h): parsing of policies and
 * selections, a stable softmax per row, the sparsifying rules and the renormalisation.
 *
 * Numerics: each row's softmax is computed in double after subtracting the row's maximum (so no
 * score can overflow exp); the selected probabilities are renormalised in double and rounded to
 * float once. A single selected expert therefore gets exactly 1.0f, and a row always sums to 1
 * up to one float rounding per entry.
 *
 * Order: experts are ranked by probability, then by raw score (two scores far apart can both
 * round to a probability of 0), then by index, lower first. The ranking is a total order, so
 * top-k and threshold=p pick the same set on every machine for the same scores.
 *
 * What it is not: a policy. Where the scores come from (a router, distances to centroids) is
 * the caller's business; this file only sees numbers.
 */
#include "model/routing.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define SELECT_HELP                                                                                \
    "want top1, top2, ..., full, threshold=p with 0 < p <= 1, or a schedule such as "              \
    "t>0.7:full,t>0.3:top2,top1"

/* ---- parsing --------------------------------------------------------------------------------- */

static const char *const policy_names[] = {"learned", "centroid", "confidence", "uniform"};

int ts_policy_parse(const char *text, ts_policy_t *policy) {
    if (!text || !policy)
        return TS_EINVAL;
    for (int i = 0; i < 4; i++)
        if (strcmp(text, policy_names[i]) == 0) {
            *policy = (ts_policy_t)i;
            return TS_OK;
        }
    return TS_EINVAL;
}

const char *ts_policy_name(ts_policy_t policy) {
    return (int)policy >= 0 && (int)policy < 4 ? policy_names[policy] : "?";
}

/* Copies text[0..len) without surrounding blanks into out (cap bytes); 0 when it does not fit. */
static int copy_trimmed(char *out, size_t cap, const char *text, size_t len) {
    while (len > 0 && isspace((unsigned char)text[0])) {
        text++;
        len--;
    }
    while (len > 0 && isspace((unsigned char)text[len - 1]))
        len--;
    if (len + 1 > cap)
        return 0;
    memcpy(out, text, len);
    out[len] = '\0';
    return 1;
}

/* A whole string as a finite double; 0 on anything else (empty, trailing junk, nan). */
static int parse_double(const char *s, double *out) {
    if (!*s || isspace((unsigned char)*s))
        return 0;
    char *end;
    double v = strtod(s, &end);
    if (*end || !isfinite(v))
        return 0;
    *out = v;
    return 1;
}

/* One rule body: "top3", "full", "threshold=0.9". */
static int parse_body(const char *body, ts_select_rule_t *r, const char *text, char *err,
                      size_t errlen) {
    if (strcmp(body, "full") == 0) {
        r->kind = TS_SELECT_FULL;
        return TS_OK;
    }
    if (strncmp(body, "top", 3) == 0) {
        const char *d = body + 3;
        size_t nd = strlen(d);
        int ok = nd >= 1 && nd <= 3;
        for (size_t i = 0; ok && i < nd; i++)
            ok = isdigit((unsigned char)d[i]) != 0;
        long k = ok ? strtol(d, NULL, 10) : 0;
        if (!ok || k < 1 || k > TS_ROUTE_MAX_EXPERTS) {
            ts_set_err(err, errlen,
                       "selection '%s': '%s' is not a valid top-k (want top1 .. top%d)", text, body,
                       TS_ROUTE_MAX_EXPERTS);
            return TS_EINVAL;
        }
        r->kind = TS_SELECT_TOPK;
        r->k = (int)k;
        return TS_OK;
    }
    if (strncmp(body, "threshold=", 10) == 0) {
        double p;
        if (!parse_double(body + 10, &p) || !(p > 0.0) || p > 1.0) {
            ts_set_err(err, errlen,
                       "selection '%s': '%s' needs a probability 0 < p <= 1 after 'threshold='",
                       text, body);
            return TS_EINVAL;
        }
        r->kind = TS_SELECT_THRESHOLD;
        r->p = (float)p;
        return TS_OK;
    }
    ts_set_err(err, errlen, "selection '%s': unknown selection '%s' (%s)", text, body, SELECT_HELP);
    return TS_EINVAL;
}

int ts_selection_parse(const char *text, ts_selection_t *sel, char *err, size_t errlen) {
    if (!text || !sel) {
        ts_set_err(err, errlen, "ts_selection_parse: invalid arguments");
        return TS_EINVAL;
    }
    /* an empty rule anywhere ("top1,", "a,,b") is named first: it is the likelier typo */
    for (const char *q = text;;) {
        const char *comma = strchr(q, ',');
        size_t len = comma ? (size_t)(comma - q) : strlen(q), i = 0;
        while (i < len && isspace((unsigned char)q[i]))
            i++;
        if (i == len) {
            ts_set_err(err, errlen, "selection '%s': empty rule (%s)", text, SELECT_HELP);
            return TS_EINVAL;
        }
        if (!comma)
            break;
        q = comma + 1;
    }
    ts_selection_t out;
    memset(&out, 0, sizeof out);
    const char *p = text;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[128];
        if (!copy_trimmed(item, sizeof item, p, len)) {
            ts_set_err(err, errlen, "selection '%s': a rule is too long", text);
            return TS_EINVAL;
        }
        if (out.n_rules == TS_ROUTE_MAX_RULES) {
            ts_set_err(err, errlen, "selection '%s': more than %d rules at '%s'", text,
                       TS_ROUTE_MAX_RULES, item);
            return TS_EINVAL;
        }
        ts_select_rule_t *r = &out.rules[out.n_rules];
        r->t_above = -1.0f;
        char *body = item;
        if (item[0] == 't' && item[1] == '>') {
            /* "t>x:body" */
            char *colon = strchr(item, ':');
            double x;
            if (!colon) {
                ts_set_err(err, errlen,
                           "selection '%s': rule '%s' is malformed (a condition reads t>x:rule, "
                           "e.g. t>0.7:full)",
                           text, item);
                return TS_EINVAL;
            }
            *colon = '\0';
            char num[64];
            if (!copy_trimmed(num, sizeof num, item + 2, strlen(item + 2)) ||
                !parse_double(num, &x) || x < 0.0 || x >= 1.0) {
                ts_set_err(err, errlen, "selection '%s': condition 't>%s' needs a time 0 <= x < 1",
                           text, item + 2);
                return TS_EINVAL;
            }
            r->t_above = (float)x;
            body = colon + 1;
            while (isspace((unsigned char)*body))
                body++;
            if (out.n_rules > 0 && r->t_above >= out.rules[out.n_rules - 1].t_above) {
                ts_set_err(err, errlen,
                           "selection '%s': condition 't>%s' can never apply: the rule before "
                           "it already takes every t > %g (order conditions from high t to low)",
                           text, item + 2, (double)out.rules[out.n_rules - 1].t_above);
                return TS_EINVAL;
            }
        } else if (comma) {
            ts_set_err(err, errlen,
                       "selection '%s': rule '%s' has no condition but is not the last (only "
                       "the last rule of a schedule may omit t>x:)",
                       text, item);
            return TS_EINVAL;
        }
        int rc = parse_body(body, r, text, err, errlen);
        if (rc)
            return rc;
        out.n_rules++;
        if (!comma)
            break;
        p = comma + 1;
    }
    if (out.rules[out.n_rules - 1].t_above >= 0.0f) {
        ts_set_err(err, errlen,
                   "selection '%s': the last rule needs no condition (it applies when no t>x: "
                   "rule does), e.g. t>0.7:full,top1",
                   text);
        return TS_EINVAL;
    }
    *sel = out;
    return TS_OK;
}

const ts_select_rule_t *ts_selection_rule(const ts_selection_t *sel, float t) {
    if (!sel || sel->n_rules < 1 || sel->n_rules > TS_ROUTE_MAX_RULES)
        return NULL;
    for (int i = 0; i < sel->n_rules - 1; i++)
        if (t > sel->rules[i].t_above)
            return &sel->rules[i];
    return &sel->rules[sel->n_rules - 1];
}

char *ts_selection_format(const ts_selection_t *sel, char *buf, size_t len) {
    if (!buf || len == 0)
        return buf;
    buf[0] = '\0';
    if (!sel)
        return buf;
    size_t used = 0;
    for (int i = 0; i < sel->n_rules && i < TS_ROUTE_MAX_RULES && used < len; i++) {
        const ts_select_rule_t *r = &sel->rules[i];
        char cond[32] = "", body[48];
        if (r->t_above >= 0.0f)
            snprintf(cond, sizeof cond, "t>%g:", (double)r->t_above);
        if (r->kind == TS_SELECT_FULL)
            snprintf(body, sizeof body, "full");
        else if (r->kind == TS_SELECT_TOPK)
            snprintf(body, sizeof body, "top%d", r->k);
        else
            snprintf(body, sizeof body, "threshold=%g", (double)r->p);
        int w = snprintf(buf + used, len - used, "%s%s%s", i ? "," : "", cond, body);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

/* ---- weights --------------------------------------------------------------------------------- */

/* Ranks the experts of one row: order[0] is the best. prob and score (K) of that row. */
static void rank_row(int *order, const double *prob, const float *score, int K) {
    for (int i = 0; i < K; i++) {
        int j = i;
        while (j > 0) {
            int a = order[j - 1], b = i;
            int before =
                prob[b] > prob[a] ||
                (prob[b] == prob[a] && (score[b] > score[a] || (score[b] == score[a] && b < a)));
            if (!before)
                break;
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
}

int ts_route_weights(float *w, int B, int K, const ts_selection_t *sel, float t) {
    if (!w || B < 0 || K < 1 || K > TS_ROUTE_MAX_EXPERTS)
        return TS_EINVAL;
    const ts_select_rule_t *rule = ts_selection_rule(sel, t);
    if (!rule)
        return TS_EINVAL;
    double prob[TS_ROUTE_MAX_EXPERTS];
    float score[TS_ROUTE_MAX_EXPERTS];
    int order[TS_ROUTE_MAX_EXPERTS];
    for (int b = 0; b < B; b++) {
        float *row = w + (size_t)b * K;
        /* stable softmax: subtract the largest score; −inf scores get probability 0 */
        double mx = -INFINITY;
        for (int k = 0; k < K; k++) {
            score[k] = row[k];
            if (isnan(row[k]) || row[k] == INFINITY)
                return TS_ENONFINITE;
            if (row[k] > mx)
                mx = row[k];
        }
        if (mx == -INFINITY)
            return TS_ENONFINITE; /* no expert has a finite score */
        double sum = 0.0;
        for (int k = 0; k < K; k++) {
            prob[k] = exp((double)score[k] - mx);
            sum += prob[k];
        }
        for (int k = 0; k < K; k++)
            prob[k] /= sum;
        /* how many of the ranked experts to keep */
        rank_row(order, prob, score, K);
        int keep = K;
        if (rule->kind == TS_SELECT_TOPK) {
            keep = rule->k < 1 ? 1 : (rule->k < K ? rule->k : K);
        } else if (rule->kind == TS_SELECT_THRESHOLD) {
            double cum = 0.0;
            for (keep = 0; keep < K;) {
                cum += prob[order[keep++]];
                if (cum >= (double)rule->p)
                    break;
            }
        }
        double kept = 0.0;
        for (int i = 0; i < keep; i++)
            kept += prob[order[i]];
        for (int k = 0; k < K; k++)
            row[k] = 0.0f;
        for (int i = 0; i < keep; i++) {
            int k = order[i];
            /* kept > 0: the best expert has probability ≥ 1/K */
            row[k] = keep == 1 ? 1.0f : (float)(prob[k] / kept);
        }
    }
    return TS_OK;
}

void ts_route_sq_dist(float *out, const float *e, const float *c, int B, int K, int D) {
    if (!out || !e || !c || B < 0 || K < 0 || D < 0)
        return;
    for (int b = 0; b < B; b++) {
        const float *eb = e + (size_t)b * D;
        for (int k = 0; k < K; k++) {
            const float *ck = c + (size_t)k * D;
            double s = 0.0;
            for (int d = 0; d < D; d++) {
                double diff = (double)eb[d] - (double)ck[d];
                s += diff * diff;
            }
            out[(size_t)b * K + k] = (float)s;
        }
    }
}
