/*
 * serve.c — the expert server (daemon/serve.h).
 *
 * How the pieces fit. A request becomes a job: a copy of its inputs, room for its answer, its
 * arrival and deadline on the monotonic clock (uv_hrtime), and its rpc request, which only the
 * loop's thread touches. A job moves through three places, each change under s->mu:
 *
 *   loop: on_denoise ──push──► queue ──take_batch──► (the compute thread's batch) ──► done
 *              ▲                 │ on_cancel / shutdown: answered at once               │
 *              └──── answer_job ◄────────────── async_cb (uv_async_send) ◄──────────────┘
 *
 * The compute thread sleeps on s->cv until the queue has a job, then waits for company until the
 * queue holds max_batch rows or the oldest job has waited max_wait_ms (or reached its deadline),
 * takes jobs from the head while they fit (strict arrival order; expired ones go straight to
 * done), and runs the batch with the lock released. Invariants: a job is in exactly one of queue,
 * one batch, done, or already answered and freed; queued_rows is the sum of the rows in queue;
 * every job is answered exactly once, on the loop, by answer_job or at once (cancel, shutdown).
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/serve.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/list.h"
#include "base/str.h"
#include "kernels/ops.h"
#include "net/answer.h"
#include "net/frame.h"

#define RATE_TAU_S 5.0     /* requests_per_s decays over this many seconds */
#define LATENCY_ALPHA 0.2  /* weight of the newest batch in item_latency_us */
#define CAP_RECOVER 64     /* batches at a lowered cap before it doubles again */
#define RETRY_MAX_MS 10000 /* the longest retry hint a busy answer gives */

typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE } job_state_t;

typedef struct job {
    ts_list_t node;
    ts_serve_t *srv;
    ts_rpc_request_t *req; /* the loop's only */
    job_state_t state;     /* under s->mu */
    int B, rows;           /* samples, and forward rows (2B with guidance) */
    float cfg_scale;
    ts_dtype_t dtype;  /* x_t's, and the answer's */
    int64_t shape[4];  /* (B, C, H, W) */
    int with_var;      /* the answer carries the variance interpolation (with_variance) */
    int64_t vshape[4]; /* the answer's: shape, or (B, 2C, H, W) with_var */
    void *x, *v;       /* elements of dtype: the input (shape), the answer (vshape) */
    float *t;          /* (B) */
    int32_t *y;        /* (B) */
    uint64_t arrival_ns, deadline_ns;
    ts_serve_outcome_t outcome; /* set by the compute thread: OK, DEADLINE, INTERNAL, or
                                 * UNAVAILABLE when it alone does not fit the device's memory */
    int nonfinite;              /* INTERNAL because the batch's velocity was not finite */
    uint32_t queue_us, compute_us, device_us, batch_rows;
    uint64_t request_id;                        /* the Envelope's, for the signed claim */
    uint8_t request_hash[TS_ANSWER_HASH_BYTES]; /* net/answer.h's, when answers are signed */
} job_t;

struct ts_serve {
    uv_loop_t *loop;
    ts_rpc_t *rpc;
    uv_async_t async;
    ts_dit_config_t cfg;
    uint8_t id[TS_SERVE_ID_BYTES];
    ts_serve_opts_t o;
    int64_t chw; /* C·H·W of one sample */
    /* the compute thread's own */
    ts_engine_t eng, host; /* host: a one-thread CPU engine for conversions when eng is a GPU */
    int eng_ok, host_ok;
    char eng_note[1024];
    char device_class[TS_ANSWER_DEVICE_MAX + 1]; /* in every signed answer */
    uint8_t precision_dtype;                     /* the model's products, as a wire DType */
    uint64_t lie_rng;                            /* the loop's: [fault] lie_rate's draws */
    uint64_t lie_answers;                        /* answers maybe_lie has seen */
    ts_dit_memory_t mem; /* the model's memory, from its config (ts_dit_memory) */
    ts_dit_t model;
    /* host staging, x (max_batch, C, H, W) and t (max_batch) F32, and when the engine is a GPU
     * the rows coming back vv (max_batch, C, H, W), all three pinned, and the forward's inputs on
     * the GPU xd, td: one copy up and one down per batch. A CPU engine reads xx and tt itself
     * and its output is host memory: no vv, xd, td. sv: the variance rows coming back (a GPU
     * engine serving a model with learned σ; pinned). */
    ts_tensor_t xx, tt, vv, sv, xd, td;
    ts_engine_mark_t mark[2]; /* a batch's device time (CUDA events on a GPU), compute thread's */
    int32_t *yy;              /* (max_batch) labels */
    pthread_t thread;
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ts_list_t queue, done;
    int queued_rows;
    int rows_cap; /* rows per batch now: max_batch, halved by each batch out of memory */
    int cap_ok;   /* batches run at a lowered cap since it was lowered */
    int stop, exited;
    ts_serve_stats_t st;
    double item_us; /* moving average of compute time per row, 0: none yet */
    double rate;    /* requests_per_s at rate_ns */
    uint64_t rate_ns;
    /* the loop's */
    int stopping, joined, closed;
};

static const char *OUTCOMES[TS_SERVE_OUTCOMES] = {
    "ok", "invalid", "not_found", "busy", "deadline", "cancelled", "unavailable", "internal"};

const char *ts_serve_outcome_name(ts_serve_outcome_t o) {
    return (unsigned)o < TS_SERVE_OUTCOMES ? OUTCOMES[o] : "unknown";
}

void ts_serve_opts_default(ts_serve_opts_t *o) {
    *o = (ts_serve_opts_t){.max_batch = 16,
                           .max_wait_ms = 0,
                           .max_queue = 256,
                           .compute_threads = 0,
                           .device = {.automatic = 0, .device = TS_CPU, .gpu = 0},
                           .lie_scale = 1.0,
                           .lie_rate = 1.0};
}

static void count(ts_serve_t *s, ts_serve_outcome_t o) {
    pthread_mutex_lock(&s->mu);
    s->st.answered[o]++;
    pthread_mutex_unlock(&s->mu);
}

/* ---- jobs ---------------------------------------------------------------------------------- */

static void job_free(job_t *j) {
    if (!j)
        return;
    free(j->x);
    free(j->v);
    free(j->t);
    free(j->y);
    free(j);
}

/* A job holding copies of a checked request's inputs (the envelope is only valid during the
 * handler). NULL when memory ran out. */
