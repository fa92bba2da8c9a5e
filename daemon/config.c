/*
 * config.c — tesserad's INI configuration (daemon/config.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/config.h"

#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { K_PATH, K_ADDR, K_ADDRLIST, K_INT, K_LEVEL, K_FORMAT } kind_t;

typedef struct {
    ts_config_key_info_t info;
    kind_t kind;
    size_t off;
    long lo, hi; /* K_INT */
} key_spec_t;

#define OFF(f) offsetof(ts_daemon_config_t, f)

/* clang-format off */
static const key_spec_t KEYS[] = {
    {{"node", "identity", "path", "(required)", "the node's identity file, written by `tessera keygen --out FILE` (mode 0600)"}, K_PATH, OFF(identity), 0, 0},
    {{"node", "network_key", "path", "(required)", "the network key file, written by `tessera keygen --network-key --out FILE` (mode 0600); the same for every node of the network"}, K_PATH, OFF(network_key), 0, 0},
    {{"node", "data_dir", "path", "/var/lib/tessera", "the store (LMDB): weights, checkpoints, the address book"}, K_PATH, OFF(data_dir), 0, 0},
    {{"node", "listen", "host:port", "0.0.0.0:7420", "where to listen: TCP (RPC, transfers) and UDP (gossip) on the same port"}, K_ADDR, OFF(listen), 0, 0},
    {{"node", "advertise", "host:port", "(listen)", "the address other nodes dial; needed when listen is 0.0.0.0 or behind NAT"}, K_ADDR, OFF(advertise), 0, 0},
    {{"node", "bootstrap", "host:port list", "(none)", "nodes to join through, comma-separated; the key may be repeated and the lists add up; empty for the first node"}, K_ADDRLIST, OFF(bootstrap), 0, 0},
    {{"gossip", "probe_interval_ms", "integer", "1000", "SWIM protocol period: one probe per period"}, K_INT, OFF(probe_interval_ms), 50, 60000},
    {{"gossip", "probe_timeout_ms", "integer", "500", "wait for a direct ack before indirect probes; less than probe_interval_ms"}, K_INT, OFF(probe_timeout_ms), 10, 60000},
    {{"gossip", "indirect_probes", "integer", "3", "members asked to probe on our behalf (k)"}, K_INT, OFF(indirect_probes), 0, 16},
    {{"gossip", "suspicion_mult", "integer", "4", "suspicion timeout = suspicion_mult x log10(N) x probe interval (Lifeguard shortens it as confirmations arrive)"}, K_INT, OFF(suspicion_mult), 1, 100},
    {{"gossip", "retransmit_mult", "integer", "4", "each update is piggybacked retransmit_mult x log(N+1) times"}, K_INT, OFF(retransmit_mult), 1, 100},
    {{"gossip", "pushpull_interval_s", "integer", "30", "full state exchange with one random member over TCP (scaled up for large N); 0 = off"}, K_INT, OFF(pushpull_interval_s), 0, 86400},
    {{"limits", "max_frame_mib", "integer", "64", "largest application frame accepted, MiB (checked before allocating)"}, K_INT, OFF(max_frame_mib), 1, 1024},
    {{"limits", "max_connections", "integer", "256", "open TCP connections at most, in total"}, K_INT, OFF(max_connections), 1, 65536},
    {{"limits", "max_connections_per_ip", "integer", "8", "open TCP connections at most from one remote address"}, K_INT, OFF(max_connections_per_ip), 1, 65536},
    {{"limits", "handshake_timeout_ms", "integer", "5000", "a connection that has not finished its handshake by then is dropped"}, K_INT, OFF(handshake_timeout_ms), 100, 600000},
    {{"limits", "idle_timeout_s", "integer", "120", "a connection with no traffic for this long is closed"}, K_INT, OFF(idle_timeout_s), 1, 86400},
    {{"serve", "max_batch", "integer", "16", "forward rows per batch, and the most one request may take (a guided sample takes 2)"}, K_INT, OFF(serve_max_batch), 1, 4096},
    {{"serve", "max_wait_ms", "integer", "2", "how long the oldest queued request waits for others to batch with"}, K_INT, OFF(serve_max_wait_ms), 0, 10000},
    {{"serve", "max_queue", "integer", "256", "rows queued before requests are answered busy; at least max_batch"}, K_INT, OFF(serve_max_queue), 1, 1048576},
    {{"serve", "compute_threads", "integer", "0", "threads of the compute engine; 0 = one per core"}, K_INT, OFF(serve_compute_threads), 0, 1024},
    {{"serve", "weights_bandwidth_mib_s", "integer", "0", "MiB/s of weight chunks served to other nodes; 0 = unlimited"}, K_INT, OFF(weights_bandwidth_mib_s), 0, 100000},
    {{"serve", "weights_max_pending", "integer", "64", "chunk requests waiting for bandwidth before busy"}, K_INT, OFF(weights_max_pending), 1, 65536},
    {{"log", "level", "debug|info|warn|error", "info", "the least severe level written"}, K_LEVEL, OFF(log_level), 0, 0},
    {{"log", "format", "text|json", "text", "text lines, or one JSON object per line (ts, level, component, msg)"}, K_FORMAT, OFF(log_format), 0, 0},
    {{"log", "file", "path", "(stderr)", "append logs to this file instead of stderr; SIGHUP reopens it (log rotation)"}, K_PATH, OFF(log_file), 0, 0},
};
/* clang-format on */
#define N_KEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

