#!/usr/bin/env bash
# lost-host-bench.sh TESSERA MODE [RUNDIR] — what a lost host costs a generation.
# Starts `tessera up --nodes 4 --experts experts/demo` (one replica per cluster), generates 64
# samples x 30 steps through it twice (a warm-up, then the undisturbed time), then kill -9 of
# node 2 and the same generation again: MODE=between kills before it starts, MODE=inflight 0.3 s
# into it. Prints one JSON line: both wall times, their ratio, and the network summary's counts.
# Run from the repository root; docs/benchmarks.md "A lost host" has the numbers.
set -euo pipefail
T=${1:?usage: lost-host-bench.sh TESSERA between|inflight [RUNDIR]}
MODE=${2:?usage: lost-host-bench.sh TESSERA between|inflight [RUNDIR]}
R=${3:-$(mktemp -d)/net}
case "$MODE" in between | inflight) ;; *) echo "MODE: between or inflight" >&2; exit 2 ;; esac
rm -rf "$R"
mkdir -p "$(dirname "$R")"
trap '"$T" down --dir "$R" >/dev/null 2>&1 || true' EXIT
"$T" up --nodes 4 --experts experts/demo --dir "$R" --json >"$R.up.json" 2>/dev/null
peer=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['peer'])" "$R.up.json")
gen() {
    "$T" generate --peer "$peer" --network-key "$R/network.key" --data-dir "$R/cache" --n 64 \
        --steps 30 --json --out "$R/$1.png" >"$R/$1.json" 2>"$R/$1.err"
}
now() { date +%s.%N; }
gen warm
s=$(now); gen base; e=$(now)
base=$(/usr/bin/python3 -c "print($e - $s)")
if [ "$MODE" = between ]; then
    kill -9 "$(cat "$R/node-2/tesserad.pid")"
    s=$(now); gen killed; e=$(now)
else
    s=$(now); gen killed & g=$!
    sleep 0.3
    kill -9 "$(cat "$R/node-2/tesserad.pid")"
    wait $g; e=$(now)
fi
killed=$(/usr/bin/python3 -c "print($e - $s)")
/usr/bin/python3 - "$R" "$base" "$killed" "$MODE" <<'PY'
import json, sys
R, b, k, m = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
n = json.load(open(R + "/killed.json"))["network"]
print(json.dumps({"mode": m, "undisturbed_s": round(b, 3), "after_kill_s": round(k, 3),
                  "ratio": round(k / b, 2), "degraded_evaluations": n["degraded_evaluations"],
                  "errors": n["errors"], "requests": n["requests"],
                  "eval_ms_p99": round(n["eval_ms_p99"], 2)}))
PY
