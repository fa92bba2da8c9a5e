#!/usr/bin/env python3
"""ab_forward.py — two bench_dit binaries (before and after a change) timed in alternated pairs on
the same weights: forward samples/s per batch, each side's fraction of the 2048³ sgemm peak
measured in its own process, and the per-pair ratio after/before (its median, min and max).

    bench/ab_forward.py --old OLD/bench_dit --new NEW/bench_dit --weights W.safetensors \\
        [--weights ...] [--batch 64 ...] [--pairs 5] [--json OUT]

Each pair runs old then new, the next new then old, so a drift of the machine falls on both. Run
it on an idle machine; OPENBLAS_CORETYPE and the thread count are passed through unchanged."""

import argparse
import json
import os
import statistics
import subprocess
import sys


def run(binary, weights, batches, threads, seconds):
    cmd = [binary, "--weights", weights, "--threads", str(threads), "--train-batch", "0",
           "--seconds", str(seconds), "--peak", "2048", "--json"]
    for b in batches:
        cmd += ["--batch", str(b)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"ab_forward: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--weights", action="append", required=True)
    ap.add_argument("--batch", action="append", type=int)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--json", help="write every run's figures here")
    a = ap.parse_args()
    batches = a.batch or [1, 64]
    rows = []
    for w in a.weights:
        for k in range(a.pairs):
            for side in (["old", "new"] if k % 2 == 0 else ["new", "old"]):
                d = run(getattr(a, side), w, batches, a.threads, a.seconds)
                for r in d["results"]:
                    rows.append({"weights": w, "side": side, "pair": k, "batch": r["batch"],
                                 "samples_per_s": r["samples_per_s"], "gflops": r["gflops"],
                                 "peak_gflops": d["peak"]["f32_gflops"]})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    for w in a.weights:
        for b in batches:
            def get(side, k):
                return next(r for r in rows if r["weights"] == w and r["side"] == side
                            and r["batch"] == b and r["pair"] == k)
            ratios = [get("new", k)["samples_per_s"] / get("old", k)["samples_per_s"]
                      for k in range(a.pairs)]
            print(f"{os.path.basename(w)} b{b} new/old: median {statistics.median(ratios):.3f} "
                  f"(min {min(ratios):.3f} max {max(ratios):.3f})")
            for side in ("old", "new"):
                fr = [get(side, k)["gflops"] / get(side, k)["peak_gflops"] for k in range(a.pairs)]
                sps = [get(side, k)["samples_per_s"] for k in range(a.pairs)]
                print(f"    {side}: median {statistics.median(sps):.1f} samples/s, "
                      f"{100 * statistics.median(fr):.1f} % of peak "
                      f"(min {100 * min(fr):.1f} max {100 * max(fr):.1f})")


if __name__ == "__main__":
    main()
