/*
 * cmd_network.c — a network as one file, and joining it in one command (docs/operations.md,
 * "Joining a network").
 *
 *   tessera network export --network-key FILE (--bootstrap HOST:PORT[,...] | --from-up DIR)
 *                          --out FILE [--json]
 *   tessera join FILE [--dir DIR] [--listen HOST:PORT] [--advertise HOST:PORT] [--systemd]
 *                     [--json]
 *
 * The network file holds what a volunteer needs and nothing else: the network key and the
 * addresses to join through. It is a secret (whoever holds it is inside the network): it is
 * written with mode 0600 and never overwritten, and shared only with people let in. Its format,
 * one item per line, '#' comments:
 *
 *   tessera-network 1
 *   key <64 hex digits: the network key>
 *   bootstrap <host:port>          (one line each, at least one)
 *
 * `join` makes a node directory from it: network.key and a new identity.key (0600), and
 * tesserad.ini with `[expert] mode = auto` — the node chooses its cluster, fetches or trains its
 * expert, and hosts it — listening on --listen (default 0.0.0.0:7420), its metrics and status
 * page on 127.0.0.1:9420. With --systemd it writes tesserad.service beside them, a unit that runs
 * that config. It never overwrites a file; run the daemon with the command it prints.
 */
#define _XOPEN_SOURCE 700 /* realpath */

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
#include "net/conn.h"
#include "net/keys.h"

#define MAX_BOOTSTRAP 64
#define ADDR_MAX 256

typedef struct netfile {
    ts_netkey_t key;
    int n;
    char bootstrap[MAX_BOOTSTRAP][ADDR_MAX];
} netfile_t;

/* errno's words into eb (which holds 128 bytes). */
static const char *etext(int e, char *eb) {
    ts_errno_text(e, eb, 128);
    return eb;
}

/* Creates path with mode 0600 (never overwriting) and writes text. */
static int write_secret(const char *path, const char *text, char *err, size_t errlen) {
    char eb[128];
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        ts_set_err(err, errlen, "%s: %s", path,
                   errno == EEXIST ? "exists (a secret file is never overwritten)"
                                   : etext(errno, eb));
        return errno == EEXIST ? TS_EEXIST : TS_EIO;
    }
    size_t len = strlen(text);
    int ok = fchmod(fd, 0600) == 0 && write(fd, text, len) == (ssize_t)len && fsync(fd) == 0;
    int e = errno;
    close(fd);
    if (!ok) {
        unlink(path);
        ts_set_err(err, errlen, "%s: cannot write it: %s", path, etext(e, eb));
        return TS_EIO;
    }
    return TS_OK;
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

static int add_bootstrap(netfile_t *nf, const char *addr, char *err, size_t errlen) {
    char host[ADDR_MAX];
    int port;
    if (nf->n >= MAX_BOOTSTRAP) {
        ts_set_err(err, errlen, "more than %d bootstrap addresses", MAX_BOOTSTRAP);
        return TS_EINVAL;
    }
    if (strlen(addr) >= ADDR_MAX ||
        ts_net_parse_addr(addr, host, sizeof host, &port, 0, err, errlen) != TS_OK) {
        if (!*err)
            ts_set_err(err, errlen, "'%s' is not host:port", addr);
        return TS_EINVAL;
    }
    snprintf(nf->bootstrap[nf->n++], ADDR_MAX, "%s", addr);
    return TS_OK;
}

