"""`BeamSearchCache`: the decoder's cache under `generate`, preallocated and reordered by indirection. Checked
against transformers' `DynamicCache`, which reorders beams by copying, and against decoding without a cache."""

import pytest
import torch
from decoding import PAD, causal_lm, source_batch, tiny
from transformers import DynamicCache

from modeling_ode import ODETransformerConfig, ODETransformerForConditionalGeneration
from modeling_ode.cache_ode import BeamSearchCache, beam_attention_forward, self_attention_cache
from modeling_ode.modeling_ode_transformer import ODETransformerAttention, eager_attention_forward


@pytest.mark.parametrize("beams,query_length", [(1, 1), (3, 1), (3, 2)])
def test_attention_over_the_cache_equals_attention_over_a_cache_reordered_by_copying(beams, query_length):
    """24 steps (the buffers grow past their first 16 positions), each followed by a random reordering within each
    source's beams: the output and weights equal eager attention over a `DynamicCache` whose `reorder_cache` copies
    the rows, step by step, under a random additive mask."""
    torch.manual_seed(0)
    sources, heads, head_dim = 2, 2, 4
    rows = sources * beams
    config = ODETransformerConfig.from_preset("tiny", d_model=heads * head_dim, max_relative_position=0)
    module = ODETransformerAttention(config, heads, is_cross_attention=False).eval()
    cache, copied = BeamSearchCache(num_slots=1, num_beams=beams), DynamicCache()
    for _ in range(24):
        key, value, query = (torch.randn(rows, heads, query_length, head_dim) for _three in range(3))
        keys, values = cache.update(key, value, 0)
        expected_keys, expected_values = copied.update(key, value, 0)
        mask = torch.randn(rows, 1, query_length, expected_keys.shape[2])
        expected = eager_attention_forward(module, query, expected_keys, expected_values, mask, scaling=0.5)
        if beams == 1:  # one beam: the usual layout, read by the usual attention
            assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
            continue
        output, weights = beam_attention_forward(
            module, query, keys, values, mask, 0.5, places=cache.places()
        )
        torch.testing.assert_close(output, expected[0])
        torch.testing.assert_close(weights, expected[1])
        beam_idx = torch.arange(rows) // beams * beams + torch.randint(0, beams, (rows,))
        cache.reorder_cache(beam_idx)
        copied.reorder_cache(beam_idx)
    assert cache.get_seq_length() == 24 * query_length


def test_reordering_moves_no_key_or_value():
    """A reorder gathers the (rows, length) table of origins; the slots' buffers keep their storage and the
    content of their 3 written positions (the rest of a buffer is unwritten memory, NaN as likely as not)."""
    cache = BeamSearchCache(num_slots=2, num_beams=2)
    for slot in range(2):
        cache.update(torch.randn(4, 2, 3, 4), torch.randn(4, 2, 3, 4), slot)
    written = slice(0, 3)  # buffers are (sources, heads, capacity, beams, head_dim)
    before = [(layer.keys.data_ptr(), layer.keys[:, :, written].clone()) for layer in cache.layers]
    cache.reorder_cache(torch.tensor([1, 1, 2, 2]))
    for layer, (pointer, keys) in zip(cache.layers, before):
        assert layer.keys.data_ptr() == pointer and torch.equal(layer.keys[:, :, written], keys)
    assert cache.origins.tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]]


def test_rows_that_are_not_whole_groups_of_beams_are_refused():
    with pytest.raises(ValueError, match="3 beams was given 4 rows"):
        BeamSearchCache(num_slots=1, num_beams=3).update(torch.randn(4, 2, 1, 4), torch.randn(4, 2, 1, 4), 0)


VARIANTS = [
    {},  # RK2-gated encoder, residual decoder with relative keys
    {"decoder_ode_method": "rk4", "max_relative_position": 4, "relative_position_values": True},
    {
        "decoder_ode_method": "rk2",
        "decoder_ode_function": "attention",
        "decoder_layer_connections": "multistep",
    },
    {"decoder_ode_method": "rk2", "decoder_layer_connections": "predictor_corrector"},
]


