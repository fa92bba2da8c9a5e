#!/bin/sh
# test_cli_local.sh TESSERA — the local science verbs end to end, on real files and the real
# data set: partition → train --partition → train-router → train-classifier → generate --local →
# eval. The budgets are tiny (2 steps): this checks the plumbing and the exact invariants, not
# sample quality:
#   - train --partition records partition_id and cluster in the weights;
#   - a one-expert folder reproduces `tessera sample` byte for byte;
#   - expert evaluations per sample are what the selection implies (top1: steps, top2 and full
#     over 2 experts: 2·steps);
#   - with two identical experts, top1 and the uniform mean both equal the single expert exactly,
#     so `tessera eval` gives the monolith's FD to the last digit;
#   - the report is a self-contained HTML page with the chart and a grid per entry.
set -eu
T=${1:?usage: test_cli_local.sh TESSERA}
. "$(dirname "$0")/lib.sh"

f=$dir/folder
run "$T" partition --experts 2 --restarts 1 --max-iter 5 --seed 1 --out "$f"
for k in 0 1; do
    run "$T" train --partition "$f" --cluster $k --model tiny --steps 2 --batch 8 --seed $k \
        --data-dir "$dir/store" --out "$f/expert-$k.safetensors"
done
grep -q '"cluster":"1"' "$f/expert-1.safetensors" || fail "expert-1 does not record its cluster"
pid=$("$T" partition --experts 2 --restarts 1 --max-iter 5 --seed 1 --out "$dir/again" --json 2>/dev/null |
    "$PY" -c "import json,sys; print(json.load(sys.stdin)['partition_id'])")
grep -q "\"partition_id\":\"$pid\"" "$f/expert-0.safetensors" ||
    fail "expert-0 does not record partition_id $pid"
run "$T" train-router --partition "$f" --steps 2 --batch 8 --eval-n 16 --patch 7 --depth 1 \
    --out "$f/router.safetensors"
run "$T" train-classifier --steps 2 --batch 8 --eval-n 64 --patch 7 --depth 1 \
    --out "$dir/cls.safetensors"

# calibrate: ten t-buckets with their statistics and a temperature > 0 (the statistics themselves
# are tested in tests/test_quality.c); a classifier that is not a router is refused
"$T" calibrate --router "$f/router.safetensors" --partition "$f" --n 40 --json >"$dir/cal.json" ||
    fail "calibrate"
"$PY" - "$dir/cal.json" <<'PYEOF' || fail "calibrate results"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["n"] == 40 and j["temperature"] > 0, j
assert len(j["buckets"]) == 10, j
for b in j["buckets"]:
    assert 0 <= b["accuracy"] <= 1 and b["nll"] > 0 and 0 <= b["ece"] <= 1, b
    assert b["temperature"] > 0 and 0 <= b["ece_global"] <= 1, b
PYEOF
if "$T" calibrate --router "$dir/cls.safetensors" --partition "$f" --n 40 2>"$dir/err.txt"; then
    fail "calibrate took a classifier for a router"
fi
grep -q "not a router" "$dir/err.txt" || fail "calibrate: $(cat "$dir/err.txt")"

