/*
 * bench_store.c — import and load throughput of the weights store against a plain file read.
 *
 * The expert is a `small` DiT (hidden 256, depth 6, heads 4, patch 2): ts_dit_create, DiT's
 * init, then every parameter overwritten with random values (a trained expert has no all-zero
 * chunks; the init's zeroed adaLN layers would otherwise deduplicate and flatter the store),
 * saved as F32 with ts_dit_save into a private temporary folder. In one run, on that one file:
 *
 *   read (page cache dropped)   open + read(2) into memory + close, after posix_fadvise
 *                               DONTNEED on the file (cold-ish: the kernel re-reads the disk
 *                               unless the hypervisor caches it);
 *   read (warm)                 the same with the file in the page cache — the baseline of the
 *                               ratios;
 *   hash only                   BLAKE2b-256 of the buffer in memory (what import and load must
 *                               at least do);
 *   import (new store)          ts_weights_import_file into an empty store: read, validate,
 *                               hash, write every chunk and the manifest, each commit fsync'd;
 *   import (all chunks present) the same file again: every chunk deduplicated;
 *   load                        ts_weights_load: reassemble in memory, verifying every chunk and
 *                               the whole hash;
 *   export                      ts_weights_export: the same into a file (fsync, rename).
 *
 * Each row runs --reps times (default 5; --quick: 1) and reports the median; MB/s is 10^6 bytes
 * of the file per second. The table is Markdown, ready for docs/benchmarks.md.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "model/dit_io.h"
#include "store/weights.h"

#define MAX_REPS 101

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what, int rc, const char *err) {
    fprintf(stderr, "bench_store: %s: %s%s%s\n", what, err ? err : "", err && *err ? ": " : "",
            ts_strerror(rc));
    exit(1);
}

/* read(2) of the whole file into buf; drop: evict it from the page cache first. */
static void read_file(const char *path, unsigned char *buf, size_t len, int drop) {
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        die("open", TS_EIO, path);
    if (drop) {
        (void)fdatasync(fd);
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            die("read", TS_EIO, path);
        got += (size_t)r;
    }
    close(fd);
}

static void remove_store(const char *dir) {
    char p[600];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
}

static ts_store_t *open_store(const char *dir) {
    ts_store_t *s = NULL;
    char err[512] = "";
    ts_store_opts_t o = {.dir = dir};
    int rc = ts_store_open(&s, &o, err, sizeof err);
    if (rc)
        die("opening the store", rc, err);
    return s;
}

enum { R_READ_COLD, R_READ_WARM, R_HASH, R_IMPORT, R_REIMPORT, R_LOAD, R_EXPORT, N_ROWS };
static const char *const row_names[N_ROWS] = {
    "read(2), page cache dropped", "read(2), warm (baseline)",   "BLAKE2b-256 of the buffer",
    "import, new store",           "import, all chunks present", "load (verified)",
    "export (verified, fsync)"};

