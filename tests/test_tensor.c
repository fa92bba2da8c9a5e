/*
 * test_tensor.c — the tensor type and the activation arena (kernels/tensor.h).
 *
 * Covers: dtype sizes and names, owning tensors (alloc, zeroing, alignment, free), views (wrap,
 * slice along dimension 0, reshape), describe, the byte-size limits (overflow and > 2^40 bytes
 * are TS_ERANGE), ts_tensor_copy on the CPU, and the arena: TS_ALIGN alignment, mark/reset,
 * TS_ENOMEM leaving the arena unchanged, the measuring mode (capacity 0) and the peak, including
 * that a measured plan fits a real arena of exactly the measured peak.
 *
 * Not covered here: device memory on a GPU (tests/test_cuda_parity.c), the ops (test_ops_*.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/tensor.h"
#include "tests/testutil.h"

/* For contracts that only promise "an error" without naming the code. */
#define CHECK_FAILS(expr)                                                                          \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ >= 0) {                                                                            \
            print_error("%s:%d: %s returned %d, expected an error\n", __FILE__, __LINE__, #expr,   \
                        rc_);                                                                      \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

static int is_aligned(const void *p) { return ((uintptr_t)p % TS_ALIGN) == 0; }

/* ---- dtypes ---------------------------------------------------------------------------- */

static void test_dtype_sizes_and_names(void **state) {
    (void)state;
    assert_int_equal(ts_dtype_size(TS_F32), 4);
    assert_int_equal(ts_dtype_size(TS_F16), 2);
    assert_int_equal(ts_dtype_size(TS_BF16), 2);
    assert_int_equal(ts_dtype_size(TS_I32), 4);
    assert_int_equal(ts_dtype_size((ts_dtype_t)42), 0);
    assert_string_equal(ts_dtype_name(TS_F32), "F32");
    assert_string_equal(ts_dtype_name(TS_F16), "F16");
    assert_string_equal(ts_dtype_name(TS_BF16), "BF16");
    assert_string_equal(ts_dtype_name(TS_I32), "I32");
    assert_string_equal(ts_dtype_name((ts_dtype_t)42), "?");
    assert_string_equal(ts_device_name(TS_CPU), "cpu");
    assert_string_equal(ts_device_name(TS_CUDA), "cuda");
    assert_string_equal(ts_device_name((ts_device_t)7), "?");
}

/* ---- owning tensors -------------------------------------------------------------------- */

static void test_alloc_shape_zeroed_aligned(void **state) {
    (void)state;
    static const ts_dtype_t dtypes[] = {TS_F32, TS_F16, TS_BF16, TS_I32};
    static const int64_t shape[4] = {2, 3, 5, 7};
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        for (int ndim = 1; ndim <= TS_MAX_DIMS; ndim++) {
            ts_tensor_t t;
            memset(&t, 0xab, sizeof t);
            TU_CHECK_OK(ts_tensor_alloc(&t, dtypes[d], TS_CPU, ndim, shape));
            int64_t numel = 1;
            for (int i = 0; i < ndim; i++)
                numel *= shape[i];
            assert_non_null(t.data);
            assert_true(is_aligned(t.data));
            assert_int_equal(t.dtype, dtypes[d]);
            assert_int_equal(t.device, TS_CPU);
            assert_int_equal(t.ndim, ndim);
            for (int i = 0; i < ndim; i++)
                assert_int_equal(t.shape[i], shape[i]);
            assert_int_equal(t.owns, 1);
            assert_int_equal(ts_tensor_numel(&t), numel);
            assert_int_equal(ts_tensor_nbytes(&t), (size_t)numel * ts_dtype_size(dtypes[d]));
            assert_int_equal(ts_tensor_cols(&t), shape[ndim - 1]);
            assert_int_equal(ts_tensor_rows(&t), numel / shape[ndim - 1]);
            assert_int_equal(ts_tensor_check(&t), TS_OK);
            /* CPU memory comes zeroed, or all 0xff under TESSERA_POISON_ALLOC */
            const unsigned char *bytes = t.data;
            unsigned want = ts_alloc_poisoned() ? 0xffu : 0u;
            for (size_t i = 0; i < ts_tensor_nbytes(&t); i++)
                if (bytes[i] != want) {
                    print_error("alloc %s ndim %d: byte %zu is %u, expected %u\n",
                                ts_dtype_name(dtypes[d]), ndim, i, bytes[i], want);
                    fail();
                }
            /* the whole block is writable (ASan checks the bounds) */
            memset(t.data, 0x5a, ts_tensor_nbytes(&t));
            ts_tensor_free(&t);
            assert_null(t.data);
            assert_int_equal(t.owns, 0);
            ts_tensor_free(&t); /* freeing a cleared tensor is a no-op */
        }
    }
    ts_tensor_free(NULL); /* NULL-safe */
}

