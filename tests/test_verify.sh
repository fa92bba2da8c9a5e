#!/bin/sh
# test_verify.sh TESSERA ACCUSE_TOOL — signed answers, spot-checks and accusations against a real
# network (`tessera up`, 6 daemons, 2 experts trained for 2 steps: 3 replicas of each):
#   - every answer carries a valid signature of the node asked (an unsigned or wrongly signed one
#     would count as garbage): an honest network at --verify 1 checks every answer, all agree,
#     and the image equals --local's byte for byte;
#   - a replica of each expert restarted as a liar ([fault] lie_bias = 1e-3 on one, lie_noise =
#     1e-2 at lie_rate 0.5 on the other): at --verify 1 both are caught (named in the summary,
#     never asked again) and the image still equals --local's, byte for byte;
#   - accusations: the client sends the evidence of each lie to the other replicas; every honest
#     node ends up banning both liars (replicas judge with the weights they hold, the others fetch
#     them), no longer passes on their adverts, so a generation that checks nothing (--verify 0)
#     equals --local again;
#   - forged accusations of an honest node (its right answer; its answer changed under its
#     signature; a flipped signature bit; sent to the accused itself) are refused, and it is
#     banned nowhere;
#   - a liar that earns trust first ([fault] lie_after) and lies unchecked is caught, the samples
#     its lies touched are recomputed: the image equals --local's;
#   - vouches are kept in the client's store: a second run starts with the replicas vouched for
#     and checks none of their first answers, --vouch-ttl 0 forgets them; a replica vouched for
#     at F32 that comes back at f16 is checked again from its first answer;
#   - an f16 replica beside F32 ones is never called a liar.
# Waits have generous deadlines; nothing here asserts speed.
set -eu
T=${1:?usage: test_verify.sh TESSERA ACCUSE_TOOL}
A=${2:?usage: test_verify.sh TESSERA ACCUSE_TOOL}
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

# vouches kept in the store: the next run starts with every replica the honest run vouched for
# (the 6, on their device class and precision) and, at a rate that draws nothing, checks none;
# with --vouch-ttl 0 it remembers nothing and checks each replica's first answers again
netgen again $GEN --verify 1e-9 --no-hedge --out "$dir/again.png" || fail "generate again"
[ "$(chk again remembered)" = 6 ] && [ "$(chk again checked)" = 0 ] ||
    fail "the honest run's vouches were not kept: $(json_get "$dir/again.json" "j['network']['checks']")"
cmp -s "$dir/again.png" "$dir/local.png" || fail "vouched run: the image differs from --local's"
netgen fresh $GEN --verify 1e-9 --vouch-ttl 0 --no-hedge --out "$dir/fresh.png" ||
    fail "generate --vouch-ttl 0"
[ "$(chk fresh remembered)" = 0 ] && [ "$(chk fresh checked)" -gt 0 ] ||
    fail "--vouch-ttl 0 remembered or checked nothing: $(json_get "$dir/fresh.json" "j['network']['checks']")"
echo "ok: vouches kept between runs: 6 replicas remembered, 0 first checks (--vouch-ttl 0: $(chk fresh checked))"

# node 2 hosts expert 0, node 3 expert 1 (node i hosts expert i mod 2; node 0, the entry, stays
# as it is): each becomes a liar
liar_addr() { cat "$dir/net/node-$1/data/listen.addr"; }
stop_node() { # stop_node I...: SIGTERM, and wait until each has stopped
    for i in "$@"; do kill "$(cat "$dir/net/node-$i/tesserad.pid")"; done
    for i in "$@"; do
        n=0
        while kill -0 "$(cat "$dir/net/node-$i/tesserad.pid")" 2>/dev/null; do
            n=$((n + 1)); [ $n -lt 300 ] || fail "node $i did not stop"; sleep 0.1
        done
    done
}
stop_node 2 3
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

acc=$(json_get "$dir/liars.json" "j['network']['checks']['accusations']")
[ "$(json_get "$dir/liars.json" "j['network']['checks']['accusations']['upheld']")" -gt 0 ] ||
    fail "no accusation upheld: $acc"
grep -q "^accusations: " "$dir/err-liars.txt" || fail "the summary does not count the accusations"
echo "ok: the client accused both liars: $acc"

