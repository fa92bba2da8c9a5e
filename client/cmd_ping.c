/*
 * cmd_ping.c — `tessera ping HOST:PORT`: is a node there, is it of my network, and how far away
 * is it? For operators.
 *
 *   tessera ping HOST:PORT --network-key FILE [--identity FILE] [--count N] [--timeout-ms N] [--json]
 *
 * It connects, runs the handshake (net/conn.h), then sends N pings one after the other — the
 * protocol's liveness probe, `ping` with the peer's node id as target, answered by `ack`
 * (docs/protocol.md §5) — and prints the peer's node id (as its handshake proved it), the time
 * to connect and complete the handshake, and the round-trip times (min, p50, p99, max; p50 and
 * p99 by nearest rank). --json prints one object instead:
 *
 *   {"addr": "...", "node_id": "<64 hex>", "node_id_short": "<16 hex>", "handshake_ms": 1.2,
 *    "count": 3, "rtt_ms": {"min": .., "p50": .., "p99": .., "max": ..}, "samples_ms": [..]}
 *
 * Exit status 0 when every ping was answered, 1 otherwise (with a sentence on stderr saying
 * what failed: refused, timed out, a handshake the peer broke off — most likely a different
 * network key — or an unreadable key file), 2 for bad usage.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "client/args.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "net/netclient.h"
#include "net/rpc.h"

typedef struct ping {
    ts_rpc_t *rpc;
    ts_rpc_peer_t *peer;
    const char *addr;
    int count, timeout_ms, done;
    ts_node_id_t node;
    double handshake_ms;
    double *rtt_ms;
    int failed;
    char err[1400];
} ping_t;

/* Ends the run; message (when failed) says why. */
static void finish(ping_t *p, int failed, const char *message) {
    if (failed && !p->failed) {
        p->failed = 1;
        snprintf(p->err, sizeof p->err, "%s", message);
    }
    ts_rpc_shutdown(p->rpc);
}

static void send_ping(ping_t *p);

static void on_ack(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    ping_t *p = arg;
    if (res->status != TS_OK) {
        finish(p, 1, res->message);
        return;
    }
    p->rtt_ms[p->done++] = (double)res->rtt_ns / 1e6;
    if (p->done == p->count)
        finish(p, 0, "");
    else
        send_ping(p);
}

static void send_ping(ping_t *p) {
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__Ping ping = TESSERA__PING__INIT;
    ping.has_target_id = 1;
    ping.target_id.data = p->node.b;
    ping.target_id.len = TS_NODE_ID_BYTES;
    env.body_case = TESSERA__ENVELOPE__BODY_PING;
    env.ping = &ping;
    char err[256] = "";
    int rc = ts_rpc_call(p->peer, &env, (uint32_t)p->timeout_ms, on_ack, p, NULL, err, sizeof err);
    if (rc)
        finish(p, 1, err);
}

