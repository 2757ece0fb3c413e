"""PyTorch ODE Transformer (Li et al., ACL 2022): a pre-norm Transformer whose blocks are Runge-Kutta solvers.

The file reads top-down like BART's: outputs, embeddings and masks, attention, feed-forward, the layer, how
layers are stacked, the stacks (encoder, decoder) and the models (encoder-decoder, conditional generation,
decoder-only causal LM). The per-stage KV cache, the beam-search cache and the generation hook live in
`cache_ode.py`; the numerics of an ODE block live in `ode.py`. A layer here only says what F is (which sublayers,
with which cache slot per stage) and hands it to `ode_step`. Optional outputs (hidden states, attentions, ODE stages) are recorded by transformers'
`capture_outputs` hooks, as in BART.
"""

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import wraps
from typing import NamedTuple

import torch
import torch.nn.functional as nnf
import torch.utils.checkpoint
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.masking_utils import bidirectional_mask_function, causal_mask_function, eager_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    CausalLMOutputWithCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, logging
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .cache_ode import (
    BeamSearchCache,
    ODEGenerationMixin,
    StageCacheLayout,
    beams_per_source,
    cache_attention_function,
    self_attention_cache,
)
from .compat import (
    CACHE_FIELD,
    CACHE_KWARGS,
    active_output_collector,
    attention_implementation,
    cache_argument,
    is_loaded_weight,
    register_weight_splits,
)
from .configuration_ode_transformer import ODETransformerConfig
from .dropout import FastDropout, fast_dropout
from .input_checks import check_attention_mask, check_labels, check_token_ids
from .lora import register_peft_target_modules
from .ode import (
    CROSS_ATTENTION,
    FFN,
    SELF_ATTENTION,
    ODEStageRecorder,
    StageCoefficients,
    StageGate,
    ode_groups,
    ode_step,
    start_weights,
)
from .weights_integrity import WeightsFileGuards

__all__ = [
    "ODETransformerPreTrainedModel",
    "ODETransformerEncoder",
    "ODETransformerDecoder",
    "ODETransformerModel",
    "ODETransformerForConditionalGeneration",
    "ODETransformerForCausalLM",
    "StageCacheLayout",
    "BeamSearchCache",
]

logger = logging.get_logger(__name__)

# ----------------------------------------------------------------------------------------------------------
# Outputs: the usual HF outputs plus, on request (`output_ode_stages=True`), every ODE block's stage values
# F_1..F_s stacked to (s, batch, length, d) and its coefficients gamma ((s,) or (s, batch, length, 1)).
# ----------------------------------------------------------------------------------------------------------


class ODETransformerKwargs(TransformersKwargs, total=False):
    """transformers' forward kwargs plus `output_ode_stages`: record every ODE block's stages and coefficients."""

    output_ode_stages: bool | None


@dataclass
class ODEEncoderOutput(BaseModelOutput):
    ode_stages: tuple[torch.Tensor, ...] | None = None
    ode_coefficients: tuple[torch.Tensor, ...] | None = None


@dataclass
class ODEDecoderOutput(BaseModelOutputWithPastAndCrossAttentions):
    ode_stages: tuple[torch.Tensor, ...] | None = None
    ode_coefficients: tuple[torch.Tensor, ...] | None = None


@dataclass
class ODESeq2SeqModelOutput(Seq2SeqModelOutput):
    encoder_ode_stages: tuple[torch.Tensor, ...] | None = None
    encoder_ode_coefficients: tuple[torch.Tensor, ...] | None = None
    decoder_ode_stages: tuple[torch.Tensor, ...] | None = None
    decoder_ode_coefficients: tuple[torch.Tensor, ...] | None = None


@dataclass
class ODESeq2SeqLMOutput(Seq2SeqLMOutput):
    encoder_ode_stages: tuple[torch.Tensor, ...] | None = None
    encoder_ode_coefficients: tuple[torch.Tensor, ...] | None = None
    decoder_ode_stages: tuple[torch.Tensor, ...] | None = None
    decoder_ode_coefficients: tuple[torch.Tensor, ...] | None = None


@dataclass
class ODECausalLMOutput(CausalLMOutputWithCrossAttentions):
    ode_stages: tuple[torch.Tensor, ...] | None = None
    ode_coefficients: tuple[torch.Tensor, ...] | None = None


def records_ode_coefficients(forward: Callable) -> Callable:
    """One flag for two recorded outputs: `output_ode_stages=True` records every block's stages and its
    coefficients (`capture_outputs` keys each output on its own `output_<name>` flag)."""

    @wraps(forward)
    def wrapper(self, *args, **kwargs):
        if kwargs.get("output_ode_stages"):
            kwargs.setdefault("output_ode_coefficients", True)
        return forward(self, *args, **kwargs)

    return wrapper


# ----------------------------------------------------------------------------------------------------------
# Embeddings, masks, positions
# ----------------------------------------------------------------------------------------------------------


