/*
 * check.c — `tesserad --check-config`'s look at the files the config names (check.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/check.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "daemon/expert.h"
#include "kernels/engine.h"
#include "model/classifier.h"
#include "model/dit_io.h"
#include "model/partition.h"
#include "model/safetensors.h"
#include "net/conn.h"
#include "store/store.h"
#include "store/weights.h"

static int is_safetensors_path(const char *s) {
    size_t n = strlen(s);
    return n > 12 && strcmp(s + n - 12, ".safetensors") == 0;
}

/* The weights as a parsed file: read from the path, or (a hash prefix) from the store, which must
 * already exist — the check creates nothing. *buf owns the bytes of a file from the store. */
static int read_weights(const ts_daemon_config_t *c, ts_st_file_t *f, unsigned char **buf,
                        char *err, size_t errlen) {
    *buf = NULL;
    if (is_safetensors_path(c->expert_weights))
        return ts_st_read(c->expert_weights, f, err, errlen);
    struct stat st;
    char mdb[TS_CONFIG_PATH_MAX + 16];
    snprintf(mdb, sizeof mdb, "%s/data.mdb", c->data_dir);
    if (stat(mdb, &st) != 0) {
        ts_set_err(err, errlen,
                   "'%s' is not a .safetensors file, and there is no store at %s "
                   "to find it in as a hash",
                   c->expert_weights, c->data_dir);
        return TS_ENOTFOUND;
    }
    ts_store_t *s = NULL;
    ts_store_opts_t so = {.dir = c->data_dir, .readonly = 1}; /* the check writes nothing */
    ts_hash_t h;
    size_t len = 0;
    int rc = ts_store_open(&s, &so, err, errlen);
    if (rc == TS_OK)
        rc = ts_weights_resolve(s, c->expert_weights, &h, err, errlen);
    if (rc == TS_OK)
        rc = ts_weights_load(s, &h, buf, &len, err, errlen);
    if (rc == TS_OK)
        rc = ts_st_parse(*buf, len, f, err, errlen);
    ts_store_close(s);
    if (rc != TS_OK) {
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

/* The hosted expert: a DiT whose every tensor loads, trained for a cluster of this partition. */
static int check_weights(const ts_daemon_config_t *c, ts_engine_t *e, const ts_partition_t *p,
                         FILE *out, char *err, size_t errlen) {
    ts_st_file_t f;
    unsigned char *buf = NULL;
    char sub[512] = "";
    int rc = read_weights(c, &f, &buf, sub, sizeof sub);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "[expert] weights %s: %s", c->expert_weights, sub);
        return rc;
    }
    ts_dit_t m;
    rc = ts_dit_open_file(&m, &f, e, 1, 0, sub, sizeof sub);
    if (rc == TS_OK)
        ts_dit_free(&m);
    char pid[TS_PARTITION_ID_HEX + 8] = "";
    ts_dit_config_t cfg;
    uint32_t k = 0;
    if (rc == TS_OK)
        rc = ts_expert_weights_meta(&f, &cfg, &k, pid, sizeof pid, sub, sizeof sub);
    if (rc == TS_OK)
        rc = ts_expert_belongs(pid, k, c->expert_weights, p, c->expert_partition, sub, sizeof sub);
    if (rc == TS_OK)
        fprintf(out, "  weights     %s: cluster %u of %d, every tensor loads\n", c->expert_weights,
                k, p->K);
    else
        ts_set_err(err, errlen, "[expert] weights %s: %s", c->expert_weights, sub);
    ts_st_free(&f);
    free(buf);
    return rc;
}

/* The router: a classifier with one output per cluster, trained on this partition. */
static int check_router(const ts_daemon_config_t *c, ts_engine_t *e, const ts_partition_t *p,
                        FILE *out, char *err, size_t errlen) {
    ts_classifier_t *r = NULL;
    char sub[512] = "";
    int rc = ts_classifier_open(&r, c->expert_router, e, 1, sub, sizeof sub);
    if (rc == TS_OK) {
        const char *pid = ts_classifier_meta(r, "partition_id");
        if (pid && strcmp(pid, p->id) != 0) {
            ts_set_err(sub, sizeof sub, "it was trained on partition %.16s…, not on %s (%.16s…)",
                       pid, c->expert_partition, p->id);
            rc = TS_EINVAL;
        } else if (ts_classifier_num_outputs(r) != p->K) {
            ts_set_err(sub, sizeof sub, "it routes to %d clusters but the partition has %d",
                       ts_classifier_num_outputs(r), p->K);
            rc = TS_EINVAL;
        }
    }
    ts_classifier_free(r);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "[expert] router %s: %s", c->expert_router, sub);
        return rc;
    }
    fprintf(out, "  router      %s: %d clusters\n", c->expert_router, p->K);
    return TS_OK;
}

