/*
 * frame_check.c — the validity rules of docs/protocol.md for Envelopes and the bodies of signed
 * statements (declared in frame.h); frame_envelope.c applies them to every Envelope it decodes
 * or encodes.
 *
 * The checker walks a parsed message, one check_<message> function per message type, each
 * told where the message sits ("status_response.members[2]") so that an error sentence names
 * the exact field. The checker reads only; it never changes what it was given. Fields this
 * version does not know are left in each message's unknown_fields and ignored, except where
 * they decide what the message is: an Envelope whose body is unknown is refused with TS_ENOTSUP
 * (the receiver answers ERROR_UNSUPPORTED). An unknown field whose number is not a protobuf
 * field number (0, or over 2^29 − 1) is a parse error at any depth: see
 * ts_frame__check_field_numbers, which the codec also runs on what it decodes and encodes.
 */
#include "net/frame.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "net/frame_internal.h"
#include "net/keys.h"
#include "store/peers.h"
#include "store/weights.h"

_Static_assert(TS_FRAME_ID_BYTES == TS_HASH_BYTES, "ids and hashes are BLAKE2b-256 sized");
_Static_assert(TS_FRAME_ID_BYTES == TS_PEER_ID_LEN, "node ids are Ed25519 public keys");
_Static_assert(TS_FRAME_ADDR_MAX == TS_PEER_ADDR_MAX, "an address book entry holds them all");

#define PATH_LEN 128        /* the longest field path in an error sentence */
#define FIRST_BODY_FIELD 16 /* Envelope fields 1..15 are the header's */

static const char *sub(char path[PATH_LEN], const char *base, const char *field, long i);

/* ---- field numbers ------------------------------------------------------------------------
 *
 * protobuf's field numbers are 1..2^29 − 1; a tag with any other number is not protobuf.
 * protobuf-c 1.4.1 refuses a tag whose number is 0 only when the tag is one byte: an overlong
 * varint (0x82 0x00: field 0, wire type 2) passes, and the field is kept among the message's
 * unknown fields. Packing that message again writes the canonical tag 0x02, which every decoder
 * (protobuf-c included) refuses — so a frame could be accepted, relayed, and refused by the next
 * node. The walk below closes the hole at every nesting level, for every message that unpack()
 * returns and every envelope about to be encoded. Unknown fields with valid numbers stay allowed
 * and ignored: that is how the protocol evolves (docs/protocol.md §4, §11). */

#define FIELD_NUMBER_MAX 536870911u /* 2^29 − 1 */

/* Refuses, with code, an unknown field numbered outside 1..FIELD_NUMBER_MAX in m or in any
 * sub-message present in it (each element of a repeated field, the set member of a oneof, any
 * other non-NULL one); what is m's path in err. The schema has no recursive message, so the
 * depth is bounded by it. */
int ts_frame__check_field_numbers(const ProtobufCMessage *m, const char *what, int code, char *err,
                                  size_t errlen) {
    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        uint32_t tag = m->unknown_fields[i].tag;
        if (tag == 0 || tag > FIELD_NUMBER_MAX) {
            ts_set_err(err, errlen,
                       "%s holds a field numbered %u; protobuf field numbers are 1..%u, so this "
                       "is not a valid protobuf encoding",
                       what, (unsigned)tag, FIELD_NUMBER_MAX);
            return code;
        }
    }
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        char p[PATH_LEN];
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t k = 0; k < n; k++) {
                int rc = v[k] ? ts_frame__check_field_numbers(v[k], sub(p, what, f->name, (long)k),
                                                              code, err, errlen)
                              : TS_OK;
                if (rc)
                    return rc;
            }
            continue;
        }
        /* a oneof's members share one pointer; only the set one may be read as this field */
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(base + f->quantifier_offset) != f->id)
            continue;
        const ProtobufCMessage *s = *(ProtobufCMessage *const *)(base + f->offset);
        int rc = s ? ts_frame__check_field_numbers(s, sub(p, what, f->name, -1), code, err, errlen)
                   : TS_OK;
        if (rc)
            return rc;
    }
    return TS_OK;
}

/* ---- the checker's plumbing --------------------------------------------------------------- */

typedef struct {
    unsigned flags; /* TS_FRAME_CHECK_* */
    char *err;
    size_t errlen;
} chk_t;

/* The check's error sentence (base/error.h's ts_fail into the chk_t's buffer). */
#define bad(c, code, ...) ts_fail((c)->err, (c)->errlen, (code), __VA_ARGS__)

/* path = "<base>.<field>" or "<base>.<field>[i]" (i ≥ 0); a path too long for the buffer
 * ends in "..." (only the error sentence suffers). */
static const char *sub(char path[PATH_LEN], const char *base, const char *field, long i) {
    int n = i < 0 ? snprintf(path, PATH_LEN, "%s.%s", base, field)
                  : snprintf(path, PATH_LEN, "%s.%s[%ld]", base, field, i);
    if (n >= PATH_LEN)
        memcpy(path + PATH_LEN - 4, "...", 4);
    return path;
}

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

/* A present sub-message. */
static int need(chk_t *c, const void *msg, const char *what, const char *field) {
    if (!msg)
        return bad(c, TS_ECORRUPT, "%s.%s is missing", what, field);
    return TS_OK;
}

