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
 * Closing is two-phase. conn_fail/ts_conn_close record why, wipe the secrets at once, and close
 * the libuv handles; from then on no frame is delivered and nothing is sent. When the last
 * handle's close callback has run (libuv first cancels the pending connect and writes), the
 * owner's on_close runs from the loop and the connection is freed. So a connection's memory
 * stays valid for the whole of any callback, even one that closes it.
 */
#define _POSIX_C_SOURCE 200809L /* uv.h needs POSIX types (pthread_rwlock_t, addrinfo) */

#include "net/conn.h"

#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/error.h"
#include "base/list.h"
#include "net/frame.h"

#define READ_BUF (256u << 10) /* four full-size Noise messages and change per read */
/* The handshake's messages have one legal size each (docs/protocol.md §2.2). */
#define HS_MSG1 48u
#define HS_MSG2 193u
#define HS_MSG3 161u

typedef enum { ST_CONNECTING, ST_HANDSHAKE, ST_OPEN, ST_CLOSING } conn_state_t;

struct ts_net {
    uv_loop_t *loop;
    ts_identity_t id;
    ts_netkey_t nk;
    ts_net_config_t cfg;
    ts_list_t conns, listeners;
    ts_net_stats_t st;
    uint8_t rbuf[READ_BUF];                     /* every connection's reads */
    uint8_t pbuf[TS_FRAME_NOISE_PLAINTEXT_MAX]; /* every connection's decrypted plaintext */
    ts_net_handshake_fail_fn hs_fail;           /* ts_net_on_handshake_failure */
    void *hs_fail_arg;
};

struct ts_listener {
    ts_list_t node; /* in net->listeners */
    ts_net_t *net;
    uv_tcp_t tcp;
    uv_tcp_t spare; /* accepts and closes a socket there is no memory to serve */
    int handles;    /* open uv handles (tcp, spare); the listener is freed when they close */
    int spare_busy; /* spare is closing: a connection waits in libuv until it is done */
    int stalled;    /* a connection was left pending while spare was busy */
    int closing;
    ts_conn_handler_t h;
    void *arg;
    int port;
};

struct ts_conn {
    ts_list_t node; /* in net->conns */
    ts_net_t *net;
    ts_listener_t *listener; /* accepted by it (NULL once it closes, and for outgoing ones) */
    ts_conn_handler_t h;
    void *data;
    uv_tcp_t tcp;
    uv_timer_t timer; /* the handshake timeout, then the idle timeout */
    uv_connect_t connect_req;
    uv_getaddrinfo_t gai;
    int gai_pending;  /* a name resolution is under way (its callback must run before free) */
    int handles_open; /* tcp and timer, until their close callbacks */
    conn_state_t state;
    uint8_t initiator, accepted, refused, paused, has_peer;
    size_t partial_held; /* app_rd.cap as counted in net->st.partial_bytes */
    uint8_t hs_step;     /* handshake messages processed so far */
    ts_noise_handshake_t hs;
    ts_noise_transport_t tr;
    ts_frame_reader_t noise_rd, app_rd;
    ts_node_id_t peer;
    char addr[64]; /* "ip:port" of the peer */
    char ip[48];   /* its IP alone, for max_conns_per_addr */
    size_t queued, pending;
    uint64_t last_activity; /* uv_now of the last frame in or out */
    uint64_t bytes_in;      /* bytes read from its socket */
    uint64_t frames_in;
    ts_conn_close_info_t why;
    char why_msg[320];
};

/* A write: the uv request and the bytes it writes. */
typedef struct wreq {
    uv_write_t req;
    ts_conn_t *c;
    size_t len;
    uint8_t data[];
} wreq_t;

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);

/* ---- config, names ---------------------------------------------------------------------------- */

