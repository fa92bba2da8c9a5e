"""vae_torch.py — an independent PyTorch AutoencoderKL (Stable Diffusion's VAE) for the parity test.

Written here from the architecture (not diffusers, which is not installed), with diffusers'
parameter names so a state_dict is a file tessera loads: encoder.down_blocks.0.resnets.0.norm1,
…, encoder.mid_block.attentions.0.to_q, quant_conv, post_quant_conv, decoder.up_blocks.0….
Plain modules and explicit formulas: GroupNorm, SiLU, Conv2d, one-head softmax attention written
out as matrix products, nearest ×2 by F.interpolate. Runs in float32 or float64 (model.double()).

The safetensors reader and writer are dit_torch.py's.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from dit_torch import st_read, st_write  # noqa: F401  (re-exported for run_vae_parity.py)


class ResnetBlock(nn.Module):
    """x + conv2(silu(norm2(conv1(silu(norm1(x)))))), x through a 1×1 conv when C changes."""

    def __init__(self, cin, cout, groups, eps):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=eps)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout, eps=eps)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        skip = x if self.conv_shortcut is None else self.conv_shortcut(x)
        return skip + h


class Attention(nn.Module):
    """One head over the H·W pixels, GroupNorm in front, residual after."""

    def __init__(self, c, groups, eps):
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, c, eps=eps)
        self.to_q = nn.Linear(c, c)
        self.to_k = nn.Linear(c, c)
        self.to_v = nn.Linear(c, c)
        self.to_out = nn.ModuleList([nn.Linear(c, c), nn.Dropout(0.0)])

    def forward(self, x):
        b, c, h, w = x.shape
        t = self.group_norm(x).reshape(b, c, h * w).transpose(1, 2)  # (B, T, C)
        q, k, v = self.to_q(t), self.to_k(t), self.to_v(t)
        att = torch.softmax(q @ k.transpose(1, 2) / c ** 0.5, dim=-1)  # (B, T, T)
        o = self.to_out[0](att @ v)
        return x + o.transpose(1, 2).reshape(b, c, h, w)


class MidBlock(nn.Module):
    def __init__(self, c, groups, eps):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock(c, c, groups, eps), ResnetBlock(c, c, groups, eps)])
        self.attentions = nn.ModuleList([Attention(c, groups, eps)])

    def forward(self, x):
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


class Downsample(nn.Module):
    """pad (left 0, right 1, top 0, bottom 1), then a 3×3 conv of stride 2."""

    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2, padding=0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Level(nn.Module):
    """A down block (resnets, then downsamplers) or an up block (resnets, then upsamplers)."""

    def __init__(self, cin, cout, n, sample, groups, eps):
        super().__init__()
        self.resnets = nn.ModuleList(
            [ResnetBlock(cin if i == 0 else cout, cout, groups, eps) for i in range(n)])
        if sample == "down":
            self.downsamplers = nn.ModuleList([Downsample(cout)])
        elif sample == "up":
            self.upsamplers = nn.ModuleList([Upsample(cout)])
        self.sample = sample

    def forward(self, x):
        for r in self.resnets:
            x = r(x)
        if self.sample == "down":
            x = self.downsamplers[0](x)
        elif self.sample == "up":
            x = self.upsamplers[0](x)
        return x


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ch, g, eps, n = cfg["block_out"], cfg["groups"], 1e-6, len(cfg["block_out"])
        self.conv_in = nn.Conv2d(cfg["in_channels"], ch[0], 3, padding=1)
        self.down_blocks = nn.ModuleList([
            Level(ch[max(i - 1, 0)], ch[i], cfg["layers_per_block"],
                  "down" if i < n - 1 else None, g, eps) for i in range(n)])
        self.mid_block = MidBlock(ch[-1], g, eps)
        self.conv_norm_out = nn.GroupNorm(g, ch[-1], eps=eps)
        self.conv_out = nn.Conv2d(ch[-1], 2 * cfg["latent_channels"], 3, padding=1)

    def forward(self, x):
        x = self.conv_in(x)
        for blk in self.down_blocks:
            x = blk(x)
        x = self.mid_block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ch, g, eps, n = cfg["block_out"], cfg["groups"], 1e-6, len(cfg["block_out"])
        rc = list(reversed(ch))
        self.conv_in = nn.Conv2d(cfg["latent_channels"], rc[0], 3, padding=1)
        self.mid_block = MidBlock(rc[0], g, eps)
        self.up_blocks = nn.ModuleList([
            Level(rc[max(j - 1, 0)], rc[j], cfg["layers_per_block"] + 1,
                  "up" if j < n - 1 else None, g, eps) for j in range(n)])
        self.conv_norm_out = nn.GroupNorm(g, ch[0], eps=eps)
        self.conv_out = nn.Conv2d(ch[0], cfg["out_channels"], 3, padding=1)

    def forward(self, z):
        x = self.mid_block(self.conv_in(z))
        for blk in self.up_blocks:
            x = blk(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class AutoencoderKL(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        L = cfg["latent_channels"]
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.quant_conv = nn.Conv2d(2 * L, 2 * L, 1)
        self.post_quant_conv = nn.Conv2d(L, L, 1)

    def encode(self, x):
        """→ (mean · scaling_factor, logvar), as tessera's ts_vae_encode."""
        moments = self.quant_conv(self.encoder(x))
        mean, logvar = moments.chunk(2, dim=1)
        return mean * self.cfg["scaling_factor"], logvar

    def decode(self, z):
        return self.decoder(self.post_quant_conv(z / self.cfg["scaling_factor"]))


SD_VAE_FT_MSE = dict(in_channels=3, out_channels=3, latent_channels=4,
                     block_out=[128, 256, 512, 512], layers_per_block=2, groups=32,
                     scaling_factor=0.18215)


def randomize(model, seed):
    """Random weights that exercise every tensor: torch's default conv init, GroupNorm affine
    drawn around (1, 0), and q, k scaled so the attention's scores have a spread of about 2 (a
    softmax far from uniform)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".norm" in name or "group_norm" in name or "conv_norm_out" in name:
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            elif (".to_q." in name or ".to_k." in name) and name.endswith("weight"):
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / p.shape[1]) ** 0.5)
            else:
                bound = 1.0 / p[0].numel() ** 0.5 if p.dim() > 1 else 0.1  # 1/sqrt(fan_in)
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)


def state_dict_for_file(model, naming="new"):
    """The model's parameters under diffusers' names ("new": to_q … to_out.0, 2-D) or the older
    ones ("old": query, key, value, proj_attn as (C, C, 1, 1) conv weights)."""
    out = {}
    rename = {".to_q.": ".query.", ".to_k.": ".key.", ".to_v.": ".value.",
              ".to_out.0.": ".proj_attn."}
    for name, t in model.state_dict().items():
        t = t.detach().float().contiguous()
        if naming == "old":
            for a, b in rename.items():
                if a in name:
                    name = name.replace(a, b)
                    if t.dim() == 2:
                        t = t.reshape(t.shape[0], t.shape[1], 1, 1)
        out[name] = t
    return out


def save(model, path, naming="new"):
    cfg = model.cfg
    st_write(path, state_dict_for_file(model, naming),
             metadata={"norm_num_groups": cfg["groups"], "scaling_factor": cfg["scaling_factor"]})
