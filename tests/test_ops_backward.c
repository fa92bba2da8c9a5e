/*
 * test_ops_backward.c — every backward op of kernels/ops.h against central finite differences of
 * its forward op, on a CPU engine with 2 threads.
 *
 * The scalar loss is L = Σ w ⊙ out with random weights w (so dout = w), evaluated in double from
 * the float outputs. For each input element x_i the test perturbs x_i to the floats x_i ± h and
 * takes fd_i = (L(x⁺) − L(x⁻)) / (x⁺ − x⁻), using the perturbation actually stored. Each gradient
 * element must satisfy
 *
 *     |fd_i − g_i| ≤ rtol·|g_i| + ftol·max_j |g_j| + 1e-6 + noise,
 *     noise = 4·FLT_EPSILON·(Σ|w ⊙ out⁺| + Σ|w ⊙ out⁻|) / (x⁺ − x⁻)
 *
 * where noise bounds what a few half-ulps of float round-off in each output can do to the
 * quotient (it matters only where the gradient itself is tiny). For the nonlinear ops
 * (layernorm, gelu, silu, softmax, attention composed and fused, timestep embedding) rtol = 2e-3, ftol = 5e-4 with
 * h = 1e-3..2e-3, and h = 1e-4 / 1e-6 on t for the timestep embedding at scale 10 / 1000 so
 * the phase moves as little (the O(h²) truncation is far below the tolerance); for the ops
 * linear in the perturbed input (linear, matmul, modulate, gate_residual, add_bcast, embedding,
 * patches, sum, mean, and mse, which is quadratic so central differences are exact) rtol = 2e-4,
 * ftol = 2e-5 with h = 1e-2. These pass over 20 different input seeds; a gradient off by 1 %
 * (nonlinear) or 0.1 % (linear) fails, and a wrong index, term or factor fails by far.
 *
 * Beyond the gradient values, each case checks the contract of ops.h: a backward ACCUMULATES
 * (called twice from zero it gives twice the gradient; called on a prefilled buffer it adds to
 * it) and a NULL gradient output is accepted and leaves the other gradients unchanged (a NULL
 * as an op's only gradient output may also be refused with TS_EINVAL).
 *
 * Not covered here: the forward values themselves (test_ops_forward.c).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/ops.h"
#include "tests/testutil.h"

/* ---- the finite-difference harness ----------------------------------------------------- */

#define MAX_IN 4

/* The step and tolerances of one check (see the top of the file). */
typedef struct {
    double h, rtol, ftol;
} grad_tol_t;

/* For the ops linear in the perturbed input, and for the nonlinear ones with step h. */
static const grad_tol_t LINEAR = {1e-2, 2e-4, 2e-5};
static grad_tol_t nonlinear(double h) { return (grad_tol_t){h, 2e-3, 5e-4}; }

/* One gradient check: a forward that recomputes `out` from the inputs, a backward that
 * accumulates into whichever of grads[] are non-NULL using dout (= the loss weights w). */
typedef struct grad_case {
    ts_engine_t *e;
    int (*forward)(struct grad_case *c);
    int (*backward)(struct grad_case *c);
    void *op;          /* op-specific arguments */
    ts_tensor_t *out;  /* the forward output the loss reads */
    ts_tensor_t *dout; /* w, same element count as out */
    grad_tol_t tol;
    int n_in;
    ts_tensor_t *in[MAX_IN];
    ts_tensor_t *grad[MAX_IN]; /* NULL: this input is not differentiated */
    const char *name[MAX_IN];
} grad_case_t;

/* A case without inputs yet (add them with add_input); op is passed to forward and backward. */
static grad_case_t grad_case(ts_engine_t *e, int (*forward)(grad_case_t *),
                             int (*backward)(grad_case_t *), void *op, ts_tensor_t *out,
                             ts_tensor_t *dout, grad_tol_t tol) {
    return (grad_case_t){e, forward, backward, op, out, dout, tol};
}

static void add_input(grad_case_t *c, const char *name, ts_tensor_t *in, ts_tensor_t *grad) {
    assert_true(c->n_in < MAX_IN);
    c->name[c->n_in] = name;
    c->in[c->n_in] = in;
    c->grad[c->n_in] = grad;
    c->n_in++;
}

/* L = Σ w ⊙ out after a forward; *absum = Σ |w ⊙ out|, the scale of L's float round-off. */
static double loss_of(grad_case_t *c, double *absum) {
    TU_CHECK_OK(c->forward(c));
    double L = 0.0, A = 0.0;
    int64_t n = ts_tensor_numel(c->out);
    for (int64_t i = 0; i < n; i++) {
        double term = (double)tu_f32(c->dout)[i] * (double)tu_f32(c->out)[i];
        L += term;
        A += fabs(term);
    }
    *absum = A;
    return L;
}

static void zero_grads(grad_case_t *c) {
    for (int k = 0; k < c->n_in; k++)
        if (c->grad[k])
            memset(c->grad[k]->data, 0, ts_tensor_nbytes(c->grad[k]));
}

/* Checks c's backward against central differences of its forward, then the accumulation and
 * NULL-output contracts; the printf-style description names the case in failures. */
