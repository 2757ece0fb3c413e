"""End-to-end tests of ``ode_transformer.train.run`` on small slices of the shared corpora (CPU, tiny models)."""

from __future__ import annotations

import gzip
import json
import logging
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
import yaml
from datasets import Dataset
from package_free import run_package_free
from safetensors.torch import load_file
from tiny_folder import save_tiny_folder
from transformers import AutoTokenizer, Seq2SeqTrainer, Seq2SeqTrainingArguments, pipeline

from modeling_ode import (
    ODETransformerConfig,
    ODETransformerForCausalLM,
    ODETransformerForConditionalGeneration,
    fit_tokenizer_to_model,
)
from ode_transformer import translate
from ode_transformer.model_card_writer import write_model_card
from ode_transformer.precision import choose_precision
from ode_transformer.train.arguments import build_parser, parse_arguments
from ode_transformer.train.card import dataset_card, training_card
from ode_transformer.train.checks import check_settings
from ode_transformer.train.data import multi30k, ptb
from ode_transformer.train.run import main, run
from ode_transformer.train.trainer import PadCollator, lm_negative_log_likelihood

RECIPES = Path(__file__).resolve().parents[1] / "train" / "recipes"
needs_data = pytest.mark.usefixtures("shared_data")

TINY = [
    "--preset", "tiny", "--vocab_size", "400", "--learning_rate", "0.004",
    "--lr_scheduler_type", "inverse_sqrt", "--warmup_steps", "4", "--logging_steps", "3",
    "--use_cpu", "true", "--disable_tqdm", "true", "--report_to", "tensorboard",
    "--save_strategy", "no", "--seed", "3",
]  # fmt: skip
SEQ2SEQ = [
    "--max_tokens", "768", "--max_source_length", "48", "--max_target_length", "48",
    "--predict_with_generate", "true", "--num_beams", "2", "--per_device_eval_batch_size", "16",
    "--eval_strategy", "steps", "--eval_steps", "18", "--max_steps", "18",
    "--max_eval_samples", "8", "--max_test_samples", "16",
]  # fmt: skip


def train_and_test(output_dir: Path, *flags: str) -> dict:
    return run(parse_arguments([*TINY, "--output_dir", str(output_dir), *flags]))


def logged_losses(output_dir: Path) -> list[float]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return [entry["loss"] for entry in history if "loss" in entry]


def check_outputs(output_dir: Path, document: dict, n_hyps: int | None) -> dict[str, float]:
    """Loss fell, all files are there, every metric is finite; returns metric name -> value."""
    losses = logged_losses(output_dir)
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    for name in (
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "hub_metrics.json",
        "loss_curves.png",
        "README.md",
    ):
        assert (output_dir / name).is_file(), name
    assert list((output_dir / "runs").rglob("events.out.tfevents*")), "no TensorBoard log"
    assert json.loads((output_dir / "hub_metrics.json").read_text()) == document
    if n_hyps is not None:
        hyps = (output_dir / "test_hypotheses.txt").read_text(encoding="utf-8").split("\n")[:-1]
        assert len(hyps) == n_hyps  # a few steps of a tiny model: hypotheses may still be empty
    values = {r.get("name", r["metric"]): r["value"] for r in document["results"]}
    assert values and all(math.isfinite(v) for v in values.values()), values
    return values


MULTI30K = ["--task", "translation", "--dataset", "multi30k", "--source_lang", "en", "--target_lang", "de"]


@pytest.fixture(scope="module")
def multi30k_run(tmp_path_factory, shared_data) -> tuple[Path, dict]:
    """A tiny model trained (in the precision ``--precision auto`` picks here) and tested on Multi30k: its folder
    and metrics document."""
    output_dir = tmp_path_factory.mktemp("multi30k")
    return output_dir, train_and_test(output_dir, *MULTI30K, "--max_train_samples", "400", *SEQ2SEQ)


@pytest.fixture(scope="module")
def multi30k_test_files(tmp_path_factory, shared_data) -> tuple[Path, Path]:
    """The 16 test pairs of ``multi30k_run`` as source and reference text files."""
    test = multi30k("test")
    folder = tmp_path_factory.mktemp("multi30k_test")
    src, ref = folder / "test.en", folder / "test.de"
    src.write_text("".join(line + "\n" for line in test["source"][:16]), encoding="utf-8")
    ref.write_text("".join(line + "\n" for line in test["target"][:16]), encoding="utf-8")
    return src, ref


def test_translation_multi30k(multi30k_run):
    output_dir, document = multi30k_run
    values = check_outputs(output_dir, document, n_hyps=16)
    assert 0 <= values["BLEU"] <= 100 and 0 <= values["chrF"] <= 100
    assert document["results"][0]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert document["decoding"] == {"num_beams": 2, "length_penalty": 0.6, "precision": "fp32"}
    chosen = choose_precision("cpu")  # the training precision, and why, as --precision auto chose it
    recipe = document["training"]["recipe"]
    assert (recipe["precision"], recipe["precision_reason"]) == (chosen.precision, chosen.reason)
    assert (
        document["training"]["recipe"]["model"]
        == "2-2 layers, d_model 16, FFN 32/32, 2/2 heads (preset tiny)"
    )
    assert document["example"] == multi30k("test")["source"][0]
    generation = json.loads((output_dir / "generation_config.json").read_text())
    # BART's convention: max_length (the start token + --max_target_length 48), never max_new_tokens, which would
    # override a user's max_length and Seq2SeqTrainer's generation_max_length
    assert (generation["num_beams"], generation["length_penalty"], generation["max_length"]) == (2, 0.6, 49)
    assert "max_new_tokens" not in generation
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert any("eval_bleu" in entry for entry in state["log_history"])
    assert json.loads((output_dir / "test_results.json").read_text()) == {
        r["name"]: r["value"] for r in document["results"]
    }


PLAIN_GENERATE = """
import sys
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
sources = open(sys.argv[2], encoding="utf-8").read().splitlines()
outputs = model.generate(**tokenizer(sources, return_tensors="pt", padding=True))  # the saved generation config
print("\\n".join(text.strip() for text in tokenizer.batch_decode(outputs, skip_special_tokens=True)))
"""


