/*
 * objective.c — the objectives' conversions to flow velocity (objective.h).
 */
#include "model/objective.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "base/error.h"

static const char *const names[] = {"velocity", "epsilon", "v_prediction", "x0"};

const char *ts_objective_name(ts_objective_t o) {
    return (unsigned)o < sizeof names / sizeof names[0] ? names[o] : "unknown";
}

int ts_objective_parse(const char *name, ts_objective_t *out) {
    for (unsigned i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (ts_objective_t)i;
            return TS_OK;
        }
    return TS_EINVAL;
}

int ts_objective_wire(ts_objective_t o) {
    return (int)o + 1; /* the enum's order is the protocol's, from 1 */
}

int ts_objective_from_wire(int wire, ts_objective_t *out) {
    if (wire < 1 || wire > (int)(sizeof names / sizeof names[0]))
        return TS_EINVAL;
    *out = (ts_objective_t)(wire - 1);
    return TS_OK;
}

int ts_ddpm_linear(ts_ddpm_schedule_t *s, int n, double beta_start, double beta_end) {
    if (!s || n < 2 || n > TS_DDPM_MAX_STEPS || !(beta_start > 0.0) || !(beta_end < 1.0) ||
        !(beta_start <= beta_end))
        return TS_EINVAL;
    s->n = n;
    double abar = 1.0;
    for (int i = 0; i < n; i++) {
        double beta = beta_start + (beta_end - beta_start) * (double)i / (double)(n - 1);
        abar *= 1.0 - beta;
        s->abar[i] = abar;
    }
    return TS_OK;
}

double ts_ddpm_abar(const ts_ddpm_schedule_t *s, double step) {
    if (!(step > 0.0))
        return s->abar[0];
    if (step >= s->n - 1)
        return s->abar[s->n - 1];
    int i = (int)step;
    double f = step - i;
    return exp((1.0 - f) * log(s->abar[i]) + f * log(s->abar[i + 1]));
}

int ts_ddpm_from_flow(const ts_ddpm_schedule_t *s, double t, double *step, double *abar,
                      double *scale) {
    double a = (1.0 - t) * (1.0 - t), b = t * t;
    double want = a / (a + b);
    *scale = 1.0 / sqrt(a + b);
    if (want >= s->abar[0]) { /* less noise than the schedule's first step */
        *step = 0.0;
        *abar = s->abar[0];
        return want > s->abar[0];
    }
    if (want <= s->abar[s->n - 1]) { /* more than its last */
        *step = s->n - 1;
        *abar = s->abar[s->n - 1];
        return want < s->abar[s->n - 1];
    }
    /* ᾱ decreases with the step: the last step whose ᾱ is ≥ want, then log-linear within */
    int lo = 0, hi = s->n - 1;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (s->abar[mid] >= want)
            lo = mid;
        else
            hi = mid;
    }
    double l0 = log(s->abar[lo]), l1 = log(s->abar[hi]);
    double f = l0 == l1 ? 0.0 : (log(want) - l0) / (l1 - l0);
    *step = lo + f;
    *abar = want;
    return 0;
}

int ts_objective_to_velocity(ts_objective_t o, double t, double abar, double scale,
                             const float *x_t, const float *f, float *out, int64_t n) {
    if (!(t > 0.0 && t < 1.0) || !x_t || !f || !out || n < 0 ||
        (o != TS_OBJ_VELOCITY && !(abar > 0.0 && abar < 1.0 && scale > 0.0)))
        return TS_EINVAL;
    double ra = sqrt(abar), rb = sqrt(1.0 - abar);
    for (int64_t i = 0; i < n; i++) {
        double x = x_t[i], y = f[i], x0, eps;
        switch (o) {
        case TS_OBJ_VELOCITY: out[i] = f[i]; continue;
        case TS_OBJ_EPSILON:
            eps = y;
            x0 = (x - t * eps) / (1.0 - t);
            break;
        case TS_OBJ_V_PRED:
            x0 = ra * scale * x - rb * y;
            eps = rb * scale * x + ra * y;
            break;
        case TS_OBJ_X0:
            x0 = y;
            eps = (x - (1.0 - t) * x0) / t;
            break;
        default: return TS_EINVAL;
        }
        out[i] = (float)(eps - x0);
    }
    return TS_OK;
}

static ts_ddpm_schedule_t dit_schedule;
static pthread_once_t dit_once = PTHREAD_ONCE_INIT;
static void make_dit_schedule(void) { (void)ts_ddpm_linear(&dit_schedule, 1000, 1e-4, 0.02); }

const ts_ddpm_schedule_t *ts_ddpm_dit(void) {
    pthread_once(&dit_once, make_dit_schedule);
    return &dit_schedule;
}
