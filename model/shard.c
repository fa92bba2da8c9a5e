/*
 * shard.c — shard files (model/shard.h). They are parsed line by line with getline; duplicates
 * are found by sorting (index, line) pairs, which costs memory in proportion to the file rather
 * than to `limit`.
 */
#define _POSIX_C_SOURCE 200809L

#include "model/shard.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"

typedef struct shard_entry {
    int32_t index;
    long line;
} shard_entry_t;

static int entry_cmp(const void *a, const void *b) {
    const shard_entry_t *x = a, *y = b;
    if (x->index != y->index)
        return x->index < y->index ? -1 : 1;
    return (x->line > y->line) - (x->line < y->line);
}

/* Finds the duplicate whose second occurrence comes first in the file. Returns 1 and fills
 * *index, *first (its first line) and *again (its second line) when there is one; sorts e. */
static int find_duplicate(shard_entry_t *e, size_t n, int32_t *index, long *first, long *again) {
    if (n < 2)
        return 0; /* also keeps a NULL e (empty shard) away from qsort */
    qsort(e, n, sizeof *e, entry_cmp);
    int found = 0;
    size_t start = 0; /* the first entry of the current run of equal indices */
    for (size_t i = 1; i < n; i++) {
        if (e[i].index != e[start].index) {
            start = i;
            continue;
        }
        /* runs are sorted by line: e[start] is the first occurrence, e[start + 1] the second */
        if (i == start + 1 && (!found || e[i].line < *again)) {
            *index = e[i].index;
            *first = e[start].line;
            *again = e[i].line;
            found = 1;
        }
    }
    return found;
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* Parses one line: sets *has to 0 for a blank or comment line, else 1, *value and the digits'
 * span (*digits, *ndigits) for messages. A value beyond INT64_MAX / 10 saturates there, which is
 * out of range for any limit. Returns 0, or -1 when the line is not one non-negative decimal
 * index. */
static int parse_shard_line(const char *s, int *has, int64_t *value, const char **digits,
                            int *ndigits) {
    while (is_blank(*s))
        s++;
    *has = 0;
    if (*s == '\0' || *s == '#')
        return 0;
    if (*s < '0' || *s > '9')
        return -1;
    *digits = s;
    int64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        v = v < INT64_MAX / 100 ? v * 10 + (*s - '0') : INT64_MAX / 10;
    *ndigits = (int)(s - *digits < 40 ? s - *digits : 40);
    while (is_blank(*s))
        s++;
    if (*s != '\0' && *s != '#')
        return -1;
    *has = 1;
    *value = v;
    return 0;
}

int ts_shard_read(const char *path, int32_t **idx, int *n, int limit, char *err, size_t errlen) {
    if (idx)
        *idx = NULL;
    if (n)
        *n = 0;
    if (!path || !idx || !n || limit < 0)
        return ts_fail(err, errlen, TS_EINVAL, "ts_shard_read: NULL argument or negative limit");
    FILE *fp = fopen(path, "r");
    if (!fp)
        return ts_fail(err, errlen, TS_EIO, "cannot open shard file %s: %s", path, strerror(errno));

    shard_entry_t *e = NULL;
    size_t count = 0, cap = 0, linecap = 0;
    char *line = NULL;
    long lineno = 0;
    int rc = TS_OK;
    errno = 0;
    /* count > limit means a duplicate already (all indices are < limit): stop and report it */
    while (count <= (size_t)limit && getline(&line, &linecap, fp) >= 0) {
        lineno++;
        int has, ndigits = 0;
        int64_t v = 0;
        const char *digits = NULL;
        if (parse_shard_line(line, &has, &v, &digits, &ndigits) != 0) {
            line[strcspn(line, "\r\n")] = '\0';
            rc = ts_fail(err, errlen, TS_ECORRUPT,
                         "%s:%ld: expected one non-negative decimal index, got \"%.60s\"", path,
                         lineno, line);
            break;
        }
        if (!has)
            continue;
        if (v >= limit) {
            rc = ts_fail(err, errlen, TS_ERANGE,
                         "%s:%ld: index %.*s is out of range: the dataset has %d items (0..%d)",
                         path, lineno, ndigits, digits, limit, limit - 1);
            break;
        }
        if (count == cap) {
            size_t next = cap ? cap * 2 : 1024;
            shard_entry_t *grown = realloc(e, next * sizeof *e);
            if (!grown) {
                rc = ts_fail(err, errlen, TS_ENOMEM, "%s: out of memory for %zu indices", path,
                             next);
                break;
            }
            e = grown;
            cap = next;
        }
        e[count].index = (int32_t)v;
        e[count].line = lineno;
        count++;
    }
    if (!rc && ferror(fp))
        rc = ts_fail(err, errlen, TS_EIO, "cannot read shard file %s: %s", path, strerror(errno));
    free(line);
    fclose(fp);

    int32_t *out = NULL;
    if (!rc && count > 0) {
        out = malloc(count * sizeof *out);
        if (!out)
            rc = ts_fail(err, errlen, TS_ENOMEM, "%s: out of memory for %zu indices", path, count);
    }
    if (!rc) {
        for (size_t i = 0; i < count; i++) /* in file order, before find_duplicate sorts e */
            out[i] = e[i].index;
        int32_t dup = 0;
        long first = 0, again = 0;
        if (find_duplicate(e, count, &dup, &first, &again))
            rc = ts_fail(err, errlen, TS_ECORRUPT,
                         "%s:%ld: index %d appears twice (first on line %ld)", path, again, dup,
                         first);
    }
    free(e);
    if (rc) {
        free(out);
        return rc;
    }
    *idx = out;
    *n = (int)count;
    return TS_OK;
}

static int int32_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Checks that idx[0..n) is non-negative and distinct. */
static int check_shard_indices(const int32_t *idx, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        if (idx[i] < 0)
            return ts_fail(err, errlen, TS_EINVAL, "shard index %d (position %d) is negative",
                           idx[i], i);
    if (n < 2)
        return TS_OK;
    int32_t *sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted)
        return ts_fail(err, errlen, TS_ENOMEM, "out of memory for %d shard indices", n);
    memcpy(sorted, idx, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, int32_cmp);
    int rc = TS_OK;
    for (int i = 1; i < n; i++)
        if (sorted[i] == sorted[i - 1]) {
            rc = ts_fail(err, errlen, TS_EINVAL, "shard index %d appears twice", sorted[i]);
            break;
        }
    free(sorted);
    return rc;
}

int ts_shard_write(const char *path, const int32_t *idx, int n, char *err, size_t errlen) {
    if (!path || n < 0 || (n > 0 && !idx))
        return ts_fail(err, errlen, TS_EINVAL, "ts_shard_write: NULL argument or negative count");
    int rc = check_shard_indices(idx, n, err, errlen);
    if (rc)
        return rc;

    ts_atomic_file_t a;
    int e = 0;
    if ((rc = ts_atomic_open(&a, path, &e)) != TS_OK)
        return ts_fail(err, errlen, rc, "cannot create a temporary file next to %s: %s", path,
                       e ? strerror(e) : ts_strerror(rc));
    int ok = fprintf(a.fp, "# tessera shard: %d indices\n", n) > 0;
    for (int i = 0; ok && i < n; i++)
        ok = fprintf(a.fp, "%d\n", (int)idx[i]) > 0;
    e = ok ? 0 : errno;
    rc = ts_atomic_commit(&a, ok, &e);
    return rc ? ts_fail(err, errlen, rc, "cannot write %s: %s", path, e ? strerror(e) : "I/O error")
              : TS_OK;
}
