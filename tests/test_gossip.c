/*
 * test_gossip.c — the gossip layer (net/gossip.h) with real sockets: nine ts_gossip instances,
 * each with its own identity, ts_net and ts_rpc, on one uv loop over UDP and TCP on 127.0.0.1,
 * with fast timings (a probe every 100 ms). The tests run in order on one network:
 *
 *   - 8 nodes join through one bootstrap node and all see all 8 ALIVE;
 *   - an advert set on a node reaches every node with a valid signature and the hash its claim
 *     announced; a new version replaces it everywhere;
 *   - status aggregates: experts per cluster, uncovered clusters, capacity, request rate, live
 *     members, in process and over RPC;
 *   - a node closed without leaving is DEAD everywhere; restarted (same identity, fresh core),
 *     it is ALIVE again everywhere at a higher incarnation;
 *   - a graceful leave is LEFT everywhere;
 *   - a node with another network key never appears in anyone's view;
 *   - a forged alive claim (wrong signer, right network key, from a raw socket) is refused and
 *     counted; garbage, truncated, wrongly keyed, replayed and undecodable datagrams are dropped
 *     and counted, and change nothing;
 *   - a node restarted with its store and no bootstrap rejoins through its address book;
 *   - bans: a banned node's advert leaves the status answer and its aggregates, the ban is
 *     listed, an advert request for it is refused; expelled, it also leaves the members, and its
 *     datagrams are dropped and counted.
 *
 * Waits poll the loop until a condition holds, with a generous deadline (the machine is shared
 * and the suite also runs under ASan); nothing asserts an upper bound on time.
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/testutil.h"

#include "tests/gossip_forge.h"
#include "tests/uvutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/error.h"
#include "net/frame.h"
#include "net/gossip.h"
#include "net/swim_wire.h"
#include "store/peers.h"
#include "store/store.h"

#define N 8        /* the network */
#define INTRUDER N /* nodes[N]: another network key */
#define WAIT_MS 40000
#define K_CLUSTERS 4

typedef struct node {
    ts_identity_t id;
    ts_net_t *net;
    ts_rpc_t *rpc;
    ts_listener_t *lis;
    ts_gossip_t *g;
    ts_store_t *store;
    char addr[64];
    int up;
} node_t;

static uv_loop_t loop;
static ts_netkey_t nk, other_nk;
static node_t nodes[N + 1];
static char store_dir[512];
static uint8_t partition[32];

/* ---- the loop ------------------------------------------------------------------------------- */

static int guard_fired;
static void guard_cb(uv_timer_t *t) {
    (void)t;
    guard_fired = 1;
}

/* Runs the loop until pred(arg) holds, checked after every turn of the loop (the nodes' timers
 * turn it several times a second); fails after WAIT_MS (tests/uvutil.h). */
static void wait_until(int (*pred)(void *), void *arg, const char *what) {
    tu_run_until(&loop, pred, arg, WAIT_MS, what);
}

/* The same on *flag becoming non-zero. */
static void wait_flag(const int *flag, const char *what) {
    tu_run_until_flag(&loop, flag, WAIT_MS, what);
}

