/*
 * partition.c — PCA, k-means++ and the partition artifact (model/partition.h).
 *
 * Layout of the file, top to bottom: a fixed-block parallel loop (the only threading here), PCA,
 * k-means (seeding, the Lloyd loop, restarts, the hierarchical variant), then the artifact:
 * fit, save, load with its checks, embed and nearest.
 *
 * Determinism is the invariant everything here keeps: a partition is named by the hash of its
 * bytes, so the same data and seed must give the same bytes on any machine with the same BLAS and
 * for any --threads. Hence (a) every parallel loop runs over blocks fixed by the problem size,
 * never by the thread count, and each block writes its own outputs or its own partial sum, which
 * are then combined in block order; (b) every sum whose order could vary is in double and done in
 * a fixed order; (c) BLAS runs single-threaded inside our blocks; (d) random draws are pure
 * functions of (seed, stage, restart, draw) on the Philox stream.
 */
#define _POSIX_C_SOURCE 200809L

#include "model/partition.h"

#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <lapacke.h>
#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/str.h"
#include "kernels/math.h"
#include "model/safetensors.h"

#define PCA_CHUNK 512      /* rows centred in double per dsyrk call */
#define PCA_MAX_BLOCKS 8   /* partial covariances (each D×D doubles) summed in order */
#define PROJ_BLOCK 1024    /* rows per projection block */
#define KM_BLOCK 256       /* points per assignment block (one dgemm each) */
#define KM_SEED_BLOCK 4096 /* points per block of the k-means++ distance update */

/* ---- a parallel loop over fixed blocks ------------------------------------------------------ */

/* fn handles block b on worker tid (0 ≤ tid < the threads actually used). */
typedef void (*block_fn)(void *ctx, int64_t b, int tid);

typedef struct {
    block_fn fn;
    void *ctx;
    int64_t nblocks;
    int tid, stride;
} stripe_t;

static void run_stripe(const stripe_t *s) {
    for (int64_t b = s->tid; b < s->nblocks; b += s->stride)
        s->fn(s->ctx, b, s->tid);
}

static void *stripe_main(void *arg) {
    run_stripe(arg);
    return NULL;
}

static int resolve_threads(int threads) {
    if (threads > 0)
        return threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n < 1024 ? n : 1024) : 1;
}

/* Worker count for a loop of nblocks blocks: at most one per block. */
static int used_threads(int threads, int64_t nblocks) {
    int t = resolve_threads(threads);
    if (t > 1024)
        t = 1024; /* par_blocks' bound */
    return nblocks < t ? (int)(nblocks > 0 ? nblocks : 1) : t;
}

/* Runs fn over blocks [0, nblocks): worker t takes blocks t, t + T, t + 2T, ... (T = the
 * threads used). Which worker runs a block never changes what the block computes. A worker that
 * cannot be started has its stripe run by the caller. */
static void par_blocks(int threads, int64_t nblocks, block_fn fn, void *ctx) {
    enum { MAX_T = 1024 };
    int T = used_threads(threads, nblocks);
    stripe_t stripes[MAX_T];
    pthread_t tids[MAX_T];
    int started[MAX_T];
    for (int t = 0; t < T; t++) {
        stripes[t] = (stripe_t){fn, ctx, nblocks, t, T};
        started[t] = t > 0 && pthread_create(&tids[t], NULL, stripe_main, &stripes[t]) == 0;
    }
    for (int t = 0; t < T; t++)
        if (!started[t])
            run_stripe(&stripes[t]);
    for (int t = 1; t < T; t++)
        if (started[t])
            pthread_join(tids[t], NULL);
}

/* ---- PCA --------------------------------------------------------------------------------- */

typedef struct {
    const float *x;
    const double *mean;
    int64_t n, per_block;
    int D;
    double *partial; /* (nblocks, D, D) */
    double *chunk;   /* (nblocks, PCA_CHUNK, D) */
} cov_job_t;

/* partial[b] = Σ over the block's rows of (x − mean)ᵀ(x − mean), upper triangle. */
static void cov_block(void *arg, int64_t b, int tid) {
    (void)tid;
    cov_job_t *j = arg;
    int D = j->D;
    double *acc = j->partial + (size_t)b * D * D;
    double *c = j->chunk + (size_t)b * PCA_CHUNK * D;
    int64_t lo = b * j->per_block, hi = lo + j->per_block < j->n ? lo + j->per_block : j->n;
    memset(acc, 0, (size_t)D * D * sizeof *acc);
    for (int64_t r0 = lo; r0 < hi; r0 += PCA_CHUNK) {
        int m = (int)(hi - r0 < PCA_CHUNK ? hi - r0 : PCA_CHUNK);
        for (int i = 0; i < m; i++)
            for (int d = 0; d < D; d++)
                c[(size_t)i * D + d] = (double)j->x[(size_t)(r0 + i) * D + d] - j->mean[d];
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, D, m, 1.0, c, D, 1.0, acc, D);
    }
}

void ts_pca_free(ts_pca_t *pca) {
    if (!pca)
        return;
    free(pca->basis);
    free(pca->mean);
    free(pca->eigenvalues);
    memset(pca, 0, sizeof *pca);
}

