/*
 * test_serve.c — the expert server (daemon/serve.h) and the weight server (daemon/weights_srv.h)
 * over real loopback connections: a server endpoint and 16 client endpoints on one uv loop
 * (net/rpc.h), a small random DiT.
 *
 *   - the DiT forward is batch-invariant bit for bit (the `tiny` and `small` presets and the
 *     test model; a sample in a batch of 16 equals the sample alone), and thread-count-invariant;
 *   - a served velocity equals the local one bit for bit: ts_dit_forward with per-sample t, and
 *     ts_dit_velocity (the local sampler's guided path) with guidance; also for F16 inputs;
 *   - 16 concurrent clients get their own answers, and they were batched;
 *   - a flood is answered busy past max_queue; requests whose deadline passes in the queue are
 *     dropped before compute (ERROR_DEADLINE_EXCEEDED); a cancelled queued request is not
 *     computed;
 *   - malformed requests (NaN, wrong shape, wrong dtype size, too many rows, a label out of
 *     range, an unknown expert) get an error naming the problem, and the same connection then
 *     serves a good request;
 *   - shutdown answers ERROR_UNAVAILABLE and joins the compute thread;
 *   - manifest and chunks reassemble to the stored file, and the bandwidth limit holds (a lower
 *     bound on the elapsed time only); busy past max_pending.
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/testutil.h"
#include "tests/uvutil.h"

#include <math.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "daemon/serve.h"
#include "daemon/weights_srv.h"
#include "kernels/ops.h"
#include "model/dit_io.h"
#include "model/sampler.h"
#include "net/frame.h"

#define WAIT_MS 60000
/* A request's deadline where the test is not about deadlines: an answer takes milliseconds, but a
 * loaded machine under sanitizers can stall for seconds; under WAIT_MS, so the answer's own
 * error is what a failure reports. */
#define ANSWER_MS 50000
#define CLIENTS 16
#define IMG 8
#define CHW (IMG * IMG)
#define NCLS 4
#define MAXB 16

static uv_loop_t loop;
static ts_netkey_t nk;
static ts_identity_t sid, cid[CLIENTS];
static ts_net_t *snet, *cnet[CLIENTS];
static ts_rpc_t *srpc, *crpc[CLIENTS];
static ts_listener_t *listener;
static char addr[64];
static ts_engine_t eng; /* the tests' own, for local references */
static ts_dit_t ref;    /* the expert, for local references (max_batch 2·MAXB) */
static uint8_t expert_id[32];
static ts_serve_t *srv;

/* ---- the loop --------------------------------------------------------------------------------- */

/* Runs the loop until pred(arg) holds; fails the test after WAIT_MS (tests/uvutil.h). */
static void run_until(int (*pred)(void *), void *arg, const char *what) {
    tu_run_until(&loop, pred, arg, WAIT_MS, what);
}

static int int_nonzero(void *p) { return *(int *)p != 0; }

/* ---- the expert --------------------------------------------------------------------------------- */

static void test_config(ts_dit_config_t *c) {
    *c = (ts_dit_config_t){.input_size = IMG,
                           .in_channels = 1,
                           .patch_size = 2,
                           .hidden_size = 32,
                           .depth = 2,
                           .num_heads = 2,
                           .num_classes = NCLS,
                           .mlp_ratio = 2,
                           .freq_dim = 32};
}

/* DiT's init, then every parameter perturbed, so the output depends on x, t and y. */
static void random_dit(ts_dit_t *m, const ts_dit_config_t *c, ts_engine_t *e, int max_batch,
                       uint64_t seed) {
    TU_CHECK_OK(ts_dit_create(m, c, e, max_batch, 0));
    TU_CHECK_OK(ts_dit_init_weights(m, seed));
    tu_rng_t r = {seed * 7919 + 1};
    float *p = tu_f32(&m->param_mem);
    for (int64_t i = 0; i < m->num_params; i++)
        p[i] += tu_rng_uniform(&r, -0.05f, 0.05f);
}

static void serve_start(const ts_serve_opts_t *o) {
    ts_serve_expert_t x = {.cfg = ref.cfg, .params = &ref.param_mem};
    memcpy(x.id, expert_id, sizeof x.id);
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_serve_new(&srv, &loop, srpc, &x, o, err, sizeof err), TS_OK, err);
}

static int serve_freed(void *arg) {
    (void)arg;
    return ts_serve_free(srv) == TS_OK;
}

static void serve_stop(void) {
    run_until(serve_freed, NULL, "the server freed");
    srv = NULL;
}

/* Each test's teardown: a server that a failed test left running is freed, so that the tests
 * after it and the final teardown do not wait on its handle; one that cannot be freed (a compute
 * thread that never returns) ends the run at once, said. */
static int free_leftover(void **state) {
    (void)state;
    if (!srv)
        return 0;
    uint64_t until = uv_hrtime() + (uint64_t)WAIT_MS * 1000000u;
    while (ts_serve_free(srv) != TS_OK) {
        if (uv_hrtime() > until) {
            fprintf(stderr, "test_serve: a failed test's server did not stop in %d ms\n", WAIT_MS);
            _exit(1);
        }
        uv_run(&loop, UV_RUN_NOWAIT);
        nanosleep(&(struct timespec){0, 1000000L}, NULL);
    }
    srv = NULL;
    return 0;
}

/* Starts the server with these options (and 2 compute threads). */
static void serve_with(int max_batch, int max_wait_ms, int max_queue) {
    ts_serve_opts_t o;
    ts_serve_opts_default(&o);
    o.max_batch = max_batch;
    o.max_wait_ms = max_wait_ms;
    o.max_queue = max_queue;
    o.compute_threads = 2;
    serve_start(&o);
}

/* ---- fixture ---------------------------------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    if (sodium_init() < 0)
        return -1;
    uv_loop_init(&loop);
    ts_netkey_generate(&nk);
    ts_identity_generate(&sid);
    if (ts_net_new(&snet, &loop, &sid, &nk, NULL) || ts_rpc_new(&srpc, snet, NULL))
        return -1;
    for (int i = 0; i < CLIENTS; i++) {
        ts_identity_generate(&cid[i]);
        if (ts_net_new(&cnet[i], &loop, &cid[i], &nk, NULL) || ts_rpc_new(&crpc[i], cnet[i], NULL))
            return -1;
    }
    char err[256];
    if (ts_rpc_listen(srpc, "127.0.0.1:0", &listener, err, sizeof err))
        return -1;
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ts_listener_port(listener));
    if (tu_engine_init_cpu(&eng))
        return -1;
    randombytes_buf(expert_id, sizeof expert_id);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < CLIENTS; i++)
        ts_rpc_shutdown(crpc[i]);
    ts_rpc_shutdown(srpc);
    uv_run(&loop, UV_RUN_DEFAULT);
    int rc = ts_rpc_free(srpc) | ts_net_free(snet);
    for (int i = 0; i < CLIENTS; i++)
        rc |= ts_rpc_free(crpc[i]) | ts_net_free(cnet[i]);
    uv_loop_close(&loop);
    ts_engine_free(&eng);
    return rc ? -1 : 0;
}

static int setup_model(void **state) {
    (void)state;
    ts_dit_config_t c;
    test_config(&c);
    if (ts_dit_create(&ref, &c, &eng, 2 * MAXB, 0) || ts_dit_init_weights(&ref, 11))
        return -1;
    tu_rng_t r = {99};
    float *p = ref.param_mem.data;
    for (int64_t i = 0; i < ref.num_params; i++)
        p[i] += tu_rng_uniform(&r, -0.05f, 0.05f);
    return 0;
}

static int teardown_model(void **state) {
    (void)state;
    ts_dit_free(&ref);
    return 0;
}

/* ---- requests --------------------------------------------------------------------------------- */

