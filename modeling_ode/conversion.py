"""A pretrained residual Transformer turned into ODE blocks, exactly (beyond the paper).

A pre-norm residual layer y + F(y) is one Euler step of the ODE block whose F is the layer without its residual
(the paper's reading of F). So a pretrained pre-norm seq2seq Transformer *is* an ODE Transformer with Euler
blocks: :func:`from_residual` maps its weights onto one (the same logits, to float rounding), and can swap the Euler
blocks for Runge-Kutta blocks that start as the Euler block (`learnable` coefficients starting at Euler's weights
(1, 0, ..., 0): exactly; a gate: within `EULER_GATE_EPSILON`), so fine-tuning starts from the pretrained function
and learns to use the later stages.

Sources (`SUPPORTED`):

- `M2M100ForConditionalGeneration` (M2M100, NLLB-200 such as facebook/nllb-200-distilled-600M): pre-norm layers with
  final LayerNorms, fairseq's sinusoidal positions counted over non-padding tokens from padding_idx + 1
  (`position_offset = pad_token_id + 1`), sqrt(d)-scaled embeddings shared by encoder, decoder and output, biases on
  every projection. Its attention projections keep their names (`q_proj`, `k_proj`, `v_proj`, `out_proj`).
- a residual `ODETransformerForConditionalGeneration` (Euler blocks, e.g. a `ode_transformer.train.run` model of the residual
  recipe): its weights as they are, its connections, positions and F kept; only the blocks change.

Other seq2seq classes are refused by name where a difference cannot be expressed in this model's config
(`REFUSED`: post-norm layers, learned positions, an embedding LayerNorm, another sinusoidal layout, ...), and any
other class with the list of what converts.

What does not carry over: LayerDrop (`encoder_layerdrop`/`decoder_layerdrop`, training only: fine-tuning runs
without it; a warning says so). The loss is plain cross entropy in both models (label smoothing is the Trainer's
`label_smoothing_factor`). The tokenizer is the source's (`ode_transformer.hub.upcycle` saves it beside the model).
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, PretrainedConfig, PreTrainedModel
from transformers.utils import logging

from .configuration_ode_transformer import ODETransformerConfig, _choice_fields
from .ode import GATED_MODES, resolve_tableau

__all__ = ["REFUSED", "SUPPORTED", "from_residual"]

logger = logging.get_logger(__name__)

SUPPORTED = {
    "m2m_100": "M2M100ForConditionalGeneration (M2M100, NLLB-200)",
    ODETransformerConfig.model_type: "a residual ODETransformerForConditionalGeneration (Euler blocks)",
}

_CHANGES = "converting would change the function"
# Seq2seq classes whose function this model cannot express exactly: model_type -> why (one line each).
REFUSED = {
    "marian": (
        "MarianMT is post-norm (a LayerNorm after each residual sum, no final LayerNorm); ODE blocks here are pre-norm: "
        f"{_CHANGES} (its sinusoidal positions also put sin of every frequency in the first half and cos in the "
        "second with another frequency scale than fairseq's, and it adds final_logits_bias)"
    ),
    "bart": (
        "BART is post-norm (a LayerNorm after each residual sum) with learned positions and an embedding LayerNorm; ODE "
        f"blocks here are pre-norm with sinusoidal positions: {_CHANGES}"
    ),
    "mbart": (
        "mBART has learned position embeddings (offset 2, counted by index, padding included) and a LayerNorm over the "
        "embeddings (layernorm_embedding); this model's embeddings are sqrt(d)-scaled tokens plus fixed sinusoidal "
        f"positions, not normalised: {_CHANGES}"
    ),
    "plbart": f"PLBart is mBART's architecture (learned positions, layernorm_embedding): {_CHANGES}",
    "fsmt": f"FSMT (fairseq WMT19) is post-norm; ODE blocks here are pre-norm: {_CHANGES}",
    "pegasus": (
        "Pegasus's sinusoidal positions put sin of every frequency in the first half and cos in the second, with "
        f"another frequency scale than fairseq's and no padding offset, and it adds final_logits_bias: {_CHANGES}"
    ),
    "t5": (
        "T5 has relative position buckets, RMSNorm and no biases or absolute positions; this model has fairseq "
        f"sinusoidal positions and LayerNorm with biases: {_CHANGES}"
    ),
    "mt5": f"mT5 is T5's architecture (relative position buckets, RMSNorm, no biases): {_CHANGES}",
    "umt5": f"UMT5 is T5's architecture (relative position buckets, RMSNorm, no biases): {_CHANGES}",
    "nllb-moe": f"NLLB-MoE has mixture-of-experts feed-forward layers; an ODE layer has one dense FFN: {_CHANGES}",
}

# What the caller chooses (the ODE blocks, regularisation): everything else is the source's architecture.
_SIDE_FIELDS = ("ode_method", "ode_coefficients", "ode_function")
CHOSEN = frozenset(
    {f"{side}_{field}" for side in ("encoder", "decoder") for field in _SIDE_FIELDS}
    | {"ode_coefficients_init", "ode_gate_init", "ode_gate_inputs", "ode_coefficient_scope", "ode_ema_alpha"}
    | {
        "ode_checkpoint_stages",
        "dropout",
        "attention_dropout",
        "activation_dropout",
        "use_cache",
    }
)


def from_residual(
    model_class: type[PreTrainedModel],
    source: str | os.PathLike | PreTrainedModel,
    *,
    encoder_ode_method: str | dict = "euler",
    decoder_ode_method: str | dict = "euler",
    encoder_ode_coefficients: str | None = None,
    decoder_ode_coefficients: str | None = None,
    **config_fields: Any,
) -> PreTrainedModel:
    """The pretrained residual seq2seq model `source` (a folder, a Hub id, or a loaded model) as an ODE Transformer
    (`model_class`, `ODETransformerForConditionalGeneration`, whose `from_residual` calls this one: this module
    imports no modeling code) whose encoder and decoder blocks are `encoder_ode_method` / `decoder_ode_method`, in
    eval mode.

    With Euler blocks (the default) it computes the source's function. A multi-stage method starts as the residual
    block too: its coefficients default to `learnable` starting at Euler's weights (`ode_coefficients_init="euler"`:
    y + 1 F1 + 0 F2 + ..., exact); asked for a gate, it starts within `EULER_GATE_EPSILON` of them
    (`ode_gate_init="euler"`). Other coefficients (`tableau`, `ema`, ...) are built as asked, with a warning that the
    converted model starts from another function.

    Args:
        source: an M2M100/NLLB-200 model, or a residual ODE Transformer (`SUPPORTED`).
        encoder_ode_method, decoder_ode_method: an `ODE_METHODS` name or a Butcher tableau.
        encoder_ode_coefficients, decoder_ode_coefficients: a `COEFFICIENT_MODES` name; default `tableau` for a
            one-stage method, else `learnable`.
        config_fields: further ODE fields and regularisation (`CHOSEN`: ode_*, dropout fields); a
            field of the architecture may be given only with the source's value.

    Raises:
        ValueError: the source's class is not supported (why, by name: `REFUSED`), an ODE source is not residual
            where its blocks change, or a field would change the architecture.
    """
    source_config = (
        source.config if isinstance(source, PreTrainedModel) else AutoConfig.from_pretrained(source)
    )
    _check_source(source_config)
    if not isinstance(source, PreTrainedModel):
        source_class = (
            model_class
            if source_config.model_type == ODETransformerConfig.model_type
            else AutoModelForSeq2SeqLM
        )
        source = source_class.from_pretrained(source)
    blocks = {"encoder_ode_method": encoder_ode_method, "decoder_ode_method": decoder_ode_method}
    for side, coefficients in (("encoder", encoder_ode_coefficients), ("decoder", decoder_ode_coefficients)):
        blocks[f"{side}_ode_coefficients"] = coefficients
    if source_config.model_type == ODETransformerConfig.model_type:
        base, state = _ode_base(source.config, blocks), source.state_dict()
    else:
        base, state = _m2m100_base(source.config), _m2m100_state_dict(source)
    config = _converted_config(base, blocks, config_fields)
    model = model_class(config)
    _load(model, state, _new_coefficient_prefixes(base, config))
    model.generation_config = copy.deepcopy(source.generation_config)
    _warn_where_the_start_differs(config)
    return model.eval()


# ----------------------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------------------


def _class_name(config: PretrainedConfig) -> str:
    return (config.architectures or [type(config).__name__.removesuffix("Config")])[0]


def _check_source(config: PretrainedConfig) -> None:
    """Refuse, by name and with the reason, a source whose function this model cannot express."""
    name, model_type = _class_name(config), config.model_type
    if model_type in SUPPORTED:
        if not config.is_encoder_decoder:
            raise ValueError(
                f"{name} is a decoder-only ODE Transformer; from_residual converts encoder-decoder models."
            )
        return
    if model_type in REFUSED:
        raise ValueError(f"{name} ({model_type}) cannot be converted exactly: {REFUSED[model_type]}.")
    supported = "; ".join(SUPPORTED.values())
    if not getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"{name} ({model_type}) is not an encoder-decoder (sequence-to-sequence) model; from_residual converts "
            f"{supported}."
        )
    raise ValueError(f"{name} ({model_type}) has no converter; from_residual converts {supported}.")


def _m2m100_base(source: PretrainedConfig) -> dict[str, Any]:
    """The ODE config fields of an M2M100 model: the same layers as Euler blocks with plain stacking, fairseq
    positions from padding_idx + 1, no relative positions, no label smoothing (M2M100's loss has none)."""
    if source.activation_function not in _choice_fields()["activation_function"][0]:
        raise ValueError(
            f"{_class_name(source)} uses activation_function={source.activation_function!r}, which this model does "
            f"not offer ({', '.join(_choice_fields()['activation_function'][0])}): {_CHANGES}."
        )
    if source.d_model % 2:
        raise ValueError(
            f"{_class_name(source)} has an odd d_model={source.d_model}: its sinusoidal table pads a zero column, "
            f"this model's needs an even size: {_CHANGES}."
        )
    if source.encoder_layerdrop or source.decoder_layerdrop:
        logger.warning(
            f"{_class_name(source)} trains with LayerDrop (encoder {source.encoder_layerdrop}, decoder "
            f"{source.decoder_layerdrop}); the ODE Transformer has none, so fine-tuning runs without it (inference is "
            "unaffected)."
        )
    fields = [
        "vocab_size",
        "d_model",
        "encoder_layers",
        "decoder_layers",
        "encoder_attention_heads",
        "decoder_attention_heads",
        "encoder_ffn_dim",
        "decoder_ffn_dim",
        "activation_function",
        "dropout",
        "attention_dropout",
        "activation_dropout",
        "init_std",
        "max_position_embeddings",
        "scale_embedding",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "decoder_start_token_id",
        "forced_eos_token_id",
        "tie_word_embeddings",
    ]
    return {
        **{field: getattr(source, field, None) for field in fields},
        "layer_norm_eps": 1e-5,  # M2M100's nn.LayerNorm default
        "use_absolute_positions": True,
        "position_offset": source.pad_token_id + 1,
        "max_relative_position": 0,
        # tied, M2M100 has one table for source, target and output; untied, three
        "share_encoder_decoder_embeddings": source.tie_word_embeddings,
        "encoder_layer_connections": "residual",
        "decoder_layer_connections": "residual",
        "ode_function_includes_residual": False,
        **{f"{side}_{field}": value for side in ("encoder", "decoder") for field, value in _EULER.items()},
    }


_EULER = {"ode_method": "euler", "ode_coefficients": "tableau", "ode_function": "layer"}


def _m2m100_state_dict(source: PreTrainedModel) -> dict[str, torch.Tensor]:
    """M2M100's weights under this model's names: `ffn.` in front of the feed-forward layers, everything else (the
    attention projections included) by its own name. Every source weight is used (`_load` checks it); the
    positions are a buffer that both models rebuild."""
    state = source.state_dict()
    # untied (tie_word_embeddings=False), M2M100 keeps no `shared` table: its decoder's is this model's `shared`
    state.setdefault("model.shared.weight", state["model.decoder.embed_tokens.weight"])
    return {re.sub(r"\.(fc1|fc2)\.", r".ffn.\1.", key): tensor for key, tensor in state.items()}


def _ode_base(source: ODETransformerConfig, blocks: dict[str, Any]) -> dict[str, Any]:
    """A residual ODE Transformer's config as it is; a side whose blocks change must hold Euler blocks with
    gamma = 1 (else there is no residual function to keep), and F is read the paper's way where every block of the
    source is Euler (the readings agree on Euler blocks)."""
    base = source.to_dict()
    for side in ("encoder", "decoder"):
        method, coefficients = base[f"{side}_ode_method"], base[f"{side}_ode_coefficients"]
        changes = blocks[f"{side}_ode_method"] != method or blocks[f"{side}_ode_coefficients"] not in (
            None,
            coefficients,
        )
        if changes and (method != "euler" or coefficients not in ("tableau", "ones")):
            raise ValueError(
                f"the source's {side} blocks are {method!r} with {coefficients!r} coefficients, not residual blocks "
                "(euler, gamma = 1): from_residual converts residual blocks; keep that side's method."
            )
    if all(source.tableau(side).num_stages == 1 for side in ("encoder", "decoder")):
        base["ode_function_includes_residual"] = False
    return base


# ----------------------------------------------------------------------------------------------------------
# The converted model
# ----------------------------------------------------------------------------------------------------------


def _converted_config(
    base: dict[str, Any], blocks: dict[str, Any], fields: dict[str, Any]
) -> ODETransformerConfig:
    """The source's fields with the chosen blocks and fields; the start defaults to the residual block."""
    known = {*ODETransformerConfig.__dataclass_fields__, *ODETransformerConfig.attribute_map}
    for key, value in fields.items():
        if key not in known:
            raise ValueError(f"`{key}` is not a configuration field of the ODE Transformer.")
        if key not in CHOSEN and value != base.get(key):
            raise ValueError(
                f"`{key}`={value!r} differs from the source's {base.get(key)!r}: the architecture is the source's; "
                f"only the ODE blocks and regularisation can be chosen ({', '.join(sorted(CHOSEN))})."
            )
    chosen = dict(fields)
    for side in ("encoder", "decoder"):
        method = blocks[f"{side}_ode_method"]
        coefficients = blocks[f"{side}_ode_coefficients"]
        if coefficients is None:
            coefficients = "tableau" if resolve_tableau(method).num_stages == 1 else "learnable"
        chosen.update({f"{side}_ode_method": method, f"{side}_ode_coefficients": coefficients})
    modes = {chosen["encoder_ode_coefficients"], chosen["decoder_ode_coefficients"]}
    if "learnable" in modes:
        chosen.setdefault("ode_coefficients_init", "euler")
    if modes & set(GATED_MODES):
        chosen.setdefault("ode_gate_init", "euler")
    keep = {key: value for key, value in base.items() if key in known}
    return ODETransformerConfig(**{**keep, **chosen})


def _new_coefficient_prefixes(base: dict[str, Any], config: ODETransformerConfig) -> tuple[str, ...]:
    """The coefficient modules that are new (their side's blocks changed): they start as `config` says."""
    return tuple(
        f"model.{side}.ode_coefficients."
        for side in ("encoder", "decoder")
        if (base[f"{side}_ode_method"], base[f"{side}_ode_coefficients"])
        != (getattr(config, f"{side}_ode_method"), getattr(config, f"{side}_ode_coefficients"))
    )


def _load(model: PreTrainedModel, state: dict[str, torch.Tensor], new: tuple[str, ...]):
    """Load the source's weights; only the new coefficient modules may be missing (and the source's old ones of the
    changed sides unused), anything else means the mapping is not exact."""
    target = model.state_dict()
    kept = {key: tensor for key, tensor in state.items() if not key.startswith(new)}
    shapes = [
        f"{k} {tuple(t.shape)} vs {tuple(target[k].shape)}"
        for k, t in kept.items()
        if k in target and t.shape != target[k].shape
    ]
    missing = sorted(key for key in target if key not in kept and not key.startswith(new))
    unused = sorted(key for key in kept if key not in target)
    if missing or unused or shapes:
        raise ValueError(
            "the source's weights do not map onto the converted model: "
            f"missing {missing[:5]}, unused {unused[:5]}, other shapes {shapes[:5]}."
        )
    with torch.no_grad():
        for key, tensor in kept.items():
            target[key].copy_(tensor)


def _warn_where_the_start_differs(config: ODETransformerConfig) -> None:
    """Say where the converted model does not start as the source's function (coefficients asked for that are not
    Euler's), and how far a gate starts from it."""
    for side in ("encoder", "decoder"):
        if config.tableau(side).num_stages == 1:
            continue
        coefficients = getattr(config, f"{side}_ode_coefficients")
        if coefficients == "learnable" and config.ode_coefficients_init == "euler":
            continue
        if coefficients in GATED_MODES and config.ode_gate_init == "euler":
            continue
        logger.warning(
            f"the converted {side} blocks ({getattr(config, f'{side}_ode_method')}, {coefficients} coefficients) do not "
            "start as the residual block: the model computes another function than the source until fine-tuned; "
            "`learnable` coefficients with `ode_coefficients_init='euler'` start exactly as the source."
        )
