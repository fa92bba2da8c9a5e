/*
 * test_cpu_vec.c — the CPU's per-ISA loops (kernels/cpu/vec.h) and the fused ops built on them
 * give exactly the bits of the plain loops.
 *
 * Two levels, each on every build this CPU runs (avx512, avx2, base; a build the CPU lacks is
 * said and skipped):
 *   - the tables: each function of ts_cpu_vec_pick(isa) against the plain scalar loop written
 *     here (the kernels/math.h formulas, one element at a time, sums in element order), compared
 *     with memcmp, on sizes with vector tails (1, 3, 13, 31, 129 …) and LayerNorm's row blocks
 *     cut short (7, 9, 17 rows);
 *   - the fused attention's block products (vec.h att, the AVX2 and AVX-512 builds) against one
 *     fmaf chain per output, and its keys' transpose against the plain loop, on the presets'
 *     blocks and every row and column tail; the linear layers' forward tiles (vec.h lin) and
 *     their weight packing the same way;
 *   - the engine: an engine started under TESSERA_CPU_ISA=<isa> runs the fused ops
 *     (ts_layernorm_modulate_forward, ts_linear_gelu_forward) and AdamW, EMA, GELU; their outputs
 *     must equal, bit for bit, the unfused ops on an engine capped to the base build — but the
 *     linear of a build with tiles, which must equal one fmaf chain per output.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/vec.h"
#include "kernels/engine.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "tests/testutil.h"

static const char *const isas[] = {"avx512", "avx2", "base"};

/* The table for isa, or NULL (and a note) when this CPU does not run that build. */
static const ts_cpu_vec_t *table_for(const char *isa) {
    const ts_cpu_vec_t *t = ts_cpu_vec_pick(isa);
    if (strcmp(t->name, isa) != 0) {
        printf("# %s: not on this CPU (the widest below it is %s), skipped\n", isa, t->name);
        return NULL;
    }
    return t;
}

static void fill(tu_rng_t *r, float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++)
        x[i] = tu_rng_uniform(r, lo, hi);
}

static void check_bits(const float *got, const float *want, int64_t n, const char *what,
                       const char *isa, int64_t a, int64_t b) {
    if (memcmp(got, want, (size_t)n * sizeof *got) != 0) {
        int64_t i = 0;
        while (i < n && memcmp(&got[i], &want[i], sizeof *got) == 0)
            i++;
        print_error("%s (%s, sizes %lld, %lld): element %lld is %.9g, the plain loop gives %.9g\n",
                    what, isa, (long long)a, (long long)b, (long long)i, (double)got[i],
                    (double)want[i]);
        fail();
    }
}

/* ---- the plain loops ------------------------------------------------------------------- */

static void plain_layernorm(float *out, float *mean, float *rstd, float *mod, const float *x,
                            const float *shift, const float *scale, int64_t rows, int64_t C) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        float s = 0.0f;
        for (int64_t i = 0; i < C; i++)
            s += xr[i];
        float m = s / (float)C;
        float v = 0.0f;
        for (int64_t i = 0; i < C; i++)
            v += (xr[i] - m) * (xr[i] - m);
        float rs = ts_ln_rstd(v / (float)C);
        for (int64_t i = 0; i < C; i++) {
            out[r * C + i] = (xr[i] - m) * rs;
            mod[r * C + i] = ts_modulate(out[r * C + i], shift[i], scale[i]);
        }
        mean[r] = m;
        rstd[r] = rs;
    }
}

/* ---- the tables ------------------------------------------------------------------------ */

static const int64_t lens[] = {1, 3, 13, 16, 31, 33, 129, 1000};

