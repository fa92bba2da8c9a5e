/*
 * bench_serve.c — what serving an expert over the network costs (docs/benchmarks.md, "Serving
 * (loopback)").
 *
 *   bench_serve [--quick] [--seconds S] [--threads N] [--json]
 *
 * In one run, with a random-weight `tiny` expert (28×28×1, hidden 128, depth 4, patch 4):
 *   - in-process forward: ts_dit_forward at batch 1 and 16 on an engine of N threads (samples/s,
 *     from the median call);
 *   - served, closed loop, 16 samples in flight either way: 16 clients each sending batch-1
 *     requests (each sends its next on its answer), and one client sending batch-16 requests;
 *     samples/s of each, and their ratio (the batcher's job: the target is ≥ 80 %);
 *   - latency under open-loop load: batch-1 requests arriving as a Poisson process at 50 % and
 *     90 % of the 16-client throughput just measured, spread over the 16 clients; p50 and p99
 *     of the time from the scheduled arrival to the answer, by nearest rank.
 * Every throughput is the best of two runs, interleaved with the others (a shared machine).
 * The server — its own uv loop, net/rpc endpoint and daemon/serve.h with max_batch 16,
 * max_wait_ms 2 — runs on a thread of its own, as it would in its own process; its compute
 * thread is serve.h's. The clients share the main thread's loop. Every link is a real loopback
 * TCP connection with the Noise transport.
 *
 * What it is not: a test (no targets are checked here), nor a measure of a real network.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "daemon/serve.h"
#include "kernels/ops.h"
#include "net/rpc.h"

#define CLIENTS 16
#define BATCH 16
#define MAX_LAT 200000

static struct {
    double seconds;
    int threads, quick, json;
} opt = {2.0, 2, 0, 0};

/* ---- the expert ------------------------------------------------------------------------------- */

static ts_dit_config_t cfg;
static ts_tensor_t params; /* the random weights, shared by the server and the in-process run */
static uint8_t expert_id[32];

static void make_expert(void) {
    ts_engine_t e;
    ts_engine_opts_t eo = {.device = TS_CPU, .threads = 1};
    ts_dit_t m;
    if (ts_dit_config_preset("tiny", &cfg) || ts_engine_init(&e, &eo) ||
        ts_dit_create(&m, &cfg, &e, 1, 0) || ts_dit_init_weights(&m, 1)) {
        fprintf(stderr, "bench_serve: cannot build the expert\n");
        exit(1);
    }
    /* perturb every parameter (DiT's init zeroes the output layers) */
    ts_tensor_t noise;
    ts_tensor_alloc(&noise, TS_F32, TS_CPU, 1, TS_SHAPE(m.num_params));
    ts_rng_normal(&e, &noise, 2, 0);
    ts_axpy(&e, &m.param_mem, 0.02f, &noise);
    ts_tensor_alloc(&params, TS_F32, TS_CPU, 1, TS_SHAPE(m.num_params));
    ts_tensor_copy(&params, &m.param_mem);
    ts_tensor_free(&noise);
    ts_dit_free(&m);
    ts_engine_free(&e);
    randombytes_buf(expert_id, sizeof expert_id);
}

/* Samples/s of ts_dit_forward at batch B: the median call over opt.seconds / 2. */
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double forward_rate(int B) {
    ts_engine_t e;
    ts_engine_opts_t eo = {.device = TS_CPU, .threads = opt.threads};
    ts_dit_t m;
    ts_engine_init(&e, &eo);
    ts_dit_create(&m, &cfg, &e, B, 0);
    ts_tensor_copy(&m.param_mem, &params);
    ts_tensor_t x, t, v;
    ts_tensor_alloc(&x, TS_F32, TS_CPU, 4, TS_SHAPE(B, 1, cfg.input_size, cfg.input_size));
    ts_tensor_alloc(&t, TS_F32, TS_CPU, 1, TS_SHAPE(B));
    ts_rng_normal(&e, &x, 3, 0);
    ts_fill(&e, &t, 0.5f);
    int32_t y[BATCH] = {0};
    static double times[100000];
    int n = 0;
    for (int i = 0; i < 3; i++)
        ts_dit_forward(&m, &x, &t, y, B, &v);
    double end = ts_now_s() + opt.seconds / 2;
    while ((ts_now_s() < end || n < 5) && n < 100000) {
        double a = ts_now_s();
        ts_dit_forward(&m, &x, &t, y, B, &v);
        times[n++] = ts_now_s() - a;
    }
    qsort(times, (size_t)n, sizeof *times, cmp_double);
    ts_tensor_free(&x);
    ts_tensor_free(&t);
    ts_dit_free(&m);
    ts_engine_free(&e);
    return B / times[n / 2];
}

