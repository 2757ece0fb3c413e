"""experiments/lease.py: a GPU lease that runs the verdict's tiers from a pinned commit, keeps every finished run
when it is cut off, and continues the same batches after main has moved on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from experiments import lease, verdict
from experiments.studies import STUDIES
from experiments.verdict import Tier

# A stand-in for the pinned commit's experiments.run: it records the code it is (CODE) and the commit it runs from,
# and a run whose variant has a file under $BLOCK_DIR waits until the file goes (a run the lease's end stops).
FAKE_RUN = """
import argparse, json, os, pathlib, subprocess, time
parser = argparse.ArgumentParser()
parser.add_argument("study")
for flag in ("--device", "--batch", "--parallel", "--threads", "--results", "--work-dir"):
    parser.add_argument(flag)
parser.add_argument("--seeds", type=int, nargs="+")
parser.add_argument("--only", nargs="+")
args = parser.parse_args()
while (pathlib.Path(os.environ["BLOCK_DIR"]) / args.only[0]).exists():
    time.sleep(0.05)
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
folder = pathlib.Path(args.results) / args.study / f"cpu_{args.batch}"
folder.mkdir(parents=True, exist_ok=True)
record = {
    "study": args.study, "size": "cpu", "batch": args.batch, "variant": args.only[0], "depth": 1,
    "seed": args.seeds[0], "steps": 10, "wall_time_s": 1.0, "metrics": {}, "code": CODE,
    "git": {"commit": commit}, "device": {"name": os.environ["FAKE_DEVICE"]},
}
(folder / f"{args.only[0]}-1-seed{args.seeds[0]}.json").write_text(json.dumps(record))
"""
TIERS = (Tier("a", "toy", "a toy tier", ("quick", "slow"), (0, 1)),)
DEVICE = "Toy GPU"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def project(tmp_path):
    """A repository whose pinned commit runs CODE = "pinned"; main has moved on to CODE = "later" since."""
    repo = tmp_path / "repo"
    (repo / "experiments").mkdir(parents=True)
    (repo / "experiments" / "__init__.py").write_text("")
    run = repo / "experiments" / "run.py"
    run.write_text('CODE = "pinned"\n' + FAKE_RUN)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "pinned")
    pinned = git(repo, "rev-parse", "HEAD")
    run.write_text('CODE = "later"\n' + FAKE_RUN)
    git(repo, "commit", "-qam", "main moves on")
    return repo, pinned


def archive_members(out: Path) -> dict[str, bytes]:
    with tarfile.open(out / "lease.tgz") as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}


def start_lease(tree: Path, out: Path, results: Path, block: Path, commit: str) -> subprocess.Popen:
    """The lease in its own process, as the device tool runs it (the pinned tree's code, this interpreter)."""
    driver = textwrap.dedent(f"""
        from pathlib import Path
        from experiments import lease
        from experiments.verdict import Tier
        tiers = (Tier("a", "toy", "a toy tier", ("quick", "slow"), (0, 1)),)
        lease.run_lease(600, Path({str(out)!r}), Path({str(tree)!r}), Path({sys.executable!r}), {DEVICE!r}, "toy",
                        {commit!r}, results=Path({str(results)!r}), slots=4, tiers=tiers, run_device="cpu",
                        env={{"FAKE_DEVICE": {DEVICE!r}, "BLOCK_DIR": {str(block)!r}}})
    """)
    return subprocess.Popen([sys.executable, "-c", driver], cwd=lease.REPO, start_new_session=True)


def wait_for(condition, what: str, seconds: float = 120) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_lease_cut_off_keeps_its_finished_runs_and_the_next_continues_at_the_pinned_commit(
    project, tmp_path
):
    repo, pinned = project
    carried = lease.carry(pinned, repo, data_root=tmp_path / "no-data", folder=tmp_path / ".lease")
    assert (carried / "commit").read_text().strip() == pinned
    results, block = tmp_path / "results", tmp_path / "block"
    block.mkdir()
    (block / "slow").touch()  # the slow runs are still training when the lease ends

    # First lease: a fresh machine clones the pinned commit; the call is cut off (SIGTERM) mid-step.
    first = tmp_path / "out1"
    first.mkdir()
    tree = lease.pinned_tree(carried / "pinned.bundle", pinned, tmp_path / "machine1" / "pinned")
    process = start_lease(tree, first, results, block, pinned)
    finished = {"results/toy/cpu_toy/quick-1-seed0.json", "results/toy/cpu_toy/quick-1-seed1.json"}
    try:
        wait_for(
            lambda: (first / "lease.tgz").exists() and finished <= set(archive_members(first)), "quick runs"
        )
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    members = archive_members(first)
    assert finished <= set(members) and not any(
        "slow-1" in name for name in members if name.endswith(".json")
    )
    record = json.loads(members["lease.json"])
    assert {(r["variant"], r["status"]) for r in record["runs"]} == {
        ("quick", "done"),
        ("slow", "stopped at the deadline"),
    } and len(record["runs"]) == 4
    for name in finished:
        run = json.loads(members[name])
        assert run["code"] == "pinned" and run["git"]["commit"] == pinned

    # Here: the finished runs go into results/; the stopped ones are not there.
    added = lease.collect(first, results)
    assert sorted(p.name for p in added) == ["quick-1-seed0.json", "quick-1-seed1.json"]
    assert (results / "leases" / record["started"].replace(":", "") / "lease.json").is_file()

    # Next lease, another fresh machine, main still moved on: only the unfinished runs, with the pinned code.
    (block / "slow").unlink()
    second = tmp_path / "out2"
    second.mkdir()
    tree = lease.pinned_tree(carried / "pinned.bundle", pinned, tmp_path / "machine2" / "pinned")
    process = start_lease(tree, second, results, block, pinned)
    assert process.wait(timeout=120) == 0
    members = archive_members(second)
    runs = {name for name in members if name.startswith("results/") and name.endswith(".json")}
    assert runs == {"results/toy/cpu_toy/slow-1-seed0.json", "results/toy/cpu_toy/slow-1-seed1.json"}
    for name in runs:
        run = json.loads(members[name])
        assert run["code"] == "pinned" and run["git"]["commit"] == pinned
    assert len(lease.collect(second, results)) == 2
    assert lease.queue("toy", results, TIERS) == []  # the batch is complete


def record(folder: Path, variant: str, seed: int, commit: str, device: str, wall: float = 100.0) -> None:
    study = STUDIES.get(folder.parent.name)
    metrics = (
        {m.name: 100.0 for m in study.metrics if not m.per_word_of} if study else {}
    )  # each one a run records
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{variant}-1-seed{seed}.json").write_text(
        json.dumps(
            {"study": folder.parent.name, "variant": variant, "seed": seed, "steps": 1000, "wall_time_s": wall,
             "git": {"commit": commit}, "device": {"name": device}, "metrics": metrics}
        )
    )  # fmt: skip


