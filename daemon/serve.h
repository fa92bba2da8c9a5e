/*
 * serve.h — serving denoise requests for the node's one expert (architecture.md §7,
 * docs/protocol.md "Serving", §5–§7): a queue, a batcher, and a dedicated compute thread.
 *
 * What it is. A ts_serve_t registers the denoise_request handler on a net/rpc.h endpoint. Each
 * request is checked against the expert (expert id, x_t's dtype and shape, finite values, labels,
 * its size against max_batch), then queued. The compute thread — a pthread of its own, not the
 * libuv pool — takes the oldest requests as soon as they fill max_batch rows or the oldest has
 * waited max_wait_ms, drops those whose deadline has passed, runs ONE forward pass of the expert
 * over all of them, and hands each request its slice back to the loop through a uv_async, where
 * it is answered with its velocity and Timings{queue_us, compute_us, batch_size}.
 *
 * Rows. The unit of work is a forward row: one sample, or two for a guided sample (cfg_scale
 * != 1: the pair [x; x] with labels [y; ∅]). max_batch and max_queue count rows, and so do
 * batch_size and queue_depth; a request of B samples takes B rows, or 2B with guidance, and must
 * fit in one batch. Guidance is combined per request exactly as the local sampler does it
 * (model/sampler.c ts_dit_velocity: v = s·v(y), then v += (1 − s)·v(∅), the same ops in the same
 * order), and a sample's forward row does not depend on the rest of its batch (the CPU backend
 * is batch-invariant: kernels/cpu/cpu_gemm.c), so a served velocity is bit for bit the velocity a
 * local sampler computes with the same weights.
 *
 * Answers, each request exactly once (net/rpc.h): the velocity, in x_t's dtype; busy with a retry
 * hint when accepting it would take the queue past max_queue rows; ERROR_INVALID_ARGUMENT with a
 * sentence for a request that does not fit the expert (the connection stays usable);
 * ERROR_NOT_FOUND for another expert id; ERROR_DEADLINE_EXCEEDED when its deadline passed before
 * its batch started; ERROR_CANCELLED (dropped by rpc) when the requester cancelled it or its
 * connection closed before its batch started — a request whose batch has started is finished and
 * its answer dropped; ERROR_UNAVAILABLE once shutting down; ERROR_INTERNAL when compute failed.
 *
 * Threads. Everything here but the compute thread runs on the loop's thread; the queue, the done
 * list and the counters are shared under one mutex. The compute thread owns the engine and the
 * model: nothing else touches them after ts_serve_new.
 *
 * Shutting down. ts_serve_shutdown answers every queued request ERROR_UNAVAILABLE at once, and
 * every later one too; the batch in progress, if any, finishes (one forward pass of at most
 * max_batch rows: that is the bound) and is answered; the thread then exits and is joined from
 * the loop. Run the loop until ts_serve_free stops returning TS_EBUSY. Free the server before
 * its rpc endpoint.
 */
#ifndef TS_DAEMON_SERVE_H
#define TS_DAEMON_SERVE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "model/dit.h"
#include "net/keys.h"
#include "net/rpc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_SERVE_ID_BYTES 32 /* an expert id: the weights hash, BLAKE2b-256 of its file */

typedef struct ts_serve ts_serve_t;

/* The expert to serve. params is its flat parameter slab (F32, on the CPU, cfg's layout:
 * model/dit.h ts_dit_param_table), copied by ts_serve_new. */
typedef struct ts_serve_expert {
    ts_dit_config_t cfg;
    const ts_tensor_t *params;
    uint8_t id[TS_SERVE_ID_BYTES];
} ts_serve_expert_t;

typedef struct ts_serve_opts {
    int max_batch;           /* rows per forward pass (a guided sample is 2), default 16 */
    int max_wait_ms;         /* how long the oldest request waits for others, default 0 */
    int max_queue;           /* rows queued before busy, default 256 */
    int compute_threads;     /* the engine's worker threads, default 0 = one per core */
    ts_device_spec_t device; /* the engine's device, default cpu (tesserad: [compute] device) */
    /* the forward's products (tesserad: [compute] precision), default f32. bf16 where the engine
     * cannot run it falls back to f32, and the device note (ts_serve_device) says why. */
    ts_precision_t precision;
    /* how the model's attention is chosen (tesserad: [compute] attention; model/dit.h
     * ts_dit_choose_attention), default auto: measured at max_batch on a GPU, where CUDA graphs
     * are measured too; the device note says what was chosen and why */
    ts_attn_choice_t attention;
    /* Optional observers, called on the compute thread after each batch (they must be thread-safe
     * and quick: a metrics registry's updates): the batch's rows, compute time (wall, staging
     * and copies included) and device time (upload, forward and guidance: on a GPU the span
     * between two CUDA events on the engine's stream, idle gaps between kernels included; 0 for
     * a failed batch), and each of its requests' time in
     * the queue. */
    void (*on_batch)(void *ctx, int rows, uint64_t compute_us, uint64_t device_us);
    void (*on_queue_wait)(void *ctx, uint64_t queue_us);
    void *observe_ctx;
    /* The most bytes the model may take (0: the engine's free memory, less a GPU engine's own):
     * a max_batch whose memory (model/dit.h ts_dit_memory) passes it is lowered to the most rows
     * that fit, and the device note says so; a model whose one row does not fit is refused. */
    uint64_t memory_budget;
    /* Tests: a batch of more rows than this fails as out of device memory (0: never), so that
     * what a GPU running out of memory does can be checked on any machine. */
    int fault_nomem_rows;
    /* The node's identity: every velocity answered is signed with it (net/answer.h), with the
     * engine's device class and the precision. NULL: unsigned answers (tests of the server
     * alone; a client that checks signatures refuses them). Borrowed: it must outlive the server. */
    const ts_identity_t *identity;
    /* Tests and measurements ([fault] lie_*): a fraction lie_rate of the F32 answers (drawn from
     * lie_seed) is changed to v·lie_scale + lie_bias + N(0, lie_noise²) before it is signed. */
    double lie_bias, lie_noise, lie_scale, lie_rate;
    uint64_t lie_seed;
    uint64_t lie_after; /* the first lie_after answers are honest (a liar that earns trust) */
} ts_serve_opts_t;

