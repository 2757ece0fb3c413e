"""The verdict plan (issue 61): which runs come nearest to testing the paper's claim, in priority order, wherever
they run (a lent GPU: ``experiments.lease``; this CPU: ``experiments.queue``), and what each batch will be able to
read once complete, written down before it runs.

    python -m experiments.verdict --device h200          # each tier's runs: done, and to go, in that device's batches
    python -m experiments.verdict --write                # results/verdict.md: the plan and its pre-registration

A tier's runs go to one batch per device (``results/<study>/cpu_<device><suffix>``): one commit, one device, one
precision, as ``experiments.report`` pairs them. The tiers, in order:

* (a) ptb_paper residual and RK4, seeds 0-2: the paper's central claim, at the paper's size;
* (b) multi30k_paired's power batch: the recipes' default block (gated RK2) beside residual and RK4, the power plan's seeds;
* (c) the rest of ptb_paper: RK2, RK2 with gamma = 1 and gated RK2, seeds 0-2;
* (d) the depth probe (``experiments.depth_gate``: schedules, gate, comparison on fresh seeds).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments import depth_gate
from experiments.records import load_results, refuse_bad_records
from experiments.report import RESULTS
from experiments.significance import ALPHA
from experiments.studies import (
    STUDIES,
    TATOEBA_FRESH_SEEDS,
    TATOEBA_GATE_SEEDS,
    TATOEBA_MARGIN,
    WMT14_BASE_GAPS,
    batch_folder,
)

Run = tuple[str, int]  # (variant, seed)
# the power table's count for RK4's gap on the H200 batch, at Holm's first step over tier (b)'s tests
POWER_SEEDS = 21
DOCUMENT = RESULTS / "verdict.md"


@dataclass(frozen=True)
class Tier:
    label: str
    study: str
    what: str
    # none: the depth probe, whose runs experiments.depth_gate names stage by stage
    variants: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()
    batch_suffix: str = ""  # the batch is the device's label plus this: the power batch is a batch of its own

    def batch(self, device: str) -> str:
        return f"{device}{self.batch_suffix}"

    def folder(self, device: str, results: Path = RESULTS) -> Path:
        return results / self.study / batch_folder("cpu", self.batch(device))

    def wanted(self, done: list[dict[str, Any]]) -> list[Run]:
        """Every run the tier asks for at this point, seed-major (a seed's pair finishes together)."""
        if not self.variants:
            return depth_gate.next_runs(done) + [(r["variant"], r["seed"]) for r in done]
        return [(variant, seed) for seed in self.seeds for variant in self.variants]

    def pending(self, done: list[dict[str, Any]]) -> list[Run]:
        finished = {(r["variant"], r["seed"]) for r in done}
        return [run for run in self.wanted(done) if run not in finished]


TIERS = (
    Tier(
        "a",
        "ptb_paper",
        "ptb_paper residual and RK4, seeds 0-2: the paper's central claim, at the paper's size",
        ("residual", "rk4"),
        (0, 1, 2),
    ),
    Tier(
        "b",
        "multi30k_paired",
        f"multi30k_paired's power batch: the recipes' default block (gated RK2) beside residual and RK4, "
        f"{POWER_SEEDS} seeds",
        ("residual", "rk2_gated", "rk4"),
        tuple(range(POWER_SEEDS)),
        "power",
    ),
    Tier(
        "c",
        "ptb_paper",
        "the rest of ptb_paper: RK2, RK2 gamma = 1 and gated RK2, seeds 0-2",
        ("rk2", "rk2_ones", "rk2_gated"),
        (0, 1, 2),
    ),
    Tier("d", "tatoeba_depth", "the depth probe: schedules, gate, then the comparison on fresh seeds"),
)


def progress(device: str, results: Path = RESULTS) -> list[tuple[Tier, list[dict], list[Run]]]:
    """Each tier with the finished runs of its batch on ``device`` and the runs it still needs."""
    rows = []
    for tier in TIERS:
        folder = tier.folder(device, results)
        done = load_results(folder) if folder.is_dir() else []
        wanted = set(tier.wanted(done))  # a folder may hold several tiers' runs (ptb_paper's (a) and (c))
        rows.append((tier, [r for r in done if (r["variant"], r["seed"]) in wanted], tier.pending(done)))
    return rows


# --------------------------------------------------------------------------------------------
# Pre-registration: what each batch can read once complete, from the sd of earlier pairs


def pair_sd(folder: Path, metric: str, pairs: dict[str, str], depth: int | None = None) -> tuple[float, int]:
    """The pooled sd of per-seed differences ``ours - baseline`` over the ``{ours: baseline}`` pairs of one committed
    batch, and its degrees of freedom: the reference spread a new batch of the same recipe is sized with."""
    runs = {
        (r["variant"], r["seed"]): r["metrics"][metric]
        for r in load_results(folder, mixed=True)  # a folder of several devices (results/ptb/cpu)
        if depth is None or r["depth"] == depth
    }
    squares, df = 0.0, 0
    for ours, baseline in pairs.items():
        differences = [
            value - runs[(baseline, seed)]
            for (variant, seed), value in runs.items()
            if variant == ours and (baseline, seed) in runs
        ]
        if len(differences) > 1:
            squares += statistics.variance(differences) * (len(differences) - 1)
            df += len(differences) - 1
    return math.sqrt(squares / df), df


def reading(sd: float, n: int, tests: int, gaps: dict[str, float]) -> dict[str, Any]:
    """What ``n`` pairs with differences of sd ``sd`` can read, with Holm over ``tests`` comparisons: the 95% interval's
    half-width, the gap detectable with 80% power at Holm's first step, and the power for each named gap."""
    from scipy.stats import t

    from experiments.significance import detectable_gap, t_test_power

    first_step = ALPHA / tests
    return {
        "half_width": float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n),
        "detectable": detectable_gap(sd, n, first_step),
        "power": {name: t_test_power(gap, sd, n, first_step) for name, gap in gaps.items()},
    }