# generate: the cost of each selection
for sel in top1:2 top2:4 full:4; do
    s=${sel%%:*} want=${sel##*:}
    "$T" generate --local "$f" --policy learned --select "$s" --n 5 --steps 2 --sampler euler \
        --out "$dir/g.png" --json >"$dir/g.json" 2>"$dir/err.txt" || { cat "$dir/err.txt"; fail "generate --select $s"; }
    got=$(json_get "$dir/g.json" "j['evals_per_sample']")
    [ "$got" = "$want.0" ] || fail "generate --select $s: $got expert evaluations per sample, want $want"
done

# class-aware routing: runs, and says so in the summary
"$T" generate --local "$f" --policy learned --class-prior --n 4 --steps 2 --sampler euler \
    --out "$dir/g.png" --json >"$dir/g.json" 2>"$dir/err.txt" || { cat "$dir/err.txt"; fail "generate --class-prior"; }
[ "$(json_get "$dir/g.json" "j['class_prior']")" = "True" ] || fail "generate --class-prior: not in the summary"

# a one-expert folder is `tessera sample`
mkdir "$dir/one"
cp "$f/expert-0.safetensors" "$dir/one/expert-0.safetensors"
run "$T" generate --local "$dir/one" --policy uniform --n 6 --steps 3 --sampler euler --cfg 1.5 \
    --seed 7 --out "$dir/one.png"
run "$T" sample --weights "$f/expert-0.safetensors" --n 6 --steps 3 --sampler euler --cfg 1.5 \
    --seed 7 --out "$dir/sample.png"
cmp -s "$dir/one.png" "$dir/sample.png" || fail "a one-expert folder differs from tessera sample"

# --device: cpu is the default (the same bytes); auto runs on what there is and says so; a cuda
# that is not there is refused with the reason (never quietly the CPU)
run "$T" sample --weights "$f/expert-0.safetensors" --n 6 --steps 3 --sampler euler --cfg 1.5 \
    --seed 7 --device cpu --out "$dir/sample-cpu.png"
cmp -s "$dir/sample-cpu.png" "$dir/sample.png" || fail "--device cpu differs from the default"
"$T" sample --weights "$f/expert-0.safetensors" --n 2 --steps 2 --seed 7 --device auto \
    --out "$dir/sample-auto.png" 2>"$dir/auto.txt" || fail "--device auto: $(cat "$dir/auto.txt")"
grep -q "computing on \(cpu, [0-9]* thread.* (auto: \|cuda:0\)" "$dir/auto.txt" ||
    fail "--device auto does not say where it computes: $(cat "$dir/auto.txt")"
if grep -q "computing on cpu" "$dir/auto.txt"; then
    if "$T" sample --weights "$f/expert-0.safetensors" --n 2 --steps 2 --device cuda \
        --out "$dir/x.png" 2>"$dir/cuda.txt"; then
        fail "--device cuda ran on a machine auto found no GPU on"
    fi
    grep -q "cannot start the engine: cuda:0: " "$dir/cuda.txt" || fail "--device cuda: $(cat "$dir/cuda.txt")"
fi

# --precision: f32 is the default (the same bytes); bf16 runs and says so, or — without oneDNN or
# AVX-512 BF16 — is refused with the reason; anything else is a usage error
run "$T" sample --weights "$f/expert-0.safetensors" --n 6 --steps 3 --sampler euler --cfg 1.5 \
    --seed 7 --precision f32 --out "$dir/sample-f32.png"
cmp -s "$dir/sample-f32.png" "$dir/sample.png" || fail "--precision f32 differs from the default"
if "$T" sample --weights "$f/expert-0.safetensors" --n 2 --steps 2 --seed 7 --precision bf16 \
    --out "$dir/sample-bf16.png" 2>"$dir/bf16.txt"; then
    grep -q "bf16 products" "$dir/bf16.txt" || fail "--precision bf16 does not say so: $(cat "$dir/bf16.txt")"
    run "$T" generate --local "$dir/one" --policy uniform --n 2 --steps 2 --seed 7 \
        --precision bf16 --out "$dir/one-bf16.png"
    cmp -s "$dir/one-bf16.png" "$dir/sample-bf16.png" || fail "generate --precision bf16 differs from sample's"
else
    grep -q -- "--precision bf16: .*\(AVX-512 BF16\|oneDNN\)" "$dir/bf16.txt" ||
        fail "--precision bf16 refused without the reason: $(cat "$dir/bf16.txt")"
fi
# f16 runs everywhere (emulated on a CPU, and it says so), the same image from generate --local;
# it trains too, with its loss scale in the summary
run "$T" sample --weights "$f/expert-0.safetensors" --n 2 --steps 2 --seed 7 --precision f16 \
    --out "$dir/sample-f16.png"
grep -q "f16 products (emulated" "$dir/err.txt" || fail "--precision f16 does not say so: $(cat "$dir/err.txt")"
run "$T" sample --weights "$f/expert-0.safetensors" --n 2 --steps 2 --seed 7 \
    --out "$dir/sample-2.png"
cmp -s "$dir/sample-f16.png" "$dir/sample-2.png" && fail "--precision f16 gave the f32 image"
run "$T" generate --local "$dir/one" --policy uniform --n 2 --steps 2 --seed 7 \
    --precision f16 --out "$dir/one-f16.png"
cmp -s "$dir/one-f16.png" "$dir/sample-f16.png" || fail "generate --precision f16 differs from sample's"
# (with --graphs, which a CPU ignores and the summary says so)
run "$T" train --model tiny --steps 2 --batch 8 --data-dir "$dir/store" --precision f16 \
    --out "$dir/x.safetensors" --json --graphs
grep -q "f16 products forward and backward" "$dir/err.txt" || fail "train --precision f16: $(cat "$dir/err.txt")"
grep -q "^CUDA graphs: none (a CPU engine runs every step eagerly), 0 captured" "$dir/err.txt" ||
    fail "train --graphs on a CPU: $(cat "$dir/err.txt")"
"$PY" - "$dir/out.txt" <<'PYEOF' || fail "train --precision f16 --json: $(cat "$dir/out.txt")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]).read().strip().splitlines()]  # every line
d = lines[-1]  # the summary
assert d["precision"] == "f16" and d["step"] == 2 and d["loss_scale"] == 65536, d
assert d["skipped_steps"] == 0 and all(l.get("skipped") is not True for l in lines), lines
assert d["graphs"] == {"on": False, "captures": 0, "launches": 0}, d
PYEOF
# --attention: composed (not `tiny`'s CPU default) is set on the model, which says so (these
# 2-step experts' blocks are gated to ~0 by adaLN-Zero, so the two attentions' ~1e-7 differences
# do not reach the image's bits: test_dit_tune and test_serve check the bits), and generate
# --local's image is sample's; measure says what it chose; an unknown name is a usage error
run "$T" sample --weights "$f/expert-0.safetensors" --n 2 --steps 2 --seed 7 --attention composed \
    --out "$dir/att-c.png"
grep -q "^tessera sample: attention composed$" "$dir/err.txt" ||
    fail "--attention composed: $(cat "$dir/err.txt")"
run "$T" generate --local "$dir/one" --policy uniform --n 2 --steps 2 --seed 7 \
    --attention composed --out "$dir/one-att-c.png"
grep -q "^tessera generate: attention composed$" "$dir/err.txt" ||
    fail "generate --attention composed: $(cat "$dir/err.txt")"
cmp -s "$dir/one-att-c.png" "$dir/att-c.png" || fail "generate --attention composed differs from sample's"
rc=0
"$T" generate --peer 127.0.0.1:9 --network-key "$dir/x.key" --attention fused --n 1 \
    --out "$dir/x.png" 2>"$dir/p.txt" || rc=$?
[ "$rc" = 2 ] && grep -q -- "--attention goes with --local" "$dir/p.txt" ||
    fail "generate --peer --attention: exit $rc, $(cat "$dir/p.txt")"
run "$T" sample --weights "$f/expert-0.safetensors" --n 2 --steps 2 --seed 7 --attention measure \
    --out "$dir/att-m.png"
grep -q "attention measured: \(fused\|composed\) (fused [0-9.]* ms, composed [0-9.]* ms" \
    "$dir/err.txt" || fail "--attention measure: $(cat "$dir/err.txt")"
rc=0
"$T" sample --weights "$f/expert-0.safetensors" --n 2 --steps 2 --attention flash \
    --out "$dir/x.png" 2>"$dir/p.txt" || rc=$?
[ "$rc" = 2 ] && grep -q -- "--attention flash: want auto, measure, fused or composed" "$dir/p.txt" ||
    fail "--attention flash: exit $rc, $(cat "$dir/p.txt")"
echo "ok: --attention reaches sample's and generate's models, measure says what it chose"
if "$T" sample --weights "$f/expert-0.safetensors" --n 2 --steps 2 --precision fp16 \
    --out "$dir/x.png" 2>"$dir/p.txt"; then
    fail "--precision fp16 was accepted"
fi
grep -q "must be f32, bf16 or f16" "$dir/p.txt" || fail "--precision fp16: $(cat "$dir/p.txt")"

# eval: two identical experts (no cluster metadata) against the same weights as the monolith
run "$T" train --model tiny --steps 2 --batch 8 --data-dir "$dir/store" --out "$dir/mono.safetensors"
# the same weights as a bf16 file: half the bytes (what a node hosting it stores and serves),
# loaded back within bf16's rounding, and sampled from
run "$T" train --model tiny --steps 2 --batch 8 --data-dir "$dir/store" --dtype bf16 \
    --out "$dir/mono-bf16.safetensors"
"$PY" - "$dir/mono.safetensors" "$dir/mono-bf16.safetensors" <<'PYEOF' || fail "the bf16 file"
import json, os, struct, sys
f32, b16 = sys.argv[1], sys.argv[2]
ratio = os.path.getsize(b16) / os.path.getsize(f32)
assert 0.45 < ratio < 0.55, ratio
def header(p):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))
h = header(b16)
dt = {v["dtype"] for k, v in h.items() if k != "__metadata__"}
assert dt == {"BF16"}, dt
print(f"bf16 file: {ratio:.3f} of the f32 file's bytes, every tensor BF16")
PYEOF
run "$T" sample --weights "$dir/mono-bf16.safetensors" --n 4 --steps 2 --sampler euler \
    --out "$dir/bf16.png"
