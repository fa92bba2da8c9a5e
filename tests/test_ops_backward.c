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
 * (layernorm, gelu, silu, softmax, attention, timestep embedding) rtol = 2e-3, ftol = 5e-4 with
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
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/ops.h"

/* ---- helpers --------------------------------------------------------------------------- */

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != TS_OK) {                                                                        \
            print_error("%s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #expr, rc_,            \
                        ts_strerror(rc_));                                                         \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

typedef struct {
    uint64_t s;
} trng_t;

static uint64_t trng_next(trng_t *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float trng_uniform(trng_t *r, float lo, float hi) {
    double u = (double)(trng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

static float *F(const ts_tensor_t *t) { return (float *)t->data; }

static void new_f32(ts_tensor_t *t, int ndim, const int64_t *shape) {
    int rc = ts_tensor_alloc(t, TS_F32, TS_CPU, ndim, shape);
    if (rc != TS_OK) {
        print_error("ts_tensor_alloc failed: %s\n", ts_strerror(rc));
        fail();
    }
}

static void fill_uniform(trng_t *r, ts_tensor_t *t, float lo, float hi) {
    int64_t n = ts_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        F(t)[i] = trng_uniform(r, lo, hi);
}

static int setup_engine(void **state) {
    ts_engine_t *e = calloc(1, sizeof *e);
    if (!e)
        return -1;
    ts_engine_opts_t opts = {.device = TS_CPU, .threads = 2, .gpu = 0};
    if (ts_engine_init(e, &opts) != TS_OK) {
        free(e);
        return -1;
    }
    *state = e;
    return 0;
}

static int teardown_engine(void **state) {
    ts_engine_t *e = *state;
    ts_engine_free(e);
    free(e);
    return 0;
}

/* ---- the finite-difference harness ----------------------------------------------------- */

#define MAX_IN 4

/* One gradient check: a forward that recomputes `out` from the inputs, a backward that
 * accumulates into whichever of grads[] are non-NULL using dout (= the loss weights w). */
typedef struct grad_case {
    ts_engine_t *e;
    int (*forward)(struct grad_case *c);
    int (*backward)(struct grad_case *c);
    ts_tensor_t *out;  /* the forward output the loss reads */
    ts_tensor_t *dout; /* w, same element count as out */
    int n_in;
    ts_tensor_t *in[MAX_IN];
    ts_tensor_t *grad[MAX_IN]; /* NULL: this input is not differentiated */
    const char *name[MAX_IN];
    double h, rtol, ftol;
    void *op; /* op-specific arguments */
} grad_case_t;

static const double NONLINEAR_RTOL = 2e-3, NONLINEAR_FTOL = 5e-4;
static const double LINEAR_RTOL = 2e-4, LINEAR_FTOL = 2e-5, LINEAR_H = 1e-2;

/* L = Σ w ⊙ out after a forward; *absum = Σ |w ⊙ out|, the scale of L's float round-off. */
static double loss_of(grad_case_t *c, double *absum) {
    CHECK_OK(c->forward(c));
    double L = 0.0, A = 0.0;
    int64_t n = ts_tensor_numel(c->out);
    for (int64_t i = 0; i < n; i++) {
        double term = (double)F(c->dout)[i] * (double)F(c->out)[i];
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

static float *copy_of(const ts_tensor_t *t) {
    float *p = malloc(ts_tensor_nbytes(t));
    assert_non_null(p);
    memcpy(p, t->data, ts_tensor_nbytes(t));
    return p;
}

static void compare(const char *what, const char *check, const char *input, const float *got,
                    const float *want, int64_t n, double atol, double rtol) {
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        if (!(err <= atol + rtol * fabs((double)want[i]))) {
            print_error("%s: %s, d%s[%lld]: got %.9g, expected %.9g\n", what, check, input,
                        (long long)i, got[i], want[i]);
            fail();
        }
    }
}

static void run_grad_case(grad_case_t *c, const char *what) {
    float *g1[MAX_IN] = {0};

    /* analytic gradients from zero */
    CHECK_OK(c->forward(c));
    zero_grads(c);
    CHECK_OK(c->backward(c));
    for (int k = 0; k < c->n_in; k++)
        if (c->grad[k])
            g1[k] = copy_of(c->grad[k]);

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
            float *x = &F(c->in[k])[i];
            float x0 = *x;
            float xp = (float)((double)x0 + c->h), xm = (float)((double)x0 - c->h);
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
            double lim = c->rtol * fabs(g) + c->ftol * gmax + 1e-6 + noise;
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
                        what, c->name[k], (long long)worst_i, g1[k][worst_i], worst_fd, c->h,
                        c->rtol, c->ftol, gmax);
            fail();
        }
    }
    CHECK_OK(c->forward(c)); /* restore the saved activations at the unperturbed inputs */

    /* accumulation: twice from zero gives 2·g; on a prefilled buffer, prefill + g */
    zero_grads(c);
    CHECK_OK(c->backward(c));
    CHECK_OK(c->backward(c));
    for (int k = 0; k < c->n_in; k++) {
        if (!c->grad[k])
            continue;
        int64_t n = ts_tensor_numel(c->grad[k]);
        float *twice = malloc((size_t)n * sizeof(float));
        assert_non_null(twice);
        for (int64_t i = 0; i < n; i++)
            twice[i] = 2.0f * g1[k][i];
        compare(what, "backward called twice does not double", c->name[k], F(c->grad[k]), twice, n,
                1e-6, 1e-5);
        free(twice);
    }
    trng_t r = {99};
    float *pre[MAX_IN] = {0};
    for (int k = 0; k < c->n_in; k++)
        if (c->grad[k]) {
            fill_uniform(&r, c->grad[k], -1, 1);
            pre[k] = copy_of(c->grad[k]);
        }
    CHECK_OK(c->backward(c));
    for (int k = 0; k < c->n_in; k++) {
        if (!c->grad[k])
            continue;
        int64_t n = ts_tensor_numel(c->grad[k]);
        for (int64_t i = 0; i < n; i++)
            pre[k][i] += g1[k][i];
        compare(what, "backward does not add to a prefilled gradient", c->name[k], F(c->grad[k]),
                pre[k], n, 1e-5, 1e-5);
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
        for (int k = 0; k < c->n_in; k++) {
            if (!c->grad[k])
                continue;
            char check[96];
            snprintf(check, sizeof check, "with d%s = NULL", c->name[skip]);
            compare(what, check, c->name[k], F(c->grad[k]), g1[k], ts_tensor_numel(c->grad[k]),
                    1e-6, 1e-5);
        }
        c->grad[skip] = saved;
    }
    for (int k = 0; k < c->n_in; k++)
        free(g1[k]);
}

/* Fills a grad_case's common fields; the caller adds inputs with add_input. */
static void init_case(grad_case_t *c, ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *dout,
                      int linear, double h) {
    memset(c, 0, sizeof *c);
    c->e = e;
    c->out = out;
    c->dout = dout;
    c->h = linear ? LINEAR_H : h;
    c->rtol = linear ? LINEAR_RTOL : NONLINEAR_RTOL;
    c->ftol = linear ? LINEAR_FTOL : NONLINEAR_FTOL;
}

static void add_input(grad_case_t *c, const char *name, ts_tensor_t *in, ts_tensor_t *grad) {
    assert_true(c->n_in < MAX_IN);
    c->name[c->n_in] = name;
    c->in[c->n_in] = in;
    c->grad[c->n_in] = grad;
    c->n_in++;
}

/* Allocates t (zeroed) with the shape of like. */
static void new_like(ts_tensor_t *t, const ts_tensor_t *like) {
    new_f32(t, like->ndim, like->shape);
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
    trng_t r = {21};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            int64_t B = cases[s][0], T = cases[s][1], K = cases[s][2], N = cases[s][3];
            ts_tensor_t inp, w, b, out, dout, dinp, dw, db;
            if (T > 0) {
                new_f32(&inp, 3, TS_SHAPE(B, T, K));
                new_f32(&out, 3, TS_SHAPE(B, T, N));
            } else {
                new_f32(&inp, 2, TS_SHAPE(B, K));
                new_f32(&out, 2, TS_SHAPE(B, N));
            }
            new_f32(&w, 2, TS_SHAPE(N, K));
            new_f32(&b, 1, TS_SHAPE(N));
            new_like(&dout, &out);
            new_like(&dinp, &inp);
            new_like(&dw, &w);
            new_like(&db, &b);
            fill_uniform(&r, &inp, -1, 1);
            fill_uniform(&r, &w, -1, 1);
            fill_uniform(&r, &b, -1, 1);
            fill_uniform(&r, &dout, -1, 1);
            grad_case_t c;
            init_case(&c, e, &out, &dout, 1, 0);
            c.forward = linear_fwd;
            c.backward = linear_bwd;
            add_input(&c, "inp", &inp, &dinp);
            add_input(&c, "weight", &w, &dw);
            if (with_bias)
                add_input(&c, "bias", &b, &db);
            char what[128];
            snprintf(what, sizeof what, "linear_backward B=%lld T=%lld K=%lld N=%lld %s bias",
                     (long long)B, (long long)T, (long long)K, (long long)N,
                     with_bias ? "with" : "without");
            run_grad_case(&c, what);
            ts_tensor_t *all[] = {&inp, &w, &b, &out, &dout, &dinp, &dw, &db};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                ts_tensor_free(all[i]);
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
    trng_t r = {22};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int64_t bt = cases[s][0], M = cases[s][1], N = cases[s][2], K = cases[s][3];
                float alpha = alphas[(ta + tb + (int)s) % 2];
                ts_tensor_t a, b, cc, dc, da, db;
                int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
                if (bt > 0) {
                    new_f32(&a, 3, TS_SHAPE(bt, ar, ac));
                    new_f32(&b, 3, TS_SHAPE(bt, br, bc));
                    new_f32(&cc, 3, TS_SHAPE(bt, M, N));
                } else {
                    new_f32(&a, 2, TS_SHAPE(ar, ac));
                    new_f32(&b, 2, TS_SHAPE(br, bc));
                    new_f32(&cc, 2, TS_SHAPE(M, N));
                }
                new_like(&dc, &cc);
                new_like(&da, &a);
                new_like(&db, &b);
                fill_uniform(&r, &a, -1, 1);
                fill_uniform(&r, &b, -1, 1);
                fill_uniform(&r, &dc, -1, 1);
                matmul_args_t args = {ta, tb, alpha};
                grad_case_t c;
                init_case(&c, e, &cc, &dc, 1, 0);
                c.forward = matmul_fwd;
                c.backward = matmul_bwd;
                c.op = &args;
                add_input(&c, "a", &a, &da);
                add_input(&c, "b", &b, &db);
                char what[128];
                snprintf(what, sizeof what,
                         "matmul_backward batch=%lld M=%lld N=%lld K=%lld "
                         "trans_a=%d trans_b=%d alpha=%g",
                         (long long)bt, (long long)M, (long long)N, (long long)K, ta, tb, alpha);
                run_grad_case(&c, what);
                ts_tensor_t *all[] = {&a, &b, &cc, &dc, &da, &db};
                for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                    ts_tensor_free(all[i]);
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
    trng_t r = {23};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t R = cases[s][0] * cases[s][1], C = cases[s][2];
        ts_tensor_t inp, out, dout, dinp, mean, rstd;
        new_f32(&inp, 3, TS_SHAPE(cases[s][0], cases[s][1], C));
        new_like(&out, &inp);
        new_like(&dout, &inp);
        new_like(&dinp, &inp);
        new_f32(&mean, 1, TS_SHAPE(R));
        new_f32(&rstd, 1, TS_SHAPE(R));
        fill_uniform(&r, &inp, -2, 2);
        fill_uniform(&r, &dout, -1, 1);
        ln_args_t args = {&mean, &rstd};
        grad_case_t c;
        init_case(&c, e, &out, &dout, 0, 1e-3);
        c.forward = layernorm_fwd;
        c.backward = layernorm_bwd;
        c.op = &args;
        add_input(&c, "inp", &inp, &dinp);
        char what[96];
        snprintf(what, sizeof what, "layernorm_backward R=%lld C=%lld", (long long)R, (long long)C);
        run_grad_case(&c, what);
        ts_tensor_t *all[] = {&inp, &out, &dout, &dinp, &mean, &rstd};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            ts_tensor_free(all[i]);
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
    trng_t r = {seed};
    ts_tensor_t inp, out, dout, dinp;
    new_f32(&inp, 2, TS_SHAPE(R, C));
    new_like(&out, &inp);
    new_like(&dout, &inp);
    new_like(&dinp, &inp);
    fill_uniform(&r, &inp, lo, hi);
    fill_uniform(&r, &dout, -1, 1);
    grad_case_t c;
    init_case(&c, e, &out, &dout, 0, 1e-3);
    c.forward = unary_fwd;
    c.backward = unary_bwd;
    c.op = u;
    add_input(&c, "inp", &inp, &dinp);
    char what[96];
    snprintf(what, sizeof what, "%s_backward R=%lld C=%lld", name, (long long)R, (long long)C);
    run_grad_case(&c, what);
    ts_tensor_free(&inp);
    ts_tensor_free(&out);
    ts_tensor_free(&dout);
    ts_tensor_free(&dinp);
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
        F(a->datt)[i] = 1e3f;
    return ts_attention_backward(c->e, c->grad[0], a->datt, c->dout, c->in[0], a->att, a->heads);
}

static void test_attention_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][4] = {/* B, T, C, heads */
                                       {2, 5, 8, 2},
                                       {1, 3, 6, 3},
                                       {1, 1, 4, 1},
                                       {1, 4, 4, 1}};
    trng_t r = {31};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t B = cases[s][0], T = cases[s][1], C = cases[s][2], H = cases[s][3];
        ts_tensor_t qkv, out, dout, dqkv, att, datt;
        new_f32(&qkv, 3, TS_SHAPE(B, T, 3 * C));
        new_f32(&out, 3, TS_SHAPE(B, T, C));
        new_like(&dout, &out);
        new_like(&dqkv, &qkv);
        new_f32(&att, 4, TS_SHAPE(B, H, T, T));
        new_like(&datt, &att);
        fill_uniform(&r, &qkv, -1.5f, 1.5f);
        fill_uniform(&r, &dout, -1, 1);
        att_args_t args = {&att, &datt, (int)H};
        grad_case_t c;
        init_case(&c, e, &out, &dout, 0, 2e-3);
        c.forward = attention_fwd;
        c.backward = attention_bwd;
        c.op = &args;
        add_input(&c, "qkv", &qkv, &dqkv);
        char what[96];
        snprintf(what, sizeof what, "attention_backward B=%lld T=%lld C=%lld heads=%lld",
                 (long long)B, (long long)T, (long long)C, (long long)H);
        run_grad_case(&c, what);
        ts_tensor_t *all[] = {&qkv, &out, &dout, &dqkv, &att, &datt};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            ts_tensor_free(all[i]);
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
    trng_t r = {32};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t B = cases[s][0], T = cases[s][1], C = cases[s][2], M = cases[s][3];
        ts_tensor_t x, mod, out, dout, dx, dmod;
        new_f32(&x, 3, TS_SHAPE(B, T, C));
        new_f32(&mod, 2, TS_SHAPE(B, M * C));
        new_like(&out, &x);
        new_like(&dout, &x);
        new_like(&dx, &x);
        new_like(&dmod, &mod);
        fill_uniform(&r, &x, -2, 2);
        fill_uniform(&r, &mod, -1, 1);
        fill_uniform(&r, &dout, -1, 1);
        idx_args_t args = {(int)cases[s][4], (int)cases[s][5]};
        grad_case_t c;
        init_case(&c, e, &out, &dout, 1, 0);
        c.forward = modulate_fwd;
        c.backward = modulate_bwd;
        c.op = &args;
        add_input(&c, "x", &x, &dx);
        add_input(&c, "mod", &mod, &dmod);
        char what[128];
        snprintf(what, sizeof what,
                 "modulate_backward B=%lld T=%lld C=%lld M=%lld shift=%d "
                 "scale=%d",
                 (long long)B, (long long)T, (long long)C, (long long)M, args.i0, args.i1);
        run_grad_case(&c, what);
        ts_tensor_t *all[] = {&x, &mod, &out, &dout, &dx, &dmod};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            ts_tensor_free(all[i]);
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
    trng_t r = {33};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t B = cases[s][0], T = cases[s][1], C = cases[s][2], M = cases[s][3];
        ts_tensor_t res, y, mod, out, dout, dres, dy, dmod;
        new_f32(&res, 3, TS_SHAPE(B, T, C));
        new_like(&y, &res);
        new_f32(&mod, 2, TS_SHAPE(B, M * C));
        new_like(&out, &res);
        new_like(&dout, &res);
        new_like(&dres, &res);
        new_like(&dy, &res);
        new_like(&dmod, &mod);
        fill_uniform(&r, &res, -2, 2);
        fill_uniform(&r, &y, -2, 2);
        fill_uniform(&r, &mod, -1, 1);
        fill_uniform(&r, &dout, -1, 1);
        idx_args_t args = {(int)cases[s][4], 0};
        grad_case_t c;
        init_case(&c, e, &out, &dout, 1, 0);
        c.forward = gate_fwd;
        c.backward = gate_bwd;
        c.op = &args;
        add_input(&c, "res", &res, &dres);
        add_input(&c, "y", &y, &dy);
        add_input(&c, "mod", &mod, &dmod);
        char what[128];
        snprintf(what, sizeof what, "gate_residual_backward B=%lld T=%lld C=%lld M=%lld gate=%d",
                 (long long)B, (long long)T, (long long)C, (long long)M, args.i0);
        run_grad_case(&c, what);
        ts_tensor_t *all[] = {&res, &y, &mod, &out, &dout, &dres, &dy, &dmod};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            ts_tensor_free(all[i]);
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
    trng_t r = {34};
    static const int64_t cases[][4] = {
        /* x (a, b, c), S */ {3, 4, 5, 20}, {1, 6, 4, 4}, {2, 3, 1, 1}, {5, 1, 3, 3}};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        ts_tensor_t x, b, out, dout, dx, db;
        new_f32(&x, 3, TS_SHAPE(cases[s][0], cases[s][1], cases[s][2]));
        new_f32(&b, 1, TS_SHAPE(cases[s][3]));
        new_like(&out, &x);
        new_like(&dout, &x);
        new_like(&dx, &x);
        new_like(&db, &b);
        fill_uniform(&r, &x, -1, 1);
        fill_uniform(&r, &b, -1, 1);
        fill_uniform(&r, &dout, -1, 1);
        grad_case_t c;
        init_case(&c, e, &out, &dout, 1, 0);
        c.forward = bcast_fwd;
        c.backward = bcast_bwd;
        add_input(&c, "x", &x, &dx);
        add_input(&c, "b", &b, &db);
        char what[96];
        snprintf(what, sizeof what, "add_bcast_backward x=(%lld,%lld,%lld) S=%lld",
                 (long long)cases[s][0], (long long)cases[s][1], (long long)cases[s][2],
                 (long long)cases[s][3]);
        run_grad_case(&c, what);
        ts_tensor_t *all[] = {&x, &b, &out, &dout, &dx, &db};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            ts_tensor_free(all[i]);
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
    trng_t r = {35};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t B = 4, D = cases[s].D;
        float scale = cases[s].scale;
        ts_tensor_t t, out, dout, dt;
        new_f32(&t, 1, TS_SHAPE(B));
        new_f32(&out, 2, TS_SHAPE(B, D));
        new_like(&dout, &out);
        new_like(&dt, &t);
        fill_uniform(&r, &t, cases[s].lo, cases[s].hi);
        fill_uniform(&r, &dout, -1, 1);
        grad_case_t c;
        init_case(&c, e, &out, &dout, 0, cases[s].h);
        c.forward = temb_fwd;
        c.backward = temb_bwd;
        c.op = &scale;
        add_input(&c, "t", &t, &dt);
        char what[96];
        snprintf(what, sizeof what, "timestep_embedding_backward D=%lld scale=%g", (long long)D,
                 scale);
        run_grad_case(&c, what);
        ts_tensor_free(&t);
        ts_tensor_free(&out);
        ts_tensor_free(&dout);
        ts_tensor_free(&dt);
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
    trng_t r = {36};
    int64_t V = 5, D = 3, B = 6;
    ts_tensor_t table, ids, out, dout, dtable;
    new_f32(&table, 2, TS_SHAPE(V, D));
    new_f32(&out, 2, TS_SHAPE(B, D));
    new_like(&dout, &out);
    new_like(&dtable, &table);
    assert_int_equal(ts_tensor_alloc(&ids, TS_I32, TS_CPU, 1, TS_SHAPE(B)), TS_OK);
    memcpy(ids.data, idv, sizeof idv);
    fill_uniform(&r, &table, -1, 1);
    fill_uniform(&r, &dout, -1, 1);
    grad_case_t c;
    init_case(&c, e, &out, &dout, 1, 0);
    c.forward = emb_fwd;
    c.backward = emb_bwd;
    c.op = &ids;
    add_input(&c, "table", &table, &dtable);
    run_grad_case(&c, "embedding_backward V=5 D=3 B=6 (repeated ids)");
    /* row 1 is picked three times: its gradient is the sum of three dout rows */
    CHECK_OK(ts_zero(e, &dtable));
    CHECK_OK(ts_embedding_backward(e, &dtable, &dout, &ids));
    for (int64_t d = 0; d < D; d++) {
        double want = (double)F(&dout)[0 * D + d] + F(&dout)[2 * D + d] + F(&dout)[4 * D + d];
        assert_true(fabs(F(&dtable)[1 * D + d] - want) < 1e-6);
        assert_true(F(&dtable)[2 * D + d] == 0.0f && F(&dtable)[3 * D + d] == 0.0f);
    }
    ts_tensor_t *all[] = {&table, &ids, &out, &dout, &dtable};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ts_tensor_free(all[i]);
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
    trng_t r = {37};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int64_t B = cases[s][0], C = cases[s][1], H = cases[s][2], W = cases[s][3];
        int p = (int)cases[s][4];
        int64_t T = (H / p) * (W / p), Fd = C * p * p;
        ts_tensor_t img, tok, dimg, dtok, gimg, gtok;
        new_f32(&img, 4, TS_SHAPE(B, C, H, W));
        new_f32(&tok, 3, TS_SHAPE(B, T, Fd));
        new_like(&dimg, &img); /* the loss weights on an image output */
        new_like(&dtok, &tok); /* the loss weights on a token output */
        new_like(&gimg, &img);
        new_like(&gtok, &tok);
        fill_uniform(&r, &img, -1, 1);
        fill_uniform(&r, &tok, -1, 1);
        fill_uniform(&r, &dimg, -1, 1);
        fill_uniform(&r, &dtok, -1, 1);
        char what[128];
        grad_case_t c;
        init_case(&c, e, &tok, &dtok, 1, 0);
        c.forward = patchify_fwd;
        c.backward = patchify_bwd;
        c.op = &p;
        add_input(&c, "img", &img, &gimg);
        snprintf(what, sizeof what, "patchify_backward B=%lld C=%lld H=%lld W=%lld p=%d",
                 (long long)B, (long long)C, (long long)H, (long long)W, p);
        run_grad_case(&c, what);

        fill_uniform(&r, &tok, -1, 1);
        init_case(&c, e, &img, &dimg, 1, 0);
        c.forward = unpatchify_fwd;
        c.backward = unpatchify_bwd;
        c.op = &p;
        add_input(&c, "tok", &tok, &gtok);
        snprintf(what, sizeof what, "unpatchify_backward B=%lld C=%lld H=%lld W=%lld p=%d",
                 (long long)B, (long long)C, (long long)H, (long long)W, p);
        run_grad_case(&c, what);
        ts_tensor_t *all[] = {&img, &tok, &dimg, &dtok, &gimg, &gtok};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            ts_tensor_free(all[i]);
    }
}

