#!/usr/bin/env python3
"""run_parity.py — tessera's DiT expert checked against an independent PyTorch DiT.

Usage: run_parity.py PATH/TO/dit_parity        (ctest passes $<TARGET_FILE:dit_parity>)
Exit 0 when every check passes, 1 when one fails, 77 (skipped) when torch cannot be imported.

For each config (a small one with 3 channels, so the channel order of patchify and unpatchify
is seen, and the real `tiny` shape) the PyTorch model in dit_torch.py and the C model load the
same safetensors file and must agree on:
  a. the forward velocity on fixed (x, t, y), t spread over [0, 1], y including the null class:
     max|v_c − v_t| ≤ 1e-4 · max(1, max|v_t|);
  b. the flow-matching loss (relative 1e-5) and every parameter gradient
     (‖g_c − g_t‖ / ‖g_t‖ ≤ 1e-3, the worst five printed);
  c. five AdamW steps on that batch: the five losses (relative 1e-4); each tensor's update
     p_final − p_initial to 1 % in norm; every element within two Adam steps (2·lr) — the
     attention key bias, whose gradient is zero in exact arithmetic, only under the last bound;
  d. files crossing over: PyTorch loads (strict=True) the file the C side initialised and the
     one its AdamW run wrote; the C side loads the file PyTorch wrote (all of a-c);
  e. weights written by PyTorch in BF16 and in F16: the C forward matches PyTorch's forward on
     the same rounded weights;
  f. a model with DiT's learned σ (2C output channels; inference only): the C prediction and σ
     equal PyTorch's two halves.
Every parameter is random (the zero-initialised adaLN and final layer too), else the test would
not see them. Work files live in a temporary directory removed at the end.
"""

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import torch
except Exception as exc:  # ImportError, or a broken install raising something else
    print(f"parity_dit: SKIP: cannot import torch ({exc.__class__.__name__}: {exc}); "
          "install Debian's python3-torch to run the PyTorch parity test")
    sys.exit(77)

sys.dont_write_bytecode = True  # keep the source tree clean of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dit_torch as dt  # noqa: E402

SEED = 20250101
BATCH = 5
ADAMW_STEPS, ADAMW_LR, ADAMW_WD = 5, 1e-3, 0.01

TOL_FORWARD = 1e-4      # max|Δv| relative to max(1, max|v_t|)
TOL_GRAD = 1e-3         # ‖Δg‖ / ‖g_t‖ per parameter
TOL_KEY_BIAS = 1e-5     # ‖g_key bias‖ / ‖g_qkv bias‖: zero but for rounding
TOL_LOSS = 1e-5         # relative
TOL_ADAM_LOSS = 1e-4    # relative, per step
# Final parameters after 5 AdamW steps. Adam's step is lr·m̂/(√v̂ + eps), about lr whatever the
# gradient's size, so an element whose gradient is near zero on some step (|g| ~ 1e-8, where the
# two sides' float32 rounding is as large as g) may legitimately end up to a few lr apart. Two
# bounds follow: per tensor, the C update must match PyTorch's update to 1 % in norm (a few such
# elements cannot move that), and no element may differ by more than two full Adam steps.
TOL_ADAM_UPDATE = 1e-2  # ‖Δp_c − Δp_t‖ / ‖Δp_t‖ per tensor, Δp = p_final − p_initial
TOL_ADAM_PARAM = 2 * ADAMW_LR  # max|p_c − p_t| over every element

CONFIGS = [
    # a small shape with 3 channels, non-default mlp_ratio and freq_dim, patch 2
    ("small16", dict(input_size=16, patch_size=2, in_channels=3, hidden_size=64, depth=2,
                     num_heads=4, num_classes=5, mlp_ratio=2, freq_dim=64), "I64"),
    # the real `tiny` preset of Fashion-MNIST
    ("tiny", dict(input_size=28, patch_size=4, in_channels=1, hidden_size=128, depth=4,
                  num_heads=4, num_classes=10, mlp_ratio=4, freq_dim=256), "I32"),
]