static void run_grad_case(grad_case_t *c, const char *fmt, ...) TU_PRINTF(2, 3);
static void run_grad_case(grad_case_t *c, const char *fmt, ...) {
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    float *g1[MAX_IN] = {0};

    /* analytic gradients from zero */
    TU_CHECK_OK(c->forward(c));
    zero_grads(c);
    TU_CHECK_OK(c->backward(c));
    for (int k = 0; k < c->n_in; k++)
        if (c->grad[k])
            g1[k] = tu_host_copy(c->grad[k]);

    /* central differences, input by input, element by element */
    for (int k = 0; k < c->n_in; k++) {
        if (!c->grad[k])
            continue;
        int64_t n = ts_tensor_numel(c->in[k]);
        double gmax = 0.0;
        for (int64_t i = 0; i < n; i++)
            gmax = fmax(gmax, fabs((double)g1[k][i]));
        double worst = 0.0;
        int64_t worst_i = -1;
        double worst_fd = 0.0;
        for (int64_t i = 0; i < n; i++) {
            float *x = &tu_f32(c->in[k])[i];
            float x0 = *x;
            float xp = (float)((double)x0 + c->tol.h), xm = (float)((double)x0 - c->tol.h);
            double Ap, Am;
            *x = xp;
            double Lp = loss_of(c, &Ap);
            *x = xm;
            double Lm = loss_of(c, &Am);
            *x = x0;
            double fd = (Lp - Lm) / ((double)xp - (double)xm);
            double g = g1[k][i];
            /* each float output carries a few half-ulps of round-off: bound its effect */
            double noise = 4.0 * FLT_EPSILON * (Ap + Am) / ((double)xp - (double)xm);
            double lim = c->tol.rtol * fabs(g) + c->tol.ftol * gmax + 1e-6 + noise;
            double excess = fabs(fd - g) / lim;
            if (!(excess <= 1.0) && (worst_i < 0 || !(excess <= worst))) {
                worst = excess;
                worst_i = i;
                worst_fd = fd;
            }
        }
        if (worst_i >= 0) {
            print_error("%s: d%s[%lld] = %.7g, finite difference %.7g (h %g; tolerance %g·|g| + "
                        "%g·max|g| with max|g| = %.4g)\n",
                        what, c->name[k], (long long)worst_i, g1[k][worst_i], worst_fd, c->tol.h,
                        c->tol.rtol, c->tol.ftol, gmax);
            fail();
        }
    }
    TU_CHECK_OK(c->forward(c)); /* restore the saved activations at the unperturbed inputs */

    /* accumulation: twice from zero gives 2·g; on a prefilled buffer, prefill + g */
    zero_grads(c);
    TU_CHECK_OK(c->backward(c));
    TU_CHECK_OK(c->backward(c));
    for (int k = 0; k < c->n_in; k++) {
        if (!c->grad[k])
            continue;
        int64_t n = ts_tensor_numel(c->grad[k]);
        float *twice = tu_floats(n);
        for (int64_t i = 0; i < n; i++)
            twice[i] = 2.0f * g1[k][i];
        tu_check_close(tu_f32(c->grad[k]), twice, n, 1e-6, 1e-5,
                       "%s: backward called twice does not double, d%s", what, c->name[k]);
        free(twice);
    }
    tu_rng_t r = {99};
    float *pre[MAX_IN] = {0};
    for (int k = 0; k < c->n_in; k++)
        if (c->grad[k]) {
            tu_fill_uniform(&r, c->grad[k], -1, 1);
            pre[k] = tu_host_copy(c->grad[k]);
        }
    TU_CHECK_OK(c->backward(c));
    for (int k = 0; k < c->n_in; k++) {
        if (!c->grad[k])
            continue;
        int64_t n = ts_tensor_numel(c->grad[k]);
        for (int64_t i = 0; i < n; i++)
            pre[k][i] += g1[k][i];
        tu_check_close(tu_f32(c->grad[k]), pre[k], n, 1e-5, 1e-5,
                       "%s: backward does not add to a prefilled gradient, d%s", what, c->name[k]);
        free(pre[k]);
    }

    /* a NULL gradient output is accepted and the others are still right. When it is the op's
     * only gradient output there is nothing left to compute: the call may then do nothing
     * (TS_OK) or refuse (TS_EINVAL), but must not crash. */
    int n_grads = 0;
    for (int k = 0; k < c->n_in; k++)
        n_grads += c->grad[k] != NULL;
    for (int skip = 0; skip < c->n_in; skip++) {
        if (!c->grad[skip])
            continue;
        ts_tensor_t *saved = c->grad[skip];
        c->grad[skip] = NULL;
        zero_grads(c);
        int rc = c->backward(c);
        if (rc != TS_OK && !(n_grads == 1 && rc == TS_EINVAL)) {
            print_error("%s: backward with d%s = NULL returned %d (%s)\n", what, c->name[skip], rc,
                        ts_strerror(rc));
            fail();
        }
        for (int k = 0; k < c->n_in; k++)
            if (c->grad[k])
                tu_check_close(tu_f32(c->grad[k]), g1[k], ts_tensor_numel(c->grad[k]), 1e-6, 1e-5,
                               "%s: with d%s = NULL, d%s", what, c->name[skip], c->name[k]);
        c->grad[skip] = saved;
    }
    for (int k = 0; k < c->n_in; k++)
        free(g1[k]);
}

/* ---- linear and matmul ----------------------------------------------------------------- */

static int linear_fwd(grad_case_t *c) {
    return ts_linear_forward(c->e, c->out, c->in[0], c->in[1], c->n_in > 2 ? c->in[2] : NULL);
}

static int linear_bwd(grad_case_t *c) {
    return ts_linear_backward(c->e, c->grad[0], c->grad[1], c->n_in > 2 ? c->grad[2] : NULL,
                              c->dout, c->in[0], c->in[1]);
}

