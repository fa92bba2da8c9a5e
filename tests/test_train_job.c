/*
 * test_train_job.c — tesserad's training job (daemon/train_job.h) on the real Fashion-MNIST set and a
 * real two-cluster partition made by `tessera partition` (tiny budgets: `tiny`, batch 4, a few
 * steps, one thread).
 *
 *   - the job's images of cluster k are exactly shard-k.txt's (ts_partition_load_cluster);
 *   - a run stopped mid-way (checkpoint + join) and started again ends bit for bit where an
 *     uninterrupted run ends: the final checkpoints (parameters, AdamW moments, EMA, step, loss
 *     average) are the same bytes, and so are the final weights (the same weights hash);
 *   - a job SIGKILLed in a child process after a checkpoint continues from that checkpoint in
 *     the parent and ends the same way;
 *   - progress, notify and snapshots (serve_while_training): counted, the newest in the store
 *     and loadable, the superseded ones removed, the last one the final weights;
 *   - the final weights carry the metadata of `tessera train --partition`, land in the store and
 *     in opts.out, and ts_expert_prepare accepts them with the partition;
 *   - bad inputs are refused at start with a sentence naming the culprit;
 *   - the run id: what it depends on and what it does not.
 * Exit 77 (skipped) when the Fashion-MNIST files are not installed.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/expert.h"
#include "daemon/train_job.h"
#include "model/partition.h"
#include "model/shard.h"
#include "store/ckpt.h"
#include "tests/testutil.h"

#ifndef TS_TESSERA
#error "TS_TESSERA (the tessera binary) must be defined by the build"
#endif

#define STEPS 8
#define EVERY 3

static char g_dir[256];       /* this run's temporary folder */
static char g_part[512];      /* g_dir/part/partition.safetensors */
static ts_hash_t g_straight;  /* the uninterrupted run's final weights */
static unsigned char *g_ckpt; /* ... and its final checkpoint */
static size_t g_ckpt_len;

static const char *path_in(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", g_dir, name);
    return buf;
}

static int have_fmnist(void) {
    return access(TS_FMNIST_DEFAULT_DIR "/train-images-idx3-ubyte.gz", R_OK) == 0 ||
           access(TS_FMNIST_DEFAULT_DIR "/train-images-idx3-ubyte", R_OK) == 0;
}

static int group_setup(void **state) {
    (void)state;
    if (tu_make_temp_dir(g_dir, sizeof g_dir, "tessera-test-trainer") != 0)
        return -1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' partition --experts 2 --restarts 1 --max-iter 5 --out '%s/part' >/dev/null "
             "2>&1",
             TS_TESSERA, g_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "group setup: `%s` failed\n", cmd);
        return -1;
    }
    snprintf(g_part, sizeof g_part, "%s/part/partition.safetensors", g_dir);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    free(g_ckpt);
    return system(cmd) == 0 ? 0 : -1;
}

static ts_store_t *open_store(const char *name) {
    ts_store_t *s = NULL;
    char err[256] = "";
    ts_store_opts_t so = {.dir = path_in(name)};
    TU_CHECK_RC_MSG(ts_store_open(&s, &so, err, sizeof err), TS_OK, err);
    return s;
}

static ts_train_job_opts_t job_opts(ts_store_t *s, int cluster) {
    ts_train_job_opts_t o = {.store = s,
                             .partition = g_part,
                             .cluster = cluster,
                             .model = "tiny",
                             .steps = STEPS,
                             .threads = 1,
                             .ckpt_every = EVERY,
                             .keep = 2};
    ts_train_config_default(&o.train);
    o.train.batch = 4, o.train.warmup = 2, o.train.lr = 1e-3f, o.train.seed = 7;
    return o;
}

static ts_train_job_t *start(const ts_train_job_opts_t *o) {
    ts_train_job_t *j = NULL;
    char err[512] = "";
    TU_CHECK_RC_MSG(ts_train_job_start(&j, o, err, sizeof err), TS_OK, err);
    return j;
}

