/*
 * test_daemon_metrics.c — the daemon's metrics (daemon/metrics.h) and their HTTP endpoint
 * (daemon/metrics_http.h), read the way Prometheus reads them: over a real socket, through a
 * strict parser of the text exposition format 0.0.4 written here.
 *
 * The parser accepts only what the format allows, and where the format is lax it demands the
 * canonical form the writer promises (one space between fields, no empty lines, no trailing comma
 * in a label set). It checks: every line a comment, # HELP, # TYPE or a sample; at most one HELP
 * and one TYPE per family, the TYPE before the family's first sample; a family's lines in one
 * group; valid metric and label names, each label once per sample; label values properly escaped
 * and UTF-8; values that Go's ParseFloat reads; no series twice; counters non-negative; for each
 * histogram series, _bucket lines with le strictly increasing ending at +Inf, cumulative counts
 * that never decrease, +Inf equal to _count, and a _sum.
 *
 * `test_daemon_metrics --dump` prints a populated daemon registry instead of running the tests, for
 * tests/test_promtool.sh (promtool check metrics).
 */
#define _GNU_SOURCE /* strcasestr */

#include <arpa/inet.h>
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include <cmocka.h>

#include "daemon/metrics.h"
#include "daemon/metrics_http.h"

#ifndef TS_OPERATIONS_MD
#error "TS_OPERATIONS_MD (docs/operations.md) must be defined by the build"
#endif

/* ---- a strict parser of the text exposition format ----------------------------------------- */

#define P_MAX_FAMILIES 128
#define P_MAX_SAMPLES 2048
#define P_KEY 512

typedef struct {
    char name[128];
    char type[16]; /* "" until its TYPE line */
    int has_help, closed;
} p_family_t;

typedef enum { S_PLAIN, S_BUCKET, S_SUM, S_COUNT } p_suffix_t;

typedef struct {
    char key[P_KEY];  /* name{labels sorted by name, values unescaped}, the series' identity */
    char base[P_KEY]; /* the family name and labels without le: a histogram series' identity */
    int family;
    p_suffix_t suffix;
    double le; /* _bucket only */
    double value;
} p_sample_t;

typedef struct {
    p_family_t families[P_MAX_FAMILIES];
    int n_families;
    p_sample_t samples[P_MAX_SAMPLES];
    int n_samples;
    int current; /* the family whose group is open, -1 */
    char err[512];
} prom_t;

static int perr(prom_t *p, int line, const char *fmt, ...) {
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(p->err, sizeof p->err, "line %d: %s", line, what);
    return -1;
}

static int is_name_char(char c, int first, int colon_ok) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_ok && c == ':') ||
           (!first && c >= '0' && c <= '9');
}

/* Reads a name at *s into out; returns its length (0 when there is none). */
static size_t read_name(const char **s, char *out, size_t cap, int colon_ok) {
    size_t n = 0;
    while (is_name_char((*s)[n], n == 0, colon_ok) && n + 1 < cap) {
        out[n] = (*s)[n];
        n++;
    }
    out[n] = '\0';
    *s += n;
    return n;
}

/* A float as Go's ParseFloat takes it in this format: decimal, or +Inf, -Inf, NaN. */
static int parse_value(const char *tok, double *v) {
    if (strcmp(tok, "+Inf") == 0 || strcmp(tok, "-Inf") == 0 || strcmp(tok, "NaN") == 0) {
        *v = tok[0] == 'N' ? NAN : tok[0] == '+' ? INFINITY : -INFINITY;
        return 0;
    }
    if (!*tok || strspn(tok, "0123456789.eE+-") != strlen(tok))
        return -1;
    char *end;
    *v = strtod(tok, &end);
    return *end ? -1 : 0;
}

static int find_family(const prom_t *p, const char *name) {
    for (int i = 0; i < p->n_families; i++)
        if (strcmp(p->families[i].name, name) == 0)
            return i;
    return -1;
}

/* The family a HELP or TYPE line names, created on first mention; opening its group closes the
 * previous one, and a closed group may not reopen. */
static int enter_family(prom_t *p, int line, const char *name) {
    int f = find_family(p, name);
    if (f < 0) {
        if (p->n_families == P_MAX_FAMILIES)
            return perr(p, line, "too many families");
        f = p->n_families++;
        snprintf(p->families[f].name, sizeof p->families[f].name, "%s", name);
    }
    if (f != p->current) {
        if (p->families[f].closed)
            return perr(p, line, "family %s appears in two separate groups", name);
        if (p->current >= 0)
            p->families[p->current].closed = 1;
        p->current = f;
    }
    return f;
}

static int parse_comment(prom_t *p, int line, const char *s) {
    int help = strncmp(s, "# HELP ", 7) == 0, type = strncmp(s, "# TYPE ", 7) == 0;
    if (!help && !type)
        return 0; /* any other comment */
    const char *at = s + 7;
    char name[128];
    if (!read_name(&at, name, sizeof name, 1))
        return perr(p, line, "%s without a valid metric name", help ? "HELP" : "TYPE");
    int f = enter_family(p, line, name);
    if (f < 0)
        return -1;
    p_family_t *fam = &p->families[f];
    if (help) {
        if (*at && *at != ' ')
            return perr(p, line, "HELP %s: the name runs into the text", name);
        if (fam->has_help++)
            return perr(p, line, "a second HELP for %s", name);
        for (const char *c = at; *c; c++)
            if (*c == '\\' && c[1] != '\\' && c[1] != 'n')
                return perr(p, line, "HELP %s: an escape other than \\\\ or \\n", name);
            else if (*c == '\\')
                c++;
        return 0;
    }
    if (*at != ' ')
        return perr(p, line, "TYPE %s without a type", name);
    at++;
    if (strcmp(at, "counter") && strcmp(at, "gauge") && strcmp(at, "histogram") &&
        strcmp(at, "summary") && strcmp(at, "untyped"))
        return perr(p, line, "TYPE %s: unknown type '%s'", name, at);
    if (fam->type[0])
        return perr(p, line, "a second TYPE for %s", name);
    for (int i = 0; i < p->n_samples; i++)
        if (p->samples[i].family == f)
            return perr(p, line, "TYPE %s after its samples", name);
    snprintf(fam->type, sizeof fam->type, "%s", at);
    return 0;
}

typedef struct {
    char name[128];
    char value[256];
} p_label_t;

static int cmp_label(const void *a, const void *b) {
    return strcmp(((const p_label_t *)a)->name, ((const p_label_t *)b)->name);
}

