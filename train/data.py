"""Datasets for training and evaluation, all as :mod:`datasets` objects.

Seq2seq data has the columns ``source`` and ``target`` (plus, for a few evaluation sets, extra
columns documented per reader); language-modelling data has the column ``text``.

* Generic loaders: :func:`load_parallel_files` (aligned plain-text files, optionally ``.gz``),
  :func:`load_tsv`, :func:`load_jsonl`, :func:`load_hub_dataset` (Hugging Face Hub id or a local
  dataset folder, optionally streaming).
* Readers for the shared corpora in ``../shared/data`` (or ``$ODE_DATA_DIR``, see
  :func:`data_root`): :func:`multi30k`, :func:`tatoeba_de_en`, :func:`wmt_test`, :func:`cnndm`, :func:`fce`,
  :func:`wi_locness`, :func:`jfleg_dev`, :func:`conll2013_test`, :func:`ptb`, and
  :func:`libreoffice` for the built-in LibreOffice-help corpus.
* :func:`load_task_data` builds a train/validation/test :class:`~datasets.DatasetDict` from a
  :class:`DataSpec` (the single entry point of the training scripts).

Word dropout on the source side (GEC) is a collator's, in :mod:`ode_transformer.train.trainer`.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Literal

import datasets
from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict
from datasets.exceptions import DatasetGenerationError
from datasets.table import CastError

from ode_transformer.files import read_byte_lines, read_lines

from .libreoffice_corpus import DEFAULT_CACHE, build_corpus

__all__ = [
    "DATA_DIR_ENV",
    "DataSpec",
    "MissingCorpusError",
    "cnndm",
    "conll2013_test",
    "data_root",
    "fce",
    "jfleg_dev",
    "libreoffice",
    "load_hub_dataset",
    "load_jsonl",
    "load_local_file",
    "load_parallel_files",
    "load_task_data",
    "load_tsv",
    "multi30k",
    "shared_folder",
    "ptb",
    "tatoeba_de_en",
    "wi_locness",
    "wmt_test",
]

logger = logging.getLogger(__name__)

DATA_DIR_ENV = "ODE_DATA_DIR"
"""Environment variable overriding the shared data root."""


def clone_data_root(package_folder: Path) -> Path | None:
    """The shared corpora beside a clone (``../shared/data``) whose ``train/`` is `package_folder`; None for an
    installed package, whose folder is no clone (its neighbour would be ``site-packages/shared/data``): there only
    ``--data_dir`` or ``$ODE_DATA_DIR`` name the folder."""
    clone = package_folder.resolve().parent
    return clone.parent / "shared" / "data" if (clone / "pyproject.toml").is_file() else None


_DEFAULT_ROOT = clone_data_root(Path(__file__).parent)
_SHOWN_LINES = 5  # line numbers quoted in warnings

AnyDataset = Dataset | DatasetDict | IterableDataset | IterableDatasetDict
PathLike = str | os.PathLike


# --------------------------------------------------------------------------------------------
# Aligned plain-text files


@dataclass
class _LineReport:
    """What a loader read and what it dropped, for its warning: line numbers are 1-based, in the original files."""

    files: list[str]
    lines: int
    kept: int
    empty_lines: list[int] = field(default_factory=list)
    undecodable_lines: list[int] = field(default_factory=list)


def _decode(line: bytes) -> str | None:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _read_aligned(paths: Mapping[str, Path], skip_empty: bool) -> dict[str, list[str]]:
    """Read line-aligned files into columns; misalignment is an error, bad lines are skipped and reported."""
    raw = {name: read_byte_lines(path) for name, path in paths.items()}
    counts = {name: len(lines) for name, lines in raw.items()}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{paths[name]}: {n} lines" for name, n in counts.items())
        raise ValueError(f"files are not aligned (different line counts): {detail}")
    n_lines = next(iter(counts.values()), 0)
    stats = _LineReport(files=[str(p) for p in paths.values()], lines=n_lines, kept=0)
    columns: dict[str, list[str]] = {name: [] for name in paths}
    for i, row in enumerate(zip(*raw.values()), start=1):
        texts = [_decode(line) for line in row]
        if any(text is None for text in texts):
            stats.undecodable_lines.append(i)
            if skip_empty:
                continue
            # an evaluation set keeps every line, aligned with its references and hypotheses
            texts = [line.decode("utf-8", errors="replace") for line in row]
        if any(not text.strip() for text in texts):
            stats.empty_lines.append(i)
            if skip_empty:
                continue
        for name, text in zip(columns, texts):
            columns[name].append(text)
    stats.kept = len(next(iter(columns.values()), []))
    _warn_skipped(stats, skip_empty)
    return columns


def _warn_skipped(stats: _LineReport, skip_empty: bool) -> None:
    """Never a silent loss of data: each kind of bad line, its count, its first line numbers, and what is left."""
    for what, lines, action in (
        ("undecodable (non-UTF-8)", stats.undecodable_lines, "skipped" if skip_empty else "kept as U+FFFD"),
        ("empty", stats.empty_lines, "skipped" if skip_empty else "kept"),
    ):
        if lines:
            logger.warning(
                "%s: %d %s line(s) %s (line numbers %s%s); %d of %d rows loaded",
                " / ".join(stats.files),
                len(lines),
                what,
                action,
                ", ".join(map(str, lines[:_SHOWN_LINES])),
                ", ..." if len(lines) > _SHOWN_LINES else "",
                stats.kept,
                stats.lines,
            )


def _aligned_dataset(paths: Mapping[str, PathLike], skip_empty: bool) -> Dataset:
    return Dataset.from_dict(_read_aligned({name: Path(p) for name, p in paths.items()}, skip_empty))


def load_parallel_files(src_path: PathLike, tgt_path: PathLike, skip_empty: bool = True) -> Dataset:
    """Load two line-aligned UTF-8 text files (``.gz`` allowed) as a ``source``/``target`` dataset.

    Args:
        src_path: source-side file, one segment per line.
        tgt_path: target-side file, same number of lines.
        skip_empty: drop pairs where either side is empty/whitespace-only or not UTF-8 (training); with
            ``False`` every line is kept (evaluation sets that must stay aligned with references and
            hypotheses), undecodable bytes as U+FFFD.

    Raises:
        ValueError: the files have different line counts (both files and counts named).

    Every dropped, replaced or empty line is logged as a warning (count, first line numbers, and how
    many rows are left).
    Text is kept verbatim (only a trailing ``\\r`` is removed).
    """
    return _aligned_dataset({"source": src_path, "target": tgt_path}, skip_empty)


# --------------------------------------------------------------------------------------------
# TSV / JSONL / Hub


def _get_field(example: Mapping, name: str) -> object:
    """``example[name]``, where ``a.b`` reads key ``b`` of the dict column ``a``."""
    value: object = example
    for part in name.split("."):
        value = value[part]  # type: ignore[index]
    return value


def _check_fields(columns: Sequence[str], fields: Sequence[str], where: str, choose: str) -> None:
    for name in fields:
        if name not in columns:
            raise ValueError(
                f"column {name!r} not found in {where}; available columns: {list(columns)} (choose with {choose})"
            )


def _to_source_target(dataset: AnyDataset, source: str, target: str) -> AnyDataset:
    def convert(example: Mapping) -> dict[str, object]:
        return {"source": _get_field(example, source), "target": _get_field(example, target)}

    return dataset.map(convert).select_columns(["source", "target"])


def _refuse_empty_file(path: PathLike, lines: Sequence[str], header: bool) -> None:
    if sum(1 for line in lines if line.strip()) <= (1 if header else 0):
        rows = "rows below its header" if header else "lines"
        raise ValueError(f"{path} has no {rows}: pass a file with data, or leave that split out.")


def _pairs_dataset(
    sources: list[object], targets: list[object], path: PathLike, first_line: int, skip_empty: bool
) -> Dataset:
    """A ``source``/``target`` dataset of a file's rows (row 0 is line ``first_line``): rows with a missing (None)
    or blank side are dropped with :func:`load_parallel_files`' warning, or, without ``skip_empty``, kept with
    ``""`` for a missing value.

    Raises:
        ValueError: a value is neither text nor missing (a number, list or object; file, line and field named).
    """
    for side, values in (("source", sources), ("target", targets)):
        for i, value in enumerate(values):
            if value is not None and not isinstance(value, str):
                raise ValueError(
                    f"{path}, line {i + first_line}: the {side} is a {type(value).__name__} ({str(value)[:40]!r}), "
                    "not text; give every source and target as a string (or convert the file first)."
                )
    empty = {
        i
        for i, (source, target) in enumerate(zip(sources, targets))
        if source is None or target is None or not source.strip() or not target.strip()
    }
    stats = _LineReport(
        files=[str(path)],
        lines=len(sources),
        kept=len(sources) - (len(empty) if skip_empty else 0),
        empty_lines=[i + first_line for i in sorted(empty)],
    )
    _warn_skipped(stats, skip_empty)
    rows = [i for i in range(len(sources)) if not (skip_empty and i in empty)]
    return Dataset.from_dict(
        {"source": [sources[i] or "" for i in rows], "target": [targets[i] or "" for i in rows]}
    )


def load_tsv(path: PathLike, source_column: str, target_column: str, skip_empty: bool = True) -> Dataset:
    """Load a tab-separated file with a header row (``.gz`` allowed) as ``source``/``target``.

    Every line below the header is a row, read as text (quotes are not special, ``007`` stays ``007``). Rows with
    a missing or blank source or target, blank lines included, are skipped (kept with ``skip_empty=False``) with a
    warning naming their line numbers, as :func:`load_parallel_files` does.

    Raises:
        ValueError: a column is missing (message names it, the file and the existing columns), the file has no
            rows below its header, a row has more fields than the header (a tab inside a text would shift every
            later field into the wrong column), or a line is not UTF-8 (file and line named).
    """
    lines = read_lines(path)
    _refuse_empty_file(path, lines, header=True)
    header = lines[0].split("\t")
    _check_fields(header, [source_column, target_column], str(path), "--source_column/--target_column")
    source, target = header.index(source_column), header.index(target_column)
    sources: list[object] = []
    targets: list[object] = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) > len(header):
            raise ValueError(
                f"{path}, line {number}: {len(fields)} tab-separated fields, but the header has {len(header)}; a "
                "text that holds a tab must lose it (or write the file as JSONL)."
            )
        sources.append(fields[source] if source < len(fields) else None)
        targets.append(fields[target] if target < len(fields) else None)
    return _pairs_dataset(sources, targets, path, first_line=2, skip_empty=skip_empty)


def _optional_field(record: Mapping, name: str) -> object:
    """``_get_field``, with None where a key (or the object holding it) is missing."""
    value: object = record
    for part in name.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _field_names(record: Mapping, prefix: str = "") -> Iterator[str]:
    """The fields of a record as ``--source_column`` names them: ``a`` and, inside an object, ``a.b``."""
    for key, value in record.items():
        yield prefix + key
        if isinstance(value, Mapping):
            yield from _field_names(value, f"{prefix}{key}.")


def _json_records(path: PathLike, lines: list[str]) -> list[Mapping]:
    """One record per line (JSON lines; a blank line is an empty record), or the objects of a ``.json`` file that
    holds one JSON array (as datasets' json builder reads it)."""
    first = next((line for line in lines if line.strip()), "")
    if str(path).removesuffix(".gz").endswith(".json") and first.lstrip().startswith("["):
        try:
            array = json.loads("\n".join(lines))
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}, line {error.lineno}: not JSON ({error.msg} at column {error.colno}); fix that line."
            ) from None
        if not all(isinstance(record, dict) for record in array):
            raise ValueError(f"{path}: a JSON array of objects is needed, one per example")
        return array
    records: list[Mapping] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            records.append({})
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}, line {number}: not a JSON object ({error.msg} at column {error.colno}); fix or remove "
                "that line."
            ) from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}, line {number}: not a JSON object (a JSON {type(record).__name__}); fix or remove that line."
            )
        records.append(record)
    return records


