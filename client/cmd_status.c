/*
 * cmd_status.c — `tessera status`: how is the network, as one node sees it? For operators.
 *
 *   tessera status --peer HOST:PORT --network-key FILE [--identity FILE] [--json] [--watch]
 *                  [--interval S] [--timeout-ms N]
 *
 * It asks the node for its view (StatusRequest, docs/protocol.md "Status") and prints:
 *   - a summary line: the node, live members, experts, clusters with no live expert;
 *   - one row per member: id, state, incarnation, address, time since the state changed, and
 *     the expert it advertises (partition:cluster, model, load);
 *   - per partition, how many live experts serve each cluster, and which have none;
 *   - total capacity and request rate.
 * --json prints one object instead (below); --watch asks again every --interval seconds over
 * the same connection and redraws in place on a terminal (JSON: one object per line), until
 * interrupted.
 *
 *   {"node_id": "<hex>", "live_members": n,
 *    "members": [{"node_id", "node_id_short", "state", "incarnation", "addr",
 *                 "last_change_age_ms", "advert_version"}],
 *    "adverts": [{"node_id", "version", "partition_id", "num_clusters", "cluster",
 *                 "weights_hash", "objective", "model": {...}, "centroid_dims",
 *                 "capacity": {...}, "load": {...}}],
 *    "load": {...} | null,
 *    "aggregates": {"clusters": [{"partition_id", "cluster", "live_experts"}],
 *                   "uncovered": [{"partition_id", "cluster"}], "total_capacity",
 *                   "request_rate", "live_members"},
 *    "health": "ok" | "alone: …" | "handshakes refused: …" | null (a node that does not say),
 *    "metrics": "http://HOST:PORT/metrics" | null}
 *
 * Exit status 0 when the node answered, 1 when it could not be asked (refused, timed out, a
 * handshake broken off — most likely another network key — or an error answer), 2 for bad usage.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/str.h"
#include "client/args.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "client/netclient.h"
#include "net/frame.h"

typedef struct status {
    ts_netclient_t nc;
    int json, watch, tty, timeout_ms, interval_s, rounds, failed;
    uv_timer_t timer;
    uv_signal_t sigint;
    char err[1400];
} status_t;

/* The hex of b's first digits / 2 bytes (all of them when b is shorter). */
static void hex(const ProtobufCBinaryData *b, size_t digits, char *out) {
    ts_hex(b->data, b->len < digits / 2 ? b->len : digits / 2, out);
}

static const char *state_name(int s) {
    switch (s) {
    case TESSERA__MEMBER_STATUS__MEMBER_ALIVE: return "alive";
    case TESSERA__MEMBER_STATUS__MEMBER_SUSPECT: return "suspect";
    case TESSERA__MEMBER_STATUS__MEMBER_DEAD: return "dead";
    case TESSERA__MEMBER_STATUS__MEMBER_LEFT: return "left";
    default: return "?";
    }
}

static const char *objective_name(int o) {
    switch (o) {
    case TESSERA__OBJECTIVE__OBJECTIVE_VELOCITY: return "velocity";
    case TESSERA__OBJECTIVE__OBJECTIVE_EPSILON: return "epsilon";
    case TESSERA__OBJECTIVE__OBJECTIVE_V_PREDICTION: return "v-prediction";
    default: return "?";
    }
}

/* "12s", "4m05s", "3h02m": how long ago, compactly. */
static void age(uint64_t ms, char *out, size_t len) {
    uint64_t s = ms / 1000;
    if (s < 60)
        snprintf(out, len, "%llu.%llus", (unsigned long long)s,
                 (unsigned long long)(ms % 1000 / 100));
    else if (s < 3600)
        snprintf(out, len, "%llum%02llus", (unsigned long long)(s / 60),
                 (unsigned long long)(s % 60));
    else
        snprintf(out, len, "%lluh%02llum", (unsigned long long)(s / 3600),
                 (unsigned long long)(s % 3600 / 60));
}

/* The adverts of a response, decoded once. bodies[i] is NULL when adverts[i] does not decode (a
 * node must not send those; it is shown as such rather than trusted). */
typedef struct adverts {
    size_t n;
    Tessera__AdvertBody **bodies;
} adverts_t;

static int adverts_decode(const Tessera__StatusResponse *r, adverts_t *a) {
    a->n = r->n_adverts;
    a->bodies = calloc(a->n ? a->n : 1, sizeof *a->bodies);
    if (!a->bodies)
        return TS_ENOMEM;
    for (size_t i = 0; i < a->n; i++) {
        char err[256];
        if (ts_frame_decode_advert_body(&r->adverts[i]->body, 0, &a->bodies[i], err, sizeof err))
            a->bodies[i] = NULL;
    }
    return TS_OK;
}

