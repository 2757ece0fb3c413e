"""Checkpoint averaging (the paper evaluates the average of the last 5/10 checkpoints).

``python -m ode_transformer.train.averaging OUTPUT_DIR --last 5 --out DIR`` averages the ``model.safetensors`` of
the last ``checkpoint-<step>`` folders of a training run and writes a loadable model folder (the
config, generation config and tokenizer files are copied from the newest checkpoint). Only complete
checkpoints of one training run are averaged (:mod:`ode_transformer.checkpoints`). A non-empty ``--out`` is refused
unless ``--overwrite`` (which replaces it): files left there would describe another model. The folder is written as
``OUT.incomplete`` and renamed to ``OUT`` once complete; one writer of ``--out`` at a time.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ode_transformer.checkpoints import (
    check_one_run,
    complete_checkpoints,
    refuse_replacing_output,
    writing_output_folder,
)
from ode_transformer.cli import positive_int, report_user_error
from ode_transformer.files import InUseError

logger = logging.getLogger(__name__)

__all__ = ["average_checkpoints", "last_checkpoints", "main", "write_average"]

WEIGHTS = "model.safetensors"


def last_checkpoints(output_dir: str | Path, last: int) -> list[Path]:
    """The ``last`` newest complete ``checkpoint-<step>`` folders of ``output_dir``, oldest first.

    Raises:
        FileNotFoundError: there is no complete checkpoint.
        ValueError: they were written by different training runs (folders and run ids named).
    """
    found = complete_checkpoints(output_dir)
    if not found:
        raise FileNotFoundError(f"no complete checkpoint-<step> folders in {output_dir}")
    chosen = found[-last:]
    if len(chosen) < last:
        logger.warning(
            "%s holds %d complete checkpoint(s), fewer than the %d asked for: averaging %d",
            output_dir,
            len(chosen),
            last,
            len(chosen),
        )
    check_one_run(chosen)
    return chosen


def _weights_file(path: str | Path) -> Path:
    path = Path(path)
    return path / WEIGHTS if path.is_dir() else path


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the tensors of several safetensors checkpoints (folders or files).

    Floating-point tensors are averaged in float64 and cast back to their dtype; other tensors
    (integer buffers) must be equal and are kept. All checkpoints need the same keys and shapes.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    states = [load_file(str(_weights_file(p))) for p in paths]
    keys = set(states[0])
    for path, state in zip(paths[1:], states[1:]):
        if set(state) != keys:
            raise ValueError(f"{path} has different tensors than {paths[0]}: {sorted(keys ^ set(state))[:5]}")
    averaged = {}
    for key, first in states[0].items():
        if first.is_floating_point():
            total = torch.stack([state[key].to(torch.float64) for state in states]).mean(dim=0)
            averaged[key] = total.to(first.dtype)
        elif all(torch.equal(first, state[key]) for state in states[1:]):
            averaged[key] = first
        else:
            raise ValueError(f"non-float tensor {key!r} differs between checkpoints")
    return averaged


def write_average(paths: Sequence[str | Path], out: str | Path, overwrite: bool = False) -> Path:
    """Average ``paths`` into ``out``; the other files of the newest checkpoint are copied along.

    Raises:
        FileExistsError: ``out`` holds files and ``overwrite`` is false; or, whatever ``overwrite`` says, it is or
            holds one of the checkpoints, or holds a training run.
    """
    out = Path(out)
    refuse_replacing_output(out, paths, "--out", overwrite, "averaged")
    state = {key: tensor.contiguous() for key, tensor in average_checkpoints(paths).items()}
    newest = Path(paths[-1])
    with writing_output_folder(out, paths, "--out", overwrite, "averaged") as staged:
        if newest.is_dir():
            for file in newest.iterdir():
                if (
                    file.is_file()
                    and file.name != WEIGHTS
                    and not file.name.startswith(
                        ("optimizer", "scheduler", "rng_state", "trainer_state", "training_args")
                    )
                ):
                    shutil.copy2(file, staged / file.name)
        save_file(state, str(staged / WEIGHTS), metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ode_transformer.train.averaging", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("output_dir", help="training output folder with checkpoint-<step> subfolders")
    parser.add_argument("--last", type=positive_int, default=5, help="how many of the newest checkpoints")
    parser.add_argument("--out", required=True, help="folder for the averaged model (empty or new)")
    parser.add_argument("--overwrite", action="store_true", help="delete what --out holds first")
    args = parser.parse_args(argv)
    paths = last_checkpoints(args.output_dir, args.last)
    try:
        write_average(paths, args.out, args.overwrite)
    except (FileExistsError, InUseError) as error:  # an occupied or busy --out: one line, as argparse's
        raise SystemExit(report_user_error(__spec__.name, error)) from None
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {args.out}")


if __name__ == "__main__":
    main()