def load_jsonl(path: PathLike, source_field: str, target_field: str, skip_empty: bool = True) -> Dataset:
    """Load a JSON-lines file (``.gz`` allowed; a ``.json`` file may hold one array of objects instead) as
    ``source``/``target``.

    A field ``a.b`` reads key ``b`` of the object in field ``a`` (e.g. ``translation.de``). Records with
    a missing, null or blank source or target, blank lines included, are skipped (kept with ``skip_empty=False``)
    with a warning naming their line numbers.

    Raises:
        ValueError: a field is missing from every record (message names it, the file and the existing fields),
            the file is empty, or a line is not UTF-8 or not a JSON object (file and line named).
    """
    lines = read_lines(path)
    _refuse_empty_file(path, lines, header=False)
    records = _json_records(path, lines)
    columns = list(dict.fromkeys(name for record in records for name in _field_names(record)))
    _check_fields(
        columns,
        [source_field, target_field],
        str(path),
        "--source_column/--target_column; a.b reads key b of field a, e.g. translation.en",
    )
    sources = [_optional_field(record, source_field) for record in records]
    targets = [_optional_field(record, target_field) for record in records]
    return _pairs_dataset(sources, targets, path, first_line=1, skip_empty=skip_empty)


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
        _check_fields(
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


# --------------------------------------------------------------------------------------------
# Shared corpora


def data_root(root: PathLike | None = None) -> Path | None:
    """Shared data folder: ``root`` if given, else ``$ODE_DATA_DIR``, else a clone's ``../shared/data``; None in an
    installed package without either."""
    if root is not None:
        return Path(root)
    folder = os.environ.get(DATA_DIR_ENV) or _DEFAULT_ROOT
    return Path(folder) if folder else None


class MissingCorpusError(FileNotFoundError):
    """A shared corpus is not under the data folder; the message says where it looked and how to point elsewhere."""


# Where each shared corpus lives under the data folder.
SHARED_FOLDERS = {
    "multi30k": "multi30k",
    "tatoeba_de_en": "tatoeba_de_en",
    "cnndm": "summarization",
    "wi_locness": "gec/wi_locness",
    "fce": "gec/fce",
    "conll2013": "gec/conll2013",
    "ptb": "ptb",
    "wmt": "wmt",
    "jfleg": "gec/jfleg",
}


def shared_folder(name: str, root: PathLike | None = None) -> Path:
    """The folder of shared corpus ``name``; a :class:`MissingCorpusError` naming the fix when it is absent."""
    base = data_root(root)
    if base is None:
        raise MissingCorpusError(
            f"shared corpus {name!r}: no data folder given; pass --data_dir DIR (root=DIR in Python) or set "
            f"{DATA_DIR_ENV}=DIR, DIR being the folder that holds {SHARED_FOLDERS[name]}/"
        )
    folder = base / SHARED_FOLDERS[name]
    if not folder.is_dir():
        raise MissingCorpusError(
            f"shared corpus {name!r} not found: no folder {folder}; pass --data_dir DIR (root=DIR in Python) "
            f"or set {DATA_DIR_ENV}=DIR, DIR being the folder that holds {SHARED_FOLDERS[name]}/"
        )
    return folder


def _split_name(split: str, allowed: Mapping[str, str]) -> str:
    if split not in allowed:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(allowed)}")
    return allowed[split]