/* {name="value",...} at *s, unescaping the values. Returns the number of labels or -1. */
static int parse_labels(prom_t *p, int line, const char **s, p_label_t *labels, int cap) {
    int n = 0;
    const char *at = *s + 1;
    if (*at == '}') {
        *s = at + 1;
        return 0;
    }
    for (;;) {
        if (n == cap)
            return perr(p, line, "too many labels");
        p_label_t *l = &labels[n];
        if (!read_name(&at, l->name, sizeof l->name, 0))
            return perr(p, line, "a label without a valid name");
        if (strncmp(l->name, "__", 2) == 0)
            return perr(p, line, "label %s: names starting with __ are reserved", l->name);
        for (int j = 0; j < n; j++)
            if (strcmp(labels[j].name, l->name) == 0)
                return perr(p, line, "label %s given twice", l->name);
        if (at[0] != '=' || at[1] != '"')
            return perr(p, line, "label %s: want =\"", l->name);
        at += 2;
        size_t k = 0;
        for (; *at != '"'; at++) {
            if (!*at)
                return perr(p, line, "label %s: unterminated value", l->name);
            char c = *at;
            if (c == '\\') {
                at++;
                c = *at == 'n' ? '\n' : *at;
                if (*at != '\\' && *at != '"' && *at != 'n')
                    return perr(p, line, "label %s: bad escape \\%c", l->name, *at);
            }
            if (k + 1 >= sizeof l->value)
                return perr(p, line, "label %s: value too long", l->name);
            l->value[k++] = c;
        }
        l->value[k] = '\0';
        mbstate_t st;
        memset(&st, 0, sizeof st);
        const char *src = l->value;
        if (mbsrtowcs(NULL, &src, 0, &st) == (size_t)-1)
            return perr(p, line, "label %s: the value is not UTF-8", l->name);
        at++;
        n++;
        if (*at == '}')
            break;
        if (*at != ',' || at[1] == '}')
            return perr(p, line, "after label %s: want , and another label, or }", l->name);
        at++;
    }
    *s = at + 1;
    return n;
}

static void make_key(char *out, const char *name, p_label_t *labels, int n, int skip_le) {
    qsort(labels, (size_t)n, sizeof *labels, cmp_label);
    size_t k = (size_t)snprintf(out, P_KEY, "%s", name);
    int first = 1;
    for (int i = 0; i < n && k < P_KEY; i++) {
        if (skip_le && strcmp(labels[i].name, "le") == 0)
            continue;
        k += (size_t)snprintf(out + k, P_KEY - k, "%s%s=\"%s\"", first ? "{" : ",", labels[i].name,
                              labels[i].value);
        first = 0;
    }
    if (!first && k < P_KEY)
        snprintf(out + k, P_KEY - k, "}");
}

/* The family a sample name belongs to, and which of a histogram's lines it is. */
static int family_of_sample(prom_t *p, int line, const char *name, p_suffix_t *suffix) {
    int f = find_family(p, name);
    *suffix = S_PLAIN;
    static const char *const sfx[] = {"_bucket", "_sum", "_count"};
    for (int k = 0; f < 0 && k < 3; k++) {
        size_t n = strlen(name), sn = strlen(sfx[k]);
        if (n <= sn || strcmp(name + n - sn, sfx[k]) != 0)
            continue;
        char base[128];
        snprintf(base, sizeof base, "%.*s", (int)(n - sn), name);
        int b = find_family(p, base);
        if (b >= 0 && strcmp(p->families[b].type, "histogram") == 0) {
            f = b;
            *suffix = (p_suffix_t)(S_BUCKET + k);
        }
    }
    if (f < 0 || !p->families[f].type[0])
        return perr(p, line, "sample %s before any TYPE line for it", name);
    if (strcmp(p->families[f].type, "histogram") == 0 && *suffix == S_PLAIN)
        return perr(p, line, "histogram %s sampled without _bucket, _sum or _count", name);
    if (f != p->current)
        return perr(p, line, "sample %s outside the group of its family's HELP and TYPE", name);
    return f;
}

static int parse_sample(prom_t *p, int line, const char *s) {
    char name[128];
    if (!read_name(&s, name, sizeof name, 1))
        return perr(p, line, "not a comment and not a sample");
    p_label_t labels[8];
    int nl = 0;
    if (*s == '{' && (nl = parse_labels(p, line, &s, labels, 8)) < 0)
        return -1;
    if (*s != ' ')
        return perr(p, line, "%s: want one space before the value", name);
    s++;
    char tok[64];
    size_t tl = strcspn(s, " ");
    if (tl == 0 || tl >= sizeof tok)
        return perr(p, line, "%s: no value", name);
    memcpy(tok, s, tl);
    tok[tl] = '\0';
    if (s[tl] == ' ') { /* a timestamp: an integer, and the end of the line */
        const char *ts = s + tl + 1;
        if (!*ts || strspn(ts + (*ts == '-'), "0123456789") != strlen(ts + (*ts == '-')))
            return perr(p, line, "%s: a bad timestamp '%s'", name, ts);
    }
    if (p->n_samples == P_MAX_SAMPLES)
        return perr(p, line, "too many samples");
    p_sample_t *smp = &p->samples[p->n_samples];
    if (parse_value(tok, &smp->value))
        return perr(p, line, "%s: '%s' is not a value", name, tok);
    int f = family_of_sample(p, line, name, &smp->suffix);
    if (f < 0)
        return -1;
    smp->family = f;
    int le = -1;
    for (int i = 0; i < nl; i++)
        if (strcmp(labels[i].name, "le") == 0)
            le = i;
    if ((le >= 0) != (smp->suffix == S_BUCKET))
        return perr(p, line, "%s: le belongs on a histogram's _bucket lines, and only there", name);
    if (le >= 0 && parse_value(labels[le].value, &smp->le))
        return perr(p, line, "%s: le=\"%s\" is not a number", name, labels[le].value);
    if (strcmp(p->families[f].type, "counter") == 0 && !(smp->value >= 0))
        return perr(p, line, "counter %s is %s", name, tok);
    make_key(smp->base, p->families[f].name, labels, nl, 1);
    make_key(smp->key, name, labels, nl, 0);
    for (int i = 0; i < p->n_samples; i++)
        if (strcmp(p->samples[i].key, smp->key) == 0)
            return perr(p, line, "series %s given twice", smp->key);
    p->n_samples++;
    return 0;
}

