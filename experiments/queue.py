"""Resume a long study in the background from the commit its runs started on: a detached git worktree of that
commit, and low-priority runners (lanes; one per core, or one on every core with `threads`) that each work
through their steps in order. Each run resumes from its last checkpoint, so starting a queue again after an
interruption loses at most the epoch in flight.

    python -m experiments.queue ptb_paper                    # start (or resume) the lanes in the background
    python -m experiments.queue ptb_paper --dry-run          # print the worktree and each lane's commands
    python -m experiments.queue ptb_paper_bf16 --until 17:00  # each run only where the plan says it ends by then
    python -m experiments.queue ptb_paper_bf16 --unfinished   # before the session ends: the runs' progress, a cost

The lanes of a queue never share a run: the pinned commit may predate the output-folder lock, so two runners
must not train the same run. For the same reason a queue starts once: its lanes hold a lock
(``runs/queue/<queue>.lock``) while any of them runs, and a second start is refused, naming them. Each finished
run's JSON lands in this checkout's results/ (it records the commit it trained on); commit it and regenerate the
study's table (`python -m experiments.report STUDY --size cpu`).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from experiments.lease import steps_reached
from experiments.records import load_results
from experiments.studies import STUDIES, batch_folder
from ode_transformer.train.provenance import device_info

REPO = Path(__file__).resolve().parent.parent
LOCKS = REPO / "runs" / "queue"  # git-ignored: each queue's lock and the pids of its lanes

# (seeds, variants) of one `experiments.run` call; () = all variants
Step = tuple[tuple[int, ...], tuple[str, ...]]


@dataclass(frozen=True)
class Queue:
    study: str
    commit: str  # every run of the study so far trained from this commit; the rest must too
    lanes: tuple[tuple[Step, ...], ...]  # one runner per lane
    worktree: str  # the worktree's folder, next to this checkout
    extra: tuple[str, ...] = ()  # flags every `experiments.run` call of the lanes passes (e.g. --source)
    batch: str | None = None  # experiments.run --batch: the runs go to results/<study>/cpu_<batch>
    # The CPU the batch's runs need, (model name, flags), where the kernels it runs depend on them: one batch is one
    # device, and checkpoints do not outlive a machine, so another CPU model starts a batch of its own.
    cpu: tuple[str, tuple[str, ...]] | None = None
    # torch threads per lane: one lane on every core finishes a long run sooner than one lane per core does, which
    # decides whether it finishes before the machine goes away (results/README.md, the ptb_paper study's batches)
    threads: int = 1


_M30K_LATER_ROWS = ("rk4", "rk2_gated_authors", "rk2_gated_tableau", "residual_x2", "residual_x4")
QUEUES = {
    # Seed 0 of the five blocks, then seeds 1-2 of residual and RK4, split so that the lanes take
    # about the same time (an RK4 block computes its F four times, a residual block once).
    "ptb_paper": Queue(
        study="ptb_paper",
        commit="077866b",
        lanes=(
            (((0,), ("residual", "rk2", "rk2_ones")), ((1,), ("rk4",)), ((1, 2), ("residual",))),
            (((0,), ("rk4", "rk2_gated")), ((2,), ("rk4",))),
        ),
        worktree="exp_ptb",
    ),
    # ptb_paper's batch on an AMD EPYC Zen 4 (native bf16): tier (a)'s seeds of this device kind (experiments.verdict's
    # TIER_A_DEVICE_SEEDS; seed 0's pair is the first batch's, on the same kind), residual and RK4 alternating so
    # that each finished pair is one more distinct seed. One lane on both cores, as cpu_amx.
    "ptb_paper_bf16": Queue(
        study="ptb_paper",
        commit="c013fee",
        lanes=(
            (
                ((3,), ("residual",)),
                ((3,), ("rk4",)),
                ((4,), ("residual",)),
                ((4,), ("rk4",)),
            ),
        ),
        worktree="exp_ptb_bf16",
        batch="bf16",
        cpu=("AMD EPYC", ("avx512_bf16",)),
        threads=2,
    ),
    # ptb_paper's verdict batch on an Intel Xeon with AMX (bf16), one machine and one commit: residual seeds 0-2,
    # then tier (a)'s seeds of this kind (RK4 seeds 1-2, whose residual runs exist, then both rows of seed 5), then
    # the gated RK2 block (the recipes' default kind of block), then the other two RK2 rows: tier (c). One lane on
    # both cores: checkpoints do not outlive the machine, and an RK4 run on one core outlasts a session here
    # (results/README.md, the ptb_paper study's third batch).
    "ptb_paper_amx": Queue(
        study="ptb_paper",
        commit="ccb31fa",
        lanes=(
            (
                ((0, 1, 2), ("residual",)),
                ((1,), ("rk4",)),
                ((2,), ("rk4",)),
                ((5,), ("residual",)),
                ((5,), ("rk4",)),
                ((0, 1, 2), ("rk2_gated",)),
                ((0, 1, 2), ("rk2",)),
                ((0, 1, 2), ("rk2_ones",)),
            ),
        ),
        worktree="exp_ptb_amx",
        batch="amx",
        cpu=("Intel(R) Xeon(R) Processor", ("amx_bf16", "avx512_bf16")),
        threads=2,
    ),
    # The Multi30k headline rows as one batch, all on one machine and commit. Each lane runs the variants
    # of its seeds back to back: seeds 0-2 of every row first, then seeds 3-4 of residual, RK2 and RK4. Residual
    # seed 2 comes right after RK2 of seeds 0-1: the upcycling study (multi30k_upcycle) starts from residual seeds 0-2.
    "multi30k_paired": Queue(
        study="multi30k_paired",
        commit="bea8704",
        lanes=(
            (
                ((0,), ("residual", "rk2")),
                ((0,), _M30K_LATER_ROWS),
                ((2,), ("rk2", *_M30K_LATER_ROWS)),
                ((4,), ("residual", "rk2", "rk4")),
            ),
            (
                ((1,), ("residual", "rk2")),
                ((2,), ("residual",)),
                ((1,), _M30K_LATER_ROWS),
                ((3,), ("residual", "rk2", "rk4")),
            ),
        ),
        worktree="exp_m30k",
    ),
    # multi30k_upcycle: each seed's residual model of multi30k_paired fine-tuned as it is, or upcycled to RK2 / RK4 encoder
    # blocks, from the first commit with the upcycling code and this queue. Seed 2 needs residual-3-seed2 of
    # multi30k_paired (queued there after RK2 of seeds 0-1); a run whose source is missing fails, trains nothing,
    # and runs when the queue is started again.
    "multi30k_upcycle": Queue(
        study="multi30k_upcycle",
        commit="a669376",
        lanes=((((0,), ()), ((2,), ())), (((1,), ()),)),
        worktree="exp_upcycle",
        extra=("--source", "../exp_m30k/runs/experiments/multi30k_paired/cpu/residual-3-seed{seed}"),
    ),
}


LOW_PRIORITY_SESSION = "(echo 19 > /proc/self/autogroup) 2>/dev/null"


def lane_command(queue: Queue, lane: tuple[Step, ...], gate: str | None = None) -> str:
    """The shell command of one lane: its steps one after another (a failed step does not stop the next). With a
    ``gate`` (:func:`gate_command`), each step first asks it whether it fits the time left; the first that does
    not ends the lane."""
    calls = []
    for seeds, variants in lane:
        call = (
            f"nice -n 19 .venv/bin/python -m experiments.run {queue.study} --seeds {' '.join(map(str, seeds))} "
            + (f"--only {' '.join(variants)} " if variants else "")  # no variants: all of the study's
            + f"--parallel 1 --threads {queue.threads} --results {shlex.quote(str(REPO / 'results'))}"
            + (f" --batch {queue.batch}" if queue.batch else "")
            + "".join(f" {shlex.quote(flag)}" for flag in queue.extra)
        )
        calls.append(f"({gate} {step_word((seeds, variants))}) || exit 0; {call}" if gate else call)
    # A lane starts a session of its own, and Linux's autogroup scheduling shares the CPU between sessions first:
    # `nice` alone then orders processes within the lane only, and the lanes took as much CPU as a test run or a
    # benchmark beside them. Lowering the session's own priority (where the kernel has autogroups) yields to them.
    return f"{LOW_PRIORITY_SESSION}; " + "; ".join(calls)


# --------------------------------------------------------------------------------------------
# The session's end: a step starts only where the plan says it finishes in time


def step_word(step: Step) -> str:
    """A step as one shell word, SEEDS:VARIANTS, comma-separated (no variants: all of the study's)."""
    seeds, variants = step
    return f"{','.join(map(str, seeds))}:{','.join(variants)}"


def parse_step(word: str) -> Step:
    seeds, _, variants = word.partition(":")
    return tuple(int(seed) for seed in seeds.split(",")), tuple(v for v in variants.split(",") if v)


def gate_command(name: str, until: float) -> str:
    """The check each step of a lane runs first, from this checkout (the worktree's pinned code predates it)."""
    return f"cd {shlex.quote(str(REPO))} && .venv/bin/python -m experiments.queue {name} --until {until:.0f} --fits"


def step_fits(
    queue: Queue, step: Step, minutes_left: float, results: Path = REPO / "results"
) -> tuple[bool, str]:
    """Whether a step may start with ``minutes_left`` in the session, and why: each run of it the batch lacks
    ends in time by the plan's minutes (:func:`experiments.verdict.run_minutes`, for the batch's device kind and
    the lane's threads), or a run of it was never measured there and runs as its own measurement. A run that
    would resume from a checkpoint is costed whole: the gate errs towards not starting."""
    from experiments.verdict import run_minutes, stratum

    folder = results / queue.study / batch_folder("cpu", queue.batch)
    records = load_results(folder) if folder.is_dir() else []
    done = {(r["variant"], r["seed"]) for r in records}
    kinds = {stratum(r) for r in records}  # one, as a batch is one device and precision
    variants = step[1] or STUDIES[queue.study].variants
    runs = [(variant, seed) for seed in step[0] for variant in variants if (variant, seed) not in done]
    if not runs:
        return True, "finished already"
    kind = kinds.pop() if len(kinds) == 1 else None
    costs = {
        variant: run_minutes(kind, variant, queue.threads, results) if kind else None for variant, _ in runs
    }
    if None in costs.values():
        return True, "not measured on this device kind at these threads: it runs as its own measurement"
    minutes = sum(costs[variant] for variant, _ in runs)
    names = ", ".join(f"{variant} seed {seed}" for variant, seed in runs)
    if minutes <= minutes_left:
        return True, f"{names}: about {minutes:.0f} min, {minutes_left:.0f} min left"
    return False, (
        f"{names}: about {minutes:.0f} min on {kind} at {queue.threads} threads, and {minutes_left:.0f} min "
        "are left before --until: the lane ends here (its runs would be lost with the machine)"
    )


def record_unfinished(queue: Queue, tree: Path, results: Path = REPO / "results") -> list[Path]:
    """Write the progress of each run of the queue's batch that the worktree has begun and this checkout has no
    record of, into ``results/<study>/<batch>/unfinished/`` (where the plan reads it as a cost): the updates of its
    last checkpoint and the seconds from the run's start to it. A resumed run is left out: its time has a gap.

    Returns:
        The files written.
    """
    batch = batch_folder("cpu", queue.batch)
    out = results / queue.study / batch / "unfinished"
    written = []
    for log in sorted((tree / "runs" / "experiments" / queue.study / batch).glob("*-seed*.log")):
        work = log.with_suffix("")
        steps = steps_reached(work)
        if not steps or (results / queue.study / batch / f"{work.name}.json").exists():
            continue
        starts = re.findall(r"^(\S+ \S+),\d+ INFO \S+: precision: (\w+)", log.read_text(), re.MULTILINE)
        if len(starts) != 1:
            print(
                f"{work.name}: {len(starts)} starts in its log, not one: no cost read from it",
                file=sys.stderr,
            )
            continue
        last = work / f"checkpoint-{steps}"
        started = datetime.strptime(starts[0][0], "%Y-%m-%d %H:%M:%S").timestamp()  # the log's local time
        variant, depth, seed = re.fullmatch(r"(.+)-(\d+)-seed(\d+)", work.name).groups()
        record = {
            "study": queue.study, "batch": queue.batch, "variant": variant, "depth": int(depth),
            "seed": int(seed), "git": {"commit": queue.commit}, "device": device_info("cpu", queue.threads),
            "precision": {"precision": starts[0][1]}, "steps": steps,
            "seconds": round(last.stat().st_mtime - started, 1),
            "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{work.name}.json").write_text(json.dumps(record, indent=2) + "\n")
        written.append(out / f"{work.name}.json")
    return written


def prepare_worktree(queue: Queue, tree: Path, repo: Path = REPO) -> None:
    """A detached worktree of the queue's commit at `tree`, with a venv that runs the worktree's own code."""
    if not (repo / ".venv" / "bin" / "python").exists():
        raise SystemExit(f"{repo / '.venv'} is missing: run `make setup` first (the lanes use it)")
    if not tree.exists():
        known = ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{queue.commit}^{{commit}}"]
        if subprocess.run(known, capture_output=True).returncode:
            raise SystemExit(
                f"commit {queue.commit}, which the queue pins, is not in {repo}: fetch it (git fetch origin; in a "
                "shallow clone, git fetch --unshallow), then start the queue again"
            )
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "-f", "--detach", str(tree), queue.commit], check=True
        )
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode or not (tree / ".git").exists():
        raise SystemExit(f"{tree} exists and is not a git worktree: give another --tree")
    if not head.stdout.startswith(queue.commit):
        raise SystemExit(f"{tree} is at {head.stdout.strip()[:7]}, not {queue.commit}: give another --tree")
    if not (tree / ".venv" / "bin" / "python").exists() or (tree / ".venv").is_symlink():
        tree_venv(tree, repo / ".venv")


