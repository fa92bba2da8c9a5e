/*
 * sim_gossip.c — bench_gossip: N virtual nodes running the real gossip core (net/swim.h) in one
 * process, on virtual time, over a modelled network. See docs/benchmarks.md, "Gossip
 * (simulation)".
 *
 * What is real: every node is a ts_swim_t; every datagram is encoded with net/swim_wire.h,
 * carried as bytes, decoded and handed to the receiver, so the byte counts are the protocol's;
 * push-pull exchanges digests, then the members of the buckets that differ (or, with
 * --full-push-pull, full states), counted at their encoded size.
 * What is modelled: the network (independent loss per datagram, lognormal one-way latency),
 * slow nodes (a fraction of nodes that, now and then, stall for a few seconds: no timers, no
 * packets — those queue up to a socket buffer's worth — then catch up, timers first as libuv
 * runs them), crashes (a node stops for good), and signatures (a keyed hash stretched to the
 * 64 bytes of an Ed25519 signature: verifiable and tamper-evident, not secure — Ed25519 would
 * cost 10⁸ verifications at N = 10⁴). Sealing is not simulated; its bytes are added per datagram.
 *
 * The run: every node joins at t = 0 through a virtual seed that answers push-pull with the
 * whole network (so each node starts knowing everyone, as it would after joining an existing
 * network); a warm-up; a quiet window (idle traffic); A advert changes, each by a random normal
 * node, 10 s apart (propagation to 99.9 % and 100 % of live nodes); C crashes of random normal
 * nodes, 5 s apart (time until the first live node declares each dead, and until all have);
 * then a tail until every crash is known everywhere or the longest suspicion timeout has passed.
 * Throughout, any live node declared dead by anyone is a false positive.
 *
 * Memory is O(N²) in the member tables (about 48 bytes per member per node: ~5 GB at N = 10⁴);
 * claims are shared between the cores (ts_swim_claims_t), so signatures are stored once.
 */
#define _POSIX_C_SOURCE 200809L

#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "base/error.h"
#include "net/swim.h"
#include "net/swim_wire.h"

#define SEAL_BYTES 48     /* XChaCha20-Poly1305 nonce 24 + tag 16 + counter 8, per datagram */
#define SOCKET_BUFFER 160 /* datagrams a stalled node can hold (~208 KiB of rmem) */
#define MAX_CRASHES 64
#define MAX_ADVERTS 64

/* ---- options ----------------------------------------------------------------------------- */

typedef struct {
    uint32_t nodes;
    double loss; /* fraction of datagrams lost */
    double slow; /* fraction of nodes that stall */
    int gossip_ms, probe_ms, probe_timeout_ms, suspicion_mult, suspicion_max_mult;
    double latency_ms, latency_sigma; /* lognormal one-way latency: median, σ of its log */
    int stall_min_ms, stall_max_ms, stall_every_ms;
    int adverts, crashes;
    int warmup_ms, quiet_ms;
    uint64_t seed;
    bool json, check;
    bool full_push_pull;   /* exchange full states, as before digests */
    int push_pull_ms;      /* the push-pull period (30000) */
    bool push_pull_scaled; /* the period grows with log n even with digests (as before) */
    double max_mem_gb;
} opts_t;

/* ---- random numbers ---------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r) { return mix64(r->s += 0x9e3779b97f4a7c15ULL); }
static double rng_unif(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }
static uint32_t rng_below(rng_t *r, uint32_t n) {
    return (uint32_t)(((rng_next(r) >> 32) * (uint64_t)n) >> 32);
}
static double rng_normal(rng_t *r) {
    double u = rng_unif(r), v = rng_unif(r);
    return sqrt(-2.0 * log(u > 0 ? u : 1e-300)) * cos(6.283185307179586 * v);
}

/* ---- signatures (modelled) --------------------------------------------------------------- */

#define SIM_KEY 0x7e55e7a5eed5ULL

/* 64 bytes from a hash of the message keyed by the signer's id. */
static void fake_sig(const uint8_t id[TS_SWIM_ID_LEN], const uint8_t *msg, size_t len,
                     uint8_t sig[TS_SWIM_SIG_LEN]) {
    uint64_t h = SIM_KEY;
    for (int i = 0; i < TS_SWIM_ID_LEN; i += 8) {
        uint64_t w;
        memcpy(&w, id + i, 8);
        h = mix64(h ^ w);
    }
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, msg + i, 8);
        h = mix64(h ^ w);
    }
    uint64_t tail = 0;
    memcpy(&tail, msg + i, len - i);
    h = mix64(h ^ tail ^ (uint64_t)len << 56);
    for (int k = 0; k < TS_SWIM_SIG_LEN / 8; k++) {
        uint64_t w = mix64(h + (uint64_t)k * 0x9e3779b97f4a7c15ULL);
        memcpy(sig + 8 * k, &w, 8);
    }
}

typedef struct node node_t;

static int sim_sign(void *ctx, const uint8_t *msg, size_t len, uint8_t sig[TS_SWIM_SIG_LEN]);

static int sim_verify(void *ctx, const uint8_t id[TS_SWIM_ID_LEN], const uint8_t *msg, size_t len,
                      const uint8_t sig[TS_SWIM_SIG_LEN]) {
    (void)ctx;
    uint8_t want[TS_SWIM_SIG_LEN];
    fake_sig(id, msg, len, want);
    return memcmp(want, sig, TS_SWIM_SIG_LEN) == 0 ? 0 : -1;
}

/* ---- the simulated world ----------------------------------------------------------------- */

enum { EV_DELIVER, EV_TIMER, EV_STALL, EV_RESUME, EV_ADVERT, EV_CRASH, EV_PUSH_PULL };

typedef struct {
    int64_t t; /* µs */
    uint64_t seq;
    uint32_t a, b;
    uint8_t kind;
} event_t;

typedef struct {
    uint32_t from, next; /* next: a stalled node's queue */
    uint16_t len;
    uint8_t bytes[TS_SWIM_PLAIN_MAX];
} packet_t;

struct node {
    ts_swim_t *core;
    uint8_t id[TS_SWIM_ID_LEN];
    bool slow, crashed, stalled;
    int64_t timer_at; /* µs, of the armed timer event */
    uint32_t timer_gen;
    uint32_t q_head, q_tail, q_len; /* packets held while stalled */
    uint64_t advert_version;
    int64_t stall_from, stall_to; /* µs: the last stall (TRACE) */
};

