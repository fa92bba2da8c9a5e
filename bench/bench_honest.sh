#!/bin/sh
# bench_honest.sh TESSERA OUT_DIR [GENS] — false accusations on an honest network of mixed
# precisions, on loopback.
#
# Two `tiny` experts (trained for 300 steps, so that their answers are not their biases alone),
# each served by 4 daemons
# (`tessera up --nodes 8`: node i serves expert i mod 2); nodes 2 and 3 are restarted with
# `[compute] precision = f16` (products rounded to f16, the CPU's emulation of a 16-bit GPU path),
# so each expert has three F32 replicas of one device class and one F16 replica. GENS generations
# (default 1000) of 8 images, 4 Heun steps, guidance 1.5, every answer spot-checked
# (`--verify 1`), each with its own seed. Per generation (OUT_DIR/honest.jsonl): the checks made,
# agreed, disagreed, the wrong answers caught (a false accusation: every node here is honest),
# the accusations sent, and the largest relative difference between two agreeing answers that
# did not promise the same bits (the margin under the tolerance). At the end, every node's bans
# (OUT_DIR/bans.json: there must be none). The summary goes to stdout.
set -eu
T=${1:?usage: bench_honest.sh TESSERA OUT_DIR [GENS]}
OUT=${2:?usage: bench_honest.sh TESSERA OUT_DIR [GENS]}
GENS=${3:-1000}
PY=/usr/bin/python3
mkdir -p "$OUT"
dir=$(mktemp -d)
cleanup() {
    [ -d "$dir/net" ] && "$T" down --dir "$dir/net" --timeout 5 >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
F=$dir/experts
"$T" partition --experts 2 --restarts 1 --max-iter 3 --seed 1 --out "$F" >/dev/null 2>&1
for k in 0 1; do
    "$T" train --partition "$F" --cluster $k --model tiny --steps 300 --batch 16 --seed $k \
        --data-dir "$dir/st" --out "$F/expert-$k.safetensors" >/dev/null 2>&1
done
"$T" up --nodes 8 --experts "$F" --dir "$dir/net" --json >"$dir/net.json" 2>/dev/null
peer=$("$PY" -c "import json; print(json.load(open('$dir/net.json'))['peer'])")
for i in 2 3; do kill "$(cat "$dir/net/node-$i/tesserad.pid")"; done
for i in 2 3; do
    while kill -0 "$(cat "$dir/net/node-$i/tesserad.pid")" 2>/dev/null; do sleep 0.1; done
    printf '\n[compute]\nprecision = f16\n' >>"$dir/net/node-$i/tesserad.ini"
done
"$T" up --dir "$dir/net" --restart >/dev/null
i=0
until "$T" status --peer "$peer" --network-key "$dir/net/network.key" --json >"$dir/st.json" 2>/dev/null &&
    [ "$("$PY" -c "
import json; s = json.load(open('$dir/st.json'))
live = {m['node_id'] for m in s['members'] if m['state'] == 'alive'}
print(len({a['node_id'] for a in s['adverts'] if a.get('valid') and a['node_id'] in live}))")" = 8 ]; do
    i=$((i + 1)); [ $i -lt 240 ] || { echo "bench_honest: the network did not come back" >&2; exit 1; }
    sleep 0.5
done
GEN="--n 8 --steps 4 --sampler heun --cfg 1.5 --policy uniform --select full"
: >"$OUT/honest.jsonl"
for g in $(seq 1 "$GENS"); do
    "$T" generate --peer "$peer" --network-key "$dir/net/network.key" --data-dir "$dir/cache" \
        $GEN --no-hedge --seed "$g" --verify 1 --json --out "$dir/g.png" >"$dir/g.json" 2>"$dir/g.err" || {
        echo "bench_honest: generation $g failed: $(tail -3 "$dir/g.err")" >&2
        exit 1
    }
    "$PY" - "$dir/g.json" "$g" >>"$OUT/honest.jsonl" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))["network"]
c = j["checks"]
print(json.dumps({"gen": int(sys.argv[2]), "requests": j["requests"], "checks": c["checked"],
                  "agreed": c["agreed"], "disagreed": c["disagreed"],
                  "wrong_answers": c["wrong_answers"], "undecided": c["undecided"],
                  "accusations_sent": c.get("accusations", {}).get("sent", 0),
                  "agreed_max_diff": c.get("agreed_max_diff", 0.0)}))
PYEOF
    [ $((g % 100)) -ne 0 ] || echo "bench_honest: $g of $GENS generations" >&2
done
for i in 0 1 2 3 4 5 6 7; do
    "$T" status --peer "$(cat "$dir/net/node-$i/data/listen.addr")" \
        --network-key "$dir/net/network.key" --json 2>/dev/null || echo '{}'
done | "$PY" -c "
import json, sys
print(json.dumps([{'node': i, 'bans': json.loads(l).get('bans')} for i, l in enumerate(sys.stdin)]))" \
    >"$OUT/bans.json"
"$PY" - "$OUT/honest.jsonl" "$OUT/bans.json" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
bans = json.load(open(sys.argv[2]))
s = lambda k: sum(r[k] for r in rows)
print("generations %d, requests %d, answers checked %d: agreed %d, disagreed %d, wrong answers "
      "caught %d, undecided %d, accusations sent %d; largest relative difference of agreeing "
      "answers across classes/precisions %.3g; bans on the 8 nodes: %d"
      % (len(rows), s("requests"), s("checks"), s("agreed"), s("disagreed"), s("wrong_answers"),
         s("undecided"), s("accusations_sent"), max(r["agreed_max_diff"] for r in rows),
         sum(len(b["bans"] or []) for b in bans)))
PYEOF