/* ---- the server, on its own thread -------------------------------------------------------------- */

static struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int port; /* > 0 once listening, < 0 on failure */
    uv_async_t stop;
    ts_netkey_t nk;
    ts_rpc_t *rpc;
    ts_serve_stats_t stats;
} server;

static void server_stop_cb(uv_async_t *a) {
    ts_serve_t *s = a->data;
    ts_serve_stats(s, &server.stats);
    ts_serve_shutdown(s);
    ts_rpc_shutdown(server.rpc); /* closes the listener and the connections */
    uv_close((uv_handle_t *)a, NULL);
}

static void *server_main(void *arg) {
    (void)arg;
    uv_loop_t loop;
    uv_loop_init(&loop);
    ts_identity_t id;
    ts_identity_generate(&id);
    ts_net_t *net = NULL;
    ts_rpc_t *rpc = NULL;
    ts_listener_t *l = NULL;
    ts_serve_t *s = NULL;
    char err[256] = "";
    ts_serve_expert_t x = {.cfg = cfg, .params = &params};
    memcpy(x.id, expert_id, 32);
    ts_serve_opts_t o;
    ts_serve_opts_default(&o);
    o.max_batch = BATCH;
    o.max_wait_ms = 2;
    o.max_queue = 4096;
    o.compute_threads = opt.threads;
    int rc = ts_net_new(&net, &loop, &id, &server.nk, NULL);
    if (!rc)
        rc = ts_rpc_new(&rpc, net, NULL);
    if (!rc)
        rc = ts_rpc_listen(rpc, "127.0.0.1:0", &l, err, sizeof err);
    if (!rc)
        rc = ts_serve_new(&s, &loop, rpc, &x, &o, err, sizeof err);
    if (!rc) {
        uv_async_init(&loop, &server.stop, server_stop_cb);
        server.stop.data = s;
        server.rpc = rpc;
    }
    pthread_mutex_lock(&server.mu);
    server.port = rc ? -1 : ts_listener_port(l);
    pthread_cond_signal(&server.cv);
    pthread_mutex_unlock(&server.mu);
    if (rc) {
        fprintf(stderr, "bench_serve: server: %s %s\n", ts_strerror(rc), err);
        return NULL;
    }
    uv_run(&loop, UV_RUN_DEFAULT); /* until the stop async, and everything it closes */
    ts_serve_free(s);
    ts_rpc_free(rpc);
    ts_net_free(net);
    uv_loop_close(&loop);
    ts_identity_wipe(&id);
    return NULL;
}

/* ---- the clients -------------------------------------------------------------------------------- */

static uv_loop_t loop;
static ts_net_t *cnet[CLIENTS];
static ts_rpc_t *crpc[CLIENTS];
static ts_rpc_peer_t *cpeer[CLIENTS];
static float xdata[BATCH * 28 * 28];
static float tdata[BATCH];
static int32_t ydata[BATCH];

typedef struct run {
    double end;    /* closed loop: no new requests after this */
    int in_flight; /* requests sent and not answered */
    uint64_t samples, failed;
    double *lat; /* open loop: latencies (s) */
    int n_lat;
} run_t;

typedef struct slot {
    run_t *run;
    int client, B;
    double t0; /* scheduled arrival */
} slot_t;

static void send_one(slot_t *sl);

static void on_answer(ts_rpc_call_t *c, const ts_rpc_result_t *res, void *arg) {
    (void)c;
    slot_t *sl = arg;
    run_t *r = sl->run;
    r->in_flight--;
    if (res->status == TS_OK)
        r->samples += (uint64_t)sl->B;
    else
        r->failed++;
    if (r->lat) {
        if (r->n_lat < MAX_LAT && res->status == TS_OK)
            r->lat[r->n_lat++] = ts_now_s() - sl->t0;
        free(sl);
        return;
    }
    if (ts_now_s() < r->end)
        send_one(sl);
}