[ -s "$dir/bf16.png" ] || fail "no image from the bf16 weights"
mkdir "$dir/same"
cp "$dir/mono.safetensors" "$dir/same/expert-0.safetensors"
cp "$dir/mono.safetensors" "$dir/same/expert-1.safetensors"
cp "$f/partition.safetensors" "$f/router.safetensors" "$dir/same/"
mkdir "$dir/samples"
# a further judge (an autoencoder, barely trained) and the evaluation classifier as a judge too:
# its scores must be the main table's to the bit
run "$T" train-judge --kind ae --steps 3 --batch 16 --eval-n 50 --quiet --out "$dir/ae.safetensors"
"$T" eval --local "$dir/same" --classifier "$dir/cls.safetensors" \
    --monolith "$dir/mono.safetensors,$dir/mono.safetensors" \
    --policies "monolith learned:top1 uniform:full centroid:top2 learned+prior:top1 uniform+prior:top2 monolith2" \
    --n 24 --steps 2 --sampler euler --ref-n 200 --grid 4 --bootstrap 20 --report "$dir/r.html" \
    --save-samples "$dir/samples" --judges "$dir/ae.safetensors,$dir/cls.safetensors" --json \
    >"$dir/e.json" 2>"$dir/err.txt" || { cat "$dir/err.txt"; fail "eval"; }
