"""A training run of a tiny model on a few lines, and the helpers the tests of runs and tools share: the flags,
the data, a saved model, snapshots of folders and weights."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_folder import TEXTS

from modeling_ode import ODETransformerConfig, ODETransformerForConditionalGeneration
from ode_transformer import translate
from ode_transformer.tokenizer import train_tokenizer
from ode_transformer.train.arguments import parse_arguments
from ode_transformer.train.run import run

TINY_RUN = [
    "--preset", "tiny", "--vocab_size", "300", "--use_cpu", "true", "--report_to", "none", "--disable_tqdm", "true",
    "--max_steps", "2", "--save_strategy", "no", "--do_predict", "false", "--max_source_length", "16",
    "--max_target_length", "16", "--per_device_train_batch_size", "4",
]  # fmt: skip


# A run that evaluates a saved model (its test split) instead of training one.
EVALUATE = ["--do_train", "false", "--do_predict", "true", "--num_beams", "1", "--max_target_length", "8"]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def corpus(folder: Path, lines: int = 12) -> tuple[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    src = write(folder / "src.txt", "".join(f"the dog number {i} runs\n" for i in range(lines)))
    tgt = write(folder / "tgt.txt", "".join(f"der Hund Nummer {i} läuft\n" for i in range(lines)))
    return str(src), str(tgt)


def seq2seq(**overrides) -> ODETransformerForConditionalGeneration:
    torch.manual_seed(0)
    return ODETransformerForConditionalGeneration(
        ODETransformerConfig.from_preset("tiny", **overrides)
    ).eval()


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


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (a BaseException, so no handler of the code under test catches it)."""


class Payload:
    """Unpickling it would run a shell command (it leaves a marker file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


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


def last_line(stderr: bytes) -> str:
    text = stderr.decode(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    return text.strip().splitlines()[-1]
