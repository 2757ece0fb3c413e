"""experiments/verdict.py's tier (a): one pre-registered test over every ptb_paper batch (distinct seeds, strata by
device kind x precision, alpha fixed by the declared family), and the declared family in every report."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats

from experiments import report, significance, verdict
from experiments.studies import STUDIES

ZEN4 = ("AMD EPYC", "AVX512", "bf16")
AMX = ("Intel(R) Xeon(R) Processor", "AVX512", "bf16")
AVX2 = ("AMD EPYC", "AVX2", "fp32")


def write_run(
    folder: Path, variant: str, seed: int, perplexity: float, device=ZEN4, commit="abc", day=1
) -> None:
    name, capability, precision = device
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "study": "ptb_paper", "variant": variant, "depth": 1, "seed": seed, "steps": 100, "epochs": 10.0,
        "wall_time_s": 600.0, "resumed": False, "training_curve": [], "flags": {"bf16": precision == "bf16"},
        "git": {"commit": commit}, "device": {"name": name, "capability": capability, "threads": 2},
        "precision": {"precision": precision}, "finished": f"2026-12-{day:02d}T00:00:00+0000",
        "metrics": {"Word perplexity": perplexity, "Subword perplexity": perplexity},
    }  # fmt: skip
    (folder / f"{variant}-1-seed{seed}.json").write_text(json.dumps(record))


def pair(root: Path, batch: str, seed: int, gap: float, device=ZEN4, day=1, residual=110.0) -> None:
    folder = root / "ptb_paper" / batch
    write_run(folder, "residual", seed, residual, device, day=day)
    write_run(folder, "rk4", seed, residual + gap, device, day=day)


def test_the_alpha_is_holms_first_step_over_the_declared_five():
    assert STUDIES["ptb_paper"].holm_family() == 5  # 4 rows against residual, RK4 against gated RK2
    assert pytest.approx(0.01) == verdict.TIER_A_ALPHA


def test_each_seed_counts_once_its_first_complete_pair(tmp_path):
    """Seed 0 on a Zen 4 (day 1) and again on an AMX Xeon (day 3): one observation, the first; a seed outside the
    rule's seeds and a pair of two devices count for nothing."""
    pair(tmp_path, "cpu", 0, -10.0, ZEN4, day=1)
    pair(tmp_path, "cpu_amx", 0, -3.0, AMX, day=3)
    pair(tmp_path, "cpu_amx", 1, -8.0, AMX, day=2)
    pair(tmp_path, "cpu_amx", 9, -1.0, AMX, day=2)  # not one of the rule's seeds
    write_run(tmp_path / "ptb_paper" / "cpu_x", "residual", 2, 110.0, ZEN4)
    write_run(tmp_path / "ptb_paper" / "cpu_y", "rk4", 2, 100.0, AMX)  # seed 2's runs in two batches: no pair
    reading = verdict.tier_a_verdict(tmp_path)
    assert [(p.seed, p.batch, p.difference) for p in reading["counted"]] == [
        (0, "cpu", -10.0),
        (1, "cpu_amx", -8.0),
    ]
    assert not reading["read"]  # 2 of 6: not read
    assert "2 of the 6 pairs have completed: the verdict is not read yet." in verdict.tier_a_section(tmp_path)


