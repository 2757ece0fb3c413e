"""Every private transformers, torch and argparse API this project relies on, and each version-dependent name.

A private name can change in any release without notice. Each one the project reads, sets or calls is wrapped
here, once, in a named function or constant whose docstring says what it wraps, why no public API does the job,
and which versions it was checked on; `tests/test_compat.py` has one test per entry that fails when an installed
release drops or changes the behaviour relied on. Call sites elsewhere use these names, never the private ones.

Checked on transformers 5.23.0 (the floor, `.ci/oldest-constraints.txt`) and 5.24.0, torch 2.13.0, and the
the argparse of Python 3.11.7 (`CHECKED`).

The model classes also define transformers' model-author hooks (`_init_weights`, `_tied_weights_keys`,
`_supports_sdpa`, `_reorder_cache`, ...): transformers reads them from every model class, BART's included, so
they stay where BART has them, and `MODEL_HOOKS` lists them so that the test checks transformers still reads each.

The modeling files are shipped as remote code: `save_pretrained` copies this module beside
`modeling_ode_transformer.py` (it is one of its relative imports), so this module imports only transformers,
torch and the standard library, and nothing relative.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence

import torch
from transformers import GenerationMixin
from transformers.generation import CompileConfig
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.utils import output_capturing

__all__ = [
    "CACHE_FIELD",
    "CACHE_KWARGS",
    "CHECKED",
    "MODEL_HOOKS",
    "GenerationCacheHook",
    "active_output_collector",
    "attention_implementation",
    "cache_argument",
    "compile_on_any_device",
    "compiled_graph_count",
    "inductor_fallback_random",
    "is_loaded_weight",
    "order_argument_groups",
    "parser_actions",
    "raise_recompile_limit",
    "register_weight_splits",
    "reset_compiled_graphs",
    "without_length_clash_warning",
]

CHECKED = {"transformers": ("5.23.0", "5.24.0"), "torch": ("2.13.0",), "python": ("3.11.7",)}
"""The releases every entry below was checked on (the tests print the installed ones)."""


# ----------------------------------------------------------------------------------------------------------
# transformers: the cache's name in model outputs and forward arguments
# ----------------------------------------------------------------------------------------------------------

CACHE_FIELD = (
    "cache"
    if "cache" in BaseModelOutputWithPastAndCrossAttentions.__dataclass_fields__
    else "past_key_values"
)
"""The name of the cache in model outputs, and in what `generate` passes to forward: transformers 5.24 renamed
`past_key_values` to `cache` (the old name still works in forward, with a deprecation warning). The models take
and return the cache under the name the installed transformers uses. Checked: 5.23.0 (`past_key_values`),
5.24.0 (`cache`)."""

CACHE_KWARGS = ("cache", "past_key_values")
"""Both names a forward may receive the cache under, and `generate`'s `model_kwargs` may hold it under (the
5.24 rename, `CACHE_FIELD`). Checked: transformers 5.23.0, 5.24.0."""


def cache_argument(past_key_values, kwargs: dict):
    """The cache a forward was given, as `past_key_values` or (transformers >= 5.24) `cache`, popped from kwargs
    (`CACHE_FIELD`). Checked: transformers 5.23.0, 5.24.0."""
    cache = kwargs.pop("cache", None)
    if cache is not None and past_key_values is not None:
        raise ValueError("pass the cache once, as `cache` or as `past_key_values`, not both.")
    return past_key_values if past_key_values is not None else cache


# ----------------------------------------------------------------------------------------------------------
# transformers: output capturing, attention, initialisation, generation
# ----------------------------------------------------------------------------------------------------------


def active_output_collector() -> dict | None:
    """The outputs the running `capture_outputs` call records (a dict keyed by output name, e.g. "attentions"),
    or None outside one: `transformers.utils.output_capturing._active_collector.get()`.

    Why private: `capture_outputs`' hooks stay on the modules once any output was recorded, so the hooks alone do
    not say whether this call records attention weights, and transformers has no public accessor for the
    collector. Checked: transformers 5.23.0, 5.24.0."""
    return output_capturing._active_collector.get()


def attention_implementation(config) -> str | None:
    """The attention backend a model's config selects ("eager", "sdpa", ...; None before a model set it):
    `PreTrainedConfig._attn_implementation`, which every transformers model reads to pick its kernel
    (`attn_implementation` is only the constructor's argument). Checked: transformers 5.23.0, 5.24.0."""
    return config._attn_implementation


def is_loaded_weight(tensor: torch.Tensor) -> bool:
    """Whether transformers marked `tensor` as set already (loaded from a checkpoint, or initialised): its private
    `_is_hf_initialized` flag. `_init_weights` zeroes an embedding's padding row through a slice of the weight,
    which the `transformers.initialization` functions cannot see is loaded; transformers' own default
    `_init_weights` guards that row with the same flag. Checked: transformers 5.23.0, 5.24.0."""
    return bool(getattr(tensor, "_is_hf_initialized", False))


@contextlib.contextmanager
def without_length_clash_warning() -> Iterator[None]:
    """Within it, `generate` does not warn that both `max_new_tokens` and `max_length` were set: transformers warns
    whenever `max_new_tokens` meets any `max_length`, one from the model's `generation_config.json` included, which
    every saved folder has (its trained output length). The warning is a record of the logger
    `transformers.generation.utils` (no switch for it), filtered here by its words. Checked: transformers 5.24.0."""

    def not_the_clash(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Both `max_new_tokens`")

    logger = logging.getLogger("transformers.generation.utils")
    logger.addFilter(not_the_clash)
    try:
        yield
    finally:
        logger.removeFilter(not_the_clash)


def register_weight_splits(model_type: str, splits: Mapping[str, Sequence[str]]) -> None:
    """Make `from_pretrained` split each checkpoint weight matching a key of `splits` (a fragment of its name, such
    as "self_attn.qkv_proj") into equal chunks along dim 0, named by replacing that fragment with each of its parts
    in turn: transformers' checkpoint conversion mapping, `WeightConverter` with the `Chunk` operation, registered
    for every model of `model_type`. Registering again replaces the mapping (the modeling file is imported once as
    this package and once more as remote code).

    Why here: `transformers.conversion_mapping` and `transformers.core_model_loading` are public modules but not
    re-exported at the top level, and are new in transformers 5; the mapping is also reverted by `save_pretrained`
    unless it is called with `save_original_format=False`. Checked: transformers 5.23.0, 5.24.0."""
    from transformers.conversion_mapping import register_checkpoint_conversion_mapping
    from transformers.core_model_loading import Chunk, WeightConverter

    converters = [
        WeightConverter(source_patterns=fused, target_patterns=list(parts), operations=[Chunk(dim=0)])
        for fused, parts in splits.items()
    ]
    register_checkpoint_conversion_mapping(model_type, converters, overwrite=True)


def compile_on_any_device(compile_config: CompileConfig) -> CompileConfig:
    """`compile_config` with `generate`'s automatic compilation allowed on every device, the CPU included:
    transformers compiles the decoding step only on CUDA/XPU/... unless the private
    `CompileConfig._compile_all_devices` is set, and has no public switch for it. Returns the same object.
    Checked: transformers 5.23.0, 5.24.0."""
    compile_config._compile_all_devices = True
    return compile_config


class GenerationCacheHook(GenerationMixin):
    """`GenerationMixin` whose cache, when `generate` builds one, passes through `rebuild_generation_cache` before
    the first step: it overrides the private `GenerationMixin._prepare_cache_for_generation`, which builds the
    cache into `model_kwargs` (under either of `CACHE_KWARGS`) and has no public hook. A cache the caller passed is
    left as it is. Checked: transformers 5.23.0, 5.24.0."""

    def rebuild_generation_cache(self, cache, generation_config, generation_mode):
        """The cache `generate` will use in place of the one it built (the same, by default), for this generation
        config and mode (a `GenerationMode`)."""
        return cache

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs) -> None:
        built_here = all(model_kwargs.get(key) is None for key in CACHE_KWARGS)
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        generation_mode = args[0] if args else kwargs.get("generation_mode")
        for key in CACHE_KWARGS:
            if built_here and model_kwargs.get(key) is not None:
                model_kwargs[key] = self.rebuild_generation_cache(
                    model_kwargs[key], generation_config, generation_mode
                )


MODEL_HOOKS = (
    "_can_compile_fullgraph",
    "_can_record_outputs",
    "_flash_attn_can_dispatch",
    "_flex_attn_can_dispatch",
    "_init_weights",
    "_no_split_modules",
    "_reorder_cache",
    "_skip_keys_device_placement",
    "_supports_flash_attn",
    "_supports_flex_attn",
    "_supports_sdpa",
    "_tied_weights_keys",
)
"""transformers' underscore hooks the model classes define (attributes and methods transformers reads from a model
class; `_reorder_cache` only from a generating model that has one). Checked: transformers 5.23.0, 5.24.0."""


def forget_auto_class(obj) -> None:
    """Make ``save_pretrained`` write no ``auto_map`` for ``obj`` (a tokenizer loaded with another project's code):
    transformers keeps the class to map in the private ``_auto_class``, set by ``register_for_auto_class`` or by
    loading remote code. Checked: transformers 5.23.0, 5.24.0."""
    if getattr(obj, "_auto_class", None) is not None:
        obj._auto_class = None


TRAINER_HOOKS = ("_get_output_dir", "_get_grad_norm", "_load_callback_state", "_save_checkpoint")
"""`Trainer`'s private methods that ode_transformer.train.trainer's token-budget trainers override: where a checkpoint is written
(staged, then published whole), the gradient norm (checked for divergence), and the callback state read on
resume. transformers has no public hook for these. Checked: transformers 5.23.0, 5.24.0."""


# ----------------------------------------------------------------------------------------------------------
# argparse: help layout and the parser's flags
# ----------------------------------------------------------------------------------------------------------


def order_argument_groups(
    parser: argparse.ArgumentParser, first_titles: Sequence[str], titles: Mapping[str, str] | None = None
) -> argparse.ArgumentParser:
    """`parser` with the argument groups titled `first_titles` listed first in `--help` (in the order they were
    added), then the others, and groups retitled by `titles` (old title -> new). argparse lists groups in the
    order of its private `_action_groups` and has no public way to reorder or retitle them. Returns the same
    parser. Checked: Python 3.11.7."""
    first = [group for group in parser._action_groups if group.title in first_titles]
    parser._action_groups = [*first, *(group for group in parser._action_groups if group not in first)]
    for group in parser._action_groups:
        if titles and group.title in titles:
            group.title = titles[group.title]
    return parser


def parser_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every action (flag or positional) of `parser`, the help action included: argparse's private `_actions`
    (the only list of them; `parse_known_args` exposes none). Checked: Python 3.11.7."""
    return list(parser._actions)


# ----------------------------------------------------------------------------------------------------------
# torch: compilation settings and counters (benchmarks)
# ----------------------------------------------------------------------------------------------------------


def reset_compiled_graphs() -> None:
    """Forget every compiled graph, so that the next `torch.compile` call compiles afresh (a new model of a class
    compiled before would reuse its graphs otherwise): the public `torch.compiler.reset()`, kept here beside
    `compiled_graph_count`, whose counter it leaves. Checked: torch 2.13.0."""
    torch.compiler.reset()


def compiled_graph_count() -> int:
    """How many distinct graphs dynamo has compiled in this process: the private
    `torch._dynamo.utils.counters["stats"]["unique_graphs"]` (no public counter exists). Checked: torch 2.13.0."""
    import torch._dynamo.utils

    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def graph_breaks(function, *args) -> tuple[int, int, list]:
    """How dynamo splits ``function(*args)``: its graph count, graph-break count and the reasons of the breaks,
    from the private `torch._dynamo.explain` (torch.compiler has no public equivalent). Checked: torch 2.13.0."""
    import torch._dynamo

    explanation = torch._dynamo.explain(function)(*args)
    return explanation.graph_count, explanation.graph_break_count, explanation.break_reasons


def inductor_fallback_random_enabled() -> bool:
    """Whether inductor compiles random operators with eager's generator (its private
    `torch._inductor.config.fallback_random`; see `inductor_fallback_random`). Checked: torch 2.13.0."""
    import torch._inductor.config

    return bool(torch._inductor.config.fallback_random)


@contextlib.contextmanager
def inductor_fallback_random(enabled: bool) -> Iterator[None]:
    """Within the block, inductor compiles random operators (dropout) with eager's generator instead of its own
    (`fallback_random`), read when a graph compiles: the private `torch._inductor.config.patch`. Checked: torch
    2.13.0."""
    import torch._inductor.config

    with torch._inductor.config.patch(fallback_random=enabled):
        yield


def raise_recompile_limit(at_least: int) -> None:
    """Let dynamo recompile one code object at least `at_least` times before it falls back to eager (several models
    sharing one forward each need their own entries): the private `torch._dynamo.config.recompile_limit`, never
    lowered here. Checked: torch 2.13.0."""
    import torch._dynamo.config

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, at_least)
