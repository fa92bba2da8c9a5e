#!/usr/bin/python3
"""bench_dit.py — the DiT expert side by side: tessera's CPU engine vs PyTorch eager.

Usage (from the repository root, after building bench_dit and bench_gemm):
    /usr/bin/python3 bench/bench_dit.py [--build DIR] [--threads N] [--config NAME ...]
                                         [--seconds S] [--quick] [--json] [--json-out FILE]
                                         [--omp-wait-policy passive|default ...] [--keep DIR]

For each config (`tiny` and `small`, architecture.md §9; 28×28×1 images, 10 classes) it builds the
PyTorch DiT of tests/parity/dit_torch.py with random weights (every tensor non-zero, the
zero-initialised adaLN and final layer too), writes them to a temporary safetensors file, and in
one run, at the same thread count:
  1. checks that both sides compute the same thing: PyTorch's forward on fixed (x, t, y) goes into
     a file, bench_dit recomputes it on the same weights and must agree to 1e-4 relative to
     max(1, max|v|), else the run stops — timing two different computations means nothing;
  2. times ours: bench_dit (forward at batch 1 and 64, training step at batch 64);
  3. times PyTorch in a worker process that loads the same file (strict=True): forward at batch 1
     and 64 (eval, no_grad) and a training step at batch 64 that does the same work as ours
     (model/trainer.c): draw a batch and labels (10 % dropped to the null class), t ~ U(0, 1),
     ε ~ N(0, 1), x_t = (1 − t)·x0 + t·ε, forward, MSE against ε − x0, backward, gradient-norm
     clipping to 1, AdamW (foreach), EMA of the weights;
and once per run it takes the sgemm peak from `bench_gemm --json` (a 2048³ product through the
engine, plus OpenBLAS alone on its own threads) and, where the bf16 path runs, the bf16 peak (the
same product through ts_matmul_bf16, i.e. oneDNN).

bf16 rows, where the bf16 path runs (else skipped, with the reason): ours with
`bench_dit --precision bf16` (checked against PyTorch's fp32 output to BF16_TOL) against
PyTorch's best bf16 CPU path of two — torch.autocast("cpu", bfloat16) around the eager model, and
torch.utils.mkldnn.to_mkldnn(model, bfloat16) — each timed in the same worker as the fp32 rows;
the bf16 training row (ours: bf16 training, fp32 masters and AdamW) against PyTorch's training
step with its forward and loss under torch.autocast("cpu", bfloat16) (fp32 weights and AdamW:
the same recipe; to_mkldnn cannot train);
every bf16 row is also read as a fraction of the fp32 and of the bf16 peak, and against our own
fp32 row. The worker also times a 2048³ torch.matmul in fp32 and bf16, PyTorch's own peaks. Both sides are timed call by call after a
warm-up, for at least S seconds and 5 calls, and the figure is the median call.

PyTorch gets its best showing. Its OpenMP threads (for the elementwise ops) and OpenBLAS's
threads (for the GEMMs) are two pools of N threads on the same cores; with libgomp's default
wait policy the OpenMP workers spin after each parallel region and take the cores from
OpenBLAS, which on a 2-core machine makes PyTorch up to 2× slower and erratic. So the worker
runs once with OMP_WAIT_POLICY=PASSIVE and once with the default, and each row takes the faster
of the two (both are in the JSON; --omp-wait-policy picks which to run).

The machine may be shared: from /proc/stat and the CPU time of this process and its children,
the run reports how many cores' worth of CPU other processes took meanwhile.

Targets (the CPU engine's): forward ≥ 3× PyTorch at batch 64 and ≥ 10× at batch 1, training ≥ 2×, forward
at batch 64 ≥ 50 % of the sgemm peak. Unmet targets are reported, not an error: the exit status
is 0 when the run completed, 1 when a tool failed, 3 when the two sides disagree.

PyTorch's BLAS: Debian's python3-torch is built with BLAS_INFO=generic and reaches OpenBLAS
through the libblas.so.3 alternative; the worker reads the library actually loaded from
/proc/self/maps and prints its openblas_get_config().
"""

import argparse
import ctypes
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))

