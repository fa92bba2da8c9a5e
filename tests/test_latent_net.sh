#!/bin/sh
# test_latent_net.sh TESSERA TESSERAD — latent experts on a network, end to end, on data made here
# (tests/latent_fixture.py: tinted Fashion-MNIST images, two small random VAEs):
#   - `tessera encode` names the latent space (the VAE file's BLAKE2b-256) in the data set;
#   - `tessera partition --latents` clusters the latents, `tessera train --latents --partition`
#     trains an expert per cluster (and refuses latents the partition was not made from), and
#     the weights carry the latent space;
#   - a tesserad in train mode on the latents ([train] latents) trains its cluster's expert, and
#     the weights it writes carry the latent space;
#   - one expert is made a DDPM epsilon expert (its metadata), the other stays a flow expert;
#   - two tesserad nodes (`tessera up`) host them: their adverts carry each objective and the
#     latent space (status --json);
#   - `generate --peer --vae` writes the RGB PNG `generate --local --vae` writes, byte for byte:
#     the client asks the epsilon expert at DDPM time and converts its answers, as locally;
#   - with an imported learned-σ epsilon expert, `generate --peer --sampler ddpm` asks it for its
#     variance (its advert says learn_sigma) and equals --local byte for byte;
#   - refused with the reason: a VAE of another latent space (--peer, --local and sample, before
#     any sampling), a folder mixing experts of two latent spaces, a network whose experts of one
#     partition work in two spaces.
set -eu
T=${1:?usage: test_latent_net.sh TESSERA TESSERAD}
D=${2:?usage: test_latent_net.sh TESSERA TESSERAD}
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
nets="$dir/net $dir/net2 $dir/net3" logs="$dir/err*.txt $dir/*.log" log_lines=20

"$PY" "$here/latent_fixture.py" "$dir" "$here/parity" 40 5 6 || fail "making the images and VAEs"
V=$dir/vae-5.safetensors V2=$dir/vae-6.safetensors
space=$("$PY" -c "import hashlib,sys; print(hashlib.blake2b(open(sys.argv[1],'rb').read(), digest_size=32).hexdigest())" "$V")

run "$T" encode "$dir/img" --vae "$V" --out "$dir/lat.safetensors" --quiet
"$PY" - "$dir/lat.safetensors" "$space" <<'PYEOF' || fail "the latent data set's latent space"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
m = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"]
assert m["latent_space"] == sys.argv[2], m
PYEOF
echo "ok: encode names the latent space"

F=$dir/experts
run "$T" partition --latents "$dir/lat.safetensors" --experts 2 --dims 8 --restarts 1 \
    --max-iter 5 --seed 1 --out "$F" --json
case "$(json_get "$dir/out.txt" "j['dataset']")" in
tessera-latents:*) ;;
*) fail "partition --latents: dataset $(json_get "$dir/out.txt" "j['dataset']")" ;;
esac
[ ! -e "$F/clusters.png" ] || fail "partition --latents drew latents as pictures"
for k in 0 1; do
    run "$T" train --latents "$dir/lat.safetensors" --partition "$F" --cluster $k --model small \
        --steps 2 --batch 4 --seed $k --data-dir "$dir/st" --out "$F/expert-$k.safetensors"
done
"$PY" - "$F" "$space" <<'PYEOF' || fail "the experts' metadata"
import json, struct, sys
for k in (0, 1):
    b = open(f"{sys.argv[1]}/expert-{k}.safetensors", "rb").read()
    m = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"]
    assert m["latent_space"] == sys.argv[2] and m["cluster"] == str(k) and m["partition_id"], m
    assert m["in_channels"] == "4" and m["input_size"] == "14", m
PYEOF
# latents of another data set (here: another VAE's) are not the partition's: refused
run "$T" encode "$dir/img" --vae "$V2" --out "$dir/lat2.safetensors" --quiet
if "$T" train --latents "$dir/lat2.safetensors" --partition "$F" --cluster 0 --model small \
    --steps 1 --batch 4 --data-dir "$dir/st" --out "$dir/x.safetensors" 2>"$dir/err-x.txt"; then
    fail "train --partition took latents the partition was not made from"