/* Every histogram series: buckets ascending to +Inf, cumulative, +Inf == _count, a _sum. */
static int check_histograms(prom_t *p) {
    for (int i = 0; i < p->n_samples; i++) {
        const p_sample_t *a = &p->samples[i];
        if (a->suffix != S_COUNT)
            continue;
        double prev_le = -INFINITY, prev_count = 0, inf_count = -1;
        int n_buckets = 0, has_sum = 0;
        for (int j = 0; j < p->n_samples; j++) {
            const p_sample_t *b = &p->samples[j];
            if (b->family != a->family || strcmp(b->base, a->base) != 0)
                continue;
            has_sum |= b->suffix == S_SUM;
            if (b->suffix != S_BUCKET)
                continue;
            if (!(b->le > prev_le))
                return perr(p, 0, "%s: le %g after %g, not increasing", b->key, b->le, prev_le);
            if (b->value < prev_count || b->value != floor(b->value))
                return perr(p, 0, "%s = %g: not cumulative (previous bucket %g)", b->key, b->value,
                            prev_count);
            prev_le = b->le;
            prev_count = b->value;
            n_buckets++;
            if (isinf(b->le))
                inf_count = b->value;
        }
        if (n_buckets == 0 || !isinf(prev_le))
            return perr(p, 0, "%s: the buckets do not end at le=\"+Inf\"", a->base);
        if (inf_count != a->value)
            return perr(p, 0, "%s: _count %g but the +Inf bucket holds %g", a->base, a->value,
                        inf_count);
        if (!has_sum)
            return perr(p, 0, "%s: no _sum", a->base);
    }
    for (int i = 0; i < p->n_samples; i++) { /* and no buckets without a _count */
        const p_sample_t *a = &p->samples[i];
        int found = a->suffix != S_BUCKET && a->suffix != S_SUM;
        for (int j = 0; j < p->n_samples && !found; j++)
            found = p->samples[j].suffix == S_COUNT && p->samples[j].family == a->family &&
                    strcmp(p->samples[j].base, a->base) == 0;
        if (!found)
            return perr(p, 0, "%s without a _count", a->key);
    }
    return 0;
}

/* Parses text into p; 0, or -1 with p->err naming the line and the rule it breaks. */
static int prom_parse(prom_t *p, const char *text) {
    memset(p, 0, sizeof *p);
    p->current = -1;
    size_t len = strlen(text);
    if (len && text[len - 1] != '\n')
        return perr(p, 0, "the last line is not terminated by \\n");
    int line = 0;
    for (const char *at = text; *at;) {
        const char *nl = strchr(at, '\n');
        char buf[4096];
        size_t n = (size_t)(nl - at);
        line++;
        if (n >= sizeof buf)
            return perr(p, line, "a line of %zu bytes", n);
        memcpy(buf, at, n);
        buf[n] = '\0';
        at = nl + 1;
        if (n == 0)
            return perr(p, line, "an empty line");
        if (strchr(buf, '\r') || strchr(buf, '\t'))
            return perr(p, line, "a CR or a tab");
        int rc = buf[0] == '#' ? parse_comment(p, line, buf) : parse_sample(p, line, buf);
        if (rc)
            return rc;
    }
    return check_histograms(p);
}

/* The value of the series key (labels sorted by name); fails the test when it is absent. */
static double prom_value(const prom_t *p, const char *key) {
    for (int i = 0; i < p->n_samples; i++)
        if (strcmp(p->samples[i].key, key) == 0)
            return p->samples[i].value;
    fail_msg("no series %s in the output", key);
    return NAN;
}

static const char *prom_type(const prom_t *p, const char *family) {
    int f = find_family(p, family);
    if (f < 0)
        fail_msg("no family %s in the output", family);
    return p->families[f].type;
}

static void parse_or_fail(prom_t *p, const char *text) {
    if (prom_parse(p, text) != 0)
        fail_msg("invalid exposition: %s\n----\n%s----", p->err, text);
}

/* ---- the parser rejects what it must ------------------------------------------------------- */

static void expect_invalid(const char *text, const char *why) {
    static prom_t p;
    if (prom_parse(&p, text) == 0)
        fail_msg("the parser accepted (%s):\n%s", why, text);
    if (!strstr(p.err, why))
        fail_msg("the parser's error '%s' does not say '%s'", p.err, why);
}

static void test_parser_is_strict(void **state) {
    (void)state;
    static prom_t p;
    const char *good =
        "# HELP a_total Things.\n# TYPE a_total counter\na_total{k=\"v\\\"\\\\\\n\"} "
        "3\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n"
        "h_sum 4.5\nh_count 2\n";
    parse_or_fail(&p, good);
    assert_true(prom_value(&p, "a_total{k=\"v\"\\\n\"}") == 3);
    expect_invalid("a_total 1\n", "before any TYPE");
    expect_invalid("# TYPE a_total counter\na_total 1", "not terminated");
    expect_invalid("# TYPE a_total counter\n\na_total 1\n", "empty line");
    expect_invalid("# TYPE a_total counter\na_total 1\na_total 2\n", "given twice");
    expect_invalid("# TYPE a_total counter\na_total -1\n", "counter a_total is -1");
    expect_invalid("# TYPE a gauge\na{k=\"\\t\"} 1\n", "bad escape");
    expect_invalid("# TYPE a gauge\na{k=\"x\",} 1\n", "want , and another label");
    expect_invalid("# TYPE a gauge\na{k=\"x\",k=\"y\"} 1\n", "given twice");
    expect_invalid("# TYPE a gauge\na{__k=\"x\"} 1\n", "reserved");
    expect_invalid("# TYPE a gauge\na{k=\"\xc3\x28\"} 1\n", "not UTF-8");
    expect_invalid("# TYPE a gauge\na 0x10\n", "not a value");
    expect_invalid("# TYPE a gauge\na inf\n", "not a value");
    expect_invalid("# TYPE a gauge\n# TYPE a gauge\n", "second TYPE");
    expect_invalid("# TYPE a gauge\n# TYPE b gauge\nb 1\n# HELP a x\n", "two separate groups");
    expect_invalid("# TYPE a gauge\n# TYPE b gauge\na 1\n", "outside the group");
    expect_invalid("# TYPE 1a gauge\n", "valid metric name");
    expect_invalid("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum "
                   "0\nh_count 1\n",
                   "not cumulative");
    expect_invalid("# TYPE h histogram\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\nh_sum 0\n"
                   "h_count 1\n",
                   "not increasing");
    expect_invalid("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 0\nh_count 1\n",
                   "do not end at le=\"+Inf\"");
    expect_invalid("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 0\nh_count 2\n",
                   "_count 2 but the +Inf bucket holds 1");
    expect_invalid("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n", "no _sum");
    expect_invalid("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\n", "without a _count");
    expect_invalid("# TYPE h histogram\nh 1\n", "sampled without _bucket");
    expect_invalid("# TYPE g gauge\ng{le=\"1\"} 1\n", "le belongs");
}

/* ---- the registry -------------------------------------------------------------------------- */

static const double B3[] = {0.5, 1, 2.5};

static void expect_register_error(ts_metrics_t *m, ts_metric_spec_t spec, const char *fragment) {
    char err[256] = "";
    int rc = ts_metrics_register(m, &spec, NULL, err, sizeof err);
    if (rc == TS_OK)
        fail_msg("registered '%s' (wanted: %s)", spec.name ? spec.name : "(null)", fragment);
    if (!strstr(err, fragment))
        fail_msg("error '%s' does not say '%s'", err, fragment);
}

