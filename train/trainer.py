"""Trainer pieces: padding collators (with GEC word dropout) and token-budget batching.

:class:`TokenBudgetSeq2SeqTrainer` / :class:`TokenBudgetTrainer` replace the fixed-size batches of
the HF trainers by :class:`~ode_transformer.train.batching.TokenBudgetBatchSampler` batches (fairseq
``--max-tokens``) when ``max_tokens`` is set.

Distributed sharding, one mechanism: the sampler itself is rank-aware (``num_replicas`` = world
size, ``rank`` = process index), so every process gets different batches and the same number of
them; the ``BatchSamplerShard`` that ``accelerator.prepare`` wraps around any batch sampler is made
a pass-through (the same thing transformers does for its own rank-aware ``BatchRebalanceSampler``).

Epochs: the trainer calls ``set_epoch`` on the sampler, except when several processes resume in
the middle of an epoch: ``skip_first_batches`` then wraps ``SkipBatchSampler`` around the
``BatchSamplerShard`` and the trainer only reaches the latter, which has no ``set_epoch``. So
:class:`SamplerEpochCallback` also sets it at every epoch start from ``state.epoch``, which the
checkpoint restores. The order of batches is then a function of (seed, epoch) only, and a resumed
run sees exactly the batches the uninterrupted run would have seen.

Training stops at the first non-finite loss or gradient norm, before the optimizer step could spread it into
the weights, with an error naming the step and the learning rate (:meth:`_TokenBudgetMixin.training_step`).

Checkpoints are written aside and renamed into place, with the id of the run that wrote them
(:mod:`ode_transformer.checkpoints`): a kill during a save never leaves a ``checkpoint-<step>`` folder that
looks complete but is not.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import (
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    Seq2SeqTrainer,
    Trainer,
    TrainerCallback,
)
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from ode_transformer.checkpoints import RUN_ID_FILE, STAGING, TRAINER_STATE, new_run_id, publish
from ode_transformer.files import saving, write_atomic
from ode_transformer.tokenizer import tokenizer_sides

from . import metrics
from .batching import TokenBudgetBatchSampler
from .tasks import get_task

__all__ = [
    "PadCollator",
    "SamplerEpochCallback",
    "TokenBudgetSeq2SeqTrainer",
    "TokenBudgetTrainer",
    "fp32_forward",
    "lm_negative_log_likelihood",
    "build_seq2seq_compute_metrics",
    "word_dropout",
]

logger = logging.getLogger(__name__)


def word_dropout(
    token_ids: Sequence[int] | torch.Tensor,
    p: float,
    unk_id: int | None = None,
    generator: torch.Generator | None = None,
    keep_ids: Sequence[int] = (),
) -> list[int] | torch.Tensor:
    """Randomly drop (``unk_id=None``) or replace by ``unk_id`` each token with probability ``p``.

    The GEC setup of the paper applies it to the source side during training only. It works
    on the ids of one unpadded sequence (subword tokens, i.e. before padding in a collator);
    ids in ``keep_ids`` (e.g. ``</s>``) are never touched. Returns the same type as the input
    (list or 1-D tensor).
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    hit = torch.rand(ids.shape, generator=generator) < p
    if keep_ids:
        hit &= ~torch.isin(ids, torch.tensor(list(keep_ids), dtype=torch.long))
    out = ids[~hit] if unk_id is None else ids.masked_fill(hit, unk_id)
    return out if isinstance(token_ids, torch.Tensor) else out.tolist()


