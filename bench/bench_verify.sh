#!/bin/sh
# bench_verify.sh TESSERA OUT_DIR [GENS] — spot-checks against liars, measured on loopback.
#
# One expert (`tiny`, trained for 2 steps: the plumbing, not quality) served by 8 daemons
# (`tessera up --nodes 8`). For each liar kind — a bias of 1e-3 on every answer, Gaussian noise
# of σ 1e-2, the answer scaled by 1.1 (a wrong model's answer), a bias of 1e-3 on 1 % of the
# answers only, and noise of σ 1e-2 on every answer after the first two (a liar that earns trust
# first, so that its lies are checked only at the rate) — one node (node 1) is restarted as that liar ([fault] lie_*), and for each
# spot-check rate (0.01, 0.02, 0.05, 0.1) GENS generations (default 2) of 64 images, 8 Heun
# steps, run with fresh seeds. Per generation: the images that differ from --local's with the same
# seed (each 28×28 tile of the grid compared), the requests and checks made, the wrong answers
# caught and when (requests sent, seconds since the client opened the network), and the extra
# requests the checks cost, and the ban across the network: the client accuses the liar before
# the other replicas, which recompute, ban it and pass the accusation on (daemon/trust.h); the
# seconds from the generation's start until the last of the 7 honest nodes banned it (their
# bans' since_ms), and how many of them did. A ban lasts until the judging node restarts, so
# every row starts from a freshly restarted network: its first generation meets the liar
# trusted, the later ones the network as the bans left it. Every run's JSON line goes to
# OUT_DIR/verify.jsonl, the table to stdout.
#
# The client keeps one store through the whole bench, so from the second generation on it starts
# with the replicas it has vouched for (`--vouch-ttl`, store/vouch.h; a node caught lying is
# forgotten): the first row's first generation is a client's first contact, every later one a
# returning client's. VOUCH_TTL=0 measures a client that remembers nothing; *overhead, later
# gens* is the extra requests of generations 2.. alone. LIARS and RATES (space-separated) pick
# the liar kinds and the rates (default: every kind above; 0.01 0.02 0.05 0.1) — RATES=1 checks
# every answer.
set -eu
T=${1:?usage: bench_verify.sh TESSERA OUT_DIR [GENS]}
OUT=${2:?usage: bench_verify.sh TESSERA OUT_DIR [GENS]}
GENS=${3:-2}
PY=/usr/bin/python3
mkdir -p "$OUT"
dir=$(mktemp -d)
cleanup() {
    [ -d "$dir/net" ] && "$T" down --dir "$dir/net" --timeout 5 >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
F=$dir/experts
"$T" partition --experts 1 --restarts 1 --max-iter 3 --seed 1 --out "$F" >/dev/null
"$T" train --partition "$F" --cluster 0 --model tiny --steps 2 --batch 8 --seed 0 \
    --data-dir "$dir/st" --out "$F/expert-0.safetensors" >/dev/null 2>&1
"$T" up --nodes 8 --experts "$F" --dir "$dir/net" --json >"$dir/net.json" 2>/dev/null
peer=$("$PY" -c "import json; print(json.load(open('$dir/net.json'))['peer'])")
GEN="--n 64 --cols 8 --steps 8 --sampler heun --cfg 1.5 --policy uniform --select full"
: >"$OUT/verify.jsonl"

# tiles_differ A.png B.png: how many of the 64 28×28 tiles differ (our PNGs: 8-bit grey)
tiles_differ() {
    "$PY" - "$1" "$2" <<'PYEOF'
import struct, sys, zlib
def read(p):
    b = open(p, "rb").read()
    i, idat, w, h = 8, b"", 0, 0
    while i < len(b):
        n, t = struct.unpack(">I4s", b[i:i + 8])
        d = b[i + 8:i + 8 + n]
        if t == b"IHDR":
            w, h = struct.unpack(">II", d[:8])
        elif t == b"IDAT":
            idat += d
        i += 12 + n
    raw = zlib.decompress(idat)
    rows, prev, k = [], bytearray(w), 0
    for y in range(h):
        f, line = raw[k], bytearray(raw[k + 1:k + 1 + w])
        k += 1 + w
        for x in range(w):
            a = line[x - 1] if x else 0  # left
            b = prev[x]                  # up
            c = prev[x - 1] if x else 0  # upper left
            if f == 4:  # Paeth (PNG spec 9.4)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            else:
                pr = [0, a, b, (a + b) // 2][f]
            line[x] = (line[x] + pr) & 255
        rows.append(bytes(line))
        prev = line
    return rows, w, h
a, w, h = read(sys.argv[1])
b, _, _ = read(sys.argv[2])
cols, rows = 8, 8
tw, th = w // cols, h // rows
n = 0
for r in range(rows):
    for c in range(cols):
        if any(a[r * th + y][c * tw:(c + 1) * tw] != b[r * th + y][c * tw:(c + 1) * tw]
               for y in range(th)):
            n += 1
print(n)
PYEOF
}

stop() { # stop I...: those nodes stopped (SIGTERM), waited for
    for i in "$@"; do kill "$(cat "$dir/net/node-$i/tesserad.pid")"; done
    for i in "$@"; do
        while kill -0 "$(cat "$dir/net/node-$i/tesserad.pid")" 2>/dev/null; do sleep 0.1; done
    done
}

liar() { # liar KIND: every node restarted (no bans left), node 1 with that [fault] section
    stop 0 # in two halves: a restarted node joins through a running one
    "$T" up --dir "$dir/net" --restart >/dev/null
    stop 1 2 3 4 5 6 7
    sed -i '/^\[fault\]/,$d' "$dir/net/node-1/tesserad.ini"
    case $1 in
    bias) printf '[fault]\nlie_bias = 0.001\n' ;;
    noise) printf '[fault]\nlie_noise = 0.01\n' ;;
    other) printf '[fault]\nlie_scale = 1.1\n' ;;
    rare) printf '[fault]\nlie_bias = 0.001\nlie_rate = 0.01\n' ;;
    late) printf '[fault]\nlie_noise = 0.01\nlie_after = 2\n' ;;
    *) : ;;
    esac >>"$dir/net/node-1/tesserad.ini"
    "$T" up --dir "$dir/net" --restart >/dev/null
    peer=$(cat "$dir/net/node-0/data/listen.addr")
    i=0
    until "$T" status --peer "$peer" --network-key "$dir/net/network.key" --json >"$dir/st.json" 2>/dev/null &&
        [ "$("$PY" -c "
import json; s = json.load(open('$dir/st.json'))
live = {m['node_id'] for m in s['members'] if m['state'] == 'alive'}
print(len({a['node_id'] for a in s['adverts'] if a.get('valid') and a['node_id'] in live}))")" = 8 ]; do
        i=$((i + 1)); [ $i -lt 240 ] || { echo "bench_verify: the liar did not come back" >&2; exit 1; }
        sleep 0.5
    done
}