/* One denoise request, as built by the test (any field may be spoilt before sending). */
typedef struct req {
    uint8_t id[32];
    Tessera__DType dtype;
    int64_t shape[4];
    void *data;
    size_t len;
    float t[MAXB];
    int32_t y[MAXB];
    size_t nt, ny;
    float cfg;
    float x[MAXB * CHW]; /* the values, F32 */
} req_t;

/* B random samples; t the same for all when same_t (what ts_dit_velocity can compare with). */
static void req_init(req_t *r, tu_rng_t *rng, int B, float cfg, int same_t) {
    memset(r, 0, sizeof *r);
    memcpy(r->id, expert_id, 32);
    r->dtype = TESSERA__DTYPE__DTYPE_F32;
    r->shape[0] = B, r->shape[1] = 1, r->shape[2] = IMG, r->shape[3] = IMG;
    for (int i = 0; i < B * CHW; i++)
        r->x[i] = tu_rng_uniform(rng, -1.5f, 1.5f);
    float t0 = tu_rng_uniform(rng, 0.0f, 1.0f);
    for (int i = 0; i < B; i++) {
        r->t[i] = same_t ? t0 : tu_rng_uniform(rng, 0.0f, 1.0f);
        r->y[i] = (int32_t)(tu_rng_next(rng) % (NCLS + 1));
    }
    r->nt = r->ny = (size_t)B;
    r->cfg = cfg;
    r->data = r->x;
    r->len = (size_t)B * CHW * sizeof(float);
}

typedef struct got {
    int calls, status, remote_code;
    uint32_t retry_after_ms;
    char message[1200];
    float v[MAXB * CHW];
    uint16_t v16[MAXB * CHW];
    Tessera__DType vdtype;
    uint32_t queue_us, compute_us, device_us, batch_size;
} got_t;

static void on_result(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    got_t *g = arg;
    g->calls++;
    g->status = res->status;
    g->remote_code = res->remote_code;
    snprintf(g->message, sizeof g->message, "%s", res->message);
    if (res->status == TS_EBUSY)
        g->retry_after_ms = res->reply->busy->retry_after_ms;
    if (res->status != TS_OK)
        return;
    const Tessera__DenoiseResponse *d = res->reply->denoise_response;
    g->vdtype = d->velocity->dtype;
    if (d->velocity->data.len <= sizeof g->v)
        memcpy(d->velocity->dtype == TESSERA__DTYPE__DTYPE_F32 ? (void *)g->v : (void *)g->v16,
               d->velocity->data.data, d->velocity->data.len);
    if (d->timings) {
        g->queue_us = d->timings->queue_us;
        g->compute_us = d->timings->compute_us;
        g->device_us = d->timings->device_us;
        g->batch_size = d->timings->batch_size;
    }
}

static ts_rpc_peer_t *peer(int client) {
    ts_rpc_peer_t *p;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_rpc_peer_get(crpc[client], addr, &p, err, sizeof err), TS_OK, err);
    return p;
}

/* The envelope of r, in the caller's structs (pointing into r). */
typedef struct wire_req {
    Tessera__Envelope env;
    Tessera__DenoiseRequest d;
    Tessera__Tensor x;
} wire_req_t;

static void wire_req(wire_req_t *w, const req_t *r) {
    w->env = (Tessera__Envelope)TESSERA__ENVELOPE__INIT;
    w->d = (Tessera__DenoiseRequest)TESSERA__DENOISE_REQUEST__INIT;
    w->x = (Tessera__Tensor)TESSERA__TENSOR__INIT;
    w->x.has_dtype = w->x.has_data = 1;
    w->x.dtype = r->dtype;
    w->x.n_shape = 4;
    w->x.shape = (int64_t *)r->shape;
    w->x.data = (ProtobufCBinaryData){r->len, r->data};
    w->d.has_expert_id = w->d.has_cfg_scale = 1;
    w->d.expert_id = (ProtobufCBinaryData){32, (uint8_t *)r->id};
    w->d.x_t = &w->x;
    w->d.n_t = r->nt;
    w->d.t = (float *)r->t;
    w->d.n_class_labels = r->ny;
    w->d.class_labels = (int32_t *)r->y;
    w->d.cfg_scale = r->cfg;
    w->env.body_case = TESSERA__ENVELOPE__BODY_DENOISE_REQUEST;
    w->env.denoise_request = &w->d;
}

static ts_rpc_call_t *send_req(int client, const req_t *r, uint32_t deadline_ms, got_t *g) {
    wire_req_t w;
    wire_req(&w, r);
    Tessera__Envelope env = w.env;
    ts_rpc_call_t *c = NULL;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_rpc_call(peer(client), &env, deadline_ms, on_result, g, &c, err, sizeof err),
                    TS_OK, err);
    return c;
}

static void wait_answer(got_t *g) { run_until(int_nonzero, &g->calls, "an answer"); }

/* The local velocity of r: ts_dit_velocity (the local sampler's path, guidance included) when
 * every t is the same, else ts_dit_forward with per-sample t (no guidance). */
static void local_velocity(const req_t *r, float *out) {
    int B = (int)r->shape[0];
    ts_tensor_t x, v, t;
    TU_CHECK_OK(ts_tensor_wrap(&x, (void *)r->x, TS_F32, TS_CPU, 4, TS_SHAPE(B, 1, IMG, IMG)));
    TU_CHECK_OK(ts_tensor_wrap(&v, out, TS_F32, TS_CPU, 4, TS_SHAPE(B, 1, IMG, IMG)));
    int same = 1;
    for (int i = 1; i < B; i++)
        same &= r->t[i] == r->t[0];
    if (same) {
        ts_dit_velocity_ctx_t vc;
        TU_CHECK_OK(ts_dit_velocity_init(&vc, &ref, r->y, B, r->cfg));
        TU_CHECK_OK(ts_dit_velocity(&vc, &x, r->t[0], &v));
        ts_dit_velocity_free(&vc);
        return;
    }
    assert_true(r->cfg == 1.0f);
    ts_tensor_t out_v;
    TU_CHECK_OK(ts_tensor_wrap(&t, (void *)r->t, TS_F32, TS_CPU, 1, TS_SHAPE(B)));
    TU_CHECK_OK(ts_dit_forward(&ref, &x, &t, r->y, B, &out_v));
    TU_CHECK_OK(ts_tensor_copy(&v, &out_v));
}

/* The served answer equals the local one bit for bit. */
static void check_answer(const req_t *r, const got_t *g, const char *what) {
    if (g->status != TS_OK) {
        ts_serve_stats_t st = {0};
        if (srv)
            ts_serve_stats(srv, &st);
        print_error("%s: status %s (%s); the server had %llu request(s), ran %llu batch(es) of "
                    "%llu row(s)\n",
                    what, ts_strerror(g->status), g->message, (unsigned long long)st.requests,
                    (unsigned long long)st.batches, (unsigned long long)st.rows);
        fail();
    }
    float want[MAXB * CHW];
    local_velocity(r, want);
    int n = (int)r->shape[0] * CHW;
    for (int i = 0; i < n; i++)
        if (memcmp(&g->v[i], &want[i], sizeof(float)) != 0) {
            print_error("%s: element %d is %.9g, locally %.9g\n", what, i, (double)g->v[i],
                        (double)want[i]);
            fail();
        }
}

/* ---- batch invariance ---------------------------------------------------------------------------- */

/* Each sample of a batch of 16 equals the sample run alone, bit for bit; and the batch gives the
 * same bits on 1 and 3 threads. */