static void test_elementwise(void **state) {
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        const ts_cpu_vec_t *t = table_for(isas[k]);
        if (!t)
            continue;
        tu_rng_t r = {21};
        for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++) {
            int64_t n = lens[c];
            float *x = tu_floats(n), *d = tu_floats(n), *got = tu_floats(n), *want = tu_floats(n);
            fill(&r, x, n, -6.0f, 6.0f);
            fill(&r, d, n, -1.0f, 1.0f);
            t->gelu(got, x, n);
            for (int64_t i = 0; i < n; i++)
                want[i] = ts_gelu(x[i]);
            check_bits(got, want, n, "gelu", t->name, n, 0);

            fill(&r, got, n, -1.0f, 1.0f);
            memcpy(want, got, (size_t)n * sizeof *want);
            t->gelu_backward(got, d, x, n);
            for (int64_t i = 0; i < n; i++)
                want[i] += d[i] * ts_gelu_grad(x[i]);
            check_bits(got, want, n, "gelu_backward", t->name, n, 0);

            memcpy(want, got, (size_t)n * sizeof *want);
            t->axpy(got, 0.37f, d, n);
            for (int64_t i = 0; i < n; i++)
                want[i] += 0.37f * d[i];
            check_bits(got, want, n, "axpy", t->name, n, 0);

            memcpy(want, got, (size_t)n * sizeof *want);
            t->ema(got, x, n, 0.999f);
            for (int64_t i = 0; i < n; i++)
                want[i] = ts_ema_elem(want[i], x[i], 0.999f);
            check_bits(got, want, n, "ema", t->name, n, 0);

            /* the attention's exponentials: e^(x − sub), and their sum in TS_EXP_LANES chains
             * (element i in chain i mod lanes, the tail in chain 0), added in chain order */
            const float sub = 0.75f;
            fill(&r, x, n, -30.0f, 2.0f);
            memcpy(got, x, (size_t)n * sizeof *got);
            t->exp_sub(got, n, sub);
            for (int64_t i = 0; i < n; i++)
                want[i] = ts_expf(x[i] - sub);
            check_bits(got, want, n, "exp_sub", t->name, n, 0);
            memcpy(got, x, (size_t)n * sizeof *got);
            float total = t->exp_sum(got, n, sub), chain[TS_EXP_LANES] = {0};
            int64_t full = n / TS_EXP_LANES * TS_EXP_LANES;
            for (int64_t i = 0; i < n; i++)
                chain[i < full ? i % TS_EXP_LANES : 0] += want[i];
            float want_total = 0.0f;
            for (int l = 0; l < TS_EXP_LANES; l++)
                want_total += chain[l];
            check_bits(got, want, n, "exp_sum's exponentials", t->name, n, 0);
            check_bits(&total, &want_total, 1, "exp_sum's sum", t->name, n, 0);
            free(x), free(d), free(got), free(want);
        }
    }
}

static void test_adamw(void **state) {
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        const ts_cpu_vec_t *t = table_for(isas[k]);
        if (!t)
            continue;
        tu_rng_t r = {22};
        for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++) {
            int64_t n = lens[c];
            float *g = tu_floats(n), *p = tu_floats(n), *m = tu_floats(n), *v = tu_floats(n);
            float *p2 = tu_floats(n), *m2 = tu_floats(n), *v2 = tu_floats(n);
            fill(&r, p, n, -1.0f, 1.0f);
            fill(&r, m, n, -0.1f, 0.1f);
            fill(&r, v, n, 0.0f, 0.01f);
            memcpy(p2, p, (size_t)n * sizeof *p), memcpy(m2, m, (size_t)n * sizeof *m);
            memcpy(v2, v, (size_t)n * sizeof *v);
            for (int step = 1; step <= 3; step++) {
                fill(&r, g, n, -2.0f, 2.0f);
                float bc1 = (float)(1.0 - pow(0.9, step)),
                      sbc2 = (float)sqrt(1.0 - pow(0.999, step));
                t->adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, bc1, sbc2, 0.5f);
                for (int64_t i = 0; i < n; i++)
                    ts_adamw_elem(&p2[i], &m2[i], &v2[i], g[i] * 0.5f, 1e-3f, 0.9f, 0.999f, 1e-8f,
                                  0.01f, bc1, sbc2);
            }
            check_bits(p, p2, n, "adamw param", t->name, n, 0);
            check_bits(m, m2, n, "adamw m", t->name, n, 0);
            check_bits(v, v2, n, "adamw v", t->name, n, 0);
            free(g), free(p), free(m), free(v), free(p2), free(m2), free(v2);
        }
    }
}

