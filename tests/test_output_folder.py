"""A run's output folder and checkpoints under faults: two runs at once, a kill in each end phase of a run,
divergence, a full disk, damaged checkpoints, an interrupted `ode-train`: nothing is lost and nothing is silently
wrong (the files, the weights bit for bit, a one-line message naming the problem and the fix).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_folder import TEXTS, save_tiny_folder
from tiny_run import (
    EVALUATE,
    ROOT,
    TINY_RUN,
    Killed,
    Payload,
    assert_bit_identical,
    assert_one_line,
    command,
    corpus,
    interrupt,
    read_until,
    seq2seq,
    snapshot,
    start,
    tokenizer_folder,
    train_run,
    weights,
    write,
)

import ode_transformer.loading
import ode_transformer.train.arguments
import ode_transformer.train.evaluation
import ode_transformer.train.run
import ode_transformer.train.saved_model
import ode_transformer.train.trainer
from modeling_ode import ODETransformerForConditionalGeneration
from ode_transformer import cli, translate
from ode_transformer.tokenizer import train_tokenizer
from ode_transformer.train import averaging
from ode_transformer.train.arguments import parse_arguments
from ode_transformer.train.output_folder import save_final_model
from ode_transformer.train.run import run


def _race(barrier, output_dir: str, data: str, tokenizer: str, results) -> None:
    """One of the two racing runs: both leave the barrier together, then start ode_transformer.train.run."""
    import os

    args = parse_arguments([*TINY_RUN, "--output_dir", output_dir, "--train_file", data, "--tokenizer_name",
                            tokenizer, "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2"])  # fmt: skip
    barrier.wait()
    try:
        run(args)
        results.put((os.getpid(), "ok"))
    except Exception as error:
        results.put((os.getpid(), f"{type(error).__name__}: {error}"))


def test_two_runs_started_at_once_one_is_refused_naming_the_other(tmp_path, refused):
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
    with pytest.raises(
        FloatingPointError,
        match=r"the final model holds non-finite weights \(NaN or infinity\) in 1 tensors \(.*shared.weight",
    ):
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
        translate.load_for_generation(str(folder))  # what ode_transformer.translate loads
        assert "holds non-finite weights" in caplog.text


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


@pytest.mark.both_cpus
def test_a_second_ode_train_into_one_folder_is_one_line(tmp_path, monkeypatch, capsys, refused):
    """A second ode-train into a folder another run holds is refused with exit code 2 and one line naming the
    folder, the other run's pid and the way forward, not a RuntimeError traceback."""
    from ode_transformer.checkpoints import lock_output_dir

    out = tmp_path / "out"
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    monkeypatch.setattr(sys, "argv", ["ode-train", *TINY_RUN, "--output_dir", str(out), "--train_file",
                                      ",".join(corpus(tmp_path / "data"))])  # fmt: skip
    with lock_output_dir(out):  # the first run, holding the folder
        err = refused(cli.train)
    assert err.splitlines()[-1] == (
        f"ode-train: error: {out} is in use by another run (pid {os.getpid()}); wait for it to finish or stop it, "
        "or choose another --output_dir."
    )


@pytest.mark.both_cpus
def test_ode_train_into_a_folder_an_export_writes_is_refused(tmp_path, monkeypatch, capsys, refused):
    """An export (or averaging, or a conversion) writing a folder holds the lock beside it, by whatever name
    it was given: ode-train into the folder by another name is refused in one line naming the writer's pid,
    the folder left as it was, rather than training into a folder that the export then swaps away. Where the
    folder's parent cannot hold that lock, no such writer can stage the folder there, and the run's own lock
    is taken alone."""
    import errno

    from ode_transformer import checkpoints
    from ode_transformer.files import lock_output

    out, link = tmp_path / "out", tmp_path / "outlink"
    save_tiny_folder(out)  # an earlier export, which an `ode-export --overwrite` replaces
    link.symlink_to("out")
    before = snapshot(out)
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    monkeypatch.setattr(sys, "argv", ["ode-train", *TINY_RUN, "--output_dir", str(out), "--train_file",
                                      ",".join(corpus(tmp_path / "data"))])  # fmt: skip
    with lock_output(link, "OUT_DIR"):  # the export, holding the folder
        err = refused(cli.train)
    assert err.splitlines()[-1] == (
        f"ode-train: error: {out} is in use by another process (pid {os.getpid()}); wait for it to finish or stop "
        "it, or choose another --output_dir."
    )
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out", "outlink"]  # no lock left

    def unwritable(path, option):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(checkpoints, "lock_output", unwritable)
    with checkpoints.lock_output_dir(tmp_path / "fresh"):
        assert (tmp_path / "fresh" / ".run.lock").is_file()
    assert not (tmp_path / "fresh").exists()


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
    """Ctrl-C during training or the test decoding ends ode-train with exit code 130 and one line saying how
    to go on (resume from the newest checkpoint, or test the saved model), not a KeyboardInterrupt traceback;
    the lock is released and no hub_metrics.json is written."""
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


