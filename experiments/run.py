"""Run a study: ``python -m experiments.run STUDY [--size cpu|paper] [--seeds 0 1 2] [--only VARIANT ...]``.

Every run is one ``python -m ode_transformer.train.run`` subprocess (its own process: a crash or a kill loses that
run only) writing into ``WORK_DIR/<study>/<size>/<run id>/`` (checkpoints, logs; git-ignored), and
leaves one result file, ``results/<study>/<size>/<variant>-<depth>-seed<k>.json``: the flags, the
trained model's config, seed, data (files and SHA-256), git commit, device (with the CPU's capability),
training precision (and why it was chosen), wall time, steps, every
test metric, the validation and training curves, and for seq2seq tasks the test hypotheses. A study's
extra test sets (JFLEG for ``gec``) are scored after training with ``ode_transformer.translate`` and
``ode_transformer.train.evaluate_predictions`` on the saved model; their commands, hypotheses and metrics are recorded too.

Resuming: a run whose result file exists is skipped (reported STALE and kept if the study's flags for it
have changed since: a result is never overwritten or mixed in); a run that was interrupted resumes from its
last complete checkpoint. Runs go seed by seed (all variants of seed 0 first), so an interrupted
study has its first seed complete before the next one starts. ``--parallel N`` runs N at a time
(``--threads`` intra-op threads each): independent runs side by side on one machine or one GPU.

A study that fine-tunes trained models (``multi30k_upcycle``) starts each run from its seed's model
(``--model_name_or_path``): the study's ``source`` folder, or ``--source PATH`` with ``{seed}`` for the seed; a run
whose source is missing fails with that message and trains nothing.

One process trains a run at a time: a second start of a run (or a second runner of the same run) while another
process trains it is refused, naming that process, and deletes nothing. A runner that is stopped stops its runs:
SIGINT or SIGTERM stops its training processes before it exits, and each of them dies with the runner even where
the runner is killed outright (SIGKILL; Linux's parent-death signal).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from experiments.studies import STUDIES, ExtraTest, Study, batch_folder, batch_label, describe_changes, run_id
from ode_transformer.files import InUseError, hold_lock, real_path, write_atomic
from ode_transformer.train.provenance import device_info, git_commit

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
WORK = REPO / "runs" / "experiments"
# glibc keeps freed memory instead of trimming and re-faulting it every step (benchmarks/README.md).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "1073741824"}
# Where each shared corpus lives under the data root (recorded with checksums in every result).
CORPUS_FOLDERS = {
    "ptb": "ptb",
    "multi30k": "multi30k",
    "cnndm": "summarization/cnndm",
    "wi_locness": "gec/wi_locness",
    "fce": "gec/fce",
    "libreoffice": "libreoffice",
    "conll2013": "gec/conll2013",
}


@dataclass(frozen=True)
class Run:
    study: Study
    size: str
    variant: str
    depth: int
    seed: int
    source: str | None = None  # --source: the study's source model template, if it fine-tunes one
    batch: str | None = None  # --batch: a second batch of the size, run elsewhere (studies.batch_folder)

    @property
    def id(self) -> str:
        return run_id(self.variant, self.depth, self.seed)

    @property
    def folder(self) -> str:
        return batch_folder(self.size, self.batch)

    def result_path(self, results: Path) -> Path:
        return results / self.study.name / self.folder / f"{self.id}.json"

    def work_dir(self, work: Path) -> Path:
        return work / self.study.name / self.folder / self.id


def plan(
    study: Study,
    size: str,
    seeds: list[int],
    variants: list[str],
    depths: list[int],
    source: str | None = None,
    batch: str | None = None,
) -> list[Run]:
    """All runs of a study, seed-major: every variant and depth of the first seed comes first."""
    return [Run(study, size, v, d, s, source, batch) for s in seeds for d in depths for v in variants]


def to_argv(flags: dict[str, Any]) -> list[str]:
    """``{"bf16": True, "seed": 0}`` -> ``["--bf16", "true", "--seed", "0"]``; model config fields that are
    not ``ode_transformer.train.run`` flags (e.g. ``ode_function_includes_residual``) go into ``--config_overrides``."""
    from ode_transformer.train.arguments import ALL_ARGUMENTS

    known = {f.name for arguments in ALL_ARGUMENTS for f in fields(arguments)}
    config = {key: value for key, value in flags.items() if key not in known}
    flags = {key: value for key, value in flags.items() if key in known}
    if config:
        flags["config_overrides"] = json.dumps({**json.loads(flags.get("config_overrides", "{}")), **config})
    argv = []
    for key, value in flags.items():
        argv += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return argv


# Run first in every child: it asks Linux to SIGKILL it when the runner dies (PR_SET_PDEATHSIG, 1), which exec keeps,
# then becomes the command. A kill of the runner that no handler sees (SIGKILL) would otherwise leave its training
# process running on, orphaned. (Not subprocess's preexec_fn: it is unsafe in a process with threads, as the runner's
# pool is.) A runner that died before the request leaves nothing to wait for: the child exits at once.
DIE_WITH_RUNNER = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
except (AttributeError, OSError):
    pass  # not Linux: the runner's own handlers still stop its children
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


class Children:
    """The runner's child processes: each started so that it dies with the runner (:data:`DIE_WITH_RUNNER`), and all
    of them stopped at once by :meth:`stop` (the runner's SIGINT and SIGTERM handler), after which none starts."""

    def __init__(self) -> None:
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.stopping = False

    def run(self, command: list[str], **popen: Any) -> int:
        """Run ``command`` to its end (``popen``: Popen's arguments) and return its exit code; -SIGTERM, without
        starting it, once the runner is stopping."""
        with self._lock:
            if self.stopping:
                return -signal.SIGTERM
            guarded = [sys.executable, "-c", DIE_WITH_RUNNER, str(os.getpid()), *command]
            process = subprocess.Popen(guarded, **popen)
            self._live.add(process)
        try:
            return process.wait()
        finally:
            with self._lock:
                self._live.discard(process)

    def stop(self) -> None:
        """Kill every live child and start no other."""
        with self._lock:
            self.stopping = True
            for process in self._live:
                process.kill()


CHILDREN = Children()


def has_checkpoint(folder: Path) -> bool:
    return any((path / "trainer_state.json").is_file() for path in folder.glob("checkpoint-*"))


def run_flags(run: Run, overrides: dict[str, str]) -> dict[str, Any]:
    """The run's flags with ``--set`` overrides, which apply to every run of the invocation alike."""
    return {**run.study.flags(run.variant, run.depth, run.seed, run.size, run.source), **overrides}


def train_command(run: Run, work: Path, device: str, overrides: dict[str, str]) -> list[str]:
    flags = run_flags(run, overrides)
    if device == "cpu":
        flags["use_cpu"] = True
    else:
        flags.pop("use_cpu", None)
    out = run.work_dir(work)
    flags.update({"output_dir": str(out), "report_to": "none", "disable_tqdm": True})
    if has_checkpoint(out):
        flags["resume_from_checkpoint"] = True
    return [sys.executable, "-m", "ode_transformer.train.run", *to_argv(flags)]


# --------------------------------------------------------------------------------------------
# What a result records


def data_info(flags: dict[str, Any], data_root: Path, study: Study) -> dict[str, Any]:
    """The corpus names, the data root and the SHA-256 of every file of the shared corpora used: the `dataset`
    flag's, the study's fixed test corpora and its extra test sets' files."""
    paths = []
    for name in [*str(flags.get("dataset", "")).split("+"), *study.test_corpora]:
        folder = data_root / CORPUS_FOLDERS.get(name, name)
        paths += sorted(path for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else []
    for test in study.extra_tests:
        paths += [data_root / test.source, *(data_root / path for path in test.references)]
    files = {
        str(path.relative_to(data_root)): hashlib.sha256(path.read_bytes()).hexdigest() for path in paths
    }
    return {"dataset": flags.get("dataset"), "data_root": str(data_root), "files": files}


def curves(log_history: list[dict]) -> tuple[list[dict], list[dict]]:
    """(validation curve, training curve) from the trainer's log history."""
    validation = [
        {k: e[k] for k in ("epoch", "step", "eval_loss", "eval_perplexity") if k in e}
        for e in log_history
        if "eval_loss" in e
    ]
    training = [
        {k: e[k] for k in ("epoch", "step", "loss", "learning_rate") if k in e}
        for e in log_history
        if "loss" in e
    ]
    return validation, training


def collect(
    run: Run, out: Path, flags: dict, argv: list[str], environment: dict, extra: dict
) -> dict[str, Any]:
    """The result record of a finished run (see the module docstring); ``extra``: the extra tests' records."""
    document = json.loads((out / "hub_metrics.json").read_text(encoding="utf-8"))
    state = json.loads((out / "trainer_state.json").read_text(encoding="utf-8"))
    validation, training = curves(state["log_history"])
    recipe = document["training"]["recipe"]
    hypotheses = out / "test_hypotheses.txt"
    metrics = {r.get("name", r["metric"]): r["value"] for r in document["results"]}
    for record in extra.values():
        if clash := set(metrics) & set(record["metrics"]):
            raise ValueError(
                f"extra test metrics {sorted(clash)} would overwrite the test split's; rename them"
            )
        metrics.update(record["metrics"])
    return {
        "study": run.study.name,
        "size": run.size,
        "batch": run.batch,
        "variant": run.variant,
        "variant_label": run.study.variants[run.variant].label,
        "depth": run.depth,
        "seed": run.seed,
        "flags": flags,
        "command": argv[1:],
        "config": json.loads((out / "config.json").read_text(encoding="utf-8")),
        **environment,
        "precision": {"precision": recipe["precision"], "reason": recipe["precision_reason"]},
        "steps": state["global_step"],
        "epochs": state.get("epoch"),
        "best_metric": state.get("best_metric"),
        "best_checkpoint": Path(state["best_model_checkpoint"]).name
        if state.get("best_model_checkpoint")
        else None,
        "metrics": metrics,
        "signatures": {r["name"]: r["signature"] for r in document["results"] if "signature" in r},
        "validation_curve": validation,
        "training_curve": training,
        "test_hypotheses": _lines(hypotheses) if hypotheses.is_file() else None,
        "extra_tests": extra,
    }


def _lines(path: Path) -> list[str]:
    """The lines of a file written one output per line (as `ode_transformer.train.run` and `ode_transformer.translate` write them)."""
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def write_json(path: Path, value: Any) -> None:
    """Write whole or not at all (:func:`ode_transformer.files.write_atomic`: a temporary name of its own, then a
    rename): a kill never leaves a half-written result that would be skipped, and two writers of one result, by
    any names, never write one temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(value, indent=1, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------------------------
# Running


def extra_test_commands(
    test: ExtraTest, out: Path, flags: dict, device: str, data_root: Path
) -> list[list[str]]:
    """Decode the test's sources with the trained model in ``out`` (the run's batch size and source length),
    then score the hypotheses: the two commands a user would run."""
    hypotheses, scores = out / f"{test.name}_hypotheses.txt", out / f"{test.name}_metrics.json"
    translate = [
        sys.executable,
        "-m",
        "ode_transformer.translate",
        str(out),
        "--input",
        str(data_root / test.source),
        "--output",
        str(hypotheses),
        "--device",
        device,
        "--no_progress",
        "--batch_size",
        str(flags.get("per_device_eval_batch_size", 32)),
    ]
    if "max_source_length" in flags:
        translate += ["--max_source_length", str(flags["max_source_length"])]
    references = [arg for path in test.references for arg in ("--ref", str(data_root / path))]
    evaluate = [
        sys.executable,
        "-m",
        "ode_transformer.train.evaluate_predictions",
        "--task",
        test.task,
        "--hyp",
        str(hypotheses),
        "--src",
        str(data_root / test.source),
        *references,
        "--output",
        str(scores),
    ]
    return [translate, evaluate]


def run_extra_tests(
    run: Run, out: Path, flags: dict, args: argparse.Namespace, env: dict, log
) -> tuple[int, dict]:
    """Score the study's extra test sets on the trained model in ``out``: (exit code of the first failing
    command or 0, the record of each test: its commands, the study's metrics and the hypotheses). Outputs of an
    earlier attempt are removed first, so a result never records another attempt's hypotheses."""
    records = {}
    for test in run.study.extra_tests:
        hypotheses, scores = out / f"{test.name}_hypotheses.txt", out / f"{test.name}_metrics.json"
        hypotheses.unlink(missing_ok=True)
        scores.unlink(missing_ok=True)
        commands = extra_test_commands(test, out, flags, args.device, args.data_root)
        for command in commands:
            code = CHILDREN.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            if code != 0:
                return code, records
        metrics = json.loads(scores.read_text(encoding="utf-8"))
        records[test.name] = {
            "commands": [command[1:] for command in commands],
            "metrics": {name: metrics[key] for key, name in test.metrics.items()},
            "hypotheses": _lines(hypotheses),
        }
    return 0, records


def gate_diagnostic_command(run: Run, out: Path, flags: dict, args: argparse.Namespace) -> list[str] | None:
    """The block diagnostic of a run with a gate (``experiments.block_diagnostic``), its rows written into the
    study's ``diagnostics/gates.json`` under the run's id: the gate statistics a study document quotes, committed
    since the model folders are not. None for a run without a gate."""
    from modeling_ode.ode import GATED_MODES

    if not any(flags.get(f"{side}_ode_coefficients") in GATED_MODES for side in ("encoder", "decoder")):
        return None
    gates = args.results / run.study.name / run.folder / "diagnostics" / "gates.json"
    gates.parent.mkdir(parents=True, exist_ok=True)
    return [
        sys.executable,
        "-m",
        "experiments.block_diagnostic",
        str(out),
        "--json",
        str(gates),
        "--data-root",
        str(args.data_root),
    ]


def changes_since_result(run: Run, args: argparse.Namespace) -> dict[str, tuple[Any, Any]] | None:
    """None while the run has no result; else the flags the study has changed since it ran (empty: done)."""
    result = run.result_path(args.results)
    if not result.is_file():
        return None
    return run.study.flag_changes(json.loads(result.read_text(encoding="utf-8")), args.set, run.source)


def runner_lock(out: Path) -> tuple[Path, Path]:
    """The lock and pid files a runner holds beside a run's work folder ``out``: not its ``.NAME.lock``, which the
    training process takes itself (ode_transformer.files.lock_output)."""
    return out.with_name(f".{out.name}.runner.lock"), out.with_name(f".{out.name}.runner.pid")


def execute(run: Run, args: argparse.Namespace) -> str:
    """Train, test and record one run, holding its work folder's lock (one process trains a run at a time); returns
    a one-line status."""
    out = real_path(run.work_dir(args.work_dir))
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_file, pid_file = runner_lock(out)
    try:
        with hold_lock(out, lock_file, pid_file, "--work-dir", holder="run"):
            return _execute(run, args)
    except InUseError:  # never the trainer's "--overwrite_output_dir" advice: it would delete the live run
        try:
            pid = pid_file.read_text(encoding="utf-8").strip() or "unknown"
        except FileNotFoundError:  # it has just finished: starting again skips or resumes it
            pid = "that just ended"
        return (
            f"FAILED {run.id}: another run (pid {pid}) is training this ({out}); wait for it to end, or stop it and "
            "start this again (it resumes from its last checkpoint)"
        )


def _execute(run: Run, args: argparse.Namespace) -> str:
    result = run.result_path(args.results)
    changes = changes_since_result(run, args)
    if changes is not None:
        if changes:  # never mix: the study changed since this run, and re-running would overwrite a result
            return (
                f"STALE {run.id}: its result was made with other flags ({describe_changes(changes)}); it is kept. "
                f"Remove {result} to run it with the study's flags now."
            )
        return f"skip {run.id} (result exists)"
    start = run.study.source_path(run.seed, run.source)
    # a relative source is the repository's, as ode_transformer.train.run (run from there) reads it
    if start is not None and not (REPO / start).is_dir():
        return (
            f"FAILED {run.id}: no source model {start} to start from; train it first (the study's source: "
            f"{run.study.source}) or pass --source PATH_WITH_{{seed}}"
        )
    out = run.work_dir(args.work_dir)
    argv = train_command(run, args.work_dir, args.device, args.set)
    flags = run_flags(run, args.set)
    env = {
        **os.environ,
        **MALLOC_ENV,
        "OMP_NUM_THREADS": str(args.threads),
        "ODE_DATA_DIR": str(args.data_root),
    }
    resumed = has_checkpoint(out)
    if not resumed:  # nothing to resume: start from an empty folder
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(out.parent / f"{run.id}.log", "a", encoding="utf-8") as log:
        code = CHILDREN.run(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        if code == 0:  # trained and tested: the extra test sets are decoded from the saved model
            code, extra = run_extra_tests(run, out, flags, args, env, log)
        if code == 0 and (diagnostic := gate_diagnostic_command(run, out, flags, args)):
            code = CHILDREN.run(diagnostic, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    if code != 0:
        return f"FAILED {run.id} (exit {code}; log: {out.parent / f'{run.id}.log'})"
    environment = {
        "git": git_commit(),
        "device": device_info(args.device, args.threads),
        "data": data_info(flags, args.data_root, run.study),
        # of this invocation, extra tests included: a resumed run's earlier attempts are not counted
        "wall_time_s": round(wall, 1),
        "resumed": resumed,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json(result, collect(run, out, flags, argv, environment, extra))
    return f"done {run.id} in {wall / 60:.1f} min"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("study", choices=sorted(STUDIES))
    parser.add_argument("--size", default="cpu", help="cpu (reduced, 2-core machine) or paper (GPU)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: the study's seeds")
    parser.add_argument("--only", nargs="+", metavar="VARIANT", help="run these variants only")
    parser.add_argument("--depths", type=int, nargs="+", help="default: the study's depths")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="corpora folder (default: $ODE_DATA_DIR or ../shared/data)",
    )
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
    parser.add_argument("--threads", type=int, help="intra-op threads per run (default: cores / parallel)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where result files go")
    parser.add_argument("--work-dir", type=Path, default=WORK, help="checkpoints and logs (git-ignored)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a ode_transformer.train.run flag in every run (smoke tests; recorded in each result's flags)",
    )
    parser.add_argument(
        "--source",
        metavar="PATH",
        help="studies that fine-tune trained models (multi30k_upcycle): the model folder each run starts from, "
        "{seed} standing for the run's seed (default: the study's own, under runs/experiments/)",
    )
    parser.add_argument(
        "--batch",
        type=batch_label,
        metavar="LABEL",
        help="a second batch of the study at this size, run on another machine or precision (a GPU, say): its "
        "results and checkpoints go to <size>_<LABEL>, e.g. results/multi30k_paired/cpu_h200, and pair among "
        "themselves only (a study that fine-tunes, multi30k_upcycle, takes that batch's models with --source)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the commands only")
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.set):
        parser.error("--set takes KEY=VALUE, e.g. --set max_steps=10")
    args.set = dict(item.split("=", 1) for item in args.set)
    study = STUDIES[args.study]
    unknown = sorted(set(args.only or ()) - set(study.variants))
    if unknown:
        parser.error(
            f"unknown variants {unknown} for study {study.name!r}; variants: {', '.join(study.variants)}"
        )
    if args.size not in study.sizes:
        parser.error(f"study {study.name!r} has sizes {', '.join(study.sizes)}, not {args.size!r}")
    if args.source is not None and study.source is None:
        parser.error(
            f"study {study.name!r} trains from scratch: --source is for studies that fine-tune a model"
        )
    from ode_transformer.train.data import data_root

    args.data_root = data_root(args.data_root).resolve()
    args.threads = args.threads or max((os.cpu_count() or 1) // args.parallel, 1)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    study = STUDIES[args.study]
    runs = plan(
        study,
        args.size,
        args.seeds or list(study.seeds),
        args.only or list(study.variants),
        args.depths or list(study.depths),
        args.source,
        args.batch,
    )
    if args.dry_run:
        for run in runs:
            changes = changes_since_result(run, args)
            state = "todo" if changes is None else "stale" if changes else "done"
            print(state, run.id, " ".join(train_command(run, args.work_dir, args.device, args.set)[1:]))
        return 0
    failed = 0
    pool = ThreadPoolExecutor(max_workers=args.parallel)
    try:
        with children_stopped_on_signals():
            for status in pool.map(lambda run: execute(run, args), runs):
                print(time.strftime("%H:%M:%S"), status, flush=True)
                failed += status.startswith(("FAILED", "STALE"))
    finally:  # stopped: the runs not started yet never start, and those running end with their killed children
        pool.shutdown(wait=True, cancel_futures=True)
    return 1 if failed else 0


@contextlib.contextmanager
def children_stopped_on_signals() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM stop every child of this runner at once, then the runner (exit code
    128 + the signal, as a shell reports a kill by it); the handlers before are restored after. Without them, a
    SIGTERM ended the runner and left its runs training, orphaned, and a SIGINT of the runner alone left its pool's
    threads waiting on them."""
    CHILDREN.stopping = False  # a new start in this process (tests call main more than once)
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def stop(signum: int, frame: object) -> None:
        CHILDREN.stop()
        raise SystemExit(128 + signum)

    before = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