static const char *LEVELS[] = {"debug", "info", "warn", "error"};

const char *ts_log_level_name(ts_log_level_t l) {
    return (unsigned)l < 4 ? LEVELS[l] : "?";
}

const ts_config_key_info_t *ts_daemon_config_key(int n) {
    return n >= 0 && n < N_KEYS ? &KEYS[n].info : NULL;
}

void ts_daemon_config_default(ts_daemon_config_t *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->data_dir, sizeof c->data_dir, "/var/lib/tessera");
    snprintf(c->listen, sizeof c->listen, "0.0.0.0:7420");
    c->probe_interval_ms = 1000;
    c->probe_timeout_ms = 500;
    c->indirect_probes = 3;
    c->suspicion_mult = 4;
    c->retransmit_mult = 4;
    c->pushpull_interval_s = 30;
    c->max_frame_mib = 64;
    c->max_connections = 256;
    c->max_connections_per_ip = 8;
    c->handshake_timeout_ms = 5000;
    c->idle_timeout_s = 120;
    c->serve_max_batch = 16;
    c->serve_max_wait_ms = 2;
    c->serve_max_queue = 256;
    c->serve_compute_threads = 0;
    c->weights_bandwidth_mib_s = 0;
    c->weights_max_pending = 64;
    c->log_level = TS_LOG_INFO;
    c->log_format = TS_LOG_TEXT;
}

int ts_config_check_addr(const char *addr, int allow_port0) {
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || strlen(addr) >= TS_CONFIG_ADDR_MAX)
        return TS_EINVAL;
    if (addr[0] == '[' && colon[-1] != ']')
        return TS_EINVAL; /* IPv6 goes in brackets: [::1]:7420 */
    if (addr[0] != '[' && memchr(addr, ':', (size_t)(colon - addr)))
        return TS_EINVAL; /* an unbracketed IPv6 address: the port is ambiguous */
    for (const char *p = addr; p < colon; p++)
        if (*p == ' ' || *p == '\t' || *p == ',')
            return TS_EINVAL;
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || port < (allow_port0 ? 0 : 1) || port > 65535)
        return TS_EINVAL;
    return TS_OK;
}

typedef struct {
    ts_daemon_config_t *c;
    const char *name;
    char *err;
    size_t errlen;
    int line; /* the line being parsed (counted by the reader) */
    int rc;
    unsigned char seen[N_KEYS];
} parse_ctx_t;

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    return s;
}

/* Records "FILE:LINE: [section] name: <fmt with value>" and stops the parse (returns 0, which
 * tells libinih to report an error). */
static int fail(parse_ctx_t *p, const char *section, const char *name, const char *fmt, ...)
    TS_PRINTF(4, 5);
