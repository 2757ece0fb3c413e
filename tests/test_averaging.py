"""Checkpoint averaging against a hand-computed average."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from train.averaging import average_checkpoints, last_checkpoints, main

STATES = [
    {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.5], dtype=torch.bfloat16), "n": torch.tensor([7])},
    {"w": torch.tensor([[3.0, 2.0], [1.0, 0.0]]), "b": torch.tensor([1.5], dtype=torch.bfloat16), "n": torch.tensor([7])},
    {"w": torch.tensor([[5.0, 8.0], [2.0, 2.0]]), "b": torch.tensor([4.0], dtype=torch.bfloat16), "n": torch.tensor([7])},
]


def write_run(root, steps=(10, 20, 30)):
    for step, state in zip(steps, STATES):
        folder = root / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        save_file(state, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(f'{{"step": {step}}}')
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
