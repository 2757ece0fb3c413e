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

``kind="word"`` builds a word-level vocabulary instead (whitespace-split words, the most frequent
``vocab_size`` symbols including the specials, everything else ``<unk>``): the paper's Penn Treebank
setting, whose text is already tokenised, lower-cased and ``<unk>``-replaced to 10k words.

The result is a :class:`transformers.PreTrainedTokenizerFast` with pad/bos/eos/unk set and
``clean_up_tokenization_spaces=False`` (tokenised GEC text like ``word .`` must round-trip).
A tokenizer saved by :func:`train_tokenizer` has a record, ``tokenizer_training.json`` (vocabulary
size asked for, ``min_frequency``, number and SHA-256 of the training texts), which
:func:`load_or_train_tokenizer` compares with what it is asked before it reuses the tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from modeling_ode.compat import forget_auto_class

from .files import saving, write_atomic

__all__ = [
    "JSON_TOKENIZER_FILES",
    "SPECIAL_TOKENS",
    "TOKENIZER_KINDS",
    "TRAINING_RECORD",
    "check_tokenizer_files",
    "check_vocabulary_size",
    "drop_foreign_tokenizer_code",
    "load_or_train_tokenizer",
    "own_tokenizer_config",
    "tokenizer_sides",
    "train_tokenizer",
    "truncated_rows",
]

logger = logging.getLogger(__name__)

SPECIAL_TOKENS: tuple[str, ...] = ("<s>", "<pad>", "</s>", "<unk>")
"""Special tokens, in id order (fairseq dictionary order)."""
BOS, PAD, EOS, UNK = SPECIAL_TOKENS
TOKENIZER_KINDS: tuple[str, ...] = ("bpe", "word")
"""``bpe``: joint byte-level BPE; ``word``: word-level vocabulary of whitespace-split words."""
TRAINING_RECORD = "tokenizer_training.json"
"""What a saved tokenizer was trained with (next to its ``tokenizer.json``)."""
JSON_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)
"""The JSON files of a saved tokenizer that :func:`check_tokenizer_files` reads."""


class _TextsDigest:
    """Passes texts through while counting them and hashing them (SHA-256, a NUL after each text)."""

    def __init__(self, texts: Iterable[str]) -> None:
        self.texts, self.count, self.hash = texts, 0, hashlib.sha256()

    def __iter__(self) -> Iterator[str]:
        for text in self.texts:
            self.count += 1
            self.hash.update(text.encode("utf-8") + b"\0")
            yield text

    def consume(self) -> _TextsDigest:
        for _ in self:
            pass
        return self

    def summary(self) -> dict:
        return {"texts": self.count, "texts_sha256": self.hash.hexdigest()}


def _post_processor(tokenizer: Tokenizer, causal: bool) -> processors.TemplateProcessing:
    if causal:
        return processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
        )
    return processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, tokenizer.token_to_id(EOS))]
    )


def _build_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int) -> Tokenizer:
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
    return tokenizer


def _build_word_level(texts: Iterable[str], vocab_size: int, min_frequency: int) -> Tokenizer:
    # The vocabulary is counted here rather than by `trainers.WordLevelTrainer`, which counts a literal
    # special token in the text (PTB's `<unk>`) as a word again and leaves a hole at the special's id.
    counts = Counter(word for text in texts for word in text.split())
    words = [w for w, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])) if n >= min_frequency]
    words = [w for w in words if w not in SPECIAL_TOKENS][: max(vocab_size - len(SPECIAL_TOKENS), 0)]
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # no decoder: decode joins words with spaces
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


_BUILDERS = {"bpe": _build_bpe, "word": _build_word_level}
# A merge needs a pair seen twice; a word-level vocabulary keeps every word up to its size (PTB's train split has
# 30 words seen once, all in its first line, which are in the paper's 10k vocabulary).
DEFAULT_MIN_FREQUENCY = {"bpe": 2, "word": 1}


def _min_frequency(kind: str, min_frequency: int | None) -> int:
    return DEFAULT_MIN_FREQUENCY.get(kind, 2) if min_frequency is None else min_frequency


