#!/bin/sh
# test_network.sh TESSERA TESSERAD INJECT — eight real tesserad processes on loopback:
#   - they form one network from one bootstrap: every node sees all eight alive;
#   - kill -9 of one node: every other node declares it dead;
#   - restarted with no bootstrap (its address book only), it rejoins, alive everywhere at a
#     higher incarnation than the one it was declared dead at;
#   - a node with another network key never appears in anyone's view, and says why (a warning,
#     /healthz 503, status "alone: …"), and the seed logs the refused handshake (rate-limited);
#   - a node whose bootstrap does not answer is alone and says which address failed how;
#   - a forged alive claim (a valid seal, a signature by the wrong key) and a burst of garbage,
#     truncated and replayed datagrams change nothing, and the node counts them;
#   - SIGTERM: the node leaves (seen as "left" by the others) and exits 0.
# Every wait has a generous deadline (the machine may be loaded); nothing here asserts speed.
set -eu
T=${1:?usage: test_network.sh TESSERA TESSERAD INJECT}
D=${2:?usage: test_network.sh TESSERA TESSERAD INJECT}
INJECT=${3:?usage: test_network.sh TESSERA TESSERAD INJECT}
N=8
. "$(dirname "$0")/lib.sh"
logs="$dir/n*/d.log"
# the daemons' process ids are in pid.I (removed when a node is stopped on purpose)
cleanup_more() {
    for f in "$dir"/pid.*; do
        [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
    done
}

"$T" keygen --network-key --out "$dir/net.key" >/dev/null
"$T" keygen --network-key --out "$dir/other.key" >/dev/null

# start I [BOOTSTRAP] [NETKEY]: node I on a free port, fast gossip timings.
start() {
    i=$1
    mkdir -p "$dir/n$i"
    [ -f "$dir/n$i/id.key" ] || "$T" keygen --out "$dir/n$i/id.key" --json >"$dir/n$i/id.json"
    {
        node_section "n$i" "${2:-}" "${3:-}"
        echo "[gossip]"
        echo "probe_interval_ms = 200"
        echo "probe_timeout_ms = 100"
        echo "pushpull_interval_s = 5"
        echo "join_timeout_s = 2"
        echo "[metrics]"
        echo "listen = 127.0.0.1:0"
        echo "[log]"
        echo "level = debug"
        echo "file = $dir/n$i/d.log"
    } >"$dir/n$i/d.ini"
    rm -f "$dir/n$i/data/listen.addr"
    "$D" --config "$dir/n$i/d.ini" &
    echo $! >"$dir/pid.$i"
    wait_listen "$dir/n$i" "node $i"
}
addr() { cat "$dir/n$1/data/listen.addr"; }
node_id() { sed 's/.*"node_id":"\([0-9a-f]*\)".*/\1/' "$dir/n$1/id.json"; }
status() { "$T" status --peer "$(addr "$1")" --network-key "${2:-$dir/net.key}" --json; }

# check I PYTHON-EXPR: true when the expression holds on node I's status (s: the JSON; state(id)
# gives a member's state or None, inc(id) its incarnation).
check() {
    status "$1" >"$dir/s.json" 2>/dev/null || return 1
    "$PY" - "$dir/s.json" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
m = {x["node_id"]: x for x in s["members"]}
state = lambda i: m[i]["state"] if i in m else None
inc = lambda i: m[i]["incarnation"] if i in m else -1
alive = sum(1 for x in s["members"] if x["state"] == "alive")
sys.exit(0 if eval(sys.argv[2]) else 1)
PY
}
# wait_all WHAT PYTHON-EXPR [NODES]: until check holds on every listed node (default all live).
wait_all() {
    what=$1 expr=$2 nodes=${3:-$(seq 0 $((N - 1)))}
    k=0
    for i in $nodes; do
        while ! check "$i" "$expr"; do
            k=$((k + 1))
            [ $k -lt 120 ] || fail "$what: not on node $i after 60 s ($(cat "$dir/s.json" 2>/dev/null | head -c 600))"
            sleep 0.5
        done
    done
}

start 0
for i in $(seq 1 $((N - 1))); do start "$i" "$(addr 0)"; done
wait_all "all $N alive" "alive == $N"
echo "ok: $N nodes see all $N alive"

# tessera status: the table names every member; --watch --json answers again and again
"$T" status --peer "$(addr 3)" --network-key "$dir/net.key" >"$dir/table.txt" || fail "status"
grep -q "$N members known, $N alive" "$dir/table.txt" || fail "status table: $(head -3 "$dir/table.txt")"
for i in 0 7; do grep -q "$(node_id $i | cut -c1-16)" "$dir/table.txt" || fail "node $i not in the table"; done
timeout -s INT 3.5 "$T" status --peer "$(addr 3)" --network-key "$dir/net.key" --json --watch \
    --interval 1 >"$dir/watch.txt" 2>/dev/null || true
[ "$(grep -c '"members"' "$dir/watch.txt")" -ge 2 ] || fail "status --watch answered $(grep -c '"members"' "$dir/watch.txt") times in 3.5 s"
echo "ok: tessera status (table, --json --watch)"
# Ctrl-C while --watch is still trying to reach a node that is not there: it exits at once, 0
# (it once spun forever: the pending call's error shut the RPC endpoint down inside its own
# shutdown)
"$T" status --peer 127.0.0.1:9 --network-key "$dir/net.key" --json --watch --interval 1 \
    >"$dir/watch-dead.txt" 2>"$dir/watch-dead.err" &
wpid=$!
sleep 1.5
kill -INT "$wpid"
i=0
while kill -0 "$wpid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$wpid" 2>/dev/null; then
    kill -9 "$wpid"
    fail "status --watch did not exit 5 s after Ctrl-C (no node at the address)"
fi
rc=0
wait "$wpid" || rc=$?
[ "$rc" = 0 ] || fail "status --watch, Ctrl-C while connecting: exit $rc, $(cat "$dir/watch-dead.err")"
echo "ok: Ctrl-C ends status --watch while it is still connecting"

# A node of another network, bootstrapping from node 0: never seen, sees nobody.
start 8 "$(addr 0)" "$dir/other.key"
sleep 3
stranger=$(node_id 8)
wait_all "the stranger is unknown" "state('$stranger') is None and alive == $N"
status 8 "$dir/other.key" >"$dir/s8.json" || fail "the stranger does not answer its own network"
"$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if len(s["members"]) == 1 else 1)' \
    "$dir/s8.json" || fail "the stranger learned members of a network it has no key for"
# ... and says why: a WARN with the likely cause, /healthz 503, status "alone: …"; the seed logs
# the refused handshake with the stranger's address; a node of the network answers ok.
healthz() { # healthz I: "CODE BODY" of node I's /healthz
    port=$(sed -n 's|.*metrics on http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$dir/n$1/d.log" | head -n 1)
    "$PY" - "$port" <<'PY'
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen("http://127.0.0.1:%s/healthz" % sys.argv[1], timeout=10)
    print(r.status, r.read().decode().strip())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())
PY
}
k=0
until healthz 8 | grep -q "^503 alone: .*another network key"; do
    k=$((k + 1))
    [ $k -lt 60 ] || fail "the stranger's /healthz: $(healthz 8)"
    sleep 0.5
done
grep -q "warn  health: .*another network key" "$dir/n8/d.log" || fail "the stranger logged no warning"
grep -q "warn  health: refused a handshake from 127.0.0.1.*another network key" "$dir/n0/d.log" ||
    fail "the seed did not log the refused handshake"
[ "$(grep -c "refused a handshake from" "$dir/n0/d.log")" -le 2 ] ||
    fail "the seed's refusals are not rate-limited: $(grep -c "refused a handshake from" "$dir/n0/d.log") lines"
status 8 "$dir/other.key" >"$dir/s8.json"
"$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s["health"].startswith("alone: ") else 1)' \
    "$dir/s8.json" || fail "status does not show the stranger alone: $(cat "$dir/s8.json" | head -c 300)"
[ "$(healthz 3)" = "200 ok" ] || fail "a healthy node's /healthz: $(healthz 3)"
status 3 | "$PY" -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["health"] == "ok" else 1)' ||
    fail "a healthy node's status health is not ok"
