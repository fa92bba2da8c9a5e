#!/bin/sh
# test_flash_regs.sh NVCC — the flash attention's kernels (kernels/cuda/cuda_flash.cu) keep each
# lane's fragments in registers: ptxas's report (-Xptxas -v) for every architecture the build
# compiles (sm_90, 89, 86, 80, 75: Hopper, the consumer Ada and Ampere cards, the A100, Turing),
# every instance with a compile-time head (k_flash<HD, F16>, k_flash_bwd_q/kv<HD, F16>, HD > 0),
# both types. A per-lane array in local memory — a loop over it left rolled, as the f16 instances
# once were — takes a stack frame of 496 bytes or more (the forward's), and every step of the
# inner loop then goes through memory; a few words of spill are the register allocator's and are
# allowed (< 64 bytes). The run-time head's instance (HD = 0) keeps its arrays in local memory by
# design. Needs no GPU; skips (77) without nvcc.
set -eu
NVCC=${1:-} # (empty: a build without CUDA)
root=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/lib.sh"
[ -n "$NVCC" ] && [ -x "$NVCC" ] || { echo "SKIP: no nvcc (this build has no CUDA backend)"; exit 77; }
for arch in 90 89 86 80 75; do
    "$NVCC" -I"$root" -O3 -DNDEBUG -std=c++17 --fmad=false -DTESSERA_HAVE_CUDA=1 \
        --generate-code="arch=compute_$arch,code=sm_$arch" -Xptxas -v -x cu \
        -c "$root/kernels/cuda/cuda_flash.cu" -o "$dir/flash.o" >"$dir/ptxas.txt" 2>&1 ||
        fail "nvcc sm_$arch: $(tail -5 "$dir/ptxas.txt")"
    "$PY" - "$dir/ptxas.txt" "$arch" <<'PY' || fail "sm_$arch: a flash kernel keeps lane arrays in local memory"
import re, sys
text, arch = open(sys.argv[1]).read(), sys.argv[2]
rows, cur = [], None
for line in text.splitlines():
    m = re.search(r"Compiling entry function '(_Z\d+(k_flash\w*)I[^']*)' for 'sm_\d+'", line)
    if m:
        # the template arguments: HD and F16, the first two integer literals (Li<n>E)
        args = re.findall(r"Li(\d+)E", m.group(1))
        cur = {"name": m.group(2), "hd": int(args[0]), "f16": int(args[1]), "stack": None}
        rows.append(cur)
        continue
    m = re.search(r"(\d+) bytes stack frame", line)
    if m and cur is not None and cur["stack"] is None:
        cur["stack"] = int(m.group(1))
    m = re.search(r"Used (\d+) registers", line)
    if m and cur is not None:
        cur["regs"] = int(m.group(1))
named = [r for r in rows if r["hd"] > 0]
bad = [r for r in named if r["stack"] is None or r["stack"] >= 64]
want = 3 * 4 * 2  # three kernels, four heads (cuda_heads.h), two types
for r in named:
    print(f"sm_{arch} {r['name']}<{r['hd']}, {'f16' if r['f16'] else 'bf16'}>: "
          f"{r.get('regs')} registers, stack {r['stack']} bytes")
if len(named) < want:
    print(f"only {len(named)} instances with a head in ptxas's report (want {want})")
    sys.exit(1)
for r in bad:
    print(f"LOCAL MEMORY: sm_{arch} {r['name']}<{r['hd']}, f16={r['f16']}>: stack {r['stack']}")
sys.exit(1 if bad else 0)
PY
done
echo "test_flash_regs: every flash kernel with a compile-time head keeps its lane arrays in registers"