def multi30k(split: str, src: str = "en", tgt: str = "de", root: PathLike | None = None) -> Dataset:
    """Multi30k Task 1, raw cased text: ``train`` (29,000), ``val`` (1,014), ``test_2016_flickr`` (1,000).

    ``src``/``tgt`` are any two of ``en``, ``de``, ``fr``. ``validation``/``test`` are aliases.
    """
    name = _split_name(
        split,
        {
            "train": "train",
            "val": "val",
            "validation": "val",
            "test_2016_flickr": "test_2016_flickr",
            "test": "test_2016_flickr",
        },
    )
    folder = shared_folder("multi30k", root)
    return load_parallel_files(folder / f"{name}.{src}.gz", folder / f"{name}.{tgt}.gz")


def tatoeba_de_en(split: str, src: str = "en", tgt: str = "de", root: PathLike | None = None) -> Dataset:
    """Tatoeba English-German pairs (manythings.org deu-eng, 2018-05-13), raw cased text: ``train`` (162,896),
    ``valid`` (3,509), ``test`` (3,408); short everyday sentences. No English or German sentence occurs in two
    splits (the data README says how they were made). ``src``/``tgt``: ``en`` and ``de`` either way round;
    ``validation`` is an alias of ``valid``."""
    name = _split_name(split, {"train": "train", "valid": "valid", "validation": "valid", "test": "test"})
    if {src, tgt} != {"en", "de"}:
        raise ValueError(f"tatoeba_de_en has en and de only, not {src}-{tgt}")
    folder = shared_folder("tatoeba_de_en", root)
    return load_parallel_files(folder / f"{name}.{src}.gz", folder / f"{name}.{tgt}.gz")


