"""The depth probe's reading of a ``tatoeba_depth`` batch, and the runs it needs next:
``python -m experiments.depth_gate results/tatoeba_depth/cpu_h200``.

The probe's three stages (``experiments/studies.py``, tatoeba_depth) are read here from the batch's results:

1. **schedules**: each row's schedule is the one with the lowest validation loss on the tuning seed;
2. **the gate**: does a deeper residual encoder (6 or 12 layers) score more BLEU than the 3-layer one beyond noise,
   over the gate seeds (paired t-test, Holm over the two deeper rows, p < 0.05)?
3. **the comparison**, on fresh seeds only (never the gate's, which the gate selected on): RK2 and RK4 against residual
   at 3 layers (paired t-test, Holm over the two), always; where the gate passed, RK at 3 layers against residual at 6
   and 12 layers as a non-inferiority test: the RK row keeps the deeper encoder's gain if the hypothesis "it is at
   least ``TATOEBA_MARGIN`` BLEU behind" is rejected (one-sided paired t-test on the differences plus the margin,
   Holm over the four).

Pure Python (no scipy), as the GPU machine's Python has torch and the wheels a lease installs, not necessarily scipy;
:func:`t_test_p` is ``scipy.stats.ttest_rel``'s p-value (tests/test_experiments.py checks it). Exits 0 once the
comparison is complete, 1 while runs are missing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from experiments.report import comparable, load_results
from experiments.significance import ALPHA, holm
from experiments.studies import (
    TATOEBA_DEPTH_ROWS,
    TATOEBA_FRESH_SEEDS,
    TATOEBA_GATE_SEEDS,
    TATOEBA_MARGIN,
    TATOEBA_RK_ROWS,
    TATOEBA_ROWS,
    TATOEBA_SCHEDULES,
    TATOEBA_TUNING_SEED,
    tatoeba_variant,
)

METRIC = "BLEU"
Run = tuple[str, int]  # (variant, seed)


def t_test_p(differences: list[float]) -> float | None:
    """Two-sided p-value of a one-sample t-test of the paired differences against 0 (Abramowitz and Stegun 26.7.3
    and 26.7.4: the t distribution's CDF for an integer number of degrees of freedom); None below two differences
    or where they are all equal (no spread to test against), as ``experiments.significance.paired_t_test``."""
    n = len(differences)
    if n < 2 or max(differences) - min(differences) <= 1e-9 * max(1.0, abs(differences[0])):
        return None
    df = n - 1
    t = abs(statistics.fmean(differences)) / (statistics.stdev(differences) / math.sqrt(n))
    theta = math.atan(t / math.sqrt(df))
    cos2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if df % 2:  # odd: A = (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)), up to cos^(df-3)
        for k in range(2, df - 1, 2):
            term *= cos2 * k / (k + 1)
            total += term
        inside = theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0)
        return max(0.0, 1.0 - 2.0 / math.pi * inside)
    for k in range(1, df - 2, 2):  # even: A = sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...), up to cos^(df-2)
        term *= cos2 * k / (k + 1)
        total += term
    return max(0.0, 1.0 - math.sin(theta) * total)


def non_inferiority_p(differences: list[float], margin: float) -> float | None:
    """One-sided p-value of H0 "the mean difference is at most -margin" against "it is above -margin": the paired
    t-test of ``differences + margin`` against 0, one-sided (half the two-sided p where the shifted mean is above 0)."""
    two_sided = t_test_p([d + margin for d in differences])
    if two_sided is None:
        return None
    return two_sided / 2 if statistics.fmean(differences) + margin > 0 else 1 - two_sided / 2


def _final_validation_loss(result: dict[str, Any]) -> float | None:
    curve = result.get("validation_curve") or []
    return curve[-1]["eval_loss"] if curve else None


def chosen_schedules(results: list[dict[str, Any]]) -> dict[str, str | None]:
    """Each row's schedule: the lowest final validation loss over its tuning-seed runs (ties to the earlier
    schedule); None for a row until all of its schedules have run."""
    losses = {r["variant"]: _final_validation_loss(r) for r in results if r["seed"] == TATOEBA_TUNING_SEED}
    chosen: dict[str, str | None] = {}
    for row in TATOEBA_ROWS:
        scores = [(losses.get(tatoeba_variant(row, s)), s) for s in TATOEBA_SCHEDULES]
        complete = all(loss is not None for loss, _ in scores)
        chosen[row] = min(scores, key=lambda item: item[0])[1] if complete else None
    return chosen


def _differences(
    results: list[dict[str, Any]], ours: str, baseline: str, seeds: tuple[int, ...]
) -> list[float]:
    """BLEU of ``ours`` minus ``baseline`` for each seed of ``seeds`` where both ran comparably (same commit,
    device and precision); other seeds' runs are not read."""
    by_run = {(r["variant"], r["seed"]): r for r in results if r["seed"] in seeds}
    return [
        by_run[(ours, seed)]["metrics"][METRIC] - by_run[(baseline, seed)]["metrics"][METRIC]
        for seed in seeds
        if (ours, seed) in by_run
        and (baseline, seed) in by_run
        and comparable(by_run[(ours, seed)]) == comparable(by_run[(baseline, seed)])
    ]


