"""A pretrained residual seq2seq model converted to ODE blocks (`from_residual`): M2M100 (NLLB-200's
architecture) and residual ODE Transformers give their source's logits and beam-search tokens; RK blocks start as the
residual block (exactly with learnable coefficients, within a bound linear in eps with a gate); classes whose function
this model cannot express are refused by name."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import (
    BartConfig,
    GPT2Config,
    M2M100Config,
    M2M100ForConditionalGeneration,
    MarianConfig,
    MBartConfig,
    ProphetNetConfig,
    T5Config,
)

from modeling_ode import ODETransformerForConditionalGeneration
from modeling_ode import ode as ode_module
from ode_transformer.hub.upcycle import main as upcycle_main
from ode_transformer.tokenizer import train_tokenizer
from tests.tiny_folder import TEXTS, save_tiny_folder

TINY_M2M100 = dict(
    d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=2,
    encoder_ffn_dim=64, decoder_ffn_dim=48, max_position_embeddings=64, encoder_layerdrop=0.0,
    decoder_layerdrop=0.0,
)  # fmt: skip


def save_m2m100(folder, vocab_size: int = 99, **fields) -> M2M100ForConditionalGeneration:
    """A tiny random M2M100 whose weights are spread enough (std 0.2) to give logits of a few units, saved to
    `folder`; returns it in eval mode."""
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(M2M100Config(vocab_size=vocab_size, **{**TINY_M2M100, **fields}))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name:
                parameter.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    return model.eval()


def batch(pad: int, left: bool) -> dict[str, torch.Tensor]:
    """Three sources, one padded by 3 tokens (on the left or the right), and teacher-forced decoder inputs."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(10, 99, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    cut = slice(0, 3) if left else slice(6, 9)
    ids[1, cut], mask[1, cut] = pad, 0
    decoder_ids = torch.randint(10, 99, (3, 7), generator=g)
    decoder_ids[:, 0] = 2
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder_ids}


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def beams(model, inputs) -> list[list[int]]:
    return model.generate(
        inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=2, max_new_tokens=8
    ).tolist()


@pytest.mark.parametrize(
    "fields",
    [
        {},  # NLLB-200's layout: pad 1 (positions from 2), tied embeddings, relu
        {
            "pad_token_id": 5,
            "tie_word_embeddings": False,
            "activation_function": "gelu",
            "scale_embedding": False,
        },
    ],
    ids=["nllb-layout", "pad5-untied-gelu"],
)
@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_m2m100_converts_to_euler_blocks_with_its_logits_and_beams(tmp_path, fields, left):
    source = save_m2m100(tmp_path, **fields)
    converted = ODETransformerForConditionalGeneration.from_residual(str(tmp_path))
    assert converted.config.position_offset == source.config.pad_token_id + 1
    assert converted.config.tie_word_embeddings == source.config.tie_word_embeddings
    inputs = batch(source.config.pad_token_id, left)
    expected = logits(source, inputs)
    assert expected.abs().max() > 1.0  # a model whose logits say something
    torch.testing.assert_close(logits(converted, inputs), expected, rtol=0, atol=1e-5)
    assert beams(converted, inputs) == beams(source, inputs)


@pytest.mark.parametrize("method", ["rk2", "rk4"])
def test_rk_blocks_start_exactly_as_the_residual_blocks(tmp_path, method):
    """Learnable coefficients from Euler's weights (the default start): y + 1 F1 + 0 F2 + ... is y + F1 bit for bit,
    so the RK model's logits are the Euler conversion's exactly, and the source's to 1e-5; its beams are the
    source's."""
    source = save_m2m100(tmp_path)
    euler = ODETransformerForConditionalGeneration.from_residual(tmp_path)
    upcycled = ODETransformerForConditionalGeneration.from_residual(
        tmp_path, encoder_ode_method=method, decoder_ode_method=method
    )
    stages = ode_module.ODE_METHODS[method].num_stages
    for side in (upcycled.model.encoder, upcycled.model.decoder):
        assert side.ode_coefficients[0].weight.tolist() == [1.0] + [0.0] * (stages - 1)
    inputs = batch(1, left=False)
    assert torch.equal(logits(upcycled, inputs), logits(euler, inputs))
    torch.testing.assert_close(logits(upcycled, inputs), logits(source, inputs), rtol=0, atol=1e-5)
    assert beams(upcycled, inputs) == beams(source, inputs)
    # and the later stages are live: the gradient reaches their coefficients
    upcycled.train()
    upcycled(**inputs, labels=inputs["decoder_input_ids"]).loss.backward()
    assert upcycled.model.encoder.ode_coefficients[0].weight.grad[1:].abs().min() > 0