typedef struct {
    uint32_t node;
    uint64_t version;
    int64_t t0;
    int64_t *learned; /* per observer, −1 until it asked for the advert */
} advert_t;

typedef struct {
    uint32_t node;
    int64_t t0;
    int64_t first_suspect, first_dead;
    int64_t *dead_at; /* per observer, −1 until it declared the victim dead */
} crash_t;

typedef struct {
    opts_t o;
    ts_swim_config_t cfg;
    ts_swim_claims_t *pool;
    node_t *nodes;
    rng_t rng;
    int64_t now; /* µs */
    event_t *heap;
    size_t n_heap, cap_heap;
    uint64_t ev_seq;
    packet_t *pkts;
    uint32_t n_pkts, cap_pkts, free_pkt;
    ts_swim_msg_t msg;
    ts_swim_member_info_t *state_a, *state_b; /* push-pull scratch */
    /* measurements */
    bool measuring;
    int64_t measure_t0, quiet_t0, quiet_t1;
    uint64_t udp_bytes, udp_packets, tcp_bytes, quiet_udp_bytes, quiet_udp_packets;
    uint64_t lost, buffer_drops, push_pulls, push_pulls_failed, stalls;
    uint64_t push_pull_buckets; /* differing buckets, summed over the exchanges */
    advert_t adverts[MAX_ADVERTS];
    int n_adverts;
    crash_t crashes[MAX_CRASHES];
    int n_crashes;
    int32_t *crash_index; /* per node: its crash_t, or −1 */
    uint64_t fp_events, false_suspect_events;
    uint8_t *fp_subject, *suspected_subject; /* per node: ever declared dead / suspect while up */
} sim_t;

static int sim_sign(void *ctx, const uint8_t *msg, size_t len, uint8_t sig[TS_SWIM_SIG_LEN]) {
    const node_t *n = ctx;
    fake_sig(n->id, msg, len, sig);
    return 0;
}

static ts_swim_addr_t addr_of(uint32_t i) {
    ts_swim_addr_t a = {.port = 7946};
    a.ip[10] = a.ip[11] = 0xff;
    a.ip[12] = (uint8_t)(i >> 24);
    a.ip[13] = (uint8_t)(i >> 16);
    a.ip[14] = (uint8_t)(i >> 8);
    a.ip[15] = (uint8_t)i;
    return a;
}

/* The node at a, or UINT32_MAX for an address that is no node (the virtual seed). */
static uint32_t index_of(const sim_t *S, const ts_swim_addr_t *a) {
    uint32_t i = (uint32_t)a->ip[12] << 24 | (uint32_t)a->ip[13] << 16 | (uint32_t)a->ip[14] << 8 |
                 a->ip[15];
    return i < S->o.nodes && a->port == 7946 ? i : UINT32_MAX;
}

static void make_id(uint8_t id[TS_SWIM_ID_LEN], uint32_t i) {
    /* splitmix is a bijection on 64 bits: the first 8 bytes are distinct for every node */
    for (int k = 0; k < 4; k++) {
        uint64_t w = mix64((uint64_t)i * 4 + (uint64_t)k + 1);
        memcpy(id + 8 * k, &w, 8);
    }
}

static void die(const char *what) {
    fprintf(stderr, "bench_gossip: %s\n", what);
    exit(1);
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n);
    if (!p)
        die("out of memory");
    return p;
}

/* ---- the event heap ---------------------------------------------------------------------- */