/* A present scalar. */
static int need_has(chk_t *c, protobuf_c_boolean has, const char *what, const char *field) {
    if (!has)
        return bad(c, TS_ECORRUPT, "%s.%s is missing", what, field);
    return TS_OK;
}

/* A node id, partition id or hash: exactly TS_FRAME_ID_BYTES bytes. */
static int check_id(chk_t *c, protobuf_c_boolean has, const ProtobufCBinaryData *b,
                    const char *what, const char *field) {
    if (!has)
        return bad(c, TS_ECORRUPT, "%s.%s is missing", what, field);
    if (b->len != TS_FRAME_ID_BYTES)
        return bad(c, TS_ECORRUPT, "%s.%s is %zu bytes, not %u", what, field, b->len,
                   TS_FRAME_ID_BYTES);
    return TS_OK;
}

/* A float that must be finite and within [lo, hi]. */
static int check_float(chk_t *c, float v, float lo, float hi, const char *what, const char *field) {
    if (!isfinite(v) || v < lo || v > hi)
        return bad(c, TS_ERANGE, "%s.%s is %g, outside [%g, %g]", what, field, (double)v,
                   (double)lo, (double)hi);
    return TS_OK;
}

static int check_addr(chk_t *c, const char *a, const char *what) {
    if (!a)
        return bad(c, TS_ECORRUPT, "%s is missing", what);
    if (strlen(a) > TS_FRAME_ADDR_MAX || !ts_addr_valid(a, strlen(a), 0))
        return bad(c, TS_ECORRUPT, "%s \"%.64s\" is not a host:port address", what, a);
    return TS_OK;
}