/* Covariance of x (n, D) into cov (D, D), upper triangle, divided by n − 1; mean into mean. */
static int covariance(const float *x, int64_t n, int D, int threads, double *mean, double *cov) {
    for (int d = 0; d < D; d++)
        mean[d] = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float *row = x + (size_t)i * D;
        for (int d = 0; d < D; d++) {
            if (!isfinite(row[d]))
                return TS_ENONFINITE;
            mean[d] += (double)row[d];
        }
    }
    for (int d = 0; d < D; d++)
        mean[d] /= (double)n;

    int64_t nblocks = (n + PCA_CHUNK - 1) / PCA_CHUNK;
    if (nblocks > PCA_MAX_BLOCKS)
        nblocks = PCA_MAX_BLOCKS;
    cov_job_t job = {x, mean, n, (n + nblocks - 1) / nblocks, D, NULL, NULL};
    job.partial = malloc((size_t)nblocks * D * D * sizeof(double));
    job.chunk = malloc((size_t)nblocks * PCA_CHUNK * D * sizeof(double));
    if (!job.partial || !job.chunk) {
        free(job.partial);
        free(job.chunk);
        return TS_ENOMEM;
    }
    par_blocks(threads, nblocks, cov_block, &job);
    size_t dd = (size_t)D * D;
    memcpy(cov, job.partial, dd * sizeof(double));
    for (int64_t b = 1; b < nblocks; b++)
        for (size_t i = 0; i < dd; i++)
            cov[i] += job.partial[(size_t)b * dd + i];
    for (size_t i = 0; i < dd; i++)
        cov[i] /= (double)(n - 1);
    free(job.partial);
    free(job.chunk);
    return TS_OK;
}

int ts_pca_fit(const float *x, int64_t n, int D, int k, int threads, ts_pca_t *pca, char *err,
               size_t errlen) {
    if (!pca)
        return TS_EINVAL;
    memset(pca, 0, sizeof *pca);
    if (!x || n < 2 || D < 1 || k < 1 || k > D || threads < 0) {
        ts_set_err(err, errlen,
                   "PCA needs n >= 2 rows and 1 <= k <= D (got n %" PRId64 ", D %d, k %d)", n, D,
                   k);
        return TS_EINVAL;
    }
    openblas_set_num_threads(1);
    double *mean = malloc((size_t)D * sizeof *mean);
    double *cov = malloc((size_t)D * D * sizeof *cov);
    double *w = malloc((size_t)D * sizeof *w);
    pca->basis = malloc((size_t)k * D * sizeof *pca->basis);
    pca->mean = malloc((size_t)D * sizeof *pca->mean);
    pca->eigenvalues = malloc((size_t)k * sizeof *pca->eigenvalues);
    int rc = TS_OK;
    if (!mean || !cov || !w || !pca->basis || !pca->mean || !pca->eigenvalues)
        rc = TS_ENOMEM;
    if (rc == TS_OK && (rc = covariance(x, n, D, threads, mean, cov)) == TS_ENONFINITE)
        ts_set_err(err, errlen, "PCA input holds NaN or Inf");
    if (rc == TS_OK) {
        double trace = 0.0;
        for (int d = 0; d < D; d++)
            trace += cov[(size_t)d * D + d];
        pca->total_variance = trace;
        /* Row-major 'V': column j of cov becomes eigenvector j; eigenvalues ascending. */
        lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', D, cov, D, w);
        if (info != 0) {
            ts_set_err(err, errlen, "PCA: LAPACKE_dsyevd failed (info %d)", (int)info);
            rc = info < 0 ? TS_EINVAL : TS_ECORRUPT;
        }
    }
    if (rc == TS_OK) {
        pca->D = D;
        pca->k = k;
        double kept = 0.0;
        for (int r = 0; r < k; r++) {
            int col = D - 1 - r;
            int arg = 0;
            double big = -1.0;
            for (int i = 0; i < D; i++) {
                double a = fabs(cov[(size_t)i * D + col]);
                if (a > big) {
                    big = a;
                    arg = i;
                }
            }
            double s = cov[(size_t)arg * D + col] < 0.0 ? -1.0 : 1.0;
            for (int i = 0; i < D; i++)
                pca->basis[(size_t)r * D + i] = (float)(s * cov[(size_t)i * D + col]);
            pca->eigenvalues[r] = w[col];
            kept += w[col];
        }
        for (int d = 0; d < D; d++)
            pca->mean[d] = (float)mean[d];
        pca->explained = pca->total_variance > 0.0 ? kept / pca->total_variance : 0.0;
    }
    free(mean);
    free(cov);
    free(w);
    if (rc != TS_OK) {
        if (rc == TS_ENOMEM)
            ts_set_err(err, errlen, "PCA: out of memory (D = %d)", D);
        ts_pca_free(pca);
    }
    return rc;
}

