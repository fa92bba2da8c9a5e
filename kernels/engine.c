/* engine.c — starting and stopping compute engines (see engine.h). */
#define _DEFAULT_SOURCE /* sysconf(_SC_PHYS_PAGES), _SC_AVPHYS_PAGES */
#include "kernels/engine.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"

#include "kernels/backend.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/fwd_gemm.h"
#include "kernels/cpu/vec.h"

int ts_engine_init(ts_engine_t *e, const ts_engine_opts_t *opts) {
    if (!e || !opts)
        return TS_EINVAL;
    memset(e, 0, sizeof *e);
    e->device = opts->device;
    switch (opts->device) {
    case TS_CPU:
        if (opts->threads < 0)
            return TS_EINVAL;
        return ts_cpu_engine_init(e, opts->threads);
    case TS_CUDA:
        if (opts->gpu < 0)
            return TS_EINVAL;
        return ts_cuda_engine_init(e, opts->gpu);
    default: return TS_EINVAL;
    }
}

void ts_engine_free(ts_engine_t *e) {
    if (!e)
        return;
    if (e->device == TS_CPU) {
        ts_cpu_bf16_free(e);
        ts_cpu_f16_free(e);
        ts_cpu_engine_free(e);
    } else if (e->device == TS_CUDA)
        ts_cuda_engine_free(e);
    memset(e, 0, sizeof *e);
}

int ts_engine_sync(ts_engine_t *e) {
    if (!e)
        return TS_EINVAL;
    return e->device == TS_CUDA ? ts_cuda_engine_sync(e) : TS_OK;
}

int ts_cuda_device_count(char *why, size_t why_len) { return ts_cuda_count(why, why_len); }

/* ---- devices by name ---- */

int ts_device_spec_parse(const char *text, ts_device_spec_t *out) {
    if (!out)
        return TS_EINVAL;
    ts_device_spec_t s = {.automatic = 0, .device = TS_CPU, .gpu = 0};
    if (!text || !*text || strcmp(text, "auto") == 0)
        s.automatic = 1;
    else if (strcmp(text, "cpu") == 0)
        s.device = TS_CPU;
    else if (strncmp(text, "cuda", 4) == 0 && (text[4] == '\0' || text[4] == ':')) {
        s.device = TS_CUDA;
        if (text[4] == ':') {
            const char *digits = text + 5;
            char *end = NULL;
            if (*digits < '0' || *digits > '9')
                return TS_EINVAL;
            long n = strtol(digits, &end, 10);
            if (*end != '\0' || n < 0 || n > 1023)
                return TS_EINVAL;
            s.gpu = (int)n;
        }
    } else
        return TS_EINVAL;
    *out = s;
    return TS_OK;
}

void ts_device_spec_format(const ts_device_spec_t *spec, char *buf, size_t len) {
    if (!buf || len == 0)
        return;
    if (!spec || spec->automatic)
        snprintf(buf, len, "auto");
    else if (spec->device == TS_CUDA)
        snprintf(buf, len, "cuda:%d", spec->gpu);
    else
        snprintf(buf, len, "cpu");
}

void ts_engine_describe(const ts_engine_t *e, char *buf, size_t len) {
    if (!buf || len == 0)
        return;
    if (!e) {
        snprintf(buf, len, "none");
        return;
    }
    if (e->device != TS_CUDA) { /* and the GEMM kernels: OpenBLAS's set (blas_core.h) */
        ts_blas_status_t b;
        ts_blas_status(&b);
        int onednn = ts_cpu_fwd_onednn(), tiles = e->vec && e->vec->lin && !onednn;
        snprintf(buf, len, "cpu, %d thread%s, OpenBLAS %s%s%s%s%s%s%s", e->threads,
                 e->threads == 1 ? "" : "s", b.core, b.weaker ? " (the CPU runs " : "",
                 b.weaker ? b.cpu_best : "", b.weaker ? ")" : "",
                 onednn ? ", forward products oneDNN" : "", tiles ? ", linears " : "",
                 tiles ? e->vec->name : "");
        return;
    }
    char name[256];
    size_t total = 0;
    if (ts_cuda_info(e->gpu, name, sizeof name, &total, NULL) != TS_OK)
        snprintf(name, sizeof name, "unknown device");
    snprintf(buf, len, "cuda:%d, %s, %.1f GiB", e->gpu, name,
             (double)total / (1024.0 * 1024.0 * 1024.0));
}