static void test_linear_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][4] = {/* B, T (0: 2-D input), K, N */
                                       {3, 0, 4, 5},
                                       {2, 3, 5, 2},
                                       {1, 0, 1, 1},
                                       {5, 0, 3, 7}};
    tu_rng_t r = {21};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            int64_t B = cases[s][0], T = cases[s][1], K = cases[s][2], N = cases[s][3];
            ts_tensor_t inp, w, b, out, dout, dinp, dw, db;
            if (T > 0) {
                tu_alloc_f32(&inp, 3, TS_SHAPE(B, T, K));
                tu_alloc_f32(&out, 3, TS_SHAPE(B, T, N));
            } else {
                tu_alloc_f32(&inp, 2, TS_SHAPE(B, K));
                tu_alloc_f32(&out, 2, TS_SHAPE(B, N));
            }
            tu_alloc_f32(&w, 2, TS_SHAPE(N, K));
            tu_alloc_f32(&b, 1, TS_SHAPE(N));
            tu_alloc_like(&dout, &out);
            tu_alloc_like(&dinp, &inp);
            tu_alloc_like(&dw, &w);
            tu_alloc_like(&db, &b);
            tu_fill_uniform(&r, &inp, -1, 1);
            tu_fill_uniform(&r, &w, -1, 1);
            tu_fill_uniform(&r, &b, -1, 1);
            tu_fill_uniform(&r, &dout, -1, 1);
            grad_case_t c = grad_case(e, linear_fwd, linear_bwd, NULL, &out, &dout, LINEAR);
            add_input(&c, "inp", &inp, &dinp);
            add_input(&c, "weight", &w, &dw);
            if (with_bias)
                add_input(&c, "bias", &b, &db);
            run_grad_case(&c, "linear_backward B=%lld T=%lld K=%lld N=%lld %s bias", (long long)B,
                          (long long)T, (long long)K, (long long)N, with_bias ? "with" : "without");
            TU_FREE_TENSORS(&inp, &w, &b, &out, &dout, &dinp, &dw, &db);
        }
    }
}

typedef struct {
    int ta, tb;
    float alpha;
} matmul_args_t;

static int matmul_fwd(grad_case_t *c) {
    const matmul_args_t *m = c->op;
    return ts_matmul(c->e, c->out, c->in[0], m->ta, c->in[1], m->tb, m->alpha, 0.0f);
}

static int matmul_bwd(grad_case_t *c) {
    const matmul_args_t *m = c->op;
    return ts_matmul_backward(c->e, c->grad[0], c->grad[1], c->dout, c->in[0], m->ta, c->in[1],
                              m->tb, m->alpha);
}

static void test_matmul_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][4] = {/* batch (0: 2-D), M, N, K */
                                       {0, 3, 4, 5},
                                       {0, 1, 1, 1},
                                       {2, 3, 2, 4},
                                       {3, 2, 5, 1}};
    static const float alphas[] = {1.0f, 1.5f};
    tu_rng_t r = {22};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int64_t bt = cases[s][0], M = cases[s][1], N = cases[s][2], K = cases[s][3];
                float alpha = alphas[(ta + tb + (int)s) % 2];
                ts_tensor_t a, b, cc, dc, da, db;
                int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
                tu_alloc_f32_batch(&a, bt, ar, ac);
                tu_alloc_f32_batch(&b, bt, br, bc);
                tu_alloc_f32_batch(&cc, bt, M, N);
                tu_alloc_like(&dc, &cc);
                tu_alloc_like(&da, &a);
                tu_alloc_like(&db, &b);
                tu_fill_uniform(&r, &a, -1, 1);
                tu_fill_uniform(&r, &b, -1, 1);
                tu_fill_uniform(&r, &dc, -1, 1);
                matmul_args_t args = {ta, tb, alpha};
                grad_case_t c = grad_case(e, matmul_fwd, matmul_bwd, &args, &cc, &dc, LINEAR);
                add_input(&c, "a", &a, &da);
                add_input(&c, "b", &b, &db);
                run_grad_case(&c,
                              "matmul_backward batch=%lld M=%lld N=%lld K=%lld "
                              "trans_a=%d trans_b=%d alpha=%g",
                              (long long)bt, (long long)M, (long long)N, (long long)K, ta, tb,
                              alpha);
                TU_FREE_TENSORS(&a, &b, &cc, &dc, &da, &db);
            }
}

/* ---- normalisation and activations ------------------------------------------------------ */

typedef struct {
    ts_tensor_t *mean, *rstd;
} ln_args_t;

static int layernorm_fwd(grad_case_t *c) {
    ln_args_t *a = c->op;
    return ts_layernorm_forward(c->e, c->out, a->mean, a->rstd, c->in[0]);
}

static int layernorm_bwd(grad_case_t *c) {
    ln_args_t *a = c->op;
    return ts_layernorm_backward(c->e, c->grad[0], c->dout, c->in[0], a->mean, a->rstd);
}

static void test_layernorm_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][3] = {{3, 1, 5}, {2, 2, 8}, {1, 1, 2}, {2, 1, 1}, {3, 1, 33}};
    tu_rng_t r = {23};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t R = cases[s][0] * cases[s][1], C = cases[s][2];
        ts_tensor_t inp, out, dout, dinp, mean, rstd;
        tu_alloc_f32(&inp, 3, TS_SHAPE(cases[s][0], cases[s][1], C));
        tu_alloc_like(&out, &inp);
        tu_alloc_like(&dout, &inp);
        tu_alloc_like(&dinp, &inp);
        tu_alloc_f32(&mean, 1, TS_SHAPE(R));
        tu_alloc_f32(&rstd, 1, TS_SHAPE(R));
        tu_fill_uniform(&r, &inp, -2, 2);
        tu_fill_uniform(&r, &dout, -1, 1);
        ln_args_t args = {&mean, &rstd};
        grad_case_t c =
            grad_case(e, layernorm_fwd, layernorm_bwd, &args, &out, &dout, nonlinear(1e-3));
        add_input(&c, "inp", &inp, &dinp);
        run_grad_case(&c, "layernorm_backward R=%lld C=%lld", (long long)R, (long long)C);
        TU_FREE_TENSORS(&inp, &out, &dout, &dinp, &mean, &rstd);
    }
}