static void test_register_validates(void **state) {
    (void)state;
    ts_metrics_t *m;
    assert_int_equal(ts_metrics_create(&m), TS_OK);
    int id = -1;
    char err[256] = "";
    ts_metric_spec_t ok = {"x_total", "x", TS_METRIC_COUNTER, NULL, NULL, NULL, 0};
    assert_int_equal(ts_metrics_register(m, &ok, &id, err, sizeof err), TS_OK);
    assert_int_equal(id, 0);
    ts_metric_spec_t h = {"lat_seconds", "l", TS_METRIC_HISTOGRAM, "op", NULL, B3, 3};
    assert_int_equal(ts_metrics_register(m, &h, &id, err, sizeof err), TS_OK);
    assert_int_equal(id, 1);
    ts_metric_spec_t yc = {"y_count", "y", TS_METRIC_GAUGE, NULL, NULL, NULL, 0};
    assert_int_equal(ts_metrics_register(m, &yc, &id, err, sizeof err), TS_OK);
    static const char *const twice[] = {"a", "a", NULL};
    static const double down[] = {1, 0.5}, nan_b[] = {NAN};
    const ts_metric_spec_t cases[] = {
        {"9lives", "h", TS_METRIC_GAUGE, NULL, NULL, NULL, 0},
        {"a-b", "h", TS_METRIC_GAUGE, NULL, NULL, NULL, 0},
        {"", "h", TS_METRIC_GAUGE, NULL, NULL, NULL, 0},
        {"requests", "h", TS_METRIC_COUNTER, NULL, NULL, NULL, 0},
        {"x_total", "h", TS_METRIC_COUNTER, NULL, NULL, NULL, 0},
        {"lat_seconds_count", "h", TS_METRIC_GAUGE, NULL, NULL, NULL, 0},
        {"y", "h", TS_METRIC_HISTOGRAM, NULL, NULL, B3, 3},
        {"y_sum", "h", TS_METRIC_HISTOGRAM, NULL, NULL, B3, 3},
        {"g", "h", TS_METRIC_GAUGE, "a:b", NULL, NULL, 0},
        {"g", "h", TS_METRIC_GAUGE, "__x", NULL, NULL, 0},
        {"hh", "h", TS_METRIC_HISTOGRAM, "le", NULL, B3, 3},
        {"g", "h", TS_METRIC_GAUGE, NULL, twice, NULL, 0},
        {"g", "h", TS_METRIC_GAUGE, "k", twice, NULL, 0},
        {"hh", "h", TS_METRIC_HISTOGRAM, NULL, NULL, down, 2},
        {"hh", "h", TS_METRIC_HISTOGRAM, NULL, NULL, nan_b, 1},
        {"hh", "h", TS_METRIC_HISTOGRAM, NULL, NULL, NULL, 0},
        {"g", "h", TS_METRIC_GAUGE, NULL, NULL, B3, 3},
        {"g", NULL, TS_METRIC_GAUGE, NULL, NULL, NULL, 0},
    };
    const char *const why[] = {
        "a name is",        "a name is",
        "a name is",        "ends in _total",
        "clashes",          "clashes",
        "clashes",          "are added to the name",
        "label name 'a:b'", "label name '__x'",
        "label name 'le'",  "without a label name",
        "given twice",      "strictly increasing",
        "finite",           "bucket bounds",
        "not a histogram",  "no help text",
    };
    assert_int_equal(sizeof cases / sizeof cases[0], sizeof why / sizeof why[0]);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_register_error(m, cases[i], why[i]);
    /* nothing of the failures was registered: the next id is 3 */
    ts_metric_spec_t g = {"g", "h", TS_METRIC_GAUGE, NULL, NULL, NULL, 0};
    assert_int_equal(ts_metrics_register(m, &g, &id, err, sizeof err), TS_OK);
    assert_int_equal(id, 3);
    ts_metrics_free(m);
}

