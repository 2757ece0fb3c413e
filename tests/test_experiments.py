"""The reproduction studies: each study's smallest configuration end to end (two tiny runs, the
report, the resume-skip), and the runner's bookkeeping."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments import report as report_module
from experiments import run as runner
from experiments import significance
from experiments.studies import STUDIES, run_id, size_and_batch
from ode_transformer.files import read_lines
from ode_transformer.train.metrics import gleu_score
from tests.tiny_folder import save_tiny_folder

TINY = {
    "d_model": 16, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "encoder_attention_heads": 2,
    "decoder_attention_heads": 2, "max_train_samples": 64, "max_steps": 4, "save_steps": 2,
    "max_eval_samples": 8, "max_test_samples": 6, "vocab_size": 300, "max_source_length": 48,
    "max_target_length": 32, "num_beams": 2,
}  # fmt: skip


def tiny_args(tmp_path, study: str, variants: list[str]) -> list[str]:
    sets = [f"--set={key}={value}" for key, value in TINY.items()]
    return [study, "--only", *variants, "--seeds", "0", "--results", str(tmp_path / "results"),
            "--work-dir", str(tmp_path / "work"), "--parallel", "2", "--threads", "1", *sets]  # fmt: skip


def smallest(study_name: str) -> tuple[list[str], int]:
    """The baseline and one other variant at the smallest depth."""
    study = STUDIES[study_name]
    other = next(v for v in study.variants if v != study.baseline_of(v))
    return [study.baseline_of(other), other], min(study.depths)


# The one study whose end-to-end run starts its commands as the runner does, in child processes (two at once); the
# others' run here, one after the other (`run_here`): what they check is what the runner records from its
# commands' outputs, and each child would import torch and transformers again.
IN_CHILD_PROCESSES = "multi30k"


def run_here(command: list[str], cwd: Path, env: dict, stdout, stderr) -> int:
    """`Children.run` for a `python -m MODULE ARGS` command, in this process: its `main(ARGS)` with the command's
    environment, folder and log, and this process's threads, logging and environment restored after."""
    assert command[:2] == [sys.executable, "-m"], command
    module, *args = command[2:]
    stderr = stdout if stderr == subprocess.STDOUT else stderr
    threads, root = torch.get_num_threads(), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with (
        pytest.MonkeyPatch.context() as patch,
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        for name in set(os.environ) - set(env):
            patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        patch.chdir(cwd)
        try:
            code = importlib.import_module(module).main(args)
            return code if isinstance(code, int) else 0
        except SystemExit as exit_:
            return exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        finally:
            torch.set_num_threads(threads)
            root.handlers[:], root.level = handlers, level


@pytest.mark.slow
@pytest.mark.parametrize("study_name", sorted(STUDIES))
def test_study_end_to_end_with_report_and_resume(tmp_path, study_name, shared_data, capsys, monkeypatch):
    study = STUDIES[study_name]
    variants, depth = smallest(study_name)
    args = tiny_args(tmp_path, study_name, variants) + ["--depths", str(depth)]
    if study_name != IN_CHILD_PROCESSES:
        monkeypatch.setattr(runner.CHILDREN, "run", run_here)
        args[args.index("--parallel") + 1] = "1"  # one command at a time: they share this process
    source = None
    # a study that fine-tunes: its source is a tiny random residual model of the study's depth
    if study.source:
        source = str(tmp_path / "source-seed{seed}")
        save_tiny_folder(tmp_path / "source-seed0", weight_scale=3.0, **tiny_residual(depth))
        args += ["--source", source]
    assert runner.main(args) == 0
    folder = tmp_path / "results" / study_name / "cpu"
    results = {v: json.loads((folder / f"{run_id(v, depth, 0)}.json").read_text()) for v in variants}
    for variant, result in results.items():
        assert result["flags"] == {
            **study.flags(variant, depth, 0, "cpu", source),
            **{k: str(v) for k, v in TINY.items()},
        }
        assert result["seed"] == 0 and result["config"]["d_model"] == 16
        assert result["steps"] == 4 and result["wall_time_s"] > 0 and result["resumed"] is False
        assert len(result["git"]["commit"]) == 40 and result["device"]["device"] == "cpu"
        assert result["data"]["files"] and all(len(h) == 64 for h in result["data"]["files"].values())
        for metric in study.metrics:  # a derived metric is the report's, not the run's
            assert metric.per_word_of or math.isfinite(result["metrics"][metric.name]), metric.name
        assert result["device"]["capability"] == torch.backends.cpu.get_cpu_capability()
        assert result["precision"]["precision"] in ("bf16", "fp32") and result["precision"]["reason"]
        layers = result["config"][
            "decoder_layers" if result["config"]["is_encoder_decoder"] is False else "encoder_layers"
        ]
        assert layers == depth
        for (
            test
        ) in study.extra_tests:  # GLEU scored again here from the recorded hypotheses and the corpus files
            assert test.task == "gleu" and test.source in result["data"]["files"]
            record = result["extra_tests"][test.name]
            sources, references = (
                read_lines(shared_data / test.source),
                [read_lines(shared_data / r) for r in test.references],
            )
            assert len(record["hypotheses"]) == len(sources)
            score = gleu_score(sources, record["hypotheses"], references)
            assert record["metrics"] == {name: score[key] for key, name in test.metrics.items()}
    # The variants differ in exactly their own flags.
    a, b = (results[v]["config"] for v in variants)
    assert {k for k in a if a[k] != b.get(k)} - {"_name_or_path", "transformers_version"}
    # Resume: a second invocation skips both runs and trains nothing.
    capsys.readouterr()
    assert runner.main(args) == 0
    assert capsys.readouterr().out.count("skip ") == 2
    # Report: a table row per variant, a summary and a plot.
    rows = report_module.report(study, "cpu", tmp_path / "results")
    assert [r["variant"] for r in rows] == variants
    for row in rows:
        values = [results[row["variant"]]["metrics"][study.metrics[0].name]]
        assert row[study.metrics[0].name]["mean"] == pytest.approx(values[0])
    table = (folder / "README.md").read_text()
    assert all(study.variants[v].label in table for v in variants)
    assert (folder / "summary.png").stat().st_size > 1000
    if (
        study.flags(variants[0], depth, 0, "cpu")["task"] == "translation"
    ):  # paired BLEU bootstrap vs baseline
        assert 0.0 <= rows[1]["bootstrap_p"][0] <= 1.0
    else:
        assert all("bootstrap_p" not in row for row in rows)


def tiny_residual(depth: int) -> dict:
    """A tiny residual model as `multi30k_paired`'s residual rows are (Euler encoder and decoder)."""
    return {"encoder_ode_method": "euler", "encoder_ode_coefficients": "tableau", "encoder_layers": depth,
            "decoder_layers": depth}  # fmt: skip


def test_the_upcycle_study_starts_each_seed_from_its_source_and_refuses_a_missing_one(tmp_path):
    """`multi30k_upcycle`: every run's --model_name_or_path is its seed's source (the study's own, or --source); the
    RK rows convert it (--upcycle, learnable gamma from Euler's weights), the baseline fine-tunes it as it is; a run
    whose source is missing fails with that message and runs nothing."""
    study = STUDIES["multi30k_upcycle"]
    default = study.flags("rk2_up", 3, 1, "cpu")
    assert default["model_name_or_path"] == "runs/experiments/multi30k_paired/cpu/residual-3-seed1"
    flags = {v: study.flags(v, 3, 2, "cpu", "/models/residual-{seed}") for v in study.variants}
    assert {f["model_name_or_path"] for f in flags.values()} == {"/models/residual-2"}
    assert "upcycle" not in flags["residual_ft"] and "encoder_ode_method" not in flags["residual_ft"]
    for variant, method in (("rk2_up", "rk2"), ("rk4_up", "rk4")):
        assert flags[variant]["upcycle"] is True and flags[variant]["encoder_ode_method"] == method
        assert (flags[variant]["encoder_ode_coefficients"], flags[variant]["ode_coefficients_init"]) == (
            "learnable", "euler",
        )  # fmt: skip
    with pytest.raises(ValueError, match="study 'multi30k' trains from scratch: it takes no source model"):
        STUDIES["multi30k"].flags("rk2", 3, 0, "cpu", "/models/x")
    args = runner.parse_args(["multi30k_upcycle", "--work-dir", str(tmp_path), "--results", str(tmp_path),
                              "--source", str(tmp_path / "missing-{seed}")])  # fmt: skip
    run = runner.plan(study, "cpu", [0], ["rk2_up"], [3], args.source)[0]
    status = runner.execute(run, args)
    assert status.startswith(f"FAILED rk2_up-3-seed0: no source model {tmp_path / 'missing-0'}")
    assert not run.work_dir(tmp_path).exists()


def test_plan_is_seed_major_and_ids_name_variant_depth_seed():
    study = STUDIES["ptb"]
    runs = runner.plan(study, "cpu", [0, 1], ["residual", "rk4"], [1, 2])
    assert [r.id for r in runs[:4]] == ["residual-1-seed0", "rk4-1-seed0", "residual-2-seed0", "rk4-2-seed0"]
    assert {r.seed for r in runs[4:]} == {1}


def test_every_variant_of_a_study_shares_every_other_flag():
    """Same budget, data, schedule and seeds: two variants' flags differ only in the variants' own keys."""
    for study in STUDIES.values():
        for size in study.sizes:
            flags = {v: study.flags(v, study.depths[0], 0, size) for v in study.variants}
            own = {k for variant in study.variants.values() for k in variant.flags}
            shared = [{k: v for k, v in f.items() if k not in own} for f in flags.values()]
            assert all(s == shared[0] for s in shared), (study.name, size)


@pytest.mark.parametrize("study_name", ["multi30k", "ablations"])
def test_no_two_variants_of_a_study_compute_the_same_function(study_name):
    """Each row is its own model: a tiny encoder built from each variant's flags, with the same randomly perturbed
    parameters wherever two variants share them (so a learnable gamma starting at 1 differs from gamma = 1), gives
    different outputs for every pair. Two rows with one equation (once: weight sharing of the whole layer and
    RK2 gamma = 1) would give the same outputs."""
    from dataclasses import fields

    import torch

    from modeling_ode import ODETransformerConfig, ODETransformerModel

    study = STUDIES[study_name]
    names = {f.name for f in fields(ODETransformerConfig)}
    inputs = torch.tensor([[5, 9, 12, 7, 3, 2]])
    outputs = {}
    for variant in study.variants:
        flags = study.flags(variant, 2, 0, "cpu")
        config_fields = {k: v for k, v in {**flags, **TINY}.items() if k in names}
        config_fields.update(dropout=0.0, encoder_layers=2, decoder_layers=1, max_relative_position=2)
        config = ODETransformerConfig.from_preset(flags["preset"], **config_fields)
        torch.manual_seed(0)
        model = ODETransformerModel(config).eval()
        with torch.no_grad():
            for name, parameter in sorted(model.named_parameters()):
                noise = torch.randn(parameter.shape, generator=torch.Generator().manual_seed(len(name)))
                parameter.add_(0.3 * noise)
            outputs[variant] = model.encoder(input_ids=inputs).last_hidden_state
    same = [
        (a, b)
        for a in outputs
        for b in outputs
        if a < b and torch.allclose(outputs[a], outputs[b], atol=1e-5)
    ]
    assert same == []


def test_the_authors_gate_rows_own_one_gate_for_the_encoder_and_leave_the_decoder_alone():
    """`rk2_gated_authors` / `rk2_learnable_authors`: F the whole layer and one gate (2d + 1 parameters) or one pair
    of scalars for the whole encoder. `ode_coefficient_scope` is a global field, but the study's Euler decoder has
    constant coefficients: its parameters are the residual row's."""
    from dataclasses import fields

    from modeling_ode import ODETransformerConfig, ODETransformerModel

    study = STUDIES["multi30k"]
    names = {f.name for f in fields(ODETransformerConfig)} - {"d_model"}  # tiny's width

    def model(variant: str) -> ODETransformerModel:
        flags = study.flags(variant, 3, 0, "cpu")
        return ODETransformerModel(
            ODETransformerConfig.from_preset("tiny", **{k: v for k, v in flags.items() if k in names})
        )

    residual_decoder = sum(p.numel() for p in model("residual").decoder.parameters())
    for variant, own in [("rk2_gated_authors", 2 * 16 + 1), ("rk2_learnable_authors", 2)]:
        built = model(variant)
        assert built.config.ode_function_includes_residual
        assert built.encoder.config.encoder_layers == 3 and len(built.encoder.ode_coefficients) == 1
        assert sum(p.numel() for p in built.encoder.ode_coefficients.parameters()) == own
        assert sum(p.numel() for p in built.decoder.parameters()) == residual_decoder


def test_command_resumes_from_a_complete_checkpoint_only(tmp_path):
    run = runner.plan(STUDIES["ptb"], "cpu", [0], ["rk2_codeF"], [1])[0]
    out = run.work_dir(tmp_path)
    (out / "checkpoint-5").mkdir(parents=True)
    command = runner.train_command(run, tmp_path, "cpu", {})
    assert "--resume_from_checkpoint" not in command  # no trainer_state.json: incomplete
    (out / "checkpoint-5" / "trainer_state.json").write_text("{}")
    command = runner.train_command(run, tmp_path, "cpu", {})
    assert command[command.index("--resume_from_checkpoint") + 1] == "true"
    assert json.loads(command[command.index("--config_overrides") + 1]) == {
        "ode_function_includes_residual": True
    }


def test_paired_t_test_and_holm_by_hand():
    # diffs -2.0, -1.9, -2.1: t = -2 / (0.1 / sqrt(3)); with 2 degrees of freedom p = 1 - |t| / sqrt(t^2 + 2)
    t = -2 / (0.1 / math.sqrt(3))
    p = significance.paired_t_test([10.0, 10.2, 9.8], [12.0, 12.1, 11.9])
    assert p == pytest.approx(1 - abs(t) / math.sqrt(t * t + 2), rel=1e-9)
    # 1 degree of freedom (Cauchy): p = 1 - 2 atan(|t|) / pi; diffs 1, 2: t = 1.5 / (sqrt(0.5) / sqrt(2)) = 3
    assert significance.paired_t_test([28.0, 29.0], [27.0, 27.0]) == pytest.approx(
        1 - 2 * math.atan(3) / math.pi
    )
    assert significance.paired_t_test([1.0], [0.0]) is None  # one pair: nothing to test
    assert significance.paired_t_test([2.0, 3.0], [1.0, 2.0]) is None  # the same gap twice: no variance
    # Holm: sorted 0.01, 0.03, 0.04 times 3, 2, 1 -> 0.03, 0.06, 0.04 -> made non-decreasing: 0.03, 0.06, 0.06
    assert significance.holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert significance.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1


def fake_result(variant: str, seed: int, bleu: float, device: str = "AMD EPYC", commit: str = "abc") -> dict:
    return {"variant": variant, "depth": 3, "seed": seed, "metrics": {"BLEU": bleu, "chrF": 50.0},
            "wall_time_s": 60.0, "steps": 10, "training_curve": [], "flags": {"bf16": False},
            "git": {"commit": commit, "dirty": False}, "device": {"device": "cpu", "name": device, "capability": "AVX2"},
            "precision": {"precision": "fp32"}}  # fmt: skip


def test_gap_is_paired_by_seed_commit_device_and_precision():
    """Residual has seeds 0-2, RK4 seed 0 only: the gap is RK4's seed 0 minus residual's seed 0 (31 - 30), not
    minus residual's three-seed mean (28), untested with one pair; a run from another machine, commit or
    precision is not paired, and the table says so."""
    results = [fake_result("residual", 0, 30.0), fake_result("residual", 1, 27.0), fake_result("residual", 2, 27.0),
               fake_result("rk4", 0, 31.0), fake_result("rk2_gated", 1, 28.0), fake_result("rk2_gated", 2, 29.0),
               fake_result("rk2", 0, 40.0, device="Intel Xeon"), fake_result("rk2", 1, 40.0, commit="def"),
               {**fake_result("rk2", 2, 40.0), "precision": {"precision": "bf16"}}]  # fmt: skip
    rows = {
        row["variant"]: row for row in report_module.aggregate(STUDIES["multi30k"], results, references=None)
    }
    assert (
        rows["residual"]["BLEU"]["mean"] == pytest.approx(28.0) and "paired" not in rows["residual"]["BLEU"]
    )
    assert rows["rk4"]["BLEU"]["paired"]["verdict"] == "+1.00 (1 pair: untested)"
    # seeds 1-2: gap +1.5, paired p 0.205 (see above), the only tested row: Holm over the study's declared tests
    gated = rows["rk2_gated"]["BLEU"]["paired"]
    raw = 1 - 2 * math.atan(3) / math.pi
    assert gated["p"] == pytest.approx(raw)
    assert gated["p_holm"] == pytest.approx(min(1.0, raw * STUDIES["multi30k"].holm_family()))
    # the interval of diffs 1, 2: 1.5 +- t(0.975, 1) * sqrt(0.5) / sqrt(2), t(0.975, 1) = tan(0.475 pi) (Cauchy)
    half = math.tan(0.475 * math.pi) * 0.5
    assert gated["ci95"] == pytest.approx((1.5 - half, 1.5 + half))
    assert gated["verdict"] == f"+1.50 (p 1.000, within noise; 95% CI [{1.5 - half:+.2f}, {1.5 + half:+.2f}])"
    rk2 = rows["rk2"]["BLEU"]["paired"]
    assert rk2["pairs"] == 0 and rk2["verdict"] == "no comparable pair"
    assert [d["why"] for d in rk2["dropped"]] == [
        "device Intel Xeon here, AMD EPYC in the baseline's run",
        "commit def here, abc in the baseline's run",
        "precision bf16 here, fp32 in the baseline's run",
    ]
    table = report_module.markdown(STUDIES["multi30k"], "cpu", list(rows.values()))
    assert (
        "Not paired: RK2-block (depth 3), seed 0, with the baseline: device Intel Xeon here, AMD EPYC in the "
        "baseline's run." in table
    )
    family = STUDIES["multi30k"].holm_family()
    assert (
        f"Holm-corrected over the {family} tests the study declares (run or not); 'beyond noise': p < 0.05"
        in table
    )


def test_an_upcycled_row_is_also_paired_with_its_from_scratch_row_by_hand():
    """multi30k_upcycle's rows against multi30k_paired's of the same batch: paired by seed (a run of another device
    is dropped and named), the paired t-test by hand (df 1: Cauchy, p = 1 - 2 atan(t) / pi; df 2: p = 1 -
    t / sqrt(2 + t^2)), Holm across these comparisons."""
    study = STUDIES["multi30k_upcycle"]
    ours = [fake_result("residual_ft", s, b) for s, b in ((0, 35.0), (1, 34.0), (2, 36.0))]
    ours += [fake_result("rk2_up", s, b) for s, b in ((0, 36.0), (1, 35.0), (2, 37.0))]
    scratch = [fake_result("residual", s, b) for s, b in ((0, 34.0), (1, 34.0), (2, 35.0))]
    scratch += [
        fake_result("rk2", 0, 35.0),
        fake_result("rk2", 1, 35.5),
        fake_result("rk2", 2, 36.0, device="H200"),
    ]
    rows = report_module.aggregate(study, ours, references=None)
    report_module.compare_with_reference(study, rows, ours, scratch)
    residual, rk2 = (row["reference"] for row in rows)
    assert (residual["variant"], residual["pairs"], rk2["variant"], rk2["pairs"]) == ("residual", 3, "rk2", 2)
    assert residual["gap"] == pytest.approx(2 / 3) and rk2["gap"] == pytest.approx(0.25)  # (1.0 - 0.5) / 2
    assert residual["p"] == pytest.approx(1 - 2 / math.sqrt(6))  # t = (2/3) / (sqrt(1/3) / sqrt(3)) = 2
    assert rk2["p"] == pytest.approx(
        1 - 2 * math.atan(1 / 3) / math.pi
    )  # t = 0.25 / (1.5 / sqrt(2) / sqrt(2))
    assert residual["p_holm"] == pytest.approx(2 * residual["p"])  # the smaller p, times the 2 comparisons
    assert rk2["p_holm"] == pytest.approx(rk2["p"])
    assert rk2["dropped"] == [{"seed": 2, "why": "device AMD EPYC here, H200 in multi30k_paired's rk2 run"}]
    table = "\n".join(report_module.reference_table(study, rows))
    assert "| RK2-block upcycled from residual (learnable gamma from (1, 0)) | rk2 | +0.25 (p " in table
    # the reference batch has not run: said per seed
    report_module.compare_with_reference(study, rows, ours, [])
    assert rows[0]["reference"]["dropped"][0] == {
        "seed": 0, "why": "no run of this seed among multi30k_paired's residual runs"
    }  # fmt: skip
    for name, other in ((name, s.reference) for name, s in STUDIES.items() if s.reference):
        assert set(other[1]) <= set(STUDIES[name].variants) and set(other[1].values()) <= set(
            STUDIES[other[0]].variants
        ), name


def test_the_interval_of_three_differences_by_hand():
    """Differences 1, 2, 3: mean 2, sd 1; with 2 degrees of freedom the t CDF is 1/2 + t / (2 sqrt(2 + t^2)), so its
    0.975 quantile is 0.95 sqrt(2 / (1 - 0.95^2)), and the interval is 2 +- that / sqrt(3)."""
    half = 0.95 * math.sqrt(2 / (1 - 0.95**2)) / math.sqrt(3)
    assert significance.confidence_interval([1.0, 2.0, 3.0]) == pytest.approx((2 - half, 2 + half))
    assert significance.confidence_interval([1.0]) is None
    results = [fake_result("residual", s, 30.0) for s in range(3)]
    results += [fake_result("rk4", s, 30.0 + d) for s, d in enumerate((1.0, 2.0, 3.0))]
    rk4 = report_module.aggregate(STUDIES["multi30k"], results, references=None)[1]["BLEU"]["paired"]
    assert rk4["differences"] == pytest.approx({0: 1.0, 1: 2.0, 2: 3.0}) and rk4["sd"] == pytest.approx(1.0)
    assert (
        rk4["verdict"]
        == f"+2.00 (p {rk4['p_holm']:.3f}, within noise; 95% CI [{2 - half:+.2f}, {2 + half:+.2f}])"
    )


def test_power_lines_by_hand_and_by_simulation():
    """The paired t-test's power from the noncentral t: the textbook sample sizes (a two-sided one-sample t-test at
    alpha 0.05 and 80% power needs 34 pairs for an effect of half an sd, 15 for 0.8 sd), the smallest such n (one
    fewer falls short), a detectable gap that a simulation of the test detects as often as that power says, and the table's
    lines: at alpha 0.05 and at Holm's first step over the table's tested rows."""
    import numpy as np
    from scipy.stats import t

    assert significance.seeds_needed(0.5, 1.0, 0.05) == 34 and significance.seeds_needed(0.8, 1.0, 0.05) == 15
    n = significance.seeds_needed(1.14, 1.0, 0.05 / 2)
    assert (
        significance.t_test_power(1.14, 1.0, n, 0.025)
        >= 0.8
        > significance.t_test_power(1.14, 1.0, n - 1, 0.025)
    )
    assert significance.seeds_needed(0.001, 1.0, 0.05) is None  # beyond MAX_SEEDS
    gap = significance.detectable_gap(0.45, 5, 0.05)
    assert significance.t_test_power(gap, 0.45, 5, 0.05) == pytest.approx(0.8)
    differences = np.random.default_rng(0).normal(gap, 0.45, size=(40000, 5))
    statistic = differences.mean(1) / (differences.std(1, ddof=1) / math.sqrt(5))
    assert np.mean(np.abs(statistic) > t.ppf(0.975, 4)) == pytest.approx(0.8, abs=0.01)
    # residual 30 on seeds 0-2; rk4 (paper gap +1.14) +1 / +2 / +3 (sd 1); rk2_gated +0.5 / +0.5 / +1.5 (sd 0.577)
    results = [fake_result("residual", s, 30.0) for s in range(3)]
    results += [fake_result("rk4", s, 30.0 + d) for s, d in enumerate((1.0, 2.0, 3.0))]
    results += [fake_result("rk2_gated", s, 30.0 + d) for s, d in enumerate((0.5, 0.5, 1.5))]
    rows = report_module.aggregate(STUDIES["multi30k"], results, references=None)
    power = rows[1]["BLEU"]["paired"]["power"]  # rk2_gated comes first in the study's order
    # Holm's family is the study's declared tests, run or not: two rows ran, of 15
    family = STUDIES["multi30k"].holm_family()
    assert power["holm_first_step_alpha"] == pytest.approx(0.05 / family)
    assert power["detectable"]["alpha"] == pytest.approx(
        significance.detectable_gap(1 / math.sqrt(3), 3, 0.05)
    )
    table = report_module.markdown(STUDIES["multi30k"], "cpu", rows)
    rk4 = rows[2]["BLEU"]["paired"]["power"]
    detectable = [significance.detectable_gap(1.0, 3, a) for a in (0.05, 0.05 / family)]
    paper = [significance.seeds_needed(1.14, 1.0, a) for a in (0.05, 0.05 / family)]
    observed = [significance.seeds_needed(2.0, 1.0, a) for a in (0.05, 0.05 / family)]
    assert list(rk4["detectable"].values()) == pytest.approx(detectable)
    assert list(rk4["seeds_for_paper_gap"].values()) == paper
    assert (
        f"| RK4-block | 3 | 3 | 1.00 | {detectable[0]:.2f} / {detectable[1]:.2f} | +1.14 | {paper[0]} / {paper[1]} | "
        f"+2.00 | {observed[0]} / {observed[1]} |" in table
    )
    assert (
        f"each at alpha 0.05 / at Holm's first step over the study's {family} declared tests (alpha 0.0033), 2 of "
        "them tested here." in table
    )


def test_a_bootstrap_p_carries_the_sign_of_its_seeds_gap():
    """sacreBLEU's p alone reads as a win for a seed that lost: the table signs each by that seed's gap."""
    results = [fake_result("residual", s, 30.0) for s in range(3)]
    results += [fake_result("rk4", s, 30.0 + d) for s, d in enumerate((0.5, -0.25, 1.0))]
    rows = report_module.aggregate(STUDIES["multi30k"], results, references=None)
    rows[1]["bootstrap_p"] = {0: 0.2, 1: 0.01, 2: 0.406}
    assert report_module.signed_bootstrap(rows[1], "BLEU") == "+0.200 / -0.010 / +0.406"
    table = report_module.markdown(STUDIES["multi30k"], "cpu", rows)
    assert "| +0.200 / -0.010 / +0.406 |" in table and "signed by that seed's BLEU gap" in table
    assert "| BLEU vs baseline | chrF vs baseline |" in table  # chrF's verdict beside BLEU's


def test_systems_bootstrapped_together_get_the_p_of_each_pair_alone():
    """The report tests every run that shares a baseline run in one sacreBLEU PairedTest: each p equals that
    pair's own test, made with sacreBLEU directly."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    words = ["the", "a", "dog", "cat", "runs", "sleeps", "on", "mat", "warm", "red"]
    references = [" ".join(words[(i + j) % 10] for j in range(6)) for i in range(30)]
    baseline = [" ".join(ref.split()[:4]) for ref in references]
    systems = {
        "close": [ref if i % 3 else ref.split()[0] for i, ref in enumerate(references)],
        "far": [" ".join(reversed(ref.split())) for ref in references],
    }
    together = report_module.paired_bootstrap(systems, baseline, references)
    for name, hypotheses in systems.items():
        test = PairedTest(
            [("baseline", baseline), ("system", hypotheses)],
            {"BLEU": BLEU()},
            [references],
            test_type="bs",
            n_samples=report_module.BOOTSTRAP_SAMPLES,
        )
        assert together[name] == test()[1]["BLEU"][1].p_value
    assert together["close"] != together["far"]


def test_holm_counts_every_test_the_study_declares():
    """Holm's family is the study's declared tests, run or not (multi30k: each row against residual, and its two
    declared tests between rows): two rows with the same paired p both get F p; a third row with a larger p
    (RK2-gated), and with it the declared test of RK4 against RK2-gated, change nothing of theirs (the report read
    them at 2p, then at 4p, when it counted only the tests that had pairs)."""
    family = STUDIES["multi30k"].holm_family()
    assert family == 13 + 2  # 13 rows against residual at one depth, 2 tests between rows
    base = [fake_result("residual", s, 30.0 + s) for s in range(3)]

    def row_p(variants: dict[str, list[float]]) -> dict[str, float]:
        results = base + [fake_result(v, s, x) for v, xs in variants.items() for s, x in enumerate(xs)]
        rows = report_module.aggregate(STUDIES["multi30k"], results, references=None)
        return {r["variant"]: r["BLEU"]["paired"] for r in rows if "paired" in r["BLEU"]}

    gaps = [31.0, 32.2, 32.9]  # diffs 1.0, 1.2, 0.9
    raw = significance.paired_t_test(gaps, [30.0, 31.0, 32.0])
    two = row_p({"rk2": gaps, "rk4": gaps})
    assert two["rk2"]["p_holm"] == pytest.approx(family * raw) and two["rk4"]["p_holm"] == pytest.approx(
        family * raw
    )
    three = row_p({"rk2": gaps, "rk4": gaps, "rk2_gated": [31.0, 30.0, 33.0]})
    assert three["rk2"]["p_holm"] == pytest.approx(family * raw)
    assert three["rk4"]["p_holm"] == pytest.approx(family * raw)
    assert three["rk2_gated"]["p"] > raw


def test_a_declared_test_between_two_rows_is_paired_by_hand_and_joins_holms_family():
    """multi30k declares RK4 against RK2-gated and PC-RK4 against PC-RK2. RK4 - RK2-gated over seeds 0-2 is 1, 2, 3
    (mean 2, sd 1: t = 2 sqrt(3), df 2, p = 1 - t / sqrt(2 + t^2)); a seed of another device is dropped and named; the
    table's two rows and this test make Holm's family, so its p is at least the raw one and at most 3 times it;
    PC-RK4 without PC-RK2 is no test at all."""
    results = [fake_result("residual", s, 30.0) for s in range(3)]
    results += [fake_result("rk2_gated", s, 30.0 + d) for s, d in enumerate((0.5, 0.0, 1.0))]
    results += [fake_result("rk4", s, 30.0 + d) for s, d in enumerate((1.5, 2.0, 4.0))]
    results += [fake_result("rk4", 3, 40.0, device="H200"), fake_result("rk2_gated", 3, 30.0)]
    results += [fake_result("pc_rk4", s, 31.0) for s in range(3)]
    rows = {
        row["variant"]: row for row in report_module.aggregate(STUDIES["multi30k"], results, references=None)
    }
    (test,) = rows["rk4"]["pairwise"]
    t = 2 * math.sqrt(3)
    assert test["variant"] == "rk2_gated" and test["pairs"] == 3 and test["gap"] == pytest.approx(2.0)
    assert test["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t))
    assert test["dropped"] == [{"seed": 3, "why": "device H200 here, AMD EPYC in rk2_gated's run"}]
    others = [rows[v]["BLEU"]["paired"]["p"] for v in ("rk2_gated", "rk4")]
    family = STUDIES["multi30k"].holm_family()
    assert test["p_holm"] == pytest.approx(significance.holm([*others, test["p"]], family)[2])
    assert "pairwise" not in rows["pc_rk4"] and "pairwise" not in rows["rk2_gated"]
    table = report_module.markdown(STUDIES["multi30k"], "cpu", list(rows.values()))
    assert (
        f"| RK4-block | 3 | RK2-block (learnable gamma) | {test['verdict']} | seed 3: device H200 here"
        in table
    )
    for study in STUDIES.values():  # every declared test names two rows of its study
        assert all({a, b} <= set(study.variants) and a != b for a, b in study.pairwise), study.name


def test_a_resumed_run_marks_its_minutes_as_the_last_attempt_only():
    results = [
        fake_result("residual", 0, 30.0),
        {**fake_result("rk4", 0, 31.0), "resumed": True, "wall_time_s": 90.0},
    ]
    rows = report_module.aggregate(STUDIES["multi30k"], results, references=None)
    table = report_module.markdown(STUDIES["multi30k"], "cpu", rows).splitlines()
    assert table[6].endswith("| 10 | 1.0 |") and table[7].endswith("| 10 | 1.5 * |")  # residual, then rk4
    assert table[-1].startswith("min/run *: a run of the row resumed from a checkpoint")
    plain = report_module.markdown(STUDIES["multi30k"], "cpu", rows[:1])
    assert "*" not in plain.replace("**", "")


def test_a_second_batch_has_a_folder_of_its_own_and_its_report_names_it(tmp_path, refused):
    """`--batch h200`: the runs' results and checkpoints go to `cpu_h200`, beside the first batch's `cpu`, and the
    report of that folder is titled and reproduced with the label; a label that would blur the folder name is refused."""
    study = STUDIES["multi30k"]
    run = runner.plan(study, "cpu", [0], ["residual"], [3], batch="h200")[0]
    assert run.result_path(tmp_path) == tmp_path / "multi30k" / "cpu_h200" / "residual-3-seed0.json"
    assert run.work_dir(tmp_path) == tmp_path / "multi30k" / "cpu_h200" / "residual-3-seed0"
    assert size_and_batch(run.folder) == ("cpu", "h200") and size_and_batch("cpu") == ("cpu", None)
    assert runner.plan(study, "cpu", [0], ["residual"], [3])[0].result_path(tmp_path).parent.name == "cpu"
    folder = tmp_path / "multi30k" / "cpu_h200"
    folder.mkdir(parents=True)
    for variant, seed, bleu in [
        ("residual", 0, 30.0),
        ("residual", 1, 31.0),
        ("rk4", 0, 31.0),
        ("rk4", 1, 32.5),
    ]:
        record = {
            **fake_result(variant, seed, bleu),
            "size": "cpu",
            "config": {"vocab_size": 8000},
            "data": {"files": {}},
        }
        (folder / f"{variant}-3-seed{seed}.json").write_text(json.dumps(record))
    rows = report_module.report(study, "cpu", tmp_path, batch="h200")
    assert {row["variant"] for row in rows} == {"residual", "rk4"}
    table = (folder / "README.md").read_text()
    assert table.startswith("# multi30k (cpu_h200)")
    assert "`python -m experiments.report multi30k --size cpu --batch h200`" in table
    assert not (tmp_path / "multi30k" / "cpu").exists()
    error = refused(runner.parse_args, ["multi30k", "--batch", "h200_2"])
    assert "--batch: batch label 'h200_2': letters and digits only" in error


def batch_record(variant: str, seed: int, bleu: float = 30.0, **provenance) -> dict:
    """A multi30k run's record as the report reads it (fake_result, of ``provenance``'s device and commit, with
    the keys a whole record has)."""
    return {**fake_result(variant, seed, bleu, **provenance), "study": "multi30k", "size": "cpu",
            "config": {"vocab_size": 8000}, "data": {"files": {}}}  # fmt: skip


def write_batch(folder, records: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, record in records.items():
        (folder / name).write_text(record if isinstance(record, str) else json.dumps(record))


def test_a_batch_that_mixes_commits_devices_or_precisions_is_refused_by_name(tmp_path, refused):
    """One batch is one commit, one device and one precision: the report refuses a folder that mixes them, naming
    the files of each side and the fix, and writes nothing; `--mixed` reports it, pairing only runs that share all
    three, and says under the table what it mixes."""
    folder = tmp_path / "multi30k" / "cpu"
    argv = ["multi30k", "--results", str(tmp_path)]
    base = {
        "residual-3-seed0.json": batch_record("residual", 0),
        "rk4-3-seed0.json": batch_record("rk4", 0, 31.0),
    }
    for name, other in [
        ("commit", batch_record("residual", 1, commit="def")),
        ("device", batch_record("residual", 1, device="Intel Xeon")),
        ("precision", {**batch_record("residual", 1), "precision": {"precision": "bf16"}}),
    ]:
        write_batch(folder, {**base, "residual-3-seed1.json": other})
        error = refused(report_module.main, argv)
        assert error.count("\n") == 1 and "Traceback" not in error, error
        assert f"{folder} mixes runs of {name} " in error and "residual-3-seed1.json" in error, error
        assert "rk4-3-seed0.json" in error and "experiments.report --mixed" in error
        assert not (folder / "README.md").exists()
    report_module.main([*argv, "--mixed"])
    table = (folder / "README.md").read_text()
    assert (
        "**This folder mixes runs of precision fp32 (residual-3-seed0.json, rk4-3-seed0.json) / bf16" in table
    )
    assert "`python -m experiments.report multi30k --size cpu --mixed`" in table


@pytest.mark.parametrize(
    ("record", "said"),
    [
        (
            '{"variant": "rk4", "seed": 0, "metr',
            "is not complete JSON (Unterminated string",
        ),  # a write cut off
        ({"variant": "rk4", "seed": 0}, "is not a run's result record: it lacks metrics (half-written"),
        (
            {**batch_record("rk4", 0), "metrics": {"chrF": 50.0}},
            "has no 'BLEU' metric, which every run of multi30k",
        ),
        (
            {**batch_record("rk4", 0), "metrics": {"BLEU": math.nan, "chrF": 50.0}},
            "has metric 'BLEU' = nan, not a number",
        ),
    ],
    ids=["malformed", "partial", "no-metric", "nan"],
)
def test_a_damaged_record_is_named_with_its_fix_in_one_line(tmp_path, refused, record, said):
    """A malformed, half-written, metric-less or NaN record: the report names the file, what is wrong and the fix
    (run it again), in one line, never a traceback (a JSONDecodeError, KeyError or a NaN inside the statistics)."""
    folder = tmp_path / "multi30k" / "cpu"
    write_batch(folder, {"residual-3-seed0.json": batch_record("residual", 0), "rk4-3-seed0.json": record})
    error = refused(report_module.main, ["multi30k", "--results", str(tmp_path)])
    assert error.startswith(f"python -m experiments.report: error: {folder / 'rk4-3-seed0.json'} "), error
    assert said in error and "run that run again" in error and error.count("\n") == 1


def test_parallel_writers_of_gates_json_keep_every_run(tmp_path):
    """diagnostics/gates.json is read, merged and written back by every gated run of a batch (and by lease
    collects): under its lock, writers at once keep every row, and the file is never seen half-written."""
    import threading

    from experiments import block_diagnostic

    gates = tmp_path / "diagnostics" / "gates.json"

    def write(writer: int) -> None:
        for index in range(20):
            block_diagnostic.write_rows(gates, {f"run{writer}-{index}": [{"block": index}]})
            json.loads(gates.read_text())  # whole at every moment

    writers = [threading.Thread(target=write, args=(n,)) for n in range(6)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    rows = json.loads(gates.read_text())
    assert len(rows) == 120 and list(rows) == sorted(rows)
    assert [path.name for path in gates.parent.iterdir()] == ["gates.json"]  # no lock or temporary file left


def test_a_second_start_of_a_run_in_training_is_refused_and_deletes_nothing(tmp_path):
    """While another process trains a run (it holds the run's folder), a second start of it is refused, naming that
    process, and leaves the folder alone: no advice to pass --overwrite_output_dir, which would delete it."""
    from ode_transformer.files import hold_lock

    args = runner.parse_args(
        ["ptb", "--results", str(tmp_path / "results"), "--work-dir", str(tmp_path / "work")]
    )
    run = runner.plan(STUDIES["ptb"], "cpu", [0], ["residual"], [1])[0]
    out = run.work_dir(args.work_dir)
    out.mkdir(parents=True)
    (out / "events.log").write_text("the live run's first steps")  # no checkpoint yet: a start would clear it
    with hold_lock(out, *runner.runner_lock(out), "--work-dir"):
        status = runner.execute(run, args)
    assert status.startswith(f"FAILED residual-1-seed0: another run (pid {os.getpid()}) is training this"), (
        status
    )
    assert "overwrite" not in status and (out / "events.log").read_text() == "the live run's first steps"


# The training process of the signal test: it says it started (its pid, in the file it is given), then trains on.
FAKE_TRAINING = (
    "import os, pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(600)"
)
# experiments.run in a process of its own, its training command the fake one (the process is the subject here)
RUNNER = """
import sys
from experiments import run
run.train_command = lambda *_: [sys.executable, "-c", {fake!r}, {started!r}]
sys.exit(run.main(["ptb", "--only", "residual", "--seeds", "0", "--depths", "1", "--results", {results!r},
                   "--work-dir", {work!r}]))
"""


def _gone(pid: int) -> bool:
    """The process ended (a zombie left for its new parent to reap counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc (Linux)")
@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_stopped_runner_stops_its_training_process(tmp_path, signum):
    """SIGINT or SIGTERM of experiments.run (the runner alone, not its process group) stops its training process
    before the runner exits; a SIGKILL, which no handler sees, stops it too (its parent-death signal)."""
    import signal
    import subprocess
    import sys
    import time

    started = tmp_path / "started"
    code = RUNNER.format(
        fake=FAKE_TRAINING, started=str(started), results=str(tmp_path / "r"), work=str(tmp_path / "w")
    )
    runner_process = subprocess.Popen([sys.executable, "-c", code], cwd=runner.REPO)
    try:
        deadline = time.monotonic() + 60  # a bound, not a pace: each wait ends as soon as its condition holds
        while not (started.is_file() and started.read_text()):
            assert runner_process.poll() is None and time.monotonic() < deadline, "the training never started"
            time.sleep(0.02)
        child = int(started.read_text())
        runner_process.send_signal(getattr(signal, signum))
        exit_code = runner_process.wait(timeout=60)
        while not _gone(child):
            assert time.monotonic() < deadline, f"the training process {child} outlived its runner"
            time.sleep(0.02)
    finally:
        runner_process.kill()
        runner_process.wait()
    assert exit_code == {"SIGINT": 130, "SIGTERM": 143, "SIGKILL": -9}[signum]


def test_unknown_variant_or_size_is_a_clear_error(refused):
    assert "unknown variants ['rk5']" in refused(runner.parse_args, ["ptb", "--only", "rk5"])
    assert "has sizes cpu, not 'paper'" in refused(runner.parse_args, ["ptb_pilot", "--size", "paper"])


def test_factor_variants_compare_with_the_baseline_under_the_same_factor():
    pilot = STUDIES["ptb_pilot"]
    assert (
        pilot.baseline_of("rk4.word") == "residual.word"
        and pilot.baseline_of("residual.word") == "residual.word"
    )
    assert pilot.baseline_of("rk4.codeF") == "residual.pilot"  # code F does not apply to Euler
    assert STUDIES["ptb"].baseline_of("rk4_codeF") == "residual"
    for variant in pilot.variants:  # every factor has its residual run
        assert pilot.baseline_of(variant) in pilot.variants


def test_init_diagnostic_same_start_for_the_paper_readings(shared_data):
    """At initialisation with dropout off, Euler's single stage is its F, and an RK block's first stage is the
    same F(y) as Euler's (same seed, same weights): the stage norms agree exactly."""
    from experiments import init_diagnostic

    rows = {
        (r["connections"], r["block"]): r
        for r in init_diagnostic.main(["--sentences", "8", "--d-model", "32"])
    }
    assert len(rows) == 8
    for connections in ("learnable_dense", "residual"):
        residual, rk4 = rows[(connections, "residual")], rows[(connections, "rk4")]
        assert residual["first_stage_norm"] == pytest.approx(residual["last_stage_norm"])
        assert rk4["first_stage_norm"] == pytest.approx(residual["first_stage_norm"], rel=1e-5)
        assert all(math.isfinite(v) for r in rows.values() for k, v in r.items() if isinstance(v, float))


def _run_record(commit: str, built_vocab_size: int, train_sha: str = "a" * 64, **flags) -> dict:
    """A result record of the ptb study's residual, 1 layer, seed 0, made with the study's flags (and ``flags``)."""
    return {"study": "ptb", "variant": "residual", "depth": 1, "seed": 0, "size": "cpu",
            "data": {"files": {"ptb/ptb.train.txt.gz": train_sha}}, "git": {"commit": commit, "dirty": False},
            "config": {"vocab_size": built_vocab_size}, "flags": {**STUDIES["ptb"].flags("residual", 1, 0, "cpu"), **flags}}  # fmt: skip


def test_provenance_names_commits_changed_flags_and_mixed_vocabularies_and_refuses_mixed_data():
    ptb = STUDIES["ptb"]
    same = [_run_record("92924fb" + "0" * 33, 9972), _run_record("92924fb" + "0" * 33, 9972)]
    assert report_module.provenance(ptb, same) == ["Code: commit 92924fb (2 runs)."]
    mixed = [*same, _run_record("186199b" + "0" * 33, 10002)]
    lines = report_module.provenance(ptb, mixed)
    assert lines[0] == "Code: commit 186199b (1 runs), commit 92924fb (2 runs)."
    assert "(word, 10002) built different vocabularies**: 9972 (2 runs), 10002 (1 runs)" in lines[1]
    bpe = _run_record("92924fb" + "0" * 33, 10000, tokenizer_type="bpe", vocab_size=10000)
    lines = report_module.provenance(ptb, [*same, bpe])
    assert not any(
        "built different vocabularies" in line for line in lines
    )  # other flags: a factor, not a mix
    # ... but flags the study no longer sets are named under the table
    assert lines[1] == (
        "Flags the study has changed since residual-1-seed0 ran: tokenizer_type bpe -> word, vocab_size 10000 -> 10002."
    )
    with pytest.raises(ValueError, match="2 different versions of the data files"):
        report_module.provenance(ptb, [*same, _run_record("92924fb" + "0" * 33, 9972, train_sha="b" * 64)])


def test_a_batchs_own_device_and_source_are_named_in_its_command_not_reported_as_changed_flags():
    """A fine-tuning run's --source is its input, not a flag of the study: the table's command names it (and
    --device for GPU runs) instead of listing the model path as a flag the study has changed."""
    study = STUDIES["multi30k_upcycle"]

    def record(seed: int, device: str, source: str | None = None, **flags) -> dict:
        return {"variant": "rk2_up", "depth": 3, "seed": seed, "size": "cpu", "device": {"device": device},
                "data": {"files": {}}, "git": {"commit": "cf12255" + "0" * 33, "dirty": False}, "config": {"vocab_size": 8000},
                "flags": {**study.flags("rk2_up", 3, seed, "cpu", source), **flags}}  # fmt: skip

    gpu = [record(seed, "cuda", "/models/residual-seed{seed}") for seed in (0, 1)]
    assert report_module.source_template(study, gpu[1]) == "/models/residual-seed{seed}"
    assert report_module.run_options(study, gpu) == " --device cuda --source /models/residual-seed{seed}"
    assert report_module.run_options(study, [record(0, "cpu")]) == ""  # the study's own source, on the CPU
    assert report_module.provenance(study, gpu) == ["Code: commit cf12255 (2 runs)."]
    stale = record(0, "cuda", "/models/residual-seed{seed}", learning_rate=1.0)
    rate = study.flags("rk2_up", 3, 0, "cpu")["learning_rate"]
    assert report_module.provenance(study, [stale])[1] == (
        f"Flags the study has changed since rk2_up-3-seed0 ran: learning_rate 1.0 -> {rate}."
    )


def test_a_result_made_with_other_flags_is_kept_and_reported_stale(tmp_path, monkeypatch, capsys):
    """The runner never overwrites a result, nor skips one made with flags the study no longer sets as if it
    were done: it names the changed flags and fails, leaving the file as it was."""
    results = tmp_path / "results"
    record = _run_record("92924fb" + "0" * 33, 9972, learning_rate=5e-4)
    path = results / "ptb" / "cpu" / "residual-1-seed0.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    before = path.read_text()
    monkeypatch.setattr(runner.CHILDREN, "run", lambda *a, **k: pytest.fail("nothing may be trained"))
    args = ["ptb", "--only", "residual", "--depths", "1", "--seeds", "0", "--results", str(results),
            "--work-dir", str(tmp_path / "work")]  # fmt: skip
    assert runner.main([*args, "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("stale residual-1-seed0")
    assert runner.main(args) == 1
    assert "STALE residual-1-seed0: its result was made with other flags (learning_rate 0.0005 -> 0.001)" in (
        capsys.readouterr().out
    )
    assert path.read_text() == before
    path.write_text(json.dumps(_run_record("92924fb" + "0" * 33, 9972)))  # the study's flags: done, skipped
    assert runner.main(args) == 0
    assert "skip residual-1-seed0 (result exists)" in capsys.readouterr().out


def _padded_batch() -> tuple:
    import torch

    input_ids = torch.randint(4, 50, (2, 7))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 4:] = 0
    return input_ids, attention_mask


def test_block_diagnostic_stage_norms_are_the_residual_updates():
    """With Euler blocks and plain stacking, block k maps h_k to h_k + F(h_k): the diagnostic's |F_1| is the mean
    norm of h_{k+1} - h_k over the real (unpadded) tokens, read from the encoder's hidden states (the last layer's
    own output, not the final LayerNorm's that transformers puts last by default: config.tie_last_hidden_states)."""
    import torch

    from experiments.block_diagnostic import block_statistics
    from modeling_ode import ODETransformerConfig, ODETransformerForConditionalGeneration

    torch.manual_seed(0)
    config = ODETransformerConfig.from_preset(
        "tiny", vocab_size=50, encoder_layer_connections="residual", encoder_ode_method="euler",
        encoder_ode_coefficients="tableau", tie_last_hidden_states=False,
    )  # fmt: skip
    model = ODETransformerForConditionalGeneration(config).eval()
    input_ids, attention_mask = _padded_batch()
    rows = block_statistics(model, input_ids, attention_mask)
    with torch.no_grad():
        hidden = model.get_encoder()(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True
        )
    updates = [(after - before).norm(dim=-1)[attention_mask.bool()].mean().item()
               for before, after in zip(hidden.hidden_states, hidden.hidden_states[1:])]  # fmt: skip
    assert [row["stage_norms"] for row in rows] == [pytest.approx([u], rel=1e-5) for u in updates]
    assert [row["gamma"] for row in rows] == [[1.0], [1.0]]


def test_block_diagnostic_gate_means_leave_out_padding():
    """A random gate differs per token: the diagnostic's mean g is sigmoid(w [F1, F2] + b) averaged over the real
    tokens only, recomputed here from the recorded stages and the gate's weights (padding would change it)."""
    import torch

    from experiments.block_diagnostic import block_statistics
    from modeling_ode import ODETransformerConfig, ODETransformerForConditionalGeneration
    from modeling_ode.ode import StageCoefficients

    torch.manual_seed(0)
    config = ODETransformerConfig.from_preset(
        "tiny", vocab_size=50, encoder_ode_method="rk2", encoder_ode_coefficients="gated"
    )
    model = ODETransformerForConditionalGeneration(config).eval()
    gates = [m.gate for m in model.get_encoder().modules() if isinstance(m, StageCoefficients)]
    input_ids, attention_mask = _padded_batch()
    rows = block_statistics(model, input_ids, attention_mask)
    with torch.no_grad():
        out = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, output_ode_stages=True)
        for row, stages, gate in zip(rows, out.ode_stages, gates, strict=True):
            g = torch.sigmoid(gate(torch.cat(list(stages), dim=-1)))[..., 0]
            real = g[attention_mask.bool()].mean().item()
            assert row["gamma"] == pytest.approx([real, 1 - real], rel=1e-5)
            assert real != pytest.approx(g.mean().item(), rel=1e-4)  # the padded tokens would have moved it
            real_g = g[attention_mask.bool()]
            assert row["collapsed_share"] == ((real_g > 0.99) | (real_g < 0.01)).float().mean().item()


@pytest.mark.parametrize("gate_inputs", ["stages", "layer_norm"])
def test_block_diagnostic_says_what_drives_the_gates_logits(gate_inputs):
    """Block 0's gate is forced (W = 0, b = 30: z = 30 and g > 0.99 on every token); block 1's has known halves
    W1 = 0.5, W2 = -0.25 (every entry) and b = -0.1, so z = 0.5 sum(x1) - 0.25 sum(x2) - 0.1 with x_i = F_i or
    LN(F_i), computed here by hand from the recorded stages of the real tokens, percentiles with numpy."""
    import numpy as np
    import torch

    from experiments.block_diagnostic import block_statistics
    from modeling_ode import ODETransformerConfig, ODETransformerForConditionalGeneration
    from modeling_ode.ode import StageCoefficients

    torch.manual_seed(0)
    config = ODETransformerConfig.from_preset(
        "tiny", vocab_size=50, encoder_ode_method="rk2", encoder_ode_coefficients="gated",
        ode_gate_inputs=gate_inputs,
    )  # fmt: skip
    model = ODETransformerForConditionalGeneration(config).eval()
    d = config.d_model
    gates = [m.gate for m in model.get_encoder().modules() if isinstance(m, StageCoefficients)]
    with torch.no_grad():
        gates[0].weight.zero_()
        gates[0].bias.fill_(30.0)
        gates[1].weight.copy_(torch.cat([torch.full((1, d), 0.5), torch.full((1, d), -0.25)], dim=1))
        gates[1].bias.fill_(-0.1)
    input_ids, attention_mask = _padded_batch()
    forced, known = block_statistics(model, input_ids, attention_mask)

    assert forced["logit_abs_mean"] == pytest.approx(30.0)
    assert forced["logit_abs_percentiles"] == pytest.approx({"p50": 30.0, "p90": 30.0, "p99": 30.0})
    assert forced["gate_weight_norms"] == [0.0, 0.0] and forced["logit_parts"] == [0.0, 0.0]
    assert forced["gate_bias"] == [30.0] and (forced["g_below"], forced["g_above"]) == (0.0, 1.0)

    with torch.no_grad():
        out = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, output_ode_stages=True)
    f1, f2 = out.ode_stages[1][:, attention_mask.bool()]  # (real tokens, d) each

    def mean_norm(x):
        return x.norm(dim=-1).mean().item()

    def read(x):
        if gate_inputs == "stages":
            return x
        centred = x - x.mean(-1, keepdim=True)
        return centred / torch.sqrt((centred**2).mean(-1, keepdim=True) + config.layer_norm_eps)

    x1, x2 = read(f1), read(f2)
    z = 0.5 * x1.sum(-1) - 0.25 * x2.sum(-1) - 0.1
    g = 1 / (1 + torch.exp(-z))
    assert known["logit_abs_mean"] == pytest.approx(z.abs().mean().item(), rel=1e-5)
    expected = np.percentile(z.abs().numpy(), [50, 90, 99])
    assert list(known["logit_abs_percentiles"].values()) == pytest.approx(expected.tolist(), rel=1e-5)
    assert known["gate_input_norms"] == pytest.approx([mean_norm(x1), mean_norm(x2)], rel=1e-5)
    assert known["stage_norms"] == pytest.approx([mean_norm(f1), mean_norm(f2)], rel=1e-5)
    assert known["gate_weight_norms"] == pytest.approx([0.5 * d**0.5, 0.25 * d**0.5])
    parts = [(0.5 * x1.sum(-1)).abs().mean(), (0.25 * x2.sum(-1)).abs().mean()]
    assert known["logit_parts"] == pytest.approx([p.item() for p in parts], rel=1e-5, abs=1e-6)
    assert known["gate_bias"] == pytest.approx([-0.1])
    assert known["g_below"] == (g < 0.01).float().mean().item()
    assert known["g_above"] == (g > 0.99).float().mean().item()
    assert known["gamma"][0] == pytest.approx(g.mean().item(), rel=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_block_diagnostic_reads_a_forced_gate_from_a_saved_model(tmp_path, shared_data, causal):
    """The gate of Eq. (learnable) is g = sigmoid(w [F1, F2] + b): with w = 0 it is sigmoid(b) on every token, so
    b = +30 / -30 / 0 gives g = 1 / 0 / 0.5, a collapse to one stage on all tokens, on none for g = 0.5."""
    import torch

    from experiments import block_diagnostic
    from modeling_ode.ode import StageCoefficients
    from tests.tiny_folder import save_tiny_folder

    side = "decoder" if causal else "encoder"
    blocks = {f"{side}_ode_method": "rk2", f"{side}_ode_coefficients": "gated", f"{side}_layers": 3}
    model, _ = save_tiny_folder(tmp_path, causal=causal, **blocks)
    stack = model.get_decoder() if causal else model.get_encoder()
    gates = [m.gate for m in stack.modules() if isinstance(m, StageCoefficients) and hasattr(m, "gate")]
    with torch.no_grad():
        for gate, bias in zip(gates, (30.0, -30.0, 0.0), strict=True):
            gate.weight.zero_()
            gate.bias.fill_(bias)
    model.save_pretrained(tmp_path)
    saved = tmp_path / "gates.json"
    saved.write_text('{"another-run": []}')
    (rows,) = block_diagnostic.main(
        [str(tmp_path), "--sentences", "4", "--json", str(saved)]
    ).values()  # Multi30k or PTB sentences
    assert [row["side"] for row in rows] == [side] * 3
    assert [row["gamma"] for row in rows] == [
        pytest.approx(g, abs=1e-6) for g in ([1, 0], [0, 1], [0.5, 0.5])
    ]
    assert [row["collapsed_share"] for row in rows] == [1.0, 1.0, 0.0]
    assert [row["g_above"] for row in rows] == [1.0, 0.0, 0.0]  # g = gamma_1
    assert json.loads(saved.read_text()) == {"another-run": [], tmp_path.name: rows}  # merged, not replaced


def test_a_failing_extra_test_stops_there_and_records_nothing(tmp_path, monkeypatch):
    """When decoding JFLEG fails after a (resumed) gec run trained, the run is FAILED with the decoder's exit code,
    the scoring command never runs, an earlier attempt's hypotheses are gone and no result file is written."""
    import argparse

    study = STUDIES["gec"]
    run = runner.Run(study, "cpu", "residual", 3, 0)
    args = argparse.Namespace(results=tmp_path / "results", work_dir=tmp_path / "work", set={}, device="cpu",
                              threads=1, data_root=tmp_path / "data")  # fmt: skip
    out = run.work_dir(args.work_dir)
    (out / "checkpoint-250").mkdir(parents=True)
    (out / "checkpoint-250" / "trainer_state.json").write_text("{}")
    stale = out / "jfleg_hypotheses.txt"
    stale.write_text("an earlier attempt's output\n")
    modules = []

    def fake_run(command, **kwargs):  # every child of the runner starts here: its exit code
        modules.append(command[2])
        return 3 if command[2] == "ode_transformer.translate" else 0

    monkeypatch.setattr(runner.CHILDREN, "run", fake_run)
    status = runner.execute(run, args)
    assert status.startswith(f"FAILED {run.id} (exit 3;")
    assert modules == ["ode_transformer.train.run", "ode_transformer.translate"]
    assert not stale.exists() and not run.result_path(args.results).exists()


def _write(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_source_diagnostic_is_the_mean_token_cross_entropy_and_zero_without_cross_attention(tmp_path):
    """Matched: the cross-entropy per reference token summed pair by pair (each pair alone, no padding) over all
    reference tokens. With every cross-attention output zeroed, the decoder cannot see its source: rotated = matched."""
    import torch

    from experiments import source_diagnostic
    from tests.tiny_folder import TEXTS, save_tiny_folder

    model, tokenizer = save_tiny_folder(tmp_path / "model")
    sources, targets = TEXTS[:3], [TEXTS[1], TEXTS[2], TEXTS[0]]
    source_file, target_file = _write(tmp_path / "src.txt", sources), _write(tmp_path / "tgt.txt", targets)
    args = [str(tmp_path / "model"), "--source", str(source_file), "--target", str(target_file)]

    def pair_by_pair(pair_sources):
        total, tokens = 0.0, 0
        for source, target in zip(pair_sources, targets):
            labels = torch.tensor([tokenizer(target)["input_ids"]])
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([tokenizer(source)["input_ids"]]), labels=labels).logits
            total += -torch.log_softmax(logits[0], dim=-1).gather(1, labels[0][:, None]).sum().item()
            tokens += labels.shape[1]
        return total / tokens

    (row,) = source_diagnostic.main(args).values()
    assert row["matched"] == pytest.approx(pair_by_pair(sources), rel=1e-5)
    assert row["rotated"] == pytest.approx(pair_by_pair(sources[1:] + sources[:1]), rel=1e-5)
    assert row["gap"] == pytest.approx(row["rotated"] - row["matched"]) and abs(row["gap"]) > 1e-3

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "encoder_attn.out_proj" in name:
                parameter.zero_()
    model.save_pretrained(tmp_path / "model")
    (blind,) = source_diagnostic.main(args).values()
    assert blind["gap"] == pytest.approx(0.0, abs=1e-6) and blind["matched"] != pytest.approx(row["matched"])


def test_source_diagnostic_refuses_a_language_model_and_a_single_pair(tmp_path):
    from experiments import source_diagnostic
    from tests.tiny_folder import TEXTS, save_tiny_folder

    save_tiny_folder(tmp_path / "lm", causal=True)
    save_tiny_folder(tmp_path / "seq2seq")
    files = [
        "--source",
        str(_write(tmp_path / "src.txt", TEXTS[:2])),
        "--target",
        str(_write(tmp_path / "tgt.txt", TEXTS[:2])),
    ]
    with pytest.raises(ValueError, match="language model"):
        source_diagnostic.main([str(tmp_path / "lm"), *files])
    with pytest.raises(ValueError, match="at least 2 aligned pairs"):
        source_diagnostic.main([str(tmp_path / "seq2seq"), *files, "--pairs", "1"])


def test_gate_table_renders_each_gate_of_each_run():
    """A recorded gate row becomes one line of figures; a block without a gate (learnable scalars) none."""
    from experiments.report import gate_table

    gate = {"block": 1, "gamma": [0.9731, 0.0269], "g_below": 0.0, "g_above": 0.4721, "logit_abs_mean": 4.5213,
            "logit_abs_percentiles": {"p50": 4.494, "p90": 6.43, "p99": 7.508}, "gate_input_norms": [16.0, 15.99],
            "gate_weight_norms": [0.984, 1.0241], "gate_bias": [0.0191]}  # fmt: skip
    scalars = {"block": 0, "gamma": [0.5, 1.16]}
    lines = gate_table({"norm-seed0": [gate], "scalars-seed0": [scalars]}).splitlines()
    assert lines[2:] == [
        "| norm-seed0 | 1 | 0.973 | 0.0% | 47.2% | 4.52 (4.49 / 7.51) | 16.0 / 16.0 | 0.98 / 1.02 | +0.019 |"
    ]
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == 10


def test_ptb_paper_reports_the_loss_per_word_beside_the_perplexity_with_eos(shared_data):
    """The Penn Treebank test split has 78,669 words in 3,761 sentences (82,430 tokens with </s>, the usual count);
    the residual row's 114.92 per word-or-</s> is 144.18 per word: exp(ln 114.92 * 82,430 / 78,669)."""
    study = STUDIES["ptb_paper"]
    assert report_module.lm_test_counts(study, "cpu") == (78669, 3761)
    result = {"size": "cpu", "metrics": {"Word perplexity": 114.92}}
    report_module.add_derived_metrics(study, [result])
    assert result["metrics"]["Per word, no </s>"] == pytest.approx(math.exp(math.log(114.92) * 82430 / 78669))
    assert result["metrics"]["Per word, no </s>"] == pytest.approx(144.18, abs=0.01)


def test_gated_runs_record_their_gate_statistics(tmp_path):
    """A run with a gate gets the block diagnostic, into its study's diagnostics/gates.json; one without does not."""
    study = STUDIES["multi30k_paired"]
    args = runner.parse_args(["multi30k_paired", "--results", str(tmp_path), "--data-root", str(tmp_path)])
    for variant, gated in [("rk2_gated_tableau", True), ("rk2_gated_authors", True), ("rk2", False)]:
        run = runner.plan(study, "cpu", [0], [variant], [3])[0]
        command = runner.gate_diagnostic_command(run, tmp_path / run.id, runner.run_flags(run, {}), args)
        if not gated:
            assert command is None
            continue
        assert command[1:4] == ["-m", "experiments.block_diagnostic", str(tmp_path / run.id)]
        assert command[command.index("--json") + 1] == str(
            tmp_path / "multi30k_paired" / "cpu" / "diagnostics" / "gates.json"
        )


def test_the_paired_batch_runs_in_the_precision_the_machine_computes_natively():
    """multi30k_paired: --precision auto instead of the other studies' bf16; the equal-compute residual rows have
    the encoder layers of RK2 and RK4 evaluations, the others 3; its remedy row starts its gates as RK2."""
    study = STUDIES["multi30k_paired"]
    flags = {variant: study.flags(variant, 3, 0, "cpu") for variant in study.variants}
    assert all(f["precision"] == "auto" and "bf16" not in f for f in flags.values())
    layers = {variant: f["encoder_layers"] for variant, f in flags.items()}
    assert layers == {**dict.fromkeys(study.variants, 3), "residual_x2": 6, "residual_x4": 12}
    assert flags["rk2_gated_tableau"]["ode_gate_init"] == "tableau"
    argv = runner.to_argv(flags["rk2_gated_tableau"])
    assert json.loads(argv[argv.index("--config_overrides") + 1]) == {"ode_gate_init": "tableau"}


def test_the_tatoeba_depth_study_is_the_paired_recipe_on_tatoeba_with_its_own_budget(shared_data):
    """tatoeba_depth: multi30k_paired's flags but the data, the number of updates, one validation at
    the last update and the row's schedule; residual encoders of 3, 6 and 12 layers and RK2 / RK4 in the 3-layer one,
    each under every schedule; its corpus reads as the data README counts it."""
    from experiments.studies import TATOEBA_ROWS, TATOEBA_SCHEDULES, tatoeba_variant
    from ode_transformer.train.data import DataSpec, load_task_data

    study, paired = STUDIES["tatoeba_depth"], STUDIES["multi30k_paired"]
    assert set(study.variants) == {tatoeba_variant(r, s) for r in TATOEBA_ROWS for s in TATOEBA_SCHEDULES}
    for row, base in TATOEBA_ROWS.items():
        for schedule, changes in TATOEBA_SCHEDULES.items():
            ours = study.flags(tatoeba_variant(row, schedule), 3, 0, "cpu")
            theirs = {**paired.flags("residual", 3, 0, "cpu"), **base.flags}
            differing = {key for key in ours.keys() | theirs.keys() if ours.get(key) != theirs.get(key)}
            assert differing <= {"dataset", "max_steps", "eval_strategy", "eval_steps", *changes}
            assert {"dataset", "max_steps", "eval_strategy", "eval_steps"} <= differing
            assert ours["eval_steps"] == ours["max_steps"] and ours["precision"] == "auto"
            assert {key: ours[key] for key in changes} == changes
    layers = {
        row: study.flags(tatoeba_variant(row, "s1"), 3, 0, "cpu")["encoder_layers"] for row in TATOEBA_ROWS
    }
    assert layers == {"residual": 3, "residual_x2": 6, "residual_x4": 12, "rk2": 3, "rk4": 3}
    data = load_task_data("seq2seq", DataSpec("shared", "tatoeba_de_en", source_lang="en", target_lang="de"))
    assert {split: rows.num_rows for split, rows in data.items()} == {
        "train": 162896,
        "validation": 3509,
        "test": 3408,
    }


def test_the_depth_gates_t_tests_are_scipys_without_scipy():
    """experiments.depth_gate runs where scipy may be missing: its two-sided paired p is ttest_1samp's, and its
    non-inferiority p is the one-sided test of the differences plus the margin."""
    from scipy.stats import ttest_1samp

    from experiments import depth_gate

    samples = (
        [0.4, 1.1],
        [0.3, -0.2, 0.9],
        [1.0, 1.2, 0.8, 1.5],
        [0.1, -0.4, 0.3, 0.2, -0.1, 0.6],
        [-0.9, -0.2, -0.6],
    )
    for differences in samples:
        assert depth_gate.t_test_p(differences) == pytest.approx(
            ttest_1samp(differences, 0.0).pvalue, abs=1e-12
        )
        shifted = [d + 0.5 for d in differences]
        assert depth_gate.non_inferiority_p(differences, 0.5) == pytest.approx(
            ttest_1samp(shifted, 0.0, alternative="greater").pvalue, abs=1e-12
        )
    assert depth_gate.t_test_p([0.5, 0.5]) is None and depth_gate.t_test_p([0.5]) is None


def probe_result(variant: str, seed: int, bleu: float, loss: float = 2.0, commit: str = "abc") -> dict:
    return {
        **fake_result(variant, seed, bleu, commit=commit),
        "validation_curve": [{"step": 3000, "eval_loss": loss}],
    }


def test_the_depth_probe_picks_schedules_then_gates_then_compares_on_fresh_seeds():
    """Stage by stage: the schedule with the lowest validation loss on the tuning seed; the gate over the gate seeds
    only; the comparison over the fresh seeds only, so a low 3-layer residual run that made the gate pass cannot
    favour RK; the deeper rows join the comparison (non-inferiority at the margin) only once the gate has passed."""
    from experiments import depth_gate
    from experiments.studies import (
        TATOEBA_FRESH_SEEDS,
        TATOEBA_GATE_SEEDS,
        TATOEBA_MARGIN,
        TATOEBA_ROWS,
        TATOEBA_SCHEDULES,
        TATOEBA_TUNING_SEED,
    )

    assert (
        not set(TATOEBA_GATE_SEEDS) & set(TATOEBA_FRESH_SEEDS)
        and TATOEBA_TUNING_SEED not in TATOEBA_GATE_SEEDS
    )
    assert len(depth_gate.next_runs([])) == len(TATOEBA_ROWS) * len(TATOEBA_SCHEDULES)
    # stage 1: residual_x4 learns best with the gentlest schedule, every other row with the recipe's
    results = [
        probe_result(
            f"{row}_{s}",
            TATOEBA_TUNING_SEED,
            20.0,
            loss=1.0 if (row == "residual_x4") == (s == "s3") else 2.0,
        )
        for row in TATOEBA_ROWS
        for s in TATOEBA_SCHEDULES
    ]
    chosen = depth_gate.chosen_schedules(results)
    assert chosen == {**dict.fromkeys(TATOEBA_ROWS, "s1"), "residual_x4": "s3"}
    gate_runs = {(f"{r}_s1", s) for r in ("residual", "residual_x2") for s in TATOEBA_GATE_SEEDS}
    gate_runs |= {("residual_x4_s3", s) for s in TATOEBA_GATE_SEEDS}
    fresh_runs = {(f"{r}_s1", s) for r in ("residual", "rk2", "rk4") for s in TATOEBA_FRESH_SEEDS}
    assert set(depth_gate.next_runs(results)) == gate_runs | fresh_runs
    # stage 2: the gate's 3-layer runs happen to be low, so 12 layers is ahead on every seed
    for seed in TATOEBA_GATE_SEEDS:
        results += [
            probe_result("residual_s1", seed, 29.0),
            probe_result("residual_x2_s1", seed, 29.0 + 0.3 * (-1) ** seed),
            probe_result("residual_x4_s3", seed, 30.0 + 0.05 * (seed % 3)),
        ]
    # the fresh seeds: residual at 3 layers at its usual level, RK2 level with it, RK4 ahead
    for index, seed in enumerate(TATOEBA_FRESH_SEEDS):
        wobble = 0.1 * (index % 3 - 1)
        results += [
            probe_result("residual_s1", seed, 30.0),
            probe_result("rk2_s1", seed, 30.0 + 2 * wobble),
            probe_result("rk4_s1", seed, 30.8 + wobble),
        ]
    gate = {row["row"]: row for row in depth_gate.gate_rows(results, chosen)}
    assert gate["residual_x4"]["pairs"] == len(TATOEBA_GATE_SEEDS) and gate["residual_x4"]["gap"] > 0.9
    assert gate["residual_x4"]["holm_p"] < 0.05 and depth_gate.depth_helps(list(gate.values()))
    equal = {row["row"]: row for row in depth_gate.comparison_rows(results, chosen, deeper_too=False)}
    # the fresh seeds alone: RK4's gap is over residual's 30.0 there, not over the gate's low 29.0
    assert equal["rk4"]["pairs"] == len(TATOEBA_FRESH_SEEDS)
    assert equal["rk4"]["gap"] == pytest.approx(0.8 + 0.1 * statistics.fmean(i % 3 - 1 for i in range(10)))
    assert abs(equal["rk2"]["gap"]) < 0.05 and equal["rk2"]["holm_p"] > 0.05
    # stage 3: the gate passed, so the deeper rows run on the fresh seeds
    assert set(depth_gate.next_runs(results)) == {("residual_x2_s1", s) for s in TATOEBA_FRESH_SEEDS} | {
        ("residual_x4_s3", s) for s in TATOEBA_FRESH_SEEDS
    }
    for index, seed in enumerate(TATOEBA_FRESH_SEEDS):
        results += [
            probe_result("residual_x2_s1", seed, 30.0),
            probe_result("residual_x4_s3", seed, 31.0 + 0.1 * (index % 2)),
        ]
    assert depth_gate.next_runs(results) == []
    rows = {(r["row"], r["against"]): r for r in depth_gate.comparison_rows(results, chosen, deeper_too=True)}
    # RK4 a few tenths behind 12 layers: within the margin, non-inferior; RK2 about a BLEU behind: not
    behind = rows[("rk4", "residual_x4")]
    assert behind["margin"] == TATOEBA_MARGIN and -0.35 < behind["gap"] < -0.15 and behind["holm_p"] < 0.05
    assert (
        rows[("rk2", "residual_x4")]["gap"] < -TATOEBA_MARGIN and rows[("rk2", "residual_x4")]["holm_p"] > 0.5
    )


def test_the_depth_gate_pairs_only_runs_of_one_commit(tmp_path, capsys):
    from experiments import depth_gate
    from experiments.studies import TATOEBA_GATE_SEEDS, TATOEBA_ROWS, TATOEBA_SCHEDULES, TATOEBA_TUNING_SEED

    results = [
        probe_result(f"{r}_{s}", TATOEBA_TUNING_SEED, 20.0) for r in TATOEBA_ROWS for s in TATOEBA_SCHEDULES
    ]
    for seed in TATOEBA_GATE_SEEDS:
        results.append(probe_result("residual_s1", seed, 29.0))
        results.append(probe_result("residual_x4_s1", seed, 31.0 + 0.1 * (seed % 2), commit="def"))
    chosen = depth_gate.chosen_schedules(results)
    pairs = {row["row"]: row["pairs"] for row in depth_gate.gate_rows(results, chosen)}
    assert pairs == {"residual_x2": 0, "residual_x4": 0}
    folder = tmp_path / "batch"
    folder.mkdir()
    for index, result in enumerate(results):
        (folder / f"run{index}-seed.json").write_text(json.dumps(result))
    assert depth_gate.main([str(folder)]) == 1
    out = capsys.readouterr().out
    assert "schedules: residual s1" in out and "depth not shown to help" in out and "runs to go" in out


def test_a_result_is_written_whole_under_a_temporary_name_of_its_own(tmp_path, monkeypatch):
    """`write_json` (every result and verdict of the runner): a second writer of one result by another name (a
    link to its folder) never writes the first one's temporary file, and a kill before the rename leaves the
    old result and no temporary file."""
    import fnmatch
    import os

    results = tmp_path / "results"
    runner.write_json(results / "run.json", {"bleu": 1.0})
    (tmp_path / "link").symlink_to("results")
    other = results / "run.json.tmp"  # another writer's file, at the name a fixed temporary name would take
    other.write_text("half of another writer's result", encoding="utf-8")
    runner.write_json(tmp_path / "link" / "run.json", {"bleu": 2.0})
    assert json.loads((results / "run.json").read_text(encoding="utf-8")) == {"bleu": 2.0}
    assert other.read_text(encoding="utf-8") == "half of another writer's result"
    other.unlink()

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        runner.write_json(tmp_path / "link" / "run.json", {"bleu": 3.0})
    assert json.loads((results / "run.json").read_text(encoding="utf-8")) == {"bleu": 2.0}
    assert sorted(path.name for path in results.iterdir()) == ["run.json"]

    # a temporary file that a SIGKILL leaves behind (no `finally` runs) is no result to the globs that gather them
    monkeypatch.undo()
    names = []
    real_replace = os.replace
    monkeypatch.setattr(
        os,
        "replace",
        lambda source, target: (names.append(os.path.basename(source)), real_replace(source, target)),
    )
    runner.write_json(results / "residual-1-seed0.json", {"bleu": 4.0})
    assert names and not any(
        fnmatch.fnmatch(name, pattern) for name in names for pattern in ("*.json", "*-seed*.json")
    )
