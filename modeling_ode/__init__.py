"""ODE Transformer (Li et al., ACL 2022) for Hugging Face Transformers.

Importing this package registers `ode_transformer` with AutoConfig, AutoModel, AutoModelForSeq2SeqLM and
AutoModelForCausalLM, and registers the classes for those auto classes (`register_for_auto_class`): every
`save_pretrained` folder then carries `auto_map` and the module files: the configuration and modeling files and
the modules the modeling file imports (relative imports, which transformers copies beside it), and loads with
`trust_remote_code=True` where this package is not installed.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from .configuration_ode_transformer import (
    LAYER_CONNECTIONS,
    ODE_FUNCTIONS,
    PAPER_LABEL_SMOOTHING,
    PRESETS,
    ODETransformerConfig,
)
from .modeling_ode_transformer import (
    ODETransformerDecoder,
    ODETransformerEncoder,
    ODETransformerForCausalLM,
    ODETransformerForConditionalGeneration,
    ODETransformerModel,
    ODETransformerPreTrainedModel,
)
from .ode import COEFFICIENT_MODES, ODE_METHODS, ButcherTableau, StageCoefficients, ode_step
from .tokenizer_limits import fit_tokenizer_to_model, tokenizer_limits
from .weights_integrity import non_finite_message, non_finite_tensors

AutoConfig.register(ODETransformerConfig.model_type, ODETransformerConfig, exist_ok=True)
AutoModel.register(ODETransformerConfig, ODETransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(ODETransformerConfig, ODETransformerForConditionalGeneration, exist_ok=True)
AutoModelForCausalLM.register(ODETransformerConfig, ODETransformerForCausalLM, exist_ok=True)
ODETransformerConfig.register_for_auto_class("AutoConfig")
ODETransformerModel.register_for_auto_class("AutoModel")
ODETransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
ODETransformerForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "COEFFICIENT_MODES",
    "LAYER_CONNECTIONS",
    "ODE_FUNCTIONS",
    "ODE_METHODS",
    "PAPER_LABEL_SMOOTHING",
    "PRESETS",
    "ButcherTableau",
    "ODETransformerConfig",
    "ODETransformerDecoder",
    "ODETransformerEncoder",
    "ODETransformerForCausalLM",
    "ODETransformerForConditionalGeneration",
    "ODETransformerModel",
    "ODETransformerPreTrainedModel",
    "StageCoefficients",
    "fit_tokenizer_to_model",
    "non_finite_message",
    "non_finite_tensors",
    "ode_step",
    "tokenizer_limits",
]
