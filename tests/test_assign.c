/*
 * test_assign.c — daemon/assign.h, the cluster an `[expert] mode = auto` node serves: new nodes
 * take uncovered clusters; nodes that start together spread out and, round by round, cover every
 * cluster and then stay put; spare replicas go to the clusters with the most demand per replica;
 * when a host dies exactly one replica of a well-served cluster takes its cluster over; the
 * hysteresis holds a node where a small gain would not pay; bad views are refused.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "daemon/assign.h"

#define MAXN 64

/* A simulated network: node i serves cluster[i] (−1: nothing) with rate[i] requests per second. */
typedef struct {
    int n, K;
    uint8_t id[MAXN][TS_ASSIGN_ID_BYTES];
    int cluster[MAXN];
    double rate[MAXN];
    int alive[MAXN];
} sim_t;

static void sim_init(sim_t *s, int n, int K, uint8_t seed) {
    memset(s, 0, sizeof *s);
    s->n = n, s->K = K;
    for (int i = 0; i < n; i++) {
        for (int b = 0; b < TS_ASSIGN_ID_BYTES; b++)
            s->id[i][b] = (uint8_t)(seed * 131 + i * 37 + b * 11 + (i * b) % 7);
        s->cluster[i] = -1;
        s->alive[i] = 1;
    }
}

/* The view every node sees: the live nodes that serve something. */
static size_t sim_view(const sim_t *s, ts_assign_expert_t *e) {
    size_t m = 0;
    for (int i = 0; i < s->n; i++)
        if (s->alive[i] && s->cluster[i] >= 0) {
            e[m].cluster = s->cluster[i];
            memcpy(e[m].node_id, s->id[i], TS_ASSIGN_ID_BYTES);
            e[m].requests_per_s = s->rate[i];
            m++;
        }
    return m;
}

/* One round: every live node decides on the same view, then all moves happen at once. Returns
 * the number of nodes that moved. */
static int sim_round(sim_t *s) {
    ts_assign_expert_t e[MAXN];
    size_t m = sim_view(s, e);
    ts_assign_view_t v = {.K = s->K, .experts = e, .n = m, .gain = 2.0, .dwell_ok = 1};
    int next[MAXN], moved = 0;
    for (int i = 0; i < s->n; i++) {
        next[i] = s->cluster[i];
        if (!s->alive[i])
            continue;
        ts_assign_result_t r;
        assert_int_equal(ts_assign_choose(&v, s->id[i], s->cluster[i], &r), TS_OK);
        assert_true(r.cluster >= 0 && r.cluster < s->K);
        assert_int_equal(r.move, r.cluster != s->cluster[i]);
        next[i] = r.cluster;
        moved += r.move;
    }
    memcpy(s->cluster, next, sizeof next);
    return moved;
}

static int replicas(const sim_t *s, int k) {
    int c = 0;
    for (int i = 0; i < s->n; i++)
        c += s->alive[i] && s->cluster[i] == k;
    return c;
}

static int covered(const sim_t *s) {
    for (int k = 0; k < s->K; k++)
        if (replicas(s, k) == 0)
            return 0;
    return 1;
}

static void test_new_node_takes_the_uncovered_cluster(void **state) {
    (void)state;
    sim_t s;
    sim_init(&s, 4, 4, 1);
    s.cluster[0] = 0, s.cluster[1] = 1, s.cluster[2] = 2; /* node 3 is new */
    ts_assign_expert_t e[MAXN];
    ts_assign_view_t v = {.K = 4, .experts = e, .n = sim_view(&s, e)};
    ts_assign_result_t r;
    assert_int_equal(ts_assign_choose(&v, s.id[3], -1, &r), TS_OK);
    assert_int_equal(r.cluster, 3);
    assert_int_equal(r.move, 1);
    assert_true(isinf(r.need));
    assert_string_equal(r.why, "uncovered");
}

/* Six auto nodes start together on a 4-cluster partition: over a few rounds every cluster gets
 * a replica, then nobody moves again (for many seeds). */
static void test_nodes_starting_together_cover_every_cluster(void **state) {
    (void)state;
    for (uint8_t seed = 0; seed < 40; seed++) {
        sim_t s;
        sim_init(&s, 6, 4, seed);
        int rounds = 0;
        while (sim_round(&s) > 0 && rounds < 20)
            rounds++;
        if (!covered(&s))
            fail_msg("seed %d: a cluster is uncovered after %d rounds", seed, rounds);
        if (rounds > 6)
            fail_msg("seed %d: %d rounds to settle", seed, rounds);
        for (int i = 0; i < 5; i++)
            assert_int_equal(sim_round(&s), 0); /* stable */
    }
}

/* The first round already spreads nodes that start together (the tie-break), rather than all
 * taking cluster 0. */
static void test_tie_break_spreads(void **state) {
    (void)state;
    int distinct_total = 0;
    for (uint8_t seed = 0; seed < 40; seed++) {
        sim_t s;
        sim_init(&s, 6, 4, seed);
        sim_round(&s);
        int distinct = 0;
        for (int k = 0; k < 4; k++)
            distinct += replicas(&s, k) > 0;
        distinct_total += distinct;
    }
    /* 6 nodes on 4 clusters at random cover 3.3 on average; all on one would be 1 */
    assert_true(distinct_total >= 40 * 3 - 10);
}