def non_inferiority_power(sd: float, n: int, margin: float, tests: int) -> float:
    """Power of the one-sided non-inferiority test at ``margin`` over ``n`` pairs where the true difference is 0,
    at Holm's first step over ``tests`` comparisons."""
    from scipy.stats import nct, t

    critical = float(t.ppf(1 - ALPHA / tests, n - 1))
    return float(nct.sf(critical, n - 1, margin * math.sqrt(n) / sd))


def _fmt_power(power: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in power.items())


def preregistration(results: Path = RESULTS) -> list[str]:
    """The pre-registered reading of each tier's batch, computed from committed batches (named in the text)."""
    lines = []
    # (a), (c): ptb_paper. The reference spread: the `ptb` study's RK-vs-residual pairs (d 256, 1 layer, 3 seeds).
    ptb_sd, ptb_df = pair_sd(
        results / "ptb" / "cpu", "Word perplexity", {"rk4": "residual", "rk2": "residual"}, depth=1
    )
    seed0 = _seed_gap(results / "ptb_paper" / "cpu", "rk4", "Word perplexity")
    # the table's Holm family: every row against residual, and the declared tests between two rows
    from experiments.studies import STUDIES

    ptb_paper = STUDIES["ptb_paper"]
    tests = len(ptb_paper.variants) - 1 + len(ptb_paper.pairwise)
    critical = _t_critical(3, ALPHA / tests)
    lines += [
        "### (a) and (c): ptb_paper, seeds 0-2",
        "",
        "- Seeds: 0, 1, 2 of every row, one batch per device. The table Holm-corrects RK4 and the three RK2 rows "
        f"against residual, and RK4 against gated RK2 ({tests} tests); RK4 against residual is the test (a) "
        "completes.",
        f"- With 3 pairs a gap is beyond noise at Holm's first step (alpha {ALPHA / tests:.4f}) where |mean| exceeds "
        f"{critical:.2f} x sd / sqrt(3). Seed 0's RK4 gap in the first batch, {seed0:+.2f} word perplexity, is beyond "
        f"noise at that step if the pairs' sd is below {abs(seed0) * math.sqrt(3) / critical:.2f}.",
        f"- Reference spread: the `ptb` study (d 256, 1 layer, results/ptb/cpu) has a pooled pair sd of {ptb_sd:.2f} "
        f"word perplexity ({ptb_df} df); at that sd, 3 pairs detect {_detectable(ptb_sd, 3, tests):.2f} with 80% "
        f"power and give a 95% interval of +-{reading(ptb_sd, 3, tests, {})['half_width']:.2f}.",
        "- Reading: if RK4 is below residual beyond noise, that supports the paper's direction (it reports 126.89 "
        "against 142.33); if the interval excludes 0 on the other side, that contradicts it; if it holds 0, the gap "
        "is not measured.",
        "",
    ]
    # (b): multi30k_paired power batch. The reference spread: the H200 batch's RK2 and RK4 pairs (5 seeds each).
    m30k_sd, m30k_df = pair_sd(
        results / "multi30k_paired" / "cpu_h200", "BLEU", {"rk2": "residual", "rk4": "residual"}
    )
    paper = {
        "RK2-gated +1.00": WMT14_BASE_GAPS["rk2_gated"],
        "RK4 +1.14": WMT14_BASE_GAPS["rk4"],
        "+0.35": 0.35,
    }
    b = reading(m30k_sd, POWER_SEEDS, 3, paper)
    lines += [
        f"### (b) multi30k_paired power batch, seeds 0-{POWER_SEEDS - 1}",
        "",
        "- Rows: residual, gated RK2 (the recipes' default), RK4; tests: gated RK2 and RK4 against residual, and RK4 "
        "against gated RK2 (3 tests, Holm).",
        f"- Reference spread: the H200 batch results/multi30k_paired/cpu_h200 (RK2 and RK4 against residual, 5 "
        f"seeds each): pooled pair sd {m30k_sd:.3f} BLEU ({m30k_df} df).",
        f"- At that sd, {POWER_SEEDS} pairs give a 95% interval of +-{b['half_width']:.2f} BLEU, detect "
        f"{b['detectable']:.2f} BLEU with 80% power at Holm's first step, and have power {_fmt_power(b['power'])} "
        f"there. The sd itself is estimated from {m30k_df} df: a larger true sd lowers these powers.",
        "- Reading: if an interval's upper end is below the paper's gap (WMT'14 base: RK2-gated +1.00, RK4 +1.14), "
        "it excludes the paper's gain at this setting; if it lies above 0, it shows a gain; if it holds 0 and the "
        "paper's gap, it measures nothing. If a block's tests put it ahead of the others, the recipes' default "
        "follows it.",
        "",
    ]
    # (d): the depth probe. Reference spreads: multi30k_paired's H200 deeper-residual and RK pairs.
    depth_sd, depth_df = pair_sd(
        results / "multi30k_paired" / "cpu_h200",
        "BLEU",
        {"residual_x2": "residual", "residual_x4": "residual"},
    )
    gate = reading(depth_sd, len(TATOEBA_GATE_SEEDS), 2, {"+0.5": 0.5, "+1.0": 1.0})
    fresh = reading(m30k_sd, len(TATOEBA_FRESH_SEEDS), 2, {"+0.5": 0.5, "+1.0": 1.0})
    margin_power = non_inferiority_power(m30k_sd, len(TATOEBA_FRESH_SEEDS), TATOEBA_MARGIN, 4)
    lines += [
        "### (d) the depth probe (tatoeba_depth)",
        "",
        "- Schedules: every row trains once per schedule on the tuning seed; the lowest validation loss picks it.",
        f"- Gate: residual at 3, 6 and 12 layers on seeds {_seeds(TATOEBA_GATE_SEEDS)}; reference pair sd "
        f"{depth_sd:.2f} BLEU (multi30k_paired's H200 deeper rows, {depth_df} df): power {_fmt_power(gate['power'])} "
        f"at Holm's first step over the 2 deeper rows.",
        f"- Comparison on fresh seeds {_seeds(TATOEBA_FRESH_SEEDS)} (never the gate's): RK2 and RK4 against residual "
        f"at 3 layers, always (power {_fmt_power(fresh['power'])}, interval +-{fresh['half_width']:.2f} BLEU at sd "
        f"{m30k_sd:.3f}); where the gate passed, RK at 3 layers against residual at 6 and 12 layers, "
        f"non-inferiority at a margin of {TATOEBA_MARGIN} BLEU (4 tests, Holm): power {margin_power:.2f} where RK "
        "truly equals the deeper row.",
        "- Reading: non-inferiority rejected for a deeper row means RK at 3 layers keeps that row's gain to within "
        "the margin: the paper's claim, at this setting. Where the gate does not pass, the probe says only that "
        "depth was not shown to help here.",
        "",
    ]
    return lines