def test_trained_folder_generates_without_the_package(multi30k_run, multi30k_test_files, tmp_path):
    """A copy of the run's folder loads with remote code where ``modeling_ode`` cannot be imported, and plain
    ``generate()`` with its saved generation config gives the run's test hypotheses."""
    output_dir, _ = multi30k_run
    src, _ = multi30k_test_files
    copy = tmp_path / "model"
    shutil.copytree(output_dir, copy, ignore=shutil.ignore_patterns("runs", "tokenizer", "*.png"))
    result = run_package_free(PLAIN_GENERATE, tmp_path, str(copy), str(src))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        result.stdout.splitlines()
        == (output_dir / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    )


@pytest.fixture
def untrained_model(multi30k_run, tmp_path) -> Path:
    """A random tiny model (weights x3: confident, varied outputs) with the run's tokenizer and beam 4."""
    tokenizer = AutoTokenizer.from_pretrained(multi30k_run[0])
    ids = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("pad", "bos", "eos")}
    config = ODETransformerConfig.from_preset(
        "tiny", vocab_size=len(tokenizer), decoder_start_token_id=tokenizer.eos_token_id, **ids
    )
    torch.manual_seed(0)
    model = ODETransformerForConditionalGeneration(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(3)
    model.generation_config.update(num_beams=4, length_penalty=0.6, early_stopping=True, max_new_tokens=24)
    model.save_pretrained(tmp_path / "untrained")
    # The borrowed tokenizer carries the trained run's limit (its --max_source_length); this folder's model has its own.
    fit_tokenizer_to_model(tokenizer, config).save_pretrained(tmp_path / "untrained")
    return tmp_path / "untrained"


def test_test_decoding_translate_and_plain_generate_agree(untrained_model, tmp_path):
    """One decoder: ``ode_transformer.train.run``'s test decoding (after the trainer has wrapped the model in bf16 autocast
    for --do_eval), ``ode_transformer.translate`` (other batches) and plain ``generate()`` (one batch, fresh
    interpreter) give the same hypotheses."""
    sources = multi30k("test")["source"][:48]
    src = tmp_path / "test.en"
    src.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    pairs = f"{src},{src}"
    run(parse_arguments([
        "--model_name_or_path", str(untrained_model), "--do_train", "false", "--do_eval", "true", "--bf16", "true",
        "--validation_file", pairs, "--test_file", pairs, "--per_device_eval_batch_size", "16",
        "--output_dir", str(tmp_path / "eval"), "--use_cpu", "true", "--report_to", "none",
        "--max_target_length", "24",
    ]))  # fmt: skip
    expected = (tmp_path / "eval" / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    assert len(expected) == 48 and len(set(expected)) > 5

    translate.main([str(untrained_model), "--input", str(src), "--output", str(tmp_path / "hyp.txt"),
                    "--batch_size", "5", "--no_progress"])  # fmt: skip
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines() == expected

    result = run_package_free(PLAIN_GENERATE, tmp_path, str(untrained_model), str(src))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == expected


def test_evaluate_a_saved_model_without_training(multi30k_run, multi30k_test_files, tmp_path):
    """``--do_train false`` + a test file: no training split, no --predict_with_generate, no model copy; the
    lengths are the saved model's (its source limit and max_new_tokens 48), so the hypotheses are the run's."""
    output_dir, trained = multi30k_run
    src, ref = multi30k_test_files
    document = run(parse_arguments([
        "--model_name_or_path", str(output_dir), "--do_train", "false", "--test_file", f"{src},{ref}",
        "--output_dir", str(tmp_path), "--use_cpu", "true", "--report_to", "none",
    ]))  # fmt: skip
    assert document["results"] == trained["results"]
    assert document["decoding"] == trained["decoding"]  # the saved generation config's beam 2
    assert "training" not in document and document["dataset"]["id"] == "local"  # never a local path
    card_folder = tmp_path.parent / f"{tmp_path.name}-card"
    shutil.copytree(output_dir, card_folder)
    card = write_model_card(card_folder, document).read_text(encoding="utf-8")
    assert "local data" in card and str(src.parent) not in card and str(tmp_path) not in card
    hyps = (tmp_path / "test_hypotheses.txt").read_text(encoding="utf-8")
    assert hyps == (output_dir / "test_hypotheses.txt").read_text(encoding="utf-8")
    # the training run scored the first 16 rows of Multi30k's test split (--max_test_samples 16); this one, all of
    # its test file
    assert (trained["dataset"]["split"], trained["dataset"]["rows"]) == ("test[:16]", 16)
    assert (document["dataset"]["split"], document["dataset"]["rows"]) == ("test", hyps.count("\n"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "all_results.json",
        "hub_metrics.json",
        "test_hypotheses.txt",
        "test_results.json",
    ]


@pytest.mark.both_cpus
def test_missing_splits_and_models_are_named(multi30k_test_files, tmp_path):
    src, ref = multi30k_test_files
    common = ["--use_cpu", "true", "--output_dir", str(tmp_path), "--report_to", "none"]
    with pytest.raises(
        ValueError,
        match=r"--do_train needs a train split: give --dataset, --hub_dataset or --train_file, or --do_train false",
    ):
        run(parse_arguments(["--test_file", f"{src},{ref}", *common]))
    with pytest.raises(ValueError, match="--do_train false evaluates a trained model: give its folder"):
        check_settings(parse_arguments(["--do_train", "false", "--test_file", f"{src},{ref}", *common]))


@needs_data
def test_summarization_cnndm(tmp_path):
    document = train_and_test(
        tmp_path, "--task", "summarization", "--dataset", "cnndm", "--max_train_samples", "64",
        *SEQ2SEQ, "--max_source_length", "96", "--max_target_length", "32", "--max_test_samples", "8",
    )  # fmt: skip
    values = check_outputs(tmp_path, document, n_hyps=8)
    assert set(values) == {"ROUGE1", "ROUGE2", "ROUGEL", "ROUGELSUM"}
    assert all(0 <= v <= 100 for v in values.values())
    assert document["decoding"] == {"num_beams": 2, "length_penalty": 2.0, "precision": "fp32"}


@needs_data
def test_gec_wi_locness_m2_on_conll2013(tmp_path):
    document = train_and_test(
        tmp_path, "--task", "gec", "--dataset", "wi_locness", "--max_train_samples", "300",
        "--word_dropout", "0.1", *SEQ2SEQ,
    )  # fmt: skip
    values = check_outputs(tmp_path, document, n_hyps=16)
    assert set(values) == {"M2 precision", "M2 recall", "M2 F0.5"}
    assert all(0 <= v <= 1 for v in values.values())
    assert document["dataset"]["id"] == "conll2013"


@pytest.mark.both_cpus
@needs_data
def test_lm_ptb_perplexity(tmp_path):
    document = train_and_test(
        tmp_path, "--task", "lm", "--dataset", "ptb", "--max_train_samples", "300", "--max_tokens", "768",
        "--max_target_length", "48", "--max_steps", "18", "--max_test_samples", "24",
    )  # fmt: skip
    values = check_outputs(tmp_path, document, n_hyps=None)
    assert 1 < values["Subword perplexity"] < 400 * 1.5  # below a uniform guess over the vocabulary
    assert values["Word perplexity"] > values["Subword perplexity"]
    assert "label_smoothing" not in json.loads((tmp_path / "config.json").read_text())  # the Trainer's now

    # The saved folder continues prompts: <s> prompt (no </s>), with pipeline, generate and ode_transformer.translate.
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    prompts = ["the company said", "it is", "in new york"]
    for prompt in prompts:
        ids = tokenizer(prompt)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id and tokenizer.eos_token_id not in ids
    generator = pipeline("text-generation", model=str(tmp_path), tokenizer=tokenizer)
    greedy = {"max_new_tokens": 6, "num_beams": 1, "do_sample": False}
    texts = [generator(prompt, **greedy)[0]["generated_text"] for prompt in prompts]
    assert all(text.startswith(prompt) for text, prompt in zip(texts, prompts))
    prompt_ids = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    expected = [
        generator.model.generate(torch.tensor([ids]), **greedy)[0, len(ids) :].tolist() for ids in prompt_ids
    ]
    assert translate.generate_ids(generator.model, prompt_ids, batch_size=2, **greedy) == expected
    assert all(len(ids) > 0 for ids in expected)


@needs_data
def test_lm_logs_validation_perplexity_and_keeps_the_best_epoch(tmp_path):
    """Every evaluation logs the token-weighted validation NLL and perplexity, and load_best_model_at_end
    restores the epoch with the lowest one, which the test split then uses."""
    document = train_and_test(
        tmp_path, "--task", "lm", "--dataset", "ptb", "--tokenizer_type", "word", "--vocab_size", "2000",
        "--max_train_samples", "200", "--max_eval_samples", "40", "--max_test_samples", "40", "--max_tokens", "1024",
        "--max_target_length", "48", "--num_train_epochs", "3", "--eval_strategy", "epoch", "--save_strategy", "epoch",
        "--load_best_model_at_end", "true", "--metric_for_best_model", "loss",
    )  # fmt: skip
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    evals = [e for e in state["log_history"] if "eval_loss" in e]
    assert [e["epoch"] for e in evals] == [1, 2, 3]
    for entry in evals:
        assert entry["eval_perplexity"] == pytest.approx(math.exp(entry["eval_loss"]))
    best = min(evals, key=lambda e: e["eval_loss"])
    assert state["best_metric"] == pytest.approx(best["eval_loss"])
    # The best model is the one tested: its validation NLL, recomputed, is the best epoch's.
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    model = ODETransformerForCausalLM.from_pretrained(tmp_path)
    texts = ptb("validation")["text"][:40]
    sequences = [
        [
            tokenizer.bos_token_id,
            *ids,
            tokenizer.eos_token_id,
        ]  # <s> text </s>, as ode_transformer.train.run builds them
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]
    ]
    rows = [{"input_ids": ids, "labels": ids} for ids in sequences]
    collator = PadCollator(tokenizer)
    total, count = lm_negative_log_likelihood(model, Dataset.from_list(rows), collator, 16)
    assert count == best["eval_tokens"] == sum(len(t.split()) + 1 for t in texts)  # word level: words + </s>
    assert total / count == pytest.approx(best["eval_loss"], rel=1e-5)
    values = {r["name"]: r["value"] for r in document["results"]}
    assert values["Word perplexity"] == pytest.approx(values["Subword perplexity"])  # one token per word


@needs_data
def test_streaming_multi30k(tmp_path):
    train_and_test(
        tmp_path, "--task", "translation", "--dataset", "multi30k", "--source_lang", "en",
        "--target_lang", "de", "--streaming", "true", "--max_steps", "4",
        "--per_device_train_batch_size", "8", "--do_predict", "false",
    )  # fmt: skip
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    assert (tmp_path / "model.safetensors").is_file()


def resume_flags(save_steps: int) -> list[str]:
    """12 steps on 40 Multi30k pairs, a checkpoint every `save_steps`: the runs the resume tests compare."""
    return [
        "--task", "translation", "--dataset", "multi30k", "--source_lang", "en", "--target_lang", "de",
        "--max_train_samples", "40", "--max_tokens", "300", "--max_source_length", "32",
        "--max_target_length", "32", "--max_steps", "12", "--save_strategy", "steps", "--save_steps", str(save_steps),
        "--do_predict", "false", "--report_to", "none",
    ]  # fmt: skip


@pytest.mark.both_cpus
@needs_data
def test_resume_gives_the_same_weights(tmp_path):
    """Uninterrupted 12 steps == 7 steps, checkpoint, then a fresh trainer resuming to 12 (mid-epoch 2)."""
    flags = resume_flags(save_steps=7)
    full = tmp_path / "full"
    train_and_test(full, *flags)
    checkpoint = full / "checkpoint-7"
    epoch = json.loads((checkpoint / "trainer_state.json").read_text())["epoch"]
    assert epoch > 1 and epoch != int(epoch), "the checkpoint should sit inside a later epoch"
    resumed = tmp_path / "resumed"
    train_and_test(
        resumed,
        *flags,
        "--tokenizer_name",
        str(full / "tokenizer"),
        "--resume_from_checkpoint",
        str(checkpoint),
    )
    expected, actual = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert expected.keys() == actual.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)


def early_stopping_count(checkpoint: Path) -> int:
    state = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]
    return state["EarlyStoppingCallback"]["attributes"]["early_stopping_patience_counter"]


