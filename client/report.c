/*
 * report.c — the self-contained HTML report writer (client/report.h).
 *
 * The page is streamed to a temporary file as the element calls come: the head (charset, title,
 * one stylesheet) at open, each element as one block, and "</body></html>" at close, so the
 * writer holds no document in memory. Every caller string goes through put_esc, the only way text
 * reaches the file. A failure is recorded once in the handle (code and sentence) and every later
 * call returns it: the page can then never be published half-written or with an element missing.
 *
 * The bar chart is plain SVG laid out with fixed metrics (12 px text, about 7 px per character
 * for the label column's width): no fonts are measured, which is good enough for labels of a few
 * words. The image grid is the same PNG that `tessera sample` writes, from the same encoder
 * (ts_png_encode_grid), in base64 in the img's src; its size is read from the PNG's IHDR.
 */
#define _POSIX_C_SOURCE 200809L

#include "client/report.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "model/png.h"

#define REPORT_PATH_MAX 4096
#define CHART_FONT_PX 12
#define CHART_CHAR_PX 7  /* rough advance of one character at CHART_FONT_PX */
#define CHART_BAR_PX 360 /* width of the longest bar */
#define CHART_ROW_PX 24
#define CHART_BAR_H_PX 16
#define CHART_TITLE_PX 24
#define GRID_PAD 2
#define GRID_TARGET_PX 512 /* the grid is enlarged by an integer factor to about this width */
#define GRID_MAX_SCALE 4

struct ts_report {
    ts_atomic_file_t out; /* the temporary being written, published at close (base/file.h) */
    int code;             /* the first failure, sticky; 0 while all is well */
    char msg[512];
};

static const char STYLE[] =
    "body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;"
    "color:#222}\n"
    "table{border-collapse:collapse;margin:1em 0}\n"
    "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}\n"
    "th{background:#f3f3f3}\n"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}\n"
    "figure{margin:1em 0}\n"
    "figcaption{font-size:.9em;color:#555}\n"
    "img.grid{image-rendering:pixelated}\n";

/* ---- errors and output -------------------------------------------------------------------- */

/* Records the first failure (later ones are consequences and are dropped); returns r->code. */
TS_PRINTF(3, 4) static int poison(ts_report_t *r, int code, const char *fmt, ...) {
    if (r->code == 0) {
        r->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg, sizeof r->msg, fmt, ap);
        va_end(ap);
    }
    return r->code;
}

/* printf to the page (format strings are this file's own, never caller text). */
TS_PRINTF(2, 3) static void put(ts_report_t *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(r->out.fp, fmt, ap);
    va_end(ap);
}

/* s HTML-escaped: safe in element content and in a double- or single-quoted attribute. */
static void put_esc(ts_report_t *r, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", r->out.fp); break;
        case '<': fputs("&lt;", r->out.fp); break;
        case '>': fputs("&gt;", r->out.fp); break;
        case '"': fputs("&quot;", r->out.fp); break;
        case '\'': fputs("&#39;", r->out.fp); break;
        default: fputc(*s, r->out.fp);
        }
    }
}

/* Ends an element call: a write error so far poisons the report. Returns r->code. */
static int check_io(ts_report_t *r) {
    if (!r->code && ferror(r->out.fp))
        poison(r, TS_EIO, "cannot write the report %s: %s", r->out.path, strerror(errno));
    return r->code;
}

/* ---- open, close, discard ----------------------------------------------------------------- */

static void free_report(ts_report_t *r) {
    ts_atomic_abort(&r->out); /* nothing left after a commit */
    free(r);
}

