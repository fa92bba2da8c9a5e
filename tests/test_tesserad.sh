#!/bin/sh
# test_tesserad.sh TESSERA TESSERAD EXPERTS — the daemon as a process: --check-config accepts a
# valid config and reports the node id that `tessera keygen` printed; it refuses a key file others
# can read and a config with a typo, exit 1 with the reason; it opens every file the config names
# (EXPERTS: experts/demo) and refuses a missing or truncated weights file, a misspelt partition
# path and a router that is not one; a running daemon logs JSON lines, reopens
# its log file on SIGHUP and stops cleanly (exit 0) on SIGTERM.
set -eu
T=${1:?usage: test_tesserad.sh TESSERA TESSERAD EXPERTS}
D=${2:?usage: test_tesserad.sh TESSERA TESSERAD EXPERTS}
E=${3:?usage: test_tesserad.sh TESSERA TESSERAD EXPERTS}
. "$(dirname "$0")/lib.sh"

id=$("$T" keygen --out "$dir/id.key" --json | sed 's/.*"node_id_short":"\([0-9a-f]*\)".*/\1/')
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
level = debug
format = json
file = $dir/d.log
INI

out=$("$D" --config "$dir/d.ini" --check-config) || fail "--check-config rejected a valid config"
echo "$out" | grep -q "node id *$id" || fail "--check-config shows another node id than keygen ($id): $out"
[ ! -e "$dir/data" ] || fail "--check-config created the data directory"

chmod 644 "$dir/id.key"
rc=0
"$D" --config "$dir/d.ini" --check-config >/dev/null 2>"$dir/err.txt" || rc=$?
[ $rc -eq 1 ] || fail "--check-config with a 0644 key: exit $rc, want 1"
grep -q "chmod 600" "$dir/err.txt" || fail "no chmod hint: $(cat "$dir/err.txt")"
chmod 600 "$dir/id.key"

sed 's/^level = debug/levle = debug/' "$dir/d.ini" >"$dir/typo.ini"
rc=0
"$D" --config "$dir/typo.ini" --check-config >/dev/null 2>"$dir/err.txt" || rc=$?
[ $rc -eq 1 ] || fail "--check-config with a typo: exit $rc, want 1"
grep -q "typo.ini:9: \[log\] levle: unknown key" "$dir/err.txt" || fail "typo message: $(cat "$dir/err.txt")"

# --check-config opens and validates every file the config names
cp "$E/partition.safetensors" "$E/expert-1.safetensors" "$E/router.safetensors" "$dir/"
with_expert() { # with_expert WEIGHTS PARTITION [ROUTER]: the valid config plus [expert]
    cp "$dir/d.ini" "$dir/ex.ini"
    printf '\n[expert]\nmode = host\nweights = %s\npartition = %s\n' "$1" "$2" >>"$dir/ex.ini"
    if [ -n "${3:-}" ]; then echo "router = $3" >>"$dir/ex.ini"; fi
}
check_refuses() { # check_refuses WHAT PATTERN: --check-config of ex.ini exits 1 saying PATTERN
    rc=0
    "$D" --config "$dir/ex.ini" --check-config >/dev/null 2>"$dir/err.txt" || rc=$?
    [ $rc -eq 1 ] || fail "--check-config with $1: exit $rc, want 1"
    grep -q "$2" "$dir/err.txt" || fail "--check-config with $1: $(cat "$dir/err.txt")"
    [ ! -e "$dir/data" ] || fail "--check-config with $1 created the data directory"
}
with_expert "$dir/expert-1.safetensors" "$dir/partition.safetensors" "$dir/router.safetensors"
out=$("$D" --config "$dir/ex.ini" --check-config) || fail "--check-config refused a good expert"
echo "$out" | grep -q "weights .*expert-1.safetensors: cluster 1 of 4, every tensor loads" ||
    fail "no line for the weights: $out"
echo "$out" | grep -q "router .*router.safetensors: 4 clusters" || fail "no line for the router: $out"
with_expert "$dir/missing.safetensors" "$dir/partition.safetensors"
check_refuses "a missing weights file" "\[expert\] weights .*missing.safetensors"
with_expert "$dir/expert-1.safetensors" "$dir/partiton.safetensors"
check_refuses "a misspelt partition path" "\[expert\] partition .*partiton.safetensors"
head -c $(($(wc -c <"$dir/expert-1.safetensors") / 2)) "$dir/expert-1.safetensors" >"$dir/cut.safetensors"
with_expert "$dir/cut.safetensors" "$dir/partition.safetensors"
check_refuses "a truncated weights file" "\[expert\] weights .*cut.safetensors"
with_expert "$dir/expert-1.safetensors" "$dir/partition.safetensors" "$dir/expert-1.safetensors"
check_refuses "weights named as the router" "\[expert\] router"
with_expert "0123456789abcdef" "$dir/partition.safetensors"
check_refuses "a hash with no store" "no store at"
echo "ok: --check-config opens every file: missing, misspelt, truncated and mismatched refused"

rc=0
"$D" --config "$dir/missing.ini" >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] || fail "a missing config: exit $rc, want 2"

"$D" --config "$dir/d.ini" 2>"$dir/stderr.txt" &
pid=$!
pids=$pid
wait_log "$dir/d.log" '"msg":"ready"' 60
grep -q "\"level\":\"info\",\"component\":\"daemon\",\"msg\":\"tesserad .*node $id" "$dir/d.log" ||
    fail "the start line lacks the node id: $(cat "$dir/d.log")"
"$PY" -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$dir/d.log" ||
    fail "a log line is not JSON"
mv "$dir/d.log" "$dir/d.log.1"
kill -HUP "$pid"
wait_log "$dir/d.log" "log file reopened" 60
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pids=
[ $rc -eq 0 ] || fail "SIGTERM: exit $rc, want 0 ($(cat "$dir/stderr.txt"))"
grep -q '"msg":"stopped"' "$dir/d.log" || fail "no 'stopped' line"
if grep -q "$(od -An -tx1 -j16 -N8 "$dir/id.key" | tr -d ' \n')" "$dir/d.log" "$dir/d.log.1"; then
    fail "the log holds the identity's secret bytes"
fi
echo "ok: tesserad --check-config, JSON logs, SIGHUP reopen, SIGTERM"
