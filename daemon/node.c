/*
 * node.c — a tessera node on one loop (daemon/node.h): the start-up in order (connections, RPC
 * listener, gossip, dial-back answers, metrics, relays, the metrics endpoint, the expert, the
 * judge of accusations, auto mode), the loop's two timers (the one-second stats and health tick,
 * the reachability check), and the graceful stop: host stopped, then leave, then gossip and the
 * connections closed.
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/node.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/file.h"
#include "daemon/auto.h"
#include "daemon/health.h"
#include "daemon/host.h"
#include "daemon/log.h"
#include "daemon/metrics_http.h"
#include "daemon/relaying.h"
#include "daemon/trust.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/fwd_gemm.h"
#include "net/reach.h"
#include "net/rpc.h"
#include "net/status_json.h"

struct ts_node {
    uv_loop_t *loop;
    const ts_daemon_config_t *cfg;
    ts_net_t *net;
    ts_rpc_t *rpc;
    ts_gossip_t *gossip;
    ts_host_t *host;
    ts_auto_t *autoc;  /* [expert] mode = auto: what to serve (daemon/auto.h) */
    ts_trust_t *trust; /* accusations (daemon/trust.h) */
    int stopping;
    void (*stopped)(void *arg); /* ts_node_stop's done */
    void *stopped_arg;
    char listen[TS_CONFIG_ADDR_MAX + 8]; /* the port bound */
    char metrics_url[320];               /* "" when off */
    ts_metrics_t *metrics;
    ts_metrics_http_t *http;
    uv_timer_t stats_timer; /* copies loop-only counters into the metrics every second */
    uint64_t stats_ticks;
    int status_failures; /* status.json builds failed in a row (warned once) */
    /* the status page's history: one sample every HISTORY_EVERY_S, the newest HISTORY_N */
    struct {
        double at;             /* ts_now_s() */
        float rps, latency_ms; /* this node's requests/s and per-row latency (0: none served) */
        float loss;            /* its training job's running loss; NaN: no job */
    } hist[64];
    int n_hist, hist_next;
    /* reachability (net/reach.h): a peer dials us back at the advertised address */
    uv_timer_t reach_timer;
    ts_reach_t *reach;       /* answers dial-back requests */
    ts_relaying_t *relaying; /* [relay]: serving as one, being carried by one */
    char advertise[TS_CONFIG_ADDR_MAX + 8];
    uint8_t self[32];
    int reach_pending, reachable; /* reachable: 1, 0, or −1 unknown */
    double reach_at;              /* when the last definite answer came (loop seconds) */
    /* the peer asked last, and the one that last could not be asked (refused, timed out): the
     * next try skips it while another live member exists, so a peer that cannot be dialled
     * (itself behind NAT) is not asked again and again */
    char reach_asked[TS_CONFIG_ADDR_MAX + 8], reach_unasked[TS_CONFIG_ADDR_MAX + 8];
    atomic_int ready;   /* /healthz: 1 once joined, 0 while starting or stopping */
    ts_health_t health; /* the loop's: alone, refused (daemon/health.h) */
    pthread_mutex_t health_mu;
    char health_reason[512]; /* health.reason, for the HTTP thread, under health_mu */
};

/* /healthz, on the HTTP thread: ready, and the last health the loop published. */
static int health(void *user, char *reason, size_t len) {
    ts_node_t *d = user;
    int r = atomic_load(&d->ready);
    if (r != 1) {
        snprintf(reason, len, "%s", r == 0 ? "starting" : "stopping");
        return 0;
    }
    pthread_mutex_lock(&d->health_mu);
    int ok = strcmp(d->health_reason, "ok") == 0;
    if (!ok)
        snprintf(reason, len, "%s", d->health_reason);
    pthread_mutex_unlock(&d->health_mu);
    return ok;
}

static double loop_s(const ts_node_t *d) { return (double)uv_now(d->loop) / 1000.0; }

static void health_log(ts_health_level_t level, const char *line) {
    if (level == TS_HEALTH_WARN)
        ts_log_warn("health", "%s", line);
    else
        ts_log_info("health", "%s", line);
}