def test_a_gated_start_is_within_a_bound_linear_in_eps(tmp_path, monkeypatch):
    """A gate cannot output exactly (1, 0): it starts at (1 - eps, eps) (W = 0), and the logits differ from the
    source's by about eps times their scale (float64, so the gate's share is not hidden by rounding), ten times less
    for ten times smaller eps."""
    source = save_m2m100(tmp_path).double()
    inputs = batch(1, left=False)
    expected = logits(source, inputs)
    differences = []
    for eps in (1e-3, 1e-4):
        monkeypatch.setattr(ode_module, "EULER_GATE_EPSILON", eps)
        gated = ODETransformerForConditionalGeneration.from_residual(
            tmp_path, encoder_ode_method="rk2", decoder_ode_method="rk2",
            encoder_ode_coefficients="gated", decoder_ode_coefficients="gated",
        ).double()  # fmt: skip
        gate = torch.sigmoid(gated.model.encoder.ode_coefficients[0].gate.bias)
        assert gate.item() == pytest.approx(1 - eps, rel=1e-6)
        differences.append((logits(gated, inputs) - expected).abs().max().item())
    assert 0 < differences[0] <= 10 * 1e-3 * expected.abs().max()
    assert 5 < differences[0] / differences[1] < 20


def test_a_residual_ode_transformer_upcycles_exactly_and_keeps_its_connections(tmp_path):
    """The multi30k residual recipe's kind of model (DLCL connections, relative positions): its
    weights as they are, RK blocks from (1, 0, ...): the same logits bit for bit."""
    source, _ = save_tiny_folder(tmp_path, weight_scale=3.0, encoder_ode_method="euler",
                                 encoder_ode_coefficients="tableau")  # fmt: skip
    upcycled = ODETransformerForConditionalGeneration.from_residual(
        tmp_path, encoder_ode_method="rk2", decoder_ode_method="rk4"
    )
    config = upcycled.config
    assert (config.encoder_layer_connections, config.max_relative_position) == ("learnable_dense", 4)
    assert config.ode_coefficients_init == "euler" and config.encoder_ode_coefficients == "learnable"
    inputs = batch(1, left=False)
    assert torch.equal(logits(upcycled, inputs), logits(source, inputs))
    assert beams(upcycled, inputs) == beams(source, inputs)


def test_only_residual_blocks_are_upcycled_and_the_architecture_is_the_sources(tmp_path):
    save_tiny_folder(tmp_path)  # the tiny preset: RK2-gated encoder, Euler decoder
    with pytest.raises(
        ValueError, match="the source's encoder blocks are 'rk2' with 'gated' coefficients, not"
    ):
        ODETransformerForConditionalGeneration.from_residual(tmp_path, encoder_ode_method="rk4")
    kept = ODETransformerForConditionalGeneration.from_residual(
        tmp_path, encoder_ode_method="rk2", encoder_ode_coefficients="gated", decoder_ode_method="rk2"
    )
    assert kept.config.decoder_ode_coefficients == "learnable"
    with pytest.raises(ValueError, match="`d_model`=32 differs from the source's 16: the architecture is"):
        ODETransformerForConditionalGeneration.from_residual(
            tmp_path, encoder_ode_method="rk2", encoder_ode_coefficients="gated", d_model=32
        )
    same = ODETransformerForConditionalGeneration.from_residual(
        tmp_path, encoder_ode_method="rk2", encoder_ode_coefficients="gated", d_model=16, dropout=0.3
    )
    assert same.config.dropout == 0.3


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (MarianConfig(), r"MarianMTModel \(marian\) cannot be converted exactly: MarianMT is post-norm"),
        (
            MBartConfig(),
            r"\(mbart\) cannot be converted exactly: .*learned position embeddings.*layernorm_embedding",
        ),
        (BartConfig(), r"\(bart\) cannot be converted exactly: BART is post-norm"),
        (T5Config(), r"\(t5\) cannot be converted exactly: T5 has relative position buckets, RMSNorm"),
        (
            ProphetNetConfig(),
            r"\(prophetnet\) has no converter; from_residual converts M2M100ForConditionalGeneration",
        ),
        (GPT2Config(), r"\(gpt2\) is not an encoder-decoder \(sequence-to-sequence\) model"),
        (M2M100Config(activation_function="gelu_pytorch_tanh"), r"activation_function='gelu_pytorch_tanh'"),
    ],
    ids=["marian", "mbart", "bart", "t5", "prophetnet", "gpt2", "m2m100-activation"],
)
def test_what_cannot_be_converted_exactly_is_refused_by_name(tmp_path, config, message):
    if isinstance(config, MarianConfig):
        config.architectures = ["MarianMTModel"]
    config.save_pretrained(tmp_path)  # the class is refused before any weight is read: a config is enough
    if isinstance(config, M2M100Config):
        M2M100ForConditionalGeneration(M2M100Config(**{**config.to_dict(), **TINY_M2M100})).save_pretrained(
            tmp_path
        )
    with pytest.raises(ValueError, match=message):
        ODETransformerForConditionalGeneration.from_residual(tmp_path)