static void test_updates_check_id_type_and_label(void **state) {
    (void)state;
    ts_metrics_t *m;
    assert_int_equal(ts_metrics_create_daemon(&m, "1.2.3"), TS_OK);
    assert_int_equal(ts_metrics_counter_add(m, TS_M_REQUESTS, "denoise", 2), TS_OK);
    assert_int_equal(ts_metrics_counter_add(m, TS_M_REQUESTS, NULL, 1), TS_EINVAL);
    assert_int_equal(ts_metrics_counter_add(m, TS_M_BUSY, "x", 1), TS_EINVAL);
    assert_int_equal(ts_metrics_counter_add(m, TS_M_QUEUE_DEPTH, NULL, 1), TS_EINVAL);
    assert_int_equal(ts_metrics_gauge_set(m, TS_M_BUSY, NULL, 1), TS_EINVAL);
    assert_int_equal(ts_metrics_observe(m, TS_M_REQUESTS, "denoise", 1), TS_EINVAL);
    assert_int_equal(ts_metrics_observe(m, TS_M_COMPUTE_SECONDS, NULL, NAN), TS_EINVAL);
    assert_int_equal(ts_metrics_counter_add(m, TS_M_COUNT, NULL, 1), TS_EINVAL);
    assert_int_equal(ts_metrics_counter_add(m, -1, NULL, 1), TS_EINVAL);
    assert_int_equal(ts_metrics_counter_add(m, TS_M_REQUESTS, "\xff", 1), TS_EINVAL);
    char longv[TS_METRICS_LABEL_MAX + 1];
    memset(longv, 'a', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    assert_int_equal(ts_metrics_counter_add(m, TS_M_REQUESTS, longv, 1), TS_EINVAL);
    double v = -1;
    assert_int_equal(ts_metrics_get(m, TS_M_REQUESTS, "denoise", &v), TS_OK);
    assert_true(v == 2);
    assert_int_equal(ts_metrics_get(m, TS_M_REQUESTS, "never", &v), TS_ENOTFOUND);
    /* a family holds TS_METRICS_MAX_SERIES label values; past them updates are refused */
    int added = 0;
    for (int i = 0; i < TS_METRICS_MAX_SERIES + 4; i++) {
        char label[16];
        snprintf(label, sizeof label, "v%d", i);
        int rc = ts_metrics_counter_add(m, TS_M_REQUEST_ERRORS, label, 1);
        if (rc == TS_OK)
            added++;
        else
            assert_int_equal(rc, TS_ERANGE);
    }
    /* the 10 declared request types were there first */
    assert_int_equal(added, TS_METRICS_MAX_SERIES - 10);
    assert_int_equal(ts_metrics_counter_add(m, TS_M_REQUEST_ERRORS, "denoise", 1), TS_OK);
    ts_metrics_free(m);
}

/* Histogram quantiles as Prometheus's histogram_quantile computes them, worked by hand: ranks
 * inside the first bucket (from 0), inside a middle one, at its top, and in +Inf. */
static void test_quantile(void **state) {
    (void)state;
    ts_metrics_t *m;
    assert_int_equal(ts_metrics_create(&m), TS_OK);
    ts_metric_spec_t h = {"lat_seconds", "L.", TS_METRIC_HISTOGRAM, "op", NULL, B3, 3};
    ts_metric_spec_t g = {"temp_celsius", "T.", TS_METRIC_GAUGE, NULL, NULL, NULL, 0};
    int ih, ig;
    assert_int_equal(ts_metrics_register(m, &h, &ih, NULL, 0), TS_OK);
    assert_int_equal(ts_metrics_register(m, &g, &ig, NULL, 0), TS_OK);
    double v = -1;
    uint64_t n = 99;
    assert_int_equal(ts_metrics_quantile(m, ih, "a", 0.5, &v, &n), TS_ENOTFOUND);
    static const double obs[] = {0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 1.0, 2.0, 2.5};
    for (size_t i = 0; i < sizeof obs / sizeof obs[0]; i++)
        assert_int_equal(ts_metrics_observe(m, ih, "a", obs[i]), TS_OK);
    /* buckets (0, 0.5]: 4, (0.5, 1]: 4, (1, 2.5]: 2 */
    static const struct {
        double q, want;
    } cases[] = {{0.2, 0.25}, {0.5, 0.625}, {0.8, 1.0}, {0.95, 2.125}, {1.0, 2.5}, {0.0, 0.0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(ts_metrics_quantile(m, ih, "a", cases[i].q, &v, &n), TS_OK);
        assert_int_equal(n, 10);
        if (fabs(v - cases[i].want) > 1e-12)
            fail_msg("q %g: %.17g, want %g", cases[i].q, v, cases[i].want);
    }
    assert_int_equal(ts_metrics_observe(m, ih, "a", 1e9), TS_OK); /* +Inf */
    assert_int_equal(ts_metrics_quantile(m, ih, "a", 1.0, &v, NULL), TS_OK);
    assert_true(v == 2.5); /* the highest finite bound, not infinity */
    assert_int_equal(ts_metrics_quantile(m, ih, "a", 1.5, &v, NULL), TS_EINVAL);
    assert_int_equal(ts_metrics_quantile(m, ih, "a", NAN, &v, NULL), TS_EINVAL);
    assert_int_equal(ts_metrics_quantile(m, ig, NULL, 0.5, &v, NULL), TS_EINVAL);
    assert_int_equal(ts_metrics_quantile(m, 99, NULL, 0.5, &v, NULL), TS_EINVAL);
    ts_metrics_free(m);
}

/* The exact text of a small registry: the format, escaping and the shortest float forms. */
static void test_writer_exact_text(void **state) {
    (void)state;
    ts_metrics_t *m;
    assert_int_equal(ts_metrics_create(&m), TS_OK);
    static const char *const kinds[] = {"a", NULL};
    ts_metric_spec_t c = {
        "ops_total", "Ops\\done\nhere.", TS_METRIC_COUNTER, "kind", kinds, NULL, 0};
    ts_metric_spec_t g = {"temp_celsius", "T.", TS_METRIC_GAUGE, NULL, NULL, NULL, 0};
    ts_metric_spec_t h = {"lat_seconds", "L.", TS_METRIC_HISTOGRAM, NULL, NULL, B3, 3};
    int ic, ig, ih;
    assert_int_equal(ts_metrics_register(m, &c, &ic, NULL, 0), TS_OK);
    assert_int_equal(ts_metrics_register(m, &g, &ig, NULL, 0), TS_OK);
    assert_int_equal(ts_metrics_register(m, &h, &ih, NULL, 0), TS_OK);
    assert_int_equal(ts_metrics_counter_add(m, ic, "q\"b\\s\nn", 5), TS_OK);
    assert_int_equal(ts_metrics_gauge_set(m, ig, NULL, 0.1), TS_OK);
    assert_int_equal(ts_metrics_observe(m, ih, NULL, 0.5), TS_OK); /* le is inclusive */
    assert_int_equal(ts_metrics_observe(m, ih, NULL, 2), TS_OK);
    assert_int_equal(ts_metrics_observe(m, ih, NULL, 1e9), TS_OK);
    char *text;
    size_t len;
    assert_int_equal(ts_metrics_write(m, &text, &len), TS_OK);
    const char *want = "# HELP ops_total Ops\\\\done\\nhere.\n"
                       "# TYPE ops_total counter\n"
                       "ops_total{kind=\"a\"} 0\n"
                       "ops_total{kind=\"q\\\"b\\\\s\\nn\"} 5\n"
                       "# HELP temp_celsius T.\n"
                       "# TYPE temp_celsius gauge\n"
                       "temp_celsius 0.1\n"
                       "# HELP lat_seconds L.\n"
                       "# TYPE lat_seconds histogram\n"
                       "lat_seconds_bucket{le=\"0.5\"} 1\n"
                       "lat_seconds_bucket{le=\"1\"} 1\n"
                       "lat_seconds_bucket{le=\"2.5\"} 2\n"
                       "lat_seconds_bucket{le=\"+Inf\"} 3\n"
                       "lat_seconds_sum 1000000002.5\n"
                       "lat_seconds_count 3\n";
    assert_string_equal(text, want);
    assert_int_equal(len, strlen(want));
    static prom_t p;
    parse_or_fail(&p, text);
    assert_true(prom_value(&p, "ops_total{kind=\"q\"b\\s\nn\"}") == 5);
    free(text);
    assert_int_equal(ts_metrics_gauge_set(m, ig, NULL, INFINITY), TS_OK);
    assert_int_equal(ts_metrics_write(m, &text, &len), TS_OK);
    assert_non_null(strstr(text, "\ntemp_celsius +Inf\n"));
    free(text);
    ts_metrics_free(m);
}

/* ---- over HTTP ----------------------------------------------------------------------------- */

typedef struct {
    int status;      /* 0 when no status line came back */
    char head[4096]; /* the status line and headers */
    char *body;
    size_t body_len;
} http_resp_t;

/* Sends req (len bytes) to 127.0.0.1:port on a fresh connection and reads the answer until the
 * server closes. The send may be cut short when the server refuses early (huge requests). */
static void http_raw(int port, const char *req, size_t len, http_resp_t *r) {
    memset(r, 0, sizeof *r);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        fail_msg("connect to 127.0.0.1:%d: %s", port, strerror(errno));
    for (size_t off = 0; off < len;) {
        ssize_t w = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    assert_non_null(buf);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
            assert_non_null(buf);
        }
        ssize_t got = recv(fd, buf + n, cap - n, 0);
        if (got <= 0)
            break; /* EOF, or a reset after the server refused the rest */
        n += (size_t)got;
    }
    close(fd);
    buf[n] = '\0';
    char *end = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.", 7) == 0 && end) {
        r->status = atoi(buf + 9);
        snprintf(r->head, sizeof r->head, "%.*s", (int)(end - buf), buf);
        r->body_len = n - (size_t)(end + 4 - buf);
        r->body = malloc(r->body_len + 1);
        assert_non_null(r->body);
        memcpy(r->body, end + 4, r->body_len + 1);
    }
    free(buf);
}

static void http_do(int port, const char *method, const char *path, http_resp_t *r) {
    size_t cap = strlen(method) + strlen(path) + 128;
    char *req = malloc(cap);
    assert_non_null(req);
    int n = snprintf(req, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                     method, path);
    assert_true(n > 0 && (size_t)n < cap);
    http_raw(port, req, (size_t)n, r);
    free(req);
}

