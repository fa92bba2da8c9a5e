/*
 * report.h — a self-contained HTML report (what `tessera eval --report` writes): headings,
 * paragraphs, tables, horizontal bar charts as inline SVG, and image grids as PNGs embedded in
 * base64 data URIs. One file, no scripts, no external resources: it opens offline in any browser
 * and can be mailed or archived as is.
 *
 * Usage: ts_report_open, then any sequence of the element calls (each appends one element to the
 * page body, in call order), then ts_report_close — or ts_report_discard to abandon it.
 *
 * The file appears whole or not at all: everything is written to a temporary file next to path
 * (path.tmp.XXXXXX), which ts_report_close flushes, syncs and renames over path. Until then an
 * existing file at path is untouched; ts_report_discard and every failure remove the temporary.
 *
 * Text is text: every string given (title, headings, paragraphs, cells, labels, units, captions)
 * is HTML-escaped (& < > " ' become entities) wherever it lands, in element content or in an
 * attribute; no caller string is ever interpreted as markup. Strings should be UTF-8.
 *
 * Errors are sticky: the element calls return 0 or a negative TS_E* code, and the first failure
 * (a bad argument, out of memory, a write error) poisons the report — later calls do nothing and
 * return the same code, and ts_report_close then removes the temporary, writes that failure's
 * sentence to err and returns its code. A report that had any failure is never published.
 *
 * Ownership: ts_report_open allocates the handle; ts_report_close and ts_report_discard free it
 * (the handle is invalid after either, whatever they return). The element calls copy what they
 * need; the caller keeps its strings and arrays.
 *
 * What it is not: a templating engine or a plotting library. No styling options beyond one
 * built-in stylesheet; three kinds of chart (bars, a scatter with intervals, lines).
 */
#ifndef TS_REPORT_H
#define TS_REPORT_H

#include <stddef.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_report ts_report_t;

/* Starts a report that ts_report_close will publish at path, with the page title title (shown
 * by the browser's tab, not in the page; add a heading for that). On success *out is the new
 * handle. Errors: TS_EINVAL (NULL argument, path too long), TS_EIO (cannot create the temporary
 * file next to path, e.g. the folder does not exist), TS_ENOMEM. */
int ts_report_open(ts_report_t **out, const char *path, const char *title, char *err,
                   size_t errlen);

/* A heading <h1>…<h6>, level in [1, 6]. Errors: TS_EINVAL (NULL r or text, level out of range),
 * TS_EIO. */
int ts_report_heading(ts_report_t *r, int level, const char *text);

/* A paragraph of text. Errors: TS_EINVAL (NULL r or text), TS_EIO. */
int ts_report_paragraph(ts_report_t *r, const char *text);

/* A table of rows × cols cells, cells row-major (rows, cols); row 0 is the header row. A NULL
 * cell is an empty one. Cells that read as a number (all of the cell parses with strtod) are
 * right-aligned. Errors: TS_EINVAL (NULL r or cells, rows or cols < 1), TS_EIO. */
int ts_report_table(ts_report_t *r, int cols, int rows, const char *const *cells);

/* A horizontal bar chart as inline SVG under a title: one bar per value, labels[i] on the left,
 * bars scaled so the largest value spans the full width, each bar followed by its value
 * ("%.4g", then " unit" if unit is neither NULL nor ""). Negative values are drawn as empty
 * bars; a NaN or Inf value as an empty bar labelled "n/a". Errors: TS_EINVAL (NULL r, title,
 * labels, a label or values; n < 1), TS_EIO. */
int ts_report_bar_chart_svg(ts_report_t *r, const char *title, const char *const *labels,
                            const double *values, int n, const char *unit);

/* A scatter plot as inline SVG: point i at (x[i], y[i]) with a vertical bar from lo[i] to hi[i]
 * (an interval; equal to y[i] for none) and labels[i] beside it; the x axis is logarithmic (x
 * must be > 0), the y axis linear from 0 (or the smallest lo, if negative) to the largest hi,
 * with ticks. Points whose values are not finite are left out. Errors: TS_EINVAL (NULL
 * arguments, n < 1), TS_EIO. */
int ts_report_scatter_svg(ts_report_t *r, const char *title, const char *xlabel, const char *ylabel,
                          const char *const *labels, const double *x, const double *y,
                          const double *lo, const double *hi, int n);

/* A line plot as inline SVG: n_series lines over the same n_points x values, y row-major
 * (n_series, n_points); both axes linear (y from 0, or the smallest value if negative), with
 * ticks; a legend of labels on the right, one colour per series (eight, then repeated). A point
 * whose x or y is not finite breaks its line. Errors: TS_EINVAL (NULL arguments, a NULL label,
 * n_series or n_points < 1), TS_EIO. */
int ts_report_lines_svg(ts_report_t *r, const char *title, const char *xlabel, const char *ylabel,
                        const char *const *labels, const double *x, const double *y, int n_series,
                        int n_points);

/* A grid of images (n, C, H, W) with values in [−1, 1] (C = 1 grey, C = 3 RGB), cols columns
 * (0: ceil(sqrt(n))), encoded as one PNG by ts_png_encode_grid (model/png.h; 2 pixels of grey
 * padding), embedded as a data URI, shown enlarged with crisp pixels, with caption under it
 * (caption may be NULL). Errors: those of ts_png_encode_grid, TS_EINVAL (NULL r), TS_EIO. */
int ts_report_png_grid(ts_report_t *r, const float *images, int n, int C, int H, int W, int cols,
                       const char *caption);

/* Ends the page and publishes it: flush, fsync, rename over path. Frees r. Returns 0, the first
 * failure of the element calls (see the top), or TS_EIO (the final write, sync or rename failed;
 * the temporary is removed and path is untouched); err gets the sentence. r may be NULL
 * (TS_EINVAL). */
int ts_report_close(ts_report_t *r, char *err, size_t errlen);

/* Abandons the report: removes the temporary file and frees r; path is untouched. r may be
 * NULL. */
void ts_report_discard(ts_report_t *r);

#ifdef __cplusplus
}
#endif

#endif