# bans SINCE_MS: how many of the honest nodes (0, 2..7) ban node 1, and the seconds from
# SINCE_MS (Unix ms) to the last of those bans
bans() {
    liar_id=$("$PY" -c "
import json; s = json.load(open('$dir/st.json'))
print([m['node_id'] for m in s['members'] if m['addr'] == open('$dir/net/node-1/data/listen.addr').read().strip()][0])")
    for i in 0 2 3 4 5 6 7; do
        "$T" status --peer "$(cat "$dir/net/node-$i/data/listen.addr")" \
            --network-key "$dir/net/network.key" --json 2>/dev/null || echo '{}'
    done | "$PY" -c "
import json, sys
since = [b['since_ms'] for l in sys.stdin for b in json.loads(l).get('bans', []) if b['node_id'] == '$liar_id']
print(len(since), '%.3f' % ((max(since) - $1) / 1e3) if since else 'null')"
}

printf '%-6s %6s %5s %10s %9s %7s %12s %14s %10s %12s %12s %9s\n' liar rate gens "images≠" requests checks "caught(gens)" "first catch" overhead "later gens" "banned by 7" repaired
for kind in ${LIARS:-bias noise other rare late}; do
    for rate in ${RATES:-0.01 0.02 0.05 0.1}; do
        liar $kind
        for g in $(seq 1 "$GENS"); do
            seed=$((1000 * g + 7))
            [ -f "$dir/local-$seed.png" ] ||
                "$T" generate --local "$F" $GEN --seed $seed --out "$dir/local-$seed.png" >/dev/null 2>&1
            t0=$("$PY" -c "import time; print(int(time.time() * 1000))")
            "$T" generate --peer "$peer" --network-key "$dir/net/network.key" --data-dir "$dir/cache" \
                $GEN --no-hedge --seed $seed --verify $rate ${VOUCH_TTL:+--vouch-ttl "$VOUCH_TTL"} \
                --json --out "$dir/g.png" >"$dir/g.json" 2>/dev/null
            differ=$(tiles_differ "$dir/g.png" "$dir/local-$seed.png")
            set -- $(bans "$t0")
            "$PY" - "$dir/g.json" "$kind" "$rate" "$seed" "$differ" "$g" "$1" "$2" >>"$OUT/verify.jsonl" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))["network"]
