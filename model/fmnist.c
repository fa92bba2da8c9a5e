/*
 * fmnist.c — the Fashion-MNIST IDX reader and writer (model/fmnist.h).
 *
 * Reading goes through zlib's gz* functions, which read a gzip file and an uncompressed one alike
 * (an uncompressed file is passed through as it is). A split is read in a fixed order: both
 * headers first, so a count mismatch is reported before megabytes are inflated; then the labels
 * (small); then the pixels into a byte buffer that grows with what actually arrives; then one
 * more read that must find the end of the stream (this read also surfaces a bad gzip CRC, which
 * zlib checks only when it reaches the end of a member). Only then are the pixels converted to
 * floats, so a failed load never allocates the float buffer.
 *
 * "Exactly the declared bytes" is checked on the decompressed data. Non-gzip bytes after the
 * last gzip member are skipped by zlib itself (gzread's documented behaviour), so they are not
 * reported; extra decompressed bytes are.
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "model/fmnist.h"

#include "base/file.h"

#define PATH_BUF 4096
#define GZ_CHUNK (1u << 30)          /* bytes per gzread call (it takes an unsigned) */
#define PIXELS_FIRST_CAP (16u << 20) /* the pixel buffer starts here and doubles */
#define INSTALL_HINT                                                                               \
    "install Fashion-MNIST with `apt-get install dataset-fashion-mnist`, "                         \
    "or pass the folder that holds the IDX files"

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* ---- IDX files ------------------------------------------------------------------------- */

typedef struct idx_file {
    gzFile gz;
    char path[PATH_BUF];
} idx_file_t;

static int path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Opens the IDX file at path (gzip or not: zlib reads both). */
static int idx_open_path(idx_file_t *f, const char *path, char *err, size_t errlen) {
    if (f->path != path && snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path)
        return ts_fail(err, errlen, TS_EINVAL, "path is too long: %s", path);
    f->gz = gzopen(f->path, "rb");
    if (!f->gz) {
        int e = errno;
        return ts_fail(err, errlen,
                       e == ENOMEM   ? TS_ENOMEM
                       : e == ENOENT ? TS_ENOTFOUND
                                     : TS_EIO,
                       "cannot open %s: %s", f->path, e ? strerror(e) : "out of memory");
    }
    gzbuffer(f->gz, 128u << 10);
    return TS_OK;
}

/* Opens <dir>/<prefix>-<kind>-ubyte.gz, or the same name without .gz when only that exists. */
static int idx_open(idx_file_t *f, const char *dir, const char *prefix, const char *kind, char *err,
                    size_t errlen) {
    f->gz = NULL;
    int len = snprintf(f->path, sizeof f->path, "%s/%s-%s-ubyte.gz", dir, prefix, kind);
    if (len < 0 || (size_t)len >= sizeof f->path)
        return ts_fail(err, errlen, TS_EINVAL, "dataset folder path is too long: %s", dir);
    if (!path_exists(f->path)) {
        f->path[len - 3] = '\0'; /* drop ".gz" */
        if (!path_exists(f->path)) {
            int e = errno;
            return ts_fail(err, errlen, TS_EIO, "cannot find %s.gz (nor %s): %s; " INSTALL_HINT,
                           f->path, f->path, strerror(e));
        }
    }
    return idx_open_path(f, f->path, err, errlen);
}

static void idx_close(idx_file_t *f) {
    if (f->gz)
        gzclose(f->gz);
    f->gz = NULL;
}

/* Reads up to len bytes into buf; *got is how many arrived. A short count at the end of the
 * file (or of a truncated gzip stream) is not an error here: the caller compares *got with what
 * it expected. A read error or corrupt gzip data is. */
static int idx_read(idx_file_t *f, void *buf, size_t len, size_t *got, char *err, size_t errlen) {
    unsigned char *p = buf;
    *got = 0;
    while (*got < len) {
        size_t want = len - *got < GZ_CHUNK ? len - *got : GZ_CHUNK;
        int r = gzread(f->gz, p + *got, (unsigned)want);
        if (r <= 0)
            break;
        *got += (size_t)r;
    }
    int zerr;
    const char *msg = gzerror(f->gz, &zerr);
    if (zerr == Z_ERRNO)
        return ts_fail(err, errlen, TS_EIO, "%s: read failed: %s", f->path, strerror(errno));
    if (zerr == Z_MEM_ERROR)
        return ts_fail(err, errlen, TS_ENOMEM, "%s: out of memory while inflating", f->path);
    if (zerr != Z_OK && zerr != Z_BUF_ERROR) /* Z_BUF_ERROR: the gzip stream ends early */
        return ts_fail(err, errlen, TS_ECORRUPT, "%s: corrupt gzip data: %s", f->path, msg);
    return TS_OK;
}

