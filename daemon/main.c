/*
 * main.c — tesserad, the daemon a volunteer runs: it holds the node's identity, opens the store
 * and runs the event loop until SIGTERM or SIGINT (graceful stop); SIGHUP reopens the log file.
 *
 *   tesserad --config FILE                run
 *   tesserad --config FILE --check-config validate the config, the key files and every file it
 *                                         names (daemon/check.h), print a summary, exit 0
 *                                         (valid) or 1 (not), touching nothing
 *   tesserad --help-config                every configuration key with its default
 *   tesserad --version | --help
 *
 * What runs inside is a node (daemon/node.h: the listener, gossip, the expert, relays, metrics);
 * this file is its shell: the command line, the configuration and the keys, the log, the store,
 * the signals and the loop.
 *
 * Stopping: the first SIGTERM or SIGINT leaves the network gracefully (a signed leave, spread
 * for at most the gossip's leave_linger), then closes gossip and every connection and exits 0;
 * a second one exits at once with status 1.
 */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "daemon/check.h"
#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/node.h"
#include "net/keys.h"
#include "store/store.h"

#ifndef TS_VERSION
#define TS_VERSION "0.0.0-dev"
#endif

static void usage(FILE *f) {
    fprintf(f, "usage: tesserad --config FILE [--check-config]\n"
               "       tesserad --help-config | --version | --help\n\n"
               "The tessera daemon: hosts or trains one diffusion expert for the network.\n\n"
               "options:\n"
               "  --config FILE    the INI configuration (configs/tesserad.ini documents every "
               "key)\n"
               "  --check-config   validate the configuration, the key files and every file it\n"
               "                   names (weights, partition, router), then exit\n"
               "  --help-config    list every configuration key with its default\n"
               "  --version        print the version\n"
               "  -h, --help       show this text\n");
}

static void help_config(void) {
    const char *section = "";
    for (int i = 0; ts_daemon_config_key(i); i++) {
        const ts_config_key_info_t *k = ts_daemon_config_key(i);
        if (strcmp(k->section, section) != 0)
            printf("%s[%s]\n", i ? "\n" : "", section = k->section);
        printf("  %-24s %-22s default %s\n      %s\n", k->key, k->type, k->deflt, k->doc);
    }
}

typedef struct {
    ts_node_t *node;
    uv_signal_t term, intr, hup;
} daemon_t;

/* The node has left the network and is closing: the signals go too, and the loop runs out. */
static void on_node_stopped(void *arg) {
    daemon_t *d = arg;
    uv_close((uv_handle_t *)&d->term, NULL);
    uv_close((uv_handle_t *)&d->intr, NULL);
    uv_close((uv_handle_t *)&d->hup, NULL);
}

static void on_stop(uv_signal_t *h, int signum) {
    daemon_t *d = h->data;
    const char *name = signum == SIGINT ? "SIGINT" : "SIGTERM";
    if (ts_node_stopping(d->node)) {
        ts_log_warn("daemon", "second %s: exiting now", name);
        exit(1);
    }
    ts_log_info("daemon", "%s: stopping: work in progress, then leaving the network", name);
    ts_node_stop(d->node, on_node_stopped, d);
}

static void on_hup(uv_signal_t *h, int signum) {
    (void)h, (void)signum;
    if (ts_log_reopen() != TS_OK)
        ts_log_error("daemon", "SIGHUP: cannot reopen the log file; still writing to the old one");
    else
        ts_log_info("daemon", "SIGHUP: log file reopened");
}

/* The node (daemon/node.h) on this process's loop until a signal has stopped it. */
static int run(const ts_daemon_config_t *cfg, const ts_identity_t *id, const ts_netkey_t *nk,
               ts_store_t *store) {
    char err[1024] = "";
    uv_loop_t loop;
    daemon_t d = {0};
    uv_loop_init(&loop);
    if (ts_node_start(&d.node, &loop, cfg, id, nk, store, TS_VERSION, err, sizeof err) != TS_OK) {
        ts_log_error("daemon", "%s", err);
        uv_loop_close(&loop);
        return 1;
    }
    uv_signal_init(&loop, &d.term);
    uv_signal_init(&loop, &d.intr);
    uv_signal_init(&loop, &d.hup);
    d.term.data = d.intr.data = d.hup.data = &d;
    uv_signal_start(&d.term, on_stop, SIGTERM);
    uv_signal_start(&d.intr, on_stop, SIGINT);
    uv_signal_start(&d.hup, on_hup, SIGHUP);
    signal(SIGPIPE, SIG_IGN);
    ts_log_info("daemon", "ready");
    uv_run(&loop, UV_RUN_DEFAULT);
    ts_node_free(d.node);
    uv_loop_close(&loop);
    return 0;
}