static const int64_t row_cases[][2] = {/* rows, C */
                                       {1, 1},  {1, 7},    {7, 13},   {8, 31},   {9, 128},
                                       {17, 3}, {16, 129}, {49, 256}, {23, 1000}};

static void test_rows(void **state) {
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        const ts_cpu_vec_t *t = table_for(isas[k]);
        if (!t)
            continue;
        tu_rng_t r = {23};
        for (size_t c = 0; c < sizeof row_cases / sizeof row_cases[0]; c++) {
            int64_t rows = row_cases[c][0], C = row_cases[c][1], n = rows * C;
            float *x = tu_floats(n), *y = tu_floats(n), *sh = tu_floats(C), *sc = tu_floats(C);
            float *out = tu_floats(n), *mod = tu_floats(n), *mean = tu_floats(rows);
            float *rstd = tu_floats(rows), *w_out = tu_floats(n), *w_mod = tu_floats(n);
            float *w_mean = tu_floats(rows), *w_rstd = tu_floats(rows);
            fill(&r, x, n, -3.0f, 5.0f);
            fill(&r, y, n, -1.0f, 1.0f);
            fill(&r, sh, C, -1.0f, 1.0f);
            fill(&r, sc, C, -1.0f, 1.0f);
            plain_layernorm(w_out, w_mean, w_rstd, w_mod, x, sh, sc, rows, C);
            t->layernorm(out, mean, rstd, mod, x, sh, sc, rows, C);
            check_bits(out, w_out, n, "layernorm out", t->name, rows, C);
            check_bits(mod, w_mod, n, "layernorm + modulate", t->name, rows, C);
            check_bits(mean, w_mean, rows, "layernorm mean", t->name, rows, C);
            check_bits(rstd, w_rstd, rows, "layernorm rstd", t->name, rows, C);
            /* the other combinations of outputs */
            memset(mod, 0, (size_t)n * sizeof *mod);
            t->layernorm(NULL, NULL, NULL, mod, x, sh, sc, rows, C);
            check_bits(mod, w_mod, n, "layernorm + modulate alone", t->name, rows, C);
            memset(out, 0, (size_t)n * sizeof *out);
            t->layernorm(out, NULL, NULL, NULL, x, NULL, NULL, rows, C);
            check_bits(out, w_out, n, "layernorm alone", t->name, rows, C);

            t->modulate(out, x, sh, sc, rows, C);
            for (int64_t i = 0; i < n; i++)
                w_out[i] = ts_modulate(x[i], sh[i % C], sc[i % C]);
            check_bits(out, w_out, n, "modulate", t->name, rows, C);
            t->gate_residual(out, x, y, sc, rows, C);
            for (int64_t i = 0; i < n; i++)
                w_out[i] = x[i] + sc[i % C] * y[i];
            check_bits(out, w_out, n, "gate_residual", t->name, rows, C);

            /* the linear layer's output pass: bias, then GELU; bias alone; GELU alone */
            memcpy(out, y, (size_t)n * sizeof *out);
            memcpy(w_out, y, (size_t)n * sizeof *out);
            t->bias_act(out, mod, sh, rows, C, C);
            for (int64_t i = 0; i < n; i++) {
                w_out[i] += sh[i % C];
                w_mod[i] = ts_gelu(w_out[i]);
            }
            check_bits(out, w_out, n, "bias + gelu (pre)", t->name, rows, C);
            check_bits(mod, w_mod, n, "bias + gelu (act)", t->name, rows, C);
            t->bias_act(out, NULL, sc, rows, C, C);
            for (int64_t i = 0; i < n; i++)
                w_out[i] += sc[i % C];
            check_bits(out, w_out, n, "bias", t->name, rows, C);
            t->bias_act(out, mod, NULL, rows, C, C);
            for (int64_t i = 0; i < n; i++)
                w_mod[i] = ts_gelu(w_out[i]);
            check_bits(mod, w_mod, n, "gelu after the product", t->name, rows, C);
            free(x), free(y), free(sh), free(sc), free(out), free(mod), free(mean), free(rstd);
            free(w_out), free(w_mod), free(w_mean), free(w_rstd);
        }
    }
}

