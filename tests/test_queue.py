"""experiments/queue.py: the background lanes that finish a long study from its pinned commit."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from experiments import queue, run
from experiments.report import load_results
from experiments.studies import STUDIES, batch_folder

RESULTS = Path(__file__).resolve().parent.parent / "results"


def lane_runs(lane, study) -> list[tuple[int, str]]:
    """The (seed, variant) runs of a lane; a step without variants runs all of the study's."""
    return [
        (seed, variant)
        for seeds, variants in lane
        for seed in seeds
        for variant in variants or study.variants
    ]


@pytest.mark.parametrize("name", sorted(queue.QUEUES))
def test_lanes_share_no_run_and_cover_what_the_issue_asks(name):
    q = queue.QUEUES[name]
    study = STUDIES[q.study]
    runs = [item for lane in q.lanes for item in lane_runs(lane, study)]
    assert len(runs) == len(set(runs)), "two lanes (or steps) would train the same run"
    if name == "ptb_paper":  # seed 0 of every block, seeds 1-2 of residual and RK4
        wanted = {(0, v) for v in study.variants} | {(s, v) for s in (1, 2) for v in ("residual", "rk4")}
    elif name == "ptb_paper_bf16":  # the Zen 4's seeds of the verdict's tier (a): 3 and 4
        wanted = {(s, v) for s in (3, 4) for v in ("residual", "rk4")}
    elif name == "ptb_paper_amx":  # residual 0-2 and the RK2 rows on them (tier (c)); RK4 1-2, both rows of 5
        wanted = {(s, v) for s in (0, 1, 2) for v in study.variants if v != "rk4"}
        wanted |= {(1, "rk4"), (2, "rk4"), (5, "residual"), (5, "rk4")}
    elif name.startswith("ptb_paper_") or name == "multi30k_upcycle":  # seeds 0-2
        wanted = {(s, v) for s in (0, 1, 2) for v in study.variants}
    else:  # seeds 0-2 of every row then, seeds 3-4 of residual, RK2 and RK4 (the rk2_gated row is the GPU's)
        wanted = {(s, v) for s in (0, 1, 2) for v in study.variants if v != "rk2_gated"}
        wanted |= {(s, v) for s in (3, 4) for v in ("residual", "rk2", "rk4")}
    assert set(runs) == wanted


@pytest.mark.parametrize("name", ["ptb_paper_bf16", "ptb_paper_amx"])
def test_the_cpu_verdict_queue_follows_the_verdicts_tiers(name):
    """The CPU verdict queues train their device kind's seeds of experiments.verdict's tier (a), before any run of
    tier (c), and nothing of tier (a) outside those seeds (a seed counts once in the verdict)."""
    from experiments.verdict import TIERS

    q = queue.QUEUES[name]
    tier_a, tier_c = (t for t in TIERS if t.study == q.study)
    own = {(seed, variant) for variant, seed in tier_a.wanted([], q.batch)}
    later = {(seed, variant) for variant, seed in tier_c.wanted([], q.batch)}
    lanes = [lane_runs(lane, STUDIES[q.study]) for lane in q.lanes]
    runs = [run for lane in lanes for run in lane]
    assert own <= set(runs) and set(runs) <= own | later | {(s, "residual") for s in tier_c.seeds}
    for lane in lanes:
        tiers_in_order = [0 if run in own else 1 for run in lane if run in own or run in later]
        assert tiers_in_order == sorted(tiers_in_order)
    assert (len(q.lanes), q.threads) == (
        1,
        2,
    )  # an RK4 run on one core outlasted a session


@pytest.mark.parametrize("name", sorted(queue.QUEUES))
def test_finished_runs_come_from_the_queues_commit(name):
    """The pinned commit is the one the committed results record: a lane must not train on other code."""
    q = queue.QUEUES[name]
    folder = RESULTS / q.study / batch_folder("cpu", q.batch)
    commits = {result["git"]["commit"] for result in load_results(folder)} if folder.exists() else set()
    assert all(commit.startswith(q.commit) for commit in commits), commits
    assert commits or name in (
        "multi30k_upcycle",
        "ptb_paper_bf16",
        "ptb_paper_amx",
    )  # queued, nothing finished yet