/* The value of header name in r (case-insensitive name), or fail. */
static void expect_header(const http_resp_t *r, const char *name, const char *value) {
    char want[256];
    snprintf(want, sizeof want, "\r\n%s: %s\r", name, value);
    char head[sizeof r->head + 2];
    snprintf(head, sizeof head, "%s\r\n", r->head);
    if (!strcasestr(head, want))
        fail_msg("no header '%s: %s' in:\n%s", name, value, r->head);
}

/* The body is exactly as long as Content-Length says. */
static void expect_length(const http_resp_t *r) {
    const char *cl = strcasestr(r->head, "\r\nContent-Length: ");
    if (!cl)
        fail_msg("no Content-Length in:\n%s", r->head);
    assert_int_equal(strtoul(cl + 18, NULL, 10), r->body_len);
}

static void http_free(http_resp_t *r) { free(r->body); }

typedef struct {
    _Atomic int ready;
    char reason[64];
} health_t;

static int health_of(void *user, char *reason, size_t reasonlen) {
    health_t *h = user;
    if (atomic_load(&h->ready))
        return 1;
    snprintf(reason, reasonlen, "%s", h->reason);
    return 0;
}

typedef struct {
    ts_metrics_t *m;
    ts_metrics_http_t *srv;
    int port;
    health_t health;
} server_t;

static int server_setup(void **state) {
    server_t *s = calloc(1, sizeof *s);
    if (!s || ts_metrics_create_daemon(&s->m, "9.8.7") != TS_OK)
        return -1;
    snprintf(s->health.reason, sizeof s->health.reason, "store not open");
    char err[256] = "";
    if (ts_metrics_http_start(&s->srv, s->m, "127.0.0.1:0", health_of, &s->health, err,
                              sizeof err) != TS_OK) {
        fprintf(stderr, "ts_metrics_http_start: %s\n", err);
        return -1;
    }
    s->port = ts_metrics_http_port(s->srv);
    *state = s;
    return s->port > 0 ? 0 : -1;
}

static int server_teardown(void **state) {
    server_t *s = *state;
    ts_metrics_http_stop(s->srv);
    ts_metrics_free(s->m);
    free(s);
    return 0;
}

static void scrape(int port, prom_t *p, http_resp_t *r) {
    http_do(port, "GET", "/metrics", r);
    assert_int_equal(r->status, 200);
    expect_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    expect_length(r);
    parse_or_fail(p, r->body);
}

static void test_daemon_families(void **state) {
    server_t *s = *state;
    static prom_t p;
    http_resp_t r;
    scrape(s->port, &p, &r);
    struct {
        const char *family, *type;
    } want[] = {
        {"tessera_build_info", "gauge"},
        {"process_start_time_seconds", "gauge"},
        {"process_resident_memory_bytes", "gauge"},
        {"tessera_requests_total", "counter"},
        {"tessera_request_errors_total", "counter"},
        {"tessera_busy_total", "counter"},
        {"tessera_deadline_dropped_total", "counter"},
        {"tessera_queue_depth", "gauge"},
        {"tessera_batch_size", "histogram"},
        {"tessera_queue_wait_seconds", "histogram"},
        {"tessera_compute_seconds", "histogram"},
        {"tessera_denoise_steps_total", "counter"},
        {"tessera_denoise_samples_total", "counter"},
        {"tessera_train_step", "gauge"},
        {"tessera_train_loss", "gauge"},
        {"tessera_train_samples_total", "counter"},
        {"tessera_gossip_members", "gauge"},
        {"tessera_net_received_bytes_total", "counter"},
        {"tessera_net_sent_bytes_total", "counter"},
        {"tessera_handshake_failures_total", "counter"},
        {"tessera_connections", "gauge"},
        {"tessera_requests_busy_total", "counter"},
        {"tessera_connection_closes_total", "counter"},
        {"tessera_connections_refused_total", "counter"},
        {"tessera_device_memory_bytes", "gauge"},
        {"tessera_reachable", "gauge"},
        {"tessera_relayed", "gauge"},
        {"tessera_relay_nodes", "gauge"},
        {"tessera_relay_circuits", "gauge"},
        {"tessera_relay_circuits_total", "counter"},
        {"tessera_relay_bytes_total", "counter"},
        {"tessera_relay_datagrams_total", "counter"},
        {"tessera_serve_out_of_memory_total", "counter"},
        {"tessera_device_utilization_ratio", "gauge"},
        {"tessera_device_seconds", "histogram"},
        {"tessera_train_step_seconds", "gauge"},
        {"tessera_blas_kernels_info", "gauge"},
        {"tessera_blas_kernels_weaker", "gauge"},
        {"tessera_accusations_total", "counter"},
        {"tessera_banned_nodes", "gauge"},
    };
    assert_int_equal(sizeof want / sizeof want[0], TS_M_COUNT);
    assert_int_equal(p.n_families, TS_M_COUNT);
    for (int i = 0; i < TS_M_COUNT; i++) {
        assert_string_equal(p.families[i].name, want[i].family); /* in id order */
        assert_string_equal(prom_type(&p, want[i].family), want[i].type);
        assert_true(p.families[i].has_help);
    }
    assert_true(prom_value(&p, "tessera_build_info{version=\"9.8.7\"}") == 1);
    /* the resident set of this test is more than 1 MiB and less than 4 GiB */
    double rss = prom_value(&p, "process_resident_memory_bytes");
    assert_true(rss > 1 << 20 && rss < 4.0 * (1 << 30));
    double start = prom_value(&p, "process_start_time_seconds");
    assert_true(start > 1.6e9 && start <= (double)time(NULL) + 1);
    /* declared label values are there at 0 from the start */
    assert_true(prom_value(&p, "tessera_requests_total{type=\"denoise\"}") == 0);
    assert_true(prom_value(&p, "tessera_gossip_members{state=\"suspect\"}") == 0);
    assert_true(prom_value(&p, "tessera_handshake_failures_total{reason=\"identity\"}") == 0);
    assert_true(prom_value(&p, "tessera_net_sent_bytes_total{transport=\"udp\"}") == 0);
    assert_true(prom_value(&p, "tessera_batch_size_bucket{le=\"+Inf\"}") == 0);
    http_free(&r);
}

enum { N_THREADS = 4, N_ITER = 20000 };

typedef struct {
    ts_metrics_t *m;
    int t;
    int failures;
} worker_t;

/* What a compute thread does per batch, N_ITER times, with a private label value too. */
static void *worker(void *arg) {
    worker_t *w = arg;
    char mine[16];
    snprintf(mine, sizeof mine, "worker-%d", w->t);
    for (int i = 0; i < N_ITER; i++) {
        int bad = 0;
        bad |= ts_metrics_counter_add(w->m, TS_M_REQUESTS, "denoise", 1);
        bad |= ts_metrics_counter_add(w->m, TS_M_REQUEST_ERRORS, mine, 1);
        bad |= ts_metrics_gauge_add(w->m, TS_M_QUEUE_DEPTH, NULL, 1);
        bad |= ts_metrics_observe(w->m, TS_M_COMPUTE_SECONDS, NULL, (i % 4) * 0.25);
        bad |= ts_metrics_observe(w->m, TS_M_BATCH_SIZE, NULL, 8);
        bad |= ts_metrics_counter_add(w->m, TS_M_DENOISE_SAMPLES, NULL, 8);
        bad |= ts_metrics_gauge_add(w->m, TS_M_QUEUE_DEPTH, NULL, -1);
        w->failures += bad != 0;
    }
    return NULL;
}

