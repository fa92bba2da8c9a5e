/*
 * cmd_pull.c — `tessera pull`: experts' weights from the network into the store, so that
 * `tessera generate --peer … --prefer-local` runs them here (and falls back on them when their
 * nodes fail).
 *
 *   tessera pull (WEIGHTS | --all) --peer HOST:PORT --network-key FILE [--data-dir DIR] [--json]
 *
 * WEIGHTS is a weights hash or a prefix of at least 8 hex digits, as `tessera status --json`
 * shows them; --all pulls every expert the peer's view advertises. Each file comes from the
 * weight server of a node that advertises it (fetch.h): chunk by chunk, each checked against its
 * hash as it arrives and stored at once, so an interrupted pull resumes where it stopped; the
 * whole file is checked against its weights hash before it is usable.
 *
 * Exit status: 0 when every file asked for is in the store, 1 when one could not be fetched (the
 * others still are), 2 for bad usage.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "client/args.h"
#include "client/commands.h"
#include "net/fetch.h"
#include "net/netclient.h"
#include "net/frame.h"
#include "net/gossip.h"

#define PROG "tessera pull"

static int progress(void *ctx, uint64_t done, uint64_t total, int fetched) {
    (void)fetched;
    const char *name = ctx;
    fprintf(stderr, "\r%.16s: %.1f / %.1f MiB   ", name, done / 1048576.0, total / 1048576.0);
    return 0;
}

/* The address of a live node advertising weights h, from the status answer; NULL if none. */
static const char *holder(const Tessera__StatusResponse *r, const uint8_t *h) {
    for (size_t i = 0; i < r->n_adverts; i++) {
        Tessera__AdvertBody *b = NULL;
        if (ts_gossip_advert_check(r->adverts[i]) != TS_OK ||
            ts_frame_decode_advert_body(&r->adverts[i]->body, 0, &b, NULL, 0) != TS_OK)
            continue;
        int same = memcmp(b->weights_hash.data, h, TS_HASH_BYTES) == 0;
        ts_frame_free(b);
        if (!same)
            continue;
        for (size_t m = 0; m < r->n_members; m++)
            if (r->members[m]->status == TESSERA__MEMBER_STATUS__MEMBER_ALIVE &&
                r->members[m]->node_id.len == r->adverts[i]->node_id.len &&
                memcmp(r->members[m]->node_id.data, r->adverts[i]->node_id.data,
                       r->adverts[i]->node_id.len) == 0 &&
                r->members[m]->addr)
                return r->members[m]->addr;
    }
    return NULL;
}

/* ---- the verb: parse → validate → run → print ---------------------------------------------- */

typedef struct {
    const char *peer, *nk, *identity, *data_dir, *want;
    int all, json, timeout_ms;
} pull_opts_t;

/* Everything one pull opens (the entry point closes it). */
typedef struct {
    pull_opts_t o;
    ts_store_t *store;
    ts_netclient_t nc;
    int failed, matched;
    char err[1024], dir[1024];
} pull_run_t;

/* The operand WEIGHTS (when it comes first), then the options: TS_ARGS_RUN, or the exit code
 * (ts_args_parse). */
static int parse_opts(int argc, char **argv, pull_opts_t *o) {
    *o = (pull_opts_t){.timeout_ms = 30000};
    ts_arg_t args[] = {
        {"peer", TS_ARG_STRING, &o->peer, "HOST:PORT", "a node of the network", 0, 0, 1},
        {"network-key", TS_ARG_STRING, &o->nk, "FILE", "the network key", 0, 0, 1},
        {"identity", TS_ARG_STRING, &o->identity, "FILE",
         "an identity to connect with (default: a fresh one)"},
        {"all", TS_ARG_FLAG, &o->all, NULL, "every expert the peer's view advertises"},
        {"data-dir", TS_ARG_STRING, &o->data_dir, "DIR", "the store (default: the user's store)"},
        {"timeout-ms", TS_ARG_INT, &o->timeout_ms, "N", "per request (default 30000)", 1, 3600000},
        {"json", TS_ARG_FLAG, &o->json, NULL, "print one JSON object per file"},
    };
    const char *summary = "Fetch experts' weights from the network into the store, verified and "
                          "resumable.\nusage: tessera pull (WEIGHTS | --all) --peer HOST:PORT "
                          "--network-key FILE [options]\nexample: tessera pull --all --peer "
                          "127.0.0.1:7420 --network-key tessera-net/network.key";
    if (argc >= 2 && argv[1][0] != '-') {
        o->want = argv[1];
        argv[1] = argv[0];
        argc--;
        argv++;
    }
    return ts_args_parse(PROG, summary, args, (int)(sizeof args / sizeof args[0]), argc, argv);
}

/* WEIGHTS or --all, and WEIGHTS a hash or a prefix of one: 0, or 2 with the message printed. */
static int validate(const pull_opts_t *o) {
    const char *want = o->want;
    if (!want == !o->all)
        fprintf(stderr, PROG ": name the weights (a hash or a prefix of 8+ hex digits) or --all\n");
    else if (want && (strlen(want) < 8 || strlen(want) > 64 ||
                      strspn(want, "0123456789abcdef") != strlen(want)))
        fprintf(stderr, PROG ": '%s' is not a weights hash or a prefix of 8+ hex digits\n", want);
    else
        return 0;
    return 2;
}

/* The store (--data-dir, else the user's) and the client for --peer: 0, or the exit code with the
 * message printed. */
