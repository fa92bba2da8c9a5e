/*
 * conn.c — encrypted TCP connections on libuv (see conn.h for the contract).
 *
 * How the pieces fit. Bytes arrive in read_cb, into one 256 KiB buffer shared by every
 * connection of the net (libuv calls alloc_cb and read_cb back to back for one stream, and
 * everything runs on one thread, so one buffer serves all). A Noise-message reader
 * (ts_frame_reader_t, 2-byte prefixes) cuts them into Noise messages; a message that lies whole
 * in one read is handed back in place, so only those that straddle two reads are copied (with
 * reads of up to four full-size messages, a minority). During the handshake the reader's limit
 * is set to the one legal size of the message expected next, so a wrong length is refused at
 * its prefix, before anything is buffered; each message goes to the Noise state machine. Once
 * OPEN, each transport message is decrypted and its plaintext goes to the application-frame
 * reader (4-byte prefixes, max_frame), which hands complete frames to on_frame. A plaintext
 * that falls inside the body of the frame being reassembled is decrypted straight into that
 * reader's buffer (ts_frame_reader_body_space); any other — one holding a prefix or the end of
 * a frame and the start of the next — is decrypted into a second shared buffer and fed from
 * there. Nothing is decrypted before the handshake is complete, and nothing reaches on_frame
 * that did not decrypt under the session's keys (libsodium checks the tag before it writes a
 * byte of plaintext).
 *
 * Writing: a frame is its 4-byte prefix and the caller's parts, cut into plaintexts of at most
 * 65519 bytes, each sealed into one buffer laid out as [len16 ‖ ciphertext]… and handed to
 * uv_write as one request. A plaintext that lies whole in one of the caller's parts is sealed
 * from where it lies; only one that straddles parts (the first, which holds the prefix, and any
 * that crosses a boundary between parts) is gathered into its slot first and sealed in place.
 * The buffer then holds only what goes on the wire, so it is freed without wiping. The bytes
 * waiting in uv_write requests are the write queue; past write_high_water the connection stops
 * reading.
 *
 * Closing is two-phase. ts_conn__fail/ts_conn_close record why, wipe the secrets at once, and
 * close the libuv handles; from then on no frame is delivered and nothing is sent. When the last
 * handle's close callback has run (libuv first cancels the pending connect and writes), the
 * owner's on_close runs from the loop and the connection is freed. So a connection's memory
 * stays valid for the whole of any callback, even one that closes it.
 *
 * The context a connection belongs to (ts_net_t) and the listeners that accept connections,
 * with the connection limits, are in net.c; conn_internal.h holds the structs both share.
 */
#define _POSIX_C_SOURCE 200809L /* uv.h needs POSIX types (pthread_rwlock_t, addrinfo) */

#include "net/conn.h"

#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/conn_internal.h"

/* The handshake's messages have one legal size each (docs/protocol.md §2.2). */
#define HS_MSG1 48u
#define HS_MSG2 193u
#define HS_MSG3 161u

/* A write: the uv request and the bytes it writes. */
typedef struct wreq {
    uv_write_t req;
    ts_conn_t *c;
    size_t len;
    uint8_t data[];
} wreq_t;

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);

/* ---- names ---------------------------------------------------------------------------------- */

const char *ts_conn_close_reason_name(ts_conn_close_reason_t r) {
    static const char *const names[TS_CONN_CLOSE_REASONS] = {
        "local",     "eof",      "io",      "handshake-timeout", "idle-timeout",
        "handshake", "identity", "decrypt", "framing",           "protocol",
        "nomem",     "evicted",  "budget"};
    return (unsigned)r < TS_CONN_CLOSE_REASONS ? names[r] : "unknown";
}

/* ---- closing -------------------------------------------------------------------------------- */