def test_a_batch_of_another_commit_or_device_is_refused_by_name(tmp_path):
    tier = TIERS[0]
    assert lease.refusal(tier, "toy", DEVICE, "abc1234", tmp_path) is None  # an empty batch takes any
    record(tier.folder("toy", tmp_path), "quick", 0, "abc1234ffff", DEVICE)
    assert lease.refusal(tier, "toy", DEVICE, "abc1234", tmp_path) is None
    why = lease.refusal(tier, "toy", DEVICE, "def5678", tmp_path)
    assert "commit abc1234" in why and "another --label" in why
    assert "device Toy GPU" in lease.refusal(tier, "toy", "Other GPU", "abc1234", tmp_path)


PINNED = "abc1234" + "f" * 33


def lease_archive(out: Path, runs: dict[str, dict], commit: str = PINNED, gates: dict | None = None) -> Path:
    """A lease's lease.tgz as `run_lease` packs it: its record, the runs' results (by path under results/), a gates
    file and a log."""
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "lease.tgz", "w:gz") as archive:

        def add(name: str, data: bytes) -> None:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            archive.addfile(member, __import__("io").BytesIO(data))

        lease_record = {"started": "2026-12-01T00:00:00Z", "device": DEVICE, "label": "toy", "commit": commit,
                        "runs": []}  # fmt: skip
        add("lease.json", json.dumps(lease_record).encode())
        for name, run in runs.items():
            add(f"results/{name}", json.dumps(run).encode())
        if gates is not None:
            add("results/toy/cpu_toy/diagnostics/gates.json", json.dumps(gates).encode())
        add("logs/lease-toy-quick-seed0.log", b"trained\n")
    return out


def toy_run(variant: str, seed: int, commit: str = PINNED, device: str = DEVICE, batch: str = "toy") -> dict:
    return {"study": "toy", "size": "cpu", "batch": batch, "variant": variant, "depth": 1, "seed": seed,
            "steps": 10, "wall_time_s": 1.0, "metrics": {}, "git": {"commit": commit}, "device": {"name": device}}  # fmt: skip


