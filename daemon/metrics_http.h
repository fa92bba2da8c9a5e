/*
 * metrics_http.h — the daemon's operations endpoint over HTTP (Debian's libmicrohttpd):
 *
 *   GET /metrics      200, the registry in the Prometheus text format (text/plain; version=0.0.4)
 *   GET /healthz      200 "ok" when the health function says the node is ready, otherwise 503
 *                     and the reason it gave, both as one line of text/plain
 *   GET /             the status page (HTML + JS compiled in, no external assets; a Content-
 *                     Security-Policy allows nothing from elsewhere), which reads /status.json
 *   GET /status.json  the newest status the daemon published (ts_metrics_http_set_status), or
 *                     503 before the first
 *   anything else     404; a method other than GET or HEAD: 405 with "Allow: GET, HEAD"
 *
 * The server runs on libmicrohttpd's own thread, never on the daemon's event loop: a slow or
 * hostile client can hold that thread, not the loop. It serves one request at a time and bounds
 * what a client can cost: a few connections (per address too), 16 KiB of request memory (larger
 * headers get 431 from libmicrohttpd), a 10 s timeout. It is not hardened for the open internet:
 * bind it to loopback or a management network (docs/operations.md).
 */
#ifndef TS_DAEMON_METRICS_HTTP_H
#define TS_DAEMON_METRICS_HTTP_H

#include <stddef.h>

#include "daemon/metrics.h"

typedef struct ts_metrics_http ts_metrics_http_t;

/* Says whether the node is ready to serve: returns 1 when it is; 0 when it is not, with a short
 * reason written into reason (e.g. "store not open", "joining the network"). Runs on the HTTP
 * thread, once per /healthz request: it must only read state that is safe to read from another
 * thread (atomics), and never block. */
typedef int (*ts_health_fn)(void *user, char *reason, size_t reasonlen);

/* Starts serving m on addr ("host:port", IPv6 in brackets; port 0 picks a free port, see
 * ts_metrics_http_port). health may be NULL: then /healthz always says ok. m and user must
 * outlive the server. TS_EINVAL (a bad address), TS_EIO (cannot bind: in use, no permission),
 * each with a sentence in err. *out: ts_metrics_http_stop. */
int ts_metrics_http_start(ts_metrics_http_t **out, ts_metrics_t *m, const char *addr,
                          ts_health_fn health, void *user, char *err, size_t errlen);

/* Publishes json (len bytes, copied) as the /status.json body; safe from any thread (the daemon
 * calls it from its loop every second while the status is wanted). TS_EINVAL, TS_ENOMEM (the
 * previous body stays). */
int ts_metrics_http_set_status(ts_metrics_http_t *s, const char *json, size_t len);

/* 1 when /status.json was asked for in the last TS_METRICS_HTTP_STATUS_IDLE_S seconds: the
 * daemon builds the status only then (at 10 000 members it is megabytes), so the first request
 * after a quiet spell may get the 503 or an older status, and the page's next poll the fresh
 * one. Safe from any thread. */
#define TS_METRICS_HTTP_STATUS_IDLE_S 30.0
int ts_metrics_http_status_wanted(ts_metrics_http_t *s);

/* The port the server listens on (the one chosen when addr asked for port 0). */
int ts_metrics_http_port(const ts_metrics_http_t *s);

/* Stops the thread, closes the socket and frees s (NULL is a no-op). Blocks until a request in
 * progress has finished, so call it from the loop only at shutdown. */
void ts_metrics_http_stop(ts_metrics_http_t *s);

#endif
