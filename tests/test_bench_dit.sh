#!/bin/sh
# test_bench_dit.sh TESSERA BENCH_DIT — bench_dit's command line: a quick CPU run with --peak
# gives JSON whose rows and peak are positive and whose device is the CPU; --device with a GPU
# that cannot start exits 1 with the reason (checked where no GPU can start), and a device name
# it does not know exits 2. The measurements themselves are docs/benchmarks.md's.
set -eu
T=${1:?usage: test_bench_dit.sh TESSERA BENCH_DIT}
B=${2:?usage: test_bench_dit.sh TESSERA BENCH_DIT}
. "$(dirname "$0")/lib.sh"
"$T" partition --experts 2 --restarts 1 --max-iter 5 --seed 1 --out "$dir/p" >/dev/null 2>&1 ||
    fail "tessera partition"
"$T" train --partition "$dir/p" --cluster 0 --model tiny --steps 1 --batch 4 --seed 0 \
    --data-dir "$dir/st" --out "$dir/w.safetensors" >/dev/null 2>&1 || fail "tessera train"

"$B" --weights "$dir/w.safetensors" --threads 2 --quick --batch 2 --train-batch 2 --peak 256 \
    --json >"$dir/b.json" 2>"$dir/err.txt" || { cat "$dir/err.txt" >&2; fail "bench_dit --peak"; }
"$PY" - "$dir/b.json" <<'PY' || fail "bench_dit JSON: $(head -c 600 "$dir/b.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["device"].startswith("cpu, 2 thread"), d["device"]
assert [(r["what"], r["batch"]) for r in d["results"]] == [("forward", 2), ("train", 2)]
assert all(r["samples_per_s"] > 0 and r["gflops"] > 0 for r in d["results"])
assert d["peak"]["size"] == 256 and d["peak"]["f32_gflops"] > 0 and "bf16_gflops" in d["peak"]
PY
echo "ok: bench_dit --peak: JSON with the rows, the device and the engine's GEMM peak"

rc=0
"$B" --weights "$dir/w.safetensors" --device gpu --quick >/dev/null 2>"$dir/err.txt" || rc=$?
[ "$rc" = 2 ] && grep -q "device wants" "$dir/err.txt" || fail "--device gpu: exit $rc, $(cat "$dir/err.txt")"
rc=0
"$B" --weights "$dir/w.safetensors" --device cuda --quick --batch 1 --train-batch 0 \
    >/dev/null 2>"$dir/err.txt" || rc=$?
if [ "$rc" = 0 ]; then
    echo "ok: --device cuda ran (a GPU is here)"
else
    [ "$rc" = 1 ] && grep -q "cannot start the engine: cuda:0" "$dir/err.txt" ||
        fail "--device cuda without a GPU: exit $rc, $(cat "$dir/err.txt")"
    echo "ok: --device cuda without a GPU: exit 1, '$(cut -c1-100 "$dir/err.txt")'"
fi

# --ops with its neighbours' arguments (it takes none itself)
"$B" --weights "$dir/w.safetensors" --threads 2 --quick --batch 2 --train-batch 0 --ops \
    --seconds 0.3 >"$dir/ops.txt" 2>"$dir/err.txt" || fail "--ops --seconds 0.3: $(cat "$dir/err.txt")"
grep -q "^  attention " "$dir/ops.txt" && grep -q "^  rest " "$dir/ops.txt" ||
    fail "--ops printed no breakdown: $(cat "$dir/ops.txt")"
grep -q "0.3s per measurement" "$dir/ops.txt" || fail "--seconds after --ops was not read"
echo "ok: --ops parses the arguments around it and prints each op"

# --attention measure: the forward rows' attention chosen by ts_dit_tune (and reported)
"$B" --weights "$dir/w.safetensors" --threads 2 --quick --batch 2 --batch 4 --train-batch 2 \
    --attention measure --json >"$dir/t.json" 2>"$dir/err.txt" ||
    fail "--attention measure: $(cat "$dir/err.txt")"
grep -q "measured at batch 4: " "$dir/err.txt" || fail "--attention measure said: $(cat "$dir/err.txt")"
"$PY" - "$dir/t.json" <<'PY' || fail "--attention measure JSON: $(head -c 900 "$dir/t.json")"
import json, sys
d = json.load(open(sys.argv[1]))
t = d["measured"]
assert t["batch"] == 4 and t["ms_composed"] > 0 and t["ms_fused"] > 0, t
assert 0 <= t["fused_diff"] <= 1e-3, t
assert not t["graphs_measured"] and not t["epilogues_measured"], t  # a CPU has neither
assert d["attention"] == t["attention"], (d["attention"], t)
assert [(r["what"], r["batch"]) for r in d["results"]] == [("forward", 2), ("forward", 4), ("train", 2)]
PY
echo "ok: --attention measure chooses the forward rows' attention and reports the times"

# the memory figures up front, and a row that cannot fit refused before anything is built
"$B" --weights "$dir/w.safetensors" --memory --json --batch 64 --train-batch 8 >"$dir/m.json" ||
    fail "--memory --json"
"$PY" - "$dir/m.json" <<'PY' || fail "--memory JSON: $(cat "$dir/m.json")"
import json, sys
d = json.load(open(sys.argv[1]))
m = d["memory"]
assert m["params_bytes"] >= 4 * 1275408, m  # tiny's parameters in fp32
assert m["forward_bytes"] == m["params_bytes"] + m["inference_fixed_bytes"] + 64 * m["inference_per_sample_bytes"], m
assert m["train_bytes"] == (m["params_bytes"] + m["grads_bytes"] + m["adamw_bytes"] + m["ema_bytes"]
                            + m["training_fixed_bytes"] + 8 * m["training_per_sample_bytes"]), m
assert m["training_per_sample_bytes"] > m["inference_per_sample_bytes"] > 0, m
assert m["device_total_bytes"] >= m["device_usable_bytes"] > 0, m
rows = {(r["what"], r["batch"]): r for r in d["rows"]}
assert set(rows) == {("forward", 64), ("train", 8)}, rows
assert rows[("train", 8)]["bytes"] == m["train_bytes"] and rows[("forward", 64)]["bytes"] == m["forward_bytes"]
assert all(r["fits"] for r in rows.values()), rows  # a tiny model fits any machine this runs on
PY
rc=0
"$B" --weights "$dir/w.safetensors" --quick --batch 2 --train-batch 60000 >"$dir/o.txt" \
    2>"$dir/err.txt" || rc=$?
[ "$rc" = 1 ] && grep -q "training row at batch 60000 needs .* GiB; the device has .* GiB usable" \
    "$dir/err.txt" || fail "an oversized training row: exit $rc, $(cat "$dir/err.txt")"
grep -q "^forward  B=2" "$dir/o.txt" || fail "the forward row did not run before the refusal"
echo "ok: --memory; a training row that cannot fit says what it needs and what is free"
