"""Model behaviour: parameter counts, cached vs uncached decoding, attention backends, save/load, losses."""

import json
import logging
import math

import pytest
import torch
from decoding import (
    NO_DROPOUT,
    assert_incremental_decoding_equals_full_forward,
    causal_lm,
    generate_static_dynamic_uncached,
    source_batch,
    tiny,
)
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM, DynamicCache

from modeling_ode import (
    ODETransformerConfig,
    ODETransformerForCausalLM,
    ODETransformerForConditionalGeneration,
    ODETransformerModel,
)


def seq2seq(**overrides):
    torch.manual_seed(0)
    return ODETransformerForConditionalGeneration(tiny(**overrides)).eval()


# Table "main-results": parameter counts with the paper's En-De joint BPE vocabulary (34040).
@pytest.mark.parametrize("preset,millions", [("base", 61), ("deep", 118), ("big", 211), ("big_deep", 286)])
def test_paper_parameter_counts(preset, millions):
    counts = {}
    for method, coefficients in [
        ("euler", "tableau"),
        ("rk2", "tableau"),
        ("rk4", "tableau"),
        ("rk2", "gated"),
    ]:
        config = ODETransformerConfig.from_preset(
            preset, vocab_size=34040, encoder_ode_method=method, encoder_ode_coefficients=coefficients
        )
        with torch.device("meta"):
            counts[method, coefficients] = ODETransformerForConditionalGeneration(config).num_parameters()
    residual = counts["euler", "tableau"]
    assert int(residual / 1e6) == millions  # the paper truncates: 61.6M -> "61M", 286.9M -> "286M"
    assert (
        counts["rk2", "tableau"] == counts["rk4", "tableau"] == residual
    )  # stages share the block's weights
    d, layers = config.d_model, config.encoder_layers
    assert counts["rk2", "gated"] == residual + layers * (2 * d + 1)  # one Linear(2d -> 1) gate per block


DECODER_VARIANTS = [
    {},  # the paper: RK2-gated encoder, residual decoder, RPR, dense connections
    {"decoder_ode_method": "rk2", "decoder_ode_coefficients": "gated"},
    {
        "decoder_ode_method": "rk4",
        "decoder_ode_function": "sublayers",
        "decoder_layer_connections": "residual",
    },
    {
        "decoder_ode_method": "rk2",
        "decoder_ode_coefficients": "tableau",
        "decoder_ode_function": "attention",
        "decoder_layer_connections": "multistep",
        "relative_position_values": True,
    },
    {
        "decoder_ode_method": "polynet",
        "ode_function_includes_residual": True,
        "decoder_layer_connections": "leapfrog",
    },
]


@pytest.mark.parametrize("overrides", DECODER_VARIANTS)
def test_incremental_decoding_equals_full_forward(overrides, device):
    assert_incremental_decoding_equals_full_forward(
        seq2seq(**overrides).to(device), *source_batch(device=device)
    )


GREEDY, BEAM = {}, {"num_beams": 3, "length_penalty": 0.6}
BEAM_RETURN_2 = {"num_beams": 3, "num_return_sequences": 2, "early_stopping": True}


@pytest.mark.parametrize(
    "overrides,decoding",
    [(variant, GREEDY) for variant in DECODER_VARIANTS]
    + [(DECODER_VARIANTS[0], BEAM), (DECODER_VARIANTS[1], BEAM_RETURN_2), (DECODER_VARIANTS[2], BEAM)],
)
def test_generate_same_tokens_with_and_without_cache(overrides, decoding, device, dtype):
    model = seq2seq(**overrides).to(device, dtype)
    ids, mask = source_batch(device=device)
    kwargs = {"max_new_tokens": 10, "min_new_tokens": 10, **decoding}
    cached = model.generate(ids, attention_mask=mask, use_cache=True, **kwargs)
    uncached = model.generate(ids, attention_mask=mask, use_cache=False, **kwargs)
    assert cached.shape == (3 * decoding.get("num_return_sequences", 1), 11)
    assert torch.equal(cached, uncached)


class ReorderingEverything(ODETransformerForConditionalGeneration):
    def _reorder_cache(self, past_key_values, beam_idx):
        past_key_values.reorder_cache(beam_idx)  # transformers' default: the cross-attention states too
        return past_key_values