void ts_engine_device_class(const ts_engine_t *e, char *buf, size_t len) {
    if (!buf || len == 0)
        return;
    if (!e) {
        snprintf(buf, len, "none");
        return;
    }
    if (e->device != TS_CUDA) {
        ts_blas_status_t b;
        ts_blas_status(&b);
        snprintf(buf, len, "cpu/%s%s%s/n%d", b.core[0] ? b.core : "unknown",
                 ts_cpu_fwd_onednn() ? "+onednn" : "", e->vec && !e->vec->att ? "+base" : "",
                 TS_NUMERICS_REV);
        for (char *c = buf; *c; c++)
            *c = (char)tolower((unsigned char)*c);
        return;
    }
    char name[200];
    if (ts_cuda_info(e->gpu, name, sizeof name, NULL, NULL) != TS_OK)
        snprintf(name, sizeof name, "unknown device");
    snprintf(buf, len, "cuda/%s/n%d", name, TS_NUMERICS_REV);
}

int ts_engine_memory_usable(const ts_engine_t *e, uint64_t *free_bytes, uint64_t *total) {
    if (!e || !free_bytes || !total)
        return TS_EINVAL;
    *free_bytes = *total = 0;
    if (e->device == TS_CUDA) {
        size_t t = 0, used = 0;
        TS_TRY(ts_engine_memory(e, &t, &used));
        *total = t;
        *free_bytes = t - used > TS_ENGINE_GPU_RESERVE ? t - used - TS_ENGINE_GPU_RESERVE : 0;
        return TS_OK;
    }
    long page = sysconf(_SC_PAGESIZE), pages = sysconf(_SC_PHYS_PAGES);
    long avail = sysconf(_SC_AVPHYS_PAGES);
    if (page <= 0 || pages <= 0)
        return TS_ENOTSUP;
    *total = (uint64_t)pages * (uint64_t)page;
    *free_bytes = avail > 0 ? (uint64_t)avail * (uint64_t)page : 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[128];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                *free_bytes = (uint64_t)kb * 1024u;
                break;
            }
        fclose(f);
    }
    /* a container's limit (cgroup v2), which the machine-wide figures do not see */
    unsigned long long max = 0, cur = 0;
    FILE *fm = fopen("/sys/fs/cgroup/memory.max", "r"),
         *fc = fopen("/sys/fs/cgroup/memory.current", "r");
    if (fm && fc && fscanf(fm, "%llu", &max) == 1 && fscanf(fc, "%llu", &cur) == 1 && max > 0) {
        uint64_t room = max > cur ? (uint64_t)(max - cur) : 0;
        *free_bytes = room < *free_bytes ? room : *free_bytes;
        *total = (uint64_t)max < *total ? (uint64_t)max : *total;
    }
    if (fm)
        fclose(fm);
    if (fc)
        fclose(fc);
    return TS_OK;
}

int ts_engine_memory(const ts_engine_t *e, size_t *total, size_t *used) {
    if (!e || !total || !used)
        return TS_EINVAL;
    *total = *used = 0;
    if (e->device != TS_CUDA)
        return TS_ENODEV;
    size_t t = 0, f = 0;
    int rc = ts_cuda_info(e->gpu, NULL, 0, &t, &f);
    if (rc != TS_OK)
        return rc;
    *total = t;
    *used = t - (f < t ? f : t);
    return TS_OK;
}

int ts_engine_mark(ts_engine_t *e, ts_engine_mark_t *m) {
    if (!e || !m)
        return TS_EINVAL;
    if (e->device == TS_CUDA)
        return e->cuda ? ts_cuda_event_record(e, &m->event) : TS_ENODEV;
    if (!e->pool)
        return TS_EINVAL;
    m->t = ts_now_s();
    return TS_OK;
}

int ts_engine_marks_elapsed(ts_engine_t *e, const ts_engine_mark_t *a, const ts_engine_mark_t *b,
                            double *seconds) {
    if (!e || !a || !b || !seconds)
        return TS_EINVAL;
    *seconds = 0.0;
    if (e->device == TS_CUDA)
        return a->event && b->event ? ts_cuda_event_elapsed(e, a->event, b->event, seconds)
                                    : TS_EINVAL;
    if (b->t < a->t)
        return TS_EINVAL;
    *seconds = b->t - a->t;
    return TS_OK;
}

int ts_engine_mark_wait(ts_engine_t *e, const ts_engine_mark_t *m) {
    if (!e || !m)
        return TS_EINVAL;
    if (e->device == TS_CUDA)
        return m->event ? ts_cuda_event_wait(e, m->event) : TS_EINVAL;
    return TS_OK;
}

int ts_engine_copy_async(ts_engine_t *e, ts_tensor_t *dst, const ts_tensor_t *src) {
    if (!e || ts_tensor_check(dst) || ts_tensor_check(src))
        return TS_EINVAL;
    if (dst->dtype != src->dtype)
        return TS_EDTYPE;
    if (ts_tensor_numel(dst) != ts_tensor_numel(src))
        return TS_ESHAPE;
    if (e->device != TS_CUDA || (dst->device == TS_CPU && src->device == TS_CPU))
        return ts_tensor_copy(dst, src);
    return ts_cuda_memcpy_async(e, dst->data, dst->device, src->data, src->device,
                                ts_tensor_nbytes(src));
}