typedef int (*unary_fwd_t)(ts_engine_t *, ts_tensor_t *, const ts_tensor_t *);
typedef int (*unary_bwd_t)(ts_engine_t *, ts_tensor_t *, const ts_tensor_t *, const ts_tensor_t *);

typedef struct {
    unary_fwd_t fwd;
    unary_bwd_t bwd;
    int from_output; /* softmax's backward reads the forward output, the others the input */
} unary_args_t;

static int unary_fwd(grad_case_t *c) {
    unary_args_t *u = c->op;
    return u->fwd(c->e, c->out, c->in[0]);
}

static int unary_bwd(grad_case_t *c) {
    unary_args_t *u = c->op;
    return u->bwd(c->e, c->grad[0], c->dout, u->from_output ? c->out : c->in[0]);
}

static void check_unary_backward(ts_engine_t *e, const char *name, unary_args_t *u, int64_t R,
                                 int64_t C, float lo, float hi, uint64_t seed) {
    tu_rng_t r = {seed};
    ts_tensor_t inp, out, dout, dinp;
    tu_alloc_f32(&inp, 2, TS_SHAPE(R, C));
    tu_alloc_like(&out, &inp);
    tu_alloc_like(&dout, &inp);
    tu_alloc_like(&dinp, &inp);
    tu_fill_uniform(&r, &inp, lo, hi);
    tu_fill_uniform(&r, &dout, -1, 1);
    grad_case_t c = grad_case(e, unary_fwd, unary_bwd, u, &out, &dout, nonlinear(1e-3));
    add_input(&c, "inp", &inp, &dinp);
    run_grad_case(&c, "%s_backward R=%lld C=%lld", name, (long long)R, (long long)C);
    TU_FREE_TENSORS(&inp, &out, &dout, &dinp);
}

static void test_gelu_backward(void **state) {
    unary_args_t u = {ts_gelu_forward, ts_gelu_backward, 0};
    check_unary_backward(*state, "gelu", &u, 3, 7, -4, 4, 24);
    check_unary_backward(*state, "gelu", &u, 1, 1, -1, 1, 25);
}

static void test_silu_backward(void **state) {
    unary_args_t u = {ts_silu_forward, ts_silu_backward, 0};
    check_unary_backward(*state, "silu", &u, 3, 7, -5, 5, 26);
    check_unary_backward(*state, "silu", &u, 1, 1, -1, 1, 27);
}

static void test_softmax_backward(void **state) {
    unary_args_t u = {ts_softmax_forward, ts_softmax_backward, 1};
    check_unary_backward(*state, "softmax", &u, 3, 7, -3, 3, 28);
    check_unary_backward(*state, "softmax", &u, 5, 2, -3, 3, 29);
    check_unary_backward(*state, "softmax", &u, 1, 16, -2, 2, 30);
}

/* ---- attention ------------------------------------------------------------------------- */

typedef struct {
    ts_tensor_t *att, *datt;
    int heads;
} att_args_t;

static int attention_fwd(grad_case_t *c) {
    att_args_t *a = c->op;
    return ts_attention_forward(c->e, c->out, a->att, c->in[0], a->heads);
}

static int attention_bwd(grad_case_t *c) {
    att_args_t *a = c->op;
    /* datt is scratch: garbage in it must not leak into the gradient */
    int64_t n = ts_tensor_numel(a->datt);
    for (int64_t i = 0; i < n; i++)
        tu_f32(a->datt)[i] = 1e3f;
    return ts_attention_backward(c->e, c->grad[0], a->datt, c->dout, c->in[0], a->att, a->heads);
}

static void test_attention_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][4] = {/* B, T, C, heads */
                                       {2, 5, 8, 2},
                                       {1, 3, 6, 3},
                                       {1, 1, 4, 1},
                                       {1, 4, 4, 1}};
    tu_rng_t r = {31};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t B = cases[s][0], T = cases[s][1], C = cases[s][2], H = cases[s][3];
        ts_tensor_t qkv, out, dout, dqkv, att, datt;
        tu_alloc_f32(&qkv, 3, TS_SHAPE(B, T, 3 * C));
        tu_alloc_f32(&out, 3, TS_SHAPE(B, T, C));
        tu_alloc_like(&dout, &out);
        tu_alloc_like(&dqkv, &qkv);
        tu_alloc_f32(&att, 4, TS_SHAPE(B, H, T, T));
        tu_alloc_like(&datt, &att);
        tu_fill_uniform(&r, &qkv, -1.5f, 1.5f);
        tu_fill_uniform(&r, &dout, -1, 1);
        att_args_t args = {&att, &datt, (int)H};
        grad_case_t c =
            grad_case(e, attention_fwd, attention_bwd, &args, &out, &dout, nonlinear(2e-3));
        add_input(&c, "qkv", &qkv, &dqkv);
        run_grad_case(&c, "attention_backward B=%lld T=%lld C=%lld heads=%lld", (long long)B,
                      (long long)T, (long long)C, (long long)H);
        TU_FREE_TENSORS(&qkv, &out, &dout, &dqkv, &att, &datt);
    }
}

/* The fused attention: its backward recomputes the weights from the forward's lse. */
static int attention_fused_fwd(grad_case_t *c) {
    att_args_t *a = c->op;
    return ts_attention_fused_forward(c->e, c->out, a->att, c->in[0], a->heads);
}

