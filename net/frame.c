/*
 * frame.c — the two length-prefixed layers of a TCP connection (see frame.h): writing the
 * prefixes, and one reader that reassembles the messages of either layer from input pieces of
 * any size. Envelopes are in frame_envelope.c (the codec) and frame_check.c (the validity
 * rules).
 *
 * A reader is a two-state machine over one message at a time:
 *
 *   PREFIX  (hdr_have < hdr_size) prefix bytes are collected into hdr, one at a time if that is
 *           how they come. When the prefix is complete its length is checked — zero, or more
 *           than the limit, is a protocol error — and only then does the body begin.
 *   BODY    (have < len) if none of the body is buffered yet and the input holds all of it, the
 *           message is handed back in place, with no copy. Otherwise the bytes that did arrive
 *           are appended to buf, which grows to at most twice what has arrived (and never past
 *           len), so a peer that announces 64 MiB and sends ten bytes costs a few KiB.
 *
 * A complete message puts the reader back in PREFIX. Its bytes stay in buf until the next call;
 * then the buffer is kept for reuse if small (≤ READER_KEEP) and freed otherwise, so an idle
 * connection does not hold on to the largest frame it ever received. The memory a reader holds
 * is therefore at most max(READER_MIN, min(len, 2 × received)) ≤ max_frame + a constant.
 */
#include "net/frame.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define READER_MIN 4096u        /* the first allocation of a buffered message */
#define READER_KEEP (64u << 10) /* buffers up to this size survive between messages */

/* ---- prefixes ----------------------------------------------------------------------------- */

int ts_frame_put_noise_len(uint8_t out[TS_FRAME_NOISE_HEADER], size_t len) {
    if (!out)
        return TS_EINVAL;
    if (len < 1 || len > TS_FRAME_NOISE_MAX)
        return TS_ERANGE;
    out[0] = (uint8_t)(len >> 8);
    out[1] = (uint8_t)len;
    return TS_OK;
}

int ts_frame_put_app_len(uint8_t out[TS_FRAME_APP_HEADER], size_t len, uint32_t max_frame) {
    if (!out)
        return TS_EINVAL;
    if (len < 1 || len > max_frame)
        return TS_ERANGE;
    out[0] = (uint8_t)(len >> 24);
    out[1] = (uint8_t)(len >> 16);
    out[2] = (uint8_t)(len >> 8);
    out[3] = (uint8_t)len;
    return TS_OK;
}

/* ---- readers ------------------------------------------------------------------------------ */

void ts_frame_reader_init_noise(ts_frame_reader_t *r) {
    if (!r)
        return;
    memset(r, 0, sizeof *r);
    r->max = TS_FRAME_NOISE_MAX;
    r->hdr_size = TS_FRAME_NOISE_HEADER;
}

int ts_frame_reader_init_app(ts_frame_reader_t *r, uint32_t max_frame) {
    if (!r)
        return TS_EINVAL;
    memset(r, 0, sizeof *r);
    if (max_frame < 1 || max_frame > TS_FRAME_MAX_LIMIT) {
        r->failed = TS_EINVAL;
        return TS_EINVAL;
    }
    r->max = max_frame;
    r->hdr_size = TS_FRAME_APP_HEADER;
    return TS_OK;
}

void ts_frame_reader_free(ts_frame_reader_t *r) {
    if (!r)
        return;
    free(r->buf);
    r->buf = NULL;
    r->cap = 0;
    r->have = 0;
    r->delivered = 0;
}

int ts_frame_reader_idle(const ts_frame_reader_t *r) { return r && !r->failed && r->hdr_have == 0; }

size_t ts_frame_reader_held(const ts_frame_reader_t *r) { return r ? r->cap : 0; }

static const char *layer_name(const ts_frame_reader_t *r) {
    return r->hdr_size == TS_FRAME_NOISE_HEADER ? "Noise message" : "application frame";
}

/* Ends the stream: the error sticks and the buffer goes. */
static int reader_fail(ts_frame_reader_t *r, int code) {
    r->failed = code;
    ts_frame_reader_free(r);
    return code;
}

/* Makes room for need bytes of the current message (need ≤ r->len): at least doubling, at
 * least READER_MIN, never more than the message. */
