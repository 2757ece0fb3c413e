"""CPUs the tests pretend to run on: their flags (``torch.cpu.get_capabilities``) and PyTorch's kernel level
(``torch.backends.cpu.get_cpu_capability``), which ``ode_transformer.precision`` reads to choose bf16 or fp32.

The suite runs on whatever CPU CI lands on: on one with native bf16, ``--precision auto`` trains in bf16, elsewhere
in fp32. So conftest pins every test to ``AVX2_ONLY`` unless it asks for another kind, and tests marked
``both_cpus`` run once more on ``NATIVE_BF16``: the same tests pass, and take the same paths, on any machine.
"""

from __future__ import annotations

import pytest
import torch

ZEN3 = {"architecture": "x86_64", "cpu_name": "AMD EPYC 7B13", "avx2": True, "avx512_bf16": False}
SAPPHIRE_RAPIDS = {"architecture": "x86_64", "cpu_name": "Intel Xeon", "avx512_bf16": True, "amx_bf16": True}
ZEN4 = {"architecture": "x86_64", "cpu_name": "AMD EPYC 9B14", "avx2": True, "avx512_bf16": True}
SKYLAKE = {"architecture": "x86_64", "cpu_name": "Intel Xeon Gold", "avx512_f": True, "avx512_bf16": False}
GRAVITON3 = {"architecture": "aarch64", "cpu_name": "Neoverse-V1", "bf16": True, "sve_bf16": True}
GRAVITON2 = {"architecture": "aarch64", "cpu_name": "Neoverse-N1", "bf16": False}

# name -> (flags, ATen capability): the two kinds every `both_cpus` test runs on, and two more with native
# bf16
CPUS = {
    "avx2": (ZEN3, "AVX2"),
    "native_bf16": (SAPPHIRE_RAPIDS, "AVX512"),
    "zen4": (ZEN4, "AVX512"),
    "graviton3": (GRAVITON3, "SVE256"),
}


def pretend(monkeypatch: pytest.MonkeyPatch, flags: dict, capability: str) -> None:
    """Make this process see a CPU with ``flags`` on which PyTorch runs ``capability`` kernels."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: flags)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