static void conn_finish(ts_conn_t *c) {
    ts_net_t *net = c->net;
    ts_list_remove(&c->node);
    ts_frame_reader_free(&c->noise_rd);
    ts_frame_reader_free(&c->app_rd);
    net->st.partial_bytes -= c->partial_held;
    net->st.live--;
    if (c->accepted && !c->refused)
        net->st.live_accepted--;
    c->why.message = c->why_msg;
    c->why.frames_in = c->frames_in;
    /* the initiator's handshake completes when it sends message 3, before the responder checks
     * the psk in it: a responder that closes before any frame is a failed handshake too */
    int silent_close = !c->accepted && c->why.was_open && c->frames_in == 0 &&
                       (c->why.reason == TS_CONN_CLOSE_EOF || c->why.reason == TS_CONN_CLOSE_IO);
    if (!c->refused && c->why.reason != TS_CONN_CLOSE_LOCAL && (!c->why.was_open || silent_close) &&
        net->hs_fail)
        net->hs_fail(net->hs_fail_arg, c->addr, c->accepted, &c->why);
    if (!c->refused && c->h.on_close)
        c->h.on_close(c, &c->why);
    sodium_memzero(c, sizeof *c);
    free(c);
}

static void conn_handle_closed(uv_handle_t *h) {
    ts_conn_t *c = h->data;
    if (--c->handles_open == 0 && !c->gai_pending)
        conn_finish(c);
}

/* Starts closing c for the given reason; the first reason recorded wins. */
void ts_conn__fail(ts_conn_t *c, ts_conn_close_reason_t reason, int code, const char *fmt, ...) {
    if (c->state == ST_CLOSING)
        return;
    c->why.was_open = c->state == ST_OPEN;
    c->state = ST_CLOSING;
    c->why.reason = reason;
    c->why.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why_msg, sizeof c->why_msg, fmt, ap);
    va_end(ap);
    if (!c->refused)
        c->net->st.closed[reason]++;
    /* The secrets die now; the readers (which may be mid-delivery) go in conn_finish. */
    ts_noise_handshake_wipe(&c->hs);
    ts_noise_transport_wipe(&c->tr);
    if (c->gai_pending)
        uv_cancel((uv_req_t *)&c->gai);
    uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
}

void ts_conn_close(ts_conn_t *c) {
    if (c)
        ts_conn__fail(c, TS_CONN_CLOSE_LOCAL, TS_ECLOSED, "closed by this side");
}

void ts_conn_close_protocol(ts_conn_t *c, const char *message) {
    if (c)
        ts_conn__fail(c, TS_CONN_CLOSE_PROTOCOL, TS_ECORRUPT, "protocol error from %s: %s", c->addr,
                      message ? message : "(no detail)");
}

/* ---- timers --------------------------------------------------------------------------------- */

void ts_conn__handshake_timeout_cb(uv_timer_t *t) {
    ts_conn_t *c = t->data;
    ts_conn__fail(c, TS_CONN_CLOSE_HANDSHAKE_TIMEOUT, TS_ETIMEDOUT,
                  "%s did not complete the handshake within %u ms", c->addr,
                  (unsigned)c->net->cfg.handshake_timeout_ms);
}

static void idle_cb(uv_timer_t *t) {
    ts_conn_t *c = t->data;
    uint64_t idle = c->net->cfg.idle_timeout_ms, now = uv_now(c->net->loop);
    uint64_t quiet = now - c->last_activity;
    if (c->pending > 0 || quiet < idle) { /* busy, or active since the timer was set */
        uv_timer_start(&c->timer, idle_cb, c->pending > 0 ? idle : idle - quiet, 0);
        return;
    }
    ts_conn__fail(c, TS_CONN_CLOSE_IDLE_TIMEOUT, TS_ETIMEDOUT,
                  "the connection with %s was idle for %u ms", c->addr, (unsigned)idle);
}

/* The stream ended (UV_EOF) or failed (a reset, a broken pipe, ...) under c. Says what is most
 * likely behind it: a responder that breaks off after message 3 of the handshake is one that
 * holds another network key, and the initiator learns it only this way (protocol.md §2.1). */