def test_collect_adds_runs_whole_and_merges_gates_under_its_lock(tmp_path):
    """A lease's runs go into their batch, written whole (no temporary file left), never over one there; its gates
    rows are merged into the batch's gates.json (the rows there kept), and its record and log are kept."""
    results = tmp_path / "results"
    gates = results / "toy" / "cpu_toy" / "diagnostics" / "gates.json"
    gates.parent.mkdir(parents=True)
    gates.write_text(json.dumps({"quick-1-seed9": ["there"]}))
    files = lease_archive(tmp_path / "out", {"toy/cpu_toy/quick-1-seed0.json": toy_run("quick", 0)},
                          gates={"quick-1-seed0": ["new"], "quick-1-seed9": ["the lease's"]})  # fmt: skip
    assert lease.collect(files, results) == [results / "toy" / "cpu_toy" / "quick-1-seed0.json"]
    assert json.loads(gates.read_text()) == {"quick-1-seed0": ["new"], "quick-1-seed9": ["there"]}
    record = results / "leases" / "2026-12-01T000000Z"
    assert sorted(p.name for p in record.iterdir()) == ["lease-toy-quick-seed0.log", "lease.json"]
    assert sorted(p.name for p in (results / "toy" / "cpu_toy").iterdir()) == [
        "diagnostics",
        "quick-1-seed0.json",
    ]
    assert sorted(p.name for p in gates.parent.iterdir()) == ["gates.json"]  # no lock or temporary file left


@pytest.mark.parametrize(
    ("runs", "said"),
    [
        (
            {"toy/cpu_toy/quick-1-seed1.json": toy_run("quick", 1, commit="def5678" + "0" * 33)},
            "toy/cpu_toy/quick-1-seed1.json is a run of commit def5678 on Toy GPU, not of the lease's commit abc1234",
        ),
        (
            {"toy/cpu_toy/quick-1-seed1.json": toy_run("quick", 1, device="Other GPU")},
            "is a run of commit abc1234 on Other GPU, not of the lease's commit abc1234 on Toy GPU",
        ),
        (
            {"toy/cpu_toy/quick-1-seed1.json": toy_run("quick", 1, batch="h200")},
            "toy/cpu_toy/quick-1-seed1.json is a run of batch cpu_h200, not of the folder it would go into",
        ),
    ],
    ids=["commit", "device", "batch"],
)
def test_collect_refuses_a_run_of_another_commit_device_or_batch(tmp_path, runs, said):
    results = tmp_path / "results"
    files = lease_archive(tmp_path / "out", runs)
    with pytest.raises(lease.RecordError, match="collect nothing") as refused:
        lease.collect(files, results)
    assert str(refused.value).startswith(f"{files / 'lease.tgz'}'s results/") and said in str(refused.value)
    assert not results.exists()  # nothing written


def test_collect_refuses_a_lease_that_would_mix_its_batch(tmp_path):
    """A batch holding runs of another commit (or device) takes none of this lease's: one line naming the folder,
    the files of each side and the fix, and nothing written (before, the whole tier was refused from then
    on, until someone found the file)."""
    results = tmp_path / "results"
    record(results / "toy" / "cpu_toy", "quick", 0, "0ld0ld0" + "0" * 33, DEVICE)
    files = lease_archive(tmp_path / "out", {"toy/cpu_toy/quick-1-seed1.json": toy_run("quick", 1)})
    with pytest.raises(lease.RecordError) as refused:
        lease.collect(files, results)
    message = str(refused.value)
    folder = results / "toy" / "cpu_toy"
    assert f"would make {folder} mix commit 0ld0ld0 ({folder / 'quick-1-seed0.json'}) / abc1234" in message
    assert "results/toy/cpu_toy/quick-1-seed1.json" in message and "another --label" in message
    assert sorted(p.name for p in (results / "toy" / "cpu_toy").iterdir()) == ["quick-1-seed0.json"]
    assert not (results / "leases").exists()


@pytest.mark.parametrize("damage", ["truncated", "not an archive", "missing"])
def test_a_damaged_lease_archive_is_named_in_one_line(tmp_path, refused, damage):
    files = lease_archive(tmp_path / "out", {"toy/cpu_toy/quick-1-seed0.json": toy_run("quick", 0)})
    archive = files / "lease.tgz"
    if damage == "truncated":
        archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    elif damage == "not an archive":
        archive.write_bytes(b"<html>502 Bad Gateway</html>")
    else:
        archive.unlink()
    error = refused(lease.main, ["collect", str(files)])
    assert error.startswith("python -m experiments.lease: error: ") and error.count("\n") == 1, error
    assert str(archive) in error and ("fetch the lease's files again" in error or "files_at" in error), error