static void check_batch_invariance(const ts_dit_config_t *c) {
    enum { N = 16 };
    ts_engine_t e1, e3;
    ts_engine_opts_t o1 = {.device = TS_CPU, .threads = 1}, o3 = {.device = TS_CPU, .threads = 3};
    TU_CHECK_OK(ts_engine_init(&e1, &o1));
    TU_CHECK_OK(ts_engine_init(&e3, &o3));
    ts_dit_t a, b;
    random_dit(&a, c, &eng, N, 5);
    random_dit(&b, c, &e1, N, 5);
    int64_t chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    ts_tensor_t x, t, v, xs, tsl;
    tu_alloc_f32(&x, 4, TS_SHAPE(N, c->in_channels, c->input_size, c->input_size));
    tu_alloc_f32(&t, 1, TS_SHAPE(N));
    tu_rng_t r = {3};
    tu_fill_uniform(&r, &x, -1, 1);
    tu_fill_uniform(&r, &t, 0, 1);
    int32_t y[N];
    for (int i = 0; i < N; i++)
        y[i] = i % (c->num_classes + 1);
    TU_CHECK_OK(ts_dit_forward(&a, &x, &t, y, N, &v));
    float *all = tu_host_copy(&v);
    for (int i = 0; i < N; i++) {
        TU_CHECK_OK(ts_tensor_slice(&xs, &x, i, 1));
        TU_CHECK_OK(ts_tensor_slice(&tsl, &t, i, 1));
        TU_CHECK_OK(ts_dit_forward(&a, &xs, &tsl, y + i, 1, &v));
        if (memcmp(v.data, all + i * chw, (size_t)chw * sizeof(float)) != 0)
            fail_msg("hidden %d: sample %d alone differs from the same sample in a batch of %d",
                     c->hidden_size, i, N);
    }
    for (int k = 0; k < 2; k++) {
        b.eng = k == 0 ? &e1 : &e3;
        TU_CHECK_OK(ts_dit_forward(&b, &x, &t, y, N, &v));
        if (memcmp(v.data, all, (size_t)(N * chw) * sizeof(float)) != 0)
            fail_msg("hidden %d: the batch differs on %d thread(s)", c->hidden_size,
                     k == 0 ? 1 : 3);
    }
    free(all);
    ts_dit_free(&a);
    ts_dit_free(&b);
    TU_FREE_TENSORS(&x, &t);
    ts_engine_free(&e1);
    ts_engine_free(&e3);
}

static void test_forward_batch_invariant(void **state) {
    (void)state;
    ts_dit_config_t c;
    test_config(&c);
    check_batch_invariance(&c);
    TU_CHECK_OK(ts_dit_config_preset("tiny", &c));
    check_batch_invariance(&c);
    TU_CHECK_OK(ts_dit_config_preset("small", &c)); /* wider heads: the other attention path */
    check_batch_invariance(&c);
}

/* ---- answers ------------------------------------------------------------------------------------- */

/* Sends a plain request of 3 samples and a guided one of 5 (guidance 2.5) and waits for both. */
static void plain_and_guided(tu_rng_t *rng, req_t *plain, req_t *guided, got_t *g1, got_t *g2) {
    req_init(plain, rng, 3, 1.0f, 0);
    req_init(guided, rng, 5, 2.5f, 1);
    send_req(0, plain, ANSWER_MS, g1);
    send_req(0, guided, ANSWER_MS, g2);
    wait_answer(g1);
    wait_answer(g2);
}

/* The batch observer: how many batches, and any whose device time was 0 or over its compute
 * time (on the CPU both are wall time, the device's the inner span). */
static _Atomic int obs_batches, obs_bad;
static void observe(void *ctx, int rows, uint64_t compute_us, uint64_t device_us) {
    (void)ctx;
    atomic_fetch_add(&obs_batches, 1);
    if (rows < 1 || device_us == 0 || device_us > compute_us)
        atomic_fetch_add(&obs_bad, 1);
}

static void test_answers_equal_local(void **state) {
    (void)state;
    ts_serve_opts_t o;
    ts_serve_opts_default(&o);
    o.max_batch = MAXB, o.max_wait_ms = 1, o.max_queue = 64, o.compute_threads = 2;
    o.on_batch = observe;
    atomic_store(&obs_batches, 0);
    atomic_store(&obs_bad, 0);
    serve_start(&o);
    tu_rng_t rng = {17};
    static req_t plain, guided, f16;
    got_t g1 = {0}, g2 = {0};
    plain_and_guided(&rng, &plain, &guided, &g1, &g2);
    check_answer(&plain, &g1, "per-sample t, no guidance");
    check_answer(&guided, &g2, "guidance 2.5");
    assert_true(g2.batch_size >= 10); /* 5 guided samples are 10 rows */
    assert_true(g2.compute_us > 0);
    assert_true(g2.device_us > 0 && g2.device_us <= g2.compute_us); /* Timings.device_us */

    /* F16 in, F16 out: the F32 answer for the F16-rounded input, rounded to F16 */
    req_init(&f16, &rng, 2, 1.0f, 1);
    uint16_t h[2 * CHW];
    ts_tensor_t xs, xh, vw, vh;
    TU_CHECK_OK(ts_tensor_wrap(&xs, f16.x, TS_F32, TS_CPU, 1, TS_SHAPE(2 * CHW)));
    TU_CHECK_OK(ts_tensor_wrap(&xh, h, TS_F16, TS_CPU, 1, TS_SHAPE(2 * CHW)));
    TU_CHECK_OK(ts_convert(&eng, &xh, &xs)); /* h = f16(x) */
    TU_CHECK_OK(ts_convert(&eng, &xs, &xh)); /* x = f32(h): what the server computes with */
    f16.dtype = TESSERA__DTYPE__DTYPE_F16;
    f16.data = h;
    f16.len = sizeof h;
    got_t g3 = {0};
    send_req(1, &f16, ANSWER_MS, &g3);
    wait_answer(&g3);
    assert_int_equal(g3.status, TS_OK);
    assert_int_equal(g3.vdtype, TESSERA__DTYPE__DTYPE_F16);
    float want[2 * CHW];
    uint16_t want16[2 * CHW];
    local_velocity(&f16, want);
    TU_CHECK_OK(ts_tensor_wrap(&vw, want, TS_F32, TS_CPU, 1, TS_SHAPE(2 * CHW)));
    TU_CHECK_OK(ts_tensor_wrap(&vh, want16, TS_F16, TS_CPU, 1, TS_SHAPE(2 * CHW)));
    TU_CHECK_OK(ts_convert(&eng, &vh, &vw));
    assert_memory_equal(g3.v16, want16, sizeof want16);

    ts_serve_stats_t st;
    ts_serve_stats(srv, &st);
    assert_int_equal(st.requests, 3);
    assert_int_equal(st.answered[TS_SERVE_OK], 3);
    serve_stop();
    /* every batch reported its device time, inside its compute time */
    assert_true(atomic_load(&obs_batches) >= 2);
    assert_int_equal(atomic_load(&obs_bad), 0);
}

/* Serves at precision p: the device note says so (note_frag), and the answers, plain and guided,
 * are the local forward's at p bit for bit (so its rows do not depend on their batch or the
 * server's threads either). The server stays up (serve_stop is the caller's). */
