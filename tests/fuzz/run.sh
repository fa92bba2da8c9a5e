#!/usr/bin/env bash
# tests/fuzz/run.sh SECONDS — build the libFuzzer harnesses in build-fuzz/ (clang,
# -DTESSERA_FUZZ=ON, ASan + UBSan) and run each for SECONDS (default 30), JOBS (default 2) at a
# time, keeping a corpus per harness in build-fuzz/corpus/<name>/. An empty corpus is seeded
# first: configs/tesserad.ini for the config parser, and a few small valid inputs written here
# (a partition file, a router file, an IDX pair, a ping datagram and an empty full state, a
# torch.save file when PyTorch is there), since the demo files are larger than -max_len. Prints
# each harness's executions; exits non-zero when a harness finds a crash (the reproducer is left
# in build-fuzz/, named crash-*).
set -euo pipefail
secs="${1:-30}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$root/build-fuzz"
jobs="${JOBS:-2}"
harnesses=(fuzz_frame fuzz_envelope fuzz_handshake fuzz_gossip_datagram fuzz_gossip_node
           fuzz_safetensors fuzz_partition fuzz_idx fuzz_config fuzz_torch_pt)
command -v clang >/dev/null || { echo "run.sh: clang not found (apt-get install clang libclang-rt-dev, or scripts/setup.sh --all)" >&2; exit 1; }
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
    -DTESSERA_CUDA=OFF -DTESSERA_FUZZ=ON >/dev/null
cmake --build "$build" -j"$jobs" --target "${harnesses[@]}" >/dev/null

# Bytes: le32/le64/be32 N print N in 4 or 8 bytes, little- or big-endian; zeros N prints N zero
# bytes.
le() { local n=$1 i; for ((i = 0; i < $2; i++)); do printf '%b' "\\0$(printf %03o $((n >> 8 * i & 255)))"; done; }
le32() { le "$1" 4; }
le64() { le "$1" 8; }
be32() { local n=$1 i; for ((i = 3; i >= 0; i--)); do printf '%b' "\\0$(printf %03o $((n >> 8 * i & 255)))"; done; }
zeros() { head -c "$1" /dev/zero; }