@dataclass
class PadCollator(DataCollatorForSeq2Seq):
    """transformers' :class:`~transformers.DataCollatorForSeq2Seq` (``input_ids`` padded with the tokenizer's pad
    id, with their ``attention_mask``; ``labels`` padded with -100) plus the paper's GEC source word dropout.

    Batches are padded on the right whatever the tokenizer's ``padding_side``: a causal LM's tokenizer pads on
    the left for generation, but in training its shifted labels would then make each row's first token a target
    predicted from padding.

    With ``word_dropout > 0`` each source token except ``</s>`` is dropped with that probability when
    ``training`` is true; the draw uses torch's global RNG, which the trainer seeds and restores on resume. The
    trainers below use a ``training=True`` copy for the training batches only, so evaluation and prediction never
    see dropped words. A batch without labels has no ``labels`` key.
    """

    word_dropout: float = 0.0
    training: bool = False

    def __call__(self, features: list[dict], return_tensors: str | None = None) -> dict[str, torch.Tensor]:
        if self.training and self.word_dropout > 0:
            keep = (self.tokenizer.eos_token_id,)
            features = [
                {**f, "input_ids": word_dropout(f["input_ids"], self.word_dropout, keep_ids=keep)}
                for f in features
            ]
        with tokenizer_sides(self.tokenizer, padding="right"):
            batch = super().__call__(features, return_tensors)
        if batch.get("labels") is None:
            del batch["labels"]
        return batch


class SamplerEpochCallback(TrainerCallback):
    """Set the token-budget sampler's epoch at every epoch start (also after a mid-epoch resume)."""

    def __init__(self, sampler: TokenBudgetBatchSampler) -> None:
        self.sampler = sampler

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(math.floor(state.epoch + 1e-6))
        return control