_WMT_SETS = {("en-de", 2013), ("en-de", 2014), ("en-fr", 2014), ("en-ro", 2016)}


def wmt_test(
    pair: str, year: int, kind: Literal["newstest", "newsdev"] = "newstest", root: PathLike | None = None
) -> Dataset:
    """WMT news test set, detokenised, all lines kept (evaluation must stay aligned).

    Available: ``en-de`` newstest2013 (3,000) / newstest2014 (3,003, the "full" set), ``en-fr``
    newstest2014 (3,003), ``en-ro`` newsdev2016 / newstest2016 (1,999 each). The pair gives
    the direction: ``de-en`` reads the same files with German as the source.
    """
    src, tgt = pair.split("-")
    folder_pair = "-".join(sorted((src, tgt), key=lambda lang: lang != "en"))
    if (folder_pair, year) not in _WMT_SETS or (kind == "newsdev" and folder_pair != "en-ro"):
        raise ValueError(
            f"no WMT {kind}{year} for {pair}; available: {sorted(_WMT_SETS)} (newsdev: en-ro 2016)"
        )
    folder = shared_folder("wmt", root) / folder_pair
    return load_parallel_files(
        folder / f"{kind}{year}.{src}.gz", folder / f"{kind}{year}.{tgt}.gz", skip_empty=False
    )