fi
grep -q "not the data set it partitions" "$dir/err-x.txt" || fail "the refusal: $(cat "$dir/err-x.txt")"
# a node trains a latent expert itself: [train] latents, the weights written carry the space
run "$T" keygen --network-key --out "$dir/tk.key"
mkdir -p "$dir/tn"
run "$T" keygen --out "$dir/tn/id.key"
{
    node_section tn "" "$dir/tk.key"
    cat <<INI
[expert]
mode = train
partition = $F/partition.safetensors
cluster = 1
weights = $dir/trained.safetensors
[train]
model = small
latents = $dir/lat.safetensors
steps = 3
batch = 4
ckpt_every = 3
threads = 1
[metrics]
listen =
[log]
file = $dir/tn.log
INI
} >"$dir/tn/d.ini"
start_node tn
wait_log "$dir/tn.log" "done: 3 steps" 180
"$PY" - "$dir/trained.safetensors" "$space" <<'PYEOF' || fail "the daemon's latent expert"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
m = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"]
assert m["latent_space"] == sys.argv[2] and m["cluster"] == "1" and m["in_channels"] == "4", m
PYEOF
kill "$(cat "$dir/tn/pid")" 2>/dev/null || true
echo "ok: a daemon trains a latent expert ([train] latents); its weights carry the latent space"

mv "$F/expert-1.safetensors" "$dir/flow-1.safetensors"
"$PY" "$here/st_set_meta.py" "$dir/flow-1.safetensors" "$F/expert-1.safetensors" \
    objective=epsilon || fail "could not write an epsilon expert"
echo "ok: partition --latents and train --latents --partition; the weights carry the latent space"

GEN="--n 6 --steps 3 --sampler ddim --cfg 1.5 --seed 3 --policy uniform --select full"
run "$T" generate --local "$F" $GEN --vae "$V" --out "$dir/local.png"
"$PY" - "$dir/local.png" <<'PYEOF' || fail "the local image"
import struct, sys
b = open(sys.argv[1], "rb").read()
w, h, depth, color = struct.unpack(">IIBB", b[16:26])
assert b[:8] == b"\x89PNG\r\n\x1a\n" and (depth, color) == (8, 2) and w > 28 and h > 28, (w, h, depth, color)
PYEOF
if "$T" generate --local "$F" $GEN --vae "$V2" --out "$dir/bad.png" 2>"$dir/err-v2.txt"; then
    fail "generate --local took a VAE of another latent space"
fi
grep -q "not their VAE" "$dir/err-v2.txt" || fail "the refusal: $(cat "$dir/err-v2.txt")"
[ ! -e "$dir/bad.png" ] || fail "a refused VAE still wrote an image"
if "$T" sample --weights "$F/expert-0.safetensors" --vae "$V2" --n 2 --steps 2 \
    --out "$dir/bad.png" 2>"$dir/err-s.txt"; then
    fail "sample took a VAE of another latent space"
fi
grep -q "not their VAE" "$dir/err-s.txt" || fail "sample's refusal: $(cat "$dir/err-s.txt")"
mkdir "$dir/mix"
cp "$F/partition.safetensors" "$F/expert-0.safetensors" "$dir/mix/"
"$PY" "$here/st_set_meta.py" "$dir/flow-1.safetensors" "$dir/mix/expert-1.safetensors" \
    latent_space=$(printf '%064d' 7) || fail "could not write an expert of another space"
if "$T" generate --local "$dir/mix" $GEN --out "$dir/bad.png" 2>"$dir/err-mix.txt"; then
    fail "generate --local mixed two latent spaces"
fi
grep -q "must share their latent space" "$dir/err-mix.txt" ||
    fail "the mix's refusal: $(cat "$dir/err-mix.txt")"
echo "ok: a VAE of another latent space and a folder of two spaces are refused, before sampling"

"$T" up --nodes 2 --experts "$F" --dir "$dir/net" --json >"$dir/net.json" 2>"$dir/err-up.txt" ||
    fail "tessera up"
peer=$(json_get "$dir/net.json" "j['peer']")
key=$dir/net/network.key
"$T" status --peer "$peer" --network-key "$key" --json >"$dir/st.json" || fail "status"
"$PY" - "$dir/st.json" "$space" <<'PYEOF' || fail "the adverts"
import json, sys
j = json.load(open(sys.argv[1]))
ads = [a for a in j["adverts"] if a.get("valid")]
assert len(ads) == 2, ads
assert sorted(a["objective"] for a in ads) == ["epsilon", "velocity"], ads
assert all(a["latent_space"] == sys.argv[2] for a in ads), ads
PYEOF
echo "ok: the nodes advertise each expert's objective and the latent space"
"$T" generate --peer "$peer" --network-key "$key" --data-dir "$dir/cache" $GEN --vae "$V" \
    --out "$dir/net.png" --json >"$dir/gen.json" 2>"$dir/err-gen.txt" || fail "generate --peer"
cmp -s "$dir/net.png" "$dir/local.png" || fail "the network's image differs from --local's"
[ "$(json_get "$dir/gen.json" "j['network']['degraded_evaluations']")" = 0 ] ||
    fail "the network degraded"
if "$T" generate --peer "$peer" --network-key "$key" --data-dir "$dir/cache" $GEN --vae "$V2" \
    --out "$dir/bad.png" 2>"$dir/err-pv2.txt"; then
    fail "generate --peer took a VAE of another latent space"
