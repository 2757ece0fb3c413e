"""Trainer pieces: padding collators (with GEC word dropout) and token-budget batching.

:class:`TokenBudgetSeq2SeqTrainer` / :class:`TokenBudgetTrainer` replace the fixed-size batches of
the HF trainers by :class:`~train.batching.TokenBudgetBatchSampler` batches (fairseq
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
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer, Trainer, TrainerCallback

from .batching import TokenBudgetBatchSampler
from .data import word_dropout

__all__ = [
    "PadCollator",
    "SamplerEpochCallback",
    "TokenBudgetSeq2SeqTrainer",
    "TokenBudgetTrainer",
]


def _pad(sequences: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    """Right-pad int sequences into a ``(batch, longest)`` long tensor."""
    longest = max(len(seq) for seq in sequences)
    out = torch.full((len(sequences), longest), value, dtype=torch.long)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return out


@dataclass
class PadCollator:
    """Pad ``input_ids`` (with ``pad_id``) and ``labels`` (with -100) of tokenised examples.

    With ``word_dropout > 0`` each source token except ``</s>`` is dropped with that probability
    (the paper's GEC setup) when ``training`` is true; the draw uses torch's global RNG, which the
    trainer seeds and restores on resume. The trainers below use a ``training=True`` copy for the
    training batches only, so evaluation and prediction never see dropped words.
    """

    pad_id: int
    eos_id: int
    word_dropout: float = 0.0
    training: bool = False

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        sources = [f["input_ids"] for f in features]
        if self.training and self.word_dropout > 0:
            sources = [word_dropout(ids, self.word_dropout, keep_ids=(self.eos_id,)) for ids in sources]
        input_ids = _pad(sources, self.pad_id)
        batch = {"input_ids": input_ids, "attention_mask": (input_ids != self.pad_id).long()}
        if "labels" in features[0]:
            batch["labels"] = _pad([f["labels"] for f in features], -100)
        return batch


class SamplerEpochCallback(TrainerCallback):
    """Set the token-budget sampler's epoch at every epoch start (also after a mid-epoch resume)."""

    def __init__(self, sampler: TokenBudgetBatchSampler) -> None:
        self.sampler = sampler

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(math.floor(state.epoch + 1e-6))
        return control


class _TokenBudgetMixin:
    """``get_train_dataloader`` with token-budget batches when ``max_tokens`` is set."""

    max_tokens: int | None = None
    length_column: str = "length"

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
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = generation_config


class TokenBudgetTrainer(_TokenBudgetMixin, Trainer):
    """:class:`~transformers.Trainer` (language modelling) with token-budget training batches."""

    def __init__(self, *args, max_tokens: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_tokens = max_tokens