def cnndm(split: str, root: PathLike | None = None) -> Dataset:
    """CNN/DailyMail summarisation (``source`` = article, ``target`` = summary sentences joined).

    * ``train`` (15,981) / ``valid`` (2,000; alias ``validation``): a subset of the official
      splits in See et al.'s preprocessing: LOWERCASED, PTB-tokenised.
    * ``cased_val1000``: the first 1,000 examples of the HF ``cnn_dailymail`` 3.0.0 validation
      split, cased and untokenised, with an extra ``id`` column.
    """
    name = _split_name(
        split, {"train": "train", "valid": "valid", "validation": "valid", "cased_val1000": "cased_val1000"}
    )
    root_dir = shared_folder("cnndm", root)
    if name == "cased_val1000":
        folder = root_dir / "cnndm_cased_val1000"
        return _aligned_dataset(
            {
                "source": folder / "val.source.gz",
                "target": folder / "val.target.gz",
                "id": folder / "val.id.gz",
            },
            skip_empty=False,
        )
    folder = root_dir / "cnndm"
    return load_parallel_files(folder / f"{name}.source.gz", folder / f"{name}.target.gz")


def fce(split: str, root: PathLike | None = None) -> Dataset:
    """FCE (BEA-2019 release v2.1) ``train`` (13,614 lines) / ``dev`` (1,081; alias ``validation``).

    PARAGRAPH-aligned, untokenised: the essays of ``fce.{split}.json.gz`` (one JSON object per
    essay: ``text`` plus character-offset ``edits`` ``[start, end, correction, type]``, with
    ``correction`` null for detection-only edits) with the corrections applied, split into
    paragraphs. Pairs with an empty side (2 in train: paragraphs deleted by the annotator)
    are dropped with a warning.
    """
    name = _split_name(split, {"train": "train", "dev": "dev", "validation": "dev"})
    folder = shared_folder("fce", root)
    return load_parallel_files(folder / f"fce.{name}.src.gz", folder / f"fce.{name}.tgt.gz")


def wi_locness(split: str, root: PathLike | None = None) -> Dataset:
    """BEA-2019 Write & Improve (A+B+C, no LOCNESS) ``train`` (34,308) / ``dev`` (3,396).

    Sentence-aligned, spaCy-tokenised; the target applies annotator 0's edits of the M2 files
    (``ABC.{split}.gold.bea19.m2.gz``). Pairs with an empty target (4 in train, 2 in dev:
    sentences deleted entirely) are dropped with a warning. ``validation`` = ``dev``.
    """
    name = _split_name(split, {"train": "train", "dev": "dev", "validation": "dev"})
    folder = shared_folder("wi_locness", root)
    return load_parallel_files(folder / f"{name}.src.gz", folder / f"{name}.tgt.gz")


def jfleg_dev(root: PathLike | None = None) -> Dataset:
    """JFLEG dev (754 tokenised sentences): ``source``, ``target`` (= reference 0) and
    ``references`` (the 4 fluency references, for GLEU). All lines kept, text verbatim
    (trailing spaces included)."""
    folder = shared_folder("jfleg", root)
    refs = [f"ref{i}" for i in range(4)]
    dataset = _aligned_dataset(
        {"source": folder / "dev.src.gz", **{r: folder / f"dev.{r}.gz" for r in refs}}, skip_empty=False
    )
    dataset = dataset.map(lambda ex: {"target": ex["ref0"], "references": [ex[r] for r in refs]})
    return dataset.select_columns(["source", "target", "references"])


def conll2013_test(root: PathLike | None = None) -> tuple[Dataset, Path]:
    """CoNLL-2013 test (1,381 tokenised sentences; the usual dev set for CoNLL-2014).

    Returns the ``source``/``target`` dataset (target = the single annotator's edits applied;
    all lines kept, one target is empty) and the path of the M2 file
    (``conll2013.test.m2.gz``: blocks of an ``S`` tokenised sentence followed by
    ``A start end|||type|||correction|||REQUIRED|||-NONE-|||annotator`` lines) for the M2
    scorer, which needs one hypothesis per source line.
    """
    folder = shared_folder("conll2013", root)
    dataset = load_parallel_files(
        folder / "conll2013.test.src.gz", folder / "conll2013.test.ref0.gz", skip_empty=False
    )
    return dataset, folder / "conll2013.test.m2.gz"


