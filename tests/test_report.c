/*
 * test_report.c — the HTML report writer (client/report.h) and the in-memory PNG encoder it
 * embeds (ts_png_encode_grid, model/png.h).
 *
 * Covers: a report with every element is well-formed for the tags it emits (a stack parser over
 * the whole file: every tag known, every one closed in order), every caller string is escaped
 * (text, cells, labels, units, captions, the title, in content and in attributes), the bar chart
 * is scaled to its largest value and labels a NaN "n/a", the embedded image decodes from base64
 * to a PNG whose bytes are those of ts_png_encode_grid and whose pixels are the grid's; the file
 * appears only complete (nothing at path before close, an old file untouched until then and by a
 * discard or a failed report, no temporary left behind); the refusals; ts_png_encode_grid gives
 * the same bytes ts_png_write_grid writes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/report.h"
#include "model/png.h"
#include "tests/testutil.h"

#define CHECK_RC(expr, want) TU_CHECK_RC_MSG(expr, want, err)
#define CHECK_OK(expr) CHECK_RC(expr, TS_OK)

static char err[512];

static int setup_dir(void **state) {
    err[0] = '\0';
    return tu_setup_temp_dir(state);
}

/* The tags the writer emits; anything else in the file would be injected markup. */
static const char *const KNOWN_TAGS[] = {
    "html", "head",   "meta",       "title", "style", "body",  "h1",    "h2",   "h3",
    "h4",   "h5",     "h6",         "p",     "table", "thead", "tbody", "tr",   "th",
    "td",   "figure", "figcaption", "svg",   "text",  "rect",  "img",   "path", "circle"};
static const char *const VOID_TAGS[] = {"meta", "img"};

static int in_list(const char *name, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(name, list[i]) == 0)
            return 1;
    return 0;
}

/* Fails unless html's tags are all known and balanced (void tags and "/>" need no close). */
static void check_well_formed(const char *html) {
    char stack[64][16];
    int depth = 0;
    const char *p = html;
    if (strncmp(p, "<!DOCTYPE html>\n", 16) != 0)
        fail_msg("the report does not start with <!DOCTYPE html>");
    p += 16;
    while ((p = strchr(p, '<')) != NULL) {
        const char *end = strchr(p, '>');
        if (!end)
            fail_msg("unterminated tag at byte %ld", (long)(p - html));
        int closing = p[1] == '/';
        const char *s = p + 1 + closing;
        char name[16];
        size_t len = strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789");
        if (len == 0 || len >= sizeof name)
            fail_msg("bad tag at byte %ld: %.20s", (long)(p - html), p);
        memcpy(name, s, len);
        name[len] = '\0';
        if (!in_list(name, KNOWN_TAGS, sizeof KNOWN_TAGS / sizeof *KNOWN_TAGS))
            fail_msg("unexpected tag <%s> at byte %ld", name, (long)(p - html));
        if (closing) {
            if (depth == 0 || strcmp(stack[depth - 1], name) != 0)
                fail_msg("</%s> at byte %ld closes <%s>", name, (long)(p - html),
                         depth ? stack[depth - 1] : "(nothing)");
            depth--;
        } else if (end[-1] != '/' && !in_list(name, VOID_TAGS, 2)) {
            assert_true(depth < 64);
            memcpy(stack[depth++], name, len + 1);
        }
        p = end + 1;
    }
    if (depth != 0)
        fail_msg("<%s> is never closed", stack[depth - 1]);
}

/* The base64 of src (up to the first character outside the alphabet) decoded into a malloc'ed
 * buffer; *len its length. */
static unsigned char *base64_decode(const char *src, size_t *len) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = strspn(src, A);
    size_t pad = strspn(src + n, "=");
    assert_true((n + pad) % 4 == 0);
    unsigned char *out = malloc(n * 3 / 4 + 3);
    assert_non_null(out);
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        acc = acc << 6 | (uint32_t)(strchr(A, src[i]) - A);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    *len = o;
    return out;
}