@pytest.mark.parametrize("name", ["ptb_paper", "ptb_paper_bf16", "ptb_paper_amx"])
def test_dry_run_prints_each_lanes_valid_experiments_run_calls(name, tmp_path, capsys):
    assert queue.main([name, "--dry-run", "--tree", str(tmp_path / "tree")]) == 0
    lines = capsys.readouterr().out.splitlines()
    q = queue.QUEUES[name]
    assert lines[0] == f"worktree {tmp_path / 'tree'} at {q.commit}" and len(lines) == 1 + len(q.lanes)
    assert not (tmp_path / "tree").exists()  # a dry run creates nothing
    for line, lane in zip(lines[1:], q.lanes):
        first, *calls = line.split(": ", 1)[1].split("; ")
        assert first == queue.LOW_PRIORITY_SESSION and len(calls) == len(lane)
        for call, (seeds, variants) in zip(calls, lane):
            words = shlex.split(call)
            assert words[:6] == ["nice", "-n", "19", ".venv/bin/python", "-m", "experiments.run"]
            args = run.parse_args(words[6:])  # exits on an unknown study, variant or flag
            assert (args.study, tuple(args.seeds), tuple(args.only)) == (q.study, seeds, variants)
            assert (args.parallel, args.threads) == (1, q.threads)
            assert args.results == RESULTS  # finished runs land in this checkout, whatever the worktree
            assert args.batch == q.batch


def test_worktree_is_made_at_the_pinned_commit_and_a_wrong_one_is_refused(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(queue, "tree_venv", lambda tree, dependencies: made.append((tree, dependencies)))
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str, cwd: Path = repo) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "-q")
    (repo / "f.txt").write_text("pinned\n")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pinned")
    pinned = git("rev-parse", "--short", "HEAD")
    (repo / "f.txt").write_text("later\n")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "later")
    later = git("rev-parse", "HEAD")
    q = queue.Queue(study="ptb_paper", commit=pinned, lanes=(), worktree="tree")
    with pytest.raises(SystemExit, match="make setup"):  # the lanes' python must exist first
        queue.prepare_worktree(q, tmp_path / "tree", repo)
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "python").touch()
    queue.prepare_worktree(q, tmp_path / "tree", repo)
    assert (tmp_path / "tree" / "f.txt").read_text() == "pinned\n"  # the pinned code, not the newest
    assert made == [(tmp_path / "tree", repo / ".venv")]
    queue.prepare_worktree(q, tmp_path / "tree", repo)  # again: the existing worktree is kept
    git("checkout", "-q", "--detach", later, cwd=tmp_path / "tree")
    with pytest.raises(SystemExit, match=f"not {pinned}"):  # a worktree at other code is refused
        queue.prepare_worktree(q, tmp_path / "tree", repo)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(SystemExit, match="is not a git worktree"):
        queue.prepare_worktree(q, plain, repo)


def test_the_worktrees_venv_runs_the_worktrees_code_not_the_checkouts(tmp_path):
    """The checkout's editable install maps ode_transformer.train to the checkout's train/: a lane that shared its
    venv trained with the newest code, whatever commit its worktree was at."""
    repo = Path(queue.__file__).resolve().parent.parent
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    tree = tmp_path / "tree"
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(tree), "HEAD"], check=True
    )
    try:
        queue.tree_venv(tree, Path(sys.prefix))
        where = subprocess.run(
            [str(tree / ".venv" / "bin" / "python"), "-c",
             "import ode_transformer.train.run as r, ode_transformer.hub.export as c, modeling_ode as m, torch;"
             "print(r.__file__, c.__file__, m.__file__, sep='\\n')"],
            cwd=tmp_path, capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        assert len(where) == 3 and all(Path(path).is_relative_to(tree) for path in where), where
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], check=True)


