/*
 * test_trainer.c — the training loop (model/trainer.c) and the samplers (model/sampler.c).
 *
 * Training: a small DiT on a synthetic data set must (1) give bit-identical losses and weights
 * for two runs with the same seed, (2) continue bit-identically from a checkpoint, (3) give
 * different draws for a different seed, (4) fit a tiny data set (the loss falls), (5) refuse a
 * checkpoint made for another run. Samplers: Euler and Heun on dx/dt = a·x against their
 * closed forms computed in double, and the CFG combination against separate forward passes.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/math.h"
#include "model/optim.h"
#include "model/sampler.h"
#include "model/trainer.h"
#include "tests/testutil.h"

static ts_engine_t g_eng;

static int setup(void **state) {
    (void)state;
    return tu_engine_init_cpu(&g_eng);
}

static int teardown(void **state) {
    (void)state;
    ts_engine_free(&g_eng);
    return 0;
}

static ts_dit_config_t small_config(void) {
    ts_dit_config_t c = {.input_size = 8,
                         .in_channels = 1,
                         .patch_size = 2,
                         .hidden_size = 32,
                         .depth = 2,
                         .num_heads = 2,
                         .num_classes = 3,
                         .mlp_ratio = 4,
                         .freq_dim = 16};
    return c;
}

typedef struct {
    ts_dataset_t data;
    ts_dit_t model;
    ts_trainer_t tr;
} run_t;

static void run_start(run_t *r, uint64_t seed) {
    ts_dit_config_t c = small_config();
    tu_quarters_dataset(&r->data, 40);
    assert_int_equal(ts_dit_create(&r->model, &c, &g_eng, 8, 1), TS_OK);
    assert_int_equal(ts_dit_init_weights(&r->model, seed), TS_OK);
    ts_train_config_t tc;
    ts_train_config_default(&tc);
    tc.batch = 8, tc.lr = 3e-3f, tc.warmup = 2, tc.seed = seed;
    assert_int_equal(ts_trainer_init(&r->tr, &r->model, &r->data, &tc), TS_OK);
}

static void run_end(run_t *r) {
    ts_trainer_free(&r->tr);
    ts_dit_free(&r->model);
    ts_dataset_free(&r->data);
}

static void run_steps(run_t *r, int n, float *losses) {
    for (int i = 0; i < n; i++)
        assert_int_equal(ts_trainer_step(&r->tr, &losses[i], NULL), TS_OK);
}

/* Two runs' parameters and EMA: the same bits. */
static void same_state(const run_t *a, const run_t *b) {
    assert_memory_equal(a->model.param_mem.data, b->model.param_mem.data,
                        ts_tensor_nbytes(&a->model.param_mem));
    assert_memory_equal(a->tr.ema_mem.data, b->tr.ema_mem.data, ts_tensor_nbytes(&a->tr.ema_mem));
}

/* ---- CUDA graphs (kernels/engine.h's cache; the capture itself runs in test_cuda_dit) ---- */

static int g_work_calls, g_work_rc;

static int count_work(void *ctx) {
    (void)ctx;
    g_work_calls++;
    return g_work_rc;
}

/* ts_graph_cache_run's bookkeeping, on an engine that says it is a GPU but has no device behind
 * it (so every capture fails, as a capture that synchronised would): a key runs eagerly when
 * first seen and is remembered; the second time it is to be captured, the capture fails, the
 * work runs eagerly all the same and the cache turns itself off. The last TS_GRAPH_SLOTS keys
 * are remembered, a moved scratch makes a key new, an off cache or a CPU engine always runs
 * eagerly, and the work's own error comes back. */
