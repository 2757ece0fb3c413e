"""A catalogue of faults: whatever happens to a run or a tool, nothing is lost and nothing is silently wrong.

Each test provokes one fault (two runs at once, a kill at each end phase of a run, divergence, a full disk, ...)
and checks what the user is left with: the files, the weights bit for bit, and a one-line message that names
the problem and the fix. Tiny models on a few lines of data keep every case at a few seconds.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import logging
import multiprocessing
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_bad_inputs import TINY_RUN, corpus, seq2seq, write
from tiny_folder import TEXTS, save_tiny_folder

import ode_transformer.train.arguments
import ode_transformer.train.evaluation
import ode_transformer.train.loading
import ode_transformer.train.run
import ode_transformer.train.trainer
from modeling_ode import ODETransformerForConditionalGeneration
from ode_transformer import cli
from ode_transformer.hub.export import export_for_hub
from ode_transformer.train import averaging, evaluate_predictions, translate
from ode_transformer.train.arguments import parse_arguments
from ode_transformer.train.data import load_local_file
from ode_transformer.train.files import read_lines
from ode_transformer.train.output_folder import save_final_model
from ode_transformer.train.run import run
from ode_transformer.train.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def train_run(output_dir: Path, *flags: str) -> dict:
    return run(parse_arguments([*TINY_RUN, "--output_dir", str(output_dir), *flags]))


def assert_translate_and_train_refuse(folder: Path, src: Path, out: Path, message: str) -> None:
    """ode-translate and a fine-tuning ode-train both refuse ``folder`` with ``message``; the run writes no ``out``."""
    with pytest.raises(ValueError, match=message):
        translate.main([str(folder), "--input", str(src), "--no_progress"])
    with pytest.raises(ValueError, match=message):
        train_run(out, "--model_name_or_path", str(folder), "--train_file", f"{src},{src}")
    assert not out.exists()


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of ``folder`` with its bytes and modification time: equal snapshots = nothing changed."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def tokenizer_folder(folder: Path) -> str:
    """A trained tokenizer for ``--tokenizer_name``: a run that reuses it has less to do."""
    train_tokenizer(TEXTS, vocab_size=300, save_to=folder)
    return str(folder)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def assert_bit_identical(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    different = [key for key in expected if not torch.equal(actual[key], expected[key])]
    assert not different, different


# --------------------------------------------------------------------------------------------
# 1. Two runs started at once into one --output_dir


def _race(barrier, output_dir: str, data: str, tokenizer: str, results) -> None:
    """One of the two racing runs: both leave the barrier together, then start ode_transformer.train.run."""
    import os

    from ode_transformer.train.arguments import parse_arguments
    from ode_transformer.train.run import run

    args = parse_arguments([*TINY_RUN, "--output_dir", output_dir, "--train_file", data, "--tokenizer_name",
                            tokenizer, "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2"])  # fmt: skip
    barrier.wait()
    try:
        run(args)
        results.put((os.getpid(), "ok"))
    except Exception as error:
        results.put((os.getpid(), f"{type(error).__name__}: {error}"))


def test_two_runs_started_at_once_one_is_refused_naming_the_other(tmp_path):
    data = ",".join(corpus(tmp_path / "data"))
    tokenizer = tokenizer_folder(tmp_path / "tokenizer")  # both racers reuse it: less to do at once
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's threads
    barrier, results = context.Barrier(2), context.Queue()
    out = tmp_path / "out"
    racers = [
        context.Process(target=_race, args=(barrier, str(out), data, tokenizer, results)) for _ in range(2)
    ]
    for racer in racers:
        racer.start()
    outcomes = dict(results.get(timeout=300) for _ in racers)
    for racer in racers:
        racer.join(timeout=60)
    assert sorted(outcomes.values(), key=lambda o: o != "ok")[0] == "ok", outcomes
    (winner,) = [pid for pid, outcome in outcomes.items() if outcome == "ok"]
    (refused,) = [outcome for outcome in outcomes.values() if outcome != "ok"]
    assert refused == (
        f"InUseError: {out} is in use by another run (pid {winner}); wait for it to finish or stop it, "
        "or choose another --output_dir."
    )
    run_ids = {(out / name / "run_id.txt").read_text() for name in ("checkpoint-2", "checkpoint-4")}
    assert len(run_ids) == 1 and (out / "model.safetensors").is_file()
    assert not (out / ".run.lock").exists() and not (out / ".run.pid").exists()  # released with the run


# --------------------------------------------------------------------------------------------
# 2. Tools writing onto an existing trained-model folder


@pytest.mark.both_cpus
def test_averaging_and_export_refuse_an_occupied_folder_unless_overwrite(tmp_path, capsys):
    model_dir = tmp_path / "model"
    save_tiny_folder(model_dir)
    for step in (1, 2):
        checkpoint = tmp_path / "run" / f"checkpoint-{step}"
        checkpoint.mkdir(parents=True)
        save_file({"w": torch.full((2,), float(step))}, str(checkpoint / "model.safetensors"))
        (checkpoint / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    before = snapshot(model_dir)
    with pytest.raises(SystemExit) as raised:
        averaging.main([str(tmp_path / "run"), "--last", "2", "--out", str(model_dir)])
    error = capsys.readouterr().err
    assert raised.value.code == 2 and f"{model_dir} already holds files (" in error
    assert "pass --overwrite to delete it first, or choose an empty --out." in error
    export_dir = tmp_path / "exported"
    export_for_hub(model_dir, export_dir)
    exported = snapshot(export_dir)
    with pytest.raises(FileExistsError, match=f"{export_dir} already holds files .*; pass --overwrite"):
        export_for_hub(model_dir, export_dir)
    assert snapshot(model_dir) == before and snapshot(export_dir) == exported  # nothing touched

    (export_dir / "checkpoint-9").mkdir()  # a stale file that would describe another model
    export_for_hub(model_dir, export_dir, overwrite=True)
    assert not (export_dir / "checkpoint-9").exists() and (export_dir / "model.safetensors").is_file()
    averaging.main([str(tmp_path / "run"), "--last", "2", "--out", str(model_dir), "--overwrite"])
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "model.safetensors"
    ]  # the old model's files are gone
    assert torch.equal(weights(model_dir)["w"], torch.full((2,), 1.5))
    with pytest.raises(SystemExit):
        averaging.main([str(tmp_path / "run"), "--last", "2", "--out", str(tmp_path), "--overwrite"])
    assert re.search(
        r"holds .*checkpoint-1, an input of this command: writing the folder", capsys.readouterr().err
    )


# --------------------------------------------------------------------------------------------
# 3. A kill at each end phase of a run, then --resume_from_checkpoint last


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (a BaseException, so no handler of the code under test catches it)."""


def _kill_at_last_step(original):
    def training_step(self, *args, **kwargs):
        if self.state.global_step == self.args.max_steps - 1:
            raise Killed("last step")
        return original(self, *args, **kwargs)

    return training_step


def _kill_when_publishing(original):
    def publish(staged, final):
        if final.name == "checkpoint-4":
            raise Killed("last checkpoint")
        return original(staged, final)

    return publish


def _kill_after_half_a_save(original):
    def save_model(self, output_dir=None, _internal_call=False):
        original(self, output_dir, _internal_call)
        if _internal_call:  # a checkpoint's save
            return
        file = Path(output_dir or self.args.output_dir) / "model.safetensors"
        file.write_bytes(file.read_bytes()[:1000])
        raise Killed("final save")

    return save_model


def _kill(*_args, **_kwargs):
    raise Killed


END_PHASES = {  # phase: (object, attribute, replacement given the original)
    "last step": (ode_transformer.train.trainer._TokenBudgetMixin, "training_step", _kill_at_last_step),
    "last checkpoint": (ode_transformer.train.trainer, "publish", _kill_when_publishing),
    "averaging": (averaging, "average_checkpoints", lambda original: _kill),
    "final save": (
        ode_transformer.train.trainer.TokenBudgetSeq2SeqTrainer,
        "save_model",
        _kill_after_half_a_save,
    ),
    "card": (ode_transformer.train.evaluation, "write_card", lambda original: _kill),
}


@pytest.fixture(scope="module")
def end_phase_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """An uninterrupted run that ends in all the phases: last step, last checkpoint (save_total_limit rotating),
    averaging of checkpoints, final save, test and model card. Its folder and the flags that repeat it."""
    folder = tmp_path_factory.mktemp("end_phases")
    data = ",".join(corpus(folder / "data"))
    flags = ["--train_file", data, "--test_file", data, "--do_predict", "true", "--num_beams", "1",
             "--max_target_length", "8", "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "1",
             "--save_total_limit", "2", "--average_last_checkpoints", "2"]  # fmt: skip
    train_run(folder / "full", *flags)
    return folder / "full", [*flags, "--tokenizer_name", str(folder / "full" / "tokenizer")]


@pytest.mark.parametrize("phase", list(END_PHASES))
def test_kill_in_an_end_phase_then_resume_gives_the_same_model(end_phase_run, tmp_path, monkeypatch, phase):
    full, flags = end_phase_run
    owner, name, replacement = END_PHASES[phase]
    out = tmp_path / "killed"
    with monkeypatch.context() as patch:
        patch.setattr(owner, name, replacement(getattr(owner, name)))
        with pytest.raises(Killed):
            train_run(out, *flags)
    if phase == "final save":  # the cut-off file stayed in the staging folder, not where a model is read
        assert not (out / "model.safetensors").exists()
        assert (out / ".staging" / "final_model" / "model.safetensors").stat().st_size == 1000
    train_run(out, *flags, "--resume_from_checkpoint", "last")
    assert_bit_identical(weights(out), weights(full))
    checkpoints = sorted(p.name for p in out.glob("checkpoint-*"))
    assert (
        checkpoints == sorted(p.name for p in full.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]
    )
    assert (out / "README.md").is_file() and not (out / ".staging").exists()


SIGKILL_RUN = """
import os, signal, sys
import torch
torch.set_num_threads(int(sys.argv[1]))
import ode_transformer.train.trainer
from ode_transformer.train.run import main

original = ode_transformer.train.trainer.publish
def publish(staged, final):  # the kernel ends the process: no finally, no atexit, the lock files stay
    if final.name == "checkpoint-4":
        os.kill(os.getpid(), signal.SIGKILL)
    original(staged, final)
ode_transformer.train.trainer.publish = publish
main(sys.argv[2:])
"""


