/*
 * png.c — the PNG grid writer and grey reader (model/png.h), on libpng.
 *
 * The grid is composed into one byte buffer first (background, then each tile), so the part that
 * runs under libpng's setjmp error handling only streams finished rows: nothing is allocated
 * after setjmp on the write side, and the read side keeps its two buffers in volatile pointers so
 * a longjmp can free them. libpng reports errors through on_error, which copies the message into
 * the context and longjmps back; warnings are ignored.
 *
 * There is one encoder: encode_png writes through libpng's write callback into a growing memory
 * buffer. ts_png_encode_grid hands that buffer to the caller (an HTML report embeds it);
 * ts_png_write_grid writes it to a file. Writes are atomic: a temporary file next to the target
 * (mkstemp), fsync, then rename.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <png.h> /* libpng's; angle brackets, so this folder's own png.h is not picked up */

#include "model/png.h"

#include "base/file.h"

/* Filled by on_error. It lives in the caller of the function that calls setjmp, so it is not a
 * local of that function changed between setjmp and longjmp (whose value C leaves
 * indeterminate). */
typedef struct png_ctx {
    int code;      /* the TS_E* code for the error */
    char msg[256]; /* libpng's message */
} png_ctx_t;

static void on_error(png_structp png, png_const_charp msg) {
    png_ctx_t *ctx = png_get_error_ptr(png);
    snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

uint8_t ts_png_to_byte(float v) {
    if (isnan(v))
        return 0;
    if (v < -1.0f)
        v = -1.0f;
    if (v > 1.0f)
        v = 1.0f;
    return (uint8_t)floorf((v + 1.0f) * 127.5f + 0.5f);
}

/* ---- the grid -------------------------------------------------------------------------- */

static int default_cols(int n) {
    int c = (int)ceil(sqrt((double)n));
    while ((int64_t)c * c < n)
        c++;
    while (c > 1 && (int64_t)(c - 1) * (c - 1) >= n)
        c--;
    return c;
}

/* out is (height, width, C) interleaved, filled with the background, then tile i is copied from
 * images (n, C, H, W) to row i / cols, column i % cols. */
static void compose_grid(uint8_t *out, int width, int height, const float *images, int n, int C,
                         int H, int W, int cols, int pad) {
    memset(out, TS_PNG_BACKGROUND, (size_t)width * (size_t)height * (size_t)C);
    for (int i = 0; i < n; i++) {
        size_t top = (size_t)(i / cols) * (size_t)(H + pad);
        size_t left = (size_t)(i % cols) * (size_t)(W + pad);
        for (int c = 0; c < C; c++) {
            const float *tile = images + ((size_t)i * C + c) * (size_t)H * W;
            for (int y = 0; y < H; y++) {
                uint8_t *row = out + ((top + y) * (size_t)width + left) * C + c;
                for (int x = 0; x < W; x++)
                    row[(size_t)x * C] = ts_png_to_byte(tile[(size_t)y * W + x]);
            }
        }
    }
}

/* The encoded PNG, grown by libpng's write callback: the one place the encoder's bytes go, whether
 * they end up in a file (ts_png_write_grid) or in the caller's memory (ts_png_encode_grid). */
typedef struct png_mem {
    unsigned char *buf;
    size_t len, cap;
} png_mem_t;

static void on_write(png_structp png, png_bytep data, png_size_t n) {
    png_mem_t *m = png_get_io_ptr(png);
    if (n > m->cap - m->len) {
        size_t cap = m->cap ? m->cap : 4096;
        while (cap - m->len < n) {
            if (cap > SIZE_MAX / 2) {
                cap = 0;
                break;
            }
            cap *= 2;
        }
        unsigned char *grown = cap ? realloc(m->buf, cap) : NULL;
        if (!grown) {
            ((png_ctx_t *)png_get_error_ptr(png))->code = TS_ENOMEM;
            png_error(png, "out of memory for the encoded PNG");
        }
        m->buf = grown;
        m->cap = cap;
    }
    memcpy(m->buf + m->len, data, n);
    m->len += n;
}

static void on_flush(png_structp png) { (void)png; }

/* Encodes pix (height, width, C) into mem (which the caller frees, also on failure). Returns 0,
 * or a TS_E* code with ctx filled. */
static int encode_png(const uint8_t *pix, int width, int height, int C, png_mem_t *mem,
                      png_ctx_t *ctx) {
    ctx->code = TS_EIO;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, ctx, on_error, on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_write_struct(png ? &png : NULL, NULL);
        snprintf(ctx->msg, sizeof ctx->msg, "cannot create a write struct");
        return ctx->code = TS_ENOMEM;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return ctx->code;
    }
    png_set_write_fn(png, mem, on_write, on_flush);
    png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8,
                 C == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < height; y++)
        png_write_row(png, pix + (size_t)y * (size_t)width * (size_t)C);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return TS_OK;
}

