/*
 * remote.h — remote experts for the ensemble (model/ensemble.h's hook): every evaluation's jobs
 * go to the nodes hosting each expert, in parallel, over the RPC pool (net/rpc.h).
 *
 * Per job (one expert, the rows routed to it), cut into pieces of at most the samples one request
 * may carry (the smallest capacity.max_batch the expert's replicas advertise), per piece:
 *   1. choose a replica by predicted latency — the replica's round-trip EWMA plus its advertised
 *      queue depth × per-item time — between two replicas drawn at random (power of two
 *      choices); a replica that answered garbage is banned for ban_ms;
 *   2. send the DenoiseRequest; if no answer has come after the hedge delay (the p95 of this
 *      expert's observed round trips, at least hedge_min_ms), send the same request to a second
 *      replica; the first valid answer wins and the other call is cancelled;
 *   3. on an error, busy, timeout or a lost connection, retry on a replica not tried yet (at most
 *      retries times); a replica whose connection failed or that timed out is left alone for
 *      down_ms, so that later evaluations do not wait on it again;
 *   4. when no replica is left, run the expert locally from cached weights when they were given;
 *   5. only then fail the job: the ensemble drops the expert for this evaluation and
 *      renormalises (and the evaluation is counted as degraded).
 * An answer is accepted only when it is an F32 tensor of exactly (m, C, H, W) finite values.
 *
 * Everything runs on the client's loop; ts_remote_eval runs the loop until its jobs are done.
 */
#ifndef TS_CLIENT_REMOTE_H
#define TS_CLIENT_REMOTE_H

#include <stdint.h>
#include <uv.h>

#include "model/dit.h"
#include "model/ensemble.h"
#include "net/answer.h"
#include "net/rpc.h"

#define TS_REMOTE_MAX_REPLICAS 16
#define TS_REMOTE_RTT_WINDOW 64 /* round trips kept per expert, for the hedge delay */

typedef struct ts_replica {
    char addr[280];
    ts_rpc_peer_t *peer;
    ts_node_id_t node;        /* the node that must answer there (a relay's address is not) */
    int has_node;             /* node is known (from its advert) */
    double ewma_ms;           /* round-trip EWMA; 0 until the first answer */
    uint32_t queue_depth;     /* from the advert */
    uint32_t item_latency_us; /* from the advert */
    uint32_t max_samples;     /* samples one request may carry (the advert's capacity); 0: any */
    uint32_t max_rows;        /* forward rows one request may carry (B, 2B guided); 0: not said */
    double banned_until;      /* monotonic seconds; INFINITY once caught lying */
    uint64_t sent, answered, failed, garbage, hedges_won;
    /* learned from its signed answers: what computes them (net/answer.h) */
    char device_class[TS_ANSWER_DEVICE_MAX + 1];
    uint8_t precision;      /* a Tessera__DType value; 0 until its first answer */
    uint64_t checked, lies; /* its answers spot-checked, and found wrong */
    int vouched;            /* one of its answers has agreed with another replica's */
    /* vouched for by an earlier run (store/vouch.h), on answers of this class and precision: an
     * answer that claims another is checked as a stranger's */
    int remembered;
    char vouch_class[TS_ANSWER_DEVICE_MAX + 1];
    uint8_t vouch_precision;
    int agreed; /* one of its answers agreed with another replica's in this run: a vouch to keep */
    uint8_t *touched; /* (ts_remote_t.track_n) the samples its answers went into, or NULL */
} ts_replica_t;

typedef struct ts_remote_expert {
    uint8_t weights_hash[32];
    int n_rep;
    ts_replica_t rep[TS_REMOTE_MAX_REPLICAS];
    ts_dit_t *local; /* cached weights for the fallback (borrowed), or NULL */
    int absent;      /* no replica and no weights: the ensemble routes around it (never asked) */
    double rtt[TS_REMOTE_RTT_WINDOW];
    int n_rtt, rtt_next;
} ts_remote_expert_t;

typedef struct ts_remote_opts {
    uint32_t timeout_ms;   /* per request (10000) */
    int hedge;             /* send a second request after the hedge delay (1) */
    uint32_t hedge_min_ms; /* (2) */
    int retries;           /* further replicas tried after a failure (2) */
    uint32_t ban_ms;       /* a replica that answered garbage is not asked for this long (30000) */
    uint32_t down_ms;      /* nor one whose connection failed or request timed out (5000) */
    int prefer_local;      /* run every expert with cached weights locally (0) */
    /* Every answer must carry a valid signature by the node that was asked (1); an answer
     * without one counts as garbage. */
    int require_signed;
    /* The fraction of answers spot-checked (TS_REMOTE_VERIFY_RATE), and when the rate is not 0
     * every answer of a replica until one of them has agreed with another replica's (a replica
     * that lies on every answer is caught at its first): the same request asked of a second
     * replica, bit for bit where both report the same device class and precision,
     * within net/answer.h's tolerances otherwise; when they differ, a third replica or the
     * cached weights decide, and the liar is never asked again by this client. */
    double verify_rate;
} ts_remote_opts_t;