def test_the_stratified_test_as_computed_by_hand(tmp_path):
    """Six pairs in three strata: the mean over pairs, its error from the pooled spread within strata, df 3; the
    verdict reads the first six pairs only (a seventh, later, changes nothing)."""
    gaps = {ZEN4: (-9.0, -11.0), AMX: (-6.0, -7.0), AVX2: (-10.0, -13.0)}
    seeds = {ZEN4: (0, 3), AMX: (1, 2), AVX2: (4, 5)}  # any six of the rule's seeds, two per stratum
    batches = {ZEN4: "cpu_bf16", AMX: "cpu_amx", AVX2: "cpu_avx2"}
    for device, (a, b) in gaps.items():
        pair(tmp_path, batches[device], seeds[device][0], a, device, day=1)
        pair(tmp_path, batches[device], seeds[device][1], b, device, day=2)
    differences = [d for pair_ in gaps.values() for d in pair_]
    within = sum((d - statistics.fmean(ds)) ** 2 for ds in gaps.values() for d in ds) / 3
    t = statistics.fmean(differences) / math.sqrt(within / 6)
    reading = verdict.tier_a_verdict(tmp_path)
    test = reading["test"]
    assert reading["read"] and test["df"] == 3
    assert test["mean"] == pytest.approx(-56.0 / 6) and test["t"] == pytest.approx(t)
    assert test["p"] == pytest.approx(2 * stats.t.sf(abs(t), 3))
    assert reading["beyond_noise"] == (test["p"] < 0.01)
    assert reading["pooled"]["df"] == 5 and reading["pooled"]["p"] == pytest.approx(
        stats.ttest_1samp(differences, 0.0).pvalue
    )
    assert reading["fp32"]["pairs"] == 2 and reading["fp32"]["mean"] == pytest.approx(-11.5)
    assert set(test["strata"]) == {
        verdict.stratum(json.loads(p.read_text())) for p in tmp_path.rglob("rk4-*.json")
    }
    # a seventh pair, completed later (seed 3 again, on an AMX): the verdict stays the first six's
    pair(tmp_path, "cpu_amx", 3, +20.0, AMX, day=9)
    assert verdict.tier_a_verdict(tmp_path)["test"] == test


def test_a_batch_of_residual_and_rk4_at_raw_p_002_is_not_beyond_noise():
    """The report Holm-corrects over the study's declared family, run or not: RK4's raw p 0.02 in a batch where only
    residual and RK4 ran is 0.10 after Holm over ptb_paper's five tests, within noise (the report read it at 0.02
    when it counted only the tests that had pairs)."""
    offsets = [0.0, 1.0, 0.5]
    # three pairs with gaps whose paired t-test gives p 0.02: mean m, sd s with m / (s / sqrt(3)) = t(0.99, 2)
    critical = stats.t.ppf(1 - 0.02 / 2, 2)
    spread = [-1.0, 0.0, 1.0]
    gaps = [-critical / math.sqrt(3) + e for e in spread]
    results = []
    for seed, (offset, gap) in enumerate(zip(offsets, gaps)):
        for variant, value in (("residual", 110.0 + offset), ("rk4", 110.0 + offset + gap)):
            results.append({
                "variant": variant, "depth": 1, "seed": seed, "metrics": {"Word perplexity": value},
                "wall_time_s": 60.0, "steps": 10, "training_curve": [], "flags": {"bf16": True},
                "git": {"commit": "abc"}, "device": {"name": "Intel Xeon", "capability": "AVX512"},
                "precision": {"precision": "bf16"},
            })  # fmt: skip
    study = STUDIES["ptb_paper"]
    study = type(study)(**{**study.__dict__, "metrics": study.metrics[:1]})  # word perplexity alone
    rows = {row["variant"]: row for row in report.aggregate(study, results, references=None)}
    paired = rows["rk4"]["Word perplexity"]["paired"]
    assert paired["p"] == pytest.approx(0.02)
    assert paired["p_holm"] == pytest.approx(0.10) and "within noise" in paired["verdict"]


def test_holm_over_a_declared_family_counts_the_tests_not_run():
    # 0.01 and 0.03 of a declared 4: 0.04, then max(0.04, 0.03 x 3) = 0.09
    assert significance.holm([0.01, None, 0.03], family=4) == pytest.approx([0.04, None, 0.09])
    with pytest.raises(ValueError, match="3 tests read from a declared family of 2"):
        significance.holm([0.1, 0.2, 0.3], family=2)


def test_the_gpu_takes_the_seeds_no_batch_has_completed(tmp_path):
    pair(tmp_path, "cpu", 0, -10.0, ZEN4)
    tier = verdict.TIERS[0]
    assert tier.seeds_for("amx", tmp_path) == (1, 2, 5)  # a CPU kind: its own
    assert tier.seeds_for("avx2", tmp_path) == ()  # none of its runs fits a session
    assert tier.seeds_for("h200", tmp_path) == (1, 2, 3, 4, 5)  # a GPU: every seed not yet complete
    assert tier.pending([], "h200", tmp_path)[:2] == [("residual", 1), ("rk4", 1)]
    # seeds no batch has begun come first: residual seed 1 ran on the AMX Xeon, whose queue trains its RK4 next
    write_run(tmp_path / "ptb_paper" / "cpu_amx", "residual", 1, 112.0, AMX)
    assert tier.seeds_for("h200", tmp_path) == (2, 3, 4, 5, 1)
