"""One GPU check, planned to fit in about 25 minutes on one H100/H200, everything in one results folder.

    .venv/bin/python -m benchmarks.gpu_suite               # on a GPU machine (make gpu-check)
    .venv/bin/python -m benchmarks.gpu_suite --dry-run     # print the plan and the commands, run nothing

Steps, each a subprocess with a time limit (a step over its limit is stopped and recorded as timed out, so the
suite ends on time whatever happens):

1. the device-agnostic tests (model, cache, generation, dropout, padding, torch.compile graph capture;
   tests/conftest.py's `device` and `dtype` fixtures) on the GPU in fp32, then in bf16, without the tests marked
   slow (test_compile.py's inductor and `train.run --torch_compile` tests, which run on the CPU);
2. the benchmark against MarianMT at the paper's base size (benchmarks/bench_ode.py);
3. one short paper-size training run per study that has a paper size (experiments/run.py), with the first
   ODE variant, seed and depth of the study, a few hundred steps and a small test set.

Writes ``benchmarks/results/gpu-<time stamp>/``: ``summary.json`` (the device, and per step its command, exit
status, seconds and whether it timed out), one ``<step>.log`` per step, the tests' JUnit XML, the benchmark's
JSON/markdown/plot and the studies' result files (``experiments/``). Checkpoints go to ``runs/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
TEST_SUBSET = [
    "tests/test_modeling.py",
    "tests/test_pcformer.py",
    "tests/test_ode.py",
    "tests/test_dropout.py",
    "tests/test_padding.py",
    "tests/test_compile.py",
]
TEST_DTYPES = ("float32", "bfloat16")
# A short run: enough steps to see the loss fall and every code path (training, evaluation, saving, test
# decoding) run at the paper's size, not a result.
TRAINING_OVERRIDES = {
    "max_steps": "200",
    "save_steps": "200",
    "max_eval_samples": "200",
    "max_test_samples": "100",
}
# Seconds per step: 2 x 150 (tests) + 360 (benchmark) + 6 studies x 140 = 1,500 s = 25 minutes at most.
TEST_LIMIT_S, BENCH_LIMIT_S, TRAINING_LIMIT_S = 150, 360, 140


@dataclass(frozen=True)
class Step:
    name: str
    command: list[str]
    limit_s: int
    env: dict[str, str] = field(default_factory=dict)


def short_runs() -> list[tuple[str, str, int, int]]:
    """(study, variant, seed, depth) for every study with a paper size: its first variant that is not the
    residual baseline (the ODE blocks are what needs checking on a GPU), first seed, first depth."""
    from experiments.studies import STUDIES

    runs = []
    for name, study in STUDIES.items():
        if "paper" in study.sizes:
            variant = next((v for v in study.variants if v != "residual"), next(iter(study.variants)))
            runs.append((name, variant, study.seeds[0], study.depths[0]))
    return runs


def plan(folder: Path, device: str, stamp: str) -> list[Step]:
    python = sys.executable
    steps = [
        Step(
            f"tests-{dtype}",
            [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "4", "-m", "not slow", *TEST_SUBSET,
             f"--junitxml={folder / f'tests-{dtype}.xml'}"],
            TEST_LIMIT_S,
            {"ODE_TEST_DEVICE": device, "ODE_TEST_DTYPE": dtype},
        )
        for dtype in TEST_DTYPES
    ]  # fmt: skip
    steps.append(
        Step(
            "bench-marian-base",
            [
                python,
                "-m",
                "benchmarks.bench_ode",
                "--device",
                device,
                "--out-dir",
                str(folder),
                "--name",
                "bench-marian-base",
            ],
            BENCH_LIMIT_S,
        )
    )
    for study, variant, seed, depth in short_runs():
        overrides = [arg for key, value in TRAINING_OVERRIDES.items() for arg in ("--set", f"{key}={value}")]
        steps.append(
            Step(
                f"train-{study}-{variant}",
                [python, "-m", "experiments.run", study, "--size", "paper", "--device", device,
                 "--only", variant, "--seeds", str(seed), "--depths", str(depth),
                 "--results", str(folder / "experiments"), "--work-dir", str(REPO / "runs" / f"gpu-check-{stamp}"),
                 *overrides],
                TRAINING_LIMIT_S,
            )
        )  # fmt: skip
    return steps


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{device} (not available here)"


def run_step(step: Step, folder: Path) -> dict:
    """Runs one step with its log in the folder; stops it at its limit."""
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(REPO), **step.env}
    with open(folder / f"{step.name}.log", "w") as log:
        try:
            rc = subprocess.run(step.command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                timeout=step.limit_s).returncode  # fmt: skip
            timed_out = False
        except subprocess.TimeoutExpired:
            rc, timed_out = None, True
    return {**asdict(step), "rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cuda", help="the GPU to check (default: cuda)")
    parser.add_argument(
        "--out-dir", type=Path, default=RESULTS, help="where the gpu-<time stamp> folder goes"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the commands, run nothing")
    args = parser.parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = args.out_dir / f"gpu-{stamp}"
    steps = plan(folder, args.device, stamp)
    print(f"results folder: {folder}")
    print(f"{len(steps)} steps, at most {sum(s.limit_s for s in steps) / 60:.0f} minutes:")
    for step in steps:
        env = " ".join(f"{key}={value}" for key, value in step.env.items())
        print(f"  [{step.name}] limit {step.limit_s} s: {env + ' ' if env else ''}{' '.join(step.command)}")
    if args.dry_run:
        return 0
    folder.mkdir(parents=True)
    summary = {"device": args.device, "device_name": device_name(args.device), "started": stamp, "steps": []}
    for step in steps:
        summary["steps"].append(run_step(step, folder))
        (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        result = summary["steps"][-1]
        print(
            f"{time.strftime('%H:%M:%S')} {step.name}: rc {result['rc']}, {result['seconds']} s", flush=True
        )
    return 0 if all(s["rc"] == 0 for s in summary["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
