#!/bin/sh
# test_blas_cli.sh TESSERA TESSERAD — the GEMM kernels, said and checked by the programs:
# OpenBLAS made to load its weakest x86-64 set (Prescott) as though it had chosen it
# (TESSERA_BLAS_TEST_AS_DETECTED=1, kernels/cpu/blas_core.h), on a CPU that runs better:
#   - tessera selfcheck re-executes itself with the CPU's set and passes, saying who chose it;
#   - with the re-execution forbidden (TESSERA_BLAS_REEXEC=0) it fails, naming the fix;
#   - the set the user chose (OPENBLAS_CORETYPE alone) passes, and is said to be weaker;
#   - tesserad logs the set at start-up, and its device string (adverts, status) names it.
# Skips (77) on a CPU whose best set is Prescott: there is nothing better to choose.
set -eu
T=${1:?usage: test_blas_cli.sh TESSERA TESSERAD}
D=${2:?usage: test_blas_cli.sh TESSERA TESSERAD}
. "$(dirname "$0")/lib.sh"
gemm() { "$PY" -c 'import json,sys; print(json.load(sys.stdin)["gemm"])'; }

env -u OPENBLAS_CORETYPE -u TESSERA_BLAS_REEXEC "$T" selfcheck --json --threads 1 >"$dir/own.json" || true
best=$(gemm <"$dir/own.json" | sed -n 's/.*the CPU.s best: \([A-Za-z]*\).*/\1/p; s/.*this CPU.s \([A-Za-z]*\):.*/\1/p')
[ -n "$best" ] || { echo "SKIP: the CPU's best OpenBLAS set is not known here: $(gemm <"$dir/own.json")"; exit 77; }
[ "$best" != Prescott ] || { echo "SKIP: this CPU's best set is Prescott: nothing to re-execute for"; exit 77; }

# the re-execution
OPENBLAS_CORETYPE=Prescott TESSERA_BLAS_TEST_AS_DETECTED=1 "$T" selfcheck --threads 1 >"$dir/re.txt" ||
    fail "selfcheck after the re-execution: $(grep -E 'GEMM|FAIL' "$dir/re.txt")"
grep -q "^GEMM: OpenBLAS $best kernels (chosen by tessera (OpenBLAS chose Prescott" "$dir/re.txt" ||
    fail "the re-execution is not said: $(grep GEMM "$dir/re.txt")"
echo "ok: OpenBLAS's weak pick replaced before main: $(grep GEMM "$dir/re.txt" | cut -c1-120)"

# forbidden: the weak set stays, selfcheck fails with the fix
rc=0
OPENBLAS_CORETYPE=Prescott TESSERA_BLAS_TEST_AS_DETECTED=1 TESSERA_BLAS_REEXEC=0 "$T" selfcheck \
    --threads 1 >"$dir/weak.txt" || rc=$?
[ "$rc" = 1 ] || fail "selfcheck with weaker kernels: exit $rc, want 1"
grep -q "gemm kernels .*Prescott.*FAIL" "$dir/weak.txt" && grep -q "OPENBLAS_CORETYPE=$best" "$dir/weak.txt" ||
    fail "no failing gemm row with the fix: $(grep -Ei 'gemm' "$dir/weak.txt")"
echo "ok: weaker kernels fail selfcheck, naming OPENBLAS_CORETYPE=$best"

# the user's own choice: said, not failed
OPENBLAS_CORETYPE=Prescott "$T" selfcheck --threads 1 >"$dir/user.txt" ||
    fail "selfcheck with the user's OPENBLAS_CORETYPE: $(grep -E 'GEMM|FAIL' "$dir/user.txt")"
grep -q "^GEMM: OpenBLAS Prescott kernels (chosen by OPENBLAS_CORETYPE=Prescott, set by the user), weaker" \
    "$dir/user.txt" || fail "the user's choice is not said: $(grep GEMM "$dir/user.txt")"
echo "ok: the user's choice is kept and said"

# the daemon: the start-up log and the device string
"$T" keygen --out "$dir/id.key" >/dev/null
"$T" keygen --network-key --out "$dir/net.key" >/dev/null
cat >"$dir/d.ini" <<INI
[node]
identity = $dir/id.key
network_key = $dir/net.key
listen = 127.0.0.1:0
data_dir = $dir/data
[log]
file = $dir/d.log
INI
OPENBLAS_CORETYPE=Prescott TESSERA_BLAS_TEST_AS_DETECTED=1 "$D" --config "$dir/d.ini" 2>"$dir/d.err" &
pids=$!
logs="$dir/d.err $dir/d.log" log_lines=5
wait_log "$dir/d.log" "GEMM:" 30
grep -q "GEMM: OpenBLAS $best kernels (chosen by tessera (OpenBLAS chose Prescott" "$dir/d.log" ||
    fail "tesserad's GEMM line: $(grep GEMM "$dir/d.log")"
echo "ok: tesserad logs its kernels: $(grep -o 'GEMM: .*' "$dir/d.log" | cut -c1-100)"