/* Runs the loop for ms milliseconds. */
static void run_for(uint64_t ms) {
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    uv_timer_start(&t, guard_cb, ms, 0);
    guard_fired = 0;
    while (!guard_fired)
        uv_run(&loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
}

/* ---- nodes ---------------------------------------------------------------------------------- */

static void fast_config(ts_gossip_config_t *c) {
    ts_gossip_config_default(c);
    c->swim.probe_interval_ms = 100;
    c->swim.probe_timeout_ms = 60;
    c->swim.gossip_interval_ms = 50;
    c->swim.suspicion_min_ms = 400;
    c->swim.suspicion_max_mult = 3;
    c->swim.push_pull_interval_ms = 2000;
    c->swim.join_retry_ms = 500;
    c->swim.leave_linger_ms = 1000;
    c->swim.max_members = 64;
    c->pushpull_timeout_ms = 3000;
    c->advert_timeout_ms = 3000;
}

static void on_load(void *arg, Tessera__Load *load) {
    (void)arg;
    load->has_requests_per_s = 1;
    load->requests_per_s = 2.5f;
    load->has_queue_depth = 1;
    load->queue_depth = 3;
}

/* Starts node i on a fresh port with key k, joining through bootstrap (NULL: none). */
static void node_start(int i, const ts_netkey_t *k, const char *bootstrap) {
    node_t *n = &nodes[i];
    char err[256] = "";
    TU_CHECK_OK(ts_net_new(&n->net, &loop, &n->id, k, NULL));
    TU_CHECK_OK(ts_rpc_new(&n->rpc, n->net, NULL));
    TU_CHECK_RC_MSG(ts_rpc_listen(n->rpc, "127.0.0.1:0", &n->lis, err, sizeof err), TS_OK, err);
    snprintf(n->addr, sizeof n->addr, "127.0.0.1:%d", ts_listener_port(n->lis));
    ts_gossip_config_t c;
    fast_config(&c);
    c.listen = n->addr;
    c.bootstrap = &bootstrap;
    c.n_bootstrap = bootstrap ? 1 : 0;
    c.store = n->store;
    TU_CHECK_RC_MSG(ts_gossip_new(&loop, n->rpc, &n->id, k, &c, &n->g, err, sizeof err), TS_OK,
                    err);
    ts_gossip_on_load(n->g, on_load, NULL);
    TU_CHECK_RC_MSG(ts_gossip_start(n->g, err, sizeof err), TS_OK, err);
    assert_int_equal(ts_gossip_port(n->g), ts_listener_port(n->lis));
    n->up = 1;
}

static void on_closed(ts_gossip_t *g, void *arg) {
    (void)g;
    *(int *)arg = 1;
}

static int rpc_gone(void *arg) {
    node_t *n = arg;
    if (n->rpc && ts_rpc_free(n->rpc) == TS_OK)
        n->rpc = NULL;
    if (!n->rpc && n->net && ts_net_free(n->net) == TS_OK)
        n->net = NULL;
    return !n->rpc && !n->net;
}

/* Closes node i without a leave: its peers hear nothing more from it. */
static void node_stop(int i) {
    node_t *n = &nodes[i];
    int closed = 0;
    ts_gossip_close(n->g, on_closed, &closed);
    wait_flag(&closed, "the gossip layer closed");
    ts_gossip_free(n->g);
    n->g = NULL;
    ts_rpc_shutdown(n->rpc);
    wait_until(rpc_gone, n, "the rpc endpoint and its connections closed");
    n->up = 0;
}

static const ts_swim_t *core(int i) { return ts_gossip_swim(nodes[i].g); }

/* The state node `at` holds for node `of`, 0 when unknown. */
static int state_of(int at, int of, uint32_t *incarnation) {
    ts_swim_member_info_t m;
    if (ts_swim_member_get(core(at), nodes[of].id.id.b, &m) != TS_OK)
        return 0;
    if (incarnation)
        *incarnation = m.incarnation;
    return m.state;
}

/* ---- conditions ----------------------------------------------------------------------------- */

typedef struct {
    int of, state;
    uint32_t above; /* the incarnation must exceed this (ALIVE after a restart) */
} seen_t;

/* Every live node other than `of` holds `of` in `state`. */
static int all_see(void *arg) {
    const seen_t *s = arg;
    for (int i = 0; i < N; i++) {
        if (!nodes[i].up || i == s->of)
            continue;
        uint32_t inc = 0;
        if (state_of(i, s->of, &inc) != s->state || (s->above && inc <= s->above))
            return 0;
    }
    return 1;
}

/* Every live node sees every live node ALIVE, and nobody else alive. */
static int converged(void *arg) {
    (void)arg;
    uint32_t live = 0;
    for (int i = 0; i < N; i++)
        live += (uint32_t)nodes[i].up;
    for (int i = 0; i < N; i++) {
        if (!nodes[i].up)
            continue;
        if (ts_swim_count(core(i), TS_SWIM_ALIVE) != live)
            return 0;
        for (int j = 0; j < N; j++)
            if (nodes[j].up && state_of(i, j, NULL) != TS_SWIM_ALIVE)
                return 0;
    }
    return 1;
}

/* ---- adverts -------------------------------------------------------------------------------- */

typedef struct {
    Tessera__AdvertBody body;
    Tessera__ModelConfig model;
    Tessera__Tensor centroid;
    Tessera__Capacity capacity;
    Tessera__Load load;
    float centroid_data[8];
    int64_t shape[1];
    uint8_t weights[32];
} advert_sample_t;

static void advert_sample(advert_sample_t *a, uint32_t cluster, float items_per_s) {
    memset(a, 0, sizeof *a);
    tessera__advert_body__init(&a->body);
    tessera__model_config__init(&a->model);
    tessera__tensor__init(&a->centroid);
    tessera__capacity__init(&a->capacity);
    tessera__load__init(&a->load);
    a->model.has_input_size = a->model.has_patch_size = a->model.has_in_channels = 1;
    a->model.has_hidden_size = a->model.has_depth = a->model.has_num_heads = 1;
    a->model.has_num_classes = 1;
    a->model.input_size = 28, a->model.patch_size = 4, a->model.in_channels = 1;
    a->model.hidden_size = 64, a->model.depth = 2, a->model.num_heads = 4;
    a->model.num_classes = 10;
    for (int i = 0; i < 8; i++)
        a->centroid_data[i] = (float)cluster + 0.125f * (float)i;
    a->shape[0] = 8;
    a->centroid.has_dtype = 1;
    a->centroid.dtype = TESSERA__DTYPE__DTYPE_F32;
    a->centroid.n_shape = 1;
    a->centroid.shape = a->shape;
    a->centroid.has_data = 1;
    a->centroid.data.data = (uint8_t *)a->centroid_data;
    a->centroid.data.len = sizeof a->centroid_data;
    a->capacity.has_items_per_s = a->capacity.has_max_batch = 1;
    a->capacity.items_per_s = items_per_s;
    a->capacity.max_batch = 32;
    a->load.has_requests_per_s = 1;
    a->load.requests_per_s = 1.0f;
    memset(a->weights, (int)(0x40 + cluster), sizeof a->weights);
    a->body.has_partition_id = a->body.has_num_clusters = a->body.has_cluster = 1;
    a->body.partition_id.data = partition;
    a->body.partition_id.len = 32;
    a->body.num_clusters = K_CLUSTERS;
    a->body.cluster = cluster;
    a->body.has_weights_hash = 1;
    a->body.weights_hash.data = a->weights;
    a->body.weights_hash.len = 32;
    a->body.model = &a->model;
    a->body.has_objective = 1;
    a->body.objective = TESSERA__OBJECTIVE__OBJECTIVE_VELOCITY;
    a->body.centroid = &a->centroid;
    a->body.capacity = &a->capacity;
    a->body.load = &a->load;
}

static void set_advert(int i, uint32_t cluster, float items_per_s) {
    advert_sample_t a;
    advert_sample(&a, cluster, items_per_s);
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_gossip_set_advert(nodes[i].g, &a.body, err, sizeof err), TS_OK, err);
}