def test_resume_keeps_the_early_stopping_count(tmp_path):
    """A resumed run counts evaluations without improvement from where the checkpoint left off, with the patience it
    is given now (transformers restarted the count at 0 on every resume, so a run resumed often never stopped
    early; its restore option would bring back the checkpoint's patience). A run resumed with early stopping
    added does not fail at its first save. Evaluation every step; `greater_is_better` on a falling loss makes the
    count grow."""
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("".join(f"the dog number {i} runs home\n" for i in range(24)), encoding="utf-8")
    tgt.write_text("".join(f"der Hund Nummer {i} läuft heim\n" for i in range(24)), encoding="utf-8")
    flags = [
        "--train_file", f"{src},{tgt}", "--validation_file", f"{src},{tgt}", "--preset", "tiny",
        "--vocab_size", "300", "--use_cpu", "true", "--report_to", "none", "--disable_tqdm", "true",
        "--max_steps", "6", "--per_device_train_batch_size", "8", "--eval_strategy", "steps", "--eval_steps", "1",
        "--save_strategy", "steps", "--save_steps", "3", "--do_predict", "false", "--learning_rate", "0.004",
        "--metric_for_best_model", "loss", "--greater_is_better", "true", "--load_best_model_at_end", "true",
    ]  # fmt: skip
    patience = ["--early_stopping_patience", "100"]
    full = tmp_path / "full"
    run(parse_arguments([*flags, *patience, "--output_dir", str(full)]))
    count = early_stopping_count(full / "checkpoint-3")
    assert count > 0, "the test needs a count to carry over"

    def resume(name: str, checkpoint: Path, *more: str) -> Path:
        out = tmp_path / name
        run(parse_arguments([*flags, *more, "--output_dir", str(out), "--tokenizer_name", str(full / "tokenizer"),
                             "--resume_from_checkpoint", str(checkpoint)]))  # fmt: skip
        return out

    resumed = resume("resumed", full / "checkpoint-3", *patience)
    assert early_stopping_count(resumed / "checkpoint-6") == early_stopping_count(full / "checkpoint-6")
    # this run's patience, one more than the count: it stops at the next evaluation
    stopped = resume("stopped", full / "checkpoint-3", "--early_stopping_patience", str(count + 1))
    assert json.loads((stopped / "trainer_state.json").read_text())["global_step"] == 4

    plain = tmp_path / "plain"
    run(parse_arguments([*flags, "--output_dir", str(plain)]))
    added = resume("added", plain / "checkpoint-3", *patience)
    # counted from 0: one for each of steps 4-6
    assert early_stopping_count(added / "checkpoint-6") == 3


