"""Tests of ode_transformer.train.batching: token-budget batches, sharding, determinism, bucketing quality."""

from __future__ import annotations

import logging
import random
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader

from ode_transformer.files import read_lines
from ode_transformer.train.batching import TokenBudgetBatchSampler, seq2seq_lengths

MAX_TOKENS = 1024


@pytest.fixture(scope="module")
def multi30k_lengths(shared_data) -> list[int]:
    """Real lengths: whitespace tokens + </s> of Multi30k train, max over en and de."""
    folder = shared_data / "multi30k"
    en, de = read_lines(folder / "train.en.gz"), read_lines(folder / "train.de.gz")
    return seq2seq_lengths([len(s.split()) + 1 for s in en], [len(t.split()) + 1 for t in de])


def _all_batches(lengths, num_replicas, **kwargs) -> list[list[list[int]]]:
    samplers = [
        TokenBudgetBatchSampler(lengths, MAX_TOKENS, num_replicas=num_replicas, rank=r, **kwargs)
        for r in range(num_replicas)
    ]
    return [list(s) for s in samplers]


def _padding_fraction(batches: list[list[int]], lengths: list[int]) -> float:
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    return 1 - sum(lengths[i] for b in batches for i in b) / padded


def _greedy_random_batches(lengths: list[int], max_tokens: int, seed: int) -> list[list[int]]:
    """Independent reference: random order, same budget rule, no sorting."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    batches, batch = [], []
    for i in order:
        if batch and max(lengths[j] for j in [*batch, i]) * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch = []
        batch.append(i)
    return [*batches, batch]


@pytest.mark.parametrize("num_replicas", [1, 2, 3, 4])
def test_every_index_once_and_equal_batches_per_rank(multi30k_lengths, num_replicas):
    per_rank = _all_batches(multi30k_lengths, num_replicas, seed=3)
    counts = Counter(i for batches in per_rank for b in batches for i in b)
    assert len(counts) == len(multi30k_lengths) == 29000
    assert set(counts.values()) == {1}
    assert len({len(batches) for batches in per_rank}) == 1


def test_budget_respected_and_len_matches(multi30k_lengths):
    sampler = TokenBudgetBatchSampler(multi30k_lengths, MAX_TOKENS, seed=1)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert all(max(multi30k_lengths[i] for i in b) * len(b) <= MAX_TOKENS for b in batches)
    # the budget is used: batches are far bigger than one sample
    assert sum(len(b) for b in batches) / len(batches) > 20


def test_bucketing_reduces_padding(multi30k_lengths):
    bucketed = _padding_fraction(
        list(TokenBudgetBatchSampler(multi30k_lengths, MAX_TOKENS)), multi30k_lengths
    )
    random_batches = _padding_fraction(
        _greedy_random_batches(multi30k_lengths, MAX_TOKENS, 0), multi30k_lengths
    )
    assert random_batches > 0.3
    assert bucketed < 0.05
    assert bucketed < random_batches / 5


def test_lengths_within_a_batch_are_similar(multi30k_lengths):
    spreads = [
        max(multi30k_lengths[i] for i in b) - min(multi30k_lengths[i] for i in b)
        for b in TokenBudgetBatchSampler(multi30k_lengths, MAX_TOKENS)
    ]
    assert sorted(spreads)[len(spreads) // 2] <= 1  # median batch: lengths differ by <= 1 token


def test_deterministic_given_seed_and_epoch():
    lengths = [random.Random(0).randint(1, 60) for _ in range(3000)]
    a = TokenBudgetBatchSampler(lengths, 512, seed=7)
    b = TokenBudgetBatchSampler(lengths, 512, seed=7)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b) != first
    assert sorted(i for batch in list(a) for i in batch) == list(range(3000))
    assert list(TokenBudgetBatchSampler(lengths, 512, seed=8)) != first


def test_no_shuffle_yields_length_sorted_batches():
    lengths = [5, 1, 4, 2, 3, 1]
    batches = list(TokenBudgetBatchSampler(lengths, 4, shuffle=False))
    # stable sort: 1, 5 (length 1), 3 (2), 4 (3), 2 (4), 0 (5); [1, 5] pads to 2 tokens,
    # adding 3 would pad to 2 * 3 = 6 > 4, and every later sample alone fills most of the budget
    assert batches == [[1, 5], [3], [4], [2], [0]]


def test_too_long_sample_gets_own_batch_with_warning(caplog):
    lengths = [3, 3, 50, 3]
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.batching"):
        sampler = TokenBudgetBatchSampler(lengths, 10, seed=0)
    assert "1 sample(s) longer than max_tokens=10" in caplog.text
    batches = list(sampler)
    assert [2] in batches
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3]


def test_uneven_batches_are_split_not_duplicated():
    # 5 equal samples, budget for 4 -> [4 samples] + [1]; 3 ranks need a 3rd batch: split the big one
    samplers = [TokenBudgetBatchSampler([2] * 5, 8, num_replicas=3, rank=r) for r in range(3)]
    per_rank = [list(s) for s in samplers]
    assert [len(b) for b in per_rank] == [1, 1, 1]
    assert sorted(i for batches in per_rank for b in batches for i in b) == [0, 1, 2, 3, 4]


def test_fallback_repeat_or_drop_when_nothing_to_split():
    repeat = [list(TokenBudgetBatchSampler([5], 8, num_replicas=2, rank=r)) for r in range(2)]
    assert repeat == [[[0]], [[0]]]
    dropped = [
        list(TokenBudgetBatchSampler([5], 8, num_replicas=2, rank=r, drop_last=True)) for r in range(2)
    ]
    assert dropped == [[], []]


def test_works_as_dataloader_batch_sampler():
    lengths = [1, 2, 3, 4, 5, 6, 7, 8]
    data = [torch.full((n,), i) for i, n in enumerate(lengths)]
    loader = DataLoader(
        data,
        batch_sampler=TokenBudgetBatchSampler(lengths, 12, seed=0),
        collate_fn=lambda xs: torch.nn.utils.rnn.pad_sequence(xs, batch_first=True),
    )
    shapes = [batch.shape for batch in loader]
    assert all(rows * cols <= 12 for rows, cols in shapes)
    assert sum(rows for rows, _ in shapes) == 8


def test_invalid_arguments():
    with pytest.raises(ValueError, match="rank"):
        TokenBudgetBatchSampler([1, 2], 10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="max_tokens"):
        TokenBudgetBatchSampler([1, 2], 0)
    with pytest.raises(ValueError, match="source lengths"):
        seq2seq_lengths([1, 2], [1])
