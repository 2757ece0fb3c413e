"""The benchmark scripts in --quick mode (tiny dims): well-formed JSON and markdown, ratios that follow from the
raw numbers. No timing assertions.

The benchmark sets the thread count and glibc's malloc thresholds of the process it runs in (and mallopt
cannot be read back to restore it), so it runs in a child process and leaves this one as it was."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import bench_ode, common
from benchmarks.bench_translate import GOALS, RK_GOAL_OF_PREDICTED, RK_GOALS, SEARCH_OP


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    repo = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
    }
    command = [
        sys.executable,
        "-m",
        "benchmarks.bench_ode",
        "--quick",
        "--out-dir",
        str(out),
        "--name",
        "quick",
    ]
    subprocess.run([*command, "--threads", "1"], cwd=repo, env=env, check=True)
    return out, json.loads((out / "quick.json").read_text())


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_files_written(quick_run):
    out, _ = quick_run
    assert (out / "quick.md").read_text().startswith("# ODE Transformer benchmarks")
    assert (out / "quick.png").stat().st_size > 0
    assert len(list(out.glob("quick-*.json"))) == 1


def test_machine_and_settings(quick_run):
    _, results = quick_run
    assert results["mode"] == "quick"
    for key in ("cpu_model", "logical_cores", "torch", "transformers"):
        assert results["machine"][key]
    assert _positive(results["matmul"]["fp32_gflops"]) and _positive(results["matmul"]["bf16_gflops"])
    assert "VmHWM" in results["memory_method"]
    assert (results["machine"]["device"], results["machine"]["accelerator"]) == ("cpu", None)
    assert results["settings"]["malloc"] == "keep-freed"


def test_unknown_malloc_policy_is_refused():
    with pytest.raises(ValueError, match="keep-freed"):
        common.configure_process(1, "jemalloc")


def test_training_numbers(quick_run):
    _, results = quick_run
    for dtype in ("fp32", "bf16"):
        assert set(results["training"][dtype]) == set(common.VARIANTS)
        for name, r in results["training"][dtype].items():
            for key in ("step_s", "tokens_per_s", "peak_mem_mb", "train_flops_per_step", "achieved_gflops"):
                assert _positive(r[key]), key
            assert r["step_s"] == min(r["step_s_all"])
            assert math.isclose(r["tokens_per_s"], r["target_tokens_per_step"] / r["step_s"])
            assert math.isclose(r["achieved_gflops"], r["train_flops_per_step"] / r["step_s"] / 1e9)
            # Live tensors never fall below the fp32 weights plus Adam's two moments: 12 bytes per parameter
            # (Marian's frozen sinusoidal position table is a parameter without Adam state).
            assert r["tensor_peak_mb"] * 2**20 > (4 if name == "marian" else 12) * r["params"]


def test_inference_numbers(quick_run):
    _, results = quick_run
    settings = results["settings"]["infer"]
    assert set(results["inference"]) == set(common.INFERENCE_VARIANTS)
    for r in results["inference"].values():
        assert math.isclose(r["beam4_sentences_per_s"], settings["batch"] / r["beam4_s"])
        assert math.isclose(
            r["greedy_tokens_per_s"], settings["batch"] * settings["new_tokens"] / r["greedy_s"]
        )
        assert _positive(r["encoder_forward_ms"])


def test_scaling_points(quick_run):
    _, results = quick_run
    s = results["settings"]["scaling"]
    assert len(results["scaling"]["length"]) == len(s["lengths"]) * len(s["methods"])
    assert len(results["scaling"]["depth"]) == len(s["depths"]) * len(s["methods"])
    for p in results["scaling"]["length"] + results["scaling"]["depth"]:
        assert _positive(p["step_s"]) and _positive(p["peak_mem_mb"])


def test_ratios_follow_from_raw_numbers(quick_run):
    out, results = quick_run
    assert results["targets"] and results["informative"]
    markdown = (out / "quick.md").read_text()
    for row in results["targets"] + results["informative"]:
        expected = bench_ode.lookup(results, row["a"]) / bench_ode.lookup(results, row["b"])
        assert math.isclose(row["ratio"], expected)
        # a bf16 row is marked where this CPU emulates bf16
        assert (
            f"| {bench_ode._bf16_marked(row['name'], results['machine'])} | {row['ratio']:.3f} |" in markdown
        )


def test_flop_count_formula():
    dims = common.TINY_DIMS
    residual = common.train_flops("residual", dims, 2, 8, 8)
    rk2 = common.train_flops("rk2", dims, 2, 8, 8)
    rk4 = common.train_flops("rk4", dims, 2, 8, 8)
    ckpt = common.train_flops("rk2_ckpt", dims, 2, 8, 8)
    encoder = residual["encoder_share"] * residual["forward"]
    assert math.isclose(rk2["forward"] - residual["forward"], encoder)
    assert math.isclose(rk4["forward"] - residual["forward"], 3 * encoder)
    assert math.isclose(ckpt["train_step"] - rk2["train_step"], encoder)
    assert common.train_flops("marian", dims, 2, 8, 8) == residual


def test_generate_flop_ratio_by_hand():
    """The FLOP-predicted speed of RK2 and RK4 over residual for one small decoding, counted by hand: tiny dims
    (d 32, f 64, V 128, 2 + 2 layers), 1 sentence of 4 source tokens, 2 beams, 3 new tokens. The encoder evaluates F
    once (residual), twice (RK2) or four times (RK4) per layer; the Euler decoder does the same work for all."""
    from benchmarks import bench_translate

    d, f, V, S, R, T = 32, 64, 128, 4, 2, 3
    # one evaluation of F in one encoder layer, one sentence: q, k, v, o projections, two FFN products, QK^T and AV
    F = 4 * 2 * S * d * d + 2 * 2 * S * d * f + 2 * 2 * S * S * d
    assert F == 67_584
    # one decoder layer over the 3 steps on 2 rows: per token self q/k/v/o and cross q/o projections and the FFN;
    # cross keys/values once per row; self-attention over 1, 2, 3 cached positions; cross-attention over 4
    decoder_layer = (
        R * T * (6 * 2 * d * d + 2 * 2 * d * f)
        + R * 2 * 2 * S * d * d
        + R * (1 + 2 + 3) * 2 * 2 * d
        + R * T * 2 * 2 * S * d
    )
    head = R * T * 2 * d * V
    assert decoder_layer == 160_256 and head == 49_152
    decoder = 2 * decoder_layer + head
    residual, rk2, rk4 = (2 * stages * F + decoder for stages in (1, 2, 4))
    assert (residual, rk2, rk4) == (504_832, 640_000, 910_336)
    for name, total in (("residual", residual), ("rk2", rk2), ("rk4", rk4)):
        assert common.generate_flops(name, common.TINY_DIMS, 1, 2, S, T)["total"] == total
    # the benchmark's prediction sums its calls: batch 1 = one sentence of its own length here
    setup = {**bench_translate.QUICK, "src_len": S, "new_tokens": T, "batch1_sentences": 1}
    predicted = bench_translate.flop_prediction(setup)["batch1_beam4"]["predicted_vs_residual"]
    beams4 = {
        n: common.generate_flops(n, common.TINY_DIMS, 1, 4, S, T)["total"] for n in ("residual", "rk2", "rk4")
    }
    assert math.isclose(predicted["rk2"], beams4["residual"] / beams4["rk2"])
    assert math.isclose(predicted["rk4"], beams4["residual"] / beams4["rk4"])
    assert math.isclose(residual / rk2, 0.78880) and math.isclose(residual / rk4, 0.554559, rel_tol=1e-5)


def test_machine_record_names_the_cpus_int8_and_bf16_features():
    """machine_info records PyTorch's kernel level and torch.cpu.get_capabilities()' VNNI / AMX / AVX512_BF16
    flags; the report's line names each flag as had or lacked."""
    import torch

    machine = common.machine_info()
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    capabilities = dict(torch.cpu.get_capabilities())
    assert machine["cpu_features"] == {flag: bool(capabilities.get(flag)) for flag in common.CPU_FEATURES}
    line = common.describe_cpu(machine)
    assert line.startswith(f"PyTorch kernels {machine['cpu_capability']}; has ")
    has = line.split("; has ")[1].split("; lacks ")[0].split(", ")
    lacks = line.split("; lacks ")[1].split(", ") if "; lacks " in line else []
    for flag in ("avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "avx512_bf16"):
        assert (flag.upper() in has, flag.upper() in lacks) == (
            machine["cpu_features"][flag],
            not machine["cpu_features"][flag],
        )


def test_decode_overhead_counts_each_models_operators_and_times_each_step(capsys):
    """`benchmarks.decode_overhead --quick` on the CPU: a step time per model and beam width, and one profile of a
    greedy generate per model with its aten operators counted (no CUDA kernels, no sync report off the GPU)."""
    import re

    from benchmarks import decode_overhead

    decode_overhead.main(["--device", "cpu", "--quick", "--reps", "1"])
    out = capsys.readouterr().out
    for name in ("marian", "residual"):
        assert re.search(rf"^{name} beams 1: \d+\.\d\d ms/step$", out, re.MULTILINE)
        assert re.search(rf"^{name} beams 4: \d+\.\d\d ms/step$", out, re.MULTILINE)
        counts = re.search(rf"^== {name}: (\d+) CUDA kernels, (\d+) aten ops", out, re.MULTILINE)
        assert counts and counts[1] == "0" and int(counts[2]) > 32  # more than one operator per new token
    assert "syncs" not in out


def test_gpu_suite_dry_run_plans_every_step_and_runs_nothing(tmp_path, capsys):
    """`python -m benchmarks.gpu_suite --dry-run` (make gpu-check ARGS=--dry-run) works on CPU: the tests in fp32
    and bf16 on the GPU, the MarianMT benchmark, one short paper-size run per study; one results folder."""
    from benchmarks import gpu_suite

    assert gpu_suite.main(["--dry-run", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    folder = next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("results folder: "))
    assert Path(folder).parent == tmp_path and Path(folder).name.startswith("gpu-")
    assert list(tmp_path.iterdir()) == [], "a dry run writes nothing"
    for dtype in ("float32", "bfloat16"):
        assert f"ODE_TEST_DEVICE=cuda ODE_TEST_DTYPE={dtype}" in out
    tests = next(line for line in out.splitlines() if "[tests-float32]" in line)
    for path in ("tests/test_modeling.py", "tests/test_padding.py", "tests/test_compile.py"):
        assert path in tests
    assert "benchmarks.bench_ode --device cuda" in out
    studies = gpu_suite.short_runs()
    assert len(studies) >= 1
    for study, variant, _, _ in studies:
        assert f"[train-{study}-{variant}]" in out
        assert "--size paper --device cuda" in out
    assert all(folder in line for line in out.splitlines() if "--results" in line)
    steps = gpu_suite.plan(Path(folder), "cuda", "stamp")
    assert [step.name for step in steps if step.timed] == ["bench-marian-base"], "only the benchmark times"
    # The checks at once, then the benchmark: one device command (its limit, at most) holds the suite.
    assert (
        gpu_suite.planned_seconds(steps)
        == max(s.limit_s for s in steps if not s.timed) + gpu_suite.BENCH_LIMIT_S
    )
    assert gpu_suite.planned_seconds(steps) <= 8 * 60


def test_gpu_suite_runs_the_checks_at_once_then_the_timings_and_stops_a_step_at_its_limit(
    tmp_path, capsys, refused
):
    """Check "a" ends only once check "b" has run, so it passes only if the two run at once, and each is recorded
    as it ends, with its own seconds; the timing step sleeps past its limit and is recorded as timed out, and the
    process it started is stopped with it (else it would write its file after the suite ended). `--only` runs the named steps
    and refuses an unknown one."""
    from benchmarks import gpu_suite

    flag, orphan, python = tmp_path / "flag", tmp_path / "orphan", sys.executable
    child = f"import pathlib, time; time.sleep(3); pathlib.Path({str(orphan)!r}).touch()"
    steps = [
        gpu_suite.Step("a", [python, "-c", f"import pathlib, time\nwhile not pathlib.Path({str(flag)!r}).exists(): time.sleep(0.05)\ntime.sleep(0.5)"], 60),
        gpu_suite.Step("b", [python, "-c", f"import pathlib; pathlib.Path({str(flag)!r}).touch()"], 60),
        gpu_suite.Step("t", [python, "-c", f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"], 1, timed=True),
    ]  # fmt: skip
    summary: dict = {"steps": []}
    gpu_suite.run_steps(steps, tmp_path, summary)
    assert [(s["name"], s["rc"], s["timed_out"]) for s in summary["steps"]] == [
        ("b", 0, False),
        ("a", 0, False),
        ("t", None, True),
    ]
    seconds = {s["name"]: s["seconds"] for s in summary["steps"]}
    assert seconds["b"] < seconds["a"]
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    time.sleep(4)
    assert not orphan.exists(), "the timed-out step's own process outlived it"
    assert gpu_suite.main(["--dry-run", "--out-dir", str(tmp_path), "--only", "tests-float32"]) == 0
    assert "1 step, " in capsys.readouterr().out
    error = refused(gpu_suite.main, ["--dry-run", "--out-dir", str(tmp_path), "--only", "tests-fp32"])
    assert "no step named tests-fp32" in error


# One worker, one after the other: the dropout probe's first row compiles the quick run's residual training graph,
# which inductor's cache then holds.
COMPILED_RESIDUAL = pytest.mark.xdist_group("compiled_residual_training")


@pytest.mark.slow
@COMPILED_RESIDUAL
def test_compile_benchmark_quick_run_writes_its_report(tmp_path):
    """`benchmarks.bench_compile --quick`: eager and compiled times for residual and RK4, the same greedy tokens,
    and a report whose speed-ups are the ratios of the stored times."""
    from benchmarks import bench_compile

    results = bench_compile.main(["--quick", "--out-dir", str(tmp_path), "--threads", "1"])
    assert set(results["models"]) == {"residual", "rk4"}
    report = (tmp_path / "compile.md").read_text()
    for name, row in results["models"].items():
        train, decode = row["training"], row["decoding"]
        assert train["eager_step_s"] > 0 and train["compiled_step_s"] > 0 and decode["same_tokens"]
        assert f"{train['eager_step_s'] / train['compiled_step_s']:.2f}x" in report.split(f"| {name} |")[1]
    assert json.loads((tmp_path / "compile.json").read_text()) == json.loads(json.dumps(results))


@pytest.mark.slow
@COMPILED_RESIDUAL
def test_compile_dropout_probe_times_the_three_ways_and_restores_inductors_setting(tmp_path):
    """`benchmarks.bench_compile --quick --dropout`: residual eager and compiled, for dropout 0.1 with inductor's
    random numbers, with aten's (`fallback_random`) and for dropout 0, each row compiled afresh (a row that reused
    the previous row's graphs would never read its setting); the setting is inductor's again after."""
    from benchmarks import bench_compile
    from modeling_ode.compat import inductor_fallback_random_enabled

    results = bench_compile.main(["--quick", "--dropout", "--out-dir", str(tmp_path), "--threads", "1"])
    assert list(results["dropout"]) == [label for label, _, _ in bench_compile.DROPOUT_PROBE]
    assert inductor_fallback_random_enabled() is False
    report = (tmp_path / "compile-dropout.md").read_text()
    for label, train in results["dropout"].items():
        assert train["eager_step_s"] > 0 and train["compiled_step_s"] > 0 and train["compiled_graphs"] >= 1
        assert f"| {label} | {train['eager_step_s']:.3f} | {train['compiled_step_s']:.3f} |" in report
    assert results["command"].endswith("--quick --dropout") and not (tmp_path / "compile.md").exists()


def test_translate_benchmark_quick_run_writes_its_report(tmp_path):
    """`benchmarks.bench_translate --quick` (in a child process: it sets threads and malloc): every system made
    exactly the asked number of new tokens in every setting, speeds are sentences over the best round's seconds, the
    goals are the ratios of those speeds, and CTranslate2's rows are there exactly when it is installed."""
    import importlib.util

    repo = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "benchmarks.bench_translate", "--quick", "--out-dir", str(tmp_path)]
    subprocess.run(command, cwd=repo, env=env, check=True, capture_output=True)
    results = json.loads((tmp_path / "translate.json").read_text())
    assert results["threads"] == 1 and results["machine"]["cpu_capability"]
    has_ct2 = importlib.util.find_spec("ctranslate2") is not None
    has_onnx = all(importlib.util.find_spec(p) for p in ("onnx", "onnxscript", "onnxruntime"))
    expected = {
        "marian",
        "residual",
        "residual-int8",
        "residual-int8-dynamic-cache",
        "residual-encoder",
        "residual-int8-encoder",
        "rk2",
        "rk2-int8",
        "rk4",
        "rk4-int8",
    }
    expected |= {"ct2", "ct2-int8"} if has_ct2 else set()
    expected |= (
        {f"{m}-onnx{search}-int8" for m in ("residual", "rk2", "rk4") for search in ("", "-search")}
        | {"residual-onnx-int8-encoder"}
        if has_onnx
        else set()
    )
    assert set(results["systems"]) == expected
    assert has_ct2 or any("ctranslate2 is not installed" in note for note in results["notes"])
    if has_onnx:  # each model's int8 graphs timed by graph, the encoder's and the two decoders'
        graphs = results["onnx_graph_ms"]["batch16_greedy"]
        assert set(graphs) == {"residual", "rk2", "rk4"}
        for per_graph in graphs.values():
            assert set(per_graph) == {
                "encoder_model.onnx",
                "decoder_model.onnx",
                "decoder_with_past_model.onnx",
            }
            assert all(ms > 0 for ms in per_graph.values())
    for setting, speeds in results["sentences_per_s"].items():
        sentences = results["settings"][setting]["sentences"]
        for name, speed in speeds.items():
            if not name.endswith("-encoder"):  # the encoder rows decode nothing
                assert results["new_tokens"][setting][name] == results["setup"]["new_tokens"], (setting, name)
            assert math.isclose(speed, sentences / min(results["seconds_all"][setting][name]))
            spread = results["spread"][setting][name]  # over the rounds: worst / median / best
            assert spread["min"] <= spread["median"] <= spread["max"] == speed
    assert set(results["machine"]["cpu_features"]) == set(common.CPU_FEATURES)
    pairs = {label: (s, o) for label, s, o, _, _ in GOALS} | {label: (s, o) for label, s, o, _ in RK_GOALS}
    rk_labels = {label for label, *_ in RK_GOALS}
    for goal in results["goals"]:
        assert (goal["measure"] == "of_predicted") == (goal["goal"] in rk_labels)
        if goal["goal"] in rk_labels and goal["ratio"] is not None:
            # predicted T / (T + (r - 1) E): residual's best time T, its family's encoder's alone E, r the encoder
            # FLOP ratio; FLOP-only: residual FLOPs / RK FLOPs
            system, over = pairs[goal["goal"]]
            model, family = system.split("-")[0], system.partition("-")[2]
            encoder = {  # the search graph runs the ONNX int8 encoder graph, compiled decoding the int8 encoder
                "": "residual-encoder",
                "int8": "residual-int8-encoder",
                "int8-compiled": "residual-int8-encoder",
                "onnx-int8": "residual-onnx-int8-encoder",
                "onnx-search-int8": "residual-onnx-int8-encoder",
            }[family]
            seconds = results["seconds_all"][goal["setting"]]
            flops = results["flop_prediction"][goal["setting"]]["flops"]
            T, E = min(seconds[over]), min(seconds[encoder])
            r = flops[model]["encoder"] / flops["residual"]["encoder"]
            assert math.isclose(goal["predicted"], T / (T + (r - 1) * E))
            assert math.isclose(goal["flop_predicted"], flops["residual"]["total"] / flops[model]["total"])
            assert 0 < goal["predicted"] < 1 and goal["at_least"] == RK_GOAL_OF_PREDICTED
        if goal["ratio"] is not None:
            system, over = pairs[goal["goal"]]
            speeds = results["sentences_per_s"][goal["setting"]]
            assert math.isclose(goal["ratio"], speeds[system] / speeds[over])
            if goal["measure"] == "of_predicted":
                assert math.isclose(goal["of_predicted"], goal["ratio"] / goal["predicted"])
            if goal.get("noise"):  # an RK row beyond the rounds' spreads: no result
                assert goal["met"] is None and max(goal["ratio"], goal["of_predicted"]) > 1 + goal["allowed"]
            else:
                assert goal["met"] == (goal[goal["measure"]] >= goal["at_least"])
    assert {g["goal"] for g in results["goals"]} == set(pairs)
    assert results["profiles"]["batch1_greedy"][0]["self_ms"] > 0
    if has_onnx:  # onnxruntime's own profile of the int8 graphs: operator types by kernel time
        ops = results["onnx_profiles"]["batch16_beam4"]
        assert ops[0]["self_ms"] > 0 and 0 < sum(o["share"] for o in ops) <= 1 + 1e-9
        assert "MatMulInteger" in {o["op"] for o in ops} or "DynamicQuantizeMatMul" in {o["op"] for o in ops}
        for ops in results["onnx_search_profiles"].values():  # the search graph's, the op's own work apart
            assert SEARCH_OP in {o["op"] for o in ops} and "BeamSearch" not in {o["op"] for o in ops}
    report = (tmp_path / "translate.md").read_text()
    assert report.startswith("# Translation speed on CPU") and "| residual-int8 |" in report
    assert f"PyTorch kernels {results['machine']['cpu_capability']}; has " in report
    assert (
        "| goal | setting | ratio | predicted | FLOP-only predicted | measured / predicted | allowed | goal | met |"
        in report
    )
    assert (
        "| setting | residual MFLOP (encoder / decoder) | RK2 MFLOP | RK4 MFLOP | RK2 predicted | RK4 predicted |"
        in report
    )
    rk2_int8 = next(g for g in results["goals"] if g["goal"] == "RK2 int8 vs residual int8")
    assert (
        f"| RK2 int8 vs residual int8 | {rk2_int8['setting']} | {rk2_int8['ratio']:.2f} | "
        f"{rk2_int8['predicted']:.3f} | {rk2_int8['flop_predicted']:.3f} | {rk2_int8['of_predicted']:.2f} | "
        f"{rk2_int8['allowed']:.2f} | "
        f">= {RK_GOAL_OF_PREDICTED} of predicted |"
    ) in report


def test_translate_benchmark_rotates_the_systems_and_flags_rk_rows_beyond_the_spread_as_noise():
    """Each round starts one system later, so every system is timed first once in as many rounds; an RK
    row is noise, not a result, when RK beats residual, or its FLOP prediction, by more than the two systems'
    spreads over the rounds allow."""
    from benchmarks.bench_translate import noise_flag
    from benchmarks.common import rotated, spread

    names = ["residual", "rk2", "rk4", "ct2"]
    assert [rotated(names, r)[0] for r in range(4)] == names and rotated(names, 5) == rotated(names, 1)
    assert sorted(rotated(names, 2)) == sorted(names)
    steady, jumpy = spread([1.0, 1.02, 1.01], 4), spread([1.0, 1.5, 1.2], 4)
    assert steady["max"] == 4.0 and steady["min"] == 4 / 1.02 and math.isclose(steady["relative"], 0.02)
    assert math.isclose(jumpy["median"], 4 / 1.2)
    # RK2 faster than residual by a ratio of 1.10
    flag = noise_flag({"ratio": 1.10, "of_predicted": 1.4}, steady, steady)
    assert flag["noise"] is True and flag["met"] is None and math.isclose(flag["allowed"], 0.04)
    # within jumpy's spread plus steady's
    assert noise_flag({"ratio": 1.10, "of_predicted": 1.4}, jumpy, steady)["noise"] is False
    assert noise_flag({"ratio": 0.7, "of_predicted": 0.95}, steady, steady) == {
        "allowed": flag["allowed"],
        "noise": False,
    }  # a result: `met` stays the goal's
    assert (
        noise_flag({"ratio": 0.8, "of_predicted": 1.2}, steady, steady)["noise"] is True
    )  # beats its prediction
    # the encoder row's spread counts by the share of the predicted time its scaled part takes
    assert math.isclose(
        noise_flag({"ratio": 0.8, "of_predicted": 1.2}, steady, steady, jumpy, 0.5)["allowed"], 0.29
    )


def test_rk_prediction_scales_only_the_residual_encoders_measured_time():
    """Residual int8's best round T = 10, its encoder alone E = 2; RK4's encoder does four times the encoder FLOPs
    and the same decoder work, so it should take T + 3E = 16: a ratio of 10/16, where the FLOP-only ratio (decoder
    FLOPs 30, encoder 10) would be 40/70. The search graph's prediction uses the ONNX int8 encoder's time."""
    from benchmarks.bench_translate import predict_from_encoder

    seconds = {
        "residual-int8": [10.5, 10.0],
        "residual-int8-encoder": [2.0, 2.2],
        "residual-onnx-search-int8": [8.0],
        "residual-onnx-int8-encoder": [1.0],
    }
    flops = {"residual": {"encoder": 10.0, "total": 40.0}, "rk4": {"encoder": 40.0, "total": 70.0}}
    prediction = predict_from_encoder(seconds, flops, "rk4", "-int8")
    assert math.isclose(prediction["predicted"], 10 / 16) and math.isclose(prediction["extra_share"], 6 / 16)
    assert prediction["encoder"] == "residual-int8-encoder"
    assert math.isclose(predict_from_encoder(seconds, flops, "rk4", "-onnx-search-int8")["predicted"], 8 / 11)
    assert predict_from_encoder(seconds, flops, "rk4", "") is None  # the fp32 rows did not run


def test_real_text_benchmark_quick_run_times_the_four_paths_and_checks_the_table(tmp_path):
    """`benchmarks.bench_real_text MODEL --quick` on a tiny saved folder and two parallel files: every
    path (PyTorch and ONNX, float32 and int8) timed in both settings, speeds are the sentences over the best round,
    the int8 paths' BLEU is compared with fp32's, and the table rows say whether ode-translate's FASTEST picks the
    faster backend measured, as the speeds say."""
    import importlib.util

    from tiny_folder import save_tiny_folder

    from benchmarks import bench_real_text
    from ode_transformer.translate import fastest_backend

    if not all(importlib.util.find_spec(p) for p in ("onnx", "onnxscript", "onnxruntime")):
        pytest.skip("the onnx extra is not installed")
    save_tiny_folder(tmp_path / "model", weight_scale=3)
    sources = [
        "the dog runs",
        "a cat sleeps on the warm mat",
        "zwei Hunde",
        "the cat",
        "the dog runs in the park",
    ]
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s in sources))
    (tmp_path / "ref.txt").write_text("".join(s + "\n" for s in reversed(sources)))
    repo = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
    }
    command = [
        sys.executable, "-m", "benchmarks.bench_real_text", str(tmp_path / "model"), "--quick",
        "--test-files", str(tmp_path / "src.txt"), str(tmp_path / "ref.txt"), "--out-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    subprocess.run(command, cwd=repo, env=env, check=True, capture_output=True)
    results = json.loads((tmp_path / "out" / "translate-real.json").read_text())
    assert results["command"].startswith(f"python -m benchmarks.bench_real_text {tmp_path / 'model'} --quick")
    assert len(list((tmp_path / "out").glob("translate-real-*.json"))) == 1
    assert results["systems"] == list(bench_real_text.REAL_SYSTEMS)
    assert results["setup"]["sentences"] == bench_real_text.REAL_QUICK["sentences"]
    assert set(results["machine"]["cpu_features"]) == set(common.CPU_FEATURES)
    for setting in bench_real_text.REAL_SETTINGS:
        for name, seconds in results["seconds_all"][setting].items():
            assert math.isclose(results["sentences_per_s"][setting][name], 4 / min(seconds))
    assert set(results["quality"]) == set(bench_real_text.QUALITY_SYSTEMS)
    assert all(q["sentences"] == 4 and 0 <= q["bleu"] <= 100 for q in results["quality"].values())
    goals = {(g["goal"].split(" ")[0], g["setting"]): g for g in results["goals"]}
    for name in ("pytorch-int8", "onnx-int8"):
        goal = goals[(name, "quality")]
        assert math.isclose(
            goal["value"], results["quality"][name]["bleu"] - results["quality"]["pytorch-fp32"]["bleu"]
        )
        assert goal["met"] == (abs(goal["value"]) <= bench_real_text.BLEU_WITHIN)
    table_rows = [g for g in results["goals"] if g["setting"] != "quality"]
    assert len(table_rows) == 2 * len(bench_real_text.REAL_SETTINGS)
    for goal in table_rows:
        batch, beams = bench_real_text.REAL_SETTINGS[goal["setting"]]
        precision = "int8" if "(int8)" in goal["goal"] else "float32"
        suffix = {"float32": "fp32", "int8": "int8"}[precision]
        speeds = {
            b: results["sentences_per_s"][goal["setting"]][f"{b}-{suffix}"] for b in ("pytorch", "onnx")
        }
        assert goal["value"]["picked"] == fastest_backend(batch, beams, precision)[0]
        assert goal["value"]["fastest"] == max(speeds, key=speeds.get)
        assert goal["met"] == (goal["value"]["picked"] == goal["value"]["fastest"])
    report = (tmp_path / "out" / "translate-real.md").read_text()
    assert report.startswith("# Translation speed and quality on real text")
    assert f"PyTorch kernels {results['machine']['cpu_capability']}; has " in report
    q = results["quality"]["onnx-int8"]
    assert f"| onnx-int8 | {q['bleu']:.2f} | {q['chrf']:.2f} | 4 |" in report


def test_the_recorded_real_text_command_of_bench_translate_runs_bench_real_text(monkeypatch):
    """`bench_translate --real-text MODEL_DIR FLAGS`, the command older results files record, runs
    `bench_real_text MODEL_DIR` with the same flags; `--no-compiled` has nothing to leave out there, and a flag of
    neither benchmark is refused as before."""
    from benchmarks import bench_real_text, bench_translate

    calls = []
    monkeypatch.setattr(bench_real_text, "main", lambda argv: calls.append(argv) or {})
    bench_translate.main(
        [
            "--real-text",
            "demo",
            "--threads",
            "2",
            "--no-compiled",
            "--sentences",
            "64",
            "--quality-sentences",
            "0",
        ]
    )
    assert calls == [
        [
            "demo",
            "--threads",
            "2",
            "--out-dir",
            str(bench_translate.RESULTS),
            "--sentences",
            "64",
            "--quality-sentences",
            "0",
        ]
    ]
    with pytest.raises(SystemExit):
        bench_translate.main(["--sentences", "64"])


def test_bench_precision_quick_times_both_precisions_and_records_the_choice(tmp_path):
    """`benchmarks.bench_precision --quick`: one tiny training step in fp32 and in bf16 autocast, the CPU's
    capability and what `--precision auto` picks on it (fp32 on the suite's AVX2-only CPU)."""
    from benchmarks import bench_precision

    results = bench_precision.main(["--quick", "--json", str(tmp_path / "precision.json")])
    assert json.loads((tmp_path / "precision.json").read_text()) == json.loads(json.dumps(results))
    assert set(results["seconds_per_step"]) == {"fp32", "bf16"} and results["bf16_over_fp32_time"] > 0
    assert (
        results["auto_choice"]["precision"] == "fp32"
        and results["dims"]["d_model"] == common.TINY_DIMS.d_model
    )
