/*
 * objective.h — experts trained under different objectives, brought to one parameterisation.
 *
 * The sampler and the ensemble work in flow time: x_t = (1 − t)·x0 + t·ε, t ∈ (0, 1), and every
 * expert's contribution is a velocity v = ε − x0 (rectified flow, what tessera's experts learn).
 * Experts of the DDPM family (DiT's published checkpoints: ε-prediction under a linear β schedule
 * from 1e-4 to 0.02 over 1000 steps) learn at x_s = √ᾱ_s·x0 + √(1 − ᾱ_s)·ε. The two marginals are
 * the same distribution up to a scale: x_t · c = √ᾱ·x0 + √(1 − ᾱ)·ε with
 *
 *     ᾱ(t) = (1 − t)² / ((1 − t)² + t²),   c(t) = 1 / √((1 − t)² + t²)
 *
 * (equal signal-to-noise ratio). So a DDPM expert is asked at (c·x_t, s) where ᾱ_s = ᾱ(t) (s found
 * on the schedule, continuous between its integer steps by interpolating log ᾱ), and its answer
 * is converted to the velocity at (x_t, t):
 *
 *     ε-prediction:  ε̂ = f;                     x̂0 = (x_t − t·ε̂) / (1 − t)
 *     v-prediction:  x̂0 = √ᾱ·c·x_t − √(1−ᾱ)·f;  ε̂ = √(1−ᾱ)·c·x_t + √ᾱ·f   (Salimans & Ho)
 *     x0-prediction: x̂0 = f;                     ε̂ = (x_t − (1 − t)·x̂0) / t
 *
 * and v = ε̂ − x̂0. The maps are exact: an ensemble of analytic experts of each kind (Gaussian data,
 * where every optimal predictor is closed form) converts to the analytic velocity
 * (tests/test_objective.c). A flow time whose ᾱ lies outside the schedule's range (very near
 * t = 0 or t = 1) is clamped to the schedule's end and said so by the return value.
 */
#ifndef TS_MODEL_OBJECTIVE_H
#define TS_MODEL_OBJECTIVE_H

#include <stdint.h>

typedef enum {
    TS_OBJ_VELOCITY = 0, /* rectified flow: v = ε − x0, in flow time */
    TS_OBJ_EPSILON,      /* DDPM ε-prediction */
    TS_OBJ_V_PRED,       /* DDPM v-prediction: √ᾱ·ε − √(1 − ᾱ)·x0 */
    TS_OBJ_X0,           /* DDPM x0-prediction */
} ts_objective_t;

/* "velocity", "epsilon", "v_prediction", "x0"; ts_objective_parse: TS_OK or TS_EINVAL. */
const char *ts_objective_name(ts_objective_t o);
int ts_objective_parse(const char *name, ts_objective_t *out);

/* The protocol's number for o (proto/tessera.proto Objective: VELOCITY 1, EPSILON 2,
 * V_PREDICTION 3, X0 4), and back: TS_EINVAL for a number that names none. */
int ts_objective_wire(ts_objective_t o);
int ts_objective_from_wire(int wire, ts_objective_t *out);

#define TS_DDPM_MAX_STEPS 4096

/* A discrete DDPM schedule: ᾱ at steps 0..n−1 (decreasing). */
typedef struct ts_ddpm_schedule {
    int n;
    double abar[TS_DDPM_MAX_STEPS];
} ts_ddpm_schedule_t;

/* The linear β schedule: β_i from beta_start to beta_end over n steps (DiT: 1e-4, 0.02, 1000).
 * TS_EINVAL for n outside 2..TS_DDPM_MAX_STEPS or betas outside (0, 1) or not increasing. */
int ts_ddpm_linear(ts_ddpm_schedule_t *s, int n, double beta_start, double beta_end);

/* DiT's schedule (ts_ddpm_linear 1000, 1e-4, 0.02), made once per process: the default of the
 * DDIM/DDPM samplers and of DDPM experts in an ensemble. */
const ts_ddpm_schedule_t *ts_ddpm_dit(void);

/* ᾱ at continuous step s ∈ [0, n − 1] (log ᾱ interpolated linearly between steps). */
double ts_ddpm_abar(const ts_ddpm_schedule_t *s, double step);

/* Where the DDPM model is asked for flow time t ∈ (0, 1): the continuous step whose ᾱ equals
 * ᾱ(t), *abar (the schedule's ᾱ there) and *scale = c(t). Returns 0, or 1 when ᾱ(t) lies outside
 * the schedule and the step was clamped to its end (then *abar is the end's). */
int ts_ddpm_from_flow(const ts_ddpm_schedule_t *s, double t, double *step, double *abar,
                      double *scale);

/* The velocity at (x_t, t) from an expert's answer f under objective o, n values; for the DDPM
 * objectives abar and scale are those ts_ddpm_from_flow gave for t (the expert was asked at
 * scale·x_t). out may alias f. TS_EINVAL for t outside (0, 1) or a bad objective. */
int ts_objective_to_velocity(ts_objective_t o, double t, double abar, double scale,
                             const float *x_t, const float *f, float *out, int64_t n);

#endif