typedef struct {
    int of;
    uint64_t version;
} advert_want_t;

/* The advert node `at` holds for `of` at version v, checked as a client would: the signature
 * by `of` over context ‖ 0 ‖ id ‖ body, and the hash `at`'s view of `of`'s claim announces.
 * Returns the version held (0: none). */
static uint64_t advert_held(int at, int of) {
    const uint8_t *packed;
    size_t len;
    if (ts_gossip_advert_get(nodes[at].g, nodes[of].id.id.b, &packed, &len) != TS_OK)
        return 0;
    Tessera__Advert *a = tessera__advert__unpack(NULL, len, packed);
    assert_non_null(a);
    assert_memory_equal(a->node_id.data, nodes[of].id.id.b, 32);
    size_t ctx = sizeof TS_FRAME_CONTEXT_ADVERT;
    uint8_t *msg = malloc(ctx + 32 + a->body.len);
    assert_non_null(msg);
    memcpy(msg, TS_FRAME_CONTEXT_ADVERT, ctx);
    memcpy(msg + ctx, nodes[of].id.id.b, 32);
    memcpy(msg + ctx + 32, a->body.data, a->body.len);
    assert_int_equal(crypto_sign_verify_detached(a->signature.data, msg, ctx + 32 + a->body.len,
                                                 nodes[of].id.id.b),
                     0);
    free(msg);
    uint8_t hash[32];
    crypto_generichash(hash, 32, a->body.data, a->body.len, NULL, 0);
    Tessera__AdvertBody *b;
    TU_CHECK_OK(ts_frame_decode_advert_body(&a->body, TS_FRAME_CHECK_FINITE, &b, NULL, 0));
    uint64_t v = b->version;
    ts_frame_free(b);
    ts_swim_member_info_t m;
    if (at != of) { /* the hash is the one of the claim that announced this version */
        TU_CHECK_OK(ts_swim_member_get(core(at), nodes[of].id.id.b, &m));
        if (m.claim.advert_version == v)
            assert_memory_equal(hash, m.claim.advert_hash, 32);
    }
    tessera__advert__free_unpacked(a, NULL);
    return v;
}

