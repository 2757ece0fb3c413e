"""The text of the ``seeds``, ``detectable`` and ``power`` markers (experiments.claims fills them): what the paired
t-test detects from a row's observed sd of the per-seed differences, and the seeds a gap needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.significance import ALPHA, MAX_SEEDS, POWER, detectable_gap, seeds_needed
from experiments.summary_tables import ROOT, Table, fmt, name, parse


def _row_power(table: Table, depth: int, variant: str) -> tuple[dict[str, Any], dict[str, Any]]:
    row = table.row(variant, depth)
    return row, row[table.study.metrics[0].name]["paired"]


def _alpha(option: str, paired: dict[str, Any]) -> float:
    """``alpha=A``: a number, or ``holm`` for the bar of Holm's first step over the row's table."""
    return paired["power"]["holm_first_step_alpha"] if option == "holm" else float(option)


def _count(needed: int | None) -> str:
    return f"more than {MAX_SEEDS}" if needed is None else str(needed)


def seeds(table: Table, depth: int, variants: list[str], options: dict[str, str]) -> str:
    """The seeds the paired t-test needs to detect a row's gap (observed, or ``gap=paper``) with 80% power at
    ``alpha``, from the row's sd of the per-seed differences."""
    (variant,) = variants
    row, paired = _row_power(table, depth, variant)
    gap = row["paper_gap"] if options.get("gap") == "paper" else paired["gap"]
    return _count(seeds_needed(gap, paired["sd"], _alpha(options["alpha"], paired)))


def _span(values: list[str]) -> str:
    """``0.65-1.00`` from several formatted values, one value where they agree."""
    low, high = values[0], values[-1]
    return low if low == high else f"{low}-{high}"


def _gap_of(spec: str, root: Path) -> tuple[str, float]:
    """``FOLDER[@DEPTH]:ROW``: that row's name and its gap to its baseline (the paired one where it has pairs,
    else its unpaired means' difference)."""
    folder, _, variant = spec.partition(":")
    table, depth, _, _ = parse(folder, root)
    row = table.row(variant, depth)
    metric = table.study.metrics[0].name
    paired = row[metric].get("paired") or {}
    label = f"{name(table.study, variant)}'s gap in {folder.partition('@')[0]}"
    if paired.get("gap") is not None:
        return label, paired["gap"]
    return label, row[metric]["mean"] - table.row(row["baseline"], depth)[metric]["mean"]


def power(table: Table, depth: int, variants: list[str], options: dict[str, str], root: Path = ROOT) -> str:
    """What the paired t-test can detect from the rows' observed sd of the per-seed differences (a range over
    several rows): the gap it detects with 80% power over ``n`` seeds (default: the pairs run) at alpha 0.05 and at
    ``alpha`` (default: Holm's first step over the table), and the seeds a gap needs at both: for one row its paper's
    gap and its observed one, and ``gap=FOLDER[@DEPTH]:ROW`` that row's gap."""
    metric = table.study.metrics[0]
    digits = metric.digits
    records = [_row_power(table, depth, variant) for variant in variants]
    paired = [record for _, record in records]
    order = sorted(range(len(paired)), key=lambda i: paired[i]["sd"])
    sds = [paired[i]["sd"] for i in order]
    pairs = sorted({record["pairs"] for record in paired})
    n = int(options.get("n", pairs[0]))
    alphas = (ALPHA, _alpha(options.get("alpha", "holm"), paired[0]))
    names = ", ".join(name(table.study, variant) for variant in variants)
    each = " each" if len(variants) > 1 else ""
    count = "/".join(str(p) for p in pairs)
    text = (
        f"sd of the per-seed differences {_span([fmt(sd, digits) for sd in sds])} {metric.name} ({names}; "
        f"{count} pair{'s' if pairs != [1] else ''}{each}); {n} seeds detect "
        + " and ".join(
            f"{_span([fmt(detectable_gap(sd, n, alpha), digits) for sd in sds])} at alpha "
            + f"{alpha:.4f}".rstrip("0")
            for alpha in alphas
        )
        + f" with {POWER:.0%} power"
    )
    gaps: list[tuple[str, float]] = []
    if "gap" in options:
        gaps.append(_gap_of(options["gap"], root))
    elif len(variants) == 1:
        row, record = records[0]
        if row["paper_gap"] is not None:
            gaps.append(("the paper's gap", row["paper_gap"]))
        gaps.append(("the observed gap", record["gap"]))
    for label, gap in gaps:
        needed = [_span([_count(seeds_needed(gap, sd, alpha)) for sd in sds]) for alpha in alphas]
        text += f"; {label} {gap:+.{digits}f} needs {needed[0]} / {needed[1]} seeds"
    return text


def detectable(table: Table, depth: int, variants: list[str], options: dict[str, str]) -> str:
    """The smallest gap the paired t-test over ``n`` seeds detects with 80% power at ``alpha``, from the row's sd of
    the per-seed differences."""
    (variant,) = variants
    _, paired = _row_power(table, depth, variant)
    gap = detectable_gap(paired["sd"], int(options["n"]), _alpha(options["alpha"], paired))
    return fmt(gap, table.study.metrics[0].digits)
