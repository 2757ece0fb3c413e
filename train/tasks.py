"""The tasks a run trains for, one `Task` record each: every module that differs by task reads its record.

A record says what the task's data is (a language model's text, or source and target pairs, and where its test
split comes from when the data has none), how its outputs are scored (during training, and on the test split for
the model card), how the paper decodes it, and how its model card names it. Adding a task is one entry in `TASKS`
and its test (tests/test_tasks.py adds a toy one and runs it end to end).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ode_transformer.decoding import PAPER_TRANSLATION_DECODING

from . import metrics

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["DEFAULT_TASK", "TASKS", "Task", "get_task"]

Scores = Callable[[list[str], list[str]], dict[str, float]]
"""(hypotheses, references) -> named scores."""
Records = Callable[[list[str], list[str]], list[dict]]
"""(hypotheses, references) -> the model card's result records (``metric``, ``name``, ``value``, ...)."""


@dataclass(frozen=True)
class Task:
    """One task of ``--task``.

    Attributes:
        name: the value of ``--task``.
        kind: ``lm`` (a decoder-only model on ``text``) or ``seq2seq`` (an encoder-decoder on ``source`` and
            ``target``).
        hub_tag: the model card's ``task``, a Hub pipeline tag.
        metric_names: what ``validation_metrics`` returns, reported as ``eval_NAME`` by an evaluation that
            generates; what ``--metric_for_best_model`` can pick beside the loss.
        validation_metrics: the scores of an evaluation during training (``--predict_with_generate``).
        test_records: the test split's scores, as the model card's result records.
        num_beams, length_penalty: the paper's decoding (Appendix, table "dataset"); None for a language model.
        language_pair: the card names the source and target languages (``--source_lang``, ``--target_lang``).
        test_split: the test split and its M2 file when the data has no test split; None: the validation split.
        m2_scored: an M2 file (``--m2_file``, or ``test_split``'s) scores the test split: M2 precision, recall and
            F0.5 in place of ``test_records``.
        scorer: how ``ode-evaluate --task NAME`` scores a file of outputs: one of its named scorers (``SCORERS`` of
            :mod:`ode_transformer.train.evaluate_predictions`); None: ``validation_metrics`` against one ``--ref``.
            A language model has no outputs to score there.
        scoring_packages: the packages its scores import when they are computed (:mod:`.metrics` imports them
            late), imported at a run's start so that a missing one stops it before training, not at its first
            evaluation.
    """

    name: str
    kind: Literal["seq2seq", "lm"]
    hub_tag: str
    metric_names: tuple[str, ...] = ()
    validation_metrics: Scores | None = None
    test_records: Records | None = None
    num_beams: int | None = None
    length_penalty: float | None = None
    language_pair: bool = False
    test_split: Callable[[str | None], tuple[Dataset, Path]] | None = None
    m2_scored: bool = False
    scorer: str | None = None
    scoring_packages: tuple[str, ...] = ()

    @property
    def is_lm(self) -> bool:
        return self.kind == "lm"

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns of its raw splits."""
        return ("text",) if self.is_lm else ("source", "target")

    def evaluated(self, generate: bool) -> tuple[str, ...]:
        """What an evaluation during training reports, without the ``eval_`` prefix: the loss; a language model's
        perplexity; a seq2seq task's metrics only when each evaluation generates (``--predict_with_generate``)."""
        if self.is_lm:
            return ("loss", "perplexity")
        return ("loss", *(self.metric_names if generate else ()))

    @property
    def paper_decoding(self) -> dict[str, int | float]:
        """The paper's beam size and length penalty (empty for a language model)."""
        if self.num_beams is None:
            return {}
        return {"num_beams": self.num_beams, "length_penalty": self.length_penalty}


def _bleu_chrf(hyps: list[str], refs: list[str]) -> dict[str, float]:
    return {
        "bleu": metrics.sacrebleu_score(hyps, refs)["score"],
        "chrf": metrics.chrf_score(hyps, refs)["score"],
    }


def _bleu_chrf_exact(hyps: list[str], refs: list[str]) -> dict[str, float]:
    return {**_bleu_chrf(hyps, refs), "exact_match": metrics.exact_match(hyps, refs)}


def _bleu_chrf_records(hyps: list[str], refs: list[str]) -> list[dict]:
    bleu, chrf = metrics.sacrebleu_score(hyps, refs), metrics.chrf_score(hyps, refs)
    return [
        {"metric": "sacrebleu", "name": "BLEU", "value": bleu["score"], "signature": bleu["signature"]},
        {"metric": "chrf", "name": "chrF", "value": chrf["score"], "signature": chrf["signature"]},
    ]


def _rouge_records(hyps: list[str], refs: list[str]) -> list[dict]:
    scores = metrics.rouge_scores(hyps, refs)
    return [{"metric": "rouge", "name": key.upper(), "value": value} for key, value in scores.items()]


def _conll2013_test(data_dir: str | None) -> tuple[Dataset, Path]:
    from .data import conll2013_test  # datasets is imported where a corpus is read

    return conll2013_test(data_dir)


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            "translation",
            "seq2seq",
            hub_tag="translation",
            metric_names=("bleu", "chrf"),
            validation_metrics=_bleu_chrf,
            test_records=_bleu_chrf_records,
            # num_beams and length_penalty, shared with ode-export (hub/ imports no train/ module)
            **PAPER_TRANSLATION_DECODING,
            language_pair=True,
            scorer="sacrebleu",
        ),
        Task(
            "summarization",
            "seq2seq",
            hub_tag="summarization",
            metric_names=metrics.ROUGE_TYPES,
            validation_metrics=metrics.rouge_scores,
            test_records=_rouge_records,
            num_beams=4,
            length_penalty=2.0,
            scoring_packages=("rouge_score.rouge_scorer",),
        ),
        Task(
            "gec",
            "seq2seq",
            hub_tag="text2text-generation",
            metric_names=("bleu", "chrf", "exact_match"),
            validation_metrics=_bleu_chrf_exact,
            test_records=_bleu_chrf_records,
            num_beams=6,
            length_penalty=0.6,
            test_split=_conll2013_test,
            m2_scored=True,
            scorer="m2",
        ),
        Task("lm", "lm", hub_tag="text-generation"),
    )
}
DEFAULT_TASK = "translation"
"""``--task``'s default."""


def get_task(name: str) -> Task:
    """The record of ``--task NAME``.

    Raises:
        ValueError: an unknown name, with the known ones.
    """
    if name not in TASKS:
        raise ValueError(f"--task must be one of {tuple(TASKS)}, got {name!r}")
    return TASKS[name]
