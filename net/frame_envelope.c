/*
 * frame_envelope.c — Envelopes on top of protobuf-c: encoding, and decoding within a memory
 * budget (declared in frame.h). The validity rules both apply are in frame_check.c.
 *
 * Decoding is two steps. First protobuf-c parses the bytes, allocating through budget_alloc,
 * which counts every byte it hands out (frees are not credited back) and fails once the total
 * would pass TS_FRAME_DECODE_FACTOR × length + TS_FRAME_DECODE_SLACK. protobuf-c then cleans up
 * and returns NULL, and the frame is refused with TS_ERANGE. The bound matters because
 * protobuf-c's memory is not proportional to the input: an empty sub-message costs two bytes on
 * the wire and a whole struct in memory, and every field it scans costs a 32-byte record.
 *
 * Then the checker (frame_check.c) walks the parsed message; a message that fails it is freed
 * and refused.
 *
 * The body of a signed advert stays bytes inside the Envelope: its signature covers those exact
 * bytes, so the gossip layer verifies it first and only then calls ts_frame_decode_advert_body,
 * which applies the same budget and checks. (The membership protocol's own messages are not
 * Envelopes: net/swim_wire.h encodes them.)
 */
#include "net/frame.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "net/frame_internal.h"

_Static_assert(TS_FRAME_MAX_DIMS == TS_MAX_DIMS, "a wire tensor fits a ts_tensor_t");

/* ---- the decode budget -------------------------------------------------------------------- */

typedef struct {
    size_t used, budget;
    int over; /* an allocation was refused: the budget is spent */
    int oom;  /* an allocation within the budget failed */
} budget_t;

static void *budget_alloc(void *data, size_t size) {
    budget_t *b = data;
    if (size > b->budget - b->used) {
        b->over = 1;
        return NULL;
    }
    b->used += size;
    void *p = malloc(size ? size : 1);
    if (!p)
        b->oom = 1;
    return p;
}

static void budget_free(void *data, void *p) {
    (void)data;
    free(p);
}

static size_t budget_for(size_t len) {
    if (len > (SIZE_MAX - TS_FRAME_DECODE_SLACK) / TS_FRAME_DECODE_FACTOR)
        return SIZE_MAX;
    return TS_FRAME_DECODE_FACTOR * len + TS_FRAME_DECODE_SLACK;
}

/* Parses data as a d under the budget; what names it in err. */
static int unpack(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len,
                  ProtobufCMessage **out, const char *what, char *err, size_t errlen) {
    *out = NULL;
    if (!data && len > 0) {
        ts_set_err(err, errlen, "%s: NULL data", what);
        return TS_EINVAL;
    }
    static const uint8_t empty[1];
    budget_t b = {0, budget_for(len), 0, 0};
    ProtobufCAllocator a = {budget_alloc, budget_free, &b};
    ProtobufCMessage *m = protobuf_c_message_unpack(d, &a, len, data ? data : empty);
    if (!m) {
        if (b.over) {
            ts_set_err(err, errlen,
                       "%s: decoding %zu bytes would allocate more than %zu bytes "
                       "(an encoding built to expand)",
                       what, len, b.budget);
            return TS_ERANGE;
        }
        if (b.oom) {
            ts_set_err(err, errlen, "%s: out of memory decoding %zu bytes", what, len);
            return TS_ENOMEM;
        }
        ts_set_err(err, errlen, "%s: %zu bytes that are not a valid protobuf %s", what, len,
                   d->short_name);
        return TS_ECORRUPT;
    }
    int rc = ts_frame__check_field_numbers(m, what, TS_ECORRUPT, err, errlen);
    if (rc) {
        ts_frame_free(m);
        return rc;
    }
    *out = m;
    return TS_OK;
}

void ts_frame_free(void *msg) {
    if (msg)
        protobuf_c_message_free_unpacked(msg, NULL); /* free(), matching budget_alloc */
}

/* ---- the envelope ------------------------------------------------------------------------- */

int ts_frame_unpack_envelope(const uint8_t *data, size_t len, Tessera__Envelope **out, char *err,
                             size_t errlen) {
    if (!out) {
        ts_set_err(err, errlen, "ts_frame_unpack_envelope: NULL out");
        return TS_EINVAL;
    }
    ProtobufCMessage *m;
    int rc = unpack(&tessera__envelope__descriptor, data, len, &m, "envelope", err, errlen);
    *out = (Tessera__Envelope *)m;
    return rc;
}

int ts_frame_decode_envelope(const uint8_t *data, size_t len, unsigned flags,
                             Tessera__Envelope **out, char *err, size_t errlen) {
    if (!out) {
        ts_set_err(err, errlen, "ts_frame_decode_envelope: NULL out");
        return TS_EINVAL;
    }
    *out = NULL;
    Tessera__Envelope *env;
    int rc = ts_frame_unpack_envelope(data, len, &env, err, errlen);
    if (rc)
        return rc;
    rc = ts_frame_check_envelope(env, flags, err, errlen);
    if (rc) {
        ts_frame_free(env);
        *out = NULL;
        return rc;
    }
    *out = env;
    return TS_OK;
}