int ts_engine_capture_begin(ts_engine_t *e) {
    if (!e)
        return TS_EINVAL;
    if (e->device != TS_CUDA)
        return TS_ENOTSUP;
    return e->cuda ? ts_cuda_capture_begin(e) : TS_ENODEV;
}

int ts_engine_capture_end(ts_engine_t *e, ts_engine_graph_t *graph) {
    if (!e || !graph)
        return TS_EINVAL;
    graph->exec = NULL;
    if (e->device != TS_CUDA)
        return TS_ENOTSUP;
    return e->cuda ? ts_cuda_capture_end(e, &graph->exec) : TS_ENODEV;
}

int ts_engine_graph_launch(ts_engine_t *e, const ts_engine_graph_t *graph) {
    if (!e || !graph || !graph->exec)
        return TS_EINVAL;
    if (e->device != TS_CUDA)
        return TS_ENOTSUP;
    return e->cuda ? ts_cuda_graph_launch(e, graph->exec) : TS_ENODEV;
}

void ts_engine_graph_free(ts_engine_graph_t *graph) {
    if (!graph)
        return;
    ts_cuda_graph_free(graph->exec);
    graph->exec = NULL;
}

void ts_graph_cache_drop(ts_graph_cache_t *c) {
    if (!c)
        return;
    for (int i = 0; i < TS_GRAPH_SLOTS; i++)
        ts_engine_graph_free(&c->graph[i]);
    memset(c->key, 0, sizeof c->key);
    memset(c->seen, 0, sizeof c->seen);
    c->next = c->seen_next = 0;
}

void ts_graph_cache_set(ts_graph_cache_t *c, int on) {
    if (!c)
        return;
    ts_graph_cache_drop(c);
    c->on = on != 0;
}