CONFIGS = {
    "tiny": dict(input_size=28, patch_size=4, in_channels=1, hidden_size=128, depth=4,
                 num_heads=4, num_classes=10),
    "small": dict(input_size=28, patch_size=2, in_channels=1, hidden_size=256, depth=6,
                  num_heads=4, num_classes=10),
}
FORWARD_BATCHES = (1, 64)
TRAIN_BATCH = 64
ROW_KEYS = [f"forward_b{B}" for B in FORWARD_BATCHES] + [f"train_b{TRAIN_BATCH}"]
BF16_KEYS = [f"forward_b{B}_bf16" for B in FORWARD_BATCHES] + [f"train_b{TRAIN_BATCH}_bf16"]
BF16_TOL = 3e-2      # bf16 against PyTorch's fp32 output, relative to max(1, max|v|)
TORCH_BF16_PATHS = ("autocast", "mkldnn")
CHECK_BATCH = 8
TOL_FORWARD = 1e-4   # max|Δv| / max(1, max|v|), as tests/parity/run_parity.py
DATA_N = 1024        # synthetic training images, as bench_dit.c
WARMUP_CALLS, WARMUP_SECONDS, MIN_CALLS = 3, 0.2, 5  # as bench_dit.c (and 1, 0.05, 3 with --quick)
SETTLE_SECONDS = 1.0  # before each child: let the last one's spinning threads go to sleep
POLICIES = ("passive", "default")  # OMP_WAIT_POLICY=PASSIVE, and libgomp's default (unset)

# the targets: (row key, what is compared, threshold)
TARGETS = (
    ("forward_b64", "ratio", 3.0),
    ("forward_b1", "ratio", 10.0),
    ("train_b64", "ratio", 2.0),
    ("forward_b64", "of_peak", 0.5),
)
# the bf16 path's targets: bf16 forward b64 ≥ 1.7× our fp32 and ≥ 1.5× PyTorch's best bf16; bf16 training b64
# ≥ 1.5× our fp32 training
TARGETS_BF16 = (
    ("forward_b64_bf16", "vs_ours_f32", 1.7),
    ("forward_b64_bf16", "ratio", 1.5),
    ("train_b64_bf16", "vs_ours_f32", 1.5),
)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build",
                    help="build directory holding bench/bench_dit and bench/bench_gemm "
                         "(default: build; relative paths are tried from the current "
                         "directory, then from the repository root)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both sides (default 2)")
    ap.add_argument("--config", action="append", choices=sorted(CONFIGS),
                    help="a config to run; repeat for several (default: tiny and small)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="timed seconds per measurement (default 2; 0.3 with --quick)")
    ap.add_argument("--quick", action="store_true",
                    help="short timing and a quick sgemm peak: a smoke run, not a measurement")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--json-out", metavar="FILE",
                    help="also write the JSON document to FILE (with the table on stdout)")
    ap.add_argument("--omp-wait-policy", action="append", choices=POLICIES,
                    help="PyTorch's OpenMP wait policy; repeat for several, the faster counts "
                         "(default: both)")
    ap.add_argument("--keep", metavar="DIR",
                    help="write the weights and check files into DIR and keep them (to rerun "
                         "or profile bench_dit on them); default: a temporary folder, removed")
    ap.add_argument("--torch-worker", nargs=2, metavar=("WEIGHTS", "CHECK"),
                    help=argparse.SUPPRESS)  # internal: time PyTorch on WEIGHTS, print JSON
    a = ap.parse_args()
    if a.threads < 1:
        ap.error("--threads must be at least 1")
    if a.seconds is None:
        a.seconds = 0.3 if a.quick else 2.0
    a.config = a.config or ["tiny", "small"]
    a.omp_wait_policy = a.omp_wait_policy or list(POLICIES)
    return a


ARGS = parse_args()
if ARGS.quick:
    WARMUP_CALLS, WARMUP_SECONDS, MIN_CALLS = 1, 0.05, 3
# The thread counts must be fixed before torch (and its OpenMP and OpenBLAS) is loaded. The
# orchestrator itself only builds the models: it keeps its OpenMP threads passive, so that they
# never spin while a child is being timed. A worker gets its policy from the orchestrator.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)
if not ARGS.torch_worker:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

