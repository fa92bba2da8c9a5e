"""flops.py — the FLOPs a PyTorch model's call does, counted on the model itself, for the
benchmarks that set ours beside PyTorch (bench_latent.py, bench_gpu.py): the same work on both
sides."""
import torch
import torch.nn as nn


def count_flops(model, fn):
    """FLOPs of fn(): convolutions and linear layers by hooks, plus the matmuls torch.matmul and
    the @ operator run (the attentions' products), 2 per multiply-add."""
    total = [0]

    def conv_hook(m, inp, out):
        total[0] += 2 * out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]

    def lin_hook(m, inp, out):
        total[0] += 2 * out.numel() * m.in_features

    hooks = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            hooks.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            hooks.append(m.register_forward_hook(lin_hook))
    real_matmul, real_bmm = torch.Tensor.__matmul__, torch.bmm

    def mm(a, b):
        out = real_matmul(a, b)
        total[0] += 2 * out.numel() * a.shape[-1]
        return out

    def bmm(a, b):
        out = real_bmm(a, b)
        total[0] += 2 * out.numel() * a.shape[-1]
        return out

    torch.Tensor.__matmul__, torch.bmm = mm, bmm
    try:
        with torch.no_grad():
            fn()
    finally:
        torch.Tensor.__matmul__, torch.bmm = real_matmul, real_bmm
        for h in hooks:
            h.remove()
    return total[0]