def test_a_real_sigkill_leaves_lock_files_and_staging_and_resume_recovers(end_phase_run, tmp_path):
    """The in-process kills above unwind `finally` blocks; SIGKILL does not. Killed while publishing its last
    checkpoint, the run leaves .run.lock, .run.pid (a dead pid) and .staging/checkpoint-4; resuming takes the
    lock (the kernel released it), clears the staging and ends with the uninterrupted run's model (to 1e-6: the
    first steps ran in another process)."""
    full, flags = end_phase_run
    out = tmp_path / "killed"
    killed = subprocess.run(
        [sys.executable, "-c", SIGKILL_RUN, str(torch.get_num_threads()), *TINY_RUN, "--output_dir", str(out), *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (out / ".run.lock").exists() and (out / ".run.pid").exists() and (out / ".staging").is_dir()
    assert not (out / "checkpoint-4").exists() and (out / "checkpoint-3").is_dir()
    train_run(out, *flags, "--resume_from_checkpoint", "last")
    resumed, expected = weights(out), weights(full)
    assert resumed.keys() == expected.keys()
    assert all(torch.allclose(resumed[key], expected[key], rtol=0, atol=1e-6) for key in expected)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]
    assert not any((out / name).exists() for name in (".run.lock", ".run.pid", ".staging"))


@pytest.mark.both_cpus
def test_resuming_a_finished_run_trains_nothing_and_changes_nothing(end_phase_run, tmp_path, caplog):
    full, flags = end_phase_run
    before = snapshot(full)
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train"):
        assert train_run(full, *flags, "--resume_from_checkpoint", "last") == {}
    assert "holds a finished run (its last step is" in caplog.text and "nothing changed" in caplog.text
    assert snapshot(full) == before  # no checkpoint-5, no evicted checkpoint, no rewritten file


# --------------------------------------------------------------------------------------------
# 4. Divergence


@pytest.mark.both_cpus
def test_divergence_stops_at_the_first_non_finite_step_and_saves_nothing(tmp_path):
    data = ",".join(corpus(tmp_path / "data"))
    out = tmp_path / "out"
    with pytest.raises(FloatingPointError) as raised:
        train_run(out, "--train_file", data, "--learning_rate", "1e6", "--warmup_steps", "0", "--max_steps", "6",
                  "--save_strategy", "steps", "--save_steps", "1")  # fmt: skip
    message = str(raised.value)
    assert message.startswith("training diverged at step 2: the loss is nan (learning rate ")
    assert "--learning_rate 1e+06); train again with a lower --learning_rate" in message
    assert not (out / "model.safetensors").exists() and not (out / "README.md").exists()
    for checkpoint in out.glob("checkpoint-*"):  # saved before the divergence: finite
        assert all(torch.isfinite(t).all() for t in weights(checkpoint).values())


def test_a_non_finite_model_is_never_saved_and_warned_about_when_loaded(tmp_path, caplog):
    model = seq2seq()
    with torch.no_grad():
        model.model.shared.weight[3, 0] = float("nan")
    trainer = SimpleNamespace(
        model=model, args=SimpleNamespace(learning_rate=1e6, output_dir=str(tmp_path / "o"))
    )
    with pytest.raises(FloatingPointError, match=r"the final model has non-finite weights \(.*shared.weight"):
        save_final_model(trainer)
    assert not (tmp_path / "o").exists()

    folder = tmp_path / "nan_model"
    save_tiny_folder(folder)
    model = ODETransformerForConditionalGeneration.from_pretrained(folder)
    with torch.no_grad():
        model.model.shared.weight[3, 0] = float("inf")
    model.save_pretrained(folder)
    with caplog.at_level(logging.WARNING):
        ODETransformerForConditionalGeneration.from_pretrained(folder)
        assert f"{folder} holds non-finite weights (NaN or infinity) in 1 tensors" in caplog.text
        caplog.clear()
        translate.load_for_generation(str(folder))  # what ode_transformer.train.translate loads
        assert "holds non-finite weights" in caplog.text


# --------------------------------------------------------------------------------------------
# 5. Truncated training and test lines are counted


@pytest.mark.both_cpus
def test_truncated_training_and_test_lines_are_counted(tmp_path, caplog):
    src, tgt = corpus(tmp_path / "data")
    write(Path(src), "the dog number one runs far away over the hills\n" + "a dog\n" * 11)
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train"):
        train_run(
            tmp_path / "out", "--train_file", f"{src},{tgt}", "--max_source_length", "6", "--max_steps", "1"
        )
    assert (
        "train split: 1 of 12 source line(s) longer than --max_source_length 6 tokens were truncated; "
        "raise --max_source_length to keep them whole"
    ) in caplog.text
    assert "target line(s)" not in caplog.text  # no target line is longer than 16 tokens


@pytest.mark.both_cpus
def test_test_file_keeps_blank_and_undecodable_lines_aligned_with_their_hypotheses(tmp_path):
    """An evaluation split keeps every line: test_hypotheses.txt has one line per test source line, in order."""
    src, tgt = corpus(tmp_path / "data")
    test_src = tmp_path / "test.src"
    test_src.write_bytes(b"the dog number 1 runs\n\nthe \xff dog\nthe dog number 3 runs\n")
    test_tgt = write(tmp_path / "test.tgt", "der Hund\nder\n\nder Hund 3\n")
    out = tmp_path / "out"
    train_run(out, "--train_file", f"{src},{tgt}", "--test_file", f"{test_src},{test_tgt}",
              "--do_predict", "true", "--num_beams", "1", "--max_target_length", "6")  # fmt: skip
    assert len(read_lines(out / "test_hypotheses.txt")) == 4


@pytest.mark.both_cpus
def test_a_model_folder_without_its_tokenizer_is_refused_and_left_untouched(tmp_path):
    """Fine-tuning reads the model's own vocabulary; a new tokenizer trained into the model's folder would pair
    other ids with its trained embeddings, and change the user's folder."""
    src, tgt = corpus(tmp_path / "data")
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink(missing_ok=True)
    before = snapshot(folder)
    with pytest.raises(FileNotFoundError, match="holds no tokenizer"):
        train_run(tmp_path / "out", "--model_name_or_path", str(folder), "--train_file", f"{src},{tgt}")
    assert snapshot(folder) == before


@pytest.mark.both_cpus
def test_gec_m2_file_of_another_test_set_is_refused_before_training(tmp_path):
    """The M2 scorer pairs the i-th hypothesis with the i-th M2 sentence; another count would shift them all."""
    src, tgt = corpus(tmp_path / "data", lines=4)
    m2 = write(tmp_path / "one.m2", "S the dog\nA -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0\n\n")
    out = tmp_path / "out"
    (out / "checkpoint-100").mkdir(parents=True)  # an earlier run, which --overwrite_output_dir would delete
    with pytest.raises(ValueError, match="has 1 sentences but the test split has 4 rows"):
        train_run(out, "--task", "gec", "--train_file", f"{src},{tgt}", "--test_file", f"{src},{tgt}",
                  "--m2_file", str(m2), "--overwrite_output_dir", "true")  # fmt: skip
    assert [p.name for p in out.iterdir()] == ["checkpoint-100"]  # refused before anything was deleted


# --------------------------------------------------------------------------------------------
# 6. ode_transformer.train.translate


def test_a_hypothesis_with_a_line_break_stays_on_one_line(tmp_path):
    """A byte-level vocabulary can write a line break; written as is, it would shift every later hypothesis."""
    _, tokenizer = save_tiny_folder(tmp_path / "model")
    ids = tokenizer(["the dog\nruns\u2028far\r.", "a cat"])["input_ids"]
    assert translate.decode(tokenizer, ids) == ["the dog runs far .", "a cat"]


@pytest.mark.both_cpus
@pytest.mark.parametrize(
    ("main", "flags", "fragment"),
    [
        (translate.main, ["--batch_size", "0"], "--batch_size: expected a positive integer, got 0"),
        (translate.main, ["--output", "no/such/folder/hyp.txt"], "its folder no/such/folder does not exist"),
        (averaging.main, ["--last", "-1", "--out", "avg"], "--last: expected a positive integer, got -1"),
        (
            translate.main,
            ["--device", "gpu"],
            "--device gpu: not a torch device; e.g. cpu, cuda, cuda:1 or mps",
        ),
    ],
    ids=["batch size 0", "output folder missing", "average the last -1", "unknown device"],
)
def test_counts_and_output_folders_are_checked_before_any_work(tmp_path, capsys, main, flags, fragment):
    """--batch_size 0 put everything in one batch and --last 0 averaged every checkpoint; a missing output
    folder failed only after all the decoding."""
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "model"), *flags])
    assert exit_.value.code == 2 and fragment in capsys.readouterr().err


@pytest.mark.parametrize(
    ("device", "gpus", "mps", "fragment"),
    [
        ("cuda:2", 2, False, "there are 2 CUDA device(s), numbered from 0; use cuda:0 or cpu"),
        ("cuda:1", 2, False, None),
        ("cuda", 0, False, "this torch has no CUDA device"),
        ("mps", 0, False, "this machine has no Apple MPS device"),
        ("mps", 0, True, None),
        ("cpu", 0, False, None),
    ],
)
def test_device_problem_names_a_missing_gpu(monkeypatch, device, gpus, mps, fragment):
    """A GPU index past the count, or mps on a machine without it, failed only when the model was moved."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    problem = translate.device_problem(device)
    assert problem is None if fragment is None else fragment in problem


@pytest.mark.both_cpus
def test_an_output_over_an_input_or_a_folder_is_refused_before_any_work(tmp_path, capsys):
    """`--output` equal to `--input` replaced the source with hypotheses, ode-evaluate's `--output` equal to
    `--ref` replaced the reference with JSON, and an existing folder failed only after all the decoding."""
    source = write(tmp_path / "in.txt", "a dog\n")
    reference = write(tmp_path / "ref.txt", "ein Hund\n")
    cases = [
        (translate.main, [str(tmp_path / "model"), "--input", str(source), "--output", str(source)],
         f"--output {source} is the --input file: writing it would replace that input"),
        (translate.main, [str(tmp_path / "model"), "--input", str(source), "--output", str(tmp_path)],
         f"--output {tmp_path} is a folder: give a file name in it"),
        (evaluate_predictions.main, ["--task", "translation", "--hyp", str(source), "--ref", str(reference),
                                     "--output", str(reference)], f"--output {reference} is the --ref file"),
    ]  # fmt: skip
    for main, argv, fragment in cases:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and fragment in capsys.readouterr().err
    assert (source.read_text(), reference.read_text()) == ("a dog\n", "ein Hund\n")


@pytest.mark.both_cpus
def test_translate_names_bad_utf8_on_stdin_and_a_missing_cuda(tmp_path, monkeypatch, capsys):
    save_tiny_folder(tmp_path / "model")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a dog\n\xff cat\n")))
    with pytest.raises(ValueError, match="^standard input, line 2: not UTF-8 text"):
        translate.main([str(tmp_path / "model"), "--no_progress"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            translate.main([str(tmp_path / "model"), "--device", "cuda"])
        assert "--device cuda: this torch has no CUDA device" in capsys.readouterr().err


@pytest.mark.both_cpus
def test_translate_empty_input_overlong_line_and_bad_folders(tmp_path, caplog, monkeypatch):
    folder = tmp_path / "model"
    save_tiny_folder(folder, weight_scale=3)
    empty, output = write(tmp_path / "empty.txt", ""), tmp_path / "out.txt"
    translate.main([str(folder), "--input", str(empty), "--output", str(output), "--no_progress"])
    assert output.read_text() == ""

    long = write(tmp_path / "long.txt", "the dog " * 200 + "\nthe cat\n")
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.translate"):
        translate.main([str(folder), "--input", str(long), "--output", str(output), "--no_progress"])
    assert (
        "1 input line(s) longer than 128 tokens were truncated (the model's max_position_embeddings"
        in caplog.text
    )
    assert "--max_source_length" in caplog.text
    assert len(output.read_text().split("\n")) == 3  # two lines, each ended by a newline
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.translate"):
        translate.main([str(folder), "--input", str(long), "--output", str(output), "--no_progress",
                        "--max_source_length", "4"])  # fmt: skip
    assert "were truncated (--max_source_length 4); raise --max_source_length" in caplog.text

    with pytest.raises(
        FileNotFoundError, match=f"^no model folder {tmp_path}/missing/model: give the folder"
    ):
        translate.main([str(tmp_path / "missing" / "model"), "--input", str(empty)])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    with pytest.raises(FileNotFoundError, match=f"^{folder} holds no tokenizer .*: copy tokenizer.json"):
        translate.main([str(folder), "--input", str(empty)])

    # a run that has not finished: checkpoints, no final model (it had been called a folder without a tokenizer)
    run_folder = tmp_path / "run"
    save_tiny_folder(run_folder / "checkpoint-4")
    (run_folder / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    with pytest.raises(
        FileNotFoundError, match=f"^{run_folder} holds checkpoints \\(checkpoint-4\\) but no final model"
    ):
        translate.main([str(run_folder), "--input", str(empty)])
    # a mistyped folder beside existing ones is a path, not a Hub id to try for a minute
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="^no model folder run/modle"):
        translate.main(["run/modle", "--input", str(empty)])
    # ... but a Hub id whose owner happens to name a local folder without models stays a Hub id
    (tmp_path / "someuser").mkdir()
    ode_transformer.train.loading.check_model_folder("someuser/ode-base")


@pytest.mark.both_cpus
def test_a_folder_of_another_model_or_with_unfitting_weights_is_refused(tmp_path):
    """A BART folder, or an ODE folder whose config.json was edited, loaded with only a warning from transformers:
    ode-translate wrote a random model's output and ode_transformer.train.run fine-tuned from random weights."""
    from transformers import BartConfig, BartForConditionalGeneration

    src = write(tmp_path / "in.txt", "the dog runs\n")
    bart = tmp_path / "bart"
    save_tiny_folder(bart)  # its tokenizer, then a BART model over the ODE one
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        (bart / name).unlink(missing_ok=True)
    BartForConditionalGeneration(BartConfig(vocab_size=320, d_model=16, encoder_layers=1, decoder_layers=1,
                                            encoder_ffn_dim=32, decoder_ffn_dim=32)).save_pretrained(bart)  # fmt: skip
    message = f"{bart} is not an ODE Transformer folder: its config.json has model_type 'bart'"
    with pytest.raises(ValueError, match=message):
        translate.main([str(bart), "--input", str(src), "--no_progress"])
    with pytest.raises(ValueError, match=message):
        run(parse_arguments([*TINY_RUN, "--model_name_or_path", str(bart), "--train_file", f"{src},{src}",
                             "--output_dir", str(tmp_path / "out")]))  # fmt: skip
    assert not (tmp_path / "out").exists()

    causal = tmp_path / "causal"
    save_tiny_folder(causal, causal=True)
    with pytest.raises(
        ValueError, match=f"{causal} is a decoder-only language model: give --task lm with it"
    ):
        run(parse_arguments([*TINY_RUN, "--model_name_or_path", str(causal), "--train_file", f"{src},{src}",
                             "--output_dir", str(tmp_path / "out")]))  # fmt: skip

    edited = tmp_path / "edited"
    save_tiny_folder(edited)
    config = json.loads((edited / "config.json").read_text())
    config["relative_position_values"] = not config["relative_position_values"]
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"the weights in {edited} do not match its config.json: .* missing"):
        translate.main([str(edited), "--input", str(src), "--no_progress"])


def kept_traceback(error: str, line: str) -> Path:
    """The file a console command's one-line error names as keeping its traceback: stderr must be exactly
    ``line`` (a regular expression) followed by where the traceback is, and nothing else."""
    match = re.fullmatch(line + r" \(traceback in (\S+); ODE_TRACEBACK=1 prints it\)\n", error)
    assert match, error
    return Path(match.group(1))