/* Writes data[0..len) to path atomically (base/file.h). */
static int write_atomic(const char *path, const unsigned char *data, size_t len, char *err,
                        size_t errlen) {
    int e = 0, rc = ts_atomic_write(path, data, len, &e);
    return rc ? ts_fail(err, errlen, rc, "cannot write PNG %s: %s", path,
                        e ? strerror(e) : ts_strerror(rc))
              : TS_OK;
}

/* Checks the arguments of a grid writer (fn names it in the messages), then composes the grid
 * into *pix (malloc'ed, (*height, *width, C)), which the caller frees. */
static int make_grid(const char *fn, const float *images, int n, int C, int H, int W, int cols,
                     int pad, uint8_t **pix, int *width_out, int *height_out, char *err,
                     size_t errlen) {
    if (n < 1 || H < 1 || W < 1 || cols < 0 || pad < 0)
        return ts_fail(
            err, errlen, TS_EINVAL,
            "%s: bad sizes n=%d H=%d W=%d cols=%d pad=%d (need n, H, W ≥ 1, cols, pad ≥ 0)", fn, n,
            H, W, cols, pad);
    if (C != 1 && C != 3)
        return ts_fail(err, errlen, TS_EINVAL,
                       "%s: %d channels; only 1 (grey) or 3 (RGB) can be written", fn, C);
    if (cols == 0)
        cols = default_cols(n);
    int rows = (n + cols - 1) / cols;
    int64_t width = (int64_t)cols * W + (int64_t)(cols - 1) * pad;
    int64_t height = (int64_t)rows * H + (int64_t)(rows - 1) * pad;
    if (width > TS_PNG_MAX_SIDE || height > TS_PNG_MAX_SIDE)
        return ts_fail(err, errlen, TS_ERANGE,
                       "a %d×%d grid of %d×%d tiles with padding %d is %lld×%lld pixels, more than "
                       "%d on a side",
                       rows, cols, H, W, pad, (long long)height, (long long)width, TS_PNG_MAX_SIDE);
    *pix = malloc((size_t)width * (size_t)height * (size_t)C);
    if (!*pix)
        return ts_fail(err, errlen, TS_ENOMEM, "out of memory for a %lld×%lld PNG",
                       (long long)width, (long long)height);
    compose_grid(*pix, (int)width, (int)height, images, n, C, H, W, cols, pad);
    *width_out = (int)width;
    *height_out = (int)height;
    return TS_OK;
}

/* make_grid, then encode_png into *mem (which the caller frees, also on failure). */
static int encode_grid(const char *fn, const float *images, int n, int C, int H, int W, int cols,
                       int pad, png_mem_t *mem, char *err, size_t errlen) {
    uint8_t *pix = NULL;
    int width = 0, height = 0;
    int rc = make_grid(fn, images, n, C, H, W, cols, pad, &pix, &width, &height, err, errlen);
    if (rc)
        return rc;
    png_ctx_t ctx = {0, {0}};
    rc = encode_png(pix, width, height, C, mem, &ctx);
    free(pix);
    if (rc)
        ts_fail(err, errlen, rc, "%s: cannot encode the PNG: libpng: %s", fn, ctx.msg);
    return rc;
}

int ts_png_write_grid(const char *path, const float *images, int n, int C, int H, int W, int cols,
                      int pad, char *err, size_t errlen) {
    if (!path || !images)
        return ts_fail(err, errlen, TS_EINVAL, "ts_png_write_grid: path or images is NULL");
    png_mem_t mem = {NULL, 0, 0};
    int rc = encode_grid("ts_png_write_grid", images, n, C, H, W, cols, pad, &mem, err, errlen);
    if (!rc)
        rc = write_atomic(path, mem.buf, mem.len, err, errlen);
    free(mem.buf);
    return rc;
}

int ts_png_encode_grid(const float *images, int n, int C, int H, int W, int cols, int pad,
                       unsigned char **buf, size_t *len, char *err, size_t errlen) {
    if (buf)
        *buf = NULL;
    if (len)
        *len = 0;
    if (!images || !buf || !len)
        return ts_fail(err, errlen, TS_EINVAL, "ts_png_encode_grid: images, buf or len is NULL");
    png_mem_t mem = {NULL, 0, 0};
    int rc = encode_grid("ts_png_encode_grid", images, n, C, H, W, cols, pad, &mem, err, errlen);
    if (rc) {
        free(mem.buf);
        return rc;
    }
    *buf = mem.buf;
    *len = mem.len;
    return TS_OK;
}

