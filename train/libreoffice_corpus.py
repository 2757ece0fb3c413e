"""English-German parallel corpus built from the LibreOffice help (the built-in demo corpus).

Source: the Debian packages ``libreoffice-help-en-us`` and ``libreoffice-help-de`` (fetched with
``apt-get download``, unpacked with ``dpkg-deb -x``). Their HTML pages live under
``usr/share/libreoffice/help/<lang>/text/<module>/...`` with the *same relative path* and the
*same element ids* in both languages, so every element whose ``id`` starts with ``par_id``
(paragraphs, list items, table cells, some headings) aligns exactly by
``(relative path, par_id)``: no sentence alignment is needed.

Processing (:func:`extract_paragraphs`, :func:`pair_paragraphs`, :func:`clean_pairs`):

* text is extracted with the stdlib :class:`html.parser.HTMLParser` (entities decoded, tags
  dropped, ``<br>`` -> space, ``<script>``/``<style>`` skipped), whitespace collapsed;
* when an id occurs more than once in a page (embedded sections) the first occurrence is kept;
* a pair is dropped when either side is empty, has no letter, is longer than ``max_chars``
  characters, or when both sides are identical (untranslated placeholders, code, names);
* exact duplicate pairs are dropped (first occurrence in sorted path order kept).

Held-out split BY HELP PAGE: every page (one ``.html`` file, a document) goes whole to one split,
chosen by a hash of its path (:func:`split_of_page`: :data:`DEV_PERCENT` % of the pages to dev,
:data:`TEST_PERCENT` % to test), so dev and test are unseen documents from every help module, the
same domain as training. Training pairs whose English or German side also occurs in dev or test
are dropped from train, so the held-out sets share no segment with it. (A test set of whole held-out
modules is out of domain: docs/training.md, "Why the test set changed".)

Outputs in the cache folder (default ``.cache/libreoffice-help`` in the repo): ``train.{en,de}``,
``dev.{en,de}``, ``test.{en,de}`` (one segment per line) and ``stats.json`` (counts per split and
per module, package names and versions, licence, the split rule). An existing complete output
folder is reused when its ``stats.json`` records the same split rule and ``max_chars``, and rebuilt
otherwise (an old folder never passes for the current corpus).

Licence of the text: MPL-2.0 (LibreOffice help content; see ``usr/share/doc/*/copyright`` in
the packages). CLI: ``python -m ode_transformer.train.libreoffice_corpus --out DIR [--debs-dir DIR]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from ode_transformer.files import write_atomic

__all__ = [
    "DEV_PERCENT",
    "LICENSE",
    "PACKAGES",
    "Pair",
    "SPLIT_RULE",
    "TEST_PERCENT",
    "CorpusError",
    "build_corpus",
    "clean_pairs",
    "download_debs",
    "extract_paragraphs",
    "main",
    "normalize_space",
    "pair_paragraphs",
    "split_by_page",
    "split_of_page",
]

logger = logging.getLogger(__name__)

PACKAGES: dict[str, str] = {"en": "libreoffice-help-en-us", "de": "libreoffice-help-de"}
"""Debian package per language."""
HELP_DIRS: dict[str, str] = {"en": "en-US", "de": "de"}
"""Folder under ``usr/share/libreoffice/help`` per language."""
DEV_PERCENT = 4
"""Share of the help pages held out as the dev set (~950 pairs)."""
TEST_PERCENT = 6
"""Share of the help pages held out as the test set (~1.45k pairs)."""
SPLIT_RULE = f"page: sha256(path) % 100 < {DEV_PERCENT} dev, < {DEV_PERCENT + TEST_PERCENT} test"
"""The split rule as recorded in ``stats.json``; a cached corpus with another rule is rebuilt."""
LICENSE = "MPL-2.0"
SPLITS = ("train", "dev", "test")
DEFAULT_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "libreoffice-help"

_ID_RE = re.compile(r"^par_id")
_VOID = frozenset(
    [
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "param",
        "source",
        "track",
        "wbr",
    ]
)
_SKIP = frozenset({"script", "style"})
_WS_RE = re.compile(r"\s+")


class CorpusError(RuntimeError):
    """The corpus cannot be built (apt-get/dpkg-deb missing or failing, packages absent)."""


class _ParagraphParser(HTMLParser):
    """Collects the text of every element whose ``id`` matches ``par_id...``.

    Nested elements are part of the paragraph text; a nested ``par_id`` element starts its own
    paragraph and its text is not repeated in the enclosing one.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: dict[str, str] = {}
        self._open: list[tuple[str, int, list[str], bool]] = []  # (id, start depth, text, first?)
        self._depth = 0
        self._skip_depth: int | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            if tag == "br":
                self._add(" ")
            return
        self._depth += 1
        if tag in _SKIP and self._skip_depth is None:
            self._skip_depth = self._depth
        ident = dict(attrs).get("id") or ""
        if _ID_RE.match(ident):
            first = ident not in self.paragraphs
            if first:
                self.paragraphs[ident] = ""  # reserve the document-order position
            self._open.append((ident, self._depth, [], first))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "br":
            self._add(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        if self._skip_depth == self._depth:
            self._skip_depth = None
        if self._open and self._open[-1][1] == self._depth:
            ident, _, pieces, first = self._open.pop()
            if first:
                self.paragraphs[ident] = normalize_space("".join(pieces))
        self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._skip_depth is None:
            self._add(data)

    def _add(self, text: str) -> None:
        if self._open:
            self._open[-1][2].append(text)


def normalize_space(text: str) -> str:
    """Collapse runs of whitespace (incl. no-break spaces) to one space and strip."""
    return _WS_RE.sub(" ", text).strip()


def extract_paragraphs(html: str) -> dict[str, str]:
    """``{par_id: plain text}`` of one help page, in document order (a repeated id keeps its first text)."""
    parser = _ParagraphParser()
    parser.feed(html)
    parser.close()
    return parser.paragraphs


@dataclass(frozen=True)
class Pair:
    """One aligned paragraph: ``module`` is the ``text/<module>/`` folder of its page."""

    module: str
    page: str
    par_id: str
    en: str
    de: str


def _pages(text_root: Path) -> dict[str, Path]:
    return {p.relative_to(text_root).as_posix(): p for p in sorted(text_root.rglob("*.html"))}


def pair_paragraphs(en_text_root: Path, de_text_root: Path) -> list[Pair]:
    """Align paragraphs of two ``help/<lang>/text`` folders by (page relative path, par_id).

    Pages or ids present in only one language are ignored. Pairs come in sorted page order,
    document order within a page.
    """
    en_pages, de_pages = _pages(Path(en_text_root)), _pages(Path(de_text_root))
    pairs = []
    for rel in sorted(en_pages.keys() & de_pages.keys()):
        en_par = extract_paragraphs(en_pages[rel].read_text(encoding="utf-8"))
        de_par = extract_paragraphs(de_pages[rel].read_text(encoding="utf-8"))
        module = rel.split("/", 1)[0]
        pairs.extend(Pair(module, rel, pid, en, de_par[pid]) for pid, en in en_par.items() if pid in de_par)
    return pairs


def _drop_reason(pair: Pair, max_chars: int) -> str | None:
    if not pair.en or not pair.de:
        return "empty"
    if not any(c.isalpha() for c in pair.en) or not any(c.isalpha() for c in pair.de):
        return "no_letters"
    if pair.en == pair.de:
        return "identical"
    if max(len(pair.en), len(pair.de)) > max_chars:
        return "too_long"
    return None


def clean_pairs(pairs: list[Pair], max_chars: int = 1000) -> tuple[list[Pair], dict[str, int]]:
    """Filter and dedupe pairs; returns the kept pairs and the number dropped per reason."""
    kept, seen, dropped = [], set(), Counter()
    for pair in pairs:
        reason = _drop_reason(pair, max_chars)
        if reason is None and (pair.en, pair.de) in seen:
            reason = "duplicate"
        if reason is not None:
            dropped[reason] += 1
            continue
        seen.add((pair.en, pair.de))
        kept.append(pair)
    return kept, dict(dropped)


def split_of_page(page: str) -> str:
    """``"dev"``, ``"test"`` or ``"train"`` for a page path: a stable hash, the same on every machine."""
    bucket = int(hashlib.sha256(page.encode("utf-8")).hexdigest(), 16) % 100
    return "dev" if bucket < DEV_PERCENT else "test" if bucket < DEV_PERCENT + TEST_PERCENT else "train"


def split_by_page(pairs: list[Pair]) -> tuple[dict[str, list[Pair]], int]:
    """Split pairs into train/dev/test by help page (:func:`split_of_page`), pages whole.

    Returns the splits and the number of training pairs dropped because their English or
    German side occurs in dev or test.
    """
    splits: dict[str, list[Pair]] = {name: [] for name in SPLITS}
    for pair in pairs:
        splits[split_of_page(pair.page)].append(pair)
    held_out = {text for name in ("dev", "test") for p in splits[name] for text in (p.en, p.de)}
    train = [p for p in splits["train"] if p.en not in held_out and p.de not in held_out]
    overlap = len(splits["train"]) - len(train)
    splits["train"] = train
    return splits, overlap


def _run(cmd: list[str], cwd: Path, hint: str) -> None:
    if shutil.which(cmd[0]) is None:
        raise CorpusError(f"`{cmd[0]}` not found. {hint}")
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CorpusError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()}\n{hint}")