def _tests(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row, adjusted in zip(rows, holm([row["p"] for row in rows])):
        row["holm_p"] = adjusted
    return rows


def gate_rows(results: list[dict[str, Any]], schedules: dict[str, str | None]) -> list[dict[str, Any]]:
    """Each deeper residual row against the 3-layer one over the gate seeds: pairs, mean BLEU gap, Holm p."""
    shallow, *deeper = TATOEBA_DEPTH_ROWS
    rows = []
    for row in deeper:
        if schedules[row] is None or schedules[shallow] is None:
            rows.append({"row": row, "pairs": 0, "gap": None, "p": None})
            continue
        differences = _differences(
            results,
            tatoeba_variant(row, schedules[row]),
            tatoeba_variant(shallow, schedules[shallow]),
            TATOEBA_GATE_SEEDS,
        )
        gap = statistics.fmean(differences) if differences else None
        rows.append({"row": row, "pairs": len(differences), "gap": gap, "p": t_test_p(differences)})
    return _tests(rows)


def depth_helps(rows: list[dict[str, Any]]) -> bool:
    """A deeper row ahead of the 3-layer one with a Holm-corrected p below 0.05, over every gate seed (a batch
    that a lease cut short is judged once it is complete)."""
    return any(
        row["pairs"] >= len(TATOEBA_GATE_SEEDS)
        and row["holm_p"] is not None
        and row["holm_p"] < ALPHA
        and row["gap"] > 0
        for row in rows
    )


def comparison_rows(
    results: list[dict[str, Any]], schedules: dict[str, str | None], deeper_too: bool
) -> list[dict[str, Any]]:
    """The comparison on the fresh seeds: RK rows against residual at 3 layers (two-sided, Holm over the two) and,
    where ``deeper_too``, against the deeper residual rows (non-inferiority at the margin, Holm over the four)."""
    fresh = TATOEBA_FRESH_SEEDS

    def pairs(ours: str, baseline: str) -> list[float]:
        if schedules[ours] is None or schedules[baseline] is None:
            return []
        return _differences(
            results,
            tatoeba_variant(ours, schedules[ours]),
            tatoeba_variant(baseline, schedules[baseline]),
            fresh,
        )

    equal = []
    for rk in TATOEBA_RK_ROWS:
        d = pairs(rk, "residual")
        gap = statistics.fmean(d) if d else None
        equal.append({"row": rk, "against": "residual", "pairs": len(d), "gap": gap, "p": t_test_p(d)})
    rows = _tests(equal)
    if deeper_too:
        deeper = []
        for rk in TATOEBA_RK_ROWS:
            for row in TATOEBA_DEPTH_ROWS[1:]:
                d = pairs(rk, row)
                gap = statistics.fmean(d) if d else None
                p = non_inferiority_p(d, TATOEBA_MARGIN)
                deeper.append(
                    {"row": rk, "against": row, "pairs": len(d), "gap": gap, "p": p, "margin": TATOEBA_MARGIN}
                )
        rows += _tests(deeper)
    return rows


def next_runs(results: list[dict[str, Any]]) -> list[Run]:
    """The runs the probe needs next, stage by stage: the schedules until every row has one, then the gate and the
    equal-depth comparison on fresh seeds, then (once the gate has passed) the deeper rows on the fresh seeds."""
    done = {(r["variant"], r["seed"]) for r in results}
    schedules = chosen_schedules(results)
    if any(schedule is None for schedule in schedules.values()):
        return [
            (tatoeba_variant(row, s), TATOEBA_TUNING_SEED)
            for row in TATOEBA_ROWS
            for s in TATOEBA_SCHEDULES
            if (tatoeba_variant(row, s), TATOEBA_TUNING_SEED) not in done
        ]
    gate = [
        (tatoeba_variant(row, schedules[row]), seed)
        for seed in TATOEBA_GATE_SEEDS
        for row in TATOEBA_DEPTH_ROWS
    ]
    equal = [
        (tatoeba_variant(row, schedules[row]), seed)
        for seed in TATOEBA_FRESH_SEEDS
        for row in ("residual", *TATOEBA_RK_ROWS)
    ]
    wanted = gate + equal
    if depth_helps(gate_rows(results, schedules)):
        wanted += [
            (tatoeba_variant(row, schedules[row]), seed)
            for seed in TATOEBA_FRESH_SEEDS
            for row in TATOEBA_DEPTH_ROWS[1:]
        ]
    return [run for run in wanted if run not in done]


def describe(row: dict[str, Any]) -> str:
    shown = "no pairs" if row["gap"] is None else f"{row['gap']:+.2f} BLEU"
    p = "untested" if row["holm_p"] is None else f"Holm p {row['holm_p']:.3f}"
    test = f", non-inferiority at -{row['margin']} BLEU" if "margin" in row else ""
    return f"{row['row']} vs {row.get('against', TATOEBA_DEPTH_ROWS[0])}: {shown} over {row['pairs']} pairs, {p}{test}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.depth_gate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "folder", type=Path, help="a batch of tatoeba_depth, e.g. results/tatoeba_depth/cpu_h200"
    )
    folder = parser.parse_args(argv).folder
    # a folder of several commits is read: each stage pairs only runs of one commit (comparable)
    results = load_results(folder, mixed=True) if folder.is_dir() else []
    schedules = chosen_schedules(results)
    print("schedules: " + ", ".join(f"{row} {s or 'not yet'}" for row, s in schedules.items()))
    gate = gate_rows(results, schedules)
    for row in gate:
        print("gate: " + describe(row))
    helps = depth_helps(gate)
    print(
        "depth helps beyond noise: RK is compared with the deeper rows too"
        if helps
        else "depth not shown to help"
    )
    for row in comparison_rows(results, schedules, helps):
        print("comparison: " + describe(row))
    missing = next_runs(results)
    print(f"{len(missing)} runs to go" if missing else "complete")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