/* net/net.h's observer: every failed handshake, either side, with its likely cause. */
static void on_handshake_failed(void *arg, const char *addr, int accepted,
                                const ts_conn_close_info_t *why) {
    ts_node_t *d = arg;
    char line[512];
    ts_health_level_t level;
    if (ts_health_handshake_failed(&d->health, loop_s(d), addr, accepted, why, line, sizeof line,
                                   &level))
        health_log(level, line);
}

/* Once a second: alone or refused, published to /healthz and to status answers. */
static void health_tick(ts_node_t *d) {
    ts_net_stats_t ns;
    ts_net_stats(d->net, &ns);
    /* a peer briefly suspected is still a peer: alone means nobody alive or suspect */
    const ts_swim_t *sw = ts_gossip_swim(d->gossip);
    uint32_t alive = ts_swim_count(sw, TS_SWIM_ALIVE) + ts_swim_count(sw, TS_SWIM_SUSPECT);
    char line[640];
    ts_health_level_t level;
    int rejoin = 0;
    if (ts_health_tick(&d->health, loop_s(d), ns.opened, alive > 0 ? alive - 1 : 0,
                       ts_gossip_n_seeds(d->gossip), line, sizeof line, &level, &rejoin))
        health_log(level, line);
    if (rejoin)
        ts_gossip_rejoin(d->gossip);
    ts_gossip_set_health(d->gossip, d->health.reason);
    pthread_mutex_lock(&d->health_mu);
    snprintf(d->health_reason, sizeof d->health_reason, "%s", d->health.reason);
    pthread_mutex_unlock(&d->health_mu);
}

/* ---- reachability ---------------------------------------------------------------------------- */

#define REACH_RETRY_MS 15000        /* without an answer yet: ask again this often */
#define REACH_RECHECK_S (10 * 60.0) /* with one: check again this long after it */

static void on_reach(void *arg, int reachable, const char *message) {
    ts_node_t *d = arg;
    d->reach_pending = 0;
    if (reachable < 0) {
        ts_log_debug("reach", "%s (asking another peer in %d s)", message, REACH_RETRY_MS / 1000);
        snprintf(d->reach_unasked, sizeof d->reach_unasked, "%s", d->reach_asked);
        return;
    }
    d->reach_unasked[0] = '\0';
    d->reach_at = (double)uv_now(d->loop) / 1000.0;
    if (reachable && d->reachable != 1)
        ts_log_info("reach", "reachable at %s: a peer dialled it back (%s)", d->advertise, message);
    else if (!reachable && d->reachable != 0)
        ts_log_warn("reach",
                    "NOT reachable at %s: a peer could not dial it back (%s). Other nodes and "
                    "clients cannot open connections to this node: %s; or forward the port (TCP "
                    "and UDP) on the router or firewall and set [node] advertise to the public "
                    "address and port (docs/operations.md, \"Behind a home router\")",
                    d->advertise, message,
                    d->cfg->relay_use ? "a relay will carry it ([relay] use)"
                                      : "it cannot serve ([relay] use = false)");
    d->reachable = reachable;
    ts_relaying_reachable(d->relaying, reachable);
    if (d->metrics)
        ts_metrics_gauge_set(d->metrics, TS_M_REACHABLE, NULL, reachable);
}

/* Asks a live member (not this node) to dial us back, when no check is running and the last
 * definite answer is old: from a random place in the member list, skipping on the first pass
 * the member that could not be asked last time. */
static void on_reach_timer(uv_timer_t *t) {
    ts_node_t *d = t->data;
    double now = (double)uv_now(d->loop) / 1000.0;
    if (d->reach_pending || d->stopping || (d->reach_at > 0 && now - d->reach_at < REACH_RECHECK_S))
        return;
    Tessera__StatusResponse *r = NULL;
    if (ts_gossip_status(d->gossip, NULL, &r) != TS_OK)
        return;
    size_t n = r->n_members, start = n ? randombytes_uniform((uint32_t)n) : 0;
    for (size_t k = 0; k < 2 * n && !d->reach_pending; k++) {
        const Tessera__MemberState *m = r->members[(start + k) % n];
        if (m->status != TESSERA__MEMBER_STATUS__MEMBER_ALIVE || !m->addr ||
            (m->node_id.len == 32 && memcmp(m->node_id.data, d->self, 32) == 0) ||
            (k < n && strcmp(m->addr, d->reach_unasked) == 0))
            continue;
        char err[256];
        snprintf(d->reach_asked, sizeof d->reach_asked, "%s", m->addr);
        if (ts_reach_check(d->rpc, m->addr, d->advertise, 10000, on_reach, d, err, sizeof err) ==
            TS_OK)
            d->reach_pending = 1;
    }
    ts_gossip_status_free(r);
}

