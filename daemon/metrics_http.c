/*
 * metrics_http.c — /metrics and /healthz over HTTP on libmicrohttpd's thread
 * (daemon/metrics_http.h).
 *
 * libmicrohttpd parses the requests, enforces the limits and answers malformed ones itself (400,
 * 431, ...); this file only routes a parsed request to one of three answers. Every answer is
 * built and queued in the first call of the access handler, before any request body is read, so
 * a client sending a body gets its 405 without the server buffering what it sent.
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/metrics_http.h"

#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/clock.h"
#include "daemon/log.h"
#include "net/conn.h"

/* What one client may cost (see the header). */
#define HTTP_CONNECTIONS 8
#define HTTP_CONNECTIONS_PER_IP 4
#define HTTP_TIMEOUT_S 10
#define HTTP_MEMORY_PER_CONNECTION (16 * 1024)

#define TEXT_PLAIN "text/plain; charset=utf-8"
#define PROMETHEUS_TEXT "text/plain; version=0.0.4; charset=utf-8"
#define TEXT_HTML "text/html; charset=utf-8"
#define APPLICATION_JSON "application/json"

/* The page (status_page.html, embedded at build time by cmake/embed.cmake). */
extern const unsigned char ts_status_page[];
extern const size_t ts_status_page_len;

struct ts_metrics_http {
    struct MHD_Daemon *mhd;
    ts_metrics_t *m;
    ts_health_fn health;
    void *user;
    int port;
    pthread_mutex_t status_mu; /* guards status: the loop publishes, the HTTP thread copies */
    char *status;              /* the newest /status.json body, NULL until published */
    size_t status_len;
    _Atomic double status_asked; /* ts_now_s of the last /status.json request, 0: none */
    char last_error[256]; /* libmicrohttpd's last message, for the sentence of a failed start */
};

/* libmicrohttpd's messages (a client that broke the protocol, a failed bind) go to the debug
 * log; the last one is kept for ts_metrics_http_start's error. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    ts_metrics_http_t *s = cls;
    vsnprintf(s->last_error, sizeof s->last_error, fmt, ap);
    size_t n = strlen(s->last_error);
    while (n && (s->last_error[n - 1] == '\n' || s->last_error[n - 1] == '.'))
        s->last_error[--n] = '\0';
    ts_log_debug("metrics", "http: %s", s->last_error);
}

/* Queues body (len bytes, taken by libmicrohttpd per mode) with status and content type. */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             void *body, size_t len, enum MHD_ResponseMemoryMode mode) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO; /* libmicrohttpd closes the connection */
    }
    enum MHD_Result ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (ok == MHD_YES)
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (ok == MHD_YES && strcmp(type, TEXT_HTML) == 0) /* no script or style from elsewhere */
        ok = MHD_add_response_header(r, "Content-Security-Policy",
                                     "default-src 'none'; script-src 'unsafe-inline'; "
                                     "style-src 'unsafe-inline'; connect-src 'self'");
    if (ok == MHD_YES && status == MHD_HTTP_METHOD_NOT_ALLOWED)
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    if (ok == MHD_YES)
        ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *text) {
    return reply(c, status, TEXT_PLAIN, (void *)text, strlen(text), MHD_RESPMEM_MUST_COPY);
}

static enum MHD_Result serve_metrics(ts_metrics_http_t *s, struct MHD_Connection *c) {
    char *body;
    size_t len;
    if (ts_metrics_write(s->m, &body, &len) != TS_OK)
        return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    return reply(c, MHD_HTTP_OK, PROMETHEUS_TEXT, body, len, MHD_RESPMEM_MUST_FREE);
}

static enum MHD_Result serve_health(ts_metrics_http_t *s, struct MHD_Connection *c) {
    char reason[256] = "";
    if (!s->health || s->health(s->user, reason, sizeof reason))
        return reply_text(c, MHD_HTTP_OK, "ok\n");
    char line[sizeof reason + 2];
    snprintf(line, sizeof line, "%s\n", reason[0] ? reason : "not ready");
    return reply_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, line);
}

static enum MHD_Result serve_page(struct MHD_Connection *c) {
    return reply(c, MHD_HTTP_OK, TEXT_HTML, (void *)ts_status_page, ts_status_page_len,
                 MHD_RESPMEM_PERSISTENT);
}