# ---- reporting -----------------------------------------------------------------------------

ROWS = []  # (check, value text, tolerance text, passed)


def record(check, value, tol, passed=None, value_text=None):
    """One table row; passed defaults to value ≤ tol (a NaN fails)."""
    if passed is None:
        passed = value is not None and not math.isnan(value) and value <= tol
    vt = value_text if value_text is not None else (f"{value:.3e}" if value is not None else "-")
    tt = f"{tol:.1e}" if isinstance(tol, float) else str(tol)
    ROWS.append((check, vt, tt, bool(passed)))
    print(f"  {'PASS' if passed else 'FAIL'}  {check}: {vt} (tolerance {tt})", flush=True)
    return passed


def print_table():
    w = max(len(r[0]) for r in ROWS)
    print()
    print(f"{'check':<{w}}  {'value':>12}  {'tolerance':>10}  result")
    print("-" * (w + 36))
    for check, vt, tt, ok in ROWS:
        print(f"{check:<{w}}  {vt:>12}  {tt:>10}  {'PASS' if ok else 'FAIL'}")


class ToolError(Exception):
    pass


def run_tool(tool, *args):
    """Runs dit_parity; raises ToolError with its stderr when it fails."""
    cmd = [tool] + [str(a) for a in args]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=240)
    if res.returncode != 0:
        raise ToolError(f"`{' '.join(cmd[1:2])}` exited {res.returncode}: "
                        f"{res.stderr.strip() or res.stdout.strip()}")
    return res


def guarded(check, fn):
    """Runs one check; a tool failure or exception becomes a FAIL row with the reason."""
    try:
        fn()
    except Exception as exc:  # report and carry on with the other checks
        record(check, None, "-", passed=False, value_text="error")
        print(f"        {exc.__class__.__name__}: {exc}", flush=True)


# ---- comparisons ---------------------------------------------------------------------------

def forward_error(v_c, v_t):
    """max|v_c − v_t| / max(1, max|v_t|)."""
    if v_c.shape != v_t.shape:
        raise ValueError(f"shape {tuple(v_c.shape)} from C, {tuple(v_t.shape)} from PyTorch")
    scale = max(1.0, v_t.abs().max().item())
    return (v_c - v_t).abs().max().item() / scale


def key_bias_slice(name, hidden):
    """The key part of an attention qkv bias, or None for any other tensor.

    Its gradient is zero in exact arithmetic: b_k adds q_i·b_k to every logit of query row i,
    and softmax is invariant to a constant added to a row. So both sides can only compute it as
    rounding noise, which makes it a check of its own (b) and a tensor AdamW cannot compare (c).
    """
    if name.endswith("attn.qkv.bias"):
        return slice(hidden, 2 * hidden)
    return None


def torch_forward(model, inputs):
    with torch.no_grad():
        return model(inputs["x"], inputs["t"], inputs["y"].long())


def c_forward(tool, work, weights, inputs_path, tag):
    out = os.path.join(work, f"v_{tag}.safetensors")
    run_tool(tool, "forward", weights, inputs_path, out)
    tensors, _, _ = dt.st_read(out)
    return tensors["v"]


# ---- one config ----------------------------------------------------------------------------