static job_t *job_new(const Tessera__DenoiseRequest *d, int rows, uint64_t deadline_ns) {
    job_t *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    ts_tensor_t x; /* the checked request's x_t, viewed (net/frame.h: the one wire codec) */
    if (ts_frame_tensor_view(d->x_t, &x) != TS_OK) {
        free(j);
        return NULL;
    }
    size_t bytes = ts_tensor_nbytes(&x);
    j->B = (int)x.shape[0];
    j->rows = rows;
    j->cfg_scale = d->cfg_scale;
    j->dtype = x.dtype;
    memcpy(j->shape, x.shape, sizeof j->shape);
    memcpy(j->vshape, x.shape, sizeof j->vshape);
    j->with_var = d->has_with_variance && d->with_variance;
    if (j->with_var)
        j->vshape[1] *= 2;
    j->x = malloc(bytes);
    j->v = malloc(j->with_var ? 2 * bytes : bytes);
    j->t = malloc((size_t)j->B * sizeof *j->t);
    j->y = malloc((size_t)j->B * sizeof *j->y);
    if (!j->x || !j->v || !j->t || !j->y) {
        job_free(j);
        return NULL;
    }
    memcpy(j->x, x.data, bytes);
    memcpy(j->t, d->t, (size_t)j->B * sizeof *j->t);
    memcpy(j->y, d->class_labels, (size_t)j->B * sizeof *j->y);
    j->arrival_ns = uv_hrtime();
    j->deadline_ns = deadline_ns;
    return j;
}

/* ---- the compute thread -------------------------------------------------------------------- */

static job_t *job_at(ts_list_t *n) { return TS_CONTAINER_OF(n, job_t, node); }

static void abs_time(uint64_t ns, struct timespec *ts) {
    ts->tv_sec = (time_t)(ns / 1000000000u);
    ts->tv_nsec = (long)(ns % 1000000000u);
}

/* With mu held and the queue not empty: sleeps until the queue holds max_batch rows, the oldest
 * job has waited max_wait_ms or reached its deadline, or stop. */
