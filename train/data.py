"""The data of a training run: the shared corpora, and the :class:`DataSpec` that says where a run's data comes from.

Seq2seq data has the columns ``source`` and ``target`` (plus, for a few evaluation sets, extra
columns documented per reader); language-modelling data has the column ``text``.

* Readers for the shared corpora in ``../shared/data`` (or ``$ODE_DATA_DIR``, see
  :func:`data_root`): :func:`multi30k`, :func:`tatoeba_de_en`, :func:`wmt_test`, :func:`cnndm`, :func:`fce`,
  :func:`wi_locness`, :func:`jfleg_dev`, :func:`conll2013_test`, :func:`ptb`, and
  :func:`libreoffice` for the built-in LibreOffice-help corpus.
* :func:`load_task_data` builds a train/validation/test :class:`~datasets.DatasetDict` from a
  :class:`DataSpec` (the single entry point of the training scripts): a shared corpus, local files
  (:mod:`ode_transformer.train.file_readers`) or a Hub dataset (:mod:`ode_transformer.train.hub_datasets`).

Word dropout on the source side (GEC) is a collator's, in :mod:`ode_transformer.train.trainer`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import datasets
from datasets import Dataset, DatasetDict

from .file_readers import aligned_dataset, load_local_file, load_parallel_files, read_aligned
from .hub_datasets import columns_named, load_hub_dataset
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
    "load_task_data",
    "multi30k",
    "shared_folder",
    "ptb",
    "tatoeba_de_en",
    "wi_locness",
    "wmt_test",
]

DATA_DIR_ENV = "ODE_DATA_DIR"
"""Environment variable overriding the shared data root."""


def clone_data_root(package_folder: Path) -> Path | None:
    """The shared corpora beside a clone (``../shared/data``) whose ``train/`` is `package_folder`; None for an
    installed package, whose folder is no clone (its neighbour would be ``site-packages/shared/data``): there only
    ``--data_dir`` or ``$ODE_DATA_DIR`` name the folder."""
    clone = package_folder.resolve().parent
    return clone.parent / "shared" / "data" if (clone / "pyproject.toml").is_file() else None


_DEFAULT_ROOT = clone_data_root(Path(__file__).parent)

PathLike = str | os.PathLike


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
        return aligned_dataset(
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
    dataset = aligned_dataset(
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
    columns = read_aligned({"text": path}, skip_empty=False)
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