static enum MHD_Result serve_status(ts_metrics_http_t *s, struct MHD_Connection *c) {
    atomic_store(&s->status_asked, ts_now_s());
    pthread_mutex_lock(&s->status_mu);
    char *copy = s->status ? malloc(s->status_len) : NULL;
    size_t len = s->status_len;
    if (copy)
        memcpy(copy, s->status, len);
    int none = !s->status;
    pthread_mutex_unlock(&s->status_mu);
    if (none)
        return reply_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "no status yet: the node is starting\n");
    if (!copy)
        return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    return reply(c, MHD_HTTP_OK, APPLICATION_JSON, copy, len, MHD_RESPMEM_MUST_FREE);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
    (void)upload_data, (void)upload_size, (void)con_cls;
    ts_metrics_http_t *s = cls;
    /* RFC 9112 §3.2: an HTTP/1.1 request without Host is a 400 (libmicrohttpd lets it pass) */
    if (strcmp(version, MHD_HTTP_VERSION_1_1) == 0 &&
        !MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST))
        return reply_text(c, MHD_HTTP_BAD_REQUEST, "an HTTP/1.1 request needs a Host header\n");
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD are served\n");
    if (strcmp(url, "/metrics") == 0)
        return serve_metrics(s, c);
    if (strcmp(url, "/healthz") == 0)
        return serve_health(s, c);
    if (strcmp(url, "/") == 0 || strcmp(url, "/index.html") == 0)
        return serve_page(c);
    if (strcmp(url, "/status.json") == 0)
        return serve_status(s, c);
    return reply_text(c, MHD_HTTP_NOT_FOUND,
                      "not found: try / (the status page), /status.json, /metrics or /healthz\n");
}

/* The socket address of "host:port" (a name is resolved; the first answer is used). */
static int resolve(const char *addr, struct sockaddr_storage *sa, char *err, size_t errlen) {
    char host[256], port[8];
    int p;
    int rc = ts_net_parse_addr(addr, host, sizeof host, &p, 1, err, errlen);
    if (rc != TS_OK)
        return rc;
    snprintf(port, sizeof port, "%d", p);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0 || !res) {
        ts_set_err(err, errlen, "metrics listen %s: cannot resolve '%s' (%s)", addr, host,
                   gai_strerror(gai));
        return TS_EINVAL;
    }
    memset(sa, 0, sizeof *sa);
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return TS_OK;
}

int ts_metrics_http_start(ts_metrics_http_t **out, ts_metrics_t *m, const char *addr,
                          ts_health_fn health, void *user, char *err, size_t errlen) {
    if (!out || !m || !addr)
        return TS_EINVAL;
    *out = NULL;
    struct sockaddr_storage sa;
    int rc = resolve(addr, &sa, err, errlen);
    if (rc != TS_OK)
        return rc;
    ts_metrics_http_t *s = calloc(1, sizeof *s);
    if (!s)
        return TS_ENOMEM;
    if (pthread_mutex_init(&s->status_mu, NULL) != 0) {
        free(s);
        return TS_ENOMEM;
    }
    s->m = m;
    s->health = health;
    s->user = user;
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (sa.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->mhd = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)HTTP_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)HTTP_CONNECTIONS_PER_IP, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_TIMEOUT_S,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_MEMORY_PER_CONNECTION, MHD_OPTION_END);
    if (!s->mhd) {
        ts_set_err(err, errlen, "metrics listen %s: cannot serve HTTP there (%s)", addr,
                   s->last_error[0] ? s->last_error : "libmicrohttpd gave no reason");
        pthread_mutex_destroy(&s->status_mu);
        free(s);
        return TS_EIO;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : 0;
    *out = s;
    return TS_OK;
}

int ts_metrics_http_port(const ts_metrics_http_t *s) { return s ? s->port : 0; }

void ts_metrics_http_stop(ts_metrics_http_t *s) {
    if (!s)
        return;
    MHD_stop_daemon(s->mhd);
    pthread_mutex_destroy(&s->status_mu);
    free(s->status);
    free(s);
}

int ts_metrics_http_set_status(ts_metrics_http_t *s, const char *json, size_t len) {
    if (!s || !json)
        return TS_EINVAL;
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return TS_ENOMEM;
    memcpy(copy, json, len);
    pthread_mutex_lock(&s->status_mu);
    char *old = s->status;
    s->status = copy;
    s->status_len = len;
    pthread_mutex_unlock(&s->status_mu);
    free(old);
    return TS_OK;
}

int ts_metrics_http_status_wanted(ts_metrics_http_t *s) {
    double asked = s ? atomic_load(&s->status_asked) : 0.0;
    return asked > 0.0 && ts_now_s() - asked < TS_METRICS_HTTP_STATUS_IDLE_S;
}