static void wait_for_company(ts_serve_t *s) {
    while (!s->stop && !ts_list_empty(&s->queue) && s->queued_rows < s->o.max_batch) {
        job_t *head = job_at(s->queue.next);
        uint64_t until = head->arrival_ns + (uint64_t)s->o.max_wait_ms * 1000000u;
        if (head->deadline_ns < until)
            until = head->deadline_ns;
        if (uv_hrtime() >= until)
            return;
        struct timespec ts;
        abs_time(until, &ts);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
}

/* With mu held: moves every queued job whose deadline has passed to done, wherever it stands in
 * the queue. Returns how many. */
static int drop_expired(ts_serve_t *s) {
    int n = 0;
    uint64_t now = uv_hrtime();
    for (ts_list_t *it = s->queue.next, *next; it != &s->queue; it = next) {
        next = it->next;
        job_t *j = job_at(it);
        if (j->deadline_ns > now)
            continue;
        ts_list_remove(&j->node);
        s->queued_rows -= j->rows;
        j->state = JOB_DONE;
        j->outcome = TS_SERVE_DEADLINE;
        j->queue_us = (uint32_t)((now - j->arrival_ns) / 1000u);
        ts_list_push(&s->done, &j->node);
        n++;
    }
    return n;
}

/* With mu held and no queued job past its deadline: moves jobs from the head of the queue into
 * batch while they fit in max_batch rows. Returns the batch's rows. */
static int take_batch(ts_serve_t *s, ts_list_t *batch) {
    int rows = 0;
    while (!ts_list_empty(&s->queue)) {
        job_t *j = job_at(s->queue.next);
        /* rows_cap: max_batch, or less since a batch ran out of memory; a job over it runs alone */
        if (rows + j->rows > s->o.max_batch || (rows > 0 && rows + j->rows > s->rows_cap))
            break;
        ts_list_remove(&j->node);
        s->queued_rows -= j->rows;
        j->state = JOB_RUNNING;
        ts_list_push(batch, &j->node);
        rows += j->rows;
    }
    return rows;
}

/* Stages every job of batch as rows of xx, tt, yy: [x; x] with labels [y; ∅] for a guided one. */
static int stage_batch(ts_serve_t *s, ts_list_t *batch) {
    ts_engine_t *host = s->eng.device == TS_CPU ? &s->eng : &s->host;
    int64_t r = 0;
    TS_LIST_FOREACH(it, batch) {
        job_t *j = job_at(it);
        int pairs = j->rows / j->B;
        ts_tensor_t src, dst, tsrc, tdst;
        TS_TRY(ts_tensor_wrap(&src, j->x, j->dtype, TS_CPU, 4, j->shape));
        TS_TRY(ts_tensor_wrap(&tsrc, j->t, TS_F32, TS_CPU, 1, TS_SHAPE(j->B)));
        for (int p = 0; p < pairs; p++, r += j->B) {
            TS_TRY(ts_tensor_slice(&dst, &s->xx, r, j->B));
            TS_TRY(j->dtype == TS_F32 ? ts_tensor_copy(&dst, &src) : ts_convert(host, &dst, &src));
            TS_TRY(ts_tensor_slice(&tdst, &s->tt, r, j->B));
            TS_TRY(ts_tensor_copy(&tdst, &tsrc));
            for (int i = 0; i < j->B; i++)
                s->yy[r + i] = p == 0 ? j->y[i] : s->cfg.num_classes; /* the null class */
        }
    }
    return TS_OK;
}

/* Uploads the staged rows to the engine's device and runs one forward pass over them; out is
 * the model's output on the device. */
static int forward_batch(ts_serve_t *s, int rows, ts_tensor_t *out) {
    ts_tensor_t xh, th, xb, tb;
    TS_TRY(ts_tensor_slice(&xh, &s->xx, 0, rows));
    TS_TRY(ts_tensor_slice(&th, &s->tt, 0, rows));
    if (s->eng.device == TS_CPU) /* the staging is the engine's memory: no copy */
        return ts_dit_forward(&s->model, &xh, &th, s->yy, rows, out);
    TS_TRY(ts_tensor_slice(&xb, &s->xd, 0, rows));
    TS_TRY(ts_tensor_slice(&tb, &s->td, 0, rows));
    TS_TRY(ts_tensor_copy(&xb, &xh));
    TS_TRY(ts_tensor_copy(&tb, &th));
    return ts_dit_forward(&s->model, &xb, &tb, s->yy, rows, out);
}

/* Job j's answer with its variance (vshape (B, 2C, H, W)): sample i's C prediction channels from
 * row r + i of down, then its C variance channels from row r + i of sig (the conditional rows,
 * as DiT's sampling takes them), each in the request's dtype. */
static int take_with_variance(ts_serve_t *s, job_t *j, const ts_tensor_t *down,
                              const ts_tensor_t *sig, int64_t r) {
    ts_engine_t *host = s->eng.device == TS_CPU ? &s->eng : &s->host;
    size_t half = (size_t)s->chw * ts_dtype_size(j->dtype);
    for (int i = 0; i < j->B; i++)
        for (int p = 0; p < 2; p++) {
            ts_tensor_t dst, src;
            TS_TRY(ts_tensor_wrap(&dst, (char *)j->v + (2 * (size_t)i + (size_t)p) * half, j->dtype,
                                  TS_CPU, 4, TS_SHAPE(1, j->shape[1], j->shape[2], j->shape[3])));
            TS_TRY(ts_tensor_slice(&src, p ? sig : down, r + i, 1));
            if (p) /* the rows sent: a job's conditional rows (the batch's others are not) */
                TS_TRY(ts_check_finite(host, &src));
            TS_TRY(j->dtype == TS_F32 ? ts_tensor_copy(&dst, &src) : ts_convert(host, &dst, &src));
        }
    return TS_OK;
}

/* One forward pass over the staged rows, then each job's velocity into its answer buffer: the
 * conditional rows, guided on the device as ts_dit_velocity does it (v = s·v(y), then
 * v += (1 − s)·v(∅)); on a GPU the batch's rows come down in one copy into pinned memory, and
 * each answer is taken from there (converted to the request's dtype on the host). */
static int run_batch(ts_serve_t *s, ts_list_t *batch, int rows, double *device_s) {
    ts_engine_t *e = &s->eng, *host = e->device == TS_CPU ? e : &s->host;
    TS_TRY(stage_batch(s, batch));
    ts_tensor_t out;
    TS_TRY(ts_engine_mark(e, &s->mark[0])); /* the device's time: upload, forward, guidance */
    TS_TRY(forward_batch(s, rows, &out));
    int64_t r = 0;
    TS_LIST_FOREACH(it, batch) {
        job_t *j = job_at(it);
        if (j->rows == 2 * j->B) {
            ts_tensor_t cond, uncond;
            TS_TRY(ts_tensor_slice(&cond, &out, r, j->B));
            TS_TRY(ts_tensor_slice(&uncond, &out, r + j->B, j->B));
            TS_TRY(ts_scale(e, &cond, j->cfg_scale));
            TS_TRY(ts_axpy(e, &cond, 1.0f - j->cfg_scale, &uncond));
        }
        r += j->rows;
    }
    TS_TRY(ts_engine_mark(e, &s->mark[1]));
    ts_tensor_t down = out; /* the CPU engine's output is host memory already */
    if (e->device != TS_CPU) {
        TS_TRY(ts_tensor_slice(&down, &s->vv, 0, rows));
        TS_TRY(ts_tensor_copy(&down, &out));
    }
    TS_TRY(ts_engine_marks_elapsed(e, &s->mark[0], &s->mark[1], device_s)); /* done: no wait */
    /* a NaN or Inf is never sent (at f16, an activation past ±65504 makes one): TS_ENONFINITE */
    TS_TRY(ts_check_finite(host, &down));
    ts_tensor_t sig = {0}; /* the batch's variance rows on the host, when a job asked for them */
    int any_var = 0;
    TS_LIST_FOREACH(it, batch) { any_var |= job_at(it)->with_var; }
    if (any_var) {
        TS_TRY(ts_dit_sigma(&s->model, rows, &sig));
        if (e->device != TS_CPU) {
            ts_tensor_t sd = sig;
            TS_TRY(ts_tensor_slice(&sig, &s->sv, 0, rows));
            TS_TRY(ts_tensor_copy(&sig, &sd));
        }
    }
    r = 0;
    TS_LIST_FOREACH(it, batch) {
        job_t *j = job_at(it);
        ts_tensor_t v, answer;
        if (j->with_var) {
            TS_TRY(take_with_variance(s, j, &down, &sig, r));
        } else {
            TS_TRY(ts_tensor_wrap(&answer, j->v, j->dtype, TS_CPU, 4, j->shape));
            TS_TRY(ts_tensor_slice(&v, &down, r, j->B));
            TS_TRY(j->dtype == TS_F32 ? ts_tensor_copy(&answer, &v)
                                      : ts_convert(host, &answer, &v));
        }
        r += j->rows;
    }
    return TS_OK;
}

static int hist_bucket(int rows) {
    int b = 0;
    while (b < TS_SERVE_BATCH_BUCKETS - 1 && (1 << b) < rows)
        b++;
    return b;
}

/* Microseconds for a uint32 field: past ~71 minutes, UINT32_MAX. */
static uint32_t clamp_us(double us) { return us < (double)UINT32_MAX ? (uint32_t)us : UINT32_MAX; }

/* With mu held: the batch's jobs to done with their outcome and timings, and the counters. */
static void finish_batch(ts_serve_t *s, ts_list_t *batch, int rows, int rc, uint64_t t0,
                         uint64_t t1, double device_s) {
    uint64_t compute_us = (t1 - t0) / 1000u;
    while (!ts_list_empty(batch)) {
        job_t *j = job_at(batch->next);
        ts_list_remove(&j->node);
        j->state = JOB_DONE;
        j->outcome = rc == TS_OK       ? TS_SERVE_OK
                     : rc == TS_ENOMEM ? TS_SERVE_UNAVAILABLE
                                       : TS_SERVE_INTERNAL;
        j->nonfinite = rc == TS_ENONFINITE;
        j->queue_us = (uint32_t)((t0 - j->arrival_ns) / 1000u);
        j->compute_us = clamp_us((double)compute_us);
        j->device_us = rc == TS_OK ? clamp_us(device_s * 1e6) : 0;
        j->batch_rows = (uint32_t)rows;
        s->st.queue_us_sum += j->queue_us;
        if (j->queue_us > s->st.queue_us_max)
            s->st.queue_us_max = j->queue_us;
        if (s->o.on_queue_wait)
            s->o.on_queue_wait(s->o.observe_ctx, j->queue_us);
        ts_list_push(&s->done, &j->node);
    }
    if (s->o.on_batch)
        s->o.on_batch(s->o.observe_ctx, rows, compute_us,
                      rc == TS_OK ? (uint64_t)(device_s * 1e6) : 0);
    s->st.batches++;
    s->st.rows += (uint64_t)rows;
    s->st.batch_hist[hist_bucket(rows)]++;
    s->st.compute_us_sum += compute_us;
    if (compute_us > s->st.compute_us_max)
        s->st.compute_us_max = compute_us;
    double per_row = (double)compute_us / rows;
    s->item_us =
        s->item_us > 0 ? (1 - LATENCY_ALPHA) * s->item_us + LATENCY_ALPHA * per_row : per_row;
}

/* The forward pass of a batch; TS_ENOMEM when the device has no memory for it (or, in tests,
 * when it has more rows than o.fault_nomem_rows). */
static int run_batch_checked(ts_serve_t *s, ts_list_t *batch, int rows, double *device_s) {
    if (s->o.fault_nomem_rows > 0 && rows > s->o.fault_nomem_rows)
        return TS_ENOMEM;
    return run_batch(s, batch, rows, device_s);
}

/* With mu held, after a batch of rows ran out of memory: the cap halves, and a batch of several
 * jobs goes back to the head of the queue, in order, to run as smaller batches (answers do not
 * depend on their batch). 1 when it went back; 0 for a lone job, which is refused. */
static int split_after_nomem(ts_serve_t *s, ts_list_t *batch, int rows) {
    s->rows_cap = rows / 2 > 0 ? rows / 2 : 1;
    s->cap_ok = 0;
    s->st.rows_cap = (uint32_t)s->rows_cap;
    if (batch->next->next == batch) { /* one job: nothing to split */
        s->st.nomem_refused++;
        return 0;
    }
    s->st.nomem_splits++;
    while (!ts_list_empty(batch)) {
        job_t *j = job_at(batch->prev); /* the last first: each goes to the head */
        ts_list_remove(&j->node);
        j->state = JOB_QUEUED;
        s->queued_rows += j->rows;
        ts_list_insert_before(s->queue.next, &j->node);
    }
    return 1;
}

static void *compute_main(void *arg) {
    ts_serve_t *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        if (ts_list_empty(&s->queue)) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        wait_for_company(s);
        if (s->stop)
            break;
        /* The expired leave first; the rest, when some left, wait for company again from their
         * own arrival (a job that came just after an expired head is not run alone at once). */
        if (drop_expired(s) > 0) {
            uv_async_send(&s->async);
            continue;
        }
        ts_list_t batch;
        ts_list_init(&batch);
        int rows = take_batch(s, &batch);
        if (rows > 0) {
            pthread_mutex_unlock(&s->mu);
            uint64_t t0 = uv_hrtime();
            double device_s = 0.0;
            int rc = run_batch_checked(s, &batch, rows, &device_s);
            uint64_t t1 = uv_hrtime();
            pthread_mutex_lock(&s->mu);
            if (rc == TS_ENOMEM && split_after_nomem(s, &batch, rows))
                continue;
            if (rc == TS_OK && s->rows_cap < s->o.max_batch && ++s->cap_ok >= CAP_RECOVER) {
                /* memory pressure passes (another process on the GPU): try twice the rows */
                s->rows_cap = s->rows_cap * 2 < s->o.max_batch ? s->rows_cap * 2 : s->o.max_batch;
                s->st.rows_cap = (uint32_t)s->rows_cap;
                s->cap_ok = 0;
            }
            finish_batch(s, &batch, rows, rc, t0, t1, device_s);
        }
        if (!ts_list_empty(&s->done))
            uv_async_send(&s->async);
    }
    s->exited = 1;
    pthread_mutex_unlock(&s->mu);
    uv_async_send(&s->async);
    return NULL;
}