/* Four threads update while this one scrapes: every scrape is valid, no counter goes back, and
 * the totals at the end are exact. */
static void test_concurrent_updates_and_scrapes(void **state) {
    server_t *s = *state;
    pthread_t th[N_THREADS];
    worker_t w[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        w[t] = (worker_t){.m = s->m, .t = t};
        assert_int_equal(pthread_create(&th[t], NULL, worker, &w[t]), 0);
    }
    static prom_t p;
    double last = 0, last_count = 0;
    int scrapes = 0;
    for (; scrapes < 200; scrapes++) {
        http_resp_t r;
        scrape(s->port, &p, &r);
        http_free(&r);
        double req = prom_value(&p, "tessera_requests_total{type=\"denoise\"}");
        double count = prom_value(&p, "tessera_compute_seconds_count");
        assert_true(req >= last && count >= last_count);
        last = req;
        last_count = count;
        if (req == (double)N_THREADS * N_ITER)
            break;
    }
    for (int t = 0; t < N_THREADS; t++) {
        assert_int_equal(pthread_join(th[t], NULL), 0);
        assert_int_equal(w[t].failures, 0);
    }
    http_resp_t r;
    scrape(s->port, &p, &r);
    http_free(&r);
    const double n = (double)N_THREADS * N_ITER;
    assert_true(prom_value(&p, "tessera_requests_total{type=\"denoise\"}") == n);
    for (int t = 0; t < N_THREADS; t++) {
        char key[128];
        snprintf(key, sizeof key, "tessera_request_errors_total{type=\"worker-%d\"}", t);
        assert_true(prom_value(&p, key) == N_ITER);
    }
    assert_true(prom_value(&p, "tessera_queue_depth") == 0);
    assert_true(prom_value(&p, "tessera_denoise_samples_total") == 8 * n);
    /* observations 0, 0.25, 0.5, 0.75 in turn: exact in binary, so the sum is exact */
    assert_true(prom_value(&p, "tessera_compute_seconds_count") == n);
    assert_true(prom_value(&p, "tessera_compute_seconds_sum") == 1.5 * n / 4);
    assert_true(prom_value(&p, "tessera_compute_seconds_bucket{le=\"0.001\"}") == n / 4);
    assert_true(prom_value(&p, "tessera_compute_seconds_bucket{le=\"0.25\"}") == n / 2);
    assert_true(prom_value(&p, "tessera_compute_seconds_bucket{le=\"0.5\"}") == 3 * n / 4);
    assert_true(prom_value(&p, "tessera_compute_seconds_bucket{le=\"1\"}") == n);
    assert_true(prom_value(&p, "tessera_batch_size_bucket{le=\"4\"}") == 0);
    assert_true(prom_value(&p, "tessera_batch_size_bucket{le=\"8\"}") == n);
    assert_true(prom_value(&p, "tessera_batch_size_sum") == 8 * n);
}

static void test_healthz_both_ways(void **state) {
    server_t *s = *state;
    http_resp_t r;
    atomic_store(&s->health.ready, 0);
    http_do(s->port, "GET", "/healthz", &r);
    assert_int_equal(r.status, 503);
    assert_string_equal(r.body, "store not open\n");
    expect_header(&r, "Content-Type", "text/plain; charset=utf-8");
    http_free(&r);
    atomic_store(&s->health.ready, 1);
    http_do(s->port, "GET", "/healthz", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "ok\n");
    expect_length(&r);
    http_free(&r);
    /* a query string does not change the route */
    http_do(s->port, "GET", "/healthz?verbose=1", &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
}

static void test_routes_and_methods(void **state) {
    server_t *s = *state;
    http_resp_t r;
    const char *missing[] = {"/metric",     "/metrics/",   "/healthz/x",
                             "/../metrics", "/status.jso", "/index.htm"};
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        http_do(s->port, "GET", missing[i], &r);
        if (r.status != 404)
            fail_msg("GET %s: status %d, want 404", missing[i], r.status);
        http_free(&r);
    }
    const char *methods[] = {"POST", "PUT", "DELETE", "OPTIONS", "PATCH"};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        http_do(s->port, methods[i], "/metrics", &r);
        if (r.status != 405)
            fail_msg("%s /metrics: status %d, want 405", methods[i], r.status);
        expect_header(&r, "Allow", "GET, HEAD");
        http_free(&r);
    }
    /* a POST with a body gets its 405 too */
    const char post[] = "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                        "Connection: close\r\n\r\nhello";
    http_raw(s->port, post, sizeof post - 1, &r);
    assert_int_equal(r.status, 405);
    http_free(&r);
    /* HEAD: the headers of GET, no body */
    http_do(s->port, "HEAD", "/metrics", &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 0);
    expect_header(&r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    http_free(&r);
}

/* The status page: the page at / (HTML with a CSP), and /status.json, 503 until the daemon has
 * published one, then exactly the newest one published. */
static void test_status_page_routes(void **state) {
    server_t *s = *state;
    http_resp_t r;
    http_do(s->port, "GET", "/", &r);
    assert_int_equal(r.status, 200);
    expect_header(&r, "Content-Type", "text/html; charset=utf-8");
    assert_non_null(strstr(r.body, "<title>tessera node status</title>"));
    assert_non_null(strstr(r.body, "fetch(\"status.json\""));
    expect_length(&r);
    http_free(&r);
    assert_int_equal(ts_metrics_http_status_wanted(s->srv), 0); /* nobody asked yet */
    http_do(s->port, "GET", "/status.json", &r);
    assert_int_equal(r.status, 503);
    http_free(&r);
    assert_int_equal(ts_metrics_http_status_wanted(s->srv), 1); /* asked: the daemon builds it */
    assert_int_equal(ts_metrics_http_set_status(s->srv, "{\"a\":1}", 7), TS_OK);
    assert_int_equal(ts_metrics_http_set_status(s->srv, "{\"b\":22}", 8), TS_OK);
    http_do(s->port, "GET", "/status.json", &r);
    assert_int_equal(r.status, 200);
    expect_header(&r, "Content-Type", "application/json");
    assert_string_equal(r.body, "{\"b\":22}");
    http_free(&r);
    assert_int_equal(ts_metrics_http_set_status(NULL, "{}", 2), TS_EINVAL);
    assert_int_equal(ts_metrics_http_set_status(s->srv, NULL, 0), TS_EINVAL);
}