"$PY" - "$dir/e.json" <<'PYEOF' || fail "eval results"
import json, math, sys
j = json.load(open(sys.argv[1]))
e = {x["policy"]: x for x in j["entries"]}
assert len(j["entries"]) == 8, j["entries"]
mono = e["monolith"]["fd"]
assert math.isfinite(mono) and mono >= 0, mono
lo, hi = e["monolith"]["fd_ci95"]
assert lo < hi, e["monolith"]
# a mixture of two identical experts is that expert: the same samples, so the same FD, the same
# interval, and a paired difference of exactly 0 whose interval contains 0
for name in ("learned:top1", "uniform:full", "learned+prior:top1", "monolith2"):
    assert e[name]["fd"] == mono, (name, e[name]["fd"], mono)
    assert e[name]["fd_ci95"] == [lo, hi], (name, e[name]["fd_ci95"])
    d = e[name]["fd_minus_first"]
    assert d["first"] == "monolith" and d["value"] == 0, d
    assert d["ci95"][0] <= 0 <= d["ci95"][1], d
    assert e[name]["precision"] == e["monolith"]["precision"], name
    assert e[name]["recall"] == e["monolith"]["recall"], name
    assert e[name]["inception_score"] == e["monolith"]["inception_score"], name
    assert e[name]["per_class_fd"] == e["monolith"]["per_class_fd"], name