static int nibble(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Parses the network file's text. The key is wiped by the caller (ts_netkey_wipe). */
static int netfile_parse(netfile_t *nf, char *text, const char *path, char *err, size_t errlen) {
    memset(nf, 0, sizeof *nf);
    int line = 0, have_key = 0, have_magic = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        line++;
        while (*l == ' ' || *l == '\t')
            l++;
        size_t n = strlen(l);
        while (n && (l[n - 1] == '\r' || l[n - 1] == ' ' || l[n - 1] == '\t'))
            l[--n] = '\0';
        if (!*l || *l == '#')
            continue;
        if (!have_magic) {
            if (strcmp(l, "tessera-network 1") != 0) {
                ts_set_err(err, errlen,
                           "%s:%d: not a tessera network file (want the line "
                           "'tessera-network 1' first)",
                           path, line);
                return TS_ECORRUPT;
            }
            have_magic = 1;
        } else if (strncmp(l, "key ", 4) == 0) {
            const char *hex = l + 4;
            if (strlen(hex) != 2 * TS_NETKEY_BYTES) {
                ts_set_err(err, errlen, "%s:%d: the key must be %d hex digits", path, line,
                           2 * TS_NETKEY_BYTES);
                return TS_ECORRUPT;
            }
            for (int i = 0; i < TS_NETKEY_BYTES; i++) {
                int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
                if (hi < 0 || lo < 0) {
                    ts_set_err(err, errlen, "%s:%d: the key is not hex", path, line);
                    return TS_ECORRUPT;
                }
                nf->key.k[i] = (uint8_t)(hi << 4 | lo);
            }
            have_key = 1;
        } else if (strncmp(l, "bootstrap ", 10) == 0) {
            char sub[256] = "";
            if (add_bootstrap(nf, l + 10, sub, sizeof sub) != TS_OK) {
                ts_set_err(err, errlen, "%s:%d: %s", path, line, sub);
                return TS_ECORRUPT;
            }
        } else {
            ts_set_err(err, errlen, "%s:%d: unknown line (want key or bootstrap)", path, line);
            return TS_ECORRUPT;
        }
    }
    if (!have_magic || !have_key || nf->n == 0) {
        ts_set_err(err, errlen, "%s: %s", path,
                   !have_magic ? "empty: not a tessera network file"
                   : !have_key ? "no key line"
                               : "no bootstrap address (nobody to join through)");
        return TS_ECORRUPT;
    }
    return TS_OK;
}

static int netfile_read(netfile_t *nf, const char *path, char *err, size_t errlen) {
    char eb[128];
    FILE *f = fopen(path, "rb");
    if (!f) {
        ts_set_err(err, errlen, "%s: %s", path, etext(errno, eb));
        return errno == ENOENT ? TS_ENOTFOUND : TS_EIO;
    }
    char *text = calloc(1, 65537);
    size_t n = text ? fread(text, 1, 65536, f) : 0;
    int big = text && !feof(f);
    fclose(f);
    if (!text)
        return TS_ENOMEM;
    int rc = TS_OK;
    if (big) {
        ts_set_err(err, errlen, "%s: over 64 KiB: not a tessera network file", path);
        rc = TS_ECORRUPT;
    } else {
        text[n] = '\0';
        rc = netfile_parse(nf, text, path, err, errlen);
    }
    sodium_memzero(text, 65537);
    free(text);
    return rc;
}

/* ---- tessera network export ------------------------------------------------------------------ */

/* The listen addresses of the nodes of a `tessera up` folder (node-N/data/listen.addr). */
static int from_up(netfile_t *nf, const char *dir, char *err, size_t errlen) {
    for (int i = 0; i < 1024; i++) {
        char path[PATH_MAX], addr[ADDR_MAX] = "";
        snprintf(path, sizeof path, "%s/node-%d/data/listen.addr", dir, i);
        FILE *f = fopen(path, "r");
        if (!f)
            break;
        int got = fgets(addr, sizeof addr, f) != NULL;
        fclose(f);
        addr[strcspn(addr, "\r\n")] = '\0';
        if (got && add_bootstrap(nf, addr, err, errlen) != TS_OK)
            return TS_EINVAL;
    }
    if (nf->n == 0) {
        ts_set_err(err, errlen, "%s: no node-N/data/listen.addr (a folder of `tessera up`?)", dir);
        return TS_ENOTFOUND;
    }
    return TS_OK;
}

/* Writes the network file: the header, the key, one bootstrap line per address (mode 0600). */
static int netfile_write(const netfile_t *nf, const char *out, char *err, size_t errlen) {
    size_t cap = 256 + (size_t)nf->n * (ADDR_MAX + 16);
    char *text = calloc(1, cap), hex[2 * TS_NETKEY_BYTES + 1];
    if (!text)
        return TS_ENOMEM;
    ts_hex(nf->key.k, TS_NETKEY_BYTES, hex);
    size_t n = (size_t)snprintf(text, cap,
                                "tessera-network 1\n# a tessera network: share this file only "
                                "with people you let in\nkey %s\n",
                                hex);
    sodium_memzero(hex, sizeof hex);
    for (int i = 0; i < nf->n; i++)
        n += (size_t)snprintf(text + n, cap - n, "bootstrap %s\n", nf->bootstrap[i]);
    int rc = write_secret(out, text, err, errlen);
    sodium_memzero(text, cap);
    free(text);
    return rc;
}