static int reader_reserve(ts_frame_reader_t *r, size_t need) {
    if (need <= r->cap)
        return TS_OK;
    size_t cap = r->cap * 2;
    if (cap < READER_MIN)
        cap = READER_MIN;
    if (cap < need)
        cap = need;
    if (cap > r->len)
        cap = r->len;
    uint8_t *buf = realloc(r->buf, cap);
    if (!buf)
        return TS_ENOMEM;
    r->buf = buf;
    r->cap = cap;
    return TS_OK;
}

/* The prefix is complete: read and check the length it announces. */
static int reader_start_body(ts_frame_reader_t *r, char *err, size_t errlen) {
    uint32_t n = 0;
    for (unsigned i = 0; i < r->hdr_size; i++)
        n = n << 8 | r->hdr[i];
    if (n == 0) {
        ts_set_err(err, errlen, "protocol error: zero-length %s (%s)", layer_name(r),
                   r->hdr_size == TS_FRAME_NOISE_HEADER ? "a Noise message always carries its tag"
                                                        : "a frame always holds an Envelope");
        return reader_fail(r, TS_ECORRUPT);
    }
    if (n > r->max) {
        ts_set_err(err, errlen,
                   "protocol error: %s of %u bytes is longer than the limit of %u bytes",
                   layer_name(r), (unsigned)n, (unsigned)r->max);
        return reader_fail(r, TS_ERANGE);
    }
    r->len = n;
    r->have = 0;
    return TS_OK;
}

int ts_frame_reader_feed(ts_frame_reader_t *r, const uint8_t *in, size_t len, size_t *used,
                         const uint8_t **msg, size_t *msg_len, char *err, size_t errlen) {
    if (used)
        *used = 0;
    if (msg)
        *msg = NULL;
    if (msg_len)
        *msg_len = 0;
    if (!r || !used || !msg || !msg_len || (!in && len > 0)) {
        ts_set_err(err, errlen, "ts_frame_reader_feed: NULL argument");
        return TS_EINVAL;
    }
    if (r->failed) {
        ts_set_err(err, errlen, "the %s stream already failed (%s); close the connection",
                   layer_name(r), ts_strerror(r->failed));
        return r->failed;
    }
    if (r->delivered) { /* the caller is done with the last message */
        r->delivered = 0;
        r->have = 0;
        if (r->cap > READER_KEEP)
            ts_frame_reader_free(r);
    }

    size_t pos = 0;
    while (pos < len) {
        if (r->hdr_have < r->hdr_size) {
            r->hdr[r->hdr_have++] = in[pos++];
            if (r->hdr_have == r->hdr_size) {
                int rc = reader_start_body(r, err, errlen);
                if (rc) {
                    *used = pos;
                    return rc;
                }
            }
            continue;
        }
        size_t want = r->len - r->have, avail = len - pos;
        if (r->have == 0 && avail >= want) { /* whole in the input: hand it back in place */
            *msg = in + pos;
            *msg_len = r->len;
            r->hdr_have = 0;
            *used = pos + want;
            return TS_OK;
        }
        size_t take = avail < want ? avail : want;
        if (reader_reserve(r, r->have + take)) {
            *used = pos;
            ts_set_err(err, errlen, "out of memory buffering a %s of %u bytes", layer_name(r),
                       (unsigned)r->len);
            return TS_ENOMEM;
        }
        memcpy(r->buf + r->have, in + pos, take);
        r->have += take;
        pos += take;
        if (r->have == r->len) {
            *msg = r->buf;
            *msg_len = r->len;
            r->hdr_have = 0;
            r->delivered = 1;
            break;
        }
    }
    *used = pos;
    return TS_OK;
}

uint8_t *ts_frame_reader_body_space(ts_frame_reader_t *r, size_t n) {
    if (!r || r->failed || n == 0 || r->hdr_have < r->hdr_size || n > r->len - r->have)
        return NULL;
    if (reader_reserve(r, r->have + n))
        return NULL;
    return r->buf + r->have;
}

void ts_frame_reader_commit(ts_frame_reader_t *r, size_t n, const uint8_t **msg, size_t *msg_len) {
    *msg = NULL;
    *msg_len = 0;
    r->have += n;
    if (r->have == r->len) {
        *msg = r->buf;
        *msg_len = r->len;
        r->hdr_have = 0;
        r->delivered = 1;
    }
}
