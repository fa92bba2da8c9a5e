/*
 * test_answer.c — signed answers (net/answer.h), checked against libsodium directly:
 *
 *   - the claim's bytes are laid out as documented (context, request id LE, the three hashes,
 *     precision, the device class's length and bytes) and the signature is libsodium's
 *     crypto_sign_detached over exactly those bytes;
 *   - a tensor's hash is BLAKE2b-256 of dtype, ndim, each dim (int64 LE) and the data;
 *   - the request's hash changes with every input it covers (expert, a byte of x_t, a t, a label,
 *     cfg_scale, the count of t, with_variance) and not otherwise; an absent cfg_scale hashes as
 *     1.0, a false with_variance as absent, a set one as the documented layout plus 0x01;
 *   - a signature verifies for its node and claim only: another node, and each field of the
 *     claim changed in turn (request id, each hash, precision, device class), fail;
 *   - ts_answer_claim_of refuses a response without signature, device class, precision or
 *     velocity, or with a device class too long, and reads a good one into the claim it signed;
 *   - the comparison rules: bits where two CPU claims promise them, the tolerance otherwise, and
 *     "wrong beyond doubt" only past ten times it.
 */
#include "tests/testutil.h"

#include <sodium.h>
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "net/answer.h"

static ts_identity_t alice, bob;

static int setup(void **state) {
    (void)state;
    return ts_identity_generate(&alice) || ts_identity_generate(&bob);
}

/* A request over 2 samples of 1×2×2 and its tensors. */
typedef struct {
    float x[8], t[2];
    int32_t y[2];
    int64_t shape[4];
    uint8_t expert[32];
    Tessera__Tensor xt;
    Tessera__DenoiseRequest d;
} req_t;

static void req_init(req_t *r) {
    memset(r, 0, sizeof *r);
    for (int i = 0; i < 8; i++)
        r->x[i] = 0.25f * (float)i - 1.0f;
    r->t[0] = 0.3f, r->t[1] = 0.7f;
    r->y[0] = 3, r->y[1] = 10;
    r->shape[0] = 2, r->shape[1] = 1, r->shape[2] = 2, r->shape[3] = 2;
    memset(r->expert, 0xab, sizeof r->expert);
    tessera__tensor__init(&r->xt);
    r->xt.has_dtype = 1;
    r->xt.dtype = TESSERA__DTYPE__DTYPE_F32;
    r->xt.n_shape = 4;
    r->xt.shape = r->shape;
    r->xt.has_data = 1;
    r->xt.data.data = (uint8_t *)r->x;
    r->xt.data.len = sizeof r->x;
    tessera__denoise_request__init(&r->d);
    r->d.has_expert_id = 1;
    r->d.expert_id.data = r->expert;
    r->d.expert_id.len = sizeof r->expert;
    r->d.x_t = &r->xt;
    r->d.n_t = 2;
    r->d.t = r->t;
    r->d.n_class_labels = 2;
    r->d.class_labels = r->y;
    r->d.has_cfg_scale = 1;
    r->d.cfg_scale = 1.5f;
}

static void test_tensor_hash(void **state) {
    (void)state;
    req_t r;
    req_init(&r);
    uint8_t got[32], want[32], buf[2 + 4 * 8 + sizeof r.x];
    TU_CHECK_OK(ts_answer_tensor_hash(&r.xt, got));
    buf[0] = TESSERA__DTYPE__DTYPE_F32, buf[1] = 4;
    for (int d = 0; d < 4; d++)
        for (int i = 0; i < 8; i++)
            buf[2 + 8 * d + i] = (uint8_t)((uint64_t)r.shape[d] >> (8 * i));
    memcpy(buf + 2 + 32, r.x, sizeof r.x);
    crypto_generichash(want, sizeof want, buf, sizeof buf, NULL, 0);
    assert_memory_equal(got, want, 32);
    r.xt.has_dtype = 0;
    TU_CHECK_RC(ts_answer_tensor_hash(&r.xt, got), TS_EINVAL);
}