static void adverts_free(adverts_t *a) {
    for (size_t i = 0; i < a->n; i++)
        ts_frame_free(a->bodies[i]);
    free(a->bodies);
}

/* The decoded advert of node id, or NULL. */
static const Tessera__AdvertBody *advert_of(const Tessera__StatusResponse *r, const adverts_t *a,
                                            const ProtobufCBinaryData *id) {
    for (size_t i = 0; i < a->n; i++)
        if (r->adverts[i]->node_id.len == id->len &&
            memcmp(r->adverts[i]->node_id.data, id->data, id->len) == 0)
            return a->bodies[i];
    return NULL;
}

static json_t *j_model(const Tessera__ModelConfig *m) {
    if (!m)
        return json_null();
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "input_size", (int)m->input_size,
                     "patch_size", (int)m->patch_size, "in_channels", (int)m->in_channels,
                     "hidden_size", (int)m->hidden_size, "depth", (int)m->depth, "num_heads",
                     (int)m->num_heads, "num_classes", (int)m->num_classes);
}

static json_t *j_load(const Tessera__Load *l) {
    if (!l)
        return json_null();
    return json_pack("{s:i, s:i, s:f}", "queue_depth", (int)l->queue_depth, "item_latency_us",
                     (int)l->item_latency_us, "requests_per_s", (double)l->requests_per_s);
}

static json_t *j_capacity(const Tessera__Capacity *c) {
    if (!c)
        return json_null();
    return json_pack("{s:f, s:i, s:i, s:s?}", "items_per_s", (double)c->items_per_s, "max_batch",
                     (int)c->max_batch, "queue_limit", (int)c->queue_limit, "device", c->device);
}

static json_t *j_advert(const Tessera__Advert *a, const Tessera__AdvertBody *b) {
    char id[65], part[65], wh[65];
    hex(&a->node_id, 64, id);
    if (!b)
        return json_pack("{s:s, s:b}", "node_id", id, "valid", 0);
    hex(&b->partition_id, 64, part);
    hex(&b->weights_hash, 64, wh);
    json_int_t dims = b->centroid && b->centroid->n_shape ? b->centroid->shape[0] : 0;
    json_t *training =
        b->training ? json_pack("{s:I, s:I, s:f}", "step", (json_int_t)b->training->step, "steps",
                                (json_int_t)b->training->steps, "loss", (double)b->training->loss)
                    : json_null();
    return json_pack("{s:s, s:b, s:I, s:s, s:i, s:i, s:s, s:s, s:o, s:I, s:o, s:o, s:o, s:b}",
                     "node_id", id, "valid", 1, "version", (json_int_t)b->version, "partition_id",
                     part, "num_clusters", (int)b->num_clusters, "cluster", (int)b->cluster,
                     "weights_hash", wh, "objective", objective_name(b->objective), "model",
                     j_model(b->model), "centroid_dims", dims, "capacity", j_capacity(b->capacity),
                     "load", j_load(b->load), "training", training, "router", b->has_router_hash);
}

static json_t *j_status(const Tessera__StatusResponse *r, const adverts_t *ad) {
    char id[65];
    hex(&r->node_id, 64, id);
    json_t *members = json_array(), *adverts = json_array(), *clusters = json_array(),
           *uncovered = json_array();
    for (size_t i = 0; i < r->n_members; i++) {
        const Tessera__MemberState *m = r->members[i];
        char mid[65], brief[17];
        hex(&m->node_id, 64, mid);
        hex(&m->node_id, 16, brief);
        json_array_append_new(members,
                              json_pack("{s:s, s:s, s:s, s:I, s:s, s:I, s:I}", "node_id", mid,
                                        "node_id_short", brief, "state", state_name(m->status),
                                        "incarnation", (json_int_t)m->incarnation, "addr",
                                        m->addr ? m->addr : "", "last_change_age_ms",
                                        (json_int_t)m->last_change_age_ms, "advert_version",
                                        (json_int_t)m->advert_version));
    }
    for (size_t i = 0; i < r->n_adverts; i++)
        json_array_append_new(adverts, j_advert(r->adverts[i], ad->bodies[i]));
    const Tessera__Aggregates *g = r->aggregates;
    json_t *agg = json_null();
    if (g) {
        for (size_t i = 0; i < g->n_clusters; i++) {
            char p[65];
            hex(&g->clusters[i]->partition_id, 64, p);
            json_array_append_new(clusters,
                                  json_pack("{s:s, s:i, s:i}", "partition_id", p, "cluster",
                                            (int)g->clusters[i]->cluster, "live_experts",
                                            (int)g->clusters[i]->live_experts));
        }
        for (size_t i = 0; i < g->n_uncovered; i++) {
            char p[65];
            hex(&g->uncovered[i]->partition_id, 64, p);
            json_array_append_new(uncovered, json_pack("{s:s, s:i}", "partition_id", p, "cluster",
                                                       (int)g->uncovered[i]->cluster));
        }
        agg = json_pack("{s:O, s:O, s:f, s:f, s:i}", "clusters", clusters, "uncovered", uncovered,
                        "total_capacity", (double)g->total_capacity, "request_rate",
                        (double)g->request_rate, "live_members", (int)g->live_members);
    }
    json_decref(clusters);
    json_decref(uncovered);
    json_t *j = json_pack("{s:s, s:i, s:o, s:o, s:o, s:o}", "node_id", id, "live_members",
                          g ? (int)g->live_members : -1, "members", members, "adverts", adverts,
                          "load", j_load(r->load), "aggregates", agg);
    json_object_set_new(j, "health", r->health ? json_string(r->health) : json_null());
    json_object_set_new(j, "metrics", r->metrics ? json_string(r->metrics) : json_null());
    return j;
}

