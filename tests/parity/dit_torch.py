"""dit_torch.py — the PyTorch reference for tessera's DiT expert, and a small safetensors codec.

This is the independent side of the parity test (tests/parity/run_parity.py): a Diffusion
Transformer written directly from the DiT paper (Peebles & Xie 2023) and docs/architecture.md
§9, with the parameter names of the DiT state_dict, so that the C model (model/dit.c) and this module load the
very same safetensors file with strict name and shape checking.

What it is not: a training script or a copy of the DiT repository. It holds only what the parity
test needs — the model, its config read from a file's __metadata__, and a safetensors reader and
writer (there is no `safetensors` Python package on the test machine).

Semantics, in brief (every convention the C side must agree with):
  x (B, C, H, W) → Conv2d(C, h, p, stride p) → tokens (B, T, h), token m = row·grid + col
  + pos_embed (1, T, h): fixed 2-D sin-cos table, row m = [sin(col·ω), cos(col·ω),
    sin(row·ω), cos(row·ω)], ω_k = 10000^(−k/(h/4)), built in float64 then cast to float32
  t (B) in [0, 1] → [cos(a), sin(a)], a_i = 1000·t · exp(−ln(10000)·i/half) in float32
    → Linear(freq_dim, h) → SiLU → Linear(h, h);  y → embedding table (num_classes + 1, h)
  c = t_emb + y_emb; per block adaLN(SiLU(c)) → 6 chunks; x += gate·attn(modulate(LN(x)));
    x += gate·mlp(modulate(LN(x))); LN without affine, eps 1e-6; GELU tanh; qkv (3, heads, hd)
  final: modulate(LN(x)) with 2 chunks (shift, scale) → Linear(h, p·p·C) → unpatchify with
    per-token features in (py, px, c) order → v (B, C, H, W), the velocity ε − x0; with
    learn_sigma (DiT's published checkpoints) Linear(h, p·p·2C) → (B, 2C, H, W): the
    prediction's C channels, then the variance's.
"""

import json
import math
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- safetensors ---------------------------------------------------------------------------

# name → (numpy dtype used for the raw bytes, bytes per element)
_ST_DTYPES = {
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),  # raw bit patterns; converted through torch.bfloat16
    "I32": (np.dtype("<i4"), 4),
    "I64": (np.dtype("<i8"), 8),
}


def _to_bytes(tensor, dtype):
    """Raw little-endian bytes of a torch tensor stored as safetensors dtype `dtype`."""
    t = tensor.detach().cpu().contiguous()
    if dtype == "F32":
        arr = t.to(torch.float32).numpy().astype("<f4")
    elif dtype == "F16":
        arr = t.to(torch.float16).numpy().astype("<f2")
    elif dtype == "BF16":
        # torch rounds to nearest even; reinterpret the 16-bit patterns as int16 to export them
        arr = t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2")
    elif dtype == "I32":
        arr = t.to(torch.int32).numpy().astype("<i4")
    elif dtype == "I64":
        arr = t.to(torch.int64).numpy().astype("<i8")
    else:
        raise ValueError(f"unsupported safetensors dtype {dtype}")
    return arr.tobytes()


