"""Two CPU processes (gloo) under ``accelerate launch``: disjoint token-budget batches, a few steps; FSDP training.

``accelerate launch --cpu --num_processes 2`` starts a single process unless mpirun is set up
(accelerate's multi-CPU path); ``--multi_gpu --num_processes 2`` on a machine without GPUs starts
two torchrun workers, which accelerate runs as MULTI_CPU with the gloo backend.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
from ode_transformer.train import run as train_run
from ode_transformer.train.trainer import TokenBudgetSeq2SeqTrainer

seen = {}
original = TokenBudgetSeq2SeqTrainer.get_train_dataloader

def record(self):
    loader = original(self)
    seen["batches"] = [list(map(int, b)) for b in loader.batch_sampler]
    seen["rank"], seen["world"] = self.args.process_index, self.args.world_size
    return loader

TokenBudgetSeq2SeqTrainer.get_train_dataloader = record
train_run.main(sys.argv[2:])
with open(f"{sys.argv[1]}/batches-{seen['rank']}.json", "w") as f:
    json.dump(seen, f)
"""


def free_port() -> int:
    """A TCP port nothing listens on now: torchrun's default, 29500, is taken when two launches run at once (the
    two tests of this module on two pytest workers)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_two_processes(script: Path, *args: str) -> subprocess.CompletedProcess:
    """Runs ``script args`` in two CPU processes under ``accelerate launch``; fails the test if it fails."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    command = [
        accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "--main_process_port", str(free_port()), str(script), *args,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


@pytest.mark.slow
@pytest.mark.usefixtures("shared_data")
def test_two_process_cpu_training(tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    result = launch_two_processes(
        script, str(tmp_path),
        "--task", "translation", "--dataset", "multi30k", "--source_lang", "en", "--target_lang", "de",
        "--preset", "tiny", "--vocab_size", "400", "--max_train_samples", "200", "--max_tokens", "512",
        "--max_source_length", "8", "--max_target_length", "32", "--max_steps", "3", "--logging_steps", "1",
        "--use_cpu", "true", "--save_strategy", "no", "--report_to", "none", "--do_predict", "false",
        "--output_dir", str(out), "--disable_tqdm", "true",
    )  # fmt: skip
    ranks = [json.loads((tmp_path / f"batches-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    batches0, batches1 = ranks[0]["batches"], ranks[1]["batches"]
    assert len(batches0) == len(batches1) > 0
    indices0 = {i for b in batches0 for i in b}
    indices1 = {i for b in batches1 for i in b}
    assert not indices0 & indices1, "both processes got the same samples"
    assert indices0 | indices1 == set(range(200)), "an epoch covers every sample once"
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 3
    # each process tokenises the splits, one warns of the lines cut to --max_source_length (and of the targets cut)
    cut = [line.split(" WARNING ", 1)[1] for line in result.stderr.splitlines() if "train split: " in line]
    assert any("source line(s)" in line for line in cut) and len(cut) == len(set(cut)), result.stderr[-4000:]
    # ode-train gives DDP find_unused_parameters=False: no search for unused parameters, and no warning of it
    assert "find_unused_parameters=True" not in result.stderr


@pytest.mark.slow
def test_fsdp_training_saves_the_gathered_model(tmp_path):
    """Tiny RK2-gated and RK4 models (both stacks ODE blocks) trained 3 steps under FSDP (FSDP1, full shard, one
    unit per `ODETransformerLayer`) on 2 CPU processes, then saved from the gathered state dict: the RK stages
    reuse one layer's parameters and the embeddings are tied, which is what sharding wrappers may break.
    tests/fsdp_train.py does the work and measures; see docs/distributed.md."""
    from tests.fsdp_train import MODELS

    launch_two_processes(ROOT / "tests" / "fsdp_train.py", str(tmp_path))
    for name in MODELS:
        report = json.loads((tmp_path / f"{name}.json").read_text())
        assert report["wrapper"] == "FullyShardedDataParallel", name
        assert report["local_fraction"] < 0.75, f"{name}: not sharded"
        assert report["missing"] == report["unexpected"] == [], name
        assert report["reloaded_vs_gathered"] < 1e-6, name
        assert report["greedy_equal"], f"{name}: greedy decoding (per-stage cache) differs after reloading"
        assert report["tied_after_reload"], name
        assert report["reloaded_vs_initial"] > 0.1, f"{name}: training did not change the saved model"
        # FSDP reduced the gradients of the weights every stage reuses as one process would on the whole batch.
        assert report["reloaded_vs_one_process"] < 1e-4, name
        assert all(math.isfinite(loss) for loss in report["losses"]), name
