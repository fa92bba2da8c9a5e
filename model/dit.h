/*
 * dit.h — the Diffusion Transformer expert (DiT, Peebles & Xie 2023) as a velocity model.
 *
 * One ts_dit_t is one expert on one engine: its parameters in one allocation with a named view per
 * tensor (the DiT/PyTorch names of architecture.md §9), optionally gradients in a second allocation
 * of the same layout, and activations for up to max_batch samples preallocated in an arena. Forward
 * and backward are written by hand as a list of op calls (kernels/ops.h); backward accumulates
 * parameter gradients and ts_dit_zero_grad clears them.
 *
 * What it is not: an optimiser (model/trainer.h), a sampler (model/sampler.h) or a file format
 * (model/safetensors.h). Inputs are x (B, C, H, W), t (B) in [0, 1] (embedded as 1000·t) and
 * class labels y (B) with y = num_classes meaning "no class" (the null row used for
 * classifier-free guidance). The output is the predicted velocity v = ε − x0, (B, C, H, W).
 */
#ifndef TS_DIT_H
#define TS_DIT_H

#include <stdint.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_dit_config {
    int input_size;  /* image height = width */
    int in_channels; /* C; the output has the same channels (a velocity) */
    int patch_size;  /* p */
    int hidden_size;
    int depth;
    int num_heads;
    int num_classes; /* the label table has num_classes + 1 rows: the last is the null class */
    int mlp_ratio;   /* MLP hidden = mlp_ratio · hidden_size (4 in DiT) */
    int freq_dim;    /* sinusoidal timestep embedding width (256 in DiT) */
    /* 1: DiT's learned variance (its published checkpoints): the final layer makes 2C channels
     * per pixel, the prediction (out) and then the variance interpolation (sigma, ts_dit_sigma).
     * Inference only; metadata "learn_sigma": "true". */
    int learn_sigma;
} ts_dit_config_t;

/* Fills cfg from a preset name: "mini" (64, 2, 2 heads, patch 4: the experts the repository ships
 * for the demo, 0.7 MB each), "tiny" (128, 4, 4 heads, patch 4), "small" (256, 6, 4, patch 2),
 * and DiT's "S/2" "S/4" "S/8" "B/2" … "XL/8"; image 28×28×1 and 10 classes (Fashion-MNIST),
 * which the caller may change. TS_EINVAL for an unknown name. */
int ts_dit_config_preset(const char *name, ts_dit_config_t *cfg);
/* TS_OK when the config is self-consistent (sizes positive and bounded, hidden divisible by
 * heads and by 4, image divisible by patch). */
int ts_dit_config_check(const ts_dit_config_t *cfg);
/* Tokens per image, (input_size / patch_size)². */
int ts_dit_tokens(const ts_dit_config_t *cfg);

/* The trainable tensors of one block, named as in DiT. */
typedef struct ts_dit_block_params {
    ts_tensor_t qkv_w, qkv_b;   /* attn.qkv (3h, h), (3h) */
    ts_tensor_t proj_w, proj_b; /* attn.proj (h, h), (h) */
    ts_tensor_t fc1_w, fc1_b;   /* mlp.fc1 (r·h, h), (r·h) */
    ts_tensor_t fc2_w, fc2_b;   /* mlp.fc2 (h, r·h), (h) */
    ts_tensor_t ada_w, ada_b;   /* adaLN_modulation.1 (6h, h), (6h) */
} ts_dit_block_params_t;

/* Named views into one flat parameter (or gradient, or optimiser-state) slab. */
typedef struct ts_dit_params {
    ts_tensor_t x_w, x_b;          /* x_embedder.proj: (h, C·p·p) view of (h, C, p, p), (h) */
    ts_tensor_t t_w0, t_b0;        /* t_embedder.mlp.0 (h, freq_dim), (h) */
    ts_tensor_t t_w2, t_b2;        /* t_embedder.mlp.2 (h, h), (h) */
    ts_tensor_t y_table;           /* y_embedder.embedding_table (classes + 1, h) */
    ts_dit_block_params_t *blocks; /* depth of them */
    ts_tensor_t f_w, f_b;          /* final_layer.linear (p·p·C, h), (p·p·C) */
    ts_tensor_t fada_w, fada_b;    /* final_layer.adaLN_modulation.1 (2h, h), (2h) */
} ts_dit_params_t;