/* Reads to the end of the stream, which must come now: extra bytes are TS_ECORRUPT. */
static int idx_expect_end(idx_file_t *f, const char *what, size_t declared, char *err,
                          size_t errlen) {
    unsigned char scratch[4096];
    size_t extra = 0, got;
    do {
        int rc = idx_read(f, scratch, sizeof scratch, &got, err, errlen);
        if (rc)
            return rc;
        extra += got;
    } while (got == sizeof scratch);
    if (extra)
        return ts_fail(err, errlen, TS_ECORRUPT,
                       "%s: %zu trailing bytes after the declared %zu bytes of %s", f->path, extra,
                       declared, what);
    return TS_OK;
}

/* Reads and checks a header: magic, then ndim big-endian sizes into dims. */
static int idx_header(idx_file_t *f, uint32_t magic, int ndim, uint32_t *dims, char *err,
                      size_t errlen) {
    unsigned char hdr[16];
    size_t need = 4 + 4 * (size_t)ndim, got;
    int rc = idx_read(f, hdr, need, &got, err, errlen);
    if (rc)
        return rc;
    if (got >= 4 && be32(hdr) != magic)
        return ts_fail(err, errlen, TS_ECORRUPT,
                       "%s: not an IDX %s file: magic number is 0x%08x, expected 0x%08x", f->path,
                       ndim == 3 ? "image" : "label", be32(hdr), magic);
    if (got < need)
        return ts_fail(err, errlen, TS_ECORRUPT,
                       "%s: truncated: expected a %zu-byte IDX header, got %zu bytes", f->path,
                       need, got);
    for (int i = 0; i < ndim; i++)
        dims[i] = be32(hdr + 4 + 4 * i);
    return TS_OK;
}

/* Reads exactly len bytes into a malloc'ed buffer that grows with what arrives, then checks
 * that the stream ends. On success *out owns the buffer. */
static int idx_body(idx_file_t *f, const char *what, size_t len, unsigned char **out, char *err,
                    size_t errlen) {
    *out = NULL;
    size_t cap = len < PIXELS_FIRST_CAP ? len : PIXELS_FIRST_CAP, have = 0, got;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf)
        return ts_fail(err, errlen, TS_ENOMEM, "%s: out of memory for %zu bytes", f->path, cap);
    for (;;) {
        int rc = idx_read(f, buf + have, cap - have, &got, err, errlen);
        if (rc) {
            free(buf);
            return rc;
        }
        have += got;
        if (have < cap || cap == len)
            break;
        size_t next = cap <= len / 2 ? cap * 2 : len;
        unsigned char *grown = realloc(buf, next);
        if (!grown) {
            free(buf);
            return ts_fail(err, errlen, TS_ENOMEM, "%s: out of memory for %zu bytes", f->path,
                           next);
        }
        buf = grown;
        cap = next;
    }
    if (have < len) {
        free(buf);
        return ts_fail(err, errlen, TS_ECORRUPT, "%s: truncated: expected %zu bytes of %s, got %zu",
                       f->path, len, what, have);
    }
    int rc = idx_expect_end(f, what, len, err, errlen);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    return TS_OK;
}

/* ---- loading a split ------------------------------------------------------------------- */

/* A file-name prefix: "train", "t10k" for "test", or any other name made of letters, digits and
 * "+._-" (the files `ts_fmnist_write` makes); NULL for anything else. */
static const char *split_prefix(const char *split) {
    if (strcmp(split, "train") == 0)
        return "train";
    if (strcmp(split, "test") == 0 || strcmp(split, "t10k") == 0)
        return "t10k";
    if (!*split || strlen(split) > 200 || split[0] == '.')
        return NULL;
    for (const char *c = split; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '+' || *c == '.' || *c == '_' || *c == '-'))
            return NULL;
    return split;
}

