#!/usr/bin/env python3
"""parity_dit_xl.py TESSERA [--out JSON] [--work DIR] — the published DiT-XL/2 at full size, once:
a random-weight state dict in facebookresearch/DiT's layout (tests/parity/dit_torch.py: 28
blocks of 1152, 16 heads, patch 2, 32x32x4 latents, 1000 classes and the null label, learned
sigma; ~675 M parameters) saved by torch.save, converted by `tessera import` (time, peak memory),
and its forward by `tessera forward` at f32 and bf16 against PyTorch's float32 forward (the
reference; PyTorch's own bf16 autocast error beside it). Errors are max|ours - ref| /
max(1, max|ref|), for the epsilon half and the sigma half. Writes the figures as one JSON object (--out) and a summary.
Needs ~16 GB of memory and Debian's python3-torch; not part of the test suite (docs/models.md).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "parity"))
sys.dont_write_bytecode = True
import torch  # noqa: E402
import dit_torch as dt  # noqa: E402

XL = dict(input_size=32, patch_size=2, in_channels=4, hidden_size=1152, depth=28, num_heads=16,
          num_classes=1000, mlp_ratio=4, freq_dim=256)


def err(got, ref):
    return (got - ref).abs().max().item() / max(1.0, ref.abs().max().item())


def child_rss_mb():
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tessera")
    ap.add_argument("--out", default=None)
    ap.add_argument("--work", default=None)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    work = a.work or tempfile.mkdtemp(prefix="tessera-xl-")
    res = {"config": dict(XL, learn_sigma=True), "threads": a.threads, "torch": torch.__version__}
    t0 = time.time()
    model = dt.DiT(**XL, learn_sigma=True)
    model.randomise(torch.Generator().manual_seed(20251128))
    model.eval()
    res["parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    pt = os.path.join(work, "DiT-XL-2-256x256-random.pt")
    torch.save(model.state_dict(), pt)
    res["pt_bytes"] = os.path.getsize(pt)
    print(f"model and {pt} ({res['pt_bytes'] / 2**30:.2f} GiB) in {time.time() - t0:.1f} s",
          flush=True)

    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 4, 32, 32, generator=g)
    t = torch.tensor([0.999, 0.25])  # DiT steps 999 and 250, / 1000
    y = torch.tensor([207, 1000])    # a class and the null label
    inputs = os.path.join(work, "in.safetensors")
    dt.st_write(inputs, {"x": x, "t": t, "y": y}, dtypes={"y": "I64"})
    refs = {}
    with torch.no_grad():
        t1 = time.time()
        refs["f32"] = model(x, t, y)
        res["torch_f32_s"] = time.time() - t1
        with torch.autocast("cpu", dtype=torch.bfloat16):
            t1 = time.time()
            refs["bf16"] = model(x, t, y).float()
            res["torch_bf16_s"] = time.time() - t1
    del model
    C = 4
    ref = refs["f32"]
    res["torch_bf16_err"] = {"eps": err(refs["bf16"][:, :C], ref[:, :C]),
                             "sigma": err(refs["bf16"][:, C:], ref[:, C:])}

    st = os.path.join(work, "dit-xl-2.safetensors")
    t1 = time.time()
    before = child_rss_mb()
    subprocess.run([a.tessera, "import", pt, "--out", st, "--quiet"], check=True)
    res["import_s"] = time.time() - t1
    res["import_peak_rss_mb"] = child_rss_mb() if child_rss_mb() > before else None
    res["safetensors_bytes"] = os.path.getsize(st)
    os.remove(pt)
    for prec in ("f32", "bf16"):
        out = os.path.join(work, f"v-{prec}.safetensors")
        t1 = time.time()
        subprocess.run([a.tessera, "forward", "--weights", st, "--inputs", inputs, "--out", out,
                        "--threads", str(a.threads), "--precision", prec], check=True,
                       stdout=subprocess.DEVNULL)
        res[f"tessera_{prec}_s"] = time.time() - t1
        got, _, _ = dt.st_read(out)
        res[f"tessera_{prec}_err"] = {"eps": err(got["v"], ref[:, :C]),
                                      "sigma": err(got["sigma"], ref[:, C:])}
    os.remove(st)
    res["seconds"] = time.time() - t0
    # fp32 within the parity test's 1e-4; bf16 within twice PyTorch's own bf16 error (both
    # against PyTorch's fp32) or 1e-2, whichever is larger
    bf = max(1e-2, 2 * max(res["torch_bf16_err"].values()))
    res["tolerance"] = {"f32": 1e-4, "bf16": bf}
    ok = max(res["tessera_f32_err"].values()) < 1e-4 and max(res["tessera_bf16_err"].values()) < bf
    res["pass"] = ok
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