def ptb(split: str, root: PathLike | None = None) -> Dataset:
    """Penn Treebank (Mikolov's LM version): ``train`` (42,068 lines) / ``valid`` (3,370) / ``test`` (3,761).

    Column ``text``: one sentence per line, lowercased, numbers as ``N``, rare words as
    ``<unk>`` (10k vocabulary); the leading/trailing space of each original line is stripped.
    """
    name = _split_name(split, {"train": "train", "valid": "valid", "validation": "valid", "test": "test"})
    path = shared_folder("ptb", root) / f"ptb.{name}.txt.gz"
    columns = _read_aligned({"text": path}, skip_empty=False)
    return Dataset.from_dict({"text": [line.strip() for line in columns["text"]]})


def libreoffice(split: str, root: PathLike | None = None, src: str = "en", tgt: str = "de") -> Dataset:
    """LibreOffice-help en-de corpus (``train``/``dev``/``test``, held-out help pages).

    Built (or reused) by :func:`ode_transformer.train.libreoffice_corpus.build_corpus` in ``root`` (default
    ``.cache/libreoffice-help`` in the repo); ``validation`` = ``dev``.
    """
    name = _split_name(split, {"train": "train", "dev": "dev", "validation": "dev", "test": "test"})
    folder = Path(root) if root is not None else DEFAULT_CACHE
    build_corpus(folder)
    return load_parallel_files(folder / f"{name}.{src}", folder / f"{name}.{tgt}")


# --------------------------------------------------------------------------------------------
# Data specs


@dataclass(frozen=True)
class DataSpec:
    """Where the data of a training run comes from.

    Attributes:
        kind: ``"shared"`` (a named shared corpus), ``"files"`` (local files, see :func:`load_local_file`) or
            ``"hub"`` (Hub id or local dataset folder, see :func:`load_hub_dataset`).
        name: shared corpus name (``multi30k``, ``tatoeba_de_en``, ``libreoffice``, ``cnndm``, ``wi_locness``,
            ``fce``, ``ptb``) or Hub id / local dataset folder.
        config: Hub configuration (e.g. ``de-en``, ``3.0.0``).
        source_lang, target_lang: languages (Multi30k, LibreOffice, Hub ``translation``) or,
            for the Hub and local TSV/JSONL files, column names.
        files: for ``kind="files"``: split -> ``(source file, target file)`` or one file spec of
            :func:`load_local_file`.
        root: data folder overriding the default of the shared corpora.
    """

    kind: Literal["shared", "files", "hub"]
    name: str | None = None
    config: str | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    files: Mapping[str, tuple[str, str] | str] | None = None
    root: str | None = None


_SPLITS = ("train", "validation", "test")


def _text_dataset(path: str, skip_empty: bool) -> Dataset:
    """A language model's ``text`` rows, one per line (stripped): a blank line would train on ``<s>`` alone, so a
    training split drops blank lines with :func:`load_parallel_files`' warning; an evaluation split keeps them."""
    lines = [line.strip() for line in read_lines(path)]
    blank = [number for number, line in enumerate(lines, start=1) if not line]
    kept = [line for line in lines if line] if skip_empty else lines
    _warn_skipped(_LineReport([path], len(lines), len(kept), empty_lines=blank), skip_empty)
    return Dataset.from_dict({"text": kept})


def _file_pair(spec: str) -> tuple[str, str]:
    """``"SRC,TGT"`` split at its first comma; a path holding a comma of its own is named with the fix."""
    source, target = spec.split(",", 1)
    both_exist = Path(source).is_file() and Path(target).is_file()
    if not both_exist and (Path(spec).is_file() or spec.count(",") > 1):
        raise ValueError(
            f"{spec!r}: a path holds a comma, but 'SRC,TGT' is split at the first comma (into {source!r} and "
            f"{target!r}); rename the file, or link it under a name without a comma"
        )
    return source, target


def _check_lm_text_file(spec: str, name: str) -> None:
    if name.endswith((".tsv", ".jsonl", ".json")):  # read as text, its JSON or header would be learned
        raise ValueError(
            f"{spec}: a language model trains on a plain text file, one sequence per line; write the file's text "
            "column to a .txt file first (e.g. jq -r .text FILE.jsonl > FILE.txt)"
        )