/* ---- reading --------------------------------------------------------------------------- */

/* Asks libpng to deliver 8-bit grey whatever the file's colour type and depth. */
/* Asks libpng for 8-bit pixels of `channels` (1: grey, RGB by its default weights; 3: RGB, grey
 * copied to the three), whatever the file holds: palettes and low depths expanded, 16 bits
 * reduced, alpha dropped. */
static void request_8bit(png_structp png, png_infop info, int channels) {
    int color = png_get_color_type(png, info);
    int depth = png_get_bit_depth(png, info);
    if (depth == 16)
        png_set_strip_16(png);
    if (color == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8)
        png_set_expand_gray_1_2_4_to_8(png);
    if (color & PNG_COLOR_MASK_ALPHA)
        png_set_strip_alpha(png);
    if (channels == 1 && ((color & PNG_COLOR_MASK_COLOR) || color == PNG_COLOR_TYPE_PALETTE))
        png_set_rgb_to_gray_fixed(png, 1, -1, -1); /* 1: no warning; -1: default weights */
    if (channels == 3 && !(color & PNG_COLOR_MASK_COLOR) && color != PNG_COLOR_TYPE_PALETTE)
        png_set_gray_to_rgb(png);
    png_read_update_info(png, info);
}

#define READ_MAX_PIXELS (1 << 28) /* a PNG read here holds at most this many pixels */

/* Decodes the PNG after its signature as 8-bit pixels of `channels` into *pixels (malloc'ed,
 * (h, w, channels)). Returns 0, or a TS_E* code with ctx filled. */
static int decode_8bit(FILE *fp, png_ctx_t *ctx, int channels, uint8_t **pixels, int *w, int *h) {
    ctx->code = TS_ECORRUPT;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, ctx, on_error, on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
        snprintf(ctx->msg, sizeof ctx->msg, "cannot create a read struct");
        return ctx->code = TS_ENOMEM;
    }
    uint8_t *volatile buf = NULL;
    png_bytep *volatile rows = NULL;
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        free(buf);
        free(rows);
        return ctx->code;
    }
    png_init_io(png, fp);
    png_set_sig_bytes(png, 8);
    png_read_info(png, info);
    request_8bit(png, info, channels);
    if ((int)png_get_channels(png, info) != channels || png_get_bit_depth(png, info) != 8)
        png_error(png, channels == 1 ? "cannot convert this PNG to 8-bit grey"
                                     : "cannot convert this PNG to 8-bit RGB");
    png_uint_32 width = png_get_image_width(png, info), height = png_get_image_height(png, info);
    if ((uint64_t)width * height > READ_MAX_PIXELS) {
        ctx->code = TS_ERANGE;
        png_error(png, "too many pixels to read");
    }
    buf = malloc((size_t)width * height * (size_t)channels);
    rows = malloc((size_t)height * sizeof *rows);
    if (!buf || !rows) {
        ctx->code = TS_ENOMEM;
        png_error(png, "out of memory for the pixels");
    }
    for (png_uint_32 y = 0; y < height; y++)
        rows[y] = buf + (size_t)y * width * (size_t)channels;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    *pixels = buf;
    *w = (int)width;
    *h = (int)height;
    return TS_OK;
}

static int read_8bit(const char *path, int channels, uint8_t **pixels, int *w, int *h, char *err,
                     size_t errlen) {
    if (pixels)
        *pixels = NULL;
    if (!path || !pixels || !w || !h)
        return ts_fail(err, errlen, TS_EINVAL, "reading a PNG: NULL argument");
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return ts_fail(err, errlen, errno == ENOENT ? TS_ENOTFOUND : TS_EIO, "cannot open %s: %s",
                       path, strerror(errno));
    unsigned char sig[8];
    if (fread(sig, 1, sizeof sig, fp) != sizeof sig || png_sig_cmp(sig, 0, sizeof sig) != 0) {
        fclose(fp);
        return ts_fail(err, errlen, TS_ECORRUPT, "%s is not a PNG file", path);
    }
    png_ctx_t ctx = {0, {0}};
    int rc = decode_8bit(fp, &ctx, channels, pixels, w, h);
    fclose(fp);
    if (rc)
        return ts_fail(err, errlen, rc, "%s: libpng: %s", path, ctx.msg);
    return TS_OK;
}

int ts_png_read_rgb(const char *path, uint8_t **pixels, int *w, int *h, char *err, size_t errlen) {
    return read_8bit(path, 3, pixels, w, h, err, errlen);
}

int ts_png_read_gray(const char *path, uint8_t **pixels, int *w, int *h, char *err, size_t errlen) {
    return read_8bit(path, 1, pixels, w, h, err, errlen);
}