static void send_one(slot_t *sl) {
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__DenoiseRequest d = TESSERA__DENOISE_REQUEST__INIT;
    Tessera__Tensor x = TESSERA__TENSOR__INIT;
    int64_t shape[4] = {sl->B, 1, cfg.input_size, cfg.input_size};
    x.has_dtype = x.has_data = 1;
    x.dtype = TESSERA__DTYPE__DTYPE_F32;
    x.n_shape = 4;
    x.shape = shape;
    x.data = (ProtobufCBinaryData){(size_t)sl->B * 28 * 28 * sizeof(float), (uint8_t *)xdata};
    d.has_expert_id = d.has_cfg_scale = 1;
    d.expert_id = (ProtobufCBinaryData){32, expert_id};
    d.x_t = &x;
    d.n_t = d.n_class_labels = (size_t)sl->B;
    d.t = tdata;
    d.class_labels = ydata;
    d.cfg_scale = 1.0f;
    env.body_case = TESSERA__ENVELOPE__BODY_DENOISE_REQUEST;
    env.denoise_request = &d;
    char err[256] = "";
    if (ts_rpc_call(cpeer[sl->client], &env, 10000, on_answer, sl, NULL, err, sizeof err)) {
        sl->run->failed++;
        return;
    }
    sl->run->in_flight++;
}

/* Closed loop: `clients` clients keep one request of B samples each in flight for seconds. */
static double closed_loop(int clients, int B, double seconds) {
    run_t r = {.end = ts_now_s() + seconds};
    slot_t slots[CLIENTS];
    double t0 = ts_now_s();
    for (int i = 0; i < clients; i++) {
        slots[i] = (slot_t){&r, i, B, 0};
        send_one(&slots[i]);
    }
    while (r.in_flight > 0)
        uv_run(&loop, UV_RUN_ONCE);
    double dt = ts_now_s() - t0;
    if (r.failed)
        fprintf(stderr, "bench_serve: %llu requests failed\n", (unsigned long long)r.failed);
    return (double)r.samples / dt;
}

/* Open loop: batch-1 requests arriving as a Poisson process at rate per second. */
typedef struct {
    run_t *run;
    double next, end, rate;
    int sent;
    uint32_t rng;
} arrivals_t;

static double uniform01(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((*s >> 8) + 0.5) / 16777216.0;
}

static void arrive_cb(uv_timer_t *t) {
    arrivals_t *a = t->data;
    double now = ts_now_s();
    while (a->next <= now && a->next < a->end) {
        slot_t *sl = malloc(sizeof *sl);
        *sl = (slot_t){a->run, a->sent++ % CLIENTS, 1, a->next};
        send_one(sl);
        a->next += -log(uniform01(&a->rng)) / a->rate;
    }
    if (a->next >= a->end)
        uv_timer_stop(t);
}

