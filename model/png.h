/*
 * png.h — writing a grid of images as one PNG (for looking at samples), and reading a grey PNG
 * back (for tests).
 *
 * Conventions of the grid writer:
 *   - values are clamped to [−1, 1] and mapped to bytes by round-half-up:
 *     byte = floor((v + 1) · 127.5 + 0.5), so −1 → 0, 0 → 128, 1 → 255; NaN → 0 (black);
 *     +Inf → 255 and −Inf → 0 (they clamp like any value);
 *   - tiles are laid out row-major (image i at row i / cols, column i % cols), with `pad` pixels
 *     between neighbouring tiles and no border around the grid, so the PNG is
 *     cols·W + (cols − 1)·pad wide and rows·H + (rows − 1)·pad high, rows = ceil(n / cols);
 *   - the background (the padding, and the empty cells after the last image) is mid-grey,
 *     TS_PNG_BACKGROUND = 128 in every channel, so tile edges stay visible on both dark
 *     Fashion-MNIST backgrounds and light images.
 *
 * ts_png_encode_grid gives the same bytes in memory (for embedding, e.g. in an HTML report).
 *
 * What it is not: a general image library. It writes 8-bit grey or RGB and reads 8-bit (after
 * libpng's expansions) grey or RGB.
 *
 * `err`/`errlen`: a failure writes one NUL-terminated sentence there (err may be NULL).
 */
#ifndef TS_PNG_H
#define TS_PNG_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_PNG_BACKGROUND 128 /* byte value of the padding and empty cells */
#define TS_PNG_MAX_SIDE 65535 /* bound on the written image's width and height, in pixels */

/* Maps one value in [−1, 1] to a byte as the grid writer does (see above). */
uint8_t ts_png_to_byte(float v);

/* Writes images (n, C, H, W) as a grid PNG at path. C = 1 gives an 8-bit grey PNG, C = 3 an 8-bit
 * RGB PNG (channel 0 red, 1 green, 2 blue). cols = 0 picks ceil(sqrt(n)) columns; cols > n is
 * allowed (the extra cells are background). pad ≥ 0. The write is atomic: a temporary file in
 * the same folder is written, flushed and renamed over path. Errors: TS_EINVAL (NULL, n < 1,
 * C not 1 or 3, H, W or cols out of range, pad < 0), TS_ERANGE (the grid would be wider or higher
 * than TS_PNG_MAX_SIDE), TS_EIO (cannot create, write or rename; a libpng error), TS_ENOMEM. */
int ts_png_write_grid(const char *path, const float *images, int n, int C, int H, int W, int cols,
                      int pad, char *err, size_t errlen);

/* The same grid as ts_png_write_grid (same arguments and conventions, same encoder), encoded in
 * memory: on success *buf is a malloc'ed PNG of *len bytes that the caller frees; on failure *buf
 * is NULL and *len 0. Errors: as ts_png_write_grid, without the file ones (TS_EIO only for a
 * libpng error). */
int ts_png_encode_grid(const float *images, int n, int C, int H, int W, int cols, int pad,
                       unsigned char **buf, size_t *len, char *err, size_t errlen);

/* Reads a PNG as 8-bit grey: grey stays as is, RGB becomes grey by libpng's default weights
 * (a pixel with r = g = b keeps that value exactly), alpha is dropped, palettes and depths below
 * 8 are expanded, 16-bit is reduced to 8. On success *pixels is a malloc'ed (h, w) row-major
 * buffer that the caller frees. Errors: TS_EINVAL, TS_EIO (cannot open; not a PNG; a libpng
 * error), TS_ENOMEM. */
int ts_png_read_gray(const char *path, uint8_t **pixels, int *w, int *h, char *err, size_t errlen);
/* The same as 8-bit RGB: *pixels (h, w, 3) row-major, red first; a grey PNG's value copied to the
 * three. Errors as ts_png_read_gray; a missing file is TS_ENOTFOUND, more than 2^28 pixels
 * TS_ERANGE. */
int ts_png_read_rgb(const char *path, uint8_t **pixels, int *w, int *h, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