/* One entry of the parameter table: the file name and shape of a tensor, and where it lives in
 * the flat slab. The table is in a fixed order shared by every slab. */
typedef struct ts_dit_param_info {
    char name[64];
    int ndim;
    int64_t shape[TS_MAX_DIMS]; /* as stored in a file (x_embedder.proj.weight is 4-D) */
    int64_t offset;             /* in elements, into the slab */
    int64_t numel;
    int init; /* TS_INIT_* */
} ts_dit_param_info_t;

enum { TS_INIT_ZERO = 0, TS_INIT_XAVIER = 1, TS_INIT_NORMAL002 = 2 };

/* Activations of one forward pass, for up to max_batch samples (leading dimension). */
typedef struct ts_dit_block_acts {
    ts_tensor_t x_in;                          /* (B, T, h) residual stream entering the block */
    ts_tensor_t mod;                           /* (B, 6h) adaLN output: shift/scale/gate ×2 */
    ts_tensor_t ln1, ln1_mean, ln1_rstd, mod1; /* (B,T,h), (B·T), (B·T), (B,T,h) */
    ts_tensor_t qkv;                           /* (B, T, 3h) */
    ts_tensor_t att;                           /* (B, heads, T, T), composed attention only */
    ts_tensor_t lse;   /* (B, heads, T) fused attention, trainable: each row's log-sum-exp */
    ts_tensor_t atty;  /* (B, T, h) attention output, heads concatenated */
    /* (B, T, h) 16-bit, a trainable model's at bf16 or f16 with the fused attention (else an
     * empty tensor; the model's rooms arena): atty rounded as the attention writes it, proj's
     * input with 16-bit activations (atty stays fp32: the fused backward reads it) */
    ts_tensor_t atty16;
    ts_tensor_t proj;  /* (B, T, h) */
    ts_tensor_t x_mid; /* (B, T, h) after the attention residual */
    ts_tensor_t ln2, ln2_mean, ln2_rstd, mod2;
    ts_tensor_t fc1, gelu; /* (B, T, r·h) */
    ts_tensor_t fc2;       /* (B, T, h) */
    ts_tensor_t x_out;     /* (B, T, h) after the MLP residual: the next x_in */
} ts_dit_block_acts_t;

typedef struct ts_dit_acts {
    ts_tensor_t patches;         /* (B, T, C·p·p) */
    ts_tensor_t x0;              /* (B, T, h) embedded patches + positions */
    ts_tensor_t tfreq;           /* (B, freq_dim) */
    ts_tensor_t t_h, t_s, t_emb; /* (B, h) */
    ts_tensor_t y_emb;           /* (B, h) */
    ts_tensor_t c, c_silu;       /* (B, h) conditioning, and SiLU(c) fed to every adaLN */
    ts_dit_block_acts_t *blocks;
    ts_tensor_t x_final;                     /* (B, T, h) the last block's output */
    ts_tensor_t fmod;                        /* (B, 2h) */
    ts_tensor_t lnf, lnf_mean, lnf_rstd, fx; /* (B,T,h), (B·T), (B·T), (B,T,h) */
    ts_tensor_t out_tok;                     /* (B, T, p·p·C), or p·p·2C with learn_sigma */
    ts_tensor_t out;                         /* (B, C, H, W) the prediction (a velocity, or ε) */
    ts_tensor_t out2,
        sigma; /* learn_sigma: (B, 2C, H, W) the whole output; (B, C, H, W) its σ half */
} ts_dit_acts_t;

/* Gradient scratch of the backward pass (one block's worth, reused for every block). */
typedef struct ts_dit_grad_acts {
    ts_tensor_t dout_tok, dfx, dlnf, dfmod;
    ts_tensor_t dx; /* (B, T, h) running gradient of the residual stream */
    ts_tensor_t dc_silu, dc, dt_s, dt_h;
    ts_tensor_t dmod, dfc2, dgelu, dfc1, dmod2, dln2, dproj, datty, dqkv, datt, dmod1, dln1;
    /* (B, T, max(mlp_ratio·h, 3h)) 16-bit room, a trainable model's at bf16 or f16 (else an
     * empty tensor; the model's rooms arena): with 16-bit activations, the MLP linears', proj's
     * and (with the flash attention) qkv's dout rounded by its producer (gate_residual's, GELU's
     * and the attention's backward), which the linear's backward reads instead of rounding it in
     * a kernel of its own */
    ts_tensor_t dout16;
} ts_dit_grad_acts_t;

