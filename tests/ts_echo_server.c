/*
 * ts_echo_server.c — a minimal tessera node for the tests: it listens, completes handshakes, and
 * answers ping (ack, built into net/rpc.h) and status_request (a status_response holding its node
 * id and nothing else). It is not tesserad: no gossip, no experts, no store.
 *
 *   ts_echo_server --listen 127.0.0.1:0 --identity node.key --network-key net.key
 *                  [--handshake-timeout-ms N] [--idle-timeout-ms N]
 *
 * Once listening it prints one line on stdout, flushed, which scripts wait for:
 *
 *   listening 127.0.0.1:PORT node <64 hex digits>
 *
 * SIGINT or SIGTERM shut it down cleanly (exit 0); on shutdown it prints its counters, one
 * "closed <reason> <count>" line per close reason that occurred, on stderr.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "client/args.h"
#include "net/rpc.h"

static ts_rpc_t *g_rpc;
static uv_signal_t g_sigint, g_sigterm;

static void serve_status(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    const ts_node_id_t *self = arg;
    Tessera__Envelope out = TESSERA__ENVELOPE__INIT;
    Tessera__StatusResponse st = TESSERA__STATUS_RESPONSE__INIT;
    st.has_node_id = 1;
    st.node_id.data = (uint8_t *)self->b;
    st.node_id.len = TS_NODE_ID_BYTES;
    out.body_case = TESSERA__ENVELOPE__BODY_STATUS_RESPONSE;
    out.status_response = &st;
    ts_rpc_reply(req, &out);
}

static void on_signal(uv_signal_t *s, int signum) {
    uv_signal_stop(&g_sigint);
    uv_signal_stop(&g_sigterm);
    uv_close((uv_handle_t *)&g_sigint, NULL);
    uv_close((uv_handle_t *)&g_sigterm, NULL);
    ts_rpc_shutdown(g_rpc);
}

int main(int argc, char **argv) {
    const char *listen = NULL, *id_path = NULL, *nk_path = NULL;
    int hs_ms = 10000, idle_ms = 120000;
    ts_arg_t args[] = {
        {"listen", TS_ARG_STRING, &listen, "ADDR", "address to listen on (port 0: any)", 0, 0, 1},
        {"identity", TS_ARG_STRING, &id_path, "FILE", "node identity file", 0, 0, 1},
        {"network-key", TS_ARG_STRING, &nk_path, "FILE", "network key file", 0, 0, 1},
        {"handshake-timeout-ms", TS_ARG_INT, &hs_ms, "N", "handshake timeout", 1, 3600000},
        {"idle-timeout-ms", TS_ARG_INT, &idle_ms, "N", "idle timeout (0: none)", 0, 86400000},
    };
    int pr = ts_args_parse("ts_echo_server", "A minimal tessera node for the tests.", args,
                           (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;

    ts_identity_t id;
    ts_netkey_t nk;
    char err[512] = "";
    if (ts_identity_load(&id, id_path, err, sizeof err) ||
        ts_netkey_load(&nk, nk_path, err, sizeof err)) {
        fprintf(stderr, "ts_echo_server: %s\n", err);
        return 1;
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    ts_net_config_t cfg;
    ts_net_config_default(&cfg);
    cfg.handshake_timeout_ms = (uint32_t)hs_ms;
    cfg.idle_timeout_ms = (uint32_t)idle_ms;
    ts_net_t *net = NULL;
    ts_listener_t *l = NULL;
    int rc = ts_net_new(&net, &loop, &id, &nk, &cfg);
    ts_identity_wipe(&id);
    ts_netkey_wipe(&nk);
    if (rc == TS_OK)
        rc = ts_rpc_new(&g_rpc, net, NULL);
    if (rc == TS_OK)
        rc = ts_rpc_handle(g_rpc, TESSERA__ENVELOPE__BODY_STATUS_REQUEST, serve_status,
                           (void *)ts_net_node_id(net));
    if (rc == TS_OK)
        rc = ts_rpc_listen(g_rpc, listen, &l, err, sizeof err);
    if (rc) {
        fprintf(stderr, "ts_echo_server: %s\n", *err ? err : ts_strerror(rc));
        return 1;
    }
    char hex[TS_NODE_ID_HEX], host[256];
    int port;
    ts_net_parse_addr(listen, host, sizeof host, &port, 1, NULL, 0);
    ts_node_id_hex(ts_net_node_id(net), 2 * TS_NODE_ID_BYTES, hex);
    printf(strchr(host, ':') ? "listening [%s]:%d node %s\n" : "listening %s:%d node %s\n", host,
           ts_listener_port(l), hex);
    fflush(stdout);

    uv_signal_init(&loop, &g_sigint);
    uv_signal_init(&loop, &g_sigterm);
    uv_signal_start(&g_sigint, on_signal, SIGINT);
    uv_signal_start(&g_sigterm, on_signal, SIGTERM);
    uv_run(&loop, UV_RUN_DEFAULT);

    ts_net_stats_t st;
    ts_net_stats(net, &st);
    for (int r = 0; r < TS_CONN_CLOSE_REASONS; r++)
        if (st.closed[r])
            fprintf(stderr, "closed %s %llu\n", ts_conn_close_reason_name(r),
                    (unsigned long long)st.closed[r]);
    rc = ts_rpc_free(g_rpc);
    if (rc == TS_OK)
        rc = ts_net_free(net);
    uv_loop_close(&loop);
    return rc == TS_OK ? 0 : 1;
}
