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

static void progress(void *ctx, uint64_t done, uint64_t total, int fetched) {
    (void)fetched;
    const char *name = ctx;
    fprintf(stderr, "\r%.16s: %.1f / %.1f MiB   ", name, done / 1048576.0, total / 1048576.0);
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

int ts_cmd_pull(int argc, char **argv) {
    const char *peer = NULL, *nk = NULL, *identity = NULL, *data_dir = NULL, *want = NULL;
    int all = 0, json = 0, timeout_ms = 30000;
    ts_arg_t args[] = {
        {"peer", TS_ARG_STRING, &peer, "HOST:PORT", "a node of the network", 0, 0, 1},
        {"network-key", TS_ARG_STRING, &nk, "FILE", "the network key", 0, 0, 1},
        {"identity", TS_ARG_STRING, &identity, "FILE",
         "an identity to connect with (default: a fresh one)"},
        {"all", TS_ARG_FLAG, &all, NULL, "every expert the peer's view advertises"},
        {"data-dir", TS_ARG_STRING, &data_dir, "DIR", "the store (default: the user's store)"},
        {"timeout-ms", TS_ARG_INT, &timeout_ms, "N", "per request (default 30000)", 1, 3600000},
        {"json", TS_ARG_FLAG, &json, NULL, "print one JSON object per file"},
    };
    const char *summary = "Fetch experts' weights from the network into the store, verified and "
                          "resumable.\nusage: tessera pull (WEIGHTS | --all) --peer HOST:PORT "
                          "--network-key FILE";
    if (argc >= 2 && argv[1][0] != '-') {
        want = argv[1];
        argv[1] = argv[0];
        argc--;
        argv++;
    }
    int pr = ts_args_parse(PROG, summary, args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr)
        return pr == 1 ? 0 : 2;
    if (!want == !all) {
        fprintf(stderr, PROG ": name the weights (a hash or a prefix of 8+ hex digits) or --all\n");
        return 2;
    }
    if (want && (strlen(want) < 8 || strlen(want) > 64 ||
                 strspn(want, "0123456789abcdef") != strlen(want))) {
        fprintf(stderr, PROG ": '%s' is not a weights hash or a prefix of 8+ hex digits\n", want);
        return 2;
    }
    char err[1024] = "", dir[1024];
    ts_store_t *store = NULL;
    ts_store_opts_t so = {.dir = data_dir};
    if (!data_dir && ts_store_default_dir(dir, sizeof dir) == TS_OK)
        so.dir = dir;
    if (ts_store_open(&store, &so, err, sizeof err) != TS_OK) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    ts_netclient_t nc;
    int rc = ts_netclient_open(&nc, PROG, peer, identity, nk, (uint32_t)timeout_ms);
    if (rc) {
        ts_store_close(store);
        return rc;
    }
    Tessera__StatusRequest sr = TESSERA__STATUS_REQUEST__INIT;
    Tessera__Envelope req = TESSERA__ENVELOPE__INIT, *resp = NULL;
    req.body_case = TESSERA__ENVELOPE__BODY_STATUS_REQUEST;
    req.status_request = &sr;
    int failed = 0, matched = 0;
    if (ts_netclient_call(&nc, nc.peer, &req, (uint32_t)timeout_ms, &resp, err, sizeof err) !=
        TS_OK) {
        fprintf(stderr, PROG ": %s does not answer: %s\n", peer, err);
        failed = 1;
    }
    const Tessera__StatusResponse *r = resp ? resp->status_response : NULL;
    /* every distinct weights hash advertised (and matching), once */
    for (size_t i = 0; r && i < r->n_adverts; i++) {
        Tessera__AdvertBody *b = NULL;
        if (ts_frame_decode_advert_body(&r->adverts[i]->body, 0, &b, NULL, 0) != TS_OK)
            continue;
        ts_hash_t h;
        memcpy(h.b, b->weights_hash.data, TS_HASH_BYTES);
        ts_frame_free(b);
        char hex[TS_HASH_HEX];
        ts_hash_hex(&h, hex);
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++) {
            Tessera__AdvertBody *c = NULL;
            if (ts_frame_decode_advert_body(&r->adverts[j]->body, 0, &c, NULL, 0) == TS_OK) {
                seen = memcmp(c->weights_hash.data, h.b, TS_HASH_BYTES) == 0;
                ts_frame_free(c);
            }
        }
        if (seen || (want && strncmp(hex, want, strlen(want)) != 0))
            continue;
        matched++;
        const char *addr = holder(r, h.b);
        ts_rpc_peer_t *p = NULL;
        ts_fetch_stats_t st = {0};
        rc = addr ? ts_rpc_peer_get(nc.rpc, addr, &p, err, sizeof err) : TS_ENOTFOUND;
        if (!addr)
            snprintf(err, sizeof err, "no live node advertises it");
        if (rc == TS_OK)
            rc = ts_fetch_file(&nc, p, store, &h, (uint32_t)timeout_ms,
                               json || !isatty(STDERR_FILENO) ? NULL : progress, hex, &st, err,
                               sizeof err);
        if (!json && isatty(STDERR_FILENO))
            fprintf(stderr, "\r");
        if (rc != TS_OK) {
            failed = 1;
            fprintf(stderr, PROG ": %.16s: %s\n", hex, err);
        } else if (json) {
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
    if (r && matched == 0) {
        fprintf(stderr, PROG ": %s\n",
                want ? "no expert with these weights in the network"
                     : "the network advertises no expert");
        failed = 1;
    }
    ts_frame_free(resp);
    ts_netclient_close(&nc);
    ts_store_close(store);
    return failed ? 1 : 0;
}
