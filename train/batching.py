"""Token-budget batching (fairseq ``--max-tokens``) as a torch batch sampler.

Algorithm of :class:`TokenBudgetBatchSampler`, per epoch:

1. sort all indices by length (ties in a random order drawn from ``seed + epoch`` when
   shuffling, index order otherwise);
2. cut the sorted list greedily into batches while ``max_len_in_batch * n_samples <=
   max_tokens`` (the padded size of the batch);
3. if the number of batches is not a multiple of ``num_replicas``, split the batches with the
   most samples in two until it is (smaller batches stay within the budget), so every rank
   gets the same number of batches and every index is used exactly once per epoch; only when
   there are too few splittable batches are batches repeated (``drop_last=False``) or the
   last ones dropped (``drop_last=True``);
4. shuffle the batch order (``seed + epoch``) and give rank ``r`` the batches ``r::num_replicas``.

A sample longer than ``max_tokens`` is not dropped: it forms a batch of its own (over budget)
and a warning names how many there are; filter them beforehand to avoid memory spikes.
For seq2seq data pass ``max(source length, target length)`` per sample, see
:func:`seq2seq_lengths`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

__all__ = ["TokenBudgetBatchSampler", "seq2seq_lengths"]

logger = logging.getLogger(__name__)


def seq2seq_lengths(source_lengths: Sequence[int], target_lengths: Sequence[int]) -> list[int]:
    """Per-sample size for budgeting seq2seq batches: ``max(source, target)`` (as fairseq)."""
    if len(source_lengths) != len(target_lengths):
        raise ValueError(f"{len(source_lengths)} source lengths but {len(target_lengths)} target lengths")
    return [max(s, t) for s, t in zip(source_lengths, target_lengths)]


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of indices of similar length whose padded size fits ``max_tokens``.

    Args:
        lengths: length (tokens) of every sample.
        max_tokens: budget per batch in padded tokens (``max length * batch size``).
        shuffle: shuffle ties within lengths and the batch order, from ``seed + epoch``.
        seed: base seed; the same seed and epoch give the same batches.
        num_replicas: number of processes sharing the epoch.
        rank: this process, in ``[0, num_replicas)``.
        drop_last: when batches cannot be split into a multiple of ``num_replicas``, drop the
            surplus instead of repeating batches.

    Call :meth:`set_epoch` before each epoch (as for ``DistributedSampler``).
    """

    def __init__(
        self,
        lengths: Sequence[int] | torch.Tensor,
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ) -> None:
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.lengths = torch.as_tensor(lengths, dtype=torch.long)
        if self.lengths.ndim != 1 or len(self.lengths) == 0:
            raise ValueError("lengths must be a non-empty 1-D sequence")
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None
        n_long = int((self.lengths > max_tokens).sum())
        if n_long:
            logger.warning(
                "%d sample(s) longer than max_tokens=%d (longest: %d) get a batch of their own",
                n_long,
                max_tokens,
                int(self.lengths.max()),
            )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order is produced next."""
        self.epoch = epoch

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed + self.epoch)

    def _sorted_indices(self, generator: torch.Generator) -> list[int]:
        if self.shuffle:
            perm = torch.randperm(len(self.lengths), generator=generator)
            order = perm[torch.argsort(self.lengths[perm], stable=True)]
        else:
            order = torch.argsort(self.lengths, stable=True)
        return order.tolist()

    def _pack(self, order: list[int]) -> list[list[int]]:
        lengths = self.lengths.tolist()
        batches: list[list[int]] = []
        batch: list[int] = []
        longest = 0
        for index in order:
            new_longest = max(longest, lengths[index])
            if batch and new_longest * (len(batch) + 1) > self.max_tokens:
                batches.append(batch)
                batch, new_longest = [], lengths[index]
            batch.append(index)
            longest = new_longest
        batches.append(batch)
        return batches

    def _even_out(self, batches: list[list[int]]) -> list[list[int]]:
        """Make the batch count a multiple of ``num_replicas`` (splitting, else repeat/drop)."""
        missing = -len(batches) % self.num_replicas
        by_size = sorted(range(len(batches)), key=lambda i: -len(batches[i]))
        splittable = [i for i in by_size[:missing] if len(batches[i]) > 1]
        for i in splittable:
            half = len(batches[i]) // 2
            batches.append(batches[i][half:])
            batches[i] = batches[i][:half]
        missing -= len(splittable)
        if missing == 0:
            return batches
        if self.drop_last:
            return batches[: len(batches) - (self.num_replicas - missing)]
        return batches + [batches[i % len(batches)] for i in range(missing)]

    def _epoch_batches(self) -> list[list[int]]:
        """This epoch's batches, all ranks together, in their final order (cached per epoch)."""
        if self._cache is None or self._cache[0] != self.epoch:
            generator = self._generator()
            batches = self._even_out(self._pack(self._sorted_indices(generator)))
            if self.shuffle:
                batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
            self._cache = (self.epoch, batches)
        return self._cache[1]

    def __iter__(self) -> Iterator[list[int]]:
        yield from self._epoch_batches()[self.rank :: self.num_replicas]

    def __len__(self) -> int:
        return len(self._epoch_batches()) // self.num_replicas