static void test_graph_cache(void **state) {
    (void)state;
    ts_engine_t gpu;
    memset(&gpu, 0, sizeof gpu);
    gpu.device = TS_CUDA; /* no context: ts_engine_capture_begin says TS_ENODEV */
    ts_graph_cache_t c;
    memset(&c, 0, sizeof c);
    ts_graph_key_t k[TS_GRAPH_SLOTS + 1];
    memset(k, 0, sizeof k);
    for (int i = 0; i <= TS_GRAPH_SLOTS; i++)
        k[i].w[0] = 100 + (uint64_t)i, k[i].w[TS_GRAPH_KEY_WORDS - 1] = 7;
    g_work_calls = 0, g_work_rc = TS_OK;
    /* off: eager, nothing remembered */
    assert_int_equal(ts_graph_cache_plan(&c, &gpu, &k[0]), TS_GRAPH_EAGER);
    assert_int_equal(ts_graph_cache_run(&gpu, &c, &k[0], count_work, NULL), TS_OK);
    assert_int_equal(g_work_calls, 1);
    assert_int_equal(ts_graph_cache_plan(&c, &gpu, &k[0]), TS_GRAPH_EAGER);
    /* on: first sightings run eagerly and are remembered, the oldest forgotten past the slots */
    ts_graph_cache_set(&c, 1);
    assert_int_equal(c.on, 1);
    for (int i = 0; i <= TS_GRAPH_SLOTS; i++) {
        assert_int_equal(ts_graph_cache_plan(&c, &gpu, &k[i]), TS_GRAPH_FIRST);
        assert_int_equal(ts_graph_cache_run(&gpu, &c, &k[i], count_work, NULL), TS_OK);
    }
    assert_int_equal(g_work_calls, 2 + TS_GRAPH_SLOTS);
    assert_int_equal(ts_graph_cache_plan(&c, &gpu, &k[0]), TS_GRAPH_FIRST); /* forgotten */
    for (int i = 1; i <= TS_GRAPH_SLOTS; i++)
        assert_int_equal(ts_graph_cache_plan(&c, &gpu, &k[i]), TS_GRAPH_CAPTURE);
    /* a key's epoch is the engine's scratch_epoch: a moved scratch makes it new */
    gpu.scratch_epoch++;
    assert_int_equal(ts_graph_cache_plan(&c, &gpu, &k[1]), TS_GRAPH_FIRST);
    gpu.scratch_epoch--;
    /* the work's own error, on a first sighting: returned, the key not remembered */
    ts_graph_key_t bad = k[0];
    bad.w[1] = 1;
    g_work_rc = TS_ESHAPE;
    assert_int_equal(ts_graph_cache_run(&gpu, &c, &bad, count_work, NULL), TS_ESHAPE);
    assert_int_equal(ts_graph_cache_plan(&c, &gpu, &bad), TS_GRAPH_FIRST);
    g_work_rc = TS_OK;
    /* the second sighting: the capture fails, the work runs eagerly, the cache is off */
    int calls = g_work_calls;
    assert_int_equal(ts_graph_cache_run(&gpu, &c, &k[2], count_work, NULL), TS_OK);
    assert_int_equal(g_work_calls, calls + 1);
    assert_int_equal(c.on, -1);
    assert_int_equal(c.captures, 0);
    assert_int_equal(c.launches, 0);
    assert_int_equal(ts_graph_cache_plan(&c, &gpu, &k[2]), TS_GRAPH_EAGER);
    assert_int_equal(ts_graph_cache_run(&gpu, &c, &k[2], count_work, NULL), TS_OK);
    assert_int_equal(g_work_calls, calls + 2);
    /* a CPU engine: eager whatever the setting */
    ts_graph_cache_set(&c, 1);
    assert_int_equal(ts_graph_cache_run(&g_eng, &c, &k[3], count_work, NULL), TS_OK);
    assert_int_equal(ts_graph_cache_run(&g_eng, &c, &k[3], count_work, NULL), TS_OK);
    assert_int_equal(ts_graph_cache_plan(&c, &g_eng, &k[3]), TS_GRAPH_EAGER);
    assert_int_equal(g_work_calls, calls + 4);
    assert_int_equal(c.on, 1);
    assert_int_equal(ts_graph_cache_run(&g_eng, &c, &k[3], NULL, NULL), TS_EINVAL);
    ts_graph_cache_drop(&c);
}

/* A trainer asked for graphs on a CPU engine: ignored, the steps the same bits as without; a
 * setting other than 0 or 1 refused. */
static void test_graphs_on_cpu_same_steps(void **state) {
    (void)state;
    run_t a, b;
    float la[4], lb[4];
    run_start(&a, 5);
    run_start(&b, 5);
    ts_train_config_t tc = b.tr.cfg;
    ts_trainer_free(&b.tr);
    tc.graphs = 2;
    assert_int_equal(ts_trainer_init(&b.tr, &b.model, &b.data, &tc), TS_EINVAL);
    tc.graphs = 1;
    assert_int_equal(ts_trainer_init(&b.tr, &b.model, &b.data, &tc), TS_OK);
    assert_int_equal(b.tr.graphs.on, 1);
    run_steps(&a, 4, la);
    run_steps(&b, 4, lb);
    assert_memory_equal(la, lb, sizeof la);
    same_state(&a, &b);
    assert_int_equal(b.tr.graphs.captures, 0);
    assert_int_equal(b.tr.graphs.launches, 0);
    run_end(&a);
    run_end(&b);
}

/* What a GPU could not record in a graph: a step reads device memory back exactly twice — the
 * loss and the gradient norm, both outside the graphed forward and backward — with either
 * attention and at f16 (emulated here); an inference forward not at all. Counted by the engine
 * (host_reads) on the CPU, where the same op calls run: a read inside the work (an index check
 * of the labels, say) would fail every capture on a GPU. */
