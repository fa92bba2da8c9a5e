#!/bin/sh
# test_encode_cli.sh TESSERA — latent training data end to end, on images made here:
#   - twelve RGB PNGs (Fashion-MNIST images tinted, 28×28) and a labels.txt;
#   - a small random VAE written by the PyTorch reference (tests/parity/vae_torch.py);
#   - `tessera encode` writes their latents, which equal the reference encoder's mean × scaling
#     factor within 1e-5, with the labels of labels.txt;
#   - --sample --seed S is the same file twice and another file than the means;
#   - `tessera train --latents` trains a DiT on them whose weights take 4 channels of 14×14;
#   - `tessera sample --vae` decodes that expert's samples into an RGB grid, every pixel within
#     one grey level of the reference decoder's image of the same latents, and `generate --local
#     --vae` over a one-expert folder writes the same file;
#   - a mixed-size folder, a labels.txt naming a missing image, a missing folder, a model whose
#     patches do not divide the latents, a pixel expert given a VAE and a file of another kind
#     are refused, naming the cause.
set -eu
T=${1:?usage: test_encode_cli.sh TESSERA}
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)

"$PY" - "$dir" "$here/parity" "$here" <<'PYEOF' || fail "making the images and the VAE"
import os, sys
d, parity = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
import torch
import latent_fixture as lf
imgs, _ = lf.write_folder(d, 12, "im{:02d}.png")
m, vt = lf.small_vae(parity, 5)
vt.save(m, f"{d}/vae.safetensors")
x = torch.tensor(imgs, dtype=torch.float64).reshape(12, 28, 28, 3).permute(0, 3, 1, 2) / 127.5 - 1
with torch.no_grad():
    mean, _ = m.double().encode(x)
vt.st_write(f"{d}/ref.safetensors", {"mean": mean.float().contiguous()})
# a second folder whose images differ in size
os.mkdir(f"{d}/mixed")
lf.png(f"{d}/mixed/a.png", 28, 28, imgs[0])
lf.png(f"{d}/mixed/b.png", 32, 32, [0] * (32 * 32 * 3))
PYEOF

run "$T" encode "$dir/img" --vae "$dir/vae.safetensors" --out "$dir/lat.safetensors" --json
cp "$dir/out.txt" "$dir/enc.json"
"$PY" - "$dir" "$here/parity" <<'PYEOF' || fail "the latents"
import gzip, json, sys
d, parity = sys.argv[1], sys.argv[2]
sys.path.insert(0, parity)
import vae_torch as vt
j = json.load(open(f"{d}/enc.json"))
assert j["images"] == 12 and j["latent_shape"] == [4, 14, 14] and j["mode"] == "mean", j
t, meta, _ = vt.st_read(f"{d}/lat.safetensors")
ref, _, _ = vt.st_read(f"{d}/ref.safetensors")
err = (t["latents"].double() - ref["mean"].double()).abs().max().item()
print(f"latents against the PyTorch encoder: max |difference| {err:.2e}")
assert err < 1e-5, err
with gzip.open("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz") as f:
    f.read(8); lab = list(f.read(12))
assert t["labels"].tolist() == lab, (t["labels"].tolist(), lab)
assert meta["format"] == "tessera-latents/1" and int(meta["num_classes"]) == max(lab) + 1, meta
assert meta["image_height"] == "28" and meta["mode"] == "mean", meta
PYEOF

run "$T" encode "$dir/img" --vae "$dir/vae.safetensors" --out "$dir/s1.safetensors" --sample --seed 3 --quiet
run "$T" encode "$dir/img" --vae "$dir/vae.safetensors" --out "$dir/s2.safetensors" --sample --seed 3 --quiet
cmp -s "$dir/s1.safetensors" "$dir/s2.safetensors" || fail "--sample --seed 3 twice gave two files"
cmp -s "$dir/s1.safetensors" "$dir/lat.safetensors" && fail "--sample gave the means"
echo "ok: latents equal the reference encoder's; seeded samples repeat"

# --precision f16 (emulated on a CPU): the encoder's products rounded to f16, fp32 accumulation —
# close to the f32 latents, not equal, and the file says so
run "$T" encode "$dir/img" --vae "$dir/vae.safetensors" --out "$dir/l16.safetensors" --precision f16 --quiet
"$PY" - "$dir" "$here/parity" <<'PYEOF' || fail "the f16 latents"
import sys
d, parity = sys.argv[1], sys.argv[2]
sys.path.insert(0, parity)
import vae_torch as vt
a, ma, _ = vt.st_read(f"{d}/lat.safetensors")
b, mb, _ = vt.st_read(f"{d}/l16.safetensors")
err = (a["latents"].double() - b["latents"].double()).abs().max().item()
scale = a["latents"].double().abs().max().item()
print(f"f16 latents against f32: max |difference| {err:.2e} (latents up to {scale:.2f})")
assert 0 < err < 1e-2 * max(1.0, scale), err
assert ma["vae_precision"] == "f32" and mb["vae_precision"] == "f16", (ma, mb)
PYEOF
echo "ok: --precision f16 latents are within f16's rounding of the f32 ones, and say so"

run "$T" train --latents "$dir/lat.safetensors" --model small --steps 3 --batch 4 \
    --data-dir "$dir/store" --out "$dir/expert.safetensors"
"$PY" - "$dir/expert.safetensors" "$here/parity" <<'PYEOF' || fail "the latent expert"
import sys
sys.path.insert(0, sys.argv[2])
import vae_torch as vt
t, meta, _ = vt.st_read(sys.argv[1])
assert meta["in_channels"] == "4" and meta["input_size"] == "14", meta
assert t["x_embedder.proj.weight"].shape[1] == 4, t["x_embedder.proj.weight"].shape
PYEOF
echo "ok: a DiT trained on the latents takes 4 channels of 14x14"