/* Reads the labels (n of them), checks each is a known class and returns them as int32 in
 * *labels (malloc'ed, allocated only once the bytes have arrived). */
static int load_labels(idx_file_t *f, int n, int32_t **labels, char *err, size_t errlen) {
    unsigned char *raw;
    int rc = idx_body(f, "labels", (size_t)n, &raw, err, errlen);
    if (rc)
        return rc;
    int32_t *out = malloc((size_t)n * sizeof *out);
    if (!out) {
        free(raw);
        return ts_fail(err, errlen, TS_ENOMEM, "%s: out of memory for %d labels", f->path, n);
    }
    for (int i = 0; i < n && !rc; i++) {
        if (raw[i] >= TS_FMNIST_NUM_CLASSES)
            rc = ts_fail(err, errlen, TS_ECORRUPT,
                         "%s: label %d of item %d is out of range (classes are 0..%d)", f->path,
                         raw[i], i, TS_FMNIST_NUM_CLASSES - 1);
        out[i] = raw[i];
    }
    free(raw);
    if (rc) {
        free(out);
        return rc;
    }
    *labels = out;
    return TS_OK;
}

/* Reads the pixels (npix bytes) and scales each byte p to p / 127.5 − 1; 0 → −1 and 255 → 1
 * exactly. */
static int load_pixels(idx_file_t *f, size_t npix, float **images, char *err, size_t errlen) {
    unsigned char *raw;
    int rc = idx_body(f, "pixels", npix, &raw, err, errlen);
    if (rc)
        return rc;
    float *out = malloc(npix * sizeof *out);
    if (!out) {
        free(raw);
        return ts_fail(err, errlen, TS_ENOMEM, "%s: out of memory for %zu floats", f->path, npix);
    }
    float table[256];
    for (int p = 0; p < 256; p++)
        table[p] = (float)p / 127.5f - 1.0f;
    for (size_t i = 0; i < npix; i++)
        out[i] = table[raw[i]];
    free(raw);
    *images = out;
    return TS_OK;
}

static int load_opened(idx_file_t *pimg, idx_file_t *plab, int rc, ts_dataset_t *ds, char *err,
                       size_t errlen);