/* Not a 2xx: refused with a 4xx or 5xx, or closed without an answer (libmicrohttpd closes on a
 * request line it cannot split). */
static void expect_refused(const http_resp_t *r, const char *what) {
    if (r->status != 0 && (r->status < 400 || r->status > 599))
        fail_msg("%s: status %d, want 4xx, 5xx or a closed connection", what, r->status);
}

/* Malformed and oversized requests are refused, never answered 200, and the server goes on
 * serving; a client that sends half a request and waits holds nobody else up. */
static void test_bad_requests(void **state) {
    server_t *s = *state;
    http_resp_t r;
    http_raw(s->port, "GET /metrics HTTP/1.1\r\n\r\n", 25, &r);
    assert_int_equal(r.status, 400); /* HTTP/1.1 without Host */
    assert_string_equal(r.body, "an HTTP/1.1 request needs a Host header\n");
    http_free(&r);
    const char *bad[] = {
        "GARBAGE\r\n\r\n",
        "GET\r\n\r\n",
        "GET /metrics\r\n\r\n",
        "GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nHost: x\r\nBroken header line\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        http_raw(s->port, bad[i], strlen(bad[i]), &r);
        expect_refused(&r, bad[i]);
        http_free(&r);
    }
    /* a 1 MiB header, over the 16 KiB a connection may use: 431 (or a reset that lost it) */
    size_t big = 1 << 20;
    char *req = malloc(big + 128);
    assert_non_null(req);
    int k = snprintf(req, 128, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(req + k, 'a', big);
    memcpy(req + k + big, "\r\n\r\n", 4);
    http_raw(s->port, req, (size_t)k + big + 4, &r);
    free(req);
    if (r.status != 431 && r.status != 0)
        fail_msg("a 1 MiB header: status %d, want 431", r.status);
    http_free(&r);
    char url[20000]; /* a 20 kB URL: 414 */
    memset(url, 'u', sizeof url - 1);
    url[0] = '/';
    url[sizeof url - 1] = '\0';
    http_do(s->port, "GET", url, &r);
    assert_int_equal(r.status, 414);
    http_free(&r);
    /* half a request, left hanging: others are still served meanwhile */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(send(fd, "GET /metr", 9, MSG_NOSIGNAL), 9);
    static prom_t p;
    scrape(s->port, &p, &r);
    http_free(&r);
    close(fd);
}

static void test_start_errors(void **state) {
    server_t *s = *state;
    ts_metrics_http_t *other = NULL;
    char err[256] = "", addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", s->port);
    assert_int_equal(ts_metrics_http_start(&other, s->m, addr, NULL, NULL, err, sizeof err),
                     TS_EIO);
    assert_null(other);
    if (!strstr(err, addr))
        fail_msg("the error '%s' does not name %s", err, addr);
    assert_int_equal(ts_metrics_http_start(&other, s->m, "127.0.0.1", NULL, NULL, err, sizeof err),
                     TS_EINVAL);
    assert_int_equal(
        ts_metrics_http_start(&other, s->m, "no.such.host.invalid:1", NULL, NULL, err, sizeof err),
        TS_EINVAL);
    /* with no health function, /healthz says ok */
    assert_int_equal(
        ts_metrics_http_start(&other, s->m, "127.0.0.1:0", NULL, NULL, err, sizeof err), TS_OK);
    assert_true(ts_metrics_http_port(other) > 0 && ts_metrics_http_port(other) != s->port);
    http_resp_t r;
    http_do(ts_metrics_http_port(other), "GET", "/healthz", &r);
    assert_int_equal(r.status, 200);
    http_free(&r);
    ts_metrics_http_stop(other);
    /* IPv6, where the host has it */
    int rc = ts_metrics_http_start(&other, s->m, "[::1]:0", NULL, NULL, err, sizeof err);
    if (rc == TS_OK)
        assert_true(ts_metrics_http_port(other) > 0);
    else
        assert_int_equal(rc, TS_EIO);
    ts_metrics_http_stop(other);
}

/* docs/operations.md has a row for every family the daemon exports, with its type. */
static void test_operations_md_lists_every_metric(void **state) {
    (void)state;
    FILE *f = fopen(TS_OPERATIONS_MD, "rb");
    if (!f)
        fail_msg("cannot open %s", TS_OPERATIONS_MD);
    static char doc[1 << 17];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = '\0';
    ts_metrics_t *m;
    assert_int_equal(ts_metrics_create_daemon(&m, "0"), TS_OK);
    char *text;
    assert_int_equal(ts_metrics_write(m, &text, NULL), TS_OK);
    static prom_t p;
    parse_or_fail(&p, text);
    for (int i = 0; i < p.n_families; i++) {
        char row[256];
        snprintf(row, sizeof row, "\n| `%s` | %s |", p.families[i].name, p.families[i].type);
        if (!strstr(doc, row))
            fail_msg("docs/operations.md has no row '%s'", row + 1);
    }
    free(text);
    ts_metrics_free(m);
}

/* ---- --dump, for promtool -------------------------------------------------------------------- */

static int dump(void) {
    ts_metrics_t *m;
    if (ts_metrics_create_daemon(&m, "0.1.0") != TS_OK)
        return 1;
    ts_metrics_counter_add(m, TS_M_REQUESTS, "denoise", 12);
    ts_metrics_counter_add(m, TS_M_REQUEST_ERRORS, "odd \"label\" \\ with\nnewline", 1);
    ts_metrics_observe(m, TS_M_BATCH_SIZE, NULL, 3);
    ts_metrics_observe(m, TS_M_QUEUE_WAIT_SECONDS, NULL, 0.004);
    ts_metrics_observe(m, TS_M_COMPUTE_SECONDS, NULL, 0.02);
    ts_metrics_gauge_set(m, TS_M_TRAIN_LOSS, NULL, 0.4375);
    ts_metrics_gauge_set(m, TS_M_GOSSIP_MEMBERS, "alive", 7);
    char *text;
    size_t len;
    int rc = ts_metrics_write(m, &text, &len);
    ts_metrics_free(m);
    if (rc != TS_OK)
        return 1;
    fwrite(text, 1, len, stdout);
    free(text);
    return 0;
}

int main(int argc, char **argv) {
    setlocale(LC_CTYPE, "C.UTF-8"); /* mbsrtowcs checks label values as UTF-8 */
    if (argc == 2 && strcmp(argv[1], "--dump") == 0)
        return dump();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parser_is_strict),
        cmocka_unit_test(test_register_validates),
        cmocka_unit_test(test_updates_check_id_type_and_label),
        cmocka_unit_test(test_writer_exact_text),
        cmocka_unit_test(test_quantile),
        cmocka_unit_test(test_operations_md_lists_every_metric),
        cmocka_unit_test_setup_teardown(test_daemon_families, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_updates_and_scrapes, server_setup,
                                        server_teardown),
        cmocka_unit_test_setup_teardown(test_healthz_both_ways, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_status_page_routes, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_routes_and_methods, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_bad_requests, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_start_errors, server_setup, server_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
