/*
 * metrics.c — the metrics registry and its Prometheus text writer (daemon/metrics.h).
 *
 * Layout: a registry is a fixed array of families, each a fixed array of series. Nothing moves
 * once published, so readers never lock: a family or series is filled in first and then made
 * visible by a release store of the count (n_families, n_series) that readers load with acquire.
 * Writers of new entries (registration, the first use of a label value) serialise on one mutex.
 *
 * Numbers: counters are uint64 counts; gauges and histogram sums are doubles kept as their bit
 * patterns in atomic uint64s, added to with a compare-and-swap loop. Histogram buckets are stored
 * per bucket (not cumulative) so an observation is one increment; the writer accumulates them.
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char value[TS_METRICS_LABEL_MAX]; /* the label value ("" in a family without a label) */
    _Atomic uint64_t v;               /* counter: the count; gauge: the double's bits */
    _Atomic uint64_t sum;             /* histogram: the sum's bits */
    _Atomic uint64_t *buckets;        /* histogram: n_bounds + 1 counts, the last is +Inf */
} series_t;

typedef struct {
    char *name, *help, *label; /* label: NULL when the family has none */
    ts_metric_type_t type;
    double bounds[TS_METRICS_MAX_BUCKETS];
    int n_bounds;
    _Atomic int n_series;
    series_t series[TS_METRICS_MAX_SERIES];
    _Atomic uint64_t *bucket_slab; /* TS_METRICS_MAX_SERIES × (n_bounds + 1), histograms */
} family_t;

#define MAX_COLLECTORS 4

struct ts_metrics {
    pthread_mutex_t mu; /* registration, new label values, collectors */
    _Atomic int n_families;
    family_t *families[TS_METRICS_MAX_FAMILIES];
    _Atomic int n_collectors;
    struct {
        ts_metrics_collect_fn fn;
        void *user;
    } collectors[MAX_COLLECTORS];
};

/* ---- names and values ----------------------------------------------------------------------- */

static int name_char(char c, int first, int colon_ok) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
        return 1;
    if (c == ':')
        return colon_ok;
    return !first && c >= '0' && c <= '9';
}

/* Metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names: [a-zA-Z_][a-zA-Z0-9_]*. */
static int valid_name(const char *s, int colon_ok) {
    if (!s || !*s)
        return 0;
    for (const char *p = s; *p; p++)
        if (!name_char(*p, p == s, colon_ok))
            return 0;
    return 1;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Well-formed UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF), as the exposition
 * format requires of label values. */
