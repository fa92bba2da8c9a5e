/*
 * cmd_join.c — `tessera join`: makes this machine a node of the network in a network file
 * (netfile.h, written by `tessera network export`; docs/operations.md, "Joining a network").
 *
 *   tessera join FILE [--dir DIR] [--listen HOST:PORT] [--advertise HOST:PORT] [--systemd]
 *                     [--json]
 *
 * It makes a node directory from the file: network.key and a new identity.key (0600), and
 * tesserad.ini with `[expert] mode = auto` — the node chooses its cluster, fetches or trains its
 * expert, and hosts it — listening on --listen (default 0.0.0.0:7420), its metrics and status
 * page on 127.0.0.1:9420. With --systemd it writes tesserad.service beside them, a unit that runs
 * that config. It never overwrites a file; run the daemon with the command it prints.
 */
#define _XOPEN_SOURCE 700 /* realpath */

#include "client/netfile.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pwd.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sodium.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/str.h"
#include "client/args.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "client/tesserad_path.h"
#include "net/conn.h"
#include "net/keys.h"

/* errno's words into eb (which holds 128 bytes). */
static const char *etext(int e, char *eb) {
    ts_errno_text(e, eb, 128);
    return eb;
}

/* Creates path with mode 0644 (never overwriting) and writes text: configs and units. */
static int write_new(const char *path, const char *text, char *err, size_t errlen) {
    char eb[128];
    if (ts_file_exists(path)) {
        ts_set_err(err, errlen, "%s exists: not overwritten (join into another --dir)", path);
        return TS_EEXIST;
    }
    int e = 0;
    if (ts_atomic_write(path, text, strlen(text), &e) != TS_OK) {
        ts_set_err(err, errlen, "%s: %s", path, etext(e, eb));
        return TS_EIO;
    }
    return TS_OK;
}

typedef struct join_opts {
    const char *file, *dir, *listen, *advertise, *metrics;
    int systemd, json;
} join_opts_t;

static int write_config(const join_opts_t *o, const char *abs, const ts_netfile_t *nf, char *err,
                        size_t errlen) {
    char path[PATH_MAX], boot[TS_NETFILE_MAX_BOOTSTRAP * (TS_NETFILE_ADDR_MAX + 2)] = "";
    for (int i = 0; i < nf->n; i++) {
        strncat(boot, i ? ", " : "", sizeof boot - strlen(boot) - 1);
        strncat(boot, nf->bootstrap[i], sizeof boot - strlen(boot) - 1);
    }
    size_t cap = 8192 + sizeof boot + 4 * (size_t)PATH_MAX;
    char *ini = calloc(1, cap);
    if (!ini)
        return TS_ENOMEM;
    int len =
        snprintf(ini, cap,
                 "# tesserad.ini — written by `tessera join`; configs/tesserad.ini documents every "
                 "key.\n"
                 "[node]\nidentity = %s/identity.key\nnetwork_key = %s/network.key\n"
                 "data_dir = %s/data\nlisten = %s\n%s%s%sbootstrap = %s\n\n"
                 "[expert]\n# the node chooses the cluster the network needs, fetches its expert "
                 "from a peer\n# (or trains it when nobody has it) and hosts it\nmode = auto\n\n"
                 "[metrics]\n# /metrics, /healthz and the status page (/) over HTTP\n"
                 "listen = %s\n",
                 abs, abs, abs, o->listen, o->advertise ? "advertise = " : "",
                 o->advertise ? o->advertise : "", o->advertise ? "\n" : "", boot, o->metrics);
    snprintf(path, sizeof path, "%s/tesserad.ini", o->dir);
    int rc = TS_ERANGE;
    if (len < 0 || (size_t)len >= cap)
        ts_set_err(err, errlen, "the config for %s is too long", abs);
    else
        rc = write_new(path, ini, err, errlen);
    free(ini);
    if (rc != TS_OK || !o->systemd)
        return rc;
    char unit[4 * PATH_MAX + 1024], found[PATH_MAX], tesserad[PATH_MAX];
    ts_tesserad_path(found, sizeof found);
    if (!realpath(found, tesserad)) /* not found here: the unit names the usual install path */
        snprintf(tesserad, sizeof tesserad, "/usr/local/bin/tesserad");
    /* the node runs as whoever joined (who owns its keys), never as root by default */
    const struct passwd *pw = getpwuid(geteuid());
    const char *user = pw && pw->pw_name ? pw->pw_name : "nobody";
    int ulen = snprintf(
        unit, sizeof unit,
        "# tesserad.service — written by `tessera join --systemd` for %s/tesserad.ini.\n"
        "# Install: cp %s/tesserad.service /etc/systemd/system/ && systemctl daemon-reload "
        "&& systemctl enable --now tesserad\n"
        "# (configs/tesserad.service is the hardened unit for a system install under "
        "/var/lib/tessera.)\n"
        "[Unit]\nDescription=tessera daemon (auto: hosts the expert the network needs)\n"
        "After=network-online.target\nWants=network-online.target\n\n"
        "[Service]\nType=exec\nUser=%s\nExecStart=%s --config %s/tesserad.ini\n"
        "ExecReload=/bin/kill -HUP $MAINPID\nKillSignal=SIGTERM\nTimeoutStopSec=30\n"
        "Restart=on-failure\nRestartSec=5\nUMask=0077\nNoNewPrivileges=yes\n\n"
        "[Install]\nWantedBy=multi-user.target\n",
        abs, abs, user, tesserad, abs);
    snprintf(path, sizeof path, "%s/tesserad.service", o->dir);
    if (ulen < 0 || (size_t)ulen >= sizeof unit) {
        ts_set_err(err, errlen, "the unit for %s is too long", abs);
        return TS_ERANGE;
    }
    return write_new(path, unit, err, errlen);
}

