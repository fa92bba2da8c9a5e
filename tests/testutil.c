/*
 * testutil.c — the helpers of tests/testutil.h. See there for what each one promises.
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/math.h"
#include "kernels/ref.h"
#include "model/fmnist.h"

/* ---- a CPU engine ------------------------------------------------------------------------ */

int tu_engine_init_cpu(ts_engine_t *e) {
    ts_engine_opts_t opts = {.device = TS_CPU, .threads = 2, .gpu = 0};
    return ts_engine_init(e, &opts);
}

int tu_bf16_or_skip(const char *prog) {
    ts_engine_t e;
    char why[256] = "";
    if (tu_engine_init_cpu(&e) != TS_OK)
        return 1;
    int rc = ts_engine_precision_check(&e, TS_PREC_BF16, why, sizeof why);
    ts_engine_free(&e);
    if (rc == TS_OK)
        return 0;
    printf("%s: SKIPPED: %s\n", prog, why);
    return 77;
}

void tu_quarters_dataset(struct ts_dataset *d, int n) {
    d->n = n, d->channels = 1, d->height = 8, d->width = 8, d->num_classes = 3;
    d->images = malloc((size_t)n * 64 * sizeof(float));
    d->labels = malloc((size_t)n * sizeof(int32_t));
    assert_non_null(d->images);
    assert_non_null(d->labels);
    for (int i = 0; i < n; i++) {
        int k = i % 3;
        d->labels[i] = k;
        for (int p = 0; p < 64; p++) {
            int quarter = (p / 8 < 4 ? 0 : 2) + (p % 8 < 4 ? 0 : 1);
            float noise = 0.1f * ts_rng_normal_at(99, (uint64_t)(i * 64 + p));
            d->images[i * 64 + p] = (quarter == k ? 0.8f : -0.8f) + noise;
        }
    }
}

int tu_setup_cpu_engine(void **state) {
    ts_engine_t *e = calloc(1, sizeof *e);
    if (!e)
        return -1;
    if (tu_engine_init_cpu(e) != TS_OK) {
        free(e);
        return -1;
    }
    *state = e;
    return 0;
}

int tu_teardown_cpu_engine(void **state) {
    ts_engine_t *e = *state;
    ts_engine_free(e);
    free(e);
    return 0;
}

/* ---- deterministic random numbers --------------------------------------------------------- */

