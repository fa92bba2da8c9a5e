"""latent_fixture.py DIR PARITY N [SEED...] — test data for latent experts, made here: DIR/img holds
N RGB PNGs (the first N Fashion-MNIST training images, tinted: 28x28) and labels.txt; for each
SEED, DIR/vae-SEED.safetensors is a small random VAE (tests/parity/vae_torch.py: 4 latent
channels, x2 down) — two seeds make two latent spaces."""
import gzip
import struct
import sys
import zlib

d, parity, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
seeds = [int(s) for s in sys.argv[4:]]
sys.path.insert(0, parity)
import os
import vae_torch as vt

CFG = dict(in_channels=3, out_channels=3, latent_channels=4, block_out=[8, 16],
           layers_per_block=1, groups=4, scaling_factor=0.18215)


def png(path, w, h, rgb):  # 8-bit RGB, no filter
    raw = b"".join(b"\0" + bytes(rgb[y * w * 3:(y + 1) * w * 3]) for y in range(h))

    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xffffffff)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


with gzip.open("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz") as f:
    f.read(16)
    pix = f.read(n * 784)
with gzip.open("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz") as f:
    f.read(8)
    lab = f.read(n)
os.makedirs(f"{d}/img", exist_ok=True)
with open(f"{d}/img/labels.txt", "w") as lf:
    for i in range(n):
        rgb = []
        for v in pix[i * 784:(i + 1) * 784]:
            rgb += [v, v // 2, 255 - v]
        png(f"{d}/img/im{i:03d}.png", 28, 28, rgb)
        lf.write(f"im{i:03d}.png {lab[i]}\n")
for s in seeds:
    m = vt.AutoencoderKL(CFG)
    vt.randomize(m, s)
    vt.save(m, f"{d}/vae-{s}.safetensors")