static void test_request_hash(void **state) {
    (void)state;
    req_t r;
    req_init(&r);
    uint8_t base[32], h[32];
    TU_CHECK_OK(ts_answer_request_hash(&r.d, base));
    TU_CHECK_OK(ts_answer_request_hash(&r.d, h));
    assert_memory_equal(base, h, 32); /* deterministic */
#define CHANGED(stmt, undo)                                                                        \
    do {                                                                                           \
        stmt;                                                                                      \
        TU_CHECK_OK(ts_answer_request_hash(&r.d, h));                                              \
        assert_memory_not_equal(base, h, 32);                                                      \
        undo;                                                                                      \
    } while (0)
    CHANGED(r.expert[31] ^= 1, r.expert[31] ^= 1);
    CHANGED(((uint8_t *)r.x)[17] ^= 1, ((uint8_t *)r.x)[17] ^= 1);
    CHANGED(r.t[1] = 0.71f, r.t[1] = 0.7f);
    CHANGED(r.y[0] = 4, r.y[0] = 3);
    CHANGED(r.d.cfg_scale = 1.0f, r.d.cfg_scale = 1.5f);
    CHANGED(r.d.n_t = 1, r.d.n_t = 2);
    CHANGED(r.d.has_with_variance = r.d.with_variance = 1,
            r.d.has_with_variance = r.d.with_variance = 0);
    CHANGED(r.shape[3] = 1; r.xt.data.len = 16, r.shape[3] = 2; r.xt.data.len = 32);
    TU_CHECK_OK(ts_answer_request_hash(&r.d, h));
    assert_memory_equal(base, h, 32); /* every change undone */
    /* an absent cfg_scale is 1.0, as the server reads it */
    r.d.cfg_scale = 1.0f;
    TU_CHECK_OK(ts_answer_request_hash(&r.d, base));
    r.d.has_cfg_scale = 0;
    TU_CHECK_OK(ts_answer_request_hash(&r.d, h));
    assert_memory_equal(base, h, 32);
    /* with_variance false hashes as absent (a request of an older client keeps its hash) */
    r.d.has_with_variance = 1;
    r.d.with_variance = 0;
    TU_CHECK_OK(ts_answer_request_hash(&r.d, h));
    assert_memory_equal(base, h, 32);
    /* set: the hash of the same bytes then 0x01, computed here with libsodium's streaming
     * BLAKE2b-256 over the documented layout */
    r.d.with_variance = 1;
    TU_CHECK_OK(ts_answer_request_hash(&r.d, h));
    {
        crypto_generichash_state st;
        uint8_t xh[32], want[32], b4[4];
        crypto_generichash_init(&st, NULL, 0, 32);
        crypto_generichash_update(&st, (const uint8_t *)"tessera/request/1", 17);
        crypto_generichash_update(&st, r.d.expert_id.data, 32);
        TU_CHECK_OK(ts_answer_tensor_hash(r.d.x_t, xh));
        crypto_generichash_update(&st, xh, 32);
#define PUT32(v)                                                                                   \
    do {                                                                                           \
        uint32_t u_ = (v);                                                                         \
        for (int i_ = 0; i_ < 4; i_++)                                                             \
            b4[i_] = (uint8_t)(u_ >> (8 * i_));                                                    \
        crypto_generichash_update(&st, b4, 4);                                                     \
    } while (0)
        PUT32((uint32_t)r.d.n_t);
        for (size_t i = 0; i < r.d.n_t; i++) {
            uint32_t bits;
            memcpy(&bits, &r.d.t[i], 4);
            PUT32(bits);
        }
        PUT32((uint32_t)r.d.n_class_labels);
        for (size_t i = 0; i < r.d.n_class_labels; i++)
            PUT32((uint32_t)r.d.class_labels[i]);
        float one = 1.0f; /* cfg_scale is absent here */
        uint32_t ob;
        memcpy(&ob, &one, 4);
        PUT32(ob);
#undef PUT32
        uint8_t flag = 1;
        crypto_generichash_update(&st, &flag, 1);
        crypto_generichash_final(&st, want, 32);
        assert_memory_equal(h, want, 32);
    }
    r.d.has_with_variance = r.d.with_variance = 0;
    r.d.expert_id.len = 31;
    TU_CHECK_RC(ts_answer_request_hash(&r.d, h), TS_EINVAL);
    r.d.expert_id.len = 32;
    r.d.x_t = NULL;
    TU_CHECK_RC(ts_answer_request_hash(&r.d, h), TS_EINVAL);
}