static void on_connected(ts_rpc_peer_t *peer, int status, const char *message, void *arg) {
    ping_t *p = arg;
    if (status != TS_OK) {
        finish(p, 1, message);
        return;
    }
    ts_rpc_peer_info_t info;
    ts_rpc_peer_info(peer, &info);
    p->node = info.node_id;
    p->handshake_ms = (double)info.handshake_ns / 1e6;
    send_ping(p);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest rank: the smallest sample with at least q of the samples at or below it. */
static double rank(const double *sorted, int n, double q) {
    int k = (int)ceil(q * n);
    return sorted[k < 1 ? 0 : k - 1];
}

static void report(const ping_t *p, int json) {
    char full[TS_NODE_ID_HEX], brief[TS_NODE_ID_SHORT + 1];
    ts_node_id_hex(&p->node, 2 * TS_NODE_ID_BYTES, full);
    ts_node_id_hex(&p->node, TS_NODE_ID_SHORT, brief);
    double *s = malloc(sizeof *s * (size_t)p->count);
    if (!s)
        return;
    memcpy(s, p->rtt_ms, sizeof *s * (size_t)p->count);
    qsort(s, (size_t)p->count, sizeof *s, cmp_double);
    double mn = s[0], p50 = rank(s, p->count, 0.5), p99 = rank(s, p->count, 0.99),
           mx = s[p->count - 1];
    if (json) {
        json_t *samples = json_array();
        for (int i = 0; i < p->count; i++)
            json_array_append_new(samples, json_real(p->rtt_ms[i]));
        json_t *j = json_pack("{s:s, s:s, s:s, s:f, s:i, s:{s:f, s:f, s:f, s:f}, s:o}", "addr",
                              p->addr, "node_id", full, "node_id_short", brief, "handshake_ms",
                              p->handshake_ms, "count", p->count, "rtt_ms", "min", mn, "p50", p50,
                              "p99", p99, "max", mx, "samples_ms", samples);
        ts_json_print(j);
    } else {
        printf("%s: node %s, connect + handshake %.3f ms\n", p->addr, brief, p->handshake_ms);
        printf("%d round trip%s: min %.3f ms, p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", p->count,
               p->count == 1 ? "" : "s", mn, p50, p99, mx);
    }
    free(s);
}

int ts_cmd_ping(int argc, char **argv) {
    const char *id_path = NULL, *nk_path = NULL, *addr = NULL;
    int count = 3, timeout_ms = 5000, json = 0;
    ts_arg_t args[] = {
        {"identity", TS_ARG_STRING, &id_path, "FILE",
         "an identity to connect with (tessera keygen; default: a fresh one for this run)"},
        {"network-key", TS_ARG_STRING, &nk_path, "FILE", "the network key", 0, 0, 1},
        {"count", TS_ARG_INT, &count, "N", "round trips (default 3)", 1, 100000},
        {"timeout-ms", TS_ARG_INT, &timeout_ms, "N",
         "for connect + handshake, and for each round trip (default 5000)", 1, 3600000},
        {"json", TS_ARG_FLAG, &json, NULL, "print one JSON object"},
    };
    const char *summary = "Connect to a node, complete the handshake and time N pings.\n"
                          "usage: tessera ping HOST:PORT --network-key FILE [options]\n"
                          "example: tessera ping 127.0.0.1:7420 --network-key "
                          "tessera-net/network.key --count 5";
    int n = (int)(sizeof args / sizeof args[0]);
    /* HOST:PORT comes first; the options follow it. */
    if (argc >= 2 && argv[1][0] != '-') {
        addr = argv[1];
        argv[1] = argv[0];
        argc--;
        argv++;
    }
    int pr = ts_args_parse("tessera ping", summary, args, n, argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    if (!addr) {
        fprintf(stderr,
                "tessera ping: which node? usage: tessera ping HOST:PORT --network-key FILE\n");
        return 2;
    }
    ts_netclient_t nc;
    int rc = ts_netclient_open(&nc, "tessera ping", addr, id_path, nk_path, (uint32_t)timeout_ms);
    if (rc)
        return rc;
    ping_t p = {
        .rpc = nc.rpc, .peer = nc.peer, .addr = addr, .count = count, .timeout_ms = timeout_ms};
    p.rtt_ms = calloc((size_t)count, sizeof *p.rtt_ms);
    if (!p.rtt_ms || (rc = ts_rpc_peer_connect(p.peer, on_connected, &p)) != TS_OK) {
        fprintf(stderr, "tessera ping: %s\n", ts_strerror(p.rtt_ms ? rc : TS_ENOMEM));
        free(p.rtt_ms);
        ts_netclient_close(&nc);
        return 1;
    }
    uv_run(&nc.loop, UV_RUN_DEFAULT);
    ts_netclient_close(&nc);
    if (p.failed) {
        fprintf(stderr, "tessera ping: %s\n", p.err);
        free(p.rtt_ms);
        return 1;
    }
    report(&p, json);
    free(p.rtt_ms);
    return 0;
}
