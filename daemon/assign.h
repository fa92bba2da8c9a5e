/*
 * assign.h — which cluster an `[expert] mode = auto` node should serve: a pure function of what
 * the node sees in the adverts, so that it is tested without a network (tests/test_assign.c) and
 * so that every auto node, seeing the same adverts, reaches a compatible answer without talking.
 *
 * The view lists, for one partition of K clusters, the live experts (their cluster, node id and
 * recent requests per second). For cluster k, replicas[k] counts them and demand[k] sums their
 * request rates. A cluster's need is its demand per replica once one more joins:
 *     need(k) = demand[k] / (replicas[k] + 1),  and +∞ when replicas[k] = 0 (uncovered).
 *
 * A node serving nothing takes the cluster of greatest need. Ties (every auto node of a new
 * network sees the same zeros) are broken by a hash of (node id, cluster), different for each
 * node, so that nodes starting together spread over the clusters instead of all taking cluster 0.
 *
 * Nodes already serving move by a plan every node computes alike from the same view: targets in
 * order of need (uncovered clusters first, equal needs by cluster index), each taking at most one
 * mover per round, namely the eligible node with the highest hash(id, target). A node serving a
 * is eligible for b when a keeps a replica (replicas[a] ≥ 2) and b is uncovered or
 * need(b) > gain · demand[a] / replicas[a] (default gain 2: the hysteresis that keeps nodes from
 * flapping). A node the plan picks moves only if it has served a for long enough (`dwell_ok`,
 * the caller's minimum dwell); otherwise it stays this round and no one else is sent. So when a
 * host dies, one replica of a well-served cluster takes its cluster over, not all of them, and
 * collisions left by the tie-break are resolved in the next round.
 */
#ifndef TS_DAEMON_ASSIGN_H
#define TS_DAEMON_ASSIGN_H

#include <stddef.h>
#include <stdint.h>

#define TS_ASSIGN_ID_BYTES 32
#define TS_ASSIGN_MAX_CLUSTERS 4096

typedef struct ts_assign_expert {
    int cluster;                         /* 0..K−1 */
    uint8_t node_id[TS_ASSIGN_ID_BYTES]; /* who serves it */
    double requests_per_s;               /* from its advert's load; ≥ 0 */
} ts_assign_expert_t;

typedef struct ts_assign_view {
    int K;                             /* clusters of the partition, 1..TS_ASSIGN_MAX_CLUSTERS */
    const ts_assign_expert_t *experts; /* the live experts of the partition, this node's included */
    size_t n;
    double gain;  /* the need ratio that justifies a move (≤ 1: the default 2) */
    int dwell_ok; /* this node has served its cluster long enough to move */
} ts_assign_view_t;

typedef struct ts_assign_result {
    int cluster;     /* the cluster to serve from now on (= current when staying) */
    int move;        /* 1 when cluster differs from current (or current was −1) */
    double need;     /* need(cluster) as above (+∞ for an uncovered one) */
    const char *why; /* a short sentence for the log: "uncovered", "more demand", "stay" ... */
} ts_assign_result_t;

/* The decision for node self, which serves current (−1: nothing yet; an expert of self with
 * another cluster in the view is ignored). TS_EINVAL for a bad view (K out of range, a cluster
 * out of range, a negative or non-finite rate). */
int ts_assign_choose(const ts_assign_view_t *v, const uint8_t self[TS_ASSIGN_ID_BYTES], int current,
                     ts_assign_result_t *out);

/* The tie-break hash of (node id, cluster): the first 8 bytes of BLAKE2b(id ‖ cluster LE32). */
uint64_t ts_assign_rank(const uint8_t id[TS_ASSIGN_ID_BYTES], int cluster);

#endif