CPU_RECIPES = ("libreoffice_demo.yaml", "multi30k_en_de_cpu.yaml")


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_a_recipes_block_is_the_papers_and_a_method_flag_alone_changes_it(recipe):
    """A recipe names the method, not the coefficients, so it builds the paper's block (RK2: the learnable
    gate) and `--encoder_ode_method rk4` on top of it builds the paper's RK4 (its tableau), not a gated RK4."""
    side = "decoder" if recipe == "ptb_lm.yaml" else "encoder"

    def block(*flags: str) -> tuple[str, str]:
        settings = parse_arguments([str(RECIPES / recipe), "--use_cpu", "true", *flags])
        config = ODETransformerConfig.from_preset(
            settings.model.preset, **settings.model.task_overrides(settings.run.task)
        )
        return getattr(config, f"{side}_ode_method"), getattr(config, f"{side}_ode_coefficients")

    assert block() == ("rk2", "gated")
    assert block(f"--{side}_ode_method", "rk4") == ("rk4", "tableau")


@pytest.mark.both_cpus
@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_recipes_parse(recipe):
    model_args, data_args, run_args, training_args = parse_arguments(
        [str(RECIPES / recipe), "--use_cpu", "true"]
    )
    assert training_args.lr_scheduler_type.value == "inverse_sqrt"
    assert (training_args.adam_beta1, training_args.weight_decay) == (0.9, 0.0)
    # The paper's 4096 tokens per GPU; the CPU recipes use 2048 (twice the updates in the same CPU time).
    assert data_args.max_tokens == (2048 if recipe in CPU_RECIPES else 4096)
    # CPU recipes: bf16 only where the CPU has it natively; GPU recipes: bf16 as asked
    if recipe in CPU_RECIPES:
        assert run_args.precision == "auto" and training_args.bf16 == choose_precision("cpu").bf16
    else:
        assert run_args.precision == "bf16" and training_args.bf16
    if recipe.startswith("wmt14_en_de"):
        assert (training_args.learning_rate, training_args.warmup_steps, training_args.adam_beta2) == (
            0.002,
            16000,
            0.997,
        )
        assert (run_args.num_beams, run_args.length_penalty, training_args.save_total_limit) == (4, 0.6, 10)
        assert training_args.max_steps == (100_000 if "big" in recipe else 50_000)
        assert model_args.preset == recipe.removeprefix("wmt14_en_de_").removesuffix(".yaml")


@pytest.mark.both_cpus
def test_cli_overrides_recipe():
    _, data_args, _, training_args = parse_arguments(
        [str(RECIPES / "multi30k_en_de_cpu.yaml"), "--max_steps", "7", "--max_tokens", "1000"]
    )
    assert (training_args.max_steps, data_args.max_tokens, training_args.warmup_steps) == (7, 1000, 300)
    with pytest.raises(ValueError, match="needs --max_steps"):
        check_settings(parse_arguments(["--streaming", "true", "--use_cpu", "true"]))
    for flag in (
        "--max_tokens",
        "--max_train_samples",
    ):  # a stream ignores them, with a warning, and unsets them: the card does not claim them
        _, data_args, _, _ = parse_arguments(
            ["--streaming", "true", "--max_steps", "4", flag, "100", "--use_cpu", "true"]
        )
        assert getattr(data_args, flag.removeprefix("--")) is None


class Killed(BaseException):
    """Stands for SIGKILL at a chosen point of a save: nothing after it runs (BaseException: no handler catches it)."""


def _kill_when(name_part: str):
    def check(path) -> None:
        if name_part in str(path):
            raise Killed(path)

    return check


