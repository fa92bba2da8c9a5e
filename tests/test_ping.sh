#!/usr/bin/env bash
# test_ping.sh — `tessera ping` against a real ts_echo_server on loopback: a good run (text and
# JSON, the node id the handshake proved equals the server's), and the failures an operator
# meets, each with its sentence: a wrong network key, a refused connection, a peer that never
# answers (timeout), a bad identity file.
#
# Usage: test_ping.sh TESSERA TS_ECHO_SERVER
set -euo pipefail
tessera="$1"
server="$2"
. "$(dirname "$0")/lib.sh"

"$tessera" keygen --out "$dir/s.key" >/dev/null
"$tessera" keygen --out "$dir/c.key" >/dev/null
"$tessera" keygen --out "$dir/n.key" --network-key >/dev/null
"$tessera" keygen --out "$dir/other.key" --network-key >/dev/null

# Start the server and wait (without sleeping blindly) for its "listening" line.
"$server" --listen 127.0.0.1:0 --identity "$dir/s.key" --network-key "$dir/n.key" \
    >"$dir/server.out" 2>"$dir/server.err" &
server_pid=$!
pids=$server_pid
for _ in $(seq 600); do
    grep -q '^listening ' "$dir/server.out" 2>/dev/null && break
    kill -0 "$server_pid" 2>/dev/null || fail "the server exited: $(cat "$dir/server.err")"
    sleep 0.1
done
line="$(head -n1 "$dir/server.out")"
[[ "$line" =~ ^listening\ 127\.0\.0\.1:([0-9]+)\ node\ ([0-9a-f]{64})$ ]] || fail "bad line: $line"
port="${BASH_REMATCH[1]}"
server_id="${BASH_REMATCH[2]}"
addr="127.0.0.1:$port"

# A good run, text.
out="$("$tessera" ping "$addr" --identity "$dir/c.key" --network-key "$dir/n.key" --count 5)"
grep -q "node ${server_id:0:16}, connect + handshake" <<<"$out" || fail "text output: $out"
grep -q "^5 round trips: min .* ms, p50 .* ms, p99 .* ms, max .* ms$" <<<"$out" || fail "text: $out"

# A good run, JSON: the node id is the server's, every sample is a positive number.
json="$("$tessera" ping "$addr" --identity "$dir/c.key" --network-key "$dir/n.key" --count 7 --json)"
"$PY" - "$json" "$server_id" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
assert j["node_id"] == sys.argv[2], j
assert j["node_id_short"] == sys.argv[2][:16], j
assert j["count"] == 7 and len(j["samples_ms"]) == 7, j
assert all(s > 0 for s in j["samples_ms"]), j
r = j["rtt_ms"]
assert 0 < r["min"] <= r["p50"] <= r["p99"] <= r["max"], r
assert r["min"] == min(j["samples_ms"]) and r["max"] == max(j["samples_ms"]), j
assert j["handshake_ms"] > 0, j
PY

# expect_fail WHAT PATTERN ARGS...: exit 1 and a sentence on stderr matching PATTERN.
expect_fail() {
    local what="$1" pattern="$2"
    shift 2
    set +e
    "$tessera" ping "$@" >"$dir/out" 2>"$dir/err"
    local rc=$?
    set -e
    [[ $rc -eq 1 ]] || fail "$what: exit $rc, want 1 ($(cat "$dir/err"))"
    grep -Eq "$pattern" "$dir/err" || fail "$what: stderr '$(cat "$dir/err")' lacks /$pattern/"
    [[ ! -s "$dir/out" ]] || fail "$what: printed on stdout: $(cat "$dir/out")"
}

expect_fail "wrong network key" "wrong network key\?" \
    "$addr" --identity "$dir/c.key" --network-key "$dir/other.key"
expect_fail "bad identity file" "identity file" \
    "$addr" --identity "$dir/n.key" --network-key "$dir/n.key"
expect_fail "missing identity file" "identity file" \
    "$addr" --identity "$dir/none.key" --network-key "$dir/n.key"

# A listener that accepts and never speaks: the handshake times out.
"$PY" -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
conns = []
while True:
    c, _ = s.accept(); conns.append(c)
' >"$dir/silent.out" &
pids="$pids $!"
for _ in $(seq 600); do [[ -s "$dir/silent.out" ]] && break; sleep 0.1; done
silent_port="$(head -n1 "$dir/silent.out")"
expect_fail "silent peer" "did not complete the handshake within 300 ms" \
    "127.0.0.1:$silent_port" --identity "$dir/c.key" --network-key "$dir/n.key" --timeout-ms 300

# The server stops: its port refuses.
kill "$server_pid"
wait "$server_pid" 2>/dev/null || true
grep -q "^closed handshake 1$" "$dir/server.err" || fail "server counters: $(cat "$dir/server.err")"
expect_fail "refused" "cannot connect to $addr: connection refused" \
    "$addr" --identity "$dir/c.key" --network-key "$dir/n.key"
echo "test_ping: ok"