static int all_hold_advert(void *arg) {
    const advert_want_t *w = arg;
    for (int i = 0; i < N; i++)
        if (nodes[i].up && advert_held(i, w->of) != w->version)
            return 0;
    return 1;
}

/* ---- hostile datagrams (tests/gossip_forge.h: sealed by hand from docs/protocol.md) ---------- */

static int raw_sock = -1;

static void send_raw(int to, const uint8_t *buf, size_t len) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)ts_gossip_port(nodes[to].g));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(sendto(raw_sock, buf, len, 0, (struct sockaddr *)&sa, sizeof sa),
                     (ssize_t)len);
}

/* ---- fixture -------------------------------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    if (sodium_init() < 0)
        return -1;
    uv_loop_init(&loop);
    ts_netkey_generate(&nk);
    ts_netkey_generate(&other_nk);
    memset(partition, 0x5a, sizeof partition);
    for (int i = 0; i <= N; i++)
        ts_identity_generate(&nodes[i].id);
    if (tu_make_temp_dir(store_dir, sizeof store_dir, "test_gossip") != 0)
        return -1;
    ts_store_opts_t so = {store_dir, 0, 0, 0};
    char err[256];
    if (ts_store_open(&nodes[1].store, &so, err, sizeof err) != TS_OK)
        return -1;
    raw_sock = socket(AF_INET, SOCK_DGRAM, 0);
    return raw_sock < 0 ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i <= N; i++)
        if (nodes[i].up)
            node_stop(i);
    uv_run(&loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&loop);
    ts_store_close(nodes[1].store);
    tu_remove_temp_dir(store_dir);
    for (int i = 0; i <= N; i++)
        ts_identity_wipe(&nodes[i].id);
    ts_netkey_wipe(&nk);
    ts_netkey_wipe(&other_nk);
    close(raw_sock);
    return rc == 0 ? 0 : -1;
}

/* ---- the tests ------------------------------------------------------------------------------ */

static void test_join(void **state) {
    (void)state;
    node_start(0, &nk, NULL);
    for (int i = 1; i < N; i++)
        node_start(i, &nk, nodes[0].addr);
    wait_until(converged, NULL, "8 nodes all ALIVE in every view");
    run_for(500); /* a few probe rounds: every node has sent and heard datagrams */
    for (int i = 0; i < N; i++) {
        assert_int_equal(ts_swim_member_count(core(i)), N);
        TU_CHECK_OK(ts_swim_validate(core(i)));
        ts_gossip_stats_t st;
        ts_gossip_get_stats(nodes[i].g, &st);
        assert_true(st.udp_in > 0 && st.udp_out > 0);
        assert_int_equal(st.udp_unsealed_failed + st.udp_replayed + st.udp_malformed, 0);
    }
}

/* Anti-entropy between members goes by digests (joins alone by full states): every node starts
 * digest exchanges and serves them, none fails, and the views stay converged. */
static void test_push_pull_digests(void **state) {
    (void)state;
    ts_gossip_stats_t before[N];
    for (int i = 0; i < N; i++)
        ts_gossip_get_stats(nodes[i].g, &before[i]);
    run_for(6000); /* three push-pull intervals */
    wait_until(converged, NULL, "all ALIVE after the digest exchanges");
    uint64_t digests = 0, served = 0, failed = 0, ok = 0;
    for (int i = 0; i < N; i++) {
        ts_gossip_stats_t st;
        ts_gossip_get_stats(nodes[i].g, &st);
        digests += st.pushpull_digests - before[i].pushpull_digests;
        served += st.pushpull_served - before[i].pushpull_served;
        ok += st.pushpull_ok - before[i].pushpull_ok;
        failed += st.pushpull_failed - before[i].pushpull_failed;
    }
    print_message("  %llu digest exchanges started, %llu answered, %llu served, %llu failed\n",
                  (unsigned long long)digests, (unsigned long long)ok, (unsigned long long)served,
                  (unsigned long long)failed);
    assert_true(digests >= N);
    assert_true(ok >= digests / 2 && served >= ok);
    assert_int_equal(failed, 0);
}

