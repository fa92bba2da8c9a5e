/*
 * test_png.c — the PNG grid writer and grey reader (model/png.h).
 *
 * Covers: tile placement in a 2×3 grid with padding (every pixel checked, tiles and background),
 * an unfilled last row, the default column count ceil(sqrt(n)), the value mapping (−1 → 0,
 * 0 → 128, 1 → 255, round-half-up in between, clamping, NaN → 0), RGB output read back both
 * through libpng's own simplified API (channel order) and through ts_png_read_gray, atomic
 * overwrite, and the refusals: bad arguments, a grid too large, an unwritable folder, a missing,
 * non-PNG or truncated file on reading.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <png.h>

#include "model/png.h"
#include "tests/testutil.h"

/* The checks print err, the sentence the call under test wrote. */
#define CHECK_RC(expr, want) TU_CHECK_RC_MSG(expr, want, err)
#define CHECK_OK(expr) CHECK_RC(expr, TS_OK)

static char err[512]; /* the error sentence of the last call, printed by CHECK_RC */

/* Each test gets a fresh temporary folder (tu_temp_dir) and an empty err. */
static int setup_dir(void **state) {
    err[0] = '\0';
    return tu_setup_temp_dir(state);
}

/* The value whose byte is k: k / 127.5 − 1. */
static float from_byte(int k) { return (float)k / 127.5f - 1.0f; }

/* Byte k of tile i, pixel (y, x): distinct across tiles and positions of a small grid. */
static int pattern(int i, int y, int x) { return 40 * i + 8 * y + x + 1; }

/* n tiles of H×W (C = 1) with pattern(); caller frees. */
static float *make_tiles(int n, int H, int W) {
    float *img = malloc((size_t)n * H * W * sizeof *img);
    assert_non_null(img);
    for (int i = 0; i < n; i++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                img[((size_t)i * H + y) * W + x] = from_byte(pattern(i, y, x));
    return img;
}

/* Checks every pixel of a grid read back: tiles in row-major order, background elsewhere. */
static void check_grid(const uint8_t *px, int w, int h, int n, int H, int W, int cols, int pad) {
    for (int py = 0; py < h; py++)
        for (int px_ = 0; px_ < w; px_++) {
            int ty = py / (H + pad), y = py % (H + pad);
            int tx = px_ / (W + pad), x = px_ % (W + pad);
            int i = ty * cols + tx;
            int want = (y < H && x < W && i < n) ? pattern(i, y, x) : TS_PNG_BACKGROUND;
            if (px[(size_t)py * w + px_] != want) {
                print_error("pixel (%d, %d): got %d, want %d\n", py, px_, px[(size_t)py * w + px_],
                            want);
                fail();
            }
        }
}

/* ---- layout ---------------------------------------------------------------------------- */

static void test_grid_2x3_placement(void **state) {
    (void)state;
    const int n = 6, H = 4, W = 5, cols = 3, pad = 2;
    float *img = make_tiles(n, H, W);
    const char *path = tu_temp_path("grid.png");
    CHECK_OK(ts_png_write_grid(path, img, n, 1, H, W, cols, pad, err, sizeof err));
    uint8_t *px;
    int w, h;
    CHECK_OK(ts_png_read_gray(path, &px, &w, &h, err, sizeof err));
    assert_int_equal(w, cols * W + (cols - 1) * pad); /* no border around the grid */
    assert_int_equal(h, 2 * H + pad);
    check_grid(px, w, h, n, H, W, cols, pad);
    /* spot checks that do not rely on check_grid's arithmetic */
    assert_int_equal(px[0], pattern(0, 0, 0));
    assert_int_equal(px[W], 128); /* padding: mid-grey, as documented */
    assert_int_equal(px[(size_t)(H + pad) * w + 2 * (W + pad)], pattern(5, 0, 0)); /* tile 5 */
    assert_int_equal(px[(size_t)(h - 1) * w + (w - 1)], pattern(5, H - 1, W - 1));
    free(px);
    free(img);
}

static void test_grid_partial_row_and_no_pad(void **state) {
    (void)state;
    const int n = 5, H = 3, W = 2, cols = 3;
    float *img = make_tiles(n, H, W);
    const char *path = tu_temp_path("partial.png");
    CHECK_OK(ts_png_write_grid(path, img, n, 1, H, W, cols, 0, err, sizeof err));
    uint8_t *px;
    int w, h;
    CHECK_OK(ts_png_read_gray(path, &px, &w, &h, err, sizeof err));
    assert_int_equal(w, 6);
    assert_int_equal(h, 6);
    check_grid(px, w, h, n, H, W, cols, 0); /* the sixth cell is background */
    free(px);

    /* more columns than images: one row, the rest background */
    CHECK_OK(ts_png_write_grid(path, img, 2, 1, H, W, 4, 1, err, sizeof err));
    CHECK_OK(ts_png_read_gray(path, &px, &w, &h, err, sizeof err));
    assert_int_equal(w, 4 * W + 3);
    assert_int_equal(h, H);
    check_grid(px, w, h, 2, H, W, 4, 1);
    free(px);
    free(img);
}

static void test_default_cols(void **state) {
    (void)state;
    /* n → ceil(sqrt(n)) columns */
    static const int cases[][2] = {{1, 1}, {2, 2}, {4, 2}, {5, 3}, {9, 3}, {10, 4}, {64, 8}};
    float *img = make_tiles(64, 1, 1);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = cases[c][0], cols = cases[c][1];
        const char *path = tu_temp_path("cols.png");
        CHECK_OK(ts_png_write_grid(path, img, n, 1, 1, 1, 0, 1, err, sizeof err));
        uint8_t *px;
        int w, h;
        CHECK_OK(ts_png_read_gray(path, &px, &w, &h, err, sizeof err));
        int rows = (n + cols - 1) / cols;
        assert_int_equal(w, 2 * cols - 1);
        assert_int_equal(h, 2 * rows - 1);
        free(px);
    }
    free(img);
}

