/*
 * cmd_up.c — `tessera up`: a whole network of daemons on this machine, for trying tessera out,
 * for tests and for the README's main command.
 *
 *   tessera up [--nodes N] [--experts DIR] [--dir RUNDIR] [--timeout S] [--no-experts] [--json]
 *
 * `up` starts N tesserad processes on 127.0.0.1 (ports picked by the system), each in its own
 * folder RUNDIR/node-<i> (identity key, config, store, log, pid), all sharing RUNDIR/network.key;
 * node 0 starts the network and the others join through it. Node i hosts expert i mod K of the
 * generation folder DIR (expert-<k>.safetensors and partition.safetensors, as `tessera partition`
 * and `scripts/train-ensemble.sh` write them), so N > K gives replicas. It waits until node 0
 * sees every node alive and knows every advert, then prints the network's status and how to
 * generate from it. The daemons outlive the command (each in its own session); `tessera down`
 * (cmd_down.c) stops them. updir.h is what both know of RUNDIR.
 *
 * Without trained experts it says how to get them and starts nothing (--no-experts starts
 * daemons that host nothing, which is only useful for looking at gossip).
 *
 * Exit status: 0 when the network is up, 1 when it could not be started (what failed
 * and where its log is on stderr; the nodes already started are stopped again), 2 for bad usage.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* setsid, usleep */

#include <dirent.h>
#include <jansson.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/file.h"
#include "client/args.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "client/tesserad_path.h"
#include "client/updir.h"
#include "net/keys.h"

static int mkdir_p(const char *path) {
    char buf[TS_UPDIR_PATHLEN];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0700) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(buf, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

/* The experts of a generation folder: K = how many expert-<k>.safetensors there are in a row
 * from 0, and the partition. 0 when the folder has none. */
static int count_experts(const char *dir) {
    char path[TS_UPDIR_PATHLEN];
    ts_updir_path(path, "%s/partition.safetensors", dir);
    if (!ts_file_exists(path))
        return 0;
    int k = 0;
    for (;; k++) {
        ts_updir_path(path, "%s/expert-%d.safetensors", dir, k);
        if (!ts_file_exists(path))
            return k;
    }
}

static const char *abs_path(const char *p, char *buf, size_t len) {
    if (p[0] == '/' || !realpath(p, buf))
        snprintf(buf, len, "%s", p);
    return buf;
}

/* Writes RUNDIR/node-i/tesserad.ini. */
/* Each daemon's [serve] settings (0: the daemon's default). */
typedef struct {
    int compute_threads, max_batch;
} serve_opts_t;

static int write_config(const char *rundir, int i, const char *bootstrap, const char *experts,
                        int k, const serve_opts_t *so) {
    char path[TS_UPDIR_PATHLEN];
    ts_updir_path(path, "%s/node-%d/tesserad.ini", rundir, i);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f,
            "; written by `tessera up`\n[node]\nidentity = %s/node-%d/identity.key\n"
            "network_key = %s/network.key\ndata_dir = %s/node-%d/data\n"
            "listen = 127.0.0.1:0\n",
            rundir, i, rundir, rundir, i);
    if (bootstrap)
        fprintf(f, "bootstrap = %s\n", bootstrap);
    if (experts) {
        fprintf(f,
                "\n[expert]\nmode = host\nweights = %s/expert-%d.safetensors\npartition = "
                "%s/partition.safetensors\n",
                experts, i % k, experts);
        char router[TS_UPDIR_PATHLEN];
        ts_updir_path(router, "%s/router.safetensors", experts);
        if (ts_file_exists(router))
            fprintf(f, "router = %s\n", router);
    }
    if (so->compute_threads > 0 || so->max_batch > 0)
        fprintf(f, "\n[serve]\n");
    if (so->compute_threads > 0)
        fprintf(f, "compute_threads = %d\n", so->compute_threads);
    if (so->max_batch > 0) /* the queue holds at least one batch */
        fprintf(f, "max_batch = %d\nmax_queue = %d\n", so->max_batch,
                so->max_batch > 256 ? so->max_batch : 256);
    /* every node and every client of a local network connects from 127.0.0.1: the per-address
     * limit, meant for distinct machines, would refuse the ninth */
    fprintf(f, "\n[limits]\nmax_connections_per_ip = 1024\nmax_connections = 1024\n");
    fprintf(f,
            "\n[gossip]\nprobe_interval_ms = 500\nprobe_timeout_ms = 250\n"
            "pushpull_interval_s = 10\n\n[metrics]\nlisten = 127.0.0.1:0\n\n[log]\nlevel = "
            "info\nfile = %s/node-%d/tesserad.log\n",
            rundir, i);
    return fclose(f) == 0 ? 0 : -1;
}