static int fail(parse_ctx_t *p, const char *section, const char *name, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    ts_set_err(p->err, p->errlen, "%s:%d: [%s] %s: %s", p->name, p->line, section, name, what);
    p->rc = TS_EINVAL;
    return 0;
}

static int add_addrs(parse_ctx_t *p, const key_spec_t *k, const char *section, const char *value) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", value);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok = trim(tok);
        if (!*tok)
            continue;
        if (ts_config_check_addr(tok, 0) != TS_OK)
            return fail(p, section, k->info.key, "'%s' is not host:port (port 1..65535)", tok);
        if (p->c->n_bootstrap == TS_CONFIG_MAX_BOOTSTRAP)
            return fail(p, section, k->info.key, "more than %d addresses", TS_CONFIG_MAX_BOOTSTRAP);
        snprintf(p->c->bootstrap[p->c->n_bootstrap++], TS_CONFIG_ADDR_MAX, "%s", tok);
    }
    return 1;
}

static int on_key(void *user, const char *section, const char *name, const char *value) {
    parse_ctx_t *p = user;
    if (p->rc != TS_OK)
        return 0;
    int i = 0;
    while (i < N_KEYS &&
           !(strcmp(KEYS[i].info.section, section) == 0 && strcmp(KEYS[i].info.key, name) == 0))
        i++;
    if (i == N_KEYS) {
        int known_section = 0;
        for (int j = 0; j < N_KEYS; j++)
            known_section |= strcmp(KEYS[j].info.section, section) == 0;
        return fail(p, section, name,
                    known_section ? "unknown key (configs/tesserad.ini lists every key)"
                                  : "unknown section or key (sections: node, gossip, limits, "
                                    "serve, log)");
    }
    const key_spec_t *k = &KEYS[i];
    if (p->seen[i] && k->kind != K_ADDRLIST)
        return fail(p, section, name, "given twice");
    p->seen[i] = 1;
    char *field = (char *)p->c + k->off;
    switch (k->kind) {
    case K_PATH:
        if (strlen(value) >= TS_CONFIG_PATH_MAX)
            return fail(p, section, name, "longer than %d bytes", TS_CONFIG_PATH_MAX - 1);
        snprintf(field, TS_CONFIG_PATH_MAX, "%s", value);
        return 1;
    case K_ADDR:
        if (*value && ts_config_check_addr(value, 0) != TS_OK)
            return fail(p, section, name, "'%s' is not host:port (port 1..65535)", value);
        snprintf(field, TS_CONFIG_ADDR_MAX, "%s", value);
        return 1;
    case K_ADDRLIST:
        return add_addrs(p, k, section, value);
    case K_INT: {
        char *end;
        errno = 0;
        long v = strtol(value, &end, 10);
        if (!*value || *end || errno)
            return fail(p, section, name, "'%s' is not an integer", value);
        if (v < k->lo || v > k->hi) {
            char range[64];
            snprintf(range, sizeof range, "%ld..%ld", k->lo, k->hi);
            ts_set_err(p->err, p->errlen, "%s:%d: [%s] %s: %ld is outside %s", p->name, p->line,
                       section, name, v, range);
            p->rc = TS_EINVAL;
            return 0;
        }
        *(int *)field = (int)v;
        return 1;
    }
    case K_LEVEL:
        for (int l = 0; l < 4; l++)
            if (strcmp(value, LEVELS[l]) == 0) {
                *(ts_log_level_t *)field = (ts_log_level_t)l;
                return 1;
            }
        return fail(p, section, name, "'%s': want debug, info, warn or error", value);
    case K_FORMAT:
        if (strcmp(value, "text") == 0 || strcmp(value, "json") == 0) {
            *(ts_log_format_t *)field = value[0] == 'j' ? TS_LOG_JSON : TS_LOG_TEXT;
            return 1;
        }
        return fail(p, section, name, "'%s': want text or json", value);
    }
    return 0;
}

/* The reader of ini_parse_stream over a string: one line per call, counting lines so errors can
 * name them (Debian's libinih does not pass line numbers to the handler). */
typedef struct {
    const char *at;
    parse_ctx_t *p;
} reader_t;