def run_config(tool, work, name, cfg, label_dtype):
    print(f"\n== {name}: " + ", ".join(f"{k}={v}" for k, v in cfg.items()), flush=True)
    gen = torch.Generator().manual_seed(SEED)
    model = dt.DiT(**cfg)
    model.randomise(gen)
    weights = os.path.join(work, f"{name}_weights.safetensors")
    dt.save_model(model, weights, "F32", {"objective": "velocity"})

    C, S, K = cfg["in_channels"], cfg["input_size"], cfg["num_classes"]
    # t spread over [0, 1] with both ends; y with the null class (K) twice
    t = torch.tensor([0.0, 0.23, 0.5, 0.81, 1.0])
    y = torch.tensor([0, K, 3 % K, K - 1, K])
    inputs = {"x": torch.randn(BATCH, C, S, S, generator=gen), "t": t, "y": y}
    inputs_path = os.path.join(work, f"{name}_inputs.safetensors")
    dt.st_write(inputs_path, inputs, dtypes={"y": label_dtype})
    batch = {"x0": torch.randn(BATCH, C, S, S, generator=gen).clamp(-1, 1),
             "eps": torch.randn(BATCH, C, S, S, generator=gen),
             "t": torch.tensor([0.05, 0.3, 0.55, 0.7, 0.95]), "y": y}
    batch_path = os.path.join(work, f"{name}_batch.safetensors")
    dt.st_write(batch_path, batch, dtypes={"y": label_dtype})

    # a. forward on the file PyTorch wrote
    def check_forward():
        v_t = torch_forward(model, inputs)
        v_c = c_forward(tool, work, weights, inputs_path, name)
        record(f"[{name}] a. forward max|dv|/scale (|v|max {v_t.abs().max().item():.2f})",
               forward_error(v_c, v_t), TOL_FORWARD)
    guarded(f"[{name}] a. forward", check_forward)

    # b. loss and gradients
    def check_grads():
        out = os.path.join(work, f"{name}_grads.safetensors")
        run_tool(tool, "grads", weights, batch_path, out)
        g_c, _, _ = dt.st_read(out)
        model.zero_grad(set_to_none=True)
        loss_t = dt.flow_matching_loss(model, batch["x0"], batch["eps"], batch["t"], batch["y"])
        loss_t.backward()
        lt, lc = loss_t.item(), g_c["loss"].item()
        record(f"[{name}] b. loss rel. error (loss {lt:.5f})", abs(lc - lt) / abs(lt), TOL_LOSS)
        names = [n for n, _ in model.trainable()]
        missing = sorted(set(names) - set(g_c)) + sorted(set(g_c) - set(names) - {"loss"})
        record(f"[{name}] b. gradient names match ({len(names)} tensors)", len(missing), 0,
               value_text=f"{len(missing)} differ")
        if missing:
            print(f"        names that differ: {missing[:8]}")
        errs = []
        for n, p in model.trainable():
            if n not in g_c:
                continue
            gc, gt = g_c[n], p.grad
            if gc.shape != gt.shape:
                errs.append((float("inf"), n, f"shape {tuple(gc.shape)} vs {tuple(gt.shape)}"))
                continue
            rel = (gc - gt).norm().item() / max(gt.norm().item(), 1e-12)
            errs.append((rel, n, f"|g_t| {gt.norm().item():.3e}"))
        errs.sort(key=lambda e: -math.inf if math.isnan(e[0]) else -e[0])  # NaN first
        print("        worst gradient relative errors:")
        for rel, n, note in errs[:5]:
            print(f"          {rel:.3e}  {n}  ({note})")
        worst = max((e[0] for e in errs), default=float("nan"))
        if any(math.isnan(e[0]) for e in errs):
            worst = float("nan")
        record(f"[{name}] b. worst gradient rel. error ({errs[0][1]})", worst, TOL_GRAD)
        # the key bias's gradient must vanish on the C side too (softmax shift invariance)
        h = cfg["hidden_size"]
        kb = max(g_c[n][key_bias_slice(n, h)].norm().item() / max(g_c[n].norm().item(), 1e-30)
                 for n, _ in model.trainable() if key_bias_slice(n, h) is not None)
        record(f"[{name}] b. C key-bias gradient / qkv-bias gradient (exactly 0 in theory)", kb,
               TOL_KEY_BIAS)
    guarded(f"[{name}] b. gradients", check_grads)

    # c. five AdamW steps; d. PyTorch loads the file the C AdamW run wrote
    def check_adamw():
        out = os.path.join(work, f"{name}_adamw.safetensors")
        run_tool(tool, "adamw", weights, batch_path, ADAMW_STEPS, ADAMW_LR, ADAMW_WD, out)
        losses_c = dt.st_read(out + ".losses.safetensors")[0]["losses"]
        ref = dt.load_model(weights)
        opt = torch.optim.AdamW([p for _, p in ref.trainable()], lr=ADAMW_LR,
                                betas=(0.9, 0.999), eps=1e-8, weight_decay=ADAMW_WD)
        losses_t = []
        for _ in range(ADAMW_STEPS):
            opt.zero_grad(set_to_none=True)
            loss = dt.flow_matching_loss(ref, batch["x0"], batch["eps"], batch["t"], batch["y"])
            loss.backward()
            losses_t.append(loss.item())
            opt.step()
        rel = max(abs(a - b) / abs(b) for a, b in zip(losses_c.tolist(), losses_t))
        print("        losses C:       " + " ".join(f"{v:.6f}" for v in losses_c.tolist()))
        print("        losses PyTorch: " + " ".join(f"{v:.6f}" for v in losses_t))
        record(f"[{name}] c. AdamW x{ADAMW_STEPS} losses, max rel. error", rel, TOL_ADAM_LOSS)
        stepped = dt.load_model(out)  # strict=True: the C-written file loads in PyTorch
        record(f"[{name}] d. PyTorch loads the C AdamW file (strict)", 0, 0, value_text="loaded")
        # Per tensor, the C update against PyTorch's: ‖Δp_c − Δp_t‖ / ‖Δp_t‖, Δp = p_5 − p_0.
        # The attention key bias is left out: its gradient is zero in exact arithmetic (see
        # key_bias_slice), so both sides feed Adam pure rounding noise there and Adam turns noise
        # of any size into steps of ~lr. Its max|dp| is still reported, bounded by Adam's step.
        sd_c, sd_t, sd_0 = stepped.state_dict(), ref.state_dict(), model.state_dict()
        h = cfg["hidden_size"]
        worst_rel, worst_rel_n, worst_abs, worst_abs_n, key_abs = -1.0, None, -1.0, None, 0.0
        for n, _ in ref.trainable():
            diff, move = sd_c[n] - sd_t[n], sd_t[n] - sd_0[n]
            ks = key_bias_slice(n, h)
            if ks is not None:
                key_abs = max(key_abs, diff[ks].abs().max().item())
                keep = torch.ones_like(diff, dtype=torch.bool)
                keep[ks] = False
                diff, move = diff[keep], move[keep]
            rel = diff.norm().item() / max(move.norm().item(), 1e-12)
            if not rel <= worst_rel:
                worst_rel, worst_rel_n = rel, n
            d = diff.abs().max().item()
            if not d <= worst_abs:
                worst_abs, worst_abs_n = d, n
        moved = max((sd_t[n] - sd_0[n]).abs().max().item() for n, _ in ref.trainable())
        print(f"        largest parameter move over {ADAMW_STEPS} steps: {moved:.3e}; "
              f"max|dp| {worst_abs:.3e} ({worst_abs_n}), key bias max|dp| {key_abs:.3e}")
        record(f"[{name}] c. AdamW update rel. error, worst tensor ({worst_rel_n})", worst_rel,
               TOL_ADAM_UPDATE)
        record(f"[{name}] c. AdamW final params max|dp| (key bias incl.)",
               max(worst_abs, key_abs), TOL_ADAM_PARAM)
    guarded(f"[{name}] c. AdamW", check_adamw)

    # d. the C side initialises a model; PyTorch loads it and both run forward
    def check_init():
        out = os.path.join(work, f"{name}_cinit.safetensors")
        over = [f"{k}={v}" for k, v in cfg.items()]
        run_tool(tool, "init", "tiny", SEED % 1000, out, *over)
        cmodel = dt.load_model(out)  # strict=True
        zero_like = [n for n, p in cmodel.trainable() if p.abs().max().item() == 0.0]
        record(f"[{name}] d. PyTorch loads the C init file (strict), zero tensors",
               len(zero_like), 0, value_text=f"{len(zero_like)} zero")
        v_t = torch_forward(cmodel, inputs)
        v_c = c_forward(tool, work, out, inputs_path, f"{name}_cinit")
        record(f"[{name}] d. forward on the C-written file", forward_error(v_c, v_t),
               TOL_FORWARD)
    guarded(f"[{name}] d. C init file", check_init)

    # e. half-precision files written by PyTorch (all tensors, pos_embed too, in that dtype)
    for half in ("BF16", "F16"):
        def check_half(half=half):
            path = os.path.join(work, f"{name}_{half}.safetensors")
            dt.save_model(model, path, half)
            rounded = dt.load_model(path)
            with torch.no_grad():  # the table is fixed, not a weight: both sides use it exact
                rounded.pos_embed.copy_(model.pos_embed)
            v_t = torch_forward(rounded, inputs)
            v_c = c_forward(tool, work, path, inputs_path, f"{name}_{half}")
            record(f"[{name}] e. forward on {half} weights", forward_error(v_c, v_t),
                   TOL_FORWARD)
        guarded(f"[{name}] e. {half} weights", check_half)


