#!/bin/sh
# test_import.sh TESSERA DIT_PARITY — `tessera import` on checkpoints PyTorch writes here
# (tests/parity/dit_torch.py, random weights, DiT's published layout: learned σ, 4 latent
# channels, the null label, pos_embed in the state dict):
#   - the state dict's keys are exactly those of facebookresearch/DiT's DiT (listed here from its
#     module structure), and the import reads them without PyTorch;
#   - the imported expert's forward (dit_parity) equals PyTorch's: the ε half and the σ half;
#   - a training checkpoint {"model", "ema", "opt", "args"} gives its EMA weights; --prefix model
#     the others; BF16 weights come through exactly; a non-contiguous tensor in its own order;
#   - an object whose unpickling would run a command runs nothing;
#   - refused with the reason: the legacy format, a truncated file, an extra tensor, a shape that
#     differs, a pos_embed that is not DiT's table, a hidden size outside DiT's family without
#     --heads (exit 2);
#   - the imported ε expert generates through `generate --local --sampler ddim`.
set -eu
T=${1:?usage: test_import.sh TESSERA DIT_PARITY}
P=${2:?usage: test_import.sh TESSERA DIT_PARITY}
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
"$PY" -c "import torch" 2>/dev/null || skip "no torch for $PY (Debian's python3-torch)"

T=$(cd "$(dirname "$T")" && pwd)/$(basename "$T")
P=$(cd "$(dirname "$P")" && pwd)/$(basename "$P")
cd "$dir"
"$PY" - "$here/parity" <<'PYEOF' || fail "making the checkpoints"
import argparse, collections, os, sys
sys.path.insert(0, sys.argv[1])
import torch
import dit_torch as dt

torch.manual_seed(1)
cfg = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=384, depth=2, num_heads=6,
           num_classes=10, mlp_ratio=4, freq_dim=256)
m = dt.DiT(**cfg, learn_sigma=True)
m.randomise(torch.Generator().manual_seed(2))
sd = m.state_dict()
# DiT's keys (models.py: PatchEmbed, TimestepEmbedder, LabelEmbedder, pos_embed, DiTBlock ×
# depth, FinalLayer; LayerNorms without affine, timm's Attention and Mlp)
want = {"x_embedder.proj.weight", "x_embedder.proj.bias", "t_embedder.mlp.0.weight",
        "t_embedder.mlp.0.bias", "t_embedder.mlp.2.weight", "t_embedder.mlp.2.bias",
        "y_embedder.embedding_table.weight", "pos_embed", "final_layer.linear.weight",
        "final_layer.linear.bias", "final_layer.adaLN_modulation.1.weight",
        "final_layer.adaLN_modulation.1.bias"}
for l in range(cfg["depth"]):
    for k in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "adaLN_modulation.1"):
        want |= {f"blocks.{l}.{k}.weight", f"blocks.{l}.{k}.bias"}
assert set(sd) == want, sorted(set(sd) ^ want)
assert sd["final_layer.linear.weight"].shape[0] == 2 * 2 * 2 * 4  # learned sigma: 2C
assert sd["y_embedder.embedding_table.weight"].shape[0] == 11     # the null label
torch.save(sd, "plain.pt")

other = dt.DiT(**cfg, learn_sigma=True)
other.randomise(torch.Generator().manual_seed(3))
opt = torch.optim.AdamW(other.parameters(), lr=1e-4)
other(torch.randn(2, 4, 8, 8), torch.rand(2), torch.tensor([1, 10])).sum().backward()
opt.step()

class Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))

torch.save({"model": other.state_dict(), "ema": sd, "opt": opt.state_dict(),
            "args": argparse.Namespace(model="DiT-XL/2", image_size=256), "evil": Evil()},
           "ckpt.pt")
