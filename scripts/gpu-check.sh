#!/usr/bin/env bash
# scripts/gpu-check.sh — the CUDA path's checks and benchmark on a machine with an NVIDIA GPU, run from the bundle
# scripts/gpu-bundle.sh made (so that machine needs the CUDA Toolkit's libraries, python3 with
# PyTorch, and nothing of Debian's).
#
# Usage: scripts/gpu-check.sh [--bundle FILE] [--out DIR] [--deadline S] [STEP ...]
#
#   --bundle FILE  the bundle (default .gpu/bundle.tar.xz)
#   --out DIR      where the logs, the summary and bench-gpu.json go (default $OUT, else
#                  /tmp/gpu-check)
#   --deadline S   the whole run's seconds (default 540): each step's timeout is cut to what is
#                  left, and a step that cannot start with 20 s left is skipped, so the run ends
#                  inside one device call and says what it did not reach
#   STEP           any of: env parity dit vae selfcheck daemon memcheck initcheck bench
#                  (default: all, in that order)
#       env        the GPU (nvidia-smi) and the libraries every binary resolves
#       parity     tests/test_cuda_parity: every op on the GPU against the CPU
#       dit        tests/test_cuda_dit: the DiT forward, backward, training steps and sampler
#       vae        tests/test_cuda_vae: the VAE's encode and decode on the GPU against the CPU
#       selfcheck  tessera selfcheck (kernels against references, the GPU against the CPU)
#       daemon     tests/test_gpu_daemon.sh: tesserad with device = cuda trains and serves
#       memcheck   compute-sanitizer --tool memcheck over test_cuda_parity, test_cuda_dit and
#                  test_cuda_vae:
#                  fails on any report (an out-of-bounds or misaligned access, a CUDA API
#                  error), on a test failing under it, or when compute-sanitizer is not found
#       initcheck  compute-sanitizer --tool initcheck over the same two: fails on any read of
#                  device memory nobody wrote. The tool does not see cuBLAS's bf16 products'
#                  writes (docs/benchmarks.md, "On a GPU"), so this step runs the binaries with
#                  TESSERA_CUDA_INITCHECK=1: the engine memsets each 16-bit product's output
#                  first, where the tool sees it
#       bench      bench/bench_gpu.py: the DiT configs and the VAE against PyTorch on the same GPU
#
# BENCH_GPU_ARGS, when set, is added to bench_gpu.py's arguments (e.g. "--config dit-s --quick";
# "--device cpu --config tiny --quick" rehearses the whole script on a machine without a GPU).
#
# Writes DIR/summary.txt (one line per step: ok, FAIL, SKIP with the reason) and DIR/<step>.log;
# exits 0 when no step failed. Runs as root or not; the Fashion-MNIST slice goes to the default
# data folder only where that is writable and empty.
set -u

here=$(cd "$(dirname "$0")/.." && pwd)
bundle=$here/.gpu/bundle.tar.xz
out=${OUT:-/tmp/gpu-check}
deadline=540
steps=()
while [ $# -gt 0 ]; do
    case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    -h | --help)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
        exit 0
        ;;
    env | parity | dit | vae | selfcheck | daemon | memcheck | initcheck | bench) steps+=("$1"); shift ;;
    *) echo "gpu-check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ ${#steps[@]} -gt 0 ] || steps=(env parity dit vae selfcheck daemon memcheck initcheck bench)
[ -f "$bundle" ] || { echo "gpu-check.sh: no bundle at $bundle (scripts/gpu-bundle.sh)" >&2; exit 2; }

start=$(date +%s)
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

w=$(mktemp -d /tmp/tsgpu.XXXXXX)
tar -xJf "$bundle" -C "$w" || { note "FAIL unpack: $bundle"; exit 1; }

# CUDA's runtime and cuBLAS: the toolkit's folders, else wherever a copy of libcublas.so.13 sits
# (PyTorch's wheels carry one).
cudalib=
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublas.so.13" ] && cudalib=$cudalib:$d
done
if [ -z "$cudalib" ]; then
    f=$(find /usr/local /opt /usr/lib -name 'libcublas.so.13*' 2>/dev/null | head -n 1)
    [ -n "$f" ] && cudalib=:$(dirname "$f")
    f=$(find /usr/local /opt /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -n 1)
    [ -n "$f" ] && cudalib=$cudalib:$(dirname "$f")