@needs_data
@pytest.mark.slow
def test_kill_during_checkpoint_save_then_resume_gives_the_same_weights(tmp_path, monkeypatch, caplog):
    """Kill the save of checkpoint-8 at three points (weights half written, before the optimizer, before the
    rename), resume each time, then finish: the weights equal those of an uninterrupted run bit for bit."""
    import transformers.modeling_utils
    from transformers import Trainer

    import ode_transformer.train.trainer

    flags = resume_flags(save_steps=4)
    train_and_test(tmp_path / "full", *flags)
    out = tmp_path / "killed"

    save_file, save_optimizer, publish = (
        transformers.modeling_utils.safe_save_file, Trainer._save_optimizer_and_scheduler, ode_transformer.train.trainer.publish,
    )  # fmt: skip

    def half_written(tensors, filename, metadata=None):
        save_file(tensors, filename, metadata=metadata)
        if "checkpoint-8" in str(filename):
            Path(filename).write_bytes(Path(filename).read_bytes()[:1000])
            raise Killed(filename)

    kills = [
        (transformers.modeling_utils, "safe_save_file", half_written),
        (Trainer, "_save_optimizer_and_scheduler", lambda self, d: (_kill_when("checkpoint-8")(d), save_optimizer(self, d))),
        (ode_transformer.train.trainer, "publish", lambda staged, final: (_kill_when("checkpoint-8")(final), publish(staged, final))),
    ]  # fmt: skip
    for attempt, (owner, name, replacement) in enumerate(kills):
        with monkeypatch.context() as patch:
            patch.setattr(owner, name, replacement)
            with pytest.raises(Killed):
                train_and_test(out, *flags, *(["--resume_from_checkpoint", "last"] if attempt else []))
        assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"], name
        assert (out / ".staging" / "checkpoint-8").is_dir()  # the partial save, never published

    # A partial checkpoint-8 as written in place before atomic saves: skipped with a warning.
    shutil.copytree(out / "checkpoint-4", out / "checkpoint-8")
    (out / "checkpoint-8" / "trainer_state.json").write_text('{"global_step": 8, "log_hist')
    with caplog.at_level(logging.WARNING):
        train_and_test(out, *flags, "--resume_from_checkpoint", "last")
    assert "skipping incomplete checkpoint" in caplog.text and "a cut-off trainer_state.json" in caplog.text
    assert not (out / ".staging").exists()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [
        "checkpoint-12",
        "checkpoint-4",
        "checkpoint-8",
    ]
    expected, actual = (
        load_file(tmp_path / "full" / "model.safetensors"),
        load_file(out / "model.safetensors"),
    )
    assert expected.keys() == actual.keys()
    assert all(torch.equal(actual[key], expected[key]) for key in expected)
    run_ids = {
        (out / name / "run_id.txt").read_text() for name in ("checkpoint-4", "checkpoint-8", "checkpoint-12")
    }
    assert len(run_ids) == 1  # one run, resumed: averaging accepts its checkpoints


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_gpu_recipes_say_so_in_header_and_readme(recipe):
    """A recipe without use_cpu is meant for a GPU (bf16): its first lines and the README must say so, and what it
    does on a machine without one."""
    text = (RECIPES / recipe).read_text()
    docs = [RECIPES.parents[1] / "README.md", *(RECIPES.parents[1] / "docs").glob("*.md")]
    readme = "\n".join(path.read_text() for path in docs)
    if recipe in CPU_RECIPES:
        assert "use_cpu: true" in text
        return
    assert (
        text.startswith("# GPU recipe: bf16 training on CUDA GPUs.")
        and "On a machine without a GPU it trains on the CPU" in text.split("\n")[0]
    )
    lines = [
        line for line in readme.splitlines() if f"train/recipes/{recipe}" in line and "python -m" in line
    ]
    assert all("GPU" in line for line in lines), lines  # every README command that runs it


def test_help_names_the_program_the_recipe_and_puts_our_groups_first():
    text = build_parser().format_help()
    assert text.startswith("usage: python -m ode_transformer.train.run [RECIPE] [--flag value ...]")
    positions = [text.index(f"\n{title}:\n") for title in ("positional arguments", "model", "data", "run")]
    assert positions == sorted(positions) and positions[-1] < text.index(
        "\ntransformers Seq2SeqTrainingArguments:"
    )
    assert "RECIPE" in text.split("\nmodel:")[0].split("positional arguments:")[1]


