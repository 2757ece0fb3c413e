"""The model's limits, carried by its tokenizer: a saved folder's ``tokenizer(text, truncation=True)`` cuts
inputs to what the model takes, and batches are padded on the side its task needs."""

from __future__ import annotations

from typing import Any

from .configuration_ode_transformer import ODETransformerConfig

__all__ = ["NO_LENGTH_LIMIT", "fit_tokenizer_to_model", "tokenizer_limits"]

# A tokenizer saved without a length limit has transformers' VERY_LARGE_INTEGER (1e30) as model_max_length: any
# value from here up means "no limit recorded".
NO_LENGTH_LIMIT = 1_000_000

# What transformers puts into a loaded tokenizer's `init_kwargs` from the load itself: `from_pretrained`'s own
# arguments and `tokenizer.json`'s truncation, read back at every load. `save_pretrained` writes `init_kwargs` into
# tokenizer_config.json, where they would read as settings (and the truncation would go stale once refitted here).
# Checked: transformers 5.24.0.
LOAD_TIME_KEYS = (
    "is_local",
    "local_files_only",
    "max_length",
    "stride",
    "truncation_strategy",
    "truncation_side",
)


def tokenizer_limits(config: ODETransformerConfig, max_source_length: int | None = None) -> dict[str, Any]:
    """``model_max_length``: the source length the model was trained with (``max_source_length``), at most its
    ``max_position_embeddings`` (the positions the model was built for; sinusoidal, so longer inputs run too). ``padding_side``: right for the
    encoder-decoder (the encoder masks padding), left for the causal LM, so that a batch of prompts is continued
    after each prompt's last token rather than after padding."""
    limit = config.max_position_embeddings
    if max_source_length is not None:
        limit = min(limit, max_source_length)
    return {"model_max_length": limit, "padding_side": "right" if config.is_encoder_decoder else "left"}


def fit_tokenizer_to_model(tokenizer, config: ODETransformerConfig, max_source_length: int | None = None):
    """Set :func:`tokenizer_limits` on ``tokenizer`` (and in what its ``save_pretrained`` writes), and make
    ``tokenizer.json``'s own truncation the same length, which a ``tokenizers``-only deployment applies (it is
    otherwise whatever the last ``tokenizer(..., truncation=True, max_length=N)`` call left); a causal LM's prompt
    loses its start. What the tokenizer kept from its load (`LOAD_TIME_KEYS`) is not saved. Returns the tokenizer."""
    for key, value in tokenizer_limits(config, max_source_length).items():
        setattr(tokenizer, key, value)
        tokenizer.init_kwargs[key] = value  # save_pretrained writes init_kwargs
    for key in LOAD_TIME_KEYS:
        tokenizer.init_kwargs.pop(key, None)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        direction = "right" if config.is_encoder_decoder else "left"
        backend.enable_truncation(max_length=tokenizer.model_max_length, direction=direction)
    return tokenizer
