/*
 * answer.c — signed answers (answer.h): the hashes, the claim's bytes, signing and checking.
 */
#define _POSIX_C_SOURCE 200809L

#include "net/answer.h"

#include <math.h>
#include <sodium.h>
#include <string.h>

#include "base/error.h"

static void put_u32(crypto_generichash_state *h, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    crypto_generichash_update(h, b, sizeof b);
}

static void put_u64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

int ts_answer_tensor_hash(const Tessera__Tensor *t, uint8_t out[TS_ANSWER_HASH_BYTES]) {
    if (!t || !t->has_dtype || t->n_shape > 4)
        return TS_EINVAL;
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, TS_ANSWER_HASH_BYTES);
    uint8_t head[2] = {(uint8_t)t->dtype, (uint8_t)t->n_shape};
    crypto_generichash_update(&h, head, sizeof head);
    for (size_t i = 0; i < t->n_shape; i++) {
        uint8_t d[8];
        put_u64(d, (uint64_t)t->shape[i]);
        crypto_generichash_update(&h, d, sizeof d);
    }
    crypto_generichash_update(&h, t->data.data, t->data.len);
    crypto_generichash_final(&h, out, TS_ANSWER_HASH_BYTES);
    return TS_OK;
}

int ts_answer_request_hash(const Tessera__DenoiseRequest *d, uint8_t out[TS_ANSWER_HASH_BYTES]) {
    uint8_t xh[TS_ANSWER_HASH_BYTES];
    if (!d || !d->has_expert_id || d->expert_id.len != TS_ANSWER_HASH_BYTES ||
        ts_answer_tensor_hash(d->x_t, xh) != TS_OK)
        return TS_EINVAL;
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, TS_ANSWER_HASH_BYTES);
    crypto_generichash_update(&h, (const uint8_t *)TS_ANSWER_REQ_CONTEXT,
                              sizeof TS_ANSWER_REQ_CONTEXT - 1);
    crypto_generichash_update(&h, d->expert_id.data, d->expert_id.len);
    crypto_generichash_update(&h, xh, sizeof xh);
    put_u32(&h, (uint32_t)d->n_t);
    for (size_t i = 0; i < d->n_t; i++)
        put_u32(&h, f32_bits(d->t[i]));
    put_u32(&h, (uint32_t)d->n_class_labels);
    for (size_t i = 0; i < d->n_class_labels; i++)
        put_u32(&h, (uint32_t)d->class_labels[i]);
    put_u32(&h, f32_bits(d->has_cfg_scale ? d->cfg_scale : 1.0f));
    if (d->has_with_variance && d->with_variance) { /* absent or false: the hash as before */
        uint8_t one = 1;
        crypto_generichash_update(&h, &one, 1);
    }
    crypto_generichash_final(&h, out, TS_ANSWER_HASH_BYTES);
    return TS_OK;
}

size_t ts_answer_claim_bytes(const ts_answer_claim_t *c, uint8_t buf[TS_ANSWER_CLAIM_MAX]) {
    size_t n = strnlen(c->device_class, TS_ANSWER_DEVICE_MAX);
    memcpy(buf, TS_ANSWER_SIG_CONTEXT, 16);
    put_u64(buf + 16, c->request_id);
    memcpy(buf + 24, c->request_hash, TS_ANSWER_HASH_BYTES);
    memcpy(buf + 56, c->answer_hash, TS_ANSWER_HASH_BYTES);
    memcpy(buf + 88, c->expert, TS_ANSWER_HASH_BYTES);
    buf[120] = c->precision;
    buf[121] = (uint8_t)n;
    memcpy(buf + 122, c->device_class, n);
    return 122 + n;
}

void ts_answer_sign(const ts_answer_claim_t *c, const ts_identity_t *id,
                    uint8_t sig[TS_SIGNATURE_BYTES]) {
    uint8_t buf[TS_ANSWER_CLAIM_MAX];
    size_t n = ts_answer_claim_bytes(c, buf);
    crypto_sign_detached(sig, NULL, buf, n, id->sign_sk);
}

int ts_answer_verify(const ts_answer_claim_t *c, const ts_node_id_t *node,
                     const uint8_t sig[TS_SIGNATURE_BYTES]) {
    uint8_t buf[TS_ANSWER_CLAIM_MAX];
    size_t n = ts_answer_claim_bytes(c, buf);
    return crypto_sign_verify_detached(sig, buf, n, node->b) == 0 ? TS_OK : TS_ECORRUPT;
}

