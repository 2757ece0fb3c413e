"""--precision auto: bf16 autocast only where the device computes bf16 natively (ode_transformer.precision), with the CPU's
flags and PyTorch's restrictions mocked, then through ode-train's argument parsing."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from mocked_cpus import CPUS, GRAVITON2, GRAVITON3, SAPPHIRE_RAPIDS, SKYLAKE, ZEN3, ZEN4, pretend

from ode_transformer.precision import choose_precision, cpu_native_bf16, emulated_bf16_warning
from ode_transformer.train.arguments import parse_arguments
from ode_transformer.train.run import main


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU: its flags (torch.cpu.get_capabilities) and PyTorch's kernel level."""
    return lambda flags, capability="AVX512": pretend(monkeypatch, flags, capability)


@pytest.mark.parametrize(
    ("flags", "capability", "native"),
    [
        (ZEN3, "AVX2", False),  # AVX2 only: bf16 is emulated
        (SKYLAKE, "AVX512", False),  # AVX-512 without its BF16 extension (oneDNN emulates it too)
        (ZEN4, "AVX512", True),
        (SAPPHIRE_RAPIDS, "AVX512", True),
        (SAPPHIRE_RAPIDS, "AVX2", False),  # ATEN_CPU_CAPABILITY=avx2 on a native machine
        (GRAVITON3, "SVE256", True),
        (GRAVITON2, "DEFAULT", False),
    ],
)
def test_auto_picks_bf16_only_on_native_hardware(cpu, flags, capability, native):
    cpu(flags, capability)
    assert cpu_native_bf16()[0] is native
    choice = choose_precision("cpu")
    assert choice.precision == ("bf16" if native else "fp32") and choice.native_bf16 is native
    assert choice.reason.startswith("auto: ") and flags["cpu_name"] in choice.reason


def test_onednn_restriction_turns_native_bf16_off(cpu, monkeypatch):
    cpu(SAPPHIRE_RAPIDS)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    native, reason = cpu_native_bf16()
    assert not native and "ONEDNN_MAX_CPU_ISA=AVX2" in reason
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")  # a limit above bf16 keeps it
    assert cpu_native_bf16()[0]


def test_explicit_choices_are_taken_and_emulated_bf16_is_warned_about(cpu):
    cpu(ZEN3, "AVX2")
    assert choose_precision("cpu", "fp32").precision == "fp32"
    asked = choose_precision("cpu", "bf16")
    assert asked.bf16 and not asked.native_bf16
    warning = emulated_bf16_warning(asked)
    assert "emulated" in warning and "35x" in warning and "Leave --bf16 out" in warning
    cpu(ZEN4)
    assert emulated_bf16_warning(choose_precision("cpu", "bf16")) is None
    assert emulated_bf16_warning(choose_precision("cpu", "fp32")) is None
    with pytest.raises(ValueError, match="--precision must be one of auto, bf16, fp16, fp32, got 'fast'"):
        choose_precision("cpu", "fast")


def test_other_devices():
    assert choose_precision("meta").precision == "fp32"  # neither CPU nor CUDA: never guessed
    if torch.cuda.is_available():
        assert choose_precision("cuda").bf16 == torch.cuda.is_bf16_supported(including_emulation=False)


RECIPE = ["libreoffice_demo", "--output_dir", "unused"]


def test_recipe_trains_in_bf16_only_on_native_hardware(cpu, caplog):
    """ode-train's parsing: auto ends as transformers' own --bf16 (and its mixed precision), logged with why."""
    cpu(SAPPHIRE_RAPIDS)
    with caplog.at_level(logging.INFO, logger="ode_transformer.train"):
        *_, run_args, training_args = parse_arguments(RECIPE)
    assert run_args.precision == "auto" and training_args.bf16 and training_args.mixed_precision == "bf16"
    assert "precision: bf16 (auto: Intel Xeon has native bf16" in caplog.text
    cpu(ZEN3, "AVX2")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ode_transformer.train"):
        *_, training_args = parse_arguments(RECIPE)
    assert not training_args.bf16 and training_args.mixed_precision == "no"
    assert "precision: fp32 (auto: AMD EPYC 7B13 has no native bf16" in caplog.text