/* How a model computes attention. Fused (kernels/cpu/cpu_attention.c, and on a GPU
 * kernels/cuda/cuda_attention.cu in fp32, heads up to 128 wide): blocks of queries with
 * an online softmax, no (B, heads, T, T) tensor in the activations, the backward recomputing the
 * weights from each row's saved log-sum-exp; the default where it was measured faster: a CPU
 * engine's f32 inference at 128 tokens or more (docs/benchmarks.md, "Fused attention"). Composed (gemm · softmax · gemm, kernels/ops_matmul.c): the reference, bit for
 * bit what this model computed before the fused op existed, and a GPU's default (its fused
 * kernels have not been measured yet: they were written without a GPU). The two
 * agree to ~1e-6 relative, not bit for bit; each alone gives a sample the same bits in any
 * batch. */
typedef enum { TS_ATTN_FUSED = 0, TS_ATTN_COMPOSED = 1 } ts_attn_impl_t;

typedef struct ts_dit {
    ts_dit_config_t cfg;
    ts_engine_t *eng; /* borrowed: must outlive the model */
    int max_batch;
    int n_params; /* entries in info */
    ts_dit_param_info_t *info;
    int64_t num_params;    /* total elements */
    ts_tensor_t param_mem; /* (num_params) */
    ts_tensor_t grad_mem;  /* (num_params), empty unless training */
    ts_dit_params_t params, grads;
    ts_tensor_t pos_embed; /* (T, h) fixed, not trained */
    ts_arena_t arena;
    ts_dit_acts_t acts;
    ts_dit_grad_acts_t gacts; /* datt (B, heads, T, T) only for the composed attention */
    ts_attn_impl_t attn;      /* how attention is computed (ts_dit_set_attention) */
    ts_precision_t precision; /* of the forward's products (ts_dit_set_precision), f32 by default */
    ts_tensor_t param_lp;     /* (num_params) BF16 or F16 copy of param_mem at bf16 or f16 */
    ts_dit_params_t wlp;      /* views into param_lp: the linear weights the 16-bit forward uses */
    ts_tensor_t labels;       /* (max_batch) I32 staging for y */
    ts_tensor_t tvals;        /* (max_batch) F32 staging for t */
    int trainable;
    /* a model at bf16 or f16: its linears read 16-bit activations written by their producers
     * (ts_dit_set_lp_activations); on by default on a GPU */
    int lp_acts;
    int fwd_lp_acts; /* lp_acts as the last forward found it: what its backward reads */
    /* a trainable model's 16-bit rooms (the blocks' atty16 with the fused attention, gacts.dout16)
     * in an arena of their own, laid out at bf16 and f16 only (ts_dit_set_precision; empty
     * tensors otherwise): lp_rooms says they are, rooms_attn for which attention */
    ts_arena_t rooms;
    int lp_rooms;
    ts_attn_impl_t rooms_attn;
    /* CUDA graphs of the inference forward (ts_dit_set_graphs), keyed by the batch, the input
     * buffers, the weights' 16-bit copy, the activations' arena and the settings that choose the
     * kernels */
    ts_graph_cache_t graphs;
    /* moves whenever a setting changes the model's buffers or kernels: a graph recorded before
     * (a trainer's, model/trainer.h) is not launched after */
    uint64_t graph_epoch;
} ts_dit_t;

/* Builds a model for cfg on engine e with activations for max_batch samples (parameters zero:
 * call ts_dit_init_weights or load them). trainable = 1 also allocates gradients and the
 * backward scratch. Free with ts_dit_free. */
#define TS_DIT_MAX_DIM 8192  /* hidden size and freq_dim at most */
#define TS_DIT_MAX_DEPTH 256 /* blocks at most */