fi
grep -q "not their VAE" "$dir/err-pv2.txt" || fail "the refusal: $(cat "$dir/err-pv2.txt")"
echo "ok: generate --peer --vae (an epsilon and a flow expert on two nodes) = --local, byte for byte"

# DDPM with DiT's learned σ over the network: an imported epsilon expert with learned σ (DiT's
# published layout, random weights) beside the flow expert, two replicas of each; its nodes
# advertise learn_sigma, the client asks them for the variance with every answer, checks every
# answer against the other replica's, and the PNG equals --local's
"$T" down --dir "$dir/net" --timeout 10 >/dev/null 2>&1 || true
"$PY" "$here/parity/dit_torch.py" sigma-checkpoint "$dir/sig.pt" --input-size 14 --in-channels 4 ||
    fail "making a learned-sigma checkpoint"
S=$dir/sig
mkdir -p "$S"
cp "$F/partition.safetensors" "$F/expert-0.safetensors" "$S/"
run "$T" import "$dir/sig.pt" --heads 4 --vae "$V" --partition "$F" --cluster 1 \
    --out "$S/expert-1.safetensors" --quiet
DDPM="--n 4 --steps 4 --sampler ddpm --cfg 1.5 --seed 5 --policy uniform --select full --vae $V"
run "$T" generate --local "$S" $DDPM --json --out "$dir/sig-local.png"
[ "$(json_get "$dir/out.txt" "j['ddpm_variance']")" = learned ] ||
    fail "--local ddpm's variance: $(cat "$dir/out.txt")"
"$T" up --nodes 4 --experts "$S" --dir "$dir/net3" --json >"$dir/net3.json" 2>"$dir/err-up3.txt" ||
    fail "tessera up (learned σ)"
peer=$(json_get "$dir/net3.json" "j['peer']")
"$T" status --peer "$peer" --network-key "$dir/net3/network.key" --json >"$dir/st3.json" ||
    fail "status (learned σ)"
"$PY" - "$dir/st3.json" <<'PYEOF' || fail "the learned-sigma advert"
import json, sys
ads = [a for a in json.load(open(sys.argv[1]))["adverts"] if a.get("valid")]
assert sorted(bool(a["model"].get("learn_sigma")) for a in ads) == [False, False, True, True], ads
PYEOF
"$T" generate --peer "$peer" --network-key "$dir/net3/network.key" --data-dir "$dir/cache3" \
    $DDPM --verify 1 --json --out "$dir/sig-net.png" >"$dir/gen3.json" 2>"$dir/err-gen3.txt" ||
    fail "generate --peer (learned σ): $(cat "$dir/err-gen3.txt")"
cmp -s "$dir/sig-net.png" "$dir/sig-local.png" || fail "the network's DDPM image differs from --local's"
[ "$(json_get "$dir/gen3.json" "j['ddpm_variance']")" = learned ] ||
    fail "--peer ddpm's variance: $(cat "$dir/gen3.json")"
[ "$(json_get "$dir/gen3.json" "j['network']['degraded_evaluations']")" = 0 ] ||
    fail "the network degraded (learned σ)"
# two replicas of each: every answer (velocity and variance) checked against the other's, exactly
"$PY" - "$dir/gen3.json" <<'PYEOF' || fail "the checks of answers with their variance"
import json, sys
c = json.load(open(sys.argv[1]))["network"]["checks"]
assert c["checked"] > 0 and c["agreed"] == c["checked"] and c["disagreed"] == 0, c
PYEOF
"$T" down --dir "$dir/net3" --timeout 10 >/dev/null 2>&1 || true
echo "ok: generate --peer --sampler ddpm takes a learned-σ expert's variance over the network: = --local, byte for byte"

# a network whose experts of one partition work in two latent spaces: refused by the client
cp "$dir/mix/expert-1.safetensors" "$F/expert-1.safetensors"
"$T" down --dir "$dir/net" --timeout 10 >/dev/null 2>&1 || true
"$T" up --nodes 2 --experts "$F" --dir "$dir/net2" --json >"$dir/net2.json" 2>"$dir/err-up2.txt" ||
    fail "tessera up (two spaces)"
peer=$(json_get "$dir/net2.json" "j['peer']")
if "$T" generate --peer "$peer" --network-key "$dir/net2/network.key" --data-dir "$dir/cache2" \
    $GEN --out "$dir/bad.png" 2>"$dir/err-two.txt"; then
    fail "generate --peer mixed two latent spaces"
fi
grep -q "do not share a latent space" "$dir/err-two.txt" ||
    fail "the network's refusal: $(cat "$dir/err-two.txt")"
echo "ok: a network of two latent spaces in one partition is refused, naming both"