for x in j["entries"]:
    assert 0 <= x["precision"] <= 1 and 0 <= x["recall"] <= 1, x
    assert 1 - 1e-9 <= x["inception_score"] <= 10 + 1e-9, x
    assert len(x["per_class_fd"]) == 10, x
    assert len(x["per_cluster"]) == 2, x
    assert abs(sum(c["share"] for c in x["per_cluster"]) - 1) < 1e-9, x
    if x["policy"] != "monolith" and "fd_minus_first" not in x:
        assert x["policy"].startswith("train data"), x
assert abs(sum(j["cluster_ref_share"]) - 1) < 1e-9, j["cluster_ref_share"]
# the judges: both spaces for every entry; the classifier's own space repeats the main table
jd = j["judges"]
assert [x["name"] for x in jd["entries"]] == [x["policy"] for x in j["entries"][1:]], jd["entries"]
ae, cls = jd["judges"]
assert ae["features"] == 32 and cls["name"] == "classifier", (ae["name"], cls["name"])
for s in cls["scores"]:
    assert s["fd"] == e[s["entry"]]["fd"] and s["fd_ci95"] == e[s["entry"]]["fd_ci95"], s
    assert s["precision"] == e[s["entry"]]["precision"], s
for s in ae["scores"]:
    if s["entry"] in ("learned:top1", "uniform:full", "learned+prior:top1", "monolith2"):
        assert s["fd_minus_first"] == 0 and s["kid_minus_first"] == 0, s
for name, evals in (("monolith", 2), ("learned:top1", 2), ("uniform:full", 4), ("centroid:top2", 4),
                    ("learned+prior:top1", 2), ("uniform+prior:top2", 4)):
    assert e[name]["evals_per_sample"] == evals, (name, e[name]["evals_per_sample"])
assert e["learned:top1"]["router_evals_per_sample"] == 2, e["learned:top1"]
for x in j["entries"]:
    assert 0 <= x["coverage_bits"] <= math.log2(10) + 1e-9, x
# the routing along t: uniform over 2 experts is 1 bit at every evaluation, identical experts do
# not disagree, uniform scores never switch; monoliths are not routed
u = e["uniform:full"]["route"]
assert u["t"] == [1.0, 0.5], u
assert all(abs(h - 1) < 1e-6 for h in u["entropy_bits"]), u
assert all(abs(p - 0.5) < 1e-6 for p in u["top_p"]), u
assert all(s < 1e-9 for s in u["spread"]), u
assert u["switch_rate"][0] is None and u["switch_rate"][1] == 0, u
assert "route" not in e["monolith"]
for name in ("learned:top1", "learned+prior:top1"):
    r = e[name]["route"]
    assert all(0 <= h <= 1 + 1e-6 for h in r["entropy_bits"]), r
    assert all(0 <= s <= 1 for s in r["switch_rate"][1:]), r
PYEOF
grep -q "<svg" "$dir/r.html" || fail "the report has no chart"
grep -q "Routing entropy" "$dir/r.html" || fail "the report has no routing along t"
[ "$(grep -o 'data:image/png;base64' "$dir/r.html" | wc -l)" -eq 7 ] ||
    fail "the report should hold one grid per entry (7)"
grep -q "Quality against cost" "$dir/r.html" || fail "the report has no frontier"
grep -q "Every judge" "$dir/r.html" && grep -q "ae seed" "$dir/r.html" || fail "the report has no judges' tables"
# the saved samples: Fashion-MNIST's IDX format, equal where the samples are equal
for x in monolith learned_top1 learned+prior_top1 monolith2; do
    [ -s "$dir/samples/$x-images-idx3-ubyte" ] && [ -s "$dir/samples/$x-labels-idx1-ubyte" ] ||
        fail "eval --save-samples: no $x"
