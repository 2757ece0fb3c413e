"""Resume a long study in the background from the commit its runs started on: a detached git worktree of that
commit, and low-priority runners (lanes; one per core, or one on every core with `threads`) that each work
through their steps in order. Each run resumes from its last checkpoint, so starting a queue again after an
interruption loses at most the epoch in flight.

    python -m experiments.queue ptb_paper             # start (or resume) the lanes in the background
    python -m experiments.queue ptb_paper --dry-run   # print the worktree and each lane's commands

The lanes of a queue never share a run: the pinned commit may predate the output-folder lock, so two runners
must not train the same run. For the same reason a queue starts once: its lanes hold a lock
(``runs/queue/<queue>.lock``) while any of them runs, and a second start is refused, naming them. Each finished
run's JSON lands in this checkout's results/ (it records the commit it trained on); commit it and regenerate the
study's table (`python -m experiments.report STUDY --size cpu`).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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


def lane_command(queue: Queue, lane: tuple[Step, ...]) -> str:
    """The shell command of one lane: its steps one after another (a failed step does not stop the next)."""
    calls = [
        f"nice -n 19 .venv/bin/python -m experiments.run {queue.study} --seeds {' '.join(map(str, seeds))} "
        + (f"--only {' '.join(variants)} " if variants else "")  # no variants: all of the study's
        + f"--parallel 1 --threads {queue.threads} --results {shlex.quote(str(REPO / 'results'))}"
        + (f" --batch {queue.batch}" if queue.batch else "")
        + "".join(f" {shlex.quote(flag)}" for flag in queue.extra)
        for seeds, variants in lane
    ]
    # A lane starts a session of its own, and Linux's autogroup scheduling shares the CPU between sessions first:
    # `nice` alone then orders processes within the lane only, and the lanes took as much CPU as a test run or a
    # benchmark beside them. Lowering the session's own priority (where the kernel has autogroups) yields to them.
    return f"{LOW_PRIORITY_SESSION}; " + "; ".join(calls)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.queue", description=__doc__.split("\n\n")[0])
    parser.add_argument("queue", choices=sorted(QUEUES), help="a queue: a study's name, or a batch of it")
    parser.add_argument(
        "--tree", type=Path, help="the worktree (default: the queue's, next to this checkout)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the worktree and the lanes' commands only"
    )
    args = parser.parse_args(argv)
    queue = QUEUES[args.queue]
    tree = (args.tree or REPO.parent / queue.worktree).resolve()
    commands = [lane_command(queue, lane) for lane in queue.lanes]
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