int ts_answer_claim_of(ts_answer_claim_t *c, uint64_t request_id,
                       const uint8_t request_hash[TS_ANSWER_HASH_BYTES],
                       const uint8_t expert[TS_ANSWER_HASH_BYTES],
                       const Tessera__DenoiseResponse *resp) {
    if (!resp || !resp->velocity || !resp->has_signature ||
        resp->signature.len != TS_SIGNATURE_BYTES || !resp->device_class || !resp->has_precision)
        return TS_ECORRUPT;
    size_t n = strlen(resp->device_class);
    if (n > TS_ANSWER_DEVICE_MAX)
        return TS_ECORRUPT;
    memset(c, 0, sizeof *c);
    c->request_id = request_id;
    memcpy(c->request_hash, request_hash, TS_ANSWER_HASH_BYTES);
    memcpy(c->expert, expert, TS_ANSWER_HASH_BYTES);
    if (ts_answer_tensor_hash(resp->velocity, c->answer_hash) != TS_OK)
        return TS_ECORRUPT;
    c->precision = (uint8_t)resp->precision;
    memcpy(c->device_class, resp->device_class, n + 1);
    return TS_OK;
}

int ts_answer_exact(const ts_answer_claim_t *cx, const ts_answer_claim_t *cy) {
    return cx->precision == cy->precision && strcmp(cx->device_class, cy->device_class) == 0 &&
           strncmp(cx->device_class, "cpu/", 4) == 0;
}

double ts_answer_tolerance(const ts_answer_claim_t *cx, const ts_answer_claim_t *cy,
                           float cfg_scale) {
    double s = (double)cfg_scale, gain = fabs(s) + fabs(1.0 - s);
    double tol =
        cx->precision == TESSERA__DTYPE__DTYPE_F32 && cy->precision == TESSERA__DTYPE__DTYPE_F32
            ? TS_ANSWER_TOL_F32
            : TS_ANSWER_TOL_LOW;
    return gain > 1.0 ? tol * gain : tol;
}

size_t ts_answer_shape_values(const ts_answer_shape_t *s) {
    return s->m * s->chw * (s->variance ? 2u : 1u);
}

double ts_answer_part_diff(const float *x, const float *y, const ts_answer_shape_t *s, int part) {
    if (part && !s->variance)
        return 0.0;
    size_t row = s->chw * (s->variance ? 2u : 1u), off = part ? s->chw : 0;
    double d = 0.0, m = 1.0;
    for (size_t i = 0; i < s->m; i++) {
        const float *xr = x + i * row + off, *yr = y + i * row + off;
        for (size_t j = 0; j < s->chw; j++) {
            double e = fabs((double)xr[j] - (double)yr[j]);
            d = e <= d ? d : (isnan(e) ? INFINITY : e);
            m = fabs((double)yr[j]) > m ? fabs((double)yr[j]) : m;
        }
    }
    return d / m;
}

int ts_answer_near(const float *x, const ts_answer_claim_t *cx, const float *y,
                   const ts_answer_claim_t *cy, const ts_answer_shape_t *s, float cfg_scale,
                   double times) {
    return ts_answer_part_diff(x, y, s, 0) <= times * ts_answer_tolerance(cx, cy, cfg_scale) &&
           ts_answer_part_diff(x, y, s, 1) <= times * ts_answer_tolerance(cx, cy, 1.0f);
}

int ts_answer_agree_shape(const float *x, const ts_answer_claim_t *cx, const float *y,
                          const ts_answer_claim_t *cy, const ts_answer_shape_t *s,
                          float cfg_scale) {
    if (ts_answer_exact(cx, cy))
        return memcmp(x, y, ts_answer_shape_values(s) * sizeof *x) == 0;
    return ts_answer_near(x, cx, y, cy, s, cfg_scale, 1.0);
}

int ts_answer_far_shape(const float *x, const ts_answer_claim_t *cx, const float *y,
                        const ts_answer_claim_t *cy, const ts_answer_shape_t *s, float cfg_scale) {
    if (ts_answer_exact(cx, cy))
        return memcmp(x, y, ts_answer_shape_values(s) * sizeof *x) != 0;
    return !ts_answer_near(x, cx, y, cy, s, cfg_scale, 10.0);
}
