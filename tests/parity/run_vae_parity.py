#!/usr/bin/env python3
"""run_vae_parity.py — tessera's VAE (model/vae.c) checked against the PyTorch one in vae_torch.py.

Usage: run_vae_parity.py PATH/TO/vae_parity              the test (ctest's parity_vae)
       run_vae_parity.py PATH/TO/vae_parity --full OUT.json
                                                        one sd-vae-ft-mse-sized run, 256×256

Exit 0 when every check passes, 1 when one fails, 77 (skipped) when torch cannot be imported.

For each reduced config, random weights (vae_torch.randomize) are written twice — under
diffusers' current attention names (to_q … to_out.0, Linear weights) and under the older ones
(query … proj_attn, as (C, C, 1, 1) conv weights) — and the C model, loading each, must:
  a. find the naming the file uses;
  b. encode a random image in [-1, 1] to mean · 0.18215 and logvar, and decode a random latent,
     within TOL of PyTorch in float64 on the same weights: max|c − ref| ≤ TOL · max(1, max|ref|)
     for each of mean, logvar and decoded;
  c. give the same bits under both namings;
  d. with bf16 and f16 products (ts_vae_set_precision), stay within TOL_LP of float64.
PyTorch's own float32 run is measured against float64 beside it, so the report shows what float32
rounding alone costs. --full does the same once at the released model's size (random weights),
prints the figures and writes them as JSON; it asserts the same bound.
"""

import json
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
    print(f"parity_vae: SKIP: cannot import torch ({exc.__class__.__name__}: {exc}); "
          "install Debian's python3-torch to run the PyTorch parity test")
    sys.exit(77)

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vae_torch as vt  # noqa: E402

TOL = 1e-5  # max|c − ref64| relative to max(1, max|ref64|), per output (seen: under 1e-6)
# The 16-bit products (ts_vae_set_precision): operands rounded, fp32 accumulation, everything else
# fp32. Bounded as fp32 is, looser by the operands' rounding through the layers (bf16: 8
# significant bits, f16: 11); PyTorch's own bf16 autocast error is printed beside it.
TOL_LP = {"bf16": 5e-2, "f16": 1e-2}

CONFIGS = [
    # two levels, one layer a block: a shortcut conv in every level change, 8 groups
    ("two-level", dict(in_channels=3, out_channels=3, latent_channels=4, block_out=[32, 64],
                       layers_per_block=1, groups=8, scaling_factor=0.18215), 2, 16, 24),
    # three levels, two layers, equal channels at the bottom (no shortcut there), 4 groups
    ("three-level", dict(in_channels=3, out_channels=3, latent_channels=4, block_out=[16, 32, 32],
                         layers_per_block=2, groups=4, scaling_factor=0.18215), 1, 24, 16),
]


