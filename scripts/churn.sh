#!/usr/bin/env bash
# churn.sh [--tessera PATH] [--seconds S] [--nodes N] [--clients C] [--interval S] [--calm]
#          [--out FILE]
#
# Churn at process level (nodes killed, restarted, added and stopped in turn): `tessera up --nodes N --experts experts/demo`
# (4 experts, so N = 8 gives two replicas each), C clients generating through node 0 one after
# the other for S seconds, while every --interval seconds the next action of a fixed rotation
# hits a node other than node 0: kill -9, restart (a killed or stopped node comes back with its
# store and address book), add a new node (it joins through node 0 and hosts the next expert),
# SIGTERM (a graceful leave), restart. At the end it checks that every daemon it did not stop is still
# running, and compares each surviving daemon's resident memory with what it was after warm-up.
# --calm takes no action: a load test (`--nodes 4 --clients 32 --calm`).
#
# Prints one JSON object (also written to --out): generations completed and failed, how many
# ran degraded or with a cluster routed around, their p50/p99 wall time, the actions taken,
# unexpected daemon deaths, and the resident memory before and after. Exit status 0 when every
# generation completed and no daemon died unexpectedly, 1 otherwise. docs/benchmarks.md
# ("Churn and load") has the numbers of a 60 s run; tests/test_churn.sh runs a short one.
set -euo pipefail
T=build/client/tessera S=60 N=8 C=4 INTERVAL=3 OUT= CALM=0
while [ $# -gt 0 ]; do
    case "$1" in
    --tessera) T=$2; shift 2 ;;
    --seconds) S=$2; shift 2 ;;
    --nodes) N=$2; shift 2 ;;
    --clients) C=$2; shift 2 ;;
    --interval) INTERVAL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --calm) CALM=1; shift ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "churn.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
PY=/usr/bin/python3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
T=$(cd "$(dirname "$T")" && pwd)/$(basename "$T")
D=$(cd "$(dirname "$T")/../daemon" 2>/dev/null && pwd)/tesserad
[ -x "$D" ] || { echo "churn.sh: no tesserad next to $T ($D)" >&2; exit 2; }
R=$(mktemp -d)
cpids=
cleanup() {
    for p in $cpids; do kill "$p" 2>/dev/null || true; done
    "$T" down --dir "$R/net" --timeout 5 >/dev/null 2>&1 || true
    rm -rf "$R"
}
trap cleanup EXIT
log() { echo "churn: $*" >&2; }

"$T" up --nodes "$N" --experts "$ROOT/experts/demo" --dir "$R/net" --json >"$R/up.json" 2>"$R/up.err" ||
    { cat "$R/up.err" >&2; exit 1; }
peer=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["peer"])' "$R/up.json")
nk="$R/net/network.key"
pidof_node() { cat "$R/net/node-$1/tesserad.pid" 2>/dev/null || true; }
alive() { # alive I: node I's pid runs tesserad and is not a zombie (a pid can be reused)
    p=$(pidof_node "$1")
    [ -n "$p" ] && [ -r "/proc/$p/stat" ] || return 1
    st=$(sed 's/^.*) \(.\).*/\1/' "/proc/$p/stat" 2>/dev/null) || return 1
    [ "$st" != Z ] && tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q tesserad
}
rss() { r=$(sed -n 's/^VmRSS:[^0-9]*\([0-9]*\).*/\1/p' "/proc/$1/status" 2>/dev/null); echo "${r:-0}"; }
start_node() { # start_node I: tesserad of node I in the background, its pid file written
    "$D" --config "$R/net/node-$1/tesserad.ini" </dev/null >>"$R/net/node-$1/tesserad.out" 2>&1 &
    echo $! >"$R/net/node-$1/tesserad.pid"
    disown $! 2>/dev/null || true
}

# C clients, each generating again and again until the time is up; one line per generation
end=$(($(date +%s) + S))
for c in $(seq 1 "$C"); do
    (
        k=0
        while [ "$(date +%s)" -lt "$end" ]; do
            k=$((k + 1))
            s=$(date +%s%N)
            rc=0
            "$T" generate --peer "$peer" --network-key "$nk" --data-dir "$R/client-$c" --n 8 \
                --steps 8 --sampler euler --seed $((c * 1000 + k)) --json \
                --out "$R/client-$c.png" >"$R/client-$c.json" 2>"$R/client-$c.err" || rc=$?
            ms=$((($(date +%s%N) - s) / 1000000))
            "$PY" - "$R/client-$c.json" "$rc" "$ms" "$c" >>"$R/gens-$c.jsonl" <<'PY'
import json, sys
path, rc, ms, c = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
j = {}
try:
    j = json.load(open(path)) if rc == 0 else {}
except ValueError:
    pass
net = j.get("network", {})
print(json.dumps({"client": c, "rc": rc, "ms": ms,
                  "degraded": net.get("degraded_evaluations", 0),
                  "uncovered": len(j.get("uncovered", []))}))
PY
            [ "$rc" -eq 0 ] || cp "$R/client-$c.err" "$R/failed-$c-$k.err"
        done
    ) &
    cpids="$cpids $!"
done

# warm-up, then the resident memory of every node
sleep "$INTERVAL"
declare -A rss0
for i in $(seq 0 $((N - 1))); do alive "$i" && rss0[$i]=$(rss "$(pidof_node "$i")"); done