def iter_local_rows(
    spec: str,
    kind: Literal["seq2seq", "lm"],
    source_column: str = "source",
    target_column: str = "target",
    lines: int | None = None,
) -> Iterator[dict]:
    """The training rows of :func:`load_local_file`, read one line at a time (``--streaming true``): memory does not
    grow with the file. The same formats and checks (columns, a language model's plain text, aligned pairs); blank
    or empty-sided rows (a JSONL record without the fields asked for) are skipped with :func:`load_local_file`'s
    warning, given once the file is read to its end. ``lines``: the first ``lines`` rows only, their skipped ones
    warned about (:func:`ode_transformer.train.preparation.stream_local_file` reads them ahead of training).

    Raises:
        ValueError: as :func:`load_local_file`; a TSV/JSONL file read to its end without a row with text in both
            fields (JSONL's fields are not known before reading it all).
    """
    report = _LineReport(files=[spec], lines=0, kept=0)
    for number, row in _numbered_rows(spec, kind, source_column, target_column):
        if lines is not None and report.lines == lines:
            report.files = [f"{spec} (its first {lines} rows, read ahead)"]
            break
        report.lines += 1
        if row is None:
            report.empty_lines.append(number)
            continue
        report.kept += 1
        yield row
    else:
        if not report.kept and spec.removesuffix(".gz").endswith((".tsv", ".jsonl")):
            raise ValueError(
                f"{spec} has no row with text in both {source_column!r} and {target_column!r}: choose them with "
                "--source_column/--target_column (a.b reads key b of field a, e.g. translation.en)"
            )
    _warn_skipped(report, skip_empty=True)


def _numbered_rows(
    spec: str, kind: Literal["seq2seq", "lm"], source_column: str, target_column: str
) -> Iterator[tuple[int, dict | None]]:
    """(line number, row) of a local training file, read line by line; the row is None where the line is blank or
    lacks a side."""
    name = spec.removesuffix(".gz")
    if kind == "lm":
        _check_lm_text_file(spec, name)
        with _open_text(spec) as lines:
            for number, line in enumerate(lines, start=1):
                yield number, {"text": line.strip()} if line.strip() else None
        return
    if "," in spec:
        source, target = _file_pair(spec)
        with _open_text(source) as sources, _open_text(target) as targets:
            for number, (src, tgt) in enumerate(zip_longest(sources, targets), start=1):
                if src is None or tgt is None:
                    raise ValueError(
                        f"{source} and {target} have different line counts (one ends at line {number - 1}): give "
                        "line-aligned files, one segment per line"
                    )
                src, tgt = src.rstrip("\r\n"), tgt.rstrip("\r\n")
                yield number, {"source": src, "target": tgt} if src.strip() and tgt.strip() else None
        return
    if not name.endswith((".tsv", ".jsonl")):
        raise ValueError(
            f"--streaming true reads 'SRC,TGT' text files or a .tsv/.jsonl file line by line, not {spec!r}"
        )
    with _open_text(spec) as lines:
        header = next(lines, "").rstrip("\r\n").split("\t") if name.endswith(".tsv") else None
        if header is not None:
            _check_fields(header, [source_column, target_column], spec, "--source_column/--target_column")
        for number, line in enumerate(lines, start=2 if header else 1):
            src = tgt = None
            if line.strip() and header is None:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{spec}, line {number}: not a JSON object ({error.msg})") from None
                src, tgt = _optional_field(record, source_column), _optional_field(record, target_column)
            elif line.strip():
                fields = dict(zip(header, line.rstrip("\r\n").split("\t")))
                src, tgt = fields.get(source_column), fields.get(target_column)
            texts = isinstance(src, str) and isinstance(tgt, str) and src.strip() and tgt.strip()
            yield number, {"source": src, "target": tgt} if texts else None


def _open_text(path: str):
    return (
        gzip.open(path, "rt", encoding="utf-8-sig")
        if path.endswith(".gz")
        else open(path, encoding="utf-8-sig")
    )