def test_beam_search_reorders_only_the_self_attention_cache(device):
    """The premise of `_reorder_cache`: the cross-attention states of all beams of one source are equal, so only the
    self-attention states need reordering; the result equals transformers' default (reorder everything). Checked on
    transformers' dynamic cache, which keeps a row per beam (`BeamSearchCache` keeps one per source)."""
    model = seq2seq(decoder_ode_method="rk2").to(device)
    reference = ReorderingEverything(model.config).eval().to(device)
    reference.load_state_dict(model.state_dict())
    ids, mask = source_batch(device=device)
    beams = 3
    kwargs = {"max_new_tokens": 6, "num_beams": beams, "return_dict_in_generate": True, "output_scores": True}
    kwargs["cache_implementation"] = "dynamic"
    ours = model.generate(ids, attention_mask=mask, **kwargs)
    for layer in ours.past_key_values.cross_attention_cache.layers:
        keys = layer.keys.view(ids.shape[0], beams, *layer.keys.shape[1:])
        assert torch.equal(keys, keys[:, :1].expand_as(keys))
    default = reference.generate(ids, attention_mask=mask, **kwargs)
    assert torch.equal(ours.sequences, default.sequences)
    assert torch.equal(ours.sequences_scores, default.sequences_scores)


def test_sampling_is_reproducible_and_respects_the_cache(device):
    model = seq2seq(decoder_ode_method="rk2").to(device)
    ids, mask = source_batch(device=device)
    runs = []
    for use_cache in (True, False):
        torch.manual_seed(3)
        runs.append(
            model.generate(
                ids, attention_mask=mask, do_sample=True, top_k=20, max_new_tokens=8, use_cache=use_cache
            )
        )
    assert torch.equal(*runs)


@pytest.mark.parametrize("overrides", [{}, {"decoder_ode_method": "rk4"}, {"max_relative_position": 0}])
def test_sdpa_and_eager_attention_agree(overrides, device):
    ids, mask = source_batch(device=device)
    target = torch.randint(4, 99, (3, 5), device=device)
    logits = {}
    for implementation in ("eager", "sdpa"):
        model = seq2seq(**overrides).to(device)
        model.set_attn_implementation(implementation)
        logits[implementation] = model(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
    torch.testing.assert_close(logits["eager"], logits["sdpa"], rtol=1e-5, atol=1e-5)


def test_recording_outputs_keeps_later_forwards_on_sdpa(monkeypatch, device):
    """`capture_outputs` leaves its hooks on the modules after any recording call; only a call that records
    attention weights may take the eager path under SDPA, not the plain forwards after it."""
    from modeling_ode import modeling_ode_transformer

    eager_calls = []
    eager = modeling_ode_transformer.eager_attention_forward
    monkeypatch.setattr(
        modeling_ode_transformer,
        "eager_attention_forward",
        lambda *a, **k: eager_calls.append(1) or eager(*a, **k),
    )
    model = seq2seq(max_relative_position=0).to(device)
    model.set_attn_implementation("sdpa")
    ids, mask = source_batch(device=device)
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "decoder_input_ids": torch.randint(4, 99, (3, 5), device=device),
    }
    model(**batch, output_hidden_states=True, output_ode_stages=True)
    model(**batch)
    assert eager_calls == []
    output = model(**batch, output_attentions=True)
    assert eager_calls and output.encoder_attentions[0] is not None and output.cross_attentions[0] is not None


def test_save_load_round_trip_is_bit_exact(tmp_path, device):
    model = seq2seq(
        decoder_ode_method="rk2",
        decoder_ode_coefficients="learnable",
        ode_coefficient_scope="stack",
        ode_gate_inputs="layer_norm",  # the encoder's gate (tiny's default `gated`) reads normalised stages
    ).to(device)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    for name, tensor in model.state_dict().items():
        if name in weights:
            assert torch.equal(weights[name], tensor.cpu()), name
    for auto in (AutoModelForSeq2SeqLM, ODETransformerForConditionalGeneration):
        loaded = auto.from_pretrained(tmp_path).eval().to(device)
        assert type(loaded) is ODETransformerForConditionalGeneration
        assert loaded.config.ode_gate_inputs == "layer_norm"
        for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
            assert torch.equal(a, b), name
        ids, mask = source_batch(device=device)
        assert torch.equal(
            model(input_ids=ids, attention_mask=mask).logits,
            loaded(input_ids=ids, attention_mask=mask).logits,
        )
    assert type(AutoConfig.from_pretrained(tmp_path)) is ODETransformerConfig
    assert type(AutoModel.from_pretrained(tmp_path)) is ODETransformerModel