/* ---- answering, on the loop ------------------------------------------------------------------ */

/* A uniform double in [0, 1) and a standard normal from the loop's generator (splitmix64). */
static double lie_uniform(ts_serve_t *s) {
    uint64_t z = (s->lie_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

static double lie_normal(ts_serve_t *s) {
    double u = lie_uniform(s), w = lie_uniform(s);
    return sqrt(-2.0 * log(u > 0.0 ? u : 0x1.0p-53)) * cos(6.283185307179586 * w);
}

/* [fault] lie_*: changes a drawn fraction of the F32 answers, before they are signed. */
static void maybe_lie(ts_serve_t *s, job_t *j) {
    const ts_serve_opts_t *o = &s->o;
    if ((o->lie_bias == 0.0 && o->lie_noise == 0.0 && o->lie_scale == 1.0) || j->dtype != TS_F32 ||
        s->lie_answers++ < o->lie_after || lie_uniform(s) >= o->lie_rate)
        return;
    float *v = j->v;
    int64_t n = (int64_t)j->B * s->chw * (j->with_var ? 2 : 1);
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)(v[i] * o->lie_scale + o->lie_bias +
                       (o->lie_noise > 0.0 ? o->lie_noise * lie_normal(s) : 0.0));
}

/* Signs the answer resp (its velocity set) to job j with the node's identity (net/answer.h):
 * resp's signature (into sig, which must outlive resp), device class and precision. */
static void sign_answer(ts_serve_t *s, const job_t *j, Tessera__DenoiseResponse *resp,
                        uint8_t sig[TS_SIGNATURE_BYTES]) {
    ts_answer_claim_t c;
    memset(&c, 0, sizeof c);
    c.request_id = j->request_id;
    memcpy(c.request_hash, j->request_hash, sizeof c.request_hash);
    memcpy(c.expert, s->id, sizeof c.expert);
    (void)ts_answer_tensor_hash(resp->velocity, c.answer_hash); /* set just before: valid */
    c.precision = s->precision_dtype;
    snprintf(c.device_class, sizeof c.device_class, "%s", s->device_class);
    ts_answer_sign(&c, s->o.identity, sig);
    resp->has_signature = 1;
    resp->signature.data = sig;
    resp->signature.len = TS_SIGNATURE_BYTES;
    resp->device_class = s->device_class;
    resp->has_precision = 1;
    resp->precision = (Tessera__DType)s->precision_dtype;
}

/* Answers a job the compute thread is done with (rpc drops the answer when the requester
 * cancelled meanwhile; it is counted by what the server did). */
static void answer_job(ts_serve_t *s, job_t *j) {
    ts_tensor_t answer; /* the velocity in the request's dtype and shape (net/frame.h's codec) */
    Tessera__Tensor v = TESSERA__TENSOR__INIT;
    if (j->outcome == TS_SERVE_OK)
        maybe_lie(s, j);
    if (j->outcome == TS_SERVE_OK &&
        (ts_tensor_wrap(&answer, j->v, j->dtype, TS_CPU, 4, j->vshape) != TS_OK ||
         ts_frame_tensor_set(&v, &answer) != TS_OK))
        j->outcome = TS_SERVE_INTERNAL;
    if (j->outcome == TS_SERVE_DEADLINE) {
        ts_rpc_reply_error(j->req, TESSERA__ERROR_CODE__ERROR_DEADLINE_EXCEEDED,
                           "the deadline passed after %u ms in the queue, before compute",
                           j->queue_us / 1000u);
    } else if (j->outcome == TS_SERVE_INTERNAL && j->nonfinite) {
        ts_rpc_reply_error(j->req, TESSERA__ERROR_CODE__ERROR_INTERNAL,
                           "the expert's forward pass gave a non-finite velocity (NaN or Inf) "
                           "for its batch%s",
                           s->o.precision == TS_PREC_F16
                               ? ": at f16, an activation past ±65504 (serve in bf16 or f32)"
                               : "");
    } else if (j->outcome == TS_SERVE_INTERNAL) {
        ts_rpc_reply_error(j->req, TESSERA__ERROR_CODE__ERROR_INTERNAL,
                           "the expert's forward pass failed");
    } else if (j->outcome == TS_SERVE_UNAVAILABLE) { /* set by the compute thread: memory */
        ts_rpc_reply_error(j->req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE,
                           "out of device memory for %d rows alone: send fewer samples per "
                           "request, or ask another replica",
                           j->rows);
    } else {
        Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
        Tessera__DenoiseResponse resp = TESSERA__DENOISE_RESPONSE__INIT;
        Tessera__Timings tm = TESSERA__TIMINGS__INIT;
        tm.has_queue_us = tm.has_compute_us = tm.has_batch_size = tm.has_device_us = 1;
        tm.queue_us = j->queue_us;
        tm.compute_us = j->compute_us;
        tm.device_us = j->device_us;
        tm.batch_size = j->batch_rows;
        resp.velocity = &v;
        resp.timings = &tm;
        uint8_t sig[TS_SIGNATURE_BYTES];
        if (s->o.identity)
            sign_answer(s, j, &resp, sig);
        env.body_case = TESSERA__ENVELOPE__BODY_DENOISE_RESPONSE;
        env.denoise_response = &resp;
        ts_rpc_reply(j->req, &env);
    }
    count(s, j->outcome);
    job_free(j);
}

static void async_closed(uv_handle_t *h) {
    ts_serve_t *s = TS_CONTAINER_OF(h, ts_serve_t, async);
    s->closed = 1;
}

static void async_cb(uv_async_t *a) {
    ts_serve_t *s = TS_CONTAINER_OF(a, ts_serve_t, async);
    ts_list_t done;
    ts_list_init(&done);
    pthread_mutex_lock(&s->mu);
    while (!ts_list_empty(&s->done)) {
        ts_list_t *n = s->done.next;
        ts_list_remove(n);
        ts_list_push(&done, n);
    }
    int exited = s->exited;
    pthread_mutex_unlock(&s->mu);
    while (!ts_list_empty(&done)) {
        job_t *j = job_at(done.next);
        ts_list_remove(&j->node);
        answer_job(s, j);
    }
    if (exited && !s->joined) {
        pthread_join(s->thread, NULL);
        s->joined = 1;
        uv_close((uv_handle_t *)&s->async, async_closed);
    }
}

/* The requester cancelled, or its connection closed: a queued job leaves the queue and is
 * answered now (rpc drops the answer); a started one is finished and its answer dropped. */
static void on_cancel(ts_rpc_request_t *req, void *arg) {
    job_t *j = arg;
    ts_serve_t *s = j->srv;
    pthread_mutex_lock(&s->mu);
    int queued = j->state == JOB_QUEUED;
    if (queued) {
        ts_list_remove(&j->node);
        s->queued_rows -= j->rows;
        s->st.answered[TS_SERVE_CANCELLED]++;
    }
    pthread_mutex_unlock(&s->mu);
    if (!queued) /* started: answer_job's answer will be dropped */
        return;
    ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_CANCELLED, "cancelled before compute");
    job_free(j);
}

