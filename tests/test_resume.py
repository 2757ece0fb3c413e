"""A run killed at any point and started again with the same command ends where the uninterrupted run ends, bit for
bit: the same weights, losses, validation curve and test score. Each kill is a `Killed` raised at the chosen point
(a BaseException: no handler of the run catches it, as none would run after SIGKILL), in process, then the same
flags again with ``--resume_from_checkpoint last`` (what ``experiments.run`` adds when the folder has a
checkpoint).

The language model's rows are longer than ``--max_target_length``: the tokenizer a run saves for a causal LM cuts
on the left (a prompt keeps its end), and a resumed run, which loads it, tokenised its training and test rows
from the other end until data preparation chose the side itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ode_transformer.train.trainer
from ode_transformer.train.arguments import parse_arguments
from ode_transformer.train.run import run


class Killed(BaseException):
    """Stands for SIGKILL: raised at a chosen point, caught by nothing in the run."""


WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "then",
    "it",
    "ran",
    "to",
    "the",
    "old",
    "red",
    "barn",
    "by",
    "the",
    "river",
]


def _lines(count: int, offset: int) -> str:
    # lengths 3-30 words: a third of the rows are cut to --max_target_length 16
    return "".join(
        " ".join(WORDS[(i * 7 + j + offset) % len(WORDS)] for j in range(3 + (i * 5) % 28)) + f" {i}\n"
        for i in range(count)
    )


def _flags(tmp_path: Path, task: str) -> list[str]:
    files = {}
    for split, count in (("train", 80), ("valid", 8), ("test", 8)):
        for side, offset in (("src", 0), ("tgt", 3)):
            files[split, side] = tmp_path / f"{split}.{side}"
            files[split, side].write_text(_lines(count, offset + len(split)), encoding="utf-8")
    data = {
        split: str(files[split, "src"]) if task == "lm" else f"{files[split, 'src']},{files[split, 'tgt']}"
        for split in ("train", "valid", "test")
    }
    return [
        "--task", task, "--train_file", data["train"], "--validation_file", data["valid"], "--test_file", data["test"],
        "--preset", "tiny", "--vocab_size", "300", "--use_cpu", "true", "--report_to", "none", "--disable_tqdm", "true",
        "--max_tokens", "96", "--max_source_length", "16", "--max_target_length", "16", "--max_steps", "36",
        "--learning_rate", "0.004", "--warmup_steps", "4", "--lr_scheduler_type", "inverse_sqrt", "--logging_steps", "2",
        "--eval_strategy", "steps", "--eval_steps", "3", "--save_strategy", "steps", "--save_steps", "6",
        "--save_total_limit", "1", "--load_best_model_at_end", "true", "--metric_for_best_model", "loss",
        "--early_stopping_patience", "20", "--do_predict", "true", "--num_beams", "1", "--seed", "5",
    ]  # fmt: skip


def _train(out: Path, flags: list[str], *more: str) -> dict:
    return run(parse_arguments([*flags, "--output_dir", str(out), *more]))


def _record(out: Path) -> dict:
    state = json.loads((out / "trainer_state.json").read_text())
    return {
        "history": [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k}
                    for entry in state["log_history"] if "train_runtime" not in entry],
        "best": (state["best_metric"], Path(state["best_model_checkpoint"]).name),
        "test": {k: v for k, v in json.loads((out / "test_results.json").read_text()).items() if "runtime" not in k
                 and "per_second" not in k},
    }  # fmt: skip


@pytest.fixture(scope="module", params=["lm", "translation"])
def uninterrupted(request, tmp_path_factory) -> tuple[str, list[str], Path]:
    tmp_path = tmp_path_factory.mktemp(f"resume-{request.param}")
    flags = _flags(tmp_path, request.param)
    _train(tmp_path / "full", flags)
    return request.param, flags, tmp_path / "full"


def _kill_at_step(step: int):
    """Patch for the trainer's training_step: killed as step `step` + 1 begins (after step `step`'s save)."""
    original = ode_transformer.train.trainer._TokenBudgetMixin.training_step

    def training_step(self, *args, **kwargs):
        if self.state.global_step == step:
            raise Killed(f"step {step}")
        return original(self, *args, **kwargs)

    return ode_transformer.train.trainer._TokenBudgetMixin, "training_step", training_step


def _kill_after_evaluating_at(step: int):
    """Patch for the trainer's evaluate: killed once the evaluation of step `step` is logged (its step saves
    nothing: the resume goes back to the last checkpoint and evaluates again)."""

    def patch(trainer_class):
        original = trainer_class.evaluate

        def evaluate(self, *args, **kwargs):
            results = original(self, *args, **kwargs)
            if self.state.global_step == step:
                raise Killed(f"evaluated step {step}")
            return results

        return trainer_class, "evaluate", evaluate

    return patch


def _kill_during_save_of(step: int):
    """Patch for the trainer's publish: killed with checkpoint-`step` written aside, before its rename."""
    original = ode_transformer.train.trainer.publish

    def publish(staged, final):
        if Path(final).name == f"checkpoint-{step}":
            raise Killed(f"saving checkpoint-{step}")
        return original(staged, final)

    return ode_transformer.train.trainer, "publish", publish


def _trainer_class(task: str):
    from ode_transformer.train.trainer import TokenBudgetSeq2SeqTrainer, TokenBudgetTrainer

    return TokenBudgetTrainer if task == "lm" else TokenBudgetSeq2SeqTrainer


KILL_POINTS = {
    "mid-epoch in the first epoch": lambda task: _kill_at_step(6),
    "mid-epoch in a later epoch": lambda task: _kill_at_step(24),
    "right after an evaluation": lambda task: _kill_after_evaluating_at(15)(_trainer_class(task)),
    "during a save": lambda task: _kill_during_save_of(18),
}


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_a_run_killed_then_started_again_ends_as_the_uninterrupted_one(
    uninterrupted, point, tmp_path, monkeypatch
):
    task, flags, full = uninterrupted
    epochs = json.loads((full / "trainer_state.json").read_text())["epoch"]
    assert epochs > 2, "the kill points need a later epoch"
    out = tmp_path / "killed"
    owner, name, replacement = KILL_POINTS[point](task)
    with monkeypatch.context() as patch:
        patch.setattr(owner, name, replacement)
        with pytest.raises(Killed):
            _train(out, flags)
    assert any(out.glob("checkpoint-*/trainer_state.json")), "the kill should leave a checkpoint to resume"
    _train(out, flags, "--resume_from_checkpoint", "last")

    assert _record(out) == _record(full)
    expected, actual = load_file(full / "model.safetensors"), load_file(out / "model.safetensors")
    assert expected.keys() == actual.keys()
    assert all(torch.equal(actual[key], expected[key]) for key in expected), point


@pytest.mark.usefixtures("shared_data")
def test_the_committed_resume_audit_is_what_the_records_and_data_give():
    """results/resume_audit.md lists every committed record that was resumed, and no language-model run among them
    had a row long enough for the old resume's left-hand cut to change it: regenerate it after adding runs."""
    from experiments import resume_audit

    assert resume_audit.DOCUMENT.read_text(encoding="utf-8") == resume_audit.document()
    assert "None of them could have been changed" in resume_audit.DOCUMENT.read_text(encoding="utf-8")