static ts_answer_claim_t claim_example(void) {
    ts_answer_claim_t c;
    memset(&c, 0, sizeof c);
    c.request_id = 0x0102030405060708ull;
    for (int i = 0; i < 32; i++) {
        c.request_hash[i] = (uint8_t)i;
        c.answer_hash[i] = (uint8_t)(100 + i);
        c.expert[i] = (uint8_t)(200 + i);
    }
    c.precision = TESSERA__DTYPE__DTYPE_BF16;
    strcpy(c.device_class, "cpu/cooperlake/fused");
    return c;
}

static void test_claim_bytes_and_signature(void **state) {
    (void)state;
    ts_answer_claim_t c = claim_example();
    uint8_t b[TS_ANSWER_CLAIM_MAX];
    size_t n = ts_answer_claim_bytes(&c, b);
    size_t cls = strlen(c.device_class);
    assert_int_equal(n, 122 + cls);
    assert_memory_equal(b, "tessera/answer/1", 16);
    for (int i = 0; i < 8; i++)
        assert_int_equal(b[16 + i], (uint8_t)(c.request_id >> (8 * i)));
    assert_memory_equal(b + 24, c.request_hash, 32);
    assert_memory_equal(b + 56, c.answer_hash, 32);
    assert_memory_equal(b + 88, c.expert, 32);
    assert_int_equal(b[120], TESSERA__DTYPE__DTYPE_BF16);
    assert_int_equal(b[121], cls);
    assert_memory_equal(b + 122, c.device_class, cls);
    uint8_t sig[TS_SIGNATURE_BYTES];
    ts_answer_sign(&c, &alice, sig);
    /* libsodium's own check over the documented bytes */
    assert_int_equal(crypto_sign_verify_detached(sig, b, n, alice.id.b), 0);
    TU_CHECK_OK(ts_answer_verify(&c, &alice.id, sig));
    TU_CHECK_RC(ts_answer_verify(&c, &bob.id, sig), TS_ECORRUPT);
    /* every field of the claim is covered */
    for (int f = 0; f < 6; f++) {
        ts_answer_claim_t d = c;
        switch (f) {
        case 0: d.request_id ^= 1; break;
        case 1: d.request_hash[5] ^= 1; break;
        case 2: d.answer_hash[31] ^= 0x80; break;
        case 3: d.expert[0] ^= 1; break;
        case 4: d.precision = TESSERA__DTYPE__DTYPE_F32; break;
        default: strcpy(d.device_class, "cpu/haswell/fused"); break;
        }
        TU_CHECK_RC(ts_answer_verify(&d, &alice.id, sig), TS_ECORRUPT);
    }
    sig[10] ^= 1;
    TU_CHECK_RC(ts_answer_verify(&c, &alice.id, sig), TS_ECORRUPT);
}