fi
# The bundle's libraries are this project's binaries' alone: each binary runs through a wrapper
# (same layout as build/, under $w/wrap) that sets LD_LIBRARY_PATH for it, so that python3 and
# the shell tools keep this machine's own libraries (libz, libffi, libgomp, ...).
LIBS=$w/lib$cudalib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=$w/wrap
for f in "$w"/build/*/*; do
    rel=${f#"$w"/build/}
    mkdir -p "$B/$(dirname "$rel")"
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s\nexport LD_LIBRARY_PATH\nexec %s "$@"\n' "'$LIBS'" "'$f'" \
        >"$B/$rel"
    chmod +x "$B/$rel"
done
# the python3 that has PyTorch (bench_gpu.py needs it; test_gpu_daemon.sh reads JSON with it)
if [ -z "${TESSERA_PYTHON:-}" ]; then
    for p in python3 /usr/bin/python3 /opt/torch/.venv/bin/python3; do
        if "$p" -c 'import torch' 2>/dev/null; then TESSERA_PYTHON=$(command -v "$p"); break; fi
    done
fi
export TESSERA_PYTHON=${TESSERA_PYTHON:-python3}

fm=/usr/share/datasets/fashion-mnist
if [ ! -e "$fm/train-images-idx3-ubyte.gz" ] && [ ! -e "$fm/train-images-idx3-ubyte" ]; then
    mkdir -p "$fm" 2>/dev/null && cp "$w"/fmnist/* "$fm"/ 2>/dev/null ||
        note "note: cannot write $fm: the daemon step will miss the data"
fi

left() { echo $((deadline - ($(date +%s) - start))); }
# step NAME CAP CMD...: runs CMD with min(CAP, time left − 10) seconds, logs, one summary line
step() {
    local name=$1 cap=$2 rem t0 rc
    shift 2
    rem=$(left)
    if [ "$rem" -lt 20 ]; then
        note "SKIP $name: the deadline ($deadline s) is near"
        return
    fi
    [ "$cap" -lt $((rem - 10)) ] || cap=$((rem - 10))
    t0=$(date +%s)
    timeout -k 5 "$cap" "$@" >"$out/$name.log" 2>&1
    rc=$?
    local dt=$(($(date +%s) - t0))
    case $rc in
    0) note "ok   $name (${dt} s)" ;;
    77) note "SKIP $name (${dt} s): $(grep -m1 -i 'skip\|no gpu\|no cuda\|cannot' "$out/$name.log")" ;;
    124 | 137) note "FAIL $name: timed out after ${cap} s (log: $name.log)"; failed=1 ;;
    *) note "FAIL $name (exit $rc, ${dt} s): $(tail -n 1 "$out/$name.log")"; failed=1 ;;
    esac
}

env_check() {
    echo "== nvidia-smi"
    nvidia-smi || echo "(no nvidia-smi)"
    echo "== tessera --version"
    "$B/client/tessera" --version
    echo "== libraries (LD_LIBRARY_PATH=$LIBS, for the bundle's binaries only)"
    local bad=0
    for b in "$w"/build/*/*; do
        [ -x "$b" ] || continue
        if LD_LIBRARY_PATH=$LIBS ldd "$b" | grep -q "not found"; then
            echo "$b:"; LD_LIBRARY_PATH=$LIBS ldd "$b" | grep "not found"; bad=1
        fi
    done
    echo "== where test_cuda_parity's libraries come from"
    LD_LIBRARY_PATH=$LIBS ldd "$w/build/tests/test_cuda_parity"
    [ $bad -eq 0 ] || { echo "missing libraries: nothing else can run"; return 1; }
}

# sanitize TOOL: compute-sanitizer --tool TOOL over test_cuda_parity, then test_cuda_dit (and
# test_cuda_vae under memcheck; each
# through its wrapper: the tool follows the exec); any report is exit 86 and fails the step, and so
# does a test that fails under the tool. Each binary's report is in the step's log, in turn.
sanitize() {
    local tool=$1 cs bad=0 rc t
    if ! nvidia-smi -L >/dev/null 2>&1; then
        echo "no GPU here (nvidia-smi -L failed): nothing for $tool to check"
        return 77
    fi
    cs=$(command -v compute-sanitizer || true)
    for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
        [ -n "$cs" ] || { [ -x "$d/compute-sanitizer" ] && cs=$d/compute-sanitizer; }
    done
    [ -n "$cs" ] || { echo "no compute-sanitizer on PATH or in /usr/local/cuda: cannot check"; return 1; }
    local tests="test_cuda_parity test_cuda_dit"
    [ "$tool" = memcheck ] && tests="$tests test_cuda_vae"
    for t in $tests; do
        echo "== $cs --tool $tool $t"
        rc=0
        [ "$tool" = initcheck ] && export TESSERA_CUDA_INITCHECK=1
        "$cs" --tool "$tool" --target-processes all --error-exitcode 86 --print-limit 50 \
            "$B/tests/$t" || rc=$?
        echo "== $t under $tool: exit $rc"
        [ "$rc" -eq 0 ] || bad=1
    done
    [ $bad -eq 0 ] && echo "no report from $tool" || echo "$tool: a report or a failure above"
    return $bad
}

export B w LIBS
export -f env_check sanitize
failed=0
for s in "${steps[@]}"; do
    case $s in
    env) step env 60 bash -c env_check ;;
    parity) step parity 150 "$B/tests/test_cuda_parity" ;;
    dit) step dit 200 "$B/tests/test_cuda_dit" ;;
    vae) step vae 90 "$B/tests/test_cuda_vae" ;;
    selfcheck) step selfcheck 60 "$B/client/tessera" selfcheck ;;
    daemon) step daemon 240 sh "$here/tests/test_gpu_daemon.sh" "$B/client/tessera" \
        "$B/daemon/tesserad" ;;
    memcheck) step memcheck 120 bash -c 'sanitize memcheck' ;;
    initcheck) step initcheck 200 bash -c 'sanitize initcheck' ;;
    bench) step bench 600 "$TESSERA_PYTHON" "$here/bench/bench_gpu.py" --build "$B" \
        --json-out "$out/bench-gpu.json" ${BENCH_GPU_ARGS:-} ;;
    esac
done
note "total $(($(date +%s) - start)) s; logs in $out"
rm -rf "$w"
exit $failed
