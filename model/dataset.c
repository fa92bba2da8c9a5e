/* dataset.c — a data set in memory: its subsets and its release (model/dataset.h). */
#include "model/dataset.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

void ts_dataset_free(ts_dataset_t *ds) {
    if (!ds)
        return;
    free(ds->images);
    free(ds->labels);
    memset(ds, 0, sizeof *ds);
}

int ts_dataset_subset(const ts_dataset_t *src, const int32_t *idx, int n, ts_dataset_t *dst) {
    if (!dst)
        return TS_EINVAL;
    if (dst == src) /* zeroing dst would destroy src */
        return TS_EINVAL;
    memset(dst, 0, sizeof *dst);
    if (!src || n < 0 || (n > 0 && !idx) || src->n < 0 || src->channels < 1 || src->height < 1 ||
        src->width < 1 || (src->n > 0 && (!src->images || !src->labels)))
        return TS_EINVAL;
    for (int i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= src->n)
            return TS_ERANGE;

    size_t item = (size_t)src->channels * (size_t)src->height * (size_t)src->width;
    if (n > 0) {
        dst->images = malloc((size_t)n * item * sizeof *dst->images);
        dst->labels = malloc((size_t)n * sizeof *dst->labels);
        if (!dst->images || !dst->labels) {
            ts_dataset_free(dst);
            return TS_ENOMEM;
        }
    }
    for (int i = 0; i < n; i++) {
        memcpy(dst->images + (size_t)i * item, src->images + (size_t)idx[i] * item,
               item * sizeof *dst->images);
        dst->labels[i] = src->labels[idx[i]];
    }
    dst->n = n;
    dst->channels = src->channels;
    dst->height = src->height;
    dst->width = src->width;
    dst->num_classes = src->num_classes;
    return TS_OK;
}