static void test_alloc_rejects_bad_arguments(void **state) {
    (void)state;
    ts_tensor_t t;
    CHECK_FAILS(ts_tensor_alloc(&t, TS_F32, TS_CPU, 0, TS_SHAPE(4)));
    CHECK_FAILS(ts_tensor_alloc(&t, TS_F32, TS_CPU, TS_MAX_DIMS + 1, TS_SHAPE(1, 1, 1, 1, 1)));
    CHECK_FAILS(ts_tensor_alloc(&t, TS_F32, TS_CPU, 2, TS_SHAPE(3, -1)));
    CHECK_FAILS(ts_tensor_alloc(&t, (ts_dtype_t)42, TS_CPU, 1, TS_SHAPE(4)));
    CHECK_FAILS(ts_tensor_alloc(NULL, TS_F32, TS_CPU, 1, TS_SHAPE(4)));
    CHECK_FAILS(ts_tensor_alloc(&t, TS_F32, TS_CPU, 1, NULL));
}

static void test_alloc_byte_size_limits(void **state) {
    (void)state;
    ts_tensor_t t;
    /* the element count overflows int64 */
    TU_CHECK_RC(ts_tensor_alloc(&t, TS_F32, TS_CPU, 4,
                                TS_SHAPE(INT64_C(1) << 31, INT64_C(1) << 31, INT64_C(1) << 31, 2)),
                TS_ERANGE);
    TU_CHECK_RC(ts_tensor_alloc(&t, TS_F32, TS_CPU, 2, TS_SHAPE(INT64_MAX, 2)), TS_ERANGE);
    /* the element count fits but count × 4 bytes overflows */
    TU_CHECK_RC(ts_tensor_alloc(&t, TS_F32, TS_CPU, 1, TS_SHAPE(INT64_MAX / 2)), TS_ERANGE);
    /* fits in 64 bits but exceeds 2^40 bytes: 2^39 floats = 2^41 bytes */
    TU_CHECK_RC(
        ts_tensor_alloc(&t, TS_F32, TS_CPU, 2, TS_SHAPE(INT64_C(1) << 20, INT64_C(1) << 19)),
        TS_ERANGE);
    TU_CHECK_RC(ts_tensor_alloc(&t, TS_BF16, TS_CPU, 1, TS_SHAPE((INT64_C(1) << 39) + 1)),
                TS_ERANGE);
}

/* ---- views ----------------------------------------------------------------------------- */

/* Pinned host memory: a zeroed, writable CPU tensor either way — page-locked (owns 2) exactly
 * where a CUDA device can give it, ordinary memory (owns 1) elsewhere — freed by ts_tensor_free;
 * bad shapes refused as ts_tensor_alloc refuses them. */