def tree_venv(tree: Path, dependencies: Path) -> None:
    """`tree/.venv`: the packages of the venv `dependencies`, and `tree` itself installed editable. Sharing the
    checkout's venv would not do: its editable install maps `ode_transformer.train` and `.hub` to the checkout's
    folders (pyproject's package-dir), so a lane would train with the newest `train/`, not the pinned one."""
    venv = tree / ".venv"
    if venv.is_symlink():
        venv.unlink()
    python = dependencies / "bin" / "python"
    base = subprocess.run(
        [
            str(python),
            "-c",
            "import sys, sysconfig; print(sys._base_executable); print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    subprocess.run([base[0], "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A plain path in a .pth file: the dependencies' packages, without their own .pth files (the editable finder)
    (Path(purelib) / "_dependencies.pth").write_text(base[1] + "\n")
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-e",
            str(tree),
        ],
        check=True,
    )


def gather_results(queue: Queue, tree: Path, repo: Path = REPO) -> list[Path]:
    """Copy into the checkout's results/ the study's results that runs started by hand in the worktree wrote
    there (without --results), so that the lanes find them done; returns the copies."""
    copied = []
    for source in sorted((tree / "results" / queue.study).glob("*/*-seed*.json")):
        target = repo / "results" / queue.study / source.parent.name / source.name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            copied.append(target)
    return copied


