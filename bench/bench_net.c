/*
 * bench_net.c — what the secure links cost (docs/benchmarks.md, "Secure links").
 *
 *   bench_net [--quick] [--repeats N] [--json]
 *
 * In one run, on loopback:
 *   - raw AEAD: libsodium's ChaCha20-Poly1305 (IETF) sealing 65519-byte messages in memory, the
 *     most a transport message holds: the ceiling for one core;
 *   - stream throughput: 1 MiB frames sent as fast as the write queue allows, over a tessera
 *     connection (net/conn.h: Noise transport, 2- and 4-byte framing) and over plain TCP with the
 *     same 4-byte framing on the same kind of libuv loop;
 *   - round trips: a frame of 1 KiB and one of 64 KiB echoed back, one at a time, encrypted and
 *     plain; p50 and p99 by nearest rank.
 * The receiving side runs on its own thread and loop (as it would in its own process), so
 * sealing and opening run on different cores, as between two machines. Each measurement is
 * repeated N times (default 3), interleaved with the others, and the best is kept: on a shared
 * machine the best run is the least disturbed one.
 *
 * CPU time. On a machine shared with other work, wall-clock throughput says as much about the
 * other work as about the link. So the raw AEAD and each stream also report the CPU time their
 * threads spent per GB (CLOCK_THREAD_CPUTIME_ID: the sending thread, and the receiving thread
 * from its first byte to its answer), and "CPU-bound" throughput, 1 / the busier side's seconds
 * per GB: what the link would carry with one core to itself on each side.
 *
 * The frames are opaque bytes, not Envelopes: this measures the link, not protobuf.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "net/conn.h"
#include "net/frame.h"

#define FRAME (1u << 20)
#define PLAIN_HIGH_WATER ((size_t)4 << 20)

/* ---- a link: the encrypted one or plain TCP, behind one interface -------------------------- */

typedef struct link link_t;
struct link {
    int plain;
    ts_conn_t *conn; /* encrypted */
    uv_tcp_t *tcp;   /* plain */
    ts_frame_reader_t rd;
    size_t queued;
    void (*on_frame)(link_t *l, const uint8_t *d, size_t n);
    void (*on_drain)(link_t *l);
    void *data;
};

typedef struct pwrite {
    uv_write_t req;
    link_t *l;
    size_t len;
    uint8_t data[];
} pwrite_t;

static void plain_written(uv_write_t *req, int status) {
    pwrite_t *w = (pwrite_t *)req;
    link_t *l = w->l;
    l->queued -= w->len;
    free(w);
    if (l->queued <= PLAIN_HIGH_WATER / 2 && l->on_drain)
        l->on_drain(l);
}

static void link_send(link_t *l, const uint8_t *d, size_t n) {
    if (!l->plain) {
        if (ts_conn_send(l->conn, d, n)) {
            fprintf(stderr, "bench_net: send failed\n");
            exit(1);
        }
        return;
    }
    pwrite_t *w = malloc(sizeof *w + 4 + n);
    ts_frame_put_app_len(w->data, n, TS_FRAME_MAX_LIMIT);
    memcpy(w->data + 4, d, n);
    w->l = l;
    w->len = 4 + n;
    l->queued += w->len;
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
    uv_write(&w->req, (uv_stream_t *)l->tcp, &b, 1, plain_written);
}

static int link_congested(const link_t *l) {
    return l->plain ? l->queued > PLAIN_HIGH_WATER : ts_conn_congested(l->conn);
}

/* plain reading: the same app-frame reader as the encrypted side's */
static uint8_t plain_rbuf[65536];
static void plain_alloc(uv_handle_t *h, size_t s, uv_buf_t *b) {
    *b = uv_buf_init((char *)plain_rbuf, sizeof plain_rbuf);
}
static void plain_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
    link_t *l = s->data;
    if (n < 0) {
        uv_close((uv_handle_t *)s, NULL);
        return;
    }
    size_t pos = 0;
    while (pos < (size_t)n) {
        const uint8_t *f;
        size_t used, fl;
        if (ts_frame_reader_feed(&l->rd, (uint8_t *)b->base + pos, (size_t)n - pos, &used, &f, &fl,
                                 NULL, 0))
            exit(1);
        pos += used;
        if (f)
            l->on_frame(l, f, fl);
    }
}