/* Starts node i in its own session, so it outlives this command; writes its pid file. */
static pid_t spawn(const char *daemon, const char *rundir, int i) {
    char ini[TS_UPDIR_PATHLEN], pidf[TS_UPDIR_PATHLEN], out[TS_UPDIR_PATHLEN];
    ts_updir_path(ini, "%s/node-%d/tesserad.ini", rundir, i);
    ts_updir_path(out, "%s/node-%d/tesserad.out", rundir, i);
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int nul = open("/dev/null", O_RDONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (nul >= 0)
            dup2(nul, 0);
        execlp(daemon, daemon, "--config", ini, (char *)NULL);
        fprintf(stderr, "cannot run %s: %s\n", daemon, strerror(errno));
        _exit(127);
    }
    if (pid > 0) {
        ts_updir_path(pidf, "%s/node-%d/tesserad.pid", rundir, i);
        FILE *f = fopen(pidf, "w");
        if (f) {
            fprintf(f, "%ld\n", (long)pid);
            fclose(f);
        }
    }
    return pid;
}

/* Waits for node i to write its listen address; fails when the process ends first. */
static int wait_listening(const char *rundir, int i, pid_t pid, double deadline, char *addr,
                          size_t len) {
    char path[TS_UPDIR_PATHLEN];
    ts_updir_path(path, "%s/node-%d/data/listen.addr", rundir, i);
    while (ts_now_s() < deadline) {
        if (ts_updir_read_line(path, addr, len) == 0)
            return 0;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            return -1;
        usleep(50000);
    }
    return -1;
}

