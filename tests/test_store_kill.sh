#!/usr/bin/env bash
# test_store_kill.sh — kill -9 during training, then resume.
#
# Usage: test_store_kill.sh TESSERA
#
# Trains the `tiny` model for 60 steps of batch 8 on a 512-image shard of Fashion-MNIST with a
# checkpoint into the store every 5 steps, twice, each run in its own data directory:
#   A  uninterrupted;
#   B  killed with SIGKILL at a random moment after its first checkpoint exists (the loss log
#      has at least 12 lines, plus a random delay), then restarted with --resume to the end.
# Asserts that every loss line B wrote — before the kill and after the resume — equals A's line
# for the same step byte for byte, that B's log covers every step 1..60, that the resume started
# at a checkpoint step (a multiple of 5), that the two stores' checkpoint databases hold the
# same bytes, and that Debian's mdb_stat / mdb_dump read both environments (plain LMDB).
# Exit 77 (skipped) when the Fashion-MNIST files are not installed.
set -euo pipefail

TESSERA=${1:?usage: test_store_kill.sh TESSERA}
FMNIST=${TESSERA_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
STEPS=60
EVERY=5

. "$(dirname "$0")/lib.sh"
if [ ! -e "$FMNIST/train-images-idx3-ubyte.gz" ] && [ ! -e "$FMNIST/train-images-idx3-ubyte" ]; then
    skip "no Fashion-MNIST in $FMNIST"
fi
for tool in mdb_stat mdb_dump; do
    command -v "$tool" >/dev/null || fail "$tool not found (install lmdb-utils, or run scripts/setup.sh)"
done

W=$dir

# 512 images spread over the training set, in the shard format (a '#' line, one index a line)
{
    echo "# 512 Fashion-MNIST training images for test_store_kill.sh"
    seq 7 113 60000 | head -n 512
} >"$W/shard.txt"

# train DATA_DIR LOSS_LOG OUT [more options]: the command, run with exec so that in the
# background $! is the training process itself (kill -9 must hit it, not a subshell)
train() {
    local dir=$1 log=$2 out=$3
    shift 3
    exec "$TESSERA" train --model tiny --shard "$W/shard.txt" --batch 8 --steps $STEPS \
        --ckpt-every $EVERY --threads 1 --seed 3 --log-every 20 --run kill-test \
        --data-dir "$dir" --loss-log "$log" --out "$out" "$@"
}

# A: uninterrupted
(train "$W/A" "$W/A.log" "$W/a.safetensors") 2>"$W/A.err" || { cat "$W/A.err"; fail "run A failed"; }
[ "$(wc -l <"$W/A.log")" -eq $STEPS ] || fail "run A logged $(wc -l <"$W/A.log") lines, want $STEPS"

# B: killed after the first checkpoint, at a random moment
(train "$W/B" "$W/B.log" "$W/b.safetensors") 2>"$W/B1.err" &
pid=$!
pids=$pid
for _ in $(seq 1 1200); do
    if [ -f "$W/B.log" ] && [ "$(wc -l <"$W/B.log")" -ge 12 ]; then break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
done
sleep "0.$(printf '%03d' $((RANDOM % 1000)))"
kill -0 "$pid" 2>/dev/null || { cat "$W/B1.err"; fail "run B ended before it could be killed"; }
kill -9 "$pid"
status=0
wait "$pid" 2>/dev/null || status=$?
pids=
[ $status -eq 137 ] || fail "run B exited with status $status, want 137 (SIGKILL)"
grep -q '^done' "$W/B1.err" && fail "run B finished although it was killed"
killed_at=$(tail -n 1 "$W/B.log" | cut -d' ' -f1)
echo "run B killed with SIGKILL after step $killed_at"

# B, resumed
(train "$W/B" "$W/B.log" "$W/b.safetensors" --resume) 2>"$W/B2.err" ||
    { cat "$W/B2.err"; fail "resumed run B failed"; }
resumed=$(sed -n "s/^resuming run 'kill-test' from step \([0-9]*\) .*/\1/p" "$W/B2.err")
[ -n "$resumed" ] || { cat "$W/B2.err"; fail "the resumed run did not say which step it resumed from"; }
echo "run B resumed from the checkpoint at step $resumed"
[ $((resumed % EVERY)) -eq 0 ] && [ "$resumed" -ge $EVERY ] && [ "$resumed" -le "$killed_at" ] ||
    fail "resumed from step $resumed, want a multiple of $EVERY in [$EVERY, $killed_at]"

# every line of B equals A's line for that step; every step is there
awk -v steps=$STEPS '
    NR == FNR { if (NF != 3) { print "A: malformed line " FNR ": " $0; bad = 1 } ref[$1] = $0; next }
    {
        if (NF != 3 || !($1 in ref)) { print "B: line " FNR " is not a step of A: " $0; bad = 1; next }
        if ($0 != ref[$1]) { print "step " $1 ": A has \"" ref[$1] "\", B has \"" $0 "\""; bad = 1 }
        seen[$1]++; lines++
    }
    END {
        for (s = 1; s <= steps; s++) if (!(s in seen)) { print "B: step " s " missing"; bad = 1 }
        if (!bad) printf "all %d loss lines of B (%d steps, %d recomputed after the resume) equal A\n", lines, steps, lines - steps
        exit bad
    }' "$W/A.log" "$W/B.log" || fail "the losses of the killed-and-resumed run differ from the uninterrupted run"

# the format is plain LMDB: Debian's tools read it, and both stores hold the same checkpoints
for d in A B; do
    mdb_stat -a "$W/$d" >"$W/$d.stat" || fail "mdb_stat -a cannot read store $d"
    grep -A5 '^Status of ckpt' "$W/$d.stat" | grep -q 'Entries: 3' ||
        { cat "$W/$d.stat"; fail "store $d: the ckpt database should hold 3 checkpoints (--keep 3)"; }
    grep -A5 '^Status of meta' "$W/$d.stat" | grep -q 'Entries: [1-9]' || fail "store $d: no meta"
    mdb_dump -s ckpt "$W/$d" >"$W/$d.dump" || fail "mdb_dump -s ckpt cannot read store $d"
    sed '1,/^HEADER=END$/d' "$W/$d.dump" | sha256sum | cut -d' ' -f1 >"$W/$d.sum"
    rm -f "$W/$d.dump"
done
cmp -s "$W/A.sum" "$W/B.sum" || fail "the checkpoints of A and B differ (mdb_dump -s ckpt)"
echo "mdb_stat and mdb_dump read both stores; their checkpoints (steps 50, 55, 60) are identical"
echo "PASS"
