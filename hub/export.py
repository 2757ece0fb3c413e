"""A clean Hub-ready folder: upload it as is and load it with `trust_remote_code=True` anywhere.

    out_dir/
      config.json              with auto_map -> the code below (AutoConfig, AutoModel and the model's auto class)
      model.safetensors        the weights (tied weights stored once); the digest of them its metadata holds is
                               recorded in config.json, generation_config.json and tokenizer_config.json too, and
                               from_pretrained checks that they agree
      generation_config.json   decoding defaults: the model's own, else the paper's translation decoding
      configuration_ode_transformer.py, modeling_ode_transformer.py, cache_ode.py, ode.py, compat.py, lora.py,
      dropout.py, input_checks.py, weights_integrity.py
                               the package's module files, flat, relative imports unchanged
      tokenizer files          if a tokenizer is given or the model folder holds one; with the model's limits
                               (model_max_length, padding_side: tokenizer_limits in modeling_ode)
      README.md                the model card (ode_transformer/model_card_writer.py)
      onnx/                    with `--onnx`: encoder_model.onnx, decoder_model.onnx, decoder_with_past_model.onnx
                               (hub/onnx_export.py: their inputs and outputs; ode_transformer/onnx_generation.py decodes them);
                               `--quantize int8` writes them with int8 products, as *_quantized.onnx (Optimum's names)

The code and `auto_map` come from `save_pretrained` itself: `modeling_ode` registers its classes for the auto
classes (`register_for_auto_class`), so every saved folder carries them. This module adds what an upload
needs beyond that: the card, the tokenizer, the paper's decoding defaults, and nothing else of a training
folder (no checkpoints, logs or optimizer states).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, GenerationConfig

from modeling_ode import (
    ODETransformerConfig,
    ODETransformerPreTrainedModel,
    fit_tokenizer_to_model,
)
from modeling_ode.weights_integrity import WEIGHTS_DIGEST, record_weights_digest
from ode_transformer.card_metrics import METRICS_FILENAME, load_metrics
from ode_transformer.checkpoints import refuse_replacing_a_run
from ode_transformer.cli import program_name, report_user_error
from ode_transformer.decoding import PAPER_TRANSLATION_DECODING
from ode_transformer.files import InUseError, lock_output, refuse_occupied, staged_folder
from ode_transformer.loading import load_saved_model
from ode_transformer.model_card_writer import onnx_graphs, onnx_section, write_model_card
from ode_transformer.tokenizer import check_tokenizer_files, own_tokenizer_config

from .onnx_export import (
    EXPORT_PACKAGES,
    ONNX_EXPORTERS,
    ONNX_QUANTIZE_CHOICES,
    RUNTIME_PACKAGES,
    check_exportable,
    export_onnx,
    require,
)

__all__ = ["PAPER_GENERATION_DEFAULTS", "TOKENIZER_FILES", "export_for_hub"]

# An encoder-decoder without decoding defaults of its own decodes as the paper translates, as `--task translation`
# does.
PAPER_GENERATION_DEFAULTS = {**PAPER_TRANSLATION_DECODING, "early_stopping": True}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "source.spm",
    "target.spm",
    "chat_template.jinja",
)


def _tokenizer_files(tokenizer: Any, source_dir: Path | None) -> tuple[Path | None, list[str]]:
    """The folder and names of the tokenizer files to copy (none for a tokenizer object), checked before the
    export writes anything: a bad ``--tokenizer`` must not leave a half-written folder behind."""
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        return None, []
    folder = Path(tokenizer) if tokenizer is not None else source_dir
    if folder is None:
        return None, []
    names = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if names:
        check_tokenizer_files(folder)
    if tokenizer is None:
        return folder, names
    if folder.is_file():
        raise FileNotFoundError(
            f"tokenizer {folder} is a file; pass the folder that holds the tokenizer files."
        )
    if not folder.is_dir():
        raise FileNotFoundError(f"tokenizer folder {folder} does not exist.")
    if not names:
        raise FileNotFoundError(f"{folder} holds none of the tokenizer files {list(TOKENIZER_FILES)}.")
    return folder, names


def _copy_tokenizer(tokenizer: Any, folder: Path | None, names: list[str], out_dir: Path) -> bool:
    """Save the tokenizer object, or copy ``names`` from ``folder``; whether a tokenizer was written."""
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(str(out_dir))
        return any((out_dir / name).is_file() for name in TOKENIZER_FILES)
    for name in names:
        shutil.copy2(folder / name, out_dir / name)
    return bool(names)


def _fit_tokenizer(out_dir: Path, config: ODETransformerConfig) -> None:
    """Give the exported tokenizer the model's limits where it has none (a folder this project saved has them:
    its source length), and the padding side of the model's task."""
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    known = (
        tokenizer.model_max_length if tokenizer.model_max_length <= config.max_position_embeddings else None
    )
    fit_tokenizer_to_model(tokenizer, config, known).save_pretrained(str(out_dir))


