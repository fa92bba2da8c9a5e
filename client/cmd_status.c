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
 * --json prints one object instead (its fields: net/status_json.h, which tesserad's status page
 * reads too); --watch asks again every --interval seconds over the same connection and redraws
 * in place on a terminal (JSON: one object per line), until interrupted.
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
#include "client/updir.h"
#include "net/netclient.h"
#include "net/frame.h"
#include "net/gossip.h"
#include "net/status_json.h"

typedef struct status {
    ts_netclient_t nc;
    int json, watch, tty, timeout_ms, interval_s, rounds, failed;
    int stopping; /* stop ran: a call it ends (refused as shutting down) is not an error */
    uv_timer_t timer;
    uv_signal_t sigint;
    char err[1400];
} status_t;

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

/* One member row: the expert part from its advert, when one is held. */
static void print_member(const Tessera__MemberState *m, const Tessera__AdvertBody *b) {
    char brief[17], ago[32], expert[160] = "-";
    ts_status_hex(&m->node_id, 16, brief);
    age(m->last_change_age_ms, ago, sizeof ago);
    if (b) {
        char part[9];
        ts_status_hex(&b->partition_id, 8, part);
        int n = snprintf(expert, sizeof expert, "%s:%u", part, b->cluster);
        if (b->model && n > 0 && (size_t)n < sizeof expert)
            n += snprintf(expert + n, sizeof expert - (size_t)n, " h%u d%u p%u",
                          b->model->hidden_size, b->model->depth, b->model->patch_size);
        if (b->capacity && b->capacity->device && n > 0 && (size_t)n < sizeof expert)
            n += snprintf(expert + n, sizeof expert - (size_t)n, " %.*s", /* "cpu", "cuda:0" */
                          (int)strcspn(b->capacity->device, ","), b->capacity->device);
        if (b->load && n > 0 && (size_t)n < sizeof expert) {
            char lat[32] = "–"; /* nothing served yet: no latency to show */
            if (b->load->item_latency_us > 0)
                snprintf(lat, sizeof lat, "%.1fms", b->load->item_latency_us / 1000.0);
            n += snprintf(expert + n, sizeof expert - (size_t)n, " q%u %s", b->load->queue_depth,
                          lat);
        }
        if (b->has_heldout_loss && n > 0 && (size_t)n < sizeof expert)
            n += snprintf(expert + n, sizeof expert - (size_t)n, " held-out %.4f",
                          (double)b->heldout_loss);
        if (b->training && n > 0 && (size_t)n < sizeof expert &&
            (m->status == TESSERA__MEMBER_STATUS__MEMBER_ALIVE ||
             m->status == TESSERA__MEMBER_STATUS__MEMBER_SUSPECT)) /* a gone node trains nothing */
            n += snprintf(expert + n, sizeof expert - (size_t)n, " training %llu/%llu%s",
                          (unsigned long long)b->training->step,
                          (unsigned long long)b->training->steps,
                          ts_advert_trained(b) ? "" : " (not used by default)");
        if (b->has_relay_id && n > 0 && (size_t)n < sizeof expert) {
            char via[9];
            ts_status_hex(&b->relay_id, 8, via);
            snprintf(expert + n, sizeof expert - (size_t)n, " relayed via %s", via);
        }
    }
    printf("  %-16s  %-7s  %5llu  %-21s  %8s  v%-4llu %s\n", brief, ts_status_state_name(m->status),
           (unsigned long long)m->incarnation, m->addr ? m->addr : "", ago,
           (unsigned long long)m->advert_version, expert);
}

