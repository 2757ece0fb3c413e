"""A batch folder's ``summary.json`` as the generated sentences read it: its rows, what a sentence calls each row,
and a marker's spec parsed (experiments.claims and experiments.power_text both fill markers from it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.studies import STUDIES, Metric, Study, size_and_batch

ROOT = Path(__file__).resolve().parents[1]

# The names sentences give the rows (a table's labels are too long for a sentence); a variant not named here is
# called by its label. ``_codeF`` adds ", code F", a ``.FACTOR`` the factor.
NAMES = {
    "residual": "residual",
    "rk2": "RK2",
    "rk2_ones": "RK2 gamma=1",
    "rk2_gated": "RK2-gated",
    "rk4": "RK4",
    "pc_rk2": "PC-RK2",
    "pc_rk4": "PC-RK4",
    "rk2_gated_authors": "authors' gate",
    "rk2_learnable_authors": "authors' scalars",
    "rk2_gated_norm": "LN gate",
    "rk2_gated_tableau": "gate started at g = 1/2",
    "residual_x2": "6 residual layers",
    "residual_x4": "12 residual layers",
    "residual_ft": "residual fine-tuned",
    "rk2_up": "RK2 upcycled",
    "rk4_up": "RK4 upcycled",
}


def name(study: Study, variant: str) -> str:
    """What a sentence calls a row: :data:`NAMES`, else the study's label."""
    block, _, factor = variant.partition(".")
    base = block.removesuffix("_codeF")
    if base not in NAMES:
        return study.variants[variant].label
    return NAMES[base] + (", code F" if block != base else "") + (f" ({factor})" if factor else "")


class Table:
    """One batch folder's ``summary.json`` (what experiments.report wrote): its study and rows."""

    def __init__(self, folder: str, root: Path = ROOT) -> None:
        path = root / folder / "summary.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{folder}: no summary.json; run `python -m experiments.report` for it first"
            )
        self.folder = folder
        self.study = STUDIES[Path(folder).parent.name]
        self.size, self.batch = size_and_batch(Path(folder).name)
        self.rows = json.loads(path.read_text(encoding="utf-8"))

    def depth(self, depth: int | None) -> int:
        depths = sorted({row["depth"] for row in self.rows})
        if depth is None and len(depths) > 1:
            raise ValueError(f"{self.folder} has depths {depths}: name one, {self.folder}@DEPTH")
        return depths[0] if depth is None else depth

    def row(self, variant: str, depth: int) -> dict[str, Any]:
        found = [r for r in self.rows if r["variant"] == variant and r["depth"] == depth]
        if not found:
            raise ValueError(f"{self.folder}: no row {variant!r} at depth {depth}")
        return found[0]

    def metric(self, metric_name: str | None) -> Metric:
        metrics = {m.name: m for m in self.study.metrics}
        return self.study.metrics[0] if metric_name is None else metrics[metric_name]


def parse(spec: str, root: Path) -> tuple[Table, int, list[str], dict[str, str]]:
    folder, *words = spec.split()
    folder, _, depth = folder.partition("@")
    table = Table(folder, root)
    options = dict(word.split("=", 1) for word in words if "=" in word)
    return table, table.depth(int(depth) if depth else None), [w for w in words if "=" not in w], options


def fmt(value: float, digits: int) -> str:
    return f"{value:.{digits}f}"