static void test_step_reads_back_twice(void **state) {
    (void)state;
    for (int v = 0; v < 3; v++) {
        run_t r;
        float l[2];
        run_start(&r, 5);
        char why[128];
        if (v == 1)
            assert_int_equal(ts_dit_set_attention(&r.model, TS_ATTN_FUSED), TS_OK);
        if (v == 2)
            assert_int_equal(ts_dit_set_precision(&r.model, TS_PREC_F16, why, sizeof why), TS_OK);
        run_steps(&r, 1, l);
        uint64_t before = g_eng.host_reads;
        run_steps(&r, 2, l);
        assert_int_equal(g_eng.host_reads - before, 4);
        run_end(&r);
    }
    ts_dit_t m;
    ts_dit_config_t c = small_config();
    assert_int_equal(ts_dit_create(&m, &c, &g_eng, 2, 0), TS_OK);
    ts_tensor_t x, t, out;
    assert_int_equal(ts_tensor_alloc(&x, TS_F32, TS_CPU, 4, TS_SHAPE(2, 1, 8, 8)), TS_OK);
    assert_int_equal(ts_tensor_alloc(&t, TS_F32, TS_CPU, 1, TS_SHAPE(2)), TS_OK);
    memset(x.data, 0, ts_tensor_nbytes(&x));
    memset(t.data, 0, ts_tensor_nbytes(&t));
    int32_t y[2] = {0, 3};
    uint64_t before = g_eng.host_reads;
    assert_int_equal(ts_dit_forward(&m, &x, &t, y, 2, &out), TS_OK);
    assert_int_equal(g_eng.host_reads, before);
    ts_tensor_free(&x), ts_tensor_free(&t);
    ts_dit_free(&m);
}

/* A batch whose loss is not finite (a NaN pixel in the data): TS_ENONFINITE, and nothing the run
 * keeps has changed — parameters, moments, EMA, the step — though the backward ran before the
 * loss was read (the step's forward and backward are one piece of device work). */
static void test_nonfinite_loss_changes_nothing(void **state) {
    (void)state;
    run_t r;
    float l[2];
    run_start(&r, 5);
    run_steps(&r, 2, l);
    const ts_tensor_t *kept[] = {&r.model.param_mem, &r.tr.m_mem, &r.tr.v_mem, &r.tr.ema_mem};
    void *before[4];
    for (int i = 0; i < 4; i++) {
        before[i] = malloc(ts_tensor_nbytes(kept[i]));
        assert_non_null(before[i]);
        memcpy(before[i], kept[i]->data, ts_tensor_nbytes(kept[i]));
    }
    int64_t chw = (int64_t)r.data.channels * r.data.height * r.data.width;
    for (int i = 0; i < r.data.n; i++) /* every image: whichever the batch draws */
        r.data.images[(int64_t)i * chw + 3] = NAN;
    float loss = 0.0f;
    assert_int_equal(ts_trainer_step(&r.tr, &loss, NULL), TS_ENONFINITE);
    assert_true(isnan(loss));
    assert_int_equal(r.tr.step, 2);
    for (int i = 0; i < 4; i++) {
        assert_memory_equal(before[i], kept[i]->data, ts_tensor_nbytes(kept[i]));
        free(before[i]);
    }
    run_end(&r);
}

/* ---- memory known up front ---- */

static uint64_t nbytes(const ts_tensor_t *t) { return t->data ? ts_tensor_nbytes(t) : 0; }

/* What a model really holds on the CPU engine: every tensor it owns and its arena. */
static uint64_t model_bytes(const ts_dit_t *m) {
    return nbytes(&m->param_mem) + nbytes(&m->grad_mem) + nbytes(&m->pos_embed) +
           nbytes(&m->labels) + nbytes(&m->param_lp) + m->arena.cap + m->rooms.cap;
}

static uint64_t trainer_bytes(const ts_trainer_t *tr) {
    const ts_tensor_t *all[] = {&tr->m_mem, &tr->v_mem, &tr->ema_mem, &tr->x0,
                                &tr->eps,   &tr->xt,    &tr->target,  &tr->dv,
                                &tr->t,     &tr->loss,  &tr->sumsq};
    uint64_t n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        n += nbytes(all[i]);
    return n;
}

/* ts_dit_memory, computed from the config alone, against the bytes the model (and its trainer)
 * really allocate: never below, and above by at most one sample's worth and the alignment — for
 * three configs, both attentions, several batches, inference and training. */
