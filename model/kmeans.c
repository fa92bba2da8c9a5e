/*
 * kmeans.c — k-means++ and Lloyd's iterations, with restarts and DDM's hierarchical variant
 * (model/kmeans.h): points in double, the assignment by blocks of one dgemm each, draws from the
 * Philox stream.
 */
#define _POSIX_C_SOURCE 200809L

#include "model/kmeans.h"

#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/math.h"
#include "model/par.h"

#define KM_BLOCK 256       /* points per assignment block (one dgemm each) */
#define KM_SEED_BLOCK 4096 /* points per block of the k-means++ distance update */

/* The working state of one k-means run over points x (n, dims) in double. */
typedef struct {
    const double *x; /* (n, dims) */
    const double *w; /* (n) or NULL */
    int64_t n;
    int dims, K, threads;
    double *cent;     /* (K, dims) */
    double *cc;       /* (K): ‖centroid‖² */
    int32_t *assign;  /* (n) */
    double *dist;     /* (n): ‖x − its centroid‖², or during seeding the D² of k-means++ */
    double *gram;     /* (threads, KM_BLOCK, K) */
    int64_t *changed; /* (assignment blocks) */
    const double *centre; /* the centre added last, during seeding */
} km_state_t;

static double sq_dist(const double *a, const double *b, int dims) {
    double s = 0.0;
    for (int d = 0; d < dims; d++) {
        double t = a[d] - b[d];
        s += t * t;
    }
    return s;
}

/* A 53-bit uniform in [0, 1): draw `draw` of restart `restart` of stage `stage`. */
static double km_uniform(uint64_t seed, int stage, int restart, uint32_t draw) {
    uint64_t block = ((uint64_t)stage << 48) | ((uint64_t)restart << 32) | draw;
    ts_u32x4_t r = ts_rng_block(seed, block);
    uint64_t hi = r.v[0] >> 5, lo = r.v[1] >> 6; /* 27 + 26 bits */
    return (double)((hi << 26) | lo) * (1.0 / 9007199254740992.0);
}

/* The index i where the running sum of mass[i] first exceeds u·total (mass ≥ 0, total > 0);
 * the last index of positive mass if rounding leaves none. */
static int64_t pick_by_mass(const double *mass, const double *w, int64_t n, double target) {
    double run = 0.0;
    int64_t last = -1;
    for (int64_t i = 0; i < n; i++) {
        double m = mass ? mass[i] * (w ? w[i] : 1.0) : (w ? w[i] : 1.0);
        if (m <= 0.0)
            continue;
        run += m;
        last = i;
        if (run > target)
            return i;
    }
    return last;
}

static void seed_block(void *arg, int64_t b, int tid) {
    (void)tid;
    km_state_t *s = arg;
    int64_t lo = b * KM_SEED_BLOCK, hi = lo + KM_SEED_BLOCK < s->n ? lo + KM_SEED_BLOCK : s->n;
    for (int64_t i = lo; i < hi; i++) {
        double d = sq_dist(s->x + (size_t)i * s->dims, s->centre, s->dims);
        if (d < s->dist[i])
            s->dist[i] = d;
    }
}

/* k-means++: the first centre by weight, each next one by weight·D². */
static void km_seed(km_state_t *s, uint64_t seed, int stage, int restart) {
    uint32_t draw = 0;
    int64_t nblocks = (s->n + KM_SEED_BLOCK - 1) / KM_SEED_BLOCK;
    double total = 0.0;
    for (int64_t i = 0; i < s->n; i++) {
        total += s->w ? s->w[i] : 1.0;
        s->dist[i] = INFINITY;
    }
    int64_t pick = pick_by_mass(NULL, s->w, s->n, km_uniform(seed, stage, restart, draw++) * total);
    for (int c = 0; c < s->K; c++) {
        if (c > 0) {
            total = 0.0;
            for (int64_t i = 0; i < s->n; i++)
                total += s->dist[i] * (s->w ? s->w[i] : 1.0);
            double u = km_uniform(seed, stage, restart, draw++);
            if (total > 0.0)
                pick = pick_by_mass(s->dist, s->w, s->n, u * total);
            else /* every point sits on a centre already: any point will do */
                pick = (int64_t)(u * (double)s->n);
        }
        memcpy(s->cent + (size_t)c * s->dims, s->x + (size_t)pick * s->dims,
               (size_t)s->dims * sizeof(double));
        s->centre = s->cent + (size_t)c * s->dims;
        ts_par_blocks(s->threads, nblocks, seed_block, s);
    }
}