/* Nanoseconds of CPU time the calling thread has used. */
static uint64_t thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* ---- the receiving side: counts, echoes, reports -------------------------------------------- */

typedef struct tally {
    uint64_t bytes; /* of 'T' frames since the last 'D' */
    uint64_t timed; /* of them, those after the first */
    uint64_t cpu0;  /* thread_cpu_ns() when the first was delivered */
} tally_t;

/* Frames: 'T' + bytes (count them), 'D' (answer 'R', the count, and the bytes and CPU ns from
 * the first 'T' on), 'E' + bytes (echo). */
static void serve_frame(link_t *l, const uint8_t *d, size_t n) {
    tally_t *t = l->data;
    if (d[0] == 'T') {
        if (t->bytes == 0)
            t->cpu0 = thread_cpu_ns();
        else
            t->timed += n;
        t->bytes += n;
    } else if (d[0] == 'D') {
        uint8_t r[25] = {'R'};
        uint64_t cpu = thread_cpu_ns() - t->cpu0;
        memcpy(r + 1, &t->bytes, 8);
        memcpy(r + 9, &t->timed, 8);
        memcpy(r + 17, &cpu, 8);
        t->bytes = t->timed = 0;
        link_send(l, r, sizeof r);
    } else {
        link_send(l, d, n);
    }
}

typedef struct server {
    uv_loop_t loop;
    uv_async_t stop;
    ts_net_t *net;
    uv_tcp_t plain;
    int enc_port, plain_port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready;
} server_t;

static void enc_srv_open(ts_conn_t *c) {
    link_t *l = calloc(1, sizeof *l);
    l->conn = c;
    l->on_frame = serve_frame;
    l->data = calloc(1, sizeof(tally_t));
    ts_conn_set_data(c, l);
}
static void enc_frame(ts_conn_t *c, const uint8_t *d, size_t n) {
    link_t *l = ts_conn_data(c);
    l->on_frame(l, d, n);
}
static void enc_drain(ts_conn_t *c) {
    link_t *l = ts_conn_data(c);
    if (l && l->on_drain)
        l->on_drain(l);
}
static void enc_srv_close(ts_conn_t *c, const ts_conn_close_info_t *why) {
    link_t *l = ts_conn_data(c);
    if (l) {
        free(l->data);
        free(l);
    }
}
static const ts_conn_handler_t enc_srv_handler = {enc_srv_open, enc_frame, enc_drain,
                                                  enc_srv_close};

static void plain_srv_closed(uv_handle_t *h) {
    link_t *l = h->data;
    ts_frame_reader_free(&l->rd);
    free(l->data);
    free(l);
    free(h);
}
static void plain_srv_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
    if (n < 0) {
        uv_close((uv_handle_t *)s, plain_srv_closed);
        return;
    }
    plain_read(s, n, b);
}
static void plain_accept(uv_stream_t *srv, int status) {
    uv_tcp_t *t = malloc(sizeof *t);
    uv_tcp_init(srv->loop, t);
    uv_accept(srv, (uv_stream_t *)t);
    uv_tcp_nodelay(t, 1);
    link_t *l = calloc(1, sizeof *l);
    l->plain = 1;
    l->tcp = t;
    l->on_frame = serve_frame;
    l->data = calloc(1, sizeof(tally_t));
    ts_frame_reader_init_app(&l->rd, TS_FRAME_MAX_LIMIT);
    t->data = l;
    uv_read_start((uv_stream_t *)t, plain_alloc, plain_srv_read);
}

static void server_stop(uv_async_t *a) {
    server_t *s = a->data;
    uv_close((uv_handle_t *)&s->stop, NULL);
    uv_close((uv_handle_t *)&s->plain, NULL);
    ts_net_shutdown(s->net);
}

static ts_identity_t sid, cid;
static ts_netkey_t nk;