/* out row i = (x_i − mean)·basisᵀ, accumulated in double in increasing d; bt is (D, k). */
static void project_rows(const double *bt, const float *mean, const float *x, int64_t lo,
                         int64_t hi, int D, int k, float *out, double *acc) {
    for (int64_t i = lo; i < hi; i++) {
        const float *row = x + (size_t)i * D;
        for (int j = 0; j < k; j++)
            acc[j] = 0.0;
        for (int d = 0; d < D; d++) {
            double v = (double)row[d] - (double)mean[d];
            const double *b = bt + (size_t)d * k;
            for (int j = 0; j < k; j++)
                acc[j] += v * b[j];
        }
        for (int j = 0; j < k; j++)
            out[(size_t)i * k + j] = (float)acc[j];
    }
}

static double *transpose_basis(const float *basis, int D, int k) {
    double *bt = malloc((size_t)D * k * sizeof *bt);
    if (bt)
        for (int j = 0; j < k; j++)
            for (int d = 0; d < D; d++)
                bt[(size_t)d * k + j] = (double)basis[(size_t)j * D + d];
    return bt;
}

typedef struct {
    const double *bt;
    const float *mean, *x;
    int64_t n;
    int D, k;
    float *out;
    double *acc; /* (threads, k) */
} proj_job_t;

static void proj_block(void *arg, int64_t b, int tid) {
    proj_job_t *j = arg;
    int64_t lo = b * PROJ_BLOCK, hi = lo + PROJ_BLOCK < j->n ? lo + PROJ_BLOCK : j->n;
    project_rows(j->bt, j->mean, j->x, lo, hi, j->D, j->k, j->out, j->acc + (size_t)tid * j->k);
}

int ts_pca_project(const float *basis, const float *mean, const float *x, int64_t n, int D, int k,
                   float *out, int threads) {
    if (!basis || !mean || (n > 0 && (!x || !out)) || n < 0 || D < 1 || k < 1 || k > D ||
        threads < 0)
        return TS_EINVAL;
    if (n == 0)
        return TS_OK;
    int64_t nblocks = (n + PROJ_BLOCK - 1) / PROJ_BLOCK;
    int T = used_threads(threads, nblocks);
    proj_job_t job = {transpose_basis(basis, D, k), mean, x, n, D, k, out, NULL};
    job.acc = malloc((size_t)T * k * sizeof(double));
    int rc = job.bt && job.acc ? TS_OK : TS_ENOMEM;
    if (rc == TS_OK)
        par_blocks(T, nblocks, proj_block, &job);
    free((void *)job.bt);
    free(job.acc);
    return rc;
}

/* ---- k-means ----------------------------------------------------------------------------- */

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
        par_blocks(s->threads, nblocks, seed_block, s);
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
        par_blocks(s->threads, nblocks, assign_block, s);
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
    int T = used_threads(o->threads, nblocks);
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

/* ---- the partition artifact -------------------------------------------------------------- */

void ts_partition_free(ts_partition_t *p) {
    if (!p)
        return;
    free(p->basis);
    free(p->mean);
    free(p->centroids);
    free(p->assignment);
    free(p->sizes);
    memset(p, 0, sizeof *p);
}

typedef struct {
    const ts_partition_opts_t *o;
    int fine;
} fit_progress_t;

static void fit_line(const ts_partition_opts_t *o, const char *fmt, ...) TS_PRINTF(2, 3);

static void fit_line(const ts_partition_opts_t *o, const char *fmt, ...) {
    if (!o->progress)
        return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->progress(o->ctx, line);
}

static void fit_restart(void *ctx, int stage, int restart, int restarts, double inertia,
                        int iters) {
    const fit_progress_t *f = ctx;
    const char *what = !f->fine ? "k-means" : stage == 0 ? "fine k-means" : "coarse k-means";
    fit_line(f->o, "%s (K = %d) restart %d/%d: inertia %.6g%s after %d iteration%s", what,
             f->fine && stage == 0 ? f->fine : f->o->experts, restart + 1, restarts, inertia,
             stage == 1 ? " (over the fine centroids, weighted by size)" : "", iters,
             iters == 1 ? "" : "s");
}

/* km = the clusters assign (n) of the points e (n, dims): the assignment copied, centroids the
 * clusters' means and the inertia, both accumulated in double in point order. Every cluster must
 * hold a point. */