/* ---- taking requests, on the loop ------------------------------------------------------------ */

static void hex_prefix(const uint8_t *b, char out[17]) { ts_hex(b, 8, out); }

/* Checks d against the expert and the limits (what net/frame.c's envelope check has not: t's
 * range, the counts of t and labels and the 4 dimensions are checked there). On success *rows is
 * the request's forward rows; otherwise the outcome (INVALID or NOT_FOUND) with a sentence. */
static ts_serve_outcome_t check_request(const ts_serve_t *s, const Tessera__DenoiseRequest *d,
                                        int *rows, char *why, size_t len) {
    if (d->expert_id.len != TS_SERVE_ID_BYTES ||
        memcmp(d->expert_id.data, s->id, TS_SERVE_ID_BYTES)) {
        char want[17], got[17] = "";
        hex_prefix(s->id, want);
        if (d->expert_id.len == TS_SERVE_ID_BYTES)
            hex_prefix(d->expert_id.data, got);
        snprintf(why, len, "this node serves expert %s…, not %s…", want, got);
        return TS_SERVE_NOT_FOUND;
    }
    const Tessera__Tensor *x = d->x_t;
    const ts_dit_config_t *c = &s->cfg;
    if (x->n_shape != 4 || x->shape[1] != c->in_channels || x->shape[2] != c->input_size ||
        x->shape[3] != c->input_size) {
        snprintf(why, len, "denoise_request.x_t must be (B, %d, %d, %d) for this expert",
                 c->in_channels, c->input_size, c->input_size);
        return TS_SERVE_INVALID;
    }
    int64_t B = x->shape[0];
    if (d->n_t != (size_t)B || d->n_class_labels != (size_t)B) {
        snprintf(why, len, "denoise_request needs %lld values of t and of class_labels",
                 (long long)B);
        return TS_SERVE_INVALID;
    }
    int pairs = d->cfg_scale != 1.0f ? 2 : 1;
    if (B > s->o.max_batch / pairs) {
        snprintf(why, len,
                 "denoise_request has %lld samples%s, %lld forward rows; this node takes at most "
                 "%d rows per request (max_batch)",
                 (long long)B, pairs == 2 ? " with guidance" : "", (long long)B * pairs,
                 s->o.max_batch);
        return TS_SERVE_INVALID;
    }
    for (int64_t i = 0; i < B; i++)
        if (d->class_labels[i] > c->num_classes) {
            snprintf(why, len,
                     "denoise_request.class_labels[%lld] is %d; this expert has classes 0..%d "
                     "and %d for none",
                     (long long)i, (int)d->class_labels[i], c->num_classes - 1, c->num_classes);
            return TS_SERVE_INVALID;
        }
    if (ts_frame_check_tensor(x, TS_FRAME_DTYPES_FLOAT, TS_FRAME_CHECK_FINITE,
                              "denoise_request.x_t", why, len) != TS_OK)
        return TS_SERVE_INVALID;
    if (d->has_with_variance && d->with_variance && !c->learn_sigma) {
        snprintf(why, len,
                 "denoise_request.with_variance: this expert has no learned variance "
                 "(ModelConfig.learn_sigma is not set in its advert)");
        return TS_SERVE_INVALID;
    }
    *rows = (int)B * pairs;
    return TS_SERVE_OK;
}

