"""What a run prepares before training: the raw splits (a shared corpus, local files or a Hub dataset, optionally
streamed), its tokenizer, the tokenised splits (with the lines cut to the length limits counted, never lost
silently), the model (a fresh one from a preset, a saved one, or a residual one upcycled to RK blocks:
:func:`build_model`) and its decoding defaults."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Literal

from datasets import Dataset, DatasetDict, IterableDataset, concatenate_datasets
from transformers import PreTrainedTokenizerFast

from modeling_ode import (
    ODETransformerConfig,
    ODETransformerForCausalLM,
    ODETransformerForConditionalGeneration,
    fit_tokenizer_to_model,
)
from ode_transformer.cli import guide, hub_unreachable
from ode_transformer.files import read_lines
from ode_transformer.loading import load_saved_model
from ode_transformer.tokenizer import (
    check_task_tokenizer,
    load_or_train_tokenizer,
    resave_trained_tokenizer,
    tokenizer_sides,
    truncated_rows,
)
from ode_transformer.wording import GATED_RK2_FINDING, gated_rk2_sides

from . import metrics
from .arguments import DataArguments, ModelArguments, RunArguments, Settings
from .batching import seq2seq_lengths
from .data import SHARED_FOLDERS, DataSpec, MissingCorpusError, load_task_data
from .file_readers import iter_local_rows, load_local_file
from .hub_datasets import load_hub_dataset
from .tasks import get_task

logger = logging.getLogger(__name__)


TOKENIZER_SAMPLE = 200_000  # streamed examples the tokenizer is trained on
STREAM_READ_AHEAD = 10_000
"""Rows of a streamed local training file read before training, to refuse a wrong format and count skipped rows."""


def _shared_corpus(names: str, kind: Literal["seq2seq", "lm"], data_args: DataArguments) -> DatasetDict:
    """A shared corpus; ``a+b`` concatenates the training splits (other splits from ``a``). Where no local copy
    is found and ``--data_dir`` was not given, the Hub dataset the recipe names (``--hub_dataset``) instead."""
    parts = []
    for name in names.split("+"):
        spec = DataSpec(
            "shared",
            name,
            source_lang=data_args.source_lang,
            target_lang=data_args.target_lang,
            # libreoffice is built locally in its own cache folder, not read from the shared data
            root=data_args.data_dir if name != "libreoffice" else None,
        )
        try:
            parts.append(load_task_data(kind, spec))
        except MissingCorpusError as missing:
            if data_args.data_dir or not data_args.hub_dataset or "+" in names:
                raise
            parts.append(_hub_copy(name, kind, data_args, missing))
    result = parts[0]
    if len(parts) > 1:
        result["train"] = concatenate_datasets([part["train"] for part in parts])
    return result


def _hub_copy(
    name: str, kind: Literal["seq2seq", "lm"], data_args: DataArguments, missing: Exception
) -> DatasetDict:
    """Shared corpus ``name`` from the Hub dataset ``--hub_dataset`` (the recipe names it), through ``datasets``;
    offline or unreachable, one line naming both ways to get the data."""
    hub = data_args.hub_dataset
    spec = DataSpec("hub", hub, data_args.hub_config, data_args.source_lang, data_args.target_lang)
    logger.info("shared corpus %r has no local copy (%s): loading the Hub dataset %s", name, missing, hub)
    try:
        return load_task_data(kind, spec)
    except ValueError:  # the dataset loaded, but its columns do not fit: that message says so
        raise
    except Exception as error:  # offline, unreachable, not found: datasets raises many kinds
        where = SHARED_FOLDERS.get(name, name)
        local = (
            f"pass --data_dir DIR, DIR being the folder that holds {where}/ ({guide('data-and-tests.md')} lists "
            "its files)"
        )
        # offline or unreachable: said in words, not with datasets' class names
        if isinstance(error, ConnectionError):
            why, cached = hub_unreachable(hub)
            raise MissingCorpusError(
                f"shared corpus {name!r}: no local copy, and the Hub dataset {hub} could not be loaded: {why}; "
                f"{local}, or {cached}"
            ) from None
        reason = " ".join(f"{type(error).__name__}: {error}".split())[:200]
        raise MissingCorpusError(
            f"shared corpus {name!r}: no local copy, and the Hub dataset {hub} could not be loaded ({reason}); "
            f"{local}, or go online so that datasets can download {hub}"
        ) from None


def load_raw_data(data_args: DataArguments, task: str) -> tuple[DatasetDict, str | None]:
    """Raw ``train``/``validation``/``test`` splits and, for an M2-scored task (GEC), the test split's M2 file.

    Without a test split: the task's own (``Task.test_split``: GEC's CoNLL-2013, M2-scored), else the validation
    split, which ``data_args.scored_split`` then names (the scores are reported as the validation split's).
    """
    task = get_task(task)
    kind = task.kind
    if data_args.dataset:
        raw = _shared_corpus(data_args.dataset, kind, data_args)
    elif data_args.hub_dataset:  # streamed, the training split is read by streaming_train_split
        spec = DataSpec(
            "hub", data_args.hub_dataset, data_args.hub_config, data_args.source_lang, data_args.target_lang
        )
        try:
            raw = load_task_data(kind, spec, without_train=data_args.streaming)
        except ConnectionError:  # offline or unreachable: said in words, not datasets' class names
            why, cached = hub_unreachable(data_args.hub_dataset)
            raise MissingCorpusError(
                f"the Hub dataset {data_args.hub_dataset} could not be loaded: {why}; train on local files with "
                f"--train_file, --validation_file and --test_file ({guide('data-and-tests.md')}), or {cached}"
            ) from None
    else:
        raw = DatasetDict()
    for split, spec in (
        ("train", data_args.train_file),
        ("validation", data_args.validation_file),
        ("test", data_args.test_file),
    ):
        if split == "train" and spec and data_args.streaming:
            continue  # streamed by streaming_train_split, never read whole
        if spec:  # evaluation splits keep every line: the hypotheses stay aligned with the inputs
            raw[split] = load_local_file(
                spec, kind, data_args.source_column, data_args.target_column, skip_empty=split == "train"
            )
    m2_file = data_args.m2_file
    if task.test_split is not None and "test" not in raw:
        raw["test"], split_m2 = task.test_split(data_args.data_dir)
        m2_file = m2_file or str(split_m2)
    if task.m2_scored and m2_file and "test" in raw:
        check_m2_aligned(m2_file, raw["test"].num_rows)
    if "test" not in raw and "validation" in raw:  # scored in its place, and named (data_args.scored_split)
        raw["test"] = raw["validation"]
        data_args.scored_split = "validation"
    return raw, m2_file


def check_m2_aligned(m2_file: str, test_rows: int) -> None:
    """The M2 scorer pairs the i-th hypothesis with the i-th M2 sentence: the test split must have one row each."""
    sentences = len(metrics.parse_m2(read_lines(m2_file), m2_file))
    if sentences != test_rows:
        raise ValueError(
            f"{m2_file} has {sentences} sentences but the test split has {test_rows} rows (blank lines count: "
            "remove a trailing empty line); give the M2 file of this test set, one sentence per source line."
        )


def _slice(dataset: Dataset, limit: int | None) -> Dataset:
    return dataset if limit is None else dataset.select(range(min(limit, len(dataset))))


def _has_example(dataset: Dataset) -> bool:
    """Whether one row has text to learn or score: a non-blank ``text``, or a non-blank source and target.
    Evaluation splits keep their blank rows (to stay aligned), so an all-blank split has rows but no example."""

    def is_text(value: object) -> bool:
        return isinstance(value, str) and bool(value.strip())

    columns = ["text"] if "text" in dataset.column_names else ["source", "target"]
    # in batches: stops at the first example instead of reading a large training split into memory
    for batch in dataset.select_columns(columns).iter(batch_size=10_000):
        if any(all(map(is_text, row)) for row in zip(*(batch[column] for column in columns))):
            return True
    return False


def check_splits_not_empty(splits: dict, data_args: DataArguments) -> None:
    """Refuse a split without examples before training (an empty validation or test split would only fail, or be
    scored as nothing, after it)."""
    files = {
        "train": data_args.train_file,
        "validation": data_args.validation_file,
        "test": data_args.test_file,
    }
    for name, dataset in splits.items():
        if isinstance(dataset, Dataset) and not _has_example(dataset):
            source = files[name] or data_args.dataset or data_args.hub_dataset
            raise ValueError(
                f"the {name} split ({source}) has no examples ({dataset.num_rows} rows, none with text to learn "
                "or score, after skipping empty ones and --max_*_samples); give it data, or leave that split out."
            )


def streaming_train_split(
    data_args: DataArguments, raw: DatasetDict, world_size: int, task: str
) -> IterableDataset:
    """The training split as a stream: from the Hub (``streaming=True``) or a local split."""
    # with --dataset, the Hub is where that corpus comes from
    if data_args.hub_dataset and not data_args.dataset:
        return load_hub_dataset(
            data_args.hub_dataset,
            data_args.hub_config,
            data_args.source_lang,
            data_args.target_lang,
            split="train",
            streaming=True,
        )
    if data_args.train_file:
        return stream_local_file(data_args.train_file, get_task(task).kind, data_args)
    return raw["train"].to_iterable_dataset(num_shards=max(world_size, 1))


def stream_local_file(spec: str, kind: str, data_args: DataArguments) -> IterableDataset:
    """A local training file as a stream: read line by line while training, so memory does not grow with the
    file (``--streaming true``); the rows are those :func:`load_local_file` keeps, with its checks and its warning
    about skipped rows. The first :data:`STREAM_READ_AHEAD` rows are read now, so that a wrong column or format is
    refused, and rows skipped (JSONL records of other keys) are counted, before training starts."""
    rows = {
        "spec": spec,
        "kind": kind,
        "source_column": data_args.source_column,
        "target_column": data_args.target_column,
    }
    read_ahead = iter_local_rows(**rows, lines=STREAM_READ_AHEAD)
    if not sum(1 for _ in read_ahead):  # read whole, so that its warning counts the rows it skipped
        next(iter_local_rows(**rows), None)  # no row among them: read on to the first one, or to the refusal
    return IterableDataset.from_generator(iter_local_rows, gen_kwargs=rows)


def _tokenizer_texts(train: Dataset | IterableDataset, task: str) -> Iterator[str]:
    columns = get_task(task).columns
    for example in islice(iter(train), TOKENIZER_SAMPLE) if isinstance(train, IterableDataset) else train:
        for column in columns:
            yield example[column]


def tokenize_function(
    tokenizer: PreTrainedTokenizerFast, task: str, data_args: DataArguments, report: bool = False
):
    """The ``map`` function: ``input_ids``, ``labels`` and ``length`` (the budgeted size); with ``report`` also
    the ``TRUNCATED_COLUMNS`` that mark the rows cut to ``--max_source_length``/``--max_target_length``.

    A row too long keeps its start, whatever side the tokenizer was saved with: a causal LM's saved tokenizer
    truncates on the left (a prompt keeps the end it continues), and a resumed run, which loads it, would otherwise
    train and score on other rows than the run that trained it."""

    def seq2seq(batch: dict) -> dict:
        with tokenizer_sides(tokenizer, truncation="right"):
            sources = tokenizer(batch["source"], truncation=True, max_length=data_args.max_source_length)
            targets = tokenizer(batch["target"], truncation=True, max_length=data_args.max_target_length)
        columns = {
            "input_ids": sources["input_ids"],
            "labels": targets["input_ids"],
            "length": seq2seq_lengths(
                list(map(len, sources["input_ids"])), list(map(len, targets["input_ids"]))
            ),
        }
        if report:
            columns |= {
                "source_truncated": truncated_rows(sources),
                "target_truncated": truncated_rows(targets),
            }
        return columns

    def lm(batch: dict) -> dict:  # <s> text </s>, whatever the tokenizer adds itself (a prompt gets no </s>)
        with tokenizer_sides(tokenizer, truncation="right"):
            encoded = tokenizer(
                batch["text"],
                add_special_tokens=False,
                truncation=True,
                max_length=data_args.max_target_length - 2,
            )
        ids = [[tokenizer.bos_token_id, *seq, tokenizer.eos_token_id] for seq in encoded["input_ids"]]
        columns = {"input_ids": ids, "labels": ids, "length": [len(seq) for seq in ids]}
        return columns | ({"target_truncated": truncated_rows(encoded)} if report else {})

    return lm if get_task(task).is_lm else seq2seq


TRUNCATED_COLUMNS = {"source_truncated": "--max_source_length", "target_truncated": "--max_target_length"}


def tokenize_splits(
    splits: dict,
    tokenizer: PreTrainedTokenizerFast,
    task: str,
    data_args: DataArguments,
    main_process: bool = True,
) -> dict:
    """Tokenise every split, keeping only the model's columns and ``length``; a warning counts the lines cut to
    ``--max_source_length``/``--max_target_length`` (a stream is cut without a count: it is read lazily). Every
    process of a distributed run tokenises the same splits; only the ``main_process`` warns."""
    out = {}
    for name, dataset in splits.items():
        report = isinstance(dataset, Dataset)
        function = tokenize_function(tokenizer, task, data_args, report=report)
        columns = dataset.column_names or list(next(iter(dataset)).keys())
        out[name] = dataset.map(function, batched=True, remove_columns=columns)
        if report:
            out[name] = _report_truncation(name, out[name], data_args, main_process)
    return out


def _report_truncation(split: str, dataset: Dataset, data_args: DataArguments, warn: bool) -> Dataset:
    """Warn (where `warn`) how many lines of ``split`` were cut (never a silent loss), then drop the marker
    columns."""
    present = [column for column in TRUNCATED_COLUMNS if column in dataset.column_names]
    for column in present:
        count = sum(dataset[column]) if warn else 0
        if count:
            flag = TRUNCATED_COLUMNS[column]
            limit = getattr(data_args, flag.removeprefix("--"))
            seq2seq = "source_truncated" in dataset.column_names
            side = "source" if column == "source_truncated" else "target" if seq2seq else "text"
            logger.warning(
                "%s split: %d of %d %s line(s) longer than %s %d tokens were truncated; raise %s to keep them whole",
                split,
                count,
                dataset.num_rows,
                side,
                flag,
                limit,
                flag,
            )
    return dataset.remove_columns(present)


def drop_long_training_pairs(splits: dict, max_train_tokens: int | None) -> dict:
    """Without the training pairs whose longer side has more than ``max_train_tokens`` tokens (a long pair
    costs much compute per update and, truncated, teaches cut-off sentences); other splits are kept whole."""
    train = splits.get("train")
    if not max_train_tokens or not isinstance(train, Dataset):
        return splits
    kept = train.filter(
        lambda lengths: [n <= max_train_tokens for n in lengths], input_columns="length", batched=True
    )
    logger.info(
        "--max_train_tokens %d: %d of %d training pairs kept", max_train_tokens, kept.num_rows, train.num_rows
    )
    return {**splits, "train": kept}


def splits_to_use(raw: DatasetDict, settings: Settings) -> dict:
    """The raw splits the run needs: train (``--do_train``), validation (training or ``--do_eval``), test
    (``--do_predict``); a clear error names a missing one."""
    data_args, training_args = settings.data, settings.training
    flags = {"train": "--do_train", "validation": "--do_eval", "test": "--do_predict"}
    for name, flag in flags.items():
        needed = getattr(training_args, flag.removeprefix("--"))
        if needed and name not in raw and not (name == "train" and data_args.streaming):
            raise ValueError(
                f"{flag} needs a {name} split: give --dataset, --hub_dataset or --{name}_file, or {flag} false"
            )
    splits = {}
    if training_args.do_train:
        splits["train"] = (
            streaming_train_split(data_args, raw, training_args.world_size, settings.run.task)
            if data_args.streaming
            else _slice(raw["train"], data_args.max_train_samples)
        )
    if "validation" in raw and (training_args.do_train or training_args.do_eval):
        splits["validation"] = _slice(raw["validation"], data_args.max_eval_samples)
    if training_args.do_predict:
        splits["test"] = _slice(raw["test"], data_args.max_test_samples)
        if data_args.scored_split != "test":
            logger.warning(
                "the data has no test split: --do_predict scores the %s split instead, and reports it as such "
                "(hub_metrics.json, the model card, test_results.json); give --test_file for a test score",
                data_args.scored_split,
            )
    return splits


def trained_length(task: str, data_args: DataArguments) -> int:
    """The input length a run trains on: ``--max_source_length``, a language model's ``--max_target_length``."""
    return data_args.max_target_length if get_task(task).is_lm else data_args.max_source_length


def fit_tokenizer_to_run(tokenizer: PreTrainedTokenizerFast, config, task: str, data_args: DataArguments):
    """The tokenizer saved with the model carries one length, the one the run trained on, as ``model_max_length``
    and as ``tokenizer.json``'s truncation (:func:`modeling_ode.fit_tokenizer_to_model`). The folder it was trained
    in, which kept transformers' no-limit 1e30, is saved again with it by :func:`refit_trained_tokenizer`."""
    return fit_tokenizer_to_model(tokenizer, config, trained_length(task, data_args))


def refit_trained_tokenizer(tokenizer: PreTrainedTokenizerFast, training_args) -> None:
    """Save the run's fitted ``tokenizer`` over the one it trained (:func:`own_tokenizer_folder`), so that the
    folder and the model's tokenizer say one length; a folder it did not train is left as it is."""
    resave_trained_tokenizer(tokenizer, own_tokenizer_folder(training_args))


def own_tokenizer_folder(training_args) -> Path:
    """Where a run trains its tokenizer, and reuses it when run again: ``OUTPUT_DIR/tokenizer``."""
    return Path(training_args.output_dir) / "tokenizer"


def prepare_tokenizer(model_args, training_args, train, task: str) -> PreTrainedTokenizerFast:
    """The tokenizer asked for by name, else the output folder's own: reused if its record matches, else
    trained."""
    named = model_args.tokenizer_name
    if named and Path(named).is_file():
        raise ValueError(f"--tokenizer_name {named} is a file: give the folder that holds tokenizer.json")
    folder = named or own_tokenizer_folder(training_args)
    with training_args.main_process_first(desc="tokenizer"):
        texts = _tokenizer_texts(train, task) if train is not None else None
        tokenizer = load_or_train_tokenizer(
            folder,
            texts,
            model_args.vocab_size,
            kind=model_args.tokenizer_type,
            causal=get_task(task).is_lm,
            verify=not named,
        )
    if named:
        check_task_tokenizer(tokenizer, get_task(task).is_lm, named)
    return tokenizer


def build_model(
    model_args: ModelArguments,
    data_args: DataArguments,
    task: str,
    tokenizer: PreTrainedTokenizerFast,
    saved_model=None,
):
    """A fresh model from the preset and overrides, or the saved one of ``model_name_or_path``: the one
    :func:`load_trainable_model` loaded for training (``saved_model``), else (evaluation) as it was saved; with
    ``--upcycle``, that residual model with its blocks swapped (from_residual)."""
    if model_args.upcycle:
        return ODETransformerForConditionalGeneration.from_residual(
            model_args.model_name_or_path, **model_args.overrides()
        )
    if model_args.model_name_or_path:  # its kind checked against the task (check_saved_model_task)
        return saved_model if saved_model is not None else load_saved_model(model_args.model_name_or_path)
    model_class = (
        ODETransformerForCausalLM if get_task(task).is_lm else ODETransformerForConditionalGeneration
    )
    overrides = model_args.task_overrides(task)
    preset_positions = ODETransformerConfig.from_preset(model_args.preset).max_position_embeddings
    needed = max(data_args.max_source_length, data_args.max_target_length) + 2
    config = ODETransformerConfig.from_preset(
        model_args.preset,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        max_position_embeddings=max(preset_positions, needed),
        **overrides,
    )
    return model_class(config)


def note_gated_rk2(config) -> None:
    """Say, in the log of a run that trains it, what this project's runs show about the paper's gated RK2 block
    (every recipe's default), and how to train another block."""
    for side in gated_rk2_sides(config):
        logger.info(
            "%s blocks: gated RK2 (the paper's learnable gate): %s (%s) To train another block, pass e.g. "
            "--%s_ode_method rk4 (the blocks: %s).",
            side,
            GATED_RK2_FINDING,
            guide("verdict.md", "results"),
            side,
            guide("model.md"),
        )


def set_decoding_defaults(model, run_args: RunArguments, data_args: DataArguments, saved: bool) -> dict:
    """Beam size and length penalty of the test decoding, written into ``model.generation_config``.

    ``--num_beams``/``--length_penalty`` if given, else a ``saved`` model's own, else the paper's for the task;
    ``max_length`` is ``--max_target_length`` + 1 (the start token and the target's tokens).
    """
    task = get_task(run_args.task)
    if task.is_lm:
        return {}
    generation = model.generation_config
    beams, penalty = task.num_beams, task.length_penalty
    if saved:  # unset fields of a generation config read as greedy search, length penalty 1
        beams, penalty = (
            generation.num_beams or 1,
            1.0 if generation.length_penalty is None else generation.length_penalty,
        )
    decoding = {
        "num_beams": run_args.num_beams or beams,
        "length_penalty": penalty if run_args.length_penalty is None else run_args.length_penalty,
    }
    # BART's convention: max_length, which counts the decoder's start token, so that a user's max_length,
    # generation_max_length or max_new_tokens each take effect (a saved max_new_tokens would override the first two)
    generation.max_length, generation.max_new_tokens = data_args.max_target_length + 1, None
    generation.num_beams = decoding["num_beams"]
    if decoding["num_beams"] > 1:  # beam-only settings are refused by greedy generation configs
        generation.length_penalty = decoding["length_penalty"]
        generation.early_stopping = True
    return decoding