static void test_alloc_pinned(void **state) {
    (void)state;
    ts_tensor_t t;
    assert_int_equal(ts_tensor_alloc_pinned(&t, TS_F32, 2, TS_SHAPE(3, 1000)), TS_OK);
    assert_int_equal(t.device, TS_CPU);
    assert_int_equal(t.owns, ts_cuda_device_count(NULL, 0) > 0 ? 2 : 1);
    float *f = t.data;
    for (int i = 0; i < 3000; i++) {
        assert_true(f[i] == 0.0f);
        f[i] = (float)i;
    }
    ts_tensor_t v;
    assert_int_equal(ts_tensor_slice(&v, &t, 1, 2), TS_OK);
    assert_int_equal(v.owns, 0);
    assert_true(((float *)v.data)[0] == 1000.0f);
    ts_tensor_free(&t);
    assert_null(t.data);
    CHECK_FAILS(ts_tensor_alloc_pinned(&t, TS_F32, 2, TS_SHAPE(3, -1)));
    CHECK_FAILS(ts_tensor_alloc_pinned(&t, (ts_dtype_t)42, 1, TS_SHAPE(4)));
    CHECK_FAILS(ts_tensor_alloc_pinned(NULL, TS_F32, 1, TS_SHAPE(4)));
}

static void test_wrap_is_a_view(void **state) {
    (void)state;
    float *buf = malloc(12 * sizeof(float));
    assert_non_null(buf);
    for (int i = 0; i < 12; i++)
        buf[i] = (float)i;
    ts_tensor_t t;
    TU_CHECK_OK(ts_tensor_wrap(&t, buf, TS_F32, TS_CPU, 3, TS_SHAPE(2, 3, 2)));
    assert_ptr_equal(t.data, buf);
    assert_int_equal(t.owns, 0);
    assert_int_equal(t.ndim, 3);
    assert_int_equal(ts_tensor_numel(&t), 12);
    assert_int_equal(ts_tensor_rows(&t), 6);
    assert_int_equal(ts_tensor_cols(&t), 2);
    ts_tensor_free(&t); /* must not free buf (ASan would report the double free below) */
    assert_null(t.data);
    buf[11] = 3.0f; /* still ours */
    free(buf);
    CHECK_FAILS(ts_tensor_wrap(&t, NULL, TS_F32, TS_CPU, 1, TS_SHAPE(4)));
}

static void test_slice(void **state) {
    (void)state;
    ts_tensor_t src, s;
    TU_CHECK_OK(ts_tensor_alloc(&src, TS_F32, TS_CPU, 3, TS_SHAPE(5, 2, 3)));
    float *p = src.data;
    for (int i = 0; i < 30; i++)
        p[i] = (float)i;
    TU_CHECK_OK(ts_tensor_slice(&s, &src, 1, 3));
    assert_int_equal(s.ndim, 3);
    assert_int_equal(s.shape[0], 3);
    assert_int_equal(s.shape[1], 2);
    assert_int_equal(s.shape[2], 3);
    assert_int_equal(s.owns, 0);
    assert_int_equal(s.dtype, TS_F32);
    assert_ptr_equal(s.data, p + 6); /* one "row" along dim 0 is 2·3 floats */
    ((float *)s.data)[0] = -1.0f;    /* shares memory */
    assert_true(p[6] == -1.0f);
    ts_tensor_free(&s); /* a view: src keeps its memory */
    /* the last row, and the whole tensor */
    TU_CHECK_OK(ts_tensor_slice(&s, &src, 4, 1));
    assert_ptr_equal(s.data, p + 24);
    TU_CHECK_OK(ts_tensor_slice(&s, &src, 0, 5));
    assert_ptr_equal(s.data, p);
    /* out of range */
    CHECK_FAILS(ts_tensor_slice(&s, &src, 4, 2));
    CHECK_FAILS(ts_tensor_slice(&s, &src, -1, 2));
    CHECK_FAILS(ts_tensor_slice(&s, &src, 6, 1));
    CHECK_FAILS(ts_tensor_slice(&s, &src, 2, -1));
    ts_tensor_free(&src);

    /* a 2-byte dtype: the offset is in elements of that dtype */
    ts_tensor_t h;
    TU_CHECK_OK(ts_tensor_alloc(&h, TS_F16, TS_CPU, 2, TS_SHAPE(4, 3)));
    TU_CHECK_OK(ts_tensor_slice(&s, &h, 2, 2));
    assert_ptr_equal(s.data, (unsigned char *)h.data + 2 * 3 * 2);
    assert_int_equal(s.dtype, TS_F16);
    ts_tensor_free(&h);
}