int main(int argc, char **argv) {
    int reps = 5, json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            reps = 1;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > MAX_REPS) {
                fprintf(stderr, "bench_store: --reps must be 1..%d\n", MAX_REPS);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: bench_store [--reps N] [--quick] [--json]\n"
                            "  import and load throughput of a `small` expert in the store,\n"
                            "  next to a plain read(2) of the same safetensors file\n");
            return strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0 ? 0 : 2;
        }
    }
    char dir[] = "/tmp/bench_store_XXXXXX";
    if (!mkdtemp(dir))
        die("mkdtemp", TS_EIO, dir);
    char file[256], store_dir[256], out[256];
    snprintf(file, sizeof file, "%s/small.safetensors", dir);
    snprintf(store_dir, sizeof store_dir, "%s/store", dir);
    snprintf(out, sizeof out, "%s/exported.safetensors", dir);

    /* the expert */
    char err[512] = "";
    ts_engine_t eng;
    ts_engine_opts_t eo = {TS_CPU, 1, 0};
    ts_dit_config_t cfg;
    ts_dit_t m;
    int rc = ts_engine_init(&eng, &eo);
    if (rc == TS_OK)
        rc = ts_dit_config_preset("small", &cfg);
    if (rc == TS_OK)
        rc = ts_dit_create(&m, &cfg, &eng, 1, 0);
    if (rc == TS_OK)
        rc = ts_dit_init_weights(&m, 1);
    if (rc)
        die("building the small DiT", rc, NULL);
    float *p = m.param_mem.data;
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (int64_t i = 0; i < m.num_params; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
        p[i] = (float)((double)(x >> 11) * 0x1p-53 - 0.5) * 0.04f;
    }
    rc = ts_dit_save(&m, &m.param_mem, file, TS_ST_F32, NULL, 0, err, sizeof err);
    if (rc)
        die("saving the small DiT", rc, err);
    ts_dit_free(&m);
    ts_engine_free(&eng);
    struct stat st;
    if (stat(file, &st) != 0)
        die("stat", TS_EIO, file);
    size_t len = (size_t)st.st_size;
    unsigned char *buf = malloc(len);
    if (!buf)
        die("malloc", TS_ENOMEM, NULL);

    double secs[N_ROWS][MAX_REPS];
    ts_hash_t h;
    for (int r = 0; r < reps; r++) {
        double t0 = ts_now_s();
        read_file(file, buf, len, 1);
        secs[R_READ_COLD][r] = ts_now_s() - t0;
        t0 = ts_now_s();
        read_file(file, buf, len, 0);
        secs[R_READ_WARM][r] = ts_now_s() - t0;
        t0 = ts_now_s();
        ts_hash_compute(&h, buf, len);
        secs[R_HASH][r] = ts_now_s() - t0;

        remove_store(store_dir);
        ts_store_t *s = open_store(store_dir);
        t0 = ts_now_s();
        rc = ts_weights_import_file(s, file, &h, NULL, NULL, err, sizeof err);
        secs[R_IMPORT][r] = ts_now_s() - t0;
        if (rc)
            die("import", rc, err);
        t0 = ts_now_s();
        rc = ts_weights_import_file(s, file, &h, NULL, NULL, err, sizeof err);
        secs[R_REIMPORT][r] = ts_now_s() - t0;
        if (rc)
            die("import again", rc, err);
        unsigned char *loaded = NULL;
        size_t loaded_len = 0;
        t0 = ts_now_s();
        rc = ts_weights_load(s, &h, &loaded, &loaded_len, err, sizeof err);
        secs[R_LOAD][r] = ts_now_s() - t0;
        if (rc)
            die("load", rc, err);
        if (loaded_len != len || memcmp(loaded, buf, len) != 0)
            die("load", TS_ECORRUPT, "the loaded bytes differ from the file");
        free(loaded);
        t0 = ts_now_s();
        rc = ts_weights_export(s, &h, out, err, sizeof err);
        secs[R_EXPORT][r] = ts_now_s() - t0;
        if (rc)
            die("export", rc, err);
        unlink(out);
        ts_store_close(s);
    }
    remove_store(store_dir);
    unlink(file);
    rmdir(dir);
    free(buf);

    double mbs[N_ROWS], med[N_ROWS];
    for (int i = 0; i < N_ROWS; i++) {
        med[i] = median(secs[i], reps);
        mbs[i] = (double)len / 1e6 / med[i];
    }
    if (json) {
        printf("{\"bytes\":%zu,\"reps\":%d,\"rows\":[", len, reps);
        for (int i = 0; i < N_ROWS; i++)
            printf("%s{\"name\":\"%s\",\"seconds\":%.6f,\"mb_per_s\":%.1f,\"vs_read\":%.3f}",
                   i ? "," : "", row_names[i], med[i], mbs[i], mbs[i] / mbs[R_READ_WARM]);
        printf("]}\n");
        return 0;
    }
    printf("small expert: %zu bytes (%.1f MB, %zu chunks of 1 MiB), median of %d runs\n\n", len,
           (double)len / 1e6, (len + TS_WEIGHTS_CHUNK - 1) / TS_WEIGHTS_CHUNK, reps);
    printf("| operation | time | MB/s | vs read(2), warm |\n|---|---:|---:|---:|\n");
    for (int i = 0; i < N_ROWS; i++)
        printf("| %s | %.2f ms | %.0f | %.2f× |\n", row_names[i], 1e3 * med[i], mbs[i],
               mbs[i] / mbs[R_READ_WARM]);
    return 0;
}
