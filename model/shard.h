/*
 * shard.h — shard files. A shard file names the subset of the training set one expert learns
 * from (architecture.md §10: the k-means partition). It is text, one non-negative decimal index
 * per line; blank lines and `#` comments (whole-line or after the index) are allowed.
 *
 * `err`/`errlen`: a failure writes one NUL-terminated sentence there (err may be NULL or errlen 0
 * to not get one).
 */
#ifndef TS_SHARD_H
#define TS_SHARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reads a shard file into *idx (malloc'ed, in file order; the caller frees it) and its length into
 * *n; an empty shard gives *idx = NULL, *n = 0. Every index must be < limit (limit ≥ 0) and
 * appear once. Errors carry "path:line N:" in `err`: TS_EIO (cannot open or read), TS_ECORRUPT
 * (a line that is not an index, a duplicate), TS_ERANGE (an index ≥ limit or beyond INT32_MAX),
 * TS_EINVAL (bad argument), TS_ENOMEM. On failure *idx = NULL and *n = 0. */
int ts_shard_read(const char *path, int32_t **idx, int *n, int limit, char *err, size_t errlen);

/* Writes idx[0..n) as a shard file (a `#` header line, then one index per line), atomically: a
 * temporary file in the same folder is written, flushed to disk and renamed over path, so a
 * reader sees the old file or the whole new one. Indices must be non-negative and distinct
 * (TS_EINVAL otherwise, as ts_shard_read would reject the file). Errors: TS_EINVAL, TS_EIO,
 * TS_ENOMEM. */
int ts_shard_write(const char *path, const int32_t *idx, int n, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
