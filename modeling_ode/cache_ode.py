"""The decoder's self-attention cache: one slot per (layer, stage), and the beam-search cache that `generate` uses.

Every stage of an ODE block attends over the keys and values that stage computed at earlier positions, so a
decoder keeps one cache slot per (layer, stage) (`StageCacheLayout`), built up front. Under beam search the cache is
a `BeamSearchCache`, which keeps keys and values once per source and reorders beams by indirection; its own
attention function (`beam_attention_forward`) reads that layout. The generation hook (`ODEGenerationMixin`) gives
`generate` these caches. The modeling file imports this one; an exported folder ships it as remote code.
"""

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from transformers import PreTrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, EncoderDecoderCache, StaticCache
from transformers.generation.configuration_utils import GenerationConfig, GenerationMode

from .compat import GenerationCacheHook, without_length_clash_warning
from .configuration_ode_transformer import ODETransformerConfig
from .ode import FFN, SELF_ATTENTION, ode_groups

__all__ = [
    "BeamSearchCache",
    "BeamSlot",
    "ODEGenerationMixin",
    "StageCacheLayout",
    "beam_attention_forward",
    "beams_per_source",
    "cache_attention_function",
    "self_attention_cache",
]


def self_attention_cache(cache: Cache | None) -> Cache | None:
    return cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache


@dataclass(frozen=True)
class StageCacheLayout:
    """The self-attention KV cache of a stack: one slot per (layer, stage). Every stage of an ODE block attends
    over the keys and values that stage computed at earlier positions, so layer l, stage i owns slot
    l * stages + i (with self-attention outside F, one slot per layer). PCformer's corrector
    (`predictor_corrector` connections) evaluates every layer once more: one more slot per layer, its last
    (`corrector_stage`). Cross-attention keeps one slot per layer: its keys and values come from the encoder
    and are the same for every stage.

    transformers' caches (and `generate`) build one cache layer per model layer; `build`/`like` build all
    slots up front instead, dynamic or static, so `generate(..., cache_implementation="static")` and
    `torch.compile` of generation work for ODE decoder blocks too.
    """

    num_layers: int
    stages: int

    @classmethod
    def from_config(cls, config: ODETransformerConfig, side: str = "decoder") -> "StageCacheLayout":
        groups = ode_groups(getattr(config, f"{side}_ode_function"), (SELF_ATTENTION, FFN))
        self_attention_is_ode = next(is_ode for names, is_ode in groups if SELF_ATTENTION in names)
        stages = config.tableau(side).num_stages if self_attention_is_ode else 1
        corrects = getattr(config, f"{side}_layer_connections") == "predictor_corrector"
        return cls(getattr(config, f"{side}_layers"), stages + corrects)

    @property
    def num_slots(self) -> int:
        return self.num_layers * self.stages

    def slot(self, layer: int, stage: int) -> int:
        return layer * self.stages + stage

    def build(self, encoder_decoder: bool, max_cache_len: int | None = None) -> Cache:
        """An empty cache with every slot: dynamic, or static with room for `max_cache_len` positions."""
        self_attention = self._self_attention_cache(max_cache_len)
        return self.with_cross_attention(self_attention) if encoder_decoder else self_attention

    def beam_search(self, num_beams: int, encoder_decoder: bool) -> Cache:
        """An empty `BeamSearchCache` with every slot, for beam search with `num_beams` beams."""
        self_attention = BeamSearchCache(self.num_slots, num_beams)
        return self.with_cross_attention(self_attention) if encoder_decoder else self_attention

    def with_cross_attention(self, self_attention: Cache) -> EncoderDecoderCache:
        """A decoder's self-attention cache with an empty cross-attention cache: an encoder-decoder needs both, and
        may be given a plain `DynamicCache` (as BART may)."""
        return EncoderDecoderCache(self_attention, DynamicCache(config=_cache_config(self.num_layers)))

    def like(self, cache: Cache) -> Cache:
        """`cache` as transformers built it (one self-attention layer per model layer), rebuilt with every slot;
        its kind (dynamic or static, offloaded or not) and its cross-attention cache are kept."""
        if isinstance(cache, EncoderDecoderCache):
            return EncoderDecoderCache(self.like(cache.self_attention_cache), cache.cross_attention_cache)
        if self.holds(cache):
            return cache
        if not isinstance(cache, (DynamicCache, StaticCache)):
            raise ValueError(
                f"ODE decoder blocks keep one cache slot per (layer, stage); a {type(cache).__name__} cannot be "
                "rebuilt with those slots. Use `cache_implementation='dynamic'` (the default) or 'static'."
            )
        max_cache_len = cache.get_max_length() if isinstance(cache, StaticCache) else None
        return self._self_attention_cache(max_cache_len, offloading=cache.offloading)

    def holds(self, cache: Cache) -> bool:
        """Whether `cache` has (or grows) a layer for every slot."""
        return cache.layer_class_to_replicate is not None or len(cache.layers) >= self.num_slots

    def check(self, cache: Cache | None) -> None:
        self_cache = self_attention_cache(cache)
        if self_cache is not None and not self.holds(self_cache):
            raise ValueError(
                f"the decoder keeps one self-attention cache slot per (layer, stage), {self.num_layers} x "
                f"{self.stages} = {self.num_slots}, but `past_key_values` has {len(self_cache.layers)}. Let the "
                "model build its cache (`use_cache=True`, or `generate(..., cache_implementation='static')`), or "
                "build one with `model.get_decoder().cache_layout.build(...)`."
            )

    def _self_attention_cache(self, max_cache_len: int | None, offloading: bool = False) -> Cache:
        if max_cache_len is None:
            return DynamicCache(config=_cache_config(self.num_slots), offloading=offloading)
        return StaticCache(
            config=_cache_config(self.num_slots), max_cache_len=max_cache_len, offloading=offloading
        )


