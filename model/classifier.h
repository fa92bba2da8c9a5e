/*
 * classifier.h — a DiT-trunk classifier: images (and optionally a time t) to class logits.
 *
 * Two uses, one model: the evaluation classifier (clean Fashion-MNIST images → the 10 labels;
 * its penultimate features are the space the Fréchet distance is measured in) and the router of
 * the learned policy (a noisy x_t and its t → the K clusters of a partition, DDM's router).
 * The trunk is the DiT's own (patch embed + positions, adaLN-Zero blocks conditioned on the
 * timestep embedding, and for a label-aware router on the class label's embedding too); the head is a final LayerNorm, a mean over tokens and a linear layer.
 * The features are the pooled vector before the linear head.
 *
 * Files are safetensors with the trunk under DiT's names, the head as `head.weight` /
 * `head.bias`, and metadata: the DiT config keys, "format": "tessera-classifier/1",
 * "time_conditioned" ("0" or "1"), "num_outputs", "num_labels" for a label-aware one, and for a
 * router "partition_id".
 */
#ifndef TS_CLASSIFIER_H
#define TS_CLASSIFIER_H

#include "kernels/ops.h"
#include "model/dit.h"
#include "model/fmnist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_classifier ts_classifier_t; /* opaque */

/* Loads a classifier or router from a file for engine e, batches up to max_batch. Free with
 * ts_classifier_free. */
int ts_classifier_open(ts_classifier_t **out, const char *path, ts_engine_t *e, int max_batch,
                       char *err, size_t errlen);
void ts_classifier_free(ts_classifier_t *c);

int ts_classifier_feature_dim(const ts_classifier_t *c); /* D of the features */
int ts_classifier_num_outputs(const ts_classifier_t *c); /* classes or clusters */
int ts_classifier_time_conditioned(const ts_classifier_t *c);
/* The metadata value for key in the file it was loaded from, or NULL ("partition_id", ...). */
const char *ts_classifier_meta(const ts_classifier_t *c, const char *key);

/* Runs B ≤ max_batch samples: x (B, C, H, W) F32 on the engine's device, t (B) F32 on the
 * device (ignored, may be NULL, when not time-conditioned). Writes features (B, D) and logits
 * (B, K) into host arrays; either may be NULL. */
int ts_classifier_run(ts_classifier_t *c, const ts_tensor_t *x, const ts_tensor_t *t, int B,
                      float *features, float *logits);

/* Label-aware models (a router that also reads the class asked for: p(k | x_t, y), trained with
 * label dropout so that the null label gives p(k | x_t)). Their trunk has num_classes = L real
 * labels and the null row L; a model without labels has L = 0 and always runs with its null row.
 * The file records "num_labels" when L > 0. */
#define TS_CLASSIFIER_MAX_LABELS 100000
int ts_classifier_num_labels(const ts_classifier_t *c); /* L, or 0 */
/* ts_classifier_run conditioned on labels (host, B values in [0, L], L = none; NULL = none);
 * ignored by a model with L = 0. TS_ERANGE for a label out of range. */
int ts_classifier_run_labels(ts_classifier_t *c, const ts_tensor_t *x, const ts_tensor_t *t,
                             const int32_t *labels, int B, float *features, float *logits);
/* Sets the labels the next forward (and ts_classifier_loss_backward) is conditioned on, as
 * ts_classifier_run_labels does; ts_classifier_run resets them to none. */
int ts_classifier_condition(ts_classifier_t *c, const int32_t *labels, int B);

/* ---- building, saving, training (added with the train-classifier and train-router verbs) ---- */
/* The trunk is a ts_dit_t made with num_classes = 1 whose every sample carries label 1, the null
 * row: the config check wants a label table, and a constant row is simply one learned vector
 * added to the conditioning c. A classifier that is not time-conditioned always runs at t = 0,
 * so c is the same for every input and the adaLN modulations act as learned per-block constants.
 * The final layer of the DiT is not used and not saved. */