static void *server_main(void *arg) {
    server_t *s = arg;
    uv_loop_init(&s->loop);
    ts_listener_t *l;
    if (ts_net_new(&s->net, &s->loop, &sid, &nk, NULL) ||
        ts_net_listen(s->net, "127.0.0.1:0", &enc_srv_handler, NULL, &l, NULL, 0))
        exit(1);
    s->enc_port = ts_listener_port(l);
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", 0, &a);
    uv_tcp_init(&s->loop, &s->plain);
    uv_tcp_bind(&s->plain, (struct sockaddr *)&a, 0);
    uv_listen((uv_stream_t *)&s->plain, 16, plain_accept);
    struct sockaddr_storage b;
    int bl = sizeof b;
    uv_tcp_getsockname(&s->plain, (struct sockaddr *)&b, &bl);
    s->plain_port = ntohs(((struct sockaddr_in *)&b)->sin_port);
    uv_async_init(&s->loop, &s->stop, server_stop);
    s->stop.data = s;
    pthread_mutex_lock(&s->mu);
    s->ready = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    ts_net_free(s->net);
    uv_loop_close(&s->loop);
    return NULL;
}

/* ---- the sending side ------------------------------------------------------------------------ */

static uv_loop_t loop;
static ts_net_t *cnet;

typedef struct run {
    link_t link;
    int done;
    /* throughput */
    uint64_t total, sent, received, recv_timed, recv_cpu_ns;
    uint8_t *frame;
    /* round trips */
    size_t size;
    int iters, k;
    double *rtt_us;
    uint64_t t0;
} run_t;

static void pump(link_t *l) { /* keep the write queue full */
    run_t *r = l->data;
    while (r->sent < r->total && !link_congested(l)) {
        link_send(l, r->frame, FRAME);
        r->sent += FRAME;
    }
    if (r->sent >= r->total && r->sent != UINT64_MAX) {
        r->sent = UINT64_MAX;
        uint8_t d = 'D';
        link_send(l, &d, 1);
    }
}

static void tp_frame(link_t *l, const uint8_t *d, size_t n) {
    run_t *r = l->data;
    if (n != 25 || d[0] != 'R') {
        fprintf(stderr, "bench_net: an answer of %zu bytes, not the count\n", n);
        exit(1);
    }
    memcpy(&r->received, d + 1, 8);
    memcpy(&r->recv_timed, d + 9, 8);
    memcpy(&r->recv_cpu_ns, d + 17, 8);
    r->done = 1;
}

static void rt_send(run_t *r) {
    r->t0 = uv_hrtime();
    link_send(&r->link, r->frame, r->size);
}

static void rt_frame(link_t *l, const uint8_t *d, size_t n) {
    run_t *r = l->data;
    r->rtt_us[r->k++] = (double)(uv_hrtime() - r->t0) / 1e3;
    if (n != r->size) {
        fprintf(stderr, "bench_net: echo of %zu bytes, sent %zu\n", n, r->size);
        exit(1);
    }
    if (r->k == r->iters)
        r->done = 1;
    else
        rt_send(r);
}

static int opened;
static void cl_open(ts_conn_t *c) { opened = 1; }
static void cl_close(ts_conn_t *c, const ts_conn_close_info_t *why) {}
static const ts_conn_handler_t cl_handler = {cl_open, enc_frame, enc_drain, cl_close};

static void plain_connected(uv_connect_t *req, int status) {
    if (status < 0) {
        fprintf(stderr, "bench_net: %s\n", uv_strerror(status));
        exit(1);
    }
    opened = 1;
}

static void plain_cl_written(uv_write_t *req, int status) { plain_written(req, status); }