static int given_clusters(const float *e, int64_t n, int dims, int K, const int32_t *assign,
                          ts_kmeans_t *km, char *err, size_t errlen) {
    memset(km, 0, sizeof *km);
    double *sum = calloc((size_t)K * dims, sizeof *sum);
    int64_t *count = calloc((size_t)K, sizeof *count);
    km->assignment = malloc((size_t)n * sizeof *km->assignment);
    km->centroids = malloc((size_t)K * dims * sizeof *km->centroids);
    int rc = sum && count && km->assignment && km->centroids ? TS_OK : TS_ENOMEM;
    for (int64_t i = 0; i < n && rc == TS_OK; i++) {
        if (assign[i] < 0 || assign[i] >= K) {
            ts_set_err(err, errlen,
                       "partition: point %" PRId64 " is given cluster %d, not in [0, %d)", i,
                       (int)assign[i], K);
            rc = TS_EINVAL;
            break;
        }
        km->assignment[i] = assign[i];
        count[assign[i]]++;
        for (int j = 0; j < dims; j++)
            sum[(int64_t)assign[i] * dims + j] += e[i * dims + j];
    }
    for (int k = 0; k < K && rc == TS_OK; k++) {
        if (count[k] == 0) {
            ts_set_err(err, errlen, "partition: cluster %d of the given %d is empty", k, K);
            rc = TS_EINVAL;
        }
        for (int j = 0; j < dims && rc == TS_OK; j++)
            km->centroids[k * dims + j] = (float)(sum[(int64_t)k * dims + j] / (double)count[k]);
    }
    double inertia = 0.0;
    for (int64_t i = 0; i < n && rc == TS_OK; i++)
        for (int j = 0; j < dims; j++) {
            double d = (double)e[i * dims + j] - km->centroids[assign[i] * dims + j];
            inertia += d * d;
        }
    km->inertia = inertia;
    km->K = K;
    km->dims = dims;
    km->n = n;
    free(sum);
    free(count);
    if (rc != TS_OK) {
        if (rc == TS_ENOMEM)
            ts_set_err(err, errlen, "partition: out of memory");
        ts_kmeans_free(km);
    }
    return rc;
}

int ts_partition_fit(const float *x, int64_t n, int D, const ts_partition_opts_t *opts,
                     ts_partition_t *p, char *err, size_t errlen) {
    if (!p)
        return TS_EINVAL;
    memset(p, 0, sizeof *p);
    if (!x || !opts || D < 1 || n < 2) {
        ts_set_err(err, errlen, "partition: need at least 2 images of at least 1 value");
        return TS_EINVAL;
    }
    ts_partition_opts_t o = *opts;
    if (o.dims == 0)
        o.dims = TS_PARTITION_DEFAULT_DIMS;
    if (o.restarts == 0)
        o.restarts = TS_PARTITION_DEFAULT_RESTARTS;
    if (o.max_iter == 0)
        o.max_iter = TS_PARTITION_DEFAULT_MAX_ITER;
    if (!o.dataset)
        o.dataset = "fashion-mnist-train";
    if (o.experts < 1 || o.experts > n) {
        ts_set_err(err, errlen,
                   "partition: experts K = %d must be between 1 and the %" PRId64 " images",
                   o.experts, n);
        return TS_EINVAL;
    }
    if (o.dims < 1 || o.dims > D) {
        ts_set_err(err, errlen, "partition: dims = %d must be between 1 and %d", o.dims, D);
        return TS_EINVAL;
    }
    if (o.hierarchical < 0 ||
        (o.hierarchical > 0 && (o.hierarchical < o.experts || o.hierarchical > n))) {
        ts_set_err(err, errlen,
                   "partition: hierarchical FINE = %d must be 0 (off) or between K = %d "
                   "and the %" PRId64 " images",
                   o.hierarchical, o.experts, n);
        return TS_EINVAL;
    }
    if (strlen(o.dataset) >= sizeof p->dataset) {
        ts_set_err(err, errlen, "partition: dataset name too long");
        return TS_EINVAL;
    }
    ts_pca_t pca;
    int rc = ts_pca_fit(x, n, D, o.dims, o.threads, &pca, err, errlen);
    if (rc != TS_OK)
        return rc;
    fit_line(&o, "PCA: %d of %d dims keep %.2f %% of the variance", o.dims, D,
             100.0 * pca.explained);
    float *e = malloc((size_t)n * o.dims * sizeof *e);
    if (!e) {
        ts_pca_free(&pca);
        ts_set_err(err, errlen, "partition: out of memory");
        return TS_ENOMEM;
    }
    rc = ts_pca_project(pca.basis, pca.mean, x, n, D, o.dims, e, o.threads);
    fit_progress_t fp = {&o, o.hierarchical};
    ts_kmeans_opts_t ko = {.K = o.experts,
                           .restarts = o.restarts,
                           .max_iter = o.max_iter,
                           .seed = o.seed,
                           .threads = o.threads,
                           .progress = fit_restart,
                           .ctx = &fp};
    ts_kmeans_t km = {0};
    if (rc == TS_OK && o.assign)
        rc = given_clusters(e, n, o.dims, o.experts, o.assign, &km, err, errlen);
    else if (rc == TS_OK && o.space) {
        rc = o.space_dims < 1 ? TS_EINVAL
             : o.hierarchical ? ts_kmeans_hierarchical(o.space, n, o.space_dims, o.hierarchical,
                                                       &ko, &km, err, errlen)
                              : ts_kmeans_fit(o.space, n, o.space_dims, &ko, &km, err, errlen);
        if (rc == TS_OK) { /* centroids and inertia in the PCA embedding */
            int32_t *a = km.assignment;
            km.assignment = NULL;
            ts_kmeans_free(&km);
            rc = given_clusters(e, n, o.dims, o.experts, a, &km, err, errlen);
            free(a);
        }
    } else if (rc == TS_OK)
        rc = o.hierarchical
                 ? ts_kmeans_hierarchical(e, n, o.dims, o.hierarchical, &ko, &km, err, errlen)
                 : ts_kmeans_fit(e, n, o.dims, &ko, &km, err, errlen);
    free(e);
    if (rc == TS_OK) {
        p->sizes = calloc((size_t)o.experts, sizeof *p->sizes);
        if (!p->sizes)
            rc = TS_ENOMEM;
    }
    if (rc != TS_OK) {
        ts_pca_free(&pca);
        ts_kmeans_free(&km);
        return rc;
    }
    p->K = o.experts;
    p->k = o.dims;
    p->D = D;
    p->n = n;
    p->basis = pca.basis;
    p->mean = pca.mean;
    p->centroids = km.centroids;
    p->assignment = km.assignment;
    for (int64_t i = 0; i < n; i++)
        p->sizes[p->assignment[i]]++;
    p->seed = o.seed;
    p->restarts = o.restarts;
    p->hierarchical = o.hierarchical;
    p->inertia = km.inertia;
    p->explained = pca.explained;
    snprintf(p->embed, sizeof p->embed, "pca%d", o.dims);
    snprintf(p->dataset, sizeof p->dataset, "%s", o.dataset);
    snprintf(p->strategy, sizeof p->strategy, "%s", o.strategy ? o.strategy : "kmeans");
    free(pca.eigenvalues);
    return TS_OK;
}