def test_embeddings_are_tied_and_a_separate_source_vocabulary_is_possible(device):
    model = seq2seq().to(device)
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert (
        model.model.encoder.embed_tokens.weight is shared
        and model.model.decoder.embed_tokens.weight is shared
    )
    separate = seq2seq(source_vocab_size=57, share_encoder_decoder_embeddings=False).to(device)
    assert separate.model.encoder.embed_tokens.weight.shape == (57, 16)
    assert separate.model.decoder.embed_tokens.weight is separate.lm_head.weight
    ids = torch.randint(4, 57, (2, 5), device=device)
    assert separate(input_ids=ids, decoder_input_ids=ids[:, :3]).logits.shape == (2, 3, 99)


def test_loss_is_plain_cross_entropy_in_both_modes_and_exact_under_gradient_accumulation(device):
    """As BART and Marian: the model's loss is the NLL per target token in training and in eval mode (the paper's
    label smoothing is the Trainer's `label_smoothing_factor`), so `loss` and `eval_loss` are on one scale; the
    causal LM's too, over its shifted labels."""
    ids, mask = source_batch(device=device)
    labels = torch.randint(4, 99, (3, 6), generator=torch.Generator().manual_seed(4)).to(device)
    labels[2, 3:] = -100
    model = seq2seq(**NO_DROPOUT).to(device)
    keep = labels != -100
    for mode in (model.train, model.eval):
        out = mode()(input_ids=ids, attention_mask=mask, labels=labels)
        logp = out.logits.double().log_softmax(-1)
        nll = -logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0][keep].mean()
        torch.testing.assert_close(out.loss.double(), nll, rtol=1e-6, atol=1e-6)
    # Two micro-batches with num_items_in_batch add up to the full batch's loss.
    n = keep.sum()
    parts = [
        model(input_ids=ids[s], attention_mask=mask[s], labels=labels[s], num_items_in_batch=n).loss
        for s in (slice(0, 2), slice(2, 3))
    ]
    torch.testing.assert_close(parts[0] + parts[1], out.loss)
    lm = causal_lm(tiny(is_encoder_decoder=False)).to(device).train()
    lm_out = lm(input_ids=ids, labels=ids)
    lm_logp = lm_out.logits[:, :-1].double().log_softmax(-1)
    lm_nll = -lm_logp.gather(-1, ids[:, 1:, None])[..., 0].mean()
    torch.testing.assert_close(lm_out.loss.double(), lm_nll, rtol=1e-6, atol=1e-6)


def test_a_saved_config_with_the_old_label_smoothing_field_loads_with_a_note(tmp_path, caplog):
    """A config carrying `label_smoothing`, a field the model does not read (its loss is plain cross entropy; the
    Trainer smooths the labels), loads, says where the smoothing went, and is saved again without the field."""
    tiny().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "label_smoothing": 0.1}))
    with caplog.at_level(logging.WARNING):
        loaded = ODETransformerConfig.from_pretrained(tmp_path)
    assert "`label_smoothing`=0.1 is no longer used" in caplog.text
    assert "label_smoothing_factor=0.1" in caplog.text
    assert not hasattr(loaded, "label_smoothing")
    loaded.save_pretrained(tmp_path / "again")
    assert "label_smoothing" not in json.loads((tmp_path / "again" / "config.json").read_text())


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_a_method_without_coefficients_builds_the_papers_block(side):
    """Given no coefficients, RK2 is the paper's learnable gate (Eq. (learnable)) and RK4, like every other
    method and a user tableau, its fixed tableau (Eq. (rk4)); the config holds the mode it built."""
    from modeling_ode.ode import ODE_METHODS

    for method in ODE_METHODS:
        config = ODETransformerConfig.from_preset("tiny", **{f"{side}_ode_method": method})
        assert getattr(config, f"{side}_ode_coefficients") == ("gated" if method == "rk2" else "tableau"), (
            method
        )
    user = ODETransformerConfig(**{f"{side}_ode_method": {"a": [[], [1.0]], "b": [0.5, 0.5]}})
    assert getattr(user, f"{side}_ode_coefficients") == "tableau"
    rk4 = seq2seq(**{f"{side}_ode_method": "rk4"})
    coefficients = getattr(rk4.model, side).ode_coefficients
    assert [list(module.parameters()) for module in coefficients] == [[]] * len(coefficients)  # b, not a gate
    assert ODETransformerConfig(encoder_ode_method="rk4").encoder_ode_coefficients == "tableau"
    assert ODETransformerConfig().encoder_ode_coefficients == "gated"  # the default RK2 encoder, as before


