/*
 * updir.h — the folder RUNDIR of a network `tessera up` started: node i's identity key, config
 * (tesserad.ini), store, log and pid file are in RUNDIR/node-<i>, its listen address in
 * RUNDIR/node-<i>/data/listen.addr. Which of its daemons run, where they listen, and stopping
 * them: for `tessera up`, `tessera down` and `tessera status --dir`.
 */
#ifndef TS_CLIENT_UPDIR_H
#define TS_CLIENT_UPDIR_H

#include <stddef.h>
#include <sys/types.h>

#include "base/error.h"

#define TS_UPDIR_MAX_NODES 64
#define TS_UPDIR_PATHLEN 4096

/* snprintf into a path buffer of TS_UPDIR_PATHLEN bytes; a path that does not fit is cut, and
 * then names no file: the operation on it fails with the path in its message. */
void ts_updir_path(char *out, const char *fmt, ...) TS_PRINTF(2, 3);
/* Reads a small text file's first line into buf (without the newline); 0 on success. */
int ts_updir_read_line(const char *path, char *buf, size_t len);
/* The tesserad of node i: the pid in RUNDIR/node-i/tesserad.pid when that process is alive and
 * is a tesserad (a stale file whose pid was reused by another program does not count), else any
 * tesserad running that node's config (one restarted by hand); 0 when none. */
pid_t ts_updir_live_pid(const char *rundir, int i);
/* The listen address of a running node of rundir (the first whose tesserad is alive, one
 * restarted by hand included); 0, or −1 when none runs. */
int ts_updir_live_addr(const char *rundir, char *addr, size_t len);
/* Stops the nodes of rundir: SIGTERM, then SIGKILL after timeout_s (said on stderr unless
 * quiet). Returns how many ran. */
int ts_updir_stop_all(const char *rundir, double timeout_s, int quiet);

#endif