# every honest node bans both liars (expert 0's replicas are nodes 0, 2, 4; expert 1's 1, 3, 5)
id_of() { json_get "$dir/st.json" "[m['node_id'] for m in j['members'] if m['addr'] == '$1'][0]"; }
i0=$(id_of "$l0") i1=$(id_of "$l1")
want_bans=$(printf '%s\n%s\n' "$i0" "$i1" | sort | tr '\n' ' ' | sed 's/ $//')
node_status() { # node_status I: node I's status into st-I.json
    "$T" status --peer "$(cat "$dir/net/node-$1/data/listen.addr")" \
        --network-key "$dir/net/network.key" --json >"$dir/st-$1.json" 2>/dev/null
}
bans_of() { json_get "$dir/st-$1.json" "' '.join(sorted(b['node_id'] for b in j['bans']))"; }
for i in 0 1 4 5; do
    n=0
    until node_status $i && [ "$(bans_of $i)" = "$want_bans" ]; do
        n=$((n + 1))
        [ $n -lt 120 ] || fail "node $i bans '$(bans_of $i)', not both liars '$want_bans'"
        sleep 0.5
    done
done
advertised=$(json_get "$dir/st-0.json" "' '.join(a['node_id'] for a in j['adverts'])")
case "$advertised" in *"$i0"* | *"$i1"*) fail "node 0 still passes on a liar's advert" ;; esac
"$T" status --peer "$peer" --network-key "$dir/net/network.key" >"$dir/st.txt" 2>/dev/null ||
    fail "tessera status"
grep -q "^BANNED: " "$dir/st.txt" || fail "tessera status does not show the bans"
# the nodes of expert 1 do not hold expert 0's weights (nor those of 0 expert 1's): they fetch them
grep -qs "fetching an expert's weights" "$dir"/net/node-*/tesserad.log ||
    fail "no node fetched an expert's weights to judge an accusation"
echo "ok: every honest node bans both liars (judged by recomputation, weights fetched where missing) and passes on no advert of theirs"

netgen off $GEN --verify 0 --no-hedge --out "$dir/off.png" || fail "generate --verify 0"
[ "$(chk off checked)" = 0 ] || fail "--verify 0 checked answers"
cmp -s "$dir/off.png" "$dir/local.png" || fail "--verify 0 after the bans: the image differs from --local's"
echo "ok: --verify 0 checks nothing, and with the liars banned the image = --local"

# forged accusations of node 0 (honest), judged by node 4 (a replica of the same expert)
n0=$(cat "$dir/net/node-0/data/listen.addr") n4=$(cat "$dir/net/node-4/data/listen.addr")
eh=$(json_get "$dir/st-0.json" "[a['weights_hash'] for a in j['adverts'] if a['node_id'] == j['node_id']][0]")
side=$(json_get "$dir/st-0.json" "[a['model']['input_size'] for a in j['adverts'] if a['node_id'] == j['node_id']][0]")
forged() { # forged MODE REASON-REGEX JUDGED
    "$A" "$n0" "$n4" "$dir/net/network.key" "$eh" 1 "$side" "$1" >"$dir/acc-$1.json" \
        2>"$dir/err-acc-$1.txt" || fail "accuse_tool $1: $(cat "$dir/err-acc-$1.txt")"
    [ "$(json_get "$dir/acc-$1.json" "j['upheld']")" = False ] ||
        fail "a forged accusation ($1) was upheld: $(cat "$dir/acc-$1.json")"
    grep -qE "$2" "$dir/acc-$1.json" && [ "$(json_get "$dir/acc-$1.json" "j['judged']")" = "$3" ] ||
        fail "forged ($1): $(cat "$dir/acc-$1.json")"
}
forged honest "its answer is right" True
forged tampered "signature is not" True
forged wrongsig "signature is not" True
forged accused "is the accused" False
i_honest=$(json_get "$dir/st-0.json" "j['node_id']")
for i in 0 1 4 5; do
    node_status $i || fail "status of node $i"
    case "$(bans_of $i)" in *"$i_honest"*) fail "node $i banned the honest node 0" ;; esac
done
echo "ok: forged accusations (a right answer, a changed answer, a bad signature, the accused as judge) refused; node 0 banned nowhere"