kill "$(cat "$dir/pid.8")"; rm -f "$dir/pid.8"
echo "ok: a node without the network key never appears, and it and the seed say why"

# A node whose bootstrap does not answer: alone, and says which address failed how.
start 9 127.0.0.1:1
k=0
until healthz 9 | grep -q "^503 alone: .*cannot connect to 127.0.0.1:1"; do
    k=$((k + 1))
    [ $k -lt 60 ] || fail "an unreachable bootstrap's /healthz: $(healthz 9)"
    sleep 0.5
done
grep -q "warn  health: alone: " "$dir/n9/d.log" || fail "no 'alone' warning"
kill "$(cat "$dir/pid.9")"; rm -f "$dir/pid.9"
echo "ok: a node whose bootstrap does not answer is alone, and says why"

# Forged and garbage datagrams at node 1.
"$INJECT" --to "$(addr 1)" --network-key "$dir/net.key" --forge-alive --garbage 500 >"$dir/inject.txt" ||
    fail "the injector failed: $(cat "$dir/inject.txt")"
forged=$(sed -n 's/^forged node \([0-9a-f]*\)$/\1/p' "$dir/inject.txt")
[ -n "$forged" ] || fail "the injector named no forged node"
sleep 2
wait_all "forged claims ignored" "state('$forged') is None and alive == $N"
kill -0 "$(cat "$dir/pid.1")" || fail "node 1 died from garbage datagrams"
echo "ok: a forged alive and 500 garbage datagrams change nothing"

# kill -9 node 5: dead everywhere; restarted without bootstrap: alive again, higher incarnation.
victim=$(node_id 5)
kill -9 "$(cat "$dir/pid.5")"; rm -f "$dir/pid.5"
others="0 1 2 3 4 6 7"
wait_all "node 5 declared dead" "state('$victim') == 'dead'" "$others"
dead_inc=$("$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); print([m["incarnation"] for m in s["members"] if m["node_id"] == sys.argv[2]][0])' "$dir/s.json" "$victim")
echo "ok: kill -9 → declared dead everywhere (at incarnation $dead_inc)"
start 5
wait_all "node 5 alive again" "state('$victim') == 'alive' and inc('$victim') > $dead_inc and alive == $N"
echo "ok: restarted from its address book, alive again at a higher incarnation"

# SIGTERM: a graceful leave, exit 0.
leaver=$(node_id 7)
kill -TERM "$(cat "$dir/pid.7")"
rc=0
wait "$(cat "$dir/pid.7")" || rc=$?
rm -f "$dir/pid.7"
[ $rc -eq 0 ] || fail "SIGTERM: exit $rc, want 0"
wait_all "node 7 left" "state('$leaver') == 'left'" "0 1 2 3 4 5 6"
echo "ok: SIGTERM leaves the network and exits 0"