static int open_client(pull_run_t *r) {
    const pull_opts_t *o = &r->o;
    ts_store_opts_t so = {.dir = o->data_dir};
    if (!o->data_dir && ts_store_default_dir(r->dir, sizeof r->dir) == TS_OK)
        so.dir = r->dir;
    if (ts_store_open(&r->store, &so, r->err, sizeof r->err) != TS_OK) {
        fprintf(stderr, PROG ": %s\n", r->err);
        return 1;
    }
    return ts_netclient_open(&r->nc, PROG, o->peer, o->identity, o->nk, (uint32_t)o->timeout_ms);
}

/* Whether advert i's weights hash h was advertised by an earlier advert. */
static int advertised_before(const Tessera__StatusResponse *s, size_t i, const ts_hash_t *h) {
    int seen = 0;
    for (size_t j = 0; j < i && !seen; j++) {
        Tessera__AdvertBody *c = NULL;
        if (ts_frame_decode_advert_body(&s->adverts[j]->body, 0, &c, NULL, 0) == TS_OK) {
            seen = memcmp(c->weights_hash.data, h->b, TS_HASH_BYTES) == 0;
            ts_frame_free(c);
        }
    }
    return seen;
}

/* Fetches the weights h from a live node that advertises them, and says how it went. */
static void pull_one(pull_run_t *r, const Tessera__StatusResponse *s, const ts_hash_t *h,
                     const char *hex) {
    const pull_opts_t *o = &r->o;
    int tty = !o->json && isatty(STDERR_FILENO);
    const char *addr = holder(s, h->b);
    ts_rpc_peer_t *p = NULL;
    ts_fetch_stats_t st = {0};
    int rc = addr ? ts_rpc_peer_get(r->nc.rpc, addr, &p, r->err, sizeof r->err) : TS_ENOTFOUND;
    if (!addr)
        snprintf(r->err, sizeof r->err, "no live node advertises it");
    if (rc == TS_OK)
        rc = ts_fetch_file(&r->nc, p, r->store, h, (uint32_t)o->timeout_ms, tty ? progress : NULL,
                           (void *)hex, &st, r->err, sizeof r->err);
    if (tty)
        fprintf(stderr, "\r");
    if (rc != TS_OK) {
        r->failed = 1;
        fprintf(stderr, PROG ": %.16s: %s\n", hex, r->err);
    } else if (o->json) {
        printf("{\"weights\":\"%s\",\"from\":\"%s\",\"present\":%s,\"bytes_fetched\":%llu,"
               "\"bytes_reused\":%llu,\"seconds\":%.3f}\n",
               hex, addr, st.present ? "true" : "false", (unsigned long long)st.bytes_fetched,
               (unsigned long long)st.bytes_reused, st.seconds);
    } else if (st.present) {
        printf("%.16s  already in the store\n", hex);
    } else {
        printf("%.16s  from %s: %.1f MiB fetched, %.1f MiB already here, %.2f s\n", hex, addr,
               st.bytes_fetched / 1048576.0, st.bytes_reused / 1048576.0, st.seconds);
    }
}

/* The peer's status, then every distinct weights hash it advertises (and WEIGHTS matches), once. */
static void pull(pull_run_t *r) {
    const pull_opts_t *o = &r->o;
    Tessera__StatusRequest sr = TESSERA__STATUS_REQUEST__INIT;
    Tessera__Envelope req = TESSERA__ENVELOPE__INIT, *resp = NULL;
    req.body_case = TESSERA__ENVELOPE__BODY_STATUS_REQUEST;
    req.status_request = &sr;
    if (ts_netclient_call(&r->nc, r->nc.peer, &req, (uint32_t)o->timeout_ms, &resp, r->err,
                          sizeof r->err) != TS_OK) {
        fprintf(stderr, PROG ": %s does not answer: %s\n", o->peer, r->err);
        r->failed = 1;
    }
    const Tessera__StatusResponse *s = resp ? resp->status_response : NULL;
    for (size_t i = 0; s && i < s->n_adverts; i++) {
        Tessera__AdvertBody *b = NULL;
        if (ts_frame_decode_advert_body(&s->adverts[i]->body, 0, &b, NULL, 0) != TS_OK)
            continue;
        ts_hash_t h;
        memcpy(h.b, b->weights_hash.data, TS_HASH_BYTES);
        ts_frame_free(b);
        char hex[TS_HASH_HEX];
        ts_hash_hex(&h, hex);
        if (advertised_before(s, i, &h) || (o->want && strncmp(hex, o->want, strlen(o->want)) != 0))
            continue;
        r->matched++;
        pull_one(r, s, &h, hex);
    }
    if (s && r->matched == 0) {
        fprintf(stderr, PROG ": %s\n",
                o->want ? "no expert with these weights in the network"
                        : "the network advertises no expert");
        r->failed = 1;
    }
    ts_frame_free(resp);
}

int ts_cmd_pull(int argc, char **argv) {
    pull_run_t r;
    memset(&r, 0, sizeof r);
    int pr = parse_opts(argc, argv, &r.o);
    if (pr != TS_ARGS_RUN)
        return pr;
    if (validate(&r.o))
        return 2;
    int code = open_client(&r);
    if (code == 0) {
        pull(&r);
        ts_netclient_close(&r.nc);
        code = r.failed ? 1 : 0;
    }
    ts_store_close(r.store);
    return code;
}
