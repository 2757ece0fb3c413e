"""Dynamic int8 inference on CPU: every Linear layer's weights in int8, its input quantised on the fly.

`quantize_int8(model)` swaps each `nn.Linear` of a model (attention projections, feed-forward layers and the output
projection) for :class:`DynamicInt8Linear`, which runs fbgemm's `quantized::linear_dynamic`: the weights are stored
as int8 with one scale per output channel, and each call quantises its input to 8 bits over the whole tensor, runs
an int8 matrix product and returns float32. The embeddings, LayerNorms and the ODE gates (`StageGate`) stay
float32: a gate is 2d x (s - 1) weights, nothing to gain in speed, and its logits grow with the stages' norms
(docs/model.md), where rounding would move gamma most.

Why not `torch.ao.quantization.quantize_dynamic`: it is deprecated (torch 2.13 warns that torch.ao.quantization
goes away) in favour of torchao's `quantize_(model, Int8DynamicActivationInt8WeightConfig())`, which is made for
`torch.compile` and GPUs: in eager mode on a CPU it was far slower than float32 (docs/performance.md). The kernel both torch APIs used on CPU, fbgemm's, is called here directly (`torch.ops.quantized`).

Only for inference (no gradients), on CPU; the model keeps its float32 embeddings and works with `generate`.

Under `torch.compile` (compiled decoding, `ode_transformer.translate.compile_decoding`) the product is the operator
`ode_transformer::int8_linear`, opaque to the compiler: dynamo cannot trace fbgemm's packed weights (a TorchScript
object), so the operator takes the layer's key in a registry of them instead. Everything around the products
(attention, LayerNorms, the ODE steps) is then compiled into one graph per step. Eager calls skip the operator: its
Python dispatch is a real share of a batch-1 decoding step (docs/performance.md).
"""

from __future__ import annotations

import itertools
import warnings
import weakref

import torch
from torch import nn

from .ode import StageGate

__all__ = ["QUANTIZE_CHOICES", "DynamicInt8Linear", "is_quantized", "quantize_int8"]

QUANTIZE_CHOICES = ("int8",)
# The op's overload, not its packet: a packet call checks every argument for fake script objects in Python first,
# a cost paid at every product of every decoding step.
_LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic.default


# The int8 layers by key, for the compiled operator (weak: a deleted model's layers leave the registry).
_LAYERS: weakref.WeakValueDictionary[int, DynamicInt8Linear] = weakref.WeakValueDictionary()
_KEYS = itertools.count()
_LIBRARY = torch.library.Library("ode_transformer", "DEF")
_LIBRARY.define("int8_linear(Tensor hidden, int key) -> Tensor")


def _int8_linear(hidden: torch.Tensor, key: int) -> torch.Tensor:
    layer = _LAYERS[key]
    return _LINEAR_DYNAMIC(hidden, layer._packed, layer.reduce_range)


def _int8_linear_shape(hidden: torch.Tensor, key: int) -> torch.Tensor:
    return hidden.new_empty((*hidden.shape[:-1], _LAYERS[key].out_features))


_LIBRARY.impl("int8_linear", _int8_linear, "CPU")
torch.library.register_fake("ode_transformer::int8_linear", _int8_linear_shape, lib=_LIBRARY)
_INT8_LINEAR = torch.ops.ode_transformer.int8_linear.default


class DynamicInt8Linear(nn.Module):
    """`linear` with int8 weights (symmetric, one scale per output row) and a float32 bias: y ~ x W^T + b, x
    quantised per call. `reduce_range` (7-bit activations) as torch's x86 default: without AVX-512 VNNI, fbgemm's
    int8 products sum pairs in 16 bits, which saturate with full-range activations."""

    def __init__(self, linear: nn.Linear, reduce_range: bool = True):
        super().__init__()
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        with warnings.catch_warnings():
            # torch 2.13 marks quantized tensors deprecated, but fbgemm's packed weights are made from one and no
            # replacement runs int8 on a CPU without VNNI at speed (module docstring): nothing a user can act on.
            warnings.filterwarnings(
                "ignore", message=".*quantized tensor creation functions", category=UserWarning
            )
            qweight = torch.quantize_per_channel(
                weight, scales.double(), torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8
            )
        bias = None if linear.bias is None else linear.bias.detach().float()
        self._packed = torch.ops.quantized.linear_prepack(qweight, bias)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.reduce_range = reduce_range
        self._register()

    def _register(self) -> None:
        self.key = next(_KEYS)
        _LAYERS[self.key] = self

    def __setstate__(self, state: dict) -> None:  # a copy (copy.deepcopy) is a layer of its own
        super().__setstate__(state)
        self._register()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return _INT8_LINEAR(hidden.float(), self.key)
        return _LINEAR_DYNAMIC(hidden.float(), self._packed, self.reduce_range)

    def dequantized_weight(self) -> torch.Tensor:
        """The float weights this layer multiplies by (int8 times its row scale)."""
        weight, _ = torch.ops.quantized.linear_unpack(self._packed)
        return weight.dequantize()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weight=int8 per channel"


def quantize_int8(model: nn.Module) -> nn.Module:
    """`model` with every `nn.Linear` but the ODE gates replaced by :class:`DynamicInt8Linear`, in place; returned in
    eval mode. CPU only: fbgemm's kernels have no GPU version.

    Raises:
        ValueError: the model is not on the CPU, or this torch build has no fbgemm (x86) quantized engine.
    """
    devices = {p.device.type for p in model.parameters()}
    if devices - {"cpu"}:
        raise ValueError(
            f"int8 quantisation runs on the CPU, the model is on {sorted(devices - {'cpu'})}; load it with "
            "device='cpu' (or leave out the int8 option on a GPU)."
        )
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ValueError(
            f"this torch build has no fbgemm int8 kernels (quantized engines: {torch.backends.quantized.supported_engines}); "
            "int8 needs an x86 CPU build of torch: run in float32 instead."
        )
    torch.backends.quantized.engine = "fbgemm"
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and not isinstance(child, StageGate)
    ]
    with torch.no_grad():
        for parent, name, child in targets:
            setattr(parent, name, DynamicInt8Linear(child))
    return model.eval()


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(module, DynamicInt8Linear) for module in model.modules())
