"""Which precision to train in: bf16 autocast only where the hardware computes bf16 natively, fp32 elsewhere.

bf16 autocast is faster than fp32 only on hardware with bf16 arithmetic: CUDA GPUs from Ampere on, and CPUs
with AVX512_BF16 or AMX (Intel Cooper Lake, Sapphire Rapids and later; AMD Zen 4 and later) or Arm's BF16
extension. Elsewhere oneDNN emulates it, many times slower than fp32 (``python -m benchmarks.bench_precision``; its
results in benchmarks/results/ and docs/performance.md).

What counts is what PyTorch will run, not only what the CPU has: ``ATEN_CPU_CAPABILITY=avx2`` and
``ONEDNN_MAX_CPU_ISA=AVX2`` restrict a machine with native bf16 to AVX2 kernels, and then bf16 is emulated
there too. ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` is not the test: it is true on any AVX-512 CPU
(Skylake included), where oneDNN emulates bf16 as well.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch
from transformers.utils import is_torch_xla_available

PRECISIONS = ("auto", "bf16", "fp16", "fp32")  # fp16: CUDA only, as transformers' --fp16
# The CPU flags (torch.cpu.get_capabilities()) of native bf16 arithmetic, by architecture.
NATIVE_BF16_FLAGS = {"x86_64": ("avx512_bf16", "amx_bf16"), "aarch64": ("bf16", "sve_bf16")}
# oneDNN's CPU ISA names (ONEDNN_MAX_CPU_ISA) below which it has no native bf16 kernels.
ONEDNN_ISAS_WITHOUT_BF16 = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
)
# ATen kernel levels (torch.backends.cpu.get_cpu_capability()) that use no AVX-512 instructions.
ATEN_CAPABILITIES_WITHOUT_AVX512 = ("DEFAULT", "AVX2", "NO AVX")


@dataclass(frozen=True)
class PrecisionChoice:
    """A precision and why: what a run log, a model card and a result record."""

    precision: Literal["bf16", "fp16", "fp32"]
    native_bf16: bool  # whether the device computes bf16 natively (else bf16 is emulated: slow)
    reason: str

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"

    def describe(self) -> str:
        """One line for a log or a model card: the precision, then why."""
        return f"{self.precision} ({self.reason})"

    def as_dict(self) -> dict:
        return {"precision": self.precision, "native_bf16": self.native_bf16, "reason": self.reason}


def accelerator_present() -> bool:
    """Whether transformers' Trainer would train on an accelerator (CUDA, XPU, MPS, ... or XLA) rather than the CPU."""
    return torch.accelerator.is_available() or is_torch_xla_available()


def cpu_capability() -> str:
    """The ATen kernel level PyTorch runs on this CPU (``AVX2``, ``AVX512``, ...; honours ATEN_CPU_CAPABILITY)."""
    return torch.backends.cpu.get_cpu_capability()


def cpu_native_bf16() -> tuple[bool, str]:
    """Whether this CPU runs bf16 natively under PyTorch, and why (its flags and any restriction)."""
    capabilities = dict(torch.cpu.get_capabilities())
    name = capabilities.get("cpu_name") or "this CPU"
    flags = NATIVE_BF16_FLAGS.get(capabilities.get("architecture", ""), ())
    present = [flag for flag in flags if capabilities.get(flag)]
    if not present:
        wanted = " or ".join(flag.upper() for flag in flags) or "a bf16 extension"
        return False, f"{name} has no native bf16 ({wanted}; PyTorch's CPU capability: {cpu_capability()})"
    has = "/".join(flag.upper() for flag in present)
    onednn_isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if onednn_isa in ONEDNN_ISAS_WITHOUT_BF16:
        return (
            False,
            f"{name} has {has}, but ONEDNN_MAX_CPU_ISA={onednn_isa} restricts oneDNN to kernels without it",
        )
    if flags is NATIVE_BF16_FLAGS["x86_64"] and cpu_capability() in ATEN_CAPABILITIES_WITHOUT_AVX512:
        return False, f"{name} has {has}, but PyTorch runs {cpu_capability()} kernels (ATEN_CPU_CAPABILITY)"
    return True, f"{name} has native bf16 ({has}; PyTorch's CPU capability: {cpu_capability()})"


def device_native_bf16(device: torch.device | str) -> tuple[bool, str]:
    """Whether ``device`` computes bf16 natively, and why."""
    device = torch.device(device)
    if device.type == "cpu":
        return cpu_native_bf16()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return True, f"{name} has native bf16"
        return False, f"{name} has no native bf16 (compute capability below 8.0)"
    return False, f"bf16 autocast is not chosen automatically on {device.type}"


def choose_precision(device: torch.device | str, requested: str = "auto") -> PrecisionChoice:
    """The precision to run on ``device``: ``auto`` is bf16 where the device computes it natively, else fp32;
    ``bf16``, ``fp16`` and ``fp32`` are taken as asked (see :func:`emulated_bf16_warning` for bf16 without hardware)."""
    if requested not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    native, why = device_native_bf16(device)
    if requested == "auto":
        return PrecisionChoice("bf16" if native else "fp32", native, f"auto: {why}")
    return PrecisionChoice(requested, native, f"{requested} as asked; {why}")


def emulated_bf16_warning(choice: PrecisionChoice) -> str | None:
    """What to tell a user who asked for bf16 on a device without it (None when there is nothing to say)."""
    if not choice.bf16 or choice.native_bf16:
        return None
    return (
        f"bf16 was asked for, but {choice.reason.split('; ', 1)[-1]}: bf16 is emulated there, and much slower than "
        "fp32 (a demo-sized training step took 20x-35x as long on AVX2-only CPUs: benchmarks.bench_precision). "
        "Leave --bf16 out (ode-train: or give --precision auto) to run in fp32 here"
    )