static void answers_at(ts_precision_t p, const char *note_frag, uint64_t seed, ts_serve_opts_t *o) {
    ts_serve_opts_default(o);
    o->max_batch = MAXB;
    o->max_wait_ms = 1;
    o->max_queue = 64;
    o->compute_threads = 2;
    o->precision = p;
    serve_start(o);
    char device[128], note[512];
    ts_serve_device(srv, device, sizeof device, note, sizeof note);
    assert_non_null(strstr(note, note_frag));
    tu_rng_t rng = {seed};
    static req_t plain, guided;
    got_t g1 = {0}, g2 = {0};
    plain_and_guided(&rng, &plain, &guided, &g1, &g2);
    TU_CHECK_OK(ts_dit_set_precision(&ref, p, NULL, 0));
    char what[64];
    snprintf(what, sizeof what, "%s, no guidance", ts_precision_name(p));
    check_answer(&plain, &g1, what);
    snprintf(what, sizeof what, "%s, guidance 2.5", ts_precision_name(p));
    check_answer(&guided, &g2, what);
    TU_CHECK_OK(ts_dit_set_precision(&ref, TS_PREC_F32, NULL, 0));
}

/* [compute] precision = bf16. Skipped with the reason where bf16 cannot run (the server then
 * stays f32). */
static void test_answers_bf16(void **state) {
    (void)state;
    char why[256] = "";
    if (ts_engine_precision_check(&eng, TS_PREC_BF16, why, sizeof why) != TS_OK) {
        print_message("test_answers_bf16: skipped: %s\n", why);
        skip();
    }
    ts_serve_opts_t o;
    answers_at(TS_PREC_BF16, "bf16 products", 23, &o);
    serve_stop();
}

/* [compute] attention: fused asked for (not the default of a model this small), then measured:
 * the device note says which runs, and the answers, plain and guided, are the local forward's
 * with that attention bit for bit (so the option reaches the model, and measuring leaves it
 * consistent). */
static void test_answers_attention(void **state) {
    (void)state;
    ts_attn_impl_t was = ref.attn;
    assert_int_equal(was, TS_ATTN_COMPOSED);
    const ts_attn_choice_t choices[2] = {TS_ATTN_CHOOSE_FUSED, TS_ATTN_CHOOSE_MEASURE};
    for (int i = 0; i < 2; i++) {
        ts_serve_opts_t o;
        ts_serve_opts_default(&o);
        o.max_batch = MAXB;
        o.max_wait_ms = 1;
        o.max_queue = 64;
        o.compute_threads = 2;
        o.attention = choices[i];
        serve_start(&o);
        char device[128], note[1024];
        ts_serve_device(srv, device, sizeof device, note, sizeof note);
        ts_attn_impl_t a = TS_ATTN_FUSED;
        if (i == 0) {
            TU_CHECK_CONTAINS(note, "attention fused");
        } else {
            TU_CHECK_CONTAINS(note, "attention measured: ");
            a = strstr(note, "attention measured: fused") ? TS_ATTN_FUSED : TS_ATTN_COMPOSED;
        }
        print_message("  %s: %s\n", ts_attn_choice_name(choices[i]), strstr(note, "attention"));
        tu_rng_t rng = {37 + (uint64_t)i};
        static req_t plain, guided;
        got_t g1 = {0}, g2 = {0};
        plain_and_guided(&rng, &plain, &guided, &g1, &g2);
        TU_CHECK_OK(ts_dit_set_attention(&ref, a));
        check_answer(&plain, &g1, ts_attn_name(a));
        check_answer(&guided, &g2, ts_attn_name(a));
        TU_CHECK_OK(ts_dit_set_attention(&ref, was));
        serve_stop();
    }
}

/* f16 serves everywhere (emulated on the CPU, and the device note says so), its answers those of
 * the local forward at f16; a model whose f16 forward overflows (a weight past ±65504) is answered
 * with an error that says so, never with NaNs. */
static void test_answers_f16(void **state) {
    (void)state;
    ts_serve_opts_t o;
    answers_at(TS_PREC_F16, "f16 products (emulated", 29, &o);
    serve_stop();

    static req_t plain;
    tu_rng_t rng = {31};
    req_init(&plain, &rng, 3, 1.0f, 0);
    float *p = ref.param_mem.data, keep = p[0]; /* the patch embedding's first weight */
    p[0] = 1e5f;
    serve_start(&o);
    got_t g = {0};
    send_req(0, &plain, ANSWER_MS, &g);
    wait_answer(&g);
    p[0] = keep;
    serve_stop();
    if (g.status != TS_EPEER || g.remote_code != TESSERA__ERROR_CODE__ERROR_INTERNAL) {
        print_error("an overflowing f16 model: status %s code %d: %s\n", ts_strerror(g.status),
                    g.remote_code, g.message);
        fail();
    }
    TU_CHECK_CONTAINS(g.message, "non-finite velocity");
    TU_CHECK_CONTAINS(g.message, "65504");
}

/* 16 clients, 4 requests each, all at once (a mix of guided and not, 1 or 2 samples): each gets
 * its own answer, and the server batched them. */
static void test_concurrent_clients(void **state) {
    (void)state;
    enum { PER = 4, N = CLIENTS * PER };
    serve_with(MAXB, 20, 256);
    static req_t reqs[N];
    static got_t gots[N];
    memset(gots, 0, sizeof gots);
    tu_rng_t rng = {23};
    for (int i = 0; i < N; i++) {
        int guided = i % 3 == 0;
        req_init(&reqs[i], &rng, 1 + i % 2, guided ? 3.0f : 1.0f, guided);
        send_req(i % CLIENTS, &reqs[i], 30000, &gots[i]);
    }
    for (int i = 0; i < N; i++)
        wait_answer(&gots[i]);
    int batched = 0;
    for (int i = 0; i < N; i++) {
        char what[64];
        snprintf(what, sizeof what, "request %d of client %d", i, i % CLIENTS);
        check_answer(&reqs[i], &gots[i], what);
        assert_int_equal(gots[i].calls, 1);
        batched |= gots[i].batch_size > (uint32_t)reqs[i].shape[0] * (reqs[i].cfg != 1.0f ? 2 : 1);
    }
    ts_serve_stats_t st;
    ts_serve_stats(srv, &st);
    assert_int_equal(st.answered[TS_SERVE_OK], N);
    assert_true(batched);
    assert_true(st.batches < (uint64_t)N);
    ts_serve_load_t ld;
    ts_serve_load(srv, &ld);
    assert_int_equal(ld.queue_depth, 0);
    assert_true(ld.item_latency_us > 0);
    assert_true(ld.requests_per_s > 0.0f);
    serve_stop();
}

/* Out of device memory (simulated: batches over 4 rows fail as a GPU's would): a batch that does
 * not fit is split and its requests still get the right answers, the rows per batch drop to
 * what fits, and a request that does not fit alone is answered ERROR_UNAVAILABLE with the
 * reason. The server goes on serving. */
static void test_out_of_memory(void **state) {
    (void)state;
    enum { N = 12 };
    ts_serve_opts_t o;
    ts_serve_opts_default(&o);
    o.max_batch = MAXB;
    o.max_wait_ms = 20; /* so that the requests batch */
    o.max_queue = 256;
    o.compute_threads = 2;
    o.fault_nomem_rows = 4;
    serve_start(&o);
    static req_t reqs[N], big;
    static got_t gots[N], gbig;
    memset(gots, 0, sizeof gots);
    memset(&gbig, 0, sizeof gbig);
    tu_rng_t rng = {29};
    for (int i = 0; i < N; i++) { /* 1 or 2 rows, or a guided sample: 2 rows */
        int guided = i % 4 == 0;
        req_init(&reqs[i], &rng, 1 + (i % 2) * !guided, guided ? 2.0f : 1.0f, guided);
        send_req(i % CLIENTS, &reqs[i], 30000, &gots[i]);
    }
    req_init(&big, &rng, 3, 2.0f, 1); /* 6 rows: more than fit at once */
    send_req(0, &big, 30000, &gbig);
    for (int i = 0; i < N; i++)
        wait_answer(&gots[i]);
    wait_answer(&gbig);
    for (int i = 0; i < N; i++) {
        char what[64];
        snprintf(what, sizeof what, "request %d, after a split", i);
        check_answer(&reqs[i], &gots[i], what);
        assert_true(gots[i].batch_size <= 4);
    }
    assert_int_equal(gbig.status, TS_EPEER);
    assert_int_equal(gbig.remote_code, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE);
    assert_non_null(strstr(gbig.message, "out of device memory"));
    ts_serve_stats_t st;
    ts_serve_stats(srv, &st);
    assert_true(st.nomem_splits >= 1);
    assert_int_equal(st.nomem_refused, 1);
    assert_true(st.rows_cap <= 4 && st.rows_cap >= 1);
    assert_int_equal(st.answered[TS_SERVE_OK], N);
    assert_int_equal(st.answered[TS_SERVE_UNAVAILABLE], 1);
    /* and it still serves */
    static req_t after;
    static got_t gafter;
    memset(&gafter, 0, sizeof gafter);
    req_init(&after, &rng, 2, 1.0f, 0);
    send_req(1, &after, 30000, &gafter);
    wait_answer(&gafter);
    check_answer(&after, &gafter, "after the refusal");
    serve_stop();
}