/* Runs `tessera status` (this binary) on node 0 with the extra arguments; its exit code. */
static int run_status(const char *addr, const char *rundir, const char *extra, char *out,
                      size_t outlen) {
    char cmd[TS_UPDIR_PATHLEN * 2], self[TS_UPDIR_PATHLEN];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return -1;
    self[n] = 0;
    snprintf(cmd, sizeof cmd, "'%s' status --peer %s --network-key '%s/network.key' %s", self, addr,
             rundir, extra);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t got = 0;
    if (out) {
        got = fread(out, 1, outlen - 1, p);
        out[got] = 0;
    } else {
        char buf[4096];
        size_t r;
        while ((r = fread(buf, 1, sizeof buf, p)) > 0)
            fwrite(buf, 1, r, stdout);
    }
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Counts "state":"alive" members and adverts in a status JSON line: crude but independent of
 * the printer's layout, which is all the wait needs. */
static void count_view(const char *json, int *alive, int *adverts) {
    *alive = *adverts = 0;
    for (const char *p = json; (p = strstr(p, "\"state\":\"alive\"")); p++)
        (*alive)++;
    for (const char *p = json; (p = strstr(p, "\"weights_hash\":")); p++)
        (*adverts)++;
}

/* each node's listen address, as it wrote it at start (up's) */
static char node_addr[TS_UPDIR_MAX_NODES][300];

static int up(const char *rundir_arg, const char *experts_arg, int nodes, int timeout_s,
              int no_experts, int json, const serve_opts_t *so) {
    char rundir[TS_UPDIR_PATHLEN], experts[TS_UPDIR_PATHLEN], daemon[TS_UPDIR_PATHLEN],
        path[TS_UPDIR_PATHLEN], err[512];
    if (mkdir_p(rundir_arg) != 0) {
        fprintf(stderr, "tessera up: cannot create %s: %s\n", rundir_arg, strerror(errno));
        return 1;
    }
    abs_path(rundir_arg, rundir, sizeof rundir);
    for (int i = 0; i < TS_UPDIR_MAX_NODES; i++)
        if (ts_updir_live_pid(rundir, i)) {
            fprintf(stderr,
                    "tessera up: a network is already running in %s (node %d); stop it "
                    "with `tessera down --dir %s`, or start its stopped nodes again with "
                    "`tessera up --dir %s --restart`\n",
                    rundir, i, rundir_arg, rundir_arg);
            return 1;
        }
    int k = 0;
    if (!no_experts) {
        abs_path(experts_arg, experts, sizeof experts);
        k = count_experts(experts);
        if (k == 0) {
            fprintf(stderr,
                    "tessera up: no trained experts in %s (it needs partition.safetensors and "
                    "expert-0.safetensors, expert-1.safetensors, ...).\n"
                    "Get them with:\n"
                    "  tessera partition --experts 4 --out %s\n"
                    "  for k in 0 1 2 3; do tessera train --partition %s --cluster $k "
                    "--model tiny --steps 2000 --out %s/expert-$k.safetensors; done\n"
                    "or, with the compute of one monolith split over the experts, "
                    "scripts/train-ensemble.sh.\n"
                    "(--no-experts starts daemons that host nothing.)\n",
                    experts_arg, experts_arg, experts_arg, experts_arg);
            return 1;
        }
    }
    ts_tesserad_path(daemon, sizeof daemon);
    ts_updir_path(path, "%s/network.key", rundir);
    if (!ts_file_exists(path)) {
        ts_netkey_t nk;
        if (ts_netkey_generate(&nk) != TS_OK ||
            ts_netkey_save(&nk, path, err, sizeof err) != TS_OK) {
            ts_netkey_wipe(&nk);
            fprintf(stderr, "tessera up: cannot create the network key: %s\n", err);
            return 1;
        }
        ts_netkey_wipe(&nk);
    }
    char addr0[300] = "";
    double t0 = ts_now_s(), deadline = t0 + timeout_s;
    for (int i = 0; i < nodes; i++) {
        ts_updir_path(path, "%s/node-%d/data", rundir, i);
        if (mkdir_p(path) != 0) {
            fprintf(stderr, "tessera up: cannot create %s: %s\n", path, strerror(errno));
            ts_updir_stop_all(rundir, 10, 1);
            return 1;
        }
        ts_updir_path(path, "%s/node-%d/identity.key", rundir, i);
        if (!ts_file_exists(path)) {
            ts_identity_t id;
            int rc = ts_identity_generate(&id);
            if (rc == TS_OK)
                rc = ts_identity_save(&id, path, err, sizeof err);
            ts_identity_wipe(&id);
            if (rc != TS_OK) {
                fprintf(stderr, "tessera up: cannot create %s: %s\n", path, err);
                ts_updir_stop_all(rundir, 10, 1);
                return 1;
            }
        }
        ts_updir_path(path, "%s/node-%d/data/listen.addr", rundir, i);
        unlink(path);
        if (write_config(rundir, i, i ? addr0 : NULL, no_experts ? NULL : experts, k, so) != 0) {
            fprintf(stderr, "tessera up: cannot write the config of node %d\n", i);
            ts_updir_stop_all(rundir, 10, 1);
            return 1;
        }
        char *addr = node_addr[i];
        pid_t pid = spawn(daemon, rundir, i);
        if (pid <= 0 || wait_listening(rundir, i, pid, deadline, addr, sizeof node_addr[i]) != 0) {
            fprintf(stderr,
                    "tessera up: node %d did not start (%s); see %s/node-%d/tesserad.out "
                    "and tesserad.log\n",
                    i, daemon, rundir, i);
            ts_updir_stop_all(rundir, 10, 1);
            return 1;
        }
        if (i == 0)
            snprintf(addr0, sizeof addr0, "%s", node_addr[0]);
        if (!json && isatty(STDERR_FILENO))
            fprintf(stderr, "\rtessera up: started %d/%d nodes", i + 1, nodes);
    }
    /* Converged: node 0 sees every node alive and holds every advert. */
    int alive = 0, adverts = 0, want_adverts = no_experts ? 0 : nodes;
    static char view[1 << 20];
    while (ts_now_s() < deadline) {
        if (run_status(addr0, rundir, "--json", view, sizeof view) == 0) {
            count_view(view, &alive, &adverts);
            if (alive == nodes && adverts >= want_adverts)
                break;
        }
        if (!json && isatty(STDERR_FILENO))
            fprintf(stderr,
                    "\rtessera up: %d/%d nodes started; node 0 sees %d alive, %d "
                    "advert%s   ",
                    nodes, nodes, alive, adverts, adverts == 1 ? "" : "s");
        usleep(200000);
    }
    if (!json && isatty(STDERR_FILENO))
        fprintf(stderr, "\n");
    if (alive != nodes || adverts < want_adverts) {
        fprintf(stderr,
                "tessera up: the network did not converge within %d s (node 0 sees %d of "
                "%d alive, %d of %d adverts); logs in %s/node-*/tesserad.log. Stopping "
                "it.\n",
                timeout_s, alive, nodes, adverts, want_adverts, rundir);
        ts_updir_stop_all(rundir, 10, 1);
        return 1;
    }
    /* each node's metrics URL, from the file it wrote at start next to listen.addr */
    char node_metrics[TS_UPDIR_MAX_NODES][300];
    for (int i = 0; i < nodes; i++) {
        ts_updir_path(path, "%s/node-%d/data/metrics.url", rundir, i);
        if (ts_updir_read_line(path, node_metrics[i], sizeof node_metrics[i]) != 0)
            node_metrics[i][0] = 0;
    }
    if (json) {
        printf("{\"dir\":\"%s\",\"nodes\":%d,\"experts\":%d,\"peer\":\"%s\",\"network_key\":"
               "\"%s/network.key\",\"seconds\":%.2f,\"members\":[",
               rundir, nodes, k, addr0, rundir, ts_now_s() - t0);
        for (int i = 0; i < nodes; i++)
            printf("%s{\"node\":%d,\"addr\":\"%s\",\"metrics\":\"%s\",\"log\":\"%s/node-%d/"
                   "tesserad.log\"}",
                   i ? "," : "", i, node_addr[i], node_metrics[i], rundir, i);
        printf("]}\n");
        return 0;
    }
    run_status(addr0, rundir, "", NULL, 0);
    printf("\nThe network is up: %d node%s on 127.0.0.1, %d expert%s, converged in %.1f s.\n",
           nodes, nodes == 1 ? "" : "s", k, k == 1 ? "" : "s", ts_now_s() - t0);
    for (int i = 0; i < nodes; i++)
        printf("  node %-2d    %s  metrics %s  log %s/node-%d/tesserad.log\n", i, node_addr[i],
               node_metrics[i][0] ? node_metrics[i] : "(off)", rundir, i);
    printf("  status:    tessera status --peer %s --network-key %s/network.key\n", addr0, rundir);
    printf("  generate:  tessera generate --peer %s --network-key %s/network.key --n 16 "
           "--out grid.png\n",
           addr0, rundir);
    printf("  stop:      tessera down --dir %s\n", rundir_arg);
    return 0;
}

/* Node i's config with its bootstrap set to addr (a running node: the one it was written with may
 * be gone, and a restarted first node would otherwise start a network of its own). */
static int set_bootstrap(const char *rundir, int i, const char *addr) {
    char path[TS_UPDIR_PATHLEN], line[TS_UPDIR_PATHLEN];
    ts_updir_path(path, "%s/node-%d/tesserad.ini", rundir, i);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char *text = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&text, &len);
    int in_node = 0;
    while (o && fgets(line, sizeof line, f)) {
        if (line[0] == '[')
            in_node = strncmp(line, "[node]", 6) == 0;
        if (in_node && strncmp(line, "bootstrap =", 11) == 0)
            continue;
        fputs(line, o);
        if (in_node && strncmp(line, "listen =", 8) == 0)
            fprintf(o, "bootstrap = %s\n", addr);
    }
    fclose(f);
    if (!o)
        return -1;
    fclose(o);
    int e = 0, rc = ts_atomic_write(path, text, len, &e);
    free(text);
    return rc == TS_OK ? 0 : -1;
}