# --------------------------------------------------------------------------------------------
# The recipes' default block (issue 61): what our committed runs show about it

DEFAULT_BLOCK = "rk2_gated"  # every study's name for the paper's gated RK2 block, the recipes' default


def default_block_evidence(results: Path = RESULTS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(each committed comparison of the default block with residual: study, batch, depth, metric, verdict; each
    committed gate diagnostic of it: run, block, the share of tokens whose gate is saturated)."""
    comparisons = []
    for path in sorted(results.glob("*/*/summary.json")):
        for row in json.loads(path.read_text(encoding="utf-8")):
            if row["variant"] != DEFAULT_BLOCK:
                continue
            for metric, cell in row.items():
                if isinstance(cell, dict) and "paired" in cell:
                    comparisons.append(
                        {
                            "folder": path.parent.relative_to(results).as_posix(),
                            "depth": row["depth"],
                            "metric": metric + _direction(path.parent.parent.name, metric),
                            "verdict": cell["paired"]["verdict"],
                        }
                    )
    gates = []
    for path in sorted(results.glob("*/*/diagnostics/gates.json")):
        for run, blocks in json.loads(path.read_text(encoding="utf-8")).items():
            if run.startswith(f"{DEFAULT_BLOCK}-"):
                folder = path.parent.parent.relative_to(results).as_posix()
                gates += [
                    {
                        "run": f"{folder}/{run}",
                        "side": b["side"],
                        "block": b["block"],
                        "saturated": b["collapsed_share"],
                    }
                    for b in blocks
                ]
    return comparisons, gates


def _direction(study: str, metric: str) -> str:
    known = {m.name: m for m in STUDIES[study].metrics} if study in STUDIES else {}
    return " (lower is better)" if metric in known and known[metric].lower_is_better else ""


def default_block_section(results: Path = RESULTS) -> list[str]:
    comparisons, gates = default_block_evidence(results)
    lines = [
        "## The recipes' default block (gated RK2)",
        "",
        "Every recipe builds `encoder_ode_method: rk2` (`decoder_ode_method` for the LM), and given no coefficients "
        "that is the paper's gated RK2 block, y + g F1 + (1 - g) F2 (Eq. learnable): the paper's choice. "
        "Tier (b) puts it on trial against residual and RK4; until that verdict, the default stays the paper's. "
        "What the committed runs show about it (row `rk2_gated` of each study, against residual of the same seed, "
        "commit, device and precision; the reports' verdicts, Holm-corrected within each table):",
        "",
        "| results | depth | metric | gated RK2 against residual |",
        "|---|---|---|---|",
        *(f"| `{c['folder']}` | {c['depth']} | {c['metric']} | {c['verdict']} |" for c in comparisons),
        "",
        "Its gate (`experiments.block_diagnostic` on the test sentences; saturated: g below 0.01 or above 0.99, where "
        "the block is a residual step that still pays for F2, or y + F(y + F(y))):",
        "",
        "| run | block | tokens with a saturated gate |",
        "|---|---|---|",
        *(f"| `{g['run']}` | {g['side']} {g['block']} | {g['saturated']:.1%} |" for g in gates),
        "",
    ]
    return lines


def _seed_gap(folder: Path, variant: str, metric: str) -> float:
    runs = {(r["variant"], r["seed"]): r["metrics"][metric] for r in load_results(folder)}
    return runs[(variant, 0)] - runs[("residual", 0)]


def _t_critical(n: int, alpha: float) -> float:
    from scipy.stats import t

    return float(t.ppf(1 - alpha / 2, n - 1))


def _detectable(sd: float, n: int, tests: int) -> float:
    from experiments.significance import detectable_gap

    return detectable_gap(sd, n, ALPHA / tests)


def _seeds(seeds: tuple[int, ...]) -> str:
    return (
        f"{seeds[0]}-{seeds[-1]}"
        if seeds == tuple(range(seeds[0], seeds[-1] + 1))
        else ", ".join(map(str, seeds))
    )


def document(results: Path = RESULTS, devices: tuple[str, ...] = ("h200", "h100", "amx", "avx2")) -> str:
    lines = [
        "# The verdict plan and its pre-registered readings",
        "",
        "Generated by `python -m experiments.verdict --write` from `experiments/verdict.py` and the committed "
        "results; do not edit by hand.",
        "",
        "## Tiers, in priority order",
        "",
        "| tier | what | study | batch folder |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| ({tier.label}) | {tier.what} | `{tier.study}` | `cpu_<device>{tier.batch_suffix}` |"
        for tier in TIERS
    ]
    lines += [
        "",
        "## Where each device's batches stand",
        "",
        "| device | " + " | ".join(f"({t.label})" for t in TIERS) + " |",
    ]
    lines += ["|---|" + "---|" * len(TIERS)]
    for device in devices:
        cells = [f"{len(done)} done, {len(pending)} to go" for _, done, pending in progress(device, results)]
        lines.append(f"| {device} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "(d)'s runs to go are its current stage's: the next stage's runs are named once this one is complete.",
        "",
        *default_block_section(results),
        "## Pre-registration: what each batch will read",
        "",
        *preregistration(results),
    ]
    return "\n".join(lines).rstrip() + "\n"


@refuse_bad_records("python -m experiments.verdict")  # a damaged record or a mixed batch: one line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.verdict", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--device", default="h200", help="the device label of the batches (h200, h100, amx, avx2)"
    )
    parser.add_argument("--write", action="store_true", help=f"write {DOCUMENT.relative_to(RESULTS.parent)}")
    args = parser.parse_args(argv)
    if args.write:
        DOCUMENT.write_text(document(), encoding="utf-8")
        print(f"wrote {DOCUMENT}")
        return 0
    for tier, done, pending in progress(args.device):
        print(
            f"({tier.label}) {tier.folder(args.device).relative_to(RESULTS.parent)}: {len(done)} done, "
            f"{len(pending)} to go" + (f": {' '.join(f'{v}/seed{s}' for v, s in pending)}" if pending else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