def test_a_saved_config_keeps_its_coefficients(tmp_path):
    """save_pretrained writes both coefficient fields (every version has), so a folder loads with the block it was
    saved with: RK4 saved by the earlier default (gated) stays gated, a default RK4 saved now stays tableau. A
    config.json without the fields (written by hand) gets the paper's block."""
    tiny(encoder_ode_method="rk4").save_pretrained(tmp_path / "now")
    written = json.loads((tmp_path / "now" / "config.json").read_text())
    assert (written["encoder_ode_coefficients"], written["decoder_ode_coefficients"]) == (
        "tableau",
        "tableau",
    )
    # config.json as the earlier default wrote `ODETransformerConfig.from_preset("tiny", encoder_ode_method="rk4")`
    old = {**written, "encoder_ode_coefficients": "gated", "transformers_version": "5.23.0"}
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps(old))
    loaded = ODETransformerConfig.from_pretrained(tmp_path / "old")
    assert (loaded.encoder_ode_method, loaded.encoder_ode_coefficients) == ("rk4", "gated")
    gate = ODETransformerForConditionalGeneration(loaded).model.encoder.ode_coefficients[0]
    assert any(True for _ in gate.parameters())  # the 4-way softmax gate it was trained with
    for mode in ("tableau", "ones", "learnable", "gated_tanh", "ema"):
        tiny(encoder_ode_method="rk4", encoder_ode_coefficients=mode).save_pretrained(tmp_path / mode)
        assert ODETransformerConfig.from_pretrained(tmp_path / mode).encoder_ode_coefficients == mode
    bare = {k: v for k, v in written.items() if not k.endswith("_ode_coefficients")}
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text(json.dumps({**bare, "decoder_ode_method": "rk2"}))
    bare_loaded = ODETransformerConfig.from_pretrained(tmp_path / "bare")
    assert (bare_loaded.encoder_ode_coefficients, bare_loaded.decoder_ode_coefficients) == (
        "tableau",
        "gated",
    )


def test_gradient_checkpointing_gives_the_same_gradients(device):
    ids, mask = source_batch(device=device)
    labels = torch.randint(4, 99, (3, 6), device=device)
    grads = []
    for checkpointing in (False, True):
        model = seq2seq(decoder_ode_method="rk2").train().to(device)
        if checkpointing:
            model.gradient_checkpointing_enable()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("labels_given", [True, False], ids=["labels", "no-labels"])
def test_stage_checkpointing_gives_the_same_gradients(labels_given, device):
    """`ode_checkpoint_stages` recomputes stages 2..s in the backward pass, dropout masks included: the same
    gradients. Without labels (the Trainer pops them under label smoothing) the decoder would build a KV cache by
    default; the recomputed stages must not write it a second time."""
    ids, mask = source_batch(device=device)
    targets = torch.randint(4, 99, (3, 6), device=device)
    grads = []
    for checkpointing in (False, True):
        model = (
            seq2seq(decoder_ode_method="rk4", dropout=0.3, ode_checkpoint_stages=checkpointing)
            .train()
            .to(device)
        )
        torch.manual_seed(1)
        if labels_given:
            loss = model(input_ids=ids, attention_mask=mask, labels=targets).loss
        else:
            logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=targets).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_trains(dtype, device):
    model = seq2seq(decoder_ode_method="rk2").train().to(device)
    ids, mask = source_batch(device=device)
    labels = torch.randint(4, 99, (3, 6), device=device)
    with torch.autocast(device.type, dtype=dtype):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert out.logits.dtype == dtype and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_hidden_states_selected_by_a_negative_index_count_from_each_stacks_own_depth():
    """`output_hidden_states=-1` is each stack's last layer, on an encoder deeper than its decoder (as in the
    paper's deep 24-6 model): the config's num_hidden_layers is the decoder's depth."""
    model = seq2seq(encoder_layers=4, decoder_layers=2)
    ids, mask = source_batch()
    inputs = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids[:, :3]}
    every, last = model(**inputs, output_hidden_states=True), model(**inputs, output_hidden_states=-1)
    for side, depth in (("encoder_hidden_states", 4), ("decoder_hidden_states", 2)):
        selected = getattr(last, side)
        assert len(getattr(every, side)) == depth + 1
        assert [i for i, h in enumerate(selected) if h is not None] == [depth]
        torch.testing.assert_close(selected[depth], getattr(every, side)[depth])


