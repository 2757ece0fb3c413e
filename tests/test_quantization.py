"""int8 inference (modeling_ode.quantization, `ode-translate --quantize int8`): a model trained in the test on a toy
task (reverse the source) decodes the same tokens in int8 as in float32, within a stated bound; the int8 weights are
the float weights rounded per output row; the ODE gates stay float32; the loader and the command take the option."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as nnf
from decoding import NO_DROPOUT
from tiny_folder import save_tiny_folder
from torch import nn

from modeling_ode import ODETransformerConfig, ODETransformerForConditionalGeneration
from modeling_ode.ode import StageGate
from modeling_ode.quantization import DynamicInt8Linear, is_quantized, quantize_int8
from ode_transformer import translate

PAD, EOS, FIRST_WORD, VOCAB = 1, 2, 4, 24
# int8 decoding may differ from float32 where two candidates are nearly tied; on this task and model at most this
# share of the 64 test sequences may differ.
MAX_DIFFERING = 0.1


def reverse_batch(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sources of 3-7 random words (right-padded) and their reversals followed by EOS as labels (-100 padding)."""
    lengths = torch.randint(3, 8, (batch,), generator=generator)
    words = torch.randint(FIRST_WORD, VOCAB, (batch, 7), generator=generator)
    ids = torch.full((batch, 7), PAD)
    labels = torch.full((batch, 8), -100)
    for row, length in enumerate(lengths.tolist()):
        ids[row, :length] = words[row, :length]
        labels[row, :length] = words[row, :length].flip(0)
        labels[row, length] = EOS
    return ids, (ids != PAD).long(), labels