/* A new classifier for the trunk config (its num_classes is ignored) with num_outputs classes,
 * activations for max_batch samples, gradients when trainable; parameters are zero until
 * ts_classifier_init_weights. Free with ts_classifier_free. */
int ts_classifier_create(ts_classifier_t **out, const ts_dit_config_t *trunk, int num_outputs,
                         int time_conditioned, ts_engine_t *e, int max_batch, int trainable);
/* The same with num_labels real labels (0 = none, as ts_classifier_create). */
int ts_classifier_create_labelled(ts_classifier_t **out, const ts_dit_config_t *trunk,
                                  int num_outputs, int num_labels, int time_conditioned,
                                  ts_engine_t *e, int max_batch, int trainable);
/* DiT's initialisation for the trunk (ts_dit_init_weights, stream seed) and Xavier-uniform for
 * the head's weight (the stretch of the same stream after the trunk's slab), zero head bias. */
int ts_classifier_init_weights(ts_classifier_t *c, uint64_t seed);
/* Sets (or replaces) a metadata value written by ts_classifier_save ("partition_id", ...). The
 * format, config, num_outputs, time_conditioned and num_labels keys are the model's own and are
 * refused. */
int ts_classifier_set_meta(ts_classifier_t *c, const char *key, const char *value);
/* Writes the trunk (DiT names, without final_layer.*), head.weight (K, D), head.bias (K) as F32
 * and the metadata, atomically. */
int ts_classifier_save(const ts_classifier_t *c, const char *path, char *err, size_t errlen);

/* One batch's mean cross-entropy against labels (host, B values in [0, K)), conditioned on the
 * labels of the last ts_classifier_condition (none after ts_classifier_run), with the gradients
 * of every parameter cleared and then accumulated (requires trainable). x, t as in
 * ts_classifier_run. The training step and the tests' finite differences both use it. */
int ts_classifier_loss_backward(ts_classifier_t *c, const ts_tensor_t *x, const ts_tensor_t *t,
                                const int32_t *labels, int B, float *loss);
/* Views of the head's parameters, weight (K, D) and bias (K), and of their gradients (empty
 * tensors unless trainable); any pointer may be NULL. */
int ts_classifier_head(ts_classifier_t *c, ts_tensor_t *w, ts_tensor_t *b, ts_tensor_t *dw,
                       ts_tensor_t *db);

/* What a router learns (train-router --objective):
 *   CLUSTER    the cluster of the image in the partition (DDM's router): cross-entropy against
 *              the assignment.
 *   ALIGNMENT  which frozen expert denoises this (x_t, t, y) best: cross-entropy against the soft
 *              target q = softmax(−ℓ/τ), ℓ_k = expert k's flow-matching loss on the sample.
 *   MIXTURE    the weights w = softmax(logits) that make the mixture Σ_k w_k v_k closest to the
 *              flow target: the loss is ‖Σ_k w_k v_k − (ε − x0)‖² (mean over pixels) through the
 *              frozen experts, i.e. wᵀ G w with G the Gram matrix of the experts' residuals.
 * Both expert objectives take the experts' residuals from cfg.residuals (model/ensemble.c has
 * one for local experts); the router's parameters get the only gradients. */
#define TS_ROUTER_MAX_EXPERTS 256 /* K of the expert objectives at most */

typedef enum {
    TS_ROUTER_CLUSTER = 0,
    TS_ROUTER_ALIGNMENT = 1,
    TS_ROUTER_MIXTURE = 2,
} ts_router_objective_t;

/* For B samples x_t (device, (B, C, H, W)) at times t (device, (B)) with the flow target vel =
 * ε − x0 (device) and class labels (host, B): G (host, (B, K, K)) with G[b][j][k] = the mean
 * over pixels of r_j·r_k, r_k = v_k(x_t, t, y) − vel the residual of expert k (so G[b][k][k] is
 * expert k's loss on sample b). Returns TS_OK or an error, which stops the step. */
