"""fast_dropout: the model's dropout, checked against what inverted dropout must do (rate, scale, independence,
gradient, saved memory, reproducibility) rather than against nnf.dropout's random stream."""

import math

import pytest
import torch

from modeling_ode.dropout import FastDropout, fast_dropout

N = 1 << 20


def keep_rate(p: float, device: torch.device) -> float:
    """The CPU path rounds the drop rate to a multiple of 2^-16; other devices run nnf.dropout's exact rate."""
    return 1 - round(p * 2**16) / 2**16 if torch.device(device).type == "cpu" else 1 - p


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_and_scale(p, device):
    torch.manual_seed(0)
    x = torch.randn(N, device=device)
    out = fast_dropout(x, p, training=True)
    kept = out != 0
    q = keep_rate(p, device)
    assert abs(kept.float().mean().item() - q) < 5 * math.sqrt(q * (1 - q) / N)  # 5 binomial sigmas
    # Kept values scaled by the exact keep rate: bit for bit on the CPU path; within float32 rounding (1.3e-6,
    # far below the 7e-6 between 1 / 0.9 and the CPU path's 1 / (1 - 6554 / 2^16)) in a device's fused kernel.
    torch.testing.assert_close(
        out[kept], x[kept] * (1 / q), rtol=0 if x.device.type == "cpu" else 1.3e-6, atol=0
    )
    ones = fast_dropout(torch.ones(N, device=device), p, training=True)
    assert abs(ones.mean().item() - 1) < 5 * math.sqrt((1 - q) / q / N)  # E[dropout(x)] = x


def test_neighbouring_decisions_are_independent(device):
    """Four decisions come from one 64-bit draw: neighbours (same draw) and draws apart must be uncorrelated."""
    torch.manual_seed(0)
    kept = (fast_dropout(torch.ones(N, device=device), 0.5, training=True) != 0).float()
    for lag in (1, 2, 3, 4, 5):
        a, b = kept[:-lag] - kept.mean(), kept[lag:] - kept.mean()
        correlation = (a * b).mean() / (a.std() * b.std())
        assert abs(correlation.item()) < 5 / math.sqrt(N), lag
    lanes = kept.view(-1, 4).mean(dim=0)  # each 16-bit lane of the 64-bit draw drops at the same rate
    assert (lanes - 0.5).abs().max().item() < 5 * math.sqrt(0.25 / (N / 4))


def test_gradient_is_the_same_mask_and_only_a_boolean_mask_is_saved(device):
    torch.manual_seed(0)
    x = torch.randn(64, 128, device=device, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = fast_dropout(x, 0.25, training=True)
    out.backward(torch.ones_like(out))
    scale = 1 / keep_rate(0.25, device)
    assert torch.equal(x.grad, (out != 0).float() * scale)
    assert [t.dtype for t in saved] == [torch.bool]  # 1 byte per element, not nnf.dropout's float noise


def test_identity_when_not_training_or_p_zero_and_zeros_when_p_one(device):
    x = torch.randn(5, 7, device=device)
    assert fast_dropout(x, 0.3, training=False) is x
    assert fast_dropout(x, 0.0, training=True) is x
    assert torch.equal(fast_dropout(x, 1.0, training=True), torch.zeros_like(x))


def test_reproducible_under_manual_seed_and_any_shape(device):
    x = torch.randn(3, 5, 7, device=device)  # 105 elements: not a multiple of the 4 decisions per draw
    torch.manual_seed(1)
    first = fast_dropout(x, 0.2, training=True)
    torch.manual_seed(1)
    assert torch.equal(first, fast_dropout(x, 0.2, training=True))
    assert not torch.equal(first, fast_dropout(x, 0.2, training=True))
    assert torch.equal(fast_dropout(x.transpose(0, 2), 0.0, training=True), x.transpose(0, 2))
    assert fast_dropout(x.transpose(0, 2), 0.2, training=True).shape == (7, 5, 3)


def test_module_follows_train_and_eval(device):
    layer = FastDropout(0.5)
    x = torch.ones(1000, device=device)
    assert isinstance(layer, torch.nn.Dropout)
    assert (layer(x) == 0).any()
    assert layer.eval()(x) is x


def test_bf16_autocast_keeps_dtype(device):
    x = torch.randn(32, 16, dtype=torch.bfloat16, device=device)
    out = fast_dropout(x, 0.1, training=True)
    assert out.dtype == torch.bfloat16
    kept = out != 0
    assert torch.equal(out[kept], x[kept] * (1 / keep_rate(0.1, device)))
