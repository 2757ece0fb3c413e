"""Checkpoint averaging against a hand-computed average."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from ode_transformer.train.averaging import average_checkpoints, last_checkpoints, main

STATES = [
    {
        "w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
        "b": torch.tensor([0.5], dtype=torch.bfloat16),
        "n": torch.tensor([7]),
    },
    {
        "w": torch.tensor([[3.0, 2.0], [1.0, 0.0]]),
        "b": torch.tensor([1.5], dtype=torch.bfloat16),
        "n": torch.tensor([7]),
    },
    {
        "w": torch.tensor([[5.0, 8.0], [2.0, 2.0]]),
        "b": torch.tensor([4.0], dtype=torch.bfloat16),
        "n": torch.tensor([7]),
    },
]


def write_run(root, steps=(10, 20, 30), run_id="run-a"):
    """Checkpoints as the trainer leaves them: weights, config, trainer state (written last) and the run id."""
    for step, state in zip(steps, STATES):
        folder = root / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        save_file(state, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(f'{{"step": {step}}}')
        (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
        (folder / "run_id.txt").write_text(run_id + "\n")
    return root


def test_average_matches_hand_computation(tmp_path):
    write_run(tmp_path)
    averaged = average_checkpoints([tmp_path / "checkpoint-20", tmp_path / "checkpoint-30"])
    torch.testing.assert_close(averaged["w"], torch.tensor([[4.0, 5.0], [1.5, 1.0]]))
    assert averaged["b"].dtype == torch.bfloat16 and averaged["b"].item() == pytest.approx(2.75)
    assert torch.equal(averaged["n"], torch.tensor([7]))


def test_last_checkpoints_sorted_by_step(tmp_path):
    write_run(tmp_path, steps=(9, 100, 20))
    assert [p.name for p in last_checkpoints(tmp_path, 2)] == ["checkpoint-20", "checkpoint-100"]


def test_fewer_checkpoints_than_asked_are_named(tmp_path, caplog):
    """`--last 5` over a folder with 3 checkpoints averages the 3 with a warning naming both counts."""
    write_run(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.averaging"):
        assert len(last_checkpoints(tmp_path, 5)) == 3
    assert "holds 3 complete checkpoint(s), fewer than the 5 asked for: averaging 3" in caplog.text


def test_cli_writes_loadable_folder(tmp_path):
    write_run(tmp_path / "run")
    main([str(tmp_path / "run"), "--last", "3", "--out", str(tmp_path / "avg")])
    averaged = load_file(tmp_path / "avg" / "model.safetensors")
    torch.testing.assert_close(averaged["w"], sum(s["w"] for s in STATES) / 3)
    assert (tmp_path / "avg" / "config.json").read_text() == '{"step": 30}'


def test_mismatched_checkpoints_are_refused(tmp_path):
    save_file({"w": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    save_file({"v": torch.zeros(2)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(ValueError, match="different tensors"):
        average_checkpoints([tmp_path / "a.safetensors", tmp_path / "b.safetensors"])


def test_checkpoints_of_two_runs_are_refused(tmp_path):
    """An old run's later checkpoints beside a new run's must not be averaged together."""
    write_run(tmp_path, steps=(10, 20), run_id="new-run")
    write_run(tmp_path, steps=(30,), run_id="old-run")
    with pytest.raises(
        ValueError,
        match=r"different training runs \(checkpoint-10: new-run, checkpoint-20: new-run, checkpoint-30: old-run\)",
    ):
        last_checkpoints(tmp_path, 3)
    with pytest.raises(ValueError, match="different training runs"):
        main([str(tmp_path), "--last", "2", "--out", str(tmp_path / "avg")])
    assert [p.name for p in last_checkpoints(tmp_path, 1)] == ["checkpoint-30"]  # one run's alone are fine


def test_incomplete_checkpoint_is_skipped(tmp_path, caplog):
    write_run(tmp_path)
    (tmp_path / "checkpoint-30" / "trainer_state.json").unlink()  # a save killed before its last file
    with caplog.at_level(logging.WARNING, logger="ode_transformer.checkpoints"):
        assert [p.name for p in last_checkpoints(tmp_path, 2)] == ["checkpoint-10", "checkpoint-20"]
    assert "skipping incomplete checkpoint" in caplog.text and "no trainer_state.json" in caplog.text