def test_explicit_bf16_on_an_avx2_cpu_warns_and_is_kept(cpu, caplog):
    cpu(ZEN3, "AVX2")
    for flags in (["--bf16", "true"], ["--bf16"], ["--bf16=true"], ["--precision", "bf16"]):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ode_transformer.train"):
            *_, run_args, training_args = parse_arguments([*RECIPE, *flags])
        assert run_args.precision == "bf16" and training_args.bf16, flags
        assert "bf16 is emulated there" in caplog.text, flags
    # explicit fp32, on any machine
    *_, run_args, training_args = parse_arguments([*RECIPE, "--bf16", "false"])
    assert run_args.precision == "fp32" and not training_args.bf16
    cpu(SAPPHIRE_RAPIDS)
    *_, run_args, training_args = parse_arguments([*RECIPE, "--precision", "fp32"])
    assert not training_args.bf16


def test_conflicting_precision_flags_are_refused():
    with pytest.raises(ValueError, match="--precision fp32 and --bf16 true disagree"):
        parse_arguments([*RECIPE, "--precision", "fp32", "--bf16", "true"])
    with pytest.raises(ValueError, match="--precision must be one of"):
        parse_arguments([*RECIPE, "--precision", "bf32"])


CHOICE = "from ode_transformer.precision import choose_precision, cpu_capability; import json; " \
    "print(json.dumps([cpu_capability(), choose_precision('cpu').as_dict()]))"  # fmt: skip


def test_isa_restriction_makes_any_cpu_avx2_only():
    """``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``, the way to check a native-bf16 machine behave like
    an AVX2 one (docs/performance.md): PyTorch runs AVX2 kernels and auto picks fp32, on any x86-64 machine."""
    if dict(torch.cpu.get_capabilities()).get("architecture") != "x86_64":
        pytest.skip("the restriction is x86-64's")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", CHOICE], env=env, capture_output=True, text=True, check=True)
    capability, choice = json.loads(out.stdout)
    assert capability == "AVX2" and choice["precision"] == "fp32" and not choice["native_bf16"]
    assert choice["reason"].startswith("auto: ")


def test_an_architecture_without_known_bf16_flags_gets_fp32(cpu):
    cpu({"architecture": "riscv64", "cpu_name": "SiFive U74"}, "DEFAULT")
    native, reason = cpu_native_bf16()
    assert not native and reason.startswith("SiFive U74 has no native bf16 (a bf16 extension")


# --------------------------------------------------------------------------------------------
# On a CPU with native bf16 and no GPU, ode-train with no precision flags trains (in bf16): transformers
# refuses bf16 without a GPU unless use_cpu is set, so ode-train sets it where there is no accelerator.

TINY_RUN = ["--task", "translation", "--preset", "tiny", "--vocab_size", "300", "--max_steps", "2",
            "--save_strategy", "no", "--report_to", "none", "--num_beams", "1", "--max_target_length", "8"]  # fmt: skip


def tiny_pair(folder) -> str:
    (folder / "tr.en").write_text("a small house .\nthe dog runs .\n", encoding="utf-8")
    (folder / "tr.de").write_text("ein kleines haus .\nder hund rennt .\n", encoding="utf-8")
    return f"{folder / 'tr.en'},{folder / 'tr.de'}"


@pytest.mark.parametrize("kind", ["native_bf16", "zen4", "graviton3", "avx2"])
def test_ode_train_with_no_precision_flags_trains_on_a_cpu_without_a_gpu(kind, monkeypatch, tmp_path):
    pretend(monkeypatch, *CPUS[kind])
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    pair = tiny_pair(tmp_path)
    argv = [*TINY_RUN, "--train_file", pair, "--test_file", pair, "--output_dir", str(tmp_path / "out")]
    *_, run_args, training_args = parse_arguments(argv)
    native = kind != "avx2"
    assert training_args.use_cpu and training_args.bf16 is native and run_args.precision == "auto"
    assert training_args.mixed_precision == ("bf16" if native else "no")
    main(argv)
    recipe = json.loads((tmp_path / "out" / "hub_metrics.json").read_text())["training"]["recipe"]
    assert recipe["precision"] == ("bf16" if native else "fp32") and recipe["steps"] == 2


def test_explicit_bf16_without_a_gpu_runs_on_the_cpu_and_an_accelerators_path_is_unchanged(monkeypatch):
    pretend(monkeypatch, *CPUS["avx2"])
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    *_, training_args = parse_arguments(["ptb_lm", "--output_dir", "unused"])  # a GPU recipe: bf16 true
    assert training_args.bf16 and training_args.use_cpu
    *_, training_args = parse_arguments(["ptb_lm", "--output_dir", "unused", "--bf16", "false"])
    assert not training_args.bf16 and training_args.use_cpu
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)  # a GPU: nothing is added
    *_, training_args = parse_arguments(["--task", "translation", "--output_dir", "unused"])
    assert not training_args.use_cpu