def test_upcycle_command_saves_the_sources_tokenizer_beside_the_converted_model(tmp_path, refused):
    """`python -m ode_transformer.hub.upcycle`: the folder holds the model and the source's tokenizer, and loads back (outside the
    conversion) to the logits of the model the conversion made."""
    tokenizer = train_tokenizer(TEXTS, vocab_size=320, save_to=tmp_path / "source")
    save_m2m100(tmp_path / "source", vocab_size=len(tokenizer))
    out = tmp_path / "rk2"
    upcycle_main([str(tmp_path / "source"), str(out), "--encoder_ode_method", "rk2", "--set", "dropout=0.2"])
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()
    loaded = ODETransformerForConditionalGeneration.from_pretrained(out)
    assert loaded.config.dropout == 0.2 and loaded.config.encoder_ode_method == "rk2"
    from transformers import AutoTokenizer

    text = "the dog runs"
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == tokenizer(text).input_ids
    converted = ODETransformerForConditionalGeneration.from_residual(
        tmp_path / "source", encoder_ode_method="rk2"
    )
    inputs = batch(1, left=False)
    assert torch.equal(logits(loaded, inputs), logits(converted, inputs))
    # a second run into the same folder is refused in one line
    assert "already holds files" in refused(upcycle_main, [str(tmp_path / "source"), str(out)])


def test_upcycle_takes_the_folders_one_lock_and_a_kill_leaves_the_old_folder(
    tmp_path, capsys, monkeypatch, refused
):
    """The upcycled folder is written as `ode-export` writes one: a writer holding the folder by another name (a
    link to it) makes a second one refuse in one line, naming its pid; a save cut off midway leaves the old folder
    as it was, and no staging folder."""
    from ode_transformer.files import lock_output

    tokenizer = train_tokenizer(TEXTS, vocab_size=320, save_to=tmp_path / "source")
    save_m2m100(tmp_path / "source", vocab_size=len(tokenizer))
    out, link = tmp_path / "out", tmp_path / "outlink"
    upcycle_main([str(tmp_path / "source"), str(out)])
    link.symlink_to("out")
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    capsys.readouterr()
    with lock_output(out, "OUT_DIR"):
        error = refused(upcycle_main, [str(tmp_path / "source"), str(link), "--overwrite"])
    assert error.splitlines()[-1].endswith(
        f"error: {link} is in use by another process (pid {os.getpid()}); wait for it to finish or stop it, or "
        "choose another OUT_DIR."
    )

    def cut_off(self, folder, *args, **kwargs):  # the weights written, then a kill before the tokenizer
        saved(self, folder, *args, **kwargs)
        raise KeyboardInterrupt

    saved = ODETransformerForConditionalGeneration.save_pretrained
    monkeypatch.setattr(ODETransformerForConditionalGeneration, "save_pretrained", cut_off)
    with pytest.raises(KeyboardInterrupt):
        upcycle_main([str(tmp_path / "source"), str(link), "--overwrite", "--encoder_ode_method", "rk2"])
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out", "outlink", "source"]
