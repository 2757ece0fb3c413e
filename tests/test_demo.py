"""The demo end to end with a tiny model and a few steps (the real run trains ~15 minutes)."""

from __future__ import annotations

import json
import math

import pytest

from train.demo import main

TINY_MODEL = [
    "--d_model", "32", "--encoder_ffn_dim", "64", "--decoder_ffn_dim", "64", "--encoder_layers", "1",
    "--decoder_layers", "1", "--vocab_size", "1000", "--per_device_eval_batch_size", "32", "--num_beams", "1",
]  # fmt: skip


@pytest.mark.slow
def test_demo_tiny(tmp_path, capsys):
    summary = main(["--output_dir", str(tmp_path), "--max_steps", "6", "--max_test_samples", "24", *TINY_MODEL])
    for key in ("bleu", "chrf", "copy_baseline_bleu", "copy_baseline_chrf"):
        assert math.isfinite(summary[key]) and 0 <= summary[key] <= 100, key
    assert summary["copy_baseline_bleu"] > 0 and summary["steps"] == 6
    assert len(summary["examples"]) == 4
    assert json.loads((tmp_path / "demo_summary.json").read_text())["bleu"] == summary["bleu"]
    assert (tmp_path / "README.md").is_file() and (tmp_path / "loss_curves.png").is_file()
    assert "copy-the-source baseline" in capsys.readouterr().out
