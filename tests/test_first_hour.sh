#!/bin/sh
# test_first_hour.sh TESSERA TESSERAD EXPERTS — what a new volunteer or researcher meets in their
# first hour, each error pointing at the fix:
#   - `tessera train` stopped with SIGINT says how to go on; the same command again continues
#     the run (not step 0), --restart starts it over, a run of another shape is refused with both
#     ways out (exit 2);
#   - a dead --peer fails at once; --peer without a port is a usage error (exit 2, one message);
#     --class is checked before anything is fetched, and takes class names;
#   - a partition given as weights says what it is; a missing file is "not found";
#   - network export's join hint works as printed; join with --metrics port 0 says where the URL
#     will be;
#   - status --dir asks a `tessera up` network; status --json against a dead peer still prints
#     JSON; down of a folder that is no network fails; after kill -9 of two nodes, down says they
#     had stopped, and up --restart starts them again; a node restarted by hand is stopped by down;
#   - tesserad and --check-config name the config key of a port that is taken;
#   - every verb's --help has one usage line and an example, and no "(required) (required)".
# Waits are generous; nothing here asserts speed beyond "at once" (under 5 s, where 10 s was).
set -eu
T=${1:?usage: test_first_hour.sh TESSERA TESSERAD EXPERTS}
D=${2:?usage: test_first_hour.sh TESSERA TESSERAD EXPERTS}
E=${3:?usage: test_first_hour.sh TESSERA TESSERAD EXPERTS}
. "$(dirname "$0")/lib.sh"
nets="$dir/net"
# expect CODE CMD...: runs CMD, stdout and stderr into $dir/o and $dir/e; its exit status must be CODE
expect() {
    want=$1
    shift
    rc=0
    "$@" >"$dir/o" 2>"$dir/e" || rc=$?
    [ "$rc" = "$want" ] || fail "$*: exit $rc, want $want: $(cat "$dir/e")"
}
has() { grep -q -- "$1" "$dir/$2" || fail "no '$1' in: $(cat "$dir/$2")"; }
"$T" keygen --network-key --out "$dir/nk" >/dev/null

# ---- train: stop, continue, restart ----
TR="train --model mini --batch 8 --data-dir $dir/st --out $dir/e.safetensors --log-every 1"
"$T" $TR --steps 100000 --ckpt-every 5 >/dev/null 2>"$dir/train1.txt" &
tp=$!
i=0
until grep -q "^step [1-9]" "$dir/train1.txt" 2>/dev/null || grep -q "step [0-9]*/100000" "$dir/train1.txt" 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 600 ] || fail "train did not start: $(cat "$dir/train1.txt")"; sleep 0.1
done
kill -INT $tp
rc=0
wait $tp || rc=$?
[ $rc = 130 ] || fail "train after SIGINT: exit $rc, want 130"
grep -q "the same command again continues from step [1-9]" "$dir/train1.txt" ||
    fail "the stop message does not say how to continue: $(tail -n 3 "$dir/train1.txt")"
stopped=$(sed -n 's/.*continues from step \([0-9]*\).*/\1/p' "$dir/train1.txt")
expect 0 "$T" $TR --steps $((stopped + 2))
has "resuming run 'e' from step $stopped" e
has "step $((stopped + 2))/$((stopped + 2))" e
expect 0 "$T" $TR --steps 2 --restart
has "starting over at step 0 (--restart)" e
expect 2 "$T" train --model tiny --batch 8 --data-dir "$dir/st" --out "$dir/e.safetensors" --steps 4
has "cannot continue" e
has "--restart replaces it, or --run NAME" e
echo "ok: train says how to continue after SIGINT, continues by default, --restart starts over"

