/*
 * log.c — tesserad's logs (daemon/log.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/log.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct {
    pthread_mutex_t mu;
    ts_log_level_t level;
    ts_log_format_t format;
    int fd; /* 2 = stderr */
    char path[TS_CONFIG_PATH_MAX];
} g_log = {PTHREAD_MUTEX_INITIALIZER, TS_LOG_INFO, TS_LOG_TEXT, 2, ""};

static int open_append(const char *path) {
    return open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
}

int ts_log_open(ts_log_level_t level, ts_log_format_t format, const char *path, char *err,
                size_t errlen) {
    int fd = 2;
    if (path && *path && (fd = open_append(path)) < 0) {
        ts_set_err(err, errlen, "log file %s: %s", path, strerror(errno));
        return TS_EIO;
    }
    pthread_mutex_lock(&g_log.mu);
    if (g_log.fd > 2)
        close(g_log.fd);
    g_log.level = level;
    g_log.format = format;
    g_log.fd = fd;
    snprintf(g_log.path, sizeof g_log.path, "%s", fd > 2 ? path : "");
    pthread_mutex_unlock(&g_log.mu);
    return TS_OK;
}

int ts_log_reopen(void) {
    pthread_mutex_lock(&g_log.mu);
    int rc = TS_OK;
    if (g_log.path[0]) {
        int fd = open_append(g_log.path);
        if (fd >= 0) {
            close(g_log.fd);
            g_log.fd = fd;
        } else {
            rc = TS_EIO;
        }
    }
    pthread_mutex_unlock(&g_log.mu);
    return rc;
}

void ts_log_close(void) {
    pthread_mutex_lock(&g_log.mu);
    if (g_log.fd > 2)
        close(g_log.fd);
    g_log.fd = 2;
    g_log.path[0] = '\0';
    pthread_mutex_unlock(&g_log.mu);
}

static void write_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* nowhere left to report it */
        s += w;
        n -= (size_t)w;
    }
}

void ts_log(ts_log_level_t level, const char *component, const char *fmt, ...) {
    if (level < g_log.level)
        return;
    char msg[2048], ts[40], line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    size_t k = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + k, sizeof ts - k, ".%03dZ", (int)(now.tv_nsec / 1000000));
    int n;
    if (g_log.format == TS_LOG_JSON) {
        json_t *j = json_pack("{s:s, s:s, s:s, s:s}", "ts", ts, "level", ts_log_level_name(level),
                              "component", component, "msg", msg);
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        n = snprintf(line, sizeof line, "%s\n", s ? s : "{\"msg\":\"(out of memory)\"}");
        free(s);
        json_decref(j);
    } else {
        n = snprintf(line, sizeof line, "%s %-5s %s: %s\n", ts, ts_log_level_name(level),
                     component, msg);
    }
    if (n < 0)
        return;
    if ((size_t)n >= sizeof line) { /* keep the line whole: cut, and end it */
        n = (int)sizeof line - 1;
        line[n - 1] = '\n';
    }
    pthread_mutex_lock(&g_log.mu);
    write_all(g_log.fd, line, (size_t)n);
    pthread_mutex_unlock(&g_log.mu);
}