def _build_backend(
    texts: Iterable[str], vocab_size: int, min_frequency: int, kind: str, causal: bool
) -> Tokenizer:
    if kind not in _BUILDERS:
        raise ValueError(f"tokenizer kind must be one of {TOKENIZER_KINDS}, got {kind!r}")
    tokenizer = _BUILDERS[kind](texts, vocab_size, min_frequency)
    tokenizer.post_processor = _post_processor(tokenizer, causal)
    return tokenizer


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int | None = None,
    save_to: str | os.PathLike | None = None,
    kind: str = "bpe",
    causal: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a joint byte-level BPE (or, ``kind="word"``, a word-level vocabulary) on ``texts``.

    Args:
        texts: training sentences (source and target sides together).
        vocab_size: final vocabulary size, special tokens (and for BPE the 256 byte symbols) included.
        min_frequency: minimum pair frequency for a merge (BPE, default 2), minimum word count (word level,
            default 1: every word, up to ``vocab_size``).
        save_to: folder to save it in (``save_pretrained``), loadable with ``AutoTokenizer``.
        kind: ``"bpe"`` or ``"word"`` (see the module docstring).
        causal: a causal LM's tokenizer: ``<s>`` before every sequence, no ``</s>`` after it.
    """
    if kind == "bpe" and vocab_size <= len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for merges (specials + 256 bytes)")
    min_frequency = _min_frequency(kind, min_frequency)
    digest = _TextsDigest(texts)
    backend = _build_backend(digest, vocab_size, min_frequency, kind, causal)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )
    if save_to is not None:
        record = {
            "kind": kind,
            "causal": causal,
            "vocab_size": vocab_size,
            "min_frequency": min_frequency,
            **digest.summary(),
        }
        _save_whole(tokenizer, Path(save_to), record)
    return tokenizer


def _save_whole(tokenizer: PreTrainedTokenizerFast, folder: Path, record: dict) -> None:
    """Save ``tokenizer`` and its training ``record`` in ``folder``, each file whole: written in a temporary
    folder beside it, then renamed in, ``tokenizer.json`` last (its presence is what makes the folder's
    tokenizer reused; a kill before it leaves the folder to train again)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".saving-") as temporary:
        with saving(folder):
            tokenizer.save_pretrained(temporary)
            (Path(temporary) / TRAINING_RECORD).write_text(
                json.dumps(record, indent=2) + "\n", encoding="utf-8"
            )
        for file in sorted(Path(temporary).iterdir(), key=lambda path: path.name == "tokenizer.json"):
            os.replace(file, folder / file.name)


def resave_trained_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: str | os.PathLike) -> None:
    """Save ``tokenizer`` (refitted: its run's length) over the one trained in ``folder``, its training record
    kept, each file whole, so that the folder and the model's tokenizer say one length. A folder without a record
    (a tokenizer not trained here) is left as it is."""
    record_path = Path(folder) / TRAINING_RECORD
    if record_path.is_file():
        _save_whole(tokenizer, Path(folder), json.loads(record_path.read_text(encoding="utf-8")))


def check_tokenizer_files(folder: str | os.PathLike) -> None:
    """Refuse a folder whose tokenizer files are cut off or not JSON text (a copy interrupted, a file overwritten),
    naming the file: transformers reports only where its parser stopped ("Expecting ',' delimiter: line 267") or
    the byte it could not decode.

    Raises:
        ValueError: the file, what is wrong with it, and the fix.
    """
    for name in JSON_TOKENIZER_FILES:
        path = Path(folder) / name
        if not path.is_file():
            continue
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            what = (
                "not UTF-8 text"
                if isinstance(error, UnicodeDecodeError)
                else f"not valid JSON ({error.msg} at line {error.lineno} column {error.colno}: cut off or damaged)"
                if isinstance(error, json.JSONDecodeError)
                else str(error)
            )
            raise ValueError(
                f"{path} is {what}; copy it again from the folder the tokenizer was saved in (ode_transformer.train.run writes "
                "tokenizer.json and tokenizer_config.json beside model.safetensors)"
            ) from None


