/*
 * cmd_down.c — `tessera down`: stops the network `tessera up` started (updir.h): SIGTERM to every
 * node (a graceful leave), then SIGKILL for any still running after --timeout.
 *
 *   tessera down [--dir RUNDIR] [--timeout S] [--json]
 *
 * Exit status: 0 when the network is down, 1 when RUNDIR is not a network `tessera up` started,
 * 2 for bad usage.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/file.h"
#include "client/args.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "client/updir.h"

int ts_cmd_down(int argc, char **argv) {
    const char *rundir = "tessera-net";
    int timeout_s = 30, json = 0;
    ts_arg_t args[] = {
        {"dir", TS_ARG_STRING, &rundir, "RUNDIR", "the network's folder (default ./tessera-net)"},
        {"json", TS_ARG_FLAG, &json, NULL,
         "print one JSON object (dir, stopped, already_stopped: the nodes that were not running)"},
        {"timeout", TS_ARG_INT, &timeout_s, "S",
         "seconds to wait for a graceful stop before SIGKILL (default 30)", 1, 3600},
    };
    const char *summary = "Stop the network `tessera up` started: each node leaves gracefully "
                          "(SIGTERM).\nusage: tessera down [--dir RUNDIR] [options]\n"
                          "example: tessera down --dir tessera-net";
    int pr = ts_args_parse("tessera down", summary, args, (int)(sizeof args / sizeof args[0]), argc,
                           argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    char path[TS_UPDIR_PATHLEN], dead[512] = "";
    ts_updir_path(path, "%s/network.key", rundir);
    if (!ts_file_exists(path)) {
        fprintf(stderr, "tessera down: %s is not a network `tessera up` started (no %s)\n", rundir,
                path);
        return 1;
    }
    int n_dead = 0;
    size_t used = 0;
    json_t *gone = json_array();
    for (int i = 0; i < TS_UPDIR_MAX_NODES; i++) {
        ts_updir_path(path, "%s/node-%d/tesserad.ini", rundir, i);
        if (ts_file_exists(path) && !ts_updir_live_pid(rundir, i)) {
            n_dead++;
            json_array_append_new(gone, json_integer(i));
            if (used < sizeof dead)
                used +=
                    (size_t)snprintf(dead + used, sizeof dead - used, "%s%d", used ? ", " : "", i);
        }
    }
    int n = ts_updir_stop_all(rundir, timeout_s, 0);
    if (json) {
        ts_json_print(
            json_pack("{s:s, s:i, s:o}", "dir", rundir, "stopped", n, "already_stopped", gone));
        return 0;
    }
    json_decref(gone);
    if (n == 0)
        printf("tessera down: no node of %s was running", rundir);
    else
        printf("tessera down: stopped %d node%s of %s", n, n == 1 ? "" : "s", rundir);
    if (n_dead && n)
        printf("; node%s %s had already stopped (see node-N/tesserad.log)", n_dead == 1 ? "" : "s",
               dead);
    printf("\n");
    return 0;
}