typedef int (*ts_router_residuals_fn)(void *ctx, const ts_tensor_t *xt, const ts_tensor_t *t,
                                      const ts_tensor_t *vel, const int32_t *labels, int B,
                                      double *G);

/* The loss and the gradient with respect to the logits of the expert objectives, for B samples
 * of K experts: logits (B, K), G (B, K, K) as above; dlogits (B, K) receives d(mean loss)/d
 * logits. alignment: mean over b of −Σ_k q_k log p_k with q = softmax(−diag(G_b)/tau); mixture:
 * mean over b of wᵀ G_b w, w = softmax(logits_b). Computed in double. Pure: the tests check it
 * against finite differences. */
double ts_router_objective_loss(ts_router_objective_t obj, const float *logits, const double *G,
                                int B, int K, float tau, float *dlogits);

typedef struct ts_classifier_train_config {
    int batch;
    float lr;            /* peak learning rate */
    int warmup;          /* steps of linear warm-up from 0 */
    int64_t total_steps; /* > 0: cosine decay to 0 at this step after the warm-up; 0: constant */
    float weight_decay;  /* AdamW's, decoupled */
    float beta1, beta2, eps;
    float grad_clip; /* max global gradient norm; 0 = no clipping */
    int augment;     /* clean images only: random horizontal flip and a shift of up to
                             ±shift pixels in each direction, the border filled with −1 */
    int shift;
    uint64_t seed;
    /* a router's objective (time-conditioned models only); ALIGNMENT and MIXTURE need residuals */
    ts_router_objective_t objective;
    float align_tau; /* ALIGNMENT's temperature τ (> 0) */
    ts_router_residuals_fn residuals;
    void *residuals_ctx;
    /* a label-aware model (num_labels > 0) is conditioned on each image's label, replaced by the
     * null label with this probability (the data must carry labels) */
    float label_dropout;
} ts_classifier_train_config_t;

/* batch 64, lr 1e-3, warmup 200, constant, wd 0.05, betas (0.9, 0.999), eps 1e-8, clip 1, no
 * augmentation (shift 2 when it is turned on), seed 0 */
void ts_classifier_train_config_default(ts_classifier_train_config_t *c);
/* The learning rate used at step s (0-based). */
float ts_classifier_lr(const ts_classifier_train_config_t *c, int64_t s);

/* A trainer: AdamW moments for every parameter and per-step buffers. Every random draw is a pure
 * function of (seed, step), as in model/trainer.h: the data order is a per-epoch permutation, and
 * for a time-conditioned model (a router) each sample is x_t = (1 − t)·x0 + t·ε with t ~ U(0, 1)
 * and ε ~ N(0, 1) (ts_flow_interp, the flow-matching schedule); otherwise the clean image at
 * t = 0, augmented when cfg->augment (a router is never augmented: a flip or a shift moves an
 * image to another cluster). Augmentation draws are pure functions of (seed, sample) too. targets (data->n, each in [0, K)) is the class of each image: the
 * labels for the evaluation classifier, the partition's assignment for a router. c, data and
 * targets are borrowed. Free with ts_classifier_trainer_free. */
typedef struct ts_classifier_trainer ts_classifier_trainer_t;
int ts_classifier_trainer_init(ts_classifier_trainer_t **out, ts_classifier_t *c,
                               const ts_dataset_t *data, const int32_t *targets,
                               const ts_classifier_train_config_t *cfg);
void ts_classifier_trainer_free(ts_classifier_trainer_t *tr);
/* One step; *loss (before the update), *accuracy (of the batch, before the update: for the expert
 * objectives, how often the router's top expert is the expert with the lowest loss) and
 * *grad_norm (before clipping) may be NULL. TS_ENONFINITE leaves the parameters unchanged. */
int ts_classifier_trainer_step(ts_classifier_trainer_t *tr, float *loss, float *accuracy,
                               float *grad_norm);
int64_t ts_classifier_trainer_steps_done(const ts_classifier_trainer_t *tr);

#ifdef __cplusplus
}
#endif

#endif