static int valid_utf8(const char *str) {
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        unsigned c = *s++;
        int more;
        unsigned min, cp;
        if (c < 0x80)
            continue;
        if ((c & 0xE0) == 0xC0)
            more = 1, min = 0x80, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0)
            more = 2, min = 0x800, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0)
            more = 3, min = 0x10000, cp = c & 0x07;
        else
            return 0;
        for (int i = 0; i < more; i++, s++) {
            if ((*s & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (*s & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
    }
    return 1;
}

static int valid_label_value(const char *v) {
    return v && strlen(v) < TS_METRICS_LABEL_MAX && valid_utf8(v);
}

/* ---- the registry --------------------------------------------------------------------------- */

int ts_metrics_create(ts_metrics_t **out) {
    if (!out)
        return TS_EINVAL;
    ts_metrics_t *m = calloc(1, sizeof *m);
    if (!m)
        return TS_ENOMEM;
    pthread_mutex_init(&m->mu, NULL);
    *out = m;
    return TS_OK;
}

static void family_free(family_t *f) {
    if (!f)
        return;
    free(f->name);
    free(f->help);
    free(f->label);
    free(f->bucket_slab);
    free(f);
}

void ts_metrics_free(ts_metrics_t *m) {
    if (!m)
        return;
    for (int i = 0; i < m->n_families; i++)
        family_free(m->families[i]);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* The name a family takes, with a histogram's derived names: clashes are checked on all. */
static int names_clash(const family_t *f, const char *name, ts_metric_type_t type) {
    static const char *const derived[] = {"_bucket", "_sum", "_count"};
    if (strcmp(f->name, name) == 0)
        return 1;
    size_t fn = strlen(f->name), n = strlen(name);
    for (int d = 0; d < 3; d++) {
        size_t k = strlen(derived[d]);
        if (f->type == TS_METRIC_HISTOGRAM && n == fn + k && strncmp(name, f->name, fn) == 0 &&
            strcmp(name + fn, derived[d]) == 0)
            return 1;
        if (type == TS_METRIC_HISTOGRAM && fn == n + k && strncmp(f->name, name, n) == 0 &&
            strcmp(f->name + n, derived[d]) == 0)
            return 1;
    }
    return 0;
}

/* Checks spec against the format's rules and the families already registered (under m->mu). */
static int check_spec(const ts_metrics_t *m, const ts_metric_spec_t *s, char *err, size_t errlen) {
    const char *name = s->name ? s->name : "(null)";
    if (!valid_name(s->name, 1)) {
        ts_set_err(err, errlen, "metric '%s': a name is [a-zA-Z_:][a-zA-Z0-9_:]*", name);
        return TS_EINVAL;
    }
    if (s->type != TS_METRIC_COUNTER && s->type != TS_METRIC_GAUGE &&
        s->type != TS_METRIC_HISTOGRAM) {
        ts_set_err(err, errlen, "metric '%s': unknown type %d", name, (int)s->type);
        return TS_EINVAL;
    }
    if (!s->help) {
        ts_set_err(err, errlen, "metric '%s': no help text", name);
        return TS_EINVAL;
    }
    if (s->type == TS_METRIC_COUNTER && !ends_with(name, "_total")) {
        ts_set_err(err, errlen, "counter '%s': a counter's name ends in _total", name);
        return TS_EINVAL;
    }
    if (s->type == TS_METRIC_HISTOGRAM &&
        (ends_with(name, "_bucket") || ends_with(name, "_sum") || ends_with(name, "_count"))) {
        ts_set_err(err, errlen, "histogram '%s': _bucket, _sum and _count are added to the name",
                   name);
        return TS_EINVAL;
    }
    if (s->label && (!valid_name(s->label, 0) || strncmp(s->label, "__", 2) == 0 ||
                     (s->type == TS_METRIC_HISTOGRAM && strcmp(s->label, "le") == 0))) {
        ts_set_err(err, errlen,
                   "metric '%s': label name '%s' is not [a-zA-Z_][a-zA-Z0-9_]*, or is reserved "
                   "(__*, and le in a histogram)",
                   name, s->label);
        return TS_EINVAL;
    }
    if (s->values && !s->label) {
        ts_set_err(err, errlen, "metric '%s': label values without a label name", name);
        return TS_EINVAL;
    }
    int nv = 0;
    for (; s->values && s->values[nv]; nv++) {
        if (!valid_label_value(s->values[nv])) {
            ts_set_err(err, errlen,
                       "metric '%s': label value %d is not UTF-8 shorter than %d "
                       "bytes",
                       name, nv, TS_METRICS_LABEL_MAX);
            return TS_EINVAL;
        }
        for (int j = 0; j < nv; j++)
            if (strcmp(s->values[j], s->values[nv]) == 0) {
                ts_set_err(err, errlen, "metric '%s': label value '%s' given twice", name,
                           s->values[nv]);
                return TS_EINVAL;
            }
    }
    if (nv > TS_METRICS_MAX_SERIES) {
        ts_set_err(err, errlen, "metric '%s': more than %d label values", name,
                   TS_METRICS_MAX_SERIES);
        return TS_EINVAL;
    }
    if (s->type == TS_METRIC_HISTOGRAM) {
        if (!s->buckets || s->n_buckets < 1 || s->n_buckets > TS_METRICS_MAX_BUCKETS) {
            ts_set_err(err, errlen, "histogram '%s': 1..%d bucket bounds", name,
                       TS_METRICS_MAX_BUCKETS);
            return TS_EINVAL;
        }
        for (int b = 0; b < s->n_buckets; b++)
            if (!isfinite(s->buckets[b]) || (b > 0 && !(s->buckets[b] > s->buckets[b - 1]))) {
                ts_set_err(err, errlen,
                           "histogram '%s': bucket bounds must be finite and "
                           "strictly increasing (bound %d)",
                           name, b);
                return TS_EINVAL;
            }
    } else if (s->buckets || s->n_buckets) {
        ts_set_err(err, errlen, "metric '%s': buckets on a metric that is not a histogram", name);
        return TS_EINVAL;
    }
    for (int i = 0; i < m->n_families; i++)
        if (names_clash(m->families[i], name, s->type)) {
            ts_set_err(err, errlen, "metric '%s': the name clashes with '%s', already registered",
                       name, m->families[i]->name);
            return TS_EINVAL;
        }
    return TS_OK;
}

static family_t *family_new(const ts_metric_spec_t *s) {
    family_t *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->type = s->type;
    f->name = strdup(s->name);
    f->help = strdup(s->help);
    f->label = s->label ? strdup(s->label) : NULL;
    if (s->type == TS_METRIC_HISTOGRAM) {
        f->n_bounds = s->n_buckets;
        memcpy(f->bounds, s->buckets, (size_t)s->n_buckets * sizeof(double));
        f->bucket_slab = calloc((size_t)TS_METRICS_MAX_SERIES * (size_t)(s->n_buckets + 1),
                                sizeof *f->bucket_slab);
        for (int i = 0; f->bucket_slab && i < TS_METRICS_MAX_SERIES; i++)
            f->series[i].buckets = f->bucket_slab + (size_t)i * (size_t)(s->n_buckets + 1);
    }
    if (!f->name || !f->help || (s->label && !f->label) ||
        (s->type == TS_METRIC_HISTOGRAM && !f->bucket_slab)) {
        family_free(f);
        return NULL;
    }
    /* the series that exist from the start: the one series of an unlabelled family, or the
     * declared label values (zeroed atomics are valid zeros: 0 and the bits of 0.0) */
    int n = 0;
    if (!s->label)
        n = 1;
    for (; s->values && s->values[n]; n++)
        snprintf(f->series[n].value, TS_METRICS_LABEL_MAX, "%s", s->values[n]);
    atomic_init(&f->n_series, n);
    return f;
}

int ts_metrics_register(ts_metrics_t *m, const ts_metric_spec_t *spec, int *id, char *err,
                        size_t errlen) {
    if (!m || !spec)
        return TS_EINVAL;
    pthread_mutex_lock(&m->mu);
    int n = atomic_load(&m->n_families);
    int rc = check_spec(m, spec, err, errlen);
    if (rc == TS_OK && n == TS_METRICS_MAX_FAMILIES) {
        ts_set_err(err, errlen, "metric '%s': the registry is full (%d families)", spec->name,
                   TS_METRICS_MAX_FAMILIES);
        rc = TS_ERANGE;
    }
    family_t *f = NULL;
    if (rc == TS_OK && !(f = family_new(spec)))
        rc = TS_ENOMEM;
    if (rc == TS_OK) {
        m->families[n] = f;
        atomic_store_explicit(&m->n_families, n + 1, memory_order_release);
        if (id)
            *id = n;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int ts_metrics_add_collector(ts_metrics_t *m, ts_metrics_collect_fn fn, void *user) {
    if (!m || !fn)
        return TS_EINVAL;
    pthread_mutex_lock(&m->mu);
    int n = atomic_load(&m->n_collectors), rc = TS_ERANGE;
    if (n < MAX_COLLECTORS) {
        m->collectors[n].fn = fn;
        m->collectors[n].user = user;
        atomic_store_explicit(&m->n_collectors, n + 1, memory_order_release);
        rc = TS_OK;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

/* ---- finding a series ----------------------------------------------------------------------- */

static family_t *family_of(ts_metrics_t *m, int id, ts_metric_type_t type) {
    if (!m || id < 0 || id >= atomic_load_explicit(&m->n_families, memory_order_acquire))
        return NULL;
    family_t *f = m->families[id];
    return f->type == type ? f : NULL;
}

/* The series of family f for label (NULL for an unlabelled family), added on first use when
 * create is set. *rc says why there is none. */
static series_t *series_of(ts_metrics_t *m, family_t *f, const char *label, int create, int *rc) {
    if (!f->label) {
        *rc = label ? TS_EINVAL : TS_OK;
        return label ? NULL : &f->series[0];
    }
    if (!valid_label_value(label)) {
        *rc = TS_EINVAL;
        return NULL;
    }
    int n = atomic_load_explicit(&f->n_series, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (strcmp(f->series[i].value, label) == 0) {
            *rc = TS_OK;
            return &f->series[i];
        }
    if (!create) {
        *rc = TS_ENOTFOUND;
        return NULL;
    }
    series_t *s = NULL;
    pthread_mutex_lock(&m->mu);
    int now = atomic_load(&f->n_series); /* another thread may have added it meanwhile */
    for (int i = n; i < now && !s; i++)
        if (strcmp(f->series[i].value, label) == 0)
            s = &f->series[i];
    if (!s && now < TS_METRICS_MAX_SERIES) {
        s = &f->series[now];
        snprintf(s->value, TS_METRICS_LABEL_MAX, "%s", label);
        atomic_store_explicit(&f->n_series, now + 1, memory_order_release);
    }
    pthread_mutex_unlock(&m->mu);
    *rc = s ? TS_OK : TS_ERANGE;
    return s;
}

/* ---- updates -------------------------------------------------------------------------------- */

static uint64_t bits_of(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static double double_of(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static void add_double(_Atomic uint64_t *a, double delta) {
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, bits_of(double_of(old) + delta),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

/* One update of a counter or gauge: the four public setters below, in one place. */
typedef enum { ADD_COUNT, SET_COUNT, SET_VALUE, ADD_VALUE } op_t;

static int update(ts_metrics_t *m, int id, ts_metric_type_t type, const char *label, op_t op,
                  uint64_t n, double v) {
    family_t *f = family_of(m, id, type);
    if (!f)
        return TS_EINVAL;
    int rc;
    series_t *s = series_of(m, f, label, 1, &rc);
    if (!s)
        return rc;
    switch (op) {
    case ADD_COUNT: atomic_fetch_add_explicit(&s->v, n, memory_order_relaxed); break;
    case SET_COUNT: atomic_store_explicit(&s->v, n, memory_order_relaxed); break;
    case SET_VALUE: atomic_store_explicit(&s->v, bits_of(v), memory_order_relaxed); break;
    case ADD_VALUE: add_double(&s->v, v); break;
    }
    return TS_OK;
}

int ts_metrics_counter_add(ts_metrics_t *m, int id, const char *label, uint64_t n) {
    return update(m, id, TS_METRIC_COUNTER, label, ADD_COUNT, n, 0);
}

int ts_metrics_counter_set(ts_metrics_t *m, int id, const char *label, uint64_t total) {
    return update(m, id, TS_METRIC_COUNTER, label, SET_COUNT, total, 0);
}

int ts_metrics_gauge_set(ts_metrics_t *m, int id, const char *label, double v) {
    return update(m, id, TS_METRIC_GAUGE, label, SET_VALUE, 0, v);
}

int ts_metrics_gauge_add(ts_metrics_t *m, int id, const char *label, double delta) {
    return update(m, id, TS_METRIC_GAUGE, label, ADD_VALUE, 0, delta);
}

int ts_metrics_observe(ts_metrics_t *m, int id, const char *label, double v) {
    family_t *f = family_of(m, id, TS_METRIC_HISTOGRAM);
    if (!f || isnan(v))
        return TS_EINVAL;
    int rc;
    series_t *s = series_of(m, f, label, 1, &rc);
    if (!s)
        return rc;
    int b = 0;
    while (b < f->n_bounds && v > f->bounds[b])
        b++;
    atomic_fetch_add_explicit(&s->buckets[b], 1, memory_order_relaxed);
    add_double(&s->sum, v);
    return TS_OK;
}

int ts_metrics_get(ts_metrics_t *m, int id, const char *label, double *out) {
    if (!m || !out || id < 0 || id >= atomic_load_explicit(&m->n_families, memory_order_acquire))
        return TS_EINVAL;
    family_t *f = m->families[id];
    int rc;
    series_t *s = series_of(m, f, label, 0, &rc);
    if (!s)
        return rc;
    uint64_t v = atomic_load_explicit(&s->v, memory_order_relaxed);
    if (f->type == TS_METRIC_COUNTER) {
        *out = (double)v;
    } else if (f->type == TS_METRIC_GAUGE) {
        *out = double_of(v);
    } else {
        uint64_t count = 0;
        for (int b = 0; b <= f->n_bounds; b++)
            count += atomic_load_explicit(&s->buckets[b], memory_order_relaxed);
        *out = (double)count;
    }
    return TS_OK;
}

int ts_metrics_quantile(ts_metrics_t *m, int id, const char *label, double q, double *out,
                        uint64_t *count) {
    if (!m || !out || !(q >= 0.0 && q <= 1.0) || id < 0 ||
        id >= atomic_load_explicit(&m->n_families, memory_order_acquire))
        return TS_EINVAL;
    family_t *f = m->families[id];
    if (f->type != TS_METRIC_HISTOGRAM)
        return TS_EINVAL;
    int rc;
    series_t *s = series_of(m, f, label, 0, &rc);
    if (!s)
        return rc;
    uint64_t n[TS_METRICS_MAX_BUCKETS + 1], total = 0;
    for (int b = 0; b <= f->n_bounds; b++)
        total += n[b] = atomic_load_explicit(&s->buckets[b], memory_order_relaxed);
    if (count)
        *count = total;
    if (total == 0)
        return TS_ENOTFOUND;
    /* the rank's bucket, then linear within it from its lower bound (0 for the first bucket,
     * as Prometheus's histogram_quantile); a rank in +Inf answers the highest finite bound */
    double rank = q * (double)total, below = 0.0;
    for (int b = 0; b <= f->n_bounds; b++) {
        if (below + (double)n[b] >= rank && n[b] > 0) {
            if (b == f->n_bounds) {
                *out = f->bounds[f->n_bounds - 1];
                return TS_OK;
            }
            double lo = b == 0 ? fmin(0.0, f->bounds[0]) : f->bounds[b - 1], hi = f->bounds[b];
            *out = lo + (hi - lo) * (rank - below) / (double)n[b];
            return TS_OK;
        }
        below += (double)n[b];
    }
    *out = f->bounds[f->n_bounds - 1];
    return TS_OK;
}

/* ---- the text exposition format ------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} buf_t;

static void put(buf_t *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(buf_t *b, const char *s) { put(b, s, strlen(s)); }

/* s with '\\' and '\n' escaped, and '"' too when quote is set (HELP escapes the first two, label
 * values all three). */
static void put_escaped(buf_t *b, const char *s, int quote) {
    for (; *s; s++) {
        if (*s == '\\')
            puts_(b, "\\\\");
        else if (*s == '\n')
            puts_(b, "\\n");
        else if (*s == '"' && quote)
            puts_(b, "\\\"");
        else
            put(b, s, 1);
    }
}

/* The shortest decimal that reads back as the same double, and the format's NaN and infinities
 * (Go's ParseFloat is what reads them). */
static void format_double(double v, char out[40]) {
    if (isnan(v)) {
        snprintf(out, 40, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, 40, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, 40, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

/* name{label="value"[,le="bound"]} value\n */
static void put_sample(buf_t *b, const family_t *f, const char *suffix, const series_t *s,
                       const char *le, const char *value) {
    puts_(b, f->name);
    puts_(b, suffix);
    if (f->label || le) {
        puts_(b, "{");
        if (f->label) {
            puts_(b, f->label);
            puts_(b, "=\"");
            put_escaped(b, s->value, 1);
            puts_(b, le ? "\"," : "\"");
        }
        if (le) {
            puts_(b, "le=\"");
            puts_(b, le);
            puts_(b, "\"");
        }
        puts_(b, "}");
    }
    puts_(b, " ");
    puts_(b, value);
    puts_(b, "\n");
}

static void put_histogram(buf_t *b, const family_t *f, const series_t *s) {
    uint64_t cum = 0;
    char le[40], v[40];
    for (int i = 0; i <= f->n_bounds; i++) {
        cum += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
        if (i < f->n_bounds)
            format_double(f->bounds[i], le);
        else
            snprintf(le, sizeof le, "+Inf");
        snprintf(v, sizeof v, "%llu", (unsigned long long)cum);
        put_sample(b, f, "_bucket", s, le, v);
    }
    format_double(double_of(atomic_load_explicit(&s->sum, memory_order_relaxed)), v);
    put_sample(b, f, "_sum", s, NULL, v);
    snprintf(v, sizeof v, "%llu", (unsigned long long)cum);
    put_sample(b, f, "_count", s, NULL, v);
}

static void put_family(buf_t *b, const family_t *f) {
    static const char *const types[] = {"counter", "gauge", "histogram"};
    puts_(b, "# HELP ");
    puts_(b, f->name);
    puts_(b, " ");
    put_escaped(b, f->help, 0);
    puts_(b, "\n# TYPE ");
    puts_(b, f->name);
    puts_(b, " ");
    puts_(b, types[f->type]);
    puts_(b, "\n");
    int n = atomic_load_explicit(&f->n_series, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        const series_t *s = &f->series[i];
        char v[40];
        uint64_t raw = atomic_load_explicit(&s->v, memory_order_relaxed);
        if (f->type == TS_METRIC_COUNTER) {
            snprintf(v, sizeof v, "%llu", (unsigned long long)raw);
            put_sample(b, f, "", s, NULL, v);
        } else if (f->type == TS_METRIC_GAUGE) {
            format_double(double_of(raw), v);
            put_sample(b, f, "", s, NULL, v);
        } else {
            put_histogram(b, f, s);
        }
    }
}

int ts_metrics_write(ts_metrics_t *m, char **out, size_t *len) {
    if (!m || !out)
        return TS_EINVAL;
    *out = NULL;
    int nc = atomic_load_explicit(&m->n_collectors, memory_order_acquire);
    for (int i = 0; i < nc; i++)
        m->collectors[i].fn(m, m->collectors[i].user);
    buf_t b = {0};
    puts_(&b, ""); /* an empty registry is an empty, NUL-terminated body */
    int n = atomic_load_explicit(&m->n_families, memory_order_acquire);
    for (int i = 0; i < n; i++)
        put_family(&b, m->families[i]);
    if (b.oom) {
        free(b.p);
        return TS_ENOMEM;
    }
    *out = b.p;
    if (len)
        *len = b.len;
    return TS_OK;
}

/* ---- the daemon's metrics ------------------------------------------------------------------- */

/* clang-format off */
static const char *const REQUEST_TYPES[] = {"denoise", "manifest", "chunk", "status", "advert", "push_pull", "ping", "dial_back", "accusation", "malformed", NULL};
/* every ts_conn_close_reason_t, as ts_conn_close_reason_name spells it */
static const char *const CLOSE_REASONS[] = {"local", "eof", "io", "handshake-timeout", "idle-timeout", "handshake", "identity", "decrypt", "framing", "protocol", "nomem", "evicted", "budget", NULL};
static const char *const DEVICE_MEMORY_KINDS[] = {"total", "used", NULL};
static const char *const STEP_CLOCKS[] = {"wall", "device", NULL};
static const char *const MEMBER_STATES[] = {"alive", "suspect", "dead", "left", NULL};
static const char *const TRANSPORTS[] = {"tcp", "udp", NULL};
/* the handshake's close reasons, as ts_conn_close_reason_name spells them */
static const char *const NOMEM_ACTIONS[] = {"split", "refused", NULL};
static const char *const RELAY_CIRCUIT_OUTCOMES[] = {"spliced", "failed", NULL};
static const char *const RELAY_DATAGRAM_OUTCOMES[] = {"forwarded", "dropped", NULL};
static const char *const HANDSHAKE_REASONS[] = {"handshake-timeout", "handshake", "identity", NULL};
static const char *const ACCUSATION_OUTCOMES[] = {"received", "upheld", "refused", "unverifiable", "repeat", "passed_on", NULL};
static const double BATCH_BUCKETS[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
static const double WAIT_BUCKETS[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
static const double COMPUTE_BUCKETS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
#define BUCKETS(a) a, (int)(sizeof a / sizeof a[0])
#define C TS_METRIC_COUNTER
#define G TS_METRIC_GAUGE
#define H TS_METRIC_HISTOGRAM

/* In ts_metric_id_t's order: entry i is registered as id i. */
static const ts_metric_spec_t DAEMON_METRICS[TS_M_COUNT] = {
    [TS_M_BUILD_INFO] = {"tessera_build_info", "The tesserad version running (the value is always 1).", G, "version", NULL, NULL, 0},
    [TS_M_START_TIME] = {"process_start_time_seconds", "Start time of the process since the Unix epoch in seconds.", G, NULL, NULL, NULL, 0},
    [TS_M_RESIDENT_MEMORY] = {"process_resident_memory_bytes", "Resident memory size in bytes (/proc/self/statm).", G, NULL, NULL, NULL, 0},
    [TS_M_REQUESTS] = {"tessera_requests_total", "Requests received, by type, answered or refused.", C, "type", REQUEST_TYPES, NULL, 0},
    [TS_M_REQUEST_ERRORS] = {"tessera_request_errors_total", "Requests answered with an Error envelope, by type.", C, "type", REQUEST_TYPES, NULL, 0},
    [TS_M_REQUESTS_BUSY] = {"tessera_requests_busy_total", "Requests answered Busy, by type (a full queue, or a connection over its limits).", C, "type", REQUEST_TYPES, NULL, 0},
    [TS_M_CONN_CLOSES] = {"tessera_connection_closes_total", "TCP connections closed, by reason.", C, "reason", CLOSE_REASONS, NULL, 0},
    [TS_M_CONN_REFUSED] = {"tessera_connections_refused_total", "Accepted TCP connections closed at once by the connection limits.", C, NULL, NULL, NULL, 0},
    [TS_M_BUSY] = {"tessera_busy_total", "Denoising requests refused with Busy because the queue was full.", C, NULL, NULL, NULL, 0},
    [TS_M_DEADLINE_DROPS] = {"tessera_deadline_dropped_total", "Denoising requests dropped before compute because their deadline had passed.", C, NULL, NULL, NULL, 0},
    [TS_M_QUEUE_DEPTH] = {"tessera_queue_depth", "Denoising requests waiting for the compute thread.", G, NULL, NULL, NULL, 0},
    [TS_M_BATCH_SIZE] = {"tessera_batch_size", "Samples per batch run on the compute thread.", H, NULL, NULL, BUCKETS(BATCH_BUCKETS)},
    [TS_M_QUEUE_WAIT_SECONDS] = {"tessera_queue_wait_seconds", "Time a denoising request waited in the queue before its batch started.", H, NULL, NULL, BUCKETS(WAIT_BUCKETS)},
    [TS_M_COMPUTE_SECONDS] = {"tessera_compute_seconds", "Time to compute one batch on the device.", H, NULL, NULL, BUCKETS(COMPUTE_BUCKETS)},
    [TS_M_DENOISE_STEPS] = {"tessera_denoise_steps_total", "Expert evaluations (batches) computed for denoising requests.", C, NULL, NULL, NULL, 0},
    [TS_M_DENOISE_SAMPLES] = {"tessera_denoise_samples_total", "Samples evaluated for denoising requests.", C, NULL, NULL, NULL, 0},
    [TS_M_TRAIN_STEP] = {"tessera_train_step", "The optimiser step the training worker has reached.", G, NULL, NULL, NULL, 0},
    [TS_M_TRAIN_LOSS] = {"tessera_train_loss", "The flow-matching loss of the last training step.", G, NULL, NULL, NULL, 0},
    [TS_M_TRAIN_SAMPLES] = {"tessera_train_samples_total", "Training samples processed.", C, NULL, NULL, NULL, 0},
    [TS_M_GOSSIP_MEMBERS] = {"tessera_gossip_members", "Members of the network this node knows, by state.", G, "state", MEMBER_STATES, NULL, 0},
    [TS_M_NET_RECEIVED_BYTES] = {"tessera_net_received_bytes_total", "Bytes received, by transport.", C, "transport", TRANSPORTS, NULL, 0},
    [TS_M_NET_SENT_BYTES] = {"tessera_net_sent_bytes_total", "Bytes sent, by transport.", C, "transport", TRANSPORTS, NULL, 0},
    [TS_M_HANDSHAKE_FAILURES] = {"tessera_handshake_failures_total", "Connections closed during the handshake, by reason.", C, "reason", HANDSHAKE_REASONS, NULL, 0},
    [TS_M_CONNECTIONS] = {"tessera_connections", "Open TCP connections, both directions.", G, NULL, NULL, NULL, 0},
    [TS_M_REACHABLE] = {"tessera_reachable", "Whether a peer could dial this node back at its advertised address: 1 yes, 0 no, -1 not known yet.", G, NULL, NULL, NULL, 0},
    [TS_M_RELAYED] = {"tessera_relayed", "Whether this node is reached through a relay (it cannot be dialled at its own address): 1 yes, 0 no.", G, NULL, NULL, NULL, 0},
    [TS_M_RELAY_NODES] = {"tessera_relay_nodes", "Nodes this relay carries now ([relay] serve).", G, NULL, NULL, NULL, 0},
    [TS_M_RELAY_CIRCUITS] = {"tessera_relay_circuits", "Connections this relay splices now.", G, NULL, NULL, NULL, 0},
    [TS_M_RELAY_CIRCUITS_TOTAL] = {"tessera_relay_circuits_total", "Connections to carried nodes: spliced, or failed (no connect-back in time, over the cap).", C, "outcome", RELAY_CIRCUIT_OUTCOMES, NULL, 0},
    [TS_M_RELAY_BYTES] = {"tessera_relay_bytes_total", "Bytes this relay spliced, both ways.", C, NULL, NULL, NULL, 0},
    [TS_M_RELAY_DATAGRAMS] = {"tessera_relay_datagrams_total", "Gossip datagrams for carried nodes: forwarded, or dropped (rate cap, congestion).", C, "outcome", RELAY_DATAGRAM_OUTCOMES, NULL, 0},
    [TS_M_OUT_OF_MEMORY] = {"tessera_serve_out_of_memory_total", "Batches the device had no memory for: split into smaller ones (the rows per batch halve), or a request refused (too big alone).", C, "action", NOMEM_ACTIONS, NULL, 0},
    [TS_M_DEVICE_UTILIZATION] = {"tessera_device_utilization_ratio", "Fraction of the last sample period (NVML: 1/6 s to 1 s) in which a kernel ran on the GPU the expert is served on, by every process (0 on a CPU node or without NVML).", G, NULL, NULL, NULL, 0},
    [TS_M_DEVICE_SECONDS] = {"tessera_device_seconds", "Device time of one batch's upload, forward pass and guidance: on a GPU from CUDA events on the engine's stream (the span on the device's timeline: its kernels and any gaps between them, without the host's staging before and copy down after); on a CPU the same span's wall time.", H, NULL, NULL, BUCKETS(COMPUTE_BUCKETS)},
    [TS_M_TRAIN_STEP_SECONDS] = {"tessera_train_step_seconds", "The training job's last step: its wall time, and the device's time for it (on a GPU the span between CUDA events around it, idle gaps included; on a CPU the same as wall).", G, "clock", STEP_CLOCKS, NULL, 0},
    [TS_M_BLAS_KERNELS] = {"tessera_blas_kernels_info", "The OpenBLAS kernel set the CPU engine's GEMMs run (the value is always 1): SkylakeX, Cooperlake, Haswell, Prescott, ...", G, "core", NULL, NULL, 0},
    [TS_M_BLAS_WEAKER] = {"tessera_blas_kernels_weaker", "1 when the OpenBLAS kernels in use are weaker than the CPU runs (the log and tessera selfcheck name the fix), else 0.", G, NULL, NULL, NULL, 0},
    [TS_M_ACCUSATIONS] = {"tessera_accusations_total", "Accusations of wrong answers: received (all), upheld (recomputed: wrong; the node is banned here), refused (a bad signature, or a right answer), unverifiable (not judged: this node is the accused, the accused serves no such expert here, too many samples, no weights to be had, shutting down), repeat (answered with an earlier verdict), passed_on (sent to other members after an upheld one).", C, "outcome", ACCUSATION_OUTCOMES, NULL, 0},
    [TS_M_BANNED_NODES] = {"tessera_banned_nodes", "Nodes banned here for a wrong answer: their adverts are no longer passed on to clients.", G, NULL, NULL, NULL, 0},
    [TS_M_DEVICE_MEMORY] = {"tessera_device_memory_bytes", "Memory of the GPU the expert is served on: total, and used by every process (0 on a CPU node).", G, "kind", DEVICE_MEMORY_KINDS, NULL, 0},
};
/* clang-format on */

int ts_metrics_read_rss(uint64_t *bytes) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return TS_EIO;
    unsigned long long size, resident;
    int n = fscanf(f, "%llu %llu", &size, &resident);
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    if (n != 2 || page <= 0)
        return TS_EIO;
    *bytes = (uint64_t)resident * (uint64_t)page;
    return TS_OK;
}

static void collect_process(ts_metrics_t *m, void *user) {
    (void)user;
    uint64_t rss;
    if (ts_metrics_read_rss(&rss) == TS_OK)
        ts_metrics_gauge_set(m, TS_M_RESIDENT_MEMORY, NULL, (double)rss);
}

int ts_metrics_create_daemon(ts_metrics_t **out, const char *version) {
    ts_metrics_t *m;
    int rc = ts_metrics_create(&m);
    if (rc != TS_OK)
        return rc;
    for (int i = 0; i < TS_M_COUNT && rc == TS_OK; i++)
        rc = ts_metrics_register(m, &DAEMON_METRICS[i], NULL, NULL, 0);
    if (rc == TS_OK)
        rc = ts_metrics_gauge_set(m, TS_M_BUILD_INFO, version ? version : "unknown", 1);
    if (rc == TS_OK) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        rc = ts_metrics_gauge_set(m, TS_M_START_TIME, NULL,
                                  (double)now.tv_sec + (double)now.tv_nsec * 1e-9);
    }
    if (rc == TS_OK)
        rc = ts_metrics_add_collector(m, collect_process, NULL);
    if (rc != TS_OK) {
        ts_metrics_free(m);
        return rc;
    }
    *out = m;
    return TS_OK;
}
