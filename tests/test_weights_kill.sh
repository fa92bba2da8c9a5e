#!/usr/bin/env bash
# test_weights_kill.sh TESSERA — kill -9 during a large `tessera store import`.
#
# A 256 MiB safetensors file (8 random F32 tensors, written by python3, which also computes its
# BLAKE2b-256: the weights hash `import` must print) is imported into a store whose map starts at
# 8 MiB, and the import is killed with SIGKILL once some chunk transactions have committed (polled
# with mdb_stat, or the size of data.mdb without it). Then:
#
#   - the environment opens cleanly: `tessera store ls --json` and `mdb_stat -a` succeed;
#   - it holds the whole manifest or none of it: ls lists no such hash (or, if the kill came
#     after the manifest's commit, lists it and export gives the file), and verify passes;
#   - a full import then succeeds (the chunks already committed are reused), prints the same
#     hash python computed, leaves no orphans, grew the map past its 8 MiB start, and export is
#     byte-identical (cmp).
#
# Disk: the file, one store and one export at a time (< 800 MB), all removed at the end. Exits 77
# (skipped) without python3 or without 1 GB free.
#
# With a second argument `cli` it tests the other sub-verbs instead, on small files: import
# --pin/--json, ls, pin/unpin, evict --budget (with a suffix) in LRU order, rm by prefix, gc, du,
# and the usage errors (exit 2) and failures (exit 1).
set -u
T=${1:?usage: test_weights_kill.sh path/to/tessera [cli]}
mode=${2:-kill}
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
. "$(dirname "$0")/lib.sh"
work=$dir
# The value of a Python expression over the JSON document $1 (as `d`).
jget() { python3 -c 'import json,sys; d = json.loads(sys.argv[1]); print(eval(sys.argv[2]))' "$1" "$2"; }

if [ "$mode" = cli ]; then
    # three files of 1.5 MiB (2 chunks each), random bytes
    for name in a b c; do
        python3 - "$work/$name.safetensors" <<'EOF'