def test_results_written_in_the_worktree_are_gathered_without_overwriting(tmp_path):
    q = queue.QUEUES["ptb_paper"]
    tree, repo = tmp_path / "tree", tmp_path / "repo"
    made = tree / "results" / q.study / "cpu"
    made.mkdir(parents=True)
    (made / "rk2-1-seed0.json").write_text('{"new": 1}')
    (made / "residual-1-seed0.json").write_text('{"new": 2}')
    (made / "summary.json").write_text("[]")  # a report's file, not a run's
    kept = repo / "results" / q.study / "cpu"
    kept.mkdir(parents=True)
    (kept / "residual-1-seed0.json").write_text('{"committed": 1}')
    assert queue.gather_results(q, tree, repo) == [kept / "rk2-1-seed0.json"]
    assert (kept / "rk2-1-seed0.json").read_text() == '{"new": 1}'
    assert (kept / "residual-1-seed0.json").read_text() == '{"committed": 1}'  # never overwritten
    assert not (kept / "summary.json").exists() and queue.gather_results(q, tree, repo) == []


@pytest.mark.parametrize("name", sorted(queue.QUEUES))
def test_the_pinned_commits_runner_knows_every_flag_the_lanes_pass(name):
    """The lanes run the pinned commit's experiments.run, not this one: a flag added since would fail there."""
    q = queue.QUEUES[name]
    repo = Path(queue.__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{q.commit}:experiments/run.py"], cwd=repo, capture_output=True, text=True
    )
    if source.returncode:
        pytest.skip(f"commit {q.commit} is not in this clone's history (a shallow clone)")
    flags = {
        word for lane in q.lanes for word in shlex.split(queue.lane_command(q, lane)) if word.startswith("--")
    }
    assert flags and all(f'"{flag}"' in source.stdout for flag in flags), flags


def test_a_lane_lowers_its_own_sessions_priority():
    """A lane runs in a session of its own; with autogroup scheduling the kernel shares the CPU between sessions
    before it looks at `nice`, so each lane lowers its session's priority (the study then yields to the tests and
    benchmarks of the session that started it)."""
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("this kernel has no autogroup scheduling: `nice` alone orders the lanes")
    command = queue.lane_command(queue.QUEUES["multi30k_paired"], ())
    assert command.startswith(queue.LOW_PRIORITY_SESSION + "; ")
    shown = subprocess.run(
        ["bash", "-c", f"{queue.LOW_PRIORITY_SESSION}; cat /proc/self/autogroup"],
        capture_output=True, text=True, start_new_session=True, check=True,
    )  # fmt: skip
    assert shown.stdout.rstrip().endswith("nice 19"), shown.stdout


def test_a_queue_refuses_a_cpu_its_batch_did_not_run_on(tmp_path, capsys):
    """A batch is one device: ptb_paper_amx's runs need an Intel Xeon with AMX, so a Zen 4 (no AMX) is refused with
    the reason and the way out, before any worktree is made."""
    q = queue.QUEUES["ptb_paper_amx"]
    xeon = tmp_path / "xeon"
    xeon.write_text(
        "model name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n"
    )
    epyc = tmp_path / "epyc"
    epyc.write_text("model name\t: AMD EPYC\nflags\t\t: fpu avx512f avx512_bf16\n")
    assert queue.wrong_cpu(q, xeon) is None
    why = queue.wrong_cpu(q, epyc)
    assert "this machine is AMD EPYC without amx_bf16" in why and "a batch label of its own" in why
    assert "without" not in queue.wrong_cpu(queue.QUEUES["ptb_paper_bf16"], xeon)
    assert queue.wrong_cpu(queue.QUEUES["ptb_paper_bf16"], epyc) is None
    assert queue.wrong_cpu(queue.QUEUES["multi30k_paired"], epyc) is None  # a queue that names no CPU
    # an AVX2-only EPYC (no native bf16) takes no runs of the Zen 4's bf16 batch, though its model name is the same
    avx2 = tmp_path / "avx2"
    avx2.write_text("model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n")
    assert "AMD EPYC without avx512_bf16" in queue.wrong_cpu(queue.QUEUES["ptb_paper_bf16"], avx2)
    # and no queue trains tier (a) on it: its fp32 runs outlast a session (results/verdict.md)
    assert not any(q.batch == "avx2" for q in queue.QUEUES.values())