static int attention_fused_bwd(grad_case_t *c) {
    att_args_t *a = c->op;
    return ts_attention_fused_backward(c->e, c->grad[0], c->dout, c->in[0], c->out, a->att,
                                       a->heads);
}

static void test_attention_fused_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][4] = {/* B, T, C, heads */
                                       {2, 5, 8, 2},
                                       {1, 3, 6, 3},
                                       {1, 1, 4, 1},
                                       {1, 9, 6, 1}};
    tu_rng_t r = {37};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t B = cases[s][0], T = cases[s][1], C = cases[s][2], H = cases[s][3];
        ts_tensor_t qkv, out, dout, dqkv, lse;
        tu_alloc_f32(&qkv, 3, TS_SHAPE(B, T, 3 * C));
        tu_alloc_f32(&out, 3, TS_SHAPE(B, T, C));
        tu_alloc_like(&dout, &out);
        tu_alloc_like(&dqkv, &qkv);
        tu_alloc_f32(&lse, 3, TS_SHAPE(B, H, T));
        tu_fill_uniform(&r, &qkv, -1.5f, 1.5f);
        tu_fill_uniform(&r, &dout, -1, 1);
        att_args_t args = {&lse, NULL, (int)H}; /* att holds the lse here */
        grad_case_t c = grad_case(e, attention_fused_fwd, attention_fused_bwd, &args, &out, &dout,
                                  nonlinear(2e-3));
        add_input(&c, "qkv", &qkv, &dqkv);
        run_grad_case(&c, "attention_fused_backward B=%lld T=%lld C=%lld heads=%lld", (long long)B,
                      (long long)T, (long long)C, (long long)H);
        TU_FREE_TENSORS(&qkv, &out, &dout, &dqkv, &lse);
    }
}

/* ---- adaLN pieces ---------------------------------------------------------------------- */

typedef struct {
    int i0, i1;
} idx_args_t;

static int modulate_fwd(grad_case_t *c) {
    idx_args_t *a = c->op;
    return ts_modulate_forward(c->e, c->out, c->in[0], c->in[1], a->i0, a->i1);
}

static int modulate_bwd(grad_case_t *c) {
    idx_args_t *a = c->op;
    return ts_modulate_backward(c->e, c->grad[0], c->grad[1], c->dout, c->in[0], c->in[1], a->i0,
                                a->i1);
}

static void test_modulate_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][6] = {/* B, T, C, M, shift, scale */
                                       {2, 3, 4, 3, 2, 0},
                                       {1, 1, 1, 2, 0, 1},
                                       {3, 5, 2, 6, 3, 4}};
    tu_rng_t r = {32};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t B = cases[s][0], T = cases[s][1], C = cases[s][2], M = cases[s][3];
        ts_tensor_t x, mod, out, dout, dx, dmod;
        tu_alloc_f32(&x, 3, TS_SHAPE(B, T, C));
        tu_alloc_f32(&mod, 2, TS_SHAPE(B, M * C));
        tu_alloc_like(&out, &x);
        tu_alloc_like(&dout, &x);
        tu_alloc_like(&dx, &x);
        tu_alloc_like(&dmod, &mod);
        tu_fill_uniform(&r, &x, -2, 2);
        tu_fill_uniform(&r, &mod, -1, 1);
        tu_fill_uniform(&r, &dout, -1, 1);
        idx_args_t args = {(int)cases[s][4], (int)cases[s][5]};
        grad_case_t c = grad_case(e, modulate_fwd, modulate_bwd, &args, &out, &dout, LINEAR);
        add_input(&c, "x", &x, &dx);
        add_input(&c, "mod", &mod, &dmod);
        run_grad_case(&c,
                      "modulate_backward B=%lld T=%lld C=%lld M=%lld shift=%d "
                      "scale=%d",
                      (long long)B, (long long)T, (long long)C, (long long)M, args.i0, args.i1);
        TU_FREE_TENSORS(&x, &mod, &out, &dout, &dx, &dmod);
    }
}

static int gate_fwd(grad_case_t *c) {
    idx_args_t *a = c->op;
    return ts_gate_residual_forward(c->e, c->out, c->in[0], c->in[1], c->in[2], a->i0);
}

static int gate_bwd(grad_case_t *c) {
    idx_args_t *a = c->op;
    return ts_gate_residual_backward(c->e, c->grad[0], c->grad[1], c->grad[2], c->dout, c->in[1],
                                     c->in[2], a->i0);
}

static void test_gate_residual_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][5] = {/* B, T, C, M, gate */
                                       {2, 3, 4, 2, 1},
                                       {1, 1, 1, 1, 0},
                                       {3, 5, 2, 6, 5}};
    tu_rng_t r = {33};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t B = cases[s][0], T = cases[s][1], C = cases[s][2], M = cases[s][3];
        ts_tensor_t res, y, mod, out, dout, dres, dy, dmod;
        tu_alloc_f32(&res, 3, TS_SHAPE(B, T, C));
        tu_alloc_like(&y, &res);
        tu_alloc_f32(&mod, 2, TS_SHAPE(B, M * C));
        tu_alloc_like(&out, &res);
        tu_alloc_like(&dout, &res);
        tu_alloc_like(&dres, &res);
        tu_alloc_like(&dy, &res);
        tu_alloc_like(&dmod, &mod);
        tu_fill_uniform(&r, &res, -2, 2);
        tu_fill_uniform(&r, &y, -2, 2);
        tu_fill_uniform(&r, &mod, -1, 1);
        tu_fill_uniform(&r, &dout, -1, 1);
        idx_args_t args = {(int)cases[s][4], 0};
        grad_case_t c = grad_case(e, gate_fwd, gate_bwd, &args, &out, &dout, LINEAR);
        add_input(&c, "res", &res, &dres);
        add_input(&c, "y", &y, &dy);
        add_input(&c, "mod", &mod, &dmod);
        run_grad_case(&c, "gate_residual_backward B=%lld T=%lld C=%lld M=%lld gate=%d",
                      (long long)B, (long long)T, (long long)C, (long long)M, args.i0);
        TU_FREE_TENSORS(&res, &y, &mod, &out, &dout, &dres, &dy, &dmod);
    }
}

