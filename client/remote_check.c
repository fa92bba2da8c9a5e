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

/* Whether two answers agree: bit for bit where both claims name the same device class and
 * precision, within the tolerance of their precisions otherwise. */
static int agree(const float *x, const ts_answer_claim_t *cx, const float *y,
                 const ts_answer_claim_t *cy, size_t n) {
    if (cx->precision == cy->precision && strcmp(cx->device_class, cy->device_class) == 0)
        return memcmp(x, y, n * sizeof *x) == 0;
    int low =
        cx->precision != TESSERA__DTYPE__DTYPE_F32 || cy->precision != TESSERA__DTYPE__DTYPE_F32;
    return rel_diff(x, y, n) <= (low ? TS_REMOTE_TOL_LOW : TS_REMOTE_TOL_F32);
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
    if (a->r->st.liars++ == 0) {
        a->r->st.first_catch_requests = a->r->st.requests;
        a->r->st.first_catch_s = ts_now_s() - a->r->t0;
    }
    snprintf(a->note, sizeof a->note, "%.64s: a wrong answer, caught by a spot-check", p->addr);
}

/* Whether to check the answer just taken: at the rate asked, when a second replica or cached
 * weights can. On yes the answer is kept (slot 0) and the check is asked; 1 then. */
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
    if (ts_remote_send_to(a, i, 0) == TS_OK)
        return 1;
    a->phase = 0; /* refused at once: the answer stands unchecked */
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
        a->ex->rep[a->held_rep[0]].vouched = a->ex->rep[a->held_rep[1]].vouched = 1;
        ts_remote_finish(a, TS_OK); /* the job's v is the first answer */
        return;
    }
    if (k == 1) {
        r->st.mismatches++;
        if (a->ex->local) { /* the cached weights decide, within the fp32 tolerance */
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
            int low = c[0].precision != TESSERA__DTYPE__DTYPE_F32;
            double tol = low ? TS_REMOTE_TOL_LOW : TS_REMOTE_TOL_F32;
            if ((d0 <= tol) != (d1 <= tol)) {
                int liar = d0 <= tol ? 1 : 0;
                caught(a, a->held_rep[liar]);
                a->ex->rep[a->held_rep[1 - liar]].vouched = 1;
                if (liar == 0)
                    memcpy(a->job->v, ts_remote_held(a, 1), n * sizeof(float));
                ts_remote_finish(a, TS_OK);
                return;
            }
        }
        int i = ts_remote_pick_checker(a, c[0].device_class, c[0].precision);
        a->phase = 2;
        a->retries_left = r->o.retries;
        if (i >= 0 && ts_remote_send_to(a, i, 0) == TS_OK)
            return;
        r->st.undecided++;
        ts_remote_finish(a, TS_OK); /* nothing breaks the tie: the first answer stands, unproven */
        return;
    }
    int with0 = agree(ts_remote_held(a, 2), &c[2], ts_remote_held(a, 0), &c[0], n);
    int with1 = agree(ts_remote_held(a, 2), &c[2], ts_remote_held(a, 1), &c[1], n);
    if (with0 != with1) {
        int liar = with0 ? 1 : 0;
        caught(a, a->held_rep[liar]);
        a->ex->rep[a->held_rep[1 - liar]].vouched = a->ex->rep[a->held_rep[2]].vouched = 1;
        if (liar == 0)
            memcpy(a->job->v, ts_remote_held(a, 1), n * sizeof(float));
    } else {
        r->st.undecided++;
    }
    ts_remote_finish(a, TS_OK);
}