FULL_DISK_OPTIMIZER = """
import os, resource, signal, sys
import torch
from ode_transformer.files import saving
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
    """A disk that fills while optimizer.pt is written (torch.save's zip writer failing at its final flush
    with 'basic_ios::clear: iostream error') is named as a full disk: [Errno 28] with the file, and to free
    some space."""
    path = tmp_path / "optimizer.pt"
    result = subprocess.run([sys.executable, "-c", FULL_DISK_OPTIMIZER, str(path)], cwd=ROOT, capture_output=True,
                            text=True)  # fmt: skip
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"OSError: [Errno 28] no space left on device while saving {path} (basic_ios::clear"
    ), result.stderr
    assert "free some space" in last


@pytest.mark.both_cpus
def test_a_pickle_payload_in_a_checkpoint_is_refused_by_name(tmp_path):
    """A pickle payload in a checkpoint's rng_state, optimizer or scheduler is refused before anything else,
    without running it, naming the file and the way forward (not a raw UnpicklingError traceback);
    training_args.bin is not read back, so the run resumes without running its payload."""
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


@pytest.mark.both_cpus
def test_an_evaluation_into_a_finished_run_keeps_its_results_and_holds_the_lock(
    tmp_path, monkeypatch, capsys, refused
):
    """`ode-train --do_train false --do_predict true --model_name_or_path RUN --output_dir RUN` is refused,
    the folder untouched, rather than replace a finished run's hub_metrics.json (and its training section),
    hypotheses and scores; an evaluation holds the folder's lock as a training run does; with
    --overwrite_output_dir true it replaces the results and keeps the weights."""
    from ode_transformer.checkpoints import lock_output_dir
    from ode_transformer.files import InUseError

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
    assert refused(cli.train).splitlines()[-1].startswith(f"ode-train: error: {message}")
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
    )  # asked for: replaced, nothing else deleted (what training wrote stays)
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
    """A payload in a raw-pickle or legacy (non-zip) torch file, and a cut-off or empty optimizer.pt,
    rng_state.pth or model.safetensors, are each refused before anything runs, in one line naming the file and
    the fix, and nothing is unpickled: the up-front check reads non-zip files too, and no message suggests
    weights_only=False or leaves the file unnamed (`[Errno 22] Invalid argument`, `incomplete metadata`)."""
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


def test_a_trained_runs_final_model_gets_the_umask_modes(end_phase_run):
    """ode-train's final model.safetensors gets the umask's mode, as config.json does, not safetensors' own
    0600."""
    folder, _ = end_phase_run
    mask = os.umask(0)
    os.umask(mask)
    modes = {name: (folder / name).stat().st_mode & 0o777 for name in ("model.safetensors", "config.json")}
    assert modes == dict.fromkeys(modes, 0o666 & ~mask)


@pytest.mark.both_cpus
def test_divergence_is_one_line_and_a_nan_checkpoint_is_refused_without_blaming_the_learning_rate(
    tmp_path, monkeypatch, capsys, refused
):
    """Divergence ends in one line, "training diverged at step 2", with no traceback before it; resuming from
    a checkpoint with NaN weights is refused as a run that diverged before that checkpoint, pointing to an
    earlier one, without blaming the learning rate."""
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
    err = refused(ode_transformer.train.run.main, diverging)
    assert "Traceback" not in err
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


def test_an_evaluation_replacing_a_runs_results_keeps_what_training_wrote(tmp_path):
    """`--do_train false --overwrite_output_dir true` into a finished run's folder keeps the training section
    of hub_metrics.json and the loss curves, and the run's README.md shows the new scores beside how the model
    was trained; another model's evaluation written into the folder takes no training section from it."""
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
    """A tokenizer edited between a kill and the resume (another BPE as large, a changed normalizer, an edited
    eos_token) is refused, the run's folder untouched, naming the tokenizer's folder, the files that differ
    from the checkpoint's copies and the fix, rather than resuming to train another model."""
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
    lost = own / "checkpoint-2" / "tokenizer.json"  # a checkpoint without its copy: nothing to compare with
    copy = lost.read_bytes()
    lost.unlink()
    before = snapshot(own)
    message = (
        f"{own / 'checkpoint-2'} has no copy of the tokenizer's tokenizer.json (every checkpoint saves one), so "
        f"the tokenizer in {own / 'tokenizer'} cannot be shown to be the one it was trained with; resume from a "
        f"checkpoint that holds it (--resume_from_checkpoint FOLDER), copy tokenizer.json from {own / 'tokenizer'} "
        f"into {own / 'checkpoint-2'} if that is the run's tokenizer, or start a new run with this tokenizer "
        "(--overwrite_output_dir true, or another --output_dir)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        train_run(own, *resume)
    assert snapshot(own) == before
    lost.write_bytes(copy)
    train_run(
        named, *resume, "--tokenizer_name", str(shared)
    )  # the tokenizers they were trained with: resumed
    train_run(own, *resume)  # (a tokenizer the run trained, read back from disk, is the same one)
    assert (named / "checkpoint-4").is_dir() and (own / "checkpoint-4").is_dir()


def test_a_checkpoint_without_any_tokenizer_file_resumes_with_a_warning(tmp_path, caplog):
    """A checkpoint that holds no tokenizer file (a Trainer given no tokenizer saves none) has nothing to compare
    with: the resume goes on and says so; one that holds some of the files but lacks one lost it, and is refused."""
    tokenizer = train_tokenizer(TEXTS, vocab_size=300)
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    check = ode_transformer.train.saved_model.check_resume_tokenizer
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.saved_model"):
        check(str(checkpoint), tokenizer, "OUT/tokenizer")
    assert f"{checkpoint} holds no tokenizer files" in caplog.text
    tokenizer.save_pretrained(checkpoint)
    check(str(checkpoint), tokenizer, "OUT/tokenizer")  # the same files: resumes
    (checkpoint / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="has no copy of the tokenizer's tokenizer.json"):
        check(str(checkpoint), tokenizer, "OUT/tokenizer")