/* ---- add_bcast ------------------------------------------------------------------------- */

static int bcast_fwd(grad_case_t *c) {
    return ts_add_bcast_forward(c->e, c->out, c->in[0], c->in[1]);
}

static int bcast_bwd(grad_case_t *c) {
    return ts_add_bcast_backward(c->e, c->grad[0], c->grad[1], c->dout);
}

static void test_add_bcast_backward(void **state) {
    ts_engine_t *e = *state;
    tu_rng_t r = {34};
    static const int64_t cases[][4] = {
        /* x (a, b, c), S */ {3, 4, 5, 20}, {1, 6, 4, 4}, {2, 3, 1, 1}, {5, 1, 3, 3}};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        ts_tensor_t x, b, out, dout, dx, db;
        tu_alloc_f32(&x, 3, TS_SHAPE(cases[s][0], cases[s][1], cases[s][2]));
        tu_alloc_f32(&b, 1, TS_SHAPE(cases[s][3]));
        tu_alloc_like(&out, &x);
        tu_alloc_like(&dout, &x);
        tu_alloc_like(&dx, &x);
        tu_alloc_like(&db, &b);
        tu_fill_uniform(&r, &x, -1, 1);
        tu_fill_uniform(&r, &b, -1, 1);
        tu_fill_uniform(&r, &dout, -1, 1);
        grad_case_t c = grad_case(e, bcast_fwd, bcast_bwd, NULL, &out, &dout, LINEAR);
        add_input(&c, "x", &x, &dx);
        add_input(&c, "b", &b, &db);
        run_grad_case(&c, "add_bcast_backward x=(%lld,%lld,%lld) S=%lld", (long long)cases[s][0],
                      (long long)cases[s][1], (long long)cases[s][2], (long long)cases[s][3]);
        TU_FREE_TENSORS(&x, &b, &out, &dout, &dx, &db);
    }
}

/* ---- embeddings ------------------------------------------------------------------------ */

static int temb_fwd(grad_case_t *c) {
    return ts_timestep_embedding_forward(c->e, c->out, c->in[0], *(const float *)c->op);
}

static int temb_bwd(grad_case_t *c) {
    return ts_timestep_embedding_backward(c->e, c->grad[0], c->dout, c->in[0],
                                          *(const float *)c->op);
}

static void test_timestep_embedding_backward(void **state) {
    ts_engine_t *e = *state;
    /* scale, t range, h: the DiT scale 1000 needs small t to keep the phase steps small */
    static const struct {
        float scale, lo, hi;
        double h;
        int64_t D;
    } cases[] = {{1.0f, -2.0f, 2.0f, 1e-3, 8},
                 {1.0f, -2.0f, 2.0f, 1e-3, 7},
                 {10.0f, 0.0f, 1.0f, 1e-4, 16},
                 {1000.0f, -1e-3f, 1e-3f, 1e-6, 9},
                 {1.0f, -1.0f, 1.0f, 1e-3, 2}};
    tu_rng_t r = {35};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t B = 4, D = cases[s].D;
        float scale = cases[s].scale;
        ts_tensor_t t, out, dout, dt;
        tu_alloc_f32(&t, 1, TS_SHAPE(B));
        tu_alloc_f32(&out, 2, TS_SHAPE(B, D));
        tu_alloc_like(&dout, &out);
        tu_alloc_like(&dt, &t);
        tu_fill_uniform(&r, &t, cases[s].lo, cases[s].hi);
        tu_fill_uniform(&r, &dout, -1, 1);
        grad_case_t c =
            grad_case(e, temb_fwd, temb_bwd, &scale, &out, &dout, nonlinear(cases[s].h));
        add_input(&c, "t", &t, &dt);
        run_grad_case(&c, "timestep_embedding_backward D=%lld scale=%g", (long long)D, scale);
        TU_FREE_TENSORS(&t, &out, &dout, &dt);
    }
}

static int emb_fwd(grad_case_t *c) {
    return ts_embedding_forward(c->e, c->out, c->in[0], (const ts_tensor_t *)c->op);
}

static int emb_bwd(grad_case_t *c) {
    return ts_embedding_backward(c->e, c->grad[0], c->dout, (const ts_tensor_t *)c->op);
}