/* {"p50", "p95", "p99", "count"} of a histogram of this node's (seconds), or null when empty. */
static json_t *percentiles(ts_metrics_t *m, int id) {
    double p[3];
    uint64_t n = 0;
    static const double qs[] = {0.5, 0.95, 0.99};
    for (int i = 0; i < 3; i++)
        if (ts_metrics_quantile(m, id, NULL, qs[i], &p[i], &n) != TS_OK)
            return json_null();
    return json_pack("{s:f, s:f, s:f, s:I}", "p50", p[0], "p95", p[1], "p99", p[2], "count",
                     (json_int_t)n);
}

#define HISTORY_N 60       /* samples kept: ten minutes */
#define HISTORY_EVERY_S 10 /* seconds between samples */

/* A history sample from the status answer r when one is due; the history as JSON (oldest first:
 * the samples' ages in seconds, and each series). */
static json_t *history(ts_node_t *d, const Tessera__StatusResponse *r) {
    double now = ts_now_s();
    int newest = (d->hist_next + HISTORY_N - 1) % HISTORY_N;
    if (d->n_hist == 0 || now - d->hist[newest].at >= HISTORY_EVERY_S - 0.5) {
        const Tessera__Load *l = r->load;
        d->hist[d->hist_next].at = now;
        d->hist[d->hist_next].rps = l && l->has_requests_per_s ? l->requests_per_s : 0.0f;
        d->hist[d->hist_next].latency_ms =
            l && l->has_item_latency_us ? (float)l->item_latency_us / 1000.0f : 0.0f;
        d->hist[d->hist_next].loss = r->training && r->training->has_loss ? r->training->loss : NAN;
        d->hist_next = (d->hist_next + 1) % HISTORY_N;
        if (d->n_hist < HISTORY_N)
            d->n_hist++;
    }
    json_t *age = json_array(), *rps = json_array(), *lat = json_array(), *loss = json_array();
    for (int i = 0; i < d->n_hist; i++) {
        int k = (d->hist_next + HISTORY_N - d->n_hist + i) % HISTORY_N;
        json_array_append_new(age, json_real(now - d->hist[k].at));
        json_array_append_new(rps, json_real(d->hist[k].rps));
        json_array_append_new(lat, json_real(d->hist[k].latency_ms));
        json_array_append_new(loss,
                              isfinite(d->hist[k].loss) ? json_real(d->hist[k].loss) : json_null());
    }
    return json_pack("{s:i, s:o, s:o, s:o, s:o}", "every_s", HISTORY_EVERY_S, "age_s", age,
                     "requests_per_s", rps, "latency_ms", lat, "train_loss", loss);
}

/* The status page's /status.json: the view `tessera status --json` prints (net/status_json.h),
 * this node's own latency percentiles under "node", and its last ten minutes under "history".
 * Built on the loop (the only thread that may read gossip), published to the HTTP thread as one
 * string. */
static void publish_status(ts_node_t *d) {
    Tessera__StatusResponse *r = NULL;
    ts_status_adverts_t ad = {0};
    json_t *j = NULL;
    char *text = NULL;
    if (ts_gossip_status(d->gossip, NULL, &r) == TS_OK && ts_status_adverts_decode(r, &ad) == TS_OK)
        j = ts_status_json(r, &ad);
    if (j)
        json_object_set_new(j, "node",
                            json_pack("{s:o, s:o}", "queue_wait_s",
                                      percentiles(d->metrics, TS_M_QUEUE_WAIT_SECONDS), "compute_s",
                                      percentiles(d->metrics, TS_M_COMPUTE_SECONDS)));
    if (j)
        json_object_set_new(j, "history", history(d, r));
    if (j && (text = json_dumps(j, JSON_COMPACT)) != NULL &&
        ts_metrics_http_set_status(d->http, text, strlen(text)) == TS_OK)
        d->status_failures = 0;
    else if (d->status_failures++ == 0)
        ts_log_warn("metrics", "cannot build the status page's status.json (out of memory?)");
    free(text);
    json_decref(j);
    if (r) {
        ts_status_adverts_free(&ad);
        ts_gossip_status_free(r);
    }
}