/* One member row: the expert part from its advert, when one is held. */
static void print_member(const Tessera__MemberState *m, const Tessera__AdvertBody *b) {
    char brief[17], ago[32], expert[160] = "-";
    hex(&m->node_id, 16, brief);
    age(m->last_change_age_ms, ago, sizeof ago);
    if (b) {
        char part[9];
        hex(&b->partition_id, 8, part);
        int n = snprintf(expert, sizeof expert, "%s:%u", part, b->cluster);
        if (b->model && n > 0 && (size_t)n < sizeof expert)
            n += snprintf(expert + n, sizeof expert - (size_t)n, " h%u d%u p%u",
                          b->model->hidden_size, b->model->depth, b->model->patch_size);
        if (b->capacity && b->capacity->device && n > 0 && (size_t)n < sizeof expert)
            n += snprintf(expert + n, sizeof expert - (size_t)n, " %.*s", /* "cpu", "cuda:0" */
                          (int)strcspn(b->capacity->device, ","), b->capacity->device);
        if (b->load && n > 0 && (size_t)n < sizeof expert)
            n += snprintf(expert + n, sizeof expert - (size_t)n, " q%u %.1fms",
                          b->load->queue_depth, b->load->item_latency_us / 1000.0);
        if (b->training && n > 0 && (size_t)n < sizeof expert)
            snprintf(expert + n, sizeof expert - (size_t)n, " training %llu/%llu",
                     (unsigned long long)b->training->step, (unsigned long long)b->training->steps);
    }
    printf("  %-16s  %-7s  %5llu  %-21s  %8s  v%-4llu %s\n", brief, state_name(m->status),
           (unsigned long long)m->incarnation, m->addr ? m->addr : "", ago,
           (unsigned long long)m->advert_version, expert);
}

static void print_status(const Tessera__StatusResponse *r, const adverts_t *ad, const char *addr) {
    char id[17];
    hex(&r->node_id, 16, id);
    const Tessera__Aggregates *g = r->aggregates;
    size_t experts = 0;
    for (size_t i = 0; g && i < g->n_clusters; i++)
        experts += g->clusters[i]->live_experts;
    printf("node %s at %s: %zu member%s known, %u alive; %zu live expert%s; %zu cluster%s "
           "without one\n",
           id, addr, r->n_members, r->n_members == 1 ? "" : "s", g ? g->live_members : 0, experts,
           experts == 1 ? "" : "s", g ? g->n_uncovered : 0, g && g->n_uncovered == 1 ? "" : "s");
    if (r->health)
        printf("health: %s\n", r->health);
    if (r->metrics)
        printf("metrics: %s\n", r->metrics);
    if (r->n_members) {
        printf("\n  %-16s  %-7s  %5s  %-21s  %8s  %-5s %s\n", "MEMBER", "STATE", "INC", "ADDRESS",
               "CHANGED", "ADV", "EXPERT (partition:cluster, model, device, load)");
        for (size_t i = 0; i < r->n_members; i++)
            print_member(r->members[i], advert_of(r, ad, &r->members[i]->node_id));
    }
    if (g && (g->n_clusters || g->n_uncovered)) {
        printf("\n  clusters (live experts):");
        for (size_t i = 0; i < g->n_clusters; i++) {
            char p[9];
            hex(&g->clusters[i]->partition_id, 8, p);
            printf(" %s:%u=%u", p, g->clusters[i]->cluster, g->clusters[i]->live_experts);
        }
        if (g->n_uncovered) {
            printf("\n  uncovered:");
            for (size_t i = 0; i < g->n_uncovered; i++) {
                char p[9];
                hex(&g->uncovered[i]->partition_id, 8, p);
                printf(" %s:%u", p, g->uncovered[i]->cluster);
            }
        }
        printf("\n");
    }
    if (g) {
        if (g->total_capacity > 0.0f)
            printf("\n  capacity %.1f forward rows/s", (double)g->total_capacity);
        else
            printf("\n  capacity not measured yet (no request served)");
        printf(", request rate %.2f/s\n", (double)g->request_rate);
    }
}