static void test_adverts(void **state) {
    (void)state;
    set_advert(2, 1, 100.0f);
    set_advert(5, 1, 50.0f);
    set_advert(6, 3, 25.0f);
    advert_want_t w2 = {2, 1}, w5 = {5, 1}, w6 = {6, 1};
    wait_until(all_hold_advert, &w2, "node 2's advert everywhere");
    wait_until(all_hold_advert, &w5, "node 5's advert everywhere");
    wait_until(all_hold_advert, &w6, "node 6's advert everywhere");
    /* a new version replaces the old one everywhere */
    set_advert(2, 1, 200.0f);
    w2.version = 2;
    wait_until(all_hold_advert, &w2, "node 2's second advert everywhere");
    ts_gossip_stats_t st;
    ts_gossip_get_stats(nodes[2].g, &st);
    assert_true(st.adverts_served >= N - 1);
    ts_gossip_get_stats(nodes[0].g, &st);
    assert_int_equal(st.adverts_rejected, 0);
}

static void check_aggregates(const Tessera__StatusResponse *r, uint32_t live) {
    assert_non_null(r->aggregates);
    const Tessera__Aggregates *a = r->aggregates;
    assert_int_equal(a->live_members, live);
    assert_int_equal(a->n_clusters, 2);
    for (size_t i = 0; i < a->n_clusters; i++) {
        assert_memory_equal(a->clusters[i]->partition_id.data, partition, 32);
        if (a->clusters[i]->cluster == 1)
            assert_int_equal(a->clusters[i]->live_experts, 2); /* nodes 2 and 5 */
        else
            assert_int_equal(a->clusters[i]->cluster, 3); /* node 6 */
    }
    assert_int_equal(a->n_uncovered, 2);
    assert_int_equal(a->uncovered[0]->cluster + a->uncovered[1]->cluster, 0 + 2);
    assert_true(a->uncovered[0]->cluster == 0 || a->uncovered[0]->cluster == 2);
    tu_check_scalar(a->total_capacity, 200.0 + 50.0 + 25.0, 1e-3, "total capacity");
    tu_check_scalar(a->request_rate, 3.0, 1e-3, "request rate (1 per advert)");
}

typedef struct {
    int done, status;
    Tessera__StatusResponse *resp;
} status_got_t;

static void on_status(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    status_got_t *s = arg;
    s->status = res->status;
    if (res->status == TS_OK) { /* a copy that outlives the callback */
        size_t n = protobuf_c_message_get_packed_size(&res->reply->status_response->base);
        uint8_t *b = malloc(n);
        protobuf_c_message_pack(&res->reply->status_response->base, b);
        s->resp = tessera__status_response__unpack(NULL, n, b);
        free(b);
    }
    s->done = 1;
}

static void test_status(void **state) {
    (void)state;
    Tessera__StatusResponse *r;
    TU_CHECK_OK(ts_gossip_status(nodes[7].g, NULL, &r));
    assert_memory_equal(r->node_id.data, nodes[7].id.id.b, 32);
    assert_int_equal(r->n_members, N);
    assert_int_equal(r->n_adverts, 3);
    for (size_t i = 0; i < r->n_members; i++) {
        assert_int_equal(r->members[i]->status, TESSERA__MEMBER_STATUS__MEMBER_ALIVE);
        assert_non_null(r->members[i]->addr);
        assert_true(r->members[i]->has_last_change_age_ms);
    }
    assert_non_null(r->load);
    tu_check_scalar(r->load->requests_per_s, 2.5, 1e-6, "load from the callback");
    check_aggregates(r, N);
    ts_gossip_status_free(r);

    /* the same over RPC, from node 0, without members or adverts */
    ts_rpc_peer_t *p;
    TU_CHECK_OK(ts_rpc_peer_get(nodes[0].rpc, nodes[7].addr, &p, NULL, 0));
    Tessera__StatusRequest sr = TESSERA__STATUS_REQUEST__INIT;
    sr.has_include_members = sr.has_include_adverts = 1;
    sr.include_members = sr.include_adverts = 0;
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = &sr;
    status_got_t got = {0};
    TU_CHECK_OK(ts_rpc_call(p, &env, 10000, on_status, &got, NULL, NULL, 0));
    wait_flag(&got.done, "a status answer over RPC");
    TU_CHECK_OK(got.status);
    assert_int_equal(got.resp->n_members, 0);
    assert_int_equal(got.resp->n_adverts, 0);
    check_aggregates(got.resp, N);
    tessera__status_response__free_unpacked(got.resp, NULL);
}