# the rotation
# add before term: a restart after SIGTERM waits for the node's leave (up to 15 s), which in a short
# run (test_churn: 20 s) could end the run before a later action ever ran
actions='kill9 restart add term restart'
stopped=() next=$N n_act=0 kills=0 terms=0 restarts=0 adds=0
: >"$R/actions.txt"
# (the first four actions — one of each kind — run whatever the time: on a loaded machine a slow
# start can leave too little of the run for them, and test_churn checks that each kind ran)
while [ "$CALM" -eq 0 ] && { [ "$(date +%s)" -lt $((end - INTERVAL)) ] || [ "$n_act" -lt 4 ]; }; do
    n_act=$((n_act + 1))
    a=$(echo $actions | cut -d' ' -f$(((n_act - 1) % 5 + 1)))
    live=()
    for i in $(seq 1 $((next - 1))); do alive "$i" && live+=("$i"); done
    case "$a" in
    kill9 | term)
        [ ${#live[@]} -gt 0 ] || continue
        v=${live[$((RANDOM % ${#live[@]}))]}
        if [ "$a" = kill9 ]; then kill -9 "$(pidof_node "$v")"; kills=$((kills + 1));
        else kill -TERM "$(pidof_node "$v")"; terms=$((terms + 1)); fi
        stopped+=("$v")
        echo "$(date +%s) $a node $v" >>"$R/actions.txt"
        ;;
    restart)
        [ ${#stopped[@]} -gt 0 ] || continue
        v=${stopped[0]}
        stopped=("${stopped[@]:1}")
        w=0 # a SIGTERM'd node finishes its leave first (at most 15 s, then it is killed)
        while alive "$v"; do
            w=$((w + 1))
            [ $w -lt 150 ] || { kill -9 "$(pidof_node "$v")" 2>/dev/null || true; }
            sleep 0.1
        done
        start_node "$v"
        restarts=$((restarts + 1))
        echo "$(date +%s) restart node $v" >>"$R/actions.txt"
        ;;
    add)
        i=$next
        next=$((next + 1))
        mkdir -p "$R/net/node-$i"
        "$T" keygen --out "$R/net/node-$i/identity.key" >/dev/null
        sed -e "s|/node-1/|/node-$i/|g" -e "s|expert-1\.safetensors|expert-$((i % 4)).safetensors|" \
            "$R/net/node-1/tesserad.ini" >"$R/net/node-$i/tesserad.ini"
        start_node "$i"
        adds=$((adds + 1))
        echo "$(date +%s) add node $i" >>"$R/actions.txt"
        ;;
    esac
    sleep "$INTERVAL"
done
for p in $cpids; do wait "$p" || true; done
cpids=
cat "$R"/gens-*.jsonl >"$R/gens.jsonl" # one file per client: their lines never interleave

# who should be running: everyone not in `stopped`
deaths=0 rss_lines=""
for i in $(seq 0 $((next - 1))); do
    expect=1
    for v in "${stopped[@]:-}"; do [ "$v" = "$i" ] && expect=0; done
    if [ $expect -eq 1 ] && ! alive "$i"; then
        deaths=$((deaths + 1))
        log "node $i died unexpectedly: $(tail -n 3 "$R/net/node-$i/tesserad.out" 2>/dev/null)"
    fi
    if [ -n "${rss0[$i]:-}" ] && alive "$i"; then
        rss_lines="$rss_lines $i:${rss0[$i]}:$(rss "$(pidof_node "$i")")"
    fi
done
for f in "$R"/failed-*.err; do [ -f "$f" ] && log "a failed generation: $(tail -n 2 "$f")"; done
"$PY" - "$R/gens.jsonl" "$S" "$N" "$C" "$kills" "$terms" "$restarts" "$adds" "$deaths" \
    "$rss_lines" "${OUT:-/dev/null}" <<'PY'
import json, sys
gens = [json.loads(l) for l in open(sys.argv[1])]
S, N, C, kills, terms, restarts, adds, deaths = map(int, sys.argv[2:10])
rss = [tuple(map(int, x.split(":"))) for x in sys.argv[10].split()]
ok = [g for g in gens if g["rc"] == 0]
ms = sorted(g["ms"] for g in ok)
q = lambda p: ms[min(len(ms) - 1, int(p * (len(ms) - 1) + 0.5))] if ms else None
out = {"seconds": S, "nodes": N, "clients": C,
       "generations": len(gens), "completed": len(ok), "failed": len(gens) - len(ok),
       "degraded": sum(1 for g in ok if g["degraded"] > 0),
       "routed_around": sum(1 for g in ok if g["uncovered"] > 0),
       "ms_p50": q(0.5), "ms_p99": q(0.99),
       "images_per_s": round(8 * len(ok) / S, 2),
       "actions": {"kill9": kills, "term": terms, "restart": restarts, "add": adds},
       "unexpected_deaths": deaths,
       "rss_kib": [{"node": n, "after_warmup": a, "end": b} for n, a, b in rss],
       "rss_growth_kib_max": max((b - a for _, a, b in rss), default=0)}
s = json.dumps(out)
print(s)
if sys.argv[11] != "/dev/null":
    open(sys.argv[11], "w").write(s + "\n")
sys.exit(0 if out["failed"] == 0 and deaths == 0 and out["completed"] > 0 else 1)
PY