sys.dont_write_bytecode = True  # keep the source tree clean of __pycache__
sys.path.insert(0, os.path.join(ROOT, "tests", "parity"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dit_torch as dt  # noqa: E402
import timing  # noqa: E402  (bench/, this script's folder)

LOG = sys.stderr if (ARGS.json or ARGS.torch_worker) else sys.stdout


def log(*a):
    print(*a, file=LOG, flush=True)


# ---- the machine and PyTorch's BLAS ------------------------------------------------------------

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def torch_blas():
    """What BLAS this torch really calls: the OpenBLAS library mapped into the process after a
    matrix product, its config string and thread count (None when no OpenBLAS is loaded)."""
    a = torch.randn(64, 64)
    (a @ a).sum().item()
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "openblas" in os.path.basename(path).lower():
                libs.add(path)
    show = torch.__config__.show()
    info = {"torch_version": torch.__version__,
            "config_mentions_openblas": "openblas" in show.lower(),
            "blas_info": next((s.split("=", 1)[1] for s in show.replace(",", " ").split()
                               if s.startswith("BLAS_INFO=")), "?"),
"openblas_library": None, "openblas_config": None, "openblas_threads": None,
            "openblas_core": None,
            "torch_threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")}
    for path in sorted(libs):
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_config.restype = ctypes.c_char_p
            info["openblas_library"] = path
            info["openblas_config"] = lib.openblas_get_config().decode().strip()
            info["openblas_threads"] = lib.openblas_get_num_threads()
            lib.openblas_get_corename.restype = ctypes.c_char_p
            info["openblas_core"] = lib.openblas_get_corename().decode().strip()
            break
        except (OSError, AttributeError):
            continue
    return info


# ---- other load on the machine ---------------------------------------------------------------

def cpu_snapshot():
    """(wall seconds, busy CPU seconds of the whole machine, CPU seconds of this process and its
    finished children) — two of them give how much CPU other processes took in between."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = sum(v) - v[3] - v[4]  # all but idle and iowait
    own = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        own += r.ru_utime + r.ru_stime
    return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own


def other_load(a, b):
    """Cores' worth of CPU that other processes used between snapshots a and b."""
    wall = b[0] - a[0]
    return {"seconds": wall, "other_cores": max(0.0, (b[1] - a[1]) - (b[2] - a[2])) / wall}


# ---- child processes ---------------------------------------------------------------------------

def find_build():
    for base in (os.getcwd(), ROOT):
        d = os.path.join(base, ARGS.build) if not os.path.isabs(ARGS.build) else ARGS.build
        if os.path.isfile(os.path.join(d, "bench", "bench_dit")):
            return d
    sys.exit(f"bench_dit.py: no bench/bench_dit under '{ARGS.build}' (build it: cmake --build "
             f"{ARGS.build} --target bench_dit bench_gemm tessera), or pass --build DIR")


def run_json(cmd, env=None):
    """Runs a child that prints one JSON document, after letting the cores settle."""
    time.sleep(SETTLE_SECONDS)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        log(f"bench_dit.py: {' '.join(cmd)} exited with {p.returncode}")
        sys.exit(3 if p.returncode == 3 else 1)
    return json.loads(p.stdout)


def sgemm_peak(build):
    """The engine's sgemm peak from the GEMM benchmark, in this run at this thread count."""
    exe = os.path.join(build, "bench", "bench_gemm")
    if os.path.isfile(exe):
        cmd = [exe]
    else:
        cmd = [os.path.join(build, "client", "tessera"), "bench", "gemm"]
    cmd += ["--json", "--threads", str(ARGS.threads), "--config", "tiny"]
    if ARGS.quick:
        cmd.append("--quick")
    g = run_json(cmd)
    bf16 = g.get("peak_bf16")
    return {"gflops": g["peak"]["gflops"], "size": g["peak"]["m"],
            "bf16_gflops": bf16["gflops"] if bf16 else None,
            "openblas_direct_gflops": g["openblas_direct"]["gflops"],
            "engine_openblas_config": g.get("openblas_config"),
            "engine_blas": g.get("blas"), "command": " ".join(cmd)}


OURS_CORE = None  # the OpenBLAS kernel set our engine runs (bench_gemm --json's "blas")


def kernels_fair(ours, torch_core):
    """Whether both sides' GEMMs run the same OpenBLAS kernel set: a ratio between different
    kernels measures the kernels, not the implementations."""
    return bool(ours) and ours == torch_core


def torch_worker_run(weights, check, policy):
    """The PyTorch side of one config, in a fresh process with the given OpenMP wait policy."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    # PyTorch's OpenBLAS runs the kernel set ours runs (ours re-executes itself with the CPU's best
    # where OpenBLAS picks weaker: kernels/cpu/blas_core.h); OpenBLAS reads this as it loads
    if OURS_CORE and not env.get("OPENBLAS_CORETYPE"):
        env["OPENBLAS_CORETYPE"] = OURS_CORE
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    cmd = [sys.executable, HERE, "--torch-worker", weights, check, "--threads",
           str(ARGS.threads), "--seconds", str(ARGS.seconds)] + (["--quick"] if ARGS.quick else [])
    return run_json(cmd, env)


# ---- PyTorch timing (in the worker) ------------------------------------------------------------

def time_calls(fn, seconds):
    """Warm-up, then fn timed call by call until `seconds` and MIN_CALLS; as bench_dit.c."""
    return timing.time_calls(fn, seconds, WARMUP_CALLS, WARMUP_SECONDS, MIN_CALLS)


def random_inputs(cfg, B, gen):
    C, S, K = cfg["in_channels"], cfg["input_size"], cfg["num_classes"]
    x = torch.randn(B, C, S, S, generator=gen)
    t = torch.rand(B, generator=gen)
    y = torch.randint(0, K + 1, (B,), generator=gen)  # the null class included
    return x, t, y


def torch_forward(model, cfg, B, seconds, gen):
    x, t, y = random_inputs(cfg, B, gen)
    model.eval()

    def step():
        with torch.no_grad():
            model(x, t, y)
    return time_calls(step, seconds)


def torch_forward_bf16(model, cfg, B, seconds, gen, path):
    """PyTorch's bf16 forward by one of TORCH_BF16_PATHS; model is the fp32 eager model."""
    x, t, y = random_inputs(cfg, B, gen)
    model.eval()
    if path == "autocast":
        def step():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                model(x, t, y)
    else:  # every nn.Linear becomes oneDNN's MkldnnLinear with bf16 weights
        import copy
        from torch.utils import mkldnn as mk
        mm = mk.to_mkldnn(copy.deepcopy(model), torch.bfloat16)

        def step():
            with torch.no_grad():
                mm(x, t, y)
    return time_calls(step, seconds)


def torch_peaks(seconds):
    """PyTorch's own 2048³ matmul in fp32 and bf16 (GFLOP/s of the median call)."""
    n = 1024 if ARGS.quick else 2048
    out = {}
    for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        r = time_calls(lambda: torch.matmul(a, b), seconds)
        out[name] = 2.0 * n ** 3 / r["median_s"] / 1e9
    out["size"] = n
    return out


def torch_train(model, cfg, B, seconds, gen, autocast=False):
    """The training step of model/trainer.c, in PyTorch eager; autocast: the forward and the loss
    under torch.autocast("cpu", bfloat16) (PyTorch's mixed-precision training on the CPU: fp32
    weights, gradients and AdamW, bf16 products)."""
    C, S, K = cfg["in_channels"], cfg["input_size"], cfg["num_classes"]
    data = torch.rand(DATA_N, C, S, S, generator=gen) * 2 - 1
    labels = torch.randint(0, K, (DATA_N,), generator=gen)
    params = [p for _, p in model.trainable()]
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            foreach=True)
    decay = 0.999
    model.train()

    def step():
        idx = torch.randint(0, DATA_N, (B,))
        x0 = data[idx]
        y = torch.where(torch.rand(B) < 0.1, torch.full((B,), K), labels[idx])
        t = torch.rand(B)
        eps = torch.randn_like(x0)
        tb = t[:, None, None, None]
        xt = (1 - tb) * x0 + tb * eps
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = F.mse_loss(model(xt, t, y).float(), eps - x0)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        loss.item()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            torch._foreach_mul_(ema, decay)
            torch._foreach_add_(ema, params, alpha=1 - decay)
    return time_calls(step, seconds)


