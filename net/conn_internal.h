/*
 * conn_internal.h — internal to the connection layer (net/conn.h): the structs behind ts_net_t,
 * ts_listener_t and ts_conn_t, and the helpers its two files share. Included only by net.c and
 * conn.c.
 *
 *   net.c   the context (ts_net_*): configuration, address parsing, creation and teardown, and
 *           listening: ts_net_listen, the listeners (ts_listener_*) and the accept path with its
 *           connection limits;
 *   conn.c  one connection (ts_conn_*): connecting, the handshake, reading, writing, closing.
 *
 * Naming. A helper shared between the two files has external linkage, so it is named
 * ts_conn__<name> (two underscores: the module's prefix, then a name no public symbol of conn.h
 * can take); a helper used by one file stays static with its short name. Like conn.h, this
 * header needs _POSIX_C_SOURCE 200809L defined before the first include.
 */
#ifndef TS_CONN_INTERNAL_H
#define TS_CONN_INTERNAL_H

#include "base/error.h"
#include "base/list.h"
#include "net/conn.h"
#include "net/frame.h"

#define READ_BUF (256u << 10) /* four full-size Noise messages and change per read */

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
    uint8_t has_expect;   /* the peer must prove expect (ts_conn_connect_ex) */
    uint8_t preamble_len; /* bytes of preamble sent on connect, before the handshake */
    uint8_t preamble[TS_CONN_PREAMBLE_MAX];
    ts_node_id_t expect;
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

/* ---- conn.c --------------------------------------------------------------------------------- */

/* A new connection on net's loop, its handles initialised and counted live; NULL without
 * memory. */
ts_conn_t *ts_conn__new(ts_net_t *net, const ts_conn_handler_t *h, void *data);
/* The socket is connected (either side): set it up and start the handshake. */
void ts_conn__start(ts_conn_t *c);
/* Starts closing c for the given reason; the first reason recorded wins. */
void ts_conn__fail(ts_conn_t *c, ts_conn_close_reason_t reason, int code, const char *fmt, ...)
    TS_PRINTF(4, 5);
/* The handshake timer's callback: c did not reach OPEN in time. */
void ts_conn__handshake_timeout_cb(uv_timer_t *t);

#endif