void ts_serve_opts_default(ts_serve_opts_t *o);

/* Load, for the advert (protocol.md `Load`). */
typedef struct ts_serve_load {
    uint32_t queue_depth;     /* rows waiting, not yet computing */
    uint32_t item_latency_us; /* compute time per row, moving average over the last batches */
    float requests_per_s;     /* denoise_requests received per second, decaying over ~5 s */
} ts_serve_load_t;

/* How each request was answered (ts_serve_stats_t.answered is indexed by this). */
typedef enum {
    TS_SERVE_OK,          /* a velocity */
    TS_SERVE_INVALID,     /* ERROR_INVALID_ARGUMENT */
    TS_SERVE_NOT_FOUND,   /* ERROR_NOT_FOUND: another expert */
    TS_SERVE_BUSY,        /* busy: the queue was full */
    TS_SERVE_DEADLINE,    /* ERROR_DEADLINE_EXCEEDED */
    TS_SERVE_CANCELLED,   /* cancelled, or its connection closed, before its batch */
    TS_SERVE_UNAVAILABLE, /* ERROR_UNAVAILABLE: shutting down */
    TS_SERVE_INTERNAL,    /* ERROR_INTERNAL: compute failed */
    TS_SERVE_OUTCOMES
} ts_serve_outcome_t;

/* "ok", "invalid", ... (metric labels); "unknown" outside the enum. */
const char *ts_serve_outcome_name(ts_serve_outcome_t o);

#define TS_SERVE_BATCH_BUCKETS 12 /* batch_hist[i]: batches of rows in (2^(i-1), 2^i], i < 11 */

/* Counters since ts_serve_new, for a metrics module. */
typedef struct ts_serve_stats {
    uint64_t requests;                    /* denoise_requests received */
    uint64_t answered[TS_SERVE_OUTCOMES]; /* by outcome */
    uint64_t batches, rows;               /* forward passes run, rows computed */
    uint64_t batch_hist[TS_SERVE_BATCH_BUCKETS];
    uint64_t queue_us_sum, queue_us_max; /* per computed request: arrival to its batch's start */
    uint64_t compute_us_sum, compute_us_max; /* per batch */
    /* Out of device memory: a batch that does not fit is split (its jobs go back to the queue and
     * the rows per batch halve; they double again after 64 batches that fit), and a job that
     * does not fit alone is answered ERROR_UNAVAILABLE. The daemon stays up. */
    uint64_t nomem_splits, nomem_refused;
    uint32_t rows_cap; /* rows per batch now (max_batch until memory ran out) */
} ts_serve_stats_t;

/* Creates the server: an engine of o->compute_threads workers, the model (activations for
 * max_batch rows) with a copy of x's parameters, the compute thread, and the denoise_request
 * handler on rpc (which must outlive the server; loop is rpc's). o may be NULL (defaults).
 * TS_EINVAL (with a sentence) for a bad config or options, TS_ENOMEM, or the engine's error. */
int ts_serve_new(ts_serve_t **out, uv_loop_t *loop, ts_rpc_t *rpc, const ts_serve_expert_t *x,
                 const ts_serve_opts_t *o, char *err, size_t errlen);

/* Stops accepting work (see "Shutting down" above). Idempotent. */
void ts_serve_shutdown(ts_serve_t *s);

/* Shuts down if that was not done, and frees everything once the compute thread has exited and
 * its handle has closed: TS_EBUSY until then (run the loop and call again). Unregisters the
 * handler (later denoise_requests get ERROR_UNSUPPORTED from rpc). NULL-safe. */
int ts_serve_free(ts_serve_t *s);

void ts_serve_load(ts_serve_t *s, ts_serve_load_t *out);
/* What the server computes on: ts_engine_describe's words ("cpu, 2 threads", "cuda:0, NAME, …"),
 * and, where the device was chosen by "auto", why (ts_engine_init_spec's note). */
void ts_serve_device(const ts_serve_t *s, char *buf, size_t len, char *note, size_t note_len);
/* The server's GPU memory, total and used (ts_engine_memory); TS_ENODEV on the CPU. */
int ts_serve_memory(const ts_serve_t *s, size_t *total, size_t *used);
/* The rows one batch (and one request) may carry — [serve] max_batch, or less where the device's
 * memory holds fewer (the device note says so) — and the model's memory: *model_bytes besides
 * the rows, *row_bytes per row (model/dit.h ts_dit_memory). Zeros for NULL. */
void ts_serve_capacity(const ts_serve_t *s, int *max_rows, uint64_t *model_bytes,
                       uint64_t *row_bytes);
/* The server's GPU utilisation (ts_engine_utilization); TS_ENODEV on the CPU. */
int ts_serve_utilization(const ts_serve_t *s, double *ratio);
void ts_serve_stats(ts_serve_t *s, ts_serve_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif
