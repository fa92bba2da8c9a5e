#!/usr/bin/python3
"""bench_gpu.py — the DiT expert on a GPU: tessera's CUDA engine against
PyTorch on the same device, forward and training samples/s, each as a fraction of the GEMM peak
measured in the same run.

Usage (from the repository root, after building bench_dit with the CUDA backend):
    python3 bench/bench_gpu.py [--build DIR] [--device cuda|cuda:N|cpu] [--config NAME ...]
                               [--batch B ...] [--train-batch B] [--seconds S] [--quick]
                               [--peak N] [--no-torch] [--json-out FILE] [--keep DIR]

Configs: `tiny` and `small` (the Fashion-MNIST experts, 28×28×1, 10 classes) and DiT-S/2, B/2,
L/2, XL/2 at 32×32×4 latents with 1000 classes (`dit-s`, `dit-b`, `dit-l`, `dit-xl`; Peebles &
Xie 2023, table 1: hidden 384/768/1024/1152, depth 12/12/24/28, heads 6/12/16/16). By default all
six on a GPU (DiT-XL/2 first: the target row) and `tiny` alone on the CPU (a dry run of
the script's plumbing).

For each config, in one run:
  1. the PyTorch DiT of tests/parity/dit_torch.py with random weights (every tensor non-zero)
     is written to a safetensors file, and its fp32 forward on fixed (x, t, y), computed on the
     device with TF32 off, to a check file;
  2. ours: `bench_dit --device D --check FILE` (the forward must agree to 1e-3 relative, 3e-2
     in bf16, 5e-3 in f16, else nothing of it is timed and the disagreement is recorded),
     forward at each batch and a training step (ts_trainer_step) at the training batch, fp32,
     then bf16 (`--precision bf16`; where the engine has no bf16 path, the reason it gave is
     recorded), then f16 (`--precision f16`, its training with dynamic loss scaling);
  3. (after the configs) the attention alone, composed against fused (`bench_dit
     --attention-ops 64`: the target is the fused ≥ 2× the composed at T = 256); and, for the
     configs of GRAPH_CONFIGS, the bf16 forward at batches 1 and 8 eagerly, through CUDA
     graphs (`bench_dit --graphs`) and with the linears' bias (fc1's bias and GELU) in
     cuBLASLt's epilogue (TESSERA_CUDA_EPILOGUES=1), side by side (the launch-bound rows), and the bf16 training
     step at batch 8 eagerly and through CUDA graphs (its forward and backward as one graph);
     and for every config
     the bf16 forward at the largest batch as `bench_dit --attention measure` sets it up
     (ts_dit_tune: the attention, the epilogues and the graphs measured fastest, what a GPU
     daemon serves with by default);
  4. PyTorch on the same device, with its best attention (F.scaled_dot_product_attention where
     it has it; the JSON says which): forward (eval, no_grad) at each batch and the same training
     step as ours (flow matching, MSE, backward, gradient clipping, AdamW, EMA), in fp32 (TF32
     off, so both sides do fp32 products), under torch.autocast(bfloat16), and under
     torch.autocast(float16) (training with torch's GradScaler).
Both sides are timed call by call after a warm-up, each call ending with the device
synchronised, for at least S seconds and 5 calls; the figure is the median call. Ours' GEMM peak
comes from a `bench_dit --peak N` call of its own (the engine's N³ product, fp32, bf16 and f16),
PyTorch's from its own N³ torch.matmul; every row is reported as samples/s, ours/PyTorch, and GFLOP/s (the forward's
GEMM FLOPs per sample, ×3 for a training step) as a fraction of ours' peak of that precision.

A failure of one row (out of memory, an unsupported path) is recorded in the JSON with its
message and the run goes on; the exit status is 0 when the run completed, 1 when a tool could
not be run at all, 2 on bad arguments.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(ROOT, "tests", "parity"))

MNIST = dict(input_size=28, in_channels=1, num_classes=10)
LATENT = dict(input_size=32, in_channels=4, num_classes=1000, patch_size=2)
CONFIGS = {
    "tiny": dict(MNIST, patch_size=4, hidden_size=128, depth=4, num_heads=4),
    "small": dict(MNIST, patch_size=2, hidden_size=256, depth=6, num_heads=4),
    "dit-s": dict(LATENT, hidden_size=384, depth=12, num_heads=6),
    "dit-b": dict(LATENT, hidden_size=768, depth=12, num_heads=12),
    "dit-l": dict(LATENT, hidden_size=1024, depth=24, num_heads=16),
    "dit-xl": dict(LATENT, hidden_size=1152, depth=28, num_heads=16),
}
CHECK_BATCH = 4
TOL_F32 = 1e-3   # ours against PyTorch's fp32 forward, relative to max(1, max|v|)
TOL_BF16 = 3e-2  # ours bf16 against the same fp32 forward
TOL_F16 = 5e-3  # ours f16 likewise (3 more significant bits than bf16)
WARMUP_CALLS, WARMUP_SECONDS, MIN_CALLS = 3, 0.2, 5
DATA_N = 1024    # synthetic training images, as bench_dit.c
# the GPU target: DiT-XL training at batch 64 in bf16 at >= 60 % of the bf16 GEMM peak
TARGET = ("dit-xl", "train_b64_bf16", 0.60)
GRAPH_CONFIGS = ("tiny", "small", "dit-b")  # the graph rows: small models at small batches
GRAPH_BATCHES = (1, 8)
GRAPH_TRAIN_BATCH = 8  # the training step eagerly and through CUDA graphs (eager and graphs modes)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="the build tree (default build)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--config", action="append", choices=list(CONFIGS),
                    help="a config; repeat for several (default: all on a GPU, tiny on the CPU)")
    ap.add_argument("--batch", action="append", type=int,
                    help="a forward batch; repeat (default 1 16 64 256)")
    ap.add_argument("--train-batch", type=int, default=64, help="0: no training rows (default 64)")
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per row (1.0)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 0.2 s per row, 3 calls")
    ap.add_argument("--peak", type=int, default=None,
                    help="N of the N³ GEMM peaks (default 8192 on a GPU, 1024 on the CPU)")
    ap.add_argument("--no-torch", action="store_true", help="ours only")
    ap.add_argument("--attention-batch", type=int, default=64,
                    help="batch of the attention-alone rows (default 64)")
    ap.add_argument("--json-out", metavar="FILE", help="also write the JSON document here")
    ap.add_argument("--keep", metavar="DIR", help="keep the weights and check files in DIR")
    ap.add_argument("--vae-size", type=int, default=256,
                    help="side of the VAE rows' image (default 256; 0: no VAE rows)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds one bench_dit run may take (default 600)")
    a = ap.parse_args()
    gpu = a.device.startswith("cuda")
    if not gpu and a.device != "cpu":
        ap.error(f"--device: '{a.device}' is not cpu, cuda or cuda:N")
    # on a GPU the target's config first: a run cut short by its time limit still has it
    a.config = a.config or (["dit-xl"] + [c for c in CONFIGS if c != "dit-xl"] if gpu else ["tiny"])
    a.batch = a.batch or [1, 16, 64, 256]
    if any(b < 1 for b in a.batch) or a.train_batch < 0:
        ap.error("batches must be positive (--train-batch 0 skips training)")
    if a.seconds is None:
        a.seconds = 0.2 if a.quick else 1.0
    if a.peak is None:
        a.peak = 8192 if gpu else 1024
    return a


ARGS = parse_args()
if ARGS.quick:
    WARMUP_CALLS, WARMUP_SECONDS, MIN_CALLS = 1, 0.05, 3

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dit_torch as dt  # noqa: E402
import timing  # noqa: E402  (bench/, this script's folder)

LOG = sys.stderr


def log(*a):
    print(*a, file=LOG, flush=True)


def torch_device():
    if ARGS.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        return None
    return torch.device(ARGS.device if ":" in ARGS.device else "cuda:0")


DEV = torch_device()


def sync():
    if DEV is not None and DEV.type == "cuda":
        torch.cuda.synchronize(DEV)


def time_calls(fn):
    """Warm-up, then fn timed call by call, each ending with the device synchronised."""
    return timing.time_calls(fn, ARGS.seconds, WARMUP_CALLS, WARMUP_SECONDS, MIN_CALLS, sync)


def guarded(what, fn):
    """fn(), or the error it raised (a row that cannot run is recorded, not fatal)."""
    try:
        return fn()
    except Exception as e:  # out of memory, an unsupported dtype path, ...
        log(f"  {what}: {type(e).__name__}: {str(e)[:200]}")
        if DEV is not None and DEV.type == "cuda":
            torch.cuda.empty_cache()
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


# ---- PyTorch ---------------------------------------------------------------------------------

def random_inputs(cfg, B, gen):
    C, S, K = cfg["in_channels"], cfg["input_size"], cfg["num_classes"]
    x = torch.randn(B, C, S, S, generator=gen)
    t = torch.rand(B, generator=gen)
    y = torch.randint(0, K + 1, (B,), generator=gen)  # the null class included
    return x.to(DEV), t.to(DEV), y.to(DEV)


AUTOCAST = {"": None, "_bf16": torch.bfloat16, "_f16": torch.float16}


def autocast(sfx):
    """torch.autocast for a row's precision suffix ("" fp32, "_bf16", "_f16")."""
    dtype = AUTOCAST[sfx]
    return torch.autocast(DEV.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def torch_forward(model, cfg, B, sfx, gen):
    x, t, y = random_inputs(cfg, B, gen)
    model.eval()

    def step():
        with torch.no_grad(), autocast(sfx):
            model(x, t, y)
    return time_calls(step)


def grad_scaler(enabled):
    """torch's dynamic loss scaler (torch.amp's where this torch has it, else torch.cuda.amp's)."""
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(DEV.type, enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled and DEV.type == "cuda")


def torch_train(model, cfg, B, sfx, gen):
    """model/trainer.c's step: a batch with 10 % of labels dropped to the null class, t ~ U(0, 1),
    ε ~ N(0, 1), x_t = (1 − t)·x0 + t·ε, MSE against ε − x0, backward, clip to 1, AdamW, EMA;
    bf16: forward and loss under autocast (fp32 weights, gradients and AdamW); f16 likewise, with
    torch's GradScaler (dynamic loss scaling, as ours)."""
    C, S, K = cfg["in_channels"], cfg["input_size"], cfg["num_classes"]
    data = (torch.rand(DATA_N, C, S, S, generator=gen) * 2 - 1).to(DEV)
    labels = torch.randint(0, K, (DATA_N,), generator=gen).to(DEV)
    params = [p for _, p in model.trainable()]
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            foreach=True)
    scaler = grad_scaler(sfx == "_f16")
    model.train()

    def step():
        idx = torch.randint(0, DATA_N, (B,), device=DEV)
        x0 = data[idx]
        y = torch.where(torch.rand(B, device=DEV) < 0.1, torch.full((B,), K, device=DEV),
                        labels[idx])
        t = torch.rand(B, device=DEV)
        eps = torch.randn_like(x0)
        tb = t[:, None, None, None]
        xt = (1 - tb) * x0 + tb * eps
        with autocast(sfx):
            loss = F.mse_loss(model(xt, t, y).float(), eps - x0)
        opt.zero_grad(set_to_none=False)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()
        with torch.no_grad():
            torch._foreach_mul_(ema, 0.999)
            torch._foreach_add_(ema, params, alpha=0.001)
    try:
        return time_calls(step)
    finally:
        del opt, ema, data, labels


COMPOSED_ATTENTION = dt.Attention.forward
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


def sdpa_attention(self, x):
    """PyTorch's best attention for the timed rows: F.scaled_dot_product_attention (its flash /
    memory-efficient kernels on a GPU), in place of the reference module's composed attention,
    which the check uses."""
    B, T, h = x.shape
    qkv = self.qkv(x).reshape(B, T, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
    return self.proj(y.transpose(1, 2).reshape(B, T, h))


def torch_peaks(n):
    out = {"size": n}
    for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16),
                        ("f16", torch.float16)):
        def run():
            a = torch.randn(n, n, device=DEV).to(dtype)
            b = torch.randn(n, n, device=DEV).to(dtype)
            r = time_calls(lambda: torch.matmul(a, b))
            return 2.0 * n ** 3 / r["median_s"] / 1e9
        v = guarded(f"torch {name} peak", run)
        out[name + "_gflops"] = v if isinstance(v, float) else None
    return out


# ---- ours ----------------------------------------------------------------------------------

def bench_dit():
    exe = os.path.join(ARGS.build, "bench", "bench_dit")
    if not os.path.isfile(exe):
        log(f"bench_gpu.py: no {exe} (build it: cmake --build {ARGS.build} --target bench_dit), "
            f"or pass --build DIR")
        sys.exit(1)
    return exe


def run_peak(weights):
    """Ours' N³ GEMM peaks, fp32, bf16 and f16 (an f16 run measures all three), in a call of
    their own (no check, one short row), so that they do not depend on the first config's rows
    running."""
    cmd = [bench_dit(), "--device", ARGS.device, "--weights", weights, "--batch", "1",
           "--train-batch", "0", "--seconds", "0.2", "--quick", "--precision", "f16",
           "--peak", str(ARGS.peak), "--json"]
    log(f"  GEMM peak: {' '.join(cmd)}")
    out = run_child(cmd)
    return out if "error" in out else dict(out.get("peak", {}), device=out.get("device"))


GIB = float(1 << 30)


def why_skipped(s):
    if s.get("needs_gib") is None:
        return s.get("reason", "cannot run")
    return f"needs {s['needs_gib']:.2f} GiB, {s['usable_gib']:.2f} GiB usable"


def what_fits(weights, precision):
    """The forward batches and the training batch that fit the device's usable memory now, as
    `bench_dit --memory --json` says row by row (computed from the config; each bench_dit row
    builds its own model, so each row must fit alone), and a note for each that does not."""
    cmd = [bench_dit(), "--device", ARGS.device, "--weights", weights, "--memory", "--json",
           "--precision", precision, "--train-batch", str(ARGS.train_batch)]
    for B in ARGS.batch:
        cmd += ["--batch", str(B)]
    m = run_child(cmd)
    if "rows" not in m:  # no figures: try every row, and record what fails
        return ARGS.batch, ARGS.train_batch, []
    usable = m["memory"]["device_usable_bytes"] / GIB
    skipped, batches, train = [], [], 0
    for r in m["rows"]:
        if r["fits"]:
            if r["what"] == "forward":
                batches.append(r["batch"])
            else:
                train = r["batch"]
        elif r["bytes"] is None:
            skipped.append({"row": f"train_b{r['batch']}", "needs_gib": None,
                            "reason": "this config cannot be trained: its training activations "
                                      "pass the per-sample bound of model/dit.h"})
        else:
            skipped.append({"row": f"{r['what']}_b{r['batch']}", "needs_gib": r["bytes"] / GIB,
                            "usable_gib": usable})
    for s in skipped:
        log(f"  ours {precision}: {s['row']} skipped: {why_skipped(s)}")
    return batches, train, skipped


def run_ours(weights, check, precision):
    tol = {"f32": TOL_F32, "bf16": TOL_BF16, "f16": TOL_F16}[precision]
    batches, train, skipped = what_fits(weights, precision)
    if not batches:  # the check needs a forward model: the smallest batch, tried anyway
        batches = [min(ARGS.batch)]
    cmd = [bench_dit(), "--device", ARGS.device, "--weights", weights, "--check", check,
           "--tol", str(tol), "--precision", precision, "--seconds", str(ARGS.seconds),
           "--train-batch", str(train), "--json"]
    for B in batches:
        cmd += ["--batch", str(B)]
    if ARGS.quick:
        cmd.append("--quick")
    log(f"  ours {precision}: {' '.join(cmd)}")
    out = run_child(cmd)
    if skipped:
        out["skipped"] = skipped
    return out


GRAPH_MODES = ("eager", "graphs", "epilogues")


def run_graphs(weights, check):
    """The bf16 forward at GRAPH_BATCHES eagerly, then through CUDA graphs (`--graphs`), then
    with cuBLASLt's epilogues (the linears' bias; fc1's bias and GELU): three bench_dit runs of
    the same rows, back to back; the first two with the training step at GRAPH_TRAIN_BATCH too
    (eager, then graphed)."""
    out = {}
    for mode in GRAPH_MODES:
        tb = GRAPH_TRAIN_BATCH if mode != "epilogues" else 0
        cmd = [bench_dit(), "--device", ARGS.device, "--weights", weights, "--check", check,
               "--tol", str(TOL_BF16), "--precision", "bf16", "--seconds", str(ARGS.seconds),
               "--train-batch", str(tb), "--json"] + (["--graphs"] if mode == "graphs" else [])
        for B in GRAPH_BATCHES:
            cmd += ["--batch", str(B)]
        if ARGS.quick:
            cmd.append("--quick")
        env = dict(os.environ, TESSERA_CUDA_EPILOGUES="1") if mode == "epilogues" else None
        log(f"  ours bf16 {mode}: {' '.join(cmd)}")
        out[mode] = run_child(cmd, env)
    return out


