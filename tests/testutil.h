/*
 * testutil.h — helpers shared by the cmocka tests in tests/ (linked into every test executable by
 * ts_add_test in tests/CMakeLists.txt).
 *
 * What is here: return-code checks that name the failing call, a CPU engine fixture, a
 * deterministic random source (splitmix64) with F32 tensor allocation and fills, tolerance
 * comparisons of float arrays that name the worst element, and private temporary folders with
 * whole-file reads and writes. Every helper that can fail reports through cmocka (print_error,
 * then fail()), so they may only be called inside a test, except the ones returning int, which
 * are meant for setup functions.
 *
 * What is not: anything specific to one module. A helper used by one test file stays in that
 * file; one that two files would write again belongs here.
 */
#ifndef TS_TESTUTIL_H
#define TS_TESTUTIL_H

/* cmocka.h needs these first */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/engine.h"
#include "kernels/tensor.h"

#if defined(__GNUC__)
#define TU_PRINTF(fmt_idx, first_arg) __attribute__((format(printf, fmt_idx, first_arg)))
#else
#define TU_PRINTF(fmt_idx, first_arg)
#endif

/* ---- checked return codes ---------------------------------------------------------------- */

/* Fails the test unless expr returns want, naming the call, the file and line, and both codes. */
#define TU_CHECK_RC(expr, want)                                                                    \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != (want)) {                                                                       \
            print_error("%s:%d: %s returned %d (%s), expected %d (%s)\n", __FILE__, __LINE__,      \
                        #expr, rc_, ts_strerror(rc_), (want), ts_strerror(want));                  \
            fail();                                                                                \
        }                                                                                          \
    } while (0)
#define TU_CHECK_OK(expr) TU_CHECK_RC(expr, TS_OK)