/* Polls the progress until the job has ended, or fails the test after two minutes. */
static void wait_end(ts_train_job_t *j, ts_train_progress_t *p) {
    for (int i = 0; i < 24000; i++) {
        ts_train_job_progress(j, p);
        if (p->state != TS_TRAIN_RUNNING)
            return;
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    fail_msg("the training job did not end within two minutes");
}

static void expect_done(ts_train_job_t *j, ts_train_progress_t *p) {
    wait_end(j, p);
    if (p->state != TS_TRAIN_DONE)
        fail_msg("job ended %s: %s", ts_train_state_name(p->state), p->message);
    assert_int_equal(p->step, STEPS);
    assert_int_equal(p->ckpt_step, STEPS);
}

/* The run's newest checkpoint (the caller frees it). */
static unsigned char *latest_ckpt(ts_store_t *s, const char *run, int64_t *step, size_t *len) {
    unsigned char *blob = NULL;
    TU_CHECK_OK(ts_ckpt_latest(s, run, step, &blob, len));
    return blob;
}

/* The final state of a finished run equals the uninterrupted run's, bit for bit. */
static void expect_same_end(ts_store_t *s, const ts_train_progress_t *p) {
    assert_memory_equal(p->weights.b, g_straight.b, TS_HASH_BYTES);
    int64_t step = 0;
    size_t len = 0;
    unsigned char *blob = latest_ckpt(s, p->run_id, &step, &len);
    assert_int_equal(step, STEPS);
    assert_int_equal(len, g_ckpt_len);
    assert_memory_equal(blob, g_ckpt, len);
    free(blob);
}

typedef struct {
    int64_t *steps;
    int *n;
} note_t;

static int note_step(void *ctx, const char *run_id, int64_t step, size_t len) {
    (void)run_id, (void)len;
    note_t *t = ctx;
    if (*t->n < 4)
        t->steps[*t->n] = step;
    ++*t->n;
    return TS_OK;
}

static int meta_is(void *ctx, const ts_weights_info_t *info) {
    const char *const *kv = ctx;
    if (!kv)
        fail_msg("weights that should not be in the store are there");
    for (; kv[0]; kv += 2) {
        const char *v = ts_weights_info_meta(info, kv[0]);
        if (!v || strcmp(v, kv[1]) != 0)
            fail_msg("weights metadata %s is %s, want %s", kv[0], v ? v : "(none)", kv[1]);
    }
    return TS_OK;
}

/* ---- tests ------------------------------------------------------------------------------- */

/* The job's images of cluster k are shard-k.txt's, in that order. */
static void test_cluster_is_the_shard_file(void **state) {
    (void)state;
    char err[512] = "", shard[600];
    ts_dataset_t all, sub;
    TU_CHECK_RC_MSG(ts_fmnist_load(NULL, "train", &all, err, sizeof err), TS_OK, err);
    size_t chw = (size_t)all.channels * all.height * all.width;
    int total = 0;
    for (int k = 0; k < 2; k++) {
        char pid[TS_PARTITION_ID_HEX];
        TU_CHECK_RC_MSG(ts_partition_load_cluster(g_part, k, NULL, &sub, pid, err, sizeof err),
                        TS_OK, err);
        snprintf(shard, sizeof shard, "%s/part/shard-%d.txt", g_dir, k);
        int32_t *idx = NULL;
        int n = 0;
        TU_CHECK_RC_MSG(ts_shard_read(shard, &idx, &n, all.n, err, sizeof err), TS_OK, err);
        assert_int_equal(sub.n, n);
        assert_true(n > 0 && n < all.n);
        for (int i = 0; i < n; i++) {
            assert_int_equal(sub.labels[i], all.labels[idx[i]]);
            assert_memory_equal(sub.images + (size_t)i * chw, all.images + (size_t)idx[i] * chw,
                                chw * sizeof(float));
        }
        char fid[TS_PARTITION_ID_HEX];
        TU_CHECK_OK(ts_file_blake2b(g_part, fid, err, sizeof err));
        assert_string_equal(pid, fid);
        total += n;
        free(idx);
        ts_dataset_free(&sub);
    }
    assert_int_equal(total, all.n);
    ts_dataset_free(&all);
}

/* The uninterrupted run, then one stopped mid-way and started again: the same end. */
static void test_stop_and_resume_is_bit_identical(void **state) {
    (void)state;
    ts_store_t *a = open_store("straight");
    ts_train_job_opts_t o = job_opts(a, 1);
    ts_train_progress_t p;
    ts_train_job_t *j = start(&o);
    expect_done(j, &p);
    assert_int_equal(p.resumed_from, 0);
    assert_true(isfinite(p.loss) && isfinite(p.loss_avg) && p.loss > 0);
    assert_true(p.samples_per_s > 0);
    /* the last step's time, and the device's share of it (on the CPU the same span) */
    assert_true(p.step_s > 0 && p.step_device_s > 0 && p.step_device_s <= p.step_s);
    assert_int_equal(p.snapshots, 0); /* snapshots off */
    g_straight = p.weights;
    int64_t step = 0;
    g_ckpt = latest_ckpt(a, p.run_id, &step, &g_ckpt_len);
    /* keep = 2: the end and the checkpoint before it */
    int64_t steps[4] = {0};
    int n = 0;
    TU_CHECK_OK(ts_ckpt_list(a, p.run_id, note_step, &(note_t){steps, &n}));
    assert_int_equal(n, 2);
    assert_int_equal(steps[0], STEPS / EVERY * EVERY);
    assert_int_equal(steps[1], STEPS);
    ts_train_job_free(j);
    ts_store_close(a);

    ts_store_t *b = open_store("stopped");
    o.store = b;
    j = start(&o);
    do
        ts_train_job_progress(j, &p);
    while (p.step < 2 && p.state == TS_TRAIN_RUNNING);
    /* no wait: the step under way and the checkpoint take longer than nothing */
    TU_CHECK_RC(ts_train_job_stop(j, 0), TS_ETIMEDOUT);
    TU_CHECK_OK(ts_train_job_stop(j, 60000));
    TU_CHECK_OK(ts_train_job_stop(j, 0)); /* again: already ended */
    ts_train_job_progress(j, &p);
    if (p.state != TS_TRAIN_STOPPED)
        fail_msg("job ended %s: %s", ts_train_state_name(p.state), p.message);
    int64_t stopped = p.step;
    assert_true(stopped >= 2 && stopped < STEPS);
    assert_int_equal(p.ckpt_step, stopped); /* stopping checkpoints */
    size_t len = 0;
    free(latest_ckpt(b, p.run_id, &step, &len));
    assert_int_equal(step, stopped);
    TU_CHECK_RC(ts_weights_info(b, &g_straight, meta_is, NULL), TS_ENOTFOUND); /* no weights yet */
    ts_train_job_free(j);

    j = start(&o);
    expect_done(j, &p);
    assert_int_equal(p.resumed_from, stopped);
    expect_same_end(b, &p);
    ts_train_job_free(j);
    ts_store_close(b);
}

/* An f16 job (emulated on the CPU): it trains with its loss scale in the progress, and stopped
 * and resumed it ends with the same weights as straight through. (The scale's own journey
 * through a checkpoint is test_f16_train's test_resume_bf16.) */
static void test_f16_stop_and_resume(void **state) {
    (void)state;
    ts_store_t *a = open_store("f16-straight"), *b = open_store("f16-stopped");
    ts_train_job_opts_t o = job_opts(a, 0);
    o.precision = TS_PREC_F16;
    ts_train_progress_t p;
    ts_train_job_t *j = start(&o);
    expect_done(j, &p);
    assert_true(p.f16 && isfinite(p.loss));
    /* a short run at 2^16 overflows nothing: the scale has not moved, no step was skipped */
    assert_true(p.loss_scale == TS_LOSS_SCALE_INIT);
    assert_int_equal(p.skipped, 0);
    ts_hash_t straight = p.weights;
    ts_train_job_free(j);
    o.store = b;
    j = start(&o);
    do
        ts_train_job_progress(j, &p);
    while (p.step < 2 && p.state == TS_TRAIN_RUNNING);
    TU_CHECK_OK(ts_train_job_stop(j, 60000));
    ts_train_job_progress(j, &p);
    assert_int_equal(p.state, TS_TRAIN_STOPPED);
    int64_t stopped = p.step;
    ts_train_job_free(j);
    j = start(&o);
    expect_done(j, &p);
    assert_int_equal(p.resumed_from, stopped);
    assert_memory_equal(&p.weights, &straight, sizeof straight);
    printf("  f16 job: stopped at step %lld, resumed, the same weights as straight through "
           "(loss scale %g)\n",
           (long long)stopped, (double)p.loss_scale);
    ts_train_job_free(j);
    ts_store_close(a);
    ts_store_close(b);
}

/* The child's notify: the first call follows the first checkpoint's commit. */
static void tell_parent(void *ctx) {
    static int told;
    char k = 'k';
    if (!told++ && write(*(int *)ctx, &k, 1) != 1)
        _exit(1);
}

/* A job killed with SIGKILL in a child process, a random moment after its first checkpoint,
 * then started again in this process. */
static void test_kill9_resume_is_bit_identical(void **state) {
    (void)state;
    if (!g_ckpt)
        skip(); /* needs the uninterrupted run of the test above */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* the child: trains until killed */
        close(fds[0]);
        ts_store_t *s = NULL;
        ts_store_opts_t so = {.dir = path_in("killed")};
        ts_train_job_opts_t o = job_opts(NULL, 1);
        o.notify = tell_parent, o.ctx = &fds[1];
        ts_train_job_t *j = NULL;
        if (ts_store_open(&s, &so, NULL, 0) != TS_OK || !(o.store = s) ||
            ts_train_job_start(&j, &o, NULL, 0) != TS_OK) {
            (void)!write(fds[1], "x", 1);
            _exit(1);
        }
        for (;;)
            pause();
    }
    close(fds[1]);
    char c = 0;
    assert_int_equal(read(fds[0], &c, 1), 1);
    close(fds[0]);
    srand((unsigned)time(NULL));
    nanosleep(&(struct timespec){0, (long)(rand() % 40) * 1000000L}, NULL); /* mid-step, maybe */
    kill(pid, SIGKILL);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(c, 'k');
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    ts_store_t *s = open_store("killed");
    ts_train_job_opts_t o = job_opts(s, 1);
    ts_train_job_t *j = start(&o);
    ts_train_progress_t p;
    ts_train_job_progress(j, &p);
    /* from the child's last checkpoint: a multiple of EVERY, or the end when the kill came late */
    assert_true(p.resumed_from >= EVERY);
    assert_true(p.resumed_from % EVERY == 0 || p.resumed_from == STEPS);
    print_message("killed after step %lld's checkpoint, resumed from it\n",
                  (long long)p.resumed_from);
    expect_done(j, &p);
    expect_same_end(s, &p);
    ts_train_job_free(j);
    ts_store_close(s);
}