def test_a_queue_whose_pinned_commit_is_missing_is_named_with_the_fix(tmp_path):
    """A clone without the queue's commit (a shallow one): the commit named and how to fetch it, not git's
    CalledProcessError from `git worktree add`, and no worktree made."""
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "python").touch()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    q = queue.Queue(study="ptb", commit="0123abc", lanes=(), worktree="exp")
    with pytest.raises(
        SystemExit, match=r"commit 0123abc, which the queue pins, is not in .*git fetch --unshallow"
    ):
        queue.prepare_worktree(q, tmp_path / "exp", repo)
    assert not (tmp_path / "exp").exists()


def test_a_queue_starts_once_while_its_lanes_hold_its_lock(tmp_path):
    """Two starts at once cannot both pass `running()`: each takes the queue's lock first, and the second is refused
    with the pid that holds it. The lanes inherit the lock, so it holds after the start that took it has gone, and
    is free once the last lane ends."""
    first = queue.lock_queue("toy", tmp_path)
    with pytest.raises(SystemExit, match=rf"another run \(pid {os.getpid()}\) is training this: queue toy"):
        queue.lock_queue("toy", tmp_path)
    stop = tmp_path / "stop"  # the lane runs until this file exists: a condition, not a pace
    lane = queue.start_lane(
        f"while [ ! -e {shlex.quote(str(stop))} ]; do sleep 0.05; done",
        tmp_path,
        tmp_path / "lane.log",
        first,
    )
    os.close(first)  # the start is over: only the lane holds the lock now
    try:
        with pytest.raises(SystemExit, match="another run"):
            queue.lock_queue("toy", tmp_path)
    finally:
        stop.touch()
        assert lane.wait(timeout=60) == 0
    os.close(queue.lock_queue("toy", tmp_path))  # free again


def test_a_gated_lane_asks_before_each_step_and_ends_at_the_first_that_does_not_fit(tmp_path):
    """With --until, each step runs its gate first: a step the gate passes runs, and the first it refuses ends the
    lane, so a pair's second run is not traded for another seed's first."""
    q = queue.QUEUES["ptb_paper_bf16"]
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    runner = (
        tmp_path / ".venv" / "bin" / "python"
    )  # stands in for the worktree's experiments.run: logs its seeds
    runner.write_text(f'#!/bin/sh\necho "ran $5 $7" >> {tmp_path / "ran"}\n')
    runner.chmod(0o755)
    gate = tmp_path / "gate"  # refuses RK4 of seed 3, as the plan would where it outlasts the time left
    gate.write_text(f'#!/bin/sh\necho "asked $1" >> {tmp_path / "ran"}\n[ "$1" != "3:rk4" ]\n')
    gate.chmod(0o755)
    command = queue.lane_command(q, q.lanes[0], str(gate))
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True, start_new_session=True)
    assert (tmp_path / "ran").read_text().splitlines() == [
        "asked 3:residual",
        "ran 3 residual",
        "asked 3:rk4",
    ]
    assert queue.parse_step(queue.step_word(((0, 1, 2), ()))) == ((0, 1, 2), ())
    assert queue.parse_step(queue.step_word(((3,), ("residual", "rk4")))) == ((3,), ("residual", "rk4"))