/* Assignment of one block: argmin_j ‖c_j‖² − 2·x·c_j (lowest j on a tie), then the exact
 * distance to the chosen centroid. */
static void assign_block(void *arg, int64_t b, int tid) {
    km_state_t *s = arg;
    int64_t lo = b * KM_BLOCK, hi = lo + KM_BLOCK < s->n ? lo + KM_BLOCK : s->n;
    int m = (int)(hi - lo), K = s->K, dims = s->dims;
    double *g = s->gram + (size_t)tid * KM_BLOCK * K;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, K, dims, 1.0, s->x + (size_t)lo * dims,
                dims, s->cent, dims, 0.0, g, K);
    int64_t changed = 0;
    for (int i = 0; i < m; i++) {
        const double *gi = g + (size_t)i * K;
        int best = 0;
        double bd = s->cc[0] - 2.0 * gi[0];
        for (int j = 1; j < K; j++) {
            double d = s->cc[j] - 2.0 * gi[j];
            if (d < bd) {
                bd = d;
                best = j;
            }
        }
        int64_t p = lo + i;
        if (s->assign[p] != best)
            changed++;
        s->assign[p] = best;
        s->dist[p] = sq_dist(s->x + (size_t)p * dims, s->cent + (size_t)best * dims, dims);
    }
    s->changed[b] = changed;
}

static void km_norms(km_state_t *s) {
    for (int j = 0; j < s->K; j++) {
        const double *c = s->cent + (size_t)j * s->dims;
        double t = 0.0;
        for (int d = 0; d < s->dims; d++)
            t += c[d] * c[d];
        s->cc[j] = t;
    }
}

/* Moves, for each empty cluster, the point farthest from its centroid (among clusters of ≥ 2
 * points) into it. Returns how many clusters were re-seeded. */
static int km_fix_empty(km_state_t *s, int64_t *count) {
    int fixed = 0;
    for (int j = 0; j < s->K; j++) {
        if (count[j] > 0)
            continue;
        int64_t far = -1;
        double fd = -1.0;
        for (int64_t i = 0; i < s->n; i++)
            if (count[s->assign[i]] >= 2 && s->dist[i] > fd) {
                fd = s->dist[i];
                far = i;
            }
        if (far < 0)
            break; /* cannot happen with n ≥ K */
        count[s->assign[far]]--;
        s->assign[far] = j;
        s->dist[far] = -1.0; /* never picked twice */
        count[j] = 1;
        fixed++;
    }
    return fixed;
}

/* Centroids = weighted means of the assigned points (double, in point order). */
static void km_update(km_state_t *s, double *wsum) {
    int K = s->K, dims = s->dims;
    memset(s->cent, 0, (size_t)K * dims * sizeof(double));
    memset(wsum, 0, (size_t)K * sizeof(double));
    for (int64_t i = 0; i < s->n; i++) {
        double wi = s->w ? s->w[i] : 1.0;
        double *c = s->cent + (size_t)s->assign[i] * dims;
        const double *xi = s->x + (size_t)i * dims;
        for (int d = 0; d < dims; d++)
            c[d] += wi * xi[d];
        wsum[s->assign[i]] += wi;
    }
    for (int j = 0; j < K; j++)
        for (int d = 0; d < dims; d++)
            s->cent[(size_t)j * dims + d] /= wsum[j];
}

static double km_inertia(const km_state_t *s) {
    double t = 0.0;
    for (int64_t i = 0; i < s->n; i++)
        t += (s->w ? s->w[i] : 1.0) *
             sq_dist(s->x + (size_t)i * s->dims, s->cent + (size_t)s->assign[i] * s->dims, s->dims);
    return t;
}

/* Lloyd iterations from the seeded centroids; returns the iterations run. On return the
 * centroids are the means of the assignment and no cluster is empty. */
static int km_lloyd(km_state_t *s, int max_iter, int64_t *count, double *wsum) {
    int64_t nblocks = (s->n + KM_BLOCK - 1) / KM_BLOCK;
    for (int64_t i = 0; i < s->n; i++)
        s->assign[i] = -1;
    int it = 0;
    while (it < max_iter) {
        km_norms(s);
        ts_par_blocks(s->threads, nblocks, assign_block, s);
        it++;
        int64_t changed = 0;
        for (int64_t b = 0; b < nblocks; b++)
            changed += s->changed[b];
        memset(count, 0, (size_t)s->K * sizeof *count);
        for (int64_t i = 0; i < s->n; i++)
            count[s->assign[i]]++;
        int fixed = km_fix_empty(s, count);
        if (changed == 0 && fixed == 0)
            break; /* the centroids are already the means of this assignment */
        km_update(s, wsum);
    }
    return it;
}