/* The retry hint of a busy answer: the time to compute what is queued, at the recent rate. */
static uint32_t retry_hint_ms(const ts_serve_t *s) {
    double ms = s->queued_rows * s->item_us / 1000.0 + s->o.max_wait_ms;
    return ms < 1 ? 1 : ms > RETRY_MAX_MS ? RETRY_MAX_MS : (uint32_t)ceil(ms);
}

static void note_request(ts_serve_t *s) {
    uint64_t now = uv_hrtime();
    pthread_mutex_lock(&s->mu);
    s->st.requests++;
    s->rate = s->rate * exp(-(double)(now - s->rate_ns) / 1e9 / RATE_TAU_S) + 1.0 / RATE_TAU_S;
    s->rate_ns = now;
    pthread_mutex_unlock(&s->mu);
}

static void on_denoise(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    ts_serve_t *s = arg;
    const Tessera__DenoiseRequest *d = env->denoise_request;
    char why[TS_FRAME_MESSAGE_MAX] = "";
    int rows = 0;
    note_request(s);
    if (s->stopping) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE,
                           "this node is shutting down");
        count(s, TS_SERVE_UNAVAILABLE);
        return;
    }
    ts_serve_outcome_t o = check_request(s, d, &rows, why, sizeof why);
    if (o != TS_SERVE_OK) {
        ts_rpc_reply_error(req,
                           o == TS_SERVE_NOT_FOUND ? TESSERA__ERROR_CODE__ERROR_NOT_FOUND
                                                   : TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT,
                           "%s", why);
        count(s, o);
        return;
    }
    if (ts_rpc_request_expired(req)) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_DEADLINE_EXCEEDED,
                           "the deadline passed before the request was read");
        count(s, TS_SERVE_DEADLINE);
        return;
    }
    /* the deadline on the monotonic clock the compute thread reads (rpc's is the loop's ms) */
    uint64_t at = ts_rpc_request_deadline(req), loop_now = uv_now(s->loop);
    uint64_t deadline_ns = at ? uv_hrtime() + (at - loop_now) * 1000000u : UINT64_MAX;
    pthread_mutex_lock(&s->mu);
    int full = s->queued_rows + rows > s->o.max_queue;
    uint32_t retry = full ? retry_hint_ms(s) : 0;
    if (full)
        s->st.answered[TS_SERVE_BUSY]++;
    pthread_mutex_unlock(&s->mu);
    if (full) {
        ts_rpc_reply_busy(req, retry);
        return;
    }
    job_t *j = job_new(d, rows, deadline_ns);
    if (!j) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        count(s, TS_SERVE_INTERNAL);
        return;
    }
    j->srv = s;
    j->req = req;
    j->request_id = ts_rpc_request_id(req);
    if (s->o.identity && ts_answer_request_hash(d, j->request_hash) != TS_OK) { /* checked: */
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "cannot hash the request");
        count(s, TS_SERVE_INTERNAL);
        job_free(j);
        return;
    }
    pthread_mutex_lock(&s->mu);
    ts_list_push(&s->queue, &j->node);
    s->queued_rows += rows;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    ts_rpc_request_on_cancel(req, on_cancel, j);
}

/* ---- life cycle ------------------------------------------------------------------------------ */

static int check_opts(const ts_serve_opts_t *o, char *err, size_t errlen) {
    if (o->max_batch < 1 || o->max_batch > 65536 || o->max_wait_ms < 0 || o->max_wait_ms > 60000 ||
        o->max_queue < o->max_batch || o->compute_threads < 0 || o->compute_threads > 1024) {
        ts_set_err(err, errlen,
                   "serve: want 1 <= max_batch <= 65536, 0 <= max_wait_ms <= 60000, max_queue >= "
                   "max_batch, 0 <= compute_threads <= 1024 (got %d, %d, %d, %d)",
                   o->max_batch, o->max_wait_ms, o->max_queue, o->compute_threads);
        return TS_EINVAL;
    }
    return TS_OK;
}

/* The model's precision, after its parameters are in: bf16 converts the weights once; where bf16
 * cannot run, the server stays f32 and the device note (logged at start, shown by status) says
 * why rather than refusing to serve. */
static void set_precision(ts_serve_t *s) {
    char why[256] = "";
    size_t used = strlen(s->eng_note);
    char *tail = s->eng_note + used;
    size_t room = sizeof s->eng_note - used;
    if (s->o.precision == TS_PREC_F32)
        return;
    int rc = ts_dit_set_precision(&s->model, s->o.precision, why, sizeof why);
    if (rc == TS_OK)
        snprintf(tail, room, "; %s products%s", ts_precision_name(s->o.precision),
                 s->o.precision == TS_PREC_F16 && s->eng.device == TS_CPU
                     ? " (emulated on the CPU: slower than f32)"
                     : "");
    else
        snprintf(tail, room, "; f32 (precision %s refused: %s)", ts_precision_name(s->o.precision),
                 why[0] ? why : ts_strerror(rc));
}

static double gib(uint64_t b) { return (double)b / (double)(1u << 30); }

/* The memory the model takes (from its config: parameters, fixed part, bytes per row) against what
 * the engine can still use now (ts_engine_memory_usable, or o.memory_budget when less): a
 * max_batch that
 * does not fit is lowered to the most rows that do, and the device note says so; not even one row
 * is TS_ENOMEM with both figures. Where the free memory is unknown, max_batch stays. */