int ts_report_open(ts_report_t **out, const char *path, const char *title, char *err,
                   size_t errlen) {
    if (out)
        *out = NULL;
    if (!out || !path || !title) {
        ts_set_err(err, errlen, "ts_report_open: out, path or title is NULL");
        return TS_EINVAL;
    }
    size_t plen = strlen(path);
    if (plen == 0 || plen > REPORT_PATH_MAX) {
        ts_set_err(err, errlen, "report path is empty or longer than %d bytes", REPORT_PATH_MAX);
        return TS_EINVAL;
    }
    ts_report_t *r = calloc(1, sizeof *r);
    if (!r) {
        ts_set_err(err, errlen, "out of memory opening the report %s", path);
        return TS_ENOMEM;
    }
    int e = 0, rc = ts_atomic_open(&r->out, path, &e);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "cannot create a temporary file next to the report %s: %s", path,
                   e ? strerror(e) : ts_strerror(rc));
        free(r);
        return rc;
    }
    put(r, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>");
    put_esc(r, title);
    put(r, "</title>\n<style>\n%s</style>\n</head>\n<body>\n", STYLE);
    if (check_io(r)) {
        ts_set_err(err, errlen, "%s", r->msg);
        free_report(r);
        return TS_EIO;
    }
    *out = r;
    return TS_OK;
}

int ts_report_close(ts_report_t *r, char *err, size_t errlen) {
    if (!r) {
        ts_set_err(err, errlen, "ts_report_close: the report is NULL");
        return TS_EINVAL;
    }
    if (!r->code) {
        put(r, "</body>\n</html>\n");
        char path[REPORT_PATH_MAX + 1];
        snprintf(path, sizeof path, "%s", r->out.path);
        int e = 0;
        if (ts_atomic_commit(&r->out, 1, &e) != TS_OK)
            poison(r, TS_EIO, "cannot write the report %s: %s", path,
                   e ? strerror(e) : "I/O error");
    }
    int rc = r->code;
    if (rc)
        ts_set_err(err, errlen, "%s", r->msg);
    free_report(r);
    return rc;
}

void ts_report_discard(ts_report_t *r) {
    if (r)
        free_report(r);
}

/* ---- text elements ------------------------------------------------------------------------ */

int ts_report_heading(ts_report_t *r, int level, const char *text) {
    if (!r)
        return TS_EINVAL;
    if (r->code)
        return r->code;
    if (!text || level < 1 || level > 6)
        return poison(r, TS_EINVAL, "ts_report_heading: NULL text or level %d not in [1, 6]",
                      level);
    put(r, "<h%d>", level);
    put_esc(r, text);
    put(r, "</h%d>\n", level);
    return check_io(r);
}

int ts_report_paragraph(ts_report_t *r, const char *text) {
    if (!r)
        return TS_EINVAL;
    if (r->code)
        return r->code;
    if (!text)
        return poison(r, TS_EINVAL, "ts_report_paragraph: NULL text");
    put(r, "<p>");
    put_esc(r, text);
    put(r, "</p>\n");
    return check_io(r);
}

/* Whether all of s reads as a number. */
static int is_number(const char *s) {
    char *end;
    if (!*s)
        return 0;
    strtod(s, &end);
    return end != s && *end == '\0';
}

int ts_report_table(ts_report_t *r, int cols, int rows, const char *const *cells) {
    if (!r)
        return TS_EINVAL;
    if (r->code)
        return r->code;
    if (!cells || cols < 1 || rows < 1)
        return poison(r, TS_EINVAL, "ts_report_table: NULL cells or a %d×%d table (need ≥ 1×1)",
                      rows, cols);
    put(r, "<table>\n<thead>\n<tr>");
    for (int c = 0; c < cols; c++) {
        put(r, "<th scope=\"col\">");
        put_esc(r, cells[c] ? cells[c] : "");
        put(r, "</th>");
    }
    put(r, "</tr>\n</thead>\n<tbody>\n");
    for (int i = 1; i < rows; i++) {
        put(r, "<tr>");
        for (int c = 0; c < cols; c++) {
            const char *s = cells[(size_t)i * cols + c];
            s = s ? s : "";
            put(r, is_number(s) ? "<td class=\"num\">" : "<td>");
            put_esc(r, s);
            put(r, "</td>");
        }
        put(r, "</tr>\n");
    }
    put(r, "</tbody>\n</table>\n");
    return check_io(r);
}