static bool ev_less(const event_t *a, const event_t *b) {
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static void push_event(sim_t *S, int64_t t, int kind, uint32_t a, uint32_t b) {
    if (S->n_heap == S->cap_heap) {
        S->cap_heap = S->cap_heap ? 2 * S->cap_heap : 4096;
        S->heap = xrealloc(S->heap, S->cap_heap * sizeof *S->heap);
    }
    event_t e = {.t = t, .seq = S->ev_seq++, .a = a, .b = b, .kind = (uint8_t)kind};
    size_t i = S->n_heap++;
    while (i > 0 && ev_less(&e, &S->heap[(i - 1) / 2])) {
        S->heap[i] = S->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    S->heap[i] = e;
}

static event_t pop_event(sim_t *S) {
    event_t top = S->heap[0], last = S->heap[--S->n_heap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= S->n_heap)
            break;
        if (c + 1 < S->n_heap && ev_less(&S->heap[c + 1], &S->heap[c]))
            c++;
        if (!ev_less(&S->heap[c], &last))
            break;
        S->heap[i] = S->heap[c];
        i = c;
    }
    if (S->n_heap > 0)
        S->heap[i] = last;
    return top;
}

/* ---- packets ----------------------------------------------------------------------------- */

static uint32_t pkt_alloc(sim_t *S) {
    if (S->free_pkt != UINT32_MAX) {
        uint32_t p = S->free_pkt;
        S->free_pkt = S->pkts[p].next;
        return p;
    }
    if (S->n_pkts == S->cap_pkts) {
        S->cap_pkts = S->cap_pkts ? 2 * S->cap_pkts : 4096;
        S->pkts = xrealloc(S->pkts, S->cap_pkts * sizeof *S->pkts);
    }
    return S->n_pkts++;
}

static void pkt_free(sim_t *S, uint32_t p) {
    S->pkts[p].next = S->free_pkt;
    S->free_pkt = p;
}

static int64_t latency_us(sim_t *S) {
    double ms = S->o.latency_ms * exp(S->o.latency_sigma * rng_normal(&S->rng));
    if (ms < 0.1)
        ms = 0.1;
    if (ms > 2000)
        ms = 2000;
    return (int64_t)(ms * 1000.0);
}

/* ---- taking a node's outputs ------------------------------------------------------------- */

static void arm_timer(sim_t *S, uint32_t i) {
    node_t *n = &S->nodes[i];
    int64_t d = ts_swim_next_deadline(n->core);
    int64_t t = d >= INT64_MAX / 1000 ? INT64_MAX : d * 1000;
    if (t == n->timer_at || t == INT64_MAX)
        return;
    n->timer_at = t;
    push_event(S, t < S->now ? S->now : t, EV_TIMER, i, ++n->timer_gen);
}

static void on_core_event(sim_t *S, uint32_t i, const ts_swim_event_t *ev) {
    /* the subject, through the address in its claim (every node's address encodes its index) */
    uint32_t subj = index_of(S, &ev->addr);
    switch (ev->type) {
    case TS_SWIM_EV_PUSH_PULL:
        /* a TCP exchange: connect, then the two states; about two round trips */
        push_event(S, S->now + 4 * latency_us(S), EV_PUSH_PULL, i, subj);
        break;
    case TS_SWIM_EV_ADVERT_NEEDED:
        for (int k = 0; k < S->n_adverts; k++) {
            advert_t *a = &S->adverts[k];
            if (a->node == subj && a->version == ev->advert_version && a->learned[i] < 0) {
                a->learned[i] = S->now;
                /* SIM_TRACE_LAST: who hears an advert late (after 2.8 s), and its stall */
                if (S->now - a->t0 > 2800000 && getenv("SIM_TRACE_LAST"))
                    fprintf(stderr,
                            "advert %d: node %u (slow %d) learned at %.3f s; its last stall "
                            "%.3f..%.3f s%s\n",
                            k, i, S->nodes[i].slow, (S->now - a->t0) / 1e6,
                            (S->nodes[i].stall_from - a->t0) / 1e6,
                            S->nodes[i].stall_to == INT64_MAX
                                ? -1.0
                                : (S->nodes[i].stall_to - a->t0) / 1e6,
                            S->nodes[i].stall_to == S->now ? " (learned as it resumed)" : "");
            }
        }
        break;
    case TS_SWIM_EV_SUSPECT:
        if (subj == UINT32_MAX)
            break;
        if (!S->nodes[subj].crashed) {
            if (S->measuring) {
                S->false_suspect_events++;
                S->suspected_subject[subj] = 1;
            }
        } else if (S->crash_index[subj] >= 0) {
            crash_t *c = &S->crashes[S->crash_index[subj]];
            if (c->first_suspect < 0)
                c->first_suspect = S->now;
        }
        break;
    case TS_SWIM_EV_DEAD:
        if (subj == UINT32_MAX)
            break;
        if (!S->nodes[subj].crashed) {
            S->fp_events++;
            S->fp_subject[subj] = 1;
        } else if (S->crash_index[subj] >= 0) {
            crash_t *c = &S->crashes[S->crash_index[subj]];
            if (c->first_dead < 0)
                c->first_dead = S->now;
            if (c->dead_at[i] < 0)
                c->dead_at[i] = S->now;
        }
        break;
    default: break;
    }
}

/* Sends what node i queued and handles what it reported; re-arms its timer. */
static void drain(sim_t *S, uint32_t i) {
    node_t *n = &S->nodes[i];
    ts_swim_addr_t to;
    while (ts_swim_next_packet(n->core, &to, &S->msg)) {
        uint32_t p = pkt_alloc(S);
        size_t len = 0;
        if (ts_swim_wire_encode(&S->msg, S->pkts[p].bytes, TS_SWIM_PLAIN_MAX, &len) != TS_OK)
            die("a core produced a message that does not encode");
        if (S->measuring) {
            S->udp_bytes += len + SEAL_BYTES;
            S->udp_packets++;
            if (S->now >= S->quiet_t0 && S->now < S->quiet_t1) {
                S->quiet_udp_bytes += len + SEAL_BYTES;
                S->quiet_udp_packets++;
            }
        }
        uint32_t dest = index_of(S, &to);
        if (dest == UINT32_MAX || rng_unif(&S->rng) < S->o.loss) {
            if (dest != UINT32_MAX)
                S->lost++;
            pkt_free(S, p);
            continue;
        }
        S->pkts[p].from = i;
        S->pkts[p].len = (uint16_t)len;
        push_event(S, S->now + latency_us(S), EV_DELIVER, dest, p);
    }
    ts_swim_event_t ev;
    while (ts_swim_next_event(n->core, &ev))
        on_core_event(S, i, &ev);
    arm_timer(S, i);
}

static void deliver(sim_t *S, uint32_t i, uint32_t p) {
    node_t *n = &S->nodes[i];
    if (ts_swim_wire_decode(S->pkts[p].bytes, S->pkts[p].len, &S->msg) != TS_OK)
        die("a datagram failed to decode");
    ts_swim_addr_t from = addr_of(S->pkts[p].from);
    pkt_free(S, p);
    ts_swim_on_packet(n->core, S->now / 1000, &from, &S->msg);
    drain(S, i);
}

/* ---- push-pull --------------------------------------------------------------------------- */

static void push_pull(sim_t *S, uint32_t a, uint32_t b) {
    node_t *na = &S->nodes[a], *nb = b != UINT32_MAX ? &S->nodes[b] : NULL;
    if (na->crashed || !nb || nb->crashed) {
        S->push_pulls_failed++;
        return;
    }
    if (na->stalled || nb->stalled) {
        /* TCP waits for the stalled side; try again a little later */
        push_event(S, S->now + 100000, EV_PUSH_PULL, a, b);
        return;
    }
    S->push_pulls++;
    if (S->o.full_push_pull) {
        uint32_t ca = ts_swim_state_export(na->core, S->state_a, S->o.nodes + 16);
        uint32_t cb = ts_swim_state_export(nb->core, S->state_b, S->o.nodes + 16);
        if (S->measuring)
            S->tcp_bytes +=
                ts_swim_wire_state_size(S->state_a, ca) + ts_swim_wire_state_size(S->state_b, cb);
        ts_swim_merge_state(nb->core, S->now / 1000, na->id, S->state_a, ca);
        drain(S, b);
        ts_swim_merge_state(na->core, S->now / 1000, nb->id, S->state_b, cb);
        drain(S, a);
        return;
    }
    /* by digests: A's digest; B's members in the buckets that differ; A's in the same */
    ts_swim_digest_t da, db;
    uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES];
    ts_swim_state_digest(na->core, &da);
    ts_swim_state_digest(nb->core, &db);
    uint32_t differ = ts_swim_digest_diff(&da, &db, mask);
    uint32_t cb = ts_swim_state_export_buckets(nb->core, mask, S->state_b, S->o.nodes + 16);
    uint64_t bytes = TS_SWIM_WIRE_DIGEST + ts_swim_wire_diff_size(S->state_b, cb);
    S->push_pull_buckets += differ;
    ts_swim_merge_state(na->core, S->now / 1000, nb->id, S->state_b, cb);
    drain(S, a);
    if (differ > 0) {
        uint32_t ca = ts_swim_state_export_buckets(na->core, mask, S->state_a, S->o.nodes + 16);
        bytes += ts_swim_wire_diff_size(S->state_a, ca);
        ts_swim_merge_state(nb->core, S->now / 1000, na->id, S->state_a, ca);
        drain(S, b);
    }
    if (S->measuring)
        S->tcp_bytes += bytes;
}