@pytest.mark.parametrize("overrides", VARIANTS)
@pytest.mark.parametrize("decoding", [{"num_beams": 3, "length_penalty": 0.6}, {"num_beams": 1}])
def test_beam_search_uses_it_and_keeps_the_tokens_of_decoding_without_a_cache(overrides, decoding):
    """40 new tokens (past the first doubling of the buffers), every decoder block type: beam search's default
    cache is a `BeamSearchCache` whose tokens and scores equal those of no cache and of transformers' dynamic cache
    (asked for explicitly); greedy search keeps the dynamic cache."""
    torch.manual_seed(0)
    model = ODETransformerForConditionalGeneration(tiny(**overrides)).eval()
    ids, mask = source_batch()
    kwargs = {
        "max_new_tokens": 40,
        "min_new_tokens": 40,
        "return_dict_in_generate": True,
        "output_scores": True,
    }
    kwargs.update(decoding)
    default = model.generate(ids, attention_mask=mask, **kwargs)
    uncached = model.generate(ids, attention_mask=mask, use_cache=False, **kwargs)
    dynamic = model.generate(ids, attention_mask=mask, cache_implementation="dynamic", **kwargs)
    assert torch.equal(default.sequences, uncached.sequences) and torch.equal(
        default.sequences, dynamic.sequences
    )
    torch.testing.assert_close(
        torch.stack(default.scores), torch.stack(uncached.scores), rtol=1e-4, atol=1e-4
    )
    beam_search = decoding["num_beams"] > 1
    assert isinstance(self_attention_cache(default.past_key_values), BeamSearchCache) == beam_search
    assert type(self_attention_cache(dynamic.past_key_values)) is DynamicCache


def test_beam_search_keeps_the_encoder_keys_and_values_once_per_source():
    """The cross-attention cache holds one row per source, not one per beam (generate repeats the encoder states
    per beam; their keys and values are equal)."""
    torch.manual_seed(0)
    model = ODETransformerForConditionalGeneration(tiny()).eval()
    ids, mask = source_batch()
    out = model.generate(
        ids, attention_mask=mask, num_beams=3, max_new_tokens=4, return_dict_in_generate=True
    )
    cross = out.past_key_values.cross_attention_cache
    assert [layer.keys.shape[0] for layer in cross.layers] == [ids.shape[0]] * model.config.decoder_layers


def test_causal_lm_beam_search_with_left_padding_and_several_returns_keeps_the_tokens():
    """The causal LM (prompt prefill of several positions, left padding) under beam search with two sequences per
    prompt: `BeamSearchCache` gives the sequences and scores of the dynamic cache and of no cache."""
    model = causal_lm(tiny(is_encoder_decoder=False, decoder_ode_method="rk2"))
    ids = torch.randint(4, 99, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = PAD, 0  # left padding
    kwargs = {"max_new_tokens": 12, "min_new_tokens": 12, "num_beams": 3, "num_return_sequences": 2}
    kwargs.update(return_dict_in_generate=True, output_scores=True, pad_token_id=PAD)
    default = model.generate(ids, attention_mask=mask, **kwargs)
    assert isinstance(default.past_key_values, BeamSearchCache)
    for other in (
        model.generate(ids, attention_mask=mask, cache_implementation="dynamic", **kwargs),
        model.generate(ids, attention_mask=mask, use_cache=False, **kwargs),
    ):
        assert torch.equal(default.sequences, other.sequences)
        torch.testing.assert_close(default.sequences_scores, other.sequences_scores, rtol=1e-4, atol=1e-4)


def test_a_beam_search_cache_refuses_encoder_states_not_repeated_per_beam():
    """Outside `generate`, a beam-search cache of 3 beams given one encoder row per source (not one per beam) is
    refused by name, not read with the sources misaligned."""
    torch.manual_seed(0)
    model = ODETransformerForConditionalGeneration(tiny()).eval()
    ids, _ = source_batch()  # 3 sources
    cache = model.get_decoder().cache_layout.beam_search(3, encoder_decoder=True)
    decoder_ids = torch.full((9, 1), model.config.decoder_start_token_id)
    with pytest.raises(ValueError, match="repeated once per beam"):
        model(input_ids=ids, decoder_input_ids=decoder_ids, past_key_values=cache, use_cache=True)
