#!/bin/sh
# test_lp_convert_hw.sh NVCC — on a GPU, kernels/math.h rounds to f16 and bf16 with the
# hardware's cvt.rn (one instruction; sm_80 on for bf16, the bit arithmetic below that), on the
# CPU with its bit arithmetic; every parity test holds a GPU kernel's 16-bit values to the CPU's
# bits. tests/lp_convert_hw.cu compares math.h's host conversions with NVIDIA's host
# __float2half_rn and __float2bfloat16_rn for all 2^32 floats (~11 s), and this script checks
# in the PTX that the device path is the instruction where it should be. Needs nvcc, not a GPU;
# skips (77) without one.
set -eu
NVCC=${1:-}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/lib.sh"
[ -n "$NVCC" ] && [ -x "$NVCC" ] || { echo "SKIP: no nvcc (this build has no CUDA backend)"; exit 77; }
src="$root/tests/lp_convert_hw.cu"
flags="-I$root -O3 -std=c++17 --fmad=false -x cu"
# shellcheck disable=SC2086 # flags are words
"$NVCC" $flags -arch=sm_80 "$src" -o "$dir/lp" >"$dir/nvcc.txt" 2>&1 || fail "nvcc: $(tail -5 "$dir/nvcc.txt")"
"$dir/lp" || fail "math.h's conversions differ from NVIDIA's"
for arch in 90 80 75; do
    # shellcheck disable=SC2086
    "$NVCC" $flags -arch=sm_$arch -ptx "$src" -o "$dir/k$arch.ptx" >"$dir/nvcc.txt" 2>&1 ||
        fail "nvcc -ptx sm_$arch: $(tail -5 "$dir/nvcc.txt")"
    grep -q 'cvt\.rn\.f16\.f32' "$dir/k$arch.ptx" || fail "sm_$arch: f16 not rounded by cvt.rn.f16.f32"
    if [ "$arch" -ge 80 ]; then
        grep -q 'cvt\.rn\.bf16\.f32' "$dir/k$arch.ptx" || fail "sm_$arch: bf16 not rounded by cvt.rn.bf16.f32"
    elif grep -q 'cvt\.rn\.bf16' "$dir/k$arch.ptx"; then
        fail "sm_$arch has no cvt to bf16, yet the PTX has one"
    fi
done
echo "test_lp_convert_hw: math.h's device conversions are the instruction, its host ones NVIDIA's bits"