def test_a_lease_whose_budget_fits_no_run_says_so_before_its_clone(monkeypatch, capsys):
    """`lease run` with a budget below its setup: one line saying nothing fits, exit 1, and no clone or install
    (before, it cloned and installed, then exited 0 without a word)."""

    def never(*args):
        raise AssertionError("cloned or installed")

    monkeypatch.setenv("OUT", "/nonexistent")
    monkeypatch.setattr(lease, "gpu_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(lease, "pinned_tree", never)
    monkeypatch.setattr(lease, "install", never)
    assert lease.main(["run", "60"]) == 1
    error = capsys.readouterr().err
    assert error.startswith(
        "python -m experiments.lease run: nothing fits a lease of 60 s on NVIDIA H200"
    ) and ("not cloning or installing" in error)


def test_the_plan_fits_the_lease_in_priority_order_with_measured_costs(tmp_path):
    """Measured runs start only where their cost fits; unmeasured ones start first, once, as their own measurement;
    higher tiers come first, and a smaller lower-tier run fills a slot a larger one could not."""
    tiers = (
        Tier("a", "big", "", ("residual", "rk4"), (0,)),
        Tier("b", "small", "", ("residual",), (0, 1, 2, 3)),
        Tier("c", "new", "", ("x",), (0,)),
    )
    costs = lease.Costs()
    costs.seconds = {
        ("big", "residual"): [300.0],
        ("big", "rk4"): [700.0],
        ("small", "residual"): [150.0, 250.0],
    }
    waiting = [(t, v, s) for t in tiers for v, s in t.pending([])]
    plan = lease.simulate(waiting, costs, 600, slots=2)
    names = [(start, run.name) for start, run in plan]
    assert names == [
        (0.0, "big/residual-seed0"),  # rk4's cost never fits the lease
        (0.0, "small/residual-seed0"),  # median of 150 and 250
        (200.0, "small/residual-seed1"),
        (300.0, "small/residual-seed2"),
        (400.0, "small/residual-seed3"),
    ]
    assert all(start + run.cost <= 600 for start, run in plan)
    # nothing measured: the top tier's runs start at once, as their own measurement
    fresh = lease.simulate(waiting, lease.Costs(), 600, slots=2)
    assert [(start, run.name, run.cost) for start, run in fresh] == [
        (0.0, "big/residual-seed0", None),
        (0.0, "big/rk4-seed0", None),
    ]


def test_a_stopped_runs_progress_is_a_cost_for_the_next_plan(tmp_path):
    record(
        tmp_path / "ptb_paper" / "cpu_amx", "rk4", 0, "abc", "Intel Xeon", wall=9000
    )  # its updates, elsewhere
    lease_folder = tmp_path / "leases" / "2026-11-28T000000Z"
    lease_folder.mkdir(parents=True)
    (lease_folder / "lease.json").write_text(
        json.dumps(
            {"device": DEVICE, "setup_s": 80.0, "runs": [
                {"study": "ptb_paper", "variant": "rk4", "seed": 0, "status": "stopped at the deadline",
                 "steps": 250, "progress_s": 100.0},
            ]}
        )
    )  # fmt: skip
    costs = lease.measured_costs(DEVICE, tmp_path)
    assert costs.estimate(("ptb_paper", "rk4")) == pytest.approx(100.0 / 250 * 1000)
    assert costs.estimate(("ptb_paper", "residual")) is None
    assert lease.last_setup_seconds(DEVICE, tmp_path) == 80.0


def test_card_labels_and_the_dry_run_command(capsys):
    assert lease.card_label("NVIDIA H200") == "h200" and lease.card_label("NVIDIA H100 80GB HBM3") == "h100"
    assert lease.main(["plan", "600", "--device", "NVIDIA H200"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("lease of 600 s on NVIDIA H200")
    first_tier = [line for line in out[1:] if "(a)" in line]
    assert first_tier and out[1] == first_tier[0]  # the plan starts with tier (a)


def test_verdict_tiers_are_the_issues_priorities():
    assert [t.label for t in verdict.TIERS] == ["a", "b", "c", "d"]
    a, b, c, d = verdict.TIERS
    assert (a.study, set(a.variants), a.seeds) == ("ptb_paper", {"residual", "rk4"}, (0, 1, 2, 3, 4, 5))
    own = [seeds for _, seeds in a.device_seeds]
    assert len({s for seeds in own for s in seeds}) == sum(map(len, own))  # each device kind's seeds its own
    assert b.study == "multi30k_paired" and "rk2_gated" in b.variants and len(b.seeds) == verdict.POWER_SEEDS
    assert set(a.variants) | set(c.variants) == set(STUDIES["ptb_paper"].variants)
    assert d.study == "tatoeba_depth" and d.pending([])  # the probe's first stage


def test_the_verdict_document_is_generated_from_the_committed_results():
    """results/verdict.md (the plan, where each device's batches stand, the pre-registered readings) is what
    `python -m experiments.verdict --write` writes from the committed results: regenerate it after adding runs."""
    assert verdict.DOCUMENT.read_text(encoding="utf-8") == verdict.document()


def test_the_readmes_statement_about_the_default_block_is_what_the_results_show():
    """README: the gate is saturated on all tokens of every block in every committed diagnostic of the default block,
    and its committed comparisons with residual point both ways (one beyond noise each way)."""
    comparisons, gates = verdict.default_block_evidence()
    assert gates and all(g["saturated"] >= 0.995 for g in gates)
    beyond = [c for c in comparisons if "beyond noise" in c["verdict"]]
    signs = {(c["verdict"][0], "lower is better" in c["metric"]) for c in beyond}
    better = {("+", False), ("-", True)}
    assert signs & better and signs - better  # ahead beyond noise somewhere, behind beyond noise somewhere
    readme = (lease.REPO / "README.md").read_text(encoding="utf-8")
    assert "In every committed diagnostic of it the gate is saturated on all tokens of every block" in readme


def test_the_pinned_commit_knows_every_tier_and_flag_the_lease_uses():
    """The lease runs COMMIT's experiments.run: it must know the flags the lease passes and the tiers' variants."""
    shown = subprocess.run(
        ["git", "show", f"{lease.COMMIT}:experiments/run.py", f"{lease.COMMIT}:experiments/studies.py"],
        cwd=lease.REPO, capture_output=True, text=True,
    )  # fmt: skip
    if shown.returncode:
        pytest.skip(f"commit {lease.COMMIT} is not in this clone's history (a shallow clone)")
    for flag in ("--batch", "--results", "--work-dir", "--seeds", "--only", "--threads", "--device"):
        assert f'"{flag}"' in shown.stdout, flag
    for tier in verdict.TIERS:
        for variant in tier.variants:
            assert f'"{variant}"' in shown.stdout, variant
    assert "def tatoeba_variant" in shown.stdout


def test_the_lease_runs_on_a_python_with_the_standard_library_alone():
    """The device's Python has torch and the carried wheels, not necessarily scipy: the lease, its tiers and the depth
    probe's reading import nothing beyond the standard library (scipy only where a document is written here)."""
    probe = (
        f"import sys; sys.path.insert(0, {str(lease.REPO)!r}); import experiments.lease, experiments.depth_gate; "
        "print(sorted(m for m in ('scipy', 'numpy', 'torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def test_a_resumed_runs_wall_time_is_no_cost_but_its_updates_count():
    """`experiments.costs.Costs`, which the lease and the CPU plan share: a resumed run's wall time misses its
    earlier attempts, so only its updates count; a stopped run's seconds per update times the finished runs'
    updates stand in until a run finishes here uninterrupted."""
    from experiments.costs import Costs

    row = ("ptb_paper", "rk4")
    costs = Costs()
    costs.add_result({"study": "ptb_paper", "variant": "rk4", "steps": 100, "epochs": 4, "wall_time_s": 50.0,
                      "resumed": True}, here=True)  # fmt: skip
    assert costs.estimate(row) is None
    costs.add_stopped(row, seconds=30.0, steps=10)
    assert costs.estimate(row) == pytest.approx(3.0 * 100) and costs.per_epoch(row) == pytest.approx(300 / 4)
    costs.add_result({"study": "ptb_paper", "variant": "rk4", "steps": 120, "epochs": 4, "wall_time_s": 200.0},
                     here=True)  # fmt: skip
    assert costs.estimate(row) == 200.0
    costs.add_result(
        {"study": "ptb_paper", "variant": "rk4", "steps": 120, "epochs": 4, "wall_time_s": 900.0}, here=False
    )  # another machine's: its updates only
    assert costs.estimate(row) == 200.0 and costs.steps[row] == [100, 120, 120]
