#!/bin/sh
# test_verify.sh TESSERA — signed answers and spot-checks against a real network (`tessera up`,
# 6 daemons, 2 experts trained for 2 steps: 3 replicas of each):
#   - every answer carries a valid signature of the node asked (an unsigned or wrongly signed one
#     would count as garbage): an honest network at --verify 1 checks every answer, all agree,
#     and the image equals --local's byte for byte;
#   - a replica of each expert restarted as a liar ([fault] lie_bias = 1e-3 on one, lie_noise =
#     1e-2 at lie_rate 0.5 on the other): at --verify 1 both are caught (named in the summary,
#     never asked again) and the image still equals --local's, byte for byte;
#   - --verify 0: nothing is checked.
# Waits have generous deadlines; nothing here asserts speed.
set -eu
T=${1:?usage: test_verify.sh TESSERA}
. "$(dirname "$0")/lib.sh"
nets="$dir/net" logs="$dir/err*.txt" log_lines=20

F=$dir/experts
run "$T" partition --experts 2 --restarts 1 --max-iter 5 --seed 1 --out "$F"
for k in 0 1; do
    run "$T" train --partition "$F" --cluster $k --model tiny --steps 2 --batch 8 --seed $k \
        --data-dir "$dir/st" --out "$F/expert-$k.safetensors"
done
GEN="--n 16 --steps 4 --sampler heun --cfg 1.5 --seed 3 --policy uniform --select full"
run "$T" generate --local "$F" $GEN --out "$dir/local.png"

"$T" up --nodes 6 --experts "$F" --dir "$dir/net" --json >"$dir/net.json" 2>"$dir/err-up.txt" ||
    fail "tessera up"
peer=$(json_get "$dir/net.json" "j['peer']")
netgen() {
    name=$1
    shift
    "$T" generate --peer "$peer" --network-key "$dir/net/network.key" --data-dir "$dir/cache" \
        --json "$@" >"$dir/$name.json" 2>"$dir/err-$name.txt"
}
chk() { json_get "$dir/$1.json" "j['network']['checks']['$2']"; }

netgen honest $GEN --verify 1 --no-hedge --out "$dir/honest.png" || fail "generate --verify 1"
cmp -s "$dir/honest.png" "$dir/local.png" || fail "honest network: the image differs from --local's"
[ "$(chk honest checked)" -gt 0 ] && [ "$(chk honest checked)" = "$(chk honest agreed)" ] &&
    [ "$(chk honest wrong_answers)" = 0 ] && [ "$(json_get "$dir/honest.json" "j['network']['garbage']")" = 0 ] ||
    fail "honest network: $(json_get "$dir/honest.json" "j['network']['checks']")"
echo "ok: an honest network: $(chk honest checked) answers checked, every signature valid, all agree, the image = --local"

# node 2 hosts expert 0, node 3 expert 1 (node i hosts expert i mod 2; node 0, the entry, stays
# as it is): each becomes a liar
liar_addr() { cat "$dir/net/node-$1/data/listen.addr"; }
for i in 2 3; do
    kill "$(cat "$dir/net/node-$i/tesserad.pid")"
done
for i in 2 3; do
    n=0
    while kill -0 "$(cat "$dir/net/node-$i/tesserad.pid")" 2>/dev/null; do
        n=$((n + 1)); [ $n -lt 300 ] || fail "node $i did not stop"; sleep 0.1
    done
done
printf '\n[fault]\nlie_bias = 0.001\n' >>"$dir/net/node-2/tesserad.ini"
printf '\n[fault]\nlie_noise = 0.01\nlie_rate = 0.5\n' >>"$dir/net/node-3/tesserad.ini"
"$T" up --dir "$dir/net" --restart >"$dir/restart.txt" 2>"$dir/err-restart.txt" || fail "up --restart"
# wait until the entry node sees six live members advertising a valid expert again
live_ads() {
    "$PY" - "$dir/st.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
live = {m["node_id"] for m in s["members"] if m["state"] == "alive"}
print(len({a["node_id"] for a in s["adverts"] if a.get("valid") and a["node_id"] in live}))
PYEOF
}
n=0
until "$T" status --peer "$peer" --network-key "$dir/net/network.key" --json >"$dir/st.json" 2>/dev/null &&
    [ "$(live_ads)" = 6 ]; do
    n=$((n + 1)); [ $n -lt 120 ] || fail "the liars' adverts did not come back"; sleep 0.5
done
l0=$(liar_addr 2) l1=$(liar_addr 3)

netgen liars $GEN --verify 1 --no-hedge --out "$dir/liars.png" || fail "generate --verify 1 with liars"
cmp -s "$dir/liars.png" "$dir/local.png" || fail "with liars: the image differs from --local's"
caught=$(json_get "$dir/liars.json" "' '.join(sorted(c['addr'] for c in j['network']['checks']['caught']))")
want=$(printf '%s\n%s\n' "$l0" "$l1" | sort | tr '\n' ' ' | sed 's/ $//')
[ "$caught" = "$want" ] || fail "caught '$caught', the liars are '$want': $(json_get "$dir/liars.json" "j['network']['checks']")"
grep -q "LIAR: $l0" "$dir/err-liars.txt" || fail "the summary does not name the liar $l0"
echo "ok: two liars (a bias of 1e-3, noise on half the answers) caught and named; the image = --local"

netgen off $GEN --verify 0 --no-hedge --out "$dir/off.png" || fail "generate --verify 0"
[ "$(chk off checked)" = 0 ] || fail "--verify 0 checked answers"
echo "ok: --verify 0 checks nothing"
