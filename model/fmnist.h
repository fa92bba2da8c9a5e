/*
 * fmnist.h — the Fashion-MNIST reader (any MNIST-format IDX pair) into a ts_dataset_t
 * (model/dataset.h), and the IDX writer. Shard files are model/shard.h's.
 *
 * Data: the Debian package dataset-fashion-mnist installs the four IDX files under
 * TS_FMNIST_DEFAULT_DIR: {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (60000 train and 10000
 * test images of 28×28 grey pixels, labels 0..9). IDX is big-endian: a 4-byte magic (0x00000803
 * for a 3-d unsigned-byte array of images, 0x00000801 for a 1-d array of labels), one 4-byte size
 * per dimension, then the bytes, row-major.
 *
 * The reader trusts nothing. Magics must match exactly; sizes are bounded (height and width
 * 1..TS_FMNIST_MAX_DIM, n 1..TS_FMNIST_MAX_N); the image and label counts must agree; each file
 * must hold exactly the declared bytes — fewer is "truncated", more is "trailing bytes" — and
 * every label must be < TS_FMNIST_NUM_CLASSES. Every violation is TS_ECORRUPT with a sentence in
 * `err` naming the file. Memory grows with the bytes actually read, so a header that lies about
 * its size fails as truncated instead of asking for gigabytes.
 *
 * What it is not: a data loader with batching or augmentation (the trainer draws batches from a
 * loaded ts_dataset_t), nor a general IDX reader (only 8-bit images and labels).
 *
 * `err`/`errlen`: where a function takes them, a failure writes one NUL-terminated sentence there
 * (err may be NULL or errlen 0 to not get one).
 */
#ifndef TS_FMNIST_H
#define TS_FMNIST_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "model/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_FMNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#define TS_FMNIST_MAGIC_IMAGES 0x00000803u /* unsigned bytes, 3 dims (n, rows, cols) */
#define TS_FMNIST_MAGIC_LABELS 0x00000801u /* unsigned bytes, 1 dim (n) */
#define TS_FMNIST_MAX_DIM 4096             /* bound on rows and cols */
#define TS_FMNIST_MAX_N 100000000          /* bound on the number of items (10^8) */
/* Fixed, not max label + 1: a subset that happens to miss class 9 must still be a 10-class
 * dataset, or class embeddings would change shape between shards. */
#define TS_FMNIST_NUM_CLASSES 10

/* The ten classes' names by label ("T-shirt/top" .. "Ankle boot"; a fact of the data set). */
const char *ts_fmnist_class_name(int label);
/* The label a name means: case, spaces and punctuation ignored ("sneaker", "Ankle boot",
 * "ankle-boot", "t-shirt/top"), or a prefix of one name alone ("t-shirt", "ankle", "pull");
 * −1 when it names none or more than one. */
int ts_fmnist_class_parse(const char *name);
/* The names as --class accepts them, for help and errors. */
#define TS_FMNIST_CLASS_LIST                                                                       \
    "0 t-shirt/top, 1 trouser, 2 pullover, 3 dress, 4 coat, 5 sandal, 6 shirt, 7 sneaker, 8 bag, " \
    "9 ankle boot"

/* Loads one split. dir: the folder holding the IDX files (NULL = TS_FMNIST_DEFAULT_DIR); split:
 * "train" (file prefix "train") or "test" (prefix "t10k"; "t10k" is accepted too), or any other
 * file prefix of letters, digits and "+._-" (e.g. the samples `ts_fmnist_write` saved). For each file
 * <dir>/<prefix>-images-idx3-ubyte.gz is read if it exists, else the uncompressed file of the
 * same name without ".gz". The result has channels = 1 and num_classes = TS_FMNIST_NUM_CLASSES.
 * On success *ds owns malloc'ed images and labels (release with ts_dataset_free); on failure *ds
 * is zeroed. Errors: TS_EINVAL (bad argument or split), TS_EIO (a file is missing or unreadable;
 * the message names the path and the Debian package), TS_ECORRUPT (any format violation),
 * TS_ENOMEM. */
int ts_fmnist_load(const char *dir, const char *split, ts_dataset_t *ds, char *err, size_t errlen);

/* As ts_fmnist_load, from an IDX pair at any two paths (gzip'ed or not), e.g. the samples a run
 * saved and compressed: "best-ensemble.idx.gz" and "best-ensemble-labels.idx.gz". A missing file
 * is TS_ENOTFOUND. */
int ts_fmnist_load_files(const char *images, const char *labels, ts_dataset_t *ds, char *err,
                         size_t errlen);

/* The labels of one split alone (the labels file, checked as ts_fmnist_load checks it), for what
 * needs no pixels (the class prior): *labels malloc'ed, *n of them. Errors as ts_fmnist_load. */
int ts_fmnist_load_labels(const char *dir, const char *split, int32_t **labels, int *n, char *err,
                          size_t errlen);

/* Writes n 8-bit images (n, 1, height, width) with values in [−1, 1] (pixel = ⌊(v + 1)·127.5 +
 * 0.5⌋, NaN as −1, the mapping of model/png.c) and their labels (each in [0, 255]) as the IDX pair
 * <dir>/<prefix>-images-idx3-ubyte and <dir>/<prefix>-labels-idx1-ubyte, uncompressed, each
 * atomically; ts_fmnist_load(dir, prefix) reads them back. prefix: letters, digits and "+._-".
 * Errors: TS_EINVAL, TS_EIO, TS_ENOMEM. */
int ts_fmnist_write(const char *dir, const char *prefix, const float *images, const int32_t *labels,
                    int n, int height, int width, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
