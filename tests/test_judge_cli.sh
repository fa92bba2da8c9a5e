#!/bin/sh
# test_judge_cli.sh TESSERA — the judges end to end, with real Fashion-MNIST images:
#   - train-judge trains an autoencoder for a few steps and writes it, with what it measured;
#   - partition --features clusters the train set in the autoencoder's bottleneck;
#   - judge scores two sample sets saved as gzipped IDX pairs — train images as they are, and the
#     same images blurred and dimmed — and finds the damaged set higher in FD and KID, with paired
#     intervals that exclude 0, in both the judge and a second one, and says the judges agree;
#   - --json carries every figure; a set scored against itself differs by exactly 0;
#   - a file that is no judge, a samples name whose labels cannot be found, and a missing file
#     are refused with a message, exit 1 or 2.
set -eu
T=${1:?usage: test_judge_cli.sh TESSERA}
. "$(dirname "$0")/lib.sh"

"$T" train-judge --kind ae --seed 5 --steps 40 --batch 64 --eval-n 500 --threads 2 --quiet --json \
    --out "$dir/ae.safetensors" >"$dir/ae.json" 2>"$dir/ae.log" || fail "train-judge ae: $(cat "$dir/ae.log")"
"$PY" - "$dir/ae.json" <<'PYEOF' || fail "train-judge's JSON: $(cat "$dir/ae.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["done"] and d["kind"] == "ae" and d["seed"] == 5 and 0 < d["test_mse"] < 1, d
PYEOF
"$T" train-judge --kind cnn --seed 6 --steps 30 --batch 32 --eval-n 500 --threads 2 --quiet \
    --out "$dir/cnn.safetensors" 2>"$dir/cnn.log" || fail "train-judge cnn: $(cat "$dir/cnn.log")"
grep -q "test accuracy" "$dir/cnn.log" || fail "train-judge cnn says no accuracy: $(cat "$dir/cnn.log")"
# a judge is a space to partition in: k-means on the autoencoder's bottleneck (no labels)
"$T" partition --experts 4 --features "$dir/ae.safetensors" --threads 2 --out "$dir/part-ae" \
    --json >"$dir/part-ae.json" 2>"$dir/part-ae.log" || fail "partition --features ae: $(cat "$dir/part-ae.log")"
grep -q "features of .*ae.safetensors: 32 dims" "$dir/part-ae.log" ||
    fail "partition names no 32-dim judge space: $(cat "$dir/part-ae.log")"
"$PY" - "$dir/part-ae.json" <<'PYEOF' || fail "partition --features ae's JSON: $(head -c 400 "$dir/part-ae.json")"
import json, sys
d = json.load(open(sys.argv[1]))
sizes = [c["size"] for c in d["clusters"]]
assert d["strategy"] == "features" and len(sizes) == 4 and sum(sizes) == 60000, d
assert min(sizes) > 1000, sizes  # k-means on a real space: no empty or degenerate cluster
PYEOF
# the evaluation classifier is a feature space too (barely trained: only its file kind matters)
"$T" train-classifier --patch 7 --depth 1 --steps 5 --eval-n 100 --threads 2 \
    --out "$dir/cls.safetensors" >/dev/null 2>&1 || fail "train-classifier"
# ... and a space to partition in, through the same door
"$T" partition --experts 3 --features "$dir/cls.safetensors" --restarts 1 --threads 2 \
    --out "$dir/part-cls" --json >"$dir/part-cls.json" 2>"$dir/part-cls.log" ||
    fail "partition --features classifier: $(cat "$dir/part-cls.log")"
[ "$(json_get "$dir/part-cls.json" "sum(c['size'] for c in j['clusters'])")" = 60000 ] ||
    fail "partition --features classifier: $(head -c 400 "$dir/part-cls.json")"

# two sample sets: 400 train images, and the same images blurred (3×3 mean) and dimmed
"$PY" - "$dir" <<'PYEOF'
import gzip, struct, sys
d = sys.argv[1]
with gzip.open("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz") as f:
    f.read(16)
    raw = f.read(400 * 784)
with gzip.open("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz") as f:
    f.read(8)
    lab = f.read(400)
def blur(img):
    out = bytearray(784)
    for y in range(28):
        for x in range(28):
            s = n = 0
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    if 0 <= y + dy < 28 and 0 <= x + dx < 28:
                        s += img[(y + dy) * 28 + x + dx]; n += 1
            out[y * 28 + x] = int(0.7 * s / n)
    return bytes(out)