static void print_status(const Tessera__StatusResponse *r, const ts_status_adverts_t *ad,
                         const char *addr) {
    char id[17];
    ts_status_hex(&r->node_id, 16, id);
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
    if (r->training) {
        const Tessera__TrainingStatus *t = r->training;
        char part[17], left[32] = "unknown";
        ts_status_hex(&t->partition_id, 16, part);
        double left_ms = t->has_steps_per_s && t->steps_per_s > 0.0f
                             ? (double)(t->steps - t->step) / t->steps_per_s * 1000.0
                             : -1.0;
        if (left_ms >= 0.0 && left_ms < 1e15) /* from the network: bounded before converting */
            age((uint64_t)left_ms, left, sizeof left);
        printf("this node trains cluster %u of partition %s: step %llu of %llu (%.1f%%)",
               t->cluster, part, (unsigned long long)t->step, (unsigned long long)t->steps,
               t->steps ? 100.0 * (double)t->step / (double)t->steps : 0.0);
        if (t->has_loss)
            printf(", loss %.4f", (double)t->loss);
        if (t->has_heldout_loss)
            printf(", held-out loss %.4f at step %llu", (double)t->heldout_loss,
                   (unsigned long long)t->heldout_step);
        printf(", %.2f steps/s, %s left; %s\n", (double)t->steps_per_s, left,
               t->served ? "a checkpoint is served, used only by clients that ask for "
                           "--min-trained or --ready-loss"
                         : "not served yet");
    }
    if (r->metrics)
        printf("metrics: %s\n", r->metrics);
    for (size_t i = 0; i < r->n_bans; i++) {
        char node[17];
        ts_status_hex(&r->bans[i]->node_id, 16, node);
        printf("BANNED: %s%s, its adverts withheld: %s\n", node,
               r->bans[i]->expelled ? " (expelled)" : "",
               r->bans[i]->reason ? r->bans[i]->reason : "");
    }
    if (r->n_members) {
        printf("\n  %-16s  %-7s  %5s  %-21s  %8s  %-5s %s\n", "MEMBER", "STATE", "INC", "ADDRESS",
               "CHANGED", "ADV", "EXPERT (partition:cluster, model, device, load)");
        for (size_t i = 0; i < r->n_members; i++)
            print_member(r->members[i], ts_status_advert_of(r, ad, &r->members[i]->node_id));
    }
    if (g && (g->n_clusters || g->n_uncovered)) {
        printf("\n  clusters (live experts):");
        for (size_t i = 0; i < g->n_clusters; i++) {
            char p[9];
            ts_status_hex(&g->clusters[i]->partition_id, 8, p);
            printf(" %s:%u=%u", p, g->clusters[i]->cluster, g->clusters[i]->live_experts);
        }
        if (g->n_uncovered) {
            printf("\n  uncovered:");
            for (size_t i = 0; i < g->n_uncovered; i++) {
                char p[9];
                ts_status_hex(&g->uncovered[i]->partition_id, 8, p);
                printf("%s %s:%u", i ? "," : "", p, g->uncovered[i]->cluster);
                if (g->uncovered[i]->training_experts)
                    printf(" (%u training)", g->uncovered[i]->training_experts);
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
    if (failed && !s->failed && !s->stopping) {
        s->failed = 1;
        snprintf(s->err, sizeof s->err, "%s", message);
    }
    if (!uv_is_closing((uv_handle_t *)&s->timer))
        uv_close((uv_handle_t *)&s->timer, NULL);
    if (!uv_is_closing((uv_handle_t *)&s->sigint))
        uv_close((uv_handle_t *)&s->sigint, NULL);
    s->stopping = 1;
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
    ts_status_adverts_t ad;
    if (ts_status_adverts_decode(r, &ad) != TS_OK) {
        stop(s, 1, "out of memory");
        return;
    }
    if (s->json) {
        ts_json_print(ts_status_json(r, &ad));
    } else {
        if (s->watch && s->tty)
            printf("\033[H\033[2J");
        print_status(r, &ad, s->nc.addr);
        if (s->watch)
            printf("\n(every %d s; Ctrl-C to stop)\n", s->interval_s);
    }
    fflush(stdout);
    ts_status_adverts_free(&ad);
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

/* A running node of the `tessera up` folder dir: its listen address into peer, and the folder's
 * network key into nk. 0, or 1 with err. */
static int from_rundir(const char *dir, char *peer, size_t peer_len, char *nk, size_t nk_len,
                       char *err, size_t errlen) {
    snprintf(nk, nk_len, "%s/network.key", dir);
    if (access(nk, R_OK) != 0) {
        snprintf(err, errlen, "--dir %s: no network.key there (is it a `tessera up` folder?)", dir);
        return 1;
    }
    if (ts_updir_live_addr(dir, peer, peer_len) == 0)
        return 0;
    snprintf(err, errlen, "--dir %s: no node of it is running (`tessera up --dir %s` starts them)",
             dir, dir);
    return 1;
}

int ts_cmd_status(int argc, char **argv) {
    const char *id_path = NULL, *nk_path = NULL, *peer = NULL, *dir = NULL;
    status_t s = {.timeout_ms = 5000, .interval_s = 2};
    ts_arg_t args[] = {
        {"peer", TS_ARG_STRING, &peer, "HOST:PORT", "the node to ask (or --dir)"},
        {"network-key", TS_ARG_STRING, &nk_path, "FILE", "the network key (or --dir)"},
        {"dir", TS_ARG_STRING, &dir, "DIR",
         "a `tessera up` folder: ask one of its running nodes, with its network key"},
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
    const char *summary =
        "Show the network as one node sees it: members, experts, clusters, load, and the node's "
        "own training.\nusage: tessera status (--peer HOST:PORT --network-key FILE | --dir DIR) "
        "[options]\nexample: tessera status --dir tessera-net --watch";
    int pr = ts_args_parse("tessera status", summary, args, (int)(sizeof args / sizeof args[0]),
                           argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    char dir_peer[128], dir_nk[4200], err[4400];
    if (dir && (peer || nk_path)) {
        fprintf(stderr, "tessera status: --dir names the node and the key: no --peer or "
                        "--network-key with it\n");
        return 2;
    }
    if (!dir && (!peer || !nk_path)) {
        fprintf(stderr, "tessera status: name the node: --peer HOST:PORT and --network-key FILE, "
                        "or --dir DIR (a `tessera up` folder)\n");
        return 2;
    }
    if (dir) {
        if (from_rundir(dir, dir_peer, sizeof dir_peer, dir_nk, sizeof dir_nk, err, sizeof err)) {
            if (s.json)
                ts_json_print(json_pack("{s:s, s:s}", "error", err, "dir", dir));
            fprintf(stderr, "tessera status: %s\n", err);
            return 1;
        }
        peer = dir_peer;
        nk_path = dir_nk;
    }
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
        if (s.json) /* a script reading stdout gets an answer either way */
            ts_json_print(json_pack("{s:s, s:s}", "error", s.err, "peer", peer));
        if (strstr(s.err, peer)) /* the reason names the node already */
            fprintf(stderr, "tessera status: %s\n", s.err);
        else
            fprintf(stderr, "tessera status: %s: %s\n", peer, s.err);
        return 1;
    }
    return 0;
}