@pytest.mark.both_cpus
def test_console_commands_end_bad_input_with_one_line_and_exit_code_2(tmp_path, monkeypatch, capsys):
    """ode-translate / ode-evaluate: what the user can fix is one line on stderr, exit code 2, the traceback kept in
    a file it names (ODE_TRACEBACK=1 re-raises); before, ode-translate printed the traceback and ode-evaluate
    exited 0 after its error line."""
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    missing = tmp_path / "missing" / "model"
    monkeypatch.setattr(
        sys, "argv", ["ode-translate", str(missing), "--input", str(write(tmp_path / "in.txt", "a\n"))]
    )
    with pytest.raises(SystemExit) as exit_info:
        cli.translate()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (  # a refusal of the project's own: no traceback kept (issue 56 row 19)
        f"ode-translate: error: no model folder {missing}: give the folder ode_transformer.train.run wrote (its "
        "--output_dir) or a Hub id (USER/NAME)\n"
    )
    monkeypatch.setenv("ODE_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError, match="^no model folder"):
        cli.translate()
    monkeypatch.delenv("ODE_TRACEBACK")

    monkeypatch.setattr(sys, "argv", ["ode-evaluate", "--task", "gec", "--hyp", str(tmp_path / "none.txt")])
    with pytest.raises(SystemExit) as exit_info:
        cli.evaluate()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("ode-evaluate: error: no such file")
    monkeypatch.setenv("ODE_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError, match="no such file"):
        cli.evaluate()
    monkeypatch.delenv("ODE_TRACEBACK")

    # ode-train names itself too (it used to print a bare "error:" and exit 1), in its usage line as well
    argv = ["--dataset", "multi30k", "--data_dir", str(tmp_path), "--output_dir", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", ["ode-train", *argv])
    with pytest.raises(SystemExit) as exit_info:
        cli.train()
    assert exit_info.value.code == 2
    last_line = capsys.readouterr().err.splitlines()[-1]
    assert last_line.startswith("ode-train: error: shared corpus 'multi30k' not found")
    monkeypatch.setenv("ODE_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError, match="^shared corpus 'multi30k' not found"):
        cli.train()
    monkeypatch.delenv("ODE_TRACEBACK")
    monkeypatch.setattr(sys, "argv", ["ode-train", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        cli.train()
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("usage: ode-train [RECIPE]")
    assert (
        ode_transformer.train.arguments.build_parser().prog == "python -m ode_transformer.train.run"
    )  # outside the command, the module's name


def test_input_from_a_pipe_or_device_reads_like_a_file_and_a_folder_is_named(tmp_path):
    assert read_lines("/dev/null") == []
    reader, writer = os.pipe()  # what `--input <(zcat x.gz)` hands over: /dev/fd/N, not a regular file
    os.write(writer, b"ein Hund\nzwei Katzen\n")
    os.close(writer)
    try:
        assert read_lines(f"/dev/fd/{reader}") == ["ein Hund", "zwei Katzen"]
    finally:
        os.close(reader)
    with pytest.raises(IsADirectoryError, match=f"^{re.escape(str(tmp_path))} is a folder: give a text file"):
        read_lines(tmp_path)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("ein Hund\nzwei Katzen für\n".encode("latin-1"))
    with pytest.raises(
        ValueError, match=f"^{re.escape(str(latin1))}, line 2: not UTF-8 text; convert the file"
    ):
        read_lines(latin1)


# --------------------------------------------------------------------------------------------
# 7. A full disk (here: a file-size limit) during a save, and the advice after it

FULL_DISK_RUN = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
from ode_transformer.train.run import main
main(sys.argv[2:])
"""


def test_full_disk_during_a_save_is_named_and_the_advice_leads_somewhere(tmp_path):
    data = ",".join(corpus(tmp_path / "data"))
    out = tmp_path / "out"
    flags = [*TINY_RUN, "--output_dir", str(out), "--train_file", data, "--tokenizer_name", tokenizer_folder(tmp_path / "tok"),
             "--save_strategy", "steps", "--save_steps", "1"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK_RUN, "20000", *flags], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("OSError: [Errno 28] no space left on device while saving ")
    assert ".staging/checkpoint-1" in last and "free some space" in last
    assert (
        "During handling" not in result.stderr and "SafetensorError" not in result.stderr
    )  # no library trace
    assert not list(out.glob("checkpoint-*"))  # nothing half-written published

    # The advice: resuming says there is nothing to resume and to start again; starting again says the same.
    with pytest.raises(ValueError, match="nothing to resume; start the run again from the beginning with "
                                         "--overwrite_output_dir"):  # fmt: skip
        train_run(out, "--train_file", data, "--resume_from_checkpoint", "last")
    with pytest.raises(FileExistsError, match=r"already holds a run \(.*\); pass --overwrite_output_dir"):
        train_run(out, "--train_file", data)
    train_run(out, "--train_file", data, "--overwrite_output_dir", "true")
    assert (out / "model.safetensors").is_file() and not (out / ".staging").exists()


# --------------------------------------------------------------------------------------------
# 8. Data files: a truncated .gz, a comma inside a path


def test_truncated_gz_and_comma_in_a_path_are_named(tmp_path):
    packed = gzip.compress(b"".join(b"line %d\n" % i for i in range(1000)))
    cut = tmp_path / "train.src.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(
        ValueError, match=f"^{cut} is a truncated or damaged gzip file .*; copy or compress it again"
    ):
        read_lines(cut)
    tsv = write(tmp_path / "data,v2.tsv", "source\ttarget\na\tb\n")
    with pytest.raises(ValueError) as raised:
        load_local_file(str(tsv), "seq2seq")
    assert f"'{tsv}': a path holds a comma, but 'SRC,TGT' is split at the first comma" in str(raised.value)
    assert "rename the file, or link it under a name without a comma" in str(raised.value)


# --------------------------------------------------------------------------------------------
# 9. Round three (issue #44): a full disk, Ctrl-C, a second writer, foreign code in a model folder

# Ctrl-C as a terminal delivers it: a suite started in the background without job control (`cmd &` in a script)
# hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt.
CLI = (
    "import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "from ode_transformer import cli\nsys.argv[0] = {name!r}\ncli.{function}()\n"
)


def command(name: str, *argv: str, limit: int | None = None) -> list[str]:
    """The console command ``name`` (ode-translate, ode-train) as a subprocess of this checkout, optionally
    under a file-size limit of ``limit`` bytes (SIGXFSZ ignored: a write past it fails with EFBIG)."""
    script = CLI.format(name=name, function=name.removeprefix("ode-"))
    if limit is not None:
        script = (
            "import resource, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))\n" + script
        )
    return [sys.executable, "-c", script, *argv]


def start(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "ODE_TRACEBACK": "0"}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def read_until(process: subprocess.Popen, marker: bytes, path: Path | None = None) -> bytes:
    """Read the process's stderr until ``marker`` shows in it (or ``path`` exists); what was read. Fails if the
    process ends first."""
    seen = b""
    while marker not in seen and not (path is not None and path.exists()):
        chunk = os.read(process.stderr.fileno(), 65536)
        assert chunk, f"the process ended before {marker!r}: {seen.decode(errors='replace')[-3000:]}"
        seen += chunk
    return seen


def interrupt(process: subprocess.Popen, seen: bytes) -> tuple[int, str]:
    """Ctrl-C: SIGINT to the process, then its exit code and whole stderr."""
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=120)
    return process.returncode, (seen + rest).decode(errors="replace")


def assert_one_line(stderr: str, start_: str) -> str:
    """No traceback, and the last line of stderr ends with one starting with ``start_`` (a progress bar that the
    interrupt cut off mid-line may come before it); the message."""
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert start_ in last, stderr[-3000:]
    return last[last.index(start_) :]


def test_translate_on_a_full_disk_keeps_the_old_output(tmp_path):
    """#44 row 1: the output was truncated, then cut off mid-word by the full disk (59 of 80 lines kept)."""
    save_tiny_folder(tmp_path / "model", weight_scale=3)
    source = write(tmp_path / "in.txt", "".join(f"the dog number {i} runs in the park\n" for i in range(80)))
    output = write(tmp_path / "out.txt", "".join(f"old line {i}\n" for i in range(80)))
    argv = [str(tmp_path / "model"), "--input", str(source), "--output", str(output), "--no_progress"]
    process = start(command("ode-translate", *argv, limit=40))  # 80 outputs take 80 newlines at least
    _, stderr = process.communicate(timeout=300)
    stderr = stderr.decode()
    assert process.returncode == 2, stderr
    last = assert_one_line(
        stderr, f"ode-translate: error: [Errno 28] no space left on device while saving {output}"
    )
    assert "free some space" in last
    assert output.read_text() == "".join(f"old line {i}\n" for i in range(80))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "model", "out.txt"]  # no temporary left


def test_translate_a_second_writer_is_refused_and_ctrl_c_keeps_the_old_output(tmp_path, monkeypatch, capsys):
    """#44 rows 3 and 8: two ode-translate into one --output both exited 0 (the first one's output lost), and
    Ctrl-C printed a KeyboardInterrupt traceback."""
    save_tiny_folder(tmp_path / "model", weight_scale=3)
    source = write(tmp_path / "in.txt", "the dog runs in the park\n" * 20000)  # minutes of decoding
    output = write(tmp_path / "out.txt", "old\n")
    argv = [str(tmp_path / "model"), "--input", str(source), "--output", str(output), "--batch_size", "1"]
    first = start(command("ode-translate", *argv))
    try:
        seen = read_until(first, b"sent/s]")  # the progress bar: decoding has begun
        monkeypatch.delenv("ODE_TRACEBACK", raising=False)
        monkeypatch.setattr(sys, "argv", ["ode-translate", *argv, "--no_progress"])
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            cli.translate()
        assert exit_.value.code == 2
        assert capsys.readouterr().err == (
            f"ode-translate: error: {output} is in use by another process (pid {first.pid}); "
            "wait for it to finish or stop it, or choose another --output.\n"
        )
        code, stderr = interrupt(first, seen)
    finally:
        first.kill()
    assert code == 130
    assert assert_one_line(stderr, "ode-translate: interrupted; ") == (
        f"ode-translate: interrupted; nothing was written to {output} (it keeps its old content); run the "
        "command again to translate the input"
    )
    assert output.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "model", "out.txt"]  # lock files gone


@pytest.mark.both_cpus
def test_model_flags_with_a_saved_model_are_refused_by_name(tmp_path):
    """#44 row 2: --d_model 64 --encoder_layers 2 with --model_name_or_path trained the saved 16-wide model, without
    a word. Flags equal to the saved config pass; dropout and label smoothing are the run's and are applied."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    flags = [*TINY_RUN, "--output_dir", str(tmp_path / "out"), "--train_file", "a,b",
             "--model_name_or_path", str(folder)]  # fmt: skip
    with pytest.raises(ValueError) as raised:
        parse_arguments([*flags, "--d_model", "64", "--encoder_layers", "3"])
    assert str(raised.value) == (
        f"--d_model 64 (saved: 16), --encoder_layers 3 (saved: 2): {folder} is a saved model, whose shape and "
        "method its config.json fixes; leave these flags out to fine-tune it as it is, or leave "
        "--model_name_or_path out to train a new model with them"
    )
    with pytest.raises(ValueError, match=r"^--encoder_ode_method 'euler' \(saved: 'rk2'\): "):
        parse_arguments([*flags, "--encoder_ode_method", "euler"])
    model_args, _, run_args, _ = parse_arguments([*flags, "--d_model", "16", "--dropout", "0.3"])
    model = ode_transformer.train.loading.load_trainable_model(model_args, run_args.task)
    assert model.config.d_model == 16 and model.config.dropout == 0.3
    assert model.model.encoder.embed.dropout.p == 0.3  # built with it, not only written into the config


@pytest.mark.both_cpus
def test_a_preset_with_a_saved_model_is_refused_where_it_would_be_ignored(tmp_path):
    """#44: --preset with --model_name_or_path was neither read nor refused. A preset that matches the saved model
    (or whose differing fields the flags set) passes; one that does not is refused, its fields named."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)  # the tiny preset with an RK2 encoder
    flags = [*TINY_RUN, "--output_dir", str(tmp_path / "out"), "--train_file", "a,b",
             "--model_name_or_path", str(folder)]  # fmt: skip
    parse_arguments(flags)  # TINY_RUN gives --preset tiny: the saved model's own
    with pytest.raises(ValueError) as raised:
        parse_arguments([*flags, "--preset", "base"])
    assert str(raised.value).startswith(
        "--preset base sets d_model 512 (saved: 16), decoder_attention_heads 8 (saved: 2), decoder_ffn_dim 2048 "
        "(saved: 32), decoder_layers 6 (saved: 2), "
    )
    assert (
        f"{folder} is a saved model, whose config.json fixes its shape and method; leave --preset out"
        in str(raised.value)
    )
    shaped = ["--d_model", "16", "--encoder_ffn_dim", "32", "--decoder_ffn_dim", "32", "--encoder_layers", "2",
              "--decoder_layers", "2", "--encoder_attention_heads", "2", "--decoder_attention_heads", "2"]  # fmt: skip
    parse_arguments([*flags, "--preset", "base", *shaped])  # every differing field set (to the saved values)


def _foreign_entries(folder: Path) -> Path:
    """Give ``folder``'s config.json another project's auto_map entry, trust_remote_code and an unknown key, and
    put the code that entry names beside it: importing it leaves a marker file."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["auto_map"]["AutoTokenizer"] = ["evil.Evil", None]
    config.update(trust_remote_code=True, not_a_field=7)
    path.write_text(json.dumps(config))
    marker = folder.parent / "evil_ran"
    write(folder / "evil.py", f"open({str(marker)!r}, 'w').close()\nclass Evil: pass\n")
    return marker


def _assert_own_entries_only(folder: Path, marker: Path) -> None:
    from transformers import AutoTokenizer

    config = json.loads((folder / "config.json").read_text())
    assert "trust_remote_code" not in config and "not_a_field" not in config
    assert sorted(config["auto_map"]) == ["AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"]
    assert all(
        value.startswith(("configuration_ode", "modeling_ode")) for value in config["auto_map"].values()
    )
    write(folder / "evil.py", (folder.parent / "model" / "evil.py").read_text())  # dropped beside it later
    AutoTokenizer.from_pretrained(folder, trust_remote_code=True)  # what its card says to run
    assert not marker.exists()


@pytest.mark.both_cpus
def test_foreign_config_entries_are_not_carried_into_exported_or_trained_folders(tmp_path, caplog):
    """#44 row 4: ode-export and ode-train copied auto_map {AutoTokenizer: evil.Evil}, trust_remote_code and an
    unknown key into the new folder, whose own card's AutoTokenizer.from_pretrained(trust_remote_code=True) then
    failed (and had run evil.py, were it there)."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    marker = _foreign_entries(folder)
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.translate"):
        export_for_hub(folder, tmp_path / "exported")
    assert "dropped not_a_field, trust_remote_code, auto_map.AutoTokenizer, not this project's" in caplog.text
    _assert_own_entries_only(tmp_path / "exported", marker)
    src, tgt = corpus(tmp_path / "data")
    train_run(tmp_path / "trained", "--model_name_or_path", str(folder), "--train_file", f"{src},{tgt}",
              "--max_steps", "1")  # fmt: skip
    _assert_own_entries_only(tmp_path / "trained", marker)


@pytest.mark.both_cpus
def test_a_second_ode_train_into_one_folder_is_one_line(tmp_path, monkeypatch, capsys):
    """#44 row 5: the refusal was right, but a RuntimeError traceback with exit code 1, even from ode-train."""
    from ode_transformer.train.checkpoints import lock_output_dir

    out = tmp_path / "out"
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    monkeypatch.setattr(sys, "argv", ["ode-train", *TINY_RUN, "--output_dir", str(out), "--train_file",
                                      ",".join(corpus(tmp_path / "data"))])  # fmt: skip
    with lock_output_dir(out), pytest.raises(SystemExit) as exit_:  # the first run, holding the folder
        cli.train()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"ode-train: error: {out} is in use by another run (pid {os.getpid()}); wait for it to finish or stop it, "
        "or choose another --output_dir."
    )


INTERRUPTED_PHASES = {  # phase: (flags, the marker that the phase has begun, the advice)
    "training": (["--max_steps", "100000", "--save_strategy", "steps", "--save_steps", "1"], "checkpoint-1",
                 "{out} keeps checkpoint-{n}: continue the run with the same command and --resume_from_checkpoint last"),
    "test decoding": (["--max_steps", "1", "--do_predict", "true", "--disable_tqdm", "false", "--num_beams", "1",
                       "--per_device_eval_batch_size", "1"], "sent/s]",
                      "the trained model is saved in {out}, but no checkpoint to resume from: test it with --do_train "
                      "false --model_name_or_path {out}, or train again with --overwrite_output_dir true"),
}  # fmt: skip


@pytest.mark.parametrize("phase", list(INTERRUPTED_PHASES))
def test_ctrl_c_in_ode_train_says_how_to_go_on(tmp_path, phase):
    """#44 rows 6 and 7: Ctrl-C during training or the test decoding printed a KeyboardInterrupt traceback."""
    flags, marker, advice = INTERRUPTED_PHASES[phase]
    src, tgt = corpus(tmp_path / "data")
    test_src = write(
        tmp_path / "test.src", "the dog number 3 runs\n" * 5000
    )  # minutes of decoding, one by one
    out = tmp_path / "out"
    argv = [*TINY_RUN, "--output_dir", str(out), "--train_file", f"{src},{tgt}", "--test_file",
            f"{test_src},{test_src}", "--tokenizer_name", tokenizer_folder(tmp_path / "tok"), *flags]  # fmt: skip
    process = start(command("ode-train", *argv))
    try:
        seen = read_until(process, marker.encode(), path=out / marker if phase == "training" else None)
        code, stderr = interrupt(process, seen)
    finally:
        process.kill()
    assert code == 130
    last = assert_one_line(stderr, "ode-train: interrupted; ")
    steps = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert last == "ode-train: interrupted; " + advice.format(out=out, n=steps[-1] if steps else None)
    assert not (out / ".run.lock").exists() and not (out / ".run.pid").exists()
    assert not (out / "hub_metrics.json").exists()


KILL_DURING = {  # tool: (what is replaced by a SIGKILL of the process, its command line given the folders)
    "export": (
        "ode_transformer.hub.model_card.write_model_card",
        lambda model, out: ["ode_transformer.hub.export", str(model), str(out)],
    ),
    "averaging": (
        "safetensors.torch.save_file",
        lambda run, out: ["ode_transformer.train.averaging", str(run), "--out", str(out)],
    ),
}
KILLED_RUN = """
import importlib, os, runpy, signal, sys
module, name = sys.argv[1].rsplit(".", 1)
setattr(importlib.import_module(module), name, lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL))
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__")
"""


@pytest.mark.both_cpus
@pytest.mark.parametrize("tool", list(KILL_DURING))
def test_export_and_averaging_rerun_after_a_kill(tmp_path, capsys, tool):
    """#44 rows 9 and 10: after a kill, `python -m ode_transformer.hub.export` / `python -m ode_transformer.train.averaging` again gave a raw
    FileExistsError traceback, and nothing marked the folder left behind as incomplete."""
    from ode_transformer.hub import export

    target, argv = KILL_DURING[tool]
    source = tmp_path / "model"
    save_tiny_folder(source)
    if tool == "averaging":
        source = tmp_path / "run"
        for step in (1, 2):
            save_tiny_folder(source / f"checkpoint-{step}")
            (source / f"checkpoint-{step}" / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    out = tmp_path / "out"
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, target, *argv(source, out)], cwd=ROOT)
    assert killed.returncode == -signal.SIGKILL
    assert not out.exists() and (tmp_path / "out.incomplete").is_dir()  # named for what it is
    main = export.main if tool == "export" else averaging.main
    main(argv(source, out)[1:])  # the rerun: python -m runs main
    assert (out / "model.safetensors").is_file() and not (tmp_path / "out.incomplete").exists()
    assert not list(tmp_path.glob(".out.*"))  # lock files released
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # a third time: the folder is occupied, said in one line
        main(argv(source, out)[1:])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m {argv(source, out)[0]}: error: {out} already holds files (")
    assert "pass --overwrite to delete it first" in err and len(err.splitlines()) == 1


@pytest.mark.both_cpus
@pytest.mark.parametrize(
    ("name", "damage", "what"),
    [
        ("tokenizer.json", lambda data: data[: len(data) // 2], "not valid JSON ("),
        ("tokenizer_config.json", lambda data: b"\xe8\x00garbage" + data, "not UTF-8 text"),
    ],
    ids=["truncated tokenizer.json", "garbage tokenizer_config.json"],
)
def test_a_damaged_tokenizer_file_is_named_with_the_fix(tmp_path, name, damage, what):
    """#44 row 11: "Expecting ',' delimiter: line 267 column 15" or "'utf-8' codec can't decode byte 0xe8", naming
    neither the file nor a fix."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    path = folder / name
    path.write_bytes(damage(path.read_bytes()))
    message = f"^{re.escape(str(path))} is {re.escape(what)}.*; copy it again from the folder the tokenizer was saved in"
    src = write(tmp_path / "in.txt", "the dog\n")
    assert_translate_and_train_refuse(folder, src, tmp_path / "out", message)
    with pytest.raises(ValueError, match=message):
        export_for_hub(folder, tmp_path / "exported")
    assert not (tmp_path / "out").exists() and not (tmp_path / "exported").exists()


@pytest.mark.both_cpus
def test_a_saved_model_with_non_finite_weights_is_refused_before_training(tmp_path):
    """#44 row 12: it trained, then stopped with a FloatingPointError advising a lower learning rate; the
    weights were NaN before training."""
    folder = tmp_path / "model"
    model, _ = save_tiny_folder(folder)
    with torch.no_grad():
        model.model.shared.weight[5, 0] = float("nan")
    model.save_pretrained(folder)
    out = tmp_path / "out"
    with pytest.raises(
        ValueError, match=f"^{folder} holds non-finite weights .* in 1 tensors .*shared.weight"
    ):
        train_run(
            out, "--model_name_or_path", str(folder), "--train_file", ",".join(corpus(tmp_path / "data"))
        )
    assert not out.exists()


@pytest.mark.both_cpus
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("learning_rate: [0.1]\n", "learning_rate: [0.1] is a list; give one value (`learning_rate: VALUE`)"),
        ("max_steps: 1.5\n", "max_steps: 1.5 is not a valid max_steps (it takes int)"),
        (
            "learning_rate: 0.1\nmax_steps 3\nwarmup_steps: 1\n",
            "is not valid YAML (could not find expected ':' at line 3, column 1)",
        ),
        ("- learning_rate\n", "holds a list, not a mapping of flags to values"),
    ],
    ids=["list for a number", "fraction for a count", "syntax error", "not a mapping"],
)
def test_a_bad_recipe_is_one_line_naming_it(tmp_path, capsys, monkeypatch, text, message):
    """#44 rows 13 and 14: a raw TypeError (from inside transformers) and a yaml.scanner.ScannerError traceback."""
    recipe = write(tmp_path / "recipe.yaml", text)
    flags = [str(recipe), *TINY_RUN, "--output_dir", str(tmp_path / "out"), "--train_file", "a,b"]
    with pytest.raises(ValueError) as raised:
        parse_arguments(flags)
    assert str(raised.value).startswith(f"recipe {recipe}") and message in str(raised.value)
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit_:  # python -m ode_transformer.train.run (ode-train: the same line)
        ode_transformer.train.run.main(flags)
    assert exit_.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == f"python -m ode_transformer.train.run: error: {raised.value}"
    )


FULL_DISK_OPTIMIZER = """
import os, resource, signal, sys
import torch
from ode_transformer.train.files import saving
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.AdamW(model.parameters())
model(torch.randn(2, 64)).sum().backward()
optimizer.step()
path = sys.argv[1]
torch.save(optimizer.state_dict(), path)  # how large the file is
size = os.path.getsize(path)
os.remove(path)
resource.setrlimit(resource.RLIMIT_FSIZE, (size - 1000, resource.RLIM_INFINITY))  # the disk fills at its end
with saving(path):
    torch.save(optimizer.state_dict(), path)  # as the trainer saves optimizer.pt
"""


def test_a_full_disk_while_optimizer_pt_is_written_is_named(tmp_path):
    """#44 row 15: 'RuntimeError: basic_ios::clear: iostream error' (torch.save's zip writer failing at its final
    flush), not named as a full disk."""
    path = tmp_path / "optimizer.pt"
    result = subprocess.run([sys.executable, "-c", FULL_DISK_OPTIMIZER, str(path)], cwd=ROOT, capture_output=True,
                            text=True)  # fmt: skip
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"OSError: [Errno 28] no space left on device while saving {path} (basic_ios::clear"
    ), result.stderr
    assert "free some space" in last


class Payload:
    """Unpickling it would run a shell command (it leaves a marker file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.both_cpus
def test_a_pickle_payload_in_the_weights_is_refused_by_name(tmp_path):
    """#44 row 16: a pickle pytorch_model.bin as the only weights: the payload did not run (torch's weights_only
    load), but the result was a raw UnpicklingError traceback."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    state = load_file(folder / "model.safetensors")
    torch.save({**state, "extra": Payload(tmp_path / "ran")}, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    src = write(tmp_path / "in.txt", "the dog\n")
    message = (
        f"^{re.escape(str(folder / 'pytorch_model.bin'))} holds objects other than tensors and plain values "
        r"\(.*GLOBAL posix.system.*\): it is not loaded, since unpickling it could run code; convert weights you trust"
    )
    assert_translate_and_train_refuse(folder, src, tmp_path / "out", message)
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()


@pytest.mark.both_cpus
def test_a_pickle_payload_in_a_checkpoint_is_refused_by_name(tmp_path):
    """#44 row 17: a payload in a checkpoint's rng_state, optimizer or scheduler stopped the resumed run with a raw
    UnpicklingError traceback (not running it). Now refused before anything else, naming the file; training_args.bin
    is not read back, so the run resumes without running its payload."""
    data = ",".join(corpus(tmp_path / "data"))
    out = tmp_path / "out"
    flags = ["--train_file", data, "--save_strategy", "steps", "--save_steps", "1", "--max_steps", "2"]
    train_run(out, *flags)
    (out / "trainer_state.json").unlink()  # the run did not finish: it resumes from checkpoint-2
    checkpoint, ran = out / "checkpoint-2", tmp_path / "ran"
    for name in ("rng_state.pth", "optimizer.pt", "scheduler.pt"):
        original = (checkpoint / name).read_bytes()
        torch.save({"state": Payload(ran)}, checkpoint / name)
        with pytest.raises(ValueError) as raised:
            train_run(out, *flags, "--resume_from_checkpoint", "last")
        assert str(raised.value).startswith(
            f"{checkpoint / name} holds objects other than tensors and plain values (Trying to load unsupported "
            "GLOBAL posix.system"
        )
        assert "resume from another checkpoint (its folder as --resume_from_checkpoint)" in str(raised.value)
        (checkpoint / name).write_bytes(original)
    torch.save({"args": Payload(ran)}, checkpoint / "training_args.bin")
    train_run(out, *flags, "--resume_from_checkpoint", "last")
    assert not ran.exists() and (out / "trainer_state.json").is_file()


# --------------------------------------------------------------------------------------------
# Issue 56: a finished run's results are never replaced; what a model folder holds is checked before use

EVALUATE = ["--do_train", "false", "--do_predict", "true", "--num_beams", "1", "--max_target_length", "8"]


@pytest.mark.both_cpus
def test_an_evaluation_into_a_finished_run_keeps_its_results_and_holds_the_lock(
    tmp_path, monkeypatch, capsys
):
    """#56 row 1: `ode-train --do_train false --do_predict true --model_name_or_path RUN --output_dir RUN` replaced
    the run's hub_metrics.json (its training section gone), hypotheses and scores, rc 0, with no lock."""
    from ode_transformer.train.checkpoints import lock_output_dir
    from ode_transformer.train.files import InUseError

    data = ",".join(corpus(tmp_path / "data"))
    finished = tmp_path / "run"
    train_run(finished, "--train_file", data, "--test_file", data, *EVALUATE[2:])
    assert "training" in json.loads((finished / "hub_metrics.json").read_text(encoding="utf-8"))
    before = snapshot(finished)
    evaluate = ["--model_name_or_path", str(finished), "--test_file", data, *EVALUATE]
    message = (
        f"{finished} already holds the results of a training run that this evaluation would replace "
        "(hub_metrics.json, test_hypotheses.txt, test_results.json); write the evaluation into a fresh "
        "--output_dir, or pass --overwrite_output_dir true to replace them"
    )
    with pytest.raises(FileExistsError, match=f"^{re.escape(message)}$"):
        train_run(finished, *evaluate)
    assert snapshot(finished) == before
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    monkeypatch.setattr(sys, "argv", ["ode-train", *TINY_RUN, "--output_dir", str(finished), *evaluate])
    with pytest.raises(SystemExit) as exit_:
        cli.train()
    assert exit_.value.code == 2 and capsys.readouterr().err.splitlines()[-1].startswith(
        f"ode-train: error: {message}"
    )
    assert snapshot(finished) == before

    fresh = tmp_path / "evaluation"
    with (
        lock_output_dir(fresh),
        pytest.raises(InUseError, match=f"^{re.escape(str(fresh))} is in use by another run"),
    ):
        train_run(fresh, *evaluate)  # a second writer of the folder is refused, as a second training run is
    document = train_run(fresh, *evaluate)
    assert "training" not in document and (fresh / "test_hypotheses.txt").is_file()
    assert not any((fresh / name).exists() for name in (".run.lock", ".run.pid"))

    train_run(
        finished, *evaluate, "--overwrite_output_dir", "true"
    )  # asked for: replaced, nothing else deleted (what training wrote stays: #65 row 8)
    assert (finished / "model.safetensors").read_bytes() == before["model.safetensors"][0]


def _raw_pickle(path: Path, payload: object) -> None:
    import pickle

    path.write_bytes(pickle.dumps({"state": payload}))


def _legacy_torch(path: Path, payload: object) -> None:
    torch.save({"state": payload}, path, _use_new_zipfile_serialization=False)


def _cut(path: Path, _payload: object) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


CHECKPOINT_DAMAGE = {  # file, damage, the start of what is said about it
    "raw pickle rng_state": ("rng_state.pth", _raw_pickle, "holds objects other than tensors and plain values ("),
    "legacy torch optimizer": ("optimizer.pt", _legacy_torch, "holds objects other than tensors and plain values ("),
    "legacy torch scheduler": ("scheduler.pt", _legacy_torch, "holds objects other than tensors and plain values ("),
    "truncated optimizer": ("optimizer.pt", _cut, "cannot be read (PytorchStreamReader failed reading zip archive"),
    "empty rng_state": ("rng_state.pth", lambda path, _: path.write_bytes(b""), "cannot be read (EOFError)"),
    "truncated weights": ("model.safetensors", _cut, "is truncated or not a safetensors file (it holds "),
}  # fmt: skip


@pytest.mark.both_cpus
def test_a_checkpoint_file_in_any_pickle_format_or_cut_off_is_refused_by_name(tmp_path):
    """#56 rows 12 and 13: a payload in a raw-pickle or legacy (non-zip) torch file passed the up-front check (it
    skipped non-zip files) and stopped the run with a 43-line UnpicklingError suggesting weights_only=False; a
    cut-off optimizer.pt or model.safetensors gave `[Errno 22] Invalid argument` or `incomplete metadata`, the
    file not named. Now each is refused before anything runs, by name, with the fix; nothing is unpickled."""
    data = ",".join(corpus(tmp_path / "data"))
    out = tmp_path / "out"
    flags = ["--train_file", data, "--save_strategy", "steps", "--save_steps", "1", "--max_steps", "2"]
    train_run(out, *flags)
    (out / "trainer_state.json").unlink()  # the run did not finish: it resumes from checkpoint-2
    checkpoint, ran = out / "checkpoint-2", tmp_path / "ran"
    for name, damage, said in CHECKPOINT_DAMAGE.values():
        original = (checkpoint / name).read_bytes()
        damage(checkpoint / name, Payload(ran))
        with pytest.raises(ValueError) as raised:
            train_run(out, *flags, "--resume_from_checkpoint", "last")
        message = str(raised.value)
        assert message.startswith(f"{checkpoint / name} {said}"), message
        assert message.endswith(
            "resume from another checkpoint (its folder as --resume_from_checkpoint), or start the run again with "
            "--overwrite_output_dir true"
        )
        assert "weights_only" not in message and "\n" not in message
        (checkpoint / name).write_bytes(original)
    assert not ran.exists()
    train_run(out, *flags, "--resume_from_checkpoint", "last")  # the files restored: it resumes
    assert (out / "trainer_state.json").is_file()


@pytest.mark.both_cpus
def test_a_config_json_of_a_hostile_size_or_the_wrong_shape_is_refused_before_allocating(
    tmp_path, monkeypatch
):
    """#56 row 15: `vocab_size` 2e8 in config.json allocated 12.8 GB before any check; a JSON list gave a raw
    TypeError from inside transformers. Both are now refused by name before the model is built."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    src = write(tmp_path / "in.txt", "the dog\n")

    def never(*_args, **_kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(ODETransformerForConditionalGeneration, "from_pretrained", never)
    config_path.write_text(json.dumps({**config, "vocab_size": 200_000_000}), encoding="utf-8")
    message = (
        f"^{re.escape(str(config_path))} asks for a model of [0-9,]+ parameters \\(vocab_size 200000000, .*\\), but "
        f"{re.escape(str(folder / 'model.safetensors'))} holds [0-9,]+: the config does not describe these weights.*"
        "; copy config.json again from the folder the model was saved in$"
    )
    with pytest.raises(ValueError, match=message):
        translate.main([str(folder), "--input", str(src), "--no_progress"])
    with pytest.raises(ValueError, match=message):
        export_for_hub(folder, tmp_path / "exported")

    config_path.write_text(json.dumps([config]), encoding="utf-8")
    message = (
        f"^{re.escape(str(config_path))} holds a JSON list, not an object of fields .*; copy it again from"
    )
    assert_translate_and_train_refuse(folder, src, tmp_path / "out", message)
    assert not (tmp_path / "out").exists() and not (tmp_path / "exported").exists()


# --------------------------------------------------------------------------------------------
# Issue 56 rows 3-9, 17-19 and issue 55 items 8-10: what a folder lets through, how files are written


def _foreign_tokenizer(folder: Path, tokenizer_class: str) -> Path:
    """Give ``folder``'s tokenizer_config.json ``tokenizer_class`` and another project's auto_map, with the code
    it names beside it: importing it leaves a marker file."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(tokenizer_class=tokenizer_class, auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    path.write_text(json.dumps(config))
    marker = folder.parent / "evil_tokenizer_ran"
    code = f"open({str(marker)!r}, 'w').close()\nfrom transformers import PreTrainedTokenizerFast\n"
    write(folder / "evil.py", code + "class EvilTokenizer(PreTrainedTokenizerFast): pass\n")
    return marker


def _assert_standard_tokenizer(folder: Path, marker: Path) -> None:
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert "auto_map" not in config
    assert tokenizer_class_from_name(config["tokenizer_class"]) is not None  # transformers' own class
    write(folder / "evil.py", (folder.parent / "model" / "evil.py").read_text())  # dropped beside it later
    AutoTokenizer.from_pretrained(folder, trust_remote_code=True)  # what its card says to run
    assert not marker.exists()


@pytest.mark.both_cpus
def test_a_foreign_tokenizer_auto_map_is_not_carried_into_exported_or_trained_folders(tmp_path, caplog):
    """#56 row 3: tokenizer_config.json's auto_map (another project's tokenizer code) was copied by
    ode-export and ode-train; the card's own AutoTokenizer.from_pretrained(trust_remote_code=True) then ran it.
    A saved tokenizer names transformers' own fast class and carries no auto_map."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    marker = _foreign_tokenizer(folder, "EvilTokenizer")
    with caplog.at_level(logging.WARNING):
        export_for_hub(folder, tmp_path / "exported")
    assert "tokenizer_config.json: dropped auto_map" in caplog.text and "'EvilTokenizer'" in caplog.text
    _assert_standard_tokenizer(tmp_path / "exported", marker)
    # ode-train loads a tokenizer of transformers' own class (another one needs the remote code: refused there),
    # and saved its auto_map with it
    _foreign_tokenizer(folder, "PreTrainedTokenizerFast")
    src, tgt = corpus(tmp_path / "data")
    train_run(tmp_path / "trained", "--model_name_or_path", str(folder), "--train_file", f"{src},{tgt}",
              "--max_steps", "1")  # fmt: skip
    config = json.loads((tmp_path / "trained" / "tokenizer_config.json").read_text())
    assert "auto_map" not in config
    assert not marker.exists()


def test_an_exported_card_names_neither_the_staging_folder_nor_a_local_path(tmp_path):
    """#56 row 4: without --repo-id the card said `name: OUT.incomplete` and from_pretrained("path/to/OUT.incomplete")."""
    save_tiny_folder(tmp_path / "model")
    (tmp_path / "model" / "README.md").unlink(missing_ok=True)
    out = export_for_hub(tmp_path / "model", tmp_path / "my-model")
    card = (out / "README.md").read_text()
    assert ".incomplete" not in card and str(tmp_path) not in card
    assert 'from_pretrained("path/to/my-model"' in card or "path/to/my-model" in card
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "my-model"]  # no scratch folder left
    # the card is written in a scratch copy: the tokenizer's files go with it, so it states the trained length
    limit = json.loads((out / "tokenizer_config.json").read_text())["model_max_length"]
    assert f"trained on inputs of up to {limit} tokens" in card, card
    # ... and the exported tokenizer.json truncates to it too (tokenizers-only deployments read that)
    assert json.loads((out / "tokenizer.json").read_text())["truncation"]["max_length"] == limit


def _training_folder(folder: Path) -> Path:
    save_tiny_folder(folder)
    (folder / "checkpoint-2").mkdir()
    for name in ("optimizer.pt", "rng_state.pth", "model.safetensors"):
        write(folder / "checkpoint-2" / name, "x")
    write(folder / "trainer_state.json", "{}")
    write(folder / "training_args.bin", "pickle")
    return folder


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "push"])
def test_push_refuses_a_training_folder_naming_what_would_leave(tmp_path, monkeypatch, capsys, dry_run):
    """#56 row 5: ode-push of a training folder listed (and would upload) its checkpoints, optimizer states and
    pickled training arguments, with no warning."""
    import huggingface_hub

    folder = _training_folder(tmp_path / "run")
    monkeypatch.setattr(huggingface_hub, "HfApi", None)  # nothing may reach the network code
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    argv = ["ode-push", str(folder), "--repo-id", "u/n", *(["--dry-run"] if dry_run else [])]
    monkeypatch.setattr(sys, "argv", argv)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli.push()
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"ode-push: error: {folder} is a training folder: 5 of its files are training state, not the model "
        "(checkpoint-2/, trainer_state.json, training_args.bin), and would leave the machine; export it first "
        f"(ode-export {folder} OUT_DIR) and push OUT_DIR\n"
    )
    export_for_hub(folder, tmp_path / "exported")  # what the message says to do
    monkeypatch.setattr(
        sys, "argv", ["ode-push", str(tmp_path / "exported"), "--repo-id", "u/n", "--dry-run"]
    )
    with pytest.raises(SystemExit) as exit_:
        cli.push()
    assert exit_.value.code == 0 and "checkpoint" not in capsys.readouterr().out


