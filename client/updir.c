/* updir.c — the folder of a network `tessera up` started (updir.h). */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* usleep, realpath */

#include "client/updir.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"

void ts_updir_path(char *out, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, TS_UPDIR_PATHLEN, fmt, ap);
    va_end(ap);
}

/* Reads a small text file's first line into buf (without the newline); 0 on success. */
int ts_updir_read_line(const char *path, char *buf, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char *got = fgets(buf, (int)len, f);
    fclose(f);
    if (!got)
        return -1;
    buf[strcspn(buf, "\n")] = 0;
    return buf[0] ? 0 : -1;
}

/* Whether process pid is a tesserad run with --config naming the file ini (an absolute, real
 * path): its command line, a relative path resolved against its working folder. */
static int runs_config(long pid, const char *ini) {
    char path[TS_UPDIR_PATHLEN], cmd[TS_UPDIR_PATHLEN], cwd[TS_UPDIR_PATHLEN],
        full[2 * TS_UPDIR_PATHLEN + 2], real[PATH_MAX];
    ts_updir_path(path, "/proc/%ld/cmdline", pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(cmd, 1, sizeof cmd - 1, f) : 0;
    if (f)
        fclose(f);
    cmd[n] = 0;
    const char *argv0 = strrchr(cmd, '/') ? strrchr(cmd, '/') + 1 : cmd;
    if (!strstr(argv0, "tesserad")) /* tesserad, or a build of it named after it */
        return 0;
    for (size_t at = strlen(cmd) + 1; at < n; at += strlen(cmd + at) + 1) {
        const char *arg = cmd + at, *value = NULL;
        if (strcmp(arg, "--config") == 0 && at + strlen(arg) + 1 < n)
            value = arg + strlen(arg) + 1;
        else if (strncmp(arg, "--config=", 9) == 0)
            value = arg + 9;
        if (!value)
            continue;
        if (value[0] == '/') {
            snprintf(full, sizeof full, "%s", value);
        } else {
            ts_updir_path(path, "/proc/%ld/cwd", pid);
            ssize_t m = readlink(path, cwd, sizeof cwd - 1);
            if (m <= 0)
                return 0;
            cwd[m] = 0;
            snprintf(full, sizeof full, "%s/%s", cwd, value);
        }
        return realpath(full, real) && strcmp(real, ini) == 0;
    }
    return 0;
}

/* The tesserad of node i: the pid in DIR/node-i/tesserad.pid when that process is alive and is
 * a tesserad (a stale file whose pid was reused by another program does not count), else any
 * tesserad running that node's config (one restarted by hand); 0 when none. */
pid_t ts_updir_live_pid(const char *rundir, int i) {
    char path[TS_UPDIR_PATHLEN], line[64], ini[PATH_MAX];
    ts_updir_path(path, "%s/node-%d/tesserad.ini", rundir, i);
    if (!realpath(path, ini))
        return 0; /* no such node */
    ts_updir_path(path, "%s/node-%d/tesserad.pid", rundir, i);
    if (ts_updir_read_line(path, line, sizeof line) == 0) {
        long pid = strtol(line, NULL, 10);
        if (pid > 1 && kill((pid_t)pid, 0) == 0 && runs_config(pid, ini))
            return (pid_t)pid;
    }
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    while (d && !found && (e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end == 0 && pid > 1 && runs_config(pid, ini))
            found = (pid_t)pid;
    }
    if (d)
        closedir(d);
    return found;
}

int ts_updir_live_addr(const char *rundir, char *addr, size_t len) {
    char path[TS_UPDIR_PATHLEN];
    for (int i = 0; i < TS_UPDIR_MAX_NODES; i++) {
        ts_updir_path(path, "%s/node-%d/data/listen.addr", rundir, i);
        if (ts_updir_live_pid(rundir, i) && ts_updir_read_line(path, addr, len) == 0)
            return 0;
    }
    return -1;
}

/* Stops the nodes of rundir: SIGTERM, then SIGKILL after timeout_s. Returns how many ran. */
int ts_updir_stop_all(const char *rundir, double timeout_s, int quiet) {
    pid_t pids[TS_UPDIR_MAX_NODES];
    int n = 0;
    for (int i = 0; i < TS_UPDIR_MAX_NODES; i++) {
        pids[i] = ts_updir_live_pid(rundir, i);
        if (pids[i]) {
            kill(pids[i], SIGTERM);
            n++;
        }
    }
    double deadline = ts_now_s() + timeout_s;
    for (;;) {
        int left = 0;
        for (int i = 0; i < TS_UPDIR_MAX_NODES; i++) {
            if (!pids[i])
                continue;
            waitpid(pids[i], NULL, WNOHANG); /* our own children, when up fails */
            if (kill(pids[i], 0) == 0)
                left++;
            else
                pids[i] = 0;
        }
        if (!left)
            break;
        if (ts_now_s() > deadline) {
            for (int i = 0; i < TS_UPDIR_MAX_NODES; i++)
                if (pids[i]) {
                    if (!quiet)
                        fprintf(stderr,
                                "tessera down: node %d (pid %ld) still running after "
                                "%.0f s: SIGKILL\n",
                                i, (long)pids[i], timeout_s);
                    kill(pids[i], SIGKILL);
                }
            break;
        }
        usleep(50000);
    }
    for (int i = 0; i < TS_UPDIR_MAX_NODES; i++) {
        char path[TS_UPDIR_PATHLEN];
        ts_updir_path(path, "%s/node-%d/tesserad.pid", rundir, i);
        unlink(path);
    }
    return n;
}