/* TU_CHECK_RC that also prints msg, the error sentence the call wrote. */
#define TU_CHECK_RC_MSG(expr, want, msg)                                                           \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != (want)) {                                                                       \
            print_error("%s:%d: %s returned %d (%s), expected %d (%s); err: %s\n", __FILE__,       \
                        __LINE__, #expr, rc_, ts_strerror(rc_), (want), ts_strerror(want), (msg)); \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

/* Fails unless the message haystack contains needle, printing both (a user must be told what
 * went wrong, in words the test can find). */
#define TU_CHECK_CONTAINS(haystack, needle)                                                        \
    do {                                                                                           \
        if (!strstr((haystack), (needle))) {                                                       \
            print_error("%s:%d: message \"%s\" does not mention \"%s\"\n", __FILE__, __LINE__,     \
                        (haystack), (needle));                                                     \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

/* ---- a CPU engine ------------------------------------------------------------------------ */

/* Initialises *e as a CPU engine with 2 worker threads (the tests' standard: an odd row count
 * then splits unevenly). Returns ts_engine_init's code. */
int tu_engine_init_cpu(ts_engine_t *e);

/* cmocka group setup/teardown: *state is a malloc'd CPU engine (tu_engine_init_cpu), freed by
 * the teardown. */
int tu_setup_cpu_engine(void **state);
int tu_teardown_cpu_engine(void **state);
/* 0 where the CPU engine can run bf16 (ts_engine_precision_check); else prints "PROG: SKIPPED:"
 * and the reason, and returns 77 (ctest's skip) — or 1 when no engine starts. */
int tu_bf16_or_skip(const char *prog);

/* ---- the composed attention at 16 bits, by hand ------------------------------------------ */

/* A naive reference of ts_attention_forward_bf16 / _f16 (lp TS_BF16 or TS_F16) in double:
 * qkv (B, T, 3C) on the host, H heads. ra (B, H, T, T) = the softmax of scale · rnd(q)·rnd(k)ᵀ;
 * ro (B, T, C) = rnd(att)·rnd(v) with att the weights the op under test wrote (B, H, T, T),
 * so that a weight whose rounding tips the other way between two summation orders does not
 * count against it. rnd: kernels/math.h's rounding to lp. */
void tu_attention_lp_ref(ts_dtype_t lp, const float *qkv, const float *att, int64_t B, int64_t T,
                         int64_t C, int64_t H, double *ra, double *ro);
/* Σ (got − want)² / Σ want² over n (the sum of squares itself when want is all zero). */
double tu_nmse(const float *got, const double *want, int64_t n);

/* ---- a synthetic data set ------------------------------------------------------------------ */

struct ts_dataset;
/* n images of 8×8×1 in 3 classes (model/fmnist.h's ts_dataset_t; free with ts_dataset_free):
 * image i is of class i mod 3, whose quarter of the image is bright (0.8) on a dark background
 * (−0.8), plus N(0, 0.1²) noise (stream 99). Fails the test when out of memory. */
void tu_quarters_dataset(struct ts_dataset *d, int n);

/* ---- deterministic random numbers --------------------------------------------------------- */

/* splitmix64: tu_rng_t r = {seed}; the same seed gives the same sequence on every machine. */
typedef struct {
    uint64_t s;
} tu_rng_t;

uint64_t tu_rng_next(tu_rng_t *r);
/* Uniform in [lo, hi), from the top 53 bits of the next draw. */
float tu_rng_uniform(tu_rng_t *r, float lo, float hi);

/* ---- F32 tensors on the CPU --------------------------------------------------------------- */

/* t's data as floats (t must be an F32 tensor in host memory). */
float *tu_f32(const ts_tensor_t *t);

/* An owning, zeroed F32 CPU tensor of the given shape; fails the test if it cannot be made.
 * The caller frees it with ts_tensor_free. */
void tu_alloc_f32(ts_tensor_t *t, int ndim, const int64_t *shape);
/* The same, with the shape of like. */
void tu_alloc_like(ts_tensor_t *t, const ts_tensor_t *like);
/* The same, (batch, rows, cols), or (rows, cols) when batch is 0 (a matmul operand). */
void tu_alloc_f32_batch(ts_tensor_t *t, int64_t batch, int64_t rows, int64_t cols);

/* Every element of the F32 tensor t drawn uniform in [lo, hi) from r, in order. */
void tu_fill_uniform(tu_rng_t *r, ts_tensor_t *t, float lo, float hi);

/* A malloc'd array of n floats (uninitialised); never NULL. The caller frees it. */
float *tu_floats(int64_t n);
/* A malloc'd copy of t's data; never NULL. The caller frees it. */
float *tu_host_copy(const ts_tensor_t *t);

/* ts_tensor_free on each of n tensors. */
void tu_free_tensors(ts_tensor_t *const *ts, size_t n);
/* TU_FREE_TENSORS(&a, &b, &c): the same over a list. */
#define TU_FREE_TENSORS(...)                                                                       \
    tu_free_tensors((ts_tensor_t *const[]){__VA_ARGS__},                                           \
                    sizeof((ts_tensor_t *const[]){__VA_ARGS__}) / sizeof(ts_tensor_t *))

/* ---- comparisons -------------------------------------------------------------------------- */

/* Fails the test unless every |got[i] − want[i]| ≤ atol + rtol·|want[i]| (equal values, and a
 * NaN where a NaN is wanted, pass; any other NaN fails). The message starts with the printf-style
 * description, then names the worst element and the largest |difference|. */
void tu_check_close(const float *got, const float *want, int64_t n, double atol, double rtol,
                    const char *fmt, ...) TU_PRINTF(6, 7);

/* Fails the test unless |got − want| ≤ tol (a NaN fails), with a printf-style description. */
void tu_check_scalar(double got, double want, double tol, const char *fmt, ...) TU_PRINTF(4, 5);

/* ---- files and temporary folders ---------------------------------------------------------- */

/* Creates a fresh private folder $TMPDIR/<prefix>_XXXXXX (/tmp when TMPDIR is unset or empty) and
 * writes its path to dir[0..len). Returns 0, or -1 when it could not be made (for setup
 * functions, which report failure by returning non-zero). */
int tu_make_temp_dir(char *dir, size_t len, const char *prefix);
/* Creates a fresh empty file $TMPDIR/<prefix>_XXXXXX the same way and writes its path to
 * path[0..len); fails the test if it cannot. The caller unlinks it. */
void tu_make_temp_file(char *path, size_t len, const char *prefix);
/* Removes the files in dir and then dir itself (the tests make no subfolders). Quiet about
 * anything already gone. */
void tu_remove_temp_dir(const char *dir);
/* The number of entries in dir other than "." and "..". */
int tu_count_files(const char *dir);

/* A fresh temporary folder per test, for tests that work in one folder: tu_setup_temp_dir and
 * tu_teardown_temp_dir are a cmocka setup and teardown (state unused); in between,
 * tu_temp_dir() is the folder and tu_temp_path(name) the path of name in it, in a static buffer
 * that the next call overwrites. */
int tu_setup_temp_dir(void **state);
int tu_teardown_temp_dir(void **state);
const char *tu_temp_dir(void);
const char *tu_temp_path(const char *name);

/* The whole file at path in a malloc'd buffer (one spare byte past the end); *len its size. The
 * caller frees it. Fails the test if the file cannot be read. */
unsigned char *tu_read_file(const char *path, size_t *len);
/* Writes data[0..len) to path, replacing it. Fails the test on any error. */
void tu_write_file(const char *path, const void *data, size_t len);

#endif