/* ---- reductions and losses ------------------------------------------------------------- */

static int sum_fwd(grad_case_t *c) { return ts_sum_forward(c->e, c->out, c->in[0]); }
static int sum_bwd(grad_case_t *c) { return ts_sum_backward(c->e, c->grad[0], c->dout); }
static int mean_fwd(grad_case_t *c) { return ts_mean_forward(c->e, c->out, c->in[0]); }
static int mean_bwd(grad_case_t *c) { return ts_mean_backward(c->e, c->grad[0], c->dout); }

static int mse_fwd(grad_case_t *c) { return ts_mse_forward(c->e, c->out, c->in[0], c->in[1]); }

static int mse_bwd(grad_case_t *c) {
    return ts_mse_backward(c->e, c->grad[0], F(c->dout)[0], c->in[0], c->in[1]);
}

static void test_reductions_backward(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[][2] = {{1, 1}, {3, 7}, {4, 33}};
    trng_t r = {38};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        ts_tensor_t x, tgt, out, dout, dx;
        new_f32(&x, 2, TS_SHAPE(sizes[s][0], sizes[s][1]));
        new_like(&tgt, &x);
        new_like(&dx, &x);
        new_f32(&out, 1, TS_SHAPE(1));
        new_f32(&dout, 1, TS_SHAPE(1));
        fill_uniform(&r, &x, -1, 1);
        fill_uniform(&r, &tgt, -1, 1);
        F(&dout)[0] = -1.7f;
        char what[96];
        grad_case_t c;
        static const struct {
            const char *name;
            int (*fwd)(grad_case_t *);
            int (*bwd)(grad_case_t *);
        } ops[] = {
            {"sum", sum_fwd, sum_bwd}, {"mean", mean_fwd, mean_bwd}, {"mse", mse_fwd, mse_bwd}};
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            init_case(&c, e, &out, &dout, 1, 0);
            c.forward = ops[o].fwd;
            c.backward = ops[o].bwd;
            add_input(&c, "inp", &x, &dx);
            if (o == 2)
                add_input(&c, "target", &tgt, NULL); /* mse: no gradient for the target */
            snprintf(what, sizeof what, "%s_backward n=%lld", ops[o].name,
                     (long long)(sizes[s][0] * sizes[s][1]));
            run_grad_case(&c, what);
        }
        ts_tensor_t *all[] = {&x, &tgt, &out, &dout, &dx};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            ts_tensor_free(all[i]);
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
        cmocka_unit_test(test_modulate_backward),
        cmocka_unit_test(test_gate_residual_backward),
        cmocka_unit_test(test_add_bcast_backward),
        cmocka_unit_test(test_timestep_embedding_backward),
        cmocka_unit_test(test_embedding_backward),
        cmocka_unit_test(test_patchify_unpatchify_backward),
        cmocka_unit_test(test_reductions_backward),
    };
    return cmocka_run_group_tests_name("ops_backward", tests, setup_engine, teardown_engine);
}
