"""One GPU check, planned to fit in one 8-minute command on one H100/H200, everything in one results folder.

    .venv/bin/python -m benchmarks.gpu_suite               # on a GPU machine (make gpu-check)
    .venv/bin/python -m benchmarks.gpu_suite --dry-run     # print the plan and the commands, run nothing
    .venv/bin/python -m benchmarks.gpu_suite --only tests-bfloat16 bench-marian-base   # a rerun of some steps

Steps, each a subprocess with a time limit (a step over its limit is stopped and recorded as timed out, so the
suite ends on time whatever happens). The checks (1 and 3) time nothing, so they share the GPU and run at once;
the benchmark (2) runs after them, alone:

1. the device-agnostic tests (model, cache, generation, dropout, padding, torch.compile graph capture;
   tests/conftest.py's `device` and `dtype` fixtures) on the GPU in fp32 and in bf16, without the tests marked
   slow (test_compile.py's inductor and `ode_transformer.train.run --torch_compile` tests, which run on the CPU);
2. the benchmark against MarianMT at the paper's base size (benchmarks/bench_ode.py);
3. one short paper-size training run per study that has a paper size (experiments/run.py), with the first
   ODE variant, seed and depth of the study, a few hundred steps and a small test set.

Writes ``benchmarks/results/gpu-<time stamp>/``: ``summary.json`` (the device, and per step, in the order the steps
ended, its command, exit status, seconds and whether it timed out), one ``<step>.log`` per step, the tests' JUnit
XML, the benchmark's JSON/markdown/plot and the studies' result files (``experiments/``). Checkpoints go to
``runs/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ode_transformer.wording import counted

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
# Seconds per step. The checks run at once, then the benchmark, so the suite takes at most the longest check's
# limit plus BENCH_LIMIT_S: a GPU lease then holds the suite, its start and a rerun of a step or two.
TEST_LIMIT_S, BENCH_LIMIT_S, TRAINING_LIMIT_S = 150, 300, 180


@dataclass(frozen=True)
class Step:
    name: str
    command: list[str]
    limit_s: int
    env: dict[str, str] = field(default_factory=dict)
    timed: bool = False  # a timing runs alone, after the checks; a check shares the GPU with the others


def planned_seconds(steps: list[Step]) -> int:
    """The suite's longest run: the checks at once, then each timing."""
    checks = [step.limit_s for step in steps if not step.timed]
    return max(checks, default=0) + sum(step.limit_s for step in steps if step.timed)


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
            [
                python,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                "-n",
                "4",
                "-m",
                "not slow",
                *TEST_SUBSET,
                f"--junitxml={folder / f'tests-{dtype}.xml'}",
            ],
            TEST_LIMIT_S,
            {"ODE_TEST_DEVICE": device, "ODE_TEST_DTYPE": dtype},
        )
        for dtype in TEST_DTYPES
    ]
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
            timed=True,
        )
    )
    for study, variant, seed, depth in short_runs():
        overrides = [arg for key, value in TRAINING_OVERRIDES.items() for arg in ("--set", f"{key}={value}")]
        steps.append(
            Step(
                f"train-{study}-{variant}",
                [
                    python,
                    "-m",
                    "experiments.run",
                    study,
                    "--size",
                    "paper",
                    "--device",
                    device,
                    "--only",
                    variant,
                    "--seeds",
                    str(seed),
                    "--depths",
                    str(depth),
                    "--results",
                    str(folder / "experiments"),
                    "--work-dir",
                    str(REPO / "runs" / f"gpu-check-{stamp}"),
                    *overrides,
                ],
                TRAINING_LIMIT_S,
            )
        )
    return steps


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{device} (not available here)"


def run_step(step: Step, folder: Path) -> dict:
    """Runs one step with its log in the folder, in a process group of its own: at its limit, or when it ends, every
    process it started (pytest's workers, experiments.run's ode_transformer.train.run) is stopped with it, so none lingers on the GPU
    while the timings run."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # the user's paths stay
    env = {**os.environ, "PYTHONPATH": path, **step.env}
    started = time.monotonic()
    with open(folder / f"{step.name}.log", "w") as log:
        process = subprocess.Popen(
            step.command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        rc, timed_out = process.wait(timeout=step.limit_s), False
    except subprocess.TimeoutExpired:
        rc, timed_out = None, True
    with contextlib.suppress(ProcessLookupError):  # the group may have ended with its leader
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return {**asdict(step), "rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - started, 1)}


def run_steps(steps: list[Step], folder: Path, summary: dict) -> None:
    """The checks at once, then the timings one by one; each step is recorded as it ends, and summary.json
    rewritten."""

    def record(result: dict) -> None:
        summary["steps"].append(result)
        (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(
            f"{time.strftime('%H:%M:%S')} {result['name']}: rc {result['rc']}, {result['seconds']} s",
            flush=True,
        )

    checks = [step for step in steps if not step.timed]
    with ThreadPoolExecutor(max_workers=max(len(checks), 1)) as pool:
        for done in as_completed([pool.submit(run_step, step, folder) for step in checks]):
            record(done.result())
    for step in (step for step in steps if step.timed):
        record(run_step(step, folder))


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
    parser.add_argument(
        "--only", nargs="+", metavar="STEP", help="run these steps of the plan only (a rerun)"
    )
    args = parser.parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = args.out_dir / f"gpu-{stamp}"
    steps = plan(folder, args.device, stamp)
    if args.only:
        unknown = sorted(set(args.only) - {step.name for step in steps})
        if unknown:
            parser.error(
                f"--only: no step named {', '.join(unknown)}; the steps: {', '.join(s.name for s in steps)}"
            )
        steps = [step for step in steps if step.name in args.only]
    print(f"results folder: {folder}")
    print(
        f"{counted(len(steps), 'step')}, at most {planned_seconds(steps) / 60:.0f} minutes (the checks at once, then the timings):"
    )
    for step in steps:
        env = " ".join(f"{key}={value}" for key, value in step.env.items())
        kind = "timing" if step.timed else "check"
        print(
            f"  [{step.name}] {kind}, limit {step.limit_s} s: {env + ' ' if env else ''}{' '.join(step.command)}"
        )
    if args.dry_run:
        return 0
    folder.mkdir(parents=True)
    summary = {"device": args.device, "device_name": device_name(args.device), "started": stamp, "steps": []}
    run_steps(steps, folder, summary)
    return 0 if all(s["rc"] == 0 for s in summary["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