def load_local_file(
    spec: tuple[str, str] | str,
    kind: Literal["seq2seq", "lm"],
    source_column: str = "source",
    target_column: str = "target",
    skip_empty: bool = True,
) -> Dataset:
    """One split from local files: ``(SRC, TGT)`` or ``"SRC,TGT"`` aligned text files, a TSV/JSONL file
    (``.gz`` allowed; columns ``source_column``/``target_column``) or, for ``lm``, one text file (a ``text``
    row per line, stripped). ``skip_empty=False`` keeps every row (an evaluation split)."""
    name = spec.removesuffix(".gz") if isinstance(spec, str) else ""
    if kind == "lm":
        _check_lm_text_file(spec, name)
        return _text_dataset(spec, skip_empty)
    if isinstance(spec, tuple) or "," in spec:
        return load_parallel_files(*(spec if isinstance(spec, tuple) else _file_pair(spec)), skip_empty)
    if name.endswith(".tsv"):
        return load_tsv(spec, source_column, target_column, skip_empty=skip_empty)
    if name.endswith((".jsonl", ".json")):
        return load_jsonl(spec, source_column, target_column, skip_empty=skip_empty)
    raise ValueError(f"cannot read {spec!r}: give 'SRC,TGT' text files or a .tsv/.jsonl file")


def _shared_readers(spec: DataSpec) -> dict[str, Callable[[], Dataset]]:
    src, tgt, root = spec.source_lang or "en", spec.target_lang or "de", spec.root
    corpora: dict[str, dict[str, Callable[[], Dataset]]] = {
        "multi30k": {s: (lambda s=s: multi30k(s, src, tgt, root)) for s in _SPLITS},
        "tatoeba_de_en": {s: (lambda s=s: tatoeba_de_en(s, src, tgt, root)) for s in _SPLITS},
        "libreoffice": {s: (lambda s=s: libreoffice(s, root, src, tgt)) for s in _SPLITS},
        "cnndm": {s: (lambda s=s: cnndm(s, root)) for s in ("train", "validation")},
        "wi_locness": {s: (lambda s=s: wi_locness(s, root)) for s in ("train", "validation")},
        "fce": {s: (lambda s=s: fce(s, root)) for s in ("train", "validation")},
        "ptb": {s: (lambda s=s: ptb(s, root)) for s in _SPLITS},
    }
    if spec.name not in corpora:
        raise ValueError(f"unknown shared corpus {spec.name!r}; choose one of {sorted(corpora)}")
    if spec.name in SHARED_FOLDERS:
        shared_folder(spec.name, root)  # fail before reading anything, naming --data_dir
    return corpora[spec.name]


def load_task_data(
    kind: Literal["seq2seq", "lm"], spec: DataSpec, without_train: bool = False
) -> DatasetDict:
    """Build the ``train``/``validation``/``test`` :class:`DatasetDict` described by ``spec``.

    Splits the source does not have are absent (e.g. ``cnndm`` has no test split here). Hub
    splits named ``valid``/``dev`` are renamed ``validation``. ``without_train``: a Hub dataset's other
    splits only (its training split streams, and is not downloaded).

    Raises:
        ValueError: unknown kind/corpus, or columns that do not fit ``kind`` (``lm`` needs
            ``text``, ``seq2seq`` needs ``source`` and ``target``).
    """
    if spec.kind == "shared":
        result = DatasetDict({split: read() for split, read in _shared_readers(spec).items()})
    elif spec.kind == "files":
        if not spec.files:
            raise ValueError("DataSpec(kind='files') needs files={split: (source, target)}")
        columns = (spec.source_lang or "source", spec.target_lang or "target")
        result = DatasetDict(
            {
                split: load_local_file(f, kind, *columns, skip_empty=split == "train")
                for split, f in spec.files.items()
            }
        )
    elif spec.kind == "hub":
        hub = (spec.name, spec.config, spec.source_lang, spec.target_lang)
        # without_train: the other splits are small; streamed in, the training split is never downloaded
        if without_train:
            names = [name for name in datasets.get_dataset_split_names(*hub[:2]) if name != "train"]
            with columns_named(*hub[:2]):  # a streamed split is read here, row by row
                loaded = {
                    name: Dataset.from_list(list(load_hub_dataset(*hub, name, streaming=True)))
                    for name in names
                }
        else:
            loaded = load_hub_dataset(*hub)
        renames = {"valid": "validation", "dev": "validation"}
        result = DatasetDict({renames.get(split, split): ds for split, ds in loaded.items()})
    else:
        raise ValueError(f"unknown DataSpec kind {spec.kind!r}; use 'shared', 'files' or 'hub'")
    needed = {"text"} if kind == "lm" else {"source", "target"}
    for split, dataset in result.items():
        if not needed <= set(dataset.column_names):
            raise ValueError(
                f"task {kind!r} needs columns {sorted(needed)}; split {split!r} has {dataset.column_names}"
            )
    return result