def sinusoidal_positions(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """fairseq's sinusoidal embedding of integer `positions` (any shape): [sin | cos] halves, frequencies
    10000^(-i / (dim/2 - 1)). Computed from the positions themselves, so no table bounds the sequence length (fairseq
    grows its table on demand to the same effect)."""
    half = dim // 2
    freq = torch.exp(
        torch.arange(half, dtype=torch.float, device=positions.device) * -(math.log(10000.0) / (half - 1))
    )
    angles = positions.float()[..., None] * freq
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


class ODETransformerEmbeddings(nn.Module):
    """sqrt(d) * token embedding + sinusoidal position, then dropout. The positions hold no parameters and have no
    length limit: `max_position_embeddings` records the positions a model was built for (at least its training
    lengths), not a bound; the length it was trained on is its tokenizer's `model_max_length`."""

    def __init__(self, config: ODETransformerConfig):
        super().__init__()
        self.scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.dropout = FastDropout(config.dropout)
        self.use_positions, self.offset, self.dim = (
            config.use_absolute_positions,
            config.position_offset,
            config.d_model,
        )

    def forward(
        self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor | None = None, past_length: int = 0
    ) -> torch.Tensor:
        """`position_ids` (batch or 1, length): each token's position in its own sequence (`token_positions`);
        by default past_length, past_length + 1, ..."""
        length = inputs_embeds.shape[1]
        if length == 0:
            raise ValueError(
                "the input is empty (sequence length 0); give every sequence at least one token (e.g. `</s>`)."
            )
        hidden = inputs_embeds * self.scale
        if self.use_positions:
            if position_ids is None:
                position_ids = torch.arange(past_length, past_length + length, device=hidden.device)[None]
            hidden = hidden + sinusoidal_positions(position_ids + self.offset, self.dim).to(hidden.dtype)
        return self.dropout(hidden)


def padding_mask(
    mask: torch.Tensor | None, inputs_embeds: torch.Tensor, query_length: int
) -> torch.Tensor | None:
    """(batch, keys) 1/0 mask -> additive (batch, 1, query_length, keys) mask, or None when nothing is masked."""
    if mask is None:
        return None
    return eager_mask(
        batch_size=mask.shape[0],
        q_length=query_length,
        kv_length=mask.shape[-1],
        mask_function=bidirectional_mask_function,
        attention_mask=mask.bool(),
        dtype=inputs_embeds.dtype,
        allow_is_bidirectional_skip=True,
        device=inputs_embeds.device,
    )


def causal_mask(
    mask: torch.Tensor | None, inputs_embeds: torch.Tensor, past: int | torch.Tensor, key_length: int
) -> torch.Tensor:
    """Additive (batch, 1, length, key_length) mask for queries at positions past.., causal plus the padding
    of `mask` (batch, past + length). Always materialised: the relative-position bias is added to it."""
    batch, length = inputs_embeds.shape[:2]
    return eager_mask(
        batch_size=batch,
        q_length=length,
        kv_length=key_length,
        q_offset=past,
        mask_function=causal_mask_function,
        attention_mask=None if mask is None else mask.bool(),
        dtype=inputs_embeds.dtype,
        device=inputs_embeds.device,
    )


def token_positions(
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    past: int,
    length: int,
    key_length: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(query positions (b, length), key positions (b, key_length)), b the batch size or 1: each token's position
    in its own sequence, counted over the tokens `attention_mask` (batch, past + length) keeps, as GPT-2 and Llama
    build `position_ids`. Left or right padding then shifts no token (padding is masked, whatever its position).
    `position_ids` (as `generate` passes them) give the queries' positions; the cached keys' come from the mask.
    Keys past the mask (the unwritten part of a static cache) are masked too and get position 0."""
    if attention_mask is None:
        keys = torch.arange(key_length, device=device)[None]
    else:
        keys = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        keys = nnf.pad(keys, (0, key_length - keys.shape[1]))
    # The queries' columns; gathered and scattered, not sliced: under a static cache `past` is a tensor.
    columns = (torch.arange(length, device=keys.device) + past)[None]
    if position_ids is None:
        return keys.gather(1, columns.expand(keys.shape[0], -1)), keys
    batch = max(keys.shape[0], position_ids.shape[0])
    queries = position_ids.to(keys.device).expand(batch, -1)
    return queries, keys.expand(batch, -1).scatter(1, columns.expand(batch, -1), queries)


def relative_position_index(
    query_positions: torch.Tensor, key_positions: torch.Tensor, max_distance: int
) -> torch.Tensor:
    """Shaw et al. (2018): the bucket of distance j - i between the positions of key j and query i, clipped to
    [-k, k] and shifted to [0, 2k]; (b, 1, queries, keys), broadcast over the heads."""
    distance = key_positions[:, None, :] - query_positions[:, :, None]
    return (distance.clamp(-max_distance, max_distance) + max_distance)[:, None]


# ----------------------------------------------------------------------------------------------------------
# Attention and feed-forward
# ----------------------------------------------------------------------------------------------------------


def _collecting_attention_weights() -> bool:
    """Whether the running `capture_outputs` call records attention weights. Its hooks stay on the modules once
    any output was recorded, so the hooks alone do not say it: `output_hidden_states=True` once must not switch
    every later forward to eager attention."""
    collecting = active_output_collector()
    return bool(collecting) and ("attentions" in collecting or "cross_attentions" in collecting)


def _fused_gain(parts: int) -> float:
    """The xavier-uniform gain that gives a (d, d) projection the bound of a fused (parts * d, d) matrix's:
    sqrt(6 / (d + parts * d)) = gain * sqrt(6 / (d + d))."""
    return math.sqrt(2 / (1 + parts))


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    weights, probs = module.attention_probs(
        torch.matmul(query, key.transpose(2, 3)) * scaling, attention_mask, dropout
    )
    output = torch.matmul(probs, value)
    relative = module.relative_value_term(probs, kwargs.get("relative_index"))
    output = output if relative is None else output + relative
    return output.transpose(1, 2).contiguous(), weights


FUSED_PROJECTIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "kv_proj": ("k_proj", "v_proj")}
"""Fused projections of earlier checkpoints -> the projections they stack along dim 0: self-attention's `qkv_proj`
(fairseq's `in_proj`) and cross-attention's `kv_proj`. Such checkpoints load into the separate projections,
through `from_pretrained` (`register_weight_splits`) and `load_state_dict` (`split_fused_projections`)."""


def split_fused_projections(state_dict: dict[str, torch.Tensor], prefix: str = "") -> None:
    """Replace, in place, the fused projections (`FUSED_PROJECTIONS`) of the attention module under `prefix` by
    the separate ones they stack: `prefix + "qkv_proj.weight"` becomes the q, k and v weights, and so on."""
    for fused, parts in FUSED_PROJECTIONS.items():
        for kind in ("weight", "bias"):
            tensor = state_dict.pop(f"{prefix}{fused}.{kind}", None)
            if tensor is not None:
                for part, chunk in zip(parts, tensor.chunk(len(parts)), strict=True):
                    state_dict[f"{prefix}{part}.{kind}"] = chunk


register_weight_splits(
    ODETransformerConfig.model_type,
    {
        f"{attention}.{fused}": [f"{attention}.{part}" for part in FUSED_PROJECTIONS[fused]]
        for attention, fused in (("self_attn", "qkv_proj"), ("encoder_attn", "kv_proj"))
    },
)


class ODETransformerAttention(nn.Module):
    """Multi-head attention with BART's projections, `q_proj`, `k_proj`, `v_proj` and `out_proj`, in self- and
    cross-attention alike; self-attention has optional Shaw relative position tables shared by all heads.

    Earlier checkpoints fused q, k and v (`FUSED_PROJECTIONS`); they load into these, and these are initialised as
    rows of those fused matrices were (xavier-uniform over self-attention's 3d rows, cross-attention's 2d k/v rows:
    the gain `_fused_gain`), so that a seed builds the same model as before."""

    def __init__(self, config: ODETransformerConfig, num_heads: int, is_cross_attention: bool):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.is_cross_attention = is_cross_attention
        self.is_causal = False  # masks are always explicit (they carry the relative-position bias)
        d = config.d_model
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)
        fused = (self.k_proj, self.v_proj) if is_cross_attention else (self.q_proj, self.k_proj, self.v_proj)
        for projection in fused:
            projection.xavier_gain = _fused_gain(len(fused))  # read by `_init_weights`
        num_buckets = 2 * config.max_relative_position + 1
        use_relative = not is_cross_attention and config.max_relative_position > 0
        self.relative_keys = nn.Parameter(torch.empty(num_buckets, self.head_dim)) if use_relative else None
        use_values = use_relative and config.relative_position_values
        self.relative_values = nn.Parameter(torch.empty(num_buckets, self.head_dim)) if use_values else None

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], -1, self.head_dim).transpose(1, 2)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        split_fused_projections(state_dict, prefix)  # an earlier checkpoint's fused q/k/v (Trainer's resume)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _cached_key_values(self, hidden_states, key_value_states, cache, cache_slot):
        """Keys and values for this call, read from or written to the cache slot of this (layer, stage)."""
        if not self.is_cross_attention:
            query = self.q_proj(hidden_states)
            key, value = self._heads(self.k_proj(hidden_states)), self._heads(self.v_proj(hidden_states))
            if cache is not None:
                key, value = self_attention_cache(cache).update(key, value, cache_slot)
            return query, key, value
        query = self.q_proj(hidden_states)
        if cache is not None and cache.is_updated.get(cache_slot):
            layer = cache.cross_attention_cache.layers[cache_slot]
            return query, layer.keys, layer.values
        # generate repeats each source's encoder states once per beam: keys and values are computed and kept once
        beams = beams_per_source(cache)
        if beams > 1 and (
            key_value_states.shape[0] % beams or key_value_states.shape[0] != hidden_states.shape[0]
        ):
            raise ValueError(
                f"a beam-search cache of {beams} beams needs the encoder states repeated once per beam, as generate "
                f"repeats them: {hidden_states.shape[0]} decoder rows, {key_value_states.shape[0]} encoder rows"
            )
        key_value_states = key_value_states[::beams]
        key, value = self._heads(self.k_proj(key_value_states)), self._heads(self.v_proj(key_value_states))
        if cache is not None:
            key, value = cache.cross_attention_cache.update(key, value, cache_slot)
            cache.is_updated[cache_slot] = True
        return query, key, value

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,
        relative_index: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache_slot: int = 0,
        return_weights: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(output, attention weights); the weights are None under SDPA and when `return_weights` is False (an ODE
        block reports those of its last stage: `capture_outputs` records the weights that are not None)."""
        query, key, value = self._cached_key_values(
            hidden_states, key_value_states, past_key_values, cache_slot
        )
        query = self._heads(query)
        if self.relative_keys is not None:
            bias = self._relative_key_bias(query, relative_index)
            attention_mask = bias if attention_mask is None else attention_mask + bias
            if attention_mask.dtype == torch.float16:  # its min plus a negative bias is -inf: masked rows NaN
                attention_mask = attention_mask.clamp_min(torch.finfo(torch.float16).min)
        output, weights = self._attention_function(return_weights, past_key_values)(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=self.scaling,
            dropout=self.dropout if self.training else 0.0,
            relative_index=relative_index,
        )
        if torch.compiler.is_exporting():
            # Merging the heads below is a view. SDPA's CPU kernel lays its output out (batch, length, heads,
            # head_dim), so torch.export records the backend's `.contiguous()` as nothing and the merge as a view,
            # which fails once the ONNX exporter has decomposed SDPA into matmuls laid out (batch, heads, length,
            # head_dim) (pytorch/pytorch#136543; `.contiguous()` here would be recorded as nothing too). An exported
            # graph copies explicitly; eager and `torch.compile` keep the free view.
            output = output.clone(memory_format=torch.contiguous_format)
        output = self.out_proj(output.reshape(*hidden_states.shape[:-1], -1))
        return output, weights if return_weights else None

    def attention_probs(
        self, scores: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, probabilities) of scaled scores: the additive mask added, softmax in float32 (back in the
        scores' dtype), then dropout in training; the eager and the beam-search attention share it."""
        dtype = scores.dtype  # the query's: a mask of another dtype does not change it
        if attention_mask is not None:
            scores = scores + attention_mask
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
        return weights, fast_dropout(weights, p=dropout, training=self.training)

    def relative_value_term(
        self, probs: torch.Tensor, relative_index: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Shaw et al.'s value term sum_j p_ij a^V_{clip(j - i)} (gathered per bucket, then projected), (rows,
        heads, q, head_dim); None without relative value tables."""
        if self.relative_values is None or relative_index is None:
            return None
        buckets = probs.new_zeros(*probs.shape[:-1], self.relative_values.shape[0])
        buckets.scatter_add_(-1, relative_index.expand_as(probs), probs)
        return torch.matmul(buckets, self.relative_values)

    def _relative_key_bias(self, query: torch.Tensor, relative_index: torch.Tensor) -> torch.Tensor:
        """Shaw et al. key term q_i . a^K_{clip(j - i)}, added to the logits as a bias (scaled like q.k)."""
        bias = torch.matmul(query, self.relative_keys.transpose(0, 1).to(query.dtype))
        return (
            bias.gather(-1, relative_index.expand(*bias.shape[:-1], relative_index.shape[-1])) * self.scaling
        )

    def _attention_function(self, return_weights: bool, cache: Cache | None = None) -> Callable:
        """The configured attention backend; relative position values need the eager path, and so do recorded
        weights (`output_attentions=True`): SDPA computes none. Under a beam-search cache of several beams, keys and
        values are kept once per source, in a layout its own function reads (`cache_attention_function`)."""
        reads_cache = cache_attention_function(cache, self.is_cross_attention)
        if reads_cache is not None:
            return reads_cache
        implementation = attention_implementation(self.config)
        if return_weights and _collecting_attention_weights() and implementation not in (None, "eager"):
            logger.warning_once(
                f"`output_attentions=True`: the {implementation!r} attention returns no weights, so these calls use "
                "eager attention; load the model with `attn_implementation='eager'` to make that the default."
            )
            implementation = "eager"
        if self.relative_values is not None or implementation in (None, "eager"):
            return eager_attention_forward
        return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)


class ODETransformerFeedForward(nn.Module):
    def __init__(self, config: ODETransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation = ACT2FN[config.activation_function]
        self.activation_dropout = FastDropout(config.activation_dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_dropout(self.activation(self.fc1(hidden_states))))


# ----------------------------------------------------------------------------------------------------------
# The layer: sublayers grouped into ODE functions F
# ----------------------------------------------------------------------------------------------------------


def _checkpoint_later_stages(function: Callable) -> Callable:
    """`ode_checkpoint_stages`: stages 2..s keep only their input for the backward pass and are recomputed there
    (dropout masks included), so an s-stage block stores about the activations of a residual block."""

    def checkpointed(x: torch.Tensor, stage: int) -> torch.Tensor:
        if stage == 0:
            return function(x, stage)
        return torch.utils.checkpoint.checkpoint(function, x, stage, use_reentrant=False)

    return checkpointed


class SublayerInputs(NamedTuple):
    """What the attention sublayers of one layer read besides their input x (the same for every stage)."""

    attention_mask: torch.Tensor | None
    encoder_hidden_states: torch.Tensor | None
    encoder_attention_mask: torch.Tensor | None
    relative_index: torch.Tensor | None
    past_key_values: Cache | None


class ODETransformerLayer(GradientCheckpointingLayer):
    """A pre-norm layer (self-attention, optional cross-attention, FFN) whose sublayers form one or more ODE
    blocks. Paper reading: F(y) = G(LN(y)), summed over the sublayers of a block (each sublayer's input being
    the running sum); with `ode_function_includes_residual` F is the whole pre-norm computation, residuals
    included, as in the authors' code.

    With `predictor_corrector` connections the blocks are PCformer's predictor, and the layer then evaluates
    itself once more as the corrector, on the input the stack's `LayerConnections` make of the prediction
    (`corrector_base`, `connections`): one more evaluation with the layer's parameters, at its own cache slot."""

    def __init__(self, config: ODETransformerConfig, side: str, layer_idx: int, has_cross_attention: bool):
        super().__init__()
        d, eps = config.d_model, config.layer_norm_eps
        heads = getattr(config, f"{side}_attention_heads")
        self.self_attn = ODETransformerAttention(config, heads, is_cross_attention=False)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=eps)
        sublayers = (SELF_ATTENTION,)
        if has_cross_attention:
            self.encoder_attn = ODETransformerAttention(config, heads, is_cross_attention=True)
            self.encoder_attn_layer_norm = nn.LayerNorm(d, eps=eps)
            sublayers += (CROSS_ATTENTION,)
        self.ffn = ODETransformerFeedForward(config, getattr(config, f"{side}_ffn_dim"))
        self.final_layer_norm = nn.LayerNorm(d, eps=eps)
        sublayers += (FFN,)
        self.dropout = FastDropout(config.dropout)

        self.layer_idx = layer_idx
        self.tableau = config.tableau(side)
        self.step_size = float(config.ode_step_size)
        self.includes_residual = config.ode_function_includes_residual and self.tableau.num_stages > 1
        self.checkpoint_stages = config.ode_checkpoint_stages and self.tableau.num_stages > 1
        self.groups = ode_groups(getattr(config, f"{side}_ode_function"), sublayers)
        self.cache_layout = StageCacheLayout.from_config(config, side)
        corrects = getattr(config, f"{side}_layer_connections") == "predictor_corrector"
        self.corrector_stage = self.cache_layout.stages - 1 if corrects else None

    @property
    def num_ode_blocks(self) -> int:
        return sum(is_ode for _, is_ode in self.groups)

    def _sublayer(
        self, name: str, x: torch.Tensor, stage: int, last: bool, inputs: SublayerInputs
    ) -> torch.Tensor:
        """dropout(G(LN(x))) for one sublayer; attention reports its weights at the block's `last` stage."""
        if name == FFN:
            return self.dropout(self.ffn(self.final_layer_norm(x)))
        if name == SELF_ATTENTION:
            out, _ = self.self_attn(
                self.self_attn_layer_norm(x),
                attention_mask=inputs.attention_mask,
                relative_index=inputs.relative_index,
                past_key_values=inputs.past_key_values,
                cache_slot=self.cache_layout.slot(self.layer_idx, stage),
                return_weights=last,
            )
        else:
            out, _ = self.encoder_attn(
                self.encoder_attn_layer_norm(x),
                attention_mask=inputs.encoder_attention_mask,
                key_value_states=inputs.encoder_hidden_states,
                past_key_values=inputs.past_key_values,
                cache_slot=self.layer_idx,
                return_weights=last,
            )
        return self.dropout(out)

    def _function(self, names: tuple[str, ...], is_ode: bool, inputs: SublayerInputs) -> Callable:
        """F(x, stage) of one block: its sublayers in sequence, each reading the running sum. Attention weights
        are reported by the layer's last evaluation: the block's last stage, or the corrector."""
        last_stage = self.tableau.num_stages - 1 if is_ode else 0
        if self.corrector_stage is not None:
            last_stage = self.corrector_stage
        includes_residual = self.includes_residual and is_ode

        def function(x: torch.Tensor, stage: int) -> torch.Tensor:
            delta = None
            for name in names:
                z = x if delta is None else x + delta
                out = self._sublayer(name, z, stage, stage == last_stage, inputs)
                delta = out if delta is None else delta + out
            return x + delta if includes_residual else delta

        if is_ode and self.checkpoint_stages and self.training and torch.is_grad_enabled():
            return _checkpoint_later_stages(function)
        return function

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        corrector_base: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        relative_index: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        coefficients: Sequence[StageCoefficients] = (),
        connections: "LayerConnections | None" = None,
    ) -> torch.Tensor:
        """The layer's blocks on `hidden_states`; with `corrector_base` (the stack's part of the corrector input,
        `LayerConnections.corrector_base`) their result is PCformer's prediction P, and the layer returns its
        corrector, layer(corrector_base + V[t+1, t+1] LN'(P)). Tensors are positional for reentrant checkpointing."""
        inputs = SublayerInputs(
            attention_mask, encoder_hidden_states, encoder_attention_mask, relative_index, past_key_values
        )
        ode_blocks = iter(coefficients)
        for names, is_ode in self.groups:
            function = self._function(names, is_ode, inputs)
            if is_ode:
                hidden_states = ode_step(
                    hidden_states, function, self.tableau, next(ode_blocks), self.step_size
                )
            else:
                hidden_states = hidden_states + function(hidden_states, 0)
        if corrector_base is None:
            return hidden_states
        corrector_input = connections.corrector_input(corrector_base, self.layer_idx, hidden_states)
        return self._correct(corrector_input, inputs)

    def _correct(self, hidden_states: torch.Tensor, inputs: SublayerInputs) -> torch.Tensor:
        """PCformer's corrector: the whole layer once more, x + G(LN(x)) sublayer by sublayer, at the corrector's
        cache slot. A single evaluation is the plain pre-norm layer in both readings of F (as an Euler block)."""
        for names, is_ode in self.groups:
            out = self._function(names, is_ode, inputs)(hidden_states, self.corrector_stage)
            hidden_states = out if is_ode and self.includes_residual else hidden_states + out
        return hidden_states


# ----------------------------------------------------------------------------------------------------------
# How blocks are stacked
# ----------------------------------------------------------------------------------------------------------


class LayerConnections(nn.Module):
    """Connections between the blocks of a stack (Table "comparison"; `ode.LAYER_CONNECTIONS`). States are kept
    in a list `history`:

    - residual:  y_{t+1} = block(y_t).
    - leapfrog:  y_{t+1} = y_{t-1} + 2 (block(y_t) - y_t); the first step is Euler.
    - multistep: y_{t+1} = k y_t + (1 - k) y_{t-1} + (block(y_t) - y_t), k learnable per block and dimension
      (initialised uniformly in (-1, 0) as in the authors' code); the first step is Euler.
    - dense / learnable_dense (DLCL, Wang et al. 2019): the embedding output and the layer-normalised output of
      every block are stored; block t reads sum_j W[t, j] state_j, and the stack output is row L of W. W is lower
      triangular with rows initialised to a plain mean; `dense` keeps it fixed.
    - predictor_corrector (PCformer, Li et al. 2024): learnable dense connections whose blocks are predictors.
      Block t's prediction P joins the history as LN'_t(P) (its own LayerNorms, `predictor_norms`); the layer
      is evaluated once more on the corrector input c = sum_{j<=t} V[t+1, j] state_j + V[t+1, t+1] LN'_t(P)
      (V: `corrector_weight`, lower triangular, plain means at first), and LN_t(layer(c)) takes the
      prediction's place: state_{t+1}. As in DLCL, block t + 1 then reads row t + 1 of W. Added parameters:
      V ((L + 1)^2) and the L predictor LayerNorms (2 d each), besides DLCL's W and LayerNorms.
    """

    def __init__(self, kind: str, num_layers: int, hidden_size: int, eps: float):
        super().__init__()
        self.kind = kind
        # Dense connections read a weighted sum of every stored state; the others read the last state.
        self.is_dense = kind in ("dense", "learnable_dense", "predictor_corrector")
        self.corrects = kind == "predictor_corrector"
        if self.is_dense:
            weight = self.mean_weights(num_layers)
            if kind == "dense":
                self.register_buffer("weight", weight, persistent=False)
            else:
                self.weight = nn.Parameter(weight)
            self.layer_norms = nn.ModuleList(nn.LayerNorm(hidden_size, eps=eps) for _ in range(num_layers))
        if self.corrects:
            self.corrector_weight = nn.Parameter(self.mean_weights(num_layers))
            self.predictor_norms = nn.ModuleList(
                nn.LayerNorm(hidden_size, eps=eps) for _ in range(num_layers)
            )
        elif kind == "multistep":
            self.k = nn.Parameter(torch.empty(num_layers, hidden_size))

    @staticmethod
    def mean_weights(num_layers: int) -> torch.Tensor:
        """Lower-triangular (L + 1) x (L + 1) weights whose rows are plain means of the states so far."""
        weight = torch.ones(num_layers + 1, num_layers + 1).tril()
        return weight / weight.sum(dim=1, keepdim=True)

    def _weighted_sum(
        self, history: list[torch.Tensor], row: int, weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        weights = (self.weight if weight is None else weight)[row].to(history[0].dtype)
        out = weights[0] * history[0]
        for j in range(1, len(history)):
            out = out + weights[j] * history[j]
        return out

    def corrector_base(self, history: list[torch.Tensor], index: int) -> torch.Tensor | None:
        """The part of block `index`'s corrector input known before its prediction, sum_{j<=t} V[t+1, j] state_j
        (None unless the connections are `predictor_corrector`)."""
        return self._weighted_sum(history, index + 1, self.corrector_weight) if self.corrects else None

    def corrector_input(self, base: torch.Tensor, index: int, prediction: torch.Tensor) -> torch.Tensor:
        """PCformer's corrector input c = base + V[t+1, t+1] LN'_t(P), for the prediction P of block t = `index`."""
        weight = self.corrector_weight[index + 1, index + 1].to(prediction.dtype)
        return base + weight * self.predictor_norms[index](prediction)

    def layer_input(self, history: list[torch.Tensor], index: int) -> torch.Tensor:
        return self._weighted_sum(history, index) if self.is_dense else history[-1]

    def push(
        self, history: list[torch.Tensor], index: int, block_input: torch.Tensor, block_output: torch.Tensor
    ) -> None:
        if self.is_dense:
            history.append(self.layer_norms[index](block_output))
        elif self.kind == "leapfrog" and index > 0:
            history.append(history[-2] + 2 * (block_output - block_input))
        elif self.kind == "multistep" and index > 0:
            k = self.k[index].to(block_output.dtype)
            history.append(block_output + (1 - k) * (history[-2] - block_input))
        else:
            history.append(block_output)

    def output(self, history: list[torch.Tensor]) -> torch.Tensor:
        return self._weighted_sum(history, len(history) - 1) if self.is_dense else history[-1]


# ----------------------------------------------------------------------------------------------------------
# Pre-trained model base
# ----------------------------------------------------------------------------------------------------------


_UNSUPPORTED_ATTENTION = (
    "attn_implementation={!r} is not supported: the ODE Transformer adds Shaw et al. relative-position logits to every "
    "self-attention score as an additive mask, which those kernels cannot take. Use attn_implementation='sdpa' (the "
    "default, fused on CPU and GPU) or 'eager'."
)


class ODETransformerPreTrainedModel(WeightsFileGuards, PreTrainedModel):
    config: ODETransformerConfig
    config_class = ODETransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["ODETransformerLayer"]
    _skip_keys_device_placement = list(CACHE_KWARGS)
    _supports_sdpa = True
    _supports_flash_attn = False  # the relative-position bias is an additive mask
    _supports_flex_attn = False
    _can_compile_fullgraph = False

    def _loss(
        self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Plain cross entropy, as BART and Marian return it; the paper's label smoothing (0.1) is the Trainer's
        `label_smoothing_factor`, so `loss` and `eval_loss` are on one scale."""
        return token_cross_entropy(logits, labels, num_items_in_batch)

    def __init__(self, config: ODETransformerConfig, *inputs, **kwargs):
        config.validate()  # fields may have been changed after the config was built
        super().__init__(config, *inputs, **kwargs)
        register_peft_target_modules(config.model_type)  # LoraConfig() without target_modules: lora.py

    def resize_position_embeddings(self, new_num_position_embeddings: int) -> None:
        """Record a new trained length (what HF's example scripts call when `--max_source_length` exceeds
        `max_position_embeddings`): the sinusoidal positions have no weights and no length limit to resize."""
        if new_num_position_embeddings < 1:
            raise ValueError(
                f"new_num_position_embeddings {new_num_position_embeddings}: give a positive length"
            )
        self.config.max_position_embeddings = new_num_position_embeddings

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained` (through `WeightsFileGuards`, which leaves the weights digest out),
        after validating the config: fields may have changed since it was built, and transformers' own check runs
        only after the model's code files are written."""
        self.config.validate()
        # transformers writes `auto_map` only for the saved class's own auto class; the bare model loads the
        # folder too (its base: the encoder-decoder, or the causal LM's decoder), so AutoModel is listed.
        base = "ODETransformerModel" if self.config.is_encoder_decoder else "ODETransformerDecoder"
        auto_map = dict(getattr(self.config, "auto_map", None) or {})
        self.config.auto_map = {**auto_map, "AutoModel": f"modeling_ode_transformer.{base}"}
        # the weights under the modules' own names: transformers' default would write the fused projections that
        # `from_pretrained` splits (`FUSED_PROJECTIONS`) back, as it reverts every registered conversion
        kwargs.setdefault("save_original_format", False)
        super().save_pretrained(save_directory, *args, **kwargs)

    def _flash_attn_can_dispatch(self, flash_attn_version: int, is_init_check: bool = False) -> bool:
        raise ValueError(_UNSUPPORTED_ATTENTION.format(f"flash_attention_{flash_attn_version}"))

    def _flex_attn_can_dispatch(self, is_init_check: bool = False) -> bool:
        raise ValueError(_UNSUPPORTED_ATTENTION.format("flex_attention"))

    def _init_weights(self, module: nn.Module) -> None:
        """fairseq init: xavier-uniform linears (gates too, unless `ode_gate_init`; q, k and v scaled as rows of
        the fused matrix they were, `ODETransformerAttention`) with zero bias, N(0, d^-0.5) embeddings with a zero
        padding row."""
        std = self.config.init_std if self.config.init_std is not None else self.config.d_model**-0.5
        if isinstance(module, StageGate) and self.config.ode_gate_init != "xavier":
            init.zeros_(module.weight)  # the same gamma on every token (GATE_INITS)
            init.copy_(module.bias, module.bias.new_tensor(module.start_logits(self.config.ode_gate_init)))
        elif isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight, gain=getattr(module, "xavier_gain", 1.0))
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not is_loaded_weight(module.weight):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, ODETransformerAttention):
            for table in (module.relative_keys, module.relative_values):
                if table is not None:
                    init.xavier_uniform_(table)
        elif isinstance(module, StageCoefficients) and module.mode == "learnable":
            weights = start_weights(self.config.ode_coefficients_init, module.tableau)  # COEFFICIENT_INITS
            init.copy_(module.weight, module.weight.new_tensor(weights))
        elif isinstance(module, StageCoefficients) and module.mode == "ema":
            init.constant_(module.alpha, 0.5)
        elif isinstance(module, LayerConnections):
            if module.is_dense:
                init.copy_(module.weight, module.mean_weights(module.weight.shape[0] - 1))
            if module.corrects:
                init.copy_(module.corrector_weight, module.mean_weights(module.weight.shape[0] - 1))
            elif module.kind == "multistep":
                init.uniform_(module.k, -1.0, 0.0)


# ----------------------------------------------------------------------------------------------------------
# The stacks: encoder and decoder
# ----------------------------------------------------------------------------------------------------------


class _ODEStack(ODETransformerPreTrainedModel):
    """What encoder, decoder and causal LM share: embeddings, a stack of ODE layers with its connections and
    coefficient modules, and a final LayerNorm. Hidden states, attentions and ODE stages are recorded by the
    hooks of `capture_outputs` (`_can_record_outputs`)."""

    side = "encoder"

    def _build_stack(self, config: ODETransformerConfig, has_cross_attention: bool) -> None:
        side = self.side
        num_layers = getattr(config, f"{side}_layers")
        self.embed = ODETransformerEmbeddings(config)
        self.layers = nn.ModuleList(
            ODETransformerLayer(config, side, i, has_cross_attention) for i in range(num_layers)
        )
        self.blocks_per_layer = self.layers[0].num_ode_blocks
        tableau = config.tableau(side)
        num_coefficients = (
            1 if config.ode_coefficient_scope == "stack" else num_layers * self.blocks_per_layer
        )
        mode = getattr(config, f"{side}_ode_coefficients")
        self.ode_coefficients = nn.ModuleList(
            StageCoefficients(
                mode,
                tableau,
                config.d_model,
                alpha_size=config.ode_ema_alpha,
                gate_inputs=config.ode_gate_inputs,
                layer_norm_eps=config.layer_norm_eps,
            )
            for _ in range(num_coefficients)
        )
        self.connections = LayerConnections(
            getattr(config, f"{side}_layer_connections"), num_layers, config.d_model, config.layer_norm_eps
        )
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False

    def _layer_coefficients(self, index: int) -> list[StageCoefficients]:
        if len(self.ode_coefficients) == 1:
            return [self.ode_coefficients[0]] * self.blocks_per_layer
        return list(
            self.ode_coefficients[index * self.blocks_per_layer : (index + 1) * self.blocks_per_layer]
        )

    def _relative_index(
        self, query_positions: torch.Tensor, key_positions: torch.Tensor
    ) -> torch.Tensor | None:
        k = self.config.max_relative_position
        return relative_position_index(query_positions, key_positions, k) if k > 0 else None

    def _embed_tokens(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None
    ) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(
                f"pass exactly one of `input_ids` or `inputs_embeds` to the {self.side} (for the decoder of an "
                "encoder-decoder: `decoder_input_ids` or `decoder_inputs_embeds`)."
            )
        if inputs_embeds is not None:
            if inputs_embeds.dim() != 3:
                raise ValueError(
                    f"`{self._input_name('inputs_embeds')}` has shape {tuple(inputs_embeds.shape)}: give (batch, "
                    "length, d_model) vectors"
                )
            return inputs_embeds
        name = self._input_name("input_ids")
        # a 1-D row would broadcast as a batch of one
        if input_ids.dim() != 2 or input_ids.is_floating_point():
            raise ValueError(
                f"`{name}` is a {tuple(input_ids.shape)} {input_ids.dtype} tensor: give (batch, length) integer token "
                "ids; for one sequence, ids[None] (the tokenizer's return_tensors='pt' gives this shape)."
            )
        check_token_ids(name, input_ids, self.embed_tokens.num_embeddings)
        return self.embed_tokens(input_ids)

    def _input_name(self, name: str) -> str:
        """The argument's name as the user passed it: the decoder of an encoder-decoder reads `decoder_*`."""
        return f"decoder_{name}" if self.side == "decoder" and self.config.is_encoder_decoder else name

    def _recomputes_stages(self) -> bool:
        """Whether this forward checkpoints RK stages (`ode_checkpoint_stages`): they run again in backward."""
        return (
            self.training
            and torch.is_grad_enabled()
            and any(layer.checkpoint_stages for layer in self.layers)
        )

    def _run_layers(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor | None = None,
        **layer_kwargs,
    ) -> torch.Tensor:
        """The stack loop: connections between the layers, then the final LayerNorm. Tensors that may need
        gradients go to the layers positionally: reentrant gradient checkpointing only sees `*args`."""
        history = [hidden_states]
        for index, layer in enumerate(self.layers):
            block_input = self.connections.layer_input(history, index)
            block_output = layer(
                block_input,
                attention_mask,
                encoder_hidden_states,
                self.connections.corrector_base(history, index),
                coefficients=self._layer_coefficients(index),
                connections=self.connections,
                **layer_kwargs,
            )
            self.connections.push(history, index, block_input, block_output)
        return self.layer_norm(self.connections.output(history))

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value


_ODE_STAGES = {
    "ode_stages": OutputRecorder(ODEStageRecorder, index=0),
    "ode_coefficients": OutputRecorder(ODEStageRecorder, index=1),
}


class ODETransformerEncoder(_ODEStack):
    """The encoder: `config.encoder_layers` ODE layers over the source (bidirectional self-attention)."""

    side = "encoder"
    _can_record_outputs = {
        # `output_hidden_states=-1` counts back from this stack's own depth (num_hidden_layers is the decoder's)
        "hidden_states": OutputRecorder(ODETransformerLayer, num_hidden_layers_key="encoder_layers"),
        "attentions": OutputRecorder(ODETransformerAttention, index=1),
        **_ODE_STAGES,
    }

    def __init__(self, config: ODETransformerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.encoder_vocab_size, config.d_model, config.pad_token_id)
        self._build_stack(config, has_cross_attention=False)
        self.post_init()

    @records_ode_coefficients
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs: Unpack[ODETransformerKwargs],
    ) -> ODEEncoderOutput:
        inputs_embeds = self._embed_tokens(input_ids, inputs_embeds)
        batch, length = inputs_embeds.shape[:2]
        check_attention_mask("attention_mask", attention_mask, batch, length, length)
        queries, keys = token_positions(attention_mask, position_ids, 0, length, length, inputs_embeds.device)
        hidden_states = self.embed(inputs_embeds, queries)
        hidden_states = self._run_layers(
            hidden_states,
            padding_mask(attention_mask, hidden_states, length),
            relative_index=self._relative_index(queries, keys),
        )
        return ODEEncoderOutput(last_hidden_state=hidden_states)


class ODETransformerDecoder(_ODEStack):
    """The decoder: causal ODE layers, with cross-attention when the config is an encoder-decoder. Used alone
    (no cross-attention) as the body of the causal LM. Its self-attention cache has one slot per (layer, stage):
    `cache_layout`."""

    side = "decoder"
    _can_record_outputs = {
        "hidden_states": OutputRecorder(ODETransformerLayer, num_hidden_layers_key="decoder_layers"),
        "attentions": OutputRecorder(ODETransformerAttention, index=1, layer_name=SELF_ATTENTION),
        "cross_attentions": OutputRecorder(ODETransformerAttention, index=1, layer_name=CROSS_ATTENTION),
        **_ODE_STAGES,
    }

    def __init__(self, config: ODETransformerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self._build_stack(config, has_cross_attention=config.is_encoder_decoder)
        self.cache_layout = StageCacheLayout.from_config(config)
        self.post_init()

    @merge_with_config_defaults
    @records_ode_coefficients
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs: Unpack[ODETransformerKwargs],
    ) -> ODEDecoderOutput:
        past_key_values = cache_argument(past_key_values, kwargs)
        inputs_embeds = self._embed_tokens(input_ids, inputs_embeds)
        if use_cache and self._recomputes_stages():
            logger.warning_once(
                "`use_cache=True` does not go with `ode_checkpoint_stages` in training: the backward pass recomputes "
                "the later stages, which would write the KV cache a second time. Setting `use_cache=False`."
            )
            use_cache = False
        if not use_cache:
            past_key_values = None
        elif past_key_values is None:
            past_key_values = self.cache_layout.build(self.config.is_encoder_decoder)
        elif self.config.is_encoder_decoder and not isinstance(past_key_values, EncoderDecoderCache):
            past_key_values = self.cache_layout.with_cross_attention(past_key_values)
        self.cache_layout.check(past_key_values)
        self_cache = self_attention_cache(past_key_values)
        batch, length = inputs_embeds.shape[:2]
        past = self_cache.get_seq_length() if self_cache is not None else 0
        key_length = self_cache.get_mask_sizes(length, 0)[0] if self_cache is not None else length
        # a static cache's `past` is a tensor: its mask is checked against the current tokens only
        seen = past + length if isinstance(past, int) else length
        check_attention_mask(self._input_name("attention_mask"), attention_mask, batch, seen, key_length)
        if encoder_hidden_states is not None:  # the source's mask (the seq2seq model's `attention_mask`)
            source = encoder_hidden_states.shape[1]
            check_attention_mask("attention_mask", encoder_attention_mask, batch, source, source)
        queries, keys = token_positions(
            attention_mask, position_ids, past, length, key_length, inputs_embeds.device
        )
        hidden_states = self.embed(inputs_embeds, queries, past_length=past)
        hidden_states = self._run_layers(
            hidden_states,
            causal_mask(attention_mask, hidden_states, past, key_length),
            encoder_hidden_states,
            encoder_attention_mask=padding_mask(encoder_attention_mask, hidden_states, length),
            relative_index=self._relative_index(queries, keys),
            past_key_values=past_key_values,
        )
        return ODEDecoderOutput(last_hidden_state=hidden_states, **{CACHE_FIELD: past_key_values})


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: decoder inputs are the labels shifted right behind the start token (-100 -> pad)."""
    for name, value in (("decoder_start_token_id", decoder_start_token_id), ("pad_token_id", pad_token_id)):
        if value is None:
            raise ValueError(
                f"`labels` without `decoder_input_ids` need `config.{name}` (the decoder reads the labels shifted "
                "right behind the start token, -100 as padding); set it, or pass `decoder_input_ids`."
            )
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def token_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None
) -> torch.Tensor:
    """Cross entropy over tokens whose label is not -100. Summed and divided by `num_items_in_batch` when given (so
    gradient accumulation averages over the whole batch), else averaged."""
    loss = nnf.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        labels.reshape(-1).to(logits.device),
        ignore_index=-100,
        reduction="sum",
    )
    if num_items_in_batch is None:
        num_items_in_batch = (labels != -100).sum().clamp(min=1)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


# ----------------------------------------------------------------------------------------------------------
# The models
# ----------------------------------------------------------------------------------------------------------


class ODETransformerModel(ODETransformerPreTrainedModel):
    """The bare encoder-decoder. `shared` holds the target (and by default the source) embeddings."""

    def __init__(self, config: ODETransformerConfig):
        if not config.is_encoder_decoder:
            # Its decoder would have no cross-attention and the source would go nowhere (AutoModel maps every
            # ODETransformerConfig here, a causal LM's too).
            raise ValueError(
                "ODETransformerModel is the encoder-decoder but got a decoder-only config (`is_encoder_decoder="
                "False`); load a causal LM with AutoModelForCausalLM (ODETransformerForCausalLM), or its bare "
                "decoder with ODETransformerDecoder.from_pretrained."
            )
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = ODETransformerEncoder(config)
        self.decoder = ODETransformerDecoder(config)
        self._tied_weights_keys = {"decoder.embed_tokens.weight": "shared.weight"}
        if config.share_encoder_decoder_embeddings:
            self._tied_weights_keys["encoder.embed_tokens.weight"] = "shared.weight"
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        self.decoder.embed_tokens = value
        if self.config.share_encoder_decoder_embeddings:
            self.encoder.embed_tokens = value

    def get_encoder(self, *args, **kwargs) -> ODETransformerEncoder:
        return self.encoder

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: ODEEncoderOutput | tuple | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[ODETransformerKwargs],
    ) -> ODESeq2SeqModelOutput:
        past_key_values = cache_argument(past_key_values, kwargs)
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            if input_ids is None:
                raise ValueError(
                    "pass `decoder_input_ids` (or `labels` to the generation model) with the inputs."
                )
            decoder_input_ids = shift_tokens_right(
                input_ids, self.config.pad_token_id, self.config.decoder_start_token_id
            )
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                return_dict=True,
                **kwargs,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = ODEEncoderOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs[0],
            encoder_attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            return_dict=True,
            **kwargs,
        )
        return seq2seq_output(encoder_outputs, decoder_outputs)


def seq2seq_output(
    encoder_outputs: BaseModelOutput, decoder_outputs: ODEDecoderOutput
) -> ODESeq2SeqModelOutput:
    """The encoder's and the decoder's outputs under the encoder-decoder's names."""
    return ODESeq2SeqModelOutput(
        last_hidden_state=decoder_outputs.last_hidden_state,
        **{CACHE_FIELD: getattr(decoder_outputs, CACHE_FIELD)},
        decoder_hidden_states=decoder_outputs.hidden_states,
        decoder_attentions=decoder_outputs.attentions,
        cross_attentions=decoder_outputs.cross_attentions,
        encoder_last_hidden_state=encoder_outputs.last_hidden_state,
        encoder_hidden_states=encoder_outputs.hidden_states,
        encoder_attentions=encoder_outputs.attentions,
        encoder_ode_stages=getattr(encoder_outputs, "ode_stages", None),
        encoder_ode_coefficients=getattr(encoder_outputs, "ode_coefficients", None),
        decoder_ode_stages=decoder_outputs.ode_stages,
        decoder_ode_coefficients=decoder_outputs.ode_coefficients,
    )


class ODETransformerForConditionalGeneration(ODETransformerPreTrainedModel, ODEGenerationMixin):
    """Encoder-decoder with a language-model head tied to the target embeddings; the loss is plain cross entropy
    (the paper's label smoothing is the Trainer's `label_smoothing_factor`)."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: ODETransformerConfig):
        super().__init__(config)
        self.model = ODETransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_encoder(self, *args, **kwargs) -> ODETransformerEncoder:
        return self.model.encoder

    def get_decoder(self, *args, **kwargs) -> ODETransformerDecoder:
        return self.model.decoder

    @classmethod
    def from_residual(
        cls, pretrained_model_name_or_path: str | os.PathLike | PreTrainedModel, **kwargs
    ) -> "ODETransformerForConditionalGeneration":
        """A pretrained pre-norm residual seq2seq model (M2M100 / NLLB-200, or a residual ODE Transformer; a folder,
        Hub id or model) converted exactly onto ODE blocks, e.g. `from_residual("facebook/nllb-200-distilled-600M",
        encoder_ode_method="rk2")`: Runge-Kutta blocks that start as the residual block. Arguments, supported and
        refused classes: `modeling_ode.conversion.from_residual`."""
        # imported here, and as `from . import`: save_pretrained copies the modules a modeling file names in
        # `from .name import` into every model folder, and the conversion is no part of a saved model
        from . import conversion

        return conversion.from_residual(cls, pretrained_model_name_or_path, **kwargs)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: ODEEncoderOutput | tuple | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs: Unpack[ODETransformerKwargs],
    ) -> ODESeq2SeqLMOutput:
        check_labels(input_ids, labels, self.config.vocab_size, same_shape=False)
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = shift_tokens_right(
                    labels, self.config.pad_token_id, self.config.decoder_start_token_id
                )
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = self._loss(logits, labels, num_items_in_batch) if labels is not None else None
        # The head's output holds every field of the model's output but `last_hidden_state`, under the same names.
        model_fields = {name: value for name, value in outputs.items() if name != "last_hidden_state"}
        return ODESeq2SeqLMOutput(loss=loss, logits=logits, **model_fields)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def _reorder_cache(self, past_key_values: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search: reorder the decoder's self-attention states only. A beam never moves to another source, and
        the cross-attention keys/values of all beams of one source are equal, so reordering them (transformers'
        default) would copy two thirds of the cache per step without changing it."""
        self_attention_cache(past_key_values).reorder_cache(beam_idx)
        return past_key_values


class ODETransformerForCausalLM(ODETransformerPreTrainedModel, ODEGenerationMixin):
    """Decoder-only language model with ODE blocks in its layers (the paper's Penn Treebank experiment). Uses the
    `decoder_*` fields of a config built with `is_encoder_decoder=False`."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: ODETransformerConfig):
        if config.is_encoder_decoder:
            raise ValueError(
                "ODETransformerForCausalLM is decoder-only but got a config with `is_encoder_decoder=True`; build "
                "the config with `is_encoder_decoder=False` (e.g. `ODETransformerConfig.from_preset('base', "
                "is_encoder_decoder=False)`): the LM uses its `decoder_*` fields."
            )
        super().__init__(config)
        self.model = ODETransformerDecoder(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_decoder(self, *args, **kwargs) -> ODETransformerDecoder:
        return self.model

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        logits_to_keep: int = 0,
        position_ids: torch.LongTensor | None = None,
        **kwargs: Unpack[ODETransformerKwargs],
    ) -> ODECausalLMOutput:
        # `shift_labels` comes through kwargs, as in Llama: a second label argument in the signature would make
        # the Trainer wait for both before it computes an evaluation loss (`transformers.utils.find_labels`).
        shift_labels = kwargs.pop("shift_labels", None)
        check_labels(input_ids, labels, self.config.vocab_size, same_shape=True)
        if labels is not None or shift_labels is not None:
            use_cache = False  # training and scoring see whole sequences (as in the seq2seq model)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            position_ids=position_ids,
            return_dict=True,
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        loss = None
        if labels is not None or shift_labels is not None:
            # Next-token prediction: position t predicts label t + 1. `shift_labels` are targets already aligned
            # with the logits (shifted before the sequence was sharded, as under sequence/context parallelism);
            # when given they replace `labels`.
            if shift_labels is None:
                shift_labels = nnf.pad(labels[:, 1:], (0, 1), value=-100)
            loss = self._loss(logits, shift_labels, num_items_in_batch)
        return ODECausalLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            ode_stages=outputs.ode_stages,
            ode_coefficients=outputs.ode_coefficients,
        )
