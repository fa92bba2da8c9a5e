/*
 * file.h — files written whole or not at all, and the small file questions.
 *
 * An atomic write puts the bytes in a temporary next to the destination (PATH.tmp.XXXXXX, made
 * by mkstemp: created exclusively, so a link planted at the name cannot redirect it; mode 0644),
 * then flushes and fsyncs it, renames it over PATH and fsyncs the folder, so that a crash leaves
 * either the old file or the new one, never a part. Any failure removes the temporary and leaves
 * PATH as it was. Errors come back as TS_EIO (TS_EINVAL for a bad argument, TS_ENOMEM) with the
 * errno of the failed call in *err_no (0 when there is none), so that each caller words its own
 * message.
 *
 * Usage: ts_atomic_open, write through a.fp (or the descriptor fileno(a.fp) when nothing goes
 * through the FILE's buffer), then ts_atomic_commit (publish) or ts_atomic_abort (drop); or
 * ts_atomic_write for bytes already in memory.
 */
#ifndef TS_BASE_FILE_H
#define TS_BASE_FILE_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_atomic_file {
    FILE *fp;   /* write here */
    char *tmp;  /* the temporary's name (malloc'd) */
    char *path; /* the destination (malloc'd copy) */
} ts_atomic_file_t;

/* Creates the temporary for path. On failure *a is empty and nothing is left behind. */
int ts_atomic_open(ts_atomic_file_t *a, const char *path, int *err_no);
/* Publishes: flush, fsync, close, rename over the destination, fsync the folder. With ok = 0
 * (the caller's writes failed) it drops the file instead and returns TS_EIO with *err_no
 * untouched. Frees *a either way. */
int ts_atomic_commit(ts_atomic_file_t *a, int ok, int *err_no);
/* Drops the temporary; the destination is untouched. Frees *a. */
void ts_atomic_abort(ts_atomic_file_t *a);
/* data[0..len) as path, atomically. */
int ts_atomic_write(const char *path, const void *data, size_t len, int *err_no);

/* fsync of the folder that holds path (best effort: a rename is durable once it is synced). */
void ts_sync_parent_dir(const char *path);

/* 1 when path is a regular file (links followed), else 0. */
int ts_file_exists(const char *path);

#ifdef __cplusplus
}
#endif

#endif
