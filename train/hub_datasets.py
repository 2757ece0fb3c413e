"""Hub datasets (or local dataset folders, as :func:`datasets.load_dataset` reads them) mapped to ``source`` and
``target`` columns: :func:`load_hub_dataset`, and :func:`columns_named`, which makes a split with other columns
than the dataset's a one-line error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import datasets
from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict
from datasets.exceptions import DatasetGenerationError
from datasets.table import CastError

from .file_readers import check_fields

__all__ = ["columns_named", "load_hub_dataset"]

AnyDataset = Dataset | DatasetDict | IterableDataset | IterableDatasetDict
PathLike = str | os.PathLike


def _get_field(example: Mapping, name: str) -> object:
    """``example[name]``, where ``a.b`` reads key ``b`` of the dict column ``a``."""
    value: object = example
    for part in name.split("."):
        value = value[part]  # type: ignore[index]
    return value


def _to_source_target(dataset: AnyDataset, source: str, target: str) -> AnyDataset:
    def convert(example: Mapping) -> dict[str, object]:
        return {"source": _get_field(example, source), "target": _get_field(example, target)}

    return dataset.map(convert).select_columns(["source", "target"])


_KNOWN_COLUMN_PAIRS: tuple[tuple[str, str], ...] = (("article", "highlights"), ("document", "summary"))


def _hub_columns(columns: Sequence[str], source_lang: str | None, target_lang: str | None) -> tuple[str, str]:
    if "translation" in columns and source_lang and target_lang:
        return f"translation.{source_lang}", f"translation.{target_lang}"
    if source_lang and target_lang:
        return source_lang, target_lang
    for pair in _KNOWN_COLUMN_PAIRS:
        if set(pair) <= set(columns):
            return pair
    raise ValueError(
        f"cannot tell source/target columns among {list(columns)}: pass source_lang/target_lang "
        "(languages of a 'translation' column, or column names)"
    )


@contextmanager
def columns_named(name: str, config: str | None) -> Iterator[None]:
    """Around reading a Hub dataset (or a local dataset folder): a split whose file has other columns than the
    dataset's other splits (a renamed column) becomes one line naming the split, the file and the columns expected.
    datasets raised a DatasetGenerationError of some 70 lines, or streamed, a "Couldn't cast" naming neither.

    Raises:
        ValueError: that split, its file, its columns and the columns expected.
    """
    try:
        yield
    except (DatasetGenerationError, CastError) as error:
        cast = error if isinstance(error, CastError) else error.__cause__
        if not isinstance(cast, CastError):
            raise
        problem = _other_columns(name, config) or (
            f"dataset {name!r}: a split's file has the columns {cast.table_column_names}, where the dataset's are "
            f"{cast.requested_column_names}; give every split the same columns"
        )
        raise ValueError(problem) from None


def _other_columns(name: str, config: str | None) -> str | None:
    """The message of :func:`columns_named`: each data file's columns, read alone; the columns most files have are
    the ones expected. None where every file has the same columns, or the dataset is no local folder (its files
    are not downloaded one by one for a message)."""
    if not Path(name).is_dir():
        return None
    builder = datasets.load_dataset_builder(name, config)
    found = []
    for split, files in (builder.config.data_files or {}).items():
        for file in files:
            alone = datasets.load_dataset(builder.name, data_files=[file], split="train", streaming=True)
            found.append((split, file, alone.column_names or list(next(iter(alone), {}).keys())))
    shapes = [sorted(columns) for _, _, columns in found]
    expected = max(shapes, key=shapes.count, default=[])
    for split, file, columns in found:
        if sorted(columns) != expected:
            return (
                f"dataset {name!r}: the {split} split ({file}) has the columns {columns}, where the other splits "
                f"have {expected}; rename its columns to those"
            )
    return None


def load_hub_dataset(
    name: str,
    config: str | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    split: str | None = None,
    streaming: bool = False,
    cache_dir: PathLike | None = None,
) -> AnyDataset:
    """Load a Hub dataset (or a local dataset folder) and map it to ``source``/``target``.

    Column mapping: a ``translation`` dict column with ``source_lang``/``target_lang`` keys
    (e.g. ``wmt14``/``de-en``); otherwise ``source_lang``/``target_lang`` are taken as column
    names; with neither given, the known pairs ``article``/``highlights`` (``cnn_dailymail``
    ``3.0.0``) and ``document``/``summary`` (``xsum``) are recognised.

    Returns a :class:`Dataset` (``split`` given) or :class:`DatasetDict`, or their iterable
    variants with ``streaming=True``.

    Raises:
        ValueError: a split's file has other columns than the dataset's (:func:`columns_named`).
    """
    with columns_named(name, config):
        dataset = datasets.load_dataset(
            name,
            config,
            split=split,
            streaming=streaming,
            cache_dir=None if cache_dir is None else str(cache_dir),
        )
        first = dataset if split is not None else next(iter(dataset.values()))
        columns = first.column_names or list(next(iter(first)).keys())  # streamed: its first row is read
    source, target = _hub_columns(columns, source_lang, target_lang)
    try:
        check_fields(
            # a Hub dataset's records are not scanned: a nested field (translation.en) is checked by its column
            columns,
            [source.split(".")[0], target.split(".")[0]],
            f"dataset {name!r} (config {config!r})",
            "--source_lang/--target_lang",
        )
    except ValueError:
        if split is not None and (odd := _other_columns(name, config)):  # one split, its columns renamed
            raise ValueError(odd) from None
        raise
    return _to_source_target(dataset, source, target)