# A partition of one image into one cluster, with a one-dimensional embedding.
tiny_partition() {
    local hdr='{"__metadata__":{"format":"tessera-partition/1","embed":"pca1","experts":"1",'
    hdr+='"dims":"1","seed":"0","restarts":"1","hierarchical":"0","inertia":"0",'
    hdr+='"explained_variance":"1","dataset":"seed","n":"1"},'
    hdr+='"basis":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]},'
    hdr+='"mean":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},'
    hdr+='"centroids":{"dtype":"F32","shape":[1,1],"data_offsets":[8,12]},'
    hdr+='"assignment":{"dtype":"I32","shape":[1],"data_offsets":[12,16]},'
    hdr+='"sizes":{"dtype":"I32","shape":[1],"data_offsets":[16,20]}}'
    le64 ${#hdr}; printf '%s' "$hdr"
    le32 0x3f800000; zeros 12; le32 1 # basis 1.0, mean 0, centroid 0, assignment 0, sizes 1
}

# A router (a classifier file) with the smallest trunk there is, its weights all zero: 1×1 images,
# hidden size 4, one block, two outputs. Tensors as model/dit.c's table, without final_layer.*.
tiny_router() {
    local specs=("x_embedder.proj.weight 4,1,1,1" "x_embedder.proj.bias 4"
        "t_embedder.mlp.0.weight 4,2" "t_embedder.mlp.0.bias 4" "t_embedder.mlp.2.weight 4,4"
        "t_embedder.mlp.2.bias 4" "y_embedder.embedding_table.weight 2,4"
        "blocks.0.attn.qkv.weight 12,4" "blocks.0.attn.qkv.bias 12"
        "blocks.0.attn.proj.weight 4,4" "blocks.0.attn.proj.bias 4" "blocks.0.mlp.fc1.weight 4,4"
        "blocks.0.mlp.fc1.bias 4" "blocks.0.mlp.fc2.weight 4,4" "blocks.0.mlp.fc2.bias 4"
        "blocks.0.adaLN_modulation.1.weight 24,4" "blocks.0.adaLN_modulation.1.bias 24"
        "head.weight 2,4" "head.bias 2")
    local hdr='{"__metadata__":{"format":"tessera-classifier/1","input_size":"1","patch_size":"1",'
    hdr+='"in_channels":"1","hidden_size":"4","depth":"1","num_heads":"1","num_classes":"1",'
    hdr+='"mlp_ratio":"1","freq_dim":"2","num_outputs":"2","time_conditioned":"1",'
    hdr+='"partition_id":"seed"}'
    local off=0 s name shape n d
    for s in "${specs[@]}"; do
        name=${s% *} shape=${s#* } n=1
        for d in ${shape//,/ }; do n=$((n * d)); done
        hdr+=",\"$name\":{\"dtype\":\"F32\",\"shape\":[$shape],\"data_offsets\":[$off,$((off + 4 * n))]}"
        off=$((off + 4 * n))
    done
    hdr+='}'
    le64 ${#hdr}; printf '%s' "$hdr"; zeros $off
}

# Seeds an empty corpus directory.
seed() {
    local h=$1 dir="$build/corpus/$1"
    [ -z "$(ls -A "$dir")" ] || return 0
    case $h in
    fuzz_config) cp "$root/configs/tesserad.ini" "$dir/tesserad.ini" ;;
    fuzz_safetensors | fuzz_partition)
        tiny_partition >"$dir/partition"
        tiny_router >"$dir/router" ;;
    fuzz_idx) # 2-byte length of the labels file, the labels file, the images file
        { printf '\000\011'; be32 0x801; be32 1; printf '\005'
          be32 0x803; be32 1; be32 2; be32 2; printf '\000\100\200\377'; } >"$dir/pair" ;;
    fuzz_gossip_datagram)
        { printf '\001\001'; zeros 32; be32 7; zeros 32; printf '\000'; } >"$dir/ping"
        { printf '\001\006'; zeros 32; printf '\000'; be32 0; } >"$dir/state" ;;
    fuzz_torch_pt) # a small state dict as torch.save writes it (when there is a torch to write it)
        "${TESSERA_PYTHON:-/usr/bin/python3}" -c 'import sys, torch, collections
sd = collections.OrderedDict(w=torch.arange(6.0).reshape(2, 3).t(), b=torch.ones(2).half())
torch.save({"ema": sd, "step": 3}, sys.argv[1])' "$dir/pt" 2>/dev/null || true ;;
    fuzz_gossip_node) # the first byte odd: sealed with the network key (fuzz_gossip_node.c)
        { printf '\001\001\001'; zeros 32; be32 7; zeros 32; printf '\000'; } >"$dir/ping" ;;
    esac
}

# One harness: its run, then its line (and on a crash the end of its log) into $build/$h.result.
run_one() {
    local h=$1 log="$build/$1.log"
    if (cd "$build" && "$build/tests/fuzz/$h" -max_total_time="$secs" -rss_limit_mb=2048 \
        -max_len=70000 -print_final_stats=1 "$build/corpus/$h" >"$log" 2>&1); then
        runs="$(grep -o 'Done [0-9]* runs' "$log" | tail -n1 | awk '{print $2}')"
        echo "$h: ${runs:-?} executions in ${secs} s, no crash"
    else
        echo "$h: FAILED (see $log)"
        tail -n 30 "$log"
        return 1
    fi
}

# The harnesses run JOBS at a time (each is one process on one core: the same seconds each, in
# less wall time); their lines come out in order.
status=0
running=() names=()
finish_first() {
    wait "${running[0]}" || status=1
    cat "$build/${names[0]}.result"
    running=("${running[@]:1}") names=("${names[@]:1}")
}
for h in "${harnesses[@]}"; do
    mkdir -p "$build/corpus/$h"
    seed "$h"
    run_one "$h" >"$build/$h.result" 2>&1 &
    running+=($!) names+=("$h")
    [ "${#running[@]}" -lt "$jobs" ] || finish_first
done
while [ "${#running[@]}" -gt 0 ]; do finish_first; done
exit $status
