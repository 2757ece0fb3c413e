"""Score a file of system outputs and print the metrics as JSON.

Examples::

    python -m ode_transformer.train.evaluate_predictions --task translation --hyp out.de --ref newstest2014.de.gz \\
        --tokenized-bleu
    python -m ode_transformer.train.evaluate_predictions --task summarization --hyp out.txt --ref val.target.gz
    python -m ode_transformer.train.evaluate_predictions --task gec --hyp out.txt --m2 conll2013.test.m2.gz
    python -m ode_transformer.train.evaluate_predictions --task gleu --hyp out.txt --src dev.src.gz \\
        --ref dev.ref0.gz --ref dev.ref1.gz --ref dev.ref2.gz --ref dev.ref3.gz

Files are UTF-8, one segment per line, optionally gzip-compressed (``.gz``). ``--task`` is a task of
``ode-train`` that generates (its record in :mod:`ode_transformer.train.tasks` says how it is scored), or
``gleu``:

* ``translation``: SacreBLEU (``--tokenize``, default 13a) and chrF with their signatures;
  ``--tokenized-bleu`` adds the paper's tokenized BLEU with compound splitting (Moses
  tokenizer for ``--lang``, default ``de``).
* ``summarization``: ROUGE-1/2/L/Lsum F1 (one ``--ref``).
* ``gec``: M2 precision / recall / F0.5 against ``--m2`` (optionally ``--src`` is checked
  against the M2 source sentences).
* a task whose record names no scorer: its validation metrics against one ``--ref``.
* ``gleu``: JFLEG GLEU against ``--src`` and one or more ``--ref``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable

from sacrebleu.metrics.bleu import BLEU

from ode_transformer.cli import output_problem, program_name, report_user_error
from ode_transformer.files import lock_output, read_lines, write_atomic

from .metrics import (
    chrf_score,
    empty_hypotheses_warning,
    gleu_score,
    m2_score,
    parse_m2,
    sacrebleu_score,
    tokenized_bleu,
)
from .tasks import TASKS, Task

logger = logging.getLogger(__name__)

Scorer = Callable[[argparse.Namespace, list[str]], dict]
"""(the command line, the hypotheses) -> the JSON's metrics."""


class UsageError(Exception):
    """A problem with the command line or the input files, reported without a traceback."""


def _check_counts(hyp_path: str, hyps: list[str], others: dict[str, list]) -> None:
    for path, items in others.items():
        if len(items) != len(hyps):
            raise UsageError(
                f"line counts differ: {hyp_path} has {len(hyps)} lines but {path} has {len(items)}"
            )


def _require(args: argparse.Namespace, *names: str) -> None:
    missing = [f"--{name}" for name in names if not getattr(args, name)]
    if missing:
        raise UsageError(f"--task {args.task} needs {' and '.join(missing)}")


def _sacrebleu(args: argparse.Namespace, hyps: list[str]) -> dict:
    _require(args, "ref")
    refs = {path: read_lines(path) for path in args.ref}
    _check_counts(args.hyp, hyps, refs)
    streams = list(refs.values())
    bleu = sacrebleu_score(hyps, streams, tokenize=args.tokenize)
    chrf = chrf_score(hyps, streams)
    metrics = {
        "bleu": bleu["score"],
        "bleu_signature": bleu["signature"],
        "chrf": chrf["score"],
        "chrf_signature": chrf["signature"],
    }
    if args.tokenized_bleu:
        tok = tokenized_bleu(hyps, streams, lang=args.lang)
        metrics |= {"tokenized_bleu": tok["score"], "tokenized_bleu_signature": tok["signature"]}
    return metrics


def _validation_metrics(task: Task) -> Scorer:
    """``task``'s validation metrics against one ``--ref``."""

    def score(args: argparse.Namespace, hyps: list[str]) -> dict:
        _require(args, "ref")
        if len(args.ref) != 1:
            raise UsageError(f"--task {args.task} takes exactly one --ref")
        refs = read_lines(args.ref[0])
        _check_counts(args.hyp, hyps, {args.ref[0]: refs})
        return task.validation_metrics(hyps, refs)

    return score