@pytest.mark.both_cpus
@pytest.mark.parametrize("name", ["multi30k_en_de_cpu", "multi30k_en_de_cpu.yaml"])
def test_a_packaged_recipe_is_found_by_name_from_any_folder(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    by_name = parse_arguments([name, "--use_cpu", "true"])
    by_path = parse_arguments([str(RECIPES / "multi30k_en_de_cpu.yaml"), "--use_cpu", "true"])
    assert by_name[0] == by_path[0] and by_name[1] == by_path[1]
    with pytest.raises(FileNotFoundError, match="packaged recipe .*multi30k_en_de_cpu"):
        parse_arguments(["multi30k_en_de_gpu"])


@pytest.mark.both_cpus
def test_list_recipes_prints_every_packaged_recipe(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_arguments(["--list-recipes"])
    assert exit_info.value.code == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == sorted(path.stem for path in RECIPES.glob("*.yaml")) and "multi30k_en_de_cpu" in listed


@pytest.mark.both_cpus
def test_a_missing_corpus_is_one_line_naming_the_flag_the_variable_and_the_path(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--dataset", "multi30k", "--data_dir", str(tmp_path), "--output_dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2  # argparse's code for a usage error
    message = capsys.readouterr().err.splitlines()[-1]
    assert message.startswith(
        "python -m ode_transformer.train.run: error: shared corpus 'multi30k' not found"
    )
    assert "--data_dir" in message and "ODE_DATA_DIR" in message and str(tmp_path / "multi30k") in message


def test_only_the_main_process_counts_truncated_lines(tmp_path, caplog):
    """Every process of a distributed run tokenises the same splits; one warning of the cut lines, not one per
    process."""
    from ode_transformer.train.arguments import DataArguments
    from ode_transformer.train.preparation import tokenize_splits

    _, tokenizer = save_tiny_folder(tmp_path)
    splits = {"train": Dataset.from_dict({"source": ["the dog runs in the park " * 4], "target": ["a cat"]})}
    data_args = DataArguments(max_source_length=4, max_target_length=16)
    for main_process, warnings in ((False, 0), (True, 1)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ode_transformer.train.preparation"):
            out = tokenize_splits(splits, tokenizer, "translation", data_args, main_process=main_process)
        assert caplog.text.count("train split: 1 of 1 source line(s) longer than") == warnings
        assert len(out["train"][0]["input_ids"]) == 4 and "source_truncated" not in out["train"].column_names


def test_a_run_without_recipe_trains_with_the_papers_optimiser():
    """Own files without a recipe train with the translation recipes' optimiser, not transformers' defaults
    (lr 5e-5 without warm-up, which leaves a short run with empty hypotheses), the warm-up a ratio of the
    run's steps; `--help` shows the defaults a run uses, label smoothing's included."""
    recipe = yaml.safe_load((RECIPES / "wmt14_en_de_base.yaml").read_text())
    training_args = parse_arguments(["--train_file", "a.en,a.de", "--use_cpu", "true"])[3]
    for key in ("adam_beta1", "adam_beta2", "weight_decay", "max_grad_norm", "learning_rate"):
        assert getattr(training_args, key) == recipe[key], key
    assert training_args.lr_scheduler_type.value == recipe["lr_scheduler_type"]
    assert training_args.get_warmup_steps(1500) == 300  # the CPU recipe's 300 of 1500 steps
    assert parse_arguments([str(RECIPES / "ptb_lm.yaml"), "--use_cpu", "true"])[3].learning_rate == 0.0007
    help_text = " ".join(build_parser().format_help().split())
    for flag, default in [("label_smoothing_factor", 0.1), ("learning_rate", 0.002), ("adam_beta2", 0.997)]:
        assert re.search(
            rf"--{flag} [A-Z0-9_]+, --{flag.replace('_', '-')} .*?\(default: {default}\)", help_text
        )


def test_a_short_run_on_own_files_writes_hypotheses(tmp_path, monkeypatch):
    """The README's own-files command (`--train_file`, `--validation_file`, `--output_dir`, no recipe) with the
    tiny preset and 150 steps on 24 pairs writes a hypothesis for every validation line, none empty: the
    defaults of a run without a recipe make it learn (transformers' own leave every hypothesis empty there)."""
    words = {"dog": "Hund", "cat": "Katze", "man": "Mann", "woman": "Frau", "child": "Kind", "bird": "Vogel"}
    verbs = {"runs": "läuft", "sleeps": "schläft", "eats": "isst", "sings": "singt"}
    pairs = [(f"the {w} {v}", f"der {words[w]} {verbs[v]}") for w in words for v in verbs]
    for name, lines in (("train", pairs), ("dev", pairs[:6])):
        for side, lang in enumerate(("en", "de")):
            (tmp_path / f"{name}.{lang}").write_text(
                "".join(pair[side] + "\n" for pair in lines), encoding="utf-8"
            )
    monkeypatch.chdir(tmp_path)
    own_files = ["--train_file", "train.en,train.de", "--validation_file", "dev.en,dev.de", "--output_dir"]
    quiet = ["--use_cpu", "true", "--report_to", "none", "--disable_tqdm", "true", "--save_strategy", "no"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as tests/conftest.py's one_thread, for this test alone
    try:
        run(parse_arguments([*own_files, "OUT", "--preset", "tiny", "--max_steps", "150", *quiet]))
    finally:
        torch.set_num_threads(threads)
    hypotheses = (tmp_path / "OUT" / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == 6 and all(hypotheses), hypotheses


@pytest.mark.both_cpus
def test_label_smoothing_is_the_trainers_flag_with_the_papers_default():
    """The model returns plain cross entropy; `--label_smoothing_factor` (transformers' flag) smooths it: the
    paper's 0.1 by default, 0 for a language model, whatever is given (0 included) otherwise. A smoothed causal LM
    is refused by check_settings, with the checks that span dataclasses: transformers' label smoother would not
    shift its labels."""
    factor = lambda *flags: parse_arguments([*flags, "--use_cpu", "true"])[3].label_smoothing_factor  # noqa: E731
    assert factor() == 0.1 and factor("--task", "lm") == 0.0
    assert factor("--label_smoothing_factor", "0.2") == 0.2 and factor("--label_smoothing_factor", "0") == 0.0
    assert factor(str(RECIPES / "multi30k_en_de_cpu.yaml")) == 0.1
    smoothed_lm = parse_arguments(["--task", "lm", "--label_smoothing_factor", "0.1", "--use_cpu", "true"])
    with pytest.raises(ValueError, match="--label_smoothing_factor 0.1 with --task lm: .* would not shift"):
        check_settings(smoothed_lm)
    with pytest.raises(ValueError, match="must come first"):
        parse_arguments(["--use_cpu", "true", str(RECIPES / "multi30k_en_de_cpu.yaml")])


def test_a_smoothed_training_step_gives_the_loss_and_gradients_of_the_former_in_model_smoothing(tmp_path):
    """One training step through Seq2SeqTrainer with label_smoothing_factor 0.1 (the collator adds the decoder
    inputs, since the label smoother takes the labels away) gives the loss and the gradients of torch's
    label-smoothed cross entropy (0.1) of the model's logits over the non-padding targets."""
    model, tokenizer = save_tiny_folder(
        tmp_path / "model", dropout=0.0, attention_dropout=0.0, activation_dropout=0.0
    )
    model.train()
    collator = PadCollator(tokenizer, model=model)
    features = [
        {"input_ids": tokenizer(src)["input_ids"], "labels": tokenizer(tgt)["input_ids"]}
        for src, tgt in [
            ("a man rides a bike", "ein mann fährt rad"),
            ("two dogs", "zwei hunde spielen im schnee"),
        ]
    ]
    batch = collator(features)
    args = Seq2SeqTrainingArguments(
        tmp_path / "out", label_smoothing_factor=0.1, use_cpu=True, report_to="none"
    )
    trainer = Seq2SeqTrainer(model=model, args=args, data_collator=collator)
    loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=(batch["labels"] != -100).sum())
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
    ).logits
    before = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        batch["labels"].reshape(-1),
        ignore_index=-100,
        label_smoothing=0.1,
    )
    before.backward()
    torch.testing.assert_close(loss, before)
    for grad, parameter in zip(grads, model.parameters()):
        torch.testing.assert_close(grad, parameter.grad)


@pytest.mark.both_cpus
def test_recipe_card_shows_the_actual_shape():
    args = parse_arguments([str(RECIPES / "multi30k_en_de_cpu.yaml"), "--use_cpu", "true"])
    config = ODETransformerConfig.from_preset(args[0].preset, **args[0].overrides())
    recipe = training_card(args, {"global_step": 7}, config)["recipe"]
    assert recipe["model"] == "3-3 layers, d_model 256, FFN 1024/1024, 4/4 heads"  # not "preset: base"
    assert "preset" not in recipe and "d_model" not in recipe
    assert (recipe["encoder_ode_method"], recipe["steps"]) == ("rk2", 7)


@pytest.mark.both_cpus
def test_the_card_names_data_by_corpus_hub_id_or_dataset_name_never_by_a_local_path(tmp_path):
    """A --test_file wins over the training corpus (--dataset) in the card's `dataset`, as it does in the run; local
    files and folders are "local data" (ode-push would publish a path), unless --dataset_name names them."""
    common = ["--dataset", "multi30k", "--use_cpu", "true"]
    files = f"{tmp_path}/my.en,{tmp_path}/my.de"
    _, data_args, _, _ = parse_arguments([*common, "--test_file", files])
    assert dataset_card(data_args, "translation", None, rows=1000) == {
        "name": "local data",
        "id": "local",
        "split": "test",
        "rows": 1000,
    }
    _, data_args, _, _ = parse_arguments(
        [*common, "--test_file", files, "--dataset_name", "my-org/news-test"]
    )
    assert dataset_card(data_args, "translation", None, rows=9)["name"] == "my-org/news-test"
    _, data_args, _, _ = parse_arguments(common)
    assert dataset_card(data_args, "translation", None, rows=1000)["id"] == "bentrevett/multi30k"
    for data in (["--train_file", files], ["--hub_dataset", str(tmp_path)]):  # a file, a local dataset folder
        args = parse_arguments([*data, "--use_cpu", "true"])
        config = ODETransformerConfig.from_preset("tiny")
        assert training_card(args, {"global_step": 1}, config)["data"] == "local data"
        assert training_card(args, {"global_step": 1}, config)["datasets"] == []
        assert dataset_card(args[1], "translation", None, rows=5)["name"] == "local data"
    args = parse_arguments(["--hub_dataset", "wmt/wmt14", "--use_cpu", "true"])
    assert training_card(args, {"global_step": 1}, ODETransformerConfig.from_preset("tiny"))["datasets"] == [
        "wmt/wmt14"
    ]
    # a Hub config is the Hub dataset's: not stated for a shared corpus (cnndm_base names its Hub copy's config)
    hub = parse_arguments(
        ["--hub_dataset", "abisee/cnn_dailymail", "--hub_config", "3.0.0", "--use_cpu", "true"]
    )
    assert dataset_card(hub.data, "summarization", None, rows=5)["config"] == "3.0.0"
    shared = parse_arguments(["cnndm_base", "--use_cpu", "true"])
    assert "config" not in dataset_card(shared.data, "summarization", None, rows=5)


@pytest.mark.both_cpus
def test_card_names_a_test_slice_as_one():
    """--max_test_samples 100 scores the first 100 rows, and the card names that slice, not the whole test set."""
    _, data_args, _, _ = parse_arguments(
        ["--dataset", "multi30k", "--use_cpu", "true", "--max_test_samples", "100"]
    )
    assert dataset_card(data_args, "translation", None, rows=100)["split"] == "test[:100]"
    # a limit above the split's size scores all of it
    assert dataset_card(data_args, "translation", None, rows=40)["split"] == "test"


def test_word_dropout():
    from ode_transformer.train.trainer import word_dropout

    ids = list(range(4, 10004)) + [2]
    assert word_dropout(ids, 0.0) == ids
    g = torch.Generator().manual_seed(0)
    dropped = word_dropout(ids, 0.3, generator=g, keep_ids=[2])
    assert dropped == word_dropout(ids, 0.3, generator=torch.Generator().manual_seed(0), keep_ids=[2])
    assert dropped[-1] == 2 and 0.27 < 1 - len(dropped) / len(ids) < 0.33  # binomial sd ~0.005
    assert dropped[:-1] == sorted(dropped[:-1])  # order kept
    unk = word_dropout(
        torch.tensor(ids), 0.3, unk_id=3, generator=torch.Generator().manual_seed(0), keep_ids=[2]
    )
    assert isinstance(unk, torch.Tensor) and len(unk) == len(ids) and unk[-1] == 2
    assert (unk == 3).sum().item() == len(ids) - len(dropped)  # same draws: replaced where dropped
    with pytest.raises(ValueError):
        word_dropout(ids, 1.0)


def test_pad_collator_pads_like_fairseq_and_drops_words_only_in_training():
    """`PadCollator` = `DataCollatorForSeq2Seq` + word dropout: right padding with the pad id and its mask,
    labels padded with -100, no `labels` key without labels, and source words (never `</s>`) dropped only in
    training, with torch's global RNG."""
    from ode_transformer.tokenizer import SPECIAL_TOKENS, train_tokenizer
    from ode_transformer.train.trainer import word_dropout

    words = len(SPECIAL_TOKENS) + 8
    tokenizer = train_tokenizer(["a b c d e f g h"] * 4, vocab_size=words, min_frequency=1, kind="word")
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    features = [
        {"input_ids": [5, 6, 7, 8, 9, 10, eos], "labels": [7, eos]},
        {"input_ids": [11, eos], "labels": [5, 6, 7, eos]},
    ]
    batch = PadCollator(tokenizer, word_dropout=0.5)(features)  # not training: nothing dropped
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, eos], [11, eos, pad, pad, pad, pad, pad]]
    assert batch["attention_mask"].tolist() == [[1] * 7, [1, 1, 0, 0, 0, 0, 0]]
    assert batch["labels"].tolist() == [[7, eos, -100, -100], [5, 6, 7, eos]]
    assert all(v.dtype == torch.long for v in batch.values())
    assert set(PadCollator(tokenizer)([{"input_ids": [5, eos]}])) == {"input_ids", "attention_mask"}

    training = PadCollator(tokenizer, word_dropout=0.5, training=True)
    torch.manual_seed(1)
    dropped = training(features)
    torch.manual_seed(1)
    expected = [word_dropout(f["input_ids"], 0.5, keep_ids=(eos,)) for f in features]
    longest = max(map(len, expected))
    assert dropped["input_ids"].tolist() == [ids + [pad] * (longest - len(ids)) for ids in expected]
    assert dropped["attention_mask"].tolist() == [
        [1] * len(ids) + [0] * (longest - len(ids)) for ids in expected
    ]
    assert dropped["input_ids"].shape[1] < 7 and all(eos in ids for ids in expected)
    assert dropped["labels"].tolist() == batch["labels"].tolist()


@pytest.mark.parametrize("task", ["translation", "lm"])
def test_the_card_the_tokenizer_and_its_truncation_state_one_trained_length(tmp_path, task):
    """The card, tokenizer_config.json's model_max_length and tokenizer.json's truncation all state the length
    the run trained on (--max_source_length, a language model's --max_target_length), not
    max_position_embeddings nor the truncation of the last tokenizer call (the target length where the two
    differ)."""
    lines = [f"the dog {'runs ' * (i % 9)}in the park {i}" for i in range(60)]
    source, target = tmp_path / "train.en", tmp_path / "train.de"
    source.write_text("\n".join(lines) + "\n")
    target.write_text("\n".join(line.replace("dog", "Hund") for line in lines) + "\n")
    lengths = ["--max_source_length", "12", "--max_target_length", "20"]
    data = [str(source)] if task == "lm" else [f"{source},{target}"]
    out = tmp_path / "out"
    train_and_test(out, "--task", task, "--train_file", *data, *lengths, "--max_steps", "2", "--max_tokens", "256",
                   "--do_predict", "false")  # fmt: skip
    trained = 20 if task == "lm" else 12
    # the folder the run trained its tokenizer in says so too, not transformers' 1e30
    for folder in (out, out / "tokenizer"):
        assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == trained
        assert json.loads((folder / "tokenizer.json").read_text())["truncation"]["max_length"] == trained
    positions = json.loads((out / "config.json").read_text())["max_position_embeddings"]
    assert positions != trained
    card = write_model_card(out, None).read_text()
    assert f"trained on inputs of up to {trained} tokens" in card and f"`model_max_length` {trained}" in card
    assert f"cuts inputs to {trained} tokens, the trained length" in card
    assert f"up to {positions}" not in card and "computed for any length" in card


def _multi30k_hub_layout(folder: Path, rows: int = 40) -> Path:
    """A local folder laid out as the Hub's bentrevett/multi30k: train/val/test.jsonl of {"en": ..., "de": ...}."""
    folder.mkdir(parents=True)
    for split in ("train", "val", "test"):
        records = [
            {"en": f"a dog runs {split} {i}", "de": f"ein Hund rennt {split} {i}"} for i in range(rows)
        ]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


@pytest.mark.both_cpus
def test_a_packaged_recipe_gets_its_data_by_name_without_a_clone(tmp_path, monkeypatch, refused):
    """From an install (no ../shared), `ode-train multi30k_en_de_cpu` finds its data: a recipe takes the local
    folder when there is one (--data_dir), else the Hub dataset it names, through datasets; offline it fails
    in one line naming --data_dir and the dataset id."""
    from ode_transformer.train.preparation import load_raw_data

    monkeypatch.setenv("ODE_DATA_DIR", str(tmp_path / "no_clone"))  # as from an install: no shared data
    recipe = yaml.safe_load((RECIPES / "multi30k_en_de_cpu.yaml").read_text())
    assert (recipe["dataset"], recipe["hub_dataset"]) == ("multi30k", "bentrevett/multi30k")
    hub = _multi30k_hub_layout(tmp_path / "bentrevett_multi30k")
    out = ["--output_dir", str(tmp_path / "out")]
    settings = parse_arguments(["multi30k_en_de_cpu", *out, "--hub_dataset", str(hub)])
    raw, _ = load_raw_data(settings.data, "translation")
    assert sorted(raw) == ["test", "train", "validation"] and raw["train"].num_rows == 40
    assert raw["validation"][3] == {"source": "a dog runs val 3", "target": "ein Hund rennt val 3"}
    # a local folder, when given, is read and the Hub left alone
    local = tmp_path / "data" / "multi30k"
    local.mkdir(parents=True)
    for name in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            with gzip.open(local / f"{name}.{lang}.gz", "wt") as file:
                file.write(f"{lang} {name} one\n{lang} {name} two\n")
    settings = parse_arguments(["multi30k_en_de_cpu", *out, "--data_dir", str(tmp_path / "data")])
    raw, _ = load_raw_data(settings.data, "translation")
    assert raw["train"]["source"] == ["en train one", "en train two"]
    # offline, with neither: one line that names both ways
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty_cache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    message = refused(main, ["multi30k_en_de_cpu", *out]).splitlines()[-1]
    assert message.startswith(
        "python -m ode_transformer.train.run: error: shared corpus 'multi30k': no local copy"
    )
    assert "--data_dir DIR" in message and "bentrevett/multi30k" in message


_STREAM_PEAK = """
import resource, sys
from itertools import islice
from ode_transformer.train.arguments import parse_arguments
from ode_transformer.train.preparation import load_raw_data, splits_to_use
settings = parse_arguments(["--train_file", sys.argv[1], "--streaming", "true", "--max_steps", "5",
                            "--do_predict", "false", "--output_dir", sys.argv[2], "--use_cpu", "true"])
raw, _ = load_raw_data(settings.data, "translation")
rows = list(islice(iter(splits_to_use(raw, settings)["train"]), 2000))
assert rows[1999] == {"source": "a sentence number 1999 of the big file", "target": "ein Satz Nummer 1999"}, rows[1999]
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


@pytest.mark.slow
def test_local_training_files_stream_in_bounded_memory(tmp_path):
    """`--train_file big.en,big.de --streaming true` streams a local pair line by line rather than read it
    whole: the peak memory is that of a small file, whatever the file's size."""
    peaks = {}
    for name, lines in (("small", 2_000), ("big", 5_000_000)):
        source, target = tmp_path / f"{name}.en", tmp_path / f"{name}.de"
        with open(source, "w") as src, open(target, "w") as tgt:
            for start in range(0, lines, 100_000):
                block = range(start, min(start + 100_000, lines))
                src.write("".join(f"a sentence number {i} of the big file\n" for i in block))
                tgt.write("".join(f"ein Satz Nummer {i}\n" for i in block))
        pair = f"{source},{target}"
        result = subprocess.run(
            [sys.executable, "-c", _STREAM_PEAK, pair, str(tmp_path / f"out_{name}")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        peaks[name] = int(result.stdout.split()[-1])
    assert (tmp_path / "big.en").stat().st_size + (tmp_path / "big.de").stat().st_size > 250_000_000
    assert peaks["big"] < peaks["small"] + 100, peaks  # MB: no more than a small file's, give or take


def test_a_run_that_trains_the_gated_rk2_block_says_what_the_projects_runs_show(tmp_path, caplog):
    """The recipes' default block is the paper's gated RK2, whose gate saturated in every diagnostic of
    this project's; a run that trains it says so in its log, with the flag that trains another block, and a run of
    another block says nothing of it. The model card says the same (tests/test_hub.py)."""
    from tiny_run import corpus, train_run

    from ode_transformer.wording import GATED_RK2_FINDING

    src, tgt = corpus(tmp_path / "data")
    for block, said in ((("--encoder_ode_method", "rk2"), True), (("--encoder_ode_method", "rk4"), False)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="ode_transformer.train.preparation"):
            train_run(tmp_path / block[1], "--train_file", f"{src},{tgt}", *block)
        notes = [r.getMessage() for r in caplog.records if "gated RK2" in r.getMessage()]
        assert len(notes) == int(said), notes
        if said:
            assert notes[0].startswith("encoder blocks: gated RK2") and GATED_RK2_FINDING in notes[0]
            assert "--encoder_ode_method rk4" in notes[0]