static void peer_gone(ts_conn_t *c, int uverr, const char *doing) {
    ts_conn_close_reason_t reason = uverr == UV_EOF ? TS_CONN_CLOSE_EOF : TS_CONN_CLOSE_IO;
    int code = uverr == UV_EOF ? TS_ECLOSED : TS_EIO;
    const char *what = uverr == UV_EOF ? "closed the connection" : uv_strerror(uverr);
    if (c->state == ST_HANDSHAKE)
        ts_conn__fail(c, reason, code,
                      "%s: %s during the handshake (its connection limit, or not a tessera node?)",
                      c->addr, what);
    else if (c->initiator && c->frames_in == 0)
        ts_conn__fail(c, reason, code,
                      "%s: %s right after the handshake, before sending anything: a wrong network "
                      "key?",
                      c->addr, what);
    else if (uverr == UV_EOF)
        ts_conn__fail(c, reason, code, "%s closed the connection", c->addr);
    else
        ts_conn__fail(c, reason, code, "%s %s failed: %s", doing, c->addr, what);
}

/* ---- writing -------------------------------------------------------------------------------- */

static void write_cb(uv_write_t *req, int status) {
    wreq_t *w = TS_CONTAINER_OF(req, wreq_t, req);
    ts_conn_t *c = w->c;
    c->queued -= w->len;
    free(w); /* ciphertext and lengths: what the wire carried, nothing to wipe */
    if (c->state == ST_CLOSING)
        return;
    if (status < 0) {
        peer_gone(c, status, "writing to");
        return;
    }
    if (c->paused && c->queued <= c->net->cfg.write_high_water / 2) {
        c->paused = 0;
        int rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
        if (rc) {
            ts_conn__fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot read from %s: %s", c->addr,
                          uv_strerror(rc));
            return;
        }
        if (c->h.on_drain)
            c->h.on_drain(c);
    }
}

/* Hands w to libuv and accounts for it; closes c when libuv refuses. */
static int conn_write(ts_conn_t *c, wreq_t *w) {
    w->c = c;
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, write_cb);
    if (rc == 0)
        c->net->st.bytes_out += w->len;
    if (rc < 0) {
        free(w);
        ts_conn__fail(c, TS_CONN_CLOSE_IO, TS_EIO, "writing to %s failed: %s", c->addr,
                      uv_strerror(rc));
        return TS_ECLOSED;
    }
    ts_net_t *net = c->net;
    c->queued += w->len;
    if (c->queued > net->st.write_queue_peak)
        net->st.write_queue_peak = c->queued;
    if (!c->paused && c->queued > net->cfg.write_high_water && c->state == ST_OPEN) {
        c->paused = 1;
        net->st.read_pauses++;
        uv_read_stop((uv_stream_t *)&c->tcp);
    }
    return TS_OK;
}

/* Sends one handshake message (len16 ‖ msg, in clear: the handshake encrypts its own parts). */
static int send_handshake_message(ts_conn_t *c, const uint8_t *msg, size_t len) {
    wreq_t *w = malloc(sizeof *w + TS_FRAME_NOISE_HEADER + len);
    if (!w) {
        ts_conn__fail(c, TS_CONN_CLOSE_NOMEM, TS_ENOMEM, "out of memory");
        return TS_ENOMEM;
    }
    ts_frame_put_noise_len(w->data, len);
    memcpy(w->data + TS_FRAME_NOISE_HEADER, msg, len);
    w->len = TS_FRAME_NOISE_HEADER + len;
    return conn_write(c, w);
}

int ts_conn_sendv(ts_conn_t *c, const ts_conn_part_t *parts, size_t n) {
    if (!c || (!parts && n))
        return TS_EINVAL;
    if (c->state != ST_OPEN)
        return TS_ECLOSED;
    size_t body = 0;
    for (size_t i = 0; i < n; i++)
        body += parts[i].len;
    uint8_t prefix[TS_FRAME_APP_HEADER];
    if (ts_frame_put_app_len(prefix, body, c->net->cfg.max_frame))
        return TS_ERANGE;
    const size_t pmax = TS_FRAME_NOISE_PLAINTEXT_MAX, total = TS_FRAME_APP_HEADER + body;
    size_t msgs = (total + pmax - 1) / pmax;
    size_t out_len = total + msgs * (TS_FRAME_NOISE_HEADER + TS_FRAME_NOISE_TAG);
    wreq_t *w = malloc(sizeof *w + out_len);
    if (!w)
        return TS_ENOMEM;
    w->len = out_len;

    /* A cursor over prefix, parts[0], parts[1], ... */
    size_t part = 0, off = 0, pos = 0, left = total;
    const uint8_t *src = prefix;
    size_t src_len = TS_FRAME_APP_HEADER;
    while (left > 0) {
        size_t chunk = left < pmax ? left : pmax, filled = 0;
        uint8_t *slot = w->data + pos + TS_FRAME_NOISE_HEADER;
        const uint8_t *pt = slot;
        while (off == src_len) { /* the next non-empty piece: left > 0, so there is one */
            src = parts[part].data;
            src_len = parts[part].len;
            part++;
            off = 0;
        }
        if (src_len - off >= chunk) { /* whole in one piece: sealed from there */
            pt = src + off;
            off += chunk;
            filled = chunk;
        }
        while (filled < chunk) {  /* gathered into the slot */
            if (off == src_len) { /* next non-empty piece */
                src = parts[part].data;
                src_len = parts[part].len;
                part++;
                off = 0;
                continue;
            }
            size_t take = src_len - off < chunk - filled ? src_len - off : chunk - filled;
            memcpy(slot + filled, src + off, take);
            filled += take;
            off += take;
        }
        size_t ct_len = 0;
        int rc = ts_noise_transport_encrypt(&c->tr, pt, chunk, slot, chunk + TS_FRAME_NOISE_TAG,
                                            &ct_len);
        if (rc) { /* nonces exhausted: part of a frame is gone, the stream cannot go on */
            free(w);
            ts_conn__fail(c, TS_CONN_CLOSE_LOCAL, rc, "cannot encrypt for %s: %s", c->addr,
                          ts_strerror(rc));
            return TS_ECLOSED;
        }
        ts_frame_put_noise_len(w->data + pos, ct_len);
        pos += TS_FRAME_NOISE_HEADER + ct_len;
        left -= chunk;
    }
    c->net->st.frames_out++;
    c->last_activity = uv_now(c->net->loop);
    return conn_write(c, w);
}

/* ---- the handshake -------------------------------------------------------------------------- */

static void conn_open(ts_conn_t *c) {
    ts_net_t *net = c->net;
    int rc = ts_noise_handshake_split(&c->hs, &c->tr);
    if (rc) {
        ts_conn__fail(c, TS_CONN_CLOSE_HANDSHAKE, rc, "handshake with %s: split failed", c->addr);
        return;
    }
    c->state = ST_OPEN;
    c->noise_rd.max = TS_FRAME_NOISE_MAX;
    net->st.opened++;
    c->last_activity = uv_now(net->loop);
    uv_timer_stop(&c->timer);
    if (net->cfg.idle_timeout_ms)
        uv_timer_start(&c->timer, idle_cb, net->cfg.idle_timeout_ms, 0);
    if (c->h.on_open)
        c->h.on_open(c);
}

/* Writes this side's next handshake message (payload: our identity, or nothing for message 1)
 * and sends it. */
static int handshake_write(ts_conn_t *c, int with_identity) {
    uint8_t payload[TS_IDENTITY_PAYLOAD_BYTES], msg[HS_MSG2];
    size_t len = 0;
    if (with_identity)
        ts_identity_payload(&c->net->id, payload);
    int rc = ts_noise_handshake_write_message(&c->hs, payload, with_identity ? sizeof payload : 0,
                                              msg, sizeof msg, &len);
    if (rc) {
        ts_conn__fail(c, TS_CONN_CLOSE_HANDSHAKE, rc, "handshake with %s: %s", c->addr,
                      ts_strerror(rc));
        return rc;
    }
    return send_handshake_message(c, msg, len);
}

