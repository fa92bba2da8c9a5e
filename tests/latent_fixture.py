"""latent_fixture.py DIR PARITY N [SEED...] — test data for latent experts, made here: DIR/img holds
N RGB PNGs (the first N Fashion-MNIST training images, tinted: 28x28) and labels.txt; for each
SEED, DIR/vae-SEED.safetensors is a small random VAE (tests/parity/vae_torch.py: 4 latent
channels, x2 down) — two seeds make two latent spaces. Imported, it gives the same pieces
(tinted, png, small_vae) to a test that needs more of them."""
import gzip
import os
import struct
import sys
import zlib

FMNIST = "/usr/share/datasets/fashion-mnist"
CFG = dict(in_channels=3, out_channels=3, latent_channels=4, block_out=[8, 16],
           layers_per_block=1, groups=4, scaling_factor=0.18215)


def png(path, w, h, rgb):
    """An 8-bit RGB PNG of the flat list rgb (h rows of w pixels), no filter."""
    raw = b"".join(b"\0" + bytes(rgb[y * w * 3:(y + 1) * w * 3]) for y in range(h))

    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xffffffff)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def tinted(n):
    """The first n training images as flat RGB lists (v, v/2, 255 − v), and their labels."""
    with gzip.open(f"{FMNIST}/train-images-idx3-ubyte.gz") as f:
        f.read(16)
        pix = f.read(n * 784)
    with gzip.open(f"{FMNIST}/train-labels-idx1-ubyte.gz") as f:
        f.read(8)
        lab = list(f.read(n))
    imgs = []
    for i in range(n):
        rgb = []
        for v in pix[i * 784:(i + 1) * 784]:
            rgb += [v, v // 2, 255 - v]
        imgs.append(rgb)
    return imgs, lab


def small_vae(parity, seed):
    """The small random VAE of seed (a vae_torch.AutoencoderKL) and the module."""
    sys.path.insert(0, parity)
    import vae_torch as vt
    m = vt.AutoencoderKL(CFG)
    vt.randomize(m, seed)
    return m, vt


def write_folder(d, n, name="im{:03d}.png"):
    """DIR/img: n tinted PNGs and labels.txt; returns the images and labels."""
    imgs, lab = tinted(n)
    os.makedirs(f"{d}/img", exist_ok=True)
    with open(f"{d}/img/labels.txt", "w") as lf:
        for i, rgb in enumerate(imgs):
            png(f"{d}/img/{name.format(i)}", 28, 28, rgb)
            lf.write(f"{name.format(i)} {lab[i]}\n")
    return imgs, lab


if __name__ == "__main__":
    d, parity, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    write_folder(d, n)
    for s in (int(a) for a in sys.argv[4:]):
        m, vt = small_vae(parity, s)
        vt.save(m, f"{d}/vae-{s}.safetensors")
