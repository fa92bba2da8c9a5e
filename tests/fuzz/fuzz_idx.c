/*
 * fuzz_idx.c — libFuzzer harness for the IDX reader of model/fmnist.h (ts_fmnist_load), which
 * reads the training data a node is pointed at and the sample sets `ts_fmnist_write` saves. The
 * reader only takes a folder and a file prefix, so the input becomes a pair of files in a folder
 * under /tmp (mkdtemp, made once and removed at exit): its first two bytes are the length L
 * (big-endian, cut to what is left) of the labels file, the next L bytes that file, and the rest
 * the images file. Files are written under the uncompressed names; zlib reads a gzip stream in
 * either, so gzip input is fuzzed too.
 *
 * Checked: a failure leaves the dataset zeroed and says why. A success has 1 ≤ n, one channel,
 * 1 ≤ height, width ≤ TS_FMNIST_MAX_DIM, TS_FMNIST_NUM_CLASSES classes, every label below that
 * and every pixel in [−1, 1]; when a file is not gzip, it holds exactly its header and the
 * declared bytes, and the labels and pixels are those bytes (pixel p as p / 127.5 − 1).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "model/fmnist.h"

#define PREFIX "fuzz"

static int write_file(const char *path, const uint8_t *data, size_t size) {
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return -1;
    int ok = fwrite(data, 1, size, fp) == size;
    return fclose(fp) == 0 && ok ? 0 : -1;
}

static int is_gzip(const uint8_t *p, size_t n) { return n >= 2 && p[0] == 0x1f && p[1] == 0x8b; }

static void check(const ts_dataset_t *ds, const uint8_t *lab, size_t nlab, const uint8_t *img,
                  size_t nimg) {
    if (ds->n < 1 || ds->channels != 1 || ds->height < 1 || ds->height > TS_FMNIST_MAX_DIM ||
        ds->width < 1 || ds->width > TS_FMNIST_MAX_DIM ||
        ds->num_classes != TS_FMNIST_NUM_CLASSES || !ds->images || !ds->labels)
        abort();
    size_t n = (size_t)ds->n, npix = n * (size_t)ds->height * (size_t)ds->width;
    for (size_t i = 0; i < n; i++)
        if (ds->labels[i] < 0 || ds->labels[i] >= TS_FMNIST_NUM_CLASSES)
            abort();
    for (size_t i = 0; i < npix; i++)
        if (!(ds->images[i] >= -1.0f && ds->images[i] <= 1.0f))
            abort();
    if (!is_gzip(lab, nlab)) {
        if (nlab != 8 + n)
            abort(); /* exactly the header and the declared labels */
        for (size_t i = 0; i < n; i++)
            if (ds->labels[i] != lab[8 + i])
                abort();
    }
    if (!is_gzip(img, nimg)) {
        if (nimg != 16 + npix)
            abort();
        for (size_t i = 0; i < npix; i++)
            if (ds->images[i] != (float)img[16 + i] / 127.5f - 1.0f)
                abort();
    }
}

static char dir[] = "/tmp/fuzz_idx-XXXXXX", lab_path[64], img_path[64];

static void cleanup(void) {
    unlink(lab_path);
    unlink(img_path);
    rmdir(dir);
}

/* The folder, made once and removed at exit. */
static void setup(void) {
    static int ready;
    if (ready)
        return;
    if (!mkdtemp(dir))
        abort();
    snprintf(lab_path, sizeof lab_path, "%s/" PREFIX "-labels-idx1-ubyte", dir);
    snprintf(img_path, sizeof img_path, "%s/" PREFIX "-images-idx3-ubyte", dir);
    atexit(cleanup);
    ready = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    if (size < 2)
        return 0;
    size_t nlab = (size_t)data[0] << 8 | data[1];
    data += 2, size -= 2;
    if (nlab > size)
        nlab = size;
    const uint8_t *lab = data, *img = data + nlab;
    size_t nimg = size - nlab;
    if (write_file(lab_path, lab, nlab) != 0 || write_file(img_path, img, nimg) != 0)
        return 0; /* /tmp is full: nothing to learn from this input */
    ts_dataset_t ds;
    char err[512] = "";
    if (ts_fmnist_load(dir, PREFIX, &ds, err, sizeof err) == TS_OK) {
        check(&ds, lab, nlab, img, nimg);
        ts_dataset_free(&ds);
    } else {
        static const ts_dataset_t zero;
        if (memcmp(&ds, &zero, sizeof ds) != 0 || !err[0])
            abort(); /* a failure leaves nothing behind and says why */
    }
    return 0;
}