static int join_run(const join_opts_t *o, char *abs, char *node, char *err, size_t errlen) {
    char eb[128];
    ts_netfile_t nf;
    int rc = ts_netfile_read(&nf, o->file, err, errlen);
    if (rc != TS_OK) {
        ts_netkey_wipe(&nf.key); /* a key line may have been read before the error */
        return rc;
    }
    char path[PATH_MAX];
    if (mkdir(o->dir, 0700) != 0 && errno != EEXIST) {
        ts_set_err(err, errlen, "%s: %s", o->dir, etext(errno, eb));
        rc = TS_EIO;
    }
    if (rc == TS_OK && !realpath(o->dir, abs)) {
        ts_set_err(err, errlen, "%s: %s", o->dir, etext(errno, eb));
        rc = TS_EIO;
    }
    snprintf(path, sizeof path, "%s/tesserad.ini", o->dir);
    if (rc == TS_OK && ts_file_exists(path)) {
        ts_set_err(err, errlen, "%s exists: this folder already holds a node", path);
        rc = TS_EEXIST;
    }
    snprintf(path, sizeof path, "%s/network.key", o->dir);
    if (rc == TS_OK)
        rc = ts_netkey_save(&nf.key, path, err, errlen);
    ts_netkey_wipe(&nf.key);
    ts_identity_t id;
    snprintf(path, sizeof path, "%s/identity.key", o->dir);
    if (rc == TS_OK && (rc = ts_identity_generate(&id)) == TS_OK) {
        rc = ts_identity_save(&id, path, err, errlen);
        ts_node_id_hex(&id.id, 2 * TS_NODE_ID_BYTES, node);
        ts_identity_wipe(&id);
    }
    if (rc == TS_OK)
        rc = write_config(o, abs, &nf, err, errlen);
    return rc;
}