def test_the_last_hidden_state_is_the_last_of_the_hidden_states():
    """As in BART and MBart (pre-norm, with a final LayerNorm): hidden_states[-1] is last_hidden_state, the final
    LayerNorm's output, for the encoder, the decoder and the causal LM; the layers before it are their raw
    outputs. config.tie_last_hidden_states=False keeps the last layer's raw output instead."""
    for connections in ("residual", "learnable_dense"):
        model = seq2seq(encoder_layer_connections=connections, decoder_layer_connections=connections)
        ids, mask = source_batch()
        out = model(
            input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :3], output_hidden_states=True
        )
        assert torch.equal(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)
        decoded = model.model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :3])
        assert torch.equal(out.decoder_hidden_states[-1], decoded.last_hidden_state)
    lm = ODETransformerForCausalLM(
        ODETransformerConfig.from_preset("tiny", vocab_size=99, is_encoder_decoder=False)
    )
    ids = torch.randint(4, 99, (2, 5))
    out = lm.model(input_ids=ids, output_hidden_states=True)
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    lm.config.tie_last_hidden_states = False
    raw = lm.model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    assert not torch.allclose(raw, out.last_hidden_state)


def test_output_ode_stages(device):
    model = seq2seq(decoder_ode_method="rk4", decoder_ode_function="sublayers").to(device)
    ids, mask = source_batch(device=device)
    out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :4], output_ode_stages=True)
    assert len(out.encoder_ode_stages) == 2  # one RK2 block per encoder layer
    assert out.encoder_ode_stages[0].shape == (2, 3, 9, 16)
    gate = out.encoder_ode_coefficients[0]
    assert gate.shape == (2, 3, 9, 1)
    torch.testing.assert_close(gate.sum(0), torch.ones_like(gate[0]))  # g and 1 - g
    assert len(out.decoder_ode_stages) == 2 * 3  # three sublayer blocks per decoder layer
    assert out.decoder_ode_stages[0].shape == (4, 3, 4, 16)
    torch.testing.assert_close(out.decoder_ode_coefficients[0], torch.tensor([1, 2, 2, 1], device=device) / 6)


def test_causal_lm_cache_loss_and_auto_class(tmp_path, device):
    config = tiny(
        is_encoder_decoder=False,
        decoder_ode_method="rk2",
        decoder_ode_coefficients="gated",
    )
    model = causal_lm(config).to(device)
    ids = torch.randint(4, 99, (2, 10), device=device)
    out = model(input_ids=ids, labels=ids)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 99), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    cached = model.generate(ids[:, :3], max_new_tokens=8, min_new_tokens=8, use_cache=True)
    uncached = model.generate(ids[:, :3], max_new_tokens=8, min_new_tokens=8, use_cache=False)
    assert torch.equal(cached, uncached)
    model.save_pretrained(tmp_path)
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path)) is ODETransformerForCausalLM


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"encoder_ode_method": "rk5"}, "encoder_ode_method"),
        ({"decoder_ode_method": {"a": [[0.5], [1.0]], "b": [0.5, 0.5]}}, "explicit"),
        ({"encoder_ode_method": {"a": [[], [0.5]], "b": [0.5, 0.5], "c": [0.0, 1.0]}}, "sum to c"),
        ({"d_model": 16, "encoder_attention_heads": 3}, "encoder_attention_heads"),
        ({"decoder_ode_coefficients": "gated"}, "single stage"),
        ({"encoder_ode_coefficients": "sigmoid"}, "encoder_ode_coefficients"),
        ({"encoder_ode_function": "san"}, "encoder_ode_function"),
        ({"decoder_layer_connections": "highway"}, "decoder_layer_connections"),
        ({"ode_coefficient_scope": "layer"}, "ode_coefficient_scope"),
        ({"ode_gate_inputs": "batch_norm"}, "ode_gate_inputs"),
        (
            {"encoder_ode_coefficients": "tableau", "ode_gate_inputs": "layer_norm"},
            "no ODE block of this model has a gate",
        ),
        ({"dropout": 1.5}, "dropout"),
        ({"source_vocab_size": 50}, "share_encoder_decoder_embeddings"),
        ({"ode_step_size": 0}, "ode_step_size"),
    ],
)
def test_bad_configs_raise_clear_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny(**overrides)