static void test_claim_of(void **state) {
    (void)state;
    req_t r;
    req_init(&r); /* its x_t stands for the velocity */
    ts_answer_claim_t signed_c = claim_example(), got;
    TU_CHECK_OK(ts_answer_tensor_hash(&r.xt, signed_c.answer_hash));
    uint8_t sig[TS_SIGNATURE_BYTES];
    ts_answer_sign(&signed_c, &alice, sig);
    Tessera__DenoiseResponse resp = TESSERA__DENOISE_RESPONSE__INIT;
    resp.velocity = &r.xt;
    resp.has_signature = 1;
    resp.signature.data = sig;
    resp.signature.len = sizeof sig;
    resp.device_class = signed_c.device_class;
    resp.has_precision = 1;
    resp.precision = TESSERA__DTYPE__DTYPE_BF16;
    TU_CHECK_OK(ts_answer_claim_of(&got, signed_c.request_id, signed_c.request_hash,
                                   signed_c.expert, &resp));
    TU_CHECK_OK(ts_answer_verify(&got, &alice.id, sig));
    ((uint8_t *)r.x)[0] ^= 1; /* the answer is not the one signed */
    TU_CHECK_OK(ts_answer_claim_of(&got, signed_c.request_id, signed_c.request_hash,
                                   signed_c.expert, &resp));
    TU_CHECK_RC(ts_answer_verify(&got, &alice.id, sig), TS_ECORRUPT);
    ((uint8_t *)r.x)[0] ^= 1;
    char longcls[TS_ANSWER_DEVICE_MAX + 2];
    memset(longcls, 'x', sizeof longcls - 1);
    longcls[sizeof longcls - 1] = '\0';
    for (int f = 0; f < 5; f++) {
        Tessera__DenoiseResponse bad = resp;
        switch (f) {
        case 0: bad.has_signature = 0; break;
        case 1: bad.signature.len = 63; break;
        case 2: bad.device_class = NULL; break;
        case 3: bad.has_precision = 0; break;
        default: bad.device_class = longcls; break;
        }
        TU_CHECK_RC(ts_answer_claim_of(&got, 1, signed_c.request_hash, signed_c.expert, &bad),
                    TS_ECORRUPT);
    }
    resp.velocity = NULL;
    TU_CHECK_RC(ts_answer_claim_of(&got, 1, signed_c.request_hash, signed_c.expert, &resp),
                TS_ECORRUPT);
}

/* The comparison rules (answer.h), against what they promise: bits where two CPU claims name one
 * class and precision, the tolerance otherwise, "far" only past ten times it. */