/* The counters only the loop's thread may read, into the registry. */
static void on_stats(uv_timer_t *t) {
    ts_node_t *d = t->data;
    const ts_swim_t *sw = ts_gossip_swim(d->gossip);
    static const struct {
        ts_swim_state_t s;
        const char *name;
    } states[] = {{TS_SWIM_ALIVE, "alive"},
                  {TS_SWIM_SUSPECT, "suspect"},
                  {TS_SWIM_DEAD, "dead"},
                  {TS_SWIM_LEFT, "left"}};
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
        ts_metrics_gauge_set(d->metrics, TS_M_GOSSIP_MEMBERS, states[i].name,
                             (double)ts_swim_count(sw, states[i].s));
    ts_gossip_stats_t gs;
    ts_gossip_get_stats(d->gossip, &gs);
    ts_metrics_counter_set(d->metrics, TS_M_NET_RECEIVED_BYTES, "udp", gs.udp_bytes_in);
    ts_metrics_counter_set(d->metrics, TS_M_NET_SENT_BYTES, "udp", gs.udp_bytes_out);
    ts_net_stats_t ns;
    ts_net_stats(d->net, &ns);
    ts_metrics_gauge_set(d->metrics, TS_M_CONNECTIONS, NULL, (double)ns.live);
    ts_metrics_counter_set(d->metrics, TS_M_NET_RECEIVED_BYTES, "tcp", ns.bytes_in);
    ts_metrics_counter_set(d->metrics, TS_M_NET_SENT_BYTES, "tcp", ns.bytes_out);
    ts_metrics_counter_set(d->metrics, TS_M_CONN_REFUSED, NULL, ns.refused_limit);
    for (int r = 0; r < TS_CONN_CLOSE_REASONS; r++)
        ts_metrics_counter_set(d->metrics, TS_M_CONN_CLOSES,
                               ts_conn_close_reason_name((ts_conn_close_reason_t)r), ns.closed[r]);
    /* requests by type, for every RPC this node serves */
    static const struct {
        Tessera__Envelope__BodyCase k;
        const char *type;
    } kinds[] = {{TESSERA__ENVELOPE__BODY_DENOISE_REQUEST, "denoise"},
                 {TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST, "manifest"},
                 {TESSERA__ENVELOPE__BODY_CHUNK_REQUEST, "chunk"},
                 {TESSERA__ENVELOPE__BODY_STATUS_REQUEST, "status"},
                 {TESSERA__ENVELOPE__BODY_DIAL_BACK_REQUEST, "dial_back"},
                 {TESSERA__ENVELOPE__BODY_ADVERT_REQUEST, "advert"},
                 {TESSERA__ENVELOPE__BODY_PUSH_PULL, "push_pull"},
                 {TESSERA__ENVELOPE__BODY_PING, "ping"},
                 {TESSERA__ENVELOPE__BODY_ACCUSATION, "accusation"}};
    ts_rpc_stats_t rs;
    ts_rpc_stats(d->rpc, &rs);
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        ts_metrics_counter_set(d->metrics, TS_M_REQUESTS, kinds[i].type, rs.requests[kinds[i].k]);
        ts_metrics_counter_set(d->metrics, TS_M_REQUEST_ERRORS, kinds[i].type,
                               rs.errors[kinds[i].k]);
        ts_metrics_counter_set(d->metrics, TS_M_REQUESTS_BUSY, kinds[i].type, rs.busy[kinds[i].k]);
    }
    ts_metrics_counter_set(d->metrics, TS_M_REQUESTS, "malformed", rs.malformed);
    ts_metrics_counter_set(d->metrics, TS_M_REQUEST_ERRORS, "malformed", rs.malformed);
    static const ts_conn_close_reason_t hs[] = {TS_CONN_CLOSE_HANDSHAKE_TIMEOUT,
                                                TS_CONN_CLOSE_HANDSHAKE, TS_CONN_CLOSE_IDENTITY};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        ts_metrics_counter_set(d->metrics, TS_M_HANDSHAKE_FAILURES,
                               ts_conn_close_reason_name(hs[i]), ns.closed[hs[i]]);
    ts_host_metrics(d->host);
    ts_relaying_metrics(d->relaying, d->metrics);
    ts_trust_stats_t ts;
    ts_trust_get_stats(d->trust, &ts);
    ts_metrics_counter_set(d->metrics, TS_M_ACCUSATIONS, "received", ts.received);
    ts_metrics_counter_set(d->metrics, TS_M_ACCUSATIONS, "upheld", ts.upheld);
    ts_metrics_counter_set(d->metrics, TS_M_ACCUSATIONS, "refused", ts.refused);
    ts_metrics_counter_set(d->metrics, TS_M_ACCUSATIONS, "unverifiable", ts.unverifiable);
    ts_metrics_counter_set(d->metrics, TS_M_ACCUSATIONS, "repeat", ts.repeats);
    ts_metrics_counter_set(d->metrics, TS_M_ACCUSATIONS, "passed_on", ts.passed_on);
    uint32_t n_bans;
    (void)ts_gossip_bans(d->gossip, &n_bans);
    ts_metrics_gauge_set(d->metrics, TS_M_BANNED_NODES, NULL, (double)n_bans);
    health_tick(d);
    /* every second while someone reads it, else every tenth: a first load then shows the node
     * as it was at most ten seconds ago, never nothing */
    if (d->http && (ts_metrics_http_status_wanted(d->http) || d->stats_ticks % 10 == 0))
        publish_status(d);
    d->stats_ticks++;
}