static uint32_t dead_incarnation;

static void test_dead_and_restart(void **state) {
    (void)state;
    node_stop(3);
    seen_t dead = {3, TS_SWIM_DEAD, 0};
    wait_until(all_see, &dead, "node 3 DEAD everywhere");
    for (int i = 0; i < N; i++) {
        uint32_t inc = 0;
        if (nodes[i].up && state_of(i, 3, &inc) && inc > dead_incarnation)
            dead_incarnation = inc;
    }
    node_start(3, &nk, nodes[0].addr); /* same identity, fresh core, a new port */
    seen_t again = {3, TS_SWIM_ALIVE, dead_incarnation};
    wait_until(all_see, &again, "node 3 ALIVE again, at a higher incarnation, everywhere");
    assert_true(ts_swim_incarnation(core(3)) > dead_incarnation);
    wait_until(converged, NULL, "everyone ALIVE after the restart");
}

static void on_left(ts_gossip_t *g, void *arg) {
    (void)g;
    *(int *)arg = 1;
}

static void test_leave(void **state) {
    (void)state;
    int left = 0;
    TU_CHECK_OK(ts_gossip_leave(nodes[4].g, on_left, &left));
    wait_flag(&left, "node 4's leave spread");
    seen_t s = {4, TS_SWIM_LEFT, 0};
    wait_until(all_see, &s, "node 4 LEFT everywhere");
    node_stop(4);
}

static int intruder_refused(void *arg) {
    const uint64_t *before = arg;
    ts_gossip_stats_t st;
    ts_gossip_get_stats(nodes[0].g, &st);
    return st.udp_unsealed_failed >= *before + 3;
}

static void test_other_network_key(void **state) {
    (void)state;
    ts_gossip_stats_t st;
    ts_gossip_get_stats(nodes[0].g, &st);
    uint64_t before = st.udp_unsealed_failed;
    node_start(INTRUDER, &other_nk, nodes[0].addr);
    wait_until(intruder_refused, &before, "the intruder's datagrams refused by the bootstrap");
    run_for(1000);
    for (int i = 0; i < N; i++)
        if (nodes[i].up)
            assert_int_equal(state_of(i, INTRUDER, NULL), 0);
    assert_int_equal(ts_swim_member_count(core(INTRUDER)), 1); /* it learnt nobody either */
    node_stop(INTRUDER);
}

typedef struct {
    uint64_t unsealed, replayed, malformed, in, rejected;
} counts_t;

static counts_t counts0(void) {
    ts_gossip_stats_t st;
    ts_swim_stats_t ss;
    ts_gossip_get_stats(nodes[0].g, &st);
    ts_swim_get_stats(core(0), &ss);
    return (counts_t){st.udp_unsealed_failed, st.udp_replayed, st.udp_malformed, st.udp_in,
                      ss.claims_rejected};
}

static counts_t want;
static int counts_reached(void *arg) {
    (void)arg;
    counts_t c = counts0();
    return c.unsealed >= want.unsealed && c.replayed >= want.replayed &&
           c.malformed >= want.malformed && c.rejected >= want.rejected;
}