static int network_export(int argc, char **argv) {
    const char *key = NULL, *boot = NULL, *up = NULL, *out = NULL;
    int json = 0;
    ts_arg_t args[] = {
        {"network-key", TS_ARG_STRING, &key, "FILE",
         "the network key file (tessera keygen --network-key); with --from-up, default "
         "DIR/network.key"},
        {"bootstrap", TS_ARG_STRING, &boot, "LIST",
         "addresses to join through, host:port, comma-separated: reachable nodes of the network"},
        {"from-up", TS_ARG_STRING, &up, "DIR",
         "take the key and every node's address from a `tessera up` folder"},
        {"out", TS_ARG_STRING, &out, "FILE",
         "the network file to create (mode 0600, never overwritten)", 0, 0, 1},
        {"json", TS_ARG_FLAG, &json, NULL, "print a JSON object (file, bootstrap)"},
    };
    int pr =
        ts_args_parse("tessera network export",
                      "Write the network as one file: its key and where to join it. Share the "
                      "file only with people you let in: it holds the network key.\n"
                      "example: tessera network export --from-up tessera-net --out net.tessera",
                      args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    char err[512] = "", keypath[PATH_MAX];
    if (!boot && !up) {
        fprintf(stderr, "tessera network export: give --bootstrap LIST or --from-up DIR\n");
        return 2;
    }
    if (!key && up)
        snprintf(keypath, sizeof keypath, "%s/network.key", up), key = keypath;
    if (!key) {
        fprintf(stderr, "tessera network export: --network-key FILE is required\n");
        return 2;
    }
    netfile_t nf;
    memset(&nf, 0, sizeof nf);
    int rc = up ? from_up(&nf, up, err, sizeof err) : TS_OK;
    if (rc == TS_OK && boot) {
        char *list = ts_dup_str(boot), *save = NULL;
        for (char *a = list ? strtok_r(list, ",", &save) : NULL; a && rc == TS_OK;
             a = strtok_r(NULL, ",", &save)) {
            while (*a == ' ')
                a++;
            rc = add_bootstrap(&nf, a, err, sizeof err);
        }
        free(list);
        if (rc != TS_OK) {
            fprintf(stderr, "tessera network export: --bootstrap: %s\n", err);
            return 2;
        }
    }
    if (rc == TS_OK)
        rc = ts_netkey_load(&nf.key, key, err, sizeof err);
    if (rc == TS_OK)
        rc = netfile_write(&nf, out, err, sizeof err);
    ts_netkey_wipe(&nf.key);
    if (rc != TS_OK) {
        fprintf(stderr, "tessera network export: %s\n", *err ? err : ts_strerror(rc));
        return 1;
    }
    if (json) {
        json_t *b = json_array();
        for (int i = 0; i < nf.n; i++)
            json_array_append_new(b, json_string(nf.bootstrap[i]));
        ts_json_print(json_pack("{s:s, s:o}", "file", out, "bootstrap", b));
    } else {
        printf("wrote the network file %s (mode 0600; %d bootstrap address%s)\n"
               "a volunteer joins with: tessera join %s --advertise HOST:7420\n"
               "  (HOST: the volunteer's address as the other nodes reach it; on one machine, "
               "--listen 127.0.0.1:0 instead)\n",
               out, nf.n, nf.n == 1 ? "" : "es", out);
    }
    return 0;
}

/* ---- tessera join ----------------------------------------------------------------------------- */

typedef struct join_opts {
    const char *file, *dir, *listen, *advertise, *metrics;
    int systemd, json;
} join_opts_t;

static int write_config(const join_opts_t *o, const char *abs, const netfile_t *nf, char *err,
                        size_t errlen) {
    char path[PATH_MAX], boot[MAX_BOOTSTRAP * (ADDR_MAX + 2)] = "";
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
    ts_cli_find_tesserad(found, sizeof found);
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
    netfile_t nf;
    int rc = netfile_read(&nf, o->file, err, errlen);
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

static int join(int argc, char **argv) {
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
    char host[ADDR_MAX];
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

int ts_cmd_network(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "export") == 0)
        return network_export(argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: tessera network export [options]\n\n"
               "Write the network as one file (its key and where to join it) for volunteers:\n"
               "they join with `tessera join FILE`. `tessera network export --help` lists the "
               "options.\n");
        return 0;
    }
    fprintf(stderr, "tessera network: want `export` (see tessera network --help)\n");
    return 2;
}

int ts_cmd_join(int argc, char **argv) { return join(argc, argv); }