static void on_gossip_closed(ts_gossip_t *g, void *arg) {
    (void)g;
    ts_node_t *d = arg;
    uv_close((uv_handle_t *)&d->stats_timer, NULL);
    uv_close((uv_handle_t *)&d->reach_timer, NULL);
    ts_relaying_close(d->relaying);
    ts_rpc_shutdown(d->rpc);
    if (d->stopped)
        d->stopped(d->stopped_arg);
}

static void on_left(ts_gossip_t *g, void *arg) {
    ts_log_info("gossip", "left the network");
    ts_gossip_close(g, on_gossip_closed, arg);
}

/* The expert has stopped (training checkpointed, served requests answered): leave. */
static void on_host_stopped(void *arg) {
    ts_node_t *d = arg;
    if (ts_gossip_leave(d->gossip, on_left, d) != TS_OK)
        ts_gossip_close(d->gossip, on_gossip_closed, d);
}

void ts_node_stop(ts_node_t *d, void (*done)(void *arg), void *arg) {
    if (d->stopping++)
        return;
    d->stopped = done;
    d->stopped_arg = arg;
    atomic_store(&d->ready, 2);
    ts_relaying_leaving(d->relaying);
    ts_auto_stop(d->autoc);
    d->autoc = NULL;
    ts_trust_shutdown(d->trust);
    ts_host_stop(d->host, on_host_stopped, d);
}

/* Membership changes are worth a line each: they are what an operator looks for. */
static void on_gossip_event(void *arg, const ts_swim_event_t *ev) {
    const ts_node_t *d = arg;
    ts_node_id_t id;
    memcpy(id.b, ev->id, sizeof id.b);
    char node[TS_NODE_ID_SHORT + 1];
    ts_node_id_hex(&id, TS_NODE_ID_SHORT, node);
    /* leaving, the node's own leave is spread as a newer claim of it: not news for the log */
    if (d && d->stopping && ev->type == TS_SWIM_EV_REFUTED) {
        ts_log_debug("gossip", "%s %s while leaving", node, ts_swim_event_name(ev->type));
        return;
    }
    switch (ev->type) {
    case TS_SWIM_EV_JOINED:
    case TS_SWIM_EV_ALIVE_AGAIN:
    case TS_SWIM_EV_LEFT:
    case TS_SWIM_EV_REFUTED:
        ts_log_info("gossip", "%s %s (incarnation %u)", node, ts_swim_event_name(ev->type),
                    ev->incarnation);
        break;
    case TS_SWIM_EV_SUSPECT:
    case TS_SWIM_EV_DEAD:
        ts_log_warn("gossip", "%s %s (incarnation %u)", node, ts_swim_event_name(ev->type),
                    ev->incarnation);
        break;
    default: ts_log_debug("gossip", "%s %s", node, ts_swim_event_name(ev->type)); break;
    }
}