/* Opens a link of either kind to the server thread and runs the loop until it is open. */
static void link_open(link_t *l, int plain, const server_t *s, run_t *r) {
    memset(l, 0, sizeof *l);
    l->plain = plain;
    l->data = r;
    opened = 0;
    char addr[64];
    if (plain) {
        snprintf(addr, sizeof addr, "127.0.0.1:%d", s->plain_port);
        l->tcp = malloc(sizeof *l->tcp);
        uv_tcp_init(&loop, l->tcp);
        uv_tcp_nodelay(l->tcp, 1);
        l->tcp->data = l;
        ts_frame_reader_init_app(&l->rd, TS_FRAME_MAX_LIMIT);
        struct sockaddr_in a;
        uv_ip4_addr("127.0.0.1", s->plain_port, &a);
        static uv_connect_t req;
        uv_tcp_connect(&req, l->tcp, (struct sockaddr *)&a, plain_connected);
    } else {
        snprintf(addr, sizeof addr, "127.0.0.1:%d", s->enc_port);
        if (ts_conn_connect(cnet, addr, &cl_handler, l, &l->conn, NULL, 0))
            exit(1);
    }
    while (!opened)
        uv_run(&loop, UV_RUN_ONCE);
    if (plain)
        uv_read_start((uv_stream_t *)l->tcp, plain_alloc, plain_read);
    (void)plain_cl_written;
}

static void free_tcp(uv_handle_t *h) { free(h); }

static void link_close(link_t *l) {
    if (l->plain) {
        uv_read_stop((uv_stream_t *)l->tcp);
        uv_close((uv_handle_t *)l->tcp, free_tcp);
        ts_frame_reader_free(&l->rd);
    } else {
        ts_conn_close(l->conn);
    }
    uv_run(&loop, UV_RUN_NOWAIT);
}

/* A stream's speed: wall-clock GB/s, and the CPU seconds per GB of each side. */
typedef struct rate {
    double gbps, send_cpu_s_per_gb, recv_cpu_s_per_gb;
} rate_t;

/* 1 / the busier side's CPU seconds per GB: the GB/s with a free core on each side. */
static double cpu_bound_gbps(const rate_t *v) {
    double busier =
        v->send_cpu_s_per_gb > v->recv_cpu_s_per_gb ? v->send_cpu_s_per_gb : v->recv_cpu_s_per_gb;
    return busier > 0 ? 1 / busier : 0;
}