static int km_check(const float *x, int64_t n, int dims, const ts_kmeans_opts_t *o, char *err,
                    size_t errlen) {
    if (!x || !o || dims < 1 || n < 1 || n > INT32_MAX) {
        ts_set_err(err, errlen, "k-means needs 1 <= n <= 2^31-1 points of >= 1 dims");
        return TS_EINVAL;
    }
    if (o->K < 1 || o->K > n) {
        ts_set_err(err, errlen,
                   "k-means: K = %d must be between 1 and the number of points %" PRId64, o->K, n);
        return TS_EINVAL;
    }
    if (o->restarts < 1 || o->restarts > 65535 || o->max_iter < 1 || o->threads < 0) {
        ts_set_err(err, errlen, "k-means: restarts must be 1..65535 and max_iter >= 1");
        return TS_EINVAL;
    }
    for (int64_t i = 0; i < n * dims; i++)
        if (!isfinite(x[i])) {
            ts_set_err(err, errlen, "k-means input holds NaN or Inf (point %" PRId64 ")", i / dims);
            return TS_ENONFINITE;
        }
    if (o->weights)
        for (int64_t i = 0; i < n; i++)
            if (!(o->weights[i] > 0.0) || !isfinite(o->weights[i])) {
                ts_set_err(err, errlen, "k-means: weight %" PRId64 " is not a finite number > 0",
                           i);
                return TS_EINVAL;
            }
    return TS_OK;
}

void ts_kmeans_free(ts_kmeans_t *km) {
    if (!km)
        return;
    free(km->centroids);
    free(km->assignment);
    memset(km, 0, sizeof *km);
}

static int km_run(const float *x, int64_t n, int dims, const ts_kmeans_opts_t *o, int stage,
                  ts_kmeans_t *km, char *err, size_t errlen) {
    memset(km, 0, sizeof *km);
    int rc = km_check(x, n, dims, o, err, errlen);
    if (rc != TS_OK)
        return rc;
    openblas_set_num_threads(1);
    int K = o->K;
    int64_t nblocks = (n + KM_BLOCK - 1) / KM_BLOCK;
    int T = ts_par_threads(o->threads, nblocks);
    km_state_t s = {.w = o->weights, .n = n, .dims = dims, .K = K, .threads = T};
    double *xd = malloc((size_t)n * dims * sizeof *xd);
    s.cent = malloc((size_t)K * dims * sizeof *s.cent);
    s.cc = malloc((size_t)K * sizeof *s.cc);
    s.assign = malloc((size_t)n * sizeof *s.assign);
    s.dist = malloc((size_t)n * sizeof *s.dist);
    s.gram = malloc((size_t)T * KM_BLOCK * K * sizeof *s.gram);
    s.changed = malloc((size_t)nblocks * sizeof *s.changed);
    int64_t *count = malloc((size_t)K * sizeof *count);
    double *wsum = malloc((size_t)K * sizeof *wsum);
    double *best_cent = malloc((size_t)K * dims * sizeof *best_cent);
    km->assignment = malloc((size_t)n * sizeof *km->assignment);
    km->centroids = malloc((size_t)K * dims * sizeof *km->centroids);
    if (!xd || !s.cent || !s.cc || !s.assign || !s.dist || !s.gram || !s.changed || !count ||
        !wsum || !best_cent || !km->assignment || !km->centroids) {
        ts_set_err(err, errlen, "k-means: out of memory (n %" PRId64 ", K %d)", n, K);
        rc = TS_ENOMEM;
    }
    if (rc == TS_OK) {
        for (int64_t i = 0; i < n * dims; i++)
            xd[i] = (double)x[i];
        s.x = xd;
        km->inertia = INFINITY;
        for (int r = 0; r < o->restarts; r++) {
            km_seed(&s, o->seed, stage, r);
            int iters = km_lloyd(&s, o->max_iter, count, wsum);
            double inertia = km_inertia(&s);
            if (o->progress)
                o->progress(o->ctx, stage, r, o->restarts, inertia, iters);
            if (r == 0 || inertia < km->inertia) {
                km->inertia = inertia;
                km->best_restart = r;
                km->iters = iters;
                memcpy(best_cent, s.cent, (size_t)K * dims * sizeof *best_cent);
                memcpy(km->assignment, s.assign, (size_t)n * sizeof *s.assign);
            }
        }
        for (int64_t i = 0; i < (int64_t)K * dims; i++)
            km->centroids[i] = (float)best_cent[i];
        km->K = K;
        km->dims = dims;
        km->n = n;
    }
    free(xd);
    free(s.cent);
    free(s.cc);
    free(s.assign);
    free(s.dist);
    free(s.gram);
    free(s.changed);
    free(count);
    free(wsum);
    free(best_cent);
    if (rc != TS_OK)
        ts_kmeans_free(km);
    return rc;
}