def torch_worker(weights, check):
    """Loads the weights file as PyTorch would (strict), checks it reproduces the orchestrator's
    forward, times the three rows and prints them as JSON."""
    torch.set_num_threads(ARGS.threads)
    blas = torch_blas()
    model = dt.load_model(weights)
    cfg = dict(model.cfg)
    ref, _, _ = dt.st_read(check)
    model.eval()
    with torch.no_grad():
        v = model(ref["x"], ref["t"], ref["y"])
    diff = (v - ref["v"]).abs().max().item() / max(1.0, ref["v"].abs().max().item())
    if not diff <= TOL_FORWARD:
        log(f"bench_dit.py worker: the reloaded model's forward differs by {diff:.3e}")
        sys.exit(3)
    gen = torch.Generator().manual_seed(20261122)
    rows = {}
    for B in FORWARD_BATCHES:
        rows[f"forward_b{B}"] = torch_forward(model, cfg, B, ARGS.seconds, gen)
    rows[f"train_b{TRAIN_BATCH}"] = torch_train(model, cfg, TRAIN_BATCH, ARGS.seconds, gen)
    bf16 = {}
    for path in TORCH_BF16_PATHS:
        try:
            bf16[path] = {f"forward_b{B}_bf16": torch_forward_bf16(model, cfg, B, ARGS.seconds,
                                                                   gen, path)
                          for B in FORWARD_BATCHES}
        except Exception as e:  # a path this PyTorch cannot take is reported, not fatal
            bf16[path] = {"error": repr(e)[:300]}
    try:
        bf16["autocast"][f"train_b{TRAIN_BATCH}_bf16"] = torch_train(model, cfg, TRAIN_BATCH,
                                                                    ARGS.seconds, gen, True)
    except Exception as e:
        bf16["autocast_train"] = {"error": repr(e)[:300]}
    json.dump({"blas": blas, "rows": rows, "bf16": bf16,
               "peaks": torch_peaks(ARGS.seconds)}, sys.stdout)
    print()