static void test_memory_figures(void **state) {
    (void)state;
    ts_dit_config_t cfgs[3];
    cfgs[0] = small_config();
    assert_int_equal(ts_dit_config_preset("tiny", &cfgs[1]), TS_OK);
    assert_int_equal(ts_dit_config_preset("small", &cfgs[2]), TS_OK);
    static const int batches[] = {1, 7, 64};
    ts_dataset_t data;
    tu_quarters_dataset(&data, 40);
    for (int ci = 0; ci < 3; ci++)
        for (int a = 0; a < 2; a++)
            for (int bi = 0; bi < 3; bi++)
                for (int train = 0; train < 2; train++) {
                    ts_dit_config_t c = cfgs[ci];
                    if (train && c.input_size != data.height)
                        continue; /* the data set is small_config's size */
                    int B = batches[bi];
                    ts_attn_impl_t attn = a ? TS_ATTN_COMPOSED : TS_ATTN_FUSED;
                    ts_dit_memory_t mem;
                    assert_int_equal(ts_dit_memory(&c, TS_PREC_F32, attn, &mem), TS_OK);
                    ts_dit_t m;
                    assert_int_equal(ts_dit_create(&m, &c, &g_eng, B, train), TS_OK);
                    assert_int_equal(ts_dit_set_attention(&m, attn), TS_OK);
                    uint64_t chw = (uint64_t)c.in_channels * c.input_size * c.input_size;
                    uint64_t real = model_bytes(&m) + (uint64_t)B * (chw + 1) * 4; /* x, t */
                    ts_trainer_t tr;
                    if (train) {
                        ts_train_config_t tc;
                        ts_train_config_default(&tc);
                        tc.batch = B;
                        assert_int_equal(ts_trainer_init(&tr, &m, &data, &tc), TS_OK);
                        real += trainer_bytes(&tr);
                        ts_trainer_free(&tr);
                    }
                    ts_dit_free(&m);
                    uint64_t said = ts_dit_memory_total(&mem, train, B);
                    uint64_t slack = (train ? mem.train_fixed + mem.train_per_sample
                                            : mem.infer_fixed + mem.infer_per_sample);
                    if (said < real || said > real + slack) {
                        print_error("config %d attention %d B %d train %d: said %llu, allocated "
                                    "%llu (slack %llu)\n",
                                    ci, a, B, train, (unsigned long long)said,
                                    (unsigned long long)real, (unsigned long long)slack);
                        fail();
                    }
                }
    ts_dataset_free(&data);

    /* learned σ: inference only, its doubled final layer and (B, 2C) output counted */
    ts_dit_memory_t lsm;
    ts_dit_config_t ls = cfgs[0];
    ls.learn_sigma = 1;
    assert_int_equal(ts_dit_memory(&ls, TS_PREC_F32, TS_ATTN_FUSED, &lsm), TS_OK);
    assert_int_equal(lsm.can_train, 0);
    for (int bi = 0; bi < 3; bi++) {
        int B = batches[bi];
        ts_dit_t lm;
        assert_int_equal(ts_dit_create(&lm, &ls, &g_eng, B, 0), TS_OK);
        assert_int_equal(ts_dit_set_attention(&lm, TS_ATTN_FUSED), TS_OK);
        uint64_t chw = (uint64_t)ls.in_channels * ls.input_size * ls.input_size;
        uint64_t real = model_bytes(&lm) + (uint64_t)B * (chw + 1) * 4;
        uint64_t said = ts_dit_memory_total(&lsm, 0, B);
        if (said < real || said > real + lsm.infer_fixed + lsm.infer_per_sample) {
            print_error("learn_sigma B %d: said %llu, allocated %llu\n", B,
                        (unsigned long long)said, (unsigned long long)real);
            fail();
        }
        ts_dit_free(&lm);
    }
    /* the 16-bit copy and its operand buffer come on top */
    ts_dit_memory_t f32, f16;
    assert_int_equal(ts_dit_memory(&cfgs[1], TS_PREC_F32, TS_ATTN_COMPOSED, &f32), TS_OK);
    assert_int_equal(ts_dit_memory(&cfgs[1], TS_PREC_F16, TS_ATTN_COMPOSED, &f16), TS_OK);
    assert_int_equal(f32.params_lp, 0);
    assert_true(f16.params_lp >= f32.params / 2);
    assert_true(ts_dit_memory_total(&f16, 0, 8) > ts_dit_memory_total(&f32, 0, 8) + f16.params_lp);
    /* the largest batch that fits a budget */
    uint64_t at10 = ts_dit_memory_total(&f32, 1, 10);
    assert_int_equal(ts_dit_memory_max_batch(&f32, 1, at10, 4096), 10);
    assert_int_equal(ts_dit_memory_max_batch(&f32, 1, at10 - 1, 4096), 9);
    assert_int_equal(ts_dit_memory_max_batch(&f32, 1, at10, 6), 6);
    assert_int_equal(ts_dit_memory_max_batch(&f32, 1, ts_dit_memory_total(&f32, 1, 1) - 1, 64), 0);
    assert_int_equal(ts_dit_memory_max_batch(&f32, 0, UINT64_MAX / 2, 64), 64);
    /* a config whose activations pass the bounds: refused here as ts_dit_create refuses it */
    ts_dit_config_t huge = cfgs[1];
    huge.input_size = 256, huge.patch_size = 2; /* 16 384 tokens: (heads, T, T) is 4 GiB */
    assert_int_equal(ts_dit_memory(&huge, TS_PREC_F32, TS_ATTN_COMPOSED, &f32), TS_ERANGE);
    ts_dit_t m;
    assert_int_equal(ts_dit_create(&m, &huge, &g_eng, 1, 0), TS_ERANGE);
    /* one that may be served but not trained: 2025 tokens and 16 heads, one block's attention
     * weights (262 MB a sample) fit inference's bound, four blocks' do not fit training's */
    ts_dit_config_t serve_only = cfgs[1];
    serve_only.input_size = 45, serve_only.patch_size = 1, serve_only.num_heads = 16;
    assert_int_equal(ts_dit_memory(&serve_only, TS_PREC_F32, TS_ATTN_COMPOSED, &f32), TS_OK);
    assert_int_equal(f32.can_train, 0);
    assert_true(f32.infer_per_sample > (uint64_t)16 * 2025 * 2025 * 4);
    assert_true(ts_dit_memory_total(&f32, 1, 1) == UINT64_MAX);
    assert_int_equal(ts_dit_memory_max_batch(&f32, 1, UINT64_MAX / 2, 64), 0);
    assert_int_equal(ts_dit_create(&m, &serve_only, &g_eng, 1, 1), TS_ERANGE);
    assert_int_equal(ts_dit_memory(&cfgs[1], TS_PREC_F32, TS_ATTN_COMPOSED, &f32), TS_OK);
    assert_int_equal(f32.can_train, 1);
    assert_int_equal(ts_dit_memory(NULL, TS_PREC_F32, TS_ATTN_COMPOSED, &f32), TS_EINVAL);
}