class _TokenBudgetMixin:
    """``get_train_dataloader`` with token-budget batches when ``max_tokens`` is set, and checkpoints that
    are written aside, then renamed into place, each with the ``run_id`` of the run (set it to continue a
    run; a new one is drawn at the first save otherwise)."""

    max_tokens: int | None = None
    length_column: str = "length"
    run_id: str | None = None
    _staging: Path | None = None

    def _get_output_dir(self, trial) -> str:
        return str(self._staging) if self._staging is not None else super()._get_output_dir(trial)

    def _load_callback_state(self) -> None:
        """On resume, early stopping counts on from the checkpoint's count of evaluations without improvement, with
        this run's patience and threshold. transformers restarts the count at 0 by default (so a run resumed
        after its best epoch trains past its stop), and `restore_callback_states_from_checkpoint` would bring back
        the checkpoint's patience as well."""
        super()._load_callback_state()
        saved = self.state.stateful_callbacks.get(EarlyStoppingCallback.__name__)
        if not isinstance(saved, dict):
            return
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, EarlyStoppingCallback):
                callback.early_stopping_patience_counter = saved["attributes"][
                    "early_stopping_patience_counter"
                ]

    def _save_checkpoint(self, model, trial) -> None:
        """The trainer's save, pointed at ``OUTPUT_DIR/.staging``; the folder is renamed into place once complete."""
        for callback in [*self.callback_handler.callbacks, self.control]:
            # a run resumed with a callback its checkpoint did not have (early stopping added): transformers
            # updates the saved state of each stateful callback by name, and fails on a missing one
            if isinstance(callback, ExportableState):
                self.state.stateful_callbacks.setdefault(type(callback).__name__, {})
        run_dir = Path(super()._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staged, final = run_dir / STAGING / name, run_dir / name
        if self.args.should_save:
            shutil.rmtree(staged, ignore_errors=True)  # left by a save that was interrupted
        self.accelerator.wait_for_everyone()
        self._staging = staged.parent
        try:
            with saving(staged):
                super()._save_checkpoint(model, trial)
        finally:
            self._staging = None
        if self.state.best_model_checkpoint == str(staged):
            self.state.best_model_checkpoint = str(final)
        self.accelerator.wait_for_everyone()  # every process has written its part
        self.run_id = self.run_id or new_run_id()
        if self.args.should_save:
            # again, with the final path of the best checkpoint
            self.state.save_to_json(str(staged / TRAINER_STATE))
            (staged / RUN_ID_FILE).write_text(self.run_id + "\n", encoding="utf-8")
            publish(staged, final)
            rotate_checkpoints(
                str(run_dir), self.args.save_total_limit, self.state.best_model_checkpoint, use_mtime=True
            )
        self.accelerator.wait_for_everyone()

    def save_metrics(self, split: str, metrics: dict, combined: bool = True) -> None:
        """transformers' ``save_metrics`` (``SPLIT_results.json``, merged into ``all_results.json``), each file
        written whole or not at all (:func:`ode_transformer.files.write_atomic`)."""
        if not self.is_world_process_zero():
            return
        out = Path(self.args.output_dir)
        write_atomic(out / f"{split}_results.json", json.dumps(metrics, indent=4, sort_keys=True))
        if combined:
            try:
                merged = json.loads((out / "all_results.json").read_text(encoding="utf-8"))
            except (FileNotFoundError, ValueError):
                merged = {}
            write_atomic(
                out / "all_results.json", json.dumps({**merged, **metrics}, indent=4, sort_keys=True)
            )

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._stop_if_diverged("loss", loss)
        return loss

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm)
        self._stop_if_diverged("gradient norm", grad_norm)
        return grad_norm

    def _stop_if_diverged(self, what: str, value: torch.Tensor | float | None) -> None:
        """Stop at a non-finite loss or gradient norm: one more optimizer step makes every weight NaN, and the
        trainer's logs would show a finite mean loss (it filters NaN out) while the run saves a dead model."""
        if value is None or math.isfinite(float(value)):
            return
        step = self.state.global_step + 1
        raise FloatingPointError(
            f"training diverged at step {step}: the {what} is {float(value)} (learning rate "
            f"{self._get_learning_rate():.3g}, --learning_rate {self.args.learning_rate:g}); train again with a "
            f"lower --learning_rate or more --warmup_steps. Nothing of step {step} was saved."
        )

    def get_train_dataloader(self) -> DataLoader:
        eval_collator = self.data_collator
        if isinstance(eval_collator, PadCollator):
            self.data_collator = replace(eval_collator, training=True)
        try:
            if not self.max_tokens or isinstance(self.train_dataset, torch.utils.data.IterableDataset):
                return super().get_train_dataloader()
            return self._token_budget_dataloader()
        finally:
            self.data_collator = eval_collator

    def _token_budget_dataloader(self) -> DataLoader:
        """Training batches from a rank-aware :class:`TokenBudgetBatchSampler`."""
        dataset = self._remove_unused_columns(self.train_dataset, description="training")
        sampler = TokenBudgetBatchSampler(
            self.train_dataset[self.length_column],
            self.max_tokens,
            shuffle=True,
            seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
            num_replicas=self.args.world_size,
            rank=self.args.process_index,
        )
        self._sync_sampler_callback(sampler)
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        prepared = self.accelerator.prepare(loader)
        shard = getattr(prepared, "batch_sampler", None)
        if shard is not None and getattr(shard, "batch_sampler", None) is sampler:
            shard.num_processes, shard.process_index = 1, 0  # the sampler is rank-aware already
        return prepared

    def _sync_sampler_callback(self, sampler: TokenBudgetBatchSampler) -> None:
        """Point the (single) :class:`SamplerEpochCallback` at this sampler."""
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, SamplerEpochCallback):
                callback.sampler = sampler
                return
        self.add_callback(SamplerEpochCallback(sampler))


