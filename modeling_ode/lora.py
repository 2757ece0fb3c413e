"""LoRA target names for PEFT.

Self-attention projects query, key and value with one fused Linear, `qkv_proj` (fairseq's `in_proj`);
cross-attention has `q_proj` and a fused `kv_proj`. So BART's usual `target_modules=["q_proj", "v_proj"]` would
adapt cross-attention's queries alone, and `["k_proj", "v_proj"]` matches nothing. PEFT learns the model's own
defaults (`LORA_TARGET_MODULES`: every attention projection, BART's `q_proj`/`v_proj` in spirit) when it is imported
before a model is built, so `LoraConfig()` without `target_modules` adapts self- and cross-attention; and a model
whose adapters sit on cross-attention alone says so once, at its first forward with them.
"""

from __future__ import annotations

import sys
import warnings

from torch import nn

LORA_TARGET_MODULES = ["qkv_proj", "q_proj", "kv_proj"]
"""PEFT's default LoRA targets for `ode_transformer`: self-attention's fused query/key/value and cross-attention's
query and fused key/value (PEFT's for BART are the queries and values of both)."""

CROSS_ATTENTION_ONLY = (
    "LoRA adapts only cross-attention (encoder_attn) of this ODE Transformer: its self-attention projects query, "
    "key and value with one fused Linear named qkv_proj, so BART's q_proj/v_proj names reach cross-attention alone; "
    "add 'qkv_proj' to target_modules (or leave target_modules out for every attention projection)"
)


def register_peft_target_modules(model_type: str) -> None:
    """Give PEFT the default LoRA targets of `model_type`, where PEFT is imported already (importing it here would
    cost every model load); a default PEFT has of its own is kept."""
    constants = sys.modules.get("peft.utils.constants")
    mapping = getattr(constants, "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING", None)
    if isinstance(mapping, dict):
        mapping.setdefault(model_type, list(LORA_TARGET_MODULES))


def lora_reaches_only_cross_attention(model: nn.Module) -> bool | None:
    """Whether the LoRA adapters in `model` all sit in cross-attention; None where it has none (yet)."""
    adapted = [name for name, module in model.named_modules() if hasattr(module, "lora_A")]
    if not adapted:
        return None
    return all(".encoder_attn." in f".{name}." for name in adapted)


class LoraTargetCheck:
    """Mixin of the task models: at the first forward with LoRA adapters (PEFT imported), warn where they adapt
    cross-attention alone. Checked until adapters appear, then never again."""

    _lora_checked = False

    def check_lora_targets(self) -> None:
        if self._lora_checked or "peft" not in sys.modules:
            return
        only_cross = lora_reaches_only_cross_attention(self)
        if only_cross is None:
            return
        self._lora_checked = True
        if only_cross:
            warnings.warn(CROSS_ATTENTION_ONLY, UserWarning, stacklevel=3)
