/*
 * dataset.h — a data set in memory: n images of one shape with their labels, as the readers of
 * model/fmnist.h (Fashion-MNIST, any IDX pair) and model/latents.h load it; a subset of one, and
 * its release.
 */
#ifndef TS_DATASET_H
#define TS_DATASET_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_dataset {
    int n, channels, height, width, num_classes;
    float *images; /* (n, channels, height, width), pixel p stored as p / 127.5 − 1 in [−1, 1] */
    int32_t *labels; /* (n), each in [0, num_classes) */
} ts_dataset_t;

/* Copies the items src[idx[0]], ..., src[idx[n−1]] (in that order; repeats allowed) into a new
 * dataset *dst with src's shape and num_classes. n = 0 gives an empty dataset with NULL buffers.
 * dst must not be src. On success *dst owns its buffers (ts_dataset_free); on failure it is
 * zeroed. Errors: TS_EINVAL (NULL, n < 0, src malformed), TS_ERANGE (an index outside
 * [0, src->n)), TS_ENOMEM. */
int ts_dataset_subset(const ts_dataset_t *src, const int32_t *idx, int n, ts_dataset_t *dst);

/* Releases the buffers of *ds and zeroes it. NULL-safe; safe on a zeroed dataset. */
void ts_dataset_free(ts_dataset_t *ds);

#ifdef __cplusplus
}
#endif

#endif