static void test_same_seed_bit_identical(void **state) {
    (void)state;
    run_t a, b;
    float la[12], lb[12];
    run_start(&a, 5);
    run_start(&b, 5);
    run_steps(&a, 12, la);
    run_steps(&b, 12, lb);
    assert_memory_equal(la, lb, sizeof la);
    same_state(&a, &b);
    run_end(&a);
    run_end(&b);
}

static void test_other_seed_differs(void **state) {
    (void)state;
    run_t a, b;
    float la[3], lb[3];
    run_start(&a, 5);
    run_start(&b, 6);
    run_steps(&a, 3, la);
    run_steps(&b, 3, lb);
    assert_true(memcmp(la, lb, sizeof la) != 0);
    run_end(&a);
    run_end(&b);
}

static void test_resume_bit_identical(void **state) {
    (void)state;
    char path[256];
    tu_make_temp_file(path, sizeof path, "tessera-test-train");
    char err[256] = "";
    /* straight through: 10 steps */
    run_t a;
    float la[10];
    run_start(&a, 11);
    run_steps(&a, 10, la);
    /* interrupted: 4 steps, checkpoint, a fresh process-equivalent resumes for 6 more */
    run_t b, c;
    float lb[10];
    run_start(&b, 11);
    run_steps(&b, 4, lb);
    assert_int_equal(ts_trainer_save(&b.tr, path, err, sizeof err), TS_OK);
    run_end(&b);
    run_start(&c, 11);
    assert_int_equal(ts_trainer_load(&c.tr, path, err, sizeof err), TS_OK);
    assert_int_equal(c.tr.step, 4);
    run_steps(&c, 6, lb + 4);
    assert_memory_equal(la, lb, sizeof la);
    assert_memory_equal(a.model.param_mem.data, c.model.param_mem.data,
                        ts_tensor_nbytes(&a.model.param_mem));
    assert_memory_equal(a.tr.m_mem.data, c.tr.m_mem.data, ts_tensor_nbytes(&a.tr.m_mem));
    assert_memory_equal(a.tr.ema_mem.data, c.tr.ema_mem.data, ts_tensor_nbytes(&a.tr.ema_mem));
    /* the loss average travels with the checkpoint, so the weights' metadata agree too */
    assert_false(isnan(a.tr.loss_avg));
    assert_memory_equal(&a.tr.loss_avg, &c.tr.loss_avg, sizeof(float));
    ts_train_meta_t ma, mc;
    ts_train_meta(&ma, &a.tr, "shard-1", "abc", 1, NAN);
    ts_train_meta(&mc, &c.tr, "shard-1", "abc", 1, NAN);
    assert_int_equal(ma.n, 7);
    for (int i = 0; i < 2 * ma.n; i++)
        assert_string_equal(ma.kv[i], mc.kv[i]);
    assert_string_equal(ma.steps, "10");
    run_end(&a);
    run_end(&c);
    unlink(path);
}

/* A staged checkpoint (ts_trainer_stage_*, what tesserad's writer encodes while the steps go
 * on) is the bytes ts_trainer_save_mem gives at the staged step, even when steps ran between the
 * copy out and the encoding; one stage serves checkpoint after checkpoint. */