static int size_batch(ts_serve_t *s, const ts_dit_config_t *c, char *err, size_t errlen) {
    /* the composed attention's layout, the larger, and the 16-bit copy if one is asked for */
    int rc = ts_dit_memory(c, s->o.precision, TS_ATTN_COMPOSED, &s->mem);
    if (rc) {
        ts_set_err(err, errlen, "serve: the expert's config needs too much memory: %s",
                   ts_strerror(rc));
        return rc;
    }
    uint64_t budget = 0, total = 0;
    size_t used = strlen(s->eng_note);
    char *tail = s->eng_note + used;
    size_t room = sizeof s->eng_note - used;
    int B = s->o.max_batch;
    int known = ts_engine_memory_usable(&s->eng, &budget, &total) == TS_OK && total > 0;
    if (s->o.memory_budget > 0) { /* the operator's cap, or the device's, whichever is less */
        budget = known && budget < s->o.memory_budget ? budget : s->o.memory_budget;
        total = known ? total : s->o.memory_budget;
        known = 1;
    }
    if (!known) {
        snprintf(tail, room, "; memory %.3f GiB for %d rows",
                 gib(ts_dit_memory_total(&s->mem, 0, B)), B);
        return TS_OK;
    }
    int fit = ts_dit_memory_max_batch(&s->mem, 0, budget, B);
    if (fit < 1) {
        ts_set_err(err, errlen,
                   "serve: the expert needs %.3f GiB for one row (%.3f GiB with its parameters) "
                   "and %.3f GiB of the %s's %.3f are usable%s",
                   gib(s->mem.infer_per_sample), gib(ts_dit_memory_total(&s->mem, 0, 1)),
                   gib(budget), s->eng.device == TS_CUDA ? "device" : "machine", gib(total),
                   s->o.memory_budget ? " (memory_budget)" : "");
        return TS_ENOMEM;
    }
    if (fit < B) {
        snprintf(tail, room,
                 "; [serve] max_batch %d lowered to %d: %d rows would take %.3f GiB, %.3f GiB are "
                 "usable",
                 B, fit, B, gib(ts_dit_memory_total(&s->mem, 0, B)), gib(budget));
        s->o.max_batch = fit; /* max_queue >= the configured max_batch > fit: still valid */
        s->rows_cap = fit;
        s->st.rows_cap = (uint32_t)fit;
        used = strlen(s->eng_note);
        tail = s->eng_note + used;
        room = sizeof s->eng_note - used;
    }
    snprintf(tail, room, "; memory %.3f GiB for %d rows (%.1f MiB per row) of %.3f GiB usable",
             gib(ts_dit_memory_total(&s->mem, 0, s->o.max_batch)), s->o.max_batch,
             (double)s->mem.infer_per_sample / (1 << 20), gib(budget));
    return TS_OK;
}

/* The engine, the model with x's parameters and the staging, for max_batch rows (lowered to what
 * the device's memory holds: size_batch). */
static int build_model(ts_serve_t *s, const ts_serve_expert_t *x, char *err, size_t errlen) {
    int rc = ts_engine_init_spec(&s->eng, &s->o.device, s->o.compute_threads, s->eng_note,
                                 sizeof s->eng_note);
    if (rc) {
        ts_set_err(err, errlen, "serve: starting the engine failed: %s", s->eng_note);
        return rc;
    }
    s->eng_ok = 1;
    if (s->eng.device != TS_CPU) {
        ts_engine_opts_t ho = {.device = TS_CPU, .threads = 1};
        if ((rc = ts_engine_init(&s->host, &ho)) != TS_OK) {
            ts_set_err(err, errlen, "serve: starting the host engine failed: %s", ts_strerror(rc));
            return rc;
        }
        s->host_ok = 1;
    }
    const ts_dit_config_t *c = &x->cfg;
    if ((rc = size_batch(s, c, err, errlen)) != TS_OK)
        return rc;
    int B = s->o.max_batch;
    rc = ts_dit_create(&s->model, c, &s->eng, B, 0);
    if (rc == TS_OK && (x->params->dtype != TS_F32 || x->params->ndim != 1 ||
                        x->params->shape[0] != s->model.num_params))
        rc = TS_ESHAPE;
    if (rc == TS_OK)
        rc = ts_tensor_copy(&s->model.param_mem, x->params);
    if (rc == TS_OK)
        set_precision(s);
    if (rc == TS_OK) {
        size_t used = strlen(s->eng_note);
        char note[448];
        rc = ts_dit_choose_attention(&s->model, s->o.attention, B, note, sizeof note);
        snprintf(s->eng_note + used, sizeof s->eng_note - used, "; %s", note);
    }
    if (rc == TS_OK && s->model.precision != s->o.precision) /* fell back: advertise what runs */
        (void)ts_dit_memory(c, s->model.precision, TS_ATTN_COMPOSED, &s->mem);
    /* the host side of every copy to and from a GPU is pinned (ordinary memory on the CPU) */
    int gpu = s->eng.device != TS_CPU;
    int64_t S = c->input_size;
    if (rc == TS_OK)
        rc = gpu ? ts_tensor_alloc_pinned(&s->xx, TS_F32, 4, TS_SHAPE(B, c->in_channels, S, S))
                 : ts_tensor_alloc(&s->xx, TS_F32, TS_CPU, 4, TS_SHAPE(B, c->in_channels, S, S));
    if (rc == TS_OK && gpu)
        rc = ts_tensor_alloc_pinned(&s->vv, TS_F32, 4, TS_SHAPE(B, c->in_channels, S, S));
    if (rc == TS_OK && gpu && c->learn_sigma)
        rc = ts_tensor_alloc_pinned(&s->sv, TS_F32, 4, TS_SHAPE(B, c->in_channels, S, S));
    if (rc == TS_OK)
        rc = gpu ? ts_tensor_alloc_pinned(&s->tt, TS_F32, 1, TS_SHAPE(B))
                 : ts_tensor_alloc(&s->tt, TS_F32, TS_CPU, 1, TS_SHAPE(B));
    if (rc == TS_OK && s->eng.device != TS_CPU)
        rc = ts_tensor_alloc(&s->xd, TS_F32, s->eng.device, 4,
                             TS_SHAPE(B, c->in_channels, c->input_size, c->input_size));
    if (rc == TS_OK && s->eng.device != TS_CPU)
        rc = ts_tensor_alloc(&s->td, TS_F32, s->eng.device, 1, TS_SHAPE(B));
    if (rc == TS_OK && !(s->yy = malloc((size_t)B * sizeof *s->yy)))
        rc = TS_ENOMEM;
    if (rc)
        ts_set_err(err, errlen, "serve: building the expert failed: %s%s", ts_strerror(rc),
                   rc == TS_ESHAPE ? " (the parameters do not match the config)" : "");
    return rc;
}

