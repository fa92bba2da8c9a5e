#!/usr/bin/python3
"""flash_ptx.py — what the flash attention's kernels (kernels/cuda/cuda_flash.cu) ask of a GPU,
counted in their PTX, without a GPU: for every instance with a compile-time head, the PTX
instructions in all, and those that load shared memory (scalar ld.shared, ldmatrix), multiply
(mma), convert to 16 bits (cvt.rn.bf16/f16, pairs or single) and load global memory. Static counts
of the whole kernel (its key-block loop is unrolled inside), not instructions executed; a GPU's
timing is bench_gpu.py's.

    bench/flash_ptx.py [--root DIR] [--arch 90] [--nvcc nvcc] [--json OUT]

--root: the source tree to compile (default: this one) — e.g. a `git worktree` of an older
commit, for a before-and-after table (docs/benchmarks.md)."""
import argparse, collections, json, os, re, subprocess, sys, tempfile


def count(root, arch, nvcc):
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "flash.ptx")
        cmd = [nvcc, "-I" + root, "-O3", "-DNDEBUG", "-std=c++17", "--fmad=false",
               "-DTESSERA_HAVE_CUDA=1", "-arch=sm_" + arch, "-x", "cu", "-ptx",
               os.path.join(root, "kernels/cuda/cuda_flash.cu"), "-o", ptx]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("flash_ptx: nvcc failed:\n" + r.stderr[-2000:])
        text = open(ptx).read()
    rows, cur = collections.OrderedDict(), None
    for line in text.splitlines():
        m = re.search(r"\.entry (\S+)\(", line)
        if m:
            mm = re.search(r"(k_flash\w*)I.*?Li(\d+)E.*?Li(\d+)E", m.group(1))
            cur = None
            if mm and int(mm.group(2)) > 0:
                cur = f"{mm.group(1)}<{mm.group(2)}, {'f16' if mm.group(3) == '1' else 'bf16'}>"
                rows[cur] = collections.Counter()
            continue
        s = line.strip().strip("{}").strip()  # cuda_fp16.h's inline asm comes in braces
        if cur is None or not s or s[0] in "/." or s.endswith(":"):
            continue
        op = re.sub(r"^@!?%\w+\s+", "", s).split()[0].rstrip(";")
        c = rows[cur]
        c["all"] += 1
        for key, prefix in (("ld.shared", "ld.shared"), ("ldmatrix", "ldmatrix"), ("mma", "mma"),
                            ("ld.global", "ld.global"), ("cvt16", "cvt.rn.bf16"),
                            ("cvt16", "cvt.rn.f16")):
            if op.startswith(prefix):
                c[key] += 1
    return {k: dict(v) for k, v in rows.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--arch", default="90")
    ap.add_argument("--nvcc", default="nvcc")
    ap.add_argument("--json", help="write the counts here too")
    a = ap.parse_args()
    rows = count(a.root, a.arch, a.nvcc)
    print(f"sm_{a.arch}: PTX instructions per kernel instance")
    print(f"{'instance':28} {'all':>6} {'ld.shared':>9} {'ldmatrix':>8} {'mma':>5} {'cvt16':>6} {'ld.global':>9}")
    for k, c in rows.items():
        print(f"{k:28} {c.get('all', 0):6} {c.get('ld.shared', 0):9} {c.get('ldmatrix', 0):8} "
              f"{c.get('mma', 0):5} {c.get('cvt16', 0):6} {c.get('ld.global', 0):9}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"arch": a.arch, "root": a.root, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