/* ---- the fused attention's block products ---------------------------------------------- */

/* n, m, hd of the tile cases: the presets' blocks (64 queries × 196 keys, heads of 32, 64, 72,
 * 128), the last short query block (4 rows), and odd sizes for every row and column tail. */
static const int64_t tile_cases[][3] = {
    {64, 196, 64}, {4, 196, 64}, {64, 49, 32}, {1, 49, 32}, {13, 256, 72}, {7, 17, 128},
    {9, 1, 8},     {5, 33, 3},   {2, 40, 12},  {3, 23, 20}, {6, 9, 64},    {11, 70, 20}};

/* Each output one fmaf chain in the summed index's order (fmaf is the correctly rounded fused
 * multiply-add, the instruction's result), the scores' scale after it. */
static void plain_qk(float *s, int64_t lds, const float *q, int64_t ldq, const float *kt,
                     int64_t mp, int64_t n, int64_t hd, float scale) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < mp; j++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < hd; p++)
                acc = fmaf(q[i * ldq + p], kt[p * mp + j], acc);
            s[i * lds + j] = acc * scale;
        }
}

static void plain_pv(float *o, int64_t ldo, const float *p, int64_t ldp, const float *v,
                     int64_t ldv, int64_t n, int64_t m, int64_t hd, int accumulate) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < hd; d++) {
            float acc = accumulate ? o[i * ldo + d] : 0.0f;
            for (int64_t k = 0; k < m; k++)
                acc = fmaf(p[i * ldp + k], v[k * ldv + d], acc);
            o[i * ldo + d] = acc;
        }
}

static void test_attention_tiles(void **state) {
    (void)state;
    int ran = 0;
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        const ts_cpu_vec_t *t = table_for(isas[k]);
        if (!t)
            continue;
        if (!t->att) {
            assert_string_equal(t->name, "base"); /* only the base build has no tiles */
            continue;
        }
        ran++;
        tu_rng_t r = {31};
        for (size_t c = 0; c < sizeof tile_cases / sizeof tile_cases[0]; c++) {
            int64_t n = tile_cases[c][0], m = tile_cases[c][1], hd = tile_cases[c][2];
            int64_t mp = (m + 15) / 16 * 16, ldq = 3 * hd + 5, lds = mp + 16, ldo = hd + 3;
            float *q = tu_floats(n * ldq), *kt = tu_floats(hd * mp), *v = tu_floats(m * ldq);
            float *s = tu_floats(n * lds), *ws = tu_floats(n * lds);
            float *o = tu_floats(n * ldo), *wo = tu_floats(n * ldo);
            fill(&r, q, n * ldq, -2.0f, 2.0f);
            fill(&r, kt, hd * mp, -2.0f, 2.0f);
            fill(&r, v, m * ldq, -2.0f, 2.0f);
            /* the keys' transpose: kt from v read as (m, hd) rows of stride ldq, zero past m */
            float *kk = tu_floats(hd * mp), *wk = tu_floats(hd * mp);
            for (int64_t i = 0; i < hd * mp; i++)
                kk[i] = -7.0f;
            for (int64_t p = 0; p < hd; p++)
                for (int64_t j = 0; j < mp; j++)
                    wk[p * mp + j] = j < m ? v[j * ldq + p] : 0.0f;
            t->att->kt(kk, v, m, mp, hd, ldq);
            check_bits(kk, wk, hd * mp, "keys transposed", t->name, m, hd);
            free(kk), free(wk);
            for (int64_t i = 0; i < n * lds; i++) /* past each row's mp: never written */
                s[i] = ws[i] = -7.0f;
            t->att->qk(s, lds, q, ldq, kt, mp, n, hd, 0.125f);
            plain_qk(ws, lds, q, ldq, kt, mp, n, hd, 0.125f);
            check_bits(s, ws, n * lds, "attention scores", t->name, n, m);
            for (int acc = 0; acc < 2; acc++) {
                fill(&r, o, n * ldo, -1.0f, 1.0f);
                memcpy(wo, o, (size_t)(n * ldo) * sizeof *o);
                t->att->pv(o, ldo, s, lds, v, ldq, n, m, hd, acc);
                plain_pv(wo, ldo, s, lds, v, ldq, n, m, hd, acc);
                check_bits(o, wo, n * ldo,
                           acc ? "attention output, accumulated" : "attention output", t->name, n,
                           hd);
            }
            free(q), free(kt), free(v), free(s), free(ws), free(o), free(wo);
        }
    }
    if (!ran)
        printf("# attention tiles: no AVX2 or AVX-512 build on this CPU, nothing to check\n");
}

