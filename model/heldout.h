/*
 * heldout.h — an expert's flow-matching loss on held-out images at fixed (t, ε): what `tessera
 * loss` reports per cluster, and what a training job measures on its own cluster and advertises
 * (how trained an expert is, in the network's units rather than in steps).
 *
 * The images are the test split's, assigned to a partition's clusters as the training images
 * were (nearest centroid in its PCA space: ts_heldout_assign); a cluster's held-out set is its
 * first `per` test images in test order. For image i (its index in the test split) and time
 * index j of a grid of T times, ε is the Philox normal stream ts_stream_key(seed, 0) at offset
 * (i · T + j) · C·H·W, so every model sees the same x_t = (1 − t)·x0 + t·ε and target ε − x0;
 * the loss at t_j is the mean over pixels and images of (v(x_t, t_j, y) − target)², y the
 * image's true label (the conditional branch samplers guide with), summed in double in image and
 * pixel order, so the value does not depend on how the images are cut into batches. The result
 * is a function of the weights, the images, the grid and the seed (and, as every forward here,
 * of the build and thread count): a resumed training run measures what an uninterrupted one did.
 *
 * The default grid is the ten midpoints 0.05, 0.15, …, 0.95 (TS_HELDOUT_GRID), seed 0.
 *
 * `err`/`errlen`: where a function takes them, a failure writes one NUL-terminated sentence there.
 */
#ifndef TS_HELDOUT_H
#define TS_HELDOUT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/engine.h"
#include "model/dit.h"
#include "model/fmnist.h"
#include "model/partition.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_HELDOUT_MAX_T 32
#define TS_HELDOUT_CHUNK 64 /* images per forward (fewer when the model's max_batch is less) */
#define TS_HELDOUT_GRID "0.05,0.15,0.25,0.35,0.45,0.55,0.65,0.75,0.85,0.95"
#define TS_HELDOUT_PER 64 /* held-out images of its cluster a training job measures on */

/* The buffers of one measurement: a grid, a noise stream and the images' split (borrowed). */
typedef struct ts_heldout {
    ts_engine_t *eng;         /* borrowed */
    const ts_dataset_t *data; /* borrowed: the test split */
    float t[TS_HELDOUT_MAX_T];
    int T;
    uint64_t key;
    int64_t chw;
    ts_tensor_t x0, eps, xt, target, tt; /* (CHUNK, C, H, W) ×4, (CHUNK) on the engine */
    float *th;                           /* (CHUNK) host staging of t */
} ts_heldout_t;

/* Parses "t,t,…" (1 to TS_HELDOUT_MAX_T times in [0, 1]) into t and *T. Errors: TS_EINVAL. */
int ts_heldout_parse_grid(const char *s, float *t, int *T);

/* Buffers for images shaped as data's, on engine e, the grid t[0..T) and noise seed. Errors:
 * TS_EINVAL, TS_ENOMEM. Free with ts_heldout_free (also after a failure). */
int ts_heldout_init(ts_heldout_t *h, ts_engine_t *e, const ts_dataset_t *data, const float *t,
                    int T, uint64_t seed, char *err, size_t errlen);
void ts_heldout_free(ts_heldout_t *h);

/* The loss of model m on the images idx[0..n) of h->data (n ≥ 1): by_t[j] (T, may be NULL) at
 * each time, *mean their mean over the grid. m must make images of the data's shape. Errors:
 * TS_EINVAL, those of the forward. */
int ts_heldout_loss(ts_heldout_t *h, ts_dit_t *m, const int32_t *idx, int n, double *by_t,
                    double *mean);

/* cluster (data->n) = the cluster of partition p each image of data falls in (nearest centroid
 * of its embedding). Errors: TS_EINVAL (images of another size than the partition's), TS_ENOMEM. */
int ts_heldout_assign(const ts_partition_t *p, const ts_dataset_t *data, int32_t *cluster);

/* The first `per` images of cluster k in data order, by cluster (from ts_heldout_assign): their
 * indices into idx (room for per), their number into *n (0 when the cluster has none). */
void ts_heldout_pick(const int32_t *cluster, int64_t n_data, int k, int per, int32_t *idx, int *n);

/* ---- a training run's measure of its own cluster --------------------------------------------- */

/* What `tessera train --partition` and tesserad's trainer measure their EMA weights on: the first
 * TS_HELDOUT_PER test images of their cluster, the default grid and seed 0, through a model of
 * their config (f32, forward only) into which the EMA slab is copied. The value is written into
 * the expert's metadata (heldout_loss) and advertised while training, so a client can compare an
 * expert still training with the finished experts of its partition. */
typedef struct ts_heldout_own {
    ts_dataset_t test;
    int32_t idx[TS_HELDOUT_PER];
    int n;
    ts_heldout_t h;
    ts_dit_t eval;
    int has_eval;
} ts_heldout_own_t;

/* Loads the partition at partition_path and the test split of fmnist_dir (NULL = the default),
 * picks cluster's images and builds the model of cfg on e for batches of up to max_batch (≥ 1).
 * Errors: those of the loads (the message names the file), TS_ENOTFOUND (the cluster has no test
 * images), TS_ENOMEM. Free with ts_heldout_own_free (also after a failure). */
int ts_heldout_own_open(ts_heldout_own_t *o, const char *partition_path, int cluster,
                        const char *fmnist_dir, const ts_dit_config_t *cfg, ts_engine_t *e,
                        int max_batch, char *err, size_t errlen);
/* *loss = the held-out loss of the parameters in slab (the model's flat F32 layout, on e). */
int ts_heldout_own_measure(ts_heldout_own_t *o, const ts_tensor_t *slab, double *loss);
void ts_heldout_own_free(ts_heldout_own_t *o);

#ifdef __cplusplus
}
#endif

#endif