def test_unknown_preset(device):
    with pytest.raises(ValueError, match="available presets"):
        ODETransformerConfig.from_preset("huge")


def test_inputs_longer_than_the_trained_length_get_fairseqs_sinusoids(device):
    """max_position_embeddings (128 here) is the trained length, not a bound: a 200-token source runs, and the
    position added at p is fairseq's sin(p w_i) | cos(p w_i), w_i = 10000^(-i / (d/2 - 1)), computed here by hand
    (with `position_offset`, p + offset). resize_position_embeddings, which HF's run_summarization.py calls for
    --max_source_length 1024, records the new length: there are no weights to resize."""
    model = seq2seq(position_offset=2).to(device).eval()
    assert model.config.max_position_embeddings == 128
    source = torch.randint(4, model.config.vocab_size, (1, 200), device=device)
    with torch.no_grad():
        out = model(input_ids=source, decoder_input_ids=source[:, :150]).logits
    assert out.shape[:2] == (1, 150) and torch.isfinite(out).all()
    half = model.config.d_model // 2
    expected = torch.tensor(
        [[f(p * 10000 ** (-i / (half - 1))) for f in (math.sin, math.cos) for i in range(half)]
         for p in range(2, 202)]
    )  # fmt: skip
    zeros = torch.zeros(1, 200, model.config.d_model, device=device)
    torch.testing.assert_close(model.get_encoder().embed(zeros).cpu(), expected[None], atol=1e-4, rtol=0)
    model.resize_position_embeddings(1024)
    assert model.config.max_position_embeddings == 1024


STATIC_CASES = [
    (DECODER_VARIANTS[0], GREEDY),  # Euler decoder
    (DECODER_VARIANTS[0], BEAM),
    (DECODER_VARIANTS[1], GREEDY),  # RK2-gated decoder: two self-attention slots per layer
    (DECODER_VARIANTS[2], BEAM),  # RK4 sublayer blocks: four slots per layer
]


@pytest.mark.parametrize("overrides,decoding", STATIC_CASES)
def test_static_cache_gives_the_same_tokens_as_dynamic_and_no_cache(overrides, decoding, device, dtype):
    kwargs = {"max_new_tokens": 8, "min_new_tokens": 8, **decoding}
    model = seq2seq(**overrides).to(device, dtype)
    assert generate_static_dynamic_uncached(model, *source_batch(device=device), **kwargs).shape == (3, 9)


@pytest.mark.parametrize("method,decoding", [("euler", GREEDY), ("rk2", BEAM), ("rk4", GREEDY)])
def test_causal_lm_static_cache_gives_the_same_tokens_as_dynamic_and_no_cache(
    method, decoding, device, dtype
):
    model = causal_lm(tiny(is_encoder_decoder=False, decoder_ode_method=method)).to(device, dtype)
    kwargs = {"max_new_tokens": 6, "min_new_tokens": 6, **decoding}
    assert generate_static_dynamic_uncached(model, *source_batch(device=device), **kwargs).shape == (3, 15)


