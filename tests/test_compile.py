"""`torch.compile(model, fullgraph=True)`: one graph, no graph break, for the training forward and backward of every
block type and for one cached decoding step with the static cache; compiled results equal eager ones.

Graphs are captured with the `aot_eager` backend (Dynamo + AOT autograd, the same graph capture as inductor without
its code generation) so that the tests stay fast; one test runs inductor itself. The graph-capture tests run on
tests/conftest.py's `device` (the GPU suite runs them on CUDA); the inductor and `ode_transformer.train.run --torch_compile` tests
stay on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from modeling_ode import ODETransformerForCausalLM, ODETransformerForConditionalGeneration
from modeling_ode.compat import graph_breaks
from tests.decoding import BLOCKS, tiny


def config(block: str, causal: bool = False, **overrides):
    """The block in the encoder and the decoder (the causal LM: its decoder)."""
    fields = {
        f"{side}_{key}": value for side in ("encoder", "decoder") for key, value in BLOCKS[block].items()
    }
    if block.startswith("pc_"):
        fields["ode_coefficient_scope"] = "stack"
    return tiny(**fields, **({"is_encoder_decoder": False} if causal else {}), **overrides)


def batch(vocab_size: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab_size, (2, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    inputs = {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": torch.randint(4, vocab_size, (2, 7), generator=generator),
    }
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def training_loss(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**inputs).loss


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_training_forward_has_no_graph_break(block, device):
    torch.manual_seed(0)
    model = ODETransformerForConditionalGeneration(config(block, dropout=0.1)).train().to(device)
    graphs, breaks, reasons = graph_breaks(training_loss, model, batch(model.config.vocab_size, device))
    assert (graphs, breaks) == (1, 0), reasons


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_fullgraph_training_step_equals_eager(block, device):
    """Forward and backward compiled as one graph (no dropout, so both runs compute the same function)."""
    torch.compiler.reset()
    torch.manual_seed(0)
    model = ODETransformerForConditionalGeneration(config(block)).train().to(device)
    inputs = batch(model.config.vocab_size, device)
    eager = training_loss(model, inputs)
    eager.backward()
    eager_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    compiled = torch.compile(training_loss, fullgraph=True, backend="aot_eager")(model, inputs)
    compiled.backward()
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, rtol=1e-4, atol=1e-6)


def test_causal_lm_training_forward_has_no_graph_break(device):
    torch.manual_seed(0)
    model = ODETransformerForCausalLM(config("rk4", causal=True, dropout=0.1)).train().to(device)
    inputs = batch(model.config.vocab_size, device)
    inputs["labels"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    graphs, breaks, reasons = graph_breaks(training_loss, model, inputs)
    assert (graphs, breaks) == (1, 0), reasons


@pytest.mark.parametrize("block", ["rk2_gated", "rk4"])
def test_one_cached_decoding_step_with_the_static_cache_is_one_graph(block, device):
    """Prefill eagerly into a static cache with a slot per (layer, stage), then one decoding step compiled with
    `fullgraph=True`: the logits of the eager step from the same cache state."""
    torch.compiler.reset()
    torch.manual_seed(0)
    model = ODETransformerForCausalLM(config(block, causal=True)).eval().to(device)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(4, model.config.vocab_size, (2, 5), generator=generator).to(device)
    step_ids = torch.tensor([[7], [9]], device=device)

    def prefilled():
        cache = model.get_decoder().cache_layout.build(encoder_decoder=False, max_cache_len=12)
        model(ids, past_key_values=cache, use_cache=True)
        return cache

    def step(token, mask, cache):
        return model(token, attention_mask=mask, past_key_values=cache, use_cache=True).logits

    mask = torch.ones(2, 6, dtype=torch.long, device=device)
    with torch.no_grad():
        eager = step(step_ids, mask, prefilled())
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(step_ids, mask, prefilled())
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_inductor_compiles_a_training_step_and_matches_eager():
    """One layer a side: inductor's compile time grows with the layers, and one holds every kind of node (a gated
    RK2 block in the encoder, and in the decoder beside cross-attention)."""
    torch.compiler.reset()
    torch.manual_seed(0)
    model = ODETransformerForConditionalGeneration(
        config("rk2_gated", encoder_layers=1, decoder_layers=1)
    ).train()
    inputs = batch(model.config.vocab_size)
    eager = training_loss(model, inputs)
    compiled = torch.compile(training_loss, fullgraph=True)(model, inputs)
    compiled.backward()
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.slow
@pytest.mark.usefixtures("shared_data")
def test_train_run_with_torch_compile_trains_like_eager(tmp_path):
    """`ode_transformer.train.run --torch_compile true` (inductor): two updates of a dropout-free one-layer tiny LM
    give the eager run's losses (the first from the same initial weights to 1e-5; then to 1e-3, as inductor fuses
    differently)."""
    from ode_transformer.train.arguments import parse_arguments
    from ode_transformer.train.run import run

    def losses(name: str, *flags: str) -> list[float]:
        out = tmp_path / name
        run(
            parse_arguments(
                [
                    "--preset", "tiny", "--decoder_layers", "1", "--task", "lm", "--dataset", "ptb", "--vocab_size", "300",
                    "--max_train_samples", "200", "--max_tokens", "512", "--max_target_length", "32",
                    "--max_steps", "2", "--logging_steps", "1", "--learning_rate", "0.004", "--seed", "3",
                    "--dropout", "0", "--attention_dropout", "0", "--activation_dropout", "0", "--use_cpu", "true", "--save_strategy", "no", "--report_to", "none",
                    "--disable_tqdm", "true", "--do_predict", "false", "--output_dir", str(out), *flags,
                ]
            )
        )  # fmt: skip
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        return [entry["loss"] for entry in history if "loss" in entry]

    eager = losses("eager")
    compiled = losses("compiled", "--torch_compile", "true")
    assert len(compiled) == len(eager) == 2
    assert compiled[0] == pytest.approx(eager[0], rel=1e-5)
    assert compiled[1] == pytest.approx(eager[1], rel=1e-3)
