#!/usr/bin/env bash
# tests/fuzz/run.sh SECONDS — build the libFuzzer harnesses in build-fuzz/ (clang,
# -DTESSERA_FUZZ=ON, ASan + UBSan) and run each for SECONDS (default 30), keeping a corpus per
# harness in build-fuzz/corpus/<name>/. Prints each harness's executions; exits non-zero when a
# harness finds a crash (the reproducer is left in build-fuzz/, named crash-*).
set -euo pipefail
secs="${1:-30}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$root/build-fuzz"
jobs="${JOBS:-2}"
command -v clang >/dev/null || { echo "run.sh: clang not found (apt-get install clang libclang-rt-dev, or scripts/setup.sh --all)" >&2; exit 1; }
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
    -DTESSERA_CUDA=OFF -DTESSERA_FUZZ=ON >/dev/null
cmake --build "$build" -j"$jobs" --target fuzz_frame fuzz_envelope fuzz_handshake >/dev/null
status=0
for h in fuzz_frame fuzz_envelope fuzz_handshake; do
    mkdir -p "$build/corpus/$h"
    log="$build/$h.log"
    if (cd "$build" && "$build/tests/fuzz/$h" -max_total_time="$secs" -rss_limit_mb=2048 \
        -max_len=70000 -print_final_stats=1 "$build/corpus/$h" >"$log" 2>&1); then
        runs="$(grep -o 'Done [0-9]* runs' "$log" | tail -n1 | awk '{print $2}')"
        echo "$h: ${runs:-?} executions in ${secs} s, no crash"
    else
        echo "$h: FAILED (see $log)"
        tail -n 30 "$log"
        status=1
    fi
done
exit $status
