/*
 * remote_check.c — spot-checks of remote answers (client/remote.h): a fraction of the answers,
 * and every answer of a replica not vouched for yet, asked again of a second replica; agreeing
 * answers are trusted, a disagreement is decided by the cached weights or a third replica, and
 * the replica whose answer loses is banned for the run, its answer replaced.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "client/remote_internal.h"

/* Cancels the sends of a still in flight (their callbacks see `cancelling` and do nothing). */
static void cancel_inflight(attempt_t *a) {
    double now = ts_now_s();
    a->cancelling = 1;
    for (int i = 0; i < a->n_sends; i++)
        if (a->sends[i].call) {
            ts_remote_slower_than(&a->ex->rep[a->sends[i].replica],
                                  (now - a->sends[i].start) * 1e3);
            ts_rpc_cancel(a->sends[i].call);
        }
    a->cancelling = 0;
}

/* A replica to check an answer of class cls and precision prec with: one not asked yet, not
 * banned, of that class and precision (or whose class is not known yet) — preferred — or any
 * other. −1 when none is left. */
int ts_remote_pick_checker(attempt_t *a, const char *cls, uint8_t prec) {
    ts_remote_expert_t *ex = a->ex;
    double now = ts_now_s();
    int any = -1;
    for (int i = 0; i < ex->n_rep; i++) {
        const ts_replica_t *p = &ex->rep[i];
        if ((a->tried & (1u << i)) || p->banned_until > now || !p->peer)
            continue;
        if (p->precision == 0 || (p->precision == prec && strcmp(p->device_class, cls) == 0))
            return i;
        if (any < 0)
            any = i;
    }
    return any;
}

/* The largest |x − y| over n values, relative to max(1, max|y|). */
static double rel_diff(const float *x, const float *y, size_t n) {
    double d = 0.0, m = 1.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - (double)y[i]);
        d = e > d ? e : d;
        m = fabs((double)y[i]) > m ? fabs((double)y[i]) : m;
    }
    return d / m;
}

/* Whether two claims promise the same bits: one device class (the engine, the attention and the
 * build: serve.c) and one precision, on a CPU — whose rows are batch invariant; a GPU's are not
 * established, so GPU answers are compared within a tolerance. */
static int exact(const ts_answer_claim_t *cx, const ts_answer_claim_t *cy) {
    return cx->precision == cy->precision && strcmp(cx->device_class, cy->device_class) == 0 &&
           strncmp(cx->device_class, "cpu/", 4) == 0;
}

/* The tolerance between answers of two claims: fp32 both, or bf16/f16 on either side. */
static double tol_of(const ts_answer_claim_t *cx, const ts_answer_claim_t *cy) {
    return cx->precision == TESSERA__DTYPE__DTYPE_F32 && cy->precision == TESSERA__DTYPE__DTYPE_F32
               ? TS_REMOTE_TOL_F32
               : TS_REMOTE_TOL_LOW;
}

/* Whether two answers agree: bit for bit where their claims promise the same bits, within the
 * tolerance otherwise. */
static int agree(const float *x, const ts_answer_claim_t *cx, const float *y,
                 const ts_answer_claim_t *cy, size_t n) {
    if (exact(cx, cy))
        return memcmp(x, y, n * sizeof *x) == 0;
    return rel_diff(x, y, n) <= tol_of(cx, cy);
}

/* Whether x is wrong beyond doubt against y: any bit where the claims promise the same bits, else
 * more than ten times the tolerance (an honest answer just past it is never called a lie). */
static int far(const float *x, const ts_answer_claim_t *cx, const float *y,
               const ts_answer_claim_t *cy, size_t n) {
    if (exact(cx, cy))
        return memcmp(x, y, n * sizeof *x) != 0;
    return rel_diff(x, y, n) > 10.0 * tol_of(cx, cy);
}

/* Whether an agreement vouches for both replicas: the same bits, or fp32 within its tolerance (a
 * replica that claims bf16 is compared loosely, and is never vouched for by it). */
static int vouches(const ts_answer_claim_t *cx, const ts_answer_claim_t *cy) {
    return exact(cx, cy) || tol_of(cx, cy) == TS_REMOTE_TOL_F32;
}

/* Held answer slot k (m·chw floats). */
float *ts_remote_held(attempt_t *a, int k) {
    return a->held + (size_t)k * (size_t)a->job->m * (size_t)a->r->chw;
}

/* Replica i answered wrongly, as the check showed: never asked again by this client. */
static void caught(attempt_t *a, int i) {
    ts_replica_t *p = &a->ex->rep[i];
    p->lies++;
    p->banned_until = INFINITY;
    p->vouched = 0;
    if (a->r->st.liars++ == 0) {
        a->r->st.first_catch_requests = a->r->st.requests;
        a->r->st.first_catch_s = ts_now_s() - a->r->t0;
    }
    snprintf(a->note, sizeof a->note, "%.64s: a wrong answer, caught by a spot-check", p->addr);
}

/* Whether to check the answer just taken: every answer of a replica not vouched for yet, then at
 * the rate asked, when another replica can (a disagreement may then be decided by the cached
 * weights). On yes the answer is kept (slot 0) and the check is asked; 1 then. */