static void ask(status_t *s);

static void stop(status_t *s, int failed, const char *message) {
    if (failed && !s->failed) {
        s->failed = 1;
        snprintf(s->err, sizeof s->err, "%s", message);
    }
    if (!uv_is_closing((uv_handle_t *)&s->timer))
        uv_close((uv_handle_t *)&s->timer, NULL);
    if (!uv_is_closing((uv_handle_t *)&s->sigint))
        uv_close((uv_handle_t *)&s->sigint, NULL);
    ts_rpc_shutdown(s->nc.rpc);
}

static void on_tick(uv_timer_t *t) { ask(t->data); }

static void on_answer(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    status_t *s = arg;
    if (res->status != TS_OK) {
        stop(s, 1, res->message);
        return;
    }
    const Tessera__StatusResponse *r = res->reply->status_response;
    adverts_t ad;
    if (adverts_decode(r, &ad) != TS_OK) {
        stop(s, 1, "out of memory");
        return;
    }
    if (s->json) {
        ts_json_print(j_status(r, &ad));
    } else {
        if (s->watch && s->tty)
            printf("\033[H\033[2J");
        print_status(r, &ad, s->nc.addr);
        if (s->watch)
            printf("\n(every %d s; Ctrl-C to stop)\n", s->interval_s);
    }
    fflush(stdout);
    adverts_free(&ad);
    s->rounds++;
    if (s->watch)
        uv_timer_start(&s->timer, on_tick, (uint64_t)s->interval_s * 1000, 0);
    else
        stop(s, 0, "");
}

static void ask(status_t *s) {
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__StatusRequest req = TESSERA__STATUS_REQUEST__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = &req;
    char err[256] = "";
    if (ts_rpc_call(s->nc.peer, &env, (uint32_t)s->timeout_ms, on_answer, s, NULL, err,
                    sizeof err) != TS_OK)
        stop(s, 1, err);
}

static void on_sigint(uv_signal_t *h, int signum) {
    (void)signum;
    stop(h->data, 0, "");
}

int ts_cmd_status(int argc, char **argv) {
    const char *id_path = NULL, *nk_path = NULL, *peer = NULL;
    status_t s = {.timeout_ms = 5000, .interval_s = 2};
    ts_arg_t args[] = {
        {"peer", TS_ARG_STRING, &peer, "HOST:PORT", "the node to ask", 0, 0, 1},
        {"network-key", TS_ARG_STRING, &nk_path, "FILE", "the network key", 0, 0, 1},
        {"identity", TS_ARG_STRING, &id_path, "FILE",
         "an identity to connect with (default: a fresh one for this run)"},
        {"json", TS_ARG_FLAG, &s.json, NULL, "print JSON (one object per answer)"},
        {"watch", TS_ARG_FLAG, &s.watch, NULL, "ask again every --interval seconds until Ctrl-C"},
        {"interval", TS_ARG_INT, &s.interval_s, "S",
         "seconds between answers with --watch "
         "(default 2)",
         1, 3600},
        {"timeout-ms", TS_ARG_INT, &s.timeout_ms, "N",
         "for connect + handshake, and for each answer (default 5000)", 1, 3600000},
    };
    const char *summary = "Show the network as one node sees it: members, experts, clusters, "
                          "load.\nusage: tessera status --peer HOST:PORT --network-key FILE";
    int pr = ts_args_parse("tessera status", summary, args, (int)(sizeof args / sizeof args[0]),
                           argc, argv);
    if (pr)
        return pr == 1 ? 0 : 2;
    int rc =
        ts_netclient_open(&s.nc, "tessera status", peer, id_path, nk_path, (uint32_t)s.timeout_ms);
    if (rc)
        return rc;
    s.tty = isatty(STDOUT_FILENO);
    uv_timer_init(&s.nc.loop, &s.timer);
    uv_signal_init(&s.nc.loop, &s.sigint);
    s.timer.data = s.sigint.data = &s;
    if (s.watch)
        uv_signal_start(&s.sigint, on_sigint, SIGINT);
    ask(&s);
    uv_run(&s.nc.loop, UV_RUN_DEFAULT);
    ts_netclient_close(&s.nc);
    if (s.failed) {
        fprintf(stderr, "tessera status: %s: %s\n", peer, s.err);
        return 1;
    }
    return 0;
}
