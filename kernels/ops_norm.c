/*
 * ops_norm.c — the public normalisation ops (LayerNorm, softmax), activations (GELU, SiLU) and
 * adaLN-Zero's pieces (modulate, LayerNorm + modulate, gated residual): argument checks, then
 * dispatch to a backend, as kernels/ops.c does for the rest.
 */
#include "kernels/ops.h"

#include "kernels/backend.h"
#include "kernels/ops_internal.h"

/* ---- normalisation and activations ------------------------------------------------------ */

static int check_rows(const ts_engine_t *e, const ts_tensor_t *stat, int64_t rows) {
    if (!stat)
        return TS_OK;
    TS_TRY(check_f32(e, stat));
    return ts_tensor_numel(stat) == rows ? TS_OK : TS_ESHAPE;
}

int ts_layernorm_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *mean, ts_tensor_t *rstd,
                         const ts_tensor_t *inp) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, inp));
    TS_TRY(same_numel(out, inp));
    if (ts_tensor_cols(out) != ts_tensor_cols(inp))
        return TS_ESHAPE;
    int64_t rows = ts_tensor_rows(inp), C = ts_tensor_cols(inp);
    TS_TRY(check_rows(e, mean, rows));
    TS_TRY(check_rows(e, rstd, rows));
    return DISPATCH(e, layernorm_forward, F(out), OPT(mean), OPT(rstd), CF(inp), rows, C);
}

int ts_layernorm_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                          const ts_tensor_t *inp, const ts_tensor_t *mean,
                          const ts_tensor_t *rstd) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dinp));
    TS_TRY(check_f32(e, dout));
    TS_TRY(check_f32(e, inp));
    if (!mean || !rstd)
        return TS_EINVAL;
    TS_TRY(same_numel(dinp, inp));
    TS_TRY(same_numel(dout, inp));
    int64_t rows = ts_tensor_rows(inp), C = ts_tensor_cols(inp);
    TS_TRY(check_rows(e, mean, rows));
    TS_TRY(check_rows(e, rstd, rows));
    return DISPATCH(e, layernorm_backward, F(dinp), CF(dout), CF(inp), CF(mean), CF(rstd), rows, C);
}

int ts_gelu_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_same2(e, out, inp));
    return DISPATCH(e, gelu_forward, F(out), CF(inp), ts_tensor_numel(out));
}

int ts_gelu_forward_bf16(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_same2(e, out, inp));
    return DISPATCH(e, gelu_forward_bf16, F(out), CF(inp), ts_tensor_numel(out));
}

/* An element-wise op's 16-bit output (BF16 or F16) beside its fp32 input, apart from it. */
static int check_lp_out(ts_engine_t *e, const ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, inp));
    if (!out || (out->dtype != TS_BF16 && out->dtype != TS_F16))
        return TS_EDTYPE;
    TS_TRY(check_on(e, out, out->dtype));
    if (ts_tensor_numel(out) != ts_tensor_numel(inp))
        return TS_ESHAPE;
    if (overlaps(out, inp)) /* a GPU thread would write over what another still reads */
        return TS_EINVAL;
    return TS_OK;
}

int ts_gelu_forward_lp(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_lp_out(e, out, inp));
    return DISPATCH(e, gelu_forward_lp, (uint16_t *)out->data, out->dtype, CF(inp),
                    ts_tensor_numel(out));
}

int ts_silu_forward_lp(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_lp_out(e, out, inp));
    return DISPATCH(e, silu_forward_lp, (uint16_t *)out->data, out->dtype, CF(inp),
                    ts_tensor_numel(out));
}

int ts_gelu_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                     const ts_tensor_t *inp) {
    TS_TRY(check_same3(e, dinp, dout, inp));
    return DISPATCH(e, gelu_backward, F(dinp), CF(dout), CF(inp), ts_tensor_numel(dinp));
}

/* A backward's 16-bit copy of its fp32 gradient g, apart from it and from the op's inputs a, b. */
static int check_lp_copy(ts_engine_t *e, const ts_tensor_t *g16, const ts_tensor_t *g,
                         const ts_tensor_t *a, const ts_tensor_t *b) {
    TS_TRY(check_lp_out(e, g16, g));
    return overlaps(g16, a) || overlaps(g16, b) ? TS_EINVAL : TS_OK;
}

