"""The verdict plan: which runs come nearest to testing the paper's claim, in priority order, wherever they run (a
lent GPU: ``experiments.lease``; this CPU: ``experiments.queue``), what each batch will be able to read once complete,
written down before it runs, and tier (a)'s verdict, read by the rule below.

    python -m experiments.verdict --device h200          # each tier's runs: done, and to go, in that device's batches
    python -m experiments.verdict --write                # results/verdict.md: the plan, its pre-registration, tier (a)

A tier's runs go to one batch per device (``results/<study>/cpu_<device><suffix>``): one commit, one device, one
precision, as ``experiments.report`` pairs them. The tiers, in order:

* (a) ptb_paper residual and RK4 on six distinct seeds, pooled over every batch: the paper's central claim, at the
  paper's size (:func:`tier_a_verdict`);
* (b) multi30k_paired's power batch: the recipes' default block (gated RK2) beside residual and RK4, the power plan's seeds;
* (c) the rest of ptb_paper: RK2, RK2 with gamma = 1 and gated RK2, seeds 0-2;
* (d) the depth probe (``experiments.depth_gate``: schedules, gate, comparison on fresh seeds).

Tier (a)'s rule, fixed before any of its new pairs was read: a pair is residual and RK4 of one seed in one batch;
each seed counts once, its first complete pair (a seed's outcome carries across CPUs, so a second device's run of it
is nearly a duplicate); the test is a paired t-test of RK4 minus residual word perplexity stratified by device kind x
precision (the mean gap over the pairs, its error from the spread within strata, df = pairs - strata), read once, on
the first :data:`TIER_A_PAIRS` pairs to complete, at alpha :data:`TIER_A_ALPHA`: Holm's first step over ptb_paper's
declared family, whether or not its other rows have run. Each device kind trains seeds of its own
(:data:`TIER_A_DEVICE_SEEDS`); a GPU takes the verdict's seeds that no batch has completed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments import depth_gate
from experiments.costs import Costs
from experiments.records import comparable, load_results, refuse_bad_records
from experiments.report import RESULTS
from experiments.significance import ALPHA, POWER
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
    # (device label, its seeds) for a tier pooled over devices: each device kind trains seeds of its own; a device
    # not named (a GPU) takes the tier's seeds that no batch of the study has completed yet
    device_seeds: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def batch(self, device: str) -> str:
        return f"{device}{self.batch_suffix}"

    def folder(self, device: str, results: Path = RESULTS) -> Path:
        return results / self.study / batch_folder("cpu", self.batch(device))

    def seeds_for(self, device: str | None, results: Path = RESULTS) -> tuple[int, ...]:
        """The seeds ``device``'s batch runs: its own where the tier names them, else the tier's seeds less those
        with a complete pair anywhere (a pooled tier), else the tier's seeds."""
        own = dict(self.device_seeds)
        if device in own:
            return own[device]
        if not own:
            return self.seeds
        complete = {pair.seed for pair in counted_pairs(results / self.study)}
        # seeds no batch has begun first: a seed with a run somewhere is one a CPU queue is likely finishing
        begun = {run["seed"] for run in study_runs(results / self.study) if run["variant"] in self.variants}
        return tuple(
            sorted((s for s in self.seeds if s not in complete), key=lambda seed: (seed in begun, seed))
        )

    def wanted(
        self, done: list[dict[str, Any]], device: str | None = None, results: Path = RESULTS
    ) -> list[Run]:
        """Every run the tier asks for at this point, seed-major (a seed's pair finishes together)."""
        if not self.variants:
            return depth_gate.next_runs(done) + [(r["variant"], r["seed"]) for r in done]
        return [(variant, seed) for seed in self.seeds_for(device, results) for variant in self.variants]

    def pending(
        self, done: list[dict[str, Any]], device: str | None = None, results: Path = RESULTS
    ) -> list[Run]:
        finished = {(r["variant"], r["seed"]) for r in done}
        return [run for run in self.wanted(done, device, results) if run not in finished]


# Tier (a): the first pairs to complete that it reads, the seeds they may come from, and each CPU kind's own seeds by
# its batch label. Seed 0's pair is the first batch's (`cpu`, a Zen 4); the Zen 4's bf16 batch and the AMX Xeon's
# take the others; the AVX2-only EPYC, whose fp32 runs outlast a session ("What each machine can finish"), none.
TIER_A_PAIRS = 6
TIER_A_SEEDS = tuple(range(TIER_A_PAIRS))
TIER_A_DEVICE_SEEDS = (("bf16", (3, 4)), ("amx", (1, 2, 5)), ("avx2", ()))