static void test_embedding_backward(void **state) {
    ts_engine_t *e = *state;
    static const int32_t idv[] = {1, 4, 1, 0, 1, 4}; /* repeats; rows 2 and 3 unused */
    tu_rng_t r = {36};
    int64_t V = 5, D = 3, B = 6;
    ts_tensor_t table, ids, out, dout, dtable;
    tu_alloc_f32(&table, 2, TS_SHAPE(V, D));
    tu_alloc_f32(&out, 2, TS_SHAPE(B, D));
    tu_alloc_like(&dout, &out);
    tu_alloc_like(&dtable, &table);
    assert_int_equal(ts_tensor_alloc(&ids, TS_I32, TS_CPU, 1, TS_SHAPE(B)), TS_OK);
    memcpy(ids.data, idv, sizeof idv);
    tu_fill_uniform(&r, &table, -1, 1);
    tu_fill_uniform(&r, &dout, -1, 1);
    grad_case_t c = grad_case(e, emb_fwd, emb_bwd, &ids, &out, &dout, LINEAR);
    add_input(&c, "table", &table, &dtable);
    run_grad_case(&c, "embedding_backward V=5 D=3 B=6 (repeated ids)");
    /* row 1 is picked three times: its gradient is the sum of three dout rows */
    TU_CHECK_OK(ts_zero(e, &dtable));
    TU_CHECK_OK(ts_embedding_backward(e, &dtable, &dout, &ids));
    for (int64_t d = 0; d < D; d++) {
        double want =
            (double)tu_f32(&dout)[0 * D + d] + tu_f32(&dout)[2 * D + d] + tu_f32(&dout)[4 * D + d];
        assert_true(fabs(tu_f32(&dtable)[1 * D + d] - want) < 1e-6);
        assert_true(tu_f32(&dtable)[2 * D + d] == 0.0f && tu_f32(&dtable)[3 * D + d] == 0.0f);
    }
    /* prechecked: the same sums, the ids not read back (e->host_reads unmoved); a bad id is the
     * checked op's TS_ERANGE */
    ts_tensor_free(&out);
    tu_alloc_like(&out, &table); /* out: the prechecked op's dtable */
    TU_CHECK_OK(ts_zero(e, &out));
    uint64_t reads = e->host_reads;
    TU_CHECK_OK(ts_embedding_backward_prechecked(e, &out, &dout, &ids));
    assert_int_equal(e->host_reads, reads);
    assert_memory_equal(out.data, dtable.data, ts_tensor_nbytes(&dtable));
    ((int32_t *)ids.data)[3] = (int32_t)V;
    assert_int_equal(ts_embedding_backward(e, &dtable, &dout, &ids), TS_ERANGE);
    assert_int_equal(e->host_reads, reads + 1);
    TU_FREE_TENSORS(&table, &ids, &out, &dout, &dtable);
}

/* ---- patches --------------------------------------------------------------------------- */

static int patchify_fwd(grad_case_t *c) {
    return ts_patchify_forward(c->e, c->out, c->in[0], *(const int *)c->op);
}

static int patchify_bwd(grad_case_t *c) {
    return ts_patchify_backward(c->e, c->grad[0], c->dout, *(const int *)c->op);
}

static int unpatchify_fwd(grad_case_t *c) {
    return ts_unpatchify_forward(c->e, c->out, c->in[0], *(const int *)c->op);
}

static int unpatchify_bwd(grad_case_t *c) {
    return ts_unpatchify_backward(c->e, c->grad[0], c->dout, *(const int *)c->op);
}

static void test_patchify_unpatchify_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][5] = {
        /* B, C, H, W, p */ {2, 2, 4, 6, 2}, {1, 3, 3, 3, 3}, {1, 1, 2, 2, 1}};
    tu_rng_t r = {37};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t B = cases[s][0], C = cases[s][1], H = cases[s][2], W = cases[s][3];
        int p = (int)cases[s][4];
        int64_t T = (H / p) * (W / p), Fd = C * p * p;
        ts_tensor_t img, tok, dimg, dtok, gimg, gtok;
        tu_alloc_f32(&img, 4, TS_SHAPE(B, C, H, W));
        tu_alloc_f32(&tok, 3, TS_SHAPE(B, T, Fd));
        tu_alloc_like(&dimg, &img); /* the loss weights on an image output */
        tu_alloc_like(&dtok, &tok); /* the loss weights on a token output */
        tu_alloc_like(&gimg, &img);
        tu_alloc_like(&gtok, &tok);
        tu_fill_uniform(&r, &img, -1, 1);
        tu_fill_uniform(&r, &tok, -1, 1);
        tu_fill_uniform(&r, &dimg, -1, 1);
        tu_fill_uniform(&r, &dtok, -1, 1);
        grad_case_t c = grad_case(e, patchify_fwd, patchify_bwd, &p, &tok, &dtok, LINEAR);
        add_input(&c, "img", &img, &gimg);
        run_grad_case(&c, "patchify_backward B=%lld C=%lld H=%lld W=%lld p=%d", (long long)B,
                      (long long)C, (long long)H, (long long)W, p);

        tu_fill_uniform(&r, &tok, -1, 1);
        grad_case_t u = grad_case(e, unpatchify_fwd, unpatchify_bwd, &p, &img, &dimg, LINEAR);
        add_input(&u, "tok", &tok, &gtok);
        run_grad_case(&u, "unpatchify_backward B=%lld C=%lld H=%lld W=%lld p=%d", (long long)B,
                      (long long)C, (long long)H, (long long)W, p);
        TU_FREE_TENSORS(&img, &tok, &dimg, &dtok, &gimg, &gtok);
    }
}

/* ---- reductions and losses ------------------------------------------------------------- */

static int sum_fwd(grad_case_t *c) { return ts_sum_forward(c->e, c->out, c->in[0]); }
static int sum_bwd(grad_case_t *c) { return ts_sum_backward(c->e, c->grad[0], c->dout); }
static int mean_fwd(grad_case_t *c) { return ts_mean_forward(c->e, c->out, c->in[0]); }
static int mean_bwd(grad_case_t *c) { return ts_mean_backward(c->e, c->grad[0], c->dout); }

static int mse_fwd(grad_case_t *c) { return ts_mse_forward(c->e, c->out, c->in[0], c->in[1]); }

static int mse_bwd(grad_case_t *c) {
    return ts_mse_backward(c->e, c->grad[0], tu_f32(c->dout)[0], c->in[0], c->in[1]);
}