class ConnectError(Exception):
    """As httpx names the failure to connect (huggingface_hub's HTTP client)."""


def test_push_without_network_is_one_line_and_exit_code_2(tmp_path, monkeypatch, capsys):
    """#56 row 17, #55 item 8: no network and HF_HUB_OFFLINE unset gave a 60-line httpx ConnectError traceback
    and exit code 1. (The Hub client is patched to fail as it does offline: no real network.)"""
    import huggingface_hub

    class OfflineApi:
        def create_repo(self, *args, **kwargs):
            try:
                raise OSError("[Errno -3] Temporary failure in name resolution")
            except OSError as error:
                raise ConnectError("[Errno -3] Temporary failure in name resolution") from error

    save_tiny_folder(tmp_path / "model")
    export_for_hub(tmp_path / "model", tmp_path / "exported")
    monkeypatch.setattr(huggingface_hub, "HfApi", OfflineApi)
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    monkeypatch.setattr(sys, "argv", ["ode-push", str(tmp_path / "exported"), "--repo-id", "u/n"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli.push()
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "ode-push: error: could not reach the Hugging Face Hub to push u/n (ConnectError: [Errno -3] Temporary "
        "failure in name resolution); check the network (or HF_ENDPOINT, a proxy) and run the command again; "
        "--dry-run lists the files without it\n"
    )


def test_a_symlinked_output_is_written_through_to_its_target(tmp_path):
    """#56 row 6: `--output LINK` replaced the link by a regular file; its target kept the old content. Every
    file writer (write_atomic, replacing) and folder writer (staged_folder) writes through the link."""
    from ode_transformer.train.files import staged_folder, write_atomic

    target = write(tmp_path / "real.txt", "old\n")
    link = tmp_path / "out.txt"
    link.symlink_to(target)
    write_atomic(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target) and target.read_text() == "new\n"
    dangling = tmp_path / "later.txt"
    dangling.symlink_to(tmp_path / "created.txt")  # a link to a file not written yet
    write_atomic(dangling, "x\n")
    assert dangling.is_symlink() and (tmp_path / "created.txt").read_text() == "x\n"

    (tmp_path / "folder").mkdir()
    write(tmp_path / "folder" / "a.txt", "old")
    (tmp_path / "folder-link").symlink_to(tmp_path / "folder")
    with staged_folder(tmp_path / "folder-link") as staged:
        write(staged / "a.txt", "new")
    assert (tmp_path / "folder-link").is_symlink() and (tmp_path / "folder" / "a.txt").read_text() == "new"


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_files_get_the_modes_the_umask_gives(tmp_path, umask):
    """#56 row 7: model.safetensors was written 0600 (safetensors' own temporary file) while every other file was
    0644: another user could not read an exported model. Folders written whole and files written whole get the
    modes open() and mkdir give under the umask."""
    from ode_transformer.train.files import replacing

    save_tiny_folder(tmp_path / "model")
    old = os.umask(umask)
    try:
        out = export_for_hub(tmp_path / "model", tmp_path / "exported")
        with replacing(tmp_path / "weights.safetensors") as temporary:
            save_file({"w": torch.zeros(2)}, temporary)
    finally:
        os.umask(old)
    modes = {
        p.name: p.stat().st_mode & 0o777 for p in [out, *out.rglob("*"), tmp_path / "weights.safetensors"]
    }
    wanted = {name: (0o777 if name == "exported" else 0o666) & ~umask for name in modes}
    assert modes == wanted


def test_a_trained_runs_final_model_gets_the_umask_modes(end_phase_run):
    """#56 row 7 for ode-train: its final model.safetensors was 0600 while config.json was 0644."""
    folder, _ = end_phase_run
    mask = os.umask(0)
    os.umask(mask)
    modes = {name: (folder / name).stat().st_mode & 0o777 for name in ("model.safetensors", "config.json")}
    assert modes == dict.fromkeys(modes, 0o666 & ~mask)


def _version(folder: Path) -> str:
    """Which export a folder is, read from its two files: a mix of two exports reads as 'mixed'."""
    config, weights = (folder / "config.json").read_text(), (folder / "model.safetensors").read_text()
    return config if config == weights else "mixed"


@pytest.mark.parametrize("kill_at", range(4))
def test_a_folder_is_replaced_whole_and_a_kill_at_any_step_leaves_one_version(
    tmp_path, monkeypatch, caplog, kill_at
):
    """#56 rows 8 and 9: between the two renames of `ode-export --overwrite`, the folder was missing (a reader got
    one export's config.json with the other's weights; a kill left no folder, and `OUT.incomplete.old`, which the
    rerun neither named nor removed). Now the old and new folders swap in one rename: at every step the folder
    is one version whole, a kill leaves one in place, and the next write removes and names what was left."""
    import shutil

    from ode_transformer.train import files

    final = tmp_path / "out"
    final.mkdir()
    for name in ("config.json", "model.safetensors"):
        write(final / name, "old")
    seen, steps = [], []

    def step(name, original):
        def wrapped(*args, **kwargs):
            result = original(*args, **kwargs)
            seen.append(_version(final))  # what a reader finds after this step
            steps.append(name)
            if len(steps) > kill_at:
                raise Killed
            return result

        return wrapped

    monkeypatch.setattr(Path, "rename", step("rename", Path.rename))
    monkeypatch.setattr(files, "_exchange", step("exchange", files._exchange))
    monkeypatch.setattr(shutil, "rmtree", step("rmtree", shutil.rmtree))
    staged = tmp_path / "out.incomplete"
    staged.mkdir()
    for name in ("config.json", "model.safetensors"):
        write(staged / name, "new")
    with contextlib.suppress(Killed):
        files.replace_folder(staged, final)
    monkeypatch.undo()
    assert set(seen) <= {"old", "new"}, (steps, seen)
    assert _version(final) in ("old", "new")
    with caplog.at_level(logging.WARNING), files.staged_folder(final) as again:  # the rerun
        for name in ("config.json", "model.safetensors"):
            write(again / name, "newer")
    assert _version(final) == "newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    for left in ("out.incomplete", "out.incomplete.old"):
        if f"{left}:" in caplog.text:
            assert f"removing {tmp_path / left}: left by an interrupted write of {final}" in caplog.text


def test_a_full_disk_when_the_lock_is_taken_is_named(tmp_path, monkeypatch):
    """#56 row 18: with 0 bytes free, the lock's pid file failed first, as a bare `[Errno 28] No space left on
    device`: no path, no fix."""
    import errno

    from ode_transformer.train.files import claim_output

    original = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.endswith(".pid"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    output = write(tmp_path / "out.txt", "old\n")
    message = rf"no space left on device while saving {re.escape(str(output))} .*free some"
    with pytest.raises(OSError, match=message), claim_output(output, "--output"):
        pass
    monkeypatch.undo()
    assert output.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_tracebacks_are_kept_only_for_unexpected_errors_and_do_not_pile_up(tmp_path, monkeypatch, capsys):
    """#56 row 19: every refusal, even "in use by another run", left a /tmp/ode-*.traceback file (50 in one round).
    A refusal raised by the project's own checks keeps none; an error from inside a library keeps one, and only
    the newest cli.KEPT_TRACEBACKS are kept."""
    import tempfile

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    for index in range(cli.KEPT_TRACEBACKS + 3):  # old ones, oldest first
        old = write(temporary / f"ode-translate-old{index}.traceback", "old")
        os.utime(old, (1_000_000 + index, 1_000_000 + index))
    missing = tmp_path / "missing"
    monkeypatch.setattr(
        sys, "argv", ["ode-translate", str(missing), "--input", str(write(tmp_path / "in", "a\n"))]
    )
    with pytest.raises(SystemExit):
        cli.translate()  # a refusal: no model folder
    assert capsys.readouterr().err.endswith("(USER/NAME)\n")
    assert len(list(temporary.iterdir())) == cli.KEPT_TRACEBACKS + 3  # nothing added, nothing pruned yet

    def library_failure():
        json.loads("{")  # raised inside the standard library: unexpected, worth a traceback

    monkeypatch.setattr(translate, "main", library_failure)
    with pytest.raises(SystemExit) as exit_:
        cli.translate()
    assert exit_.value.code == 2
    kept = kept_traceback(capsys.readouterr().err, r"ode-translate: error: Expecting property name .*")
    assert "json.loads" in kept.read_text()
    left = sorted(p.name for p in temporary.iterdir())
    assert len(left) == cli.KEPT_TRACEBACKS and kept.name in left
    assert "ode-translate-old0.traceback" not in left and "ode-translate-old12.traceback" in left


def test_a_builtin_failing_on_a_project_line_is_unexpected_and_keeps_its_traceback():
    """A refusal is a `raise` of the project's own; a builtin failing on one of its lines (a KeyError, a zip of
    unequal lengths) is an unexpected error, whose traceback is kept."""
    from ode_transformer.train import data

    with pytest.raises(KeyError) as builtin:
        data._get_field({}, "missing")
    assert not cli.raised_by_own_check(builtin.value)
    with pytest.raises(ValueError) as own:
        data._file_pair("a,b,c")
    assert cli.raised_by_own_check(own.value)


def test_translate_max_new_tokens_caps_without_the_both_set_warning(tmp_path, monkeypatch):
    """#55 item 10: `ode-translate MODEL --max_new_tokens 20` made transformers warn that both max_new_tokens and
    max_length (the saved generation config's) were set."""
    import transformers.generation.utils

    save_tiny_folder(tmp_path / "model", weight_scale=3)  # its generation config has max_length 9
    warnings = []
    monkeypatch.setattr(
        transformers.generation.utils.logger,
        "warning",
        lambda message, *a, **k: warnings.append(str(message)),
    )
    source = write(tmp_path / "in.txt", "the dog runs in the park\na cat\n")
    model, tokenizer = translate.load_for_generation(str(tmp_path / "model"), "cpu")
    ids = [tokenizer(line)["input_ids"] for line in read_lines(source)]
    for new_tokens in (2, 5):
        outputs = translate.generate_ids(model, ids, num_beams=1, max_new_tokens=new_tokens)
        longest = max(len(output) for output in outputs)
        assert longest == 1 + new_tokens  # the decoder's start token + new tokens (the random model runs on)
    translate.main([str(tmp_path / "model"), "--input", str(source), "--output", str(tmp_path / "out.txt"),
                    "--max_new_tokens", "3", "--no_progress"])  # fmt: skip
    assert not [w for w in warnings if "max_new_tokens" in w], warnings


@pytest.mark.both_cpus
def test_divergence_is_one_line_and_a_nan_checkpoint_is_refused_without_blaming_the_learning_rate(
    tmp_path, monkeypatch, capsys
):
    """#56 row 16: divergence printed a 37-line traceback before the clear "training diverged at step 2" line, and
    resuming from a checkpoint with NaN weights blamed the learning rate."""
    data = ",".join(corpus(tmp_path / "data"))
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    diverging = [
        *TINY_RUN,
        "--output_dir",
        str(tmp_path / "diverged"),
        "--train_file",
        data,
        "--learning_rate",
        "1e6",
        "--warmup_steps",
        "0",  # the full rate from the first step (a run's default warms up over a fifth of its steps)
    ]
    with pytest.raises(SystemExit) as exit_:
        ode_transformer.train.run.main(diverging)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].startswith(
        "python -m ode_transformer.train.run: error: training diverged at step 2"
    )

    out = tmp_path / "out"
    flags = ["--train_file", data, "--save_strategy", "steps", "--save_steps", "1", "--max_steps", "2"]
    train_run(out, *flags)
    (out / "trainer_state.json").unlink()  # the run did not finish: it resumes from checkpoint-2
    weights_file = out / "checkpoint-2" / "model.safetensors"
    state = load_file(weights_file)
    state["model.shared.weight"][3, 0] = float("nan")
    save_file(state, weights_file, metadata={"format": "pt"})
    with pytest.raises(ValueError) as raised:
        train_run(out, *flags, "--resume_from_checkpoint", "last")
    message = str(raised.value)
    assert message.startswith(
        f"{weights_file} holds non-finite weights (NaN or infinity) in 1 tensors (model.shared.weight): the run had "
        "diverged before this checkpoint was saved"
    ), message
    assert "resume from an earlier checkpoint" in message and "learning_rate" not in message


@pytest.mark.both_cpus
@pytest.mark.parametrize(
    ("name", "change", "said"),
    [
        ("generation_config.json", {"max_length": -1}, ": max_length -1 is not a whole number of at least 1; "),
        ("generation_config.json", {"num_beams": 0}, ": num_beams 0 is not a whole number of at least 1; "),
        ("generation_config.json", {"length_penalty": "abc"}, ": length_penalty 'abc' is not a number; "),
        ("tokenizer_config.json", [], " holds a JSON list, not an object of tokenizer fields; copy it again"),
        ("tokenizer_config.json", {"eos_token": 7}, ": eos_token (a string) is of another type; copy it again"),
        ("tokenizer.json", {"added_tokens": None}, ": added_tokens (a list) is missing or of another type; copy it"),
        ("tokenizer.json", {"model": {"type": "BPE", "vocab": 3}}, " is not a tokenizer ("),
        ("tokenizer.json", [], " holds a JSON list, not an object of tokenizer fields; copy it again"),
    ],
    ids=["max_length -1", "num_beams 0", "length_penalty abc", "tokenizer_config list", "eos_token number",
         "tokenizer.json without added_tokens", "tokenizer.json model of another shape", "tokenizer.json list"],
)  # fmt: skip
def test_a_generation_config_or_tokenizer_file_of_the_wrong_shape_is_named(tmp_path, name, change, said):
    """#56 rows 10 and 14: valid JSON of the wrong shape gave ~40-line tracebacks (`'list' object has no attribute
    'get'`, `KeyError: 'added_tokens'`, a raw ZeroDivisionError or TypeError) or transformers' message, the file
    not named."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    path = folder / name
    if isinstance(change, dict):
        data = json.loads(path.read_text(encoding="utf-8"))
        data.update(change)
        data = {k: v for k, v in data.items() if v is not None}
    else:
        data = change
    path.write_text(json.dumps(data), encoding="utf-8")
    message = f"^{re.escape(str(path) + said)}"
    src = write(tmp_path / "in.txt", "the dog\n")
    assert_translate_and_train_refuse(folder, src, tmp_path / "out", message)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------
# Issue 65: one lock per real folder, exports that cannot eat their source, a test split that is one

EXPORTED = sorted(
    [
        "README.md",
        "compat.py",
        "config.json",
        "configuration_ode_transformer.py",
        "generation_config.json",
        "model.safetensors",
        "modeling_ode_transformer.py",
        "ode.py",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
)


def last_line(stderr: bytes) -> str:
    text = stderr.decode(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    return text.strip().splitlines()[-1]


def test_two_exports_into_one_folder_by_two_names_take_one_lock(tmp_path):
    """#65 row 1: `ode-export SA runs/E9 --overwrite & ode-export SB runs/E9link --overwrite` (E9link a link to
    E9) took two locks and wrote one staging folder, each deleting the other's: one exited 0 leaving a folder of
    README.md and tokenizer.json only. Every lock derives from the resolved path: one writer at a time."""
    from modeling_ode.modeling_ode_transformer import weights_digest
    from ode_transformer.train.files import claim_output

    sources = {"A": tmp_path / "SA", "B": tmp_path / "SB"}
    save_tiny_folder(sources["A"])
    save_tiny_folder(sources["B"], weight_scale=3)
    runs = tmp_path / "runs"
    out, link = runs / "E9", runs / "E9link"
    export_for_hub(sources["A"], out)
    link.symlink_to("E9")  # `ln -s E9 runs/E9link`: a relative link
    with claim_output(out, "OUT_DIR"):  # an export by one name holds the folder: another name waits its turn
        process = start(command("ode-export", str(sources["B"]), str(link), "--overwrite"))
        _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2 and last_line(stderr) == (
        f"ode-export: error: {link} is in use by another process (pid {os.getpid()}); wait for it to finish or "
        "stop it, or choose another OUT_DIR."
    )
    assert weights(out).keys() and snapshot(out) == snapshot(link)
    expected = {name: weights(path) for name, path in sources.items()}
    for _ in range(3):  # both at once, by the two names: each waits or is refused, never both writing
        racers = [
            start(command("ode-export", str(sources[name]), str(target), "--overwrite"))
            for name, target in (("A", out), ("B", link))
        ]
        outcomes = [(racer.wait(timeout=300), racer.communicate()[1]) for racer in racers]
        for code, stderr in outcomes:
            assert code == 0 or (code == 2 and " is in use by another process (pid " in last_line(stderr))
        assert any(code == 0 for code, _ in outcomes)
        assert sorted(p.name for p in out.iterdir()) == EXPORTED
        written = weights(out)
        same = [
            written.keys() == w.keys() and all(map(torch.equal, written.values(), w.values()))
            for w in expected.values()
        ]
        assert any(same)
        recorded = {
            json.loads((out / name).read_text())["weights_digest"]
            for name in ("config.json", "tokenizer_config.json")
        }
        assert recorded == {weights_digest(out / "model.safetensors")}  # every file of one export
        assert sorted(p.name for p in runs.iterdir()) == ["E9", "E9link"]  # no staging folder, no lock left


def test_translate_into_one_file_by_two_names_takes_one_lock(tmp_path):
    """#65 row 1: two ode-translate writing one file by two names (a link, `dir/../file`) both exited 0, the last
    writer winning."""
    from ode_transformer.train.files import claim_output

    save_tiny_folder(tmp_path / "model", weight_scale=3)
    source = write(tmp_path / "in.txt", "the dog runs\n")
    output = write(tmp_path / "out.txt", "old\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.txt").symlink_to(output)
    for held, name in ((tmp_path / "link.txt", output), (output, tmp_path / "sub" / ".." / "out.txt")):
        with claim_output(held, "--output"):
            argv = [str(tmp_path / "model"), "--input", str(source), "--output", str(name), "--no_progress"]
            process = start(command("ode-translate", *argv))
            _, stderr = process.communicate(timeout=300)
        assert process.returncode == 2 and last_line(stderr).startswith(
            f"ode-translate: error: {name} is in use by another process (pid {os.getpid()});"
        )
        assert output.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "link.txt", "model", "out.txt", "sub"]


def _finished_run(run: Path) -> None:
    """A run's folder as ode-train leaves it: checkpoints, trainer state, results, its tokenizer, the final model."""
    save_tiny_folder(run)
    save_tiny_folder(run / "checkpoint-40")
    save_tiny_folder(run / "tokenizer")
    for folder in (run, run / "checkpoint-40"):
        write(folder / "trainer_state.json", '{"global_step": 40}')
    write(run / "hub_metrics.json", "{}")