/* ---- the bar chart ------------------------------------------------------------------------ */

/* The number of characters (UTF-8 code points) of s. */
static int utf8_chars(const char *s) {
    int n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* The value label of v: "%.4g" or "n/a". */
static void format_value(char *buf, size_t len, double v) {
    if (isfinite(v))
        snprintf(buf, len, "%.4g", v);
    else
        snprintf(buf, len, "n/a");
}

/* Opens a chart: <figure><svg> of width × height with title as its label, tooltip and heading. */
static void svg_open(ts_report_t *r, const char *title, int width, int height) {
    put(r,
        "<figure class=\"chart\">\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
        "height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"",
        width, height, width, height);
    put_esc(r, title);
    put(r, "\" font-family=\"system-ui,sans-serif\" font-size=\"%d\">\n<title>", CHART_FONT_PX);
    put_esc(r, title);
    put(r, "</title>\n<text x=\"0\" y=\"16\" font-weight=\"bold\">");
    put_esc(r, title);
    put(r, "</text>\n");
}

int ts_report_bar_chart_svg(ts_report_t *r, const char *title, const char *const *labels,
                            const double *values, int n, const char *unit) {
    if (!r)
        return TS_EINVAL;
    if (r->code)
        return r->code;
    if (!title || !labels || !values || n < 1)
        return poison(r, TS_EINVAL, "ts_report_bar_chart_svg: NULL argument or %d bars", n);
    int label_chars = 0, value_chars = 0;
    double vmax = 0.0;
    int has_unit = unit && *unit;
    for (int i = 0; i < n; i++) {
        if (!labels[i])
            return poison(r, TS_EINVAL, "ts_report_bar_chart_svg: label %d is NULL", i);
        char vb[64];
        format_value(vb, sizeof vb, values[i]);
        int lc = utf8_chars(labels[i]);
        int vc = (int)strlen(vb) + (has_unit ? 1 + utf8_chars(unit) : 0);
        label_chars = lc > label_chars ? lc : label_chars;
        value_chars = vc > value_chars ? vc : value_chars;
        if (isfinite(values[i]) && values[i] > vmax)
            vmax = values[i];
    }
    int label_w = label_chars * CHART_CHAR_PX + 12;
    int value_w = value_chars * CHART_CHAR_PX + 12;
    int width = label_w + CHART_BAR_PX + value_w;
    int height = CHART_TITLE_PX + n * CHART_ROW_PX + 8;

    svg_open(r, title, width, height);
    for (int i = 0; i < n; i++) {
        double v = values[i];
        double frac = isfinite(v) && v > 0.0 && vmax > 0.0 ? v / vmax : 0.0;
        double bw = frac * CHART_BAR_PX;
        int top = CHART_TITLE_PX + i * CHART_ROW_PX;
        int text_y = top + (CHART_ROW_PX + CHART_FONT_PX) / 2 - 2;
        char vb[64];
        format_value(vb, sizeof vb, v);
        put(r, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", label_w - 6, text_y);
        put_esc(r, labels[i]);
        put(r, "</text>\n<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#4c78a8\"/>\n",
            label_w, top + (CHART_ROW_PX - CHART_BAR_H_PX) / 2, bw, CHART_BAR_H_PX);
        put(r, "<text x=\"%.1f\" y=\"%d\">%s", label_w + bw + 4, text_y, vb);
        if (has_unit) {
            put(r, " ");
            put_esc(r, unit);
        }
        put(r, "</text>\n");
    }
    put(r, "</svg>\n</figure>\n");
    return check_io(r);
}

/* ---- the scatter plot -------------------------------------------------------------------- */

#define SCATTER_W 560 /* plot area */
#define SCATTER_H 320
#define SCATTER_LEFT 56
#define SCATTER_RIGHT 220 /* room for the labels of the rightmost points */
#define SCATTER_BOTTOM 44

/* A round tick step for [*lo, *hi] (1, 2 or 5 × 10^k, about 5 ticks), and the range widened to
 * whole steps. An empty range becomes [lo, lo + 1]. */
static double round_axis(double *lo, double *hi) {
    if (!(*hi > *lo))
        *hi = *lo + 1;
    double raw = (*hi - *lo) / 5, mag = pow(10, floor(log10(raw))), step = mag;
    if (raw / mag > 5)
        step = 10 * mag;
    else if (raw / mag > 2)
        step = 5 * mag;
    else if (raw / mag > 1)
        step = 2 * mag;
    *hi = ceil(*hi / step) * step;
    *lo = floor(*lo / step) * step;
    return step;
}

/* A plot's frame, y ticks with grid lines over [ymin, ymax] every ystep, the x tick labels xv[i]
 * at the pixel columns xpx[i], and both axis labels (the scatter and the line plot share it). */
static void plot_axes(ts_report_t *r, double ymin, double ymax, double ystep, const double *xv,
                      const double *xpx, int nx, const char *xlabel, const char *ylabel) {
    put(r, "<path d=\"M%d %d V%d H%d\" stroke=\"#444\" fill=\"none\"/>\n", SCATTER_LEFT,
        CHART_TITLE_PX, CHART_TITLE_PX + SCATTER_H, SCATTER_LEFT + SCATTER_W);
    char vb[64];
    for (double v = ymin; v <= ymax + ystep / 2; v += ystep) {
        double py = CHART_TITLE_PX + (1.0 - (v - ymin) / (ymax - ymin)) * SCATTER_H;
        format_value(vb, sizeof vb, v);
        put(r, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", SCATTER_LEFT - 6,
            py + 4, vb);
        put(r, "<path d=\"M%d %.1f H%d\" stroke=\"#ddd\"/>\n", SCATTER_LEFT, py,
            SCATTER_LEFT + SCATTER_W);
    }
    for (int i = 0; i < nx; i++) {
        format_value(vb, sizeof vb, xv[i]);
        put(r, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", xpx[i],
            CHART_TITLE_PX + SCATTER_H + 16, vb);
    }
    put(r, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", SCATTER_LEFT + SCATTER_W / 2,
        CHART_TITLE_PX + SCATTER_H + 36);
    put_esc(r, xlabel);
    put(r,
        "</text>\n<text x=\"12\" y=\"%d\" transform=\"rotate(-90 12 %d)\" "
        "text-anchor=\"middle\">",
        CHART_TITLE_PX + SCATTER_H / 2, CHART_TITLE_PX + SCATTER_H / 2);
    put_esc(r, ylabel);
    put(r, "</text>\n");
}

int ts_report_lines_svg(ts_report_t *r, const char *title, const char *xlabel, const char *ylabel,
                        const char *const *labels, const double *x, const double *y, int n_series,
                        int n_points) {
    static const char *const colours[] = {"#4c78a8", "#f58518", "#54a24b", "#e45756",
                                          "#72b7b2", "#b279a2", "#eeca3b", "#9d755d"};
    if (!r)
        return TS_EINVAL;
    if (r->code)
        return r->code;
    if (!title || !xlabel || !ylabel || !labels || !x || !y || n_series < 1 || n_points < 1)
        return poison(r, TS_EINVAL, "ts_report_lines_svg: NULL argument or %d series of %d points",
                      n_series, n_points);
    double xmin = INFINITY, xmax = -INFINITY, ymin = 0.0, ymax = -INFINITY;
    for (int i = 0; i < n_points; i++)
        if (isfinite(x[i]))
            xmin = fmin(xmin, x[i]), xmax = fmax(xmax, x[i]);
    for (int s = 0; s < n_series; s++) {
        if (!labels[s])
            return poison(r, TS_EINVAL, "ts_report_lines_svg: label %d is NULL", s);
        for (int i = 0; i < n_points; i++) {
            double v = y[(size_t)s * n_points + i];
            if (isfinite(v) && isfinite(x[i]))
                ymin = fmin(ymin, v), ymax = fmax(ymax, v);
        }
    }
    if (!isfinite(xmin))
        xmin = 0, xmax = 1;
    if (!isfinite(ymax))
        ymax = 1;
    double xstep = round_axis(&xmin, &xmax), ystep = round_axis(&ymin, &ymax);
    svg_open(r, title, SCATTER_LEFT + SCATTER_W + SCATTER_RIGHT,
             CHART_TITLE_PX + SCATTER_H + SCATTER_BOTTOM);
#define PX(v) (SCATTER_LEFT + ((v)-xmin) / (xmax - xmin) * SCATTER_W)
#define PY(v) (CHART_TITLE_PX + (1.0 - ((v)-ymin) / (ymax - ymin)) * SCATTER_H)
    enum { MAX_TICKS = 64 };
    double xv[MAX_TICKS], xpx[MAX_TICKS];
    int nx = 0;
    for (double v = xmin; v <= xmax + xstep / 2 && nx < MAX_TICKS; v += xstep, nx++)
        xv[nx] = v, xpx[nx] = PX(v);
    plot_axes(r, ymin, ymax, ystep, xv, xpx, nx, xlabel, ylabel);
    for (int s = 0; s < n_series; s++) {
        const char *colour = colours[s % (int)(sizeof colours / sizeof colours[0])];
        put(r, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" d=\"", colour);
        int pen = 0; /* a point that is not finite lifts the pen */
        for (int i = 0; i < n_points; i++) {
            double v = y[(size_t)s * n_points + i];
            if (!isfinite(v) || !isfinite(x[i])) {
                pen = 0;
                continue;
            }
            put(r, "%s%.1f %.1f ", pen ? "L" : "M", PX(x[i]), PY(v));
            pen = 1;
        }
        put(r, "\"/>\n<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>\n",
            SCATTER_LEFT + SCATTER_W + 12, CHART_TITLE_PX + 4 + 16 * s, colour);
        put(r, "<text x=\"%d\" y=\"%d\" font-size=\"10\">", SCATTER_LEFT + SCATTER_W + 26,
            CHART_TITLE_PX + 13 + 16 * s);
        put_esc(r, labels[s]);
        put(r, "</text>\n");
    }
#undef PX
#undef PY
    put(r, "</svg>\n</figure>\n");
    return check_io(r);
}

int ts_report_scatter_svg(ts_report_t *r, const char *title, const char *xlabel, const char *ylabel,
                          const char *const *labels, const double *x, const double *y,
                          const double *lo, const double *hi, int n) {
    if (!r)
        return TS_EINVAL;
    if (r->code)
        return r->code;
    if (!title || !xlabel || !ylabel || !labels || !x || !y || !lo || !hi || n < 1)
        return poison(r, TS_EINVAL, "ts_report_scatter_svg: NULL argument or %d points", n);
    double xmin = INFINITY, xmax = -INFINITY, ymin = 0.0, ymax = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (!labels[i])
            return poison(r, TS_EINVAL, "ts_report_scatter_svg: label %d is NULL", i);
        if (!(isfinite(x[i]) && x[i] > 0 && isfinite(y[i]) && isfinite(lo[i]) && isfinite(hi[i])))
            continue;
        xmin = fmin(xmin, x[i]), xmax = fmax(xmax, x[i]);
        ymin = fmin(ymin, lo[i]), ymax = fmax(ymax, fmax(hi[i], y[i]));
    }
    if (!isfinite(xmin)) /* nothing to draw */
        xmin = 1, xmax = 10, ymax = 1;
    double lx0 = floor(log10(xmin)), lx1 = ceil(log10(xmax));
    if (lx1 <= lx0)
        lx1 = lx0 + 1;
    double step = round_axis(&ymin, &ymax);
    int width = SCATTER_LEFT + SCATTER_W + SCATTER_RIGHT;
    int height = CHART_TITLE_PX + SCATTER_H + SCATTER_BOTTOM;
#define PX(v) (SCATTER_LEFT + (log10(v) - lx0) / (lx1 - lx0) * SCATTER_W)
#define PY(v) (CHART_TITLE_PX + (1.0 - ((v)-ymin) / (ymax - ymin)) * SCATTER_H)
    svg_open(r, title, width, height);
    /* axes and ticks */
    enum { MAX_TICKS = 64 };
    double xv[MAX_TICKS], xpx[MAX_TICKS];
    int nx = 0;
    for (double e = lx0; e <= lx1 + 0.5 && nx < MAX_TICKS; e += 1, nx++)
        xv[nx] = pow(10, e), xpx[nx] = PX(xv[nx]);
    plot_axes(r, ymin, ymax, step, xv, xpx, nx, xlabel, ylabel);
    for (int i = 0; i < n; i++) {
        if (!(isfinite(x[i]) && x[i] > 0 && isfinite(y[i]) && isfinite(lo[i]) && isfinite(hi[i])))
            continue;
        double px = PX(x[i]);
        put(r, "<path d=\"M%.1f %.1f V%.1f M%.1f %.1f h8 M%.1f %.1f h8\" stroke=\"#4c78a8\"/>\n",
            px, PY(lo[i]), PY(hi[i]), px - 4, PY(lo[i]), px - 4, PY(hi[i]));
        put(r, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#4c78a8\"/>\n", px, PY(y[i]));
        put(r, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">", px + 7, PY(y[i]) + 3);
        put_esc(r, labels[i]);
        put(r, "</text>\n");
    }
#undef PX
#undef PY
    put(r, "</svg>\n</figure>\n");
    return check_io(r);
}

/* ---- the image grid ----------------------------------------------------------------------- */

/* The base64 (RFC 4648, padded, no line breaks) of data[0..len) to the page. */
static void put_base64(ts_report_t *r, const unsigned char *data, size_t len) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char q[4];
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)data[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)data[i + 1] << 8;
        if (i + 2 < len)
            v |= data[i + 2];
        q[0] = A[(v >> 18) & 63];
        q[1] = A[(v >> 12) & 63];
        q[2] = i + 1 < len ? A[(v >> 6) & 63] : '=';
        q[3] = i + 2 < len ? A[v & 63] : '=';
        fwrite(q, 1, 4, r->out.fp);
    }
}

