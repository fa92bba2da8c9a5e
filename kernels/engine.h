/*
 * engine.h — a compute engine: one device and what it needs to run ops.
 *
 * Every op takes the engine it runs on, and every tensor it touches must live on the engine's
 * device (else TS_EDEVICE). There is no global compute state: a process may hold a CPU engine and
 * a CUDA engine side by side, each driven by its own compute thread (architecture.md §4).
 *
 * CPU: a pool of worker threads (one per core by default) runs every op: the per-element and
 * per-row loops, and the GEMMs, each worker calling single-threaded OpenBLAS on its own slice of
 * the output. OpenBLAS's own thread pool is set to one thread (process-wide, by ts_engine_init):
 * its workers would otherwise spin between calls and take the cores from the pool.
 *
 * CUDA: a cuBLAS handle bound to one stream; ops are asynchronous on that stream and
 * ts_engine_sync waits for them. ts_tensor_copy to or from the host synchronises.
 */
#ifndef TS_ENGINE_H
#define TS_ENGINE_H

#include "kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_pool ts_pool_t;         /* CPU worker pool (kernels/cpu/pool.c) */
typedef struct ts_cuda_ctx ts_cuda_ctx_t; /* cuBLAS handle + stream (kernels/cuda/) */
typedef struct ts_bf16_ctx ts_bf16_ctx_t; /* oneDNN primitives + scratch (kernels/cpu/cpu_bf16.c) */

typedef struct ts_engine {
    ts_device_t device;
    int threads;         /* CPU: worker threads including the caller */
    int gpu;             /* CUDA: device ordinal */
    ts_pool_t *pool;     /* CPU only */
    ts_cuda_ctx_t *cuda; /* CUDA only */
    ts_bf16_ctx_t *bf16; /* CPU only, made by the first bf16 product */
    float *f16_scratch;  /* CPU only: the f16 emulation's rounded operands (grow-only) */
    size_t f16_cap;      /* its size in floats */
    float *lin_packed;   /* CPU only: a linear layer's weight in panels (kernels/cpu/lin_tile.c) */
    size_t lin_cap;      /* its size in floats */
    /* CPU only: the hot loops built for this CPU (kernels/cpu/vec.h); the environment's
     * TESSERA_CPU_ISA (avx512, avx2, base) caps the choice, for tests and measurements */
    const struct ts_cpu_vec *vec;
    /* CUDA: bumped each time the engine's scratch for rounded operands moves (a CUDA graph holds
     * its address: a graph captured before is not launched after) */
    uint64_t scratch_epoch;
    /* ops that read device memory back to decide something — an index check (the embedding's
     * ids), ts_tensor_item, ts_check_finite — counted on every engine: on a GPU each one waits
     * for the device, which no CUDA graph may record, so tests check on the CPU that a graphed
     * piece of work (a forward, a training step's forward and backward) makes none */
    uint64_t host_reads;
} ts_engine_t;

typedef struct ts_engine_opts {
    ts_device_t device;
    int threads; /* CPU: 0 = one per online core */
    int gpu;     /* CUDA: device ordinal */
} ts_engine_opts_t;

/* Starts an engine. CUDA: TS_ENODEV when the backend is not built or no GPU is present
 * (ts_engine_cuda_status says which). Free with ts_engine_free. */
int ts_engine_init(ts_engine_t *e, const ts_engine_opts_t *opts);
void ts_engine_free(ts_engine_t *e);
/* Waits until all work queued on the engine is done. */
int ts_engine_sync(ts_engine_t *e);

/* A device as a user names it (`--device`, tesserad's `[compute] device`): "auto", "cpu",
 * "cuda" (ordinal 0) or "cuda:N". */
typedef struct ts_device_spec {
    int automatic;      /* 1 for "auto": the GPU when there is one, else the CPU */
    ts_device_t device; /* when not automatic */
    int gpu;            /* TS_CUDA: the ordinal */
    int named;          /* the user named it (a --device option): say where it runs, even the CPU */
} ts_device_spec_t;