void ts_net_config_default(ts_net_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->handshake_timeout_ms = 10000;
    cfg->idle_timeout_ms = 120000;
    cfg->keepalive_s = 30;
    cfg->max_frame = TS_FRAME_MAX_DEFAULT;
    cfg->write_high_water = (size_t)4 << 20;
    cfg->max_conns = 1024;
    cfg->max_conns_per_addr = 32;
    cfg->max_partial_bytes = (size_t)1 << 30;
}

const char *ts_conn_close_reason_name(ts_conn_close_reason_t r) {
    static const char *const names[TS_CONN_CLOSE_REASONS] = {
        "local",     "eof",      "io",      "handshake-timeout", "idle-timeout",
        "handshake", "identity", "decrypt", "framing",           "protocol",
        "nomem",     "evicted",  "budget"};
    return (unsigned)r < TS_CONN_CLOSE_REASONS ? names[r] : "unknown";
}

int ts_net_parse_addr(const char *addr, char *host, size_t host_len, int *port, int allow_zero,
                      char *err, size_t errlen) {
    if (!addr || !host || !port) {
        ts_set_err(err, errlen, "ts_net_parse_addr: NULL argument");
        return TS_EINVAL;
    }
    const char *colon = strrchr(addr, ':'), *h = addr;
    size_t hl;
    if (!colon || colon == addr) {
        ts_set_err(err, errlen, "'%s' is not an address: want HOST:PORT", addr);
        return TS_EINVAL;
    }
    hl = (size_t)(colon - addr);
    if (addr[0] == '[') { /* [v6]:port */
        if (hl < 3 || addr[hl - 1] != ']') {
            ts_set_err(err, errlen, "'%s' is not an address: want [IPv6]:PORT", addr);
            return TS_EINVAL;
        }
        h = addr + 1;
        hl -= 2;
    } else if (memchr(addr, ':', hl)) {
        ts_set_err(err, errlen, "'%s': put an IPv6 address in brackets, [::1]:PORT", addr);
        return TS_EINVAL;
    }
    if (hl == 0 || hl >= host_len) {
        ts_set_err(err, errlen, "'%s': the host is empty or too long", addr);
        return TS_EINVAL;
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || p < (allow_zero ? 0 : 1) || p > 65535) {
        ts_set_err(err, errlen, "'%s': the port must be a number in %d..65535", addr,
                   allow_zero ? 0 : 1);
        return TS_EINVAL;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return TS_OK;
}

/* ---- the context ---------------------------------------------------------------------------- */

int ts_net_new(ts_net_t **out, uv_loop_t *loop, const ts_identity_t *id, const ts_netkey_t *nk,
               const ts_net_config_t *cfg) {
    if (!out || !loop || !id || !nk)
        return TS_EINVAL;
    *out = NULL;
    ts_net_config_t c;
    if (cfg)
        c = *cfg;
    else
        ts_net_config_default(&c);
    if (c.max_frame < 1 || c.max_frame > TS_FRAME_MAX_LIMIT || c.handshake_timeout_ms == 0 ||
        c.max_conns == 0 || c.max_conns_per_addr == 0 || c.write_high_water == 0)
        return TS_EINVAL;
    if (sodium_init() < 0)
        return TS_EIO;
    ts_net_t *net = calloc(1, sizeof *net);
    if (!net)
        return TS_ENOMEM;
    net->loop = loop;
    net->id = *id;
    net->nk = *nk;
    net->cfg = c;
    ts_list_init(&net->conns);
    ts_list_init(&net->listeners);
    *out = net;
    return TS_OK;
}

uv_loop_t *ts_net_loop(const ts_net_t *net) { return net->loop; }
const ts_node_id_t *ts_net_node_id(const ts_net_t *net) { return &net->id.id; }
const ts_net_config_t *ts_net_config(const ts_net_t *net) { return &net->cfg; }
void ts_net_stats(const ts_net_t *net, ts_net_stats_t *out) { *out = net->st; }

void ts_net_shutdown(ts_net_t *net) {
    if (!net)
        return;
    while (!ts_list_empty(&net->listeners)) /* ts_listener_close unlinks it */
        ts_listener_close(TS_CONTAINER_OF(net->listeners.next, ts_listener_t, node), 0);
    TS_LIST_FOREACH(it, &net->conns) { ts_conn_close(TS_CONTAINER_OF(it, ts_conn_t, node)); }
}

int ts_net_free(ts_net_t *net) {
    if (!net)
        return TS_OK;
    if (!ts_list_empty(&net->conns) || net->st.live || !ts_list_empty(&net->listeners))
        return TS_EBUSY;
    ts_identity_wipe(&net->id);
    ts_netkey_wipe(&net->nk);
    sodium_memzero(net->pbuf, sizeof net->pbuf);
    sodium_memzero(net->rbuf, sizeof net->rbuf);
    free(net);
    return TS_OK;
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
static void conn_fail(ts_conn_t *c, ts_conn_close_reason_t reason, int code, const char *fmt, ...)
    TS_PRINTF(4, 5);
static void conn_fail(ts_conn_t *c, ts_conn_close_reason_t reason, int code, const char *fmt, ...) {
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
        conn_fail(c, TS_CONN_CLOSE_LOCAL, TS_ECLOSED, "closed by this side");
}

void ts_conn_close_protocol(ts_conn_t *c, const char *message) {
    if (c)
        conn_fail(c, TS_CONN_CLOSE_PROTOCOL, TS_ECORRUPT, "protocol error from %s: %s", c->addr,
                  message ? message : "(no detail)");
}

/* ---- timers --------------------------------------------------------------------------------- */

static void handshake_timeout_cb(uv_timer_t *t) {
    ts_conn_t *c = t->data;
    conn_fail(c, TS_CONN_CLOSE_HANDSHAKE_TIMEOUT, TS_ETIMEDOUT,
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
    conn_fail(c, TS_CONN_CLOSE_IDLE_TIMEOUT, TS_ETIMEDOUT,
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
        conn_fail(c, reason, code,
                  "%s: %s during the handshake (its connection limit, or not a tessera node?)",
                  c->addr, what);
    else if (c->initiator && c->frames_in == 0)
        conn_fail(c, reason, code,
                  "%s: %s right after the handshake, before sending anything: a wrong network "
                  "key?",
                  c->addr, what);
    else if (uverr == UV_EOF)
        conn_fail(c, reason, code, "%s closed the connection", c->addr);
    else
        conn_fail(c, reason, code, "%s %s failed: %s", doing, c->addr, what);
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
            conn_fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot read from %s: %s", c->addr,
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
        conn_fail(c, TS_CONN_CLOSE_IO, TS_EIO, "writing to %s failed: %s", c->addr,
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
        conn_fail(c, TS_CONN_CLOSE_NOMEM, TS_ENOMEM, "out of memory");
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
            conn_fail(c, TS_CONN_CLOSE_LOCAL, rc, "cannot encrypt for %s: %s", c->addr,
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
        conn_fail(c, TS_CONN_CLOSE_HANDSHAKE, rc, "handshake with %s: split failed", c->addr);
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
        conn_fail(c, TS_CONN_CLOSE_HANDSHAKE, rc, "handshake with %s: %s", c->addr,
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
        conn_fail(c, TS_CONN_CLOSE_IDENTITY, rc,
                  "%s sent an identity that does not match its handshake key: %s", c->addr, err);
        return rc;
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
        conn_fail(c, TS_CONN_CLOSE_HANDSHAKE, rc,
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
            conn_fail(c, TS_CONN_CLOSE_HANDSHAKE, TS_ECORRUPT,
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
        conn_fail(c, TS_CONN_CLOSE_BUDGET, TS_ERANGE,
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
        conn_fail(c, TS_CONN_CLOSE_DECRYPT, rc,
                  "a message from %s failed to decrypt (tampered, replayed or reordered)", c->addr);
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
            conn_fail(c, rc == TS_ENOMEM ? TS_CONN_CLOSE_NOMEM : TS_CONN_CLOSE_FRAMING, rc,
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
                conn_fail(c, TS_CONN_CLOSE_HANDSHAKE, TS_ECORRUPT,
                          "%s sent a handshake message of the wrong size (%u bytes announced, "
                          "%u expected): not a tessera peer?",
                          c->addr, (unsigned)(c->noise_rd.hdr[0] << 8 | c->noise_rd.hdr[1]),
                          (unsigned)c->noise_rd.max);
            else
                conn_fail(c, rc == TS_ENOMEM ? TS_CONN_CLOSE_NOMEM : TS_CONN_CLOSE_FRAMING, rc,
                          "%s: %s", c->addr, err);
            return;
        }
        if (!msg)
            break;
        if (c->state == ST_HANDSHAKE) {
            if (mlen != c->noise_rd.max) { /* shorter than the one legal size */
                conn_fail(c, TS_CONN_CLOSE_HANDSHAKE, TS_ECORRUPT,
                          "%s sent a handshake message of %zu bytes, %u expected", c->addr, mlen,
                          (unsigned)c->noise_rd.max);
                return;
            }
            handshake_message(c, msg, mlen);
        } else {
            transport_message(c, msg, mlen);
        }
    }
}

/* ---- creating connections ------------------------------------------------------------------- */

static ts_conn_t *conn_new(ts_net_t *net, const ts_conn_handler_t *h, void *data) {
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
static void conn_start(ts_conn_t *c) {
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
        conn_fail(c, TS_CONN_CLOSE_HANDSHAKE, rc, "cannot start a handshake: %s", ts_strerror(rc));
        return;
    }
    c->noise_rd.max = c->initiator ? HS_MSG2 : HS_MSG1;
    rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
    if (rc) {
        conn_fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot read from %s: %s", c->addr, uv_strerror(rc));
        return;
    }
    if (c->initiator)
        handshake_write(c, 0);
}

static void sockaddr_text(const struct sockaddr_storage *ss, char *ip, size_t iplen, char *addr,
                          size_t addrlen) {
    int port = 0;
    ip[0] = '\0';
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        uv_ip4_name(a, ip, iplen);
        port = ntohs(a->sin_port);
        snprintf(addr, addrlen, "%s:%d", ip, port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        uv_ip6_name(a, ip, iplen);
        port = ntohs(a->sin6_port);
        snprintf(addr, addrlen, "[%s]:%d", ip, port);
    } else {
        snprintf(addr, addrlen, "(unknown address)");
    }
}

static void on_connection(uv_stream_t *server, int status);

static void listener_free_if_done(ts_listener_t *l) {
    if (--l->handles == 0)
        free(l);
}

static void spare_closed(uv_handle_t *h) {
    ts_listener_t *l = h->data;
    l->spare_busy = 0;
    int retry = l->stalled && !l->closing;
    l->stalled = 0;
    listener_free_if_done(l);
    if (retry) /* the connection libuv kept for us: serve it now, or drop it */
        on_connection((uv_stream_t *)&l->tcp, 0);
}

/* No memory to serve a connection: accept it into the listener's spare handle and close it, so
 * the peer sees a close instead of hanging. While the spare is closing, libuv keeps the next
 * connection pending (it stops polling the listener until uv_accept), and spare_closed offers
 * it again. */
static void drop_connection(ts_listener_t *l) {
    if (l->spare_busy) {
        l->stalled = 1;
        return;
    }
    uv_tcp_init(l->net->loop, &l->spare);
    l->spare.data = l;
    l->spare_busy = 1;
    l->handles++;
    uv_accept((uv_stream_t *)&l->tcp, (uv_stream_t *)&l->spare);
    uv_close((uv_handle_t *)&l->spare, spare_closed);
}

/* 1 when c's socket has bytes the loop has not read yet (a client whose message 1 arrived in
 * this same loop iteration is not silent). */
static int bytes_waiting(ts_conn_t *c) {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
        return 0;
    char b;
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

static void on_connection(uv_stream_t *server, int status) {
    ts_listener_t *l = server->data;
    ts_net_t *net = l->net;
    if (status < 0 || l->closing)
        return;
    ts_conn_t *c = conn_new(net, &l->h, l->arg);
    if (!c) {
        drop_connection(l);
        return;
    }
    c->accepted = 1;
    c->listener = l;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        c->refused = 1;
        conn_fail(c, TS_CONN_CLOSE_IO, TS_EIO, "accept failed");
        return;
    }
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    memset(&ss, 0, sizeof ss);
    uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl);
    sockaddr_text(&ss, c->ip, sizeof c->ip, c->addr, sizeof c->addr);

    /* The limits, counted over the accepted connections alive now and not closing (this one
     * excluded). At a limit, the oldest half-open connection in its scope (the same address for
     * the per-address limit, any for the total) makes room: a peer without the network key can
     * hold connections only as long as nobody newer comes, so it cannot keep honest clients
     * out. Only when every connection in the scope has completed its handshake is the new one
     * refused. */
    uint32_t same = 0, all = 0;
    TS_LIST_FOREACH(it, &net->conns) {
        ts_conn_t *o = TS_CONTAINER_OF(it, ts_conn_t, node);
        if (o == c || !o->accepted || o->refused || o->state == ST_CLOSING)
            continue;
        all++;
        same += strcmp(o->ip, c->ip) == 0;
    }
    int over_addr = same >= net->cfg.max_conns_per_addr, over_all = all >= net->cfg.max_conns;
    if (over_addr || over_all) {
        /* in the limit's scope, oldest first: the first silent one (not a byte received, none
         * waiting in its socket: an honest client sends message 1 as soon as it is connected),
         * else the oldest still in its handshake */
        ts_conn_t *victim = NULL, *spoke = NULL;
        TS_LIST_FOREACH(it, &net->conns) {
            ts_conn_t *o = TS_CONTAINER_OF(it, ts_conn_t, node);
            if (o == c || !o->accepted || o->refused || o->state == ST_CLOSING ||
                o->state == ST_OPEN || (over_addr && strcmp(o->ip, c->ip) != 0))
                continue;
            if (o->bytes_in == 0 && !bytes_waiting(o)) {
                victim = o;
                break;
            }
            if (!spoke)
                spoke = o;
        }
        if (!victim)
            victim = spoke;
        if (!victim) {
            c->refused = 1;
            net->st.refused_limit++;
            conn_fail(c, TS_CONN_CLOSE_LOCAL, TS_EBUSY, "connection limit");
            return;
        }
        net->st.evicted++;
        conn_fail(victim, TS_CONN_CLOSE_EVICTED, TS_EBUSY,
                  "a half-open connection from %s was closed to admit a newer one (%s limit)",
                  victim->addr, over_addr ? "per-address" : "connection");
    }
    net->st.accepted++;
    net->st.live_accepted++;
    uv_timer_start(&c->timer, handshake_timeout_cb, net->cfg.handshake_timeout_ms, 0);
    conn_start(c);
}

static void connect_cb(uv_connect_t *req, int status) {
    ts_conn_t *c = req->data;
    if (c->state == ST_CLOSING)
        return;
    if (status < 0) {
        conn_fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot connect to %s: %s", c->addr,
                  uv_strerror(status));
        return;
    }
    conn_start(c);
}

static void connect_to(ts_conn_t *c, const struct sockaddr *sa) {
    c->connect_req.data = c;
    int rc = uv_tcp_connect(&c->connect_req, &c->tcp, sa, connect_cb);
    if (rc)
        conn_fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot connect to %s: %s", c->addr,
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
        conn_fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot resolve %s: %s", c->addr,
                  uv_strerror(status));
    } else {
        connect_to(c, res->ai_addr);
    }
    uv_freeaddrinfo(res);
}

int ts_conn_connect(ts_net_t *net, const char *addr, const ts_conn_handler_t *h, void *arg,
                    ts_conn_t **out, char *err, size_t errlen) {
    if (!net || !addr || !out) {
        ts_set_err(err, errlen, "ts_conn_connect: NULL argument");
        return TS_EINVAL;
    }
    *out = NULL;
    char host[256];
    int port;
    int rc = ts_net_parse_addr(addr, host, sizeof host, &port, 0, err, errlen);
    if (rc)
        return rc;
    ts_conn_t *c = conn_new(net, h, arg);
    if (!c)
        return TS_ENOMEM;
    c->initiator = 1;
    snprintf(c->addr, sizeof c->addr, "%s", addr);
    net->st.connects++;
    uv_timer_start(&c->timer, handshake_timeout_cb, net->cfg.handshake_timeout_ms, 0);
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
            conn_fail(c, TS_CONN_CLOSE_IO, TS_EIO, "cannot resolve %s: %s", addr, uv_strerror(rc));
        else
            c->gai_pending = 1;
    }
    *out = c;
    return TS_OK;
}

/* ---- listening ------------------------------------------------------------------------------ */

static void listener_closed(uv_handle_t *h) { listener_free_if_done(h->data); }

int ts_net_listen(ts_net_t *net, const char *addr, const ts_conn_handler_t *h, void *arg,
                  ts_listener_t **out, char *err, size_t errlen) {
    if (!net || !addr || !out) {
        ts_set_err(err, errlen, "ts_net_listen: NULL argument");
        return TS_EINVAL;
    }
    *out = NULL;
    char host[256];
    int port, rc = ts_net_parse_addr(addr, host, sizeof host, &port, 1, err, errlen);
    if (rc)
        return rc;
    struct sockaddr_storage ss;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0) {
        ts_set_err(err, errlen, "cannot listen on '%s': the host must be a numeric address", addr);
        return TS_EINVAL;
    }
    ts_listener_t *l = calloc(1, sizeof *l);
    if (!l)
        return TS_ENOMEM;
    l->net = net;
    if (h)
        l->h = *h;
    l->arg = arg;
    uv_tcp_init(net->loop, &l->tcp);
    l->tcp.data = l;
    l->handles = 1;
    ts_list_push(&net->listeners, &l->node);
    if ((rc = uv_tcp_bind(&l->tcp, (struct sockaddr *)&ss, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&l->tcp, 128, on_connection)) != 0) {
        ts_set_err(err, errlen, "cannot listen on %s: %s", addr, uv_strerror(rc));
        ts_listener_close(l, 0);
        return TS_EIO;
    }
    struct sockaddr_storage bound;
    int bl = sizeof bound;
    memset(&bound, 0, sizeof bound);
    uv_tcp_getsockname(&l->tcp, (struct sockaddr *)&bound, &bl);
    l->port = bound.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                                          : ntohs(((struct sockaddr_in *)&bound)->sin_port);
    *out = l;
    return TS_OK;
}

int ts_listener_port(const ts_listener_t *l) { return l ? l->port : 0; }

void ts_listener_close(ts_listener_t *l, int close_conns) {
    if (!l)
        return;
    ts_net_t *net = l->net;
    l->closing = 1;
    ts_list_remove(&l->node);
    TS_LIST_FOREACH(it, &net->conns) {
        ts_conn_t *c = TS_CONTAINER_OF(it, ts_conn_t, node);
        if (c->listener == l) {
            c->listener = NULL;
            if (close_conns)
                ts_conn_close(c);
        }
    }
    uv_close((uv_handle_t *)&l->tcp, listener_closed);
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
void ts_net_on_handshake_failure(ts_net_t *net, ts_net_handshake_fail_fn fn, void *arg) {
    if (!net)
        return;
    net->hs_fail = fn;
    net->hs_fail_arg = arg;
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