/* ---- load: busy, deadlines, cancel ------------------------------------------------------------ */

/* At least n of the server's counter at byte offset off of ts_serve_stats_t. */
typedef struct {
    int n;
    size_t off;
} at_least_t;

static int reached(void *arg) {
    at_least_t *a = arg;
    ts_serve_stats_t st;
    ts_serve_stats(srv, &st);
    uint64_t v;
    memcpy(&v, (const char *)&st + a->off, sizeof v);
    return v >= (uint64_t)a->n;
}

/* Whether the server has answered a->n requests as expired or cancelled. */
static int dropped_all(void *arg) {
    at_least_t *a = arg;
    ts_serve_stats_t st;
    ts_serve_stats(srv, &st);
    return st.answered[TS_SERVE_DEADLINE] + st.answered[TS_SERVE_CANCELLED] >= (uint64_t)a->n;
}

/* Runs the loop until the server has received n requests. */
static void wait_received(int n) {
    at_least_t a = {n, offsetof(ts_serve_stats_t, requests)};
    run_until(reached, &a, "requests received");
}

/* The memory the server holds, known from the expert's config (ts_dit_memory): max_batch is kept
 * where it fits, lowered to the rows that fit a smaller budget (a request over them refused with
 * the reason, one within answered as the local forward), and a budget under one row refuses the
 * expert with both figures. */
static void test_memory_sizes_batch(void **state) {
    (void)state;
    ts_dit_memory_t mem;
    TU_CHECK_OK(ts_dit_memory(&ref.cfg, TS_PREC_F32, TS_ATTN_COMPOSED, &mem));
    serve_with(MAXB, 0, 64);
    int rows = 0;
    uint64_t model_bytes = 0, row_bytes = 0;
    char dev[128], note[640];
    ts_serve_capacity(srv, &rows, &model_bytes, &row_bytes);
    ts_serve_device(srv, dev, sizeof dev, note, sizeof note);
    assert_int_equal(rows, MAXB);
    assert_true(model_bytes == ts_dit_memory_total(&mem, 0, 0) && model_bytes >= mem.params);
    assert_true(row_bytes == mem.infer_per_sample && row_bytes > 0);
    TU_CHECK_CONTAINS(note, "rows");
    serve_stop();

    ts_serve_opts_t o;
    ts_serve_opts_default(&o);
    o.max_batch = MAXB;
    o.max_queue = 64;
    o.compute_threads = 2;
    o.memory_budget = ts_dit_memory_total(&mem, 0, 5) + 1;
    serve_start(&o);
    ts_serve_capacity(srv, &rows, &model_bytes, &row_bytes);
    ts_serve_device(srv, dev, sizeof dev, note, sizeof note);
    assert_int_equal(rows, 5);
    TU_CHECK_CONTAINS(note, "max_batch 16 lowered to 5");
    ts_serve_stats_t st;
    ts_serve_stats(srv, &st);
    assert_int_equal(st.rows_cap, 5);
    tu_rng_t rng = {41};
    static req_t fits, over;
    static got_t gf, go;
    memset(&gf, 0, sizeof gf);
    memset(&go, 0, sizeof go);
    req_init(&fits, &rng, 5, 1.0f, 0);
    req_init(&over, &rng, 3, 2.0f, 1); /* 6 rows with guidance */
    send_req(0, &fits, 30000, &gf);
    send_req(1, &over, 30000, &go);
    wait_answer(&gf);
    wait_answer(&go);
    check_answer(&fits, &gf, "5 rows under a 5-row budget");
    assert_int_equal(go.status, TS_EPEER);
    assert_int_equal(go.remote_code, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT);
    TU_CHECK_CONTAINS(go.message, "at most 5 rows");
    serve_stop();

    o.memory_budget = ts_dit_memory_total(&mem, 0, 1) - 1;
    ts_serve_expert_t x = {.cfg = ref.cfg, .params = &ref.param_mem};
    memcpy(x.id, expert_id, sizeof x.id);
    char err[512] = "";
    ts_serve_t *none = NULL;
    assert_int_equal(ts_serve_new(&none, &loop, srpc, &x, &o, err, sizeof err), TS_ENOMEM);
    assert_null(none);
    TU_CHECK_CONTAINS(err, "needs");
    TU_CHECK_CONTAINS(err, "for one row");
}

/* A flood: 40 requests of 3 rows at once against a queue of 4 rows. The first waits up to 2 s
 * for company (3 rows < a batch of 4) while the others arrive: each finds no room for its 3 rows
 * and is answered busy at once, whatever the machine's speed (with 1-row requests the compute
 * threads could drain the queue as fast as the loop delivered them). */
static void test_flood_busy(void **state) {
    (void)state;
    enum { N = 40 };
    serve_with(4, 2000, 4);
    static req_t reqs[N];
    static got_t gots[N];
    memset(gots, 0, sizeof gots);
    tu_rng_t rng = {29};
    for (int i = 0; i < N; i++) {
        req_init(&reqs[i], &rng, 3, 1.0f, 0);
        send_req(i % 2, &reqs[i], 30000, &gots[i]);
    }
    int busy = 0, ok = 0;
    for (int i = 0; i < N; i++) {
        wait_answer(&gots[i]);
        assert_int_equal(gots[i].calls, 1);
        if (gots[i].status == TS_EBUSY) {
            busy++;
            assert_true(gots[i].retry_after_ms >= 1);
        } else {
            check_answer(&reqs[i], &gots[i], "a flooded request");
            ok++;
        }
    }
    assert_true(busy > 0);
    assert_true(ok >= 1);
    assert_int_equal(busy + ok, N);
    serve_stop();
}

/* Requests whose deadline passes while queued are dropped before compute: the loop is held up
 * (so the clients cannot cancel first, once all are delivered) while the compute thread finds
 * them expired. */
