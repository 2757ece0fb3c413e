"""The demo: its defaults (a step budget, no time budget) and end to end with a tiny model and a few steps
(the real run trains for its full step budget)."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import torch
import yaml
from datasets import Dataset

from ode_transformer.precision import choose_precision
from ode_transformer.train.arguments import parse_arguments
from ode_transformer.train.checks import check_settings
from ode_transformer.train.demo import RECIPE, main, parse_demo_arguments
from ode_transformer.train.preparation import drop_long_training_pairs
from ode_transformer.train.provenance import REPO, git_commit

TINY_MODEL = [
    "--d_model", "32", "--encoder_ffn_dim", "64", "--decoder_ffn_dim", "64", "--encoder_layers", "1",
    "--decoder_layers", "1", "--vocab_size", "1000", "--per_device_eval_batch_size", "32", "--num_beams", "1",
    "--save_strategy", "no", "--average_last_checkpoints", "0",
]  # fmt: skip


@pytest.mark.both_cpus
def test_demo_defaults_are_a_step_budget():
    """``make demo`` trains the recipe's number of updates whatever the machine's speed: no time budget."""
    demo_args, passthrough = parse_demo_arguments([])
    assert demo_args.max_steps is None and passthrough == []
    _, _, run_args, training_args = parse_arguments([str(RECIPE), "--output_dir", "unused"])
    recipe = yaml.safe_load(RECIPE.read_text())
    assert run_args.time_budget_minutes is None and "time_budget_minutes" not in recipe
    assert training_args.max_steps == recipe["max_steps"] > 0
    # the method alone: the paper's RK2 block, the learnable gate
    assert recipe["encoder_ode_method"] == "rk2" and "encoder_ode_coefficients" not in recipe


def test_drop_long_training_pairs_keeps_the_other_splits():
    train = Dataset.from_dict({"length": [3, 9, 5, 10, 11]})
    test = Dataset.from_dict({"length": [30, 2]})
    kept = drop_long_training_pairs({"train": train, "test": test}, 10)
    assert kept["train"]["length"] == [3, 9, 5, 10] and kept["test"] is test
    assert drop_long_training_pairs({"train": train}, None)["train"] is train


@pytest.mark.both_cpus
def test_max_train_tokens_must_be_below_the_truncation_length():
    with pytest.raises(ValueError, match="max_train_tokens"):
        check_settings(
            parse_arguments(
                [
                    str(RECIPE),
                    "--output_dir",
                    "unused",
                    "--max_train_tokens",
                    "128",
                    "--max_source_length",
                    "128",
                ]
            )
        )


@pytest.mark.slow
def test_demo_tiny_honours_the_step_budget_and_is_reproducible(tmp_path, capsys):
    runs = [
        main(
            [
                "--output_dir",
                str(tmp_path / name),
                "--max_steps",
                "7",
                "--max_test_samples",
                "24",
                "--results",
                str(tmp_path / f"{name}.json"),
                *TINY_MODEL,
            ]
        )
        for name in ("a", "b")
    ]
    summary = runs[0]
    for key in ("bleu", "chrf", "copy_baseline_bleu", "copy_baseline_chrf"):
        assert math.isfinite(summary[key]) and 0 <= summary[key] <= 100, key
    assert summary["copy_baseline_bleu"] > 0 and summary["steps"] == summary["max_steps"] == 7
    assert summary["decoding"]["precision"] == "fp32" and summary["train_seconds"] > 0
    assert summary["bleu_signature"].startswith("nrefs:1|") and len(summary["examples"]) == 4
    assert json.loads((tmp_path / "a" / "demo_summary.json").read_text()) == summary
    assert json.loads((tmp_path / "a.json").read_text()) == summary  # --results: the same record
    provenance = summary["provenance"]
    # the training precision --precision auto chose here, and why (fp32 on a CPU without native bf16)
    assert provenance["precision"] == choose_precision("cpu").as_dict()
    assert provenance["device"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert provenance["seed"] == yaml.safe_load(RECIPE.read_text()).get(
        "seed", 42
    )  # TrainingArguments default
    assert provenance["recipe"] == "train/recipes/libreoffice_demo.yaml"
    assert provenance["command"].startswith("python -m ode_transformer.train.demo --output_dir ")
    assert provenance["device"]["device"] == "cpu" and provenance["device"]["threads"] >= 1
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    assert provenance["git"]["commit"] == (head or None)
    assert (tmp_path / "a" / "README.md").is_file() and (tmp_path / "a" / "loss_curves.png").is_file()
    # Same seed, same number of updates: the same model and the same translations, however long it took.
    assert (tmp_path / "a" / "test_hypotheses.txt").read_text() == (
        tmp_path / "b" / "test_hypotheses.txt"
    ).read_text()
    timed = ("train_seconds", "wall_seconds", "provenance")  # provenance: its command and time differ
    assert {k: v for k, v in runs[1].items() if k not in timed} == {
        k: v for k, v in summary.items() if k not in timed
    }
    out = capsys.readouterr().out
    assert "copy-the-source baseline" in out and "7 of 7 updates" in out


def test_demo_results_file_is_checked_before_training(tmp_path, refused):
    """``--results`` naming a folder, a file in a missing folder or ``-`` is refused at once (the run would
    otherwise fail after training, or write a file named ``-``)."""
    for results, message in [(str(tmp_path), "is a folder"), (str(tmp_path / "no" / "cpu.json"), "does not exist"),
                             ("-", "the summary is printed already")]:  # fmt: skip
        assert message in refused(parse_demo_arguments, ["--results", results])
    demo_args, _ = parse_demo_arguments(["--results", str(tmp_path / "cpu.json")])
    assert demo_args.results.endswith("cpu.json")


def test_git_commit_outside_a_checkout_is_none(tmp_path):
    """An installed package has no git checkout: its commit is recorded as unknown, not as another folder's."""
    assert git_commit(tmp_path) == {"commit": None, "dirty": None}
