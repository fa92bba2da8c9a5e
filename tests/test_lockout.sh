#!/bin/sh
# test_lockout.sh TESSERA TESSERAD — no key, no lock-out: while a peer without the
# network key holds 400 half-open connections from 50 loopback addresses (8 each, the per-address
# limit) plus 8 from 127.0.0.1 — renewing each one the node closes — a new `tessera status` from
# 127.0.0.1 answers within 1 s, every time; the node's resident memory stays within 32 MiB of
# where it started; the node counts the half-open connections it evicted; and it still serves
# once the attack ends. (tests/ts_half_open.py is the attacker.)
set -eu
T=${1:?usage: test_lockout.sh TESSERA TESSERAD}
D=${2:?usage: test_lockout.sh TESSERA TESSERAD}
HERE=$(dirname "$0")
. "$HERE/lib.sh"
logs="$dir/d.log" log_lines=20
rss_kib() { sed -n 's/^VmRSS:[^0-9]*\([0-9]*\).*/\1/p' "/proc/$pid/status"; }

"$T" keygen --out "$dir/id.key" >/dev/null
"$T" keygen --network-key --out "$dir/net.key" >/dev/null
cat >"$dir/d.ini" <<INI
[node]
identity = $dir/id.key
network_key = $dir/net.key
data_dir = $dir/data
listen = 127.0.0.1:0
[metrics]
listen = 127.0.0.1:0
[log]
file = $dir/d.log
INI
"$D" --config "$dir/d.ini" &
pid=$!
pids=$pid
i=0
while [ ! -s "$dir/data/metrics.url" ]; do
    i=$((i + 1))
    [ $i -lt 300 ] || fail "the node did not start"
    sleep 0.1
done
addr=$(cat "$dir/data/listen.addr")
"$T" status --peer "$addr" --network-key "$dir/net.key" >/dev/null || fail "status before"
rss0=$(rss_kib)

"$PY" "$HERE/ts_half_open.py" "${addr##*:}" 8 50 20 "$dir/ready" 0.2 >"$dir/attack.txt" &
hp=$!
pids="$pids $hp"
i=0
while [ ! -e "$dir/ready" ]; do
    i=$((i + 1))
    [ $i -lt 300 ] || fail "the attacker did not start"
    sleep 0.1
done
sleep 2 # every slot is taken by now
for n in 1 2 3 4 5; do
    s=$(date +%s%N)
    "$T" status --peer "$addr" --network-key "$dir/net.key" >/dev/null 2>"$dir/err.txt" ||
        fail "status $n under attack: $(cat "$dir/err.txt")"
    ms=$((($(date +%s%N) - s) / 1000000))
    [ "$ms" -lt 1000 ] || fail "status $n under attack took $ms ms (want < 1000)"
    echo "status $n under attack: $ms ms"
done
rss1=$(rss_kib)
[ $((rss1 - rss0)) -lt 32768 ] || fail "resident memory grew from $rss0 to $rss1 KiB under attack"
"$PY" - "$(cat "$dir/data/metrics.url")" <<'PY' || fail "no eviction counted"
import sys, urllib.request
body = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
v = [float(l.split()[-1]) for l in body.splitlines()
     if l.startswith('tessera_connection_closes_total{reason="evicted"}')]
print("evicted:", v)
sys.exit(0 if v and v[0] > 0 else 1)
PY
kill "$hp"; wait "$hp" 2>/dev/null || true; pids=$pid
kill -0 "$pid" || fail "the node died"
"$T" status --peer "$addr" --network-key "$dir/net.key" >/dev/null || fail "status after"
echo "ok: 408 half-open connections held without the key lock nobody out (RSS $rss0 -> $rss1 KiB)"