TIERS = (
    Tier(
        "a",
        "ptb_paper",
        f"ptb_paper residual and RK4, {TIER_A_PAIRS} distinct seeds over every batch: the paper's central claim, "
        "at the paper's size",
        ("residual", "rk4"),
        TIER_A_SEEDS,
        device_seeds=TIER_A_DEVICE_SEEDS,
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
        # a folder may hold several tiers' runs ((a) and (c))
        wanted = set(tier.wanted(done, device, results))
        pending = tier.pending(done, device, results)
        rows.append((tier, [r for r in done if (r["variant"], r["seed"]) in wanted], pending))
    return rows


# --------------------------------------------------------------------------------------------
# Tier (a)'s verdict: one stratified test over the first distinct-seed pairs of every ptb_paper batch

TIER_A_METRIC = "Word perplexity"
TIER_A_ROWS = ("rk4", "residual")  # the gap is the first minus the second


def _tier_a_alpha() -> float:
    """Holm's first step over ptb_paper's declared family: the bar the RK4 test meets whatever the others read."""
    return ALPHA / STUDIES["ptb_paper"].holm_family()


TIER_A_ALPHA = _tier_a_alpha()


@dataclass(frozen=True)
class Pair:
    seed: int
    batch: str  # the batch folder's name
    stratum: str  # device kind x precision
    difference: float  # RK4 minus residual
    finished: str  # when the later of its two runs finished (ISO 8601, UTC)


def stratum(result: dict[str, Any]) -> str:
    """A run's device kind (CPU model or GPU name, and the kernels PyTorch ran) and precision."""
    _, name, capability, precision = comparable(result)
    return f"{name} {capability}, {precision}" if capability else f"{name}, {precision}"


def batch_pairs(folder: Path) -> list[Pair]:
    """Each seed's residual and RK4 runs of one batch folder, where they ran at one commit, device and precision."""
    ours, base = TIER_A_ROWS
    runs = {(r["variant"], r["seed"]): r for r in load_results(folder) if r["variant"] in TIER_A_ROWS}
    pairs = []
    for (variant, seed), run in sorted(runs.items()):
        other = runs.get((base, seed))
        if variant != ours or other is None or comparable(run) != comparable(other):
            continue
        difference = run["metrics"][TIER_A_METRIC] - other["metrics"][TIER_A_METRIC]
        finished = max(run.get("finished") or "", other.get("finished") or "")
        pairs.append(Pair(seed, folder.name, stratum(run), difference, finished))
    return pairs


def batch_folders(study_folder: Path) -> list[Path]:
    """A study's batch folders under results/ (none where the study has no results yet)."""
    return sorted(path for path in study_folder.glob("*") if path.is_dir()) if study_folder.is_dir() else []


def study_runs(study_folder: Path) -> list[dict[str, Any]]:
    """Every run record of every batch folder of a study."""
    return [run for folder in batch_folders(study_folder) for run in load_results(folder)]


def counted_pairs(study_folder: Path) -> list[Pair]:
    """Every batch's pairs, each seed once: its first complete pair. In the order they completed."""
    first: dict[int, Pair] = {}
    pairs = (pair for folder in batch_folders(study_folder) for pair in batch_pairs(folder))
    for pair in sorted(pairs, key=lambda p: p.finished):
        first.setdefault(pair.seed, pair)
    return sorted(first.values(), key=lambda p: p.finished)


def stratified_t_test(pairs: list[Pair]) -> dict[str, Any] | None:
    """The paired t-test of the mean difference with strata: the mean over the pairs, its standard error from the
    pooled spread within strata (so that a device's offset is not counted as noise), df = pairs - strata; None where
    no stratum has two pairs."""
    from scipy.stats import t

    strata: dict[str, list[float]] = {}
    for pair in pairs:
        strata.setdefault(pair.stratum, []).append(pair.difference)
    df = len(pairs) - len(strata)
    if df < 1:
        return None
    within = sum((d - statistics.fmean(ds)) ** 2 for ds in strata.values() for d in ds) / df
    mean = statistics.fmean(pair.difference for pair in pairs)
    error = math.sqrt(within / len(pairs))
    half = float(t.ppf(0.975, df)) * error
    statistic = mean / error if error else math.copysign(math.inf, mean)
    return {
        "pairs": len(pairs),
        "strata": {name: (len(ds), statistics.fmean(ds)) for name, ds in sorted(strata.items())},
        "mean": mean,
        "t": statistic,
        "df": df,
        "p": float(2 * t.sf(abs(statistic), df)),
        "ci95": (mean - half, mean + half),
    }


def plain_t_test(pairs: list[Pair]) -> dict[str, Any] | None:
    """The paired t-test over the same pairs with no strata (df = pairs - 1); None below two pairs."""
    return stratified_t_test([replace(pair, stratum="all") for pair in pairs])


def tier_a_verdict(results: Path = RESULTS) -> dict[str, Any]:
    """Tier (a) as pre-registered: the pairs counted so far and, once :data:`TIER_A_PAIRS` have completed, the
    verdict on the first of them (later pairs never change it), with the pooled t, the strata's gaps and the fp32
    pairs alone beside it."""
    counted = [pair for pair in counted_pairs(results / "ptb_paper") if pair.seed in TIER_A_SEEDS]
    reading: dict[str, Any] = {
        "counted": counted,
        "read": len(counted) >= TIER_A_PAIRS,
        "alpha": TIER_A_ALPHA,
    }
    if not reading["read"]:
        return reading
    pairs = counted[:TIER_A_PAIRS]
    test = stratified_t_test(pairs)
    reading |= {
        "test": test,
        "pooled": plain_t_test(pairs),
        "fp32": plain_t_test([pair for pair in pairs if pair.stratum.endswith(", fp32")]),
    }
    reading["beyond_noise"] = test is not None and test["p"] < TIER_A_ALPHA
    return reading


def _gap(test: dict[str, Any] | None) -> str:
    if test is None:
        return "untested (no stratum with two pairs)"
    low, high = test["ci95"]
    return (
        f"{test['mean']:+.2f} word perplexity (t {test['t']:.2f}, df {test['df']}, p {test['p']:.4f}; 95% CI "
        f"[{low:+.2f}, {high:+.2f}])"
    )


def tier_a_section(results: Path = RESULTS) -> list[str]:
    """results/verdict.md's account of tier (a): the rule, the pairs counted, and the verdict once it is read."""
    reading = tier_a_verdict(results)
    lines = [
        "## Tier (a): the verdict on RK4 against residual at the paper's size",
        "",
        f"- Rule (fixed before any new pair is read): a pair is residual and RK4 of one seed in one batch (one commit, "
        f"device and precision); each seed counts once, its first complete pair; seeds {_seeds(TIER_A_SEEDS)}; the "
        f"test is the paired t-test of RK4 minus residual word perplexity stratified by device kind x precision, "
        f"read once, on the first {TIER_A_PAIRS} pairs to complete, at alpha {TIER_A_ALPHA:.2f} (Holm's first step "
        f"over ptb_paper's {STUDIES['ptb_paper'].holm_family()} declared tests, whether or not the others have "
        "run). Beside it: the same pairs' unstratified t-test, each stratum's gap, and the fp32 pairs alone.",
        "- Seeds by device kind: "
        + "; ".join(f"`cpu_{label}` {_seeds(seeds)}" for label, seeds in TIER_A_DEVICE_SEEDS)
        + "; a GPU lease takes the rule's seeds that no batch has completed, those no batch has begun first.",
        "",
        "| seed | batch | device kind, precision | RK4 - residual | completed |",
        "|---|---|---|---|---|",
        *(
            f"| {p.seed} | `{p.batch}` | {p.stratum} | {p.difference:+.2f} | {p.finished[:10]} |"
            for p in reading["counted"]
        ),
        "",
    ]
    if not reading["read"]:
        return lines + [
            f"{len(reading['counted'])} of the {TIER_A_PAIRS} pairs have completed: the verdict is not read yet.",
            "",
        ]
    test = reading["test"]
    if reading["beyond_noise"]:
        side = "below" if test["mean"] < 0 else "above"
        verdict_line = f"RK4 is {side} residual beyond noise: {_gap(test)}."
    else:
        verdict_line = f"Not measured: {_gap(test)} (p not below {TIER_A_ALPHA:.2f})."
    strata = "; ".join(
        f"{name}: {n} pair{'s' * (n != 1)}, {gap:+.2f}" for name, (n, gap) in test["strata"].items()
    )
    return lines + [
        f"Verdict, on the first {TIER_A_PAIRS} pairs: {verdict_line}",
        "",
        f"- Without strata: {_gap(reading['pooled'])}.",
        f"- Each stratum's mean gap: {strata}.",
        f"- The fp32 pairs alone: {_gap(reading['fp32'])}.",
        "",
    ]


SESSION_MINUTES = 180  # a session's time on a CPU machine: a run that outlasts it is lost with the machine
SETUP_MINUTES = 15  # a new machine's install and the queue's worktree before the first step


def unfinished_runs(results: Path = RESULTS) -> list[dict[str, Any]]:
    """The progress of ptb_paper runs that had not finished when their session ended
    (``results/ptb_paper/<batch>/unfinished/``, from ``python -m experiments.queue NAME --unfinished``): the updates
    each reached, in how many seconds."""
    return [json.loads(p.read_text()) for p in sorted((results / "ptb_paper").glob("*/unfinished/*.json"))]


def minutes_per_run(results: Path = RESULTS, variants: tuple[str, ...] = TIER_A_ROWS) -> list[dict[str, Any]]:
    """The rows' minutes per run and per epoch on each device kind and thread count (`experiments.costs.Costs`:
    from the committed uninterrupted runs there or, where none has finished there, an unfinished run's minutes
    per update times the updates the row's finished runs took anywhere); whether such a run fits in a session
    after the setup."""
    finished = [run for run in study_runs(results / "ptb_paper") if run["variant"] in variants]
    stopped = [run for run in unfinished_runs(results) if run["variant"] in variants]

    def place(run: dict[str, Any]) -> tuple[str, int]:
        return stratum(run), run["device"].get("threads") or 1

    measured = {place(r) for r in finished if not r.get("resumed") and r.get("wall_time_s")}
    rows = []
    for kind, threads in measured | {place(r) for r in stopped}:
        costs = Costs()
        for run in finished:
            costs.add_result(run, here=place(run) == (kind, threads))
        here = [run for run in stopped if place(run) == (kind, threads)]
        for run in here:
            costs.add_stopped(("ptb_paper", run["variant"]), run["seconds"], run["steps"])
        for variant in variants:
            row = ("ptb_paper", variant)
            if (seconds := costs.estimate(row)) is None:
                continue
            cut_off = ", ".join(f"{r['steps']} updates" for r in here if r["variant"] == variant)
            runs = str(len(costs.seconds[row])) if row in costs.seconds else f"0 (unfinished: {cut_off})"
            minutes = seconds / 60
            rows.append({"kind": kind, "variant": variant, "threads": threads, "runs": runs, "minutes": minutes,
                         "epoch": costs.per_epoch(row) / 60, "fits": minutes + SETUP_MINUTES <= SESSION_MINUTES})  # fmt: skip
    return sorted(rows, key=lambda r: (r["kind"], r["variant"], r["threads"]))


def run_minutes(kind: str, variant: str, threads: int, results: Path = RESULTS) -> float | None:
    """The plan's minutes for one ptb_paper run of a row on a device kind and thread count (None: not measured)."""
    rows = minutes_per_run(results, (variant,))
    return next((r["minutes"] for r in rows if (r["kind"], r["threads"]) == (kind, threads)), None)


def plan_section(results: Path = RESULTS) -> list[str]:
    rows = minutes_per_run(results)
    return [
        "## What each machine can finish",
        "",
        f"Minutes per run of tier (a)'s rows, from the committed runs that were not resumed (the median where "
        "several); where none has finished on a device kind, from a run its session's end cut off: its minutes "
        "per update times the updates the row's finished runs took. A run fits where it ends within a "
        f"{SESSION_MINUTES}-minute session after {SETUP_MINUTES} minutes of setup. A queue started with `--until` "
        "(the session's end) starts a run only where it fits the time left, and one never measured on its device "
        "kind as its own measurement; the first run that does not fit ends its lane, so a pair's second run is "
        "never traded for another seed's first. Checkpoints do not outlive the machine.",
        "",
        "| device kind, precision | row | threads | runs | minutes per epoch | minutes per run | fits a session |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['kind']} | {r['variant']} | {r['threads']} | {r['runs']} | {r['epoch']:.1f} | {r['minutes']:.0f} "
            f"| {'yes' if r['fits'] else 'no'} |"
            for r in rows
        ),
        "",
        "A device kind with no row here has no uninterrupted run committed. The AVX2-only EPYC's fp32 batch "
        "(`cpu_avx2`) is one: its one attempt, a residual run, had not finished its second epoch after three hours "
        "(the stop of 2026-12-01), so it takes no seed of tier (a) and has no queue.",
        "",
    ]


# --------------------------------------------------------------------------------------------
# Pre-registration: what each batch can read once complete, from the sd of earlier pairs


def pair_sd(folder: Path, metric: str, pairs: dict[str, str], depth: int | None = None) -> tuple[float, int]:
    """The pooled sd of per-seed differences ``ours - baseline`` over the ``{ours: baseline}`` pairs of one committed
    batch, and its degrees of freedom: the reference spread a new batch of the same recipe is sized with."""
    runs = {
        (r["variant"], r["seed"]): r
        for r in load_results(folder, mixed=True)  # a folder of several devices: pairs within one only
        if depth is None or r["depth"] == depth
    }
    squares, df = 0.0, 0
    for ours, baseline in pairs.items():
        differences = [
            run["metrics"][metric] - runs[(baseline, seed)]["metrics"][metric]
            for (variant, seed), run in runs.items()
            if variant == ours
            and (baseline, seed) in runs
            and comparable(run) == comparable(runs[(baseline, seed)])
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
    from scipy.optimize import brentq

    from experiments.significance import t_test_power

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
    half_paper = (ptb_paper.paper[("rk4", 1)] - ptb_paper.paper[("residual", 1)]) / 2
    strata = len(TIER_A_DEVICE_SEEDS)
    tier_a_df = TIER_A_PAIRS - strata

    def tier_a_power(sd: float) -> float:
        return t_test_power(half_paper, sd, TIER_A_PAIRS, TIER_A_ALPHA, df=tier_a_df)

    largest_sd = brentq(lambda sd: tier_a_power(sd) - 0.95, 1e-3, abs(half_paper))
    lines += [
        "### (a) ptb_paper residual and RK4, pooled over batches",
        "",
        f"- {TIER_A_PAIRS} distinct-seed pairs in {strata} device kinds ({tier_a_df} df within strata), alpha "
        f"{TIER_A_ALPHA:.2f}: power {tier_a_power(ptb_sd):.2f} at half the paper's gap ({half_paper:+.2f}) where the "
        f"pairs vary as the `ptb` study's do (pooled pair sd {ptb_sd:.2f} word perplexity, {ptb_df} df, d 256, 1 "
        f"layer, results/ptb/cpu); power stays at 0.95 or more for a pair sd up to {largest_sd:.2f}.",
        f"- Seed 0's gap in the first batch, {seed0:+.2f} word perplexity, is one of the {TIER_A_PAIRS} pairs.",
        "- Reading: if RK4 is below residual beyond noise, that supports the paper's direction (it reports 126.89 "
        "against 142.33); if the interval excludes 0 on the other side, that contradicts it; if it holds 0, the gap "
        "is not measured.",
        "",
        "### (c) the rest of ptb_paper, seeds 0-2",
        "",
        "- Seeds: 0, 1, 2 of RK2, RK2 gamma = 1 and gated RK2, in one batch with residual of the same seeds. The "
        f"table Holm-corrects RK4 and the three RK2 rows against residual, and RK4 against gated RK2 ({tests} tests, "
        "the declared family, run or not).",
        f"- With 3 pairs a gap is beyond noise at Holm's first step (alpha {ALPHA / tests:.4f}) where |mean| exceeds "
        f"{critical:.2f} x sd / sqrt(3); at the `ptb` study's pair sd, 3 pairs detect "
        f"{_detectable(ptb_sd, 3, tests):.2f} with 80% power and give a 95% interval of "
        f"+-{reading(ptb_sd, 3, tests, {})['half_width']:.2f}.",
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
    # the non-inferiority tests compare rows across depths: their pairs vary as the deeper rows' do
    margin_power = non_inferiority_power(depth_sd, len(TATOEBA_FRESH_SEEDS), TATOEBA_MARGIN, 4)
    margin_seeds = next(
        n for n in range(2, 1000) if non_inferiority_power(depth_sd, n, TATOEBA_MARGIN, 4) >= POWER
    )
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
        f"truly equals the deeper row, at the deeper rows' pair sd {depth_sd:.2f}, and "
        f"{margin_power**4:.2f} for all four at once; {margin_seeds} fresh seeds would give each 0.8. The plan "
        f"keeps {len(TATOEBA_FRESH_SEEDS)}: no lease or session it has had could train {margin_seeds} seeds of every "
        "row, so a non-inferiority that is not rejected there measures nothing.",
        "- Reading: non-inferiority rejected for a deeper row means RK at 3 layers keeps that row's gain to within "
        "the margin: the paper's claim, at this setting. Where the gate does not pass, the probe says only that "
        "depth was not shown to help here.",
        "",
    ]
    return lines


# --------------------------------------------------------------------------------------------
# The recipes' default block: what our committed runs show about it

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
    if not seeds:
        return "none"
    return (
        f"{seeds[0]}-{seeds[-1]}"
        if len(seeds) > 2 and seeds == tuple(range(seeds[0], seeds[-1] + 1))
        else ", ".join(map(str, seeds))
    )


def document(
    results: Path = RESULTS, devices: tuple[str, ...] = ("h200", "h100", "bf16", "amx", "avx2")
) -> str:
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
        *tier_a_section(results),
        *plan_section(results),
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
        "--device", default="h200", help="the device label of the batches (h200, h100, bf16, amx, avx2)"
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