def run_sigma_config(tool, work):
    """f. learned σ (DiT's published layout, inference only): the C forward's prediction and σ
    against PyTorch's 2C output channels, split."""
    cfg = dict(input_size=16, patch_size=2, in_channels=4, hidden_size=64, depth=2, num_heads=4,
               num_classes=5, mlp_ratio=4, freq_dim=256)
    name = "sigma"
    print(f"\n== {name}: learn_sigma, " + ", ".join(f"{k}={v}" for k, v in cfg.items()),
          flush=True)
    gen = torch.Generator().manual_seed(SEED + 7)
    model = dt.DiT(**cfg, learn_sigma=True)
    model.randomise(gen)
    weights = os.path.join(work, f"{name}_weights.safetensors")
    dt.save_model(model, weights, "F32", {"objective": "epsilon"})
    C, S, K = cfg["in_channels"], cfg["input_size"], cfg["num_classes"]
    inputs = {"x": torch.randn(BATCH, C, S, S, generator=gen),
              "t": torch.tensor([0.0, 0.001, 0.5, 0.81, 0.999]),  # DDPM steps / 1000
              "y": torch.tensor([0, K, 3, K - 1, K])}
    inputs_path = os.path.join(work, f"{name}_inputs.safetensors")
    dt.st_write(inputs_path, inputs, dtypes={"y": "I64"})

    def check():
        out = torch_forward(model, inputs)
        record(f"[{name}] f. PyTorch's output has 2C channels", out.shape[1], 2 * C,
               passed=out.shape[1] == 2 * C, value_text=str(out.shape[1]))
        path = os.path.join(work, f"v_{name}.safetensors")
        run_tool(tool, "forward", weights, inputs_path, path)
        got, _, _ = dt.st_read(path)
        record(f"[{name}] f. prediction (first C channels)", forward_error(got["v"], out[:, :C]),
               TOL_FORWARD)
        record(f"[{name}] f. sigma (last C channels)", forward_error(got["sigma"], out[:, C:]),
               TOL_FORWARD)
    guarded(f"[{name}] f. learned sigma", check)


def main():
    if len(sys.argv) != 2:
        print("usage: run_parity.py PATH/TO/dit_parity", file=sys.stderr)
        return 1
    tool = os.path.abspath(sys.argv[1])
    if not os.access(tool, os.X_OK):
        print(f"parity_dit: {tool} is not an executable; build the dit_parity target first",
              file=sys.stderr)
        return 1
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    torch.set_default_dtype(torch.float32)
    print(f"parity_dit: torch {torch.__version__}, 2 threads, float32, tool {tool}")
    start = time.time()
    work = tempfile.mkdtemp(prefix="tessera-parity-")
    try:
        for name, cfg, label_dtype in CONFIGS:
            run_config(tool, work, name, cfg, label_dtype)
        run_sigma_config(tool, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table()
    failed = [r for r in ROWS if not r[3]]
    verdict = "PASS" if not failed else "FAIL"
    print(f"\nparity_dit: {verdict}: {len(ROWS) - len(failed)}/{len(ROWS)} checks passed "
          f"in {time.time() - start:.1f} s")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