# a liar that earns trust first ([fault] lie_after: its first answers are honest, so it is
# vouched for and then checked only at the rate): node 4 (expert 0). Its lies before the catch
# slip into the image; the client recomputes the samples they touched, with the liar banned, and
# the image equals --local's again. The client holds the experts' weights (`tessera pull`), which
# decide a disagreement (expert 0's third replica, node 2, is banned).
l4=$(cat "$dir/net/node-4/data/listen.addr")
stop_node 4
printf '\n[fault]\nlie_noise = 0.01\nlie_after = 2\n' >>"$dir/net/node-4/tesserad.ini"
"$T" up --dir "$dir/net" --restart >"$dir/restart4.txt" 2>"$dir/err-restart4.txt" || fail "up --restart node 4"
l4=$(cat "$dir/net/node-4/data/listen.addr")
n=0
until "$T" status --peer "$peer" --network-key "$dir/net/network.key" --json >"$dir/st.json" 2>/dev/null &&
    [ "$(live_ads)" = 4 ]; do
    n=$((n + 1)); [ $n -lt 120 ] || fail "node 4's advert did not come back"; sleep 0.5
done
"$T" pull --all --peer "$peer" --network-key "$dir/net/network.key" --data-dir "$dir/cache" \
    >"$dir/pull.txt" 2>&1 || fail "tessera pull: $(cat "$dir/pull.txt")"
netgen late $GEN --verify 0.3 --no-hedge --out "$dir/late.png" || fail "generate with a late liar"
cmp -s "$dir/late.png" "$dir/local.png" ||
    fail "a late liar: the image differs from --local's: $(json_get "$dir/late.json" "j['network']['checks']")"
[ "$(json_get "$dir/late.json" "' '.join(c['addr'] for c in j['network']['checks']['caught'])")" = "$l4" ] ||
    fail "the late liar $l4 was not caught: $(json_get "$dir/late.json" "j['network']['checks']")"
echo "ok: a liar that earned trust first caught; $(json_get "$dir/late.json" "j['network']['checks']['repaired_samples']") samples its unchecked lies touched recomputed; the image = --local"

# replicas of mixed precision: node 5 (expert 1) restarted at f16. Its answers differ from the
# F32 replicas' within the tolerance: checked against them at --verify 1, none is called a lie,
# no accusation is sent, nobody bans it.
stop_node 5
printf '\n[compute]\nprecision = f16\n' >>"$dir/net/node-5/tesserad.ini"
"$T" up --dir "$dir/net" --restart >"$dir/restart5.txt" 2>"$dir/err-restart5.txt" || fail "up --restart node 5"
n=0
until "$T" status --peer "$peer" --network-key "$dir/net/network.key" --json >"$dir/st.json" 2>/dev/null &&
    [ "$(live_ads)" = 3 ] && [ "$(json_get "$dir/st.json" "sum(1 for a in j['adverts'] if a.get('valid') and a['node_id'] == '$(id_of "$(cat "$dir/net/node-5/data/listen.addr")")')")" = 1 ]; do
    n=$((n + 1)); [ $n -lt 120 ] || fail "node 5's advert did not come back"; sleep 0.5
done
# vouched for at F32 by the runs above, node 5 now answers at f16: not what was vouched for, so
# its answers are checked from the first, even at a rate that draws nothing
netgen mixed0 $GEN --verify 1e-9 --no-hedge --out "$dir/mixed0.png" || fail "generate with an f16 replica"
[ "$(chk mixed0 checked)" -gt 0 ] ||
    fail "the f16 replica was trusted on its F32 vouch: $(json_get "$dir/mixed0.json" "j['network']['checks']")"
netgen mixed $GEN --verify 1 --no-hedge --out "$dir/mixed.png" || fail "generate with an f16 replica"
[ "$(chk mixed wrong_answers)" = 0 ] && [ "$(json_get "$dir/mixed.json" "j['network']['checks']['accusations']['sent']")" = 0 ] ||
    fail "an honest f16 replica was called a liar: $(json_get "$dir/mixed.json" "j['network']['checks']")"
grep -q "f16\|F16" "$dir/net/node-5/tesserad.log" || fail "node 5 does not serve at f16"
echo "ok: an f16 replica beside F32 ones: $(chk mixed checked) answers checked, none called a lie (largest difference $(chk mixed agreed_max_diff))"