static void test_reshape(void **state) {
    (void)state;
    ts_tensor_t src, r;
    TU_CHECK_OK(ts_tensor_alloc(&src, TS_F32, TS_CPU, 3, TS_SHAPE(2, 3, 4)));
    TU_CHECK_OK(ts_tensor_reshape(&r, &src, 2, TS_SHAPE(6, 4)));
    assert_ptr_equal(r.data, src.data);
    assert_int_equal(r.owns, 0);
    assert_int_equal(r.ndim, 2);
    assert_int_equal(r.shape[0], 6);
    assert_int_equal(r.shape[1], 4);
    TU_CHECK_OK(ts_tensor_reshape(&r, &src, 1, TS_SHAPE(24)));
    assert_int_equal(r.shape[0], 24);
    TU_CHECK_OK(ts_tensor_reshape(&r, &src, 4, TS_SHAPE(1, 2, 12, 1)));
    assert_int_equal(ts_tensor_numel(&r), 24);
    CHECK_FAILS(ts_tensor_reshape(&r, &src, 2, TS_SHAPE(5, 5)));
    CHECK_FAILS(ts_tensor_reshape(&r, &src, 2, TS_SHAPE(-6, -4)));
    CHECK_FAILS(ts_tensor_reshape(&r, &src, 0, TS_SHAPE(24)));
    CHECK_FAILS(ts_tensor_reshape(&r, &src, 5, TS_SHAPE(1, 1, 2, 3, 4)));
    ts_tensor_free(&src);
}

static void test_describe_and_helpers(void **state) {
    (void)state;
    ts_tensor_t t, u;
    char buf[64];
    TU_CHECK_OK(ts_tensor_alloc(&t, TS_F32, TS_CPU, 3, TS_SHAPE(2, 3, 4)));
    assert_ptr_equal(ts_tensor_describe(&t, buf, sizeof buf), buf);
    assert_string_equal(buf, "F32[2,3,4]@cpu");
    /* truncation keeps the string NUL-terminated */
    char small[6];
    memset(small, 'x', sizeof small);
    ts_tensor_describe(&t, small, sizeof small);
    assert_true(strlen(small) < sizeof small);
    assert_int_equal(strncmp(small, "F32[2,3,4]@cpu", strlen(small)), 0);

    TU_CHECK_OK(ts_tensor_alloc(&u, TS_BF16, TS_CPU, 1, TS_SHAPE(7)));
    ts_tensor_describe(&u, buf, sizeof buf);
    assert_string_equal(buf, "BF16[7]@cpu");
    /* a device tag is only described, never dereferenced */
    ts_tensor_t g;
    TU_CHECK_OK(ts_tensor_wrap(&g, u.data, TS_F16, TS_CUDA, 2, TS_SHAPE(1, 2)));
    ts_tensor_describe(&g, buf, sizeof buf);
    assert_string_equal(buf, "F16[1,2]@cuda");

    assert_int_equal(ts_tensor_same_shape(&t, &t), 1);
    assert_int_equal(ts_tensor_same_shape(&t, &u), 0);
    ts_tensor_t r;
    TU_CHECK_OK(ts_tensor_reshape(&r, &t, 3, TS_SHAPE(2, 4, 3)));
    assert_int_equal(ts_tensor_same_shape(&t, &r), 0); /* same count, different shape */

    CHECK_FAILS(ts_tensor_check(NULL));
    ts_tensor_t bad = t;
    bad.data = NULL;
    CHECK_FAILS(ts_tensor_check(&bad));
    bad = t;
    bad.ndim = 0;
    CHECK_FAILS(ts_tensor_check(&bad));
    bad = t;
    bad.shape[1] = 0;
    CHECK_FAILS(ts_tensor_check(&bad));
    bad = t;
    bad.dtype = (ts_dtype_t)9;
    CHECK_FAILS(ts_tensor_check(&bad));
    ts_tensor_free(&t);
    ts_tensor_free(&u);
}