def st_write(path, tensors, metadata=None, dtypes=None):
    """Writes a safetensors file.

    tensors: ordered mapping name → torch tensor; dtypes: optional mapping name → "F32" | "F16" |
    "BF16" | "I32" | "I64" (default: F32 for floating tensors, I64 for integer ones); metadata: a
    string → string map stored under __metadata__. The header is padded with spaces to a multiple
    of 8 bytes, as the reference implementation does.
    """
    dtypes = dtypes or {}
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        dt = dtypes.get(name) or ("F32" if t.is_floating_point() else "I64")
        raw = _to_bytes(t, dt)
        header[name] = {"dtype": dt, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    js = json.dumps(header, separators=(",", ":")).encode("utf-8")
    js += b" " * ((8 - len(js) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for raw in blobs:
            f.write(raw)


def st_read(path):
    """Reads a safetensors file → (dict name → torch tensor, metadata dict, dict name → dtype).

    Floating tensors come back as float32 (F16 and BF16 widened exactly), integers as int64.
    Checks what the parity test relies on: header bounds, known dtypes, sizes, and that the data
    ranges tile the buffer with nothing left over.
    """
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > len(buf) - 8:
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    data = buf[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out, kinds, ranges = {}, {}, []
    for name, e in header.items():
        dt = e["dtype"]
        if dt not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dt}")
        npdt, size = _ST_DTYPES[dt]
        shape = [int(s) for s in e["shape"]]
        b, end = e["data_offsets"]
        numel = int(np.prod(shape)) if shape else 1
        if end - b != numel * size or end > len(data) or b > end:
            raise ValueError(f"{path}: tensor {name} has a bad byte range [{b}, {end})")
        arr = np.frombuffer(data[b:end], dtype=npdt).reshape(shape)
        if dt == "BF16":
            t = torch.from_numpy(arr.astype(np.int16)).view(torch.bfloat16).to(torch.float32)
        elif dt in ("F32", "F16"):
            t = torch.from_numpy(arr.astype(np.float32))
        else:
            t = torch.from_numpy(arr.astype(np.int64))
        out[name] = t
        kinds[name] = dt
        ranges.append((b, end))
    pos = 0
    for b, end in sorted(ranges):
        if b != pos:
            raise ValueError(f"{path}: data ranges leave a gap or overlap at byte {b}")
        pos = end
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} bytes after the last tensor")
    return out, meta, kinds


# ---- config ------------------------------------------------------------------------------

CONFIG_KEYS = ("input_size", "patch_size", "in_channels", "hidden_size", "depth", "num_heads",
               "num_classes", "mlp_ratio", "freq_dim")
CONFIG_DEFAULTS = {"mlp_ratio": 4, "freq_dim": 256}


def config_from_metadata(meta):
    """The DiT constructor arguments from a file's __metadata__ (decimal strings)."""
    cfg = {}
    for k in CONFIG_KEYS:
        if k in meta:
            cfg[k] = int(meta[k])
        elif k in CONFIG_DEFAULTS:
            cfg[k] = CONFIG_DEFAULTS[k]
        else:
            raise KeyError(f"metadata lacks the config key {k!r}")
    return cfg


def config_to_metadata(cfg):
    return {k: str(int(cfg[k])) for k in CONFIG_KEYS}


# ---- fixed embeddings ----------------------------------------------------------------------

def sincos_pos_embed_2d(hidden, grid):
    """(grid·grid, hidden) table: row m = i·grid + j is [sin(jω), cos(jω), sin(iω), cos(iω)]."""
    assert hidden % 4 == 0, "hidden size must be a multiple of 4"
    quarter = hidden // 4
    omega = 1.0 / 10000.0 ** (np.arange(quarter, dtype=np.float64) / quarter)  # (quarter,)
    rows, cols = np.meshgrid(np.arange(grid, dtype=np.float64),
                             np.arange(grid, dtype=np.float64), indexing="ij")
    i = rows.reshape(-1, 1) * omega[None, :]  # (T, quarter), the token's row
    j = cols.reshape(-1, 1) * omega[None, :]  # (T, quarter), the token's column
    table = np.concatenate([np.sin(j), np.cos(j), np.sin(i), np.cos(i)], axis=1)
    return table.astype(np.float32)


def timestep_sinusoid(t, dim, max_period=10000.0):
    """(B, dim) = [cos(args), sin(args)], args_i = t · exp(−ln(max_period)·i/half), float32.

    t here is already scaled (1000·t). A trailing zero column when dim is odd.
    """
    half = dim // 2
    i = torch.arange(half, dtype=torch.float32, device=t.device)  # t's device: CPU or a GPU
    freqs = torch.exp(-math.log(max_period) * i / half)
    args = t.to(torch.float32)[:, None] * freqs[None, :]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


def modulate(x, shift, scale):
    """x (B, T, h) · (1 + scale) + shift, shift and scale (B, h) broadcast over tokens."""
    return x * (1 + scale[:, None, :]) + shift[:, None, :]


# ---- modules, named as DiT's state_dict ----------------------------------------------------

class PatchEmbed(nn.Module):
    def __init__(self, channels, hidden, patch):
        super().__init__()
        self.proj = nn.Conv2d(channels, hidden, kernel_size=patch, stride=patch, bias=True)

    def forward(self, x):  # (B, C, H, W) → (B, T, h), tokens in row-major grid order
        return self.proj(x).flatten(2).transpose(1, 2)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden, freq_dim):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t):  # t (B) in [0, 1]
        return self.mlp(timestep_sinusoid(1000.0 * t, self.freq_dim))


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes, hidden):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + 1, hidden)  # last row: the null class

    def forward(self, y):
        return self.embedding_table(y)


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        B, T, h = x.shape
        hd = h // self.heads
        # the qkv output's last axis is laid out (3, heads, head_dim)
        qkv = self.qkv(x).reshape(B, T, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # each (B, heads, T, hd)
        att = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(hd), dim=-1)  # not causal
        y = (att @ v).transpose(1, 2).reshape(B, T, h)  # heads concatenated
        return self.proj(y)