int ts_remote_check_start(attempt_t *a, int replica, const ts_answer_claim_t *c,
                          const uint8_t sig[TS_SIGNATURE_BYTES]) {
    ts_remote_t *r = a->r;
    /* every answer of a replica not vouched for yet is checked (one that lies on every answer
     * is caught at once, even with several answers in flight), then the drawn fraction */
    int first = !a->ex->rep[replica].vouched;
    if (r->o.verify_rate <= 0.0 ||
        (!first && (double)(ts_remote_rand(r) >> 11) * 0x1.0p-53 >= r->o.verify_rate))
        return 0;
    int i = ts_remote_pick_checker(a, c->device_class, c->precision);
    if (i < 0)
        return 0; /* nothing to check with: the cached weights alone do not make a check */
    size_t n = (size_t)a->job->m * (size_t)r->chw;
    if (a->cap_held < 3 * n) {
        float *h = realloc(a->held, 3 * n * sizeof *h);
        if (!h)
            return 0;
        a->held = h;
        a->cap_held = 3 * n;
    }
    uv_timer_stop(a->hedge_timer);
    cancel_inflight(a); /* a hedge still out: its answer is no longer wanted */
    memcpy(ts_remote_held(a, 0), a->job->v, n * sizeof(float));
    a->held_rep[0] = replica;
    a->held_claim[0] = *c;
    memcpy(a->held_sig[0], sig, TS_SIGNATURE_BYTES);
    a->phase = 1;
    a->retries_left = r->o.retries;
    r->st.checks++;
    a->ex->rep[replica].checked++;
    for (; i >= 0; i = ts_remote_pick_checker(a, c->device_class, c->precision)) {
        int rc = ts_remote_send_to(a, i, 0); /* a refusal marks it tried: the next */
        if (rc == TS_OK)
            return 1;
        if (rc == TS_ERANGE) /* no send left for this piece */
            break;
    }
    a->phase = 0; /* every checker refused at once: the answer stands unchecked */
    r->st.checks_failed++;
    return 0;
}

/* The check's answer k (1: the second replica's, 2: a tie-breaker's) is in slot k: agreeing
 * answers are trusted; a disagreement is broken by the cached weights or a third replica, and
 * the one that loses is caught. The job then holds the answer that stands. */
void ts_remote_check_judge(attempt_t *a, int k) {
    ts_remote_t *r = a->r;
    size_t n = (size_t)a->job->m * (size_t)r->chw;
    ts_answer_claim_t *c = a->held_claim;
    if (k == 1 && agree(ts_remote_held(a, 1), &c[1], ts_remote_held(a, 0), &c[0], n)) {
        r->st.checks_agreed++;
        if (vouches(&c[0], &c[1]))
            a->ex->rep[a->held_rep[0]].vouched = a->ex->rep[a->held_rep[1]].vouched = 1;
        ts_remote_finish(a, TS_OK); /* the job's v is the first answer */
        return;
    }
    if (k == 1) {
        r->st.mismatches++;
        if (a->ex->local) { /* the cached weights (fp32) decide: one answer within its
                             * tolerance of them, the other beyond ten times its own */
            ts_expert_job_t mine = *a->job;
            mine.v = ts_remote_held(a, 2);
            double t0 = ts_now_s();
            int rc = ts_expert_job_run(a->ex->local, &mine);
            r->st.local_runs++;
            r->st.local_s += ts_now_s() - t0;
            double d0 =
                rc == TS_OK ? rel_diff(ts_remote_held(a, 0), ts_remote_held(a, 2), n) : INFINITY;
            double d1 =
                rc == TS_OK ? rel_diff(ts_remote_held(a, 1), ts_remote_held(a, 2), n) : INFINITY;
            double t0s = c[0].precision == TESSERA__DTYPE__DTYPE_F32 ? TS_REMOTE_TOL_F32
                                                                       : TS_REMOTE_TOL_LOW;
            double t1s = c[1].precision == TESSERA__DTYPE__DTYPE_F32 ? TS_REMOTE_TOL_F32
                                                                       : TS_REMOTE_TOL_LOW;
            int liar = d0 <= t0s && d1 > 10.0 * t1s   ? 1
                       : d1 <= t1s && d0 > 10.0 * t0s ? 0
                                                      : -1;
            if (liar >= 0) {
                caught(a, a->held_rep[liar]);
                if (c[1 - liar].precision == TESSERA__DTYPE__DTYPE_F32)
                    a->ex->rep[a->held_rep[1 - liar]].vouched = 1;
                if (liar == 0)
                    memcpy(a->job->v, ts_remote_held(a, 1), n * sizeof(float));
                ts_remote_finish(a, TS_OK);
                return;
            }
        }
        a->phase = 2;
        a->retries_left = r->o.retries;
        for (int i = ts_remote_pick_checker(a, c[0].device_class, c[0].precision); i >= 0;
             i = ts_remote_pick_checker(a, c[0].device_class, c[0].precision)) {
            int rc = ts_remote_send_to(a, i, 0);
            if (rc == TS_OK)
                return;
            if (rc == TS_ERANGE)
                break;
        }
        r->st.undecided++;
        ts_remote_finish(a, TS_OK); /* nothing breaks the tie: the first answer stands, unproven */
        return;
    }
    float *h0 = ts_remote_held(a, 0), *h1 = ts_remote_held(a, 1), *h2 = ts_remote_held(a, 2);
    int liar = agree(h2, &c[2], h0, &c[0], n) && far(h1, &c[1], h2, &c[2], n)   ? 1
               : agree(h2, &c[2], h1, &c[1], n) && far(h0, &c[0], h2, &c[2], n) ? 0
                                                                                 : -1;
    if (liar >= 0) {
        caught(a, a->held_rep[liar]);
        if (vouches(&c[1 - liar], &c[2]))
            a->ex->rep[a->held_rep[1 - liar]].vouched = a->ex->rep[a->held_rep[2]].vouched = 1;
        if (liar == 0)
            memcpy(a->job->v, ts_remote_held(a, 1), n * sizeof(float));
    } else {
        r->st.undecided++;
    }
    ts_remote_finish(a, TS_OK);
}