/* c (M, N) = a (M, K) · wᵀ, one fmaf chain per output in k order, + bias (NULL: none); act
 * (nullable) = gelu(c) */
static void plain_linear(float *c, float *act, const float *a, const float *w, const float *bias,
                         int64_t M, int64_t N, int64_t K) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc = fmaf(a[i * K + k], w[j * K + k], acc);
            if (bias)
                acc = acc + bias[j];
            c[i * N + j] = acc;
            if (act)
                act[i * N + j] = ts_gelu(acc);
        }
}

/* The linear layers' forward tiles (vec.h lin): the packing, then every row tail (1 to 9 rows)
 * and column tail (widths under, at and over a panel), K from 1, a range of panels alone (the
 * columns outside it untouched), with and without bias, GELU beside and in place; K over one
 * pass of the tile (512), so that a chain goes on from its partial sums; and, up to
 * LIN_DIRECT_ROWS rows, the unpacked path (direct). */
static void test_linear_tiles(void **state) {
    (void)state;
    static const int64_t cases[][3] = {/* M, N, K */
                                       {1, 1, 1},      {3, 15, 7},    {9, 33, 64},  {8, 32, 130},
                                       {7, 100, 13},   {17, 64, 256}, {49, 48, 32}, {2, 17, 9},
                                       {10, 40, 1100}, {3, 7, 1024},  {1, 70, 29},  {8, 24, 8}};
    int ran = 0;
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        const ts_cpu_vec_t *t = table_for(isas[k]);
        if (!t)
            continue;
        if (!t->lin) {
            assert_string_equal(t->name, "base");
            continue;
        }
        ran++;
        tu_rng_t r = {41};
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            int64_t M = cases[c][0], N = cases[c][1], K = cases[c][2], P = t->lin->panel;
            int64_t panels = (N + P - 1) / P;
            float *a = tu_floats(M * K), *w = tu_floats(N * K), *b = tu_floats(N);
            float *packed = tu_floats(panels * P * K), *want_packed = tu_floats(panels * P * K);
            float *out = tu_floats(M * N), *act = tu_floats(M * N);
            float *want = tu_floats(M * N), *want_act = tu_floats(M * N);
            fill(&r, a, M * K, -1.0f, 1.0f);
            fill(&r, w, N * K, -1.0f, 1.0f);
            fill(&r, b, N, -1.0f, 1.0f);
            for (int64_t p = 0; p < panels; p++)
                for (int64_t kk = 0; kk < K; kk++)
                    for (int64_t cc = 0; cc < P; cc++) {
                        int64_t col = p * P + cc;
                        want_packed[p * P * K + kk * P + cc] = col < N ? w[col * K + kk] : 0.0f;
                    }
            for (int64_t i = 0; i < panels * P * K; i++)
                packed[i] = -7.0f;
            t->lin->pack(packed, w, N, K, 0, panels);
            check_bits(packed, want_packed, panels * P * K, "linear weight packed", t->name, N, K);
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                const float *bias = with_bias ? b : NULL;
                plain_linear(want, want_act, a, w, bias, M, N, K);
                for (int64_t i = 0; i < M * N; i++)
                    out[i] = act[i] = -7.0f;
                t->lin->forward(out, NULL, N, a, K, packed, bias, M, N, K, 0, panels);
                check_bits(out, want, M * N, "linear", t->name, M, N);
                t->lin->forward(out, act, N, a, K, packed, bias, M, N, K, 0, panels);
                check_bits(out, want, M * N, "linear + gelu, pre", t->name, M, N);
                check_bits(act, want_act, M * N, "linear + gelu, act", t->name, M, N);
                t->lin->forward(out, out, N, a, K, packed, bias, M, N, K, 0, panels);
                check_bits(out, want_act, M * N, "linear + gelu in place", t->name, M, N);
                if (M <= LIN_DIRECT_ROWS) { /* the unpacked weight: the same bits */
                    for (int64_t i = 0; i < M * N; i++)
                        out[i] = act[i] = -7.0f;
                    t->lin->direct(out, act, N, a, K, w, bias, M, K, 0, N);
                    check_bits(out, want, M * N, "linear direct, pre", t->name, M, N);
                    check_bits(act, want_act, M * N, "linear direct, act", t->name, M, N);
                    t->lin->direct(out, NULL, N, a, K, w, bias, M, K, 0, N);
                    check_bits(out, want, M * N, "linear direct", t->name, M, N);
                }
                if (panels > 1) { /* the last panel alone: the columns before it untouched */
                    for (int64_t i = 0; i < M * N; i++)
                        out[i] = -7.0f;
                    t->lin->forward(out, NULL, N, a, K, packed, bias, M, N, K, panels - 1, panels);
                    for (int64_t i = 0; i < M; i++)
                        for (int64_t j = 0; j < N; j++) {
                            float w_ij = j < (panels - 1) * P ? -7.0f : want[i * N + j];
                            if (memcmp(&out[i * N + j], &w_ij, sizeof w_ij) != 0)
                                fail_msg("linear, last panel alone (%s): (%lld, %lld) is %.9g, "
                                         "want %.9g",
                                         t->name, (long long)i, (long long)j,
                                         (double)out[i * N + j], (double)w_ij);
                        }
                }
            }
            free(a), free(w), free(b), free(packed), free(want_packed), free(out), free(act);
            free(want), free(want_act);
        }
    }
    if (!ran)
        printf("# linear tiles: no AVX2 or AVX-512 build on this CPU, nothing to check\n");
}