STANDARD_TOKENIZER_CLASS = PreTrainedTokenizerFast.__name__
"""The class a saved ``tokenizer_config.json`` names: transformers' own fast tokenizer over ``tokenizer.json``
(this project has no tokenizer class of its own), so the tokenizer's own files name no code to run. The name is
the one transformers writes for it: ``TokenizersBackend`` in transformers 5, where ``PreTrainedTokenizerFast`` is
that class's other name.
``AutoTokenizer.from_pretrained(folder)`` still reads ``config.json`` first (transformers 5.24), whose ``auto_map``
is the model's remote code: it asks for ``trust_remote_code`` unless given; ``PreTrainedTokenizerFast.from_pretrained``
or ``trust_remote_code=False`` loads the tokenizer without it."""


def _library_class(name: object) -> bool:
    """Whether ``name`` is a tokenizer class of transformers itself (no remote code)."""
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    return isinstance(name, str) and tokenizer_class_from_name(name) is not None


def drop_foreign_tokenizer_code(tokenizer: PreTrainedTokenizerBase, source: str | os.PathLike) -> None:
    """Forget an ``auto_map`` (code of another project) that ``tokenizer``, loaded from ``source``, was saved with:
    ``save_pretrained`` would write it into every folder saved from it (:func:`own_tokenizer_config`)."""
    auto_map = tokenizer.init_kwargs.pop("auto_map", None)
    if auto_map is not None:
        logger.warning(
            "%s/tokenizer_config.json: dropped auto_map %s, not this project's: the folders saved from this run carry "
            "no tokenizer code",
            source,
            json.dumps(auto_map),
        )
    forget_auto_class(tokenizer)