def run_measured(weights, check, precision):
    """The forward at the largest --batch that fits with what ts_dit_tune measures fastest here
    (`bench_dit --attention measure`: the attention, the cuBLASLt epilogues, CUDA graphs)."""
    batches, _, skipped = what_fits(weights, precision)
    if not batches:
        return {"error": "no batch fits: " + "; ".join(why_skipped(x) for x in skipped)}
    B = max(batches)
    cmd = [bench_dit(), "--device", ARGS.device, "--weights", weights, "--check", check,
           "--tol", str({"bf16": TOL_BF16, "f16": TOL_F16}[precision]), "--precision", precision,
           "--seconds", str(ARGS.seconds), "--train-batch", "0", "--batch", str(B),
           "--attention", "measure", "--json"]
    if ARGS.quick:
        cmd.append("--quick")
    log(f"  ours {precision} measured: {' '.join(cmd)}")
    return run_child(cmd)


def run_child(cmd, env=None):
    """A bench_dit run's JSON document, or {"error": its last line of stderr} (a failed check,
    exit 3, times nothing; an unsupported path or out of memory is also recorded, not fatal)."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=ARGS.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {ARGS.timeout:.0f} s", "command": " ".join(cmd)}
    msg = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
    if p.returncode != 0:
        log(f"  exit {p.returncode}: {msg}")
        return {"error": msg, "exit": p.returncode, "command": " ".join(cmd)}
    try:
        out = json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"error": f"no JSON from bench_dit: {msg}", "command": " ".join(cmd)}
    out["command"] = " ".join(cmd)
    return out


def attention_ops():
    """The attention alone, composed against fused (`bench_dit --attention-ops`): the heads of
    tiny and small at T = 64 and 256, forward and forward + backward (the target: fused
    ≥ 2× the composed at T = 256)."""
    cmd = [bench_dit(), "--attention-ops", str(ARGS.attention_batch), "--device", ARGS.device,
           "--seconds", str(ARGS.seconds), "--json"] + (["--quick"] if ARGS.quick else [])
    log(f"attention ops: {' '.join(cmd)}")
    return run_child(cmd)


# ---- one config ----------------------------------------------------------------------------

def run_config(name, work, first):
    cfg = dict(CONFIGS[name])
    res = {"config": cfg}
    gen = torch.Generator().manual_seed(20261126)
    t0 = time.perf_counter()
    model = dt.DiT(**cfg)
    model.randomise(gen)
    weights = os.path.join(work, f"{name}.safetensors")
    dt.save_model(model, weights)
    x, t, y = (v.cpu() for v in random_inputs(cfg, CHECK_BATCH, gen))
    model.to(DEV).eval()
    with torch.no_grad():
        v = model(x.to(DEV), t.to(DEV), y.to(DEV)).cpu()
    check = os.path.join(work, f"{name}.check.safetensors")
    dt.st_write(check, {"x": x, "t": t, "y": y, "v": v})
    model.cpu()
    sync()
    if DEV.type == "cuda":
        torch.cuda.empty_cache()
    res["num_params"] = sum(p.numel() for _, p in model.trainable())
    log(f"[{name}] {res['num_params'] / 1e6:.1f} M parameters; weights and check written in "
        f"{time.perf_counter() - t0:.1f} s")

    if first:
        res["peak"] = run_peak(weights)
    res["ours"] = run_ours(weights, check, "f32")
    res["ours_bf16"] = run_ours(weights, check, "bf16")
    res["ours_f16"] = run_ours(weights, check, "f16")
    if name in GRAPH_CONFIGS:
        res["graphs_bf16"] = run_graphs(weights, check)
    res["measured_bf16"] = run_measured(weights, check, "bf16")

    if not ARGS.no_torch:
        tr = {}
        model.to(DEV)
        if HAVE_SDPA:  # the timed rows compute what the check did (within rounding)
            dt.Attention.forward = sdpa_attention
            with torch.no_grad():
                v2 = model(x.to(DEV), t.to(DEV), y.to(DEV)).cpu()
            res["torch_sdpa_rel"] = ((v2 - v).abs().max() / max(1.0, v.abs().max())).item()
        for sfx in AUTOCAST:
            for B in ARGS.batch:
                tr[f"forward_b{B}{sfx}"] = guarded(
                    f"torch forward b{B}{sfx}", lambda: torch_forward(model, cfg, B, sfx, gen))
            if ARGS.train_batch:
                B = ARGS.train_batch
                tr[f"train_b{B}{sfx}"] = guarded(
                    f"torch train b{B}{sfx}", lambda: torch_train(model, cfg, B, sfx, gen))
        res["torch"] = tr
        dt.Attention.forward = COMPOSED_ATTENTION
    del model
    if DEV.type == "cuda":
        torch.cuda.empty_cache()
    return res


def rows_of(res, peaks):
    """The table's rows: key, ours and PyTorch samples/s, ratio, fraction of ours' peak."""
    out = []
    flops = None
    for which, sfx in (("ours", ""), ("ours_bf16", "_bf16"), ("ours_f16", "_f16")):
        ours = res.get(which, {})
        if "results" not in ours:
            continue
        flops = ours.get("flops_per_sample", flops)
        peak = peaks.get((sfx[1:] or "f32") + "_gflops")
        for r in ours["results"]:
            key = f"{r['what']}_b{r['batch']}{sfx}"
            tr = res.get("torch", {}).get(key, {})
            t_sps = 1.0 / tr["median_s"] * r["batch"] if "median_s" in tr else None
            mult = 3.0 if r["what"] == "train" else 1.0
            gflops = r["samples_per_s"] * ours["flops_per_sample"] * mult / 1e9
            out.append({"key": key, "ours": r["samples_per_s"], "torch": t_sps,
                        "ratio": r["samples_per_s"] / t_sps if t_sps else None,
                        "gflops": gflops, "of_peak": gflops / peak if peak else None})
    for key, tr in res.get("torch", {}).items():  # PyTorch rows ours could not run
        if "median_s" in tr and not any(r["key"] == key for r in out):
            B = int(key.split("_b")[1].split("_")[0])
            out.append({"key": key, "ours": None, "torch": B / tr["median_s"], "ratio": None,
                        "gflops": None, "of_peak": None})
    return out


def vae_rows(work, peaks):
    """The VAE (sd-vae-ft-mse's configuration, random weights written once for both sides) encoding
    one --vae-size² image and decoding its latent on the device: ours (bench_vae --device, the
    tensors on the device, f32, bf16 and f16 products) against PyTorch eager (tests/parity/
    vae_torch.py; bf16 and f16 by autocast), the median call each, its end synchronised. FLOPs
    are counted on the PyTorch model (every convolution and the attention's products, 2 per
    multiply-add); a row's fraction is of our own peak of its precision (bench_dit --peak)."""
    import vae_torch as vt
    from flops import count_flops
    S = ARGS.vae_size
    vae = vt.AutoencoderKL(vt.SD_VAE_FT_MSE).eval()
    vt.randomize(vae, 11)
    path = os.path.join(work, "vae.safetensors")
    vt.save(vae, path)
    exe = os.path.join(ARGS.build, "bench", "bench_vae")
    out = {"size": S, "rows": []}
    for prec in ("f32", "bf16", "f16"):
        cmd = [exe, "--weights", path, "--size", str(S), "--device", ARGS.device, "--precision",
               prec, "--seconds", str(ARGS.seconds), "--json"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=ARGS.timeout)
        if p.returncode != 0:
            out[prec] = {"error": (p.stderr.strip().splitlines() or ["no output"])[-1],
                         "command": " ".join(cmd)}
            log(f"  VAE {prec}: {out[prec]['error']}")
            continue
        out[prec] = json.loads(p.stdout.strip().splitlines()[-1])
    vae = vae.to(DEV)
    x = torch.rand(1, 3, S, S, device=DEV) * 2 - 1
    z = torch.randn(1, 4, S // 8, S // 8, device=DEV)
    flops = {"encode": count_flops(vae, lambda: vae.encode(x)),
             "decode": count_flops(vae, lambda: vae.decode(z))}
    for prec, dtype in (("f32", None), ("bf16", torch.bfloat16), ("f16", torch.float16)):
        for what, fn in (("encode", lambda: vae.encode(x)), ("decode", lambda: vae.decode(z))):
            def run(fn=fn, dtype=dtype):
                with torch.no_grad():
                    if dtype is None:
                        return fn()
                    with torch.autocast(DEV.type, dtype=dtype):
                        return fn()
            t = None if ARGS.no_torch else guarded(f"PyTorch VAE {what} {prec}",
                                                   lambda: time_calls(run))
            torch_s = t.get("median_s") if isinstance(t, dict) else None
            ours_s = out.get(prec, {}).get(f"{what}_s")
            gflops = flops[what] / ours_s / 1e9 if ours_s else None
            peak = peaks.get(f"{prec}_gflops")
            out["rows"].append({"key": f"vae_{what}_{prec}", "ours_s": ours_s, "torch_s": torch_s,
                                "ratio": torch_s / ours_s if ours_s and torch_s else None,
                                "gflop": flops[what] / 1e9, "ours_gflops": gflops,
                                "of_peak": gflops / peak if gflops and peak else None})
    del vae
    if DEV.type == "cuda":
        torch.cuda.empty_cache()
    return out


def fmt(v, spec):
    return format(v, spec) if v is not None else "—"


def main():
    if DEV is None:
        log(f"bench_gpu.py: PyTorch sees no CUDA device for --device {ARGS.device}")
        sys.exit(1)
    work = ARGS.keep or tempfile.mkdtemp(prefix="bench_gpu.")
    os.makedirs(work, exist_ok=True)
    doc = {"device": ARGS.device, "engine": None, "torch_version": torch.__version__,
           "gpu": torch.cuda.get_device_name(DEV) if DEV.type == "cuda" else None,
           "seconds": ARGS.seconds, "batches": ARGS.batch, "train_batch": ARGS.train_batch,
           "configs": {}}
    doc["torch_attention"] = "sdpa" if HAVE_SDPA else "composed"
    if DEV.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 rows are fp32 products on both sides
        torch.backends.cudnn.allow_tf32 = False
    try:
        for i, name in enumerate(ARGS.config):
            res = doc["configs"][name] = run_config(name, work, i == 0)
            if i == 0:
                doc["peak_ours"] = res.pop("peak", {})
                doc["engine"] = doc["peak_ours"].get("device") or res.get("ours", {}).get("device")
            res["rows"] = rows_of(res, doc.get("peak_ours") or {})
            save(doc)  # as it goes: a run stopped by its time limit keeps what it measured
        if ARGS.vae_size > 0:
            doc["vae"] = guarded("the VAE rows", lambda: vae_rows(work, doc.get("peak_ours") or {}))
            save(doc)
        doc["attention_ops"] = attention_ops()
        save(doc)
        if not ARGS.no_torch:
            doc["peak_torch"] = torch_peaks(ARGS.peak)
    finally:
        if not ARGS.keep:
            shutil.rmtree(work, ignore_errors=True)

    peaks = doc.get("peak_ours") or {}
    print(f"device: {doc['engine'] or ARGS.device}; GPU: {doc['gpu']}; torch {doc['torch_version']}")
    pt = doc.get("peak_torch", {})
    print(f"GEMM peak {ARGS.peak}³: ours fp32 {fmt(peaks.get('f32_gflops'), '.0f')} GFLOP/s, "
          f"bf16 {fmt(peaks.get('bf16_gflops'), '.0f')}, f16 {fmt(peaks.get('f16_gflops'), '.0f')}; "
          f"PyTorch fp32 {fmt(pt.get('f32_gflops'), '.0f')}, bf16 {fmt(pt.get('bf16_gflops'), '.0f')}, "
          f"f16 {fmt(pt.get('f16_gflops'), '.0f')}")
    print(f"{'config':8} {'row':22} {'ours/s':>10} {'torch/s':>10} {'ratio':>6} "
          f"{'GFLOP/s':>9} {'of peak':>8}")
    for name, res in doc["configs"].items():
        for which in ("ours", "ours_bf16", "ours_f16"):
            if "error" in res.get(which, {}):
                print(f"{name:8} {which:22} not run: {res[which]['error']}")
            for s in res.get(which, {}).get("skipped", []):
                print(f"{name:8} {s['row'] + '_' + which[5:] if which != 'ours' else s['row']:22} "
                      f"not run: {why_skipped(s)}")
        for r in res["rows"]:
            print(f"{name:8} {r['key']:22} {fmt(r['ours'], '10.1f')} {fmt(r['torch'], '10.1f')} "
                  f"{fmt(r['ratio'], '6.2f')} {fmt(r['gflops'], '9.0f')} "
                  f"{fmt(r['of_peak'] and 100 * r['of_peak'], '7.1f')}%")
    for name, res in doc["configs"].items():
        ms = res.get("measured_bf16")
        if ms and "measured" in ms and ms.get("results"):
            t, r = ms["measured"], ms["results"][0]
            print(f"{name} bf16 forward b{r['batch']} as measured fastest: {r['samples_per_s']:.1f}/s "
                  f"({t['attention']} attention: fused {t['ms_fused']:.2f} ms, composed "
                  f"{t['ms_composed']:.2f} ms; epilogues {'on' if t['epilogues'] else 'off'}; "
                  f"graphs {'on' if t['graphs'] else 'off'})")
        elif ms:
            print(f"{name} bf16 measured: not run: {ms.get('error', 'no measurement')}")
        g = res.get("graphs_bf16")
        if not g:
            continue
        rows = {m: {r["batch"]: r for r in g[m].get("results", []) if r["what"] == "forward"}
                for m in GRAPH_MODES}
        trains = [next((r for r in g[m].get("results", []) if r["what"] == "train"), None)
                  for m in GRAPH_MODES[:2]]
        if all(trains):
            e, c = trains
            print(f"{name} bf16 train b{e['batch']}: eager {e['samples_per_s']:.1f}/s, "
                  f"CUDA graphs {c['samples_per_s']:.1f}/s "
                  f"({c['samples_per_s'] / e['samples_per_s']:.2f}×; "
                  f"{c['graph_launches']} steps one launch, warm-up included; "
                  f"{c['calls']} timed)")
        else:
            why = next((g[m]["error"] for m in GRAPH_MODES[:2] if "error" in g[m]), "not measured")
            print(f"CUDA graphs {name} bf16 train b{GRAPH_TRAIN_BATCH}: not run: {why}")
        for B in GRAPH_BATCHES:
            e, c, lt = (rows[m].get(B) for m in GRAPH_MODES)
            if not e or not c or not lt:
                why = next((g[m]["error"] for m in GRAPH_MODES if "error" in g[m]), "not measured")
                print(f"CUDA graphs / epilogues {name} bf16 forward b{B}: not run: {why}")
                continue
            print(f"{name} bf16 forward b{B}: eager {e['samples_per_s']:.1f}/s, "
                  f"CUDA graphs {c['samples_per_s']:.1f}/s ({c['samples_per_s'] / e['samples_per_s']:.2f}×; "
                  f"{c['graph_launches']} calls one launch, warm-up included; {c['calls']} timed), "
                  f"cuBLASLt epilogues {lt['samples_per_s']:.1f}/s "
                  f"({lt['samples_per_s'] / e['samples_per_s']:.2f}×)")
    att = doc.get("attention_ops", {})
    if "rows" in att:
        print(f"attention alone, batch {att['batch']}: composed time / fused time")
        for r in att["rows"]:
            print(f"  {r['preset']:6} T={r['T']:<4} {r['what']:22} {r['composed_over_fused']:6.2f}×")
    elif "error" in att:
        print(f"attention alone: not run: {att['error']}")
    vae = doc.get("vae", {})
    for r in vae.get("rows", []):
        print(f"VAE {vae['size']}² {r['key'][4:]:14} ours {fmt(r['ours_s'] and 1e3 * r['ours_s'], '8.1f')} ms"
              f"  torch {fmt(r['torch_s'] and 1e3 * r['torch_s'], '8.1f')} ms"
              f"  ratio {fmt(r['ratio'], '5.2f')}  {fmt(r['ours_gflops'], '8.0f')} GFLOP/s"
              f" ({fmt(r['of_peak'] and 100 * r['of_peak'], '.1f')} % of peak)")
    if "error" in vae:
        print(f"VAE: not run: {vae['error']}")
    cfg, key, line = TARGET
    got = next((r for r in doc["configs"].get(cfg, {}).get("rows", []) if r["key"] == key), None)
    doc["target"] = {"config": cfg, "row": key, "of_bf16_peak_at_least": line,
                     "measured": got["of_peak"] if got else None,
                     "met": bool(got and got["of_peak"] and got["of_peak"] >= line)}
    if cfg in doc["configs"]:
        print(f"target: {cfg} {key} ≥ {100 * line:.0f} % of the bf16 peak: " +
              (f"{100 * got['of_peak']:.1f} %" if got and got["of_peak"] else "not measured"))
    save(doc)
    return 0


def save(doc):
    if ARGS.json_out:
        with open(ARGS.json_out + ".part", "w") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
        os.replace(ARGS.json_out + ".part", ARGS.json_out)


if __name__ == "__main__":
    sys.exit(main())
