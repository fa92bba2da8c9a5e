/*
 * ts_bad_expert.c — a replica that lies, for tests/test_netgen.sh: it joins a network by gossip,
 * copies the advert of cluster K from its view (same partition, same weights hash) under its own
 * signature, and answers every denoise request with garbage — a velocity of the right shape full
 * of NaN, or one of the wrong shape, alternately. A client must ban it and get its answers from
 * the honest replica.
 *
 *   ts_bad_expert --bootstrap HOST:PORT --network-key FILE --cluster K
 *
 * It prints "listening IP:PORT" once it advertises, then runs until SIGTERM or SIGINT.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "client/args.h"
#include "net/frame.h"
#include "net/gossip.h"
#include "net/rpc.h"

typedef struct bad {
    uv_loop_t loop;
    ts_net_t *net;
    ts_rpc_t *rpc;
    ts_gossip_t *g;
    uv_timer_t timer;
    uv_signal_t sig[2];
    int cluster, advertised, answers, port;
} bad_t;

static void serve_garbage(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    bad_t *b = arg;
    const Tessera__Tensor *x = env->denoise_request->x_t;
    size_t count = x->data.len / sizeof(float);
    float *v = malloc(x->data.len ? x->data.len : 4);
    if (!v) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    for (size_t i = 0; i < count; i++)
        v[i] = NAN;
    int64_t shape[4] = {x->shape[0], x->shape[1], x->shape[2], x->shape[3] + (b->answers & 1)};
    Tessera__Tensor t = TESSERA__TENSOR__INIT;
    t.has_dtype = t.has_data = 1;
    t.dtype = TESSERA__DTYPE__DTYPE_F32;
    t.n_shape = 4;
    t.shape = shape;
    t.data.data = (uint8_t *)v;
    t.data.len = x->data.len;
    Tessera__DenoiseResponse r = TESSERA__DENOISE_RESPONSE__INIT;
    r.velocity = &t;
    Tessera__Envelope out = TESSERA__ENVELOPE__INIT;
    out.body_case = TESSERA__ENVELOPE__BODY_DENOISE_RESPONSE;
    out.denoise_response = &r;
    b->answers++;
    ts_rpc_reply(req, &out);
    free(v);
}

/* Waits until the view holds an advert of the cluster, then announces a copy as ours. */
static void on_timer(uv_timer_t *t) {
    bad_t *b = t->data;
    if (b->advertised)
        return;
    Tessera__StatusResponse *st = NULL;
    if (ts_gossip_status(b->g, NULL, &st) != TS_OK)
        return;
    for (size_t i = 0; i < st->n_adverts && !b->advertised; i++) {
        Tessera__AdvertBody *body = NULL;
        if (ts_frame_decode_advert_body(&st->adverts[i]->body, 0, &body, NULL, 0) != TS_OK)
            continue;
        if ((int)body->cluster == b->cluster) {
            char err[256];
            if (ts_gossip_set_advert(b->g, body, err, sizeof err) == TS_OK) {
                b->advertised = 1;
                printf("listening 127.0.0.1:%d\n", b->port);
                fflush(stdout);
            } else {
                fprintf(stderr, "ts_bad_expert: %s\n", err);
            }
        }
        ts_frame_free(body);
    }
    ts_gossip_status_free(st);
}

static void on_closed(ts_gossip_t *g, void *arg) {
    (void)g;
    bad_t *b = arg;
    ts_rpc_shutdown(b->rpc);
}

static void on_signal(uv_signal_t *s, int signum) {
    (void)signum;
    bad_t *b = s->data;
    for (int i = 0; i < 2; i++)
        uv_close((uv_handle_t *)&b->sig[i], NULL);
    uv_close((uv_handle_t *)&b->timer, NULL);
    ts_gossip_close(b->g, on_closed, b);
}

int main(int argc, char **argv) {
    const char *boot = NULL, *nk_path = NULL;
    bad_t b = {.cluster = -1};
    ts_arg_t args[] = {
        {"bootstrap", TS_ARG_STRING, &boot, "ADDR", "a node of the network", 0, 0, 1},
        {"network-key", TS_ARG_STRING, &nk_path, "FILE", "network key file", 0, 0, 1},
        {"cluster", TS_ARG_INT, &b.cluster, "K", "the cluster to impersonate", 0, 65535, 1},
    };
    int pr = ts_args_parse("ts_bad_expert", "A replica that answers garbage.", args,
                           (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    signal(SIGPIPE, SIG_IGN); /* a client that goes away is its own problem */
    char err[512] = "";
    ts_identity_t id;
    ts_netkey_t nk;
    if (ts_identity_generate(&id) || ts_netkey_load(&nk, nk_path, err, sizeof err)) {
        fprintf(stderr, "ts_bad_expert: %s\n", err);
        return 1;
    }
    uv_loop_init(&b.loop);
    ts_listener_t *l = NULL;
    int rc = ts_net_new(&b.net, &b.loop, &id, &nk, NULL);
    if (rc == TS_OK)
        rc = ts_rpc_new(&b.rpc, b.net, NULL);
    if (rc == TS_OK)
        rc = ts_rpc_listen(b.rpc, "127.0.0.1:0", &l, err, sizeof err);
    char addr[64];
    ts_gossip_config_t gc;
    ts_gossip_config_default(&gc);
    gc.swim.probe_interval_ms = 200;
    gc.swim.probe_timeout_ms = 100;
    if (rc == TS_OK) {
        b.port = ts_listener_port(l);
        snprintf(addr, sizeof addr, "127.0.0.1:%d", b.port);
        gc.listen = addr;
        gc.bootstrap = &boot;
        gc.n_bootstrap = 1;
        rc = ts_gossip_new(&b.loop, b.rpc, &id, &nk, &gc, &b.g, err, sizeof err);
    }
    if (rc == TS_OK)
        rc = ts_gossip_start(b.g, err, sizeof err);
    if (rc == TS_OK)
        rc = ts_rpc_handle(b.rpc, TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, serve_garbage, &b);
    ts_identity_wipe(&id);
    ts_netkey_wipe(&nk);
    if (rc != TS_OK) {
        fprintf(stderr, "ts_bad_expert: %s\n", *err ? err : ts_strerror(rc));
        return 1;
    }
    uv_timer_init(&b.loop, &b.timer);
    b.timer.data = &b;
    uv_timer_start(&b.timer, on_timer, 100, 100);
    for (int i = 0; i < 2; i++) {
        uv_signal_init(&b.loop, &b.sig[i]);
        b.sig[i].data = &b;
        uv_signal_start(&b.sig[i], on_signal, i ? SIGTERM : SIGINT);
    }
    uv_run(&b.loop, UV_RUN_DEFAULT);
    ts_gossip_free(b.g);
    ts_rpc_free(b.rpc);
    ts_net_free(b.net);
    uv_loop_close(&b.loop);
    fprintf(stderr, "ts_bad_expert: %d garbage answers\n", b.answers);
    return 0;
}