int ts_fmnist_load(const char *dir, const char *split, ts_dataset_t *ds, char *err, size_t errlen) {
    if (!ds)
        return ts_fail(err, errlen, TS_EINVAL, "ts_fmnist_load: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!split)
        return ts_fail(err, errlen, TS_EINVAL, "ts_fmnist_load: split is NULL");
    const char *prefix = split_prefix(split);
    if (!prefix)
        return ts_fail(err, errlen, TS_EINVAL,
                       "unknown split \"%s\": expected \"train\", \"test\" or a file prefix of "
                       "letters, digits and +._-",
                       split);
    if (!dir)
        dir = TS_FMNIST_DEFAULT_DIR;

    idx_file_t img = {0}, lab = {0};
    int rc = idx_open(&img, dir, prefix, "images-idx3", err, errlen);
    if (!rc)
        rc = idx_open(&lab, dir, prefix, "labels-idx1", err, errlen);
    return load_opened(&img, &lab, rc, ds, err, errlen);
}

int ts_fmnist_load_files(const char *images, const char *labels, ts_dataset_t *ds, char *err,
                         size_t errlen) {
    if (!ds || !images || !labels)
        return ts_fail(err, errlen, TS_EINVAL, "ts_fmnist_load_files: a NULL argument");
    memset(ds, 0, sizeof *ds);
    idx_file_t img = {0}, lab = {0};
    int rc = idx_open_path(&img, images, err, errlen);
    if (!rc)
        rc = idx_open_path(&lab, labels, err, errlen);
    return load_opened(&img, &lab, rc, ds, err, errlen);
}

/* The dataset of an opened IDX pair (rc: the opening's code, passed on when not TS_OK); closes
 * both files. */
static int load_opened(idx_file_t *pimg, idx_file_t *plab, int rc, ts_dataset_t *ds, char *err,
                       size_t errlen) {
    idx_file_t img = *pimg, lab = *plab;
    uint32_t idims[3] = {0}, ldims[1] = {0};
    if (!rc)
        rc = idx_header(&img, TS_FMNIST_MAGIC_IMAGES, 3, idims, err, errlen);
    if (!rc)
        rc = idx_header(&lab, TS_FMNIST_MAGIC_LABELS, 1, ldims, err, errlen);
    if (rc)
        goto done;

    if (idims[0] < 1 || idims[0] > TS_FMNIST_MAX_N) {
        rc = ts_fail(err, errlen, TS_ECORRUPT, "%s: item count %u is out of range (1..%d)",
                     img.path, idims[0], TS_FMNIST_MAX_N);
        goto done;
    }
    if (idims[1] < 1 || idims[1] > TS_FMNIST_MAX_DIM || idims[2] < 1 ||
        idims[2] > TS_FMNIST_MAX_DIM) {
        rc = ts_fail(err, errlen, TS_ECORRUPT, "%s: image size %u×%u is out of range (1..%d each)",
                     img.path, idims[1], idims[2], TS_FMNIST_MAX_DIM);
        goto done;
    }
    if (ldims[0] != idims[0]) {
        rc = ts_fail(err, errlen, TS_ECORRUPT, "%s holds %u images but %s holds %u labels",
                     img.path, idims[0], lab.path, ldims[0]);
        goto done;
    }

    ds->n = (int)idims[0];
    ds->channels = 1;
    ds->height = (int)idims[1];
    ds->width = (int)idims[2];
    ds->num_classes = TS_FMNIST_NUM_CLASSES;
    size_t npix = (size_t)ds->n * (size_t)ds->height * (size_t)ds->width;
    if (npix / (size_t)ds->n / (size_t)ds->height != (size_t)ds->width ||
        npix > SIZE_MAX / sizeof(float)) {
        rc = ts_fail(err, errlen, TS_ERANGE, "%s: %u images of %u×%u do not fit in memory",
                     img.path, idims[0], idims[1], idims[2]);
        goto done;
    }
    rc = load_labels(&lab, ds->n, &ds->labels, err, errlen);
    if (!rc)
        rc = load_pixels(&img, npix, &ds->images, err, errlen);

done:
    idx_close(&img);
    idx_close(&lab);
    if (rc)
        ts_dataset_free(ds);
    return rc;
}

int ts_fmnist_load_labels(const char *dir, const char *split, int32_t **labels, int *n, char *err,
                          size_t errlen) {
    if (!labels || !n || !split)
        return ts_fail(err, errlen, TS_EINVAL, "ts_fmnist_load_labels: NULL argument");
    *labels = NULL;
    *n = 0;
    const char *prefix = split_prefix(split);
    if (!prefix)
        return ts_fail(err, errlen, TS_EINVAL, "unknown split \"%s\"", split);
    idx_file_t lab = {0};
    uint32_t ldims[1] = {0};
    int rc = idx_open(&lab, dir ? dir : TS_FMNIST_DEFAULT_DIR, prefix, "labels-idx1", err, errlen);
    if (!rc)
        rc = idx_header(&lab, TS_FMNIST_MAGIC_LABELS, 1, ldims, err, errlen);
    if (!rc && (ldims[0] < 1 || ldims[0] > TS_FMNIST_MAX_N))
        rc = ts_fail(err, errlen, TS_ECORRUPT, "%s: item count %u is out of range (1..%d)",
                     lab.path, ldims[0], TS_FMNIST_MAX_N);
    if (!rc)
        rc = load_labels(&lab, (int)ldims[0], labels, err, errlen);
    if (!rc)
        *n = (int)ldims[0];
    idx_close(&lab);
    return rc;
}

/* ---- atomic writes (base/file.h) --------------------------------------------------------- */

static int open_failed(int rc, int e, const char *path, char *err, size_t errlen) {
    return ts_fail(err, errlen, rc, "cannot create a temporary file next to %s: %s", path,
                   e ? strerror(e) : ts_strerror(rc));
}

static int commit(ts_atomic_file_t *a, int ok, const char *path, char *err, size_t errlen) {
    int e = ok ? 0 : errno;
    int rc = ts_atomic_commit(a, ok, &e);
    return rc ? ts_fail(err, errlen, rc, "cannot write %s: %s", path, e ? strerror(e) : "I/O error")
              : TS_OK;
}

/* ---- writing IDX files ------------------------------------------------------------------- */

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* Writes head (hlen bytes) then body (blen) to path atomically. */
static int write_atomic(const char *path, const unsigned char *head, size_t hlen,
                        const unsigned char *body, size_t blen, char *err, size_t errlen) {
    ts_atomic_file_t a;
    int e = 0, rc = ts_atomic_open(&a, path, &e);
    if (rc != TS_OK)
        return open_failed(rc, e, path, err, errlen);
    int ok = fwrite(head, 1, hlen, a.fp) == hlen && fwrite(body, 1, blen, a.fp) == blen;
    return commit(&a, ok, path, err, errlen);
}

int ts_fmnist_write(const char *dir, const char *prefix, const float *images, const int32_t *labels,
                    int n, int height, int width, char *err, size_t errlen) {
    if (!dir || !prefix || !images || !labels || n < 1 || n > TS_FMNIST_MAX_N || height < 1 ||
        width < 1 || height > 4096 || width > 4096)
        return ts_fail(err, errlen, TS_EINVAL, "ts_fmnist_write: bad arguments");
    if (!split_prefix(prefix) || strcmp(split_prefix(prefix), prefix) != 0)
        return ts_fail(err, errlen, TS_EINVAL,
                       "ts_fmnist_write: \"%s\" is not a file prefix (letters, digits and +._-)",
                       prefix);
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] > 255)
            return ts_fail(err, errlen, TS_EINVAL,
                           "ts_fmnist_write: label %d of item %d is not a byte", (int)labels[i], i);
    size_t npix = (size_t)n * (size_t)height * (size_t)width;
    unsigned char *pix = malloc(npix), *lab = malloc((size_t)n);
    if (!pix || !lab) {
        free(pix);
        free(lab);
        return ts_fail(err, errlen, TS_ENOMEM, "ts_fmnist_write: out of memory for %d images", n);
    }
    for (size_t i = 0; i < npix; i++) {
        float v = images[i];
        v = isnan(v) ? -1.0f : v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
        pix[i] = (unsigned char)floorf((v + 1.0f) * 127.5f + 0.5f);
    }
    for (int i = 0; i < n; i++)
        lab[i] = (unsigned char)labels[i];
    unsigned char ih[16], lh[8];
    put_be32(ih, TS_FMNIST_MAGIC_IMAGES), put_be32(ih + 4, (uint32_t)n);
    put_be32(ih + 8, (uint32_t)height), put_be32(ih + 12, (uint32_t)width);
    put_be32(lh, TS_FMNIST_MAGIC_LABELS), put_be32(lh + 4, (uint32_t)n);
    char path[PATH_BUF];
    int rc = TS_OK;
    if (snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix) >= (int)sizeof path)
        rc = ts_fail(err, errlen, TS_EINVAL, "folder path is too long: %s", dir);
    if (rc == TS_OK)
        rc = write_atomic(path, ih, sizeof ih, pix, npix, err, errlen);
    if (rc == TS_OK) {
        snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
        rc = write_atomic(path, lh, sizeof lh, lab, (size_t)n, err, errlen);
    }
    free(pix);
    free(lab);
    return rc;
}