/* ---- setup ------------------------------------------------------------------------------- */

static void setup(sim_t *S) {
    const opts_t *o = &S->o;
    uint32_t N = o->nodes;
    ts_swim_config_default(&S->cfg);
    S->cfg.gossip_interval_ms = o->gossip_ms;
    S->cfg.probe_interval_ms = o->probe_ms;
    S->cfg.probe_timeout_ms = o->probe_timeout_ms;
    S->cfg.suspicion_mult = o->suspicion_mult;
    S->cfg.suspicion_max_mult = o->suspicion_max_mult;
    S->cfg.push_pull_interval_ms = o->push_pull_ms;
    /* full states grow with n: their period grows with log n; digests do not */
    S->cfg.push_pull_fixed = !o->full_push_pull && !o->push_pull_scaled;
    S->cfg.max_members = N + 16;
    /* smaller queues than the daemon's defaults: 10⁴ cores hold them all */
    S->cfg.max_broadcasts = 128;
    S->cfg.max_suspicions = 64;
    S->cfg.max_events = 64;
    S->cfg.max_outbox = 32;
    S->cfg.max_relays = 16;
    S->cfg.sign = sim_sign;
    S->cfg.verify = sim_verify;
    if (ts_swim_claims_create(3 * N + 65536, &S->pool) != TS_OK)
        die("cannot create the claims pool");
    S->cfg.claims = S->pool;

    S->nodes = calloc(N, sizeof *S->nodes);
    S->crash_index = malloc(N * sizeof *S->crash_index);
    S->fp_subject = calloc(N, 1);
    S->suspected_subject = calloc(N, 1);
    S->state_a = malloc((N + 16) * sizeof *S->state_a);
    S->state_b = malloc((N + 16) * sizeof *S->state_b);
    if (!S->nodes || !S->crash_index || !S->fp_subject || !S->suspected_subject || !S->state_a ||
        !S->state_b)
        die("out of memory");
    S->free_pkt = UINT32_MAX;

    /* every node's first claim, signed, as the virtual seed will hand them out */
    ts_swim_member_info_t *all = S->state_a;
    for (uint32_t i = 0; i < N; i++) {
        node_t *n = &S->nodes[i];
        make_id(n->id, i);
        n->slow = rng_unif(&S->rng) < o->slow;
        n->timer_at = INT64_MIN;
        n->q_head = n->q_tail = UINT32_MAX;
        S->crash_index[i] = -1;
        ts_swim_config_t c = S->cfg;
        c.crypto_ctx = n;
        ts_swim_addr_t a = addr_of(i);
        if (ts_swim_create(&c, n->id, &a, o->seed * 1000003 + i, 0, &n->core) != TS_OK)
            die("cannot create a core");
        all[i].state = TS_SWIM_ALIVE;
        all[i].incarnation = 0;
        all[i].change_ms = 0;
        ts_swim_member_info_t self;
        ts_swim_member_get(n->core, n->id, &self);
        all[i].claim = self.claim;
    }
    /* joins through the virtual seed: its push-pull answer is the whole network. (Its JOINED
     * events overflow the small event queue; they are not measured. The gossip datagram a join
     * sends to the seed goes nowhere.) */
    ts_swim_addr_t seed = addr_of(UINT32_MAX);
    uint8_t seed_id[TS_SWIM_ID_LEN] = {0};
    for (uint32_t i = 0; i < N; i++) {
        node_t *n = &S->nodes[i];
        ts_swim_join(n->core, 0, &seed, 1);
        ts_swim_merge_state(n->core, 0, seed_id, all, N);
        ts_swim_event_t ev;
        while (ts_swim_next_event(n->core, &ev))
            ; /* the PUSH_PULL request to the virtual seed is the merge above */
        drain(S, i);
    }
}

/* ---- the run ----------------------------------------------------------------------------- */

static uint32_t random_normal_node(sim_t *S) {
    for (int tries = 0; tries < 100000; tries++) {
        uint32_t i = rng_below(&S->rng, S->o.nodes);
        if (!S->nodes[i].slow && !S->nodes[i].crashed && S->crash_index[i] < 0)
            return i;
    }
    die("no normal node left to pick");
    return 0;
}

static void stall_begin(sim_t *S, uint32_t i) {
    node_t *n = &S->nodes[i];
    if (n->crashed)
        return;
    n->stalled = true;
    n->stall_from = S->now;
    n->stall_to = INT64_MAX;
    S->stalls++;
    int span = S->o.stall_max_ms - S->o.stall_min_ms;
    int64_t ms = S->o.stall_min_ms + (span > 0 ? rng_below(&S->rng, (uint32_t)span + 1) : 0);
    push_event(S, S->now + ms * 1000, EV_RESUME, i, 0);
}

static void stall_end(sim_t *S, uint32_t i) {
    node_t *n = &S->nodes[i];
    n->stalled = false;
    n->stall_to = S->now;
    if (n->crashed)
        return;
    /* catching up as an event loop does: timers first, then what waits in the socket */
    ts_swim_tick(n->core, S->now / 1000);
    n->timer_at = INT64_MIN;
    drain(S, i);
    while (n->q_head != UINT32_MAX) {
        uint32_t p = n->q_head;
        n->q_head = S->pkts[p].next;
        n->q_len--;
        deliver(S, i, p);
    }
    n->q_tail = UINT32_MAX;
    double gap = -log(1.0 - rng_unif(&S->rng)) * S->o.stall_every_ms;
    push_event(S, S->now + (int64_t)(gap * 1000.0), EV_STALL, i, 0);
}