/* Checks the identity payload of the message just read, against the static key it carried. */
static int handshake_check_peer(ts_conn_t *c, const uint8_t *payload, size_t len) {
    uint8_t rs[TS_NOISE_DHLEN];
    char err[160] = "";
    int rc = ts_noise_handshake_remote_static(&c->hs, rs);
    if (rc == TS_OK)
        rc = ts_identity_payload_verify(payload, len, rs, &c->peer, err, sizeof err);
    if (rc) {
        ts_conn__fail(c, TS_CONN_CLOSE_IDENTITY, rc,
                      "%s sent an identity that does not match its handshake key: %s", c->addr,
                      err);
        return rc;
    }
    if (c->has_expect && memcmp(c->peer.b, c->expect.b, sizeof c->peer.b) != 0) {
        char got[TS_NODE_ID_HEX], want[TS_NODE_ID_HEX];
        ts_node_id_hex(&c->peer, 16, got);
        ts_node_id_hex(&c->expect, 16, want);
        ts_conn__fail(c, TS_CONN_CLOSE_IDENTITY, TS_ECORRUPT,
                      "%s proved node %s…, not %s… as expected (a stale address, or a relay "
                      "answering for the node)",
                      c->addr, got, want);
        return TS_ECORRUPT;
    }
    c->has_peer = 1;
    return TS_OK;
}

static void handshake_message(ts_conn_t *c, const uint8_t *msg, size_t len) {
    uint8_t payload[HS_MSG2];
    size_t plen = 0;
    int rc = ts_noise_handshake_read_message(&c->hs, msg, len, payload, sizeof payload, &plen);
    if (rc) {
        /* The responder's read of message 3 is where a wrong network key shows (protocol.md
         * §2.1); every read also fails on a tampered message or a different prologue. */
        ts_conn__fail(c, TS_CONN_CLOSE_HANDSHAKE, rc,
                      "the handshake with %s failed: message %d did not decrypt%s", c->addr,
                      c->initiator ? 2 : (c->hs_step == 0 ? 1 : 3),
                      !c->initiator && c->hs_step == 1 ? " (the peer has a different network key?)"
                                                       : "");
        return;
    }
    c->hs_step++;
    if (c->initiator) { /* message 2 read: check, answer with message 3, done */
        if (handshake_check_peer(c, payload, plen) || handshake_write(c, 1))
            return;
        conn_open(c);
    } else if (c->hs_step == 1) { /* message 1 read: it carries nothing */
        if (plen != 0) {
            ts_conn__fail(c, TS_CONN_CLOSE_HANDSHAKE, TS_ECORRUPT,
                          "%s sent a payload in handshake message 1", c->addr);
            return;
        }
        if (handshake_write(c, 1))
            return;
        c->noise_rd.max = HS_MSG3;
    } else { /* message 3 read */
        if (handshake_check_peer(c, payload, plen))
            return;
        conn_open(c);
    }
    sodium_memzero(payload, sizeof payload);
}

/* ---- reading -------------------------------------------------------------------------------- */

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    ts_conn_t *c = h->data;
    *buf = uv_buf_init((char *)c->net->rbuf, READ_BUF);
}

static void deliver_frame(ts_conn_t *c, const uint8_t *frame, size_t len) {
    ts_net_t *net = c->net;
    c->frames_in++;
    net->st.frames_in++;
    c->last_activity = uv_now(net->loop);
    if (c->h.on_frame)
        c->h.on_frame(c, frame, len);
}

/* The app reader's buffer into the node-wide account of partly received frames; closes c when
 * a frame under way would take the account over max_partial_bytes. */
static void account_partial(ts_conn_t *c) {
    ts_net_t *net = c->net;
    size_t now = c->app_rd.cap;
    net->st.partial_bytes = net->st.partial_bytes - c->partial_held + now;
    c->partial_held = now;
    if (net->cfg.max_partial_bytes && net->st.partial_bytes > net->cfg.max_partial_bytes &&
        c->app_rd.hdr_have == c->app_rd.hdr_size && c->app_rd.have < c->app_rd.len)
        ts_conn__fail(c, TS_CONN_CLOSE_BUDGET, TS_ERANGE,
                      "%s sends a frame of %u bytes while the node already holds %zu bytes of "
                      "partly received frames (limit %zu): refused",
                      c->addr, c->app_rd.len, net->st.partial_bytes, net->cfg.max_partial_bytes);
}

