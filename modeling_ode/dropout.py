"""The model's dropout: inverted dropout as `nnf.dropout`, with a faster CPU path (`fast_dropout`). The modeling
file imports this module, so an exported folder ships it as remote code."""

import torch
import torch.nn.functional as nnf
from torch import nn

__all__ = ["FastDropout", "fast_dropout"]


def fast_dropout(hidden: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout, as `nnf.dropout`, with a faster CPU path.

    On CPU `nnf.dropout` draws one Bernoulli sample per element and keeps a float32 noise tensor for the
    backward pass, a real share of a training step (docs/performance.md). Here four 16-bit uniforms come from
    each 64-bit draw of torch's generator and the mask kept for backward is boolean: a quarter of the random
    draws and of the memory. The drop rate is p rounded to a multiple of 2^-16 and kept values are scaled by the exact keep
    rate, so E[dropout(x)] = x still holds. Other devices, and `torch.compile` (which fuses it and cannot trace
    the in-place `random_`), use `nnf.dropout`.
    """
    if not training or p == 0.0:
        return hidden
    if hidden.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        return nnf.dropout(hidden, p, training=True)
    dropped = round(p * 2**16)  # of the 2^16 values of a 16-bit uniform, this many drop an element
    bits = torch.empty((hidden.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    keep = bits.view(torch.int16)[: hidden.numel()].view(hidden.shape) >= dropped - 2**15
    return hidden.mul(keep).mul_(2**16 / (2**16 - dropped))


class FastDropout(nn.Dropout):
    """`nn.Dropout` running :func:`fast_dropout`."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return fast_dropout(hidden, self.p, self.training)