static void test_stage_matches_save_mem(void **state) {
    (void)state;
    char err[256] = "";
    run_t r;
    float l[3];
    run_start(&r, 13);
    run_steps(&r, 2, l);
    ts_trainer_stage_t st;
    assert_int_equal(ts_trainer_stage_init(&st, &r.tr, 1), TS_OK); /* pinned: a CPU falls back */
    for (int round = 0; round < 2; round++) {
        unsigned char *want = NULL, *got = NULL;
        size_t want_len = 0, got_len = 0;
        assert_int_equal(ts_trainer_save_mem(&r.tr, &want, &want_len, err, sizeof err), TS_OK);
        assert_int_equal(ts_trainer_stage_begin(&st, &r.tr), TS_OK);
        assert_int_equal(st.step, r.tr.step);
        run_steps(&r, 1 + round, l); /* the state moves on before the encoding */
        assert_int_equal(ts_trainer_stage_encode(&st, &got, &got_len, err, sizeof err), TS_OK);
        assert_int_equal(got_len, want_len);
        assert_memory_equal(got, want, want_len);
        unsigned char *now = NULL;
        size_t now_len = 0;
        assert_int_equal(ts_trainer_save_mem(&r.tr, &now, &now_len, err, sizeof err), TS_OK);
        assert_true(now_len != want_len || memcmp(now, want, want_len) != 0);
        free(want), free(got), free(now);
    }
    /* a stage of another model's size is refused, not overrun */
    run_t o;
    ts_dit_config_t c = small_config();
    c.hidden_size = 64;
    tu_quarters_dataset(&o.data, 40);
    assert_int_equal(ts_dit_create(&o.model, &c, &g_eng, 8, 1), TS_OK);
    ts_train_config_t tc;
    ts_train_config_default(&tc);
    tc.batch = 8;
    assert_int_equal(ts_trainer_init(&o.tr, &o.model, &o.data, &tc), TS_OK);
    assert_int_equal(ts_trainer_stage_begin(&st, &o.tr), TS_EINVAL);
    run_end(&o);
    ts_trainer_stage_free(&st);
    /* the engine's copy in queue order: dtype and size checked */
    ts_tensor_t a, b;
    assert_int_equal(ts_tensor_alloc(&a, TS_F32, TS_CPU, 1, TS_SHAPE(5)), TS_OK);
    assert_int_equal(ts_tensor_alloc(&b, TS_F16, TS_CPU, 1, TS_SHAPE(5)), TS_OK);
    assert_int_equal(ts_engine_copy_async(&g_eng, &b, &a), TS_EDTYPE);
    ts_tensor_free(&b);
    assert_int_equal(ts_tensor_alloc(&b, TS_F32, TS_CPU, 1, TS_SHAPE(4)), TS_OK);
    assert_int_equal(ts_engine_copy_async(&g_eng, &b, &a), TS_ESHAPE);
    ts_tensor_free(&a), ts_tensor_free(&b);
    run_end(&r);
}

static void test_checkpoint_of_other_run_refused(void **state) {
    (void)state;
    char path[256];
    tu_make_temp_file(path, sizeof path, "tessera-test-train");
    char err[256] = "";
    run_t a, b;
    run_start(&a, 1);
    assert_int_equal(ts_trainer_save(&a.tr, path, err, sizeof err), TS_OK);
    run_start(&b, 2); /* another seed */
    assert_int_not_equal(ts_trainer_load(&b.tr, path, err, sizeof err), TS_OK);
    assert_non_null(strstr(err, "seed"));
    run_end(&a);
    run_end(&b);
    /* a truncated checkpoint is an error, never a crash */
    FILE *f = fopen(path, "r+");
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), 100), 0);
    fclose(f);
    run_start(&a, 1);
    assert_int_not_equal(ts_trainer_load(&a.tr, path, err, sizeof err), TS_OK);
    assert_int_equal(a.tr.step, 0);
    run_end(&a);
    unlink(path);
}

static void test_loss_falls(void **state) {
    (void)state;
    run_t a;
    float l[150];
    run_start(&a, 3);
    run_steps(&a, 150, l);
    double first = 0, last = 0;
    for (int i = 0; i < 10; i++) {
        first += l[i] / 10.0;
        last += l[140 + i] / 10.0;
    }
    print_message("loss: first 10 steps %.4f, last 10 steps %.4f\n", first, last);
    assert_true(last < 0.6 * first);
    run_end(&a);
}

static void test_lr_warmup(void **state) {
    (void)state;
    ts_train_config_t c;
    ts_train_config_default(&c);
    c.lr = 1.0f, c.warmup = 4;
    assert_float_equal(ts_trainer_lr(&c, 0), 0.25f, 1e-7);
    assert_float_equal(ts_trainer_lr(&c, 3), 1.0f, 1e-7);
    assert_float_equal(ts_trainer_lr(&c, 100), 1.0f, 1e-7);
}

/* model/optim.h: the cosine schedule's ends and midpoint; one clipped step over two slabs reports
 * the global norm √(Σ‖g‖²) and moves every parameter (with lr 1, no decay, the first AdamW step is
 * −sign(g) whatever the scale, so a clipped step equals an unclipped one: the check is the norm);
 * a gradient holding NaN is refused and changes nothing. */