static void test_reductions_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[][2] = {{1, 1}, {3, 7}, {4, 33}};
    tu_rng_t r = {38};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        ts_tensor_t x, tgt, out, dout, dx;
        tu_alloc_f32(&x, 2, TS_SHAPE(sizes[s][0], sizes[s][1]));
        tu_alloc_like(&tgt, &x);
        tu_alloc_like(&dx, &x);
        tu_alloc_f32(&out, 1, TS_SHAPE(1));
        tu_alloc_f32(&dout, 1, TS_SHAPE(1));
        tu_fill_uniform(&r, &x, -1, 1);
        tu_fill_uniform(&r, &tgt, -1, 1);
        tu_f32(&dout)[0] = -1.7f;
        static const struct {
            const char *name;
            int (*fwd)(grad_case_t *);
            int (*bwd)(grad_case_t *);
        } ops[] = {
            {"sum", sum_fwd, sum_bwd}, {"mean", mean_fwd, mean_bwd}, {"mse", mse_fwd, mse_bwd}};
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            grad_case_t c = grad_case(e, ops[o].fwd, ops[o].bwd, NULL, &out, &dout, LINEAR);
            add_input(&c, "inp", &x, &dx);
            if (o == 2)
                add_input(&c, "target", &tgt, NULL); /* mse: no gradient for the target */
            run_grad_case(&c, "%s_backward n=%lld", ops[o].name,
                          (long long)(sizes[s][0] * sizes[s][1]));
        }
        TU_FREE_TENSORS(&x, &tgt, &out, &dout, &dx);
    }
}

/* ---- classification -------------------------------------------------------------------- */

static int xent_fwd(grad_case_t *c) {
    return ts_cross_entropy_forward(c->e, c->out, c->in[0], (const ts_tensor_t *)c->op);
}

static int xent_bwd(grad_case_t *c) {
    return ts_cross_entropy_backward(c->e, c->grad[0], tu_f32(c->dout)[0], c->in[0],
                                     (const ts_tensor_t *)c->op);
}

static int mean_tokens_fwd(grad_case_t *c) {
    return ts_mean_tokens_forward(c->e, c->out, c->in[0]);
}

static int mean_tokens_bwd(grad_case_t *c) {
    return ts_mean_tokens_backward(c->e, c->grad[0], c->dout);
}

static void test_cross_entropy_mean_tokens_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[][2] = {{1, 1}, {1, 4}, {5, 10}, {9, 3}};
    tu_rng_t r = {44};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t B = sizes[s][0], K = sizes[s][1];
        ts_tensor_t z, y, out, dout, dz;
        tu_alloc_f32(&z, 2, TS_SHAPE(B, K));
        tu_alloc_like(&dz, &z);
        tu_alloc_f32(&out, 1, TS_SHAPE(1));
        tu_alloc_f32(&dout, 1, TS_SHAPE(1));
        assert_int_equal(ts_tensor_alloc(&y, TS_I32, TS_CPU, 1, TS_SHAPE(B)), TS_OK);
        tu_fill_uniform(&r, &z, -3, 3);
        for (int64_t b = 0; b < B; b++)
            ((int32_t *)y.data)[b] = (int32_t)(tu_rng_next(&r) % (uint64_t)K);
        tu_f32(&dout)[0] = 1.3f;
        grad_case_t c = grad_case(e, xent_fwd, xent_bwd, &y, &out, &dout, nonlinear(1e-3));
        add_input(&c, "logits", &z, &dz);
        run_grad_case(&c, "cross_entropy_backward B=%lld K=%lld", (long long)B, (long long)K);
        TU_FREE_TENSORS(&z, &y, &out, &dout, &dz);
    }
    static const int64_t shapes[][3] = {{1, 1, 1}, {2, 5, 3}, {3, 16, 8}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t B = shapes[s][0], T = shapes[s][1], C = shapes[s][2];
        ts_tensor_t x, out, dout, dx;
        tu_alloc_f32(&x, 3, TS_SHAPE(B, T, C));
        tu_alloc_like(&dx, &x);
        tu_alloc_f32(&out, 2, TS_SHAPE(B, C));
        tu_alloc_like(&dout, &out);
        tu_fill_uniform(&r, &x, -1, 1);
        tu_fill_uniform(&r, &dout, -1, 1);
        grad_case_t c = grad_case(e, mean_tokens_fwd, mean_tokens_bwd, NULL, &out, &dout, LINEAR);
        add_input(&c, "x", &x, &dx);
        run_grad_case(&c, "mean_tokens_backward B=%lld T=%lld C=%lld", (long long)B, (long long)T,
                      (long long)C);
        TU_FREE_TENSORS(&x, &out, &dout, &dx);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_backward),
        cmocka_unit_test(test_matmul_backward),
        cmocka_unit_test(test_layernorm_backward),
        cmocka_unit_test(test_gelu_backward),
        cmocka_unit_test(test_silu_backward),
        cmocka_unit_test(test_softmax_backward),
        cmocka_unit_test(test_attention_backward),
        cmocka_unit_test(test_attention_fused_backward),
        cmocka_unit_test(test_modulate_backward),
        cmocka_unit_test(test_gate_residual_backward),
        cmocka_unit_test(test_add_bcast_backward),
        cmocka_unit_test(test_timestep_embedding_backward),
        cmocka_unit_test(test_embedding_backward),
        cmocka_unit_test(test_patchify_unpatchify_backward),
        cmocka_unit_test(test_reductions_backward),
        cmocka_unit_test(test_cross_entropy_mean_tokens_backward),
    };
    return cmocka_run_group_tests_name("ops_backward", tests, tu_setup_cpu_engine,
                                       tu_teardown_cpu_engine);
}
