/*
 * remote_internal.h — internal to client/remote.c and client/remote_check.c: one piece's
 * requests (an attempt), and what the spot-checks and the request path call of each other.
 */
#ifndef TS_CLIENT_REMOTE_INTERNAL_H
#define TS_CLIENT_REMOTE_INTERNAL_H

#include "client/remote.h"

/* requests one piece may make: the first, a hedge and retries (≤ 2 + retries), a check and a
 * tie-breaker with theirs; past it a send answers TS_ERANGE and the piece ends with what it has */
#define MAX_SENDS 24

typedef struct attempt attempt_t;

typedef struct send {
    attempt_t *a;
    ts_rpc_call_t *call; /* NULL once its callback has run */
    int replica, hedge;
    double start;
} send_t;

struct attempt {
    ts_remote_t *r;
    ts_expert_job_t *job;   /* this attempt's piece of a job: a view of its rows */
    ts_expert_job_t *whole; /* the job: its status is the worst of its pieces' */
    ts_expert_job_t piece;
    ts_remote_expert_t *ex;
    uv_timer_t *hedge_timer; /* this attempt slot's, owned by r */
    float *t;                /* (m) the piece's t, for the request */
    int cap_t;
    uint32_t tried; /* replicas asked, as bits */
    send_t sends[MAX_SENDS];
    int n_sends, inflight, retries_left, done, last_error;
    char note[200]; /* the last failure: node and reason (ts_remote_fail_t) */
    uint8_t req_hash[TS_ANSWER_HASH_BYTES]; /* the request's (net/answer.h), at the first send */
    int hashed, cancelling;
    /* A spot-check: phase 0 answering; 1 the same request asked of a second replica; 2 of a
     * third, to break a tie. held: (3, m·chw) the answers kept, with their replicas and signed
     * claims (the evidence). */
    int phase;
    float *held;
    size_t cap_held;
    int held_rep[3];
    ts_answer_claim_t held_claim[3];
    uint8_t held_sig[3][TS_SIGNATURE_BYTES];
};

/* Attempt slots (one per piece of a job of the evaluation in progress), each with its hedge
 * timer; they grow as needed and live until ts_remote_free. */
typedef struct remote_priv {
    attempt_t **att;
    int n_slots;
    int pending; /* pieces not done */
} remote_priv_t;

static inline remote_priv_t *priv(ts_remote_t *r) { return (remote_priv_t *)r->impl; }

/* Floats per sample in an answer to job j: C·H·W, twice that with its variance (with_sigma). */
static inline size_t ts_remote_row(const ts_remote_t *r, const ts_expert_job_t *j) {
    return (size_t)r->chw * (j->with_sigma ? 2u : 1u);
}

/* remote.c */
/* Replica p is not asked for ms from now (a ban never shortens, nor lifts a liar's). */
void ts_remote_ban(ts_replica_t *p, uint32_t ms);
uint64_t ts_remote_rand(ts_remote_t *r);
void ts_remote_slower_than(ts_replica_t *p, double ms);
int ts_remote_send_to(attempt_t *a, int i, int hedge);
/* The piece's request, as every replica asked is sent it (x: its x_t, which dr points to; xt:
 * the tensor x's shape points into). All three must outlive the use of dr. */
int ts_remote_request(const attempt_t *a, Tessera__DenoiseRequest *dr, Tessera__Tensor *x,
                      ts_tensor_t *xt);
void ts_remote_finish(attempt_t *a, int status);
/* Replica p's answer to the piece j went into its samples unproven (unchecked, or a check that
 * could not decide): they are recomputed if p is caught lying later (ts_remote_suspects). */
void ts_remote_touch(ts_remote_t *r, ts_replica_t *p, const ts_expert_job_t *j);

/* remote_check.c: the spot-checks */
/* Answer slot k of a check (m·chw floats). */
float *ts_remote_held(attempt_t *a, int k);
/* A replica to check an answer of class cls and precision prec with (−1: none left). */
int ts_remote_pick_checker(attempt_t *a, const char *cls, uint8_t prec);
/* Whether to check the answer just taken into the job; 1 when the check was asked. */
int ts_remote_check_start(attempt_t *a, int replica, const ts_answer_claim_t *c,
                          const uint8_t sig[TS_SIGNATURE_BYTES]);
/* The check's answer k is in slot k: decide, and finish the attempt or ask a tie-breaker. */
void ts_remote_check_judge(attempt_t *a, int k);

#endif
