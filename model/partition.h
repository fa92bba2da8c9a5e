/*
 * partition.h — the data partition of a decentralized diffusion model (architecture.md §2, §10):
 * the artifact that defines the clusters, made with the PCA of model/pca.h and the k-means++ of
 * model/kmeans.h (both included here).
 *
 * A partition embeds every training image with PCA (the top `dims` principal directions of the
 * pixels, 64 by default), clusters the embeddings into K clusters with k-means++ and Lloyd
 * iterations, and stores the basis, the mean, the K centroids (in the embedding space) and the
 * cluster of every image in one safetensors file. The BLAKE2b-256 of that file's bytes, in hex, is
 * the partition_id that experts, routers and adverts name. Expert k is trained on the images
 * whose assignment is k; at generation time the centroid policy embeds its running estimate x̂0
 * with the same basis and mean and measures distances to the centroids (ts_partition_embed,
 * ts_partition_nearest).
 *
 * Numerics, threads and randomness: model/pca.h and model/kmeans.h. The embedding of an image is
 * the same bits whether it is projected alone or in a batch, at training time or at routing
 * time; the same data and seed give the same partition, byte for byte, for any thread count.
 *
 * What it is not: a general clustering library (squared Euclidean distance only), nor the
 * command that prints the class mix and writes the shard files (client/cmd_partition.c).
 *
 * `err`/`errlen`: where a function takes them, a failure writes one NUL-terminated sentence there
 * (err may be NULL or errlen 0 to not get one).
 */
#ifndef TS_PARTITION_H
#define TS_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "model/fmnist.h"
#include "model/kmeans.h"
#include "model/pca.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_PARTITION_FORMAT "tessera-partition/1"
#define TS_PARTITION_DEFAULT_DIMS 64
#define TS_PARTITION_DEFAULT_RESTARTS 8
#define TS_PARTITION_DEFAULT_MAX_ITER 300
#define TS_PARTITION_ID_HEX 65 /* 64 hex digits + NUL */

/* ---- the partition artifact -------------------------------------------------------------- */

typedef struct ts_partition {
    int K, k, D;         /* clusters, embedding dims, input dims */
    int64_t n;           /* images partitioned */
    float *basis;        /* (k, D) */
    float *mean;         /* (D) */
    float *centroids;    /* (K, k), in the embedding space */
    int32_t *assignment; /* (n), each in [0, K) */
    int32_t *sizes;      /* (K), the histogram of assignment, each ≥ 1 */
    uint64_t seed;
    int restarts, hierarchical; /* hierarchical = FINE, or 0 */
    double inertia, explained;
    char embed[32];    /* "pca64" */
    char dataset[64];  /* TS_PARTITION_FMNIST, or a latent data set (ts_partition_latents) */
    char strategy[32]; /* how the clusters were made: "kmeans" (on the PCA embedding),
                                     or what opts.strategy said: "label", "random", "features" */
    char id[TS_PARTITION_ID_HEX]; /* partition_id: BLAKE2b-256 of the file, hex; "" until saved */
} ts_partition_t;

typedef struct ts_partition_opts {
    int experts;      /* K */
    int dims;         /* PCA dims (TS_PARTITION_DEFAULT_DIMS when 0) */
    int hierarchical; /* FINE fine centroids, or 0 for plain k-means */
    int restarts;     /* TS_PARTITION_DEFAULT_RESTARTS when 0 */
    int max_iter;     /* TS_PARTITION_DEFAULT_MAX_ITER when 0 */
    uint64_t seed;
    int threads;         /* 0 = one per online core */
    const char *dataset; /* recorded in the metadata; NULL = TS_PARTITION_FMNIST */
    /* Other strategies (all optional). assign (n, each in [0, K), every cluster used): the
     * clusters are given, no k-means runs. space (n, space_dims): k-means runs on these
     * features instead of the PCA embedding. Either way the centroids are the clusters' means
     * in the PCA embedding (what the centroid policy measures against) and the inertia is
     * measured there. strategy names it in the artifact ("label", "random", "features"; NULL or
     * "kmeans" for the default, which writes no strategy key, so default partitions keep their
     * bytes and ids). */
    const int32_t *assign;
    const float *space;
    int space_dims;
    const char *strategy;
    /* One line of progress ("PCA: ...", "k-means restart 3/8: ..."), without a newline. */
    void (*progress)(void *ctx, const char *line);
    void *ctx;
} ts_partition_opts_t;