class Mlp(nn.Module):
    def __init__(self, hidden, inner):
        super().__init__()
        self.fc1 = nn.Linear(hidden, inner)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(inner, hidden)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class DiTBlock(nn.Module):
    def __init__(self, hidden, heads, mlp_ratio):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden, mlp_ratio * hidden)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = \
            self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa[:, None, :] * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp[:, None, :] * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden, patch, channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, patch * patch * channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    """The velocity model. Constructor arguments are the __metadata__ keys of a weights file."""

    def __init__(self, input_size, patch_size, in_channels, hidden_size, depth, num_heads,
                 num_classes, mlp_ratio=4, freq_dim=256, learn_sigma=False):
        super().__init__()
        assert input_size % patch_size == 0 and hidden_size % num_heads == 0
        self.cfg = dict(input_size=input_size, patch_size=patch_size, in_channels=in_channels,
                        hidden_size=hidden_size, depth=depth, num_heads=num_heads,
                        num_classes=num_classes, mlp_ratio=mlp_ratio, freq_dim=freq_dim)
        self.learn_sigma = bool(learn_sigma)
        # learned σ (DiT's published checkpoints): 2C output channels, the prediction then σ
        self.p, self.channels = patch_size, in_channels * (2 if learn_sigma else 1)
        self.grid = input_size // patch_size
        self.x_embedder = PatchEmbed(in_channels, hidden_size, patch_size)
        self.t_embedder = TimestepEmbedder(hidden_size, freq_dim)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size)
        # fixed, but a Parameter (not a buffer) so it is in the state_dict under DiT's name
        table = torch.from_numpy(sincos_pos_embed_2d(hidden_size, self.grid))
        self.pos_embed = nn.Parameter(table.unsqueeze(0), requires_grad=False)
        self.blocks = nn.ModuleList([DiTBlock(hidden_size, num_heads, mlp_ratio)
                                     for _ in range(depth)])
        self.final_layer = FinalLayer(hidden_size, patch_size, self.channels)

    @classmethod
    def from_metadata(cls, meta):
        return cls(**config_from_metadata(meta), learn_sigma=meta.get("learn_sigma") == "true")

    def unpatchify(self, tok):
        """(B, T, p·p·C), features in (py, px, c) order → (B, C, H, W)."""
        B, g, p, C = tok.shape[0], self.grid, self.p, self.channels
        x = tok.reshape(B, g, g, p, p, C)          # (B, gy, gx, py, px, c)
        x = x.permute(0, 5, 1, 3, 2, 4)            # (B, c, gy, py, gx, px)
        return x.reshape(B, C, g * p, g * p)

    def forward(self, x, t, y):
        h = self.x_embedder(x) + self.pos_embed
        c = self.t_embedder(t) + self.y_embedder(y)
        for block in self.blocks:
            h = block(h, c)
        return self.unpatchify(self.final_layer(h, c))

    def trainable(self):
        """(name, parameter) pairs of everything the optimiser updates (all but pos_embed)."""
        return [(n, p) for n, p in self.named_parameters() if p.requires_grad]

    def randomise(self, generator, bias_std=0.05):
        """Every trainable tensor random, the zero-initialised ones (adaLN, final layer) too, so
        no part of the model is invisible to the test. Weights ~ N(0, 1/fan_in) keep every
        activation O(1) (attention logits included, so the softmax is far from uniform); biases
        ~ N(0, bias_std²); the label table ~ N(0, 1)."""
        with torch.no_grad():
            for name, p in self.trainable():
                if name.endswith("embedding_table.weight"):
                    std = 1.0
                elif p.dim() >= 2:
                    std = 1.0 / math.sqrt(p[0].numel())  # fan_in (C·p·p for the conv)
                else:
                    std = bias_std
                p.copy_(torch.randn(p.shape, generator=generator) * std)


def flow_matching_loss(model, x0, eps, t, y):
    """mean((v − (ε − x0))²) at x_t = (1 − t)·x0 + t·ε (architecture.md §3)."""
    tb = t[:, None, None, None]
    xt = (1 - tb) * x0 + tb * eps
    v = model(xt, t, y)
    return torch.mean((v - (eps - x0)) ** 2)


def save_model(model, path, dtype="F32", extra_meta=None, pos_embed_dtype=None):
    """Writes the model's state_dict (pos_embed included) in `dtype`; pos_embed_dtype overrides
    the dtype of the fixed table alone."""
    sd = model.state_dict()
    dtypes = {k: dtype for k in sd}
    if pos_embed_dtype:
        dtypes["pos_embed"] = pos_embed_dtype
    meta = config_to_metadata(model.cfg)
    if model.learn_sigma:
        meta["learn_sigma"] = "true"
    meta.update(extra_meta or {})
    st_write(path, sd, meta, dtypes)


def load_model(path):
    """A DiT built from the file's metadata with its weights, loaded with strict=True."""
    tensors, meta, _ = st_read(path)
    model = DiT.from_metadata(meta)
    model.load_state_dict(tensors, strict=True)
    return model


def main():
    """`dit_torch.py sigma-checkpoint OUT.pt --input-size N --in-channels C [--seed S]`: a DiT
    with learned σ in the published layout (hidden 64, depth 2, 4 heads, 10 classes), random
    weights, saved as a PyTorch state dict — the learned-σ expert the network tests import."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("what", choices=["sigma-checkpoint"])
    ap.add_argument("out")
    ap.add_argument("--input-size", type=int, required=True)
    ap.add_argument("--in-channels", type=int, required=True)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    m = DiT(input_size=a.input_size, patch_size=2, in_channels=a.in_channels, hidden_size=64,
            depth=2, num_heads=4, num_classes=10, mlp_ratio=4, freq_dim=256, learn_sigma=True)
    m.randomise(torch.Generator().manual_seed(a.seed))
    torch.save(m.state_dict(), a.out)


if __name__ == "__main__":
    main()
