"""Spend one lease of a lent GPU where the verdict is nearest (``experiments.verdict``'s tiers, in order), from a
pinned commit, so that a lease cut short keeps every finished run and the next lease continues the same batches
whatever main has become since.

    python -m experiments.lease carry                  # here, before a lease: .lease/ (the pinned code, corpora)
    python -m experiments.lease plan 540 --device h200  # here: what a lease of that many seconds would run
    python -m experiments.lease run 540                 # there: the device tool's command (below)
    python -m experiments.lease collect FILES_AT        # here, after: the returned runs into results/

The device tool's call: ``run`` with ``command`` ``python3 -m experiments.lease run 540``, ``timeout_s`` 600 and
``carry`` ``[".lease", ".whl"]`` (.whl: the wheels of benchmarks/README.md). There, the lease

1. clones the pinned commit from ``.lease/pinned.bundle`` (``COMMIT``: every run of these batches trains with its
   code, and records it) and installs it over the machine's Python with the wheels;
2. starts the highest-priority unfinished runs, ``--slots`` at a time, each one ``experiments.run`` call of the
   pinned code; a run starts only where its measured cost fits the time left, and a (study, variant) with no
   measured cost on this device starts anyway, once, as its own measurement;
3. after every run that ends, rewrites ``$OUT/lease.tgz`` (written aside, then renamed): the new result files,
   every run's log, and ``lease.json`` (each run's start, end and status, and the progress of those the deadline
   stopped, which later plans read as a cost).

A batch (one folder per tier and device) holds one commit and one device: a tier whose folder holds runs of another
commit or device is refused with the reason, and ``collect`` refuses a lease whose runs would mix into a batch of
another commit, device or precision (naming the files). To start new batches at a later commit, change ``COMMIT``
and the device label (``--label``), not the runs already committed. A lease whose budget fits no run says so before
its clone and install, and exits 1; a damaged ``lease.tgz`` or record is named with the fix, in one line.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.costs import Costs
from experiments.records import (
    RecordError,
    load_results,
    merge_json,
    mixing,
    read_record,
    record_files,
    refuse_bad_records,
)
from experiments.studies import batch_folder
from experiments.verdict import TIERS, Tier

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
LEASES = RESULTS / "leases"
CARRY = REPO / ".lease"
# The pinned commit of the GPU batches: the first with the study definitions they run (the default block in
# multi30k_paired, the depth probe's stages) and this runner. Every run of these batches trains with its code.
COMMIT = "9a156c8"
CORPORA = ("ptb", "multi30k", "tatoeba_de_en")  # the tiers' corpora, under .lease/data
SLOTS = 6  # runs at a time on one GPU: multi30k_paired's H200 batch ran 6 at once, 2 threads each
THREADS = 2
SETUP_GUESS_S = 120.0  # the clone and install, until a lease has measured them (lease.json's setup_s)
MARGIN_S = 20.0  # the last pack, before the device tool's own limit


@dataclass(frozen=True)
class Planned:
    tier: Tier
    variant: str
    seed: int
    cost: float | None  # seconds, None: unmeasured on this device

    @property
    def key(self) -> tuple[str, str]:
        return self.tier.study, self.variant

    @property
    def name(self) -> str:
        return f"{self.tier.study}/{self.variant}-seed{self.seed}"


def measured_costs(device: str, results: Path = RESULTS) -> Costs:
    """The costs on ``device`` (a GPU's name, as results record it) from every committed result and lease record."""
    costs = Costs()
    for path in sorted(results.glob("*/*/*-seed*.json")):
        result = read_record(path)
        costs.add_result(result, here=(result.get("device") or {}).get("name") == device)
    for path in sorted(results.glob("leases/*/lease.json")):
        lease = read_lease_record(path)
        if lease.get("device") != device:
            continue
        for run in lease["runs"]:
            if run.get("steps") and run["status"] != "done":
                costs.add_stopped((run["study"], run["variant"]), run["progress_s"], run["steps"])
    return costs


def read_lease_record(path: Path, shown: str | None = None) -> dict[str, Any]:
    """A lease's ``lease.json`` (``shown``: its name in messages, where it was unpacked elsewhere).

    Raises:
        RecordError: not a lease record (named, with the fix).
    """
    try:
        lease = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        lease = error  # refused below, outside the except: one line
    if not isinstance(lease, dict) or not isinstance(lease.get("runs"), list):
        raise RecordError(
            f"{shown or path} is not a lease's record (lease.json, with its runs): restore it from git, or fetch the "
            "lease's files again"
        )
    return lease


def last_setup_seconds(device: str, results: Path = RESULTS) -> float:
    leases = [read_lease_record(path) for path in sorted(results.glob("leases/*/lease.json"))]
    setups = [lease.get("setup_s") for lease in leases if lease.get("device") == device]
    setups = [s for s in setups if s]
    return setups[-1] if setups else SETUP_GUESS_S


# --------------------------------------------------------------------------------------------
# The plan


def refusal(tier: Tier, label: str, device: str, commit: str, results: Path = RESULTS) -> str | None:
    """Why a tier may not add runs to its batch folder (runs there of another commit or device), or None."""
    folder = tier.folder(label, results)
    # a mixed folder is named here, not raised
    runs = load_results(folder, mixed=True) if folder.is_dir() else []
    commits = {(r.get("git") or {}).get("commit") or "none" for r in runs if not _same_commit(r, commit)}
    devices = {(r.get("device") or {}).get("name") or "none" for r in runs} - {device}
    why = [f"commit {', '.join(sorted(c[:7] for c in commits))}"] if commits else []
    why += [f"device {', '.join(sorted(devices))}"] if devices else []
    if not why and (mixed := mixing([(path.name, r) for path, r in zip(record_files(folder), runs)])):
        why = [mixed]  # e.g. two precisions: its own runs do not compare
    if not why:
        return None
    return (
        f"{folder} holds runs of {' and '.join(why)}: one batch is one commit and one device; "
        "give another --label, or pin that commit"
    )


def _same_commit(result: dict[str, Any], commit: str) -> bool:
    recorded = (result.get("git") or {}).get("commit") or ""
    return bool(recorded) and (recorded.startswith(commit) or commit.startswith(recorded))


def queue(
    label: str, results: Path = RESULTS, tiers: tuple[Tier, ...] = TIERS
) -> list[tuple[Tier, str, int]]:
    """Every unfinished run of the tiers, in priority order."""
    runs = []
    for tier in tiers:
        folder = tier.folder(label, results)
        done = load_results(folder) if folder.is_dir() else []
        runs += [(tier, variant, seed) for variant, seed in tier.pending(done)]
    return runs


def choose(
    waiting: list[tuple[Tier, str, int]], costs: Costs, seconds_left: float, run_seconds: float
) -> Planned | None:
    """The first waiting run that fits: a measured one whose cost fits the time left, or an unmeasured one while at
    least half of the lease's run time (``run_seconds``) is left (it is its own measurement: started late, it would
    measure little and hold a slot a measured run could use)."""
    for tier, variant, seed in waiting:
        cost = costs.estimate((tier.study, variant))
        if cost is None and seconds_left >= run_seconds / 2:
            return Planned(tier, variant, seed, None)
        if cost is not None and cost <= seconds_left:
            return Planned(tier, variant, seed, cost)
    return None


def simulate(
    waiting: list[tuple[Tier, str, int]], costs: Costs, seconds: float, slots: int
) -> list[tuple[float, Planned]]:
    """The plan a lease of ``seconds`` (after its setup) would follow: (start, run) in order of start. An unmeasured
    run holds its slot to the end, as its cost is unknown."""
    free = [0.0] * slots
    waiting = list(waiting)
    plan = []
    while waiting:
        slot = min(range(slots), key=free.__getitem__)
        now = free[slot]
        chosen = choose(waiting, costs, seconds - now, seconds)
        if chosen is None or now >= seconds:
            break
        waiting.remove((chosen.tier, chosen.variant, chosen.seed))
        free[slot] = seconds if chosen.cost is None else now + chosen.cost
        plan.append((now, chosen))
    return plan


def lease_plan(
    seconds: float, label: str, device: str, slots: int, commit: str = COMMIT, results: Path = RESULTS
) -> tuple[float, dict[str, str], list[tuple[float, Planned]]]:
    """What a lease of ``seconds`` would do: (its setup's measured or guessed seconds, each refused tier's reason by
    label, the plan of :func:`simulate` after the setup and the margin)."""
    setup = last_setup_seconds(device, results)
    refused = {t.label: why for t in TIERS if (why := refusal(t, label, device, commit, results))}
    allowed = tuple(t for t in TIERS if t.label not in refused)
    costs = measured_costs(device, results)
    return setup, refused, simulate(queue(label, results, allowed), costs, seconds - setup - MARGIN_S, slots)


def print_plan(seconds: float, label: str, device: str, slots: int, results: Path = RESULTS) -> None:
    setup, refused, plan = lease_plan(seconds, label, device, slots, COMMIT, results)
    print(
        f"lease of {seconds:.0f} s on {device} (batches cpu_{label}...), pinned commit {COMMIT}: "
        f"setup {setup:.0f} s, then {slots} runs at a time"
    )
    for tier, why in refused.items():
        print(f"({tier}) REFUSED: {why}")
    for start, run in plan:
        cost = (
            "unmeasured here: runs as its own measurement" if run.cost is None else f"about {run.cost:.0f} s"
        )
        print(f"  +{setup + start:4.0f} s  ({run.tier.label}) {run.name}  {cost}")
    if not plan:
        print("  nothing fits")


# --------------------------------------------------------------------------------------------
# Here, before and after a lease


def carry(
    commit: str = COMMIT, repo: Path = REPO, data_root: Path | None = None, folder: Path = CARRY
) -> Path:
    """``.lease/``: a git bundle of the pinned commit and the tiers' corpora (git-ignored; the call carries it)."""
    from ode_transformer.train.data import data_root as default_root

    folder.mkdir(exist_ok=True)
    full = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run(["git", "-C", str(repo), "update-ref", "refs/lease/pinned", full], check=True)
    try:
        subprocess.run(
            [
                "git",
                "-C",
                str(repo),
                "bundle",
                "create",
                "-q",
                str(folder / "pinned.bundle"),
                "refs/lease/pinned",
            ],
            check=True,
        )
    finally:
        subprocess.run(["git", "-C", str(repo), "update-ref", "-d", "refs/lease/pinned"], check=True)
    (folder / "commit").write_text(full + "\n")
    source = (data_root or default_root()).resolve()
    for corpus in CORPORA:
        if (source / corpus).is_dir():
            shutil.copytree(source / corpus, folder / "data" / corpus, dirs_exist_ok=True)
    return folder


def collect(files: Path, results: Path = RESULTS) -> list[Path]:
    """Unpack a lease's ``lease.tgz`` (from ``files``): new result files into ``results``, never over one there, and
    the lease's record and logs into ``results/leases/<its start>/``; returns the result files added. Every file is
    written whole or not at all, and a ``gates.json`` is merged into the one there under a lock (two collects at
    once keep both). Nothing is written where the archive is damaged, or where its runs would mix into a batch of
    another commit, device or precision, or sit in another batch than their own.

    Raises:
        RecordError: the archive, or a file in it, is damaged, or its runs do not belong where they would go (one
            line, the files named).
    """
    archive = files / "lease.tgz"
    with tempfile.TemporaryDirectory() as tmp:
        unpacked = Path(tmp)
        unpack(archive, unpacked)
        lease = read_lease_record(unpacked / "lease.json", f"{archive}'s lease.json")
        incoming = {
            source.relative_to(unpacked): read_record(source, f"{archive}'s {source.relative_to(unpacked)}")
            for source in sorted((unpacked / "results").glob("*/*/*-seed*.json"))
        }
        refuse_foreign_runs(archive, lease, incoming, results)
        added = []
        for name in incoming:
            target = results / name.relative_to("results")
            if not target.exists():
                _write(target, (unpacked / name).read_bytes())
                added.append(target)
        for source in sorted((unpacked / "results").glob("*/*/diagnostics/gates.json")):
            shown = f"{archive}'s {source.relative_to(unpacked)}"
            merge_json(results / source.relative_to(unpacked / "results"), _json_object(source, shown), True)
        record = results / "leases" / lease["started"].replace(":", "")
        _write(record / "lease.json", (unpacked / "lease.json").read_bytes())
        for log in sorted((unpacked / "logs").glob("*.log")):
            _write(record / log.name, log.read_bytes())
    return added


def unpack(archive: Path, into: Path) -> None:
    """Extract a lease's archive into ``into``.

    Raises:
        RecordError: no such archive, or a truncated or damaged one (named, with the fix).
    """
    if not archive.is_file():
        raise RecordError(
            f"no {archive}: give the folder the device tool returned the lease's files in (files_at)"
        )
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise RecordError(
            f"{archive} is truncated or damaged ({_first_line(error)}): fetch the lease's files again; a "
            "lease rewrites it whole after every run, so the last one it returned is complete"
        ) from None
    if not (into / "lease.json").is_file():
        raise RecordError(
            f"{archive} holds no lease.json, so it is not a lease's archive: give the lease's own"
        )


def refuse_foreign_runs(
    archive: Path, lease: dict[str, Any], incoming: dict[Path, dict[str, Any]], results: Path
) -> None:
    """Refuse a lease's runs (``incoming``: each record by its path in the archive) that do not belong where they
    would go: a run of another commit or device than the lease's, in another batch than its folder's, or one that
    would make its batch folder mix commits, devices or precisions.

    Raises:
        RecordError: the first such run or folder (the files named, and the fix).
    """
    by_folder: dict[Path, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for name, record in incoming.items():
        device = (record.get("device") or {}).get("name")
        if not _same_commit(record, lease.get("commit") or "") or device != lease.get("device"):
            commit = ((record.get("git") or {}).get("commit") or "none")[:7]
            raise RecordError(
                f"{archive}'s {name} is a run of commit {commit} on {device}, not of the lease's commit "
                f"{(lease.get('commit') or 'none')[:7]} on {lease.get('device')}: the archive is not one lease's; "
                "collect nothing from it, and fetch the lease's own files"
            )
        folder = batch_folder(record.get("size") or "cpu", record.get("batch"))
        if folder != name.parent.name:
            raise RecordError(
                f"{archive}'s {name} is a run of batch {folder}, not of the folder it would go into: collect nothing "
                "from it; the run belongs in its own batch's folder"
            )
        by_folder[results / name.parent.relative_to("results")].append((str(name), record))
    for folder, named in by_folder.items():
        there = load_results(folder, mixed=True) if folder.is_dir() else []
        existing = [(str(path), r) for path, r in zip(record_files(folder), there)]
        if what := mixing(existing + named):
            raise RecordError(
                f"{archive}'s runs would make {folder} mix {what}: one batch is one commit, one device and one "
                "precision, so nothing was collected; run the lease with another --label (a batch of its own), or "
                "pin the batch's commit"
            )


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0].rstrip(":") if str(error) else type(error).__name__


def _write(path: Path, data: bytes) -> None:
    """Write a collected file whole or not at all (the project's atomic writer), its folder created."""
    from ode_transformer.files import write_atomic  # not at import: the lease runs on a bare Python

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


def _json_object(path: Path, shown: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        value = None
    if not isinstance(value, dict):
        raise RecordError(
            f"{shown} is not a JSON object: the archive is damaged; fetch the lease's files again"
        )
    return value


# --------------------------------------------------------------------------------------------
# There: the lease


@dataclass
class Lease:
    """One lease's state: its runs (each a process group) and its record."""

    out: Path
    work: Path
    started: str
    device: str
    label: str
    commit: str
    slots: int
    record: list[dict[str, Any]] = field(default_factory=list)
    setup_s: float | None = None

    def pack(self) -> None:
        """Rewrite ``$OUT/lease.tgz`` with every new result, log and the record: written aside, then renamed, so a
        kill at any moment leaves the last complete archive."""
        (self.work / "lease.json").write_text(
            json.dumps(
                {
                    "started": self.started,
                    "device": self.device,
                    "label": self.label,
                    "commit": self.commit,
                    "slots": self.slots,
                    "setup_s": self.setup_s,
                    "runs": self.record,
                },
                indent=1,
            )
            + "\n"
        )
        partial = self.out / "lease.tgz.partial"
        with tarfile.open(partial, "w:gz") as archive:
            archive.add(self.work / "lease.json", "lease.json")
            if (self.work / "results").is_dir():
                archive.add(self.work / "results", "results")
            for log in sorted((self.work / "runs").rglob("*.log")):
                archive.add(log, f"logs/{log.name}")
        os.replace(partial, self.out / "lease.tgz")


def pinned_tree(bundle: Path, commit: str, where: Path) -> Path:
    """The pinned commit checked out from the carried bundle (a real checkout: runs record its commit)."""
    subprocess.run(["git", "init", "-q", str(where)], check=True)
    subprocess.run(["git", "-C", str(where), "fetch", "-q", str(bundle), "refs/lease/pinned"], check=True)
    subprocess.run(["git", "-C", str(where), "checkout", "-q", "--detach", commit], check=True)
    return where


def install(tree: Path, venv: Path, wheels: Path) -> Path:
    """A venv over the machine's Python (its CUDA torch) with the carried wheels and the pinned tree, editable (the
    tools' import name exists only through an install); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    # the packages the machine's Python lacks (benchmarks/README.md)
    if carried := sorted(wheels.glob("*.whl")):
        subprocess.run([*pip, "--no-compile", *map(str, carried)], check=True)
    subprocess.run([*pip, "--no-build-isolation", "-e", str(tree)], check=True)
    return venv / "bin" / "python"


def gpu_name() -> str:
    query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    return subprocess.run(query, capture_output=True, text=True, check=True).stdout.splitlines()[0].strip()


def card_label(name: str) -> str:
    """``NVIDIA H200`` -> ``h200``: the batch label of a card."""
    words = [word for word in name.split() if any(c.isdigit() for c in word)]
    return "".join(c for c in (words[0] if words else "gpu").lower() if c.isalnum())


def steps_reached(work: Path) -> int:
    """The last checkpoint's update in a run's work folder (0 without one)."""
    steps = [int(p.name.split("-")[1]) for p in work.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
    return max(steps, default=0)


def run_lease(
    seconds: float,
    out: Path,
    tree: Path,
    python: Path,
    device: str,
    label: str,
    commit: str,
    results: Path = RESULTS,
    slots: int = SLOTS,
    tiers: tuple[Tier, ...] = TIERS,
    run_device: str = "cuda",
    env: dict[str, str] | None = None,
    started_at: float | None = None,
    setup_s: float | None = None,
) -> Lease:
    """Run the tiers' unfinished runs from ``tree`` (the pinned code) until ``seconds`` after ``started_at``."""
    start = started_at or time.monotonic()
    deadline = start + seconds - MARGIN_S
    work = Path(tempfile.mkdtemp(prefix="lease-"))
    lease = Lease(out, work, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), device, label, commit, slots)
    lease.setup_s = setup_s
    allowed = []
    for tier in tiers:
        if why := refusal(tier, label, device, commit, results):
            print(f"({tier.label}) REFUSED: {why}", flush=True)
        else:
            allowed.append(tier)
    costs = measured_costs(device, results)
    waiting = queue(label, results, tuple(allowed))
    running: dict[subprocess.Popen, tuple[Planned, dict[str, Any]]] = {}
    lease.pack()
    # the device tool ends a call past its limit with SIGTERM: stop the runs and pack what finished, as at the deadline
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        while waiting or running:
            while len(running) < slots and waiting:
                chosen = choose(waiting, costs, deadline - time.monotonic(), deadline - start)
                if chosen is None:
                    break
                waiting.remove((chosen.tier, chosen.variant, chosen.seed))
                process = _start(chosen, label, tree, python, work, run_device, env)
                running[process] = (chosen, _entry(chosen, start))
                print(
                    f"{time.monotonic() - start:5.0f} s start ({chosen.tier.label}) {chosen.name}", flush=True
                )
            if not running:
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(1.0)
            for process in [p for p in running if p.poll() is not None]:
                planned, entry = running.pop(process)
                _finish(entry, planned, process.returncode, start, work)
                if entry["status"] == "done":
                    costs.seconds.setdefault(planned.key, []).append(entry["wall_s"])
                lease.record.append(entry)
                print(f"{time.monotonic() - start:5.0f} s {entry['status']} {planned.name}", flush=True)
                lease.pack()
    finally:
        for process, (planned, entry) in running.items():
            _stop(process)
            _finish(entry, planned, None, start, work)
            lease.record.append(entry)
        lease.pack()
    return lease


def nothing_to_run(
    seconds: float, label: str, device: str, slots: int, results: Path = RESULTS
) -> str | None:
    """Why a lease of ``seconds`` would start no run (every run done or refused, or none fitting the budget after
    the setup), or None."""
    setup, refused, plan = lease_plan(seconds, label, device, slots, COMMIT, results)
    if plan:
        return None
    if not queue(label, results, tuple(t for t in TIERS if t.label not in refused)):
        return f"no run to do on {device} (batches cpu_{label}...): every tier's runs are done or refused"
    return (
        f"nothing fits a lease of {seconds:.0f} s on {device}: its setup takes about {setup:.0f} s and the last pack "
        f"{MARGIN_S:.0f} s, and no waiting run fits what is left; not cloning or installing. Give it more seconds "
        f"(`python -m experiments.lease plan SECONDS --device '{device}'` shows what a lease would run)"
    )


def _entry(run: Planned, start: float) -> dict[str, Any]:
    return {
        "tier": run.tier.label,
        "study": run.tier.study,
        "variant": run.variant,
        "seed": run.seed,
        "estimate_s": run.cost,
        "start_s": round(time.monotonic() - start, 1),
        "started_unix": time.time(),
    }


def _start(
    run: Planned, label: str, tree: Path, python: Path, work: Path, device: str, env: dict | None
) -> subprocess.Popen:
    command = [
        str(python),
        "-m",
        "experiments.run",
        run.tier.study,
        "--device",
        device,
        "--batch",
        run.tier.batch(label),
        "--seeds",
        str(run.seed),
        "--only",
        run.variant,
        "--parallel",
        "1",
        "--threads",
        str(THREADS),
        "--results",
        str(work / "results"),
        "--work-dir",
        str(work / "runs"),
    ]
    log = (work / "runs").joinpath("lease-" + run.name.replace("/", "-") + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        return subprocess.Popen(
            command,
            cwd=tree,
            env={**os.environ, **(env or {})},
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _finish(entry: dict[str, Any], run: Planned, code: int | None, start: float, work: Path) -> None:
    entry["end_s"] = round(time.monotonic() - start, 1)
    entry["wall_s"] = round(entry["end_s"] - entry["start_s"], 1)
    entry["status"] = (
        "done" if code == 0 else "stopped at the deadline" if code is None else f"failed ({code})"
    )
    if code != 0:  # how far it got: a stopped run's progress is a cost measurement
        folder = next((work / "runs").glob(f"{run.tier.study}/*/{run.variant}-*-seed{run.seed}"), None)
        if folder is not None and (steps := steps_reached(folder)):
            last = max(folder.glob("checkpoint-*"), key=lambda p: p.stat().st_mtime)
            entry["steps"] = steps
            entry["progress_s"] = round(last.stat().st_mtime - entry["started_unix"], 1)


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


@refuse_bad_records("python -m experiments.lease")  # a damaged archive or record: one line, not a trace
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.lease", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("carry", help="here: .lease/ (a bundle of the pinned commit, the corpora)")
    plan = sub.add_parser("plan", help="here: the plan of a lease, from measured costs (no GPU needed)")
    plan.add_argument("seconds", type=float)
    plan.add_argument("--device", default="NVIDIA H200", help="the GPU's name, as results record it")
    plan.add_argument("--label", help="the batches' device label (default: from the name, e.g. h200)")
    plan.add_argument("--slots", type=int, default=SLOTS)
    run = sub.add_parser("run", help="there: run the plan until SECONDS have passed")
    run.add_argument("seconds", type=float)
    run.add_argument("--label")
    run.add_argument("--slots", type=int, default=SLOTS)
    gather = sub.add_parser("collect", help="here: the runs of a lease's lease.tgz into results/")
    gather.add_argument("files", type=Path, help="the folder the device tool returned the files in")
    args = parser.parse_args(argv)
    if args.verb == "carry":
        print(f"wrote {carry()}: carry it with .whl (benchmarks/README.md)")
    elif args.verb == "plan":
        print_plan(args.seconds, args.label or card_label(args.device), args.device, args.slots)
    elif args.verb == "collect":
        for path in collect(args.files):
            print(f"added {path.relative_to(REPO)}")
        print("now: python -m experiments.verdict --write, the studies' reports, and commit")
    else:
        started = time.monotonic()
        out = Path(os.environ["OUT"])
        device = gpu_name()
        label = args.label or card_label(device)
        # before minutes of clone and install
        if why := nothing_to_run(args.seconds, label, device, args.slots):
            print(f"python -m experiments.lease run: {why}", file=sys.stderr)
            return 1
        commit = (CARRY / "commit").read_text().strip()
        tree = pinned_tree(CARRY / "pinned.bundle", commit, Path(tempfile.mkdtemp()) / "pinned")
        python = install(tree, Path(tempfile.mkdtemp()) / "venv", REPO / ".whl")
        env = {
            "ODE_DATA_DIR": str(CARRY / "data"),
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        }
        run_lease(
            args.seconds,
            out,
            tree,
            python,
            device,
            label,
            commit,
            slots=args.slots,
            env=env,
            started_at=started,
            setup_s=round(time.monotonic() - started, 1),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
