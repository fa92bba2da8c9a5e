/*
 * answer.h — signed answers: what a serving node signs with its identity (net/keys.h) when it
 * answers a DenoiseRequest, and how anyone checks it (protocol.md, "Signed answers").
 *
 * A replica of one expert at one precision on one device class gives the same bits as every
 * other (the rows are batch invariant), so an answer can be checked exactly. The signature makes
 * an answer evidence: two answers to the same request, signed by their nodes, that should agree
 * and do not, prove that one of the two nodes answered wrongly — and a third answer, or the
 * client's own computation, says which.
 *
 * The claim, TS_ANSWER_CLAIM_MAX bytes at most, is signed as these bytes in this order:
 *
 *   [0, 16)    TS_ANSWER_SIG_CONTEXT, "tessera/answer/1" (16 ASCII bytes, no NUL)
 *   [16, 24)   the Envelope's request_id, uint64 little-endian
 *   [24, 56)   the request's hash (ts_answer_request_hash)
 *   [56, 88)   the velocity's hash (ts_answer_tensor_hash of DenoiseResponse.velocity)
 *   [88, 120)  the expert: its weights_hash (DenoiseRequest.expert_id)
 *   [120, 121) the precision of the products, as a DType value (1 F32, 2 F16, 3 BF16)
 *   [121, 122) n, the device class's length in bytes (≤ TS_ANSWER_DEVICE_MAX)
 *   [122, 122 + n) the device class (DenoiseResponse.device_class), UTF-8
 *
 * Hashes are BLAKE2b-256 (libsodium's crypto_generichash, no key). A tensor's hash covers, in
 * order: the dtype (1 byte, the DType value), the number of dimensions (1 byte), each dimension
 * (int64 little-endian) and the data bytes as they travel. The request's hash covers, in order:
 * TS_ANSWER_REQ_CONTEXT ("tessera/request/1", 17 bytes), the expert id (32 bytes), x_t's tensor
 * hash (32 bytes), the count of t (uint32 LE) and each t (its binary32 bits, LE), the count of
 * labels (uint32 LE) and each label (int32 LE), cfg_scale's binary32 bits (LE; 1.0 when
 * absent, as the server reads it), and one byte 0x01 when with_variance is set (nothing when it
 * is absent or false). An answer with its variance is one tensor (B, 2C, H, W): the claim's
 * velocity hash covers both.
 */
#ifndef TS_NET_ANSWER_H
#define TS_NET_ANSWER_H

#include <stddef.h>
#include <stdint.h>

#include "net/keys.h"
#include "proto/tessera.pb-c.h"

#define TS_ANSWER_SIG_CONTEXT "tessera/answer/1"
#define TS_ANSWER_REQ_CONTEXT "tessera/request/1"
#define TS_ANSWER_HASH_BYTES 32
#define TS_ANSWER_DEVICE_MAX 127
#define TS_ANSWER_CLAIM_MAX (122 + TS_ANSWER_DEVICE_MAX)

/* What a node claims about one answer. */
typedef struct ts_answer_claim {
    uint64_t request_id;
    uint8_t request_hash[TS_ANSWER_HASH_BYTES];
    uint8_t answer_hash[TS_ANSWER_HASH_BYTES];
    uint8_t expert[TS_ANSWER_HASH_BYTES];
    uint8_t precision; /* a Tessera__DType value */
    char device_class[TS_ANSWER_DEVICE_MAX + 1];
} ts_answer_claim_t;

/* The hash of a wire tensor (the layout above). TS_EINVAL for a tensor without dtype or with more
 * than 4 dimensions (a checked tensor has neither). */
int ts_answer_tensor_hash(const Tessera__Tensor *t, uint8_t out[TS_ANSWER_HASH_BYTES]);

/* The hash of a request (the layout above). TS_EINVAL when it has no x_t or no 32-byte expert id. */
int ts_answer_request_hash(const Tessera__DenoiseRequest *d, uint8_t out[TS_ANSWER_HASH_BYTES]);

/* The claim's signed bytes into buf (TS_ANSWER_CLAIM_MAX bytes); returns their count. */
size_t ts_answer_claim_bytes(const ts_answer_claim_t *c, uint8_t buf[TS_ANSWER_CLAIM_MAX]);