@pytest.mark.both_cpus
def test_no_tool_replaces_a_folder_holding_its_input_or_a_run(tmp_path, capsys, monkeypatch):
    """#65 row 2: `ode-export RUN/checkpoint-40 RUN --overwrite` exited 0 and deleted the whole run. No writer
    replaces a folder that holds its input, or a run's checkpoints, by any name and whatever --overwrite says."""
    from ode_transformer.hub.convert_fairseq import convert_fairseq_checkpoint
    from ode_transformer.hub.upcycle import upcycle_folder

    run_dir = tmp_path / "RUN"
    _finished_run(run_dir)
    (tmp_path / "RUNlink").symlink_to(run_dir)
    other = tmp_path / "other"
    save_tiny_folder(other)
    before = snapshot(run_dir)
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    monkeypatch.setattr(
        sys, "argv", ["ode-export", str(run_dir / "checkpoint-40"), str(run_dir), "--overwrite"]
    )
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli.export()
    assert exit_.value.code == 2 and capsys.readouterr().err == (
        f"ode-export: error: OUT_DIR {run_dir} holds {run_dir / 'checkpoint-40'}, an input of this command: "
        f"writing the folder would delete it, whatever --overwrite says; give another OUT_DIR, a new folder "
        f"outside it (e.g. {run_dir}-export)\n"
    )
    run_message = (
        f"OUT_DIR {{}} holds a training run (checkpoint-40, trainer_state.json): writing the folder would delete "
        f"its checkpoints and results; --overwrite does not change that; give another OUT_DIR, a new folder "
        f"(e.g. {run_dir}-{{}})"
    )
    for name in (run_dir, tmp_path / "RUNlink"):
        with pytest.raises(FileExistsError, match=f"^{re.escape(run_message.format(name, 'export'))}$"):
            export_for_hub(other, name, overwrite=True)
    with pytest.raises(FileExistsError, match=f"^{re.escape(run_message.format(run_dir, 'upcycled'))}$"):
        upcycle_folder(other, run_dir, overwrite=True)
    with pytest.raises(FileExistsError, match=f"^{re.escape(run_message.format(run_dir, 'converted'))}$"):
        convert_fairseq_checkpoint(tmp_path / "missing.pt", run_dir, overwrite=True)
    averaged = run_message.format(run_dir, "averaged").replace("OUT_DIR", "--out")
    with pytest.raises(FileExistsError, match=f"^{re.escape(averaged)}$"):
        averaging.write_average([other], run_dir, overwrite=True)
    with pytest.raises(
        FileExistsError, match=f"holds {re.escape(str(run_dir / 'checkpoint-40'))}, an input of this"
    ):
        averaging.write_average([run_dir / "checkpoint-40"], tmp_path / "RUNlink" / "..", overwrite=True)
    assert snapshot(run_dir) == before
    export_for_hub(run_dir / "checkpoint-40", tmp_path / "exported")  # elsewhere: written
    assert sorted(p.name for p in (tmp_path / "exported").iterdir()) == EXPORTED