/* ---- copy ------------------------------------------------------------------------------ */

static void test_copy_cpu_to_cpu(void **state) {
    (void)state;
    ts_tensor_t a, b, c, h;
    TU_CHECK_OK(ts_tensor_alloc(&a, TS_F32, TS_CPU, 2, TS_SHAPE(3, 5)));
    TU_CHECK_OK(ts_tensor_alloc(&b, TS_F32, TS_CPU, 2, TS_SHAPE(3, 5)));
    TU_CHECK_OK(ts_tensor_alloc(&c, TS_F32, TS_CPU, 1, TS_SHAPE(15)));
    TU_CHECK_OK(ts_tensor_alloc(&h, TS_F16, TS_CPU, 2, TS_SHAPE(3, 5)));
    float *pa = a.data, *pb = b.data, *pc = c.data;
    for (int i = 0; i < 15; i++)
        pa[i] = (float)i * 0.5f - 3.0f;
    TU_CHECK_OK(ts_tensor_copy(&b, &a));
    assert_memory_equal(pb, pa, 15 * sizeof(float));
    /* same dtype and element count is enough; the shape may differ */
    TU_CHECK_OK(ts_tensor_copy(&c, &a));
    assert_memory_equal(pc, pa, 15 * sizeof(float));
    /* dtype and count mismatches are refused and write nothing */
    memset(h.data, 0, ts_tensor_nbytes(&h));
    CHECK_FAILS(ts_tensor_copy(&h, &a));
    for (size_t i = 0; i < ts_tensor_nbytes(&h); i++)
        assert_int_equal(((unsigned char *)h.data)[i], 0);
    ts_tensor_t part;
    TU_CHECK_OK(ts_tensor_slice(&part, &a, 0, 2));
    pb[0] = 123.0f;
    CHECK_FAILS(ts_tensor_copy(&b, &part));
    assert_true(pb[0] == 123.0f);
    CHECK_FAILS(ts_tensor_copy(NULL, &a));
    CHECK_FAILS(ts_tensor_copy(&b, NULL));
    ts_tensor_free(&a);
    ts_tensor_free(&b);
    ts_tensor_free(&c);
    ts_tensor_free(&h);
}

/* ---- arena ----------------------------------------------------------------------------- */

static void test_arena_alignment_and_views(void **state) {
    (void)state;
    ts_arena_t a;
    TU_CHECK_OK(ts_arena_init(&a, TS_CPU, 4096));
    assert_non_null(a.base);
    assert_true(is_aligned(a.base));
    assert_int_equal(a.cap, 4096);
    assert_int_equal(a.used, 0);
    ts_tensor_t t1, t2, t3;
    TU_CHECK_OK(ts_arena_tensor(&a, &t1, TS_F32, 1, TS_SHAPE(3)));    /* 12 bytes */
    TU_CHECK_OK(ts_arena_tensor(&a, &t2, TS_F16, 2, TS_SHAPE(3, 3))); /* 18 bytes */
    TU_CHECK_OK(ts_arena_tensor(&a, &t3, TS_F32, 3, TS_SHAPE(2, 2, 5)));
    const ts_tensor_t *ts[3] = {&t1, &t2, &t3};
    for (int i = 0; i < 3; i++) {
        assert_non_null(ts[i]->data);
        if (!is_aligned(ts[i]->data)) {
            print_error("arena tensor %d at %p is not %d-byte aligned\n", i, ts[i]->data, TS_ALIGN);
            fail();
        }
        assert_int_equal(ts[i]->owns, 0);
        assert_int_equal(ts[i]->device, TS_CPU);
        unsigned char *lo = ts[i]->data, *hi = lo + ts_tensor_nbytes(ts[i]);
        assert_true(lo >= a.base && hi <= a.base + a.cap);
        memset(lo, i + 1, ts_tensor_nbytes(ts[i])); /* writable */
    }
    /* no overlap, handed out in order */
    assert_true((unsigned char *)t2.data >= (unsigned char *)t1.data + 12);
    assert_true((unsigned char *)t3.data >= (unsigned char *)t2.data + 18);
    assert_int_equal(((unsigned char *)t1.data)[11], 1);
    assert_int_equal(((unsigned char *)t2.data)[17], 2);
    assert_true(t3.ndim == 3 && t3.shape[0] == 2 && t3.shape[1] == 2 && t3.shape[2] == 5);
    assert_true(a.used >= 12 + 18 + 80);
    assert_true(a.used <= a.cap);
    assert_true(a.peak >= a.used);
    ts_tensor_free(&t1); /* a view: the arena keeps its memory */
    ts_arena_free(&a);
    assert_null(a.base);
}