import json, os, struct, sys
n = 3 << 19
h = json.dumps({"x": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + os.urandom(n))
EOF
    done
    D="--data-dir $work/store"
    a=$("$T" store import "$work/a.safetensors" $D) || fail "import a"
    b=$("$T" store import "$work/b.safetensors" $D --pin --json) || fail "import b --pin --json"
    [ "$(jget "$b" 'd["pinned"]')" = True ] || fail "import --pin: $b"
    b=$(jget "$b" 'd["hash"]')
    c=$("$T" store import "$work/c.safetensors" $D) || fail "import c"
    [ ${#a} = 64 ] && [ ${#b} = 64 ] && [ ${#c} = 64 ] || fail "import prints 64 hex digits: $a $b $c"
    ls=$("$T" store ls --json $D) || fail "ls --json"
    [ "$(jget "$ls" 'len(d)')" = 3 ] || fail "ls lists 3: $ls"
    "$T" store ls $D | grep -q "^${a:0:16} " || fail "the ls table shows a's hash prefix"
    # use order a, b, c; b pinned; a budget of 3.5 MiB keeps two: a (oldest unpinned) goes
    "$T" store pin "${c:0:8}" $D >/dev/null || fail "pin c"
    "$T" store unpin "${c:0:10}" $D >/dev/null || fail "unpin c"
    ev=$("$T" store evict --budget 3.5M --json $D) || fail "evict"
    [ "$(jget "$ev" '[e["hash"] for e in d["evicted"]]')" = "['$a']" ] || fail "evict took $ev, want a"
    ev=$("$T" store evict --budget=0 --json $D 2>/dev/null) || fail "evict 0"
    [ "$(jget "$ev" '[e["hash"] for e in d["evicted"]]')" = "['$c']" ] || fail "evict 0 took $ev, want c"
    ls=$("$T" store ls --json $D)
    [ "$(jget "$ls" '[e["hash"] for e in d]')" = "['$b']" ] || fail "only the pinned b stays: $ls"
    "$T" store rm "${b:0:12}" $D >/dev/null || fail "rm b"
    du=$("$T" store du --json $D) || fail "du"
    [ "$(jget "$du" '(d["manifests"], d["chunks"])')" = "(0, 0)" ] || fail "du after rm: $du"
    gc=$("$T" store gc --json $D) || fail "gc"
    [ "$(jget "$gc" 'd["freed_chunks"]')" = 0 ] || fail "gc: $gc"
    "$T" store verify $D >/dev/null || fail "verify of an empty store"
    # failures exit 1, usage errors exit 2
    for args in "export ${a:0:8} $work/x" "rm ${a:0:8}" "import $work/nonexistent" \
                "import $work" "pin 0123456789abcdef"; do
        "$T" store $args $D >/dev/null 2>&1; rc=$?
        [ $rc = 1 ] || fail "tessera store $args: exit $rc, want 1"
    done
    for args in "" "bogus" "import" "import a b" "ls x" "evict" "evict --budget 12Q" \
                "ls --bogus" "ls --map-size x" "export abcdef01"; do
        "$T" store $args $D >/dev/null 2>&1; rc=$?
        [ $rc = 2 ] || fail "tessera store $args: exit $rc, want 2"
    done
    "$T" store --help | grep -q evict || fail "store --help"
    "$T" store import --help | grep -q -- "--pin" || fail "store import --help"
    echo "ok: the store sub-verbs"
    exit 0
fi
free_kb=$(df -Pk "$work" | awk 'NR == 2 {print $4}')
[ "${free_kb:-0}" -ge 1048576 ] || { echo "skipped: less than 1 GB free in $work"; exit 77; }
have_mdb_stat=0
command -v mdb_stat >/dev/null && have_mdb_stat=1

big=$work/big.safetensors
want=$(python3 - "$big" <<'EOF'
import hashlib, json, os, struct, sys
path, n_tensors, rows, cols = sys.argv[1], 8, 2048, 4096
size = rows * cols * 4
hdr = {"__metadata__": {"note": "kill -9 test"}}
for i in range(n_tensors):
    hdr[f"layer.{i}.weight"] = {"dtype": "F32", "shape": [rows, cols],
                                "data_offsets": [i * size, (i + 1) * size]}
h = json.dumps(hdr, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
digest = hashlib.blake2b(digest_size=32)
with open(path, "wb") as f:
    for part in (struct.pack("<Q", len(h)), h):
        f.write(part); digest.update(part)
    for _ in range(n_tensors * size // (16 << 20)):
        block = os.urandom(16 << 20)
        f.write(block); digest.update(block)
print(digest.hexdigest())
EOF
) || fail "python3 could not write the test file"
size=$(stat -c %s "$big")
total_chunks=$(( (size + 1048575) / 1048576 ))
echo "test file: $size bytes, $total_chunks chunks, BLAKE2b-256 $want"

# Entries in a database of the store (mdb_stat), or -1 when it cannot be read.
entries() {
    mdb_stat -s "$2" "$1" 2>/dev/null | awk '/Entries:/ {print $2; found = 1} END {if (!found) print -1}'
}
# Committed progress: chunks (with mdb_stat) or MiB of data.mdb (without).
progress() {
    if [ $have_mdb_stat = 1 ]; then entries "$1" chunks
    else echo $(( $(stat -c %s "$1/data.mdb" 2>/dev/null || echo 0) >> 20 )); fi
}

# ---- kill -9 part-way through an import (retried if the import wins the race) -----------------
store=
killed_mid=0
for attempt in 1 2 3 4 5; do
    rm -rf "$work/store"
    store=$work/store
    "$T" store import "$big" --data-dir "$store" --map-size 8M >"$work/out" 2>"$work/err" &
    pid=$!
    pids=$pid
    killed=0
    while kill -0 "$pid" 2>/dev/null; do
        p=$(progress "$store")
        if [ "${p:-0}" -ge 24 ]; then
            kill -9 "$pid" 2>/dev/null && killed=1
            break
        fi
        sleep 0.01
    done
    wait "$pid"
    rc=$?
    pids=
    if [ $killed = 1 ] && [ $rc = 137 ]; then
        killed_mid=1
        break
    fi
    echo "attempt $attempt: the import ended (exit $rc) before the kill; trying again"
done
[ $killed_mid = 1 ] || fail "could not kill the import part-way in 5 attempts"

# ---- the environment opens cleanly and holds the whole manifest or none ----------------------
ls_json=$("$T" store ls --json --data-dir "$store") || fail "tessera store ls failed after the kill"
if [ $have_mdb_stat = 1 ]; then
    mdb_stat -a "$store" >/dev/null || fail "mdb_stat cannot read the store after the kill"
    chunks_after_kill=$(entries "$store" chunks)
    manifests_after_kill=$(entries "$store" manifests)
else
    chunks_after_kill=$("$T" store du --json --data-dir "$store" | python3 -c 'import json,sys; print(json.load(sys.stdin)["chunks"])')
    manifests_after_kill=$(echo "$ls_json" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
fi
echo "after kill -9 (attempt $attempt): $chunks_after_kill of $total_chunks chunks committed, $manifests_after_kill manifests; ls: $ls_json"
case "$ls_json" in
*"$want"*) whole=1 ;;
"[]") whole=0 ;;
*) fail "ls lists something else than nothing or the whole import: $ls_json" ;;
esac
[ "$manifests_after_kill" = "$whole" ] || fail "$manifests_after_kill manifests, ls says $ls_json"
"$T" store verify --data-dir "$store" || fail "verify fails after the kill"
if [ $whole = 1 ]; then
    echo "the kill came after the manifest's commit: the import is whole"
else
    [ "$chunks_after_kill" -ge 1 ] && [ "$chunks_after_kill" -lt "$total_chunks" ] ||
        fail "expected a partial import, found $chunks_after_kill of $total_chunks chunks"
    orphans=$("$T" store du --json --data-dir "$store" | python3 -c 'import json,sys; print(json.load(sys.stdin)["orphan_chunks"])')
    [ "$orphans" = "$chunks_after_kill" ] || fail "du counts $orphans orphans, $chunks_after_kill chunks are stored"
fi

# ---- a full import succeeds, and export gives the same bytes ---------------------------------
got=$("$T" store import "$big" --data-dir "$store" --map-size 8M) || fail "the import after the kill failed"
[ "$got" = "$want" ] || fail "import printed $got, python computed $want"
"$T" store verify --data-dir "$store" || fail "verify fails after the full import"
du_json=$("$T" store du --json --data-dir "$store") || fail "du failed"
echo "after the full import: $du_json"
python3 - "$du_json" "$total_chunks" <<'EOF' || fail "du after the full import: $du_json"
import json, sys
d, n = json.loads(sys.argv[1]), int(sys.argv[2])
assert d["manifests"] == 1 and d["chunks"] == n and d["orphan_chunks"] == 0, d
assert d["map_size"] > 8 << 20, "the map did not grow past 8 MiB"
assert d["file_size"] > 8 << 20, "data.mdb is not past 8 MiB"
EOF
rm -f "$work/out" "$work/err"
"$T" store export "${want:0:12}" "$work/exported.safetensors" --data-dir "$store" ||
    fail "export failed"
cmp "$big" "$work/exported.safetensors" || fail "the exported file differs from the imported one"
[ $have_mdb_stat = 1 ] && { mdb_stat -a "$store" >/dev/null || fail "mdb_stat cannot read the store"; }
echo "ok: kill -9 part-way left $chunks_after_kill orphan chunks and no manifest; the re-import and export are whole"
exit 0