def test_static_cache_holds_one_preallocated_slot_per_layer_and_stage(device):
    """RK4 decoder, 2 layers: 8 self-attention slots of `max_cache_len` positions, built before decoding starts."""
    from transformers.cache_utils import StaticCache

    model = seq2seq(decoder_ode_method="rk4").to(device)
    layout = model.get_decoder().cache_layout
    assert (layout.num_slots, layout.slot(1, 2)) == (8, 6)
    cache = layout.build(encoder_decoder=True, max_cache_len=12)
    assert isinstance(cache.self_attention_cache, StaticCache) and len(cache.self_attention_cache.layers) == 8
    ids, mask = source_batch(device=device)
    out = model.generate(
        ids,
        attention_mask=mask,
        cache_implementation="static",
        max_new_tokens=4,
        return_dict_in_generate=True,
    )
    self_cache = out.past_key_values.self_attention_cache
    assert len(self_cache.layers) == 8
    assert all(layer.keys.shape[2] == self_cache.get_max_length() for layer in self_cache.layers)


def test_a_cache_without_a_slot_per_stage_is_refused(device):
    from transformers.cache_utils import EncoderDecoderCache

    model = seq2seq(decoder_ode_method="rk2").to(device)
    ids, mask = source_batch(device=device)
    one_per_layer = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))
    with pytest.raises(ValueError, match=r"one self-attention cache slot per \(layer, stage\), 2 x 2 = 4"):
        model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :2], past_key_values=one_per_layer)


def test_fp16_left_padding_with_a_large_relative_key_logit_stays_finite():
    """In fp16 the additive mask's minimum plus a negative relative-key logit overflows to -inf; a fully masked
    row (a left-pad query) would then softmax to NaN, and the NaN reach the real tokens through the masked
    values (0 x NaN). The padded row equals the row alone."""
    lm = causal_lm(
        ODETransformerConfig.from_preset("tiny", is_encoder_decoder=False, attn_implementation="eager")
    )
    with torch.no_grad():
        for layer in lm.model.layers:
            layer.self_attn.relative_keys.normal_(0, 200)  # logits far below -16 at some distances
    lm = lm.half()
    ids = torch.tensor([[5, 6, 7, 8], [1, 1, 9, 10]])
    with torch.no_grad():
        padded = lm(ids, attention_mask=(ids != 1).long()).logits[1, 2:]
        alone = lm(ids[1:, 2:]).logits[0]
    assert torch.isfinite(padded).all()
    torch.testing.assert_close(padded, alone, rtol=1e-2, atol=1e-2)


def test_encoder_decoder_takes_a_plain_dynamic_cache(device):
    """A `DynamicCache` given to the encoder-decoder (as BART takes one) gets an empty cross-attention cache beside
    it: the same logits as without a cache, and the same generation."""
    model = seq2seq(decoder_ode_method="rk2").to(device)
    ids, mask = source_batch(device=device)
    inputs = {"input_ids": ids, "attention_mask": mask}
    cached = model(**inputs, decoder_input_ids=ids[:, :4], past_key_values=DynamicCache(), use_cache=True)
    uncached = model(**inputs, decoder_input_ids=ids[:, :4], use_cache=False)
    torch.testing.assert_close(cached.logits, uncached.logits, rtol=1e-5, atol=1e-5)
    greedy = {"max_new_tokens": 6, "num_beams": 1, "do_sample": False}
    assert torch.equal(
        model.generate(**inputs, past_key_values=DynamicCache(), **greedy), model.generate(**inputs, **greedy)
    )


def test_causal_lm_refuses_an_encoder_decoder_config():
    with pytest.raises(ValueError, match="is_encoder_decoder=False"):
        ODETransformerForCausalLM(tiny())


def test_resized_shared_vocabulary_saves_and_loads(tmp_path):
    """A `source_vocab_size` equal to the shared vocabulary names the same table: resizing it resizes both sides,
    and the saved model loads with the new size on both."""
    model = seq2seq(source_vocab_size=99)
    model.resize_token_embeddings(110)
    model.save_pretrained(tmp_path)
    loaded = ODETransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.get_encoder().embed_tokens.weight.shape == loaded.lm_head.weight.shape == (110, 16)
    torch.testing.assert_close(loaded.model.shared.weight, model.model.shared.weight)