def this_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, set[str]]:
    """This machine's CPU model name and flags, as /proc/cpuinfo gives them."""
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    field = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in lines if ":" in line}
    return field.get("model name", "unknown"), set(field.get("flags", "").split())


def wrong_cpu(queue: Queue, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """Why this machine may not add runs to the queue's batch (another CPU model, or flags it lacks), or None."""
    if queue.cpu is None:
        return None
    name, flags = this_cpu(cpuinfo)
    wanted, needed = queue.cpu
    missing = sorted(set(needed) - flags)
    if name == wanted and not missing:
        return None
    lacks = f" without {', '.join(missing)}" if missing else ""
    return (
        f"batch cpu_{queue.batch} runs on {wanted} with {', '.join(needed)}; this machine is {name}{lacks}: "
        "its runs would not pair with the batch's, so add a queue with a batch label of its own for this CPU"
    )


def running(study: str) -> bool:
    """Whether a runner of ``study`` is running (also one started by hand), by its command line. Not a lock: two
    starts at once both see none, so a start holds :func:`lock_queue` first."""
    return subprocess.run(["pgrep", "-f", f"experiments.run {study} "], capture_output=True).returncode == 0


def lock_queue(name: str, locks: Path | None = None) -> int:
    """Take the queue's lock, ``LOCKS/NAME.lock``, and return its file descriptor: the lanes inherit it
    (:func:`start_lane`), so it stays held while any lane runs and is released when the last one ends (the kernel
    drops a flock with its last holder, also a killed one). Not :func:`ode_transformer.files.hold_lock`: its lock ends
    with this process, and the lanes outlive it.

    Raises:
        SystemExit: another start holds it, or its lanes still run ("another run (pid N) is training this").
    """
    locks = locks or LOCKS
    locks.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(locks / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        pids = locks / f"{name}.pid"
        pid = pids.read_text().strip() if pids.is_file() else ""
        raise SystemExit(
            f"another run (pid {pid or 'unknown'}) is training this: queue {name} is already started; wait for its "
            f"lanes to end, or stop them (kill -- -PID for each lane) and start it again (runs resume)"
        ) from None
    (locks / f"{name}.pid").write_text(f"{os.getpid()}\n")  # this start, until its lanes replace it
    return descriptor


def start_lane(command: str, tree: Path, log: Path, lock: int) -> subprocess.Popen:
    """Start one lane's shell command in the background, in a session of its own (a logout does not stop it),
    holding the queue's ``lock`` (:func:`lock_queue`) while it runs."""
    with log.open("a") as out:
        return subprocess.Popen(
            ["bash", "-c", command],
            cwd=tree,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(lock,),
        )


def until_time(text: str) -> float:
    """``--until``'s value as seconds since the epoch: HH:MM is today's, in UTC."""
    if text.isdigit():
        return float(text)
    try:
        clock = datetime.strptime(text, "%H:%M").time()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HH:MM (UTC) or seconds since the epoch") from None
    return datetime.combine(datetime.now(timezone.utc).date(), clock, timezone.utc).timestamp()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.queue", description=__doc__.split("\n\n")[0])
    parser.add_argument("queue", choices=sorted(QUEUES), help="a queue: a study's name, or a batch of it")
    parser.add_argument(
        "--tree", type=Path, help="the worktree (default: the queue's, next to this checkout)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the worktree and the lanes' commands only"
    )
    parser.add_argument(
        "--until",
        type=until_time,
        help="when the session ends (HH:MM UTC today, or seconds since the epoch): each step starts only where "
        "the plan says it finishes by then (results/verdict.md, 'What each machine can finish')",
    )
    parser.add_argument(
        "--fits", type=parse_step, metavar="SEEDS:VARIANTS", help=argparse.SUPPRESS
    )  # the gate
    parser.add_argument(
        "--unfinished",
        action="store_true",
        help="before the session ends: record the progress of the batch's unfinished runs as the plan's costs",
    )
    args = parser.parse_args(argv)
    queue = QUEUES[args.queue]
    tree = (args.tree or REPO.parent / queue.worktree).resolve()
    if args.fits is not None:
        fits, why = step_fits(queue, args.fits, (args.until - time.time()) / 60)
        print(f"--until: {why}", flush=True)
        return 0 if fits else 1
    if args.unfinished:
        for path in record_unfinished(queue, tree):
            print(f"wrote {path.relative_to(REPO)}: commit it")
        return 0
    if args.until is not None and queue.study != "ptb_paper":
        parser.error("--until: the plan measures ptb_paper's runs only")
    if args.until is not None and args.until <= time.time():
        parser.error(f"--until {datetime.fromtimestamp(args.until, timezone.utc):%H:%M} UTC has passed")
    gate = gate_command(args.queue, args.until) if args.until is not None else None
    commands = [lane_command(queue, lane, gate) for lane in queue.lanes]
    if args.dry_run:
        print(f"worktree {tree} at {queue.commit}")
        for index, command in enumerate(commands):
            print(f"lane {index}: {command}")
        return 0
    if why := wrong_cpu(queue):
        print(why, file=sys.stderr)
        return 1
    lock = lock_queue(args.queue)  # before running(): two starts at once both pass it
    if running(queue.study):
        print(f"a runner of {queue.study} is already running: not starting another", file=sys.stderr)
        return 1
    prepare_worktree(queue, tree)
    for copy in gather_results(queue, tree):
        print(f"copied {copy.relative_to(REPO)} from the worktree: commit it")
    logs = tree / "runs" / "queue"
    logs.mkdir(parents=True, exist_ok=True)
    lanes = []
    for index, command in enumerate(commands):
        log = logs / f"lane{index}.log"
        lanes.append(start_lane(command, tree, log, lock))
        print(f"lane {index} started (pid {lanes[-1].pid}), log {log}: {shlex.quote(command)}")
    (LOCKS / f"{args.queue}.pid").write_text(", ".join(str(lane.pid) for lane in lanes) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