def _write_generation_config(model: ODETransformerPreTrainedModel, out_dir: Path, source_dir: Path | None):
    """The model's generation config; for an encoder-decoder whose own config sets no beam search (i.e. none was
    saved with the model), the paper's decoding defaults."""
    generation = model.generation_config.to_diff_dict() if model.generation_config is not None else {}
    has_own = source_dir is not None and (source_dir / "generation_config.json").is_file()
    if model.config.is_encoder_decoder and not (has_own and generation.get("num_beams", 1) > 1):
        generation = {**generation, **PAPER_GENERATION_DEFAULTS}
    keys = ["bos_token_id", "eos_token_id", "pad_token_id"]
    if model.config.is_encoder_decoder:
        keys.append("decoder_start_token_id")
    for key in keys:
        generation.setdefault(key, getattr(model.config, key, None))
    generation.pop("transformers_version", None)
    generation.pop("_from_model_config", None)
    generation = {k: v for k, v in generation.items() if v is not None}
    GenerationConfig(**generation).save_pretrained(out_dir)


def _write_card(staged: Path, name: str, metrics, repo_id: str | None) -> None:
    """The card of ``staged``, written as if the folder were already ``name``: a card names its folder (the
    model's name, ``from_pretrained("path/to/NAME")``), and it must never name the staging folder, nor any local
    path beyond that name. It names the ONNX graphs ``staged/onnx`` holds."""
    with tempfile.TemporaryDirectory(prefix="ode-card-") as scratch:
        named = Path(scratch) / name
        named.mkdir()
        for file in ("config.json", "generation_config.json", *TOKENIZER_FILES):  # the card reads the trained
            if (staged / file).is_file():  # length from the tokenizer's files
                shutil.copy2(staged / file, named / file)
        write_model_card(named, metrics, repo_id, onnx_graphs(staged))
        shutil.move(named / "README.md", staged / "README.md")


def _copy_card(card: Path, staged: Path, repo: str) -> None:
    """The model folder's own card, copied, with the words on the ONNX graphs of ``staged/onnx`` added where the
    export wrote them (that card, written before, names none)."""
    text = card.read_text(encoding="utf-8")
    section = onnx_section(onnx_graphs(staged), repo)
    if section and "\n### ONNX\n" not in text:
        text = text.rstrip("\n") + section + "\n"
    (staged / "README.md").write_text(text, encoding="utf-8")