# ---- generate: a dead peer, a bad address, a bad class ----
t0=$(date +%s)
expect 1 "$T" generate --peer 127.0.0.1:1 --network-key "$dir/nk" --out "$dir/x.png"
[ $(($(date +%s) - t0)) -lt 5 ] || fail "a dead --peer took $(($(date +%s) - t0)) s"
has "cannot connect to 127.0.0.1:1" e
[ "$(grep -o "127.0.0.1:1" "$dir/e" | wc -l)" -eq 1 ] || fail "the address is repeated: $(cat "$dir/e")"
expect 2 "$T" generate --peer 127.0.0.1 --network-key "$dir/nk" --out "$dir/x.png"
[ "$(wc -l <"$dir/e")" -eq 1 ] || fail "--peer without a port: $(cat "$dir/e")"
grep -q "cannot reach" "$dir/e" && fail "--peer without a port also says it cannot reach"
expect 2 "$T" generate --peer 127.0.0.1:1 --network-key "$dir/nk" --class sneakers --out "$dir/x.png"
has "a class name (0 t-shirt/top" e
expect 2 "$T" generate --local "$E" --class 10 --n 2 --steps 2 --out "$dir/x.png"
expect 0 "$T" generate --local "$E" --class sneaker --n 2 --steps 2 --out "$dir/x.png" --json
"$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if j["prior"].startswith("class") else 1)' "$dir/o" ||
    fail "--class sneaker: $(cat "$dir/o")"
echo "ok: a dead peer fails at once, a portless one is a usage error, classes go by name"

# ---- the wrong file, a missing file ----
expect 1 "$T" sample --weights "$E/partition.safetensors" --out "$dir/x.png"
has "this is a partition" e
has "another kind of artifact" e
expect 1 "$T" sample --weights "$dir/none.safetensors" --out "$dir/x.png"
has "No such file or directory: not found" e
echo "ok: a partition given as weights and a missing file are named for what they are"

# ---- forward --json ----
"$PY" - "$dir/in.safetensors" <<'PYEOF'
import json, struct, sys
B = 2
x = struct.pack("<%df" % (B * 28 * 28), *[((i * 37) % 101) / 50.0 - 1.0 for i in range(B * 28 * 28)])
t = struct.pack("<2f", 0.25, 0.75)
y = struct.pack("<2q", 3, 7)
head, off = {}, 0
for name, dt, shape, data in (("x", "F32", [B, 1, 28, 28], x), ("t", "F32", [B], t), ("y", "I64", [B], y)):
    head[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
    off += len(data)
h = json.dumps(head).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + x + t + y)
PYEOF
expect 0 "$T" forward --weights "$E/expert-0.safetensors" --inputs "$dir/in.safetensors" \
    --out "$dir/v.safetensors" --json
"$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if j["batch"] == 2 and j["shape"] == [2, 1, 28, 28] and j["seconds"] >= 0 else 1)' "$dir/o" ||
    fail "forward --json: $(cat "$dir/o")"
echo "ok: forward --json"

# ---- a tessera up network: status --dir, kill -9, down, up --restart, a node restarted by hand ----
expect 0 "$T" up --nodes 3 --experts "$E" --dir "$dir/net" --compute-threads 1
expect 0 "$T" status --dir "$dir/net" --json
"$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if j["live_members"] == 3 else 1)' "$dir/o" ||
    fail "status --dir: $(head -c 300 "$dir/o")"
expect 1 "$T" status --peer 127.0.0.1:1 --network-key "$dir/nk" --json
"$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if "error" in j else 1)' "$dir/o" ||
    fail "status --json of a dead peer printed: '$(cat "$dir/o")'"
# a wrong network key: said once, with the address once
peer0=$(cat "$dir/net/node-0/data/listen.addr")
for v in status generate; do
    extra=
    [ $v = generate ] && extra="--out $dir/x.png"
    expect 1 "$T" $v --peer "$peer0" --network-key "$dir/nk" $extra
    has "a wrong network key" e
    [ "$(grep -o "$peer0" "$dir/e" | wc -l)" -eq 1 ] || fail "$v repeats the address: $(cat "$dir/e")"