def run_c(tool, weights, inputs, out, precision="f32"):
    p = subprocess.run([tool, "run", weights, inputs, out, precision], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise RuntimeError(f"vae_parity failed ({p.returncode}): {p.stderr.strip()}")
    info = json.loads(p.stdout.strip().splitlines()[-1])
    tensors, _, _ = vt.st_read(out)
    return tensors, info


def errors(got, ref):
    d = (got.double() - ref.double()).abs()
    scale = max(1.0, ref.abs().max().item())
    return {"max_abs": d.max().item(), "max_ref": ref.abs().max().item(),
            "rel_to_max": d.max().item() / scale}


def one_config(tool, name, cfg, B, H, W, seed, namings, work):
    torch.manual_seed(seed)
    model = vt.AutoencoderKL(cfg).eval()
    vt.randomize(model, seed)
    f = 2 ** (len(cfg["block_out"]) - 1)
    g = torch.Generator().manual_seed(seed + 1)
    image = torch.rand(B, cfg["in_channels"], H, W, generator=g) * 2 - 1
    latent = torch.randn(B, cfg["latent_channels"], H // f, W // f, generator=g)
    inputs = os.path.join(work, f"{name}.inputs.safetensors")
    vt.st_write(inputs, {"image": image, "latent": latent})

    t0 = time.time()
    with torch.no_grad():
        mean32, logvar32 = model.encode(image)
        dec32 = model.decode(latent)
    t_torch32 = time.time() - t0
    t0 = time.time()
    with torch.no_grad():
        m64 = model.double()
        mean64, logvar64 = m64.encode(image.double())
        dec64 = m64.decode(latent.double())
        model.float()
    t_torch64 = time.time() - t0
    ref = {"mean": mean64, "logvar": logvar64, "decoded": dec64}
    t32 = {"mean": mean32, "logvar": logvar32, "decoded": dec32}

    result = {"config": cfg, "batch": B, "height": H, "width": W,
              "torch_f32_s": round(t_torch32, 3), "torch_f64_s": round(t_torch64, 3),
              "torch_threads": torch.get_num_threads(), "runs": {}}
    ok, first = True, None
    for naming in namings:
        weights = os.path.join(work, f"{name}.{naming}.safetensors")
        vt.save(model, weights, naming)
        out = os.path.join(work, f"{name}.{naming}.out.safetensors")
        c, info = run_c(tool, weights, inputs, out)
        want_naming = "to_q/to_k/to_v/to_out.0" if naming == "new" else "query/key/value/proj_attn"
        run = {"c": info, "outputs": {}}
        if info["attn_naming"] != want_naming:
            print(f"FAIL {name}/{naming}: the loader reported naming {info['attn_naming']!r}")
            ok = False
        for key in ("mean", "logvar", "decoded"):
            e_c = errors(c[key], ref[key])
            e_t = errors(t32[key], ref[key])
            e_ct = errors(c[key], t32[key])
            passed = e_c["rel_to_max"] <= TOL
            ok &= passed
            run["outputs"][key] = {"c_vs_torch64": e_c, "torch32_vs_torch64": e_t,
                                   "c_vs_torch32": e_ct, "passed": passed}
            print(f"{'ok  ' if passed else 'FAIL'} {name:12s} {naming:3s} {key:8s} "
                  f"max|c-t64| {e_c['max_abs']:.3e} (rel {e_c['rel_to_max']:.2e}, tol {TOL:.0e})  "
                  f"max|t32-t64| {e_t['max_abs']:.3e}  max|c-t32| {e_ct['max_abs']:.3e}  "
                  f"max|ref| {e_c['max_ref']:.3g}")
        if first is None:
            first = c
        else:
            same = all(torch.equal(first[k], c[k]) for k in ("mean", "logvar", "decoded"))
            print(f"{'ok  ' if same else 'FAIL'} {name:12s} both namings give the same bits")
            ok &= same
        print(f"     {name:12s} {naming:3s} C: load {info['load_s']}s, encode {info['encode_s']}s, "
              f"decode {info['decode_s']}s, {info['params']} parameters, workspace "
              f"{info['work_bytes'] / 2**20:.1f} MiB; torch f32 {t_torch32:.2f}s")
        result["runs"][naming] = run
    # the 16-bit products, on the first naming's file, against float64 as fp32 is
    weights = os.path.join(work, f"{name}.{namings[0]}.safetensors")
    try:  # PyTorch's own bf16 (autocast), for comparison only: not every build runs it here
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            tb = dict(zip(("mean", "logvar"), model.encode(image)))
            tb["decoded"] = model.decode(latent)
    except RuntimeError:
        tb = None
    result["lowp"] = {}
    for prec, tol in TOL_LP.items():
        out = os.path.join(work, f"{name}.{prec}.out.safetensors")
        try:
            c, info = run_c(tool, weights, inputs, out, prec)
        except RuntimeError as exc:
            if prec == "bf16" and "cannot run here" in str(exc):  # no AVX-512 BF16: said, skipped
                print(f"skip {name:12s} {prec}: {exc}")
                continue
            raise
        run = {}
        for key in ("mean", "logvar", "decoded"):
            e_c = errors(c[key], ref[key])
            e_tb = errors(tb[key].float(), ref[key]) if tb else {"rel_to_max": float("nan")}
            passed = e_c["rel_to_max"] <= tol
            ok &= passed
            run[key] = {"c_vs_torch64": e_c, "torch_bf16_autocast_vs_torch64": e_tb,
                        "tolerance": tol, "passed": passed}
            print(f"{'ok  ' if passed else 'FAIL'} {name:12s} {prec:4s} {key:8s} "
                  f"max|c-t64| {e_c['max_abs']:.3e} (rel {e_c['rel_to_max']:.2e}, tol {tol:.0e})  "
                  f"torch bf16 autocast rel {e_tb['rel_to_max']:.2e}")
        print(f"     {name:12s} {prec:4s} C: encode {info['encode_s']}s, decode {info['decode_s']}s")
        run["c"] = info
        result["lowp"][prec] = run
    return ok, result


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    tool = sys.argv[1]
    torch.set_num_threads(int(os.environ.get("TESSERA_THREADS", "2")))
    work = tempfile.mkdtemp(prefix="vae_parity_")
    try:
        if len(sys.argv) == 4 and sys.argv[2] == "--full":
            ok, result = one_config(tool, "sd-vae-ft-mse", vt.SD_VAE_FT_MSE, 1, 256, 256, 2024,
                                    ["new"], work)
            result["tolerance"] = TOL
            result["when"] = time.strftime("%Y-%m-%d")
            result["machine"] = os.uname().machine + f", {os.cpu_count()} CPUs"
            with open(sys.argv[3], "w") as fh:
                json.dump(result, fh, indent=2)
                fh.write("\n")
        else:
            ok = True
            for i, (name, cfg, B, H, W) in enumerate(CONFIGS):
                ok &= one_config(tool, name, cfg, B, H, W, 100 + i, ["new", "old"], work)[0]
        print("parity_vae:", "PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