def export_for_hub(
    model_dir_or_model: str | Path | ODETransformerPreTrainedModel,
    out_dir: str | Path,
    tokenizer: Any = None,
    metrics: str | Path | Mapping[str, Any] | None = None,
    repo_id: str | None = None,
    overwrite: bool = False,
    onnx: bool = False,
    onnx_dynamo: bool | None = None,
    onnx_quantize: str | None = None,
) -> Path:
    """Write a folder that can be uploaded to the Hub as is (layout in the module docstring).

    Args:
        model_dir_or_model: a folder written by `save_pretrained` or an ODE Transformer model.
        out_dir: the folder to write (created); a non-empty one is refused unless ``overwrite``, and one that
            holds an input of the export or a training run is refused whatever ``overwrite`` says.
        tokenizer: a tokenizer object (saved with `save_pretrained`) or a folder holding tokenizer files; by
            default the tokenizer files of the model folder, if any.
        metrics: a metrics JSON (path or dict, schema in ode_transformer/card_metrics.py) for the card; by
            default the model folder's `hub_metrics.json`, else its README.md is copied, else a card without
            results is written.
        repo_id: USER/NAME for the card's usage example.
        overwrite: delete what ``out_dir`` holds first (its old card, metrics or checkpoints would otherwise
            describe another model).
        onnx: also write the ONNX graphs into ``out_dir/onnx`` (an encoder-decoder only; needs the `onnx` extra).
        onnx_dynamo: export them with ``torch.onnx.export(..., dynamo=True)`` (torch's default), else with the
            TorchScript exporter; None: the TorchScript one where the installed torch still has it (``export_onnx``).
        onnx_quantize: "int8": the graphs with int8 products (``ode_transformer.hub.onnx_export.quantize_graph_int8``; needs
            onnxruntime too), the fastest way to translate on a CPU (docs/performance.md).
    Returns: out_dir.

    The folder is written as ``OUT_DIR.incomplete`` and renamed to ``out_dir`` once complete
    (:func:`ode_transformer.files.staged_folder`): a kill leaves no ``out_dir`` that looks complete, and the next export
    deletes the incomplete one. One export into ``out_dir`` at a time (a second is refused, naming the first).
    """
    source_dir = (
        None if isinstance(model_dir_or_model, ODETransformerPreTrainedModel) else Path(model_dir_or_model)
    )
    out_dir = Path(out_dir)
    inputs = [source_dir, *(p for p in (tokenizer, metrics) if isinstance(p, (str, Path)))]
    refuse_replacing_a_run(out_dir, inputs, "OUT_DIR", overwrite)
    if onnx_quantize and not onnx:
        raise ValueError("onnx_quantize (--quantize) quantises the ONNX graphs: add --onnx")
    if onnx:
        require(EXPORT_PACKAGES + (RUNTIME_PACKAGES if onnx_quantize else ()), "ONNX export (`--onnx`)")
    refuse_occupied(out_dir, overwrite, "--overwrite", "OUT_DIR")
    with lock_output(out_dir, "OUT_DIR"):
        # again, now that no other export writes it
        refuse_replacing_a_run(out_dir, inputs, "OUT_DIR", overwrite)
        return _export(
            model_dir_or_model,
            source_dir,
            out_dir,
            tokenizer,
            metrics,
            repo_id,
            overwrite,
            onnx,
            onnx_dynamo,
            onnx_quantize,
        )


def _export(
    model_dir_or_model,
    source_dir,
    out_dir: Path,
    tokenizer,
    metrics,
    repo_id,
    overwrite: bool,
    onnx: bool,
    onnx_dynamo: bool | None,
    onnx_quantize: str | None,
) -> Path:
    refuse_occupied(out_dir, overwrite, "--overwrite", "OUT_DIR")  # again, now that no other export writes it
    if metrics is None and source_dir is not None and (source_dir / METRICS_FILENAME).is_file():
        metrics = source_dir / METRICS_FILENAME
    copy_card = metrics is None and source_dir is not None and (source_dir / "README.md").is_file()
    metrics = load_metrics(metrics)
    tokenizer_folder, tokenizer_names = _tokenizer_files(tokenizer, source_dir)
    model = model_dir_or_model if source_dir is None else load_saved_model(source_dir)
    if onnx:
        check_exportable(model)

    with staged_folder(out_dir) as staged:
        model.save_pretrained(staged)  # weights, config with auto_map, and the modeling code
        _write_generation_config(model, staged, source_dir)
        if _copy_tokenizer(tokenizer, tokenizer_folder, tokenizer_names, staged):
            own_tokenizer_config(staged, tokenizer_folder or "the tokenizer")  # before anything loads it
            _fit_tokenizer(staged, model.config)
            own_tokenizer_config(staged, tokenizer_folder or "the tokenizer")
        if onnx:  # before the card, which names them
            export_onnx(model, staged / "onnx", dynamo=onnx_dynamo, quantize=onnx_quantize)
        if copy_card:
            _copy_card(source_dir / "README.md", staged, repo_id or f"path/to/{out_dir.resolve().name}")
        else:
            _write_card(staged, out_dir.resolve().name, metrics, repo_id)
        _record_digest(staged)
    return out_dir