static void test_deadline_dropped(void **state) {
    (void)state;
    enum { N = 6 };
    serve_with(MAXB, 1000, 64);
    static req_t reqs[N];
    static got_t gots[N];
    memset(gots, 0, sizeof gots);
    tu_rng_t rng = {31};
    for (int i = 0; i < N; i++) {
        req_init(&reqs[i], &rng, 1, 1.0f, 0);
        send_req(0, &reqs[i], 400, &gots[i]);
    }
    wait_received(N);
    struct timespec ts = {0, 900 * 1000000L};
    nanosleep(&ts, NULL); /* the loop stands still; the compute thread does not */
    for (int i = 0; i < N; i++) {
        wait_answer(&gots[i]);
        assert_int_equal(gots[i].status, TS_ETIMEDOUT);
    }
    /* Each is dropped at its deadline by the compute thread — or, where the loop took longer
     * than the deadline to deliver all N (a loaded machine, sanitizers), cancelled first by its
     * client, whose own deadline runs from the send, before the server's from the receipt. Either
     * way none is computed, and the deadline path must have run. */
    ts_serve_stats_t st;
    at_least_t a = {N, offsetof(ts_serve_stats_t, requests)};
    run_until(dropped_all, &a, "the server dropping the expired requests");
    ts_serve_stats(srv, &st);
    assert_true(st.answered[TS_SERVE_DEADLINE] >= 1);
    assert_int_equal(st.rows, 0); /* none was computed */
    assert_int_equal(st.batches, 0);
    serve_stop();
}

/* A cancelled queued request is not computed: the next request runs alone. */
static void test_cancel_not_computed(void **state) {
    (void)state;
    serve_with(MAXB, 300, 64);
    tu_rng_t rng = {37};
    static req_t a, b;
    req_init(&a, &rng, 2, 1.0f, 0);
    req_init(&b, &rng, 1, 1.0f, 0);
    got_t ga = {0}, gb = {0};
    ts_rpc_call_t *ca = send_req(0, &a, 30000, &ga);
    wait_received(1);
    ts_rpc_cancel(ca);
    assert_int_equal(ga.status, TS_ECANCELED);
    at_least_t c = {1, offsetof(ts_serve_stats_t, answered[TS_SERVE_CANCELLED])};
    run_until(reached, &c, "the server hearing the cancel");
    send_req(0, &b, 30000, &gb);
    wait_answer(&gb);
    check_answer(&b, &gb, "the request after a cancelled one");
    assert_int_equal(gb.batch_size, 1);
    ts_serve_stats_t st;
    ts_serve_stats(srv, &st);
    assert_int_equal(st.rows, 1);
    serve_stop();
}

/* ---- malformed requests ----------------------------------------------------------------------- */

/* Sends r and expects remote error code with a message containing frag; then a good request on
 * the same connection is answered. */
static void expect_error(req_t *r, int code, const char *frag) {
    got_t g = {0}, ok = {0};
    send_req(2, r, ANSWER_MS, &g);
    wait_answer(&g);
    if (g.status != TS_EPEER || g.remote_code != code) {
        print_error("expected %s (%s), got status %s code %d: %s\n", ts_rpc_error_name(code), frag,
                    ts_strerror(g.status), g.remote_code, g.message);
        fail();
    }
    TU_CHECK_CONTAINS(g.message, frag);
    static req_t good;
    tu_rng_t rng = {41};
    req_init(&good, &rng, 1, 1.0f, 0);
    send_req(2, &good, ANSWER_MS, &ok);
    wait_answer(&ok);
    check_answer(&good, &ok, "a good request after a bad one");
}

/* A raw connection, for requests that rpc's own check would not let a caller send: the
 * envelope is packed by protobuf-c directly, and the answers are read by request id. */
typedef struct raw {
    ts_conn_t *conn;
    int open, closed;
    uint64_t next_id;
    int code[16]; /* the error code answering request id 2i+1, or -1 for a velocity */
    char message[16][256];
} raw_t;

static void raw_open(ts_conn_t *c) { ((raw_t *)ts_conn_data(c))->open = 1; }
static void raw_close(ts_conn_t *c, const ts_conn_close_info_t *why) {
    (void)why;
    ((raw_t *)ts_conn_data(c))->closed = 1;
}
static void raw_frame(ts_conn_t *c, const uint8_t *data, size_t len) {
    raw_t *r = ts_conn_data(c);
    Tessera__Envelope *env = NULL;
    char err[256];
    if (ts_frame_unpack_envelope(data, len, &env, err, sizeof err) != TS_OK)
        return;
    uint64_t i = env->request_id / 2;
    if (i < 16) {
        if (env->body_case == TESSERA__ENVELOPE__BODY_ERROR) {
            r->code[i] = env->error->code;
            snprintf(r->message[i], sizeof r->message[i], "%s",
                     env->error->message ? env->error->message : "");
        } else {
            r->code[i] = env->body_case == TESSERA__ENVELOPE__BODY_DENOISE_RESPONSE ? -1 : -2;
        }
    }
    ts_frame_free(env);
}
static const ts_conn_handler_t raw_handler = {raw_open, raw_frame, NULL, raw_close};

/* Sends r on the raw connection, unchecked; returns its slot in raw->code. */
static int raw_send(raw_t *raw, const req_t *r) {
    wire_req_t w;
    wire_req(&w, r);
    Tessera__Envelope env = w.env;
    env.has_request_id = env.has_deadline_ms = 1;
    env.request_id = 2 * raw->next_id + 1;
    env.deadline_ms = ANSWER_MS;
    size_t n = tessera__envelope__get_packed_size(&env);
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    tessera__envelope__pack(&env, buf);
    TU_CHECK_OK(ts_conn_send(raw->conn, buf, n));
    free(buf);
    int slot = (int)raw->next_id++;
    raw->code[slot] = 0;
    return slot;
}

static int raw_answered(void *arg) { return *(int *)arg != 0; }

/* Envelope-level faults, refused by the server's rpc check before the expert sees them; the
 * connection stays open and then serves a good request. */
static void test_malformed_envelope(void **state) {
    (void)state;
    serve_with(MAXB, 1, 64);
    raw_t raw = {0};
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_conn_connect(cnet[15], addr, &raw_handler, &raw, &raw.conn, err, sizeof err),
                    TS_OK, err);
    run_until(int_nonzero, &raw.open, "the raw connection open");
    static req_t r;
    tu_rng_t rng = {59};
    struct {
        const char *frag;
    } want[5] = {{"shape needs"}, {"dtype"}, {"outside [0, 1]"}, {"shape needs"}, {"t has 1"}};
    int slot[5];
    req_init(&r, &rng, 2, 1.0f, 0);
    r.dtype = TESSERA__DTYPE__DTYPE_F16; /* F32 bytes declared as F16 */
    slot[0] = raw_send(&raw, &r);
    req_init(&r, &rng, 2, 1.0f, 0);
    r.dtype = (Tessera__DType)9; /* no such dtype */
    slot[1] = raw_send(&raw, &r);
    req_init(&r, &rng, 2, 1.0f, 0);
    r.t[1] = 1.5f;
    slot[2] = raw_send(&raw, &r);
    req_init(&r, &rng, 2, 1.0f, 0);
    r.shape[0] = 1000000; /* an absurd batch, with the data of 2 */
    slot[3] = raw_send(&raw, &r);
    req_init(&r, &rng, 2, 1.0f, 0);
    r.nt = 1;
    slot[4] = raw_send(&raw, &r);
    for (int i = 0; i < 5; i++) {
        run_until(raw_answered, &raw.code[slot[i]], "an answer on the raw connection");
        assert_int_equal(raw.code[slot[i]], TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT);
        TU_CHECK_CONTAINS(raw.message[slot[i]], want[i].frag);
    }
    req_init(&r, &rng, 2, 1.0f, 0);
    int good = raw_send(&raw, &r);
    run_until(raw_answered, &raw.code[good], "a good request on the raw connection");
    assert_int_equal(raw.code[good], -1);
    assert_false(raw.closed);
    ts_conn_close(raw.conn);
    run_until(int_nonzero, &raw.closed, "the raw connection closed");
    serve_stop();
}