@pytest.mark.both_cpus
def test_an_empty_input_line_gets_an_empty_output_line_and_a_warning(tmp_path, caplog):
    """#65 row 7: an empty input line to ode-translate got a generated sentence, with no warning."""
    folder = tmp_path / "model"
    save_tiny_folder(folder, weight_scale=3)
    alone = tmp_path / "alone.txt"
    line = "a cat sleeps on the warm mat\n"
    source = write(tmp_path / "in.txt", line)
    translate.main([str(folder), "--input", str(source), "--output", str(alone), "--no_progress"])
    source = write(tmp_path / "mixed.txt", f"\n{line}   \n")
    output = tmp_path / "out.txt"
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.translate"):
        translate.main([str(folder), "--input", str(source), "--output", str(output), "--no_progress"])
    assert output.read_text().split("\n") == ["", alone.read_text().strip(), "", ""]
    assert alone.read_text().strip()  # the model writes something for a real line
    assert (
        "2 of 3 input line(s) are empty (line numbers 1, 3): each gets an empty output line, not a translation"
        in caplog.text
    )
    blank = write(tmp_path / "blank.txt", "\n \n")  # nothing to translate at all
    translate.main([str(folder), "--input", str(blank), "--output", str(output), "--no_progress"])
    assert output.read_text() == "\n\n"


