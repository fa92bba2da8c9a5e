#define _POSIX_C_SOURCE 200809L

#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/str.h"

static void set_errno(int *err_no, int e) {
    if (err_no)
        *err_no = e;
}

int ts_atomic_open(ts_atomic_file_t *a, const char *path, int *err_no) {
    set_errno(err_no, 0);
    if (!a)
        return TS_EINVAL;
    memset(a, 0, sizeof *a);
    if (!path || !*path)
        return TS_EINVAL;
    size_t n = strlen(path);
    a->path = ts_dup_str(path);
    a->tmp = malloc(n + sizeof ".tmp.XXXXXX");
    if (!a->path || !a->tmp) {
        ts_atomic_abort(a);
        return TS_ENOMEM;
    }
    memcpy(a->tmp, path, n);
    memcpy(a->tmp + n, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    int fd = mkstemp(a->tmp);
    if (fd < 0) {
        set_errno(err_no, errno);
        free(a->tmp);
        a->tmp = NULL; /* nothing was created */
        ts_atomic_abort(a);
        return TS_EIO;
    }
    if (fchmod(fd, 0644) != 0 || !(a->fp = fdopen(fd, "wb"))) {
        set_errno(err_no, errno);
        close(fd);
        ts_atomic_abort(a);
        return TS_EIO;
    }
    return TS_OK;
}

void ts_atomic_abort(ts_atomic_file_t *a) {
    if (!a)
        return;
    if (a->fp)
        fclose(a->fp);
    if (a->tmp)
        unlink(a->tmp);
    free(a->tmp);
    free(a->path);
    memset(a, 0, sizeof *a);
}

int ts_atomic_commit(ts_atomic_file_t *a, int ok, int *err_no) {
    if (!a || !a->fp)
        return TS_EINVAL;
    int e = 0;
    if (ok && (fflush(a->fp) != 0 || ferror(a->fp) || fsync(fileno(a->fp)) != 0))
        e = errno ? errno : EIO;
    int closed = fclose(a->fp);
    a->fp = NULL;
    if (ok && !e && closed != 0)
        e = errno ? errno : EIO;
    if (ok && !e && rename(a->tmp, a->path) != 0)
        e = errno;
    if (!ok || e) {
        if (e)
            set_errno(err_no, e);
        ts_atomic_abort(a);
        return TS_EIO;
    }
    ts_sync_parent_dir(a->path);
    free(a->tmp);
    a->tmp = NULL; /* published: nothing to remove */
    ts_atomic_abort(a);
    return TS_OK;
}

int ts_atomic_write(const char *path, const void *data, size_t len, int *err_no) {
    ts_atomic_file_t a;
    int rc = ts_atomic_open(&a, path, err_no);
    if (rc != TS_OK)
        return rc;
    int ok = len == 0 || fwrite(data, 1, len, a.fp) == len;
    if (!ok)
        set_errno(err_no, errno ? errno : EIO);
    return ts_atomic_commit(&a, ok, err_no);
}

void ts_sync_parent_dir(const char *path) {
    char *dir = path ? ts_dup_str(path) : NULL;
    if (!dir)
        return;
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash == dir)
        d = "/";
    else if (slash) {
        *slash = '\0';
        d = dir;
    }
    int fd = open(d, O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

int ts_file_exists(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
