"""Joint (source+target) BPE tokenizer trained with :mod:`tokenizers`, saved for ``AutoTokenizer``.

Design:

* special tokens in fairseq order: ``<s>`` = 0, ``<pad>`` = 1, ``</s>`` = 2, ``<unk>`` = 3;
* NFKC normalisation, then byte-level pre-tokenisation (GPT-2/BART style, no prefix space):
  every byte is in the base alphabet, so ``<unk>`` never occurs and
  ``decode(encode(x)) == x`` for any NFKC-normalised text (umlauts, ``ș``, emoji, ...);
* the post-processor appends ``</s>`` to every encoded sequence (``$A </s>``; pairs
  ``$A </s> $B </s>``), as fairseq does for source and target; a causal LM's tokenizer (``causal=True``)
  prepends ``<s>`` instead and appends nothing (``<s> $A``), so a prompt is continued, not ended;
* ``vocab_size`` is the final vocabulary size (specials + 256 bytes + merges): the paper's
  32K merges correspond to ``vocab_size`` ~ 32.3K; use a few thousand for small corpora.

The result is a :class:`transformers.PreTrainedTokenizerFast` with pad/bos/eos/unk set and
``clean_up_tokenization_spaces=False`` (tokenised GEC text like ``word .`` must round-trip).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

__all__ = ["SPECIAL_TOKENS", "load_or_train_tokenizer", "train_tokenizer", "training_texts"]

SPECIAL_TOKENS: tuple[str, ...] = ("<s>", "<pad>", "</s>", "<unk>")
"""Special tokens, in id order (fairseq dictionary order)."""
BOS, PAD, EOS, UNK = SPECIAL_TOKENS


def training_texts(dataset: Dataset, columns: Sequence[str] = ("source", "target")) -> Iterator[str]:
    """Yield the texts of ``columns`` of ``dataset`` (source and target for a joint vocabulary)."""
    for column in columns:
        yield from dataset[column]


def _post_processor(tokenizer: Tokenizer, causal: bool) -> processors.TemplateProcessing:
    if causal:
        return processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
        )
    return processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, tokenizer.token_to_id(EOS))]
    )


def _build_backend(texts: Iterable[str], vocab_size: int, min_frequency: int, causal: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.post_processor = _post_processor(tokenizer, causal)
    return tokenizer


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    save_to: str | os.PathLike | None = None,
    causal: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a joint byte-level BPE on ``texts`` (see the module docstring for the design).

    Args:
        texts: training sentences (source and target sides together).
        vocab_size: final vocabulary size, special tokens and the 256 byte symbols included.
        min_frequency: minimum pair frequency for a merge.
        save_to: folder to save it in (``save_pretrained``), loadable with ``AutoTokenizer``.
        causal: a causal LM's tokenizer: ``<s>`` before every sequence, no ``</s>`` after it.
    """
    if vocab_size <= len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for merges (specials + 256 bytes)")
    backend = _build_backend(texts, vocab_size, min_frequency, causal)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )
    if save_to is not None:
        tokenizer.save_pretrained(str(save_to))
    return tokenizer


def load_or_train_tokenizer(
    folder: str | os.PathLike | None,
    texts: Iterable[str] | None,
    vocab_size: int,
    min_frequency: int = 2,
    causal: bool = False,
) -> PreTrainedTokenizerFast:
    """Load the tokenizer saved in ``folder`` if there is one, else train it on ``texts``.

    A newly trained tokenizer is saved in ``folder`` when a folder is given, so the next call
    reuses it (``texts``, ``vocab_size`` and ``causal`` are then ignored).
    """
    if folder is not None and (Path(folder) / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(folder))
    if texts is None:
        raise ValueError(f"no tokenizer in {folder} and no texts to train one on")
    return train_tokenizer(texts, vocab_size, min_frequency, save_to=folder, causal=causal)