int ts_kmeans_fit(const float *x, int64_t n, int dims, const ts_kmeans_opts_t *o, ts_kmeans_t *km,
                  char *err, size_t errlen) {
    if (!km)
        return TS_EINVAL;
    return km_run(x, n, dims, o, 0, km, err, errlen);
}

/* Centroids of x (n, dims) under assignment into km->centroids (double sums in point order), and
 * the inertia over the points. */
static int km_finish(const float *x, int64_t n, int dims, int K, ts_kmeans_t *km) {
    double *sum = calloc((size_t)K * dims, sizeof *sum);
    int64_t *count = calloc((size_t)K, sizeof *count);
    int rc = sum && count ? TS_OK : TS_ENOMEM;
    if (rc == TS_OK) {
        for (int64_t i = 0; i < n; i++) {
            double *c = sum + (size_t)km->assignment[i] * dims;
            for (int d = 0; d < dims; d++)
                c[d] += (double)x[(size_t)i * dims + d];
            count[km->assignment[i]]++;
        }
        for (int j = 0; j < K; j++)
            for (int d = 0; d < dims; d++)
                sum[(size_t)j * dims + d] /= (double)count[j];
        double inertia = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double *c = sum + (size_t)km->assignment[i] * dims;
            for (int d = 0; d < dims; d++) {
                double t = (double)x[(size_t)i * dims + d] - c[d];
                inertia += t * t;
            }
        }
        for (int64_t i = 0; i < (int64_t)K * dims; i++)
            km->centroids[i] = (float)sum[i];
        km->inertia = inertia;
    }
    free(sum);
    free(count);
    return rc;
}

int ts_kmeans_hierarchical(const float *x, int64_t n, int dims, int fine, const ts_kmeans_opts_t *o,
                           ts_kmeans_t *km, char *err, size_t errlen) {
    if (!km)
        return TS_EINVAL;
    memset(km, 0, sizeof *km);
    if (!o || o->weights || fine < o->K || fine > n) {
        ts_set_err(
            err, errlen,
            "hierarchical k-means: FINE = %d must be between K = %d and the number of points "
            "%" PRId64,
            fine, o ? o->K : 0, n);
        return TS_EINVAL;
    }
    ts_kmeans_opts_t fo = *o;
    fo.K = fine;
    ts_kmeans_t fk;
    int rc = km_run(x, n, dims, &fo, 0, &fk, err, errlen);
    if (rc != TS_OK)
        return rc;
    double *w = calloc((size_t)fine, sizeof *w);
    if (!w) {
        ts_kmeans_free(&fk);
        ts_set_err(err, errlen, "hierarchical k-means: out of memory");
        return TS_ENOMEM;
    }
    for (int64_t i = 0; i < n; i++)
        w[fk.assignment[i]] += 1.0;
    ts_kmeans_opts_t co = *o;
    co.weights = w;
    ts_kmeans_t ck;
    rc = km_run(fk.centroids, fine, dims, &co, 1, &ck, err, errlen);
    if (rc == TS_OK) {
        km->K = o->K;
        km->dims = dims;
        km->n = n;
        km->best_restart = ck.best_restart;
        km->iters = ck.iters;
        km->assignment = fk.assignment; /* relabelled in place: fine → coarse */
        fk.assignment = NULL;
        for (int64_t i = 0; i < n; i++)
            km->assignment[i] = ck.assignment[km->assignment[i]];
        km->centroids = ck.centroids;
        ck.centroids = NULL;
        rc = km_finish(x, n, dims, o->K, km);
        if (rc != TS_OK) {
            ts_set_err(err, errlen, "hierarchical k-means: out of memory");
            ts_kmeans_free(km);
        }
    }
    free(w);
    ts_kmeans_free(&fk);
    ts_kmeans_free(&ck);
    return rc;
}