#define TS_REMOTE_VERIFY_RATE 0.02 /* docs/benchmarks.md, "Spot-checks against liars" */

void ts_remote_opts_default(ts_remote_opts_t *o);

/* What happened, for the summary and the trace. */
typedef struct ts_remote_stats {
    uint64_t evaluations, jobs, requests, answers, hedges, hedge_wins, retries, busy, errors;
    uint64_t garbage, local_runs, failed_jobs, degraded_evaluations;
    /* spot-checks: asked, agreed, disagreed, decided against a replica (wrong answers caught), left
     * undecided (nothing to break the tie), abandoned (the checker did not answer) */
    uint64_t checks, checks_agreed, mismatches, liars, undecided, checks_failed;
    uint64_t first_catch_requests; /* requests sent when the first wrong answer was caught */
    /* accusations (daemon/trust.h) sent to other replicas for each wrong answer caught, and
     * their verdicts: upheld, refused, not judged (no answer, or the node could not judge) */
    uint64_t accusations_sent, accusations_upheld, accusations_refused, accusations_unjudged;
    /* the largest relative difference (net/answer.h) between two answers that agreed without
     * promising the same bits (another device class or precision): the margin under the
     * tolerance */
    double agreed_max_diff;
    double first_catch_s; /* and the seconds since ts_remote_init (0: none caught) */
    uint64_t bytes_out, bytes_in;
    double network_s, local_s; /* wall time waiting for the network, computing locally */
    /* the servers' Timings, summed over answers: queue, compute, and of compute the device's */
    double server_queue_s, server_compute_s, server_device_s;
} ts_remote_stats_t;

/* The jobs of one expert that failed on every replica (and locally), and the last failure: the
 * node and what it said. */
typedef struct ts_remote_fail {
    uint64_t jobs;
    char note[200]; /* "127.0.0.1:4000: expert not found", or why no request went out */
} ts_remote_fail_t;

/* One trace event: one request or local run of one job (Chrome trace "X" events). */
typedef struct ts_remote_event {
    double start_s, dur_s;                    /* from ts_remote_init */
    int k;                                    /* expert */
    int m;                                    /* rows */
    int replica;                              /* −1: local */
    int status;                               /* TS_OK, or the failure */
    int hedge;                                /* 1: a hedged second request */
    uint32_t queue_us, compute_us, device_us; /* the server's Timings (0 when none) */
} ts_remote_event_t;

typedef struct ts_remote {
    uv_loop_t *loop;
    ts_rpc_t *rpc;
    int K;
    ts_remote_expert_t *experts; /* (K), the caller's */
    ts_remote_opts_t o;
    int64_t chw;
    int channels, size;
    ts_remote_stats_t st;
    ts_remote_event_t *events; /* grows; NULL when tracing is off */
    size_t n_events, cap_events;
    int trace;
    double t0;
    uint64_t rng;
    uint64_t degraded_at[64]; /* the first 64 degraded evaluations' numbers (1-based) */
    ts_remote_fail_t *fail;   /* (K) */
    double *eval_ms;          /* per evaluation wall time (grows) */
    size_t n_eval, cap_eval;
    void *impl;   /* remote.c's: the hedge timers and the attempts of the evaluation in progress */
    int accusing; /* accusations whose verdicts have not come back */
    ts_rpc_call_t *accusals[16]; /* their calls (a slot is NULL once its verdict is in) */
    /* What each replica's answers touched (ts_remote_track): the samples of the run, the first
     * sample of the chunk being evaluated (the jobs' rows count from it). */
    int track_n, row_base;
} ts_remote_t;

/* Prepares r for K experts (experts[k].rep[...] with addr set; peers are made here) of images
 * C×S×S. trace keeps every request as an event. TS_EINVAL with a sentence for an expert without
 * replicas or local weights that is not marked absent. */
int ts_remote_init(ts_remote_t *r, uv_loop_t *loop, ts_rpc_t *rpc, ts_remote_expert_t *experts,
                   int K, int channels, int size, const ts_remote_opts_t *o, int trace, char *err,
                   size_t errlen);
void ts_remote_free(ts_remote_t *r);
/* Runs the loop until every accusation sent has its verdict, for at most timeout_ms (a summary
 * then counts them; the nodes judge them whether or not this client waits). */
void ts_remote_settle(ts_remote_t *r, uint32_t timeout_ms);

/* Starts recording, for every replica, which of n samples its answers went into (row_base set by
 * the caller before each chunk); what was recorded before is cleared. TS_ENOMEM. */
int ts_remote_track(ts_remote_t *r, int n);
/* The samples an answer of a replica caught lying went into (suspect[i] = 1; n = track_n): the
 * ones to recompute with the liars banned. Returns how many. */
int ts_remote_suspects(const ts_remote_t *r, uint8_t *suspect);

/* ts_expert_eval_fn for ctx = ts_remote_t. */
int ts_remote_eval(void *ctx, ts_expert_job_t *jobs, int n);

#endif