/* Spare replicas go where the demand per replica is highest. */
static void test_spares_follow_demand(void **state) {
    (void)state;
    sim_t s;
    sim_init(&s, 6, 4, 7);
    for (int k = 0; k < 4; k++)
        s.cluster[k] = k;
    s.rate[0] = 10, s.rate[1] = 8, s.rate[2] = 1, s.rate[3] = 1;
    ts_assign_expert_t e[MAXN];
    ts_assign_view_t v = {.K = 4, .experts = e, .n = sim_view(&s, e), .gain = 2, .dwell_ok = 1};
    ts_assign_result_t r;
    assert_int_equal(ts_assign_choose(&v, s.id[4], -1, &r), TS_OK);
    assert_int_equal(r.cluster, 0); /* need 10/2 = 5 against 8/2 = 4 */
    assert_string_equal(r.why, "the most demand per replica");
    s.cluster[4] = 0;
    v.n = sim_view(&s, e);
    assert_int_equal(ts_assign_choose(&v, s.id[5], -1, &r), TS_OK);
    assert_int_equal(r.cluster, 1); /* now 10/3 = 3.3 against 8/2 = 4 */
    s.cluster[5] = 1;
    for (int i = 0; i < 3; i++) /* and nobody flaps afterwards */
        assert_int_equal(sim_round(&s), 0);
}

/* A host dies: exactly one replica of a cluster that keeps one takes its cluster over. */
static void test_one_node_takes_over_a_dead_hosts_cluster(void **state) {
    (void)state;
    for (uint8_t seed = 0; seed < 20; seed++) {
        sim_t s;
        sim_init(&s, 6, 4, seed);
        int start[6] = {0, 0, 1, 1, 2, 3};
        memcpy(s.cluster, start, sizeof start);
        assert_int_equal(sim_round(&s), 0);
        s.alive[5] = 0; /* cluster 3's only host */
        assert_int_equal(sim_round(&s), 1);
        assert_int_equal(replicas(&s, 3), 1);
        assert_true(covered(&s));
        for (int k = 0; k < 2; k++)
            assert_true(replicas(&s, k) >= 1);
        assert_int_equal(sim_round(&s), 0);
    }
}

/* The hysteresis: a move needs twice the demand per replica, the donor keeps a replica, and a
 * node that has not dwelt long enough stays (and nobody goes in its place this round). */
static void test_hysteresis_and_dwell(void **state) {
    (void)state;
    sim_t s;
    sim_init(&s, 5, 2, 3);
    int start[5] = {0, 0, 0, 1, 1};
    memcpy(s.cluster, start, sizeof start);
    s.rate[0] = s.rate[1] = s.rate[2] = 1; /* cluster 0: 3 per 3 replicas = 1 */
    s.rate[3] = s.rate[4] = 2.5;           /* cluster 1: need 5 / 3 = 1.67 < 2 · 1 */
    assert_int_equal(sim_round(&s), 0);
    s.rate[3] = s.rate[4] = 3.5; /* need 7 / 3 = 2.33 > 2 */
    ts_assign_expert_t e[MAXN];
    ts_assign_view_t v = {.K = 2, .experts = e, .n = sim_view(&s, e), .gain = 2, .dwell_ok = 0};
    int would = 0;
    for (int i = 0; i < 3; i++) {
        ts_assign_result_t r;
        assert_int_equal(ts_assign_choose(&v, s.id[i], 0, &r), TS_OK);
        assert_int_equal(r.move, 0); /* not dwelt long enough */
        v.dwell_ok = 1;
        assert_int_equal(ts_assign_choose(&v, s.id[i], 0, &r), TS_OK);
        would += r.move;
        v.dwell_ok = 0;
    }
    assert_int_equal(would, 1); /* exactly one mover */
    /* a single replica never leaves, however needy the other cluster */
    sim_t t;
    sim_init(&t, 2, 2, 4);
    t.cluster[0] = 0, t.cluster[1] = 1, t.rate[1] = 1000;
    assert_int_equal(sim_round(&t), 0);
}

static void test_bad_views(void **state) {
    (void)state;
    uint8_t self[TS_ASSIGN_ID_BYTES] = {1};
    ts_assign_expert_t e = {.cluster = 0, .requests_per_s = 1};
    ts_assign_result_t r;
    ts_assign_view_t v = {.K = 2, .experts = &e, .n = 1};
    assert_int_equal(ts_assign_choose(&v, self, 2, &r), TS_EINVAL); /* current out of range */
    assert_int_equal(ts_assign_choose(&v, self, -2, &r), TS_EINVAL);
    assert_int_equal(ts_assign_choose(NULL, self, 0, &r), TS_EINVAL);
    assert_int_equal(ts_assign_choose(&v, NULL, 0, &r), TS_EINVAL);
    assert_int_equal(ts_assign_choose(&v, self, 0, NULL), TS_EINVAL);
    e.cluster = 2;
    assert_int_equal(ts_assign_choose(&v, self, 0, &r), TS_EINVAL);
    e.cluster = 0, e.requests_per_s = NAN;
    assert_int_equal(ts_assign_choose(&v, self, 0, &r), TS_EINVAL);
    e.requests_per_s = -1;
    assert_int_equal(ts_assign_choose(&v, self, 0, &r), TS_EINVAL);
    e.requests_per_s = 0;
    v.K = 0;
    assert_int_equal(ts_assign_choose(&v, self, -1, &r), TS_EINVAL);
    v.K = 1; /* one cluster: always it */
    assert_int_equal(ts_assign_choose(&v, self, -1, &r), TS_OK);
    assert_int_equal(r.cluster, 0);
    assert_int_equal(ts_assign_choose(&v, self, 0, &r), TS_OK);
    assert_int_equal(r.move, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_node_takes_the_uncovered_cluster),
        cmocka_unit_test(test_nodes_starting_together_cover_every_cluster),
        cmocka_unit_test(test_tie_break_spreads),
        cmocka_unit_test(test_spares_follow_demand),
        cmocka_unit_test(test_one_node_takes_over_a_dead_hosts_cluster),
        cmocka_unit_test(test_hysteresis_and_dwell),
        cmocka_unit_test(test_bad_views),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