static int hash_bytes(const unsigned char *buf, size_t len, char hex[TS_PARTITION_ID_HEX]) {
    unsigned char h[32];
    if (sodium_init() < 0)
        return TS_EIO;
    if (crypto_generichash(h, sizeof h, buf, len, NULL, 0) != 0)
        return TS_EIO;
    ts_hex(h, sizeof h, hex);
    return TS_OK;
}

int ts_partition_file_id(const char *path, char hex[TS_PARTITION_ID_HEX], char *err,
                         size_t errlen) {
    if (!path || !hex)
        return TS_EINVAL;
    hex[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) {
        ts_set_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return TS_EIO;
    }
    unsigned char h[32];
    crypto_generichash_state st;
    unsigned char buf[1 << 16];
    int rc = sodium_init() < 0 ? TS_EIO : TS_OK;
    if (rc == TS_OK)
        crypto_generichash_init(&st, NULL, 0, sizeof h);
    size_t got;
    while (rc == TS_OK && (got = fread(buf, 1, sizeof buf, f)) > 0)
        crypto_generichash_update(&st, buf, got);
    if (rc == TS_OK && ferror(f)) {
        ts_set_err(err, errlen, "cannot read '%s'", path);
        rc = TS_EIO;
    }
    fclose(f);
    if (rc == TS_OK) {
        crypto_generichash_final(&st, h, sizeof h);
        ts_hex(h, sizeof h, hex);
    }
    return rc;
}

int ts_partition_save(ts_partition_t *p, const char *path, char *err, size_t errlen) {
    if (!p || !path || !p->basis || !p->mean || !p->centroids || !p->assignment || !p->sizes ||
        p->K < 1 || p->k < 1 || p->D < p->k || p->n < p->K) {
        ts_set_err(err, errlen, "partition: nothing valid to save");
        return TS_EINVAL;
    }
    ts_st_entry_t e[5] = {
        {"basis", TS_ST_F32, 2, {p->k, p->D}, p->basis},
        {"mean", TS_ST_F32, 1, {p->D}, p->mean},
        {"centroids", TS_ST_F32, 2, {p->K, p->k}, p->centroids},
        {"assignment", TS_ST_I32, 1, {p->n}, p->assignment},
        {"sizes", TS_ST_I32, 1, {p->K}, p->sizes},
    };
    char experts[24], dims[24], seed[24], restarts[24], inertia[40], explained[40], n[24], hier[24];
    snprintf(experts, sizeof experts, "%d", p->K);
    snprintf(dims, sizeof dims, "%d", p->k);
    snprintf(seed, sizeof seed, "%" PRIu64, p->seed);
    snprintf(restarts, sizeof restarts, "%d", p->restarts);
    snprintf(inertia, sizeof inertia, "%.17g", p->inertia);
    snprintf(explained, sizeof explained, "%.17g", p->explained);
    snprintf(n, sizeof n, "%" PRId64, p->n);
    snprintf(hier, sizeof hier, "%d", p->hierarchical);
    const char *meta[] = {"format",
                          TS_PARTITION_FORMAT,
                          "embed",
                          p->embed,
                          "experts",
                          experts,
                          "dims",
                          dims,
                          "seed",
                          seed,
                          "restarts",
                          restarts,
                          "inertia",
                          inertia,
                          "explained_variance",
                          explained,
                          "dataset",
                          p->dataset,
                          "n",
                          n,
                          "hierarchical",
                          hier};
    int n_meta = (int)(sizeof meta / sizeof meta[0]) / 2;
    const char *meta2[sizeof meta / sizeof meta[0] + 2];
    memcpy(meta2, meta, sizeof meta);
    if (p->strategy[0] && strcmp(p->strategy, "kmeans") != 0) {
        meta2[2 * n_meta] = "strategy";
        meta2[2 * n_meta + 1] = p->strategy;
        n_meta++;
    }
    int rc = ts_st_write(path, e, 5, meta2, n_meta, err, errlen);
    if (rc == TS_OK)
        rc = ts_partition_file_id(path, p->id, err, errlen);
    return rc;
}