static void open_loop(double rate, double seconds, double *p50, double *p99) {
    run_t r = {0};
    r.lat = malloc(MAX_LAT * sizeof *r.lat);
    arrivals_t a = {&r, ts_now_s(), ts_now_s() + seconds, rate, 0, 12345};
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    t.data = &a;
    uv_timer_start(&t, arrive_cb, 0, 1);
    while (uv_is_active((uv_handle_t *)&t) || r.in_flight > 0)
        uv_run(&loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    qsort(r.lat, (size_t)r.n_lat, sizeof *r.lat, cmp_double);
    *p50 = r.n_lat ? r.lat[(int)ceil(0.50 * r.n_lat) - 1] : NAN;
    *p99 = r.n_lat ? r.lat[(int)ceil(0.99 * r.n_lat) - 1] : NAN;
    free(r.lat);
}

static void clients_start(int port) {
    char addr[64], err[256];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    uv_loop_init(&loop);
    for (int i = 0; i < CLIENTS; i++) {
        ts_identity_t id;
        ts_identity_generate(&id);
        if (ts_net_new(&cnet[i], &loop, &id, &server.nk, NULL) ||
            ts_rpc_new(&crpc[i], cnet[i], NULL) ||
            ts_rpc_peer_get(crpc[i], addr, &cpeer[i], err, sizeof err)) {
            fprintf(stderr, "bench_serve: client %d cannot start\n", i);
            exit(1);
        }
        ts_identity_wipe(&id);
    }
}

static void clients_stop(void) {
    for (int i = 0; i < CLIENTS; i++)
        ts_rpc_shutdown(crpc[i]);
    uv_run(&loop, UV_RUN_DEFAULT);
    for (int i = 0; i < CLIENTS; i++) {
        ts_rpc_free(crpc[i]);
        ts_net_free(cnet[i]);
    }
    uv_loop_close(&loop);
}

/* ---- main ----------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            opt.quick = 1, opt.seconds = 0.3;
        else if (strcmp(argv[i], "--json") == 0)
            opt.json = 1;
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            opt.seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            opt.threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_serve [--quick] [--seconds S] [--threads N] [--json]\n");
            return 2;
        }
    }
    if (sodium_init() < 0 || opt.seconds <= 0 || opt.threads < 1)
        return 2;
    for (int i = 0; i < BATCH * 28 * 28; i++)
        xdata[i] = (float)((i * 37) % 200) / 100.0f - 1.0f;
    for (int i = 0; i < BATCH; i++)
        tdata[i] = 0.5f, ydata[i] = i % 11;
    make_expert();
    double fwd1 = 0, fwd16 = 0;

    ts_netkey_generate(&server.nk);
    pthread_mutex_init(&server.mu, NULL);
    pthread_cond_init(&server.cv, NULL);
    pthread_create(&server.thread, NULL, server_main, NULL);
    pthread_mutex_lock(&server.mu);
    while (server.port == 0)
        pthread_cond_wait(&server.cv, &server.mu);
    pthread_mutex_unlock(&server.mu);
    if (server.port < 0)
        return 1;
    clients_start(server.port);

    closed_loop(CLIENTS, 1, 0.2); /* warm-up: connections, pages */
    double many = 0, one = 0;
    for (int rep = 0; rep < 2; rep++) { /* interleaved, best of two: a shared machine */
        double m = closed_loop(CLIENTS, 1, opt.seconds), o = closed_loop(1, BATCH, opt.seconds);
        double f1 = forward_rate(1), f16 = forward_rate(BATCH);
        many = m > many ? m : many;
        one = o > one ? o : one;
        fwd1 = f1 > fwd1 ? f1 : fwd1;
        fwd16 = f16 > fwd16 ? f16 : fwd16;
    }
    double p50[2], p99[2], load[2] = {0.5, 0.9};
    for (int i = 0; i < 2; i++)
        open_loop(load[i] * many, opt.seconds, &p50[i], &p99[i]);

    clients_stop();
    uv_async_send(&server.stop);
    pthread_join(server.thread, NULL);
    ts_serve_stats_t *st = &server.stats;
    double mean_batch = st->batches ? (double)st->rows / (double)st->batches : 0;

    if (opt.json) {
        json_t *o =
            json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "threads",
                      opt.threads, "forward_b1_per_s", fwd1, "forward_b16_per_s", fwd16,
                      "served_16x1_per_s", many, "served_1x16_per_s", one, "ratio_16x1_vs_1x16",
                      many / one, "p50_ms_at_50", p50[0] * 1e3, "p99_ms_at_50", p99[0] * 1e3,
                      "p50_ms_at_90", p50[1] * 1e3, "p99_ms_at_90", p99[1] * 1e3,
                      "served_vs_forward_b16", one / fwd16, "mean_batch_rows", mean_batch);
        char *s = json_dumps(o, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(o);
    } else {
        printf("tiny expert, %d compute threads, loopback, %.1f s per measurement\n", opt.threads,
               opt.seconds);
        printf("  in-process forward        batch 1: %8.1f samples/s   batch 16: %8.1f samples/s\n",
               fwd1, fwd16);
        printf("  served, 16 clients x batch 1:      %8.1f samples/s  (%.0f %% of one client x "
               "batch 16)\n",
               many, 100 * many / one);
        printf("  served, 1 client x batch 16:       %8.1f samples/s  (%.0f %% of in-process batch "
               "16)\n",
               one, 100 * one / fwd16);
        for (int i = 0; i < 2; i++)
            printf("  open loop at %2.0f %% (%6.1f req/s): p50 %6.2f ms  p99 %6.2f ms\n",
                   100 * load[i], load[i] * many, p50[i] * 1e3, p99[i] * 1e3);
        printf("  server: %llu batches, %.1f rows per batch on average\n",
               (unsigned long long)st->batches, mean_batch);
    }
    ts_tensor_free(&params);
    return 0;
}