_DEBS_HINT = (
    "Download the two packages elsewhere (`apt-get download {}`) and pass their folder with "
    "--debs-dir (build_corpus(debs_dir=...)).".format(" ".join(PACKAGES.values()))
)


def _find_deb(folder: Path, package: str) -> Path | None:
    found = sorted(folder.glob(f"{package}_*.deb"))
    return found[-1] if found else None


def download_debs(folder: Path) -> dict[str, Path]:
    """``apt-get download`` both help packages into ``folder`` (kept if already there)."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = [pkg for pkg in PACKAGES.values() if _find_deb(folder, pkg) is None]
    if missing:
        command = ["apt-get", "download", *missing]
        hint = "Is this a Debian/Ubuntu system with network? " + _DEBS_HINT
        try:
            _run(command, folder, hint)
        except CorpusError:
            if not hasattr(os, "geteuid") or os.geteuid() != 0:
                raise
            # A fresh machine may have empty package lists: refresh them once (as root) and retry.
            _run(["apt-get", "update", "-qq"], folder, hint)
            _run(command, folder, hint)
    return _locate_debs(folder)


def _locate_debs(folder: Path) -> dict[str, Path]:
    debs = {lang: _find_deb(folder, pkg) for lang, pkg in PACKAGES.items()}
    absent = [PACKAGES[lang] for lang, deb in debs.items() if deb is None]
    if absent:
        raise CorpusError(f"no .deb for {absent} in {folder}. {_DEBS_HINT}")
    return debs  # type: ignore[return-value]


def _deb_version(deb: Path) -> str:
    proc = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else deb.name.split("_")[1]


def _write_lines(path: Path, lines: list[str]) -> None:
    write_atomic(path, "".join(line + "\n" for line in lines))


def _outputs(out: Path) -> list[Path]:
    return [out / f"{s}.{lang}" for s in SPLITS for lang in PACKAGES] + [out / "stats.json"]


def build_corpus(
    out: str | Path | None = None,
    debs_dir: str | Path | None = None,
    max_chars: int = 1000,
    force: bool = False,
) -> dict:
    """Build (or reuse) the corpus in ``out`` and return its statistics (``stats.json``).

    Args:
        out: output/cache folder (default ``.cache/libreoffice-help`` in the repo).
        debs_dir: folder holding the two ``.deb`` files; default ``<out>/debs``, filled with
            ``apt-get download`` when they are missing.
        max_chars: pairs with a side longer than this many characters are dropped.
        force: rebuild even when all output files exist.
    """
    out = Path(out) if out is not None else DEFAULT_CACHE
    if not force and all(p.exists() for p in _outputs(out)):
        stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
        if (stats.get("split_rule"), stats.get("max_chars")) == (SPLIT_RULE, max_chars):
            return stats
        logger.warning(
            "%s holds a corpus built with other settings (split %s, max_chars %s): rebuilding it",
            out,
            stats.get("split_rule", "by module"),
            stats.get("max_chars"),
        )
    debs = _locate_debs(Path(debs_dir)) if debs_dir is not None else download_debs(out / "debs")
    with tempfile.TemporaryDirectory() as tmp:
        for deb in debs.values():
            _run(["dpkg-deb", "-x", str(deb), tmp], Path(tmp), "dpkg-deb is needed to unpack the packages.")
        help_root = Path(tmp) / "usr" / "share" / "libreoffice" / "help"
        raw = pair_paragraphs(help_root / HELP_DIRS["en"] / "text", help_root / HELP_DIRS["de"] / "text")
    pairs, dropped = clean_pairs(raw, max_chars)
    splits, overlap = split_by_page(pairs)
    out.mkdir(parents=True, exist_ok=True)
    for name, split in splits.items():
        for lang in PACKAGES:
            _write_lines(out / f"{name}.{lang}", [getattr(p, lang) for p in split])
    stats = {
        "license": LICENSE,
        "packages": {PACKAGES[lang]: _deb_version(deb) for lang, deb in debs.items()},
        "aligned_pairs": len(raw),
        "dropped": {**dropped, "train_overlapping_heldout": overlap},
        "max_chars": max_chars,
        "split_rule": SPLIT_RULE,
        "splits": {name: len(split) for name, split in splits.items()},
        "modules": {
            name: dict(sorted(Counter(p.module for p in split).items())) for name, split in splits.items()
        },
    }
    write_atomic(out / "stats.json", json.dumps(stats, indent=2) + "\n")
    logger.info("LibreOffice help corpus in %s: %s", out, stats["splits"])
    return stats


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: ``python -m ode_transformer.train.libreoffice_corpus --out DIR``."""
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_CACHE, help="output/cache folder")
    parser.add_argument("--debs-dir", type=Path, help="folder with the two .deb files (skips apt-get)")
    parser.add_argument("--max-chars", type=int, default=1000, help="drop pairs with a longer side")
    parser.add_argument("--force", action="store_true", help="rebuild even if the files exist")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        stats = build_corpus(args.out, args.debs_dir, args.max_chars, args.force)
    except CorpusError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print(json.dumps(stats["splits"]))


if __name__ == "__main__":
    main()