class BeamSlot(CacheLayerMixin):
    """One (layer, stage) slot of a `BeamSearchCache`. Keys and values live in buffers of shape (sources, heads,
    capacity, beams, head_dim), written in place: position s of beam j of a source is written once, by the row
    that computed it, and never moved. A full buffer doubles, one copy per doubling rather than a concatenation per
    step. `update` returns (sources, heads, length * beams, head_dim) views, position s of beam j at s * beams + j:
    with one beam, the usual (rows, heads, length, head_dim)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, num_beams: int):
        super().__init__()
        self.num_beams = num_beams
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows = key_states.shape[0]
        if rows % self.num_beams:
            raise ValueError(
                f"a cache for {self.num_beams} beams was given {rows} rows, not a multiple of them"
            )
        self.device = key_states.device
        self.keys, self.values = key_states[:0], value_states[:0]  # no capacity yet: `_reserve` allocates
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[2]
        self._reserve(key_states, value_states, end)
        for buffer, states in ((self.keys, key_states), (self.values, value_states)):
            rows, heads, new, dim = states.shape
            grouped = states.view(rows // self.num_beams, self.num_beams, heads, new, dim).permute(
                0, 2, 3, 1, 4
            )
            buffer[:, :, start:end] = grouped
        self.length = end
        return self.keys[:, :, :end].flatten(2, 3), self.values[:, :, :end].flatten(2, 3)

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int) -> None:
        """Buffers with room for `length` positions: the next power of two (at least 16), the old ones copied in."""
        if self.keys.dim() == 5 and self.keys.shape[2] >= length:
            return
        capacity = max(16, 1 << (length - 1).bit_length())
        old = self.length
        self.keys, self.values = (
            self._grown(buffer if buffer.dim() == 5 else None, states, capacity, old)
            for buffer, states in ((self.keys, key_states), (self.values, value_states))
        )

    def _grown(
        self, buffer: torch.Tensor | None, states: torch.Tensor, capacity: int, filled: int
    ) -> torch.Tensor:
        rows, heads, _, dim = states.shape
        grown = states.new_empty(rows // self.num_beams, heads, capacity, self.num_beams, dim)
        if buffer is not None and filled:
            grown[:, :, :filled] = buffer[:, :, :filled]
        return grown

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.keys = self.values = None
        self.is_initialized = False
        self.length = 0


class BeamSearchCache(Cache):
    """The decoder's self-attention cache under `generate` (one `BeamSlot` per (layer, stage)), in place of
    transformers' `DynamicCache`, which grows by concatenation and reorders beams by copying every slot at every
    step. Beam search reorders by indirection instead: `origins` (rows, length) names, for each row and position,
    the beam of its source whose slot holds that row's history there, and reordering gathers that small table
    only; attention reads through it (`beam_attention_forward`, at `places()`), and the cross-attention keys and
    values are kept once per source. With one beam it is a preallocated cache read by the usual attention.

    The contract with attention: every other cache returns keys and values as transformers lays them out, (rows,
    heads, length, head_dim); this one, with several beams, returns (sources, heads, length * beams, head_dim)
    (`BeamSlot.update`). Attention never asks which cache it holds: it asks `beams_per_source(cache)` how many rows
    share one source (it computes cross-attention keys once per source) and `cache_attention_function(cache, ...)`
    which function reads the layout (None: the configured one). A cache with a layout of its own answers both here.
    """

    def __init__(self, num_slots: int, num_beams: int):
        super().__init__(layers=[BeamSlot(num_beams) for _ in range(num_slots)])
        self.num_beams = num_beams
        self.origins: torch.Tensor | None = None
        self._places: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        length = self.layers[layer_idx].length
        known = 0 if self.origins is None else self.origins.shape[1]
        # the step's first slot: the new positions are in the rows' own beams
        if self.num_beams > 1 and length > known:
            rows = key_states.shape[0]
            own = torch.arange(rows, device=key_states.device) % self.num_beams
            new = own[:, None].expand(rows, length - known)
            self._set_origins(new.clone() if self.origins is None else torch.cat([self.origins, new], dim=1))
        return keys, values

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row r continues the history of row `beam_idx[r]` (a beam of the same source)."""
        if self.origins is not None:
            self._set_origins(self.origins.index_select(0, beam_idx.to(self.origins.device)))

    def places(self) -> torch.Tensor:
        """(sources, 1, beams, 1, length): where each row's position s sits on a slot's length * beams axis, s *
        beams + origins[row, s]; computed once per step for all slots."""
        if self._places is None:
            rows, length = self.origins.shape
            positions = torch.arange(length, device=self.origins.device) * self.num_beams
            self._places = (positions + self.origins).view(
                rows // self.num_beams, 1, self.num_beams, 1, length
            )
        return self._places

    def _set_origins(self, origins: torch.Tensor) -> None:
        self.origins, self._places = origins, None

    def reset(self) -> None:
        super().reset()
        self._set_origins(None)