/* One transport message: decrypt, then deliver the frames its plaintext completes. */
static void transport_message(ts_conn_t *c, const uint8_t *msg, size_t len) {
    ts_net_t *net = c->net;
    /* A plaintext inside the body of the frame under way goes straight into its buffer. */
    size_t plen = len > TS_FRAME_NOISE_TAG ? len - TS_FRAME_NOISE_TAG : 0;
    uint8_t *direct = plen ? ts_frame_reader_body_space(&c->app_rd, plen) : NULL;
    uint8_t *out = direct ? direct : net->pbuf;
    int rc =
        ts_noise_transport_decrypt(&c->tr, msg, len, out, direct ? plen : sizeof net->pbuf, &plen);
    if (rc) {
        ts_conn__fail(c, TS_CONN_CLOSE_DECRYPT, rc,
                      "a message from %s failed to decrypt (tampered, replayed or reordered)",
                      c->addr);
        return;
    }
    if (direct) {
        const uint8_t *frame;
        size_t flen;
        ts_frame_reader_commit(&c->app_rd, plen, &frame, &flen);
        if (frame)
            deliver_frame(c, frame, flen);
        if (c->state == ST_OPEN)
            account_partial(c);
        return;
    }
    size_t pos = 0;
    while (pos < plen && c->state == ST_OPEN) {
        const uint8_t *frame;
        size_t used = 0, flen = 0;
        char err[160] = "";
        rc = ts_frame_reader_feed(&c->app_rd, net->pbuf + pos, plen - pos, &used, &frame, &flen,
                                  err, sizeof err);
        pos += used;
        if (rc) {
            ts_conn__fail(c, rc == TS_ENOMEM ? TS_CONN_CLOSE_NOMEM : TS_CONN_CLOSE_FRAMING, rc,
                          "%s: %s", c->addr, err);
            return;
        }
        if (!frame)
            break;
        deliver_frame(c, frame, flen);
    }
    if (c->state == ST_OPEN)
        account_partial(c); /* the buffer as it is now: grown, or freed after a large frame */
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    ts_conn_t *c = s->data;
    if (c->state == ST_CLOSING || nread == 0)
        return;
    if (nread < 0) {
        peer_gone(c, (int)nread, "reading from");
        return;
    }
    const uint8_t *in = (const uint8_t *)buf->base;
    size_t len = (size_t)nread, pos = 0;
    c->net->st.bytes_in += len;
    c->bytes_in += len;
    while (pos < len && (c->state == ST_HANDSHAKE || c->state == ST_OPEN)) {
        const uint8_t *msg;
        size_t used = 0, mlen = 0;
        char err[160] = "";
        int rc = ts_frame_reader_feed(&c->noise_rd, in + pos, len - pos, &used, &msg, &mlen, err,
                                      sizeof err);
        pos += used;
        if (rc) {
            if (c->state == ST_HANDSHAKE && rc == TS_ERANGE)
                ts_conn__fail(c, TS_CONN_CLOSE_HANDSHAKE, TS_ECORRUPT,
                              "%s sent a handshake message of the wrong size (%u bytes announced, "
                              "%u expected): not a tessera peer?",
                              c->addr, (unsigned)(c->noise_rd.hdr[0] << 8 | c->noise_rd.hdr[1]),
                              (unsigned)c->noise_rd.max);
            else
                ts_conn__fail(c, rc == TS_ENOMEM ? TS_CONN_CLOSE_NOMEM : TS_CONN_CLOSE_FRAMING, rc,
                              "%s: %s", c->addr, err);
            return;
        }
        if (!msg)
            break;
        if (c->state == ST_HANDSHAKE) {
            if (mlen != c->noise_rd.max) { /* shorter than the one legal size */
                ts_conn__fail(c, TS_CONN_CLOSE_HANDSHAKE, TS_ECORRUPT,
                              "%s sent a handshake message of %zu bytes, %u expected", c->addr,
                              mlen, (unsigned)c->noise_rd.max);
                return;
            }
            handshake_message(c, msg, mlen);
        } else {
            transport_message(c, msg, mlen);
        }
    }
}

