/*
 * test_node.c — whole nodes (daemon/node.h) in one process, on one loop, over loopback: what
 * tesserad runs, driven without a process, a configuration file on disk or a signal.
 *
 *   join, health, leave    two nodes find each other through a seed; listen.addr and metrics.url
 *                          name what was bound; /healthz says "ok" once up and "stopping" after;
 *                          a stopped node leaves (the other sees it left), the loop runs out and
 *                          closes with nothing open
 *   host                   a node hosting a demo expert advertises it: the partition's cluster,
 *                          the weights' BLAKE2b, as the other node sees it by gossip
 *   relay via              a node hosting an expert, told to go through a relay ([relay] via),
 *                          is carried: its metrics say relayed, the relay's say one node, and the
 *                          relay sees the node's advert name it
 *   auto                   an auto node that knows only a seed hosting cluster 2 fetches the
 *                          partition from it and trains a cluster nobody serves, advertising it
 *   bad starts             a taken port and a missing weights file: a sentence naming them, no
 *                          node, and a loop left with nothing open
 *
 * The demo experts (experts/demo) come from TS_DEMO_DIR; the auto case trains on Fashion-MNIST
 * (Debian's dataset-fashion-mnist) and skips when it is not installed.
 */
#define _XOPEN_SOURCE 700

#include "testutil.h"
#include "uvutil.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/node.h"
#include "model/fmnist.h"
#include "model/safetensors.h"
#include "net/status_json.h"

#ifndef TS_DEMO_DIR
#error "TS_DEMO_DIR (experts/demo) must be defined"
#endif

#define WAIT_MS 30000

typedef struct {
    char dir[512];
    ts_daemon_config_t cfg;
    ts_identity_t id;
    ts_store_t *store;
    ts_node_t *node;
    int stopped; /* ts_node_stop's done ran */
} tnode_t;