@pytest.mark.parametrize("beams", [-3, "4", [4]], ids=["negative", "string", "list"])
def test_a_bad_num_beams_is_named_before_it_chooses_a_backend(tmp_path, capsys, monkeypatch, beams):
    """#65 row 9: num_beams -3, "4" or [4] in generation_config.json gave "math domain error" or a 26-line TypeError
    from plain ode-translate: the backend choice took log2 of it before the config was checked."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_beams": beams}), encoding="utf-8")
    said = (
        f"{path}: num_beams {beams!r} is not a whole number of at least 1; correct it, or remove the field to decode "
        "with the default"
    )
    source = write(tmp_path / "in.txt", "the dog\n")
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    for name, main, argv in (
        ("ode-translate", cli.translate, [str(folder), "--input", str(source), "--no_progress"]),
        ("ode-export", cli.export, [str(folder), str(tmp_path / "exported")]),
    ):
        monkeypatch.setattr(sys, "argv", [name, *argv])
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            main()
        assert exit_.value.code == 2 and capsys.readouterr().err == f"{name}: error: {said}\n"
    assert not (tmp_path / "exported").exists()


def test_streaming_warns_about_records_it_skips_as_the_whole_file_reader_does(tmp_path, caplog, monkeypatch):
    """#65 row 6: a streamed JSONL file whose records mostly use other keys (2,970 of 3,000 `src`/`tgt`) trained on
    30 rows without a warning; read whole, the same file is warned about."""
    from ode_transformer.train import preparation

    path = tmp_path / "mixed.jsonl"
    records = [
        {"source": f"a {i}", "target": f"b {i}"} if i % 100 == 0 else {"src": "a", "tgt": "b"}
        for i in range(3000)
    ]
    write(path, "".join(json.dumps(record) + "\n" for record in records))
    expected = f"{path}: 2970 empty line(s) skipped (line numbers 2, 3, 4, 5, 6, ...); 30 of 3000 rows loaded"
    columns = SimpleNamespace(source_column="source", target_column="target")

    def warnings(action) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ode_transformer.train.data"):
            action()
        return [record.getMessage() for record in caplog.records]

    assert warnings(lambda: load_local_file(str(path), "seq2seq")) == [expected]
    stream = None

    def start_stream():
        nonlocal stream
        stream = preparation.stream_local_file(str(path), "seq2seq", columns)

    assert warnings(start_stream) == [expected]  # read ahead, before training starts
    assert warnings(lambda: list(stream)) == [expected]  # and at the end of every pass
    assert [row["source"] for row in stream] == [f"a {i}" for i in range(0, 3000, 100)]
    monkeypatch.setattr(preparation, "STREAM_READ_AHEAD", 1000)  # a file longer than what is read ahead
    assert warnings(start_stream) == [
        f"{path} (its first 1000 rows, read ahead): 990 empty line(s) skipped (line numbers 2, 3, 4, 5, 6, ...); "
        "10 of 1000 rows loaded"
    ]


def _hub_style_folder(folder: Path, renamed: str) -> Path:
    """A dataset folder as the Hub lays one out (a JSONL file per split), the ``renamed`` split's source column
    called `src`."""
    folder.mkdir()
    for split in ("train", "validation", "test"):
        key = "src" if split == renamed else "source"
        rows = [{key: f"the dog number {i} runs", "target": f"der Hund Nummer {i} läuft"} for i in range(12)]
        write(folder / f"{split}.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    return folder


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("renamed", ["test", "train"])
def test_a_split_with_a_renamed_column_is_one_line_naming_split_file_and_columns(
    tmp_path, streaming, renamed
):
    """#65 row 10: a split with a renamed column gave a 65-82-line DatasetGenerationError; streamed, a 9-line
    "Couldn't cast" naming no file, split or fix."""
    folder = _hub_style_folder(tmp_path / "data", renamed)
    message = (
        f"dataset '{folder}': the {renamed} split ({folder / f'{renamed}.jsonl'}) has the columns ['src', 'target'], "
        "where the other splits have ['source', 'target']; rename its columns to those"
    )
    flags = ["--hub_dataset", str(folder), "--source_lang", "source", "--target_lang", "target"]
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        train_run(tmp_path / "out", *flags, "--streaming", str(streaming).lower(), "--do_predict", "true")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["validation_file", "hub_folder"])
def test_without_a_test_split_the_split_scored_is_named_everywhere(tmp_path, caplog, source):
    """#65 row 4: a Hub-style folder without a test split, or --validation_file without --test_file, scored the
    validation split, and hub_metrics.json and the card called it "test", without a word."""
    if source == "validation_file":
        data = ",".join(corpus(tmp_path / "data"))
        flags = ["--train_file", data, "--validation_file", data]
    else:
        folder = _hub_style_folder(tmp_path / "data", renamed="none")
        (folder / "test.jsonl").unlink()
        flags = ["--hub_dataset", str(folder), "--source_lang", "source", "--target_lang", "target"]
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.preparation"):
        document = train_run(out, *flags, *EVALUATE[2:])
    assert (
        "the data has no test split: --do_predict scores the validation split instead, and reports it as such"
        in caplog.text
    )
    saved = json.loads((out / "hub_metrics.json").read_text(encoding="utf-8"))
    assert document["dataset"]["split"] == saved["dataset"]["split"] == "validation"
    assert json.loads((out / "test_results.json").read_text(encoding="utf-8"))["split"] == "validation"
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "      split: validation\n" in card and "validation: 12 examples scored." in card  # metadata, text
    assert "| validation | BLEU |" in card and "| test |" not in card and "split: test" not in card


def test_an_evaluation_replacing_a_runs_results_keeps_what_training_wrote(tmp_path):
    """#65 row 8: `--do_train false --overwrite_output_dir true` into a finished run's folder dropped the training
    section from hub_metrics.json, while the run's README.md still showed the old results."""
    data = ",".join(corpus(tmp_path / "data"))
    finished = tmp_path / "run"
    train_run(finished, "--train_file", data, "--test_file", data, *EVALUATE[2:])
    trained = json.loads((finished / "hub_metrics.json").read_text(encoding="utf-8"))
    curves = (finished / "loss_curves.png").read_bytes()
    assert "training" in trained and "12 examples scored." in (finished / "README.md").read_text(
        encoding="utf-8"
    )
    fewer = ",".join(corpus(tmp_path / "fewer", lines=5))  # another test set: other scores, another row count
    evaluate = ["--model_name_or_path", str(finished), "--test_file", fewer, *EVALUATE]
    document = train_run(finished, *evaluate, "--overwrite_output_dir", "true")
    saved = json.loads((finished / "hub_metrics.json").read_text(encoding="utf-8"))
    assert saved == document and saved["training"] == trained["training"] and saved["dataset"]["rows"] == 5
    card = (finished / "README.md").read_text(encoding="utf-8")
    assert "5 examples scored." in card and "12 examples scored." not in card  # the card shows the new scores
    assert trained["training"]["recipe"]["model"] in card  # ... and still how the model was trained
    assert (finished / "loss_curves.png").read_bytes() == curves

    other = tmp_path / "other"  # another model's scores into the folder carry nothing of its run
    train_run(other, "--train_file", data, "--test_file", data, *EVALUATE[2:])
    evaluate[1] = str(other)
    assert "training" not in train_run(finished, *evaluate, "--overwrite_output_dir", "true")