static void test_compare(void **state) {
    (void)state;
    ts_answer_claim_t a, b;
    memset(&a, 0, sizeof a);
    a.precision = TESSERA__DTYPE__DTYPE_F32;
    snprintf(a.device_class, sizeof a.device_class, "cpu/haswell/n2/fused");
    b = a;
    assert_true(ts_answer_exact(&a, &b));
    float x[4] = {0.5f, -2.0f, 1.0f, 3.0f}, y[4];
    const ts_answer_shape_t F = {1, 4, 0}; /* one sample of 4, no variance */
    memcpy(y, x, sizeof x);
    assert_true(ts_answer_agree_shape(x, &a, y, &b, &F, 1.0f));
    assert_false(ts_answer_far_shape(x, &a, y, &b, &F, 1.0f));
    y[2] = nextafterf(y[2], 2.0f); /* one bit: a lie where bits are promised */
    assert_false(ts_answer_agree_shape(x, &a, y, &b, &F, 1.0f));
    assert_true(ts_answer_far_shape(x, &a, y, &b, &F, 1.0f));
    /* another class: relative to max(1, max|y|) = 3 */
    snprintf(b.device_class, sizeof b.device_class, "cuda/NVIDIA H100/fused");
    assert_false(ts_answer_exact(&a, &b));
    assert_true(ts_answer_agree_shape(x, &a, y, &b, &F, 1.0f));
    assert_true(ts_answer_tolerance(&a, &b, 1.0f) == TS_ANSWER_TOL_F32);
    memcpy(y, x, sizeof x);
    y[3] += 3.0f * 5e-4f; /* 5× the tolerance: disagrees, but not beyond doubt */
    assert_false(ts_answer_agree_shape(x, &a, y, &b, &F, 1.0f));
    assert_false(ts_answer_far_shape(x, &a, y, &b, &F, 1.0f));
    y[3] = x[3] + 3.0f * 2e-3f; /* 20×: beyond doubt */
    assert_true(ts_answer_far_shape(x, &a, y, &b, &F, 1.0f));
    assert_true(fabs(ts_answer_part_diff(x, y, &F, 0) - 2e-3 * 3.0 / (double)y[3]) < 1e-6);
    /* bf16 on either side: the loose tolerance, on a CPU too (no bits promised across precisions) */
    b = a;
    b.precision = TESSERA__DTYPE__DTYPE_BF16;
    assert_false(ts_answer_exact(&a, &b));
    assert_true(ts_answer_tolerance(&a, &b, 1.0f) == TS_ANSWER_TOL_LOW);
    assert_false(ts_answer_far_shape(x, &a, y, &b, &F, 1.0f));
    /* guidance multiplies the tolerance by |s| + |1 − s|: 4 at s = 2.5, and NaN is infinitely far */
    b = a;
    snprintf(b.device_class, sizeof b.device_class, "cuda/NVIDIA H100/fused");
    assert_true(fabs(ts_answer_tolerance(&a, &b, 2.5f) - 4.0 * TS_ANSWER_TOL_F32) < 1e-12);
    assert_true(ts_answer_tolerance(&a, &b, 0.5f) == TS_ANSWER_TOL_F32);
    memcpy(y, x, sizeof x);
    y[3] = x[3] + 3.0f * 2e-3f; /* 20× the plain tolerance, 5× the guided one */
    assert_true(ts_answer_far_shape(x, &a, y, &b, &F, 1.0f));
    assert_false(ts_answer_far_shape(x, &a, y, &b, &F, 2.5f));
    y[0] = NAN;
    assert_true(isinf(ts_answer_part_diff(y, x, &F, 0)));
    assert_true(ts_answer_far_shape(y, &a, x, &b, &F, 2.5f));

    /* An answer with its variance: 2 samples of [prediction (3), variance (3)], judged apart. A
     * variance 0.01 off (100× its F32 tolerance, on its own scale of 1) beside predictions up to
     * 10 at guidance 4 is far; judged as one vector it would hide under ten times the guided
     * tolerance at the predictions' scale: 10 × 7e-4 × 10 = 0.07. */
    float u[12] = {10, -4, 2, 0.2f, -0.5f, 0.9f, 3, 1, -8, -0.1f, 0.3f, -0.7f}, w[12];
    const ts_answer_shape_t S = {2, 3, 1};
    assert_int_equal(ts_answer_shape_values(&S), 12);
    memcpy(w, u, sizeof u);
    assert_true(ts_answer_agree_shape(u, &a, w, &b, &S, 4.0f));
    assert_false(ts_answer_far_shape(u, &a, w, &b, &S, 4.0f));
    w[10] += 0.01f; /* the second sample's variance */
    assert_true(fabs(ts_answer_part_diff(u, w, &S, 1) - 0.01) < 1e-6);
    assert_true(ts_answer_part_diff(u, w, &S, 0) == 0.0);
    const ts_answer_shape_t flat = {1, 12, 0}; /* the same values judged as one vector */
    assert_false(ts_answer_far_shape(u, &a, w, &b, &flat, 4.0f)); /* not caught */
    assert_true(ts_answer_far_shape(u, &a, w, &b, &S, 4.0f));
    assert_false(ts_answer_agree_shape(u, &a, w, &b, &S, 4.0f));
    /* the prediction keeps the gain: 5e-4 of its scale 10 is within 7e-4 (guidance 4), not 1e-4 */
    memcpy(w, u, sizeof u);
    w[0] += 0.005f;
    assert_true(ts_answer_near(u, &a, w, &b, &S, 4.0f, 1.0));
    assert_false(ts_answer_near(u, &a, w, &b, &S, 1.0f, 1.0));
    /* where bits are promised, a bit of the variance is a lie */
    memcpy(w, u, sizeof u);
    w[5] = nextafterf(w[5], 2.0f);
    assert_true(ts_answer_far_shape(u, &a, w, &a, &S, 1.0f));
    const ts_answer_shape_t P = {2, 3, 0}; /* no variance: the rules of the flat vector */
    assert_true(ts_answer_part_diff(u, w, &P, 1) == 0.0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_hash),
        cmocka_unit_test(test_request_hash),
        cmocka_unit_test(test_claim_bytes_and_signature),
        cmocka_unit_test(test_claim_of),
        cmocka_unit_test(test_compare),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
