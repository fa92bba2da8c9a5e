/*
 * judge.h — small image networks trained here to be feature spaces for `tessera eval`, beside the
 * evaluation classifier (model/classifier.h, a DiT trunk): a second opinion on every distance.
 * A result that holds in one network's features and not in another's is a fact about that
 * network, not about the samples; routing.md states a claim only where every judge agrees.
 *
 * Two kinds, each a different way of seeing an image:
 *   cnn  a plain convolutional classifier trained on the labels: conv 3×3 (1 → 16) + GELU,
 *        2×2 average pool, conv 3×3 (16 → 32) + GELU, 2×2 average pool, linear (32·7·7 → 128)
 *        + GELU — the features, 128 — and linear (128 → classes), cross-entropy. Another
 *        architecture than the DiT-trunk classifier, and another seed.
 *   ae   an autoencoder trained without labels: linear (pixels → 256) + GELU, linear (256 → 32)
 *        — the bottleneck, the features, 32 — then linear (32 → 256) + GELU, linear (256 →
 *        pixels), mean squared error against the input. What it keeps is what reconstructs the
 *        image, whatever the class.
 * Convolutions are padded by 1 (same size) and run as im2col (rows (b, y, x), columns (ky, kx,
 * c)) and one product with the layer's weight (out channels, 3·3·in channels); activations are
 * kept channels-last. Every product goes through the engine's linear ops (the CPU engine only).
 *
 * Files are safetensors: "l<i>.weight" (out, in) and "l<i>.bias" (out) for the i-th layer with
 * parameters, and metadata "format": "tessera-judge/1", "kind", "height", "width", "channels",
 * "num_classes" (cnn), "seed", "steps", and what training measured ("test_accuracy" for a cnn,
 * "test_mse" for an ae).
 *
 * `err`/`errlen`: where a function takes them, a failure writes one NUL-terminated sentence there.
 */
#ifndef TS_JUDGE_H
#define TS_JUDGE_H

#include <stdint.h>

#include "kernels/ops.h"
#include "model/fmnist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TS_JUDGE_CNN = 0, TS_JUDGE_AE = 1 } ts_judge_kind_t;

typedef struct ts_judge ts_judge_t; /* opaque */

/* A new judge of a kind for images (channels, height, width) — height and width multiples of 4
 * for a cnn — with classes outputs (cnn; ignored by an ae), batches up to max_batch, parameters
 * initialised from seed (uniform ±√(6/(in + out)), zero biases), gradients when trainable. */
int ts_judge_create(ts_judge_t **out, ts_judge_kind_t kind, int channels, int height, int width,
                    int classes, uint64_t seed, ts_engine_t *e, int max_batch, int trainable,
                    char *err, size_t errlen);
/* Loads a judge file (see above) for engine e. */
int ts_judge_open(ts_judge_t **out, const char *path, ts_engine_t *e, int max_batch, char *err,
                  size_t errlen);
void ts_judge_free(ts_judge_t *j);

ts_judge_kind_t ts_judge_kind(const ts_judge_t *j);
const char *ts_judge_kind_name(ts_judge_kind_t kind); /* "cnn", "ae" */
int ts_judge_kind_parse(const char *name, ts_judge_kind_t *kind);
int ts_judge_feature_dim(const ts_judge_t *j);
/* The images it takes: (channels, height, width). */
void ts_judge_shape(const ts_judge_t *j, int *channels, int *height, int *width);
/* A metadata value of the file it was loaded from or saved to ("seed", "test_accuracy", ...). */
const char *ts_judge_meta(const ts_judge_t *j, const char *key);
int ts_judge_set_meta(ts_judge_t *j, const char *key, const char *value);

/* Features (B, D) of B ≤ max_batch images x (B, channels, height, width) in host memory. */
int ts_judge_features(ts_judge_t *j, const float *x, int B, float *features);
/* The outputs (B, classes) of a cnn, or the reconstructions (B, pixels) of an ae; either array
 * may be NULL. */
int ts_judge_run(ts_judge_t *j, const float *x, int B, float *features, float *outputs);

/* The training loss of one batch — a cnn's mean cross-entropy against labels (B values in [0,
 * classes)), an ae's mean squared error against x (labels ignored, may be NULL) — with every
 * gradient cleared and then accumulated (requires trainable). The finite-difference test and
 * the training step both use it. */
int ts_judge_loss_backward(ts_judge_t *j, const float *x, const int32_t *labels, int B,
                           float *loss);
/* The parameter tensors and their gradients, for a test: n of them. */
int ts_judge_num_params(const ts_judge_t *j);
int ts_judge_param(ts_judge_t *j, int i, ts_tensor_t **param, ts_tensor_t **grad);

/* Trains (a cnn: on data's labels, which it must have) on data for steps AdamW steps of batch samples (lr with a linear warm-up over the first
 * 5 % and a cosine decay; shuffled epochs from seed). progress, when not NULL, is called every
 * report steps with the step and the mean loss since the last report. */
typedef void (*ts_judge_progress_fn)(void *ctx, int64_t step, int64_t steps, double loss);
int ts_judge_train(ts_judge_t *j, const ts_dataset_t *data, int64_t steps, int batch, float lr,
                   uint64_t seed, int64_t report, ts_judge_progress_fn progress, void *ctx,
                   char *err, size_t errlen);
/* A cnn's accuracy or an ae's mean squared error on data. */
int ts_judge_score(ts_judge_t *j, const ts_dataset_t *data, double *score, char *err,
                   size_t errlen);

int ts_judge_save(const ts_judge_t *j, const char *path, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