static void test_arena_mark_reset_peak(void **state) {
    (void)state;
    ts_arena_t a;
    TU_CHECK_OK(ts_arena_init(&a, TS_CPU, 8192));
    ts_tensor_t keep, x, y, x2;
    TU_CHECK_OK(ts_arena_tensor(&a, &keep, TS_F32, 1, TS_SHAPE(10)));
    size_t m = ts_arena_mark(&a);
    assert_int_equal(m, a.used);
    TU_CHECK_OK(ts_arena_tensor(&a, &x, TS_F32, 2, TS_SHAPE(10, 10)));
    TU_CHECK_OK(ts_arena_tensor(&a, &y, TS_F32, 2, TS_SHAPE(5, 5)));
    size_t high = a.used;
    assert_true(high >= m + 400 + 100);
    assert_int_equal(a.peak, high);
    ts_arena_reset(&a, m);
    assert_int_equal(a.used, m);
    assert_int_equal(a.peak, high); /* the high-water mark survives a reset */
    /* the memory after the mark is handed out again, starting where x started */
    TU_CHECK_OK(ts_arena_tensor(&a, &x2, TS_F32, 1, TS_SHAPE(7)));
    assert_ptr_equal(x2.data, x.data);
    assert_int_equal(a.peak, high); /* smaller than before: peak unchanged */
    ts_arena_reset(&a, 0);
    assert_int_equal(a.used, 0);
    TU_CHECK_OK(ts_arena_tensor(&a, &x2, TS_F32, 1, TS_SHAPE(1)));
    assert_ptr_equal(x2.data, keep.data);
    ts_arena_free(&a);
}

static void test_arena_full_is_enomem_and_unchanged(void **state) {
    (void)state;
    ts_arena_t a;
    TU_CHECK_OK(ts_arena_init(&a, TS_CPU, 1024));
    ts_tensor_t t;
    TU_CHECK_OK(ts_arena_tensor(&a, &t, TS_F32, 1, TS_SHAPE(100))); /* 400 bytes */
    ts_arena_t before = a;
    ts_tensor_t big;
    TU_CHECK_RC(ts_arena_tensor(&a, &big, TS_F32, 1, TS_SHAPE(200)), TS_ENOMEM); /* 800 > rest */
    assert_memory_equal(&a, &before, sizeof a);
    CHECK_FAILS(ts_arena_tensor(&a, &big, TS_F32, 1, TS_SHAPE(INT64_C(1) << 45)));
    assert_memory_equal(&a, &before, sizeof a);
    /* what still fits is handed out, up to exactly the capacity */
    size_t start = (a.used + TS_ALIGN - 1) / TS_ALIGN * TS_ALIGN;
    int64_t rest = (int64_t)((a.cap - start) / sizeof(float));
    TU_CHECK_OK(ts_arena_tensor(&a, &big, TS_F32, 1, TS_SHAPE(rest)));
    assert_true((unsigned char *)big.data + rest * 4 <= a.base + a.cap);
    before = a;
    TU_CHECK_RC(ts_arena_tensor(&a, &big, TS_F32, 1, TS_SHAPE(1)), TS_ENOMEM);
    assert_memory_equal(&a, &before, sizeof a);
    ts_arena_free(&a);
}