# ---- one config ----------------------------------------------------------------------------------

def run_config(name, build, work, peak):
    snap = cpu_snapshot()
    cfg = dict(CONFIGS[name])
    gen = torch.Generator().manual_seed(20261121)
    model = dt.DiT(**cfg)
    model.randomise(gen)
    for n, p in model.state_dict().items():  # pos_embed is fixed: sin(0) = 0 is in it
        if n != "pos_embed" and not p.abs().min().item() > 0:
            sys.exit(f"bench_dit.py: [{name}] {n} has a zero element")
    weights = os.path.join(work, f"{name}.safetensors")
    dt.save_model(model, weights)

    # 1. the same computation?
    x, t, y = random_inputs(cfg, CHECK_BATCH, gen)
    model.eval()
    with torch.no_grad():
        v = model(x, t, y)
    check_path = os.path.join(work, f"{name}.check.safetensors")
    dt.st_write(check_path, {"x": x, "t": t, "y": y, "v": v})
    del model

    # 2. ours
    exe = os.path.join(build, "bench", "bench_dit")
    cmd = [exe, "--weights", weights, "--threads", str(ARGS.threads), "--seconds",
           str(ARGS.seconds), "--check", check_path, "--json"] + (["--quick"] if ARGS.quick else [])
    log(f"[{name}] ours: {' '.join(cmd)}")
    ours = run_json(cmd)
    ck = ours["check"]
    if not (ck["ok"] and ck["rel"] <= TOL_FORWARD):
        log(f"bench_dit.py: [{name}] the forward outputs differ by {ck['rel']:.3e} relative "
            f"(tolerance {TOL_FORWARD:.0e}): not the same computation; stopping")
        sys.exit(3)
    log(f"[{name}] check: forward of both sides on the same (x, t, y), batch {ck['batch']}: "
        f"max|diff| {ck['max_abs_diff']:.3e}, relative {ck['rel']:.3e} ≤ {TOL_FORWARD:.0e}")
    flops = ours["flops_per_sample"]
    res_ours = {f"{r['what']}_b{r['batch']}": r for r in ours["results"]}
    ours16, cmd16 = None, None
    if peak.get("bf16_gflops"):
        cmd16 = [exe, "--weights", weights, "--threads", str(ARGS.threads), "--seconds",
                 str(ARGS.seconds), "--check", check_path, "--tol", str(BF16_TOL),
                 "--precision", "bf16", "--json"] + (["--quick"] if ARGS.quick else [])
        log(f"[{name}] ours bf16: {' '.join(cmd16)}")
        ours16 = run_json(cmd16)
        log(f"[{name}] check bf16: relative {ours16['check']['rel']:.3e} ≤ {BF16_TOL:.0e}")
        for r in ours16["results"]:
            res_ours[f"{r['what']}_b{r['batch']}_bf16"] = r

    # 3. PyTorch, once per OpenMP wait policy
    res_torch, blas, torch16, tpeaks = {}, None, {}, {}
    for policy in ARGS.omp_wait_policy:
        log(f"[{name}] PyTorch (OMP_WAIT_POLICY {policy}): forward b1, b64, train b64; bf16 "
            f"forward by {' and '.join(TORCH_BF16_PATHS)}, bf16 train b64 by autocast")
        w = torch_worker_run(weights, check_path, policy)
        res_torch[policy] = w["rows"]
        torch16[policy] = w["bf16"]
        tpeaks[policy] = w["peaks"]
        blas = blas or w["blas"]

    rows = []
    for key in ROW_KEYS:
        o = res_ours[key]
        B = o["batch"]
        best = min(ARGS.omp_wait_policy, key=lambda pol: res_torch[pol][key]["median_s"])
        p = res_torch[best][key]
        mult = 3.0 if key.startswith("train") else 1.0
        sps_t = B / p["median_s"]
        rows.append({
            "key": key, "what": o["what"], "batch": B,
            "ours_samples_per_s": o["samples_per_s"], "torch_samples_per_s": sps_t,
            "torch_policy": best,
            "torch_samples_per_s_by_policy": {pol: B / res_torch[pol][key]["median_s"]
                                              for pol in ARGS.omp_wait_policy},
            "ratio": o["samples_per_s"] / sps_t,
            "ours_gflops": o["gflops"], "torch_gflops": mult * flops * sps_t / 1e9,
            "of_peak": o["gflops"] / peak["gflops"],
            "ours": o, "torch": p, "torch_by_policy": {pol: res_torch[pol][key]
                                                       for pol in ARGS.omp_wait_policy},
        })
    for key in (BF16_KEYS if ours16 else []):
        o, f32 = res_ours[key], res_ours[key[:-len("_bf16")]]
        B = o["batch"]
        cands = [(pol, path, r[key]) for pol in ARGS.omp_wait_policy
                 for path, r in torch16[pol].items() if key in r]
        if not cands:  # PyTorch could not run this row (the error is in bf16.torch_paths)
            continue
        pol, path, p = min(cands, key=lambda c: c[2]["median_s"])
        sps_t = B / p["median_s"]
        sps_t32 = max(B / res_torch[q][key[:-len("_bf16")]]["median_s"]
                      for q in ARGS.omp_wait_policy)
        mult = 3.0 if key.startswith("train") else 1.0
        rows.append({
            "key": key, "what": f"{o['what']} bf16", "batch": B,
            "ours_samples_per_s": o["samples_per_s"], "torch_samples_per_s": sps_t,
            "torch_policy": pol, "torch_path": path,
            "torch_samples_per_s_by_path": {f"{c[1]}/{c[0]}": B / c[2]["median_s"]
                                            for c in cands},
            "ratio": o["samples_per_s"] / sps_t,
            "vs_ours_f32": o["samples_per_s"] / f32["samples_per_s"],
            "vs_torch_f32": o["samples_per_s"] / sps_t32,
            "ours_gflops": o["gflops"], "torch_gflops": mult * flops * sps_t / 1e9,
            "of_peak": o["gflops"] / peak["gflops"],
            "of_bf16_peak": o["gflops"] / peak["bf16_gflops"],
            "ours": o, "torch": p,
        })
    targets = []
    by_key = {r["key"]: r for r in rows}
    for key, field, thr in TARGETS + (TARGETS_BF16 if ours16 else ()):
        if key not in by_key:
            continue
        val = by_key[key][field]
        targets.append({"row": key, "measure": field, "value": val, "target": thr,
                        "met": val >= thr})
    load = other_load(snap, cpu_snapshot())
    log(f"[{name}] other processes used {load['other_cores']:.2f} cores on average during "
        f"these {load['seconds']:.0f} s")
    return {"config": name, "model": cfg, "num_params": ours["num_params"],
            "flops_per_sample": flops, "check": ck, "command": " ".join(cmd), "rows": rows,
            "targets": targets, "other_load": load, "torch_blas": blas,
            "bf16": {"command": " ".join(cmd16) if cmd16 else None,
                     "check": ours16["check"] if ours16 else None,
                     "skipped": None if ours16 else "no bf16 peak: bf16 does not run here",
                     "torch_paths": torch16},
            "torch_peaks": tpeaks}