int ts_cmd_join(int argc, char **argv) {
    join_opts_t o = {.dir = "tessera-node", .listen = "0.0.0.0:7420", .metrics = "127.0.0.1:9420"};
    ts_arg_t args[] = {
        {"dir", TS_ARG_STRING, &o.dir, "DIR",
         "the node's folder: keys, config, store (default ./tessera-node)"},
        {"listen", TS_ARG_STRING, &o.listen, "HOST:PORT",
         "where the node listens, TCP and UDP (default 0.0.0.0:7420)"},
        {"advertise", TS_ARG_STRING, &o.advertise, "HOST:PORT",
         "the address other nodes dial, when it is not the listen address (a public IP, a "
         "forwarded port)"},
        {"metrics", TS_ARG_STRING, &o.metrics, "HOST:PORT",
         "the metrics, health and status page address (default 127.0.0.1:9420; port 0: any free "
         "one)"},
        {"systemd", TS_ARG_FLAG, &o.systemd, NULL,
         "also write DIR/tesserad.service, a systemd unit that runs it"},
        {"json", TS_ARG_FLAG, &o.json, NULL, "print a JSON object (dir, config, node_id, command)"},
    };
    if (argc >= 2 && argv[1][0] != '-')
        o.file = argv[1], argc--, argv++;
    int pr = ts_args_parse("tessera join",
                           "Make this machine a node of the network in FILE (tessera network "
                           "export): keys, a config in mode auto, optionally a systemd unit.\n"
                           "usage: tessera join FILE [options]\n"
                           "example: tessera join net.tessera --advertise 203.0.113.7:7420\n"
                           "example: tessera join net.tessera --listen 127.0.0.1:0 --dir node-b",
                           args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    if (!o.file) {
        fprintf(stderr, "tessera join: name the network file (tessera join FILE)\n");
        return 2;
    }
    char err[1024] = "", abs[PATH_MAX], node[2 * TS_NODE_ID_BYTES + 1] = "";
    char host[TS_NETFILE_ADDR_MAX];
    int port;
    if (ts_net_parse_addr(o.listen, host, sizeof host, &port, 1, err, sizeof err) != TS_OK ||
        ts_net_parse_addr(o.metrics, host, sizeof host, &port, 1, err, sizeof err) != TS_OK ||
        (o.advertise &&
         ts_net_parse_addr(o.advertise, host, sizeof host, &port, 0, err, sizeof err) != TS_OK)) {
        fprintf(stderr, "tessera join: %s\n", err);
        return 2;
    }
    /* a wildcard listen address is not an address anyone can dial: tesserad refuses it without
     * an advertised one, so join does too, now, rather than writing a config that cannot start */
    if (!o.advertise &&
        (strncmp(o.listen, "0.0.0.0:", 8) == 0 || strncmp(o.listen, "[::]:", 5) == 0)) {
        fprintf(stderr,
                "tessera join: --listen %s is every interface, not an address other nodes can "
                "dial: add --advertise HOST:PORT (this machine's address as the network sees it: "
                "its public address, or the router's with a port forwarded here)\n",
                o.listen);
        return 2;
    }
    int rc = join_run(&o, abs, node, err, sizeof err);
    if (rc != TS_OK) {
        fprintf(stderr, "tessera join: %s\n", *err ? err : ts_strerror(rc));
        return 1;
    }
    if (o.json) {
        char cfg[PATH_MAX + 16];
        snprintf(cfg, sizeof cfg, "%s/tesserad.ini", abs);
        ts_json_print(json_pack("{s:s, s:s, s:s, s:s}", "dir", abs, "config", cfg, "node_id", node,
                                "command", "tesserad --config"));
    } else {
        char watch[PATH_MAX + 128];
        const char *colon = strrchr(o.metrics, ':');
        if (colon && strcmp(colon, ":0") == 0) /* the port is chosen when the node starts */
            snprintf(watch, sizeof watch,
                     "the status page, at the URL in %s/data/metrics.url once "
                     "it runs",
                     abs);
        else
            snprintf(watch, sizeof watch, "http://%s/ (the status page)", o.metrics);
        printf("joined: node %.16s in %s (mode auto: it picks the cluster the network needs)\n"
               "start it:    tesserad --config %s/tesserad.ini\n"
               "watch it:    %s\n%s%s%s",
               node, abs, abs, watch, o.systemd ? "or install:  cp " : "", o.systemd ? abs : "",
               o.systemd ? "/tesserad.service /etc/systemd/system/ && systemctl enable --now "
                           "tesserad\n"
                         : "");
    }
    return 0;
}