def _m2(args: argparse.Namespace, hyps: list[str]) -> dict:
    _require(args, "m2")
    sentences = parse_m2(read_lines(args.m2), args.m2)
    _check_counts(args.hyp, hyps, {args.m2: sentences})
    if args.src:
        sources = read_lines(args.src)
        _check_counts(args.hyp, hyps, {args.src: sources})
        for number, (line, sentence) in enumerate(zip(sources, sentences), start=1):
            if line.split() != sentence.source:
                raise UsageError(f"{args.src} line {number} differs from the source sentence in {args.m2}")
    return m2_score(
        hyps,
        sentences,
        beta=args.beta,
        max_unchanged_words=args.max_unchanged_words,
        ignore_case=args.ignore_case,
    )


def _gleu(args: argparse.Namespace, hyps: list[str]) -> dict:
    _require(args, "src", "ref")
    sources = read_lines(args.src)
    refs = {path: read_lines(path) for path in args.ref}
    _check_counts(args.hyp, hyps, {args.src: sources, **refs})
    return gleu_score(sources, hyps, list(refs.values()))


SCORERS: dict[str, Scorer] = {"sacrebleu": _sacrebleu, "m2": _m2}
"""The scorers a task record names (``Task.scorer``)."""
OTHER_SCORES: dict[str, Scorer] = {"gleu": _gleu}
"""What ``--task`` scores beside the tasks: JFLEG's GLEU, which scores a GEC system's outputs against their sources
as well as the references, and is no task of ``ode-train``."""


def scorers() -> dict[str, Scorer]:
    """What each ``--task`` is scored by: every task with outputs to score, as its record says, then
    :data:`OTHER_SCORES`."""
    by_task = {
        name: SCORERS[task.scorer] if task.scorer else _validation_metrics(task)
        for name, task in TASKS.items()
        if task.scorer or task.validation_metrics
    }
    return {**by_task, **OTHER_SCORES}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name(__spec__.name),
        description="Score system outputs (one segment per line; .gz accepted) and print JSON metrics.",
    )
    parser.add_argument("--task", required=True, choices=list(scorers()))
    parser.add_argument("--hyp", required=True, help="system outputs")
    parser.add_argument("--ref", action="append", help="reference file (repeat for several references)")
    parser.add_argument("--src", help="source sentences (gleu; for gec, checked against the M2 file)")
    parser.add_argument("--m2", help="gold M2 file (gec)")
    parser.add_argument(
        "--tokenize", default="13a", choices=list(BLEU.TOKENIZERS), help="sacrebleu tokenizer (translation)"
    )
    parser.add_argument("--tokenized-bleu", action="store_true", help="add tokenized BLEU, compound-split")
    parser.add_argument("--lang", default="de", help="Moses tokenizer language for --tokenized-bleu")
    parser.add_argument("--beta", type=float, default=0.5, help="F-beta of the M2 scorer")
    parser.add_argument("--max-unchanged-words", type=int, default=2, help="M2 edit merging limit")
    parser.add_argument("--ignore-case", action="store_true", help="case-insensitive M2 scoring")
    parser.add_argument("--output", help="also write the JSON to this file ('-': standard output only)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    inputs = {"--hyp": args.hyp, "--ref": args.ref, "--src": args.src, "--m2": args.m2}
    if (problem := output_problem(args.output, inputs)) is not None:
        parser.error(problem)
    try:
        hyps = read_lines(args.hyp)
        if not hyps:  # sacrebleu fails on it, ROUGE would score it 0
            raise UsageError(f"{args.hyp} has no lines: nothing to score")
        if (warning := empty_hypotheses_warning(hyps, f"hypotheses in {args.hyp}")) is not None:
            logger.warning(warning)
        metrics = scorers()[args.task](args, hyps)
    except (UsageError, OSError, ValueError) as error:  # bad input: a message, not a traceback
        return report_user_error(__spec__.name, error)
    text = json.dumps(metrics, indent=2, ensure_ascii=False)
    print(text)
    if args.output not in (None, "-"):  # '-' is standard output, where the JSON already went
        try:
            with lock_output(args.output, "--output"):  # one writer; the file whole or not at all
                write_atomic(args.output, text + "\n")
        except OSError as error:  # another process writes it, a full disk
            return report_user_error(__spec__.name, error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