# ---- output --------------------------------------------------------------------------------------

def describe_target(t):
    row = t["row"].replace("_b", " b").replace("_bf16", " bf16")
    if t["measure"] == "ratio":
        best = " best bf16" if t["row"].endswith("_bf16") else ""
        return (f"{row} ≥ {t['target']:g}× PyTorch{best}", f"{t['value']:.2f}×")
    if t["measure"] == "vs_ours_f32":
        return (f"{row} ≥ {t['target']:g}× our f32", f"{t['value']:.2f}×")
    return (f"{t['row'].replace('_b', ' b')} ≥ {100 * t['target']:.0f} % of sgemm peak",
            f"{100 * t['value']:.1f} %")


def print_report(env, peak, results, kernels):
    out = sys.stdout
    print(f"machine:  {env['cpu_model']}, {env['nproc']} online cores; load average "
          f"{env['loadavg']}", file=out)
    quick = "  (--quick: a smoke run, not a measurement)" if ARGS.quick else ""
    print(f"threads:  {ARGS.threads} on both sides, {ARGS.seconds:g} s per measurement{quick}",
          file=out)
    b = results[0]["torch_blas"] if results else None
    if b:
        print(f"PyTorch:  {b['torch_version']}, BLAS_INFO={b['blas_info']} (config mentions "
              f"OpenBLAS: {'yes' if b['config_mentions_openblas'] else 'no'}); loaded "
              f"{b['openblas_library'] or 'NO OpenBLAS'} [{b['openblas_config']}], "
              f"{b['openblas_threads']} OpenBLAS threads, {b['torch_threads']} torch threads",
              file=out)
    if kernels["fair"]:
        print(f"kernels:  both sides' GEMMs run OpenBLAS {kernels['ours']}", file=out)
    else:
        print(f"kernels:  NOT THE SAME — ours OpenBLAS {kernels['ours']}, PyTorch's "
              f"{kernels['torch']}: the ratios below compare kernel sets, not implementations; "
              f"not a fair comparison", file=out)
    print(f"peak:     sgemm {peak['size']}³ through the engine {peak['gflops']:.1f} GFLOP/s "
          f"(OpenBLAS alone on its own threads: {peak['openblas_direct_gflops']:.1f}); other "
          f"processes meanwhile: {peak['other_load']['other_cores']:.2f} cores", file=out)
    if peak.get("bf16_gflops"):
        print(f"          bf16 {peak['size']}³ through the engine (oneDNN) "
              f"{peak['bf16_gflops']:.1f} GFLOP/s", file=out)
    for r in results[:1]:
        for pol, tp in r["torch_peaks"].items():
            print(f"          PyTorch matmul {tp['size']}³ (OMP {pol}): f32 {tp['f32']:.1f}, "
                  f"bf16 {tp['bf16']:.1f} GFLOP/s", file=out)
    policies = ARGS.omp_wait_policy
    for r in results:
        print(f"\n{r['config']}: {r['num_params']} parameters, "
              f"{r['flops_per_sample'] / 1e6:.2f} MFLOP/sample forward; "
              f"same output as PyTorch to {r['check']['rel']:.1e}; other processes used "
              f"{r['other_load']['other_cores']:.2f} cores meanwhile", file=out)
        per_pol = "".join(f" {'PT ' + pol:>11}" for pol in policies)
        print(f"  {'':12} {'ours/s':>9} {'PyTorch/s':>10} {'ratio':>7} {'ours GF/s':>10} "
              f"{'of peak':>8} {'PT GF/s':>8}{per_pol}", file=out)
        for row in r["rows"]:
            if row["key"].endswith("_bf16"):
                continue
            label = f"{row['what']} b{row['batch']}"
            pp = "".join(f" {row['torch_samples_per_s_by_policy'][pol]:11.1f}" for pol in policies)
            print(f"  {label:12} {row['ours_samples_per_s']:9.1f} "
                  f"{row['torch_samples_per_s']:10.1f} {row['ratio']:6.2f}× "
                  f"{row['ours_gflops']:10.2f} {100 * row['of_peak']:7.1f}% "
                  f"{row['torch_gflops']:8.2f}{pp}", file=out)
        rows16 = [row for row in r["rows"] if row["key"].endswith("_bf16")]
        if rows16:
            print(f"  {'bf16':12} {'ours/s':>9} {'PT bf16/s':>10} {'ratio':>7} {'vs ours32':>10} "
                  f"{'vs PT32':>8} {'ours GF/s':>10} {'of f32pk':>9} {'of bf16pk':>10}  PT path",
                  file=out)
        else:
            print(f"  bf16: skipped ({r['bf16']['skipped']})", file=out)
        for row in rows16:
            label = f"{row['what'].split()[0]} b{row['batch']}"
            print(f"  {label:12} {row['ours_samples_per_s']:9.1f} "
                  f"{row['torch_samples_per_s']:10.1f} {row['ratio']:6.2f}× "
                  f"{row['vs_ours_f32']:9.2f}× {row['vs_torch_f32']:7.2f}× "
                  f"{row['ours_gflops']:10.2f} {100 * row['of_peak']:8.1f}% "
                  f"{100 * row['of_bf16_peak']:9.1f}%  {row['torch_path']}/{row['torch_policy']}",
                  file=out)
        for t in r["targets"]:
            what, val = describe_target(t)
            print(f"  target {what:34} {val:>9}  {'MET' if t['met'] else 'NOT MET'}", file=out)
    print(f"\n(PyTorch/s is the faster of OMP_WAIT_POLICY {' and '.join(policies)}, shown in the "
          f"last columns; samples/s from the median call)", file=out)