def own_tokenizer_config(folder: str | os.PathLike, source: str | os.PathLike) -> None:
    """Make ``folder/tokenizer_config.json`` name the standard fast tokenizer and carry no ``auto_map``: a
    tokenizer this project saved runs no code, and one copied from elsewhere (``source``) must not bring code
    of another project with it (``AutoTokenizer.from_pretrained(..., trust_remote_code=True)`` would run a
    ``.py`` file put beside it). What is dropped is named in a warning. A folder without ``tokenizer.json``
    (a slow tokenizer's files only) is left as it is."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file() or not (Path(folder) / "tokenizer.json").is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        return  # check_tokenizer_files' concern
    dropped = []
    if "auto_map" in config:
        dropped.append(f"auto_map {json.dumps(config.pop('auto_map'))}")
    named = config.get("tokenizer_class")
    if named is not None and not _library_class(named):
        dropped.append(f"tokenizer_class {named!r}")
    if not dropped and named is not None:
        return
    config["tokenizer_class"] = STANDARD_TOKENIZER_CLASS
    if dropped:
        logger.warning(
            "%s/tokenizer_config.json: dropped %s, not this project's: the tokenizer is saved as transformers' "
            "%s over tokenizer.json, which loads without remote code",
            source,
            ", ".join(dropped),
            STANDARD_TOKENIZER_CLASS,
        )
    write_atomic(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def load_or_train_tokenizer(
    folder: str | os.PathLike | None,
    texts: Iterable[str] | None,
    vocab_size: int,
    min_frequency: int | None = None,
    kind: str = "bpe",
    causal: bool = False,
    verify: bool = True,
) -> PreTrainedTokenizerFast:
    """Load the tokenizer saved in ``folder`` if there is one, else train it (``kind``) on ``texts``.

    A newly trained tokenizer is saved in ``folder`` when a folder is given, so the next call
    reuses it. With ``verify``, a reused tokenizer's training record must agree with ``vocab_size``,
    ``min_frequency`` and (when given) ``texts``, else a ValueError names the difference; tokenizers
    without a record (not trained here) are reused as they are. Which tokenizer is used is logged.
    """
    min_frequency = _min_frequency(kind, min_frequency)
    if folder is not None and (Path(folder) / "tokenizer.json").is_file():
        check_tokenizer_files(folder)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        record_path = Path(folder) / TRAINING_RECORD
        if verify and record_path.is_file():
            record = json.loads(record_path.read_text(encoding="utf-8"))
            _check_record(
                folder,
                record,
                {"kind": kind, "causal": causal, "vocab_size": vocab_size, "min_frequency": min_frequency},
                texts,
            )
        logger.info("using the tokenizer in %s (%d tokens)", folder, len(tokenizer))
        return tokenizer
    if texts is None:
        raise ValueError(f"no tokenizer in {folder} and no texts to train one on")
    tokenizer = train_tokenizer(texts, vocab_size, min_frequency, save_to=folder, kind=kind, causal=causal)
    logger.info(
        "trained a %d-token tokenizer%s", len(tokenizer), f", saved in {folder}" if folder is not None else ""
    )
    return tokenizer


def check_task_tokenizer(tokenizer: PreTrainedTokenizerBase, causal: bool, where: str) -> None:
    """A tokenizer from elsewhere (``--tokenizer_name``) that a task can train with (``causal``: a language model's):
    it has the pad and ``</s>``
    tokens the model's config takes (a language model ``<s>`` too), and a seq2seq tokenizer adds ``</s>`` to each
    sequence (a model learns to stop on it: a causal LM's tokenizer, which does not, would train a model that never
    stops)."""
    needed = ("pad_token", "bos_token", "eos_token") if causal else ("pad_token", "eos_token")
    missing = [name for name in needed if getattr(tokenizer, name) is None]
    if missing:
        raise ValueError(
            f"the tokenizer in {where} has no {', '.join(missing)}: the model needs it (padding, <s> starting a "
            "language model's sequence, </s> ending one); leave --tokenizer_name out to train one for this task, or "
            "add it to that tokenizer"
        )
    if not causal and tokenizer.eos_token_id not in tokenizer("a")["input_ids"]:
        raise ValueError(
            f"the tokenizer in {where} does not add {tokenizer.eos_token} to a sequence (a language model's "
            "tokenizer?): a seq2seq model learns to stop on it; leave --tokenizer_name out to train one for this task"
        )


MIN_ORDINARY_TOKENS = 26
"""The fewest tokens besides the special ones a tokenizer must have to train a model on: a Latin alphabet's letters.
A byte-level BPE has 256 byte tokens before any merge; a smaller vocabulary is a broken or cut-off folder."""


def check_vocabulary_size(tokenizer: PreTrainedTokenizerBase, where: str, fix: str) -> None:
    """Refuse a tokenizer with fewer than :data:`MIN_ORDINARY_TOKENS` tokens besides its special ones: a model
    built on it could write almost nothing (every word ``<unk>``), and would train without a word.

    Raises:
        ValueError: the tokenizer's size, its special tokens, the minimum and ``fix``.
    """
    special = set(tokenizer.all_special_ids)
    ordinary = len(tokenizer) - len(special)
    if ordinary < MIN_ORDINARY_TOKENS:
        raise ValueError(
            f"the tokenizer in {where} has {len(tokenizer)} tokens, {len(special)} of them special: too few to "
            f"encode text (a model needs at least {MIN_ORDINARY_TOKENS} besides the special ones, a byte-level BPE "
            f"has 256 bytes alone), so that folder looks broken or cut off; {fix}"
        )


def _check_record(folder: str | os.PathLike, record: dict, asked: dict, texts: Iterable[str] | None) -> None:
    if texts is not None:
        asked |= _TextsDigest(texts).consume().summary()
    differences = [
        f"{key} {record.get(key)} vs {value} now" for key, value in asked.items() if record.get(key) != value
    ]
    if differences:
        raise ValueError(
            f"the tokenizer in {folder} was trained with other settings or data ({'; '.join(differences)}); "
            "delete that folder to train a new one, or name another one with --tokenizer_name."
        )


@contextmanager
def tokenizer_sides(
    tokenizer: PreTrainedTokenizerBase, padding: str | None = None, truncation: str | None = None
) -> Iterator[PreTrainedTokenizerBase]:
    """``tokenizer`` with ``padding_side`` / ``truncation_side`` set inside the block and restored after it, where
    the task decides the side whatever the tokenizer was saved with (training batches pad on the right; a causal
    LM's prompt loses its start, not the end it continues)."""
    saved = tokenizer.padding_side, tokenizer.truncation_side
    tokenizer.padding_side, tokenizer.truncation_side = padding or saved[0], truncation or saved[1]
    try:
        yield tokenizer
    finally:
        tokenizer.padding_side, tokenizer.truncation_side = saved


def truncated_rows(encoded) -> list[bool]:
    """Which rows of a fast tokenizer's batch (``tokenizer(texts, truncation=True, ...)``) were cut to
    ``max_length``: their encodings keep the overflow. A slow tokenizer's batch reports none."""
    return [bool(encoding.overflowing) for encoding in encoded.encodings or ()]