done
cmp -s "$dir/samples/monolith-images-idx3-ubyte" "$dir/samples/learned_top1-images-idx3-ubyte" ||
    fail "eval --save-samples: equal samples saved differently"
[ "$(wc -c <"$dir/samples/monolith-images-idx3-ubyte")" -eq $((16 + 24 * 784)) ] ||
    fail "eval --save-samples: not 24 images of 28×28 behind a 16-byte header"

# guidance: exact mixture guidance and a router temperature over two identical experts are that
# expert's own guided samples; exact top1 runs one forward per half, exact full every expert on both
"$T" eval --local "$dir/same" --classifier "$dir/cls.safetensors" --monolith "$dir/mono.safetensors" \
    --policies "monolith learned+prior+exact:top1 uniform+prior+exact:full learned+temp=2.5:top1" \
    --cfg 2 --n 24 --steps 2 --sampler euler --ref-n 200 --bootstrap 0 --json \
    >"$dir/g2.json" 2>"$dir/err.txt" || { cat "$dir/err.txt"; fail "eval --cfg 2"; }
"$PY" - "$dir/g2.json" <<'PYEOF' || fail "eval with exact guidance"
import json, sys
j = json.load(open(sys.argv[1]))
e = {x["policy"]: x for x in j["entries"]}
mono = e["monolith"]["fd"]
for name, evals in (("monolith", 4), ("learned+prior+exact:top1", 4),
                    ("uniform+prior+exact:full", 8), ("learned+temp=2.5:top1", 4)):
    assert abs(e[name]["fd"] - mono) < 1e-6 * max(1, mono), (name, e[name]["fd"], mono)
    assert e[name]["evals_per_sample"] == evals, (name, e[name]["evals_per_sample"])
PYEOF
# a label-aware router: trained, calibrated, and routing the same identical experts
run "$T" train-router --partition "$f" --label-aware --label-dropout 0.2 --steps 2 --batch 8 \
    --eval-n 16 --patch 7 --depth 1 --out "$dir/r-label.safetensors"
grep -q '"num_labels":"10"' "$dir/r-label.safetensors" || fail "the label-aware router has no num_labels"
run "$T" calibrate --router "$dir/r-label.safetensors" --partition "$f" --n 20
mkdir "$dir/lab"
cp "$dir/same"/expert-*.safetensors "$f/partition.safetensors" "$dir/lab/"
cp "$dir/r-label.safetensors" "$dir/lab/router.safetensors"
"$T" eval --local "$dir/lab" --classifier "$dir/cls.safetensors" --monolith "$dir/mono.safetensors" \
    --policies "monolith learned:top1 learned+exact:top1" --cfg 2 --n 24 --steps 2 --sampler euler \
    --ref-n 200 --bootstrap 0 --json >"$dir/lab.json" 2>"$dir/err.txt" ||
    { cat "$dir/err.txt"; fail "eval with a label-aware router"; }
"$PY" - "$dir/lab.json" <<'PYEOF' || fail "eval with a label-aware router: results"
import json, sys
e = {x["policy"]: x for x in json.load(open(sys.argv[1]))["entries"]}
for name in ("learned:top1", "learned+exact:top1"):
    assert abs(e[name]["fd"] - e["monolith"]["fd"]) < 1e-6 * max(1, e["monolith"]["fd"]), name
# exact guidance asks the router twice per evaluation (with and without the labels)
assert e["learned+exact:top1"]["router_evals_per_sample"] == 4, e["learned+exact:top1"]
PYEOF
if "$T" train-router --partition "$f" --label-dropout 0.2 --steps 1 --out "$dir/x.safetensors" \
    2>"$dir/err.txt"; then
    fail "train-router took --label-dropout without --label-aware"
fi
for bad in "learned+temp=0:top1" "learned+temp=x:top1" "learned+exact+nope:top1"; do
    if "$T" eval --local "$dir/same" --classifier "$dir/cls.safetensors" --policies "$bad" \
        --n 24 --steps 1 >/dev/null 2>"$dir/err.txt"; then
        fail "eval --policies '$bad' was accepted"
    fi
    grep -q "is not a policy" "$dir/err.txt" || fail "eval --policies '$bad': $(cat "$dir/err.txt")"
