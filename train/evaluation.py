"""Evaluation and outputs: the test split's scores (perplexity, sacreBLEU and chrF, ROUGE, M2), the hypotheses,
``hub_metrics.json``, the loss curves and the model card."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from datasets import Dataset

from ode_transformer.files import read_lines, real_path, write_atomic
from ode_transformer.translate import decode, generate_ids

from . import metrics
from .card import write_card
from .tasks import get_task
from .trainer import PadCollator, fp32_forward, lm_negative_log_likelihood

logger = logging.getLogger(__name__)


def lm_test_results(model, test: Dataset, raw_test: Dataset, collator: PadCollator, batch_size: int) -> dict:
    """Perplexity per subword token and per word (the sentence log-probability over words + ``</s>``)."""
    total, count = lm_negative_log_likelihood(model, test, collator, batch_size)
    words = sum(len(text.split()) + 1 for text in raw_test["text"])
    return {
        "nll_per_token": total / max(count, 1),
        "perplexity": metrics.perplexity(total / max(count, 1)),
        "word_perplexity": metrics.perplexity(total / words),
        "tokens": count,
        "words": words,
    }


def seq2seq_test_results(task: str, hyps: list[str], raw_test: Dataset, m2_file: str | None) -> list[dict]:
    """Metric records (hub schema ``results``) of the test hypotheses: against the M2 file for an M2-scored task
    given one, else the task's ``test_records`` against the raw references; mostly empty hypotheses are warned
    of."""
    if (warning := metrics.empty_hypotheses_warning(hyps, "test hypotheses")) is not None:
        logger.warning(warning)
    task = get_task(task)
    if task.m2_scored and m2_file:
        # --max_test_samples: the first ones
        sentences = metrics.parse_m2(read_lines(m2_file), m2_file)[: len(hyps)]
        m2 = metrics.m2_score(hyps, sentences)
        return [
            {"metric": "precision", "name": "M2 precision", "value": m2["precision"]},
            {"metric": "recall", "name": "M2 recall", "value": m2["recall"]},
            {"metric": "f0.5", "name": "M2 F0.5", "value": m2["f0.5"]},
        ]
    return task.test_records(hyps, [text.strip() for text in raw_test["target"]])


def test_results(
    task: str, trainer, tokenizer, test, raw_test, m2_file, collator
) -> tuple[list[dict], list[str]]:
    """Metric records for the test split and the hypotheses (empty for lm), on the main process only.

    Seq2seq hypotheses come from :func:`ode_transformer.translate.generate_ids` on the plain model in fp32, the
    decoder of ``python -m ode_transformer.translate`` and the same hypotheses plain ``model.generate`` gives: not
    from ``trainer.predict``, whose model runs under accelerate's bf16 autocast wrapper when ``--bf16``.
    """
    training_args = trainer.args
    if not trainer.is_world_process_zero():
        return [], []
    model = trainer.accelerator.unwrap_model(trainer.model)
    if get_task(task).is_lm:
        scores = lm_test_results(model, test, raw_test, collator, training_args.per_device_eval_batch_size)
        return [
            {"metric": "perplexity", "name": "Word perplexity", "value": scores["word_perplexity"]},
            {"metric": "perplexity", "name": "Subword perplexity", "value": scores["perplexity"]},
        ], []
    with fp32_forward(model):
        ids = generate_ids(
            model,
            test["input_ids"],
            batch_size=training_args.per_device_eval_batch_size,
            progress=not training_args.disable_tqdm,
        )
    hyps = decode(tokenizer, ids)
    return seq2seq_test_results(task, hyps, raw_test, m2_file), hyps


def keep_training_record(document: dict, output_dir: str, model_name_or_path: str | None) -> dict:
    """``document`` with the ``training`` record (and base model) of ``OUTPUT_DIR/hub_metrics.json`` where an
    evaluation (``--do_train false``) scores the folder's own model into it, replacing its results
    (``--overwrite_output_dir``): what training wrote stays, and the card is written again from the new scores, so
    that the card never shows scores the metrics file no longer holds. Another model's evaluation keeps nothing of
    the folder's run."""
    if not model_name_or_path or real_path(model_name_or_path) != real_path(output_dir):
        return document
    try:
        old = json.loads((Path(output_dir) / "hub_metrics.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return document
    kept = {key: old[key] for key in ("training", "base_model") if isinstance(old, dict) and key in old}
    return {**document, **kept}


def write_outputs(output_dir: str, trainer, document: dict, hyps: list[str]) -> None:
    """Hypotheses and metrics JSON; for a trained model (``training`` in ``document``) also the model card, and
    the loss curves after training."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if hyps:
        write_atomic(out / "test_hypotheses.txt", "".join(h + "\n" for h in hyps))
    write_atomic(out / "hub_metrics.json", json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    scores = {record.get("name", record["metric"]): record["value"] for record in document["results"]}
    split = document["dataset"]["split"]
    if not split.startswith("test"):  # the data had no test split: named after the split that was scored
        scores["split"] = split
    trainer.log_metrics("test", scores)
    trainer.save_metrics("test", scores)
    if "training" not in document:
        logger.info(
            "model card: python -m ode_transformer.hub.model_card MODEL_DIR %s", out / "hub_metrics.json"
        )
        return
    if trainer.args.do_train:  # an evaluation has no curves: the run's own stay
        from .plots import plot_loss_curves

        plot_loss_curves(trainer.state.log_history, out / "loss_curves.png")
    write_card(output_dir, document)