#define TS_DEVICE_SPEC_HELP                                                                        \
    "auto (a CUDA GPU when this build has the backend and one is present, else the CPU), cpu, "    \
    "cuda or cuda:N"

/* Parses text (NULL or "" = auto). TS_EINVAL for anything else, out untouched. */
int ts_device_spec_parse(const char *text, ts_device_spec_t *out);
/* The spec as text: "auto", "cpu", "cuda:N". */
void ts_device_spec_format(const ts_device_spec_t *spec, char *buf, size_t len);

/* Starts the engine spec names; threads as in ts_engine_opts_t (CPU). "auto" takes CUDA device 0
 * when the backend is built and a device is present, else the CPU. note (may be NULL) receives
 * one line for the log saying what was chosen and why, e.g. "cpu, 2 threads (auto: CUDA backend
 * not built)" or "cuda:0, NVIDIA H100 80GB HBM3, 79.2 GiB". An explicit cuda[:N] that cannot start
 * returns its error (TS_ENODEV when there is no such device) with the reason in note. */
int ts_engine_init_spec(ts_engine_t *e, const ts_device_spec_t *spec, int threads, char *note,
                        size_t note_len);
/* What the engine runs on, for adverts, status and logs: "cpu, N threads" or "cuda:N, NAME". */
void ts_engine_describe(const ts_engine_t *e, char *buf, size_t len);
/* The revision of the engine's numerics: bump it with any change that alters the bits of an op's
 * result (a new kernel, another order of a sum). It is part of the device class, so that honest
 * replicas on builds that round differently are compared within a tolerance, never bit for bit. */
#define TS_NUMERICS_REV 4

/* The engine's device class, for comparing answers: two engines of one class give a model's
 * rows the same bits. "cpu/KERNELS/nREV" (OpenBLAS's kernel set, lowercase, "+onednn" when the
 * forward products go through oneDNN, "+base" when the engine runs the base build of
 * kernels/cpu/vec.h, whose fused attention multiplies through OpenBLAS; TS_NUMERICS_REV) or
 * "cuda/NAME/nREV" (the GPU's name). */
void ts_engine_device_class(const ts_engine_t *e, char *buf, size_t len);
/* Device memory of a CUDA engine in bytes: total and used now (by every process). TS_ENODEV for a
 * CPU engine. */
int ts_engine_memory(const ts_engine_t *e, size_t *total, size_t *used);
/* What a GPU engine keeps for itself beyond the tensors it is asked for (cuBLAS workspaces,
 * reduction scratch, allocator slack): ts_engine_memory_usable leaves it out. */
#define TS_ENGINE_GPU_RESERVE ((uint64_t)256 << 20)
/* The memory a model on e may still take, in bytes: on a GPU its free device memory
 * (cudaMemGetInfo) less TS_ENGINE_GPU_RESERVE, on the CPU the machine's available memory
 * (MemAvailable of /proc/meminfo, else the free pages) and no more than a cgroup v2 limit leaves;
 * *total the device's or the machine's whole (or the limit). */
int ts_engine_memory_usable(const ts_engine_t *e, uint64_t *usable, uint64_t *total);
/* Device time. A mark records how far the engine's queued work has got: on a GPU an event on
 * the engine's stream (no waiting), on the CPU — whose ops are done when they return — the
 * clock. ts_engine_marks_elapsed waits for the later mark and gives the seconds between two:
 * on a GPU the span on the device's timeline between them (the kernels queued in between and any
 * gaps where the device waited for the host to queue more), without what the host did before
 * the first mark or after the second.
 * A mark starts zeroed (= {0}) and is reused from call to call; free it with
 * ts_engine_mark_free (on the engine's device, before the engine). */
typedef struct ts_engine_mark {
    double t;    /* the CPU's clock, seconds (base/clock.h) */
    void *event; /* a GPU's event, made on the first mark */
} ts_engine_mark_t;
int ts_engine_mark(ts_engine_t *e, ts_engine_mark_t *m);
int ts_engine_marks_elapsed(ts_engine_t *e, const ts_engine_mark_t *a, const ts_engine_mark_t *b,
                            double *seconds);