typedef struct {
    ts_train_job_t *_Atomic job;
    atomic_int calls;
    ts_train_snapshot_t *early; /* the first snapshot before the end, held past the job */
} watch_t;

/* notify: counts, and keeps a reference to an intermediate snapshot (on the job's thread, right
 * after its publication). */
static void on_notify(void *ctx) {
    watch_t *w = ctx;
    atomic_fetch_add(&w->calls, 1);
    ts_train_job_t *j = atomic_load(&w->job);
    if (!j || w->early)
        return;
    ts_train_snapshot_t *s = ts_train_job_snapshot(j);
    if (s && s->step < STEPS)
        w->early = s;
    else
        ts_train_snapshot_release(s);
}

/* serve_while_training: snapshots at every checkpoint, the final weights in the store with the
 * partition's metadata, accepted by ts_expert_prepare, and written to opts.out. */
static void test_snapshots_and_final_weights(void **state) {
    (void)state;
    ts_store_t *s = open_store("snapshots");
    ts_train_job_opts_t o = job_opts(s, 0);
    watch_t w = {0};
    o.snapshots = 1, o.notify = on_notify, o.ctx = &w, o.out = path_in("expert-0.safetensors");
    o.steps = 2 * EVERY;
    ts_train_job_t *j = start(&o);
    atomic_store(&w.job, j);
    ts_train_progress_t p;
    wait_end(j, &p);
    if (p.state != TS_TRAIN_DONE)
        fail_msg("job ended %s: %s", ts_train_state_name(p.state), p.message);
    TU_CHECK_OK(ts_train_job_stop(j, 0)); /* ended when it says so: joins at once */
    /* snapshots at EVERY and at the end (which is also a checkpoint) */
    assert_int_equal(p.snapshots, 2);
    assert_int_equal(p.snapshot_step, 2 * EVERY);
    assert_true(atomic_load(&w.calls) >= 2); /* a checkpoint, the end (they may coalesce) */
    ts_train_snapshot_t *last = ts_train_job_snapshot(j);
    assert_non_null(last);
    assert_int_equal(last->step, 2 * EVERY);
    assert_memory_equal(last->hash.b, p.weights.b, TS_HASH_BYTES); /* the final weights */
    /* the superseded snapshot outlives its removal from the store, and its bytes are its hash */
    assert_non_null(w.early);
    assert_int_equal(w.early->step, EVERY);
    ts_hash_t h;
    ts_hash_compute(&h, w.early->bytes, w.early->len);
    assert_memory_equal(h.b, w.early->hash.b, TS_HASH_BYTES);
    TU_CHECK_RC(ts_weights_info(s, &w.early->hash, meta_is, NULL), TS_ENOTFOUND);
    ts_train_job_free(j);

    /* the final weights: in the store with `tessera train --partition`'s metadata ... */
    char pid[TS_PARTITION_ID_HEX], err[512] = "", steps[16], hex[TS_HASH_HEX];
    TU_CHECK_OK(ts_file_blake2b(g_part, pid, err, sizeof err));
    snprintf(steps, sizeof steps, "%d", 2 * EVERY);
    const char *want[] = {"partition_id", pid,           "cluster", "0",       "objective",
                          "velocity",     "train_steps", steps,     "weights", "ema",
                          "shard",        "shard-0",     NULL};
    TU_CHECK_OK(ts_weights_info(s, &p.weights, meta_is, (void *)want));
    /* ... accepted with the partition as the expert to host ... */
    ts_expert_info_t e;
    ts_hash_hex(&p.weights, hex);
    TU_CHECK_RC_MSG(ts_expert_prepare(s, hex, g_part, &e, err, sizeof err), TS_OK, err);
    assert_int_equal(e.cluster, 0);
    assert_int_equal(e.num_clusters, 2);
    assert_int_equal(e.config.hidden_size, 128);
    ts_expert_info_free(&e);
    /* ... in opts.out, the same bytes ... */
    size_t len = 0;
    unsigned char *file = tu_read_file(o.out, &len);
    assert_int_equal(len, last->len);
    assert_memory_equal(file, last->bytes, len);
    free(file);
    /* ... and a model built from the snapshot holds the weights the store holds */
    ts_engine_t eng;
    ts_dit_t a, b;
    TU_CHECK_OK(tu_engine_init_cpu(&eng));
    TU_CHECK_RC_MSG(ts_train_snapshot_open_dit(last, &eng, 1, 0, &a, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_weights_open_dit(s, &p.weights, &eng, 1, 0, &b, err, sizeof err), TS_OK,
                    err);
    assert_memory_equal(a.param_mem.data, b.param_mem.data, ts_tensor_nbytes(&a.param_mem));
    ts_dit_free(&a);
    ts_dit_free(&b);
    ts_engine_free(&eng);
    ts_train_snapshot_release(last);
    ts_train_snapshot_release(w.early);

    /* started again when complete: done at once, no step taken, the same weights */
    ts_train_progress_t q;
    j = start(&o);
    wait_end(j, &q);
    assert_int_equal(q.state, TS_TRAIN_DONE);
    assert_int_equal(q.resumed_from, 2 * EVERY);
    assert_true(isnan(q.loss));
    assert_memory_equal(q.weights.b, p.weights.b, TS_HASH_BYTES);
    assert_int_equal(q.snapshots, 1); /* the final weights, once */
    ts_train_job_free(j);
    ts_store_close(s);
}

/* start(o) must fail with want and a sentence containing each NULL-terminated fragment. */
static void expect_refused(const ts_train_job_opts_t *o, int want, ...) {
    static char sentinel;
    ts_train_job_t *j = (ts_train_job_t *)&sentinel; /* start must reset it to NULL */
    char err[512] = "";
    TU_CHECK_RC_MSG(ts_train_job_start(&j, o, err, sizeof err), want, err);
    assert_null(j);
    va_list ap;
    va_start(ap, want);
    for (const char *frag = va_arg(ap, const char *); frag; frag = va_arg(ap, const char *))
        TU_CHECK_CONTAINS(err, frag);
    va_end(ap);
}

/* A checkpoint the store cannot take (its map capped under one checkpoint's size): the write,
 * on the writer's thread, fails; the job ends failed at the next hand-over or at its end, with
 * the store's sentence, the step of the write and "intact" for the older checkpoint (none here),
 * and ckpt_step never moved. The store stays usable. */
static void test_checkpoint_write_fails(void **state) {
    (void)state;
    ts_store_t *s = NULL;
    char err[256] = "";
    ts_store_opts_t so = {.dir = path_in("full"), .map_size = 1 << 20, .map_max = 1 << 20};
    TU_CHECK_RC_MSG(ts_store_open(&s, &so, err, sizeof err), TS_OK, err);
    ts_train_job_opts_t o = job_opts(s, 0);
    ts_train_progress_t p;
    ts_train_job_t *j = start(&o);
    wait_end(j, &p);
    assert_int_equal(p.state, TS_TRAIN_FAILED);
    assert_int_equal(p.ckpt_step, -1);
    assert_true(p.step >= EVERY && p.step <= 2 * EVERY); /* noticed at the next hand-over */
    char want[64];
    snprintf(want, sizeof want, "checkpoint at step %d failed", EVERY);
    if (!strstr(p.message, want) || !strstr(p.message, "cannot save the checkpoint") ||
        !strstr(p.message, "intact"))
        fail_msg("message: %s", p.message);
    ts_train_job_free(j);
    int64_t step = 0;
    unsigned char *blob = NULL;
    size_t len = 0;
    assert_int_equal(ts_ckpt_latest(s, p.run_id, &step, &blob, &len), TS_ENOTFOUND);
    ts_store_close(s);
}

static void test_bad_inputs(void **state) {
    (void)state;
    ts_store_t *s = open_store("bad");
    ts_train_job_opts_t o = job_opts(s, 0);
    o.partition = path_in("no-such-partition.safetensors");
    expect_refused(&o, TS_ENOTFOUND, "no-such-partition.safetensors", NULL);
    o = job_opts(s, 2);
    expect_refused(&o, TS_EINVAL, "cluster 2", "has clusters 0..1", NULL);
    o = job_opts(s, 0);
    o.data = "/nonexistent/fashion-mnist";
    expect_refused(&o, TS_EIO, "/nonexistent/fashion-mnist", NULL);
    o = job_opts(s, 0);
    o.model = "huge";
    expect_refused(&o, TS_EINVAL, "unknown model 'huge'", NULL);
    o = job_opts(s, 0);
    o.ckpt_every = 0;
    expect_refused(&o, TS_EINVAL, "ckpt_every", NULL);
    o = job_opts(s, 0);
    o.train.lr = -1;
    expect_refused(&o, TS_EINVAL, "cannot start training", NULL);
    o = job_opts(NULL, 0);
    expect_refused(&o, TS_EINVAL, "store", NULL);
    /* a partition file that is not one */
    tu_write_file(path_in("garbage.safetensors"), "not a partition", 15);
    o = job_opts(s, 0);
    o.partition = path_in("garbage.safetensors");
    expect_refused(&o, TS_ECORRUPT, "garbage.safetensors", NULL);
    ts_store_close(s);
}

static void test_run_id(void **state) {
    (void)state;
    const char *pid = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    ts_dit_config_t m;
    TU_CHECK_OK(ts_dit_config_preset("tiny", &m));
    ts_train_config_t t;
    ts_train_config_default(&t);
    char a[TS_TRAIN_RUN_ID_MAX], b[TS_TRAIN_RUN_ID_MAX];
    TU_CHECK_OK(ts_train_run_id(pid, 3, &m, &t, a));
    assert_int_equal(strlen(a), strlen("tesserad/") + 64 + strlen("/3/") + 16);
    assert_int_equal(strncmp(a, "tesserad/", 9), 0);
    assert_int_equal(strncmp(a + 9, pid, 64), 0);
    assert_int_equal(strncmp(a + 73, "/3/", 3), 0);
    TU_CHECK_OK(ts_train_run_id(pid, 3, &m, &t, b));
    assert_string_equal(a, b); /* a pure function */
    ts_train_config_t u = t;
    u.seed = 1;
    TU_CHECK_OK(ts_train_run_id(pid, 3, &m, &u, b));
    assert_string_not_equal(a, b);
    u = t;
    u.lr *= 2;
    TU_CHECK_OK(ts_train_run_id(pid, 3, &m, &u, b));
    assert_string_not_equal(a, b);
    ts_dit_config_t n = m;
    n.depth++;
    TU_CHECK_OK(ts_train_run_id(pid, 3, &n, &t, b));
    assert_string_not_equal(a, b);
    TU_CHECK_OK(ts_train_run_id(pid, 4, &m, &t, b));
    assert_string_not_equal(a, b);
    TU_CHECK_RC(ts_train_run_id("0011", 3, &m, &t, b), TS_EINVAL);
    TU_CHECK_RC(ts_train_run_id(pid, -1, &m, &t, b), TS_EINVAL);
}

/* The config's [expert] and [train] keys map onto the job's options. */
static void test_opts_from_config(void **state) {
    (void)state;
    ts_daemon_config_t c;
    char err[512] = "";
    const char *text = "[node]\nidentity = i\nnetwork_key = n\nlisten = 127.0.0.1:1\n"
                       "[expert]\nmode = train\npartition = p.safetensors\ncluster = 1\n"
                       "weights = out.safetensors\n"
                       "[train]\nsteps = 77\nbatch = 5\nlr = 0.002\nwarmup = 9\nema = 0.5\n"
                       "seed = 11\nthreads = 1\nckpt_every = 4\nkeep = 6\nmodel = small\n"
                       "serve_while_training = true\n";
    TU_CHECK_RC_MSG(ts_daemon_config_parse(&c, text, "t.ini", err, sizeof err), TS_OK, err);
    ts_train_job_opts_t o;
    ts_store_t *store = (ts_store_t *)&c; /* only carried */
    ts_train_job_opts_from_config(&o, &c, store);
    assert_ptr_equal(o.store, store);
    assert_string_equal(o.partition, "p.safetensors");
    assert_int_equal(o.cluster, 1);
    assert_string_equal(o.out, "out.safetensors");
    assert_string_equal(o.data, TS_FMNIST_DEFAULT_DIR);
    assert_string_equal(o.model, "small");
    assert_int_equal(o.steps, 77);
    assert_int_equal(o.train.batch, 5);
    assert_true(o.train.lr == 0.002f);
    assert_int_equal(o.train.warmup, 9);
    assert_true(o.train.ema_decay == 0.5f);
    assert_true(o.train.seed == 11);
    assert_int_equal(o.threads, 1);
    assert_int_equal(o.ckpt_every, 4);
    assert_int_equal(o.keep, 6);
    assert_int_equal(o.snapshots, 1);
    assert_null(o.notify);
    ts_train_config_t d;
    ts_train_config_default(&d);
    assert_true(o.train.grad_clip == d.grad_clip && o.train.label_dropout == d.label_dropout);
}

int main(void) {
    if (!have_fmnist()) {
        printf("skip: no Fashion-MNIST in " TS_FMNIST_DEFAULT_DIR "\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_id),
        cmocka_unit_test(test_opts_from_config),
        cmocka_unit_test(test_cluster_is_the_shard_file),
        cmocka_unit_test(test_checkpoint_write_fails),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_stop_and_resume_is_bit_identical),
        cmocka_unit_test(test_f16_stop_and_resume),
        cmocka_unit_test(test_kill9_resume_is_bit_identical),
        cmocka_unit_test(test_snapshots_and_final_weights),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