static char *read_line(char *buf, int size, void *stream) {
    reader_t *r = stream;
    if (!*r->at)
        return NULL;
    const char *nl = strchr(r->at, '\n');
    size_t n = nl ? (size_t)(nl - r->at) + 1 : strlen(r->at);
    if (n >= (size_t)size)
        n = (size_t)size - 1;
    memcpy(buf, r->at, n);
    buf[n] = '\0';
    r->at += n;
    r->p->line++;
    return buf;
}

static int check_whole(ts_daemon_config_t *c, const char *name, char *err, size_t errlen) {
    if (!c->identity[0] || !c->network_key[0]) {
        ts_set_err(err, errlen,
                   "%s: [node] %s is required (create one with `tessera keygen %s--out FILE`)",
                   name, !c->identity[0] ? "identity" : "network_key",
                   !c->identity[0] ? "" : "--network-key ");
        return TS_EINVAL;
    }
    if (c->probe_timeout_ms >= c->probe_interval_ms) {
        ts_set_err(err, errlen, "%s: [gossip] probe_timeout_ms (%d) must be less than "
                                "probe_interval_ms (%d)",
                   name, c->probe_timeout_ms, c->probe_interval_ms);
        return TS_EINVAL;
    }
    if (c->max_connections_per_ip > c->max_connections) {
        ts_set_err(err, errlen, "%s: [limits] max_connections_per_ip (%d) exceeds "
                                "max_connections (%d)",
                   name, c->max_connections_per_ip, c->max_connections);
        return TS_EINVAL;
    }
    if (c->serve_max_queue < c->serve_max_batch) {
        ts_set_err(err, errlen, "%s: [serve] max_queue (%d) is less than max_batch (%d)", name,
                   c->serve_max_queue, c->serve_max_batch);
        return TS_EINVAL;
    }
    if (!c->advertise[0]) {
        const char *colon = strrchr(c->listen, ':');
        size_t host = (size_t)(colon - c->listen);
        if ((host == 7 && strncmp(c->listen, "0.0.0.0", 7) == 0) ||
            (host == 4 && strncmp(c->listen, "[::]", 4) == 0)) {
            ts_set_err(err, errlen,
                       "%s: [node] listen is %s, which other nodes cannot dial: set [node] "
                       "advertise to this machine's reachable host:port",
                       name, c->listen);
            return TS_EINVAL;
        }
        snprintf(c->advertise, sizeof c->advertise, "%s", c->listen);
    }
    return TS_OK;
}

int ts_daemon_config_parse(ts_daemon_config_t *c, const char *text, const char *name, char *err,
                           size_t errlen) {
    ts_daemon_config_default(c);
    parse_ctx_t p = {.c = c, .name = name, .err = err, .errlen = errlen, .rc = TS_OK};
    reader_t r = {text, &p};
    int line = ini_parse_stream(read_line, &r, on_key, &p);
    if (p.rc != TS_OK)
        return p.rc;
    if (line != 0) {
        ts_set_err(err, errlen, "%s:%d: not an INI line (want [section], key = value, or a "
                                "comment starting with ; or #)",
                   name, line);
        return TS_EINVAL;
    }
    return check_whole(c, name, err, errlen);
}

int ts_daemon_config_load(ts_daemon_config_t *c, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        ts_set_err(err, errlen, "%s: %s", path, strerror(e));
        return e == ENOENT ? TS_ENOTFOUND : TS_EIO;
    }
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap + 1);
    if (!text) {
        fclose(f);
        return TS_ENOMEM;
    }
    n = fread(text, 1, cap + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > cap) {
        free(text);
        ts_set_err(err, errlen, bad ? "%s: cannot read the file" : "%s: larger than 64 KiB",
                   path);
        return bad ? TS_EIO : TS_EINVAL;
    }
    text[n] = '\0';
    if (memchr(text, '\0', n)) {
        free(text);
        ts_set_err(err, errlen, "%s: a NUL byte: not a text file", path);
        return TS_EINVAL;
    }
    int rc = ts_daemon_config_parse(c, text, path, err, errlen);
    free(text);
    return rc;
}