def test_a_step_starts_only_where_the_plan_says_it_ends_in_time(tmp_path):
    """The gate's answer from the committed runs of the batch's device kind at the lane's threads: measured runs
    that fit start, one that does not fit stops the lane, and a row never measured there runs as its measurement."""
    from tests.test_verdict import ZEN4, write_run

    q = queue.QUEUES["ptb_paper_bf16"]
    folder = tmp_path / "ptb_paper" / "cpu_bf16"
    write_run(folder, "residual", 3, 110.0, ZEN4)  # write_run records ten minutes on 2 threads
    assert queue.step_fits(q, ((3,), ("residual",)), 1.0, tmp_path) == (True, "finished already")
    fits, why = queue.step_fits(q, ((4,), ("residual",)), 12.0, tmp_path)
    assert fits and why == "residual seed 4: about 10 min, 12 min left"
    fits, why = queue.step_fits(q, ((3,), ("rk4",)), 500.0, tmp_path)
    assert fits and "runs as its own measurement" in why  # no RK4 run on this kind yet
    write_run(folder, "rk4", 4, 100.0, ZEN4)
    fits, why = queue.step_fits(q, ((3,), ("rk4",)), 8.0, tmp_path)
    assert not fits and why.startswith(
        "rk4 seed 3: about 10 min on AMD EPYC AVX512, bf16 at 2 threads, and 8 min"
    )
    # the same runs at another thread count measure nothing for this queue's lanes
    assert "own measurement" in queue.step_fits(replace(q, threads=1), ((5,), ("rk4",)), 8.0, tmp_path)[1]


def test_an_unfinished_run_is_recorded_as_a_cost_the_plan_reads(tmp_path, monkeypatch):
    """--unfinished: a run's last checkpoint and the time from its start to it become a record the plan turns into
    minutes per run (per update, times the updates the row's finished runs took); a resumed run, whose time has a
    gap, and a run with a committed record give none."""
    from experiments import verdict
    from tests.test_verdict import write_run

    machine = {"device": "cpu", "name": "A CPU of no batch", "capability": "AVX512"}
    monkeypatch.setattr(queue, "device_info", lambda device, threads: {**machine, "threads": threads})
    q = queue.QUEUES["ptb_paper_bf16"]
    runs = tmp_path / "tree" / "runs" / "experiments" / "ptb_paper" / "cpu_bf16"
    results = tmp_path / "results"
    write_run(results / "ptb_paper" / "cpu_amx", "rk4", 1, 100.0)  # a finished RK4 run elsewhere: 100 updates
    started = 1_800_000_000  # the log's clock is the machine's local time
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    for name, starts in (("rk4-1-seed3", 1), ("rk4-1-seed4", 2), ("residual-1-seed3", 1)):
        (runs / name / "checkpoint-20").mkdir(parents=True)
        (runs / name / "checkpoint-40").mkdir()
        os.utime(runs / name / "checkpoint-40", (started + 1200, started + 1200))
        (runs / f"{name}.log").write_text(
            f"{stamp},123 INFO __main__: precision: bf16 (bf16 as asked)\n{{'loss': '7.1'}}\n" * starts
        )
    write_run(results / "ptb_paper" / "cpu_bf16", "residual", 3, 110.0)  # finished: nothing to record
    written = queue.record_unfinished(q, tmp_path / "tree", results)
    assert [path.name for path in written] == ["rk4-1-seed3.json"]  # seed 4 was resumed
    record = json.loads(written[0].read_text())
    assert (record["variant"], record["seed"], record["steps"], record["seconds"]) == ("rk4", 3, 40, 1200.0)
    assert (record["git"]["commit"], record["device"]["threads"]) == (q.commit, 2)
    kind = verdict.stratum(record)
    assert kind == "A CPU of no batch AVX512, bf16"
    row = next(r for r in verdict.minutes_per_run(results) if r["kind"] == kind and r["variant"] == "rk4")
    assert row["minutes"] == pytest.approx(20 / 40 * 100) and row["epoch"] == pytest.approx(20 / 40 * 10)
    assert row["runs"] == "0 (unfinished: 40 updates)" and row["fits"]
    assert verdict.run_minutes(kind, "rk4", 2, results) == pytest.approx(50.0)


def test_until_reads_a_clock_time_and_refuses_one_past(capsys):
    assert queue.until_time("1800000000") == 1_800_000_000.0
    with pytest.raises(argparse.ArgumentTypeError, match="'25:99' is not HH:MM"):
        queue.until_time("25:99")
    with pytest.raises(SystemExit):
        queue.main(["ptb_paper_bf16", "--until", "1000", "--dry-run"])
    assert "--until 00:16 UTC has passed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        queue.main(["multi30k_paired", "--until", "1800000000", "--dry-run"])
    assert "the plan measures ptb_paper's runs only" in capsys.readouterr().err