int ts_gelu_backward_lp(ts_engine_t *e, ts_tensor_t *dinp, ts_tensor_t *dinp16,
                        const ts_tensor_t *dout, const ts_tensor_t *inp) {
    TS_TRY(check_same3(e, dinp, dout, inp));
    TS_TRY(check_lp_copy(e, dinp16, dinp, dout, inp));
    return DISPATCH(e, gelu_backward_lp, F(dinp), (uint16_t *)dinp16->data, dinp16->dtype, CF(dout),
                    CF(inp), ts_tensor_numel(dinp));
}

int ts_silu_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_same2(e, out, inp));
    return DISPATCH(e, silu_forward, F(out), CF(inp), ts_tensor_numel(out));
}

int ts_silu_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                     const ts_tensor_t *inp) {
    TS_TRY(check_same3(e, dinp, dout, inp));
    return DISPATCH(e, silu_backward, F(dinp), CF(dout), CF(inp), ts_tensor_numel(dinp));
}

int ts_softmax_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_same2(e, out, inp));
    if (ts_tensor_cols(out) != ts_tensor_cols(inp))
        return TS_ESHAPE;
    return DISPATCH(e, softmax_forward, F(out), CF(inp), ts_tensor_rows(inp), ts_tensor_cols(inp));
}

int ts_softmax_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                        const ts_tensor_t *out) {
    TS_TRY(check_same3(e, dinp, dout, out));
    if (ts_tensor_cols(dinp) != ts_tensor_cols(out) || ts_tensor_cols(dout) != ts_tensor_cols(out))
        return TS_ESHAPE;
    return DISPATCH(e, softmax_backward, F(dinp), CF(dout), CF(out), ts_tensor_rows(out),
                    ts_tensor_cols(out), 1.0f, 1);
}

/* ---- adaLN-Zero pieces ----------------------------------------------------------------- */

typedef struct {
    int64_t B, T, C, M;
} ada_dims_t;

/* x (B, T, C) and mod (B, M·C); chunk indices within [0, M). */
static int ada_dims(const ts_tensor_t *x, const ts_tensor_t *mod, int i0, int i1, ada_dims_t *d) {
    if (x->ndim != 3 || mod->ndim != 2)
        return TS_ESHAPE;
    int64_t B = x->shape[0], T = x->shape[1], C = x->shape[2];
    if (mod->shape[0] != B || mod->shape[1] % C != 0)
        return TS_ESHAPE;
    int64_t M = mod->shape[1] / C;
    if (i0 < 0 || i0 >= M || i1 < 0 || i1 >= M)
        return TS_ERANGE;
    *d = (ada_dims_t){B, T, C, M};
    return TS_OK;
}

int ts_modulate_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *x,
                        const ts_tensor_t *mod, int shift_idx, int scale_idx) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, x));
    TS_TRY(check_f32(e, mod));
    if (!ts_tensor_same_shape(out, x))
        return TS_ESHAPE;
    ada_dims_t d;
    TS_TRY(ada_dims(x, mod, shift_idx, scale_idx, &d));
    return DISPATCH(e, modulate_forward, F(out), CF(x), CF(mod), d.B, d.T, d.C, d.M, shift_idx,
                    scale_idx);
}

int ts_layernorm_modulate_forward(ts_engine_t *e, ts_tensor_t *ln, ts_tensor_t *mean,
                                  ts_tensor_t *rstd, ts_tensor_t *out, const ts_tensor_t *x,
                                  const ts_tensor_t *mod, int shift_idx, int scale_idx) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, ln));
    int lp = out && (out->dtype == TS_BF16 || out->dtype == TS_F16);
    TS_TRY(check_on(e, out, lp ? out->dtype : TS_F32));
    TS_TRY(check_f32(e, x));
    TS_TRY(check_f32(e, mod));
    if (!ts_tensor_same_shape(ln, x) || !ts_tensor_same_shape(out, x))
        return TS_ESHAPE;
    ada_dims_t d;
    TS_TRY(ada_dims(x, mod, shift_idx, scale_idx, &d));
    TS_TRY(check_rows(e, mean, d.B * d.T));
    TS_TRY(check_rows(e, rstd, d.B * d.T));
    if (lp && (overlaps(out, x) || overlaps(out, ln)))
        return TS_EINVAL;
    if (lp)
        return DISPATCH(e, layernorm_modulate_forward_lp, F(ln), OPT(mean), OPT(rstd),
                        (uint16_t *)out->data, out->dtype, CF(x), CF(mod), d.B, d.T, d.C, d.M,
                        shift_idx, scale_idx);
    return DISPATCH(e, layernorm_modulate_forward, F(ln), OPT(mean), OPT(rstd), F(out), CF(x),
                    CF(mod), d.B, d.T, d.C, d.M, shift_idx, scale_idx);
}