static void test_hostile_datagrams(void **state) {
    (void)state;
    uint32_t members = ts_swim_member_count(core(0));
    counts_t before = counts0();
    ts_identity_t stranger, wrong;
    ts_identity_generate(&stranger);
    ts_identity_generate(&wrong);
    uint8_t plain[TS_SWIM_PLAIN_MAX], dg[TS_SWIM_PACKET_MAX + 200];
    uint64_t counter = 1000000;

    /* a forged alive claim: the stranger's claim signed by another key, sealed rightly */
    size_t n = ts_forge_alive(&stranger, &wrong, plain);
    assert_true(n > 0);
    send_raw(0, dg, ts_forge_seal(&nk, counter++, plain, n, dg));
    /* replays: the same datagram twice, and a counter far below the window; the datagram is a
     * gossip message from the stranger with no update */
    memset(plain, 0, sizeof plain);
    plain[0] = TS_SWIM_WIRE_VERSION, plain[1] = TS_SWIM_GOSSIP;
    memcpy(plain + 2, stranger.id.b, 32);
    size_t len = ts_forge_seal(&nk, counter + 100, plain, TS_SWIM_WIRE_HEADER + 1, dg);
    send_raw(0, dg, len);
    send_raw(0, dg, len);
    send_raw(0, dg, ts_forge_seal(&nk, counter, plain, TS_SWIM_WIRE_HEADER + 1, dg));
    /* garbage; truncated; another key; too long; another seal version */
    uint8_t junk[300];
    randombytes_buf(junk, sizeof junk);
    send_raw(0, junk, sizeof junk);
    len = ts_forge_seal(&nk, counter + 200, plain, TS_SWIM_WIRE_HEADER + 1, dg);
    send_raw(0, dg, len - 7);
    send_raw(0, dg, ts_forge_seal(&other_nk, counter + 201, plain, TS_SWIM_WIRE_HEADER + 1, dg));
    uint8_t big[TS_SWIM_PACKET_MAX + 100];
    memset(big, 1, sizeof big);
    send_raw(0, big, sizeof big);
    len = ts_forge_seal(&nk, counter + 202, plain, TS_SWIM_WIRE_HEADER + 1, dg);
    dg[0] = 2;
    send_raw(0, dg, len);
    /* sealed rightly, but not a gossip message: a bad type, and a count past the end */
    memcpy(plain + 2, stranger.id.b, 32);
    plain[0] = TS_SWIM_WIRE_VERSION, plain[1] = 99;
    send_raw(0, dg, ts_forge_seal(&nk, counter + 300, plain, 60, dg));
    plain[1] = TS_SWIM_GOSSIP, plain[34] = 5;
    send_raw(0, dg, ts_forge_seal(&nk, counter + 301, plain, 35, dg));

    want = (counts_t){before.unsealed + 5, before.replayed + 2, before.malformed + 2, 0,
                      before.rejected + 1};
    wait_until(counts_reached, NULL, "every hostile datagram counted");
    counts_t after = counts0();
    assert_int_equal(after.unsealed - before.unsealed, 5);
    assert_int_equal(after.replayed - before.replayed, 2);
    assert_int_equal(after.malformed - before.malformed, 2);
    assert_int_equal(after.rejected - before.rejected, 1);
    /* nothing changed: the stranger is nobody's member, and node 0 is intact */
    ts_swim_member_info_t m;
    assert_int_equal(ts_swim_member_get(core(0), stranger.id.b, &m), TS_ENOTFOUND);
    assert_int_equal(ts_swim_member_count(core(0)), members);
    TU_CHECK_OK(ts_swim_validate(core(0)));
    run_for(300);
    wait_until(converged, NULL, "the network unchanged");
    ts_identity_wipe(&stranger);
    ts_identity_wipe(&wrong);
}

static int book_entries(void *ctx, const ts_peer_t *p) {
    (void)p;
    (*(int *)ctx)++;
    return TS_OK;
}

static void test_rejoin_from_book(void **state) {
    (void)state;
    node_stop(1); /* its close flushes the book */
    int entries = 0;
    TU_CHECK_OK(ts_peers_list(nodes[1].store, book_entries, &entries));
    assert_true(entries >= N - 2);
    seen_t dead = {1, TS_SWIM_DEAD, 0};
    wait_until(all_see, &dead, "node 1 DEAD everywhere");
    uint32_t inc = 0;
    state_of(0, 1, &inc);
    node_start(1, &nk, NULL); /* no bootstrap: the book only */
    seen_t s = {1, TS_SWIM_ALIVE, inc};
    wait_until(all_see, &s, "node 1 back through its address book");
    wait_until(converged, NULL, "everyone ALIVE after the rejoin");
    ts_gossip_stats_t st;
    ts_gossip_get_stats(nodes[1].g, &st);
    assert_true(st.pushpull_ok >= 1);
}