/* The most memory one model may take for its parameters (and gradients), and for the
 * activations of one sample (max_batch, the caller's choice, multiplies them), measured with the
 * composed attention: a config over either is TS_ERANGE before the allocation, so a file whose
 * metadata names an absurd size (a peer's weights or router) cannot take the machine's memory.
 * A model that cannot train keeps one block's activations (all blocks share them): DiT-XL/2 at
 * 32×32×4 (256 tokens) needs about 30 MB per sample; a trainable one keeps every block's, about
 * 800 MB per sample for DiT-XL/2, hence the larger bound for training. */
#define TS_DIT_MAX_BYTES ((uint64_t)8 << 30)
#define TS_DIT_MAX_SAMPLE_BYTES ((uint64_t)512 << 20)
#define TS_DIT_MAX_TRAIN_SAMPLE_BYTES ((uint64_t)1 << 30)

int ts_dit_create(ts_dit_t *m, const ts_dit_config_t *cfg, ts_engine_t *e, int max_batch,
                  int trainable);
void ts_dit_free(ts_dit_t *m);

/* DiT's initialisation: Xavier-uniform linears (patch embed viewed as a linear), zero biases,
 * N(0, 0.02) label table and timestep-MLP weights, zero adaLN modulation and final linear. The
 * random values come from the counter-based RNG, stream `seed`. */
int ts_dit_init_weights(ts_dit_t *m, uint64_t seed);

/* Binds named views for the layout of cfg onto a flat slab (params, grads, AdamW moments, EMA…).
 * blocks must hold cfg->depth entries. */
int ts_dit_bind(const ts_dit_config_t *cfg, const ts_tensor_t *slab, ts_dit_params_t *views,
                ts_dit_block_params_t *blocks);

/* The parameter table for cfg: *info is malloc'd (caller frees), *count entries, *total elements. */
int ts_dit_param_table(const ts_dit_config_t *cfg, ts_dit_param_info_t **info, int *count,
                       int64_t *total);
/* Model m's parameter called name (DiT's state_dict names), or NULL. */
const ts_dit_param_info_t *ts_dit_param_find(const ts_dit_t *m, const char *name);

/* Forward for B ≤ max_batch samples. x (B, C, H, W) and t (B) are F32 tensors on the engine's
 * device; y is host memory (B labels, each in [0, num_classes]). The result is m->acts.out
 * sliced to B samples, written into *v (a view; valid until the next forward). */
int ts_dit_forward(ts_dit_t *m, const ts_tensor_t *x, const ts_tensor_t *t, const int32_t *y, int B,
                   ts_tensor_t *v);
/* With learn_sigma: the σ half of the last forward's output for its B samples (B, C, H, W), a view
 * valid until the next forward (DiT's variance interpolation v: log σ² = ½(v + 1)·log β +
 * ½(1 − v)·log β̃). TS_EINVAL for a model without it. */
int ts_dit_sigma(ts_dit_t *m, int B, ts_tensor_t *out);
/* CUDA graphs for the inference forward (on: 1, off: 0; a new model starts off). When on, an
 * inference model on a GPU runs the device work of ts_dit_forward — everything after the labels
 * are staged, up to the output (a learned-σ output is split after) — through m->graphs
 * (ts_graph_cache_run, kernels/engine.h: eager the first time a key is seen, captured the
 * second, one launch each time after; the key: B, the x and t buffers, the weights' 16-bit copy,
 * the activations, the attention, the precision and the 16-bit activations): the same kernels
 * on the same buffers, so the same bits, with none of the per-op launch cost (a `tiny` forward
 * is ~200 launches). Changing the attention, the precision or the 16-bit activations drops the
 * graphs. A capture that fails (some op synchronised or allocated) turns graphs off for the
 * model (m->graphs.on becomes −1) and the forward runs eagerly, correct either way. A trainable
 * model ignores it (a trainer graphs its whole step: ts_train_config_t graphs); a CPU engine
 * too. */