/* Frees what build_model made, and s. */
static void release(ts_serve_t *s) {
    ts_tensor_free(&s->xx);
    ts_tensor_free(&s->vv);
    ts_tensor_free(&s->sv);
    ts_tensor_free(&s->tt);
    ts_tensor_free(&s->xd);
    ts_tensor_free(&s->td);
    ts_engine_mark_free(&s->mark[0]);
    ts_engine_mark_free(&s->mark[1]);
    free(s->yy);
    ts_dit_free(&s->model);
    if (s->eng_ok)
        ts_engine_free(&s->eng);
    if (s->host_ok)
        ts_engine_free(&s->host);
    free(s);
}

/* release, once the mutex and condition exist. */
static void destroy(ts_serve_t *s) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    release(s);
}

static void async_closed_destroy(uv_handle_t *h) { destroy(TS_CONTAINER_OF(h, ts_serve_t, async)); }

int ts_serve_new(ts_serve_t **out, uv_loop_t *loop, ts_rpc_t *rpc, const ts_serve_expert_t *x,
                 const ts_serve_opts_t *o, char *err, size_t errlen) {
    if (!out || !loop || !rpc || !x || !x->params) {
        ts_set_err(err, errlen, "ts_serve_new: invalid arguments");
        return TS_EINVAL;
    }
    *out = NULL;
    ts_serve_opts_t def;
    ts_serve_opts_default(&def);
    if (!o)
        o = &def;
    TS_TRY(check_opts(o, err, errlen));
    if (ts_dit_config_check(&x->cfg) != TS_OK) {
        ts_set_err(err, errlen, "serve: the expert's config is not a valid DiT config");
        return TS_EINVAL;
    }
    ts_serve_t *s = calloc(1, sizeof *s);
    if (!s)
        return TS_ENOMEM;
    s->loop = loop;
    s->rpc = rpc;
    s->cfg = x->cfg;
    s->o = *o;
    s->rows_cap = o->max_batch;
    s->st.rows_cap = (uint32_t)o->max_batch;
    memcpy(s->id, x->id, TS_SERVE_ID_BYTES);
    s->chw = (int64_t)x->cfg.in_channels * x->cfg.input_size * x->cfg.input_size;
    ts_list_init(&s->queue);
    ts_list_init(&s->done);
    s->rate_ns = uv_hrtime();
    int rc = build_model(s, x, err, errlen);
    if (rc) {
        release(s);
        return rc;
    }
    /* what the signed answers say computed them: the engine's class and the attention's kind
     * (both decide the bits), and the precision that runs (after any fall-back) */
    char cls[TS_ANSWER_DEVICE_MAX + 1];
    ts_engine_device_class(&s->eng, cls, sizeof cls);
    snprintf(s->device_class, sizeof s->device_class, "%.100s/%s", cls,
             ts_attn_name(s->model.attn));
    s->precision_dtype = s->model.precision == TS_PREC_BF16  ? TESSERA__DTYPE__DTYPE_BF16
                         : s->model.precision == TS_PREC_F16 ? TESSERA__DTYPE__DTYPE_F16
                                                             : TESSERA__DTYPE__DTYPE_F32;
    s->lie_rng = s->o.lie_seed;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* uv_hrtime's clock */
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (uv_async_init(loop, &s->async, async_cb) != 0) {
        ts_set_err(err, errlen, "serve: cannot make the compute thread's async handle");
        destroy(s);
        return TS_ENOMEM;
    }
    if (pthread_create(&s->thread, NULL, compute_main, s) != 0) {
        ts_set_err(err, errlen, "serve: cannot start the compute thread");
        uv_close((uv_handle_t *)&s->async, async_closed_destroy); /* frees s on the loop */
        return TS_ENOMEM;
    }
    ts_rpc_handle(rpc, TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, on_denoise, s);
    *out = s;
    return TS_OK;
}

void ts_serve_shutdown(ts_serve_t *s) {
    if (!s || s->stopping)
        return;
    s->stopping = 1;
    ts_list_t queued;
    ts_list_init(&queued);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    while (!ts_list_empty(&s->queue)) {
        job_t *j = job_at(s->queue.next);
        ts_list_remove(&j->node);
        ts_list_push(&queued, &j->node);
    }
    s->queued_rows = 0;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    while (!ts_list_empty(&queued)) {
        job_t *j = job_at(queued.next);
        ts_list_remove(&j->node);
        ts_rpc_reply_error(j->req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE,
                           "this node is shutting down");
        count(s, TS_SERVE_UNAVAILABLE);
        job_free(j);
    }
}

int ts_serve_free(ts_serve_t *s) {
    if (!s)
        return TS_OK;
    ts_serve_shutdown(s);
    if (!s->closed)
        return TS_EBUSY;
    ts_rpc_handle(s->rpc, TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, NULL, NULL);
    destroy(s);
    return TS_OK;
}

void ts_serve_load(ts_serve_t *s, ts_serve_load_t *out) {
    uint64_t now = uv_hrtime();
    pthread_mutex_lock(&s->mu);
    double rate = s->rate * exp(-(double)(now - s->rate_ns) / 1e9 / RATE_TAU_S);
    *out = (ts_serve_load_t){.queue_depth = (uint32_t)s->queued_rows,
                             .item_latency_us = (uint32_t)lround(s->item_us),
                             .requests_per_s = (float)rate};
    pthread_mutex_unlock(&s->mu);
}

void ts_serve_stats(ts_serve_t *s, ts_serve_stats_t *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    pthread_mutex_unlock(&s->mu);
}

void ts_serve_device(const ts_serve_t *s, char *buf, size_t len, char *note, size_t note_len) {
    ts_engine_describe(s ? &s->eng : NULL, buf, len);
    if (note && note_len > 0)
        snprintf(note, note_len, "%s", s ? s->eng_note : "");
}

void ts_serve_capacity(const ts_serve_t *s, int *max_rows, uint64_t *model_bytes,
                       uint64_t *row_bytes) {
    *max_rows = s ? s->o.max_batch : 0;
    *model_bytes = s ? ts_dit_memory_total(&s->mem, 0, 0) : 0;
    *row_bytes = s ? s->mem.infer_per_sample : 0;
}

int ts_serve_memory(const ts_serve_t *s, size_t *total, size_t *used) {
    return s ? ts_engine_memory(&s->eng, total, used) : TS_EINVAL;
}

int ts_serve_utilization(const ts_serve_t *s, double *ratio) {
    return s ? ts_engine_utilization(&s->eng, ratio) : TS_EINVAL;
}