/* Big-endian 32-bit at p. */
static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int ts_report_png_grid(ts_report_t *r, const float *images, int n, int C, int H, int W, int cols,
                       const char *caption) {
    if (!r)
        return TS_EINVAL;
    if (r->code)
        return r->code;
    unsigned char *png = NULL;
    size_t len = 0;
    char msg[256] = "";
    int rc = ts_png_encode_grid(images, n, C, H, W, cols, GRID_PAD, &png, &len, msg, sizeof msg);
    if (rc)
        return poison(r, rc, "report image grid: %s", msg);
    /* signature (8), IHDR length (4) and type (4), then width and height */
    if (len < 24) {
        free(png);
        return poison(r, TS_ECORRUPT, "report image grid: the encoder gave %zu bytes", len);
    }
    uint32_t pw = be32(png + 16), ph = be32(png + 20);
    uint32_t scale = pw >= GRID_TARGET_PX ? 1 : GRID_TARGET_PX / pw;
    scale = scale > GRID_MAX_SCALE ? GRID_MAX_SCALE : scale;
    put(r, "<figure>\n<img class=\"grid\" width=\"%lu\" height=\"%lu\" alt=\"",
        (unsigned long)(pw * scale), (unsigned long)(ph * scale));
    put_esc(r, caption ? caption : "image grid");
    put(r, "\" src=\"data:image/png;base64,");
    put_base64(r, png, len);
    put(r, "\">\n");
    free(png);
    if (caption) {
        put(r, "<figcaption>");
        put_esc(r, caption);
        put(r, "</figcaption>\n");
    }
    put(r, "</figure>\n");
    return check_io(r);
}