/* ---- the engine ------------------------------------------------------------------------ */

/* A 2-thread CPU engine on the build for isa; 0 when this CPU does not run it. */
static int engine_for(ts_engine_t *e, const char *isa) {
    setenv("TESSERA_CPU_ISA", isa, 1);
    int rc = tu_engine_init_cpu(e);
    unsetenv("TESSERA_CPU_ISA");
    TU_CHECK_OK(rc);
    if (strcmp(e->vec->name, isa) != 0) {
        printf("# engine %s: not on this CPU, skipped\n", isa);
        ts_engine_free(e);
        return 0;
    }
    return 1;
}

static void check_tensors(const ts_tensor_t *got, const ts_tensor_t *want, const char *what,
                          const char *isa, int64_t a, int64_t b) {
    check_bits(tu_f32(got), tu_f32(want), ts_tensor_numel(want), what, isa, a, b);
}

/* What ts_linear_gelu_forward must give: with the linear tiles one fmaf chain per output
 * (plain_linear), else the base engine's linear and then its GELU. bias may be NULL. */
static void reference_linear(ts_engine_t *base, int tiles, ts_tensor_t *pre, ts_tensor_t *act,
                             const ts_tensor_t *inp, const ts_tensor_t *w,
                             const ts_tensor_t *bias) {
    if (tiles) {
        plain_linear(tu_f32(pre), tu_f32(act), tu_f32(inp), tu_f32(w), bias ? tu_f32(bias) : NULL,
                     inp->shape[0], w->shape[0], w->shape[1]);
        return;
    }
    TU_CHECK_OK(ts_linear_forward(base, pre, inp, w, bias));
    TU_CHECK_OK(ts_gelu_forward(base, act, pre));
}