static void close_cb(uv_handle_t *h, void *arg) {
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* "host:port" with the port replaced by port. */
static void with_port(const char *addr, int port, char *out, size_t len) {
    const char *colon = strrchr(addr, ':');
    snprintf(out, len, "%.*s:%d", (int)(colon - addr), addr, port);
}

/* DATA_DIR/NAME holds addr and a newline (written atomically): the listen address, the metrics
 * URL, for scripts and `tessera up`. */
static void write_addr_file(const char *data_dir, const char *name, const char *addr) {
    char path[TS_CONFIG_PATH_MAX + 32], line[512];
    snprintf(path, sizeof path, "%s/%s", data_dir, name);
    int n = snprintf(line, sizeof line, "%s\n", addr), e = 0;
    if (n < 0 || (size_t)n >= sizeof line || ts_atomic_write(path, line, (size_t)n, &e) != TS_OK)
        ts_log_warn("daemon", "cannot write %s: %s", path, e ? strerror(e) : "too long");
}

/* g from c; seeds (TS_CONFIG_MAX_BOOTSTRAP of them) holds the bootstrap list until ts_gossip_new
 * has copied it. */
static void gossip_config(const ts_daemon_config_t *c, ts_store_t *store, const char *listen,
                          const char *advertise, const char **seeds, ts_gossip_config_t *g) {
    ts_gossip_config_default(g);
    g->swim.probe_interval_ms = c->probe_interval_ms;
    g->swim.probe_timeout_ms = c->probe_timeout_ms;
    g->swim.indirect_probes = c->indirect_probes;
    g->swim.suspicion_mult = c->suspicion_mult;
    g->swim.retransmit_mult = c->retransmit_mult;
    g->swim.push_pull_interval_ms = c->pushpull_interval_s * 1000;
    g->listen = listen;
    g->advertise = advertise;
    for (int i = 0; i < c->n_bootstrap; i++)
        seeds[i] = c->bootstrap[i];
    g->bootstrap = seeds;
    g->n_bootstrap = (size_t)c->n_bootstrap;
    g->store = store;
}

/* Frees what ts_node_start made, once the loop has nothing left but handles to close. */
static void free_all(ts_node_t *d) {
    ts_auto_stop(d->autoc);
    d->autoc = NULL;
    ts_trust_shutdown(d->trust);
    uv_walk(d->loop, close_cb, NULL);
    uv_run(d->loop, UV_RUN_DEFAULT);
    ts_metrics_http_stop(d->http);
    pthread_mutex_destroy(&d->health_mu);
    (void)ts_trust_free(d->trust); /* the loop has run out: no recomputation is left */
    ts_host_free(d->host);         /* its servers unregister from rpc */
    ts_gossip_free(d->gossip);
    ts_relaying_free(d->relaying);
    ts_rpc_free(d->rpc);
    ts_reach_free(d->reach);
    ts_net_free(d->net);
    ts_metrics_free(d->metrics);
    free(d);
}

void ts_node_free(ts_node_t *n) {
    if (n)
        free_all(n);
}

/* The GEMM kernels every CPU engine of this process runs (kernels/cpu/blas_core.h): a line of
 * the log (a warning when weaker than the CPU allows) and two gauges. */
static void log_gemm(ts_node_t *d) {
    ts_blas_status_t bs;
    char line[384];
    ts_blas_status(&bs);
    ts_blas_describe(&bs, line, sizeof line);
    if (bs.weaker)
        ts_log_warn("daemon", "GEMM: %s", line);
    else
        ts_log_info("daemon", "GEMM: %s", line);
    ts_log_info("daemon", "GEMM: the forward products of linear layers through %s",
                ts_cpu_fwd_gemm_name());
    ts_metrics_gauge_set(d->metrics, TS_M_BLAS_KERNELS, bs.core, 1);
    ts_metrics_gauge_set(d->metrics, TS_M_BLAS_WEAKER, NULL, bs.weaker);
}

/* The listener, gossip, dial-back answers, the metrics registry and relays, in that order. */
static int start_network(ts_node_t *d, const ts_identity_t *id, const ts_netkey_t *nk,
                         ts_store_t *store, const char *version, char *err, size_t errlen) {
    const ts_daemon_config_t *cfg = d->cfg;
    ts_net_config_t nc;
    ts_net_config_default(&nc);
    nc.max_frame = (uint32_t)cfg->max_frame_mib << 20;
    nc.max_conns = (uint32_t)cfg->max_connections;
    nc.max_conns_per_addr = (uint32_t)cfg->max_connections_per_ip;
    nc.max_partial_bytes = (size_t)cfg->max_partial_frames_mib << 20;
    nc.handshake_timeout_ms = (uint32_t)cfg->handshake_timeout_ms;
    nc.idle_timeout_ms = (uint32_t)cfg->idle_timeout_s * 1000;
    ts_listener_t *lst = NULL;
    int rc = ts_net_new(&d->net, d->loop, id, nk, &nc);
    if (rc == TS_OK) {
        ts_net_on_handshake_failure(d->net, on_handshake_failed, d);
        rc = ts_rpc_new(&d->rpc, d->net, NULL);
    }
    if (rc == TS_OK)
        rc = ts_rpc_listen(d->rpc, cfg->listen, &lst, err, errlen);
    if (rc == TS_OK) {
        /* Port 0: the system picked one; gossip's UDP socket takes the same, and so does an
         * advertised address that was copied from listen. */
        with_port(cfg->listen, ts_listener_port(lst), d->listen, sizeof d->listen);
        snprintf(d->advertise, sizeof d->advertise, "%s",
                 strcmp(cfg->advertise, cfg->listen) == 0 ? d->listen : cfg->advertise);
        d->health.advertise = d->advertise;
        ts_gossip_config_t gc;
        const char *seeds[TS_CONFIG_MAX_BOOTSTRAP];
        gossip_config(cfg, store, d->listen, d->advertise, seeds, &gc);
        rc = ts_gossip_new(d->loop, d->rpc, id, nk, &gc, &d->gossip, err, errlen);
    }
    if (rc == TS_OK) {
        ts_gossip_on_event(d->gossip, on_gossip_event, d);
        rc = ts_gossip_start(d->gossip, err, errlen);
    }
    if (rc == TS_OK && (rc = ts_reach_serve(d->rpc, &d->reach)) != TS_OK)
        snprintf(err, errlen, "cannot serve dial-back requests: %s", ts_strerror(rc));
    if (rc == TS_OK && (rc = ts_metrics_create_daemon(&d->metrics, version)) != TS_OK)
        snprintf(err, errlen, "cannot create the metrics registry: %s", ts_strerror(rc));
    if (rc == TS_OK)
        rc = ts_relaying_start(&d->relaying, d->loop, cfg, d->rpc, d->gossip, d->listen,
                               d->advertise, id->id.b, err, errlen);
    return rc;
}

/* The metrics endpoint, the expert, the judge of accusations and auto mode. */
static int start_services(ts_node_t *d, const ts_identity_t *id, ts_store_t *store, char *err,
                          size_t errlen) {
    const ts_daemon_config_t *cfg = d->cfg;
    int rc = TS_OK;
    if (cfg->metrics_listen[0]) {
        rc = ts_metrics_http_start(&d->http, d->metrics, cfg->metrics_listen, health, d, err,
                                   errlen);
        if (rc != TS_OK)
            return rc;
        snprintf(d->metrics_url, sizeof d->metrics_url, "http://%.*s:%d/metrics",
                 (int)(strrchr(cfg->metrics_listen, ':') - cfg->metrics_listen),
                 cfg->metrics_listen, ts_metrics_http_port(d->http));
        ts_gossip_set_metrics_url(d->gossip, d->metrics_url);
        ts_log_info("daemon", "metrics on %s", d->metrics_url);
    }
    ts_host_env_t env = {.loop = d->loop,
                         .rpc = d->rpc,
                         .gossip = d->gossip,
                         .store = store,
                         .metrics = d->metrics,
                         .cfg = cfg,
                         .identity = id};
    rc = ts_host_new(&d->host, &env, err, errlen);
    if (d->host)
        ts_gossip_on_load(d->gossip, ts_host_load, d->host);
    ts_trust_env_t te = {.loop = d->loop,
                         .rpc = d->rpc,
                         .gossip = d->gossip,
                         .store = store,
                         .self = &id->id,
                         .expel = cfg->trust_expel,
                         .identity = cfg->identity,
                         .network_key = cfg->network_key};
    if (rc == TS_OK && (rc = ts_trust_new(&d->trust, &te)) != TS_OK)
        snprintf(err, errlen, "cannot serve accusations: %s", ts_strerror(rc));
    if (rc == TS_OK && cfg->expert_mode == TS_EXPERT_AUTO) {
        rc = ts_auto_start(&d->autoc, d->loop, cfg, d->gossip, d->host, store, id->id.b);
        if (rc == TS_OK)
            ts_log_info("auto", "mode auto: choosing a cluster every %d s (the first in %d s)",
                        cfg->auto_interval_s, cfg->auto_interval_s);
        else
            snprintf(err, errlen, "cannot start auto mode: %s", ts_strerror(rc));
    }
    return rc;
}

int ts_node_start(ts_node_t **out, uv_loop_t *loop, const ts_daemon_config_t *cfg,
                  const ts_identity_t *id, const ts_netkey_t *nk, ts_store_t *store,
                  const char *version, char *err, size_t errlen) {
    *out = NULL;
    err[0] = '\0';
    ts_node_t *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    d->loop = loop;
    d->cfg = cfg;
    d->reachable = -1;
    memcpy(d->self, id->id.b, sizeof d->self);
    pthread_mutex_init(&d->health_mu, NULL);
    snprintf(d->health_reason, sizeof d->health_reason, "ok");
    ts_health_init(&d->health, loop_s(d), cfg->join_timeout_s, NULL);
    int rc = start_network(d, id, nk, store, version, err, errlen);
    if (rc == TS_OK)
        rc = start_services(d, id, store, err, errlen);
    if (rc != TS_OK) {
        if (!err[0])
            snprintf(err, errlen, "%s", ts_strerror(rc));
        if (d->host)
            ts_host_stop(d->host, NULL, NULL);
        if (d->gossip)
            ts_gossip_close(d->gossip, NULL, NULL);
        ts_relaying_close(d->relaying);
        if (d->rpc)
            ts_rpc_shutdown(d->rpc);
        else if (d->net)
            ts_net_shutdown(d->net);
        free_all(d);
        return rc;
    }
    write_addr_file(cfg->data_dir, "listen.addr", d->listen);
    if (d->metrics_url[0])
        write_addr_file(cfg->data_dir, "metrics.url", d->metrics_url);
    uv_timer_init(loop, &d->stats_timer);
    d->stats_timer.data = d;
    uv_timer_start(&d->stats_timer, on_stats, 0, 1000);
    ts_metrics_gauge_set(d->metrics, TS_M_REACHABLE, NULL, -1);
    uv_timer_init(loop, &d->reach_timer);
    d->reach_timer.data = d;
    uv_timer_start(&d->reach_timer, on_reach_timer, 2000, REACH_RETRY_MS);
    atomic_store(&d->ready, 1);
    char node[17];
    ts_node_id_hex(&id->id, 16, node);
    ts_log_info("daemon",
                "tesserad %s: node %s, store %s, listening on %s (TCP and UDP), advertised as %s, "
                "%d bootstrap peer%s",
                version, node, ts_store_dir(store), d->listen, d->advertise, cfg->n_bootstrap,
                cfg->n_bootstrap == 1 ? "" : "s");
    log_gemm(d);
    *out = d;
    return TS_OK;
}

const char *ts_node_listen(const ts_node_t *n) { return n->listen; }
const char *ts_node_advertise(const ts_node_t *n) { return n->advertise; }
const char *ts_node_metrics_url(const ts_node_t *n) { return n->metrics_url; }
ts_gossip_t *ts_node_gossip(ts_node_t *n) { return n->gossip; }
ts_metrics_t *ts_node_metrics(ts_node_t *n) { return n->metrics; }
int ts_node_health(ts_node_t *n, char *reason, size_t len) { return health(n, reason, len); }
int ts_node_stopping(const ts_node_t *n) { return n->stopping != 0; }