static int count(const char *hay, const char *needle) {
    int k = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        k++;
    return k;
}

/* n grey H×W tiles, tile i filled with the value of byte 40·i + 10. Caller frees. */
static float *tiles(int n, int H, int W) {
    float *img = tu_floats((int64_t)n * H * W);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < H * W; k++)
            img[i * H * W + k] = (float)(40 * i + 10) / 127.5f - 1.0f;
    return img;
}

static void test_report_contents(void **state) {
    (void)state;
    const char *path = tu_temp_path("report.html");
    ts_report_t *r = NULL;
    CHECK_OK(ts_report_open(&r, path, "FD <by> policy & \"more\"", err, sizeof err));
    CHECK_OK(ts_report_heading(r, 1, "Evaluation <K=8>"));
    CHECK_OK(ts_report_paragraph(r, "<script>alert('x') & \"q\"</script>"));
    const char *cells[] = {"policy", "FD", "top1 <a>", "12.5", "full", NULL, "it's", "1e-3"};
    CHECK_OK(ts_report_table(r, 2, 4, cells));
    const char *labels[] = {"monolith", "top1 <b>", "broken"};
    const double values[] = {20.0, 10.0, NAN};
    CHECK_OK(ts_report_bar_chart_svg(r, "FD (lower is better) <&>", labels, values, 3, "<u>"));
    float *img = tiles(5, 4, 6);
    CHECK_OK(ts_report_png_grid(r, img, 5, 1, 4, 6, 0, "samples \"top1\" <grid>"));
    assert_int_equal(access(path, F_OK), -1);           /* nothing published before close */
    assert_int_equal(tu_count_files(tu_temp_dir()), 1); /* the temporary */
    CHECK_OK(ts_report_close(r, err, sizeof err));
    assert_int_equal(tu_count_files(tu_temp_dir()), 1); /* the report, no temporary left */

    size_t len;
    char *html = (char *)tu_read_file(path, &len);
    html[len] = '\0';
    check_well_formed(html);
    assert_int_equal(strcmp(html + len - 8, "</html>\n"), 0);

    /* escaping, in content and attributes */
    assert_null(strstr(html, "<script"));
    assert_non_null(
        strstr(html, "<p>&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;q&quot;&lt;/script&gt;</p>"));
    assert_non_null(strstr(html, "<title>FD &lt;by&gt; policy &amp; &quot;more&quot;</title>"));
    assert_non_null(strstr(html, "<h1>Evaluation &lt;K=8&gt;</h1>"));
    assert_non_null(strstr(html, "<th scope=\"col\">policy</th><th scope=\"col\">FD</th>"));
    assert_non_null(strstr(html, "<td>top1 &lt;a&gt;</td><td class=\"num\">12.5</td>"));
    assert_non_null(strstr(html, "<td>full</td><td></td>"));
    assert_non_null(strstr(html, "<td>it&#39;s</td><td class=\"num\">1e-3</td>"));
    assert_non_null(strstr(html, "aria-label=\"FD (lower is better) &lt;&amp;&gt;\""));
    assert_non_null(strstr(html, ">top1 &lt;b&gt;</text>"));
    assert_non_null(strstr(html, "alt=\"samples &quot;top1&quot; &lt;grid&gt;\""));
    assert_non_null(strstr(html, "<figcaption>samples &quot;top1&quot; &lt;grid&gt;</figcaption>"));

    /* the chart: one bar per value, the largest full width, half of it for half the value */
    assert_int_equal(count(html, "<rect "), 3);
    assert_non_null(strstr(html, "width=\"360.0\" height=\"16\""));
    assert_non_null(strstr(html, "width=\"180.0\" height=\"16\""));
    assert_non_null(strstr(html, "width=\"0.0\" height=\"16\""));
    assert_non_null(strstr(html, ">20 &lt;u&gt;</text>"));
    assert_non_null(strstr(html, ">n/a &lt;u&gt;</text>"));

    /* the image: base64 of exactly the encoder's PNG, 3 columns × 2 rows of 6×4 tiles + pad 2 */
    const char *uri = strstr(html, "src=\"data:image/png;base64,");
    assert_non_null(uri);
    size_t png_len;
    unsigned char *png = base64_decode(uri + strlen("src=\"data:image/png;base64,"), &png_len);
    static const unsigned char SIG[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    assert_true(png_len > 8 && memcmp(png, SIG, 8) == 0);
    unsigned char *want = NULL;
    size_t want_len = 0;
    CHECK_OK(ts_png_encode_grid(img, 5, 1, 4, 6, 0, 2, &want, &want_len, err, sizeof err));
    assert_int_equal(png_len, want_len);
    assert_memory_equal(png, want, png_len);
    tu_write_file(tu_temp_path("grid.png"), png, png_len);
    uint8_t *pix = NULL;
    int w = 0, h = 0;
    CHECK_OK(ts_png_read_gray(tu_temp_path("grid.png"), &pix, &w, &h, err, sizeof err));
    assert_int_equal(w, 3 * 6 + 2 * 2);
    assert_int_equal(h, 2 * 4 + 2);
    assert_int_equal(pix[0], 10);                                /* tile 0 */
    assert_int_equal(pix[(size_t)6 * w + 8], 10 + 40 * 4);       /* tile 4: row 1, column 1 */
    assert_int_equal(pix[6], TS_PNG_BACKGROUND);                 /* padding */
    assert_non_null(strstr(html, "width=\"88\" height=\"40\"")); /* enlarged 4× */
    free(pix);
    free(png);
    free(want);
    free(img);
    free(html);
}

static void test_report_atomic(void **state) {
    (void)state;
    const char *path = tu_temp_path("r.html");
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    tu_write_file(p, "old", 3);

    /* discarded: the old file stays, the temporary goes */
    ts_report_t *r = NULL;
    CHECK_OK(ts_report_open(&r, p, "t", err, sizeof err));
    CHECK_OK(ts_report_paragraph(r, "new"));
    size_t len;
    unsigned char *got = tu_read_file(p, &len);
    assert_true(len == 3 && memcmp(got, "old", 3) == 0);
    free(got);
    assert_int_equal(tu_count_files(tu_temp_dir()), 2);
    ts_report_discard(r);
    got = tu_read_file(p, &len);
    assert_true(len == 3 && memcmp(got, "old", 3) == 0);
    free(got);
    assert_int_equal(tu_count_files(tu_temp_dir()), 1);

    /* a failure is sticky and the report is never published */
    CHECK_OK(ts_report_open(&r, p, "t", err, sizeof err));
    assert_int_equal(ts_report_heading(r, 9, "too deep"), TS_EINVAL);
    assert_int_equal(ts_report_paragraph(r, "fine"), TS_EINVAL);
    float img[4] = {0, 0, 0, 0};
    assert_int_equal(ts_report_png_grid(r, img, 1, 1, 2, 2, 0, NULL), TS_EINVAL);
    CHECK_RC(ts_report_close(r, err, sizeof err), TS_EINVAL);
    assert_non_null(strstr(err, "level 9"));
    got = tu_read_file(p, &len);
    assert_true(len == 3 && memcmp(got, "old", 3) == 0);
    free(got);
    assert_int_equal(tu_count_files(tu_temp_dir()), 1);

    /* a failing element (bad image sizes) also poisons it */
    CHECK_OK(ts_report_open(&r, p, "t", err, sizeof err));
    assert_int_equal(ts_report_png_grid(r, img, 1, 2, 2, 2, 0, "x"), TS_EINVAL);
    CHECK_RC(ts_report_close(r, err, sizeof err), TS_EINVAL);
    assert_non_null(strstr(err, "channels"));
    assert_int_equal(tu_count_files(tu_temp_dir()), 1);

    /* closed: replaced whole */
    CHECK_OK(ts_report_open(&r, p, "t", err, sizeof err));
    CHECK_OK(ts_report_paragraph(r, "new"));
    CHECK_OK(ts_report_close(r, err, sizeof err));
    got = tu_read_file(p, &len);
    got[len] = '\0';
    assert_non_null(strstr((char *)got, "<p>new</p>"));
    check_well_formed((char *)got);
    free(got);
    assert_int_equal(tu_count_files(tu_temp_dir()), 1);
}

/* The scatter plot: a log x axis, a linear y axis from 0, error bars, labels escaped, points that
 * are not finite left out. */
static void test_report_scatter(void **state) {
    (void)state;
    const char *path = tu_temp_path("scatter.html");
    ts_report_t *r = NULL;
    CHECK_OK(ts_report_open(&r, path, "s", err, sizeof err));
    const char *labels[] = {"one", "ten <p>", "hundred", "broken"};
    const double x[] = {1, 10, 100, 5}, y[] = {2, 5, 8, NAN}, lo[] = {1, 4, 7, 1},
                 hi[] = {3, 6, 9, 2};
    CHECK_OK(ts_report_scatter_svg(r, "FD vs cost", "evals", "FD", labels, x, y, lo, hi, 4));
    CHECK_OK(ts_report_close(r, err, sizeof err));
    size_t len;
    char *html = (char *)tu_read_file(path, &len);
    html[len] = '\0';
    check_well_formed(html);
    assert_int_equal(count(html, "<circle "), 3);
    /* x: 10^0..10^2 over 560 px from 56; y: 0..10 (step 2) over 320 px from 24 */
    assert_non_null(strstr(html, "<circle cx=\"56.0\" cy=\"280.0\""));
    assert_non_null(strstr(html, "<circle cx=\"336.0\" cy=\"184.0\""));
    assert_non_null(strstr(html, "<circle cx=\"616.0\" cy=\"88.0\""));
    assert_non_null(strstr(html, "M336.0 216.0 V152.0")); /* the interval [4, 6] */
    assert_non_null(strstr(html, ">ten &lt;p&gt;</text>"));
    assert_null(strstr(html, ">broken</text>"));
    free(html);
    CHECK_OK(ts_report_open(&r, path, "s", err, sizeof err));
    labels[1] = NULL;
    assert_int_equal(ts_report_scatter_svg(r, "t", "x", "y", labels, x, y, lo, hi, 4), TS_EINVAL);
    CHECK_RC(ts_report_close(r, err, sizeof err), TS_EINVAL);
    assert_non_null(strstr(err, "label 1"));
}

/* The line plot: linear axes, one path per series (a non-finite point lifts the pen: two
 * subpaths), the legend escaped, a NULL label refused. */
static void test_report_lines(void **state) {
    (void)state;
    const char *path = tu_temp_path("lines.html");
    ts_report_t *r = NULL;
    CHECK_OK(ts_report_open(&r, path, "l", err, sizeof err));
    const char *labels[] = {"a", "b & c"};
    const double x[] = {0, 0.5, 1}, y[] = {0, 5, 10, 2, NAN, 4};
    CHECK_OK(ts_report_lines_svg(r, "entropy", "t", "bits", labels, x, y, 2, 3));
    CHECK_OK(ts_report_close(r, err, sizeof err));
    size_t len;
    char *html = (char *)tu_read_file(path, &len);
    html[len] = '\0';
    check_well_formed(html);
    /* x: 0..1 over 560 px from 56; y: 0..10 (step 2) over 320 px from 24 */
    assert_non_null(strstr(html, "d=\"M56.0 344.0 L336.0 184.0 L616.0 24.0 \""));
    assert_non_null(strstr(html, "d=\"M56.0 280.0 M616.0 216.0 \""));
    assert_non_null(strstr(html, ">b &amp; c</text>"));
    free(html);
    CHECK_OK(ts_report_open(&r, path, "l", err, sizeof err));
    labels[1] = NULL;
    assert_int_equal(ts_report_lines_svg(r, "t", "x", "y", labels, x, y, 2, 3), TS_EINVAL);
    CHECK_RC(ts_report_close(r, err, sizeof err), TS_EINVAL);
    assert_non_null(strstr(err, "label 1"));
}

static void test_report_errors(void **state) {
    (void)state;
    ts_report_t *r = (ts_report_t *)&r; /* must be reset to NULL on failure */
    CHECK_RC(ts_report_open(&r, tu_temp_path("missing/r.html"), "t", err, sizeof err), TS_EIO);
    assert_null(r);
    assert_non_null(strstr(err, "missing/r.html"));
    assert_int_equal(tu_count_files(tu_temp_dir()), 0);
    CHECK_RC(ts_report_open(&r, NULL, "t", err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_report_open(NULL, "x", "t", err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_report_close(NULL, err, sizeof err), TS_EINVAL);
    assert_int_equal(ts_report_paragraph(NULL, "x"), TS_EINVAL);
    ts_report_discard(NULL);

    CHECK_OK(ts_report_open(&r, tu_temp_path("r.html"), "t", err, sizeof err));
    const char *labels[] = {"a", NULL};
    const double values[] = {1.0, 2.0};
    assert_int_equal(ts_report_bar_chart_svg(r, "t", labels, values, 2, NULL), TS_EINVAL);
    CHECK_RC(ts_report_close(r, err, sizeof err), TS_EINVAL);
    assert_non_null(strstr(err, "label 1"));
    assert_int_equal(tu_count_files(tu_temp_dir()), 0);
}

/* ts_png_encode_grid and ts_png_write_grid share one encoder: the same bytes. */
static void test_png_encode_matches_file(void **state) {
    (void)state;
    tu_rng_t rng = {7};
    float *img = tu_floats(7 * 3 * 5 * 4);
    for (int i = 0; i < 7 * 3 * 5 * 4; i++)
        img[i] = tu_rng_uniform(&rng, -1.2f, 1.2f);
    const char *path = tu_temp_path("g.png");
    CHECK_OK(ts_png_write_grid(path, img, 7, 3, 5, 4, 3, 1, err, sizeof err));
    unsigned char *buf = NULL;
    size_t len = 0, flen = 0;
    CHECK_OK(ts_png_encode_grid(img, 7, 3, 5, 4, 3, 1, &buf, &len, err, sizeof err));
    unsigned char *file = tu_read_file(path, &flen);
    assert_int_equal(len, flen);
    assert_memory_equal(buf, file, len);
    free(buf);
    free(file);

    buf = (unsigned char *)img;
    len = 99;
    CHECK_RC(ts_png_encode_grid(img, 0, 1, 5, 4, 0, 0, &buf, &len, err, sizeof err), TS_EINVAL);
    assert_null(buf);
    assert_int_equal(len, 0);
    assert_non_null(strstr(err, "ts_png_encode_grid"));
    CHECK_RC(ts_png_encode_grid(img, 1, 1, 1, 1, 1, 70000, &buf, &len, err, sizeof err),
             TS_OK); /* one tile: no padding drawn, 1×1 */
    free(buf);
    CHECK_RC(ts_png_encode_grid(img, 2, 1, 1, 1, 2, 70000, &buf, &len, err, sizeof err), TS_ERANGE);
    CHECK_RC(ts_png_encode_grid(img, 1, 1, 1, 1, 1, 0, NULL, &len, err, sizeof err), TS_EINVAL);
    free(img);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_report_contents, setup_dir, tu_teardown_temp_dir),
        cmocka_unit_test_setup_teardown(test_report_atomic, setup_dir, tu_teardown_temp_dir),
        cmocka_unit_test_setup_teardown(test_report_errors, setup_dir, tu_teardown_temp_dir),
        cmocka_unit_test_setup_teardown(test_report_scatter, setup_dir, tu_teardown_temp_dir),
        cmocka_unit_test_setup_teardown(test_report_lines, setup_dir, tu_teardown_temp_dir),
        cmocka_unit_test_setup_teardown(test_png_encode_matches_file, setup_dir,
                                        tu_teardown_temp_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