def test_encoder_decoder_refuses_a_decoder_only_config(tmp_path):
    """Its decoder would have no cross-attention and ignore the source; AutoModel, which maps every ODE config
    to the encoder-decoder, says how to load a causal LM's folder instead of building a random model."""
    for model_class in (ODETransformerModel, ODETransformerForConditionalGeneration):
        with pytest.raises(ValueError, match="decoder-only config"):
            model_class(tiny(is_encoder_decoder=False))
    causal_lm(tiny(is_encoder_decoder=False)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="load a causal LM with AutoModelForCausalLM"):
        AutoModel.from_pretrained(tmp_path)


def test_max_new_tokens_over_a_saved_max_length_does_not_warn(tmp_path):
    """A saved folder's generation config holds its output length as max_length; `generate(max_new_tokens=N)`
    replaces it without transformers' warning that both are set, which would come on every call. A caller who
    sets both is still warned."""
    from tiny_folder import save_tiny_folder

    model, tokenizer = save_tiny_folder(tmp_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert model.generation_config.max_length == 9
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("transformers.generation.utils")
    logger.addHandler(handler)
    try:
        batch = tokenizer(["the dog runs"], return_tensors="pt")
        out = model.generate(**batch, max_new_tokens=12, min_new_tokens=12, num_beams=1)
        assert out.shape[1] == 13  # the start token and 12 new ones: max_new_tokens won over max_length 9
        assert not [record.getMessage() for record in records]
        model.generate(**batch, max_new_tokens=3, max_length=9)
        assert [record.getMessage() for record in records if "Both `max_new_tokens`" in record.getMessage()]
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"encoder_ode_method": "rk4", "decoder_ode_method": "rk2", "decoder_ode_coefficients": "ema"},
        {"encoder_layer_connections": "predictor_corrector", "encoder_ode_coefficients": "ema"},
        {"encoder_layer_connections": "multistep", "decoder_layer_connections": "leapfrog"},
        {
            "encoder_ode_function": "sublayers",
            "decoder_ode_function": "attention",
            "ode_coefficient_scope": "stack",
        },
        {"share_encoder_decoder_embeddings": False, "relative_position_values": True},
        {"is_encoder_decoder": False, "decoder_ode_method": "rk2", "decoder_ode_coefficients": "gated_tanh"},
    ],
)
def test_every_parameter_takes_part_in_a_training_step(fields):
    """Each parameter gets a gradient from one loss: what lets `ode-train` give DDP
    `find_unused_parameters=False`, not transformers' True, which costs an extra pass per step and warns that
    it found nothing unused."""
    from ode_transformer.train.arguments import parse_arguments

    assert parse_arguments(["--use_cpu", "true"])[3].ddp_find_unused_parameters is False
    torch.manual_seed(0)
    config = ODETransformerConfig.from_preset("tiny", **fields)
    causal = not config.is_encoder_decoder
    model = (ODETransformerForCausalLM if causal else ODETransformerForConditionalGeneration)(config)
    ids = torch.randint(3, config.vocab_size, (2, 7))
    labels = ids if causal else torch.randint(3, config.vocab_size, (2, 5))
    model(input_ids=ids, labels=labels).loss.backward()
    assert [name for name, p in model.named_parameters() if p.grad is None] == []


def test_q_k_v_start_at_the_scale_of_the_fused_matrices_they_were_rows_of():
    """Separate q/k/v projections are initialised as rows of the fused ones were (xavier-uniform over
    self-attention's 3d rows, cross-attention's 2d k/v rows; cross-attention's q over its own d): the same seed
    builds the same model as with the fused layout."""
    torch.manual_seed(0)
    config = ODETransformerConfig.from_preset("tiny")
    model = ODETransformerForConditionalGeneration(config)
    d = config.d_model
    layer = model.model.decoder.layers[0]
    bounds = {
        layer.self_attn.q_proj: (6 / (d + 3 * d)) ** 0.5,
        layer.self_attn.v_proj: (6 / (d + 3 * d)) ** 0.5,
        layer.encoder_attn.q_proj: (6 / (d + d)) ** 0.5,
        layer.encoder_attn.k_proj: (6 / (d + 2 * d)) ** 0.5,
        layer.encoder_attn.out_proj: (6 / (d + d)) ** 0.5,
    }
    for projection, bound in bounds.items():
        largest = projection.weight.abs().max().item()
        assert 0.95 * bound < largest <= bound