/* Loads the keys the config names; both are wiped by the caller. */
static int load_keys(const ts_daemon_config_t *c, ts_identity_t *id, ts_netkey_t *nk, char *err,
                     size_t errlen) {
    int rc = ts_identity_load(id, c->identity, err, errlen);
    if (rc == TS_OK)
        rc = ts_netkey_load(nk, c->network_key, err, errlen);
    return rc;
}

int main(int argc, char **argv) {
    const char *config = NULL;
    int check = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            config = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            config = argv[i] + 9;
        } else if (strcmp(argv[i], "--check-config") == 0) {
            check = 1;
        } else if (strcmp(argv[i], "--help-config") == 0) {
            help_config();
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("tesserad %s\n", TS_VERSION);
            return 0;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "tesserad: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!config) {
        fprintf(stderr, "tesserad: --config FILE is required\n");
        usage(stderr);
        return 2;
    }
    char err[1024] = "";
    ts_daemon_config_t cfg;
    ts_identity_t id;
    ts_netkey_t nk;
    memset(&id, 0, sizeof id);
    memset(&nk, 0, sizeof nk);
    int rc = ts_daemon_config_load(&cfg, config, err, sizeof err);
    if (rc == TS_OK)
        rc = load_keys(&cfg, &id, &nk, err, sizeof err);
    if (rc != TS_OK) {
        fprintf(stderr, "tesserad: %s\n", err[0] ? err : ts_strerror(rc));
        ts_identity_wipe(&id);
        ts_netkey_wipe(&nk);
        return check ? 1 : 2;
    }
    char node[17];
    ts_node_id_hex(&id.id, 16, node);
    if (check) {
        ts_identity_wipe(&id);
        ts_netkey_wipe(&nk);
        /* every file the config names, opened and validated; the summary only when all are */
        char *files = NULL;
        size_t files_len = 0;
        FILE *fo = open_memstream(&files, &files_len);
        rc = fo ? ts_check_expert_files(&cfg, fo, err, sizeof err) : TS_ENOMEM;
        if (rc == TS_OK)
            rc = ts_check_ports(&cfg, err, sizeof err);
        if (fo)
            fclose(fo);
        if (rc != TS_OK) {
            fprintf(stderr, "tesserad: %s: %s\n", config, err[0] ? err : ts_strerror(rc));
            free(files);
            return 1;
        }
        printf("%s: valid\n  node id     %s\n  listen      %s (advertised as %s)\n"
               "  bootstrap   %d peer%s\n  data_dir    %s\n  log         %s, %s, %s\n%s",
               config, node, cfg.listen, cfg.advertise, cfg.n_bootstrap,
               cfg.n_bootstrap == 1 ? "" : "s", cfg.data_dir, ts_log_level_name(cfg.log_level),
               cfg.log_format == TS_LOG_JSON ? "json" : "text",
               cfg.log_file[0] ? cfg.log_file : "stderr", files ? files : "");
        free(files);
        return 0;
    }
    if ((rc = ts_log_open(cfg.log_level, cfg.log_format, cfg.log_file, err, sizeof err)) != TS_OK) {
        fprintf(stderr, "tesserad: %s\n", err);
        ts_identity_wipe(&id);
        ts_netkey_wipe(&nk);
        return 1;
    }
    ts_store_t *store = NULL;
    ts_store_opts_t so = {.dir = cfg.data_dir};
    if ((rc = ts_store_open(&store, &so, err, sizeof err)) != TS_OK) {
        ts_log_error("store", "%s", err);
        ts_identity_wipe(&id);
        ts_netkey_wipe(&nk);
        ts_log_close();
        return 1;
    }
    /* a taken port, said with the key that names it, before anything starts */
    if ((rc = ts_check_ports(&cfg, err, sizeof err)) != TS_OK) {
        ts_log_error("daemon", "%s", err);
        ts_store_close(store);
        ts_identity_wipe(&id);
        ts_netkey_wipe(&nk);
        ts_log_close();
        return 1;
    }
    rc = run(&cfg, &id, &nk, store);
    ts_store_close(store);
    ts_identity_wipe(&id);
    ts_netkey_wipe(&nk);
    ts_log_info("daemon", rc == 0 ? "stopped" : "stopped after an error");
    ts_log_close();
    return rc;
}