/* `tessera up --restart`: the nodes of rundir that are not running, started again with their
 * keys, stores and experts, joining through a running one. */
static int restart_dead(const char *rundir_arg, int timeout_s) {
    char rundir[TS_UPDIR_PATHLEN], daemon[TS_UPDIR_PATHLEN], path[TS_UPDIR_PATHLEN], via[300] = "",
                                                                                     done[512] = "";
    abs_path(rundir_arg, rundir, sizeof rundir);
    int n = 0, failed = 0;
    size_t used = 0;
    if (ts_updir_live_addr(rundir, via, sizeof via) != 0) {
        fprintf(stderr,
                "tessera up: no node of %s is running to rejoin through: `tessera up --dir %s` "
                "starts the network again\n",
                rundir_arg, rundir_arg);
        return 1;
    }
    ts_tesserad_path(daemon, sizeof daemon);
    double deadline = ts_now_s() + timeout_s;
    for (int i = 0; i < TS_UPDIR_MAX_NODES; i++) {
        ts_updir_path(path, "%s/node-%d/tesserad.ini", rundir, i);
        if (!ts_file_exists(path) || ts_updir_live_pid(rundir, i))
            continue;
        char addr[300];
        ts_updir_path(path, "%s/node-%d/data/listen.addr", rundir, i);
        unlink(path);
        pid_t pid = set_bootstrap(rundir, i, via) == 0 ? spawn(daemon, rundir, i) : -1;
        if (pid <= 0 || wait_listening(rundir, i, pid, deadline, addr, sizeof addr) != 0) {
            fprintf(stderr,
                    "tessera up: node %d did not start again: see %s/node-%d/tesserad.log\n", i,
                    rundir, i);
            failed = 1;
            continue;
        }
        n++;
        if (used < sizeof done)
            used += (size_t)snprintf(done + used, sizeof done - used, "%s%d at %s",
                                     used ? ", " : "", i, addr);
    }
    if (n)
        printf("tessera up: restarted node%s %s (joining through %s)\n", n == 1 ? "" : "s", done,
               via);
    else if (!failed)
        printf("tessera up: every node of %s is running\n", rundir_arg);
    return failed;
}