done

# train-router's expert objectives, through the folder's (identical) experts
for obj in alignment mixture; do
    run "$T" train-router --partition "$f" --objective "$obj" --experts "$dir/same" --steps 2 \
        --batch 8 --eval-n 16 --patch 7 --depth 1 --out "$dir/r-$obj.safetensors"
    grep -q "\"objective\":\"$obj\"" "$dir/r-$obj.safetensors" ||
        fail "train-router --objective $obj: not recorded in the file"
done
"$T" train-router --partition "$f" --objective alignment --steps 2 --out "$dir/x.safetensors" \
    2>/dev/null && fail "train-router --objective alignment without --experts was accepted"

# loss: experts identical to the monolith give its losses exactly, on every cluster
"$T" loss --local "$dir/same" --monolith "$dir/mono.safetensors" --per-cluster 5 --t 0.2,0.7 \
    --json >"$dir/l.json" 2>"$dir/err.txt" || { cat "$dir/err.txt"; fail "loss"; }
"$PY" - "$dir/l.json" <<'PYEOF' || fail "loss results"
import json, math, sys
j = json.load(open(sys.argv[1]))
assert j["models"] == ["expert-0", "expert-1", "monolith"], j["models"]
assert j["t"] == [0.2, 0.7] or [round(t, 6) for t in j["t"]] == [0.2, 0.7], j["t"]
assert len(j["clusters"]) == 2
for c in j["clusters"]:
    assert c["images"] == 5, c
    e0, e1, m = c["loss"]
    assert e0 == e1 == m and math.isfinite(m) and m > 0, c
    assert len(c["loss_by_t"][0]) == 2 and c["loss_by_t"][0] == c["loss_by_t"][2], c
    assert abs(sum(c["loss_by_t"][2]) / 2 - m) < 1e-12, c
PYEOF
echo "ok: partition, train --partition, train-router, train-classifier, generate --local, eval, loss"

# an expert of a DDPM objective: sample (one model, no conversion) refuses it and says where to go;
# generate --local converts its answers (an epsilon expert beside a velocity one)
"$PY" "$(dirname "$0")/st_set_meta.py" "$f/expert-1.safetensors" "$dir/eps.safetensors" objective=epsilon ||
    fail "could not write an epsilon expert"
if "$T" sample --weights "$dir/eps.safetensors" --n 2 --steps 2 --out "$dir/s.png" 2>"$dir/err.txt"; then
    fail "sample took an epsilon expert as a velocity one"
fi
grep -q "is a DDPM expert (objective epsilon): sample it with .tessera generate --local" "$dir/err.txt" ||
    fail "sample's refusal: $(cat "$dir/err.txt")"
mkdir -p "$dir/mixed"
cp "$f/partition.safetensors" "$f/expert-0.safetensors" "$dir/mixed/"
cp "$dir/eps.safetensors" "$dir/mixed/expert-1.safetensors"
"$T" generate --local "$dir/mixed" --n 4 --steps 3 --sampler ddim --policy uniform --select full \
    --out "$dir/mixed.png" 2>"$dir/err.txt" || { cat "$dir/err.txt"; fail "generate with a mixed ensemble"; }
# eval refuses it with heun (its default) by generate's sentence, not a bare code
if "$T" eval --local "$dir/mixed" --classifier "$dir/cls.safetensors" --n 8 --policies uniform \
    --steps 2 2>"$dir/err.txt"; then
    fail "eval asked an epsilon expert at pure noise"
fi
grep -q "expert 1 of .* is a DDPM expert (objective epsilon).*use --sampler ddim or ddpm" \
    "$dir/err.txt" || fail "eval's refusal: $(cat "$dir/err.txt")"
echo "ok: a DDPM expert: sample refuses it, generate --local mixes it with a flow expert (ddim), eval says why not with heun"
