#!/usr/bin/env bash
# scripts/gpu-bundle.sh — pack what the GPU checks (scripts/gpu-check.sh) need into one file, for a machine that
# has a GPU and the CUDA Toolkit but none of this project's Debian libraries.
#
# Usage: scripts/gpu-bundle.sh [BUILD] [DEST]      (defaults: build, .gpu)
#
# BUILD must be a build tree with the CUDA backend (`tessera --version` says "CUDA backend:
# built"; `make build` makes one where nvcc is found). Writes DEST/bundle.tar.xz holding:
#   build/{bench,client,daemon,tests}/…  the binaries the checks run (bench_dit, bench_gemm,
#                                         bench_vae, tessera, tesserad, test_cuda_parity,
#                                         test_cuda_dit, test_cuda_vae)
#   lib/                                 every shared library they load, except the C library's
#                                         own, the C++ runtime and CUDA's (the GPU machine has
#                                         newer ones: this machine's glibc is older than its)
#   fmnist/                              the first 10 000 training and 2 000 test images of
#                                         Fashion-MNIST (test_gpu_daemon trains on them)
# and checks that it stays under 30 MiB (the device tool carries 64 MiB with the source tree).
# scripts/gpu-check.sh unpacks and runs it there; docs/benchmarks.md, "On a GPU", says how.
# TESSERA_BUNDLE_XZ_LEVEL (default 6) is xz's preset: tests/test_gpu_scripts.sh uses 0 (23 s, 24 MiB).
set -euo pipefail

BUILD=${1:-build}
DEST=${2:-.gpu}
LIMIT=$((30 * 1024 * 1024))
BINS=(bench/bench_dit bench/bench_gemm bench/bench_vae client/tessera daemon/tesserad
    tests/test_cuda_parity tests/test_cuda_dit tests/test_cuda_vae)
FMNIST=${TESSERA_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}

die() {
    echo "gpu-bundle.sh: $*" >&2
    exit 1
}
case "${1:-}" in -h | --help)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 0
    ;;
esac

for b in "${BINS[@]}"; do
    [ -x "$BUILD/$b" ] || die "no $BUILD/$b: build it first (make build)"
done
"$BUILD/client/tessera" --version | grep -q "CUDA backend: built" ||
    die "$BUILD was built without the CUDA backend ($("$BUILD/client/tessera" --version)); a GPU \
run needs one (nvcc on PATH when configuring)"
[ -f "$FMNIST/train-images-idx3-ubyte.gz" ] ||
    die "no Fashion-MNIST in $FMNIST (apt-get install dataset-fashion-mnist)"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/fmnist" "$DEST"
for b in "${BINS[@]}"; do
    mkdir -p "$stage/build/$(dirname "$b")"
    cp "$BUILD/$b" "$stage/build/$b"
done

# The libraries: what ldd resolves, less what the GPU machine must bring itself.
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt)\.so'
missing=$(for b in "${BINS[@]}"; do ldd "$BUILD/$b"; done | awk '/not found/ {print $1}' | sort -u)
[ -z "$missing" ] || die "libraries not found here: $missing"
for b in "${BINS[@]}"; do ldd "$BUILD/$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    sort -u | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    cp -L "$path" "$stage/lib/$name"
done

# A slice of Fashion-MNIST: the IDX header's count rewritten, the first N items kept.
/usr/bin/python3 - "$FMNIST" "$stage/fmnist" <<'PY'
import gzip, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for split, n in (("train", 10000), ("t10k", 2000)):
    for kind, item in (("images-idx3", 28 * 28), ("labels-idx1", 1)):
        name = f"{split}-{kind}-ubyte.gz"
        with gzip.open(f"{src}/{name}", "rb") as f:
            data = f.read()
        dims = data[3]
        head = bytearray(data[:4 + 4 * dims])
        struct.pack_into(">I", head, 4, n)
        body = data[4 + 4 * dims:4 + 4 * dims + n * item]
        assert len(body) == n * item, name
        with gzip.open(f"{dst}/{name}", "wb", compresslevel=9) as f:
            f.write(bytes(head) + body)
PY

# One xz stream with a dictionary larger than the tar: the six binaries each carry the same CUDA
# kernels (several MB of fatbin), and a dictionary that spans them all stores those once (a
# multi-threaded xz cuts the input into blocks of its own and cannot).
tar -cf - -C "$stage" . |
    xz -T1 "--lzma2=preset=${TESSERA_BUNDLE_XZ_LEVEL:-6},dict=192MiB" >"$DEST/bundle.tar.xz.part"
mv "$DEST/bundle.tar.xz.part" "$DEST/bundle.tar.xz"
size=$(stat -c %s "$DEST/bundle.tar.xz")
[ "$size" -le "$LIMIT" ] || die "$DEST/bundle.tar.xz is $size bytes, over the $LIMIT the carry allows"
echo "gpu-bundle.sh: $DEST/bundle.tar.xz, $((size / 1024)) KiB: ${#BINS[@]} binaries, \
$(ls "$stage/lib" | wc -l) libraries, Fashion-MNIST 10 000 + 2 000"