/* B, T, C of the adaLN cases: T = 49 tokens (tiny), 196 (small), odd C for the tails. */
static const int64_t ada_cases[][3] = {{1, 49, 128}, {3, 49, 128}, {2, 196, 256}, {5, 7, 13}};

static void test_engine_fused(void **state) {
    ts_engine_t base;
    TU_CHECK_OK(engine_for(&base, "base") ? TS_OK : TS_ENOTSUP);
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        ts_engine_t e;
        if (!engine_for(&e, isas[k]))
            continue;
        /* the device class says when the attention's products are OpenBLAS's (the base build) */
        char cls[128];
        ts_engine_device_class(&e, cls, sizeof cls);
        if ((strstr(cls, "+base") != NULL) != (e.vec->att == NULL))
            fail_msg("engine %s: device class %s", isas[k], cls);
        tu_rng_t r = {24};
        for (size_t c = 0; c < sizeof ada_cases / sizeof ada_cases[0]; c++) {
            int64_t B = ada_cases[c][0], T = ada_cases[c][1], C = ada_cases[c][2];
            ts_tensor_t x, mod, ln, out, mean, rstd, w_ln, w_out, w_mean, w_rstd;
            tu_alloc_f32(&x, 3, TS_SHAPE(B, T, C));
            tu_alloc_f32(&mod, 2, TS_SHAPE(B, 6 * C));
            tu_alloc_f32(&mean, 1, TS_SHAPE(B * T));
            tu_alloc_like(&ln, &x), tu_alloc_like(&out, &x), tu_alloc_like(&w_ln, &x);
            tu_alloc_like(&w_out, &x), tu_alloc_like(&rstd, &mean);
            tu_alloc_like(&w_mean, &mean), tu_alloc_like(&w_rstd, &mean);
            tu_fill_uniform(&r, &x, -2, 3);
            tu_fill_uniform(&r, &mod, -1, 1);
            TU_CHECK_OK(ts_layernorm_modulate_forward(&e, &ln, &mean, &rstd, &out, &x, &mod, 3, 4));
            TU_CHECK_OK(ts_layernorm_forward(&base, &w_ln, &w_mean, &w_rstd, &x));
            TU_CHECK_OK(ts_modulate_forward(&base, &w_out, &w_ln, &mod, 3, 4));
            check_tensors(&ln, &w_ln, "layernorm_modulate ln", isas[k], B * T, C);
            check_tensors(&out, &w_out, "layernorm_modulate out", isas[k], B * T, C);
            check_tensors(&mean, &w_mean, "layernorm_modulate mean", isas[k], B * T, C);
            check_tensors(&rstd, &w_rstd, "layernorm_modulate rstd", isas[k], B * T, C);
            TU_CHECK_OK(ts_gate_residual_forward(&e, &out, &x, &ln, &mod, 2));
            TU_CHECK_OK(ts_gate_residual_forward(&base, &w_out, &x, &ln, &mod, 2));
            check_tensors(&out, &w_out, "gate_residual", isas[k], B * T, C);
            TU_FREE_TENSORS(&x, &mod, &ln, &out, &mean, &rstd, &w_ln, &w_out, &w_mean, &w_rstd);
        }
        /* linear + GELU: rows of the tiny and small MLPs, an adaLN row, and odd sizes; a build
         * with the linear tiles against one fmaf chain per output (whatever the cut among the
         * threads), the base build against its unfused ops */
        static const int64_t lin_cases[][3] = {/* M, K, N */
                                               {49, 128, 512},
                                               {3136, 128, 512},
                                               {1, 256, 1536},
                                               {196, 256, 768},
                                               {7, 13, 29}};
        for (size_t c = 0; c < sizeof lin_cases / sizeof lin_cases[0]; c++) {
            int64_t M = lin_cases[c][0], K = lin_cases[c][1], N = lin_cases[c][2];
            ts_tensor_t inp, w, b, pre, act, w_pre, w_act;
            tu_alloc_f32(&inp, 2, TS_SHAPE(M, K));
            tu_alloc_f32(&w, 2, TS_SHAPE(N, K));
            tu_alloc_f32(&b, 1, TS_SHAPE(N));
            tu_alloc_f32(&pre, 2, TS_SHAPE(M, N));
            tu_alloc_like(&act, &pre), tu_alloc_like(&w_pre, &pre), tu_alloc_like(&w_act, &pre);
            tu_fill_uniform(&r, &inp, -1, 1);
            tu_fill_uniform(&r, &w, -1, 1);
            tu_fill_uniform(&r, &b, -1, 1);
            TU_CHECK_OK(ts_linear_gelu_forward(&e, &pre, &act, &inp, &w, &b));
            reference_linear(&base, e.vec->lin != NULL, &w_pre, &w_act, &inp, &w, &b);
            check_tensors(&pre, &w_pre, "linear_gelu pre", isas[k], M, N);
            check_tensors(&act, &w_act, "linear_gelu act", isas[k], M, N);
            /* in place (pre is act: a forward that keeps no activations), with and without bias */
            TU_CHECK_OK(ts_linear_gelu_forward(&e, &pre, &pre, &inp, &w, &b));
            check_tensors(&pre, &w_act, "linear_gelu in place", isas[k], M, N);
            TU_CHECK_OK(ts_linear_gelu_forward(&e, &pre, &pre, &inp, &w, NULL));
            reference_linear(&base, e.vec->lin != NULL, &w_pre, &w_act, &inp, &w, NULL);
            check_tensors(&pre, &w_act, "linear_gelu in place, no bias", isas[k], M, N);
            TU_FREE_TENSORS(&inp, &w, &b, &pre, &act, &w_pre, &w_act);
        }
        /* AdamW and EMA over a slab larger than one thread's grain */
        int64_t n = 100003;
        ts_tensor_t p, g, m, v, p2, m2, v2;
        tu_alloc_f32(&p, 1, TS_SHAPE(n));
        tu_alloc_like(&g, &p), tu_alloc_like(&m, &p), tu_alloc_like(&v, &p);
        tu_alloc_like(&p2, &p), tu_alloc_like(&m2, &p), tu_alloc_like(&v2, &p);
        tu_fill_uniform(&r, &p, -1, 1);
        memcpy(tu_f32(&p2), tu_f32(&p), (size_t)n * sizeof(float));
        ts_adamw_t hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
        for (int step = 1; step <= 3; step++) {
            tu_fill_uniform(&r, &g, -1, 1);
            TU_CHECK_OK(ts_adamw_step(&e, &p, &g, &m, &v, &hp, step, 0.7f));
            TU_CHECK_OK(ts_adamw_step(&base, &p2, &g, &m2, &v2, &hp, step, 0.7f));
        }
        check_tensors(&p, &p2, "adamw param", isas[k], n, 0);
        check_tensors(&m, &m2, "adamw m", isas[k], n, 0);
        check_tensors(&v, &v2, "adamw v", isas[k], n, 0);
        TU_CHECK_OK(ts_ema_update(&e, &m, &p, 0.99f));
        TU_CHECK_OK(ts_ema_update(&base, &m2, &p2, 0.99f));
        check_tensors(&m, &m2, "ema", isas[k], n, 0);
        TU_FREE_TENSORS(&p, &g, &m, &v, &p2, &m2, &v2);
        ts_engine_free(&e);
    }
    ts_engine_free(&base);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise),  cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_rows),         cmocka_unit_test(test_attention_tiles),
        cmocka_unit_test(test_linear_tiles), cmocka_unit_test(test_engine_fused),
    };
    return cmocka_run_group_tests_name("cpu_vec", tests, NULL, NULL);
}