/* The speed of a stream of `total` bytes in FRAME-sized frames. */
static rate_t throughput(int plain, const server_t *s, uint64_t total) {
    run_t r;
    memset(&r, 0, sizeof r);
    r.total = total;
    r.frame = malloc(FRAME);
    memset(r.frame, 0x5a, FRAME);
    r.frame[0] = 'T';
    link_open(&r.link, plain, s, &r);
    r.link.on_frame = tp_frame;
    r.link.on_drain = pump;
    uint64_t t0 = uv_hrtime(), cpu0 = thread_cpu_ns();
    pump(&r.link);
    while (!r.done)
        uv_run(&loop, UV_RUN_ONCE);
    double secs = (double)(uv_hrtime() - t0) / 1e9;
    double cpu = (double)(thread_cpu_ns() - cpu0) / 1e9;
    if (r.received != total || r.recv_timed == 0) {
        fprintf(stderr, "bench_net: the server counted %llu bytes of %llu\n",
                (unsigned long long)r.received, (unsigned long long)total);
        exit(1);
    }
    link_close(&r.link);
    free(r.frame);
    rate_t v = {(double)total / secs / 1e9, cpu / ((double)total / 1e9),
                (double)r.recv_cpu_ns / (double)r.recv_timed};
    return v;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* p50 and p99 (µs) of iters round trips of a frame of size bytes. */
static void round_trips(int plain, const server_t *s, size_t size, int iters, double *p50,
                        double *p99) {
    run_t r;
    memset(&r, 0, sizeof r);
    r.size = size;
    r.iters = iters;
    r.frame = malloc(size);
    memset(r.frame, 0x33, size);
    r.frame[0] = 'E';
    r.rtt_us = malloc(sizeof(double) * (size_t)iters);
    link_open(&r.link, plain, s, &r);
    r.link.on_frame = rt_frame;
    rt_send(&r);
    while (!r.done)
        uv_run(&loop, UV_RUN_ONCE);
    link_close(&r.link);
    qsort(r.rtt_us, (size_t)iters, sizeof(double), cmp_double);
    *p50 = r.rtt_us[(iters + 1) / 2 - 1];
    *p99 = r.rtt_us[(99 * iters + 99) / 100 - 1];
    free(r.rtt_us);
    free(r.frame);
}

/* ChaCha20-Poly1305 sealing 65519-byte messages, in memory: wall-clock GB/s, and CPU seconds
 * per GB in send_cpu_s_per_gb. */
static rate_t raw_aead(uint64_t total) {
    const size_t n = TS_FRAME_NOISE_PLAINTEXT_MAX;
    uint8_t *pt = malloc(n), *ct = malloc(n + 16), key[32], nonce[12] = {0};
    randombytes_buf(key, sizeof key);
    memset(pt, 0x5a, n);
    uint64_t t0 = uv_hrtime(), cpu0 = thread_cpu_ns(), done = 0, ctr = 0;
    while (done < total) {
        memcpy(nonce + 4, &ctr, 8);
        ctr++;
        unsigned long long cl;
        crypto_aead_chacha20poly1305_ietf_encrypt(ct, &cl, pt, n, NULL, 0, NULL, nonce, key);
        done += n;
    }
    double secs = (double)(uv_hrtime() - t0) / 1e9;
    double cpu = (double)(thread_cpu_ns() - cpu0) / 1e9;
    free(pt);
    free(ct);
    rate_t v = {(double)done / secs / 1e9, cpu / ((double)done / 1e9), 0};
    return v;
}

static double maxd(double a, double b) { return a > b ? a : b; }
static double mind(double a, double b) { return a < b ? a : b; }

/* Keeps in *best the best of each of v's measures (a zeroed *best takes v's). */
static void keep_best(rate_t *best, rate_t v) {
    int first = best->gbps == 0;
    best->gbps = maxd(best->gbps, v.gbps);
    best->send_cpu_s_per_gb =
        first ? v.send_cpu_s_per_gb : mind(best->send_cpu_s_per_gb, v.send_cpu_s_per_gb);
    best->recv_cpu_s_per_gb =
        first ? v.recv_cpu_s_per_gb : mind(best->recv_cpu_s_per_gb, v.recv_cpu_s_per_gb);
}

int main(int argc, char **argv) {
    int quick = 0, json = 0, repeats = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc)
            repeats = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_net [--quick] [--repeats N] [--json]\n");
            return 2;
        }
    }
    if (repeats < 1)
        repeats = 1;
    if (sodium_init() < 0)
        return 1;
    ts_identity_generate(&sid);
    ts_identity_generate(&cid);
    ts_netkey_generate(&nk);
    server_t s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    pthread_t th;
    pthread_create(&th, NULL, server_main, &s);
    pthread_mutex_lock(&s.mu);
    while (!s.ready)
        pthread_cond_wait(&s.cv, &s.mu);
    pthread_mutex_unlock(&s.mu);
    uv_loop_init(&loop);
    if (ts_net_new(&cnet, &loop, &cid, &nk, NULL))
        return 1;

    uint64_t total = quick ? (32u << 20) : (512u << 20);
    int it1 = quick ? 200 : 5000, it64 = quick ? 50 : 1000;
    rate_t aead = {0}, enc = {0}, plain = {0};
    double e1[2] = {1e18, 1e18}, p1[2] = {1e18, 1e18}, e64[2] = {1e18, 1e18}, p64[2] = {1e18, 1e18};
    for (int k = 0; k < repeats; k++) { /* interleaved; best of each */
        double a, b;
        keep_best(&aead, raw_aead(total));
        keep_best(&enc, throughput(0, &s, total));
        keep_best(&plain, throughput(1, &s, total));
        round_trips(0, &s, 1024, it1, &a, &b);
        e1[0] = mind(e1[0], a), e1[1] = mind(e1[1], b);
        round_trips(1, &s, 1024, it1, &a, &b);
        p1[0] = mind(p1[0], a), p1[1] = mind(p1[1], b);
        round_trips(0, &s, 65536, it64, &a, &b);
        e64[0] = mind(e64[0], a), e64[1] = mind(e64[1], b);
        round_trips(1, &s, 65536, it64, &a, &b);
        p64[0] = mind(p64[0], a), p64[1] = mind(p64[1], b);
    }
    uv_async_send(&s.stop);
    pthread_join(th, NULL);
    ts_net_shutdown(cnet);
    uv_run(&loop, UV_RUN_DEFAULT);
    ts_net_free(cnet);
    uv_loop_close(&loop);

    double aead_cpu = 1 / aead.send_cpu_s_per_gb, enc_cpu = cpu_bound_gbps(&enc),
           plain_cpu = cpu_bound_gbps(&plain);
    if (json) {
        json_t *j = json_pack(
            "{s:i, s:{s:f, s:f, s:f, s:f, s:f}, s:{s:f, s:f, s:f, s:f}, s:{s:f, s:f, s:f, s:f, "
            "s:f}, s:{s:{s:f, s:f, s:f, s:f}, s:{s:f, s:f, s:f, s:f}}}",
            "repeats", repeats, "throughput_gbps", "raw_aead", aead.gbps, "encrypted", enc.gbps,
            "plain_tcp", plain.gbps, "encrypted_over_aead", enc.gbps / aead.gbps,
            "encrypted_over_plain", enc.gbps / plain.gbps, "cpu_s_per_gb", "encrypted_send",
            enc.send_cpu_s_per_gb, "encrypted_recv", enc.recv_cpu_s_per_gb, "plain_send",
            plain.send_cpu_s_per_gb, "plain_recv", plain.recv_cpu_s_per_gb, "cpu_bound_gbps",
            "raw_aead", aead_cpu, "encrypted", enc_cpu, "plain_tcp", plain_cpu,
            "encrypted_over_aead", enc_cpu / aead_cpu, "raw_aead_cpu_s_per_gb",
            aead.send_cpu_s_per_gb, "rtt_us", "1k", "encrypted_p50", e1[0], "encrypted_p99", e1[1],
            "plain_p50", p1[0], "plain_p99", p1[1], "64k", "encrypted_p50", e64[0], "encrypted_p99",
            e64[1], "plain_p50", p64[0], "plain_p99", p64[1]);
        json_dumpf(j, stdout, JSON_COMPACT);
        printf("\n");
        json_decref(j);
    } else {
        printf("secure links on loopback, best of %d interleaved runs\n", repeats);
        printf("throughput (GB/s)      raw AEAD %.2f   encrypted %.2f   plain TCP %.2f\n",
               aead.gbps, enc.gbps, plain.gbps);
        printf("  encrypted / raw AEAD %.0f %%   encrypted / plain %.0f %%\n",
               100 * enc.gbps / aead.gbps, 100 * enc.gbps / plain.gbps);
        printf("CPU s per GB           raw AEAD %.3f   encrypted send %.3f recv %.3f   plain send "
               "%.3f recv %.3f\n",
               aead.send_cpu_s_per_gb, enc.send_cpu_s_per_gb, enc.recv_cpu_s_per_gb,
               plain.send_cpu_s_per_gb, plain.recv_cpu_s_per_gb);
        printf("CPU-bound (GB/s)       raw AEAD %.2f   encrypted %.2f   plain TCP %.2f\n", aead_cpu,
               enc_cpu, plain_cpu);
        printf("  encrypted / raw AEAD %.0f %%\n", 100 * enc_cpu / aead_cpu);
        printf("round trip (µs)        encrypted p50 / p99     plain p50 / p99    added p50\n");
        printf("  1 KiB                %8.1f / %-8.1f    %8.1f / %-8.1f  %+.1f\n", e1[0], e1[1],
               p1[0], p1[1], e1[0] - p1[0]);
        printf("  64 KiB               %8.1f / %-8.1f    %8.1f / %-8.1f  %+.1f\n", e64[0], e64[1],
               p64[0], p64[1], e64[0] - p64[0]);
    }
    ts_identity_wipe(&sid);
    ts_identity_wipe(&cid);
    ts_netkey_wipe(&nk);
    return 0;
}
