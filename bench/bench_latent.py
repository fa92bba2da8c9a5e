#!/usr/bin/python3
"""bench_latent.py — the latent models on the CPU side by side with PyTorch: the VAE (sd-vae-ft-mse's
configuration) encoding and decoding one 256×256 image, and DiT-XL/2's forward at batch 2 (one
guided sampling step of one image: the class and the null label).

Usage (from the repository root, after building bench_vae, bench_dit, bench_gemm and tessera):
    /usr/bin/python3 bench/bench_latent.py [--build DIR] [--threads N] [--seconds S]
                                           [--skip-xl] [--json-out FILE]

Both models get random weights (tests/parity/: vae_torch.py, dit_torch.py), written once to a
file both sides load. Ours: bench/bench_vae and bench/bench_dit (--weights, forward only) at f32
and bf16 (f16 too for the VAE: emulated on a CPU, so slower). PyTorch eager in this process, at
the same thread count, OMP_WAIT_POLICY=PASSIVE (its best showing on two cores, bench_dit.py),
fp32, and bf16 by torch.autocast where it runs. Each side: warm-up, then calls for at least S
seconds and 3 calls, the median call. FLOPs are counted on the PyTorch model by hooks (every
convolution, linear layer and the attentions' two products, 2 per multiply-add), the same work
on both sides, and read as GFLOP/s and as a fraction of the engine's sgemm peak (bench_gemm, a
2048³ product, same run, same threads). Bytes per sample: the VAE's workspace at 256×256 and
the DiT's inference memory per sample (bench_dit --memory). Writes one JSON object.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import torch  # noqa: E402
import dit_torch as dt  # noqa: E402
import vae_torch as vt  # noqa: E402
from flops import count_flops  # noqa: E402

XL = dict(input_size=32, patch_size=2, in_channels=4, hidden_size=1152, depth=28, num_heads=16,
          num_classes=1000, mlp_ratio=4, freq_dim=256)


def median_time(fn, seconds):
    for _ in range(2):
        fn()
    calls, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds or len(calls) < 3:
        c0 = time.perf_counter()
        fn()
        calls.append(time.perf_counter() - c0)
    calls.sort()
    n = len(calls)
    return calls[n // 2] if n % 2 else 0.5 * (calls[n // 2 - 1] + calls[n // 2])


def run_json(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    try:  # one document, or a document on its last line after progress
        return json.loads(p.stdout)
    except json.JSONDecodeError:
        return json.loads(p.stdout.strip().splitlines()[-1])


def torch_autocast(fn):
    """fn under bf16 autocast, or None when this PyTorch cannot run it."""
    def run():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return fn()
    try:
        run()
        return run
    except RuntimeError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--skip-xl", action="store_true")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    work = tempfile.mkdtemp(prefix="bench-latent-")
    g = run_json([os.path.join(a.build, "bench", "bench_gemm"), "--json", "--threads",
                  str(a.threads), "--config", "tiny"])
    peak = g["peak"]["gflops"]
    bf16_peak = g["peak_bf16"]["gflops"] if g.get("peak_bf16") else None
    res = {"threads": a.threads, "torch": torch.__version__, "sgemm_peak_gflops": peak,
           "bf16_peak_gflops": bf16_peak, "cpu": g.get("cpu_model"),
           "omp_wait_policy": os.environ["OMP_WAIT_POLICY"], "rows": []}

    def row(what, ours_s, torch_s, flops, extra=None):
        """A row; a bf16 row's fraction is of the bf16 peak (f16, emulated on a CPU: sgemm's)."""
        pk = bf16_peak if " bf16" in what and bf16_peak else peak
        r = {"what": what, "ours_s": ours_s, "torch_s": torch_s, "gflop": flops / 1e9,
             "ours_gflops": flops / ours_s / 1e9, "peak_gflops": pk,
             "ours_of_peak": flops / ours_s / 1e9 / pk,
             "torch_gflops": flops / torch_s / 1e9 if torch_s else None,
             "ratio": torch_s / ours_s if torch_s else None}
        r.update(extra or {})
        res["rows"].append(r)
        ratio = f"{r['ratio']:.2f}×" if r["ratio"] else "–"
        print(f"{what:34s} ours {ours_s * 1e3:9.1f} ms ({r['ours_gflops']:6.1f} GFLOP/s, "
              f"{100 * r['ours_of_peak']:4.1f} % of peak)  PyTorch "
              f"{torch_s * 1e3 if torch_s else float('nan'):9.1f} ms  ratio {ratio}", flush=True)

    # ---- the VAE ----
    vae = vt.AutoencoderKL(vt.SD_VAE_FT_MSE).eval()
    vt.randomize(vae, 11)
    vpath = os.path.join(work, "vae.safetensors")
    vt.save(vae, vpath)
    x = torch.rand(1, 3, 256, 256) * 2 - 1
    z = torch.randn(1, 4, 32, 32)
    f_enc = count_flops(vae, lambda: vae.encode(x))
    f_dec = count_flops(vae, lambda: vae.decode(z))
    with torch.no_grad():
        t_enc = median_time(lambda: vae.encode(x), a.seconds)
        t_dec = median_time(lambda: vae.decode(z), a.seconds)
    enc16 = torch_autocast(lambda: vae.encode(x))
    dec16 = torch_autocast(lambda: vae.decode(z))
    torch16 = "autocast bf16"
    if not (enc16 and dec16):  # this PyTorch's autocast cannot run the VAE: the model in bf16
        v16 = copy.deepcopy(vae).bfloat16()
        x16, z16 = x.bfloat16(), z.bfloat16()

        def nograd(fn):
            def run():
                with torch.no_grad():
                    return fn()
            return run
        enc16, dec16 = nograd(lambda: v16.encode(x16)), nograd(lambda: v16.decode(z16))
        torch16 = "weights and activations in bf16 (autocast cannot run it)"
    t_enc16 = median_time(enc16, a.seconds) if enc16 else None
    t_dec16 = median_time(dec16, a.seconds) if dec16 else None
    ours = {}
    for prec in ("f32", "bf16", "f16"):
        try:
            ours[prec] = run_json([os.path.join(a.build, "bench", "bench_vae"), "--weights", vpath,
                                   "--size", "256", "--threads", str(a.threads), "--precision",
                                   prec, "--seconds", str(a.seconds), "--json"])
        except RuntimeError as exc:
            print(f"VAE {prec}: {exc}")
    res["vae_work_bytes_256"] = ours["f32"]["work_bytes"]
    res["vae_params"] = ours["f32"]["params"]
    row("VAE encode 256×256 f32", ours["f32"]["encode_s"], t_enc, f_enc)
    row("VAE decode 256×256 f32", ours["f32"]["decode_s"], t_dec, f_dec)
    for prec, tenc, tdec in (("bf16", t_enc16, t_dec16), ("f16", None, None)):
        if prec in ours:
            note = {"torch_note": torch16 if tenc else "no CPU f16 path in PyTorch"}
            row(f"VAE encode 256×256 {prec}", ours[prec]["encode_s"], tenc, f_enc, note)
            row(f"VAE decode 256×256 {prec}", ours[prec]["decode_s"], tdec, f_dec, note)
    del vae

    # ---- DiT-XL/2 ----
    if not a.skip_xl:
        m = dt.DiT(**XL, learn_sigma=True).eval()
        m.randomise(torch.Generator().manual_seed(3))
        mpath = os.path.join(work, "xl.safetensors")
        dt.save_model(m, mpath, "F32", {"objective": "epsilon"})
        xb = torch.randn(2, 4, 32, 32)
        tb = torch.tensor([0.5, 0.5])
        yb = torch.tensor([207, 1000])
        f_xl = count_flops(m, lambda: m(xb, tb, yb))
        with torch.no_grad():
            t_xl = median_time(lambda: m(xb, tb, yb), a.seconds)
        xl16 = torch_autocast(lambda: m(xb, tb, yb))
        t_xl16 = median_time(xl16, a.seconds) if xl16 else None
        del m
        for prec, tt in (("f32", t_xl), ("bf16", t_xl16)):
            o = run_json([os.path.join(a.build, "bench", "bench_dit"), "--weights", mpath,
                          "--threads", str(a.threads), "--batch", "2", "--train-batch", "0",
                          "--seconds", str(a.seconds), "--precision", prec, "--json"])
            fwd = [r for r in o["results"] if r["what"] == "forward" and r["batch"] == 2][0]
            row(f"DiT-XL/2 forward b2 {prec}", fwd["median_s"], tt, f_xl,
                {"torch_note": "autocast bf16" if prec == "bf16" and tt else None})
        mem = run_json([os.path.join(a.build, "bench", "bench_dit"), "--weights", mpath,
                        "--memory", "--json"])
        res["dit_xl_memory"] = mem
    res["when"] = time.strftime("%Y-%m-%d %H:%M")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
