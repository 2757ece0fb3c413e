"""Shared pieces of the decoding, compile and export tests: tiny dropout-free configs, the block types the compiled
and exported graphs are checked with, a padded source batch, and the two comparisons every decoder variant must
pass: cached step-by-step logits == the full forward, and static-cache == dynamic-cache == beam-search-cache ==
uncached generated tokens."""

from __future__ import annotations

import torch

from modeling_ode import ODETransformerConfig, ODETransformerForCausalLM

NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
PAD = 1
# One of each kind of block, as per-side config fields (without the side's prefix): the compiled and exported
# graphs are checked on each.
BLOCKS = {
    "euler": {"ode_method": "euler", "ode_coefficients": "tableau"},
    # gamma = 1/2
    "rk2": {"ode_method": "rk2", "ode_coefficients": "tableau"},
    "rk2_gated": {"ode_method": "rk2", "ode_coefficients": "gated"},
    "rk4": {"ode_method": "rk4", "ode_coefficients": "tableau"},
    "pc_rk2": {"ode_method": "rk2", "ode_coefficients": "ema", "layer_connections": "predictor_corrector"},
}


def tiny(**overrides) -> ODETransformerConfig:
    """The `tiny` preset without dropout, built for 128 positions (a short trained length, which the tests of
    longer inputs exceed)."""
    return ODETransformerConfig.from_preset(
        "tiny", **{**NO_DROPOUT, "max_position_embeddings": 128, **overrides}
    )


def causal_lm(config: ODETransformerConfig) -> ODETransformerForCausalLM:
    """A causal LM of `config` (built with `is_encoder_decoder=False`), seeded with 0, in eval mode."""
    torch.manual_seed(0)
    return ODETransformerForCausalLM(config).eval()


def source_batch(
    padded_from: tuple[int | None, ...] = (None, 6, 4), device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 9 random ids (seed 1); row i is padded from position `padded_from[i]` on (None: no padding)."""
    ids = torch.randint(4, 99, (3, 9), generator=torch.Generator().manual_seed(1))
    for row, start in enumerate(padded_from):
        if start is not None:
            ids[row, start:] = PAD
    return ids.to(device), (ids != PAD).long().to(device)


def assert_incremental_decoding_equals_full_forward(model, ids: torch.Tensor, mask: torch.Tensor) -> None:
    """Decoding 7 random target tokens one at a time with the KV cache gives the logits of one full forward."""
    target = torch.randint(4, 99, (3, 7), generator=torch.Generator().manual_seed(2)).to(ids.device)
    full = model(input_ids=ids, attention_mask=mask, decoder_input_ids=target, use_cache=False).logits
    encoder_outputs = model.get_encoder()(input_ids=ids, attention_mask=mask)
    past, steps = None, []
    for t in range(target.shape[1]):
        out = model(
            encoder_outputs=encoder_outputs,
            attention_mask=mask,
            decoder_input_ids=target[:, t : t + 1],
            past_key_values=past,
            use_cache=True,
        )
        past, steps = out.past_key_values, steps + [out.logits]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def generate_static_dynamic_uncached(model, ids: torch.Tensor, mask: torch.Tensor, **kwargs) -> torch.Tensor:
    """`generate` with the static cache, the dynamic cache, the default (`BeamSearchCache`) and no cache; asserts
    the same tokens, returns them."""
    static = model.generate(ids, attention_mask=mask, cache_implementation="static", **kwargs)
    dynamic = model.generate(ids, attention_mask=mask, cache_implementation="dynamic", **kwargs)
    default = model.generate(ids, attention_mask=mask, **kwargs)
    uncached = model.generate(ids, attention_mask=mask, use_cache=False, **kwargs)
    for tokens in (dynamic, default, uncached):
        assert torch.equal(static, tokens)
    return static