def main():
    if ARGS.torch_worker:
        torch_worker(*ARGS.torch_worker)
        return
    build = find_build()
    torch.set_num_threads(ARGS.threads)
    env = {"cpu_model": cpu_model(), "nproc": os.cpu_count(),
           "loadavg": " ".join(open("/proc/loadavg").read().split()[:3]),
           "date": time.strftime("%Y-%m-%d %H:%M %Z"), "threads": ARGS.threads,
           "seconds": ARGS.seconds, "quick": ARGS.quick, "omp_wait_policies": ARGS.omp_wait_policy}
    blas = torch_blas()
    if not blas["openblas_library"]:
        log("bench_dit.py: warning: PyTorch does not load OpenBLAS here; the peer is not the one "
            "architecture.md §11 names")
    log(f"PyTorch {torch.__version__}, BLAS: {blas['openblas_library']} "
        f"({blas['openblas_config']}), {ARGS.threads} threads")
    if ARGS.keep:
        os.makedirs(ARGS.keep, exist_ok=True)
    work = ARGS.keep or tempfile.mkdtemp(prefix="tessera-bench-dit-")
    try:
        log("sgemm peak (bench_gemm) ...")
        snap = cpu_snapshot()
        peak = sgemm_peak(build)
        peak["other_load"] = other_load(snap, cpu_snapshot())
        global OURS_CORE
        OURS_CORE = (peak.get("engine_blas") or {}).get("core")
        log(f"ours: {(peak.get('engine_blas') or {}).get('line', 'GEMM kernels unknown')}")
        results = [run_config(name, build, work, peak) for name in ARGS.config]
    finally:
        if not ARGS.keep:
            shutil.rmtree(work, ignore_errors=True)
    torch_core = (results[0]["torch_blas"] or {}).get("openblas_core") if results else None
    doc = {"env": env, "peak": peak, "results": results,
           "kernels": {"ours": OURS_CORE, "torch": torch_core,
                       "fair": kernels_fair(OURS_CORE, torch_core)}}
    if ARGS.json_out:
        with open(ARGS.json_out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    if ARGS.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print_report(env, peak, results, doc["kernels"])


if __name__ == "__main__":
    main()