static void handle(sim_t *S, const event_t *e) {
    node_t *n = &S->nodes[e->a];
    switch (e->kind) {
    case EV_DELIVER:
        if (n->crashed) {
            pkt_free(S, e->b);
        } else if (n->stalled) {
            if (n->q_len >= SOCKET_BUFFER) {
                S->buffer_drops++;
                pkt_free(S, e->b);
                break;
            }
            S->pkts[e->b].next = UINT32_MAX;
            if (n->q_tail == UINT32_MAX)
                n->q_head = e->b;
            else
                S->pkts[n->q_tail].next = e->b;
            n->q_tail = e->b;
            n->q_len++;
        } else {
            deliver(S, e->a, e->b);
        }
        break;
    case EV_TIMER:
        if (e->b != n->timer_gen || n->crashed || n->stalled)
            break;
        n->timer_at = INT64_MIN;
        ts_swim_tick(n->core, S->now / 1000);
        drain(S, e->a);
        break;
    case EV_STALL: stall_begin(S, e->a); break;
    case EV_RESUME: stall_end(S, e->a); break;
    case EV_PUSH_PULL: push_pull(S, e->a, e->b); break;
    case EV_ADVERT: {
        advert_t *a = &S->adverts[e->a];
        a->node = random_normal_node(S);
        node_t *an = &S->nodes[a->node];
        a->version = ++an->advert_version;
        a->t0 = S->now;
        uint8_t hash[TS_SWIM_HASH_LEN];
        for (int k = 0; k < TS_SWIM_HASH_LEN; k++)
            hash[k] = (uint8_t)rng_next(&S->rng);
        ts_swim_set_advert(an->core, S->now / 1000, a->version, hash);
        drain(S, a->node);
        break;
    }
    case EV_CRASH: {
        crash_t *c = &S->crashes[e->a];
        c->node = random_normal_node(S);
        c->t0 = S->now;
        S->crash_index[c->node] = (int32_t)e->a;
        S->nodes[c->node].crashed = true;
        /* its socket goes with it */
        node_t *v = &S->nodes[c->node];
        while (v->q_head != UINT32_MAX) {
            uint32_t p = v->q_head;
            v->q_head = S->pkts[p].next;
            pkt_free(S, p);
        }
        v->q_tail = UINT32_MAX;
        v->q_len = 0;
        break;
    }
    default: break;
    }
}

static bool crashes_all_known(const sim_t *S) {
    for (int k = 0; k < S->n_crashes; k++) {
        const crash_t *c = &S->crashes[k];
        if (c->t0 <= 0)
            return false;
        for (uint32_t i = 0; i < S->o.nodes; i++)
            if (!S->nodes[i].crashed && c->dead_at[i] < 0)
                return false;
    }
    return true;
}

/* --check: every core's invariants (ts_swim_validate), between two virtual seconds. */
static void check_all(const sim_t *S) {
    for (uint32_t i = 0; i < S->o.nodes; i++)
        if (ts_swim_validate(S->nodes[i].core) != TS_OK) {
            fprintf(stderr, "bench_gossip: node %u fails ts_swim_validate at t = %.3f s\n", i,
                    S->now / 1e6);
            exit(1);
        }
}

/* Runs the events up to t_end, a virtual second at a time. */
static void run_until(sim_t *S, int64_t t_end) {
    while (S->now < t_end) {
        int64_t step = S->now + 1000000 < t_end ? S->now + 1000000 : t_end;
        while (S->n_heap > 0 && S->heap[0].t <= step) {
            event_t e = pop_event(S);
            S->now = e.t;
            handle(S, &e);
        }
        S->now = step;
        if (S->o.check)
            check_all(S);
    }
}

/* ---- statistics -------------------------------------------------------------------------- */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank quantile of v[0..n) (sorted in place); −1 when n is 0. */
static int64_t quantile(int64_t *v, int n, double q) {
    if (n == 0)
        return -1;
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    int r = (int)ceil(q * n);
    return v[(r < 1 ? 1 : r) - 1];
}

typedef struct {
    int64_t t999_med, t999_max, t100_med, t100_max; /* ms; −1: some live node never learned */
    int reached_all;
    int64_t first_med, first_p99, all_med, all_p99, suspect_med; /* ms */
    int detected_all;
} results_t;

static results_t summarize(sim_t *S) {
    results_t r;
    memset(&r, 0, sizeof r);
    uint32_t N = S->o.nodes;
    int64_t t999[MAX_ADVERTS], t100[MAX_ADVERTS];
    int64_t *times = malloc(N * sizeof *times);
    if (!times)
        die("out of memory");
    int n_ok = 0;
    for (int k = 0; k < S->n_adverts; k++) {
        const advert_t *a = &S->adverts[k];
        uint32_t live = 0, got = 0;
        for (uint32_t i = 0; i < N; i++) {
            /* live observers: all but the advertiser (the crashes come after the adverts) */
            if (i == a->node || S->nodes[i].crashed)
                continue;
            live++;
            if (a->learned[i] >= 0)
                times[got++] = (a->learned[i] - a->t0) / 1000;
        }
        qsort(times, got, sizeof *times, cmp_i64);
        uint32_t need999 = (uint32_t)ceil(0.999 * live);
        t999[k] = got >= need999 && need999 > 0 ? times[need999 - 1] : INT64_MAX;
        t100[k] = got == live && live > 0 ? times[live - 1] : INT64_MAX;
        if (got == live)
            n_ok++;
    }
    r.reached_all = n_ok;
    r.t999_med = quantile(t999, S->n_adverts, 0.5);
    r.t999_max = quantile(t999, S->n_adverts, 1.0);
    r.t100_med = quantile(t100, S->n_adverts, 0.5);
    r.t100_max = quantile(t100, S->n_adverts, 1.0);

    int64_t first[MAX_CRASHES], all[MAX_CRASHES], susp[MAX_CRASHES];
    int n_first = 0, n_all = 0, n_susp = 0;
    for (int k = 0; k < S->n_crashes; k++) {
        const crash_t *c = &S->crashes[k];
        if (c->first_dead >= 0)
            first[n_first++] = (c->first_dead - c->t0) / 1000;
        if (c->first_suspect >= 0)
            susp[n_susp++] = (c->first_suspect - c->t0) / 1000;
        int64_t last = -1;
        bool everyone = true;
        for (uint32_t i = 0; i < N && everyone; i++) {
            if (S->nodes[i].crashed)
                continue;
            if (c->dead_at[i] < 0)
                everyone = false;
            else if (c->dead_at[i] > last)
                last = c->dead_at[i];
        }
        all[n_all++] = everyone ? (last - c->t0) / 1000 : INT64_MAX;
        r.detected_all += everyone;
    }
    r.first_med = quantile(first, n_first, 0.5);
    r.first_p99 = quantile(first, n_first, 0.99);
    r.suspect_med = quantile(susp, n_susp, 0.5);
    r.all_med = quantile(all, n_all, 0.5);
    r.all_p99 = quantile(all, n_all, 0.99);
    free(times);
    return r;
}

static long peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024;
}

/* MemAvailable from /proc/meminfo, in GiB (0 when unknown). */
static double mem_available_gb(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    double gb = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long kb;
        if (sscanf(line, "MemAvailable: %lu kB", &kb) == 1)
            gb = kb / 1048576.0;
    }
    fclose(f);
    return gb;
}