static void test_malformed(void **state) {
    (void)state;
    serve_with(MAXB, 1, 64);
    static req_t r;
    tu_rng_t rng = {43};
    /* meanwhile another client's good requests keep being served */
    static req_t bg[8];
    static got_t bgg[8];
    memset(bgg, 0, sizeof bgg);
    for (int i = 0; i < 8; i++) {
        req_init(&bg[i], &rng, 1, 2.0f, 1);
        send_req(3, &bg[i], 30000, &bgg[i]);
    }

    req_init(&r, &rng, 2, 1.0f, 0);
    r.x[5] = NAN;
    expect_error(&r, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT, "NaN or infinite");
    req_init(&r, &rng, 2, 1.0f, 0);
    r.x[70] = INFINITY;
    expect_error(&r, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT, "NaN or infinite");
    req_init(&r, &rng, 2, 1.0f, 0);
    r.shape[2] = 4, r.shape[3] = 16; /* right size, wrong shape */
    expect_error(&r, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT, "(B, 1, 8, 8)");
    req_init(&r, &rng, MAXB, 1.5f, 1); /* 16 guided samples: 32 rows */
    expect_error(&r, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT, "max_batch");
    /* an absurd batch with all its data: 4096 samples */
    static float big[4096 * CHW];
    static int32_t big_y[4096];
    static float big_t[4096];
    req_init(&r, &rng, 1, 1.0f, 0);
    wire_req_t w;
    wire_req(&w, &r);
    int64_t shape[4] = {4096, 1, IMG, IMG};
    w.x.shape = shape;
    w.x.data = (ProtobufCBinaryData){sizeof big, (uint8_t *)big};
    w.d.n_t = w.d.n_class_labels = 4096;
    w.d.t = big_t;
    w.d.class_labels = big_y;
    got_t gb = {0};
    TU_CHECK_OK(ts_rpc_call(peer(2), &w.env, ANSWER_MS, on_result, &gb, NULL, NULL, 0));
    wait_answer(&gb);
    assert_int_equal(gb.remote_code, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT);
    TU_CHECK_CONTAINS(gb.message, "4096 samples");
    req_init(&r, &rng, 2, 1.0f, 0);
    r.y[1] = NCLS + 1;
    expect_error(&r, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT, "class_labels[1]");
    req_init(&r, &rng, 2, 1.0f, 0);
    r.id[0] ^= 1;
    expect_error(&r, TESSERA__ERROR_CODE__ERROR_NOT_FOUND, "this node serves expert");
    /* the variance asked of an expert without a learned σ */
    req_init(&r, &rng, 2, 1.0f, 0);
    wire_req(&w, &r);
    w.d.has_with_variance = w.d.with_variance = 1;
    got_t gv = {0};
    TU_CHECK_OK(ts_rpc_call(peer(2), &w.env, ANSWER_MS, on_result, &gv, NULL, NULL, 0));
    wait_answer(&gv);
    assert_int_equal(gv.remote_code, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT);
    TU_CHECK_CONTAINS(gv.message, "no learned variance");

    for (int i = 0; i < 8; i++) {
        wait_answer(&bgg[i]);
        check_answer(&bg[i], &bgg[i], "a concurrent good request");
    }
    ts_rpc_peer_info_t info;
    ts_rpc_peer_info(peer(2), &info);
    assert_int_equal(info.attempts, 1); /* one connection throughout */
    assert_true(info.open);
    ts_serve_stats_t st;
    ts_serve_stats(srv, &st);
    assert_int_equal(st.answered[TS_SERVE_INVALID], 7);
    assert_int_equal(st.answered[TS_SERVE_NOT_FOUND], 1);
    serve_stop();
}

/* ---- shutdown --------------------------------------------------------------------------------- */

static void test_shutdown(void **state) {
    (void)state;
    serve_with(MAXB, 5000, 64);
    tu_rng_t rng = {47};
    static req_t r[3];
    got_t g[3] = {{0}}, late = {0}, after = {0};
    for (int i = 0; i < 3; i++) {
        req_init(&r[i], &rng, 1, 1.0f, 0);
        send_req(4, &r[i], 30000, &g[i]);
    }
    wait_received(3);
    ts_serve_shutdown(srv);
    for (int i = 0; i < 3; i++) {
        wait_answer(&g[i]);
        assert_int_equal(g[i].status, TS_EPEER);
        assert_int_equal(g[i].remote_code, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE);
    }
    send_req(4, &r[0], 30000, &late);
    wait_answer(&late);
    assert_int_equal(late.remote_code, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE);
    serve_stop();
    send_req(4, &r[0], 30000, &after);
    wait_answer(&after);
    assert_int_equal(after.remote_code, TESSERA__ERROR_CODE__ERROR_UNSUPPORTED);
}

/* ---- the weight server ------------------------------------------------------------------------- */

typedef struct wgot {
    int calls, status, remote_code;
    uint32_t retry_after_ms;
    uint64_t total_size;
    uint32_t chunk_size;
    size_t n_chunks;
    uint8_t hashes[8][32];
    unsigned char *data;
    size_t len;
} wgot_t;

static void on_weights(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    wgot_t *g = arg;
    g->calls++;
    g->status = res->status;
    g->remote_code = res->remote_code;
    if (res->status == TS_EBUSY)
        g->retry_after_ms = res->reply->busy->retry_after_ms;
    if (res->status != TS_OK)
        return;
    if (res->reply->body_case == TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST) {
        const Tessera__WeightsManifest *m = res->reply->weights_manifest;
        g->total_size = m->total_size;
        g->chunk_size = m->chunk_size;
        g->n_chunks = m->n_chunk_hashes;
        for (size_t i = 0; i < m->n_chunk_hashes && i < 8; i++)
            memcpy(g->hashes[i], m->chunk_hashes[i].data, 32);
    } else {
        g->len = res->reply->chunk->data.len;
        g->data = malloc(g->len);
        assert_non_null(g->data);
        memcpy(g->data, res->reply->chunk->data.data, g->len);
    }
}

static void ask(int client, int manifest, const uint8_t *hash, wgot_t *g) {
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__WeightsManifestRequest m = TESSERA__WEIGHTS_MANIFEST_REQUEST__INIT;
    Tessera__ChunkRequest c = TESSERA__CHUNK_REQUEST__INIT;
    if (manifest) {
        m.has_weights_hash = 1;
        m.weights_hash = (ProtobufCBinaryData){32, (uint8_t *)hash};
        env.body_case = TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST;
        env.weights_manifest_request = &m;
    } else {
        c.has_chunk_hash = 1;
        c.chunk_hash = (ProtobufCBinaryData){32, (uint8_t *)hash};
        env.body_case = TESSERA__ENVELOPE__BODY_CHUNK_REQUEST;
        env.chunk_request = &c;
    }
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_rpc_call(peer(client), &env, 30000, on_weights, g, NULL, err, sizeof err),
                    TS_OK, err);
}

typedef struct {
    ts_store_t *store;
    ts_weights_srv_t *w;
    char dir[512];
    ts_hash_t hash;
    unsigned char *file;
    size_t len;
} wfx_t;

/* A store holding one tiny-preset DiT file (about 3.3 MB: 4 chunks), served. */
static void wfx_start(wfx_t *f, const ts_weights_srv_opts_t *o) {
    char err[256] = "";
    assert_int_equal(tu_make_temp_dir(f->dir, sizeof f->dir, "serve_store"), 0);
    ts_store_opts_t so = {.dir = f->dir};
    TU_CHECK_RC_MSG(ts_store_open(&f->store, &so, err, sizeof err), TS_OK, err);
    ts_dit_config_t c;
    TU_CHECK_OK(ts_dit_config_preset("tiny", &c));
    ts_dit_t m;
    random_dit(&m, &c, &eng, 1, 53);
    char path[600];
    snprintf(path, sizeof path, "%s/expert.safetensors", f->dir);
    TU_CHECK_RC_MSG(ts_dit_save(&m, &m.param_mem, path, TS_ST_F32, NULL, 0, err, sizeof err), TS_OK,
                    err);
    ts_dit_free(&m);
    TU_CHECK_RC_MSG(ts_weights_import_file(f->store, path, &f->hash, NULL, NULL, err, sizeof err),
                    TS_OK, err);
    f->file = tu_read_file(path, &f->len);
    unlink(path);
    TU_CHECK_OK(ts_weights_srv_new(&f->w, &loop, srpc, f->store, o));
}