void ts_engine_mark_free(ts_engine_mark_t *m);
/* Waits until the work queued on m's engine before mark m is done (a GPU: its event; the CPU:
 * nothing to wait for). Any thread may wait, while the engine's user queues more. TS_EINVAL for
 * a mark never recorded on a GPU. */
int ts_engine_mark_wait(ts_engine_t *e, const ts_engine_mark_t *m);
/* Copies src into dst (same dtype and element count) in e's queue order: on a GPU queued on the
 * engine's stream behind the work before it, and returning at once when dst is page-locked host
 * memory (ts_tensor_alloc_pinned) — then dst may be read only after a mark recorded after the
 * copy has been waited for (ts_engine_mark_wait); work queued after the copy cannot change what
 * it reads. On the CPU, or to pageable memory, the copy is done on return. */
int ts_engine_copy_async(ts_engine_t *e, ts_tensor_t *dst, const ts_tensor_t *src);

/* CUDA graphs: the ops queued between ts_engine_capture_begin and ts_engine_capture_end are not
 * run but recorded into *graph, which ts_engine_graph_launch then runs as one launch on the
 * engine's stream (the same kernels on the same buffers, with whatever those buffers hold at
 * launch). The capture runs on a stream of its own, so other threads' copies go on as usual;
 * the capturing thread must not synchronise with the device, allocate or free device memory, or
 * copy through the legacy stream meanwhile: such a call fails the capture, and capture_end then
 * says TS_ECUDA with no graph (the engine's stream is its own again; nothing captured ran).
 * TS_ENOTSUP on a CPU engine. A graph is freed with ts_engine_graph_free (before its engine). */
typedef struct ts_engine_graph {
    void *exec; /* cudaGraphExec_t; NULL: none */
} ts_engine_graph_t;
int ts_engine_capture_begin(ts_engine_t *e);
int ts_engine_capture_end(ts_engine_t *e, ts_engine_graph_t *graph);
int ts_engine_graph_launch(ts_engine_t *e, const ts_engine_graph_t *graph);
void ts_engine_graph_free(ts_engine_graph_t *graph);

/* A cache of graphs for a piece of work that is run again and again with a few fixed sets of
 * buffers and settings (a model's forward, a training step's forward and backward). The caller
 * describes a run by a key (the batch, the buffers' addresses, the settings that choose the
 * kernels: whatever would make the recorded work differ), zero-filled beyond what it sets. On a
 * GPU with the cache on, ts_graph_cache_run runs the work eagerly the first time it sees a key
 * (so every scratch buffer the work grows has its size before a capture), captures it into a
 * graph the second time, and launches that graph every time after: the same kernels on the same
 * buffers, so the same results, with one launch instead of hundreds. The keys of the last
 * TS_GRAPH_SLOTS eager runs are remembered and TS_GRAPH_SLOTS graphs kept, each replaced in
 * turn. A key also carries the engine's scratch_epoch: a graph recorded before the engine's
 * scratch moved is never launched after. A capture that fails (some op synchronised or
 * allocated) turns the cache off (on becomes −1): the work runs eagerly from then on, correct
 * either way. Off, or on a CPU engine, the work always runs eagerly. */
#define TS_GRAPH_SLOTS 4
#define TS_GRAPH_KEY_WORDS 12
typedef struct ts_graph_key {
    uint64_t w[TS_GRAPH_KEY_WORDS];
    uint64_t epoch; /* set by the cache: the engine's scratch_epoch */
} ts_graph_key_t;
typedef struct ts_graph_cache {
    int on; /* 1 on, 0 off (a new cache), −1 off because a capture failed */
    ts_graph_key_t seen[TS_GRAPH_SLOTS], key[TS_GRAPH_SLOTS];
    ts_engine_graph_t graph[TS_GRAPH_SLOTS];
    int next, seen_next;
    int64_t captures, launches; /* counts, for tests and benchmarks */
} ts_graph_cache_t;
typedef int (*ts_graph_work_fn)(void *ctx);
/* Turns the cache on or off, dropping its graphs and keys either way. */
void ts_graph_cache_set(ts_graph_cache_t *c, int on);
/* Frees the graphs and forgets every key (the buffers or kernels they recorded changed); the
 * setting stays. Before the engine is freed. */