/* Frees everything. Every claim reference is held by some core, so once they are all gone the
 * shared pool must be empty: anything left is a reference-counting bug in the core. */
static void teardown(sim_t *S) {
    for (uint32_t i = 0; i < S->o.nodes; i++)
        ts_swim_free(S->nodes[i].core);
    uint32_t left = ts_swim_claims_count(S->pool);
    ts_swim_claims_free(S->pool);
    if (left != 0) {
        fprintf(stderr, "bench_gossip: %u claims still referenced after every core was freed\n",
                left);
        exit(1);
    }
    for (int k = 0; k < S->n_adverts; k++)
        free(S->adverts[k].learned);
    for (int k = 0; k < S->n_crashes; k++)
        free(S->crashes[k].dead_at);
    free(S->nodes);
    free(S->crash_index);
    free(S->fp_subject);
    free(S->suspected_subject);
    free(S->state_a);
    free(S->state_b);
    free(S->heap);
    free(S->pkts);
    free(S);
}

/* ---- main -------------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench_gossip [options]\n"
            "  --nodes N              virtual nodes (1000)\n"
            "  --loss PCT             datagrams lost, percent (0)\n"
            "  --slow PCT             nodes that stall now and then, percent (0)\n"
            "  --gossip-ms MS         gossip interval (200)\n"
            "  --probe-ms MS          probe interval (1000)\n"
            "  --probe-timeout-ms MS  probe timeout (500)\n"
            "  --suspicion-mult A     shortest suspicion A·log10(n)·probe interval (4)\n"
            "  --suspicion-max-mult B longest suspicion, B times the shortest (6)\n"
            "  --latency-ms MS        median one-way latency (20), lognormal\n"
            "  --latency-sigma S      σ of the latency's logarithm (0.5)\n"
            "  --stall-ms MIN:MAX     length of a slow node's stall (1000:3000)\n"
            "  --stall-every-ms MS    mean time between a slow node's stalls (10000)\n"
            "  --adverts A            advert changes measured (5)\n"
            "  --crashes C            crashes measured (min(20, N/10))\n"
            "  --seed S               random seed (1)\n"
            "  --max-mem-gb G         refuse a run estimated above G GiB (12)\n"
            "  --check                check every core's invariants every virtual second\n"
            "  --full-push-pull       push-pull exchanges full states, not digests (their\n"
            "                         period grows with log n)\n"
            "  --push-pull-ms MS      push-pull period (30000)\n"
            "  --push-pull-scaled     with digests too, the period grows with log n (as before)\n"
            "  --json                 one JSON document instead of the table\n"
            "environment: SIM_TRACE_LAST=1 prints, on stderr, every node that learns an advert\n"
            "  more than 2.8 s after it, with its last stall\n");
}

static void parse(int argc, char **argv, opts_t *o) {
    *o = (opts_t){.nodes = 1000,
                  .gossip_ms = 200,
                  .push_pull_ms = 30000,
                  .probe_ms = 1000,
                  .probe_timeout_ms = 500,
                  .suspicion_mult = 4,
                  .suspicion_max_mult = 6,
                  .latency_ms = 20,
                  .latency_sigma = 0.5,
                  .stall_min_ms = 1000,
                  .stall_max_ms = 3000,
                  .stall_every_ms = 10000,
                  .adverts = 5,
                  .crashes = -1,
                  .warmup_ms = 10000,
                  .quiet_ms = 10000,
                  .seed = 1,
                  .max_mem_gb = 12};
    static const struct option opts[] = {{"nodes", 1, 0, 'n'},
                                         {"loss", 1, 0, 'l'},
                                         {"slow", 1, 0, 's'},
                                         {"gossip-ms", 1, 0, 'g'},
                                         {"probe-ms", 1, 0, 'p'},
                                         {"probe-timeout-ms", 1, 0, 't'},
                                         {"suspicion-mult", 1, 0, 'a'},
                                         {"suspicion-max-mult", 1, 0, 'b'},
                                         {"latency-ms", 1, 0, 'L'},
                                         {"latency-sigma", 1, 0, 'S'},
                                         {"stall-ms", 1, 0, 'T'},
                                         {"stall-every-ms", 1, 0, 'E'},
                                         {"adverts", 1, 0, 'A'},
                                         {"crashes", 1, 0, 'C'},
                                         {"seed", 1, 0, 'r'},
                                         {"max-mem-gb", 1, 0, 'M'},
                                         {"json", 0, 0, 'j'},
                                         {"check", 0, 0, 'K'},
                                         {"full-push-pull", 0, 0, 'F'},
                                         {"push-pull-ms", 1, 0, 'P'},
                                         {"push-pull-scaled", 0, 0, 'Q'},
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'n': o->nodes = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'l': o->loss = atof(optarg) / 100.0; break;
        case 's': o->slow = atof(optarg) / 100.0; break;
        case 'g': o->gossip_ms = atoi(optarg); break;
        case 'p': o->probe_ms = atoi(optarg); break;
        case 't': o->probe_timeout_ms = atoi(optarg); break;
        case 'a': o->suspicion_mult = atoi(optarg); break;
        case 'b': o->suspicion_max_mult = atoi(optarg); break;
        case 'L': o->latency_ms = atof(optarg); break;
        case 'S': o->latency_sigma = atof(optarg); break;
        case 'T':
            if (sscanf(optarg, "%d:%d", &o->stall_min_ms, &o->stall_max_ms) != 2)
                die("--stall-ms wants MIN:MAX in milliseconds");
            break;
        case 'E': o->stall_every_ms = atoi(optarg); break;
        case 'A': o->adverts = atoi(optarg); break;
        case 'C': o->crashes = atoi(optarg); break;
        case 'r': o->seed = strtoull(optarg, NULL, 10); break;
        case 'M': o->max_mem_gb = atof(optarg); break;
        case 'j': o->json = true; break;
        case 'K': o->check = true; break;
        case 'F': o->full_push_pull = true; break;
        case 'P': o->push_pull_ms = atoi(optarg); break;
        case 'Q': o->push_pull_scaled = true; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (o->crashes < 0)
        o->crashes = o->nodes / 10 < 20 ? (int)(o->nodes / 10) : 20;
    if (o->nodes < 4 || o->nodes > 100000 || o->loss < 0 || o->loss >= 1 || o->slow < 0 ||
        o->slow > 0.5 || o->adverts < 0 || o->adverts > MAX_ADVERTS || o->crashes > MAX_CRASHES ||
        o->gossip_ms <= 0 || o->probe_ms <= 0 || o->probe_timeout_ms <= 0 ||
        o->probe_timeout_ms >= o->probe_ms || o->stall_min_ms < 0 ||
        o->stall_max_ms < o->stall_min_ms || o->stall_every_ms <= 0 || o->latency_ms <= 0 ||
        (uint32_t)o->crashes + (uint32_t)o->adverts >= o->nodes / 2)
        die("an option is out of range (see --help)");
}

static void print_ms(FILE *f, int64_t ms) {
    if (ms == INT64_MAX)
        fprintf(f, "not all");
    else if (ms < 0)
        fprintf(f, "—");
    else
        fprintf(f, "%.2f s", ms / 1000.0);
}

static void json_ms(FILE *f, const char *key, int64_t ms, bool comma) {
    if (ms == INT64_MAX || ms < 0)
        fprintf(f, "\"%s\": null%s", key, comma ? ", " : "");
    else
        fprintf(f, "\"%s\": %lld%s", key, (long long)ms, comma ? ", " : "");
}

int main(int argc, char **argv) {
    sim_t *S = calloc(1, sizeof *S);
    if (!S)
        die("out of memory");
    parse(argc, argv, &S->o);
    const opts_t *o = &S->o;
    uint32_t N = o->nodes;
    S->rng.s = o->seed;

    /* the member tables dominate: ~48 bytes per member per node */
    double est_gb = (double)N * N * 48.0 / 1073741824.0 + 0.2;
    double avail = mem_available_gb();
    if (est_gb > o->max_mem_gb || (avail > 0 && est_gb > 0.8 * avail)) {
        fprintf(stderr,
                "bench_gossip: N = %u needs about %.1f GiB (limit %.1f GiB, %.1f GiB available);"
                " raise --max-mem-gb or use fewer nodes\n",
                N, est_gb, o->max_mem_gb, avail);
        return 1;
    }

    struct timespec w0, w1;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    setup(S);
    struct timespec ws;
    clock_gettime(CLOCK_MONOTONIC, &ws);

    for (int k = 0; k < o->adverts; k++) {
        S->adverts[k].learned = malloc(N * sizeof(int64_t));
        if (!S->adverts[k].learned)
            die("out of memory");
        for (uint32_t i = 0; i < N; i++)
            S->adverts[k].learned[i] = -1;
    }
    S->n_adverts = o->adverts;
    for (int k = 0; k < o->crashes; k++) {
        crash_t *c = &S->crashes[k];
        c->dead_at = malloc(N * sizeof(int64_t));
        if (!c->dead_at)
            die("out of memory");
        for (uint32_t i = 0; i < N; i++)
            c->dead_at[i] = -1;
        c->first_dead = c->first_suspect = -1;
    }
    S->n_crashes = o->crashes;

    /* the schedule: warm-up, quiet window, adverts 10 s apart, crashes 5 s apart, tail */
    int64_t t = (int64_t)o->warmup_ms * 1000;
    S->measure_t0 = t;
    S->quiet_t0 = t;
    S->quiet_t1 = t + (int64_t)o->quiet_ms * 1000;
    t = S->quiet_t1;
    for (int k = 0; k < o->adverts; k++, t += 10000000)
        push_event(S, t, EV_ADVERT, (uint32_t)k, 0);
    for (int k = 0; k < o->crashes; k++, t += 5000000)
        push_event(S, t, EV_CRASH, (uint32_t)k, 0);
    int64_t last_crash = t - 5000000;
    for (uint32_t i = 0; i < N; i++)
        if (S->nodes[i].slow) {
            double gap = -log(1.0 - rng_unif(&S->rng)) * o->stall_every_ms;
            push_event(S, S->measure_t0 + (int64_t)(gap * 1000.0), EV_STALL, i, 0);
        }

    run_until(S, S->measure_t0);
    S->measuring = true;
    /* stop when every crash is known to every live node, or after the longest suspicion
     * timeout (and 30 s) past the last crash */
    int64_t t_end =
        o->crashes > 0 ? last_crash + ts_swim_suspicion_max_ms(&S->cfg, N) * 1000 + 30000000 : t;
    while (S->now < t_end) {
        run_until(S, S->now + 1000000);
        if (o->crashes > 0 && S->now > last_crash && crashes_all_known(S))
            break;
    }
    int64_t t_stop = S->now;
    clock_gettime(CLOCK_MONOTONIC, &w1);
    double wall = (double)(w1.tv_sec - w0.tv_sec) + (w1.tv_nsec - w0.tv_nsec) / 1e9;
    double wall_setup = (double)(ws.tv_sec - w0.tv_sec) + (ws.tv_nsec - w0.tv_nsec) / 1e9;

    results_t r = summarize(S);
    /* the cores' own counters, summed: how much suspicion and refutation the run caused */
    ts_swim_stats_t tot;
    memset(&tot, 0, sizeof tot);
    for (uint32_t i = 0; i < N; i++) {
        ts_swim_stats_t st;
        ts_swim_get_stats(S->nodes[i].core, &st);
        tot.suspicions += st.suspicions;
        tot.refutations += st.refutations;
        tot.deaths_declared += st.deaths_declared;
        tot.broadcasts_dropped += st.broadcasts_dropped;
        tot.last_chance_pings += st.last_chance_pings;
        tot.stalls_detected += st.stalls_detected;
    }
    double secs = (double)(t_stop - S->measure_t0) / 1e6;
    double quiet_secs = (double)(S->quiet_t1 - S->quiet_t0) / 1e6;
    uint64_t fp_nodes = 0, susp_nodes = 0;
    for (uint32_t i = 0; i < N; i++) {
        fp_nodes += S->fp_subject[i];
        susp_nodes += S->suspected_subject[i];
    }
    uint32_t n_slow = 0;
    for (uint32_t i = 0; i < N; i++)
        n_slow += S->nodes[i].slow;
    double bps = S->udp_bytes / secs / N, pps = S->udp_packets / secs / N;
    double quiet_bps = S->quiet_udp_bytes / quiet_secs / N;
    double tcp_bps = S->tcp_bytes / secs / N;
    int64_t smin = ts_swim_suspicion_min_ms(&S->cfg, N),
            smax = ts_swim_suspicion_max_ms(&S->cfg, N);

    if (o->json) {
        printf("{\"nodes\": %u, \"loss_pct\": %.2f, \"slow_pct\": %.2f, \"slow_nodes\": %u, "
               "\"gossip_ms\": %d, \"probe_ms\": %d, \"probe_timeout_ms\": %d, "
               "\"suspicion_mult\": %d, \"suspicion_max_mult\": %d, \"suspicion_min_ms\": %lld, "
               "\"suspicion_max_ms\": %lld, \"latency_median_ms\": %.1f, \"latency_sigma\": %.2f, "
               "\"stall_ms\": [%d, %d], \"stall_every_ms\": %d, \"seed\": %llu, ",
               N, o->loss * 100, o->slow * 100, n_slow, o->gossip_ms, o->probe_ms,
               o->probe_timeout_ms, o->suspicion_mult, o->suspicion_max_mult, (long long)smin,
               (long long)smax, o->latency_ms, o->latency_sigma, o->stall_min_ms, o->stall_max_ms,
               o->stall_every_ms, (unsigned long long)o->seed);
        printf("\"adverts\": %d, \"adverts_reached_all\": %d, ", S->n_adverts, r.reached_all);
        json_ms(stdout, "advert_999_median_ms", r.t999_med, true);
        json_ms(stdout, "advert_999_max_ms", r.t999_max, true);
        json_ms(stdout, "advert_100_median_ms", r.t100_med, true);
        json_ms(stdout, "advert_100_max_ms", r.t100_max, true);
        printf("\"crashes\": %d, \"crashes_known_everywhere\": %d, ", S->n_crashes, r.detected_all);
        json_ms(stdout, "crash_first_suspect_median_ms", r.suspect_med, true);
        json_ms(stdout, "crash_first_dead_median_ms", r.first_med, true);
        json_ms(stdout, "crash_first_dead_p99_ms", r.first_p99, true);
        json_ms(stdout, "crash_all_dead_median_ms", r.all_med, true);
        json_ms(stdout, "crash_all_dead_p99_ms", r.all_p99, true);
        printf("\"false_positive_nodes\": %llu, \"false_positive_events\": %llu, "
               "\"falsely_suspected_nodes\": %llu, \"false_suspicion_events\": %llu, "
               "\"udp_bytes_per_s_per_node\": %.1f, \"udp_packets_per_s_per_node\": %.2f, "
               "\"idle_udp_bytes_per_s_per_node\": %.1f, \"tcp_bytes_per_s_per_node\": %.1f, "
               "\"push_pull\": \"%s\", \"push_pull_buckets_differing\": %llu, "
               "\"push_pulls\": %llu, \"lost\": %llu, \"stalls\": %llu, \"buffer_drops\": %llu, "
               "\"refutations\": %llu, \"stalls_detected\": %llu, \"last_chance_pings\": %llu, "
               "\"broadcasts_dropped\": %llu, "
               "\"virtual_s\": %.1f, \"wall_s\": %.1f, \"setup_wall_s\": %.1f, "
               "\"peak_rss_mb\": %ld}\n",
               (unsigned long long)fp_nodes, (unsigned long long)S->fp_events,
               (unsigned long long)susp_nodes, (unsigned long long)S->false_suspect_events, bps,
               pps, quiet_bps, tcp_bps, o->full_push_pull ? "full" : "digest",
               (unsigned long long)S->push_pull_buckets, (unsigned long long)S->push_pulls,
               (unsigned long long)S->lost, (unsigned long long)S->stalls,
               (unsigned long long)S->buffer_drops, (unsigned long long)tot.refutations,
               (unsigned long long)tot.stalls_detected, (unsigned long long)tot.last_chance_pings,
               (unsigned long long)tot.broadcasts_dropped, t_stop / 1e6, wall, wall_setup,
               peak_rss_mb());
    } else {
        printf("bench_gossip: %u nodes, loss %.1f %%, %u slow nodes (stall %d–%d ms every ~%d "
               "ms), latency median %.0f ms σ %.2f\n",
               N, o->loss * 100, n_slow, o->stall_min_ms, o->stall_max_ms, o->stall_every_ms,
               o->latency_ms, o->latency_sigma);
        printf("  gossip %d ms ×3, probe %d ms (timeout %d ms), suspicion %lld–%lld ms\n",
               o->gossip_ms, o->probe_ms, o->probe_timeout_ms, (long long)smin, (long long)smax);
        printf("  advert to 99.9 %%: median ");
        print_ms(stdout, r.t999_med);
        printf(", max ");
        print_ms(stdout, r.t999_max);
        printf("; to 100 %%: median ");
        print_ms(stdout, r.t100_med);
        printf(", max ");
        print_ms(stdout, r.t100_max);
        printf(" (%d of %d adverts reached every live node)\n", r.reached_all, S->n_adverts);
        printf("  crash → first suspect: median ");
        print_ms(stdout, r.suspect_med);
        printf("; → declared dead: median ");
        print_ms(stdout, r.first_med);
        printf(", p99 ");
        print_ms(stdout, r.first_p99);
        printf("; → dead everywhere: median ");
        print_ms(stdout, r.all_med);
        printf(", p99 ");
        print_ms(stdout, r.all_p99);
        printf(" (%d crashes)\n", S->n_crashes);
        printf("  false positives: %llu live nodes declared dead (%llu events); %llu live nodes "
               "suspected (%llu events)\n",
               (unsigned long long)fp_nodes, (unsigned long long)S->fp_events,
               (unsigned long long)susp_nodes, (unsigned long long)S->false_suspect_events);
        printf("  cores: %llu refutations, %llu stalls noticed, %llu last-chance pings, %llu "
               "queued updates dropped (queue full)\n",
               (unsigned long long)tot.refutations, (unsigned long long)tot.stalls_detected,
               (unsigned long long)tot.last_chance_pings,
               (unsigned long long)tot.broadcasts_dropped);
        printf("  traffic per node: %.0f B/s UDP (%.2f datagrams/s; idle %.0f B/s), %.0f B/s "
               "TCP push-pull (%s; %llu exchanges, %.2f buckets differing per exchange)\n",
               bps, pps, quiet_bps, tcp_bps, o->full_push_pull ? "full states" : "digests",
               (unsigned long long)S->push_pulls,
               S->push_pulls ? (double)S->push_pull_buckets / (double)S->push_pulls : 0.0);
        printf("  run: %.0f s virtual in %.1f s wall (setup %.1f s), peak RSS %ld MiB\n",
               t_stop / 1e6, wall, wall_setup, peak_rss_mb());
    }
    teardown(S);
    return 0;
}