/* Builds a partition of x (n, D): PCA to opts->dims, then k-means (or the hierarchical variant)
 * in the embedding space. On success *p owns its buffers (ts_partition_free) and p->id is ""
 * until ts_partition_save. Errors: those of ts_pca_fit and ts_kmeans_fit; TS_EINVAL names the
 * bad option (experts < 1 or > n, dims > D, ...). */
int ts_partition_fit(const float *x, int64_t n, int D, const ts_partition_opts_t *opts,
                     ts_partition_t *p, char *err, size_t errlen);

/* Writes p as safetensors (basis, mean, centroids F32; assignment, sizes I32; metadata format,
 * embed, experts, dims, seed, restarts, inertia, explained_variance, dataset, n, hierarchical),
 * atomically, then sets p->id to the BLAKE2b-256 of the file written. The file bytes depend only
 * on p's contents. Errors: TS_EINVAL, TS_EIO, TS_ENOMEM. */
int ts_partition_save(ts_partition_t *p, const char *path, char *err, size_t errlen);

/* Reads and strictly validates a partition file: the format, exactly the five tensors with their
 * dtypes and consistent shapes (metadata experts and n agree with them), finite values, every
 * assignment in [0, K), sizes equal to the histogram of assignment, no empty cluster. Sets p->id
 * from the file's bytes. On failure *p is zeroed. Errors: TS_EINVAL, TS_EIO, TS_ECORRUPT (with
 * the reason), TS_ENOMEM. */
int ts_partition_load(const char *path, ts_partition_t *p, char *err, size_t errlen);
void ts_partition_free(ts_partition_t *p);

/* The images of cluster k: their indices in increasing order — exactly the lines of the
 * shard-<k>.txt that `tessera partition` writes. *idx (malloc'd, the caller frees it) holds *n
 * ≥ 1 indices. Errors: TS_EINVAL (k outside [0, K)), TS_ENOMEM. */
int ts_partition_members(const ts_partition_t *p, int k, int32_t **idx, int *n);

/* The data set a partition of Fashion-MNIST names. */
#define TS_PARTITION_FMNIST "fashion-mnist-train"

/* The images of cluster `cluster` of the partition file at path, kept from the whole data set
 * *ds it was made from (replaced by them, in ts_partition_members' order): dataset is that data
 * set's name as the partition records it (TS_PARTITION_FMNIST, or ts_partition_latents'), where
 * names it in messages. partition_id (may be NULL) receives the partition's id. Errors: those of
 * ts_partition_load; TS_EINVAL (cluster ≥ K, or a data set of another name or size than the
 * partition's), TS_ENOMEM; *ds is left whole on failure. */
int ts_partition_take_cluster(const char *path, int cluster, ts_dataset_t *ds, const char *dataset,
                              const char *where, char partition_id[TS_PARTITION_ID_HEX], char *err,
                              size_t errlen);

/* The training set of expert `cluster`, as `tessera train --partition` and tesserad's trainer
 * read it: the Fashion-MNIST train split from fmnist_dir (NULL = TS_FMNIST_DEFAULT_DIR) and
 * ts_partition_take_cluster. On success *out owns its buffers (ts_dataset_free); on failure it is
 * zeroed and err names the file or the cluster at fault. */
int ts_partition_load_cluster(const char *path, int cluster, const char *fmnist_dir,
                              ts_dataset_t *out, char partition_id[TS_PARTITION_ID_HEX], char *err,
                              size_t errlen);

/* A latent data set (model/latents.h) to partition or to take a cluster of, and its name for
 * the partition: "tessera-latents:" and the first 32 hex digits of the file's BLAKE2b-256;
 * space (may be NULL) receives its latent space (65 bytes; "" when the file names none). */
int ts_partition_latents(const char *path, ts_dataset_t *ds, char dataset[64], char *space,
                         char *err, size_t errlen);

/* out (B, k) = φ(x): the PCA embedding of x (B, D) with p's basis and mean; single-threaded,
 * row by row (the same bits as at partition time). Errors: TS_EINVAL, TS_ENOMEM. */
int ts_partition_embed(const ts_partition_t *p, const float *x, int64_t B, float *out);

/* For embeddings e (B, k): nearest (B) gets the index of the closest centroid (lowest index on
 * a tie) and, when d2 is not NULL, d2 (B, K) the squared distances to every centroid (computed
 * in double). Either output may be NULL. Errors: TS_EINVAL. */
int ts_partition_nearest(const ts_partition_t *p, const float *e, int64_t B, int32_t *nearest,
                         float *d2);

#ifdef __cplusplus
}
#endif

#endif
