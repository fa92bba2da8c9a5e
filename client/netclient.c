/*
 * netclient.c — the endpoint every networked verb opens (netclient.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "client/netclient.h"

#include <stdio.h>
#include <string.h>

#include "kernels/error.h"
#include "net/keys.h"

static int load_keys(const char *prog, const char *id_path, const char *nk_path,
                     ts_identity_t *id, ts_netkey_t *nk) {
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