int ts_frame_encode_envelope(const Tessera__Envelope *env, unsigned flags, uint32_t max_frame,
                             uint8_t **out, size_t *out_len, char *err, size_t errlen) {
    if (!out || !out_len) {
        ts_set_err(err, errlen, "ts_frame_encode_envelope: NULL out");
        return TS_EINVAL;
    }
    *out = NULL;
    *out_len = 0;
    int rc = ts_frame_check_envelope(env, flags, err, errlen);
    if (rc)
        return rc;
    /* a hand-built envelope could carry an unknown field no decoder would accept */
    rc = ts_frame__check_field_numbers(&env->base, "envelope", TS_EINVAL, err, errlen);
    if (rc)
        return rc;
    size_t n = protobuf_c_message_get_packed_size(&env->base);
    uint8_t *buf;
    if (n > max_frame) {
        ts_set_err(err, errlen, "the %s envelope is %zu bytes, more than max_frame (%u)",
                   ts_frame_body_name(env->body_case), n, (unsigned)max_frame);
        return TS_ERANGE;
    }
    if (!(buf = malloc(TS_FRAME_APP_HEADER + n))) {
        ts_set_err(err, errlen, "out of memory encoding a %zu-byte envelope", n);
        return TS_ENOMEM;
    }
    ts_frame_put_app_len(buf, n, max_frame); /* 1 ≤ n: a checked envelope has a body */
    size_t packed = protobuf_c_message_pack(&env->base, buf + TS_FRAME_APP_HEADER);
    if (packed != n) { /* protobuf-c's two passes disagree: a bug, not bad input */
        free(buf);
        ts_set_err(err, errlen, "protobuf-c packed %zu bytes, having measured %zu", packed, n);
        return TS_ECORRUPT;
    }
    *out = buf;
    *out_len = TS_FRAME_APP_HEADER + n;
    return TS_OK;
}

/* ---- bodies of signed statements ---------------------------------------------------------- */

/* Parses a signed statement's body under the budget; check runs when the parse succeeds. */
static int decode_body(const ProtobufCMessageDescriptor *d, const ProtobufCBinaryData *body,
                       ProtobufCMessage **out, const char *what, char *err, size_t errlen) {
    if (!body || !out) {
        ts_set_err(err, errlen, "%s: NULL argument", what);
        return TS_EINVAL;
    }
    if (body->len > TS_FRAME_SIGNED_BODY_MAX) {
        ts_set_err(err, errlen, "%s is %zu bytes, more than %u", what, body->len,
                   TS_FRAME_SIGNED_BODY_MAX);
        return TS_ERANGE;
    }
    return unpack(d, body->data, body->len, out, what, err, errlen);
}

int ts_frame_decode_advert_body(const ProtobufCBinaryData *body, unsigned flags,
                                Tessera__AdvertBody **out, char *err, size_t errlen) {
    ProtobufCMessage *m = NULL;
    int rc = decode_body(&tessera__advert_body__descriptor, body, &m, "advert body", err, errlen);
    if (!rc && (rc = ts_frame_check_advert_body((Tessera__AdvertBody *)m, flags, err, errlen))) {
        ts_frame_free(m);
        m = NULL;
    }
    if (out)
        *out = (Tessera__AdvertBody *)m;
    return rc;
}

/* ---- tensors to and from ts_tensor_t ------------------------------------------------------ */

static int host_is_little_endian(void) {
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

int ts_frame_tensor_set(Tessera__Tensor *w, const ts_tensor_t *t) {
    if (!w || ts_tensor_check(t))
        return TS_EINVAL;
    if (t->device != TS_CPU)
        return TS_EDEVICE;
    int d;
    switch (t->dtype) {
    case TS_F32: d = TESSERA__DTYPE__DTYPE_F32; break;
    case TS_F16: d = TESSERA__DTYPE__DTYPE_F16; break;
    case TS_BF16: d = TESSERA__DTYPE__DTYPE_BF16; break;
    default: return TS_EDTYPE;
    }
    if (!host_is_little_endian())
        return TS_ENOTSUP;
    tessera__tensor__init(w);
    w->has_dtype = 1;
    w->dtype = (Tessera__DType)d;
    w->n_shape = (size_t)t->ndim;
    w->shape = (int64_t *)t->shape; /* packing only reads it */
    w->has_data = 1;
    w->data.len = ts_tensor_nbytes(t);
    w->data.data = t->data;
    return TS_OK;
}

int ts_frame_tensor_view(const Tessera__Tensor *w, ts_tensor_t *t) {
    if (!t || ts_frame_check_tensor(w, TS_FRAME_DTYPES_FLOAT, 0, NULL, NULL, 0))
        return TS_EINVAL;
    if (!host_is_little_endian())
        return TS_ENOTSUP;
    ts_dtype_t d = w->dtype == TESSERA__DTYPE__DTYPE_F32   ? TS_F32
                   : w->dtype == TESSERA__DTYPE__DTYPE_F16 ? TS_F16
                                                           : TS_BF16;
    return ts_tensor_wrap(t, w->data.data, d, TS_CPU, (int)w->n_shape, w->shape);
}