/* Signs the claim with the identity's Ed25519 key. */
void ts_answer_sign(const ts_answer_claim_t *c, const ts_identity_t *id,
                    uint8_t sig[TS_SIGNATURE_BYTES]);

/* TS_OK when sig is node's signature of the claim; TS_ECORRUPT otherwise. */
int ts_answer_verify(const ts_answer_claim_t *c, const ts_node_id_t *node,
                     const uint8_t sig[TS_SIGNATURE_BYTES]);

/* The claim of an answer as received: the request's id and hash, the expert asked, and the
 * response's velocity, device class and precision. TS_ECORRUPT for a response without velocity,
 * signature (64 bytes), device class or precision, or with a device class too long. */
int ts_answer_claim_of(ts_answer_claim_t *c, uint64_t request_id,
                       const uint8_t request_hash[TS_ANSWER_HASH_BYTES],
                       const uint8_t expert[TS_ANSWER_HASH_BYTES],
                       const Tessera__DenoiseResponse *resp);

/* ---- comparing answers ----------------------------------------------------------------------
 * The rules a client's spot-check and a node verifying an accusation both apply. Two claims
 * promise the same bits when they name one device class and one precision on a CPU (rows are
 * batch invariant there); otherwise answers are compared within a tolerance, relative to
 * max(1, max|y|): TS_ANSWER_TOL_F32 when both are fp32 (the CPU-GPU parity tests' 1e-4),
 * TS_ANSWER_TOL_LOW when either ran bf16 or f16, times the guidance's gain max(1, |s| + |1 − s|)
 * (v = v_u + s·(v_c − v_u) carries each pass's rounding that many times over; s = cfg_scale).
 * An answer is wrong beyond doubt when a bit differs where bits are promised, or when it is more
 * than ten times the tolerance away: an honest answer just past the tolerance is never called a
 * lie. A value that is not finite is infinitely far. */
#define TS_ANSWER_TOL_F32 1e-4
#define TS_ANSWER_TOL_LOW 5e-2

/* 1 when the two claims promise the same bits. */
int ts_answer_exact(const ts_answer_claim_t *cx, const ts_answer_claim_t *cy);
/* The tolerance between answers of the two claims to a request of guidance cfg_scale. */
double ts_answer_tolerance(const ts_answer_claim_t *cx, const ts_answer_claim_t *cy,
                           float cfg_scale);
/* An answer of m samples, each chw values of prediction followed, with variance (a request
 * with_variance), by chw values of variance interpolation. The two parts are judged apart: the
 * prediction by the rules above, the variance relative to max(1, max|y|) of the variances and without the
 * guidance's gain (it comes from the conditional rows alone) — so an answer whose prediction is
 * right cannot hide a wrong variance under the prediction's larger scale and tolerance. */
typedef struct ts_answer_shape {
    size_t m, chw;
    int variance;
} ts_answer_shape_t;

/* The values in an answer of shape s. */
size_t ts_answer_shape_values(const ts_answer_shape_t *s);
/* The largest |x − y| over one part of every sample (0 the predictions, 1 the variances; 0 when
 * the shape has none), relative to max(1, max|y|) over that part. */
double ts_answer_part_diff(const float *x, const float *y, const ts_answer_shape_t *s, int part);
/* 1 when every part of x is within times × its tolerance of y (the prediction's from cx, cy and
 * cfg_scale, the variance's from cx, cy at no guidance). */
int ts_answer_near(const float *x, const ts_answer_claim_t *cx, const float *y,
                   const ts_answer_claim_t *cy, const ts_answer_shape_t *s, float cfg_scale,
                   double times);
/* 1 when x (claimed by cx) and y (by cy) agree — bit for bit where the claims promise bits
 * (the whole answer), else every part within its tolerance — and, _far, when x is wrong beyond
 * doubt against y. */
int ts_answer_agree_shape(const float *x, const ts_answer_claim_t *cx, const float *y,
                          const ts_answer_claim_t *cy, const ts_answer_shape_t *s, float cfg_scale);
int ts_answer_far_shape(const float *x, const ts_answer_claim_t *cx, const float *y,
                        const ts_answer_claim_t *cy, const ts_answer_shape_t *s, float cfg_scale);

#endif