void ts_graph_cache_drop(ts_graph_cache_t *c);
/* What the cache does with key k (its epoch taken from e) now: a slot ≥ 0 whose graph to launch,
 * TS_GRAPH_EAGER (run the work eagerly), TS_GRAPH_FIRST (eagerly, and remember k: seen for the
 * first time) or TS_GRAPH_CAPTURE (capture it into slot c->next). Changes nothing. */
#define TS_GRAPH_EAGER (-1)
#define TS_GRAPH_FIRST (-2)
#define TS_GRAPH_CAPTURE (-3)
int ts_graph_cache_plan(const ts_graph_cache_t *c, const ts_engine_t *e, const ts_graph_key_t *k);
/* Runs work(ctx) for key k (its epoch taken from e) as ts_graph_cache_plan says: TS_OK when it ran,
 * eagerly or as a graph; work's own error when an op refused its arguments (then nothing it
 * queued ran, when it was being captured), or the launch's. */
int ts_graph_cache_run(ts_engine_t *e, ts_graph_cache_t *c, const ts_graph_key_t *k,
                       ts_graph_work_fn work, void *ctx);

/* A CUDA engine's GPU utilisation: the fraction of the last sample period in which a kernel ran
 * (NVML's reading, by every process), in [0, 1]. TS_ENODEV for a CPU engine, TS_ENOTSUP where the
 * driver's NVML library is missing. */
int ts_engine_utilization(const ts_engine_t *e, double *ratio);

/* The precision of a model's matrix products (`--precision`, tesserad's `[compute] precision`).
 * TS_PREC_F32: everything fp32, the default. TS_PREC_BF16: the linear layers' weights held in
 * bf16, their inputs and attention's two products rounded to bf16, accumulation and every other op
 * (LayerNorm, softmax, the residual stream) fp32. On the CPU through oneDNN, on a CPU with
 * AVX-512 BF16; on a GPU through cuBLAS, compute capability 8.0 or newer
 * (ts_engine_precision_check). TS_PREC_F16: the same in IEEE half precision (11 significant
 * bits to bf16's 8, range ±65504; training scales the loss, model/trainer.h), on every GPU (bf16
 * needs compute capability 8.0); on a GPU through cuBLAS, on the CPU emulated (f16-rounded
 * operands, fp32 products: the GPU's reference, slower than f32). */
typedef enum { TS_PREC_F32 = 0, TS_PREC_BF16 = 1, TS_PREC_F16 = 2 } ts_precision_t;

#define TS_PRECISION_HELP                                                                          \
    "f32 (default), bf16 (bf16 products, fp32 accumulation; CPU with AVX-512 BF16, or a GPU of "   \
    "compute capability 8.0 or newer) or "                                                         \
    "f16 (half-precision products, for GPUs without bf16; emulated on the CPU)"

/* Parses "f32", "bf16" or "f16" (NULL or "" = f32); TS_EINVAL for anything else, out untouched. */
int ts_precision_parse(const char *text, ts_precision_t *out);
/* "f32", "bf16" or "f16". */
const char *ts_precision_name(ts_precision_t p);
/* The dtype a precision holds weights in: TS_F32, TS_BF16 or TS_F16. */
ts_dtype_t ts_precision_dtype(ts_precision_t p);
/* TS_OK when engine e can run precision p; TS_ENOTSUP otherwise with the reason in why (may be
 * NULL): bf16 in a build without oneDNN, on a CPU without AVX-512 BF16 or on a GPU older than
 * compute capability 8.0. f32 and f16 always run. */
int ts_engine_precision_check(ts_engine_t *e, ts_precision_t p, char *why, size_t why_len);

/* 1 when this build contains the CUDA backend. */
int ts_cuda_built(void);
/* Number of CUDA devices usable now (0 when none or not built). When none, writes the reason
 * (e.g. "CUDA backend not built", "no CUDA device: ...") into why (NUL-terminated). */
int ts_cuda_device_count(char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
