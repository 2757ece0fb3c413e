"""A catalogue of bad inputs: each must fail early with an error that names the problem and the fix.

Every row is (name, action, exception type, fragment of the message). The actions are small: tiny models,
a few lines of data, and training runs refused before training starts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from decoding import causal_lm
from huggingface_hub.errors import StrictDataclassClassValidationError
from tiny_run import TINY_RUN, corpus, seq2seq, write
from tiny_run import train_run as train

from modeling_ode import (
    ODETransformerConfig,
    ODETransformerForCausalLM,
    ODETransformerForConditionalGeneration,
)
from modeling_ode.compat import attention_implementation
from ode_transformer.train.arguments import parse_arguments
from ode_transformer.train.checks import check_settings
from ode_transformer.train.file_readers import load_jsonl, load_local_file, load_tsv

IDS = torch.tensor([[5, 6, 7, 2]])


def causal() -> ODETransformerForCausalLM:
    return causal_lm(ODETransformerConfig.from_preset("tiny", is_encoder_decoder=False))


def changed_config(**changes) -> ODETransformerConfig:
    config = ODETransformerConfig.from_preset("tiny")
    for name, value in changes.items():
        setattr(config, name, value)
    return config


def truncated_safetensors(folder: Path, keep: int | None) -> Path:
    seq2seq().save_pretrained(folder)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if keep is None else data[:keep])
    return folder


# --------------------------------------------------------------------------------------------
# Model inputs and configuration

MODEL_CASES = [
    ("input id >= vocab", lambda: seq2seq()(input_ids=torch.tensor([[5, 99, 2]]), decoder_input_ids=IDS),
     ValueError, "`input_ids` holds ids outside the vocabulary (0..98): [99]; encode the text with the model's own tokenizer"),
    ("negative input id", lambda: seq2seq()(input_ids=torch.tensor([[5, -1, 2]]), decoder_input_ids=IDS),
     ValueError, "`input_ids` holds ids outside the vocabulary (0..98): [-1]"),
    ("decoder input id >= vocab", lambda: seq2seq()(input_ids=IDS, decoder_input_ids=torch.tensor([[2, 150]])),
     ValueError, "`decoder_input_ids` holds ids outside the vocabulary (0..98): [150]"),
    ("label >= vocab", lambda: seq2seq()(input_ids=IDS, labels=torch.tensor([[5, 120, 2]])),
     ValueError, "`labels` holds ids outside the vocabulary (0..98 or -100): [120]"),
    ("negative label other than -100", lambda: seq2seq()(input_ids=IDS, labels=torch.tensor([[5, -5, -100]])),
     ValueError, "`labels` holds ids outside the vocabulary (0..98 or -100): [-5]"),
    ("causal LM input id >= vocab", lambda: causal()(input_ids=torch.tensor([[5, 99]])),
     ValueError, "`input_ids` holds ids outside the vocabulary (0..98): [99]"),
    ("one sequence as a 1-D tensor", lambda: seq2seq()(input_ids=IDS[0], decoder_input_ids=IDS),
     ValueError, "`input_ids` is a (4,) torch.int64 tensor: give (batch, length) integer token ids; for one sequence, ids[None]"),
    ("float token ids", lambda: causal()(input_ids=IDS.float()),
     ValueError, "`input_ids` is a (1, 4) torch.float32 tensor: give (batch, length) integer token ids"),
    ("1-D decoder ids", lambda: seq2seq()(input_ids=IDS, decoder_input_ids=IDS[0]),
     ValueError, "`decoder_input_ids` is a (4,) torch.int64 tensor"),
    ("2-D inputs_embeds", lambda: causal()(inputs_embeds=torch.zeros(4, 16)),
     ValueError, "`inputs_embeds` has shape (4, 16): give (batch, length, d_model) vectors"),
    ("1-D attention mask", lambda: seq2seq()(input_ids=IDS, attention_mask=torch.ones(4), decoder_input_ids=IDS),
     ValueError, "`attention_mask` has shape (4,), the input needs (1, 4): a row per sequence and a column per token"),
    ("attention mask one column short", lambda: causal()(input_ids=IDS, attention_mask=torch.ones(1, 3)),
     ValueError, "`attention_mask` has shape (1, 3), the input needs (1, 4)"),
    ("attention mask of another batch size", lambda: causal()(input_ids=IDS.expand(2, -1), attention_mask=torch.ones(3, 4)),
     ValueError, "`attention_mask` has shape (3, 4), the input needs (2, 4)"),
    ("decoder attention mask one column long",
     lambda: seq2seq()(input_ids=IDS, decoder_input_ids=IDS, decoder_attention_mask=torch.ones(1, 5)),
     ValueError, "`decoder_attention_mask` has shape (1, 5), the input needs (1, 4)"),
    ("source mask of another length in the decoder",
     lambda: seq2seq().model.decoder(input_ids=IDS, encoder_hidden_states=torch.zeros(1, 6, 16),
                                     encoder_attention_mask=torch.ones(1, 5)),
     ValueError, "`attention_mask` has shape (1, 5), the input needs (1, 6)"),
    ("zero-length source", lambda: seq2seq()(input_ids=torch.zeros(1, 0, dtype=torch.long), decoder_input_ids=IDS),
     ValueError, "the input is empty (sequence length 0); give every sequence at least one token"),
    ("zero-length causal input", lambda: causal()(input_ids=torch.zeros(2, 0, dtype=torch.long)),
     ValueError, "the input is empty (sequence length 0)"),
    ("labels and inputs of different batch sizes", lambda: seq2seq()(input_ids=IDS, labels=torch.tensor([[5, 6], [7, 8]])),
     ValueError, "`labels` (2, 2) and `input_ids` (1, 4) differ in batch size; give one label row per input row"),
    ("causal labels of another shape", lambda: causal()(input_ids=IDS, labels=IDS[:, :3]),
     ValueError, "`labels` (1, 3) and `input_ids` (1, 4) differ in shape"),
    ("dropout given as a string", lambda: ODETransformerConfig.from_preset("tiny", dropout="0.1"),
     ValueError, "`dropout` must be a number in [0, 1), got '0.1'; e.g. `dropout=0.1`"),
    ("misspelt preset override", lambda: ODETransformerConfig.from_preset("tiny", encoder_layer=4),
     ValueError, "`encoder_layer` is not a configuration field; did you mean `encoder_layers`?"),
    ("negative position offset", lambda: ODETransformerConfig.from_preset("tiny", position_offset=-3),
     ValueError, "`position_offset` must be an integer >= 0, got -3"),
    ("fractional relative distance", lambda: ODETransformerConfig.from_preset("tiny", max_relative_position=2.5),
     ValueError, "`max_relative_position` must be an integer >= 0, got 2.5"),
    ("step size given as a string", lambda: ODETransformerConfig.from_preset("tiny", ode_step_size="1"),
     ValueError, "`ode_step_size` must be a number > 0, got '1'"),
    ("negative layer norm epsilon", lambda: ODETransformerConfig.from_preset("tiny", layer_norm_eps=-1.0),
     ValueError, "`layer_norm_eps` must be a number > 0, got -1.0"),
    ("pad_token_id >= vocab_size", lambda: ODETransformerConfig.from_preset("tiny", pad_token_id=99),
     ValueError, "`pad_token_id`=99 is not a token of the vocabulary (ids 0..98)"),
    ("non-numeric tableau entry", lambda: ODETransformerConfig(encoder_ode_method={"a": [[], ["1/2"]], "b": [0.5, 0.5]}),
     ValueError, "`encoder_ode_method['a'][1][0]`='1/2' is not a number"),
    ("gated coefficients set on an Euler decoder after construction",
     lambda: ODETransformerForConditionalGeneration(changed_config(decoder_ode_coefficients="gated")),
     StrictDataclassClassValidationError, "`decoder_ode_method`='euler' has a single stage; use a multi-stage method"),
    ("3 heads set after construction", lambda: ODETransformerForConditionalGeneration(changed_config(encoder_attention_heads=3)),
     StrictDataclassClassValidationError, "`encoder_attention_heads`=3 does not divide `d_model`=16"),
    ("labels without a pad token id",
     lambda: ODETransformerForConditionalGeneration(changed_config(pad_token_id=None))(input_ids=IDS, labels=IDS),
     ValueError, "`labels` without `decoder_input_ids` need `config.pad_token_id`"),
    ("labels without a decoder start token id",
     lambda: ODETransformerForConditionalGeneration(changed_config(decoder_start_token_id=None))(input_ids=IDS, labels=IDS),
     ValueError, "`labels` without `decoder_input_ids` need `config.decoder_start_token_id`"),
    ("flash_attention_2", lambda: seq2seq().set_attn_implementation("flash_attention_2"),
     ValueError, "the ODE Transformer adds Shaw et al. relative-position logits to every self-attention score as an additive mask"),
    ("flex_attention", lambda: seq2seq().set_attn_implementation("flex_attention"),
     ValueError, "attn_implementation='flex_attention' is not supported"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("action", "error", "fragment"), [c[1:] for c in MODEL_CASES], ids=[c[0] for c in MODEL_CASES]
)
def test_model_bad_input(action, error, fragment):
    with pytest.raises(error) as raised:
        action()
    assert fragment in str(raised.value)


def test_config_changed_after_building_is_refused_before_saving(tmp_path):
    model = seq2seq()
    model.config.decoder_ode_coefficients = "gated"
    with pytest.raises(StrictDataclassClassValidationError, match="has a single stage"):
        model.save_pretrained(tmp_path / "out")
    assert not list((tmp_path / "out").glob("*")), "nothing may be written"


@pytest.mark.parametrize(
    ("keep", "fragment"),
    [(None, "its header announces"), (0, "it holds 0 bytes")],
    ids=["truncated", "empty"],
)
def test_truncated_or_empty_safetensors_named(tmp_path, keep, fragment):
    folder = truncated_safetensors(tmp_path, keep)
    with pytest.raises(OSError) as raised:
        ODETransformerForConditionalGeneration.from_pretrained(folder)
    assert f"{folder / 'model.safetensors'} is truncated or not a safetensors file" in str(raised.value)
    assert fragment in str(raised.value)


def test_output_attentions_under_sdpa_falls_back_to_eager():
    model = seq2seq()
    assert attention_implementation(model.config) == "sdpa"
    out = model(input_ids=IDS, decoder_input_ids=IDS, output_attentions=True)
    model.set_attn_implementation("eager")
    eager = model(input_ids=IDS, decoder_input_ids=IDS, output_attentions=True)
    for name in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
        got, expected = getattr(out, name), getattr(eager, name)
        assert len(got) == 2 and all(w is not None for w in got), name
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e)
            torch.testing.assert_close(g.sum(-1), torch.ones_like(g.sum(-1)))  # rows are distributions


# --------------------------------------------------------------------------------------------
# Data files


def test_empty_and_malformed_files(tmp_path):
    cases = [
        (lambda: load_tsv(write(tmp_path / "empty.tsv", ""), "source", "target"), "empty.tsv has no rows below its header"),
        (lambda: load_tsv(write(tmp_path / "header.tsv", "source\ttarget\n"), "source", "target"), "header.tsv has no rows below its header"),
        (lambda: load_jsonl(write(tmp_path / "empty.jsonl", "\n"), "source", "target"), "empty.jsonl has no lines"),
        (lambda: load_jsonl(write(tmp_path / "bad.jsonl", '{"source": "a", "target": "b"}\n{"source": "c", "target": \n'),
                            "source", "target"),
         "bad.jsonl, line 2: not a JSON object (Expecting value at column 27); fix or remove that line"),
        (lambda: load_jsonl(write(tmp_path / "number.jsonl", '{"source": "a", "target": "b"}\n{"source": 5, "target": "c"}\n'),
                            "source", "target", skip_empty=False),
         "number.jsonl, line 2: the source is a int ('5'), not text"),
        (lambda: load_jsonl(write(tmp_path / "list.jsonl", '{"source": "a", "target": ["b", "c"]}\n'), "source", "target"),
         "list.jsonl, line 1: the target is a list ("),
    ]  # fmt: skip
    for action, fragment in cases:
        with pytest.raises(ValueError) as raised:
            action()
        assert fragment in str(raised.value)
    # a language model read a JSON-lines file as text, and learned its braces and keys
    lines = write(tmp_path / "lm.jsonl", '{"text": "a dog runs"}\n')
    with pytest.raises(ValueError, match="lm.jsonl: a language model trains on a plain text file"):
        load_local_file(str(lines), "lm")


# --------------------------------------------------------------------------------------------
# Training runs: refused before training starts


@pytest.mark.parametrize("content", ["", "\n \n\t\n"], ids=["no-lines", "blank-lines"])
@pytest.mark.parametrize("split", ["train", "validation", "test"])
def test_empty_split_is_refused_before_training(tmp_path, split, content):
    # evaluation splits keep blank lines (aligned with hypotheses), so an all-blank one has rows but no example
    src, tgt = corpus(tmp_path / "data")
    empty = ",".join(str(write(tmp_path / f"empty.{side}", content)) for side in ("src", "tgt"))
    files = {"train": f"{src},{tgt}", "validation": f"{src},{tgt}", "test": f"{src},{tgt}", split: empty}
    predict = (
        ["--do_predict", "true"] if split == "test" else []
    )  # TINY_RUN does not test: an unused split is not read
    with pytest.raises(ValueError) as raised:
        train(
            tmp_path / "out",
            *(arg for name, spec in files.items() for arg in (f"--{name}_file", spec)),
            *predict,
        )
    assert f"the {split} split ({empty}) has no examples" in str(raised.value)
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_output_dir_of_another_run_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint-100").mkdir()
    with pytest.raises(
        FileExistsError,  # checkpoint-100 is incomplete: nothing to resume, so resuming is not offered
        match=r"already holds a run \(checkpoint-100, ...\); pass --overwrite_output_dir to delete it first",
    ):
        train(out, "--train_file", data := ",".join(corpus(tmp_path / "data")))
    with pytest.raises(
        ValueError, match="--overwrite_output_dir would delete what --resume_from_checkpoint continues from"
    ):
        train(out, "--train_file", data, "--overwrite_output_dir", "true", "--resume_from_checkpoint", "last")
    with pytest.raises(ValueError, match=f"--resume_from_checkpoint last: no complete checkpoint in {out}"):
        train(
            out, "--train_file", data, "--resume_from_checkpoint", "last"
        )  # checkpoint-100 is empty: skipped


def test_overwrite_output_dir_clears_the_old_run(tmp_path):
    out = tmp_path / "out"
    (out / "checkpoint-100").mkdir(parents=True)
    train(out, "--train_file", ",".join(corpus(tmp_path / "data")), "--overwrite_output_dir", "true")
    assert not (out / "checkpoint-100").exists() and (out / "model.safetensors").is_file()


def test_overwrite_output_dir_never_deletes_the_runs_inputs(tmp_path, monkeypatch):
    """The data, model or tokenizer of the run inside --output_dir, or the folder the command runs in: refused
    before anything is deleted (transformers' example scripts use the flag only to allow writing)."""
    out = tmp_path / "out"
    src, tgt = corpus(out / "data")
    before = sorted(p.name for p in (out / "data").iterdir())
    with pytest.raises(ValueError, match=f"would delete {src}, an input of this run, inside --output_dir"):
        train(out, "--train_file", f"{src},{tgt}", "--overwrite_output_dir", "true")
    assert sorted(p.name for p in (out / "data").iterdir()) == before
    monkeypatch.chdir(out / "data")
    with pytest.raises(ValueError, match="would delete the current folder's contents"):
        train(out, "--train_file", ",".join(corpus(tmp_path / "elsewhere")), "--overwrite_output_dir", "true")
    assert sorted(p.name for p in (out / "data").iterdir()) == before


RUN_ARGUMENT_CASES = [
    ("zero token budget", ["--max_tokens", "0"], "--max_tokens must be a positive token budget per batch, got 0"),
    ("early stopping without a metric", ["--early_stopping_patience", "2"],
     "--early_stopping_patience needs --metric_for_best_model"),
    ("early stopping without evaluations", ["--early_stopping_patience", "2", "--metric_for_best_model", "loss"],
     "--early_stopping_patience needs --metric_for_best_model"),
    ("zero source length", ["--max_source_length", "0"], "--max_source_length must be a positive number of tokens, got 0"),
    ("averaging without checkpoints", ["--average_last_checkpoints", "5"],
     "--average_last_checkpoints 5 averages saved checkpoints, but --save_strategy no saves none"),
    ("zero beams", ["--num_beams", "0"], "--num_beams must be a positive number of beams, got 0"),
    ("negative sample limit", ["--max_train_samples", "-1"],
     "--max_train_samples must be a positive number of examples, got -1; leave it out for all"),
    ("a generation metric without generating", ["--metric_for_best_model", "bleu", "--eval_strategy", "steps"],
     "--metric_for_best_model bleu: a translation model's evaluation gives loss; choose one (or bleu, chrf with "
     "--predict_with_generate true)"),
    ("perplexity of a translation model", ["--metric_for_best_model", "perplexity", "--predict_with_generate", "true"],
     "--metric_for_best_model perplexity: a translation model's evaluation gives loss, bleu, chrf; choose one"),
    ("a misspelt metric", ["--metric_for_best_model", "eval_bleuu", "--predict_with_generate", "true"],
     "--metric_for_best_model bleuu: a translation model's evaluation gives loss, bleu, chrf; choose one"),
    ("bleu of a language model", ["--task", "lm", "--metric_for_best_model", "bleu", "--predict_with_generate", "true"],
     "--metric_for_best_model bleu: a language model's evaluation gives loss, perplexity; choose one"),
    ("averaging more checkpoints than are kept",
     ["--average_last_checkpoints", "5", "--save_strategy", "steps", "--save_steps", "1", "--save_total_limit", "2"],
     "--save_total_limit 2 keeps fewer; raise --save_total_limit to at least 5"),
]  # fmt: skip


@pytest.mark.both_cpus
@pytest.mark.parametrize(
    ("flags", "fragment"), [c[1:] for c in RUN_ARGUMENT_CASES], ids=[c[0] for c in RUN_ARGUMENT_CASES]
)
def test_run_arguments_that_would_fail_after_training_are_refused_first(tmp_path, flags, fragment):
    """Each would otherwise train first, then fail (averaging: with the trained model unsaved) or train silently
    with another setting (--max_tokens 0: eight-sentence batches)."""
    with pytest.raises(ValueError, match=re.escape(fragment)):
        check_settings(
            parse_arguments([*TINY_RUN, "--output_dir", str(tmp_path / "out"), "--train_file", "a,b", *flags])
        )


@pytest.mark.both_cpus
def test_the_early_config_check_uses_the_run_vocabulary(tmp_path):
    """The config is checked before the data with the tokenizer's vocabulary size, not the preset's: a source
    vocabulary equal to --vocab_size is valid (shared embeddings)."""
    overrides = '{"source_vocab_size": 300}'
    args = parse_arguments([*TINY_RUN, "--output_dir", str(tmp_path / "out"), "--train_file", "a,b",
                            "--config_overrides", overrides])  # fmt: skip
    check_settings(args)
    assert args[0].overrides()["source_vocab_size"] == 300


def test_resume_with_another_model_config_names_the_fields(tmp_path):
    out, data = tmp_path / "out", ",".join(corpus(tmp_path / "data"))
    train(out, "--train_file", data, "--save_strategy", "steps", "--save_steps", "2")
    assert json.loads((out / "checkpoint-2" / "config.json").read_text())["encoder_ode_method"] == "rk2"
    with pytest.raises(ValueError) as raised:
        train(out, "--train_file", data, "--resume_from_checkpoint", "last", "--encoder_ode_method", "midpoint",
              "--max_steps", "4")  # fmt: skip
    assert (
        "was trained with another model configuration (encoder_ode_coefficients: 'gated' in the checkpoint, "
        "'tableau' now, encoder_ode_method: 'rk2' in the checkpoint, 'midpoint' now)" in str(raised.value)
    )


def test_missing_test_split_is_refused_before_training(tmp_path):
    with pytest.raises(
        ValueError, match="--do_predict needs a test split: give --dataset, --hub_dataset or --test_file"
    ):
        train(tmp_path / "out", "--train_file", ",".join(corpus(tmp_path / "data")), "--do_predict", "true")
    assert not (tmp_path / "out").exists()


def test_a_named_tokenizer_must_fit_the_task(tmp_path):
    """--tokenizer_name is checked against the task before training: a language model's tokenizer (no </s>
    after a sequence) for a translation model, which would never learn to stop, one without <s>/</s>, and a
    tokenizer.json path for its folder are each refused by name."""
    from transformers import AutoTokenizer

    from ode_transformer.tokenizer import check_task_tokenizer, train_tokenizer

    texts = [f"the dog number {i} runs" for i in range(12)]
    train_tokenizer(texts, vocab_size=300, save_to=tmp_path / "lm_tokenizer", causal=True)
    data = ",".join(corpus(tmp_path / "data"))
    with pytest.raises(
        ValueError, match=r"lm_tokenizer does not add </s> to a sequence \(a language model's"
    ):
        train(tmp_path / "out", "--train_file", data, "--tokenizer_name", str(tmp_path / "lm_tokenizer"))
    with pytest.raises(
        ValueError, match=r"tokenizer.json is a file: give the folder that holds tokenizer.json"
    ):
        train(
            tmp_path / "out",
            "--train_file",
            data,
            "--tokenizer_name",
            str(tmp_path / "lm_tokenizer" / "tokenizer.json"),
        )
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "lm_tokenizer")
    tokenizer.bos_token = None
    tokenizer.save_pretrained(tmp_path / "no_bos")
    with pytest.raises(ValueError, match=r"no_bos has no bos_token: the model needs it"):
        train(
            tmp_path / "out",
            "--train_file",
            data.split(",")[0],
            "--tokenizer_name",
            str(tmp_path / "no_bos"),
            "--task",
            "lm",
        )
    # a seq2seq tokenizer needs no <s> (T5's has none: the decoder starts from </s>)
    seq2seq_tokenizer = train_tokenizer(texts, vocab_size=300)
    seq2seq_tokenizer.bos_token = None
    check_task_tokenizer(seq2seq_tokenizer, causal=False, where="memory")
    # the same tokenizer is right for a language model: it trains, and is saved with the model
    train(tmp_path / "lm", "--train_file", data.split(",")[0], "--task", "lm",
          "--tokenizer_name", str(tmp_path / "lm_tokenizer"))  # fmt: skip
    assert (tmp_path / "lm" / "tokenizer.json").is_file()


@pytest.mark.both_cpus
@pytest.mark.parametrize(
    ("line", "takes"),
    [("max_steps: ten", "int"), ('learning_rate: "fast"', "float"), ("eval_strategy: sometimes", "one of")],
)
def test_a_recipe_string_the_flag_does_not_take_names_the_recipe_and_its_key(tmp_path, line, takes):
    """A recipe's wrong-typed value (`max_steps: "ten"`, a word for a float or a choice) is refused in one
    line naming the recipe, the key and what it takes, not argparse's message about a flag the user never
    typed."""
    recipe = write(tmp_path / "recipe.yaml", f"{line}\n")
    key = line.split(":")[0]
    with pytest.raises(ValueError) as raised:
        parse_arguments([str(recipe), "--output_dir", str(tmp_path / "out"), "--train_file", "a,b"])
    message = str(raised.value)
    assert message.startswith(f"recipe {recipe}: {key}: ") and f"(it takes {takes}" in message
