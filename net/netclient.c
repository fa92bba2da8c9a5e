/*
 * netclient.c — the endpoint every networked verb opens (netclient.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "net/netclient.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "net/keys.h"

static int load_keys(const char *prog, const char *id_path, const char *nk_path, ts_identity_t *id,
                     ts_netkey_t *nk) {
    char err[512] = "";
    if (id_path ? ts_identity_load(id, id_path, err, sizeof err) : ts_identity_generate(id)) {
        fprintf(stderr, "%s: cannot use the identity file: %s\n", prog,
                *err ? err : "libsodium did not initialise");
        return 1;
    }
    if (ts_netkey_load(nk, nk_path, err, sizeof err)) {
        ts_identity_wipe(id);
        fprintf(stderr, "%s: cannot use the network key file: %s\n", prog, err);
        return 1;
    }
    return 0;
}

int ts_netclient_open(ts_netclient_t *c, const char *prog, const char *addr, const char *id_path,
                      const char *nk_path, uint32_t timeout_ms) {
    memset(c, 0, sizeof *c);
    c->addr = addr;
    char host[256], err[512] = "";
    int port;
    if (ts_net_parse_addr(addr, host, sizeof host, &port, 0, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 2;
    }
    ts_identity_t id;
    ts_netkey_t nk;
    if (load_keys(prog, id_path, nk_path, &id, &nk))
        return 1;
    uv_loop_init(&c->loop);
    ts_net_config_t cfg;
    ts_net_config_default(&cfg);
    cfg.handshake_timeout_ms = timeout_ms;
    int rc = ts_net_new(&c->net, &c->loop, &id, &nk, &cfg);
    ts_identity_wipe(&id);
    ts_netkey_wipe(&nk);
    if (rc == TS_OK)
        rc = ts_rpc_new(&c->rpc, c->net, NULL);
    if (rc == TS_OK)
        rc = ts_rpc_peer_get(c->rpc, addr, &c->peer, err, sizeof err);
    if (rc != TS_OK) {
        fprintf(stderr, "%s: %s\n", prog, *err ? err : ts_strerror(rc));
        ts_netclient_close(c);
        return 1;
    }
    return 0;
}

typedef struct sync_call {
    int done, status;
    Tessera__Envelope *reply;
    char *err;
    size_t errlen;
} sync_call_t;

static void on_sync(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    sync_call_t *s = arg;
    s->done = 1;
    s->status = res->status;
    if (res->status != TS_OK) {
        ts_set_err(s->err, s->errlen, "%s", res->message);
        return;
    }
    /* The answer lives only during this callback: keep a copy (packed and unpacked again). */
    size_t n = protobuf_c_message_get_packed_size(&res->reply->base);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        s->status = TS_ENOMEM;
        ts_set_err(s->err, s->errlen, "out of memory");
        return;
    }
    protobuf_c_message_pack(&res->reply->base, buf);
    s->reply = tessera__envelope__unpack(NULL, n, buf);
    free(buf);
    if (!s->reply) {
        s->status = TS_ENOMEM;
        ts_set_err(s->err, s->errlen, "out of memory");
    }
}

int ts_netclient_call(ts_netclient_t *c, ts_rpc_peer_t *peer, const Tessera__Envelope *req,
                      uint32_t timeout_ms, Tessera__Envelope **reply, char *err, size_t errlen) {
    *reply = NULL;
    sync_call_t s = {.status = TS_EIO, .err = err, .errlen = errlen};
    int rc = ts_rpc_call(peer, req, timeout_ms, on_sync, &s, NULL, err, errlen);
    if (rc != TS_OK)
        return rc;
    while (!s.done)
        if (uv_run(&c->loop, UV_RUN_ONCE) == 0 && !s.done) {
            ts_set_err(err, errlen, "the loop stopped before the answer");
            return TS_EIO;
        }
    *reply = s.reply;
    return s.status;
}

void ts_netclient_close(ts_netclient_t *c) {
    if (c->rpc)
        ts_rpc_shutdown(c->rpc);
    else if (c->net)
        ts_net_shutdown(c->net);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    ts_rpc_free(c->rpc);
    ts_net_free(c->net);
    uv_loop_close(&c->loop);
    c->rpc = NULL;
    c->net = NULL;
    c->peer = NULL;
}