/* A fixed allocation plan, as a model would run it: returns the first error. */
static int run_plan(ts_arena_t *a, ts_tensor_t out[6]) {
    static const int64_t sizes[6] = {3, 100, 1, 64, 17, 250};
    static const ts_dtype_t dtypes[6] = {TS_F32, TS_F16, TS_BF16, TS_F32, TS_I32, TS_F16};
    for (int i = 0; i < 6; i++) {
        if (i == 4)
            ts_arena_reset(a, 0); /* a second phase reusing the memory */
        int rc = ts_arena_tensor(a, &out[i], dtypes[i], 2, TS_SHAPE(sizes[i], 3));
        if (rc != TS_OK)
            return rc;
    }
    return TS_OK;
}

static void test_arena_measuring_mode(void **state) {
    (void)state;
    ts_arena_t meas;
    TU_CHECK_OK(ts_arena_init(&meas, TS_CPU, 0));
    assert_null(meas.base);
    assert_int_equal(meas.cap, 0);
    ts_tensor_t ts[6];
    TU_CHECK_OK(run_plan(&meas, ts));
    for (int i = 0; i < 6; i++)
        assert_null(ts[i].data);
    assert_int_equal(ts[5].shape[0], 250);
    assert_int_equal(ts[5].shape[1], 3);
    /* phase one holds 3·3·4 + 100·3·2 + 1·3·2 + 64·3·4 bytes before its reset, phase two
     * 17·3·4 + 250·3·2; the peak is the larger plus at most the alignment padding */
    size_t phase1 = 36 + 600 + 6 + 768, phase2 = 204 + 1500;
    size_t need = phase1 > phase2 ? phase1 : phase2;
    if (meas.peak < need || meas.peak > need + 4 * TS_ALIGN) {
        print_error("measured peak %zu, expected between %zu and %zu\n", meas.peak, need,
                    need + 4 * (size_t)TS_ALIGN);
        fail();
    }
    assert_true(meas.used >= phase2 && meas.used <= phase2 + 2 * TS_ALIGN);

    /* the measured peak is enough for a real arena running the same plan */
    ts_arena_t real;
    TU_CHECK_OK(ts_arena_init(&real, TS_CPU, meas.peak));
    ts_tensor_t rt[6];
    TU_CHECK_OK(run_plan(&real, rt));
    for (int i = 0; i < 6; i++) {
        assert_non_null(rt[i].data);
        assert_true(is_aligned(rt[i].data));
        unsigned char *hi = (unsigned char *)rt[i].data + ts_tensor_nbytes(&rt[i]);
        assert_true(hi <= real.base + real.cap);
        memset(rt[i].data, 0x77, ts_tensor_nbytes(&rt[i]));
    }
    assert_int_equal(real.peak, meas.peak);
    ts_arena_free(&real);
    ts_arena_free(&meas);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_sizes_and_names),
        cmocka_unit_test(test_alloc_shape_zeroed_aligned),
        cmocka_unit_test(test_alloc_rejects_bad_arguments),
        cmocka_unit_test(test_alloc_byte_size_limits),
        cmocka_unit_test(test_alloc_pinned),
        cmocka_unit_test(test_wrap_is_a_view),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_reshape),
        cmocka_unit_test(test_describe_and_helpers),
        cmocka_unit_test(test_copy_cpu_to_cpu),
        cmocka_unit_test(test_arena_alignment_and_views),
        cmocka_unit_test(test_arena_mark_reset_peak),
        cmocka_unit_test(test_arena_full_is_enomem_and_unchanged),
        cmocka_unit_test(test_arena_measuring_mode),
    };
    return cmocka_run_group_tests_name("tensor", tests, NULL, NULL);
}