class TokenBudgetSeq2SeqTrainer(_TokenBudgetMixin, Seq2SeqTrainer):
    """:class:`~transformers.Seq2SeqTrainer` with token-budget training batches (``max_tokens``).

    Its ``prediction_step`` leaves ``model.generation_config`` as it found it: transformers' fills in every
    default (``max_length=20`` next to ``max_new_tokens``...), which the saved model would then carry.
    """

    def __init__(self, *args, max_tokens: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_tokens = max_tokens

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        generation_config = copy.deepcopy(self.model.generation_config)
        try:
            return super().prediction_step(
                model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs
            )
        finally:
            self.model.generation_config = generation_config


class TokenBudgetTrainer(_TokenBudgetMixin, Trainer):
    """:class:`~transformers.Trainer` (language modelling) with token-budget training batches.

    Evaluation logs the validation NLL per token (``eval_loss``, nats, fp32) and its perplexity
    (``eval_perplexity``): the generic evaluation loop averages per-batch means weighted by
    sentences, which is not the per-token NLL when sentences differ in length. With
    ``load_best_model_at_end`` and ``metric_for_best_model: loss`` the best validation perplexity wins.
    """

    def __init__(self, *args, max_tokens: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_tokens = max_tokens

    def evaluate(
        self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        start = time.monotonic()
        total, count = lm_negative_log_likelihood(
            self.model, dataset, self.data_collator, self.args.per_device_eval_batch_size
        )
        nll = total / max(count, 1)
        results = {
            f"{metric_key_prefix}_loss": nll,
            f"{metric_key_prefix}_perplexity": metrics.perplexity(nll),
            f"{metric_key_prefix}_tokens": count,
            f"{metric_key_prefix}_runtime": round(time.monotonic() - start, 4),
        }
        self.log(results)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, results)
        return results


@contextmanager
def fp32_forward(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Inside this block ``model`` runs its class's own forward in fp32.

    Under bf16/fp16 training accelerate replaces the instance's ``forward`` by one that runs in autocast;
    evaluation and test decoding must not depend on the training precision. (accelerate's
    ``unwrap_model(keep_fp32_wrapper=False)`` strips every ``functools.wraps`` layer, transformers' own
    ``can_return_tuple`` included, so the instance attribute is set aside instead and restored after.)
    """
    wrapped = model.__dict__.pop("forward", None)
    try:
        with torch.autocast(model.device.type, enabled=False):
            yield model
    finally:
        if wrapped is not None:
            model.forward = wrapped


@torch.no_grad()
def lm_negative_log_likelihood(model, dataset, collator: PadCollator, batch_size: int) -> tuple[float, int]:
    """Summed next-token NLL (nats, no label smoothing, fp32) over ``dataset`` and the token count."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(dataset), batch_size):
        rows = dataset.select(range(start, min(start + batch_size, len(dataset))))
        batch = collator([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows])
        batch = {key: value.to(model.device) for key, value in batch.items()}
        with fp32_forward(model):
            logits = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).logits.float()
        targets = batch["labels"][:, 1:]
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)),
            targets.reshape(-1),
            ignore_index=-100,
            reduction="sum",
        )
        total += float(nll)
        count += int((targets != -100).sum())
    return total, count


def _decode(tokenizer, ids) -> list[str]:
    """Token ids (or logits) -> stripped strings; negative ids (-100 padding) become pad ids."""
    from ode_transformer.translate import decode

    if isinstance(ids, tuple):
        ids = ids[0]
    ids = np.asarray(ids)
    if ids.ndim == 3:
        ids = ids.argmax(axis=-1)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = np.where(ids < 0, pad_id, ids)
    return decode(tokenizer, ids.tolist())


def build_seq2seq_compute_metrics(tokenizer, task: str) -> Callable[[object], dict[str, float]]:
    """``compute_metrics`` for ``Seq2SeqTrainer(..., compute_metrics=...)`` with ``predict_with_generate=True``:
    the task's ``validation_metrics`` (:mod:`ode_transformer.train.tasks`), floats only.

    The returned callable takes an ``EvalPrediction`` (``predictions``: generated ids, possibly a tuple whose first
    item is the ids, padded with -100 or the pad id; ``label_ids``: padded with -100) and decodes both with
    ``tokenizer``. GEC's M2 and GLEU scores need the source sentences and the M2 file: they are computed on the test
    split, and by ``python -m ode_transformer.train.evaluate_predictions --task gec|gleu``. Mostly empty
    hypotheses are warned of (:func:`metrics.empty_hypotheses_warning`).
    """
    scores = get_task(task).validation_metrics
    if scores is None:
        raise ValueError(f"task {task!r} is not scored by generating")

    def compute_metrics(eval_prediction) -> dict[str, float]:
        hyps = _decode(tokenizer, eval_prediction.predictions)
        refs = _decode(tokenizer, eval_prediction.label_ids)
        if (warning := metrics.empty_hypotheses_warning(hyps, "validation hypotheses")) is not None:
            logger.warning(warning)
        return scores(hyps, refs)

    return compute_metrics