void ts_dit_set_graphs(ts_dit_t *m, int on);
/* ts_dit_forward in its two halves, for a caller that records the device work in a graph of its
 * own (a trainer's step, model/trainer.h). _stage checks the arguments as ts_dit_forward does and
 * copies the labels y to the device (host work, outside any graph); _queue then queues the rest
 * for the same x, t and B — the device work alone, no graphs of the model's own — and sets *v as
 * ts_dit_forward. A learned-σ model's _queue also splits its output by ts_tensor_copy, which
 * no capture can record (such a model cannot train: a trainer never graphs one). */
int ts_dit_forward_stage(ts_dit_t *m, const ts_tensor_t *x, const ts_tensor_t *t, const int32_t *y,
                         int B);
int ts_dit_forward_queue(ts_dit_t *m, const ts_tensor_t *x, const ts_tensor_t *t, int B,
                         ts_tensor_t *v);
/* Backward of the last forward (same B) given dv (B, C, H, W) = dLoss/dv; accumulates into
 * m->grads. Requires trainable. */
int ts_dit_backward(ts_dit_t *m, const ts_tensor_t *dv, int B);

/* The trunk alone — patch embedding, conditioning c = t_emb + y_emb and the blocks — for a head
 * of another kind on top (model/classifier.h). Arguments as ts_dit_forward; *x_final is the last
 * block's output m->acts.x_final sliced to B samples, (B, T, h) (a view; valid until the next
 * forward). ts_dit_forward is this followed by the final layer. */
int ts_dit_forward_trunk(ts_dit_t *m, const ts_tensor_t *x, const ts_tensor_t *t, const int32_t *y,
                         int B, ts_tensor_t *x_final);
/* Backward of the last trunk forward (same B) from dx_final (B, T, h) = dLoss/dx_final, which
 * must not be m's own scratch (m->gacts.dx); accumulates into m->grads (the final layer's
 * gradients are left as they are). Requires trainable. */
int ts_dit_backward_trunk(ts_dit_t *m, const ts_tensor_t *dx_final, int B);
int ts_dit_zero_grad(ts_dit_t *m);

/* Sets the precision of the matrix products (kernels/engine.h ts_precision_t). bf16: every
 * linear weight is converted to bf16 now (ts_dit_refresh_lp after the parameters change), and
 * the forward's linears and attention products run in bf16 with fp32 accumulation; the biases,
 * LayerNorm, softmax, modulation and residual stream stay fp32. In a trainable model the
 * backward's linear products run in bf16 too (dout, the saved input and the bf16 weight; fp32
 * accumulation into the fp32 gradients), while the parameters — the masters the optimiser
 * updates and checkpoints hold — stay fp32 (bf16 training: model/trainer.c refreshes the copy after
 * every step). f32 (the default) drops the copy; its forward and backward are bit-identical to a
 * model that never left f32. TS_ENOTSUP, with the reason in why (may be NULL), where the engine
 * cannot run bf16. f16: as bf16 in IEEE half precision (f16 training: the trainer scales the
 * loss, model/trainer.h); its attention is the composed one unless asked (on a GPU: the f16
 * flash attention). Either way the attention goes back to its default for the precision (bf16: composed, f32: the engine's default; see ts_attn_impl_t): call
 * ts_dit_set_attention after this, not before. A trainable model's 16-bit rooms (atty16,
 * dout16) are made when it leaves f32 and freed when it comes back, and a change of attention
 * lays the activations out again: what a forward kept is gone, so a backward needs a forward
 * after this (TS_ENOMEM where the new layout cannot be had: the model keeps the one it had). */
int ts_dit_set_precision(ts_dit_t *m, ts_precision_t p, char *why, size_t why_len);
/* 16-bit activations (on: 1, off: 0; a new model on a GPU engine starts on, on a CPU off). When
 * on, a model at bf16 or f16 has the producers of its linears' inputs — the LayerNorm +
 * modulate before qkv, fc1 and the final linear, GELU before fc2 — write them rounded to 16 bits
 * (in the fp32 buffers' room), and the linears take them as they are, forward and, in a
 * trainable model, backward (the weight's gradient reads the same 16-bit input): on a GPU no
 * rounding kernel runs for them in either direction. The bits are the same either way (the
 * linear rounded the same values and read them for nothing else); the residual stream,
 * LayerNorm's statistics, the attention's input and output, GELU's input (its backward reads it)
 * and every sum stay fp32. A model at f32 ignores it. */