/* ---- loading ------------------------------------------------------------------------------- */

/* A metadata integer in [lo, hi], or a message. */
static int meta_i64(const ts_st_file_t *f, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    char *err, size_t errlen) {
    const char *v = ts_st_meta(f, key);
    if (!v) {
        ts_set_err(err, errlen, "metadata '%s' is missing", key);
        return TS_ECORRUPT;
    }
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        ts_set_err(err, errlen,
                   "metadata '%s' = \"%.40s\" is not an integer in [%" PRId64 ", %" PRId64 "]", key,
                   v, lo, hi);
        return TS_ECORRUPT;
    }
    *out = x;
    return TS_OK;
}

static int meta_double(const ts_st_file_t *f, const char *key, double *out, char *err,
                       size_t errlen) {
    const char *v = ts_st_meta(f, key);
    char *end;
    double x = v ? strtod(v, &end) : 0.0;
    if (!v || end == v || *end || !isfinite(x)) {
        ts_set_err(err, errlen, "metadata '%s' is missing or not a finite number", key);
        return TS_ECORRUPT;
    }
    *out = x;
    return TS_OK;
}

static int meta_string(const ts_st_file_t *f, const char *key, char *out, size_t cap, char *err,
                       size_t errlen) {
    const char *v = ts_st_meta(f, key);
    if (!v || !*v || strlen(v) >= cap) {
        ts_set_err(err, errlen, "metadata '%s' is missing, empty or longer than %zu bytes", key,
                   cap - 1);
        return TS_ECORRUPT;
    }
    memcpy(out, v, strlen(v) + 1);
    return TS_OK;
}

/* The tensor `name` with dtype and ndim as given, or a message. */
static const ts_st_tensor_t *want_tensor(const ts_st_file_t *f, const char *name,
                                         ts_st_dtype_t dtype, int ndim, char *err, size_t errlen) {
    const ts_st_tensor_t *t = ts_st_find(f, name);
    if (!t)
        ts_set_err(err, errlen, "tensor '%s' is missing", name);
    else if (t->dtype != dtype || t->ndim != ndim)
        ts_set_err(err, errlen, "tensor '%s' must be %s with %d dim%s (is %s with %d)", name,
                   ts_st_dtype_name(dtype), ndim, ndim == 1 ? "" : "s", ts_st_dtype_name(t->dtype),
                   t->ndim);
    else
        return t;
    return NULL;
}

static int load_floats(const ts_st_tensor_t *t, float **out, char *err, size_t errlen) {
    *out = malloc((size_t)t->numel * sizeof **out);
    if (!*out)
        return TS_ENOMEM;
    int rc = ts_st_to_f32(t, *out, t->numel);
    if (rc != TS_OK)
        return rc;
    for (int64_t i = 0; i < t->numel; i++)
        if (!isfinite((*out)[i])) {
            ts_set_err(err, errlen, "tensor '%s' holds NaN or Inf at %" PRId64, t->name, i);
            return TS_ECORRUPT;
        }
    return TS_OK;
}

static int load_ints(const ts_st_tensor_t *t, int32_t **out) {
    int64_t *tmp = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *tmp);
    *out = malloc((size_t)(t->numel ? t->numel : 1) * sizeof **out);
    int rc = tmp && *out ? ts_st_to_i64(t, tmp, t->numel) : TS_ENOMEM;
    for (int64_t i = 0; rc == TS_OK && i < t->numel; i++)
        (*out)[i] = (int32_t)tmp[i]; /* I32 on disk: always in range */
    free(tmp);
    return rc;
}