static int same_key(const ts_graph_key_t *a, const ts_graph_key_t *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

int ts_graph_cache_plan(const ts_graph_cache_t *c, const ts_engine_t *e, const ts_graph_key_t *k) {
    if (!c || !e || !k || c->on != 1 || e->device != TS_CUDA)
        return TS_GRAPH_EAGER;
    ts_graph_key_t key = *k;
    key.epoch = e->scratch_epoch;
    for (int i = 0; i < TS_GRAPH_SLOTS; i++)
        if (c->graph[i].exec && same_key(&c->key[i], &key))
            return i;
    for (int i = 0; i < TS_GRAPH_SLOTS; i++)
        if (same_key(&c->seen[i], &key))
            return TS_GRAPH_CAPTURE;
    return TS_GRAPH_FIRST;
}

int ts_graph_cache_run(ts_engine_t *e, ts_graph_cache_t *c, const ts_graph_key_t *k,
                       ts_graph_work_fn work, void *ctx) {
    if (!e || !c || !k || !work)
        return TS_EINVAL;
    ts_graph_key_t key = *k;
    key.epoch = e->scratch_epoch;
    int plan = ts_graph_cache_plan(c, e, k);
    if (plan >= 0) {
        TS_TRY(ts_engine_graph_launch(e, &c->graph[plan]));
        c->launches++;
        return TS_OK;
    }
    if (plan == TS_GRAPH_EAGER)
        return work(ctx);
    if (plan == TS_GRAPH_FIRST) { /* eagerly, every scratch sized; remembered as it left them */
        TS_TRY(work(ctx));
        key.epoch = e->scratch_epoch;
        c->seen[c->seen_next] = key;
        c->seen_next = (c->seen_next + 1) % TS_GRAPH_SLOTS;
        return TS_OK;
    }
    ts_engine_graph_t made = {NULL}; /* the slot's older graph stays until this one is made */
    int rc = ts_engine_capture_begin(e), ops = TS_OK;
    if (rc == TS_OK) {
        ops = work(ctx);
        rc = ts_engine_capture_end(e, &made); /* ends it whatever the work said */
    }
    if (rc == TS_OK && ops != TS_OK) { /* an op refused (nothing ran): as eagerly */
        ts_engine_graph_free(&made);
        return ops;
    }
    if (rc != TS_OK) { /* the capture itself failed: off, eager from now on */
        ts_graph_cache_drop(c);
        c->on = -1;
        return work(ctx);
    }
    int slot = c->next;
    ts_engine_graph_free(&c->graph[slot]);
    c->graph[slot] = made;
    c->key[slot] = key;
    c->next = (slot + 1) % TS_GRAPH_SLOTS;
    c->captures++;
    TS_TRY(ts_engine_graph_launch(e, &c->graph[slot]));
    c->launches++;
    return TS_OK;
}

void ts_engine_mark_free(ts_engine_mark_t *m) {
    if (!m)
        return;
    if (m->event)
        ts_cuda_event_free(m->event);
    memset(m, 0, sizeof *m);
}

int ts_engine_utilization(const ts_engine_t *e, double *ratio) {
    if (!e || !ratio)
        return TS_EINVAL;
    *ratio = 0.0;
    if (e->device != TS_CUDA)
        return TS_ENODEV;
    return ts_cuda_utilization(e->gpu, ratio);
}

/* rc's words; for a cuBLAS failure, also why cuBLAS could not be opened when that was the cause
 * (a GPU whose machine lacks the library: kernels/backend.h, ts_cuda_blas_load). */
static void start_failure(int rc, char *out, size_t len) {
    char blas[256] = "";
    if (rc == TS_ECUBLAS && ts_cuda_blas_load(blas, sizeof blas) != TS_OK)
        snprintf(out, len, "%s (%s)", ts_strerror(rc), blas);
    else
        snprintf(out, len, "%s", ts_strerror(rc));
}

int ts_engine_init_spec(ts_engine_t *e, const ts_device_spec_t *spec, int threads, char *note,
                        size_t note_len) {
    if (!e || !spec)
        return TS_EINVAL;
    char why[256] = "";
    ts_engine_opts_t eo = {.device = spec->device, .threads = threads, .gpu = spec->gpu};
    if (spec->automatic) {
        eo.device = ts_cuda_device_count(why, sizeof why) > 0 ? TS_CUDA : TS_CPU;
        eo.gpu = 0;
    } else if (spec->device == TS_CUDA) {
        int count = ts_cuda_device_count(why, sizeof why);
        if (count > 0 && spec->gpu >= count)
            snprintf(why, sizeof why, "no device cuda:%d (this machine has %d)", spec->gpu, count);
        if (spec->gpu >= count) {
            if (note && note_len > 0)
                snprintf(note, note_len, "cuda:%d: %s", spec->gpu, why);
            return TS_ENODEV;
        }
    }
    int rc = ts_engine_init(e, &eo);
    if (rc != TS_OK && spec->automatic && eo.device == TS_CUDA) {
        /* a GPU that is present but cannot start (driver, memory): auto falls back, and says so */
        char failure[320];
        start_failure(rc, failure, sizeof failure);
        snprintf(why, sizeof why, "cuda:0 did not start: %.220s", failure);
        eo.device = TS_CPU;
        rc = ts_engine_init(e, &eo);
    }
    if (!note || note_len == 0)
        return rc;
    if (rc != TS_OK) {
        char failure[320];
        start_failure(rc, failure, sizeof failure);
        snprintf(note, note_len, "%s: %s", eo.device == TS_CUDA ? "cuda" : "cpu", failure);
        return rc;
    }
    char desc[320];
    ts_engine_describe(e, desc, sizeof desc);
    if (spec->automatic && eo.device == TS_CPU)
        snprintf(note, note_len, "%s (auto: %s)", desc, why);
    else
        snprintf(note, note_len, "%s%s", desc, spec->automatic ? " (auto)" : "");
    return rc;
}

/* ---- precision ---- */

int ts_precision_parse(const char *text, ts_precision_t *out) {
    if (!out)
        return TS_EINVAL;
    if (!text || !*text || strcmp(text, "f32") == 0)
        *out = TS_PREC_F32;
    else if (strcmp(text, "bf16") == 0)
        *out = TS_PREC_BF16;
    else if (strcmp(text, "f16") == 0)
        *out = TS_PREC_F16;
    else
        return TS_EINVAL;
    return TS_OK;
}

const char *ts_precision_name(ts_precision_t p) {
    return p == TS_PREC_BF16 ? "bf16" : p == TS_PREC_F16 ? "f16" : "f32";
}

ts_dtype_t ts_precision_dtype(ts_precision_t p) {
    return p == TS_PREC_BF16 ? TS_BF16 : p == TS_PREC_F16 ? TS_F16 : TS_F32;
}

int ts_engine_precision_check(ts_engine_t *e, ts_precision_t p, char *why, size_t why_len) {
    if (!e)
        return TS_EINVAL;
    if (p == TS_PREC_F32 || p == TS_PREC_F16)
        return TS_OK;
    if (p != TS_PREC_BF16)
        return TS_EINVAL;
    if (e->device == TS_CUDA)
        return ts_cuda_bf16_check(e, why, why_len);
    return ts_cpu_bf16_check(e, why, why_len);
}