c = j["checks"]
a = c.get("accusations", {})
print(json.dumps({"liar": sys.argv[2], "rate": float(sys.argv[3]), "seed": int(sys.argv[4]),
                  "gen": int(sys.argv[6]), "images": 64, "images_differ": int(sys.argv[5]),
                  "requests": j["requests"], "replicas": j["replicas"],
                  "checks": c["checked"], "disagreed": c["disagreed"],
                  "remembered": c.get("remembered", 0),
                  "wrong_answers": c["wrong_answers"], "undecided": c["undecided"],
                  "first_catch_requests": c["first_catch_requests"],
                  "first_catch_s": c["first_catch_s"], "accusations": a,
                  "repaired_samples": c.get("repaired_samples", 0),
                  "banned_by": int(sys.argv[7]),
                  "banned_all_s": None if sys.argv[8] == "null" or int(sys.argv[7]) < 7
                  else float(sys.argv[8])}))
PYEOF
        done
        "$PY" - "$OUT/verify.jsonl" "$kind" "$rate" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if r["liar"] == sys.argv[2] and r["rate"] == float(sys.argv[3])]
caught = [r for r in rows if r["wrong_answers"] > 0]
req = sum(r["requests"] for r in rows)
chk = sum(r["checks"] for r in rows)
first = sorted(r["first_catch_requests"] for r in caught)
g1 = [r for r in rows if r.get("gen") == 1]
ban = ("%d/7 in %.1f s" % (g1[0]["banned_by"], g1[0]["banned_all_s"])
       if g1 and g1[0].get("banned_all_s") is not None
       else ("%d/7" % g1[0]["banned_by"]) if g1 else "-")
rep = sum(r.get("repaired_samples", 0) for r in rows)
later = [r for r in rows if r.get("gen", 1) > 1]
lreq = sum(r["requests"] for r in later)
lchk = sum(r["checks"] for r in later)
lover = ("%.1f%%" % (100.0 * lchk / max(1, lreq - lchk))) if later else "-"
print("%-6s %6.2f %5d %10s %9d %7d %12s %14s %9.1f%% %12s %12s %9d" % (
    sys.argv[2], float(sys.argv[3]), len(rows),
    "%d/%d" % (sum(r["images_differ"] for r in rows), 64 * len(rows)), req, chk,
    "%d/%d" % (len(caught), len(rows)),
    ("%d req" % first[len(first) // 2]) if first else "-",
    100.0 * chk / max(1, req - chk), lover, ban, rep))
PYEOF
    done
done