static void test_optim(void **state) {
    (void)state;
    ts_engine_t *e = &g_eng;
    assert_float_equal(ts_optim_lr(1.0f, 4, 0, 0), 0.25f, 1e-7);
    assert_float_equal(ts_optim_lr(1.0f, 4, 0, 50), 1.0f, 1e-7);
    assert_float_equal(ts_optim_lr(1.0f, 4, 104, 4), 1.0f, 1e-7);
    assert_float_equal(ts_optim_lr(1.0f, 4, 104, 54), 0.5f, 1e-6);
    assert_float_equal(ts_optim_lr(1.0f, 4, 104, 104), 0.0f, 1e-7);
    assert_float_equal(ts_optim_lr(1.0f, 4, 104, 500), 0.0f, 1e-7);
    ts_tensor_t p[2], g[2], m[2], v[2], sumsq;
    const float gv[2][3] = {{3.0f, 0.0f, -4.0f}, {0.0f, 12.0f, 0.0f}};
    ts_optim_slab_t slabs[2];
    for (int i = 0; i < 2; i++) {
        tu_alloc_f32(&p[i], 1, TS_SHAPE(3));
        tu_alloc_f32(&g[i], 1, TS_SHAPE(3));
        tu_alloc_f32(&m[i], 1, TS_SHAPE(3));
        tu_alloc_f32(&v[i], 1, TS_SHAPE(3));
        memcpy(tu_f32(&g[i]), gv[i], sizeof gv[i]);
        for (int j = 0; j < 3; j++)
            tu_f32(&p[i])[j] = 1.0f, tu_f32(&m[i])[j] = 0.0f, tu_f32(&v[i])[j] = 0.0f;
        slabs[i] = (ts_optim_slab_t){&p[i], &g[i], &m[i], &v[i]};
    }
    tu_alloc_f32(&sumsq, 1, TS_SHAPE(1));
    ts_adamw_t hp = {1.0f, 0.9f, 0.999f, 1e-8f, 0.0f};
    float norm = 0.0f;
    TU_CHECK_OK(ts_optim_step(e, slabs, 2, &hp, 1, 1.0f, &sumsq, &norm));
    assert_float_equal(norm, 13.0f, 1e-5); /* √(9 + 16 + 144) */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            float want = gv[i][j] > 0 ? 0.0f : gv[i][j] < 0 ? 2.0f : 1.0f;
            assert_float_equal(tu_f32(&p[i])[j], want, 1e-4);
        }
    tu_f32(&g[1])[0] = NAN;
    float before = tu_f32(&p[0])[0];
    TU_CHECK_RC(ts_optim_step(e, slabs, 2, &hp, 2, 1.0f, &sumsq, &norm), TS_ENONFINITE);
    assert_true(isnan(norm));
    assert_true(tu_f32(&p[0])[0] == before);
    TU_CHECK_RC(ts_optim_step(e, slabs, 0, &hp, 2, 1.0f, &sumsq, &norm), TS_EINVAL);
    for (int i = 0; i < 2; i++)
        TU_FREE_TENSORS(&p[i], &g[i], &m[i], &v[i]);
    ts_tensor_free(&sumsq);
}

/* ---- samplers ---------------------------------------------------------------------------- */

static int linear_field(void *ctx, const ts_tensor_t *x, float t, ts_tensor_t *v) {
    (void)t;
    float a = *(float *)ctx;
    int rc = ts_tensor_copy(v, x);
    return rc ? rc : ts_scale(&g_eng, v, a);
}

static void check_sampler(ts_sampler_kind_t kind, int steps, float a) {
    ts_tensor_t x, s[3];
    assert_int_equal(ts_tensor_alloc(&x, TS_F32, TS_CPU, 2, TS_SHAPE(3, 5)), TS_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ts_tensor_alloc(&s[i], TS_F32, TS_CPU, 2, TS_SHAPE(3, 5)), TS_OK);
    uint64_t seeds[3] = {1, 2, 3};
    assert_int_equal(ts_sampler_noise(&g_eng, &x, seeds), TS_OK);
    float x1[15];
    memcpy(x1, x.data, sizeof x1);
    ts_sampler_opts_t o = {kind, steps};
    assert_int_equal(ts_sampler_run(&g_eng, &o, &x, s, linear_field, &a, NULL, NULL), TS_OK);
    /* per step, x is multiplied by (1 − a·h) (Euler) or (1 − a·h + (a·h)²/2) (Heun) */
    double h = 1.0 / steps, factor = 1.0;
    for (int k = 0; k < steps; k++)
        factor *= kind == TS_SAMPLER_EULER ? 1.0 - a * h : 1.0 - a * h + 0.5 * a * a * h * h;
    const float *got = x.data;
    for (int i = 0; i < 15; i++)
        assert_float_equal(got[i], x1[i] * factor, 1e-5 * (1 + fabs(x1[i])));
    /* and both converge to the exact flow x1·e^(−a) as steps grow (Heun faster) */
    double exact = exp(-a);
    double err = fabs(factor - exact);
    print_message("%s, %d steps: factor %.6f vs exact %.6f\n",
                  kind == TS_SAMPLER_EULER ? "euler" : "heun", steps, factor, exact);
    assert_true(err < (kind == TS_SAMPLER_EULER ? 2.0 / steps : 2.0 / ((double)steps * steps)));
    ts_tensor_free(&x);
    for (int i = 0; i < 3; i++)
        ts_tensor_free(&s[i]);
}

static void test_sampler_closed_form(void **state) {
    (void)state;
    check_sampler(TS_SAMPLER_EULER, 10, 0.7f);
    check_sampler(TS_SAMPLER_HEUN, 10, 0.7f);
    check_sampler(TS_SAMPLER_EULER, 1, -1.3f);
    check_sampler(TS_SAMPLER_HEUN, 37, 2.0f);
    ts_sampler_kind_t k;
    assert_int_equal(ts_sampler_parse("heun", &k), TS_OK);
    assert_int_equal(k, TS_SAMPLER_HEUN);
    assert_int_not_equal(ts_sampler_parse("rk4", &k), TS_OK);
}