/* ---- value mapping --------------------------------------------------------------------- */

static void test_value_mapping(void **state) {
    (void)state;
    const float v[] = {-1.0f,     1.0f, 0.0f,  NAN,          2.0f,           -3.0f, INFINITY,
                       -INFINITY, 0.5f, -0.5f, from_byte(1), from_byte(254), -NAN};
    /* round half up: 0 → 127.5 → 128 (the only exact half a float in [−1, 1] can hit);
     * 0.5 → 191.25 → 191; −0.5 → 63.75 → 64 */
    const int want[] = {0, 255, 128, 0, 255, 0, 255, 0, 191, 64, 1, 254, 0};
    const int n = (int)(sizeof v / sizeof v[0]);
    for (int i = 0; i < n; i++)
        assert_int_equal(ts_png_to_byte(v[i]), want[i]);
    for (int k = 0; k < 256; k++) /* every byte survives the float round trip */
        assert_int_equal(ts_png_to_byte(from_byte(k)), k);

    const char *path = tu_temp_path("values.png");
    CHECK_OK(ts_png_write_grid(path, v, n, 1, 1, 1, n, 0, err, sizeof err));
    uint8_t *px;
    int w, h;
    CHECK_OK(ts_png_read_gray(path, &px, &w, &h, err, sizeof err));
    assert_int_equal(w, n);
    assert_int_equal(h, 1);
    for (int i = 0; i < n; i++)
        assert_int_equal(px[i], want[i]);
    free(px);
}

/* ---- RGB ------------------------------------------------------------------------------- */

static void test_rgb(void **state) {
    (void)state;
    /* two 2×2 RGB tiles (n, C, H, W): tile 0 has distinct channels, tile 1 is grey (r = g = b) */
    const int n = 2, H = 2, W = 2, pad = 1;
    float img[2 * 3 * 2 * 2];
    for (int i = 0; i < n; i++)
        for (int c = 0; c < 3; c++)
            for (int p = 0; p < H * W; p++)
                img[(i * 3 + c) * H * W + p] = from_byte(i == 0 ? 10 + 100 * c + p : 50 + 10 * p);
    const char *path = tu_temp_path("rgb.png");
    CHECK_OK(ts_png_write_grid(path, img, n, 3, H, W, 2, pad, err, sizeof err));

    /* libpng's own reader, as RGB: channel order and placement */
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    assert_true(png_image_begin_read_from_file(&im, path));
    assert_int_equal(im.format & PNG_FORMAT_FLAG_COLOR, PNG_FORMAT_FLAG_COLOR);
    im.format = PNG_FORMAT_RGB;
    assert_int_equal(im.width, 5);
    assert_int_equal(im.height, 2);
    uint8_t rgb[5 * 2 * 3];
    assert_true(png_image_finish_read(&im, NULL, rgb, 0, NULL));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < 5; x++)
            for (int c = 0; c < 3; c++) {
                int got = rgb[(y * 5 + x) * 3 + c], want;
                if (x < 2)
                    want = 10 + 100 * c + y * W + x;
                else if (x == 2)
                    want = TS_PNG_BACKGROUND;
                else
                    want = 50 + 10 * (y * W + x - 3);
                assert_int_equal(got, want);
            }

    /* ts_png_read_gray on RGB: grey pixels keep their value exactly */
    uint8_t *px;
    int w, h;
    CHECK_OK(ts_png_read_gray(path, &px, &w, &h, err, sizeof err));
    assert_int_equal(w, 5);
    assert_int_equal(h, 2);
    assert_int_equal(px[3], 50);
    assert_int_equal(px[4], 60);
    assert_int_equal(px[5 + 3], 70);
    assert_int_equal(px[5 + 4], 80);
    assert_int_equal(px[2], TS_PNG_BACKGROUND);
    free(px);

    /* ts_png_read_rgb gives the RGB bytes libpng's own reader gave, channel by channel */
    CHECK_OK(ts_png_read_rgb(path, &px, &w, &h, err, sizeof err));
    assert_int_equal(w, 5);
    assert_int_equal(h, 2);
    assert_memory_equal(px, rgb, sizeof rgb);
    free(px);
}

/* ---- atomic writes and errors ---------------------------------------------------------- */

