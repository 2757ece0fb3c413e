"""ONNX export (hub/onnx_export.py): the three graphs, with both of torch.onnx's exporters, load in onnxruntime and
give PyTorch's outputs (float32, atol 1e-4) at shapes other than the export's; onnxruntime decoding
(ode_transformer/onnx_generation.py, transformers' `generate` over the sessions) gives the PyTorch model's `generate` tokens;
`ode-export --onnx` writes the graphs.

The default run exports a tiny model trained on a toy task (gated RK2 blocks on both sides, SDPA: the issue's
failing case) once per exporter and checks each graph and the decoding; the other block types and attention
implementations (`@pytest.mark.slow`) export a random tiny model each."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from optimum_seq2seq import OptimumStyleSeq2SeqLM
from tiny_folder import save_tiny_folder

from modeling_ode import ODETransformerForCausalLM, ODETransformerForConditionalGeneration
from modeling_ode.compat import CACHE_FIELD, attention_implementation
from modeling_ode.ode import StageGate
from ode_transformer.hub.onnx_export import (
    DECODER,
    DECODER_WITH_PAST,
    ENCODER,
    GRAPHS,
    QUANTIZED_GRAPHS,
    cache_names,
    export_onnx,
    quantized_name,
)
from ode_transformer.onnx_generation import ONNXSeq2SeqGenerator
from ode_transformer.onnx_search_decoding import SEARCH_GRAPH, ONNXSearchGenerator
from tests.decoding import BLOCKS, tiny

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

EXPORTERS = {"dynamo": True, "torchscript": False}
ATOL = 1e-4
# the authors' code's reading of the gated block (hub/convert_fairseq.py): F with its residuals, one gate per stack
AUTHORS_GATE = {"ode_function_includes_residual": True, "ode_coefficient_scope": "stack"}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def session_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return options


def block_config(block: str, **overrides):
    """`block` (tests/decoding.py's BLOCKS, or the authors' gated RK2) in the encoder and the decoder."""
    fields = BLOCKS["rk2_gated" if block == "rk2_gated_authors" else block]
    config = {f"{side}_{key}": value for side in ("encoder", "decoder") for key, value in fields.items()}
    if block == "rk2_gated_authors" or block.startswith("pc_"):
        config["ode_coefficient_scope"] = "stack"
    if block == "rk2_gated_authors":
        config.update(AUTHORS_GATE)
    return tiny(**config, **overrides)


# ----------------------------------------------------------------------------------------------------------
# Each graph against PyTorch
# ----------------------------------------------------------------------------------------------------------


def check_inputs(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shapes other than the export's (batch 3, source 7 with two padded rows, target 6): the axes are dynamic."""
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(4, vocab_size, (3, 7), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 5:] = mask[2, 3:] = 0
    return ids.masked_fill(mask == 0, 1), mask, torch.randint(4, vocab_size, (3, 6), generator=generator)


def flat_cache(model, cache, prefix: str, cross_attention: bool = True) -> dict[str, np.ndarray]:
    """A PyTorch cache under the graphs' names, read slot by slot through the decoder's `StageCacheLayout`."""
    layout = model.get_decoder().cache_layout
    flat = {}
    for name in cache_names(layout.num_layers, layout.stages, prefix, cross_attention):
        _, layer, attention, kind = name.split(".")
        if attention == "encoder":
            tensors = cache.cross_attention_cache.layers[int(layer)]
        else:
            stage = int(attention.removeprefix("decoder_stage")) if attention != "decoder" else 0
            tensors = cache.self_attention_cache.layers[layout.slot(int(layer), stage)]
        flat[name] = (tensors.keys if kind == "key" else tensors.values).numpy()
    return flat


def run(folder, graph: str, feed: dict) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(folder / graph), session_options(), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(None, {k: np.asarray(v) for k, v in feed.items()})))


