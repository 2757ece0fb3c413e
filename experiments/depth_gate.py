"""Does depth help in a batch of ``tatoeba_depth``? ``python -m experiments.depth_gate results/tatoeba_depth/cpu_h200``

Exits 0 where a deeper residual encoder (6 or 12 layers) scores more BLEU than the 3-layer one beyond noise, as
``experiments.report`` judges a gap: runs paired by seed, commit, device and precision, a paired t-test over the
seeds, Holm-corrected across the deeper rows, p < 0.05, over all three seeds. Exits 1 where none does, or before
every seed's pair has run. ``experiments/gpu_batch.sh`` trains the study's RK rows at 3 layers (phase ``depthrk``)
only then: the paper's claim, that an RK block buys the gains of a deeper encoder, can only show where a deeper
encoder gains.

Pure Python (no scipy), as the GPU machine's Python has torch and the wheels the batch installs, not necessarily
scipy; :func:`t_test_p` is ``scipy.stats.ttest_rel``'s p-value (tests/test_experiments.py checks it).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from experiments.report import ALPHA, comparable, holm, load_results
from experiments.studies import TATOEBA_DEPTH, TATOEBA_DEPTH_ROWS

METRIC = "BLEU"


def t_test_p(differences: list[float]) -> float | None:
    """Two-sided p-value of a one-sample t-test of the paired differences against 0 (Abramowitz and Stegun 26.7.3
    and 26.7.4: the t distribution's CDF for an integer number of degrees of freedom); None below two differences
    or where they are all equal (no spread to test against), as ``experiments.report.paired_t_test``."""
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


def deeper_rows(results: list[dict]) -> list[dict]:
    """Each deeper residual row against the 3-layer one: its pairs, mean BLEU gap, and Holm-corrected p."""
    baseline = {r["seed"]: r for r in results if r["variant"] == TATOEBA_DEPTH.baseline}
    rows = []
    for variant in TATOEBA_DEPTH_ROWS:
        if variant == TATOEBA_DEPTH.baseline:
            continue
        differences = [
            run["metrics"][METRIC] - baseline[run["seed"]]["metrics"][METRIC]
            for run in sorted((r for r in results if r["variant"] == variant), key=lambda r: r["seed"])
            if run["seed"] in baseline and comparable(run) == comparable(baseline[run["seed"]])
        ]
        gap = statistics.fmean(differences) if differences else None
        rows.append({"variant": variant, "pairs": len(differences), "gap": gap, "p": t_test_p(differences)})
    for row, adjusted in zip(rows, holm([row["p"] for row in rows])):
        row["holm_p"] = adjusted
    return rows


def depth_helps(rows: list[dict]) -> bool:
    """A deeper row ahead of the 3-layer one with a Holm-corrected p below 0.05, over every seed of the study (a
    batch that a deadline stopped is judged once it is complete)."""
    seeds = len(TATOEBA_DEPTH.seeds)
    return any(
        row["pairs"] >= seeds and row["holm_p"] is not None and row["holm_p"] < ALPHA and row["gap"] > 0
        for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.depth_gate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "folder", type=Path, help="a batch of tatoeba_depth, e.g. results/tatoeba_depth/cpu_h200"
    )
    folder = parser.parse_args(argv).folder
    rows = deeper_rows(load_results(folder) if folder.is_dir() else [])
    for row in rows:
        shown = "no pairs" if row["gap"] is None else f"{row['gap']:+.2f} BLEU"
        p = "untested" if row["holm_p"] is None else f"Holm p {row['holm_p']:.3f}"
        print(f"{row['variant']} vs {TATOEBA_DEPTH.baseline}: {shown} over {row['pairs']} pairs, {p}")
    helps = depth_helps(rows)
    print(
        "depth helps beyond noise: the RK rows run" if helps else "depth not shown to help: the RK rows wait"
    )
    return 0 if helps else 1


if __name__ == "__main__":
    sys.exit(main())
