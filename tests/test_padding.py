"""Padding changes nothing: a batch padded on the left or on the right gives every sequence the logits and the
generated tokens it gets alone (positions and relative distances come from the attention mask, as GPT-2 and
Llama build `position_ids`), for the encoder, the decoder with its per-stage cache, the causal LM and PC blocks."""

from __future__ import annotations

import pytest
import torch

from modeling_ode import ODETransformerForCausalLM, ODETransformerForConditionalGeneration
from modeling_ode.modeling_ode_transformer import relative_position_index, token_positions
from tests.decoding import PAD, tiny

LENGTHS = (7, 4, 2)  # the rows of every batch: one unpadded, two padded by 3 and 5

BLOCKS = {
    "euler": {"encoder_ode_method": "euler", "encoder_ode_coefficients": "tableau"},
    "rk2": {"encoder_ode_method": "rk2", "encoder_ode_coefficients": "tableau"},
    "rk2_gated": {},  # the paper's default
    # a 4-way softmax gate (the method alone builds RK4's tableau)
    "rk4_values": {
        "encoder_ode_method": "rk4",
        "encoder_ode_coefficients": "gated",
        "relative_position_values": True,
    },
    "pc_rk2": {
        "encoder_ode_method": "rk2",
        "encoder_ode_coefficients": "ema",
        "encoder_layer_connections": "predictor_corrector",
        "ode_coefficient_scope": "stack",
    },
}


def decoder_side(overrides: dict) -> dict:
    """The same block in the decoder (and a plain Euler encoder)."""
    return {key.replace("encoder_", "decoder_"): value for key, value in overrides.items()}


def sequences(vocab_size: int, device: torch.device, seed: int = 3) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab_size, (n,), generator=generator).to(device) for n in LENGTHS]


def pad(rows: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of `rows` padded to the longest on `side`, on the rows' device."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), PAD, device=rows[0].device)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, span], mask[i, span] = row, 1
    return ids, mask


def real(tensor: torch.Tensor, i: int, length: int, side: str) -> torch.Tensor:
    """Row i's real (unpadded) positions of a (batch, length, ...) tensor."""
    return tensor[i, -length:] if side == "left" else tensor[i, :length]


def build(model_class, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    if model_class is ODETransformerForCausalLM:
        return model_class(tiny(is_encoder_decoder=False, **overrides)).eval()
    return model_class(tiny(**overrides)).eval()


def test_token_positions_count_the_tokens_the_mask_keeps(device):
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]], device=device)
    queries, keys = token_positions(mask, None, past=0, length=5, key_length=5, device=device)
    assert queries.tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]] == keys.tolist()
    # One cached step: the query is the 6th column; a static cache's unwritten keys get position 0.
    step = torch.cat([mask, torch.ones(2, 1, dtype=torch.long, device=device)], dim=1)
    queries, keys = token_positions(step, None, past=5, length=1, key_length=8, device=device)
    assert queries.tolist() == [[3], [3]]
    assert keys.tolist() == [[0, 0, 0, 1, 2, 3, 0, 0], [0, 1, 2, 2, 2, 3, 0, 0]]
    # `position_ids` (as `generate` passes them) place the queries; the cached keys come from the mask.
    queries, keys = token_positions(
        step, torch.tensor([[9], [9]], device=device), past=5, length=1, key_length=6, device=device
    )
    assert queries.tolist() == [[9], [9]] and keys[:, -1].tolist() == [9, 9]
    # Without a mask: 0.. for every row.
    queries, keys = token_positions(None, None, past=2, length=3, key_length=5, device=device)
    assert queries.tolist() == [[2, 3, 4]] and keys.tolist() == [[0, 1, 2, 3, 4]]