/* ---- class names ------------------------------------------------------------------------------ */

static const char *const class_names[TS_FMNIST_NUM_CLASSES] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

const char *ts_fmnist_class_name(int label) {
    return label >= 0 && label < TS_FMNIST_NUM_CLASSES ? class_names[label] : NULL;
}

/* s lowercased with everything but letters and digits dropped, into out (len bytes). */
static void squash(const char *s, char *out, size_t len) {
    size_t n = 0;
    for (; *s && n + 1 < len; s++)
        if (isalnum((unsigned char)*s))
            out[n++] = (char)tolower((unsigned char)*s);
    out[n] = '\0';
}

int ts_fmnist_class_parse(const char *name) {
    char want[64], have[64];
    if (!name || strlen(name) >= sizeof want)
        return -1;
    squash(name, want, sizeof want);
    size_t n = strlen(want);
    if (n == 0)
        return -1;
    int found = -1, matches = 0;
    for (int c = 0; c < TS_FMNIST_NUM_CLASSES; c++) {
        squash(class_names[c], have, sizeof have);
        if (strcmp(have, want) == 0)
            return c; /* a whole name wins over prefixes ("shirt" is not "t-shirt/top") */
        if (strncmp(have, want, n) == 0) {
            found = c;
            matches++;
        }
    }
    return matches == 1 ? found : -1;
}