/* ---- creating connections ------------------------------------------------------------------- */

ts_conn_t *ts_conn__new(ts_net_t *net, const ts_conn_handler_t *h, void *data) {
    ts_conn_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->net = net;
    if (h)
        c->h = *h;
    c->data = data;
    c->state = ST_CONNECTING;
    ts_frame_reader_init_noise(&c->noise_rd);
    ts_frame_reader_init_app(&c->app_rd, net->cfg.max_frame);
    uv_tcp_init(net->loop, &c->tcp);
    uv_timer_init(net->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->handles_open = 2;
    ts_list_push(&net->conns, &c->node);
    net->st.live++;
    return c;
}

/* The socket is connected (either side): set it up and start the handshake. */
void ts_conn__start(ts_conn_t *c) {
    ts_net_t *net = c->net;
    uv_tcp_nodelay(&c->tcp, 1);
    if (net->cfg.keepalive_s)
        uv_tcp_keepalive(&c->tcp, 1, net->cfg.keepalive_s);
    if (net->cfg.so_sndbuf > 0) {
        int v = net->cfg.so_sndbuf;
        uv_send_buffer_size((uv_handle_t *)&c->tcp, &v);
    }
    c->state = ST_HANDSHAKE;
    int rc = ts_identity_handshake_init(&c->hs, &net->id, &net->nk, c->initiator);
    if (rc) {
        ts_conn__fail(c, TS_CONN_CLOSE_HANDSHAKE, rc, "cannot start a handshake: %s",
                      ts_strerror(rc));
        return;
    }
    c->noise_rd.max = c->initiator ? HS_MSG2 : HS_MSG1;
    rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
    if (rc) {
        ts_conn__fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot read from %s: %s", c->addr,
                      uv_strerror(rc));
        return;
    }
    if (c->initiator)
        handshake_write(c, 0);
}

static void connect_cb(uv_connect_t *req, int status) {
    ts_conn_t *c = req->data;
    if (c->state == ST_CLOSING)
        return;
    if (status < 0) {
        ts_conn__fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot connect to %s: %s", c->addr,
                      uv_strerror(status));
        return;
    }
    if (c->preamble_len) { /* in clear, before the handshake: queued ahead of its first message */
        wreq_t *w = malloc(sizeof *w + c->preamble_len);
        if (!w) {
            ts_conn__fail(c, TS_CONN_CLOSE_NOMEM, TS_ENOMEM, "out of memory");
            return;
        }
        memcpy(w->data, c->preamble, c->preamble_len);
        w->len = c->preamble_len;
        if (conn_write(c, w))
            return;
    }
    ts_conn__start(c);
}

static void connect_to(ts_conn_t *c, const struct sockaddr *sa) {
    c->connect_req.data = c;
    int rc = uv_tcp_connect(&c->connect_req, &c->tcp, sa, connect_cb);
    if (rc)
        ts_conn__fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot connect to %s: %s", c->addr,
                      uv_strerror(rc));
}

static void resolved_cb(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
    ts_conn_t *c = req->data;
    c->gai_pending = 0;
    if (c->state == ST_CLOSING) {
        uv_freeaddrinfo(res);
        if (c->handles_open == 0) /* the handles closed while we were resolving */
            conn_finish(c);
        return;
    }
    if (status < 0 || !res) {
        ts_conn__fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot resolve %s: %s", c->addr,
                      uv_strerror(status));
    } else {
        connect_to(c, res->ai_addr);
    }
    uv_freeaddrinfo(res);
}

int ts_conn_connect(ts_net_t *net, const char *addr, const ts_conn_handler_t *h, void *arg,
                    ts_conn_t **out, char *err, size_t errlen) {
    return ts_conn_connect_ex(net, addr, NULL, h, arg, out, err, errlen);
}