bad = b"".join(blur(raw[i * 784:(i + 1) * 784]) for i in range(400))
for name, pix in (("real", raw), ("bad", bad)):
    with gzip.open(f"{d}/{name}.idx.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, 400, 28, 28) + pix)
    with gzip.open(f"{d}/{name}-labels.idx.gz", "wb") as f:
        f.write(struct.pack(">II", 2049, 400) + lab)
PYEOF

"$T" judge --samples "$dir/real.idx.gz,$dir/bad.idx.gz,$dir/real.idx.gz" \
    --judges "$dir/ae.safetensors,$dir/cnn.safetensors" --ref-n 1000 --bootstrap 40 --threads 2 \
    >"$dir/table.txt" 2>"$dir/judge.log" || fail "judge: $(cat "$dir/judge.log")"
grep -q "bad .*higher in every judge: holds" "$dir/table.txt" ||
    fail "the damaged set is not found worse by every judge: $(cat "$dir/table.txt")"
"$T" judge --samples "$dir/real.idx.gz,$dir/bad.idx.gz,$dir/real.idx.gz" \
    --judges "$dir/ae.safetensors,$dir/cnn.safetensors,$dir/cls.safetensors" --ref-n 1000 \
    --bootstrap 40 --threads 2 --json >"$dir/judge.json" 2>/dev/null || fail "judge --json"
"$PY" - "$dir/judge.json" <<'PYEOF' || fail "judge's JSON: $(head -c 3000 "$dir/judge.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert [e["name"] for e in d["entries"]] == ["real", "bad", "real"], d["entries"]
assert len(d["judges"]) == 3 and d["judges"][0]["features"] == 32 and d["judges"][1]["features"] == 128
assert d["judges"][0]["meta"]["seed"] == "5" and "test_mse" in d["judges"][0]["meta"]
assert d["judges"][2]["name"] == "classifier" and "test_accuracy" in d["judges"][2]["meta"]
for j in d["judges"][:2]:
    real, bad, again = j["scores"]
    assert bad["fd"] > real["fd"] and bad["fd_minus_first_ci95"][0] > 0, (j["name"], bad)
    assert bad["kid"] > real["kid"] and bad["kid_minus_first_ci95"][0] > 0, (j["name"], bad)
    assert real["fd_ci95"][0] <= real["fd"] <= real["fd_ci95"][1], real
    assert real["fd_minus_first"] is None
    assert again["fd_minus_first"] == 0 and again["kid_minus_first_ci95"] == [0, 0], again
    assert 0 <= real["precision"] <= 1 and 0 <= real["recall"] <= 1
c = d["judges"][2]["scores"]  # an untrained classifier's space: scored, no claim on the ranking
assert all(s["fd"] >= 0 and s["kid_ci95"][0] is not None for s in c) and c[2]["fd_minus_first"] == 0
PYEOF
echo "ok: the damaged set is worse in both judges, with paired intervals; JSON complete"

# errors
rc=0; "$T" judge --samples "$dir/real.idx.gz" --judges "$dir/real.idx.gz" >/dev/null 2>"$dir/e1" || rc=$?
[ "$rc" = 1 ] && grep -q "real.idx.gz is not a judge file" "$dir/e1" ||
    fail "a samples file as a judge: exit $rc, $(cat "$dir/e1")"
rc=0; "$T" judge --samples "$dir/real.gz" --judges "$dir/ae.safetensors" >/dev/null 2>"$dir/e2" || rc=$?
[ "$rc" = 2 ] && grep -q "X-labels.idx.gz" "$dir/e2" || fail "an unnamed samples file: exit $rc, $(cat "$dir/e2")"
rc=0; "$T" judge --samples "$dir/none.idx.gz" --judges "$dir/ae.safetensors" >/dev/null 2>"$dir/e3" || rc=$?
[ "$rc" = 1 ] && grep -q "none.idx.gz" "$dir/e3" || fail "a missing samples file: exit $rc, $(cat "$dir/e3")"
rc=0; "$T" train-judge --kind vae --out "$dir/x" >/dev/null 2>"$dir/e4" || rc=$?
[ "$rc" = 2 ] && grep -q "cnn or ae" "$dir/e4" || fail "--kind vae: exit $rc, $(cat "$dir/e4")"
echo "ok: the errors name the file and the fix"