# sampled latents decoded by the VAE into an RGB grid: each pixel within one grey level of the
# reference decoder's image of the same latents
run "$T" sample --weights "$dir/expert.safetensors" --vae "$dir/vae.safetensors" --n 4 --steps 2 \
    --sampler euler --device cpu --out "$dir/grid.png" --out-tensor "$dir/lat4.safetensors"
"$PY" - "$dir" "$here/parity" "$here" <<'PYEOF' || fail "the decoded grid"
import struct, sys, zlib
d, parity = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
import torch
import latent_fixture as lf
m, vt = lf.small_vae(parity, 5)
buf = open(f"{d}/grid.png", "rb").read()
assert buf[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat = 8, b""
while pos < len(buf):
    n, t = struct.unpack(">I4s", buf[pos:pos + 8])
    body = buf[pos + 8:pos + 8 + n]
    if t == b"IHDR":
        w, h, depth, color = struct.unpack(">IIBB", body[:10])
    elif t == b"IDAT":
        idat += body
    pos += 12 + n
assert (w, h, depth, color) == (58, 58, 8, 2), (w, h, depth, color)  # 2×2 tiles of 28, pad 2, RGB
raw, stride, rows, prev = zlib.decompress(idat), w * 3, [], bytearray(w * 3)
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - 3] if i >= 3 else 0
        b, c = prev[i], prev[i - 3] if i >= 3 else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line); prev = line
t, _, _ = vt.st_read(f"{d}/lat4.safetensors")
with torch.no_grad():
    img = m.double().decode(t["x"].double())
worst = 0
for k in range(4):
    oy, ox = (k // 2) * 30, (k % 2) * 30
    for y in range(28):
        for x in range(28):
            for c in range(3):
                v = float(img[k, c, y, x].clamp(-1, 1))
                want = int((v + 1) * 127.5 + 0.5)
                worst = max(worst, abs(rows[oy + y][(ox + x) * 3 + c] - want))
print(f"decoded grid against the reference decoder: max {worst} grey level(s)")
assert worst <= 1, worst
PYEOF
rc=0; "$T" sample --weights "$dir/expert.safetensors" --vae "$dir/expert.safetensors" --n 1 --steps 1 \
    --out "$dir/z.png" 2>"$dir/e0" || rc=$?
[ "$rc" = 1 ] && grep -q "expert.safetensors" "$dir/e0" || fail "an expert as the VAE: exit $rc, $(cat "$dir/e0")"
# the same through generate: a one-expert folder of the latent expert gives sample's grid
mkdir "$dir/one"
cp "$dir/expert.safetensors" "$dir/one/expert-0.safetensors"
run "$T" generate --local "$dir/one" --policy uniform --vae "$dir/vae.safetensors" --n 4 --steps 2 \
    --sampler euler --device cpu --out "$dir/gen.png"
cmp -s "$dir/gen.png" "$dir/grid.png" || fail "generate --vae differs from sample --vae"
run "$T" train --model mini --steps 1 --batch 4 --data-dir "$dir/store" --out "$dir/fm.safetensors"
rc=0; "$T" sample --weights "$dir/fm.safetensors" --vae "$dir/vae.safetensors" --n 1 --steps 1 \
    --out "$dir/z.png" 2>"$dir/e6" || rc=$?
[ "$rc" = 1 ] && grep -q "latents of 4 channels, and .*fm.safetensors samples 1: not its expert" "$dir/e6" ||
    fail "a pixel expert with a VAE: exit $rc, $(cat "$dir/e6")"
echo "ok: sampled latents decode into the reference decoder's RGB images"

# errors
rc=0; "$T" encode "$dir/mixed" --vae "$dir/vae.safetensors" --out "$dir/x.safetensors" 2>"$dir/e1" || rc=$?
[ "$rc" = 1 ] && grep -q "b.png is 32×32, the first image 28×28" "$dir/e1" || fail "mixed sizes: exit $rc, $(cat "$dir/e1")"
echo "im99.png 1" >>"$dir/img/labels.txt"
rc=0; "$T" encode "$dir/img" --vae "$dir/vae.safetensors" --out "$dir/x.safetensors" 2>"$dir/e2" || rc=$?
[ "$rc" = 1 ] && grep -q "no image im99.png" "$dir/e2" || fail "a label for no image: exit $rc, $(cat "$dir/e2")"
rc=0; "$T" encode "$dir/none" --vae "$dir/vae.safetensors" --out "$dir/x.safetensors" 2>"$dir/e3" || rc=$?
[ "$rc" = 1 ] && grep -q "cannot open the folder" "$dir/e3" || fail "a missing folder: exit $rc, $(cat "$dir/e3")"
rc=0; "$T" train --latents "$dir/lat.safetensors" --model tiny --steps 1 --data-dir "$dir/store" \
    --out "$dir/y.safetensors" 2>"$dir/e4" || rc=$?
[ "$rc" = 2 ] && grep -q "pick a model" "$dir/e4" || fail "tiny on 14x14 latents: exit $rc, $(cat "$dir/e4")"
rc=0; "$T" train --latents "$dir/vae.safetensors" --model small --steps 1 --data-dir "$dir/store" \
    --out "$dir/y.safetensors" 2>"$dir/e5" || rc=$?
[ "$rc" != 0 ] && grep -q "not a latent data set" "$dir/e5" || fail "a VAE as latents: exit $rc, $(cat "$dir/e5")"
echo "ok: the errors name the cause"