def max_differences(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> dict[str, float]:
    assert set(actual) == set(expected), sorted(set(actual) ^ set(expected))
    return {name: float(np.abs(actual[name] - expected[name]).max()) for name in expected}


def graph_differences(model, folder, graph: str) -> dict[str, float]:
    """Max |onnxruntime - PyTorch| per output of `graph`. The logits are compared with the uncached full forward
    pass (the teacher-forced logits of the whole target), the cache with PyTorch's after the same tokens."""
    ids, mask, target = check_inputs(model.config.vocab_size)
    with torch.no_grad():
        hidden = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        full = model(input_ids=ids, attention_mask=mask, decoder_input_ids=target, use_cache=False).logits
        if graph == ENCODER:
            actual = run(folder, graph, {"input_ids": ids, "attention_mask": mask})
            return max_differences(actual, {"last_hidden_state": hidden.numpy()})
        first = model(encoder_outputs=(hidden,), attention_mask=mask, decoder_input_ids=target[:, :4])
        cache = getattr(first, CACHE_FIELD)
        past = flat_cache(model, cache, "past_key_values")
        if graph == DECODER:
            feed = {
                "input_ids": target[:, :4],
                "encoder_attention_mask": mask,
                "encoder_hidden_states": hidden,
            }
            expected = {"logits": full[:, :4].numpy(), **flat_cache(model, cache, "present")}
            return max_differences(run(folder, graph, feed), expected)
        model(
            encoder_outputs=(hidden,),
            attention_mask=mask,
            decoder_input_ids=target[:, 4:],
            **{CACHE_FIELD: cache},
        )
    feed = {"input_ids": target[:, 4:], "encoder_attention_mask": mask, **past}
    expected = {"logits": full[:, 4:].numpy(), **flat_cache(model, cache, "present", cross_attention=False)}
    return max_differences(run(folder, graph, feed), expected)


def assert_graphs_match(model, folder, graphs=GRAPHS) -> None:
    for graph in graphs:
        differences = graph_differences(model, folder, graph)
        worst = max(differences, key=differences.get)
        assert differences[worst] <= ATOL, (graph, worst, differences[worst])


# ----------------------------------------------------------------------------------------------------------
# A tiny model trained on a toy task (reverse the source), exported once per exporter
# ----------------------------------------------------------------------------------------------------------

VOCAB, EOS, PAD = 16, 2, 1


def reverse_task(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sources of 3 to 7 random tokens and eos, right-padded; labels: the tokens reversed, then eos."""
    lengths = torch.randint(3, 8, (batch,), generator=generator)
    ids = torch.full((batch, 8), PAD)
    labels = torch.full((batch, 9), -100)
    for row, length in enumerate(lengths.tolist()):
        tokens = torch.randint(4, VOCAB, (length,), generator=generator)
        ids[row, :length], ids[row, length] = tokens, EOS
        labels[row, :length], labels[row, length] = tokens.flip(0), EOS
    return ids, (ids != PAD).long(), labels


def train_reverse(block: str) -> ODETransformerForConditionalGeneration:
    """100 Adam updates of a model of `block` on the reverse task (quick on a CPU): greedy and beam outputs that vary
    in tokens and length."""
    torch.manual_seed(0)
    config = block_config(block, vocab_size=VOCAB, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64)
    model = ODETransformerForConditionalGeneration(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(100):
        ids, mask, labels = reverse_task(64, generator)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


@pytest.fixture(scope="module")
def trained() -> ODETransformerForConditionalGeneration:
    return train_reverse("rk2_gated")


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    """exporter -> the folder of the trained model's three graphs, each exporter's written once, whatever order
    the tests run in (a parametrized module fixture would export again whenever the order alternates)."""
    folders = {}

    def folder(exporter: str):
        if exporter not in folders:
            folders[exporter] = tmp_path_factory.mktemp(f"onnx-{exporter}")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                export_onnx(trained, folders[exporter], dynamo=EXPORTERS[exporter])
            folder.tracer_warnings[exporter] = [
                w for w in caught if issubclass(w.category, torch.jit.TracerWarning)
            ]
        return folders[exporter]

    folder.tracer_warnings = {}
    return folder


def test_the_torchscript_export_prints_no_tracer_warning(exported):
    """The TorchScript export prints no TracerWarning: the tracer warns at each Python check on a tensor, and
    each holds for any input (the graphs match the eager model: the tests below)."""
    exported("torchscript")
    assert [str(w.message)[:80] for w in exported.tracer_warnings["torchscript"]] == []


@pytest.mark.parametrize("exporter", sorted(EXPORTERS))
@pytest.mark.parametrize("graph", GRAPHS)
def test_each_graph_matches_pytorch(exported, trained, exporter, graph):
    folder = exported(exporter)
    assert attention_implementation(trained.config) == "sdpa"
    assert_graphs_match(trained, folder, [graph])


@pytest.mark.parametrize("exporter", sorted(EXPORTERS))
def test_graph_inputs_and_outputs_are_named_after_the_cache_layout(exported, trained, exporter):
    """Two decoder layers of two stages, under Optimum's names and in its order: per layer, stage 0's
    past_key_values.{layer}.decoder.{key,value} then the cross-attention's past_key_values.{layer}.encoder.{key,value};
    then the later stages' past_key_values.{layer}.decoder_stage1.{key,value}; every batch and length axis named, not
    fixed."""
    folder = exported(exporter)
    sessions = {
        graph: ort.InferenceSession(
            str(folder / graph), session_options(), providers=["CPUExecutionProvider"]
        )
        for graph in GRAPHS
    }
    inputs = {graph: [i.name for i in session.get_inputs()] for graph, session in sessions.items()}
    outputs = {graph: [o.name for o in session.get_outputs()] for graph, session in sessions.items()}
    per_layer = [
        f"{layer}.{attention}.{kv}"
        for layer in (0, 1)
        for attention in ("decoder", "encoder")
        for kv in ("key", "value")
    ]
    stages = [f"{layer}.decoder_stage1.{kv}" for layer in (0, 1) for kv in ("key", "value")]
    self_names = [name for name in per_layer if ".decoder." in name] + stages
    assert inputs[ENCODER] == ["input_ids", "attention_mask"] and outputs[ENCODER] == ["last_hidden_state"]
    assert inputs[DECODER] == ["input_ids", "encoder_attention_mask", "encoder_hidden_states"]
    assert outputs[DECODER] == ["logits"] + [f"present.{n}" for n in per_layer + stages]
    assert inputs[DECODER_WITH_PAST] == ["input_ids", "encoder_attention_mask"] + [
        f"past_key_values.{n}" for n in per_layer + stages
    ]
    assert outputs[DECODER_WITH_PAST] == ["logits"] + [f"present.{n}" for n in self_names]
    for tensor in sessions[ENCODER].get_inputs():
        assert all(isinstance(size, str) for size in tensor.shape), (tensor.name, tensor.shape)
    past = sessions[DECODER_WITH_PAST].get_inputs()
    heads, head_dim = 2, trained.config.d_model // 2
    for tensor in past[2:]:  # (batch, heads, length, head_dim)
        assert isinstance(tensor.shape[0], str) and isinstance(tensor.shape[2], str), (
            tensor.name,
            tensor.shape,
        )
        assert tensor.shape[1::2] == [heads, head_dim], (tensor.name, tensor.shape)
    for session in (
        sessions[DECODER],
        sessions[DECODER_WITH_PAST],
    ):  # the presents too (TorchScript left symbols)
        for tensor in session.get_outputs()[1:]:
            assert tensor.shape[1::2] == [heads, head_dim], (tensor.name, tensor.shape)
    lengths = {tensor.name: tensor.shape[2] for tensor in past[2:]}
    # the target's past and the source: distinct axes
    assert lengths["past_key_values.0.decoder.key"] != lengths["past_key_values.0.encoder.key"]
    # an Optimum-style loop: each present.X fed back as past_key_values.X, the rest by name
    present_names = {
        o.name.replace("present.", "past_key_values.", 1) for o in sessions[DECODER].get_outputs()[1:]
    }
    assert present_names == {i.name for i in past[2:]}


@pytest.mark.parametrize("exporter", sorted(EXPORTERS))
def test_the_graphs_are_fused_and_share_each_weight_once(exported, trained, exporter, tmp_path):
    """Every graph is rewritten by onnxruntime's transformer optimizer (each residual add with the
    LayerNorm after it, `SkipLayerNormalization`), without copying a weight (the RK2 blocks' stages read one F's);
    the tests above check these fused graphs against PyTorch (logits, cache, greedy and beam tokens)."""
    import onnx

    folder = exported(exporter)
    plain = tmp_path / "plain"
    if exporter == "torchscript":  # an unfused export to compare with (the dynamo one takes minutes)
        export_onnx(trained, plain, dynamo=False, fuse=False, search=False)
    for graph in GRAPHS:
        fused = onnx.load(str(folder / graph)).graph
        assert "SkipLayerNormalization" in {node.op_type for node in fused.node}, graph
        if exporter == "torchscript":
            before = onnx.load(str(plain / graph)).graph
            weight_bytes = [sum(len(t.raw_data) for t in g.initializer) for g in (fused, before)]
            assert weight_bytes[0] <= weight_bytes[1], (graph, weight_bytes)
            assert len(fused.node) < len(before.node)


@pytest.mark.parametrize(
    "settings",
    [
        {"num_beams": 1, "max_new_tokens": 10},
        {"num_beams": 3, "length_penalty": 0.6, "early_stopping": True, "max_new_tokens": 10},
        {"num_beams": 4, "length_penalty": 1.3, "early_stopping": False, "max_new_tokens": 6},
        # logits processors and options of `generate` that the graphs know nothing of: `generate` runs them
        {
            "num_beams": 4,
            "num_return_sequences": 2,
            "no_repeat_ngram_size": 2,
            "repetition_penalty": 1.3,
            "max_new_tokens": 10,
        },
    ],
    ids=["greedy", "beam3-lp0.6", "beam4-lp1.3-max6", "beam4-two-returned-processors"],
)
@pytest.mark.parametrize("exporter", sorted(EXPORTERS))
def test_onnxruntime_decoding_gives_the_tokens_of_generate(exported, trained, exporter, settings):
    folder = exported(exporter)
    ids, mask, labels = reverse_task(8, torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = trained.generate(ids, attention_mask=mask, **settings).numpy()
    generator = ONNXSeq2SeqGenerator(folder, trained.generation_config, session_options=session_options())
    np.testing.assert_array_equal(generator.generate(ids.numpy(), mask.numpy(), **settings), expected)
    # not degenerate: the trained model writes varied tokens, and sequences that end at different lengths
    assert len({tuple(row) for row in expected.tolist()}) == len(expected)
    assert len({int((row != PAD).sum()) for row in expected}) > 1


@pytest.mark.parametrize(
    "settings",
    [
        {"num_beams": 1, "max_new_tokens": 10},
        {"num_beams": 4, "max_new_tokens": 10},
        {"num_beams": 4, "num_return_sequences": 2, "length_penalty": 1.3, "max_new_tokens": 10},
    ],
    ids=["greedy", "beam4", "beam4-two-returned"],
)
@pytest.mark.parametrize("exporter", sorted(EXPORTERS))
def test_optimums_own_feeding_decodes_the_graphs_as_generate_does(exported, trained, exporter, settings):
    """The graphs driven by Optimum's `ORTModelForSeq2SeqLM` input feeding (tests/optimum_seq2seq.py,
    vendored: the cache fed by position, regrouped per layer as `self[i:i+2] + cross[i:i+2]`, and reordered for beam
    search as `layer_past[:2]`) give the tokens of `generate`, for an RK2 decoder whose stage-1 cache rides after
    every layer's pairs."""
    model = optimum_style_model(trained, exported(exporter))
    assert trained.get_decoder().cache_layout.stages == 2
    ids, mask, _ = reverse_task(8, torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = trained.generate(ids, attention_mask=mask, **settings)
        np.testing.assert_array_equal(model.generate(ids, attention_mask=mask, **settings), expected)


def optimum_style_model(model, folder: Path) -> OptimumStyleSeq2SeqLM:
    """The graphs in `folder`, driven by Optimum's input feeding (tests/optimum_seq2seq.py)."""
    sessions = {
        graph.removesuffix("_model.onnx"): ort.InferenceSession(
            str(folder / graph), session_options(), providers=["CPUExecutionProvider"]
        )
        for graph in GRAPHS
    }
    heads = model.config.decoder_attention_heads
    return OptimumStyleSeq2SeqLM(sessions, model.generation_config, heads, model.config.d_model // heads)


@pytest.fixture(scope="module")
def rk4_exported(tmp_path_factory) -> tuple[ODETransformerForConditionalGeneration, Path]:
    """An RK4 model trained as `trained` is, and its graphs (TorchScript's: the graphs are the same either way,
    and the cache's order is set by the wrappers both exporters trace)."""
    model = train_reverse("rk4")
    folder = tmp_path_factory.mktemp("onnx-rk4")
    export_onnx(model, folder, dynamo=False, search=False)
    return model, folder


@pytest.mark.parametrize(
    "settings",
    [{"num_beams": 1, "max_new_tokens": 10}, {"num_beams": 4, "max_new_tokens": 10}],
    ids=["greedy", "beam4"],
)
def test_optimums_own_feeding_decodes_an_rk4_decoders_graphs_as_generate_does(rk4_exported, settings):
    """As for the RK2 decoder above, with three later stages per layer, whose caches ride after every layer's
    pairs, layer by layer and stage by stage: Optimum's feeding takes them as further "layers" of two tensors and
    gives them back in the order it took them."""
    trained, folder = rk4_exported
    assert trained.get_decoder().cache_layout.stages == 4
    model = optimum_style_model(trained, folder)
    ids, mask, _ = reverse_task(8, torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = trained.generate(ids, attention_mask=mask, **settings)
    np.testing.assert_array_equal(model.generate(ids, attention_mask=mask, **settings), expected)
    assert len({tuple(row) for row in expected.tolist()}) > 1  # not one output for every source


@pytest.mark.parametrize("beams", [1, 3])
def test_onnxruntime_decoding_takes_max_length_as_generate_does(exported, trained, beams):
    """`ONNXSeq2SeqGenerator.generate(ids, mask, max_length=5)`, as `model.generate` takes it: 5 tokens,
    the decoder start included, and `generate`'s."""
    folder = exported("torchscript")
    ids, mask, _ = reverse_task(8, torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = trained.generate(ids, attention_mask=mask, max_length=5, num_beams=beams).numpy()
    generator = ONNXSeq2SeqGenerator(folder, trained.generation_config, session_options=session_options())
    got = generator.generate(ids.numpy(), mask.numpy(), max_length=5, num_beams=beams)
    assert got.shape[1] == expected.shape[1] == 5
    np.testing.assert_array_equal(got, expected)


def test_beam_search_neither_copies_nor_reorders_the_encoder_keys_and_values(exported, trained):
    """The cross-attention keys and values, the same for every beam of a sentence, are the first step's
    tensors at every later step: not copied per step, not reordered with the beams (and the tokens are
    `generate`'s)."""
    ids, mask, _ = reverse_task(3, torch.Generator().manual_seed(7))
    folder = exported("torchscript")
    generator = ONNXSeq2SeqGenerator(folder, trained.generation_config, session_options=session_options())
    steps = []

    def record(module, args, output):
        layer = getattr(output, CACHE_FIELD).cross_attention_cache.layers[-1]
        steps.append((layer.keys, layer.values, layer.keys.data_ptr(), layer.values.data_ptr()))

    generator.model.register_forward_hook(record)
    settings = {"num_beams": 3, "max_new_tokens": 8}
    with torch.no_grad():
        expected = trained.generate(ids, attention_mask=mask, **settings).numpy()
    np.testing.assert_array_equal(generator.generate(ids.numpy(), mask.numpy(), **settings), expected)
    # one forward per step: beam search may take a step past its output's length (a finished hypothesis shorter
    # than the running beams wins, as float rounding decides), never more steps than max_new_tokens
    assert 2 < expected.shape[1] - 1 <= len(steps) <= settings["max_new_tokens"]
    for step in steps[1:]:
        assert step[0] is steps[0][0] and step[1] is steps[0][1] and step[2:] == steps[0][2:]


# ----------------------------------------------------------------------------------------------------------
# The search in the graph (hub/onnx_search_graph.py: onnxruntime's BeamSearch op)
# ----------------------------------------------------------------------------------------------------------

SEARCH_CASES = {
    "greedy": {"num_beams": 1, "max_new_tokens": 10},
    "greedy-max_length5": {"num_beams": 1, "max_length": 5},
    # eos held back: the model writes its pad token inside sentences, which the op's padding must not cut
    "greedy-min8-ngram2": {
        "num_beams": 1,
        "max_new_tokens": 10,
        "min_new_tokens": 8,
        "no_repeat_ngram_size": 2,
    },
    "beam4-lp0.6": {"num_beams": 4, "length_penalty": 0.6, "early_stopping": True, "max_new_tokens": 10},
    "beam4-lp2-max12": {"num_beams": 4, "length_penalty": 2.0, "early_stopping": True, "max_new_tokens": 12},
    "greedy-eos5": {"num_beams": 1, "eos_token_id": 5, "max_new_tokens": 10},
    "beam4-two-returned-ngram-repetition": {
        "num_beams": 4,
        "early_stopping": True,
        "num_return_sequences": 2,
        "no_repeat_ngram_size": 2,
        "repetition_penalty": 1.3,
        "max_new_tokens": 10,
    },
    "beam3-min_length8": {"num_beams": 3, "early_stopping": True, "min_length": 8, "max_new_tokens": 12},
}


@pytest.mark.parametrize("case", sorted(SEARCH_CASES))
@pytest.mark.parametrize("exporter", sorted(EXPORTERS))
def test_the_search_graph_gives_the_tokens_of_generate(exported, trained, exporter, case):
    """One `session.run` of the BeamSearch graph per batch gives `generate`'s tokens (an RK2 decoder: its
    stage-1 cache through the op as slots of their own), with no help from transformers' search."""
    settings = SEARCH_CASES[case]
    ids, mask, _ = reverse_task(32, torch.Generator().manual_seed(11))
    with torch.no_grad():
        expected = trained.generate(ids, attention_mask=mask, **settings).numpy()
    generator = ONNXSearchGenerator(
        exported(exporter), trained.generation_config, session_options=session_options()
    )
    np.testing.assert_array_equal(generator.generate(ids.numpy(), mask.numpy(), **settings), expected)
    assert generator.redone <= len(ids) // 8  # the op's tokens, but for sentences cut at max_length
    assert len({tuple(row) for row in expected.tolist()}) > len(expected) // 2


@pytest.mark.parametrize("length_penalty", [1.3, -0.5])
def test_a_hypothesis_cut_at_max_length_is_ranked_as_generate_ranks_it(exported, trained, length_penalty):
    """The op counts the start token in the length of a hypothesis cut at max_length (transformers does not): those
    sentences (with a negative length penalty, every one) are decoded by transformers' search over the graphs, and
    the tokens are `generate`'s."""
    settings = {"num_beams": 4, "length_penalty": length_penalty, "early_stopping": True, "max_new_tokens": 6}
    ids, mask, _ = reverse_task(32, torch.Generator().manual_seed(11))
    with torch.no_grad():
        expected = trained.generate(ids, attention_mask=mask, **settings).numpy()
    generator = ONNXSearchGenerator(
        exported("torchscript"), trained.generation_config, session_options=session_options()
    )
    np.testing.assert_array_equal(generator.generate(ids.numpy(), mask.numpy(), **settings), expected)
    assert 0 < generator.redone <= len(ids)
    assert (generator.redone == len(ids)) == (length_penalty < 0)


def test_the_search_graph_refuses_by_name_what_it_cannot_follow(exported, trained):
    generator = ONNXSearchGenerator(
        exported("torchscript"), trained.generation_config, session_options=session_options()
    )
    ids = np.array([[5, 6, 7, EOS]])
    refused = {
        "early_stopping=False with beam search": {"num_beams": 4, "early_stopping": False},
        "repetition_penalty with greedy search": {"num_beams": 1, "repetition_penalty": 1.2},
        "do_sample": {"do_sample": True},
        "early_stopping='never'": {"num_beams": 2, "early_stopping": "never"},
        "bad_words_ids": {"bad_words_ids": [[5]]},
    }
    for name, settings in refused.items():
        with pytest.raises(ValueError, match=f"cannot follow {re.escape(name)} as generate"):
            generator.generate(ids, **settings)


def test_the_int8_search_graph_decodes_as_the_int8_graphs_do(tmp_path):
    """`--quantize int8` writes the search graph over the int8 graphs: its tokens are those of the int8 graphs under
    transformers' search (an RK4 decoder: three stage slots per layer through the op)."""
    torch.manual_seed(0)
    model = ODETransformerForConditionalGeneration(tiny(decoder_ode_method="rk4")).eval()
    export_onnx(model, tmp_path, dynamo=False, quantize="int8")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*QUANTIZED_GRAPHS, quantized_name(SEARCH_GRAPH)]
    )
    ids, mask, _ = check_inputs(model.config.vocab_size)
    exact = ONNXSeq2SeqGenerator(tmp_path, model.generation_config, session_options=session_options())
    search = ONNXSearchGenerator(tmp_path, model.generation_config, session_options=session_options())
    for settings in (
        {"num_beams": 1, "max_new_tokens": 8},
        {"num_beams": 4, "early_stopping": True, "max_new_tokens": 8},
    ):
        expected = exact.generate(ids.numpy(), mask.numpy(), **settings)
        np.testing.assert_array_equal(search.generate(ids.numpy(), mask.numpy(), **settings), expected)


# ----------------------------------------------------------------------------------------------------------
# Every block type and attention implementation (slow: a dozen exports per exporter)
# ----------------------------------------------------------------------------------------------------------

MATRIX = [
    (block, attention, exporter)
    for block in ["euler", "rk2", "rk4", "rk2_gated", "rk2_gated_authors", "pc_rk2"]
    for attention in ["sdpa", "eager"]
    for exporter in sorted(EXPORTERS)
    if (block, attention) != ("rk2_gated", "sdpa")  # the trained model's, in the default run
    # The dynamo exporter is much slower than the TorchScript one (torch.export traces the whole model): with it,
    # eager attention, the same code in every block type, is exported for the gated block only; of the blocks, rk4
    # (the ode_step loop over a tableau, as euler and rk2 run it) and the gated block (whose gate the authors'
    # reading shares, and PCformer's corrector reuses the same loop) stay, the others are the TorchScript rows'.
    # Its rows have one layer a side (half the tracing): the trained model's dynamo graphs above, two layers a
    # side, check that each layer reads and writes its own cache slots.
    and not (exporter == "dynamo" and attention == "eager" and block != "rk2_gated")
    and not (exporter == "dynamo" and block in ("euler", "rk2", "rk2_gated_authors", "pc_rk2"))
]


@pytest.mark.slow
@pytest.mark.parametrize(("block", "attention", "exporter"), MATRIX)
def test_every_block_type_and_attention_exports_and_matches(block, attention, exporter, tmp_path):
    torch.manual_seed(0)
    layers = {"encoder_layers": 1, "decoder_layers": 1} if exporter == "dynamo" else {}
    model = ODETransformerForConditionalGeneration(block_config(block, **layers)).eval()
    model.set_attn_implementation(attention)
    export_onnx(model, tmp_path, dynamo=EXPORTERS[exporter])
    assert_graphs_match(model, tmp_path)
    # the search graph, every block's cache slots through the op (no eos before the last token: random weights
    # rarely write one, and a hypothesis cut at max_length would be decoded again by transformers' search)
    ids, mask, _ = check_inputs(model.config.vocab_size)
    search = ONNXSearchGenerator(tmp_path, model.generation_config, session_options=session_options())
    for beams in (1, 4):
        settings = {"num_beams": beams, "early_stopping": True, "min_new_tokens": 6, "max_new_tokens": 6}
        with torch.no_grad():
            expected = model.generate(ids, attention_mask=mask, **settings).numpy()
        np.testing.assert_array_equal(search.generate(ids.numpy(), mask.numpy(), **settings), expected)
        assert search.redone == 0


# ----------------------------------------------------------------------------------------------------------
# ode-export --onnx
# ----------------------------------------------------------------------------------------------------------


def test_ode_export_onnx_writes_the_graphs_that_decode_like_generate(tmp_path):
    """The export folder's graphs decode with the folder's own generation config (beam 2, length penalty 0.6,
    8 new tokens at most) into `generate`'s tokens."""
    from ode_transformer.hub.export import main

    model, tokenizer = save_tiny_folder(tmp_path / "model", weight_scale=3)
    out = tmp_path / "export"
    assert main([str(tmp_path / "model"), str(out), "--onnx", "--onnx-exporter", "torchscript"]) == 0
    assert sorted(path.name for path in (out / "onnx").iterdir()) == sorted([*GRAPHS, SEARCH_GRAPH])
    assert json.loads((out / "generation_config.json").read_text())["num_beams"] == 2
    batch = tokenizer(["the dog runs", "a cat sleeps on the warm mat"], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = model.generate(**batch).numpy()
    generator = ONNXSeq2SeqGenerator(out, session_options=session_options())
    np.testing.assert_array_equal(generator.generate(batch["input_ids"], batch["attention_mask"]), expected)
    search = ONNXSearchGenerator(out, session_options=session_options())  # the search graph beside them
    np.testing.assert_array_equal(search.generate(batch["input_ids"], batch["attention_mask"]), expected)
    assert_the_search_graph_runs_as_hf_users_feed_it(out / "onnx" / SEARCH_GRAPH, tokenizer, model)
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "### ONNX" in card and "`onnx/` holds this model's ONNX graphs" in card
    assert all(f"`{name}`" in card for name in [*GRAPHS, SEARCH_GRAPH])


def assert_the_search_graph_runs_as_hf_users_feed_it(graph: Path, tokenizer, model) -> None:
    """onnxruntime alone on the search graph, fed as transformers and Optimum feed a model (a tokenizer's int64
    `input_ids` and `attention_mask`): its `sequences` are int64, padded with the pad id, and
    `tokenizer.batch_decode` reads them (-1 made it raise OverflowError) as `generate`'s texts."""
    session = ort.InferenceSession(str(graph), session_options(), providers=["CPUExecutionProvider"])
    types = {value.name: value.type for value in [*session.get_inputs(), *session.get_outputs()]}
    assert types["input_ids"] == types["attention_mask"] == types["sequences"] == "tensor(int64)"
    texts = ["the dog runs", "a cat sleeps on the warm mat in the park", "zwei"]
    batch = tokenizer(texts, return_tensors="np", padding=True)
    assert batch["input_ids"].dtype == np.int64
    settings = {"max_length": 9, "min_length": 0, "num_beams": 2, "num_return_sequences": 1}
    feed = {name: np.array([value], np.int32) for name, value in settings.items()}
    feed |= {"length_penalty": np.array([0.6], np.float32), "repetition_penalty": np.array([1.0], np.float32)}
    sequences, lengths = session.run(["sequences", "sequence_lengths"], {**batch, **feed})
    pad = model.config.pad_token_id
    for row, length in zip(sequences[:, 0], lengths[:, 0]):
        assert (row[length:] == pad).all() and (row[:length] >= 0).all()
    assert (sequences[:, 0] == pad).any(), "the test needs a padded sequence"
    with torch.no_grad():
        expected = model.generate(**tokenizer(texts, return_tensors="pt", padding=True))
    assert tokenizer.batch_decode(sequences[:, 0], skip_special_tokens=True) == tokenizer.batch_decode(
        expected, skip_special_tokens=True
    )


def test_the_default_exporter_is_torchscript_where_torch_still_has_it(tmp_path, monkeypatch, capsys):
    """`ode-export --onnx` without `--onnx-exporter` (auto), and `export_onnx` without `dynamo`, export with the
    TorchScript exporter where the installed torch has it (the graphs the tests above check for both exporters,
    exported faster), else with dynamo; an exporter named is the one used."""
    from ode_transformer.hub import export, onnx_export

    assert onnx_export.torchscript_exporter_available()  # in the torch tested with: auto is TorchScript
    used = []
    monkeypatch.setattr(onnx_export, "_export_graph", lambda spec, path, dynamo, opset: used.append(dynamo))
    monkeypatch.setattr(onnx_export, "_fix_cache_dims", lambda path, config: None)
    model, _ = save_tiny_folder(tmp_path / "model")
    for available, dynamo in ((True, None), (False, None), (True, True), (False, False)):
        monkeypatch.setattr(
            onnx_export, "torchscript_exporter_available", lambda available=available: available
        )
        export_onnx(model, tmp_path / "graphs", dynamo=dynamo, graphs=[ENCODER], fuse=False, search=False)
    assert used == [False, True, True, False]
    asked = []
    monkeypatch.setattr(
        export, "export_for_hub", lambda *args, onnx_dynamo, **kwargs: asked.append(onnx_dynamo)
    )
    for exporter in ([], ["--onnx-exporter", "dynamo"], ["--onnx-exporter", "torchscript"]):
        export.main(["M", "O", "--onnx", *exporter])
    assert asked == [None, True, False]
    capsys.readouterr()


def test_ode_export_quantize_int8_writes_int8_graphs_and_needs_onnx(tmp_path, refused):
    import onnx

    from ode_transformer.hub.export import main

    save_tiny_folder(tmp_path / "model", weight_scale=3)
    error = refused(main, [str(tmp_path / "model"), str(tmp_path / "plain"), "--quantize", "int8"])
    assert "--quantize quantises the ONNX graphs: add --onnx" in error
    assert not (tmp_path / "plain").exists()
    out = tmp_path / "export"
    assert (
        main(
            [
                str(tmp_path / "model"),
                str(out),
                "--onnx",
                "--onnx-exporter",
                "torchscript",
                "--quantize",
                "int8",
            ]
        )
        == 0
    )
    for graph in QUANTIZED_GRAPHS:
        assert "MatMulInteger" in {
            node.op_type for node in onnx.load(str(out / "onnx" / graph)).graph.node
        }, graph
    # Optimum's quantizer's names (model_quantized.onnx), and no float32 or temporary file left
    assert sorted(path.name for path in (out / "onnx").iterdir()) == sorted(
        [*QUANTIZED_GRAPHS, quantized_name(SEARCH_GRAPH)]
    )
    assert QUANTIZED_GRAPHS == (
        "encoder_model_quantized.onnx",
        "decoder_model_quantized.onnx",
        "decoder_with_past_model_quantized.onnx",
    )


def float_weight_products(graph) -> list[str]:
    """The MatMul / Gemm nodes of an ONNX graph whose second input is a weight: an initializer, or one read through
    `Identity` / `Transpose` nodes."""
    weights = {init.name for init in graph.initializer}
    producers = {output: node for node in graph.node for output in node.output}

    def is_weight(name: str) -> bool:
        node = producers.get(name)
        if node is not None and node.op_type in ("Identity", "Transpose"):
            return is_weight(node.input[0])
        return name in weights

    return [n.name for n in graph.node if n.op_type in ("MatMul", "Gemm") and is_weight(n.input[1])]


def assert_only_the_gates_products_stay_float(model, folder: Path) -> None:
    """Every product with a weight in the int8 graphs at `folder` is int8, but the ODE gates' (one per StageGate
    of the graph's side)."""
    import onnx

    for graph in QUANTIZED_GRAPHS:
        side = model.get_encoder() if graph.startswith("encoder") else model.get_decoder()
        gates = sum(isinstance(module, StageGate) for module in side.modules())
        float_products = float_weight_products(onnx.load(str(folder / graph)).graph)
        assert len(float_products) == gates, (graph, float_products)


def test_int8_graphs_quantise_every_stage_of_an_rk_block(tmp_path):
    """Every product with a weight is int8 in the int8 graphs, the later stages of RK4 blocks (whose weights
    TorchScript reads through an `Identity`) included; only the ODE gates' products stay float."""
    torch.manual_seed(0)
    model = ODETransformerForConditionalGeneration(tiny(decoder_ode_method="rk4")).eval()  # RK2-gated encoder
    assert any(isinstance(module, StageGate) for module in model.get_encoder().modules())
    export_onnx(model, tmp_path, dynamo=False, quantize="int8")
    assert_only_the_gates_products_stay_float(model, tmp_path)


def test_int8_quantisation_of_the_dynamo_graphs_keeps_only_the_gates_float(exported, trained, tmp_path):
    """The same for the dynamo exporter's graphs, quantised as `export_onnx(..., quantize="int8")` does after its
    float export and fusion (the trained model's gated RK2 blocks: a later stage and a gate on both sides)."""
    import shutil

    from ode_transformer.hub.onnx_export import quantize_graph_int8

    for graph in GRAPHS:
        quantize_graph_int8(Path(shutil.copy(exported("dynamo") / graph, tmp_path / graph)), trained)
    assert_only_the_gates_products_stay_float(trained, tmp_path)


def test_ode_export_onnx_without_onnx_names_the_extra_and_writes_nothing(tmp_path, monkeypatch, refused):
    import importlib.util

    from ode_transformer.hub import export

    find_spec = importlib.util.find_spec

    def without_onnxscript(name, *args):
        return None if name == "onnxscript" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_onnxscript)
    save_tiny_folder(tmp_path / "model")
    error = refused(export.main, [str(tmp_path / "model"), str(tmp_path / "out"), "--onnx"])
    assert "onnxscript" in error and "pip install '.[onnx]'" in error
    assert not (tmp_path / "out").exists()


def test_a_causal_lm_and_a_folder_without_graphs_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="causal LM"):
        export_onnx(ODETransformerForCausalLM(tiny(is_encoder_decoder=False)), tmp_path)
    with pytest.raises(FileNotFoundError, match="ode-export MODEL OUT --onnx"):
        ONNXSeq2SeqGenerator(tmp_path)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_export_is_of_eval_mode_graphs_and_says_nothing(tmp_path, capfd, dynamo):
    """The graph wrappers are exported in eval mode, and the export prints nothing: no torch.onnx warning of
    "exporting a model while it is in training mode", none of the exporter's progress and notes, and not the
    TorchScript exporter's note on advanced indexing (transformers' padding mask indexes by aranges)."""
    from ode_transformer.hub.onnx_export import ENCODER, export_onnx

    torch.manual_seed(0)
    model = ODETransformerForConditionalGeneration(tiny()).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_onnx(model, tmp_path, graphs=[ENCODER], dynamo=dynamo)
    noted = [str(w.message) for w in caught]
    assert [m for m in noted if "training mode" in m or "aten::index" in m] == []
    out, err = capfd.readouterr()
    assert "[torch.onnx]" not in out + err and "torchvision" not in err and "The axis name" not in err
    assert (tmp_path / ENCODER).is_file() and not model.training