void ts_dit_set_lp_activations(ts_dit_t *m, int on);
/* At bf16 or f16, converts the parameters into the 16-bit copy again (O(parameters)), after they
 * changed: an optimiser step, a load. TS_OK and nothing at f32. */
int ts_dit_refresh_lp(ts_dit_t *m);

/* Switches m's attention to a (see ts_attn_impl_t). The activations are laid out again (a
 * backward must follow a forward made with the same attention); the per-sample bound on them is
 * the composed layout's, so either fits any model that was built. TS_ENOTSUP for fused at bf16
 * or f16 where the fused 16-bit op cannot run (ts_attention_fused_lp_check: bf16 on a CPU
 * without AVX-512 BF16 or a GPU below sm_80, f16 on a CPU or a GPU below sm_75; on a GPU also
 * heads not a multiple of 8), or on a GPU with heads wider than TS_CUDA_FUSED_HD_MAX or a
 * max_batch over TS_CUDA_FUSED_MAX_BATCH; TS_ENOMEM leaves m as it was. */
int ts_dit_set_attention(ts_dit_t *m, ts_attn_impl_t a);
/* The attention ts_dit_set_precision gives m at its present precision: where it was measured
 * faster in docs/benchmarks.md (a CPU's), the composed one on a GPU. */
ts_attn_impl_t ts_dit_default_attention(const ts_dit_t *m);
const char *ts_attn_name(ts_attn_impl_t a); /* "fused" or "composed" */

/* Choosing the attention by measuring it on the machine that runs the model (model/dit_tune.c;
 * docs/architecture.md, "Choosing the attention"). ts_dit_tune times reps forwards of an
 * inference model at batch (≤ max_batch) with each attention the model can take, on fixed
 * inputs (the median, after one warm-up forward), checks the fused one's output against the
 * composed one's (relative RMS difference: at most 1e-3 at f32, 1e-1 at bf16 or f16 — their
 * roundings differ; a kernel that computes something else is off by order 1) and leaves m on the
 * faster of those that pass — by more than 3 %, otherwise on ts_dit_default_attention. On a GPU
 * it then measures the forward through CUDA graphs (ts_dit_set_graphs) and keeps them on only
 * where their output is bit for bit the eager one's and they are more than 3 % faster (before
 * that, at bf16 or f16, cuBLASLt's epilogues likewise: see the fields). The
 * choice is the model's for every batch (a sample's bits never depend on its batch); the graphs
 * are measured at this batch only (another batch gets its own graph). A fused attention that
 * fails to run is not taken (the note says why), after which a composed forward must still run.
 * TS_EINVAL for a trainable model; another error (a composed forward's, TS_ENOMEM) is returned
 * with m back on the attention and graphs it had (and its engine on its epilogues). Each forward at the model's velocity only
 * (a learned σ is not compared). */
#define TS_DIT_TUNE_MAX_REPS 64
typedef struct ts_dit_tune {
    int batch, reps;
    double ms[2];      /* median ms per forward, by ts_attn_impl_t; 0: not measured (cannot run) */
    double fused_diff; /* the fused output's relative RMS difference to the composed one */
    /* a 16-bit model on a GPU: cuBLASLt's epilogues — the linears' bias and, with 16-bit
     * activations, fc1's bias and GELU — (ts_cuda_set_epilogues, the engine's setting: off
     * while the attentions are timed), measured with the chosen attention and kept where its
     * output is within 1e-2 relative RMS of the two-kernel one's and it is more than 3 % faster.
     * Several models on one engine: each tune decides it anew, the last one's decision stands */
    int epilogues_measured, epilogues;
    double epilogues_diff, ms_epilogues;
    int graphs_measured;
    int graphs_same;     /* their output equals the eager forward's, bit for bit */
    double ms_graphs;    /* median ms per forward through graphs, with the chosen attention */
    int graphs;          /* left on */
    ts_attn_impl_t attn; /* the attention m was left on */
    char note[384];      /* the choice and why, in words (for a log) */
} ts_dit_tune_t;
int ts_dit_tune(ts_dit_t *m, int batch, int reps, ts_dit_tune_t *out);
/* ts_dit_tune's rules, on its measurements: the attention (def where neither is faster by more
 * than 3 %, composed where the fused one was not measured or failed its check), whether the
 * epilogues stay on with attention a, and whether the graphs do (against the eager forward
 * with the epilogues where they stay on). */