/* The structural and value checks of ts_partition_load, on a parsed file. */
static int load_checked(const ts_st_file_t *f, ts_partition_t *p, char *err, size_t errlen) {
    const char *fmt = ts_st_meta(f, "format");
    if (!fmt || strcmp(fmt, TS_PARTITION_FORMAT) != 0) {
        ts_set_err(err, errlen, "not a partition: metadata format is %s%.40s%s, want \"%s\"",
                   fmt ? "\"" : "", fmt ? fmt : "missing", fmt ? "\"" : "", TS_PARTITION_FORMAT);
        return TS_ECORRUPT;
    }
    static const char *const names[] = {"basis", "mean", "centroids", "assignment", "sizes"};
    for (int i = 0; i < f->n_tensors; i++) {
        int known = 0;
        for (int j = 0; j < 5; j++)
            known |= strcmp(f->tensors[i].name, names[j]) == 0;
        if (!known) {
            ts_set_err(err, errlen, "unexpected tensor '%.60s'", f->tensors[i].name);
            return TS_ECORRUPT;
        }
    }
    const ts_st_tensor_t *basis, *mean, *cent, *assign, *sizes;
    if (!(basis = want_tensor(f, "basis", TS_ST_F32, 2, err, errlen)) ||
        !(mean = want_tensor(f, "mean", TS_ST_F32, 1, err, errlen)) ||
        !(cent = want_tensor(f, "centroids", TS_ST_F32, 2, err, errlen)) ||
        !(assign = want_tensor(f, "assignment", TS_ST_I32, 1, err, errlen)) ||
        !(sizes = want_tensor(f, "sizes", TS_ST_I32, 1, err, errlen)))
        return TS_ECORRUPT;
    int64_t k = basis->shape[0], D = basis->shape[1], K = cent->shape[0], n = assign->shape[0];
    if (k < 1 || D < k || D > INT32_MAX) {
        ts_set_err(err, errlen, "basis has shape (%" PRId64 ", %" PRId64 "): need 1 <= k <= D", k,
                   D);
        return TS_ECORRUPT;
    }
    if (mean->shape[0] != D || cent->shape[1] != k || sizes->shape[0] != K || K < 1 || n < K ||
        n > INT32_MAX) {
        ts_set_err(err, errlen,
                   "inconsistent shapes: basis (%" PRId64 ", %" PRId64 "), mean (%" PRId64
                   "), centroids (%" PRId64 ", %" PRId64 "), assignment (%" PRId64
                   "), sizes (%" PRId64 ")",
                   k, D, mean->shape[0], K, cent->shape[1], n, sizes->shape[0]);
        return TS_ECORRUPT;
    }
    int64_t v;
    int rc;
    if ((rc = meta_i64(f, "experts", 1, INT32_MAX, &v, err, errlen)) != TS_OK)
        return rc;
    if (v != K) {
        ts_set_err(err, errlen,
                   "metadata experts = %" PRId64 " but there are %" PRId64 " centroids", v, K);
        return TS_ECORRUPT;
    }
    if ((rc = meta_i64(f, "n", 1, INT32_MAX, &v, err, errlen)) != TS_OK)
        return rc;
    if (v != n) {
        ts_set_err(err, errlen,
                   "metadata n = %" PRId64 " but the assignment has %" PRId64 " entries", v, n);
        return TS_ECORRUPT;
    }
    if ((rc = meta_i64(f, "dims", 1, INT32_MAX, &v, err, errlen)) != TS_OK)
        return rc;
    if (v != k) {
        ts_set_err(err, errlen, "metadata dims = %" PRId64 " but the basis has %" PRId64 " rows", v,
                   k);
        return TS_ECORRUPT;
    }
    p->K = (int)K;
    p->k = (int)k;
    p->D = (int)D;
    p->n = n;
    if ((rc = meta_i64(f, "restarts", 1, 65535, &v, err, errlen)) != TS_OK)
        return rc;
    p->restarts = (int)v;
    if ((rc = meta_i64(f, "hierarchical", 0, INT32_MAX, &v, err, errlen)) != TS_OK)
        return rc;
    p->hierarchical = (int)v;
    const char *seed = ts_st_meta(f, "seed");
    char *end;
    errno = 0;
    unsigned long long s = seed && *seed != '-' ? strtoull(seed, &end, 10) : 0;
    if (!seed || *seed == '-' || end == seed || *end || errno) {
        ts_set_err(err, errlen, "metadata 'seed' is missing or not an unsigned integer");
        return TS_ECORRUPT;
    }
    p->seed = s;
    if ((rc = meta_double(f, "inertia", &p->inertia, err, errlen)) != TS_OK ||
        (rc = meta_double(f, "explained_variance", &p->explained, err, errlen)) != TS_OK ||
        (rc = meta_string(f, "embed", p->embed, sizeof p->embed, err, errlen)) != TS_OK ||
        (rc = meta_string(f, "dataset", p->dataset, sizeof p->dataset, err, errlen)) != TS_OK)
        return rc;
    if (ts_st_meta(f, "strategy")) {
        if ((rc = meta_string(f, "strategy", p->strategy, sizeof p->strategy, err, errlen)) !=
            TS_OK)
            return rc;
    } else {
        snprintf(p->strategy, sizeof p->strategy, "kmeans");
    }

    if ((rc = load_floats(basis, &p->basis, err, errlen)) != TS_OK ||
        (rc = load_floats(mean, &p->mean, err, errlen)) != TS_OK ||
        (rc = load_floats(cent, &p->centroids, err, errlen)) != TS_OK ||
        (rc = load_ints(assign, &p->assignment)) != TS_OK ||
        (rc = load_ints(sizes, &p->sizes)) != TS_OK)
        return rc;
    int64_t *hist = calloc((size_t)K, sizeof *hist);
    if (!hist)
        return TS_ENOMEM;
    for (int64_t i = 0; i < n; i++) {
        int32_t a = p->assignment[i];
        if (a < 0 || a >= K) {
            ts_set_err(err, errlen, "assignment[%" PRId64 "] = %d is outside [0, %" PRId64 ")", i,
                       (int)a, K);
            free(hist);
            return TS_ECORRUPT;
        }
        hist[a]++;
    }
    for (int64_t j = 0; j < K; j++)
        if (hist[j] != p->sizes[j] || hist[j] == 0) {
            ts_set_err(err, errlen,
                       "sizes[%" PRId64 "] = %d but %" PRId64 " images are assigned to "
                       "cluster %" PRId64 "%s",
                       j, (int)p->sizes[j], hist[j], j, hist[j] == 0 ? " (an empty cluster)" : "");
            free(hist);
            return TS_ECORRUPT;
        }
    free(hist);
    return TS_OK;
}