def _record_digest(staged: Path) -> None:
    """The digest of the folder's weights, in ``model.safetensors``' metadata and in ``config.json``,
    ``generation_config.json`` and ``tokenizer_config.json``: the model's ``from_pretrained`` (and
    ``ode-translate``, for the tokenizer) refuses files of two exports, which a reader can take while another
    export replaces the folder."""
    digest = record_weights_digest(staged / "model.safetensors")
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        path = staged / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            path.write_text(json.dumps({**data, WEIGHTS_DIGEST: digest}, indent=2) + "\n", encoding="utf-8")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name(__spec__.name),
        description="Write a clean Hub-ready folder (weights, config with auto_map, code, tokenizer, card).",
    )
    parser.add_argument("model_dir", help="folder written by save_pretrained")
    parser.add_argument("out_dir", help="folder to write")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model folder's)")
    parser.add_argument(
        "--metrics", default=None, help=f"metrics JSON (default: MODEL_DIR/{METRICS_FILENAME})"
    )
    parser.add_argument("--repo-id", default=None, help="USER/NAME for the card's usage example")
    parser.add_argument("--overwrite", action="store_true", help="delete what OUT_DIR holds first")
    parser.add_argument(
        "--onnx",
        action="store_true",
        help="also write the ONNX graphs encoder_model.onnx, decoder_model.onnx and decoder_with_past_model.onnx "
        "into OUT_DIR/onnx (an encoder-decoder; needs the onnx extra; with --quantize int8: *_quantized.onnx instead)",
    )
    parser.add_argument(
        "--onnx-exporter",
        choices=ONNX_EXPORTERS,
        default="auto",
        help="torch.onnx.export's exporter: dynamo (torch.export), the older TorchScript one (the same graphs, "
        "faster), or auto: TorchScript where the installed torch still has it, else dynamo",
    )
    parser.add_argument(
        "--quantize",
        choices=ONNX_QUANTIZE_CHOICES,
        default=None,
        help="int8: the ONNX graphs with int8 products (with --onnx; needs onnxruntime): the fastest CPU decoding, "
        "with ode_transformer.onnx_generation.ONNXSeq2SeqGenerator",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quantize and not args.onnx:
        parser.error("--quantize quantises the ONNX graphs: add --onnx")
    try:
        out = export_for_hub(
            args.model_dir,
            args.out_dir,
            args.tokenizer,
            args.metrics,
            args.repo_id,
            args.overwrite,
            onnx=args.onnx,
            onnx_dynamo={"auto": None, "dynamo": True, "torchscript": False}[args.onnx_exporter],
            onnx_quantize=args.quantize,
        )
    except (FileExistsError, InUseError) as error:  # an occupied or busy OUT_DIR: one line, as argparse's
        raise SystemExit(report_user_error(__spec__.name, error)) from None
    except ModuleNotFoundError as error:
        # `require` names the onnx extra for its packages; any other missing module is a real bug
        if error.name not in EXPORT_PACKAGES + RUNTIME_PACKAGES:
            raise
        raise SystemExit(report_user_error(__spec__.name, error)) from None
    print(out)
    return 0


if __name__ == "__main__":
    main()