def test_resuming_with_an_edited_tokenizer_is_refused_naming_the_file_and_the_fix(tmp_path):
    """#65 row 5: a tokenizer edited between a kill and the resume (another 300-token BPE, a changed normalizer)
    resumed with exit 0 and trained another model; an edited eos_token was refused as "another model
    configuration", naming neither the file nor the fix."""
    data = ",".join(corpus(tmp_path / "data"))
    shared = Path(tokenizer_folder(tmp_path / "shared"))
    steps = ["--train_file", data, "--save_strategy", "steps", "--save_steps", "2"]
    named, own = tmp_path / "named", tmp_path / "own"
    train_run(named, *steps, "--tokenizer_name", str(shared))  # killed after step 2: its checkpoint is there
    train_run(own, *steps)
    resume = [*steps, "--max_steps", "4", "--resume_from_checkpoint", "last"]

    def refused(out: Path, folder: Path, files: str, *flags: str) -> None:
        checkpoint = out / "checkpoint-2"
        message = (
            f"the tokenizer in {folder} is not the one {checkpoint} was trained with: its {files} differ from the "
            f"checkpoint's copies; copy them from {checkpoint} back into {folder} to resume, or start a new run with "
            "this tokenizer (--overwrite_output_dir true, or another --output_dir)"
        )
        before = snapshot(out)
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            train_run(out, *resume, *flags)
        assert snapshot(out) == before

    original = snapshot(shared)
    other = [" ".join(reversed(text.split())) + " und so weiter" for text in TEXTS]
    train_tokenizer(other, vocab_size=300, save_to=shared)  # another BPE, as large
    refused(named, shared, "tokenizer.json", "--tokenizer_name", str(shared))
    for name, (content, _) in original.items():
        (shared / name).write_bytes(content)
    tokenizer_json = own / "tokenizer" / "tokenizer.json"
    kept = tokenizer_json.read_text(encoding="utf-8")
    tokenizer_json.write_text(
        json.dumps({**json.loads(kept), "normalizer": {"type": "Lowercase"}}), encoding="utf-8"
    )
    refused(own, own / "tokenizer", "tokenizer.json")
    tokenizer_json.write_text(kept, encoding="utf-8")
    config_json = own / "tokenizer" / "tokenizer_config.json"
    config = config_json.read_bytes()
    config_json.write_text(
        json.dumps({**json.loads(config_json.read_text(encoding="utf-8")), "eos_token": "<s>"}),
        encoding="utf-8",
    )
    refused(own, own / "tokenizer", "tokenizer_config.json")

    (own / "tokenizer" / "tokenizer_config.json").write_bytes(config)
    train_run(
        named, *resume, "--tokenizer_name", str(shared)
    )  # the tokenizers they were trained with: resumed
    train_run(own, *resume)  # (a tokenizer the run trained, read back from disk, is the same one)
    assert (named / "checkpoint-4").is_dir() and (own / "checkpoint-4").is_dir()


def test_an_export_records_its_weights_digest_and_a_load_of_two_exports_is_refused(
    tmp_path, caplog, monkeypatch
):
    """#65 row 3: a reader loading while `ode-export --overwrite` replaced the folder could take one export's
    config with another's weights (135 of 765 in-process loads), silently. An export records the digest of its
    weights in model.safetensors' metadata and in config.json, generation_config.json and tokenizer_config.json;
    the model's own from_pretrained (remote code too) checks it, loads again once, then refuses in one line."""
    import shutil

    from transformers import PreTrainedModel
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    from modeling_ode.modeling_ode_transformer import weights_digest

    save_tiny_folder(tmp_path / "A")
    save_tiny_folder(tmp_path / "B", weight_scale=3)
    a, b = export_for_hub(tmp_path / "A", tmp_path / "EA"), export_for_hub(tmp_path / "B", tmp_path / "EB")
    digests = {folder: weights_digest(folder / "model.safetensors") for folder in (a, b)}
    for folder, digest in digests.items():
        for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
            assert json.loads((folder / name).read_text(encoding="utf-8"))["weights_digest"] == digest
    assert len(set(digests.values())) == 2 and all(len(digest) == 64 for digest in digests.values())
    again = export_for_hub(
        tmp_path / "A", tmp_path / "EA2"
    )  # a digest of the weights: the same for the same ones
    assert weights_digest(again / "model.safetensors") == digests[a]
    assert_bit_identical(weights(a), weights(tmp_path / "A"))  # the weights themselves untouched
    # the folder's own code, which a plain transformers user runs (trust_remote_code=True)
    remote = get_class_from_dynamic_module(
        "modeling_ode_transformer.ODETransformerForConditionalGeneration", a
    )
    assert remote.__module__.startswith("transformers_modules")

    mixed = (
        tmp_path / "mixed"
    )  # what a reader took: config.json of one export, model.safetensors of the other
    shutil.copytree(a, mixed)
    shutil.copy2(b / "model.safetensors", mixed / "model.safetensors")
    message = (
        f"{mixed}: config.json and generation_config.json record the weights digest {digests[a][:12]}, but its "
        f"model.safetensors holds {digests[b][:12]}, loaded twice: its files come from two exports; load it again "
        "once the export writing it has finished, or export the model again"
    )
    for load in (ODETransformerForConditionalGeneration.from_pretrained, translate.load_for_generation):
        with pytest.raises(OSError, match=f"^{re.escape(message)}$"):
            load(str(mixed))
    with pytest.raises(OSError, match=f"^{re.escape(message)}$"):
        remote.from_pretrained(mixed)

    original = PreTrainedModel.from_pretrained.__func__
    loads = []

    def export_finishes_after_the_first_load(cls, *args, **kwargs):
        loads.append(original(cls, *args, **kwargs))
        if len(loads) == 1:
            shutil.copytree(b, mixed, dirs_exist_ok=True)  # the folder is now the new export, whole
        return loads[-1]

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(export_finishes_after_the_first_load))
    with caplog.at_level(logging.WARNING):
        model = ODETransformerForConditionalGeneration.from_pretrained(mixed)
    assert len(loads) == 2 and "it was replaced while it loaded; loading it again" in caplog.text
    assert model.config.weights_digest == digests[b]
    assert_bit_identical(dict(model.state_dict()), dict(loads[1].state_dict()))
    monkeypatch.undo()

    # the tokenizer of the other one
    shutil.copy2(a / "tokenizer_config.json", mixed / "tokenizer_config.json")
    said = f"{mixed}: tokenizer_config.json records the weights digest {digests[a][:12]}, but config.json "
    with pytest.raises(ValueError, match=f"^{re.escape(said)}{digests[b][:12]}, loaded twice"):
        translate.load_for_generation(str(mixed))

    saved = tmp_path / "saved"  # weights saved anew are not the export's: no digest carried over
    model.save_pretrained(saved)
    assert json.loads((saved / "config.json").read_text(encoding="utf-8"))["weights_digest"] is None
    assert "weights_digest" not in (saved / "generation_config.json").read_text(encoding="utf-8")
    ODETransformerForConditionalGeneration.from_pretrained(saved)


def test_a_full_disk_while_a_graph_is_quantised_is_named(tmp_path):
    """#65 row 11: a full disk during `ode-export --onnx --quantize int8` gave a 56-76-line protobuf "Wire format
    was corrupt" traceback: onnxruntime writes a shape-inferred copy of each graph, cut off by the full disk, and
    reads it back. Under a file-size limit that every exported file fits but no such copy does: one line."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import onnx

    save_tiny_folder(tmp_path / "model", weight_scale=3)
    floats = export_for_hub(tmp_path / "model", tmp_path / "float", onnx=True, onnx_dynamo=False)
    largest = max(path.stat().st_size for path in floats.rglob("*") if path.is_file())
    inferred = []
    for graph in sorted((floats / "onnx").iterdir()):
        onnx.shape_inference.infer_shapes_path(str(graph), str(tmp_path / "inferred.onnx"))
        inferred.append((tmp_path / "inferred.onnx").stat().st_size)
    assert largest < min(inferred)  # shape information makes each copy larger than any file of the export
    out = tmp_path / "int8"
    argv = [
        str(tmp_path / "model"),
        str(out),
        "--onnx",
        "--onnx-exporter",
        "torchscript",
        "--quantize",
        "int8",
    ]
    process = start(command("ode-export", *argv, limit=largest + 1))
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2
    assert last_line(stderr) == (
        f"ode-export: error: [Errno 28] no space left on device while saving {out} (Error parsing message with "
        "type 'onnx.ModelProto': Wire format was corrupt); free some space (or raise the file-size limit, "
        "`ulimit -f`) and run the command again"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "float",
        "inferred.onnx",
        "model",
    ]  # nothing half-written