static int wsrv_freed(void *arg) { return ts_weights_srv_free(arg) == TS_OK; }

static void wfx_stop(wfx_t *f) {
    run_until(wsrv_freed, f->w, "the weight server freed");
    ts_store_close(f->store);
    tu_remove_temp_dir(f->dir);
    free(f->file);
}

/* Fetches the manifest and every chunk at once; returns the seconds the chunks took. */
static double fetch_all(wfx_t *f, unsigned char **out) {
    wgot_t man = {0};
    ask(5, 1, f->hash.b, &man);
    run_until(int_nonzero, &man.calls, "the manifest");
    assert_int_equal(man.status, TS_OK);
    assert_int_equal(man.total_size, f->len);
    assert_int_equal(man.chunk_size, TS_WEIGHTS_CHUNK);
    assert_int_equal(man.n_chunks, (f->len + TS_WEIGHTS_CHUNK - 1) / TS_WEIGHTS_CHUNK);
    assert_true(man.n_chunks >= 3 && man.n_chunks <= 8);
    wgot_t ch[8];
    memset(ch, 0, sizeof ch);
    double t0 = ts_now_s();
    for (size_t i = 0; i < man.n_chunks; i++)
        ask(5, 0, man.hashes[i], &ch[i]);
    for (size_t i = 0; i < man.n_chunks; i++) {
        run_until(int_nonzero, &ch[i].calls, "a chunk");
        while (ch[i].status == TS_EBUSY) { /* the connection's write queue was full: again */
            memset(&ch[i], 0, sizeof ch[i]);
            ask(5, 0, man.hashes[i], &ch[i]);
            run_until(int_nonzero, &ch[i].calls, "a chunk asked again");
        }
    }
    double dt = ts_now_s() - t0;
    unsigned char *file = malloc(man.total_size);
    size_t at = 0;
    for (size_t i = 0; i < man.n_chunks; i++) {
        assert_int_equal(ch[i].status, TS_OK);
        assert_true(at + ch[i].len <= man.total_size);
        memcpy(file + at, ch[i].data, ch[i].len);
        at += ch[i].len;
        free(ch[i].data);
    }
    assert_int_equal(at, man.total_size);
    *out = file;
    return dt;
}

static void test_weights_reassemble(void **state) {
    (void)state;
    wfx_t f;
    wfx_start(&f, NULL);
    unsigned char *file;
    fetch_all(&f, &file);
    assert_memory_equal(file, f.file, f.len);
    ts_hash_t whole;
    ts_hash_compute(&whole, file, f.len);
    assert_memory_equal(whole.b, f.hash.b, 32);
    free(file);
    /* what is not here */
    uint8_t nothing[32] = {1, 2, 3};
    wgot_t nm = {0}, nc = {0};
    ask(5, 1, nothing, &nm);
    ask(5, 0, nothing, &nc);
    run_until(int_nonzero, &nm.calls, "manifest not found");
    run_until(int_nonzero, &nc.calls, "chunk not found");
    assert_int_equal(nm.remote_code, TESSERA__ERROR_CODE__ERROR_NOT_FOUND);
    assert_int_equal(nc.remote_code, TESSERA__ERROR_CODE__ERROR_NOT_FOUND);
    ts_weights_srv_stats_t st;
    ts_weights_srv_stats(f.w, &st);
    assert_int_equal(st.manifests, 1);
    assert_int_equal(st.bytes, f.len);
    assert_int_equal(st.not_found, 2);
    wfx_stop(&f);
}

static void test_weights_bandwidth(void **state) {
    (void)state;
    wfx_t f;
    ts_weights_srv_opts_t o;
    ts_weights_srv_opts_default(&o);
    o.bandwidth = 3u << 20; /* 3 MiB/s */
    wfx_start(&f, &o);
    unsigned char *file;
    double dt = fetch_all(&f, &file);
    assert_memory_equal(file, f.file, f.len);
    free(file);
    /* every chunk after the first waits for its bytes: (len − 1 MiB) / bandwidth at least */
    double least = (double)(f.len - TS_WEIGHTS_CHUNK) / (double)o.bandwidth;
    if (dt < least * 0.98)
        fail_msg("%zu bytes in %.3f s at %llu B/s: the limit needs %.3f s", f.len, dt,
                 (unsigned long long)o.bandwidth, least);
    ts_weights_srv_stats_t st;
    ts_weights_srv_stats(f.w, &st);
    assert_true(st.throttled_ms > 0);
    wfx_stop(&f);
}

/* Past max_pending waiting chunk requests, busy with a retry hint. */
static void test_weights_busy(void **state) {
    (void)state;
    wfx_t f;
    ts_weights_srv_opts_t o;
    ts_weights_srv_opts_default(&o);
    o.bandwidth = 1u << 20;
    o.max_pending = 1;
    wfx_start(&f, &o);
    wgot_t man = {0}, g[3];
    memset(g, 0, sizeof g);
    ask(6, 1, f.hash.b, &man);
    run_until(int_nonzero, &man.calls, "the manifest");
    for (int i = 0; i < 3; i++)
        ask(6, 0, man.hashes[i], &g[i]);
    for (int i = 0; i < 3; i++)
        run_until(int_nonzero, &g[i].calls, "a chunk answer");
    /* the first is sent at once, the second waits, the third finds the queue full */
    assert_int_equal(g[0].status, TS_OK);
    assert_int_equal(g[1].status, TS_OK);
    assert_int_equal(g[2].status, TS_EBUSY);
    assert_true(g[2].retry_after_ms >= 500);
    for (int i = 0; i < 3; i++)
        free(g[i].data);
    wfx_stop(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_forward_batch_invariant, free_leftover),
        cmocka_unit_test_teardown(test_answers_equal_local, free_leftover),
        cmocka_unit_test_teardown(test_answers_bf16, free_leftover),
        cmocka_unit_test_teardown(test_answers_f16, free_leftover),
        cmocka_unit_test_teardown(test_answers_attention, free_leftover),
        cmocka_unit_test_teardown(test_concurrent_clients, free_leftover),
        cmocka_unit_test_teardown(test_out_of_memory, free_leftover),
        cmocka_unit_test_teardown(test_memory_sizes_batch, free_leftover),
        cmocka_unit_test_teardown(test_flood_busy, free_leftover),
        cmocka_unit_test_teardown(test_deadline_dropped, free_leftover),
        cmocka_unit_test_teardown(test_cancel_not_computed, free_leftover),
        cmocka_unit_test_teardown(test_malformed, free_leftover),
        cmocka_unit_test_teardown(test_malformed_envelope, free_leftover),
        cmocka_unit_test_teardown(test_shutdown, free_leftover),
        cmocka_unit_test_teardown(test_weights_reassemble, free_leftover),
        cmocka_unit_test_teardown(test_weights_bandwidth, free_leftover),
        cmocka_unit_test_teardown(test_weights_busy, free_leftover),
    };
    int rc = setup(NULL);
    if (rc == 0)
        rc = setup_model(NULL);
    if (rc != 0) {
        fprintf(stderr, "test_serve: setup failed\n");
        return 1;
    }
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    teardown_model(NULL);
    return teardown(NULL) ? 1 : rc;
}