int ts_partition_load(const char *path, ts_partition_t *p, char *err, size_t errlen) {
    if (!p)
        return TS_EINVAL;
    memset(p, 0, sizeof *p);
    if (!path)
        return TS_EINVAL;
    ts_st_file_t f;
    char why[400] = "";
    int rc = ts_st_read(path, &f, why, sizeof why);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "partition '%s': %s", path, why);
        return rc;
    }
    rc = load_checked(&f, p, why, sizeof why);
    if (rc == TS_OK)
        rc = hash_bytes(f.buf, f.len, p->id);
    ts_st_free(&f);
    if (rc != TS_OK) {
        if (rc == TS_ENOMEM && !*why)
            snprintf(why, sizeof why, "out of memory");
        ts_set_err(err, errlen, "partition '%s': %s", path, why);
        ts_partition_free(p);
    }
    return rc;
}

int ts_partition_members(const ts_partition_t *p, int k, int32_t **idx, int *n) {
    if (!p || !p->assignment || !idx || !n || k < 0 || k >= p->K)
        return TS_EINVAL;
    *idx = malloc((size_t)p->sizes[k] * sizeof **idx);
    if (!*idx)
        return TS_ENOMEM;
    int m = 0;
    for (int64_t i = 0; i < p->n; i++)
        if (p->assignment[i] == k)
            (*idx)[m++] = (int32_t)i;
    *n = m; /* = sizes[k]: ts_partition_load checked the histogram */
    return TS_OK;
}

int ts_partition_load_cluster(const char *path, int cluster, const char *fmnist_dir,
                              ts_dataset_t *out, char partition_id[TS_PARTITION_ID_HEX], char *err,
                              size_t errlen) {
    if (!out)
        return TS_EINVAL;
    memset(out, 0, sizeof *out);
    ts_partition_t part;
    int rc = ts_partition_load(path, &part, err, errlen);
    if (rc != TS_OK)
        return rc;
    ts_dataset_t all = {0};
    int32_t *idx = NULL;
    int n = 0;
    if (cluster < 0 || cluster >= part.K) {
        ts_set_err(err, errlen, "cluster %d: partition '%s' has clusters 0..%d", cluster, path,
                   part.K - 1);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK)
        rc = ts_fmnist_load(fmnist_dir, "train", &all, err, errlen);
    if (rc == TS_OK && all.n != part.n) {
        ts_set_err(err, errlen,
                   "partition '%s' was made from %lld images, but the train set in "
                   "%s has %d: not the data set it partitions",
                   path, (long long)part.n, fmnist_dir ? fmnist_dir : TS_FMNIST_DEFAULT_DIR, all.n);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK && (rc = ts_partition_members(&part, cluster, &idx, &n)) == TS_OK)
        rc = ts_dataset_subset(&all, idx, n, out);
    if (rc == TS_OK && partition_id)
        memcpy(partition_id, part.id, TS_PARTITION_ID_HEX);
    if (rc == TS_ENOMEM)
        ts_set_err(err, errlen, "out of memory selecting cluster %d of '%s'", cluster, path);
    free(idx);
    ts_dataset_free(&all);
    ts_partition_free(&part);
    return rc;
}

/* ---- routing helpers ------------------------------------------------------------------------- */

int ts_partition_embed(const ts_partition_t *p, const float *x, int64_t B, float *out) {
    if (!p || !p->basis || !p->mean || B < 0 || (B > 0 && (!x || !out)))
        return TS_EINVAL;
    if (B == 0)
        return TS_OK;
    double *bt = transpose_basis(p->basis, p->D, p->k);
    double *acc = malloc((size_t)p->k * sizeof *acc);
    int rc = bt && acc ? TS_OK : TS_ENOMEM;
    if (rc == TS_OK)
        project_rows(bt, p->mean, x, 0, B, p->D, p->k, out, acc);
    free(bt);
    free(acc);
    return rc;
}

int ts_partition_nearest(const ts_partition_t *p, const float *e, int64_t B, int32_t *nearest,
                         float *d2) {
    if (!p || !p->centroids || B < 0 || (B > 0 && !e))
        return TS_EINVAL;
    for (int64_t i = 0; i < B; i++) {
        const float *ei = e + (size_t)i * p->k;
        int best = 0;
        double bd = INFINITY;
        for (int j = 0; j < p->K; j++) {
            const float *c = p->centroids + (size_t)j * p->k;
            double s = 0.0;
            for (int d = 0; d < p->k; d++) {
                double t = (double)ei[d] - (double)c[d];
                s += t * t;
            }
            if (d2)
                d2[(size_t)i * p->K + j] = (float)s;
            if (s < bd) {
                bd = s;
                best = j;
            }
        }
        if (nearest)
            nearest[i] = best;
    }
    return TS_OK;
}