ts_attn_impl_t ts_dit_tune_pick(const ts_dit_tune_t *t, ts_precision_t p, ts_attn_impl_t def);
int ts_dit_tune_epilogues_keep(const ts_dit_tune_t *t, ts_attn_impl_t a);
int ts_dit_tune_graphs_keep(const ts_dit_tune_t *t, ts_attn_impl_t a);

/* How a served model gets its attention (tesserad: [compute] attention): auto measures it
 * (ts_dit_tune at batch) on a GPU and keeps the default on a CPU, where it was measured in
 * benchmarks; measure measures it anywhere; fused and composed ask for one (a model that cannot
 * take it keeps the default, and the note says so). A measurement that fails leaves the model on
 * its default with the reason in the note: TS_OK under auto (the node serves as it would have
 * without measuring), the error under measure unless it is TS_ENOMEM. note gets one line for
 * the log. */
typedef enum {
    TS_ATTN_CHOOSE_AUTO,
    TS_ATTN_CHOOSE_MEASURE,
    TS_ATTN_CHOOSE_FUSED,
    TS_ATTN_CHOOSE_COMPOSED
} ts_attn_choice_t;
int ts_attn_choice_parse(const char *s, ts_attn_choice_t *out);
const char *ts_attn_choice_name(ts_attn_choice_t c);
int ts_dit_choose_attention(ts_dit_t *m, ts_attn_choice_t c, int batch, char *note,
                            size_t note_len);

/* The device memory a model of cfg takes, computed from the config alone (nothing is allocated;
 * the activations are laid out in the arena's measuring mode, so the figures are the bytes
 * ts_dit_create asks for). The fixed costs do not depend on the batch; a batch of B adds B times
 * the per-sample figure. The 16-bit products' operand buffer (a GPU's rounded operands, the
 * CPU's emulation scratch) is an upper estimate from the largest product's operands; a CUDA
 * engine's own context and cuBLAS workspaces are not counted (ts_engine_memory_usable leaves them
 * out of what it offers). */
typedef struct ts_dit_memory {
    uint64_t params;           /* the fp32 parameter slab */
    uint64_t params_lp;        /* its bf16 or f16 copy (0 at f32) */
    uint64_t grads;            /* training: the gradient slab */
    uint64_t adamw;            /* training: AdamW's two moments */
    uint64_t ema;              /* training: the EMA copy */
    uint64_t infer_fixed;      /* inference: positional table and activations' fixed part */
    uint64_t infer_per_sample; /* inference: activations (one block's, shared), staging */
    uint64_t train_fixed;      /* training: as infer_fixed for a trainable model */
    uint64_t train_per_sample; /* training: every block's activations, the backward's scratch
                                * and the trainer's images */
    int can_train;             /* 0: the training layout passes the bounds above (a model that
                                * may be served, not trained): train_* are 0 */
} ts_dit_memory_t;

/* *out for cfg at precision p with attention a. TS_ERANGE for a config whose parameters or
 * inference activations pass the bounds above (ts_dit_create refuses it too); one whose training
 * layout alone passes them gets can_train = 0. */

int ts_dit_memory(const ts_dit_config_t *cfg, ts_precision_t p, ts_attn_impl_t a,
                  ts_dit_memory_t *out);
/* Bytes of a model serving batches of up to batch samples (training = 0), or of a model and its
 * trainer at that training batch (training = 1; UINT64_MAX when !can_train). */
uint64_t ts_dit_memory_total(const ts_dit_memory_t *mem, int training, int batch);
/* The largest batch (1 … cap) whose ts_dit_memory_total fits in budget bytes; 0 when not even
 * one sample fits. */
int ts_dit_memory_max_batch(const ts_dit_memory_t *mem, int training, uint64_t budget, int cap);

/* Multiply-adds (×2 = FLOPs) of one forward pass per sample, counting the GEMMs only. */
double ts_dit_flops_per_sample(const ts_dit_config_t *cfg);

#ifdef __cplusplus
}
#endif

#endif