uint64_t tu_rng_next(tu_rng_t *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float tu_rng_uniform(tu_rng_t *r, float lo, float hi) {
    double u = (double)(tu_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

/* ---- F32 tensors on the CPU --------------------------------------------------------------- */

float *tu_f32(const ts_tensor_t *t) { return (float *)t->data; }

void tu_alloc_f32(ts_tensor_t *t, int ndim, const int64_t *shape) {
    int rc = ts_tensor_alloc(t, TS_F32, TS_CPU, ndim, shape);
    if (rc != TS_OK) {
        print_error("ts_tensor_alloc failed: %s\n", ts_strerror(rc));
        fail();
    }
}

void tu_alloc_like(ts_tensor_t *t, const ts_tensor_t *like) {
    tu_alloc_f32(t, like->ndim, like->shape);
}

void tu_alloc_f32_batch(ts_tensor_t *t, int64_t batch, int64_t rows, int64_t cols) {
    if (batch > 0)
        tu_alloc_f32(t, 3, TS_SHAPE(batch, rows, cols));
    else
        tu_alloc_f32(t, 2, TS_SHAPE(rows, cols));
}

void tu_fill_uniform(tu_rng_t *r, ts_tensor_t *t, float lo, float hi) {
    int64_t n = ts_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        tu_f32(t)[i] = tu_rng_uniform(r, lo, hi);
}

float *tu_floats(int64_t n) {
    float *p = malloc(n > 0 ? (size_t)n * sizeof(float) : 1);
    assert_non_null(p);
    return p;
}

float *tu_host_copy(const ts_tensor_t *t) {
    size_t bytes = ts_tensor_nbytes(t);
    float *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    memcpy(p, t->data, bytes);
    return p;
}

void tu_free_tensors(ts_tensor_t *const *ts, size_t n) {
    for (size_t i = 0; i < n; i++)
        ts_tensor_free(ts[i]);
}

/* ---- comparisons -------------------------------------------------------------------------- */

/* Fails the test with "<what>: <why>", what from (fmt, ap), why from (why_fmt, ...). */
static void fail_check(const char *fmt, va_list ap, const char *why_fmt, ...) TU_PRINTF(3, 4);
static void fail_check(const char *fmt, va_list ap, const char *why_fmt, ...) {
    char what[256], why[512];
    vsnprintf(what, sizeof what, fmt, ap);
    va_list why_ap;
    va_start(why_ap, why_fmt);
    vsnprintf(why, sizeof why, why_fmt, why_ap);
    va_end(why_ap);
    print_error("%s: %s\n", what, why);
    fail();
}

void tu_check_close(const float *got, const float *want, int64_t n, double atol, double rtol,
                    const char *fmt, ...) {
    int64_t worst = -1;
    double worst_excess = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        if (isnan(w) && isnan(g))
            continue;
        double err = fabs(g - w);
        double lim = atol + rtol * fabs(w);
        if (g == w)
            continue;
        if (isnan(err) || err > lim) {
            double excess = isnan(err) ? INFINITY : err / (lim > 0 ? lim : 1e-300);
            if (worst < 0 || excess > worst_excess) {
                worst = i;
                worst_excess = excess;
            }
        }
    }
    if (worst < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    fail_check(fmt, ap,
               "element %lld of %lld: got %.9g, expected %.9g (|diff| %.3g > atol %.3g + rtol "
               "%.3g·|expected|); max |diff| %.3g",
               (long long)worst, (long long)n, got[worst], want[worst],
               fabs((double)got[worst] - want[worst]), atol, rtol,
               ts_ref_max_abs_diff(got, want, n));
    va_end(ap);
}

void tu_check_scalar(double got, double want, double tol, const char *fmt, ...) {
    if (fabs(got - want) <= tol)
        return;
    va_list ap;
    va_start(ap, fmt);
    fail_check(fmt, ap, "got %.10g, expected %.10g (|diff| %.3g > tol %.3g)", got, want,
               fabs(got - want), tol);
    va_end(ap);
}

/* ---- files and temporary folders ---------------------------------------------------------- */

/* path = $TMPDIR/<prefix>_XXXXXX (/tmp when TMPDIR is unset or empty); 0, or -1 if too long. */
static int temp_template(char *path, size_t len, const char *prefix) {
    const char *base = getenv("TMPDIR");
    int n = snprintf(path, len, "%s/%s_XXXXXX", base && *base ? base : "/tmp", prefix);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

int tu_make_temp_dir(char *dir, size_t len, const char *prefix) {
    if (temp_template(dir, len, prefix) != 0)
        return -1;
    return mkdtemp(dir) ? 0 : -1;
}

void tu_make_temp_file(char *path, size_t len, const char *prefix) {
    assert_int_equal(temp_template(path, len, prefix), 0);
    int fd = mkstemp(path);
    if (fd < 0) {
        print_error("cannot create a temporary file %s\n", path);
        fail();
    }
    close(fd);
}

void tu_remove_temp_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        char path[1024];
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

int tu_count_files(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

/* The current test's folder (tu_setup_temp_dir), and tu_temp_path's buffer. */
static char temp_dir[256];
static char temp_path[512];

int tu_setup_temp_dir(void **state) {
    (void)state;
    return tu_make_temp_dir(temp_dir, sizeof temp_dir, "tessera_test");
}

int tu_teardown_temp_dir(void **state) {
    (void)state;
    tu_remove_temp_dir(temp_dir);
    temp_dir[0] = '\0';
    return 0;
}

const char *tu_temp_dir(void) { return temp_dir; }

const char *tu_temp_path(const char *name) {
    snprintf(temp_path, sizeof temp_path, "%s/%s", temp_dir, name);
    return temp_path;
}

unsigned char *tu_read_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        print_error("cannot open %s\n", path);
        fail();
    }
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    assert_true(n >= 0);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

void tu_write_file(const char *path, const void *data, size_t len) {
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        print_error("cannot create %s\n", path);
        fail();
    }
    if (len)
        assert_int_equal(fwrite(data, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

/* ---- the composed attention at 16 bits, by hand ------------------------------------------ */

static double rnd_lp(ts_dtype_t lp, float x) {
    return lp == TS_F16 ? (double)ts_f16_to_f32(ts_f32_to_f16(x))
                        : (double)ts_bf16_to_f32(ts_f32_to_bf16(x));
}

void tu_attention_lp_ref(ts_dtype_t lp, const float *qkv, const float *att, int64_t B, int64_t T,
                         int64_t C, int64_t H, double *ra, double *ro) {
    int64_t hd = C / H, ld = 3 * C;
    double scale = 1.0 / sqrt((double)hd);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                double *row = ra + ((b * H + h) * T + i) * T, mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < T; j++) {
                    double acc = 0.0;
                    for (int64_t k = 0; k < hd; k++)
                        acc += rnd_lp(lp, qkv[(b * T + i) * ld + h * hd + k]) *
                               rnd_lp(lp, qkv[(b * T + j) * ld + C + h * hd + k]);
                    row[j] = scale * acc;
                    mx = row[j] > mx ? row[j] : mx;
                }
                for (int64_t j = 0; j < T; j++)
                    sum += row[j] = exp(row[j] - mx);
                for (int64_t j = 0; j < T; j++)
                    row[j] /= sum;
                const float *a = att + ((b * H + h) * T + i) * T;
                for (int64_t k = 0; k < hd; k++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < T; j++)
                        acc += rnd_lp(lp, a[j]) *
                               rnd_lp(lp, qkv[(b * T + j) * ld + 2 * C + h * hd + k]);
                    ro[(b * T + i) * C + h * hd + k] = acc;
                }
            }
}

double tu_nmse(const float *got, const double *want, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    return den > 0.0 ? num / den : num;
}