static void test_overwrite_is_atomic(void **state) {
    (void)state;
    float *img = make_tiles(4, 3, 3);
    const char *path = tu_temp_path("out.png");
    CHECK_OK(ts_png_write_grid(path, img, 4, 1, 3, 3, 2, 1, err, sizeof err));
    CHECK_OK(ts_png_write_grid(path, img, 1, 1, 3, 3, 1, 0, err, sizeof err));
    assert_int_equal(tu_count_files(tu_temp_dir()), 1); /* no temporary file left behind */
    uint8_t *px;
    int w, h;
    CHECK_OK(ts_png_read_gray(path, &px, &w, &h, err, sizeof err));
    assert_int_equal(w, 3);
    assert_int_equal(h, 3);
    uint8_t *rgb;
    CHECK_OK(ts_png_read_rgb(path, &rgb, &w, &h, err, sizeof err)); /* grey copied to R, G, B */
    for (int i = 0; i < 9; i++)
        assert_true(rgb[3 * i] == px[i] && rgb[3 * i + 1] == px[i] && rgb[3 * i + 2] == px[i]);
    free(rgb);
    free(px);
    free(img);
}

static void test_write_errors(void **state) {
    (void)state;
    float *img = make_tiles(4, 2, 2);
    const char *path = tu_temp_path("bad.png");
    CHECK_RC(ts_png_write_grid(NULL, img, 4, 1, 2, 2, 0, 0, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_png_write_grid(path, NULL, 4, 1, 2, 2, 0, 0, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_png_write_grid(path, img, 0, 1, 2, 2, 0, 0, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_png_write_grid(path, img, 1, 2, 2, 2, 0, 0, err, sizeof err), TS_EINVAL);
    assert_non_null(strstr(err, "2 channels"));
    CHECK_RC(ts_png_write_grid(path, img, 1, 4, 1, 1, 0, 0, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_png_write_grid(path, img, 4, 1, 0, 2, 0, 0, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_png_write_grid(path, img, 4, 1, 2, -1, 0, 0, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_png_write_grid(path, img, 4, 1, 2, 2, -1, 0, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_png_write_grid(path, img, 4, 1, 2, 2, 0, -1, err, sizeof err), TS_EINVAL);
    /* 2 columns of width 1 with 70000 pixels between them */
    CHECK_RC(ts_png_write_grid(path, img, 2, 1, 1, 1, 2, 70000, err, sizeof err), TS_ERANGE);
    assert_non_null(strstr(err, "65535"));
    assert_int_equal(tu_count_files(tu_temp_dir()), 0);
    CHECK_RC(
        ts_png_write_grid(tu_temp_path("missing/x.png"), img, 4, 1, 2, 2, 0, 0, err, sizeof err),
        TS_EIO);
    assert_non_null(strstr(err, "missing/x.png"));
    assert_int_equal(ts_png_write_grid(NULL, img, 4, 1, 2, 2, 0, 0, NULL, 0), TS_EINVAL);
    free(img);
}

static void test_read_errors(void **state) {
    (void)state;
    uint8_t *px = (uint8_t *)err;
    int w, h;
    CHECK_RC(ts_png_read_gray(tu_temp_path("absent.png"), &px, &w, &h, err, sizeof err),
             TS_ENOTFOUND);
    assert_null(px);
    assert_non_null(strstr(err, "absent.png"));
    CHECK_RC(ts_png_read_gray(NULL, &px, &w, &h, err, sizeof err), TS_EINVAL);

    const char *text = "this is not a PNG file at all\n";
    tu_write_file(tu_temp_path("text.png"), text, strlen(text));
    CHECK_RC(ts_png_read_gray(tu_temp_path("text.png"), &px, &w, &h, err, sizeof err), TS_ECORRUPT);
    assert_non_null(strstr(err, "not a PNG"));

    /* a real PNG cut in half: libpng's error comes back through longjmp, nothing leaks */
    float *img = make_tiles(9, 8, 8);
    const char *path = tu_temp_path("cut.png");
    CHECK_OK(ts_png_write_grid(path, img, 9, 1, 8, 8, 0, 2, err, sizeof err));
    free(img);
    size_t len;
    unsigned char *buf = tu_read_file(path, &len);
    assert_true(len > 60);
    tu_write_file(path, buf, len / 2);
    free(buf);
    px = (uint8_t *)err;
    CHECK_RC(ts_png_read_gray(path, &px, &w, &h, err, sizeof err), TS_ECORRUPT);
    assert_null(px);
    assert_non_null(strstr(err, "cut.png"));
}

#define DIR_TEST(f) cmocka_unit_test_setup_teardown(f, setup_dir, tu_teardown_temp_dir)

int main(void) {
    const struct CMUnitTest tests[] = {
        DIR_TEST(test_grid_2x3_placement),
        DIR_TEST(test_grid_partial_row_and_no_pad),
        DIR_TEST(test_default_cols),
        DIR_TEST(test_value_mapping),
        DIR_TEST(test_rgb),
        DIR_TEST(test_overwrite_is_atomic),
        DIR_TEST(test_write_errors),
        DIR_TEST(test_read_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