static char root[256];
static ts_netkey_t netkey;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int setup(void **state) {
    (void)state;
    if (tu_make_temp_dir(root, sizeof root, "tessera_node") != 0)
        return -1;
    char path[300], err[256];
    snprintf(path, sizeof path, "%s/net.key", root);
    if (ts_netkey_generate(&netkey) != TS_OK || ts_netkey_save(&netkey, path, err, sizeof err))
        return -1;
    return ts_log_open(TS_LOG_WARN, TS_LOG_TEXT, "", err, sizeof err) == TS_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ts_netkey_wipe(&netkey);
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

/* The node NAME's identity, folder and configuration ([node] over 127.0.0.1:0, fast gossip, the
 * seed when given, no metrics endpoint unless extra has a [metrics] section, then extra), its
 * store opened; not started. */
static void prepare(tnode_t *n, const char *name, const char *seed, const char *extra) {
    memset(n, 0, sizeof *n);
    snprintf(n->dir, sizeof n->dir, "%s/%s", root, name);
    assert_int_equal(mkdir(n->dir, 0700), 0);
    char key[600], err[512], text[4096];
    snprintf(key, sizeof key, "%s/id.key", n->dir);
    TU_CHECK_OK(ts_identity_generate(&n->id));
    TU_CHECK_RC_MSG(ts_identity_save(&n->id, key, err, sizeof err), TS_OK, err);
    snprintf(text, sizeof text,
             "[node]\nidentity = %s\nnetwork_key = %s/net.key\ndata_dir = %s/data\n"
             "listen = 127.0.0.1:0\n%s%s\n[gossip]\nprobe_interval_ms = 200\n"
             "probe_timeout_ms = 100\n[serve]\ncompute_threads = 1\n%s%s",
             key, root, n->dir, seed ? "bootstrap = " : "", seed ? seed : "",
             extra && strstr(extra, "[metrics]") ? "" : "[metrics]\nlisten =\n",
             extra ? extra : "");
    TU_CHECK_RC_MSG(ts_daemon_config_parse(&n->cfg, text, name, err, sizeof err), TS_OK, err);
    char data[600];
    snprintf(data, sizeof data, "%s/data", n->dir);
    ts_store_opts_t so = {.dir = data};
    TU_CHECK_RC_MSG(ts_store_open(&n->store, &so, err, sizeof err), TS_OK, err);
}

static void start(tnode_t *n, uv_loop_t *loop, const char *name, const char *seed,
                  const char *extra) {
    prepare(n, name, seed, extra);
    char err[1024];
    TU_CHECK_RC_MSG(
        ts_node_start(&n->node, loop, &n->cfg, &n->id, &netkey, n->store, "test", err, sizeof err),
        TS_OK, err);
    assert_non_null(n->node);
}

static void on_stopped(void *arg) { ((tnode_t *)arg)->stopped = 1; }

static void stop(tnode_t *n) { ts_node_stop(n->node, on_stopped, n); }

/* After the loop has run out. */
static void release(tnode_t *n) {
    ts_node_free(n->node);
    n->node = NULL;
    ts_store_close(n->store);
    ts_identity_wipe(&n->id);
}

/* Runs the loop out (every node stopped) and closes it: nothing may be left open. */
static void finish(uv_loop_t *loop, tnode_t *nodes, int count) {
    uv_run(loop, UV_RUN_DEFAULT);
    for (int i = 0; i < count; i++) {
        assert_true(nodes[i].stopped);
        release(&nodes[i]);
    }
    assert_int_equal(uv_loop_close(loop), 0);
}

/* ---- what a node sees ----------------------------------------------------------------------- */

/* Members of n's view in state s. */
static int members_in(tnode_t *n, int s) {
    Tessera__StatusResponse *r = NULL;
    if (ts_gossip_status(ts_node_gossip(n->node), NULL, &r) != TS_OK)
        return -1;
    int k = 0;
    for (size_t i = 0; i < r->n_members; i++)
        k += (int)r->members[i]->status == s;
    ts_gossip_status_free(r);
    return k;
}

typedef struct {
    tnode_t *viewer, *of;
    int (*want)(const Tessera__AdvertBody *b, void *arg);
    void *arg;
} advert_wait_t;

/* Whether viewer's gossip holds an advert of node `of` that want accepts. */
static int advert_seen(void *p) {
    advert_wait_t *w = p;
    Tessera__StatusResponse *r = NULL;
    ts_status_adverts_t ad = {0};
    if (ts_gossip_status(ts_node_gossip(w->viewer->node), NULL, &r) != TS_OK)
        return 0;
    int ok = 0;
    if (ts_status_adverts_decode(r, &ad) == TS_OK) {
        ProtobufCBinaryData id = {32, w->of->id.id.b};
        const Tessera__AdvertBody *b = ts_status_advert_of(r, &ad, &id);
        ok = b && w->want(b, w->arg);
        ts_status_adverts_free(&ad);
    }
    ts_gossip_status_free(r);
    return ok;
}

static void wait_advert(uv_loop_t *loop, tnode_t *viewer, tnode_t *of,
                        int (*want)(const Tessera__AdvertBody *, void *), void *arg,
                        const char *what) {
    advert_wait_t w = {viewer, of, want, arg};
    tu_run_until(loop, advert_seen, &w, WAIT_MS, what);
}

typedef struct {
    tnode_t *a, *b;
} pair_t;

static int both_alive(void *p) {
    pair_t *q = p;
    return members_in(q->a, TESSERA__MEMBER_STATUS__MEMBER_ALIVE) == 2 &&
           members_in(q->b, TESSERA__MEMBER_STATUS__MEMBER_ALIVE) == 2;
}

static int seed_left(void *p) { return members_in(p, TESSERA__MEMBER_STATUS__MEMBER_LEFT) == 1; }

static int healthy(void *p) {
    char reason[512];
    return ts_node_health(((tnode_t *)p)->node, reason, sizeof reason);
}

/* The first line of the file DIR/data/NAME (its newline removed). */
static void read_line(const tnode_t *n, const char *name, char *out, size_t len) {
    char path[700];
    snprintf(path, sizeof path, "%s/data/%s", n->dir, name);
    size_t got = 0;
    unsigned char *b = tu_read_file(path, &got);
    assert_true(got > 0 && b[got - 1] == '\n');
    snprintf(out, len, "%.*s", (int)(got - 1), (const char *)b);
    free(b);
}

/* ---- the cases ------------------------------------------------------------------------------ */

static void test_join_health_leave(void **state) {
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    tnode_t n[2];
    start(&n[0], &loop, "seed", NULL, "[metrics]\nlisten = 127.0.0.1:0\n");
    start(&n[1], &loop, "peer", ts_node_listen(n[0].node), NULL);

    char line[512], reason[512];
    read_line(&n[0], "listen.addr", line, sizeof line);
    assert_string_equal(line, ts_node_listen(n[0].node));
    assert_string_equal(ts_node_advertise(n[0].node), ts_node_listen(n[0].node));
    assert_int_equal(strncmp(ts_node_listen(n[0].node), "127.0.0.1:", 10), 0);
    assert_int_not_equal(strcmp(ts_node_listen(n[0].node), "127.0.0.1:0"), 0);
    read_line(&n[0], "metrics.url", line, sizeof line);
    assert_string_equal(line, ts_node_metrics_url(n[0].node));
    assert_int_equal(strncmp(line, "http://127.0.0.1:", 17), 0);
    assert_string_equal(ts_node_metrics_url(n[1].node), "");

    pair_t p = {&n[0], &n[1]};
    tu_run_until(&loop, both_alive, &p, WAIT_MS, "both nodes alive in both views");
    tu_run_until(&loop, healthy, &n[1], WAIT_MS, "the peer healthy");
    assert_true(ts_node_health(n[0].node, reason, sizeof reason));

    /* the seed stops: it says so at once, leaves, and the peer sees it left */
    assert_false(ts_node_stopping(n[0].node));
    stop(&n[0]);
    assert_true(ts_node_stopping(n[0].node));
    assert_false(ts_node_health(n[0].node, reason, sizeof reason));
    assert_string_equal(reason, "stopping");
    stop(&n[0]); /* a second stop does nothing */
    tu_run_until_flag(&loop, &n[0].stopped, WAIT_MS, "the seed stopped");
    tu_run_until(&loop, seed_left, &n[1], WAIT_MS, "the peer sees the seed left");
    stop(&n[1]);
    finish(&loop, n, 2);
}

/* ---- host: the advert of a hosted expert ---------------------------------------------------- */

typedef struct {
    char weights_hex[65], partition_hex[65];
    uint32_t cluster, clusters;
} expert_want_t;

static int is_expert(const Tessera__AdvertBody *b, void *arg) {
    const expert_want_t *w = arg;
    char hex[65];
    if (!b->has_cluster || b->cluster != w->cluster || b->num_clusters != w->clusters)
        return 0;
    ts_status_hex(&b->weights_hash, 64, hex);
    if (strcmp(hex, w->weights_hex) != 0)
        return 0;
    ts_status_hex(&b->partition_id, 64, hex);
    return strcmp(hex, w->partition_hex) == 0;
}

static void test_host(void **state) {
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    tnode_t n[2];
    char extra[1200], err[256];
    snprintf(extra, sizeof extra,
             "[expert]\nmode = host\nweights = %s/expert-1.safetensors\n"
             "partition = %s/partition.safetensors\n",
             TS_DEMO_DIR, TS_DEMO_DIR);
    start(&n[0], &loop, "host", NULL, extra);
    start(&n[1], &loop, "viewer", ts_node_listen(n[0].node), NULL);
    expert_want_t w = {.cluster = 1, .clusters = 4};
    TU_CHECK_RC_MSG(
        ts_file_blake2b(TS_DEMO_DIR "/expert-1.safetensors", w.weights_hex, err, sizeof err), TS_OK,
        err);
    TU_CHECK_RC_MSG(
        ts_file_blake2b(TS_DEMO_DIR "/partition.safetensors", w.partition_hex, err, sizeof err),
        TS_OK, err);
    wait_advert(&loop, &n[1], &n[0], is_expert, &w,
                "the viewer sees the host advertise expert-1 as cluster 1 of 4");
    stop(&n[0]);
    stop(&n[1]);
    finish(&loop, n, 2);
}

/* ---- relay: a node carried through [relay] via ---------------------------------------------- */

static int metric_is(tnode_t *n, int id, double want) {
    double v = -1;
    return ts_metrics_get(ts_node_metrics(n->node), id, NULL, &v) == TS_OK && v == want;
}

static int carried(void *p) {
    tnode_t *n = p; /* n[0] the relay, n[1] the node it carries */
    return metric_is(&n[1], TS_M_RELAYED, 1) && metric_is(&n[0], TS_M_RELAY_NODES, 1);
}

static int names_relay(const Tessera__AdvertBody *b, void *arg) {
    const tnode_t *relay = arg;
    return b->relay_id.len == 32 && memcmp(b->relay_id.data, relay->id.id.b, 32) == 0;
}

static void test_relay_via(void **state) {
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    tnode_t n[2];
    start(&n[0], &loop, "relay", NULL, "[relay]\nserve = true\n");
    char extra[1600];
    snprintf(extra, sizeof extra,
             "[relay]\nvia = %s\n[expert]\nmode = host\nweights = %s/expert-0.safetensors\n"
             "partition = %s/partition.safetensors\n",
             ts_node_listen(n[0].node), TS_DEMO_DIR, TS_DEMO_DIR);
    start(&n[1], &loop, "carried", ts_node_listen(n[0].node), extra);
    tu_run_until(&loop, carried, n, WAIT_MS, "the node relayed, the relay carrying one node");
    assert_true(metric_is(&n[0], TS_M_RELAYED, 0));
    wait_advert(&loop, &n[0], &n[1], names_relay, &n[0],
                "the relay sees the carried node's advert name it");
    stop(&n[1]);
    stop(&n[0]);
    finish(&loop, n, 2);
}

/* ---- auto: a node that knows only a seed covers a cluster nobody serves --------------------- */

typedef struct {
    char partition_hex[65];
    uint32_t not_cluster;
} auto_want_t;

static int covers_another(const Tessera__AdvertBody *b, void *arg) {
    const auto_want_t *w = arg;
    char hex[65];
    ts_status_hex(&b->partition_id, 64, hex);
    return strcmp(hex, w->partition_hex) == 0 && b->has_cluster && b->cluster != w->not_cluster &&
           b->cluster < 4 && b->training && b->weights_hash.len == 32;
}

static void test_auto(void **state) {
    (void)state;
    char images[600];
    snprintf(images, sizeof images, "%s/train-images-idx3-ubyte.gz", TS_FMNIST_DEFAULT_DIR);
    if (access(images, R_OK) != 0 && access(TS_FMNIST_DEFAULT_DIR "/train-images-idx3-ubyte", R_OK))
        skip(); /* no Fashion-MNIST here to train on (scripts/setup.sh installs it) */
    uv_loop_t loop;
    uv_loop_init(&loop);
    tnode_t n[2];
    char extra[1200], err[256];
    snprintf(extra, sizeof extra,
             "[expert]\nmode = host\nweights = %s/expert-2.safetensors\n"
             "partition = %s/partition.safetensors\n",
             TS_DEMO_DIR, TS_DEMO_DIR);
    start(&n[0], &loop, "auto-seed", NULL, extra);
    start(&n[1], &loop, "auto", ts_node_listen(n[0].node),
          "[expert]\nmode = auto\nauto_interval_s = 1\nauto_dwell_s = 2\n"
          "[train]\nmodel = tiny\nsteps = 6\nbatch = 8\nckpt_every = 2\nthreads = 1\n");
    auto_want_t w = {.not_cluster = 2};
    TU_CHECK_RC_MSG(
        ts_file_blake2b(TS_DEMO_DIR "/partition.safetensors", w.partition_hex, err, sizeof err),
        TS_OK, err);
    wait_advert(&loop, &n[0], &n[1], covers_another, &w,
                "the auto node training and serving a cluster the seed does not, of its partition");
    stop(&n[1]);
    stop(&n[0]);
    finish(&loop, n, 2);
}

/* ---- starts that fail ----------------------------------------------------------------------- */

static void test_bad_starts(void **state) {
    (void)state;
    uv_loop_t loop, other;
    uv_loop_init(&loop);
    tnode_t n[1], bad;
    start(&n[0], &loop, "holder", NULL, NULL);

    /* its port, taken: a node on a loop of its own fails, naming the address */
    char extra[1200], err[1024];
    uv_loop_init(&other);
    prepare(&bad, "taken", NULL, NULL);
    snprintf(bad.cfg.listen, sizeof bad.cfg.listen, "%s", ts_node_listen(n[0].node));
    snprintf(bad.cfg.advertise, sizeof bad.cfg.advertise, "%s", bad.cfg.listen);
    int rc = ts_node_start(&bad.node, &other, &bad.cfg, &bad.id, &netkey, bad.store, "test", err,
                           sizeof err);
    assert_int_not_equal(rc, TS_OK);
    assert_null(bad.node);
    TU_CHECK_CONTAINS(err, ts_node_listen(n[0].node));
    release(&bad);
    assert_int_equal(uv_loop_close(&other), 0);

    /* weights that are not there */
    uv_loop_init(&other);
    snprintf(extra, sizeof extra,
             "[expert]\nmode = host\nweights = %s/no-such.safetensors\n"
             "partition = %s/partition.safetensors\n",
             root, TS_DEMO_DIR);
    prepare(&bad, "noweights", NULL, extra);
    rc = ts_node_start(&bad.node, &other, &bad.cfg, &bad.id, &netkey, bad.store, "test", err,
                       sizeof err);
    assert_int_not_equal(rc, TS_OK);
    assert_null(bad.node);
    TU_CHECK_CONTAINS(err, "no-such.safetensors");
    release(&bad);
    assert_int_equal(uv_loop_close(&other), 0);

    /* the holder was not disturbed */
    assert_true(members_in(&n[0], TESSERA__MEMBER_STATUS__MEMBER_ALIVE) == 1);
    stop(&n[0]);
    finish(&loop, n, 1);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_join_health_leave), cmocka_unit_test(test_host),
    cmocka_unit_test(test_relay_via),         cmocka_unit_test(test_auto),
    cmocka_unit_test(test_bad_starts),
};

int main(void) { return cmocka_run_group_tests(tests, setup, teardown); }
