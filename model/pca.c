/*
 * pca.c — principal components of a set of images (model/pca.h): the covariance in double over
 * fixed blocks of rows, LAPACKE_dsyevd, and the projection row by row in double.
 */
#define _POSIX_C_SOURCE 200809L

#include "model/pca.h"

#include <cblas.h>
#include <inttypes.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/par.h"

#define PCA_CHUNK 512    /* rows centred in double per dsyrk call */
#define PCA_MAX_BLOCKS 8 /* partial covariances (each D×D doubles) summed in order */
#define PROJ_BLOCK 1024  /* rows per projection block */

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
    ts_par_blocks(threads, nblocks, cov_block, &job);
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
    int T = ts_par_threads(threads, nblocks);
    proj_job_t job = {transpose_basis(basis, D, k), mean, x, n, D, k, out, NULL};
    job.acc = malloc((size_t)T * k * sizeof(double));
    int rc = job.bt && job.acc ? TS_OK : TS_ENOMEM;
    if (rc == TS_OK)
        ts_par_blocks(T, nblocks, proj_block, &job);
    free((void *)job.bt);
    free(job.acc);
    return rc;
}