@pytest.fixture(scope="module")
def trained() -> ODETransformerForConditionalGeneration:
    """A 2-2 layer RK2-gated model (the preset's gated coefficients; d 32) trained for 250 Adam steps to reverse its
    source; the test asserts that it then reverses most test sources exactly in float32."""
    torch.manual_seed(0)
    config = ODETransformerConfig.from_preset(
        "tiny", d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, pad_token_id=PAD,
        eos_token_id=EOS, bos_token_id=0, decoder_start_token_id=EOS, encoder_ode_method="rk2", **NO_DROPOUT,
    )  # fmt: skip
    model = ODETransformerForConditionalGeneration(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    # tiny matrices: more threads only wait on each other, the more so on a busy machine
    torch.set_num_threads(1)
    try:
        for _ in range(250):
            ids, mask, labels = reverse_batch(32, generator)
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


@pytest.mark.parametrize("beams", [1, 4])
def test_int8_decodes_the_float_tokens_of_a_trained_model(trained, beams):
    ids, mask, labels = reverse_batch(64, torch.Generator().manual_seed(1))
    targets = labels.masked_fill(labels == -100, PAD)
    settings = {"num_beams": beams, "max_new_tokens": 9, "pad_token_id": PAD}
    int8_model = quantize_int8(copy.deepcopy(trained))
    with torch.no_grad():
        expected = trained.generate(ids, attention_mask=mask, **settings)
        got = int8_model.generate(ids, attention_mask=mask, **settings)
    # the float model learnt the task: its choices are not near-ties that any rounding would flip
    written = nnf.pad(expected, (0, 1 + targets.shape[1] - expected.shape[1]), value=PAD)[:, 1:]
    correct = (written == targets).all(dim=1).float().mean().item()
    assert correct > 0.6, f"the float model reverses only {correct:.0%} of the sources"
    assert got.shape == expected.shape
    differing = (got != expected).any(dim=1).float().mean().item()
    assert differing <= MAX_DIFFERING, f"{differing:.0%} of the int8 sequences differ from float32"


def test_int8_weights_are_the_float_weights_rounded_per_row(trained):
    float_linears = {
        name: m
        for name, m in trained.named_modules()
        if isinstance(m, nn.Linear) and not isinstance(m, StageGate)
    }
    quantized = quantize_int8(copy.deepcopy(trained))
    int8_linears = {name: m for name, m in quantized.named_modules() if isinstance(m, DynamicInt8Linear)}
    assert set(int8_linears) == set(float_linears) and "lm_head" in int8_linears
    for name, layer in int8_linears.items():
        weight = float_linears[name].weight.detach()
        # symmetric int8: each row's largest weight is 127 steps
        step = weight.abs().amax(dim=1, keepdim=True) / 127
        assert (layer.dequantized_weight() - weight).abs().le(step / 2 + 1e-7).all(), name
        # its output is the float layer's up to the rounding of weights and of the 7-bit input
        x = torch.randn(3, 5, layer.in_features)
        reference = float_linears[name](x)
        assert torch.allclose(layer(x), reference, atol=0.05 * reference.abs().max().item()), name


def test_gates_stay_float():
    config = ODETransformerConfig.from_preset(
        "tiny", encoder_ode_method="rk2", encoder_ode_coefficients="gated"
    )
    model = quantize_int8(ODETransformerForConditionalGeneration(config))
    gates = [m for m in model.modules() if isinstance(m, StageGate)]
    assert len(gates) == config.encoder_layers and all(g.weight.dtype == torch.float32 for g in gates)
    assert not any(type(m) is nn.Linear for m in model.modules())


def test_loader_and_command_take_int8(tmp_path, capsys):
    model, tokenizer = save_tiny_folder(tmp_path, weight_scale=3)
    loaded, _ = translate.load_for_generation(str(tmp_path), quantize="int8")
    assert is_quantized(loaded) and not is_quantized(translate.load_for_generation(str(tmp_path))[0])
    sources = ["the dog runs", "a cat sleeps on the warm mat"]
    (tmp_path / "in.txt").write_text("".join(s + "\n" for s in sources))
    translate.main(
        [str(tmp_path), "--input", str(tmp_path / "in.txt"), "--quantize", "int8", "--no_progress"]
    )
    quantize_int8(model)
    with torch.no_grad():
        expected = [
            tokenizer.decode(
                model.generate(**tokenizer([s], return_tensors="pt"))[0], skip_special_tokens=True
            )
            for s in sources
        ]
    assert capsys.readouterr().out.split("\n") == [*(e.strip() for e in expected), ""]


def test_unknown_quantisation_and_gpu_are_refused(tmp_path, refused):
    save_tiny_folder(tmp_path)
    with pytest.raises(ValueError, match=r"quantize 'int4': .*\['int8'\]"):
        translate.load_for_generation(str(tmp_path), quantize="int4")
    assert "CPU only" in translate.quantize_problem("int8", "cuda")
    assert "invalid choice: 'int4'" in refused(translate.main, [str(tmp_path), "--quantize", "int4"])


def test_compiled_decoding_gives_the_eager_tokens_in_float32_and_int8(trained):
    """`compile_decoding` (static cache, each greedy step compiled by transformers' generate, on a CPU): the
    compiled graph sums in another order than eager kernels, so the same near-tie bound as int8 vs float32 holds,
    in float32 and in int8 (whose products the compiler sees as one opaque operator)."""
    ids, mask, _ = reverse_batch(64, torch.Generator().manual_seed(2))
    settings = {"num_beams": 1, "max_new_tokens": 9, "pad_token_id": PAD}
    for model in (copy.deepcopy(trained), quantize_int8(copy.deepcopy(trained))):
        compiled = translate.compile_decoding(copy.deepcopy(model))
        assert compiled.generation_config.cache_implementation == "static"
        with torch.no_grad():
            expected = model.generate(ids, attention_mask=mask, **settings)
            got = compiled.generate(ids, attention_mask=mask, **settings)
        assert getattr(compiled, "_compiled_call", None) is not None  # the steps ran compiled, not eager
        assert got.shape == expected.shape
        differing = (got != expected).any(dim=1).float().mean().item()
        assert differing <= MAX_DIFFERING, f"{differing:.0%} of the compiled sequences differ from eager"


def test_ode_translate_compile_refuses_beam_search(tmp_path, capsys):
    save_tiny_folder(tmp_path, weight_scale=3)  # its generation config: beam 2
    (tmp_path / "in.txt").write_text("the dog runs\n")
    with pytest.raises(
        ValueError, match=r"--compile speeds up greedy decoding only, and .* decodes with 2 beams"
    ):
        translate.main([str(tmp_path), "--input", str(tmp_path / "in.txt"), "--compile", "--no_progress"])
    translate.main(
        [str(tmp_path), "--input", str(tmp_path / "in.txt"), "--compile", "--num_beams", "1", "--no_progress"]
    )
    model, tokenizer = save_tiny_folder(tmp_path / "again", weight_scale=3)
    with torch.no_grad():
        expected = model.generate(**tokenizer(["the dog runs"], return_tensors="pt"), num_beams=1)
    assert capsys.readouterr().out == tokenizer.decode(expected[0], skip_special_tokens=True).strip() + "\n"


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_int8_onnx_graphs_decode_the_float_tokens_and_keep_the_gates_float(trained, exporter, tmp_path):
    """`export_onnx(..., quantize="int8")` (`ode-export --onnx --quantize int8`): onnxruntime's int8 products in the
    graphs, the gates' products float (found by their weights), and the same bound on differing sequences as int8
    in PyTorch, decoded by the project's onnxruntime generator."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from ode_transformer.hub.onnx_export import (
        DECODER,
        DECODER_WITH_PAST,
        ENCODER,
        export_onnx,
        quantized_name,
    )
    from ode_transformer.onnx_generation import ONNXSeq2SeqGenerator
    from ode_transformer.onnx_search_decoding import SEARCH_GRAPH, ONNXSearchGenerator

    # dynamo (much slower than TorchScript) exports the encoder only, where this model's gates are: the gates are
    # found by their weights, whatever the exporter named the nodes; the decoding is checked on the TorchScript graphs
    graphs = (ENCODER,) if exporter == "dynamo" else (ENCODER, DECODER, DECODER_WITH_PAST)
    export_onnx(trained, tmp_path, dynamo=exporter == "dynamo", quantize="int8", graphs=graphs)
    search = [quantized_name(SEARCH_GRAPH)] if len(graphs) == 3 else []  # written beside all three
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*map(quantized_name, graphs), *search])
    encoder = onnx.load(str(tmp_path / quantized_name(ENCODER))).graph
    assert "MatMulInteger" in {n.op_type for n in encoder.node}
    weights = {init.name: onnx.numpy_helper.to_array(init) for init in encoder.initializer}
    gates = [m.weight.detach().numpy().T for m in trained.modules() if isinstance(m, StageGate)]
    assert len(gates) == trained.config.encoder_layers
    for gate in gates:  # a float initializer holding the gate's weights, read by a float product
        names = {n for n, w in weights.items() if w.shape == gate.shape and np.array_equal(w, gate)}
        assert any(node.op_type in ("MatMul", "Gemm") and names & set(node.input) for node in encoder.node)
    if exporter == "dynamo":
        return
    with_past = onnx.load(str(tmp_path / quantized_name(DECODER_WITH_PAST))).graph
    assert "MatMulInteger" in {n.op_type for n in with_past.node}
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    generators = {
        "graphs": ONNXSeq2SeqGenerator(tmp_path, trained.generation_config, session_options=options),
        "search graph": ONNXSearchGenerator(tmp_path, trained.generation_config, session_options=options),
    }
    ids, mask, _ = reverse_batch(64, torch.Generator().manual_seed(1))
    for beams in (1, 4):
        settings = {"num_beams": beams, "max_new_tokens": 9, "early_stopping": True if beams > 1 else None}
        with torch.no_grad():
            float_ids = trained.generate(ids, attention_mask=mask, pad_token_id=PAD, **settings)
        for name, generator in generators.items():
            got = torch.from_numpy(generator.generate(ids.numpy(), mask.numpy(), **settings))
            width = max(
                got.shape[1], float_ids.shape[1]
            )  # a differing sequence may end later than the others
            got, expected = (nnf.pad(x, (0, width - x.shape[1]), value=PAD) for x in (got, float_ids))
            differing = (got != expected).any(dim=1).float().mean().item()
            assert differing <= MAX_DIFFERING, (
                f"{differing:.0%} of the int8 sequences of the {name} differ from float32 ({beams} beams)"
            )