int ts_modulate_backward(ts_engine_t *e, ts_tensor_t *dx, ts_tensor_t *dmod,
                         const ts_tensor_t *dout, const ts_tensor_t *x, const ts_tensor_t *mod,
                         int shift_idx, int scale_idx) {
    TS_TRY(check_engine(e));
    TS_TRY(check_opt(e, dx));
    TS_TRY(check_opt(e, dmod));
    TS_TRY(check_f32(e, dout));
    TS_TRY(check_f32(e, x));
    TS_TRY(check_f32(e, mod));
    if (!ts_tensor_same_shape(dout, x) || (dx && !ts_tensor_same_shape(dx, x)) ||
        (dmod && !ts_tensor_same_shape(dmod, mod)))
        return TS_ESHAPE;
    ada_dims_t d;
    TS_TRY(ada_dims(x, mod, shift_idx, scale_idx, &d));
    return DISPATCH(e, modulate_backward, OPT(dx), OPT(dmod), CF(dout), CF(x), CF(mod), d.B, d.T,
                    d.C, d.M, shift_idx, scale_idx);
}

int ts_gate_residual_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *res,
                             const ts_tensor_t *y, const ts_tensor_t *mod, int gate_idx) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, res));
    TS_TRY(check_f32(e, y));
    TS_TRY(check_f32(e, mod));
    if (!ts_tensor_same_shape(out, y) || !ts_tensor_same_shape(res, y))
        return TS_ESHAPE;
    ada_dims_t d;
    TS_TRY(ada_dims(y, mod, gate_idx, gate_idx, &d));
    return DISPATCH(e, gate_residual_forward, F(out), CF(res), CF(y), CF(mod), d.B, d.T, d.C, d.M,
                    gate_idx);
}

/* The operands of a gate_residual backward, checked; d its sizes. */
static int gate_residual_backward_check(ts_engine_t *e, const ts_tensor_t *dres,
                                        const ts_tensor_t *dy, const ts_tensor_t *dmod,
                                        const ts_tensor_t *dout, const ts_tensor_t *y,
                                        const ts_tensor_t *mod, int gate_idx, ada_dims_t *d) {
    TS_TRY(check_engine(e));
    TS_TRY(check_opt(e, dres));
    TS_TRY(check_opt(e, dy));
    TS_TRY(check_opt(e, dmod));
    TS_TRY(check_f32(e, dout));
    TS_TRY(check_f32(e, y));
    TS_TRY(check_f32(e, mod));
    if (!ts_tensor_same_shape(dout, y) || (dres && !ts_tensor_same_shape(dres, y)) ||
        (dy && !ts_tensor_same_shape(dy, y)) || (dmod && !ts_tensor_same_shape(dmod, mod)))
        return TS_ESHAPE;
    return ada_dims(y, mod, gate_idx, gate_idx, d);
}

int ts_gate_residual_backward(ts_engine_t *e, ts_tensor_t *dres, ts_tensor_t *dy, ts_tensor_t *dmod,
                              const ts_tensor_t *dout, const ts_tensor_t *y, const ts_tensor_t *mod,
                              int gate_idx) {
    ada_dims_t d;
    TS_TRY(gate_residual_backward_check(e, dres, dy, dmod, dout, y, mod, gate_idx, &d));
    return DISPATCH(e, gate_residual_backward, OPT(dres), OPT(dy), OPT(dmod), CF(dout), CF(y),
                    CF(mod), d.B, d.T, d.C, d.M, gate_idx);
}

int ts_gate_residual_backward_lp(ts_engine_t *e, ts_tensor_t *dres, ts_tensor_t *dy,
                                 ts_tensor_t *dy16, ts_tensor_t *dmod, const ts_tensor_t *dout,
                                 const ts_tensor_t *y, const ts_tensor_t *mod, int gate_idx) {
    if (!dy)
        return TS_EINVAL;
    ada_dims_t d;
    TS_TRY(gate_residual_backward_check(e, dres, dy, dmod, dout, y, mod, gate_idx, &d));
    TS_TRY(check_lp_copy(e, dy16, dy, dout, y));
    if ((dres && overlaps(dy16, dres)) || (dmod && overlaps(dy16, dmod)) || overlaps(dy16, mod))
        return TS_EINVAL;
    return DISPATCH(e, gate_residual_backward_lp, OPT(dres), F(dy), (uint16_t *)dy16->data,
                    dy16->dtype, OPT(dmod), CF(dout), CF(y), CF(mod), d.B, d.T, d.C, d.M, gate_idx);
}