static void test_noise_independent_of_batch(void **state) {
    (void)state;
    ts_tensor_t a, b;
    assert_int_equal(ts_tensor_alloc(&a, TS_F32, TS_CPU, 2, TS_SHAPE(4, 6)), TS_OK);
    assert_int_equal(ts_tensor_alloc(&b, TS_F32, TS_CPU, 2, TS_SHAPE(1, 6)), TS_OK);
    uint64_t seeds[4] = {10, 11, 12, 13};
    assert_int_equal(ts_sampler_noise(&g_eng, &a, seeds), TS_OK);
    assert_int_equal(ts_sampler_noise(&g_eng, &b, seeds + 2), TS_OK);
    assert_memory_equal((float *)a.data + 12, b.data, 6 * sizeof(float));
    ts_tensor_free(&a);
    ts_tensor_free(&b);
}

/* v_cfg = v(∅) + s·(v(y) − v(∅)), against two plain forward passes. */
static void test_cfg_combination(void **state) {
    (void)state;
    ts_dit_config_t c = small_config();
    ts_dit_t m;
    assert_int_equal(ts_dit_create(&m, &c, &g_eng, 4, 0), TS_OK);
    assert_int_equal(ts_dit_init_weights(&m, 2), TS_OK);
    /* make every tensor non-zero, so the output depends on the label */
    ts_tensor_t noise;
    assert_int_equal(ts_tensor_alloc(&noise, TS_F32, TS_CPU, 1, TS_SHAPE(m.num_params)), TS_OK);
    assert_int_equal(ts_rng_normal(&g_eng, &noise, 8, 0), TS_OK);
    assert_int_equal(ts_axpy(&g_eng, &m.param_mem, 0.05f, &noise), TS_OK);
    int32_t labels[2] = {0, 2};
    ts_tensor_t x, v, t;
    assert_int_equal(ts_tensor_alloc(&x, TS_F32, TS_CPU, 4, TS_SHAPE(2, 1, 8, 8)), TS_OK);
    assert_int_equal(ts_tensor_alloc(&v, TS_F32, TS_CPU, 4, TS_SHAPE(2, 1, 8, 8)), TS_OK);
    assert_int_equal(ts_tensor_alloc(&t, TS_F32, TS_CPU, 1, TS_SHAPE(2)), TS_OK);
    assert_int_equal(ts_rng_normal(&g_eng, &x, 3, 0), TS_OK);
    ts_dit_velocity_ctx_t vc;
    float s = 2.5f;
    assert_int_equal(ts_dit_velocity_init(&vc, &m, labels, 2, s), TS_OK);
    assert_int_equal(ts_dit_velocity(&vc, &x, 0.4f, &v), TS_OK);
    assert_int_equal(vc.evals, 2);
    float cond[128], uncond[128];
    ts_tensor_t out;
    assert_int_equal(ts_fill(&g_eng, &t, 0.4f), TS_OK);
    assert_int_equal(ts_dit_forward(&m, &x, &t, labels, 2, &out), TS_OK);
    memcpy(cond, out.data, sizeof cond);
    int32_t nulls[2] = {3, 3};
    assert_int_equal(ts_dit_forward(&m, &x, &t, nulls, 2, &out), TS_OK);
    memcpy(uncond, out.data, sizeof uncond);
    const float *got = v.data;
    double diff = 0;
    for (int i = 0; i < 128; i++) {
        assert_float_equal(got[i], uncond[i] + s * (cond[i] - uncond[i]), 1e-5);
        diff += fabs(cond[i] - uncond[i]);
    }
    assert_true(diff > 1e-3); /* the label matters, so the check above means something */
    ts_dit_velocity_free(&vc);
    /* too large a batch for the model is refused */
    int32_t many[3] = {0, 1, 2};
    assert_int_equal(ts_dit_velocity_init(&vc, &m, many, 3, 2.0f), TS_ERANGE);
    ts_tensor_free(&x);
    ts_tensor_free(&v);
    ts_tensor_free(&t);
    ts_tensor_free(&noise);
    ts_dit_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph_cache),
        cmocka_unit_test(test_graphs_on_cpu_same_steps),
        cmocka_unit_test(test_nonfinite_loss_changes_nothing),
        cmocka_unit_test(test_step_reads_back_twice),
        cmocka_unit_test(test_memory_figures),
        cmocka_unit_test(test_same_seed_bit_identical),
        cmocka_unit_test(test_other_seed_differs),
        cmocka_unit_test(test_resume_bit_identical),
        cmocka_unit_test(test_stage_matches_save_mem),
        cmocka_unit_test(test_checkpoint_of_other_run_refused),
        cmocka_unit_test(test_loss_falls),
        cmocka_unit_test(test_lr_warmup),
        cmocka_unit_test(test_optim),
        cmocka_unit_test(test_sampler_closed_form),
        cmocka_unit_test(test_noise_independent_of_batch),
        cmocka_unit_test(test_cfg_combination),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