def _cache_config(num_slots: int) -> PreTrainedConfig:
    """What transformers' cache classes read to lay out their layers: one full-attention layer per slot."""
    return PreTrainedConfig(num_hidden_layers=num_slots)


def beam_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    places: torch.Tensor | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention of `query` (rows, heads, q, head_dim), its rows the beams of each source in turn, over keys
    and values held once per source (sources, heads, keys, head_dim): the queries of a source's beams share one
    product with its keys. Cross-attention (`places` None): every beam reads all of the source's encoder keys.
    Self-attention over a `BeamSearchCache` slot (keys = length * beams, `BeamSlot.update`'s layout): each row reads
    position s at `places` (`BeamSearchCache.places`), so the scores against every beam of the source are computed
    and the row's own gathered (beams times the usual dot products, few next to copying the cache), and the values
    are summed with the probabilities scattered back to where they were gathered from."""
    rows, heads, q_length, head_dim = query.shape
    sources, _, keys, _ = key.shape
    beams = rows // sources
    by_source = query.view(sources, beams, heads, q_length, head_dim).transpose(1, 2)
    scores = torch.matmul(by_source.reshape(sources, heads, beams * q_length, head_dim), key.transpose(2, 3))
    scores = scores.view(sources, heads, beams, q_length, keys)
    if places is not None:
        places = places.expand(sources, heads, beams, q_length, places.shape[-1])
        scores = scores.gather(-1, places)
    scores = scores.transpose(1, 2).reshape(rows, heads, q_length, -1) * scaling
    weights, probs = module.attention_probs(scores, attention_mask, dropout)
    by_source = probs.view(sources, beams, heads, q_length, -1).transpose(1, 2)
    if places is not None:
        by_source = probs.new_zeros(sources, heads, beams, q_length, keys).scatter_(-1, places, by_source)
    output = torch.matmul(by_source.reshape(sources, heads, beams * q_length, keys), value)
    # (sources, heads, beams * q, head_dim) -> (rows, q, heads, head_dim), the layout every attention returns
    output = output.view(sources, heads, beams, q_length, head_dim).permute(0, 2, 3, 1, 4)
    output = output.reshape(rows, q_length, heads, head_dim)
    relative = module.relative_value_term(probs, kwargs.get("relative_index"))
    output = output if relative is None else output + relative.transpose(1, 2)
    return output, weights


def beams_per_source(cache: Cache | None) -> int:
    """How many rows of the batch are beams of one source under `cache` (a `BeamSearchCache`'s beams, else 1)."""
    self_cache = self_attention_cache(cache)
    return self_cache.num_beams if isinstance(self_cache, BeamSearchCache) else 1


def cache_attention_function(cache: Cache | None, is_cross_attention: bool) -> Callable | None:
    """The attention function that reads `cache`'s layout, or None where the configured attention reads it (every
    cache that keeps transformers' (rows, heads, length, head_dim) layout)."""
    self_cache = self_attention_cache(cache)
    if not isinstance(self_cache, BeamSearchCache) or self_cache.num_beams == 1:
        return None
    if is_cross_attention:
        return beam_attention_forward
    return partial(beam_attention_forward, places=self_cache.places())


# Beam search gets a `BeamSearchCache`; greedy search and sampling keep transformers' dynamic cache, where
# preallocating gains nothing (docs/performance.md).
BEAM_SEARCH_MODES = (GenerationMode.BEAM_SEARCH, GenerationMode.BEAM_SAMPLE)


class ODEGenerationMixin(GenerationCacheHook):
    """Generation with the decoder's per-stage cache: transformers builds one self-attention cache layer per
    decoder layer. Under beam search its default (dynamic, no `cache_implementation` asked) becomes a
    `BeamSearchCache`; any other cache (greedy search or sampling, an explicit 'dynamic', 'static', offloaded) is
    rebuilt the same kind with every slot (`StageCacheLayout.like`)."""

    def rebuild_generation_cache(
        self, cache: Cache, generation_config: GenerationConfig, generation_mode: GenerationMode | None
    ) -> Cache:
        layout = self.get_decoder().cache_layout
        self_cache = self_attention_cache(cache)
        if (
            generation_config.cache_implementation is None
            and generation_mode in BEAM_SEARCH_MODES
            and type(self_cache) is DynamicCache
            and not self_cache.offloading
        ):
            return layout.beam_search(generation_config.num_beams, isinstance(cache, EncoderDecoderCache))
        return layout.like(cache)

    def generate(self, inputs=None, generation_config=None, *args, **kwargs):
        """transformers' `generate`. A saved folder's `max_length` is its default output length, and a caller's
        `max_new_tokens` replaces it as transformers does, without transformers' warning that both were set: the
        caller set one. Where the caller sets both, the warning stays."""
        asked = [kwargs, vars(generation_config) if generation_config is not None else {}]
        new_tokens_only = any(a.get("max_new_tokens") is not None for a in asked) and all(
            a.get("max_length") is None for a in asked
        )
        with without_length_clash_warning() if new_tokens_only else contextlib.nullcontext():
            return super().generate(inputs, generation_config, *args, **kwargs)

    @staticmethod
    def create_masks_for_generate(
        attention_mask: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor | None:
        """With a static cache `generate` prepares 4D masks ahead of the forward; the decoder builds its own additive
        masks from the 2D padding mask (the relative-position bias is added to them), so pass that through."""
        return attention_mask