done
expect 0 "$T" network export --from-up "$dir/net" --out "$dir/net.tessera"
has "tessera join $dir/net.tessera --advertise HOST:7420" o
expect 0 "$T" join "$dir/net.tessera" --listen 127.0.0.1:0 --metrics 127.0.0.1:0 --dir "$dir/vol"
has "data/metrics.url once it runs" o
grep -q "http://127.0.0.1:0/" "$dir/o" && fail "join points at port 0: $(cat "$dir/o")"
for i in 1 2; do kill -9 "$(cat "$dir/net/node-$i/tesserad.pid")"; done
sleep 0.3
expect 0 "$T" up --dir "$dir/net" --restart
has "restarted nodes 1 at 127.0.0.1:[0-9]*, 2 at" o
i=0
until "$T" status --dir "$dir/net" --json >"$dir/s.json" 2>/dev/null &&
    "$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if j["live_members"] == 3 else 1)' "$dir/s.json"; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "the restarted nodes did not rejoin: $(head -c 400 "$dir/s.json")"; sleep 0.2
done
# node 2 dies again and is started by hand, outside `up`
kill -9 "$(cat "$dir/net/node-2/tesserad.pid")"
kill -9 "$(cat "$dir/net/node-1/tesserad.pid")"
sleep 0.3
rm -f "$dir/net/node-2/data/listen.addr"
(cd "$dir/net/node-2" && exec "$D" --config tesserad.ini >/dev/null 2>&1) &
hand=$!
pids=$hand
wait_listen "$dir/net/node-2" "the node started by hand"
expect 0 "$T" down --dir "$dir/net" --timeout 10
has "stopped 2 nodes" o
has "node 1 had already stopped" o
kill -0 $hand 2>/dev/null && fail "down left the node started by hand running"
pids=
expect 1 "$T" down --dir "$dir/nothing-here"
echo "ok: status --dir, up --restart, and down (dead nodes said, a hand-started node stopped)"

# ---- a taken port, named by its key ----
"$PY" - "$dir" "$D" "$T" <<'PYEOF' || fail "a taken port"
import socket, subprocess, sys
d, daemon, tessera = sys.argv[1], sys.argv[2], sys.argv[3]
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
port = s.getsockname()[1]
subprocess.run([tessera, "keygen", "--out", d + "/id.key"], capture_output=True, check=True)
for key, node, metrics in (("[node] listen", port, 0), ("[metrics] listen", 0, port)):
    ini = d + "/p.ini"
    open(ini, "w").write("[node]\nidentity = %s/id.key\nnetwork_key = %s/nk\nlisten = 127.0.0.1:%d\n"
                         "data_dir = %s/pd\n[metrics]\nlisten = 127.0.0.1:%d\n" % (d, d, node, d, metrics))
    for args in (["--check-config"], []):
        r = subprocess.run([daemon, "--config", ini] + args, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (key, args, r)
        assert key in r.stderr and "Address already in use" in r.stderr, (key, args, r.stderr)
PYEOF
echo "ok: tesserad and --check-config name the key of a taken port"

# ---- help ----
for v in generate sample train partition status up down join ping pull loss keygen forward eval \
    train-router; do
    "$T" $v --help >"$dir/h" 2>&1 || fail "$v --help"
    [ "$(grep -c '^usage:' "$dir/h")" -eq 1 ] || fail "$v --help: $(grep '^usage:' "$dir/h")"
    grep -q "^example: tessera $v" "$dir/h" || fail "$v --help has no example"
    grep -q "(required) (required)" "$dir/h" && fail "$v --help repeats (required)"
    awk '!/^(usage|example):/ && length > 100 { bad = 1 } END { exit bad }' "$dir/h" ||
        fail "$v --help: a line past 100 columns"
done
echo "ok: every verb's --help has one usage line and an example"
