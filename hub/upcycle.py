"""Convert a pretrained residual seq2seq model to ODE blocks and save it with its tokenizer (beyond the paper).

    python -m ode_transformer.hub.upcycle SOURCE OUT_DIR [--encoder_ode_method rk2] [--decoder_ode_method euler]
        [--encoder_ode_coefficients learnable] [--decoder_ode_coefficients ...] [--set FIELD=VALUE ...] [--overwrite]

SOURCE: a folder or Hub id of an M2M100ForConditionalGeneration (M2M100, NLLB-200, e.g.
facebook/nllb-200-distilled-600M) or of a residual ODE Transformer. The conversion is
`ODETransformerForConditionalGeneration.from_residual` (modeling_ode/conversion.py): Euler blocks give the source's
logits; RK blocks start as the residual block (learnable coefficients at (1, 0, ..., 0), exactly, by default).
OUT_DIR gets the model (save_pretrained: config, weights, generation config, the modeling code), and the source's
tokenizer where it has one; fine-tune it with ``python -m ode_transformer.train.run --model_name_or_path OUT_DIR ...``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ode_transformer.checkpoints import refuse_replacing_output, writing_output_folder
from ode_transformer.files import InUseError

__all__ = ["upcycle_folder"]


def upcycle_folder(
    source: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False, **conversion: Any
) -> Path:
    """`from_residual(source, **conversion)` saved to `out_dir` with the source's tokenizer (if it has one). A
    non-empty `out_dir` is refused (before the source is read) unless `overwrite`; one that holds the source or a
    training run, whatever `overwrite` says. Returns `out_dir`.

    One writer of `out_dir` at a time, by any of its names (:func:`ode_transformer.files.lock_output`; a second
    is refused, naming the first), and the folder is written whole or not at all
    (:func:`ode_transformer.files.staged_folder`): a kill leaves the old folder in place."""
    from transformers import AutoTokenizer

    from modeling_ode import ODETransformerForConditionalGeneration

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} is a file; OUT_DIR must be a folder (new or empty).")
    refuse_replacing_output(out, [source], "OUT_DIR", overwrite, "upcycled")
    model = ODETransformerForConditionalGeneration.from_residual(source, **conversion)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError):  # no tokenizer files: the user pairs the model with the source's tokenizer
        tokenizer = None
    with writing_output_folder(out, [source], "OUT_DIR", overwrite, "upcycled") as staged:
        model.save_pretrained(staged)
        if tokenizer is not None:
            tokenizer.save_pretrained(staged)
    return out


def _field(item: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` with VALUE read as JSON where it is JSON (0.1, true, "x"), else as text."""
    key, _, value = item.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description="Convert a pretrained residual seq2seq model (M2M100/NLLB-200, or a residual ODE Transformer) "
        "to ODE blocks that start as its function, and save it with its tokenizer.",
    )
    parser.add_argument("source", help="folder or Hub id of the pretrained model")
    parser.add_argument("out_dir", help="folder to write (save_pretrained layout)")
    parser.add_argument("--encoder_ode_method", default="euler", help="euler (default), rk2, rk4, ...")
    parser.add_argument("--decoder_ode_method", default="euler", help="euler (default), rk2, rk4, ...")
    parser.add_argument("--encoder_ode_coefficients", help="default: tableau for euler, else learnable")
    parser.add_argument("--decoder_ode_coefficients", help="default: tableau for euler, else learnable")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a further config field (ode_gate_init, dropout, ...)",
    )
    parser.add_argument("--overwrite", action="store_true", help="delete what OUT_DIR holds first")
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.set):
        parser.error("--set takes FIELD=VALUE, e.g. --set dropout=0.1")
    fields = dict(_field(item) for item in args.set)
    try:
        upcycle_folder(
            args.source,
            args.out_dir,
            overwrite=args.overwrite,
            encoder_ode_method=args.encoder_ode_method,
            decoder_ode_method=args.decoder_ode_method,
            encoder_ode_coefficients=args.encoder_ode_coefficients,
            decoder_ode_coefficients=args.decoder_ode_coefficients,
            **fields,
        )
    except (ValueError, FileNotFoundError, FileExistsError, InUseError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")  # one line, as argparse's usage errors
    print(args.out_dir)


if __name__ == "__main__":
    main()