int ts_check_expert_files(const ts_daemon_config_t *c, FILE *out, char *err, size_t errlen) {
    if (c->expert_mode == TS_EXPERT_NONE) {
        fprintf(out, "  expert      none\n");
        return TS_OK;
    }
    if (c->expert_mode == TS_EXPERT_AUTO && !c->expert_partition[0]) {
        fprintf(out, "  expert      auto: the partition, the cluster and the weights come from the "
                     "network\n");
        return TS_OK;
    }
    ts_partition_t p;
    char sub[512] = "";
    int rc = ts_partition_load(c->expert_partition, &p, sub, sizeof sub);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "[expert] partition %s: %s", c->expert_partition, sub);
        return rc;
    }
    fprintf(out, "  expert      %s\n  partition   %s: %.16s…, K = %d\n",
            ts_expert_mode_name(c->expert_mode), c->expert_partition, p.id, p.K);
    ts_engine_t e = {0};
    ts_engine_opts_t eo = {TS_CPU, 1, 0};
    rc = ts_engine_init(&e, &eo);
    if (rc != TS_OK)
        ts_set_err(err, errlen, "cannot start a CPU engine to load the files: %s", ts_strerror(rc));
    if (rc == TS_OK && c->expert_mode == TS_EXPERT_TRAIN && c->expert_cluster >= p.K) {
        ts_set_err(err, errlen, "[expert] cluster %d: the partition %s has K = %d",
                   c->expert_cluster, c->expert_partition, p.K);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK && c->expert_mode == TS_EXPERT_HOST)
        rc = check_weights(c, &e, &p, out, err, errlen);
    if (rc == TS_OK && c->expert_router[0])
        rc = check_router(c, &e, &p, out, err, errlen);
    ts_engine_free(&e);
    ts_partition_free(&p);
    return rc;
}

/* 0 when a socket of type can bind host:port now (and is closed again), else errno. */
static int try_bind(const char *host, int port, int type) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = type,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, service, &hints, &ai) != 0 || !ai)
        return 0; /* a name ([metrics] listen may be one): the real bind resolves it and says */
    int e = 0, fd = socket(ai->ai_family, ai->ai_socktype, 0);
    if (fd < 0) {
        e = errno;
    } else {
        int one = 1; /* as libuv's TCP bind: a socket in TIME_WAIT does not count as taken */
        if (type == SOCK_STREAM)
            (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0)
            e = errno;
        close(fd);
    }
    freeaddrinfo(ai);
    return e;
}

/* One key's address: TS_OK when free (or port 0, or off), else TS_EIO with err. */
static int port_free(const char *key, const char *addr, int udp_too, char *err, size_t errlen) {
    char host[256], sub[256] = "";
    int port = 0;
    if (!addr[0])
        return TS_OK;
    if (ts_net_parse_addr(addr, host, sizeof host, &port, 1, sub, sizeof sub) != TS_OK) {
        ts_set_err(err, errlen, "%s %s: %s", key, addr, sub);
        return TS_EINVAL;
    }
    if (port == 0)
        return TS_OK;
    int e = try_bind(host, port, SOCK_STREAM);
    if (!e && udp_too)
        e = try_bind(host, port, SOCK_DGRAM);
    if (!e)
        return TS_OK;
    ts_set_err(err, errlen, "%s %s: cannot listen there: %s%s", key, addr, strerror(e),
               e == EADDRINUSE ? " (another tesserad, or another program? choose a free port, "
                                 "or port 0 for any)"
               : e == EADDRNOTAVAIL ? " (no interface of this machine has that address)"
                                    : "");
    return TS_EIO;
}

int ts_check_ports(const ts_daemon_config_t *c, char *err, size_t errlen) {
    int rc = port_free("[node] listen", c->listen, 1, err, errlen);
    if (rc == TS_OK)
        rc = port_free("[metrics] listen", c->metrics_listen, 0, err, errlen);
    return rc;
}
