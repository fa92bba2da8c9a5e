/*
 * cmd_network.c — `tessera network export`: a network as one file (netfile.h), for volunteers to
 * join in one command with `tessera join` (cmd_join.c; docs/operations.md, "Joining a network").
 *
 *   tessera network export --network-key FILE (--bootstrap HOST:PORT[,...] | --from-up DIR)
 *                          --out FILE [--json]
 */
#define _XOPEN_SOURCE 700 /* realpath */

#include "client/netfile.h"

#include <errno.h>
#include <jansson.h>
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

/* The listen addresses of the nodes of a `tessera up` folder (node-N/data/listen.addr). */
static int from_up(ts_netfile_t *nf, const char *dir, char *err, size_t errlen) {
    for (int i = 0; i < 1024; i++) {
        char path[PATH_MAX], addr[TS_NETFILE_ADDR_MAX] = "";
        snprintf(path, sizeof path, "%s/node-%d/data/listen.addr", dir, i);
        FILE *f = fopen(path, "r");
        if (!f)
            break;
        int got = fgets(addr, sizeof addr, f) != NULL;
        fclose(f);
        addr[strcspn(addr, "\r\n")] = '\0';
        if (got && ts_netfile_add_bootstrap(nf, addr, err, errlen) != TS_OK)
            return TS_EINVAL;
    }
    if (nf->n == 0) {
        ts_set_err(err, errlen, "%s: no node-N/data/listen.addr (a folder of `tessera up`?)", dir);
        return TS_ENOTFOUND;
    }
    return TS_OK;
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
    ts_netfile_t nf;
    memset(&nf, 0, sizeof nf);
    int rc = up ? from_up(&nf, up, err, sizeof err) : TS_OK;
    if (rc == TS_OK && boot) {
        char *list = ts_dup_str(boot), *save = NULL;
        for (char *a = list ? strtok_r(list, ",", &save) : NULL; a && rc == TS_OK;
             a = strtok_r(NULL, ",", &save)) {
            while (*a == ' ')
                a++;
            rc = ts_netfile_add_bootstrap(&nf, a, err, sizeof err);
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
        rc = ts_netfile_write(&nf, out, err, sizeof err);
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