static int expelled_heard(void *arg) {
    (void)arg;
    ts_gossip_stats_t st;
    ts_gossip_get_stats(nodes[7].g, &st);
    return st.udp_expelled > 0;
}

static void test_bans(void **state) {
    (void)state;
    Tessera__StatusResponse *before, *r;
    TU_CHECK_OK(ts_gossip_status(nodes[7].g, NULL, &before));
    assert_int_equal(before->n_adverts, 3); /* nodes 2, 5, 6 */
    assert_int_equal(before->n_bans, 0);
    ts_gossip_ban_info_t b;
    memset(&b, 0, sizeof b);
    memcpy(b.id, nodes[5].id.id.b, 32);
    snprintf(b.reason, sizeof b.reason, "a test ban");
    assert_int_equal(ts_gossip_ban(nodes[7].g, &b), 1);
    assert_int_equal(ts_gossip_ban(nodes[7].g, &b), 0); /* already banned: nothing changes */
    assert_non_null(ts_gossip_banned(nodes[7].g, nodes[5].id.id.b));
    assert_null(ts_gossip_banned(nodes[7].g, nodes[2].id.id.b));
    TU_CHECK_OK(ts_gossip_status(nodes[7].g, NULL, &r));
    assert_int_equal(r->n_adverts, 2);
    for (size_t i = 0; i < r->n_adverts; i++)
        assert_memory_not_equal(r->adverts[i]->node_id.data, nodes[5].id.id.b, 32);
    assert_int_equal(r->n_members, before->n_members); /* a member still */
    assert_int_equal(r->n_bans, 1);
    assert_memory_equal(r->bans[0]->node_id.data, nodes[5].id.id.b, 32);
    assert_string_equal(r->bans[0]->reason, "a test ban");
    assert_false(r->bans[0]->expelled);
    tu_check_scalar(r->aggregates->total_capacity, before->aggregates->total_capacity - 50.0, 1e-3,
                    "the banned node's capacity left out");
    ts_gossip_status_free(r);

    /* an advert request for it, over RPC, is refused */
    ts_rpc_peer_t *p;
    TU_CHECK_OK(ts_rpc_peer_get(nodes[0].rpc, nodes[7].addr, &p, NULL, 0));
    Tessera__AdvertRequest ar = TESSERA__ADVERT_REQUEST__INIT;
    ar.has_node_id = 1;
    ar.node_id.data = nodes[5].id.id.b;
    ar.node_id.len = 32;
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_ADVERT_REQUEST;
    env.advert_request = &ar;
    status_got_t got = {0};
    TU_CHECK_OK(ts_rpc_call(p, &env, 10000, on_status, &got, NULL, NULL, 0));
    wait_flag(&got.done, "the advert request's answer");
    assert_int_equal(got.status, TS_EPEER);

    /* expelled: out of the members too, its datagrams dropped */
    memcpy(b.id, nodes[6].id.id.b, 32);
    b.expelled = 1;
    assert_int_equal(ts_gossip_ban(nodes[7].g, &b), 1);
    TU_CHECK_OK(ts_gossip_status(nodes[7].g, NULL, &r));
    assert_int_equal(r->n_members, before->n_members - 1);
    for (size_t i = 0; i < r->n_members; i++)
        assert_memory_not_equal(r->members[i]->node_id.data, nodes[6].id.id.b, 32);
    assert_int_equal(r->n_adverts, 1);
    assert_int_equal(r->n_bans, 2);
    assert_true(r->bans[1]->expelled);
    assert_int_equal(r->aggregates->live_members, before->aggregates->live_members - 1);
    ts_gossip_status_free(r);
    wait_until(expelled_heard, NULL, "a datagram of the expelled node dropped");
    ts_gossip_status_free(before);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join),
        cmocka_unit_test(test_push_pull_digests),
        cmocka_unit_test(test_adverts),
        cmocka_unit_test(test_status),
        cmocka_unit_test(test_dead_and_restart),
        cmocka_unit_test(test_leave),
        cmocka_unit_test(test_other_network_key),
        cmocka_unit_test(test_hostile_datagrams),
        cmocka_unit_test(test_rejoin_from_book),
        cmocka_unit_test(test_bans),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
