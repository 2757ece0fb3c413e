"""LoRA target names for PEFT.

Every attention, self and cross, has BART's projections `q_proj`, `k_proj`, `v_proj` and `out_proj`, so BART's
usual `LoraConfig(target_modules=["q_proj", "v_proj"])` adapts the queries and values of every block, in the encoder
and the decoder. PEFT learns the same default (`LORA_TARGET_MODULES`, PEFT's own for BART) when it is imported before
a model is built, so `LoraConfig()` without `target_modules` does that too.

Adapters trained on the fused projections of earlier releases (`qkv_proj`, `kv_proj`) name modules that no longer
exist: PEFT refuses them; train them again on `q_proj`/`k_proj`/`v_proj`.
"""

from __future__ import annotations

import sys

LORA_TARGET_MODULES = ["q_proj", "v_proj"]
"""PEFT's default LoRA targets for `ode_transformer`: the queries and values of every attention, as PEFT's for BART."""


def register_peft_target_modules(model_type: str) -> None:
    """Give PEFT the default LoRA targets of `model_type`, where PEFT is imported already (importing it here would
    cost every model load); a default PEFT has of its own is kept."""
    constants = sys.modules.get("peft.utils.constants")
    mapping = getattr(constants, "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING", None)
    if isinstance(mapping, dict):
        mapping.setdefault(model_type, list(LORA_TARGET_MODULES))