int ts_conn_connect_ex(ts_net_t *net, const char *addr, const ts_conn_connect_opts_t *opts,
                       const ts_conn_handler_t *h, void *arg, ts_conn_t **out, char *err,
                       size_t errlen) {
    if (!net || !addr || !out) {
        ts_set_err(err, errlen, "ts_conn_connect: NULL argument");
        return TS_EINVAL;
    }
    *out = NULL;
    if (opts &&
        (opts->preamble_len > TS_CONN_PREAMBLE_MAX || (opts->preamble_len && !opts->preamble))) {
        ts_set_err(err, errlen, "ts_conn_connect: a preamble of %zu bytes (at most %d)",
                   opts->preamble_len, TS_CONN_PREAMBLE_MAX);
        return TS_EINVAL;
    }
    char host[256];
    int port;
    int rc = ts_net_parse_addr(addr, host, sizeof host, &port, 0, err, errlen);
    if (rc)
        return rc;
    ts_conn_t *c = ts_conn__new(net, h, arg);
    if (!c)
        return TS_ENOMEM;
    c->initiator = !(opts && opts->responder);
    if (opts && opts->preamble_len) {
        memcpy(c->preamble, opts->preamble, opts->preamble_len);
        c->preamble_len = (uint8_t)opts->preamble_len;
    }
    if (opts && opts->expect) {
        c->expect = *opts->expect;
        c->has_expect = 1;
    }
    snprintf(c->addr, sizeof c->addr, "%s", addr);
    net->st.connects++;
    uv_update_time(net->loop); /* a dial may come long after the loop last looked at the clock */
    uv_timer_start(&c->timer, ts_conn__handshake_timeout_cb, net->cfg.handshake_timeout_ms, 0);
    struct sockaddr_storage ss;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) == 0 ||
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) == 0) {
        connect_to(c, (struct sockaddr *)&ss);
    } else {
        struct addrinfo hints;
        char ps[8];
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        snprintf(ps, sizeof ps, "%d", port);
        c->gai.data = c;
        rc = uv_getaddrinfo(net->loop, &c->gai, resolved_cb, host, ps, &hints);
        if (rc)
            ts_conn__fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot resolve %s: %s", addr,
                          uv_strerror(rc));
        else
            c->gai_pending = 1;
    }
    *out = c;
    return TS_OK;
}

/* ---- accessors ------------------------------------------------------------------------------ */

int ts_conn_congested(const ts_conn_t *c) { return c && c->queued > c->net->cfg.write_high_water; }
size_t ts_conn_write_queued(const ts_conn_t *c) { return c ? c->queued : 0; }
void ts_conn_set_pending(ts_conn_t *c, size_t pending) {
    if (c)
        c->pending = pending;
}
int ts_conn_is_open(const ts_conn_t *c) { return c && c->state == ST_OPEN; }
int ts_conn_is_initiator(const ts_conn_t *c) { return c && c->initiator; }
int ts_conn_peer_id(const ts_conn_t *c, ts_node_id_t *out) {
    if (!c || !out || !c->has_peer || c->state != ST_OPEN)
        return TS_ENOTFOUND;
    *out = c->peer;
    return TS_OK;
}

const char *ts_conn_peer_addr(const ts_conn_t *c) { return c ? c->addr : ""; }
int ts_conn_handshake_hash(const ts_conn_t *c, uint8_t out[TS_NOISE_HASHLEN]) {
    if (!c || !out || c->state != ST_OPEN)
        return TS_ENOTFOUND;
    memcpy(out, c->tr.handshake_hash, TS_NOISE_HASHLEN);
    return TS_OK;
}
ts_net_t *ts_conn_net(const ts_conn_t *c) { return c ? c->net : NULL; }
void *ts_conn_data(const ts_conn_t *c) { return c ? c->data : NULL; }
void ts_conn_set_data(ts_conn_t *c, void *data) {
    if (c)
        c->data = data;
}