def test_relative_distances_are_between_token_positions(device):
    queries = torch.tensor([[0, 0, 1, 2]], device=device)  # one left pad, then three tokens
    index = relative_position_index(queries, queries, max_distance=1)
    assert index.shape == (1, 1, 4, 4)
    # clip(j - i, -1, 1) + 1 between positions, by hand
    assert index[0, 0].tolist() == [[1, 1, 2, 2], [1, 1, 2, 2], [0, 0, 1, 2], [0, 0, 0, 1]]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_seq2seq_padded_sources_give_each_sentence_its_own_logits(block, side, device):
    model = build(ODETransformerForConditionalGeneration, **BLOCKS[block]).to(device)
    rows = sequences(model.config.vocab_size, device)
    target = torch.randint(4, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(4))
    target = target.to(device)
    ids, mask = pad(rows, side)
    with torch.no_grad():
        encoded = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        batch = model(ids, attention_mask=mask, decoder_input_ids=target.expand(len(rows), -1)).logits
        for i, row in enumerate(rows):
            alone_encoded = model.get_encoder()(input_ids=row[None]).last_hidden_state
            torch.testing.assert_close(
                real(encoded, i, len(row), side), alone_encoded[0], rtol=1e-5, atol=1e-5
            )
            alone = model(row[None], decoder_input_ids=target).logits
            torch.testing.assert_close(batch[i], alone[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_causal_lm_padded_batch_gives_each_sentence_its_own_logits(block, side, device):
    model = build(ODETransformerForCausalLM, **decoder_side(BLOCKS[block])).to(device)
    rows = sequences(model.config.vocab_size, device)
    ids, mask = pad(rows, side)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask).logits
        for i, row in enumerate(rows):
            alone = model(row[None]).logits
            torch.testing.assert_close(real(batch, i, len(row), side), alone[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", ["rk2_gated", "rk4_values", "pc_rk2"])
def test_causal_lm_left_padded_incremental_decoding_equals_the_full_forward(block, device):
    """Prompt, then 4 cached steps of one token each: the logits of one full forward of the whole batch, and of
    each sentence alone."""
    model = build(ODETransformerForCausalLM, **decoder_side(BLOCKS[block])).to(device)
    rows = sequences(model.config.vocab_size, device)
    ids, mask = pad(rows, "left")
    steps = torch.randint(
        4, model.config.vocab_size, (len(rows), 4), generator=torch.Generator().manual_seed(5)
    ).to(device)
    whole, whole_mask = torch.cat([ids, steps], 1), torch.cat([mask, torch.ones_like(steps)], 1)
    with torch.no_grad():
        full = model(whole, attention_mask=whole_mask).logits
        out = model(ids, attention_mask=mask, use_cache=True)
        cached, past = [out.logits], out.past_key_values
        for t in range(steps.shape[1]):
            out = model(
                steps[:, t : t + 1],
                attention_mask=whole_mask[:, : ids.shape[1] + t + 1],
                past_key_values=past,
                use_cache=True,
            )
            cached, past = cached + [out.logits], out.past_key_values
        kept = whole_mask.bool()  # the outputs at padding are never read
        torch.testing.assert_close(torch.cat(cached, 1)[kept], full[kept], rtol=1e-5, atol=1e-5)
        for i, row in enumerate(rows):
            alone = model(torch.cat([row, steps[i]])[None]).logits
            torch.testing.assert_close(full[i, -len(row) - 4 :], alone[0], rtol=1e-5, atol=1e-5)


DECODING = {"greedy": {}, "beam": {"num_beams": 3}}


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("decoding", sorted(DECODING))
@pytest.mark.parametrize("block", ["rk2_gated", "rk4_values"])
def test_causal_lm_left_padded_generation_equals_each_prompt_alone(block, decoding, cache, device):
    model = build(ODETransformerForCausalLM, **decoder_side(BLOCKS[block])).to(device)
    rows = sequences(model.config.vocab_size, device)
    ids, mask = pad(rows, "left")
    kwargs = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, **DECODING[decoding]}
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    batch = model.generate(ids, attention_mask=mask, **kwargs)
    for i, row in enumerate(rows):
        alone = model.generate(row[None], **kwargs)
        assert batch[i, ids.shape[1] :].tolist() == alone[0, len(row) :].tolist()


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("block", ["rk4_values", "pc_rk2"])
def test_seq2seq_padded_generation_equals_each_source_alone(block, side, device):
    """Decoder ODE blocks too: the same block on both sides, beam search with the per-stage cache."""
    overrides = {**BLOCKS[block], **decoder_side(BLOCKS[block])}
    model = build(ODETransformerForConditionalGeneration, **overrides).to(device)
    rows = sequences(model.config.vocab_size, device)
    ids, mask = pad(rows, side)
    kwargs = {"max_new_tokens": 6, "min_new_tokens": 6, "num_beams": 3}
    batch = model.generate(ids, attention_mask=mask, **kwargs)
    for i, row in enumerate(rows):
        assert batch[i].tolist() == model.generate(row[None], **kwargs)[0].tolist()
