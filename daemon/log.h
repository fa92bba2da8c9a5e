/*
 * log.h — tesserad's logs: leveled, one line per event, as text or as JSON, to stderr or a file
 * that SIGHUP reopens (so logrotate can move it away).
 *
 *   text  2026-11-22T01:02:03.456Z info  gossip: node 3fa2c1 joined (8 alive)
 *   json  {"ts":"2026-11-22T01:02:03.456Z","level":"info","component":"gossip","msg":"node 3fa2c1 joined (8 alive)"}
 *
 * The JSON is written by jansson, so any byte a message carries (a peer's address, a file name)
 * is escaped. Each line is written with one write(2) under a mutex, so lines from several threads
 * never interleave. Secrets are never passed here (keys are shown only as node-id prefixes).
 */
#ifndef TS_DAEMON_LOG_H
#define TS_DAEMON_LOG_H

#include "daemon/config.h"

/* Starts logging at level, in format, to path (NULL or "" = stderr). TS_EIO with a sentence when
 * the file cannot be opened for appending. */
int ts_log_open(ts_log_level_t level, ts_log_format_t format, const char *path, char *err,
                size_t errlen);
/* Reopens the file (after rotation); stderr logging ignores it. Keeps the old file on failure. */
int ts_log_reopen(void);
void ts_log_close(void);

void ts_log(ts_log_level_t level, const char *component, const char *fmt, ...) TS_PRINTF(3, 4);

#define ts_log_debug(c, ...) ts_log(TS_LOG_DEBUG, c, __VA_ARGS__)
#define ts_log_info(c, ...) ts_log(TS_LOG_INFO, c, __VA_ARGS__)
#define ts_log_warn(c, ...) ts_log(TS_LOG_WARN, c, __VA_ARGS__)
#define ts_log_error(c, ...) ts_log(TS_LOG_ERROR, c, __VA_ARGS__)

#endif