int ts_cmd_up(int argc, char **argv) {
    const char *rundir = "tessera-net", *experts = "experts";
    int nodes = 4, timeout_s = 120, no_experts = 0, json = 0, restart = 0;
    serve_opts_t so = {0, 0};
    ts_arg_t args[] = {
        {"nodes", TS_ARG_INT, &nodes, "N", "daemons to start (default 4)", 1, TS_UPDIR_MAX_NODES},
        {"experts", TS_ARG_STRING, &experts, "DIR",
         "a generation folder (partition.safetensors, expert-<k>.safetensors); node i hosts "
         "expert i mod K (default ./experts)"},
        {"dir", TS_ARG_STRING, &rundir, "RUNDIR",
         "where the nodes' keys, configs, stores and logs go (default ./tessera-net)"},
        {"timeout", TS_ARG_INT, &timeout_s, "S",
         "seconds to wait for the network to converge (default 120)", 1, 3600},
        {"no-experts", TS_ARG_FLAG, &no_experts, NULL, "start daemons that host nothing"},
        {"compute-threads", TS_ARG_INT, &so.compute_threads, "N",
         "each daemon's serving threads (default: one per core)", 0, 1024},
        {"max-batch", TS_ARG_INT, &so.max_batch, "ROWS",
         "each daemon's [serve] max_batch: forward rows per batch, and the most one request may "
         "take (default: the daemon's, 16)",
         1, 4096},
        {"json", TS_ARG_FLAG, &json, NULL, "print one JSON object (dir, peer, network_key)"},
        {"restart", TS_ARG_FLAG, &restart, NULL,
         "start again the nodes of RUNDIR that stopped (crashed, killed), with their keys, stores "
         "and experts, joining through a running one"},
    };
    const char *summary = "Start a network of tesserad daemons on this machine (127.0.0.1), "
                          "hosting the experts of a folder.\nusage: tessera up [--nodes N] "
                          "[--experts DIR] [--dir RUNDIR] [--restart]\n"
                          "example: tessera up --nodes 4 --experts experts/demo --dir tessera-net";
    int pr =
        ts_args_parse("tessera up", summary, args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    if (restart)
        return restart_dead(rundir, timeout_s);
    return up(rundir, experts, nodes, timeout_s, no_experts, json, &so);
}