/* Well-formed UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. */
static int utf8_ok(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned b = s[i];
        size_t k;
        unsigned cp, min;
        if (b < 0x80) {
            i++;
            continue;
        } else if ((b & 0xE0) == 0xC0) {
            k = 1, cp = b & 0x1F, min = 0x80;
        } else if ((b & 0xF0) == 0xE0) {
            k = 2, cp = b & 0x0F, min = 0x800;
        } else if ((b & 0xF8) == 0xF0) {
            k = 3, cp = b & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (n - i <= k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k + 1;
    }
    return 1;
}

/* ---- tensors ------------------------------------------------------------------------------ */

static size_t wire_dtype_size(int d) {
    switch (d) {
    case TESSERA__DTYPE__DTYPE_F32: return 4;
    case TESSERA__DTYPE__DTYPE_F16:
    case TESSERA__DTYPE__DTYPE_BF16: return 2;
    default: return 0;
    }
}

static const char *wire_dtype_name(int d) {
    switch (d) {
    case TESSERA__DTYPE__DTYPE_F32: return "F32";
    case TESSERA__DTYPE__DTYPE_F16: return "F16";
    case TESSERA__DTYPE__DTYPE_BF16: return "BF16";
    default: return "?";
    }
}

/* The index of the first element whose exponent bits are all ones (Inf or NaN), or n. The bytes
 * are little-endian whatever the host, so the exponent is read from the high byte(s). */
static size_t first_nonfinite(const uint8_t *p, size_t n, int d) {
    for (size_t i = 0; i < n; i++) {
        switch (d) {
        case TESSERA__DTYPE__DTYPE_F32: {
            const uint8_t *e = p + 4 * i; /* exponent: bits 23..30 */
            if ((e[3] & 0x7F) == 0x7F && (e[2] & 0x80))
                return i;
            break;
        }
        case TESSERA__DTYPE__DTYPE_F16: /* exponent: bits 10..14 */
            if ((p[2 * i + 1] & 0x7C) == 0x7C)
                return i;
            break;
        default: /* BF16, exponent: bits 7..14 */
            if ((p[2 * i + 1] & 0x7F) == 0x7F && (p[2 * i] & 0x80))
                return i;
            break;
        }
    }
    return n;
}

static int check_tensor(chk_t *c, const Tessera__Tensor *w, unsigned allowed, const char *what) {
    if (!w)
        return bad(c, TS_ECORRUPT, "%s is missing", what);
    if (!w->has_dtype)
        return bad(c, TS_ECORRUPT, "%s.dtype is missing", what);
    size_t esize = wire_dtype_size(w->dtype);
    if (esize == 0 || !(allowed & TS_FRAME_DTYPE_BIT(w->dtype)))
        return bad(c, TS_EDTYPE, "%s: dtype %s (%d) is not accepted here", what,
                   wire_dtype_name(w->dtype), (int)w->dtype);
    if (w->n_shape < 1 || w->n_shape > TS_FRAME_MAX_DIMS)
        return bad(c, TS_ESHAPE, "%s has %zu dimensions, not 1..%d", what, w->n_shape,
                   TS_FRAME_MAX_DIMS);
    size_t numel = 1;
    for (size_t i = 0; i < w->n_shape; i++) {
        int64_t d = w->shape[i];
        if (d < 1)
            return bad(c, TS_ESHAPE, "%s: dimension %zu is %lld, not ≥ 1", what, i, (long long)d);
        if ((uint64_t)d > SIZE_MAX / esize / numel)
            return bad(c, TS_ERANGE, "%s: the shape's size overflows", what);
        numel *= (size_t)d;
    }
    if (!w->has_data || w->data.len != numel * esize)
        return bad(c, TS_ESHAPE, "%s: shape needs %zu × %zu bytes, data holds %zu", what, numel,
                   esize, w->has_data ? w->data.len : 0);
    if (c->flags & TS_FRAME_CHECK_FINITE) {
        size_t i = first_nonfinite(w->data.data, numel, w->dtype);
        if (i < numel)
            return bad(c, TS_ENONFINITE, "%s: element %zu is NaN or infinite", what, i);
    }
    return TS_OK;
}

int ts_frame_check_tensor(const Tessera__Tensor *w, unsigned allowed, unsigned flags,
                          const char *what, char *err, size_t errlen) {
    chk_t c = {flags, err, errlen};
    return check_tensor(&c, w, allowed, what ? what : "tensor");
}

/* ---- gossip and adverts ------------------------------------------------------------------- */

/* An Advert: a statement signed by node_id over its body (docs/protocol.md §9). */
static int check_signed(chk_t *c, protobuf_c_boolean has_id, const ProtobufCBinaryData *id,
                        protobuf_c_boolean has_body, const ProtobufCBinaryData *body,
                        protobuf_c_boolean has_sig, const ProtobufCBinaryData *sig,
                        const char *what) {
    CHECK(check_id(c, has_id, id, what, "node_id"));
    if (!has_body || body->len == 0)
        return bad(c, TS_ECORRUPT, "%s.body is missing", what);
    if (body->len > TS_FRAME_SIGNED_BODY_MAX)
        return bad(c, TS_ERANGE, "%s.body is %zu bytes, more than %u", what, body->len,
                   TS_FRAME_SIGNED_BODY_MAX);
    if (!has_sig)
        return bad(c, TS_ECORRUPT, "%s.signature is missing", what);
    if (sig->len != TS_FRAME_SIGNATURE_BYTES)
        return bad(c, TS_ECORRUPT, "%s.signature is %zu bytes, not %u", what, sig->len,
                   TS_FRAME_SIGNATURE_BYTES);
    return TS_OK;
}

static int check_advert(chk_t *c, const Tessera__Advert *a, const char *what) {
    return check_signed(c, a->has_node_id, &a->node_id, a->has_body, &a->body, a->has_signature,
                        &a->signature, what);
}

static int check_member(chk_t *c, const Tessera__MemberState *m, const char *what) {
    CHECK(check_id(c, m->has_node_id, &m->node_id, what, "node_id"));
    CHECK(need_has(c, m->has_status, what, "status"));
    if (m->status < TESSERA__MEMBER_STATUS__MEMBER_ALIVE ||
        m->status > TESSERA__MEMBER_STATUS__MEMBER_LEFT)
        return bad(c, TS_ECORRUPT, "%s.status %d is not a member status", what, (int)m->status);
    CHECK(need_has(c, m->has_incarnation, what, "incarnation"));
    char p[PATH_LEN];
    if (m->addr)
        CHECK(check_addr(c, m->addr, sub(p, what, "addr", -1)));
    return TS_OK;
}

static int check_members(chk_t *c, size_t n, Tessera__MemberState *const *m, const char *what) {
    char p[PATH_LEN];
    for (size_t i = 0; i < n; i++)
        CHECK(check_member(c, m[i], sub(p, what, "members", (long)i)));
    return TS_OK;
}

/* ---- serving, weights, status, control ---------------------------------------------------- */

static int check_load(chk_t *c, const Tessera__Load *m, const char *what) {
    if (m->has_requests_per_s)
        CHECK(check_float(c, m->requests_per_s, 0.0f, 1e9f, what, "requests_per_s"));
    return TS_OK;
}

static int check_denoise_request(chk_t *c, const Tessera__DenoiseRequest *m) {
    const char *w = "denoise_request";
    CHECK(check_id(c, m->has_expert_id, &m->expert_id, w, "expert_id"));
    CHECK(check_tensor(c, m->x_t, TS_FRAME_DTYPES_FLOAT, "denoise_request.x_t"));
    if (m->x_t->n_shape != 4)
        return bad(c, TS_ESHAPE, "denoise_request.x_t has %zu dimensions, not 4 (B, C, H, W)",
                   m->x_t->n_shape);
    size_t B = (size_t)m->x_t->shape[0];
    if (m->n_t != B)
        return bad(c, TS_ESHAPE, "denoise_request.t has %zu values for a batch of %zu", m->n_t, B);
    for (size_t i = 0; i < B; i++)
        if (!isfinite(m->t[i]) || m->t[i] < 0.0f || m->t[i] > 1.0f)
            return bad(c, TS_ERANGE, "denoise_request.t[%zu] is %g, outside [0, 1]", i,
                       (double)m->t[i]);
    if (m->n_class_labels != B)
        return bad(c, TS_ESHAPE, "denoise_request.class_labels has %zu values for a batch of %zu",
                   m->n_class_labels, B);
    for (size_t i = 0; i < B; i++)
        if (m->class_labels[i] < 0)
            return bad(c, TS_ERANGE, "denoise_request.class_labels[%zu] is %d, negative", i,
                       (int)m->class_labels[i]);
    CHECK(need_has(c, m->has_cfg_scale, w, "cfg_scale"));
    return check_float(c, m->cfg_scale, -TS_FRAME_CFG_SCALE_MAX, TS_FRAME_CFG_SCALE_MAX, w,
                       "cfg_scale");
}

static int check_denoise_response(chk_t *c, const Tessera__DenoiseResponse *m) {
    CHECK(check_tensor(c, m->velocity, TS_FRAME_DTYPES_FLOAT, "denoise_response.velocity"));
    if (m->velocity->n_shape != 4)
        return bad(c, TS_ESHAPE, "denoise_response.velocity has %zu dimensions, not 4 (B, C, H, W)",
                   m->velocity->n_shape);
    /* the signed answer's parts (net/answer.h): whether the signature holds is the client's
     * check, against the node it asked */
    if (m->has_signature && m->signature.len != TS_SIGNATURE_BYTES)
        return bad(c, TS_ECORRUPT, "denoise_response.signature is %zu bytes, not %d",
                   m->signature.len, TS_SIGNATURE_BYTES);
    if (m->device_class && strlen(m->device_class) > TS_FRAME_DEVICE_MAX)
        return bad(c, TS_ECORRUPT, "denoise_response.device_class is longer than %d bytes",
                   TS_FRAME_DEVICE_MAX);
    if (m->has_precision && m->precision != TESSERA__DTYPE__DTYPE_F32 &&
        m->precision != TESSERA__DTYPE__DTYPE_BF16 && m->precision != TESSERA__DTYPE__DTYPE_F16)
        return bad(c, TS_ECORRUPT, "denoise_response.precision %d is not F32, BF16 or F16",
                   (int)m->precision);
    return TS_OK;
}

/* An optional UTF-8 sentence of at most TS_FRAME_MESSAGE_MAX bytes. */
static int check_message(chk_t *c, const char *m, const char *what) {
    size_t n = m ? strlen(m) : 0;
    if (n > TS_FRAME_MESSAGE_MAX)
        return bad(c, TS_ECORRUPT, "%s is longer than %d bytes", what, TS_FRAME_MESSAGE_MAX);
    if (m && !utf8_ok((const unsigned char *)m, n))
        return bad(c, TS_ECORRUPT, "%s is not UTF-8", what);
    return TS_OK;
}

/* An accusation: the accused's id, the request and the answer as the rules above read them (the
 * signature and whether the answer is wrong are the verifier's: daemon/trust.c). */
static int check_accusation(chk_t *c, const Tessera__Accusation *m) {
    const char *w = "accusation";
    CHECK(check_id(c, m->has_accused, &m->accused, w, "accused"));
    if (!m->has_request_id || m->request_id == 0)
        return bad(c, TS_ECORRUPT, "accusation.request_id is missing");
    CHECK(need(c, m->request, w, "request"));
    CHECK(check_denoise_request(c, m->request));
    CHECK(need(c, m->answer, w, "answer"));
    CHECK(check_denoise_response(c, m->answer));
    if (!m->answer->has_signature || !m->answer->device_class || !m->answer->has_precision)
        return bad(c, TS_ECORRUPT,
                   "accusation.answer lacks its signature, device_class or precision (what the "
                   "accused signed)");
    return TS_OK;
}

static int check_manifest(chk_t *c, const Tessera__WeightsManifest *m) {
    const char *w = "weights_manifest";
    CHECK(check_id(c, m->has_weights_hash, &m->weights_hash, w, "weights_hash"));
    CHECK(need_has(c, m->has_total_size, w, "total_size"));
    if (m->total_size < 1 || m->total_size > TS_FRAME_WEIGHTS_MAX)
        return bad(c, TS_ERANGE, "weights_manifest.total_size %llu is outside [1, 2^40]",
                   (unsigned long long)m->total_size);
    CHECK(need_has(c, m->has_chunk_size, w, "chunk_size"));
    if (m->chunk_size < TS_FRAME_CHUNK_MIN || m->chunk_size > TS_FRAME_CHUNK_MAX)
        return bad(c, TS_ERANGE, "weights_manifest.chunk_size %u is outside [%u, %u]",
                   (unsigned)m->chunk_size, TS_FRAME_CHUNK_MIN, TS_FRAME_CHUNK_MAX);
    uint64_t n = (m->total_size + m->chunk_size - 1) / m->chunk_size;
    if (m->n_chunk_hashes != n)
        return bad(c, TS_ECORRUPT,
                   "weights_manifest lists %zu chunk hashes; %llu bytes in chunks of %u need %llu",
                   m->n_chunk_hashes, (unsigned long long)m->total_size, (unsigned)m->chunk_size,
                   (unsigned long long)n);
    for (size_t i = 0; i < m->n_chunk_hashes; i++)
        if (m->chunk_hashes[i].len != TS_FRAME_ID_BYTES)
            return bad(c, TS_ECORRUPT, "weights_manifest.chunk_hashes[%zu] is %zu bytes, not %u", i,
                       m->chunk_hashes[i].len, TS_FRAME_ID_BYTES);
    CHECK(need_has(c, m->has_dtype, w, "dtype"));
    if (wire_dtype_size(m->dtype) == 0)
        return bad(c, TS_EDTYPE, "weights_manifest.dtype %d is not a dtype", (int)m->dtype);
    return TS_OK;
}

static int check_chunk(chk_t *c, const Tessera__Chunk *m) {
    CHECK(check_id(c, m->has_chunk_hash, &m->chunk_hash, "chunk", "chunk_hash"));
    if (!m->has_data || m->data.len == 0)
        return bad(c, TS_ECORRUPT, "chunk.data is missing");
    if (m->data.len > TS_FRAME_CHUNK_MAX)
        return bad(c, TS_ERANGE, "chunk.data is %zu bytes, more than %u", m->data.len,
                   TS_FRAME_CHUNK_MAX);
    return TS_OK;
}

static int check_aggregates(chk_t *c, const Tessera__Aggregates *m) {
    const char *w = "status_response.aggregates";
    char p[PATH_LEN];
    for (size_t i = 0; i < m->n_clusters; i++) {
        const Tessera__ClusterExperts *e = m->clusters[i];
        sub(p, w, "clusters", (long)i);
        CHECK(check_id(c, e->has_partition_id, &e->partition_id, p, "partition_id"));
        CHECK(need_has(c, e->has_cluster, p, "cluster"));
        if (!e->has_live_experts || e->live_experts < 1)
            return bad(c, TS_ECORRUPT, "%s.live_experts must be ≥ 1 (else it is uncovered)", p);
    }
    for (size_t i = 0; i < m->n_uncovered; i++) {
        const Tessera__ClusterRef *r = m->uncovered[i];
        sub(p, w, "uncovered", (long)i);
        CHECK(check_id(c, r->has_partition_id, &r->partition_id, p, "partition_id"));
        CHECK(need_has(c, r->has_cluster, p, "cluster"));
    }
    if (m->has_total_capacity)
        CHECK(check_float(c, m->total_capacity, 0.0f, 1e12f, w, "total_capacity"));
    if (m->has_request_rate)
        CHECK(check_float(c, m->request_rate, 0.0f, 1e12f, w, "request_rate"));
    return TS_OK;
}

/* A training status: an advert's (step, steps, loss, rate) or a status answer's own job (also
 * the partition and cluster). */
static int check_training(chk_t *c, const Tessera__TrainingStatus *tr, const char *w) {
    if (!tr->has_step || !tr->has_steps || tr->step > tr->steps)
        return bad(c, TS_ECORRUPT, "%s needs step <= steps", w);
    if (tr->has_loss)
        CHECK(check_float(c, tr->loss, -1e30f, 1e30f, w, "loss"));
    if (tr->has_steps_per_s)
        CHECK(check_float(c, tr->steps_per_s, 0.0f, 1e12f, w, "steps_per_s"));
    if (tr->has_partition_id)
        CHECK(check_id(c, 1, &tr->partition_id, w, "partition_id"));
    if (tr->has_heldout_loss)
        CHECK(check_float(c, tr->heldout_loss, 0.0f, 1e30f, w, "heldout_loss"));
    if (tr->has_heldout_step && tr->heldout_step > tr->steps)
        return bad(c, TS_ECORRUPT, "%s needs heldout_step <= steps", w);
    return TS_OK;
}

static int check_status_response(chk_t *c, const Tessera__StatusResponse *m) {
    const char *w = "status_response";
    CHECK(check_id(c, m->has_node_id, &m->node_id, w, "node_id"));
    CHECK(check_members(c, m->n_members, m->members, w));
    char p[PATH_LEN];
    for (size_t i = 0; i < m->n_adverts; i++)
        CHECK(check_advert(c, m->adverts[i], sub(p, w, "adverts", (long)i)));
    if (m->load)
        CHECK(check_load(c, m->load, "status_response.load"));
    if (m->aggregates)
        CHECK(check_aggregates(c, m->aggregates));
    if (m->training)
        CHECK(check_training(c, m->training, "status_response.training"));
    for (size_t i = 0; i < m->n_bans; i++) {
        const Tessera__Ban *b = m->bans[i];
        sub(p, w, "bans", (long)i);
        CHECK(check_id(c, b->has_node_id, &b->node_id, p, "node_id"));
        CHECK(check_id(c, b->has_expert_id, &b->expert_id, p, "expert_id"));
        CHECK(check_message(c, b->reason, "status_response.bans.reason"));
    }
    return TS_OK;
}

static int check_error(chk_t *c, const Tessera__Error *m) {
    /* A code this version does not list is accepted (a newer peer's) and read as INTERNAL. */
    if (!m->has_code || m->code == TESSERA__ERROR_CODE__ERROR_CODE_UNSPECIFIED)
        return bad(c, TS_ECORRUPT, "error.code is missing");
    if (m->message) {
        size_t n = strlen(m->message);
        if (n > TS_FRAME_MESSAGE_MAX)
            return bad(c, TS_ERANGE, "error.message is %zu bytes, more than %d", n,
                       TS_FRAME_MESSAGE_MAX);
        if (!utf8_ok((const unsigned char *)m->message, n))
            return bad(c, TS_ECORRUPT, "error.message is not UTF-8");
    }
    return TS_OK;
}

/* ---- relays ------------------------------------------------------------------------------- */

static int check_addr_field(chk_t *c, const char *a, const char *what) {
    if (!a || strlen(a) > TS_FRAME_ADDR_MAX || !ts_addr_valid(a, strlen(a), 0))
        return bad(c, TS_ECORRUPT, "%s is missing or not host:port", what);
    return TS_OK;
}

/* Exactly one of addr, circuit (16 bytes), datagram (with from) — the datagram no longer than a
 * gossip datagram can be. */
static int check_relay_event(chk_t *c, const Tessera__RelayEvent *e) {
    int n = (e->addr != NULL) + e->has_circuit + e->has_datagram;
    if (n != 1)
        return bad(c, TS_ECORRUPT, "relay_event must carry exactly one of addr, circuit, datagram");
    if (e->addr)
        return check_addr_field(c, e->addr, "relay_event.addr");
    if (e->has_circuit) {
        if (e->circuit.len != TS_FRAME_CIRCUIT_BYTES)
            return bad(c, TS_ECORRUPT, "relay_event.circuit must be %d bytes",
                       TS_FRAME_CIRCUIT_BYTES);
        return TS_OK;
    }
    if (e->datagram.len == 0 || e->datagram.len > TS_FRAME_DATAGRAM_MAX)
        return bad(c, TS_ECORRUPT, "relay_event.datagram must be 1..%d bytes",
                   TS_FRAME_DATAGRAM_MAX);
    return check_addr_field(c, e->from, "relay_event.from");
}

/* ---- the envelope ------------------------------------------------------------------------- */

/* What a body is for the request id and deadline rules. */
typedef enum { KIND_REQUEST, KIND_RESPONSE, KIND_ONE_WAY, KIND_ERROR } body_kind_t;

static body_kind_t body_kind(Tessera__Envelope__BodyCase b) {
    switch (b) {
    case TESSERA__ENVELOPE__BODY_PING:
    case TESSERA__ENVELOPE__BODY_PUSH_PULL: /* the answer to a PushPull is a PushPull too */
    case TESSERA__ENVELOPE__BODY_ADVERT_REQUEST:
    case TESSERA__ENVELOPE__BODY_DENOISE_REQUEST:
    case TESSERA__ENVELOPE__BODY_ACCUSATION:
    case TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST:
    case TESSERA__ENVELOPE__BODY_CHUNK_REQUEST:
    case TESSERA__ENVELOPE__BODY_STATUS_REQUEST:
    case TESSERA__ENVELOPE__BODY_DIAL_BACK_REQUEST:
    case TESSERA__ENVELOPE__BODY_RELAY_RESERVE: return KIND_REQUEST;
    case TESSERA__ENVELOPE__BODY_ACK:
    case TESSERA__ENVELOPE__BODY_ADVERT:
    case TESSERA__ENVELOPE__BODY_DENOISE_RESPONSE:
    case TESSERA__ENVELOPE__BODY_ACCUSATION_VERDICT:
    case TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST:
    case TESSERA__ENVELOPE__BODY_CHUNK:
    case TESSERA__ENVELOPE__BODY_STATUS_RESPONSE:
    case TESSERA__ENVELOPE__BODY_DIAL_BACK_RESPONSE:
    case TESSERA__ENVELOPE__BODY_RELAY_ENDED:
    case TESSERA__ENVELOPE__BODY_BUSY: return KIND_RESPONSE;
    case TESSERA__ENVELOPE__BODY_ERROR: return KIND_ERROR;
    default: return KIND_ONE_WAY; /* cancel, relay_event */
    }
}

const char *ts_frame_body_name(Tessera__Envelope__BodyCase b) {
    if (b == TESSERA__ENVELOPE__BODY__NOT_SET)
        return "none";
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(&tessera__envelope__descriptor, (unsigned)b);
    if (!f || !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
        return "unknown";
    return f->name;
}

/* The rules on the header fields, which depend on the body's kind. */
static int check_header(chk_t *c, const Tessera__Envelope *e) {
    const char *name = ts_frame_body_name(e->body_case);
    uint64_t id = e->has_request_id ? e->request_id : 0;
    uint32_t deadline = e->has_deadline_ms ? e->deadline_ms : 0;
    body_kind_t kind = body_kind(e->body_case);
    if ((kind == KIND_REQUEST || kind == KIND_RESPONSE) && id == 0)
        return bad(c, TS_ECORRUPT, "%s needs a non-zero request_id", name);
    if (kind == KIND_ONE_WAY && id != 0)
        return bad(c, TS_ECORRUPT, "%s is one-way and must not carry a request_id", name);
    if (kind != KIND_REQUEST && deadline != 0)
        return bad(c, TS_ECORRUPT, "%s is not a request and must not carry a deadline", name);
    if (e->body_case == TESSERA__ENVELOPE__BODY_DENOISE_REQUEST && deadline == 0)
        return bad(c, TS_ECORRUPT, "denoise_request needs a deadline_ms");
    return TS_OK;
}

static int check_body(chk_t *c, const Tessera__Envelope *e) {
    /* Only a hand-built envelope can name a body and leave it NULL (every member of the union
     * is a pointer, so any of them tells). */
    if (e->body_case != TESSERA__ENVELOPE__BODY__NOT_SET && !e->ping)
        return bad(c, TS_EINVAL, "the envelope's %s body is NULL",
                   ts_frame_body_name(e->body_case));
    switch (e->body_case) {
    case TESSERA__ENVELOPE__BODY_PING:
        return check_id(c, e->ping->has_target_id, &e->ping->target_id, "ping", "target_id");
    case TESSERA__ENVELOPE__BODY_ACK: return TS_OK;
    case TESSERA__ENVELOPE__BODY_PUSH_PULL:
        /* the state's own encoding is checked by the gossip layer (swim_wire.h) */
        if (!e->push_pull->has_state || e->push_pull->state.len == 0)
            return bad(c, TS_ECORRUPT, "push_pull.state is missing");
        return TS_OK;
    case TESSERA__ENVELOPE__BODY_ADVERT_REQUEST:
        return check_id(c, e->advert_request->has_node_id, &e->advert_request->node_id,
                        "advert_request", "node_id");
    case TESSERA__ENVELOPE__BODY_ADVERT: return check_advert(c, e->advert, "advert");
    case TESSERA__ENVELOPE__BODY_DENOISE_REQUEST:
        return check_denoise_request(c, e->denoise_request);
    case TESSERA__ENVELOPE__BODY_DENOISE_RESPONSE:
        return check_denoise_response(c, e->denoise_response);
    case TESSERA__ENVELOPE__BODY_ACCUSATION: return check_accusation(c, e->accusation);
    case TESSERA__ENVELOPE__BODY_ACCUSATION_VERDICT:
        CHECK(need_has(c, e->accusation_verdict->has_upheld, "accusation_verdict", "upheld"));
        return check_message(c, e->accusation_verdict->reason, "accusation_verdict.reason");
    case TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST:
        return check_id(c, e->weights_manifest_request->has_weights_hash,
                        &e->weights_manifest_request->weights_hash, "weights_manifest_request",
                        "weights_hash");
    case TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST: return check_manifest(c, e->weights_manifest);
    case TESSERA__ENVELOPE__BODY_CHUNK_REQUEST:
        return check_id(c, e->chunk_request->has_chunk_hash, &e->chunk_request->chunk_hash,
                        "chunk_request", "chunk_hash");
    case TESSERA__ENVELOPE__BODY_CHUNK: return check_chunk(c, e->chunk);
    case TESSERA__ENVELOPE__BODY_STATUS_REQUEST: return TS_OK;
    case TESSERA__ENVELOPE__BODY_DIAL_BACK_REQUEST:
        return check_addr_field(c, e->dial_back_request->addr, "dial_back_request.addr");
    case TESSERA__ENVELOPE__BODY_DIAL_BACK_RESPONSE:
        CHECK(need_has(c, e->dial_back_response->has_reachable, "dial_back_response", "reachable"));
        if (e->dial_back_response->message &&
            strlen(e->dial_back_response->message) > TS_FRAME_MESSAGE_MAX)
            return bad(c, TS_ECORRUPT, "dial_back_response.message is longer than %d bytes",
                       TS_FRAME_MESSAGE_MAX);
        return TS_OK;
    case TESSERA__ENVELOPE__BODY_STATUS_RESPONSE:
        return check_status_response(c, e->status_response);
    case TESSERA__ENVELOPE__BODY_RELAY_RESERVE: return TS_OK;
    case TESSERA__ENVELOPE__BODY_RELAY_ENDED:
        return check_message(c, e->relay_ended->message, "relay_ended.message");
    case TESSERA__ENVELOPE__BODY_RELAY_EVENT: return check_relay_event(c, e->relay_event);
    case TESSERA__ENVELOPE__BODY_ERROR: return check_error(c, e->error);
    case TESSERA__ENVELOPE__BODY_BUSY:
        return need_has(c, e->busy->has_retry_after_ms, "busy", "retry_after_ms");
    case TESSERA__ENVELOPE__BODY_CANCEL:
        if (!e->cancel->has_request_id || e->cancel->request_id == 0)
            return bad(c, TS_ECORRUPT, "cancel.request_id is missing");
        return TS_OK;
    default: break;
    }
    /* No body this version knows. An unknown field in the body range is a newer version's
     * body kind; one in 3..15 would be a newer header field, which does not make a body. */
    for (unsigned i = 0; i < e->base.n_unknown_fields; i++)
        if (e->base.unknown_fields[i].tag >= FIRST_BODY_FIELD)
            return bad(c, TS_ENOTSUP,
                       "the envelope's body (field %u) is of a kind this node does not know",
                       (unsigned)e->base.unknown_fields[i].tag);
    return bad(c, TS_ECORRUPT, "the envelope has no body");
}

int ts_frame_check_envelope(const Tessera__Envelope *env, unsigned flags, char *err,
                            size_t errlen) {
    chk_t c = {flags, err, errlen};
    if (!env || env->base.descriptor != &tessera__envelope__descriptor)
        return bad(&c, TS_EINVAL, "ts_frame_check_envelope: not an Envelope");
    CHECK(check_body(&c, env));
    return check_header(&c, env);
}

/* ---- bodies of signed statements ---------------------------------------------------------- */

int ts_frame_check_advert_body(const Tessera__AdvertBody *b, unsigned flags, char *err,
                               size_t errlen) {
    chk_t c = {flags, err, errlen};
    const char *w = "advert body";
    if (!b)
        return bad(&c, TS_EINVAL, "ts_frame_check_advert_body: NULL body");
    if (!b->has_version || b->version < 1)
        return bad(&c, TS_ECORRUPT, "advert body.version is missing (it starts at 1)");
    CHECK(check_id(&c, b->has_partition_id, &b->partition_id, w, "partition_id"));
    if (!b->has_num_clusters || b->num_clusters < 1)
        return bad(&c, TS_ECORRUPT, "advert body.num_clusters is missing");
    CHECK(need_has(&c, b->has_cluster, w, "cluster"));
    if (b->cluster >= b->num_clusters)
        return bad(&c, TS_ERANGE, "advert body.cluster %u is not below num_clusters %u",
                   (unsigned)b->cluster, (unsigned)b->num_clusters);
    CHECK(check_id(&c, b->has_weights_hash, &b->weights_hash, w, "weights_hash"));
    if (b->has_router_hash)
        CHECK(check_id(&c, 1, &b->router_hash, w, "router_hash"));
    if (b->has_relay_id)
        CHECK(check_id(&c, 1, &b->relay_id, w, "relay_id"));
    if (b->has_latent_space)
        CHECK(check_id(&c, 1, &b->latent_space, w, "latent_space"));
    if (b->has_heldout_loss)
        CHECK(check_float(&c, b->heldout_loss, 0.0f, 1e30f, w, "heldout_loss"));
    if (b->training)
        CHECK(check_training(&c, b->training, "advert body.training"));
    CHECK(need(&c, b->model, w, "model"));
    const Tessera__ModelConfig *m = b->model;
    const struct {
        protobuf_c_boolean has;
        uint32_t v;
        const char *name;
    } dims[] = {
        {m->has_input_size, m->input_size, "input_size"},
        {m->has_patch_size, m->patch_size, "patch_size"},
        {m->has_in_channels, m->in_channels, "in_channels"},
        {m->has_hidden_size, m->hidden_size, "hidden_size"},
        {m->has_depth, m->depth, "depth"},
        {m->has_num_heads, m->num_heads, "num_heads"},
        {m->has_num_classes, m->num_classes, "num_classes"},
        {1, m->mlp_ratio, "mlp_ratio"}, /* absent: the schema's default, 4 */
        {1, m->freq_dim, "freq_dim"},   /* absent: 256 */
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (!dims[i].has || dims[i].v < 1)
            return bad(&c, TS_ECORRUPT, "advert body.model.%s is missing or zero", dims[i].name);
    CHECK(need_has(&c, b->has_objective, w, "objective"));
    if (b->objective < TESSERA__OBJECTIVE__OBJECTIVE_VELOCITY ||
        b->objective > TESSERA__OBJECTIVE__OBJECTIVE_X0)
        return bad(&c, TS_ECORRUPT, "advert body.objective %d is not an objective",
                   (int)b->objective);
    CHECK(check_tensor(&c, b->centroid,
                       TS_FRAME_DTYPE_BIT(TESSERA__DTYPE__DTYPE_F32) |
                           TS_FRAME_DTYPE_BIT(TESSERA__DTYPE__DTYPE_F16),
                       "advert body.centroid"));
    if (b->centroid->n_shape != 1 || b->centroid->shape[0] > TS_FRAME_CENTROID_MAX)
        return bad(&c, TS_ESHAPE, "advert body.centroid must be one dimension of 1..%d elements",
                   TS_FRAME_CENTROID_MAX);
    CHECK(need(&c, b->capacity, w, "capacity"));
    if (!b->capacity->has_max_batch || b->capacity->max_batch < 1)
        return bad(&c, TS_ECORRUPT, "advert body.capacity.max_batch is missing or zero");
    CHECK(need_has(&c, b->capacity->has_items_per_s, "advert body.capacity", "items_per_s"));
    CHECK(check_float(&c, b->capacity->items_per_s, 0.0f, 1e9f, "advert body.capacity",
                      "items_per_s"));
    if (b->capacity->has_max_rows && b->capacity->max_rows < b->capacity->max_batch)
        return bad(&c, TS_ECORRUPT,
                   "advert body.capacity.max_rows (%u) is below max_batch (%u) samples",
                   (unsigned)b->capacity->max_rows, (unsigned)b->capacity->max_batch);
    if ((b->capacity->has_model_bytes && b->capacity->model_bytes > TS_FRAME_MEMORY_MAX) ||
        (b->capacity->has_row_bytes && b->capacity->row_bytes > TS_FRAME_MEMORY_MAX))
        return bad(&c, TS_ECORRUPT,
                   "advert body.capacity.model_bytes or row_bytes is over 2^50 (1 PiB)");
    if (b->capacity->device && strlen(b->capacity->device) > TS_FRAME_DEVICE_MAX)
        return bad(&c, TS_ECORRUPT, "advert body.capacity.device is longer than %d bytes",
                   TS_FRAME_DEVICE_MAX);
    CHECK(need(&c, b->load, w, "load"));
    return check_load(&c, b->load, "advert body.load");
}