torch.save({k: v.bfloat16() for k, v in sd.items()}, "bf16.pt")
nc = dict(sd)
w = sd["blocks.0.mlp.fc1.weight"]
nc["blocks.0.mlp.fc1.weight"] = w.t().contiguous().t()  # strides (1, rows): not contiguous
assert not nc["blocks.0.mlp.fc1.weight"].is_contiguous()
torch.save(nc, "strided.pt")
torch.save(sd, "legacy.pt", _use_new_zipfile_serialization=False)
extra = dict(sd); extra["blocks.0.attn.q_norm.weight"] = torch.ones(64)
torch.save(extra, "extra.pt")
shape = dict(sd); shape["blocks.1.mlp.fc2.bias"] = torch.zeros(100)
torch.save(shape, "shape.pt")
pos = dict(sd); pos["pos_embed"] = sd["pos_embed"] + 0.01
torch.save(pos, "pos.pt")
small = dt.DiT(**dict(cfg, hidden_size=64, num_heads=4), learn_sigma=True)
torch.save(small.state_dict(), "heads.pt")
raw = open("plain.pt", "rb").read()
open("truncated.pt", "wb").write(raw[:len(raw) // 2])
# the forward PyTorch gives, to compare with
x = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(4))
t = torch.tensor([0.0, 0.25, 0.999])      # DiT steps / 1000
y = torch.tensor([0, 10, 7])              # 10: the null label
dt.st_write("in.safetensors", {"x": x, "t": t, "y": y}, dtypes={"y": "I64"})
with torch.no_grad():
    dt.st_write("want.safetensors", {"out": m(x, t, y)})
PYEOF

run "$T" import plain.pt --out plain.safetensors --json
[ "$(json_get out.txt "j['learn_sigma']")" = True ] && [ "$(json_get out.txt "j['num_heads']")" = 6 ] &&
    [ "$(json_get out.txt "j['num_classes']")" = 10 ] && [ "$(json_get out.txt "j['input_size']")" = 8 ] ||
    fail "import --json: $(cat out.txt)"
"$P" forward plain.safetensors in.safetensors got.safetensors 2>err.txt || fail "forward: $(cat err.txt)"
"$PY" - "$here/parity" <<'PYEOF' || fail "the imported expert's forward"
import sys
sys.path.insert(0, sys.argv[1])
import dit_torch as dt
want, _, _ = dt.st_read("want.safetensors")
got, _, _ = dt.st_read("got.safetensors")
out = want["out"]
C = out.shape[1] // 2
ev = (got["v"] - out[:, :C]).abs().max().item() / max(1.0, out[:, :C].abs().max().item())
es = (got["sigma"] - out[:, C:]).abs().max().item() / max(1.0, out[:, C:].abs().max().item())
print(f"imported DiT against PyTorch: epsilon {ev:.2e}, sigma {es:.2e}")
assert ev < 1e-4 and es < 1e-4, (ev, es)
_, meta, _ = dt.st_read("plain.safetensors")
assert meta["objective"] == "epsilon" and meta["learn_sigma"] == "true", meta
assert meta["source"] == "plain.pt" and len(meta["source_blake2b"]) == 64, meta
PYEOF
echo "ok: the published key layout imports without PyTorch; the forward equals PyTorch's (epsilon and sigma)"

run "$T" import ckpt.pt --out ema.safetensors --json
[ "$(json_get out.txt "j['prefix']")" = ema. ] || fail "the checkpoint's state dict: $(cat out.txt)"
[ ! -e PWNED ] || fail "importing ran code from the pickle"
run "$T" import ckpt.pt --prefix model --out model.safetensors
run "$T" import bf16.pt --out bf16.safetensors
run "$T" import strided.pt --out strided.safetensors
"$PY" - "$here/parity" <<'PYEOF' || fail "the checkpoints' weights"
import sys
sys.path.insert(0, sys.argv[1])
import torch
import dit_torch as dt
a, _, _ = dt.st_read("plain.safetensors")
e, _, _ = dt.st_read("ema.safetensors")
m, _, _ = dt.st_read("model.safetensors")
b, _, _ = dt.st_read("bf16.safetensors")
s, _, _ = dt.st_read("strided.safetensors")
assert all(torch.equal(a[k], e[k]) for k in a), "ema differs from the plain state dict"
assert not torch.equal(a["blocks.0.mlp.fc1.weight"], m["blocks.0.mlp.fc1.weight"])
assert all(torch.equal(a[k].bfloat16().float(), b[k]) for k in a if k != "pos_embed")
assert all(torch.equal(a[k], s[k]) for k in a), "a non-contiguous tensor came out reordered"
PYEOF
echo "ok: a training checkpoint's EMA (or --prefix model), BF16 weights, a strided tensor; the pickle ran nothing"

refused() { # refused NAME WANT ARGS...: the import fails, saying WANT
    name=$1 want=$2
    shift 2
    if "$T" import "$@" --out bad.safetensors 2>"err-$name.txt"; then
        fail "import took $name"
    fi
    grep -q "$want" "err-$name.txt" || fail "$name: $(cat "err-$name.txt")"
}
refused legacy "legacy format" legacy.pt
refused truncated "truncated\|not a zip" truncated.pt
refused extra "blocks.0.attn.q_norm.weight is not a parameter" extra.pt
refused shape "blocks.1.mlp.fc2.bias has another shape" shape.pt
refused pos "pos_embed differs from the model's fixed sin-cos table" pos.pt
refused missing "cannot open" nothing.pt
set +e
"$T" import heads.pt --out bad.safetensors 2>err-heads.txt
code=$?
set -e
[ "$code" = 2 ] && grep -q -- "--heads" err-heads.txt || fail "heads ($code): $(cat err-heads.txt)"
run "$T" import heads.pt --heads 4 --out heads.safetensors
[ ! -e bad.safetensors ] || fail "a refused import wrote a file"
echo "ok: the legacy format, a truncated file, an extra tensor, a wrong shape, another pos_embed and unknown heads are refused"

mkdir ens
cp plain.safetensors ens/expert-0.safetensors
"$PY" "$here/latent_fixture.py" . "$here/parity" 0 5 || fail "making a VAE"
run "$T" generate --local ens --n 2 --steps 3 --sampler ddim --cfg 1.5 --vae vae-5.safetensors \
    --out ens.png
# DDPM takes the imported expert's learned σ (DiT's own sampling); a flow expert gives none
run "$T" generate --local ens --n 2 --steps 3 --sampler ddpm --cfg 1.5 --vae vae-5.safetensors \
    --json --out ddpm.png
[ "$(json_get out.txt "j['ddpm_variance']")" = learned ] || fail "ddpm's variance: $(cat out.txt)"
if "$T" generate --local ens --n 2 --steps 3 --sampler euler --vae vae-5.safetensors \
    --out e.png 2>err-euler.txt; then
    fail "generate asked an epsilon expert at pure noise"
fi
grep -q "use --sampler ddim or ddpm" err-euler.txt || fail "euler: $(cat err-euler.txt)"
if "$T" generate --local ens --n 2 --steps 3 --sampler ddim --out e.png 2>err-novae.txt; then
    fail "generate drew 4-channel latents as a picture"
fi
grep -q "pass --vae FILE" err-novae.txt || fail "no --vae: $(cat err-novae.txt)"
echo "ok: the imported epsilon expert generates with ddim and a VAE, and with ddpm on its learned σ (euler, or no VAE, refused with the reason)"
